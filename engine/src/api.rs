//! Switchyard as a library: what an application embedding it uses instead of the binary.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use switchyard::{Flow, NativeCall, Switchyard};
//! let flow = Flow::load("flows/triage.yaml")?; // lints it: a FlowError holds the diagnostics
//! let mut sy = Switchyard::open("sqlite:.switchyard/runs.db").await?;
//! sy.register("score", |input: serde_json::Value, _call: NativeCall| async move {
//!     Ok(serde_json::json!({"score": input["text"].as_str().map_or(0, str::len)}))
//! });
//! let mut events = sy.events();
//! let outcome = sy.run(&flow, serde_json::json!({"text": "hello"})).await?;
//! while let Some(event) = events.try_next() {
//!     println!("{}", event.to_json());
//! }
//! println!("{:?} {:?}", outcome.status, outcome.output);
//! # Ok(()) }
//! ```
//!
//! The binary is built on the same calls: [`Flow::load_under`] is what `run`, `batch` and
//! `resume` load flows with, and [`Switchyard`] is what they run them with, so a run started
//! here has the same records, the same durability and the same `resume` as one started by
//! `switchyard run`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::agents::AgentState;
use crate::diag::render;
use crate::plan::Plan;
use crate::project::Project;
use crate::runtime::observe::{Fanout, Observer, Watch};
use crate::store::any::AnyStore;
use crate::store::{Store, Writer};

/// How long a `run` or `resume` holds its run without renewing (SPEC §7.3): what a process
/// on another host waits, after the holder died, before it can take the run. On the holder's
/// own host a dead holder frees the run at once.
const WRITER_LEASE: std::time::Duration = std::time::Duration::from_secs(30);

pub use crate::agents::native::{NativeAgent, NativeCall, NativeFuture, Natives};
pub use crate::batch::{BatchError, BatchOptions, Progress, Summary as BatchSummary};
pub use crate::diag::{Diagnostic, Label, Rule, Severity};
pub use crate::model::AgentKind;
pub use crate::record::cost::Cost;
pub use crate::record::inbox::{DecisionRow, Via};
pub use crate::record::{Change, Origin, Violation};
pub use crate::record::{ErrorKind, StepError};
pub use crate::record::{RunRecord, RunStatus, StepRecord, StepStatus, Usage};
pub use crate::runtime::engine::{RunControls, RunOptions, RunOutcome};
pub use crate::runtime::resume::{
    Approval, Elicitation, Interrupt, PendingCall, Question, ResumeError, ResumeOptions, WaitingFor,
};
pub use crate::source::{FileId, Span};
pub use crate::store::StoreError;
pub use crate::store::inbox::Refusal;
pub use tokio_util::sync::CancellationToken;

/// A flow file loaded, linted and compiled: ready to run, as often as wanted.
#[derive(Clone)]
pub struct Flow {
    plan: Arc<Plan>,
    project: Arc<Project>,
    warnings: Vec<Diagnostic>,
}

impl std::fmt::Debug for Flow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flow")
            .field("name", &self.name())
            .field("warnings", &self.warnings.len())
            .finish()
    }
}

impl Flow {
    /// Loads the flow file at `path` (with every file it imports or calls), lints it as
    /// `switchyard lint` does and compiles it. Relative paths in it resolve from its
    /// directory.
    pub fn load(path: impl AsRef<Path>) -> Result<Flow, FlowError> {
        Self::load_under(path.as_ref(), None)
    }

    /// [`Flow::load`] with the project root (`--root`): the directory the flow's imports and
    /// called flows may not leave. Default: the flow file's directory.
    pub fn load_under(path: &Path, root: Option<PathBuf>) -> Result<Flow, FlowError> {
        let mut project = Project::default();
        let root = crate::project::root_of(path, root);
        let Some(id) = project.load_top(path, root, &crate::syntax::Limits::default()) else {
            let diagnostics = crate::lint::lint_project(&project);
            let fallback = (diagnostics.is_empty()).then(|| {
                format!(
                    "`{}` is not a flow (it has no `flow:` or `steps:`)",
                    path.display()
                )
            });
            return Err(FlowError {
                diagnostics,
                project: Arc::new(project),
                message: fallback,
            });
        };
        let (plan, diagnostics) = crate::lint::lint_and_compile(&project, id);
        let project = Arc::new(project);
        match plan {
            Some(plan) => Ok(Flow {
                plan: Arc::new(plan),
                project,
                warnings: diagnostics,
            }),
            None => Err(FlowError {
                diagnostics,
                project,
                message: None,
            }),
        }
    }

