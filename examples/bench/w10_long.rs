//! W10 long batch (BENCH.md): N lines `{"i": k}` through the one-step `transform` flow
//! `w10_long.yaml`, `switchyard batch --concurrency 256 --id-field i`, as a whole process, on
//! the memory store (N = `w10_memory_lines`) and on SQLite (N = `w10_sqlite_lines`, a fresh
//! database per process). Nothing waits in these runs: what is measured is the batch
//! machinery per item (reading the input twice, deciding, starting, recording, writing).
//!
//! Per store: one checked warm-up, then [`RUNS`] timed repetitions, every output checked (line
//! k is item k, succeeded, `{i: k, result: 2k}`); the SQLite warm-up's store is also read back
//! in-process (one succeeded run per item). Then untimed batches whose `VmHWM` is read every
//! millisecond (`batch_bin::run_polled_flow`): at N on both stores, and on the memory store at
//! N/2 as well, so that memory growing with the input shows as bytes per line.
//!
//! Reported, variants `memory` and `sqlite`: `items_per_s` = N / wall of the process,
//! `peak_rss_mb`; `memory` also `rss_bytes_per_line` = (peak at N − peak at N/2) / (N/2),
//! `sqlite` also `store_bytes_per_item` = the database's files after the process (`runs.db`
//! and any `-wal`) / N.

use std::path::{Path, PathBuf};

use crate::Options;
use crate::batch_bin::{self, BatchCmd};
use crate::profile::{Profile, RUNS};
use crate::report::{Report, median};
use crate::util;

pub const ID: &str = "W10";
const CONCURRENCY: usize = 256;
const FLOW: &str = "w10_long.yaml";
const TARGET_MEMORY_ITEMS_S: f64 = 50_000.0;
const TARGET_SQLITE_ITEMS_S: f64 = 10_000.0;
const TARGET_PEAK_RSS_MB: f64 = 150.0;
const TARGET_STORE_BYTES: f64 = 400.0;

