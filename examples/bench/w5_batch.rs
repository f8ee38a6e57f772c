//! W5 io-bound batch: N runs of `w5_batch.yaml` (a `mock` agent waiting 50 ms and returning
//! `{raw: {answer: input.i * 2}}`, mapped to `$.result`), run k on `{i: k}`, at most 64 in flight.
//!
//! BENCH.md runs it through `switchyard batch --concurrency 64 --store memory`: that is variant
//! `batch-binary` (`w5_binary.rs`). This is variant `in-process`, the engine without the
//! process around it: one engine and memory store for the batch, a driver task on the multi-threaded
//! runtime the commands use, which starts one task per run after taking one of 64 semaphore
//! permits (given back when the run ends: a sliding window), and puts outputs back in input
//! order.
//!
//! Compiled once; a warm-up batch at N checked in full (every run succeeded, output k is
//! `{i: k, result: 2k}`, in input order); then [`RUNS`] timed repetitions, each a batch at N
//! and one at 2N (for the linearity check), on a fresh engine and store each.
//!
//! Reported: `wall_s`, `efficiency` = (N × 0.05 s / 64) / wall, `cpu_ms_per_run` = the process's
//! CPU time (user + system, `getrusage`) over the timed batch / N, and `ratio_2n` (wall at 2N
//! over wall at N). And, as variants, the `efficiency` of the same batch of bare 50 ms sleeps:
//! `mock-timer-floor` on the wall-clock timer the mock agent's `latency` uses, the ceiling of
//! any engine here, and `tokio-sleep-floor` on tokio's timer, which has a 1 ms resolution and
//! takes about 51 ms for a 50 ms sleep (so no engine whose agents wait on it reaches 0.98).

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use switchyard::__private::plan::Plan;
use switchyard::__private::record::RunStatus;
use switchyard::__private::runtime::engine::{Engine, RunOptions, RunOutcome};
use switchyard::__private::store::memory::MemoryStore;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::Options;
use crate::profile::{Profile, RUNS};
use crate::report::{Report, median};
use crate::util;

pub const ID: &str = "W5";
const FLOW: &str = "w5_batch.yaml";
const VARIANT: &str = "in-process";
/// The reference line: the batch's shape with bare sleeps instead of flow runs.
const FLOOR_VARIANT: &str = "tokio-sleep-floor";
/// The same with the mock agent's own timer: what this workload's engine could reach.
const TIMER_FLOOR_VARIANT: &str = "mock-timer-floor";
const CONCURRENCY: usize = 64;
const LATENCY_S: f64 = 0.05;
const TARGET_EFFICIENCY: f64 = 0.97;
const TARGET_CPU_MS: f64 = 0.05;

/// What one timed batch measured.
struct Measured {
    wall_s: f64,
    cpu_s: f64,
    outcomes: Vec<RunOutcome>,
}

pub fn run(profile: &Profile, _opts: &Options) -> Result<Vec<Report>, String> {
    let n = profile.w5_runs;
    let plan = util::load_plan(FLOW)?;
    let rt = util::tokio_runtime()?;
    eprintln!(
        "W5: {n} runs of `{FLOW}` (50 ms mock), {CONCURRENCY} in flight, in-process; warm-up, then {RUNS} timed (and {} for 2N)",
        2 * n
    );
    let ideal = |runs: usize| runs as f64 * LATENCY_S / CONCURRENCY as f64;
    check(&on_worker(&rt, batch(plan.clone(), n))?.outcomes)?;
    let (mut wall, mut eff, mut cpu, mut ratios) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut floor_eff = Vec::new();
    let mut timer_floor_eff = Vec::new();
    for _ in 0..RUNS {
        let m = on_worker(&rt, batch(plan.clone(), n))?;
        check(&m.outcomes)?;
        let m2 = on_worker(&rt, batch(plan.clone(), 2 * n))?;
        check(&m2.outcomes)?;
        wall.push(m.wall_s);
        eff.push(ideal(n) / m.wall_s);
        cpu.push(m.cpu_s * 1e3 / n as f64);
        ratios.push(m2.wall_s / m.wall_s);
        floor_eff.push(ideal(n) / on_worker(&rt, floor(n, false))?);
        timer_floor_eff.push(ideal(n) / on_worker(&rt, floor(n, true))?);
    }
    eprintln!(
        "W5: median wall {:.3} s (ideal {:.3} s), efficiency {:.4} (target ≥ {TARGET_EFFICIENCY}; \
         bare sleeps: {:.4} on the mock's timer, {:.4} on tokio's), {:.4} ms CPU per run (target ≤ {TARGET_CPU_MS}); 2N/N {:.3}",
        median(&wall),
        ideal(n),
        median(&eff),
        median(&timer_floor_eff),
        median(&floor_eff),
        median(&cpu),
        median(&ratios)
    );
    let what = format!(
        "{n} runs of `{FLOW}` (mock agent, latency 50 ms), {CONCURRENCY} in flight, in-process \
         (a driver task starting one task per run, semaphore), memory store; not the binary (see variant batch-binary)"
    );
    let reports = vec![
        ("wall_s", wall, format!("{what}; wall of the batch")),
        (
            "efficiency",
            eff,
            format!("{what}; (N × 0.05 s / {CONCURRENCY}) / wall; target ≥ {TARGET_EFFICIENCY}"),
        ),
        (
            "cpu_ms_per_run",
            cpu,
            format!(
                "{what}; process CPU time (getrusage, user + system) over the batch / N; target ≤ {TARGET_CPU_MS} ms"
            ),
        ),
        (
            "ratio_2n",
            ratios,
            format!(
                "{what}; wall at {} runs / wall at {n}, per repetition; linear in N: ≤ 2",
                2 * n
            ),
        ),
    ];
    let mut reports: Vec<Report> = reports
        .into_iter()
        .map(|(metric, samples, notes)| {
            let mut r = Report::new(ID, metric, n as u64, samples, notes);
            r.variant = VARIANT.to_string();
            r
        })
        .collect();
    let mut floor_report = Report::new(
        ID,
        "efficiency",
        n as u64,
        floor_eff,
        format!(
            "not the engine: the same batch ({n} tasks, {CONCURRENCY} in flight, driver task, semaphore) of bare \
             `tokio::time::sleep(50ms)`, the ceiling of any engine on tokio's millisecond timer; \
             (N × 0.05 s / {CONCURRENCY}) / wall"
        ),
    );
    floor_report.variant = FLOOR_VARIANT.to_string();
    reports.push(floor_report);
    let mut timer_floor = Report::new(
        ID,
        "efficiency",
        n as u64,
        timer_floor_eff,
        format!(
            "not the engine: the same batch ({n} tasks, {CONCURRENCY} in flight, driver task, semaphore) of bare \
             50 ms sleeps on the timer the mock agent's `latency` uses (`switchyard::__private::agents::timer`), the ceiling \
             of the engine on this workload; (N × 0.05 s / {CONCURRENCY}) / wall"
        ),
    );
    timer_floor.variant = TIMER_FLOOR_VARIANT.to_string();
    reports.push(timer_floor);
    Ok(reports)
}

