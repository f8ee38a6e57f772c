//! `collect` (SPEC §12): a submitted batch's results, one line per input line in input order,
//! each exactly once (its latest run), in the form `batch` writes.
//!
//! The output is written to a temporary file beside it and renamed into place when complete,
//! so a reader never sees half a result file and an interrupted collect leaves the last one
//! whole. Runs are read a page at a time, in input order: memory does not grow with the batch.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::record::{RunRecord, RunStatus};
use crate::store::Store as _;
use crate::store::StoreError;
use crate::store::sql::SqlStore;
use crate::store::sql::batches::SubmittedBatch;

/// Runs read per page.
const PAGE: usize = 2048;

/// What was written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Collected {
    pub written: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub interrupted: u64,
    pub cancelled: u64,
    /// Items left out because their latest run has not finished (`--partial`).
    pub unfinished: u64,
    pub cost_usd: crate::record::cost::Cost,
    /// Model calls of the written items whose cost is unknown.
    pub cost_unknown_calls: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error(
        "batch `{batch}`: {unfinished} of its items have not finished; pass --wait to wait for them, or --partial \
         to write those that have"
    )]
    Unfinished { batch: String, unfinished: u64 },
    #[error(
        "batch `{batch}`: its submit has not finished ({runs} of {items} lines have a run); run the same submit \
         again to finish it, or pass --partial"
    )]
    Incomplete { batch: String, runs: u64, items: u64 },
    #[error("{path}: {message}")]
    Output { path: String, message: String },
    #[error("--files: {0}")]
    Files(#[from] crate::files::out::WriteError),
}

/// Writes batch `batch`'s results to `output`. Without `partial`, an item that has not
/// finished stops the collect before `output` is touched.
pub async fn collect(
    store: &SqlStore,
    batch: &SubmittedBatch,
    output: &Path,
    partial: bool,
    files: Option<&Path>,
) -> Result<Collected, CollectError> {
    let out_err = |e: std::io::Error| CollectError::Output {
        path: output.display().to_string(),
        message: e.to_string(),
    };
    let tmp = temporary_beside(output);
    let file = std::fs::File::create(&tmp).map_err(out_err)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 16, file);
    let mut files = files.map(|d| crate::files::out::ItemFiles::new(d.to_path_buf(), store.blobs()));
    let written = write_all(store, batch, partial, &mut out, files.as_mut()).await;
    let finished = match written {
        Ok(c) => out
            .into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_all())
            .map_err(out_err)
            .and_then(|()| std::fs::rename(&tmp, output).map_err(out_err))
            .map(|()| c),
        Err(e) => Err(e),
    };
    if finished.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let c = finished?;
    if !partial && c.written < batch.items && batch.complete {
        // Every line has a run once submit completed: fewer means the store lost some.
        return Err(CollectError::Output {
            path: output.display().to_string(),
            message: format!(
                "batch `{}` has {} lines but only {} runs were found",
                batch.name, batch.items, c.written
            ),
        });
    }
    Ok(c)
}

