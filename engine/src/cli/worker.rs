//! `switchyard worker --store postgres://...` (SPEC §12): claims and runs the queued runs of
//! submitted batches until SIGTERM (or, with `--exit-when-idle`, until there is nothing left).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::common::{self, StoreArg};
use crate::cluster::bundle::Bundle;
use crate::cluster::worker::{self, PlanLoader, WorkerError, WorkerOptions, WorkerStats};
use crate::plan::Plan;
use crate::store::sql::SqlStore;
use crate::store::sql::batches::SubmittedBatch;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Workers need no flow files: they run the flow bundle `submit` stored. Each claims \
queued runs (many per short transaction), holds a lease on each (renewed by heartbeat, timed by the \
database's clock) and records every step as a local batch does. A worker that dies loses its leases; \
another takes its runs over from their last recorded step.\n\n\
SIGTERM (or Ctrl-C): stop claiming, let held runs finish for --grace, pause the rest at their next \
recorded point and give their leases back; then exit 0.\n\n\
Exit status: 0 stopped cleanly, 1 the store failed or was upgraded by a newer switchyard, 2 a batch's \
flow cannot run with this switchyard, or usage."
)]
pub struct Args {
    /// Runs held (in flight) at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Claim only runs of this submitted batch.
    #[arg(long, value_name = "NAME")]
    pub batch: Option<String>,
    /// How long a claimed run stays this worker's without a heartbeat (`30s`, `2m`, `500ms`).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub lease: Duration,
    /// How often the leases are renewed; well under --lease (default a third of it).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub heartbeat: Option<Duration>,
    /// After SIGTERM, how long held runs may take to finish before they are paused and given back.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub grace: Duration,
    /// Exit (0) once there is nothing to claim and nothing held, instead of waiting for more.
    #[arg(long)]
    pub exit_when_idle: bool,
    /// A directory `file("path")` in the batches' mappings reads under (repeatable; a relative
    /// path is read under the first). Without one, under the project root the batch was
    /// submitted from, if this machine has it.
    #[arg(long = "files-root", value_name = "DIR")]
    pub files_roots: Vec<std::path::PathBuf>,
    /// Seconds between progress lines on stderr (0: none).
    #[arg(long, default_value_t = 10)]
    pub progress_every: u64,
    #[command(flatten)]
    pub store: StoreArg,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::model::build::parse_duration(s)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("`{s}` is not a duration (`30s`, `2m`, `500ms`)"))
}

/// `exporter`: the process's `--otlp-endpoint`, told the worker's id for the resource of its spans.
pub fn run(args: Args, exporter: Option<&crate::otel::Exporter>) -> u8 {
    if args.concurrency == 0 {
        super::stderr::error("--concurrency must be at least 1");
        return super::exit::USAGE;
    }
    let heartbeat = args
        .heartbeat
        .unwrap_or((args.lease / 3).max(Duration::from_millis(1)));
    if heartbeat >= args.lease {
        super::stderr::error(format!(
            "--heartbeat ({heartbeat:?}) must be shorter than --lease ({:?}): leases would run out between heartbeats",
            args.lease
        ));
        return super::exit::USAGE;
    }
    let rt = common::runtime();
    let store = match rt.block_on(args.store.open()) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            super::stderr::error(e);
            return args.store.open_failed();
        }
    };
    let mut files_roots = Vec::new();
    for r in &args.files_roots {
        match r.canonicalize() {
            Ok(real) if real.is_dir() => files_roots.push(real),
            Ok(_) => {
                super::stderr::error(format!("--files-root `{}` is not a directory", r.display()));
                return super::exit::USAGE;
            }
            Err(e) => {
                super::stderr::error(format!("--files-root `{}`: {e}", r.display()));
                return super::exit::USAGE;
            }
        }
    }
    let options = WorkerOptions {
        id: worker::new_worker_id(),
        batch: args.batch.clone(),
        concurrency: args.concurrency,
        lease: args.lease,
        heartbeat,
        grace: args.grace,
        exit_when_idle: args.exit_when_idle,
        files_roots: std::sync::Arc::new(files_roots),
    };
    if let Some(e) = exporter {
        e.set_worker(&options.id);
    }
    let stats = Arc::new(WorkerStats::default());
    let stop = CancellationToken::new();
    let id = options.id.clone();
    let out = rt.block_on(async {
        let on_signal = stop.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let Ok(mut term) = signal(SignalKind::terminate()) else {
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            super::stderr::say(
                super::stderr::Level::Warn,
                "draining",
                "stopping: no more claims; held runs finish within --grace, the rest are given back",
                serde_json::Value::Null,
            );
            on_signal.cancel();
        });
        let ticker = (args.progress_every > 0)
            .then(|| tokio::spawn(show_progress(id.clone(), stats.clone(), args.progress_every)));
        let out = worker::run(store.clone(), options, loader(), stop.clone(), stats.clone()).await;
        if let Some(t) = ticker {
            t.abort();
        }
        out
    });
    if let Ok(s) = Arc::try_unwrap(store) {
        rt.block_on(s.close());
    }
    rt.shutdown_background();
    let line = summary(&id, &stats);
    match out {
        Ok(()) => {
            super::stderr::say(super::stderr::Level::Info, "stopped", &line, counts(&stats));
            super::exit::OK
        }
        Err(e) => {
            super::stderr::error(&e);
            super::stderr::say(super::stderr::Level::Info, "stopped", &line, counts(&stats));
            match e {
                WorkerError::Bundle { .. } | WorkerError::NotShared => super::exit::USAGE,
                WorkerError::Store(_) => super::exit::FAILED,
            }
        }
    }
}

