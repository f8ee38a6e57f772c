//! Interrupt steps through `run`, `batch`, `resume` and `runs cancel`: a decision checked
//! against its schema, one too late, a run cancelled while it waits, interrupted items written
//! as such and updated once resumed, an interrupt inside a child flow, and a resumed run that
//! keeps the context it started with.

use std::time::Duration;

use serde_json::{Value, json};

use crate::batch::read_lines;
use crate::support::{TempDir, run, run_id_from, switchyard};

const REFUND: &str = r#"flow: refund
agents:
  pay:
    kind: transform
    result: {paid: =input.amount}
steps:
  approve:
    interrupt:
      prompt: "Refund {{ input.amount }}?"
      schema: {type: object, required: [approved], properties: {approved: {type: boolean}}}
      expires: EXPIRES
    input: [$.amount]
    output: {$.approval: $}
    next:
      - to: refund
        if: payload.approval.approved
      - to: end
  refund:
    agent: pay
    input: [$.amount]
    output: {$.paid: $.paid}
"#;

fn interrupted_run(dir: &TempDir, expires: &str) -> String {
    dir.write("refund.yaml", REFUND.replace("EXPIRES", expires));
    let out = run(switchyard(dir.path()).args([
        "run",
        "refund.yaml",
        "--store",
        "sqlite:runs.db",
        "--input",
        r#"{"amount": 40}"#,
    ]));
    assert_eq!(out.code(), 3, "{}", out.stderr);
    run_id_from(&out.stderr)
}

#[test]
fn an_interrupt_waits_for_a_decision_checked_against_its_schema() {
    let dir = TempDir::new("interrupt");
    let id = interrupted_run(&dir, "72h");
    let store = ["--store", "sqlite:runs.db"];
    let list = run(switchyard(dir.path())
        .args(["runs", "list", "--status", "interrupted"])
        .args(store));
    assert!(list.stdout.contains(&id), "{}", list.stdout);

    let no_decision = run(switchyard(dir.path()).args(["resume", &id]).args(store));
    assert_eq!(no_decision.code(), 2);
    assert!(
        no_decision.stderr.contains("waits at interrupt step `approve`"),
        "{}",
        no_decision.stderr
    );
    let bad = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"approved": "yes"}"#])
        .args(store));
    assert_eq!(bad.code(), 2);
    assert!(
        bad.stderr
            .contains("does not match the `schema` of interrupt step `approve` at `/approved`"),
        "{}",
        bad.stderr
    );
    let not_json = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", "{"])
        .args(store));
    assert_eq!(not_json.code(), 2);
    assert!(
        not_json
            .stderr
            .contains("--decision is not valid JSON: EOF while parsing an object (line 1, column 1)\n"),
        "{}",
        not_json.stderr
    );

    let ok = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"approved": true}"#])
        .args(store));
    assert_eq!(ok.code(), 0, "{}", ok.stderr);
    let output: Value = serde_json::from_str(&ok.stdout).unwrap();
    assert_eq!(
        output,
        json!({"amount": 40, "approval": {"approved": true}, "paid": 40})
    );
    let show = run(switchyard(dir.path()).args(["runs", "show", &id]).args(store));
    assert!(show.stdout.contains("✓ 1 approve [interrupt]"), "{}", show.stdout);
    assert!(show.stdout.contains("✓ 2 refund [agent]"), "{}", show.stdout);
}

#[test]
fn a_late_decision_fails_the_step_and_a_changed_flow_is_refused() {
    let dir = TempDir::new("interrupt-late");
    let id = interrupted_run(&dir, "50ms");
    std::thread::sleep(Duration::from_millis(120));
    let store = ["--store", "sqlite:runs.db"];

    // Changing the flow file: refused, unless --allow-changed.
    let text = std::fs::read_to_string(dir.path().join("refund.yaml")).unwrap();
    dir.write(
        "refund.yaml",
        text.replace("paid: =input.amount", "paid: =input.amount + 0"),
    );
    let changed = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"approved": true}"#])
        .args(store));
    assert_eq!(changed.code(), 2);
    assert!(
        changed.stderr.contains("changed since run") && changed.stderr.contains("--allow-changed"),
        "{}",
        changed.stderr
    );
    let late = run(switchyard(dir.path())
        .args([
            "resume",
            &id,
            "--decision",
            r#"{"approved": true}"#,
            "--allow-changed",
        ])
        .args(store));
    // A late answer is refused (SPEC §15) and not recorded; what settles the question (here
    // `inbox list`) continues the run, whose step fails `timeout`.
    assert_eq!(late.code(), 2, "{}", late.stderr);
    assert!(
        late.stderr.contains("was not decided here: expired at "),
        "{}",
        late.stderr
    );
    dir.write("refund.yaml", text);
    let settled = run(switchyard(dir.path())
        .args(["inbox", "list", "--json"])
        .args(store));
    assert_eq!(settled.code(), 0, "{}", settled.stderr);
    assert!(
        settled.stderr.contains(&id) && settled.stderr.contains("failed: [timeout]"),
        "{}",
        settled.stderr
    );
}