    /// The root flow's `flow:` name.
    pub fn name(&self) -> &str {
        &self.plan.root().name
    }

    /// The root flow's `description:`.
    pub fn description(&self) -> Option<&str> {
        self.top()?.description.as_deref()
    }

    /// Where the root flow's `flow:` name is written: `FILE:LINE:COLUMN`.
    pub fn name_location(&self) -> String {
        match self.top() {
            Some(f) => {
                let file = self.project.sources.get(f.name.span.file);
                let (line, column) = file.line_col(f.name.span.start as usize);
                format!("{}:{line}:{column}", file.name)
            }
            None => self.name().to_string(),
        }
    }

    /// The root flow as written: the project's first file.
    fn top(&self) -> Option<&crate::model::Flow> {
        self.project.flows.first()?.flow.as_ref()
    }

    /// What lint warned of (a flow with errors does not load).
    pub fn warnings(&self) -> &[Diagnostic] {
        &self.warnings
    }

    /// The warnings as `switchyard lint` prints them (no colour).
    pub fn render_warnings(&self) -> String {
        render::human(
            &self.warnings,
            &self.project.sources,
            &render::HumanOptions::default(),
        )
    }

    /// Narrows the root flow's limits (`--max-steps`, `--timeout`, `--max-depth`,
    /// `--max-payload-bytes`): never loosens them. Returns each bound looser than the flow's
    /// (which stays), with the flow's value. Only a flow not cloned yet can be narrowed: a
    /// clone shares its plan with the original.
    pub(crate) fn narrow_limits(
        &mut self,
        limits: &crate::plan::NarrowLimits,
    ) -> Result<Vec<(&'static str, String)>, &'static str> {
        let plan = Arc::get_mut(&mut self.plan)
            .ok_or("the flow's plan is shared (cloned): narrow it before cloning")?;
        if Arc::get_mut(&mut plan.flows[plan.root.0]).is_none() {
            return Err("the flow's plan is shared (cloned): narrow it before cloning");
        }
        Ok(plan.narrow_limits(limits))
    }

    /// The compiled plan, for the engine.
    pub(crate) fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// The files it was loaded from, with their text.
    pub(crate) fn project(&self) -> &Project {
        &self.project
    }

    /// The names of the `native` agents it can call (registered under these names), sorted.
    pub fn natives(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .plan
            .agents()
            .into_iter()
            .filter_map(|(_, a)| match &a.spec {
                crate::plan::AgentPlanSpec::Native(n) => Some(n.function.as_str()),
                _ => None,
            })
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// Why a flow did not load: its diagnostics, each naming the file, line and column.
pub struct FlowError {
    pub diagnostics: Vec<Diagnostic>,
    project: Arc<Project>,
    /// What went wrong when there is no diagnostic to say it.
    message: Option<String>,
}

impl FlowError {
    /// The diagnostics as `switchyard lint` prints them, coloured or not, at a width.
    pub fn render(&self, color: bool, width: usize) -> String {
        let mut text = render::human(
            &self.diagnostics,
            &self.project.sources,
            &render::HumanOptions { color, width },
        );
        if let Some(m) = &self.message {
            text.push_str(m);
        }
        text
    }

    /// The diagnostics as `switchyard lint --format json` gives them (a JSON array).
    pub fn json(&self) -> String {
        render::json(&self.diagnostics, &self.project.sources)
    }

    /// The files the flow was loaded from (for the summary of how many were checked).
    pub(crate) fn project(&self) -> &Project {
        &self.project
    }

    /// Text for a problem no diagnostic names (the file holds no flow).
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }
}

impl std::fmt::Debug for FlowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render(false, 100))
    }
}

impl std::fmt::Display for FlowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.render(false, 100).trim_end())
    }
}

impl std::error::Error for FlowError {}

