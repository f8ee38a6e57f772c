//! One step by its kind: `set`, `interrupt`, `fail` and `succeed` in place; a call through
//! [`super::invoke`] with its `output` applied to the payload; loops and `parallel` in their
//! own files.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{Run, StepOutcome};
use crate::agents::StepNumber;
use crate::expr::eval::{self, Vars};
use crate::model::fmt_duration;
use crate::plan::*;
use crate::record::{self, RunStatus, StepStatus};
use crate::record::{ErrorKind, StepError};
use crate::runtime::data;
use crate::store::Store;

impl<'e, S: Store> Run<'e, S> {
    pub(super) async fn step(&mut self, step: &StepPlan, number: &str) -> StepOutcome {
        match &step.kind {
            StepPlanKind::Set(set) => {
                // Resuming: a `set` that finished is replayed from its record, its writes as
                // they were made, so a flow changed since (`--allow-changed`) does not rewrite
                // what the run already did.
                if let Some(rec) = self.replay.as_ref().and_then(|r| r.finished(number, None)) {
                    if let Some(e) = &rec.error {
                        return StepOutcome::err(e.clone());
                    }
                    let mut payload = std::mem::take(&mut self.payload);
                    let replayed = data::replay_changes(&mut payload, &rec.changes);
                    self.payload = payload;
                    let mut o = match replayed {
                        Ok(()) => StepOutcome::ok(None),
                        Err(e) => StepOutcome::err(e),
                    };
                    o.replayed = true;
                    return o;
                }
                let mut changes = Vec::new();
                let mut payload = std::mem::take(&mut self.payload);
                let applied = {
                    let vars = self.vars(&[]);
                    data::apply_set(set, &mut payload, &vars, &mut changes)
                };
                self.payload = payload;
                match applied.and_then(|()| self.check_payload_size(&changes)) {
                    Ok(()) => {
                        let mut o = StepOutcome::ok(None);
                        o.changes = changes;
                        o
                    }
                    Err(e) => StepOutcome::err(e),
                }
            }
            StepPlanKind::Call(call) => self.call_step(step, call, number).await,
            // Loops and `parallel` are boxed: their futures are large, and every run's future
            // would carry them (spawned runs copy it around). One allocation per such step.
            StepPlanKind::Foreach(f) => Box::pin(self.foreach_step(step, f, number)).await,
            StepPlanKind::While(w) => Box::pin(self.while_step(step, w, number)).await,
            StepPlanKind::Parallel(p) => Box::pin(self.parallel_step(step, p, number)).await,
            StepPlanKind::Interrupt(i) => {
                let vars = self.vars(&[]);
                let input = match data::build_input(&i.input, i.scope.as_ref(), &self.payload, &vars) {
                    Ok(v) => v,
                    Err(e) => return StepOutcome::err(e),
                };
                // Resuming: the decision recorded before, or the one given now to the
                // interrupt the run waits at, is the step's result.
                let earlier = self.replay.as_ref().and_then(|r| r.part(number, None));
                let decision = match earlier {
                    Some(rec) if rec.status == StepStatus::Succeeded => rec.result.clone(),
                    // The decision answers the stop `resume` found waiting, no other.
                    Some(rec) if rec.status == StepStatus::Interrupted => match self.given(number, None) {
                        Some(super::inbox::Given::Expired) => {
                            let mut o = StepOutcome::err(StepError::new(
                                ErrorKind::Timeout,
                                format!(
                                    "the question of interrupt step `{}` expired without a decision{}",
                                    step.id,
                                    i.expires
                                        .map(|e| format!(" ({} after it stopped)", fmt_duration(e)))
                                        .unwrap_or_default()
                                ),
                            ));
                            o.input = Some(input);
                            return o;
                        }
                        Some(super::inbox::Given::Decision(d)) => {
                            // A decision the inbox recorded was taken before the expiry, by the
                            // store's clock: the run may continue later than that.
                            let recorded = matches!(
                                self.replay.as_ref().and_then(|r| r.answer(number, None)),
                                Some(crate::store::inbox::Answer::Decided(_))
                            );
                            if let Some(expires) = i.expires
                                && !recorded
                            {
                                let waited = record::now_ms().saturating_sub(rec.started_at);
                                if u128::from(waited) > expires.as_millis() {
                                    let mut o = StepOutcome::err(StepError::new(
                                        ErrorKind::Timeout,
                                        format!(
                                            "the decision for interrupt step `{}` came after it expired ({} after it stopped)",
                                            step.id,
                                            fmt_duration(expires)
                                        ),
                                    ));
                                    o.input = Some(input);
                                    return o;
                                }
                            }
                            Some(Arc::new(d))
                        }
                        None => None,
                    },
                    _ => None,
                };
                if let Some(decision) = decision {
                    let mut o = StepOutcome::ok(None);
                    let mut changes = Vec::new();
                    let mut payload = std::mem::take(&mut self.payload);
                    let applied = {
                        let vars = Vars {
                            result: Some(&*decision),
                            ..self.vars(&[])
                        };
                        data::apply_output(
                            &i.output,
                            i.scope.as_ref(),
                            &mut payload,
                            &decision,
                            &vars,
                            &mut changes,
                        )
                    };
                    self.payload = payload;
                    match applied {
                        Ok(v) => {
                            o.violations = v;
                            if let Err(e) = self.check_payload_size(&changes) {
                                o.error = Some(e);
                            }
                            o.changes = changes;
                        }
                        Err(e) => o.error = Some(e),
                    }
                    o.input = Some(input);
                    o.result = Some(decision);
                    return o;
                }
                // The question, as the person deciding needs it (`runs show`): the prompt,
                // the schema the decision must match, and when it expires (Unix ms).
                let mut question = Map::new();
                if let Some(p) = &i.prompt {
                    let vars = Vars {
                        input: Some(&input),
                        ..self.vars(&[])
                    };
                    match eval::render(p, &vars) {
                        Ok(text) => {
                            question.insert("prompt".into(), Value::String(text));
                        }
                        Err(e) => return StepOutcome::err(e),
                    }
                }
                if let Some(schema) = &i.schema {
                    question.insert("schema".into(), schema.value.clone());
                }
                if let Some(expires) = i.expires {
                    let ms = u64::try_from(expires.as_millis()).unwrap_or(u64::MAX);
                    question.insert("expires_at".into(), record::now_ms().saturating_add(ms).into());
                }
                let mut o = StepOutcome::ok(None);
                if !question.is_empty() {
                    o.result = Some(Arc::new(Value::Object(question)));
                }
                o.input = Some(input);
                o.stop = Some(RunStatus::Interrupted);
                o
            }
            StepPlanKind::Fail { kind, message } => {
                // A message that cannot be rendered does not change what the run fails with:
                // the `fail`'s kind, with the template's error for a message.
                let (text, details) = match message {
                    Some(m) => match eval::render(m, &self.vars(&[])) {
                        Ok(t) => (t, None),
                        Err(e) => (
                            format!("the `fail` message could not be rendered: {}", e.message),
                            e.details,
                        ),
                    },
                    None => (format!("the flow failed at step `{}`", step.id), None),
                };
                let mut error = StepError::new(ErrorKind::parse(kind), text);
                error.details = details;
                let mut o = StepOutcome::err(error);
                o.stop = Some(RunStatus::Failed);
                o
            }
            StepPlanKind::Succeed => {
                let mut o = StepOutcome::ok(None);
                o.stop = Some(RunStatus::Succeeded);
                o
            }
        }
    }

