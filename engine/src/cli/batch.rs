//! `switchyard batch FLOW --input IN.jsonl --output OUT.jsonl`: one run per line, resumable.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::common::{self, RunArgs, StoreArg};
use crate::api::{RunConfig, Switchyard};
use crate::batch::{self, BatchOptions, Progress, Summary};
use crate::runtime::engine::RunControls;
use crate::store::any::AnyStore;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Output lines, in input order: {\"id\", \"status\", \"output\", \"error\", \"run_id\", \"cost_usd\", \"duration_ms\"}.\n\
Run the same command again after a crash or Ctrl-C and it continues: finished items are not run again,\n\
unfinished runs resume from their last recorded step, and OUT.jsonl is rebuilt from the store.\n\n\
Exit status: 0 every item succeeded, 1 an item failed (or the batch stopped early), 2 invalid flow,\n\
input or usage, 3 items left interrupted, 130 stopped by Ctrl-C."
)]
pub struct Args {
    /// The flow file.
    pub flow: PathBuf,
    /// The input: one JSON value per line.
    #[arg(long)]
    pub input: PathBuf,
    /// Where output lines go (also what identifies the batch when it is run again).
    #[arg(long)]
    pub output: PathBuf,
    /// Runs in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// The field of each input object that holds its id: a name or a dotted path such as
    /// `ticket.id` (default `id`). Lines without one are identified by their line number, lines
    /// that are not JSON by `line:N`; a field named here that no line has is an error.
    #[arg(long, value_name = "FIELD")]
    pub id_field: Option<String>,
    /// The batch's budget in USD, earlier starts of it included: checked before every agent
    /// call of the items in flight (each model turn of an agent loop too), so the batch ends
    /// over it by at most the calls in flight when it was reached; an item that could not
    /// call fails with kind `limit`, and no new item starts.
    #[arg(long)]
    pub max_cost_usd: Option<f64>,
    /// Run the items that failed (or were cancelled) in an earlier start of this batch again,
    /// each as a new run, from the input line as it is now.
    #[arg(long)]
    pub retry_failed: bool,
    /// Call again attempts that started and never finished, even of non-idempotent steps.
    #[arg(long)]
    pub retry_in_doubt: bool,
    /// Resume runs that started from another version of the flow, or under other agent
    /// changes than this --agent-change (they go on under this one; without --agent-change,
    /// under those they started with).
    #[arg(long)]
    pub allow_changed: bool,
    /// Write each item's files under DIR/<id>/ (the id made a safe directory name; ids that
    /// become the same name are suffixed `-2`, `-3` in input order). Run again, the batch
    /// writes them again: a file already there with the same bytes is left as it is.
    #[arg(long, value_name = "DIR")]
    pub files: Option<PathBuf>,
    /// Seconds between progress lines when stderr is not a terminal (with
    /// `--log-format json`: JSON lines, and the summary is one too).
    #[arg(long, default_value_t = 10)]
    pub progress_every: u64,
    /// The `now` of every item's run (RFC 3339: `2026-03-01T09:00:00Z`), recorded with it;
    /// default the time each item starts. Items resumed from an earlier start keep theirs.
    #[arg(long, value_name = "TIMESTAMP", value_parser = common::parse_now)]
    pub now: Option<crate::expr::time::Timestamp>,
    #[command(flatten)]
    pub common: RunArgs,
    #[command(flatten)]
    pub store: StoreArg,
}

