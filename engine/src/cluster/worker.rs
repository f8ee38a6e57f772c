//! `switchyard worker` (SPEC §12): claims queued runs of submitted batches from the store, runs
//! them as a local batch runs its items, and keeps their leases alive by heartbeat.
//!
//! - **Claims** take up to the free places (`--concurrency` minus the runs held) at a time, in
//!   one short transaction; with nothing to claim the worker polls, backing off to
//!   [`IDLE_POLL_MAX`].
//! - **Leases**: each claimed run is held under the epoch it was claimed at
//!   ([`SqlStore::hold`]): every write of it (and of its child runs) is refused once another
//!   worker took it over. The heartbeat renews the held leases every `--heartbeat`; a held run
//!   the heartbeat no longer finds this worker's is paused here (its writes are refused
//!   anyway) and counted as dropped.
//! - **Taken back**: after this process was stopped or starved past its leases, claims wait
//!   for the heartbeat to renew them in place. A run may still come back in this worker's own
//!   claim while it runs here ([`take`]); one execution carries it on either way: if no one
//!   else held it meanwhile, the execution in flight goes on under the new lease; else that
//!   one is stale (its writes are refused) and the new claim starts once it has let go.
//! - **Recoveries**: a run claimed from a worker whose lease ran out more times than its
//!   batch's `--max-recoveries` is replayed with `ResumeOptions::lost`: it fails with kind
//!   `lost` where it would call (an attempt in doubt still stops it `in_doubt`). A run whose
//!   workers died twice is a suspect: it is claimed only by a worker holding nothing, and runs
//!   alone ([`Claim::Alone`]), so a poison item does not take the runs beside it down with it
//!   to their own `lost`.
//! - **Store failures** (a connection killed, the database restarting): the run stops where its
//!   records end, and its lease is given back, so it resumes (here or elsewhere) once the
//!   store answers.
//! - **Drain** (SIGTERM): no more claims; held runs have `--grace` to finish; then they pause at
//!   their next recorded point, and every lease still held is given back.
//! - **Expiry** (SPEC §15): every heartbeat settles the inbox's questions whose expiry passed
//!   ([`SqlStore::expire_questions`]): their runs are queued again and claimed like runs
//!   whose question was decided, and fail `timeout` (or reject) where they waited.
//! - **Answers**: a run that stopped `interrupted` is given back at once; one whose question
//!   was answered before the give-back is queued again by it ([`SqlStore::release`]).
//! - A store migrated by a newer switchyard (found by the heartbeat, or refused by a fenced
//!   write) stops the worker: it writes nothing in the old shape.
//! - **Provider limits** are held with the other workers of the store ([`WorkerLimits`],
//!   installed in the process's provider registry): the heartbeat renews this worker's
//!   `max_concurrency` slots with its run leases, and the stop waits for slots being given
//!   back, then gives back any still held.
//! - **A batch's budget** (`submit --max-cost-usd`) is held with the other workers too
//!   ([`WorkerBudgets`]): every run's calls check the batch's spend, this worker's exact and
//!   the others' as of the last refresh, before they are sent.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::budget::{BatchSpend, WorkerBudgets};
use super::limits::WorkerLimits;
use crate::agents::AgentState;
use crate::agents::provider::Providers;
use crate::plan::Plan;
use crate::record::RunStatus;
use crate::runtime::engine::{Engine, RunControls, RunOptions, RunOutcome};
use crate::runtime::resume::{ResumeError, ResumeOptions};
use crate::store::any::AnyStore;
use crate::store::sql::SqlStore;
use crate::store::sql::batches::{SubmittedBatch, WorkerRow};
use crate::store::sql::queue::{Claim, Claimed};
use crate::store::writers::host_name;
use crate::store::{StoreError, sql};

/// The longest wait between claims while there is nothing to claim.
pub const IDLE_POLL_MAX: Duration = Duration::from_millis(1000);
/// The first wait between claims once a claim found nothing.
const IDLE_POLL_MIN: Duration = Duration::from_millis(50);

#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// This worker's id in the store (`workers.id`, `runs.lease_owner`).
    pub id: String,
    /// Claim only from this batch.
    pub batch: Option<String>,
    /// Runs held at once.
    pub concurrency: usize,
    pub lease: Duration,
    pub heartbeat: Duration,
    /// After SIGTERM, how long held runs may take to finish before they are paused.
    pub grace: Duration,
    /// Exit once nothing is held and no submitted run (of `batch`, or of any batch) is queued
    /// or running, instead of waiting for more work.
    pub exit_when_idle: bool,
    /// The directories `file("path")` reads under (`--files-root`, canonical): a submitted
    /// run's steps read on the worker's machine, where the submitting machine's project root
    /// may not exist.
    pub files_roots: Arc<Vec<std::path::PathBuf>>,
}

