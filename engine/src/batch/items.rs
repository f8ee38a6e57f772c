//! An item's run, on a task of its own: started anew or resumed, holding a place among
//! `--concurrency` while its run works, and settled there into its output line and counts
//! (the batch's loop only places lines).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use serde_json::Value;

use super::input::Line;
use super::options::{BatchOptions, Progress};
use super::output::{failed_line, outcome_line};
use crate::agents::AgentState;
use crate::plan::Plan;
use crate::record::RunStatus;
use crate::record::{ErrorKind, StepError};
use crate::runtime::budget::{CostCap, SharedBudget};
use crate::runtime::engine::{BatchItem, Engine, Released, RunControls, RunOptions, RunOutcome};
use crate::runtime::resume::ResumeOptions;
use crate::store::Store;

/// How many items' runs are working, and a wake-up when one lets go of its place.
#[derive(Default)]
pub(super) struct Working {
    count: AtomicUsize,
    pub(super) freed: tokio::sync::Notify,
    /// Runs let go of their place when their work is done, not when their task ends.
    early: bool,
}

impl Working {
    /// `early`: a run lets go of its place once its work is done, before the commit of its end.
    fn new(early: bool) -> Working {
        Working {
            early,
            ..Working::default()
        }
    }

    pub(super) fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Counts an item in; returns its controls, which let it go when its run's work is done,
    /// and a call that lets it go if that never happened (idempotent).
    /// `progress` counts it in flight until then: what `--concurrency` bounds.
    fn start(
        self: &Arc<Self>,
        controls: &RunControls,
        progress: &Arc<Progress>,
    ) -> (RunControls, impl Fn() + Send + Sync + 'static) {
        self.count.fetch_add(1, Ordering::AcqRel);
        progress.in_flight.fetch_add(1, Ordering::Relaxed);
        let done = Arc::new(AtomicBool::new(false));
        let release = {
            let working = self.clone();
            let progress = progress.clone();
            move || {
                if !done.swap(true, Ordering::AcqRel) {
                    working.count.fetch_sub(1, Ordering::AcqRel);
                    progress.in_flight.fetch_sub(1, Ordering::Relaxed);
                    working.freed.notify_one();
                }
            }
        };
        let release = Arc::new(release);
        let controls = RunControls {
            released: self.early.then(|| Released(release.clone())),
            ..controls.clone()
        };
        (controls, move || release())
    }
}

/// An item's task: the sequence number of its line's place, and what it hands back.
pub(super) type Task = tokio::task::JoinHandle<(u64, Done)>;

/// What every item of a batch runs with.
pub(super) struct Items<S: Store> {
    pub(super) engine: Engine<S>,
    pub(super) plan: Arc<Plan>,
    /// The batch's name in the store, which its items' runs record.
    pub(super) batch: String,
    /// With the batch's budget.
    run_options: RunOptions,
    resume_options: ResumeOptions,
    context: Value,
    pub(super) controls: RunControls,
    pub(super) progress: Arc<Progress>,
    /// Items whose run is still working (agents, steps).
    pub(super) working: Arc<Working>,
    /// The batch's budget (`--max-cost-usd`), shared by its items' runs: every agent call
    /// checks it first and counts against it as it finishes.
    pub(super) cap: Option<Arc<CostCap>>,
}