pub fn run(args: Args) -> u8 {
    if args.concurrency == 0 {
        super::stderr::error("--concurrency must be at least 1");
        return super::exit::USAGE;
    }
    if let Some(max) = args.max_cost_usd
        && !(max.is_finite() && max >= 0.0)
    {
        super::stderr::error(format!(
            "--max-cost-usd {max}: a budget is a number of USD, 0 or more"
        ));
        return super::exit::USAGE;
    }
    if let Some(field) = &args.id_field
        && field.split('.').any(str::is_empty)
    {
        eprintln!("error: --id-field `{field}`: a field name, or names joined by dots (`ticket.id`)");
        return super::exit::USAGE;
    }
    let Some(mut flow) = super::graph::load_flow(&args.flow, args.common.root.clone()) else {
        return super::exit::USAGE;
    };
    args.common.narrow_limits(&mut flow);
    let (context, run_options) = match args.common.options(flow.plan()) {
        Ok((context, mut run_options)) => {
            run_options.now = args.now;
            (context, run_options)
        }
        Err(e) => {
            super::stderr::error(e);
            return super::exit::USAGE;
        }
    };
    if let Some(dir) = &args.files
        && let Err(e) = crate::files::out::prepare_dir(dir)
    {
        super::stderr::error(format!("--files: {e}"));
        return super::exit::USAGE;
    }
    let rt = common::runtime();
    let Some(store) = open_store(&rt, &args.store) else {
        return args.store.open_failed();
    };
    let options = BatchOptions {
        input: args.input.clone(),
        output: args.output.clone(),
        concurrency: args.concurrency,
        id_field: args.id_field.clone().unwrap_or_else(|| "id".to_string()),
        id_field_given: args.id_field.is_some(),
        max_cost_usd: args.max_cost_usd,
        files_dir: args.files.clone(),
        retry_failed: args.retry_failed,
        retry_in_doubt: args.retry_in_doubt,
        allow_changed: args.allow_changed,
        fresh_store: !store.is_durable(),
        sync_output: store.is_durable(),
        export_only: false,
    };
    // Questions whose expiry passed are settled before the batch reads its items' runs.
    settle_expired(&rt, &store, &args);
    let progress = Arc::new(Progress::default());
    let controls = RunControls::default();
    let switchyard = Switchyard::with_store(store.clone());
    let summary = rt.block_on(async {
        // Ctrl-C: stop starting items, let in-flight steps reach a recorded point. Again: now.
        let pause = controls.pause.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                super::stderr::say(
                    super::stderr::Level::Warn,
                    "stopping",
                    "\nstopping: no new items; in-flight steps finish and are recorded (Ctrl-C again to quit now)",
                    serde_json::Value::Null,
                );
                pause.cancel();
                if tokio::signal::ctrl_c().await.is_ok() {
                    super::stderr::say(
                        super::stderr::Level::Warn,
                        "quit",
                        "quit: run the same command again to continue",
                        serde_json::Value::Null,
                    );
                    // exit skips destructors: the MCP servers are ended here, commands' directories removed.
                    crate::agents::mcp::shutdown();
                    crate::agents::command::remove_live_dirs();
                    std::process::exit(130);
                }
            }
        });
        let ticker = tokio::spawn(show_progress(progress.clone(), args.progress_every));
        // On a worker thread, not this one: items' completions then wake the batch without
        // a thread switch whenever that worker is busy anyway.
        let config = RunConfig {
            context: Some(context),
            options: run_options,
            controls: controls.clone(),
        };
        let progress = progress.clone();
        let driver =
            tokio::spawn(async move { switchyard.batch(&flow, options, config, progress).await });
        let out = match driver.await {
            Ok(out) => out,
            Err(e) => Err(crate::api::Error::Batch(batch::BatchError::Output {
                path: args.output.display().to_string(),
                message: format!("the batch's task failed: {e}"),
            })),
        };
        ticker.abort();
        let _ = ticker.await;
        out
    });
    settle_expired(&rt, &store, &args);
    close_store(&rt, store);
    // Everything is written and the store closed: the workers have nothing left to finish,
    // so the process need not wait for them to wind down.
    rt.shutdown_background();
    let summary = match summary {
        Ok(s) => s,
        Err(e) => {
            super::stderr::error(e);
            return super::exit::USAGE;
        }
    };
    report(&args, &summary, controls.pause.is_cancelled())
}

/// Settles the questions whose expiry passed (SPEC §15): their runs continue here, their
/// steps failing `timeout`. One indexed statement when nothing expired; a failure is told and
/// does not stop the batch.
fn settle_expired(rt: &tokio::runtime::Runtime, store: &Arc<AnyStore>, args: &Args) {
    if let Err(e) = rt.block_on(super::inbox::settle(store, args.common.root.clone())) {
        super::stderr::say(
            super::stderr::Level::Warn,
            "inbox_expiry_failed",
            &format!("could not settle expired questions: {e}"),
            serde_json::Value::Null,
        );
    }
}

