//! `command` agents through `switchyard run` (SPEC §7): what a program reads on stdin, its
//! argv from templates, its environment, its idempotency key across retries, the kind and
//! stderr tail of a failure, a timeout that kills the whole process group, capped output that
//! must be JSON, and a secret it prints redacted in every encoding.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::engine::{engine_dir, run_error};
use crate::support::{self, TempDir};

// ----- command agents --------------------------------------------------------------------------

/// Runs command.yaml in `mode`, with `log` a file in `dir`.
fn command_run(dir: &TempDir, mode: &str, extra: Value) -> (support::Output, PathBuf) {
    let log = dir.path().join(format!("{mode}.log"));
    let mut input = json!({"mode": mode, "log": log});
    if let (Value::Object(i), Value::Object(e)) = (&mut input, extra) {
        i.extend(e);
    }
    let mut cmd = support::switchyard(&engine_dir());
    cmd.args(["run", "command.yaml", "--input", &input.to_string()])
        .env("SY_TEST_SECRET", "s3cret")
        .env("SY_TEST_LEAK", "must not reach the command");
    (support::run(&mut cmd), log)
}

#[test]
fn a_command_reads_its_input_document_on_stdin_and_prints_json() {
    let dir = TempDir::new("engine-cmd");
    let (out, _) = command_run(&dir, "stdin", json!({"doc": {"a": [1, "x", null], "é": true}}));
    assert_eq!(out.code(), 0, "{out:?}");
    let out: Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(
        out["echoed"],
        json!({"doc": {"a": [1, "x", null], "é": true}, "n": 2})
    );
}

#[test]
fn command_arguments_are_templates_that_become_single_arguments() {
    let dir = TempDir::new("engine-cmd");
    let (out, _) = command_run(&dir, "argv", json!({"arg": "a b; echo pwned"}));
    assert_eq!(out.code(), 0, "{out:?}");
    let out: Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(
        out["argv"],
        json!({"argc": 2, "first": "a b; echo pwned", "second": "second-arg"})
    );
}

#[test]
fn the_idempotency_key_is_the_same_across_retries_of_a_step() {
    let dir = TempDir::new("engine-cmd");
    let (out, log) = command_run(&dir, "retry", json!({}));
    assert_eq!(out.code(), 0, "{out:?}");
    let result: Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(result["first"], json!({"attempt": 2}));
    assert_eq!(result["second"], json!({"attempt": 2}));
    let text = std::fs::read_to_string(&log).expect("the attempts log");
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(rows.len(), 4, "two steps, two attempts each: {text}");
    for row in &rows {
        assert_eq!(row.len(), 4, "attempt, key, step, run id: {text}");
        assert!(!row[1].is_empty() && !row[3].is_empty(), "{text}");
        assert_eq!(row[3], rows[0][3], "one run id: {text}");
    }
    let attempts: Vec<(&str, &str)> = rows.iter().map(|r| (r[0], r[2])).collect();
    assert_eq!(
        attempts,
        [
            ("1", "retried"),
            ("2", "retried"),
            ("1", "retried_again"),
            ("2", "retried_again")
        ]
    );
    assert_eq!(rows[0][1], rows[1][1], "same key across retries: {text}");
    assert_eq!(rows[2][1], rows[3][1], "same key across retries: {text}");
    assert_ne!(rows[0][1], rows[2][1], "another step, another key: {text}");
}

#[test]
fn a_command_sees_only_its_env_path_and_the_switchyard_variables() {
    let dir = TempDir::new("engine-cmd");
    let (out, log) = command_run(&dir, "env", json!({}));
    assert_eq!(out.code(), 0, "{out:?}");
    let text = std::fs::read_to_string(&log).expect("the env dump");
    let env: std::collections::BTreeMap<&str, &str> =
        text.lines().filter_map(|l| l.split_once('=')).collect();
    assert_eq!(env.get("GREETING"), Some(&"hello"), "{text}");
    assert_eq!(
        env.get("FROM_SECRET"),
        Some(&"s3cret"),
        "secret reference resolved: {text}"
    );
    assert_eq!(env.get("SWITCHYARD_STEP"), Some(&"environment"), "{text}");
    assert_eq!(env.get("SWITCHYARD_ATTEMPT"), Some(&"1"), "{text}");
    assert!(env.contains_key("PATH"), "{text}");
    assert!(env.contains_key("SWITCHYARD_RUN_ID"), "{text}");
    assert!(env.contains_key("SWITCHYARD_IDEMPOTENCY_KEY"), "{text}");
    // The shell adds PWD (and some shells SHLVL, OLDPWD, `_`); nothing else comes from us.
    let expected = [
        "GREETING",
        "FROM_SECRET",
        "PATH",
        "SWITCHYARD_RUN_ID",
        "SWITCHYARD_STEP",
        "SWITCHYARD_ATTEMPT",
        "SWITCHYARD_IDEMPOTENCY_KEY",
        "SWITCHYARD_INPUT_DIR",
        "SWITCHYARD_OUTPUT_DIR",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    ];
    let unexpected: Vec<&&str> = env.keys().filter(|k| !expected.contains(k)).collect();
    assert!(
        unexpected.is_empty(),
        "leaked into the command: {unexpected:?}\n{text}"
    );
}

