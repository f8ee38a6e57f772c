//! The executor: runs a compiled [`Plan`] on tokio, step by step, recording every step in a
//! [`Store`] before moving on (SPEC §3–§9).
//!
//! One `Run` is one execution of one flow: the root run, or a child run started by a `flow`
//! agent. It owns the payload; steps borrow it. This module holds the engine's public types
//! and the state a run shares with its parts; each behaviour lives in the file named for it:
//! `run.rs` (lifecycle and records), `walk.rs` (step after step), `route.rs` (edges),
//! `step.rs` (one step by its kind), `invoke.rs` (attempts, retries, timeouts), `child.rs`
//! (child runs), `foreach.rs`, `while_.rs`, `parallel.rs` and `limits.rs` (steps, payload
//! size, cost). Building inputs and applying outputs is [`super::data`]; evaluating
//! expressions is [`super::eval`]; calling sub-agents is `crate::agents`.

mod agent_loop;
mod approve;
mod child;
mod elicit;
mod foreach;
mod inbox;
mod input_files;
mod invoke;
mod limits;
mod loop_tools;
mod parallel;
mod route;
mod run;
mod step;
mod walk;
mod while_;

pub use invoke::backoff;
pub use limits::json_size;
pub use walk::PAUSED;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::data::{Change, Violation};
use super::resume::{Replay, ResumeOptions, WaitingFor};
use super::steps::StepsVar;
use crate::agents::AgentState;
use crate::expr::eval::Vars;
use crate::expr::time::Timestamp;
use crate::model::AgentKind;
use crate::plan::*;
use crate::record::StepError;
use crate::record::{RunRecord, RunStatus, Usage};
use crate::store::Store;
use limits::Budget;

type NodeIdx = petgraph::stable_graph::NodeIndex;

/// Options of one run tree: what `switchyard run`'s flags set. Built from `Default` with the
/// methods below; the rest is the engine's.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// `--allow`: agent kinds the whole tree may use (intersected with every flow's `allow`).
    pub(crate) allow: Option<BTreeSet<AgentKind>>,
    /// Agents replaced or removed per flow (`--agent-change`), resolved against the plan.
    pub(crate) agent_changes: Arc<AgentChanges>,
    /// The run's conversation (`--messages`), passed on to nested flows; `llm` agents pick
    /// from it by `message_mode`.
    pub(crate) messages: Arc<Vec<Value>>,
    /// `--allow-hosts`: the hosts `http` and `llm` agents may reach, on top of every flow's
    /// `allow_hosts`.
    pub(crate) allow_hosts: Option<Vec<String>>,
    /// `--max-cost-usd`: the run tree's budget, on top of the flows' `limits.max_cost_usd`.
    pub(crate) max_cost_usd: Option<f64>,
    /// A budget shared with other run trees (a batch's `--max-cost-usd`), checked before
    /// every agent call and told what each one used.
    pub(crate) shared_budget: Option<Arc<dyn crate::runtime::budget::SharedBudget>>,
    /// `--now` or a flow test's `now:`: the `now` of every new run tree started with these
    /// options (default: the time it starts). A resumed run keeps the `now` it recorded.
    pub(crate) now: Option<crate::expr::time::Timestamp>,
    /// What starts the run trees (recorded with each run): the library's API unless a
    /// command or the MCP server says otherwise.
    pub(crate) origin: crate::record::Origin,
    /// The directories `file()` may read under, canonical, the project root first; empty:
    /// the directory of the top flow.
    pub(crate) files_roots: Arc<Vec<std::path::PathBuf>>,
}

impl RunOptions {
    /// `--allow`: the agent kinds the whole run tree may use, intersected with every flow's
    /// `allow` (never wider than a flow says).
    pub fn allow(mut self, kinds: impl IntoIterator<Item = AgentKind>) -> Self {
        self.allow = Some(kinds.into_iter().collect());
        self
    }

    /// `--allow-hosts`: hosts `http` and `llm` agents may reach, on top of every flow's
    /// `allow_hosts` (a host must be in each list).
    pub fn allow_hosts(mut self, hosts: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.allow_hosts = Some(hosts.into_iter().map(Into::into).collect());
        self
    }