/// What a worker did.
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub claimed: AtomicU64,
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    pub interrupted: AtomicU64,
    /// Runs whose lease another worker took (or that were cancelled) while held here.
    pub dropped: AtomicU64,
    /// Leases given back unfinished: at the drain, or after a store failure.
    pub released: AtomicU64,
    /// Runs held now.
    pub held: AtomicU64,
}

/// Why a worker stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("a worker needs a PostgreSQL (or SQLite) store shared with `submit`, not `--store memory`")]
    NotShared,
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The flow bundle of a batch cannot run here (an unknown bundle format, a flow that does
    /// not compile with this build).
    #[error("batch `{batch}`: {message}")]
    Bundle { batch: String, message: String },
}

/// Turns a submitted batch into the plan its runs run: the bundle read from the store,
/// materialized and compiled. Given by the caller (the command line prints diagnostics).
pub type PlanLoader = Arc<dyn for<'a> Fn(&'a SqlStore, &SubmittedBatch) -> PlanFuture<'a> + Send + Sync>;
/// What a [`PlanLoader`] returns.
pub type PlanFuture<'a> = std::pin::Pin<Box<dyn Future<Output = Result<Arc<Plan>, String>> + Send + 'a>>;

/// A batch as this worker knows it.
struct Known {
    plan: Arc<Plan>,
    max_recoveries: u64,
    /// The batch's spend against its cap, shared with the other workers.
    spend: Arc<BatchSpend>,
}

/// A run held here.
struct Held {
    epoch: i64,
    /// Pauses this run alone (a child of the drain's pause): a run whose lease is gone stops
    /// at its next recorded point — whose write is refused — without ending it here.
    pause: CancellationToken,
    /// The heartbeat found its lease gone.
    lost: bool,
    /// Why the run is given up as lost when it starts (taken over too many times).
    given_up: Option<String>,
    /// Claimed again while a stale execution of it still runs here: started once that one
    /// settles ([`take`]).
    again: Option<Box<(Claimed, Held)>>,
}

/// What a run's task hands back.
struct Finished {
    id: String,
    epoch: i64,
    outcome: Result<RunOutcome, ResumeError>,
}

/// Runs the worker until `stop` (SIGTERM) and the drain, or, with `exit_when_idle`, until
/// there is nothing left to do.
pub async fn run(
    store: Arc<AnyStore>,
    options: WorkerOptions,
    load: PlanLoader,
    stop: CancellationToken,
    stats: Arc<WorkerStats>,
) -> Result<(), WorkerError> {
    let AnyStore::Sql(sql) = &*store else {
        return Err(WorkerError::NotShared);
    };
    sql.register_worker(&WorkerRow {
        id: options.id.clone(),
        host: host_name(),
        pid: u64::from(std::process::id()),
        batch: options.batch.clone(),
        concurrency: options.concurrency as u64,
        lease_ms: options.lease.as_millis() as u64,
        started_at: 0,
        heartbeat_at: 0,
        stopped_at: None,
    })
    .await?;
    tracing::info!(worker = %options.id, "worker started");
    let limits = Arc::new(WorkerLimits::new(sql.limits(), options.id.clone(), options.lease));
    let limits = if Providers::global().share(limits.clone()) {
        Some(limits)
    } else {
        tracing::warn!(
            worker = %options.id,
            "provider limits are shared by another worker of this process already: they stay its"
        );
        None
    };
    let held: Arc<Mutex<HashMap<String, Held>>> = Arc::default();
    let fatal: Arc<Mutex<Option<WorkerError>>> = Arc::default();
    let stop_all = CancellationToken::new();
    let budgets = Arc::new(WorkerBudgets::new(options.id.clone(), store.clone()));
    let fresh = tokio::spawn({
        let (budgets, stop) = (budgets.clone(), stop_all.clone());
        async move { budgets.keep_fresh(stop).await }
    });
    let renewed = Arc::new(Mutex::new(Instant::now()));
    let heart = tokio::spawn(heartbeat(
        store.clone(),
        options.clone(),
        held.clone(),
        limits.clone(),
        fatal.clone(),
        stop_all.clone(),
        renewed.clone(),
    ));
    let outcome = work(
        &store, sql, &options, &load, &stop, &stop_all, &held, &fatal, &stats, &budgets, &renewed,
    )
    .await;
    stop_all.cancel();
    let _ = heart.await;
    let _ = fresh.await;
    // Whatever is still held is given back (runs paused at the drain, or stopped by a failure).
    let rest: Vec<(String, i64)> = held
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .map(|(id, h)| {
            // A claim waiting for a stale execution to let go is the one the store holds.
            let epoch = h.again.as_ref().map_or(h.epoch, |a| a.0.epoch);
            (id, epoch)
        })
        .collect();
    if !rest.is_empty() {
        for (id, _) in &rest {
            sql.let_go(id);
        }
        stats.released.fetch_add(rest.len() as u64, Ordering::Relaxed);
        if let Err(e) = sql.release(&options.id, &rest).await {
            tracing::warn!(worker = %options.id, error = %e, "could not give back leases: they run out instead");
        }
    }
    if let Some(limits) = &limits {
        limits.finish(Duration::from_secs(2)).await;
    }
    if let Err(e) = sql.stop_worker(&options.id).await {
        tracing::warn!(worker = %options.id, error = %e, "could not unregister the worker");
    }
    tracing::info!(worker = %options.id, "worker stopped");
    outcome
}

