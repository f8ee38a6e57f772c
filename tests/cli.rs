//! The command line as users and CI drive it: exit codes, the machine formats (SARIF, GitHub
//! annotations), directory arguments, `explain` and `--help`.

use std::io::Read;
use std::path::Path;
use std::process::Stdio;

use serde_json::Value;

use crate::lint_fixtures::listed_rules;
use crate::support::{self, CLEAN_FLOW, ERROR_FLOW, TempDir, WARNING_FLOW};

/// A temp dir holding the three canned flows: `clean.yaml`, `warning.yaml`, `error.yaml`.
fn flows() -> TempDir {
    let dir = TempDir::new("cli");
    dir.write("clean.yaml", CLEAN_FLOW);
    dir.write("warning.yaml", WARNING_FLOW);
    dir.write("error.yaml", ERROR_FLOW);
    dir
}

fn lint(dir: &Path, args: &[&str]) -> support::Output {
    support::run(support::switchyard(dir).arg("lint").args(args))
}

// ----- exit codes --------------------------------------------------------------------------------

#[test]
fn clean_flow_exits_0() {
    let dir = flows();
    let out = lint(dir.path(), &["clean.yaml"]);
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(
        out.stdout.contains("checked 1 file: no problems"),
        "{}",
        out.stdout
    );
    let out = lint(dir.path(), &["clean.yaml", "--format", "json"]);
    assert_eq!(out.diagnostics(), Vec::new());
}

#[test]
fn lint_and_test_of_a_directory_check_agent_change_files_as_such() {
    let dir = TempDir::new("cli-changes");
    dir.write("clean.yaml", CLEAN_FLOW);
    dir.write(
        "changes.yaml",
        "# Swap the fetcher for another mock.\n- scope: root\n  mode: replace\n  agents:\n    fetcher: {kind: mock, returns: {ok: false}}\n",
    );
    let out = lint(dir.path(), &["."]);
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(
        out.stdout.contains("checked 2 files: no problems"),
        "{}",
        out.stdout
    );
    let out = support::run(support::switchyard(dir.path()).args(["test", "."]));
    assert_eq!(out.code(), 0, "{out:?}");
    // The same file with a typo: the directory's flow has no `fetchr`.
    dir.write(
        "changes.yaml",
        "- scope: root\n  mode: remove\n  agents: [fetchr]\n",
    );
    let out = lint(dir.path(), &[".", "--format", "json"]);
    assert_eq!(out.code(), 1, "{out:?}");
    let d = out.diagnostics();
    assert_eq!(
        (
            d.len(),
            d[0].code.as_str(),
            d[0].line,
            d[0].column,
            d[0].help.as_deref()
        ),
        (1, "SY213", 3, 12, Some("did you mean `fetcher`?")),
        "{d:?}"
    );
}

