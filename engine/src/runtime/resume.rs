//! Resuming runs (SPEC §3.6, §7.3). A resumed run walks its flow again from `start` with the
//! same input and context, and every step part that has a finished record is *replayed*: its
//! recorded result (or error) stands in for the call, so nothing that finished runs again, and
//! the payload is rebuilt by the same deterministic mappings. The first part without a
//! finished record is where the run really continues.
//!
//! A part whose latest attempt is only `started` (the process died during the call) is called
//! again when its step is `idempotent` or the caller says `--retry-in-doubt`; otherwise the run
//! stops `interrupted` with kind `in_doubt`. An `interrupt` step the run stopped at takes the
//! caller's decision as its result.

use std::collections::HashMap;

use serde_json::Value;

use crate::record::{RunRecord, RunStatus, StepRecord, StepStatus};
use crate::store::inbox::Answer;
use crate::store::{Store, StoreError};

/// What the caller of a resume decided: built from `Default` with the methods below.
#[derive(Clone, Debug, Default)]
pub struct ResumeOptions {
    /// Call again attempts that started and never finished, even of non-idempotent steps.
    pub(crate) retry_in_doubt: bool,
    /// The answer to the `interrupt` step the run waits at.
    pub(crate) decision: Option<Value>,
    /// Which stop `decision` answers: the run (of the tree) and the number and iteration of
    /// its waiting part, as `resume` found it. Set by the engine; a decision answers that
    /// stop and no other, whichever runs of the tree wait too.
    pub(crate) decision_for: Option<(String, String, Option<u64>)>,
    /// Resume even though the flow (or a file it imports or calls) changed since the run started.
    pub(crate) allow_changed: bool,
    /// A submitted run taken over from dead workers more times than its batch allows (SPEC
    /// §12): replay what is recorded, and fail with kind `lost`, saying this, where the run would
    /// make a call (an attempt in doubt still stops it `in_doubt` first).
    pub(crate) lost: Option<String>,
    /// The caller knows an inbox item of the tree was answered (decided or expired) and is
    /// not applied yet: the run is continued without a decision given here (SPEC §15).
    pub(crate) answered: bool,
    /// Record `decision` in the inbox before resuming (SPEC §15), as the library's answer:
    /// set by [`ResumeOptions::decision`]. The command line records its own answers.
    pub(crate) record_answer: bool,
    /// Who answers: recorded with the decision (default the OS user).
    pub(crate) actor: Option<String>,
    /// Why, recorded with the decision.
    pub(crate) reason: Option<String>,
}

impl ResumeOptions {
    /// `--decision`: the answer to what the run waits for ([`WaitingFor`]): for an
    /// `interrupt` step, a value its `schema` accepts; for an agent loop's approval,
    /// `{"approve": true}`, `{"edit": {<arguments>}}` or `{"reject": "why"}`, or a list of
    /// them, one per pending call in order. Checked before anything runs.
    ///
    /// The decision is an answer like `switchyard inbox decide`: recorded in the inbox (via
    /// `library`, by [`ResumeOptions::actor`]) before the run continues, and refused when the
    /// question was decided before or expired ([`ResumeError::Refused`]).
    pub fn decision(mut self, decision: Value) -> Self {
        self.decision = Some(decision);
        self.record_answer = true;
        self
    }

    /// Who gives the decision, as the inbox records it; default the OS user (`$USER`, else
    /// `$LOGNAME`).
    pub fn actor(mut self, name: impl Into<String>) -> Self {
        self.actor = Some(name.into());
        self
    }

    /// Why, recorded with the decision.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// `--retry-in-doubt`: call again attempts that started and never finished, even of
    /// steps that are not `idempotent`.
    pub fn retry_in_doubt(mut self, yes: bool) -> Self {
        self.retry_in_doubt = yes;
        self
    }

    /// Continue a run whose question was answered in the inbox (SPEC §15): no decision is
    /// given here, the recorded one applies.
    pub fn answered(mut self, yes: bool) -> Self {
        self.answered = yes;
        self
    }

