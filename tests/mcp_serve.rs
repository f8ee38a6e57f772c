//! `switchyard mcp serve`: flows as the tools of a real MCP client, the official Python SDK
//! (`tests/fixtures/mcp/client.py`, installed by `.ci/run` into `target/test-tools/py`), over
//! stdio and Streamable HTTP, with the 2025-11-25 handshake and the stateless revision; a
//! run that stops for a human continued through the run tools; progress; the HTTP guard
//! (token, Origin); cancelling a call; what is refused at start; the runs' origin.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::agent_loop_durable::approval_flow;
use crate::mock_server::{Llm, Reply};
use crate::support::{BIN, TempDir, run, run_with_limit, switchyard};

/// The pinned SDK, as `.ci/run` installs it.
const INSTALL: &str =
    "python3 -m venv target/test-tools/py && target/test-tools/py/bin/pip install mcp==2.3.0";

pub(crate) fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mcp")
        .join(name)
        .display()
        .to_string()
}

/// The Python of the venv holding the MCP SDK; a clear failure when it is not installed.
fn python() -> PathBuf {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tools/py/bin/python");
    let ok = py.exists()
        && Command::new(&py)
            .args(["-c", "import mcp"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the MCP Python SDK is not installed in target/test-tools/py: run `{INSTALL}` (as .ci/run does)"
    );
    py
}

/// Runs the client script with `transport` arguments and `ops`; the JSON line of each op
/// (after the `connected` line, which is checked to name `version`).
fn client(dir: &TempDir, transport: &[&str], version: &str, ops: Value) -> Vec<Value> {
    let mut cmd = Command::new(python());
    cmd.current_dir(dir.path())
        .arg(fixture("client.py"))
        .args(["--ops", &ops.to_string()])
        .args(transport)
        .env("SWITCHYARD_STORE", "memory")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    let out = run_with_limit(&mut cmd, Duration::from_secs(90));
    assert_eq!(
        out.code(),
        0,
        "the client failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    let mut lines: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a JSON line ({e}): {l}")))
        .collect();
    assert!(!lines.is_empty(), "{out:?}");
    let connected = lines.remove(0);
    assert_eq!(connected["protocol_version"], version, "{connected}");
    assert_eq!(lines.len(), ops.as_array().map_or(0, Vec::len), "{}", out.stdout);
    lines
}

/// `--stdio -- switchyard mcp serve ARGS...`, and `--discover` for the stateless revision.
fn stdio<'a>(args: &[&'a str], stateless: bool) -> Vec<&'a str> {
    let mut t = Vec::new();
    if stateless {
        t.push("--discover");
    }
    t.extend(["--stdio", "--", BIN, "mcp", "serve"]);
    t.extend_from_slice(args);
    t
}

