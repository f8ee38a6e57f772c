//! The inbox (SPEC §15): the questions runs wait at, as data, and the decisions that answer
//! them. An [`InboxItem`] is written when a run stops for a human (one per waiting part:
//! an `interrupt` step, an approval of tool calls, an MCP server's question); every answer
//! appends a [`DecisionRow`], never updated or deleted.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where an item stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    /// Waits for a decision.
    Waiting,
    /// Answered: its decision is in the log, applied when the run continues.
    Decided,
    /// Its expiry passed before an answer: the run continues as the step's `expires` says.
    Expired,
    /// Its run ended another way (cancelled, failed) while it waited.
    Cancelled,
}

impl ItemState {
    pub fn as_str(self) -> &'static str {
        match self {
            ItemState::Waiting => "waiting",
            ItemState::Decided => "decided",
            ItemState::Expired => "expired",
            ItemState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<ItemState> {
        Some(match s {
            "waiting" => ItemState::Waiting,
            "decided" => ItemState::Decided,
            "expired" => ItemState::Expired,
            "cancelled" => ItemState::Cancelled,
            _ => return None,
        })
    }
}

/// How a decision was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// `inbox decide`, `inbox bulk`, `resume --decision`.
    Cli,
    /// `serve`'s JSON API.
    Api,
    /// `serve`'s inbox page.
    Ui,
    /// The library's `Switchyard::resume` with a decision.
    Library,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Cli => "cli",
            Via::Api => "api",
            Via::Ui => "ui",
            Via::Library => "library",
        }
    }

    pub fn parse(s: &str) -> Option<Via> {
        Some(match s {
            "cli" => Via::Cli,
            "api" => Via::Api,
            "ui" => Via::Ui,
            "library" => Via::Library,
            _ => return None,
        })
    }
}

/// A question a run waits at.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InboxItem {
    /// `q` and 20 hex digits, derived from (run, number, iteration): the same part asking
    /// again is the same item ([`item_id`]).
    pub id: String,
    /// The run whose part waits: the root run or one of its child runs.
    pub run_id: String,
    /// The root run of its tree: the run a decision continues.
    pub root_run: String,
    /// The waiting part's record number (`2`, `3.t2.approval`, `4.approval`, `3.e1`).
    pub number: String,
    /// Its iteration, for a part of a `while`/`foreach` iteration record.
    pub iteration: Option<u64>,
    /// The waiting run's flow.
    pub flow: String,
    /// The step the part belongs to.
    pub step: String,
    /// The root run's batch and item id, when it is a batch's item.
    pub batch: Option<String>,
    pub item: Option<String>,
    /// `interrupt`, `approval` or `elicitation`.
    pub kind: String,
    /// The question, rendered.
    pub question: String,
    /// The JSON Schema every decision is checked against (`true`: any JSON value).
    pub schema: Value,
    /// For approvals: the proposed calls, `[{id, tool, arguments, input_schema}]` in the
    /// model's order; empty otherwise.
    pub calls: Vec<Value>,
    /// The question's shape: a hash of (flow, step, schema); items of one shape group.
    pub shape: String,
    /// Unix milliseconds, the store's clock.
    pub created_at: u64,
    pub expires_at: Option<u64>,
    pub state: ItemState,
    /// When it was decided, expired or cancelled.
    pub settled_at: Option<u64>,
}

/// One answer, as the append-only log keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecisionRow {
    /// `d` and hex digits.
    pub id: String,
    pub item_id: String,
    /// The run whose part it answers.
    pub run_id: String,
    /// Who: `--actor` (default the OS user), or the name of `serve`'s token.
    pub actor: String,
    pub via: Via,
    pub decision: Value,
    pub reason: Option<String>,
    /// For approvals with edits: `[{call, tool, before, after}]`.
    pub edited: Option<Value>,
    /// The bulk operation it belongs to.
    pub bulk_id: Option<String>,
    /// Unix milliseconds, the store's clock.
    pub at: u64,
}

