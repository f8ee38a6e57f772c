//! A run's lifecycle and records: starting a root run (or a batch item) and resuming a stored
//! one, the run's record from its start to its end and its output, step numbers, and writing
//! step records to the store (after one failed write, none more).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::limits::Budget;
use super::{
    BatchItem, Engine, Lineage, Run, RunControls, RunOptions, RunOutcome, StepOutcome, Tree, intersect,
};
use crate::agents::AgentState;
use crate::expr::time::Timestamp;
use crate::plan::*;
use crate::record::cost::Cost;
use crate::record::{self, RunRecord, RunStatus, StepRecord, StepStatus, Usage};
use crate::record::{ErrorKind, StepError};
use crate::runtime::resume::{Replay, ResumeError, ResumeOptions};
use crate::runtime::steps::StepsVar;
use crate::store::Store;

impl<S: Store> Engine<S> {
    /// An engine recording into `store`, watched by the process's observer if one is
    /// installed ([`crate::runtime::observe::install`]).
    pub fn new(store: Arc<S>) -> Self {
        Engine {
            store,
            observer: crate::runtime::observe::installed(),
            natives: Arc::default(),
        }
    }

    /// This engine, calling `natives` for the flows' `native` agents.
    pub fn with_natives(mut self, natives: Arc<crate::agents::native::Natives>) -> Self {
        self.natives = natives;
        self
    }

    /// This engine, telling `observer` of its runs and steps instead of the process's.
    pub fn with_observer(mut self, observer: Option<Arc<dyn crate::runtime::observe::Observer>>) -> Self {
        self.observer = observer;
        self
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
        self.run_root(plan, input, context, options, state, controls, item, None)
            .await
    }

    /// A new root run of id `id` (not [`record::new_run_id`]'s): for a caller that takes the
    /// run as its writer before it starts (SPEC §7.3, one writer per run).
    #[allow(clippy::too_many_arguments)]
    pub async fn run_as(
        &self,
        id: String,
        plan: Arc<Plan>,
        input: Value,
        context: Value,
        options: RunOptions,
        state: Arc<AgentState>,
        controls: RunControls,
    ) -> RunOutcome {
        self.run_root(plan, input, context, options, state, controls, None, Some(id))
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_root(
        &self,
        plan: Arc<Plan>,
        input: Value,
        context: Value,
        options: RunOptions,
        state: Arc<AgentState>,
        controls: RunControls,
        item: Option<BatchItem>,
        id: Option<String>,
    ) -> RunOutcome {
        let now = options.now.unwrap_or_else(Timestamp::now);
        let (tree, lineage) = Self::tree(
            plan,
            context,
            now,
            options,
            controls,
            ResumeOptions::default(),
            None,
        );
        let root = tree.plan.root;
        // The root run in place: only child runs need the boxed, recursive `run_flow`.
        let flow = tree.plan.flow(root).clone();
        let mut run = Run::new(self, &tree, flow, root, input, lineage, &state, None);
        if let Some(id) = id {
            run.record.id = id;
        }
        if let Some(item) = item {
            run.record.batch = Some(item.batch);
            run.record.item_id = Some(item.id);
            run.record.item_index = Some(item.index);
        }
        let outcome = run.execute().await;
        self.again_if_answered(&tree, outcome, &state).await
    }

    /// A root run that stopped `interrupted` while one of its questions was answered (between
    /// the item's add and the stop's record, by another process): nothing else would continue
    /// it, so it is resumed here at once, and the recorded answer applies.
    async fn again_if_answered(
        &self,
        tree: &Arc<Tree>,
        outcome: RunOutcome,
        state: &Arc<AgentState>,
    ) -> RunOutcome {
        if outcome.status != RunStatus::Interrupted || !tree.answered.load(Ordering::Relaxed) {
            return outcome;
        }
        let controls = RunControls {
            cancel: tree.cancel.clone(),
            pause: tree.pause.clone(),
            released: None,
        };
        let resume = ResumeOptions {
            allow_changed: true,
            answered: true,
            ..ResumeOptions::default()
        };
        let again = Box::pin(self.resume(
            tree.plan.clone(),
            &outcome.run_id,
            tree.options.clone(),
            resume,
            state.clone(),
            controls,
        ))
        .await;
        match again {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(run_id = %outcome.run_id, "could not continue the run its answer was given to: {e}");
                outcome
            }
        }
    }

