//! W15 inbox (SPEC §15): the inbox of a PostgreSQL store holding `w15_items` waiting items
//! (100,000 in both profiles), the questions of as many interrupted submitted runs, in three
//! shapes (a refund's `interrupt`, an escalation's `interrupt`, an agent loop's approval of a
//! call), every run's input on record for filters to read.
//!
//! - `fill`: the runs (`insert_submitted`) and the items (`Inbox::add`, 1,000 a call), once.
//! - `groups`: `Inbox::groups` (what `inbox list` shows): counts by shape, by the database.
//! - `select`: `inbox::select` with a filter over the run's input
//!   (`input.amount >= 500 && input.region == "eu"`, a sixth of the items).
//! - `preview`: `inbox::preview` of a filter matching half the items (`input.n % 2 == 0`),
//!   its decision checked against each item's schema, stored under a token.
//! - `apply`: `inbox::apply` of that preview: every counted item answered, its decision
//!   appended, its run queued again; once (it changes the store). `transactions` counts the
//!   database's commits during it (`pg_stat_database.xact_commit`; anything else committing in
//!   that database meanwhile counts too), `chunks` the store's transactions of answers (one
//!   per 500).
//!
//! The read-only steps are timed [`RUNS`] times after a warm-up; `fill` and `apply` once.
//! The database is `SWITCHYARD_BENCH_DATABASE_URL`'s, else `SWITCHYARD_TEST_DATABASE_URL`'s,
//! else `postgres://postgres@127.0.0.1:5432/test`, in a fresh schema dropped after.

use std::time::Instant;

use serde_json::{Value, json};
use switchyard::__private::inbox::{self, Actor, filter::Filter};
use switchyard::__private::record::inbox::{InboxItem, ItemState, Via, item_id, shape_of};
use switchyard::__private::record::{self, RunRecord, RunStatus, Usage};
use switchyard::__private::store::any::AnyStore;
use switchyard::__private::store::inbox::ItemQuery;

use crate::Options;
use crate::profile::{Profile, RUNS};
use crate::report::Report;
use crate::util;

pub const ID: &str = "W15";
/// Items one `Inbox::add` call writes.
const ADD_CALL: usize = 1000;

