//! `switchyard test` (SPEC §11) over flows with MCP servers (SPEC §6.4): a flow test starts
//! no server. A mocked `kind: mcp` agent needs none; a mock standing in for a loop's model is
//! offered none of its servers' tools, and a call of one fails the test as not mocked.

use crate::support::{TempDir, run, switchyard};

const FLOW: &str = r#"flow: t
providers:
  local: {base_url: "http://127.0.0.1:9/v1"}
mcp_servers:
  gone:
    command: [./no-such-server]
    tools: ["*"]
agents:
  call: {kind: mcp, server: gone, tool: x}
  helper: {kind: llm, provider: local, model: m, prompt: go, tools: [gone]}
steps:
  first: {agent: call, input: {}, output: {$.x: $}, next: second}
  second: {agent: helper, input: {}, output: {$.y: $}}
tests:
  - name: the mcp agent mocked
    mocks:
      call: {returns: {structured: 1}}
      helper: {returns: done}
    expect:
      output: {x: {structured: 1}, y: done}
      calls: {call: 1, helper: 1}
  - name: a loop over the server
    mocks:
      call: {returns: {structured: 1}}
      helper: {sequence: [{tool_calls: [{name: gone__x, arguments: {}}]}, done]}
    expect:
      output: {y: done}
"#;

#[test]
fn a_flow_test_starts_no_mcp_server() {
    let dir = TempDir::new("mcp-flow-tests");
    dir.write("flow.yaml", FLOW);
    let out = run(switchyard(dir.path()).args(["test", "flow.yaml"]));
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(
        out.stdout.contains("ok     flow.yaml :: the mcp agent mocked"),
        "{out:?}"
    );
    assert!(
        out.stdout.contains("FAILED flow.yaml :: a loop over the server")
            && out
                .stdout
                .contains("agent `gone__x` was called but is not mocked"),
        "{out:?}"
    );
    assert!(out.stdout.contains("1 passed, 1 failed"), "{out:?}");
}

/// The repository's MCP example flow lints clean and its tests pass without its server
/// (`uvx mcp-server-git`) being started.
#[test]
fn the_release_notes_flow_lints_and_tests_without_its_server() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let lint = run(switchyard(root).args(["lint", "flows/release-notes.yaml"]));
    assert_eq!(lint.code(), 0, "{lint:?}");
    let out = run(switchyard(root)
        .args(["test", "flows/release-notes.yaml"])
        .env("PATH", "/nonexistent"));
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(out.stdout.contains("1 passed, 0 failed"), "{out:?}");
}
