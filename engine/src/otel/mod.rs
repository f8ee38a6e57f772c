//! OpenTelemetry export (`--otlp-endpoint URL`, or `OTEL_EXPORTER_OTLP_ENDPOINT`; SPEC §13):
//! traces over OTLP/HTTP, as the official protobuf messages, written by [`wire`] straight from
//! the records (the tests decode them with `opentelemetry-proto`).
//!
//! The exporter is the process's [`Observer`]: it gathers each run tree's records as the
//! engine makes them — whatever the store keeps, the throwaway store of a batch included — and
//! when a root run ends turns them into spans: one per run, step, iteration, model turn and tool
//! call, with the flow, step id, number, kind, attempt, status, error kind, tokens and cost as
//! attributes, and the route each step took as an event. Model calls and tool calls follow
//! OpenTelemetry's GenAI conventions ([`encode_step`]): a turn is `chat {model}`, a tool call
//! `execute_tool {tool}`, an `llm` step's call a `chat {model}` span under the step's. Times
//! are the records' nanoseconds when the engine made them here, else their milliseconds
//! ([`record::nanos`]). The resource names the service and its version, the host, the process
//! and a worker's id ([`Exporter::set_worker`]). A child run's span is a child of the
//! record that called it (its step, or the iteration); a record numbered under another of its
//! run (an agent loop's turn `3.t2`, a tool call `3.t2.1`) is that one's child. Each root run is
//! a trace of its own (a batch is one trace per item), its id derived from the run's id, and
//! span ids and parents from the records' keys alone, so a run resumed later, here or in
//! another process, continues the same tree.
//!
//! Each span is sent once, by the process that finished its record: an `interrupted` record
//! makes none (whoever goes on finishes it), a run's span is sent by the process that ends it
//! (a root stopped `interrupted` sends its finished records without it), and a tree whose root
//! paused, or whose end could not be recorded (its lease taken over, the store failing), is
//! dropped whole: the process that takes it over is handed its finished records as they replay
//! ([`Observer::replayed`]) and sends them.
//!
//! Nothing of it waits on the collector: finished trees go through a bounded queue to a thread
//! of the exporter's own, woken once several requests' worth waits (or after a quiet while), which
//! writes their spans and posts them in batches; a full queue, a tree too big to hold, or a
//! collector that does not answer drops spans, and [`Exporter::finish`] (called before the
//! process exits, within a few seconds) says how many and why.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod capture;
mod wire;

use capture::{Finished, McpNotes, Parts, RunPart, Started, StepPart, Tree, TreeView};
use wire::{Encoder, SpanIn, Val};

use crate::record::{RunRecord, RunStatus, StepRecord, StepStatus};
use crate::runtime::observe::{Observer, Watch};

/// Finished trees waiting for the exporter's thread, at most: twice [`WAKE`], the most trees
/// that can wait when the thread is woken (a tree holds one record at least), so that a
/// thread slow to wake still loses none.
const QUEUE: usize = 2 * WAKE;
/// How long finished trees wait for the exporter's thread when fewer than [`WAKE`] records
/// are waiting.
const LINGER: Duration = Duration::from_millis(200);
/// The most records one run tree keeps for its spans; the rest are dropped (and counted).
const TREE_RECORDS: usize = 50_000;
/// Spans per request.
const BATCH: usize = 2048;
/// Records waiting that wake the exporter's thread (which then sends them all, [`BATCH`]
/// spans a request). Each wake-up costs the runs' thread: on W2, waking every 2,048 records
/// instead cost about 0.7 points more of overhead. At most [`QUEUE`] trees wait.
const WAKE: usize = 8 * BATCH;
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What the runs' tasks and the exporter's thread share: finished trees on their way to the
/// exporter's thread, and the emptied trees of ended runs for the next runs. A tree being
/// filled is not here: its runs hold it ([`Open`]), so a record finds its tree without a
/// lookup.
#[derive(Default)]
struct Trees {
    /// The trees whose root ended, copied out, for the exporter's thread, which takes them
    /// all at once: it is woken once [`WAKE`] records wait (or after
    /// [`LINGER`]), never per run, so a run's end costs no thread wake-up.
    finished: Finished,
    /// No more trees come ([`Exporter::finish`]).
    closed: bool,
    /// Spans handed to the exporter's thread so far (counted here, under the lock a tree's
    /// end takes anyway, rather than in [`ExportStats`]).
    handed: u64,
}

/// Spare trees kept at most, per thread.
const SPARE: usize = 64;

