//! Cost budgets bound what is spent (SPEC §6.1), through the real `switchyard` binary against
//! the local OpenAI-compatible server: a model that reports no `usage` stops a run with a
//! budget before its second call (unless the provider sets `assume_tokens_per_call`), and
//! `runs show` says how many calls' cost is unknown; a batch's `--max-cost-usd` is checked
//! before every model turn of its items in flight, so it overshoots by at most the calls in
//! flight when it was reached.

use serde_json::Value;

use crate::mock_server::{Llm, Reply, UsageMode};
use crate::support::{TempDir, run, switchyard};

const STORE: [&str; 2] = ["--store", "sqlite:runs.db"];

/// A flow whose step `work` is the agent loop `looper` (up to 10 turns) with one tool,
/// `note` (a mock). `provider_extra` is more YAML under the provider (indented 4 spaces).
fn loop_flow(base_url: &str, provider_extra: &str, limits: &str) -> String {
    format!(
        r#"flow: spender
{limits}
providers:
  local:
    base_url: {base_url}
    prices: {{m1: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}}}
{provider_extra}
agents:
  looper:
    kind: llm
    provider: local
    model: m1
    prompt: "Work on {{{{ input.id }}}}"
    tools: [note]
    max_iterations: 10
  note:
    kind: mock
    description: Takes a note.
    returns: {{noted: true}}
steps:
  work:
    agent: looper
    input: {{$.id: $.id}}
    output: {{$.reply: $}}
"#
    )
}

