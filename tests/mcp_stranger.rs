//! MCP features where they meet the rest of the tool: a plain `mcp` step's approval in
//! `runs show` and the run page, bad server definitions, and the budget of a loop of MCP tools.

use std::path::{Path, PathBuf};

use crate::support::*;

/// A directory with a flow whose `fx` server is the fixture over stdio.
struct Fx {
    dir: TempDir,
    log: PathBuf,
}

impl Fx {
    fn new(tag: &str) -> Fx {
        let dir = TempDir::new(tag);
        let log = dir.path().join("calls.log");
        Fx { dir, log }
    }

    /// Writes `flow.yaml`: the `fx` server (with `extra` lines) and `rest`.
    fn flow(&self, extra: &str, rest: &str) -> PathBuf {
        self.dir.write(
            "flow.yaml",
            format!(
                "flow: stranger\nmcp_servers:\n  fx:\n    command: [\"{}\"]\n    env: {{MCP_FIXTURE_LOG: \"{}\"}}\n    tools: [\"*\"]\n{extra}{rest}",
                mcp_fixture().display(),
                self.log.display()
            ),
        )
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn sy(&self, args: &[&str]) -> Output {
        run(switchyard(self.path())
            .env("SWITCHYARD_STORE", "sqlite:runs.db")
            .args(args))
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }
}

/// A plain step's approval (`1.approval`) is shown under its step, in `runs show` and on the
/// run page, before and after the decision: not as the loop of a step that never finished.
#[test]
fn a_plain_steps_approval_is_shown_under_its_step() {
    let fx = Fx::new("mcp-plain-approval-show");
    fx.flow(
        "    approve: [echo]\n",
        "agents:\n  call: {kind: mcp, server: fx, tool: echo}\nsteps:\n  first:\n    agent: call\n    input: {$.text: {value: hi}}\n    output: {$.out: $.content}\n",
    );
    let out = fx.sy(&["run", "flow.yaml", "--input", "{}"]);
    assert_eq!(out.code(), 3, "{}", out.stderr);
    let id = run_id_from(&out.stderr);
    let shown = fx.sy(&["runs", "show", &id]);
    assert!(shown.stdout.contains("1.approval"), "{}", shown.stdout);
    assert!(!shown.stdout.contains("not finished"), "{}", shown.stdout);
    let page = fx.sy(&["runs", "show", &id, "--format", "html"]);
    assert!(
        page.stdout
            .contains("Waiting for approval of the call a step proposed"),
        "the page asks for what the step waits for"
    );
    let out = fx.sy(&["resume", &id, "--decision", r#"{"approve": true}"#]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(fx.calls(), ["call echo"]);
    let shown = fx.sy(&["runs", "show", &id]);
    assert!(!shown.stdout.contains("not finished"), "{}", shown.stdout);
    // The approval comes right under its step's line.
    let lines: Vec<&str> = shown.stdout.lines().collect();
    let step = lines
        .iter()
        .position(|l| l.contains("1 first [agent]"))
        .unwrap_or_else(|| panic!("{}", shown.stdout));
    assert!(
        lines[step + 1..].iter().take(3).any(|l| l.contains("1.approval")),
        "{}",
        shown.stdout
    );
    let page = fx.sy(&["runs", "show", &id, "--format", "html"]);
    assert_eq!(page.code(), 0, "{}", page.stderr);
    assert!(
        !page.stdout.contains("not finished"),
        "the page shows no open step"
    );
}

/// A flow whose server `name` is `server` (its definition's lines) and one step calling its
/// `echo`.
fn echo_flow(server: &str) -> String {
    format!(
        "flow: stranger\nmcp_servers:\n  fx:\n{server}    tools: [echo]\nagents:\n  call: {{kind: mcp, server: fx, tool: echo}}\nsteps:\n  first: {{agent: call, input: {{$.text: {{value: hi}}}}, output: {{$.out: $.content}}}}\n"
    )
}

/// A server that exits at once is started once per call, not once to see whether the call
/// needs approval and again to make it; after a few failed starts a batch's calls fail
/// without starting it again.
#[test]
fn a_server_that_cannot_start_is_started_once_per_call_and_then_given_up() {
    let dir = TempDir::new("mcp-start-fails");
    let starts = dir.path().join("starts");
    dir.write(
        "flow.yaml",
        echo_flow(&format!(
            "    command: [sh, -c, 'echo started >> \"{}\"; echo not-json; exit 1']\n",
            starts.display()
        )),
    );
    let count = || {
        std::fs::read_to_string(&starts)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let out = run(switchyard(dir.path()).args(["run", "flow.yaml", "--input", "{}"]));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("MCP server `fx` could not be started"),
        "{}",
        out.stderr
    );
    assert_eq!(count(), 1, "started once");
    std::fs::remove_file(&starts).expect("the starts file");
    let input: String = (1..=12).map(|i| format!("{{\"id\": {i}}}\n")).collect();
    dir.write("in.jsonl", input);
    let out = run(switchyard(dir.path()).args([
        "batch",
        "flow.yaml",
        "--input",
        "in.jsonl",
        "--output",
        "out.jsonl",
        "--concurrency",
        "1",
    ]));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(count(), 4, "a first start and three more, then given up");
    let lines = std::fs::read_to_string(dir.path().join("out.jsonl")).expect("the output");
    assert_eq!(lines.lines().count(), 12);
    assert!(
        lines
            .lines()
            .last()
            .is_some_and(|l| l.contains("failed to start 4 times")),
        "{lines}"
    );
}

/// An HTTP server that refuses the connection is named with the cause in words: no type
/// names of the SDK, and none of its own log lines.
#[test]
fn a_refused_http_server_is_named_with_its_cause() {
    let dir = TempDir::new("mcp-refused");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    dir.write(
        "flow.yaml",
        echo_flow(&format!("    url: http://127.0.0.1:{port}/mcp\n")),
    );
    let out = run(switchyard(dir.path()).args(["run", "flow.yaml", "--input", "{}"]));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("MCP server `fx` could not be started")
            && out.stderr.contains("Connection refused"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("rmcp"), "{}", out.stderr);
    assert!(!out.stderr.contains("ERROR"), "{}", out.stderr);
}

/// An agent loop's MCP server is started (to list its tools) whenever the loop starts: a
/// secret its `env:` needs is checked before the run, like a plain step's, not at the first
/// turn.
#[test]
fn a_loops_server_secret_that_is_not_set_refuses_the_run() {
    let dir = TempDir::new("mcp-loop-secret");
    dir.write(
        "flow.yaml",
        format!(
            "flow: stranger\nproviders:\n  local: {{base_url: \"http://127.0.0.1:9/v1\"}}\nmcp_servers:\n  fx:\n    command: [\"{}\"]\n    env: {{TOKEN: \"${{env:SY_STRANGER_SURELY_UNSET}}\"}}\n    tools: [\"*\"]\nagents:\n  helper: {{kind: llm, provider: local, model: m1, prompt: go, tools: [fx]}}\nsteps:\n  answer: {{agent: helper, output: {{$.reply: $}}}}\n",
            mcp_fixture().display()
        ),
    );
    let out = run(switchyard(dir.path())
        .env_remove("SY_STRANGER_SURELY_UNSET")
        .args(["run", "flow.yaml", "--input", "{}"]));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "environment variable SY_STRANGER_SURELY_UNSET is not set, needed by `env.TOKEN` of MCP server `fx` in flow `stranger`"
        ),
        "{}",
        out.stderr
    );
}

/// `tools/call` of `tool` with `arguments` over the stateless revision, to `url`: the raw
/// HTTP response (empty if the server went away first).
fn stateless_call(url: &str, tool: &str, arguments: &str) -> String {
    use std::io::{Read as _, Write as _};
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (authority, path) = rest.split_at(rest.find('/').expect("a path"));
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{{"name":"t","version":"1"}},"io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
    );
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: {tool}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let Ok(mut stream) = std::net::TcpStream::connect(authority) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(60)));
    let _ = stream.write_all(request.as_bytes());
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

