//! `switchyard graph`: the compiled flow drawn as Mermaid and DOT, with every step, labelled
//! edges, loops as self-loops with their bound and parallel branches inside their step.

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
