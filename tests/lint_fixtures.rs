//! Lint fixtures with inline expectations (rust-analyzer's `//^^^`, ruff's mdtest).
//!
//! # Layout
//!
//! `tests/fixtures/lint/<rule-name>/` holds the fixtures of one rule, named after the rule's
//! kebab-case name (`unknown-step`, `edge-cycle`, ...). Every `*.yaml` file directly in that
//! folder is a fixture: a flow showing the bad pattern. Files a fixture imports or calls live in
//! subfolders (`import-cycle/lib/one.yaml`); they are never linted on their own.
//!
//! Each fixture is linted by the real binary — `switchyard lint <fixture> --format json`, run in
//! the rule folder, so every file is named relative to it — and the diagnostics it reports must
//! be exactly the ones its comments expect: every diagnostic expected, every expectation met.
//!
//! # Expectations
//!
//! An expectation is a YAML comment whose carets sit under the span of a diagnostic in the
//! previous line that is not itself an expectation (so several expectations can stack under one
//! line):
//!
//! ```yaml
//!     next: fetch
//! #         ^^^^^ error[SY201]: unknown step `fetch`
//! #   help: steps are: `first`, `fetch_docs`
//! ```
//!
//! - **Carets** `^` mark the columns of the span, one per character; the `#` may be anywhere
//!   before them (directly before is fine: `#^^` marks columns 2 and 3). A span that starts in
//!   column 1, where the `#` has to be, gives its column explicitly: `# @1 ^^^^^ error[...]`
//!   (`@C` sets the first caret's column; the carets then only give the length).
//! - An **empty span** (a position, as in "missing key" at the start of a mapping) is marked by
//!   one `|` instead of carets: `#   | error[SY105]: ...`, or `# @1 | error[SY105]: ...`.
//! - A **multi-line span** is marked on its first line, carets from its start to the end of that
//!   line, followed by `(+N)`: the span ends N lines further down (not counting expectation
//!   lines); its end column is not checked.
//!   `#       ^^^^^^^^^^ (+1) warning[SY211]: step `fetch` has ...`
//! - **Severity and code**: `error[SY201]` or `warning[SY211]`, then `: ` and the message.
//! - **Message**: matched exactly. A message ending in `...` is matched as a prefix (for long
//!   messages, or ones naming machine-specific paths).
//! - **Help** (optional): a comment line `# help: <text>` directly under an expectation also
//!   requires the diagnostic's help to be exactly that text (a prefix when it ends in `...`).
//!   Without it, help is not checked.
//! - **Secondary labels** (optional): `note[SY204]: first defined here` with carets under the
//!   label's span requires a diagnostic with that code to carry a secondary label with exactly
//!   that message there. Secondary labels that no `note` names are not checked.
//!
//! Expectations may also sit in helper files (the other place of a duplicate definition, the
//! import that closes a cycle). A diagnostic in a helper file must match one of that file's
//! expectations; each helper expectation must be met by at least one fixture of the folder.
//! The exit code must be 1 when an error is expected and 0 otherwise, and every fixture must
//! show the rule of its folder (in its own file or a helper's).
//!
//! A fixture may name helper files to lint in the same command with a comment line
//! `# lint with: sub/flow.yaml` (an agent-change file is checked against the flows linted with it).
//!
//! A line that starts like an expectation but does not parse is a test failure, never ignored.
//! For every unexpected diagnostic, the failure message prints a ready-to-paste expectation;
//! read it against the rule before pasting it — a fixture states what lint *should* say.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::support::{self, JsonDiagnostic};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Error,
    Warning,
    /// A secondary label.
    Note,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Error => "error",
            Kind::Warning => "warning",
            Kind::Note => "note",
        }
    }
}

/// Where a span ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// On its first line, just before this (1-based) column.
    Column(usize),
    /// This many non-expectation lines further down.
    Lines(usize),
}

/// A message or help text as written in an expectation.
#[derive(Clone, Debug)]
enum Text {
    Exact(String),
    Prefix(String),
}

impl Text {
    fn parse(s: &str) -> Text {
        match s.strip_suffix("...") {
            Some(prefix) => Text::Prefix(prefix.to_owned()),
            None => Text::Exact(s.to_owned()),
        }
    }

    fn matches(&self, actual: &str) -> bool {
        match self {
            Text::Exact(s) => s == actual,
            Text::Prefix(p) => actual.starts_with(p.as_str()),
        }
    }

