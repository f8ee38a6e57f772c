//! The executor: runs a compiled [`Plan`] on tokio, step by step, recording every step in a
//! [`Store`] before moving on (SPEC §3–§9).
//!
//! One `Run` is one execution of one flow: the root run, or a child run started by a `flow`
//! agent. It owns the payload; steps borrow it. Routing, retries, loops and limits live here;
//! building inputs and applying outputs is [`super::data`]; evaluating expressions is
//! [`super::eval`]; calling sub-agents is [`crate::agents`].

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::data::{self, Change, Violation};
use super::eval::{self, Vars};
use super::record::{self, RunRecord, RunStatus, StepRecord, StepStatus, Usage};
use super::resume::{Replay, ResumeError, ResumeOptions};
use super::steps::{StepFacts, StepVar, StepsVar};
use super::time::Timestamp;
use super::{ErrorKind, StepError};
use crate::agents::{self, AgentState, CallContext, StepNumber};
use crate::model::{AgentKind, EdgeOn};
use crate::plan::*;
use crate::store::Store;

type NodeIdx = petgraph::stable_graph::NodeIndex;

/// Options of one run tree, from the command line.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// `--allow`: agent kinds the whole tree may use (intersected with every flow's `allow`).
    pub allow: Option<BTreeSet<AgentKind>>,
    /// Agents replaced or removed per flow (`--agent-change`), resolved against the plan.
    pub agent_changes: Arc<AgentChanges>,
    /// The run's conversation (`--messages`), passed on to nested flows; `llm` agents pick
    /// from it by `message_mode`.
    pub messages: Arc<Vec<Value>>,
    /// `--allow-hosts`: the hosts `http` and `llm` agents may reach, on top of every flow's
    /// `allow_hosts`.
    pub allow_hosts: Option<Vec<String>>,
    /// `--max-cost-usd`: the run tree's budget, on top of the flows' `limits.max_cost_usd`.
    pub max_cost_usd: Option<f64>,
}

/// Agent changes resolved against a plan: for each flow (by index into `Plan::flows`),
/// agent name → what to use instead (`None`: removed).
#[derive(Debug, Default)]
pub struct AgentChanges {
    pub per_flow: HashMap<usize, HashMap<String, Option<Arc<AgentPlan>>>>,
    /// Why removed agents are gone, for the error (flow tests: "not mocked").
    pub removed_reason: Option<String>,
    /// Replacements stand in for the agents they replace (flow test mocks): the capability
    /// check uses the replaced agent's kind, so mocking an agent never changes what a flow
    /// may call. Otherwise (`--agent-change`) the replacement is checked as itself.
    pub stand_ins: bool,
}

/// What a finished run returns.
#[derive(Clone, Debug)]
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
}

/// Runs plans against a store.
pub struct Engine<S: Store> {
    pub store: Arc<S>,
}

impl<S: Store> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Engine {
            store: self.store.clone(),
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
    /// What the agent calls of the whole tree have cost so far, in 10⁻⁹ USD.
    spent_nano: AtomicU64,
}

impl Tree {
    fn spent(&self) -> f64 {
        self.spent_nano.load(Ordering::Relaxed) as f64 / 1e9
    }

    fn spend(&self, cost_usd: f64) {
        let nano = (cost_usd * 1e9).round();
        if nano.is_finite() && nano > 0.0 {
            self.spent_nano.fetch_add(nano as u64, Ordering::Relaxed);
        }
    }
}

/// A cost budget (SPEC §9 `max_cost_usd`): `limit` USD from the tree's spending at `base`
/// (a child flow's own limit counts from when it starts). Reached, it stops new agent calls.
#[derive(Clone, Copy, Debug)]
struct Budget {
    base: f64,
    limit: f64,
    by: &'static str,
}

impl Budget {
    fn ceiling(&self) -> f64 {
        self.base + self.limit
    }

    /// The tighter of two budgets.
    fn min(a: Option<Budget>, b: Option<Budget>) -> Option<Budget> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if b.ceiling() < a.ceiling() { b } else { a }),
            (a, b) => a.or(b),
        }
    }
}

/// How a caller stops runs: `cancel` ends them `cancelled`; `pause` stops them at the next
/// recorded point (between steps, between loop iterations) and leaves them `running` in the
/// store, to be resumed.
#[derive(Clone, Debug, Default)]
pub struct RunControls {
    pub cancel: CancellationToken,
    pub pause: CancellationToken,
    /// Called once the root run's work is done and its end handed to the store, before the
    /// commit is waited for: a batch then starts its next item while the end commits.
    pub released: Option<Released>,
}

/// A callback for [`RunControls::released`].
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

impl<S: Store> Engine<S> {
    pub fn new(store: Arc<S>) -> Self {
        Engine { store }
    }

    /// Runs the plan's root flow on `input` to completion.
    pub async fn run(
        &self,
        plan: Arc<Plan>,
        input: Value,
        context: Value,
        options: RunOptions,
    ) -> RunOutcome {
        self.run_with_state(
            plan,
            input,
            context,
            options,
            Arc::new(AgentState::default()),
            CancellationToken::new(),
        )
        .await
    }

    /// Runs with caller-held agent state (flow tests read the call counts from it) and a
    /// cancellation token (Ctrl-C, `runs cancel`).
    pub async fn run_with_state(
        &self,
        plan: Arc<Plan>,
        input: Value,
        context: Value,
        options: RunOptions,
        state: Arc<AgentState>,
        cancel: CancellationToken,
    ) -> RunOutcome {
        let controls = RunControls {
            cancel,
            ..RunControls::default()
        };
        self.run_item(plan, input, context, options, state, controls, None)
            .await
    }

    /// Runs a new root run, recorded as item `item` of a batch when given.
    #[allow(clippy::too_many_arguments)]
    pub async fn run_item(
        &self,
        plan: Arc<Plan>,
        input: Value,
        context: Value,
        options: RunOptions,
        state: Arc<AgentState>,
        controls: RunControls,
        item: Option<BatchItem>,
    ) -> RunOutcome {
        let (tree, lineage) = Self::tree(
            plan,
            context,
            Timestamp::now(),
            options,
            controls,
            ResumeOptions::default(),
        );
        let root = tree.plan.root;
        // The root run in place: only child runs need the boxed, recursive `run_flow`.
        let flow = tree.plan.flow(root).clone();
        let mut run = Run::new(self, &tree, flow, root, input, lineage, &state, None);
        if let Some(item) = item {
            run.record.batch = Some(item.batch);
            run.record.item_id = Some(item.id);
            run.record.item_index = Some(item.index);
        }
        run.execute().await
    }

    /// Continues the stored root run `run_id` of `plan`'s root flow (SPEC §3.6, §7.3): what
    /// finished is replayed from its records, the rest runs.
    pub async fn resume(
        &self,
        plan: Arc<Plan>,
        run_id: &str,
        options: RunOptions,
        resume: ResumeOptions,
        state: Arc<AgentState>,
        controls: RunControls,
    ) -> Result<RunOutcome, ResumeError> {
        let record = self.store.get_run(run_id).await?;
        if let Some(parent) = &record.parent_run {
            return Err(ResumeError::Child {
                id: record.id,
                parent: parent.clone(),
            });
        }
        if !super::resume::resumable(record.status) {
            return Err(ResumeError::Finished {
                id: record.id,
                status: record.status.as_str(),
            });
        }
        let root = plan.root();
        if record.flow != root.name {
            return Err(ResumeError::OtherFlow {
                id: record.id,
                recorded: record.flow,
                given: root.name.clone(),
            });
        }
        if record.flow_hash != root.hash && !resume.allow_changed {
            return Err(ResumeError::Changed {
                id: record.id,
                flow: record.flow,
                recorded: record.flow_hash,
                now: root.hash.clone(),
            });
        }
        let replay = Replay::load(&*self.store, run_id).await?;
        self.check_decision(&plan, &record, &replay, &resume).await?;
        // The conversation the run started with, unless the caller gives one.
        let mut options = options;
        if options.messages.is_empty()
            && let Some(Value::Array(m)) = &record.messages
        {
            options.messages = Arc::new(m.clone());
        }
        let context = record.context.clone();
        let now = recorded_now(&record);
        let (tree, lineage) = Self::tree(plan, context, now, options, controls, resume);
        let root = tree.plan.root;
        let flow = tree.plan.flow(root).clone();
        let input = record.input.clone();
        let mut run = Run::new(
            self,
            &tree,
            flow,
            root,
            input,
            lineage,
            &state,
            Some((record, Arc::new(replay))),
        );
        Ok(run.execute().await)
    }

    /// A run waiting at an `interrupt` (its own or a descendant's) needs a decision that
    /// matches the step's `schema`; a decision needs such a run.
    async fn check_decision(
        &self,
        plan: &Plan,
        record: &RunRecord,
        replay: &Replay,
        resume: &ResumeOptions,
    ) -> Result<(), ResumeError> {
        // The waiting interrupt: in this run, or down the chain of interrupted children.
        let waiting = super::resume::waiting_interrupt(&*self.store, record, replay).await?;
        match (waiting, &resume.decision) {
            (Some(w), None) if record.status == RunStatus::Interrupted => Err(ResumeError::NeedsDecision {
                id: record.id.clone(),
                step: w.step.step,
            }),
            (Some(_), None) => Ok(()),
            (None, Some(_)) => Err(ResumeError::NoInterrupt {
                id: record.id.clone(),
            }),
            (None, None) => Ok(()),
            (Some(w), Some(decision)) => {
                let schema = plan
                    .flows
                    .iter()
                    .filter(|f| f.name == w.flow)
                    .find_map(|f| f.steps.get(&w.step.step).and_then(|n| f.step(*n)))
                    .and_then(|s| match &s.kind {
                        StepPlanKind::Interrupt(i) => i.schema.clone(),
                        _ => None,
                    });
                if let Some(schema) = schema
                    && let Err(v) = schema.check(decision)
                {
                    return Err(ResumeError::BadDecision {
                        step: w.step.step,
                        reason: v.to_string(),
                        pointer: v.pointer.clone(),
                    });
                }
                Ok(())
            }
        }
    }