#[test]
fn a_failed_command_is_kind_agent_with_the_tail_of_stderr() {
    let dir = TempDir::new("engine-cmd");
    let (out, _) = command_run(&dir, "exit", json!({}));
    assert_eq!(out.code(), 1, "{out:?}");
    let (kind, message) = run_error(&out);
    assert_eq!(kind, "agent");
    assert!(
        message.starts_with("step `exit_code`: command `sh` exited with status 3: …"),
        "{message}"
    );
    assert!(message.ends_with("fatal: disk full"), "{message}");
    assert!(!message.contains("BEGIN"), "only the tail is kept: {message}");
    assert!(
        message.len() < 2300,
        "the tail is bounded: {} bytes",
        message.len()
    );
}

#[test]
fn a_command_timeout_kills_its_whole_process_group() {
    let dir = TempDir::new("engine-cmd");
    let started = Instant::now();
    let (out, pid_file) = command_run(&dir, "timeout", json!({}));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the run did not wait for `sleep 30`"
    );
    assert_eq!(out.code(), 1, "{out:?}");
    let (kind, message) = run_error(&out);
    assert_eq!(kind, "timeout");
    assert!(message.contains("timed out after 300ms"), "{message}");
    let pid = std::fs::read_to_string(&pid_file).expect("the grandchild's pid");
    let pid = pid.trim();
    // The grandchild (`sleep 30`, in the command's process group) is gone: killed, then
    // reaped by init. Give the reaper a moment.
    let deadline = Instant::now() + Duration::from_secs(3);
    let alive = loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit(')').next().map(|r| r.trim().chars().next()))
            .flatten();
        let alive = matches!(state, Some(s) if s != 'Z' && s != 'X');
        if !alive || Instant::now() > deadline {
            break alive;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if alive {
        let _ = std::process::Command::new("kill").args(["-9", pid]).status();
    }
    assert!(!alive, "the grandchild {pid} outlived the timeout");
}

#[test]
fn command_output_is_capped_and_must_be_json() {
    let dir = TempDir::new("engine-cmd");
    let (out, _) = command_run(&dir, "max_output", json!({}));
    assert_eq!(out.code(), 1, "{out:?}");
    assert_eq!(
        run_error(&out),
        (
            "invalid_output".to_string(),
            "step `too_much`: command `sh`: stdout exceeded 1 KiB (max_output)".to_string()
        )
    );
    let (out, _) = command_run(&dir, "not_json", json!({}));
    assert_eq!(out.code(), 1, "{out:?}");
    let (kind, message) = run_error(&out);
    assert_eq!(kind, "invalid_output");
    assert!(
        message.starts_with("step `bad_json`: command `echo` printed invalid JSON on stdout")
            && message.ends_with(": this is not json"),
        "{message}"
    );
}

#[test]
fn a_secret_a_command_prints_is_redacted_everywhere_in_every_encoding() {
    let dir = TempDir::new("engine-command-secret");
    let secret = "s3cr3t/tok en+x";
    dir.write(
        "leak.yaml",
        r#"flow: leak
agents:
  leaky:
    kind: command
    # Prints the token as it is, percent-encoded, JSON-escaped and in base64, on stdout and
    # stderr, then fails.
    run: [sh, -c, 'printf "%s" "$TOKEN" | base64 > b64; printf "{\"raw\": \"%s\", \"url\": \"https://x/?t=s3cr3t%%2Ftok%%20en%%2Bx\", \"b64\": \"%s\"}" "$TOKEN" "$(cat b64)"; printf "token %s in base64 %s" "$TOKEN" "$(cat b64)" >&2; exit 3']
    env: {TOKEN: "${env:SWITCHYARD_TEST_LEAKED}"}
steps:
  call:
    agent: leaky
    output: "*"
"#,
    );
    let out = support::run(
        support::switchyard(dir.path())
            .args(["run", "leak.yaml", "--store", "sqlite:runs.db", "-vvv"])
            .env("SWITCHYARD_TEST_LEAKED", secret),
    );
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(
        out.stderr.contains("token [redacted] in base64 [redacted]"),
        "{}",
        out.stderr
    );
    let list = support::run(support::switchyard(dir.path()).args([
        "runs",
        "list",
        "--store",
        "sqlite:runs.db",
        "--json",
    ]));
    let id = serde_json::from_str::<Value>(list.stdout.lines().next().expect("one run")).expect("JSON")["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let show = support::run(support::switchyard(dir.path()).args([
        "runs",
        "show",
        &id,
        "--store",
        "sqlite:runs.db",
        "--json",
    ]));
    assert_eq!(show.code(), 0, "{show:?}");
    let mut db = std::fs::read(dir.path().join("runs.db")).expect("the store");
    db.extend(std::fs::read(dir.path().join("runs.db-wal")).unwrap_or_default());
    let db = String::from_utf8_lossy(&db);
    for form in ["s3cr3t", "czNjcjN0"] {
        for (what, text) in [
            ("stdout", &out.stdout),
            ("stderr", &out.stderr),
            ("runs show", &show.stdout),
            ("store", &db.to_string()),
        ] {
            assert!(!text.contains(form), "{what} holds `{form}`:\n{text}");
        }
    }
}
