//! Stores keep run and step records behind one trait: [`memory`] for throwaway runs, [`sql`]
//! for SQLite (the default) and PostgreSQL, which share one schema. Only this module defines
//! on-disk formats, and they are versioned ([`sql::schema`]).

pub mod any;
pub mod blobs;
pub mod inbox;
pub mod memory;
pub mod sql;
pub mod writers;

use std::future::Future;
use std::time::Duration;

use crate::record::{RunRecord, RunStatus, StepRecord};
pub use writers::Writer;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("run `{0}` not found")]
    NotFound(String),
    #[error("store: {0}")]
    Other(String),
    #[error("bad store URL `{url}`: {message}")]
    BadUrl { url: String, message: String },
    #[error("cannot open the store {store}: {message}")]
    Open { store: String, message: String },
    /// The store's schema is newer than this build knows; nothing was written to it.
    #[error(
        "the store at {store} was written by a newer switchyard (schema {found}; this one knows up to {supported})"
    )]
    NewerSchema {
        store: String,
        found: i64,
        supported: i64,
    },
    /// The transaction was rolled back: what it held is not recorded, what was committed
    /// before is intact.
    #[error(
        "the disk holding the store {store} is full while {what}: nothing from there on was recorded; \
         what was recorded before is intact"
    )]
    DiskFull { store: String, what: String },
    /// Another process held a lock longer than the busy timeout.
    #[error("the store {store} is locked by another process: gave up {what} after waiting {waited_ms} ms")]
    Locked {
        store: String,
        what: String,
        waited_ms: u64,
    },
    #[error("store {store}: {what}: {message}")]
    Database {
        store: String,
        what: String,
        message: String,
    },
    #[error("the store {store} is closed")]
    Closed { store: String },
    /// A write of a submitted run whose lease this worker no longer holds (another worker
    /// took the run over, or it was cancelled): nothing of it was written (SPEC §12 fencing).
    #[error(
        "run `{run}` is no longer this worker's (its lease was taken over, or the run was cancelled): \
         nothing more of it is written here"
    )]
    LeaseLost { run: String },
    /// Another live process advances the run (SPEC §7.3, one writer per run).
    #[error("run `{run}` is being run by another process (pid {pid}, host {host})")]
    Held { run: String, pid: u32, host: String },
}

/// Filters for listing runs.
#[derive(Clone, Debug, Default)]
pub struct RunFilter {
    pub status: Option<RunStatus>,
    pub flow: Option<String>,
    pub limit: Option<usize>,
    /// Only root runs (no parent run).
    pub roots_only: bool,
    /// Only runs of a batch with one of these names (any run when empty).
    pub batches: Vec<String>,
}

