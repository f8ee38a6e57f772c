//! `switchyard collect --batch NAME --output OUT.jsonl [--wait] [--partial]` (SPEC §12): a
//! submitted batch's results, in input order, each line exactly once.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::Duration;

use super::common::{self, StoreArg};
use crate::cluster::collect::{self as cluster_collect, CollectError};
use crate::store::any::AnyStore;
use crate::store::sql::SqlStore;
use crate::store::sql::batches::{BatchCounts, SubmittedBatch};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Each line is written from the item's latest run, in the form `batch` writes ({\"id\", \
\"status\", \"output\" or \"error\", \"run_id\", \"cost_usd\", \"duration_ms\"}), in input order. The file is \
written beside OUT.jsonl and renamed into place when whole.\n\n\
Without --wait or --partial, a batch with items still queued or running is refused and nothing is written. \
--wait waits until every item has finished or stopped `interrupted`; --partial writes the items that have \
finished and leaves out the rest.\n\n\
Exit status: 0 every item succeeded, 1 some failed or were cancelled (or the store failed), 2 usage, \
3 some are interrupted or were left out (--partial)."
)]
pub struct Args {
    /// The batch's name, as given to `submit --batch`.
    #[arg(long, value_name = "NAME")]
    pub batch: String,
    /// Where the results go: one JSON line per input line.
    #[arg(long, value_name = "OUT.jsonl")]
    pub output: PathBuf,
    /// Wait for the items still queued or running (shows progress on stderr).
    #[arg(long)]
    pub wait: bool,
    /// Write each item's files under DIR/<id>/ (the id made a safe directory name; ids that
    /// become the same name are suffixed `-2`, `-3` in input order), streamed from the store;
    /// a file already there with the same bytes is left as it is.
    #[arg(long, value_name = "DIR")]
    pub files: Option<PathBuf>,
    /// Write what has finished and leave out the rest.
    #[arg(long, conflicts_with = "wait")]
    pub partial: bool,
    /// How often `--wait` looks (seconds).
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS", hide = true)]
    pub poll: f64,
    #[command(flatten)]
    pub store: StoreArg,
}

pub fn run(args: Args) -> u8 {
    if !(args.poll.is_finite() && args.poll > 0.0) {
        super::stderr::error("--poll: a number of seconds above 0");
        return super::exit::USAGE;
    }
    let store = args.store.clone();
    shared_store(&store, "collect", move |sql| {
        Box::pin(async move { collect(sql, &args).await })
    })
}

/// Opens the store to read, runs `f` on it when it is one that workers share, closes it; the
/// exit status.
pub(crate) fn shared_store(
    store: &StoreArg,
    command: &str,
    f: impl for<'a> FnOnce(&'a SqlStore) -> std::pin::Pin<Box<dyn Future<Output = u8> + 'a>>,
) -> u8 {
    let rt = common::runtime();
    let opened = match rt.block_on(store.open_to_read()) {
        Ok(s) => s,
        Err(e) => {
            super::stderr::error(e);
            return store.open_failed();
        }
    };
    let code = match &opened {
        AnyStore::Sql(sql) => rt.block_on(f(sql)),
        _ => {
            super::stderr::error(format!(
                "{command} reads a store that workers share (`--store postgres://...` or a SQLite file)"
            ));
            super::exit::USAGE
        }
    };
    rt.block_on(opened.close());
    code
}

async fn collect(sql: &SqlStore, args: &Args) -> u8 {
    if let Some(dir) = &args.files
        && let Err(e) = crate::files::out::prepare_dir(dir)
    {
        super::stderr::error(format!("--files: {e}"));
        return super::exit::USAGE;
    }
    let batch = match find(sql, &args.batch).await {
        Ok(b) => b,
        Err(code) => return code,
    };
    let batch = if args.wait {
        match wait(sql, batch, Duration::from_secs_f64(args.poll)).await {
            Ok(b) => b,
            Err(code) => return code,
        }
    } else {
        batch
    };
    match cluster_collect::collect(sql, &batch, &args.output, args.partial, args.files.as_deref()).await {
        Ok(c) => {
            let mut text = format!(
                "collect: {} of {} items written: {} succeeded, {} failed, {} interrupted, {} cancelled · {}{}\noutput: {}",
                c.written,
                batch.items,
                c.succeeded,
                c.failed,
                c.interrupted,
                c.cancelled,
                c.cost_usd,
                crate::record::fmt_unknown(c.cost_unknown_calls),
                args.output.display()
            );
            if c.unfinished > 0 {
                text.push_str(&format!(
                    "\nleft out: {} items not finished (--partial)",
                    c.unfinished
                ));
            }
            super::stderr::say(
                super::stderr::Level::Info,
                "collect_summary",
                &text,
                serde_json::json!({
                    "batch": batch.name, "items": batch.items, "written": c.written,
                    "succeeded": c.succeeded, "failed": c.failed, "interrupted": c.interrupted,
                    "cancelled": c.cancelled, "unfinished": c.unfinished, "cost_usd": c.cost_usd,
                    "cost_unknown_calls": c.cost_unknown_calls,
                    "output": args.output.display().to_string(),
                }),
            );
            if c.failed > 0 || c.cancelled > 0 {
                super::exit::FAILED
            } else if c.interrupted > 0 || c.unfinished > 0 {
                super::exit::INTERRUPTED
            } else {
                super::exit::OK
            }
        }
        Err(e @ CollectError::Store(_)) => {
            super::stderr::error(e);
            super::exit::FAILED
        }
        Err(e @ (CollectError::Unfinished { .. } | CollectError::Incomplete { .. })) => {
            super::stderr::error(e);
            super::exit::INTERRUPTED
        }
        Err(e @ (CollectError::Output { .. } | CollectError::Files(_))) => {
            super::stderr::error(e);
            super::exit::FAILED
        }
    }
}

