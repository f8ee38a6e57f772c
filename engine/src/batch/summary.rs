//! How a batch ended: its counts and cost, and why it stopped early, if it did.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::drive::Ended;
use super::options::{BatchOptions, Progress};
use crate::record::cost::Cost;

/// How a batch ended.
#[derive(Debug, Default)]
pub struct Summary {
    pub total: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub interrupted: u64,
    /// Items not finished: stopped by Ctrl-C or the cost limit, or never started.
    pub unfinished: u64,
    pub reused: u64,
    pub cost_usd: Cost,
    /// Model calls of the batch (earlier starts included) whose cost is unknown.
    pub cost_unknown_calls: u64,
    /// LLM requests of this start abandoned past their timeout (or cancelled), whose tokens
    /// are unknown: `cost_usd` is then a lower bound.
    pub abandoned_requests: u64,
    pub elapsed: std::time::Duration,
    /// Why the batch stopped early, if it did.
    pub stopped: Option<String>,
    /// It stopped because the store failed (disk full, locked).
    pub store_failed: bool,
    /// It stopped because it had spent `--max-cost-usd` (this budget).
    pub cost_limit: Option<f64>,
}

/// LLM requests abandoned with their tokens unknown so far, counted by the process's providers.
pub(super) fn abandoned_requests() -> u64 {
    crate::agents::provider::Providers::global().totals().abandoned
}

/// The summary of a batch of `total` items whose loop ended as `ended`, begun at `started`
/// with `abandoned_before` requests abandoned.
pub(super) fn summarize(
    total: u64,
    options: &BatchOptions,
    progress: &Progress,
    ended: Ended,
    abandoned_before: u64,
    started: Instant,
) -> Summary {
    let Ended {
        read,
        input_done,
        mut stopped,
        blocked,
        store_failed,
        cost_limit,
    } = ended;
    if stopped.is_none() && input_done && read < total {
        stopped = Some(format!(
            "{} ended after {read} of the {total} items it had when the batch began: it changed while \
             the batch read it",
            options.input.display()
        ));
    }
    if stopped.is_none() && blocked {
        stopped = Some("interrupted (Ctrl-C)".to_string());
    }
    if let (Some(max), Some(why)) = (cost_limit, &mut stopped)
        && why.is_empty()
    {
        let unknown = progress.cost_unknown_calls.load(Ordering::Relaxed);
        *why = crate::runtime::budget::batch_stopped(max, progress.cost_usd(), unknown);
    }
    let succeeded = progress.succeeded.load(Ordering::Relaxed);
    let failed = progress.failed.load(Ordering::Relaxed);
    let interrupted = progress.interrupted.load(Ordering::Relaxed);
    Summary {
        total,
        succeeded,
        failed,
        interrupted,
        unfinished: total.saturating_sub(succeeded + failed + interrupted),
        reused: progress.reused.load(Ordering::Relaxed),
        cost_usd: progress.cost_usd(),
        cost_unknown_calls: progress.cost_unknown_calls.load(Ordering::Relaxed),
        abandoned_requests: abandoned_requests().saturating_sub(abandoned_before),
        elapsed: started.elapsed(),
        stopped,
        store_failed,
        cost_limit: cost_limit.filter(|_| !store_failed),
    }
}
