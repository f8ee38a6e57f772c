//! Renderers: diagnostics as text for people (miette) and for machines (JSON, SARIF, GitHub).
//!
//! Every renderer is a pure function from diagnostics and the [`SourceMap`] they point into to a
//! `String`; choosing a format, colours and printing are the CLI's job. Positions shown to users
//! and machines are 1-based lines and 1-based columns counted in characters (see
//! [`SourceFile::line_col`]); an end position is the one just after the span's last character.
//! Output is deterministic: the same diagnostics give the same bytes.

use std::fmt::{self, Write as _};

use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, SourceCode, SourceSpan};
use serde::Serialize;
use serde_json::{Value, json};

use super::excerpt::Excerpt;
use super::{Diagnostic, Label, RULES, Severity};
use crate::source::{SourceFile, SourceMap, Span};

const SARIF_SCHEMA: &str = "https://json.schemastore.org/sarif-2.1.0.json";
/// The project's home, from `repository` in Cargo.toml; SARIF omits it while that is unset.
const INFORMATION_URI: &str = env!("CARGO_PKG_REPOSITORY");

/// Lines shown before and after each labelled line of a snippet.
const CONTEXT_LINES: usize = 1;

/// How [`human`] draws: colours on or off (off for files, pipes and snapshots), and the width
/// that long lines wrap at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanOptions {
    pub color: bool,
    pub width: usize,
}

impl Default for HumanOptions {
    fn default() -> Self {
        HumanOptions {
            color: false,
            width: 100,
        }
    }
}

/// Diagnostics for people: each one as a miette report (header `error[SY201] unknown-step`, the
/// message, a snippet of the file with the primary label under the exact span and the secondary
/// labels of the same file, then help), one blank line between reports. A secondary label in
/// another file becomes a `note: <label>: file:line:col` line under its report.
pub fn human(diags: &[Diagnostic], sources: &SourceMap, opts: &HumanOptions) -> String {
    let theme = if opts.color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(opts.width)
        .with_links(false)
        .with_context_lines(CONTEXT_LINES);
    let mut out = String::new();
    for (i, diag) in diags.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let report = Report::new(diag, sources);
        let mut text = String::new();
        if handler.render_report(&mut text, &report).is_err() {
            // miette only fails when it cannot read a span; say what we know without a snippet.
            text = fallback_text(diag, sources);
        }
        out.push_str(text.trim_end());
        out.push('\n');
        for label in diag
            .secondary
            .iter()
            .filter(|l| l.span.file != diag.primary.span.file)
        {
            let (line, col) = sources.get(label.span.file).line_col(label.span.start as usize);
            let name = &sources.get(label.span.file).name;
            let message = if label.message.is_empty() {
                "see"
            } else {
                label.message.as_str()
            };
            writeln!(out, "  note: {message}: {name}:{line}:{col}").expect("writing to a String");
        }
    }
    out
}

/// The closing line of a lint run: `checked 3 files: 2 errors, 1 warning`, or
/// `checked 3 files: no problems`.
pub fn summary(diags: &[Diagnostic], files_checked: usize) -> String {
    let errors = diags.iter().filter(|d| d.severity == Severity::Error).count();
    let warnings = diags.len() - errors;
    let files = plural(files_checked, "file");
    let mut parts = Vec::new();
    if errors > 0 {
        parts.push(plural(errors, "error"));
    }
    if warnings > 0 {
        parts.push(plural(warnings, "warning"));
    }
    if parts.is_empty() {
        format!("checked {files}: no problems")
    } else {
        format!("checked {files}: {}", parts.join(", "))
    }
}

/// Diagnostics as a JSON array (pretty-printed), one object per diagnostic:
/// `{code, rule, severity, message, file, line, column, end_line, end_column, help, labels}`,
/// where `labels` lists the primary label first (`primary: true`), then the secondary ones.
pub fn json(diags: &[Diagnostic], sources: &SourceMap) -> String {
    let items: Vec<JsonDiagnostic<'_>> = diags
        .iter()
        .map(|d| {
            let at = Position::of(d.primary.span, sources);
            let mut labels = vec![JsonLabel::new(&d.primary, primary_text(d), true, sources)];
            labels.extend(
                d.secondary
                    .iter()
                    .map(|l| JsonLabel::new(l, &l.message, false, sources)),
            );
            JsonDiagnostic {
                code: d.rule.code,
                rule: d.rule.name,
                severity: d.severity.as_str(),
                message: &d.message,
                file: at.file,
                line: at.line,
                column: at.column,
                end_line: at.end_line,
                end_column: at.end_column,
                help: d.help.as_deref(),
                labels,
            }
        })
        .collect();
    serde_json::to_string_pretty(&items).expect("diagnostics serialize to JSON")
}

