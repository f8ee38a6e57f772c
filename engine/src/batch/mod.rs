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
mod options;
mod output;
mod reorder;
mod summary;

pub use error::BatchError;
pub use input::MAX_LINE_BYTES;
pub use options::{BatchOptions, Progress};
pub use output::{BatchLock, lock_batch_of};
pub use summary::Summary;

pub(crate) use decide::Earlier;
pub(crate) use ids::scan;
pub(crate) use input::Lines;
pub(crate) use output::record_line;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::Value;

use self::decide::refuse_changed;
use self::drive::Driver;
use self::items::Items;
use self::output::{Output, batch_name, same_file};
use crate::plan::Plan;
use crate::runtime::engine::{Engine, RunControls, RunOptions};
use crate::store::Store;

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
