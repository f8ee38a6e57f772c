//! `switchyard graph`: the compiled flow drawn as Mermaid and DOT, with every step, labelled
//! edges (rival edges numbered in the order tried, the fallback `else`), loops as self-loops
//! with their bound, parallel branches inside their step and an agent loop's tools as nodes
//! of their own; and as SVG laid out by switchyard, with loops, `parallel` steps and called
//! flows as boxes. The run page draws a loop's tools with what the run did with them.

use std::path::Path;

use crate::support::{run, switchyard};

fn graph(flow: &str, format: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run(switchyard(root).args(["graph", flow, "--format", format]));
    assert_eq!(out.code(), 0, "{}{}", out.stdout, out.stderr);
    out.stdout
}

#[test]
fn mermaid_shows_steps_conditions_failures_and_the_end() {
    let m = graph("flows/ticket-triage.yaml", "mermaid");
    assert!(m.starts_with("flowchart TD\n"), "{m}");
    for step in [
        "s_normalize",
        "s_classify",
        "s_draft_reply",
        "s_escalate",
        "s_manual_queue",
    ] {
        assert!(m.contains(&format!("  {step}")), "{step} missing:\n{m}");
    }
    assert!(
        m.contains("s_classify -->|\"2: if result.category == #quot;other#quot;\"| s_park"),
        "{m}"
    );
    assert!(
        m.contains("s_classify -.->|\"4: on failure; errors: timeout, rate_limited\"| s_manual_queue"),
        "{m}"
    );
    assert!(m.contains("s_escalate --> failed"), "{m}");
    assert!(m.contains("start --> s_normalize"), "{m}");
}

#[test]
fn mermaid_draws_loops_with_their_bounds_and_parallel_branches_inside_their_step() {
    let m = graph("flows/document-extraction.yaml", "mermaid");
    assert!(
        m.contains("s_extract_pages -.->|\"each page (max 500, 4 at once)\"| s_extract_pages"),
        "{m}"
    );
    assert!(m.contains("subgraph s_enrich"), "{m}");
    for branch in ["s_enrich__stats", "s_enrich__summary", "s_enrich__keywords"] {
        assert!(m.contains(branch), "{branch} missing:\n{m}");
    }
    let w = graph("flows/job-polling.yaml", "mermaid");
    assert!(w.contains("s_poll{{"), "a while step is a hexagon:\n{w}");
    assert!(w.contains("(max 60)\"| s_poll"), "{w}");
}

#[test]
fn dot_is_a_digraph_with_the_same_edges() {
    let d = graph("flows/ticket-triage.yaml", "dot");
    assert!(d.starts_with("digraph \"ticket-triage\" {"), "{d}");
    assert!(d.trim_end().ends_with('}'), "{d}");
    assert!(
        d.contains("s_classify -> s_park [label=\"2: if result.category == \\\"other\\\"\"]"),
        "{d}"
    );
    assert!(
        d.contains("style=dashed, color=firebrick"),
        "failure edges are dashed:\n{d}"
    );
    let p = graph("flows/document-extraction.yaml", "dot");
    assert!(p.contains("subgraph cluster_s_enrich {"), "{p}");
}