#[test]
fn errors_exit_1() {
    let dir = flows();
    let out = lint(dir.path(), &["error.yaml"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stdout.contains("error[SY201]"), "{}", out.stdout);
    for format in ["json", "sarif", "github", "human"] {
        let out = lint(dir.path(), &["error.yaml", "--format", format]);
        assert_eq!(out.code(), 1, "--format {format}: {out:?}");
    }
}

#[test]
fn warnings_alone_exit_0() {
    let dir = flows();
    let out = lint(dir.path(), &["warning.yaml", "--format", "json"]);
    assert_eq!(out.code(), 0, "{out:?}");
    let diags = out.diagnostics();
    assert!(!diags.is_empty(), "the warning flow warns");
    assert!(diags.iter().all(|d| d.severity == "warning"), "{diags:?}");
}

#[test]
fn deny_warnings_makes_warnings_fail() {
    let dir = flows();
    let out = lint(dir.path(), &["warning.yaml", "--deny-warnings"]);
    assert_eq!(out.code(), 1, "{out:?}");
    // It changes nothing for clean flows or for errors.
    assert_eq!(lint(dir.path(), &["clean.yaml", "--deny-warnings"]).code(), 0);
    assert_eq!(lint(dir.path(), &["error.yaml", "--deny-warnings"]).code(), 1);
}

#[test]
fn errors_in_any_file_fail_the_run() {
    let dir = flows();
    let out = lint(
        dir.path(),
        &["clean.yaml", "warning.yaml", "error.yaml", "--format", "json"],
    );
    assert_eq!(out.code(), 1, "{out:?}");
    let files: Vec<String> = out.diagnostics().into_iter().map(|d| d.file).collect();
    assert!(files.iter().any(|f| f == "warning.yaml"), "{files:?}");
    assert!(files.iter().any(|f| f == "error.yaml"), "{files:?}");
}

#[test]
fn usage_errors_exit_2() {
    let dir = flows();
    for args in [
        vec!["lint"],
        vec!["lint", "clean.yaml", "--format", "xml"],
        vec!["lint", "clean.yaml", "--no-such-flag"],
        vec!["no-such-command"],
        vec![],
    ] {
        let out = support::run(support::switchyard(dir.path()).args(&args));
        assert_eq!(out.code(), 2, "{args:?}: {out:?}");
        assert!(
            !out.stderr.is_empty(),
            "{args:?}: a usage error explains itself on stderr"
        );
        assert!(
            out.stdout.is_empty(),
            "{args:?}: nothing on stdout: {}",
            out.stdout
        );
    }
}

#[test]
fn nonexistent_path_exits_2_and_names_it() {
    let dir = flows();
    let out = lint(dir.path(), &["clean.yaml", "no/such/flow.yaml"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("no/such/flow.yaml"), "{}", out.stderr);
}

// ----- formats -----------------------------------------------------------------------------------

#[test]
fn json_lists_every_field() {
    let dir = flows();
    let out = lint(dir.path(), &["error.yaml", "--format", "json"]);
    let raw: Value = serde_json::from_str(&out.stdout).expect("JSON");
    let first = &raw.as_array().expect("an array")[0];
    for key in [
        "code",
        "rule",
        "severity",
        "message",
        "file",
        "line",
        "column",
        "end_line",
        "end_column",
        "help",
        "labels",
    ] {
        assert!(first.get(key).is_some(), "no `{key}` in {first}");
    }
    let d = &out.diagnostics()[0];
    assert_eq!((d.code.as_str(), d.rule.as_str()), ("SY201", "unknown-step"));
    assert_eq!(
        (d.file.as_str(), d.line, d.column, d.end_column),
        ("error.yaml", 10, 11, 20)
    );
    assert!(d.labels[0].primary, "the primary label comes first");
}

#[test]
fn sarif_is_valid_sarif_2_1_0() {
    let dir = flows();
    let json = lint(dir.path(), &["error.yaml", "warning.yaml", "--format", "json"]).diagnostics();
    let out = lint(dir.path(), &["error.yaml", "warning.yaml", "--format", "sarif"]);
    assert_eq!(out.code(), 1);
    let log: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("SARIF is not JSON ({e}):\n{}", out.stdout));
    assert_eq!(log["version"], "2.1.0");
    assert!(
        log["$schema"].as_str().is_some_and(|s| s.contains("sarif")),
        "{}",
        log["$schema"]
    );
    let run = &log["runs"][0];
    assert_eq!(run["tool"]["driver"]["name"], "switchyard");
    let rules = run["tool"]["driver"]["rules"].as_array().expect("rules");
    let results = run["results"].as_array().expect("results");
    assert_eq!(results.len(), json.len(), "one result per diagnostic");
    for (r, d) in results.iter().zip(&json) {
        assert_eq!(r["ruleId"], d.code.as_str());
        assert_eq!(r["level"], d.severity.as_str());
        let index = r["ruleIndex"].as_u64().expect("ruleIndex") as usize;
        assert_eq!(
            rules[index]["id"],
            d.code.as_str(),
            "ruleIndex points at the rule"
        );
        let loc = &r["locations"][0]["physicalLocation"];
        assert!(
            loc["artifactLocation"]["uri"]
                .as_str()
                .is_some_and(|u| u.ends_with(&d.file)),
            "{loc}"
        );
        assert_eq!(loc["region"]["startLine"], d.line);
        assert_eq!(loc["region"]["startColumn"], d.column);
        assert_eq!(loc["region"]["endLine"], d.end_line);
        assert_eq!(loc["region"]["endColumn"], d.end_column);
        assert!(
            r["message"]["text"]
                .as_str()
                .is_some_and(|m| m.starts_with(&d.message))
        );
    }
}

/// The SARIF results' `partialFingerprints` of `file` in `dir`, with their start lines.
fn fingerprints(dir: &Path, file: &str) -> Vec<(String, u64)> {
    let out = lint(dir, &[file, "--format", "sarif"]);
    let log: Value = serde_json::from_str(&out.stdout).expect("SARIF is JSON");
    log["runs"][0]["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            let fp = &r["partialFingerprints"]["switchyardResultHash/v1"];
            let line = &r["locations"][0]["physicalLocation"]["region"]["startLine"];
            (
                fp.as_str()
                    .unwrap_or_else(|| panic!("a fingerprint: {r}"))
                    .to_owned(),
                line.as_u64().expect("a line"),
            )
        })
        .collect()
}

