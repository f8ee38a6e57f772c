//! W11 workers (BENCH.md): batches submitted to PostgreSQL and run by `worker` processes of
//! the release binary on this machine.
//!
//! - `latency`: W5's flow (one 50 ms `mock` call per item), N items (`w11_items`), `submit`
//!   (untimed), then 1, 2 and 4 `worker --concurrency 64 --exit-when-idle` processes started
//!   together; the wall is from their spawn to the last one's exit. Every repetition's results
//!   are `collect`ed and checked (line k is item k, succeeded, `{i: k, result: 2k}`).
//! - `zero`: W10's one-step `transform` flow, `w11_zero_items` items, one worker at
//!   `--concurrency 64`: items per second (N / the worker's wall, spawn to exit) and the
//!   database's committed transactions per item (`pg_stat_database.xact_commit` of the
//!   database before and after the worker: the worker's claims, records, heartbeats and
//!   releases — anything else committing in that database meanwhile counts too). Every step is
//!   recorded: the schema is checked to hold one step record per item.
//!
//! Each repetition works in a fresh schema of the database at `SWITCHYARD_BENCH_DATABASE_URL`
//! (else `SWITCHYARD_TEST_DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432/test`),
//! dropped after.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::Options;
use crate::batch_bin;
use crate::profile::{Profile, RUNS};
use crate::report::{Report, median};
use crate::util;

pub const ID: &str = "W11";
const CONCURRENCY: usize = 64;
const WORKERS: [usize; 3] = [1, 2, 4];
const TARGET_RATIO_2: f64 = 0.55;
const TARGET_RATIO_4: f64 = 0.30;
const TARGET_ITEMS_S: f64 = 5000.0;
const TARGET_XACT_PER_ITEM: f64 = 0.5;

fn flow(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/bench")
        .join(name)
}

fn base_url() -> String {
    std::env::var("SWITCHYARD_BENCH_DATABASE_URL")
        .or_else(|_| std::env::var("SWITCHYARD_TEST_DATABASE_URL"))
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A fresh schema, dropped on drop.
struct Schema {
    base: String,
    name: String,
    rt: tokio::runtime::Runtime,
}

impl Schema {
    fn new(tag: &str) -> Result<Schema, String> {
        let rt = util::tokio_runtime()?;
        let name = format!("bench_w11_{tag}_{}", std::process::id());
        let s = Schema {
            base: base_url(),
            name,
            rt,
        };
        s.exec(&format!(
            "DROP SCHEMA IF EXISTS \"{0}\" CASCADE; CREATE SCHEMA \"{0}\"",
            s.name
        ))?;
        Ok(s)
    }

    fn url(&self) -> String {
        let sep = if self.base.contains('?') { '&' } else { '?' };
        format!("{}{sep}schema={}", self.base, self.name)
    }

    fn exec(&self, sql: &str) -> Result<(), String> {
        use sqlx::Connection as _;
        self.rt.block_on(async {
            sqlx::any::install_default_drivers();
            let mut c = sqlx::AnyConnection::connect(&self.base)
                .await
                .map_err(|e| format!("W11 needs PostgreSQL at {}: {e}", self.base))?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
                .execute(&mut c)
                .await
                .map_err(|e| format!("{sql}: {e}"))?;
            let _ = c.close().await;
            Ok(())
        })
    }

    fn number(&self, sql: &str) -> Result<i64, String> {
        use sqlx::Connection as _;
        self.rt.block_on(async {
            let mut c = sqlx::AnyConnection::connect(&self.base)
                .await
                .map_err(|e| e.to_string())?;
            let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
                .fetch_one(&mut c)
                .await
                .map_err(|e| format!("{sql}: {e}"))?;
            let _ = c.close().await;
            Ok(n)
        })
    }

    /// Committed transactions of the database so far.
    fn commits(&self) -> Result<i64, String> {
        self.number("SELECT xact_commit::BIGINT FROM pg_stat_database WHERE datname = current_database()")
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = self.exec(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name));
    }
}