    fn tree(
        plan: Arc<Plan>,
        context: Value,
        now: Timestamp,
        options: RunOptions,
        controls: RunControls,
        resume: ResumeOptions,
    ) -> (Arc<Tree>, Lineage) {
        let max_depth = plan.root().limits.max_depth;
        let allow = intersect(options.allow.clone(), plan.root().allow.clone());
        let hosts = options
            .allow_hosts
            .iter()
            .chain(plan.root().allow_hosts.iter())
            .map(|h| Arc::from(h.as_slice()))
            .collect();
        let budget = Budget::min(
            options.max_cost_usd.map(|limit| Budget {
                base: 0.0,
                limit,
                by: "--max-cost-usd",
            }),
            plan.root().limits.max_cost_usd.map(|limit| Budget {
                base: 0.0,
                limit,
                by: "limits.max_cost_usd",
            }),
        );
        let tree = Arc::new(Tree {
            plan,
            context,
            now,
            options,
            cancel: controls.cancel,
            pause: controls.pause,
            released: controls.released,
            resume,
            store_failure: std::sync::Mutex::new(None),
            spent_nano: AtomicU64::new(0),
        });
        let lineage = Lineage {
            parent_run: None,
            prefix: String::new(),
            depth: 0,
            max_depth,
            allow,
            hosts,
            budget,
        };
        (tree, lineage)
    }

    fn run_flow<'a>(
        &'a self,
        tree: &'a Arc<Tree>,
        flow_ref: FlowRef,
        input: Value,
        lineage: Lineage,
        state: &'a Arc<AgentState>,
        resumed: Option<(RunRecord, Arc<Replay>)>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = RunOutcome> + Send + 'a>> {
        Box::pin(async move {
            let flow = tree.plan.flow(flow_ref).clone();
            let mut run = Run::new(self, tree, flow, flow_ref, input, lineage, state, resumed);
            run.execute().await
        })
    }
}

/// The `now` a run tree recorded at its first start; a run recorded before `now` was (schema
/// 4 and older) takes its start, to the millisecond.
fn recorded_now(record: &RunRecord) -> Timestamp {
    record
        .now_us
        .and_then(Timestamp::from_unix_micros)
        .or_else(|| {
            let micros = i64::try_from(record.started_at).ok()?.checked_mul(1000)?;
            Timestamp::from_unix_micros(micros)
        })
        .unwrap_or_else(Timestamp::now)
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
    numbered: u64,
    path: Vec<String>,
    started: Instant,
    /// Resuming: the run's records, replayed instead of calling again.
    replay: Option<Arc<Replay>>,
}