    /// `--allow-changed`: resume even though the flow (or a file it imports or calls)
    /// changed since the run started.
    pub fn allow_changed(mut self, yes: bool) -> Self {
        self.allow_changed = yes;
        self
    }
}

/// The records of one run, as a resume reads them.
#[derive(Debug, Default)]
pub struct Replay {
    /// The latest attempt of each (number, iteration).
    parts: HashMap<(String, Option<u64>), StepRecord>,
    /// Child runs by the number of the step that started them (`3`, `3[2]`).
    children: HashMap<String, RunRecord>,
    /// The settled inbox items of the run's parts (SPEC §15): decided or expired, by
    /// (number, iteration).
    answers: HashMap<(String, Option<u64>), Answer>,
}

impl Replay {
    /// Reads the records of `run_id`.
    pub async fn load<S: Store>(store: &S, run_id: &str) -> Result<Replay, StoreError> {
        let parts = store
            .latest_steps(run_id)
            .await?
            .into_iter()
            .map(|s| ((s.number.clone(), s.iteration), s))
            .collect();
        let children = store
            .children(run_id)
            .await?
            .into_iter()
            .filter_map(|c| c.parent_step.clone().map(|p| (p, c)))
            .collect();
        let answers = if store.keeps_steps() {
            store.inbox().answers(run_id).await?
        } else {
            HashMap::new()
        };
        Ok(Replay {
            parts,
            children,
            answers,
        })
    }

    /// The settled inbox item of part `number` (`iteration`), if it was decided or expired.
    pub fn answer(&self, number: &str, iteration: Option<u64>) -> Option<&Answer> {
        self.answers.get(&(number.to_string(), iteration))
    }

    /// The latest record of a step part.
    pub fn part(&self, number: &str, iteration: Option<u64>) -> Option<&StepRecord> {
        self.parts.get(&(number.to_string(), iteration))
    }

    /// The latest record of a step part, if it finished (succeeded or failed).
    pub fn finished(&self, number: &str, iteration: Option<u64>) -> Option<&StepRecord> {
        self.part(number, iteration)
            .filter(|r| matches!(r.status, StepStatus::Succeeded | StepStatus::Failed))
    }

    /// When the latest decision given to the run was recorded (an `interrupt` or approval
    /// part that succeeded, recorded as the resume that took it began); 0 without one.
    pub fn decided_at(&self) -> u64 {
        self.parts
            .values()
            .filter(|r| r.status == StepStatus::Succeeded && asks_human(r))
            .map(|r| r.started_at)
            .max()
            .unwrap_or(0)
    }

    /// The latest records that finished (succeeded or failed) at or after `since` and the
    /// latest decision ([`Replay::decided_at`]), in no particular order: what was made after
    /// the run's last stop on record.
    pub fn finished_since(&self, since: u64) -> impl Iterator<Item = &StepRecord> {
        let since = since.max(self.decided_at());
        self.parts.values().filter(move |r| {
            matches!(r.status, StepStatus::Succeeded | StepStatus::Failed)
                && r.finished_at.unwrap_or(r.started_at) >= since
        })
    }

    /// The bytes of the files the run's records made (each part's latest record): what a
    /// resumed run counts against `max_run_file_bytes` before it makes more. A `flow` step's
    /// record counts its child run's files; a child run that did not finish counts its own.
    pub fn file_bytes(&self) -> u64 {
        self.parts
            .values()
            .flat_map(|r| &r.files)
            .map(|f| f.file.size)
            .sum()
    }

    /// The child run started by step `number` (`3`, or `3[2]` for an iteration).
    pub fn child(&self, number: &str) -> Option<&RunRecord> {
        self.children.get(number)
    }

    /// The child runs, in no particular order.
    pub fn children(&self) -> impl Iterator<Item = &RunRecord> {
        self.children.values()
    }