    /// The directories `file("path")` may read under (canonical): the project root, which
    /// relative paths start from, then each `--files-root`.
    pub fn files_roots(mut self, roots: Vec<std::path::PathBuf>) -> Self {
        self.files_roots = Arc::new(roots);
        self
    }

    /// `--max-cost-usd`: the run tree's budget, on top of the flows' `limits.max_cost_usd`.
    pub fn max_cost_usd(mut self, usd: f64) -> Self {
        self.max_cost_usd = Some(usd);
        self
    }

    /// `--messages`: the run's conversation (chat messages), passed on to nested flows;
    /// `llm` agents pick from it by their `message_mode`.
    pub fn messages(mut self, messages: Vec<Value>) -> Self {
        self.messages = Arc::new(messages);
        self
    }

    /// `--now`: the `now` of new run trees started with these options, RFC 3339 to the
    /// microsecond at most (a resumed run keeps the `now` it recorded). An error names what
    /// is wrong with the text.
    pub fn now(mut self, rfc3339: &str) -> Result<Self, String> {
        self.now = Some(crate::model::build::parse_now(rfc3339)?);
        Ok(self)
    }
}

/// What a finished run returns: how it ended, its output or error, and, stopped
/// `interrupted` at a question, what it waits for.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RunOutcome {
    pub run_id: String,
    pub status: RunStatus,
    pub output: Option<Value>,
    pub error: Option<StepError>,
    /// Top-level steps visited, in order (flow tests' `expect.path`).
    pub path: Vec<String>,
    pub usage: Usage,
    pub steps: u64,
    /// From the run's recorded start (its first start, when resumed) to its end.
    pub duration_ms: u64,
    /// A store write failed (disk full, locked): what happened is not all on record, and
    /// the run should be resumed once the store works again rather than reported.
    pub store_failure: Option<String>,
    /// Stopped `interrupted` at an `interrupt` step or an agent loop's approval (its own or
    /// a child run's): the question the decision given to the resume answers. `None` for a
    /// run that stopped for another reason (an attempt in doubt: `error` says so), or when
    /// the store could not be read back (logged).
    pub waiting: Option<WaitingFor>,
    /// The files the run and its child runs made, by record number (SPEC §6.5).
    pub files: Vec<crate::record::RunFile>,
}

/// Runs plans against a store.
pub struct Engine<S: Store> {
    pub store: Arc<S>,
    /// Told of every run and step record as they are made (`crate::runtime::observe`).
    pub observer: Option<Arc<dyn crate::runtime::observe::Observer>>,
    /// The `native` agents flows may call, by name.
    pub natives: Arc<crate::agents::native::Natives>,
}

impl<S: Store> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Engine {
            store: self.store.clone(),
            observer: self.observer.clone(),
            natives: self.natives.clone(),
        }
    }
}

/// Where a run sits in its tree.
#[derive(Clone)]
struct Lineage {
    parent_run: Option<String>,
    /// Number of the calling step (`"2"` → this run's steps are `2.1`, `2.2`, ...).
    prefix: String,
    depth: u32,
    /// The root flow's `max_depth` governs the tree.
    max_depth: u64,
    /// Effective allow set: the intersection down the tree.
    allow: Option<BTreeSet<AgentKind>>,
    /// `allow_hosts` lists down the tree (and `--allow-hosts`): a host must be in each.
    hosts: Vec<Arc<[String]>>,
    /// The tightest cost budget on the way down the tree, if any.
    budget: Option<Budget>,
    /// The parent run's file limits: a child run's files count against them too.
    files: Option<Arc<crate::files::FileLimits>>,
    /// The root run of the tree, for a child run's inbox items (`None` in the root).
    root: Option<Arc<inbox::RootOf>>,
    /// What the observer keeps of the run that started this one (`None` in the root).
    watch: crate::runtime::observe::Watch,
}

