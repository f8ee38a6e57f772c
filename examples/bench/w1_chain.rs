//! W1 chain: `w1_chain.yaml` (20 `set` steps, each `$.n: =payload.n + 1`) run R times in a
//! row on input `{n: 0}` by the engine with the memory store.
//!
//! The flow is compiled once. A warm-up of R runs is checked in full (every run succeeded with
//! output `{n: 20}` after 20 steps), then [`RUNS`] timed repetitions of R runs, each on a fresh
//! engine and memory store made before the clock starts (and dropped after it stops): a
//! repetition is what one `switchyard batch --store memory` of R inputs would do, without the
//! JSONL. Inputs are built before the clock; outcomes are checked after it.

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

pub const ID: &str = "W1";
const FLOW: &str = "w1_chain.yaml";
const STEPS: usize = 20;
const TARGET_US: f64 = 2.0;

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let runs = profile.w1_runs;
    let plan = util::load_plan(FLOW)?;
    let rt = util::tokio_runtime()?;
    eprintln!("W1: {runs} runs of the {STEPS}-step chain `{FLOW}`; warm-up, then {RUNS} timed");

    let (_, outcomes) = rt.block_on(batch::<MemoryStore>(&plan, runs));
    check(&outcomes)?;
    let mut samples = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let (secs, outcomes) = rt.block_on(batch::<MemoryStore>(&plan, runs));
        check(&outcomes)?;
        samples.push(secs * 1e6 / (runs * STEPS) as f64);
    }
    let v = median(&samples);
    eprintln!("W1: median {v:.3} µs per step (target ≤ {TARGET_US} µs)");
    if opts.breakdown || v > TARGET_US {
        let mut bare = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let (secs, outcomes) = rt.block_on(batch::<DiscardStore>(&plan, runs));
            check(&outcomes)?;
            bare.push(secs * 1e6 / (runs * STEPS) as f64);
        }
        util::store_share("W1", "µs per step", v, median(&bare));
    }
    Ok(vec![Report::new(
        ID,
        "us_per_step",
        runs as u64,
        samples,
        format!(
            "{runs} sequential runs of a {STEPS}-step chain of set steps (`{FLOW}`), memory store; \
             wall / (runs × {STEPS}); target ≤ {TARGET_US} µs"
        ),
    )])
}

/// `--child w1-repeat RUNS REPEAT [discard]`: REPEAT checked batches of RUNS runs, for a
/// profiler, on the memory store or (`discard`) a store that keeps nothing; prints the median.
pub fn child_repeat(args: &[String]) -> Result<(), String> {
    let (runs, repeat, discard) = match args {
        [r, n] => (r, n, false),
        [r, n, d] if d == "discard" => (r, n, true),
        _ => return Err("usage: --child w1-repeat RUNS REPEAT [discard]".into()),
    };
    let runs: usize = runs.parse().map_err(|_| format!("bad run count `{runs}`"))?;
    let repeat: usize = repeat
        .parse()
        .map_err(|_| format!("bad repeat count `{repeat}`"))?;
    let plan = util::load_plan(FLOW)?;
    let rt = util::tokio_runtime()?;
    let mut t = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        let (secs, outcomes) = if discard {
            rt.block_on(batch::<DiscardStore>(&plan, runs))
        } else {
            rt.block_on(batch::<MemoryStore>(&plan, runs))
        };
        check(&outcomes)?;
        t.push(secs * 1e6 / (runs * STEPS) as f64);
    }
    println!("us_per_step={}", median(&t));
    Ok(())
}

/// `runs` runs in a row on a fresh engine and store; the seconds they took and their outcomes.
async fn batch<S: Store + Default>(plan: &Arc<Plan>, runs: usize) -> (f64, Vec<RunOutcome>) {
    let engine = Engine::new(Arc::new(S::default()));
    let inputs: Vec<Value> = (0..runs).map(|_| json!({"n": 0})).collect();
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
        if o.output != Some(json!({"n": STEPS})) || o.steps != STEPS as u64 {
            return Err(format!(
                "run {k}: expected output {{\"n\": {STEPS}}} after {STEPS} steps, got {:?} after {}",
                o.output, o.steps
            ));
        }
    }
    Ok(())
}
