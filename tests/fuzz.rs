//! Property tests of lint through the library (`Project::load_top` + `lint_project`, what
//! `switchyard lint` runs):
//!
//! - generated flows: random but plausible YAML (step ids valid and not, edges to known and
//!   unknown steps and back, typo'd keys, nested constructs, scalars of every YAML type);
//! - mutated flows: valid flows truncated, with bytes flipped, and with `{[&*:` and friends
//!   inserted, and lines made 70,000 characters long.
//!
//! For every input: lint returns and its diagnostics render for people (no panic, no hang), every diagnostic's labels are spans inside
//! their file on character boundaries, every code is in the registry, and two runs give the same
//! output. Cases are few (64 per property) so CI stays fast; proptest shrinks a failure to a
//! small input and prints it.

use std::path::Path;
use std::sync::mpsc;

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestRunner;
use switchyard::__private::diag::{Diagnostic, RULES, render};
use switchyard::__private::lint::lint_project;
use switchyard::__private::project::Project;
use switchyard::__private::syntax::Limits;

use crate::support::{self, TempDir};

// ----- a tiny YAML writer ------------------------------------------------------------------------

/// A YAML document to write: scalars and flow collections are written as they are (so they can
/// be any text, valid or not), mappings and sequences in block style.
#[derive(Clone, Debug)]
enum Y {
    /// A scalar or an inline flow collection, written verbatim.
    S(String),
    /// A block mapping; keys are written verbatim.
    M(Vec<(String, Y)>),
    /// A block sequence.
    L(Vec<Y>),
}

fn s(text: &str) -> Y {
    Y::S(text.to_owned())
}

/// Writes `y` as the value after a `key:` or `-` already written.
fn write_value(y: &Y, indent: usize, out: &mut String) {
    match y {
        Y::S(text) => {
            out.push(' ');
            out.push_str(text);
            out.push('\n');
        }
        Y::M(entries) if entries.is_empty() => out.push_str(" {}\n"),
        Y::L(items) if items.is_empty() => out.push_str(" []\n"),
        Y::M(entries) => {
            out.push('\n');
            for (k, v) in entries {
                out.push_str(&" ".repeat(indent));
                out.push_str(k);
                out.push(':');
                write_value(v, indent + 2, out);
            }
        }
        Y::L(items) => {
            out.push('\n');
            for item in items {
                out.push_str(&" ".repeat(indent));
                out.push('-');
                write_value(item, indent + 2, out);
            }
        }
    }
}

fn document(entries: &[(String, Y)]) -> String {
    let mut out = String::new();
    for (k, v) in entries {
        out.push_str(k);
        out.push(':');
        write_value(v, 2, &mut out);
    }
    out
}

// ----- pools -------------------------------------------------------------------------------------

/// Scalars of every YAML type, with the YAML 1.1 booleans, odd numbers and things that look like
/// expressions, paths, durations, sizes, templates and secrets.
const SCALARS: &[&str] = &[
    "yes",
    "NO",
    "on",
    "Off",
    "y",
    "~",
    "null",
    "true",
    "False",
    "0x1F",
    "012",
    "-1",
    "0",
    "3",
    "100001",
    "1e400",
    "-.inf",
    ".nan",
    "2.5",
    "99999999999999999999999",
    "5s",
    "5d",
    "250ms",
    "1.5m",
    "8MiB",
    "12 parsecs",
    "\"quoted: string\"",
    "'single ''quoted'''",
    "\"\"",
    "=payload.x",
    "=result.ok && true",
    "$.a.b",
    "$..x",
    "$.items[*].id",
    "\"{{ input.x }}\"",
    "\"{% if x %}\"",
    "sk-abcdefghijklmnopqrstuvwxyz012345",
    "${env:API_KEY}",
    "ü",
    "a b",
    "http://user:pw@host/x",
    "[]",
    "{}",
    "[1, [2, {a: b}]]",
    "{$.x: $.y, $.z: =1}",
    "!!str 3",
    "&anchor value",
    "*anchor",
    "*undefined",
    "\"\\u0000\"",
    "|\n  block text",
    ">-\n  folded",
];

const STEP_IDS: &[&str] = &[
    "classify",
    "fetch",
    "fetch_docs",
    "draft",
    "a",
    "b2",
    "end",
    "Fetch",
    "fetch-docs",
    "2fast",
    "yes",
    "NO",
    "\"quoted id\"",
    "ü",
    "start",
];