    /// A root run's outcome with what it waits for ([`RunOutcome::waiting`]), read back
    /// from the store as `resume` reads it to check a decision: one reading of a stop. Asked
    /// by the callers that tell it (the library's `run` and `resume`, the `resume` of a
    /// submitted run), not by batches and workers, which would pay reads for every item.
    pub async fn with_waiting(&self, mut outcome: RunOutcome) -> RunOutcome {
        if outcome.status != RunStatus::Interrupted || !self.store.keeps_steps() {
            return outcome;
        }
        match crate::runtime::resume::waiting_at(&*self.store, &outcome.run_id).await {
            Ok(w) => outcome.waiting = w.as_ref().map(crate::runtime::resume::Waiting::waiting_for),
            Err(e) => tracing::warn!(run_id = %outcome.run_id, "could not read what the run waits for: {e}"),
        }
        outcome
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
        self.resume_record(plan, record, false, options, resume, state, controls)
            .await
    }

    /// [`Engine::resume`] of a run whose record the caller read (a worker's claim returns it).
    /// `fresh`: nothing of the run is recorded yet (a submitted run claimed for the first
    /// time), so nothing more is read from the store before it starts.
    #[allow(clippy::too_many_arguments)]
    pub async fn resume_record(
        &self,
        plan: Arc<Plan>,
        record: RunRecord,
        fresh: bool,
        options: RunOptions,
        resume: ResumeOptions,
        state: Arc<AgentState>,
        controls: RunControls,
    ) -> Result<RunOutcome, ResumeError> {
        let run_id = record.id.clone();
        if let Some(parent) = &record.parent_run {
            return Err(ResumeError::Child {
                id: record.id,
                parent: parent.clone(),
            });
        }
        if !crate::runtime::resume::resumable(record.status) {
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
        let replay = if fresh {
            Replay::default()
        } else {
            Replay::load(&*self.store, &run_id).await?
        };
        let waiting = if fresh && resume.decision.is_none() {
            None
        } else {
            self.check_decision(&plan, &record, &replay, &resume).await?
        };
        let mut resume = resume;
        resume.decision_for = waiting;
        let mut options = options;
        options.agent_changes = crate::runtime::changes::for_resume(
            &plan,
            &record,
            options.agent_changes.clone(),
            resume.allow_changed,
        )?;
        // The conversation the run started with, unless the caller gives one.
        if options.messages.is_empty()
            && let Some(Value::Array(m)) = &record.messages
        {
            options.messages = Arc::new(m.clone());
        }
        let context = record.context.clone();
        let now = recorded_now(&record);
        // `running` on record: its holder died, lost it, or paused it, and ended nothing.
        let carry = (!fresh && record.status == RunStatus::Running).then(|| replay.decided_at());
        let (tree, lineage) = Self::tree(plan, context, now, options, controls, resume, carry);
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
        // A fresh claim's record is the queued run as `submit` stored it, now `running`: what
        // its start would write, but its `now`, which is its claim's start to the
        // millisecond either way ([`recorded_now`]).
        run.start_recorded = fresh;
        let outcome = run.execute().await;
        Ok(self.again_if_answered(&tree, outcome, &state).await)
    }

    /// Checks `decision` against what stored run `record` waits for, as a resume given it
    /// would, and resumes nothing: for a caller that records the answer before it resumes
    /// (`resume --decision`, SPEC §15), so a refused decision is refused in the same words.
    pub async fn check_decision_for(
        &self,
        plan: &Plan,
        record: &RunRecord,
        decision: Value,
    ) -> Result<(), ResumeError> {
        let replay = Replay::load(&*self.store, &record.id).await?;
        let waiting = crate::runtime::resume::waiting_interrupt(&*self.store, record, &replay).await?;
        let resume = ResumeOptions::default().decision(decision);
        self.check_waiting(plan, record, waiting, &resume)
    }

    /// A run waiting at an `interrupt` (its own or a descendant's) needs a decision that
    /// matches the step's `schema`; a decision needs such a run.
    async fn check_decision(
        &self,
        plan: &Plan,
        record: &RunRecord,
        replay: &Replay,
        resume: &ResumeOptions,
    ) -> Result<Option<(String, String, Option<u64>)>, ResumeError> {
        // The waiting interrupt: in this run, or down the chain of interrupted children.
        let waiting = crate::runtime::resume::waiting_interrupt(&*self.store, record, replay).await?;
        // Answered in the inbox (SPEC §15): the recorded answer applies, none is needed here.
        if resume.decision.is_none()
            && let Some(w) = &waiting
        {
            if resume.answered {
                return Ok(None);
            }
            let answers = self.store.inbox().answers(&w.run_id).await?;
            if answers.contains_key(&(w.step.number.clone(), w.step.iteration)) {
                return Ok(None);
            }
        }
        let target = waiting
            .as_ref()
            .filter(|_| resume.decision.is_some())
            .map(|w| (w.run_id.clone(), w.step.number.clone(), w.step.iteration));
        self.check_waiting(plan, record, waiting, resume)?;
        Ok(target)
    }

    pub(crate) fn check_waiting(
        &self,
        plan: &Plan,
        record: &RunRecord,
        waiting: Option<crate::runtime::resume::Waiting>,
        resume: &ResumeOptions,
    ) -> Result<(), ResumeError> {
        match (waiting, &resume.decision) {
            (Some(w), None) if record.status == RunStatus::Interrupted && w.step.kind == "approval" => {
                Err(ResumeError::NeedsApproval {
                    id: record.id.clone(),
                    calls: approval_calls(&w.step),
                    step: w.step.step,
                })
            }
            (Some(w), None) if record.status == RunStatus::Interrupted && w.step.kind == "elicitation" => {
                let text = |k: &str| {
                    w.step
                        .result
                        .as_deref()
                        .and_then(|r| r.get(k))
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string()
                };
                Err(ResumeError::NeedsAnswer {
                    id: record.id.clone(),
                    server: text("server"),
                    tool: text("tool"),
                    step: w.step.step,
                })
            }
            (Some(w), None) if record.status == RunStatus::Interrupted => Err(ResumeError::NeedsDecision {
                id: record.id.clone(),
                step: w.step.step,
            }),
            (Some(_), None) => Ok(()),
            (None, Some(_)) => Err(ResumeError::NoInterrupt {
                id: record.id.clone(),
            }),
            (None, None) => Ok(()),
            (Some(w), Some(decision)) if w.step.kind == "approval" => {
                // The calls an agent loop proposed: a decision for each, in order.
                let calls: Vec<Value> = w
                    .step
                    .result
                    .as_ref()
                    .and_then(|r| r.get("calls"))
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let loop_plan = plan
                    .flows
                    .iter()
                    .filter(|f| f.name == w.flow)
                    .find_map(|f| f.steps.get(&w.step.step).and_then(|n| f.step(*n)))
                    .and_then(super::agent_loop::loop_of_step);
                super::agent_loop::check_decisions(decision, &calls, loop_plan).map_err(|reason| {
                    ResumeError::BadApproval {
                        step: w.step.step,
                        reason,
                    }
                })
            }
            (Some(w), Some(decision)) if w.step.kind == "elicitation" => {
                let result = w.step.result.as_deref();
                let server = result
                    .and_then(|r| r.get("server"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let schema = result.and_then(|r| r.get("schema")).unwrap_or(&Value::Null);
                super::elicit::check_answer(decision, schema).map_err(|reason| ResumeError::BadAnswer {
                    step: w.step.step,
                    server,
                    reason,
                })
            }
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
        carry: Option<u64>,
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
                base: Cost::ZERO,
                unknown_base: 0,
                limit,
                by: "--max-cost-usd",
            }),
            plan.root().limits.max_cost_usd.map(|limit| Budget {
                base: Cost::ZERO,
                unknown_base: 0,
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
            queued: Default::default(),
            committed: Default::default(),
            spent_nano: AtomicU64::new(0),
            carry,
            unknown_calls: AtomicU64::new(0),
            answered: AtomicBool::new(false),
        });
        let lineage = Lineage {
            parent_run: None,
            prefix: String::new(),
            depth: 0,
            max_depth,
            allow,
            hosts,
            budget,
            files: None,
            root: None,
            watch: None,
        };
        (tree, lineage)
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
impl<'e, S: Store> Run<'e, S> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
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
        // A new run's start (a resumed one keeps its own).
        let started = record::Stamp::now();
        let record = match earlier {
            // Resumed: the same run, running again; usage and steps are counted anew as the
            // records replay.
            Some(earlier) => RunRecord {
                status: RunStatus::Running,
                output: None,
                error: None,
                finished_at: None,
                finished_ns: None,
                usage: Usage::default(),
                steps: 0,
                // A run from before schema 5 records the `now` it is resumed with.
                now_us: Some(tree.now.unix_micros()),
                // The changes it runs under now: the recorded ones, or those that replaced
                // them (`batch --allow-changed`).
                agent_changes: if lineage.depth == 0 {
                    tree.options.agent_changes.source.clone()
                } else {
                    None
                },
                // Made again from the records as they replay.
                files: Vec::new(),
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
                started_at: started.ms(),
                finished_at: None,
                started_ns: Some(started.ns()),
                finished_ns: None,
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
                // The tree's changes, kept with its root: a resume applies them again.
                agent_changes: if lineage.depth == 0 {
                    tree.options.agent_changes.source.clone()
                } else {
                    None
                },
                origin: Some(tree.options.origin),
                files: Vec::new(),
            },
        };
        let limits = &flow.limits;
        let file_limits = Arc::new(crate::files::FileLimits {
            max_file_bytes: limits.max_file_bytes,
            max_run_file_bytes: limits.max_run_file_bytes,
            run_bytes: AtomicU64::new(0),
            names: (limits.max_file_bytes_name(), limits.max_run_file_bytes_name()),
            parent: lineage.files.clone(),
        });
        // A resumed run goes on counting from the files its records made.
        if let Some(replay) = &replay {
            file_limits.count_made(replay.file_bytes());
        }
        let turn_files = crate::files::FileSink::new(engine.store.blobs(), file_limits.clone());
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
            made: Default::default(),
            made_any: AtomicBool::new(false),
            files: Default::default(),
            file_limits,
            turn_files,
            numbered: 0,
            path: Vec::new(),
            started: Instant::now(),
            replay,
            start_recorded: false,
            asked: Default::default(),
            watch: None,
        }
    }

    pub(super) async fn execute(&mut self) -> RunOutcome {
        // Queued: the run's first awaited write (a step, or its end) commits it too.
        if !self.start_recorded
            && let Err(e) = self.engine.store.queue_run(&self.record).await
        {
            let e = self.store_error(&e);
            return self.finish(RunStatus::Failed, None, Some(e)).await;
        }
        if let Some(o) = &self.engine.observer {
            self.watch = o.run_started(&self.record, &self.lineage.watch);
            if let Some(since) = self.tree.carry
                && let Some(replay) = &self.replay
            {
                replay
                    .finished_since(since)
                    .for_each(|r| o.replayed(&self.watch, r));
            }
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
        let end = record::Stamp::now();
        self.record.finished_at = (!paused).then_some(end.ms());
        self.record.finished_ns = (!paused).then_some(end.ns());
        self.record.files = {
            let mut files = std::mem::take(&mut *self.files.lock().unwrap_or_else(|e| e.into_inner()));
            crate::record::files::sort_run_files(&mut files);
            files
        };
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
        // The inbox first: a run on record as waiting has its items (SPEC §15).
        let added = match status {
            RunStatus::Interrupted if self.store_failed().is_none() => self.settle_inbox(true).await,
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled => self.settle_inbox(false).await,
            _ => Vec::new(),
        };
        if self.store_failed().is_some() {
            tracing::warn!(run_id = %self.record.id, "the store failed: the end of the run is not recorded");
        } else if let Err(e) = self.engine.store.update_run(&self.record).await {
            tracing::error!(run_id = %self.record.id, error = %e, "could not record the end of the run");
            self.store_error(&e);
        } else {
            self.answered_meanwhile(&added).await;
        }
        if let Some(o) = &self.engine.observer {
            if self.store_failed().is_some() {
                o.run_unrecorded(&self.watch, &self.record);
            } else {
                o.run_ended(&self.watch, &self.record);
            }
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
            waiting: None,
            files: self.record.files.clone(),
        }
    }

    /// Records a step part, waiting for the commit unless `queued` ([`Store::queue_step`]).
    /// A record is queued when no effect follows it before the next awaited write or
    /// [`Run::barrier`] (an attempt's `started` record, the barrier before a model turn, the
    /// run's end): work without effects in between (a transform, a mock, a `set`) is not
    /// held up by the store, and a crash in it loses only work a resume does again, with the
    /// same outcome. The record of a call with effects is waited for, so that a crash after
    /// the effect finds the call in doubt for no longer than a commit takes.
    /// The record is built only for a store that keeps steps ([`Store::keeps_steps`]).
    /// Once a store write of this tree failed, nothing more is written: a record made after
    /// a lost one (a step failed *because* the store failed) would tell a resume a wrong story.
    pub(super) async fn record_with(
        &self,
        rec: impl FnOnce() -> StepRecord,
        queued: bool,
    ) -> Result<(), StepError> {
        let store = &self.engine.store;
        let observer = self.engine.observer.as_deref();
        if !store.keeps_steps() {
            if let Some(o) = observer {
                let r = rec();
                if r.status != StepStatus::Started {
                    o.step(&self.watch, &r);
                }
            }
            return Ok(());
        }
        if let Some(why) = self.store_failed() {
            return Err(StepError::new(ErrorKind::Agent, format!("store: {why}")));
        }
        let r = rec();
        if let Some(o) = observer
            && r.status != StepStatus::Started
        {
            o.step(&self.watch, &r);
        }
        self.note_asked(&r);
        if queued {
            self.tree.queued.fetch_add(1, Ordering::AcqRel);
            store.queue_step(r).await.map_err(|e| self.store_error(&e))
        } else {
            // An awaited write commits every write queued before it.
            let covered = self.tree.queued.load(Ordering::Acquire);
            store.record_step(r).await.map_err(|e| self.store_error(&e))?;
            self.tree.committed.fetch_max(covered, Ordering::AcqRel);
            Ok(())
        }
    }

    /// Waits until every record the run's tree queued so far is committed (at once when a
    /// commit is known to cover them): the barrier before an effect that no awaited write
    /// precedes, such as an agent loop's model turn. Fails, as a write would, once a write
    /// of the tree failed.
    pub(super) async fn barrier(&self) -> Result<(), StepError> {
        if let Some(why) = self.store_failed() {
            return Err(StepError::new(ErrorKind::Agent, format!("store: {why}")));
        }
        let covered = self.tree.queued.load(Ordering::Acquire);
        if self.tree.committed.load(Ordering::Acquire) >= covered {
            return Ok(());
        }
        self.engine
            .store
            .flush(&self.record.id)
            .await
            .map_err(|e| self.store_error(&e))?;
        self.tree.committed.fetch_max(covered, Ordering::AcqRel);
        Ok(())
    }

    /// The input an agent was called with: `built`, or what replaced it (`file()`
    /// references in place of their markers).
    pub(super) fn called_with<'a>(
        o: &mut StepOutcome,
        built: std::borrow::Cow<'a, Value>,
    ) -> std::borrow::Cow<'a, Value> {
        o.resolved_input.take().map_or(built, std::borrow::Cow::Owned)
    }

