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
        run(switchyard(self.path()).env("SWITCHYARD_STORE", "sqlite:runs.db").args(args))
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
    assert!(!page.stdout.contains("not finished"), "the page shows no open step");
}