    /// The `interrupt` step the run stopped at: its latest record is `interrupted` and it is
    /// not an in-doubt stop (those are agent steps). Of several (a `foreach`'s iterations
    /// each stopped to ask), the one started last; of those started together, the first by
    /// number: the same one whichever process reads the records, so that the question `run`
    /// prints is the one `resume --decision` answers.
    pub fn waiting_interrupt(&self) -> Option<&StepRecord> {
        self.parts
            .values()
            .filter(|r| r.status == StepStatus::Interrupted && asks_human(r))
            .max_by_key(|r| {
                (
                    r.started_at,
                    r.started_ns,
                    std::cmp::Reverse((r.iteration, r.number.as_str())),
                )
            })
    }
}

/// Whether record `r` is of a part that stops its run for a human: an `interrupt` step, an
/// approval (of an agent loop's calls, or of a plain `mcp` step's call) or an MCP server's
/// elicitation.
pub fn asks_human(r: &StepRecord) -> bool {
    matches!(r.kind.as_str(), "interrupt" | "approval" | "elicitation")
}

/// The `interrupt` step a run tree waits at, and the run it belongs to.
#[derive(Clone, Debug)]
pub struct Waiting {
    /// The run whose step it is: the run asked about, or one of its child runs.
    pub run_id: String,
    /// That run's flow.
    pub flow: String,
    /// The step's record; its result holds the question (`prompt`, `schema`, `expires_at`).
    pub step: StepRecord,
}

/// The `interrupt` step that run `record` (whose records are `replay`) waits at: its own, or,
/// down the chain of its last interrupted child runs, a child's. The decision that answers
/// it is given to the root run.
pub async fn waiting_interrupt<S: Store>(
    store: &S,
    record: &RunRecord,
    replay: &Replay,
) -> Result<Option<Waiting>, StoreError> {
    if let Some(step) = replay.waiting_interrupt() {
        return Ok(Some(Waiting {
            run_id: record.id.clone(),
            flow: record.flow.clone(),
            step: step.clone(),
        }));
    }
    let mut run_id = record.id.clone();
    loop {
        let children = store.children(&run_id).await?;
        let Some(child) = children
            .into_iter()
            .rev()
            .find(|c| c.status == RunStatus::Interrupted)
        else {
            return Ok(None);
        };
        let replay = Replay::load(store, &child.id).await?;
        if let Some(step) = replay.waiting_interrupt() {
            return Ok(Some(Waiting {
                run_id: child.id,
                flow: child.flow,
                step: step.clone(),
            }));
        }
        run_id = child.id;
    }
}

/// [`waiting_interrupt`] of the run `run_id`, read from the store.
pub async fn waiting_at<S: Store>(store: &S, run_id: &str) -> Result<Option<Waiting>, StoreError> {
    let record = store.get_run(run_id).await?;
    let replay = Replay::load(store, run_id).await?;
    waiting_interrupt(store, &record, &replay).await
}

impl Waiting {
    /// What the stop asks, typed: the one reading of a waiting step's record, for the
    /// [`RunOutcome`](crate::runtime::engine::RunOutcome) and for what `run` and `resume`
    /// print.
    pub fn waiting_for(&self) -> WaitingFor {
        let question = question_of(&self.step);
        WaitingFor {
            run_id: self.run_id.clone(),
            flow: self.flow.clone(),
            step: self.step.step.clone(),
            number: self.step.number.clone(),
            question,
        }
    }
}