impl<'e, S: Store> Run<'e, S> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        engine: &'e Engine<S>,
        tree: &'e Arc<Tree>,
        flow: Arc<FlowPlan>,
        flow_ref: FlowRef,
        input: Value,
        lineage: Lineage,
        state: &'e Arc<AgentState>,
        resumed: Option<(RunRecord, Arc<Replay>)>,
    ) -> Self {
        let steps = StepsVar::new(flow.clone());
        let payload = input.clone();
        let (earlier, replay) = resumed.unzip();
        let record = match earlier {
            // Resumed: the same run, running again; usage and steps are counted anew as the
            // records replay.
            Some(earlier) => RunRecord {
                status: RunStatus::Running,
                output: None,
                error: None,
                finished_at: None,
                usage: Usage::default(),
                steps: 0,
                // A run from before schema 5 records the `now` it is resumed with.
                now_us: Some(tree.now.unix_micros()),
                ..earlier
            },
            None => RunRecord {
                id: record::new_run_id(),
                flow: flow.name.clone(),
                flow_hash: flow.hash.clone(),
                parent_run: lineage.parent_run.clone(),
                parent_step: (!lineage.prefix.is_empty()).then(|| lineage.prefix.clone()),
                depth: lineage.depth,
                status: RunStatus::Running,
                input,
                output: None,
                error: None,
                started_at: record::now_ms(),
                finished_at: None,
                usage: Usage::default(),
                steps: 0,
                context: if lineage.depth == 0 {
                    tree.context.clone()
                } else {
                    Value::Null
                },
                batch: None,
                item_id: None,
                item_index: None,
                now_us: Some(tree.now.unix_micros()),
                messages: (lineage.depth == 0 && !tree.options.messages.is_empty())
                    .then(|| Value::Array((*tree.options.messages).clone())),
                flow_path: if lineage.depth == 0 {
                    flow.path.as_ref().map(|p| p.display().to_string())
                } else {
                    None
                },
            },
        };
        Run {
            engine,
            tree,
            flow,
            flow_ref,
            lineage,
            state,
            record,
            payload,
            payload_bound: 0,
            steps,
            executed: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            answers: Default::default(),
            numbered: 0,
            path: Vec::new(),
            started: Instant::now(),
            replay,
        }
    }

    async fn execute(&mut self) -> RunOutcome {
        // Queued: the run's first awaited write (a step, or its end) commits it too.
        if let Err(e) = self.engine.store.queue_run(&self.record).await {
            let e = self.store_error(&e);
            return self.finish(RunStatus::Failed, None, Some(e)).await;
        }
        tracing::info!(run_id = %self.record.id, flow = %self.flow.name, depth = self.lineage.depth, "run started");
        // Every violation at once: a caller fixes its input in one go.
        if let Some(schema) = &self.flow.input_schema
            && let violations = schema.violations(&self.record.input)
            && let Some(first) = violations.first()
        {
            let message = match violations.as_slice() {
                [v] => format!("the run input does not match `input.schema` {v}"),
                all => {
                    let each: Vec<String> = all.iter().map(ToString::to_string).collect();
                    format!(
                        "the run input does not match `input.schema` ({} violations): {}",
                        all.len(),
                        each.join("; ")
                    )
                }
            };
            let listed: Vec<Value> = violations
                .iter()
                .map(|v| serde_json::json!({"pointer": v.pointer, "message": v.message}))
                .collect();
            let e = StepError::new(ErrorKind::Mapping, message)
                .with_details(serde_json::json!({"pointer": first.pointer, "violations": listed}));
            return self.finish(RunStatus::Failed, None, Some(e)).await;
        }
        // The payload starts as the input: an input over `max_payload_bytes` fails the run
        // before any step, rather than at whichever step first writes.
        if let Err(e) = self.measure_payload() {
            return self.finish(RunStatus::Failed, None, Some(e)).await;
        }
        let result = self.walk().await;
        match result {
            Ok(RunStatus::Succeeded) => match self.output() {
                Ok(output) => self.finish(RunStatus::Succeeded, Some(output), None).await,
                Err(e) => self.finish(RunStatus::Failed, None, Some(e)).await,
            },
            Ok(status) => self.finish(status, None, None).await,
            Err((status, e)) => self.finish(status, None, Some(e)).await,
        }
    }

    /// The run's output: `output.select` over the final payload (or all of it), checked
    /// against `output.schema`.
    fn output(&mut self) -> Result<Value, StepError> {
        let output = match &self.flow.output_select {
            Some(sel) if sel.is_singular() => sel.get(&self.payload).cloned().ok_or_else(|| {
                StepError::mapping(format!(
                    "`output.select` `{}` matched nothing in the final payload",
                    sel.text()
                ))
            })?,
            Some(sel) => Value::Array(sel.query(&self.payload).into_iter().cloned().collect()),
            None => std::mem::take(&mut self.payload),
        };
        if let Some(schema) = &self.flow.output_schema
            && let Err(v) = schema.check(&output)
        {
            return Err(StepError::new(
                ErrorKind::InvalidOutput,
                format!("the run output does not match `output.schema` {v}"),
            )
            .with_details(serde_json::json!({"pointer": v.pointer})));
        }
        Ok(output)
    }

    async fn finish(
        &mut self,
        status: RunStatus,
        output: Option<Value>,
        error: Option<StepError>,
    ) -> RunOutcome {
        self.record.status = status;
        // Lent to the record while the store copies it, then given back.
        self.record.output = output;
        // A paused run is still `running`, without an end: its error on record says it was
        // paused, so `runs show` can tell that nothing runs it (a resume clears it).
        let paused = status == RunStatus::Running;
        self.record.error = error;
        self.record.finished_at = (!paused).then(record::now_ms);
        self.record.steps = if paused {
            self.finished.load(Ordering::Relaxed)
        } else {
            self.executed.load(Ordering::Relaxed)
        };
        // The root's work is done: what is left is waiting for the commit of its end.
        if self.lineage.depth == 0
            && let Some(released) = &self.tree.released
        {
            (released.0)();
        }
        // After a failed store write the run's end is not recorded either: it stays `running`,
        // to be resumed once the store works, rather than ending `failed` for the store's sake.
        if self.store_failed().is_some() {
            tracing::warn!(run_id = %self.record.id, "the store failed: the end of the run is not recorded");
        } else if let Err(e) = self.engine.store.update_run(&self.record).await {
            tracing::error!(run_id = %self.record.id, error = %e, "could not record the end of the run");
            self.store_error(&e);
        }
        let output = self.record.output.take();
        let error = self.record.error.take();
        tracing::info!(
            run_id = %self.record.id,
            status = status.as_str(),
            duration_ms = self.started.elapsed().as_millis() as u64,
            error = error.as_ref().map(|e| e.to_string()).unwrap_or_default(),
            "run finished"
        );
        RunOutcome {
            run_id: self.record.id.clone(),
            status,
            output,
            error,
            path: std::mem::take(&mut self.path),
            usage: self.record.usage,
            steps: self.record.steps,
            duration_ms: self
                .record
                .finished_at
                .unwrap_or_else(record::now_ms)
                .saturating_sub(self.record.started_at),
            store_failure: self.store_failed(),
        }
    }

    /// Records a step part, waiting for the commit unless `queued` ([`Store::queue_step`]).
    /// The record is built only for a store that keeps steps ([`Store::keeps_steps`]).
    /// Once a store write of this tree failed, nothing more is written: a record made after
    /// a lost one (a step failed *because* the store failed) would tell a resume a wrong story.
    async fn record_with(&self, rec: impl FnOnce() -> StepRecord, queued: bool) -> Result<(), StepError> {
        let store = &self.engine.store;
        if !store.keeps_steps() {
            return Ok(());
        }
        if let Some(why) = self.store_failed() {
            return Err(StepError::new(ErrorKind::Agent, format!("store: {why}")));
        }
        let written = if queued {
            store.queue_step(rec()).await
        } else {
            store.record_step(rec()).await
        };
        written.map_err(|e| self.store_error(&e))
    }

    /// The input document a step's record keeps: copied, if borrowed, only for a store that
    /// keeps step records.
    fn recorded_input(&self, input: std::borrow::Cow<'_, Value>) -> Option<Value> {
        self.engine.store.keeps_steps().then(|| input.into_owned())
    }

    async fn record(&self, rec: impl FnOnce() -> StepRecord) -> Result<(), StepError> {
        self.record_with(rec, false).await
    }

    fn store_failed(&self) -> Option<String> {
        self.tree
            .store_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The error a failed store write becomes; the tree remembers the first.
    fn store_error(&self, e: &crate::store::StoreError) -> StepError {
        let message = format!("store: {e}");
        let mut first = self.tree.store_failure.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(e.to_string());
        }
        StepError::new(ErrorKind::Agent, message)
    }

    /// The next step's number: `3`, or `2.3` in a child run started by step `2`.
    fn number(&mut self) -> String {
        self.numbered += 1;
        let prefix = &self.lineage.prefix;
        let mut s = String::with_capacity(prefix.len() + 8);
        if !prefix.is_empty() {
            s.push_str(prefix);
            s.push('.');
        }
        push_decimal(&mut s, self.numbered);
        s
    }

    /// Counts a step execution against `limits.max_steps`.
    fn count_step(&self) -> Result<(), StepError> {
        let executed = self.executed.fetch_add(1, Ordering::Relaxed) + 1;
        let max = self.flow.limits.max_steps;
        if executed > max {
            return Err(StepError::new(
                ErrorKind::Limit,
                format!("step limit reached ({} {max})", self.flow.limits.max_steps_name()),
            ));
        }
        Ok(())
    }

    /// Walks the graph from `start` until the run ends.
    async fn walk(&mut self) -> Result<RunStatus, (RunStatus, StepError)> {
        let flow = self.flow.clone();
        let mut node = flow.start;
        loop {
            if node == flow.end {
                return Ok(RunStatus::Succeeded);
            }
            let step = flow.step(node).expect("non-end nodes are steps");
            if self.tree.cancel.is_cancelled() {
                return Err((
                    RunStatus::Cancelled,
                    StepError::new(ErrorKind::Cancelled, "the run was cancelled"),
                ));
            }
            if self.tree.pause.is_cancelled() {
                return Err((RunStatus::Running, paused()));
            }
            self.count_step().map_err(|e| (RunStatus::Failed, e))?;
            self.path.push(step.id.clone());
            let number = self.number();
            let started_at = record::now_ms();
            let t0 = Instant::now();
            tracing::debug!(run_id = %self.record.id, step = %step.id, number = %number, kind = step.kind.name(), "step started");
            // `limits.timeout` bounds the whole run; the step running when it passes is
            // recorded as failed with kind `limit`.
            let mut outcome = match self.flow.limits.timeout {
                Some(t) => {
                    let deadline = tokio::time::Instant::from_std(self.started + t);
                    // Boxed: the future of a step is large, and one copy of it in this
                    // function's state is enough (the branch below).
                    tokio::select! {
                        o = Box::pin(self.step(step, &number)) => o,
                        _ = tokio::time::sleep_until(deadline) => {
                            let mut o = StepOutcome::err(StepError::new(
                                ErrorKind::Limit,
                                format!(
                                    "run timeout reached ({} {})",
                                    self.flow.limits.timeout_name(),
                                    fmt_duration(t)
                                ),
                            ));
                            o.stop = Some(RunStatus::Failed);
                            o
                        }
                    }
                }
                None => self.step(step, &number).await,
            };
            let duration_ms = t0.elapsed().as_millis() as u64;
            self.record.usage.add(outcome.usage);
            if outcome.stop == Some(RunStatus::Running) {
                // Paused inside the step: what it finished is recorded; it runs on when
                // the run resumes.
                return Err((RunStatus::Running, paused()));
            }
            // Resuming: a step whose own record finished is on record already.
            let recorded = self
                .replay
                .as_ref()
                .is_some_and(|r| r.finished(&number, None).is_some());

            let status = match (&outcome.error, outcome.stop) {
                (_, Some(RunStatus::Interrupted)) => StepStatus::Interrupted,
                (Some(_), _) => StepStatus::Failed,
                (None, _) => StepStatus::Succeeded,
            };
            // `steps.<id>` takes the result (moved, not copied); edges read it from there.
            let facts = StepFacts {
                status,
                error: outcome.error.clone(),
                attempts: outcome.attempts,
                duration_ms,
                failed: std::mem::take(&mut outcome.failed),
                iterations: outcome.iterations,
            };
            let entry = self.steps.finish(step, node, facts, outcome.result.take());

            let route: Result<Option<NodeIdx>, StepError> = match outcome.stop {
                Some(_) => Ok(None),
                None => self.route(step, &number, &outcome, entry),
            };
            let route_name = match &route {
                Ok(Some(n)) => Some(flow.step(*n).map_or_else(|| "end".to_string(), |s| s.id.clone())),
                _ => None,
            };
            for v in &outcome.violations {
                tracing::warn!(run_id = %self.record.id, step = %step.id, path = %v.path, reason = %v.reason, "output violation");
            }
            tracing::debug!(
                run_id = %self.record.id, step = %step.id, number = %number, status = status.as_str(),
                duration_ms, route = route_name.as_deref().unwrap_or(""), "step finished"
            );
            self.finished.fetch_add(1, Ordering::Relaxed);
            if !recorded {
                let rec = || StepRecord {
                    run_id: self.record.id.clone(),
                    number,
                    step: step.id.clone(),
                    kind: step.kind.name().to_string(),
                    attempt: outcome.attempts,
                    status,
                    iteration: None,
                    iterations: outcome.iterations,
                    input: outcome.input,
                    // `steps.<id>` keeps the result; the record shares it.
                    result: self.steps.entry(entry).result.clone(),
                    changes: outcome.changes,
                    violations: outcome.violations,
                    error: outcome.error.clone(),
                    started_at,
                    finished_at: Some(record::now_ms()),
                    usage: outcome.usage,
                    child_run: outcome.child_run,
                    route: route_name,
                    answers: outcome.answers,
                };
                // The run's last step: its end, written next and waited for, commits this too.
                let last = outcome.stop.is_some() || !matches!(&route, Ok(Some(n)) if *n != flow.end);
                if let Err(e) = self.record_with(rec, last).await {
                    return Err((RunStatus::Failed, e));
                }
            }
            if let Some(stop) = outcome.stop {
                return match (stop, outcome.error) {
                    (RunStatus::Succeeded, _) => Ok(RunStatus::Succeeded),
                    (RunStatus::Interrupted, Some(e)) => Err((RunStatus::Interrupted, self.at_step(step, e))),
                    (RunStatus::Interrupted, None) => Ok(RunStatus::Interrupted),
                    (s, Some(e)) => Err((s, self.at_step(step, e))),
                    (s, None) => Ok(s),
                };
            }
            match route {
                Ok(Some(next)) => node = next,
                Ok(None) => {
                    return match outcome.error {
                        None => Ok(RunStatus::Succeeded),
                        Some(e) => Err((status_for(&e), self.at_step(step, e))),
                    };
                }
                Err(e) => return Err((status_for(&e), self.at_step(step, e))),
            }
        }
    }

    /// The run's error, from the error of the step it stopped at. A root run's names the step
    /// (``step `classify`: `$.ticket.subjet` matched nothing``) unless it starts with it already;
    /// a child run's stays the step's, which its calling step fails with as it is (and the
    /// root names that step). The step's own error (`steps.<id>.error`, its record) is unchanged.
    fn at_step(&self, step: &StepPlan, mut e: StepError) -> StepError {
        let prefix = format!("step `{}`: ", step.id);
        if self.lineage.depth == 0 && !e.message.starts_with(&prefix[..prefix.len() - 2]) {
            e.message.insert_str(0, &prefix);
        }
        e
    }

    /// Picks the edge to follow (SPEC §4). `Ok(None)`: the step has no `next`.
    fn route(
        &self,
        step: &StepPlan,
        number: &str,
        outcome: &StepOutcome,
        entry: usize,
    ) -> Result<Option<NodeIdx>, StepError> {
        if !step.has_next {
            return Ok(None);
        }
        let failed = outcome.error.is_some();
        let kind = outcome.error.as_ref().map_or("", |e| e.kind.as_str());
        // Edges that were tried and did not match: explained only if none does.
        let mut tried = Vec::new();
        let entry = self.steps.entry(entry);
        // `step` is built only if a condition reads it.
        let step_var = StepVar::new(&step.id, &entry.facts);
        let target = |to: NodeIdx| self.flow.step(to).map_or("end", |s| s.id.as_str());
        for (edge, to) in self.flow.routes(step) {
            let on_matches = match edge.on {
                EdgeOn::Success => !failed,
                EdgeOn::Failure => failed,
                EdgeOn::Always => true,
            };
            if !on_matches {
                continue;
            }
            if let Some(kinds) = &edge.errors
                && !kinds.iter().any(|k| k == kind)
            {
                tried.push((edge, to));
                continue;
            }
            if let Some(cond) = &edge.cond {
                let vars = Vars {
                    payload: Some(&self.payload),
                    input: Some(&self.record.input),
                    context: Some(&self.tree.context),
                    result: Some(entry.result_or_null()),
                    step: Some(&step_var),
                    steps: Some(&self.steps),
                    message: None,
                    locals: &[],
                    now: Some(self.tree.now),
                };
                match eval::eval_bool(cond, &vars) {
                    Ok(true) => {}
                    Ok(false) => {
                        tried.push((edge, to));
                        continue;
                    }
                    Err(e) => {
                        // `e.message` already starts with the expression: "`cond`: cause".
                        return Err(StepError::expression(format!(
                            "step `{}`: the condition of the edge to `{}` failed: {}",
                            step.id,
                            target(to),
                            e.message
                        )));
                    }
                }
            }
            tracing::debug!(run_id = %self.record.id, step = %step.id, number, to = %target(to), "route");
            return Ok(Some(to));
        }
        match &outcome.error {
            // An unmatched failure fails the run with the step's own error.
            Some(e) => Err(e.clone()),
            None => {
                let tried: Vec<String> = tried
                    .into_iter()
                    .map(|(edge, to)| match (&edge.errors, &edge.cond) {
                        (Some(kinds), _) if !kinds.iter().any(|k| k == kind) => format!(
                            "to `{}`: errors [{}] (kind was `{kind}`)",
                            target(to),
                            kinds.join(", ")
                        ),
                        (_, Some(cond)) => format!("to `{}`: if {} → false", target(to), cond.text()),
                        (_, None) => format!("to `{}`", target(to)),
                    })
                    .collect();
                let listed = if tried.is_empty() {
                    "it has no success edge".to_string()
                } else {
                    tried.join("; ")
                };
                Err(StepError::new(
                    ErrorKind::NoRoute,
                    format!("step `{}`: no edge matched: {listed}", step.id),
                )
                .with_details(Value::Array(tried.into_iter().map(Value::String).collect())))
            }
        }
    }

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

    async fn step(&mut self, step: &StepPlan, number: &str) -> StepOutcome {
        match &step.kind {
            StepPlanKind::Set(set) => {
                // Resuming: a `set` that finished is replayed from its record, its writes as
                // they were made, so a flow changed since (`--allow-changed`) does not rewrite
                // what the run already did.
                if let Some(rec) = self.replay.as_ref().and_then(|r| r.finished(number, None)) {
                    if let Some(e) = &rec.error {
                        return StepOutcome::err(e.clone());
                    }
                    let mut payload = std::mem::take(&mut self.payload);
                    let replayed = data::replay_changes(&mut payload, &rec.changes);
                    self.payload = payload;
                    let mut o = match replayed {
                        Ok(()) => StepOutcome::ok(None),
                        Err(e) => StepOutcome::err(e),
                    };
                    o.replayed = true;
                    return o;
                }
                let mut changes = Vec::new();
                let mut payload = std::mem::take(&mut self.payload);
                let applied = {
                    let vars = self.vars(&[]);
                    data::apply_set(set, &mut payload, &vars, &mut changes)
                };
                self.payload = payload;
                match applied.and_then(|()| self.check_payload_size(&changes)) {
                    Ok(()) => {
                        let mut o = StepOutcome::ok(None);
                        o.changes = changes;
                        o
                    }
                    Err(e) => StepOutcome::err(e),
                }
            }
            StepPlanKind::Call(call) => self.call_step(step, call, number).await,
            // Loops and `parallel` are boxed: their futures are large, and every run's future
            // would carry them (spawned runs copy it around). One allocation per such step.
            StepPlanKind::Foreach(f) => Box::pin(self.foreach_step(step, f, number)).await,
            StepPlanKind::While(w) => Box::pin(self.while_step(step, w, number)).await,
            StepPlanKind::Parallel(p) => Box::pin(self.parallel_step(step, p, number)).await,
            StepPlanKind::Interrupt(i) => {
                let vars = self.vars(&[]);
                let input = match data::build_input(&i.input, i.scope.as_ref(), &self.payload, &vars) {
                    Ok(v) => v,
                    Err(e) => return StepOutcome::err(e),
                };
                // Resuming: the decision recorded before, or the one given now to the
                // interrupt the run waits at, is the step's result.
                let earlier = self.replay.as_ref().and_then(|r| r.part(number, None));
                let decision = match earlier {
                    Some(rec) if rec.status == StepStatus::Succeeded => rec.result.clone(),
                    Some(rec) if rec.status == StepStatus::Interrupted => match &self.tree.resume.decision {
                        Some(d) => {
                            if let Some(expires) = i.expires {
                                let waited = record::now_ms().saturating_sub(rec.started_at);
                                if u128::from(waited) > expires.as_millis() {
                                    let mut o = StepOutcome::err(StepError::new(
                                        ErrorKind::Timeout,
                                        format!(
                                            "the decision for interrupt step `{}` came after it expired ({} after it stopped)",
                                            step.id,
                                            fmt_duration(expires)
                                        ),
                                    ));
                                    o.input = Some(input);
                                    return o;
                                }
                            }
                            Some(Arc::new(d.clone()))
                        }
                        None => None,
                    },
                    _ => None,
                };
                if let Some(decision) = decision {
                    let mut o = StepOutcome::ok(None);
                    let mut changes = Vec::new();
                    let mut payload = std::mem::take(&mut self.payload);
                    let applied = {
                        let vars = Vars {
                            result: Some(&*decision),
                            ..self.vars(&[])
                        };
                        data::apply_output(
                            &i.output,
                            i.scope.as_ref(),
                            &mut payload,
                            &decision,
                            &vars,
                            &mut changes,
                        )
                    };
                    self.payload = payload;
                    match applied {
                        Ok(v) => {
                            o.violations = v;
                            if let Err(e) = self.check_payload_size(&changes) {
                                o.error = Some(e);
                            }
                            o.changes = changes;
                        }
                        Err(e) => o.error = Some(e),
                    }
                    o.input = Some(input);
                    o.result = Some(decision);
                    return o;
                }
                // The question, as the person deciding needs it (`runs show`): the prompt,
                // the schema the decision must match, and when it expires (Unix ms).
                let mut question = Map::new();
                if let Some(p) = &i.prompt {
                    let vars = Vars {
                        input: Some(&input),
                        ..self.vars(&[])
                    };
                    match eval::render(p, &vars) {
                        Ok(text) => {
                            question.insert("prompt".into(), Value::String(text));
                        }
                        Err(e) => return StepOutcome::err(e),
                    }
                }
                if let Some(schema) = &i.schema {
                    question.insert("schema".into(), schema.value.clone());
                }
                if let Some(expires) = i.expires {
                    let ms = u64::try_from(expires.as_millis()).unwrap_or(u64::MAX);
                    question.insert("expires_at".into(), record::now_ms().saturating_add(ms).into());
                }
                let mut o = StepOutcome::ok(None);
                if !question.is_empty() {
                    o.result = Some(Arc::new(Value::Object(question)));
                }
                o.input = Some(input);
                o.stop = Some(RunStatus::Interrupted);
                o
            }
            StepPlanKind::Fail { kind, message } => {
                // A message that cannot be rendered does not change what the run fails with:
                // the `fail`'s kind, with the template's error for a message.
                let (text, details) = match message {
                    Some(m) => match eval::render(m, &self.vars(&[])) {
                        Ok(t) => (t, None),
                        Err(e) => (
                            format!("the `fail` message could not be rendered: {}", e.message),
                            e.details,
                        ),
                    },
                    None => (format!("the flow failed at step `{}`", step.id), None),
                };
                let mut error = StepError::new(ErrorKind::parse(kind), text);
                error.details = details;
                let mut o = StepOutcome::err(error);
                o.stop = Some(RunStatus::Failed);
                o
            }
            StepPlanKind::Succeed => {
                let mut o = StepOutcome::ok(None);
                o.stop = Some(RunStatus::Succeeded);
                o
            }
        }
    }

    /// Measures the payload against `limits.max_payload_bytes` (the run input, before any
    /// step), and starts the bound [`Run::check_payload_size`] keeps.
    fn measure_payload(&mut self) -> Result<(), StepError> {
        let max = self.flow.limits.max_payload_bytes;
        let size = json_size(&self.payload, max + 1);
        if size > max {
            return Err(payload_limit(self.flow.limits.max_payload_bytes_name(), max));
        }
        self.payload_bound = size;
        Ok(())
    }

    /// Checks `limits.max_payload_bytes` after the writes `changes` made. Walking the whole
    /// payload after every write would cost O(payload) per step (quadratic over a loop that
    /// grows it), so the run keeps an upper bound of the payload's size: a write adds at most
    /// the size of its value and of the containers its path creates. Only when that bound
    /// passes the limit is the payload measured (and the bound reset to its size): the step
    /// fails exactly when the payload is over the limit, as if it were measured every time.
    fn check_payload_size(&mut self, changes: &[Change]) -> Result<(), StepError> {
        let max = self.flow.limits.max_payload_bytes;
        let mut bound = self.payload_bound;
        for c in changes {
            if bound > max {
                break;
            }
            bound = bound
                .saturating_add(json_size(&c.value, max + 1))
                .saturating_add(write_overhead(&c.path));
        }
        if bound <= max {
            self.payload_bound = bound;
            return Ok(());
        }
        self.measure_payload()
    }

    /// The agent a call uses after `--agent-change`, checked against the capability set.
    fn effective_agent(&self, call: &CallPlan) -> Result<Arc<AgentPlan>, StepError> {
        let mut agent = call.agent.clone();
        let mut kind = agent.kind();
        if let Some(changes) = self.tree.options.agent_changes.per_flow.get(&self.flow_ref.0)
            && let Some(change) = changes.get(&agent.name)
        {
            match change {
                Some(replacement) => {
                    agent = replacement.clone();
                    if !self.tree.options.agent_changes.stand_ins {
                        kind = agent.kind();
                    }
                }
                None => {
                    self.state.refuse(&agent.name);
                    let why = self
                        .tree
                        .options
                        .agent_changes
                        .removed_reason
                        .as_deref()
                        .unwrap_or("removed by an agent change");
                    return Err(StepError::new(
                        ErrorKind::Capability,
                        format!("agent `{}` of flow `{}` is {why}", agent.name, self.flow.name),
                    ));
                }
            }
        }
        if let Some(allow) = &self.lineage.allow
            && !allow.contains(&kind)
        {
            let allowed: Vec<&str> = allow.iter().map(|k| k.as_str()).collect();
            return Err(StepError::new(
                ErrorKind::Capability,
                format!(
                    "agent `{}` is of kind `{}`, which is not allowed here (allowed: {})",
                    agent.name,
                    kind.as_str(),
                    if allowed.is_empty() {
                        "none".to_string()
                    } else {
                        allowed.join(", ")
                    }
                ),
            ));
        }
        Ok(agent)
    }

    /// Fails with kind `limit` once the tree has spent its budget.
    fn check_budget(&self) -> Result<(), StepError> {
        let Some(b) = self.lineage.budget else {
            return Ok(());
        };
        let spent = self.tree.spent();
        // `max_cost_usd: 0` allows calls until one costs something.
        if spent < b.ceiling() || spent <= b.base {
            return Ok(());
        }
        Err(StepError::new(
            ErrorKind::Limit,
            format!(
                "cost limit reached: ${:.6} spent ({} {})",
                spent - b.base,
                b.by,
                b.limit
            ),
        )
        .with_details(serde_json::json!({"spent_usd": spent - b.base, "limit_usd": b.limit})))
    }

    /// Applies a call's `output` to the payload; a failed mapping changes nothing.
    fn apply(
        &mut self,
        call: &CallPlan,
        result: &Arc<Value>,
        locals: &[(&str, &Value)],
        outcome: &mut StepOutcome,
    ) {
        let mut changes = Vec::new();
        let mut payload = std::mem::take(&mut self.payload);
        let applied = {
            let vars = Vars {
                result: Some(&**result),
                ..self.vars(locals)
            };
            data::apply_output(
                &call.output,
                call.scope.as_ref(),
                &mut payload,
                result,
                &vars,
                &mut changes,
            )
        };
        self.payload = payload;
        match applied {
            Ok(v) => {
                outcome.violations.extend(v);
                if let Err(e) = self.check_payload_size(&changes) {
                    outcome.error = Some(e);
                }
                outcome.changes.extend(changes);
            }
            Err(e) => outcome.error = Some(e),
        }
    }

    fn message(&self, call: &CallPlan, vars: &Vars) -> Result<Option<String>, StepError> {
        call.message.as_ref().map(|m| eval::render(m, vars)).transpose()
    }

    async fn call_step(&mut self, step: &StepPlan, call: &CallPlan, number: &str) -> StepOutcome {
        let prepared = {
            let vars = self.vars(&[]);
            // Borrowed when it is the whole payload: copied only for a store that keeps it.
            data::build_input_ref(&call.input, call.scope.as_ref(), &self.payload, &vars)
                .and_then(|input| Ok((input, self.message(call, &vars)?)))
        };
        let (input, message) = match prepared {
            Ok(p) => p,
            Err(e) => return StepOutcome::err(e),
        };
        let mut outcome = self
            .invoke(
                step,
                call,
                &input,
                message.as_deref(),
                StepNumber::of(number),
                "agent",
            )
            .await;
        outcome.input = self.recorded_input(input);
        if outcome.error.is_none()
            && let Some(result) = outcome.result.take()
        {
            self.apply(call, &result, &[], &mut outcome);
            outcome.result = Some(result);
        }
        outcome
    }

    /// A call that finished before a resume: its record stands in for it. Its calls still
    /// count, so that scripted agents continue where they were, and what it cost still counts
    /// against the budget.
    fn replayed(&self, call: &CallPlan, rec: &StepRecord) -> StepOutcome {
        for _ in 0..rec.attempt {
            self.state.next_call(&call.agent.name);
        }
        let mut o = match &rec.error {
            Some(e) => StepOutcome::err(e.clone()),
            None => StepOutcome::shared(rec.result.clone()),
        };
        o.attempts = rec.attempt;
        o.usage = rec.usage;
        self.tree.spend(rec.usage.cost_usd);
        o.child_run = rec.child_run.clone();
        o.replayed = true;
        o
    }

    /// Calls an agent with retries and per-attempt timeouts; returns its result, not mapped.
    /// `part` is the kind its records have: `agent`, `iteration` or `branch`.
    async fn invoke(
        &self,
        step: &StepPlan,
        call: &CallPlan,
        input: &Value,
        message: Option<&str>,
        number: StepNumber<'_>,
        part: &'static str,
    ) -> StepOutcome {
        let mut attempt = 0u32;
        if let Some(rec) = self
            .replay
            .as_ref()
            .and_then(|r| r.part(number.step, number.iteration))
        {
            match rec.status {
                StepStatus::Succeeded | StepStatus::Failed => return self.replayed(call, rec),
                StepStatus::Started | StepStatus::Interrupted => {
                    // An attempt started and never finished: it may have had its effect.
                    if !(call.idempotent || self.tree.resume.retry_in_doubt) {
                        let mut o = StepOutcome::err(
                            StepError::new(
                                ErrorKind::InDoubt,
                                format!(
                                    "step `{}` ({number}) started attempt {} and never finished, and it is not \
                                     idempotent: it may have had its effect. \
                                     Resume with --retry-in-doubt to call it again",
                                    step.id, rec.attempt
                                ),
                            )
                            .with_details(serde_json::json!({"number": number.to_string(), "attempt": rec.attempt})),
                        );
                        o.attempts = rec.attempt;
                        o.stop = Some(RunStatus::Interrupted);
                        return o;
                    }
                    // The lost attempt was a call: it counts, and stays on record as started;
                    // the call made now is the next attempt, with the same idempotency key.
                    for _ in 0..rec.attempt {
                        self.state.next_call(&call.agent.name);
                    }
                    attempt = rec.attempt;
                }
            }
        }
        let agent = match self.effective_agent(call) {
            Ok(a) => a,
            Err(e) => return StepOutcome::err(e),
        };
        let policy = &call.retry;
        // Tokens and cost of every attempt, failed ones included.
        let mut used = Usage::default();
        loop {
            attempt += 1;
            // A spent budget stops new calls, retries included.
            if let Err(e) = self.check_budget() {
                let mut o = StepOutcome::err(e);
                o.usage = used;
                o.attempts = attempt.saturating_sub(1).max(1);
                o.answers = self.take_answers(number);
                return o;
            }
            let result = self
                .attempt(step, call, &agent, input, message, number, attempt, part)
                .await;
            let (mut o, retry) = match result {
                Ok((value, usage, child)) => {
                    let mut o = StepOutcome::ok(Some(value));
                    used.add(usage);
                    o.child_run = child;
                    (o, None)
                }
                Err((e, usage, child, interrupted)) => {
                    // An agent may say that asking again cannot help (an HTTP 4xx), or how
                    // long to wait first (`Retry-After`).
                    let hint = |k: &str| e.details.as_ref().and_then(|d| d.get(k));
                    let permanent = hint("retryable").and_then(Value::as_bool) == Some(false);
                    let wait_at_least = hint("retry_after_ms")
                        .and_then(Value::as_u64)
                        .map_or(Duration::ZERO, Duration::from_millis);
                    let retryable = !permanent && policy.on.iter().any(|k| k == e.kind.as_str());
                    let again = retryable
                        && !interrupted
                        && attempt < policy.attempts
                        && !self.tree.cancel.is_cancelled();
                    let mut o = StepOutcome::err(e);
                    used.add(usage);
                    o.child_run = child;
                    if interrupted {
                        o.stop = Some(RunStatus::Interrupted);
                    }
                    (o, again.then(|| backoff(policy, attempt).max(wait_at_least)))
                }
            };
            o.usage = used;
            o.attempts = attempt;
            let Some(wait) = retry else {
                o.answers = self.take_answers(number);
                return o;
            };
            tracing::info!(
                run_id = %self.record.id, step = %step.id, number = %number, attempt,
                error = %o.error.as_ref().map(|e| e.to_string()).unwrap_or_default(),
                wait_ms = wait.as_millis() as u64, "retry"
            );
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.tree.cancel.cancelled() => {
                    o.answers = self.take_answers(number);
                    return o;
                }
            }
        }
    }

    /// What the `llm` calls of step `number` put on its record, over all its attempts.
    fn take_answers(&self, number: StepNumber<'_>) -> Option<Value> {
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&number.to_string())
    }

    /// One attempt: the call under its timeout, then the result schema.
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        step: &StepPlan,
        call: &CallPlan,
        agent: &Arc<AgentPlan>,
        input: &Value,
        message: Option<&str>,
        number: StepNumber<'_>,
        attempt: u32,
        part: &'static str,
    ) -> CallResult {
        if has_effects(agent) {
            // SPEC §7.3: the attempt is on record before the call can have its effect.
            let rec = || StepRecord {
                run_id: self.record.id.clone(),
                number: number.step.to_string(),
                step: step.id.clone(),
                kind: part.to_string(),
                attempt,
                status: StepStatus::Started,
                iteration: number.iteration,
                iterations: None,
                input: None,
                result: None,
                changes: Vec::new(),
                violations: Vec::new(),
                error: None,
                started_at: record::now_ms(),
                finished_at: None,
                usage: Usage::default(),
                child_run: None,
                route: None,
                answers: None,
            };
            if let Err(e) = self.record(rec).await {
                return Err((e, Usage::default(), None, false));
            }
        }
        let call_index = self.state.next_call(&agent.name);
        // An agent that holds resources of its own (a child process) gets a token of its own,
        // cancelled when the attempt times out; the others stop when their future is dropped,
        // and share the run's token.
        let own_token = holds_resources(agent).then(|| self.tree.cancel.child_token());
        let cx = CallContext {
            run_id: &self.record.id,
            step: &step.id,
            step_number: number,
            attempt,
            message,
            context: &self.tree.context,
            cancel: own_token.as_ref().unwrap_or(&self.tree.cancel),
            timeout: call.timeout,
            call_index,
            now: Some(self.tree.now),
        };
        let call_future = self.dispatch(agent, input, cx, number);
        // A call that never waits finishes on its first poll, and a timeout never fires on
        // such a call (tokio checks the future first): no timer for it.
        // An `llm` agent times each request itself: waiting for its provider's capacity is
        // not part of the step's `timeout`.
        let timed = if never_waits(agent) || matches!(agent.spec, AgentPlanSpec::Llm(_)) {
            Ok(call_future.await)
        } else {
            tokio::time::timeout(call.timeout, call_future).await
        };
        let out = match timed {
            Ok(r) => r,
            Err(_) => {
                if let Some(token) = &own_token {
                    token.cancel();
                }
                Err((
                    StepError::new(
                        ErrorKind::Timeout,
                        format!(
                            "step `{}` timed out after {} (attempt {attempt})",
                            step.id,
                            fmt_duration(call.timeout)
                        ),
                    ),
                    Usage::default(),
                    None,
                    false,
                ))
            }
        };
        // Cost counts against the tree's budget as calls finish; a child run's calls have
        // counted themselves.
        if !matches!(agent.spec, AgentPlanSpec::Flow(_)) {
            let usage = match &out {
                Ok((_, u, _)) | Err((_, u, _, _)) => u,
            };
            self.tree.spend(usage.cost_usd);
        }
        let (value, usage, child) = out?;
        if let Some(schema) = &agent.result_schema
            && let Err(v) = schema.check(&value)
        {
            return Err((
                StepError::new(
                    ErrorKind::InvalidOutput,
                    format!(
                        "the result of agent `{}` does not match its `result_schema` {v}",
                        agent.name
                    ),
                )
                .with_details(serde_json::json!({"pointer": v.pointer, "rule": v.message})),
                usage,
                child,
                false,
            ));
        }
        Ok((value, usage, child))
    }

    #[allow(clippy::result_large_err)]
    async fn dispatch(
        &self,
        agent: &Arc<AgentPlan>,
        input: &Value,
        cx: CallContext<'_>,
        number: StepNumber<'_>,
    ) -> CallResult {
        use crate::agents::Agent as _;
        let plain = |r: Result<Value, StepError>| {
            r.map(|v| (v, Usage::default(), None))
                .map_err(|e| (e, Usage::default(), None, false))
        };
        match &agent.spec {
            AgentPlanSpec::Transform(t) => plain(agents::transform::TransformAgent(t).call(input, cx).await),
            AgentPlanSpec::Mock(m) => plain(agents::mock::MockAgent(m).call(input, cx).await),
            // Boxed: its future is large, and it starts a process anyway.
            AgentPlanSpec::Command(c) => {
                plain(Box::pin(agents::command::CommandAgent(c).call(input, cx)).await)
            }
            AgentPlanSpec::Flow(child) => self.child_run(*child, input.clone(), number).await,
            AgentPlanSpec::Llm(l) => {
                let context = match self.llm_context(l) {
                    Ok(c) => c,
                    Err(e) => return plain(Err(e)),
                };
                let notes = std::sync::Mutex::new(None);
                let llm = agents::llm::LlmAgent {
                    notes: &notes,
                    name: &agent.name,
                    plan: l,
                    schema: agent.result_schema.as_deref(),
                    conversation: &self.tree.options.messages,
                    context,
                    hosts: agents::net::Hosts(&self.lineage.hosts),
                    providers: agents::provider::Providers::global(),
                };
                let out = Box::pin(llm.call(input, cx)).await;
                if let Some(a) = notes.into_inner().unwrap_or_else(|e| e.into_inner()) {
                    let mut all = self.answers.lock().unwrap_or_else(|e| e.into_inner());
                    let entry = all.entry(number.to_string()).or_insert(Value::Null);
                    agents::llm::merge_notes(entry, a);
                }
                match out {
                    Ok((v, usage)) => Ok((v, usage, None)),
                    Err((e, usage)) => Err((e, usage, None, false)),
                }
            }
            AgentPlanSpec::Http(h) => {
                let http = agents::http::HttpAgent {
                    name: &agent.name,
                    plan: h,
                    hosts: agents::net::Hosts(&self.lineage.hosts),
                };
                plain(Box::pin(http.call(input, cx)).await)
            }
        }
    }

    /// An `llm` agent's `context_paths` and their values in the payload; a singular path that
    /// matches nothing is a `mapping` error, like a mapping source.
    fn llm_context(&self, l: &LlmPlan) -> Result<Vec<(String, Value)>, StepError> {
        l.context_paths
            .iter()
            .map(|p| {
                let v = if p.is_singular() {
                    p.get(&self.payload).cloned().ok_or_else(|| {
                        StepError::mapping(format!(
                            "context path `{}` matched nothing in the payload",
                            p.text()
                        ))
                    })?
                } else {
                    Value::Array(p.query(&self.payload).into_iter().cloned().collect())
                };
                Ok((p.text().to_owned(), v))
            })
            .collect()
    }

    /// A `flow` agent: a child run one level deeper, with its own payload.
    async fn child_run(&self, child: FlowRef, input: Value, number: StepNumber<'_>) -> CallResult {
        let depth = self.lineage.depth;
        let max = self.lineage.max_depth;
        if u64::from(depth) + 1 > max {
            return Err((
                StepError::new(
                    ErrorKind::Depth,
                    format!("nesting limit reached (depth {depth} of {max})"),
                ),
                Usage::default(),
                None,
                false,
            ));
        }
        let child_flow = self.tree.plan.flow(child);
        let prefix = number.to_string();
        // Resuming: a child run this step started before goes on (or, if it ended, its end
        // stands), instead of a new one.
        let earlier = self.replay.as_ref().and_then(|r| r.child(&prefix)).cloned();
        let out = match earlier {
            Some(rec) if !super::resume::resumable(rec.status) => RunOutcome {
                run_id: rec.id,
                status: rec.status,
                output: rec.output,
                error: rec.error,
                path: Vec::new(),
                usage: rec.usage,
                steps: rec.steps,
                duration_ms: rec
                    .finished_at
                    .unwrap_or(rec.started_at)
                    .saturating_sub(rec.started_at),
                store_failure: None,
            },
            earlier => {
                let replay = match &earlier {
                    Some(rec) => match Replay::load(&*self.engine.store, &rec.id).await {
                        Ok(r) => Some(Arc::new(r)),
                        Err(e) => {
                            let e = self.store_error(&e);
                            return Err((e, Usage::default(), Some(rec.id.clone()), false));
                        }
                    },
                    None => None,
                };
                let lineage = Lineage {
                    parent_run: Some(self.record.id.clone()),
                    prefix,
                    depth: depth + 1,
                    max_depth: max,
                    allow: intersect(self.lineage.allow.clone(), child_flow.allow.clone()),
                    hosts: {
                        let mut h = self.lineage.hosts.clone();
                        h.extend(child_flow.allow_hosts.iter().map(|l| Arc::from(l.as_slice())));
                        h
                    },
                    budget: Budget::min(
                        self.lineage.budget,
                        child_flow.limits.max_cost_usd.map(|limit| Budget {
                            base: self.tree.spent(),
                            limit,
                            by: "limits.max_cost_usd",
                        }),
                    ),
                };
                let resumed = earlier.zip(replay);
                self.engine
                    .run_flow(self.tree, child, input, lineage, self.state, resumed)
                    .await
            }
        };
        let id = Some(out.run_id.clone());
        match out.status {
            RunStatus::Succeeded => Ok((out.output.unwrap_or(Value::Null), out.usage, id)),
            status => Err((
                out.error.unwrap_or_else(|| {
                    let message = if status == RunStatus::Interrupted {
                        // Stopped at an `interrupt`: the decision is given to the root run.
                        format!("the child run `{}` waits for a decision", out.run_id)
                    } else {
                        format!("the child run `{}` ended {}", out.run_id, status.as_str())
                    };
                    StepError::new(ErrorKind::Agent, message)
                }),
                out.usage,
                id,
                matches!(status, RunStatus::Interrupted | RunStatus::Running),
            )),
        }
    }

    async fn foreach_step(&mut self, step: &StepPlan, f: &ForeachPlan, number: &str) -> StepOutcome {
        let mut o = self.foreach_items(step, f, number).await;
        // A foreach step that failed before its first iteration (not an array, `max_items`,
        // `max_steps`) still has `step.failed` as a list and `step.iterations` as a count, so
        // that edges reading them do not fail with an expression error.
        if o.failed.is_null() {
            o.failed = Value::Array(Vec::new());
        }
        o.iterations.get_or_insert(0);
        o
    }

    async fn foreach_items(&mut self, step: &StepPlan, f: &ForeachPlan, number: &str) -> StepOutcome {
        // A path source is read in place: iterations only read the payload.
        let source = {
            let vars = self.vars(&[]);
            match data::eval_source_ref(&f.over, &self.payload, &vars) {
                Ok(v) => v,
                Err(e) => return StepOutcome::err(e),
            }
        };
        let items: &[Value] = match &*source {
            Value::Array(items) => items,
            other => {
                return StepOutcome::err(StepError::mapping(format!(
                    "`foreach` of step `{}` must yield an array, got {}",
                    step.id,
                    type_name(other)
                )));
            }
        };
        let n = items.len() as u64;
        if n > f.max_items {
            return StepOutcome::err(StepError::new(
                ErrorKind::Limit,
                format!(
                    "`foreach` of step `{}` has {n} items, over `max_items` ({})",
                    step.id, f.max_items
                ),
            ));
        }
        let tolerated = match f.tolerate {
            Tolerance::Count(c) => c,
            Tolerance::Percent(p) => ((n as f64) * p / 100.0).floor() as u64,
        };
        let mut results: Vec<Value> = vec![Value::Null; items.len()];
        let mut failed: Vec<(usize, StepError)> = Vec::new();
        let mut usage = Usage::default();
        let mut stopped = false;
        // Paused, or an iteration in doubt: no new iterations; the step ends without a result.
        let mut halt: Option<(RunStatus, Option<StepError>)> = None;
        // Count every iteration up front: `max_steps` bounds them like steps.
        for _ in 0..n {
            if let Err(e) = self.count_step() {
                return StepOutcome::err(e);
            }
        }
        if f.concurrency <= 1 {
            for (i, item) in items.iter().enumerate() {
                if self.tree.pause.is_cancelled() {
                    halt = Some((RunStatus::Running, None));
                    break;
                }
                let r = self.iteration(step, f, item, i, number).await;
                usage.add(r.usage);
                if r.stop == Some(RunStatus::Interrupted) {
                    halt = Some((RunStatus::Interrupted, r.error));
                    break;
                }
                match r.error {
                    None => results[i] = r.result.map_or(Value::Null, Arc::unwrap_or_clone),
                    Some(e) => {
                        failed.push((i, e));
                        if failed.len() as u64 > tolerated {
                            stopped = true;
                            break;
                        }
                    }
                }
            }
        } else {
            // A sliding window: a new iteration starts as soon as one finishes.
            let this = &*self;
            let start = |i: usize| async move { (i, this.iteration(step, f, &items[i], i, number).await) };
            let mut in_flight = FuturesUnordered::new();
            // The box of the last iteration that finished on its first poll, for the next one:
            // an iteration's future is kilobytes, too large for the allocator's fast path.
            let mut spare = None;
            let mut next = 0usize;
            loop {
                if halt.is_none() && self.tree.pause.is_cancelled() {
                    halt = Some((RunStatus::Running, None));
                }
                // An iteration is polled once as it starts: one that finishes then (a
                // transform body, say) is taken at once and never joins the window's set.
                let mut done = None;
                while done.is_none()
                    && !stopped
                    && halt.is_none()
                    && in_flight.len() < f.concurrency
                    && next < items.len()
                {
                    let i = next;
                    next += 1;
                    let mut fut = match spare.take() {
                        Some(mut b) => {
                            std::pin::Pin::set(&mut b, start(i));
                            b
                        }
                        None => Box::pin(start(i)),
                    };
                    match std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await {
                        std::task::Poll::Ready(r) => {
                            done = Some(r);
                            spare = Some(fut);
                        }
                        std::task::Poll::Pending => in_flight.push(fut),
                    }
                }
                let next_done = match done {
                    Some(r) => Some(r),
                    None => in_flight.next().await,
                };
                let Some((i, r)) = next_done else {
                    break;
                };
                usage.add(r.usage);
                if r.stop == Some(RunStatus::Interrupted) {
                    if halt.is_none() {
                        halt = Some((RunStatus::Interrupted, r.error));
                    }
                    continue;
                }
                match r.error {
                    None => results[i] = r.result.map_or(Value::Null, Arc::unwrap_or_clone),
                    Some(e) => {
                        failed.push((i, e));
                        if failed.len() as u64 > tolerated {
                            stopped = true;
                        }
                    }
                }
            }
        }
        if let Some((status, error)) = halt {
            let mut o = StepOutcome::ok(None);
            o.usage = usage;
            o.error = error;
            o.stop = Some(status);
            return o;
        }
        failed.sort_by_key(|(i, _)| *i);
        let failed_json = Value::Array(
            failed
                .iter()
                .map(|(i, e)| serde_json::json!({"index": i, "error": e.to_json()}))
                .collect(),
        );
        let mut o = StepOutcome::ok(None);
        o.usage = usage;
        o.failed = failed_json;
        o.iterations = Some(n);
        if stopped {
            let (first_i, first) = &failed[0];
            o.error = Some(
                StepError::new(
                    ErrorKind::Limit,
                    format!(
                        "{} of {n} iterations of step `{}` failed, more than `tolerate` allows ({tolerated}); first: item {first_i}: {first}",
                        failed.len(),
                        step.id
                    ),
                )
                .with_details(o.failed.clone()),
            );
            o.result = Some(Arc::new(Value::Array(results)));
            return o;
        }
        drop(source);
        // The output maps the array of results once, at the end.
        let result = Arc::new(Value::Array(results));
        self.apply(&f.body, &result, &[], &mut o);
        o.result = Some(result);
        o
    }

    /// Records one iteration of a loop or one branch of a `parallel` step: `number` is the
    /// step's number (`2`) with `iteration` set for loops, or the branch's number (`3.sentiment`).
    #[allow(clippy::too_many_arguments)]
    async fn record_part(
        &self,
        step: &StepPlan,
        number: String,
        kind: &str,
        iteration: Option<u64>,
        input: Option<Value>,
        o: &mut StepOutcome,
        started_at: u64,
    ) {
        if o.stop != Some(RunStatus::Running) {
            self.finished.fetch_add(1, Ordering::Relaxed);
        }
        if o.replayed {
            return;
        }
        let rec = || StepRecord {
            run_id: self.record.id.clone(),
            number,
            step: step.id.clone(),
            kind: kind.to_string(),
            attempt: o.attempts,
            status: match (&o.error, o.stop) {
                (_, Some(RunStatus::Interrupted)) => StepStatus::Interrupted,
                (Some(_), _) => StepStatus::Failed,
                (None, _) => StepStatus::Succeeded,
            },
            iteration,
            iterations: None,
            input,
            // The caller keeps the result; the record gets a copy.
            result: o.result.clone(),
            changes: std::mem::take(&mut o.changes),
            violations: o.violations.clone(),
            error: o.error.clone(),
            started_at,
            finished_at: Some(record::now_ms()),
            usage: o.usage,
            child_run: o.child_run.clone(),
            route: None,
            answers: o.answers.clone(),
        };
        if let Err(e) = self.record(rec).await {
            o.error = Some(e);
        }
    }

    /// One `foreach` iteration: its input from the payload as it was when the step started,
    /// with the item in scope; the call; then `select`. Iterations never write the payload.
    async fn iteration(
        &self,
        step: &StepPlan,
        f: &ForeachPlan,
        item: &Value,
        index: usize,
        number: &str,
    ) -> StepOutcome {
        let index_v = Value::from(index as u64);
        let locals: [(&str, &Value); 2] = [(f.as_name.as_str(), item), ("index", &index_v)];
        let call = &f.body;
        let prepared = {
            let vars = self.vars(&locals);
            // Borrowed when it is the item or the whole payload: copied only for a store that
            // keeps it.
            let input = match &call.input {
                // Without `input`, each iteration's input document is the item itself.
                InputPlan::All if call.scope.is_none() => Ok(std::borrow::Cow::Borrowed(item)),
                spec => data::build_input_ref(spec, call.scope.as_ref(), &self.payload, &vars),
            };
            input.and_then(|i| Ok((i, self.message(call, &vars)?)))
        };
        let (input, message) = match prepared {
            Ok(p) => p,
            Err(e) => return StepOutcome::err(e),
        };
        let iter_number = StepNumber {
            step: number,
            iteration: Some(index as u64),
        };
        // Resuming: a finished iteration's record holds its result after `select`.
        if let Some(rec) = self
            .replay
            .as_ref()
            .and_then(|r| r.finished(number, Some(index as u64)))
        {
            return self.replayed(call, rec);
        }
        let started_at = record::now_ms();
        let mut o = self
            .invoke(step, call, &input, message.as_deref(), iter_number, "iteration")
            .await;
        if o.error.is_none()
            && let (Some(sel), Some(r)) = (&f.select, &o.result)
        {
            let picked = if sel.is_singular() {
                sel.get(r).cloned()
            } else {
                Some(Value::Array(sel.query(r).into_iter().cloned().collect()))
            };
            match picked {
                Some(v) => o.result = Some(Arc::new(v)),
                None => {
                    o.error = Some(StepError::mapping(format!(
                        "`select` `{}` matched nothing in the result of item {index}",
                        sel.text()
                    )));
                    o.result = None;
                }
            }
        }
        self.record_part(
            step,
            number.to_string(),
            "iteration",
            Some(index as u64),
            self.recorded_input(input),
            &mut o,
            started_at,
        )
        .await;
        o
    }

    async fn while_step(&mut self, step: &StepPlan, w: &WhilePlan, number: &str) -> StepOutcome {
        let mut last = Arc::new(Value::Null);
        let mut iterations = 0u64;
        let mut o = StepOutcome::ok(None);
        loop {
            let iteration_v = Value::from(iterations);
            let locals: [(&str, &Value); 1] = [("iteration", &iteration_v)];
            let holds = {
                let vars = Vars {
                    result: Some(&*last),
                    ..self.vars(&locals)
                };
                eval::eval_bool(&w.cond, &vars)
            };
            match holds {
                Ok(false) => break,
                Ok(true) => {}
                Err(e) => {
                    // `e.message` already starts with the expression: "`cond`: cause".
                    o.error = Some(StepError::expression(format!(
                        "the `while` condition of step `{}` failed: {}",
                        step.id, e.message
                    )));
                    break;
                }
            }
            if iterations >= w.max_iterations {
                o.error = Some(StepError::new(
                    ErrorKind::Limit,
                    format!(
                        "`while` loop `{}` reached `max_iterations` ({}) and its condition still holds",
                        step.id, w.max_iterations
                    ),
                ));
                break;
            }
            if self.tree.pause.is_cancelled() {
                o.stop = Some(RunStatus::Running);
                break;
            }
            let replaying = self
                .replay
                .as_ref()
                .is_some_and(|r| r.finished(number, Some(iterations)).is_some());
            if iterations > 0 && !w.delay.is_zero() && !replaying {
                tokio::select! {
                    _ = tokio::time::sleep(w.delay) => {}
                    _ = self.tree.cancel.cancelled() => {}
                }
            }
            if let Err(e) = self.count_step() {
                o.error = Some(e);
                break;
            }
            let call = &w.body;
            let prepared = {
                let vars = Vars {
                    result: Some(&*last),
                    ..self.vars(&locals)
                };
                // Borrowed when it is the whole payload: copied only for a store that keeps it.
                data::build_input_ref(&call.input, call.scope.as_ref(), &self.payload, &vars)
                    .and_then(|i| Ok((i, self.message(call, &vars)?)))
            };
            let (input, message) = match prepared {
                Ok(p) => p,
                Err(e) => {
                    o.error = Some(e);
                    break;
                }
            };
            let iter_number = StepNumber {
                step: number,
                iteration: Some(iterations),
            };
            let started_at = record::now_ms();
            let mut r = self
                .invoke(step, call, &input, message.as_deref(), iter_number, "iteration")
                .await;
            let input = self.recorded_input(input);
            if r.error.is_none() {
                // The output applies after every iteration: the payload threads through. The
                // iteration's record holds the writes it made, and the loop's record none, so
                // records grow with the iterations, not with the payload each one saw.
                let result = r.result.clone().unwrap_or_else(|| Arc::new(Value::Null));
                self.apply(call, &result, &locals, &mut r);
            }
            self.record_part(
                step,
                number.to_string(),
                "iteration",
                Some(iterations),
                input,
                &mut r,
                started_at,
            )
            .await;
            o.usage.add(r.usage);
            o.attempts = r.attempts;
            o.violations.append(&mut r.violations);
            iterations += 1;
            if let Some(e) = r.error {
                o.error = Some(e);
                o.stop = r.stop;
                break;
            }
            last = r.result.unwrap_or_else(|| Arc::new(Value::Null));
        }
        o.result = Some(last);
        o.iterations = Some(iterations);
        o
    }

    async fn parallel_step(&mut self, step: &StepPlan, p: &ParallelPlan, number: &str) -> StepOutcome {
        // Every branch reads its own deep copy of the payload as it was when the step started.
        let mut prepared = Vec::with_capacity(p.branches.len());
        for (name, call) in &p.branches {
            let snapshot = self.payload.clone();
            let built = {
                let vars = Vars {
                    payload: Some(&snapshot),
                    ..self.vars(&[])
                };
                data::build_input(&call.input, call.scope.as_ref(), &snapshot, &vars)
                    .and_then(|i| Ok((i, self.message(call, &vars)?)))
            };
            match built {
                Ok((input, message)) => prepared.push((name.as_str(), call, input, message)),
                Err(e) => {
                    return StepOutcome::err(StepError::new(
                        e.kind,
                        format!("branch `{name}`: {}", e.message),
                    ));
                }
            }
        }
        let fail_fast = CancellationToken::new();
        let mut outcomes: Vec<Option<StepOutcome>> = (0..prepared.len()).map(|_| None).collect();
        {
            let this = &*self;
            let mut in_flight = FuturesUnordered::new();
            let mut next = 0;
            loop {
                while in_flight.len() < p.concurrency && next < prepared.len() {
                    let i = next;
                    next += 1;
                    let (name, call, input, message) = &prepared[i];
                    let ff = fail_fast.clone();
                    in_flight.push(async move {
                        let branch_number = format!("{number}.{name}");
                        let started_at = record::now_ms();
                        let mut o = tokio::select! {
                            o = this.invoke(step, call, input, message.as_deref(), StepNumber::of(&branch_number), "branch") => o,
                            _ = ff.cancelled() => StepOutcome::err(StepError::new(
                                ErrorKind::Cancelled,
                                "cancelled: another branch failed (fail_fast)",
                            )),
                        };
                        this.record_part(step, branch_number, "branch", None, Some(input.clone()), &mut o, started_at).await;
                        (i, o)
                    });
                }
                let Some((i, o)) = in_flight.next().await else {
                    break;
                };
                if o.error.is_some() && p.fail_fast {
                    fail_fast.cancel();
                }
                outcomes[i] = Some(o);
            }
        }
        let outcomes: Vec<StepOutcome> = outcomes
            .into_iter()
            .map(|o| o.expect("every branch finished"))
            .collect();
        let mut result = Map::new();
        let mut failed = Map::new();
        let mut out = StepOutcome::ok(None);
        let mut first_error = None;
        for ((name, ..), o) in prepared.iter().zip(&outcomes) {
            out.usage.add(o.usage);
            result.insert(
                name.to_string(),
                o.result.as_deref().cloned().unwrap_or(Value::Null),
            );
            if let Some(e) = &o.error {
                failed.insert(name.to_string(), e.to_json());
                // The branch that failed is named, not the ones fail_fast cancelled because of
                // it; when every failure is a cancellation (the run was cancelled), that is it.
                let cancelled = e.kind == ErrorKind::Cancelled;
                let better = match &first_error {
                    None => true,
                    Some((was_cancelled, _)) => *was_cancelled && !cancelled,
                };
                if better {
                    first_error = Some((
                        cancelled,
                        StepError::new(e.kind.clone(), format!("branch `{name}`: {}", e.message)),
                    ));
                }
            }
        }
        out.failed = Value::Object(failed);
        out.result = Some(Arc::new(Value::Object(result)));
        if let Some(o) = outcomes.iter().find(|o| o.stop == Some(RunStatus::Interrupted)) {
            // A branch in doubt: the step stops where it is, to be resumed.
            out.error = o.error.clone();
            out.stop = Some(RunStatus::Interrupted);
            return out;
        }
        if let Some((_, e)) = first_error {
            // Any failure: no branch's output is applied.
            out.error = Some(e);
            return out;
        }
        // All succeeded: outputs apply in the order the branches are written, all or none.
        let before = self.payload.clone();
        for ((name, call, ..), o) in prepared.iter().zip(&outcomes) {
            let r = o.result.as_ref().expect("a succeeded branch has a result");
            let mut branch = StepOutcome::ok(None);
            self.apply(call, r, &[], &mut branch);
            for mut v in branch.violations {
                v.reason = format!("branch `{name}`: {}", v.reason);
                out.violations.push(v);
            }
            out.changes.extend(branch.changes);
            if let Some(e) = branch.error {
                self.payload = before;
                out.changes.clear();
                out.error = Some(StepError::new(e.kind, format!("branch `{name}`: {}", e.message)));
                return out;
            }
        }
        out
    }
}

