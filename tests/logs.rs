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

/// Every line `out` wrote on stderr, parsed as JSON (the test fails on one that is not).
fn json_lines(stderr: &str) -> Vec<serde_json::Value> {
    stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}\n{stderr}")))
        .collect()
}

/// With `--log-format json` everything `run` writes on stderr is a JSON line: its final
/// error, an interrupt and the command that continues it, a Ctrl-C stop, bad input, lint
/// diagnostics and a `--trace` tree.
#[test]
fn with_json_logs_every_stderr_line_of_run_is_json() {
    let dir = TempDir::new("logs-json-stderr");
    dir.write("fail.yaml", "flow: f\nsteps:\n  s: {fail: {message: boom}}\n");
    dir.write(
        "ask.yaml",
        "flow: a\nsteps:\n  ask: {interrupt: {prompt: \"ok?\", schema: {type: object}}}\n",
    );
    dir.write("broken.yaml", crate::support::ERROR_FLOW);
    let json = ["--log-format", "json"];

    let out = run(switchyard(dir.path())
        .args(["run", "fail.yaml", "--trace"])
        .args(json));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    let lines = json_lines(&out.stderr);
    let failed = lines
        .iter()
        .find(|l| l["event"] == "run_failed")
        .unwrap_or_else(|| panic!("no run_failed: {}", out.stderr));
    assert_eq!(failed["level"], "ERROR");
    assert_eq!(failed["message"], "error[fail]: step `s`: boom");
    assert_eq!(failed["error"]["kind"], "fail");
    assert_eq!(failed["status"], "failed");
    assert!(
        failed["run_id"].as_str().is_some_and(|id| id.starts_with('r')),
        "{failed}"
    );
    assert!(lines.iter().any(|l| l["event"] == "trace"), "{}", out.stderr);

    let out = run(switchyard(dir.path())
        .args(["run", "ask.yaml", "--store", "sqlite:runs.db"])
        .args(json));
    assert_eq!(out.code(), 3, "{}", out.stderr);
    let lines = json_lines(&out.stderr);
    let stopped = lines
        .iter()
        .find(|l| l["event"] == "run_interrupted")
        .unwrap_or_else(|| panic!("no run_interrupted: {}", out.stderr));
    let id = stopped["run_id"].as_str().expect("a run id");
    let detail = stopped["detail"].to_string();
    assert!(
        detail.contains(&format!(
            "continue it with `switchyard resume {id} --decision JSON --store sqlite:runs.db`"
        )),
        "{stopped}"
    );

    let out = run(switchyard(dir.path())
        .args(["run", "fail.yaml", "--input", "{"])
        .args(json));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    let lines = json_lines(&out.stderr);
    assert!(
        lines.iter().any(|l| l["event"] == "error"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("--input is not valid JSON"))),
        "{}",
        out.stderr
    );

    let out = run(switchyard(dir.path()).args(["run", "broken.yaml"]).args(json));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    let lines = json_lines(&out.stderr);
    let codes: Vec<&str> = lines
        .iter()
        .filter(|l| l["event"] == "diagnostic")
        .filter_map(|l| l["code"].as_str())
        .collect();
    assert_eq!(codes, ["SY201", "SY205"], "{}", out.stderr);
    assert!(
        lines.iter().any(|l| l["event"] == "lint_summary"),
        "{}",
        out.stderr
    );

    let out = run(switchyard(dir.path())
        .args(["runs", "show", "nope", "--store", "sqlite:runs.db"])
        .args(json));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert_eq!(json_lines(&out.stderr)[0]["message"], "run `nope` not found");
}

/// Ctrl-C with `--log-format json`: the stop and the command that continues the run are JSON
/// lines too.
#[test]
fn with_json_logs_a_ctrl_c_stop_is_told_in_json() {
    let dir = TempDir::new("logs-json-sigint");
    let calls = dir.path().join("calls");
    dir.write(
        "slow.yaml",
        crate::support::slow_steps_flow(&calls, &["one", "two"]),
    );
    let child = switchyard(dir.path())
        .args([
            "run",
            "slow.yaml",
            "--store",
            "sqlite:runs.db",
            "--log-format",
            "json",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    let started = std::time::Instant::now();
    while !calls.exists() {
        assert!(
            started.elapsed() < crate::support::HANG,
            "the first call never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (code, stderr) = crate::support::interrupt(child);
    assert_eq!(code, Some(130), "{stderr}");
    let lines = json_lines(&stderr);
    let events: Vec<&str> = lines.iter().filter_map(|l| l["event"].as_str()).collect();
    assert_eq!(events, ["stopping", "run_stopped"], "{stderr}");
    assert!(
        lines[1]["detail"]
            .to_string()
            .contains("continue it with `switchyard resume "),
        "{stderr}"
    );
}

/// A command line that does not parse is a usage error in JSON too when it asks for JSON logs,
/// however the flag is spelt; without it, clap's text as before.
#[test]
fn with_json_logs_a_usage_error_is_json() {
    let dir = TempDir::new("logs-usage");
    for args in [
        &["--log-format", "json", "runs", "cancel"][..],
        &["run", "f.yaml", "--timeout", "0s", "--log-format", "json"][..],
        &["--log-format=json", "batch", "f.yaml", "--concurrency", "many"][..],
    ] {
        let out = run(switchyard(dir.path()).args(args));
        assert_eq!(out.code(), 2, "{args:?}: {out:?}");
        let events = json_lines(&out.stderr);
        assert_eq!(events.len(), 1, "{args:?}: {}", out.stderr);
        assert_eq!(events[0]["level"], "ERROR", "{args:?}: {}", out.stderr);
        assert_eq!(events[0]["event"], "error", "{args:?}: {}", out.stderr);
        let message = events[0]["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty() && !message.starts_with("error:"), "{message}");
    }
    let text = run(switchyard(dir.path()).args(["runs", "cancel"]));
    assert_eq!(text.code(), 2, "{text:?}");
    assert!(
        text.stderr
            .starts_with("error: the following required arguments were not provided"),
        "{}",
        text.stderr
    );
}
