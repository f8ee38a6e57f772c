//! `switchyard inbox list|show|decide|bulk` (SPEC §15): the questions runs wait at, answered
//! one at a time or by a filter, each answer recorded with who gave it. Every subcommand first
//! settles the questions whose expiry passed and continues their runs here, so an expired step
//! fails `timeout` without anyone resuming it. Recording and continuing are `inbox`'s; this
//! file reads the flags, prints and picks exit codes.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};

use super::common::{self, StoreArg};
use super::runs_decisions::plain;
use super::stderr::{self, Level};
use crate::inbox::filter::{Filter, FilterError};
use crate::inbox::{self, Actor, BulkError, Continued, DecideError};
use crate::record::RunStatus;
use crate::record::inbox::{InboxItem, format_ms};
use crate::store::Store;
use crate::store::any::AnyStore;
use crate::store::inbox::{GroupCount, ItemQuery, LogQuery};

#[derive(clap::Args, Debug)]
#[command(
    after_long_help = "Times are printed as RFC 3339 UTC strings (`2026-12-05T10:04:03.120Z`), or \
null where there is none (an item without expiry).\n\n\
Every inbox subcommand first settles the questions whose expiry passed: each is marked `expired` and \
its run continues here, so its step fails with kind `timeout` (or, for an agent loop with `on_expire: reject`, \
the model is told the calls were rejected). Submitted runs (`switchyard submit`) are queued again for \
the workers instead."
)]
pub struct Args {
    #[command(subcommand)]
    pub command: InboxCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum InboxCommand {
    /// The waiting questions, grouped by shape (flow, step, schema): counts, the oldest, the
    /// soonest expiry, and a few items of each group.
    List(ListArgs),
    /// One item: its question, kind, schema, proposed calls, the run's input, its state and
    /// expiry, and the decisions logged for it.
    Show(ShowArgs),
    /// Answer one item, then continue its run (exit status as `resume`).
    Decide(DecideArgs),
    /// Answer many items at once: `--preview` counts the items a filter matches and gives a
    /// token; `--token T` answers exactly those items.
    Bulk(BulkArgs),
}

/// Which items: `--batch`, `--flow`, `--step`.
#[derive(clap::Args, Debug, Clone)]
pub struct Scope {
    /// Only items of runs of this batch.
    #[arg(long, value_name = "NAME")]
    pub batch: Option<String>,
    /// Only items of this flow (its `flow:` name).
    #[arg(long, value_name = "NAME")]
    pub flow: Option<String>,
    /// Only items asked at this step.
    #[arg(long, value_name = "STEP")]
    pub step: Option<String>,
}

impl Scope {
    fn query(&self) -> ItemQuery {
        ItemQuery {
            batch: self.batch.clone(),
            flow: self.flow.clone(),
            step: self.step.clone(),
            ..ItemQuery::default()
        }
    }
}

#[derive(clap::Args, Debug)]
#[command(
    after_long_help = "With --json: {\"groups\": [{\"flow\", \"step\", \"schema\", \"question\", \"count\", \
\"oldest\", \"soonest_expiry\", \"items\": [{\"id\", \"run_id\", \"batch\", \"item\", \"question\", \"expires_at\"}]}]}; \
`question` of a group is one of its items' questions. Times are RFC 3339 UTC strings, or null.\n\n\
The filter is CEL over an item: `question`, `calls` ([{name, arguments}]), `input` (the run's input), \
`batch`, `item`, `kind`, `flow`, `step`, `age_s`, `expires_in_s`.\n\n\
Exit status: 0, or 2 for a bad filter or store."
)]
pub struct ListArgs {
    #[command(flatten)]
    pub scope: Scope,
    /// Only items this CEL expression holds for (`input.amount < 100`).
    #[arg(long, value_name = "CEL")]
    pub filter: Option<String>,
    /// Items listed per group (default 3; with --json all of them).
    #[arg(long, value_name = "N")]
    pub items: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub continuing: Continuing,
    #[command(flatten)]
    pub store: StoreArg,
}

