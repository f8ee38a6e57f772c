//! `switchyard resume` (and `runs resume`): continues a stored run — a run of `run` or a
//! local batch's item from its flow file; a submitted run (SPEC §12) from its batch's bundle,
//! under a lease of this process's own — or, with `--batch NAME`, the stopped runs of a
//! submitted batch, here, a few at a time.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::common::{self, RunArgs, StoreArg, fail, lock_batch, root_of};
use crate::agents::AgentState;
use crate::api::{RunConfig, Switchyard};
use crate::plan::Plan;
use crate::record::ErrorKind;
use crate::record::{RunRecord, RunStatus};
use crate::runtime::engine::{Engine, RunControls, RunOptions, RunOutcome};
use crate::runtime::resume::ResumeOptions;
use crate::store::any::AnyStore;
use crate::store::{RunFilter, Store};

/// How long this process's lease on a submitted run it resumes lasts; renewed at a third.
const LEASE: Duration = Duration::from_secs(30);

#[derive(clap::Args, Debug)]
#[command(
    after_help = "With --batch NAME (a submitted batch, SPEC §12) the batch's interrupted runs continue in this \
process, --concurrency at a time, each under a lease of its own as a worker would hold it: a run stopped \
`in_doubt` only with --retry-in-doubt, a run waiting at an `interrupt` step or an agent loop's approval only with \
--decision (the same decision for each, checked against each run's question); the others are listed and left as \
they are. Runs a worker holds right now are left to it.\n\n\
--decision is an answer like `switchyard inbox decide`: it is checked against the question's schema and \
recorded (with --actor, default the OS user, and --reason) before the run continues; an answer to a question \
decided before (by whom, when) or expired is refused (exit 2). A run that stopped before the inbox existed \
records nothing and resumes as given.\n\n\
A resumed run keeps the context it started with: --context is refused. It keeps the agent changes it \
started with too (--agent-change, recorded with the run): they apply again without the flag, and an \
--agent-change other than those is refused (exit 2).\n\n\
Exit status: 0 succeeded (with --batch: every run continued succeeded and none was left), 1 a run failed, \
2 usage, the run cannot be resumed, or another process runs it (named by pid and host), 3 interrupted again (or left interrupted)."
)]
#[command(mut_arg("context", |a| a.hide(true)))]
pub struct ResumeArgs {
    /// The root run to continue.
    #[arg(required_unless_present = "batch", conflicts_with = "batch")]
    pub run_id: Option<String>,
    /// Continue the interrupted runs of this submitted batch (`submit --batch NAME`) instead of one run.
    #[arg(long, value_name = "NAME", conflicts_with = "flow")]
    pub batch: Option<String>,
    /// With --batch: how many runs continue at a time.
    #[arg(long, value_name = "N", default_value_t = 8, requires = "batch",
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub concurrency: u64,
    /// The answer to the `interrupt` step the run waits at, as JSON (checked against its schema);
    /// with --batch, the answer for each run of the batch that waits for one.
    #[arg(long)]
    pub decision: Option<String>,
    /// Who gives --decision, recorded with it in the inbox's log (default the OS user).
    #[arg(long, requires = "decision")]
    pub actor: Option<String>,
    /// Why, recorded with --decision.
    #[arg(long, requires = "decision")]
    pub reason: Option<String>,
    /// Call again attempts that started and never finished, even of steps that are not idempotent.
    #[arg(long)]
    pub retry_in_doubt: bool,
    /// Resume even though the flow file, or a file it imports or calls, changed since the run started.
    #[arg(long)]
    pub allow_changed: bool,
    /// The flow file, when it moved since the run started (default: the recorded path).
    #[arg(long)]
    pub flow: Option<PathBuf>,
    #[command(flatten)]
    pub common: RunArgs,
    #[command(flatten)]
    pub store: StoreArg,
}

