//! A run keeps the agent changes it started with (SPEC §8.4) when it is resumed: after a stop
//! at an `interrupt` and after a crash, a plain `resume` applies them again (the change file
//! may be gone by then), an `--agent-change` other than those is refused, and a batch started
//! again under other changes is refused as a changed flow is.

use serde_json::{Value, json};

use crate::support::{TempDir, run, run_id_from, switchyard};

const STORE: [&str; 2] = ["--store", "sqlite:runs.db"];

/// The child flow `payer`: its non-idempotent `refund` appends a line to `refunds.log`.
fn payer(dir: &TempDir) -> String {
    format!(
        r#"flow: payer
agents:
  refund:
    kind: command
    run: [sh, -c, 'cat >/dev/null; echo refunded >> "{log}"; echo "{{\"refunded\": true}}"']
    idempotent: false
steps:
  pay: {{agent: refund, output: "*"}}
"#,
        log = dir.path().join("refunds.log").display()
    )
}

/// A run that waits for a decision, then calls the child flow `payer`, whose `refund` the
/// change file `no-refunds.yaml` replaces with a mock.
fn interrupting(dir: &TempDir) {
    dir.write("payer.yaml", payer(dir));
    dir.write(
        "refunds.yaml",
        r#"flow: refunds
agents:
  payer: {kind: flow, path: payer.yaml}
steps:
  approve: {interrupt: {prompt: "refund?", schema: {type: object}}, next: pay}
  pay: {agent: payer, output: "*"}
"#,
    );
    dir.write(
        "no-refunds.yaml",
        "- scope: all_subagents\n  mode: replace\n  agents: {refund: {kind: mock, returns: {refunded: false, mocked: true}}}\n",
    );
}

