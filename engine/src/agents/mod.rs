//! Sub-agents: one file per agent kind behind one trait. The engine builds the input document,
//! hands it to [`Agent::call`] with a [`CallContext`], and maps the result back; agents know
//! nothing of payloads, steps or routing.
//!
//! `flow` agents are run by the engine itself (a child run). `llm` and `http` agents speak
//! HTTP through [`net`]; LLM providers' limits and counters are shared by the whole process
//! through [`provider`]; [`secrets`] tells which environment variables a plan needs.

pub mod command;
pub mod elicit;
pub mod http;
pub mod llm;
pub mod mcp;
pub mod mock;
pub mod native;
pub mod net;
pub mod provider;
pub mod redact;
pub mod secrets;
pub mod timer;
pub mod transform;

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::record::StepError;

/// What an agent call knows besides its input document.
#[derive(Clone, Copy)]
pub struct CallContext<'a> {
    pub run_id: &'a str,
    /// The step id.
    pub step: &'a str,
    /// The hierarchical step number (`1.3.2`; an iteration: `1.3[2]`).
    pub step_number: StepNumber<'a>,
    /// 1-based attempt of this call.
    pub attempt: u32,
    /// The step's rendered `message`, if any.
    pub message: Option<&'a str>,
    /// Caller-given context (`--context`).
    pub context: &'a Value,
    /// Cancelled when the run is cancelled or the attempt times out.
    pub cancel: &'a CancellationToken,
    /// The per-attempt timeout (the engine enforces it too; agents with their own resources,
    /// like a child process, clean up on cancellation).
    pub timeout: Duration,
    /// 0-based index of this call among the calls of this agent in this run (attempts
    /// included), counted by the engine through [`AgentState::next_call`].
    pub call_index: u64,
    /// The run tree's `now`, for the templates of agent definitions.
    pub now: Option<crate::expr::time::Timestamp>,
    /// Where the call stores the files it makes, and reads those of its input (SPEC §6.5).
    pub files: &'a crate::files::FileSink,
}

/// A step's hierarchical number as agents see it: the step's (`1.3`, a `parallel` branch
/// `1.3.sentiment`), with the iteration for a loop's body (`1.3[2]`). Written out only when
/// an agent asks for it ([`Display`](std::fmt::Display)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepNumber<'a> {
    pub step: &'a str,
    pub iteration: Option<u64>,
}

impl<'a> StepNumber<'a> {
    /// The number of a step (or branch) that is not a loop iteration.
    pub fn of(step: &'a str) -> Self {
        StepNumber {
            step,
            iteration: None,
        }
    }
}

impl std::fmt::Display for StepNumber<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.step)?;
        if let Some(i) = self.iteration {
            write!(f, "[{i}]")?;
        }
        Ok(())
    }
}

impl CallContext<'_> {
    /// Stable across retries and resumes of the same step of the same item:
    /// `<run id>:<step number>`. Built on demand: most agents never need it.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}", self.run_id, self.step_number)
    }
}

/// Per-run, per-agent counters: how many calls an agent has had in this run.
#[derive(Default, Debug)]
pub struct AgentState {
    calls: Mutex<HashMap<String, u64>>,
    /// Agents a step tried to call after an agent change removed them.
    refused: Mutex<BTreeSet<String>>,
}

impl AgentState {
    /// Counts a call of agent `name` and returns its 0-based index in this run.
    pub fn next_call(&self, name: &str) -> u64 {
        let mut calls = self.calls.lock().expect("agent state lock");
        if let Some(n) = calls.get_mut(name) {
            let i = *n;
            *n += 1;
            return i;
        }
        calls.insert(name.to_string(), 1);
        0
    }

    /// Calls of each agent so far, for `expect.calls` in flow tests.
    pub fn counts(&self) -> HashMap<String, u64> {
        self.calls.lock().expect("agent state lock").clone()
    }

    /// Notes that a step tried to call agent `name`, which an agent change removed.
    pub fn refuse(&self, name: &str) {
        self.refused
            .lock()
            .expect("agent state lock")
            .insert(name.to_string());
    }

    /// The removed agents that steps tried to call (flow tests: agents that are not mocked).
    pub fn refused(&self) -> BTreeSet<String> {
        self.refused.lock().expect("agent state lock").clone()
    }
}

/// One kind of sub-agent.
pub trait Agent {
    /// Runs the agent on `input`, returning its result document. The input is borrowed: the
    /// engine keeps it for the step's record, and retries reuse it.
    fn call(
        &self,
        input: &Value,
        cx: CallContext<'_>,
    ) -> impl std::future::Future<Output = Result<Value, StepError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_numbers_are_written_out_on_demand() {
        assert_eq!(StepNumber::of("2.3").to_string(), "2.3");
        let n = StepNumber {
            step: "2.3",
            iteration: Some(4),
        };
        assert_eq!(n.to_string(), "2.3[4]");
        let context = Value::Null;
        let cancel = CancellationToken::new();
        let cx = CallContext {
            run_id: "r9",
            step: "s",
            step_number: n,
            attempt: 2,
            message: None,
            context: &context,
            cancel: &cancel,
            timeout: Duration::from_secs(1),
            call_index: 0,
            now: None,
            files: &crate::files::FileSink::detached(),
        };
        assert_eq!(cx.idempotency_key(), "r9:2.3[4]");
    }
}
