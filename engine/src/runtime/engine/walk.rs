//! The walk: step after step from `start` until the run ends, under `limits.timeout`; each
//! step is recorded before the run moves on, and cancel or pause stop it between steps.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{NodeIdx, Run, StepOutcome};
use crate::model::fmt_duration;
use crate::plan::*;
use crate::record::{self, RunStatus, StepRecord, StepStatus};
use crate::record::{ErrorKind, StepError};
use crate::runtime::steps::StepFacts;
use crate::store::Store;

impl<'e, S: Store> Run<'e, S> {
    /// Walks the graph from `start` until the run ends.
    pub(super) async fn walk(&mut self) -> Result<RunStatus, (RunStatus, StepError)> {
        let flow = self.flow.clone();
        let mut node = flow.start;
        loop {
            if node == flow.end {
                return Ok(RunStatus::Succeeded);
            }
            let step = flow.step(node).expect("non-end nodes are steps");
            if self.tree.cancel.is_cancelled() {
                return Err((
                    RunStatus::Cancelled,
                    StepError::new(ErrorKind::Cancelled, "the run was cancelled"),
                ));
            }
            if self.tree.pause.is_cancelled() {
                return Err((RunStatus::Running, paused()));
            }
            self.count_step().map_err(|e| (RunStatus::Failed, e))?;
            self.path.push(step.id.clone());
            let number = self.number();
            let started = record::Stamp::now();
            let t0 = Instant::now();
            tracing::debug!(run_id = %self.record.id, step = %step.id, number = %number, kind = step.kind.name(), "step started");
            // `limits.timeout` bounds the whole run; the step running when it passes is
            // recorded as failed with kind `limit`.
            let mut outcome = match self.flow.limits.timeout {
                Some(t) => {
                    let deadline = tokio::time::Instant::from_std(self.started + t);
                    // Boxed: the future of a step is large, and one copy of it in this
                    // function's state is enough (the branch below).
                    tokio::select! {
                        o = Box::pin(self.step(step, &number)) => o,
                        _ = tokio::time::sleep_until(deadline) => {
                            let mut o = StepOutcome::err(StepError::new(
                                ErrorKind::Limit,
                                format!(
                                    "run timeout reached ({} {})",
                                    self.flow.limits.timeout_name(),
                                    fmt_duration(t)
                                ),
                            ));
                            o.stop = Some(RunStatus::Failed);
                            o
                        }
                    }
                }
                None => self.step(step, &number).await,
            };
            let duration_ms = t0.elapsed().as_millis() as u64;
            self.record.usage.add(outcome.usage);
            // A run given up as lost ends where it would have called: no edge takes it on.
            if outcome.stop.is_none() && outcome.error.as_ref().is_some_and(|e| e.kind == ErrorKind::Lost) {
                outcome.stop = Some(RunStatus::Failed);
            }
            if outcome.stop == Some(RunStatus::Running) {
                // Paused inside the step: what it finished is recorded; it runs on when
                // the run resumes.
                return Err((RunStatus::Running, paused()));
            }
            // Resuming: a step whose own record finished is on record already.
            let recorded = self
                .replay
                .as_ref()
                .is_some_and(|r| r.finished(&number, None).is_some());

            let status = match (&outcome.error, outcome.stop) {
                (_, Some(RunStatus::Interrupted)) => StepStatus::Interrupted,
                (Some(_), _) => StepStatus::Failed,
                (None, _) => StepStatus::Succeeded,
            };
            // `steps.<id>` takes the result (moved, not copied); edges read it from there.
            let facts = StepFacts {
                status,
                error: outcome.error.clone(),
                attempts: outcome.attempts,
                duration_ms,
                failed: std::mem::take(&mut outcome.failed),
                iterations: outcome.iterations,
            };
            let entry = self.steps.finish(step, node, facts, outcome.result.take());

            let route: Result<Option<NodeIdx>, StepError> = match outcome.stop {
                Some(_) => Ok(None),
                None => self.route(step, &number, &outcome, entry),
            };
            let route_name = match &route {
                Ok(Some(n)) => Some(flow.step(*n).map_or_else(|| "end".to_string(), |s| s.id.clone())),
                _ => None,
            };
            for v in &outcome.violations {
                tracing::warn!(run_id = %self.record.id, step = %step.id, path = %v.path, reason = %v.reason, "output violation");
            }
            tracing::debug!(
                run_id = %self.record.id, step = %step.id, number = %number, status = status.as_str(),
                duration_ms, route = route_name.as_deref().unwrap_or(""), "step finished"
            );
            self.finished.fetch_add(1, Ordering::Relaxed);
            self.note_files(&outcome.files);
            if !recorded {
                let end = record::Stamp::now();
                let rec = || StepRecord {
                    run_id: self.record.id.clone(),
                    number,
                    step: step.id.clone(),
                    kind: step.kind.name().to_string(),
                    attempt: outcome.attempts,
                    status,
                    iteration: None,
                    iterations: outcome.iterations,
                    input: outcome.input,
                    // `steps.<id>` keeps the result; the record shares it.
                    result: self.steps.entry(entry).result.clone(),
                    changes: outcome.changes,
                    violations: outcome.violations,
                    error: outcome.error.clone(),
                    started_at: started.ms(),
                    finished_at: Some(end.ms()),
                    started_ns: Some(started.ns()),
                    finished_ns: Some(end.ns()),
                    usage: outcome.usage,
                    child_run: outcome.child_run,
                    route: route_name,
                    answers: outcome.answers,
                    files: outcome.files,
                };
                // Queued after a step without effects ([`Run::record_with`]), and after the
                // run's last step: its end, written next and waited for, commits it too.
                let last = outcome.stop.is_some() || !matches!(&route, Ok(Some(n)) if *n != flow.end);
                if let Err(e) = self.record_with(rec, last || !outcome.effects).await {
                    return Err((RunStatus::Failed, e));
                }
            }
            if let Some(stop) = outcome.stop {
                return match (stop, outcome.error) {
                    (RunStatus::Succeeded, _) => Ok(RunStatus::Succeeded),
                    (RunStatus::Interrupted, Some(e)) => Err((RunStatus::Interrupted, self.at_step(step, e))),
                    (RunStatus::Interrupted, None) => Ok(RunStatus::Interrupted),
                    (s, Some(e)) => Err((s, self.at_step(step, e))),
                    (s, None) => Ok(s),
                };
            }
            match route {
                Ok(Some(next)) => node = next,
                Ok(None) => {
                    return match outcome.error {
                        None => Ok(RunStatus::Succeeded),
                        Some(e) => Err((status_for(&e), self.at_step(step, e))),
                    };
                }
                Err(e) => return Err((status_for(&e), self.at_step(step, e))),
            }
        }
    }

    /// The run's error, from the error of the step it stopped at. A root run's names the step
    /// (``step `classify`: `$.ticket.subjet` matched nothing``) unless it starts with it already;
    /// a child run's stays the step's, which its calling step fails with as it is (and the
    /// root names that step). The step's own error (`steps.<id>.error`, its record) is unchanged.
    fn at_step(&self, step: &StepPlan, mut e: StepError) -> StepError {
        let prefix = format!("step `{}`: ", step.id);
        if self.lineage.depth == 0 && !e.message.starts_with(&prefix[..prefix.len() - 2]) {
            e.message.insert_str(0, &prefix);
        }
        e
    }
}
/// The message of a paused run's error ([`record::RunRecord::paused`]).
pub const PAUSED: &str = "paused before finishing (Ctrl-C): nothing runs it until it is resumed";

/// Why a paused run stopped where it did.
fn paused() -> StepError {
    StepError::new(ErrorKind::Cancelled, PAUSED)
}

fn status_for(e: &StepError) -> RunStatus {
    match e.kind {
        ErrorKind::Cancelled => RunStatus::Cancelled,
        _ => RunStatus::Failed,
    }
}