/// The batch's store ([`StoreArg::open_for_batch`]), or `None` once the error is printed.
fn open_store(rt: &tokio::runtime::Runtime, store: &StoreArg) -> Option<Arc<AnyStore>> {
    match rt.block_on(store.open_for_batch()) {
        Ok(s) => Some(Arc::new(s)),
        Err(e) => {
            super::stderr::error(e);
            None
        }
    }
}

/// Waits for the store's queued writes, once the batch has let go of it.
fn close_store(rt: &tokio::runtime::Runtime, store: Arc<AnyStore>) {
    if let Ok(s) = Arc::try_unwrap(store) {
        rt.block_on(s.close());
    }
}

fn report(args: &Args, s: &Summary, paused: bool) -> u8 {
    use std::fmt::Write as _;
    let done = s.succeeded + s.failed + s.interrupted;
    // Items this start finished; the rate of none is no news.
    let fresh = done.saturating_sub(s.reused);
    let rate = if fresh > 0 {
        format!(
            " ({:.1} items/s)",
            fresh as f64 / s.elapsed.as_secs_f64().max(1e-9)
        )
    } else {
        String::new()
    };
    // One message, one write: stderr is unbuffered.
    let mut msg = String::new();
    let _ = writeln!(
        msg,
        "batch: {} items{}: {} succeeded, {} failed, {} interrupted{} in {}{}, {}{}{}",
        s.total,
        // Of all the items, not of the interrupted ones beside which it used to stand.
        if s.reused > 0 {
            format!(" ({} from an earlier start)", s.reused)
        } else {
            String::new()
        },
        s.succeeded,
        s.failed,
        s.interrupted,
        if s.unfinished > 0 {
            format!(", {} unfinished", s.unfinished)
        } else {
            String::new()
        },
        crate::model::fmt_duration(Duration::from_millis(s.elapsed.as_millis() as u64)),
        rate,
        if s.abandoned_requests > 0 { "at least " } else { "" },
        s.cost_usd,
        crate::record::fmt_unknown(s.cost_unknown_calls)
    );
    if s.abandoned_requests > 0 {
        let _ = writeln!(
            msg,
            "cost is a lower bound: {} LLM request(s) were abandoned (timed out or cancelled); the server \
             may have finished and billed them, and their tokens are unknown",
            s.abandoned_requests
        );
    }
    let _ = writeln!(msg, "output: {}", args.output.display());
    if let Some(why) = &s.stopped {
        let _ = writeln!(msg, "stopped early: {why}");
        if args.store.url == "memory" {
            let _ = writeln!(
                msg,
                "with `--store memory` nothing of this batch was kept: the same command starts it over"
            );
        } else if s.cost_limit.is_some() && s.cost_unknown_calls > 0 {
            let _ = writeln!(
                msg,
                "to continue, set `assume_tokens_per_call` on the provider whose model reports no usage, \
                 then run the same command again"
            );
        } else if let Some(max) = s.cost_limit {
            // The same command would stop again at once: the budget is the whole batch's.
            let _ = writeln!(
                msg,
                "to continue, run the same command with a higher --max-cost-usd (more than {max}; \
                 it bounds the whole batch, earlier starts included, so the same one stops again at once)"
            );
        } else {
            let _ = writeln!(msg, "to continue, run the same command again: {}", this_command());
        }
    }
    if s.interrupted > 0 && args.store.url == "memory" {
        let _ = writeln!(
            msg,
            "{} item(s) interrupted: with `--store memory` nothing of them outlives this process; \
             run the batch on a durable store (the default SQLite one) to resume them",
            s.interrupted
        );
    } else if s.interrupted > 0 {
        let store = args.store.hint();
        let _ = writeln!(
            msg,
            "{} item(s) interrupted: `switchyard runs list --status interrupted{store}` lists them; \
             `switchyard resume RUN_ID --decision JSON{store}` answers one waiting at an `interrupt` step, \
             then run the batch again (or `runs export`) to update the output. Items stopped `in_doubt` \
             (a call that may have had its effect) run again with the batch and --retry-in-doubt",
            s.interrupted
        );
    }
    if super::json_logs() {
        let summary = serde_json::json!({
            "event": "batch_summary",
            "total": s.total,
            "succeeded": s.succeeded,
            "failed": s.failed,
            "interrupted": s.interrupted,
            "unfinished": s.unfinished,
            "reused": s.reused,
            "elapsed_ms": u64::try_from(s.elapsed.as_millis()).unwrap_or(u64::MAX),
            "cost_usd": s.cost_usd,
            "cost_is_lower_bound": s.abandoned_requests > 0,
            "cost_unknown_calls": s.cost_unknown_calls,
            "abandoned_requests": s.abandoned_requests,
            "output": args.output.display().to_string(),
            "stopped": s.stopped,
            "message": msg.trim_end(),
        });
        eprintln!("{summary}");
    } else {
        eprint!("{msg}");
    }
    if s.store_failed {
        super::exit::FAILED
    } else if paused {
        130
    } else if s.failed > 0 || s.stopped.is_some() {
        super::exit::FAILED
    } else if s.interrupted > 0 {
        super::exit::INTERRUPTED
    } else {
        super::exit::OK
    }
}

