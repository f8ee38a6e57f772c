//! The stores, through the library: every store keeps the same records the same way
//! ([`contract`], run against memory, SQLite and PostgreSQL), SQLite durability under many
//! concurrent writers, and the faults users meet — a store from a newer switchyard, a store
//! locked by someone else, a full disk — each a clear error with nothing lost.
//!
//! The PostgreSQL tests need `SWITCHYARD_TEST_DATABASE_URL`; they fail, never skip, without it.
//! Each uses a fresh schema, dropped at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::{AnyConnection, Connection};
use switchyard::__private::record::cost::Cost;
use switchyard::__private::record::{ErrorKind, StepError};
use switchyard::__private::record::{Origin, RunRecord, RunStatus, StepRecord, StepStatus, Usage};
use switchyard::__private::runtime::data::{Change, Violation};
use switchyard::__private::store::memory::MemoryStore;
use switchyard::__private::store::sql::{SCHEMA_VERSION, SqlOptions, SqlStore};
use switchyard::__private::store::{RunFilter, Store, StoreError};

use crate::support::TempDir;

// ---------------------------------------------------------------- records

/// A run with every optional field set (`full`) or none.
pub(crate) fn run(id: &str, flow: &str, started_at: u64, status: RunStatus, full: bool) -> RunRecord {
    RunRecord {
        id: id.into(),
        flow: flow.into(),
        flow_hash: format!("sha256:{flow}"),
        parent_run: full.then(|| "parent".into()),
        parent_step: full.then(|| "3".into()),
        depth: if full { 2 } else { 0 },
        status,
        input: json!({"z": 1, "a": [1, 2.5, -0.0, 1e300, 18446744073709551615u64], "é": "ünï\n\"q\"", "n": null}),
        output: full.then(|| json!({"answer": 42, "nested": {"b": true, "a": [{}]}})),
        error: full.then(|| {
            StepError::new(ErrorKind::Custom("rejected".into()), "no")
                .with_details(json!({"why": [1, "two"]}))
        }),
        started_at,
        finished_at: full.then_some(started_at + 1234),
        started_ns: None,
        finished_ns: None,
        usage: Usage {
            input_tokens: 1_000_000,
            output_tokens: 7,
            cost_usd: Cost::from_usd(0.1 + 0.2).unwrap(),
            cost_unknown_calls: u64::from(full) * 3,
        },
        steps: 9,
        context: if full {
            json!({"tenant": "acme", "n": [1]})
        } else {
            serde_json::Value::Null
        },
        batch: full.then(|| "/data/out.jsonl".into()),
        item_id: full.then(|| "ticket-7".into()),
        item_index: full.then_some(6),
        flow_path: full.then(|| "/data/flows/triage.yaml".into()),
        messages: full.then(|| json!([{"role": "user", "content": "hi"}])),
        now_us: full.then_some(1_764_633_600_123_456),
        agent_changes: full.then(|| json!([{"scope": "root", "mode": "remove", "agents": ["refund"]}])),
        origin: full.then_some(Origin::Mcp),
        files: files(full),
    }
}

/// The files of a record with every optional field set, or none.
fn files(full: bool) -> Vec<switchyard::__private::record::RunFile> {
    if !full {
        return Vec::new();
    }
    vec![switchyard::__private::record::RunFile {
        number: "2.t1.1".into(),
        file: switchyard::__private::record::FileRef {
            file: format!("sha256:{}", "3a".repeat(32)),
            name: "out/chart.png".into(),
            media_type: "image/png".into(),
            size: 48211,
        },
    }]
}

/// A step record with every optional field set (`full`) or none.
pub(crate) fn step(run_id: &str, number: &str, attempt: u32, status: StepStatus, full: bool) -> StepRecord {
    StepRecord {
        run_id: run_id.into(),
        number: number.into(),
        step: format!("step_{number}"),
        kind: "agent".into(),
        attempt,
        status,
        iteration: full.then_some(4),
        iterations: full.then_some(10),
        input: full.then(|| json!({"ticket": {"body": "x", "id": 7}})),
        result: full.then(|| Arc::new(json!([1, "two", {"three": 3.25}]))),
        changes: if full {
            vec![Change {
                path: "$.tier".into(),
                value: Arc::new(json!("high")),
            }]
        } else {
            vec![]
        },
        violations: if full {
            vec![Violation {
                path: "$.secret".into(),
                reason: "not in the output allowlist".into(),
            }]
        } else {
            vec![]
        },
        error: full.then(|| StepError::new(ErrorKind::Timeout, "timed out after 30ms")),
        started_at: 1_700_000_000_000,
        finished_at: full.then_some(1_700_000_000_050),
        started_ns: None,
        finished_ns: None,
        usage: Usage {
            input_tokens: 3,
            output_tokens: 4,
            cost_usd: Cost::from_nanos(1),
            cost_unknown_calls: u64::from(full) * 2,
        },
        child_run: full.then(|| "child".into()),
        route: full.then(|| "end".into()),
        answers: full.then(|| json!([{"answer": "prose", "repair_request": "JSON, please"}])),
        files: files(full),
    }
}

fn json_text<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("serializes")
}

fn ids(runs: &[RunRecord]) -> Vec<&str> {
    runs.iter().map(|r| r.id.as_str()).collect()
}

// ---------------------------------------------------------------- the contract

