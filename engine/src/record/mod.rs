//! Run and step records (SPEC §7.1): what the store keeps of every run and every step, and
//! the types every layer above shares through them: a step's error and its kind ([`error`]),
//! token usage and money ([`Usage`], [`cost`]), the payload changes and allowlist violations a
//! step records. Data only: it uses no other module of the crate, so the store, the agents,
//! the model and the project read and write records without knowing the runtime that makes
//! them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod cost;
pub mod error;
pub mod files;
pub mod inbox;

pub use cost::Cost;
pub use error::{ErrorKind, StepError};
pub use files::{FileRef, RunFile};

/// Something an agent returned outside its output allowlist, dropped (SPEC §5.3). `path` is a
/// path in the result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub path: String,
    pub reason: String,
}

/// One write to the payload, for records. `path` is the destination in the payload (with the
/// scope, if any, in front). A write replaces the value at `path` with `value`, except for the
/// deep merges of `output: "*"` and output allowlists, where `value` is what was merged at
/// `path` (objects merge recursively, everything else replaces).
///
/// A write of a whole result (`output: "*"`, or a map from `$`) shares `value` with the step's
/// result rather than copying it again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub path: String,
    pub value: Arc<Value>,
}

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
    /// `started_at` and `finished_at` to the nanosecond, as the engine took them ([`Stamp`]),
    /// on the records it hands its observer (OpenTelemetry spans, SPEC §13). Not written to a
    /// SQL store, which keeps milliseconds: a record read back from one has none.
    #[serde(skip)]
    pub started_ns: Option<u64>,
    #[serde(skip)]
    pub finished_ns: Option<u64>,
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
    /// What started the run tree (`switchyard` commands, an MCP client, the library), kept by
    /// every run of the tree. `None` on runs recorded before schema 10.
    #[serde(default)]
    pub origin: Option<Origin>,
    /// The files its steps, iterations, branches, tool calls and child runs made (SPEC §6.5),
    /// by record number; empty for runs recorded before schema 11.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<RunFile>,
}

/// What started a run tree: `runs list --json` shows it as `origin`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// An application through the library's API (`Switchyard::run`).
    #[default]
    Api,
    /// A `switchyard` command: `run`, `batch`, `submit`, `test`.
    Cli,
    /// A tool call of an MCP client (`switchyard mcp serve`).
    Mcp,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Api => "api",
            Origin::Cli => "cli",
            Origin::Mcp => "mcp",
        }
    }

    /// The origin a store's text names; `None` for text no origin has.
    pub fn parse(text: &str) -> Option<Origin> {
        match text {
            "api" => Some(Origin::Api),
            "cli" => Some(Origin::Cli),
            "mcp" => Some(Origin::Mcp),
            _ => None,
        }
    }
}

impl RunRecord {
    /// Whether the run was paused (Ctrl-C) at a recorded point: still `running`, with the
    /// pause as its error, and nothing running it until it is resumed.
    pub fn paused(&self) -> bool {
        self.status == RunStatus::Running
            && self
                .error
                .as_ref()
                .is_some_and(|e| e.kind == ErrorKind::Cancelled)
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
    /// Unix milliseconds.
    pub started_at: u64,
    pub finished_at: Option<u64>,
    /// `started_at` and `finished_at` to the nanosecond, as [`RunRecord::started_ns`].
    #[serde(skip)]
    pub started_ns: Option<u64>,
    #[serde(skip)]
    pub finished_ns: Option<u64>,
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
    /// The files this record's call made (SPEC §6.5): an agent's own, or a child run's,
    /// numbered in the tree (a `flow` step's). Iterations, branches and loop parts have
    /// records of their own for theirs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<RunFile>,
}

/// Where a step's parts hang, read from their records: a `foreach` or `while` iteration and a
/// `parallel` branch under their step, and an agent loop's turns, tool calls and approvals
/// (SPEC §6.3, numbered `3.t2`, `3.t2.1`, `3.t2.approval`) under the step, iteration or
/// branch whose loop they are. `runs show`, `--trace` and the run page order records by it.
impl StepRecord {
    /// An iteration or a branch.
    pub fn is_group(&self) -> bool {
        self.kind == "iteration" || self.kind == "branch"
    }

    /// A turn, tool call or approval of an agent loop.
    pub fn is_loop_part(&self) -> bool {
        matches!(self.kind.as_str(), "turn" | "tool" | "approval")
    }

    /// The number the record goes by, and its loop's parts are numbered under: an
    /// iteration's `3[2]`, any other's own number.
    pub fn key(&self) -> String {
        match (self.kind.as_str(), self.iteration) {
            ("iteration", Some(i)) => format!("{}[{i}]", self.number),
            _ => self.number.clone(),
        }
    }