    fn shown(&self) -> String {
        match self {
            Text::Exact(s) => s.clone(),
            Text::Prefix(p) => format!("{p}..."),
        }
    }
}

/// One expectation comment.
#[derive(Clone, Debug)]
struct Expectation {
    /// The file it is written in, relative to the rule folder.
    file: String,
    /// The 1-based line of the comment itself, for messages.
    at: usize,
    /// The 1-based line it marks.
    line: usize,
    column: usize,
    end: End,
    kind: Kind,
    code: String,
    message: Text,
    help: Option<Text>,
}

impl Expectation {
    fn describe(&self) -> String {
        let end = match self.end {
            End::Column(c) => format!("-{c}"),
            End::Lines(n) => format!(" (+{n} lines)"),
        };
        let help = self
            .help
            .as_ref()
            .map(|h| format!("\n      help: {}", h.shown()))
            .unwrap_or_default();
        format!(
            "{}:{}:{}{end}: {}[{}]: {} (expectation on line {}){help}",
            self.file,
            self.line,
            self.column,
            self.kind.as_str(),
            self.code,
            self.message.shown(),
            self.at
        )
    }
}

/// A file of the rule folder with its expectations.
struct FileInfo {
    lines: Vec<String>,
    /// For each 1-based raw line (index 0 unused): its index among non-expectation lines.
    code_index: Vec<Option<usize>>,
    expectations: Vec<Expectation>,
}

impl FileInfo {
    /// The span end of a diagnostic as expectations write it.
    fn end_of(&self, line: usize, end_line: usize, end_column: usize) -> Option<End> {
        if end_line == line {
            return Some(End::Column(end_column));
        }
        let from = self.code_index.get(line).copied().flatten()?;
        let to = self.code_index.get(end_line).copied().flatten()?;
        to.checked_sub(from).map(End::Lines)
    }
}

/// The markers of an expectation line: (first column, end column, rest of the line).
/// `Ok(None)` for lines that are not expectations.
fn markers(line: &str) -> Result<Option<(usize, usize, String)>, String> {
    let chars: Vec<char> = line.chars().collect();
    let Some(hash) = chars.iter().position(|c| !c.is_whitespace()) else {
        return Ok(None);
    };
    if chars[hash] != '#' {
        return Ok(None);
    }
    let mut i = hash + 1;
    while chars.get(i) == Some(&' ') {
        i += 1;
    }
    // `@C`: an explicit column for the first marker.
    let mut explicit = None;
    if chars.get(i) == Some(&'@') {
        let digits: String = chars[i + 1..].iter().take_while(|c| c.is_ascii_digit()).collect();
        let col: usize = digits
            .parse()
            .map_err(|_| format!("`@` must be followed by a column number: {line:?}"))?;
        if col == 0 {
            return Err(format!("columns are 1-based: {line:?}"));
        }
        explicit = Some(col);
        i += 1 + digits.len();
        if chars.get(i) != Some(&' ') {
            return Err(format!(
                "`@{col}` must be followed by a space and markers: {line:?}"
            ));
        }
        while chars.get(i) == Some(&' ') {
            i += 1;
        }
    }
    let (start, len) = match chars.get(i) {
        Some('^') => {
            let len = chars[i..].iter().take_while(|c| **c == '^').count();
            (i, len)
        }
        Some('|') => (i, 0),
        _ if explicit.is_some() => return Err(format!("`@C` must be followed by markers: {line:?}")),
        _ => return Ok(None),
    };
    let after = start + len.max(1);
    let column = explicit.unwrap_or(start + 1);
    let rest: String = chars[after..].iter().collect();
    if !rest.starts_with(' ') {
        return Err(format!(
            "markers must be followed by a space and `error[...]`, `warning[...]` or `note[...]`: {line:?}"
        ));
    }
    Ok(Some((column, column + len, rest.trim_start().to_owned())))
}

