//! MCP servers as tools (SPEC §6.4): the fixture server (`examples/mcp_fixture.rs`) over
//! stdio and loopback Streamable HTTP, called by `kind: mcp` steps through the binary.

use std::io::{BufRead as _, BufReader, Write as _};
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
