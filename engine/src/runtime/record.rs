//! Run and step records (SPEC §7.1): what the store keeps of every run and every step.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::StepError;
use super::cost::Cost;
use super::data::{Change, Violation};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Submitted to a store for workers (SPEC §12), not started yet.
    Queued,
    Running,
    Succeeded,
    Failed,
    Interrupted,
    Cancelled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Interrupted => "interrupted",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<RunStatus> {
        Some(match s {
            "queued" => RunStatus::Queued,
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
    /// Written as USD (`cost_usd` in JSON and the store), counted in nano-dollars.
    pub cost_usd: Cost,
    /// Model calls whose response reported no usage (SPEC §6.1): their cost is unknown, not
    /// in `cost_usd`. Written only when there are some.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cost_unknown_calls: u64,
}

pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    pub fn add(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd += other.cost_usd;
        self.cost_unknown_calls += other.cost_unknown_calls;
    }
}

/// What people read beside a cost whose `unknown` calls reported no usage: `""`, or
/// ` (cost unknown for N calls)`.
pub fn fmt_unknown(unknown: u64) -> String {
    match unknown {
        0 => String::new(),
        1 => " (cost unknown for 1 call)".to_string(),
        n => format!(" (cost unknown for {n} calls)"),
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: String,
    pub flow: String,
    /// Content hash of the flow file and of every file it imports or calls (`FlowPlan::hash`).
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
    /// The flow file of a root run, as given, made absolute: what `resume` loads again.
    #[serde(default)]
    pub flow_path: Option<String>,
    /// The caller-given context (`--context`), kept so that a resumed run sees the same.
    #[serde(default)]
    pub context: Value,
    /// The run's conversation (`--messages`), kept so that a resumed run sees the same.
    #[serde(default)]
    pub messages: Option<Value>,
    /// For a run of a batch item: the batch, the item's id and its 0-based line index.
    #[serde(default)]
    pub batch: Option<String>,
    #[serde(default)]
    pub item_id: Option<String>,
    #[serde(default)]
    pub item_index: Option<u64>,
    /// The run tree's `now` (SPEC §5.1), in Unix microseconds: taken at the root's first start
    /// and kept by every run of the tree, so a resumed run sees the same. `None` on runs
    /// recorded before schema 5 (a resume takes `started_at` then).
    #[serde(default)]
    pub now_us: Option<i64>,
    /// The agent changes a root run started with (`--agent-change`, SPEC §8.4), as the
    /// canonical JSON of the change file, so that a resumed run applies them again without the
    /// file. `None`: no changes (and every run recorded before schema 9).
    #[serde(default)]
    pub agent_changes: Option<Value>,
}

impl RunRecord {
    /// Whether the run was paused (Ctrl-C) at a recorded point: still `running`, with the
    /// pause as its error, and nothing running it until it is resumed.
    pub fn paused(&self) -> bool {
        self.status == RunStatus::Running
            && self
                .error
                .as_ref()
                .is_some_and(|e| e.kind == crate::runtime::ErrorKind::Cancelled)
    }
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
    /// Shared with the run's `steps.<id>`, which keeps the same result: never copied.
    pub result: Option<Arc<Value>>,
    pub changes: Vec<Change>,
    pub violations: Vec<Violation>,
    pub error: Option<StepError>,
    pub started_at: u64,
    pub finished_at: Option<u64>,
    pub usage: Usage,
    pub child_run: Option<String>,
    /// The step the run went to next (`end` for the end), when routed.
    pub route: Option<String>,
    /// Of an `llm` step, what its calls noted (one object, over all its attempts):
    /// `structured_output` (the form used), `refused` (the form the server refused),
    /// `repairs` (of a call that succeeded after repairs: `[{answer, repair_request}]`; a call
    /// that failed keeps them in its error's details instead) and `abandoned_requests`
    /// (requests whose tokens are unknown). Records written before held only the list of
    /// repairs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answers: Option<Value>,
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A new run id: time-ordered and unique within a process and across processes:
/// `r`, then in hex the Unix milliseconds (11 digits), the process id (5), the low bits of the
/// nanoseconds (4) and a per-process counter (as many digits as it needs).
pub fn new_run_id() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // A system call each time otherwise; the engine never forks (agents `exec`).
    static PID: OnceLock<u32> = OnceLock::new();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let pid = *PID.get_or_init(std::process::id);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut id = String::with_capacity(40);
    id.push('r');
    push_hex(&mut id, now.as_millis() as u64, 11);
    push_hex(&mut id, u64::from(pid & 0xfffff), 5);
    push_hex(&mut id, u64::from(now.subsec_nanos() & 0xffff), 4);
    push_hex(&mut id, n, 1);
    id
}

/// Appends `v` in lower-case hex, zero-padded to at least `width` digits (as `{:0width$x}`).
fn push_hex(s: &mut String, v: u64, width: usize) {
    let digits = ((64 - v.leading_zeros() as usize).div_ceil(4)).max(width).max(1);
    for i in (0..digits).rev() {
        let d = if i >= 16 { 0 } else { (v >> (4 * i)) & 0xf };
        s.push(char::from_digit(d as u32, 16).expect("a hex digit"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_zero_padded_like_format() {
        for (v, w) in [
            (0u64, 1),
            (0, 4),
            (0xabc, 2),
            (0xabc, 5),
            (u64::MAX, 11),
            (1 << 40, 11),
        ] {
            let mut s = String::new();
            push_hex(&mut s, v, w);
            assert_eq!(s, format!("{v:0w$x}"), "{v} {w}");
        }
    }

    #[test]
    fn run_ids_are_unique_and_shaped() {
        let a = new_run_id();
        let b = new_run_id();
        assert_ne!(a, b);
        assert!(a.starts_with('r') && a.len() >= 22, "{a}");
        assert!(a[1..].chars().all(|c| c.is_ascii_hexdigit()), "{a}");
    }
}