const AGENT_NAMES: &[&str] = &[
    "classifier",
    "kb_search",
    "writer",
    "Writer",
    "kb-search",
    "x",
    "end",
    "poll",
];

const KINDS: &[&str] = &[
    "llm",
    "command",
    "http",
    "flow",
    "transform",
    "mock",
    "comand",
    "3",
];

/// Keys of every place, some misspelt, so that unknown-key checks and did-you-mean run.
const KEYS: &[&str] = &[
    "description",
    "next",
    "timeout",
    "retry",
    "idempotent",
    "message",
    "scope",
    "input",
    "output",
    "foreach",
    "as",
    "max_items",
    "tolerate",
    "select",
    "concurrency",
    "while",
    "max_iterations",
    "delay",
    "fail_fast",
    "nxt",
    "agnet",
    "stpes",
    "retries",
    "on",
    "to",
    "if",
    "errors",
    "kind",
    "provider",
    "model",
    "system",
    "prompt",
    "temperature",
    "max_tokens",
    "message_mode",
    "max_messages",
    "run",
    "env",
    "url",
    "headers",
    "path",
    "steps",
    "result",
    "returns",
    "sequence",
    "latency",
    "fail_times",
    "fail_rate",
    "seed",
    "result_schema",
    "api_key",
    "base_url",
    "attempts",
    "backoff",
    "max_backoff",
    "factor",
    "jitter",
    "\"odd key\"",
];

const FLOW_NAMES: &[&str] = &["ok", "ticket-triage", "Bad Name", "42", "\"\"", "x_y-z"];

const IMPORTS: &[&str] = &[
    "lib.yaml",
    "missing.yaml",
    "../outside.yaml",
    "flow.yaml",
    "/etc/x.yaml",
];

const FLOW_PATHS: &[&str] = &[
    "flow.yaml",
    "other.yaml",
    "missing.yaml",
    "../up.yaml",
    "lib.yaml",
];

const CONDITIONS: &[&str] = &[
    "result.ok",
    "payload.x > 1",
    "true",
    "\"!result.done\"",
    "yes",
    "3",
];

const OUTCOMES: &[&str] = &["success", "failure", "always", "yes", "sucess"];

/// Files beside the generated `flow.yaml`: a flow that calls it back (a cycle across files) and
/// a file of shared agents that imports itself.
const OTHER_FLOW: &str = "\
flow: other
agents:
  back: {kind: flow, path: flow.yaml}
steps:
  go:
    agent: back
";
const LIB: &str = "\
imports: [lib.yaml]
agents:
  kb_search: {kind: mock, returns: {}}
  classifier: {kind: mock, returns: {}}
providers:
  local: {base_url: \"http://127.0.0.1:8000/v1\"}
";

// ----- strategies --------------------------------------------------------------------------------

fn pick(pool: &'static [&'static str]) -> impl Strategy<Value = String> + Clone {
    select(pool).prop_map(str::to_owned)
}

fn scalar() -> BoxedStrategy<String> {
    prop_oneof![
        6 => pick(SCALARS),
        1 => any::<i64>().prop_map(|i| i.to_string()),
        1 => any::<f64>().prop_map(|f| format!("{f:?}")),
        1 => "[a-z_]{1,12}",
        1 => "[ -~]{0,16}".prop_map(|s| format!("{s:?}")),
    ]
    .boxed()
}

/// Any value: scalars, flow collections, nested block mappings and lists.
fn value() -> BoxedStrategy<Y> {
    scalar()
        .prop_map(Y::S)
        .prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec((pick(KEYS), inner.clone()), 0..4).prop_map(Y::M),
                prop::collection::vec(inner, 0..4).prop_map(Y::L),
            ]
        })
        .boxed()
}

fn edge() -> BoxedStrategy<Y> {
    (
        prop_oneof![4 => pick(STEP_IDS), 1 => scalar()],
        prop::option::of(pick(CONDITIONS)),
        prop::option::of(pick(OUTCOMES)),
        prop::bool::weighted(0.15),
        prop::collection::vec((pick(KEYS), value()), 0..2),
    )
        .prop_map(|(to, cond, on, errors, extra)| {
            let mut e = vec![("to".to_owned(), Y::S(to))];
            if let Some(c) = cond {
                e.push(("if".into(), Y::S(c)));
            }
            if let Some(o) = on {
                e.push(("on".into(), Y::S(o)));
            }
            if errors {
                e.push(("errors".into(), s("[timeout, agent]")));
            }
            e.extend(extra);
            Y::M(e)
        })
        .boxed()
}

