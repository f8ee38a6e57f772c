//! A flow bundle holds what a `command` needs beyond the files it names (SPEC §12): a Python
//! tool importing a sibling module runs on a worker when the agent lists `bundle:`
//! patterns, `submit` warns of the sibling when it does not, and `lint` names a pattern that
//! matches nothing or leaves the project root.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use crate::cluster::{Pg, log_of, spawn_worker, wait_exit};
use crate::support::{TempDir, lint_json, run_with_limit, switchyard};

fn flow(bundle: &str) -> String {
    format!(
        "flow: scored\nagents:\n  score:\n    kind: command\n    run: [python3, tools/score.py]\n{bundle}\
         steps:\n  s:\n    agent: score\n    input: {{$.text: $.text}}\n    output: {{$.score: $.score}}\n"
    )
}

fn project(dir: &TempDir) {
    dir.write(
        "project/tools/score.py",
        "import json, sys\nfrom helpers import score\nprint(json.dumps({\"score\": score(json.load(sys.stdin)[\"text\"])}))\n",
    );
    dir.write(
        "project/tools/helpers.py",
        "def score(text):\n    return len(text) * 2\n",
    );
    dir.write("project/listed.yaml", flow("    bundle: [tools/*.py]\n"));
    dir.write("project/unlisted.yaml", flow(""));
    dir.write(
        "project/in.jsonl",
        "{\"id\": \"a\", \"text\": \"hey\"}\n{\"id\": \"b\", \"text\": \"hello\"}\n",
    );
}

fn submit(dir: &TempDir, flow: &str, url: &str, batch: &str) -> crate::support::Output {
    let project = dir.path().join("project");
    // A bundle may hold a program of tens of megabytes (the MCP fixture): its upload is given
    // a minute on a loaded machine rather than the usual limit.
    run_with_limit(
        switchyard(&project)
            .args([
                "submit", flow, "--input", "in.jsonl", "--batch", batch, "--store", url, "--root",
            ])
            .arg(&project),
        Duration::from_secs(60),
    )
}

#[test]
fn a_command_importing_a_sibling_module_runs_on_a_worker_when_its_bundle_lists_it() {
    let pg = Pg::new("bundle_glob");
    let dir = TempDir::new("cluster-bundle-glob");
    project(&dir);
    let url = pg.url("sy_bundle_glob");
    let listed = submit(&dir, "listed.yaml", &url, "listed");
    assert_eq!(listed.code(), 0, "{}", listed.stderr);
    assert!(!listed.stderr.contains("lacks"), "{}", listed.stderr);
    // Without `bundle:`, the sibling is named before anything runs.
    let unlisted = submit(&dir, "unlisted.yaml", &url, "unlisted");
    assert_eq!(unlisted.code(), 0, "{}", unlisted.stderr);
    assert!(
        unlisted
            .stderr
            .contains("warning: agent `score`: the bundle lacks `tools/helpers.py` beside what it runs"),
        "{}",
        unlisted.stderr
    );
    pg.query("DELETE FROM runs WHERE head IN (SELECT id FROM run_heads WHERE batch = 'unlisted')");
    // The project is gone and the worker runs elsewhere: it has only the store.
    std::fs::remove_dir_all(dir.path().join("project")).expect("remove the project");
    let mut w = spawn_worker(&dir, &url, "w", &["--exit-when-idle"]);
    assert!(
        wait_exit(&mut w, Duration::from_secs(60), "the worker").success(),
        "{}",
        log_of(&dir, "w")
    );
    let rows = pg.query("SELECT item_id, status, output FROM run_records WHERE batch = 'listed'");
    let outputs: HashMap<String, Value> = rows
        .iter()
        .map(|r| {
            assert_eq!(
                r["status"].as_deref(),
                Some("succeeded"),
                "{rows:?}\n{}",
                log_of(&dir, "w")
            );
            (
                r["item_id"].clone().expect("an item"),
                serde_json::from_str(r["output"].as_deref().expect("output")).expect("JSON"),
            )
        })
        .collect();
    assert_eq!(outputs["a"]["score"], 6);
    assert_eq!(outputs["b"]["score"], 10);
}