#[test]
fn stdio_serves_each_flow_as_a_tool_with_its_schemas_and_runs_it() {
    let dir = TempDir::new("mcp-stdio");
    let (greet, broken) = (fixture("greet.yaml"), fixture("broken.yaml"));
    let ops = json!([
        {"op": "list"},
        {"op": "call", "name": "greet", "args": {"name": "Ada"}},
        {"op": "call", "name": "broken", "args": {"what": "x"}},
        {"op": "call", "name": "greet", "args": {"name": 7}},
    ]);
    for (stateless, version) in [(false, "2025-11-25"), (true, "2026-07-28")] {
        let lines = client(&dir, &stdio(&[&greet, &broken], stateless), version, ops.clone());
        let tools = lines[0]["tools"].as_array().expect("tools");
        let names: Vec<&str> = tools
            .iter()
            .map(|t| t["name"].as_str().expect("a name"))
            .collect();
        assert_eq!(
            names,
            [
                "greet",
                "broken",
                "switchyard_run_status",
                "switchyard_run_resume"
            ]
        );
        assert_eq!(tools[0]["description"], "Greets a person by name.");
        assert_eq!(
            tools[0]["inputSchema"],
            json!({"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}})
        );
        assert_eq!(
            tools[0]["outputSchema"],
            json!({"type": "object", "required": ["greeting"], "properties": {"greeting": {"type": "string"}}})
        );
        // No `input.schema`: any object; no `output.schema`: no outputSchema.
        assert_eq!(tools[1]["inputSchema"], json!({"type": "object"}));
        assert!(tools[1].get("outputSchema").is_none(), "{}", tools[1]);

        let ok = &lines[1];
        assert_eq!(ok["is_error"], false, "{ok}");
        let output = json!({"name": "Ada", "greeting": "Hello, Ada!"});
        assert_eq!(ok["structured"], output);
        let text: Value = serde_json::from_str(ok["text"][0].as_str().expect("text")).expect("JSON text");
        assert_eq!(text, output, "the text is the same JSON");

        let failed = &lines[2];
        assert_eq!(failed["is_error"], true, "{failed}");
        assert_eq!(failed["structured"]["error"]["kind"], "rejected", "{failed}");
        assert_eq!(failed["structured"]["status"], "failed", "{failed}");
        let text = failed["text"][0].as_str().expect("text");
        assert!(
            text.starts_with("error[rejected]: ") && text.contains("nothing to do for x"),
            "{text}"
        );

        // Input its schema refuses: the run fails, as an error the model can read.
        let bad = &lines[3];
        assert_eq!(bad["is_error"], true, "{bad}");
        assert!(bad["text"][0].as_str().expect("text").contains("name"), "{bad}");
    }
}

#[test]
fn a_run_that_stops_for_a_human_is_answered_by_the_run_tools() {
    let dir = TempDir::new("mcp-interrupt");
    let refund = fixture("refund.yaml");
    let ops = json!([
        {"op": "call", "name": "refund", "args": {"amount": 40}},
        {"op": "call", "name": "switchyard_run_status", "args": {"run_id": "$run_id"}},
        {"op": "call", "name": "switchyard_run_resume", "args": {"run_id": "$run_id", "decision": {"approved": "yes"}}},
        {"op": "call", "name": "switchyard_run_resume", "args": {"run_id": "$run_id", "decision": {"approved": true}}},
        {"op": "call", "name": "switchyard_run_status", "args": {"run_id": "$run_id"}},
        {"op": "call", "name": "switchyard_run_status", "args": {"run_id": "r-none"}},
    ]);
    let lines = client(
        &dir,
        &stdio(&["--store", "sqlite:runs.db", &refund], false),
        "2025-11-25",
        ops,
    );
    let stopped = &lines[0];
    assert_eq!(stopped["is_error"], false, "not an error: {stopped}");
    let id = stopped["structured"]["run_id"]
        .as_str()
        .expect("a run id")
        .to_string();
    assert_eq!(stopped["structured"]["status"], "interrupted");
    let waiting = &stopped["structured"]["waiting_for"];
    assert_eq!(waiting["kind"], "interrupt", "{waiting}");
    assert_eq!(waiting["step"], "approve");
    assert_eq!(waiting["prompt"], "Refund 40?");
    assert_eq!(waiting["schema"]["required"], json!(["approved"]));

    let status = &lines[1]["structured"];
    assert_eq!(status["status"], "interrupted", "{status}");
    assert_eq!(status["waiting_for"], *waiting);

    let refused = &lines[2];
    assert_eq!(refused["is_error"], true, "{refused}");
    let reason = refused["text"][0].as_str().expect("text");
    assert!(reason.contains("does not match the `schema`"), "{reason}");

    let resumed = &lines[3];
    assert_eq!(resumed["is_error"], false, "{resumed}");
    assert_eq!(
        resumed["structured"],
        json!({"amount": 40, "approval": {"approved": true}, "paid": 40})
    );
    let status = &lines[4]["structured"];
    assert_eq!(status["status"], "succeeded", "{status}");
    assert_eq!(status["output"]["paid"], 40);
    assert_eq!(lines[5]["is_error"], true, "{}", lines[5]);

    // Recorded like any run, with its origin; a run of `switchyard run` says `cli`.
    let out = run(switchyard(dir.path()).args([
        "run",
        &fixture("greet.yaml"),
        "--store",
        "sqlite:runs.db",
        "--input",
        r#"{"name": "Cy"}"#,
    ]));
    assert_eq!(out.code(), 0, "{out:?}");
    let out = run(switchyard(dir.path()).args(["runs", "list", "--json", "--store", "sqlite:runs.db"]));
    assert_eq!(out.code(), 0, "{out:?}");
    let runs: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let origin = |flow: &str| {
        runs.iter()
            .find(|r| r["flow"] == flow)
            .unwrap_or_else(|| panic!("a run of {flow}: {runs:?}"))["origin"]
            .clone()
    };
    assert_eq!(origin("refund"), "mcp");
    assert_eq!(origin("greet"), "cli");
    assert!(runs.iter().any(|r| r["id"] == id.as_str()), "{runs:?}");
}

#[test]
fn progress_notifications_name_each_finished_step() {
    let dir = TempDir::new("mcp-progress");
    let steps = fixture("steps.yaml");
    let ops = json!([
        {"op": "call", "name": "steps", "args": {}, "progress": true},
        {"op": "call", "name": "steps", "args": {}},
    ]);
    for (stateless, version) in [(false, "2025-11-25"), (true, "2026-07-28")] {
        let lines = client(&dir, &stdio(&[&steps], stateless), version, ops.clone());
        assert_eq!(lines[0]["is_error"], false, "{}", lines[0]);
        assert_eq!(
            lines[0]["progress"],
            json!([
                {"progress": 1.0, "message": "step `first` succeeded"},
                {"progress": 2.0, "message": "step `second` succeeded"},
                {"progress": 3.0, "message": "step `third` succeeded"},
            ])
        );
        // Not asked for, none sent.
        assert_eq!(lines[1]["progress"], json!([]));
    }
}

/// `mcp serve --http 127.0.0.1:0 ARGS...`, started: the process and its URL (told on stderr).
/// The caller stops it ([`stop`]).
#[allow(clippy::zombie_processes)]
pub(crate) fn serve_http(dir: &TempDir, args: &[&str]) -> (Child, String) {
    let mut child = switchyard(dir.path())
        .args(["mcp", "serve", "--http", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mcp serve starts");
    let mut stderr = BufReader::new(child.stderr.take().expect("piped"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut line = String::new();
    loop {
        line.clear();
        let n = stderr.read_line(&mut line).unwrap_or(0);
        if n == 0 || Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mcp serve said no URL; it said: {line}");
        }
        if let Some(at) = line.find("http://") {
            let url = line[at..].split_whitespace().next().expect("a URL").to_string();
            // Keep draining stderr so the server never blocks on it.
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut stderr, &mut std::io::sink());
            });
            return (child, url);
        }
    }
}

/// A POST of an `initialize` request to `url` with `headers`: the status code.
fn post_status(url: &str, headers: &[(&str, &str)]) -> u16 {
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (authority, path) = rest.split_at(rest.find('/').expect("a path"));
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    let mut stream = std::net::TcpStream::connect(authority).expect("connects");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("a timeout");
    stream.write_all(request.as_bytes()).expect("writes");
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).expect("a status line");
    let line = String::from_utf8_lossy(&head).to_string();
    line[9..12]
        .parse()
        .unwrap_or_else(|_| panic!("a status code: {line}"))
}

pub(crate) fn stop(mut child: Child) -> Option<i32> {
    // SAFETY: signalling a child this test started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = child.try_wait().expect("waits") {
            return s.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("mcp serve did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn http_needs_the_token_and_refuses_other_origins() {
    let dir = TempDir::new("mcp-http");
    dir.write("token", "\n  s3cret-token \n");
    let (greet, refund) = (fixture("greet.yaml"), fixture("refund.yaml"));
    let (server, url) = serve_http(
        &dir,
        &[
            "--token-file",
            "token",
            "--allow-origin",
            "https://app.example.com",
            "--store",
            "sqlite:runs.db",
            &greet,
            &refund,
        ],
    );
    let bearer = ("Authorization", "Bearer s3cret-token");
    assert_eq!(post_status(&url, &[]), 401, "no token");
    assert_eq!(post_status(&url, &[("Authorization", "Bearer wrong")]), 401);
    assert_eq!(
        post_status(&url, &[bearer]),
        200,
        "the token, whitespace around it ignored"
    );
    assert_eq!(
        post_status(&url, &[bearer, ("Origin", "https://evil.example")]),
        403,
        "another origin"
    );
    assert_eq!(
        post_status(&url, &[bearer, ("Origin", "http://localhost:5173")]),
        200
    );
    assert_eq!(
        post_status(&url, &[bearer, ("Origin", "https://app.example.com")]),
        200
    );

    let ops = json!([
        {"op": "list"},
        {"op": "call", "name": "greet", "args": {"name": "Ada"}},
        {"op": "call", "name": "refund", "args": {"amount": 5}},
        {"op": "call", "name": "switchyard_run_resume", "args": {"run_id": "$run_id", "decision": {"approved": false}}},
    ]);
    for (stateless, version) in [(false, "2025-11-25"), (true, "2026-07-28")] {
        let mut transport = vec!["--http", &url, "--token", "s3cret-token"];
        if stateless {
            transport.push("--discover");
        }
        let lines = client(&dir, &transport, version, ops.clone());
        assert_eq!(
            lines[0]["tools"].as_array().map(Vec::len),
            Some(4),
            "{}",
            lines[0]
        );
        assert_eq!(lines[1]["structured"]["greeting"], "Hello, Ada!", "{}", lines[1]);
        assert_eq!(lines[2]["structured"]["status"], "interrupted", "{}", lines[2]);
        assert_eq!(
            lines[3]["structured"],
            json!({"amount": 5, "approval": {"approved": false}}),
            "{}",
            lines[3]
        );
    }
    assert_eq!(stop(server), Some(0), "SIGTERM stops it cleanly");
    let out = run(switchyard(dir.path()).args(["runs", "list", "--json", "--store", "sqlite:runs.db"]));
    let origins: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON")["origin"].clone())
        .collect();
    assert_eq!(origins.len(), 4, "{}", out.stdout);
    assert!(origins.iter().all(|o| o == "mcp"), "{origins:?}");
}

#[test]
fn what_cannot_be_served_is_refused_at_start() {
    let dir = TempDir::new("mcp-refused");
    let greet = fixture("greet.yaml");
    dir.write("bad.yaml", "flow: bad\nsteps:\n  a: {agent: nowhere}\n");
    let out = run(switchyard(dir.path()).args(["mcp", "serve", &greet, "bad.yaml"]));
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("bad.yaml:3:"), "names where: {}", out.stderr);
    assert!(out.stdout.is_empty(), "stdout is the protocol's: {}", out.stdout);

    dir.write("again.yaml", std::fs::read_to_string(&greet).expect("reads"));
    let out = run(switchyard(dir.path()).args(["mcp", "serve", &greet, "again.yaml"]));
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr.contains("two flows are named `greet`") && out.stderr.contains("again.yaml:1:7"),
        "{}",
        out.stderr
    );

    dir.write(
        "status.yaml",
        "flow: switchyard_run_status\nsteps:\n  done: {succeed: {}}\n",
    );
    let out = run(switchyard(dir.path()).args(["mcp", "serve", "status.yaml"]));
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("the name of a tool"), "{}", out.stderr);

    let out = run(switchyard(dir.path()).args(["mcp", "serve", "--http", "0.0.0.0:0", &greet]));
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("--bind"), "{}", out.stderr);
    let out = run(switchyard(dir.path()).args(["mcp", "serve", "--http", "0.0.0.0:0", "--bind", &greet]));
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("--token-file"), "{}", out.stderr);
}

