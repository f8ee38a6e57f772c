//! Money through the real `switchyard` binary, against the local OpenAI-compatible server: a
//! model priced so that float sums drift ($1.10 and $2.20 per million tokens: one call of 100
//! tokens in and 100 out costs 0.00033, which floats add up to `0.0009900000000000002`
//! over three). Every text shows four decimals (`$0.0010`), whatever the command, and every
//! JSON output shows the exact decimal (`0.00099`): runs, `runs show` and `runs list`,
//! `--trace`, the HTML pages, a batch's summary, lines and report, OTLP spans, and on
//! PostgreSQL a submitted batch's `batches` and `collect`. An amount that four decimals
//! would show as `$0.0000` shows two significant digits instead.

use std::time::Duration;

use serde_json::Value;

use crate::cluster::{Pg, log_of, spawn_worker, submit, wait_exit};
use crate::mock_server::{Llm, Reply, UsageMode};
use crate::support::{TempDir, run, switchyard};

const STORE: [&str; 2] = ["--store", "sqlite:runs.db"];

/// Three `llm` steps one after the other, each one model call.
fn three_calls(base_url: &str) -> String {
    let step = |id: &str, field: &str, next: &str| {
        format!(
            "  {id}:\n    agent: classifier\n    input: {{$.text: $.text}}\n    output: {{$.{field}: $.category}}\n{next}"
        )
    };
    format!(
        r#"flow: priced
providers:
  local:
    base_url: {base_url}
    prices: {{m1: {{input_per_mtok: 1.1, output_per_mtok: 2.2}}}}
agents:
  classifier:
    kind: llm
    provider: local
    model: m1
    prompt: "Classify: {{{{ input.text }}}}"
    result_schema:
      type: object
      required: [category]
      properties: {{category: {{type: string}}}}
steps:
{}{}{}"#,
        step("first", "a", "    next: second\n"),
        step("second", "b", "    next: third\n"),
        step("third", "c", ""),
    )
}

/// A server whose every answer is valid and reports `input` and `output` tokens.
fn server(input: u64, output: u64) -> Llm {
    let server = Llm::start();
    server.default_reply(Reply::Answer(r#"{"category": "billing"}"#.into()));
    server.usage(UsageMode::Fixed(input, output));
    server
}

/// A JSON number as serde_json writes it: the shortest decimal of the `f64` read.
fn num(v: &Value) -> String {
    assert!(v.is_number(), "not a number: {v}");
    v.to_string()
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("`{l}`: {e}")))
        .collect()
}

/// The id of the one run in the store.
fn the_run(dir: &TempDir) -> String {
    let list = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(STORE));
    let rows = json_lines(&list.stdout);
    assert_eq!(rows.len(), 1, "{}", list.stdout);
    rows[0]["id"].as_str().expect("an id").to_owned()
}

