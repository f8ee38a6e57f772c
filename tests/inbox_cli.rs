//! The inbox on the command line (SPEC §15), through the binary and a SQLite store: a batch
//! whose runs all stop at one question, listed as one group; a bulk answer applied to exactly
//! the items its preview counted, each run going past the question once; two `inbox decide`s
//! of one item raced; answers refused for their schema, for coming second, for coming late;
//! expiry settled by `inbox list` alone; `resume --decision` recorded like any answer; the
//! audit log; a bad filter.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Output, TempDir, run, run_id_from, switchyard};

const STORE: [&str; 2] = ["--store", "sqlite:runs.db"];

/// A directory holding the fixture flow `name` of `tests/fixtures/inbox/`.
fn with_flow(tag: &str, name: &str) -> TempDir {
    let dir = TempDir::new(tag);
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/inbox")
            .join(name),
    )
    .expect("the fixture flow");
    dir.write(name, text);
    dir
}

/// `switchyard ARGS... --store sqlite:runs.db` in `dir`.
fn sy(dir: &TempDir, args: &[&str]) -> Output {
    run(switchyard(dir.path()).args(args).args(STORE))
}

fn json_of(out: &Output) -> Value {
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}\nstderr: {}", out.stdout, out.stderr))
}

/// Runs `flow` once with `input`; it stops at its question (exit 3). Its run id.
fn stopped_run(dir: &TempDir, flow: &str, input: Value) -> String {
    let out = sy(dir, &["run", flow, "--input", &input.to_string()]);
    assert_eq!(out.code(), 3, "{out:?}");
    run_id_from(&out.stderr)
}