/// What every store must do, the same way.
async fn contract<S: Store>(store: &S) {
    // Runs round-trip exactly, JSON key order and numbers included.
    let full = run("r1", "triage", 1_000, RunStatus::Failed, true);
    let bare = run("r2", "triage", 2_000, RunStatus::Running, false);
    for r in [&full, &bare] {
        store.create_run(r).await.expect("create_run");
        let back = store.get_run(&r.id).await.expect("get_run");
        assert_eq!(&back, r);
        assert_eq!(json_text(&back), json_text(r), "JSON text differs");
    }
    assert!(matches!(store.get_run("nope").await, Err(StoreError::NotFound(id)) if id == "nope"));

    // Updates replace the record; updating a missing run is NotFound.
    let mut done = bare.clone();
    done.status = RunStatus::Succeeded;
    done.output = Some(json!({"ok": true}));
    done.finished_at = Some(2_500);
    store.update_run(&done).await.expect("update_run");
    assert_eq!(store.get_run("r2").await.expect("get_run"), done);
    let ghost = run("ghost", "triage", 1, RunStatus::Running, false);
    assert!(matches!(store.update_run(&ghost).await, Err(StoreError::NotFound(id)) if id == "ghost"));

    // Steps round-trip; a `started` attempt is replaced by its outcome, keeping its place.
    let s1 = step("r1", "1", 1, StepStatus::Succeeded, true);
    let started = step("r1", "2", 1, StepStatus::Started, false);
    let s3 = step("r1", "3", 1, StepStatus::Succeeded, false);
    for s in [&s1, &started, &s3] {
        store.record_step(s.clone()).await.expect("record_step");
    }
    let mut finished = step("r1", "2", 1, StepStatus::Failed, true);
    finished.iteration = None;
    store.record_step(finished.clone()).await.expect("record_step");
    let retry = step("r1", "2", 2, StepStatus::Succeeded, false);
    store.record_step(retry.clone()).await.expect("record_step");
    let steps = store.steps("r1").await.expect("steps");
    assert_eq!(
        steps,
        vec![s1.clone(), finished.clone(), s3.clone(), retry.clone()]
    );
    assert_eq!(json_text(&steps[0]), json_text(&s1), "JSON text differs");
    // The same number, attempt and a different iteration is another record.
    let mut other_iteration = s1.clone();
    other_iteration.iteration = Some(5);
    store
        .record_step(other_iteration.clone())
        .await
        .expect("record_step");
    let latest = store.latest_steps("r1").await.expect("latest_steps");
    assert_eq!(latest, vec![s1, s3, retry, other_iteration]);
    assert!(store.steps("r2").await.expect("steps").is_empty());

    // Listing: newest first, filtered, limited; unfinished runs oldest first.
    store
        .create_run(&run("r3", "summarize", 3_000, RunStatus::Running, false))
        .await
        .expect("create_run");
    let child = RunRecord {
        parent_run: Some("r1".into()),
        ..run("r4", "child", 4_000, RunStatus::Running, false)
    };
    store.create_run(&child).await.expect("create_run");
    let list = |f: RunFilter| async move { store.list_runs(&f).await.expect("list_runs") };
    assert_eq!(ids(&list(RunFilter::default()).await), ["r4", "r3", "r2", "r1"]);
    assert_eq!(
        ids(&list(RunFilter {
            status: Some(RunStatus::Running),
            ..Default::default()
        })
        .await),
        ["r4", "r3"]
    );
    assert_eq!(
        ids(&list(RunFilter {
            flow: Some("triage".into()),
            ..Default::default()
        })
        .await),
        ["r2", "r1"]
    );
    let both = RunFilter {
        status: Some(RunStatus::Failed),
        flow: Some("triage".into()),
        ..Default::default()
    };
    assert_eq!(ids(&list(both).await), ["r1"]);
    assert_eq!(
        ids(&list(RunFilter {
            roots_only: true,
            ..Default::default()
        })
        .await),
        ["r3", "r2"]
    );
    assert_eq!(
        ids(&list(RunFilter {
            batches: vec!["/elsewhere/out.jsonl".into(), "/data/out.jsonl".into()],
            ..Default::default()
        })
        .await),
        ["r1"]
    );
    assert_eq!(
        ids(&list(RunFilter {
            limit: Some(2),
            ..Default::default()
        })
        .await),
        ["r4", "r3"]
    );
    let unfinished = store
        .unfinished_runs(&RunFilter::default())
        .await
        .expect("unfinished_runs");
    assert_eq!(ids(&unfinished), ["r3", "r4"]);
    let filter = RunFilter {
        flow: Some("child".into()),
        status: Some(RunStatus::Failed),
        limit: Some(5),
        ..Default::default()
    };
    assert_eq!(
        ids(&store.unfinished_runs(&filter).await.expect("unfinished_runs")),
        ["r4"]
    );

    // Children.
    assert_eq!(store.children("r1").await.expect("children"), vec![child]);
    assert!(store.children("r4").await.expect("children").is_empty());

    // Batch runs: by item index, an item's later run after its earlier one, from an index on.
    let item = |id: &str, index: u64, started_at: u64| RunRecord {
        batch: Some("b".into()),
        item_id: Some(format!("item-{index}")),
        item_index: Some(index),
        ..run(id, "triage", started_at, RunStatus::Succeeded, false)
    };
    for r in [
        item("b2", 2, 10),
        item("b0", 0, 11),
        item("b1", 1, 12),
        item("b0again", 0, 13),
    ] {
        store.create_run(&r).await.expect("create_run");
    }
    let got = store.batch_runs("b", 0, 10).await.expect("batch_runs");
    assert_eq!(ids(&got), ["b0", "b0again", "b1", "b2"]);
    assert_eq!(got[3], item("b2", 2, 10));
    assert_eq!(
        ids(&store.batch_runs("b", 1, 1).await.expect("batch_runs")),
        ["b1"]
    );
    assert!(
        store
            .batch_runs("other", 0, 10)
            .await
            .expect("batch_runs")
            .is_empty()
    );
}