#[derive(clap::Args, Debug)]
#[command(
    after_long_help = "ID is an item id (`q…`), or the id of a run waiting at exactly one item.\n\n\
With --json: the item {\"id\", \"run_id\", \"root_run\", \"number\", \"flow\", \"step\", \"batch\", \"item\", \
\"kind\", \"question\", \"schema\", \"calls\", \"input\", \"state\", \"created_at\", \"expires_at\", \"settled_at\", \
\"decisions\": [...]}, times as RFC 3339 UTC strings or null."
)]
pub struct ShowArgs {
    /// An item id, or the id of a run waiting at one item.
    pub id: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub continuing: Continuing,
    #[command(flatten)]
    pub store: StoreArg,
}

/// How answered runs continue here.
#[derive(clap::Args, Debug, Clone)]
pub struct Continuing {
    /// The project root that the continued runs' file paths may not leave; default each
    /// flow's directory.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
#[command(
    after_long_help = "The decision is checked against the item's schema and recorded with who gave it \
(--actor, default the OS user) in the same transaction that marks the item decided: a second answer is \
refused naming who decided and when, a late one as expired. The run then continues here (a submitted \
run is queued again for the workers), unless --no-continue.\n\n\
Exit status: 0 the run succeeded (or was queued, or --no-continue), 1 it failed, 2 the answer was refused \
(decided before, expired, not matching the schema, no such item) or usage, 3 interrupted again."
)]
pub struct DecideArgs {
    /// An item id, or the id of a run waiting at one item.
    pub id: String,
    /// The answer, as JSON, checked against the item's schema.
    #[arg(long)]
    pub decision: String,
    /// Why, kept with the decision.
    #[arg(long)]
    pub reason: Option<String>,
    /// Who answers (default the OS user).
    #[arg(long)]
    pub actor: Option<String>,
    /// Record the answer only; the run continues with the next `resume`, `batch` or worker.
    #[arg(long)]
    pub no_continue: bool,
    #[command(flatten)]
    pub continuing: Continuing,
    #[command(flatten)]
    pub store: StoreArg,
}

#[derive(clap::Args, Debug)]
#[command(
    after_long_help = "Two steps. `inbox bulk --filter CEL --preview [--decision JSON]` counts the waiting \
items the filter matches (with --batch/--flow/--step), the question shapes among them and a few samples, \
and stores them under a token; with --decision it also says how many of them the decision does not fit. \
With --json: {\"matched\", \"shapes\", \"samples\", \"token\"}.\n\n\
`inbox bulk --token T --decision JSON` answers exactly the items that preview counted (items added since \
are not touched), each checked against its own schema; those decided or expired meanwhile, or that the \
decision does not fit, are refused and listed. A token is applied once. With --json: \
{\"bulk_id\", \"applied\": [ids], \"refused\": [{\"id\", \"reason\"}]}. Then the answered runs continue here, \
--concurrency at a time, unless --no-continue.\n\n\
Exit status: 0 every counted item was answered, 1 some were refused, 2 usage (a bad filter, an unknown or \
applied token, a decision other than the previewed one)."
)]
pub struct BulkArgs {
    /// Which items (a CEL expression over an item, as `inbox list --filter`); with --preview.
    #[arg(long, value_name = "CEL", required_unless_present = "token")]
    pub filter: Option<String>,
    #[command(flatten)]
    pub scope: Scope,
    /// Count the matching items and store them under a token; answer nothing.
    #[arg(long, conflicts_with = "token", requires = "filter")]
    pub preview: bool,
    /// Answer the items the preview of this token counted.
    #[arg(long, value_name = "T", conflicts_with_all = ["filter", "batch", "flow", "step"])]
    pub token: Option<String>,
    /// The answer, as JSON, checked against each item's schema.
    #[arg(long, required_unless_present = "preview")]
    pub decision: Option<String>,
    /// Why, kept with each decision.
    #[arg(long)]
    pub reason: Option<String>,
    /// Who answers (default the OS user).
    #[arg(long)]
    pub actor: Option<String>,
    /// Record the answers only; the runs continue with the next `resume`, `batch` or worker.
    #[arg(long)]
    pub no_continue: bool,
    /// Runs continued at once.
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub concurrency: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub continuing: Continuing,
    #[command(flatten)]
    pub store: StoreArg,
}