/// Whether calls of `agent` can have effects outside the run (SPEC §7.3): each attempt is
/// recorded as started before it is made.
fn has_effects(agent: &AgentPlan) -> bool {
    matches!(
        agent.spec,
        AgentPlanSpec::Command(_) | AgentPlanSpec::Http(_) | AgentPlanSpec::Llm(_)
    )
}

/// Whether calls of `agent` hold resources of their own that need a signal to be released
/// when the attempt times out (a child process and its group).
fn holds_resources(agent: &AgentPlan) -> bool {
    matches!(
        agent.spec,
        AgentPlanSpec::Command(_) | AgentPlanSpec::Llm(_) | AgentPlanSpec::Http(_)
    )
}

/// Whether calls of `agent` finish without ever waiting: computed in place (`transform`, a
/// `mock` without latency).
fn never_waits(agent: &AgentPlan) -> bool {
    match &agent.spec {
        AgentPlanSpec::Transform(_) => true,
        AgentPlanSpec::Mock(m) => m.latency.is_none_or(|d| d.is_zero()),
        _ => false,
    }
}

/// The message of a paused run's error ([`record::RunRecord::paused`]).
pub const PAUSED: &str = "paused before finishing (Ctrl-C): nothing runs it until it is resumed";

/// Why a paused run stopped where it did.
fn paused() -> StepError {
    StepError::new(ErrorKind::Cancelled, PAUSED)
}