fn switchyard(bin: &Path, dir: &Path, args: &[&str], log: &Path) -> Result<(), String> {
    let file = std::fs::File::create(log).map_err(|e| e.to_string())?;
    let status = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(file)
        .status()
        .map_err(|e| format!("cannot run `{}`: {e}", bin.display()))?;
    if !status.success() {
        return Err(format!(
            "`switchyard {}` failed ({status}): {}",
            args.join(" "),
            batch_bin::log_tail(log)
        ));
    }
    Ok(())
}

/// `submit FLOW --input INPUT --batch b --id-field i` to `url`.
fn submit(bin: &Path, dir: &Path, url: &str, flow: &Path, input: &Path) -> Result<(), String> {
    let (flow, input) = (flow.display().to_string(), input.display().to_string());
    switchyard(
        bin,
        dir,
        &[
            "submit",
            &flow,
            "--input",
            &input,
            "--batch",
            "b",
            "--id-field",
            "i",
            "--store",
            url,
        ],
        &dir.join("submit.log"),
    )
}

/// `collect --batch b` from `url`, checked to be the `n` items' results.
fn collect_checked(bin: &Path, dir: &Path, url: &str, n: usize) -> Result<(), String> {
    let out = dir.join("out.jsonl");
    switchyard(
        bin,
        dir,
        &[
            "collect",
            "--batch",
            "b",
            "--output",
            &out.display().to_string(),
            "--store",
            url,
        ],
        &dir.join("collect.log"),
    )?;
    batch_bin::check_output(&out, n)
}

