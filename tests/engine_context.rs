//! What a run is given beside its flow, through `switchyard run`: `--context` down a tree of
//! nested flows, JSON texts that enter the engine (integers beyond 64 bits, keys given twice,
//! text that is not UTF-8), `--allow` narrowing the capabilities of a run and its children,
//! and `--agent-change` files that replace, remove and add agents.

use serde_json::{Value, json};

use crate::engine::{run, run_error};
use crate::support::{self, TempDir};

// ----- context, capabilities, agent changes ----------------------------------------------------

fn capability_run(args: &[&str]) -> support::Output {
    run("capability.yaml", &json!({"n": 3}), args)
}

fn capability_ok(args: &[&str]) -> Value {
    let out = capability_run(args);
    assert_eq!(out.code(), 0, "{args:?}: {out:?}");
    serde_json::from_str(&out.stdout).expect("JSON")
}

/// What each flow's `tag` agent returned: root, middle, leaf.
fn tags(out: &Value) -> [Value; 3] {
    [
        out["tag_root"].clone(),
        out["kid"]["tag_middle"].clone(),
        out["kid"]["tag_leaf"].clone(),
    ]
}

#[test]
fn context_reaches_every_nested_flow_unchanged() {
    let context = json!({"tenant": "acme", "limits": [1, {"x": null}]});
    let out = capability_ok(&["--context", &context.to_string()]);
    assert_eq!(
        out,
        json!({
            "n": 3,
            "label": "from command",
            "tag_root": {"original": "root"},
            "kid": {
                "n": 6,
                "ctx": context,
                "tag_middle": {"original": "middle"},
                "tag_leaf": {"original": "leaf"}
            }
        })
    );
    let out = capability_run(&["--context", "{not json"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr.contains("--context is not valid JSON"),
        "{}",
        out.stderr
    );
}

/// An integer that does not fit 64 bits is never rounded into a double: wherever a JSON text
/// enters (`--input`, `--context`, a batch line, what a `command` prints) it is an error naming
/// its JSON pointer; one that fits (`u64::MAX`) comes out exactly as it went in.
#[test]
fn integers_beyond_64_bits_are_refused_by_pointer_never_rounded() {
    let dir = TempDir::new("big-integers");
    dir.write(
        "echo.yaml",
        "flow: echo
agents:
  big:
    kind: command
    run: [printf, '{\"id\": 1, \"deep\": [0, {\"n\": 18446744073709551617}]}']
  copy:
    kind: transform
    result: {n: =input.n}
steps:
  route:
    set: {$.seen: {value: true}}
    next:
      - to: big_one
        if: has(payload.big) && payload.big
      - to: copy
  copy:
    agent: copy
    output: {$.copy: $.n}
  big_one:
    agent: big
    output: \"*\"
",
    );
    let run = |args: &[&str]| {
        support::run(
            support::switchyard(dir.path())
                .args(["run", "echo.yaml", "--store", "memory"])
                .args(args),
        )
    };

    let out = run(&["--input", r#"{"n": 18446744073709551615}"#]);
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(
        out.stdout.contains(r#""copy": 18446744073709551615"#),
        "{}",
        out.stdout
    );

    let out = run(&["--input", r#"{"n": 18446744073709551617}"#]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr.contains(
            "--input is not valid JSON: the integer 18446744073709551617 at `/n` does not fit in 64 bits"
        ),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("(line 1, column 7)"), "{}", out.stderr);
    let out = run(&[
        "--input",
        "{}",
        "--context",
        r#"{"ids": [1, -99999999999999999999]}"#,
    ]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr.contains("-99999999999999999999 at `/ids/1`"),
        "{}",
        out.stderr
    );

    let out = run(&["--input", r#"{"big": true}"#]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stderr.contains("invalid_output"), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("the integer 18446744073709551617 at `/deep/1/n` does not fit in 64 bits"),
        "{}",
        out.stderr
    );

    dir.write(
        "in.jsonl",
        "{\"id\": \"a\", \"n\": 1}\n{\"id\": \"b\", \"n\": 100000000000000000000}\n",
    );
    let out = support::run(support::switchyard(dir.path()).args([
        "batch",
        "echo.yaml",
        "--input",
        "in.jsonl",
        "--output",
        "out.jsonl",
        "--store",
        "memory",
    ]));
    assert_eq!(out.code(), 1, "{out:?}");
    let lines: Vec<Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["status"], "succeeded", "{lines:?}");
    assert_eq!(lines[1]["status"], "failed", "{lines:?}");
    let message = lines[1]["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "line 2 is not JSON: the integer 100000000000000000000 at `/n` does not fit in 64 bits"
        ),
        "{message}"
    );

    // In a flow file (a flow test's input here), at its line and column.
    dir.write(
        "tested.yaml",
        "flow: tested\nsteps:\n  one:\n    set: {$.n: =payload.n}\ntests:\n  - name: big\n    input: {n: 18446744073709551617}\n",
    );
    let out = support::run(support::switchyard(dir.path()).args(["test", "tested.yaml"]));
    assert_ne!(out.code(), 0, "{out:?}");
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(
        all.contains("the integer `18446744073709551617` does not fit in 64 bits"),
        "{all}"
    );
    assert!(all.contains("tested.yaml:7:16"), "{all}");
}

/// A key given twice in a JSON text that enters the engine is refused, naming the key and its
/// JSON pointer (serde_json alone keeps the last value): `--input`, `--input-file`, `--context`
/// and a batch line, which fails its item.
#[test]
fn a_key_given_twice_in_json_is_refused_by_pointer() {
    let dir = support::TempDir::new("duplicate-keys");
    dir.write(
        "echo.yaml",
        "flow: echo\nsteps:\n  copy:\n    set: {$.seen: =payload.n}\n",
    );
    let run = |args: &[&str]| {
        support::run(
            support::switchyard(dir.path())
                .args(["run", "echo.yaml", "--store", "memory"])
                .args(args),
        )
    };
    let out = run(&["--input", r#"{"n": 1, "m": {"k": 1, "k": 2}}"#]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr.contains(
            "--input is not valid JSON: duplicate key `k` at `/m/k` (a key may appear once in an object)"
        ),
        "{}",
        out.stderr
    );
    dir.write("input.json", "{\"n\": 1,\n \"n\": 2}\n");
    let out = run(&["--input-file", "input.json"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("duplicate key `n` at `/n`"), "{}", out.stderr);
    let out = run(&[
        "--input",
        "{\"n\": 1}",
        "--context",
        r#"{"a": [{"x": 1, "x": 1}]}"#,
    ]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr.contains("duplicate key `x` at `/a/0/x`"),
        "{}",
        out.stderr
    );

    dir.write(
        "in.jsonl",
        "{\"id\": \"a\", \"n\": 1}\n{\"id\": \"b\", \"n\": 1, \"n\": 2}\n",
    );
    let out = support::run(support::switchyard(dir.path()).args([
        "batch",
        "echo.yaml",
        "--input",
        "in.jsonl",
        "--output",
        "out.jsonl",
        "--store",
        "memory",
    ]));
    assert_eq!(out.code(), 1, "{out:?}");
    let lines: Vec<Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["status"], "succeeded", "{lines:?}");
    assert_eq!(lines[1]["id"], "b", "{lines:?}");
    assert_eq!(lines[1]["status"], "failed", "{lines:?}");
    let message = lines[1]["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("line 2 is not JSON: duplicate key `n` at `/n`"),
        "{message}"
    );
}

/// Text that is not UTF-8 (`--input-file`, `--agent-change`) and a lone surrogate escape are
/// named as such, where they are: not "stream did not contain valid UTF-8" or "unexpected end of
/// hex escape".
#[test]
fn invalid_utf8_and_lone_surrogates_are_named_where_they_are() {
    let dir = support::TempDir::new("invalid-text");
    dir.write(
        "echo.yaml",
        "flow: echo\nagents:\n  a: {kind: mock, returns: {}}\nsteps:\n  copy:\n    set: {$.seen: =payload.n}\n",
    );
    let run = |args: &[&str]| {
        support::run(
            support::switchyard(dir.path())
                .args(["run", "echo.yaml", "--store", "memory"])
                .args(args),
        )
    };
    std::fs::write(
        dir.path().join("input.json"),
        b"{\"n\": 1,\n \"s\": \"x\xffy\"}\n",
    )
    .unwrap();
    let out = run(&["--input-file", "input.json"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr
            .contains("`input.json` is not valid JSON: invalid UTF-8 at byte 18 (line 2, column 9)"),
        "{}",
        out.stderr
    );
    let out = run(&["--input", r#"{"n": 1, "s": "a\ud800"}"#]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr
            .contains("--input is not valid JSON: lone surrogate `\\ud800` (half of a UTF-16 pair"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("(line 1, column 17)"), "{}", out.stderr);
    std::fs::write(
        dir.path().join("change.yaml"),
        b"- replace: a\n  with: {kind: mock, returns: {v: \"\xfe\"}}\n",
    )
    .unwrap();
    let out = run(&["--input", "{\"n\": 1}", "--agent-change", "change.yaml"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr.contains(
            "--agent-change `change.yaml` is not UTF-8 text: invalid UTF-8 at byte 49 (line 2, column 36)"
        ),
        "{}",
        out.stderr
    );
}

#[test]
fn allow_narrows_the_capability_set() {
    let out = capability_run(&["--allow", "flow,transform,mock"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert_eq!(
        run_error(&out),
        (
            "capability".to_string(),
            "step `classify`: agent `classify` is of kind `command`, which is not allowed here \
             (allowed: flow, transform, mock)"
                .to_string()
        )
    );
    // Nested flows are narrowed too: the leaf's transform.
    let out = capability_run(&["--allow", "flow,command"]);
    assert_eq!(out.code(), 1, "{out:?}");
    let (kind, message) = run_error(&out);
    assert_eq!(kind, "capability");
    assert!(
        message.starts_with("step `tag`: agent `tag` is of kind `transform`"),
        "{message}"
    );

    let out = capability_run(&["--allow", "flow,teleport"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr.contains("unknown agent kind `teleport`"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_child_never_has_a_capability_its_caller_lacks() {
    // The leaf allows `mock`, the middle flow that calls it does not: a mock put in the leaf
    // is refused, and the allowed set named is the intersection down the tree.
    let out = capability_run(&["--agent-change", "capability/leaf-mock.yaml"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert_eq!(
        run_error(&out),
        (
            "capability".to_string(),
            "step `delegate`: agent `double` is of kind `mock`, which is not allowed here (allowed: flow, transform)"
                .to_string()
        )
    );
}

#[test]
fn agent_change_replace_swaps_a_command_for_a_mock() {
    let out = capability_ok(&["--agent-change", "capability/swap-command.yaml"]);
    assert_eq!(out["label"], json!("from mock"));
    // And the mock needs no `command` capability.
    let out = capability_ok(&[
        "--agent-change",
        "capability/swap-command.yaml",
        "--allow",
        "flow,transform,mock",
    ]);
    assert_eq!(out["label"], json!("from mock"));
}

#[test]
fn agent_change_scopes_choose_the_flows() {
    let original = |level: &str| json!({"original": level});
    let replaced = |level: &str| json!({"replaced": level});
    let cases = [
        (
            "replace-global",
            [replaced("root"), replaced("middle"), replaced("leaf")],
        ),
        (
            "replace-root",
            [replaced("root"), original("middle"), original("leaf")],
        ),
        (
            "replace-all_subagents",
            [original("root"), replaced("middle"), replaced("leaf")],
        ),
        (
            "replace-specific",
            [original("root"), replaced("middle"), original("leaf")],
        ),
    ];
    for (file, want) in cases {
        let out = capability_ok(&["--agent-change", &format!("capability/{file}.yaml")]);
        assert_eq!(tags(&out), want, "{file}");
    }
    // `specific` also replaced `double` in the leaf only.
    let out = capability_ok(&["--agent-change", "capability/replace-specific.yaml"]);
    assert_eq!(out["kid"]["n"], json!(300));
}

#[test]
fn agent_change_remove_fails_the_steps_that_call_it_with_capability() {
    let out = capability_run(&["--agent-change", "capability/remove-subagents.yaml"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert_eq!(
        run_error(&out),
        (
            "capability".to_string(),
            "step `delegate`: agent `tag` of flow `capability-middle` is removed by an agent change"
                .to_string()
        )
    );
}

#[test]
fn agent_change_add_fills_removed_agents_and_never_overrides() {
    let out = capability_ok(&["--agent-change", "capability/add.yaml"]);
    assert_eq!(
        tags(&out),
        [
            json!({"original": "root"}),
            json!({"original": "middle"}),
            json!({"added": "leaf"})
        ]
    );
}

#[test]
fn an_invalid_agent_change_file_is_a_usage_error() {
    let dir = TempDir::new("engine-change");
    let file = dir.write("change.yaml", "- scope: root\n  mode: swap\n  agents: {}\n");
    let out = capability_run(&["--agent-change", file.to_str().expect("utf-8")]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr.contains("change.yaml:2:9: unknown mode `swap`"),
        "{}",
        out.stderr
    );
}

#[test]
fn an_agent_change_naming_nothing_in_the_run_tree_fails_closed() {
    let dir = TempDir::new("engine-change-typo");
    // `classfy` is not an agent of the top flow, `capability-lef` is no flow of the tree:
    // nothing runs, and each name is reported where it is written, with the closest name.
    let file = dir.write(
        "change.yaml",
        "- scope: root\n  mode: remove\n  agents: [classfy]\n\
         - scope: specific\n  flows: [capability-lef]\n  mode: remove\n  agents: [tag]\n\
         - scope: all_subagents\n  mode: remove\n  agents: [classify]\n",
    );
    let out = capability_run(&["--agent-change", file.to_str().expect("utf-8")]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert_eq!(out.stdout, "", "nothing ran");
    for want in [
        "change.yaml:3:12: unknown agent `classfy`: no step of the top flow calls it (did you mean `classify`?)",
        "change.yaml:5:11: unknown flow `capability-lef`: the run's tree has no flow of that name \
         (did you mean `capability-leaf`?)",
        "change.yaml:10:12: unknown agent `classify`: no step of any nested flow calls it (agents are: `double`, `leaf`, `tag`)",
    ] {
        assert!(out.stderr.contains(want), "{want}\n{}", out.stderr);
    }
    // `flows` without `scope: specific` would be ignored: refused too.
    let file = dir.write(
        "flows.yaml",
        "- mode: remove\n  flows: [capability-leaf]\n  agents: [tag]\n",
    );
    let out = capability_run(&["--agent-change", file.to_str().expect("utf-8")]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr
            .contains("flows.yaml:2:11: `flows` is only for `scope: specific`"),
        "{}",
        out.stderr
    );
}
