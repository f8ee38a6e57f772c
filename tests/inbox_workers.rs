//! Decisions at batch scale on many machines (SPEC §15 with §12), on the real PostgreSQL:
//! submitted runs that stop at an `interrupt`, answered through the inbox (one by one, in
//! bulk by a filter over the run's input, and by `resume --decision`), continued by `worker`
//! processes of the binary exactly once each; questions that expire settled by a running
//! worker with no resume; a worker killed mid-way whose decided runs another worker finishes
//! without applying a decision twice.
//!
//! Needs `SWITCHYARD_TEST_DATABASE_URL`; every test works in a fresh schema, dropped after.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard::__private::inbox::{self, Actor, filter::Filter};
use switchyard::__private::record::inbox::Via;
use switchyard::__private::store::Store;
use switchyard::__private::store::any::AnyStore;
use switchyard::__private::store::inbox::{ItemQuery, Refusal};

use crate::cluster::{
    Pg, effects, latest, log_of, signal, spawn_worker, submit, wait_exit, wait_for, write_input,
};
use crate::support::{TempDir, run, switchyard};

/// Every item waits at `approve` (its question expiring after `expires`, if given), then a
/// non-idempotent command appends the payload to `effects` (every execution counted) and
/// sleeps `sleep` seconds. A command whose worker was killed before it wrote the input reads
/// nothing, and records nothing.
fn gate_flow(effects: &Path, expires: Option<&str>, sleep: &str) -> String {
    let expires = expires
        .map(|e| format!("\n      expires: {e}"))
        .unwrap_or_default();
    format!(
        r#"flow: gate
input:
  schema: {{type: object, required: [id, n], properties: {{n: {{type: integer}}}}}}
agents:
  side:
    kind: command
    run: [sh, -c, 'read -r x; [ -n "$x" ] || exit 1; printf "%s\n" "$x" >> "{effects}"; sleep {sleep}; printf "%s" "$x"']
    idempotent: false
steps:
  approve:
    interrupt:
      prompt: "item {{{{ input.id }}}}?"
      schema: {{type: object, required: [approved], properties: {{approved: {{type: boolean}}}}}}{expires}
    input: {{$.id: $.id}}
    output: {{$.approval: $}}
    next: call
  call:
    agent: side
    output: {{$.seen: $.n}}
"#,
        effects = effects.display()
    )
}

/// Runs `f` with the store of `url`, opened as the binary opens it.
fn with_store<T>(url: &str, f: impl AsyncFnOnce(&AnyStore) -> T) -> T {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = AnyStore::open(url).await.expect("the store opens");
        let out = f(&store).await;
        store.close().await;
        out
    })
}

/// Item id → (status, error kind) of each root run of batch `batch`.
fn statuses(pg: &Pg, batch: &str) -> HashMap<String, (String, Option<String>)> {
    pg.query(&format!(
        "SELECT item_id, status, error FROM run_records WHERE batch = '{batch}' AND parent_run IS NULL"
    ))
    .into_iter()
    .map(|r| {
        let kind = r["error"]
            .as_deref()
            .and_then(|e| serde_json::from_str::<Value>(e).ok())
            .and_then(|e| e["kind"].as_str().map(str::to_string));
        (
            r["item_id"].clone().expect("item id"),
            (r["status"].clone().expect("status"), kind),
        )
    })
    .collect()
}

fn count_status(pg: &Pg, batch: &str, status: &str) -> i64 {
    pg.count(&format!(
        "SELECT COUNT(*) FROM run_records WHERE batch = '{batch}' AND parent_run IS NULL AND status = '{status}'"
    ))
}

fn waiting_items(pg: &Pg) -> i64 {
    pg.count("SELECT COUNT(*) FROM inbox WHERE state = 'waiting'")
}

/// The row of `batches --json` for batch `batch`.
fn batch_row(dir: &TempDir, url: &str, batch: &str) -> Value {
    let shown = run(switchyard(dir.path()).args(["batches", "--json", "--store", url]));
    assert_eq!(shown.code(), 0, "{}", shown.stderr);
    shown
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .find(|r| r["batch"] == batch)
        .unwrap_or_else(|| panic!("no row of batch `{batch}`: {}", shown.stdout))
}

fn item_no(id: &str) -> usize {
    id.trim_start_matches("item-").parse().expect("an item number")
}