async fn write_all(
    store: &SqlStore,
    batch: &SubmittedBatch,
    partial: bool,
    out: &mut impl std::io::Write,
    mut files: Option<&mut crate::files::out::ItemFiles>,
) -> Result<Collected, CollectError> {
    if !batch.complete && !partial {
        let runs = store.batch_counts(&batch.name, 0).await?.total();
        return Err(CollectError::Incomplete {
            batch: batch.name.clone(),
            runs,
            items: batch.items,
        });
    }
    let id_path: Vec<&str> = batch.id_field.split('.').collect();
    let mut c = Collected::default();
    let mut pages = Pages::new(&batch.name);
    let out_err = |e: std::io::Error| CollectError::Output {
        path: "the output".to_string(),
        message: e.to_string(),
    };
    while let Some(run) = pages.next_item(store).await? {
        match run.status {
            RunStatus::Queued | RunStatus::Running => {
                if !partial {
                    return Err(CollectError::Unfinished {
                        batch: batch.name.clone(),
                        unfinished: store.batch_counts(&batch.name, 0).await?.unfinished().max(1),
                    });
                }
                c.unfinished += 1;
                if let Some(f) = files.as_deref_mut() {
                    // Its directory is kept for it, so that ids after it keep theirs.
                    f.write(&id_value(&run, &id_path), &[]).await?;
                }
                continue;
            }
            RunStatus::Succeeded => c.succeeded += 1,
            RunStatus::Failed => c.failed += 1,
            RunStatus::Interrupted => c.interrupted += 1,
            RunStatus::Cancelled => c.cancelled += 1,
        }
        c.cost_usd += run.usage.cost_usd;
        c.cost_unknown_calls += run.usage.cost_unknown_calls;
        let id = id_value(&run, &id_path);
        let line = crate::batch::record_line(&run, &id);
        out.write_all(line.as_bytes()).map_err(out_err)?;
        out.write_all(b"\n").map_err(out_err)?;
        if let Some(f) = files.as_deref_mut() {
            f.write(&id, &run.files).await?;
        }
        c.written += 1;
    }
    Ok(c)
}

/// The id as the output writes it: the input's string or number at the id field, as `batch`
/// writes it; the recorded id text for a line that was not JSON.
fn id_value(run: &RunRecord, id_path: &[&str]) -> Value {
    let mut v = &run.input;
    for seg in id_path {
        match v.get(*seg) {
            Some(next) => v = next,
            None => return Value::String(run.item_id.clone().unwrap_or_default()),
        }
    }
    match v {
        Value::String(_) | Value::Number(_) => v.clone(),
        _ => Value::String(run.item_id.clone().unwrap_or_default()),
    }
}

/// `dir/.NAME.collect-PID`, beside `output`.
fn temporary_beside(output: &Path) -> PathBuf {
    let name = output
        .file_name()
        .map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    output.with_file_name(format!(".{name}.collect-{}", std::process::id()))
}

/// A batch's root runs in input order, a page at a time, giving each item's latest run.
pub struct Pages {
    batch: String,
    from: u64,
    buf: VecDeque<RunRecord>,
    done: bool,
}

impl Pages {
    pub fn new(batch: &str) -> Pages {
        Pages {
            batch: batch.to_string(),
            from: 0,
            buf: VecDeque::new(),
            done: false,
        }
    }

    /// The next item's latest run.
    pub async fn next_item(&mut self, store: &SqlStore) -> Result<Option<RunRecord>, StoreError> {
        loop {
            // An item is whole in the buffer when a later item follows it, or the reads ended.
            let first = self.buf.front().and_then(|r| r.item_index);
            let whole = match first {
                None => false,
                Some(i) => self.done || self.buf.iter().any(|r| r.item_index != Some(i)),
            };
            if whole {
                let i = first;
                let mut latest = None;
                while self.buf.front().is_some_and(|r| r.item_index == i) {
                    latest = self.buf.pop_front();
                }
                return Ok(latest);
            }
            if self.done {
                return Ok(None);
            }
            let page = store.batch_runs(&self.batch, self.from, PAGE).await?;
            if page.len() < PAGE {
                self.done = true;
            }
            let (first, last) = (
                page.first().and_then(|r| r.item_index),
                page.last().and_then(|r| r.item_index),
            );
            let roots = page.into_iter().filter(|r| r.parent_run.is_none());
            // The next page starts at the last item read; that item may go on past this page,
            // so its runs read here are dropped and read again with the rest.
            match last {
                Some(last) if !self.done && first != Some(last) => {
                    self.buf.extend(roots.filter(|r| r.item_index != Some(last)));
                    self.from = last;
                }
                Some(last) if !self.done => {
                    // One item with a page of runs or more: read it whole.
                    let all = store.batch_runs(&self.batch, last, usize::MAX >> 1).await?;
                    self.buf.extend(
                        all.into_iter()
                            .filter(|r| r.parent_run.is_none() && r.item_index == Some(last)),
                    );
                    self.from = last + 1;
                }
                _ => self.buf.extend(roots),
            }
        }
    }
}