/// What waiting record `step` (an `interrupt` step's or an agent loop's `approval`, see
/// [`Replay::waiting_interrupt`]) asks, read from its result: the one reading of that record,
/// for the [`RunOutcome`](crate::runtime::engine::RunOutcome), `run`, `resume`, `runs show` and
/// the run page.
pub fn question_of(step: &StepRecord) -> Question {
    let result = step.result.as_deref();
    let text = |key: &str| {
        result
            .and_then(|r| r.get(key))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    if step.kind == "approval" {
        Question::Approval(Approval {
            agent: text("agent").unwrap_or_default(),
            prompt: text("prompt").unwrap_or_default(),
            calls: pending_calls(result.and_then(|r| r.get("calls"))),
        })
    } else if step.kind == "elicitation" {
        Question::Elicitation(Elicitation {
            server: text("server").unwrap_or_default(),
            tool: text("tool").unwrap_or_default(),
            message: text("prompt").unwrap_or_default(),
            schema: result
                .and_then(|r| r.get("schema"))
                .cloned()
                .unwrap_or(Value::Null),
        })
    } else {
        Question::Interrupt(Interrupt {
            prompt: text("prompt"),
            schema: result.and_then(|r| r.get("schema")).cloned(),
            expires_at: result.and_then(|r| r.get("expires_at")).and_then(Value::as_u64),
        })
    }
}

/// The tool calls an approval holds (`[{id, tool, arguments}]`, in the model's order), as its
/// record keeps them: proposed in its result while it waits, decided in its input after.
pub fn pending_calls(calls: Option<&Value>) -> Vec<PendingCall> {
    calls
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|c| PendingCall {
            id: c
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            tool: c
                .get("tool")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            arguments: c.get("arguments").cloned().unwrap_or(Value::Null),
        })
        .collect()
}

/// What a run stopped `interrupted` waits for: a decision, given to
/// [`Switchyard::resume`](crate::Switchyard::resume) of the root run with
/// [`ResumeOptions::decision`], whichever run of the tree asks.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct WaitingFor {
    /// The run whose step waits: the run itself, or one of its child runs (`flow` agents).
    pub run_id: String,
    /// That run's flow (`flow:` name).
    pub flow: String,
    /// The waiting step's id.
    pub step: String,
    /// The waiting part's number (`2`, `3.1`, `4.t1.approval`).
    pub number: String,
    pub question: Question,
}

/// What the decision answers.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Question {
    /// An `interrupt` step.
    Interrupt(Interrupt),
    /// Tool calls that need approval (`approve:`): an agent loop's, or a plain `mcp` step's
    /// one call.
    Approval(Approval),
    /// An MCP server that asked for input during a call (`elicitation/create`): the decision
    /// is a value its schema accepts, or `{"reject": "why"}` to decline.
    Elicitation(Elicitation),
}

/// What an MCP server asked during a tool call.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Elicitation {
    /// The server, as `mcp_servers:` names it.
    pub server: String,
    /// The tool whose call asked.
    pub tool: String,
    /// The server's message.
    pub message: String,
    /// The JSON Schema of the answer the server requested.
    pub schema: Value,
}

/// An `interrupt` step's question.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Interrupt {
    /// The step's `prompt`, rendered.
    pub prompt: Option<String>,
    /// The JSON Schema the decision must match, if the step has one.
    pub schema: Option<Value>,
    /// When the question expires (`expires`), Unix milliseconds.
    pub expires_at: Option<u64>,
}

/// The tool calls an agent loop proposed that need approval.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Approval {
    /// The agent loop's name.
    pub agent: String,
    /// What is asked, in words (the tools it wants to call).
    pub prompt: String,
    /// The calls, in the model's order: the decision is one object for one call, else a
    /// list with one decision per call in this order.
    pub calls: Vec<PendingCall>,
}

/// One tool call waiting for approval.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct PendingCall {
    /// The model's id of the call.
    pub id: String,
    /// The tool it calls.
    pub tool: String,
    /// The arguments the model gave (its text, as a string, when they are not JSON).
    pub arguments: Value,
}

