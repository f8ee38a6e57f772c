//! Batches (SPEC §10): one run per line of a JSONL file, up to `concurrency` in flight, output
//! lines in input order, resumable.
//!
//! The store is the truth; the output file is derived from it. Every start reads the input
//! twice, streaming: once for the ids (duplicates are refused before anything runs), once to
//! run. Each line's latest run in the store decides what happens to it: finished runs are
//! written as they are, unfinished ones (a crash, Ctrl-C) resume, lines without a run start
//! one. The output file is written anew from the first line on every start, so a torn last
//! line of a killed batch is repaired and an item is never written twice.
//!
//! A batch is identified by its output file (its canonical path: symlinks and `..`
//! resolved): running the same command again, whatever the spelling of the output, continues
//! it.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::Value;

use crate::agents::AgentState;
use crate::plan::Plan;
use crate::runtime::budget::{CostCap, SharedBudget};
use crate::runtime::cost::Cost;
use crate::runtime::engine::{BatchItem, Engine, Released, RunControls, RunOptions, RunOutcome};
use crate::runtime::record::{RunRecord, RunStatus, Usage};
use crate::runtime::resume::ResumeOptions;
use crate::runtime::{ErrorKind, StepError};
use crate::store::Store;

/// The longest input line read (SPEC §9 engine-wide caps): longer lines are failed items.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// How many runs are read from the store at a time.
const CHUNK: usize = 1024;

/// What a batch reads and writes and how it runs its items: [`BatchOptions::new`] gives
/// `switchyard batch`'s defaults, and the public fields are its flags.
#[derive(Clone, Debug)]
pub struct BatchOptions {
    pub input: PathBuf,
    pub output: PathBuf,
    pub concurrency: usize,
    /// The field of each input object holding its id, a dotted path (`ticket.id`); lines
    /// without it are identified by their line number.
    pub id_field: String,
    /// The id field was named (`--id-field`), not the default: an input in which no line
    /// has it is refused.
    pub(crate) id_field_given: bool,
    /// The batch's budget: checked before every agent call of its items in flight, and no
    /// item starts once it is spent.
    pub max_cost_usd: Option<f64>,
    /// Run failed items again (a new run each).
    pub retry_failed: bool,
    pub retry_in_doubt: bool,
    pub allow_changed: bool,
    /// The store holds nothing of earlier batches (`--store memory`): nothing to look up.
    pub(crate) fresh_store: bool,
    /// Sync OUT.jsonl to disk before returning. Worth it only when the store is durable too:
    /// with `--store memory` a crash or power loss leaves nothing to continue from anyway, so
    /// its output is left to the operating system like any other file a tool writes.
    pub(crate) sync_output: bool,
    /// Run nothing: write OUT.jsonl from the store (`runs export`), in input order, up to the
    /// first item that has not finished.
    pub(crate) export_only: bool,
}

/// Counters the caller shows while the batch runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Items in the input.
    pub total: AtomicU64,
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    pub interrupted: AtomicU64,
    /// Runs doing work (agents, steps), as `--concurrency` bounds them; a run waiting only
    /// for the commit of its end is no longer counted.
    pub in_flight: AtomicU64,
    /// Items whose result came from an earlier start of the batch.
    pub reused: AtomicU64,
    /// Cost in nano-dollars, the unit providers count in: an item of a cheap local model
    /// costs well under a micro-dollar.
    pub cost_nanos: AtomicU64,
    /// Model calls whose cost is unknown (no `usage` reported), not in `cost_nanos`.
    pub cost_unknown_calls: AtomicU64,
}

impl Progress {
    pub fn done(&self) -> u64 {
        self.succeeded.load(Ordering::Relaxed)
            + self.failed.load(Ordering::Relaxed)
            + self.interrupted.load(Ordering::Relaxed)
    }

    pub fn cost_usd(&self) -> Cost {
        Cost::from_nanos(self.cost_nanos.load(Ordering::Relaxed))
    }

    fn add_cost(&self, usage: &Usage) {
        self.cost_nanos
            .fetch_add(usage.cost_usd.nanos(), Ordering::Relaxed);
        self.cost_unknown_calls
            .fetch_add(usage.cost_unknown_calls, Ordering::Relaxed);
    }
}

/// How a batch ended.
#[derive(Debug, Default)]
pub struct Summary {
    pub total: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub interrupted: u64,
    /// Items not finished: stopped by Ctrl-C or the cost limit, or never started.
    pub unfinished: u64,
    pub reused: u64,
    pub cost_usd: Cost,
    /// Model calls of the batch (earlier starts included) whose cost is unknown.
    pub cost_unknown_calls: u64,
    /// LLM requests of this start abandoned past their timeout (or cancelled), whose tokens
    /// are unknown: `cost_usd` is then a lower bound.
    pub abandoned_requests: u64,
    pub elapsed: std::time::Duration,
    /// Why the batch stopped early, if it did.
    pub stopped: Option<String>,
    /// It stopped because the store failed (disk full, locked).
    pub store_failed: bool,
    /// It stopped because it had spent `--max-cost-usd` (this budget).
    pub cost_limit: Option<f64>,
}

/// Why a batch could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("cannot read {path}: {message}")]
    Input { path: String, message: String },
    #[error("cannot write {path}: {message}")]
    Output { path: String, message: String },
    #[error("{path}: duplicate ids: {list}")]
    Duplicates { path: String, list: String },
    #[error(
        "{path} line {line}: the batch's run for this line was of id `{recorded}`, now the line's id is `{now}`: \
         the input changed since the batch started (or --id-field is not the batch's). Use another --output \
         (a new batch) or restore the input"
    )]
    InputChanged {
        path: String,
        line: u64,
        recorded: String,
        now: String,
    },
    #[error(
        "{path} line {line}: item `{id}` is not the input its recorded run `{run}` started from: the input \
         changed since the batch started. Use another --output (a new batch), restore the input, or \
         --retry-failed if only failed items changed"
    )]
    InputContentChanged {
        path: String,
        line: u64,
        id: String,
        run: String,
    },
    #[error("{path} line {line}: the id field `{field}` is {what}: an id is a string or a number")]
    BadId {
        path: String,
        line: u64,
        field: String,
        what: &'static str,
    },
    #[error(
        "{path}: no line has the id field `{field}` (--id-field; a dotted path such as `ticket.id` \
         names a nested field)"
    )]
    NoIdField { path: String, field: String },
    #[error("{path} is both the input and the output: writing the output would erase the input")]
    SameFile { path: String },
    #[error(
        "{count} unfinished run(s) of this batch started from another version of the flow `{flow}` \
         (first: `{first}`): pass --allow-changed to resume them with this one"
    )]
    FlowChanged {
        count: usize,
        flow: String,
        first: String,
    },
    #[error(
        "{count} unfinished run(s) of this batch started under other agent changes than this command's \
         --agent-change (first: `{first}`): give the --agent-change the batch started with, or pass \
         --allow-changed to resume them anyway"
    )]
    OtherAgentChanges { count: usize, first: String },
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error(
        "the store holds no runs of the batch writing {path}: nothing to export (is it the batch's `--store`?)"
    )]
    NothingToExport { path: String },
    #[error(
        "{path} is in use by another switchyard process right now (a `batch` writing it, or a `resume` or \
         `runs cancel` of one of its runs): one process per batch"
    )]
    Busy {
        path: String,
        /// The process holding it, when this host tells it.
        holder: Option<u32>,
    },
}

