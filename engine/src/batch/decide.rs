//! Per-line decisions: each line's latest run in the store, read a chunk at a time as the
//! input advances, decides what the line becomes: its run's line written as it is, the run
//! resumed, a new run started, or a failed line without a run. A line whose recorded run was of
//! another id or started from another input, and a batch whose unfinished runs started from
//! another flow or under other agent changes, are refused.

use std::collections::VecDeque;

use serde_json::Value;

use super::error::BatchError;
use super::input::Line;
use super::options::BatchOptions;
use super::output::record_line;
use crate::record::ErrorKind;
use crate::record::{RunRecord, RunStatus, Usage};
use crate::runtime::engine::RunOptions;
use crate::store::Store;

/// How many runs are read from the store at a time.
const CHUNK: usize = 1024;

/// The runs of a batch, read from the store a chunk at a time as the input advances.
pub(crate) struct Earlier {
    batch: String,
    /// Runs of item indices in `from..until`, in order.
    runs: VecDeque<RunRecord>,
    until: u64,
    fresh: bool,
    /// The root runs whose inbox items were answered (decided or expired, SPEC §15), read
    /// once at the first interrupted run: they are resumed, the answer applies.
    answered: Option<std::collections::HashSet<String>>,
}

impl Earlier {
    /// The runs of batch `batch`, none read yet.
    pub(crate) fn new(batch: String) -> Earlier {
        Earlier {
            batch,
            runs: VecDeque::new(),
            until: 0,
            fresh: false,
            answered: None,
        }
    }

    /// [`Earlier::new`], or none at all when the store is `fresh` (it holds nothing of
    /// earlier batches): nothing is read then.
    pub(super) fn with_fresh(batch: String, fresh: bool) -> Earlier {
        Earlier {
            fresh,
            ..Earlier::new(batch)
        }
    }

    /// The latest run of item `index` (indices are asked for in increasing order).
    pub(crate) async fn latest<S: Store>(
        &mut self,
        store: &S,
        index: u64,
    ) -> Result<Option<RunRecord>, BatchError> {
        if self.fresh {
            return Ok(None);
        }
        if index >= self.until {
            let mut limit = CHUNK;
            loop {
                let got = store.batch_runs(&self.batch, index, limit).await?;
                if got.len() < limit {
                    self.until = u64::MAX;
                    self.runs = got.into();
                    break;
                }
                // The last index may continue past the chunk: keep it for the next read.
                let last = got.last().and_then(|r| r.item_index).unwrap_or(index);
                if last > index {
                    self.until = last;
                    self.runs = got.into_iter().filter(|r| r.item_index < Some(last)).collect();
                    break;
                }
                limit *= 2;
            }
        }
        let mut latest = None;
        while let Some(r) = self.runs.front() {
            match r.item_index {
                Some(i) if i < index => {
                    self.runs.pop_front();
                }
                Some(i) if i == index => latest = self.runs.pop_front(),
                _ => break,
            }
        }
        Ok(latest)
    }
}

impl Earlier {
    /// Whether interrupted run `run_id` of the batch has an inbox item answered since it
    /// stopped (decided or expired): a batch run again resumes it.
    pub(crate) async fn answered<S: Store>(&mut self, store: &S, run_id: &str) -> Result<bool, BatchError> {
        if self.answered.is_none() {
            let mut roots = std::collections::HashSet::new();
            for state in [
                crate::record::inbox::ItemState::Decided,
                crate::record::inbox::ItemState::Expired,
            ] {
                let q = crate::store::inbox::ItemQuery {
                    state: Some(state),
                    batch: Some(self.batch.clone()),
                    ..Default::default()
                };
                roots.extend(store.inbox().list(&q).await?.into_iter().map(|i| i.root_run));
            }
            self.answered = Some(roots);
        }
        Ok(self.answered.as_ref().is_some_and(|r| r.contains(run_id)))
    }
}