    /// The input document a step's record keeps: copied, if borrowed, only for a store that
    /// keeps step records.
    pub(super) fn recorded_input(&self, input: std::borrow::Cow<'_, Value>) -> Option<Value> {
        self.engine.store.keeps_steps().then(|| input.into_owned())
    }

    pub(super) async fn record(&self, rec: impl FnOnce() -> StepRecord) -> Result<(), StepError> {
        self.record_with(rec, false).await
    }

    pub(super) fn store_failed(&self) -> Option<String> {
        self.tree
            .store_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The error a failed store write becomes; the tree remembers the first.
    pub(super) fn store_error(&self, e: &crate::store::StoreError) -> StepError {
        let message = format!("store: {e}");
        let mut first = self.tree.store_failure.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(e.to_string());
        }
        StepError::new(ErrorKind::Agent, message)
    }

    /// The next step's number: `3`, or `2.3` in a child run started by step `2`.
    pub(super) fn number(&mut self) -> String {
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

    /// Records one iteration of a loop or one branch of a `parallel` step: `number` is the
    /// step's number (`2`) with `iteration` set for loops, or the branch's number (`3.sentiment`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn record_part(
        &self,
        step: &StepPlan,
        number: String,
        kind: &str,
        iteration: Option<u64>,
        input: Option<Value>,
        o: &mut StepOutcome,
        started: record::Stamp,
    ) {
        if o.stop != Some(RunStatus::Running) {
            self.finished.fetch_add(1, Ordering::Relaxed);
        }
        self.note_files(&o.files);
        if o.replayed {
            return;
        }
        let end = record::Stamp::now();
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
            started_at: started.ms(),
            finished_at: Some(end.ms()),
            started_ns: Some(started.ns()),
            finished_ns: Some(end.ns()),
            usage: o.usage,
            child_run: o.child_run.clone(),
            route: None,
            answers: o.answers.clone(),
            files: o.files.clone(),
        };
        if let Err(e) = self.record_with(rec, !o.effects).await {
            o.error = Some(e);
        }
    }

    /// Adds the files of a record (made now, or replayed) to the run's.
    pub(super) fn note_files(&self, files: &[crate::record::RunFile]) {
        if !files.is_empty() {
            self.files
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(files);
        }
    }

    /// Notes the files a call numbered `number` made, for its outcome to take.
    pub(super) fn made_files(&self, number: String, files: Vec<crate::record::RunFile>) {
        self.made_any.store(true, Ordering::Relaxed);
        self.made
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(number)
            .or_default()
            .extend(files);
    }

    /// The files the call numbered `number` made, taken.
    /// Cheap for a run that never made a file: nothing is looked up.
    pub(super) fn take_made(&self, number: crate::agents::StepNumber<'_>) -> Vec<crate::record::RunFile> {
        if !self.made_any.load(Ordering::Relaxed) {
            return Vec::new();
        }
        self.made
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&number.to_string())
            .unwrap_or_default()
    }
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

/// The calls an agent loop's approval part holds (its `result.calls`).
fn approval_calls(approval: &crate::record::StepRecord) -> usize {
    approval
        .result
        .as_ref()
        .and_then(|r| r.get("calls"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_written_like_to_string() {
        for n in [0u64, 7, 10, 99, 100, 12_345, u64::MAX] {
            let mut s = String::from("x");
            push_decimal(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
    }
}