/// The command line this process was started with, quoted for a POSIX shell, with the
/// password of a `--store` URL hidden: what the user types again to continue.
fn this_command() -> String {
    let mut words = Vec::new();
    let mut store_next = false;
    for (i, a) in std::env::args_os().enumerate() {
        let a = a.to_string_lossy();
        let word = if store_next {
            crate::store::sql::redact(&a)
        } else if let Some(url) = a.strip_prefix("--store=") {
            format!("--store={}", crate::store::sql::redact(url))
        } else {
            a.into_owned()
        };
        store_next = i > 0 && word == "--store";
        words.push(common::shell_word(&word));
    }
    words.join(" ")
}

/// A progress bar on a terminal; a plain line every `every` seconds otherwise.
async fn show_progress(p: Arc<Progress>, every: u64) {
    // What a progress line says, worked out once for either form.
    let snapshot = |p: &Progress, elapsed: f64| {
        let done = p.done();
        let total = p.total.load(Ordering::Relaxed);
        let fresh = done.saturating_sub(p.reused.load(Ordering::Relaxed));
        let rate = fresh as f64 / elapsed.max(1e-9);
        // Rounded up: work left never shows as `0s`.
        let eta = (rate > 0.0).then(|| (total.saturating_sub(done) as f64 / rate).ceil() as u64);
        (done, total, rate, eta)
    };
    let json = |p: &Progress, elapsed: f64| {
        let (done, total, rate, eta) = snapshot(p, elapsed);
        serde_json::json!({
            "event": "batch_progress",
            "done": done,
            "total": total,
            "failed": p.failed.load(Ordering::Relaxed),
            "interrupted": p.interrupted.load(Ordering::Relaxed),
            "in_flight": p.in_flight.load(Ordering::Relaxed),
            "items_per_s": (rate * 10.0).round() / 10.0,
            "eta_s": eta,
            "cost_usd": p.cost_usd(),
            "cost_unknown_calls": p.cost_unknown_calls.load(Ordering::Relaxed),
        })
    };
    let line = |p: &Progress, elapsed: f64| {
        let (done, total, rate, eta) = snapshot(p, elapsed);
        let eta = eta.map_or_else(
            || "?".to_string(),
            |s| crate::model::fmt_duration(Duration::from_secs(s)),
        );
        format!(
            "{done}/{total} done · {} failed · {} interrupted · {} in flight · {rate:.1}/s · ETA {eta} · {}{}",
            p.failed.load(Ordering::Relaxed),
            p.interrupted.load(Ordering::Relaxed),
            p.in_flight.load(Ordering::Relaxed),
            p.cost_usd(),
            crate::record::fmt_unknown(p.cost_unknown_calls.load(Ordering::Relaxed))
        )
    };
    let start = std::time::Instant::now();
    if super::json_logs() {
        let every = Duration::from_secs(every.max(1));
        loop {
            tokio::time::sleep(every).await;
            eprintln!("{}", json(&p, start.elapsed().as_secs_f64()));
        }
    }
    if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let _guard = scopeguard(bar.clone());
        // Drawn once the input is counted: a bar of length 0 would show as full.
        while p.total.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        loop {
            bar.set_length(p.total.load(Ordering::Relaxed));
            bar.set_position(p.done());
            bar.set_message(line(&p, start.elapsed().as_secs_f64()));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    } else {
        let every = Duration::from_secs(every.max(1));
        loop {
            tokio::time::sleep(every).await;
            eprintln!("batch: {}", line(&p, start.elapsed().as_secs_f64()));
        }
    }
}

