//! `resume` and `runs show` of stopped runs, through the real binary over SQLite stores: the
//! flow hash a run records covers the files its flow imports and the flows it calls (a change
//! in any of them is refused without `--allow-changed`), and a run stopped at an `interrupt`,
//! its own or a child run's, tells the person deciding what it asks and how to answer.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::{TempDir, run, run_id_from, switchyard};

const STORE: [&str; 2] = ["--store", "sqlite:runs.db"];

/// Runs `flow` on `input`, expecting it to stop interrupted; returns the run id.
fn interrupted(dir: &TempDir, flow: &str, input: &Value) -> (String, String) {
    let out = run(switchyard(dir.path())
        .args(["run", flow, "--input", &input.to_string()])
        .args(STORE));
    assert_eq!(out.code(), 3, "{}", out.stderr);
    (run_id_from(&out.stderr), out.stderr)
}

/// `runs show ID --json`.
fn show_json(dir: &TempDir, id: &str) -> Value {
    let out = run(switchyard(dir.path())
        .args(["runs", "show", id, "--json"])
        .args(STORE));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    serde_json::from_str(&out.stdout).expect("runs show --json prints JSON")
}

/// `runs show ID`, the human view.
fn show(dir: &TempDir, id: &str) -> String {
    let out = run(switchyard(dir.path()).args(["runs", "show", id]).args(STORE));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    out.stdout
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).expect("read the file");
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Replaces `from` with `to` in the file `name` of `dir`.
fn edit(dir: &TempDir, name: &str, from: &str, to: &str) {
    let text = std::fs::read_to_string(dir.path().join(name)).expect("read the file");
    assert!(text.contains(from), "`{from}` in {name}");
    dir.write(name, text.replace(from, to));
}

/// `resume ID --decision DECISION [EXTRA]`.
fn resume(dir: &TempDir, id: &str, decision: &str, extra: &[&str]) -> crate::support::Output {
    run(switchyard(dir.path())
        .args(["resume", id, "--decision", decision])
        .args(extra)
        .args(STORE))
}

fn assert_refused_as_changed(out: &crate::support::Output, flow: &str) {
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "the flow `{flow}` (or a file it imports or calls) changed since run"
        )) && out.stderr.contains("--allow-changed"),
        "{}",
        out.stderr
    );
}

const IMPORTING: &str = r#"flow: imp
imports: [lib.yaml]
steps:
  approve: {interrupt: {prompt: "ok?", schema: {type: object}}, next: calc}
  calc: {agent: calc, output: "*"}
"#;

