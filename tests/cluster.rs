//! Many machines (SPEC §12) on the real PostgreSQL: `submit`, `worker` processes of the real
//! binary, and what survives their deaths — kill -9, SIGSTOP past the lease, connections
//! terminated by the server — a poison item, the drain on SIGTERM, and a store migrated by a
//! newer switchyard.
//!
//! Needs `SWITCHYARD_TEST_DATABASE_URL`; every test works in a fresh schema, dropped after.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{TempDir, run, switchyard};

/// A fresh schema of the test database, dropped when this goes out of scope.
pub struct Pg {
    base: String,
    pub schema: String,
}

impl Pg {
    pub fn new(tag: &str) -> Pg {
        let base = std::env::var("SWITCHYARD_TEST_DATABASE_URL").unwrap_or_else(|_| {
            panic!(
                "SWITCHYARD_TEST_DATABASE_URL is not set: the PostgreSQL tests need a database and do not skip. \
                 Run them with e.g. `export SWITCHYARD_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test`"
            )
        });
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Pg {
            base,
            schema: format!("sy_{tag}_{}_{nanos}", std::process::id()),
        }
    }

    /// The store URL of the schema; `app` names the connections (`application_name`), so a
    /// test can find one process's sessions.
    pub fn url(&self, app: &str) -> String {
        let sep = if self.base.contains('?') { '&' } else { '?' };
        format!("{}{sep}schema={}&application_name={app}", self.base, self.schema)
    }

    /// Runs SQL on the schema and returns the rows as JSON objects of text values.
    pub fn query(&self, sql: &str) -> Vec<HashMap<String, Option<String>>> {
        use sqlx::{Column, Connection, Row};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            sqlx::any::install_default_drivers();
            let mut conn = sqlx::AnyConnection::connect(&self.base).await.expect("connect");
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "SET search_path TO \"{}\"",
                self.schema
            )))
            .execute(&mut conn)
            .await
            .expect("search path");
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
                .fetch_all(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            let out = rows
                .iter()
                .map(|r| {
                    r.columns()
                        .iter()
                        .map(|c| {
                            let v: Option<String> = r
                                .try_get::<Option<String>, _>(c.ordinal())
                                .ok()
                                .flatten()
                                .or_else(|| {
                                    r.try_get::<Option<i64>, _>(c.ordinal())
                                        .ok()
                                        .flatten()
                                        .map(|n| n.to_string())
                                });
                            (c.name().to_string(), v)
                        })
                        .collect()
                })
                .collect();
            conn.close().await.expect("close");
            out
        })
    }

    /// One number from SQL.
    pub fn count(&self, sql: &str) -> i64 {
        let rows = self.query(sql);
        rows.first()
            .and_then(|r| r.values().next().cloned().flatten())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{sql}: no number in {rows:?}"))
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        let (base, schema) = (self.base.clone(), self.schema.clone());
        let _ = std::thread::spawn(move || {
            use sqlx::Connection;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                sqlx::any::install_default_drivers();
                let mut conn = sqlx::AnyConnection::connect(&base).await.ok()?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                )))
                .execute(&mut conn)
                .await
                .ok()?;
                conn.close().await.ok()
            })
        })
        .join();
    }
}

/// A flow whose first step is a non-idempotent `command` that appends its input to `effects`
/// (so every execution is counted) and sleeps `sleep` seconds; then pure steps. A command
/// whose worker was killed before it wrote the input reads nothing, and records nothing.
pub fn side_effect_flow(effects: &Path, sleep: &str) -> String {
    format!(
        r#"flow: items
input:
  schema: {{type: object, required: [id, n], properties: {{n: {{type: integer}}}}}}
agents:
  side:
    kind: command
    run: [sh, -c, 'read -r x; [ -n "$x" ] || exit 1; printf "%s\n" "$x" >> "{effects}"; sleep {sleep}; printf "%s" "$x"']
    idempotent: false
  double:
    kind: transform
    result: {{v: =input * 2}}
steps:
  call:
    agent: side
    output: {{$.seen: $.n}}
    next: spread
  spread:
    foreach: =[payload.n, payload.n + 1]
    agent: double
    select: $.v
    output: {{$.doubled: $}}
    next: total
  total:
    set:
      $.sum: =payload.doubled[0] + payload.doubled[1]
"#,
        effects = effects.display()
    )
}

pub fn write_input(dir: &TempDir, n: usize) -> PathBuf {
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&json!({"id": format!("item-{i}"), "n": i}).to_string());
        text.push('\n');
    }
    dir.write("in.jsonl", text)
}

/// How many times each id was executed, from the effects file.
pub fn effects(path: &Path) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("effects line `{line}`: {e}"));
        *seen.entry(v["id"].as_str().expect("id").to_string()).or_default() += 1;
    }
    seen
}

pub fn submit(dir: &TempDir, flow: &Path, url: &str, batch: &str, extra: &[&str]) -> crate::support::Output {
    run(switchyard(dir.path())
        .arg("submit")
        .arg(flow)
        .args(["--input", "in.jsonl", "--batch", batch, "--store", url])
        .args(extra))
}

