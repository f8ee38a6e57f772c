//! The engine end to end (SPEC §3–§9, §11), through the real binary.
//!
//! Most semantics are checked by the flows' own `tests:` under `tests/fixtures/engine/`, one
//! file per topic: each Rust test here runs `switchyard test FILE` and asserts the exact
//! `N passed, 0 failed`, so a test that silently stops running fails too. What `tests:` cannot
//! express — exit codes, stderr, `--trace`, timing, what a `command` agent saw (its stdin,
//! argv, environment, idempotency key), process groups, `--context`, `--allow`,
//! `--agent-change` — is checked here with `switchyard run`, `command` agents in
//! [`crate::engine_commands`] and `--context`, `--allow` and `--agent-change` in
//! [`crate::engine_context`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{self, TempDir};

/// The engine fixtures.
pub(crate) fn engine_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/engine")
}

/// `switchyard test FILE` in the fixtures folder.
fn flow_tests(file: &str) -> support::Output {
    support::run(support::switchyard(&engine_dir()).args(["test", file]))
}

/// Runs the `tests:` of a fixture and checks that exactly `passed` of them ran, and all passed.
fn all_pass(file: &str, passed: usize) {
    let out = flow_tests(file);
    let summary = format!("{passed} passed, 0 failed");
    assert!(
        out.stdout.lines().any(|l| l == summary),
        "expected `{summary}` from `switchyard test {file}`:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    assert_eq!(out.code(), 0, "{out:?}");
}

/// `switchyard run FLOW --input INPUT ARGS...` in the fixtures folder.
pub(crate) fn run(flow: &str, input: &Value, args: &[&str]) -> support::Output {
    support::run(
        support::switchyard(&engine_dir())
            .args(["run", flow, "--input", &input.to_string()])
            .args(args),
    )
}

/// A run that must succeed: its output JSON.
fn run_ok(flow: &str, input: &Value, args: &[&str]) -> Value {
    let out = run(flow, input, args);
    assert_eq!(out.code(), 0, "`run {flow}` with {input} failed: {out:?}");
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", out.stdout))
}

/// A run that must fail (exit 1, nothing on stdout): the kind and message of its
/// `error[kind]: message` line.
fn run_failed(flow: &str, input: &Value, args: &[&str]) -> (String, String) {
    let out = run(flow, input, args);
    assert_eq!(out.code(), 1, "`run {flow}` with {input} should fail: {out:?}");
    assert_eq!(out.stdout, "", "a failed run prints no output");
    run_error(&out)
}

/// The `error[kind]: message` of a failed run's stderr. The message may span lines (a
/// command's stderr tail); it ends before the `  run `ID` failed after N steps` line.
pub(crate) fn run_error(out: &support::Output) -> (String, String) {
    let mut lines = out.stderr.lines();
    let first = lines
        .find(|l| l.starts_with("error[") && l.contains("]: "))
        .unwrap_or_else(|| panic!("no `error[kind]: message` line on stderr:\n{}", out.stderr));
    let (kind, message) = first["error[".len()..].split_once("]: ").expect("`]: ` is there");
    let mut message = message.to_string();
    for more in lines.take_while(|l| !l.starts_with("  run `")) {
        message.push('\n');
        message.push_str(more);
    }
    (kind.to_string(), message)
}

/// The line of `--trace` output for step `number` `id`, e.g. `✓ 2.1 look [set] 0ms → end`,
/// trimmed of its indentation.
fn trace_line<'a>(trace: &'a str, number: &str, id: &str) -> &'a str {
    let needle = format!(" {number} {id} [");
    trace
        .lines()
        .map(str::trim_start)
        .find(|l| l.contains(&needle))
        .unwrap_or_else(|| panic!("no trace line for step {number} `{id}` in:\n{trace}"))
}

/// The duration of a step in `--trace` output, in milliseconds.
fn trace_ms(trace: &str, number: &str, id: &str) -> u64 {
    let line = trace_line(trace, number, id);
    let after = &line[line.find("] ").expect("a kind in brackets") + 2..];
    after[..after.find("ms").expect("a duration")]
        .parse()
        .unwrap_or_else(|e| panic!("no duration in `{line}`: {e}"))
}

/// The indentation of a trace line (two spaces per level of nesting).
fn trace_indent(trace: &str, number: &str, id: &str) -> usize {
    let needle = format!(" {number} {id} [");
    let line = trace
        .lines()
        .find(|l| l.contains(&needle))
        .unwrap_or_else(|| panic!("no trace line for step {number} `{id}` in:\n{trace}"));
    line.len() - line.trim_start().len()
}

// ----- flow tests, one fixture per topic -------------------------------------------------------

#[test]
fn transform_and_mock_agents() {
    all_pass("agents.yaml", 3);
}

#[test]
fn routing() {
    all_pass("routing.yaml", 15);
}

#[test]
fn mappings() {
    all_pass("mappings.yaml", 3);
}

/// CEL equality over payload values and mixed-number arithmetic, in `set` and on `if:` edges.
#[test]
fn expressions() {
    all_pass("expressions.yaml", 2);
}

#[test]
fn strings_type_names_and_backquoted_fields() {
    all_pass("strings.yaml", 1);
}