/// Loads a batch's plan from its stored bundle: materialized under the bundle cache, then
/// loaded and compiled as a flow file is.
pub(crate) fn loader() -> PlanLoader {
    Arc::new(
        |sql: &SqlStore, batch: &SubmittedBatch| -> worker::PlanFuture<'_> {
            let hash = batch.bundle.clone();
            let flow_hash = batch.flow_hash.clone();
            let fut = async move {
                let stored = sql
                    .get_bundle(&hash)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("the store has no flow bundle {hash}"))?;
                let bundle = Bundle::decode(&stored.hash, stored.format, &stored.top, &stored.files)
                    .map_err(|e| e.to_string())?;
                let files = bundle
                    .materialize(&crate::cluster::bundle::default_cache_dir())
                    .map_err(|e| e.to_string())?;
                let plan = compile_quiet(&files)?;
                if plan.root().hash != flow_hash {
                    return Err(format!(
                        "the flow bundle {hash} compiles to flow hash {} here, not the batch's {flow_hash}",
                        plan.root().hash
                    ));
                }
                Ok(Arc::new(plan))
            };
            Box::pin(fut) as worker::PlanFuture
        },
    )
}

/// Loads and compiles a bundle's flow as `batch` loads one from disk, its commands running in
/// the bundle's copy of the directory `submit` ran in; its diagnostics, when it does not
/// compile, as text.
fn compile_quiet(files: &crate::cluster::bundle::Materialized) -> Result<Plan, String> {
    let mut project = crate::project::Project::default();
    project.command_dir = Some(files.cwd.clone());
    let Some(id) = project.load_top(&files.top, files.root.clone(), &crate::syntax::Limits::default()) else {
        return Err(format!("`{}` is not a flow", files.top.display()));
    };
    let (plan, diags) = crate::lint::lint_and_compile(&project, id);
    plan.ok_or_else(|| {
        let opts = crate::diag::render::HumanOptions {
            color: false,
            width: 100,
        };
        format!(
            "its flow does not compile with this switchyard:\n{}",
            crate::diag::render::human(&diags, &project.sources, &opts)
        )
    })
}

fn counts(s: &WorkerStats) -> serde_json::Value {
    serde_json::json!({
        "claimed": s.claimed.load(Ordering::Relaxed),
        "succeeded": s.succeeded.load(Ordering::Relaxed),
        "failed": s.failed.load(Ordering::Relaxed),
        "interrupted": s.interrupted.load(Ordering::Relaxed),
        "dropped": s.dropped.load(Ordering::Relaxed),
        "released": s.released.load(Ordering::Relaxed),
        "held": s.held.load(Ordering::Relaxed),
    })
}

fn summary(id: &str, s: &WorkerStats) -> String {
    format!(
        "worker {id}: claimed {}, succeeded {}, failed {}, interrupted {}, dropped {} (taken over), given back {}",
        s.claimed.load(Ordering::Relaxed),
        s.succeeded.load(Ordering::Relaxed),
        s.failed.load(Ordering::Relaxed),
        s.interrupted.load(Ordering::Relaxed),
        s.dropped.load(Ordering::Relaxed),
        s.released.load(Ordering::Relaxed),
    )
}

async fn show_progress(id: String, stats: Arc<WorkerStats>, every: u64) {
    let mut tick = tokio::time::interval(Duration::from_secs(every));
    tick.tick().await;
    loop {
        tick.tick().await;
        let line = format!(
            "{} — holding {}",
            summary(&id, &stats),
            stats.held.load(Ordering::Relaxed)
        );
        super::stderr::say(super::stderr::Level::Info, "progress", &line, counts(&stats));
    }
}