/// Parses `[(+N) ]kind[CODE]: message`.
fn annotation(rest: &str, line: &str) -> Result<(Option<usize>, Kind, String, String), String> {
    let mut rest = rest;
    let mut lines_down = None;
    if let Some(r) = rest.strip_prefix("(+") {
        let close = r
            .find(") ")
            .ok_or_else(|| format!("`(+N)` must be followed by a space: {line:?}"))?;
        let n: usize = r[..close]
            .parse()
            .map_err(|_| format!("`(+N)` needs a number: {line:?}"))?;
        if n == 0 {
            return Err(format!("`(+0)` is a single-line span; drop it: {line:?}"));
        }
        lines_down = Some(n);
        rest = &r[close + 2..];
    }
    let (kind, r) = if let Some(r) = rest.strip_prefix("error[") {
        (Kind::Error, r)
    } else if let Some(r) = rest.strip_prefix("warning[") {
        (Kind::Warning, r)
    } else if let Some(r) = rest.strip_prefix("note[") {
        (Kind::Note, r)
    } else {
        return Err(format!(
            "expected `error[`, `warning[` or `note[` after the markers: {line:?}"
        ));
    };
    let close = r
        .find("]: ")
        .ok_or_else(|| format!("expected `]: message` after the code: {line:?}"))?;
    let code = &r[..close];
    if !(code.len() == 5 && code.starts_with("SY") && code[2..].chars().all(|c| c.is_ascii_digit())) {
        return Err(format!("`{code}` is not a lint code like `SY201`: {line:?}"));
    }
    let message = r[close + 3..].trim_end();
    if message.is_empty() {
        return Err(format!("the message is empty: {line:?}"));
    }
    Ok((lines_down, kind, code.to_owned(), message.to_owned()))
}

/// `# help: text` lines.
fn help_line(line: &str) -> Option<&str> {
    line.trim_start()
        .strip_prefix('#')?
        .trim_start()
        .strip_prefix("help: ")
        .map(str::trim_end)
}

/// Reads a file's expectations; every malformed expectation is an error.
fn parse_file(name: &str, text: &str) -> Result<FileInfo, Vec<String>> {
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let mut errors = Vec::new();
    let mut expectations: Vec<Expectation> = Vec::new();
    let mut code_index = vec![None];
    let mut code_lines = 0;
    let mut last_code: Option<usize> = None;
    // Whether the previous line was an expectation (a help line may follow it).
    let mut previous_expectation = false;
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        let at = |e: String| format!("{name}:{n}: {e}");
        match markers(line) {
            Err(e) => {
                errors.push(at(e));
                code_index.push(None);
                previous_expectation = false;
            }
            Ok(Some((column, end, rest))) => {
                code_index.push(None);
                previous_expectation = true;
                let Some(marked) = last_code else {
                    errors.push(at("an expectation needs a line above it to mark".into()));
                    continue;
                };
                let (lines_down, kind, code, message) = match annotation(&rest, line) {
                    Ok(a) => a,
                    Err(e) => {
                        errors.push(at(e));
                        continue;
                    }
                };
                let end = match lines_down {
                    None => End::Column(end),
                    Some(down) => {
                        let marked_line = &lines[marked - 1];
                        let eol = marked_line.trim_end().chars().count() + 1;
                        if end != eol {
                            errors.push(at(format!(
                                "a multi-line span's carets run from its start to the end of line \
                                 {marked} (column {eol}), not to column {end}"
                            )));
                        }
                        End::Lines(down)
                    }
                };
                expectations.push(Expectation {
                    file: name.to_owned(),
                    at: n,
                    line: marked,
                    column,
                    end,
                    kind,
                    code,
                    message: Text::parse(&message),
                    help: None,
                });
            }
            Ok(None) => {
                if previous_expectation && let Some(help) = help_line(line) {
                    code_index.push(None);
                    let last = expectations.last_mut().expect("an expectation precedes");
                    if last.kind == Kind::Note {
                        errors.push(at("`help:` belongs under an error or a warning".into()));
                    } else if last.help.is_some() {
                        errors.push(at("one `help:` line per expectation".into()));
                    } else {
                        last.help = Some(Text::parse(help));
                    }
                    previous_expectation = false;
                    continue;
                }
                code_index.push(Some(code_lines));
                code_lines += 1;
                last_code = Some(n);
                previous_expectation = false;
            }
        }
    }
    if errors.is_empty() {
        Ok(FileInfo {
            lines,
            code_index,
            expectations,
        })
    } else {
        Err(errors)
    }
}

/// Every `.yaml`/`.yml` file under `dir`, relative to it, with `/` separators.
fn yaml_files(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().expect("a file name").to_string_lossy().into_owned();
        let rel = format!("{prefix}{name}");
        if p.is_dir() {
            yaml_files(&p, &format!("{rel}/"), out);
        } else if name.ends_with(".yaml") || name.ends_with(".yml") {
            out.push(rel);
        }
    }
}

