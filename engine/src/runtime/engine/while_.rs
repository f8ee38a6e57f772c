//! `while`: the condition checked before every iteration, `max_iterations`, `delay`, and the
//! output applied after each iteration, whose record holds the writes it made.

use std::sync::Arc;

use serde_json::Value;

use super::{Run, StepOutcome};
use crate::agents::StepNumber;
use crate::expr::eval::{self, Vars};
use crate::plan::*;
use crate::record::{self, RunStatus};
use crate::record::{ErrorKind, StepError};
use crate::runtime::data;
use crate::store::Store;

impl<'e, S: Store> Run<'e, S> {
    pub(super) async fn while_step(&mut self, step: &StepPlan, w: &WhilePlan, number: &str) -> StepOutcome {
        let mut last = Arc::new(Value::Null);
        let mut iterations = 0u64;
        let mut o = StepOutcome::ok(None);
        loop {
            let iteration_v = Value::from(iterations);
            let locals: [(&str, &Value); 1] = [("iteration", &iteration_v)];
            let holds = {
                let vars = Vars {
                    result: Some(&*last),
                    ..self.vars(&locals)
                };
                eval::eval_bool(&w.cond, &vars)
            };
            match holds {
                Ok(false) => break,
                Ok(true) => {}
                Err(e) => {
                    // `e.message` already starts with the expression: "`cond`: cause".
                    o.error = Some(StepError::expression(format!(
                        "the `while` condition of step `{}` failed: {}",
                        step.id, e.message
                    )));
                    break;
                }
            }
            if iterations >= w.max_iterations {
                o.error = Some(StepError::new(
                    ErrorKind::Limit,
                    format!(
                        "`while` loop `{}` reached `max_iterations` ({}) and its condition still holds",
                        step.id, w.max_iterations
                    ),
                ));
                break;
            }
            if self.tree.pause.is_cancelled() {
                o.stop = Some(RunStatus::Running);
                break;
            }
            let replaying = self
                .replay
                .as_ref()
                .is_some_and(|r| r.finished(number, Some(iterations)).is_some());
            if iterations > 0 && !w.delay.is_zero() && !replaying {
                tokio::select! {
                    _ = tokio::time::sleep(w.delay) => {}
                    _ = self.tree.cancel.cancelled() => {}
                }
            }
            if let Err(e) = self.count_step() {
                o.error = Some(e);
                break;
            }
            let call = &w.body;
            let prepared = {
                let vars = Vars {
                    result: Some(&*last),
                    ..self.vars(&locals)
                };
                // Borrowed when it is the whole payload: copied only for a store that keeps it.
                data::build_input_ref(&call.input, call.scope.as_ref(), &self.payload, &vars)
                    .and_then(|i| Ok((i, self.message(call, &vars)?)))
            };
            let (input, message) = match prepared {
                Ok(p) => p,
                Err(e) => {
                    o.error = Some(e);
                    break;
                }
            };
            let iter_number = StepNumber {
                step: number,
                iteration: Some(iterations),
            };
            let started = record::Stamp::now();
            let mut r = self
                .invoke(step, call, &input, message.as_deref(), iter_number, "iteration")
                .await;
            let input = self.recorded_input(Self::called_with(&mut r, input));
            if r.error.is_none() {
                // The output applies after every iteration: the payload threads through. The
                // iteration's record holds the writes it made, and the loop's record none, so
                // records grow with the iterations, not with the payload each one saw.
                let result = r.result.clone().unwrap_or_else(|| Arc::new(Value::Null));
                self.apply(call, &result, &locals, &mut r);
            }
            self.record_part(
                step,
                number.to_string(),
                "iteration",
                Some(iterations),
                input,
                &mut r,
                started,
            )
            .await;
            o.usage.add(r.usage);
            o.attempts = r.attempts;
            o.violations.append(&mut r.violations);
            iterations += 1;
            if let Some(e) = r.error {
                o.error = Some(e);
                o.stop = r.stop;
                break;
            }
            last = r.result.unwrap_or_else(|| Arc::new(Value::Null));
        }
        o.result = Some(last);
        o.iterations = Some(iterations);
        o
    }
}