fn next() -> BoxedStrategy<Y> {
    prop_oneof![
        pick(STEP_IDS).prop_map(Y::S),
        prop::collection::vec(edge(), 0..4).prop_map(Y::L),
        scalar().prop_map(Y::S),
    ]
    .boxed()
}

/// An agent definition; `depth` bounds inline flows inside it.
fn agent_def(depth: u32) -> BoxedStrategy<Y> {
    let kind_specific = if depth == 0 {
        pick(FLOW_PATHS)
            .prop_map(|p| vec![("path".to_owned(), Y::S(p))])
            .boxed()
    } else {
        prop_oneof![
            pick(FLOW_PATHS).prop_map(|p| vec![("path".to_owned(), Y::S(p))]),
            steps(depth - 1).prop_map(|st| vec![("steps".to_owned(), st)]),
        ]
        .boxed()
    };
    (
        pick(KINDS),
        prop::collection::vec((pick(KEYS), value()), 0..4),
        kind_specific,
        prop::option::of(select(&["local", "remote", "3"][..])),
    )
        .prop_map(|(kind, extra, flow_fields, provider)| {
            let mut m = vec![("kind".to_owned(), Y::S(kind.clone()))];
            match kind.as_str() {
                "flow" => m.extend(flow_fields),
                "llm" => {
                    if let Some(p) = provider {
                        m.push(("provider".into(), s(p)));
                    }
                    m.push(("model".into(), s("m")));
                }
                "command" => m.push(("run".into(), s("[sh, -c, \"echo {{ input.x }}\"]"))),
                "mock" => m.push(("returns".into(), s("{ok: true}"))),
                _ => {}
            }
            m.extend(extra);
            Y::M(m)
        })
        .boxed()
}

/// A step; `depth` bounds inline flows inside it.
fn step(depth: u32) -> BoxedStrategy<Y> {
    let kind = prop_oneof![
        3 => prop_oneof![pick(AGENT_NAMES).prop_map(Y::S), agent_def(depth)]
            .prop_map(|a| ("agent".to_owned(), a)),
        1 => prop::collection::vec((select(&["$.a", "$.b[0]", "$..x", "x"][..]).prop_map(str::to_owned), scalar().prop_map(Y::S)), 0..3)
            .prop_map(|m| ("set".to_owned(), Y::M(m))),
        1 => prop::collection::vec((pick(STEP_IDS), pick(AGENT_NAMES).prop_map(|a| Y::M(vec![("agent".to_owned(), Y::S(a))]))), 0..3)
            .prop_map(|m| ("parallel".to_owned(), Y::M(m))),
        1 => Just(("interrupt".to_owned(), s("{prompt: \"ok?\", expires: 72h}"))),
        1 => Just(("fail".to_owned(), s("{kind: rejected, message: \"no\"}"))),
        1 => Just(("succeed".to_owned(), s("{}"))),
        1 => Just(("description".to_owned(), s("a step without a kind"))),
    ];
    (
        kind,
        prop::option::of(next()),
        prop::collection::vec((pick(KEYS), value()), 0..3),
        prop::option::of(select(&["foreach", "while"][..])),
        prop::option::of(scalar()),
        prop::bool::weighted(0.1),
    )
        .prop_map(|((k, v), next, extra, looping, bound, second_kind)| {
            let mut m = vec![(k, v)];
            if second_kind {
                m.push(("succeed".into(), s("{}")));
            }
            match looping {
                Some("foreach") => m.push(("foreach".into(), s("$.items"))),
                Some(_) => {
                    m.push(("while".into(), s("=iteration < 3")));
                    if let Some(b) = bound {
                        m.push(("max_iterations".into(), Y::S(b)));
                    }
                }
                None => {}
            }
            if let Some(n) = next {
                m.push(("next".into(), n));
            }
            m.extend(extra);
            Y::M(m)
        })
        .boxed()
}

fn steps(depth: u32) -> BoxedStrategy<Y> {
    prop::collection::vec((pick(STEP_IDS), step(depth)), 0..6)
        .prop_map(Y::M)
        .boxed()
}