/// The id of the item asked by part `number` (`iteration`) of run `run_id`.
pub fn item_id(run_id: &str, number: &str, iteration: Option<u64>) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(run_id.as_bytes());
    h.update([0]);
    h.update(number.as_bytes());
    h.update([0]);
    if let Some(i) = iteration {
        h.update(i.to_string().as_bytes());
    }
    let digest = h.finalize();
    let mut id = String::with_capacity(21);
    id.push('q');
    for b in &digest[..10] {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

/// The shape of a question: a hash of (flow, step, schema).
pub fn shape_of(flow: &str, step: &str, schema: &Value) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(flow.as_bytes());
    h.update([0]);
    h.update(step.as_bytes());
    h.update([0]);
    h.update(schema.to_string().as_bytes());
    let digest = h.finalize();
    let mut id = String::with_capacity(17);
    id.push('s');
    for b in &digest[..8] {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

/// A fresh id with prefix `prefix` (`d` for decisions, `b` for bulk operations): the time,
/// a counter of the process and random bits: unique across processes, in the order made
/// within one.
pub fn new_id(prefix: char) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = super::now_ms();
    let bytes = random_bytes::<6>();
    let mut id = String::with_capacity(28);
    id.push(prefix);
    id.push_str(&format!("{now:011x}"));
    id.push_str(&format!(
        "{:04x}",
        COUNTER.fetch_add(1, Ordering::Relaxed) & 0xffff
    ));
    for b in bytes {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

/// The OS user who answers when no actor is named: `$USER`, else `$LOGNAME`, else the name
/// `/etc/passwd` gives this process's user (a service, a container, cron set neither), else
/// `unknown`.
pub fn os_user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|n| !n.trim().is_empty())
        .or_else(passwd_name)
        .unwrap_or_else(|| "unknown".to_string())
}

/// The name `/etc/passwd` gives this process's user.
fn passwd_name() -> Option<String> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() }.to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        (fields.nth(1)? == uid && !name.is_empty()).then(|| name.to_string())
    })
}

/// A time in Unix milliseconds as RFC 3339 UTC (`2026-12-05T10:04:03.120Z`).
pub fn format_ms(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(|| format!("{ms} ms"), |t| format!("{t:.3}"))
}

/// `N` bytes from the system's random source (`/dev/urandom`); should it be unreadable, a
/// hash of the time, the process and a counter, which is unique but not secret.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    use std::io::Read;
    let mut out = [0u8; N];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut out))
        .is_ok()
    {
        return out;
    }
    use sha2::Digest;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = sha2::Sha256::new();
    h.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            .to_le_bytes(),
    );
    let digest = h.finalize();
    for (o, d) in out.iter_mut().zip(digest.iter().cycle()) {
        *o = *d;
    }
    out
}

/// What an approval's decision edited: `[{call, tool, before, after}]` for each `edit`,
/// `None` when nothing was.
pub fn edited(item: &InboxItem, decision: &Value) -> Option<Value> {
    if item.kind != "approval" {
        return None;
    }
    let each: Vec<&Value> = match decision {
        Value::Array(a) => a.iter().collect(),
        one => vec![one],
    };
    let edits: Vec<Value> = each
        .iter()
        .zip(&item.calls)
        .filter_map(|(d, c)| {
            let after = d.get("edit")?;
            Some(serde_json::json!({
                "call": c.get("id").cloned().unwrap_or(Value::Null),
                "tool": c.get("tool").cloned().unwrap_or(Value::Null),
                "before": c.get("arguments").cloned().unwrap_or(Value::Null),
                "after": after,
            }))
        })
        .collect();
    (!edits.is_empty()).then_some(Value::Array(edits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_id_is_stable_and_tells_parts_apart() {
        let a = item_id("r1", "2", None);
        assert_eq!(a, item_id("r1", "2", None));
        assert_eq!(a.len(), 21);
        assert_ne!(a, item_id("r1", "2", Some(0)));
        assert_ne!(a, item_id("r1", "3", None));
        assert_ne!(a, item_id("r2", "2", None));
    }

    #[test]
    fn states_and_channels_read_back() {
        for s in [
            ItemState::Waiting,
            ItemState::Decided,
            ItemState::Expired,
            ItemState::Cancelled,
        ] {
            assert_eq!(ItemState::parse(s.as_str()), Some(s));
        }
        for v in [Via::Cli, Via::Api, Via::Ui, Via::Library] {
            assert_eq!(Via::parse(v.as_str()), Some(v));
        }
        assert_ne!(new_id('d'), new_id('d'));
    }
}
