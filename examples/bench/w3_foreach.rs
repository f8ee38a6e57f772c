//! W3 foreach: one run of `w3_foreach.yaml` (concurrency 1, variant `default`) and of
//! `w3_foreach_c8.yaml` (concurrency 8, variant `c8`) on `{items: [{id: k, v: k}]}` with N
//! items; a `transform` body returns `{id, v: v * 2}` per item, collected to `$.results`.
//!
//! Per variant: compiled once; warm-ups at N and 2N items checked in full (every element of
//! `results`, in item order, and one iteration record per item in the store); then [`RUNS`]
//! timed repetitions, each one run at N and one at 2N (interleaved, so that drift on a noisy
//! machine hits both alike), each on a fresh engine and memory store. The input is built before
//! the clock starts, the outcome checked after it stops.
//!
//! Reported per variant: `ms_total` and `us_per_item` at N, and `ratio_2n` — `ms_total` at 2N
//! over `ms_total` at N, per repetition: BENCH.md wants costs linear in N (≤ 2).

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

pub const ID: &str = "W3";
const TARGET_US: f64 = 3.0;

/// (variant, flow file, concurrency).
const VARIANTS: [(&str, &str, usize); 2] =
    [("default", "w3_foreach.yaml", 1), ("c8", "w3_foreach_c8.yaml", 8)];

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let n = profile.w3_items;
    let rt = util::tokio_runtime()?;
    let mut reports = Vec::new();
    for (variant, flow, concurrency) in VARIANTS {
        let plan = util::load_plan(flow)?;
        eprintln!(
            "W3 {variant}: foreach over {n} items (and {}) at concurrency {concurrency}, `{flow}`; warm-up, then {RUNS} timed",
            2 * n
        );
        for size in [n, 2 * n] {
            let (_, outcome, engine) = rt.block_on(one_run::<MemoryStore>(&plan, size));
            check(&outcome, size)?;
            rt.block_on(check_records(&engine, &outcome, size))?;
        }
        let (mut ms, mut ratios) = (Vec::with_capacity(RUNS), Vec::with_capacity(RUNS));
        for _ in 0..RUNS {
            let (t1, o1, _) = rt.block_on(one_run::<MemoryStore>(&plan, n));
            check(&o1, n)?;
            let (t2, o2, _) = rt.block_on(one_run::<MemoryStore>(&plan, 2 * n));
            check(&o2, 2 * n)?;
            ms.push(t1 * 1e3);
            ratios.push(t2 / t1);
        }
        let per_item: Vec<f64> = ms.iter().map(|m| m * 1e3 / n as f64).collect();
        if opts.breakdown || median(&per_item) > TARGET_US || median(&ratios) > 2.0 {
            scaling(&rt, &plan, n, variant)?;
        }
        eprintln!(
            "W3 {variant}: median {:.3} ms total, {:.3} µs per item (target ≤ {TARGET_US} µs); 2N/N {:.3} (linear: ≤ 2)",
            median(&ms),
            median(&per_item),
            median(&ratios)
        );
        let what = format!(
            "one run of `{flow}`: foreach over {n} items, concurrency {concurrency}, transform body, memory store"
        );
        let mut add = |metric: &'static str, samples: Vec<f64>, notes: String| {
            let mut r = Report::new(ID, metric, n as u64, samples, notes);
            r.variant = variant.to_string();
            reports.push(r);
        };
        add("ms_total", ms, format!("{what}; wall of the run"));
        add(
            "us_per_item",
            per_item,
            format!("{what}; wall / items; target ≤ {TARGET_US} µs"),
        );
        add(
            "ratio_2n",
            ratios,
            format!(
                "{what}; ms_total at {} items / ms_total at {n}, per repetition; linear in N: ≤ 2",
                2 * n
            ),
        );
    }
    Ok(reports)
}

