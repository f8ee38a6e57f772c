//! What `llm` agents cost, against the local mock server: the cost in `--trace`, budgets
//! (`limits.max_cost_usd`, `--max-cost-usd`) that stop new calls, a batch's cost per item and
//! in total, a batch of 2,000 items held to its provider's rate limit, and an abandoned
//! request that makes the cost a lower bound.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard::__private::runtime::engine::{Engine, RunOptions};
use switchyard::__private::store::memory::MemoryStore;

use crate::llm::{flow_text, memory_engine, plan_of, run, run_ids, write_flow};
use crate::mock_server::{Llm, Reply, classification};
use crate::support::{self, TempDir};

/// `--trace` prints a cheap step's cost and the run's with two significant digits, as
/// `runs list` and `runs show` do, not rounded to the micro-dollar.
#[test]
fn the_trace_shows_a_cheap_steps_cost_to_two_significant_digits() {
    let server = Llm::start();
    server.default_reply(Reply::Answer(classification("billing", 0.9)));
    let dir = TempDir::new("llm-trace-cost");
    let text = flow_text(&server.base_url(), "", "", "").replace(
        "{input_per_mtok: 1.0, output_per_mtok: 2.0}",
        "{input_per_mtok: 0.01, output_per_mtok: 0.01}",
    );
    write_flow(&dir, "f.yaml", &text);
    let out = support::run(support::switchyard(dir.path()).args([
        "run",
        "f.yaml",
        "--trace",
        "--store",
        "sqlite:runs.db",
        "--input",
        "{\"text\": \"x\"}",
    ]));
    assert_eq!(out.code(), 0, "{out:?}");
    let tokens = server.hits()[0].tokens;
    let cost = tokens as f64 * 0.01 / 1e6;
    assert!(cost < 5e-6, "cheap enough to need more than 6 decimals: {cost}");
    // The step's line and the run's both end with the cost.
    let shown: Vec<f64> = out
        .stderr
        .lines()
        .filter(|l| l.contains(" tokens "))
        .filter_map(|l| l.rsplit_once("· $").map(|(_, c)| c.trim().parse::<f64>()))
        .map(|c| c.expect("a number of dollars"))
        .collect();
    assert_eq!(shown.len(), 2, "{}", out.stderr);
    for c in shown {
        assert!(
            ((c - cost) / cost).abs() < 0.05,
            "shown ${c}, cost ${cost}: {}",
            out.stderr
        );
    }
}

/// `limits.max_cost_usd` and `--max-cost-usd`: once a run tree has spent its budget, no new
/// agent call starts; the step fails with kind `limit` and says so.
#[tokio::test]
async fn a_spent_budget_stops_new_calls() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::Answer(classification("billing", 0.9)));
    let dir = TempDir::new("llm-budget");
    let second =
        "    next: again\n  again:\n    agent: classifier\n    message: Again.\n    input: {$.text: $.text}";
    // One call costs about $0.00008 at these prices (about 60 tokens in, 10 out).
    let text = flow_text(&server.base_url(), "", "", second)
        .replace("steps:\n", "limits: {max_cost_usd: 0.00005}\nsteps:\n");
    let path = write_flow(&dir, "f.yaml", &text);
    let engine = memory_engine();
    let out = run(&engine, &plan_of(&path), json!({"text": "hi"})).await;
    let e = out.error.unwrap();
    assert_eq!(e.kind.as_str(), "limit");
    assert!(
        e.message
            .starts_with("step `again`: cost limit reached: $0.0001 spent"),
        "{}",
        e.message
    );
    assert!(
        e.message.ends_with(" spent (limits.max_cost_usd 0.00005)"),
        "{}",
        e.message
    );
    assert_eq!(out.path, ["classify", "again"]);
    assert_eq!(server.hits().len(), 1);

    // A parent's budget covers its child runs.
    write_flow(&dir, "child.yaml", &flow_text(&server.base_url(), "", "", ""));
    let parent = write_flow(
        &dir,
        "parent.yaml",
        "flow: parent\nlimits: {max_cost_usd: 0.00005}\nagents:\n  child:\n    kind: flow\n    path: child.yaml\n\
         steps:\n  first:\n    agent: child\n    next: second\n  second:\n    agent: child\n",
    );
    let out = run(&engine, &plan_of(&parent), json!({"text": "hi"})).await;
    assert_eq!(out.error.unwrap().kind.as_str(), "limit");
    assert_eq!(server.hits().len(), 2);
}