#[tokio::test]
async fn the_memory_store_keeps_the_contract() {
    contract(&MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_memory_sqlite_store_keeps_the_contract() {
    let store = SqlStore::open("sqlite::memory:").await.expect("opens");
    contract(&store).await;
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_file_keeps_the_contract_across_reopening() {
    let dir = TempDir::new("store-contract");
    let path = dir.path().join("deep/er/runs.db");
    let url = format!("sqlite:{}", path.display());
    let store = SqlStore::open(&url)
        .await
        .expect("opens, creating the directories");
    assert_eq!(store.name(), path.display().to_string());
    contract(&store).await;
    store.close().await;

    let store = SqlStore::open(&url).await.expect("reopens");
    assert_eq!(
        store
            .list_runs(&RunFilter::default())
            .await
            .expect("list_runs")
            .len(),
        8
    );
    assert_eq!(store.steps("r1").await.expect("steps").len(), 5);
    assert_eq!(pragma(&path, "journal_mode").await, "wal");
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_store_urls_say_what_is_expected() {
    let err = SqlStore::open("mysql://localhost/x")
        .await
        .expect_err("not a store URL");
    assert!(matches!(err, StoreError::BadUrl { .. }), "{err}");
    assert!(err.to_string().contains("expected `sqlite:PATH`"), "{err}");
    let err = SqlStore::open_with(
        "sqlite::memory:",
        SqlOptions {
            schema: Some("x".into()),
            ..Default::default()
        },
    )
    .await
    .expect_err("no schemas in SQLite");
    assert!(
        err.to_string().contains("only PostgreSQL stores have schemas"),
        "{err}"
    );
}

// ---------------------------------------------------------------- SQLite under load and faults

/// Records `tasks × steps` step records from concurrent tasks, each run created first.
async fn write_concurrently(store: &Arc<SqlStore>, tasks: usize, steps: usize) {
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let store = store.clone();
        set.spawn(async move {
            let id = format!("run-{t:04}");
            store
                .create_run(&run(&id, "load", t as u64, RunStatus::Running, false))
                .await
                .expect("create_run");
            for n in 1..=steps {
                let status = if n % 2 == 0 {
                    StepStatus::Succeeded
                } else {
                    StepStatus::Started
                };
                store
                    .record_step(step(&id, &n.to_string(), 1, status, n % 3 == 0))
                    .await
                    .expect("record_step");
            }
            let mut done = run(&id, "load", t as u64, RunStatus::Succeeded, false);
            done.steps = steps as u64;
            store.update_run(&done).await.expect("update_run");
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("writer task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_are_all_recorded_durably() {
    let dir = TempDir::new("store-concurrent");
    let path = dir.path().join("runs.db");
    let url = format!("sqlite:{}", path.display());
    let store = Arc::new(SqlStore::open(&url).await.expect("opens"));
    write_concurrently(&store, 200, 20).await;
    // Drop without closing: whatever returned Ok is committed already.
    drop(store);

    let mut conn = raw(&path).await;
    let steps: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM steps")
        .fetch_one(&mut conn)
        .await
        .expect("count");
    let runs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM runs WHERE status = 'succeeded' AND steps = 20")
        .fetch_one(&mut conn)
        .await
        .expect("count");
    conn.close().await.expect("close");
    assert_eq!((runs, steps), (200, 4000));

    let store = SqlStore::open(&url).await.expect("reopens");
    let steps = store.steps("run-0123").await.expect("steps");
    let numbers: Vec<String> = steps.iter().map(|s| s.number.clone()).collect();
    assert_eq!(
        numbers,
        (1..=20).map(|n| n.to_string()).collect::<Vec<_>>(),
        "record order"
    );
    assert_eq!(steps[2], step("run-0123", "3", 1, StepStatus::Started, true));
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_record_fails_alone_in_a_group_commit() {
    let store = Arc::new(SqlStore::open("sqlite::memory:").await.expect("opens"));
    store
        .create_run(&run("real", "f", 1, RunStatus::Running, false))
        .await
        .expect("create_run");
    let mut set = tokio::task::JoinSet::new();
    for n in 0..300 {
        let store = store.clone();
        set.spawn(async move {
            let run_id = if n == 150 { "ghost" } else { "real" };
            (
                n,
                store
                    .record_step(step(run_id, &n.to_string(), 1, StepStatus::Succeeded, false))
                    .await,
            )
        });
    }
    let mut failed = Vec::new();
    while let Some(r) = set.join_next().await {
        let (n, outcome) = r.expect("task");
        if let Err(e) = outcome {
            failed.push((n, e.to_string()));
        }
    }
    assert_eq!(failed, [(150, "run `ghost` not found".to_string())]);
    assert_eq!(store.steps("real").await.expect("steps").len(), 299);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_a_newer_switchyard_is_refused_untouched() {
    let dir = TempDir::new("store-newer");
    let path = dir.path().join("runs.db");
    let url = format!("sqlite:{}", path.display());
    let store = SqlStore::open(&url).await.expect("opens");
    store
        .create_run(&run("r1", "f", 1, RunStatus::Running, true))
        .await
        .expect("create_run");
    store.close().await;
    let mut conn = raw(&path).await;
    sqlx::query("INSERT INTO schema_version (version, applied_at, description) VALUES (99, 0, 'the future')")
        .execute(&mut conn)
        .await
        .expect("bump the version");
    conn.close().await.expect("close");
    let before = std::fs::read(&path).expect("read");

    let err = SqlStore::open(&url).await.expect_err("a newer schema");
    assert!(
        matches!(
            err,
            StoreError::NewerSchema {
                found: 99,
                supported: SCHEMA_VERSION,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "the store at {} was written by a newer switchyard (schema 99; this one knows up to {SCHEMA_VERSION})",
            path.display()
        )
    );
    assert!(
        std::fs::read(&path).expect("read") == before,
        "the store file changed"
    );

    // Through the command line: `batch` and `run` refuse it the same way, before running
    // anything or writing an output file.
    dir.write("in.jsonl", "{\"id\": 1}\n");
    let flow = dir.write("f.yaml", crate::support::CLEAN_FLOW);
    let store_arg = format!("--store=sqlite:{}", path.display());
    let out = crate::support::run(
        crate::support::switchyard(dir.path())
            .arg("batch")
            .arg(&flow)
            .args(["--input", "in.jsonl", "--output", "out.jsonl", &store_arg]),
    );
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("was written by a newer switchyard (schema 99"),
        "{}",
        out.stderr
    );
    assert!(!dir.path().join("out.jsonl").exists());
    let out = crate::support::run(
        crate::support::switchyard(dir.path())
            .arg("run")
            .arg(&flow)
            .arg(&store_arg),
    );
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("newer switchyard"), "{}", out.stderr);
    assert!(
        std::fs::read(&path).expect("read") == before,
        "the store file changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_store_fails_within_the_busy_timeout_and_recovers() {
    let dir = TempDir::new("store-locked");
    let path = dir.path().join("runs.db");
    let url = format!("sqlite:{}", path.display());
    let options = SqlOptions {
        busy_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let store = SqlStore::open_with(&url, options).await.expect("opens");
    store
        .create_run(&run("r1", "f", 1, RunStatus::Running, false))
        .await
        .expect("create_run");

    // Another connection — as another process would — holds the write lock.
    let mut other = raw(&path).await;
    sqlx::raw_sql("BEGIN EXCLUSIVE")
        .execute(&mut other)
        .await
        .expect("lock");
    let t0 = Instant::now();
    let err = store
        .record_step(step("r1", "1", 1, StepStatus::Started, false))
        .await
        .expect_err("locked");
    let waited = t0.elapsed();
    assert!(
        matches!(err, StoreError::Locked { waited_ms: 300, .. }),
        "{err:?}"
    );
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
        "waited {waited:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "the store {} is locked by another process: gave up recording step `1` (attempt 1) of run `r1` \
             after waiting 300 ms",
            path.display()
        )
    );
    // Reads still work under WAL.
    assert_eq!(store.get_run("r1").await.expect("get_run").id, "r1");

    sqlx::raw_sql("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("unlock");
    other.close().await.expect("close");
    store
        .record_step(step("r1", "1", 1, StepStatus::Succeeded, false))
        .await
        .expect("records once unlocked");
    assert_eq!(store.steps("r1").await.expect("steps").len(), 1);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_clearly_and_keeps_what_was_recorded() {
    let dir = TempDir::new("store-full");
    let path = dir.path().join("runs.db");
    let url = format!("sqlite:{}", path.display());
    // A size cap (in pages) stands in for a tiny filesystem: SQLite reports SQLITE_FULL either way.
    let options = SqlOptions {
        max_pages: Some(60),
        ..Default::default()
    };
    let store = SqlStore::open_with(&url, options).await.expect("opens");
    store
        .create_run(&run("r1", "f", 1, RunStatus::Running, false))
        .await
        .expect("create_run");
    let big = "x".repeat(6000);
    let mut recorded = 0;
    let err = loop {
        let mut s = step("r1", &(recorded + 1).to_string(), 1, StepStatus::Succeeded, false);
        s.result = Some(Arc::new(json!({ "text": big })));
        match store.record_step(s.clone()).await {
            Ok(()) => recorded += 1,
            Err(e) => break e,
        }
        assert!(recorded < 1000, "the size cap never hit");
    };
    assert!(recorded > 0, "nothing fit");
    assert!(matches!(err, StoreError::DiskFull { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "the disk holding the store {} is full while recording step `{}` (attempt 1) of run `r1`: nothing \
             from there on was recorded; what was recorded before is intact",
            path.display(),
            recorded + 1
        )
    );
    store.close().await;

    let store = SqlStore::open(&url).await.expect("reopens without the cap");
    assert_eq!(store.steps("r1").await.expect("steps").len(), recorded);
    store.close().await;
    assert_eq!(pragma(&path, "integrity_check").await, "ok");
}

/// Writes sent together, so that the writer takes them as one batch: the records of one run
/// keep their order, the last of two writes for one key wins in the place of the first, and
/// an update of a missing run fails alone.
async fn writes_sent_together(store: &SqlStore) {
    // Records as the engine hands them over, not boxed.
    #[allow(clippy::large_enum_variant)]
    enum W {
        Step(StepRecord),
        Update(RunRecord),
    }
    store
        .create_run(&run("t", "f", 1, RunStatus::Running, false))
        .await
        .expect("create_run");
    let mut writes: Vec<W> = (0..100)
        .map(|n| W::Step(step("t", &n.to_string(), 1, StepStatus::Succeeded, n % 2 == 0)))
        .collect();
    let dup_done = StepRecord {
        iteration: None,
        ..step("t", "dup", 1, StepStatus::Succeeded, true)
    };
    writes[10] = W::Step(step("t", "dup", 1, StepStatus::Started, false));
    writes[50] = W::Step(dup_done.clone());
    writes[60] = W::Update(run("ghost", "f", 1, RunStatus::Failed, false));
    writes[70] = W::Update(run("t", "f", 1, RunStatus::Failed, false));
    writes[80] = W::Update(run("t", "f", 1, RunStatus::Succeeded, true));
    // Polled in order before the writer runs (a current-thread runtime): all in one queue.
    let outcomes = futures_util::future::join_all(writes.iter().map(|w| async move {
        match w {
            W::Step(s) => store.record_step(s.clone()).await,
            W::Update(r) => store.update_run(r).await,
        }
    }))
    .await;
    for (i, outcome) in outcomes.iter().enumerate() {
        match (i, outcome) {
            (60, Err(StoreError::NotFound(id))) if id == "ghost" => {}
            (60, other) => panic!("the update of a missing run: {other:?}"),
            (_, Err(e)) => panic!("write {i}: {e}"),
            _ => {}
        }
    }
    let expected: Vec<StepRecord> = writes
        .iter()
        .enumerate()
        .filter_map(|(i, w)| match (i, w) {
            (50, _) => None,
            (10, _) => Some(dup_done.clone()),
            (_, W::Step(s)) => Some(s.clone()),
            (_, W::Update(_)) => None,
        })
        .collect();
    let got = store.steps("t").await.expect("steps");
    let summary = |steps: &[StepRecord]| {
        steps
            .iter()
            .map(|s| (s.number.clone(), s.status))
            .collect::<Vec<_>>()
    };
    assert_eq!(summary(&got), summary(&expected));
    assert!(got == expected, "the records differ");
    assert_eq!(
        store.get_run("t").await.expect("get_run"),
        run("t", "f", 1, RunStatus::Succeeded, true)
    );
}

#[tokio::test]
async fn sqlite_writes_sent_together_keep_their_order() {
    let dir = TempDir::new("store-together");
    let store = SqlStore::open(&format!("sqlite:{}", dir.path().join("runs.db").display()))
        .await
        .expect("opens");
    writes_sent_together(&store).await;
    store.close().await;
}

/// A plain connection to a SQLite file, beside the store's own.
pub(crate) async fn raw(path: &std::path::Path) -> AnyConnection {
    sqlx::any::install_default_drivers();
    AnyConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("raw connection")
}

async fn pragma(path: &std::path::Path, name: &str) -> String {
    let mut conn = raw(path).await;
    let v: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("PRAGMA {name}")))
        .fetch_one(&mut conn)
        .await
        .expect("pragma");
    conn.close().await.expect("close");
    v
}

// ---------------------------------------------------------------- PostgreSQL

const PG_VAR: &str = "SWITCHYARD_TEST_DATABASE_URL";

/// A fresh schema in the test database, dropped when this goes out of scope.
struct PgSchema {
    url: String,
    name: String,
}

impl PgSchema {
    fn new() -> PgSchema {
        let url = std::env::var(PG_VAR).unwrap_or_else(|_| {
            panic!(
                "{PG_VAR} is not set: the PostgreSQL store tests need a database and do not skip. \
                 Run them with e.g. `export {PG_VAR}=postgres://postgres@127.0.0.1:5432/test`"
            )
        });
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!(
            "sy_test_{}_{nanos}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        PgSchema { url, name }
    }

    async fn open(&self) -> SqlStore {
        self.try_open()
            .await
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.url))
    }

    async fn try_open(&self) -> Result<SqlStore, StoreError> {
        let options = SqlOptions {
            schema: Some(self.name.clone()),
            ..Default::default()
        };
        SqlStore::open_with(&self.url, options).await
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let mut conn = AnyConnection::connect(&url).await?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS \"{name}\" CASCADE"
                )))
                .execute(&mut conn)
                .await?;
                conn.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) && !std::thread::panicking() {
            panic!("cannot drop the test schema {}: {dropped:?}", self.name);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_contract() {
    let schema = PgSchema::new();
    let store = schema.open().await;
    contract(&store).await;
    store.close().await;
    // Reopening finds the schema current and the records there.
    let store = schema.open().await;
    assert_eq!(store.steps("r1").await.expect("steps").len(), 5);
    store.close().await;
}

#[tokio::test]
async fn postgres_writes_sent_together_keep_their_order() {
    let schema = PgSchema::new();
    let store = schema.open().await;
    writes_sent_together(&store).await;
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_group_commits_concurrent_writers() {
    let schema = PgSchema::new();
    let store = Arc::new(schema.open().await);
    write_concurrently(&store, 50, 10).await;
    let all = store
        .list_runs(&RunFilter {
            status: Some(RunStatus::Succeeded),
            ..Default::default()
        })
        .await;
    assert_eq!(all.expect("list_runs").len(), 50);
    assert_eq!(store.steps("run-0007").await.expect("steps").len(), 10);
    Arc::into_inner(store).expect("the only reference").close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_newer_schema() {
    let schema = PgSchema::new();
    schema.open().await.close().await;
    let mut conn = AnyConnection::connect(&schema.url).await.expect("connect");
    let bump = format!(
        "INSERT INTO \"{}\".schema_version VALUES ({}, 0, 'the future')",
        schema.name,
        SCHEMA_VERSION + 1
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(bump))
        .execute(&mut conn)
        .await
        .expect("bump");
    conn.close().await.expect("close");
    let options = SqlOptions {
        schema: Some(schema.name.clone()),
        ..Default::default()
    };
    let err = SqlStore::open_with(&schema.url, options)
        .await
        .expect_err("newer");
    assert!(
        matches!(err, StoreError::NewerSchema { found, .. } if found == SCHEMA_VERSION + 1),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&format!("?schema={}", schema.name)),
        "{err}"
    );
}

/// A PostgreSQL store of schema 4 is brought up to date when opened: its runs read back
/// without a `now`, and new runs record theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_upgrades_a_schema_4_store() {
    let schema = PgSchema::new();
    let store = schema.open().await;
    let old = RunRecord {
        now_us: None,
        agent_changes: None,
        origin: None,
        files: Vec::new(),
        ..run("old", "f", 1_000, RunStatus::Interrupted, true)
    };
    store.create_run(&old).await.expect("create_run");
    store.close().await;
    let mut conn = AnyConnection::connect(&schema.url).await.expect("connect");
    let downgrade = format!(
        "SET search_path TO \"{0}\"; {1}",
        schema.name,
        SCHEMA_5_TO_4.join("; ")
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(downgrade))
        .execute(&mut conn)
        .await
        .expect("downgrade");
    conn.close().await.expect("close");

    let store = schema.open().await;
    // Counted before the store knew calls of unknown cost: none, read as 0.
    let old = RunRecord {
        usage: Usage {
            cost_unknown_calls: 0,
            ..old.usage
        },
        ..old
    };
    assert_eq!(store.get_run("old").await.expect("the old run"), old);
    let new = run("new", "f", 2_000, RunStatus::Running, true);
    assert!(new.now_us.is_some());
    store.create_run(&new).await.expect("create_run");
    assert_eq!(store.get_run("new").await.expect("the new run"), new);
    store.close().await;
    let mut conn = AnyConnection::connect(&schema.url).await.expect("connect");
    let version: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT MAX(version) FROM \"{}\".schema_version",
        schema.name
    )))
    .fetch_one(&mut conn)
    .await
    .expect("a version");
    conn.close().await.expect("close");
    assert_eq!(version, SCHEMA_VERSION);
}

/// A PostgreSQL store that cannot be opened says why at once: the server's refusal, or its own
/// message without the position in its source that the driver appends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_that_cannot_be_opened_says_why_at_once() {
    let url = std::env::var(PG_VAR).unwrap_or_else(|_| panic!("{PG_VAR} is not set"));
    let (base, _db) = url.rsplit_once('/').expect("a database in the URL");
    let refused = SqlStore::open("postgres://postgres@127.0.0.1:1/test")
        .await
        .expect_err("nothing listens on port 1");
    assert!(refused.to_string().contains("Connection refused"), "{refused}");
    for missing in [
        format!("{base}/sy_no_such_database"),
        format!("{base}/sy_no_such_database?schema=s"),
    ] {
        let err = SqlStore::open(&missing).await.expect_err("no such database");
        let msg = err.to_string();
        assert!(
            msg.ends_with("the database said: database \"sy_no_such_database\" does not exist"),
            "{msg}"
        );
    }
}

/// Processes opening a new PostgreSQL schema at the same moment all open it: creating and
/// migrating it take turns (`CREATE SCHEMA IF NOT EXISTS` alone races).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_stores_opened_together_on_a_new_schema_all_open() {
    for _ in 0..3 {
        let schema = PgSchema::new();
        let opened = futures_util::future::join_all((0..8).map(|_| schema.try_open())).await;
        for store in opened {
            let store = store.unwrap_or_else(|e| panic!("opens: {e}"));
            store.close().await;
        }
    }
}

// ---------------------------------------------------------------- stores that cannot be opened

/// A SQLite store that is not a database (garbage, or a file cut short) fails every command at
/// once, naming the file and what is wrong with it, instead of waiting out a connection pool.
#[test]
fn a_sqlite_store_that_is_not_a_database_fails_at_once_with_its_path() {
    let dir = TempDir::new("store-garbage");
    dir.write("flow.yaml", crate::support::CLEAN_FLOW);
    let good = dir.path().join("good.db");
    let out = crate::support::run(crate::support::switchyard(dir.path()).args([
        "run",
        "flow.yaml",
        "--store",
        &format!("sqlite:{}", good.display()),
    ]));
    assert_eq!(out.code(), 0, "{out:?}");
    let bytes = std::fs::read(&good).expect("the store");
    dir.write("garbage.db", "this is not a database\n".repeat(200));
    dir.write("cut.db", &bytes[..3000]);
    for (file, cause) in [
        ("garbage.db", "the file is not a SQLite database"),
        ("cut.db", "the file is damaged"),
    ] {
        let url = format!("sqlite:{}", dir.path().join(file).display());
        for args in [
            vec!["run", "flow.yaml", "--store", &url],
            vec!["runs", "list", "--store", &url],
            vec!["runs", "show", "r1", "--store", &url],
        ] {
            let started = Instant::now();
            let out = crate::support::run(crate::support::switchyard(dir.path()).args(&args));
            let took = started.elapsed();
            assert_ne!(out.code(), 0, "{args:?}: {out:?}");
            let want = format!(
                "cannot open the store {}: {cause}",
                dir.path().join(file).display()
            );
            assert!(out.stderr.contains(&want), "{args:?}: {}", out.stderr);
            assert!(!out.stderr.contains("pool timed out"), "{}", out.stderr);
            assert!(took < Duration::from_secs(5), "{args:?} took {took:?}");
        }
    }
}

/// `cmd` (a `switchyard` command) run as a user that is not root, so that file permissions
/// apply: as `nobody` through `setpriv` when the tests run as root.
fn as_unprivileged(dir: &std::path::Path, args: &[&str]) -> crate::support::Output {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut cmd = if root {
        let mut c = std::process::Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            crate::support::BIN,
        ]);
        c
    } else {
        std::process::Command::new(crate::support::BIN)
    };
    cmd.current_dir(dir)
        .args(args)
        .env("NO_COLOR", "1")
        .env("COLUMNS", "100")
        .env_remove("SWITCHYARD_STORE")
        .stdin(std::process::Stdio::null());
    crate::support::run(&mut cmd)
}