#[test]
fn sarif_fingerprints_stay_when_lines_move_and_tell_results_apart() {
    // Two unknown agents with the same name: equal results but for their place.
    let flow = "\
flow: prints
steps:
  a:
    agent: nope
    next: b
  b:
    agent: nope
";
    let dir = TempDir::new("cli");
    dir.write("flow.yaml", flow);
    let before = fingerprints(dir.path(), "flow.yaml");
    dir.write("flow.yaml", format!("# a comment\n# and another\n{flow}"));
    let after = fingerprints(dir.path(), "flow.yaml");
    assert_eq!(before.len(), 2, "{before:?}");
    let lines = |v: &[(String, u64)]| v.iter().map(|r| r.1).collect::<Vec<_>>();
    assert_eq!(lines(&before), [4, 7]);
    assert_eq!(lines(&after), [6, 9], "the results moved down two lines");
    let prints = |v: &[(String, u64)]| v.iter().map(|r| r.0.clone()).collect::<Vec<_>>();
    assert_eq!(prints(&before), prints(&after), "and kept their fingerprints");
    assert_ne!(
        before[0].0, before[1].0,
        "equal results have their own fingerprints"
    );
    assert!(
        before[0].0.ends_with(":1") && before[1].0.ends_with(":2"),
        "{before:?}"
    );
    // Another problem at the same place is another result.
    dir.write(
        "flow.yaml",
        flow.replace("agent: nope\n    next", "agent: nop\n    next"),
    );
    let changed = fingerprints(dir.path(), "flow.yaml");
    assert_ne!(changed[0].0, before[0].0, "{changed:?}");
}

#[test]
fn sarif_of_a_clean_flow_has_no_results() {
    let dir = flows();
    let out = lint(dir.path(), &["clean.yaml", "--format", "sarif"]);
    assert_eq!(out.code(), 0);
    let log: Value = serde_json::from_str(&out.stdout).expect("SARIF is JSON");
    assert_eq!(log["runs"][0]["results"], Value::Array(Vec::new()));
}

#[test]
fn github_format_is_one_annotation_per_diagnostic() {
    let dir = flows();
    let json = lint(dir.path(), &["error.yaml", "warning.yaml", "--format", "json"]).diagnostics();
    let out = lint(dir.path(), &["error.yaml", "warning.yaml", "--format", "github"]);
    assert_eq!(out.code(), 1);
    let lines: Vec<&str> = out.stdout.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), json.len(), "{}", out.stdout);
    for (line, d) in lines.iter().zip(&json) {
        let prefix = format!("::{} file=", d.severity);
        assert!(
            line.starts_with("::error file=") || line.starts_with("::warning file="),
            "{line}"
        );
        assert!(line.starts_with(&prefix), "{line} for a {}", d.severity);
        assert!(
            line.contains(&format!(",line={},col={},", d.line, d.column)),
            "{line} at {}:{}",
            d.line,
            d.column
        );
        assert!(line.contains(&format!("title={} {}::", d.code, d.rule)), "{line}");
        assert!(!line.contains('\n'), "one line per annotation");
    }
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("::warning file=warning.yaml,"))
    );
    assert!(lines.iter().any(|l| l.starts_with("::error file=error.yaml,")));
}

#[test]
fn human_format_ends_with_a_summary() {
    let dir = flows();
    let out = lint(dir.path(), &["error.yaml", "warning.yaml"]);
    let last = out.stdout.lines().last().unwrap_or_default();
    assert_eq!(last, "checked 2 files: 2 errors, 1 warning", "{}", out.stdout);
    assert!(out.stdout.contains("error[SY201] unknown-step"), "{}", out.stdout);
    assert!(
        out.stdout.contains("help: did you mean `fetch_docs`?"),
        "{}",
        out.stdout
    );
}