/// Clears the bar when the ticker is dropped (aborted at the end of the batch).
fn scopeguard(bar: indicatif::ProgressBar) -> impl Drop {
    struct Clear(indicatif::ProgressBar);
    impl Drop for Clear {
        fn drop(&mut self) {
            self.0.finish_and_clear();
        }
    }
    Clear(bar)
}

/// `switchyard runs export FLOW --input IN.jsonl --output OUT.jsonl`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Writes OUT.jsonl as the batch command would, from what the store holds, and runs nothing: \
items resumed or decided since the batch ran (`switchyard resume RUN_ID`) show their new status.\n\
The output ends before the first item that has not finished; `switchyard batch` with the same\n\
arguments continues from there.\n\n\
Exit status: 0 every item exported and succeeded, 1 an item failed or is not finished, 2 usage,\n\
3 items interrupted."
)]
pub struct ExportArgs {
    /// The batch's flow file.
    pub flow: PathBuf,
    /// The batch's input.
    #[arg(long)]
    pub input: PathBuf,
    /// The batch's output: rewritten (it is what identifies the batch in the store).
    #[arg(long)]
    pub output: PathBuf,
    /// The field of each input object that holds its id, as given to the batch.
    #[arg(long, value_name = "FIELD")]
    pub id_field: Option<String>,
    /// The project root that file paths may not leave; default the flow's directory.
    #[arg(long)]
    pub root: Option<PathBuf>,
    #[command(flatten)]
    pub store: StoreArg,
}

pub fn export(args: ExportArgs) -> u8 {
    let Some(flow) = super::graph::load_flow(&args.flow, args.root.clone()) else {
        return super::exit::USAGE;
    };
    let rt = common::runtime();
    let Some(store) = open_store(&rt, &args.store) else {
        return args.store.open_failed();
    };
    let options = BatchOptions {
        concurrency: 1,
        id_field: args.id_field.clone().unwrap_or_else(|| "id".to_string()),
        id_field_given: args.id_field.is_some(),
        export_only: true,
        ..BatchOptions::new(&args.input, &args.output)
    };
    let progress = Arc::new(Progress::default());
    let summary = rt.block_on(batch::run(
        Switchyard::with_store(store.clone()).engine(),
        flow.plan().clone(),
        options,
        Default::default(),
        serde_json::Value::Null,
        progress,
        RunControls::default(),
    ));
    close_store(&rt, store);
    let s = match summary {
        Ok(s) => s,
        Err(e) => {
            super::stderr::error(e);
            return super::exit::USAGE;
        }
    };
    let mut text = format!(
        "export: {} of {} items written: {} succeeded, {} failed, {} interrupted\noutput: {}",
        s.succeeded + s.failed + s.interrupted,
        s.total,
        s.succeeded,
        s.failed,
        s.interrupted,
        args.output.display()
    );
    if let Some(why) = &s.stopped {
        text.push_str(&format!("\nnot finished: {why}"));
    }
    super::stderr::say(
        super::stderr::Level::Info,
        "export_summary",
        &text,
        serde_json::json!({
            "total": s.total,
            "succeeded": s.succeeded,
            "failed": s.failed,
            "interrupted": s.interrupted,
            "output": args.output.display().to_string(),
            "stopped": s.stopped,
        }),
    );
    if s.failed > 0 || s.stopped.is_some() {
        super::exit::FAILED
    } else if s.interrupted > 0 {
        super::exit::INTERRUPTED
    } else {
        super::exit::OK
    }
}
