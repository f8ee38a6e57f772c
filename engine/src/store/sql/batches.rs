//! Submitted batches and the workers registered with a store, as `batches`, `collect` and
//! `runs list --batch` read them (SPEC §12).

use serde_json::Value;

/// A batch as `submit` recorded it (a row of `batches`).
#[derive(Clone, Debug, PartialEq)]
pub struct SubmittedBatch {
    pub name: String,
    /// The content hash of the flow bundle its runs run.
    pub bundle: String,
    /// The top flow's name and covering hash.
    pub flow: String,
    pub flow_hash: String,
    /// The input file as given to `submit`, made absolute (for messages).
    pub input: String,
    pub id_field: String,
    /// `--context` of the submit, every run's.
    pub context: Value,
    /// Takeovers from dead workers a run may have before it fails with kind `lost`.
    pub max_recoveries: u64,
    /// Lines of the input (blank ones included, as item indices count them).
    pub items: u64,
    /// Every line has its run: `submit` finished.
    pub complete: bool,
    /// Unix milliseconds.
    pub submitted_at: u64,
}

/// A worker registered with the store (a row of `workers`).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerRow {
    pub id: String,
    pub host: String,
    pub pid: u64,
    /// `--batch`: the only batch it claims from, if any.
    pub batch: Option<String>,
    pub concurrency: u64,
    pub lease_ms: u64,
    /// Unix milliseconds, the database's clock.
    pub started_at: u64,
    pub heartbeat_at: u64,
    /// Set when it stopped cleanly.
    pub stopped_at: Option<u64>,
}