pub fn run(args: Args) -> u8 {
    match args.command {
        InboxCommand::List(a) => list(a),
        InboxCommand::Show(a) => show(a),
        InboxCommand::Decide(a) => decide(a),
        InboxCommand::Bulk(a) => bulk(a),
    }
}

/// Runs `f` on the store (opened, expired questions settled first), closing it after.
fn on_store(store: &StoreArg, root: Option<PathBuf>, f: impl AsyncFnOnce(&Arc<AnyStore>) -> u8) -> u8 {
    let out = common::with_store(store, common::Use::Write, async |s: &Arc<AnyStore>| {
        if let Err(e) = settle(s, root).await {
            return common::fail(e);
        }
        f(s).await
    });
    match out {
        Ok(code) => code,
        Err(e) => common::fail(e),
    }
}

/// Marks the waiting items whose expiry passed `expired` and continues their runs here (a
/// submitted run is the workers'); says on stderr what became of them. Cheap when nothing
/// expired: one indexed statement.
pub(super) async fn settle(store: &Arc<AnyStore>, root: Option<PathBuf>) -> Result<(), String> {
    if !store.keeps_steps() {
        return Ok(());
    }
    let expired = inbox::settle_expired(&**store).await.map_err(|e| e.to_string())?;
    if expired.is_empty() {
        return Ok(());
    }
    let runs = inbox::continue_runs(store, &expired, 8, root).await;
    let mut text = format!(
        "{} question(s) expired without a decision; their runs continued:",
        expired.len()
    );
    for (id, c) in &runs {
        text.push_str(&format!("\n  {id}  {}", continued_text(c)));
    }
    stderr::say(
        Level::Info,
        "inbox_expired",
        &text,
        json!({"expired": expired.iter().map(|i| i.id.clone()).collect::<Vec<_>>(), "runs": runs.len()}),
    );
    Ok(())
}

/// One line on how a run went on.
fn continued_text(c: &Continued) -> String {
    match c {
        Continued::Ran(o) => {
            let error = o
                .error
                .as_ref()
                .map(|e| format!(": [{}] {}", e.kind, e.message.lines().next().unwrap_or("")))
                .unwrap_or_default();
            let status = match o.status {
                RunStatus::Interrupted => "interrupted again",
                RunStatus::Running => "paused",
                s => s.as_str(),
            };
            format!("{status}{error}")
        }
        Continued::Queued => "queued for the workers".to_string(),
        Continued::Elsewhere(why) => format!("continued elsewhere: {why}"),
        Continued::Failed(why) => {
            format!(
                "not continued: {why} (the answer stays recorded: `switchyard resume RUN_ID` continues it)"
            )
        }
    }
}

/// A parsed `--filter`, or the exit status once its error is printed.
fn parse_filter(text: &str) -> Result<Filter, u8> {
    Filter::parse(text).map_err(|e: FilterError| {
        stderr::error(e.render());
        super::exit::USAGE
    })
}

/// `--decision` as JSON, or the exit status once its error is printed.
fn parse_decision(text: &str) -> Result<Value, u8> {
    crate::json::from_str(text).map_err(|e| {
        common::fail(format!(
            "--decision is not valid JSON: {} (line {}, column {})",
            e.cause(),
            e.line(),
            e.column()
        ))
    })
}

/// `--actor`, else the OS user, answering on the command line.
pub(super) fn actor(name: Option<&str>) -> Actor {
    match name.map(str::trim).filter(|n| !n.is_empty()) {
        Some(n) => Actor {
            name: n.to_string(),
            via: crate::record::inbox::Via::Cli,
        },
        None => Actor::os_user(),
    }
}

fn time(ms: Option<u64>) -> Value {
    ms.map_or(Value::Null, |t| Value::String(format_ms(t)))
}

/// An item as `list` and `bulk --preview` print it.
fn item_brief(i: &InboxItem) -> Value {
    json!({
        "id": i.id,
        "run_id": i.run_id,
        "batch": i.batch,
        "item": i.item,
        "question": i.question,
        "expires_at": time(i.expires_at),
    })
}