/// Shared, immutable facts of one run tree.
struct Tree {
    plan: Arc<Plan>,
    context: Value,
    /// `now` for every expression and template of the tree: fixed at the root's first start.
    now: Timestamp,
    options: RunOptions,
    cancel: CancellationToken,
    /// Stop at the next recorded point, leaving the run to resume (Ctrl-C in a batch).
    pause: CancellationToken,
    released: Option<Released>,
    resume: ResumeOptions,
    /// The first store write that failed in this tree: the run's end may not be on record.
    store_failure: std::sync::Mutex<Option<String>>,
    /// Step records of the tree's runs queued so far, and how many of them a commit is
    /// known to cover ([`Run::barrier`]): one writer commits a store's writes in order, so
    /// a commit covers whatever any run of the tree queued before it.
    queued: std::sync::atomic::AtomicU64,
    committed: std::sync::atomic::AtomicU64,
    /// What the agent calls of the whole tree have cost so far, in 10⁻⁹ USD.
    spent_nano: AtomicU64,
    /// Resumed from `running`: its last holder stopped without recording a stop, so the
    /// records finished since the last stop on record (the latest decision given to the
    /// root run, a time) are handed to the observer as they replay ([`Observer::replayed`]).
    ///
    /// [`Observer::replayed`]: crate::runtime::observe::Observer::replayed
    carry: Option<u64>,
    /// Model calls of the whole tree whose cost is unknown (no `usage` reported).
    unknown_calls: AtomicU64,
    /// An inbox item a run of the tree added as it stopped was answered before the stop
    /// was on record: the tree is resumed again at once ([`Run::answered_meanwhile`]).
    answered: std::sync::atomic::AtomicBool,
}

/// How a caller stops runs: [`RunControls::cancel`] ends them `cancelled`;
/// [`RunControls::pause`] stops them at the next recorded point (between steps, between loop
/// iterations) and leaves them `running` in the store, to be resumed. Clones share their
/// state: keep one, give one to the run.
#[derive(Clone, Debug, Default)]
pub struct RunControls {
    pub(crate) cancel: CancellationToken,
    pub(crate) pause: CancellationToken,
    /// Called once the root run's work is done and its end handed to the store, before the
    /// commit is waited for: a batch then starts its next item while the end commits.
    pub(crate) released: Option<Released>,
}

impl RunControls {
    /// Controls that stop nothing until told to.
    pub fn new() -> Self {
        Self::default()
    }

    /// Controls that cancel when `token` is cancelled (and pause on their own).
    pub fn with_cancel(token: CancellationToken) -> Self {
        RunControls {
            cancel: token,
            ..Self::default()
        }
    }

    /// Ends the runs these controls were given to, `cancelled`.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Stops the runs at their next recorded point, `running` in the store, to be resumed.
    pub fn pause(&self) {
        self.pause.cancel();
    }

    /// Whether [`RunControls::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Whether [`RunControls::pause`] was called.
    pub fn is_paused(&self) -> bool {
        self.pause.is_cancelled()
    }
}

/// A callback for `RunControls::released`.
#[derive(Clone)]
pub struct Released(pub Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for Released {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Released")
    }
}

/// A run's place in a batch.
#[derive(Clone, Debug)]
pub struct BatchItem {
    pub batch: String,
    pub id: String,
    pub index: u64,
}

fn intersect(a: Option<BTreeSet<AgentKind>>, b: Option<BTreeSet<AgentKind>>) -> Option<BTreeSet<AgentKind>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.intersection(&b).copied().collect()),
        (a, None) => a,
        (None, b) => b,
    }
}

/// What executing one step produced.
struct StepOutcome {
    /// Shared, once made, with `steps.<id>`, the step's record and the payload changes that
    /// write all of it: never copied for them.
    result: Option<Arc<Value>>,
    error: Option<StepError>,
    attempts: u32,
    input: Option<Value>,
    changes: Vec<Change>,
    violations: Vec<Violation>,
    failed: Value,
    iterations: Option<u64>,
    child_run: Option<String>,
    usage: Usage,
    /// The run ends here: interrupted, or by `succeed`/`fail`; `Running`: paused, to resume.
    stop: Option<RunStatus>,
    /// Taken from the records of an earlier run (resume): recorded already.
    replayed: bool,
    /// What the step's `llm` calls put on its record ([`StepRecord::answers`]).
    answers: Option<Value>,
    /// The step called an agent with effects: its record is waited for, so that a crash
    /// after the call's effect leaves as short a time as can be in which the call is on
    /// record only as started (and a resume finds it in doubt).
    effects: bool,
    /// The files the step's call made (a `flow` step's: its child run's), numbered.
    files: Vec<crate::record::RunFile>,
    /// The input the agent was called with when it differs from the one built (`file()`
    /// references in place of their markers): what the record keeps.
    resolved_input: Option<Value>,
}

