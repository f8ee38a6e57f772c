//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned, run by the
//! Node.js 22 that `.ci/run` installs into `target/test-tools/node22`) against `switchyard mcp
//! serve --http`, serving the flows of `tests/fixtures/mcp/conformance/`, named after the tools
//! the suite calls. The scenarios that do not apply to a server of tools only are listed, each
//! with why, in `expected-failures.yml` beside them: the suite fails on any other failure, and
//! on a listed scenario that passes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::mcp_serve::{fixture, serve_http, stop};
use crate::support::{TempDir, run_with_limit};

const INSTALL: &str =
    "npm install --prefix target/test-tools/node22 node@22.23.3 @modelcontextprotocol/conformance@0.1.16";

/// Node.js 22 and the suite's entry point; a clear failure when they are not installed.
fn suite() -> (PathBuf, PathBuf) {
    let modules = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tools/node22/node_modules");
    let node = modules.join(".bin/node");
    let entry = modules.join("@modelcontextprotocol/conformance/dist/index.js");
    assert!(
        node.exists() && entry.exists(),
        "the MCP conformance suite is not installed in target/test-tools/node22: run `{INSTALL}` (as .ci/run does)"
    );
    (node, entry)
}

#[test]
fn the_official_conformance_suite_passes_every_scenario_of_a_tools_server() {
    let (node, entry) = suite();
    let dir = TempDir::new("mcp-conformance");
    let flows: Vec<String> = [
        "test_simple_text",
        "test_error_handling",
        "test_tool_with_progress",
        "test_reconnection",
        "json_schema_2020_12_tool",
    ]
    .iter()
    .map(|f| fixture(&format!("conformance/{f}.yaml")))
    .collect();
    let mut args = vec!["--store", "sqlite:runs.db"];
    args.extend(flows.iter().map(String::as_str));
    let (server, url) = serve_http(&dir, &args);
    let conformance = |extra: &[&str]| {
        let mut cmd = Command::new(&node);
        cmd.current_dir(dir.path())
            .arg(&entry)
            .args(["server", "--url", &url, "-o", "results"])
            .args(extra)
            .env("NO_COLOR", "1");
        run_with_limit(&mut cmd, Duration::from_secs(240))
    };
    // The active suite, with the scenarios that do not apply expected to fail.
    let baseline = fixture("conformance/expected-failures.yml");
    let out = conformance(&["--expected-failures", &baseline]);
    assert_eq!(out.code(), 0, "{}\n{}", out.stdout, out.stderr);
    for passes in [
        "server-initialize",
        "ping",
        "tools-list",
        "tools-call-simple-text",
        "tools-call-error",
        "tools-call-with-progress",
        "server-sse-multiple-streams",
        "dns-rebinding-protection",
    ] {
        assert!(
            out.stdout.contains(&format!("✓ {passes}:")),
            "{passes} passes:\n{}",
            out.stdout
        );
    }
    // Scenarios outside the active suite that apply.
    for scenario in ["json-schema-2020-12", "server-sse-polling"] {
        let out = conformance(&["--scenario", scenario]);
        assert_eq!(out.code(), 0, "{scenario}:\n{}\n{}", out.stdout, out.stderr);
        assert!(out.stdout.contains(" 0 failed"), "{scenario}:\n{}", out.stdout);
    }
    assert_eq!(stop(server), Some(0));
}
