//! The memory store: records live in the process and die with it (`--store memory`).

use std::collections::HashMap;
use std::sync::Mutex;

use super::{RunFilter, Store, StoreError};
use crate::runtime::record::{RunRecord, RunStatus, StepRecord};

#[derive(Default, Debug)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    /// Drop the records of runs that ended (a batch on `--store memory` reads none back, and
    /// its memory must not grow with its input).
    forget_ended: bool,
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

    /// A store that drops the records of each run (and its steps) once the run ends:
    /// succeeded, failed or cancelled. Interrupted and running runs are kept.
    pub fn forgetting_ended() -> Self {
        MemoryStore {
            forget_ended: true,
            ..Self::default()
        }
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
                // A run's identity, input and context never change: copy only what can.
                if r.input != run.input
                    || r.flow_hash != run.flow_hash
                    || r.batch != run.batch
                    || r.context != run.context
                {
                    *r = run.clone();
                } else {
                    r.status = run.status;
                    r.output.clone_from(&run.output);
                    r.error.clone_from(&run.error);
                    r.finished_at = run.finished_at;
                    r.usage = run.usage;
                    r.steps = run.steps;
                }
                let ended = matches!(
                    run.status,
                    RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled
                );
                if self.forget_ended && ended {
                    g.runs.remove(&run.id);
                    g.steps.remove(&run.id);
                    // `order` keeps ids in start order; forgotten ones are skipped when read
                    // and swept out once they are most of it.
                    if g.order.len() > 1024 && g.order.len() > 2 * g.runs.len() {
                        let Inner { runs, order, .. } = &mut *g;
                        order.retain(|id| runs.contains_key(id));
                    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::record::Usage;

    fn run(id: &str, status: RunStatus) -> RunRecord {
        RunRecord {
            id: id.into(),
            flow: "f".into(),
            flow_hash: "h".into(),
            parent_run: None,
            parent_step: None,
            depth: 0,
            status,
            input: serde_json::json!({"n": 1}),
            output: None,
            error: None,
            started_at: 1,
            finished_at: None,
            usage: Usage::default(),
            steps: 0,
            context: serde_json::Value::Null,
            batch: None,
            item_id: None,
            item_index: None,
            flow_path: None,
            messages: None,
        }
    }

    #[tokio::test]
    async fn a_forgetting_store_drops_runs_that_ended_and_keeps_the_others() {
        let store = MemoryStore::forgetting_ended();
        for i in 0..3000 {
            let id = format!("r{i}");
            store.create_run(&run(&id, RunStatus::Running)).await.unwrap();
            let status = match i % 3 {
                0 => RunStatus::Succeeded,
                1 => RunStatus::Failed,
                _ => RunStatus::Interrupted,
            };
            store.update_run(&run(&id, status)).await.unwrap();
        }
        let kept = store.list_runs(&RunFilter::default()).await.unwrap();
        assert_eq!(kept.len(), 1000);
        assert!(kept.iter().all(|r| r.status == RunStatus::Interrupted));
        assert!(matches!(store.get_run("r0").await, Err(StoreError::NotFound(_))));
        // Ids of forgotten runs do not pile up.
        assert!(store.lock().order.len() < 2100, "{}", store.lock().order.len());
        // The plain memory store keeps everything.
        let keeping = MemoryStore::new();
        keeping.create_run(&run("a", RunStatus::Running)).await.unwrap();
        keeping.update_run(&run("a", RunStatus::Succeeded)).await.unwrap();
        assert_eq!(keeping.get_run("a").await.unwrap().status, RunStatus::Succeeded);
    }
}