/// A store this user may not write — the file read-only, or its directory — is refused at once
/// by a command that records runs, with the path and the cause; `runs list` and `runs show`
/// still read it.
#[test]
fn a_read_only_sqlite_store_is_refused_for_writing_and_still_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("store-read-only");
    dir.write("flow.yaml", crate::support::CLEAN_FLOW);
    for case in ["file", "directory"] {
        let store_dir = dir.path().join(case);
        std::fs::create_dir_all(&store_dir).expect("a directory");
        std::fs::set_permissions(&store_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let db = store_dir.join("runs.db");
        let url = format!("sqlite:{}", db.display());
        let out = as_unprivileged(dir.path(), &["run", "flow.yaml", "--store", &url]);
        assert_eq!(out.code(), 0, "{out:?}");
        let run_id = as_unprivileged(dir.path(), &["runs", "list", "--json", "--store", &url]).stdout;
        let run_id: serde_json::Value =
            serde_json::from_str(run_id.lines().next().expect("a run")).expect("JSON");
        let run_id = run_id["id"].as_str().expect("an id").to_string();
        let (locked, cause) = if case == "file" {
            (db.clone(), "the file is read-only for this user".to_string())
        } else {
            (
                store_dir.clone(),
                format!("its directory {} is read-only for this user", store_dir.display()),
            )
        };
        let mode = if case == "file" { 0o444 } else { 0o555 };
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(mode)).expect("chmod");

        let started = Instant::now();
        let out = as_unprivileged(dir.path(), &["run", "flow.yaml", "--store", &url]);
        assert_eq!(out.code(), 1, "{out:?}");
        let want = format!("cannot open the store {}: {cause}", db.display());
        assert!(out.stderr.contains(&want), "{case}: {}", out.stderr);
        assert!(
            out.stderr
                .contains("`switchyard runs list` and `runs show` can still read it"),
            "{}",
            out.stderr
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{case}: {:?}",
            started.elapsed()
        );

        let out = as_unprivileged(dir.path(), &["runs", "list", "--store", &url]);
        assert_eq!(out.code(), 0, "{case}: {out:?}");
        assert!(out.stdout.contains(&run_id), "{case}: {}", out.stdout);
        let out = as_unprivileged(dir.path(), &["runs", "show", &run_id, "--store", &url]);
        assert_eq!(out.code(), 0, "{case}: {out:?}");
        assert!(
            out.stdout.contains("status    succeeded"),
            "{case}: {}",
            out.stdout
        );
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o777)).expect("chmod back");
    }
}