/// The fixtures of a rule folder: the `.yaml` files directly in it.
pub fn fixtures_of(dir: &Path) -> Vec<String> {
    let mut all = Vec::new();
    yaml_files(dir, "", &mut all);
    all.into_iter()
        .filter(|f| !f.contains('/') && f.ends_with(".yaml"))
        .collect()
}

/// The codes a rule folder's fixtures expect (errors and warnings).
pub fn expected_codes(dir: &Path) -> BTreeSet<String> {
    let mut files = Vec::new();
    yaml_files(dir, "", &mut files);
    let mut out = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(dir.join(&f)).unwrap_or_default();
        if let Ok(info) = parse_file(&f, &text) {
            out.extend(
                info.expectations
                    .iter()
                    .filter(|e| e.kind != Kind::Note)
                    .map(|e| e.code.clone()),
            );
        }
    }
    out
}

/// A ready-to-paste expectation for an unexpected diagnostic.
fn suggestion(d: &JsonDiagnostic, file: Option<&FileInfo>) -> String {
    let multi = d.end_line != d.line;
    let len = if multi {
        file.and_then(|f| f.lines.get(d.line - 1))
            .map_or(1, |l| (l.trim_end().chars().count() + 1).saturating_sub(d.column))
    } else {
        d.end_column.saturating_sub(d.column)
    };
    let marks = if len == 0 { "|".to_owned() } else { "^".repeat(len) };
    let lead = match d.column {
        1 => format!("# @1 {marks}"),
        2 => format!("#{marks}"),
        c => format!("{}# {marks}", " ".repeat(c - 3)),
    };
    let down = match file.and_then(|f| f.end_of(d.line, d.end_line, d.end_column)) {
        Some(End::Lines(n)) => format!("(+{n}) "),
        _ if multi => "(+?) ".to_owned(),
        _ => String::new(),
    };
    let help = d
        .help
        .as_ref()
        .map(|h| format!("\n    # help: {h}"))
        .unwrap_or_default();
    format!("    {lead} {down}{}[{}]: {}{help}", d.severity, d.code, d.message)
}

fn matches(e: &Expectation, d: &JsonDiagnostic, file: &FileInfo) -> bool {
    let kind = match d.severity.as_str() {
        "error" => Kind::Error,
        "warning" => Kind::Warning,
        _ => return false,
    };
    e.kind == kind
        && e.file == d.file
        && e.line == d.line
        && e.column == d.column
        && Some(e.end) == file.end_of(d.line, d.end_line, d.end_column)
        && e.code == d.code
        && e.message.matches(&d.message)
        && e.help
            .as_ref()
            .is_none_or(|h| d.help.as_deref().is_some_and(|a| h.matches(a)))
}

fn note_matches(e: &Expectation, d: &JsonDiagnostic, file: &FileInfo) -> bool {
    e.code == d.code
        && d.labels.iter().filter(|l| !l.primary).any(|l| {
            l.file == e.file
                && l.line == e.line
                && l.column == e.column
                && Some(e.end) == file.end_of(l.line, l.end_line, l.end_column)
                && e.message.matches(&l.message)
        })
}

