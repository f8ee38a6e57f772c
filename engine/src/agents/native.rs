//! `native` agents: Rust code of the application that embeds Switchyard, registered by name
//! in a [`Natives`] and called like any other agent — with the step's input document, its
//! retries, timeout, `result_schema` and records.
//!
//! A flow names the registration (`kind: native`, `function: NAME`, default the agent's own
//! name). The engine looks every one up before a run starts (`Natives::check`): a flow
//! that needs a native agent this program does not register fails to start, naming the agent
//! and where the flow defines it, instead of failing at its first call.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::CallContext;
use crate::plan::{AgentPlanSpec, Plan};
use crate::record::StepError;

/// What a native agent's call returns.
pub type NativeFuture = Pin<Box<dyn Future<Output = Result<Value, StepError>> + Send>>;

/// What a native agent is told of its call, owned, so that its future may outlive the
/// engine's borrow.
#[derive(Clone, Debug)]
pub struct NativeCall {
    pub run_id: String,
    /// The step id.
    pub step: String,
    /// The hierarchical step number (`1.3`; an iteration `1.3[2]`).
    pub number: String,
    /// 1-based attempt of this call.
    pub attempt: u32,
    /// The step's rendered `message`, if any.
    pub message: Option<String>,
    /// The run's context (`--context`).
    pub context: Value,
    /// Cancelled when the run is cancelled; the call's future is also dropped when the
    /// attempt times out.
    pub cancel: CancellationToken,
    /// The step's per-attempt timeout.
    pub timeout: Duration,
    /// 0-based index of this call among the calls of this agent in this run.
    pub call_index: u64,
}

impl NativeCall {
    /// Stable across retries and resumes of the same step of the same item:
    /// `<run id>:<step number>`, for an agent whose effects must happen once.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}", self.run_id, self.number)
    }

    fn of(cx: &CallContext<'_>) -> NativeCall {
        NativeCall {
            run_id: cx.run_id.to_owned(),
            step: cx.step.to_owned(),
            number: cx.step_number.to_string(),
            attempt: cx.attempt,
            message: cx.message.map(str::to_owned),
            context: cx.context.clone(),
            cancel: cx.cancel.clone(),
            timeout: cx.timeout,
            call_index: cx.call_index,
        }
    }
}

/// An agent implemented in Rust. Any `Fn(Value, NativeCall) -> impl Future<Output =
/// Result<Value, StepError>>` that is `Send + Sync` is one.
pub trait NativeAgent: Send + Sync + 'static {
    /// Runs the agent on the step's input document; its result is mapped like any agent's.
    /// An `Err` fails the attempt with the error's kind (`agent`, `timeout`, ... or a kind
    /// of the application's own), which `retry.on`, `errors:` and failure edges act on.
    fn call(&self, input: Value, call: NativeCall) -> NativeFuture;
}

impl<F, Fut> NativeAgent for F
where
    F: Fn(Value, NativeCall) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, StepError>> + Send + 'static,
{
    fn call(&self, input: Value, call: NativeCall) -> NativeFuture {
        Box::pin(self(input, call))
    }
}

/// One registration.
#[derive(Clone)]
struct Registered {
    agent: Arc<dyn NativeAgent>,
    /// Whether its calls may have effects outside the run: each attempt is then recorded as
    /// started before it is made (SPEC §7.3), and one never finished is in doubt on resume.
    effects: bool,
}

/// The native agents of a program, by name.
#[derive(Clone, Default)]
pub struct Natives {
    by_name: HashMap<String, Registered>,
}

impl std::fmt::Debug for Natives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.by_name.keys().collect();
        names.sort();
        f.debug_struct("Natives").field("names", &names).finish()
    }
}

impl Natives {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `agent` under `name`, replacing any earlier one of that name. Its calls are
    /// taken to have effects outside the run, like a `command`'s: each attempt is recorded
    /// before it is made, and a step calling it is not idempotent unless it says so.
    pub fn register(&mut self, name: impl Into<String>, agent: impl NativeAgent) -> &mut Self {
        self.insert(name.into(), Arc::new(agent), true)
    }