thread_local! {
    /// The watches of the trees that ended on this thread, taken last in first out once their
    /// runs let go of them: a new run fills the buffer an ended run just emptied, still in
    /// the core's cache, and neither allocates its watch nor takes a lock to find it.
    /// (Buffers that went round the exporter's thread first came back cold, and filling them
    /// cost more than the rest of the capture.)
    static SPARES: std::cell::RefCell<Vec<Arc<Open>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keeps the watch of a tree that ended (emptied) for a next tree on this thread.
fn keep_spare(watch: &Watch) {
    let Some(open) = watch.clone().and_then(|w| Arc::downcast::<Open>(w).ok()) else {
        return;
    };
    // A thread being torn down keeps nothing (its spares are gone already).
    let _ = SPARES.try_with(|spares| {
        let mut spares = spares.borrow_mut();
        if spares.len() < SPARE {
            spares.push(open);
        }
    });
}

/// The watch of a new tree for root run `root`, its records' times counted from `base`: a
/// spare one when this thread has one its runs let go of.
fn open_tree(root: &str, base: u64, late: bool) -> Arc<Open> {
    let spare = SPARES
        .try_with(|spares| {
            let mut spares = spares.borrow_mut();
            // One still held (a run that has not let go of its watch yet) is left to it.
            while let Some(mut open) = spares.pop() {
                if let Some(o) = Arc::get_mut(&mut open) {
                    let slot = o.slot.get_mut().unwrap_or_else(|p| p.into_inner());
                    slot.tree.start(root, base);
                    slot.open = true;
                    slot.late = late;
                    return Some(open);
                }
            }
            None
        })
        .ok()
        .flatten();
    spare.unwrap_or_else(|| {
        Arc::new(Open {
            slot: Mutex::new(Slot {
                tree: Tree::new(root, base),
                open: true,
                late,
            }),
        })
    })
}

/// A run tree being filled: the watch ([`Watch`]) every run of the tree holds. Its lock is
/// taken by the tree's own runs only (several at once under a `foreach` of child runs), never
/// by the exporter's thread.
struct Open {
    slot: Mutex<Slot>,
}

struct Slot {
    tree: Tree,
    /// False once the root ended, paused or was lost: what comes after is not exported.
    open: bool,
    /// Started after [`Exporter::finish`]: its records are counted as dropped when it ends.
    late: bool,
}

impl Open {
    fn of(watch: &Watch) -> Option<&Open> {
        watch.as_deref().and_then(|w| w.downcast_ref::<Open>())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with(&self, f: impl FnOnce(&mut Tree)) {
        let mut slot = self.lock();
        if slot.open {
            f(&mut slot.tree);
        }
    }
}

/// Counts of what the exporter did.
#[derive(Debug, Default)]
pub struct ExportStats {
    pub exported: AtomicU64,
    pub dropped: AtomicU64,
    /// Spans of those whose request ended, taken or not.
    pub settled: AtomicU64,
    /// Why the last spans were dropped.
    pub last_error: Mutex<Option<String>>,
}

/// What every request says of the process that sends its spans (the OTLP resource): the
/// service and its version, the host, the process and, on a `worker`, the worker's id.
struct Resource {
    host: String,
    pid: u64,
    /// Set once by [`Exporter::set_worker`].
    worker: std::sync::OnceLock<String>,
}

impl Resource {
    fn attributes(&self) -> Vec<(&str, Val<'_>)> {
        let mut a = vec![
            ("service.name", Val::S("switchyard")),
            ("service.version", Val::S(env!("CARGO_PKG_VERSION"))),
            ("host.name", Val::S(&self.host)),
            ("process.pid", Val::I(self.pid)),
        ];
        if let Some(w) = self.worker.get() {
            a.extend([
                ("service.instance.id", Val::S(w)),
                ("switchyard.worker.id", Val::S(w)),
            ]);
        }
        a
    }
}

/// The process's span exporter.
pub struct Exporter {
    url: String,
    resource: Arc<Resource>,
    trees: Arc<Mutex<Trees>>,
    /// Wakes the exporter's thread.
    wake: Arc<std::sync::Condvar>,
    stats: Arc<ExportStats>,
    done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    /// [`Trees::closed`], read without its lock as a run starts.
    closed: std::sync::atomic::AtomicBool,
}

/// The traces URL of an OTLP/HTTP endpoint: as given when it names a path, else with
/// `/v1/traces` (what `OTEL_EXPORTER_OTLP_ENDPOINT` means).
pub fn traces_url(endpoint: &str) -> Result<String, String> {
    let e = endpoint.trim();
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .ok_or_else(|| {
            format!("--otlp-endpoint `{endpoint}`: an http:// or https:// URL, such as http://127.0.0.1:4318")
        })?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("--otlp-endpoint `{endpoint}`: the URL names no host"));
    }
    Ok(match rest.find('/') {
        Some(i) if rest[i..].trim_end_matches('/').len() > 1 => e.to_string(),
        _ => format!("{}/v1/traces", e.trim_end_matches('/')),
    })
}