#[test]
fn workers_continue_exactly_the_decided_runs_once_each() {
    const N: usize = 30;
    let pg = Pg::new("inbox_decided");
    let dir = TempDir::new("inbox-workers-decided");
    let fx = dir.path().join("effects");
    let flow = dir.write("gate.yaml", gate_flow(&fx, None, "0"));
    write_input(&dir, N);
    let url = pg.url("sy_inbox_decided");
    let out = submit(&dir, &flow, &url, "g", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);

    let mut w = spawn_worker(&dir, &url, "w", &["--concurrency", "6", "--heartbeat", "300ms"]);
    wait_for(
        Duration::from_secs(60),
        "thirty runs waiting with their items",
        || count_status(&pg, "g", "interrupted") == N as i64 && waiting_items(&pg) == N as i64,
    );
    assert!(effects(&fx).is_empty(), "nothing passed the gate");
    let row = batch_row(&dir, &url, "g");
    assert_eq!(row["interrupted"], json!(N), "{row}");
    assert_eq!(row["queued"], json!(0), "{row}");
    // Released as they stopped: no lease is held on a waiting run.
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM runs WHERE lease_owner IS NOT NULL"),
        0
    );

    let run_of: HashMap<usize, String> = pg
        .query("SELECT id, item_id FROM run_records WHERE batch = 'g' AND parent_run IS NULL")
        .into_iter()
        .map(|r| {
            (
                item_no(r["item_id"].as_deref().unwrap()),
                r["id"].clone().unwrap(),
            )
        })
        .collect();

    // Item 0 by `resume --decision`: continued by that command, under a lease of its own.
    let resumed = run(switchyard(dir.path()).args([
        "resume",
        &run_of[&0],
        "--decision",
        r#"{"approved": true}"#,
        "--store",
        &url,
    ]));
    assert_eq!(resumed.code(), 0, "{}", resumed.stderr);

    // Items 1..10 one by one (odd ones refused by the human), by their run's id.
    let me = Actor {
        name: "tester".into(),
        via: Via::Api,
    };
    let second = with_store(&url, async |store| {
        for n in 1..10 {
            let d = json!({"approved": n % 2 == 0});
            inbox::decide(store, &run_of[&n], d, Some(format!("item {n}")), &me)
                .await
                .unwrap_or_else(|e| panic!("item {n}: {e}"));
        }
        inbox::decide(store, &run_of[&1], json!({"approved": true}), None, &me).await
    });
    // A second answer is refused, naming the first.
    match second {
        Err(inbox::DecideError::Refused {
            refusal: Refusal::Decided { actor, .. },
            ..
        }) => assert_eq!(actor, "tester"),
        other => panic!("a second answer: {other:?}"),
    }

    // Items 10..20 in bulk, by a filter over the run's input: previewed, then applied.
    let applied = with_store(&url, async |store| {
        let filter = Filter::parse("input.n >= 10 && input.n < 20").expect("the filter");
        let decision = json!({"approved": true});
        let p = inbox::preview(store, &filter, &ItemQuery::default(), Some(&decision))
            .await
            .expect("a preview");
        assert_eq!((p.matched, p.shapes), (10, 1), "{p:?}");
        inbox::apply(store, &p.token, &decision, Some("bulk".into()), &me)
            .await
            .expect("applied")
    });
    assert_eq!(applied.applied.len(), 10, "{:?}", applied.refused);
    assert!(applied.refused.is_empty(), "{:?}", applied.refused);

    // The workers continue exactly the twenty decided runs; ten stay waiting.
    wait_for(Duration::from_secs(90), "twenty decided runs to end", || {
        count_status(&pg, "g", "succeeded") == 20
    });
    let st = statuses(&pg, "g");
    for (item, (status, kind)) in &st {
        let n = item_no(item);
        let want = if n < 20 { "succeeded" } else { "interrupted" };
        assert_eq!((status.as_str(), kind), (want, &None), "{item}");
    }
    let fx = effects(&fx);
    assert_eq!(fx.len(), 20, "{fx:?}");
    assert!(fx.iter().all(|(id, n)| *n == 1 && item_no(id) < 20), "{fx:?}");
    // Each decision as given: the refused ones too went on (the flow does not route on it).
    let outputs: HashMap<usize, Value> = pg
        .query("SELECT item_id, output FROM run_records WHERE batch = 'g' AND status = 'succeeded'")
        .into_iter()
        .map(|r| {
            (
                item_no(r["item_id"].as_deref().unwrap()),
                serde_json::from_str(r["output"].as_deref().unwrap()).unwrap(),
            )
        })
        .collect();
    for n in 0..20 {
        let approved = !(1..10).contains(&n) || n % 2 == 0;
        assert_eq!(outputs[&n]["approval"], json!({"approved": approved}), "item {n}");
    }
    // Continued, not recovered: a requeued run is no takeover.
    assert_eq!(pg.count("SELECT COALESCE(MAX(recoveries), 0) FROM runs"), 0);
    assert_eq!(waiting_items(&pg), 10);
    // 20 answers recorded: `resume --decision`'s (via `cli`) among them; the refused one is not.
    assert_eq!(pg.count("SELECT COUNT(*) FROM decisions"), 20);
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM decisions d JOIN runs r ON r.id = d.root_run WHERE r.item_id = 'item-0' AND d.via = 'cli'"),
        1
    );
    let row = batch_row(&dir, &url, "g");
    assert_eq!(
        (
            &row["succeeded"],
            &row["interrupted"],
            &row["queued"],
            &row["running"]
        ),
        (&json!(20), &json!(10), &json!(0), &json!(0)),
        "{row}"
    );

    // `collect --wait` returns: every run finished or stopped waiting.
    let collected = run(switchyard(dir.path()).args([
        "collect",
        "--batch",
        "g",
        "--output",
        "out.jsonl",
        "--wait",
        "--poll",
        "0.2",
        "--store",
        &url,
    ]));
    assert_eq!(collected.code(), 3, "{}", collected.stderr);
    let lines: Vec<Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), N);
    for (i, l) in lines.iter().enumerate() {
        let want = if i < 20 { "succeeded" } else { "interrupted" };
        assert_eq!(l["status"], want, "{l}");
    }
    signal(&w, "TERM");
    assert!(
        wait_exit(&mut w, Duration::from_secs(30), "the worker").success(),
        "{}",
        log_of(&dir, "w")
    );
}

