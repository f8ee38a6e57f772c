//! W2 branch: `w2_branch.yaml` (`classify` sets `score = i % 100`, a conditional edge to `high`
//! when `score >= 50` else `low`, both to `join`) run R times in a row, run k on `{i: k}`.
//!
//! Same protocol as W1: compiled once, a warm-up of R runs checked in full, then [`RUNS`] timed
//! repetitions of R runs on a fresh engine and memory store each. Every run of every repetition
//! is checked after the clock stops: its output is exactly `{i, score, tier, joined: true}` and
//! its path `classify → high|low → join`.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use switchyard::__private::plan::Plan;
use switchyard::__private::record::RunStatus;
use switchyard::__private::runtime::engine::{Engine, RunOptions, RunOutcome};
use switchyard::__private::store::Store;
use switchyard::__private::store::memory::MemoryStore;

use crate::Options;
use crate::discard::DiscardStore;
use crate::profile::{Profile, RUNS};
use crate::report::{Report, median};
use crate::util;

pub const ID: &str = "W2";
const FLOW: &str = "w2_branch.yaml";
const TARGET_US: f64 = 10.0;

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let runs = profile.w2_runs;
    let plan = util::load_plan(FLOW)?;
    let rt = util::tokio_runtime()?;
    eprintln!("W2: {runs} runs of the branching flow `{FLOW}`; warm-up, then {RUNS} timed");

    let (_, outcomes) = rt.block_on(batch::<MemoryStore>(&plan, runs));
    check(&outcomes)?;
    let mut samples = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let (secs, outcomes) = rt.block_on(batch::<MemoryStore>(&plan, runs));
        check(&outcomes)?;
        samples.push(secs * 1e6 / runs as f64);
    }
    let v = median(&samples);
    eprintln!("W2: median {v:.3} µs per run (target ≤ {TARGET_US} µs)");
    if opts.breakdown || v > TARGET_US {
        let mut bare = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let (secs, outcomes) = rt.block_on(batch::<DiscardStore>(&plan, runs));
            check(&outcomes)?;
            bare.push(secs * 1e6 / runs as f64);
        }
        util::store_share("W2", "µs per run", v, median(&bare));
    }
    // The same with every span exported over OTLP/HTTP to a collector on loopback.
    let (url, _sink) = sink()?;
    let exporter = switchyard::__private::otel::Exporter::start(&url)?;
    let observer: Arc<dyn switchyard::__private::runtime::observe::Observer> = exporter.clone();
    // Each traced repetition beside a plain one, so that the machine's noise falls on both,
    // in alternating order (plain first, then traced first): whichever of two back-to-back
    // repetitions comes second is slower by itself (the allocator tidies up what the first
    // left), by 10-20% here, which a fixed order would count as the exporter's.
    let mut traced = Vec::with_capacity(RUNS);
    let mut overhead = Vec::with_capacity(RUNS);
    for rep in 0..PAIRS {
        let observed = || rt.block_on(batch_observed(&plan, runs, Some(observer.clone())));
        let plain = || rt.block_on(batch::<MemoryStore>(&plan, runs));
        let ((p, po), (t, to)) = if rep % 2 == 0 {
            let p = plain();
            (p, observed())
        } else {
            let t = observed();
            (plain(), t)
        };
        check(&po)?;
        check(&to)?;
        traced.push(t * 1e6 / runs as f64);
        overhead.push((t / p - 1.0) * 100.0);
    }
    let (exported, dropped, why) = exporter.finish(std::time::Duration::from_secs(10));
    let expected = (PAIRS * runs * 4) as u64;
    // A dropped span is work not done: the overhead would read low.
    if exported != expected {
        return Err(format!(
            "W2 otlp: {exported} spans exported and {dropped} dropped ({}), of {expected}",
            why.as_deref().unwrap_or("no reason given")
        ));
    }
    eprintln!(
        "W2 otlp: median {:.3} µs per run with spans exported, {:+.1}% (target ≤ {TARGET_OVERHEAD_PCT}%); \
         {exported} spans exported, {dropped} dropped{}",
        median(&traced),
        median(&overhead),
        why.map(|w| format!(" ({w})")).unwrap_or_default()
    );
    let mut otlp = Report::new(
        ID,
        "otlp_overhead_pct",
        runs as u64,
        overhead,
        format!(
            "the same runs with --otlp-endpoint's exporter watching the engine and posting every span \
             (run + 3 steps) to an OTLP/HTTP collector on loopback; (wall with it / wall of the plain repetition beside it - 1) × 100, \
             over {PAIRS} pairs, plain first and traced first in turn; \
             target ≤ {TARGET_OVERHEAD_PCT}%"
        ),
    );
    otlp.variant = "otlp".to_string();
    Ok(vec![
        Report::new(
            ID,
            "us_per_run",
            runs as u64,
            samples,
            format!(
                "{runs} sequential runs of a 3-step branching flow (`{FLOW}`: set, conditional edge, set, set), \
                 run k on {{i: k}}, memory store; wall / runs; target ≤ {TARGET_US} µs"
            ),
        ),
        otlp,
    ])
}