/// Where run and step records go. A write commits before it returns, unless it is queued
/// ([`Store::queue_step`]): a queued write commits with the next awaited write or
/// [`Store::flush`], in order.
pub trait Store: Send + Sync + 'static {
    /// Stores a new run, or replaces the record of an existing one.
    fn create_run(&self, run: &RunRecord) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Replaces the record of an existing run; [`StoreError::NotFound`] if there is none.
    fn update_run(&self, run: &RunRecord) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Inserts or replaces the record of (run, number, attempt, iteration): an attempt's
    /// `started` record is replaced by its outcome, keeping its place in record order.
    /// Takes the record: a store keeps it or encodes it without copying.
    fn record_step(&self, step: StepRecord) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// [`Store::create_run`] without waiting for the commit: the write is queued before this
    /// store's later writes, so the next write that is waited for commits it too, or fails
    /// (and with it every later write of the run). For a record that the next awaited write
    /// of the same run follows anyway.
    fn queue_run(&self, run: &RunRecord) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.create_run(run)
    }
    /// Whether step records are kept. A store that keeps none (a batch's throwaway memory
    /// store) lets the engine skip building them.
    fn keeps_steps(&self) -> bool {
        true
    }
    /// [`Store::record_step`] without waiting for the commit, as [`Store::queue_run`].
    fn queue_step(&self, step: StepRecord) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.record_step(step)
    }
    /// Waits until every write queued before it is committed: the barrier before an effect
    /// that no awaited write precedes. Fails as the next awaited write of run `run_id` would:
    /// an earlier queued write of the run failed, or (a submitted run) its lease was lost.
    fn flush(&self, run_id: &str) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = run_id;
        async { Ok(()) }
    }
    fn get_run(&self, id: &str) -> impl Future<Output = Result<RunRecord, StoreError>> + Send;
    /// Runs matching `filter`, newest first.
    fn list_runs(
        &self,
        filter: &RunFilter,
    ) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send;
    /// Runs still `running` — after a crash, the ones to resume — oldest first. `filter.flow`
    /// and `filter.limit` apply; `filter.status` is ignored.
    fn unfinished_runs(
        &self,
        filter: &RunFilter,
    ) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send;
    /// The run's step records in the order they were first recorded (a replaced record keeps
    /// its place), so the last element is the step the run reached last.
    fn steps(&self, run_id: &str) -> impl Future<Output = Result<Vec<StepRecord>, StoreError>> + Send;
    /// Of [`Store::steps`], only the latest attempt of each (number, iteration), in record
    /// order: what resume reads to tell finished steps (reuse their results) from attempts
    /// that `started` and never finished (retry if idempotent, else `in_doubt`).
    fn latest_steps(&self, run_id: &str) -> impl Future<Output = Result<Vec<StepRecord>, StoreError>> + Send {
        async move { Ok(latest_attempts(self.steps(run_id).await?)) }
    }
    /// Runs whose parent is `run_id`, oldest first.
    fn children(&self, run_id: &str) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send;
    /// The runs of `batch` whose item index is at least `from`, by item index and then start
    /// (an item run again comes after its earlier runs), at most `limit` of them.
    fn batch_runs(
        &self,
        batch: &str,
        from: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send;
    /// Takes run `run_id` for `writer` under a lease of `lease` (SPEC §7.3, one writer per
    /// run): in one atomic step, the run is `writer`'s if no one holds it, its holder's lease
    /// lapsed, or its holder's process is verifiably gone ([`Writer::is_gone`]); else
    /// [`StoreError::Held`] names the holder. The run need not be recorded yet.
    fn take_run(
        &self,
        run_id: &str,
        writer: &Writer,
        lease: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Extends `writer`'s lease on `run_id` to `lease` from now; false when the run is no
    /// longer `writer`'s (its lease lapsed and another process took it).
    fn renew_run(
        &self,
        run_id: &str,
        writer: &Writer,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// The bytes of the files its records refer to (SPEC §6.5), kept beside them.
    fn blobs(&self) -> std::sync::Arc<dyn blobs::Blobs>;
    /// The questions runs wait at and the decisions that answer them (SPEC §15).
    fn inbox(&self) -> std::sync::Arc<dyn inbox::Inbox>;
    /// Gives `run_id` back, if `writer` holds it.
    fn give_back_run(
        &self,
        run_id: &str,
        writer: &Writer,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Keeps the latest attempt of each (number, iteration) of records in record order.
pub fn latest_attempts(steps: Vec<StepRecord>) -> Vec<StepRecord> {
    let mut latest: std::collections::HashMap<(String, Option<u64>), usize> = Default::default();
    for (i, s) in steps.iter().enumerate() {
        let slot = latest.entry((s.number.clone(), s.iteration)).or_insert(i);
        if steps[*slot].attempt <= s.attempt {
            *slot = i;
        }
    }
    let mut keep = vec![false; steps.len()];
    for i in latest.into_values() {
        keep[i] = true;
    }
    steps
        .into_iter()
        .zip(keep)
        .filter_map(|(s, k)| k.then_some(s))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::record::{StepStatus, Usage};

    /// A root run record `id` in `status`, of flow `f` (tests of the stores and workers).
    pub(crate) fn run(id: &str, status: RunStatus) -> RunRecord {
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
            started_ns: None,
            finished_ns: None,
            usage: Usage::default(),
            steps: 0,
            context: serde_json::Value::Null,
            batch: None,
            item_id: None,
            item_index: None,
            flow_path: None,
            messages: None,
            now_us: None,
            agent_changes: None,
            origin: None,
            files: Vec::new(),
        }
    }

    /// A step record of run `r` (tests of the stores).
    pub(crate) fn step(number: &str, attempt: u32, iteration: Option<u64>, status: StepStatus) -> StepRecord {
        StepRecord {
            run_id: "r".into(),
            number: number.into(),
            step: format!("s{number}"),
            kind: "agent".into(),
            attempt,
            status,
            iteration,
            iterations: None,
            input: None,
            result: None,
            changes: vec![],
            violations: vec![],
            error: None,
            started_at: 1,
            finished_at: None,
            started_ns: None,
            finished_ns: None,
            usage: Usage::default(),
            child_run: None,
            route: None,
            answers: None,
            files: Vec::new(),
        }
    }

    #[test]
    fn latest_attempts_keep_record_order() {
        use StepStatus::*;
        let all = vec![
            step("1", 1, None, Succeeded),
            step("2", 1, None, Failed),
            step("2", 2, None, Failed),
            step("3", 1, Some(0), Succeeded),
            step("3", 1, Some(1), Started),
            step("2", 3, None, Started),
        ];
        let got: Vec<(String, u32, Option<u64>)> = latest_attempts(all)
            .into_iter()
            .map(|s| (s.number, s.attempt, s.iteration))
            .collect();
        assert_eq!(
            got,
            [
                ("1".into(), 1, None),
                ("3".into(), 1, Some(0)),
                ("3".into(), 1, Some(1)),
                ("2".into(), 3, None)
            ]
        );
    }
}