/// Why a run or a batch did not start, or a resume could not go on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store could not be opened.
    #[error("{0}")]
    Store(String),
    /// The flow calls a `native` agent registered under no name here (one line each).
    #[error("{0}")]
    Natives(String),
    /// An `${env:NAME}` a flow's agents need is not set (one line each).
    #[error("{0}")]
    Secrets(String),
    /// A run of this id is recorded or being run already.
    #[error("run `{0}` exists already")]
    Exists(String),
    #[error(transparent)]
    Resume(#[from] ResumeError),
    #[error(transparent)]
    Batch(#[from] BatchError),
}

/// How a run starts besides its input: the `--context`, the options of the run tree
/// (`--allow`, `--max-cost-usd`, `--now`, ...), and how it is stopped.
#[derive(Clone, Debug, Default)]
pub struct RunConfig {
    pub context: Option<Value>,
    pub options: RunOptions,
    pub controls: RunControls,
}

/// A store with the native agents and event subscribers that runs recorded in it use.
///
/// `S` is the store: an application keeps the default, the stores [`Switchyard::open`] opens
/// (`sqlite:`, `postgres://`, `memory`); other stores are the engine's own (its tests').
pub struct Switchyard<S: Store = AnyStore> {
    store: Arc<S>,
    natives: Natives,
    subscribers: Arc<Subscribers>,
}

impl Switchyard<AnyStore> {
    /// Opens (creating) the store at `url`: `sqlite:PATH`, `postgres://...`, or `memory`
    /// (kept by nothing), as `--store` takes it.
    pub async fn open(url: &str) -> Result<Self, Error> {
        let store = AnyStore::open(url)
            .await
            .map_err(|e| Error::Store(e.to_string()))?;
        Ok(Self::with_store(Arc::new(store)))
    }

    /// [`Switchyard::open`] tuned for batches: SQLite writes one transaction per many runs.
    pub async fn open_for_batch(url: &str) -> Result<Self, Error> {
        let store = AnyStore::open_for_batch(url)
            .await
            .map_err(|e| Error::Store(e.to_string()))?;
        Ok(Self::with_store(Arc::new(store)))
    }

    /// Waits for the store's queued writes and closes it; false when something else still
    /// holds it (an engine the binary made from this Switchyard).
    pub async fn close(self) -> bool {
        match Arc::try_unwrap(self.store) {
            Ok(s) => {
                s.close().await;
                true
            }
            Err(_) => false,
        }
    }
}

impl<S: Store> Switchyard<S> {
    /// Runs recorded in `store`.
    pub(crate) fn with_store(store: Arc<S>) -> Self {
        Switchyard {
            store,
            natives: Natives::new(),
            subscribers: Arc::default(),
        }
    }

    pub(crate) fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// Registers a native agent under `name` (see [`Natives::register`]).
    pub fn register(&mut self, name: impl Into<String>, agent: impl NativeAgent) -> &mut Self {
        self.natives.register(name, agent);
        self
    }

    /// Registers a native agent without effects outside the run ([`Natives::register_pure`]).
    pub fn register_pure(&mut self, name: impl Into<String>, agent: impl NativeAgent) -> &mut Self {
        self.natives.register_pure(name, agent);
        self
    }

    /// The native agents registered so far.
    pub fn natives(&self) -> &Natives {
        &self.natives
    }

    /// A stream of what the next call of this Switchyard that runs something does (the
    /// next [`Switchyard::run`], [`Switchyard::resume`] or [`Switchyard::batch`] past its
    /// checks): each run's start and end and each finished step, as they happen (child
    /// runs' too, every item of a batch). It ends with that call: once the call returned and
    /// every event was read, [`Events::next`] gives `None`. Take a stream before each call to
    /// watch. Events wait in the stream until read: read them, or drop the stream.
    pub fn events(&self) -> Events {
        let (tx, rx) = mpsc::unbounded_channel();
        self.subscribers
            .senders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        Events(rx)
    }

    /// What a flow's run needs that is not here, before it starts: native agents nobody
    /// registered, environment variables of secret references that are not set.
    pub fn check(&self, flow: &Flow, options: &RunOptions) -> Result<(), Error> {
        self.natives.check(&flow.plan).map_err(Error::Natives)?;
        crate::agents::secrets::check_env(&flow.plan, &options.agent_changes).map_err(Error::Secrets)?;
        Ok(())
    }

    /// The engine the runs of this Switchyard use: its store, natives and the process's
    /// installed observer (`--otlp-endpoint`); no event stream.
    pub(crate) fn engine(&self) -> crate::runtime::engine::Engine<S> {
        self.engine_with(None)
    }

    /// The event streams taken so far, for the call about to run: they end with it
    /// ([`close`]), and later streams wait for the next call.
    fn streams(&self) -> Option<Arc<Subscribers>> {
        let senders =
            std::mem::take(&mut *self.subscribers.senders.lock().unwrap_or_else(|e| e.into_inner()));
        (!senders.is_empty()).then(|| {
            Arc::new(Subscribers {
                senders: Mutex::new(senders),
            })
        })
    }

    /// [`Switchyard::engine`] telling `streams` too.
    fn engine_with(&self, streams: Option<Arc<Subscribers>>) -> crate::runtime::engine::Engine<S> {
        let mut observers: Vec<Arc<dyn Observer>> = Vec::new();
        if let Some(o) = crate::runtime::observe::installed() {
            observers.push(o);
        }
        if let Some(s) = streams {
            observers.push(s);
        }
        let observer: Option<Arc<dyn Observer>> = match observers.len() {
            0 => None,
            1 => observers.pop(),
            _ => Some(Arc::new(Fanout(observers))),
        };
        crate::runtime::engine::Engine::new(self.store.clone())
            .with_natives(Arc::new(self.natives.clone()))
            .with_observer(observer)
    }

    /// Runs the flow on `input` to its end, recorded in the store.
    pub async fn run(&self, flow: &Flow, input: Value) -> Result<RunOutcome, Error> {
        self.run_with(flow, input, RunConfig::default()).await
    }

    /// [`Switchyard::run`] with a context, run options and controls. The run is this
    /// process's from before it starts to its end (SPEC §7.3, one writer per run): a `resume`
    /// of it meanwhile is refused.
    pub async fn run_with(&self, flow: &Flow, input: Value, config: RunConfig) -> Result<RunOutcome, Error> {
        self.run_as(flow, input, config, crate::record::new_run_id())
            .await
    }

    /// [`Switchyard::run_with`] under the run id `id` (a caller's idempotency key made an
    /// id): refused with [`Error::Exists`] when a run of that id is recorded already or
    /// another process holds it, so that one id never starts two runs.
    pub async fn run_as(
        &self,
        flow: &Flow,
        input: Value,
        config: RunConfig,
        id: String,
    ) -> Result<RunOutcome, Error> {
        self.check(flow, &config.options)?;
        let context = config.context.unwrap_or_else(|| json!({}));
        let holding = Holding::take(&self.store, &id, &config.controls)
            .await
            .map_err(|e| match e {
                StoreError::Held { .. } => Error::Exists(id.clone()),
                e => Error::Store(e.to_string()),
            })?;
        // Checked under the hold: a run of this id that ended and gave its hold back is
        // recorded, and is not started again.
        match self.store.get_run(&id).await {
            Err(StoreError::NotFound(_)) => {}
            Ok(_) => {
                holding.give_back().await;
                return Err(Error::Exists(id));
            }
            Err(e) => {
                holding.give_back().await;
                return Err(Error::Store(e.to_string()));
            }
        }
        let streams = self.streams();
        let engine = self.engine_with(streams.clone());
        let outcome = engine
            .run_as(
                id,
                flow.plan.clone(),
                input,
                context,
                config.options,
                Arc::new(AgentState::default()),
                config.controls,
            )
            .await;
        let outcome = engine.with_waiting(outcome).await;
        holding.give_back().await;
        close(streams);
        Ok(outcome)
    }

    /// Continues the stored run `run_id` of `flow` (SPEC §3.6): what finished is replayed
    /// from its records, the rest runs (`resume` has the decision of an interrupt and
    /// whether to retry an attempt in doubt).
    pub async fn resume(
        &self,
        flow: &Flow,
        run_id: &str,
        resume: ResumeOptions,
        config: RunConfig,
    ) -> Result<RunOutcome, Error> {
        self.check(flow, &config.options)?;
        // Questions whose expiry passed are settled first (SPEC §15): a decision comes too
        // late for them, and a resume without one continues as their expiry says.
        if self.store.keeps_steps() {
            self.store.inbox().expire_due().await.map_err(ResumeError::from)?;
        }
        // The run as this process first sees it: if it is not the same once taken, another
        // process continued it meanwhile, and what this resume was asked does not apply.
        let seen = self.store.get_run(run_id).await.map_err(ResumeError::from)?;
        let holding = Holding::take(&self.store, run_id, &config.controls)
            .await
            .map_err(ResumeError::from)?;
        let streams = self.streams();
        let outcome = match self.store.get_run(run_id).await {
            Err(e) => Err(ResumeError::from(e)),
            Ok(now) if now != seen => Err(ResumeError::MovedOn {
                id: run_id.to_string(),
                status: now.status.as_str(),
            }),
            Ok(now) => {
                let engine = self.engine_with(streams.clone());
                let answered = if resume.decision.is_some() {
                    self.record_answer(&engine, &flow.plan, &now, &resume).await
                } else {
                    Ok(())
                };
                match answered {
                    Err(e) => Err(e),
                    Ok(()) => match engine
                        .resume(
                            flow.plan.clone(),
                            run_id,
                            config.options,
                            resume,
                            Arc::new(AgentState::default()),
                            config.controls,
                        )
                        .await
                    {
                        Ok(outcome) => Ok(engine.with_waiting(outcome).await),
                        Err(e) => Err(e),
                    },
                }
            }
        };
        holding.give_back().await;
        close(streams);
        Ok(outcome?)
    }

    /// Records the decision `resume` gives in the inbox (SPEC §15), via `library`: checked as
    /// the resume will check it, then against its item's own schema, then applied in the
    /// store's transaction, which refuses an item decided before or expired. A run that waits
    /// at no item (stopped before the inbox) has nothing to record. A decision the caller
    /// recorded itself (the command line's) is only refused when it approves calls whose
    /// question expired: never an approval after the expiry.
    async fn record_answer(
        &self,
        engine: &crate::runtime::engine::Engine<S>,
        plan: &Plan,
        record: &RunRecord,
        resume: &ResumeOptions,
    ) -> Result<(), ResumeError> {
        let Some(decision) = &resume.decision else {
            return Ok(());
        };
        if !self.store.keeps_steps() {
            return Ok(());
        }
        let Some(waiting) = crate::runtime::resume::waiting_at(&*self.store, &record.id).await? else {
            // Nothing waits: the resume says so.
            return Ok(());
        };
        let (number, iteration) = (waiting.step.number.clone(), waiting.step.iteration);
        let id = crate::record::inbox::item_id(&waiting.run_id, &number, iteration);
        engine.check_waiting(plan, record, Some(waiting), resume)?;
        let inbox = self.store.inbox();
        let Some(item) = inbox.get(&id).await? else {
            return Ok(());
        };
        if !resume.record_answer {
            // An `interrupt`'s late decision fails its step `timeout` (SPEC §3.6); an
            // approval's would run the calls, so it is refused.
            return match (item.state, item.expires_at) {
                (crate::record::inbox::ItemState::Expired, Some(at)) if item.kind == "approval" => {
                    Err(ResumeError::Refused {
                        id: record.id.clone(),
                        item: item.id,
                        refusal: crate::store::inbox::Refusal::Expired { at },
                    })
                }
                _ => Ok(()),
            };
        }
        if item.state == crate::record::inbox::ItemState::Waiting {
            let schema = crate::plan::Schema::new(item.schema.clone());
            let checked = match &schema {
                Ok(s) => s.check(decision).map_err(|v| (v.pointer, v.message)),
                Err(e) => Err((String::new(), format!("the item's schema does not compile: {e}"))),
            };
            if let Err((pointer, reason)) = checked {
                return Err(ResumeError::BadAnswerSchema {
                    item: item.id,
                    step: item.step,
                    pointer: if pointer.is_empty() { "/".into() } else { pointer },
                    reason,
                });
            }
        }
        let answer = crate::store::inbox::NewDecision {
            item_id: item.id.clone(),
            actor: resume.actor.clone().unwrap_or_else(crate::record::inbox::os_user),
            via: crate::record::inbox::Via::Library,
            edited: crate::record::inbox::edited(&item, decision),
            decision: decision.clone(),
            reason: resume.reason.clone(),
            bulk_id: None,
        };
        match inbox.decide(vec![answer]).await?.pop() {
            Some(Ok(_)) => Ok(()),
            Some(Err(refusal)) => Err(ResumeError::Refused {
                id: record.id.clone(),
                item: item.id,
                refusal,
            }),
            None => Ok(()),
        }
    }

    /// The decisions recorded for run `run_id` (and the runs of its tree), in the order they
    /// were made (SPEC §15): who, how, what and when.
    pub async fn decisions(&self, run_id: &str) -> Result<Vec<DecisionRow>, StoreError> {
        self.store
            .inbox()
            .log(&crate::store::inbox::LogQuery {
                run: Some(run_id.to_string()),
                ..Default::default()
            })
            .await
    }

    /// Runs the flow over a JSONL file, as `switchyard batch` does: one run per line, output
    /// lines in input order, resumable by running the same batch again. `progress` counts as
    /// it goes.
    pub async fn batch(
        &self,
        flow: &Flow,
        options: BatchOptions,
        config: RunConfig,
        progress: Arc<Progress>,
    ) -> Result<BatchSummary, Error> {
        self.check(flow, &config.options)?;
        let context = config.context.unwrap_or_else(|| json!({}));
        let streams = self.streams();
        let summary = crate::batch::run(
            self.engine_with(streams.clone()),
            flow.plan.clone(),
            options,
            config.options,
            context,
            progress,
            config.controls,
        )
        .await;
        close(streams);
        Ok(summary?)
    }
}

impl BatchOptions {
    /// A batch reading `input` and writing `output`, with the `switchyard batch` defaults:
    /// ids in each line's `id` field, 16 items at once, failed items kept as they are.
    pub fn new(input: impl Into<PathBuf>, output: impl Into<PathBuf>) -> Self {
        BatchOptions {
            input: input.into(),
            output: output.into(),
            concurrency: 16,
            id_field: "id".into(),
            id_field_given: false,
            max_cost_usd: None,
            files_dir: None,
            retry_failed: false,
            retry_in_doubt: false,
            allow_changed: false,
            fresh_store: false,
            sync_output: true,
            export_only: false,
        }
    }
}

/// What a run did, as it happens.
#[derive(Clone, Debug)]
pub enum Event {
    /// A run (root or child) started, or was resumed.
    RunStarted(RunRecord),
    /// A step, iteration, branch, model turn or tool call finished (its record).
    StepFinished(StepRecord),
    /// A run ended (or stopped at a recorded point, still `running`, to be resumed).
    RunFinished(RunRecord),
}

impl Event {
    /// The event as one JSON object: `event` (`run_started`, `step_finished`,
    /// `run_finished`) with the fields the `--log-format json` log line of the same name
    /// has, and the whole `record`.
    pub fn to_json(&self) -> Value {
        match self {
            Event::RunStarted(r) => json!({
                "event": "run_started",
                "run_id": r.id,
                "flow": r.flow,
                "depth": r.depth,
                "parent_run": r.parent_run,
                "record": r,
            }),
            Event::StepFinished(s) => json!({
                "event": "step_finished",
                "run_id": s.run_id,
                "step": s.step,
                "number": match s.iteration {
                    Some(i) => format!("{}[{i}]", s.number),
                    None => s.number.clone(),
                },
                "status": s.status.as_str(),
                "duration_ms": s.finished_at.map(|f| f.saturating_sub(s.started_at)),
                "route": s.route,
                "record": s,
            }),
            Event::RunFinished(r) => json!({
                "event": "run_finished",
                "run_id": r.id,
                "status": r.status.as_str(),
                "duration_ms": r.finished_at.map(|f| f.saturating_sub(r.started_at)),
                "error": r.error.as_ref().map(ToString::to_string).unwrap_or_default(),
                "record": r,
            }),
        }
    }
}

/// This process's holding of a run it advances (SPEC §7.3, one writer per run): its lease is
/// renewed at a third of its length until the run is given back. Dropped without being given
/// back (the run's future dropped mid-way), its writer is retired at once — a later take in
/// this process finds it gone — and the run is given back in the store when the runtime can.
struct Holding<S: Store> {
    store: Arc<S>,
    id: String,
    writer: Writer,
    renewing: tokio::task::JoinHandle<()>,
    given_back: bool,
}

impl<S: Store> Holding<S> {
    /// Takes run `id` in `store`. A lease found lost while it runs (this process stalled past
    /// it, and another took the run) pauses the run at its next recorded point.
    async fn take(
        store: &Arc<S>,
        id: &str,
        controls: &RunControls,
    ) -> Result<Self, crate::store::StoreError> {
        let writer = Writer::this_process();
        if let Err(e) = store.take_run(id, &writer, WRITER_LEASE).await {
            writer.retire();
            return Err(e);
        }
        let (s, run, w, pause) = (
            store.clone(),
            id.to_string(),
            writer.clone(),
            controls.pause.clone(),
        );
        let renewing = tokio::spawn(async move {
            loop {
                tokio::time::sleep(WRITER_LEASE / 3).await;
                match s.renew_run(&run, &w, WRITER_LEASE).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(run_id = %run, "another process took the run over: stopping it here");
                        pause.cancel();
                        return;
                    }
                    Err(e) => tracing::warn!(run_id = %run, "could not renew the lease on the run: {e}"),
                }
            }
        });
        Ok(Holding {
            store: store.clone(),
            id: id.to_string(),
            writer,
            renewing,
            given_back: false,
        })
    }

    /// Gives the run back after this process ran it.
    async fn give_back(mut self) {
        self.renewing.abort();
        // Awaited, so that the task has dropped its clone of the store by the time the call
        // returns: `Switchyard::close` right after must find the store free.
        let _ = (&mut self.renewing).await;
        if let Err(e) = self.store.give_back_run(&self.id, &self.writer).await {
            // Its lease lapses, or the process is found gone: the run is free then.
            tracing::warn!(run_id = %self.id, "could not give the run back: {e}");
        }
        self.given_back = true;
    }
}