impl Exporter {
    /// Starts the exporter's thread, posting to `endpoint` ([`traces_url`]).
    pub fn start(endpoint: &str) -> Result<Arc<Exporter>, String> {
        let url = traces_url(endpoint)?;
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let stats = Arc::new(ExportStats::default());
        let trees = Arc::new(Mutex::new(Trees {
            finished: Finished::new(),
            ..Trees::default()
        }));
        let wake = Arc::new(std::sync::Condvar::new());
        let resource = Arc::new(Resource {
            host: crate::store::writers::host_name(),
            pid: u64::from(std::process::id()),
            worker: std::sync::OnceLock::new(),
        });
        let exporter = Arc::new(Exporter {
            url: url.clone(),
            resource: resource.clone(),
            trees: trees.clone(),
            wake: wake.clone(),
            stats: stats.clone(),
            done: Mutex::new(Some(done_rx)),
            closed: std::sync::atomic::AtomicBool::new(false),
        });
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                    return;
                };
                let mut enc = Encoder::default();
                // The queue's buffer, swapped with the shared one: emptied here and given back,
                // so that queueing a tree does not grow a new buffer on the runs' threads.
                let mut taken = Finished::new();
                loop {
                    let closed = {
                        let mut t = trees.lock().unwrap_or_else(|p| p.into_inner());
                        if !t.closed && t.finished.records < WAKE {
                            t = wake.wait_timeout(t, LINGER).unwrap_or_else(|p| p.into_inner()).0;
                        }
                        std::mem::swap(&mut t.finished, &mut taken);
                        t.closed
                    };
                    // Spans are made here, off the runs' threads; a request goes as soon as it
                    // is full, and once woken (`WAKE` records, or after a quiet while)
                    // all the rest goes too.
                    let mut full = |enc: &mut Encoder| {
                        rt.block_on(post(&url, enc.request(&resource.attributes()), &stats))
                    };
                    for tree in taken.views() {
                        encode_tree(tree, &mut enc, &mut full);
                    }
                    taken.clear();
                    if enc.count() > 0 {
                        full(&mut enc);
                    }
                    if closed {
                        break;
                    }
                }
                let _ = done_tx.send(());
            })
            .map_err(|e| format!("cannot start the OTLP exporter: {e}"))?;
        Ok(exporter)
    }

    pub fn stats(&self) -> &ExportStats {
        &self.stats
    }

    /// Names the worker this process is (`switchyard worker`) in every request from now on,
    /// as `service.instance.id` and `switchyard.worker.id`; once, before its first run.
    pub fn set_worker(&self, id: &str) {
        let _ = self.resource.worker.set(id.to_string());
    }

    /// Where spans go.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends what is left, waiting at most `within` for the collector; the counts after.
    pub fn finish(&self, within: Duration) -> (u64, u64, Option<String>) {
        {
            let mut t = self.trees.lock().unwrap_or_else(|p| p.into_inner());
            // Trees whose root never ended here are left to the process that goes on with
            // them: it ends their records, and is handed those made here.
            t.closed = true;
            self.closed.store(true, Ordering::Relaxed);
        }
        self.wake.notify_one();
        if let Some(done) = self.done.lock().unwrap_or_else(|p| p.into_inner()).take()
            && done.recv_timeout(within).is_err()
        {
            *self.stats.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(format!("the collector did not take everything within {within:?}"));
        }
        // Spans still queued or in a request the collector has not answered are not exported
        // either: they are counted with the dropped ones.
        let handed = self.trees.lock().unwrap_or_else(|p| p.into_inner()).handed;
        let settled = self.stats.settled.load(Ordering::Relaxed);
        let unsent = handed.saturating_sub(settled);
        (
            self.stats.exported.load(Ordering::Relaxed),
            self.stats.dropped.load(Ordering::Relaxed) + unsent,
            self.stats
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }

    /// Hands a finished tree to the exporter's thread (a copy: its buffers are kept for the
    /// next tree), or counts its records as dropped when [`QUEUE`] trees wait already (or the
    /// exporter has finished); true when [`WAKE`] records wait, and the thread
    /// should be woken.
    fn queue(t: &mut Trees, tree: &Tree, stats: &ExportStats) -> bool {
        let n = tree.records();
        if n == 0 {
            return false;
        }
        if t.closed || t.finished.trees >= QUEUE || !Finished::fits(tree) {
            stats.dropped.fetch_add(n as u64, Ordering::Relaxed);
            *stats.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(if t.closed {
                "the exporter had finished".into()
            } else if t.finished.trees >= QUEUE {
                "the export queue was full".into()
            } else {
                "a run tree was too big to export".into()
            });
            return false;
        }
        t.handed += n as u64;
        let before = t.finished.records;
        t.finished.push(tree);
        // Once, as the count reaches `WAKE`: the thread then takes them all.
        before < WAKE && t.finished.records >= WAKE
    }
}

/// Posts a request body of `n` spans ([`Encoder::request`]).
async fn post(url: &str, (body, n): (Vec<u8>, usize), stats: &ExportStats) {
    let n = n as u64;
    let result = match crate::agents::net::client() {
        Ok(client) => client
            .post(url)
            .header("content-type", "application/x-protobuf")
            .timeout(REQUEST_TIMEOUT)
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| {
                if r.status().is_success() {
                    Ok(())
                } else {
                    Err(format!("the collector answered {}", r.status()))
                }
            }),
        Err(e) => Err(e.message),
    };
    match result {
        Ok(()) => {
            stats.exported.fetch_add(n, Ordering::Relaxed);
        }
        Err(e) => {
            stats.dropped.fetch_add(n, Ordering::Relaxed);
            *stats.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
    }
    stats.settled.fetch_add(n, Ordering::Relaxed);
}

