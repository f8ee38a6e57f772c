//! `switchyard runs list|show|resume|cancel` and `switchyard resume`: stored runs.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use super::common::{self, StoreArg, Use, fail, lock_batch, root_of, with_store};
use crate::record::{ErrorKind, StepError};
use crate::record::{RunRecord, RunStatus, now_ms};
use crate::store::{RunFilter, Store};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: RunsCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum RunsCommand {
    /// List stored root runs, newest first (`--all`: child runs too).
    List(ListArgs),
    /// Show a run: its record and the tree of its steps, with child runs, errors, payload
    /// changes, violations and cost.
    Show(ShowArgs),
    /// Continue an interrupted run, or one a crash left running.
    Resume(Box<super::resume::ResumeArgs>),
    /// Mark a run that is not running anywhere (interrupted, or left running by a crash) as
    /// cancelled, with its unfinished child runs.
    Cancel(CancelArgs),
    /// Write a batch's OUT.jsonl again from the store, running nothing (after `resume` of
    /// its interrupted items, say).
    Export(super::batch::ExportArgs),
    /// List a run's files (those of its child runs too), or write them under a directory.
    Files(super::runs_files::FilesArgs),
    /// Remove stored file bytes that no record refers to, and print how many and how much.
    Prune(super::runs_files::PruneArgs),
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Only runs with this status: queued, running, succeeded, failed, interrupted, cancelled.
    #[arg(long)]
    pub status: Option<String>,
    /// Only runs of the flow with this name.
    #[arg(long)]
    pub flow: Option<String>,
    /// At most this many runs.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// Only the runs of a batch: a submitted batch's name (`submit --batch NAME`), or the
    /// output file of a local one (`batch ... --output OUT.jsonl`).
    #[arg(long, value_name = "NAME|OUT.jsonl")]
    pub batch: Option<PathBuf>,
    /// Child runs too (started by `flow` agents; `runs show` shows them under their parent).
    #[arg(long)]
    pub all: bool,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArg,
}

/// How `runs show` writes a run.
#[derive(Clone, Copy, Debug, clap::ValueEnum, PartialEq, Eq)]
pub enum ShowFormat {
    /// The record and the tree of its steps, for a terminal.
    Text,
    /// The run record, its steps and its child runs as JSON (the same as --json).
    Json,
    /// One self-contained HTML page: the route on the flow's drawing, a timeline of every
    /// record, and each record's input, result and payload changes on click.
    Html,
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "switchyard runs show RUN_ID --format html > report.html   # open it in a browser; it needs no network"
)]
pub struct ShowArgs {
    pub run_id: String,
    /// The run record and its steps as JSON (the same as --format json).
    #[arg(long)]
    pub json: bool,
    #[arg(long, value_enum, default_value = "text")]
    pub format: ShowFormat,
    /// Print the transcript of each agent loop (of a step, an iteration, a branch, a child
    /// run) under its record, a line per message; with --json, a `transcripts` list of them.
    #[arg(long)]
    pub transcript: bool,
    #[command(flatten)]
    pub store: StoreArg,
}

#[derive(clap::Args, Debug)]
pub struct CancelArgs {
    pub run_id: String,
    #[command(flatten)]
    pub store: StoreArg,
}

pub fn run(args: Args) -> u8 {
    match args.command {
        RunsCommand::List(a) => list(a),
        RunsCommand::Show(a) => show(a),
        RunsCommand::Resume(a) => super::resume::resume(*a),
        RunsCommand::Cancel(a) => cancel(a),
        RunsCommand::Export(a) => super::batch::export(a),
        RunsCommand::Files(a) => super::runs_files::files(a),
        RunsCommand::Prune(a) => super::runs_files::prune(a),
    }
}

