//! W5x wide batch (BENCH.md): W5 with N = 20,000 items at 2,000 in flight, through the release
//! `switchyard batch ... --concurrency 2000 --store memory`, as a whole process.
//!
//! One checked warm-up; then [`RUNS`] repetitions, each: the batch at N, timed; the batch at N
//! again and a 1-item batch with the same command line (the baseline: the process with its
//! runtime, flow and store, and nothing in flight), both untimed, their `VmHWM` read every
//! millisecond (`batch_bin::run_polled`). Every output is checked.
//!
//! Reported: `wall_s`; `efficiency` = (N × 0.05 s / 2000) / wall; `peak_rss_mb`, the child's
//! peak resident set (`VmHWM`); `kib_per_run_in_flight` = (peak RSS of the batch − peak RSS of
//! the 1-item baseline) / 2000. The memory store keeps every finished run's
//! records to the end, so that figure includes what N finished runs leave behind as well as what
//! 2,000 runs in flight hold. With `--breakdown` (or a missed target) a batch of exactly 2,000
//! items (one wave: as many in flight, few finished) tells the two apart, on stderr.

use crate::Options;
use crate::batch_bin::{self, BatchCmd};
use crate::profile::{Profile, RUNS};
use crate::report::{Report, median};
use crate::util;

pub const ID: &str = "W5x";
const TARGET_EFFICIENCY: f64 = 0.90;
const TARGET_KIB_PER_RUN: f64 = 20.0;

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let n = profile.w5x_runs;
    let c = profile.w5x_concurrency;
    let bin = util::release_binary()?;
    let generated = util::GeneratedDir::create("w5x", opts.keep_generated)?;
    let dir = &generated.path;
    let cmd = |items: usize| -> Result<BatchCmd, String> {
        let input = dir.join(format!("in_{items}.jsonl"));
        batch_bin::write_input(&input, items)?;
        Ok(BatchCmd {
            bin: bin.clone(),
            input,
            output: dir.join(format!("out_{items}.jsonl")),
            concurrency: c,
            store: "memory".to_string(),
            cwd: dir.clone(),
            log: dir.join(format!("log_{items}.txt")),
        })
    };
    let (at_n, at_1) = (cmd(n)?, cmd(1)?);
    eprintln!(
        "W5x: `switchyard batch {} --concurrency {c} --store memory`, {n} items; warm-up, then {RUNS} timed, each with a 1-item baseline",
        batch_bin::FLOW
    );
    batch_bin::run(&at_n)?;
    batch_bin::check_output(&at_n.output, n)?;
    let ideal = batch_bin::ideal_s(n, c);
    let (mut wall, mut eff, mut peak, mut per_run, mut base) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut cpu = Vec::new();
    for _ in 0..RUNS {
        let e = batch_bin::run(&at_n)?;
        batch_bin::check_output(&at_n.output, n)?;
        let (_, hwm) = batch_bin::run_polled(&at_n)?;
        batch_bin::check_output(&at_n.output, n)?;
        let (_, hwm_1) = batch_bin::run_polled(&at_1)?;
        batch_bin::check_output(&at_1.output, 1)?;
        wall.push(e.wall_s);
        eff.push(ideal / e.wall_s);
        peak.push(hwm as f64 / 1024.0);
        base.push(hwm_1 as f64 / 1024.0);
        per_run.push((hwm as f64 - hwm_1 as f64) / c as f64);
        cpu.push(e.cpu_s * 1e3 / n as f64);
    }
    let (m_eff, m_kib) = (median(&eff), median(&per_run));
    eprintln!(
        "W5x: median wall {:.3} s (ideal {ideal:.3} s), efficiency {m_eff:.4} (target ≥ {TARGET_EFFICIENCY}); \
         peak RSS {:.1} MiB, 1-item baseline {:.1} MiB: {m_kib:.2} KiB per run in flight (target ≤ {TARGET_KIB_PER_RUN}); \
         {:.4} ms CPU per run",
        median(&wall),
        median(&peak),
        median(&base),
        median(&cpu)
    );
    if opts.breakdown || m_eff < TARGET_EFFICIENCY || m_kib > TARGET_KIB_PER_RUN {
        let wave = cmd(c)?;
        let mut rss = Vec::new();
        for _ in 0..RUNS {
            let (_, hwm) = batch_bin::run_polled(&wave)?;
            batch_bin::check_output(&wave.output, c)?;
            rss.push(hwm as f64);
        }
        let (wave_kib, n_kib, base_kib) = (median(&rss), median(&peak) * 1024.0, median(&base) * 1024.0);
        eprintln!(
            "W5x breakdown: a {c}-item batch (one wave) peaks at {:.1} MiB: {:.2} KiB per run in flight with few finished; \
             the {n}-item batch adds {:.2} KiB per further finished run ({:.1} MiB over {} runs: the memory store and \
             the batch's bookkeeping)",
            wave_kib / 1024.0,
            (wave_kib - base_kib) / c as f64,
            (n_kib - wave_kib) / (n - c).max(1) as f64,
            (n_kib - wave_kib) / 1024.0,
            n - c
        );
    }
    let what = format!(
        "{n} items `{{i: k}}` of `{}` (50 ms mock) through `switchyard batch --concurrency {c} --store memory` \
         (release binary, whole process: spawn to exit)",
        batch_bin::FLOW
    );
    Ok(vec![
        Report::new(
            ID,
            "wall_s",
            n as u64,
            wall,
            format!("{what}; wall of the process"),
        ),
        Report::new(
            ID,
            "efficiency",
            n as u64,
            eff,
            format!("{what}; (N × 0.05 s / {c}) / wall; target ≥ {TARGET_EFFICIENCY}"),
        ),
        Report::new(
            ID,
            "peak_rss_mb",
            n as u64,
            peak,
            format!("{what}; the child's peak RSS (VmHWM, read every ms in an untimed run), MiB"),
        ),
        Report::new(
            ID,
            "kib_per_run_in_flight",
            n as u64,
            per_run,
            format!(
                "{what}; (peak RSS − peak RSS of the same command on 1 item) / {c}, KiB (VmHWM, read every ms in \
                 untimed runs); includes what the memory \
                 store keeps of the {n} finished runs; target ≤ {TARGET_KIB_PER_RUN}"
            ),
        ),
        Report::new(
            ID,
            "cpu_ms_per_run",
            n as u64,
            cpu,
            format!("{what}; the child's CPU time (wait4 rusage, user + system) / N"),
        ),
    ])
}
