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