/// The claim loop: claims while there is room, starts each run, settles each as it ends.
#[allow(clippy::too_many_arguments)]
async fn work(
    store: &Arc<AnyStore>,
    sql: &SqlStore,
    options: &WorkerOptions,
    load: &PlanLoader,
    stop: &CancellationToken,
    stop_all: &CancellationToken,
    held: &Arc<Mutex<HashMap<String, Held>>>,
    fatal: &Arc<Mutex<Option<WorkerError>>>,
    stats: &Arc<WorkerStats>,
    budgets: &WorkerBudgets,
    renewed: &Mutex<Instant>,
) -> Result<(), WorkerError> {
    let engine = Engine::new(store.clone());
    let mut known: HashMap<String, Known> = HashMap::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Finished>();
    let pause = CancellationToken::new();
    let mut in_flight = 0usize;
    // Runs claimed ahead, held (their leases renewed) and started as places free: a place
    // is refilled without waiting for a claim's round trip.
    let mut ready: VecDeque<Claimed> = VecDeque::new();
    let ahead = options.concurrency.div_ceil(4);
    let mut alone = false;
    let mut idle = IDLE_POLL_MIN;
    // With --exit-when-idle, the end of the work others hold is noticed within a short poll.
    let max_idle = if options.exit_when_idle {
        IDLE_POLL_MIN * 2
    } else {
        IDLE_POLL_MAX
    };
    let mut next_claim = Instant::now();
    let mut last_claim_empty = false;
    let mut claiming: Option<ClaimFuture<'_>> = None;
    let mut claim_started = Instant::now();
    let mut draining: Option<Instant> = None;
    let store_down = Arc::new(AtomicBool::new(false));
    loop {
        let failed = fatal.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(e) = failed {
            pause.cancel();
            stop_all.cancel();
            // Runs in flight stop where they are; their writes are refused from now on.
            drain_rest(
                &mut done_rx,
                &mut in_flight,
                held,
                sql,
                options,
                stats,
                Duration::from_secs(2),
            )
            .await;
            return Err(e);
        }
        if stop.is_cancelled() && draining.is_none() {
            tracing::info!(worker = %options.id, held = in_flight, "draining: no more claims");
            draining = Some(Instant::now());
            // What was claimed ahead and not started goes straight back.
            give_back(
                ready.drain(..).map(|c| c.record.id).collect(),
                held,
                sql,
                options,
                stats,
            )
            .await;
        }
        if let Some(since) = draining {
            // A claim in flight is awaited first: what it took is given back.
            if in_flight == 0 && claiming.is_none() {
                return Ok(());
            }
            if since.elapsed() >= options.grace {
                tracing::info!(worker = %options.id, held = in_flight, "grace over: pausing what is held");
                pause.cancel();
                drain_rest(
                    &mut done_rx,
                    &mut in_flight,
                    held,
                    sql,
                    options,
                    stats,
                    Duration::from_secs(5),
                )
                .await;
                return Ok(());
            }
        }
        if in_flight == 0 && ready.is_empty() && claiming.is_none() {
            alone = false;
        }
        // Free places take runs claimed ahead (a suspect run, claimed alone, starts alone).
        while in_flight < options.concurrency && (!alone || in_flight == 0) {
            let Some(c) = ready.pop_front() else { break };
            let batch = c.record.batch.clone().unwrap_or_default();
            start(&engine, &known[&batch], c, held, &done_tx, &options.files_roots);
            in_flight += 1;
        }
        let holding = in_flight + ready.len();
        // A suspect run (its workers died twice) runs alone: nothing else is claimed beside it.
        let room = if alone {
            0
        } else {
            (options.concurrency + ahead).saturating_sub(holding)
        };
        // Many runs per claim: a claim waits until a quarter of the places are free (or none
        // is held), so that claims stay few next to the runs they start. A claim runs beside
        // the loop: runs that end meanwhile are settled, and their places go to the runs
        // claimed ahead.
        let worth = holding == 0 || room >= ahead;
        if draining.is_none() && claiming.is_none() && room > 0 && worth && Instant::now() >= next_claim {
            // Not while the held leases may have run out (this process was stopped or starved
            // past them): the claim would find the runs still running here and take them back;
            // the heartbeat renews them in place first ([`take`] copes when it does not).
            let stale = renewed.lock().unwrap_or_else(|p| p.into_inner()).elapsed() >= options.lease;
            if stale {
                next_claim = Instant::now() + (options.heartbeat / 4).max(Duration::from_millis(10));
            } else {
                claim_started = Instant::now();
                claiming = Some(Box::pin(claim_round(sql, options, holding == 0, room)));
            }
        }
        // Idle: nothing held, nothing being claimed, the last claim found nothing, and nothing
        // left unfinished that a lease running out would free.
        if options.exit_when_idle
            && in_flight == 0
            && ready.is_empty()
            && claiming.is_none()
            && last_claim_empty
            && !store_down.load(Ordering::Relaxed)
            && sql.unfinished_submitted(options.batch.as_deref()).await.ok() == Some(0)
        {
            return Ok(());
        }
        // Wait for a run to end, a claim to return, the next poll, or SIGTERM.
        let wait = if claiming.is_none() && room > 0 && draining.is_none() {
            next_claim
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        } else {
            IDLE_POLL_MAX
        };
        tokio::select! {
            f = done_rx.recv() => {
                if let Some(f) = f {
                    in_flight -= 1;
                    let mut again: Vec<Claimed> = settle(f, held, sql, options, stats).await.into_iter().collect();
                    // Everything else that ended meanwhile, without waiting.
                    while let Ok(f) = done_rx.try_recv() {
                        in_flight -= 1;
                        again.extend(settle(f, held, sql, options, stats).await);
                    }
                    // Runs claimed again while a stale execution of them let go.
                    if draining.is_some() {
                        give_back(again.into_iter().map(|c| c.record.id).collect(), held, sql, options, stats).await;
                    } else {
                        ready.extend(again);
                    }
                }
            }
            (kind, got) = async { claiming.as_mut().expect("a claim in flight").await }, if claiming.is_some() => {
                claiming = None;
                tracing::debug!(
                    worker = %options.id,
                    claimed = got.as_ref().map_or(0, Vec::len),
                    held = in_flight,
                    ms = claim_started.elapsed().as_secs_f64() * 1000.0,
                    "claim returned"
                );
                match got {
                    Ok(claimed) => {
                        store_down.store(false, Ordering::Relaxed);
                        last_claim_empty = claimed.is_empty();
                        if claimed.is_empty() {
                            next_claim = Instant::now() + idle;
                            idle = (idle * 2).min(max_idle);
                        } else {
                            idle = IDLE_POLL_MIN;
                            next_claim = Instant::now();
                        }
                        if kind == Claim::Alone && !claimed.is_empty() {
                            alone = true;
                            tracing::info!(worker = %options.id, "taking over a run whose workers died twice: it runs alone");
                        }
                        if draining.is_some() {
                            // Claimed as the drain began: given straight back.
                            let back: Vec<(String, i64)> = claimed.iter().map(|c| (c.record.id.clone(), c.epoch)).collect();
                            let _ = sql.release(&options.id, &back).await;
                            continue;
                        }
                        let mut claimed = claimed.into_iter();
                        while let Some(c) = claimed.next() {
                            stats.claimed.fetch_add(1, Ordering::Relaxed);
                            let batch = c.record.batch.clone().unwrap_or_default();
                            if !known.contains_key(&batch) {
                                match learn(sql, &batch, load, budgets).await {
                                    Ok(k) => {
                                        known.insert(batch.clone(), k);
                                    }
                                    Err(e) => {
                                        // This worker cannot run the batch: give the run back,
                                        // and the rest of this claim with it, for a worker that
                                        // can, and stop.
                                        let back: Vec<(String, i64)> = std::iter::once(c)
                                            .chain(claimed.by_ref())
                                            .map(|c| (c.record.id.clone(), c.epoch))
                                            .collect();
                                        if let Err(e) = sql.release(&options.id, &back).await {
                                            tracing::warn!(worker = %options.id, error = %e, "could not give back leases: they run out instead");
                                        }
                                        *fatal.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                                        break;
                                    }
                                }
                            }
                            take(sql, known[&batch].max_recoveries, c, &pause, held, &mut ready, stats);
                        }
                    }
                    Err(e) => {
                        last_claim_empty = false;
                        next_claim = Instant::now() + idle;
                        idle = (idle * 2).min(max_idle);
                        if !store_down.swap(true, Ordering::Relaxed) {
                            tracing::warn!(worker = %options.id, error = %e, "cannot claim runs; trying again");
                        }
                    }
                }
            }
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled(), if draining.is_none() => {}
            _ = stop_all.cancelled() => {}
        }
    }
}

