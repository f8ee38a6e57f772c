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

#[test]
fn nested_flows_are_drawn_after_the_top_flow() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run(switchyard(root).args(["graph", "examples/nested-flow.yaml", "--nested"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(out.stdout.matches("flowchart TD").count() >= 2, "{}", out.stdout);
}

#[test]
fn an_invalid_flow_is_not_drawn() {
    let dir = crate::support::TempDir::new("graph");
    let f = dir.write(
        "bad.yaml",
        "flow: bad\nsteps:\n  a:\n    set: {$.x: =1}\n    next: nowhere\n",
    );
    let out = run(switchyard(dir.path()).arg("graph").arg(&f));
    assert_eq!(out.code(), 2, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert!(out.stderr.contains("SY201"), "{}", out.stderr);
}