/// A store of schema 2 (before steps kept an `llm` call's repaired answers) is brought up to
/// date by `runs list`, which it can write, and its records read as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_2_store_is_upgraded_by_runs_list() {
    let dir = TempDir::new("store-schema-2");
    dir.write("flow.yaml", crate::support::CLEAN_FLOW);
    let db = dir.path().join("runs.db");
    let url = format!("sqlite:{}", db.display());
    let out = crate::support::run(crate::support::switchyard(dir.path()).args([
        "run",
        "flow.yaml",
        "--store",
        &url,
    ]));
    assert_eq!(out.code(), 0, "{out:?}");
    let mut conn = raw(&db).await;
    for sql in SCHEMA_5_TO_4.iter().chain(SCHEMA_4_TO_3).chain(&[
        "ALTER TABLE steps DROP COLUMN answers",
        "DELETE FROM schema_version WHERE version = 3",
    ]) {
        sqlx::query(*sql).execute(&mut conn).await.expect(sql);
    }
    conn.close().await.expect("close");
    let out = crate::support::run(
        crate::support::switchyard(dir.path()).args(["runs", "list", "--json", "--store", &url]),
    );
    assert_eq!(out.code(), 0, "{out:?}");
    let run: serde_json::Value =
        serde_json::from_str(out.stdout.lines().next().expect("a run")).expect("JSON");
    let id = run["id"].as_str().expect("an id");
    let out = crate::support::run(
        crate::support::switchyard(dir.path()).args(["runs", "show", id, "--store", &url]),
    );
    assert!(out.stdout.contains("✓ 1 fetch [agent]"), "{out:?}");
    let mut conn = raw(&db).await;
    let version = stored_version(&mut conn).await;
    conn.close().await.expect("close");
    assert_eq!(version, SCHEMA_VERSION);
}