fn list(args: ListArgs) -> u8 {
    let filter = match args.filter.as_deref().map(parse_filter).transpose() {
        Ok(f) => f,
        Err(code) => return code,
    };
    let query = args.scope.query();
    let per_group = args.items.or(if args.json { None } else { Some(3) });
    on_store(&args.store, args.continuing.root.clone(), async |store| {
        let (groups, items) = match &filter {
            None => {
                let groups = match store.inbox().groups(&query).await {
                    Ok(g) => g,
                    Err(e) => return common::fail(e),
                };
                let items = match inbox::select(&**store, &query, None).await {
                    Ok((items, _)) => items,
                    Err(e) => return common::fail(e),
                };
                (groups, items)
            }
            Some(f) => {
                let (items, failed) = match inbox::select(&**store, &query, Some(f)).await {
                    Ok(x) => x,
                    Err(e) => return common::fail(e),
                };
                warn_failed(&failed);
                (crate::store::inbox::group_items(&items), items)
            }
        };
        print_groups(&groups, &items, per_group, args.json);
        super::exit::OK
    })
}

/// Says on stderr how many items the filter could not be evaluated on, with the first reason.
fn warn_failed(failed: &[(String, String)]) {
    if let Some((id, why)) = failed.first() {
        stderr::say(
            Level::Warn,
            "filter_failed",
            &format!(
                "the filter could not be evaluated on {} item(s), not counted (item `{id}`: {why})",
                failed.len()
            ),
            json!({"failed": failed.len()}),
        );
    }
}

fn print_groups(groups: &[GroupCount], items: &[InboxItem], per_group: Option<usize>, as_json: bool) {
    fn of<'a>(items: &'a [InboxItem], g: &'a GroupCount) -> impl Iterator<Item = &'a InboxItem> {
        items.iter().filter(move |i| i.shape == g.shape)
    }
    if as_json {
        let groups: Vec<Value> = groups
            .iter()
            .map(|g| {
                let listed: Vec<Value> = of(items, g)
                    .take(per_group.unwrap_or(usize::MAX))
                    .map(item_brief)
                    .collect();
                json!({
                    "flow": g.flow,
                    "step": g.step,
                    "schema": g.schema,
                    "question": of(items, g).next().map(|i| i.question.clone()),
                    "count": g.count,
                    "oldest": time(Some(g.oldest)),
                    "soonest_expiry": time(g.soonest_expiry),
                    "items": listed,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"groups": groups})).expect("JSON values serialize")
        );
        return;
    }
    if groups.is_empty() {
        println!("no questions waiting");
        return;
    }
    let total: u64 = groups.iter().map(|g| g.count).sum();
    println!("{total} question(s) waiting, in {} group(s)", groups.len());
    for g in groups {
        let expiry = g
            .soonest_expiry
            .map(|e| format!(", soonest expiry {}", format_ms(e)))
            .unwrap_or_default();
        println!(
            "\n{} × {} at {}/{} ({}), oldest {}{expiry}",
            g.count,
            g.kind,
            g.flow,
            g.step,
            g.shape,
            format_ms(g.oldest)
        );
        if let Some(q) = of(items, g).next() {
            println!("  asks: {}", one_line(&q.question));
        }
        let n = per_group.unwrap_or(usize::MAX);
        for i in of(items, g).take(n) {
            let item = i
                .item
                .as_deref()
                .map(|x| format!("  item {x}"))
                .unwrap_or_default();
            let expires = i
                .expires_at
                .map(|e| format!("  expires {}", format_ms(e)))
                .unwrap_or_default();
            println!("  {}  run {}{item}{expires}", i.id, i.run_id);
        }
        let shown = of(items, g).take(n).count() as u64;
        if g.count > shown {
            println!("  … and {} more", g.count - shown);
        }
    }
}

/// Text on one line, cut at 160 characters.
fn one_line(s: &str) -> String {
    let flat = plain(&s.split_whitespace().collect::<Vec<_>>().join(" "));
    if flat.chars().count() > 160 {
        format!("{}…", flat.chars().take(159).collect::<String>())
    } else {
        flat
    }
}

