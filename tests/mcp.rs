//! MCP servers as tools (SPEC §6.4): the fixture server (`examples/mcp_fixture.rs`) over
//! stdio and loopback Streamable HTTP, called by `kind: mcp` steps through the binary.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::support::*;

/// Sends JSON-RPC lines to a stdio fixture and reads one answer per request.
fn exchange(pids: &std::path::Path, requests: &[Value]) -> Vec<Value> {
    let mut child = Command::new(mcp_fixture())
        .env("MCP_FIXTURE_PIDS", pids)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the fixture starts");
    let mut stdin = child.stdin.take().expect("piped");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut answers = Vec::new();
    for request in requests {
        writeln!(stdin, "{request}").expect("the fixture reads");
        if request.get("id").is_none() {
            continue;
        }
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the fixture answers");
        answers.push(serde_json::from_str(&line).expect("a JSON-RPC answer"));
    }
    drop(stdin);
    let status = child.wait().expect("the fixture exits");
    assert!(status.success(), "the fixture exits cleanly once stdin closes");
    answers
}

#[test]
fn the_fixture_lists_its_tools_and_answers_over_stdio() {
    let dir = TempDir::new("mcp-fixture");
    let pids = dir.path().join("pids");
    let answers = exchange(
        &pids,
        &[
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "add", "arguments": {"a": 2, "b": 3}}}),
        ],
    );
    let names: Vec<&str> = answers[1]["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().expect("a name"))
        .collect();
    for tool in [
        "echo",
        "add",
        "bad_output",
        "fail",
        "slow",
        "crash",
        "elicit",
        "count",
    ] {
        assert!(names.contains(&tool), "{tool} in {names:?}");
    }
    assert_eq!(answers[2]["result"]["structuredContent"], json!({"sum": 5}));
    let started = fixture_pids(&pids);
    assert_eq!(started.len(), 1, "one process wrote its pid: {started:?}");
    assert!(!process_alive(started[0]), "the fixture has exited");
}

/// A directory with a flow whose `fx` server is the fixture over stdio, telling the test which
/// processes started (`pids`) and which calls reached it (`log`).
struct Fx {
    dir: TempDir,
    pids: PathBuf,
    log: PathBuf,
}

impl Fx {
    fn new(tag: &str) -> Fx {
        let dir = TempDir::new(tag);
        let pids = dir.path().join("pids");
        let log = dir.path().join("calls.log");
        Fx { dir, pids, log }
    }

    /// The `fx` server's definition: the fixture with `args`, and `extra` lines of its own.
    fn server(&self, args: &str, extra: &str) -> String {
        format!(
            "mcp_servers:\n  fx:\n    command: [\"{}\"{args}]\n    env: {{MCP_FIXTURE_PIDS: \"{}\", MCP_FIXTURE_LOG: \"{}\"}}\n    tools: [\"*\"]\n{extra}",
            mcp_fixture().display(),
            self.pids.display(),
            self.log.display()
        )
    }

    /// Writes `flow.yaml`: the server (with `extra` lines) and `rest` (agents and steps).
    fn flow(&self, extra: &str, rest: &str) -> PathBuf {
        self.dir.write(
            "flow.yaml",
            format!("flow: mcp-test\n{}{rest}", self.server("", extra)),
        )
    }

    fn run(&self, input: &str) -> Output {
        run(switchyard(self.dir.path()).args(["run", "flow.yaml", "--input", input]))
    }

    /// The calls that reached a server, in order (`call echo`, `cancelled slow`).
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    fn started(&self) -> Vec<i32> {
        fixture_pids(&self.pids)
    }

    /// Every server started has exited (waiting a moment for one that is being ended).
    fn assert_none_alive(&self) {
        let started = self.started();
        assert!(!started.is_empty(), "a server was started");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while started.iter().any(|p| process_alive(*p)) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let alive: Vec<&i32> = started.iter().filter(|p| process_alive(**p)).collect();
        assert!(alive.is_empty(), "servers left running: {alive:?}");
    }
}

