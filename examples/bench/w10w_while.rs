//! W10w accumulating while: one run of `w10w_while.yaml` on `{log: []}` with context `{n: N}`:
//! a `while` loop whose `transform` body returns `{k: iteration}`, appended to `$.log` by
//! `output: {$.log: "=payload.log + [result]"}`.
//!
//! Each measurement is a fresh process (`--child w10w ITERATIONS`), so that its peak RSS is the
//! run's: the child loads the plan, notes its resident set, runs the loop on the memory store
//! (every iteration's record kept, as `switchyard run --store memory` keeps them), checks the
//! whole output list and the records, and prints the wall and the peak RSS. A warm-up at N and
//! 2N, then [`RUNS`] repetitions, each a child at N and one at 2N.
//!
//! Reported: `us_per_iter` and `peak_rss_mb` at N; `ratio_2n` (wall at 2N over wall at N) and
//! `rss_ratio_2n` (what the run added to the resident set at 2N over that at N), per
//! repetition. Targets (BENCH.md): both ratios ≤ 2.1, peak RSS ≤ 64 MB at 10,000 iterations.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use switchyard::__private::record::RunStatus;
use switchyard::__private::runtime::engine::{Engine, RunOptions};
use switchyard::__private::store::Store;
use switchyard::__private::store::memory::MemoryStore;

use crate::Options;
use crate::profile::{Profile, RUNS};
use crate::report::{Report, median};
use crate::util::{self, field, parse_fields, run_child};

pub const ID: &str = "W10w";
const FLOW: &str = "w10w_while.yaml";
const TARGET_RATIO: f64 = 2.1;
const TARGET_MB: f64 = 64.0;

/// Iterations: BENCH.md's 10,000 in the full profile, 2,000 in the quick one.
fn iterations(profile: &Profile) -> usize {
    if profile.name == "full" { 10_000 } else { 2_000 }
}

pub fn run(profile: &Profile, _opts: &Options) -> Result<Vec<Report>, String> {
    let n = iterations(profile);
    let (n_arg, n2_arg) = (n.to_string(), (2 * n).to_string());
    eprintln!(
        "W10w: accumulating while of {n} iterations (and {}), `{FLOW}`, a fresh process each; warm-up, then {RUNS} timed",
        2 * n
    );
    let one = |arg: &str| -> Result<(f64, f64, f64), String> {
        let f = parse_fields(&run_child(&["w10w", arg])?)?;
        Ok((
            field(&f, "us_per_iter")?,
            field(&f, "rss_kib")?,
            field(&f, "added_kib")?,
        ))
    };
    one(&n_arg)?;
    one(&n2_arg)?;
    let (mut per_iter, mut rss, mut ratios, mut rss_ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let (t1, r1, a1) = one(&n_arg)?;
        let (t2, _, a2) = one(&n2_arg)?;
        per_iter.push(t1);
        rss.push(r1 / 1024.0);
        // Per iteration at 2N over per iteration at N, times two: the walls' ratio.
        ratios.push(2.0 * t2 / t1);
        rss_ratios.push(a2 / a1.max(1.0));
    }
    eprintln!(
        "W10w: median {:.3} µs per iteration, peak RSS {:.1} MiB (target ≤ {TARGET_MB} MB at 10,000); 2N/N {:.3} time, {:.3} memory (linear: ≤ {TARGET_RATIO})",
        median(&per_iter),
        median(&rss),
        median(&ratios),
        median(&rss_ratios)
    );
    let what = format!(
        "one run of `{FLOW}` in a fresh process: while loop of {n} iterations each appending {{k: iteration}} to $.log, memory store keeping every record"
    );
    Ok(vec![
        Report::new(
            ID,
            "us_per_iter",
            n as u64,
            per_iter,
            format!("{what}; wall / iterations"),
        ),
        Report::new(
            ID,
            "peak_rss_mb",
            n as u64,
            rss,
            format!("{what}; the process's VmHWM; target ≤ {TARGET_MB} MB at 10,000"),
        ),
        Report::new(
            ID,
            "ratio_2n",
            n as u64,
            ratios,
            format!(
                "{what}; wall at {} iterations / wall at {n}; linear: ≤ {TARGET_RATIO}",
                2 * n
            ),
        ),
        Report::new(
            ID,
            "rss_ratio_2n",
            n as u64,
            rss_ratios,
            format!(
                "{what}; resident set the run added (VmHWM − VmRSS before it) at {} iterations / at {n}; linear: ≤ {TARGET_RATIO}",
                2 * n
            ),
        ),
    ])
}

/// `--child w10w ITERATIONS`: one checked run; prints `us_per_iter`, `rss_kib` (the peak
/// resident set) and `added_kib` (the peak over the resident set before the run).
pub fn child(args: &[String]) -> Result<(), String> {
    let [iterations] = args else {
        return Err("usage: --child w10w ITERATIONS".into());
    };
    let n: usize = iterations
        .parse()
        .map_err(|_| format!("bad iteration count `{iterations}`"))?;
    let plan = util::load_plan(FLOW)?;
    let rt = util::tokio_runtime()?;
    let engine = Engine::new(Arc::new(MemoryStore::default()));
    let before = rss_kib()?;
    let t0 = Instant::now();
    let outcome = rt.block_on(engine.run(plan, json!({"log": []}), json!({ "n": n }), RunOptions::default()));
    let secs = t0.elapsed().as_secs_f64();
    let peak = util::peak_rss_kib()?;
    if outcome.status != RunStatus::Succeeded {
        return Err(format!(
            "the run ended {}: {:?}",
            outcome.status.as_str(),
            outcome.error
        ));
    }
    let log = outcome
        .output
        .as_ref()
        .and_then(|o| o.get("log"))
        .and_then(Value::as_array);
    let right =
        log.is_some_and(|l| l.len() == n && l.iter().enumerate().all(|(k, e)| *e == json!({ "k": k })));
    if !right {
        return Err(format!(
            "expected {n} entries {{k: 0}} … {{k: {}}} in `log`",
            n.saturating_sub(1)
        ));
    }
    let steps = rt
        .block_on(engine.store.steps(&outcome.run_id))
        .map_err(|e| format!("cannot read the records: {e}"))?;
    let parts = steps.iter().filter(|s| s.iteration.is_some()).count();
    if parts != n || steps.len() != n + 1 {
        return Err(format!(
            "expected 1 step record and {n} iteration records, got {} records, {parts} of iterations",
            steps.len()
        ));
    }
    println!(
        "us_per_iter={} rss_kib={peak} added_kib={}",
        secs * 1e6 / n as f64,
        peak.saturating_sub(before)
    );
    Ok(())
}

/// This process's resident set now (`VmRSS`), in KiB.
fn rss_kib() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS in /proc/self/status".to_string())
}