/// A decision row as `show`, `bulk` and `decisions log` print it.
pub(super) fn decision_json(d: &crate::record::inbox::DecisionRow) -> Value {
    json!({
        "id": d.id,
        "item_id": d.item_id,
        "run_id": d.run_id,
        "actor": d.actor,
        "via": d.via.as_str(),
        "decision": d.decision,
        "reason": d.reason,
        "edited": d.edited,
        "bulk_id": d.bulk_id,
        "at": format_ms(d.at),
    })
}

fn show(args: ShowArgs) -> u8 {
    on_store(&args.store, args.continuing.root.clone(), async |store| {
        let item = match inbox::find(&**store, &args.id).await {
            Ok(i) => i,
            Err(e) => return decide_error(&e),
        };
        let input = match store.get_run(&item.root_run).await {
            Ok(r) => r.input,
            Err(_) => Value::Null,
        };
        let decisions: Vec<_> = match store
            .inbox()
            .log(&LogQuery {
                run: Some(item.run_id.clone()),
                ..LogQuery::default()
            })
            .await
        {
            Ok(rows) => rows.into_iter().filter(|d| d.item_id == item.id).collect(),
            Err(e) => return common::fail(e),
        };
        if args.json {
            let v = json!({
                "id": item.id,
                "run_id": item.run_id,
                "root_run": item.root_run,
                "number": item.number,
                "flow": item.flow,
                "step": item.step,
                "batch": item.batch,
                "item": item.item,
                "kind": item.kind,
                "question": item.question,
                "schema": item.schema,
                "calls": item.calls,
                "input": input,
                "state": item.state.as_str(),
                "created_at": time(Some(item.created_at)),
                "expires_at": time(item.expires_at),
                "settled_at": time(item.settled_at),
                "decisions": decisions.iter().map(decision_json).collect::<Vec<_>>(),
            });
            println!(
                "{}",
                serde_json::to_string_pretty(&v).expect("JSON values serialize")
            );
            return super::exit::OK;
        }
        print_item(&item, &input, &decisions, &args.store);
        super::exit::OK
    })
}

fn print_item(
    item: &InboxItem,
    input: &Value,
    decisions: &[crate::record::inbox::DecisionRow],
    store: &StoreArg,
) {
    let pretty = |v: &Value| serde_json::to_string(v).expect("JSON values serialize");
    println!("item      {}", item.id);
    println!(
        "run       {}{}",
        item.run_id,
        if item.root_run == item.run_id {
            String::new()
        } else {
            format!(" (of root run {})", item.root_run)
        }
    );
    println!("asked at  {}/{} (part {})", item.flow, item.step, item.number);
    if let Some(b) = &item.batch {
        println!(
            "batch     {b}{}",
            item.item
                .as_deref()
                .map(|i| format!(", item {i}"))
                .unwrap_or_default()
        );
    }
    println!("kind      {}", item.kind);
    println!("state     {}", item.state.as_str());
    println!("created   {}", format_ms(item.created_at));
    if let Some(e) = item.expires_at {
        println!("expires   {}", format_ms(e));
    }
    if let Some(s) = item.settled_at {
        println!("settled   {}", format_ms(s));
    }
    let question: Vec<String> = item.question.split('\n').map(plain).collect();
    println!("question  {}", question.join("\n          "));
    println!("schema    {}", pretty(&item.schema));
    for (n, c) in item.calls.iter().enumerate() {
        println!(
            "call {}    {}({})",
            n + 1,
            plain(c.get("tool").and_then(Value::as_str).unwrap_or("?")),
            pretty(c.get("arguments").unwrap_or(&Value::Null))
        );
    }
    println!("input     {}", pretty(input));
    for d in decisions {
        println!(
            "decided   {} by {} ({}) at {}{}{}",
            pretty(&d.decision),
            plain(&d.actor),
            d.via.as_str(),
            format_ms(d.at),
            d.reason
                .as_deref()
                .map(|r| format!(": {}", plain(r)))
                .unwrap_or_default(),
            d.bulk_id
                .as_deref()
                .map(|b| format!(" [bulk {b}]"))
                .unwrap_or_default()
        );
    }
    if item.state == crate::record::inbox::ItemState::Waiting {
        println!(
            "\nanswer it with `switchyard inbox decide {} --decision JSON{}`",
            item.id,
            store.hint()
        );
    }
}