/// Diagnostics as a SARIF 2.1.0 log for GitHub code scanning: one run whose driver lists every
/// rule of the registry (so `ruleIndex` is the rule's place in [`RULES`]), and one result per
/// diagnostic with its primary location, the secondary labels as related locations, and a
/// [`fingerprint`] under `partialFingerprints` that lets a code-scanning service match a result
/// with the same one of an earlier upload when lines above it moved.
pub fn sarif(diags: &[Diagnostic], sources: &SourceMap) -> String {
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let rules: Vec<Value> = RULES
        .iter()
        .map(|r| {
            json!({
                "id": r.code,
                "name": r.name,
                "shortDescription": {"text": r.summary},
                "fullDescription": {"text": doc_section(r.doc, "What it does").unwrap_or(r.summary)},
                "help": {"text": r.doc, "markdown": r.doc},
                "defaultConfiguration": {"level": r.severity.as_str()},
            })
        })
        .collect();
    let results: Vec<Value> = diags
        .iter()
        .map(|d| {
            let rule_index = RULES.iter().position(|r| r.code == d.rule.code);
            let mut text = d.message.clone();
            if let Some(help) = &d.help {
                text.push_str("\nhelp: ");
                text.push_str(help);
            }
            let mut result = json!({
                "ruleId": d.rule.code,
                "ruleIndex": rule_index,
                "level": d.severity.as_str(),
                "message": {"text": text},
                "locations": [{"physicalLocation": sarif_location(d.primary.span, sources)}],
            });
            let hash = fingerprint(d, sources);
            let nth = seen.entry(hash.clone()).or_insert(0);
            *nth += 1;
            result["partialFingerprints"] = json!({FINGERPRINT_KEY: format!("{hash}:{nth}")});
            if rule_index.is_none() {
                result.as_object_mut().expect("an object").remove("ruleIndex");
            }
            if !d.secondary.is_empty() {
                let related: Vec<Value> = d
                    .secondary
                    .iter()
                    .enumerate()
                    .map(|(i, l)| {
                        let mut loc = json!({"id": i, "physicalLocation": sarif_location(l.span, sources)});
                        if !l.message.is_empty() {
                            loc["message"] = json!({"text": l.message});
                        }
                        loc
                    })
                    .collect();
                result["relatedLocations"] = Value::Array(related);
            }
            result
        })
        .collect();
    let mut driver = serde_json::Map::new();
    driver.insert("name".into(), json!("switchyard"));
    if !INFORMATION_URI.is_empty() {
        driver.insert("informationUri".into(), json!(INFORMATION_URI));
    }
    driver.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
    driver.insert("rules".into(), Value::Array(rules));
    let log = json!({
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": driver},
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    });
    serde_json::to_string_pretty(&log).expect("SARIF serializes to JSON")
}

/// The key of a result's fingerprint in `partialFingerprints`, versioned: a change to what
/// [`fingerprint`] hashes gets a new key rather than new values under the old one. (Not
/// `primaryLocationLineHash`, which codeql-action computes itself from the line's text.)
pub const FINGERPRINT_KEY: &str = "switchyardResultHash/v1";