/// The future of one claim.
type ClaimFuture<'a> =
    std::pin::Pin<Box<dyn Future<Output = (Claim, Result<Vec<Claimed>, StoreError>)> + Send + 'a>>;

/// One claim of up to `room` runs: with nothing held (`idle`), a suspect run to run alone
/// first; else (or when there is none) the shared queue.
async fn claim_round(
    sql: &SqlStore,
    options: &WorkerOptions,
    idle: bool,
    room: usize,
) -> (Claim, Result<Vec<Claimed>, StoreError>) {
    let batch = options.batch.as_deref();
    if idle {
        match sql
            .claim(&options.id, batch, 1, options.lease, Claim::Alone)
            .await
        {
            Ok(c) if c.is_empty() => {}
            other => return (Claim::Alone, other),
        }
    }
    (
        Claim::Shared,
        sql.claim(&options.id, batch, room, options.lease, Claim::Shared)
            .await,
    )
}

/// After the pause: waits up to `within` for the held runs to stop, settling each.
async fn drain_rest(
    done_rx: &mut mpsc::UnboundedReceiver<Finished>,
    in_flight: &mut usize,
    held: &Arc<Mutex<HashMap<String, Held>>>,
    sql: &SqlStore,
    options: &WorkerOptions,
    stats: &Arc<WorkerStats>,
    within: Duration,
) {
    let deadline = tokio::time::Instant::now() + within;
    while *in_flight > 0 {
        match tokio::time::timeout_at(deadline, done_rx.recv()).await {
            Ok(Some(f)) => {
                *in_flight -= 1;
                if let Some(c) = settle(f, held, sql, options, stats).await {
                    give_back(vec![c.record.id], held, sql, options, stats).await;
                }
            }
            _ => break,
        }
    }
}

