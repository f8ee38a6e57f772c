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