pub fn resume(args: ResumeArgs) -> u8 {
    if args.common.context.is_some() {
        return fail(
            "--context is not taken by resume: a resumed run is replayed with the context it started with",
        );
    }
    let decision = match args.decision.as_deref().map(crate::json::from_str) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(e)) => {
            return fail(format!(
                "--decision is not valid JSON: {} (line {}, column {})",
                e.cause(),
                e.line(),
                e.column()
            ));
        }
    };
    match (&args.run_id, &args.batch) {
        (Some(id), None) => resume_run(id, decision, &args),
        (None, Some(name)) => resume_batch(name, decision, &args),
        _ => fail("give a RUN_ID or --batch NAME"),
    }
}

/// `resume RUN_ID`.
fn resume_run(run_id: &str, decision: Option<Value>, args: &ResumeArgs) -> u8 {
    let rt = common::runtime();
    let store = match rt.block_on(args.store.open_existing()) {
        Ok(s) => Arc::new(s),
        Err(e) => return fail(e),
    };
    let record = match rt.block_on(store.get_run(run_id)) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let root = match rt.block_on(root_of(&*store, &record)) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if let Some(parent) = &record.parent_run {
        return fail(format!(
            "run `{}` is a child run (of `{parent}`): resume its root run `{}`, which resumes it",
            record.id, root.id
        ));
    }
    // Held to the end: a batch started meanwhile does not take the run too.
    let _batch = match lock_batch(&root, &record.id, "resume") {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    // A submitted run (SPEC §12): its flow comes from the batch's stored bundle, and this
    // process holds its lease while it runs, as a worker would.
    let submitted = match &*store {
        AnyStore::Sql(sql) => match rt.block_on(sql.lease_of(&record.id)) {
            Ok(l) => l.is_some(),
            Err(e) => return fail(e),
        },
        _ => false,
    };
    if submitted && args.flow.is_none() {
        return resume_submitted(&rt, store, record, decision, args);
    }
    let flow = match (&args.flow, &record.flow_path) {
        (Some(f), _) => f.clone(),
        (None, Some(p)) => PathBuf::from(p),
        (None, None) => {
            return fail(format!(
                "run `{}` has no recorded flow file (a child run? resume its root run); give it with --flow",
                record.id
            ));
        }
    };
    let Some(flow) = super::graph::load_flow(&flow, args.common.root.clone()) else {
        return super::exit::USAGE;
    };
    let options = match args.common.resume_options(flow.plan(), &record) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    if let Some(d) = &decision
        && crate::runtime::resume::resumable(record.status)
    {
        let root_flow = flow.plan().root();
        if record.flow_hash != root_flow.hash && !args.allow_changed {
            return fail(crate::runtime::resume::ResumeError::Changed {
                id: record.id.clone(),
                flow: record.flow.clone(),
                recorded: record.flow_hash.clone(),
                now: root_flow.hash.clone(),
            });
        }
        let engine = Engine::new(store.clone());
        if let Err(e) = rt.block_on(record_answer(
            &engine,
            flow.plan(),
            &record.id,
            d,
            &answerer(args),
        )) {
            return fail(e);
        }
    }
    let switchyard = Switchyard::with_store(store.clone());
    let resume = ResumeOptions {
        retry_in_doubt: args.retry_in_doubt,
        decision,
        // Found by the engine: the stop the run waits at.
        decision_for: None,
        allow_changed: args.allow_changed,
        lost: None,
        answered: false,
        record_answer: false,
        actor: None,
        reason: None,
    };
    let config = RunConfig {
        context: None,
        options,
        controls: RunControls::default(),
    };
    let outcome = rt.block_on(async {
        super::run::pause_on_ctrl_c(&config.controls);
        switchyard.resume(&flow, run_id, resume, config).await
    });
    drop(switchyard);
    conclude(&rt, store, outcome.map_err(|e| e.to_string()), args)
}

/// Who answers with `--decision`, and why.
struct Answerer {
    actor: crate::inbox::Actor,
    reason: Option<String>,
}

fn answerer(args: &ResumeArgs) -> Answerer {
    Answerer {
        actor: super::inbox::actor(args.actor.as_deref()),
        reason: args.reason.clone(),
    }
}

/// `resume --decision` is an answer like `inbox decide` (SPEC §15): recorded for the item of
/// the part run `run_id` waits at (the one the engine gives the decision to, its own or a
/// child run's), checked against its schema, before the run continues. A run that waits at
/// no item (it stopped before the inbox existed, or for another reason) records nothing, and
/// the engine checks the decision as it always did.
async fn record_answer(
    engine: &Engine<AnyStore>,
    plan: &Plan,
    run_id: &str,
    decision: &Value,
    by: &Answerer,
) -> Result<(), String> {
    use crate::inbox::{self, DecideError};
    let store = &*engine.store;
    // The engine's own check first: a decision it refuses is not an answer to record.
    let record = store.get_run(run_id).await.map_err(|e| e.to_string())?;
    if engine
        .check_decision_for(plan, &record, decision.clone())
        .await
        .is_err()
    {
        // Nothing is recorded; the resume refuses the decision in the same words (or says
        // the run was continued by another process meanwhile, which is why it no longer waits).
        return Ok(());
    }
    let Some(w) = crate::runtime::resume::waiting_at(store, run_id)
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(());
    };
    let id = crate::record::inbox::item_id(&w.run_id, &w.step.number, w.step.iteration);
    match store.inbox().get(&id).await {
        Ok(Some(_)) => {}
        Ok(None) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    }
    match inbox::decide(store, &id, decision.clone(), by.reason.clone(), &by.actor).await {
        Ok(_) => Ok(()),
        // Worded as `resume` always worded it for an interrupt.
        Err(DecideError::Invalid {
            step,
            pointer,
            reason,
            ..
        }) if w.step.kind == "interrupt" => Err(format!(
            "the decision does not match the `schema` of interrupt step `{step}` at `{pointer}`: {reason}"
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// Reports a resumed run's end (with the question it waits at, if it stopped at one) and
/// closes the store.
fn conclude(
    rt: &tokio::runtime::Runtime,
    store: Arc<AnyStore>,
    outcome: Result<RunOutcome, String>,
    args: &ResumeArgs,
) -> u8 {
    if let Ok(s) = Arc::try_unwrap(store) {
        rt.block_on(s.close());
    }
    match outcome {
        Ok(o) => super::run::report(o, &args.store),
        Err(e) => fail(e),
    }
}

/// `resume` of a submitted run: the plan from its batch's bundle, run under this process's
/// lease ([`run_leased`]).
fn resume_submitted(
    rt: &tokio::runtime::Runtime,
    store: Arc<AnyStore>,
    record: RunRecord,
    decision: Option<Value>,
    args: &ResumeArgs,
) -> u8 {
    let AnyStore::Sql(sql) = &*store else {
        return fail("a submitted run lives in a SQL store");
    };
    // Questions whose expiry passed are settled first, as `Switchyard::resume` does (SPEC §15).
    if let Err(e) = rt.block_on(store.inbox().expire_due()) {
        return fail(e);
    }
    let Some(name) = record.batch.clone() else {
        return fail(format!("run `{}` is submitted but names no batch", record.id));
    };
    let batch = match rt.block_on(sql.submitted_batch(&name)) {
        Ok(Some(b)) => b,
        Ok(None) => return fail(format!("the store has no submitted batch `{name}`")),
        Err(e) => return fail(e),
    };
    let plan = match rt.block_on((super::worker::loader())(sql, &batch)) {
        Ok(p) => p,
        Err(e) => return fail(format!("batch `{name}`: {e}")),
    };
    let options = match args.common.resume_options(&plan, &record) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    let resume = ResumeOptions {
        retry_in_doubt: args.retry_in_doubt,
        decision,
        decision_for: None,
        allow_changed: true,
        lost: None,
        answered: false,
        record_answer: false,
        actor: None,
        reason: None,
    };
    let engine = Engine::new(store.clone());
    let holder = format!("resume-{}", crate::cluster::worker::new_worker_id());
    let outcome = rt.block_on(async {
        let controls = RunControls::default();
        super::run::pause_on_ctrl_c(&controls);
        match run_leased(
            &store,
            &engine,
            &holder,
            plan,
            &record.id,
            options,
            (resume, controls, &answerer(args)),
        )
        .await
        {
            Ok(outcome) => Ok(engine.with_waiting(outcome).await),
            Err(e) => Err(e),
        }
    });
    drop(engine);
    let outcome = outcome.map_err(|e| match e {
        NotRun::Held => held_message(rt, sql, &record.id),
        NotRun::Failed(e) => e,
    });
    conclude(rt, store, outcome, args)
}

/// Why submitted run `id` is not this process's: the process and host of its lease's holder.
fn held_message(rt: &tokio::runtime::Runtime, sql: &crate::store::sql::SqlStore, id: &str) -> String {
    let holder = rt
        .block_on(sql.lease_of(id))
        .ok()
        .flatten()
        .and_then(|(_, owner, _)| owner)
        .and_then(|o| crate::store::writers::lease_holder_process(&o));
    match holder {
        Some((pid, host)) => crate::store::StoreError::Held {
            run: id.to_string(),
            pid,
            host,
        }
        .to_string(),
        None => format!("run `{id}` is being run by another process (a worker holds its lease)"),
    }
}

/// Why a submitted run was not continued here.
enum NotRun {
    /// Another holder's lease on it is live: a worker runs it, or another `resume`.
    Held,
    /// It could not be resumed (a decision its question refuses, a store failure): why.
    Failed(String),
}

/// Continues submitted run `id` here as `holder`: takes its lease (refused while another
/// holder's is live), renews it while the run goes on, and gives it back after, whatever the
/// end, so a run that paused or stopped again is free at once for a worker or a `resume`.
async fn run_leased(
    store: &Arc<AnyStore>,
    engine: &Engine<AnyStore>,
    holder: &str,
    plan: Arc<Plan>,
    id: &str,
    options: RunOptions,
    (resume, controls, by): (ResumeOptions, RunControls, &Answerer),
) -> Result<RunOutcome, NotRun> {
    let AnyStore::Sql(sql) = &**store else {
        return Err(NotRun::Failed("a submitted run lives in a SQL store".into()));
    };
    let epoch = match sql.take_over(holder, id, LEASE).await {
        Ok(Some(e)) => e,
        Ok(None) => return Err(NotRun::Held),
        Err(e) => return Err(NotRun::Failed(e.to_string())),
    };
    let held = vec![(id.to_string(), epoch)];
    // Recorded under this process's lease: the store does not queue the run for the workers.
    if let Some(d) = &resume.decision
        && let Err(e) = record_answer(engine, &plan, id, d, by).await
    {
        if let Err(e) = sql.release(holder, &held).await {
            super::stderr::error(format!("could not give back the lease of run `{id}`: {e}"));
        }
        return Err(NotRun::Failed(e));
    }
    sql.hold(id, epoch);
    let renew = {
        let store = store.clone();
        let holder = holder.to_string();
        let held = held.clone();
        tokio::spawn(async move {
            if let AnyStore::Sql(sql) = &*store {
                loop {
                    tokio::time::sleep(LEASE / 3).await;
                    let _ = sql.heartbeat(&holder, &held, LEASE).await;
                }
            }
        })
    };
    let out = engine
        .resume(
            plan,
            id,
            options,
            resume,
            Arc::new(AgentState::default()),
            controls,
        )
        .await;
    renew.abort();
    sql.let_go(id);
    if let Err(e) = sql.release(holder, &held).await {
        super::stderr::error(format!("could not give back the lease of run `{id}`: {e}"));
    }
    out.map_err(|e| NotRun::Failed(e.to_string()))
}

/// `resume --batch NAME`.
fn resume_batch(name: &str, decision: Option<Value>, args: &ResumeArgs) -> u8 {
    let rt = common::runtime();
    let store = match rt.block_on(args.store.open_existing()) {
        Ok(s) => Arc::new(s),
        Err(e) => return fail(e),
    };
    let code = rt.block_on(continue_batch(&store, name, decision, args));
    if let Ok(s) = Arc::try_unwrap(store) {
        rt.block_on(s.close());
    }
    code
}

/// What `resume --batch` did with each interrupted run of the batch.
#[derive(Default)]
struct Tally {
    succeeded: usize,
    failed: usize,
    interrupted: usize,
    /// Could not be resumed: a decision refused, a store failure.
    refused: usize,
    /// Left as they are: in doubt without --retry-in-doubt, waiting without --decision, held.
    in_doubt: usize,
    waiting: usize,
    held: usize,
    /// Stopped by Ctrl-C at a recorded point, and not started because of it.
    paused: usize,
    unstarted: usize,
}

async fn continue_batch(store: &Arc<AnyStore>, name: &str, decision: Option<Value>, args: &ResumeArgs) -> u8 {
    let AnyStore::Sql(sql) = &**store else {
        return fail(
            "--batch continues a submitted batch, which lives in a store workers share \
             (`--store postgres://...` or a SQLite file)",
        );
    };
    let batch = match sql.submitted_batch(name).await {
        Ok(Some(b)) => b,
        Ok(None) => {
            return fail(format!(
                "the store has no submitted batch `{name}` (`switchyard batches` lists them; the interrupted items \
                 of a local batch continue with `switchyard batch` again, or `resume RUN_ID`)"
            ));
        }
        Err(e) => return fail(e),
    };
    let plan = match (super::worker::loader())(sql, &batch).await {
        Ok(p) => p,
        Err(e) => return fail(format!("batch `{name}`: {e}")),
    };
    let options = match args.common.options(&plan) {
        Ok((_, o)) => o,
        Err(e) => return fail(e),
    };
    let filter = RunFilter {
        status: Some(RunStatus::Interrupted),
        flow: None,
        limit: None,
        roots_only: true,
        batches: vec![name.to_string()],
    };
    let mut stopped = match store.list_runs(&filter).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    stopped.sort_by_key(|r| r.item_index);
    let mut tally = Tally::default();
    let mut todo: Vec<(RunRecord, ResumeOptions)> = Vec::new();
    for r in stopped {
        let in_doubt = r.error.as_ref().is_some_and(|e| e.kind == ErrorKind::InDoubt);
        let waits = if in_doubt {
            false
        } else {
            match crate::runtime::resume::waiting_at(&**store, &r.id).await {
                Ok(w) => w.is_some(),
                Err(e) => return fail(e),
            }
        };
        let what = if in_doubt {
            "in doubt: --retry-in-doubt calls its unfinished attempt again"
        } else {
            "waits for a decision: --decision JSON answers it"
        };
        if (in_doubt && !args.retry_in_doubt) || (waits && decision.is_none()) {
            if in_doubt {
                tally.in_doubt += 1;
            } else {
                tally.waiting += 1;
            }
            println!("{}  {}  left: {what}", r.id, item_of(&r));
            continue;
        }
        let resume = ResumeOptions {
            retry_in_doubt: args.retry_in_doubt,
            decision: if waits { decision.clone() } else { None },
            decision_for: None,
            allow_changed: true,
            lost: None,
            answered: false,
            record_answer: false,
            actor: None,
            reason: None,
        };
        todo.push((r, resume));
    }
    let engine = Engine::new(store.clone());
    let holder = format!("resume-{}", crate::cluster::worker::new_worker_id());
    let by = Arc::new(answerer(args));
    let places = Arc::new(tokio::sync::Semaphore::new(
        usize::try_from(args.concurrency).unwrap_or(8),
    ));
    let mut running = tokio::task::JoinSet::new();
    let total = todo.len();
    // Ctrl-C: no more runs start, and those running stop at their next recorded point.
    let controls = RunControls::default();
    super::run::pause_on_ctrl_c(&controls);
    for (r, resume) in todo {
        let Ok(place) = places.clone().acquire_owned().await else {
            break;
        };
        if controls.pause.is_cancelled() {
            tally.unstarted += 1;
            println!("{}  {}  left: not started (Ctrl-C)", r.id, item_of(&r));
            continue;
        }
        let controls = controls.clone();
        let (store, engine, holder, plan, options, by) = (
            store.clone(),
            engine.clone(),
            holder.clone(),
            plan.clone(),
            options.clone(),
            by.clone(),
        );
        running.spawn(async move {
            let out = run_leased(
                &store,
                &engine,
                &holder,
                plan,
                &r.id,
                options,
                (resume, controls, &by),
            )
            .await;
            drop(place);
            (r, out)
        });
    }
    while let Some(done) = running.join_next().await {
        let Ok((r, out)) = done else { continue };
        let item = item_of(&r);
        match out {
            Ok(o) => {
                let error = o
                    .error
                    .as_ref()
                    .map(|e| format!(": [{}] {}", e.kind, e.message.lines().next().unwrap_or("")))
                    .unwrap_or_default();
                match o.status {
                    RunStatus::Succeeded => tally.succeeded += 1,
                    RunStatus::Interrupted => tally.interrupted += 1,
                    RunStatus::Running => tally.paused += 1,
                    _ => tally.failed += 1,
                }
                let status = match o.status {
                    RunStatus::Interrupted => "interrupted again",
                    RunStatus::Running => "paused",
                    s => s.as_str(),
                };
                println!("{}  {item}  {status}{error}", r.id);
            }
            Err(NotRun::Held) => {
                tally.held += 1;
                println!("{}  {item}  left: a worker holds it right now", r.id);
            }
            Err(NotRun::Failed(e)) => {
                tally.refused += 1;
                println!("{}  {item}  not resumed: {e}", r.id);
            }
        }
    }
    let left = tally.in_doubt + tally.waiting + tally.held + tally.unstarted;
    let counts = |parts: &[(usize, &str)]| -> String {
        let named: Vec<String> = parts
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!("{n} {what}"))
            .collect();
        named.join(", ")
    };
    let mut text = format!(
        "batch `{name}`: {} interrupted run(s) continued",
        total - tally.unstarted
    );
    let ends = counts(&[
        (tally.succeeded, "succeeded"),
        (tally.failed, "failed"),
        (tally.interrupted, "interrupted again"),
        (tally.paused, "paused (Ctrl-C)"),
        (tally.refused, "not resumed"),
    ]);
    if !ends.is_empty() {
        text.push_str(&format!(": {ends}"));
    }
    if left > 0 {
        let kept = counts(&[
            (tally.in_doubt, "in doubt (--retry-in-doubt)"),
            (tally.waiting, "waiting for a decision (--decision JSON)"),
            (tally.held, "held by a worker"),
            (tally.unstarted, "not started (Ctrl-C)"),
        ]);
        text.push_str(&format!("; left as they are: {kept}"));
    }
    if total > 0 {
        text.push_str(&format!(
            ". `switchyard collect --batch {name} --output OUT.jsonl` writes the results again"
        ));
    }
    super::stderr::say(
        super::stderr::Level::Info,
        "batch_resumed",
        &text,
        serde_json::json!({
            "batch": name, "continued": total, "succeeded": tally.succeeded, "failed": tally.failed,
            "interrupted": tally.interrupted, "not_resumed": tally.refused, "in_doubt": tally.in_doubt,
            "waiting": tally.waiting, "held": tally.held, "paused": tally.paused, "not_started": tally.unstarted,
        }),
    );
    if tally.paused + tally.unstarted > 0 {
        // Stopped by Ctrl-C, as `run` and `batch` say it.
        130
    } else if tally.failed > 0 {
        super::exit::FAILED
    } else if tally.refused > 0 {
        super::exit::USAGE
    } else if tally.interrupted + left > 0 {
        super::exit::INTERRUPTED
    } else {
        super::exit::OK
    }
}

/// A run's item, as `resume --batch` names it: the input's id, or its line number.
fn item_of(r: &RunRecord) -> String {
    match (&r.item_id, r.item_index) {
        (Some(id), _) => format!("item {id}"),
        (None, Some(i)) => format!("line {}", i + 1),
        (None, None) => "-".to_string(),
    }
}
