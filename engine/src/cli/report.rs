//! `switchyard report OUT.jsonl` / `report --batch NAME` (SPEC §13): a batch's page, and a page
//! for each run it links to.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::common::{self, StoreArg, fail};
use crate::report::batch::{Item, Summary, batch_html, relative_link};
use crate::store::Store as _;
use crate::store::any::AnyStore;

/// The most run pages one report writes.
const RUN_PAGES: usize = 200;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "The page counts the batch's items by status, sums their cost, shows how long they \
took, lists the slowest and the failed ones by error kind, and the interrupted ones; each listed item links \
to its run's page (`runs show --format html`), written beside the report in a folder named after it, from \
the store. Every page is one self-contained HTML file: it opens with no network.\n\n\
switchyard report out.jsonl                 # out.report.html and out.report.runs/\n\
switchyard report --batch triage-2026-12 --store postgres://...\n\n\
Exit status: 0 written, 2 usage or an unreadable output file (naming its line)."
)]
pub struct Args {
    /// A batch's output file, as `batch` or `collect` wrote it.
    #[arg(
        value_name = "OUT.jsonl",
        required_unless_present = "batch",
        conflicts_with = "batch"
    )]
    pub results: Option<PathBuf>,
    /// A submitted batch, by the name given to `submit --batch` (read from the store).
    #[arg(long, value_name = "NAME")]
    pub batch: Option<String>,
    /// Where the page goes (default: beside OUT.jsonl as OUT.report.html; with --batch,
    /// NAME.report.html here).
    #[arg(long, short, value_name = "FILE.html")]
    pub output: Option<PathBuf>,
    /// Write the batch's page only, no run pages.
    #[arg(long)]
    pub no_run_pages: bool,
    #[command(flatten)]
    pub store: StoreArg,
}

pub fn run(args: Args) -> u8 {
    let rt = common::runtime();
    let (summary, out) = match (&args.results, &args.batch) {
        (Some(path), None) => {
            let mut summary = match read_results(path) {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            rt.block_on(flow_and_start(&args.store, &mut summary));
            let out = args.output.clone().unwrap_or_else(|| {
                let stem = path
                    .file_stem()
                    .map_or("batch".into(), |s| s.to_string_lossy().into_owned());
                path.with_file_name(format!("{stem}.report.html"))
            });
            (summary, out)
        }
        (None, Some(name)) => {
            let summary = match rt.block_on(read_submitted(&args.store, name)) {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            let safe: String = name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let out = args
                .output
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("{safe}.report.html")));
            (summary, out)
        }
        _ => return fail("give a batch's OUT.jsonl or --batch NAME"),
    };
    let stem = out
        .file_stem()
        .map_or("report".into(), |s| s.to_string_lossy().into_owned());
    let runs_dir_name = format!("{stem}.runs");
    let runs_dir = out.with_file_name(&runs_dir_name);
    let (written, note) = if args.no_run_pages {
        (Vec::new(), None)
    } else {
        match rt.block_on(run_pages(&args.store, &summary, &runs_dir)) {
            Ok((w, missing)) => {
                let note = (missing > 0).then(|| {
                    format!(
                        "{missing} listed run(s) are not in the store read ({}): they have no page",
                        args.store.url
                    )
                });
                (w, note)
            }
            Err(e) => (
                Vec::new(),
                Some(format!("no run pages: the store could not be read ({e})")),
            ),
        }
    };
    let link = |id: &str| {
        written
            .iter()
            .any(|w| w == id)
            .then(|| relative_link(&[&runs_dir_name, &format!("{id}.html")]))
    };
    let page = batch_html(&summary, &link, note.as_deref());
    if let Err(e) = write_atomic(&out, page.as_bytes()) {
        return fail(format!("cannot write {}: {e}", out.display()));
    }
    let pages = if written.is_empty() {
        String::new()
    } else {
        format!("; {} run pages in {}", written.len(), runs_dir.display())
    };
    if let Some(n) = &note {
        super::stderr::say(
            super::stderr::Level::Warn,
            "report_note",
            n,
            serde_json::Value::Null,
        );
    }
    super::stderr::say(
        super::stderr::Level::Info,
        "report_written",
        &format!("report: {} ({} items{pages})", out.display(), summary.items),
        serde_json::json!({"path": out.display().to_string(), "items": summary.items, "run_pages": written.len()}),
    );
    super::exit::OK
}

