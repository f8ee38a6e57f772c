//! What a process may watch of its runs as they go (OpenTelemetry export, `crate::otel`): each
//! run's start and end and each finished step record, in the order the engine makes them,
//! whatever the store keeps. An observer is called on the run's task: it must not wait.
//!
//! Each run holds what its observer returned as it started (a [`Watch`]) and hands it back
//! with each of its records and its end, so an observer keeps its state per run or per run
//! tree and finds it without a lookup; a child run's start is given the watch of the run
//! that started it.
//!
//! A resumed run's records that finished before (read back from the store) are not made again;
//! when the run was taken over from a holder that stopped without recording a stop (it died,
//! lost its lease, paused or failed to write), they are handed over as [`Observer::replayed`],
//! for what that holder never ended.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use crate::record::{RunRecord, StepRecord};

/// What an observer keeps of one run, returned by [`Observer::run_started`] and handed back
/// with each of the run's records: `None` when it keeps nothing.
pub type Watch = Option<Arc<dyn Any + Send + Sync>>;

pub trait Observer: Send + Sync {
    /// A run (root or child) started, or was resumed; `above` is the watch of the run that
    /// started it (or of another run above it in its tree), `None` for a root run. What it
    /// returns is handed back with each of the run's records.
    fn run_started(&self, run: &RunRecord, above: &Watch) -> Watch;
    /// A step record that is not an attempt's `started` one.
    fn step(&self, watch: &Watch, step: &StepRecord);
    /// A run ended (or paused): its record as stored.
    fn run_ended(&self, watch: &Watch, run: &RunRecord);
    /// A run ended here without its end on record: a store write of its tree was refused or
    /// failed (its lease was taken over, the store broke), so another process may go on
    /// with it, or already did.
    fn run_unrecorded(&self, watch: &Watch, run: &RunRecord) {
        self.run_ended(watch, run);
    }
    /// A finished record of a run resumed from `running`, read back from the store: made by
    /// a holder that stopped without recording a stop, told once per resume of the run.
    fn replayed(&self, _watch: &Watch, _step: &StepRecord) {}
}

static INSTALLED: OnceLock<Arc<dyn Observer>> = OnceLock::new();

/// Installs the observer of every engine this process makes from now on; false when one is
/// installed already.
pub fn install(observer: Arc<dyn Observer>) -> bool {
    INSTALLED.set(observer).is_ok()
}

/// The process's observer, if one is installed.
pub fn installed() -> Option<Arc<dyn Observer>> {
    INSTALLED.get().cloned()
}

static UNWATCHED: Watch = None;

/// Tells each of several observers, in order; its watch holds theirs.
pub struct Fanout(pub Vec<Arc<dyn Observer>>);

impl Fanout {
    /// The watch of observer `i` within `watch`.
    fn each<'a>(&'a self, watch: &'a Watch) -> impl Iterator<Item = (&'a Arc<dyn Observer>, &'a Watch)> {
        let theirs = watch.as_deref().and_then(|w| w.downcast_ref::<Vec<Watch>>());
        self.0
            .iter()
            .enumerate()
            .map(move |(i, o)| (o, theirs.and_then(|t| t.get(i)).unwrap_or(&UNWATCHED)))
    }
}

impl Observer for Fanout {
    fn run_started(&self, run: &RunRecord, above: &Watch) -> Watch {
        let theirs: Vec<Watch> = self.each(above).map(|(o, w)| o.run_started(run, w)).collect();
        Some(Arc::new(theirs))
    }
    fn step(&self, watch: &Watch, step: &StepRecord) {
        self.each(watch).for_each(|(o, w)| o.step(w, step));
    }
    fn run_ended(&self, watch: &Watch, run: &RunRecord) {
        self.each(watch).for_each(|(o, w)| o.run_ended(w, run));
    }
    fn run_unrecorded(&self, watch: &Watch, run: &RunRecord) {
        self.each(watch).for_each(|(o, w)| o.run_unrecorded(w, run));
    }
    fn replayed(&self, watch: &Watch, step: &StepRecord) {
        self.each(watch).for_each(|(o, w)| o.replayed(w, step));
    }
}