/// The same batch without the engine: `runs` bare 50 ms tokio sleeps, at most [`CONCURRENCY`]
/// in flight, the way [`batch`] runs flows. The wall, in seconds.
async fn floor(runs: usize, mock_timer: bool) -> Result<f64, String> {
    let permits = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = JoinSet::new();
    let t0 = Instant::now();
    for _ in 0..runs {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| format!("semaphore: {e}"))?;
        tasks.spawn(async move {
            let latency = std::time::Duration::from_secs_f64(LATENCY_S);
            if mock_timer {
                switchyard::__private::agents::timer::sleep(latency).await;
            } else {
                tokio::time::sleep(latency).await;
            }
            drop(permit);
        });
        while let Some(done) = tasks.try_join_next() {
            done.map_err(|e| format!("a task failed: {e}"))?;
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| format!("a task failed: {e}"))?;
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// Runs a batch's driver as a task on the runtime's workers, as a `batch` command would: a run
/// it starts then lands on the worker's own queue, rather than waking a worker from outside.
fn on_worker<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    driver: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
) -> Result<T, String> {
    rt.block_on(async { tokio::spawn(driver).await })
        .map_err(|e| format!("the batch driver failed: {e}"))?
}

/// One batch of `runs` runs on a fresh engine and store, at most [`CONCURRENCY`] in flight.
async fn batch(plan: Arc<Plan>, runs: usize) -> Result<Measured, String> {
    let engine = Engine::new(Arc::new(MemoryStore::new()));
    let inputs: Vec<Value> = (0..runs).map(|k| json!({"i": k})).collect();
    let context = json!({});
    let options = RunOptions::default();
    let permits = Arc::new(Semaphore::new(CONCURRENCY));
    let mut slots: Vec<Option<RunOutcome>> = (0..runs).map(|_| None).collect();
    let mut tasks = JoinSet::new();

    let cpu0 = util::cpu_time();
    let t0 = Instant::now();
    for (k, input) in inputs.into_iter().enumerate() {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| format!("semaphore: {e}"))?;
        let (engine, plan, context, options) =
            (engine.clone(), plan.clone(), context.clone(), options.clone());
        tasks.spawn(async move {
            let outcome = engine.run(plan, input, context, options).await;
            drop(permit);
            (k, outcome)
        });
        // Reap what finished, so that the set does not hold every finished task to the end.
        while let Some(done) = tasks.try_join_next() {
            let (k, o) = done.map_err(|e| format!("a run task failed: {e}"))?;
            slots[k] = Some(o);
        }
    }
    while let Some(done) = tasks.join_next().await {
        let (k, o) = done.map_err(|e| format!("a run task failed: {e}"))?;
        slots[k] = Some(o);
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let cpu_s = (util::cpu_time() - cpu0).as_secs_f64();
    let outcomes = slots
        .into_iter()
        .enumerate()
        .map(|(k, o)| o.ok_or_else(|| format!("run {k} never finished")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Measured {
        wall_s,
        cpu_s,
        outcomes,
    })
}

/// Every run succeeded and output k is `{i: k, result: 2k}`.
fn check(outcomes: &[RunOutcome]) -> Result<(), String> {
    for (k, o) in outcomes.iter().enumerate() {
        if o.status != RunStatus::Succeeded {
            return Err(format!("run {k} ended {}: {:?}", o.status.as_str(), o.error));
        }
        let want = json!({"i": k, "result": 2 * k});
        if o.output.as_ref() != Some(&want) {
            return Err(format!("run {k}: expected output {want}, got {:?}", o.output));
        }
    }
    Ok(())
}