/// Reads batch `name` and loads its plan.
async fn learn(
    sql: &SqlStore,
    name: &str,
    load: &PlanLoader,
    budgets: &WorkerBudgets,
) -> Result<Known, WorkerError> {
    let batch = sql
        .submitted_batch(name)
        .await?
        .ok_or_else(|| WorkerError::Bundle {
            batch: name.to_string(),
            message: "the store has no such submitted batch".into(),
        })?;
    let plan = load(sql, &batch).await.map_err(|message| WorkerError::Bundle {
        batch: name.to_string(),
        message,
    })?;
    Ok(Known {
        plan,
        max_recoveries: batch.max_recoveries,
        spend: budgets.of(name).await?,
    })
}

/// Holds claimed run `c` here: its writes fenced by the epoch it was claimed at, its lease
/// renewed by the heartbeat, until it is started ([`start`]) or given back; a new one goes
/// to `ready`. A run taken over more times than the batch allows is marked to be given up as
/// lost.
///
/// A run already held here came back because its lease ran out (this process was stopped or
/// starved past it) and this claim found it before the heartbeat renewed it. Claimed ahead
/// and not started, the newer claim takes the older's place. Running here, one execution
/// carries it on: if no one else held it meanwhile (the epoch moved by this claim alone), the
/// execution in flight goes on under the new epoch; else that execution is stale (its writes
/// are refused), so it is paused, and the new claim waits in [`Held::again`] until it lets go
/// ([`settle`]).
fn take(
    sql: &SqlStore,
    max_recoveries: u64,
    c: Claimed,
    pause: &CancellationToken,
    held: &Arc<Mutex<HashMap<String, Held>>>,
    ready: &mut VecDeque<Claimed>,
    stats: &Arc<WorkerStats>,
) {
    let id = c.record.id.clone();
    let given_up = (c.recoveries > max_recoveries).then(|| {
        format!(
            "the run was taken over from workers that stopped holding it {} times (the batch's --max-recoveries is {}): \
             given up rather than crash another worker",
            c.recoveries, max_recoveries
        )
    });
    let fresh = Held {
        epoch: c.epoch,
        pause: pause.child_token(),
        lost: false,
        given_up,
        again: None,
    };
    let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
    let Some(h) = held.get_mut(&id) else {
        sql.hold(&id, c.epoch);
        held.insert(id, fresh);
        stats.held.fetch_add(1, Ordering::Relaxed);
        ready.push_back(c);
        return;
    };
    if let Some(waiting) = ready.iter_mut().find(|r| r.record.id == id) {
        sql.hold(&id, c.epoch);
        *h = fresh;
        *waiting = c;
    } else if !h.lost && h.again.is_none() && c.epoch == h.epoch + 1 {
        tracing::info!(run_id = %id, "the run's lease ran out while it ran here, and no one took it: it goes on here");
        sql.hold(&id, c.epoch);
        h.epoch = c.epoch;
    } else {
        tracing::warn!(run_id = %id, "the run was claimed again while a stale execution of it stops here: it starts once that one has");
        h.lost = true;
        h.pause.cancel();
        h.again = Some(Box::new((c, fresh)));
    }
}

