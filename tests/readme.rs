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