/// A string function's range error fails the step with kind `expression`, in cel-go's words.
#[test]
fn string_function_errors_fail_the_step() {
    let input = json!({
        "line": "hello world", "tags": [], "name": "n", "padded": "", "accented": "ab", "amount": 1.0,
        "count": 1, "odd": {}, "flag": false, "nothing": null,
    });
    let (kind, message) = run_failed("strings.yaml", &input, &[]);
    assert_eq!(kind, "expression");
    assert!(
        message.starts_with("step `text`: `[payload.accented.substring(2)")
            && message.ends_with("`substring`: index out of range: 3"),
        "{message}"
    );
    let mut input = input;
    input["accented"] = json!("abcd");
    input["tags"] = json!(["a", 1]);
    let (kind, message) = run_failed("strings.yaml", &input, &[]);
    assert_eq!(kind, "expression");
    assert!(
        message.ends_with("`join`: invalid input: int is not a string"),
        "{message}"
    );
}

/// Calls of functions that do not exist, or with the wrong number of arguments, keep a flow
/// from running: `run` lints first and refuses with exit 2, naming the place.
#[test]
fn unknown_functions_are_refused_before_the_run() {
    let dir = TempDir::new("unknown-fn");
    let flow = dir.write(
        "f.yaml",
        "flow: f\nsteps:\n  s:\n    set: {$.w: '=payload.s.spilt(\",\")', $.n: '=size(payload.s, 1)'}\n    next: end\n",
    );
    let out = support::run(support::switchyard(dir.path()).args([
        "run",
        flow.to_str().expect("utf-8 path"),
        "--input",
        r#"{"s": "a,b"}"#,
    ]));
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("unknown method `spilt`"), "{}", out.stderr);
    assert!(out.stderr.contains("did you mean `split`?"), "{}", out.stderr);
    assert!(
        out.stderr.contains("`size` takes 1 argument, not 2 arguments"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("f.yaml:4:"), "{}", out.stderr);
}

#[test]
fn foreach() {
    all_pass("foreach.yaml", 7);
}

#[test]
fn while_loops() {
    all_pass("while.yaml", 5);
}

#[test]
fn parallel() {
    all_pass("parallel.yaml", 4);
}

#[test]
fn retries_timeouts_and_schemas() {
    all_pass("policies.yaml", 10);
}

#[test]
fn nested_flows() {
    all_pass("nested.yaml", 2);
}

#[test]
fn the_root_max_depth_governs_the_tree() {
    all_pass("depth.yaml", 1);
}

#[test]
fn limits() {
    all_pass("limits.yaml", 6);
}

#[test]
fn test_mocks_stand_in_for_agents_whatever_the_allow_lists() {
    all_pass("capability.yaml", 1);
}

#[test]
fn the_flows_and_examples_of_the_repository_pass_their_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = support::run(support::switchyard(root).args(["test", "flows", "examples"]));
    assert_eq!(out.code(), 0, "{out:?}");
    let summary = out
        .stdout
        .lines()
        .find(|l| l.ends_with(" failed"))
        .unwrap_or_else(|| panic!("no summary: {}", out.stdout));
    let (passed, failed) = summary.split_once(" passed, ").expect("`N passed, N failed`");
    assert_eq!(failed, "0 failed", "{}", out.stdout);
    let passed: usize = passed.parse().expect("a count");
    assert!(passed >= 25, "only {passed} tests ran:\n{}", out.stdout);
    // Every flow of `flows/` that has tests ran them (a new flow is covered by being there).
    for entry in std::fs::read_dir(root.join("flows")).expect("read flows/") {
        let path = entry.expect("an entry").path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if path.extension().is_some_and(|e| e == "yaml") && text.contains("\ntests:\n") {
            let name = path.file_name().expect("a name").to_string_lossy();
            let shown = format!("ok     flows/{name} :: ");
            assert!(
                out.stdout.contains(&shown),
                "no tests of flows/{name} ran:\n{}",
                out.stdout
            );
        }
    }
}

// ----- `switchyard test` reporting failures ----------------------------------------------------

#[test]
fn failing_flow_tests_are_reported_with_why_and_exit_1() {
    let out = flow_tests("test-failures.yaml");
    assert_eq!(out.code(), 1, "{out:?}");
    let s = &out.stdout;
    assert!(s.lines().any(|l| l == "1 passed, 5 failed"), "{s}");
    assert!(s.contains("ok     test-failures.yaml :: passes"), "{s}");
    let expect = [
        ("wrong output", "output: `$.x` is 1, expected 2"),
        ("wrong output", "output: `$.use_tool` is false, expected true"),
        ("wrong output", "output: `$.absent` is missing"),
        (
            "wrong output",
            "output: `$.n` is 9007199254740993, expected 9007199254740992",
        ),
        (
            "wrong path and call count",
            "path: expected [compute, call_tool], got [compute]",
        ),
        ("wrong path and call count", "calls.pure: expected 2, got 1"),
        (
            "wrong status and error kind",
            "status: expected failed, got succeeded",
        ),
        (
            "an unmocked command agent fails the test even when the flow routes around it",
            "agent `tool` was called but is not mocked",
        ),
        // Even a test that expects the failure an unmocked agent causes fails.
        (
            "an unmocked http agent fails the test",
            "agent `remote` was called but is not mocked",
        ),
    ];
    for (name, why) in expect {
        let header = format!("FAILED test-failures.yaml :: {name}");
        let at = s
            .find(&header)
            .unwrap_or_else(|| panic!("`{header}` missing:\n{s}"));
        // The reasons are indented under their test, before the next test's line.
        let block: String = s[at + header.len()..]
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("       "))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(block.contains(why), "`{name}`: expected `{why}` in:\n{block}");
    }
}

