//! The approval of a plain step's call (SPEC §6.4): a `kind: mcp` step whose tool needs a
//! human's decision stops `interrupted` before the call, at an `approval` part numbered under
//! the step (`3.approval`) that holds the one proposed call, as an agent loop's approval holds
//! its turn's (SPEC §6.3). The decision given to `resume` is recorded there and taken:
//! `{"approve": true}` calls the tool with the step's input, `{"edit": {<arguments>}}` with
//! those arguments instead, and `{"reject": "why"}` fails the step with kind `agent` and the
//! reason, which the step's failure edges can route.

use serde_json::{Value, json};

use super::agent_loop::{Decision, parse_decisions};
use super::{Run, StepOutcome};
use crate::agents::StepNumber;
use crate::plan::StepPlan;
use crate::record::{self, RunStatus, StepStatus};
use crate::record::{ErrorKind, StepError};
use crate::store::Store;

/// What a plain step's call goes on with once approved.
pub(super) enum Approved {
    /// The call is made with this input document (the step's, or the edited arguments).
    Call(Value),
    /// The call is not made: the step's outcome (rejected, stopped to ask, or a record that
    /// could not be written).
    Done(Box<StepOutcome>),
}

/// The number of a plain step's approval part: `3.approval`, `3[2].approval`.
pub(super) fn part_number(number: StepNumber<'_>) -> String {
    format!("{number}.approval")
}

impl<'e, S: Store> Run<'e, S> {
    /// The decision on the call of `tool` (`server.tool`) by agent `agent` of step `step`
    /// (numbered `number`) with `input`: recorded before, given to this resume, or to be
    /// asked (the run stops).
    pub(super) async fn approve_call(
        &self,
        step: &StepPlan,
        number: StepNumber<'_>,
        agent: &str,
        tool: &str,
        input: &Value,
    ) -> Approved {
        let part = part_number(number);
        let earlier = self.replay.as_ref().and_then(|r| r.part(&part, None));
        let proposed = json!([{"id": "call_1", "tool": tool, "arguments": input}]);
        let given = match earlier {
            Some(rec) if rec.status == StepStatus::Succeeded => {
                Some(rec.result.as_deref().cloned().unwrap_or(Value::Null))
            }
            Some(rec) if rec.status == StepStatus::Interrupted => match self.given(&part, None) {
                Some(super::inbox::Given::Decision(d)) => Some(d),
                Some(super::inbox::Given::Expired) => {
                    return Approved::Done(Box::new(StepOutcome::err(StepError::new(
                        ErrorKind::Timeout,
                        format!("the approval of the call of `{tool}` expired without a decision"),
                    ))));
                }
                None => None,
            },
            _ => None,
        };
        let Some(given) = given else {
            let mut o = StepOutcome::ok(Some(json!({
                "prompt": format!(
                    "step `{}` wants to call `{tool}` (agent `{agent}`): approve, edit or reject",
                    step.id
                ),
                "agent": agent,
                "calls": [{
                    "id": "call_1", "tool": tool, "arguments": input,
                    "input_schema": super::inbox::agent_input_schema(step),
                }],
            })));
            o.stop = Some(RunStatus::Interrupted);
            let started = record::Stamp::now();
            self.record_part(step, part, "approval", None, None, &mut o, started)
                .await;
            o.result = None;
            if o.error.is_none() {
                o.stop = Some(RunStatus::Interrupted);
            }
            return Approved::Done(Box::new(o));
        };
        let decision = match parse_decisions(&given, 1) {
            Ok(mut d) => d.remove(0),
            Err(why) => {
                return Approved::Done(Box::new(StepOutcome::err(StepError::new(ErrorKind::Agent, why))));
            }
        };
        if earlier.is_some_and(|r| r.status == StepStatus::Interrupted) {
            // The decision is on record before the call it allows is made.
            let mut o = StepOutcome::ok(Some(given.clone()));
            let started = record::Stamp::now();
            self.record_part(step, part, "approval", None, Some(proposed), &mut o, started)
                .await;
            if let Some(e) = o.error {
                return Approved::Done(Box::new(StepOutcome::err(e)));
            }
        }
        match decision {
            Decision::Approve => Approved::Call(input.clone()),
            Decision::Edit(args) => Approved::Call(args),
            Decision::Reject(why) => Approved::Done(Box::new(StepOutcome::err(
                StepError::new(
                    ErrorKind::Agent,
                    format!("the call of `{tool}` was rejected: {why}"),
                )
                .with_details(json!({"rejected": why})),
            ))),
        }
    }

    /// Whether step `number` stopped to ask a human before or during its call (an approval
    /// of it, or a question its MCP server asked, waits for a decision): its attempt left
    /// `started` or `interrupted` is not in doubt.
    pub(super) fn stopped_to_ask(&self, number: StepNumber<'_>) -> bool {
        let waiting = |num: &str| {
            self.replay
                .as_ref()
                .and_then(|r| r.part(num, None))
                .is_some_and(|r| r.status == StepStatus::Interrupted)
        };
        waiting(&part_number(number)) || self.asked_server(number)
    }
}