/// A worker process of the binary, its stderr in `dir/<name>.log`.
pub fn spawn_worker(dir: &TempDir, url: &str, name: &str, extra: &[&str]) -> Child {
    let log = std::fs::File::create(dir.path().join(format!("{name}.log"))).expect("log file");
    switchyard(dir.path())
        .args(["worker", "--store", url, "--progress-every", "0"])
        .args(extra)
        .env(
            "SWITCHYARD_BUNDLE_DIR",
            dir.path().join(format!("bundles-{name}")),
        )
        .env("SWITCHYARD_LOG", "switchyard=info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("a worker starts")
}

pub fn log_of(dir: &TempDir, name: &str) -> String {
    std::fs::read_to_string(dir.path().join(format!("{name}.log"))).unwrap_or_default()
}

/// Waits for a child to exit, at most `limit`; kills it and fails past that.
pub fn wait_exit(child: &mut Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls until `cond` holds, at most `limit`.
pub fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn signal(child: &Child, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{sig} {}", child.id());
}

/// Statuses of each item's latest run: item id → (status, error kind).
pub fn latest(pg: &Pg, batch: &str) -> HashMap<String, (String, Option<String>)> {
    let rows = pg.query(&format!(
        "SELECT item_id, status, error FROM run_records r WHERE batch = '{batch}' AND parent_run IS NULL \
         AND NOT EXISTS (SELECT 1 FROM run_records o WHERE o.batch = r.batch AND o.item_index = r.item_index \
         AND o.started_at > r.started_at)"
    ));
    rows.into_iter()
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

#[test]
fn two_workers_run_a_submitted_batch_once_each_item() {
    const N: usize = 60;
    let pg = Pg::new("two");
    let dir = TempDir::new("cluster-two");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", side_effect_flow(&fx, "0.01"));
    write_input(&dir, N);
    let url = pg.url("sy_two");
    let out = submit(&dir, &flow, &url, "b1", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(out.stderr.contains("60 runs queued"), "{}", out.stderr);
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM runs WHERE status = 'queued'"),
        N as i64
    );
    // Submitting again adds nothing.
    let again = submit(&dir, &flow, &url, "b1", &[]);
    assert_eq!(again.code(), 0, "{}", again.stderr);
    assert!(
        again.stderr.contains("0 runs queued, 60 already submitted"),
        "{}",
        again.stderr
    );

    // The workers run from the stored bundle: the flow file is gone. They export their runs'
    // traces as well.
    std::fs::remove_file(&flow).expect("remove the flow");
    let collector = crate::otel::Collector::start();
    let args = [
        "--concurrency",
        "4",
        "--exit-when-idle",
        "--otlp-endpoint",
        &collector.url,
    ];
    let mut a = spawn_worker(&dir, &url, "a", &args);
    let mut b = spawn_worker(&dir, &url, "b", &args);
    let sa = wait_exit(&mut a, Duration::from_secs(120), "worker a");
    let sb = wait_exit(&mut b, Duration::from_secs(120), "worker b");
    assert!(sa.success(), "{}", log_of(&dir, "a"));
    assert!(sb.success(), "{}", log_of(&dir, "b"));
    let latest = latest(&pg, "b1");
    assert_eq!(latest.len(), N);
    assert!(latest.values().all(|(s, _)| s == "succeeded"), "{latest:?}");
    let fx = effects(&fx);
    assert_eq!(fx.len(), N);
    assert!(fx.values().all(|n| *n == 1), "{fx:?}");
    // Both took part, each run was held by one.
    let owners = pg.count("SELECT COUNT(DISTINCT lease_owner) FROM run_records WHERE batch = 'b1'");
    assert_eq!(owners, 2, "{}\n{}", log_of(&dir, "a"), log_of(&dir, "b"));
    let sum = pg.query("SELECT output FROM runs WHERE item_id = 'item-7'");
    let output: Value = serde_json::from_str(sum[0]["output"].as_deref().expect("output")).expect("json");
    assert_eq!(output["sum"], json!(2 * 7 + 2 * 8));
    // One trace per item, from whichever worker ran it, each with its steps.
    let spans = collector.spans();
    let roots: Vec<_> = spans.iter().filter(|s| s.name == "run items").collect();
    assert_eq!(roots.len(), N, "{} spans", spans.len());
    let traces: std::collections::HashSet<_> = roots.iter().map(|r| r.trace_id.clone()).collect();
    assert_eq!(traces.len(), N);
    assert!(
        roots
            .iter()
            .all(|r| crate::otel::attr(r, "switchyard.batch").as_deref() == Some("b1"))
    );
    let steps = spans.iter().filter(|s| s.name == "step call").count();
    assert_eq!(steps, N);
}

#[test]
fn a_changed_line_is_refused_and_a_bad_line_fails_at_submit() {
    let pg = Pg::new("changed");
    let dir = TempDir::new("cluster-changed");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", side_effect_flow(&fx, "0"));
    dir.write(
        "in.jsonl",
        "{\"id\": \"a\", \"n\": 1}\nnot json\n{\"id\": \"c\", \"n\": \"x\"}\n",
    );
    let url = pg.url("sy_changed");
    let out = submit(&dir, &flow, &url, "b", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("1 runs queued, 0 already submitted, 2 failed at submit"),
        "{}",
        out.stderr
    );
    let failed = pg.query("SELECT item_id, error FROM runs WHERE status = 'failed' ORDER BY item_index");
    assert_eq!(failed.len(), 2);
    assert!(
        failed[0]["error"]
            .as_deref()
            .unwrap()
            .contains("line 2 is not JSON"),
        "{failed:?}"
    );
    assert!(
        failed[1]["error"].as_deref().unwrap().contains("input.schema"),
        "{failed:?}"
    );
    // Lines refused at submit finished, but no worker ended them: no rate, no ETA from them.
    let shown = run(switchyard(dir.path()).args(["batches", "b", "--json", "--store", &url]));
    assert_eq!(shown.code(), 0, "{}", shown.stderr);
    let row: Value = serde_json::from_str(shown.stdout.lines().next().expect("a row")).unwrap();
    assert_eq!(row["failed"], json!(2), "{row}");
    assert_eq!(row["per_second"], json!(0.0), "{row}");
    // The same input again is fine; a changed line is refused, naming it.
    let again = submit(&dir, &flow, &url, "b", &[]);
    assert_eq!(again.code(), 0, "{}", again.stderr);
    assert!(
        again.stderr.contains("0 runs queued, 3 already submitted"),
        "{}",
        again.stderr
    );
    dir.write(
        "in.jsonl",
        "{\"id\": \"a\", \"n\": 2}\nnot json\n{\"id\": \"c\", \"n\": \"x\"}\n",
    );
    let changed = submit(&dir, &flow, &url, "b", &[]);
    assert_eq!(changed.code(), 2, "{}", changed.stderr);
    assert!(
        changed
            .stderr
            .contains("line 1: item `a` is not the input its queued run"),
        "{}",
        changed.stderr
    );
    // Duplicate ids are refused before anything is written.
    dir.write(
        "in.jsonl",
        "{\"id\": \"d\", \"n\": 1}\n{\"id\": \"d\", \"n\": 2}\n",
    );
    let dup = submit(&dir, &flow, &url, "other", &[]);
    assert_eq!(dup.code(), 2, "{}", dup.stderr);
    assert!(dup.stderr.contains("duplicate ids"), "{}", dup.stderr);
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM run_records WHERE batch = 'other'"),
        0
    );
    // A changed flow is refused for the same batch.
    std::fs::write(&flow, side_effect_flow(&fx, "0.001")).expect("rewrite");
    dir.write(
        "in.jsonl",
        "{\"id\": \"a\", \"n\": 1}\nnot json\n{\"id\": \"c\", \"n\": \"x\"}\n",
    );
    let other = submit(&dir, &flow, &url, "b", &[]);
    assert_eq!(other.code(), 2, "{}", other.stderr);
    assert!(
        other.stderr.contains("another version of the flow `items`"),
        "{}",
        other.stderr
    );
}

#[test]
fn workers_run_from_the_bundle_with_its_imports_called_flows_schemas_and_scripts() {
    let pg = Pg::new("bundle");
    let dir = TempDir::new("cluster-bundle");
    dir.write(
        "project/lib/agents.yaml",
        "agents:\n  shout:\n    kind: transform\n    result: {loud: '=input.text + \"!\"'}\n",
    );
    dir.write(
        "project/schemas/in.json",
        r#"{"type": "object", "required": ["id", "text"], "properties": {"text": {"type": "string"}}}"#,
    );
    dir.write(
        "project/flows/child.yaml",
        "flow: child\nsteps:\n  twice:\n    set:\n      $.twice: =payload.text + payload.text\n",
    );
    // A script the command runs by a relative path, from the directory submit ran in.
    let script = dir.write(
        "project/tools/count.sh",
        "#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps({\"chars\": len(json.load(sys.stdin)[\"text\"])}))\n",
    );
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let flow = dir.write(
        "project/flows/main.yaml",
        r#"flow: main
input:
  schema: ../schemas/in.json
imports: [../lib/agents.yaml]
agents:
  child:
    kind: flow
    path: child.yaml
  count:
    kind: command
    run: [./tools/count.sh]
steps:
  loud:
    agent: shout
    input: {$.text: $.text}
    output: {$.loud: $.loud}
    next: kid
  kid:
    agent: child
    input: {$.text: $.text}
    output: {$.twice: $.twice}
    next: chars
  chars:
    agent: count
    input: {$.text: $.text}
    output: {$.chars: $.chars}
"#,
    );
    dir.write(
        "project/in.jsonl",
        "{\"id\": \"a\", \"text\": \"hey\"}\n{\"id\": \"b\", \"text\": \"hello\"}\n",
    );
    let url = pg.url("sy_bundle");
    let project = dir.path().join("project");
    let out = run(switchyard(&project)
        .arg("submit")
        .arg(&flow)
        .args([
            "--input", "in.jsonl", "--batch", "bundled", "--store", &url, "--root",
        ])
        .arg(&project));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let files: Value = serde_json::from_str(
        pg.query("SELECT files FROM bundles")[0]["files"]
            .as_deref()
            .expect("a bundle"),
    )
    .expect("bundle json");
    let mut names: Vec<&str> = files["files"]
        .as_object()
        .expect("files")
        .keys()
        .map(String::as_str)
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "flows/child.yaml",
            "flows/main.yaml",
            "lib/agents.yaml",
            "schemas/in.json",
            "tools/count.sh"
        ]
    );
    assert_eq!(files["files"]["tools/count.sh"]["exec"], json!(true));
    // The project is gone: the worker has only the store.
    std::fs::remove_dir_all(&project).expect("remove the project");
    let mut w = spawn_worker(&dir, &url, "w", &["--exit-when-idle"]);
    assert!(
        wait_exit(&mut w, Duration::from_secs(60), "the worker").success(),
        "{}",
        log_of(&dir, "w")
    );
    let outputs: HashMap<String, Value> = pg
        .query("SELECT item_id, output FROM run_records WHERE batch = 'bundled' AND parent_run IS NULL")
        .into_iter()
        .map(|r| {
            (
                r["item_id"].clone().unwrap(),
                serde_json::from_str(r["output"].as_deref().expect("output")).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outputs["a"],
        json!({"id": "a", "text": "hey", "loud": "hey!", "twice": "heyhey", "chars": 3})
    );
    assert_eq!(outputs["b"]["chars"], json!(5));
    // A bundle changed in the store is refused, not run.
    pg.query("UPDATE bundles SET files = replace(files, '+ payload.text', '+ payload.text + payload.text')");
    pg.query("UPDATE runs SET status = 'queued', lease_epoch = 0, lease_owner = NULL WHERE item_id = 'a'");
    let mut w = spawn_worker(&dir, &url, "w2", &["--exit-when-idle"]);
    let status = wait_exit(&mut w, Duration::from_secs(60), "the worker");
    assert_eq!(status.code(), Some(2), "{}", log_of(&dir, "w2"));
    assert!(
        log_of(&dir, "w2").contains("does not have its hash"),
        "{}",
        log_of(&dir, "w2")
    );
}

#[test]
fn workers_that_die_freeze_or_lose_their_connections_lose_nothing_and_run_nothing_twice() {
    const N: usize = 600;
    let pg = Pg::new("chaos");
    let dir = TempDir::new("cluster-chaos");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", side_effect_flow(&fx, "0.1"));
    write_input(&dir, N);
    let out = submit(&dir, &flow, &pg.url("sy_chaos_submit"), "chaos", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let lease = [
        "--concurrency",
        "6",
        "--lease",
        "2s",
        "--heartbeat",
        "400ms",
        "--grace",
        "5s",
    ];
    let w3_app = format!("sy_w3_{}", std::process::id());
    let mut w1 = spawn_worker(&dir, &pg.url("sy_chaos_w1"), "w1", &lease);
    let mut w2 = spawn_worker(&dir, &pg.url("sy_chaos_w2"), "w2", &lease);
    let mut w3 = spawn_worker(&dir, &pg.url(&w3_app), "w3", &lease);
    let done = || pg.count("SELECT COUNT(*) FROM runs WHERE status = 'succeeded' AND parent_run IS NULL");
    wait_for(Duration::from_secs(120), "a sixth of the batch", || {
        done() >= (N / 6) as i64
    });
    // One dies at once; one freezes past its lease; the third loses its connections.
    let _ = w1.kill();
    let _ = w1.wait();
    signal(&w2, "STOP");
    std::thread::sleep(Duration::from_millis(3500));
    let killed = pg.count(&format!(
        "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{w3_app}') t"
    ));
    assert!(killed > 0, "worker 3 had no connections to terminate");
    signal(&w2, "CONT");
    wait_for(Duration::from_secs(240), "the batch to finish", || {
        pg.count(
            "SELECT COUNT(*) FROM runs WHERE lease_epoch IS NOT NULL AND status IN ('queued', 'running')",
        ) == 0
    });
    signal(&w2, "TERM");
    signal(&w3, "TERM");
    let s2 = wait_exit(&mut w2, Duration::from_secs(30), "worker 2");
    let s3 = wait_exit(&mut w3, Duration::from_secs(30), "worker 3");
    assert!(s2.success(), "worker 2: {}", log_of(&dir, "w2"));
    assert!(s3.success(), "worker 3: {}", log_of(&dir, "w3"));
    // The frozen worker noticed that its runs were taken.
    assert!(
        log_of(&dir, "w2").contains("dropp"),
        "worker 2 dropped nothing: {}",
        log_of(&dir, "w2")
    );

    let latest = latest(&pg, "chaos");
    assert_eq!(latest.len(), N, "every item has its run");
    let fx = effects(&fx);
    let mut in_doubt = 0;
    for (id, (status, kind)) in &latest {
        let executed = fx.get(id).copied().unwrap_or(0);
        if kind.as_deref() == Some("in_doubt") {
            in_doubt += 1;
            assert!(executed <= 1, "{id} in doubt yet executed {executed} times");
        } else {
            assert_eq!(status, "succeeded", "{id}: {kind:?}");
            assert_eq!(executed, 1, "{id} executed {executed} times");
        }
    }
    assert!(in_doubt < 40, "{in_doubt} items in doubt");
    // The same input run by one process gives the same outputs.
    let local = run(switchyard(dir.path()).arg("batch").arg(&flow).args([
        "--input",
        "in.jsonl",
        "--output",
        "local.jsonl",
        "--store",
        "memory",
        "--concurrency",
        "32",
    ]));
    assert_eq!(local.code(), 0, "{}", local.stderr);
    // `collect` writes every item once, in input order, as the local batch does.
    let collected = run(switchyard(dir.path()).args([
        "collect",
        "--batch",
        "chaos",
        "--output",
        "collected.jsonl",
        "--store",
        &pg.url("sy_chaos_collect"),
    ]));
    let expected_code = if in_doubt > 0 { 3 } else { 0 };
    assert_eq!(collected.code(), expected_code, "{}", collected.stderr);
    let lines = |name: &str| -> Vec<Value> {
        std::fs::read_to_string(dir.path().join(name))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let (collected, local) = (lines("collected.jsonl"), lines("local.jsonl"));
    assert_eq!(collected.len(), N);
    assert_eq!(local.len(), N);
    for (i, (c, l)) in collected.iter().zip(&local).enumerate() {
        assert_eq!(c["id"], json!(format!("item-{i}")), "line {i}");
        assert_eq!(c["id"], l["id"], "line {i}");
        if c["status"] == "interrupted" {
            assert_eq!(c["error"]["kind"], "in_doubt", "{c}");
            continue;
        }
        assert_eq!(c["status"], l["status"], "{c} vs {l}");
        assert_eq!(c["output"], l["output"], "{c} vs {l}");
        assert!(c["run_id"].is_string(), "{c}");
    }
}

#[test]
fn collect_waits_or_writes_part_and_batches_shows_counts_and_workers() {
    const N: usize = 12;
    let pg = Pg::new("collect");
    let dir = TempDir::new("cluster-collect");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", side_effect_flow(&fx, "0.05"));
    write_input(&dir, N);
    let url = pg.url("sy_collect");
    assert_eq!(submit(&dir, &flow, &url, "c", &[]).code(), 0);
    let cmd = |args: &[&str]| run(switchyard(dir.path()).args(args).args(["--store", &url]));

    // Nothing has run: a plain collect refuses and writes nothing; --partial writes no line.
    let refused = cmd(&["collect", "--batch", "c", "--output", "out.jsonl"]);
    assert_eq!(refused.code(), 3, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("12 of its items have not finished"),
        "{}",
        refused.stderr
    );
    assert!(!dir.path().join("out.jsonl").exists());
    let part = cmd(&["collect", "--batch", "c", "--output", "out.jsonl", "--partial"]);
    assert_eq!(part.code(), 3, "{}", part.stderr);
    assert_eq!(std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap(), "");
    let unknown = cmd(&["collect", "--batch", "nope", "--output", "x.jsonl"]);
    assert_eq!(unknown.code(), 2, "{}", unknown.stderr);
    assert!(
        unknown
            .stderr
            .contains("no submitted batch `nope` (its batches: `c`)"),
        "{}",
        unknown.stderr
    );

    let shown = cmd(&["batches", "c"]);
    assert_eq!(shown.code(), 0, "{}", shown.stderr);
    assert!(shown.stdout.contains("0/12 done"), "{}", shown.stdout);
    assert!(shown.stdout.contains("12 queued"), "{}", shown.stdout);
    assert!(shown.stdout.contains("no live workers"), "{}", shown.stdout);
    let queued = cmd(&["runs", "list", "--batch", "c", "--status", "queued", "--json"]);
    assert_eq!(queued.code(), 0, "{}", queued.stderr);
    assert_eq!(queued.stdout.lines().count(), N, "{}", queued.stdout);

    // A worker that stays; collect --wait returns when every item has finished.
    let mut w = spawn_worker(&dir, &url, "w", &["--concurrency", "3"]);
    let waited = cmd(&[
        "collect",
        "--batch",
        "c",
        "--output",
        "out.jsonl",
        "--wait",
        "--poll",
        "0.2",
    ]);
    assert_eq!(waited.code(), 0, "{}\n{}", waited.stderr, log_of(&dir, "w"));
    let lines: Vec<Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), N);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["id"], json!(format!("item-{i}")));
        assert_eq!(l["status"], "succeeded");
        assert_eq!(l["output"]["sum"], json!(4 * i + 2), "{l}");
    }
    let shown = cmd(&["batches", "--json"]);
    assert_eq!(shown.code(), 0, "{}", shown.stderr);
    let rows: Vec<Value> = shown
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let batch = rows.iter().find(|r| r["batch"] == "c").expect("the batch row");
    assert_eq!(batch["succeeded"], json!(N));
    assert_eq!(batch["queued"], json!(0));
    assert!(batch["per_second"].as_f64().unwrap() > 0.0, "{batch}");
    assert!(
        rows.iter().any(|r| r["worker"].is_string()),
        "no live worker: {}",
        shown.stdout
    );
    signal(&w, "TERM");
    assert!(wait_exit(&mut w, Duration::from_secs(30), "the worker").success());
    let shown = cmd(&["batches"]);
    assert!(shown.stdout.contains("12/12 done"), "{}", shown.stdout);
    assert!(shown.stdout.contains("no live workers"), "{}", shown.stdout);
    // The batch's report, from the store: counts, and a page for each run it lists.
    let report = cmd(&["report", "--batch", "c", "--output", "c.html"]);
    assert_eq!(report.code(), 0, "{}", report.stderr);
    let page = std::fs::read_to_string(dir.path().join("c.html")).expect("the page");
    assert!(page.contains("12 items"), "{page}");
    assert!(page.contains("12 succeeded"), "{page}");
    let pages: Vec<_> = std::fs::read_dir(dir.path().join("c.runs"))
        .expect("run pages")
        .map(|e| e.expect("an entry").path())
        .collect();
    assert_eq!(pages.len(), 12, "the slowest twenty are all twelve");
    // A submitted run's page draws its flow from the batch's bundle, with the route taken.
    let one = std::fs::read_to_string(&pages[0]).expect("a run page");
    assert!(one.contains("<g class=\"node step agent ok\""), "{one}");
    assert!(one.contains("class=\"edge route taken\""), "{one}");
    let unknown = cmd(&["report", "--batch", "nope"]);
    assert_eq!(unknown.code(), 2);
    assert!(
        unknown.stderr.contains("no submitted batch `nope`"),
        "{}",
        unknown.stderr
    );
}