/// Refuses to continue a batch whose unfinished runs started from another version of the flow,
/// or under other agent changes than `run_options`' (a run resumed under other changes could
/// call an agent it started without); `--allow-changed` skips this.
pub(super) async fn refuse_changed<S: Store>(
    store: &S,
    batch: &str,
    root: &crate::plan::FlowPlan,
    run_options: &RunOptions,
) -> Result<(), BatchError> {
    let filter = crate::store::RunFilter {
        flow: Some(root.name.clone()),
        ..Default::default()
    };
    let unfinished: Vec<RunRecord> = store
        .unfinished_runs(&filter)
        .await?
        .into_iter()
        .filter(|r| r.batch.as_deref() == Some(batch))
        .collect();
    let changed: Vec<&RunRecord> = unfinished.iter().filter(|r| r.flow_hash != root.hash).collect();
    if let Some(first) = changed.first() {
        return Err(BatchError::FlowChanged {
            count: changed.len(),
            flow: root.name.clone(),
            first: first.id.clone(),
        });
    }
    let source = &run_options.agent_changes.source;
    let other: Vec<&RunRecord> = unfinished.iter().filter(|r| r.agent_changes != *source).collect();
    if let Some(first) = other.first() {
        return Err(BatchError::OtherAgentChanges {
            count: other.len(),
            first: first.id.clone(),
        });
    }
    Ok(())
}

/// What a line becomes.
pub(super) enum Action {
    /// Written from the store: (its status, the line, its tokens and cost).
    Write(RunStatus, String, Usage),
    /// A failed item without a run (not JSON, not matching `input.schema`).
    Fail(String),
    Start(Value),
    Resume(String),
}

/// What `line` becomes, from its latest run in the store (`previous`). A run recorded for
/// another id (the input changed, or `--id-field` is not the batch's), or one that started
/// from another input than the line holds now, is an error: the batch's output would not be
/// its input's.
pub(super) fn decide(
    line: &mut Line,
    previous: Option<RunRecord>,
    options: &BatchOptions,
    root: &crate::plan::FlowPlan,
    answered: bool,
) -> Result<Action, BatchError> {
    if let Some(prev) = &previous
        && prev.item_id.as_deref() != Some(line.id.as_str())
    {
        return Err(BatchError::InputChanged {
            path: options.input.display().to_string(),
            line: line.index + 1,
            recorded: prev.item_id.clone().unwrap_or_default(),
            now: line.id.clone(),
        });
    }
    if let Some(prev) = previous {
        let in_doubt = prev.error.as_ref().is_some_and(|e| e.kind == ErrorKind::InDoubt);
        // Reusing or continuing the recorded run is right only for the input it started from;
        // a new run (`--retry-failed`) takes the line as it is now.
        let same = matches!(&line.parsed, Ok(v) if *v == prev.input);
        match prev.status {
            RunStatus::Failed | RunStatus::Cancelled if options.retry_failed => {}
            _ if !same => {
                return Err(BatchError::InputContentChanged {
                    path: options.input.display().to_string(),
                    line: line.index + 1,
                    id: line.id.clone(),
                    run: prev.id,
                });
            }
            RunStatus::Running => return Ok(Action::Resume(prev.id)),
            RunStatus::Interrupted if in_doubt && options.retry_in_doubt => {
                return Ok(Action::Resume(prev.id));
            }
            // Its question was answered in the inbox: the answer applies now.
            RunStatus::Interrupted if answered => return Ok(Action::Resume(prev.id)),
            status => {
                let text = record_line(&prev, &line.id_value);
                return Ok(Action::Write(status, text, prev.usage));
            }
        }
    }
    // The line's value moves into the run.
    let input = match std::mem::replace(&mut line.parsed, Ok(Value::Null)) {
        Ok(v) => v,
        Err(e) => return Ok(Action::Fail(e)),
    };
    if let Some(schema) = &root.input_schema
        && let Err(v) = schema.check(&input)
    {
        return Ok(Action::Fail(format!(
            "line {}: the input does not match `input.schema` {v}",
            line.index + 1
        )));
    }
    Ok(Action::Start(input))
}
