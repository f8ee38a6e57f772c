//! The store a command line names with `--store`: `memory`, `sqlite:PATH` (the default,
//! `sqlite:.switchyard/runs.db`) or `postgres://...`, behind the one [`Store`] trait.

use super::memory::MemoryStore;
use super::sql::SqlStore;
use super::{RunFilter, Store, StoreError, Writer};
use crate::record::{RunRecord, StepRecord};

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

    /// [`AnyStore::open`] only to read: a SQLite file is opened read-only, so a store this
    /// process may not write can still be read ([`super::sql::SqlOptions::read_only`]).
    pub async fn open_read_only(url: &str) -> Result<AnyStore, StoreError> {
        if url == "memory" {
            return Ok(AnyStore::Memory(MemoryStore::new()));
        }
        let options = super::sql::SqlOptions {
            read_only: true,
            ..Default::default()
        };
        Ok(AnyStore::Sql(SqlStore::open_with(url, options).await?))
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

/// Calls the same method on either store. The SQL store's futures (a channel send to its
/// writer, sqlx queries) are boxed: they are kilobytes, and every engine future that awaits a
/// store write would otherwise carry that much for every run in flight, whichever store it uses.
macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            AnyStore::Memory($s) => $e.await,
            AnyStore::Sql($s) => Box::pin($e).await,
        }
    };
}

impl Store for AnyStore {
    fn blobs(&self) -> std::sync::Arc<dyn super::blobs::Blobs> {
        match self {
            AnyStore::Memory(s) => s.blobs(),
            AnyStore::Sql(s) => s.blobs(),
        }
    }

    fn inbox(&self) -> std::sync::Arc<dyn super::inbox::Inbox> {
        match self {
            AnyStore::Memory(s) => s.inbox(),
            AnyStore::Sql(s) => s.inbox(),
        }
    }

    fn keeps_steps(&self) -> bool {
        match self {
            AnyStore::Memory(s) => s.keeps_steps(),
            AnyStore::Sql(s) => s.keeps_steps(),
        }
    }

    async fn create_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        delegate!(self, s => s.create_run(run))
    }

    async fn update_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        delegate!(self, s => s.update_run(run))
    }

    async fn record_step(&self, step: StepRecord) -> Result<(), StoreError> {
        delegate!(self, s => s.record_step(step))
    }

    async fn queue_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        delegate!(self, s => s.queue_run(run))
    }

    async fn queue_step(&self, step: StepRecord) -> Result<(), StoreError> {
        delegate!(self, s => s.queue_step(step))
    }

    async fn flush(&self, run_id: &str) -> Result<(), StoreError> {
        delegate!(self, s => s.flush(run_id))
    }

    async fn get_run(&self, id: &str) -> Result<RunRecord, StoreError> {
        delegate!(self, s => s.get_run(id))
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        delegate!(self, s => s.list_runs(filter))
    }

    async fn unfinished_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        delegate!(self, s => s.unfinished_runs(filter))
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        delegate!(self, s => s.steps(run_id))
    }

    async fn children(&self, run_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        delegate!(self, s => s.children(run_id))
    }

    async fn batch_runs(&self, batch: &str, from: u64, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        delegate!(self, s => s.batch_runs(batch, from, limit))
    }

    async fn take_run(
        &self,
        run_id: &str,
        writer: &Writer,
        lease: std::time::Duration,
    ) -> Result<(), StoreError> {
        delegate!(self, s => s.take_run(run_id, writer, lease))
    }

    async fn renew_run(
        &self,
        run_id: &str,
        writer: &Writer,
        lease: std::time::Duration,
    ) -> Result<bool, StoreError> {
        delegate!(self, s => s.renew_run(run_id, writer, lease))
    }

    async fn give_back_run(&self, run_id: &str, writer: &Writer) -> Result<(), StoreError> {
        delegate!(self, s => s.give_back_run(run_id, writer))
    }
}
