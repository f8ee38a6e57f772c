//! Batches (SPEC §10): one run per line of a JSONL file, up to `concurrency` in flight, output
//! lines in input order, resumable.
//!
//! The store is the truth; the output file is derived from it. Every start reads the input
//! twice, streaming: once for the ids (duplicates are refused before anything runs), once to
//! run. Each line's latest run in the store decides what happens to it: finished runs are
//! written as they are, unfinished ones (a crash, Ctrl-C) resume, lines without a run start
//! one. The output file is written anew from the first line on every start, so a torn last
//! line of a killed batch is repaired and an item is never written twice.
//!
//! A batch is identified by its output file (its canonical path: symlinks and `..`
//! resolved): running the same command again, whatever the spelling of the output, continues
//! it.
//!
//! [`run`] is its phases in order, each in the file named for it: the checks before anything
//! is written (here, with the ids pass of `ids.rs`), the output file (`output.rs`: its name,
//! lock and lines), the loop (`drive.rs`) over the input (`input.rs`), what each line becomes
//! (`decide.rs`), its item's run (`items.rs`) and the reorder buffer (`reorder.rs`), and the
//! summary (`summary.rs`).

mod decide;
mod drive;
mod error;
mod ids;
mod input;
mod items;
mod output;
mod reorder;
mod summary;

pub use error::BatchError;
pub use input::MAX_LINE_BYTES;
pub use output::{BatchLock, lock_batch_of};
pub use summary::Summary;

pub(crate) use decide::Earlier;
pub(crate) use ids::scan;
pub(crate) use input::Lines;
pub(crate) use output::record_line;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde_json::Value;

use self::decide::refuse_changed;
use self::drive::Driver;
use self::items::Items;
use self::output::{Output, batch_name, same_file};
use crate::plan::Plan;
use crate::record::Usage;
use crate::record::cost::Cost;
use crate::runtime::engine::{Engine, RunControls, RunOptions};
use crate::store::Store;

/// What a batch reads and writes and how it runs its items: [`BatchOptions::new`] gives
/// `switchyard batch`'s defaults, and the public fields are its flags.
#[derive(Clone, Debug)]
pub struct BatchOptions {
    pub input: PathBuf,
    pub output: PathBuf,
    pub concurrency: usize,
    /// The field of each input object holding its id, a dotted path (`ticket.id`); lines
    /// without it are identified by their line number.
    pub id_field: String,
    /// The id field was named (`--id-field`), not the default: an input in which no line
    /// has it is refused.
    pub(crate) id_field_given: bool,
    /// The batch's budget: checked before every agent call of its items in flight, and no
    /// item starts once it is spent.
    pub max_cost_usd: Option<f64>,
    /// Run failed items again (a new run each).
    pub retry_failed: bool,
    pub retry_in_doubt: bool,
    pub allow_changed: bool,
    /// The store holds nothing of earlier batches (`--store memory`): nothing to look up.
    pub(crate) fresh_store: bool,
    /// Sync OUT.jsonl to disk before returning. Worth it only when the store is durable too:
    /// with `--store memory` a crash or power loss leaves nothing to continue from anyway, so
    /// its output is left to the operating system like any other file a tool writes.
    pub(crate) sync_output: bool,
    /// Run nothing: write OUT.jsonl from the store (`runs export`), in input order, up to the
    /// first item that has not finished.
    pub(crate) export_only: bool,
}

/// Counters the caller shows while the batch runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Items in the input.
    pub total: AtomicU64,
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    pub interrupted: AtomicU64,
    /// Runs doing work (agents, steps), as `--concurrency` bounds them; a run waiting only
    /// for the commit of its end is no longer counted.
    pub in_flight: AtomicU64,
    /// Items whose result came from an earlier start of the batch.
    pub reused: AtomicU64,
    /// Cost in nano-dollars, the unit providers count in: an item of a cheap local model
    /// costs well under a micro-dollar.
    pub cost_nanos: AtomicU64,
    /// Model calls whose cost is unknown (no `usage` reported), not in `cost_nanos`.
    pub cost_unknown_calls: AtomicU64,
}

impl Progress {
    pub fn done(&self) -> u64 {
        self.succeeded.load(Ordering::Relaxed)
            + self.failed.load(Ordering::Relaxed)
            + self.interrupted.load(Ordering::Relaxed)
    }

    pub fn cost_usd(&self) -> Cost {
        Cost::from_nanos(self.cost_nanos.load(Ordering::Relaxed))
    }

    fn add_cost(&self, usage: &Usage) {
        self.cost_nanos
            .fetch_add(usage.cost_usd.nanos(), Ordering::Relaxed);
        self.cost_unknown_calls
            .fetch_add(usage.cost_unknown_calls, Ordering::Relaxed);
    }
}

/// Runs the batch. `pause` stops starting items and stops in-flight runs at their next
/// recorded point (they resume on the next start).
pub async fn run<S: Store>(
    engine: Engine<S>,
    plan: Arc<Plan>,
    options: BatchOptions,
    run_options: RunOptions,
    context: Value,
    progress: Arc<Progress>,
    controls: RunControls,
) -> Result<Summary, BatchError> {
    let started = Instant::now();
    let abandoned_before = summary::abandoned_requests();
    let (total, batch) = check(&*engine.store, &plan, &options, &run_options, &progress).await?;
    let out = Output::create(&options)?;
    let items = Items::new(
        engine,
        plan,
        batch,
        &options,
        run_options,
        context,
        controls,
        progress.clone(),
    );
    let mut driver = Driver::new(&options, items, out)?;
    driver.drive().await?;
    let ended = driver.finish()?;
    Ok(summary::summarize(
        total,
        &options,
        &progress,
        ended,
        abandoned_before,
        started,
    ))
}

/// What is checked before the output is touched: the input is not the output; its ids are
/// unique (the ids pass, which counts the items into `progress`); the batch's unfinished runs
/// started from this flow under these agent changes (unless `--allow-changed`); an export
/// has runs to write. Returns the number of items and the batch's name in the store.
async fn check<S: Store>(
    store: &S,
    plan: &Plan,
    options: &BatchOptions,
    run_options: &RunOptions,
    progress: &Progress,
) -> Result<(u64, String), BatchError> {
    if same_file(&options.input, &options.output) {
        return Err(BatchError::SameFile {
            path: options.output.display().to_string(),
        });
    }
    let total = scan(options)?;
    progress.total.store(total, Ordering::Relaxed);
    let batch = batch_name(store, options).await?;
    if !options.fresh_store && !options.allow_changed && !options.export_only {
        refuse_changed(store, &batch, plan.root(), run_options).await?;
    }
    // An export from a store that never saw this batch (another folder's, a mistyped one)
    // would empty the output: refuse before touching it.
    if options.export_only && store.batch_runs(&batch, 0, 1).await?.is_empty() {
        return Err(BatchError::NothingToExport {
            path: options.output.display().to_string(),
        });
    }
    Ok((total, batch))
}