/// `run refunds.yaml --agent-change no-refunds.yaml`, stopped at its interrupt: the run id.
fn start_interrupted(dir: &TempDir) -> String {
    let out = run(switchyard(dir.path())
        .args(["run", "refunds.yaml", "--input", r#"{"amount": 5}"#])
        .args(["--agent-change", "no-refunds.yaml"])
        .args(STORE));
    assert_eq!(out.code(), 3, "{}", out.stderr);
    let id = run_id_from(&out.stderr);
    assert!(
        out.stderr.contains(&format!("switchyard resume {id} --decision")),
        "{}",
        out.stderr
    );
    id
}

fn resume(dir: &TempDir, id: &str, extra: &[&str]) -> crate::support::Output {
    run(switchyard(dir.path())
        .args(["resume", id, "--decision", "{}"])
        .args(extra)
        .args(STORE))
}

fn refunds(dir: &TempDir) -> Option<String> {
    std::fs::read_to_string(dir.path().join("refunds.log")).ok()
}

fn output(out: &crate::support::Output) -> Value {
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

#[test]
fn a_run_stopped_at_an_interrupt_resumes_under_its_agent_changes_without_the_file() {
    // Each scope that reaches the child flow means the same after the resume.
    for scope in [
        "scope: all_subagents",
        "scope: global",
        "scope: specific\n  flows: [payer]",
    ] {
        let dir = TempDir::new("resume-changes-interrupt");
        interrupting(&dir);
        dir.write(
            "no-refunds.yaml",
            format!(
                "- {scope}\n  mode: replace\n  agents: {{refund: {{kind: mock, returns: {{refunded: false, mocked: true}}}}}}\n"
            ),
        );
        let id = start_interrupted(&dir);
        // The file is gone by the time someone answers.
        std::fs::remove_file(dir.path().join("no-refunds.yaml")).expect("remove the change file");

        let out = resume(&dir, &id, &[]);
        assert_eq!(out.code(), 0, "{scope}: {}", out.stderr);
        assert_eq!(refunds(&dir), None, "{scope}: the removed refund ran");
        assert_eq!(
            output(&out),
            json!({"amount": 5, "refunded": false, "mocked": true}),
            "{scope}"
        );
    }
}

#[test]
fn a_resume_with_other_agent_changes_is_refused_and_with_the_same_ones_goes_on() {
    let dir = TempDir::new("resume-changes-other");
    interrupting(&dir);
    let id = start_interrupted(&dir);
    dir.write(
        "other.yaml",
        "- scope: all_subagents\n  mode: replace\n  agents: {refund: {kind: mock, returns: {refunded: false, mocked: 2}}}\n",
    );
    let out = resume(&dir, &id, &["--agent-change", "other.yaml", "--allow-changed"]);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "run `{id}` started with other agent changes than the --agent-change given"
        )) && out.stderr.contains("resume it without --agent-change"),
        "{}",
        out.stderr
    );
    // The same changes written another way are the same changes.
    dir.write(
        "same.yaml",
        "# the same\n- mode: replace\n  scope: all_subagents\n  agents:\n    refund: {kind: mock, returns: {mocked: true, refunded: false}}\n",
    );
    let out = resume(&dir, &id, &["--agent-change", "same.yaml"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(refunds(&dir), None, "the removed refund ran");
    assert_eq!(output(&out)["mocked"], true, "{}", out.stdout);
}

#[test]
fn a_run_started_without_agent_changes_refuses_them_on_resume() {
    let dir = TempDir::new("resume-changes-none");
    interrupting(&dir);
    let out = run(switchyard(dir.path())
        .args(["run", "refunds.yaml", "--input", r#"{"amount": 5}"#])
        .args(STORE));
    assert_eq!(out.code(), 3, "{}", out.stderr);
    let id = run_id_from(&out.stderr);
    let out = resume(&dir, &id, &["--agent-change", "no-refunds.yaml"]);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("started without agent changes, and --agent-change gives some"),
        "{}",
        out.stderr
    );
}

/// A flow whose first step kills this switchyard process (SIGKILL) the first time it runs,
/// then calls `refund`, which the change file `no-refunds.yaml` takes away: its failure
/// (`capability`) routes to `held`.
fn crashing(dir: &TempDir) {
    let marker = dir.path().join("crashed");
    dir.write(
        "crash.yaml",
        format!(
            r#"flow: crash
agents:
  once:
    kind: command
    # The program's parent is its supervisor; the engine is the supervisor's parent.
    run: [sh, -c, 'if [ ! -e "{marker}" ]; then : > "{marker}"; kill -9 $(cut -d" " -f4 /proc/$PPID/stat); sleep 2; fi; echo "{{}}"']
    idempotent: true
  refund:
    kind: command
    run: [sh, -c, 'cat >/dev/null; echo refunded >> "{log}"; echo "{{\"refunded\": true}}"']
    idempotent: false
steps:
  first: {{agent: once, output: {{}}, next: pay}}
  pay:
    agent: refund
    output: "*"
    next:
      - to: end
      - to: held
        on: failure
        errors: [capability]
  held: {{set: {{$.held: {{value: true}}}}}}
"#,
            marker = marker.display(),
            log = dir.path().join("refunds.log").display()
        ),
    );
    dir.write(
        "no-refunds.yaml",
        "- scope: root\n  mode: remove\n  agents: [refund]\n",
    );
}

#[test]
fn a_run_killed_mid_way_resumes_under_its_agent_changes() {
    let dir = TempDir::new("resume-changes-killed");
    crashing(&dir);
    let crashed = run(switchyard(dir.path())
        .args(["run", "crash.yaml", "--input", r#"{"amount": 5}"#])
        .args(["--agent-change", "no-refunds.yaml"])
        .args(STORE));
    assert!(crashed.status.code().is_none(), "killed: {crashed:?}");
    let list = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(STORE));
    let id = serde_json::from_str::<Value>(list.stdout.lines().next().expect("one run"))
        .expect("a JSON line")["id"]
        .as_str()
        .expect("an id")
        .to_string();
    std::fs::remove_file(dir.path().join("no-refunds.yaml")).expect("remove the change file");

    let out = run(switchyard(dir.path()).args(["resume", &id]).args(STORE));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(refunds(&dir), None, "the removed refund ran");
    assert_eq!(output(&out), json!({"amount": 5, "held": true}));
}

#[test]
fn a_batch_started_again_under_other_agent_changes_is_refused_without_allow_changed() {
    let dir = TempDir::new("resume-changes-batch");
    crashing(&dir);
    dir.write("in.jsonl", "{\"id\": \"a\", \"amount\": 2}\n");
    let batch = |extra: &[&str]| {
        run(switchyard(dir.path())
            .args([
                "batch",
                "crash.yaml",
                "--input",
                "in.jsonl",
                "--output",
                "out.jsonl",
            ])
            .args(STORE)
            .args(extra))
    };
    let crashed = batch(&["--agent-change", "no-refunds.yaml"]);
    assert!(crashed.status.code().is_none(), "killed: {crashed:?}");

    // Started again without the change that took `refund` away.
    let out = batch(&[]);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "1 unfinished run(s) of this batch started under other agent changes than this command's --agent-change"
        ) && out.stderr.contains("--allow-changed"),
        "{}",
        out.stderr
    );
    assert_eq!(refunds(&dir), None, "the removed refund ran");

    let out = batch(&["--agent-change", "no-refunds.yaml"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(refunds(&dir), None, "the removed refund ran");
    let line: Value = serde_json::from_str(
        std::fs::read_to_string(dir.path().join("out.jsonl"))
            .expect("the output file")
            .trim(),
    )
    .expect("a JSON line");
    assert_eq!(
        line["output"],
        json!({"id": "a", "amount": 2, "held": true}),
        "{line}"
    );
}

/// A store of schema 8 (before runs kept their agent changes) is brought up to date by
/// `resume`: its run reads as one without changes, and new runs record theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_8_store_is_upgraded_by_resume() {
    let dir = TempDir::new("resume-changes-schema-8");
    interrupting(&dir);
    let out = run(switchyard(dir.path())
        .args(["run", "refunds.yaml", "--input", r#"{"amount": 5}"#])
        .args(STORE));
    assert_eq!(out.code(), 3, "{}", out.stderr);
    let id = run_id_from(&out.stderr);
    let db = dir.path().join("runs.db");
    let mut conn = crate::store::raw(&db).await;
    for sql in &crate::store::SCHEMA_5_TO_4[5..7] {
        sqlx::query(*sql).execute(&mut conn).await.expect(sql);
    }
    sqlx::Connection::close(conn).await.expect("close");

    let out = resume(&dir, &id, &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(refunds(&dir).as_deref(), Some("refunded\n"));
    let id = start_interrupted(&dir);
    let mut conn = crate::store::raw(&db).await;
    let version: i64 = sqlx::query_scalar("SELECT MAX(version) FROM schema_version")
        .fetch_one(&mut conn)
        .await
        .expect("a version");
    assert_eq!(version, switchyard::__private::store::sql::SCHEMA_VERSION);
    let recorded: Option<String> = sqlx::query_scalar("SELECT agent_changes FROM runs WHERE id = $1")
        .bind(&id)
        .fetch_one(&mut conn)
        .await
        .expect("the run");
    sqlx::Connection::close(conn).await.expect("close");
    let recorded: Value = serde_json::from_str(&recorded.expect("recorded changes")).expect("JSON");
    assert_eq!(recorded[0]["agents"]["refund"]["kind"], "mock", "{recorded}");
}

/// Through the library, a resume given no agent changes takes the run's recorded ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_resumed_through_the_library_keeps_its_agent_changes() {
    use switchyard::__private::runtime::engine::RunOptions;
    use switchyard::ResumeOptions;
    use switchyard::{Flow, RunConfig, RunStatus, Switchyard};

    let dir = TempDir::new("resume-changes-library");
    interrupting(&dir);
    let flow = Flow::load(dir.path().join("refunds.yaml")).expect("the flow");
    let text = std::fs::read_to_string(dir.path().join("no-refunds.yaml")).expect("the changes");
    let changes = switchyard::__private::runtime::changes::load(
        "no-refunds.yaml",
        &text,
        switchyard::__private::plan_of(&flow),
    )
    .expect("valid changes");
    let url = format!("sqlite:{}", dir.path().join("runs.db").display());
    let sy = Switchyard::open(&url).await.expect("the store");
    let config = RunConfig {
        options: switchyard::__private::with_agent_changes(RunOptions::default(), changes),
        ..RunConfig::default()
    };
    let stopped = sy
        .run_with(&flow, json!({"amount": 5}), config)
        .await
        .expect("a run");
    assert_eq!(stopped.status, RunStatus::Interrupted);

    let resume = ResumeOptions::default().decision(json!({}));
    let done = sy
        .resume(&flow, &stopped.run_id, resume, RunConfig::default())
        .await
        .expect("resumed");
    assert_eq!(done.status, RunStatus::Succeeded, "{:?}", done.error);
    assert_eq!(refunds(&dir), None, "the removed refund ran");
    assert_eq!(
        done.output,
        Some(json!({"amount": 5, "refunded": false, "mocked": true}))
    );
    sy.close().await;
}
