//! `switchyard submit FLOW --input IN.jsonl --batch NAME --store postgres://...` (SPEC §12):
//! stores the flow's bundle, the batch and one queued run per line for `worker` processes.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::common::{self, StoreArg};
use crate::cluster::bundle::Bundle;
use crate::cluster::submit::{SubmitOptions, SubmitProgress};
use crate::store::any::AnyStore;
use crate::store::sql::queue::StoredBundle;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "The flow is stored with every file it imports or calls (by content hash), so workers \
need no flow files. Submitting the same input to the same --batch again adds nothing; a line whose id or \
content changed is refused, as `batch` refuses it. Lines that are not JSON or do not match `input.schema` \
are recorded failed at once.\n\n\
Then run `switchyard worker --store URL` on any number of machines, and `switchyard collect --batch NAME \
--output OUT.jsonl --wait` for the results.\n\n\
Exit status: 0 submitted, 1 the store failed, 2 invalid flow, input or usage."
)]
pub struct Args {
    /// The flow file.
    pub flow: PathBuf,
    /// The input: one JSON value per line.
    #[arg(long)]
    pub input: PathBuf,
    /// The batch's name in the store: what `worker --batch`, `collect --batch` and `batches` name it by.
    #[arg(long, value_name = "NAME")]
    pub batch: String,
    /// The field of each input object that holds its id: a name or a dotted path such as
    /// `ticket.id` (default `id`). Lines without one are identified by their line number.
    #[arg(long, value_name = "FIELD")]
    pub id_field: Option<String>,
    /// Caller-given context as JSON, every run's `context`.
    #[arg(long)]
    pub context: Option<String>,
    /// How many times a run may be taken over from workers that died holding it before it
    /// fails with kind `lost`.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub max_recoveries: u64,
    /// The batch's budget in USD, stored with it: workers check the batch's spend (every
    /// worker's calls) before every model call, and a run that cannot call fails with kind
    /// `limit`. Given again for a submitted batch, it replaces the stored one.
    #[arg(long, value_name = "USD")]
    pub max_cost_usd: Option<f64>,
    /// Queue a new run for each item whose latest run failed or was cancelled.
    #[arg(long)]
    pub retry_failed: bool,
    /// Accept a flow that changed since the batch was first submitted: runs claimed from now
    /// on run the new version.
    #[arg(long)]
    pub allow_changed: bool,
    /// The project root that file paths may not leave; default the flow's directory.
    #[arg(long)]
    pub root: Option<PathBuf>,
    #[command(flatten)]
    pub store: StoreArg,
}

pub fn run(args: Args) -> u8 {
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
        super::stderr::error(format!(
            "--id-field `{field}`: a field name, or names joined by dots (`ticket.id`)"
        ));
        return super::exit::USAGE;
    }
    if args.batch.trim().is_empty() {
        super::stderr::error("--batch: a batch needs a name");
        return super::exit::USAGE;
    }
    let context = match &args.context {
        Some(text) => match crate::json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                super::stderr::error(format!("--context is not valid JSON: {e}"));
                return super::exit::USAGE;
            }
        },
        None => serde_json::Value::Object(Default::default()),
    };
    let Some(flow) = super::graph::load_flow(&args.flow, args.root.clone()) else {
        return super::exit::USAGE;
    };
    let (project, plan) = (flow.project(), flow.plan());
    // Workers are this binary, which registers no native agents.
    if let Err(e) = crate::agents::native::Natives::new().check(plan) {
        super::stderr::error(e);
        return super::exit::USAGE;
    }
    let bundle = match Bundle::gather(&args.flow, project, plan) {
        Ok(b) => b,
        Err(e) => {
            super::stderr::error(e);
            return super::exit::USAGE;
        }
    };
    for u in &bundle.unshipped {
        super::stderr::say(
            super::stderr::Level::Warn,
            "bundle_lacks",
            &format!(
                "warning: agent `{}`: the bundle lacks {} beside what it runs; workers will not have them. \
                 List what it needs under the agent's `bundle:` (e.g. `bundle: [tools/*.py]`)",
                u.agent,
                u.files
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            serde_json::json!({"agent": u.agent, "files": u.files}),
        );
    }
    let stored = StoredBundle {
        hash: bundle.hash.clone(),
        format: bundle.format,
        top: bundle.top.clone(),
        files: bundle.encode_files(),
    };
    let rt = common::runtime();
    let store = match rt.block_on(args.store.open()) {
        Ok(s) => s,
        Err(e) => {
            super::stderr::error(e);
            return args.store.open_failed();
        }
    };
    let AnyStore::Sql(sql) = &store else {
        super::stderr::error(
            "submit needs a store that workers share (`--store postgres://...`, or a SQLite file on this machine), \
             not `--store memory`",
        );
        return super::exit::USAGE;
    };
    let options = SubmitOptions {
        batch: args.batch.clone(),
        input: args.input.clone(),
        id_field: args.id_field.clone().unwrap_or_else(|| "id".to_string()),
        id_field_given: args.id_field.is_some(),
        context,
        max_recoveries: args.max_recoveries,
        max_cost_usd: args.max_cost_usd,
        retry_failed: args.retry_failed,
        allow_changed: args.allow_changed,
    };
    let progress = Arc::new(SubmitProgress::default());
    let started = std::time::Instant::now();
    let out = rt.block_on(async {
        let ticker = tokio::spawn(show_progress(progress.clone()));
        let out = crate::cluster::submit::submit(sql, plan, stored, &options, progress.clone()).await;
        ticker.abort();
        out
    });
    rt.block_on(store.close());
    match out {
        Ok(batch) => {
            let queued = progress.queued.load(Ordering::Relaxed);
            let existing = progress.existing.load(Ordering::Relaxed);
            let failed = progress.failed.load(Ordering::Relaxed);
            let text = format!(
                "submitted batch `{}`: {} lines, {queued} runs queued, {existing} already submitted, {failed} failed at submit ({:.1}s)\n\
                 run `switchyard worker --store URL` on each machine; `switchyard collect --batch {} --output OUT.jsonl --wait` for the results",
                batch.name,
                batch.items,
                started.elapsed().as_secs_f64(),
                batch.name,
            );
            super::stderr::say(
                super::stderr::Level::Info,
                "submitted",
                &text,
                serde_json::json!({"batch": batch.name, "items": batch.items, "queued": queued, "existing": existing, "failed": failed}),
            );
            super::exit::OK
        }
        Err(crate::cluster::submit::SubmitError::Store(e)) => {
            super::stderr::error(e);
            super::exit::FAILED
        }
        Err(e) => {
            super::stderr::error(e);
            super::exit::USAGE
        }
    }
}

/// A line on stderr every 10 s while a long input is submitted.
async fn show_progress(progress: Arc<SubmitProgress>) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    tick.tick().await;
    loop {
        tick.tick().await;
        let read = progress.read.load(Ordering::Relaxed);
        let total = progress.total.load(Ordering::Relaxed);
        super::stderr::say(
            super::stderr::Level::Info,
            "progress",
            &format!("submitting: {read}/{total} lines"),
            serde_json::json!({"read": read, "total": total}),
        );
    }
}