impl Observer for Exporter {
    fn run_started(&self, run: &RunRecord, above: &Watch) -> Watch {
        // A child run joins its parent's tree.
        if run.parent_run.is_some()
            && let Some(open) = Open::of(above)
        {
            open.with(|tree| tree.push_started(run));
            return above.clone();
        }
        // A root run (or, never from the engine, a child run started by a run not watched
        // here) starts a tree of its own.
        let root = run.parent_run.as_deref().unwrap_or(&run.id);
        let late = self.closed.load(Ordering::Relaxed);
        let open = open_tree(root, crate::record::nanos(run.started_at, run.started_ns), late);
        // The root's own start is told by its run's record, or, if it does not end here, at
        // its stop ([`Observer::run_ended`]).
        if run.id != root {
            open.with(|tree| tree.push_started(run));
        }
        Some(open)
    }

    fn step(&self, watch: &Watch, s: &StepRecord) {
        // An `interrupted` record is a stop, not an end: the process that resumes the part
        // finishes its record, and its span.
        if s.status != StepStatus::Interrupted {
            self.push_step(watch, s);
        }
    }

    fn replayed(&self, watch: &Watch, s: &StepRecord) {
        self.push_step(watch, s);
    }

    fn run_ended(&self, watch: &Watch, run: &RunRecord) {
        let Some(open) = Open::of(watch) else {
            return;
        };
        // Only an end finishes a run's record: a run stopped `interrupted` or paused is ended
        // by whoever goes on with it.
        let ended = matches!(
            run.status,
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled
        );
        if run.parent_run.is_some() {
            if ended {
                open.with(|tree| tree.push_run(run));
            }
            return;
        }
        let wake = {
            let mut slot = open.lock();
            if !slot.open {
                return;
            }
            slot.open = false;
            // Paused: nothing of it was stopped on record, so the next holder is handed its
            // records as they replay.
            let wake = run.status != RunStatus::Running && {
                if ended {
                    slot.tree.push_run(run);
                } else {
                    slot.tree.push_started(run);
                }
                let mut t = self.trees.lock().unwrap_or_else(|p| p.into_inner());
                // Open as the exporter finished: left to the process that goes on with it.
                (!t.closed || slot.late) && Self::queue(&mut t, &slot.tree, &self.stats)
            };
            // Copied out: its buffer is kept for the next tree.
            slot.tree.clear();
            wake
        };
        keep_spare(watch);
        if wake {
            self.wake.notify_one();
        }
    }

    fn run_unrecorded(&self, watch: &Watch, run: &RunRecord) {
        // Lost (its lease taken over) or cut off by the store: this process exports nothing
        // of the tree; the next holder is handed what was recorded of it.
        if run.parent_run.is_none()
            && let Some(open) = Open::of(watch)
        {
            let mut slot = open.lock();
            if slot.open {
                slot.open = false;
                slot.tree.clear();
                drop(slot);
                keep_spare(watch);
            }
        }
    }
}

impl Exporter {
    fn push_step(&self, watch: &Watch, s: &StepRecord) {
        let Some(open) = Open::of(watch) else {
            return;
        };
        open.with(|tree| {
            if tree.n_steps >= TREE_RECORDS {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            } else {
                tree.push_step(s);
            }
        });
    }
}

/// A stable 64-bit hash of `parts` (FNV-1a over each part and a separator, then a
/// SplitMix64 finalizer), seeded: span and trace ids derived from run ids and record keys, the
/// same in every process and every build, so that a run resumed elsewhere joins its trace.
/// Not a cryptographic hash: ids need to be distinct and well spread, not secret.
fn hash(seed: u64, parts: &[&[u8]]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for p in parts {
        for &byte in *p {
            h = (h ^ u64::from(byte)).wrapping_mul(PRIME);
        }
        h = (h ^ 0xff).wrapping_mul(PRIME);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    // An all-zero id is invalid in OTLP.
    h.max(1)
}

/// The trace id of root run `root`.
pub fn trace_id(root: &str) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&hash(1, &[b"trace", root.as_bytes()]).to_be_bytes());
    id[8..].copy_from_slice(&hash(2, &[b"trace", root.as_bytes()]).to_be_bytes());
    id
}

fn run_span_id(run: &str) -> [u8; 8] {
    hash(3, &[b"run", run.as_bytes()]).to_be_bytes()
}

/// The span id of the record of part `number` (an iteration of it, when given) of run `run`:
/// the same whichever attempt, and whichever process, finishes the record.
fn step_span_id(run: &str, number: &str, iteration: Option<u64>) -> [u8; 8] {
    let iteration = iteration.map_or([0xff; 8], u64::to_le_bytes);
    hash(4, &[b"step", run.as_bytes(), number.as_bytes(), &iteration]).to_be_bytes()
}

/// `2[3]` (what an iteration numbers its parts under) as `2` and iteration 3; `2` as itself.
fn split_iteration(number: &str) -> (&str, Option<u64>) {
    if let Some(head) = number.strip_suffix(']')
        && let Some((n, i)) = head.rsplit_once('[')
        && let Ok(i) = i.parse()
    {
        return (n, Some(i));
    }
    (number, None)
}

/// The span a record's span is a child of, from its key alone (so that it is the same in
/// whichever process the parent's record finished, or will): an iteration's is its loop's
/// record; a part numbered under another of its run (`3.t2` under `3`, `3.t2.1` under `3.t2`,
/// `2[1].t1` under iteration 1 of `2`) is that one's; a step of the run (`3`, or `2.3` in a run
/// whose steps are numbered under `2`) is the run's.
fn parent_span_id(run: &str, prefix: &str, number: &str, iteration: Option<u64>) -> [u8; 8] {
    if iteration.is_some() {
        return step_span_id(run, number, None);
    }
    match number.rsplit_once('.') {
        Some((up, _)) if up != prefix => {
            let (n, i) = split_iteration(up);
            step_span_id(run, n, i)
        }
        _ => run_span_id(run),
    }
}