/// A whole flow file.
fn flow() -> BoxedStrategy<String> {
    (
        prop::option::of(pick(FLOW_NAMES)),
        prop::option::of(prop::collection::vec(pick(IMPORTS), 0..3)),
        prop::collection::vec((pick(AGENT_NAMES), agent_def(1)), 0..4),
        prop::option::of(select(
            &["[llm, mock]", "[]", "[flow, mock, command]", "[bogus]"][..],
        )),
        prop::option::of(pick(STEP_IDS)),
        steps(1),
        prop::collection::vec((pick(KEYS), value()), 0..3),
        prop::option::of(select(
            &["{timeout: 5s, retry: {attempts: 0}}", "{timeout: 5}", "[]"][..],
        )),
        prop::option::of(select(
            &["{max_depth: 99, max_steps: 0}", "{max_payload_bytes: 12}"][..],
        )),
        prop::option::of((pick(STEP_IDS), pick(AGENT_NAMES))),
    )
        .prop_map(
            |(name, imports, agents, allow, start, steps, extra, defaults, limits, test)| {
                let mut top = Vec::new();
                if let Some(n) = name {
                    top.push(("flow".to_owned(), Y::S(n)));
                }
                if let Some(i) = imports {
                    top.push(("imports".into(), Y::L(i.into_iter().map(Y::S).collect())));
                }
                if !agents.is_empty() {
                    top.push(("agents".into(), Y::M(agents)));
                }
                if let Some(a) = allow {
                    top.push(("allow".into(), s(a)));
                }
                if let Some(st) = start {
                    top.push(("start".into(), Y::S(st)));
                }
                top.push(("steps".into(), steps));
                if let Some(d) = defaults {
                    top.push(("defaults".into(), s(d)));
                }
                if let Some(l) = limits {
                    top.push(("limits".into(), s(l)));
                }
                if let Some((path_step, mocked)) = test {
                    let t = Y::M(vec![
                        ("name".into(), s("a test")),
                        ("mocks".into(), Y::M(vec![(mocked, s("{returns: {}}"))])),
                        (
                            "expect".into(),
                            Y::S(format!("{{status: succeeded, path: [{path_step}]}}")),
                        ),
                    ]);
                    top.push(("tests".into(), Y::L(vec![t])));
                }
                top.extend(extra);
                document(&top)
            },
        )
        .boxed()
}

// ----- mutations ---------------------------------------------------------------------------------

const TOKENS: &[&str] = &[
    "{", "}", "[", "]", "&", "*", ":", "{[&*:", "&a ", "*a", "- ", "? ", "\t", "\n", "#", "\"", "'", "|",
    ">", "!", "%", "@", "`", "---\n", "...\n", "\u{feff}", "\0", "ü", "\r",
];

#[derive(Clone, Debug)]
enum Mutation {
    Truncate(usize),
    Flip(usize, u8),
    Insert(usize, &'static str),
    Delete(usize, usize),
    RawByte(usize, u8),
    /// 70,000 characters inserted, so that a line (a scalar, a key, a comment) is longer than
    /// any snippet can show and its problems are past column 65,535.
    Widen(usize, char),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => any::<usize>().prop_map(Mutation::Truncate),
        2 => (any::<usize>(), 1..=255u8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        4 => (any::<usize>(), select(TOKENS)).prop_map(|(i, t)| Mutation::Insert(i, t)),
        1 => (any::<usize>(), 1..20usize).prop_map(|(i, n)| Mutation::Delete(i, n)),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::RawByte(i, b)),
        1 => (any::<usize>(), select(&['x', ' ', 'é', '{'][..])).prop_map(|(i, c)| Mutation::Widen(i, c)),
    ]
}

fn mutate(base: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = base.to_vec();
    for m in mutations {
        let at = |i: usize, len: usize| if len == 0 { 0 } else { i % (len + 1) };
        match *m {
            Mutation::Truncate(i) => {
                let n = at(i, bytes.len());
                bytes.truncate(n);
            }
            Mutation::Flip(i, b) if !bytes.is_empty() => {
                let n = i % bytes.len();
                bytes[n] ^= b;
            }
            Mutation::Insert(i, t) => {
                let n = at(i, bytes.len());
                bytes.splice(n..n, t.bytes());
            }
            Mutation::Delete(i, len) => {
                let n = at(i, bytes.len());
                let end = (n + len).min(bytes.len());
                bytes.drain(n..end);
            }
            Mutation::RawByte(i, b) => {
                let n = at(i, bytes.len());
                bytes.insert(n, b);
            }
            Mutation::Widen(i, c) => {
                let n = at(i, bytes.len());
                let wide = c.to_string().repeat(70_000);
                bytes.splice(n..n, wide.bytes());
            }
            Mutation::Flip(..) => {}
        }
    }
    bytes
}