    /// Whether this iteration or branch belongs to the step numbered `number`.
    pub fn is_group_of(&self, number: &str) -> bool {
        self.is_group()
            && (self.number == number
                || self
                    .number
                    .strip_prefix(number)
                    .is_some_and(|r| r.starts_with('.')))
    }
}

/// Where a loop part's number splits: `(owner, turn, rest)` for `3.t2.1` is
/// `("3", 2, ".1")`; the last `.t<k>` segment is the loop's (a flow tool's child run numbers
/// its own steps, and their loops, below it).
pub fn loop_split(number: &str) -> Option<(&str, u64, &str)> {
    let mut at = number.len();
    while let Some(i) = number[..at].rfind(".t") {
        let tail = &number[i + 2..];
        let digits = tail.find(|c: char| !c.is_ascii_digit()).unwrap_or(tail.len());
        if digits > 0
            && (digits == tail.len() || tail[digits..].starts_with('.'))
            && let Ok(k) = tail[..digits].parse()
        {
            return Some((&number[..i], k, &tail[digits..]));
        }
        at = i;
    }
    None
}

/// The key of the step, iteration or branch a loop part's loop is (`3[2]` for `3[2].t1.1`);
/// a plain `mcp` step's approval (`3.approval`, no turn) belongs to its step (`3`).
pub fn loop_owner(number: &str) -> &str {
    match loop_split(number) {
        Some((o, ..)) => o,
        None => number.strip_suffix(".approval").unwrap_or(number),
    }
}

/// A loop part's place in its loop: turn by turn, the turn, its approval, then its calls
/// in the model's order.
pub fn loop_order(number: &str) -> (u64, u64) {
    match loop_split(number) {
        Some((_, k, "")) => (k, 0),
        Some((_, k, ".approval")) => (k, 1),
        Some((_, k, rest)) => (k, 2 + rest.trim_start_matches('.').parse::<u64>().unwrap_or(0)),
        None => (0, 0),
    }
}

/// The tool agent loop call `number` (`3.t2.1`: the first call of turn 2 of the loop keyed
/// `3`) among `steps` called: the name its record keeps (`answers.tool`), or, for a call with
/// no record yet or one written before records kept it, the name in the turn's `tool_calls`.
pub fn tool_name<'a>(number: &str, steps: &'a [StepRecord]) -> Option<&'a str> {
    let kept = steps
        .iter()
        .filter(|s| s.kind == "tool" && s.number == number)
        .find_map(|s| s.answers.as_ref()?.get("tool")?.as_str());
    if kept.is_some() {
        return kept;
    }
    let (turn, i) = number.rsplit_once('.')?;
    let i: usize = i.parse().ok()?;
    steps
        .iter()
        .find(|t| t.kind == "turn" && t.number == turn)
        .and_then(|t| t.result.as_deref())
        .and_then(|m| m.get("tool_calls"))
        .and_then(|c| c.get(i.checked_sub(1)?))
        .and_then(|c| c.pointer("/function/name"))
        .and_then(serde_json::Value::as_str)
}

/// Puts the iterations and branches of one step in the order a reader expects, whatever order
/// they finished (and were recorded) in: iterations by item, branches as they are written in
/// the flow. A finished `parallel` step's result names its branches in that order; before it
/// has one (`owner` is `None`: the run stopped while the step ran), branches go in the order
/// they started.
pub fn group_order(parts: &mut [&StepRecord], owner: Option<&StepRecord>) {
    let written = owner
        .and_then(|o| o.result.as_deref())
        .and_then(serde_json::Value::as_object);
    parts.sort_by_key(|p| {
        let branch = p.number.rsplit_once('.').map(|(_, b)| b);
        let place = match (p.iteration, written, branch) {
            (Some(i), ..) => i as usize,
            (None, Some(w), Some(b)) => w.keys().position(|k| k == b).unwrap_or(usize::MAX),
            _ => usize::MAX,
        };
        (place, p.started_at)
    });
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// An instant a record tells, as the engine took it: Unix nanoseconds. A record keeps its
/// milliseconds ([`Stamp::ms`], what [`now_ms`] would have read) and, for the observer, the
/// nanoseconds ([`StepRecord::started_ns`]), so that a span of a quick step has a length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp(u64);

impl Stamp {
    pub fn now() -> Stamp {
        Stamp(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }

    /// Unix milliseconds, rounded down.
    pub fn ms(self) -> u64 {
        self.0 / 1_000_000
    }

    /// Unix nanoseconds.
    pub fn ns(self) -> u64 {
        self.0
    }
}

/// The Unix nanoseconds of a time a record tells in milliseconds (`ms`) and, when the engine
/// made the record, in nanoseconds too (`ns`): those when they agree with the milliseconds
/// (a record whose time was set from another, read back from the store, has only its
/// milliseconds), else the millisecond's start.
pub fn nanos(ms: u64, ns: Option<u64>) -> u64 {
    match ns {
        Some(ns) if ns / 1_000_000 == ms => ns,
        _ => ms.saturating_mul(1_000_000),
    }
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
    fn loop_parts_split_at_their_last_turn_segment() {
        assert_eq!(loop_split("3.t2.1"), Some(("3", 2, ".1")));
        assert_eq!(loop_split("3.t12"), Some(("3", 12, "")));
        assert_eq!(loop_split("3[2].t1.approval"), Some(("3[2]", 1, ".approval")));
        // A loop in a `flow` tool's child run: its own turn segment is the last one.
        assert_eq!(loop_split("1.t1.2.1.t3.1"), Some(("1.t1.2.1", 3, ".1")));
        assert_eq!(loop_split("4.2"), None);
        assert_eq!(loop_split("1.tx"), None);
        assert_eq!(loop_owner("5"), "5");
        assert_eq!(loop_owner("5.approval"), "5");
        assert_eq!(loop_owner("5[2].approval"), "5[2]");
        let mut parts = ["1.t2", "1.t1.10", "1.t1.2", "1.t1.approval", "1.t1"];
        parts.sort_by_key(|p| loop_order(p));
        assert_eq!(parts, ["1.t1", "1.t1.approval", "1.t1.2", "1.t1.10", "1.t2"]);
    }

    #[test]
    fn a_stamp_keeps_its_millisecond_and_nanos_trust_only_what_agrees_with_it() {
        let s = Stamp::now();
        assert_eq!(s.ms(), s.ns() / 1_000_000);
        assert!(s.ms().abs_diff(now_ms()) < 60_000);
        assert_eq!(nanos(5, Some(5_123_456)), 5_123_456);
        // Times read back from a store, or a millisecond set from elsewhere: the millisecond.
        assert_eq!(nanos(5, None), 5_000_000);
        assert_eq!(nanos(6, Some(5_123_456)), 6_000_000);
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