#[test]
fn a_running_worker_settles_expired_questions_without_a_resume() {
    let pg = Pg::new("inbox_expiry");
    let dir = TempDir::new("inbox-workers-expiry");
    let fx = dir.path().join("effects");
    let flow = dir.write("gate.yaml", gate_flow(&fx, Some("1s"), "0"));
    write_input(&dir, 4);
    let url = pg.url("sy_inbox_expiry");
    let out = submit(&dir, &flow, &url, "x", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);

    let mut w = spawn_worker(&dir, &url, "w", &["--concurrency", "4", "--heartbeat", "300ms"]);
    // Nobody answers, nobody resumes: the worker settles each question as it expires, and
    // continues its run, whose step fails `timeout`.
    wait_for(Duration::from_secs(60), "four runs failed", || {
        count_status(&pg, "x", "failed") == 4
    });
    let st = statuses(&pg, "x");
    assert!(
        st.values()
            .all(|(s, k)| s == "failed" && k.as_deref() == Some("timeout")),
        "{st:?}"
    );
    assert_eq!(pg.count("SELECT COUNT(*) FROM inbox WHERE state = 'expired'"), 4);
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM decisions"),
        0,
        "an expiry is no decision"
    );
    assert!(effects(&fx).is_empty(), "never an implicit approve");
    assert_eq!(pg.count("SELECT COALESCE(MAX(recoveries), 0) FROM runs"), 0);
    // A late answer is refused as expired.
    let late = with_store(&url, async |store| {
        let item = store
            .inbox()
            .list(&ItemQuery::default())
            .await
            .expect("the items")
            .remove(0);
        let me = Actor {
            name: "late".into(),
            via: Via::Cli,
        };
        inbox::decide(store, &item.id, json!({"approved": true}), None, &me).await
    });
    assert!(matches!(&late, Err(e) if e.http_status() == 410), "{late:?}");
    signal(&w, "TERM");
    assert!(
        wait_exit(&mut w, Duration::from_secs(30), "the worker").success(),
        "{}",
        log_of(&dir, "w")
    );
}