fn status_for(e: &StepError) -> RunStatus {
    match e.kind {
        ErrorKind::Cancelled => RunStatus::Cancelled,
        _ => RunStatus::Failed,
    }
}

/// The wait before attempt `attempt + 1`: exponential from `backoff` by `factor`, capped at
/// `max_backoff`, spread by ±`jitter`.
pub fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    let base = policy.backoff.as_secs_f64() * policy.factor.powi(attempt.saturating_sub(1) as i32);
    let capped = base.min(policy.max_backoff.as_secs_f64());
    let jitter = policy.jitter.clamp(0.0, 1.0);
    let factor = if jitter > 0.0 {
        use rand::{Rng, SeedableRng};
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ u64::from(attempt).rotate_left(32));
        1.0 + rng.random_range(-jitter..=jitter)
    } else {
        1.0
    };
    Duration::from_secs_f64((capped * factor).max(0.0))
}

/// `250ms`, `20s`, `5m`, `2h`.
pub fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms > 0 && ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms > 0 && ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

use crate::compile::path::type_name;

fn payload_limit(name: &str, max: u64) -> StepError {
    StepError::new(
        ErrorKind::Limit,
        format!("payload size limit reached ({name} {max})"),
    )
}

/// At most what a write at `path` (a change's path: `$.a.b`, `$['k'][0]`) adds to the size
/// of the payload besides its value: the keys and brackets of the containers it creates and a
/// comma at each level. Every key's text is inside the path's text, and each segment costs
/// at least one character of it, so a few characters per character of the path are plenty.
fn write_overhead(path: &str) -> u64 {
    6 * path.len() as u64 + 8
}