    /// Applies a call's `output` to the payload; a failed mapping changes nothing.
    pub(super) fn apply(
        &mut self,
        call: &CallPlan,
        result: &Arc<Value>,
        locals: &[(&str, &Value)],
        outcome: &mut StepOutcome,
    ) {
        let mut changes = Vec::new();
        let mut payload = std::mem::take(&mut self.payload);
        let applied = {
            let vars = Vars {
                result: Some(&**result),
                ..self.vars(locals)
            };
            data::apply_output(
                &call.output,
                call.scope.as_ref(),
                &mut payload,
                result,
                &vars,
                &mut changes,
            )
        };
        self.payload = payload;
        match applied {
            Ok(v) => {
                outcome.violations.extend(v);
                if let Err(e) = self.check_payload_size(&changes) {
                    outcome.error = Some(e);
                }
                outcome.changes.extend(changes);
            }
            Err(e) => outcome.error = Some(e),
        }
    }

    pub(super) fn message(&self, call: &CallPlan, vars: &Vars) -> Result<Option<String>, StepError> {
        call.message.as_ref().map(|m| eval::render(m, vars)).transpose()
    }

    async fn call_step(&mut self, step: &StepPlan, call: &CallPlan, number: &str) -> StepOutcome {
        let prepared = {
            let vars = self.vars(&[]);
            // Borrowed when it is the whole payload: copied only for a store that keeps it.
            data::build_input_ref(&call.input, call.scope.as_ref(), &self.payload, &vars)
                .and_then(|input| Ok((input, self.message(call, &vars)?)))
        };
        let (input, message) = match prepared {
            Ok(p) => p,
            Err(e) => return StepOutcome::err(e),
        };
        let mut outcome = self
            .invoke(
                step,
                call,
                &input,
                message.as_deref(),
                StepNumber::of(number),
                "agent",
            )
            .await;
        outcome.input = self.recorded_input(Self::called_with(&mut outcome, input));
        if outcome.error.is_none()
            && let Some(result) = outcome.result.take()
        {
            self.apply(call, &result, &[], &mut outcome);
            outcome.result = Some(result);
        }
        outcome
    }
}