#[test]
fn lint_survives_a_closed_stdout() {
    // `switchyard lint ... | head` must not panic when the reader goes away (SPEC §10: lint
    // never panics). SARIF output is ~100 KB, more than a pipe holds, so the write fails.
    let dir = flows();
    let mut child = support::switchyard(dir.path())
        .args(["lint", "error.yaml", "--format", "sarif"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start switchyard");
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    let status = child.wait().expect("wait");
    assert!(
        !stderr.contains("panicked"),
        "lint panicked on a closed stdout ({status}):\n{stderr}"
    );
    assert_ne!(status.code(), Some(101), "exit 101 is a panic: {stderr}");
}

// ----- directories -------------------------------------------------------------------------------

#[test]
fn a_directory_argument_finds_nested_flows() {
    let dir = TempDir::new("cli-dir");
    dir.write("flows/top.yaml", CLEAN_FLOW);
    dir.write("flows/a/b/c/deep.yaml", ERROR_FLOW);
    dir.write("flows/x/other.yml", WARNING_FLOW);
    dir.write("flows/x/notes.txt", "not: [a flow");
    dir.write("flows/.hidden/skipped.yaml", "not: [a flow");
    let out = lint(dir.path(), &["flows", "--format", "json"]);
    assert_eq!(out.code(), 1, "{out:?}");
    let mut files: Vec<String> = out.diagnostics().into_iter().map(|d| d.file).collect();
    files.dedup();
    assert_eq!(
        files,
        ["flows/a/b/c/deep.yaml", "flows/x/other.yml"],
        "nested `.yaml` and `.yml` files are linted, hidden folders and other files are not"
    );
    let human = lint(dir.path(), &["flows"]);
    assert!(
        human.stdout.ends_with("checked 3 files: 2 errors, 1 warning\n"),
        "{}",
        human.stdout
    );
}

// ----- explain -----------------------------------------------------------------------------------

const SECTIONS: [&str; 4] = ["What it does", "Why is this bad", "Example", "Use instead"];

#[test]
fn explain_prints_the_sections_of_a_rule() {
    let out = support::run(support::switchyard(Path::new(".")).args(["explain", "SY201"]));
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(out.stdout.starts_with("# SY201 unknown-step"), "{}", out.stdout);
    let mut at = 0;
    for section in SECTIONS {
        let heading = format!("## {section}");
        let found = out.stdout[at..]
            .find(&heading)
            .unwrap_or_else(|| panic!("no `{heading}` (in order) in:\n{}", out.stdout));
        at += found + heading.len();
    }
    assert!(out.stdout.contains("```yaml"), "examples are YAML");
    // A rule name and any case work too.
    for alias in ["unknown-step", "sy201"] {
        let again = support::run(support::switchyard(Path::new(".")).args(["explain", alias]));
        assert_eq!(again.code(), 0, "{alias}");
        assert_eq!(again.stdout, out.stdout, "`explain {alias}` is `explain SY201`");
    }
}

#[test]
fn explain_works_for_every_listed_code() {
    for (code, name) in listed_rules() {
        let out = support::run(support::switchyard(Path::new(".")).args(["explain", &code]));
        assert_eq!(out.code(), 0, "explain {code}: {out:?}");
        assert!(
            out.stdout.starts_with(&format!("# {code} {name}\n")),
            "explain {code} starts with its title:\n{}",
            out.stdout
        );
        for section in SECTIONS {
            assert!(
                out.stdout.contains(&format!("\n## {section}\n")),
                "explain {code} lacks `## {section}`"
            );
        }
    }
}

#[test]
fn explain_lists_codes_in_order_with_names_and_severities() {
    let out = support::run(support::switchyard(Path::new(".")).args(["explain", "--list"]));
    assert_eq!(out.code(), 0);
    let codes: Vec<String> = listed_rules().into_iter().map(|(c, _)| c).collect();
    let mut sorted = codes.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(codes, sorted, "sorted and unique");
    for line in out.stdout.lines() {
        assert!(
            line.contains(" error ") || line.contains(" warning "),
            "a severity on {line:?}"
        );
    }
}

#[test]
fn explain_of_an_unknown_code_exits_2() {
    let out = support::run(support::switchyard(Path::new(".")).args(["explain", "SY999"]));
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("SY999"), "{}", out.stderr);
    assert!(out.stdout.is_empty());
    let out = support::run(support::switchyard(Path::new(".")).args(["explain"]));
    assert_eq!(out.code(), 2, "`explain` needs a code or --list: {out:?}");
}

// ----- help --------------------------------------------------------------------------------------

#[test]
fn help_and_version_work() {
    let out = support::run(support::switchyard(Path::new(".")).arg("--help"));
    assert_eq!(out.code(), 0, "{out:?}");
    for word in ["Usage:", "lint", "explain"] {
        assert!(
            out.stdout.contains(word),
            "--help mentions {word}:\n{}",
            out.stdout
        );
    }
    let out = support::run(support::switchyard(Path::new(".")).args(["lint", "--help"]));
    assert_eq!(out.code(), 0, "{out:?}");
    for word in [
        "Usage: switchyard lint",
        "--format",
        "--deny-warnings",
        "sarif",
        "github",
    ] {
        assert!(
            out.stdout.contains(word),
            "lint --help mentions {word}:\n{}",
            out.stdout
        );
    }
    let out = support::run(support::switchyard(Path::new(".")).arg("--version"));
    assert_eq!(out.code(), 0);
    assert_eq!(
        out.stdout.trim(),
        format!("switchyard {}", env!("CARGO_PKG_VERSION"))
    );
}

/// `switchyard schema` and `lint` agree on agent definitions and step ids: what lint reports
/// as an unknown key or a bad id, the schema (what editors check against) rejects, and the
/// valid variant of each passes both.
#[test]
fn the_flow_schema_rejects_what_lint_reports_in_agents_and_step_ids() {
    let dir = TempDir::new("cli");
    let out = support::run(support::switchyard(dir.path()).arg("schema"));
    assert_eq!(out.code(), 0, "{out:?}");
    let schema: Value = serde_json::from_str(&out.stdout).expect("the schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let mock = "flow: f\nagents:\n  a: {kind: mock, returns: {}}\nsteps:\n  s: {agent: a, output: {}}\n";
    let inline_flow = "flow: f\nagents:\n  c:\n    kind: flow\n    description: inline\n    \
                       steps: {t: {succeed: {}}}\nsteps:\n  s: {agent: c, output: {}}\n";
    let cases = [
        (
            mock.replace("returns: {}", "returns: {}, bogus_key: 1"),
            Some("SY103"),
        ),
        (mock.replace("returns: {}", "returnz: {}"), Some("SY103")),
        (
            mock.replace(
                "kind: mock, returns: {}",
                "kind: http, url: \"http://x\", run: [a]",
            ),
            Some("SY103"),
        ),
        (
            mock.replace("agent: a", "agent: {kind: mock, returns: {}, bogus_key: 1}"),
            Some("SY103"),
        ),
        (mock.replace("  s: {", "  end: {"), Some("SY107")),
        (mock.replace("  s: {", "  Fetch: {"), Some("SY106")),
        (
            mock.replace("  a: {", "  my-agent: {")
                .replace("agent: a", "agent: my-agent"),
            Some("SY106"),
        ),
        (
            inline_flow.replace("description: inline", "bogus_key: 1"),
            Some("SY103"),
        ),
        (mock.to_owned(), None),
        (inline_flow.to_owned(), None),
    ];
    for (text, code) in cases {
        let node = switchyard::__private::syntax::parse(
            switchyard::__private::source::FileId(0),
            text.as_bytes(),
            &switchyard::__private::syntax::Limits::default(),
        )
        .expect("the case is YAML");
        let errors: Vec<String> = validator
            .iter_errors(&node.to_json())
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        dir.write("flow.yaml", &text);
        let lint = lint(dir.path(), &["flow.yaml", "--format", "json"]);
        let codes: Vec<String> = lint
            .diagnostics()
            .into_iter()
            .filter(|d| d.severity == "error")
            .map(|d| d.code)
            .collect();
        match code {
            Some(code) => {
                assert!(!errors.is_empty(), "the schema accepts:\n{text}");
                assert!(
                    codes.iter().any(|c| c == code),
                    "lint gives {codes:?} for:\n{text}"
                );
            }
            None => {
                assert!(errors.is_empty(), "the schema rejects:\n{text}\n{errors:#?}");
                assert!(codes.is_empty(), "lint gives {codes:?} for:\n{text}");
            }
        }
    }
}

/// A command that only prints stops quietly when its reader goes away (`… | head -1`): no
/// panic about a broken pipe.
#[test]
fn a_closed_stdout_ends_a_printing_command_without_a_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut child = support::switchyard(root)
        .args(["graph", "flows/ticket-triage.yaml", "--format", "svg", "--nested"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("switchyard starts");
    // The reader goes away before the picture is written.
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr reads");
    let status = child.wait().expect("it exits");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!status.success() || stderr.is_empty(), "{status:?}: {stderr}");
}