/// The runs that started in a tree's process: each one's step-number prefix and flow.
struct Lineage<'a> {
    all: Vec<Started<'a>>,
    /// For trees of many runs.
    index: HashMap<&'a str, (&'a str, &'a str)>,
}

impl<'a> Lineage<'a> {
    /// The runs that started in `tree`, of which `runs` ended there: the root is among them
    /// by its record, unless it did not end here.
    fn of(root: &str, mut all: Vec<Started<'a>>, runs: &[RunPart<'a>]) -> Lineage<'a> {
        if !all.iter().any(|(id, _)| *id == root)
            && let Some(root) = runs.iter().find(|r| r.id == root)
        {
            all.push((root.id, (root.parent_step.unwrap_or(""), root.flow)));
        }
        let index = if all.len() > 16 {
            all.iter().copied().collect()
        } else {
            HashMap::new()
        };
        Lineage { all, index }
    }

    /// The prefix and flow of run `id` (empty if it did not start here, which the engine
    /// never does).
    fn get(&self, id: &str) -> (&'a str, &'a str) {
        let found = if self.index.is_empty() {
            self.all.iter().find(|(r, _)| *r == id).map(|(_, v)| *v)
        } else {
            self.index.get(id).copied()
        };
        found.unwrap_or(("", ""))
    }
}

/// What OpenTelemetry's GenAI conventions call the provider of every model call: the `llm`
/// agent speaks OpenAI's chat-completions protocol to whatever server its provider names, and
/// the conventions name the protocol's system when the client cannot know the server behind it
/// (a gateway, vLLM, llama.cpp's server).
const GEN_AI_PROVIDER: &str = "openai";

/// The span id of a plain step's MCP call (`tools/call {tool}`).
fn call_span_id(run: &str, number: &str, iteration: Option<u64>) -> [u8; 8] {
    let iteration = iteration.map_or([0xff; 8], u64::to_le_bytes);
    hash(6, &[b"tools/call", run.as_bytes(), number.as_bytes(), &iteration]).to_be_bytes()
}

/// The span id of the `chat` span under the record of a model call that is not a loop's turn
/// (an `llm` step, iteration, branch or tool): made from the same record, so sent with it.
fn chat_span_id(run: &str, number: &str, iteration: Option<u64>) -> [u8; 8] {
    let iteration = iteration.map_or([0xff; 8], u64::to_le_bytes);
    hash(5, &[b"chat", run.as_bytes(), number.as_bytes(), &iteration]).to_be_bytes()
}