fn list(args: ListArgs) -> u8 {
    let status = match args.status.as_deref().map(|s| (s, RunStatus::parse(s))) {
        None => None,
        Some((_, Some(s))) => Some(s),
        Some((s, None)) => {
            return fail(format!(
                "--status: unknown status `{s}` (queued, running, succeeded, failed, interrupted, cancelled)"
            ));
        }
    };
    let filter = RunFilter {
        status,
        flow: args.flow.clone(),
        limit: Some(args.limit),
        roots_only: !args.all,
        batches: args.batch.as_deref().map(batch_names).unwrap_or_default(),
    };
    let runs = match with_store(&args.store, Use::Read, async |s| s.list_runs(&filter).await) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return fail(e),
        // Nothing recorded yet in the default store: no runs, not an error.
        Err(common::Missing::File(_)) if args.store.url == crate::store::any::DEFAULT_STORE => Vec::new(),
        Err(e) => return fail(e),
    };
    if args.json {
        for r in &runs {
            println!("{}", summary_json(r));
        }
        return super::exit::OK;
    }
    if runs.is_empty() {
        match &args.batch {
            Some(b) => println!("no runs of a batch named {} or writing it", b.display()),
            None => println!("no runs"),
        }
        return super::exit::OK;
    }
    println!(
        "{:<28} {:<19} {:<20} {:<12} {:>9} {:>6} {:>10}  error",
        "run", "started (UTC)", "flow", "status", "duration", "steps", "cost"
    );
    for r in &runs {
        let error = r
            .error
            .as_ref()
            .map(|e| format!("[{}] {}", e.kind, first_line(&e.message, 60)))
            .unwrap_or_default();
        // A cost that leaves calls out says so before the error.
        let error = match r.usage.cost_unknown_calls {
            0 => error,
            _ => format!(
                "{}  {error}",
                crate::record::fmt_unknown(r.usage.cost_unknown_calls).trim_start()
            ),
        };
        println!(
            "{:<28} {:<19} {:<20} {:<12} {:>9} {:>6} {:>10}  {error}",
            r.id,
            super::stderr::utc_seconds(r.started_at),
            first_line(&r.flow, 20),
            r.status.as_str(),
            duration(r),
            if r.finished_at.is_none() && r.status == RunStatus::Running {
                "-".to_string()
            } else {
                r.steps.to_string()
            },
            r.usage.cost_usd,
        );
    }
    super::exit::OK
}

/// `runs show --format html`: the run's page ([`crate::report`]), from its records, those of
/// its child runs (the first [`crate::report::CHILDREN_SHOWN`]), and its flow's drawing (from
/// its flow file, or a submitted batch's bundle).
pub(super) async fn html_report(
    s: &Arc<crate::store::any::AnyStore>,
    run: &RunRecord,
    store: &StoreArg,
) -> Result<String, String> {
    let steps = s.latest_steps(&run.id).await.map_err(|e| e.to_string())?;
    let mut children = std::collections::HashMap::new();
    let mut queue: std::collections::VecDeque<String> =
        steps.iter().filter_map(|st| st.child_run.clone()).collect();
    while let Some(id) = queue.pop_front() {
        if children.len() >= crate::report::CHILDREN_SHOWN || children.contains_key(&id) {
            continue;
        }
        let Ok(child) = s.get_run(&id).await else { continue };
        let cs = s.latest_steps(&id).await.map_err(|e| e.to_string())?;
        queue.extend(cs.iter().filter_map(|st| st.child_run.clone()));
        children.insert(id, (child, cs));
    }
    // A submitted run's flow is its batch's bundle; any other run's, its flow file.
    let submitted = match (&**s, &run.batch) {
        (crate::store::any::AnyStore::Sql(sql), Some(b)) => match sql.submitted_batch(b).await {
            Ok(Some(batch)) => Some((super::worker::loader())(sql, &batch).await),
            _ => None,
        },
        _ => None,
    };
    let plan: Result<Arc<crate::plan::Plan>, String> = match submitted {
        Some(p) => p,
        None => match &run.flow_path {
            Some(p) => super::graph::quiet_plan(std::path::Path::new(p)).map(Arc::new),
            None => Err("the run records no flow file".to_string()),
        },
    };
    let layout = plan.and_then(|p| {
        if p.flow(p.root).name != run.flow {
            return Err(format!(
                "the flow file holds flow `{}`, not `{}`",
                p.flow(p.root).name,
                run.flow
            ));
        }
        crate::plan::svg::layout(&p, false)
    });
    let root = root_of(&**s, run).await?;
    let waiting = waiting_in(s, &root).await?;
    let (files, _) = super::runs_files::files_of(&**s, run).await?;
    let inline = super::runs_files::inline_bytes(&**s, &files).await;
    let decisions = super::runs_decisions::of_run(&**s, &run.id).await?;
    let report = crate::report::RunReport {
        run,
        steps: &steps,
        children: &children,
        layout,
        now_ms: now_ms(),
        waiting: waiting.as_ref().map(|w| (w, answer_command(&root, store))),
        files: &files,
        inline: &inline,
        decisions: &decisions,
    };
    Ok(crate::report::run_html(&report))
}