/// The summary of a batch's output file, read line by line.
fn read_results(path: &Path) -> Result<Summary, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut summary = Summary::new(path.display().to_string());
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| format!("{}: line {}: {e}", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let item = Item::from_line(i as u64 + 1, &line).map_err(|e| format!("{}: {e}", path.display()))?;
        summary.add(item);
    }
    Ok(summary)
}

/// The summary of a submitted batch, from the latest run of each of its items in the store.
async fn read_submitted(store: &StoreArg, name: &str) -> Result<Summary, String> {
    let s = store.open_to_read().await.map_err(|e| e.to_string())?;
    let result = async {
        let AnyStore::Sql(sql) = &s else {
            return Err(
                "--batch reads a store that workers share (`--store postgres://...` or a SQLite file)"
                    .to_string(),
            );
        };
        let Some(batch) = sql.submitted_batch(name).await.map_err(|e| e.to_string())? else {
            return Err(format!(
                "the store has no submitted batch `{name}` (`switchyard batches` lists them)"
            ));
        };
        let mut summary = Summary::new(name);
        summary.flow = Some(batch.flow);
        summary.started_at = Some(batch.submitted_at);
        let mut pages = crate::cluster::collect::Pages::new(name);
        while let Some(run) = pages.next_item(sql).await.map_err(|e| e.to_string())? {
            summary.add(item_of(&run));
        }
        Ok(summary)
    }
    .await;
    s.close().await;
    result
}

/// The flow and the start of a batch read from its output file, from the record of its run
/// that started first; left unknown when the store read does not have it (a batch run with
/// `--store memory`, another store).
async fn flow_and_start(store: &StoreArg, summary: &mut Summary) {
    let Some(first) = summary.first_run().map(str::to_owned) else {
        return;
    };
    let Ok(s) = store.open_to_read().await else {
        return;
    };
    if let Ok(run) = s.get_run(&first).await {
        summary.flow = Some(run.flow);
        summary.started_at = Some(run.started_at);
    }
    s.close().await;
}

fn item_of(r: &crate::record::RunRecord) -> Item {
    let line = r.item_index.unwrap_or(0) + 1;
    Item {
        line,
        id: r.item_id.clone().unwrap_or_else(|| format!("line {line}")),
        status: r.status.as_str().to_string(),
        error_kind: r.error.as_ref().map(|e| e.kind.to_string()),
        error_message: r.error.as_ref().map(|e| e.message.clone()),
        run_id: Some(r.id.clone()),
        cost_usd: r.usage.cost_usd,
        cost_unknown_calls: r.usage.cost_unknown_calls,
        duration_ms: r.finished_at.map_or(0, |f| f.saturating_sub(r.started_at)),
    }
}

/// Writes the page of each run the report lists (at most [`RUN_PAGES`]) into `dir`; returns
/// the runs written and how many the store does not have.
async fn run_pages(store: &StoreArg, summary: &Summary, dir: &Path) -> Result<(Vec<String>, usize), String> {
    let ids = summary.linked_runs();
    if ids.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let s = Arc::new(store.open_to_read().await.map_err(|e| e.to_string())?);
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let mut missing = 0;
    for id in ids.into_iter().take(RUN_PAGES) {
        let Ok(run) = s.get_run(&id).await else {
            missing += 1;
            continue;
        };
        let page = super::runs::html_report(&s, &run, store).await?;
        write_atomic(&dir.join(format!("{id}.html")), page.as_bytes())
            .map_err(|e| format!("cannot write in {}: {e}", dir.display()))?;
        written.push(id);
    }
    if let Ok(s) = Arc::try_unwrap(s) {
        s.close().await;
    }
    Ok((written, missing))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name()
            .map_or("report".into(), |n| n.to_string_lossy().into_owned())
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
