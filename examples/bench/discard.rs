//! A store that keeps nothing, for breakdowns only: running a workload against it as well as
//! against the memory store shows how much of the time is the store's (copying each record
//! under its lock) and how much the engine's. Never used for a reported number.

use switchyard::__private::record::{RunRecord, StepRecord};
use switchyard::__private::store::{RunFilter, Store, StoreError, Writer};

#[derive(Debug, Default)]
pub struct DiscardStore;

impl Store for DiscardStore {
    fn blobs(&self) -> std::sync::Arc<dyn switchyard::__private::store::blobs::Blobs> {
        static BLOBS: std::sync::OnceLock<std::sync::Arc<switchyard::__private::store::blobs::MemoryBlobs>> =
            std::sync::OnceLock::new();
        BLOBS.get_or_init(Default::default).clone()
    }
    fn inbox(&self) -> std::sync::Arc<dyn switchyard::__private::store::inbox::Inbox> {
        static INBOX: std::sync::OnceLock<std::sync::Arc<switchyard::__private::store::inbox::MemoryInbox>> =
            std::sync::OnceLock::new();
        INBOX.get_or_init(Default::default).clone()
    }

    async fn create_run(&self, _run: &RunRecord) -> Result<(), StoreError> {
        Ok(())
    }

    async fn update_run(&self, _run: &RunRecord) -> Result<(), StoreError> {
        Ok(())
    }

    async fn record_step(&self, _step: StepRecord) -> Result<(), StoreError> {
        Ok(())
    }

    async fn get_run(&self, id: &str) -> Result<RunRecord, StoreError> {
        Err(StoreError::NotFound(id.to_string()))
    }

    async fn list_runs(&self, _filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        Ok(Vec::new())
    }

    async fn unfinished_runs(&self, _filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        Ok(Vec::new())
    }

    async fn steps(&self, _run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        Ok(Vec::new())
    }

    async fn children(&self, _run_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        Ok(Vec::new())
    }

    async fn batch_runs(
        &self,
        _batch: &str,
        _from: u64,
        _limit: usize,
    ) -> Result<Vec<RunRecord>, StoreError> {
        Ok(Vec::new())
    }

    // Nothing is kept, so nothing is held: every take succeeds.
    async fn take_run(
        &self,
        _run_id: &str,
        _writer: &Writer,
        _lease: std::time::Duration,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    async fn renew_run(
        &self,
        _run_id: &str,
        _writer: &Writer,
        _lease: std::time::Duration,
    ) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn give_back_run(&self, _run_id: &str, _writer: &Writer) -> Result<(), StoreError> {
        Ok(())
    }
}
