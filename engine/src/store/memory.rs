//! The memory store: records live in the process and die with it (`--store memory`).

use std::collections::HashMap;
use std::sync::Mutex;

use super::{RunFilter, Store, StoreError};
use crate::runtime::record::{RunRecord, RunStatus, StepRecord};

#[derive(Default, Debug)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Default, Debug)]
struct Inner {
    runs: HashMap<String, RunRecord>,
    order: Vec<String>,
    steps: HashMap<String, Vec<StepRecord>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Store for MemoryStore {
    async fn create_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        let mut g = self.lock();
        if g.runs.insert(run.id.clone(), run.clone()).is_none() {
            g.order.push(run.id.clone());
        }
        Ok(())
    }

    async fn update_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        let mut g = self.lock();
        match g.runs.get_mut(&run.id) {
            Some(r) => {
                // A run's identity and input never change: copy only what can.
                if r.input != run.input || r.flow_hash != run.flow_hash || r.batch != run.batch {
                    *r = run.clone();
                } else {
                    r.status = run.status;
                    r.output.clone_from(&run.output);
                    r.error.clone_from(&run.error);
                    r.finished_at = run.finished_at;
                    r.usage = run.usage;
                    r.steps = run.steps;
                    r.context.clone_from(&run.context);
                }
                Ok(())
            }
            None => Err(StoreError::NotFound(run.id.clone())),
        }
    }

    async fn record_step(&self, step: StepRecord) -> Result<(), StoreError> {
        let mut g = self.lock();
        // The run's list exists after its first step: no key allocated then.
        let steps = match g.steps.get_mut(&step.run_id) {
            Some(s) => s,
            None => g.steps.entry(step.run_id.clone()).or_default(),
        };
        // Replace the record of the same (number, attempt, iteration) — an attempt's
        // "started" record is superseded by its outcome.
        if let Some(last) =
            steps.iter_mut().rev().take(8).find(|s| {
                s.number == step.number && s.attempt == step.attempt && s.iteration == step.iteration
            })
        {
            *last = step;
        } else {
            steps.push(step);
        }
        Ok(())
    }

    async fn get_run(&self, id: &str) -> Result<RunRecord, StoreError> {
        self.lock()
            .runs
            .get(id)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(id.to_string()))
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let g = self.lock();
        let mut out: Vec<RunRecord> = g
            .order
            .iter()
            .rev()
            .filter_map(|id| g.runs.get(id))
            .filter(|r| filter.status.is_none_or(|s| r.status == s))
            .filter(|r| filter.flow.as_ref().is_none_or(|f| &r.flow == f))
            .cloned()
            .collect();
        if let Some(l) = filter.limit {
            out.truncate(l);
        }
        Ok(out)
    }

    async fn unfinished_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let g = self.lock();
        let mut out: Vec<RunRecord> = g
            .order
            .iter()
            .filter_map(|id| g.runs.get(id))
            .filter(|r| r.status == RunStatus::Running)
            .filter(|r| filter.flow.as_ref().is_none_or(|f| &r.flow == f))
            .cloned()
            .collect();
        if let Some(l) = filter.limit {
            out.truncate(l);
        }
        Ok(out)
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        Ok(self.lock().steps.get(run_id).cloned().unwrap_or_default())
    }

    async fn children(&self, run_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        let g = self.lock();
        Ok(g.order
            .iter()
            .filter_map(|id| g.runs.get(id))
            .filter(|r| r.parent_run.as_deref() == Some(run_id))
            .cloned()
            .collect())
    }

    async fn batch_runs(&self, batch: &str, from: u64, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let g = self.lock();
        // `order` is start order, so a stable sort by item index keeps an item's runs in it.
        let mut out: Vec<RunRecord> = g
            .order
            .iter()
            .filter_map(|id| g.runs.get(id))
            .filter(|r| r.batch.as_deref() == Some(batch) && r.item_index.is_some_and(|i| i >= from))
            .cloned()
            .collect();
        out.sort_by_key(|r| r.item_index);
        out.truncate(limit);
        Ok(out)
    }
}
