//! `switchyard submit` (SPEC §12): stores a flow bundle, a batch, and one queued run per input
//! line, streaming — a chunk of lines at a time, each chunk one transaction, so a million lines
//! need neither a million-row transaction nor a million runs in memory.
//!
//! Submitting is idempotent per line, as `batch` is: a line whose item already has a run in
//! the batch adds nothing; a line whose id or content changed since is refused (the input is
//! not the batch's), unless `--retry-failed` and its run failed, which queues a new run. The
//! ids are checked for duplicates before anything is written. A line that is not JSON or does
//! not match `input.schema` gets a run recorded `failed` at once, so `collect` has every line.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use crate::batch::{BatchError, BatchOptions, Earlier, Lines};
use crate::plan::Plan;
use crate::record::{self, RunRecord, RunStatus, Usage};
use crate::record::{ErrorKind, StepError};
use crate::store::StoreError;
use crate::store::sql::SqlStore;
use crate::store::sql::batches::SubmittedBatch;
use crate::store::sql::queue::{SUBMIT_CHUNK, StoredBundle};

#[derive(Clone, Debug)]
pub struct SubmitOptions {
    pub batch: String,
    pub input: PathBuf,
    pub id_field: String,
    pub id_field_given: bool,
    pub context: Value,
    pub max_recoveries: u64,
    /// `--max-cost-usd`: the batch's budget, stored with it (replacing a stored one).
    pub max_cost_usd: Option<f64>,
    /// Queue a new run for items whose latest run failed or was cancelled.
    pub retry_failed: bool,
    /// Accept a flow that changed since the batch was first submitted: runs claimed from now
    /// on run the new one.
    pub allow_changed: bool,
}

/// Counters the caller shows while lines are submitted.
#[derive(Debug, Default)]
pub struct SubmitProgress {
    pub total: AtomicU64,
    pub read: AtomicU64,
    /// Runs queued by this submit.
    pub queued: AtomicU64,
    /// Lines whose run was there already.
    pub existing: AtomicU64,
    /// Lines recorded failed at once (not JSON, not matching `input.schema`).
    pub failed: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    Input(#[from] BatchError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error(
        "batch `{batch}` was submitted with another version of the flow `{flow}` (recorded {recorded}, now {now}): \
         pass --allow-changed to run the new one for what is left, or submit to another --batch"
    )]
    FlowChanged {
        batch: String,
        flow: String,
        recorded: String,
        now: String,
    },
    #[error(
        "{path} line {line}: item `{id}` is not the input its queued run `{run}` was submitted with: the input \
         changed since it was submitted; restore the line, submit to another --batch, or pass --retry-failed if \
         only failed items changed"
    )]
    LineChanged {
        path: String,
        line: u64,
        id: String,
        run: String,
    },
    #[error("batch `{batch}` runs the flow `{recorded}`, not `{given}`: submit to another --batch")]
    OtherFlow {
        batch: String,
        recorded: String,
        given: String,
    },
    #[error(
        "batch `{batch}` was submitted with --id-field `{recorded}`, not `{given}`: the same lines would be other items"
    )]
    IdField {
        batch: String,
        recorded: String,
        given: String,
    },
}

