//! `switchyard batch` on stores other than a healthy SQLite file: PostgreSQL killed like
//! SQLite, the memory store that keeps nothing, a second batch on the same output, a store
//! that fails part-way (a full disk) and one locked by another process.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

use crate::batch::{batch_cmd, effects, items_flow, read_lines, spawn_batch, write_input};
use crate::support::{TempDir, run, switchyard};

#[test]
fn a_batch_on_postgres_survives_a_kill_like_on_sqlite() {
    const N: usize = 40;
    let base = std::env::var("SWITCHYARD_TEST_DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "SWITCHYARD_TEST_DATABASE_URL is not set: the PostgreSQL tests need a database and do not skip. \
             Run them with e.g. `export SWITCHYARD_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test`"
        )
    });
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    // A fresh schema, created by the store; dropped below.
    let schema = format!("sy_batch_{}_{nanos}", std::process::id());
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}schema={schema}");
    let dir = TempDir::new("batch-postgres");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", items_flow(&fx));
    write_input(&dir, N);
    let cmd = |extra: &[&str]| {
        let mut c = switchyard(dir.path());
        c.arg("batch")
            .arg(&flow)
            .args([
                "--input",
                "in.jsonl",
                "--output",
                "out.jsonl",
                "--concurrency",
                "8",
            ])
            .args(["--store", &url])
            .args(extra);
        c
    };
    let mut child = cmd(&[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    std::thread::sleep(Duration::from_millis(250));
    let _ = child.kill();
    let _ = child.wait();
    let out = run(&mut cmd(&["--retry-in-doubt"]));
    let _drop = DropSchema(base.clone(), schema.clone());
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let lines = read_lines(&dir.path().join("out.jsonl"));
    let ids: Vec<String> = lines
        .iter()
        .map(|l| l["id"].as_str().unwrap().to_string())
        .collect();
    let expected: Vec<String> = (0..N).map(|i| format!("item-{i}")).collect();
    assert_eq!(ids, expected);
    assert!(lines.iter().all(|l| l["status"] == "succeeded"), "{lines:?}");
    assert_eq!(effects(&fx).len(), N);
    // The runs are in PostgreSQL: `runs list` reads them there.
    let list =
        run(switchyard(dir.path()).args(["runs", "list", "--json", "--limit", "1000", "--store", &url]));
    assert_eq!(list.stdout.lines().count(), N, "{}", list.stderr);
}

/// Drops a PostgreSQL schema (url, name) a test created, when it goes out of scope.
struct DropSchema(String, String);

impl Drop for DropSchema {
    fn drop(&mut self) {
        drop_schema(&self.0, &self.1);
    }
}

fn drop_schema(url: &str, schema: &str) {
    use sqlx::Connection;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        sqlx::any::install_default_drivers();
        let mut conn = sqlx::AnyConnection::connect(url).await.expect("connect");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
        )))
        .execute(&mut conn)
        .await
        .expect("drop the test schema");
        conn.close().await.expect("close");
    });
}

#[test]
fn a_batch_with_the_memory_store_keeps_nothing_and_runs_everything_again() {
    let dir = TempDir::new("batch-memory");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", items_flow(&fx));
    write_input(&dir, 12);
    for round in 1..=2 {
        let out = run(switchyard(dir.path()).arg("batch").arg(&flow).args([
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
            "--store",
            "memory",
            "--concurrency",
            "3",
        ]));
        assert_eq!(out.code(), 0, "{}", out.stderr);
        let lines = read_lines(&dir.path().join("out.jsonl"));
        assert_eq!(lines.len(), 12);
        assert_eq!(lines[11]["output"]["sum"], json!(2 * (11 + 12 + 13)));
        assert!(effects(&fx).values().all(|n| *n == round));
    }
    assert!(
        !dir.path().join(".switchyard").exists(),
        "nothing written to the default store"
    );
}

#[test]
fn a_second_batch_on_the_same_output_is_refused_while_the_first_runs() {
    let dir = TempDir::new("batch-busy");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", items_flow(&fx));
    write_input(&dir, 40);
    let mut first = spawn_batch(&dir, &flow);
    // Until the first holds the lock (it has written a line).
    let out_file = dir.path().join("out.jsonl");
    let waited = std::time::Instant::now();
    while std::fs::metadata(&out_file).map_or(0, |m| m.len()) == 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(15),
            "the first batch never wrote"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let second = run(&mut batch_cmd(&dir, &flow, &[]));
    assert_eq!(second.code(), 2, "{}", second.stderr);
    assert!(
        second
            .stderr
            .contains("is in use by another switchyard process right now"),
        "{}",
        second.stderr
    );
    assert!(first.wait().expect("waits").success());
    let counts = effects(&fx);
    assert_eq!(counts.len(), 40);
    assert!(counts.values().all(|n| *n == 1));
    assert_eq!(read_lines(&out_file).len(), 40);
}