/// A valid flow using most constructs, for the mutation test.
const RICH_FLOW: &str = "\
flow: rich
imports: [lib.yaml]
defaults: {timeout: 30s, retry: &base {attempts: 2, backoff: 1s}}
limits: {max_steps: 100, max_depth: 2}
agents:
  writer: {kind: llm, provider: local, model: m, temperature: 0.2}
  tool:
    kind: command
    run: [python3, tool.py, --top, \"3\"]
    env: {MODE: fast}
  child:
    kind: flow
    steps:
      inner: {agent: {kind: mock, returns: {x: 1}}, output: \"*\"}
start: classify
steps:
  classify:
    agent: classifier
    retry: *base
    output: {$.classification: $}
    next:
      - to: answer_all
        if: result.confidence > 0.5
      - to: escalate
        on: failure
      - to: end
  answer_all:
    foreach: $.questions
    as: q
    concurrency: 4
    agent: kb_search
    input: {$.q: =q.text}
    output: {$.answers: $}
    next: enrich
  enrich:
    parallel:
      left: {agent: writer, output: {$.left: $}}
      right: {agent: child, output: {$.right: $}}
    next: poll
  poll:
    agent: tool
    while: =iteration < 3
    max_iterations: 3
    output: {$.polled: $}
    next: done
  done:
    succeed: {}
  escalate:
    fail: {kind: escalated, message: \"ticket {{ input.id }}\"}
tests:
  - name: runs
    mocks: {classifier: {returns: {confidence: 0.9}}}
    expect: {status: succeeded, path: [classify, answer_all]}
";

// ----- checks ------------------------------------------------------------------------------------

/// Lints `flow.yaml` in `dir` as `switchyard lint` does: (rendered JSON, rendered for people,
/// problems found).
fn lint_once(dir: &Path) -> (String, String, Vec<String>) {
    let mut project = Project::default();
    project.load_top(&dir.join("flow.yaml"), dir.to_path_buf(), &Limits::default());
    let diags = lint_project(&project);
    let problems = invariant_violations(&project, &diags);
    let human = render::human(&diags, &project.sources, &render::HumanOptions::default());
    (render::json(&diags, &project.sources), human, problems)
}

/// What is wrong with the diagnostics: spans outside their file or not on character
/// boundaries, codes not in the registry, empty messages.
fn invariant_violations(project: &Project, diags: &[Diagnostic]) -> Vec<String> {
    let files = project.sources.files().count();
    let mut out = Vec::new();
    for d in diags {
        if !RULES
            .iter()
            .any(|r| r.code == d.rule.code && r.name == d.rule.name)
        {
            out.push(format!("{}: code not in the registry", d.rule.code));
        }
        if d.message.trim().is_empty() {
            out.push(format!("{}: empty message", d.rule.code));
        }
        for label in std::iter::once(&d.primary).chain(&d.secondary) {
            let span = label.span;
            if span.file.0 as usize >= files {
                out.push(format!("{}: label in unknown file {:?}", d.rule.code, span.file));
                continue;
            }
            let text = &project.sources.get(span.file).text;
            let (start, end) = (span.start as usize, span.end as usize);
            if start > end || end > text.len() {
                out.push(format!(
                    "{} {:?}: span {start}..{end} outside the file ({} bytes)",
                    d.rule.code,
                    d.message,
                    text.len()
                ));
            } else if !text.is_char_boundary(start) || !text.is_char_boundary(end) {
                out.push(format!(
                    "{} {:?}: span {start}..{end} splits a character",
                    d.rule.code, d.message
                ));
            }
        }
    }
    out
}

/// Lints `bytes` as `flow.yaml` twice on a worker thread, failing on a panic, a hang (more than
/// [`support::HANG`]), a broken invariant or two different outputs. Returns the JSON output.
fn check_input(dir: &TempDir, bytes: &[u8]) -> Result<String, TestCaseError> {
    dir.write("flow.yaml", bytes);
    let path = dir.path().to_path_buf();
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("lint".into())
        .spawn(move || {
            let result = std::panic::catch_unwind(|| (lint_once(&path), lint_once(&path)));
            let _ = tx.send(result);
        })
        .expect("start a lint thread");
    let shown = String::from_utf8_lossy(bytes);
    match rx.recv_timeout(support::HANG) {
        Err(_) => Err(TestCaseError::fail(format!(
            "lint did not return within {:?} on:\n{shown}",
            support::HANG
        ))),
        Ok(Err(panic)) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            Err(TestCaseError::fail(format!("lint panicked ({msg}) on:\n{shown}")))
        }
        Ok(Ok(((first, first_human, problems), (second, second_human, _)))) => {
            prop_assert!(problems.is_empty(), "{problems:#?}\non:\n{shown}\n{first}");
            prop_assert_eq!(&first, &second, "two runs differ on:\n{}", shown);
            prop_assert_eq!(&first_human, &second_human, "two runs differ on:\n{}", shown);
            Ok(first)
        }
    }
}

fn workspace(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    dir.write("other.yaml", OTHER_FLOW);
    dir.write("lib.yaml", LIB);
    dir
}

proptest! {
    #![proptest_config(support::proptest_config(64))]

    #[test]
    fn generated_flows_lint_without_panics_and_deterministically(text in flow()) {
        let dir = workspace("fuzz-gen");
        check_input(&dir, text.as_bytes())?;
    }

    #[test]
    fn mutated_flows_lint_without_panics_or_hangs(
        base in select(&[RICH_FLOW, support::CLEAN_FLOW, support::WARNING_FLOW, support::ERROR_FLOW][..]),
        mutations in prop::collection::vec(mutation(), 1..8),
    ) {
        let dir = workspace("fuzz-mut");
        check_input(&dir, &mutate(base.as_bytes(), &mutations))?;
    }
}

/// The generators must produce inputs that reach the rules, not only YAML errors: over a fixed
/// sample, most generated flows parse and many different codes come out.
#[test]
fn generated_flows_reach_the_rules() {
    let dir = workspace("fuzz-coverage");
    let mut runner = TestRunner::deterministic();
    let strategy = flow();
    let mut parsed = 0;
    let mut codes = std::collections::BTreeSet::new();
    const SAMPLES: usize = 200;
    for _ in 0..SAMPLES {
        let text = strategy.new_tree(&mut runner).expect("a sample").current();
        let json = check_input(&dir, text.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        let diags: Vec<support::JsonDiagnostic> = serde_json::from_str(&json).expect("JSON");
        if !diags.iter().any(|d| d.code == "SY100" || d.code == "SY101") {
            parsed += 1;
        }
        codes.extend(diags.into_iter().map(|d| d.code));
    }
    assert!(
        parsed * 2 >= SAMPLES,
        "only {parsed} of {SAMPLES} generated flows parse; the generator mostly tests YAML errors"
    );
    assert!(codes.len() >= 15, "generated flows reach few rules: {codes:?}");
}

/// The rich flow of the mutation test is valid before it is mutated, so mutations start from a
/// flow that reaches the rules rather than one that stops at the first error.
#[test]
fn rich_flow_is_clean() {
    let dir = workspace("fuzz-rich");
    let json = check_input(&dir, RICH_FLOW.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let diags: Vec<support::JsonDiagnostic> = serde_json::from_str(&json).expect("JSON");
    let own: Vec<_> = diags.iter().filter(|d| d.file.ends_with("flow.yaml")).collect();
    assert!(own.is_empty(), "the rich flow has problems: {own:#?}");
}

/// Found by the mutation test: a file whose first bytes are not UTF-8. The text kept for
/// diagnostics has U+FFFD (three bytes) where the bad byte was, so a one-byte span there splits
/// a character.
#[test]
fn invalid_utf8_spans_cover_whole_characters() {
    let dir = workspace("fuzz-utf8");
    for bytes in [
        &b"\xe6low: x\nsteps: {}\n"[..],
        b"flow: caf\xe9\nsteps: {}\n",
        b"\xff",
    ] {
        if let Err(e) = check_input(&dir, bytes) {
            panic!("{e}");
        }
    }
}

#[test]
fn mutations_apply_at_any_position() {
    let base = b"abc";
    assert_eq!(mutate(base, &[Mutation::Truncate(1)]), b"a".to_vec());
    assert_eq!(mutate(base, &[Mutation::Truncate(usize::MAX)]), b"abc".to_vec());
    assert_eq!(mutate(base, &[Mutation::Insert(0, "{")]), b"{abc".to_vec());
    assert_eq!(
        mutate(b"", &[Mutation::Flip(5, 1), Mutation::Delete(3, 4)]),
        Vec::<u8>::new()
    );
    assert_eq!(mutate(base, &[Mutation::RawByte(3, 0xff)]), b"abc\xff".to_vec());
    assert_eq!(mutate(base, &[Mutation::Widen(1, 'x')]).len(), 70_003);
}