/// The lines of `applied.log`: one per run that went past its question.
fn applied_lines(dir: &TempDir) -> Vec<String> {
    std::fs::read_to_string(dir.path().join("applied.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The run ids `applied.log` names (its lines are `<run>:<step number>`).
fn applied_runs(dir: &TempDir) -> BTreeSet<String> {
    applied_lines(dir)
        .iter()
        .map(|l| l.split(':').next().expect("a key").to_string())
        .collect()
}

/// The waiting items of `inbox list --json`, by id, with their run ids.
fn waiting(dir: &TempDir) -> Vec<(String, String)> {
    let out = sy(dir, &["inbox", "list", "--json"]);
    assert_eq!(out.code(), 0, "{out:?}");
    let v = json_of(&out);
    v["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["items"].as_array().expect("items").clone())
        .map(|i| {
            (
                i["id"].as_str().expect("id").to_string(),
                i["run_id"].as_str().expect("run id").to_string(),
            )
        })
        .collect()
}

fn log_rows(dir: &TempDir, extra: &[&str]) -> Vec<Value> {
    let out = sy(dir, &[&["decisions", "log", "--jsonl"], extra].concat());
    assert_eq!(out.code(), 0, "{out:?}");
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn run_json(dir: &TempDir, id: &str) -> Value {
    let out = sy(dir, &["runs", "show", id, "--json"]);
    assert_eq!(out.code(), 0, "{out:?}");
    json_of(&out)["run"].clone()
}

#[test]
fn a_bulk_answer_applies_to_exactly_the_previewed_items_once() {
    let dir = with_flow("inbox-bulk", "approve.yaml");
    let lines: Vec<String> = (0..30)
        .map(|i| json!({"id": format!("t{i}"), "amount": i * 10, "customer": format!("c{i}")}).to_string())
        .collect();
    dir.write("in.jsonl", lines.join("\n") + "\n");
    let batch = sy(
        &dir,
        &[
            "batch",
            "approve.yaml",
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
        ],
    );
    assert_eq!(batch.code(), 3, "every item waits: {batch:?}");

    // One question shape: one group of 30.
    let list = sy(&dir, &["inbox", "list", "--json"]);
    assert_eq!(list.code(), 0, "{list:?}");
    let v = json_of(&list);
    let groups = v["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 1, "{v}");
    let g = &groups[0];
    assert_eq!(g["count"], 30, "{g}");
    assert_eq!(g["flow"], "inbox_refund");
    assert_eq!(g["step"], "approve");
    assert_eq!(g["schema"]["required"], json!(["approved"]));
    assert_eq!(g["items"].as_array().expect("items").len(), 30);
    assert!(g["oldest"].as_str().expect("a time").ends_with('Z'), "{g}");
    assert_eq!(g["soonest_expiry"], Value::Null);
    let keys: BTreeSet<&str> = g
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        BTreeSet::from([
            "flow",
            "step",
            "schema",
            "question",
            "count",
            "oldest",
            "soonest_expiry",
            "items"
        ])
    );
    let item_keys: BTreeSet<&str> = g["items"][0]
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        item_keys,
        BTreeSet::from(["id", "run_id", "batch", "item", "question", "expires_at"])
    );
    // The items of amounts under 100: t0..t9.
    let small: BTreeSet<String> = g["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|i| {
            let n: u64 = i["item"].as_str().expect("item id")[1..]
                .parse()
                .expect("a number");
            n * 10 < 100
        })
        .map(|i| i["id"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(small.len(), 10);
    let human = sy(&dir, &["inbox", "list"]);
    assert_eq!(human.code(), 0, "{human:?}");
    assert!(
        human.stdout.contains("30 × interrupt at inbox_refund/approve")
            && human.stdout.contains("… and 27 more"),
        "{}",
        human.stdout
    );

    let preview = sy(
        &dir,
        &[
            "inbox",
            "bulk",
            "--filter",
            "input.amount < 100",
            "--decision",
            r#"{"approved": true}"#,
            "--preview",
            "--json",
        ],
    );
    assert_eq!(preview.code(), 0, "{preview:?}");
    let p = json_of(&preview);
    assert_eq!(p["matched"], 10, "{p}");
    assert_eq!(p["shapes"], 1, "{p}");
    let token = p["token"].as_str().expect("a token").to_string();
    for s in p["samples"].as_array().expect("samples") {
        assert!(small.contains(s["id"].as_str().expect("id")), "{s}");
    }
    assert!(applied_lines(&dir).is_empty(), "a preview answers nothing");

    // Three more runs that match, after the preview: not the token's.
    let late: Vec<String> = (0..3)
        .map(|i| stopped_run(&dir, "approve.yaml", json!({"amount": 5 + i, "customer": "late"})))
        .collect();

    let apply = sy(
        &dir,
        &[
            "inbox",
            "bulk",
            "--token",
            &token,
            "--decision",
            r#"{"approved": true}"#,
            "--actor",
            "ops",
            "--reason",
            "small refunds",
            "--json",
        ],
    );
    assert_eq!(apply.code(), 0, "{apply:?}");
    let a = json_of(&apply);
    let applied: BTreeSet<String> = a["applied"]
        .as_array()
        .expect("applied")
        .iter()
        .map(|i| i.as_str().expect("id").to_string())
        .collect();
    assert_eq!(applied, small, "exactly the previewed items: {a}");
    assert_eq!(a["refused"], json!([]));
    let bulk_id = a["bulk_id"].as_str().expect("a bulk id").to_string();
    assert!(
        apply.stderr.contains("10 run(s) continued: 10 succeeded"),
        "{}",
        apply.stderr
    );

    // Each answered run went past its question once; the late ones did not.
    let lines = applied_lines(&dir);
    assert_eq!(lines.len(), 10, "{lines:?}");
    let ran = applied_runs(&dir);
    assert_eq!(ran.len(), 10, "one line per run: {lines:?}");
    for r in &late {
        assert!(
            !ran.contains(r),
            "a run created after the preview was answered: {r}"
        );
    }
    let still: Vec<(String, String)> = waiting(&dir);
    assert_eq!(still.len(), 23, "{still:?}");
    for r in &late {
        assert!(still.iter().any(|(_, run)| run == r), "{r} still waits");
    }

    // A token is applied once.
    let again = sy(
        &dir,
        &[
            "inbox",
            "bulk",
            "--token",
            &token,
            "--decision",
            r#"{"approved": true}"#,
        ],
    );
    assert_eq!(again.code(), 2, "{again:?}");
    assert!(
        again.stderr.contains("was applied already") && again.stderr.contains(&bulk_id),
        "{}",
        again.stderr
    );
    assert_eq!(applied_lines(&dir).len(), 10);

    // The audit: every applied answer, with who, how and which bulk operation.
    let rows = log_rows(&dir, &[]);
    assert_eq!(rows.len(), 10, "{rows:?}");
    for r in &rows {
        assert_eq!(r["actor"], "ops", "{r}");
        assert_eq!(r["via"], "cli", "{r}");
        assert_eq!(r["bulk_id"], bulk_id.as_str(), "{r}");
        assert_eq!(r["reason"], "small refunds", "{r}");
        assert_eq!(r["decision"], json!({"approved": true}), "{r}");
        assert!(applied.contains(r["item_id"].as_str().expect("item id")), "{r}");
        let keys: BTreeSet<&str> = r
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            BTreeSet::from([
                "id", "item_id", "run_id", "actor", "via", "decision", "reason", "edited", "bulk_id", "at"
            ])
        );
    }
    // `--since` a time after them all: none; an hour ago: all.
    assert_eq!(log_rows(&dir, &["--since", "2999-01-01T00:00:00Z"]).len(), 0);
    assert_eq!(log_rows(&dir, &["--since", "1h"]).len(), 10);
}

#[test]
fn an_item_refused_by_a_bulk_answer_is_listed_and_the_exit_is_1() {
    let dir = with_flow("inbox-bulk-refused", "approve.yaml");
    let runs: Vec<String> = (0..3)
        .map(|i| stopped_run(&dir, "approve.yaml", json!({"amount": i, "customer": "c"})))
        .collect();
    let preview = sy(
        &dir,
        &["inbox", "bulk", "--filter", "true", "--preview", "--json"],
    );
    assert_eq!(preview.code(), 0, "{preview:?}");
    let token = json_of(&preview)["token"].as_str().expect("token").to_string();
    // One of them is answered meanwhile.
    let one = sy(
        &dir,
        &[
            "inbox",
            "decide",
            &runs[0],
            "--decision",
            r#"{"approved": false}"#,
            "--actor",
            "ann",
        ],
    );
    assert_eq!(one.code(), 0, "{one:?}");
    let apply = sy(
        &dir,
        &[
            "inbox",
            "bulk",
            "--token",
            &token,
            "--decision",
            r#"{"approved": true}"#,
            "--json",
        ],
    );
    assert_eq!(apply.code(), 1, "{apply:?}");
    let a = json_of(&apply);
    assert_eq!(a["applied"].as_array().expect("applied").len(), 2, "{a}");
    let refused = a["refused"].as_array().expect("refused");
    assert_eq!(refused.len(), 1, "{a}");
    assert!(
        refused[0]["reason"]
            .as_str()
            .expect("why")
            .contains("already decided by ann (cli)"),
        "{a}"
    );
    assert_eq!(applied_runs(&dir).len(), 3, "every run went on once");
}

#[test]
fn two_decides_of_one_item_at_once_apply_it_once() {
    let dir = with_flow("inbox-race", "approve.yaml");
    for round in 0..3 {
        let run_id = stopped_run(&dir, "approve.yaml", json!({"amount": round, "customer": "c"}));
        let item = waiting(&dir)
            .into_iter()
            .find(|(_, r)| *r == run_id)
            .expect("the run's item")
            .0;
        let racers: Vec<_> = ["alice", "bob"]
            .into_iter()
            .map(|actor| {
                let (dir, item) = (dir.path().to_path_buf(), item.clone());
                std::thread::spawn(move || {
                    let out = run(switchyard(&dir)
                        .args([
                            "inbox",
                            "decide",
                            &item,
                            "--decision",
                            r#"{"approved": true}"#,
                            "--actor",
                            actor,
                        ])
                        .args(STORE));
                    (actor, out)
                })
            })
            .collect();
        let mut outs: Vec<(&str, Output)> = racers.into_iter().map(|t| t.join().expect("racer")).collect();
        outs.sort_by_key(|(_, o)| o.code());
        let [(winner, won), (_, lost)] = [outs.remove(0), outs.remove(0)];
        assert_eq!((won.code(), lost.code()), (0, 2), "{won:?}\n{lost:?}");
        assert!(
            lost.stderr
                .contains(&format!("already decided by {winner} (cli) at ")),
            "the refusal names the first: {}",
            lost.stderr
        );
        assert_eq!(
            applied_lines(&dir).len(),
            round as usize + 1,
            "the run went on once"
        );
        let rows = log_rows(&dir, &["--run", &run_id]);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0]["actor"], winner);
    }
}

#[test]
fn an_answer_that_breaks_the_schema_is_refused_and_not_logged() {
    let dir = with_flow("inbox-schema", "approve.yaml");
    let run_id = stopped_run(&dir, "approve.yaml", json!({"amount": 40, "customer": "c"}));
    let bad = sy(
        &dir,
        &["inbox", "decide", &run_id, "--decision", r#"{"approved": "yes"}"#],
    );
    assert_eq!(bad.code(), 2, "{bad:?}");
    assert!(
        bad.stderr.contains("does not match the schema") && bad.stderr.contains("at `/approved`"),
        "{}",
        bad.stderr
    );
    let missing = sy(&dir, &["inbox", "decide", &run_id, "--decision", "{}"]);
    assert_eq!(missing.code(), 2, "{missing:?}");
    assert!(missing.stderr.contains("at `/`"), "{}", missing.stderr);
    assert!(log_rows(&dir, &[]).is_empty(), "nothing logged");
    let show = sy(&dir, &["inbox", "show", &run_id, "--json"]);
    assert_eq!(show.code(), 0, "{show:?}");
    let item = json_of(&show);
    assert_eq!(item["state"], "waiting");
    assert_eq!(item["input"], json!({"amount": 40, "customer": "c"}));
    assert_eq!(item["question"], "Refund 40 to c?");
    assert_eq!(item["decisions"], json!([]));
    assert!(applied_lines(&dir).is_empty());
    // No such item.
    let none = sy(&dir, &["inbox", "decide", "q0000", "--decision", "{}"]);
    assert_eq!(none.code(), 2, "{none:?}");
    assert!(none.stderr.contains("no inbox item `q0000`"), "{}", none.stderr);
}

#[test]
fn an_expired_question_is_settled_by_inbox_list_and_a_late_answer_is_refused() {
    let dir = with_flow("inbox-expiry", "expiring.yaml");
    let run_id = stopped_run(&dir, "expiring.yaml", json!({"amount": 40}));
    let item = sy(&dir, &["inbox", "show", &run_id, "--json"]);
    assert_eq!(item.code(), 0, "{item:?}");
    let item = json_of(&item);
    assert_eq!(item["state"], "waiting");
    assert!(item["expires_at"].is_string(), "{item}");
    let id = item["id"].as_str().expect("id").to_string();
    // The expiry passes; nobody resumes the run.
    std::thread::sleep(Duration::from_millis(1500));
    let list = sy(&dir, &["inbox", "list", "--json"]);
    assert_eq!(list.code(), 0, "{list:?}");
    assert_eq!(json_of(&list), json!({"groups": []}));
    assert!(
        list.stderr.contains("1 question(s) expired without a decision") && list.stderr.contains(&run_id),
        "{}",
        list.stderr
    );
    let run = run_json(&dir, &run_id);
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["kind"], "timeout", "{run}");
    let shown = json_of(&sy(&dir, &["inbox", "show", &id, "--json"]));
    assert_eq!(shown["state"], "expired", "{shown}");
    let late = sy(
        &dir,
        &["inbox", "decide", &id, "--decision", r#"{"approved": true}"#],
    );
    assert_eq!(late.code(), 2, "{late:?}");
    assert!(late.stderr.contains("expired at "), "{}", late.stderr);
    assert!(applied_lines(&dir).is_empty(), "no step ran past the question");
    assert!(log_rows(&dir, &[]).is_empty());
}

#[test]
fn resume_with_a_decision_is_a_recorded_answer() {
    let dir = with_flow("inbox-resume", "approve.yaml");
    let run_id = stopped_run(&dir, "approve.yaml", json!({"amount": 40, "customer": "c"}));
    let out = sy(
        &dir,
        &[
            "resume",
            &run_id,
            "--decision",
            r#"{"approved": true}"#,
            "--actor",
            "carol",
        ],
    );
    assert_eq!(out.code(), 0, "{out:?}");
    let rows = log_rows(&dir, &["--run", &run_id]);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["actor"], "carol");
    assert_eq!(rows[0]["via"], "cli");
    assert_eq!(rows[0]["bulk_id"], Value::Null);
    assert_eq!(rows[0]["decision"], json!({"approved": true}));

    // Answered with --no-continue, then `resume` with another decision: refused naming the
    // first; `resume` without one continues with the recorded answer.
    let second = stopped_run(&dir, "approve.yaml", json!({"amount": 41, "customer": "d"}));
    let decided = sy(
        &dir,
        &[
            "inbox",
            "decide",
            &second,
            "--decision",
            r#"{"approved": true}"#,
            "--actor",
            "dan",
            "--no-continue",
        ],
    );
    assert_eq!(decided.code(), 0, "{decided:?}");
    assert_eq!(run_json(&dir, &second)["status"], "interrupted");
    let refused = sy(&dir, &["resume", &second, "--decision", r#"{"approved": false}"#]);
    assert_eq!(refused.code(), 2, "{refused:?}");
    assert!(
        refused.stderr.contains("already decided by dan (cli)"),
        "{}",
        refused.stderr
    );
    let resumed = sy(&dir, &["resume", &second]);
    assert_eq!(resumed.code(), 0, "{resumed:?}");
    let output: Value = serde_json::from_str(&resumed.stdout).expect("the output");
    assert_eq!(output["approval"], json!({"approved": true}), "{output}");
    assert_eq!(
        applied_runs(&dir),
        BTreeSet::from([run_id.clone(), second.clone()])
    );

    // A schema-breaking decision through resume is refused and not logged.
    let third = stopped_run(&dir, "approve.yaml", json!({"amount": 42, "customer": "e"}));
    let bad = sy(&dir, &["resume", &third, "--decision", r#"{"approved": 1}"#]);
    assert_eq!(bad.code(), 2, "{bad:?}");
    assert!(bad.stderr.contains("at `/approved`"), "{}", bad.stderr);
    assert!(log_rows(&dir, &["--run", &third]).is_empty());
}

#[test]
fn a_bad_filter_names_its_column() {
    let dir = with_flow("inbox-filter", "approve.yaml");
    stopped_run(&dir, "approve.yaml", json!({"amount": 1, "customer": "c"}));
    let out = sy(
        &dir,
        &["inbox", "list", "--filter", "input.amount < 100 && amout > 3"],
    );
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr.contains("--filter, column 23: unknown name `amout`"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("^^^^^"), "{}", out.stderr);
    let bulk = sy(
        &dir,
        &["inbox", "bulk", "--filter", "input.amount <", "--preview"],
    );
    assert_eq!(bulk.code(), 2, "{bulk:?}");
    assert!(bulk.stderr.contains("--filter, column "), "{}", bulk.stderr);
    // A good filter that matches nothing.
    let none = sy(
        &dir,
        &["inbox", "list", "--filter", "input.amount > 100", "--json"],
    );
    assert_eq!(none.code(), 0, "{none:?}");
    assert_eq!(json_of(&none), json!({"groups": []}));
}
