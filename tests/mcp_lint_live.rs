//! `lint --mcp` (SPEC §6.4) against what the fixture server (`examples/mcp_fixture.rs`)
//! lists: what static lint cannot know about agent loops over a `"*"` server.

use crate::support::{TempDir, mcp_fixture, run, switchyard};

/// A flow whose agent loop `helper` has `tools` and `approve` over the fixture server
/// `fixture` (allowlist `"*"`), beside a mock agent `fixture__echo`.
fn flow(tools: &str, approve: &str) -> String {
    format!(
        r#"flow: lint-live
providers:
  local: {{base_url: "http://127.0.0.1:9/v1"}}
mcp_servers:
  fixture:
    command: ["{fixture}"]
    tools: ["*"]
agents:
  fixture__echo: {{kind: mock, returns: {{}}}}
  helper:
    kind: llm
    provider: local
    model: m1
    prompt: "go"
    tools: {tools}
    approve: {approve}
steps:
  answer: {{agent: helper, output: {{$.reply: $}}}}
"#,
        fixture = mcp_fixture().display()
    )
}

fn lint(dir: &TempDir, live: bool) -> crate::support::Output {
    let mut cmd = switchyard(dir.path());
    cmd.arg("lint");
    if live {
        cmd.arg("--mcp");
    }
    run(cmd.args(["flow.yaml", "--format", "json"]))
}

/// `code line:col message` of each diagnostic.
fn found(out: &crate::support::Output) -> Vec<String> {
    out.diagnostics()
        .iter()
        .map(|d| format!("{} {}:{}:{} {}", d.code, d.file, d.line, d.column, d.message))
        .collect()
}

/// A flow's agent named like a `"*"` server's tool clashes with it only once the server
/// lists the tool: static lint passes, `lint --mcp` names the entry and exits 1.
#[test]
fn lint_mcp_finds_a_loops_clash_with_a_listed_tool() {
    let dir = TempDir::new("mcp-lint-clash");
    dir.write("flow.yaml", flow("[fixture__echo, fixture]", "[]"));
    let out = lint(&dir, false);
    assert_eq!(out.code(), 0, "{out:?}");
    let out = lint(&dir, true);
    assert_eq!(out.code(), 1, "{out:?}");
    let found = found(&out);
    assert!(
        found.iter().any(|d| d.starts_with(
            "SY512 flow.yaml:15:28 agent loop `helper` would offer two tools as `fixture__echo` (the other is offered at flow.yaml:15:13)"
        )),
        "{found:?}"
    );

    // Only the tools the loop takes from the server: no clash.
    dir.write("flow.yaml", flow("[fixture__echo, fixture.add]", "[fixture.add]"));
    let out = lint(&dir, true);
    assert_eq!(out.code(), 0, "{out:?}");
}

/// `tools:` and `approve:` entries naming a tool the server does not list are errors at
/// their own line and column.
#[test]
fn lint_mcp_finds_loop_entries_naming_unlisted_tools() {
    let dir = TempDir::new("mcp-lint-unlisted");
    dir.write(
        "flow.yaml",
        flow("[fixture.ech, fixture]", "[fixture.comit, fixture.*]"),
    );
    let out = lint(&dir, false);
    assert_eq!(out.code(), 0, "{out:?}");
    let out = lint(&dir, true);
    assert_eq!(out.code(), 1, "{out:?}");
    let found = found(&out);
    assert_eq!(
        found,
        [
            "SY514 flow.yaml:15:13 agent loop `helper`: `tools` names `fixture.ech`, but MCP server `fixture` lists no tool `ech`",
            "SY514 flow.yaml:16:15 agent loop `helper`: `approve` names `fixture.comit`, but MCP server `fixture` lists no tool `comit`",
        ]
    );
}

/// `mcp`, `mcp list` and `mcp serve` explain themselves, and `lint --help` tells `--mcp`.
#[test]
fn the_mcp_commands_help_explains_them() {
    let dir = TempDir::new("mcp-help");
    let help = |args: &[&str]| {
        let out = run(switchyard(dir.path()).args(args));
        assert_eq!(out.code(), 0, "{out:?}");
        out.stdout
    };
    let mcp = help(&["mcp", "--help"]);
    assert!(
        mcp.contains("list") && mcp.contains("serve") && mcp.contains("lint --mcp"),
        "{mcp}"
    );
    let list = help(&["mcp", "list", "--help"]);
    assert!(
        list.contains("(not allowed)") && list.contains("Exit status: 0"),
        "{list}"
    );
    let serve = help(&["mcp", "serve", "--help"]);
    assert!(
        serve.contains("switchyard_run_resume") && serve.contains("Exit status: 0"),
        "{serve}"
    );
    let lint = help(&["lint", "--help"]);
    assert!(
        lint.contains("--mcp") && lint.contains("agent loops name"),
        "{lint}"
    );
}