/// Prints why an answer was not recorded: exit 2.
pub(super) fn decide_error(e: &DecideError) -> u8 {
    match e {
        DecideError::Store(e) => {
            stderr::error(e);
            super::exit::FAILED
        }
        other => common::fail(other),
    }
}

fn decide(args: DecideArgs) -> u8 {
    let decision = match parse_decision(&args.decision) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let actor = actor(args.actor.as_deref());
    let root = args.continuing.root.clone();
    on_store(&args.store, root.clone(), async |store| {
        let (item, row) = match inbox::decide(&**store, &args.id, decision, args.reason.clone(), &actor).await
        {
            Ok(x) => x,
            Err(e) => return decide_error(&e),
        };
        stderr::say(
            Level::Info,
            "decided",
            &format!(
                "decided: item {} of run {} by {} at {} (decision {})",
                item.id,
                item.root_run,
                row.actor,
                format_ms(row.at),
                row.id
            ),
            decision_json(&row),
        );
        if args.no_continue {
            return super::exit::OK;
        }
        let mut ran = inbox::continue_runs(store, std::slice::from_ref(&item), 1, root).await;
        match ran.pop() {
            Some((_, Continued::Ran(o))) => super::run::report(*o, &args.store),
            Some((id, c)) => {
                let code = if matches!(c, Continued::Failed(_)) {
                    super::exit::USAGE
                } else {
                    super::exit::OK
                };
                stderr::say(
                    Level::Info,
                    "continued",
                    &format!("run {id}: {}", continued_text(&c)),
                    Value::Null,
                );
                code
            }
            None => super::exit::OK,
        }
    })
}

fn bulk(args: BulkArgs) -> u8 {
    let decision = match args.decision.as_deref().map(parse_decision).transpose() {
        Ok(d) => d,
        Err(code) => return code,
    };
    if let Some(token) = args.token.clone() {
        let Some(decision) = decision else {
            return common::fail("--token needs --decision JSON: the answer to apply");
        };
        return bulk_apply(&args, &token, &decision);
    }
    if !args.preview {
        return common::fail(
            "inbox bulk answers in two steps: `--filter CEL --preview` counts the items and gives a token, \
             then `--token T --decision JSON` answers them",
        );
    }
    let Some(text) = args.filter.as_deref() else {
        return common::fail("--preview needs --filter CEL");
    };
    let filter = match parse_filter(text) {
        Ok(f) => f,
        Err(code) => return code,
    };
    let query = args.scope.query();
    on_store(&args.store, args.continuing.root.clone(), async |store| {
        let p = match inbox::preview(&**store, &filter, &query, decision.as_ref()).await {
            Ok(p) => p,
            Err(e) => return common::fail(e),
        };
        warn_failed(&p.failed);
        if args.json {
            let v = json!({
                "matched": p.matched,
                "shapes": p.shapes,
                "samples": p.samples.iter().map(item_brief).collect::<Vec<_>>(),
                "token": p.token,
            });
            println!(
                "{}",
                serde_json::to_string_pretty(&v).expect("JSON values serialize")
            );
        } else {
            println!("{} item(s) match, in {} question shape(s)", p.matched, p.shapes);
            for s in &p.samples {
                let item = s
                    .item
                    .as_deref()
                    .map(|x| format!("  item {x}"))
                    .unwrap_or_default();
                println!("  {}  run {}{item}  {}", s.id, s.run_id, one_line(&s.question));
            }
            if p.matched > p.samples.len() {
                println!("  … and {} more", p.matched - p.samples.len());
            }
            if !p.unfit.is_empty() {
                println!(
                    "the decision does not fit {} of them (they will be refused), e.g. {}",
                    p.unfit.len(),
                    p.unfit[0].1
                );
            }
            println!("token {}", p.token);
            println!(
                "apply it with `switchyard inbox bulk --token {} --decision JSON{}`",
                p.token,
                args.store.hint()
            );
        }
        if !p.unfit.is_empty() && args.json {
            stderr::say(
                Level::Warn,
                "bulk_unfit",
                &format!(
                    "the decision does not fit {} of the matched item(s), which will be refused (item `{}`: {})",
                    p.unfit.len(),
                    p.unfit[0].0,
                    p.unfit[0].1
                ),
                json!({"unfit": p.unfit.len()}),
            );
        }
        super::exit::OK
    })
}