/// The size of `v` as JSON text, counted up to a little past `cap`.
pub fn json_size(v: &Value, cap: u64) -> u64 {
    fn walk(v: &Value, acc: &mut u64, cap: u64) {
        if *acc > cap {
            return;
        }
        match v {
            Value::Null => *acc += 4,
            Value::Bool(b) => *acc += if *b { 4 } else { 5 },
            Value::Number(n) => *acc += number_len(n),
            Value::String(s) => *acc += s.len() as u64 + 2,
            Value::Array(a) => {
                *acc += 2 + a.len().saturating_sub(1) as u64;
                for x in a {
                    walk(x, acc, cap);
                }
            }
            Value::Object(m) => {
                *acc += 2 + m.len().saturating_sub(1) as u64;
                for (k, x) in m {
                    *acc += k.len() as u64 + 3;
                    walk(x, acc, cap);
                }
            }
        }
    }
    let mut acc = 0;
    walk(v, &mut acc, cap);
    acc
}

/// Appends `n` in decimal (as `to_string` would), without the formatting machinery.
fn push_decimal(s: &mut String, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    s.push_str(std::str::from_utf8(&buf[i..]).expect("ASCII digits"));
}

/// The length of a JSON number as serde_json writes it, without building the text.
fn number_len(n: &serde_json::Number) -> u64 {
    fn digits(mut u: u64) -> u64 {
        let mut d = 1;
        while u >= 10 {
            u /= 10;
            d += 1;
        }
        d
    }
    if let Some(u) = n.as_u64() {
        digits(u)
    } else if let Some(i) = n.as_i64() {
        1 + digits(i.unsigned_abs())
    } else {
        // A float: serde_json's own formatting (the shortest round-trip text), on the stack.
        let mut buf = [0u8; 64];
        let mut w = &mut buf[..];
        match serde_json::to_writer(&mut w, n) {
            Ok(()) => 64 - w.len() as u64,
            Err(_) => n.to_string().len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let p = RetryPolicy {
            attempts: 5,
            backoff: Duration::from_secs(1),
            factor: 2.0,
            max_backoff: Duration::from_secs(3),
            jitter: 0.0,
            on: vec![],
        };
        assert_eq!(backoff(&p, 1), Duration::from_secs(1));
        assert_eq!(backoff(&p, 2), Duration::from_secs(2));
        assert_eq!(backoff(&p, 3), Duration::from_secs(3));
        let j = RetryPolicy { jitter: 0.5, ..p };
        for _ in 0..100 {
            let d = backoff(&j, 1);
            assert!(
                d >= Duration::from_millis(500) && d <= Duration::from_millis(1500),
                "{d:?}"
            );
        }
    }

    #[test]
    fn json_size_matches_serialization() {
        let v = serde_json::json!({"a": [1, 2.5, "x"], "b": {"c": null, "d": true}, "e": "é",
            "n": [0, 9, 10, 99, 100, -1, -10, -9_999, u64::MAX, i64::MIN, 1e21, -1.5e-7, 0.1, 123456.789]});
        assert_eq!(
            json_size(&v, u64::MAX),
            serde_json::to_string(&v).expect("json").len() as u64
        );
    }

    /// Compiles `flow` (YAML text) from a temporary file and runs it on `input`.
    async fn run_flow_text(flow: &str, input: Value) -> RunOutcome {
        use crate::project::Project;
        use crate::syntax::Limits;
        let dir = std::env::temp_dir().join(format!(
            "switchyard-engine-test-{}-{}",
            std::process::id(),
            record::new_run_id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("flow.yaml");
        std::fs::write(&file, flow).expect("write the flow");
        let mut project = Project::default();
        let id = project
            .load_top(&file, dir.canonicalize().expect("canonical"), &Limits::default())
            .expect("the flow loads");
        let (plan, diags) = crate::compile::compile(&project, id);
        let plan = plan.unwrap_or_else(|| panic!("the flow compiles: {diags:?}"));
        let _ = std::fs::remove_dir_all(&dir);
        let engine = Engine::new(Arc::new(crate::store::memory::MemoryStore::new()));
        engine
            .run(
                Arc::new(plan),
                input,
                serde_json::json!({}),
                RunOptions::default(),
            )
            .await
    }

    const PAYLOAD_LOOP: &str = "flow: payload-loop
limits: {max_payload_bytes: 1KiB}
agents:
  grow: {kind: transform, result: {s: '=input.s + input.add'}}
steps:
  loop:
    while: =iteration < 150
    max_iterations: 150
    agent: grow
    output: {$.s: $.s}
";

    #[tokio::test]
    async fn the_payload_limit_sees_through_its_bound() {
        // Rewriting a value again and again adds to the bound, never to the payload: the
        // bound passes the limit, the payload is measured, and the run goes on.
        let o = run_flow_text(PAYLOAD_LOOP, serde_json::json!({"s": "", "add": ""})).await;
        assert_eq!(o.status, RunStatus::Succeeded, "{:?}", o.error);
        // Growing it by 10 bytes an iteration fails exactly when the payload passes 1024
        // bytes: `{"s":"…","add":"0123456789"}` is 27 bytes + 10 per iteration.
        let o = run_flow_text(PAYLOAD_LOOP, serde_json::json!({"s": "", "add": "0123456789"})).await;
        assert_eq!(o.status, RunStatus::Failed);
        let e = o.error.expect("an error");
        assert_eq!(e.kind, ErrorKind::Limit);
        assert_eq!(
            e.message,
            "step `loop`: payload size limit reached (limits.max_payload_bytes 1024)"
        );
        // The 100th iteration brings it to 1027 bytes (the 99th to 1017): the step and 100
        // iterations ran.
        assert_eq!(o.steps, 101);
    }

    #[test]
    fn decimals_are_written_like_to_string() {
        for n in [0u64, 7, 10, 99, 100, 12_345, u64::MAX] {
            let mut s = String::from("x");
            push_decimal(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
    }

    #[test]
    fn durations_print_in_flow_units() {
        assert_eq!(fmt_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(fmt_duration(Duration::from_secs(20)), "20s");
        assert_eq!(fmt_duration(Duration::from_secs(300)), "5m");
        assert_eq!(fmt_duration(Duration::from_secs(7200)), "2h");
    }
}