/// The names the store may know the batch `output` by: the name as given (a submitted batch),
/// the file's canonical path
/// (symlinks and `..` resolved) and, for batches named before names were canonical, its
/// absolute path as given.
fn batch_names(output: &std::path::Path) -> Vec<String> {
    // A submitted batch goes by the name it was given.
    let mut names = vec![output.display().to_string()];
    if let Ok(c) = std::fs::canonicalize(output) {
        let c = c.display().to_string();
        if !names.contains(&c) {
            names.push(c);
        }
    }
    if let Ok(a) = std::path::absolute(output) {
        let a = a.display().to_string();
        if !names.contains(&a) {
            names.push(a);
        }
    }
    names
}

fn summary_json(r: &RunRecord) -> Value {
    let mut v = serde_json::json!({
        "id": r.id,
        "flow": r.flow,
        "status": r.status.as_str(),
        "parent_run": r.parent_run,
        "batch": r.batch,
        "item_id": r.item_id,
        "started_at": r.started_at,
        "finished_at": r.finished_at,
        "steps": r.steps,
        "cost_usd": r.usage.cost_usd,
        "error": r.error.as_ref().map(StepError::to_json),
        "origin": r.origin,
    });
    if r.usage.cost_unknown_calls > 0 {
        v["cost_unknown_calls"] = r.usage.cost_unknown_calls.into();
    }
    v
}