/// The ids a Mermaid or DOT text declares nodes with (lines that are not edges, subgraph
/// headers or attributes), in order: each must be unique in one document.
fn declared_ids(text: &str) -> Vec<String> {
    text.lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| {
            let edge = [" -> ", "-->", "-.-"].iter().any(|a| l.contains(a));
            let other = ["subgraph", "rankdir", "node [", "edge [", "label="]
                .iter()
                .any(|p| l.starts_with(p));
            !(edge || other || matches!(*l, "end" | "}" | "direction LR"))
        })
        .map(|l| {
            l.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}

fn assert_unique(ids: &[String], text: &str) {
    let mut seen = std::collections::HashSet::new();
    for id in ids {
        assert!(seen.insert(id), "`{id}` is declared twice:\n{text}");
    }
}

#[test]
fn nested_flows_are_subgraphs_of_one_mermaid_diagram() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run(switchyard(root).args(["graph", "examples/nested-flow.yaml", "--nested"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let m = out.stdout;
    assert_eq!(m.matches("flowchart").count(), 1, "one document:\n{m}");
    assert!(m.starts_with("flowchart TD\n"), "{m}");
    assert!(m.contains("  subgraph f1_flow [\"flow nested-child\"]\n"), "{m}");
    assert!(m.contains("  subgraph f2_flow [\"flow approval_note\"]\n"), "{m}");
    assert!(m.contains("    f1_start((\"nested-child\"))"), "{m}");
    assert!(m.contains("  s_quote -.->|\"calls\"| f1_start\n"), "{m}");
    assert!(m.contains("  s_hold -.->|\"calls\"| f2_start\n"), "{m}");
    let opened = m
        .lines()
        .filter(|l| l.trim_start().starts_with("subgraph "))
        .count();
    let closed = m.lines().filter(|l| l.trim() == "end").count();
    assert_eq!((opened, closed), (2, 2), "{m}");
    let ids = declared_ids(&m);
    assert!(ids.iter().any(|i| i == "f2_s_write_note"), "{ids:?}");
    assert_unique(&ids, &m);
    // Without --nested, the same top flow and no subgraph.
    let top = graph("examples/nested-flow.yaml", "mermaid");
    assert!(!top.contains("subgraph") && !top.contains("calls"), "{top}");
}

#[test]
fn nested_flows_are_clusters_of_one_dot_graph() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run(switchyard(root).args([
        "graph",
        "examples/nested-flow.yaml",
        "--nested",
        "--format",
        "dot",
    ]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let d = out.stdout;
    assert_eq!(d.matches("digraph").count(), 1, "one graph:\n{d}");
    assert!(
        d.starts_with("digraph \"nested-flow\" {\n") && d.ends_with("}\n"),
        "{d}"
    );
    assert!(
        d.contains("  subgraph cluster_f1_flow {\n    label=\"flow nested-child\";"),
        "{d}"
    );
    assert!(d.contains("  subgraph cluster_f2_flow {\n"), "{d}");
    assert!(
        d.contains("  s_quote -> f1_start [label=\"calls\", style=dotted];\n"),
        "{d}"
    );
    assert_closes_once(&d);
    assert_unique(&declared_ids(&d), &d);
}

/// The braces of a DOT text outside quoted strings balance, closing the graph on the last
/// line.
fn assert_closes_once(d: &str) {
    let (mut depth, mut quoted, mut escaped) = (0i32, false, false);
    for (i, c) in d.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => {
                depth -= 1;
                assert!(
                    depth > 0 || i == d.len() - 2,
                    "the graph closes early at {i}:\n{d}"
                );
            }
            _ => {}
        }
    }
    assert_eq!(depth, 0, "{d}");
}

/// A flow whose labels hold the characters Mermaid, DOT and HTML read: `&`, quotes, `#`, `<`
/// and a line break.
const LABELS_FLOW: &str = "flow: labels\nsteps:\n  first:\n    set: {\"$['R&D \\\"beta\\\" #2']\": {value: 1}}\n    next:\n      \
         - to: second\n        if: \"payload.n == \\\"#1\\\" &&\\npayload.n < 2\"\n      - to: second\n  \
         second:\n    succeed: {}\n";

/// A flow with a backslash in a condition (`"a\nb"` in a CEL string).
const SLASH_FLOW: &str = "flow: slash\nsteps:\n  first:\n    set: {$.s: {value: x}}\n    next:\n      \
         - to: second\n        if: 'payload.s == \"a\\nb\"'\n      - to: second\n  \
         second:\n    succeed: {}\n";

/// A flow whose labels hold XML's markup characters and a control character.
const SVG_LABELS_FLOW: &str = "flow: labels\nsteps:\n  first:\n    set: {\"$['R&D \\\"beta\\\" <#2>']\": {value: 1}}\n    next:\n      \
         - to: second\n        if: \"payload.n == \\\"\\u0001'\\\" &&\\npayload.n < 2\"\n      - to: second\n  \
         second:\n    succeed: {}\n";

/// A flow whose step `pick` has rival edges for both outcomes, with a fallback for each; `high`
/// has one edge, `mid` one per outcome.
const ORDER_FLOW: &str = "flow: order\nsteps:\n  pick:\n    set: {$.n: {value: 1}}\n    next:\n      \
         - to: high\n        if: 'payload.n > 10'\n      \
         - to: low\n        on: failure\n        errors: [timeout]\n      \
         - to: mid\n        if: 'payload.n > 5'\n      \
         - to: low\n      \
         - to: low\n        on: failure\n  \
         high:\n    set: {$.x: {value: 1}}\n    next:\n      - to: low\n  \
         mid:\n    set: {$.x: {value: 2}}\n    next:\n      - to: low\n      - to: high\n        on: failure\n  \
         low:\n    succeed: {}\n";

#[test]
fn labels_are_escaped_to_render_as_written() {
    let dir = crate::support::TempDir::new("graph-labels");
    dir.write("labels.yaml", LABELS_FLOW);
    let m = run(switchyard(dir.path()).args(["graph", "labels.yaml"]));
    assert_eq!(m.code(), 0, "{}", m.stderr);
    let m = m.stdout;
    assert!(m.contains("set $['R#amp;D #quot;beta#quot; #35;2']\"/]\n"), "{m}");
    assert!(
        m.contains("|\"1: if payload.n == #quot;#35;1#quot; #amp;#amp;<br/>payload.n #lt; 2\"|"),
        "{m}"
    );
    // No raw `&`, `"` or `#` is left inside a label, nor a line break.
    for l in m
        .lines()
        .filter(|l| l.contains("R#amp;D") || l.contains("if payload"))
    {
        let inner = l
            .split_once('"')
            .map(|(_, r)| r.rsplit_once('"').map_or("", |(i, _)| i))
            .unwrap_or("");
        assert!(!inner.contains(['&', '"']), "{l}");
        assert!(
            inner
                .replace("#35;", "")
                .replace("#amp;", "")
                .replace("#quot;", "")
                .replace("#lt;", "")
                .matches('#')
                .count()
                == 0,
            "{l}"
        );
    }
    let d = run(switchyard(dir.path()).args(["graph", "labels.yaml", "--format", "dot"]));
    assert_eq!(d.code(), 0, "{}", d.stderr);
    let d = d.stdout;
    assert!(d.contains("set $['R&amp;D \\\"beta\\\" #2']\"];\n"), "{d}");
    assert!(
        d.contains("[label=\"1: if payload.n == \\\"#1\\\" &amp;&amp;\\npayload.n < 2\"]"),
        "{d}"
    );
}

/// A backslash written in a condition (`"a\nb"` in a CEL string) is shown as written: not a
/// line break in Mermaid, an escaped backslash in DOT.
#[test]
fn a_backslash_in_a_label_is_not_a_line_break() {
    let dir = crate::support::TempDir::new("graph-backslash");
    dir.write("slash.yaml", SLASH_FLOW);
    let m = run(switchyard(dir.path()).args(["graph", "slash.yaml"]));
    assert_eq!(m.code(), 0, "{}", m.stderr);
    assert!(
        m.stdout.contains("|\"1: if payload.s == #quot;a#92;nb#quot;\"|"),
        "{}",
        m.stdout
    );
    assert!(!m.stdout.contains('\\'), "{}", m.stdout);
    let d = run(switchyard(dir.path()).args(["graph", "slash.yaml", "--format", "dot"]));
    assert_eq!(d.code(), 0, "{}", d.stderr);
    assert!(
        d.stdout
            .contains("[label=\"1: if payload.s == \\\"a\\\\nb\\\"\"]"),
        "{}",
        d.stdout
    );
}

/// A box of the SVG drawing: a node's rect (or ellipse), an edge label's rect, a group's rect.
#[derive(Debug, Clone)]
struct Rect {
    what: String,
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

impl Rect {
    fn overlaps(&self, o: &Rect) -> bool {
        const SLACK: f64 = 0.5;
        self.x + self.w - SLACK > o.x
            && o.x + o.w - SLACK > self.x
            && self.y + self.h - SLACK > o.y
            && o.y + o.h - SLACK > self.y
    }

    fn contains(&self, o: &Rect) -> bool {
        o.x >= self.x - 0.5
            && o.y >= self.y - 0.5
            && o.x + o.w <= self.x + self.w + 0.5
            && o.y + o.h <= self.y + self.h + 0.5
    }
}

fn attr(n: roxmltree::Node, name: &str) -> f64 {
    n.attribute(name)
        .unwrap_or_else(|| panic!("<{}> without {name}", n.tag_name().name()))
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn shape_rect(n: roxmltree::Node, what: String) -> Option<Rect> {
    let shape = n
        .children()
        .find(|c| c.is_element() && matches!(c.tag_name().name(), "rect" | "ellipse"))?;
    Some(match shape.tag_name().name() {
        "rect" => Rect {
            what,
            x: attr(shape, "x"),
            y: attr(shape, "y"),
            w: attr(shape, "width"),
            h: attr(shape, "height"),
        },
        _ => {
            let (cx, cy, rx, ry) = (
                attr(shape, "cx"),
                attr(shape, "cy"),
                attr(shape, "rx"),
                attr(shape, "ry"),
            );
            Rect {
                what,
                x: cx - rx,
                y: cy - ry,
                w: 2.0 * rx,
                h: 2.0 * ry,
            }
        }
    })
}

fn class_has(n: roxmltree::Node, class: &str) -> bool {
    n.attribute("class")
        .is_some_and(|c| c.split(' ').any(|p| p == class))
}

/// A group's box and the step it draws, if any.
type Group = (Rect, Option<String>);

/// The drawing's node boxes, edge-label boxes and group boxes (with their `data-step`).
fn svg_boxes(doc: &roxmltree::Document) -> (Vec<Rect>, Vec<Rect>, Vec<Group>) {
    let mut nodes = Vec::new();
    let mut labels = Vec::new();
    let mut groups = Vec::new();
    for n in doc.descendants().filter(|n| n.has_tag_name("g")) {
        let what = format!(
            "{} {}{}",
            n.attribute("class").unwrap_or(""),
            n.attribute("data-flow").unwrap_or(""),
            n.attribute("data-step").unwrap_or("")
        );
        if class_has(n, "node") {
            if let Some(r) = shape_rect(n, what) {
                nodes.push(r);
            }
        } else if class_has(n, "label") {
            labels.push(shape_rect(n, what).expect("a label has its box"));
        } else if class_has(n, "group") {
            let step = n.attribute("data-step").map(str::to_string);
            groups.push((shape_rect(n, what).expect("a group has its box"), step));
        }
    }
    (nodes, labels, groups)
}

/// Every flow file under `flows/` and `examples/` (files of shared agents have no steps).
fn flow_files() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).expect("a directory") {
            let p = e.expect("an entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "yaml")
                && std::fs::read_to_string(&p)
                    .unwrap()
                    .lines()
                    .any(|l| l.starts_with("steps:"))
            {
                out.push(p.display().to_string());
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    walk(&root.join("flows"), &mut out);
    walk(&root.join("examples"), &mut out);
    out.sort();
    out
}

#[test]
fn every_flow_renders_to_svg_that_parses_with_no_overlapping_boxes() {
    let files = flow_files();
    assert!(files.len() >= 20, "{files:?}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in &files {
        for nested in [false, true] {
            let mut cmd = switchyard(root);
            cmd.args(["graph", file, "--format", "svg"]);
            if nested {
                cmd.arg("--nested");
            }
            let out = run(&mut cmd);
            assert_eq!(out.code(), 0, "{file}: {}", out.stderr);
            assert_svg_drawing(&format!("{file} (nested: {nested})"), &out.stdout);
        }
    }
}

/// An SVG drawing parses as XML, holds steps, keeps every box inside the picture and apart
/// from every other, each loop's or `parallel` step's box around what it draws of the step
/// (its tools too), and draws every edge as a path.
fn assert_svg_drawing(file: &str, text: &str) {
    let doc = roxmltree::Document::parse(text).unwrap_or_else(|e| panic!("{file}: not XML: {e}\n{text}"));
    let svg = doc.root_element();
    assert_eq!(svg.tag_name().name(), "svg");
    assert_eq!(svg.tag_name().namespace(), Some("http://www.w3.org/2000/svg"));
    let (width, height) = (attr(svg, "width"), attr(svg, "height"));
    let (nodes, labels, groups) = svg_boxes(&doc);
    assert!(
        nodes.iter().any(|n| n.what.starts_with("node step")),
        "{file}: no steps"
    );
    let boxes: Vec<&Rect> = nodes.iter().chain(&labels).collect();
    for (i, a) in boxes.iter().enumerate() {
        assert!(
            a.x >= -0.5 && a.y >= -0.5 && a.x + a.w <= width + 0.5 && a.y + a.h <= height + 0.5,
            "{file}: {a:?} outside the {width}×{height} picture"
        );
        for b in &boxes[i + 1..] {
            assert!(!a.overlaps(b), "{file}: {a:?} overlaps {b:?}");
        }
    }
    // A loop's or a `parallel` step's box holds what it draws of the step.
    for (g, step) in &groups {
        let Some(step) = step else { continue };
        let inside: Vec<&Rect> = nodes
            .iter()
            .filter(|n| n.what.ends_with(&format!(" {step}")) || n.what.ends_with(&format!("_{step}")))
            .collect();
        assert!(!inside.is_empty(), "{file}: nothing drawn in the box of `{step}`");
        for n in inside {
            assert!(g.contains(n), "{file}: {n:?} is not inside {g:?}");
        }
    }
    for e in doc
        .descendants()
        .filter(|n| n.has_tag_name("path") && n.parent().is_some_and(|p| class_has(p, "edge")))
    {
        let d = e.attribute("d").expect("a path");
        assert!(d.starts_with('M') && d.contains('L'), "{file}: edge path `{d}`");
    }
}

#[test]
fn svg_draws_failure_edges_loops_parallel_steps_and_called_flows_distinctly() {
    let parse = |flow: &str, nested: bool| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut cmd = switchyard(root);
        cmd.args(["graph", flow, "--format", "svg"]);
        if nested {
            cmd.arg("--nested");
        }
        let out = run(&mut cmd);
        assert_eq!(out.code(), 0, "{}", out.stderr);
        out.stdout
    };
    let t = parse("flows/ticket-triage.yaml", false);
    let doc = roxmltree::Document::parse(&t).unwrap();
    let failures: Vec<_> = doc
        .descendants()
        .filter(|n| n.has_tag_name("g") && class_has(*n, "edge") && class_has(*n, "failure"))
        .collect();
    assert!(!failures.is_empty(), "{t}");
    for f in &failures {
        let path = f.children().find(|c| c.has_tag_name("path")).unwrap();
        assert_eq!(path.attribute("marker-end"), Some("url(#arrow-failure)"));
    }
    let labels: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("g") && class_has(*n, "label"))
        .filter_map(|n| {
            n.children()
                .find(|c| c.has_tag_name("title"))
                .and_then(|t| t.text())
                .map(str::to_string)
        })
        .collect();
    assert!(
        labels.iter().any(|l| l == "1: if payload.auto_reply"),
        "{labels:?}"
    );
    assert!(labels.iter().any(|l| l == "2: else"), "{labels:?}");
    assert!(labels.iter().any(|l| l.starts_with("on failure")), "{labels:?}");
    let d = parse("flows/document-extraction.yaml", false);
    assert!(d.contains("<g class=\"group loop\""), "{d}");
    assert!(d.contains("<g class=\"group parallel\""), "{d}");
    assert!(d.contains("foreach "), "{d}");
    let n = parse("examples/nested-flow.yaml", true);
    let doc = roxmltree::Document::parse(&n).unwrap();
    assert!(
        doc.descendants()
            .any(|n| n.has_tag_name("g") && class_has(n, "group") && class_has(n, "flow")),
        "{n}"
    );
    assert!(
        doc.descendants()
            .any(|n| n.has_tag_name("g") && class_has(n, "edge") && class_has(n, "calls")),
        "{n}"
    );
    // Without --nested, the called flow is not drawn.
    let flat = parse("examples/nested-flow.yaml", false);
    assert!(!flat.contains("group flow"), "{flat}");
}

#[test]
fn svg_text_is_escaped_and_shown_as_written() {
    let dir = crate::support::TempDir::new("graph-svg-labels");
    dir.write("labels.yaml", SVG_LABELS_FLOW);
    let out = run(switchyard(dir.path()).args(["graph", "labels.yaml", "--format", "svg"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let doc = roxmltree::Document::parse(&out.stdout).unwrap_or_else(|e| panic!("{e}\n{}", out.stdout));
    let titles: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text().map(str::to_string))
        .collect();
    assert!(titles.iter().any(|t| t == "flow labels"), "{titles:?}");
    assert!(
        titles.iter().any(|t| t == "first\nset $['R&D \"beta\" <#2>']"),
        "{titles:?}"
    );
    assert!(
        titles
            .iter()
            .any(|t| t == "1: if payload.n == \"\u{2401}'\" &&\npayload.n < 2"),
        "{titles:?}"
    );
}

/// `graph FLOW --nested --format FORMAT`.
fn graph_nested(flow: &str, format: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run(switchyard(root).args(["graph", flow, "--nested", "--format", format]));
    assert_eq!(out.code(), 0, "{}{}", out.stdout, out.stderr);
    out.stdout
}

/// The tools of `support-triage-agent`'s loop, with the kind of their agents.
const TRIAGE_TOOLS: [(&str, &str); 4] = [
    ("search_kb", "command"),
    ("lookup_customer", "command"),
    ("write_reply", "flow"),
    ("refund", "http"),
];

/// An agent loop's tools are nodes joined to the loop's step by a dashed `tool` edge without
/// an arrowhead, and a tool that is a `flow` agent calls its flow, drawn in the same Mermaid
/// document.
#[test]
fn mermaid_draws_an_agent_loops_tools_and_the_flow_a_tool_runs() {
    let m = graph_nested("flows/support-triage-agent.yaml", "mermaid");
    assert_eq!(m.matches("flowchart").count(), 1, "one document:\n{m}");
    for (tool, kind) in TRIAGE_TOOLS {
        let id = format!("t_investigate__{tool}");
        assert!(
            m.contains(&format!("  {id}(\"{tool}<br/>{kind}")),
            "{tool} is no node:\n{m}"
        );
        assert!(
            m.contains(&format!("  s_investigate -.-|\"tool\"| {id}\n")),
            "{tool} is not joined to its loop:\n{m}"
        );
    }
    assert!(
        m.contains("t_investigate__refund(\"refund<br/>http<br/>waits for approval\")"),
        "{m}"
    );
    // The reply flow, run by the `write_reply` tool, is a subgraph it calls.
    assert!(m.contains("  subgraph f1_flow [\"flow support-reply\"]\n"), "{m}");
    assert!(
        m.contains("  t_investigate__write_reply -.->|\"calls\"| f1_start\n"),
        "{m}"
    );
    assert!(m.contains("    f1_s_draft[\"draft<br/>llm writer"), "{m}");
    let ids = declared_ids(&m);
    assert!(ids.iter().any(|i| i == "t_investigate__refund"), "{ids:?}");
    assert_unique(&ids, &m);
    // Without --nested the tools are drawn, the flow one of them runs is not.
    let flat = graph("flows/support-triage-agent.yaml", "mermaid");
    assert!(
        flat.contains("  s_investigate -.-|\"tool\"| t_investigate__write_reply\n"),
        "{flat}"
    );
    assert!(!flat.contains("subgraph") && !flat.contains("calls"), "{flat}");
}

#[test]
fn dot_draws_an_agent_loops_tools_and_the_flow_a_tool_runs() {
    let d = graph_nested("flows/support-triage-agent.yaml", "dot");
    assert!(d.starts_with("digraph \"support-triage-agent\" {\n"), "{d}");
    for (tool, kind) in TRIAGE_TOOLS {
        let id = format!("t_investigate__{tool}");
        assert!(
            d.contains(&format!(
                "  {id} [shape=box, style=\"rounded,dashed\", label=\"{tool}\\n{kind}"
            )),
            "{tool} is no node:\n{d}"
        );
        assert!(
            d.contains(&format!(
                "  s_investigate -> {id} [label=\"tool\", style=dashed, arrowhead=none, "
            )),
            "{tool} is not joined to its loop:\n{d}"
        );
    }
    assert!(
        d.contains("  subgraph cluster_f1_flow {\n    label=\"flow support-reply\";"),
        "{d}"
    );
    assert!(
        d.contains("  t_investigate__write_reply -> f1_start [label=\"calls\", style=dotted];\n"),
        "{d}"
    );
    assert_closes_once(&d);
    assert_unique(&declared_ids(&d), &d);
}

#[test]
fn svg_draws_an_agent_loops_tools_and_the_flow_a_tool_runs() {
    let s = graph_nested("flows/support-triage-agent.yaml", "svg");
    let doc = roxmltree::Document::parse(&s).unwrap_or_else(|e| panic!("not XML: {e}\n{s}"));
    let tools: Vec<roxmltree::Node> = doc
        .descendants()
        .filter(|n| n.has_tag_name("g") && class_has(*n, "node") && class_has(*n, "tool"))
        .collect();
    let named: Vec<(Option<&str>, Option<&str>)> = tools
        .iter()
        .map(|n| (n.attribute("data-step"), n.attribute("data-tool")))
        .collect();
    assert_eq!(
        named,
        TRIAGE_TOOLS
            .iter()
            .map(|(t, _)| (Some("investigate"), Some(*t)))
            .collect::<Vec<_>>(),
        "{s}"
    );
    let refund = tools[3]
        .children()
        .find(|c| c.has_tag_name("title"))
        .and_then(|t| t.text());
    assert_eq!(refund, Some("refund\nhttp\nwaits for approval"));
    // One `tool` edge per tool, labelled, without an arrowhead.
    let edges: Vec<roxmltree::Node> = doc
        .descendants()
        .filter(|n| n.has_tag_name("g") && class_has(*n, "edge") && class_has(*n, "tool"))
        .collect();
    assert_eq!(edges.len(), 4, "{s}");
    for e in &edges {
        let path = e.children().find(|c| c.has_tag_name("path")).expect("a path");
        assert_eq!(path.attribute("marker-end"), None, "{s}");
        let label = e
            .descendants()
            .find(|c| c.has_tag_name("title"))
            .and_then(|t| t.text());
        assert_eq!(label, Some("tool"));
    }
    // The reply flow is a box of its own, called from the tool's node.
    assert!(
        doc.descendants().any(|n| n.has_tag_name("g")
            && class_has(n, "group")
            && class_has(n, "flow")
            && n.attribute("data-flow") == Some("f1_")),
        "{s}"
    );
    assert!(
        doc.descendants().any(|n| n.has_tag_name("g")
            && class_has(n, "node")
            && n.attribute("data-flow") == Some("f1_")
            && n.attribute("data-step") == Some("draft")),
        "{s}"
    );
    assert_eq!(
        doc.descendants()
            .filter(|n| n.has_tag_name("g") && class_has(*n, "edge") && class_has(*n, "calls"))
            .count(),
        1,
        "{s}"
    );
    // No box overlaps another, tools and the flow's box included.
    let (nodes, labels, groups) = svg_boxes(&doc);
    let boxes: Vec<&Rect> = nodes.iter().chain(&labels).collect();
    for (i, a) in boxes.iter().enumerate() {
        for b in &boxes[i + 1..] {
            assert!(!a.overlaps(b), "{a:?} overlaps {b:?}");
        }
    }
    let flow_box = groups
        .iter()
        .find(|(g, _)| g.what.contains("flow f1_"))
        .expect("the flow's box");
    for n in nodes.iter().filter(|n| !flow_box.0.contains(n)) {
        assert!(
            !n.overlaps(&flow_box.0),
            "{n:?} overlaps the flow's box {:?}",
            flow_box.0
        );
    }
}

/// A step's edges are tried in order and the first that matches wins (SPEC §4): where an
/// outcome has rival edges, every edge of the step is numbered with its place in `next`,
/// failure edges too, and the unconditional fallback is `else`; a step without rivals keeps
/// its plain arrows and labels.
#[test]
fn rival_edges_are_numbered_in_the_order_tried_and_the_fallback_is_else() {
    let dir = crate::support::TempDir::new("graph-order");
    dir.write("order.yaml", ORDER_FLOW);
    let m = run(switchyard(dir.path()).args(["graph", "order.yaml"]));
    assert_eq!(m.code(), 0, "{}", m.stderr);
    let m = m.stdout;
    for line in [
        "  s_pick -->|\"1: if payload.n #gt; 10\"| s_high\n",
        "  s_pick -.->|\"2: on failure; errors: timeout\"| s_low\n",
        "  s_pick -->|\"3: if payload.n #gt; 5\"| s_mid\n",
        "  s_pick -->|\"4: else\"| s_low\n",
        "  s_pick -.->|\"5: on failure; else\"| s_low\n",
        // One edge: a plain arrow. One edge per outcome: no rivals, no numbers.
        "  s_high --> s_low\n",
        "  s_mid --> s_low\n",
        "  s_mid -.->|\"on failure\"| s_high\n",
    ] {
        assert!(m.contains(line), "no `{}`:\n{m}", line.trim());
    }
    let d = run(switchyard(dir.path()).args(["graph", "order.yaml", "--format", "dot"]));
    assert_eq!(d.code(), 0, "{}", d.stderr);
    let d = d.stdout;
    for line in [
        "  s_pick -> s_high [label=\"1: if payload.n > 10\"];\n",
        "  s_pick -> s_low [label=\"4: else\"];\n",
        "  s_pick -> s_low [label=\"5: on failure; else\", style=dashed, color=firebrick];\n",
        "  s_high -> s_low;\n",
    ] {
        assert!(d.contains(line), "no `{}`:\n{d}", line.trim());
    }
    let s = run(switchyard(dir.path()).args(["graph", "order.yaml", "--format", "svg"]));
    assert_eq!(s.code(), 0, "{}", s.stderr);
    let doc = roxmltree::Document::parse(&s.stdout).unwrap_or_else(|e| panic!("{e}\n{}", s.stdout));
    let labels: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("g") && class_has(*n, "label"))
        .filter_map(|n| {
            n.children()
                .find(|c| c.has_tag_name("title"))
                .and_then(|t| t.text())
        })
        .collect();
    assert_eq!(
        labels,
        [
            "1: if payload.n > 10",
            "2: on failure; errors: timeout",
            "3: if payload.n > 5",
            "4: else",
            "5: on failure; else",
            "on failure",
        ],
        "{}",
        s.stdout
    );
}

/// A flow whose step `answer` is an agent loop with tools `lookup` (a mock), `broken` (a mock
/// that always fails), `spare` (never called) and `helper`, a loop with tools `lookup` and
/// `spare` of its own; then a `parallel` step whose branch `a` is the helper's loop.
fn loop_flow(base_url: &str) -> String {
    format!(
        r#"flow: looped
providers:
  local:
    base_url: {base_url}
agents:
  agent:
    kind: llm
    provider: local
    model: m1
    prompt: "Question: {{{{ input.text }}}}"
    tools: [lookup, broken, spare, helper]
  helper:
    kind: llm
    provider: local
    model: m1
    prompt: "Help with {{{{ input }}}}"
    tools: [lookup, spare]
  lookup:
    kind: mock
    returns: {{order: 7}}
  broken:
    kind: mock
    fail_times: 100
    returns: {{}}
  spare:
    kind: mock
    returns: {{}}
steps:
  answer:
    agent: agent
    input: {{$.text: $.text}}
    output: {{$.reply: $}}
    next:
      - to: fan
  fan:
    parallel:
      a: {{agent: helper, output: {{$.a: $}}}}
      b: {{agent: spare, output: {{}}}}
"#
    )
}

/// The run page draws the loop's tools, each marked by what the run did with it, and the
/// route is coloured as before.
#[test]
fn the_run_page_marks_the_tools_a_loop_called() {
    use crate::mock_server::{Llm, Reply};
    let server = Llm::start();
    server.script([
        Reply::calls(1, &[("lookup", "{}")]),
        Reply::calls(2, &[("broken", "{}")]),
        Reply::calls(3, &[("helper", "{}")]),
        // The helper's own loop: a call, then its answer.
        Reply::calls(1, &[("lookup", "{}")]),
        Reply::Answer("{\"found\": true}".into()),
        Reply::Answer("Order 7 is on its way.".into()),
        // Branch `a`: the helper's loop again.
        Reply::calls(1, &[("lookup", "{}")]),
        Reply::Answer("{\"found\": true}".into()),
    ]);
    let dir = crate::support::TempDir::new("graph-run-page");
    dir.write("looped.yaml", loop_flow(&server.base_url()));
    let store = ["--store", "sqlite:runs.db"];
    let out = run(switchyard(dir.path())
        .args([
            "run",
            "looped.yaml",
            "--input",
            r#"{"text": "where is my order"}"#,
        ])
        .args(store));
    assert_eq!(out.code(), 0, "{}{}", out.stdout, out.stderr);
    let list = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(store));
    let first = list.stdout.lines().next().expect("a run");
    let id = serde_json::from_str::<serde_json::Value>(first).unwrap()["id"]
        .as_str()
        .expect("a run id")
        .to_owned();
    let page = run(switchyard(dir.path())
        .args(["runs", "show", &id, "--format", "html"])
        .args(store));
    assert_eq!(page.code(), 0, "{}", page.stderr);
    let html = page.stdout;
    let svg = &html[html.find("<svg").expect("a drawing")..];
    let svg = &svg[..svg.find("</svg>").expect("the drawing's end") + "</svg>".len()];
    let doc = roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
    let class_of = |pred: &dyn Fn(roxmltree::Node) -> bool| -> String {
        doc.descendants()
            .find(|n| n.has_tag_name("g") && pred(*n))
            .and_then(|n| n.attribute("class"))
            .unwrap_or_else(|| panic!("not drawn:\n{svg}"))
            .to_owned()
    };
    let tool = |name: &'static str| {
        move |n: roxmltree::Node| class_has(n, "tool") && n.attribute("data-tool") == Some(name)
    };
    assert_eq!(class_of(&tool("lookup")), "node tool ok");
    assert_eq!(class_of(&tool("broken")), "node tool failed");
    assert_eq!(class_of(&tool("spare")), "node tool unreached");
    assert_eq!(class_of(&tool("helper")), "node tool ok");
    assert_eq!(class_of(&tool("helper.lookup")), "node tool ok");
    assert_eq!(class_of(&tool("helper.spare")), "node tool unreached");
    assert_eq!(class_of(&tool("a/lookup")), "node tool ok");
    assert_eq!(class_of(&tool("a/spare")), "node tool unreached");
    assert_eq!(
        class_of(&|n| class_has(n, "step") && n.attribute("data-step") == Some("answer")),
        "node step agent ok"
    );
    // The route taken (start → answer → fan → end) and the five tools called are marked
    // taken.
    let mut taken: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("g") && class_has(*n, "edge") && class_has(*n, "taken"))
        .map(|n| n.attribute("class").unwrap_or("").to_owned())
        .collect();
    taken.sort();
    assert_eq!(
        taken,
        [
            "edge route taken",
            "edge route taken",
            "edge route taken",
            "edge tool taken",
            "edge tool taken",
            "edge tool taken",
            "edge tool taken",
            "edge tool taken",
        ],
        "{svg}"
    );
}

/// A flow whose agent loops are a `foreach` body, a `parallel` branch and a `while` body,
/// one of whose tools is itself a loop with a tool, and one a `flow` agent whose flow has a
/// loop of its own.
const LOOPS_WITH_TOOLS: &str = r#"flow: loops-with-tools
providers:
  local:
    base_url: http://127.0.0.1:9/v1
agents:
  outer:
    kind: llm
    provider: local
    model: m1
    prompt: "{{ input }}"
    tools: [helper, search, sub]
    until_tool: search
  helper:
    kind: llm
    provider: local
    model: m1
    description: a helper with a tool of its own
    prompt: "{{ input }}"
    tools: [search]
  search:
    kind: mock
    returns: {hits: []}
  plain:
    kind: mock
    returns: {ok: true}
  sub:
    kind: flow
    agents:
      inner:
        kind: llm
        provider: local
        model: m1
        prompt: "{{ input }}"
        tools: [look]
      look:
        kind: mock
        returns: {seen: true}
    steps:
      think:
        agent: inner
        output: {}
steps:
  each:
    foreach: $.items
    as: item
    agent: outer
    output: {$.results: $}
    next:
      - to: fan
  fan:
    parallel:
      a: {agent: outer}
      b: {agent: plain}
    next:
      - to: again
  again:
    while: '=size(payload.results) < 3'
    max_iterations: 2
    agent: helper
    output: {}
"#;

/// Tools of loops inside a `foreach`, a `parallel` branch and a `while`, and tools of tools,
/// are drawn in every format: unique ids, valid documents, and in SVG inside their step's
/// box, overlapping nothing.
#[test]
fn tools_of_loops_in_boxes_and_tools_of_tools_are_drawn_in_every_format() {
    let dir = crate::support::TempDir::new("graph-loop-tools");
    dir.write("lt.yaml", LOOPS_WITH_TOOLS);
    let draw = |format: &str, nested: bool| {
        let mut cmd = switchyard(dir.path());
        cmd.args(["graph", "lt.yaml", "--format", format]);
        if nested {
            cmd.arg("--nested");
        }
        let out = run(&mut cmd);
        assert_eq!(out.code(), 0, "{}", out.stderr);
        out.stdout
    };
    let m = draw("mermaid", true);
    for line in [
        "  s_each -.-|\"tool\"| t_each__helper\n",
        "  t_each__helper -.-|\"tool\"| t_each__helper__search\n",
        "  t_each__search(\"search<br/>mock<br/>ends the loop\")\n",
        "  s_fan__a -.-|\"tool\"| t_fan__a__sub\n",
        "  s_again -.-|\"tool\"| t_again__search\n",
        // The flow the `sub` tool runs, with its own loop's tool, called from both tools.
        "    f1_s_think -.-|\"tool\"| f1_t_think__look\n",
        "  t_each__sub -.->|\"calls\"| f1_start\n",
        "  t_fan__a__sub -.->|\"calls\"| f1_start\n",
    ] {
        assert!(m.contains(line), "no `{}`:\n{m}", line.trim());
    }
    assert!(!m.contains("s_fan__b -.-"), "a plain branch has no tools:\n{m}");
    assert_unique(&declared_ids(&m), &m);
    let d = draw("dot", true);
    assert!(
        d.contains(
            "  t_each__helper -> t_each__helper__search [label=\"tool\", style=dashed, arrowhead=none"
        ),
        "{d}"
    );
    assert_closes_once(&d);
    assert_unique(&declared_ids(&d), &d);
    for nested in [false, true] {
        let s = draw("svg", nested);
        assert_svg_drawing(&format!("lt.yaml (nested: {nested})"), &s);
        let doc = roxmltree::Document::parse(&s).expect("XML");
        let tools: Vec<(&str, &str)> = doc
            .descendants()
            .filter(|n| n.has_tag_name("g") && class_has(*n, "tool") && class_has(*n, "node"))
            .filter(|n| n.attribute("data-flow") == Some(""))
            .map(|n| {
                (
                    n.attribute("data-step").unwrap_or(""),
                    n.attribute("data-tool").unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            tools,
            [
                ("each", "helper"),
                ("each", "helper.search"),
                ("each", "search"),
                ("each", "sub"),
                ("fan", "a/helper"),
                ("fan", "a/helper.search"),
                ("fan", "a/search"),
                ("fan", "a/sub"),
                ("again", "search"),
            ],
            "{s}"
        );
    }
}

// ------------------------------------------------------------------ the real renderers

/// Graphviz's `dot`, from Debian's `graphviz` (`.ci/run` installs it).
const GRAPHVIZ: &str = "/usr/bin/dot";
/// Debian's Chromium, as the run page's tests use it.
const CHROMIUM: &str = "/usr/bin/chromium";
/// Mermaid's browser bundle, from the npm registry (`.ci/run` installs it here).
const MERMAID: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/target/test-tools/node_modules/mermaid/dist/mermaid.min.js"
);

/// Every drawing in `format`: of every flow file, flat and `--nested`, and of this file's
/// flows written to show escapes, numbered edges and tools; each with a name saying which.
fn every_drawing(format: &str) -> Vec<(String, String)> {
    let dir = crate::support::TempDir::new("graph-every");
    let mut files: Vec<(std::path::PathBuf, String)> = flow_files()
        .into_iter()
        .map(|f| (Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf(), f))
        .collect();
    for (name, text) in [
        ("labels.yaml", LABELS_FLOW),
        ("slash.yaml", SLASH_FLOW),
        ("svg-labels.yaml", SVG_LABELS_FLOW),
        ("order.yaml", ORDER_FLOW),
        ("loops-with-tools.yaml", LOOPS_WITH_TOOLS),
    ] {
        dir.write(name, text);
        files.push((dir.path().to_path_buf(), name.to_string()));
    }
    let mut out = Vec::new();
    for (root, file) in &files {
        for nested in [false, true] {
            let mut cmd = switchyard(root);
            cmd.args(["graph", file, "--format", format]);
            if nested {
                cmd.arg("--nested");
            }
            let o = run(&mut cmd);
            assert_eq!(o.code(), 0, "{file}: {}", o.stderr);
            out.push((format!("{file} (nested: {nested})"), o.stdout));
        }
    }
    out
}

/// Graphviz reads every DOT drawing without an error or a warning (and refuses a broken one,
/// so the check can fail).
#[test]
fn graphviz_reads_every_dot_drawing() {
    assert!(
        Path::new(GRAPHVIZ).exists(),
        "{GRAPHVIZ} is missing: this test needs Debian's graphviz (`apt-get install graphviz`; \
         .ci/run installs it)"
    );
    let dot = |text: &str| {
        use std::io::Write as _;
        let mut child = std::process::Command::new(GRAPHVIZ)
            .arg("-Tsvg")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("dot starts");
        child
            .stdin
            .take()
            .expect("a stdin")
            .write_all(text.as_bytes())
            .expect("dot reads its input");
        let o = child.wait_with_output().expect("dot ends");
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (ok, _) = dot("digraph g { a -> [label=\"x\"]; }\n");
    assert!(!ok, "Graphviz took a broken graph");
    for (name, text) in every_drawing("dot") {
        let (ok, stderr) = dot(&text);
        assert!(ok && stderr.is_empty(), "{name}: {stderr}\n{text}");
    }
}

/// Mermaid, in headless Chromium, renders every Mermaid drawing (and refuses a broken one, so
/// the check can fail).
#[test]
fn mermaid_in_chromium_renders_every_drawing() {
    for (what, path) in [("Chromium", CHROMIUM), ("Mermaid", MERMAID)] {
        assert!(
            Path::new(path).exists(),
            "{what} is missing at {path}: this test needs Debian's chromium and the npm package \
             mermaid (`npm install --prefix target/test-tools mermaid@11.17.2`; .ci/run installs both)"
        );
    }
    let mut drawings = every_drawing("mermaid");
    drawings.push(("a broken drawing".into(), "flowchart TD\n  a --> b(\n".into()));
    let sources: Vec<&str> = drawings.iter().map(|(_, t)| t.as_str()).collect();
    // Nothing in the JSON closes the script block it sits in.
    let sources = serde_json::to_string(&sources)
        .expect("JSON")
        .replace('<', "\\u003c");
    let dir = crate::support::TempDir::new("graph-mermaid");
    let page = dir.write(
        "page.html",
        format!(
            "<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head><body>\n\
             <script src=\"file://{MERMAID}\"></script>\n\
             <script>\n\
             mermaid.initialize({{startOnLoad: false}});\n\
             (async function () {{\n\
               var sources = {sources}, out = [];\n\
               for (var i = 0; i < sources.length; i++) {{\n\
                 try {{ await mermaid.render('d' + i, sources[i]); out.push('ok'); }}\n\
                 catch (e) {{ out.push(String((e && e.message) || e)); }}\n\
               }}\n\
               var pre = document.createElement('pre');\n\
               pre.id = 'results';\n\
               pre.textContent = JSON.stringify(out);\n\
               document.body.appendChild(pre);\n\
             }})();\n\
             </script></body></html>\n"
        ),
    );
    let out = std::process::Command::new("timeout")
        .arg("300")
        .arg(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--allow-file-access-from-files",
            "--virtual-time-budget=600000",
            "--dump-dom",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("profile").display()
        ))
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium starts");
    let dom = String::from_utf8_lossy(&out.stdout);
    let results = dom
        .split_once("<pre id=\"results\">")
        .and_then(|(_, r)| r.split_once("</pre>"))
        .map(|(r, _)| r.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
        .unwrap_or_else(|| {
            panic!(
                "Mermaid left no results: {}\n{dom}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let results: Vec<String> = serde_json::from_str(&results).expect("the results' JSON");
    assert_eq!(results.len(), drawings.len(), "{results:?}");
    let (broken, drawings) = drawings.split_last().expect("drawings");
    let (refused, results) = results.split_last().expect("results");
    assert_ne!(refused, "ok", "Mermaid took {}", broken.0);
    for ((name, text), result) in drawings.iter().zip(results) {
        assert_eq!(result, "ok", "{name}:\n{text}");
    }
}