/// Holds the lock of a batch's output file while a run of that batch is resumed or cancelled
/// by another command, so that the batch and that command never work on the run at once.
#[derive(Debug)]
pub struct BatchLock {
    _file: Option<std::fs::File>,
}

/// Takes the lock of the batch `run` belongs to (its output file), if it is one's and the file
/// is there; [`BatchError::Busy`] while a `batch` process (or another such command) holds it.
pub fn lock_batch_of(run: &RunRecord) -> Result<BatchLock, BatchError> {
    let Some(path) = run.batch.as_deref() else {
        return Ok(BatchLock { _file: None });
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        // Nothing writes a batch whose output is gone; the run is free to take.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BatchLock { _file: None }),
        Err(e) => {
            return Err(BatchError::Output {
                path: path.to_string(),
                message: e.to_string(),
            });
        }
    };
    match file.try_lock() {
        Ok(()) => Ok(BatchLock { _file: Some(file) }),
        Err(std::fs::TryLockError::WouldBlock) => Err(BatchError::Busy {
            path: path.to_string(),
            holder: crate::store::writers::lock_holder(&file),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(BatchError::Output {
            path: path.to_string(),
            message: e.to_string(),
        }),
    }
}

/// One input line, read.
pub(crate) struct Line {
    /// 0-based index among the file's lines (blank lines count, and are skipped).
    pub(crate) index: u64,
    /// The id as text: what the store records and duplicates are found by.
    pub(crate) id: String,
    /// The id as the output writes it: the input's string or number as it was, or the line
    /// number (as a string) for a line without one.
    pub(crate) id_value: Value,
    pub(crate) parsed: Result<Value, String>,
}

/// Streams the items of a JSONL file.
pub(crate) struct Lines {
    reader: BufReader<std::fs::File>,
    path: String,
    index: u64,
    id_field: String,
    /// `id_field`'s segments.
    id_path: Vec<String>,
    buf: Vec<u8>,
}

impl Lines {
    pub(crate) fn open(path: &Path, id_field: &str) -> Result<Lines, BatchError> {
        let file = std::fs::File::open(path).map_err(|e| BatchError::Input {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(Lines {
            reader: BufReader::with_capacity(1 << 16, file),
            path: path.display().to_string(),
            index: 0,
            id_field: id_field.to_string(),
            id_path: id_field.split('.').map(str::to_string).collect(),
            buf: Vec::new(),
        })
    }

    /// The next non-blank line.
    pub(crate) fn next_line(&mut self) -> Result<Option<Line>, BatchError> {
        let Some((index, text)) = self.next_text()? else {
            return Ok(None);
        };
        let line_no = index + 1;
        let text = match text {
            Ok(()) => self.text(),
            Err(message) => {
                let (id, id_value) = broken_line_id(index);
                return Ok(Some(Line {
                    index,
                    id,
                    id_value,
                    parsed: Err(message),
                }));
            }
        };
        let parsed: Result<Value, String> = crate::json::from_str(text).map_err(|e| {
            // The error says where as " at line 1 column N": the line is ours to name.
            format!(
                "line {line_no} is not JSON: {} (column {})",
                e.cause(),
                e.column()
            )
        });
        // A line refused for what it holds rather than how it is written is named as the
        // ids alone name it ([`Lines::next_id`]).
        let at = match &parsed {
            Ok(v) => Some(id_at(v, &self.id_path)),
            Err(_) => self.id_of_text(),
        };
        let (id, id_value) = match at {
            None => broken_line_id(index),
            Some(at) => match self.checked(index, at)? {
                Some(v) => (id_text(&v), v),
                None => (line_no.to_string(), Value::String(line_no.to_string())),
            },
        };
        Ok(Some(Line {
            index,
            id,
            id_value,
            parsed,
        }))
    }

    /// The id a line's field holds (`None`: it has none), or the error of one that cannot
    /// be an id.
    fn checked(&self, index: u64, at: IdAt) -> Result<Option<Value>, BatchError> {
        match at {
            IdAt::Missing => Ok(None),
            IdAt::Id(v) => Ok(Some(v)),
            IdAt::Bad(what) => Err(BatchError::BadId {
                path: self.path.clone(),
                line: index + 1,
                field: self.id_field.clone(),
                what,
            }),
        }
    }

    /// The index and id of the next non-blank line, as [`Lines::next_line`] names it, and
    /// whether the line has the id field (`None`: it is not JSON, and can be no duplicate),
    /// without building the line's value: the id field is read, the rest only checked.
    fn next_id(&mut self) -> Result<Option<(u64, String, Option<bool>)>, BatchError> {
        let Some((index, text)) = self.next_text()? else {
            return Ok(None);
        };
        let at = match text {
            Ok(()) => self.id_of_text(),
            Err(_) => None,
        };
        let Some(at) = at else {
            return Ok(Some((index, broken_line_id(index).0, None)));
        };
        Ok(Some(match self.checked(index, at)? {
            Some(v) => (index, id_text(&v), Some(true)),
            None => (index, (index + 1).to_string(), Some(false)),
        }))
    }

    /// What the line [`Lines::next_text`] read holds at its id field, reading nothing else
    /// into values; `None` if it is not JSON at all.
    fn id_of_text(&self) -> Option<IdAt> {
        let text = self.text();
        // Only an object has an id field; any other JSON value is named by its line number.
        if !text.starts_with('{') {
            return serde_json::from_str::<serde::de::IgnoredAny>(text)
                .ok()
                .map(|_| IdAt::Missing);
        }
        let mut de = serde_json::Deserializer::from_str(text);
        serde::de::DeserializeSeed::deserialize(IdOf(&self.id_path), &mut de)
            .and_then(|id| de.end().map(|()| id))
            .ok()
    }

    /// The line [`Lines::next_text`] read, trimmed.
    fn text(&self) -> &str {
        // Checked to be UTF-8 by `next_text`.
        std::str::from_utf8(&self.buf).map_or("", str::trim)
    }

    /// Reads the next non-blank line into `buf`: its index, and whether it can be read as
    /// text at all (a line over the size limit or not UTF-8 cannot, and says why).
    fn next_text(&mut self) -> Result<Option<(u64, Readable)>, BatchError> {
        loop {
            self.buf.clear();
            let n = (&mut self.reader)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| BatchError::Input {
                    path: self.path.clone(),
                    message: e.to_string(),
                })?;
            if n == 0 {
                return Ok(None);
            }
            let index = self.index;
            self.index += 1;
            let line_no = index + 1;
            // A UTF-8 byte order mark, which some editors put at the start of a file, is not
            // part of the first line.
            if index == 0 && self.buf.starts_with(b"\xEF\xBB\xBF") {
                self.buf.drain(..3);
            }
            if self.buf.len() > MAX_LINE_BYTES && !self.buf.ends_with(b"\n") {
                // Skip the rest of the over-long line.
                let mut rest = Vec::new();
                loop {
                    rest.clear();
                    let m = (&mut self.reader)
                        .take(1 << 20)
                        .read_until(b'\n', &mut rest)
                        .map_err(|e| BatchError::Input {
                            path: self.path.clone(),
                            message: e.to_string(),
                        })?;
                    if m == 0 || rest.ends_with(b"\n") {
                        break;
                    }
                }
                return Ok(Some((
                    index,
                    Err(format!(
                        "line {line_no} is longer than {MAX_LINE_BYTES} bytes (the JSONL line size limit)"
                    )),
                )));
            }
            match std::str::from_utf8(&self.buf) {
                Ok(t) if t.trim().is_empty() => continue,
                Ok(_) => return Ok(Some((index, Ok(())))),
                Err(e) => {
                    return Ok(Some((
                        index,
                        Err(format!(
                            "line {line_no} is not UTF-8 (byte {} of the line)",
                            e.valid_up_to() + 1
                        )),
                    )));
                }
            }
        }
    }
}

/// The id of a line that is not JSON (or not text): `line:N`, which names no other line, as
/// the number `N` would name a line without the id field or one whose id is `N`.
fn broken_line_id(index: u64) -> (String, Value) {
    let id = format!("line:{}", index + 1);
    (id.clone(), Value::String(id))
}

/// Whether a line read is text ([`Lines::text`]), or why not.
type Readable = Result<(), String>;

/// What a line holds at its id field.
enum IdAt {
    /// Not there (or not under an object): the line is named by its line number.
    Missing,
    /// A string or a number.
    Id(Value),
    /// Something that cannot be an id: what it is.
    Bad(&'static str),
}

/// The value at the dotted path `path` of a line, as an id.
fn id_at(v: &Value, path: &[String]) -> IdAt {
    let mut v = v;
    for key in path {
        match v.as_object().and_then(|m| m.get(key)) {
            Some(inner) => v = inner,
            None => return IdAt::Missing,
        }
    }
    id_kind(v)
}

fn id_kind(v: &Value) -> IdAt {
    match v {
        Value::String(_) | Value::Number(_) => IdAt::Id(v.clone()),
        Value::Null => IdAt::Bad("null"),
        Value::Bool(_) => IdAt::Bad("a boolean"),
        Value::Object(_) => IdAt::Bad("an object"),
        Value::Array(_) => IdAt::Bad("an array"),
    }
}

/// An id's text: a string as it is, a number as JSON writes it.
fn id_text(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Reads a JSON object for its id field only ([`id_at`]), skipping the other values
/// without building them (but the objects on a dotted path to it). Like a parsed object, a
/// key given twice counts as its last value.
struct IdOf<'a>(&'a [String]);

impl<'de> serde::de::DeserializeSeed<'de> for IdOf<'_> {
    type Value = IdAt;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for IdOf<'_> {
    type Value = IdAt;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut id = IdAt::Missing;
        while let Some(is_id) = map.next_key_seed(KeyIs(&self.0[0]))? {
            if is_id {
                id = match &self.0[1..] {
                    [] => id_kind(&map.next_value::<Value>()?),
                    rest => id_at(&map.next_value::<Value>()?, rest),
                };
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(id)
    }
}

/// Whether a key is the given one, without keeping it.
struct KeyIs<'a>(&'a str);

impl<'de> serde::de::DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

fn id_hash(id: &str) -> u128 {
    // Two independent 64-bit hashes: a false duplicate needs both to collide.
    let mut h1 = FIXED[0].build_hasher();
    h1.write(id.as_bytes());
    let mut h2 = FIXED[1].build_hasher();
    h2.write(id.as_bytes());
    (u128::from(h1.finish()) << 64) | u128::from(h2.finish())
}

static FIXED: std::sync::LazyLock<[std::hash::RandomState; 2]> =
    std::sync::LazyLock::new(|| [std::hash::RandomState::new(), std::hash::RandomState::new()]);

/// Reads the ids of every line; refuses duplicates, naming their lines. Returns the count.
pub(crate) fn scan(options: &BatchOptions) -> Result<u64, BatchError> {
    let mut lines = Lines::open(&options.input, &options.id_field)?;
    let mut seen: HashSet<u128> = HashSet::new();
    let mut dups: HashSet<String> = HashSet::new();
    let mut count = 0u64;
    let mut any_has = false;
    while let Some((_, id, has)) = lines.next_id()? {
        count += 1;
        let Some(has) = has else {
            // A line that is not JSON is named by its position: it can repeat no id.
            continue;
        };
        any_has |= has;
        if !seen.insert(id_hash(&id)) {
            dups.insert(id);
        }
    }
    if options.id_field_given && count > 0 && !any_has {
        return Err(BatchError::NoIdField {
            path: options.input.display().to_string(),
            field: options.id_field.clone(),
        });
    }
    if dups.is_empty() {
        return Ok(count);
    }
    // Second look, only for the duplicated ids: where they are.
    let mut at: Vec<(String, Vec<u64>)> = Vec::new();
    let mut lines = Lines::open(&options.input, &options.id_field)?;
    while let Some((index, id, has)) = lines.next_id()? {
        if has.is_some() && dups.contains(&id) {
            match at.iter_mut().find(|(seen, _)| *seen == id) {
                Some((_, l)) => l.push(index + 1),
                None => at.push((id, vec![index + 1])),
            }
        }
    }
    let shown: Vec<String> = at
        .iter()
        .take(20)
        .map(|(id, l)| {
            let lines: Vec<String> = l.iter().map(u64::to_string).collect();
            format!("`{id}` on lines {}", lines.join(", "))
        })
        .collect();
    let more = at.len().saturating_sub(20);
    let mut list = if more > 0 {
        format!("{} and {more} more", shown.join("; "))
    } else {
        shown.join("; ")
    };
    // An id that is one of its own line numbers may be a line without the field.
    if at.iter().any(|(id, l)| l.iter().any(|n| n.to_string() == *id)) {
        list.push_str(&format!(
            " (a line without `{}` is named by its line number: give it an id of its own)",
            options.id_field
        ));
    }
    Err(BatchError::Duplicates {
        path: options.input.display().to_string(),
        list,
    })
}

/// The runs of a batch, read from the store a chunk at a time as the input advances.
pub(crate) struct Earlier {
    batch: String,
    /// Runs of item indices in `from..until`, in order.
    runs: VecDeque<RunRecord>,
    until: u64,
    fresh: bool,
}

impl Earlier {
    /// The runs of batch `batch`, none read yet.
    pub(crate) fn new(batch: String) -> Earlier {
        Earlier {
            batch,
            runs: VecDeque::new(),
            until: 0,
            fresh: false,
        }
    }

    /// The latest run of item `index` (indices are asked for in increasing order).
    pub(crate) async fn latest<S: Store>(
        &mut self,
        store: &S,
        index: u64,
    ) -> Result<Option<RunRecord>, BatchError> {
        if self.fresh {
            return Ok(None);
        }
        if index >= self.until {
            let mut limit = CHUNK;
            loop {
                let got = store.batch_runs(&self.batch, index, limit).await?;
                if got.len() < limit {
                    self.until = u64::MAX;
                    self.runs = got.into();
                    break;
                }
                // The last index may continue past the chunk: keep it for the next read.
                let last = got.last().and_then(|r| r.item_index).unwrap_or(index);
                if last > index {
                    self.until = last;
                    self.runs = got.into_iter().filter(|r| r.item_index < Some(last)).collect();
                    break;
                }
                limit *= 2;
            }
        }
        let mut latest = None;
        while let Some(r) = self.runs.front() {
            match r.item_index {
                Some(i) if i < index => {
                    self.runs.pop_front();
                }
                Some(i) if i == index => latest = self.runs.pop_front(),
                _ => break,
            }
        }
        Ok(latest)
    }
}

/// Refuses to continue a batch whose unfinished runs started from another version of the flow,
/// or under other agent changes than `run_options`' (a run resumed under other changes could
/// call an agent it started without); `--allow-changed` skips this.
async fn refuse_changed<S: Store>(
    store: &S,
    batch: &str,
    root: &crate::plan::FlowPlan,
    run_options: &RunOptions,
) -> Result<(), BatchError> {
    let filter = crate::store::RunFilter {
        flow: Some(root.name.clone()),
        ..Default::default()
    };
    let unfinished: Vec<RunRecord> = store
        .unfinished_runs(&filter)
        .await?
        .into_iter()
        .filter(|r| r.batch.as_deref() == Some(batch))
        .collect();
    let changed: Vec<&RunRecord> = unfinished.iter().filter(|r| r.flow_hash != root.hash).collect();
    if let Some(first) = changed.first() {
        return Err(BatchError::FlowChanged {
            count: changed.len(),
            flow: root.name.clone(),
            first: first.id.clone(),
        });
    }
    let source = &run_options.agent_changes.source;
    let other: Vec<&RunRecord> = unfinished.iter().filter(|r| r.agent_changes != *source).collect();
    if let Some(first) = other.first() {
        return Err(BatchError::OtherAgentChanges {
            count: other.len(),
            first: first.id.clone(),
        });
    }
    Ok(())
}

/// What one line becomes.
enum Slot {
    Waiting,
    Line(String),
    /// Stopped before finishing (Ctrl-C): nothing written from here on.
    Unfinished,
}

/// Runs the batch. `pause` stops starting items and stops in-flight runs at their next
/// recorded point (they resume on the next start).
pub async fn run<S: Store>(
    engine: Engine<S>,
    plan: Arc<Plan>,
    options: BatchOptions,
    run_options: RunOptions,
    context: Value,
    progress: Arc<Progress>,
    controls: RunControls,
) -> Result<Summary, BatchError> {
    let started = Instant::now();
    // LLM requests abandoned with their tokens unknown, counted by the process's providers.
    let abandoned_before = crate::agents::provider::Providers::global().totals().abandoned;
    if same_file(&options.input, &options.output) {
        return Err(BatchError::SameFile {
            path: options.output.display().to_string(),
        });
    }
    let total = scan(&options)?;
    progress.total.store(total, Ordering::Relaxed);
    let batch = batch_name(&*engine.store, &options).await?;
    let root = plan.root().clone();
    if !options.fresh_store && !options.allow_changed && !options.export_only {
        refuse_changed(&*engine.store, &batch, &root, &run_options).await?;
    }
    let out_path = options.output.display().to_string();
    // An export from a store that never saw this batch (another folder's, a mistyped one)
    // would empty the output: refuse before touching it.
    if options.export_only && engine.store.batch_runs(&batch, 0, 1).await?.is_empty() {
        return Err(BatchError::NothingToExport { path: out_path });
    }
    let out_err = |e: std::io::Error| BatchError::Output {
        path: out_path.clone(),
        message: e.to_string(),
    };
    if let Some(dir) = options.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(out_err)?;
    }
    // One process per batch: the output file is locked while the batch runs, and emptied
    // only once the lock is held.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&options.output)
        .map_err(out_err)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(BatchError::Busy {
                path: out_path.clone(),
                holder: crate::store::writers::lock_holder(&file),
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(out_err(e)),
    }
    file.set_len(0).map_err(out_err)?;
    let mut out = BufWriter::with_capacity(1 << 16, file);

    let mut lines = Lines::open(&options.input, &options.id_field)?;
    let mut earlier = Earlier {
        batch: batch.clone(),
        runs: VecDeque::new(),
        until: 0,
        fresh: options.fresh_store,
    };
    let concurrency = options.concurrency.max(1);
    // The reorder buffer: lines in input order, written from the front as they fill.
    let window = (concurrency * 4).max(1024);
    let mut slots: VecDeque<Slot> = VecDeque::new();
    let mut first_slot = 0u64; // sequence number of `slots[0]`
    let mut next_seq = 0u64;
    let mut in_flight = FuturesUnordered::new();
    // Items whose run is still working (agents, steps). A run that only waits for the commit
    // of its end no longer holds a place: the next item starts meanwhile, and its line is
    // still written only once that commit is done.
    // With `--max-cost-usd`, though, a place is let go only once the item's cost is counted,
    // so that no item starts on a budget that is already spent.
    let working = Arc::new(Working {
        early: options.max_cost_usd.is_none(),
        ..Working::default()
    });
    let mut input_done = false;
    let mut stopped: Option<String> = None;
    let mut blocked = false; // an unfinished slot: nothing more is written
    let mut store_failed = false;
    let mut cost_limit = None;
    // The batch's budget, shared by its items' runs: every agent call checks it first and
    // counts against it as it finishes.
    let cap = options
        .max_cost_usd
        .map(|max| Arc::new(CostCap::new(max, "--max-cost-usd")));
    let mut run_options = run_options;
    run_options.shared_budget = cap.clone().map(|c| c as Arc<dyn SharedBudget>);
    let resume_options = ResumeOptions {
        retry_in_doubt: options.retry_in_doubt,
        decision: None,
        decision_for: None,
        allow_changed: options.allow_changed,
        lost: None,
    };
    loop {
        // Start (or settle) lines while there is room.
        while !input_done && stopped.is_none() && working.count() < concurrency && slots.len() < window {
            if controls.pause.is_cancelled() {
                stopped = Some("interrupted (Ctrl-C)".to_string());
                break;
            }
            let Some(mut line) = lines.next_line()? else {
                input_done = true;
                break;
            };
            let seq = next_seq;
            next_seq += 1;
            slots.push_back(Slot::Waiting);
            let previous = earlier.latest(&*engine.store, line.index).await?;
            if let Some(prev) = &previous
                && prev.item_id.as_deref() != Some(line.id.as_str())
            {
                return Err(BatchError::InputChanged {
                    path: options.input.display().to_string(),
                    line: line.index + 1,
                    recorded: prev.item_id.clone().unwrap_or_default(),
                    now: line.id,
                });
            }
            let action = decide(&mut line, previous, &options, &root);
            if let Action::Changed(run) = action {
                return Err(BatchError::InputContentChanged {
                    path: options.input.display().to_string(),
                    line: line.index + 1,
                    id: line.id,
                    run,
                });
            }
            // The budget stops only what would spend: items written from the store still are.
            if let Some(cap) = &cap
                && matches!(action, Action::Start(_) | Action::Resume(_))
                && !options.export_only
                && cap.allows(&cap.spent()).is_err()
            {
                let max = cap.limit;
                slots[(seq - first_slot) as usize] = Slot::Unfinished;
                // Said once the runs in flight have finished (and added their cost): the
                // batch's total, the summary's.
                cost_limit = Some(max);
                stopped = Some(String::new());
                break;
            }
            if options.export_only && matches!(action, Action::Start(_) | Action::Resume(_)) {
                // Nothing runs: the output ends before the first item that is not finished.
                slots[(seq - first_slot) as usize] = Slot::Unfinished;
                stopped = Some(format!(
                    "item `{}` (line {}) has not finished; the `batch` command continues the batch",
                    line.id,
                    line.index + 1
                ));
                break;
            }
            match action {
                Action::Write(status, text, usage) => {
                    count(&progress, status);
                    // The batch's cost is all of it, earlier starts included: the summary says
                    // so, and `--max-cost-usd` bounds the batch, not one start of it.
                    progress.add_cost(&usage);
                    if let Some(cap) = &cap {
                        cap.add(&usage);
                    }
                    progress.reused.fetch_add(1, Ordering::Relaxed);
                    slots[(seq - first_slot) as usize] = Slot::Line(text);
                }
                Action::Fail(message) => {
                    progress.failed.fetch_add(1, Ordering::Relaxed);
                    let e = StepError::new(ErrorKind::Mapping, message);
                    let text = failed_line(&line.id_value, &e, 0);
                    slots[(seq - first_slot) as usize] = Slot::Line(text);
                }
                Action::Start(input) => {
                    let engine = engine.clone();
                    let plan = plan.clone();
                    let run_options = run_options.clone();
                    let context = context.clone();
                    let controls = controls.clone();
                    let item = BatchItem {
                        batch: batch.clone(),
                        id: line.id.clone(),
                        index: line.index,
                    };
                    let t0 = Instant::now();
                    let progress = progress.clone();
                    let (controls, release) = working.start(&controls, &progress);
                    // Boxed: a run's future is large, and moving the box moves a pointer.
                    in_flight.push(tokio::spawn(async move {
                        let state = Arc::new(AgentState::default());
                        let o = Box::pin(engine.run_item(
                            plan,
                            input,
                            context,
                            run_options,
                            state,
                            controls,
                            Some(item),
                        ))
                        .await;
                        // Counted (its cost too) before its place is let go.
                        let done = settle(&progress, &line.id_value, Ok(o), t0);
                        release();
                        (seq, done)
                    }));
                }
                Action::Changed(_) => unreachable!("returned above"),
                Action::Resume(run_id) => {
                    let engine = engine.clone();
                    let plan = plan.clone();
                    let run_options = run_options.clone();
                    let controls = controls.clone();
                    let resume = resume_options.clone();
                    let t0 = Instant::now();
                    let progress = progress.clone();
                    let (controls, release) = working.start(&controls, &progress);
                    in_flight.push(tokio::spawn(async move {
                        let state = Arc::new(AgentState::default());
                        let o = Box::pin(engine.resume(plan, &run_id, run_options, resume, state, controls))
                            .await;
                        let done = settle(&progress, &line.id_value, o, t0);
                        release();
                        (seq, done)
                    }));
                }
            }
        }
        // Write what is ready at the front.
        while !blocked {
            match slots.front() {
                Some(Slot::Line(_)) => {
                    let Some(Slot::Line(text)) = slots.pop_front() else {
                        unreachable!()
                    };
                    first_slot += 1;
                    out.write_all(text.as_bytes()).map_err(out_err)?;
                    out.write_all(b"\n").map_err(out_err)?;
                }
                Some(Slot::Unfinished) => blocked = true,
                _ => break,
            }
        }
        if in_flight.is_empty() && (input_done || stopped.is_some() || blocked) {
            break;
        }
        if in_flight.is_empty() {
            continue;
        }
        // Completions that are ready are taken without waiting; the output is flushed only
        // before the batch would wait.
        let joined = match in_flight.next().now_or_never() {
            Some(j) => j,
            None => {
                out.flush().map_err(out_err)?;
                let room = !input_done && stopped.is_none() && slots.len() < window;
                tokio::select! {
                    j = in_flight.next() => j,
                    // A run let go of its place: start the next item.
                    _ = working.freed.notified(), if room => continue,
                }
            }
        };
        let Some(joined) = joined else {
            continue;
        };
        let (seq, done) = joined.map_err(|e| BatchError::Output {
            path: out_path.clone(),
            message: format!("an item's task failed: {e}"),
        })?;
        let slot = match done {
            Done::Line(text) => Slot::Line(text),
            Done::Unfinished => Slot::Unfinished,
            Done::StoreFailed(why) => {
                // Not the item's failure: what happened is not all on record. Stop, and
                // leave the run to resume once the store works again.
                if !store_failed {
                    store_failed = true;
                    stopped = Some(format!(
                        "the store failed: {why}. Items from here on are not written; \
                         once the store works again, the same command continues"
                    ));
                    controls.pause.cancel();
                }
                Slot::Unfinished
            }
        };
        slots[(seq - first_slot) as usize] = slot;
    }
    if stopped.is_none() && input_done && next_seq < total {
        stopped = Some(format!(
            "{} ended after {next_seq} of the {total} items it had when the batch began: it changed while \
             the batch read it",
            options.input.display()
        ));
    }
    out.flush().map_err(out_err)?;
    if options.sync_output {
        out.get_ref().sync_all().map_err(out_err)?;
    }
    if stopped.is_none() && blocked {
        stopped = Some("interrupted (Ctrl-C)".to_string());
    }
    if let (Some(max), Some(why)) = (cost_limit, &mut stopped)
        && why.is_empty()
    {
        let unknown = progress.cost_unknown_calls.load(Ordering::Relaxed);
        *why = crate::runtime::budget::batch_stopped(max, progress.cost_usd(), unknown);
    }
    let succeeded = progress.succeeded.load(Ordering::Relaxed);
    let failed = progress.failed.load(Ordering::Relaxed);
    let interrupted = progress.interrupted.load(Ordering::Relaxed);
    Ok(Summary {
        total,
        succeeded,
        failed,
        interrupted,
        unfinished: total.saturating_sub(succeeded + failed + interrupted),
        reused: progress.reused.load(Ordering::Relaxed),
        cost_usd: progress.cost_usd(),
        cost_unknown_calls: progress.cost_unknown_calls.load(Ordering::Relaxed),
        abandoned_requests: crate::agents::provider::Providers::global()
            .totals()
            .abandoned
            .saturating_sub(abandoned_before),
        elapsed: started.elapsed(),
        stopped,
        store_failed,
        cost_limit: cost_limit.filter(|_| !store_failed),
    })
}

/// How many items' runs are working, and a wake-up when one lets go of its place.
#[derive(Default)]
struct Working {
    count: AtomicUsize,
    freed: tokio::sync::Notify,
    /// Runs let go of their place when their work is done, not when their task ends.
    early: bool,
}

impl Working {
    fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Counts an item in; returns its controls, which let it go when its run's work is done,
    /// and a call that lets it go if that never happened (idempotent).
    /// `progress` counts it in flight until then: what `--concurrency` bounds.
    fn start(
        self: &Arc<Self>,
        controls: &RunControls,
        progress: &Arc<Progress>,
    ) -> (RunControls, impl Fn() + Send + Sync + 'static) {
        self.count.fetch_add(1, Ordering::AcqRel);
        progress.in_flight.fetch_add(1, Ordering::Relaxed);
        let done = Arc::new(AtomicBool::new(false));
        let release = {
            let working = self.clone();
            let progress = progress.clone();
            move || {
                if !done.swap(true, Ordering::AcqRel) {
                    working.count.fetch_sub(1, Ordering::AcqRel);
                    progress.in_flight.fetch_sub(1, Ordering::Relaxed);
                    working.freed.notify_one();
                }
            }
        };
        let release = Arc::new(release);
        let controls = RunControls {
            released: self.early.then(|| Released(release.clone())),
            ..controls.clone()
        };
        (controls, move || release())
    }
}

/// What a finished item task hands back.
enum Done {
    Line(String),
    /// Paused before it finished: resumed on the next start.
    Unfinished,
    StoreFailed(String),
}

/// Turns a run's outcome into its output line and counts it, on the item's own task (the
/// batch's driver only places lines).
fn settle(
    progress: &Progress,
    id: &Value,
    outcome: Result<RunOutcome, crate::runtime::resume::ResumeError>,
    t0: Instant,
) -> Done {
    match outcome {
        Ok(RunOutcome {
            store_failure: Some(why),
            ..
        }) => Done::StoreFailed(why),
        Ok(o) if o.status == RunStatus::Running => Done::Unfinished,
        Ok(o) => {
            progress.add_cost(&o.usage);
            count(progress, o.status);
            Done::Line(outcome_line(id, &o))
        }
        Err(e) => {
            progress.failed.fetch_add(1, Ordering::Relaxed);
            let e = StepError::new(ErrorKind::Agent, format!("cannot resume: {e}"));
            let ms = t0.elapsed().as_millis() as u64;
            Done::Line(failed_line(id, &e, ms))
        }
    }
}

fn count(progress: &Progress, status: RunStatus) {
    let counter = match status {
        RunStatus::Succeeded => &progress.succeeded,
        RunStatus::Interrupted => &progress.interrupted,
        _ => &progress.failed,
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

enum Action {
    /// Written from the store: (its status, the line, its tokens and cost).
    Write(RunStatus, String, Usage),
    /// A failed item without a run (not JSON, not matching `input.schema`).
    Fail(String),
    Start(Value),
    Resume(String),
    /// The line is not the input its recorded run started from (the run's id).
    Changed(String),
}

/// The name a batch is known by in the store: its output file's canonical path, so that
/// every spelling of one file (through a symlink, with `..`, relative or absolute) is one
/// batch. A batch recorded under its plain absolute path (as batches were named before) keeps
/// that name.
async fn batch_name<S: Store>(store: &S, options: &BatchOptions) -> Result<String, BatchError> {
    let canonical = canonical_path(&options.output, 40)
        .map_err(|e| BatchError::Output {
            path: options.output.display().to_string(),
            message: e.to_string(),
        })?
        .display()
        .to_string();
    if options.fresh_store {
        return Ok(canonical);
    }
    if let Ok(plain) = std::path::absolute(&options.output) {
        let plain = plain.display().to_string();
        if plain != canonical
            && store.batch_runs(&canonical, 0, 1).await?.is_empty()
            && !store.batch_runs(&plain, 0, 1).await?.is_empty()
        {
            return Ok(plain);
        }
    }
    Ok(canonical)
}

/// `path` made absolute with every symlink and `..` resolved, whether or not the file (or
/// its directory) exists yet: the part that exists is resolved by the file system, a dangling
/// symlink is followed to where it points (at most `hops` times), and the rest, which holds
/// no symlinks since it does not exist, is resolved by its components.
fn canonical_path(path: &Path, hops: u32) -> std::io::Result<PathBuf> {
    use std::path::Component;
    let path = std::path::absolute(path)?;
    match std::fs::canonicalize(&path) {
        Ok(p) => return Ok(p),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    let parent = path.parent().unwrap_or(Path::new("/"));
    if let Ok(target) = std::fs::read_link(&path) {
        if hops == 0 {
            return Err(std::io::Error::other("too many levels of symbolic links"));
        }
        return canonical_path(&parent.join(target), hops - 1);
    }
    let mut base = canonical_path(parent, hops)?;
    match path.components().next_back() {
        Some(Component::Normal(name)) => base.push(name),
        Some(Component::ParentDir) => {
            base.pop();
        }
        _ => {}
    }
    Ok(base)
}

/// Whether two paths name one existing file (hard and symbolic links included).
fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        ma.dev() == mb.dev() && ma.ino() == mb.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (ma, mb);
        std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok()
    }
}

fn decide(
    line: &mut Line,
    previous: Option<RunRecord>,
    options: &BatchOptions,
    root: &crate::plan::FlowPlan,
) -> Action {
    if let Some(prev) = previous {
        let in_doubt = prev.error.as_ref().is_some_and(|e| e.kind == ErrorKind::InDoubt);
        // Reusing or continuing the recorded run is right only for the input it started from;
        // a new run (`--retry-failed`) takes the line as it is now.
        let same = matches!(&line.parsed, Ok(v) if *v == prev.input);
        match prev.status {
            RunStatus::Failed | RunStatus::Cancelled if options.retry_failed => {}
            _ if !same => return Action::Changed(prev.id),
            RunStatus::Running => return Action::Resume(prev.id),
            RunStatus::Interrupted if in_doubt && options.retry_in_doubt => return Action::Resume(prev.id),
            status => {
                let text = record_line(&prev, &line.id_value);
                return Action::Write(status, text, prev.usage);
            }
        }
    }
    // The line's value moves into the run.
    let input = match std::mem::replace(&mut line.parsed, Ok(Value::Null)) {
        Ok(v) => v,
        Err(e) => return Action::Fail(e),
    };
    if let Some(schema) = &root.input_schema
        && let Err(v) = schema.check(&input)
    {
        return Action::Fail(format!(
            "line {}: the input does not match `input.schema` {v}",
            line.index + 1
        ));
    }
    Action::Start(input)
}

/// The line of an item written from its run's record; `id` is the line's (the record keeps
/// its text).
pub(crate) fn record_line(r: &RunRecord, id: &Value) -> String {
    let ms = r.finished_at.map(|f| f.saturating_sub(r.started_at)).unwrap_or(0);
    item_line(
        id,
        r.status.as_str(),
        r.output.as_ref(),
        r.error.as_ref(),
        Some(&r.id),
        r.usage,
        ms,
    )
}

fn outcome_line(id: &Value, o: &RunOutcome) -> String {
    item_line(
        id,
        o.status.as_str(),
        o.output.as_ref(),
        o.error.as_ref(),
        Some(&o.run_id),
        o.usage,
        o.duration_ms,
    )
}

/// The line of an item that failed without a run to show.
fn failed_line(id: &Value, e: &StepError, ms: u64) -> String {
    item_line(id, "failed", None, Some(e), None, Usage::default(), ms)
}

fn item_line(
    id: &Value,
    status: &str,
    output: Option<&Value>,
    error: Option<&StepError>,
    run_id: Option<&str>,
    usage: Usage,
    duration_ms: u64,
) -> String {
    /// The line, serialized straight from borrowed parts (no intermediate JSON value).
    #[derive(serde::Serialize)]
    struct ItemLine<'a> {
        id: &'a Value,
        status: &'a str,
        output: Option<&'a Value>,
        error: Option<ErrorLine<'a>>,
        run_id: Option<&'a str>,
        cost_usd: Cost,
        /// Calls whose cost is unknown: written only when there are some.
        #[serde(skip_serializing_if = "crate::runtime::record::is_zero")]
        cost_unknown_calls: u64,
        duration_ms: u64,
    }
    /// As [`StepError::to_json`]: `details` is always there.
    #[derive(serde::Serialize)]
    struct ErrorLine<'a> {
        kind: &'a str,
        message: &'a str,
        details: &'a Option<Value>,
    }
    let line = ItemLine {
        id,
        status,
        output,
        error: error.map(|e| ErrorLine {
            kind: e.kind.as_str(),
            message: &e.message,
            details: &e.details,
        }),
        run_id,
        cost_usd: usage.cost_usd,
        cost_unknown_calls: usage.cost_unknown_calls,
        duration_ms,
    };
    serde_json::to_string(&line).expect("JSON values serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    type Named = Vec<(u64, String)>;

    /// Every line's (index, id) by both readers, or the error each gave.
    fn both(content: &[u8], id_field: &str) -> Result<(Named, Named), (String, String)> {
        let dir = std::env::temp_dir().join(format!("switchyard-lines-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{id_field}.jsonl"));
        std::fs::write(&path, content).unwrap();
        let full = (|| {
            let mut full = Vec::new();
            let mut lines = Lines::open(&path, id_field)?;
            while let Some(l) = lines.next_line()? {
                full.push((l.index, l.id));
            }
            Ok::<_, BatchError>(full)
        })();
        let ids = (|| {
            let mut ids = Vec::new();
            let mut lines = Lines::open(&path, id_field)?;
            while let Some((index, id, _)) = lines.next_id()? {
                ids.push((index, id));
            }
            Ok::<_, BatchError>(ids)
        })();
        std::fs::remove_file(&path).unwrap();
        // Errors name the file by its path here: the message from there on.
        let rest = |e: BatchError| {
            let text = e.to_string();
            text.strip_prefix(&path.display().to_string())
                .map_or(text.clone(), str::to_string)
        };
        match (full, ids) {
            (Ok(full), Ok(ids)) => Ok((full, ids)),
            (full, ids) => Err((
                full.map_or_else(rest, |v| format!("{v:?}")),
                ids.map_or_else(rest, |v| format!("{v:?}")),
            )),
        }
    }

    /// A run is counted in flight while it holds its place: once its work is done (it only
    /// waits for the commit of its end) it is not, so the count never passes `--concurrency`.
    #[test]
    fn a_run_that_let_go_of_its_place_is_not_in_flight() {
        let working = Arc::new(Working {
            early: true,
            ..Working::default()
        });
        let progress = Arc::new(Progress::default());
        let (controls, release) = working.start(&RunControls::default(), &progress);
        let (_, release_b) = working.start(&RunControls::default(), &progress);
        assert_eq!(
            (working.count(), progress.in_flight.load(Ordering::Relaxed)),
            (2, 2)
        );
        // The engine lets go of the place before it waits for the commit.
        let released = controls.released.expect("early release");
        (released.0)();
        assert_eq!(
            (working.count(), progress.in_flight.load(Ordering::Relaxed)),
            (1, 1)
        );
        // The task's own release after it is a no-op; the other run's counts.
        release();
        release_b();
        assert_eq!(
            (working.count(), progress.in_flight.load(Ordering::Relaxed)),
            (0, 0)
        );
    }

    #[test]
    fn reading_only_the_ids_names_every_line_as_parsing_it_does() {
        let content = [
            r#"{"id": "a", "x": {"id": "nested"}, "l": [1, {"id": 2}]}"#,
            r#"{"x": 1, "id": 7}"#,
            r#"{"id": 1.5e3}"#,
            r#"{"id": 18446744073709551615}"#,
            r#"{"id": -3}"#,
            r#"{"i\u0064": "escaped key"}"#,
            r#"{"id": "first", "id": "last"}"#,
            r#"{"id": {"nested": 1}, "id": "after an object"}"#,
            r#"{"no_id": true}"#,
            "",
            "   ",
            r#"["id", "a"]"#,
            r#""id""#,
            "42",
            r#"{"id": "x""#,
            r#"{"id": null"#,
            r#"{"id": "y"} trailing"#,
            r#"{"id": "z", }"#,
            r#"  {"id": "padded"}  "#,
            r#"{"id": "\u00e9t\u00e9"}"#,
        ]
        .join("\n");
        let mut bytes = content.into_bytes();
        bytes.extend_from_slice(b"\n{\"id\": \"bad \xff utf8\"}\n{\"id\": \"last line, no newline\"}");
        let (full, ids) = both(&bytes, "id").unwrap();
        assert_eq!(full, ids);
        // The expected names, to be sure both are right and not merely alike.
        let names: Vec<&str> = ids.iter().map(|(_, id)| id.as_str()).collect();
        assert_eq!(
            names,
            [
                "a",
                "7",
                "1500.0",
                "18446744073709551615",
                "-3",
                "escaped key",
                "last",
                "after an object",
                "9",
                "12",
                "13",
                "14",
                "line:15",
                "line:16",
                "line:17",
                "line:18",
                "padded",
                "été",
                "line:21",
                "last line, no newline"
            ]
        );
        // Another id field.
        let (full, ids) = both(b"{\"key\": \"k1\", \"id\": \"no\"}\n{\"id\": \"k2\"}\n", "key").unwrap();
        assert_eq!(full, ids);
        assert_eq!(ids, [(0, "k1".to_string()), (1, "2".to_string())]);
        // A dotted path names a nested field; a literal key with a dot in it is not it.
        let (full, ids) = both(
            br#"{"ticket": {"id": "T-1", "x": [1]}, "ticket.id": "no"}
{"ticket": {"other": 1}}
{"ticket": "T-3"}
{"ticket": {"id": 4}, "ticket": {"id": "T-4"}}
{"ticket.id": "no", "ticket": {"meta": {"id": 9}, "id": 5}}
"#,
            "ticket.id",
        )
        .unwrap();
        assert_eq!(full, ids);
        let names: Vec<&str> = ids.iter().map(|(_, id)| id.as_str()).collect();
        assert_eq!(names, ["T-1", "2", "3", "T-4", "5"]);
        // A byte order mark opening the file is not part of the first line; elsewhere it is.
        let (full, ids) = both(
            b"\xEF\xBB\xBF{\"id\": \"a\"}\n\xEF\xBB\xBF{\"id\": \"b\"}\n",
            "id",
        )
        .unwrap();
        assert_eq!(full, ids);
        assert_eq!(ids, [(0, "a".to_string()), (1, "line:2".to_string())]);
        // An id field that holds no string or number is an error naming its line, the same
        // from both readers.
        for (line, what) in [
            (r#"{"id": null}"#, "null"),
            (r#"{"id": true}"#, "a boolean"),
            (r#"{"id": {"a": 1}}"#, "an object"),
            (r#"{"id": ["a"]}"#, "an array"),
            (r#"{"id": "first", "id": null}"#, "null"),
        ] {
            let content = format!("{{\"id\": \"ok\"}}\n\n{line}\n");
            let (full, ids) = both(content.as_bytes(), "id").unwrap_err();
            assert_eq!(full, ids);
            assert_eq!(
                full,
                format!(" line 3: the id field `id` is {what}: an id is a string or a number")
            );
        }
    }
}
