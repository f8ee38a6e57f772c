//! What a process may watch of its runs as they go (OpenTelemetry export, `crate::otel`): each
//! run's start and end and each finished step record, in the order the engine makes them,
//! whatever the store keeps. An observer is called on the run's task: it must not wait.
//!
//! A resumed run's records that finished before (read back from the store) are not made again;
//! when the run was taken over from a holder that stopped without recording a stop (it died,
//! lost its lease, paused or failed to write), they are handed over as [`Observer::replayed`],
//! for what that holder never ended.

use std::sync::{Arc, OnceLock};

use crate::record::{RunRecord, StepRecord};

pub trait Observer: Send + Sync {
    /// A run (root or child) started, or was resumed.
    fn run_started(&self, run: &RunRecord);
    /// A step record that is not an attempt's `started` one.
    fn step(&self, step: &StepRecord);
    /// A run ended (or paused): its record as stored.
    fn run_ended(&self, run: &RunRecord);
    /// A run ended here without its end on record: a store write of its tree was refused or
    /// failed (its lease was taken over, the store broke), so another process may go on
    /// with it, or already did.
    fn run_unrecorded(&self, run: &RunRecord) {
        self.run_ended(run);
    }
    /// A finished record of a run resumed from `running`, read back from the store: made by
    /// a holder that stopped without recording a stop, told once per resume of the run.
    fn replayed(&self, _step: &StepRecord) {}
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

/// Tells each of several observers, in order.
pub struct Fanout(pub Vec<Arc<dyn Observer>>);

impl Observer for Fanout {
    fn run_started(&self, run: &RunRecord) {
        self.0.iter().for_each(|o| o.run_started(run));
    }
    fn step(&self, step: &StepRecord) {
        self.0.iter().for_each(|o| o.step(step));
    }
    fn run_ended(&self, run: &RunRecord) {
        self.0.iter().for_each(|o| o.run_ended(run));
    }
    fn run_unrecorded(&self, run: &RunRecord) {
        self.0.iter().for_each(|o| o.run_unrecorded(run));
    }
    fn replayed(&self, step: &StepRecord) {
        self.0.iter().for_each(|o| o.replayed(step));
    }
}