#[test]
fn a_file_that_is_not_a_valid_flow_is_not_silently_skipped() {
    let dir = TempDir::new("engine-test-invalid");
    dir.write(
        "broken.yaml",
        "flow: broken\nsteps:\n  a: {set: {$.a: [1}}\ntests:\n  - name: t\n    expect: {}\n",
    );
    let out = support::run(support::switchyard(dir.path()).args(["test", "broken.yaml"]));
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("error[SY100]"), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("`broken.yaml` is not a valid flow; its tests did not run"),
        "{}",
        out.stderr
    );
}

// ----- invalid flows ---------------------------------------------------------------------------

#[test]
fn an_invalid_flow_prints_its_diagnostics_and_does_not_run() {
    let dir = TempDir::new("engine-invalid");
    let marker = dir.path().join("ran");
    let input = json!({"marker": marker});
    let out = run("invalid.yaml", &input, &[]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert_eq!(out.stdout, "");
    assert!(out.stderr.contains("error[SY201] unknown-step"), "{}", out.stderr);
    assert!(out.stderr.contains("unknown step `finsh`"), "{}", out.stderr);
    assert!(
        !marker.exists(),
        "the first step ran although the flow is invalid"
    );

    // The same flow with the typo fixed runs its first step: the marker is a real witness.
    let text = std::fs::read_to_string(engine_dir().join("invalid.yaml")).expect("fixture");
    let fixed = dir.write("valid.yaml", text.replace("next: finsh", "next: finish"));
    std::fs::create_dir_all(dir.path().join("command")).expect("mkdir");
    std::fs::copy(
        engine_dir().join("command/touch.sh"),
        dir.path().join("command/touch.sh"),
    )
    .expect("copy the script");
    let out = support::run(support::switchyard(dir.path()).args([
        "run",
        fixed.to_str().expect("utf-8"),
        "--input",
        &input.to_string(),
    ]));
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(std::fs::read_to_string(&marker).expect("the marker"), "ran\n");
}

// ----- routing ---------------------------------------------------------------------------------

#[test]
fn a_succeeded_run_prints_exactly_its_output() {
    let out = run_ok("routing.yaml", &json!({"mode": "end"}), &[]);
    assert_eq!(out, json!({"mode": "end", "seen": true}));
}

#[test]
fn no_route_lists_every_edge_and_what_it_evaluated_to() {
    let (kind, message) = run_failed("routing.yaml", &json!({"mode": "nothing"}), &[]);
    assert_eq!(kind, "no_route");
    assert!(
        message.starts_with("step `dispatch`: no edge matched: "),
        "{message}"
    );
    for (to, mode) in [
        ("judge", "judge"),
        ("explode", "explode"),
        ("unhandled", "unhandled"),
        ("always_fail", "always"),
        ("too_slow", "slow"),
        ("reject", "reject"),
        ("custom_reject", "custom"),
        ("quit", "quit"),
        ("end", "end"),
        ("bad_if", "bad_if"),
        ("not_bool", "not_bool"),
        ("approve", "interrupt"),
    ] {
        let edge = format!("to `{to}`: if payload.mode == \"{mode}\" → false");
        assert!(message.contains(&edge), "`{edge}` missing from: {message}");
    }
    assert_eq!(message.matches("→ false").count(), 12, "{message}");
}

#[test]
fn an_if_that_errors_fails_with_expression_naming_the_edge_and_the_cause() {
    let (kind, message) = run_failed("routing.yaml", &json!({"mode": "bad_if"}), &[]);
    assert_eq!(kind, "expression");
    assert_eq!(
        message,
        "step `bad_if`: the condition of the edge to `grade_a` failed: \
         `payload.missing.field > 1`: no such key `missing`"
    );
    let (kind, message) = run_failed("routing.yaml", &json!({"mode": "not_bool", "score": 3}), &[]);
    assert_eq!(kind, "expression");
    assert_eq!(
        message,
        "step `not_bool`: the condition of the edge to `grade_a` failed: \
         `payload.score`: must return a boolean, got int 3"
    );
}

#[test]
fn fail_steps_print_their_kind_and_message() {
    let (kind, message) = run_failed(
        "routing.yaml",
        &json!({"mode": "custom", "amount": 120, "who": "bob"}),
        &[],
    );
    assert_eq!(
        (kind.as_str(), message.as_str()),
        (
            "rejected",
            "step `custom_reject`: amount 120 over the limit for bob"
        )
    );
    let (kind, _) = run_failed("routing.yaml", &json!({"mode": "reject"}), &[]);
    assert_eq!(kind, "fail");
    // A message that cannot be rendered (`input.who` is missing) keeps the `fail`'s kind.
    let (kind, message) = run_failed("routing.yaml", &json!({"mode": "custom", "amount": 120}), &[]);
    assert_eq!(kind, "rejected", "{message}");
    assert!(
        message.starts_with("step `custom_reject`: the `fail` message could not be rendered: ")
            && message.contains("who"),
        "{message}"
    );
}

#[test]
fn an_interrupted_run_exits_3() {
    let out = run("routing.yaml", &json!({"mode": "interrupt", "amount": 5}), &[]);
    assert_eq!(out.code(), 3, "{out:?}");
    assert!(out.stderr.contains("waits for a decision"), "{}", out.stderr);
}

#[test]
fn trace_shows_status_routes_attempts_and_iterations() {
    let out = run("routing.yaml", &json!({"mode": "explode"}), &["--trace"]);
    assert_eq!(out.code(), 0, "{out:?}");
    let t = &out.stderr;
    assert!(t.contains("· routing · succeeded"), "{t}");
    assert!(
        trace_line(t, "1", "dispatch").starts_with("✓ 1 dispatch [set] "),
        "{t}"
    );
    assert!(trace_line(t, "1", "dispatch").ends_with("→ explode"), "{t}");
    let explode = trace_line(t, "2", "explode");
    assert!(explode.starts_with("✗ 2 explode [agent] "), "{t}");
    assert!(explode.ends_with("→ on_agent"), "{t}");
    assert!(
        t.contains("error[agent]: mock failure 1 of 1000"),
        "the failed step's error is shown: {t}"
    );
    assert!(trace_line(t, "3", "on_agent").starts_with("✓ 3 on_agent [set]"));

    let input = json!({"total": 0, "step": 4, "target": 10, "trail": [], "ns": [], "stop": 5});
    let out = run("while.yaml", &input, &["--trace"]);
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(trace_line(&out.stderr, "1", "grow").ends_with("· 3 iterations → fragile"));

    let out = run("policies.yaml", &json!({"mode": "backoff", "n": 0}), &["--trace"]);
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(trace_line(&out.stderr, "2", "backoff").ends_with("· 3 attempts"));
}

// ----- mappings --------------------------------------------------------------------------------

fn mappings_input() -> Value {
    json!({
        "ticket": {"id": "T1", "body": "help me"},
        "customer": {"id": 7, "name": "Ada"},
        "tags": ["a", "b", "c"],
        "items": [{"id": 1}, {"id": 2}],
        "meta": {"a": 1, "b": {"c": 2}},
        "list": [1, 2, 3],
        "allowed": {"deep": {"old": 1}},
        "report": {"title": "Q3"}
    })
}

#[test]
fn input_and_output_forms_write_exactly_what_they_name() {
    let out = run_ok("mappings.yaml", &mappings_input(), &[]);
    // A downstream filter keeps only its paths, structure kept.
    assert_eq!(
        out["seen_filtered"],
        json!({"ticket": {"id": "T1"}, "customer": {"name": "Ada"}, "tags": [null, "b"]})
    );
    assert_eq!(
        out["seen_mapped"],
        json!({
            "text": "help me", "n": 3, "fixed": [1, {"two": 2}], "opt": "none",
            "opt_found": "T1", "deep": {"x": {"y": "T1"}}, "ids": [1, 2], "first": "a"
        })
    );
    // The whole payload, as it was then.
    assert_eq!(out["seen_all"], mappings_input());
    // `"*"`: objects merge, arrays and scalars replace, nothing is deleted.
    assert_eq!(out["meta"], json!({"a": 1, "b": {"c": 2, "d": 3}, "e": 4}));
    assert_eq!(out["list"], json!([9]));
    // An upstream allowlist under a scope: only the allowed parts, merged.
    assert_eq!(
        out["allowed"],
        json!({"reply": "hi", "deep": {"old": 1, "keep": "yes"}})
    );
    assert_eq!(
        out["mapped"],
        json!({"e": 4, "d_plus_one": 4, "lit": {"x": [1]}, "opt": 0, "none_result": "hi"})
    );
    assert_eq!(out["report"], json!({"title": "Q3", "summary": "summary of Q3"}));
    assert_eq!(out["merged_after_none"], json!(false));
}

#[test]
fn allowlist_violations_are_recorded_on_the_step() {
    let out = run("mappings.yaml", &mappings_input(), &["--trace"]);
    assert_eq!(out.code(), 0, "{out:?}");
    let t = &out.stderr;
    let step = trace_line(t, "7", "produce_allowlist");
    assert!(step.starts_with("✓ 7 produce_allowlist [agent]"), "{t}");
    let at = t.find(step).expect("the step line");
    let violations: Vec<&str> = t[at..]
        .lines()
        .skip(1)
        .map(str::trim)
        .take_while(|l| l.starts_with("violation: "))
        .collect();
    assert_eq!(
        violations,
        [
            "violation: $.meta (not in the output allowlist)",
            "violation: $.list (not in the output allowlist)",
            "violation: $.extra (not in the output allowlist)",
            "violation: $.deep.drop (not in the output allowlist)",
        ],
        "{t}"
    );
    // No other step has violations.
    assert_eq!(t.matches("violation: ").count(), 4, "{t}");
}

#[test]
fn a_missing_source_names_the_path_and_the_nearest_key() {
    let mut input = mappings_input();
    input["ticket"] = json!({"id": "T1", "bdy": "help me"});
    let (kind, message) = run_failed("mappings.yaml", &input, &[]);
    assert_eq!(kind, "mapping");
    assert_eq!(
        message,
        "step `see_mapped`: `$.ticket.body` matched nothing; nearest: `$.ticket.bdy`"
    );
}

// ----- foreach, while, parallel: timing --------------------------------------------------------

/// Start and end times (ns) of each item, from the log command/stamp.sh writes.
fn stamps(log: &Path) -> Vec<(u128, u128)> {
    let text = std::fs::read_to_string(log).expect("the stamp log");
    let mut times = vec![(0u128, 0u128); 4];
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let [i, what, ns] = parts[..] else {
            panic!("bad stamp line `{line}`")
        };
        let (i, ns): (usize, u128) = (i.parse().expect("index"), ns.parse().expect("ns"));
        match what {
            "start" => times[i].0 = ns,
            "end" => times[i].1 = ns,
            other => panic!("bad stamp `{other}`"),
        }
    }
    assert!(
        times.iter().all(|(s, e)| *s > 0 && e > s),
        "every item started and ended: {text}"
    );
    times
}