fn flow() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/bench")
        .join(FLOW)
}

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let bin = util::release_binary()?;
    let generated = util::GeneratedDir::create("w10", opts.keep_generated)?;
    let dir = &generated.path;
    let flow = flow();
    let input = |items: usize| -> Result<PathBuf, String> {
        let path = dir.join(format!("in_{items}.jsonl"));
        if !path.exists() {
            batch_bin::write_input(&path, items)?;
        }
        Ok(path)
    };
    let mut reports = Vec::new();

    // The memory store.
    let n = profile.w10_memory_lines;
    let memory = |items: usize| -> Result<BatchCmd, String> {
        Ok(BatchCmd {
            bin: bin.clone(),
            input: input(items)?,
            output: dir.join(format!("out_{items}.jsonl")),
            concurrency: CONCURRENCY,
            store: "memory".to_string(),
            cwd: dir.clone(),
            log: dir.join(format!("log_{items}.txt")),
        })
    };
    let (at_n, at_half) = (memory(n)?, memory(n / 2)?);
    eprintln!(
        "W10 memory: `switchyard batch {FLOW} --concurrency {CONCURRENCY} --store memory`, {n} items; warm-up, \
         then {RUNS} timed, then peak RSS at {n} and {}",
        n / 2
    );
    batch_bin::run_flow(&at_n, &flow)?;
    batch_bin::check_output(&at_n.output, n)?;
    let mut rate = Vec::new();
    for _ in 0..RUNS {
        let e = batch_bin::run_flow(&at_n, &flow)?;
        batch_bin::check_output(&at_n.output, n)?;
        rate.push(n as f64 / e.wall_s);
    }
    let (_, hwm_n) = batch_bin::run_polled_flow(&at_n, &flow)?;
    batch_bin::check_output(&at_n.output, n)?;
    let (_, hwm_half) = batch_bin::run_polled_flow(&at_half, &flow)?;
    batch_bin::check_output(&at_half.output, n / 2)?;
    let growth = (hwm_n as f64 - hwm_half as f64) * 1024.0 / (n - n / 2) as f64;
    eprintln!(
        "W10 memory: median {:.0} items/s (target ≥ {TARGET_MEMORY_ITEMS_S}), peak RSS {:.1} MiB at {n}, \
         {:.1} MiB at {} ({growth:.1} bytes per line; target: independent of N, ≤ {TARGET_PEAK_RSS_MB} MB at 1,000,000)",
        median(&rate),
        hwm_n as f64 / 1024.0,
        hwm_half as f64 / 1024.0,
        n / 2
    );
    let what = format!(
        "{n} items `{{i: k}}` of `{FLOW}` (one transform step) through `switchyard batch --concurrency {CONCURRENCY} \
         --store memory --id-field i` (release binary, whole process: spawn to exit)"
    );
    let variant = |mut r: Report, v: &str| {
        r.variant = v.to_string();
        r
    };
    reports.push(variant(
        Report::new(
            ID,
            "items_per_s",
            n as u64,
            rate,
            format!("{what}; N / wall; target ≥ {TARGET_MEMORY_ITEMS_S}"),
        ),
        "memory",
    ));
    reports.push(variant(
        Report::new(
            ID,
            "peak_rss_mb",
            n as u64,
            vec![hwm_n as f64 / 1024.0],
            format!("{what}; VmHWM of one untimed batch, MiB; target ≤ {TARGET_PEAK_RSS_MB} at 1,000,000"),
        ),
        "memory",
    ));
    reports.push(variant(
        Report::new(
            ID,
            "rss_bytes_per_line",
            n as u64,
            vec![growth],
            format!(
                "{what}; (VmHWM at {n} − VmHWM at {}) / {} lines: memory that grows with the input; target ≈ 0",
                n / 2,
                n - n / 2
            ),
        ),
        "memory",
    ));

    // SQLite, a fresh database per process.
    let m = profile.w10_sqlite_lines;
    let input_m = input(m)?;
    let sqlite = |name: &str| batch_bin::fresh_sqlite(&bin, dir, &input_m, name, CONCURRENCY);
    eprintln!(
        "W10 sqlite: `switchyard batch {FLOW} --concurrency {CONCURRENCY} --store sqlite:DIR/runs.db` (a fresh DIR \
         per process), {m} items; warm-up, then {RUNS} timed, then peak RSS"
    );
    let (warm, url) = sqlite("warm-up")?;
    batch_bin::run_flow(&warm, &flow)?;
    batch_bin::check_output(&warm.output, m)?;
    batch_bin::check_store(&url, &warm.output, m)?;
    let (mut rate, mut bytes) = (Vec::new(), Vec::new());
    for r in 0..RUNS {
        let (cmd, _) = sqlite(&format!("rep{r}"))?;
        let e = batch_bin::run_flow(&cmd, &flow)?;
        batch_bin::check_output(&cmd.output, m)?;
        rate.push(m as f64 / e.wall_s);
        bytes.push(store_bytes(&cmd.cwd)? as f64 / m as f64);
        if !opts.keep_generated {
            let _ = std::fs::remove_dir_all(&cmd.cwd);
        }
    }
    let (cmd, _) = sqlite("rss")?;
    let (_, hwm) = batch_bin::run_polled_flow(&cmd, &flow)?;
    batch_bin::check_output(&cmd.output, m)?;
    eprintln!(
        "W10 sqlite: median {:.0} items/s (target ≥ {TARGET_SQLITE_ITEMS_S}), {:.0} bytes of store per item \
         (target ≤ {TARGET_STORE_BYTES}), peak RSS {:.1} MiB",
        median(&rate),
        median(&bytes),
        hwm as f64 / 1024.0
    );
    let what = format!(
        "{m} items `{{i: k}}` of `{FLOW}` (one transform step) through `switchyard batch --concurrency {CONCURRENCY} \
         --store sqlite:DIR/runs.db --id-field i` (a fresh database per process, on the repository's disk; release \
         binary, whole process: spawn to exit)"
    );
    reports.push(variant(
        Report::new(
            ID,
            "items_per_s",
            m as u64,
            rate,
            format!("{what}; N / wall; target ≥ {TARGET_SQLITE_ITEMS_S}"),
        ),
        "sqlite",
    ));
    reports.push(variant(
        Report::new(
            ID,
            "peak_rss_mb",
            m as u64,
            vec![hwm as f64 / 1024.0],
            format!("{what}; VmHWM of one untimed batch, MiB; target ≤ {TARGET_PEAK_RSS_MB} at 1,000,000"),
        ),
        "sqlite",
    ));
    reports.push(variant(
        Report::new(
            ID,
            "store_bytes_per_item",
            m as u64,
            bytes,
            format!("{what}; bytes of `runs.db` (and its `-wal`, if any) after the process / N; target ≤ {TARGET_STORE_BYTES}"),
        ),
        "sqlite",
    ));
    Ok(reports)
}

/// The bytes of the SQLite database in `dir` once its process has exited: `runs.db` and the
/// write-ahead log, if one is left.
fn store_bytes(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    for name in ["runs.db", "runs.db-wal"] {
        match std::fs::metadata(dir.join(name)) {
            Ok(m) => total += m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && name != "runs.db" => {}
            Err(e) => return Err(format!("cannot read `{}`: {e}", dir.join(name).display())),
        }
    }
    Ok(total)
}