const TARGET_OVERHEAD_PCT: f64 = 5.0;
/// Pairs of repetitions (plain and traced) for the exporter's overhead: a repetition takes a
/// few ms, and a pair's ratio swings by ±10% here from one pair to the next, so the median
/// needs many (with 10, one build's median moved by up to 15 points between harness runs).
const PAIRS: usize = 50;

/// A loopback OTLP/HTTP collector that takes every request (and keeps nothing), on a runtime
/// of its own; its URL, and the runtime to keep alive.
fn sink() -> Result<(String, tokio::runtime::Runtime), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(|_: axum::body::Bytes| async { "" }),
    );
    rt.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((format!("http://{addr}"), rt))
}

/// `--child w2-repeat RUNS REPEAT [discard|otlp]`: REPEAT checked batches of RUNS runs, for
/// a profiler, on the memory store, on a store that keeps nothing (`discard`), or on the
/// memory store with every span exported to a loopback collector (`otlp`); prints the median.
pub fn child_repeat(args: &[String]) -> Result<(), String> {
    let (runs, repeat, mode) = match args {
        [r, n] => (r, n, ""),
        [r, n, m] if m == "discard" || m == "otlp" => (r, n, m.as_str()),
        _ => return Err("usage: --child w2-repeat RUNS REPEAT [discard|otlp]".into()),
    };
    let runs: usize = runs.parse().map_err(|_| format!("bad run count `{runs}`"))?;
    let repeat: usize = repeat
        .parse()
        .map_err(|_| format!("bad repeat count `{repeat}`"))?;
    let plan = util::load_plan(FLOW)?;
    let rt = util::tokio_runtime()?;
    let mut exporter = None;
    let mut _sink = None;
    if mode == "otlp" {
        let (url, rt) = sink()?;
        exporter = Some(switchyard::__private::otel::Exporter::start(&url)?);
        _sink = Some(rt);
    }
    let mut t = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        let (secs, outcomes) = match (mode, &exporter) {
            ("discard", _) => rt.block_on(batch::<DiscardStore>(&plan, runs)),
            (_, Some(e)) => {
                let observer: Arc<dyn switchyard::__private::runtime::observe::Observer> = e.clone();
                rt.block_on(batch_observed(&plan, runs, Some(observer)))
            }
            _ => rt.block_on(batch::<MemoryStore>(&plan, runs)),
        };
        check(&outcomes)?;
        t.push(secs * 1e6 / runs as f64);
    }
    if let Some(e) = exporter {
        let (exported, dropped, _) = e.finish(std::time::Duration::from_secs(10));
        eprintln!("{exported} spans exported, {dropped} dropped");
    }
    println!("us_per_run={}", median(&t));
    Ok(())
}

/// `runs` runs in a row on a fresh engine and store; the seconds they took and their outcomes.
async fn batch<S: Store + Default>(plan: &Arc<Plan>, runs: usize) -> (f64, Vec<RunOutcome>) {
    batch_with::<S>(plan, runs, None).await
}

/// [`batch`] on the memory store with `observer` watching the engine.
async fn batch_observed(
    plan: &Arc<Plan>,
    runs: usize,
    observer: Option<Arc<dyn switchyard::__private::runtime::observe::Observer>>,
) -> (f64, Vec<RunOutcome>) {
    batch_with::<MemoryStore>(plan, runs, observer).await
}

async fn batch_with<S: Store + Default>(
    plan: &Arc<Plan>,
    runs: usize,
    observer: Option<Arc<dyn switchyard::__private::runtime::observe::Observer>>,
) -> (f64, Vec<RunOutcome>) {
    let mut engine = Engine::new(Arc::new(S::default()));
    engine.observer = observer;
    let inputs: Vec<Value> = (0..runs).map(|k| json!({"i": k})).collect();
    let context = json!({});
    let options = RunOptions::default();
    let mut outcomes = Vec::with_capacity(runs);
    let t0 = Instant::now();
    for input in inputs {
        outcomes.push(
            engine
                .run(plan.clone(), input, context.clone(), options.clone())
                .await,
        );
    }
    let secs = t0.elapsed().as_secs_f64();
    drop(engine);
    (secs, outcomes)
}

fn check(outcomes: &[RunOutcome]) -> Result<(), String> {
    for (k, o) in outcomes.iter().enumerate() {
        if o.status != RunStatus::Succeeded {
            return Err(format!("run {k} ended {}: {:?}", o.status.as_str(), o.error));
        }
        let score = k % 100;
        let tier = if score >= 50 { "high" } else { "low" };
        let want = json!({"i": k, "score": score, "tier": tier, "joined": true});
        if o.output.as_ref() != Some(&want) {
            return Err(format!("run {k}: expected output {want}, got {:?}", o.output));
        }
        if o.path != ["classify", tier, "join"] {
            return Err(format!(
                "run {k}: expected path classify, {tier}, join; got {:?}",
                o.path
            ));
        }
    }
    Ok(())
}