fn bulk_apply(args: &BulkArgs, token: &str, decision: &Value) -> u8 {
    let actor = actor(args.actor.as_deref());
    let root = args.continuing.root.clone();
    on_store(&args.store, root.clone(), async |store| {
        let applied = match inbox::apply(&**store, token, decision, args.reason.clone(), &actor).await {
            Ok(a) => a,
            Err(BulkError::Store(e)) => {
                stderr::error(e);
                return super::exit::FAILED;
            }
            Err(e) => return common::fail(e),
        };
        if args.json {
            let v = json!({
                "bulk_id": applied.bulk_id,
                "applied": applied.applied.iter().map(|d| d.item_id.clone()).collect::<Vec<_>>(),
                "refused": applied.refused.iter().map(|(id, why)| json!({"id": id, "reason": why})).collect::<Vec<_>>(),
            });
            println!(
                "{}",
                serde_json::to_string_pretty(&v).expect("JSON values serialize")
            );
        } else {
            println!(
                "bulk {}: {} answered, {} refused",
                applied.bulk_id,
                applied.applied.len(),
                applied.refused.len()
            );
            for (id, why) in &applied.refused {
                println!("  refused {id}: {why}");
            }
        }
        let code = if applied.refused.is_empty() {
            super::exit::OK
        } else {
            super::exit::FAILED
        };
        if !args.no_continue && !applied.items.is_empty() {
            let concurrency = usize::try_from(args.concurrency).unwrap_or(8);
            continue_with_progress(store, &applied.items, concurrency, root).await;
        }
        code
    })
}

/// Continues the runs of `items`, a few groups at a time, with a progress bar on stderr when
/// it is a terminal; then says how they ended.
async fn continue_with_progress(
    store: &Arc<AnyStore>,
    items: &[InboxItem],
    concurrency: usize,
    root: Option<PathBuf>,
) {
    let mut roots: Vec<&str> = items.iter().map(|i| i.root_run.as_str()).collect();
    roots.sort_unstable();
    roots.dedup();
    let bar = (std::io::stderr().is_terminal() && !super::json_logs()).then(|| {
        let bar = indicatif::ProgressBar::new(roots.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} runs continued")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut counts = std::collections::BTreeMap::<&'static str, usize>::new();
    let mut notes: Vec<String> = Vec::new();
    // Chunks of whole run trees, so the bar moves while the rest still runs.
    let chunk = concurrency.saturating_mul(4).max(1);
    let mut by_root: Vec<Vec<InboxItem>> = Vec::new();
    for r in &roots {
        by_root.push(items.iter().filter(|i| i.root_run == *r).cloned().collect());
    }
    for part in by_root.chunks(chunk) {
        let these: Vec<InboxItem> = part.iter().flatten().cloned().collect();
        for (id, c) in inbox::continue_runs(store, &these, concurrency, root.clone()).await {
            let what = match &c {
                Continued::Ran(o) => match o.status {
                    RunStatus::Succeeded => "succeeded",
                    RunStatus::Interrupted => "interrupted again",
                    RunStatus::Running => "paused",
                    _ => "failed",
                },
                Continued::Queued => "queued for the workers",
                Continued::Elsewhere(_) => "continued elsewhere",
                Continued::Failed(_) => "not continued",
            };
            *counts.entry(what).or_default() += 1;
            if !matches!(&c, Continued::Ran(o) if o.status == RunStatus::Succeeded) && notes.len() < 20 {
                notes.push(format!("  {id}  {}", continued_text(&c)));
            }
            if let Some(b) = &bar {
                b.inc(1);
            }
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let summary: Vec<String> = counts.iter().map(|(what, n)| format!("{n} {what}")).collect();
    let mut text = format!("{} run(s) continued: {}", roots.len(), summary.join(", "));
    for n in &notes {
        text.push('\n');
        text.push_str(n);
    }
    stderr::say(
        Level::Info,
        "runs_continued",
        &text,
        json!({"runs": roots.len(), "ends": counts}),
    );
}
