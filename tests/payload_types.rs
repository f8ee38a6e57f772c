//! The payload's type flowing through the graph (SPEC §5.1): the repository's flows stay clean
//! and catch typos, flows without schemas get no reports, and graphs with cycles terminate.
//! The rules' own cases are the lint fixtures `unknown-payload-field`, `maybe-absent-field`
//! and `source-never-matches`.

use std::path::Path;

use crate::support::{self, TempDir};

const TYPE_CODES: &[&str] = &["SY412", "SY413", "SY414"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_flows_and_examples_lint_clean_with_the_type_flow() {
    let out = support::lint_json(root(), &["flows", "examples"]);
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(out.diagnostics(), Vec::new());
}

/// Copies `flows/` into a temp dir, with `edit` applied to one flow's text.
fn flows_with(file: &str, from: &str, to: &str) -> TempDir {
    let dir = TempDir::new("payload-types");
    copy_dir(&root().join("flows"), &dir.path().join("flows"));
    let path = dir.path().join("flows").join(file);
    let text = std::fs::read_to_string(&path).expect("read the flow");
    assert!(text.contains(from), "`{from}` is not in {file}");
    std::fs::write(&path, text.replacen(from, to, 1)).expect("write the flow");
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create a directory");
    for entry in std::fs::read_dir(from).expect("read a directory") {
        let entry = entry.expect("a directory entry");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

#[test]
fn a_typo_in_a_real_flow_is_caught_where_it_is_written() {
    let cases = [
        (
            "ticket-triage.yaml",
            "=payload.ticket.priority == \"p1\"",
            "=payload.ticket.priorty == \"p1\"",
            "SY412",
            "`payload.ticket` has no field `priorty` on any path to here",
            "did you mean `priority`?",
        ),
        (
            "document-extraction.yaml",
            "$.title: $.document.title",
            "$.title: $.document.titel",
            "SY414",
            "`$.document.titel` can never match the payload here: `$.document` has no field `titel`",
            "did you mean `title`?",
        ),
        (
            "job-polling.yaml",
            "$.job.progress: $.progress",
            "$.job.progress: $.progres",
            "SY414",
            "`$.progres` can never match the result of `poll`: `$` has no field `progres`",
            "did you mean `progress`?",
        ),
        (
            "job-polling.yaml",
            "select: $.job",
            "select: $.jobs",
            "SY414",
            "`$.jobs` can never match the final payload: `$` has no field `jobs`",
            "did you mean `job`?",
        ),
    ];
    for (file, from, to, code, message, help) in cases {
        let dir = flows_with(file, from, to);
        let out = support::lint_json(dir.path(), &[&format!("flows/{file}")]);
        let diags = out.diagnostics();
        assert_eq!(out.code(), 1, "{file}: {diags:#?}");
        let [d] = diags.as_slice() else {
            panic!("{file}: one diagnostic expected: {diags:#?}")
        };
        assert_eq!(
            (d.code.as_str(), d.message.as_str(), d.help.as_deref()),
            (code, message, Some(help)),
            "{file}"
        );
        // At the typo itself.
        let text = std::fs::read_to_string(dir.path().join("flows").join(file)).expect("read");
        let line = text.lines().nth(d.line - 1).expect("the line");
        let shown: String = line
            .chars()
            .skip(d.column - 1)
            .take(d.end_column - d.column)
            .collect();
        let written = to.split(": ").last().expect("a source").trim_start_matches('=');
        assert!(
            written.starts_with(shown.as_str()) && !shown.is_empty(),
            "{file}: the span shows `{shown}`, not the start of `{written}`"
        );
    }
}

/// Every runtime fixture: none of them declares what would make the type checks fire, so
/// none may get one of their reports.
#[test]
fn flows_without_schemas_get_no_type_reports() {
    let dir = root().join("tests/fixtures/engine");
    let mut files: Vec<String> = Vec::new();
    collect_yaml(&dir, &mut files);
    assert!(files.len() >= 10, "too few fixtures: {files:?}");
    let mut problems = Vec::new();
    for f in &files {
        let out = support::lint_json(&dir, &[f]);
        for d in out.diagnostics() {
            if TYPE_CODES.contains(&d.code.as_str()) {
                problems.push(format!("{f}:{}:{}: {} {}", d.line, d.column, d.code, d.message));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn collect_yaml(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("read a directory") {
        let p = entry.expect("an entry").path();
        if p.is_dir() {
            continue;
        }
        if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(p.file_name().expect("a name").to_string_lossy().into_owned());
        }
    }
    out.sort();
}

/// Every step kind writing into a payload lint knows nothing of: nothing to report, though
/// fields are written on some paths only.
#[test]
fn what_steps_write_into_an_unknown_payload_is_never_reported_absent() {
    let dir = TempDir::new("payload-types");
    dir.write(
        "open.yaml",
        r#"
flow: open
agents:
  any: {kind: command, run: [cat]}
steps:
  first:
    set: {$.a: {value: 1}}
    next:
      - to: loop
        if: payload.flag
      - to: fan
  loop:
    while: =payload.n < 3
    max_iterations: 3
    agent: any
    output: {$.n: $.n}
    next: join
  fan:
    parallel:
      x: {agent: any, scope: $.top, output: "*"}
      y: {agent: any, scope: $.sub, output: [$.z]}
    next: join
  join:
    foreach: $.items
    agent: any
    output: {$.results: $}
    next:
      - to: end
        if: payload.a == 1 && payload.n > 0 && payload.sub.z.q && payload.results.size() > 0
      - to: recover
        on: failure
      - to: end
  recover:
    set: {$.b: =payload.x.y.z}
"#,
    );
    let out = support::lint_json(dir.path(), &["open.yaml"]);
    assert_eq!(out.diagnostics(), Vec::new(), "{out:?}");
    assert_eq!(out.code(), 0);
}

/// A back edge is an error of its own (SY206); the type flow still terminates on it, and still
/// finds what cannot exist on any trip round the cycle.
#[test]
fn a_cycle_is_iterated_to_a_fixpoint() {
    let dir = TempDir::new("payload-types");
    let mut steps = String::new();
    for i in 0..30 {
        steps.push_str(&format!(
            "  s{i}:\n    set: {{$.f{i}: {{value: {i}}}, $.n: '=payload.ticket.id + 1'}}\n    next: s{}\n",
            (i + 1) % 30
        ));
    }
    dir.write(
        "cycle.yaml",
        format!(
            "flow: cycle\ninput:\n  schema:\n    type: object\n    required: [ticket]\n    properties:\n      ticket: {{type: object, required: [id], properties: {{id: {{type: integer}}}}}}\nsteps:\n{steps}  last:\n    set: {{$.x: =payload.ticket.idd}}\n"
        ),
    );
    let out = support::run_with_limit(
        support::switchyard(dir.path()).args(["lint", "cycle.yaml", "--format", "json"]),
        std::time::Duration::from_secs(20),
    );
    let codes: Vec<String> = out.diagnostics().into_iter().map(|d| d.code).collect();
    assert!(codes.contains(&"SY206".to_owned()), "{codes:?}");
    // `last` is unreachable (SY205): no type reaches it, so nothing is said of its read.
    assert!(!codes.contains(&"SY412".to_owned()), "{codes:?}");
    // Round the cycle, `ticket` stays, and a typo of it is found.
    let text = std::fs::read_to_string(dir.path().join("cycle.yaml")).expect("read");
    std::fs::write(
        dir.path().join("cycle.yaml"),
        text.replacen("=payload.ticket.id + 1", "=payload.tickt.id + 1", 1),
    )
    .expect("write");
    let out = support::lint_json(dir.path(), &["cycle.yaml"]);
    let typo: Vec<_> = out
        .diagnostics()
        .into_iter()
        .filter(|d| d.code == "SY412")
        .collect();
    assert_eq!(typo.len(), 1, "{typo:#?}");
    assert_eq!(
        typo[0].message,
        "`payload` has no field `tickt` on any path to here"
    );
}

/// A long flow whose payload grows at every step, with a failure edge at each (a copy of the
/// payload per step) and a join after each: lint finishes (the copy budget bounds its work;
/// a hang is stopped by the limit below, not judged by a timer), and what it follows before
/// the budget is spent is still checked.
#[test]
fn a_growing_payload_on_a_long_flow_is_followed_within_the_copy_budget() {
    let n = 5000;
    let mut flow = String::from(
        "flow: long\ninput:\n  schema: {type: object, required: [n], properties: {n: {type: integer}}}\nagents:\n  a: {kind: mock, returns: {ok: true}}\nsteps:\n",
    );
    for i in 0..n {
        flow.push_str(&format!("  s{i}:\n    agent: a\n    output: {{$.f{i}: $.ok}}\n"));
        if i == 1 {
            flow.push_str("    input: {$.x: =payload.m}\n");
        }
        if i + 1 < n {
            flow.push_str(&format!(
                "    next:\n      - to: s{next}\n      - to: s{next}\n        on: failure\n",
                next = i + 1
            ));
        }
    }
    let dir = TempDir::new("payload-types");
    dir.write("long.yaml", flow);
    let out = support::run_with_limit(
        support::switchyard(dir.path()).args(["lint", "long.yaml", "--format", "json"]),
        std::time::Duration::from_secs(60),
    );
    let diags = out.diagnostics();
    let [d] = diags.as_slice() else {
        panic!("one diagnostic expected: {diags:#?}")
    };
    assert_eq!(d.message, "`payload` has no field `m` on any path to here");
}
