//! Streamable HTTP sessions end with the process (SPEC §6.4): the fixture server
//! (`examples/mcp_fixture.rs --legacy --http`, whose `initialize` handshake opens a session)
//! logs each session opened and each one a client closes with `DELETE`.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};

use crate::support::{TempDir, mcp_fixture, run, switchyard};

/// The `session ...` lines of the fixture's log.
fn sessions(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("session "))
        .map(String::from)
        .collect()
}

#[test]
fn run_and_mcp_list_close_their_http_sessions() {
    let dir = TempDir::new("mcp-http-sessions");
    let log = dir.path().join("fixture.log");
    let mut server = Command::new(mcp_fixture())
        .args(["--legacy", "--http", "127.0.0.1:0"])
        .env("MCP_FIXTURE_LOG", &log)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the fixture starts");
    let mut url = String::new();
    BufReader::new(server.stdout.take().expect("piped"))
        .read_line(&mut url)
        .expect("the fixture prints its url");
    dir.write(
        "flow.yaml",
        format!(
            "flow: t\nmcp_servers:\n  web:\n    url: {}\n    tools: [add]\nagents:\n  add: {{kind: mcp, server: web, tool: add}}\nsteps:\n  first: {{agent: add, input: {{$.a: $.a, $.b: $.b}}, output: {{$.sum: $.structured.sum}}}}\n",
            url.trim()
        ),
    );
    let out = run(switchyard(dir.path()).args(["run", "flow.yaml", "--input", r#"{"a": 1, "b": 2}"#]));
    assert_eq!(out.code(), 0, "{out:?}");
    let after_run = sessions(&log);
    let listed = run(switchyard(dir.path()).args(["mcp", "list", "flow.yaml"]));
    let after_list = sessions(&log);
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(listed.code(), 0, "{listed:?}");
    for (lines, what) in [
        (&after_run, "run"),
        (&after_list[after_run.len()..].to_vec(), "mcp list"),
    ] {
        let [opened, closed] = &lines[..] else {
            panic!("{what}: one session opened and closed, got {lines:?}");
        };
        let id = opened.strip_prefix("session opened ").expect("opened first");
        assert!(!id.is_empty(), "{lines:?}");
        assert_eq!(closed, &format!("session closed {id}"), "{what}: {lines:?}");
    }
}