/// `--child w3-repeat FLOW ITEMS REPEAT [discard]`: REPEAT checked runs of FLOW
/// (`w3_foreach.yaml` or `w3_foreach_c8.yaml`) on ITEMS items, for a profiler (`perf record`,
/// `valgrind`), on the memory store or (`discard`) a store that keeps nothing; prints the
/// median µs per item.
pub fn child_repeat(args: &[String]) -> Result<(), String> {
    let (flow, items, repeat, discard) = match args {
        [f, i, r] => (f, i, r, false),
        [f, i, r, d] if d == "discard" => (f, i, r, true),
        _ => return Err("usage: --child w3-repeat FLOW ITEMS REPEAT [discard]".into()),
    };
    let items: usize = items.parse().map_err(|_| format!("bad item count `{items}`"))?;
    let repeat: usize = repeat
        .parse()
        .map_err(|_| format!("bad repeat count `{repeat}`"))?;
    let plan = util::load_plan(flow)?;
    let rt = util::tokio_runtime()?;
    let mut t = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        let (secs, o) = if discard {
            let (secs, o, _) = rt.block_on(one_run::<DiscardStore>(&plan, items));
            (secs, o)
        } else {
            let (secs, o, _) = rt.block_on(one_run::<MemoryStore>(&plan, items));
            (secs, o)
        };
        check(&o, items)?;
        t.push(secs * 1e6 / items as f64);
    }
    println!("us_per_item={}", median(&t));
    Ok(())
}

/// The cost per item at N/4 … 4N (median of 3 runs each), to stderr: where linearity breaks.
fn scaling(rt: &tokio::runtime::Runtime, plan: &Arc<Plan>, n: usize, variant: &str) -> Result<(), String> {
    let mut line = format!("W3 {variant} scaling, µs per item (median of 3) [page faults per item]:");
    for size in [n / 4, n / 2, n, 2 * n, 4 * n] {
        let (mut t, mut faults) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let f0 = util::minor_faults();
            let (secs, o, _) = rt.block_on(one_run::<MemoryStore>(plan, size));
            faults.push((util::minor_faults() - f0) as f64 / size as f64);
            check(&o, size)?;
            t.push(secs * 1e6 / size as f64);
        }
        line.push_str(&format!("  {size}: {:.3} [{:.2}]", median(&t), median(&faults)));
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
    util::store_share(
        &format!("W3 {variant}"),
        "µs per item",
        median(&with),
        median(&without),
    );
    Ok(())
}

/// One run on `items` items on a fresh engine: the seconds it took, its outcome, the engine.
async fn one_run<S: Store + Default>(plan: &Arc<Plan>, items: usize) -> (f64, RunOutcome, Engine<S>) {
    let engine = Engine::new(Arc::new(S::default()));
    let list: Vec<Value> = (0..items).map(|k| json!({"id": k, "v": k})).collect();
    let input = json!({ "items": list });
    let t0 = Instant::now();
    let outcome = engine
        .run(plan.clone(), input, json!({}), RunOptions::default())
        .await;
    (t0.elapsed().as_secs_f64(), outcome, engine)
}

/// Every element of `results`, in item order; the items untouched.
fn check(o: &RunOutcome, items: usize) -> Result<(), String> {
    if o.status != RunStatus::Succeeded {
        return Err(format!("the run ended {}: {:?}", o.status.as_str(), o.error));
    }
    let out = o.output.as_ref().ok_or("the run has no output")?;
    let results = out["results"]
        .as_array()
        .ok_or("the output has no `results` array")?;
    if results.len() != items {
        return Err(format!("{} results for {items} items", results.len()));
    }
    for (k, r) in results.iter().enumerate() {
        if *r != json!({"id": k, "v": 2 * k}) {
            return Err(format!(
                "results[{k}] is {r}, expected {{\"id\": {k}, \"v\": {}}}",
                2 * k
            ));
        }
    }
    let list = out["items"].as_array().ok_or("the output lost `items`")?;
    if list.len() != items
        || list
            .iter()
            .enumerate()
            .any(|(k, it)| *it != json!({"id": k, "v": k}))
    {
        return Err("the output's `items` changed".into());
    }
    Ok(())
}

/// The store holds the step's record and one record per iteration (the warm-up checks it).
async fn check_records(engine: &Engine<MemoryStore>, o: &RunOutcome, items: usize) -> Result<(), String> {
    let steps = engine
        .store
        .steps(&o.run_id)
        .await
        .map_err(|e| format!("cannot read the records: {e}"))?;
    let iterations = steps.iter().filter(|s| s.iteration.is_some()).count();
    let step = steps.iter().filter(|s| s.iteration.is_none()).count();
    if iterations != items || step != 1 {
        return Err(format!(
            "expected 1 step record and {items} iteration records, got {step} and {iterations}"
        ));
    }
    Ok(())
}