/// Lints every fixture of the rule folder `rule` and panics with every mismatch found.
pub fn check_rule_folder(rule: &str) {
    let dir = support::fixtures_dir().join(rule);
    assert!(dir.is_dir(), "no fixture folder {}", dir.display());
    let mut names = Vec::new();
    yaml_files(&dir, "", &mut names);
    let mut problems: Vec<String> = Vec::new();
    let mut files: BTreeMap<String, FileInfo> = BTreeMap::new();
    for name in &names {
        let text = std::fs::read(dir.join(name)).expect("read a fixture");
        let text = String::from_utf8_lossy(&text);
        match parse_file(name, &text) {
            Ok(info) => {
                files.insert(name.clone(), info);
            }
            Err(errs) => problems.extend(errs),
        }
    }
    let fixtures = fixtures_of(&dir);
    if fixtures.is_empty() {
        problems.push(format!("{rule}: no fixtures (`*.yaml` directly in the folder)"));
    }
    // The folder's own code: every fixture must show it (in its file or a helper's).
    let own_code = listed_rules()
        .into_iter()
        .find(|(_, name)| name == rule)
        .map(|(code, _)| code);
    if own_code.is_none() {
        problems.push(format!(
            "`{rule}` is not the name of a rule in `switchyard explain --list`"
        ));
    }
    // Helper expectations met by some fixture: (file, index).
    let mut helper_hits: BTreeSet<(String, usize)> = BTreeSet::new();
    for fixture in &fixtures {
        let Some(own) = files.get(fixture) else { continue };
        // `# lint with: PATH...` lines name helper files linted in the same command (the flows
        // an agent-change file is checked against).
        let text = std::fs::read_to_string(dir.join(fixture)).unwrap_or_default();
        let mut args = vec![fixture.as_str()];
        args.extend(
            text.lines()
                .filter_map(|l| l.strip_prefix("# lint with: "))
                .flat_map(str::split_whitespace),
        );
        let out = support::lint_json(&dir, &args);
        if out.status.code().is_none() || out.code() > 1 {
            problems.push(format!(
                "{fixture}: lint did not finish normally ({:?})\nstderr:\n{}",
                out.status, out.stderr
            ));
            continue;
        }
        let diags = out.diagnostics();
        // The expectations in play: the fixture's own and every helper file's.
        let candidates: Vec<(&String, usize, &Expectation)> = files
            .iter()
            .filter(|(name, _)| *name == fixture || name.contains('/'))
            .flat_map(|(name, info)| {
                info.expectations
                    .iter()
                    .enumerate()
                    .map(move |(i, e)| (name, i, e))
            })
            .collect();
        let mut used = vec![false; candidates.len()];
        let mut report = Vec::new();
        for d in &diags {
            let file = files.get(&d.file);
            let hit = file.and_then(|info| {
                candidates
                    .iter()
                    .enumerate()
                    .position(|(j, (_, _, e))| !used[j] && e.kind != Kind::Note && matches(e, d, info))
            });
            match hit {
                Some(j) => used[j] = true,
                None => report.push(format!(
                    "  unexpected {}[{}] at {}:{}:{}-{}:{}: {}\n  expected it with:\n{}",
                    d.severity,
                    d.code,
                    d.file,
                    d.line,
                    d.column,
                    d.end_line,
                    d.end_column,
                    d.message,
                    suggestion(d, file)
                )),
            }
        }
        for (j, (name, i, e)) in candidates.iter().enumerate() {
            if e.kind == Kind::Note {
                let info = &files[*name];
                used[j] = diags.iter().any(|d| note_matches(e, d, info));
            }
            if name.contains('/') {
                if used[j] {
                    helper_hits.insert(((*name).clone(), *i));
                }
            } else if !used[j] {
                report.push(format!("  missing {}", e.describe()));
            }
        }
        let want_error = own.expectations.iter().any(|e| e.kind == Kind::Error)
            || candidates
                .iter()
                .enumerate()
                .any(|(j, (_, _, e))| used[j] && e.kind == Kind::Error);
        let shows_own = candidates.iter().enumerate().any(|(j, (name, _, e))| {
            (used[j] || *name == fixture) && e.kind != Kind::Note && Some(&e.code) == own_code.as_ref()
        });
        if !shows_own && let Some(code) = &own_code {
            report.push(format!(
                "  expects no {code}: a fixture in `{rule}/` shows that rule (move it to its rule's folder)"
            ));
        }
        let want = i32::from(want_error);
        if out.code() != want {
            report.push(format!("  exit code {}, expected {want}", out.code()));
        }
        if !report.is_empty() {
            problems.push(format!(
                "{rule}/{fixture}:\n{}\n  (all diagnostics: {})",
                report.join("\n"),
                diags
                    .iter()
                    .map(|d| format!("{}@{}:{}:{}", d.code, d.file, d.line, d.column))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    for (name, info) in files.iter().filter(|(n, _)| n.contains('/')) {
        for (i, e) in info.expectations.iter().enumerate() {
            if !helper_hits.contains(&(name.clone(), i)) {
                problems.push(format!("{rule}: no fixture of the folder met {}", e.describe()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "lint fixtures of `{rule}` disagree with the linter:\n\n{}\n",
        problems.join("\n\n")
    );
}

/// The rule folders that have tests below. [`every_fixture_folder_has_a_test`] keeps this list
/// and the folders on disk in step.
const TESTED: &[&str] = &[
    "yaml-syntax",
    "yaml-budget-exceeded",
    "duplicate-key",
    "unknown-key",
    "invalid-type",
    "missing-key",
    "invalid-identifier",
    "reserved-identifier",
    "invalid-value",
    "step-kind",
    "unknown-step",
    "unknown-agent",
    "unknown-provider",
    "unknown-mcp-server",
    "mcp-tool-not-allowed",
    "tool-name-collision",
    "secret-in-mcp-target",
    "duplicate-definition",
    "unreachable-step",
    "edge-cycle",
    "flow-call-cycle",
    "import-cycle",
    "path-outside-root",
    "missing-file",
    "missing-fallback",
    "error-kind-never-raised",
    "unknown-branch",
    "unknown-change-target",
    "while-without-bound",
    "limit-out-of-range",
    "jsonpath-syntax",
    "non-singular-destination",
    "expression-syntax",
    "unknown-variable",
    "unknown-field",
    "template-syntax",
    "step-may-not-have-run",
    "parallel-output-conflict",
    "invalid-schema",
    "unknown-function",
    "wrong-argument-count",
    "unknown-payload-field",
    "maybe-absent-field",
    "source-never-matches",
    "comparison-never-true",
    "arithmetic-type-mismatch",
    "condition-not-bool",
    "argument-type-mismatch",
    "capability-not-allowed",
    "unused-result",
    "literal-secret",
    "shell-with-template",
    "host-not-allowed",
    "unknown-tool",
    "tool-cycle",
    "loop-setting-without-tools",
    "tool-input-not-object",
    "expiry-without-approval",
];

macro_rules! rule_tests {
    ($($test:ident => $folder:literal,)*) => {
        $(
            #[test]
            fn $test() {
                check_rule_folder($folder);
            }
        )*

        /// The folders that [`rule_tests!`] made a test for.
        const GENERATED: &[&str] = &[$($folder),*];
    };
}

rule_tests! {
    yaml_syntax => "yaml-syntax",
    yaml_budget_exceeded => "yaml-budget-exceeded",
    duplicate_key => "duplicate-key",
    unknown_key => "unknown-key",
    invalid_type => "invalid-type",
    missing_key => "missing-key",
    invalid_identifier => "invalid-identifier",
    reserved_identifier => "reserved-identifier",
    invalid_value => "invalid-value",
    step_kind => "step-kind",
    unknown_step => "unknown-step",
    unknown_agent => "unknown-agent",
    unknown_provider => "unknown-provider",
    unknown_mcp_server => "unknown-mcp-server",
    mcp_tool_not_allowed => "mcp-tool-not-allowed",
    tool_name_collision => "tool-name-collision",
    secret_in_mcp_target => "secret-in-mcp-target",
    duplicate_definition => "duplicate-definition",
    unreachable_step => "unreachable-step",
    edge_cycle => "edge-cycle",
    flow_call_cycle => "flow-call-cycle",
    import_cycle => "import-cycle",
    path_outside_root => "path-outside-root",
    missing_file => "missing-file",
    missing_fallback => "missing-fallback",
    error_kind_never_raised => "error-kind-never-raised",
    unknown_branch => "unknown-branch",
    unknown_change_target => "unknown-change-target",
    while_without_bound => "while-without-bound",
    limit_out_of_range => "limit-out-of-range",
    jsonpath_syntax => "jsonpath-syntax",
    non_singular_destination => "non-singular-destination",
    expression_syntax => "expression-syntax",
    unknown_variable => "unknown-variable",
    unknown_field => "unknown-field",
    template_syntax => "template-syntax",
    step_may_not_have_run => "step-may-not-have-run",
    parallel_output_conflict => "parallel-output-conflict",
    invalid_schema => "invalid-schema",
    unknown_function => "unknown-function",
    wrong_argument_count => "wrong-argument-count",
    unknown_payload_field => "unknown-payload-field",
    maybe_absent_field => "maybe-absent-field",
    source_never_matches => "source-never-matches",
    comparison_never_true => "comparison-never-true",
    arithmetic_type_mismatch => "arithmetic-type-mismatch",
    condition_not_bool => "condition-not-bool",
    argument_type_mismatch => "argument-type-mismatch",
    capability_not_allowed => "capability-not-allowed",
    unused_result => "unused-result",
    literal_secret => "literal-secret",
    shell_with_template => "shell-with-template",
    host_not_allowed => "host-not-allowed",
    unknown_tool => "unknown-tool",
    tool_cycle => "tool-cycle",
    loop_setting_without_tools => "loop-setting-without-tools",
    tool_input_not_object => "tool-input-not-object",
    expiry_without_approval => "expiry-without-approval",
}

/// Rules of `switchyard explain --list` that have no fixture folder yet because the binary does
/// not report them yet. Each must get a folder under `tests/fixtures/lint/` (and leave this
/// list) as soon as it is implemented; a rule listed here that has a folder fails the test, so
/// the list cannot go stale. It is empty now that every listed rule is implemented; keep it
/// for rules added to the registry before their implementation lands, e.g.
/// `"unknown-branch", // SY212: references to `parallel` branches`.
const NOT_YET_IMPLEMENTED: &[&str] = &[];

/// Rules only `lint --mcp` reports, from what live servers list: a fixture folder (linted
/// without servers) cannot show them; tests/mcp.rs, tests/mcp_lint_live.rs and
/// tests/mcp_real.rs do, against the fixture server and real ones.
const LIVE_ONLY: &[&str] = &["mcp-server-unreachable", "mcp-tool-not-listed"];

/// The (code, name) pairs of `switchyard explain --list`.
pub fn listed_rules() -> Vec<(String, String)> {
    let out =
        support::run(support::switchyard(Path::new(env!("CARGO_MANIFEST_DIR"))).args(["explain", "--list"]));
    assert_eq!(out.code(), 0, "explain --list failed: {}", out.stderr);
    let rules: Vec<(String, String)> = out
        .stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut words = l.split_whitespace();
            let code = words.next().expect("a code").to_owned();
            let name = words
                .next()
                .unwrap_or_else(|| panic!("no rule name in {l:?}"))
                .to_owned();
            (code, name)
        })
        .collect();
    assert!(
        rules.len() >= 30,
        "explain --list lists too few rules:\n{}",
        out.stdout
    );
    rules
}

fn folders_on_disk() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(support::fixtures_dir())
        .expect("tests/fixtures/lint exists")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_dir())
        .map(|p| p.file_name().expect("a name").to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

#[test]
fn every_listed_rule_has_a_fixture_folder() {
    let on_disk: BTreeSet<String> = folders_on_disk().into_iter().collect();
    let mut problems = Vec::new();
    let listed = listed_rules();
    for (code, name) in &listed {
        if LIVE_ONLY.contains(&name.as_str()) {
            continue;
        }
        let allowed_missing = NOT_YET_IMPLEMENTED.contains(&name.as_str());
        match (on_disk.contains(name), allowed_missing) {
            (true, true) => problems.push(format!(
                "{code} `{name}` has a fixture folder now: remove it from NOT_YET_IMPLEMENTED"
            )),
            (false, false) => problems.push(format!(
                "{code} `{name}` has no fixture folder tests/fixtures/lint/{name}/"
            )),
            _ => {}
        }
    }
    for name in NOT_YET_IMPLEMENTED {
        if !listed.iter().any(|(_, n)| n == name) {
            problems.push(format!(
                "NOT_YET_IMPLEMENTED names `{name}`, which `explain --list` does not list"
            ));
        }
    }
    for folder in &on_disk {
        if !listed.iter().any(|(_, n)| n == folder) {
            problems.push(format!(
                "fixture folder `{folder}` is not the name of a listed rule"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_fixture_folder_has_a_test() {
    let on_disk = folders_on_disk();
    let generated: BTreeSet<&str> = GENERATED.iter().copied().collect();
    let tested: BTreeSet<&str> = TESTED.iter().copied().collect();
    assert_eq!(generated, tested, "TESTED and rule_tests! disagree");
    let missing: Vec<&String> = on_disk.iter().filter(|f| !tested.contains(f.as_str())).collect();
    assert!(
        missing.is_empty(),
        "fixture folders without a test in rule_tests!: {missing:?}"
    );
    let stale: Vec<&&str> = TESTED
        .iter()
        .filter(|t| !on_disk.iter().any(|f| f == *t))
        .collect();
    assert!(
        stale.is_empty(),
        "rule_tests! names folders that do not exist: {stale:?}"
    );
}

/// Each folder expects at least one diagnostic of its own rule (each fixture's share is checked
/// when it runs).
#[test]
fn every_fixture_folder_expects_its_own_rule() {
    let listed = listed_rules();
    let mut problems = Vec::new();
    for folder in folders_on_disk() {
        let Some((code, _)) = listed.iter().find(|(_, n)| *n == folder) else {
            continue;
        };
        let dir = support::fixtures_dir().join(&folder);
        if !expected_codes(&dir).contains(code) {
            problems.push(format!("{folder}: no fixture expects {code}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The expectation syntax itself, on small inputs.
mod syntax {
    use super::*;

    fn one(text: &str) -> Expectation {
        let info = parse_file("t.yaml", text).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(info.expectations.len(), 1, "{text:?}");
        info.expectations[0].clone()
    }

    #[test]
    fn carets_mark_the_columns_of_the_previous_code_line() {
        let e = one("a:\n    next: fetch\n#         ^^^^^ error[SY201]: unknown step `fetch`\n");
        assert_eq!((e.line, e.column, e.end), (2, 11, End::Column(16)));
        assert_eq!((e.kind, e.code.as_str()), (Kind::Error, "SY201"));
        assert!(e.message.matches("unknown step `fetch`"));
        assert!(!e.message.matches("unknown step `fetch` and more"));
    }

    #[test]
    fn stacked_expectations_mark_the_same_line_and_help_attaches() {
        let text = "x: abc\n#  ^^^ error[SY100]: one\n#  help: fix it...\n# ^ warning[SY503]: two\n";
        let info = parse_file("t.yaml", text).expect("parses");
        let [a, b] = info.expectations.as_slice() else {
            panic!("two expectations")
        };
        assert_eq!((a.line, a.column, b.line, b.column), (1, 4, 1, 3));
        assert!(a.help.as_ref().is_some_and(|h| h.matches("fix it now")));
        assert!(b.help.is_none());
    }

    #[test]
    fn explicit_columns_empty_spans_and_multi_line_spans() {
        let e = one("stpes: 1\n# @1 ^^^^^ error[SY103]: unknown...\n");
        assert_eq!((e.column, e.end), (1, End::Column(6)));
        assert!(e.message.matches("unknown key `stpes`"));
        let e = one("flow: x\n# @1 | error[SY105]: missing\n");
        assert_eq!((e.column, e.end), (1, End::Column(1)));
        let e = one("  - to: a\n# ^^^^^^^ (+1) warning[SY211]: w\n    if: x\n");
        assert_eq!((e.line, e.column, e.end), (1, 3, End::Lines(1)));
    }

    #[test]
    fn malformed_expectations_are_errors() {
        for bad in [
            "a: 1\n# ^ eror[SY100]: x\n",
            "a: 1\n# ^ error[SY100] x\n",
            "a: 1\n# ^ error[E0001]: x\n",
            "a: 1\n# ^error[SY100]: x\n",
            "a: 1\n# @0 ^ error[SY100]: x\n",
            "# ^ error[SY100]: nothing above\n",
            "a: 1234\n# ^^ (+1) error[SY100]: not to the end of the line\n",
        ] {
            assert!(parse_file("t.yaml", bad).is_err(), "accepted {bad:?}");
        }
        // Ordinary comments are not expectations.
        let info = parse_file("t.yaml", "# a comment\na: 1 # ^ trailing\n#  - list\n").expect("parses");
        assert!(info.expectations.is_empty());
    }

    #[test]
    fn suggestions_round_trip() {
        let text = "stpes: 1\n    next: fetch\n";
        let info = parse_file("t.yaml", text).expect("parses");
        for (line, column, end_column) in [(1, 1, 6), (2, 11, 16), (2, 2, 3)] {
            let d = JsonDiagnostic {
                code: "SY201".into(),
                rule: "unknown-step".into(),
                severity: "error".into(),
                message: "m".into(),
                file: "t.yaml".into(),
                line,
                column,
                end_line: line,
                end_column,
                help: None,
                labels: Vec::new(),
            };
            let s = suggestion(&d, Some(&info));
            let mut lines: Vec<&str> = text.lines().take(line).collect();
            lines.push(s.strip_prefix("    ").expect("indented"));
            let parsed = parse_file("t.yaml", &lines.join("\n")).unwrap_or_else(|e| panic!("{s:?}: {e:?}"));
            assert!(matches(&parsed.expectations[0], &d, &parsed), "{s:?}");
        }
    }
}

/// Paths of the fixtures, for other test modules (snapshots).
pub fn rule_dir(rule: &str) -> PathBuf {
    support::fixtures_dir().join(rule)
}