impl<S: Store> Items<S> {
    /// What the items of batch `batch` run with, from its options.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        engine: Engine<S>,
        plan: Arc<Plan>,
        batch: String,
        options: &BatchOptions,
        mut run_options: RunOptions,
        context: Value,
        controls: RunControls,
        progress: Arc<Progress>,
    ) -> Items<S> {
        // A run that only waits for the commit of its end no longer holds a place: the next
        // item starts meanwhile, and its line is still written only once that commit is done.
        // With `--max-cost-usd`, though, a place is let go only once the item's cost is
        // counted, so that no item starts on a budget that is already spent.
        let working = Arc::new(Working::new(options.max_cost_usd.is_none()));
        let cap = options
            .max_cost_usd
            .map(|max| Arc::new(CostCap::new(max, "--max-cost-usd")));
        run_options.shared_budget = cap.clone().map(|c| c as Arc<dyn SharedBudget>);
        let resume_options = ResumeOptions {
            retry_in_doubt: options.retry_in_doubt,
            decision: None,
            decision_for: None,
            allow_changed: options.allow_changed,
            lost: None,
            // An interrupted run is resumed only when its question was answered (SPEC §15).
            answered: true,
            record_answer: false,
            actor: None,
            reason: None,
        };
        Items {
            engine,
            plan,
            batch,
            run_options,
            resume_options,
            context,
            controls,
            progress,
            working,
            cap,
        }
    }

    /// Starts a new run of `line`'s item, with `input`, on a task of its own; `seq` is its
    /// line's place.
    pub(super) fn start(&self, seq: u64, line: Line, input: Value) -> Task {
        let engine = self.engine.clone();
        let plan = self.plan.clone();
        let run_options = self.run_options.clone();
        let context = self.context.clone();
        let item = BatchItem {
            batch: self.batch.clone(),
            id: line.id.clone(),
            index: line.index,
        };
        let t0 = Instant::now();
        let progress = self.progress.clone();
        let (controls, release) = self.working.start(&self.controls, &progress);
        // Boxed: a run's future is large, and moving the box moves a pointer.
        tokio::spawn(async move {
            let state = Arc::new(AgentState::default());
            let o = Box::pin(engine.run_item(plan, input, context, run_options, state, controls, Some(item)))
                .await;
            // Counted (its cost too) before its place is let go.
            let done = settle(&progress, &line.id_value, Ok(o), t0);
            release();
            (seq, done)
        })
    }

    /// Resumes `line`'s item's unfinished run `run_id` on a task of its own; `seq` is its
    /// line's place.
    pub(super) fn resume(&self, seq: u64, line: Line, run_id: String) -> Task {
        let engine = self.engine.clone();
        let plan = self.plan.clone();
        let run_options = self.run_options.clone();
        let resume = self.resume_options.clone();
        let t0 = Instant::now();
        let progress = self.progress.clone();
        let (controls, release) = self.working.start(&self.controls, &progress);
        tokio::spawn(async move {
            let state = Arc::new(AgentState::default());
            let o = Box::pin(engine.resume(plan, &run_id, run_options, resume, state, controls)).await;
            let done = settle(&progress, &line.id_value, o, t0);
            release();
            (seq, done)
        })
    }
}

/// What a finished item task hands back.
pub(super) enum Done {
    Line(String),
    /// Paused before it finished: resumed on the next start.
    Unfinished,
    StoreFailed(String),
}

/// Turns a run's outcome into its output line and counts it, on the item's own task (the
/// batch's driver only places lines).
fn settle(
    progress: &Progress,
    id: &Value,
    outcome: Result<RunOutcome, crate::runtime::resume::ResumeError>,
    t0: Instant,
) -> Done {
    match outcome {
        Ok(RunOutcome {
            store_failure: Some(why),
            ..
        }) => Done::StoreFailed(why),
        Ok(o) if o.status == RunStatus::Running => Done::Unfinished,
        Ok(o) => {
            progress.add_cost(&o.usage);
            count(progress, o.status);
            Done::Line(outcome_line(id, &o))
        }
        Err(e) => {
            progress.failed.fetch_add(1, Ordering::Relaxed);
            let e = StepError::new(ErrorKind::Agent, format!("cannot resume: {e}"));
            let ms = t0.elapsed().as_millis() as u64;
            Done::Line(failed_line(id, &e, ms))
        }
    }
}

pub(super) fn count(progress: &Progress, status: RunStatus) {
    let counter = match status {
        RunStatus::Succeeded => &progress.succeeded,
        RunStatus::Interrupted => &progress.interrupted,
        _ => &progress.failed,
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run is counted in flight while it holds its place: once its work is done (it only
    /// waits for the commit of its end) it is not, so the count never passes `--concurrency`.
    #[test]
    fn a_run_that_let_go_of_its_place_is_not_in_flight() {
        let working = Arc::new(Working {
            early: true,
            ..Working::default()
        });
        let progress = Arc::new(Progress::default());
        let (controls, release) = working.start(&RunControls::default(), &progress);
        let (_, release_b) = working.start(&RunControls::default(), &progress);
        assert_eq!(
            (working.count(), progress.in_flight.load(Ordering::Relaxed)),
            (2, 2)
        );
        // The engine lets go of the place before it waits for the commit.
        let released = controls.released.expect("early release");
        (released.0)();
        assert_eq!(
            (working.count(), progress.in_flight.load(Ordering::Relaxed)),
            (1, 1)
        );
        // The task's own release after it is a no-op; the other run's counts.
        release();
        release_b();
        assert_eq!(
            (working.count(), progress.in_flight.load(Ordering::Relaxed)),
            (0, 0)
        );
    }
}