#[test]
fn foreach_concurrency_is_a_sliding_window() {
    let dir = TempDir::new("engine-window");
    let log = dir.path().join("stamps.log");
    let input = json!({"log": log, "items": ["0.3", "0.05", "0.05", "0.05"]});
    let out = run_ok("foreach-window.yaml", &input, &[]);
    // In item order, although item 0 finished last.
    assert_eq!(out["order"], json!([0, 1, 2, 3]));
    let t = stamps(&log);
    assert!(
        t.iter().skip(1).all(|(_, end)| *end < t[0].1),
        "item 0 finishes last: {t:?}"
    );
    // A window: items 2 and 3 start while item 0 still runs (fixed batches of 2 would start
    // them only after it finished).
    assert!(t[2].0 < t[0].1 && t[3].0 < t[0].1, "not a sliding window: {t:?}");
    // Never more than 2 in flight: at each start, count the items running.
    for (i, (start, _)) in t.iter().enumerate() {
        let running = t.iter().filter(|(s, e)| s <= start && start < e).count();
        assert!(
            running <= 2,
            "{running} items in flight when item {i} started: {t:?}"
        );
    }
}

#[test]
fn while_waits_its_delay_between_iterations() {
    let input = json!({"total": 0, "step": 4, "target": 10, "trail": [], "ns": [], "stop": 5});
    let out = run("while.yaml", &input, &["--trace"]);
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(trace_line(&out.stderr, "2", "fragile").contains("· 3 iterations"));
    // 3 iterations, 2 delays of 60ms: none before the first iteration.
    let ms = trace_ms(&out.stderr, "2", "fragile");
    assert!((120..1000).contains(&ms), "fragile took {ms}ms");
}