#[test]
fn runs_cancel_ends_an_interrupted_run() {
    let dir = TempDir::new("cancel");
    let id = interrupted_run(&dir, "72h");
    let store = ["--store", "sqlite:runs.db"];
    let out = run(switchyard(dir.path()).args(["runs", "cancel", &id]).args(store));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(out.stdout.contains(&format!("cancelled {id}")));
    let show = run(switchyard(dir.path())
        .args(["runs", "show", &id, "--json"])
        .args(store));
    let doc: Value = serde_json::from_str(&show.stdout).unwrap();
    assert_eq!(doc["run"]["status"], "cancelled");
    let again = run(switchyard(dir.path()).args(["runs", "cancel", &id]).args(store));
    assert_eq!(again.code(), 2);
    assert!(
        again.stderr.contains("already ended cancelled"),
        "{}",
        again.stderr
    );
    let missing = run(switchyard(dir.path())
        .args(["runs", "show", "r-nope"])
        .args(store));
    assert_eq!(missing.code(), 2);
    assert!(
        missing.stderr.contains("run `r-nope` not found"),
        "{}",
        missing.stderr
    );
}

#[test]
fn interrupted_items_are_written_as_such_and_updated_once_resumed() {
    let dir = TempDir::new("batch-interrupt");
    dir.write(
        "approve.yaml",
        r#"flow: approve
steps:
  gate:
    interrupt:
      prompt: "Approve {{ input.id }}?"
      schema: {type: object, required: [ok], properties: {ok: {type: boolean}}}
    input: [$.id]
    output: {$.ok: $.ok}
    next:
      - to: end
        if: payload.ok
      - to: no
  no:
    fail: {kind: rejected, message: "not approved"}
"#,
    );
    dir.write("in.jsonl", "{\"id\": \"a\"}\n{\"id\": \"b\"}\n");
    // `batch` or `runs export` of this flow and input.
    let over = |command: &[&str], output: &str, store: &str| {
        run(switchyard(dir.path()).args(command).args([
            "approve.yaml",
            "--input",
            "in.jsonl",
            "--output",
            output,
            "--store",
            store,
        ]))
    };
    let batch = || over(&["batch"], "out.jsonl", "sqlite:runs.db");
    let export = || over(&["runs", "export"], "out.jsonl", "sqlite:runs.db");
    // On a throwaway store the summary does not send anyone to resume what is gone.
    let throwaway = over(&["batch"], "memory-out.jsonl", "memory");
    assert_eq!(throwaway.code(), 3, "{}", throwaway.stderr);
    assert!(
        throwaway.stderr.contains("nothing of them outlives this process"),
        "{}",
        throwaway.stderr
    );
    let out = batch();
    assert_eq!(out.code(), 3, "{}", out.stderr);
    assert!(out.stderr.contains("2 item(s) interrupted"), "{}", out.stderr);
    // The commands it gives name the batch's store.
    for hint in [
        "`switchyard runs list --status interrupted --store sqlite:runs.db`",
        "`switchyard resume RUN_ID --decision JSON --store sqlite:runs.db`",
    ] {
        assert!(out.stderr.contains(hint), "{hint} in {}", out.stderr);
    }
    let lines = read_lines(&dir.path().join("out.jsonl"));
    assert!(lines.iter().all(|l| l["status"] == "interrupted"), "{lines:?}");
    let a = lines[0]["run_id"].as_str().unwrap().to_string();
    let b = lines[1]["run_id"].as_str().unwrap().to_string();
    let store = ["--store", "sqlite:runs.db"];
    let yes = run(switchyard(dir.path())
        .args(["resume", &a, "--decision", r#"{"ok": true}"#])
        .args(store));
    assert_eq!(yes.code(), 0, "{}", yes.stderr);
    // `runs export` writes the output again from the store, running nothing.
    let runs = |dir: &TempDir| {
        run(switchyard(dir.path())
            .args(["runs", "list", "--json"])
            .args(store))
        .stdout
        .lines()
        .count()
    };
    let before = runs(&dir);
    let out = export();
    assert_eq!(out.code(), 3, "b is still interrupted: {}", out.stderr);
    assert!(
        out.stderr
            .contains("2 of 2 items written: 1 succeeded, 0 failed, 1 interrupted"),
        "{}",
        out.stderr
    );
    let lines = read_lines(&dir.path().join("out.jsonl"));
    assert_eq!(lines[0]["status"], "succeeded");
    assert_eq!(lines[0]["output"], json!({"id": "a", "ok": true}));
    assert_eq!(lines[1]["status"], "interrupted");
    assert_eq!(runs(&dir), before, "export started a run");
    let no = run(switchyard(dir.path())
        .args(["resume", &b, "--decision", r#"{"ok": false}"#])
        .args(store));
    assert_eq!(no.code(), 1, "{}", no.stderr);
    // The next start of the batch writes their new lines, running nothing.
    let out = batch();
    assert_eq!(out.code(), 1, "{}", out.stderr);
    let lines = read_lines(&dir.path().join("out.jsonl"));
    assert_eq!(lines[0]["status"], "succeeded");
    assert_eq!(lines[0]["output"], json!({"id": "a", "ok": true}));
    assert_eq!(lines[1]["status"], "failed");
    assert_eq!(lines[1]["error"]["kind"], "rejected");
    // An item never run ends the export: the lines before it are written, and it says so.
    dir.write("in.jsonl", "{\"id\": \"a\"}\n{\"id\": \"b\"}\n{\"id\": \"c\"}\n");
    let out = export();
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("item `c` (line 3) has not finished"),
        "{}",
        out.stderr
    );
    assert_eq!(read_lines(&dir.path().join("out.jsonl")).len(), 2);
    assert_eq!(runs(&dir), before, "export started a run");
    // A store that never saw the batch is refused, and the output is left as it was.
    for other in ["sqlite:other.db", "memory"] {
        let wrong = over(&["runs", "export"], "out.jsonl", other);
        assert_eq!(wrong.code(), 2, "{other}: {}", wrong.stderr);
        assert!(
            wrong.stderr.contains("holds no runs of the batch"),
            "{other}: {}",
            wrong.stderr
        );
    }
    assert_eq!(read_lines(&dir.path().join("out.jsonl")).len(), 2);
}

#[test]
fn an_interrupt_inside_a_child_flow_interrupts_the_parent_and_its_decision_continues_both() {
    let dir = TempDir::new("interrupt-nested");
    let fx = dir.path().join("effects");
    dir.write(
        "parent.yaml",
        format!(
            r#"flow: parent
agents:
  before:
    kind: command
    run: [sh, -c, 'cat > /dev/null; echo before >> "{fx}"; echo "{{}}"']
    idempotent: false
  review:
    kind: flow
    steps:
      ask:
        interrupt:
          prompt: "Approve {{{{ input.amount }}}}?"
          schema: {{type: object, required: [ok], properties: {{ok: {{type: boolean}}}}}}
        output: {{$.ok: $.ok}}
    output:
      select: $.ok
steps:
  first:
    agent: before
    next: check
  check:
    agent: review
    input: {{$.amount: $.amount}}
    output: {{$.approved: $}}
"#,
            fx = fx.display()
        ),
    );
    let store = ["--store", "sqlite:runs.db"];
    let out = run(switchyard(dir.path())
        .args(["run", "parent.yaml", "--input", r#"{"amount": 7}"#])
        .args(store));
    assert_eq!(out.code(), 3, "{}", out.stderr);
    let id = run_id_from(&out.stderr);
    // The decision is checked against the child's interrupt.
    let bad = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"ok": 1}"#])
        .args(store));
    assert_eq!(bad.code(), 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("interrupt step `ask`"), "{}", bad.stderr);
    let ok = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"ok": true}"#])
        .args(store));
    assert_eq!(ok.code(), 0, "{}", ok.stderr);
    let output: Value = serde_json::from_str(&ok.stdout).expect("output JSON");
    assert_eq!(output["approved"], json!(true));
    // The step before the child ran once.
    assert_eq!(std::fs::read_to_string(&fx).unwrap().lines().count(), 1);
}

/// A resumed run is replayed with the context it started with: `resume --context` is refused,
/// not taken and ignored, and the run is left as it was.
#[test]
fn resume_refuses_a_context_and_keeps_the_run_s_own() {
    let dir = TempDir::new("resume-context");
    dir.write(
        "ctx.yaml",
        "flow: ctx\nsteps:\n  ask:\n    interrupt:\n      prompt: go?\n    next: done\n  done:\n    set:\n      $.who: =context.who\n",
    );
    let store = ["--store", "sqlite:runs.db"];
    let out = run(switchyard(dir.path())
        .args([
            "run",
            "ctx.yaml",
            "--input",
            "{}",
            "--context",
            r#"{"who": "first"}"#,
        ])
        .args(store));
    assert_eq!(out.code(), 3, "{}", out.stderr);
    let id = run_id_from(&out.stderr);
    let refused = run(switchyard(dir.path())
        .args([
            "resume",
            &id,
            "--decision",
            "{}",
            "--context",
            r#"{"who": "second"}"#,
        ])
        .args(store));
    assert_eq!(refused.code(), 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains(
            "--context is not taken by resume: a resumed run is replayed with the context it started with"
        ),
        "{}",
        refused.stderr
    );
    let ok = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", "{}"])
        .args(store));
    assert_eq!(ok.code(), 0, "the run still waited: {}", ok.stderr);
    let output: Value = serde_json::from_str(&ok.stdout).expect("output JSON");
    assert_eq!(output["who"], json!("first"));
}
