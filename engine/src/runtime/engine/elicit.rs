//! What an MCP server asks during a call (SPEC §6.4), on the run's side: the answers a call
//! has on record (`<number>.e<k>` parts of kind `elicitation`, the k-th question the call
//! asked), the stop that asks a human the first question without one, and the check `resume`
//! makes of a decision before anything runs.
//!
//! A call stopped for a question is abandoned; the run stops `interrupted` at the question's
//! part. On resume the decision is recorded on that part, and the call is sent again with all
//! the answers on record ([`Elicitor`]): a tool that elicits must tolerate being sent again
//! before it has acted. Its attempt, left `started`, is not in doubt: the question on record
//! says the call was abandoned by the engine, not cut by a crash.

use serde_json::{Value, json};

use std::sync::Arc;

use super::{CallResult, Run, StepOutcome};
use crate::agents::elicit::{Asked, Elicitor, Reply};
use crate::agents::{self, CallContext, StepNumber};
use crate::plan::{McpPlan, Schema, StepPlan};
use crate::record::{self, RunStatus, StepStatus, Usage};
use crate::record::{ErrorKind, StepError};
use crate::store::Store;

/// The number of the k-th question (1-based) call `number` asked: `3.e1`, `3[2].e1` (an
/// iteration's call), `3.t2.1.e2` (an agent loop's tool call).
pub(super) fn part_number(number: StepNumber<'_>, k: usize) -> String {
    format!("{number}.e{k}")
}

/// Checks a decision for an elicitation whose requested schema is `schema`: `{"reject":
/// "why"}` declines; anything else must be a value the schema accepts.
pub fn check_answer(decision: &Value, schema: &Value) -> Result<(), String> {
    if let Reply::Decline(_) = Reply::from_decision(decision) {
        return Ok(());
    }
    if schema.is_null() {
        return Ok(());
    }
    let schema =
        Schema::new(schema.clone()).map_err(|e| format!("the schema it asked for is not usable: {e}"))?;
    schema
        .check(decision)
        .map_err(|v| format!("it does not match the schema the server asked for {v} (or give `{{\"reject\": \"why\"}}` to decline)"))
}

impl<'e, S: Store> Run<'e, S> {
    /// The answers call `number` has on record, in order; the decision given to `resume` for
    /// the question the run stopped at is recorded first (before the call is sent again).
    /// An error when that record cannot be written.
    pub(super) async fn elicitor(
        &self,
        step: &StepPlan,
        number: StepNumber<'_>,
    ) -> Result<Elicitor, StepError> {
        let mut answers = Vec::new();
        let Some(replay) = self.replay.as_ref() else {
            return Ok(Elicitor::default());
        };
        for k in 1.. {
            let num = part_number(number, k);
            let Some(rec) = replay.part(&num, None) else {
                break;
            };
            let asked_of = |v: Option<&Value>| Asked {
                message: v
                    .and_then(|r| r.get("prompt"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                schema: v.and_then(|r| r.get("schema")).cloned().unwrap_or(Value::Null),
            };
            match rec.status {
                StepStatus::Succeeded => {
                    let asked = asked_of(rec.input.as_ref());
                    let reply = Reply::from_decision(rec.result.as_deref().unwrap_or(&Value::Null));
                    answers.push((asked, reply));
                }
                StepStatus::Interrupted => {
                    let given = match self.given(&num, None) {
                        Some(super::inbox::Given::Decision(d)) => d,
                        // A server's question has no expiry; an expired item declines it.
                        Some(super::inbox::Given::Expired) => {
                            serde_json::json!({"reject": "the question expired without an answer"})
                        }
                        None => break,
                    };
                    let given = &given;
                    let question = rec.result.as_deref().cloned().unwrap_or(Value::Null);
                    let asked = asked_of(Some(&question));
                    let mut o = StepOutcome::ok(Some(given.clone()));
                    let started = record::Stamp::now();
                    self.record_part(step, num, "elicitation", None, Some(question), &mut o, started)
                        .await;
                    if let Some(e) = o.error {
                        return Err(e);
                    }
                    answers.push((asked, Reply::from_decision(given)));
                }
                _ => break,
            }
        }
        Ok(Elicitor::new(answers))
    }

    /// Whether call `number` stopped for a question (its attempt left `started` was abandoned
    /// by the engine, not cut by a crash): its last question on record waits for a decision.
    pub(super) fn asked_server(&self, number: StepNumber<'_>) -> bool {
        let Some(replay) = self.replay.as_ref() else {
            return false;
        };
        let mut last = None;
        for k in 1.. {
            match replay.part(&part_number(number, k), None) {
                Some(rec) => last = Some(rec.status),
                None => break,
            }
        }
        last == Some(StepStatus::Interrupted)
    }

    /// The stop of call `number` of tool `tool` of server `server` at the question its
    /// elicitor holds: the question recorded `interrupted`, and the outcome that stops the run.
    pub(super) async fn ask_human(
        &self,
        step: &StepPlan,
        number: StepNumber<'_>,
        server: &str,
        tool: &str,
        elicitor: &Elicitor,
    ) -> Option<StepOutcome> {
        let (k, asked) = elicitor.open()?;
        let num = part_number(number, k);
        let mut o = StepOutcome::ok(Some(json!({
            "prompt": asked.message,
            "schema": asked.schema,
            "server": server,
            "tool": tool,
        })));
        o.stop = Some(RunStatus::Interrupted);
        let started = record::Stamp::now();
        self.record_part(step, num, "elicitation", None, None, &mut o, started)
            .await;
        let mut out = StepOutcome::err(o.error.unwrap_or_else(|| {
            StepError::new(
                ErrorKind::Agent,
                format!(
                    "MCP server `{server}` asks for input during a call of `{tool}`: {}",
                    asked.message
                ),
            )
        }));
        out.stop = Some(RunStatus::Interrupted);
        Some(out)
    }
}

impl<'e, S: Store> Run<'e, S> {
    /// A call of MCP tool `m` (a plain step's or an agent loop's), its server's questions
    /// answered from the record; a question without an answer stops the run to ask it.
    #[allow(clippy::result_large_err)]
    pub(super) async fn mcp_call(
        &self,
        step: &StepPlan,
        m: &McpPlan,
        input: &Value,
        cx: CallContext<'_>,
        number: StepNumber<'_>,
    ) -> CallResult {
        let elicitor = match self.elicitor(step, number).await {
            Ok(e) => Arc::new(e),
            Err(e) => return Err((e, Usage::default(), None, false)),
        };
        // Approvals are the runtime's: a plain step asked before its attempts, a loop before
        // its turn's calls.
        let out = agents::mcp::call(m, input, cx, Some(&elicitor), true).await;
        // What the call was, on its record, for its span (a loop's call merges its own).
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(number.to_string(), json!({"mcp": agents::mcp::call_notes(m)}));
        if let Some(o) = self
            .ask_human(step, number, &m.server.name, &m.tool, &elicitor)
            .await
        {
            let e = o
                .error
                .unwrap_or_else(|| StepError::new(ErrorKind::Agent, "stopped to ask a human"));
            return Err((e, Usage::default(), None, true));
        }
        out.map(|v| (v, Usage::default(), None))
            .map_err(|e| (e, Usage::default(), None, false))
    }
}