/// Submits `input` through `flow` as batch `b`, runs `workers` worker processes until the
/// batch is done, collects and checks the output; returns the workers' wall.
fn one(
    bin: &Path,
    dir: &Path,
    schema: &Schema,
    flow: &Path,
    input: &Path,
    n: usize,
    workers: usize,
) -> Result<f64, String> {
    let url = schema.url();
    submit(bin, dir, &url, flow, input)?;
    let concurrency = CONCURRENCY.to_string();
    let t0 = Instant::now();
    let mut children = Vec::new();
    for w in 0..workers {
        let log = std::fs::File::create(dir.join(format!("worker{w}.log"))).map_err(|e| e.to_string())?;
        let child = Command::new(bin)
            .args([
                "worker",
                "--store",
                &url,
                "--concurrency",
                &concurrency,
                "--exit-when-idle",
            ])
            .env("SWITCHYARD_BUNDLE_DIR", dir.join("bundles"))
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start a worker: {e}"))?;
        children.push(child);
    }
    for (w, mut c) in children.into_iter().enumerate() {
        let status = c.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!(
                "worker {w} failed ({status}): {}",
                batch_bin::log_tail(&dir.join(format!("worker{w}.log")))
            ));
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    collect_checked(bin, dir, &url, n)?;
    Ok(wall)
}

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let bin = util::release_binary()?;
    let generated = util::GeneratedDir::create("w11", opts.keep_generated)?;
    let dir = &generated.path;
    let mut reports = Vec::new();

    // Latency-bound: 1, 2, 4 workers.
    let n = profile.w11_items;
    let input = dir.join("latency.jsonl");
    batch_bin::write_input(&input, n)?;
    let w5 = flow("w5_batch.yaml");
    eprintln!(
        "W11 latency: `submit` {n} items of w5_batch.yaml (50 ms mock), then 1, 2 and 4 `worker --concurrency \
         {CONCURRENCY}` processes; {RUNS} timed each"
    );
    let mut walls: Vec<Vec<f64>> = Vec::new();
    for workers in WORKERS {
        let mut samples = Vec::new();
        for r in 0..RUNS {
            let schema = Schema::new(&format!("l{workers}_{r}"))?;
            samples.push(one(&bin, dir, &schema, &w5, &input, n, workers)?);
        }
        eprintln!(
            "W11 latency: {workers} worker(s): median wall {:.3} s",
            median(&samples)
        );
        walls.push(samples);
    }
    let one_w = median(&walls[0]);
    let ideal = batch_bin::ideal_s(n, CONCURRENCY);
    let ratio = |i: usize| walls[i].iter().map(|w| w / one_w).collect::<Vec<f64>>();
    eprintln!(
        "W11 latency: 2 workers {:.3}× (target ≤ {TARGET_RATIO_2}), 4 workers {:.3}× (target ≤ {TARGET_RATIO_4}) \
         of one worker's {one_w:.3} s (ideal for one: {ideal:.3} s)",
        median(&ratio(1)),
        median(&ratio(2)),
    );
    let what = format!(
        "{n} items of w5_batch.yaml (one 50 ms mock call) submitted to PostgreSQL, run by worker processes of \
         the release binary at --concurrency {CONCURRENCY} each, spawn to the last exit; results collected and checked"
    );
    let variant = |mut r: Report, v: &str| {
        r.variant = v.to_string();
        r
    };
    reports.push(variant(
        Report::new(
            ID,
            "wall_s_1_worker",
            n as u64,
            walls[0].clone(),
            format!("{what}; one worker; ideal {ideal:.3} s"),
        ),
        "latency",
    ));
    reports.push(variant(
        Report::new(
            ID,
            "ratio_2_workers",
            n as u64,
            ratio(1),
            format!("{what}; wall with 2 workers / median wall with 1; target ≤ {TARGET_RATIO_2}"),
        ),
        "latency",
    ));
    reports.push(variant(
        Report::new(
            ID,
            "ratio_4_workers",
            n as u64,
            ratio(2),
            format!("{what}; wall with 4 workers / median wall with 1; target ≤ {TARGET_RATIO_4}"),
        ),
        "latency",
    ));

    // Zero latency: one worker.
    let m = profile.w11_zero_items;
    let input = dir.join("zero.jsonl");
    batch_bin::write_input(&input, m)?;
    let w10 = flow("w10_long.yaml");
    eprintln!("W11 zero: `submit` {m} items of w10_long.yaml (one transform), one worker; {RUNS} timed");
    let (mut rate, mut xacts) = (Vec::new(), Vec::new());
    for r in 0..RUNS {
        let schema = Schema::new(&format!("z{r}"))?;
        let url = schema.url();
        submit(&bin, dir, &url, &w10, &input)?;
        let before = schema.commits()?;
        let t0 = Instant::now();
        switchyard(
            &bin,
            dir,
            &[
                "worker",
                "--store",
                &url,
                "--concurrency",
                &CONCURRENCY.to_string(),
                "--exit-when-idle",
            ],
            &dir.join("worker.log"),
        )?;
        let wall = t0.elapsed().as_secs_f64();
        let after = schema.commits()?;
        let steps = schema.number(&format!("SELECT COUNT(*) FROM \"{}\".steps", schema.name))?;
        if steps != m as i64 {
            return Err(format!("W11 zero: {steps} step records for {m} items"));
        }
        collect_checked(&bin, dir, &url, m)?;
        rate.push(m as f64 / wall);
        xacts.push((after - before) as f64 / m as f64);
    }
    eprintln!(
        "W11 zero: median {:.0} items/s (target ≥ {TARGET_ITEMS_S}), {:.3} transactions per item (target ≤ {TARGET_XACT_PER_ITEM})",
        median(&rate),
        median(&xacts)
    );
    let what = format!(
        "{m} items of w10_long.yaml (one transform step) submitted to PostgreSQL, one worker process at \
         --concurrency {CONCURRENCY}, spawn to exit; every step recorded (checked), results collected and checked"
    );
    reports.push(variant(
        Report::new(
            ID,
            "items_per_s",
            m as u64,
            rate,
            format!("{what}; N / wall; target ≥ {TARGET_ITEMS_S}"),
        ),
        "zero",
    ));
    reports.push(variant(
        Report::new(
            ID,
            "transactions_per_item",
            m as u64,
            xacts,
            format!(
                "{what}; pg_stat_database.xact_commit after − before the worker, / N; target ≤ {TARGET_XACT_PER_ITEM}"
            ),
        ),
        "zero",
    ));
    Ok(reports)
}