/// Writes the spans of a finished run tree into `enc`, calling `full` whenever a request's
/// worth ([`BATCH`]) is written.
fn encode_tree(tree: TreeView<'_>, enc: &mut Encoder, full: &mut dyn FnMut(&mut Encoder)) {
    let Parts { runs, steps, started } = tree.parts();
    let lineage = Lineage::of(tree.root, started, &runs);
    let trace = trace_id(tree.root);
    let mut attributes: Vec<(&str, Val<'_>)> = Vec::with_capacity(16);
    for r in &runs {
        // A child run's span is a child of the record that started it.
        let parent = r.parent_run.map(|p| match r.parent_step {
            Some(number) => {
                let (n, i) = split_iteration(number);
                step_span_id(p, n, i)
            }
            None => run_span_id(p),
        });
        attributes.clear();
        attributes.extend([
            ("switchyard.run_id", r.id.into()),
            ("switchyard.flow", r.flow.into()),
            ("switchyard.status", r.status.into()),
            ("switchyard.usage.input_tokens", r.tokens.0.into()),
            ("switchyard.usage.output_tokens", r.tokens.1.into()),
            ("switchyard.cost_usd", r.cost_usd.into()),
        ]);
        if r.cost_unknown_calls > 0 {
            attributes.push(("switchyard.cost_unknown_calls", r.cost_unknown_calls.into()));
        }
        if let Some((kind, _)) = r.error {
            attributes.push(("switchyard.error.kind", kind.into()));
        }
        if let Some(b) = r.batch {
            attributes.push(("switchyard.batch", b.into()));
        }
        if let Some(i) = r.item_id {
            attributes.push(("switchyard.item_id", i.into()));
        }
        wire::name(enc.name(), "run", r.flow, None);
        enc.span(&SpanIn {
            trace_id: &trace,
            span_id: &run_span_id(r.id),
            parent_span_id: parent.as_ref().map_or(&[][..], |p| &p[..]),
            start_ns: r.start_ns,
            end_ns: r.end_ns.unwrap_or(r.start_ns).max(r.start_ns),
            attributes: &attributes,
            route: None,
            error: r.error.filter(|_| r.status == RunStatus::Failed.as_str()),
            client: false,
        });
        if enc.count() >= BATCH {
            full(enc);
        }
    }
    for s in &steps {
        let (prefix, flow) = lineage.get(s.run_id);
        encode_step(s, prefix, flow, &trace, enc, &mut attributes);
        if enc.count() >= BATCH {
            full(enc);
        }
    }
}

/// The span of step record `s` (of a run whose steps are numbered under `prefix`, of flow
/// `flow`) and, when it is a model call that is not a loop's turn, its `chat` span.
///
/// Names and attributes follow OpenTelemetry's GenAI conventions where they apply: a loop's
/// turn is `chat {model}` and a tool call `execute_tool {tool}`, with the `gen_ai.*`
/// attributes; other records are `step {id}`, `iteration {id} [i]` or `approval {number}`.
/// `gen_ai.usage.*` is only on model calls' spans, so that a backend that adds them up per
/// trace counts each call once; the spans that roll tokens up (runs, steps, iterations, tool
/// calls) have `switchyard.usage.*`.
fn encode_step<'a>(
    s: &StepPart<'a>,
    prefix: &str,
    flow: &'a str,
    trace: &[u8; 16],
    enc: &mut Encoder,
    attributes: &mut Vec<(&'a str, Val<'a>)>,
) {
    let parent = parent_span_id(s.run_id, prefix, s.number, s.iteration);
    let span_id = step_span_id(s.run_id, s.number, s.iteration);
    let turn = s.kind == "turn" && s.iteration.is_none();
    let tool = s.kind == "tool" && s.iteration.is_none();
    attributes.clear();
    let out = enc.name();
    match (s.kind, s.iteration) {
        (_, Some(i)) => wire::name(out, "iteration", s.step, Some(i)),
        _ if turn => chat_name(out, s.model),
        _ if tool => {
            // A call that names no tool (the model left it out) is `execute_tool` alone.
            let name = s.tool.filter(|t| !t.is_empty());
            out.push_str("execute_tool");
            if let Some(name) = name {
                out.push(' ');
                out.push_str(name);
            }
            attributes.extend([
                ("gen_ai.operation.name", "execute_tool".into()),
                ("gen_ai.tool.type", "function".into()),
            ]);
            if let Some(name) = name {
                attributes.push(("gen_ai.tool.name", name.into()));
            }
            if let Some(id) = s.call_id {
                attributes.push(("gen_ai.tool.call.id", id.into()));
            }
            // An MCP tool's call: the MCP attributes on the `execute_tool` span itself, as the
            // conventions ask when a GenAI span already traces the call.
            mcp_attributes(&s.mcp, attributes);
        }
        ("approval", _) => wire::name(
            out,
            "approval",
            s.number.strip_suffix(".approval").unwrap_or(s.number),
            None,
        ),
        _ => wire::name(out, "step", s.step, None),
    }
    if turn {
        chat_attributes(s, attributes);
    }
    attributes.extend([
        ("switchyard.run_id", s.run_id.into()),
        ("switchyard.flow", flow.into()),
        ("switchyard.step", s.step.into()),
        ("switchyard.number", s.number.into()),
        ("switchyard.kind", s.kind.into()),
        ("switchyard.attempt", u64::from(s.attempt).into()),
        ("switchyard.status", s.status.into()),
    ]);
    if !turn {
        attributes.extend([
            ("switchyard.usage.input_tokens", s.tokens.0.into()),
            ("switchyard.usage.output_tokens", s.tokens.1.into()),
        ]);
    }
    attributes.push(("switchyard.cost_usd", s.cost_usd.into()));
    if s.cost_unknown_calls > 0 {
        attributes.push(("switchyard.cost_unknown_calls", s.cost_unknown_calls.into()));
    }
    if let Some(i) = s.iteration {
        attributes.push(("switchyard.iteration", i.into()));
    }
    let failed = s.error.filter(|_| s.status == StepStatus::Failed.as_str());
    if let Some((kind, _)) = s.error {
        attributes.push(("switchyard.error.kind", kind.into()));
    }
    if let Some((kind, _)) = failed.filter(|_| turn || tool) {
        attributes.push(("error.type", kind.into()));
    }
    let end_ns = s.end_ns.unwrap_or(s.start_ns).max(s.start_ns);
    enc.span(&SpanIn {
        trace_id: trace,
        span_id: &span_id,
        parent_span_id: &parent,
        start_ns: s.start_ns,
        end_ns,
        attributes,
        route: s.route,
        error: failed,
        client: false,
    });
    // A plain step's MCP call: its `tools/call {tool}` span under the record's.
    if !tool && let Some(name) = s.mcp.tool {
        attributes.clear();
        let out = enc.name();
        out.push_str("tools/call ");
        out.push_str(name);
        attributes.extend([
            ("gen_ai.operation.name", "execute_tool".into()),
            ("gen_ai.tool.name", name.into()),
        ]);
        mcp_attributes(&s.mcp, attributes);
        attributes.extend([
            ("switchyard.run_id", s.run_id.into()),
            ("switchyard.flow", flow.into()),
            ("switchyard.step", s.step.into()),
        ]);
        let failed = failed.filter(|(kind, _)| *kind != "mapping");
        if let Some((kind, _)) = failed {
            attributes.push(("error.type", kind.into()));
        }
        enc.span(&SpanIn {
            trace_id: trace,
            span_id: &call_span_id(s.run_id, s.number, s.iteration),
            parent_span_id: &span_id,
            start_ns: s.start_ns,
            end_ns,
            attributes,
            route: None,
            error: failed,
            client: true,
        });
        return;
    }
    // A model call that is not a turn: its `chat` span under the record's, at the record's
    // times (its requests, retries and repairs included, are the call).
    if turn || s.model.is_none() {
        return;
    }
    attributes.clear();
    chat_name(enc.name(), s.model);
    chat_attributes(s, attributes);
    attributes.extend([
        ("switchyard.run_id", s.run_id.into()),
        ("switchyard.flow", flow.into()),
        ("switchyard.step", s.step.into()),
    ]);
    // An output that could not be mapped fails the step, not the call.
    let failed = failed.filter(|(kind, _)| *kind != "mapping");
    if let Some((kind, _)) = failed {
        attributes.push(("error.type", kind.into()));
    }
    enc.span(&SpanIn {
        trace_id: trace,
        span_id: &chat_span_id(s.run_id, s.number, s.iteration),
        parent_span_id: &span_id,
        start_ns: s.start_ns,
        end_ns,
        attributes,
        route: None,
        error: failed,
        client: false,
    });
}