    /// Registers an agent whose calls have no effect outside the run (a pure computation):
    /// no attempt record is written before its calls, and a resume calls it again freely.
    pub fn register_pure(&mut self, name: impl Into<String>, agent: impl NativeAgent) -> &mut Self {
        self.insert(name.into(), Arc::new(agent), false)
    }

    fn insert(&mut self, name: String, agent: Arc<dyn NativeAgent>, effects: bool) -> &mut Self {
        self.by_name.insert(name, Registered { agent, effects });
        self
    }

    /// The names registered, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.by_name.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Whether the agent registered as `name` may have effects (unknown names: yes).
    pub fn has_effects(&self, name: &str) -> bool {
        self.by_name.get(name).is_none_or(|r| r.effects)
    }

    /// Every `native` agent `plan` can call, looked up: one line per agent registered under
    /// no name here, naming the agent, the flow file and line that define it, and what is
    /// registered.
    pub(crate) fn check(&self, plan: &Plan) -> Result<(), String> {
        let mut missing: Vec<String> = Vec::new();
        for (_, agent) in plan.agents() {
            let AgentPlanSpec::Native(n) = &agent.spec else {
                continue;
            };
            if self.by_name.contains_key(&n.function) {
                continue;
            }
            let registered = if self.by_name.is_empty() {
                "this program registers no native agents (they are Rust code registered by an application \
                 that embeds switchyard as a library)"
                    .to_string()
            } else {
                format!("registered: {}", self.names().join(", "))
            };
            let line = format!(
                "native agent `{}` ({}): nothing is registered as `{}`; {registered}",
                agent.name, n.at, n.function
            );
            if !missing.contains(&line) {
                missing.push(line);
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("\nerror: "))
        }
    }

    /// Calls the agent registered as `name` (checked before the run started; a name missing
    /// now is an `agent` error).
    pub(crate) async fn call(
        &self,
        name: &str,
        input: &Value,
        cx: CallContext<'_>,
    ) -> Result<Value, StepError> {
        let Some(r) = self.by_name.get(name) else {
            return Err(StepError::new(
                crate::record::ErrorKind::Agent,
                format!("no native agent is registered as `{name}`"),
            ));
        };
        r.agent.call(input.clone(), NativeCall::of(&cx)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ErrorKind;

    #[tokio::test]
    async fn closures_are_agents_and_unknown_names_are_errors() {
        let mut natives = Natives::new();
        natives.register_pure("double", |input: Value, call: NativeCall| async move {
            let n = input["n"]
                .as_i64()
                .ok_or_else(|| StepError::new(ErrorKind::Agent, "no n"))?;
            Ok(serde_json::json!({"n": n * 2, "attempt": call.attempt, "key": call.idempotency_key()}))
        });
        assert!(!natives.has_effects("double"));
        assert!(natives.has_effects("other"));
        let context = Value::Null;
        let cancel = CancellationToken::new();
        let files = crate::files::FileSink::detached();
        let cx = CallContext {
            run_id: "r1",
            step: "s",
            step_number: super::super::StepNumber::of("2"),
            attempt: 1,
            message: None,
            context: &context,
            cancel: &cancel,
            timeout: Duration::from_secs(1),
            call_index: 0,
            now: None,
            files: &files,
        };
        let out = natives
            .call("double", &serde_json::json!({"n": 21}), cx)
            .await
            .unwrap();
        assert_eq!(out, serde_json::json!({"n": 42, "attempt": 1, "key": "r1:2"}));
        let e = natives
            .call("double", &serde_json::json!({}), cx)
            .await
            .unwrap_err();
        assert_eq!((e.kind, e.message.as_str()), (ErrorKind::Agent, "no n"));
        let e = natives.call("triple", &Value::Null, cx).await.unwrap_err();
        assert!(e.message.contains("`triple`"), "{}", e.message);
    }
}
