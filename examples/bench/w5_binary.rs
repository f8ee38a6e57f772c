//! W5 io-bound batch, variant `batch-binary` (BENCH.md): N runs of `w5_batch.yaml` (a 50 ms
//! mock call each) through the release binary as a whole process:
//! `switchyard batch w5_batch.yaml --input IN.jsonl --output OUT.jsonl --concurrency 64
//! --store memory --id-field i`, on a generated JSONL file of N lines `{"i": k}`.
//!
//! Timed from spawn to exit (start-up, flow loading, reading the input twice, the runs, writing
//! and syncing the output, exit). One checked warm-up; then [`RUNS`] repetitions, each a batch at
//! N and one at 2N (the linearity check), every output file checked: line k is item `k`,
//! succeeded, output `{i: k, result: 2k}`.
//!
//! Reported: `wall_s`, `efficiency` = (N × 0.05 s / 64) / wall, `cpu_ms_per_run` = the child's
//! CPU time (user + system, from `wait4`) / N, `ratio_2n`. On stderr also the wall of a 1-item
//! batch (start-up + one 50 ms call + exit), for reading the others, and the peak RSS (`VmHWM`) of
//! one more, untimed, batch at N.

use crate::Options;
use crate::batch_bin::{self, BatchCmd};
use crate::profile::{Profile, RUNS};
use crate::report::{Report, median};
use crate::util;

pub const ID: &str = "W5";
const VARIANT: &str = "batch-binary";
const CONCURRENCY: usize = 64;
const TARGET_EFFICIENCY: f64 = 0.97;
const TARGET_CPU_MS: f64 = 0.05;

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let n = profile.w5_runs;
    let bin = util::release_binary()?;
    let generated = util::GeneratedDir::create("w5b", opts.keep_generated)?;
    let dir = &generated.path;
    let cmd = |items: usize| -> Result<BatchCmd, String> {
        let input = dir.join(format!("in_{items}.jsonl"));
        if !input.exists() {
            batch_bin::write_input(&input, items)?;
        }
        Ok(BatchCmd {
            bin: bin.clone(),
            input,
            output: dir.join(format!("out_{items}.jsonl")),
            concurrency: CONCURRENCY,
            store: "memory".to_string(),
            cwd: dir.clone(),
            log: dir.join(format!("log_{items}.txt")),
        })
    };
    let (at_n, at_2n, at_1) = (cmd(n)?, cmd(2 * n)?, cmd(1)?);
    eprintln!(
        "W5 batch-binary: `{} batch {} --concurrency {CONCURRENCY} --store memory`, {n} items; warm-up, then {RUNS} timed (and {} for 2N)",
        bin.display(),
        batch_bin::FLOW,
        2 * n
    );
    batch_bin::run(&at_n)?;
    batch_bin::check_output(&at_n.output, n)?;
    let ideal = batch_bin::ideal_s(n, CONCURRENCY);
    let (mut wall, mut eff, mut cpu, mut ratios, mut one) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let e = batch_bin::run(&at_n)?;
        batch_bin::check_output(&at_n.output, n)?;
        let e2 = batch_bin::run(&at_2n)?;
        batch_bin::check_output(&at_2n.output, 2 * n)?;
        let e1 = batch_bin::run(&at_1)?;
        batch_bin::check_output(&at_1.output, 1)?;
        wall.push(e.wall_s);
        eff.push(ideal / e.wall_s);
        cpu.push(e.cpu_s * 1e3 / n as f64);
        ratios.push(e2.wall_s / e.wall_s);
        one.push(e1.wall_s * 1e3);
    }
    let (_, hwm) = batch_bin::run_polled(&at_n)?;
    batch_bin::check_output(&at_n.output, n)?;
    eprintln!(
        "W5 batch-binary: median wall {:.3} s (ideal {ideal:.3} s), efficiency {:.4} (target ≥ {TARGET_EFFICIENCY}), \
         {:.4} ms CPU per run (target ≤ {TARGET_CPU_MS}), 2N/N {:.3}; a 1-item batch takes {:.1} ms \
         (50 of them the mock call); peak RSS {:.1} MiB",
        median(&wall),
        median(&eff),
        median(&cpu),
        median(&ratios),
        median(&one),
        hwm as f64 / 1024.0
    );
    let what = format!(
        "{n} items `{{i: k}}` of `{}` (mock agent, latency 50 ms) through `switchyard batch --concurrency {CONCURRENCY} \
         --store memory` (release binary, whole process: spawn to exit)",
        batch_bin::FLOW
    );
    let reports = vec![
        ("wall_s", wall, format!("{what}; wall of the process")),
        (
            "efficiency",
            eff,
            format!("{what}; (N × 0.05 s / {CONCURRENCY}) / wall; target ≥ {TARGET_EFFICIENCY}"),
        ),
        (
            "cpu_ms_per_run",
            cpu,
            format!(
                "{what}; the child's CPU time (wait4 rusage, user + system, start-up included) / N; target ≤ {TARGET_CPU_MS} ms"
            ),
        ),
        (
            "ratio_2n",
            ratios,
            format!(
                "{what}; wall at {} items / wall at {n}, per repetition; linear in N: ≤ 2",
                2 * n
            ),
        ),
    ];
    Ok(reports
        .into_iter()
        .map(|(metric, samples, notes)| {
            let mut r = Report::new(ID, metric, n as u64, samples, notes);
            r.variant = VARIANT.to_string();
            r
        })
        .collect())
}
