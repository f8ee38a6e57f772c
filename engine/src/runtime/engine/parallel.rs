//! `parallel`: branches on their own copies of the payload, up to `concurrency` at once,
//! `fail_fast`, and the outputs applied in written order only when every branch succeeded.

use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::{Run, StepOutcome};
use crate::agents::StepNumber;
use crate::expr::eval::Vars;
use crate::plan::*;
use crate::record::{self, RunStatus};
use crate::record::{ErrorKind, StepError};
use crate::runtime::data;
use crate::store::Store;

impl<'e, S: Store> Run<'e, S> {
    pub(super) async fn parallel_step(
        &mut self,
        step: &StepPlan,
        p: &ParallelPlan,
        number: &str,
    ) -> StepOutcome {
        // Every branch reads its own deep copy of the payload as it was when the step started.
        let mut prepared = Vec::with_capacity(p.branches.len());
        for (name, call) in &p.branches {
            let snapshot = self.payload.clone();
            let built = {
                let vars = Vars {
                    payload: Some(&snapshot),
                    ..self.vars(&[])
                };
                data::build_input(&call.input, call.scope.as_ref(), &snapshot, &vars)
                    .and_then(|i| Ok((i, self.message(call, &vars)?)))
            };
            match built {
                Ok((input, message)) => prepared.push((name.as_str(), call, input, message)),
                Err(e) => {
                    return StepOutcome::err(StepError::new(
                        e.kind,
                        format!("branch `{name}`: {}", e.message),
                    ));
                }
            }
        }
        let fail_fast = CancellationToken::new();
        let mut outcomes: Vec<Option<StepOutcome>> = (0..prepared.len()).map(|_| None).collect();
        {
            let this = &*self;
            let mut in_flight = FuturesUnordered::new();
            let mut next = 0;
            loop {
                while in_flight.len() < p.concurrency && next < prepared.len() {
                    let i = next;
                    next += 1;
                    let (name, call, input, message) = &prepared[i];
                    let ff = fail_fast.clone();
                    in_flight.push(async move {
                        let branch_number = format!("{number}.{name}");
                        let started = record::Stamp::now();
                        let mut o = tokio::select! {
                            o = this.invoke(step, call, input, message.as_deref(), StepNumber::of(&branch_number), "branch") => o,
                            _ = ff.cancelled() => StepOutcome::err(StepError::new(
                                ErrorKind::Cancelled,
                                "cancelled: another branch failed (fail_fast)",
                            )),
                        };
                        let called = o.resolved_input.take().unwrap_or_else(|| input.clone());
                        this.record_part(step, branch_number, "branch", None, Some(called), &mut o, started).await;
                        (i, o)
                    });
                }
                let Some((i, o)) = in_flight.next().await else {
                    break;
                };
                if o.error.is_some() && p.fail_fast {
                    fail_fast.cancel();
                }
                outcomes[i] = Some(o);
            }
        }
        let outcomes: Vec<StepOutcome> = outcomes
            .into_iter()
            .map(|o| o.expect("every branch finished"))
            .collect();
        let mut result = Map::new();
        let mut failed = Map::new();
        let mut out = StepOutcome::ok(None);
        let mut first_error = None;
        for ((name, ..), o) in prepared.iter().zip(&outcomes) {
            out.usage.add(o.usage);
            result.insert(
                name.to_string(),
                o.result.as_deref().cloned().unwrap_or(Value::Null),
            );
            if let Some(e) = &o.error {
                failed.insert(name.to_string(), e.to_json());
                // The branch that failed is named, not the ones fail_fast cancelled because of
                // it; when every failure is a cancellation (the run was cancelled), that is it.
                let cancelled = e.kind == ErrorKind::Cancelled;
                let better = match &first_error {
                    None => true,
                    Some((was_cancelled, _)) => *was_cancelled && !cancelled,
                };
                if better {
                    first_error = Some((
                        cancelled,
                        StepError::new(e.kind.clone(), format!("branch `{name}`: {}", e.message)),
                    ));
                }
            }
        }
        out.failed = Value::Object(failed);
        out.result = Some(Arc::new(Value::Object(result)));
        if let Some(o) = outcomes.iter().find(|o| o.stop == Some(RunStatus::Interrupted)) {
            // A branch in doubt: the step stops where it is, to be resumed.
            out.error = o.error.clone();
            out.stop = Some(RunStatus::Interrupted);
            return out;
        }
        if let Some((_, e)) = first_error {
            // Any failure: no branch's output is applied.
            out.error = Some(e);
            return out;
        }
        // All succeeded: outputs apply in the order the branches are written, all or none.
        let before = self.payload.clone();
        for ((name, call, ..), o) in prepared.iter().zip(&outcomes) {
            let r = o.result.as_ref().expect("a succeeded branch has a result");
            let mut branch = StepOutcome::ok(None);
            self.apply(call, r, &[], &mut branch);
            for mut v in branch.violations {
                v.reason = format!("branch `{name}`: {}", v.reason);
                out.violations.push(v);
            }
            out.changes.extend(branch.changes);
            if let Some(e) = branch.error {
                self.payload = before;
                out.changes.clear();
                out.error = Some(StepError::new(e.kind, format!("branch `{name}`: {}", e.message)));
                return out;
            }
        }
        out
    }
}