/// What identifies a result whatever line it is on: the SHA-256 (hex, first 16 bytes) of its
/// code, its file's path, its message and the text under its primary label, with its
/// surrounding whitespace cut. [`sarif`] adds `:N` for the Nth result of the log with the same
/// hash, so equal results in one file stay apart.
fn fingerprint(d: &Diagnostic, sources: &SourceMap) -> String {
    use sha2::{Digest, Sha256};
    let file = sources.get(d.primary.span.file);
    let (start, end) = clamp(file, d.primary.span);
    let mut h = Sha256::new();
    for part in [
        d.rule.code,
        &artifact_path(&file.name),
        &d.message,
        file.text[start..end].trim(),
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize()[..16].iter().fold(String::new(), |mut out, b| {
        write!(out, "{b:02x}").expect("writing to a String");
        out
    })
}

/// Diagnostics as GitHub Actions workflow commands, one line each:
/// `::error file=F,line=L,col=C,endLine=L,endColumn=C,title=SY201 unknown-step::message`.
/// Help and secondary labels follow the message on escaped new lines (`%0A`).
pub fn github(diags: &[Diagnostic], sources: &SourceMap) -> String {
    let mut out = String::new();
    for d in diags {
        let at = Position::of(d.primary.span, sources);
        let mut message = d.message.clone();
        if let Some(help) = &d.help {
            message.push_str("\nhelp: ");
            message.push_str(help);
        }
        for l in &d.secondary {
            let p = Position::of(l.span, sources);
            let what = if l.message.is_empty() {
                "see"
            } else {
                l.message.as_str()
            };
            write!(message, "\nnote: {what}: {}:{}:{}", p.file, p.line, p.column)
                .expect("writing to a String");
        }
        writeln!(
            out,
            "::{} file={},line={},col={},endLine={},endColumn={},title={}::{}",
            d.severity.as_str(),
            escape_property(&artifact_path(at.file)),
            at.line,
            at.column,
            at.end_line,
            at.end_column,
            escape_property(&format!("{} {}", d.rule.code, d.rule.name)),
            escape_data(&message),
        )
        .expect("writing to a String");
    }
    out
}

/// The miette view of one diagnostic: the excerpt of its primary file that shows the primary
/// label and the secondary labels that point into the same file, long lines cut around them.
struct Report<'a> {
    diag: &'a Diagnostic,
    source: Excerpt<'a>,
    labels: Vec<LabeledSpan>,
}

impl<'a> Report<'a> {
    fn new(diag: &'a Diagnostic, sources: &'a SourceMap) -> Self {
        let file = sources.get(diag.primary.span.file);
        let mut spans = vec![(primary_text(diag).to_owned(), clamp(file, diag.primary.span))];
        spans.extend(
            diag.secondary
                .iter()
                .filter(|l| l.span.file == diag.primary.span.file)
                .map(|l| (l.message.clone(), clamp(file, l.span))),
        );
        let ranges: Vec<(usize, usize)> = spans.iter().map(|(_, r)| *r).collect();
        let source = Excerpt::new(file, &ranges, CONTEXT_LINES);
        let labels = spans
            .into_iter()
            .enumerate()
            .map(|(i, (text, (start, end)))| {
                let (start, end) = (source.to_virtual(start), source.to_virtual(end));
                let span = SourceSpan::new(start.into(), end - start);
                if i == 0 {
                    LabeledSpan::new_primary_with_span(Some(text), span)
                } else {
                    LabeledSpan::new_with_span((!text.is_empty()).then_some(text), span)
                }
            })
            .collect();
        Report { diag, source, labels }
    }
}

impl fmt::Debug for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.diag, f)
    }
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.diag.message)
    }
}

impl std::error::Error for Report<'_> {}

impl miette::Diagnostic for Report<'_> {
    fn code<'b>(&'b self) -> Option<Box<dyn fmt::Display + 'b>> {
        let d = self.diag;
        Some(Box::new(format!(
            "{}[{}] {}",
            d.severity.as_str(),
            d.rule.code,
            d.rule.name
        )))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.diag.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'b>(&'b self) -> Option<Box<dyn fmt::Display + 'b>> {
        self.diag
            .help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(&self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        Some(Box::new(self.labels.iter().cloned()))
    }
}

/// The primary label's text: its own, or the diagnostic's message when it has none.
fn primary_text(d: &Diagnostic) -> &str {
    if d.primary.message.is_empty() {
        &d.message
    } else {
        &d.primary.message
    }
}