#[test]
fn a_poison_item_ends_lost_after_its_recoveries_and_the_others_finish() {
    let pg = Pg::new("poison");
    let dir = TempDir::new("cluster-poison");
    let fx = dir.path().join("effects");
    // Item 3 kills the worker running it (every switchyard process above the command).
    let flow = dir.write(
        "items.yaml",
        format!(
            r#"flow: poison
agents:
  side:
    kind: command
    run: [sh, -c, 'read -r x; case "$x" in *item-3*) p=$PPID; while [ "$p" -gt 1 ]; do c=$(cat /proc/$p/comm); n=$(cut -d" " -f4 /proc/$p/stat); [ "$c" = switchyard ] && kill -9 $p; p=$n; done ;; esac; printf "%s\n" "$x" >> "{fx}"; printf "%s" "$x"']
    idempotent: true
steps:
  call:
    agent: side
    output: {{$.seen: $.n}}
"#,
            fx = fx.display()
        ),
    );
    write_input(&dir, 8);
    let url = pg.url("sy_poison");
    let out = submit(&dir, &flow, &url, "p", &["--max-recoveries", "2"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    // Four at a time: the poison always has runs beside it, and they must not end `lost`.
    let args = [
        "--concurrency",
        "4",
        "--lease",
        "1s",
        "--heartbeat",
        "200ms",
        "--exit-when-idle",
    ];
    let mut deaths = 0;
    for round in 0..10 {
        let mut w = spawn_worker(&dir, &url, &format!("w{round}"), &args);
        let status = wait_exit(&mut w, Duration::from_secs(60), "a worker");
        if status.success() {
            break;
        }
        deaths += 1;
    }
    assert_eq!(
        deaths, 3,
        "the poison killed its worker once and on each of its 2 recoveries"
    );
    let latest = latest(&pg, "p");
    assert_eq!(
        latest["item-3"],
        ("failed".to_string(), Some("lost".to_string())),
        "{latest:?}"
    );
    for i in [0, 1, 2, 4, 5, 6, 7] {
        assert_eq!(latest[&format!("item-{i}")].0, "succeeded", "{latest:?}");
    }
    let error = pg.query("SELECT error FROM runs WHERE item_id = 'item-3'");
    assert!(
        error[0]["error"]
            .as_deref()
            .unwrap()
            .contains("--max-recoveries is 2"),
        "{error:?}"
    );
}

#[test]
fn sigterm_drains_gives_back_what_is_held_and_exits_zero() {
    const N: usize = 12;
    let pg = Pg::new("drain");
    let dir = TempDir::new("cluster-drain");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", side_effect_flow(&fx, "0.6"));
    write_input(&dir, N);
    let url = pg.url("sy_drain");
    assert_eq!(submit(&dir, &flow, &url, "d", &[]).code(), 0);
    let mut w = spawn_worker(&dir, &url, "first", &["--concurrency", "3", "--grace", "200ms"]);
    wait_for(Duration::from_secs(60), "the first runs", || {
        pg.count("SELECT COUNT(*) FROM runs WHERE status = 'running'") > 0
    });
    std::thread::sleep(Duration::from_millis(300));
    signal(&w, "TERM");
    let status = wait_exit(&mut w, Duration::from_secs(20), "the drained worker");
    assert!(status.success(), "{}", log_of(&dir, "first"));
    // Nothing is left held: what was not finished is free to claim at once.
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM runs WHERE lease_owner IS NOT NULL AND status = 'running'"),
        0
    );
    assert!(pg.count("SELECT COUNT(*) FROM runs WHERE status IN ('queued', 'running')") > 0);
    // `batches` counts the runs the drain gave back (still `running` on record, no lease) as
    // queued for the next worker, not as running with no live worker to run them.
    let given_back = pg.count(
        "SELECT COUNT(*) FROM run_records WHERE batch = 'd' AND parent_run IS NULL AND status = 'running' \
         AND lease_owner IS NULL",
    );
    assert!(
        given_back > 0,
        "the drain gave nothing back: {}",
        log_of(&dir, "first")
    );
    let queued =
        pg.count("SELECT COUNT(*) FROM run_records WHERE batch = 'd' AND status = 'queued'") + given_back;
    let batches = |json: bool| {
        let out = run(switchyard(dir.path())
            .args(["batches", "d", "--store", &url])
            .args(json.then_some("--json")));
        assert_eq!(out.code(), 0, "{}", out.stderr);
        out.stdout
    };
    let row: Value =
        serde_json::from_str(batches(true).lines().next().expect("the batch's line")).expect("a JSON line");
    assert_eq!(
        (&row["queued"], &row["given_back"], &row["running"]),
        (&json!(queued), &json!(given_back), &json!(0)),
        "{row}"
    );
    let text = batches(false);
    assert!(
        text.contains(&format!(
            " · {queued} queued ({given_back} given back) · 0 running · "
        )) && text.contains("no live workers"),
        "{text}"
    );
    let mut w = spawn_worker(&dir, &url, "second", &["--concurrency", "6", "--exit-when-idle"]);
    assert!(wait_exit(&mut w, Duration::from_secs(60), "the second worker").success());
    let latest = latest(&pg, "d");
    assert_eq!(latest.len(), N);
    // A paused call in flight may be in doubt; nothing is lost, nothing was taken over.
    assert!(
        latest
            .values()
            .all(|(s, k)| s == "succeeded" || k.as_deref() == Some("in_doubt")),
        "{latest:?}"
    );
    assert_eq!(pg.count("SELECT COALESCE(MAX(recoveries), 0) FROM runs"), 0);
}

#[test]
fn a_store_migrated_by_a_newer_switchyard_stops_the_worker() {
    let pg = Pg::new("newer");
    let dir = TempDir::new("cluster-newer");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", side_effect_flow(&fx, "0.3"));
    write_input(&dir, 30);
    let url = pg.url("sy_newer");
    assert_eq!(submit(&dir, &flow, &url, "n", &[]).code(), 0);
    let mut w = spawn_worker(
        &dir,
        &url,
        "w",
        &["--concurrency", "2", "--heartbeat", "200ms", "--lease", "2s"],
    );
    wait_for(Duration::from_secs(60), "a first run", || {
        pg.count("SELECT COUNT(*) FROM runs WHERE status = 'succeeded'") > 0
    });
    pg.query(
        "INSERT INTO schema_version (version, applied_at, description) VALUES (99, 0, 'from the future')",
    );
    let before = pg.count("SELECT COUNT(*) FROM steps");
    let status = wait_exit(&mut w, Duration::from_secs(30), "the worker");
    assert_eq!(status.code(), Some(1), "{}", log_of(&dir, "w"));
    let log = log_of(&dir, "w");
    assert!(log.contains("written by a newer switchyard (schema 99"), "{log}");
    // Nothing was written in the old shape after the migration was seen (a group already
    // checked may have committed just before).
    let after = pg.count("SELECT COUNT(*) FROM steps");
    assert!(after - before <= 4, "{before} → {after}");
}

/// Items 0..4 call a non-idempotent command that counts its executions in `effects` and sleeps;
/// items 4..8 wait at an `interrupt` step.
fn gates_flow(effects: &Path) -> String {
    format!(
        r#"flow: gates
input:
  schema: {{type: object, required: [id, n], properties: {{n: {{type: integer}}}}}}
agents:
  side:
    kind: command
    run: [sh, -c, 'read -r x; [ -n "$x" ] || exit 1; printf "%s\n" "$x" >> "{effects}"; sleep 3; printf "%s" "$x"']
    idempotent: false
steps:
  route:
    set: {{$.slow: "=payload.n < 4"}}
    next:
      - to: call
        if: payload.slow
      - to: approve
  call:
    agent: side
    output: {{$.seen: $.n}}
  approve:
    interrupt:
      prompt: "item {{{{ input.id }}}}?"
      schema: {{type: object, required: [approved], properties: {{approved: {{type: boolean}}}}}}
    input: {{$.id: $.id}}
    output: {{$.approval: $}}
"#,
        effects = effects.display()
    )
}

#[test]
fn resume_batch_continues_the_stopped_runs_it_is_told_how_to() {
    let pg = Pg::new("resume");
    let dir = TempDir::new("cluster-resume");
    let fx = dir.path().join("effects");
    let flow = dir.write("gates.yaml", gates_flow(&fx));
    write_input(&dir, 8);
    let url = pg.url("sy_resume");
    let out = submit(&dir, &flow, &url, "gates", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let cmd = |args: &[&str]| run(switchyard(dir.path()).args(args).args(["--store", &url]));
    let interrupted =
        || pg.count("SELECT COUNT(*) FROM run_records WHERE batch = 'gates' AND status = 'interrupted'");
    let lease = ["--concurrency", "8", "--lease", "2s", "--heartbeat", "400ms"];

    // A worker stops the gated items at their interrupt and dies while the others are in
    // their non-idempotent call.
    let mut w1 = spawn_worker(&dir, &url, "w1", &lease);
    wait_for(Duration::from_secs(60), "four calls and four waits", || {
        effects(&fx).len() == 4 && interrupted() == 4
    });
    let _ = w1.kill();
    let _ = w1.wait();

    // Without a decision, the waiting runs are left and named; the others are not stopped.
    let left = cmd(&["resume", "--batch", "gates"]);
    assert_eq!(left.code(), 3, "{}\n{}", left.stdout, left.stderr);
    assert_eq!(
        left.stdout.matches("left: waits for a decision").count(),
        4,
        "{}",
        left.stdout
    );
    assert!(
        left.stderr
            .contains("0 interrupted run(s) continued; left as they are: 4 waiting for a decision"),
        "{}",
        left.stderr
    );

    // Another worker finds the dead one's calls in doubt and stops those runs too.
    let mut w2 = spawn_worker(&dir, &url, "w2", &lease);
    wait_for(Duration::from_secs(60), "eight stopped runs", || {
        interrupted() == 8
    });
    signal(&w2, "TERM");
    assert!(wait_exit(&mut w2, Duration::from_secs(30), "worker 2").success());
    let in_doubt = pg.count(
        "SELECT COUNT(*) FROM run_records WHERE batch = 'gates' AND status = 'interrupted' AND error LIKE '%in_doubt%'",
    );
    assert_eq!(in_doubt, 4, "{}", log_of(&dir, "w2"));

    // A decision the question refuses resumes nothing; the runs in doubt wait for the flag.
    let refused = cmd(&[
        "resume",
        "--batch",
        "gates",
        "--decision",
        r#"{"approved": "yes"}"#,
    ]);
    assert_eq!(refused.code(), 2, "{}\n{}", refused.stdout, refused.stderr);
    assert_eq!(
        refused
            .stdout
            .matches("not resumed: the decision does not match")
            .count(),
        4,
        "{}",
        refused.stdout
    );
    assert_eq!(
        refused.stdout.matches("left: in doubt").count(),
        4,
        "{}",
        refused.stdout
    );
    assert_eq!(interrupted(), 8);

    // One run, by its id: from the batch's bundle, under a lease of its own.
    let one = pg.query(
        "SELECT id FROM run_records WHERE batch = 'gates' AND error LIKE '%in_doubt%' ORDER BY item_index LIMIT 1",
    );
    let one = one[0]["id"].clone().expect("a run in doubt");
    let single = cmd(&["resume", &one, "--retry-in-doubt"]);
    assert_eq!(single.code(), 0, "{}", single.stderr);
    let output: Value = serde_json::from_str(&single.stdout).expect("the run's output");
    assert_eq!(output["seen"], json!(0), "{output}");

    let done = cmd(&[
        "resume",
        "--batch",
        "gates",
        "--retry-in-doubt",
        "--decision",
        r#"{"approved": true}"#,
        "--concurrency",
        "3",
    ]);
    assert_eq!(done.code(), 0, "{}\n{}", done.stdout, done.stderr);
    assert_eq!(done.stdout.matches("  succeeded").count(), 7, "{}", done.stdout);
    assert!(
        done.stderr
            .contains("7 interrupted run(s) continued: 7 succeeded"),
        "{}",
        done.stderr
    );
    // Each call in doubt was made again, once; nothing else ran twice.
    let fx = effects(&fx);
    assert_eq!(fx.len(), 4, "{fx:?}");
    assert!(fx.values().all(|&n| n == 2), "{fx:?}");

    let collected = cmd(&["collect", "--batch", "gates", "--output", "out.jsonl"]);
    assert_eq!(collected.code(), 0, "{}", collected.stderr);
    let lines: Vec<Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 8);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["status"], "succeeded", "{l}");
        if i < 4 {
            assert_eq!(l["output"]["seen"], json!(i), "{l}");
        } else {
            assert_eq!(l["output"]["approval"], json!({"approved": true}), "{l}");
        }
    }
    // Nothing stopped is left: a second resume has nothing to do.
    let again = cmd(&["resume", "--batch", "gates"]);
    assert_eq!(again.code(), 0, "{}", again.stderr);
    assert!(
        again.stderr.contains("0 interrupted run(s) continued"),
        "{}",
        again.stderr
    );
    let unknown = cmd(&["resume", "--batch", "nope"]);
    assert_eq!(unknown.code(), 2);
    assert!(
        unknown.stderr.contains("no submitted batch `nope`"),
        "{}",
        unknown.stderr
    );
    let both = cmd(&["resume", "r1", "--batch", "gates"]);
    assert_eq!(both.code(), 2, "{}", both.stderr);
}