impl<S: Store> Drop for Holding<S> {
    fn drop(&mut self) {
        self.renewing.abort();
        self.writer.retire();
        if !self.given_back
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let (store, id, writer) = (self.store.clone(), self.id.clone(), self.writer.clone());
            rt.spawn(async move {
                let _ = store.give_back_run(&id, &writer).await;
            });
        }
    }
}

/// A stream of [`Event`]s ([`Switchyard::events`]).
pub struct Events(mpsc::UnboundedReceiver<Event>);

impl Events {
    /// The next event; `None` once the call the stream watched returned (or the
    /// [`Switchyard`] is gone) and every event was read.
    pub async fn next(&mut self) -> Option<Event> {
        self.0.recv().await
    }

    /// The next event if one is waiting.
    pub fn try_next(&mut self) -> Option<Event> {
        self.0.try_recv().ok()
    }
}

/// Event streams: those a [`Switchyard`] holds for its next call, or those one call tells,
/// as an observer of its engine.
#[derive(Default)]
struct Subscribers {
    senders: Mutex<Vec<mpsc::UnboundedSender<Event>>>,
}

/// Ends the streams of a call that returned: each gives what it holds, then `None`. The
/// engine may still hold the observer (a task it left behind): the senders go all the same.
fn close(streams: Option<Arc<Subscribers>>) {
    if let Some(s) = streams {
        s.senders.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

impl Subscribers {
    fn send(&self, event: impl Fn() -> Event) {
        let mut senders = self.senders.lock().unwrap_or_else(|e| e.into_inner());
        // A dropped stream is let go.
        senders.retain(|tx| tx.send(event()).is_ok());
    }
}

impl Observer for Subscribers {
    fn run_started(&self, run: &RunRecord, _: &Watch) -> Watch {
        self.send(|| Event::RunStarted(run.clone()));
        None
    }
    fn step(&self, _: &Watch, step: &StepRecord) {
        self.send(|| Event::StepFinished(step.clone()));
    }
    fn run_ended(&self, _: &Watch, run: &RunRecord) {
        self.send(|| Event::RunFinished(run.clone()));
    }
}

/// OpenTelemetry export for an application, as `--otlp-endpoint` does for the binary (SPEC
/// §13): a span per run, step, iteration, model turn and tool call, posted over OTLP/HTTP
/// from a thread of its own.
pub struct Otlp(Arc<crate::otel::Exporter>);

impl Otlp {
    /// Starts exporting to `endpoint` (`http://127.0.0.1:4318`, or a URL naming its path)
    /// and installs the exporter as the process's observer: the runs of every
    /// [`Switchyard`] started from now on are exported. Refused when the URL is not an
    /// http(s) URL with a host, or when the process has an observer installed already.
    pub fn install(endpoint: &str) -> Result<Otlp, String> {
        let exporter = crate::otel::Exporter::start(endpoint)?;
        if !crate::runtime::observe::install(exporter.clone()) {
            exporter.finish(std::time::Duration::ZERO);
            return Err("an exporter is installed in this process already".into());
        }
        Ok(Otlp(exporter))
    }

    /// Where spans go: the traces URL.
    pub fn url(&self) -> &str {
        self.0.url()
    }

    /// Sends what is left, waiting at most `within` for the collector, and stops: spans
    /// exported, spans dropped, and why the last were dropped. Call it before the process
    /// exits.
    pub fn finish(&self, within: std::time::Duration) -> (u64, u64, Option<String>) {
        self.0.finish(within)
    }
}