/// `mcp serve --http` of a flow that itself calls an MCP server, quit at once by a second
/// Ctrl-C while that server's call is in flight: the server ends with it, and the run is
/// left for `resume` (in doubt: its call may have had its effect).
#[test]
fn a_served_flow_quit_mid_call_leaves_no_server_and_resumes() {
    let dir = TempDir::new("mcp-serve-nested-quit");
    let (pids, log) = (dir.path().join("pids"), dir.path().join("calls.log"));
    dir.write(
        "nest.yaml",
        format!(
            "flow: nest\nmcp_servers:\n  fx:\n    command: [\"{}\"]\n    env: {{MCP_FIXTURE_PIDS: \"{}\", MCP_FIXTURE_LOG: \"{}\"}}\n    tools: [slow, add]\nagents:\n  slow: {{kind: mcp, server: fx, tool: slow}}\n  add: {{kind: mcp, server: fx, tool: add}}\nsteps:\n  wait: {{agent: slow, input: {{$.ms: $.ms}}, output: {{}}, next: sum}}\n  sum: {{agent: add, input: {{$.a: $.a, $.b: $.b}}, output: {{$.sum: $.structured.sum}}}}\n",
            mcp_fixture().display(),
            pids.display(),
            log.display()
        ),
    );
    let (mut server, url) = crate::mcp_serve::serve_http(&dir, &["--store", "sqlite:runs.db", "nest.yaml"]);
    let call = std::thread::spawn(move || stateless_call(&url, "nest", r#"{"a": 1, "b": 2, "ms": 5000}"#));
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("call slow")
    {
        assert!(
            started.elapsed().as_secs() < 20,
            "the slow call never reached the server"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for _ in 0..2 {
        // SAFETY: signalling a child this test started.
        unsafe {
            libc::kill(server.id() as i32, libc::SIGINT);
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let status = server.wait().expect("mcp serve exits");
    assert_eq!(status.code(), Some(130), "quit at once");
    let _ = call.join();
    let started = fixture_pids(&pids);
    assert_eq!(started.len(), 1, "{started:?}");
    // Well before its 5 s call would have ended by itself.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while process_alive(started[0]) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!process_alive(started[0]), "the server outlived mcp serve");
    let sy = |args: &[&str]| {
        run(switchyard(dir.path())
            .args(args)
            .args(["--store", "sqlite:runs.db"]))
    };
    let listed = sy(&["runs", "list", "--json"]);
    let id = serde_json::from_str::<serde_json::Value>(listed.stdout.lines().next().unwrap_or("{}"))
        .ok()
        .and_then(|v| v["id"].as_str().map(String::from))
        .unwrap_or_else(|| panic!("a run: {}", listed.stdout));
    let out = sy(&["resume", &id]);
    assert_eq!(out.code(), 3, "in doubt: {}", out.stderr);
    assert!(out.stderr.contains("in_doubt"), "{}", out.stderr);
    let out = sy(&["resume", &id, "--retry-in-doubt"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(out.stdout.contains("\"sum\": 3"), "{}", out.stdout);
}

/// A plain step that waited for approval keeps its whole `retry`: the stop to ask was no
/// attempt that failed.
#[test]
fn a_step_that_waited_for_approval_keeps_its_retries() {
    let fx = Fx::new("mcp-approval-retry");
    fx.flow(
        "    approve: [fail]\n",
        "agents:\n  call: {kind: mcp, server: fx, tool: fail}\nsteps:\n  first:\n    agent: call\n    input: {}\n    output: {}\n    retry: {attempts: 2, backoff: 10ms, on: [agent]}\n",
    );
    let out = fx.sy(&["run", "flow.yaml", "--input", "{}"]);
    assert_eq!(out.code(), 3, "{}", out.stderr);
    assert!(fx.calls().is_empty(), "{:?}", fx.calls());
    let id = run_id_from(&out.stderr);
    let out = fx.sy(&["resume", &id, "--decision", r#"{"approve": true}"#]);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("failed on purpose"), "{}", out.stderr);
    assert_eq!(fx.calls(), ["call fail", "call fail"], "the call and its retry");
}

/// A `foreach` whose iterations each wait for the approval of their call: the call `run`
/// names is the one `resume --decision` decides, every time.
#[test]
fn the_approval_run_names_is_the_one_resume_decides() {
    for round in 0..4 {
        let fx = Fx::new("mcp-foreach-approval");
        fx.flow(
            "    approve: [echo]\n",
            "agents:\n  call: {kind: mcp, server: fx, tool: echo}\nsteps:\n  each:\n    foreach: $.items\n    as: it\n    concurrency: 3\n    agent: call\n    input: {$.text: =it}\n    output: {$.out: $}\n",
        );
        let out = fx.sy(&["run", "flow.yaml", "--input", r#"{"items": ["a", "b", "c"]}"#]);
        assert_eq!(out.code(), 3, "{}", out.stderr);
        let id = run_id_from(&out.stderr);
        let named = ["a", "b", "c"]
            .into_iter()
            .find(|t| out.stderr.contains(&format!(r#"fx.echo {{"text":"{t}"}}"#)))
            .unwrap_or_else(|| panic!("names a call: {}", out.stderr));
        let out = fx.sy(&["resume", &id, "--decision", r#"{"edit": {"text": "edited"}}"#]);
        assert_eq!(out.code(), 3, "{}", out.stderr);
        let shown = fx.sy(&["runs", "show", &id, "--json"]);
        let shown: serde_json::Value = serde_json::from_str(&shown.stdout).expect("JSON");
        let decided: Vec<&serde_json::Value> = shown["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .filter(|s| s["kind"] == "approval" && s["status"] == "succeeded")
            .collect();
        assert_eq!(decided.len(), 1, "round {round}: {shown}");
        let iteration = ["a", "b", "c"].iter().position(|t| *t == named).expect("an item");
        assert_eq!(
            decided[0]["number"],
            format!("1[{iteration}].approval"),
            "round {round}: `run` named `{named}`"
        );
    }
}

/// A stdio client that closes stdin with a call in flight has gone: `mcp serve` cancels that
/// call's run at once, records it `cancelled` and exits 0, rather than letting it run on for
/// the SDK's drain and leaving it `running` when the process ends.
#[test]
fn a_stdio_client_gone_mid_call_cancels_its_run() {
    use std::io::Write as _;
    let dir = TempDir::new("mcp-serve-gone");
    dir.write(
        "slow.yaml",
        "flow: slow\ndescription: waits\nagents:\n  wait: {kind: mock, latency: 20s, returns: {ok: true}}\nsteps:\n  w: {agent: wait, output: {$.r: $}}\n",
    );
    let mut child = switchyard(dir.path())
        .args(["mcp", "serve", "slow.yaml", "--store", "sqlite:runs.db"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("mcp serve starts");
    let mut stdin = child.stdin.take().expect("stdin");
    for line in [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow","arguments":{}}}"#,
    ] {
        writeln!(stdin, "{line}").expect("write to mcp serve");
    }
    stdin.flush().expect("flush");
    // The run is under way before the client goes.
    let started = std::time::Instant::now();
    // `runs list --json`: one run per line.
    let runs = || -> Vec<serde_json::Value> {
        let out = run(switchyard(dir.path()).args(["runs", "list", "--json", "--store", "sqlite:runs.db"]));
        out.stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    while runs().is_empty() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "no run started"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    drop(stdin);
    let gone = std::time::Instant::now();
    let status = child.wait().expect("mcp serve exits");
    assert!(status.success(), "{status:?}");
    assert!(
        gone.elapsed() < std::time::Duration::from_secs(4),
        "mcp serve took {:?} after the client went (the SDK's drain is 5 s)",
        gone.elapsed()
    );
    let runs = runs();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["status"], "cancelled", "{runs:?}");
    assert_eq!(runs[0]["origin"], "mcp", "{runs:?}");
}