#[test]
fn max_cost_usd_on_the_command_line() {
    let server = Llm::start();
    server.default_reply(Reply::Answer(classification("billing", 0.9)));
    let dir = TempDir::new("llm-budget-cli");
    let second =
        "    next: again\n  again:\n    agent: classifier\n    message: Again.\n    input: {$.text: $.text}";
    write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", second));
    let run = |budget: &str| {
        support::run(support::switchyard(dir.path()).args([
            "run",
            "f.yaml",
            "--input",
            "{\"text\": \"x\"}",
            "--max-cost-usd",
            budget,
        ]))
    };
    let out = run("0.00005");
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(
        out.stderr
            .contains("error[limit]: step `again`: cost limit reached: $0.0001 spent"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("spent (--max-cost-usd 0.00005)"),
        "{}",
        out.stderr
    );
    assert_eq!(server.hits().len(), 1);
    assert_eq!(run("1").code(), 0);
    assert_eq!(server.hits().len(), 3);
    // A budget of 0 allows calls until one costs something.
    assert_eq!(run("0").code(), 1);
    assert_eq!(server.hits().len(), 4);
    assert_eq!(run("-1").code(), 2);
}

/// `batch` over an `llm` flow: every output line carries its item's cost, the batch adds them
/// up, and `--max-cost-usd` stops starting items once the batch has spent it.
#[test]
fn a_batch_records_each_items_cost_and_stops_at_its_budget() {
    let server = Llm::start();
    server.default_reply(Reply::Answer(classification("billing", 0.9)));
    let dir = TempDir::new("llm-batch");
    write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
    let input: String = (0..10)
        .map(|i| {
            format!(
                "{}\n",
                json!({"id": format!("t{i}"), "text": format!("ticket {i}")})
            )
        })
        .collect();
    dir.write("in.jsonl", input);
    let batch = |out: &str, extra: &[&str]| {
        support::run(
            support::switchyard(dir.path())
                .args([
                    "batch",
                    "f.yaml",
                    "--input",
                    "in.jsonl",
                    "--output",
                    out,
                    "--concurrency",
                    "1",
                    "--store",
                    "sqlite:runs.db",
                ])
                .args(extra),
        )
    };
    let out = batch("all.jsonl", &[]);
    assert_eq!(out.code(), 0, "{out:?}");
    let lines: Vec<Value> = std::fs::read_to_string(dir.path().join("all.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 10);
    let per_item: Vec<f64> = lines.iter().map(|l| l["cost_usd"].as_f64().unwrap()).collect();
    assert!(
        per_item.iter().all(|c| *c > 0.00005 && *c < 0.0002),
        "{per_item:?}"
    );
    assert_eq!(server.hits().len(), 10);

    // One item at a time: items start until what the finished ones cost reaches the budget.
    let mut spent = 0.0;
    let started = per_item
        .iter()
        .take_while(|c| {
            let before = spent;
            spent += **c;
            before < 0.0002
        })
        .count();
    assert!((2..10).contains(&started), "{per_item:?}");
    let out = batch("capped.jsonl", &["--max-cost-usd", "0.0002"]);
    assert!(out.stderr.contains("the cost limit was reached"), "{out:?}");
    assert_eq!(server.hits().len(), 10 + started);
    let lines = |out: &str| {
        std::fs::read_to_string(dir.path().join(out))
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!(lines("capped.jsonl"), started);

    // The budget is the batch's, earlier starts included: the same command again starts
    // nothing, writes what was done, and counts what that cost.
    let again = batch("capped.jsonl", &["--max-cost-usd", "0.0002"]);
    assert_eq!(again.code(), 1, "{again:?}");
    assert!(again.stderr.contains("the cost limit was reached"), "{again:?}");
    assert!(
        again
            .stderr
            .contains(&format!("({started} from an earlier start)")),
        "{again:?}"
    );
    assert!(!again.stderr.contains("$0.0000\n"), "{again:?}");
    assert_eq!(server.hits().len(), 10 + started);
    assert_eq!(lines("capped.jsonl"), started);
    // What continues it is a higher budget, and the summary says so.
    assert!(
        again
            .stderr
            .contains("with a higher --max-cost-usd (more than 0.0002"),
        "{again:?}"
    );
    assert!(!again.stderr.contains("run the same command again"), "{again:?}");
    let more = batch("capped.jsonl", &["--max-cost-usd", "1"]);
    assert_eq!(more.code(), 0, "{more:?}");
    assert_eq!(lines("capped.jsonl"), 10);
    assert_eq!(server.hits().len(), 20);

    // Items in flight when the budget runs out still finish and add their cost: the
    // summary's total and the reason it stopped name one figure, the batch's.
    let wide = support::run(
        support::switchyard(dir.path())
            .args(["batch", "f.yaml", "--input", "in.jsonl", "--output", "wide.jsonl"])
            .args([
                "--concurrency",
                "4",
                "--max-cost-usd",
                "0.0001",
                "--store",
                "sqlite:runs.db",
            ]),
    );
    assert_eq!(wide.code(), 1, "{wide:?}");
    let figures: std::collections::BTreeSet<&str> = wide
        .stderr
        .split('$')
        .skip(1)
        .map(|rest| {
            rest.split(|c: char| !(c.is_ascii_digit() || c == '.'))
                .next()
                .unwrap()
        })
        .collect();
    assert_eq!(figures.len(), 1, "{}", wide.stderr);
    assert!(
        wide.stderr.contains("the cost limit was reached"),
        "{}",
        wide.stderr
    );
    // A batch that is all done starts nothing, so no budget stops it.
    let hits = server.hits().len();
    let done = batch("all.jsonl", &["--max-cost-usd", "0.00001"]);
    assert_eq!(done.code(), 0, "{done:?}");
    assert!(!done.stderr.contains("stopped early"), "{done:?}");
    // Nothing ran in this start: no rate to tell.
    assert!(!done.stderr.contains("items/s"), "{done:?}");
    assert_eq!(server.hits().len(), hits);
    assert_eq!(lines("all.jsonl"), 10);
}

/// The batch of issue's proof: 2,000 items at 500 in flight against a server answering in
/// 50 ms, with the provider limited to 600 requests a minute. The batch (the library's
/// `batch::run`, in paused time) takes what the limit dictates, the server never sees more
/// than 600 requests in any minute, and no item fails.
#[tokio::test(start_paused = true)]
async fn a_batch_of_two_thousand_items_takes_the_time_its_rate_limit_dictates() {
    use switchyard::__private::batch::{self, BatchOptions, Progress};
    use switchyard::__private::runtime::engine::RunControls;
    const N: usize = 2000;
    let server = Llm::spawn().await;
    server
        .default_reply(Reply::Answer(classification("billing", 0.9)))
        .latency(Duration::from_millis(50));
    let dir = TempDir::new("llm-batch-rate");
    let path = write_flow(
        &dir,
        "f.yaml",
        &flow_text(
            &server.base_url(),
            "    max_concurrency: 500\n    rate_limit: {requests_per_minute: 600}",
            "",
            "    timeout: 10s",
        ),
    );
    let input: String = (0..N)
        .map(|i| {
            format!(
                "{}\n",
                json!({"id": format!("t{i}"), "text": format!("ticket {i}")})
            )
        })
        .collect();
    dir.write("in.jsonl", input);
    let mut options = switchyard::__private::on_fresh_store(BatchOptions::new(
        dir.path().join("in.jsonl"),
        dir.path().join("out.jsonl"),
    ));
    options.concurrency = 500;
    let t0 = tokio::time::Instant::now();
    let summary = batch::run(
        Engine::new(Arc::new(MemoryStore::forgetting_ended())),
        plan_of(&path),
        options,
        RunOptions::default(),
        json!({}),
        Arc::new(Progress::default()),
        RunControls::default(),
    )
    .await
    .expect("the batch runs");
    let took = t0.elapsed().as_secs_f64();
    assert_eq!((summary.succeeded, summary.failed), (N as u64, 0), "{summary:?}");
    assert_eq!(server.hits().len(), N);
    let max = server.max_requests_in(Duration::from_secs(60));
    assert!(max <= 600, "{max} requests in a minute");
    // 1,999 intervals at 600 a minute, plus the last answer: about 200 s.
    let expect = (N - 1) as f64 * 60.0 / 600.0;
    assert!(
        (took - expect).abs() / expect < 0.10,
        "took {took:.1}s, expected about {expect:.1}s (±10%)"
    );
    let lines: Vec<Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), N);
    assert!(
        lines
            .iter()
            .enumerate()
            .all(|(i, l)| l["id"] == format!("t{i}") && l["status"] == "succeeded")
    );
    assert!(lines.iter().all(|l| l["cost_usd"].as_f64().unwrap() > 0.0));
}

/// A request past the step's timeout is abandoned, but the server finishes it (and would
/// bill it): the attempt is recorded as timed out with its tokens unknown, and `runs show`
/// and the batch summary say the cost is a lower bound. `runs list` prints the cost with
/// its significant digits.
#[test]
fn an_abandoned_request_makes_the_cost_a_lower_bound() {
    let server = Llm::start();
    server.default_reply(Reply::Slow(
        Duration::from_millis(1500),
        classification("billing", 0.9),
    ));
    let dir = TempDir::new("llm-abandoned");
    write_flow(
        &dir,
        "f.yaml",
        &flow_text(&server.base_url(), "", "", "    timeout: 300ms"),
    );
    let store = ["--store", "sqlite:runs.db"];
    let out = support::run(
        support::switchyard(dir.path())
            .args(["run", "f.yaml", "--input", r#"{"text": "hi"}"#])
            .args(store),
    );
    assert_eq!(out.code(), 1, "{out:?}");
    // The server finished the request the run gave up on, and counted its tokens.
    let t0 = std::time::Instant::now();
    while server.hits().is_empty() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let hits = server.hits();
    assert_eq!((hits.len(), hits[0].status), (1, 200));
    assert!(hits[0].tokens > 0);
    let id = run_ids(&dir, &store).remove(0);
    let json = support::run(
        support::switchyard(dir.path())
            .args(["runs", "show", &id, "--json"])
            .args(store),
    );
    let doc: Value = serde_json::from_str(&json.stdout).expect("JSON");
    let step = &doc["steps"][0];
    assert_eq!(step["error"]["kind"], "timeout", "{step}");
    assert_eq!(step["error"]["details"]["tokens_unknown"], true, "{step}");
    assert_eq!(step["answers"]["abandoned_requests"], 1, "{step}");
    assert_eq!(step["answers"]["structured_output"], "json_schema", "{step}");
    assert_eq!(step["usage"]["input_tokens"], 0, "{step}");
    let shown = support::run(
        support::switchyard(dir.path())
            .args(["runs", "show", &id])
            .args(store),
    );
    assert!(
        shown.stdout.contains(
            "cost      $0.0000 · tokens 0 in, 0 out · a lower bound: 1 request(s) abandoned (timed out or cancelled), their tokens unknown"
        ) && shown.stdout.contains("1 request(s) abandoned (timed out or cancelled)"),
        "{}",
        shown.stdout
    );

    // A batch: one item answered in time, one abandoned.
    server.script([Reply::Answer(classification("billing", 0.9))]);
    dir.write(
        "in.jsonl",
        "{\"id\": 1, \"text\": \"a\"}\n{\"id\": 2, \"text\": \"b\"}\n",
    );
    let out = support::run(
        support::switchyard(dir.path())
            .args([
                "batch",
                "f.yaml",
                "--input",
                "in.jsonl",
                "--output",
                "out.jsonl",
                "--concurrency",
                "1",
            ])
            .args(store),
    );
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(
        out.stderr.contains(", at least $0.0001\n")
            && out
                .stderr
                .contains("cost is a lower bound: 1 LLM request(s) were abandoned (timed out or cancelled)"),
        "{}",
        out.stderr
    );

    // `runs list`: the answered item's cost, exact in JSON.
    let list = support::run(
        support::switchyard(dir.path())
            .args(["runs", "list", "--json"])
            .args(store),
    );
    let cost = list
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["cost_usd"]
                .as_f64()
                .unwrap()
        })
        .find(|c| *c > 0.0)
        .expect("a run that cost something");
    assert!((0.00005..0.0001).contains(&cost), "{cost}");
    // As text, four decimals, like every amount over $0.00005.
    let text = support::run(support::switchyard(dir.path()).args(["runs", "list"]).args(store));
    assert!(text.stdout.contains(" $0.0001 "), "{}", text.stdout);
}