/// Ctrl-C stops `resume --batch` as it stops `batch`: no more runs start, the one in its call
/// finishes it and is recorded, the process exits 130, and the next `resume --batch` continues
/// the rest — every call made once, none in doubt.
#[test]
fn ctrl_c_stops_resume_batch_at_a_recorded_point() {
    let pg = Pg::new("resume_ctrl_c");
    let dir = TempDir::new("cluster-resume-ctrl-c");
    let fx = dir.path().join("effects");
    let flow = dir.write(
        "asked.yaml",
        format!(
            r#"flow: asked
agents:
  side:
    kind: command
    run: [sh, -c, 'read -r x; [ -n "$x" ] || exit 1; printf "%s\n" "$x" >> "{effects}"; sleep 1; printf "%s" "$x"']
    idempotent: false
steps:
  approve:
    interrupt:
      prompt: "item {{{{ input.id }}}}?"
      schema: {{type: object, required: [approved], properties: {{approved: {{type: boolean}}}}}}
    input: {{$.id: $.id}}
    output: {{$.approval: $}}
    next: call
  call:
    agent: side
    output: {{$.seen: $.n}}
"#,
            effects = fx.display()
        ),
    );
    write_input(&dir, 4);
    let url = pg.url("sy_resume_ctrl_c");
    let out = submit(&dir, &flow, &url, "asked", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let mut w = spawn_worker(&dir, &url, "w", &["--exit-when-idle"]);
    assert!(wait_exit(&mut w, Duration::from_secs(60), "the worker").success());
    let resume = || {
        switchyard(dir.path())
            .args([
                "resume",
                "--batch",
                "asked",
                "--concurrency",
                "1",
                "--store",
                &url,
            ])
            .args(["--decision", r#"{"approved": true}"#])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("resume starts")
    };
    let first = resume();
    wait_for(Duration::from_secs(60), "the first call", || {
        !effects(&fx).is_empty()
    });
    signal(&first, "INT");
    let out = first.wait_with_output().expect("exits");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(130), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.matches("left: not started (Ctrl-C)").count(),
        3,
        "{stdout}"
    );
    assert!(
        stderr.contains("left as they are: 3 not started (Ctrl-C)"),
        "{stderr}"
    );
    let in_doubt =
        || pg.count("SELECT COUNT(*) FROM run_records WHERE batch = 'asked' AND error LIKE '%in_doubt%'");
    assert_eq!(in_doubt(), 0);

    let rest = resume().wait_with_output().expect("exits");
    assert_eq!(
        rest.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&rest.stderr)
    );
    let seen = effects(&fx);
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
    assert_eq!(in_doubt(), 0);
}
