//! What a process may watch of its runs as they go (OpenTelemetry export, `crate::otel`): each
//! run's start and end and each finished step record, in the order the engine makes them,
//! whatever the store keeps. An observer is called on the run's task: it must not wait.

use std::sync::{Arc, OnceLock};

use super::record::{RunRecord, StepRecord};

pub trait Observer: Send + Sync {
    /// A run (root or child) started, or was resumed.
    fn run_started(&self, run: &RunRecord);
    /// A step record that is not an attempt's `started` one.
    fn step(&self, step: &StepRecord);
    /// A run ended (or paused): its record as stored.
    fn run_ended(&self, run: &RunRecord);
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
}