#[test]
fn a_bundle_pattern_that_matches_nothing_or_leaves_the_root_is_a_lint_error() {
    let dir = TempDir::new("bundle-lint");
    project(&dir);
    dir.write(
        "project/bad.yaml",
        flow("    bundle: [tools/*.rs, ../outside/*.py, tools/*.py]\n"),
    );
    let out = lint_json(&dir.path().join("project"), &["bad.yaml", "--root", "."]);
    assert_eq!(out.code(), 1, "{out:?}");
    let found: Vec<(String, usize, usize, String)> = out
        .diagnostics()
        .into_iter()
        .map(|d| (d.code, d.line, d.column, d.message))
        .collect();
    assert_eq!(
        found,
        [
            (
                "SY210".into(),
                6,
                14,
                "`bundle` pattern `tools/*.rs` matches no file".into()
            ),
            (
                "SY209".into(),
                6,
                26,
                "`bundle` pattern `../outside/*.py` leaves the project root".into()
            ),
        ],
        "{}",
        out.stdout
    );
}

/// A stdio MCP server whose program sits in the project (`command: [./bin/fixture]`) goes in
/// the bundle like a command's script: a worker with only the store starts it from there, once
/// for the whole batch, and leaves it running nowhere.
#[test]
fn an_mcp_server_program_in_the_project_runs_on_a_worker_from_the_bundle() {
    let pg = Pg::new("bundle_mcp");
    let dir = TempDir::new("cluster-bundle-mcp");
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join("bin")).expect("project dir");
    std::fs::copy(crate::support::mcp_fixture(), project.join("bin/fixture")).expect("copy the fixture");
    let pids = dir.path().join("pids");
    dir.write(
        "project/served.yaml",
        format!(
            "flow: served\nmcp_servers:\n  fx:\n    command: [./bin/fixture]\n    env: {{MCP_FIXTURE_PIDS: \"{}\"}}\n    tools: [add]\n\
             agents:\n  add: {{kind: mcp, server: fx, tool: add}}\n\
             steps:\n  s: {{agent: add, input: {{$.a: $.a, $.b: $.b}}, output: {{$.sum: $.structured.sum}}}}\n",
            pids.display()
        ),
    );
    let lines: String = (0..40)
        .map(|i| format!("{{\"id\": \"i{i}\", \"a\": {i}, \"b\": 1}}\n"))
        .collect();
    dir.write("project/in.jsonl", lines);
    let url = pg.url("sy_bundle_mcp");
    let submitted = submit(&dir, "served.yaml", &url, "served");
    assert_eq!(submitted.code(), 0, "{}", submitted.stderr);
    std::fs::remove_dir_all(&project).expect("remove the project");
    let mut w = spawn_worker(&dir, &url, "w", &["--exit-when-idle"]);
    assert!(
        wait_exit(&mut w, Duration::from_secs(60), "the worker").success(),
        "{}",
        log_of(&dir, "w")
    );
    let rows = pg.query("SELECT item_id, status, output FROM run_records WHERE batch = 'served'");
    assert_eq!(rows.len(), 40);
    for r in &rows {
        assert_eq!(
            r["status"].as_deref(),
            Some("succeeded"),
            "{r:?}\n{}",
            log_of(&dir, "w")
        );
        let out: Value = serde_json::from_str(r["output"].as_deref().expect("output")).expect("JSON");
        let i: i64 = r["item_id"].as_deref().expect("item")[1..]
            .parse()
            .expect("number");
        assert_eq!(out["sum"], i + 1, "{out}");
    }
    let started = crate::support::fixture_pids(&pids);
    assert_eq!(started.len(), 1, "one server for the worker: {started:?}");
    assert!(
        !crate::support::process_alive(started[0]),
        "the server outlived its worker"
    );
}