fn first_line(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or("");
    if line.chars().count() <= max {
        return line.to_string();
    }
    let mut out: String = line.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Who runs a `running` run now, as `runs show` says it: the words, whether nothing runs it
/// (it stopped), and what else than `resume` continues it.
async fn holder_state(s: &crate::store::any::AnyStore, root: &RunRecord) -> (String, bool, &'static str) {
    use crate::store::any::AnyStore;
    const BATCH: &str = "the same `switchyard batch` command continues it, or ";
    const WORKER: &str = "a `switchyard worker` takes it over, or ";
    if root.paused() {
        return ("paused (Ctrl-C): nothing runs it".into(), true, "");
    }
    let sql = match s {
        AnyStore::Sql(sql) => Some(sql),
        _ => None,
    };
    // A submitted run is held by its lease.
    if let Some(sql) = sql
        && let Ok(Some((_, owner, live))) = sql.lease_of(&root.id).await
    {
        let who = |o: &str| {
            let what = if o.starts_with("resume-") {
                "a `switchyard resume --batch` process"
            } else {
                "a `switchyard worker`"
            };
            match crate::store::writers::lease_holder_process(o) {
                Some((pid, host)) => format!("{what} runs it now (pid {pid}, host {host})"),
                None => format!("{what} runs it now (`{o}`)"),
            }
        };
        return match owner.filter(|_| live) {
            Some(o) => (who(&o), false, ""),
            None => (
                "stopped: the lease of the worker that ran it lapsed (a crash?)".into(),
                true,
                WORKER,
            ),
        };
    }
    // A run of `run` or `resume` (a batch's item too, when a `resume` continues it) is held
    // by its writer (SPEC §7.3).
    let held = match sql {
        Some(sql) => sql.holder_of(&root.id).await.ok(),
        None => None,
    };
    if let Some(Some((w, true))) = &held
        && !w.is_gone()
    {
        return (
            format!(
                "a `switchyard run` or `resume` process runs it now (pid {}, host {})",
                w.pid, w.host
            ),
            false,
            "",
        );
    }
    if root.batch.is_some() {
        return match crate::batch::lock_batch_of(root) {
            Err(crate::batch::BatchError::Busy { .. }) => {
                ("a `switchyard batch` process runs it now".into(), false, "")
            }
            _ => (
                "stopped (a crash?): no `switchyard batch` process runs it".into(),
                true,
                BATCH,
            ),
        };
    }
    let state = match held {
        Some(Some((w, _))) if w.is_gone() => {
            format!(
                "stopped by a crash: the process that ran it (pid {}, host {}) is gone",
                w.pid, w.host
            )
        }
        Some(Some((w, _))) => format!(
            "stopped (a crash?): the process that ran it (pid {}, host {}) no longer renews its hold",
            w.pid, w.host
        ),
        Some(None) => "stopped by a crash: no process holds it".into(),
        None => "stopped by a crash, unless a `switchyard run` process still runs it (not detected)".into(),
    };
    (state, true, "")
}

/// The status and duration lines of a run that is `running` with no end on record: what
/// finished of it, since when nothing was recorded, whether anything runs it and the command
/// that continues it.
async fn unfinished(
    out: &mut String,
    s: &crate::store::any::AnyStore,
    run: &RunRecord,
    root: &RunRecord,
    steps: &[crate::record::StepRecord],
    store: &StoreArg,
) {
    use crate::record::StepStatus;
    let (state, stopped, how) = holder_state(s, root).await;
    let _ = writeln!(out, "status    running, {state}");
    let is_part = |s: &&crate::record::StepRecord| s.kind == "iteration" || s.kind == "branch";
    let finished = steps
        .iter()
        .filter(|s| !is_part(s) && s.status != StepStatus::Started)
        .count();
    let count = |kind: &str| {
        steps
            .iter()
            .filter(|s| s.kind == kind && s.status != StepStatus::Started)
            .count()
    };
    let (iterations, branches) = (count("iteration"), count("branch"));
    let last = steps
        .iter()
        .map(|s| s.finished_at.unwrap_or(s.started_at))
        .max()
        .unwrap_or(run.started_at)
        .max(run.started_at);
    let since = crate::model::fmt_duration(std::time::Duration::from_millis(last - run.started_at));
    let mut parts = String::new();
    if iterations > 0 {
        let _ = write!(parts, ", {iterations} iterations");
    }
    if branches > 0 {
        let _ = write!(parts, ", {branches} branches");
    }
    let _ = writeln!(
        out,
        "duration  not ended · last record {} UTC, {since} after the start · {finished} steps finished{parts}",
        super::stderr::utc_seconds(last)
    );
    if stopped {
        let _ = writeln!(
            out,
            "continue  {how}`switchyard resume {}{}`",
            root.id,
            store.hint()
        );
    }
}

/// A run and its child runs, all the way down, each with its records (the latest attempt of
/// each step): the run first, then its children's trees in the order they started.
async fn tree_steps<S: crate::store::Store + ?Sized>(
    s: &S,
    run: &str,
) -> Result<Vec<(String, Vec<crate::record::StepRecord>)>, String> {
    let mut out = Vec::new();
    let mut todo = std::collections::VecDeque::from([run.to_string()]);
    while let Some(id) = todo.pop_front() {
        let steps = s.latest_steps(&id).await.map_err(|e| e.to_string())?;
        let children = s.children(&id).await.map_err(|e| e.to_string())?;
        todo.extend(children.into_iter().map(|c| c.id));
        out.push((id, steps));
    }
    Ok(out)
}

/// The `llm` requests abandoned with their tokens unknown in a run and its child runs.
async fn abandoned_in_tree<S: crate::store::Store + ?Sized>(s: &S, run: &str) -> Result<u64, String> {
    let tree = tree_steps(s, run).await?;
    Ok(tree
        .iter()
        .flat_map(|(_, steps)| steps)
        .map(super::trace::abandoned_requests)
        .sum())
}

/// `runs show --json --transcript`: the transcript of every agent loop in a run and its child
/// runs (the ones the text prints), each with its run, record number and step:
/// `{run, number, step, messages}`, a run's loops in record order, then its child runs'.
async fn transcripts_in_tree<S: crate::store::Store + ?Sized>(
    s: &S,
    run: &str,
) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for (id, steps) in tree_steps(s, run).await? {
        for st in &steps {
            if let Some(messages) = super::trace::loop_transcript(st) {
                out.push(serde_json::json!({
                    "run": id,
                    "number": st.key(),
                    "step": st.step,
                    "messages": messages,
                }));
            }
        }
    }
    Ok(out)
}