/// Runs a batch into a store that fails part-way (`store`), then again with a working one:
/// the first stops with a clear error and no wrong line; the second finishes every item once.
fn a_failing_store_stops_the_batch(dir: &TempDir, store: &str, expect: &[&str]) {
    const N: usize = 60;
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", items_flow(&fx));
    write_input(dir, N);
    let mut cmd = switchyard(dir.path());
    cmd.arg("batch")
        .arg(&flow)
        .args([
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
            "--concurrency",
            "8",
        ])
        .args(["--store", store]);
    let out = run(&mut cmd);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    for e in expect {
        assert!(out.stderr.contains(e), "`{e}` not in: {}", out.stderr);
    }
    assert!(
        out.stderr.contains("the same command continues"),
        "{}",
        out.stderr
    );
    let partial = read_lines(&dir.path().join("out.jsonl"));
    assert!(partial.len() < N, "stopped part-way: {} lines", partial.len());
    // No item was written as failed because of the store.
    assert!(partial.iter().all(|l| l["status"] == "succeeded"), "{partial:?}");

    let out = run(&mut batch_cmd(dir, &flow, &["--retry-in-doubt"]));
    let lines = read_lines(&dir.path().join("out.jsonl"));
    let failed: Vec<&Value> = lines.iter().filter(|l| l["status"] != "succeeded").collect();
    assert_eq!(out.code(), 0, "{}\n{failed:?}", out.stderr);
    let ids: Vec<&str> = lines.iter().map(|l| l["id"].as_str().unwrap()).collect();
    let expected: Vec<String> = (0..N).map(|i| format!("item-{i}")).collect();
    assert_eq!(ids, expected);
    assert!(lines.iter().all(|l| l["status"] == "succeeded"));
    assert_eq!(effects(&fx).len(), N);
}

#[test]
fn a_full_disk_stops_a_batch_clearly_and_the_same_command_continues() {
    let dir = TempDir::new("batch-full");
    // The store may grow to 40 pages of 4 KiB: it fills up part-way through the batch.
    a_failing_store_stops_the_batch(
        &dir,
        "sqlite:runs.db?max_pages=52",
        &["the store failed", "is full"],
    );
}

#[test]
fn a_store_locked_by_another_process_stops_a_batch_clearly() {
    use sqlx::Connection;
    let dir = TempDir::new("batch-locked");
    let db = dir.path().join("runs.db");
    // Create the store, then hold its write lock from another connection.
    dir.write("init.yaml", "flow: init\nsteps:\n  s: {set: {$.x: {value: 1}}}\n");
    let init =
        run(switchyard(dir.path()).args(["run", "init.yaml", "--input", "{}", "--store", "sqlite:runs.db"]));
    assert_eq!(init.code(), 0, "{}", init.stderr);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    sqlx::any::install_default_drivers();
    let mut conn = rt
        .block_on(sqlx::AnyConnection::connect(&format!(
            "sqlite://{}",
            db.display()
        )))
        .expect("connect");
    rt.block_on(sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut conn))
        .expect("take the write lock");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", items_flow(&fx));
    write_input(&dir, 5);
    let out = run(switchyard(dir.path()).arg("batch").arg(&flow).args([
        "--input",
        "in.jsonl",
        "--output",
        "out.jsonl",
        "--store",
        "sqlite:runs.db?busy_timeout_ms=200",
    ]));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("the store failed") && out.stderr.contains("is locked by another process"),
        "{}",
        out.stderr
    );
    assert!(read_lines(&dir.path().join("out.jsonl")).is_empty());
    assert!(!fx.exists(), "no call was made without its record");
    // Once the lock is gone, the same command runs the batch.
    rt.block_on(sqlx::raw_sql("ROLLBACK").execute(&mut conn))
        .expect("release");
    rt.block_on(conn.close()).expect("close");
    let out = run(&mut batch_cmd(&dir, &flow, &[]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(read_lines(&dir.path().join("out.jsonl")).len(), 5);
}
