//! `switchyard graph`: the compiled flow drawn as Mermaid and DOT, with every step, labelled
//! edges, loops as self-loops with their bound and parallel branches inside their step; and as
//! SVG laid out by switchyard, with loops, `parallel` steps and called flows as boxes.

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
        m.contains("s_classify -->|\"if result.category == #quot;other#quot;\"| s_park"),
        "{m}"
    );
    assert!(
        m.contains("s_classify -.->|\"on failure; errors: timeout, rate_limited\"| s_manual_queue"),
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
        d.contains("s_classify -> s_park [label=\"if result.category == \\\"other\\\"\"]"),
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
            let edge = [" -> ", "-->", "-.->"].iter().any(|a| l.contains(a));
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
    // The braces outside quoted strings balance, closing the graph on the last line.
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
    assert_unique(&declared_ids(&d), &d);
}

#[test]
fn labels_are_escaped_to_render_as_written() {
    let dir = crate::support::TempDir::new("graph-labels");
    dir.write(
        "labels.yaml",
        "flow: labels\nsteps:\n  first:\n    set: {\"$['R&D \\\"beta\\\" #2']\": {value: 1}}\n    next:\n      \
         - to: second\n        if: \"payload.n == \\\"#1\\\" &&\\npayload.n < 2\"\n      - to: second\n  \
         second:\n    succeed: {}\n",
    );
    let m = run(switchyard(dir.path()).args(["graph", "labels.yaml"]));
    assert_eq!(m.code(), 0, "{}", m.stderr);
    let m = m.stdout;
    assert!(m.contains("set $['R#amp;D #quot;beta#quot; #35;2']\"/]\n"), "{m}");
    assert!(
        m.contains("|\"if payload.n == #quot;#35;1#quot; #amp;#amp;<br/>payload.n #lt; 2\"|"),
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
        d.contains("[label=\"if payload.n == \\\"#1\\\" &amp;&amp;\\npayload.n < 2\"]"),
        "{d}"
    );
}

/// A backslash written in a condition (`"a\nb"` in a CEL string) is shown as written: not a
/// line break in Mermaid, an escaped backslash in DOT.
#[test]
fn a_backslash_in_a_label_is_not_a_line_break() {
    let dir = crate::support::TempDir::new("graph-backslash");
    dir.write(
        "slash.yaml",
        "flow: slash\nsteps:\n  first:\n    set: {$.s: {value: x}}\n    next:\n      \
         - to: second\n        if: 'payload.s == \"a\\nb\"'\n      - to: second\n  \
         second:\n    succeed: {}\n",
    );
    let m = run(switchyard(dir.path()).args(["graph", "slash.yaml"]));
    assert_eq!(m.code(), 0, "{}", m.stderr);
    assert!(
        m.stdout.contains("|\"if payload.s == #quot;a#92;nb#quot;\"|"),
        "{}",
        m.stdout
    );
    assert!(!m.stdout.contains('\\'), "{}", m.stdout);
    let d = run(switchyard(dir.path()).args(["graph", "slash.yaml", "--format", "dot"]));
    assert_eq!(d.code(), 0, "{}", d.stderr);
    assert!(
        d.stdout.contains("[label=\"if payload.s == \\\"a\\\\nb\\\"\"]"),
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
            let doc = roxmltree::Document::parse(&out.stdout)
                .unwrap_or_else(|e| panic!("{file} (nested: {nested}): not XML: {e}\n{}", out.stdout));
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
                    assert!(!a.overlaps(b), "{file} (nested: {nested}): {a:?} overlaps {b:?}");
                }
            }
            // A loop's or a `parallel` step's box holds what it draws of the step.
            for (g, step) in &groups {
                let Some(step) = step else { continue };
                let inside: Vec<&Rect> = nodes
                    .iter()
                    .filter(|n| {
                        n.what.ends_with(&format!(" {step}")) || n.what.ends_with(&format!("_{step}"))
                    })
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
    assert!(labels.iter().any(|l| l == "if payload.auto_reply"), "{labels:?}");
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
    dir.write(
        "labels.yaml",
        "flow: labels\nsteps:\n  first:\n    set: {\"$['R&D \\\"beta\\\" <#2>']\": {value: 1}}\n    next:\n      \
         - to: second\n        if: \"payload.n == \\\"\\u0001'\\\" &&\\npayload.n < 2\"\n      - to: second\n  \
         second:\n    succeed: {}\n",
    );
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
            .any(|t| t == "if payload.n == \"\u{2401}'\" &&\npayload.n < 2"),
        "{titles:?}"
    );
}