/// The newest schema version a store records.
async fn stored_version(conn: &mut AnyConnection) -> i64 {
    sqlx::query_scalar("SELECT MAX(version) FROM schema_version")
        .fetch_one(conn)
        .await
        .expect("a version")
}

/// Undoes migrations 13 (run heads, steps without a rowid), 12 (the inbox), 11 (files),
/// 10 (what started each run), 9 (the agent changes a run started with), 8 (calls of unknown cost, a
/// batch's cost cap), 7 (run writers), 6 (submitted batches) and 5 (runs without the `now`
/// they saw).
pub(crate) const SCHEMA_5_TO_4: &[&str] = &[
    "ALTER TABLE runs ADD COLUMN flow TEXT",
    "ALTER TABLE runs ADD COLUMN flow_hash TEXT",
    "ALTER TABLE runs ADD COLUMN flow_path TEXT",
    "ALTER TABLE runs ADD COLUMN batch TEXT",
    "ALTER TABLE runs ADD COLUMN origin TEXT",
    "UPDATE runs SET flow = (SELECT h.flow FROM run_heads h WHERE h.id = runs.head), \
     flow_hash = (SELECT h.flow_hash FROM run_heads h WHERE h.id = runs.head), \
     flow_path = (SELECT h.flow_path FROM run_heads h WHERE h.id = runs.head), \
     batch = (SELECT h.batch FROM run_heads h WHERE h.id = runs.head), \
     origin = (SELECT h.origin FROM run_heads h WHERE h.id = runs.head)",
    "DROP VIEW run_records",
    "DROP INDEX runs_claim",
    "DROP INDEX runs_running",
    "DROP INDEX runs_by_head",
    "ALTER TABLE runs DROP COLUMN head",
    "DROP TABLE run_heads",
    "CREATE INDEX runs_by_status ON runs (status, started_at)",
    "CREATE INDEX runs_by_flow ON runs (flow, started_at)",
    "CREATE INDEX runs_by_batch ON runs (batch, item_index)",
    "CREATE INDEX runs_claim ON runs (batch, item_index) \
     WHERE lease_epoch IS NOT NULL AND status IN ('queued', 'running')",
    "CREATE TABLE steps_12 (run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE, \
     number TEXT NOT NULL, attempt BIGINT NOT NULL, iteration BIGINT NOT NULL, seq BIGINT NOT NULL, \
     step TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL, iterations BIGINT, input TEXT, \
     result TEXT, changes TEXT NOT NULL, violations TEXT NOT NULL, error TEXT, started_at BIGINT NOT NULL, \
     finished_at BIGINT, input_tokens BIGINT NOT NULL, output_tokens BIGINT NOT NULL, \
     cost_usd DOUBLE PRECISION NOT NULL, child_run TEXT, route TEXT, answers TEXT, \
     cost_unknown_calls BIGINT, files TEXT, PRIMARY KEY (run_id, number, attempt, iteration))",
    "INSERT INTO steps_12 SELECT run_id, number, attempt, iteration, seq, step, kind, status, iterations, \
     input, result, COALESCE(changes, '[]'), COALESCE(violations, '[]'), error, started_at, finished_at, \
     input_tokens, output_tokens, cost_usd, child_run, route, answers, cost_unknown_calls, files FROM steps",
    "DROP TABLE steps",
    "ALTER TABLE steps_12 RENAME TO steps",
    "CREATE INDEX steps_by_seq ON steps (seq)",
    "DELETE FROM schema_version WHERE version = 13",
    "DROP TABLE inbox_bulk",
    "DROP TABLE decisions",
    "DROP TABLE inbox",
    "DROP TABLE inbox_shapes",
    "DELETE FROM schema_version WHERE version = 12",
    "DROP TABLE files",
    "DROP TABLE file_chunks",
    "ALTER TABLE runs DROP COLUMN files",
    "ALTER TABLE steps DROP COLUMN files",
    "DELETE FROM schema_version WHERE version = 11",
    "ALTER TABLE runs DROP COLUMN origin",
    "DELETE FROM schema_version WHERE version = 10",
    "ALTER TABLE runs DROP COLUMN agent_changes",
    "DELETE FROM schema_version WHERE version = 9",
    "DROP TABLE batch_spend",
    "ALTER TABLE steps DROP COLUMN cost_unknown_calls",
    "ALTER TABLE runs DROP COLUMN cost_unknown_calls",
    "DELETE FROM schema_version WHERE version = 8",
    "DROP TABLE run_writers",
    "DELETE FROM schema_version WHERE version = 7",
    "DROP TABLE provider_slots",
    "DROP TABLE provider_pace",
    "DROP TABLE workers",
    "DROP TABLE batches",
    "DROP TABLE bundles",
    "DROP INDEX runs_claim",
    "ALTER TABLE runs DROP COLUMN recoveries",
    "ALTER TABLE runs DROP COLUMN lease_until",
    "ALTER TABLE runs DROP COLUMN lease_owner",
    "ALTER TABLE runs DROP COLUMN lease_epoch",
    "DELETE FROM schema_version WHERE version = 6",
    "ALTER TABLE runs DROP COLUMN now_us",
    "DELETE FROM schema_version WHERE version = 5",
];