/// OpenTelemetry's MCP attributes of a call (none when the record is no MCP call): the method,
/// the transport, the protocol revision and an HTTP server's address and port. The session's
/// id is not among them: the SDK does not tell it.
fn mcp_attributes<'a>(m: &McpNotes<'a>, attributes: &mut Vec<(&'a str, Val<'a>)>) {
    if m.tool.is_none() {
        return;
    }
    attributes.push(("mcp.method.name", "tools/call".into()));
    for (key, value) in [
        ("network.transport", m.transport),
        ("mcp.protocol.version", m.protocol),
        ("server.address", m.address),
        ("switchyard.mcp.server", m.server),
    ] {
        if let Some(v) = value {
            attributes.push((key, v.into()));
        }
    }
    if m.transport == Some("tcp") {
        attributes.push(("network.protocol.name", "http".into()));
    }
    if let Some(port) = m.port.and_then(|p| p.parse::<u64>().ok()) {
        attributes.push(("server.port", port.into()));
    }
}

/// `chat {model}`, or `chat` when the model is not known (a flow test's mock).
fn chat_name(out: &mut String, model: Option<&str>) {
    out.push_str("chat");
    if let Some(m) = model.filter(|m| !m.is_empty()) {
        out.push(' ');
        out.push_str(m);
    }
}