/// Starts held run `c` on a task of its own.
fn start(
    engine: &Engine<AnyStore>,
    k: &Known,
    c: Claimed,
    held: &Arc<Mutex<HashMap<String, Held>>>,
    done: &mpsc::UnboundedSender<Finished>,
    files_roots: &Arc<Vec<std::path::PathBuf>>,
) {
    let id = c.record.id.clone();
    let (own_pause, lost) = {
        let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
        match held.get_mut(&id) {
            Some(h) => (h.pause.clone(), h.given_up.take()),
            None => (CancellationToken::new(), None),
        }
    };
    if lost.is_some() {
        tracing::warn!(run_id = %id, recoveries = c.recoveries, "giving the run up as lost");
    }
    // The batch's bundle is what its runs run: a run started before `submit --allow-changed`
    // pointed the batch at a new one continues with it.
    let resume = ResumeOptions {
        lost,
        allow_changed: true,
        ..ResumeOptions::default()
    };
    let controls = RunControls {
        cancel: CancellationToken::new(),
        pause: own_pause,
        released: None,
    };
    let engine = engine.clone();
    let plan = k.plan.clone();
    let options = RunOptions {
        shared_budget: Some(k.spend.clone()),
        files_roots: files_roots.clone(),
        ..RunOptions::default()
    };
    let done = done.clone();
    let fresh = c.is_fresh();
    let epoch = c.epoch;
    tokio::spawn(async move {
        let state = Arc::new(AgentState::default());
        let outcome =
            Box::pin(engine.resume_record(plan, c.record, fresh, options, resume, state, controls)).await;
        let _ = done.send(Finished { id, epoch, outcome });
    });
}

/// Gives back held runs that were not started.
async fn give_back(
    ids: Vec<String>,
    held: &Arc<Mutex<HashMap<String, Held>>>,
    sql: &SqlStore,
    options: &WorkerOptions,
    stats: &Arc<WorkerStats>,
) {
    if ids.is_empty() {
        return;
    }
    let back: Vec<(String, i64)> = {
        let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
        ids.iter()
            .filter_map(|id| held.remove(id).map(|h| (id.clone(), h.epoch)))
            .collect()
    };
    for (id, _) in &back {
        sql.let_go(id);
    }
    stats.held.fetch_sub(back.len() as u64, Ordering::Relaxed);
    stats.released.fetch_add(back.len() as u64, Ordering::Relaxed);
    if let Err(e) = sql.release(&options.id, &back).await {
        tracing::warn!(worker = %options.id, error = %e, "could not give back leases: they run out instead");
    }
}

/// Lets go of a run whose execution here ended ([`count_end`]). A claim of the run that
/// waited for this execution to let go ([`Held::again`]) is held from now on and returned,
/// to be started.
async fn settle(
    mut f: Finished,
    held: &Arc<Mutex<HashMap<String, Held>>>,
    sql: &SqlStore,
    options: &WorkerOptions,
    stats: &Arc<WorkerStats>,
) -> Option<Claimed> {
    let (lost, again) = {
        let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
        let h = held.remove(&f.id);
        sql.let_go(&f.id);
        let lost = h.as_ref().is_some_and(|h| h.lost);
        // The epoch it ended under: a newer one when it went on under a claim of this
        // worker's ([`take`]).
        if let Some(h) = &h {
            f.epoch = h.epoch;
        }
        let again = h.and_then(|h| h.again).map(|again| {
            let (c, h) = *again;
            sql.hold(&f.id, c.epoch);
            held.insert(f.id.clone(), h);
            c
        });
        (lost, again)
    };
    if again.is_none() {
        stats.held.fetch_sub(1, Ordering::Relaxed);
    }
    count_end(f, lost, sql, options, stats).await;
    again
}