fn duration(r: &RunRecord) -> String {
    if r.finished_at.is_none() && r.status == RunStatus::Running {
        return "-".to_string();
    }
    let end = r.finished_at.unwrap_or_else(now_ms);
    crate::model::fmt_duration(std::time::Duration::from_millis(end.saturating_sub(r.started_at)))
}

fn show(args: ShowArgs) -> u8 {
    let color = super::color_stdout();
    let out = with_store(&args.store, Use::Read, async |s| -> Result<String, String> {
        let run = s.get_run(&args.run_id).await.map_err(|e| e.to_string())?;
        if args.format == ShowFormat::Html {
            return html_report(s, &run, &args.store).await;
        }
        if args.json || args.format == ShowFormat::Json {
            let steps = s.latest_steps(&run.id).await.map_err(|e| e.to_string())?;
            let children = s.children(&run.id).await.map_err(|e| e.to_string())?;
            let decisions = super::runs_decisions::of_run(&**s, &run.id).await?;
            let mut doc =
                serde_json::json!({"run": run, "steps": steps, "children": children, "decisions": decisions});
            if args.transcript {
                doc["transcripts"] = transcripts_in_tree(&**s, &run.id).await?.into();
            }
            return Ok(serde_json::to_string_pretty(&doc).expect("JSON values serialize") + "\n");
        }
        let mut out = String::new();
        let _ = writeln!(out, "run       {}", run.id);
        let _ = writeln!(out, "flow      {} ({})", run.flow, run.flow_hash);
        if let Some(p) = &run.flow_path {
            let _ = writeln!(out, "file      {p}");
        }
        if let Some(parent) = &run.parent_run {
            let _ = writeln!(
                out,
                "parent    {parent} (step {})",
                run.parent_step.as_deref().unwrap_or("?")
            );
        }
        if let (Some(b), Some(i)) = (&run.batch, run.item_index) {
            let _ = writeln!(
                out,
                "batch     {b}, line {} (id {})",
                i + 1,
                run.item_id.as_deref().unwrap_or("?")
            );
        }
        let root = root_of(&**s, &run).await?;
        // A run that has not ended has no usage of its own yet: what its finished steps
        // spent (each with its iterations, branches, loop and child runs) is what is known.
        let mut usage = run.usage;
        let mut so_far = "";
        if run.finished_at.is_some() || run.status != RunStatus::Running {
            let _ = writeln!(out, "status    {}", run.status.as_str());
            let _ = writeln!(out, "duration  {} · {} steps", duration(&run), run.steps);
        } else {
            let steps = s.latest_steps(&run.id).await.map_err(|e| e.to_string())?;
            unfinished(&mut out, s, &run, &root, &steps, &args.store).await;
            for st in steps.iter().filter(|st| !st.is_group() && !st.is_loop_part()) {
                usage.add(st.usage);
            }
            so_far = " so far, in its finished steps";
        }
        let abandoned = abandoned_in_tree(&**s, &run.id).await?;
        let lower_bound = if abandoned > 0 {
            format!(
                " · a lower bound: {abandoned} request(s) abandoned (timed out or cancelled), their tokens unknown"
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "cost      {}{} · tokens {} in, {} out{so_far}{lower_bound}",
            usage.cost_usd,
            crate::record::fmt_unknown(usage.cost_unknown_calls),
            usage.input_tokens,
            usage.output_tokens
        );
        let _ = writeln!(out, "input     {}", run.input);
        if let Some(o) = &run.output {
            let _ = writeln!(out, "output    {o}");
        }
        if let Some(e) = &run.error {
            let _ = writeln!(out, "error     [{}] {}", e.kind, e.message);
        }
        let (files, complete) = super::runs_files::files_of(&**s, &run).await?;
        super::runs_files::files_lines(&mut out, &files, complete);
        out.push('\n');
        super::runs_decisions::lines(&mut out, &super::runs_decisions::of_run(&**s, &run.id).await?);
        let waiting = waiting_in(s, &root).await?;
        let detail = super::trace::Detail {
            answer: waiting.as_ref().map(|w| (w, answer_command(&root, &args.store))),
            now_ms: now_ms(),
            transcript: args.transcript,
            message_cap: 400,
        };
        out.push_str(&super::trace::render_with(&**s, &run.id, color, Some(&detail)).await);
        // Child runs whose calling step has no finished record (the run stopped while they
        // ran) are not in the tree above: under their parent all the same.
        let steps = s.latest_steps(&run.id).await.map_err(|e| e.to_string())?;
        let shown: std::collections::HashSet<&str> =
            steps.iter().filter_map(|st| st.child_run.as_deref()).collect();
        for child in s.children(&run.id).await.map_err(|e| e.to_string())? {
            if shown.contains(child.id.as_str()) {
                continue;
            }
            let _ = writeln!(
                out,
                "  child run of step {} (the step has no finished record):",
                child.parent_step.as_deref().unwrap_or("?")
            );
            let tree = super::trace::render_with(&**s, &child.id, color, Some(&detail)).await;
            for l in tree.lines() {
                let _ = writeln!(out, "    {l}");
            }
        }
        Ok(out)
    });
    match out {
        Ok(Ok(text)) => {
            print!("{text}");
            super::exit::OK
        }
        Ok(Err(e)) => fail(e),
        Err(e) => fail(e),
    }
}

/// The `interrupt` step or approval the tree of `root` waits at, if it is interrupted on one.
async fn waiting_in(
    s: &crate::store::any::AnyStore,
    root: &RunRecord,
) -> Result<Option<crate::runtime::resume::Waiting>, String> {
    if root.status != RunStatus::Interrupted {
        return Ok(None);
    }
    crate::runtime::resume::waiting_at(s, &root.id)
        .await
        .map_err(|e| e.to_string())
}

/// The command that answers what a run tree waits at: a decision is given to the root run,
/// whichever run of the tree asks for it.
fn answer_command(root: &RunRecord, store: &StoreArg) -> String {
    format!("switchyard resume {} --decision JSON{}", root.id, store.hint())
}

fn cancel(args: CancelArgs) -> u8 {
    let out = with_store(
        &args.store,
        Use::Write,
        async |s| -> Result<Vec<String>, String> {
            let run = s.get_run(&args.run_id).await.map_err(|e| e.to_string())?;
            if !crate::runtime::resume::resumable(run.status) && run.status != RunStatus::Queued {
                return Err(format!(
                    "run `{}` already ended {}: nothing to cancel",
                    run.id,
                    run.status.as_str()
                ));
            }
            let root = root_of(&**s, &run).await?;
            let _batch = lock_batch(&root, &run.id, "cancel")?;
            let submitted = match &**s {
                crate::store::any::AnyStore::Sql(sql) => {
                    sql.lease_of(&root.id).await.map_err(|e| e.to_string())?.is_some()
                }
                _ => false,
            };
            if submitted {
                return cancel_tree(s, run, &root, true).await;
            }
            // A run of `run` or `resume` is its writer's (SPEC §7.3): cancelled only once taken,
            // so a live process is not told it ended while it goes on.
            let writer = crate::store::Writer::this_process();
            if let Err(e) = s.take_run(&root.id, &writer, CANCEL_LEASE).await {
                writer.retire();
                return Err(match e {
                    crate::store::StoreError::Held { .. } => {
                        format!("{e}: stop it (Ctrl-C) before you cancel the run here")
                    }
                    e => e.to_string(),
                });
            }
            // Read again once held: the process that held it may have ended it meanwhile.
            let out = match s.get_run(&run.id).await {
                Ok(run) if crate::runtime::resume::resumable(run.status) => {
                    cancel_tree(s, run, &root, false).await
                }
                Ok(run) => Err(format!(
                    "run `{}` ended {} meanwhile: nothing to cancel",
                    run.id,
                    run.status.as_str()
                )),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = s.give_back_run(&root.id, &writer).await {
                tracing::warn!(run_id = %root.id, "could not give the run back: {e}");
            }
            writer.retire();
            out
        },
    );
    match out {
        Ok(Ok(ids)) => {
            for id in ids {
                println!("cancelled {id}");
            }
            super::exit::OK
        }
        Ok(Err(e)) => fail(e),
        Err(e) => fail(e),
    }
}

/// How long `runs cancel` holds a run it cancels (it gives it back at once after).
const CANCEL_LEASE: std::time::Duration = std::time::Duration::from_secs(30);

/// Ends `run` and its unfinished child runs as `cancelled`; a submitted root run through its
/// lease's epoch, so the worker holding it (if one does) writes nothing more of it and drops
/// it (SPEC §12). The ids it cancelled.
async fn cancel_tree(
    s: &crate::store::any::AnyStore,
    run: RunRecord,
    root: &RunRecord,
    submitted: bool,
) -> Result<Vec<String>, String> {
    let cancelled_now = |r: &mut RunRecord| {
        r.status = RunStatus::Cancelled;
        r.finished_at = Some(now_ms());
        r.error = Some(StepError::new(
            ErrorKind::Cancelled,
            "cancelled with `switchyard runs cancel`",
        ));
    };
    let mut cancelled = Vec::new();
    let mut queue: Vec<RunRecord> = if let crate::store::any::AnyStore::Sql(sql) = s
        && submitted
        && root.id == run.id
    {
        let mut r = run.clone();
        cancelled_now(&mut r);
        if !sql.end_submitted(&r).await.map_err(|e| e.to_string())? {
            return Err(format!("run `{}` ended meanwhile: nothing to cancel", run.id));
        }
        cancelled.push(r.id.clone());
        // Its unfinished child runs end as a local run's do, below.
        s.children(&r.id)
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|c| crate::runtime::resume::resumable(c.status))
            .collect()
    } else {
        vec![run]
    };
    while let Some(mut r) = queue.pop() {
        queue.extend(
            s.children(&r.id)
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|c| crate::runtime::resume::resumable(c.status)),
        );
        cancelled_now(&mut r);
        s.update_run(&r).await.map_err(|e| e.to_string())?;
        cancelled.push(r.id);
    }
    Ok(cancelled)
}
