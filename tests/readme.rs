//! The README tells the truth: its example flow lints clean and its tests pass, and the flow
//! its first command runs exists and lints clean.

use std::path::Path;

use crate::support::{TempDir, run, switchyard};

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).expect("README.md")
}

#[test]
fn the_readme_flow_lints_clean_and_its_tests_pass() {
    let text = readme();
    let start = text.find("```yaml\n").expect("the README shows a flow") + "```yaml\n".len();
    let end = start + text[start..].find("```").expect("the block ends");
    let flow = &text[start..end];
    assert!(flow.lines().count() <= 25, "the README flow is short");
    let dir = TempDir::new("readme");
    let file = dir.write("hello.yaml", flow);
    let lint = run(switchyard(dir.path())
        .arg("lint")
        .arg(&file)
        .arg("--deny-warnings"));
    assert_eq!(lint.code(), 0, "{}{}", lint.stdout, lint.stderr);
    let test = run(switchyard(dir.path()).arg("test").arg(&file));
    assert_eq!(test.code(), 0, "{}{}", test.stdout, test.stderr);
    assert!(test.stdout.contains("1 passed, 0 failed"), "{}", test.stdout);
}

#[test]
fn the_first_command_runs_a_real_flow_end_to_end() {
    let text = readme();
    let line = text
        .lines()
        .find(|l| l.contains("switchyard run") && l.starts_with("cargo build"))
        .expect("the first command builds and runs a flow");
    let args: Vec<&str> = line
        .split("switchyard run ")
        .nth(1)
        .expect("run args")
        .splitn(3, ' ')
        .collect();
    let flow = args[0];
    let input = args[2].trim_matches('\'');
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run(switchyard(root).arg("run").arg(flow).arg("--input").arg(input));
    assert_eq!(out.code(), 0, "{}{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("the output is JSON");
    assert_eq!(v["state"], "done", "{v}");
    assert_eq!(v["polls"], 2, "{v}");
}

/// The README's table of `lint --format json` fields names exactly the fields the binary
/// prints, the labels' fields included.
#[test]
fn the_readme_documents_every_json_field() {
    let text = readme();
    let start = text
        .find("| field | what |")
        .expect("the README documents the JSON fields");
    let table = &text[start..text[start..].find("\n\n").map_or(text.len(), |e| start + e)];
    let mut documented = std::collections::BTreeSet::new();
    for row in table.lines().skip(2) {
        let mut cells = row.split('|').skip(1);
        let first = cells.next().expect("a first cell");
        documented.extend(first.split('`').skip(1).step_by(2).map(str::to_owned));
        if first.contains("`labels`") {
            let what = cells.next().expect("a second cell");
            let inner =
                &what[what.find("[{").expect("the labels' fields") + 2..what.find("}]").expect("end")];
            documented.extend(inner.split(", ").map(|f| format!("labels.{f}")));
        }
    }
    let dir = TempDir::new("readme");
    dir.write("flow.yaml", crate::support::ERROR_FLOW);
    let out = run(switchyard(dir.path()).args(["lint", "flow.yaml", "--format", "json"]));
    let raw: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    let first = &raw[0];
    let mut printed: std::collections::BTreeSet<String> =
        first.as_object().expect("an object").keys().cloned().collect();
    printed.extend(
        first["labels"][0]
            .as_object()
            .expect("a label")
            .keys()
            .map(|k| format!("labels.{k}")),
    );
    assert_eq!(documented, printed);
}

/// The README's tour of MCP servers is a whole flow that lints clean (lint starts no server).
#[test]
fn the_readme_mcp_tour_lints_clean() {
    let text = readme();
    let start = text
        .find("```yaml\nflow: mcp-tour\n")
        .expect("the README shows the MCP tour")
        + "```yaml\n".len();
    let end = start + text[start..].find("```").expect("the block ends");
    let dir = TempDir::new("readme-mcp");
    let file = dir.write("tour.yaml", &text[start..end]);
    let lint = run(switchyard(dir.path())
        .arg("lint")
        .arg(&file)
        .arg("--deny-warnings"));
    assert_eq!(lint.code(), 0, "{}{}", lint.stdout, lint.stderr);
}
