//! The store a command line names with `--store`: `memory`, `sqlite:PATH` (the default,
//! `sqlite:.switchyard/runs.db`) or `postgres://...`, behind the one [`Store`] trait.

use super::memory::MemoryStore;
use super::sql::SqlStore;
use super::{RunFilter, Store, StoreError};
use crate::runtime::record::{RunRecord, StepRecord};

/// The default store URL: a SQLite file under the working directory.
pub const DEFAULT_STORE: &str = "sqlite:.switchyard/runs.db";

pub enum AnyStore {
    Memory(MemoryStore),
    Sql(SqlStore),
}

impl AnyStore {
    /// Opens the store at `url` (`memory` for a throwaway one).
    pub async fn open(url: &str) -> Result<AnyStore, StoreError> {
        if url == "memory" {
            return Ok(AnyStore::Memory(MemoryStore::new()));
        }
        Ok(AnyStore::Sql(SqlStore::open(url).await?))
    }

    /// [`AnyStore::open`] for a batch: a memory store drops each run's records once it ends,
    /// so memory does not grow with the input.
    pub async fn open_for_batch(url: &str) -> Result<AnyStore, StoreError> {
        if url == "memory" {
            return Ok(AnyStore::Memory(MemoryStore::forgetting_ended()));
        }
        Self::open(url).await
    }

    /// Whether records outlive the process.
    pub fn is_durable(&self) -> bool {
        matches!(self, AnyStore::Sql(_))
    }

    /// Waits for queued writes and closes the store.
    pub async fn close(self) {
        if let AnyStore::Sql(s) = self {
            s.close().await;
        }
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            AnyStore::Memory($s) => $e,
            AnyStore::Sql($s) => $e,
        }
    };
}

impl Store for AnyStore {
    async fn create_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        delegate!(self, s => s.create_run(run).await)
    }

    async fn update_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        delegate!(self, s => s.update_run(run).await)
    }

    async fn record_step(&self, step: StepRecord) -> Result<(), StoreError> {
        delegate!(self, s => s.record_step(step).await)
    }

    async fn queue_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        delegate!(self, s => s.queue_run(run).await)
    }

    async fn queue_step(&self, step: StepRecord) -> Result<(), StoreError> {
        delegate!(self, s => s.queue_step(step).await)
    }

    async fn get_run(&self, id: &str) -> Result<RunRecord, StoreError> {
        delegate!(self, s => s.get_run(id).await)
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        delegate!(self, s => s.list_runs(filter).await)
    }

    async fn unfinished_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        delegate!(self, s => s.unfinished_runs(filter).await)
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        delegate!(self, s => s.steps(run_id).await)
    }

    async fn children(&self, run_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        delegate!(self, s => s.children(run_id).await)
    }

    async fn batch_runs(&self, batch: &str, from: u64, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        delegate!(self, s => s.batch_runs(batch, from, limit).await)
    }
}