#[test]
fn a_worker_killed_mid_way_and_its_successor_apply_no_decision_twice() {
    const N: usize = 12;
    let pg = Pg::new("inbox_kill");
    let dir = TempDir::new("inbox-workers-kill");
    let fx = dir.path().join("effects");
    let flow = dir.write("gate.yaml", gate_flow(&fx, None, "1"));
    write_input(&dir, N);
    let url = pg.url("sy_inbox_kill");
    let out = submit(&dir, &flow, &url, "k", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let lease = ["--concurrency", "3", "--lease", "2s", "--heartbeat", "300ms"];

    let mut w1 = spawn_worker(&dir, &url, "w1", &lease);
    wait_for(Duration::from_secs(60), "every run waiting", || {
        count_status(&pg, "k", "interrupted") == N as i64 && waiting_items(&pg) == N as i64
    });
    let me = Actor {
        name: "tester".into(),
        via: Via::Cli,
    };
    with_store(&url, async |store| {
        let filter = Filter::parse("true").expect("the filter");
        let d = json!({"approved": true});
        let p = inbox::preview(store, &filter, &ItemQuery::default(), Some(&d))
            .await
            .expect("a preview");
        assert_eq!(p.matched, N);
        let a = inbox::apply(store, &p.token, &d, None, &me)
            .await
            .expect("applied");
        assert_eq!(a.applied.len(), N, "{:?}", a.refused);
    });
    // Killed while it works through them (three at a time, a second each).
    wait_for(Duration::from_secs(60), "some calls made", || {
        effects(&fx).len() >= 4
    });
    let _ = w1.kill();
    let _ = w1.wait();

    let mut w2 = spawn_worker(&dir, &url, "w2", &lease);
    wait_for(
        Duration::from_secs(90),
        "every run ended or stopped in doubt",
        || {
            pg.count(
                "SELECT COUNT(*) FROM run_records WHERE batch = 'k' AND parent_run IS NULL \
             AND (status = 'succeeded' OR (status = 'interrupted' AND error LIKE '%in_doubt%'))",
            ) == N as i64
        },
    );
    // Each decision was recorded once and given to its run's step once.
    assert_eq!(pg.count("SELECT COUNT(*) FROM decisions"), N as i64);
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM inbox WHERE state = 'decided'"),
        N as i64
    );
    assert_eq!(
        pg.count(
            "SELECT COUNT(*) FROM (SELECT run_id FROM steps WHERE step = 'approve' AND status = 'succeeded' \
             GROUP BY run_id HAVING COUNT(*) > 1) twice"
        ),
        0
    );
    // No call made twice; a call the kill cut short stopped its run in doubt, not made again
    // (made once, or not at all when the kill came before the command read its input).
    let fx = effects(&fx);
    let latest = latest(&pg, "k");
    assert_eq!(latest.len(), N);
    for (id, (status, kind)) in &latest {
        let made = fx.get(id).copied().unwrap_or(0);
        if status == "succeeded" {
            assert_eq!(made, 1, "{id}: {fx:?}");
        } else {
            assert_eq!(kind.as_deref(), Some("in_doubt"), "{id}: {status}");
            assert!(made <= 1, "{id} in doubt yet made {made} times");
        }
    }
    let in_doubt = count_status(&pg, "k", "interrupted");
    assert!(in_doubt <= 3, "at most the three calls in flight: {in_doubt}");
    // The in-doubt stops asked no new question of the inbox.
    assert_eq!(waiting_items(&pg), 0);
    signal(&w2, "TERM");
    assert!(
        wait_exit(&mut w2, Duration::from_secs(30), "worker 2").success(),
        "{}",
        log_of(&dir, "w2")
    );
}

/// The give-back race: a question answered after the engine last looked but while the worker
/// still holds the run is left by the answer (the run is held), and queued by the give-back.
#[test]
fn an_answer_given_while_the_worker_still_holds_the_run_is_not_lost() {
    let pg = Pg::new("inbox_race");
    let dir = TempDir::new("inbox-workers-race");
    let fx = dir.path().join("effects");
    let flow = dir.write("gate.yaml", gate_flow(&fx, None, "0"));
    write_input(&dir, 1);
    let url = pg.url("sy_inbox_race");
    let out = submit(&dir, &flow, &url, "r", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let mut w = spawn_worker(&dir, &url, "w1", &["--exit-when-idle"]);
    assert!(
        wait_exit(&mut w, Duration::from_secs(60), "worker 1").success(),
        "{}",
        log_of(&dir, "w1")
    );
    assert_eq!(waiting_items(&pg), 1);
    // The instant between the run's stop and its give-back: its worker holds it.
    pg.query("UPDATE runs SET lease_owner = 'w-held', lease_until = 9000000000000000 WHERE head IN (SELECT id FROM run_heads WHERE batch = 'r')");
    let rows = pg.query("SELECT id, lease_epoch FROM run_records WHERE batch = 'r'");
    let id = rows[0]["id"].clone().expect("the run");
    let epoch: i64 = rows[0]["lease_epoch"]
        .as_deref()
        .expect("an epoch")
        .parse()
        .expect("a number");
    let me = Actor {
        name: "tester".into(),
        via: Via::Api,
    };
    with_store(&url, async |store| {
        inbox::decide(store, &id, json!({"approved": true}), None, &me)
            .await
            .expect("decided");
    });
    assert_eq!(
        count_status(&pg, "r", "interrupted"),
        1,
        "held: the answer leaves it"
    );
    with_store(&url, async |store| {
        let AnyStore::Sql(sql) = store else {
            panic!("a SQL store")
        };
        sql.release("w-held", &[(id.clone(), epoch)])
            .await
            .expect("given back");
    });
    assert_eq!(
        count_status(&pg, "r", "queued"),
        1,
        "the give-back found the answer"
    );
    let mut w = spawn_worker(&dir, &url, "w2", &["--exit-when-idle"]);
    assert!(
        wait_exit(&mut w, Duration::from_secs(60), "worker 2").success(),
        "{}",
        log_of(&dir, "w2")
    );
    assert_eq!(count_status(&pg, "r", "succeeded"), 1, "{}", log_of(&dir, "w2"));
    assert_eq!(effects(&fx).values().copied().collect::<Vec<_>>(), vec![1]);
    assert_eq!(pg.count("SELECT COALESCE(MAX(recoveries), 0) FROM runs"), 0);
}