impl StepOutcome {
    fn ok(result: Option<Value>) -> Self {
        Self::shared(result.map(Arc::new))
    }

    fn shared(result: Option<Arc<Value>>) -> Self {
        StepOutcome {
            result,
            error: None,
            attempts: 1,
            input: None,
            changes: Vec::new(),
            violations: Vec::new(),
            failed: Value::Null,
            iterations: None,
            child_run: None,
            usage: Usage::default(),
            stop: None,
            replayed: false,
            answers: None,
            effects: false,
            files: Vec::new(),
            resolved_input: None,
        }
    }

    fn err(error: StepError) -> Self {
        StepOutcome {
            error: Some(error),
            ..StepOutcome::ok(None)
        }
    }
}

/// A call's result, usage and child run id; or its error, usage, child run id and whether
/// the child run stopped `interrupted` (so the calling step does too).
type CallResult = Result<(Value, Usage, Option<String>), (StepError, Usage, Option<String>, bool)>;

/// One execution of one flow.
struct Run<'e, S: Store> {
    engine: &'e Engine<S>,
    tree: &'e Arc<Tree>,
    flow: Arc<FlowPlan>,
    flow_ref: FlowRef,
    lineage: Lineage,
    state: &'e Arc<AgentState>,
    /// The run's record; its `input` is the run input (`input` in expressions).
    record: RunRecord,
    payload: Value,
    /// At least the size of `payload` as [`json_size`] counts it (see
    /// [`Run::check_payload_size`]).
    payload_bound: u64,
    /// `steps.<id>`: result, status, error, ... of steps that finished (built when read).
    steps: StepsVar,
    /// Step executions so far (iterations included), counted by [`Run::count_step`] from
    /// iterations in flight too.
    executed: AtomicU64,
    /// Steps and iterations or branches that finished (replayed ones included): what a
    /// paused run records as its `steps`, since [`Run::executed`] counts a `foreach`'s
    /// items before they run.
    finished: AtomicU64,
    /// What `llm` calls put on their step's record (the structured-output form, repaired
    /// answers, abandoned requests), by step number (`1.3[2]`), gathered over the step's
    /// attempts until its record takes them.
    answers: std::sync::Mutex<std::collections::HashMap<String, Value>>,
    /// The files a call that succeeded made, by step number (`1.3[2]`), until its outcome
    /// takes them.
    made: std::sync::Mutex<std::collections::HashMap<String, Vec<crate::record::RunFile>>>,
    /// Whether `made` was ever written to.
    made_any: std::sync::atomic::AtomicBool,
    /// The files of the run's records so far (replayed ones included), in the order recorded.
    files: std::sync::Mutex<Vec<crate::record::RunFile>>,
    /// `limits.max_file_bytes`, `limits.max_run_file_bytes`, and the bytes made so far.
    file_limits: Arc<crate::files::FileLimits>,
    /// The files of an agent loop's model turns, which read files (attachments) and make none.
    turn_files: crate::files::FileSink,
    numbered: u64,
    path: Vec<String>,
    started: Instant,
    /// Resuming: the run's records, replayed instead of calling again.
    replay: Option<Arc<Replay>>,
    /// The parts recorded as stopped to ask a human, for the inbox ([`Run::note_asked`]).
    asked: std::sync::Mutex<Vec<inbox::Asked>>,
    /// The store holds the run's starting record as it is already (a submitted run claimed
    /// for the first time): its start is not written again.
    start_recorded: bool,
    /// What the observer keeps of this run, handed back with its records.
    watch: crate::runtime::observe::Watch,
}
impl<'e, S: Store> Run<'e, S> {
    fn vars<'a>(&'a self, locals: &'a [(&'a str, &'a Value)]) -> Vars<'a> {
        Vars {
            payload: Some(&self.payload),
            input: Some(&self.record.input),
            context: Some(&self.tree.context),
            result: None,
            step: None,
            steps: Some(&self.steps),
            message: None,
            locals,
            now: Some(self.tree.now),
        }
    }
}
