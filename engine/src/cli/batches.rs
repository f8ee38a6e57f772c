//! `switchyard batches [NAME]` (SPEC §12): each submitted batch's counts, cost, rate and ETA,
//! and the live workers.

use super::common::StoreArg;
use crate::store::sql::SqlStore;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Counts are of items, each by its latest run (a retried item counts once). Runs a worker \
gave back unfinished (its drain at SIGTERM) count as queued, \"given back\": the next claim resumes them. The rate is of \
items finished in the last minute; the ETA is what is left at that rate. A worker is live while its \
heartbeat is within its lease on the database's clock.\n\n\
Exit status: 0 shown, 1 the store failed, 2 usage or no such batch."
)]
pub struct Args {
    /// Only this batch.
    pub name: Option<String>,
    /// One JSON object per batch (and one per live worker) instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArg,
}

pub fn run(args: Args) -> u8 {
    let store = args.store.clone();
    super::collect::shared_store(&store, "batches", move |sql| {
        Box::pin(async move { show(sql, &args).await })
    })
}

async fn show(sql: &SqlStore, args: &Args) -> u8 {
    let batches = match &args.name {
        Some(name) => match super::collect::find(sql, name).await {
            Ok(b) => vec![b],
            Err(code) => return code,
        },
        None => match sql.submitted_batches().await {
            Ok(b) => b,
            Err(e) => {
                super::stderr::error(e);
                return super::exit::FAILED;
            }
        },
    };
    let now = crate::record::now_ms();
    let mut rows = Vec::with_capacity(batches.len());
    for b in &batches {
        match sql.batch_counts(&b.name, now).await {
            Ok(c) => rows.push((b, c)),
            Err(e) => {
                super::stderr::error(e);
                return super::exit::FAILED;
            }
        }
    }
    let (workers, db_now) = match sql.live_workers().await {
        Ok(w) => w,
        Err(e) => {
            super::stderr::error(e);
            return super::exit::FAILED;
        }
    };
    let held: std::collections::HashMap<String, u64> = match sql.held_by_worker().await {
        Ok(h) => h.into_iter().collect(),
        Err(e) => {
            super::stderr::error(e);
            return super::exit::FAILED;
        }
    };
    let workers: Vec<_> = workers
        .into_iter()
        .filter(|w| match (&args.name, &w.batch) {
            (Some(n), Some(wb)) => n == wb,
            _ => true,
        })
        .collect();
    if args.json {
        for (b, c) in &rows {
            println!(
                "{}",
                serde_json::json!({
                    "batch": b.name, "flow": b.flow, "items": b.items, "submit_complete": b.complete,
                    "queued": c.queued, "given_back": c.given_back, "running": c.running, "succeeded": c.succeeded, "failed": c.failed,
                    "interrupted": c.interrupted, "cancelled": c.cancelled, "cost_usd": c.cost_usd,
                    "cost_unknown_calls": c.cost_unknown_calls, "max_cost_usd": b.max_cost_usd,
                    "per_second": c.finished_last_minute as f64 / 60.0,
                    "submitted_at": super::stderr::utc_seconds(b.submitted_at),
                })
            );
        }
        for w in &workers {
            println!(
                "{}",
                serde_json::json!({
                    "worker": w.id, "host": w.host, "pid": w.pid, "batch": w.batch,
                    "concurrency": w.concurrency, "holding": held.get(&w.id).copied().unwrap_or(0),
                    "heartbeat_ms_ago": db_now.saturating_sub(w.heartbeat_at),
                })
            );
        }
        return super::exit::OK;
    }
    if rows.is_empty() {
        println!("no submitted batches");
    }
    for (b, c) in &rows {
        let submit = if b.complete { "" } else { " (submit not finished)" };
        println!("batch {} · flow {} · {} items{submit}", b.name, b.flow, b.items);
        println!("  {}", super::collect::progress_line(b, c));
    }
    if workers.is_empty() {
        println!("no live workers");
    } else {
        println!("live workers:");
        println!(
            "  {:<36} {:<20} {:>8} {:>11} {:>8} {:>10}  batch",
            "worker", "host", "pid", "concurrency", "holding", "heartbeat"
        );
        for w in &workers {
            println!(
                "  {:<36} {:<20} {:>8} {:>11} {:>8} {:>9}s  {}",
                w.id,
                w.host,
                w.pid,
                w.concurrency,
                held.get(&w.id).copied().unwrap_or(0),
                db_now.saturating_sub(w.heartbeat_at) / 1000,
                w.batch.as_deref().unwrap_or("any"),
            );
        }
    }
    super::exit::OK
}