/// A span clamped to the text and to character boundaries.
fn clamp(file: &SourceFile, span: Span) -> (usize, usize) {
    let text = &file.text;
    let floor = |mut i: usize| {
        i = i.min(text.len());
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let start = floor(span.start as usize);
    let mut end = (span.end as usize).clamp(start, text.len());
    while !text.is_char_boundary(end) {
        end += 1;
    }
    (start, end)
}

/// The report without a snippet, for a span miette could not read.
fn fallback_text(d: &Diagnostic, sources: &SourceMap) -> String {
    let at = Position::of(d.primary.span, sources);
    let mut text = format!(
        "{}[{}] {}\n  {}\n  at {}:{}:{}\n",
        d.severity.as_str(),
        d.rule.code,
        d.rule.name,
        d.message,
        at.file,
        at.line,
        at.column
    );
    if let Some(help) = &d.help {
        writeln!(text, "  help: {help}").expect("writing to a String");
    }
    text
}

/// Where a span is, as users count: 1-based lines and character columns, end exclusive.
struct Position<'a> {
    file: &'a str,
    line: usize,
    column: usize,
    end_line: usize,
    end_column: usize,
}

impl<'a> Position<'a> {
    fn of(span: Span, sources: &'a SourceMap) -> Self {
        let file = sources.get(span.file);
        let (start, end) = clamp(file, span);
        let (line, column) = file.line_col(start);
        let (end_line, end_column) = file.line_col(end);
        Position {
            file: &file.name,
            line,
            column,
            end_line,
            end_column,
        }
    }
}

#[derive(Serialize)]
struct JsonDiagnostic<'a> {
    code: &'a str,
    rule: &'a str,
    severity: &'a str,
    message: &'a str,
    file: &'a str,
    line: usize,
    column: usize,
    end_line: usize,
    end_column: usize,
    help: Option<&'a str>,
    labels: Vec<JsonLabel<'a>>,
}

#[derive(Serialize)]
struct JsonLabel<'a> {
    file: &'a str,
    line: usize,
    column: usize,
    end_line: usize,
    end_column: usize,
    message: &'a str,
    primary: bool,
}

impl<'a> JsonLabel<'a> {
    fn new(label: &Label, message: &'a str, primary: bool, sources: &'a SourceMap) -> Self {
        let at = Position::of(label.span, sources);
        JsonLabel {
            file: at.file,
            line: at.line,
            column: at.column,
            end_line: at.end_line,
            end_column: at.end_column,
            message,
            primary,
        }
    }
}

fn sarif_location(span: Span, sources: &SourceMap) -> Value {
    let at = Position::of(span, sources);
    let path = artifact_path(at.file);
    let mut artifact = json!({"uri": uri_encode(&path)});
    if !path.starts_with('/') {
        artifact["uriBaseId"] = json!("%SRCROOT%");
    }
    json!({
        "artifactLocation": artifact,
        "region": {
            "startLine": at.line,
            "startColumn": at.column,
            "endLine": at.end_line,
            "endColumn": at.end_column,
        },
    })
}

/// A display path as a repository-relative path: forward slashes, no leading `./`.
fn artifact_path(name: &str) -> String {
    let path = name.replace('\\', "/");
    let mut rest = path.as_str();
    while let Some(r) = rest.strip_prefix("./") {
        rest = r;
    }
    rest.to_owned()
}

/// Percent-encodes a path for a URI reference, keeping `/` and RFC 3986 unreserved characters.
fn uri_encode(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            write!(out, "%{b:02X}").expect("writing to a String");
        }
    }
    out
}

/// The text of a `## title` section of a rule doc, up to the next heading or code block.
fn doc_section<'d>(doc: &'d str, title: &str) -> Option<&'d str> {
    let heading = format!("## {title}\n");
    let start = doc.find(&heading)? + heading.len();
    let rest = &doc[start..];
    let end = ["\n## ", "\n```"]
        .iter()
        .filter_map(|m| rest.find(m))
        .min()
        .unwrap_or(rest.len());
    let text = rest[..end].trim();
    (!text.is_empty()).then_some(text)
}

/// Escapes the message of a workflow command (GitHub's `escapeData`).
fn escape_data(s: &str) -> String {
    s.replace('%', "%25").replace('\r', "%0D").replace('\n', "%0A")
}