/// Why a run cannot be resumed.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("run `{id}` already ended {status}: there is nothing to resume")]
    Finished { id: String, status: &'static str },
    #[error("run `{id}` is a child run (of `{parent}`): resume its root run, which resumes it")]
    Child { id: String, parent: String },
    #[error(
        "the flow `{flow}` (or a file it imports or calls) changed since run `{id}` started \
         (recorded {recorded}, now {now}): resuming it could mix two versions; pass \
         --allow-changed to resume anyway"
    )]
    Changed {
        id: String,
        flow: String,
        recorded: String,
        now: String,
    },
    #[error(
        "run `{id}` started {}: a resumed run keeps the agent changes it started with; resume it without \
         --agent-change, which applies them again",
        if *recorded { "with other agent changes than the --agent-change given" } else { "without agent changes, and --agent-change gives some" }
    )]
    OtherChanges { id: String, recorded: bool },
    #[error("the agent changes run `{id}` started with no longer fit its flow: {message}")]
    RecordedChanges { id: String, message: String },
    #[error("run `{id}` was started from flow `{recorded}`, not `{given}`")]
    OtherFlow {
        id: String,
        recorded: String,
        given: String,
    },
    #[error("run `{id}` waits at interrupt step `{step}`: give the decision with --decision JSON")]
    NeedsDecision { id: String, step: String },
    /// An MCP server asked for input during a call of step `step`.
    #[error(
        "run `{id}` waits for an answer to MCP server `{server}` (tool `{tool}`) at step `{step}`: give it with --decision JSON, a value of the schema it asked for, or `{{\"reject\": \"why\"}}` to decline (`switchyard runs show {id}` shows the question)"
    )]
    NeedsAnswer {
        id: String,
        step: String,
        server: String,
        tool: String,
    },
    /// A decision that is not an answer an MCP server's elicitation accepts.
    #[error("the decision does not answer MCP server `{server}` at step `{step}`: {reason}")]
    BadAnswer {
        step: String,
        server: String,
        reason: String,
    },
    /// An agent loop's approval needs a decision for each call it holds.
    #[error(
        "run `{id}` waits for approval of {calls} call(s) the agent loop of step `{step}` proposed: give the decision with --decision JSON, `{{\"approve\": true}}`, `{{\"edit\": {{<arguments>}}}}` or `{{\"reject\": \"why\"}}` (a list of them for several calls, in order; `switchyard runs show {id}` lists the calls)"
    )]
    NeedsApproval { id: String, step: String, calls: usize },
    /// A decision that is not one for each call an approval holds.
    #[error("the decision does not answer the approval at step `{step}`: {reason}")]
    BadApproval { step: String, reason: String },
    #[error("run `{id}` does not wait at an interrupt step: --decision has nothing to answer")]
    NoInterrupt { id: String },
    /// Another process continued the run between this resume's look at it and its take of it
    /// (SPEC §7.3): what this resume was asked to do answered a stop that is no more.
    #[error(
        "run `{id}` was continued by another process meanwhile (it is {status} now): nothing was done here; \
         `switchyard runs show {id}` shows where it is"
    )]
    MovedOn { id: String, status: &'static str },
    /// The decision does not match the decision schema of the inbox item it answers.
    #[error(
        "the decision does not match the schema of inbox item `{item}` (step `{step}`) at `{pointer}`: {reason}"
    )]
    BadAnswerSchema {
        item: String,
        step: String,
        pointer: String,
        reason: String,
    },
    /// The inbox refused the decision (SPEC §15): the question was decided before (by whom,
    /// how and when), expired, or closed. Nothing was resumed.
    #[error("the decision for run `{id}` (inbox item `{item}`) was not recorded: {refusal}")]
    Refused {
        id: String,
        item: String,
        refusal: crate::store::inbox::Refusal,
    },
    #[error("the decision does not match the `schema` of interrupt step `{step}` {reason}")]
    BadDecision {
        step: String,
        reason: String,
        pointer: String,
    },
}

/// Whether a run in this status can be resumed.
pub fn resumable(status: RunStatus) -> bool {
    matches!(status, RunStatus::Running | RunStatus::Interrupted)
}

impl ResumeOptions {
    /// The decision given to `resume`, if it answers the stop of run `run_id` at `number`
    /// (and `iteration`).
    pub fn decision_at(&self, run_id: &str, number: &str, iteration: Option<u64>) -> Option<&Value> {
        match &self.decision_for {
            Some((r, n, i)) if r == run_id && n == number && *i == iteration => self.decision.as_ref(),
            _ => None,
        }
    }
}