/// Submits `options.input` as batch `options.batch` running `plan`, whose bundle is `bundle`.
pub async fn submit(
    store: &SqlStore,
    plan: &Plan,
    bundle: StoredBundle,
    options: &SubmitOptions,
    progress: Arc<SubmitProgress>,
) -> Result<SubmittedBatch, SubmitError> {
    let root = plan.root();
    let scan_options = BatchOptions {
        input: options.input.clone(),
        output: PathBuf::new(),
        concurrency: 1,
        id_field: options.id_field.clone(),
        id_field_given: options.id_field_given,
        max_cost_usd: None,
        files_dir: None,
        retry_failed: false,
        retry_in_doubt: false,
        allow_changed: false,
        fresh_store: false,
        sync_output: false,
        export_only: false,
    };
    // Duplicate ids are refused before anything is written.
    let total = crate::batch::scan(&scan_options)?;
    progress.total.store(total, Ordering::Relaxed);
    store.put_bundle(&bundle).await?;
    let wanted = SubmittedBatch {
        name: options.batch.clone(),
        bundle: bundle.hash.clone(),
        flow: root.name.clone(),
        flow_hash: root.hash.clone(),
        input: std::path::absolute(&options.input)
            .unwrap_or_else(|_| options.input.clone())
            .display()
            .to_string(),
        id_field: options.id_field.clone(),
        context: options.context.clone(),
        max_recoveries: options.max_recoveries,
        max_cost_usd: options.max_cost_usd,
        items: total,
        complete: false,
        submitted_at: record::now_ms(),
    };
    let stored = store.put_batch(&wanted).await?;
    if stored.flow != wanted.flow {
        return Err(SubmitError::OtherFlow {
            batch: stored.name,
            recorded: stored.flow,
            given: wanted.flow,
        });
    }
    if stored.id_field != wanted.id_field {
        return Err(SubmitError::IdField {
            batch: stored.name,
            recorded: stored.id_field,
            given: wanted.id_field,
        });
    }
    if stored.flow_hash != wanted.flow_hash {
        if !options.allow_changed {
            return Err(SubmitError::FlowChanged {
                batch: stored.name,
                flow: stored.flow,
                recorded: stored.flow_hash,
                now: wanted.flow_hash,
            });
        }
        store
            .set_batch_bundle(&stored.name, &wanted.bundle, &wanted.flow_hash)
            .await?;
    }

    if let Some(max) = options.max_cost_usd
        && stored.max_cost_usd != Some(max)
    {
        store.set_batch_cap(&stored.name, max).await?;
    }

    let path = options.input.display().to_string();
    let mut lines = Lines::open(&options.input, &options.id_field)?;
    let mut earlier = Earlier::new(options.batch.clone());
    let mut chunk: Vec<RunRecord> = Vec::with_capacity(SUBMIT_CHUNK);
    let mut count = 0u64;
    while let Some(mut line) = lines.next_line()? {
        count += 1;
        progress.read.fetch_add(1, Ordering::Relaxed);
        let previous = earlier.latest(store, line.index).await?;
        if let Some(prev) = previous {
            if prev.item_id.as_deref() != Some(line.id.as_str()) {
                return Err(BatchError::InputChanged {
                    path,
                    line: line.index + 1,
                    recorded: prev.item_id.unwrap_or_default(),
                    now: line.id,
                }
                .into());
            }
            let retry =
                options.retry_failed && matches!(prev.status, RunStatus::Failed | RunStatus::Cancelled);
            if !retry {
                // A line refused at submit for not being JSON has no input to compare: it is
                // the same line only if it still is not JSON. One refused by the schema has
                // its input recorded, like a queued one.
                let same = match (&line.parsed, failed_at_submit(&prev)) {
                    (Ok(v), None | Some(AT_SUBMIT_SCHEMA)) => *v == prev.input,
                    (Err(_), Some(AT_SUBMIT_JSON)) => true,
                    _ => false,
                };
                if !same {
                    return Err(SubmitError::LineChanged {
                        path,
                        line: line.index + 1,
                        id: line.id,
                        run: prev.id,
                    });
                }
                progress.existing.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        }
        let parsed = std::mem::replace(&mut line.parsed, Ok(Value::Null));
        let rejected = match &parsed {
            Err(e) => Some((e.clone(), AT_SUBMIT_JSON)),
            Ok(input) => root.input_schema.as_ref().and_then(|schema| {
                schema.check(input).err().map(|v| {
                    let message = format!(
                        "line {}: the input does not match `input.schema` {v}",
                        line.index + 1
                    );
                    (message, AT_SUBMIT_SCHEMA)
                })
            }),
        };
        let mut run = queued_run(plan, options, &line.id, line.index, parsed.unwrap_or(Value::Null));
        if let Some((message, reason)) = rejected {
            run.status = RunStatus::Failed;
            run.finished_at = Some(run.started_at);
            run.error = Some(
                StepError::new(ErrorKind::Mapping, message)
                    .with_details(serde_json::json!({"at_submit": reason})),
            );
            progress.failed.fetch_add(1, Ordering::Relaxed);
        } else {
            progress.queued.fetch_add(1, Ordering::Relaxed);
        }
        chunk.push(run);
        if chunk.len() == SUBMIT_CHUNK {
            store.insert_submitted(&chunk).await?;
            chunk.clear();
        }
    }
    store.insert_submitted(&chunk).await?;
    if count < total {
        return Err(BatchError::Input {
            path,
            message: format!(
                "it ended after {count} of the {total} lines it had when submit began: it changed meanwhile"
            ),
        }
        .into());
    }
    store.complete_batch(&options.batch, total).await?;
    Ok(SubmittedBatch {
        complete: true,
        items: total,
        max_cost_usd: options.max_cost_usd.or(stored.max_cost_usd),
        ..stored
    })
}

/// `error.details.at_submit` of a line refused at submit because it is not JSON.
const AT_SUBMIT_JSON: &str = "json";
/// ... because it does not match the flow's `input.schema`.
const AT_SUBMIT_SCHEMA: &str = "schema";

/// Why run `r` was refused at submit ([`AT_SUBMIT_JSON`], [`AT_SUBMIT_SCHEMA`]), when it is the
/// record of such a line.
fn failed_at_submit(r: &RunRecord) -> Option<&str> {
    if r.steps != 0 || r.status != RunStatus::Failed {
        return None;
    }
    r.error
        .as_ref()
        .and_then(|e| e.details.as_ref())
        .and_then(|d| d.get("at_submit"))
        .and_then(Value::as_str)
}

/// The queued run of one line.
fn queued_run(plan: &Plan, options: &SubmitOptions, id: &str, index: u64, input: Value) -> RunRecord {
    let root = plan.root();
    RunRecord {
        id: record::new_run_id(),
        flow: root.name.clone(),
        flow_hash: root.hash.clone(),
        parent_run: None,
        parent_step: None,
        depth: 0,
        status: RunStatus::Queued,
        input,
        output: None,
        error: None,
        started_at: record::now_ms(),
        finished_at: None,
        started_ns: None,
        finished_ns: None,
        usage: Usage::default(),
        steps: 0,
        flow_path: None,
        context: options.context.clone(),
        messages: None,
        batch: Some(options.batch.clone()),
        item_id: Some(id.to_string()),
        item_index: Some(index),
        now_us: None,
        agent_changes: None,
        // Submitted by `switchyard submit`.
        origin: Some(record::Origin::Cli),
        files: Vec::new(),
    }
}