/// A `while` that appends to a list: each iteration's record holds the element it appended,
/// the loop's record no payload change at all, so what a run records grows with its
/// iterations, not with their square (the list each iteration left behind).
#[test]
fn a_while_loop_that_appends_records_each_iteration_s_own_change() {
    let dir = TempDir::new("while-records");
    dir.write(
        "acc.yaml",
        "flow: acc
limits: {max_steps: 100000}
agents:
  entry:
    kind: transform
    result: {k: =input.k}
steps:
  accumulate:
    while: =iteration < context.n
    max_iterations: 10000
    agent: entry
    input: {$.k: =iteration}
    output: {$.log: \"=payload.log + [result]\"}
",
    );
    // The records of a run of `n` iterations, as `runs show --json` gives them.
    let records = |n: u64| -> (Value, usize) {
        let store = format!("sqlite:runs-{n}.db");
        let out = support::run(support::switchyard(dir.path()).args([
            "run",
            "acc.yaml",
            "--input",
            r#"{"log": []}"#,
            "--context",
            &json!({"n": n}).to_string(),
            "--store",
            &store,
        ]));
        assert_eq!(out.code(), 0, "{out:?}");
        let output: Value = serde_json::from_str(&out.stdout).unwrap();
        let expected: Vec<Value> = (0..n).map(|k| json!({"k": k})).collect();
        assert_eq!(output, json!({"log": expected}));
        let list =
            support::run(support::switchyard(dir.path()).args(["runs", "list", "--json", "--store", &store]));
        let run: Value = serde_json::from_str(list.stdout.lines().next().unwrap()).unwrap();
        let id = run["id"].as_str().unwrap();
        let show = support::run(
            support::switchyard(dir.path()).args(["runs", "show", id, "--json", "--store", &store]),
        );
        assert_eq!(show.code(), 0, "{show:?}");
        (serde_json::from_str(&show.stdout).unwrap(), show.stdout.len())
    };
    let (shown, small) = records(200);
    let steps = shown["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 201, "{shown}");
    for s in steps {
        match s["iteration"].as_u64() {
            Some(k) => assert_eq!(
                s["changes"],
                json!([{"path": format!("$.log[{k}]"), "value": {"k": k}}]),
                "{s}"
            ),
            None => assert_eq!(s["changes"], json!([]), "{s}"),
        }
    }
    let (_, large) = records(400);
    let ratio = large as f64 / small as f64;
    assert!(
        ratio < 2.2,
        "twice the iterations, {ratio:.2} times the records ({small} → {large} bytes)"
    );
}

#[test]
fn retry_backoff_grows_by_its_factor() {
    let out = run("policies.yaml", &json!({"mode": "backoff", "n": 0}), &["--trace"]);
    assert_eq!(out.code(), 0, "{out:?}");
    // 60ms, then 120ms; the default backoff (1s) would take much longer.
    let ms = trace_ms(&out.stderr, "2", "backoff");
    assert!((180..900).contains(&ms), "backoff took {ms}ms");
}

#[test]
fn parallel_branches_run_at_once_unless_concurrency_says_otherwise() {
    let out = run("parallel.yaml", &json!({"mode": "ok"}), &["--trace"]);
    assert_eq!(out.code(), 0, "{out:?}");
    // The 150ms branch and three 1ms branches at once.
    let ms = trace_ms(&out.stderr, "2", "both");
    assert!((150..300).contains(&ms), "both took {ms}ms");

    let out = run("parallel.yaml", &json!({"mode": "one_at_a_time"}), &["--trace"]);
    assert_eq!(out.code(), 0, "{out:?}");
    // Two 150ms branches, one after the other.
    let ms = trace_ms(&out.stderr, "2", "one_at_a_time");
    assert!(ms >= 300, "one_at_a_time took {ms}ms");
}

#[test]
fn parallel_fail_fast_cancels_and_the_default_waits() {
    let out = run("parallel.yaml", &json!({"mode": "fail_fast"}), &["--trace"]);
    assert_eq!(out.code(), 0, "{out:?}");
    // The failing branch takes 20ms; the 400ms one is cancelled.
    let ms = trace_ms(&out.stderr, "2", "fail_fast");
    assert!(ms < 300, "fail_fast took {ms}ms");

    let out = run("parallel.yaml", &json!({"mode": "one_fails"}), &["--trace"]);
    assert_eq!(out.code(), 0, "{out:?}");
    // Without fail_fast the 150ms branch finishes although the other failed after 20ms.
    let ms = trace_ms(&out.stderr, "2", "one_fails");
    assert!(ms >= 150, "one_fails took {ms}ms");
    let line = trace_line(&out.stderr, "2", "one_fails");
    assert!(line.starts_with("✗ 2 one_fails [parallel]") && line.ends_with("→ caught"));
}

// ----- policies and schemas --------------------------------------------------------------------

#[test]
fn output_select_prints_only_the_selected_part() {
    let out = run_ok("policies.yaml", &json!({"mode": "score", "n": 7}), &[]);
    assert_eq!(out, json!({"score": 7, "extra": "kept"}));
}

#[test]
fn an_input_schema_violation_fails_before_any_step() {
    let out = run(
        "policies.yaml",
        &json!({"mode": "score", "n": "seven"}),
        &["--trace"],
    );
    assert_eq!(out.code(), 1, "{out:?}");
    let (kind, message) = run_error(&out);
    assert_eq!(kind, "mapping");
    assert!(
        message.starts_with("the run input does not match `input.schema` at `/n`: "),
        "{message}"
    );
    assert!(!out.stderr.contains("dispatch"), "no step ran: {}", out.stderr);
    assert!(out.stderr.contains("failed after 0 steps"), "{}", out.stderr);

    // Every violation at once, each with its pointer, in the message and the record.
    let out = run(
        "policies.yaml",
        &json!({"mode": 7, "n": "seven"}),
        &["--store", "memory"],
    );
    assert_eq!(out.code(), 1, "{out:?}");
    let (kind, message) = run_error(&out);
    assert_eq!(kind, "mapping");
    assert!(
        message.starts_with("the run input does not match `input.schema` (2 violations): at `/")
            && message.contains("at `/mode`: 7 is not of type \"string\"")
            && message.contains("at `/n`: \"seven\" is not of type \"integer\""),
        "{message}"
    );
}

#[test]
fn schema_violations_name_the_json_pointer() {
    let (kind, message) = run_failed("policies.yaml", &json!({"mode": "score", "n": 101}), &[]);
    assert_eq!(kind, "invalid_output");
    assert!(
        message.starts_with(
            "step `score`: the result of agent `scorer` does not match its `result_schema` at `/score`: "
        ),
        "{message}"
    );
    let (kind, message) = run_failed("policies.yaml", &json!({"mode": "score", "n": 11}), &[]);
    assert_eq!(kind, "invalid_output");
    assert!(
        message.starts_with("the run output does not match `output.schema` at `/score`: "),
        "{message}"
    );
}

#[test]
fn a_timeout_is_per_attempt() {
    let started = Instant::now();
    let (kind, message) = run_failed("policies.yaml", &json!({"mode": "slow", "n": 0}), &[]);
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("timeout", "step `too_slow` timed out after 30ms (attempt 2)")
    );
    // Two 30ms attempts of a 300ms agent.
    assert!(started.elapsed() < Duration::from_secs(5));
}

// ----- nesting ---------------------------------------------------------------------------------

#[test]
fn trace_numbers_the_steps_of_child_runs_under_their_calling_step() {
    let out = run(
        "nested.yaml",
        &json!({"name": "ada", "fail": false}),
        &["--trace", "--context", r#"{"tenant": "acme"}"#],
    );
    assert_eq!(out.code(), 0, "{out:?}");
    let t = &out.stderr;
    for (number, id, kind) in [
        ("1", "prepare", "set"),
        ("2", "call_child", "agent"),
        ("2.1", "look", "set"),
        ("3", "call_inline", "agent"),
        ("3.1", "shout", "agent"),
        ("4", "go_deep", "agent"),
        ("4.1", "down", "agent"),
        ("4.1.1", "down", "agent"),
        ("4.1.1.2", "note", "set"),
    ] {
        let line = trace_line(t, number, id);
        assert!(
            line.starts_with(&format!("✓ {number} {id} [{kind}] ")),
            "{line}\n{t}"
        );
    }
    let deepest = trace_line(t, "4.1.1.1", "down");
    assert!(
        deepest.starts_with("✗ 4.1.1.1 down [agent]") && deepest.ends_with("→ note"),
        "{t}"
    );
    assert!(
        t.contains("error[depth]: nesting limit reached (depth 3 of 3)"),
        "{t}"
    );
    // Each level of nesting is indented under its caller.
    assert_eq!(
        trace_indent(t, "2.1", "look"),
        trace_indent(t, "2", "call_child") + 2
    );
    assert_eq!(
        trace_indent(t, "4.1.1.1", "down"),
        trace_indent(t, "4", "go_deep") + 6
    );
    let output: Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(
        output["child_out"],
        json!({
            "name": "ada", "fail": false, "saw_parent_payload": false,
            "greeting": "hello ada", "tenant": "acme",
            "run_input": {"name": "ada", "fail": false}
        })
    );
}

#[test]
fn a_call_beyond_max_depth_fails_with_kind_depth() {
    let (kind, message) = run_failed("depth.yaml", &json!({}), &[]);
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("depth", "step `go_deep`: nesting limit reached (depth 2 of 2)")
    );
}

// ----- limits ----------------------------------------------------------------------------------

#[test]
fn the_run_timeout_stops_the_run() {
    let started = Instant::now();
    let (kind, message) = run_failed("limits.yaml", &json!({"mode": "slow"}), &[]);
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("limit", "step `nap`: run timeout reached (limits.timeout 300ms)")
    );
    // The agent sleeps 5s; the run does not wait for it.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn limit_errors_name_the_limit_and_its_value() {
    let (kind, message) = run_failed("limits.yaml", &json!({"mode": "loop"}), &[]);
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("limit", "step `spin`: step limit reached (limits.max_steps 20)")
    );
    let (kind, message) = run_failed("limits.yaml", &json!({"mode": "grow"}), &[]);
    assert_eq!(
        (kind.as_str(), message.as_str()),
        (
            "limit",
            "step `grow`: payload size limit reached (limits.max_payload_bytes 1024)"
        )
    );
}

