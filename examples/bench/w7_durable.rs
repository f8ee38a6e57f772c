//! W7 durable batch (BENCH.md): W5 with the SQLite store, every step recorded and durable.
//! `switchyard batch w5_batch.yaml --concurrency 64 --store sqlite:DIR/runs.db`, with a fresh
//! DIR (a new, empty database) for every process, as a whole process.
//!
//! One checked warm-up, whose store is also read back in-process: exactly one succeeded run per
//! item. Then [`RUNS`] repetitions, each the SQLite batch and the same batch with
//! `--store memory` (W5 `batch-binary`), both outputs checked, so that the ratio is measured in
//! one run on the same machine state.
//!
//! Reported: `wall_s`, `efficiency` = (N × 0.05 s / 64) / wall, `cpu_ms_per_run` (the child's),
//! `ratio_to_w5` = wall with `--store memory` / wall with SQLite (= efficiency / W5's).

use crate::Options;
use crate::batch_bin::{self, BatchCmd};
use crate::profile::{Profile, RUNS};
use crate::report::{Report, median};
use crate::util;

pub const ID: &str = "W7";
const CONCURRENCY: usize = 64;
const TARGET_EFFICIENCY: f64 = 0.90;
const TARGET_RATIO: f64 = 0.93;

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let n = profile.w5_runs;
    let bin = util::release_binary()?;
    let generated = util::GeneratedDir::create("w7", opts.keep_generated)?;
    let dir = &generated.path;
    let input = dir.join("in.jsonl");
    batch_bin::write_input(&input, n)?;
    // A fresh folder (and database) per process: `name/runs.db`, `name/out.jsonl`.
    let sqlite = |name: &str| batch_bin::fresh_sqlite(&bin, dir, &input, name, CONCURRENCY);
    let memory = BatchCmd {
        bin: bin.clone(),
        input: input.clone(),
        output: dir.join("out_memory.jsonl"),
        concurrency: CONCURRENCY,
        store: "memory".to_string(),
        cwd: dir.clone(),
        log: dir.join("log_memory.txt"),
    };
    eprintln!(
        "W7: `switchyard batch {} --concurrency {CONCURRENCY} --store sqlite:DIR/runs.db` (a fresh DIR per process), \
         {n} items; warm-up, then {RUNS} timed, each with the same batch on `--store memory`",
        batch_bin::FLOW
    );
    let (warm, url) = sqlite("warm-up")?;
    batch_bin::run(&warm)?;
    batch_bin::check_output(&warm.output, n)?;
    batch_bin::check_store(&url, &warm.output, n)?;
    let ideal = batch_bin::ideal_s(n, CONCURRENCY);
    let (mut wall, mut eff, mut cpu, mut ratio) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut mem_eff = Vec::new();
    for r in 0..RUNS {
        let (cmd, _) = sqlite(&format!("rep{r}"))?;
        let e = batch_bin::run(&cmd)?;
        batch_bin::check_output(&cmd.output, n)?;
        let m = batch_bin::run(&memory)?;
        batch_bin::check_output(&memory.output, n)?;
        wall.push(e.wall_s);
        eff.push(ideal / e.wall_s);
        cpu.push(e.cpu_s * 1e3 / n as f64);
        ratio.push(m.wall_s / e.wall_s);
        mem_eff.push(ideal / m.wall_s);
        if !opts.keep_generated {
            let _ = std::fs::remove_dir_all(&cmd.cwd);
        }
    }
    eprintln!(
        "W7: median wall {:.3} s (ideal {ideal:.3} s), efficiency {:.4} (target ≥ {TARGET_EFFICIENCY}), \
         {:.4} ms CPU per run; with --store memory in the same repetitions: efficiency {:.4}, ratio {:.4} \
         (target ≥ {TARGET_RATIO})",
        median(&wall),
        median(&eff),
        median(&cpu),
        median(&mem_eff),
        median(&ratio)
    );
    let what = format!(
        "{n} items `{{i: k}}` of `{}` (50 ms mock) through `switchyard batch --concurrency {CONCURRENCY} \
         --store sqlite:DIR/runs.db` (a fresh database per process, on the repository's disk; release binary, \
         whole process: spawn to exit)",
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
            format!("{what}; (N × 0.05 s / {CONCURRENCY}) / wall; target ≥ {TARGET_EFFICIENCY}"),
        ),
        Report::new(
            ID,
            "cpu_ms_per_run",
            n as u64,
            cpu,
            format!("{what}; the child's CPU time (wait4 rusage, user + system) / N"),
        ),
        Report::new(
            ID,
            "ratio_to_w5",
            n as u64,
            ratio,
            format!(
                "{what}; wall of the same batch with --store memory (W5 batch-binary, run in the same repetition) / \
                 wall with SQLite; target ≥ {TARGET_RATIO}"
            ),
        ),
    ])
}