/// Undoes migration 4: the index of runs by parent back to one entry per run.
const SCHEMA_4_TO_3: &[&str] = &[
    "DROP INDEX runs_by_parent",
    "CREATE INDEX runs_by_parent ON runs (parent_run)",
    "DELETE FROM schema_version WHERE version = 4",
];

/// The definition of the index of runs by parent.
async fn parent_index_sql(conn: &mut AnyConnection) -> String {
    sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = 'runs_by_parent'")
        .fetch_one(conn)
        .await
        .expect("the index")
}

/// `switchyard batch flow.yaml --input in.jsonl --output out.jsonl --store URL` in `dir`.
fn batch_in(dir: &TempDir, url: &str) -> crate::support::Output {
    crate::support::run(crate::support::switchyard(dir.path()).args([
        "batch",
        "flow.yaml",
        "--input",
        "in.jsonl",
        "--output",
        "out.jsonl",
        "--store",
        url,
    ]))
}

/// A store of schema 3 (runs indexed by parent, top-level runs included) is brought up to date
/// by `runs list`: the index then holds only runs that have a parent, and the batch's runs
/// still list, show, and let the batch continue without running its items again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_3_store_is_upgraded_by_runs_list() {
    let dir = TempDir::new("store-schema-3");
    dir.write("flow.yaml", crate::support::CLEAN_FLOW);
    dir.write("in.jsonl", "{\"k\": 1}\n{\"k\": 2}\n");
    let db = dir.path().join("runs.db");
    let url = format!("sqlite:{}", db.display());
    let batch = |dir: &TempDir| batch_in(dir, &url);
    let out = batch(&dir);
    assert_eq!(out.code(), 0, "{out:?}");
    let mut conn = raw(&db).await;
    for sql in SCHEMA_5_TO_4.iter().chain(SCHEMA_4_TO_3) {
        sqlx::query(*sql).execute(&mut conn).await.expect(sql);
    }
    assert!(!parent_index_sql(&mut conn).await.contains("WHERE"));
    conn.close().await.expect("close");

    let out = crate::support::run(
        crate::support::switchyard(dir.path()).args(["runs", "list", "--json", "--store", &url]),
    );
    assert_eq!(out.code(), 0, "{out:?}");
    let runs: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(runs.len(), 2, "{}", out.stdout);
    let id = runs[0]["id"].as_str().expect("an id");
    let out = crate::support::run(
        crate::support::switchyard(dir.path()).args(["runs", "show", id, "--store", &url]),
    );
    assert!(out.stdout.contains("✓ 1 fetch [agent]"), "{out:?}");

    let mut conn = raw(&db).await;
    let version = stored_version(&mut conn).await;
    assert_eq!(version, SCHEMA_VERSION);
    assert!(
        parent_index_sql(&mut conn)
            .await
            .contains("WHERE parent_run IS NOT NULL"),
        "the index is partial after the upgrade"
    );
    conn.close().await.expect("close");

    let out = batch(&dir);
    assert_eq!(out.code(), 0, "{out:?}");
    let mut conn = raw(&db).await;
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM runs")
        .fetch_one(&mut conn)
        .await
        .expect("a count");
    conn.close().await.expect("close");
    assert_eq!(count, 2, "the continued batch ran no item again");
}