/// One run of three calls: its cost is 0.00099 exactly in every JSON, `$0.0010` in every
/// text, each step's `$0.0003`; the trace, `runs show`, `runs list`, the run's page and its
/// spans agree.
#[test]
fn a_runs_cost_is_exact_in_json_and_four_decimals_in_text() {
    let server = server(100, 100);
    let dir = TempDir::new("money-run");
    let flow = dir.write("f.yaml", three_calls(&server.base_url()));
    let collector = crate::otel::Collector::start();
    let out = run(switchyard(dir.path())
        .arg("run")
        .arg(&flow)
        .args(["--input", r#"{"text": "charged twice"}"#, "--trace"])
        .args(["--otlp-endpoint", &collector.url])
        .args(STORE));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(server.hits().len(), 3);
    // The trace: each step's call, then the run's total.
    assert_eq!(
        out.stderr
            .matches(" · 200 tokens (100 in, 100 out) · $0.0003")
            .count(),
        3,
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(" · 600 tokens (300 in, 300 out) · $0.0010"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("$0.00033") && !out.stderr.contains("$0.00099"),
        "{}",
        out.stderr
    );

    let id = the_run(&dir);
    let show = run(switchyard(dir.path())
        .args(["runs", "show", &id, "--json"])
        .args(STORE));
    assert_eq!(show.code(), 0, "{}", show.stderr);
    let doc: Value = serde_json::from_str(&show.stdout).expect("runs show --json is JSON");
    assert_eq!(num(&doc["run"]["usage"]["cost_usd"]), "0.00099", "{doc:#}");
    let steps = doc["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 3);
    for s in steps {
        assert_eq!(num(&s["usage"]["cost_usd"]), "0.00033", "{s:#}");
    }

    let text = run(switchyard(dir.path()).args(["runs", "show", &id]).args(STORE));
    assert!(
        text.stdout.contains("cost      $0.0010 · tokens 300 in, 300 out"),
        "{}",
        text.stdout
    );

    let list = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(STORE));
    let rows = json_lines(&list.stdout);
    assert_eq!(rows.len(), 1, "{}", list.stdout);
    assert_eq!(num(&rows[0]["cost_usd"]), "0.00099");
    let list = run(switchyard(dir.path()).args(["runs", "list"]).args(STORE));
    assert!(list.stdout.contains(" $0.0010"), "{}", list.stdout);

    let html = run(switchyard(dir.path())
        .args(["runs", "show", &id, "--format", "html"])
        .args(STORE));
    assert_eq!(html.code(), 0, "{}", html.stderr);
    assert!(
        html.stdout.contains("$0.0010") && html.stdout.contains("$0.0003"),
        "the page"
    );
    assert!(
        !html.stdout.contains("$0.00099") && !html.stdout.contains("$0.00033"),
        "the page"
    );

    // The run's span and each step's.
    let spans = collector.spans();
    let cost = |name: &str| -> Vec<String> {
        spans
            .iter()
            .filter(|s| s.name == name)
            .filter_map(|s| crate::otel::attr(s, "switchyard.cost_usd"))
            .collect()
    };
    assert_eq!(cost("run priced"), ["0.00099"], "{spans:?}");
    assert_eq!(cost("step second"), ["0.00033"], "{spans:?}");
}

/// Three items of three calls each: the batch's summary says `$0.0030` (and 0.00297 with
/// `--log-format json`), each line 0.00099, and the report of its output file `$0.0030`.
#[test]
fn a_batchs_cost_is_exact_in_its_lines_summary_and_report() {
    let server = server(100, 100);
    let dir = TempDir::new("money-batch");
    let flow = dir.write("f.yaml", three_calls(&server.base_url()));
    dir.write(
        "in.jsonl",
        "{\"id\": 1, \"text\": \"a\"}\n{\"id\": 2, \"text\": \"b\"}\n{\"id\": 3, \"text\": \"c\"}\n",
    );
    let batch = |json: bool| {
        run(switchyard(dir.path())
            .args(json.then_some(["--log-format", "json"]).into_iter().flatten())
            .arg("batch")
            .arg(&flow)
            .args([
                "--input",
                "in.jsonl",
                "--output",
                "out.jsonl",
                "--concurrency",
                "1",
            ])
            .args(STORE))
    };
    // A budget that is no amount is refused before anything runs.
    let refused = run(switchyard(dir.path())
        .arg("batch")
        .arg(&flow)
        .args([
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
            "--max-cost-usd=NaN",
        ])
        .args(STORE));
    assert_eq!(refused.code(), 2, "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("--max-cost-usd NaN: a budget is a number of USD, 0 or more"),
        "{}",
        refused.stderr
    );
    assert!(server.hits().is_empty());
    let out = batch(false);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(out.stderr.contains("), $0.0030\n"), "{}", out.stderr);
    let lines = json_lines(&std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap());
    assert_eq!(lines.len(), 3);
    for l in &lines {
        assert_eq!(num(&l["cost_usd"]), "0.00099", "{l}");
    }
    // Run again: every item is written from the store, its cost read back from there.
    let again = batch(true);
    assert_eq!(again.code(), 0, "{}", again.stderr);
    let summary = json_lines(&again.stderr)
        .into_iter()
        .find(|l| l["event"] == "batch_summary")
        .unwrap_or_else(|| panic!("no summary: {}", again.stderr));
    assert_eq!(num(&summary["cost_usd"]), "0.00297", "{summary}");
    assert_eq!(server.hits().len(), 9, "the second start ran nothing");

    let report = run(switchyard(dir.path())
        .args(["report", "out.jsonl", "--output", "r.html"])
        .args(STORE));
    assert_eq!(report.code(), 0, "{}", report.stderr);
    let page = std::fs::read_to_string(dir.path().join("r.html")).expect("the page");
    assert!(page.contains("cost $0.0030"), "{page}");
    assert!(page.contains("$0.0010"), "each item's cost: {page}");
}

/// An amount under $0.00005 is not shown as `$0.0000`: 10 tokens at $1.10 per million is
/// `$0.000011`, three of them `$0.000033`.
#[test]
fn a_cost_too_small_for_four_decimals_shows_two_significant_digits() {
    let server = server(10, 0);
    let dir = TempDir::new("money-small");
    let flow = dir.write("f.yaml", three_calls(&server.base_url()));
    let out = run(switchyard(dir.path())
        .arg("run")
        .arg(&flow)
        .args(["--input", r#"{"text": "x"}"#, "--trace"])
        .args(STORE));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(out.stderr.matches(" · $0.000011").count(), 3, "{}", out.stderr);
    assert!(
        out.stderr.contains(" · 30 tokens (30 in, 0 out) · $0.000033\n"),
        "{}",
        out.stderr
    );
    let id = the_run(&dir);
    let doc: Value = serde_json::from_str(
        &run(switchyard(dir.path())
            .args(["runs", "show", &id, "--json"])
            .args(STORE))
        .stdout,
    )
    .expect("JSON");
    assert_eq!(num(&doc["run"]["usage"]["cost_usd"]), "0.000033", "{doc:#}");
}

/// A submitted batch on PostgreSQL: the store adds its runs' costs as whole nano-dollars, so
/// `batches --json` and `collect`'s summary say 0.00297, and their text `$0.0030`.
#[test]
fn a_submitted_batchs_cost_is_summed_exactly_by_the_store() {
    let server = server(100, 100);
    let pg = Pg::new("money");
    let dir = TempDir::new("money-submitted");
    let flow = dir.write("f.yaml", three_calls(&server.base_url()));
    dir.write(
        "in.jsonl",
        "{\"id\": 1, \"text\": \"a\"}\n{\"id\": 2, \"text\": \"b\"}\n{\"id\": 3, \"text\": \"c\"}\n",
    );
    let url = pg.url("sy_money");
    let submitted = submit(&dir, &flow, &url, "m", &[]);
    assert_eq!(submitted.code(), 0, "{}", submitted.stderr);
    let mut w = spawn_worker(&dir, &url, "w", &["--exit-when-idle"]);
    assert!(
        wait_exit(&mut w, Duration::from_secs(60), "the worker").success(),
        "{}",
        log_of(&dir, "w")
    );
    assert_eq!(server.hits().len(), 9);
    let cmd = |args: &[&str]| run(switchyard(dir.path()).args(args).args(["--store", &url]));

    let shown = cmd(&["batches", "m", "--json"]);
    assert_eq!(shown.code(), 0, "{}", shown.stderr);
    let row = &json_lines(&shown.stdout)[0];
    assert_eq!(num(&row["cost_usd"]), "0.00297", "{row}");
    let shown = cmd(&["batches", "m"]);
    assert!(
        shown.stdout.contains("3/3 done") && shown.stdout.contains(" · $0.0030"),
        "{}",
        shown.stdout
    );

    let collected = cmd(&[
        "--log-format",
        "json",
        "collect",
        "--batch",
        "m",
        "--output",
        "out.jsonl",
    ]);
    assert_eq!(collected.code(), 0, "{}", collected.stderr);
    let summary = json_lines(&collected.stderr)
        .into_iter()
        .find(|l| l["event"] == "collect_summary")
        .unwrap_or_else(|| panic!("no summary: {}", collected.stderr));
    assert_eq!(num(&summary["cost_usd"]), "0.00297", "{summary}");
    let collected = cmd(&["collect", "--batch", "m", "--output", "out.jsonl"]);
    assert!(collected.stderr.contains(" · $0.0030"), "{}", collected.stderr);
    for l in json_lines(&std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap()) {
        assert_eq!(num(&l["cost_usd"]), "0.00099", "{l}");
    }
}

/// A child flow's budget that begins after its parent spent $0.1 ends at $0.3 exactly: with
/// $0.1 calls its third call is refused, not let through because `0.1 + 0.2` is a hair more
/// than `0.3` in floats.
#[test]
fn a_budget_that_begins_late_is_not_overrun_by_float_drift() {
    let server = server(1000, 0);
    let dir = TempDir::new("money-budget");
    // $100 per million tokens in: 1,000 tokens are $0.1.
    let priced = |text: String| {
        text.replace(
            "input_per_mtok: 1.1, output_per_mtok: 2.2",
            "input_per_mtok: 100, output_per_mtok: 100",
        )
    };
    dir.write(
        "child.yaml",
        priced(three_calls(&server.base_url()))
            .replace("flow: priced\n", "flow: child\nlimits: {max_cost_usd: 0.2}\n"),
    );
    let parent = priced(three_calls(&server.base_url()))
        .replace("flow: priced\n", "flow: parent\n")
        .replace("agents:\n", "agents:\n  child: {kind: flow, path: child.yaml}\n")
        .replace(
            "  second:\n    agent: classifier\n",
            "  second:\n    agent: child\n",
        )
        .replace("    output: {$.b: $.category}\n    next: third\n", "")
        .split("  third:")
        .next()
        .expect("the steps before `third`")
        .to_owned();
    let parent = dir.write("parent.yaml", parent);
    let out = run(switchyard(dir.path())
        .arg("run")
        .arg(&parent)
        .args(["--input", r#"{"text": "x"}"#])
        .args(STORE));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("cost limit reached: $0.2000 spent (limits.max_cost_usd 0.2)"),
        "{}",
        out.stderr
    );
    assert_eq!(server.hits().len(), 3, "the parent's call and two of the child's");
}

/// A run killed before it ended has no cost of its own yet: `runs show` tells what its
/// finished steps spent, and says so, not `$0.0000`.
#[test]
fn a_killed_run_shows_what_its_finished_steps_spent() {
    let server = server(100, 100);
    let dir = TempDir::new("money-killed");
    // The last step, `third`, goes on to a step that sleeps.
    let flow = three_calls(&server.base_url()) + "    next: wait\n  wait:\n    agent: sleeper\n";
    let flow = flow.replace(
        "agents:\n",
        "agents:\n  sleeper:\n    kind: command\n    run: [sleep, \"30\"]\n",
    );
    dir.write("flow.yaml", flow);
    let mut child = switchyard(dir.path())
        .args(["run", "flow.yaml", "--input", r#"{"text": "refund"}"#])
        .args(STORE)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn run");
    // Wait until the three model calls are recorded, then kill the run in its `sleep`.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the model steps never finished"
        );
        if dir.path().join("runs.db").exists() {
            let list = run(switchyard(dir.path())
                .args(["runs", "list", "--json"])
                .args(STORE));
            if let Some(row) = json_lines(&list.stdout).first() {
                let id = row["id"].as_str().unwrap().to_owned();
                let show = run(switchyard(dir.path())
                    .args(["runs", "show", &id, "--json"])
                    .args(STORE));
                let doc: Value = serde_json::from_str(&show.stdout).unwrap_or(Value::Null);
                if doc["steps"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|s| s["step"] == "third"))
                {
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");

    let id = the_run(&dir);
    let show = run(switchyard(dir.path()).args(["runs", "show", &id]).args(STORE));
    assert_eq!(show.code(), 0, "{show:?}");
    let cost = show
        .stdout
        .lines()
        .find(|l| l.starts_with("cost"))
        .expect("a cost line");
    assert!(
        cost.contains("$0.0010") && cost.contains("tokens 300 in, 300 out") && cost.contains("so far"),
        "{cost}"
    );
}