/// The GenAI attributes of a model call's span.
fn chat_attributes<'a>(s: &StepPart<'a>, attributes: &mut Vec<(&'a str, Val<'a>)>) {
    attributes.extend([
        ("gen_ai.operation.name", "chat".into()),
        ("gen_ai.provider.name", GEN_AI_PROVIDER.into()),
        ("gen_ai.system", GEN_AI_PROVIDER.into()),
        ("gen_ai.usage.input_tokens", s.tokens.0.into()),
        ("gen_ai.usage.output_tokens", s.tokens.1.into()),
    ]);
    if let Some(m) = s.model {
        attributes.push(("gen_ai.request.model", m.into()));
    }
    if let Some(m) = s.response_model {
        attributes.push(("gen_ai.response.model", m.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The address of a watch's tree, and its root and count of records.
    fn slot_of(watch: &Watch) -> (usize, String, usize) {
        let open = Open::of(watch).expect("a tree's watch");
        let slot = open.lock();
        let root = slot.tree.view().root.to_string();
        (std::ptr::from_ref(open) as usize, root, slot.tree.records())
    }

    #[test]
    fn a_spare_tree_is_taken_again_only_once_its_runs_let_go_of_it_and_empty() {
        let record = |run_id: &str| StepRecord {
            run_id: run_id.into(),
            ..crate::store::tests::step("1", 1, None, StepStatus::Succeeded)
        };
        let first: Watch = Some(open_tree("r1", 0, false));
        Open::of(&first).unwrap().with(|t| t.push_step(&record("r1")));
        let (at, root, records) = slot_of(&first);
        assert_eq!((root.as_str(), records), ("r1", 1));
        // Ended, but its run still holds it: the next tree is another.
        Open::of(&first).unwrap().lock().tree.clear();
        keep_spare(&first);
        let second: Watch = Some(open_tree("r2", 0, false));
        assert_ne!(slot_of(&second).0, at);
        // The first tree's record never reaches the second.
        Open::of(&first).unwrap().with(|t| t.push_step(&record("r1")));
        assert_eq!(slot_of(&second).2, 0);
        // Let go of: the next tree takes it, emptied, for its own root.
        let (at, _, _) = slot_of(&second);
        Open::of(&second).unwrap().lock().tree.clear();
        keep_spare(&second);
        drop(second);
        let third: Watch = Some(open_tree("r3", 0, true));
        assert_eq!(slot_of(&third), (at, "r3".to_string(), 0));
        let slot = Open::of(&third).unwrap().lock();
        assert!(slot.open && slot.late);
    }

    #[test]
    fn a_records_parent_follows_from_its_key_alone() {
        // In root run `r`: a step, a loop's turn and its tool call, an iteration, a turn of
        // an iteration's loop.
        assert_eq!(parent_span_id("r", "", "3", None), run_span_id("r"));
        assert_eq!(
            parent_span_id("r", "", "3.t2", None),
            step_span_id("r", "3", None)
        );
        assert_eq!(
            parent_span_id("r", "", "3.t2.1", None),
            step_span_id("r", "3.t2", None)
        );
        assert_eq!(
            parent_span_id("r", "", "2", Some(4)),
            step_span_id("r", "2", None)
        );
        assert_eq!(
            parent_span_id("r", "", "2[4].t1", None),
            step_span_id("r", "2", Some(4))
        );
        // In child run `c`, started by iteration 4 of step 2.
        assert_eq!(parent_span_id("c", "2[4]", "2[4].1", None), run_span_id("c"));
        assert_eq!(
            parent_span_id("c", "2[4]", "2[4].1.t1", None),
            step_span_id("c", "2[4].1", None)
        );
        assert_eq!(split_iteration("2[4]"), ("2", Some(4)));
        assert_eq!(split_iteration("3.t2"), ("3.t2", None));
        assert_ne!(step_span_id("r", "2", None), step_span_id("r", "2", Some(0)));
        // A model call's `chat` span is not its record's.
        assert_ne!(chat_span_id("r", "2", None), step_span_id("r", "2", None));
        assert_ne!(chat_span_id("r", "2", None), chat_span_id("r", "2", Some(0)));
        assert_ne!(step_span_id("r", "2", None), step_span_id("c", "2", None));
    }

    /// A turn whose model is not known (a flow test's mock) is `chat`; a tool call that is
    /// itself a model call (an `llm` agent as a tool) has its `chat` span under its own.
    #[test]
    fn model_calls_are_chat_spans_and_tool_calls_execute_tool_spans() {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message as _;
        let part = |number: &str, kind: &str, answers: serde_json::Value| StepRecord {
            kind: kind.into(),
            answers: Some(answers),
            started_at: 5,
            finished_at: Some(6),
            started_ns: Some(5_000_001),
            finished_ns: Some(6_000_002),
            ..crate::store::tests::step(number, 1, None, StepStatus::Succeeded)
        };
        let mut tree = Tree::new("r", 0);
        tree.push_step(&StepRecord {
            run_id: "r".into(),
            ..part("1.t1", "turn", serde_json::json!({}))
        });
        tree.push_step(&StepRecord {
            run_id: "r".into(),
            ..part(
                "1.t1.1",
                "tool",
                serde_json::json!({"tool": "ask", "call_id": "c9", "model": "m1", "response_model": "m1-x"}),
            )
        });
        let mut enc = Encoder::default();
        encode_tree(tree.view(), &mut enc, &mut |_| panic!("not a request's worth"));
        let (body, n) = enc.request(&[]);
        assert_eq!(n, 3);
        let req = ExportTraceServiceRequest::decode(body.as_slice()).expect("decodes");
        let spans = &req.resource_spans[0].scope_spans[0].spans;
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["chat", "execute_tool ask", "chat m1"]);
        let attr = |i: usize, k: &str| {
            spans[i]
                .attributes
                .iter()
                .find(|a| a.key == k)
                .and_then(|a| a.value.clone())
                .and_then(|v| v.value)
        };
        use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
        assert_eq!(attr(0, "gen_ai.request.model"), None);
        assert_eq!(attr(1, "gen_ai.tool.call.id"), Some(V::StringValue("c9".into())));
        assert_eq!(attr(1, "gen_ai.request.model"), None);
        assert_eq!(
            attr(2, "gen_ai.response.model"),
            Some(V::StringValue("m1-x".into()))
        );
        assert_eq!(spans[2].parent_span_id, spans[1].span_id);
        assert_eq!(
            (spans[2].start_time_unix_nano, spans[2].end_time_unix_nano),
            (5_000_001, 6_000_002)
        );
    }

    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(trace_id("r1"), trace_id("r1"));
        assert_eq!(trace_id("r1").len(), 16);
        assert_ne!(trace_id("r1"), trace_id("r2"));
        assert_ne!(run_span_id("r1"), run_span_id("r2"));
        // Parts are separated: ("ab", "c") is not ("a", "bc").
        assert_ne!(hash(0, &[b"ab", b"c"]), hash(0, &[b"a", b"bc"]));
        let ids: std::collections::HashSet<[u8; 8]> =
            (0..10_000).map(|i| run_span_id(&format!("r{i}"))).collect();
        assert_eq!(ids.len(), 10_000);
        // The same in every build (computed independently of this code): a run resumed by
        // another version of switchyard joins the trace its first spans began.
        assert_eq!(hash(0, &[b"run", b"r1"]), 0xdf68_7dcf_e46c_983b);
    }

    #[test]
    fn the_endpoint_gets_the_traces_path_unless_it_names_one() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(traces_url("http://c:4318/").unwrap(), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("https://c/otlp/v1/traces").unwrap(),
            "https://c/otlp/v1/traces"
        );
        assert!(
            traces_url("127.0.0.1:4318")
                .unwrap_err()
                .contains("http:// or https://")
        );
        assert!(traces_url("http://").is_err());
    }
}
