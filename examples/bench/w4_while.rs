//! W4 while: one run of `w4_while.yaml` on `{i: 0}` with context `{n: N}`: a `while` loop
//! (`=payload.i < context.n`) whose `transform` body returns `i + 1`, mapped to `$.i`.
//!
//! Compiled once; warm-ups at N and 2N iterations checked in full (output `{i: N}`, N
//! iterations, one iteration record each in the store); then [`RUNS`] timed repetitions, each
//! one run at N and one at 2N (interleaved), each on a fresh engine and memory store.
//!
//! Reported: `us_per_iter` at N, and `ratio_2n` — the wall at 2N over the wall at N, per
//! repetition: BENCH.md wants costs linear in N (≤ 2).

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
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

pub const ID: &str = "W4";
const FLOW: &str = "w4_while.yaml";
const TARGET_US: f64 = 2.0;

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let n = profile.w4_iterations;
    let plan = util::load_plan(FLOW)?;
    let rt = util::tokio_runtime()?;
    eprintln!(
        "W4: while loop of {n} iterations (and {}), `{FLOW}`; warm-up, then {RUNS} timed",
        2 * n
    );
    for size in [n, 2 * n] {
        let (_, outcome, engine) = rt.block_on(one_run::<MemoryStore>(&plan, size));
        check(&outcome, size)?;
        rt.block_on(check_records(&engine, &outcome, size))?;
    }
    let (mut per_iter, mut ratios) = (Vec::with_capacity(RUNS), Vec::with_capacity(RUNS));
    for _ in 0..RUNS {
        let (t1, o1, _) = rt.block_on(one_run::<MemoryStore>(&plan, n));
        check(&o1, n)?;
        let (t2, o2, _) = rt.block_on(one_run::<MemoryStore>(&plan, 2 * n));
        check(&o2, 2 * n)?;
        per_iter.push(t1 * 1e6 / n as f64);
        ratios.push(t2 / t1);
    }
    if opts.breakdown || median(&per_iter) > TARGET_US || median(&ratios) > 2.0 {
        scaling(&rt, &plan, n)?;
    }
    eprintln!(
        "W4: median {:.3} µs per iteration (target ≤ {TARGET_US} µs); 2N/N {:.3} (linear: ≤ 2)",
        median(&per_iter),
        median(&ratios)
    );
    let what = format!("one run of `{FLOW}`: while loop of {n} iterations, transform body, memory store");
    Ok(vec![
        Report::new(
            ID,
            "us_per_iter",
            n as u64,
            per_iter,
            format!("{what}; wall / iterations; target ≤ {TARGET_US} µs"),
        ),
        Report::new(
            ID,
            "ratio_2n",
            n as u64,
            ratios,
            format!(
                "{what}; wall at {} iterations / wall at {n}, per repetition; linear in N: ≤ 2",
                2 * n
            ),
        ),
    ])
}

/// `--child w4-repeat ITERATIONS REPEAT`: REPEAT checked runs of ITERATIONS iterations, for a
/// profiler; prints the median µs per iteration.
pub fn child_repeat(args: &[String]) -> Result<(), String> {
    let [iterations, repeat] = args else {
        return Err("usage: --child w4-repeat ITERATIONS REPEAT".into());
    };
    let n: usize = iterations
        .parse()
        .map_err(|_| format!("bad iteration count `{iterations}`"))?;
    let repeat: usize = repeat
        .parse()
        .map_err(|_| format!("bad repeat count `{repeat}`"))?;
    let plan = util::load_plan(FLOW)?;
    let rt = util::tokio_runtime()?;
    let mut t = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        let (secs, o, _) = rt.block_on(one_run::<MemoryStore>(&plan, n));
        check(&o, n)?;
        t.push(secs * 1e6 / n as f64);
    }
    println!("us_per_iter={}", median(&t));
    Ok(())
}

/// The cost per iteration at N/4 … 4N (median of 3 runs each; at most `max_iterations`), to
/// stderr: where linearity breaks.
fn scaling(rt: &tokio::runtime::Runtime, plan: &Arc<Plan>, n: usize) -> Result<(), String> {
    let mut line = "W4 scaling, µs per iteration (median of 3):".to_string();
    for size in [n / 4, n / 2, n, 2 * n, 4 * n]
        .into_iter()
        .filter(|&s| s <= 100_000)
    {
        let mut t = Vec::new();
        for _ in 0..3 {
            let (secs, o, _) = rt.block_on(one_run::<MemoryStore>(plan, size));
            check(&o, size)?;
            t.push(secs * 1e6 / size as f64);
        }
        line.push_str(&format!("  {size}: {:.3}", median(&t)));
    }
    eprintln!("{line}");
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let (secs, o, _) = rt.block_on(one_run::<MemoryStore>(plan, n));
        check(&o, n)?;
        with.push(secs * 1e6 / n as f64);
        let (secs, o, _) = rt.block_on(one_run::<DiscardStore>(plan, n));
        check(&o, n)?;
        without.push(secs * 1e6 / n as f64);
    }
    util::store_share("W4", "µs per iteration", median(&with), median(&without));
    Ok(())
}

/// One run of `iterations` iterations on a fresh engine: seconds, outcome, the engine.
async fn one_run<S: Store + Default>(plan: &Arc<Plan>, iterations: usize) -> (f64, RunOutcome, Engine<S>) {
    let engine = Engine::new(Arc::new(S::default()));
    let input = json!({"i": 0});
    let context = json!({ "n": iterations });
    let t0 = Instant::now();
    let outcome = engine
        .run(plan.clone(), input, context, RunOptions::default())
        .await;
    (t0.elapsed().as_secs_f64(), outcome, engine)
}

fn check(o: &RunOutcome, iterations: usize) -> Result<(), String> {
    if o.status != RunStatus::Succeeded {
        return Err(format!("the run ended {}: {:?}", o.status.as_str(), o.error));
    }
    if o.output != Some(json!({ "i": iterations })) {
        return Err(format!(
            "expected output {{\"i\": {iterations}}}, got {:?}",
            o.output
        ));
    }
    Ok(())
}

/// The store holds the step's record, with its iteration count, and one record per iteration.
async fn check_records(
    engine: &Engine<MemoryStore>,
    o: &RunOutcome,
    iterations: usize,
) -> Result<(), String> {
    let steps = engine
        .store
        .steps(&o.run_id)
        .await
        .map_err(|e| format!("cannot read the records: {e}"))?;
    let parts = steps.iter().filter(|s| s.iteration.is_some()).count();
    let step: Vec<_> = steps.iter().filter(|s| s.iteration.is_none()).collect();
    if parts != iterations || step.len() != 1 || step[0].iterations != Some(iterations as u64) {
        return Err(format!(
            "expected 1 step record of {iterations} iterations and {iterations} iteration records, got {} and {parts}",
            step.len()
        ));
    }
    Ok(())
}
