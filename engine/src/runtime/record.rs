//! Run and step records (SPEC §7.1): what the store keeps of every run and every step.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::StepError;
use super::data::{Change, Violation};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
    Interrupted,
    Cancelled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Interrupted => "interrupted",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<RunStatus> {
        Some(match s {
            "running" => RunStatus::Running,
            "succeeded" => RunStatus::Succeeded,
            "failed" => RunStatus::Failed,
            "interrupted" => RunStatus::Interrupted,
            "cancelled" => RunStatus::Cancelled,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// An attempt of a call with effects started and has not finished (SPEC §7.3).
    Started,
    Succeeded,
    Failed,
    Interrupted,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Started => "started",
            StepStatus::Succeeded => "succeeded",
            StepStatus::Failed => "failed",
            StepStatus::Interrupted => "interrupted",
        }
    }
}

/// Tokens and cost, rolled up step → run → parent run → batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
}

impl Usage {
    pub fn add(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd += other.cost_usd;
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: String,
    pub flow: String,
    /// Content hash of the flow file.
    pub flow_hash: String,
    pub parent_run: Option<String>,
    /// The number of the step in the parent run that started this run.
    pub parent_step: Option<String>,
    pub depth: u32,
    pub status: RunStatus,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<StepError>,
    /// Unix milliseconds.
    pub started_at: u64,
    pub finished_at: Option<u64>,
    pub usage: Usage,
    /// Steps executed (iterations included).
    pub steps: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub run_id: String,
    /// Hierarchical number: `3` is the third step executed in this run; iterations carry
    /// `iteration`; a child run's steps are numbered under the calling step (`1.3`).
    pub number: String,
    pub step: String,
    /// `agent`, `foreach`, `while`, `set`, `parallel`, `interrupt`, `fail`, `succeed`.
    pub kind: String,
    pub attempt: u32,
    pub status: StepStatus,
    /// Foreach item index or while iteration, for iteration records.
    pub iteration: Option<u64>,
    /// Iterations run by a `foreach` or `while` step.
    pub iterations: Option<u64>,
    pub input: Option<Value>,
    pub result: Option<Value>,
    pub changes: Vec<Change>,
    pub violations: Vec<Violation>,
    pub error: Option<StepError>,
    pub started_at: u64,
    pub finished_at: Option<u64>,
    pub usage: Usage,
    pub child_run: Option<String>,
    /// The step the run went to next (`end` for the end), when routed.
    pub route: Option<String>,
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A new run id: time-ordered and unique within a process and across processes.
pub fn new_run_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "r{:011x}{:05x}{:04x}{:x}",
        now_ms(),
        pid & 0xfffff,
        nanos & 0xffff,
        n
    )
}