/// `run` takes every `limits:` field as a flag: a tighter one applies, and its error names
/// the flag; a looser one changes nothing (the flow's limit applies, and a warning says so).
#[test]
fn limit_flags_narrow_the_flows_limits_and_never_widen_them() {
    let (kind, message) = run_failed("limits.yaml", &json!({"mode": "loop"}), &["--max-steps", "5"]);
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("limit", "step `spin`: step limit reached (--max-steps 5)")
    );
    let out = run("limits.yaml", &json!({"mode": "loop"}), &["--max-steps", "500"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert_eq!(
        run_error(&out).1,
        "step `spin`: step limit reached (limits.max_steps 20)"
    );
    assert!(
        out.stderr
            .contains("--max-steps is looser than the flow's limits.max_steps (20), which applies"),
        "{}",
        out.stderr
    );
    // A flow without a timeout gets one; a shorter one than the flow's replaces it.
    let (_, message) = run_failed("limits.yaml", &json!({"mode": "slow"}), &["--timeout", "100ms"]);
    assert_eq!(message, "step `nap`: run timeout reached (--timeout 100ms)");
    let out = run("limits.yaml", &json!({"mode": "slow"}), &["--timeout", "10m"]);
    assert_eq!(
        run_error(&out).1,
        "step `nap`: run timeout reached (limits.timeout 300ms)"
    );
    let (_, message) = run_failed("depth.yaml", &json!({}), &["--max-depth", "1"]);
    assert_eq!(message, "step `go_deep`: nesting limit reached (depth 1 of 1)");
    let (_, message) = run_failed(
        "limits.yaml",
        &json!({"mode": "end", "pad": "0123456789".repeat(10)}),
        &["--max-payload-bytes", "100"],
    );
    assert_eq!(message, "payload size limit reached (--max-payload-bytes 100)");
    let (_, message) = run_failed(
        "limits.yaml",
        &json!({"mode": "grow"}),
        &["--max-payload-bytes", "1MiB"],
    );
    assert_eq!(
        message,
        "step `grow`: payload size limit reached (limits.max_payload_bytes 1024)"
    );
    // Values that are not limits are usage errors.
    for (flag, value, says) in [
        ("--timeout", "0s", "a timeout of zero"),
        ("--timeout", "soon", "`soon` is not a duration"),
        ("--max-payload-bytes", "1 lot", "`1 lot` is not a size"),
        ("--max-steps", "0", "0 is not in 1.."),
    ] {
        let out = run("limits.yaml", &json!({"mode": "end"}), &[flag, value]);
        assert_eq!(out.code(), 2, "{out:?}");
        assert!(out.stderr.contains(says), "{flag} {value}: {}", out.stderr);
    }
}

/// `batch` takes the same flags, for each item's run.
#[test]
fn batch_takes_the_limit_flags_for_each_run() {
    let dir = TempDir::new("batch-limits");
    dir.write(
        "in.jsonl",
        "{\"id\": \"a\", \"mode\": \"loop\"}\n{\"id\": \"b\", \"mode\": \"end\"}\n",
    );
    let out = support::run(
        support::switchyard(dir.path())
            .arg("batch")
            .arg(engine_dir().join("limits.yaml"))
            .args(["--input", "in.jsonl", "--output", "out.jsonl", "--max-steps", "3"]),
    );
    assert_eq!(out.code(), 1, "{out:?}");
    let lines: Vec<Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines[0]["error"]["message"],
        "step `spin`: step limit reached (--max-steps 3)"
    );
    assert_eq!(lines[1]["status"], "succeeded");
}