/// One JSON-RPC message as a line on the server's stdin.
fn send(stdin: &mut impl Write, message: Value) {
    writeln!(stdin, "{message}").expect("the server reads");
    stdin.flush().expect("flushes");
}

#[test]
fn a_cancelled_call_cancels_its_run() {
    let dir = TempDir::new("mcp-cancel");
    dir.write(
        "slow.yaml",
        "flow: slow\nagents:\n  wait: {kind: mock, latency: 30s, returns: {ok: true}}\n\
         steps:\n  wait: {agent: wait, output: {$.ok: $.ok}}\n",
    );
    let mut child = switchyard(dir.path())
        .args(["mcp", "serve", "--store", "sqlite:runs.db", "slow.yaml"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("mcp serve starts");
    let mut stdin = child.stdin.take().expect("piped");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
    );
    let mut line = String::new();
    stdout.read_line(&mut line).expect("an answer");
    assert!(line.contains("\"id\":1"), "{line}");
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "slow", "arguments": {}}}),
    );
    // The run is recorded as running; then the client gives up on the call.
    let started = Instant::now();
    let running = loop {
        let out = run(switchyard(dir.path()).args(["runs", "list", "--json", "--store", "sqlite:runs.db"]));
        if let Some(l) = out.stdout.lines().next() {
            break serde_json::from_str::<Value>(l).expect("JSON");
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no run started: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(running["status"], "running", "{running}");
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2, "reason": "user"}}),
    );
    let id = running["id"].as_str().expect("an id").to_string();
    let ended = loop {
        let out =
            run(switchyard(dir.path()).args(["runs", "show", &id, "--json", "--store", "sqlite:runs.db"]));
        let v: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
        if v["run"]["status"] != "running" && !v.is_null() {
            break v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(25),
            "the run was not cancelled: {}",
            out.stdout
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(ended["run"]["status"], "cancelled", "{ended}");
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "before its 30 s step finished"
    );
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("waits").is_none() {
        assert!(
            Instant::now() < deadline,
            "mcp serve did not end when stdin closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_agent_loops_approval_is_answered_by_the_run_tools() {
    let llm = Llm::start();
    llm.script([
        Reply::calls(1, &[("refund", r#"{"amount": 100}"#)]),
        Reply::Answer("Refunded 100.".into()),
    ]);
    let dir = TempDir::new("mcp-approval");
    let paid = dir.path().join("paid");
    dir.write("refunds.yaml", approval_flow(&llm.base_url(), &paid));
    let ops = json!([
        {"op": "call", "name": "refunds", "args": {"text": "refund my order"}},
        {"op": "call", "name": "switchyard_run_resume", "args": {"run_id": "$run_id", "decision": {"approve": "maybe"}}},
        {"op": "call", "name": "switchyard_run_resume", "args": {"run_id": "$run_id", "decision": {"approve": true}}},
    ]);
    let lines = client(
        &dir,
        &stdio(&["--store", "sqlite:runs.db", "refunds.yaml"], false),
        "2025-11-25",
        ops,
    );
    let stopped = &lines[0]["structured"];
    assert_eq!(stopped["status"], "interrupted", "{stopped}");
    let waiting = &stopped["waiting_for"];
    assert_eq!(waiting["kind"], "approval", "{waiting}");
    assert_eq!(waiting["agent"], "agent");
    assert_eq!(waiting["number"], "1.t1.approval");
    assert_eq!(
        waiting["calls"],
        json!([{"id": "call_1_1", "tool": "refund", "arguments": {"amount": 100}}])
    );
    assert_eq!(lines[1]["is_error"], true, "{}", lines[1]);
    assert!(
        lines[1]["text"][0]
            .as_str()
            .expect("text")
            .contains("each decision is"),
        "{}",
        lines[1]
    );
    let done = &lines[2];
    assert_eq!(done["is_error"], false, "{done}");
    assert_eq!(done["structured"]["reply"]["text"], "Refunded 100.", "{done}");
    // Paid once, by the approved call: the refused decision ran nothing.
    let paid = std::fs::read_to_string(&paid).expect("the approved call ran");
    assert_eq!(paid.trim(), r#"{"amount":100}"#);
}

/// A `tools/call` of the stateless revision, posted whole: the response's body.
fn stateless_call(url: &str, token: &str, tool: &str) -> String {
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (authority, path) = rest.split_at(rest.find('/').expect("a path"));
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
    "name": tool, "arguments": {},
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }}})
    .to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: {tool}\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = std::net::TcpStream::connect(authority).expect("connects");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("a timeout");
    stream.write_all(request.as_bytes()).expect("writes");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

#[test]
fn stopping_the_http_server_leaves_the_runs_in_flight_to_resume() {
    let dir = TempDir::new("mcp-stop");
    dir.write("token", "t0k");
    dir.write(
        "slow.yaml",
        "flow: slow\nagents:\n  wait: {kind: mock, latency: 1500ms, returns: {ok: true}}\n\
         steps:\n  first: {agent: wait, output: {$.first: $.ok}, next: second}\n  \
         second: {agent: wait, output: {$.second: $.ok}}\n",
    );
    let (server, url) = serve_http(
        &dir,
        &["--token-file", "token", "--store", "sqlite:runs.db", "slow.yaml"],
    );
    let call = std::thread::spawn(move || stateless_call(&url, "t0k", "slow"));
    let started = Instant::now();
    let id = loop {
        let out = run(switchyard(dir.path()).args(["runs", "list", "--json", "--store", "sqlite:runs.db"]));
        if let Some(l) = out.stdout.lines().next() {
            break serde_json::from_str::<Value>(l).expect("JSON")["id"]
                .as_str()
                .expect("an id")
                .to_string();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no run started: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(stop(server), Some(0), "SIGTERM stops it once the run paused");
    let answer = call.join().expect("the call's thread");
    assert!(
        answer.contains("switchyard_run_resume continues it") && answer.contains("\"isError\":true"),
        "the call is told: {answer}"
    );
    let show = run(switchyard(dir.path()).args(["runs", "show", &id, "--json", "--store", "sqlite:runs.db"]));
    let shown: Value = serde_json::from_str(&show.stdout).expect("JSON");
    assert_eq!(
        shown["run"]["status"], "running",
        "paused, not cancelled: {shown}"
    );
    let out = run(switchyard(dir.path()).args(["resume", &id, "--store", "sqlite:runs.db"]));
    assert_eq!(out.code(), 0, "{out:?}");
    let output: Value = serde_json::from_str(&out.stdout).expect("the output");
    assert_eq!(output, json!({"first": true, "second": true}));
}