fn output(out: &Output) -> Value {
    assert_eq!(out.code(), 0, "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

/// One agent `call` of tool `tool` and one step calling it with the run's input.
fn one_call(tool: &str, step_extra: &str) -> String {
    format!(
        "agents:\n  call: {{kind: mcp, server: fx, tool: {tool}}}\nsteps:\n  first:\n    agent: call\n    output: {{$.out: $}}\n{step_extra}"
    )
}

#[test]
fn text_structured_json_text_and_image_results() {
    let fx = Fx::new("mcp-results");
    fx.flow(
        "",
        "agents:\n  echo: {kind: mcp, server: fx, tool: echo}\n  add: {kind: mcp, server: fx, tool: add}\n  json: {kind: mcp, server: fx, tool: json_text}\n  image: {kind: mcp, server: fx, tool: image}\nsteps:\n  a: {agent: echo, input: {$.text: $.text}, output: {$.echo: $}, next: b}\n  b: {agent: add, input: {$.a: $.x, $.b: $.y}, output: {$.add: $}, next: c}\n  c: {agent: json, input: {}, output: {$.json: $}, next: d}\n  d: {agent: image, input: {}, output: {$.image: $}}\n",
    );
    let out = output(&fx.run(r#"{"text": "héllo", "x": 2, "y": 3}"#));
    assert_eq!(
        out["echo"],
        json!({"structured": null, "content": ["héllo"], "is_error": false})
    );
    assert_eq!(out["add"]["structured"], json!({"sum": 5}));
    assert_eq!(
        out["json"]["structured"],
        json!({"answer": 42, "items": ["a", "b"]})
    );
    // The image block became a file (SPEC §6.5): its reference, the bytes in the store.
    assert_eq!(out["image"]["content"][0]["type"], "image", "{out}");
    assert_eq!(out["image"]["content"][0]["file"]["name"], "image-1.png", "{out}");
    assert_eq!(
        out["image"]["content"][0]["file"]["media_type"], "image/png",
        "{out}"
    );
    assert_eq!(out["image"]["content"][0]["file"]["size"], 70, "{out}");
    assert_eq!(
        fx.calls(),
        ["call echo", "call add", "call json_text", "call image"]
    );
    assert_eq!(fx.started().len(), 1, "one server for the four steps");
    fx.assert_none_alive();
}

#[test]
fn structured_content_that_breaks_its_output_schema_is_invalid_output() {
    let fx = Fx::new("mcp-bad-output");
    fx.flow("", &one_call("bad_output", "    input: {}\n"));
    let out = fx.run("{}");
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("error[invalid_output]")
            && out.stderr.contains("`outputSchema`")
            && out.stderr.contains("fx.bad_output"),
        "{}",
        out.stderr
    );
}

#[test]
fn is_error_fails_the_step_with_the_tools_text() {
    let fx = Fx::new("mcp-is-error");
    fx.flow("", &one_call("fail", "    input: {}\n"));
    let out = fx.run("{}");
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("error[agent]") && out.stderr.contains("the tool failed on purpose"),
        "{}",
        out.stderr
    );
}

#[test]
fn arguments_that_break_the_input_schema_are_never_sent() {
    let fx = Fx::new("mcp-input-schema");
    fx.flow(
        "",
        &one_call(
            "add",
            "    input: {$.a: $.a}\n    retry: {attempts: 3, backoff: 10ms}\n",
        ),
    );
    let out = fx.run(r#"{"a": "two"}"#);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("error[agent]")
            && out.stderr.contains("`inputSchema`")
            && out.stderr.contains("it was not called"),
        "{}",
        out.stderr
    );
    assert!(
        fx.calls().is_empty(),
        "nothing reached the server: {:?}",
        fx.calls()
    );
}

#[test]
fn a_tool_outside_the_allowlist_is_refused_by_lint() {
    let fx = Fx::new("mcp-allowlist");
    fx.dir.write(
        "flow.yaml",
        format!(
            "flow: t\nmcp_servers:\n  fx:\n    command: [\"{}\"]\n    tools: [echo]\n{}",
            mcp_fixture().display(),
            one_call("add", "    input: {}\n")
        ),
    );
    let out = fx.run("{}");
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("SY510"), "{}", out.stderr);
    assert!(fx.calls().is_empty());
}

#[test]
fn progress_extends_the_timeout_and_silence_cancels_the_call() {
    let fx = Fx::new("mcp-progress");
    fx.flow(
        "",
        &one_call(
            "slow",
            "    input: {$.ms: $.ms, $.progress_every_ms: $.every}\n    timeout: 700ms\n",
        ),
    );
    // 2 s of work, progress every 100 ms: never 700 ms without news.
    let out = output(&fx.run(r#"{"ms": 2000, "every": 100}"#));
    assert_eq!(out["out"]["content"], json!(["slept 2000 ms"]));

    // The step that times out is followed by a short call: the server is still there to read
    // the cancellation when its handler runs.
    fx.flow(
        "",
        "agents:\n  slow: {kind: mcp, server: fx, tool: slow}\nsteps:\n  first:\n    agent: slow\n    input: {$.ms: $.ms}\n    timeout: 400ms\n    output: {}\n    next:\n      - {to: then, on: always}\n  then: {agent: slow, input: {$.ms: {value: 300}}, output: {$.error: '=steps.first.error.message'}}\n",
    );
    let started = std::time::Instant::now();
    let out = output(&fx.run(r#"{"ms": 5000}"#));
    let error = out["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("MCP tool `fx.slow` timed out after 400ms without an answer or progress; the request was cancelled"),
        "{out}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(4),
        "not waited out"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while !fx.calls().contains(&"cancelled slow".to_string()) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        fx.calls().contains(&"cancelled slow".to_string()),
        "the server was told: {:?}",
        fx.calls()
    );
}

#[test]
fn progress_extends_a_call_no_further_than_max_time() {
    let fx = Fx::new("mcp-max-time");
    fx.flow(
        "    max_time: 1500ms\n",
        &one_call(
            "slow",
            "    input: {$.ms: $.ms, $.progress_every_ms: $.every}\n    timeout: 700ms\n",
        ),
    );
    let out = fx.run(r#"{"ms": 5000, "every": 100}"#);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("error[timeout]") && out.stderr.contains("`max_time` of 1500ms"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_server_that_crashes_mid_call_is_restarted_for_the_next_call() {
    let fx = Fx::new("mcp-crash");
    fx.flow(
        "",
        "agents:\n  crash: {kind: mcp, server: fx, tool: crash}\n  count: {kind: mcp, server: fx, tool: count}\nsteps:\n  first:\n    agent: crash\n    input: {}\n    output: {$.crashed: $}\n    next:\n      - to: second\n        on: always\n  second: {agent: count, input: {}, output: {$.count: $.structured.count, $.error: '=steps.first.error.message'}}\n",
    );
    let out = output(&fx.run("{}"));
    assert_eq!(out["count"], 1, "a new process served the call: {out}");
    let error = out["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("MCP server `fx` exited with code 3 during a call of `crash`"),
        "{out}"
    );
    assert_eq!(fx.started().len(), 2, "started again once");
    fx.assert_none_alive();
}

#[test]
fn a_result_over_max_result_bytes_is_cut_and_says_so() {
    let fx = Fx::new("mcp-big");
    fx.flow(
        "    max_result_bytes: 1KiB\n",
        &one_call("big", "    input: {$.bytes: $.bytes}\n"),
    );
    let out = output(&fx.run(r#"{"bytes": 3000}"#));
    let content = out["out"]["content"].as_array().expect("content");
    assert_eq!(content[0].as_str().map(str::len), Some(1024), "{out}");
    assert_eq!(content[1], "[result cut at 1024 bytes of 3000]");
}

#[test]
fn both_protocol_revisions_over_stdio_and_streamable_http() {
    // The stateless revision (server/discover) and the initialize handshake over stdio.
    for args in ["", ", --legacy"] {
        let fx = Fx::new("mcp-revisions");
        fx.dir.write(
            "flow.yaml",
            format!(
                "flow: t\n{}{}",
                fx.server(args, ""),
                one_call("echo", "    input: {$.text: $.text}\n")
            ),
        );
        let out = output(&fx.run(r#"{"text": "hi"}"#));
        assert_eq!(out["out"]["content"], json!(["hi"]), "args {args:?}");
        let listed = run(switchyard(fx.dir.path()).args(["mcp", "list", "flow.yaml", "--json"]));
        let listed: Value = serde_json::from_str(&listed.stdout).expect("JSON");
        let expected = if args.is_empty() {
            "2026-07-28"
        } else {
            "2025-11-25"
        };
        assert_eq!(listed["fx"]["protocol"], expected, "{listed}");
    }
    // Streamable HTTP on loopback.
    for args in [
        &["--http", "127.0.0.1:0"][..],
        &["--legacy", "--http", "127.0.0.1:0"][..],
    ] {
        let mut server = Command::new(mcp_fixture())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the fixture starts");
        let mut url = String::new();
        BufReader::new(server.stdout.take().expect("piped"))
            .read_line(&mut url)
            .expect("the fixture prints its url");
        let dir = TempDir::new("mcp-http");
        dir.write(
            "flow.yaml",
            format!(
                "flow: t\nmcp_servers:\n  web:\n    url: {}\n    headers: {{X-Team: blue}}\n    tools: [echo, add]\nagents:\n  add: {{kind: mcp, server: web, tool: add}}\nsteps:\n  first: {{agent: add, input: {{$.a: $.a, $.b: $.b}}, output: {{$.sum: $.structured.sum}}}}\n",
                url.trim()
            ),
        );
        let out = run(switchyard(dir.path()).args(["run", "flow.yaml", "--input", r#"{"a": 1, "b": 2}"#]));
        let _ = server.kill();
        let _ = server.wait();
        assert_eq!(output(&out)["sum"], 3, "{args:?}");
    }
}

#[test]
fn a_batch_of_200_items_starts_one_server_and_leaves_none() {
    let fx = Fx::new("mcp-batch");
    fx.flow("", &one_call("echo", "    input: {$.text: $.text}\n"));
    let lines: String = (0..200)
        .map(|i| format!("{{\"id\": {i}, \"text\": \"item {i}\"}}\n"))
        .collect();
    fx.dir.write("in.jsonl", lines);
    let out = run(switchyard(fx.dir.path()).args([
        "batch",
        "flow.yaml",
        "--input",
        "in.jsonl",
        "--output",
        "out.jsonl",
        "--concurrency",
        "16",
    ]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let written = std::fs::read_to_string(fx.dir.path().join("out.jsonl")).expect("the output");
    let lines: Vec<Value> = written
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 200);
    assert_eq!(lines[7]["output"]["out"]["content"], json!(["item 7"]));
    assert!(lines.iter().all(|l| l["status"] == "succeeded"));
    assert_eq!(fx.started().len(), 1, "one server for the whole batch");
    assert_eq!(fx.calls().len(), 200);
    fx.assert_none_alive();
}

/// Starts `switchyard` with `args` in the fixture's directory and waits until the server
/// logged `line`.
fn start_until(fx: &Fx, args: &[&str], line: &str) -> std::process::Child {
    let child = switchyard(fx.dir.path())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("switchyard starts");
    let deadline = std::time::Instant::now() + HANG;
    while !fx.calls().iter().any(|l| l == line) {
        assert!(
            std::time::Instant::now() < deadline,
            "the server never logged {line}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child
}

#[test]
fn a_run_stopped_by_ctrl_c_mid_call_leaves_no_server() {
    let fx = Fx::new("mcp-sigint");
    fx.flow(
        "",
        "agents:\n  slow: {kind: mcp, server: fx, tool: slow}\nsteps:\n  first: {agent: slow, input: {$.ms: $.ms}, output: {}, next: second}\n  second: {agent: slow, input: {$.ms: $.ms}, output: {}}\n",
    );
    let child = start_until(
        &fx,
        &["run", "flow.yaml", "--input", r#"{"ms": 800}"#],
        "call slow",
    );
    let (code, stderr) = interrupt(child);
    assert_eq!(code, Some(130), "{stderr}");
    assert_eq!(fx.calls(), ["call slow"], "paused before the second step");
    fx.assert_none_alive();
}

/// A run killed (SIGKILL) while its step's `slow` call is in flight, then resumed; `extra`:
/// lines of the server's definition.
fn killed_mid_call(extra: &str) -> (Fx, Output) {
    let fx = Fx::new("mcp-kill");
    fx.flow(extra, &one_call("slow", "    input: {$.ms: $.ms}\n"));
    let store = ["--store", "sqlite:runs.db"];
    let mut args = vec!["run", "flow.yaml", "--input", r#"{"ms": 1500}"#];
    args.extend(store);
    let mut child = start_until(&fx, &args, "call slow");
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    // Its server sees its stdin close and exits.
    fx.assert_none_alive();
    let list = run(switchyard(fx.dir.path())
        .args(["runs", "list", "--json"])
        .args(store));
    let id = serde_json::from_str::<Value>(list.stdout.lines().next().expect("one run"))
        .expect("a JSON line")["id"]
        .as_str()
        .expect("an id")
        .to_string();
    let out = run(switchyard(fx.dir.path()).args(["resume", &id]).args(store));
    (fx, out)
}

#[test]
fn a_call_cut_by_a_crash_is_in_doubt_unless_its_tool_is_idempotent() {
    // `slow` is marked idempotent by the fixture, which counts for nothing untrusted.
    let (fx, out) = killed_mid_call("");
    assert_eq!(out.code(), 3, "{}", out.stderr);
    assert!(out.stderr.contains("interrupted[in_doubt]"), "{}", out.stderr);
    assert_eq!(fx.calls(), ["call slow"], "not sent again");

    for extra in ["    idempotent: [slow]\n", "    trust: trusted\n"] {
        let (fx, out) = killed_mid_call(extra);
        assert_eq!(out.code(), 0, "{extra}: {}", out.stderr);
        let output: Value = serde_json::from_str(&out.stdout).expect("the output");
        assert_eq!(output["out"]["content"], json!(["slept 1500 ms"]));
        let sent: Vec<String> = fx.calls().into_iter().filter(|c| c == "call slow").collect();
        assert_eq!(sent.len(), 2, "{extra}: sent again");
    }
}

#[test]
fn the_whole_process_group_ends_even_when_the_server_already_exited() {
    let fx = Fx::new("mcp-group");
    let grandchild = fx.dir.path().join("grandchild");
    // The server leaves a process of its own behind in its group; it exits when its stdin
    // closes, the sleeping process does not.
    fx.dir.write(
        "flow.yaml",
        format!(
            "flow: t\nmcp_servers:\n  fx:\n    command: [sh, -c, 'sleep 60 & echo $! > \"{}\"; exec \"{}\"']\n    env: {{MCP_FIXTURE_PIDS: \"{}\"}}\n    tools: [\"*\"]\n{}",
            grandchild.display(),
            mcp_fixture().display(),
            fx.pids.display(),
            one_call("echo", "    input: {$.text: $.text}\n")
        ),
    );
    let out = output(&fx.run(r#"{"text": "x"}"#));
    assert_eq!(out["out"]["content"], json!(["x"]));
    let sleeper: i32 = std::fs::read_to_string(&grandchild)
        .expect("the grandchild's pid")
        .trim()
        .parse()
        .expect("a pid");
    assert!(!process_alive(sleeper), "the server's group was ended");
    fx.assert_none_alive();
}

#[test]
fn a_secret_a_server_gives_back_is_redacted() {
    let fx = Fx::new("mcp-secret");
    fx.dir.write(
        "flow.yaml",
        format!(
            "flow: t\nmcp_servers:\n  fx:\n    command: [\"{}\"]\n    env: {{TOKEN: \"${{env:FX_TOKEN}}\"}}\n    tools: [\"*\"]\n{}",
            mcp_fixture().display(),
            one_call("env", "    input: {$.name: {value: TOKEN}}\n")
        ),
    );
    let secret = "s3cr3t-value-0042";
    let out = run(switchyard(fx.dir.path())
        .args(["run", "flow.yaml", "--input", "{}", "--store", "sqlite:runs.db"])
        .env("FX_TOKEN", secret));
    let value = output(&out);
    assert_eq!(value["out"]["content"], json!(["[redacted]"]), "{value}");
    let stored = std::fs::read(fx.dir.path().join("runs.db")).expect("the store");
    assert!(
        !String::from_utf8_lossy(&stored).contains(secret),
        "the secret is not in the store"
    );
    // Unset, the run is refused before anything starts, naming the variable.
    let out = run(switchyard(fx.dir.path())
        .args(["run", "flow.yaml", "--input", "{}"])
        .env_remove("FX_TOKEN"));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("FX_TOKEN"), "{}", out.stderr);
}

#[test]
fn lint_mcp_names_a_server_that_cannot_start_and_tools_it_does_not_list() {
    let dir = TempDir::new("mcp-lint-live");
    dir.write(
        "flow.yaml",
        "flow: t\nmcp_servers:\n  gone:\n    command: [./no-such-server]\n    tools: [\"*\"]\nagents:\n  call: {kind: mcp, server: gone, tool: x}\nsteps:\n  first: {agent: call, output: {$.x: $}}\n",
    );
    let static_only = run(switchyard(dir.path()).args(["lint", "flow.yaml"]));
    assert_eq!(static_only.code(), 0, "{}", static_only.stderr);
    let out = run(switchyard(dir.path()).args(["lint", "--mcp", "flow.yaml", "--format", "json"]));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    let d = out.diagnostics();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        (d[0].code.as_str(), d[0].line, d[0].column),
        ("SY513", 3, 3),
        "{d:?}"
    );
    assert!(
        d[0].message.starts_with("MCP server `gone` could not be started"),
        "{d:?}"
    );
    // The human form names the server and the cause too.
    let out = run(switchyard(dir.path()).args(["lint", "--mcp", "flow.yaml"]));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(out.stdout.contains("SY513"), "{}", out.stdout);

    let fx = Fx::new("mcp-lint-live");
    fx.flow("", &one_call("ech", "    input: {}\n"));
    let out = run(switchyard(fx.dir.path()).args(["lint", "--mcp", "flow.yaml", "--format", "json"]));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    let d = out.diagnostics();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!((d[0].code.as_str(), d[0].line), ("SY514", 8), "{d:?}");
    assert_eq!(d[0].message, "MCP server `fx` lists no tool `ech`");
    fx.flow("", &one_call("echo", "    input: {}\n"));
    let out = run(switchyard(fx.dir.path()).args(["lint", "--mcp", "flow.yaml"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    fx.assert_none_alive();
}

#[test]
fn mcp_list_prints_tools_schemas_and_annotations() {
    let fx = Fx::new("mcp-list");
    fx.flow("", &one_call("echo", "    input: {}\n"));
    let out = run(switchyard(fx.dir.path()).args(["mcp", "list", "flow.yaml"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(
        out.stdout.starts_with("fx (2026-07-28): 16 tools\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("  destructive: Marked destructive.\n    input: {\"type\":\"object\",\"properties\":{}}\n    annotations: {\"readOnlyHint\":false,\"destructiveHint\":true}\n"),
        "{}",
        out.stdout
    );
    let out = run(switchyard(fx.dir.path()).args(["mcp", "list", "flow.yaml", "--json"]));
    let listed: Value = serde_json::from_str(&out.stdout).expect("JSON");
    let add = listed["fx"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|t| t["name"] == "add")
        .expect("add")
        .clone();
    assert_eq!(add["output_schema"]["required"], json!(["sum"]));
    assert_eq!(add["annotations"], json!({"readOnlyHint": true}));
    fx.assert_none_alive();
}

/// A plain step whose tool needs approval (`approve:`, or a trusted server's destructive
/// tool) stops `interrupted` before the call, waiting for a decision (`tests/mcp_loop.rs`
/// answers it); the tool is not called.
#[test]
fn a_plain_step_never_calls_a_tool_that_needs_approval() {
    for (extra, tool) in [
        ("    approve: [echo]\n", "echo"),
        ("    trust: trusted\n", "destructive"),
    ] {
        let fx = Fx::new("mcp-approval");
        fx.flow(extra, &one_call(tool, "    input: {}\n"));
        let out = fx.run("{}");
        assert_eq!(out.code(), 3, "{}", out.stderr);
        assert!(
            out.stderr
                .contains(&format!("waits for approval of a call of `fx.{tool}`")),
            "{}",
            out.stderr
        );
        assert!(fx.calls().is_empty(), "{:?}", fx.calls());
    }
    // Listed in `no_approval:`, a trusted server's destructive tool is called.
    let fx = Fx::new("mcp-no-approval");
    fx.flow(
        "    trust: trusted\n    no_approval: [destructive]\n",
        &one_call("destructive", "    input: {}\n"),
    );
    assert_eq!(output(&fx.run("{}"))["out"]["content"], json!(["destroyed"]));
}

#[test]
fn a_server_that_keeps_dying_is_given_up_after_three_restarts() {
    let fx = Fx::new("mcp-give-up");
    let mut rest = "agents:\n  crash: {kind: mcp, server: fx, tool: crash}\nsteps:\n".to_string();
    for i in 1..=5 {
        let next = if i < 5 {
            format!("\n    next:\n      - {{to: c{}, on: always}}", i + 1)
        } else {
            String::new()
        };
        rest.push_str(&format!(
            "  c{i}:\n    agent: crash\n    input: {{}}\n    output: {{}}{next}\n"
        ));
    }
    fx.flow("", &rest);
    let out = fx.run("{}");
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("step `c5`")
            && out
                .stderr
                .contains("MCP server `fx` died 4 times and is not started again (last: exited with code 3"),
        "{}",
        out.stderr
    );
    assert_eq!(fx.started().len(), 4, "started, then 3 restarts");
    assert_eq!(fx.calls().len(), 4);
    fx.assert_none_alive();
}

#[test]
fn allow_and_agent_changes_know_the_kind_mcp() {
    let fx = Fx::new("mcp-allow");
    fx.dir.write(
        "flow.yaml",
        format!(
            "flow: t\nallow: [transform]\n{}{}",
            fx.server("", ""),
            one_call("echo", "    input: {$.text: $.text}\n")
        ),
    );
    let out = fx.run(r#"{"text": "x"}"#);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("SY501") && out.stderr.contains("`mcp`"),
        "{}",
        out.stderr
    );

    fx.flow("", &one_call("echo", "    input: {$.text: $.text}\n"));
    let out = run(switchyard(fx.dir.path()).args([
        "run",
        "flow.yaml",
        "--input",
        r#"{"text": "x"}"#,
        "--allow",
        "transform",
    ]));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("error[capability]"), "{}", out.stderr);

    fx.dir.write(
        "change.yaml",
        "- scope: global\n  mode: remove\n  agents: [call]\n",
    );
    let out = run(switchyard(fx.dir.path()).args([
        "run",
        "flow.yaml",
        "--input",
        r#"{"text": "x"}"#,
        "--agent-change",
        "change.yaml",
    ]));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("error[capability]") && out.stderr.contains("removed by an agent change"),
        "{}",
        out.stderr
    );
    assert!(fx.calls().is_empty(), "{:?}", fx.calls());
}

#[test]
fn an_imported_server_runs_its_command_from_its_own_files_directory() {
    let fx = Fx::new("mcp-import");
    let lib = fx.dir.path().join("lib");
    std::fs::create_dir_all(&lib).expect("lib/");
    std::os::unix::fs::symlink(mcp_fixture(), lib.join("fx")).expect("a link to the fixture");
    fx.dir.write(
        "lib/servers.yaml",
        format!(
            "mcp_servers:\n  fx:\n    command: [./fx]\n    env: {{MCP_FIXTURE_LOG: \"{}\"}}\n    tools: [echo]\n",
            fx.log.display()
        ),
    );
    fx.dir.write(
        "flows/flow.yaml",
        format!(
            "flow: t\nimports: [../lib/servers.yaml]\n{}",
            one_call("echo", "    input: {$.text: $.text}\n")
        ),
    );
    let out = run(switchyard(fx.dir.path()).args([
        "run",
        "flows/flow.yaml",
        "--input",
        r#"{"text": "x"}"#,
        "--root",
        ".",
    ]));
    assert_eq!(output(&out)["out"]["content"], json!(["x"]));
    assert_eq!(fx.calls(), ["call echo"]);
}
