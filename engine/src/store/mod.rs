//! Stores keep run and step records behind one trait: memory now; SQLite and PostgreSQL
//! share the same record shapes. Only this module defines on-disk formats.

pub mod memory;

use std::future::Future;

use crate::runtime::record::{RunRecord, RunStatus, StepRecord};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("run `{0}` not found")]
    NotFound(String),
    #[error("store: {0}")]
    Other(String),
}

/// Filters for listing runs.
#[derive(Clone, Debug, Default)]
pub struct RunFilter {
    pub status: Option<RunStatus>,
    pub flow: Option<String>,
    pub limit: Option<usize>,
}

/// Where run and step records go. Every method commits before it returns: the engine moves
/// on only after a step's record is stored.
pub trait Store: Send + Sync + 'static {
    fn create_run(&self, run: &RunRecord) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn update_run(&self, run: &RunRecord) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Inserts or replaces the record of (run, number, attempt).
    fn record_step(&self, step: &StepRecord) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn get_run(&self, id: &str) -> impl Future<Output = Result<RunRecord, StoreError>> + Send;
    fn list_runs(&self, filter: &RunFilter) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send;
    /// The run's step records in the order they were recorded.
    fn steps(&self, run_id: &str) -> impl Future<Output = Result<Vec<StepRecord>, StoreError>> + Send;
    /// Runs whose parent is `run_id`.
    fn children(&self, run_id: &str) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send;
}