/// A store of schema 12 (each run holding its flow, flow hash, flow file and batch; steps with
/// a rowid and a store-wide `seq`) is brought up to date when a command opens it: its runs
/// list and show exactly as before, and its batch continues without running its finished
/// items again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_12_store_upgrades_with_its_runs_intact() {
    let dir = TempDir::new("store-schema-12");
    dir.write("flow.yaml", crate::support::CLEAN_FLOW);
    dir.write("in.jsonl", "{\"k\": 1}\n{\"k\": 2}\n");
    let db = dir.path().join("runs.db");
    let url = format!("sqlite:{}", db.display());
    let batch = |dir: &TempDir| batch_in(dir, &url);
    let out = batch(&dir);
    assert_eq!(out.code(), 0, "{out:?}");
    let shown = |dir: &TempDir| {
        let out = crate::support::run(
            crate::support::switchyard(dir.path()).args(["runs", "list", "--json", "--store", &url]),
        );
        assert_eq!(out.code(), 0, "{out:?}");
        let mut all = vec![out.stdout.clone()];
        for line in out.stdout.lines() {
            let run: serde_json::Value = serde_json::from_str(line).expect("JSON");
            let id = run["id"].as_str().expect("an id");
            let out = crate::support::run(
                crate::support::switchyard(dir.path()).args(["runs", "show", id, "--json", "--store", &url]),
            );
            assert_eq!(out.code(), 0, "{out:?}");
            all.push(out.stdout);
        }
        all
    };
    let before = shown(&dir);
    assert_eq!(before.len(), 3, "{before:?}");
    assert!(
        before[1].contains("\"changes\"") && before[1].contains("\"fetched\""),
        "{}",
        before[1]
    );

    let to_12 = SCHEMA_5_TO_4
        .iter()
        .position(|s| *s == "DELETE FROM schema_version WHERE version = 13")
        .expect("the downgrade of version 13")
        + 1;
    let mut conn = raw(&db).await;
    for sql in &SCHEMA_5_TO_4[..to_12] {
        sqlx::query(*sql).execute(&mut conn).await.expect(sql);
    }
    assert_eq!(stored_version(&mut conn).await, 12);
    let batches: Vec<Option<String>> = sqlx::query_scalar("SELECT batch FROM runs")
        .fetch_all(&mut conn)
        .await
        .expect("the runs' batches");
    assert_eq!(batches.len(), 2);
    assert!(
        batches
            .iter()
            .all(|b| b.as_deref().is_some_and(|b| b.ends_with("out.jsonl"))),
        "{batches:?}"
    );
    let old_shape: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM sqlite_master WHERE name IN ('steps_by_seq', 'runs_by_batch', 'run_heads', 'run_records')",
    )
    .fetch_one(&mut conn)
    .await
    .expect("the schema");
    assert_eq!(old_shape, 2, "schema 12's indexes, and no heads");
    conn.close().await.expect("close");

    assert_eq!(shown(&dir), before);
    let mut conn = raw(&db).await;
    assert_eq!(stored_version(&mut conn).await, SCHEMA_VERSION);
    let heads: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM run_heads")
        .fetch_one(&mut conn)
        .await
        .expect("the heads");
    assert_eq!(heads, 1, "the batch's two runs share one head");
    conn.close().await.expect("close");

    dir.write("in.jsonl", "{\"k\": 1}\n{\"k\": 2}\n{\"k\": 3}\n");
    let out = batch(&dir);
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(
        format!("{}{}", out.stdout, out.stderr)
            .contains("3 items (2 from an earlier start): 3 succeeded, 0 failed, 0 interrupted"),
        "{out:?}"
    );
    let after = shown(&dir);
    assert_eq!(after.len(), 4);
    for old in &before[1..] {
        assert!(after.contains(old), "{old}");
    }
}