/// The submitted batch `name`, or the exit status after saying why there is none.
pub(crate) async fn find(sql: &SqlStore, name: &str) -> Result<SubmittedBatch, u8> {
    match sql.submitted_batch(name).await {
        Ok(Some(b)) => Ok(b),
        Ok(None) => {
            let known = sql
                .submitted_batches()
                .await
                .map(|bs| {
                    bs.into_iter()
                        .map(|b| format!("`{}`", b.name))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            let hint = if known.is_empty() {
                "it has no submitted batches".to_string()
            } else {
                format!("its batches: {}", known.join(", "))
            };
            super::stderr::error(format!(
                "the store has no submitted batch `{name}` ({hint}); `switchyard batches` lists them"
            ));
            Err(super::exit::USAGE)
        }
        Err(e) => {
            super::stderr::error(e);
            Err(super::exit::FAILED)
        }
    }
}

/// Waits until batch `batch`'s submit is complete and none of its items is queued or running.
async fn wait(sql: &SqlStore, mut batch: SubmittedBatch, every: Duration) -> Result<SubmittedBatch, u8> {
    let terminal = std::io::stderr().is_terminal() && !super::json_logs();
    let bar = terminal.then(|| {
        let bar = indicatif::ProgressBar::new(batch.items.max(1));
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut last_line = std::time::Instant::now();
    loop {
        let counts = match sql.batch_counts(&batch.name, crate::record::now_ms()).await {
            Ok(c) => c,
            Err(e) => {
                if let Some(b) = &bar {
                    b.finish_and_clear();
                }
                super::stderr::error(e);
                return Err(super::exit::FAILED);
            }
        };
        if batch.complete && counts.unfinished() == 0 {
            if let Some(b) = &bar {
                b.finish_and_clear();
            }
            return Ok(batch);
        }
        let line = progress_line(&batch, &counts);
        match &bar {
            Some(b) => {
                b.set_length(batch.items.max(1));
                b.set_position(counts.total() - counts.unfinished());
                b.set_message(line);
            }
            None if last_line.elapsed() >= Duration::from_secs(10) => {
                last_line = std::time::Instant::now();
                super::stderr::say(
                    super::stderr::Level::Info,
                    "progress",
                    &format!("collect: waiting: {line}"),
                    serde_json::json!({"batch": batch.name, "unfinished": counts.unfinished()}),
                );
            }
            None => {}
        }
        tokio::time::sleep(every).await;
        if !batch.complete {
            match sql.submitted_batch(&batch.name).await {
                Ok(Some(b)) => batch = b,
                Ok(None) => {}
                Err(e) => {
                    super::stderr::error(e);
                    return Err(super::exit::FAILED);
                }
            }
        }
    }
}

/// `412/600 done · 3 failed · 0 interrupted · 180 queued (8 given back) · 8 running · 12.0/s ·
/// ETA 16s · $0.0123`: runs a worker gave back (its drain) wait with the queued ones.
pub(crate) fn progress_line(batch: &SubmittedBatch, c: &BatchCounts) -> String {
    let done = c.total() - c.unfinished();
    let rate = c.finished_last_minute as f64 / 60.0;
    let left = batch.items.saturating_sub(done);
    let eta = if left == 0 {
        "-".to_string()
    } else if rate > 0.0 {
        fmt_secs(left as f64 / rate)
    } else {
        "?".to_string()
    };
    format!(
        "{done}/{} done · {} failed · {} interrupted · {} queued{} · {} running · {rate:.1}/s · ETA {eta} · {}{}{}",
        batch.items,
        c.failed + c.cancelled,
        c.interrupted,
        c.queued,
        match c.given_back {
            0 => String::new(),
            n => format!(" ({n} given back)"),
        },
        c.running,
        c.cost_usd,
        crate::record::fmt_unknown(c.cost_unknown_calls),
        batch
            .max_cost_usd
            .map_or_else(String::new, |max| format!(" of --max-cost-usd {max}"))
    )
}

fn fmt_secs(s: f64) -> String {
    let s = s.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}