#[test]
fn a_change_in_an_imported_file_is_refused_without_allow_changed() {
    let dir = TempDir::new("resume-import");
    // The agent is two imports away: lib.yaml imports rates.yaml.
    dir.write("lib.yaml", "imports: [rates.yaml]\n");
    dir.write(
        "rates.yaml",
        "agents:\n  calc: {kind: transform, result: {x: =input.amount * 1}}\n",
    );
    let flow = dir.write("imp.yaml", IMPORTING);
    let (id, _) = interrupted(&dir, "imp.yaml", &json!({"amount": 5}));
    let recorded = show_json(&dir, &id)["run"]["flow_hash"].clone();
    assert_ne!(recorded, json!(sha256(&flow)), "the hash covers the imports");

    edit(&dir, "rates.yaml", "* 1}", "* 1000}");
    assert_refused_as_changed(&resume(&dir, &id, "{}", &[]), "imp");
    let out = resume(&dir, &id, "{}", &["--allow-changed"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("the output is JSON");
    assert_eq!(output, json!({"amount": 5, "x": 5000}));
}

#[test]
fn a_change_in_a_called_flow_or_its_imports_is_refused_without_allow_changed() {
    let dir = TempDir::new("resume-child");
    dir.write(
        "parent.yaml",
        r#"flow: parent
agents:
  child: {kind: flow, path: sub/child.yaml}
steps:
  approve: {interrupt: {prompt: "ok?", schema: {type: object}}, next: call}
  call: {agent: child, output: "*"}
"#,
    );
    let child = dir.write(
        "sub/child.yaml",
        "flow: child\nimports: [lib.yaml]\nsteps:\n  calc: {agent: calc, output: \"*\"}\n",
    );
    dir.write(
        "sub/lib.yaml",
        "agents:\n  calc: {kind: transform, result: {x: =input.amount * 1}}\n",
    );
    let (id, _) = interrupted(&dir, "parent.yaml", &json!({"amount": 5}));

    // The called flow's own file…
    edit(
        &dir,
        "sub/child.yaml",
        "flow: child\n",
        "flow: child\ndescription: edited\n",
    );
    assert_refused_as_changed(&resume(&dir, &id, "{}", &[]), "parent");
    edit(&dir, "sub/child.yaml", "description: edited\n", "");
    // …and a file it imports.
    edit(&dir, "sub/lib.yaml", "* 1}", "* 1000}");
    assert_refused_as_changed(&resume(&dir, &id, "{}", &[]), "parent");

    let out = resume(&dir, &id, "{}", &["--allow-changed"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("the output is JSON");
    assert_eq!(output, json!({"amount": 5, "x": 5000}));

    // The child run records its own flow's hash, which covers its import.
    let doc = show_json(&dir, &id);
    let child_hash = doc["children"][0]["flow_hash"]
        .as_str()
        .expect("a child run with a hash");
    assert_eq!(child_hash.len(), 64);
    assert_ne!(child_hash, sha256(&child));
    assert_ne!(Some(child_hash), doc["run"]["flow_hash"].as_str());
}

/// A flow whose first step is a non-idempotent command that kills this switchyard process
/// (SIGKILL) the first time it runs: the run is left `running`, its step in doubt.
fn crashing_flow(dir: &TempDir) -> String {
    let marker = dir.path().join("crashed");
    format!(
        r#"flow: crash
imports: [lib.yaml]
agents:
  once:
    kind: command
    # The program's parent is its supervisor; the engine is the supervisor's parent.
    run: [sh, -c, 'if [ ! -e "{marker}" ]; then : > "{marker}"; kill -9 $(cut -d" " -f4 /proc/$PPID/stat); sleep 2; fi; echo "{{}}"']
    idempotent: false
steps:
  first: {{agent: once, output: {{}}, next: calc}}
  calc: {{agent: calc, output: "*"}}
"#,
        marker = marker.display()
    )
}

#[test]
fn a_batch_whose_imported_file_changed_is_not_resumed_without_allow_changed() {
    let dir = TempDir::new("resume-batch-import");
    dir.write(
        "lib.yaml",
        "agents:\n  calc: {kind: transform, result: {x: =input.amount * 1}}\n",
    );
    let flow = dir.write("crash.yaml", crashing_flow(&dir));
    dir.write("in.jsonl", "{\"id\": \"a\", \"amount\": 2}\n");
    let batch = |extra: &[&str]| {
        run(switchyard(dir.path())
            .arg("batch")
            .arg(&flow)
            .args(["--input", "in.jsonl", "--output", "out.jsonl"])
            .args(STORE)
            .args(extra))
    };
    let crashed = batch(&[]);
    assert!(crashed.status.code().is_none(), "killed: {crashed:?}");

    edit(&dir, "lib.yaml", "* 1}", "* 1000}");
    let out = batch(&[]);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("started from another version of the flow `crash`")
            && out.stderr.contains("--allow-changed"),
        "{}",
        out.stderr
    );
    let out = batch(&["--allow-changed", "--retry-in-doubt"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let line: Value = serde_json::from_str(
        std::fs::read_to_string(dir.path().join("out.jsonl"))
            .expect("the output file")
            .trim(),
    )
    .expect("a JSON line");
    assert_eq!(line["output"]["x"], 2000, "{line}");
}

#[test]
fn a_run_in_doubt_is_told_to_retry_in_doubt() {
    let dir = TempDir::new("resume-in-doubt");
    dir.write(
        "lib.yaml",
        "agents:\n  calc: {kind: transform, result: {x: =input.amount * 1}}\n",
    );
    dir.write("crash.yaml", crashing_flow(&dir));
    let crashed = run(switchyard(dir.path())
        .args(["run", "crash.yaml", "--input", r#"{"amount": 2}"#])
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
    let out = run(switchyard(dir.path()).args(["resume", &id]).args(STORE));
    assert_eq!(out.code(), 3, "{}", out.stderr);
    assert!(
        out.stderr.contains("interrupted[in_doubt]")
            && out.stderr.contains(&format!(
                "continue it with `switchyard resume {id} --retry-in-doubt --store sqlite:runs.db`"
            ))
            && !out.stderr.contains("--decision"),
        "{}",
        out.stderr
    );
    // Called again, it is the next attempt: the lost one counts.
    let out = run(switchyard(dir.path())
        .args(["resume", &id, "--retry-in-doubt"])
        .args(STORE));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let steps = &show_json(&dir, &id)["steps"];
    assert_eq!(steps[0]["step"], "first", "{steps}");
    assert_eq!(steps[0]["attempt"], 2, "{steps}");
    assert_eq!(steps[0]["status"], "succeeded", "{steps}");
}

const REFUND: &str = r#"flow: refund
steps:
  approve:
    interrupt:
      prompt: "Refund {{ input.amount }} to {{ input.customer }}?"
      schema: {type: object, required: [approved], properties: {approved: {type: boolean}}}
      expires: EXPIRES
    input: [$.amount, $.customer]
    output: {$.approval: $}
"#;

const REFUND_SCHEMA: &str =
    r#"{"type":"object","required":["approved"],"properties":{"approved":{"type":"boolean"}}}"#;

#[test]
fn runs_show_tells_an_interrupts_question_and_how_to_answer_it() {
    let dir = TempDir::new("show-interrupt");
    let flow = dir.write("refund.yaml", REFUND.replace("EXPIRES", "72h"));
    let (id, stderr) = interrupted(&dir, "refund.yaml", &json!({"amount": 40, "customer": "ann"}));
    let answer = format!("switchyard resume {id} --decision JSON --store sqlite:runs.db");
    assert!(
        stderr.contains("waits for a decision at interrupt step `approve`")
            && stderr.contains(&format!("continue it with `{answer}`")),
        "{stderr}"
    );

    let text = show(&dir, &id);
    let expected = [
        "  ⏸ 1 approve [interrupt]",
        "    prompt: Refund 40 to ann?",
        &format!("    decision schema: {REFUND_SCHEMA}"),
        "    expires: ",
        "(in 71h 59m)",
        &format!("    answer: `{answer}`"),
    ];
    let mut rest = text.as_str();
    for part in expected {
        let at = rest
            .find(part)
            .unwrap_or_else(|| panic!("`{part}` (in order) in:\n{text}"));
        rest = &rest[at + part.len()..];
    }
    // The question is on record for machines too; a flow that imports and calls nothing
    // records its file's plain hash, as earlier versions did.
    let doc = show_json(&dir, &id);
    let result = &doc["steps"][0]["result"];
    assert_eq!(result["prompt"], "Refund 40 to ann?");
    assert_eq!(
        result["schema"],
        serde_json::from_str::<Value>(REFUND_SCHEMA).expect("JSON")
    );
    assert!(result["expires_at"].is_u64(), "{result}");
    assert_eq!(doc["run"]["flow_hash"], json!(sha256(&flow)));

    // Expired: said so.
    dir.write("refund.yaml", REFUND.replace("EXPIRES", "50ms"));
    let (late, _) = interrupted(&dir, "refund.yaml", &json!({"amount": 1, "customer": "bo"}));
    std::thread::sleep(Duration::from_millis(120));
    let text = show(&dir, &late);
    assert!(
        text.contains("    expired: ")
            && text.contains("ago): a decision now fails the step with kind `timeout`"),
        "{text}"
    );
}

#[test]
fn a_run_stopped_by_a_child_runs_interrupt_is_answered_with_a_decision() {
    let dir = TempDir::new("child-interrupt");
    dir.write(
        "child.yaml",
        r#"flow: child
steps:
  approve:
    interrupt:
      prompt: "approve {{ input.amount }}?"
      schema: {type: object, required: [ok], properties: {ok: {type: boolean}}}
    output: {$.ok: $.ok}
"#,
    );
    dir.write(
        "parent.yaml",
        r#"flow: parent
agents:
  ask: {kind: flow, path: child.yaml}
steps:
  first: {agent: {kind: transform, result: {a: 1}}, output: {$.a: $.a}, next: call}
  call: {agent: ask, output: {$.ok: $.ok}}
"#,
    );
    let (id, stderr) = interrupted(&dir, "parent.yaml", &json!({"amount": 5}));
    let answer = format!("switchyard resume {id} --decision JSON --store sqlite:runs.db");
    assert!(
        stderr.contains(&format!("continue it with `{answer}`")) && !stderr.contains("--retry-in-doubt"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "run `{id}` waits for a decision at interrupt step `approve` of child run `"
        )),
        "{stderr}"
    );

    // The question shows under the child's step, answered on the root run, whichever run
    // is shown.
    let doc = show_json(&dir, &id);
    let child = doc["children"][0]["id"]
        .as_str()
        .expect("a child run")
        .to_string();
    assert_eq!(
        doc["run"]["error"]["message"],
        format!("step `call`: the child run `{child}` waits for a decision")
    );
    for shown in [&id, &child] {
        let text = show(&dir, shown);
        for part in [
            "⏸ 2.1 approve [interrupt]",
            "prompt: approve 5?",
            r#"decision schema: {"type":"object","required":["ok"],"properties":{"ok":{"type":"boolean"}}}"#,
            &format!("answer: `{answer}`"),
        ] {
            assert!(text.contains(part), "`{part}` in:\n{text}");
        }
        assert!(!text.contains("expires"), "{text}");
    }

    // The child run is not resumed on its own: the root is named.
    let out = resume(&dir, &child, r#"{"ok": true}"#, &[]);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "run `{child}` is a child run (of `{id}`): resume its root run `{id}`"
        )),
        "{}",
        out.stderr
    );
    let out = resume(&dir, &id, r#"{"ok": true}"#, &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("the output is JSON");
    assert_eq!(output, json!({"amount": 5, "a": 1, "ok": true}));
    // Once answered, there is nothing to answer.
    assert!(!show(&dir, &id).contains("answer:"));
}

/// With `--allow-changed`, what finished before is reused as it was, `set` steps included:
/// their writes are replayed from the record, not made again by the changed flow.
#[test]
fn allow_changed_reuses_what_finished_set_steps_included() {
    let dir = TempDir::new("resume-changed-set");
    dir.write(
        "f.yaml",
        r#"flow: f
agents:
  plus: {kind: transform, result: {x: =input.n + 1}}
steps:
  first: {set: {$.seen: {value: 1}, $.deep.list: '=[payload.a, 2]'}, next: calc}
  calc: {agent: plus, input: {$.n: $.seen}, output: {$.calc: $.x}, next: gate}
  gate: {interrupt: {schema: {type: object}}, next: done}
  done: {set: {$.done: =payload.seen}}
"#,
    );
    let (id, _) = interrupted(&dir, "f.yaml", &json!({"a": 7}));
    edit(&dir, "f.yaml", "{value: 1}", "{value: 100}");
    assert_refused_as_changed(&resume(&dir, &id, "{}", &[]), "f");
    let out = resume(&dir, &id, "{}", &["--allow-changed"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("the output is JSON");
    assert_eq!(
        output,
        json!({"a": 7, "seen": 1, "deep": {"list": [7, 2]}, "calc": 2, "done": 1})
    );
}

/// Commands that read what was recorded do not create a store: a mistyped `--store` says
/// there is none; the default store not there yet just has no runs.
#[test]
fn reading_commands_do_not_create_a_store() {
    let dir = TempDir::new("runs-no-store");
    let out = run(switchyard(dir.path())
        .args(["runs", "list"])
        .env_remove("SWITCHYARD_STORE"));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "no runs");
    for args in [
        vec!["runs", "list", "--store", "sqlite:typo.db"],
        vec!["runs", "show", "r1", "--store", "sqlite:typo.db"],
        vec!["runs", "cancel", "r1", "--store", "sqlite:typo.db"],
        vec!["resume", "r1", "--store", "sqlite:typo.db"],
    ] {
        let out = run(switchyard(dir.path()).args(&args));
        assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(&format!(
                "no store at {}: nothing has been recorded there",
                dir.path().join("typo.db").display()
            )),
            "{args:?}: {}",
            out.stderr
        );
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "nothing was created: {left:?}");
}

/// A `--store` URL of no known form is a usage error (2) for every command; a store that is
/// there but cannot be opened is a failure (1).
#[test]
fn a_store_url_of_no_known_form_is_a_usage_error_everywhere() {
    let dir = TempDir::new("bad-store-url");
    dir.write("f.yaml", "flow: f\nsteps:\n  s: {set: {$.x: {value: 1}}}\n");
    dir.write("in.jsonl", "{\"id\": \"a\"}\n");
    let io = ["--input", "in.jsonl", "--output", "out.jsonl"];
    for url in ["bogus:xyz", "postgres://postgres@127.0.0.1:5432/test?schema=1bad"] {
        for args in [
            vec!["run", "f.yaml", "--input", "{}"],
            [&["batch", "f.yaml"][..], &io[..]].concat(),
            [&["runs", "export", "f.yaml"][..], &io[..]].concat(),
            vec!["runs", "list"],
            vec!["resume", "r1"],
        ] {
            let out = run(switchyard(dir.path()).args(&args).args(["--store", url]));
            assert_eq!(out.code(), 2, "{args:?} --store {url}: {}", out.stderr);
            assert!(out.stderr.contains("bad store URL"), "{args:?}: {}", out.stderr);
        }
    }
    // Nothing listens on port 1: the store is well named and cannot be opened.
    let out = run(switchyard(dir.path())
        .args(["run", "f.yaml", "--input", "{}"])
        .args(["--store", "postgres://postgres@127.0.0.1:1/test"]));
    assert_eq!(out.code(), 1, "{}", out.stderr);
}

/// `runs list --json` as values.
fn list_json(dir: &TempDir, args: &[&str]) -> Vec<Value> {
    let out = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(args)
        .args(STORE));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// `runs list` lists root runs, with their start time; `--all` adds child runs, `--batch
/// OUT.jsonl` (by any path to it) keeps a batch's runs; a child run whose calling step never
/// finished shows under its parent in `runs show`.
#[test]
fn runs_list_shows_root_runs_and_filters_by_batch() {
    let dir = TempDir::new("runs-list-roots");
    dir.write("child.yaml", "flow: child\nsteps:\n  s: {set: {$.x: =1}}\n");
    dir.write(
        "parent.yaml",
        "flow: parent\nagents:\n  c: {kind: flow, path: child.yaml}\nsteps:\n  call: {agent: c, output: {$.c: $.x}}\n",
    );
    let out = run(switchyard(dir.path()).args(["run", "parent.yaml"]).args(STORE));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    dir.write("in.jsonl", "{\"id\": \"a\"}\n{\"id\": \"b\"}\n");
    std::fs::create_dir_all(dir.path().join("out")).expect("a directory");
    let out = run(switchyard(dir.path())
        .args([
            "batch",
            "parent.yaml",
            "--input",
            "in.jsonl",
            "--output",
            "out/out.jsonl",
        ])
        .args(STORE));
    assert_eq!(out.code(), 0, "{}", out.stderr);

    let roots = list_json(&dir, &[]);
    assert_eq!(roots.len(), 3, "{roots:?}");
    assert!(
        roots
            .iter()
            .all(|r| r["parent_run"].is_null() && r["flow"] == "parent"),
        "{roots:?}"
    );
    let all = list_json(&dir, &["--all"]);
    assert_eq!(all.len(), 6, "{all:?}");
    assert_eq!(all.iter().filter(|r| r["flow"] == "child").count(), 3, "{all:?}");

    // The output file named through `..` and through a symlink to its directory.
    std::os::unix::fs::symlink(dir.path().join("out"), dir.path().join("link")).expect("a symlink");
    for name in ["out/../out/out.jsonl", "link/out.jsonl"] {
        let batch = list_json(&dir, &["--batch", name]);
        let items: Vec<&str> = batch.iter().filter_map(|r| r["item_id"].as_str()).collect();
        assert_eq!(batch.len(), 2, "{name}: {batch:?}");
        assert!(items.contains(&"a") && items.contains(&"b"), "{name}: {batch:?}");
    }
    let out = run(switchyard(dir.path())
        .args(["runs", "list", "--batch", "in.jsonl"])
        .args(STORE));
    assert_eq!(
        out.stdout.trim(),
        "no runs of a batch named in.jsonl or writing it",
        "{out:?}"
    );

    let table = run(switchyard(dir.path()).args(["runs", "list"]).args(STORE));
    let header = table.stdout.lines().next().expect("a header");
    assert!(header.contains("started (UTC)"), "{header}");
    let year = table
        .stdout
        .lines()
        .nth(1)
        .expect("a run")
        .split_whitespace()
        .nth(1)
        .expect("a date");
    assert!(year.len() == 10 && year.starts_with("20"), "{}", table.stdout);
}

/// A child run that a crash stopped while it ran, so its calling step has no finished record,
/// still shows under its parent in `runs show`.
#[test]
fn runs_show_shows_a_child_run_whose_calling_step_never_finished() {
    let dir = TempDir::new("runs-show-orphan-child");
    let marker = dir.path().join("crashed");
    dir.write(
        "child.yaml",
        format!(
            "flow: child\nagents:\n  die:\n    kind: command\n    run: [sh, -c, 'if [ ! -e \"{m}\" ]; then : > \"{m}\"; kill -9 $(cut -d\" \" -f4 /proc/$PPID/stat); sleep 2; fi; echo \"{{}}\"']\n\
             steps:\n  first: {{set: {{$.x: =1}}, next: second}}\n  second: {{agent: die, output: {{}}}}\n",
            m = marker.display()
        ),
    );
    dir.write(
        "parent.yaml",
        "flow: parent\nagents:\n  c: {kind: flow, path: child.yaml}\nsteps:\n  call: {agent: c, output: {}}\n",
    );
    let crashed = run(switchyard(dir.path()).args(["run", "parent.yaml"]).args(STORE));
    assert!(crashed.status.code().is_none(), "killed: {crashed:?}");
    let roots = list_json(&dir, &[]);
    assert_eq!(roots.len(), 1, "{roots:?}");
    let id = roots[0]["id"].as_str().expect("an id");
    let out = run(switchyard(dir.path()).args(["runs", "show", id]).args(STORE));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(out.stdout.contains("child run of step 1"), "{}", out.stdout);
    assert!(out.stdout.contains("1.1 first [set]"), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("status    running, stopped by a crash: the process that ran it (pid ")
            && out.stdout.contains(") is gone"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(&format!(
            "continue  `switchyard resume {id} --store sqlite:runs.db`"
        )),
        "{}",
        out.stdout
    );
}

/// A run paused by Ctrl-C inside a `foreach` is recorded as paused: `runs show` shows the
/// iterations that finished under their step, says nothing runs it, counts what finished, does
/// not let its duration grow, and prints the command that continues it.
#[test]
fn runs_show_of_a_paused_run_shows_what_finished_and_how_to_continue() {
    let dir = TempDir::new("runs-show-paused");
    let calls = dir.path().join("calls");
    dir.write(
        "loop.yaml",
        format!(
            r#"flow: loop
agents:
  work:
    kind: command
    run: [sh, -c, 'cat >/dev/null; echo x >> "{}"; sleep 0.3; echo "{{\"ok\": true}}"']
steps:
  first: {{set: {{$.items: {{value: [1, 2, 3, 4, 5, 6, 7, 8]}}}}, next: each}}
  each:
    agent: work
    foreach: $.items
    output: {{$.r: $}}
"#,
            calls.display()
        ),
    );
    let child = switchyard(dir.path())
        .args(["run", "loop.yaml"])
        .args(STORE)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    let started = std::time::Instant::now();
    while std::fs::read_to_string(&calls).map_or(0, |c| c.lines().count()) < 2 {
        assert!(
            started.elapsed() < crate::support::HANG,
            "the iterations never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (code, stderr) = crate::support::interrupt(child);
    assert_eq!(code, Some(130), "{stderr}");
    let ran = std::fs::read_to_string(&calls).expect("calls").lines().count();
    let id = run_id_from(&stderr);

    let show = || {
        let out = run(switchyard(dir.path()).args(["runs", "show", &id]).args(STORE));
        assert_eq!(out.code(), 0, "{}", out.stderr);
        out.stdout
    };
    let text = show();
    assert!(
        text.contains("status    running, paused (Ctrl-C): nothing runs it"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "continue  `switchyard resume {id} --store sqlite:runs.db`"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("1 steps finished, {ran} iterations")),
        "{ran} calls ran: {text}"
    );
    assert!(
        text.contains(&format!("… 2 each · not finished · {ran} iterations finished")),
        "{text}"
    );
    for i in 0..ran {
        assert!(text.contains(&format!("✓ 2[{i}] each")), "{text}");
    }
    std::thread::sleep(Duration::from_millis(1100));
    let again = show();
    let line = |t: &str| t.lines().find(|l| l.starts_with("duration")).map(str::to_owned);
    assert_eq!(
        line(&text),
        line(&again),
        "the duration of a stopped run does not grow"
    );

    let listed = run(switchyard(dir.path()).args(["runs", "list"]).args(STORE));
    let row = listed.stdout.lines().nth(1).expect("a run");
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[4..7], ["running", "-", "-"], "{row}");
    // The record counts what finished: the `set` step and the iterations that ran.
    let recorded = list_json(&dir, &[]);
    assert_eq!(recorded[0]["steps"], 1 + ran as u64, "{recorded:?}");

    let out = run(switchyard(dir.path()).args(["resume", &id]).args(STORE));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let text = show();
    assert!(text.contains("status    succeeded"), "{text}");
    assert!(!text.contains("paused (Ctrl-C)"), "{text}");
}

/// Two child runs of a `foreach` stop at their interrupts together: a decision answers the
/// one `resume` names (the latest stop), and the other stops again to be asked on its own;
/// a second decision answers it. No decision is taken by a stop it was not given for.
#[test]
fn a_decision_answers_one_child_runs_interrupt_not_every_waiting_one() {
    let dir = TempDir::new("two-child-interrupts");
    dir.write(
        "child.yaml",
        r#"flow: child
steps:
  approve:
    interrupt:
      prompt: "approve {{ input.amount }}?"
      schema: {type: object, required: [ok], properties: {ok: {type: boolean}}}
    output: {$.ok: $.ok}
"#,
    );
    dir.write(
        "parent.yaml",
        r#"flow: parent
agents:
  ask: {kind: flow, path: child.yaml}
steps:
  each:
    foreach: $.amounts
    as: amount
    concurrency: 2
    agent: ask
    input: {$.amount: =amount}
    output: {$.answers: $}
"#,
    );
    let (id, _) = interrupted(&dir, "parent.yaml", &json!({"amounts": [5, 7]}));
    let out = resume(&dir, &id, r#"{"ok": true}"#, &[]);
    assert_eq!(out.code(), 3, "one decision, one stop answered: {}", out.stderr);
    let out = resume(&dir, &id, r#"{"ok": false}"#, &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("the output is JSON");
    let mut oks: Vec<bool> = output["answers"]
        .as_array()
        .expect("two answers")
        .iter()
        .map(|a| a["ok"].as_bool().expect("ok"))
        .collect();
    oks.sort();
    assert_eq!(oks, [false, true], "{output}");
}

/// Ctrl-C stops a `resume` as it stops a `run`: the step in flight finishes and is recorded,
/// the process exits 130 naming the command that continues, and the next `resume` finds
/// nothing in doubt — every step's call made once.
#[test]
fn ctrl_c_pauses_a_resume_as_it_pauses_a_run() {
    let dir = TempDir::new("resume-ctrl-c");
    let calls = dir.path().join("calls");
    dir.write(
        "slow.yaml",
        crate::support::slow_steps_flow(&calls, &["a", "b", "c", "d"]),
    );
    let count = || std::fs::read_to_string(&calls).map_or(0, |c| c.lines().count());
    let wait_for_calls = |n: usize| {
        let started = std::time::Instant::now();
        while count() < n {
            assert!(started.elapsed() < crate::support::HANG, "call {n} never started");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let spawn = |args: &[&str]| {
        switchyard(dir.path())
            .args(args)
            .args(STORE)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starts")
    };
    let child = spawn(&["run", "slow.yaml"]);
    wait_for_calls(1);
    let (code, stderr) = crate::support::interrupt(child);
    assert_eq!(code, Some(130), "{stderr}");
    let id = run_id_from(&stderr);
    let done = count();

    let child = spawn(&["resume", &id]);
    wait_for_calls(done + 1);
    let (code, stderr) = crate::support::interrupt(child);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr.contains("stopping: the steps in flight finish"),
        "{stderr}"
    );
    assert_eq!(run_id_from(&stderr), id, "{stderr}");

    let out = run(switchyard(dir.path()).args(["resume", &id]).args(STORE));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(output, json!({"a": true, "b": true, "c": true, "d": true}));
    assert_eq!(count(), 4, "each step's call made once");
}