fn base_url() -> String {
    std::env::var("SWITCHYARD_BENCH_DATABASE_URL")
        .or_else(|_| std::env::var("SWITCHYARD_TEST_DATABASE_URL"))
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A question shape: flow, step, kind, schema.
struct Shape {
    flow: &'static str,
    step: &'static str,
    kind: &'static str,
    schema: Value,
}

fn shapes() -> [Shape; 3] {
    let approved =
        json!({"type": "object", "required": ["approved"], "properties": {"approved": {"type": "boolean"}}});
    [
        Shape {
            flow: "refunds",
            step: "approve",
            kind: "interrupt",
            schema: approved.clone(),
        },
        Shape {
            flow: "tickets",
            step: "escalate",
            kind: "interrupt",
            schema: approved,
        },
        Shape {
            flow: "support",
            step: "agent",
            kind: "approval",
            schema: json!({"oneOf": [
                {"type": "object", "properties": {"approve": {"const": true}}, "required": ["approve"], "additionalProperties": false},
                {"type": "object", "properties": {"reject": {"type": "string"}}, "required": ["reject"], "additionalProperties": false},
            ]}),
        },
    ]
}

fn run_record(n: usize, shape: &Shape, now: u64) -> RunRecord {
    let region = ["eu", "us", "apac"][n % 3];
    RunRecord {
        id: format!("r{n:012}w15"),
        flow: shape.flow.to_string(),
        flow_hash: "h".to_string(),
        parent_run: None,
        parent_step: None,
        depth: 0,
        status: RunStatus::Interrupted,
        input: json!({"n": n, "customer": format!("c{n}"), "amount": (n * 7) % 1000, "region": region}),
        output: None,
        error: None,
        started_at: now,
        finished_at: Some(now),
        started_ns: None,
        finished_ns: None,
        usage: Usage::default(),
        steps: 1,
        flow_path: None,
        context: Value::Null,
        messages: None,
        batch: Some(format!("b-{}", shape.flow)),
        item_id: Some(format!("item-{n}")),
        item_index: Some(n as u64),
        now_us: None,
        agent_changes: None,
        origin: None,
        files: Vec::new(),
    }
}

fn item(r: &RunRecord, shape: &Shape, now: u64) -> InboxItem {
    let n = r.item_index.unwrap_or(0);
    let (number, calls) = if shape.kind == "approval" {
        (
            "1.t1.approval".to_string(),
            vec![json!({"id": "call_1", "tool": "refund", "arguments": {"amount": r.input["amount"]}})],
        )
    } else {
        ("1".to_string(), Vec::new())
    };
    InboxItem {
        id: item_id(&r.id, &number, None),
        run_id: r.id.clone(),
        root_run: r.id.clone(),
        number,
        iteration: None,
        flow: shape.flow.to_string(),
        step: shape.step.to_string(),
        batch: r.batch.clone(),
        item: r.item_id.clone(),
        kind: shape.kind.to_string(),
        question: format!("Refund {} to {}?", r.input["amount"], r.input["customer"]),
        schema: shape.schema.clone(),
        calls,
        shape: shape_of(shape.flow, shape.step, &shape.schema),
        created_at: now + n,
        expires_at: None,
        state: ItemState::Waiting,
        settled_at: None,
    }
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

pub fn run(profile: &Profile, _opts: &Options) -> Result<Vec<Report>, String> {
    let n = profile.w15_items;
    let rt = util::tokio_runtime()?;
    let base = base_url();
    let schema = format!("bench_w15_{}", std::process::id());
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}schema={schema}");
    let admin = |sql: String| {
        let base = base.clone();
        async move {
            use sqlx::Connection as _;
            sqlx::any::install_default_drivers();
            let mut c = sqlx::AnyConnection::connect(&base)
                .await
                .map_err(|e| format!("W15 needs PostgreSQL at {base}: {e}"))?;
            let n: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone()))
                .fetch_optional(&mut c)
                .await
                .map_err(|e| format!("{sql}: {e}"))?;
            let _ = c.close().await;
            Ok::<Option<i64>, String>(n)
        }
    };
    rt.block_on(admin(format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"")))?;
    let out = rt.block_on(measure(n, &url, &admin));
    let _ = rt.block_on(admin(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")));
    out
}

async fn measure<F, Fut>(n: usize, url: &str, admin: &F) -> Result<Vec<Report>, String>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<Option<i64>, String>>,
{
    let store = AnyStore::open(url).await.map_err(|e| e.to_string())?;
    let AnyStore::Sql(sql) = &store else {
        return Err("W15 needs a SQL store".into());
    };
    let shapes = shapes();
    let now = record::now_ms();
    let mut reports = Vec::new();

    // Fill: the runs, then their items.
    let t = Instant::now();
    let runs: Vec<RunRecord> = (0..n).map(|i| run_record(i, &shapes[i % 3], now)).collect();
    for chunk in runs.chunks(10_000) {
        sql.insert_submitted(chunk).await.map_err(|e| e.to_string())?;
    }
    let items: Vec<InboxItem> = runs
        .iter()
        .map(|r| item(r, &shapes[r.item_index.unwrap_or(0) as usize % 3], now))
        .collect();
    let inbox = switchyard::__private::store::Store::inbox(&store);
    for chunk in items.chunks(ADD_CALL) {
        inbox.add(chunk).await.map_err(|e| e.to_string())?;
    }
    let fill = secs(t);
    eprintln!("W15 fill: {n} runs and items in {fill:.2} s");
    reports.push(Report::new(
        ID,
        "fill_s",
        n as u64,
        vec![fill],
        "insert_submitted + Inbox::add, 1,000 items a call",
    ));
    admin(format!("ANALYZE \"{}\".inbox", schema_of(url))).await.ok();

    // Groups.
    let mut samples = Vec::new();
    for rep in 0..=RUNS {
        let t = Instant::now();
        let groups = inbox
            .groups(&ItemQuery::default())
            .await
            .map_err(|e| e.to_string())?;
        let s = secs(t);
        let total: u64 = groups.iter().map(|g| g.count).sum();
        if groups.len() != 3 || total != n as u64 {
            return Err(format!("groups: {} shapes, {total} items", groups.len()));
        }
        eprintln!("W15 {}: {s:.3} s", if rep == 0 { "warm-up" } else { "sample" });
        if rep > 0 {
            samples.push(s);
        }
    }
    reports.push(Report::new(
        ID,
        "groups_s",
        n as u64,
        samples,
        "Inbox::groups over every waiting item: 3 shapes",
    ));

    // A filtered selection over the runs' inputs.
    let filter = Filter::parse(r#"input.amount >= 500 && input.region == "eu""#).map_err(|e| e.render())?;
    let want = runs
        .iter()
        .filter(|r| r.input["amount"].as_u64().unwrap_or(0) >= 500 && r.input["region"] == "eu")
        .count();
    let mut samples = Vec::new();
    for rep in 0..=RUNS {
        let t = Instant::now();
        let (got, failed) = inbox::select(&store, &ItemQuery::default(), Some(&filter))
            .await
            .map_err(|e| e.to_string())?;
        let s = secs(t);
        if got.len() != want || !failed.is_empty() {
            return Err(format!(
                "select: {} matched (want {want}), {} failed",
                got.len(),
                failed.len()
            ));
        }
        eprintln!("W15 {}: {s:.3} s", if rep == 0 { "warm-up" } else { "sample" });
        if rep > 0 {
            samples.push(s);
        }
    }
    reports.push(Report::new(
        ID,
        "select_s",
        n as u64,
        samples,
        format!("inbox::select with a filter over input: {want} matched"),
    ));

    // Preview half of them.
    let half = Filter::parse("input.n % 2 == 0").map_err(|e| e.render())?;
    let interrupt_decision = json!({"approved": true});
    let mut samples = Vec::new();
    let mut token = String::new();
    let mut matched = 0;
    for rep in 0..=RUNS {
        let t = Instant::now();
        let p = inbox::preview(&store, &half, &ItemQuery::default(), Some(&interrupt_decision))
            .await
            .map_err(|e| e.to_string())?;
        let s = secs(t);
        if p.matched != n.div_ceil(2) || p.shapes != 3 {
            return Err(format!("preview: {} matched, {} shapes", p.matched, p.shapes));
        }
        eprintln!("W15 {}: {s:.3} s", if rep == 0 { "warm-up" } else { "sample" });
        if rep > 0 {
            samples.push(s);
        }
        token = p.token;
        matched = p.matched;
    }
    reports.push(Report::new(
        ID,
        "preview_s",
        n as u64,
        samples,
        format!("inbox::preview of half the items: {matched} matched, 3 shapes"),
    ));

    // Apply: the interrupts' items take the decision, the approvals' are refused by their schema.
    let commits =
        "SELECT xact_commit::BIGINT FROM pg_stat_database WHERE datname = current_database()".to_string();
    let before = admin(commits.clone()).await?.unwrap_or(0);
    let actor = Actor {
        name: "bench".into(),
        via: Via::Cli,
    };
    let t = Instant::now();
    let applied = inbox::apply(&store, &token, &interrupt_decision, None, &actor)
        .await
        .map_err(|e| e.to_string())?;
    let s = secs(t);
    let after = admin(commits).await?.unwrap_or(0);
    eprintln!("W15 apply: {s:.3} s, {} commits", after - before);
    let approvals = (0..n).filter(|i| i % 2 == 0 && i % 3 == 2).count();
    if applied.applied.len() != matched - approvals || applied.refused.len() != approvals {
        return Err(format!(
            "apply: {} applied, {} refused (want {} and {approvals})",
            applied.applied.len(),
            applied.refused.len(),
            matched - approvals
        ));
    }
    let queued = admin(format!(
        "SELECT COUNT(*) FROM \"{}\".runs WHERE status = 'queued'",
        schema_of(url)
    ))
    .await?
    .unwrap_or(0);
    if queued != applied.applied.len() as i64 {
        return Err(format!(
            "apply: {queued} runs queued again, want {}",
            applied.applied.len()
        ));
    }
    let answered = applied.applied.len();
    reports.push(Report::new(
        ID,
        "apply_s",
        answered as u64,
        vec![s],
        format!("inbox::apply of the preview: {answered} answered and queued again, {approvals} refused by their schema"),
    ));
    reports.push(Report::new(
        ID,
        "apply_transactions",
        answered as u64,
        vec![(after - before) as f64],
        format!(
            "commits in the database during apply; {} chunks of 500 answers",
            answered.div_ceil(500)
        ),
    ));
    store.close().await;
    Ok(reports)
}

fn schema_of(url: &str) -> String {
    url.split("schema=")
        .nth(1)
        .unwrap_or_default()
        .split('&')
        .next()
        .unwrap_or_default()
        .to_string()
}
