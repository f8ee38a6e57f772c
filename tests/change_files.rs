//! Agent-change files (SPEC §8.4) are checked like flows: a replacement agent's definition goes
//! through the shape checks of a flow's agents (unknown keys, wrong types), reported with file,
//! line, column and code by `lint` and by `run`/`batch --agent-change`, which run nothing.

use crate::support::{TempDir, lint_json, run, switchyard};

const FLOW: &str = "flow: f
agents:
  fetcher:
    kind: mock
    returns: {ok: true}
  shaper:
    kind: transform
    result: {n: 1}
steps:
  fetch:
    agent: fetcher
    output: {$.ok: $.ok}
    next: shape
  shape:
    agent: shaper
    output: {$.n: $.n}
";

/// A misspelt mock key, a duration of the wrong type, an unknown transform key.
const CHANGES: &str = "- scope: root
  mode: replace
  agents:
    fetcher:
      kind: mock
      retruns: {ok: false}
      latency: [1]
    shaper:
      kind: transform
      result: {n: 2}
      reslt: {n: 3}
";

const EXPECTED: [(&str, usize, usize, &str); 3] = [
    ("SY103", 6, 7, "unknown key `retruns` in a `mock` agent"),
    ("SY104", 7, 16, "expected a duration, found a list"),
    ("SY103", 11, 7, "unknown key `reslt` in a `transform` agent"),
];

fn project() -> TempDir {
    let dir = TempDir::new("change-files");
    dir.write("f.yaml", FLOW);
    dir.write("changes.yaml", CHANGES);
    dir.write("in.jsonl", "{\"id\": \"a\"}\n");
    dir
}

#[test]
fn lint_checks_the_agents_of_a_change_file_as_a_flows() {
    let dir = project();
    for args in [&["changes.yaml"][..], &["f.yaml", "changes.yaml"], &["."]] {
        let out = lint_json(dir.path(), args);
        assert_eq!(out.code(), 1, "{args:?}: {out:?}");
        let found: Vec<(String, String, usize, usize, String)> = out
            .diagnostics()
            .into_iter()
            .map(|d| {
                let file = d.file.trim_start_matches("./").to_owned();
                (file, d.code, d.line, d.column, d.message)
            })
            .collect();
        let want: Vec<(String, String, usize, usize, String)> = EXPECTED
            .iter()
            .map(|(c, l, col, m)| ("changes.yaml".into(), (*c).into(), *l, *col, (*m).into()))
            .collect();
        assert_eq!(found, want, "{args:?}");
    }
}

#[test]
fn run_and_batch_refuse_a_change_file_with_misshapen_agents_before_anything_runs() {
    let dir = project();
    let runs = [
        run(switchyard(dir.path()).args([
            "run",
            "f.yaml",
            "--agent-change",
            "changes.yaml",
            "--input",
            "{}",
        ])),
        run(switchyard(dir.path()).args([
            "batch",
            "f.yaml",
            "--agent-change",
            "changes.yaml",
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
        ])),
    ];
    for out in runs {
        assert_eq!(out.code(), 2, "{out:?}");
        assert_eq!(out.stdout, "", "nothing ran");
        for (code, line, column, message) in EXPECTED {
            let want = format!("changes.yaml:{line}:{column}: {message}");
            assert!(
                out.stderr
                    .lines()
                    .any(|l| l.contains(&want) && l.ends_with(&format!("[{code}]"))),
                "{want} [{code}]\n{}",
                out.stderr
            );
        }
    }
    assert!(!dir.path().join("out.jsonl").exists(), "the batch wrote nothing");
}
