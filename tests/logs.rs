//! Events: every run and step start, finish, retry and route decision is a tracing event with
//! the run id and step number; `--log-format json` prints them as JSON lines on stderr.

use crate::support::{TempDir, run, switchyard};

#[test]
fn json_logs_carry_run_ids_and_step_numbers() {
    let dir = TempDir::new("logs");
    let flow = dir.write(
        "f.yaml",
        r#"flow: logs
agents:
  flaky: {kind: mock, fail_times: 1, returns: {ok: true}}
steps:
  first:
    set: {$.n: =1}
    next: call
  call:
    agent: flaky
    retry: {attempts: 2, backoff: 10ms, jitter: false}
    output: {$.ok: $.ok}
"#,
    );
    let out = run(switchyard(dir.path())
        .arg("run")
        .arg(&flow)
        .args(["--log-format", "json", "-vv"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let events: Vec<serde_json::Value> = out
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let with = |message: &str| -> Vec<&serde_json::Value> {
        events
            .iter()
            .filter(|e| e["fields"]["message"] == message)
            .collect()
    };
    let run_id = with("run started")[0]["fields"]["run_id"]
        .as_str()
        .expect("a run id")
        .to_string();
    for (message, count) in [
        ("step started", 2),
        ("step finished", 2),
        ("route", 1),
        ("retry", 1),
        ("run finished", 1),
    ] {
        let found = with(message);
        assert_eq!(found.len(), count, "{message}: {found:?}");
        for e in found {
            assert_eq!(e["fields"]["run_id"], run_id.as_str(), "{e}");
            if message != "run finished" {
                assert!(
                    e["fields"]["number"].is_string(),
                    "{message} has no step number: {e}"
                );
            }
        }
    }
    assert_eq!(with("retry")[0]["fields"]["number"], "2");
    assert_eq!(with("route")[0]["fields"]["to"], "call");
}

/// With `--log-format json` a batch's progress lines and summary are JSON lines too: every
/// line on stderr parses.
#[test]
fn a_batchs_progress_and_summary_are_json_lines_with_json_logs() {
    let dir = TempDir::new("logs-batch-json");
    dir.write(
        "slow.yaml",
        "flow: slow\nagents:\n  wait: {kind: mock, latency: 300ms, returns: {ok: true}}\nsteps:\n  s: {agent: wait, output: {$.ok: $.ok}}\n",
    );
    let input: String = (0..8).map(|i| format!("{{\"id\": \"i{i}\"}}\n")).collect();
    dir.write("in.jsonl", input);
    let out = run(switchyard(dir.path()).args([
        "--log-format",
        "json",
        "batch",
        "slow.yaml",
        "--input",
        "in.jsonl",
        "--output",
        "out.jsonl",
        "--concurrency",
        "2",
        "--progress-every",
        "1",
        "--store",
        "memory",
    ]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let events: Vec<serde_json::Value> = out
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let progress: Vec<_> = events.iter().filter(|e| e["event"] == "batch_progress").collect();
    assert!(!progress.is_empty(), "{}", out.stderr);
    assert!(
        progress
            .iter()
            .all(|p| p["total"] == 8 && p["in_flight"].as_u64() <= Some(2)),
        "{progress:?}"
    );
    let summary: Vec<_> = events.iter().filter(|e| e["event"] == "batch_summary").collect();
    assert_eq!(summary.len(), 1, "{}", out.stderr);
    assert_eq!(summary[0]["succeeded"], 8);
    assert_eq!(summary[0]["total"], 8);
}