/// Ctrl-C stops `run` at its next recorded point: the step in flight finishes and is recorded,
/// the process says how to continue and exits 130, and `resume` runs only what is left.
#[test]
fn ctrl_c_stops_a_run_at_a_recorded_point_and_resume_continues_it() {
    let dir = TempDir::new("run-sigint");
    let calls = dir.path().join("calls");
    dir.write(
        "slow.yaml",
        crate::support::slow_steps_flow(&calls, &["one", "two", "three"]),
    );
    let child = support::switchyard(dir.path())
        .args(["run", "slow.yaml", "--input", "{}", "--store", "sqlite:runs.db"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    // Once the first call has started: SIGINT, as Ctrl-C sends it.
    let started = Instant::now();
    while !calls.exists() {
        assert!(started.elapsed() < support::HANG, "the first call never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (code, stderr) = support::interrupt(child);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr.contains("stopping: the steps in flight finish"),
        "{stderr}"
    );
    let hint = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("continue it with `"))
        .unwrap_or_else(|| panic!("no way to continue: {stderr}"));
    let args: Vec<&str> = hint.trim_end_matches('`').split(' ').collect();
    assert_eq!(args[..2], ["switchyard", "resume"], "{hint}");
    assert_eq!(args[3..], ["--store", "sqlite:runs.db"], "{hint}");
    let count = || std::fs::read_to_string(&calls).unwrap().lines().count();
    assert_eq!(
        count(),
        1,
        "the step in flight finished; nothing after it started"
    );
    let resumed = support::run(support::switchyard(dir.path()).args(&args[1..]));
    assert_eq!(resumed.code(), 0, "{}", resumed.stderr);
    let output: Value = serde_json::from_str(&resumed.stdout).expect("JSON output");
    assert_eq!(output, json!({"one": true, "two": true, "three": true}));
    assert_eq!(count(), 3, "the first step was not called again");
}

/// A run interrupted on a throwaway store is not sent to `resume`, which could not find it.
#[test]
fn an_interrupted_run_on_the_memory_store_is_not_sent_to_resume() {
    let out = run(
        "routing.yaml",
        &json!({"mode": "interrupt", "amount": 5}),
        &["--store", "memory"],
    );
    assert_eq!(out.code(), 3, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("with `--store memory` nothing of the run was kept"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("continue it with"), "{}", out.stderr);
}

/// `output.select` with blank space inside its brackets is a bracketed selection, not a
/// singular query (RFC 9535 §2.3.5.1): the run's output is the list of its matches, where
/// the same name without the blank space is the value itself.
#[test]
fn output_select_with_blank_space_in_brackets_is_a_node_list() {
    let dir = TempDir::new("engine-select-blank");
    for (name, select, want) in [
        ("singular.yaml", "$['a']", json!({"n": 1})),
        ("blank-before.yaml", "$[ 'a']", json!([{"n": 1}])),
        ("blank-after.yaml", "$['a' ]", json!([{"n": 1}])),
        ("blank-index.yaml", "$.list[ 0 ]", json!([7])),
    ] {
        dir.write(
            name,
            format!(
                "flow: select\nsteps:\n  fill:\n    set: {{$.a: {{value: {{n: 1}}}}, $.list: {{value: [7]}}}}\n\
                 output:\n  select: \"{select}\"\n"
            ),
        );
        let out = support::run(
            support::switchyard(dir.path()).args(["run", name, "--input", "{}", "--store", "memory"]),
        );
        assert_eq!(out.code(), 0, "{name}: {out:?}");
        let got: Value = serde_json::from_str(&out.stdout).expect("the output is JSON");
        assert_eq!(got, want, "{name}: `select: {select}`");
    }
}