/// A model that calls `note` on every turn, forever.
fn always_calls(server: &Llm) {
    server.respond_with(|_| Reply::calls(1, &[("note", r#"{"n": 1}"#)]));
}

/// The id of the one root run in the store.
fn the_run(dir: &TempDir) -> String {
    let out = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(STORE));
    let ids: Vec<String> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .filter(|r| r["parent_run"].is_null())
        .map(|r| r["id"].as_str().expect("an id").to_owned())
        .collect();
    assert_eq!(ids.len(), 1, "{}", out.stdout);
    ids[0].clone()
}

/// `runs show RUN_ID --json`, parsed.
fn show_json(dir: &TempDir, id: &str) -> Value {
    let out = run(switchyard(dir.path())
        .args(["runs", "show", id, "--json"])
        .args(STORE));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    serde_json::from_str(&out.stdout).expect("runs show --json is JSON")
}

/// Without `usage` in the response, the loop's first call's cost is unknown: with
/// `limits.max_cost_usd` the run fails with kind `limit` before its second call (the
/// server saw one request, not ten), saying why; `runs show` says the cost of one call is
/// unknown, as text and as `cost_unknown_calls` in JSON, on the run and the step.
#[test]
fn a_budget_stops_a_loop_whose_model_reports_no_usage() {
    let server = Llm::start();
    server.usage(UsageMode::Omitted);
    always_calls(&server);
    let dir = TempDir::new("budget-no-usage");
    let flow = dir.write(
        "f.yaml",
        loop_flow(&server.base_url(), "", "limits: {max_cost_usd: 0.001}"),
    );
    let collector = crate::otel::Collector::start();
    let out = run(switchyard(dir.path())
        .arg("run")
        .arg(&flow)
        .args(["--input", r#"{"id": "a"}"#, "--otlp-endpoint", &collector.url])
        .args(STORE));
    assert_eq!(out.code(), 1, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(
        server.hits().len(),
        1,
        "the model was asked again: {}",
        out.stderr
    );
    // The run's span, its step's and its model turn's carry the count.
    let unknown: Vec<String> = collector
        .spans()
        .iter()
        .filter(|s| crate::otel::attr(s, "switchyard.cost_unknown_calls").as_deref() == Some("1"))
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(unknown.len(), 3, "{unknown:?}");
    assert!(
        unknown.iter().any(|n| n == "run spender") && unknown.iter().any(|n| n == "step work"),
        "{unknown:?}"
    );
    assert!(
        out.stderr
            .contains("cost limit cannot be checked (limits.max_cost_usd 0.001)")
            && out.stderr.contains("no usage for 1 model call")
            && out.stderr.contains("assume_tokens_per_call"),
        "{}",
        out.stderr
    );
    let id = the_run(&dir);
    let doc = show_json(&dir, &id);
    assert_eq!(doc["run"]["error"]["kind"], "limit", "{doc:#}");
    assert_eq!(doc["run"]["usage"]["cost_unknown_calls"], 1, "{doc:#}");
    let work = doc["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["number"] == "1")
        .expect("the step's record");
    assert_eq!(work["usage"]["cost_unknown_calls"], 1, "{work:#}");
    let text = run(switchyard(dir.path()).args(["runs", "show", &id]).args(STORE));
    assert!(
        text.stdout
            .contains("cost      $0.0000 (cost unknown for 1 call)"),
        "{}",
        text.stdout
    );
    let list = run(switchyard(dir.path()).args(["runs", "list"]).args(STORE));
    assert!(
        list.stdout
            .contains("$0.0000  (cost unknown for 1 call)  [limit]"),
        "{}",
        list.stdout
    );
    // The tree under it: the run and the loop's step, each with its count.
    let tree: Vec<&str> = text
        .stdout
        .lines()
        .filter(|l| l.contains("cost unknown for 1 call"))
        .collect();
    assert!(
        tree.iter()
            .any(|l| l.starts_with(&format!("run {id} · spender · failed")))
            && tree.iter().any(|l| l.contains("1 work [agent]")),
        "{}",
        text.stdout
    );
}

/// A child run inherits its parent's budget (SPEC §8.2): the child's model reports no
/// usage, so the child fails with kind `limit` before its second call, and the parent with
/// it; the unknown count rolls up from the child's step to the parent run.
#[test]
fn a_child_run_stops_under_its_parents_budget_at_an_unknown_cost() {
    let server = Llm::start();
    server.usage(UsageMode::Omitted);
    server.default_reply(Reply::Answer("fine".into()));
    let dir = TempDir::new("budget-child");
    dir.write(
        "child.yaml",
        format!(
            r#"flow: child
providers:
  local: {{base_url: "{}"}}
agents:
  ask: {{kind: llm, provider: local, model: m1, prompt: "Say something"}}
steps:
  first: {{agent: ask, output: {{$.a: $}}, next: second}}
  second: {{agent: ask, output: {{$.b: $}}}}
"#,
            server.base_url()
        ),
    );
    let parent = dir.write(
        "parent.yaml",
        "flow: parent\nlimits: {max_cost_usd: 0.5}\nagents:\n  child: {kind: flow, path: child.yaml}\n\
         steps:\n  delegate: {agent: child, output: {$.r: $}}\n",
    );
    let out = run(switchyard(dir.path()).arg("run").arg(&parent).args(STORE));
    assert_eq!(out.code(), 1, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(server.hits().len(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("error[limit]")
            && out
                .stderr
                .contains("cost limit cannot be checked (limits.max_cost_usd 0.5)"),
        "{}",
        out.stderr
    );
    let doc = show_json(&dir, &the_run(&dir));
    assert_eq!(doc["run"]["usage"]["cost_unknown_calls"], 1, "{doc:#}");
    assert_eq!(doc["children"][0]["usage"]["cost_unknown_calls"], 1, "{doc:#}");
}

/// With `assume_tokens_per_call`, a response without `usage` counts as that many tokens at
/// the model's dearer price: the loop goes on to its answer, its cost known and counted.
#[test]
fn assume_tokens_per_call_prices_calls_without_usage() {
    let server = Llm::start();
    server.usage(UsageMode::Omitted);
    server.script([
        Reply::calls(1, &[("note", "{}")]),
        Reply::calls(2, &[("note", "{}")]),
        Reply::Answer("done".into()),
    ]);
    let dir = TempDir::new("budget-assumed");
    let flow = dir.write(
        "f.yaml",
        loop_flow(
            &server.base_url(),
            "    assume_tokens_per_call: 100",
            "limits: {max_cost_usd: 0.001}",
        ),
    );
    let out = run(switchyard(dir.path())
        .arg("run")
        .arg(&flow)
        .args(["--input", r#"{"id": "a"}"#])
        .args(STORE));
    assert_eq!(out.code(), 0, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(server.hits().len(), 3);
    let id = the_run(&dir);
    let doc = show_json(&dir, &id);
    let usage = &doc["run"]["usage"];
    // 3 calls × 100 tokens × $2 per million (the dearer of the two prices).
    assert!(
        (usage["cost_usd"].as_f64().unwrap() - 0.0006).abs() < 1e-12,
        "{usage:#}"
    );
    assert_eq!(usage["output_tokens"], 300, "{usage:#}");
    assert!(usage.get("cost_unknown_calls").is_none(), "{usage:#}");
}

/// `assume_tokens_per_call` is a provider field lint knows, and it must be positive.
#[test]
fn assume_tokens_per_call_is_checked_by_lint() {
    let dir = TempDir::new("budget-lint");
    dir.write(
        "ok.yaml",
        loop_flow("http://127.0.0.1:9/v1", "    assume_tokens_per_call: 500", ""),
    );
    let ok = crate::support::lint_json(dir.path(), &["ok.yaml"]);
    assert_eq!(ok.code(), 0, "{}", ok.stdout);
    dir.write(
        "zero.yaml",
        loop_flow("http://127.0.0.1:9/v1", "    assume_tokens_per_call: 0", ""),
    );
    let zero = crate::support::lint_json(dir.path(), &["zero.yaml"]);
    assert_eq!(zero.code(), 1, "{}", zero.stdout);
    let d = zero.diagnostics();
    assert!(
        d.iter()
            .any(|d| d.message.contains("`assume_tokens_per_call` is 0")),
        "{d:#?}"
    );
}

/// The items of `dir`'s `out.jsonl`, parsed.
fn output_lines(dir: &TempDir) -> Vec<Value> {
    std::fs::read_to_string(dir.path().join("out.jsonl"))
        .expect("the output file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// `batch --max-cost-usd 0.005 --concurrency 4` of loops that would each spend $0.01 (ten
/// turns of $0.001): every turn checks the batch's budget first, so the batch spends at most
/// the cap plus the calls in flight when it was reached (4 × $0.001), by the engine's count
/// and by the server's. The items that could not call again fail with kind `limit`; the
/// items not started stay unfinished, as before.
#[test]
fn a_batch_cap_bounds_the_spend_of_its_items_in_flight() {
    const PER_CALL: f64 = 0.001;
    const CAP: f64 = 0.005;
    const CONCURRENCY: u64 = 4;
    let server = Llm::start();
    // 1000 prompt tokens at $1 per million: $0.001 a turn, whatever the turn says.
    server.usage(UsageMode::Fixed(1000, 0));
    server.latency(std::time::Duration::from_millis(20));
    always_calls(&server);
    let dir = TempDir::new("budget-batch");
    let flow = dir.write(
        "f.yaml",
        loop_flow(&server.base_url(), "", "").replace("output_per_mtok: 2.0", "output_per_mtok: 1.0"),
    );
    let input: String = (0..8).map(|i| format!("{{\"id\": \"item-{i}\"}}\n")).collect();
    dir.write("in.jsonl", input);
    let out = run(switchyard(dir.path())
        .arg("batch")
        .arg(&flow)
        .args(["--input", "in.jsonl", "--output", "out.jsonl"])
        .args([
            "--concurrency",
            &CONCURRENCY.to_string(),
            "--max-cost-usd",
            &CAP.to_string(),
        ])
        .args(STORE));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    let bound = CAP + CONCURRENCY as f64 * PER_CALL + 1e-12;
    let asked = server.hits().len() as f64 * PER_CALL;
    assert!(
        asked <= bound,
        "the server was asked {asked} USD worth: {}",
        out.stderr
    );
    let lines = output_lines(&dir);
    let recorded: f64 = lines.iter().map(|l| l["cost_usd"].as_f64().unwrap()).sum();
    assert!(
        (recorded - asked).abs() < 1e-9,
        "recorded {recorded}, asked {asked}"
    );
    assert!(!lines.is_empty(), "{}", out.stderr);
    for l in &lines {
        assert_eq!(l["status"], "failed", "{l}");
        assert_eq!(l["error"]["kind"], "limit", "{l}");
        assert!(
            l["error"]["message"]
                .as_str()
                .unwrap()
                .contains("cost limit reached: the batch has spent"),
            "{l}"
        );
    }
    assert!(
        out.stderr.contains("stopped early: the cost limit was reached"),
        "{}",
        out.stderr
    );
}

/// A batch whose model reports no usage: each item's call is of unknown cost, so with
/// `--max-cost-usd` the batch stops before a second call of any item, and the output lines,
/// the summary and `runs list --json` say how many calls' cost is unknown.
#[test]
fn a_batch_without_usage_says_its_cost_is_unknown() {
    let server = Llm::start();
    server.usage(UsageMode::Omitted);
    server.script([Reply::Answer("done".into())]);
    let dir = TempDir::new("budget-batch-unknown");
    let flow = dir.write("f.yaml", loop_flow(&server.base_url(), "", ""));
    dir.write("in.jsonl", "{\"id\": \"a\"}\n{\"id\": \"b\"}\n");
    let out = run(switchyard(dir.path())
        .arg("batch")
        .arg(&flow)
        .args(["--input", "in.jsonl", "--output", "out.jsonl"])
        .args(["--concurrency", "1", "--max-cost-usd", "1"])
        .args(STORE));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    // The first item's one call answered; the second item starts no call.
    assert_eq!(server.hits().len(), 1, "{}", out.stderr);
    let lines = output_lines(&dir);
    assert_eq!(lines[0]["status"], "succeeded", "{lines:?}");
    assert_eq!(lines[0]["cost_unknown_calls"], 1, "{lines:?}");
    assert!(
        out.stderr.contains("$0.0000 (cost unknown for 1 call)")
            && out.stderr.contains(
                "stopped early: cost limit cannot be checked (--max-cost-usd 1): the provider reported no usage for 1 model call"
            )
            && out.stderr.contains("to continue, set `assume_tokens_per_call`"),
        "{}",
        out.stderr
    );
    let list = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(STORE));
    let listed: Value = serde_json::from_str(list.stdout.lines().next().expect("a run")).unwrap();
    assert_eq!(listed["cost_unknown_calls"], 1, "{listed}");
    // The batch's page and its run's page say so too.
    let report = run(switchyard(dir.path())
        .args(["report", "out.jsonl", "-o", "report.html"])
        .args(STORE));
    assert_eq!(report.code(), 0, "{}", report.stderr);
    let page = std::fs::read_to_string(dir.path().join("report.html")).expect("the page");
    assert!(page.contains("cost $0.0000 (cost unknown for 1 call)"), "{page}");
    let id = listed["id"].as_str().unwrap();
    let html = run(switchyard(dir.path())
        .args(["runs", "show", id, "--format", "html"])
        .args(STORE));
    assert!(
        html.stdout.contains("$0.0000 (cost unknown for 1 call)"),
        "{}",
        html.stdout
    );
}

/// `submit --max-cost-usd 0.005` stores the batch's budget; two workers (two places each)
/// run its loops, each turn $0.001, and check the batch's spend, theirs and the other's,
/// before every call: together they spend at most the cap plus the calls in flight when it
/// was reached (4 × $0.001), by the store's count and by the server's, and both share their
/// spend through the store.
#[test]
fn workers_hold_a_submitted_batchs_cap_together() {
    use crate::cluster::{Pg, log_of, spawn_worker, submit, wait_exit};
    use std::time::Duration;
    const PER_CALL: f64 = 0.001;
    const CAP: f64 = 0.005;
    let pg = Pg::new("budget");
    let url = pg.url("sy_budget");
    let server = Llm::start();
    server.usage(UsageMode::Fixed(1000, 0));
    server.latency(Duration::from_millis(100));
    always_calls(&server);
    let dir = TempDir::new("budget-workers");
    let flow = dir.write(
        "f.yaml",
        loop_flow(&server.base_url(), "", "").replace("output_per_mtok: 2.0", "output_per_mtok: 1.0"),
    );
    let input: String = (0..12).map(|i| format!("{{\"id\": \"item-{i}\"}}\n")).collect();
    dir.write("in.jsonl", input);
    let out = submit(&dir, &flow, &url, "capped", &["--max-cost-usd", &CAP.to_string()]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    // Both claim at once when they start; a turn takes 100 ms, so the cap is reached well
    // after both hold runs.
    let args = ["--concurrency", "2", "--exit-when-idle"];
    let mut a = spawn_worker(&dir, &url, "a", &args);
    let mut b = spawn_worker(&dir, &url, "b", &args);
    let sa = wait_exit(&mut a, Duration::from_secs(60), "worker a");
    let sb = wait_exit(&mut b, Duration::from_secs(60), "worker b");
    assert!(sa.success(), "{}", log_of(&dir, "a"));
    assert!(sb.success(), "{}", log_of(&dir, "b"));

    let bound = CAP + 4.0 * PER_CALL + 1e-12;
    let asked = server.hits().len() as f64 * PER_CALL;
    assert!(asked <= bound, "the server was asked {asked} USD worth");
    assert_eq!(
        pg.count("SELECT COUNT(DISTINCT lease_owner) FROM run_records WHERE batch = 'capped'"),
        2,
        "both workers ran the batch"
    );
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM batch_spend WHERE batch = 'capped'"),
        2
    );
    let collected = run(switchyard(dir.path()).args([
        "collect",
        "--batch",
        "capped",
        "--output",
        "out.jsonl",
        "--store",
        &url,
    ]));
    assert_eq!(collected.code(), 1, "{}", collected.stderr);
    let lines = output_lines(&dir);
    assert_eq!(lines.len(), 12);
    let recorded: f64 = lines.iter().map(|l| l["cost_usd"].as_f64().unwrap()).sum();
    assert!(
        (recorded - asked).abs() < 1e-9,
        "recorded {recorded}, asked {asked}"
    );
    for l in &lines {
        assert_eq!(l["error"]["kind"], "limit", "{l}");
        assert!(
            l["error"]["message"]
                .as_str()
                .unwrap()
                .contains("(submit --max-cost-usd 0.005)"),
            "{l}"
        );
    }
    let batches = run(switchyard(dir.path()).args(["batches", "capped", "--store", &url]));
    assert!(
        batches.stdout.contains("of --max-cost-usd 0.005"),
        "{}",
        batches.stdout
    );
}