/// Counts a run whose execution here ended (`lost`: its lease was found gone); gives back the
/// lease of one that stopped unfinished.
async fn count_end(
    f: Finished,
    lost: bool,
    sql: &SqlStore,
    options: &WorkerOptions,
    stats: &Arc<WorkerStats>,
) {
    let unfinished = match &f.outcome {
        Ok(o) if o.store_failure.is_some() => {
            let why = o.store_failure.clone().unwrap_or_default();
            if lost || why.contains("no longer this worker's") {
                tracing::info!(run_id = %f.id, "the run's lease was taken over: dropped here");
                stats.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            tracing::warn!(run_id = %f.id, error = %why, "the store failed; the run is given back to resume");
            true
        }
        Ok(_) if lost => {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Ok(o) => match o.status {
            RunStatus::Succeeded => {
                stats.succeeded.fetch_add(1, Ordering::Relaxed);
                false
            }
            RunStatus::Interrupted => {
                stats.interrupted.fetch_add(1, Ordering::Relaxed);
                // Free at once for a `resume` (its lease would otherwise run out first).
                if let Err(e) = sql.release(&options.id, &[(f.id.clone(), f.epoch)]).await {
                    tracing::warn!(run_id = %f.id, error = %e, "could not give the lease back: it runs out instead");
                }
                false
            }
            RunStatus::Running | RunStatus::Queued => true,
            _ => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                false
            }
        },
        Err(ResumeError::Store(StoreError::LeaseLost { .. })) => {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Err(e) => {
            tracing::warn!(run_id = %f.id, error = %e, "the run could not resume here; it is given back");
            true
        }
    };
    if unfinished {
        stats.released.fetch_add(1, Ordering::Relaxed);
        // Given back in the background: a store that is down would hold up the claim loop.
        if let Err(e) = sql.release(&options.id, &[(f.id.clone(), f.epoch)]).await {
            tracing::warn!(run_id = %f.id, error = %e, "could not give the lease back: it runs out instead");
        }
    }
}

/// Renews the held runs' leases and this worker's provider slots every `heartbeat` (the time
/// of the last renewal in `renewed`, which claims wait on); cancels held runs whose lease is
/// gone; stops the worker when the store was migrated by a newer switchyard.
async fn heartbeat(
    store: Arc<AnyStore>,
    options: WorkerOptions,
    held: Arc<Mutex<HashMap<String, Held>>>,
    limits: Option<Arc<WorkerLimits>>,
    fatal: Arc<Mutex<Option<WorkerError>>>,
    stop: CancellationToken,
    renewed: Arc<Mutex<Instant>>,
) {
    let AnyStore::Sql(sql) = &*store else {
        return;
    };
    let mut last_ok = Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(options.heartbeat) => {}
            _ = stop.cancelled() => return,
        }
        let snapshot: Vec<(String, i64)> = held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flat_map(|(id, h)| {
                let own = (!h.lost).then(|| (id.clone(), h.epoch));
                own.into_iter()
                    .chain(h.again.as_ref().map(|a| (id.clone(), a.0.epoch)))
            })
            .collect();
        if let Some(limits) = &limits
            && let Err(e) = limits.renew().await
        {
            tracing::warn!(worker = %options.id, error = %e, "could not renew the provider slots");
        }
        settle_expired(sql, &options.id).await;
        match sql.heartbeat(&options.id, &snapshot, options.lease).await {
            Ok(beat) => {
                last_ok = Instant::now();
                *renewed.lock().unwrap_or_else(|p| p.into_inner()) = last_ok;
                if beat.schema_version > sql::SCHEMA_VERSION {
                    *fatal.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(WorkerError::Store(StoreError::NewerSchema {
                            store: sql.name().to_string(),
                            found: beat.schema_version,
                            supported: sql::SCHEMA_VERSION,
                        }));
                    stop.cancel();
                    return;
                }
                let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
                for (id, epoch) in &snapshot {
                    if beat.kept.iter().any(|(k, e)| k == id && e == epoch) {
                        continue;
                    }
                    let Some(h) = held.get_mut(id) else { continue };
                    if h.epoch == *epoch && !h.lost {
                        tracing::warn!(run_id = %id, "the run's lease is no longer this worker's: dropping it");
                        h.lost = true;
                        h.pause.cancel();
                    } else if h.again.as_ref().is_some_and(|a| a.0.epoch == *epoch) {
                        tracing::warn!(run_id = %id, "the run's lease was taken over before it started here: dropping it");
                        h.again = None;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(worker = %options.id, error = %e, "heartbeat failed");
                if last_ok.elapsed() >= options.lease {
                    // The leases ran out: other workers may hold these runs now.
                    let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
                    for (id, h) in held.iter_mut() {
                        if !h.lost {
                            tracing::warn!(run_id = %id, "no heartbeat for a whole lease: dropping the run");
                            h.lost = true;
                            h.pause.cancel();
                        }
                    }
                }
            }
        }
    }
}

/// Questions whose expiry passed (SPEC §15): marked expired, their runs queued again in the
/// same transaction, and claimed like decided ones; no one needs to resume them. Every worker
/// does it every heartbeat (one `UPDATE` when nothing is due); two at once settle each item
/// once, the second finding it no longer waiting.
async fn settle_expired(sql: &SqlStore, worker: &str) {
    match sql.expire_questions().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(worker = %worker, expired = n, "questions expired: their runs continue"),
        Err(e) => tracing::warn!(worker = %worker, error = %e, "could not settle expired questions"),
    }
}

/// A new worker id: the host, the process and a random part.
pub fn new_worker_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    // Seeded by the process's random hash keys and the time: distinct across processes.
    let mut h = std::hash::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{}-{}-{:08x}", host_name(), std::process::id(), h.finish() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RunRecord;
    use crate::store::writers::lease_holder_process as holder_process;

    /// [`new_worker_id`]'s shape is what `lease_holder_process` reads back.
    #[test]
    fn a_holder_id_names_its_process_and_host() {
        let id = new_worker_id();
        assert_eq!(holder_process(&id), Some((std::process::id(), host_name())));
        assert_eq!(
            holder_process("resume-db-2.example-4242-0badcafe"),
            Some((4242, "db-2.example".to_string()))
        );
        assert_eq!(holder_process("w7"), None);
    }

    fn claimed(id: &str, epoch: i64) -> Claimed {
        Claimed {
            record: RunRecord {
                batch: Some("b".into()),
                item_index: Some(0),
                ..crate::store::tests::run(id, RunStatus::Running)
            },
            epoch,
            recoveries: 0,
        }
    }

    /// An execution of run `id` under `epoch` that ended refused by the fence.
    fn lease_lost(id: &str, epoch: i64) -> Finished {
        Finished {
            id: id.into(),
            epoch,
            outcome: Err(ResumeError::Store(StoreError::LeaseLost { run: id.into() })),
        }
    }

    /// A run claimed again by the worker that holds it: claimed ahead, the newer claim takes
    /// the older's place; running, it goes on under the new epoch when no one held it
    /// meanwhile, else the new claim waits for the stale execution and starts after it.
    #[tokio::test]
    async fn a_run_claimed_again_here_is_carried_on_by_one_execution() {
        let sql = SqlStore::open("sqlite::memory:").await.expect("a store");
        let held: Arc<Mutex<HashMap<String, Held>>> = Arc::default();
        let stats = Arc::new(WorkerStats::default());
        let pause = CancellationToken::new();
        let mut ready = VecDeque::new();
        let epoch_of = |id: &str| held.lock().unwrap().get(id).map(|h| h.epoch);

        take(&sql, 3, claimed("a", 1), &pause, &held, &mut ready, &stats);
        take(&sql, 3, claimed("a", 2), &pause, &held, &mut ready, &stats);
        assert_eq!(ready.len(), 1, "one claim of `a` waits to start");
        assert_eq!(ready[0].epoch, 2);
        assert_eq!((epoch_of("a"), sql.fence_epoch("a")), (Some(2), Some(2)));
        assert_eq!(stats.held.load(Ordering::Relaxed), 1);

        // Started (out of `ready`); its lease ran out and this worker's claim took it back.
        ready.clear();
        take(&sql, 3, claimed("a", 3), &pause, &held, &mut ready, &stats);
        assert!(ready.is_empty(), "the execution in flight goes on: {ready:?}");
        assert_eq!((epoch_of("a"), sql.fence_epoch("a")), (Some(3), Some(3)));
        // Its end is settled under the epoch it went on with; nothing waits after it.
        let ended = lease_lost("a", 2);
        let options = WorkerOptions {
            id: "w".into(),
            batch: None,
            concurrency: 4,
            lease: Duration::from_secs(1),
            heartbeat: Duration::from_millis(200),
            grace: Duration::from_secs(1),
            exit_when_idle: false,
            files_roots: Arc::default(),
        };
        assert!(settle(ended, &held, &sql, &options, &stats).await.is_none());
        assert_eq!((epoch_of("a"), sql.fence_epoch("a")), (None, None));
        assert_eq!(stats.held.load(Ordering::Relaxed), 0);

        // Another worker held `b` meanwhile (epoch 1 here, 3 now): the execution here is
        // stale; it is paused, and the claim starts once it has let go.
        take(&sql, 3, claimed("b", 1), &pause, &held, &mut ready, &stats);
        let b_pause = held.lock().unwrap()["b"].pause.clone();
        ready.clear();
        take(&sql, 3, claimed("b", 3), &pause, &held, &mut ready, &stats);
        assert!(ready.is_empty());
        assert!(b_pause.is_cancelled(), "the stale execution is paused");
        assert_eq!((epoch_of("b"), sql.fence_epoch("b")), (Some(1), Some(1)));
        let stale = lease_lost("b", 1);
        let next = settle(stale, &held, &sql, &options, &stats)
            .await
            .expect("the waiting claim");
        assert_eq!(next.epoch, 3);
        assert_eq!((epoch_of("b"), sql.fence_epoch("b")), (Some(3), Some(3)));
        assert!(!held.lock().unwrap()["b"].pause.is_cancelled());
        assert_eq!(stats.held.load(Ordering::Relaxed), 1);
        assert_eq!(stats.dropped.load(Ordering::Relaxed), 2);
    }
}