/// Escapes a property value of a workflow command (GitHub's `escapeProperty`).
fn escape_property(s: &str) -> String {
    escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::codes::{DUPLICATE_DEFINITION, UNKNOWN_KEY, UNKNOWN_STEP, UNUSED_RESULT};
    use crate::source::{FileId, SourceFile};

    const FLOW: &str = "\
flow: triage
steps:
  fetch_docs:
    agent: fetcher
    next: fetch_doc
  classify:
    agent: classifier
";

    const OPTS: HumanOptions = HumanOptions {
        color: false,
        width: 100,
    };

    fn span_of(map: &SourceMap, file: FileId, needle: &str, nth: usize) -> Span {
        let text = &map.get(file).text;
        let start = text.match_indices(needle).nth(nth).expect("needle in text").0;
        Span::new(file, start, start + needle.len())
    }

    fn one_file(text: &str) -> (SourceMap, FileId) {
        let mut map = SourceMap::new();
        let id = map.add(SourceFile::new("flows/triage.yaml", None, text));
        (map, id)
    }

    /// An unknown step with help and a secondary label in the same file.
    fn unknown_step(map: &SourceMap, file: FileId) -> Diagnostic {
        Diagnostic::new(
            &UNKNOWN_STEP,
            span_of(map, file, "fetch_doc", 1),
            "unknown step `fetch_doc`",
        )
        .label("no step named `fetch_doc`")
        .with_secondary(
            span_of(map, file, "fetch_docs", 0),
            "a similar step is defined here",
        )
        .help("did you mean `fetch_docs`?")
    }

    #[test]
    fn human_error_with_help_and_secondary_label() {
        let (map, file) = one_file(FLOW);
        let out = human(&[unknown_step(&map, file)], &map, &OPTS);
        insta::assert_snapshot!(out, @r"
        error[SY201] unknown-step

          × unknown step `fetch_doc`
           ╭─[flows/triage.yaml:5:11]
         2 │ steps:
         3 │   fetch_docs:
           ·   ─────┬────
           ·        ╰── a similar step is defined here
         4 │     agent: fetcher
         5 │     next: fetch_doc
           ·           ────┬────
           ·               ╰── no step named `fetch_doc`
         6 │   classify:
           ╰────
          help: did you mean `fetch_docs`?
        ");
    }

    #[test]
    fn human_warning_with_default_label() {
        let (map, file) = one_file(FLOW);
        let d = Diagnostic::new(
            &UNUSED_RESULT,
            span_of(&map, file, "classify", 0),
            "result of `classify` is never used",
        );
        let out = human(&[d], &map, &OPTS);
        insta::assert_snapshot!(out, @r"
        warning[SY502] unused-result

          ⚠ result of `classify` is never used
           ╭─[flows/triage.yaml:6:3]
         5 │     next: fetch_doc
         6 │   classify:
           ·   ────┬───
           ·       ╰── result of `classify` is never used
         7 │     agent: classifier
           ╰────
        ");
    }

    #[test]
    fn human_counts_columns_in_characters() {
        let (map, file) = one_file("flow: tri\nsteps:\n  ünïcødé: {agent: x, tïmeout: 5s}\n");
        let d = Diagnostic::new(
            &UNKNOWN_KEY,
            span_of(&map, file, "tïmeout", 0),
            "unknown key `tïmeout`",
        )
        .help("did you mean `timeout`?");
        let out = human(std::slice::from_ref(&d), &map, &OPTS);
        insta::assert_snapshot!(out, @r"
        error[SY103] unknown-key

          × unknown key `tïmeout`
           ╭─[flows/triage.yaml:3:23]
         2 │ steps:
         3 │   ünïcødé: {agent: x, tïmeout: 5s}
           ·                       ───┬───
           ·                          ╰── unknown key `tïmeout`
           ╰────
          help: did you mean `timeout`?
        ");
        let v: Value = serde_json::from_str(&json(&[d], &map)).expect("valid JSON");
        assert_eq!(
            (v[0]["line"].as_u64(), v[0]["column"].as_u64()),
            (Some(3), Some(23))
        );
        assert_eq!(
            (v[0]["end_line"].as_u64(), v[0]["end_column"].as_u64()),
            (Some(3), Some(30))
        );
    }

    #[test]
    fn human_notes_a_secondary_label_in_another_file() {
        let mut map = SourceMap::new();
        let flow = map.add(SourceFile::new(
            "flow.yaml",
            None,
            "imports: [common.yaml]\nagents:\n  fetcher: {kind: mock}\n",
        ));
        let common = map.add(SourceFile::new(
            "common.yaml",
            None,
            "agents:\n  fetcher: {kind: http}\n",
        ));
        let d = Diagnostic::new(
            &DUPLICATE_DEFINITION,
            span_of(&map, flow, "fetcher", 0),
            "agent `fetcher` is defined twice",
        )
        .label("defined again here")
        .with_secondary(span_of(&map, common, "fetcher", 0), "first defined here")
        .help("rename one of them or remove one definition");
        let out = human(&[d], &map, &OPTS);
        insta::assert_snapshot!(out, @r"
        error[SY204] duplicate-definition

          × agent `fetcher` is defined twice
           ╭─[flow.yaml:3:3]
         2 │ agents:
         3 │   fetcher: {kind: mock}
           ·   ───┬───
           ·      ╰── defined again here
           ╰────
          help: rename one of them or remove one definition
          note: first defined here: common.yaml:2:3
        ");
    }

    #[test]
    fn human_handles_empty_files_and_bad_spans() {
        let (map, file) = one_file("");
        let d = Diagnostic::new(&UNKNOWN_KEY, Span::file_start(file), "empty file");
        assert!(human(&[d], &map, &OPTS).contains("empty file"));
        let (map, file) = one_file("é: 1\n");
        // Offsets inside a character and past the end are clamped, never a panic.
        let d = Diagnostic::new(&UNKNOWN_KEY, Span::new(file, 1, 99), "bad span");
        let out = human(std::slice::from_ref(&d), &map, &OPTS);
        assert!(out.contains("bad span"), "{out}");
        let v: Value = serde_json::from_str(&json(&[d], &map)).expect("valid JSON");
        assert_eq!(
            (v[0]["line"].as_u64(), v[0]["column"].as_u64()),
            (Some(1), Some(1))
        );
        assert_eq!(
            (v[0]["end_line"].as_u64(), v[0]["end_column"].as_u64()),
            (Some(2), Some(1))
        );
    }

    #[test]
    fn human_separates_reports_with_a_blank_line() {
        let (map, file) = one_file(FLOW);
        let d = unknown_step(&map, file);
        let out = human(&[d.clone(), d], &map, &OPTS);
        assert_eq!(out.matches("error[SY201] unknown-step").count(), 2);
        assert!(out.contains("fetch_docs`?\n\nerror[SY201]"), "{out}");
    }

    #[test]
    fn summary_counts_errors_warnings_and_files() {
        let (map, file) = one_file(FLOW);
        let e = unknown_step(&map, file);
        let w = Diagnostic::new(&UNUSED_RESULT, Span::file_start(file), "unused");
        assert_eq!(summary(&[], 3), "checked 3 files: no problems");
        assert_eq!(summary(std::slice::from_ref(&e), 1), "checked 1 file: 1 error");
        assert_eq!(summary(std::slice::from_ref(&w), 2), "checked 2 files: 1 warning");
        assert_eq!(
            summary(&[e.clone(), w.clone(), e, w.clone(), w], 3),
            "checked 3 files: 2 errors, 3 warnings"
        );
    }

    #[test]
    fn json_has_every_field() {
        let (map, file) = one_file(FLOW);
        let plain = Diagnostic::new(&UNUSED_RESULT, span_of(&map, file, "classify", 0), "unused");
        let v: Value =
            serde_json::from_str(&json(&[unknown_step(&map, file), plain], &map)).expect("valid JSON");
        let d = &v[0];
        assert_eq!(d["code"], "SY201");
        assert_eq!(d["rule"], "unknown-step");
        assert_eq!(d["severity"], "error");
        assert_eq!(d["message"], "unknown step `fetch_doc`");
        assert_eq!(d["file"], "flows/triage.yaml");
        assert_eq!(
            [&d["line"], &d["column"], &d["end_line"], &d["end_column"]],
            [5, 11, 5, 20]
        );
        assert_eq!(d["help"], "did you mean `fetch_docs`?");
        let labels = d["labels"].as_array().expect("labels");
        assert_eq!(labels.len(), 2);
        assert_eq!(labels[0]["primary"], true);
        assert_eq!(labels[0]["message"], "no step named `fetch_doc`");
        assert_eq!(labels[1]["primary"], false);
        assert_eq!(labels[1]["message"], "a similar step is defined here");
        assert_eq!(
            [&labels[1]["line"], &labels[1]["column"], &labels[1]["end_column"]],
            [3, 3, 13]
        );
        assert_eq!(v[1]["severity"], "warning");
        assert_eq!(v[1]["help"], Value::Null);
        assert_eq!(
            v[1]["labels"][0]["message"], "unused",
            "the primary label repeats the message"
        );
        assert_eq!(json(&[], &map), "[]");
    }

    #[test]
    fn sarif_has_the_shape_github_accepts() {
        let mut map = SourceMap::new();
        let file = map.add(SourceFile::new(".\\flows\\my triage.yaml", None, FLOW));
        let d = unknown_step(&map, file);
        let text = sarif(std::slice::from_ref(&d), &map);
        assert_eq!(text, sarif(&[d], &map), "deterministic");
        let v: Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(v["version"], "2.1.0");
        assert!(v["$schema"].as_str().expect("schema").contains("sarif-2.1.0"));
        let run = &v["runs"][0];
        let driver = &run["tool"]["driver"];
        assert_eq!(driver["name"], "switchyard");
        assert_eq!(driver["version"], env!("CARGO_PKG_VERSION"));
        let rules = driver["rules"].as_array().expect("rules");
        assert_eq!(rules.len(), RULES.len());
        for (rule, r) in rules.iter().zip(RULES) {
            assert_eq!(rule["id"], r.code);
            assert_eq!(rule["name"], r.name);
            assert_eq!(rule["shortDescription"]["text"], r.summary);
            assert!(!rule["fullDescription"]["text"].as_str().expect("full").is_empty());
            assert_eq!(rule["help"]["markdown"], r.doc);
            assert_eq!(rule["defaultConfiguration"]["level"], r.severity.as_str());
        }
        let result = &run["results"][0];
        assert_eq!(result["ruleId"], "SY201");
        let index = result["ruleIndex"].as_u64().expect("ruleIndex") as usize;
        assert_eq!(rules[index]["id"], "SY201");
        assert_eq!(result["level"], "error");
        assert_eq!(
            result["message"]["text"],
            "unknown step `fetch_doc`\nhelp: did you mean `fetch_docs`?"
        );
        let loc = &result["locations"][0]["physicalLocation"];
        assert_eq!(loc["artifactLocation"]["uri"], "flows/my%20triage.yaml");
        assert_eq!(
            loc["region"],
            json!({"startLine": 5, "startColumn": 11, "endLine": 5, "endColumn": 20})
        );
        let related = &result["relatedLocations"][0];
        assert_eq!(related["message"]["text"], "a similar step is defined here");
        assert_eq!(related["physicalLocation"]["region"]["startLine"], 3);
    }

    #[test]
    fn github_escapes_data_and_properties() {
        let mut map = SourceMap::new();
        let file = map.add(SourceFile::new("flows/a,b:c.yaml", None, FLOW));
        let d = unknown_step(&map, file);
        let w = Diagnostic::new(
            &UNUSED_RESULT,
            span_of(&map, file, "classify", 0),
            "100% unused\r\nreally",
        );
        assert_eq!(
            github(&[d, w], &map),
            "::error file=flows/a%2Cb%3Ac.yaml,line=5,col=11,endLine=5,endColumn=20,title=SY201 unknown-step\
             ::unknown step `fetch_doc`%0Ahelp: did you mean `fetch_docs`?\
             %0Anote: a similar step is defined here: flows/a,b:c.yaml:3:3\n\
             ::warning file=flows/a%2Cb%3Ac.yaml,line=6,col=3,endLine=6,endColumn=11,title=SY502 unused-result\
             ::100%25 unused%0D%0Areally\n"
        );
    }

    #[test]
    fn doc_section_reads_a_section() {
        let doc = "# SY1 x\n\n## What it does\n\nChecks things.\n\n## Why is this bad\n";
        assert_eq!(doc_section(doc, "What it does"), Some("Checks things."));
        assert_eq!(doc_section(doc, "Why is this bad"), None);
    }
}
