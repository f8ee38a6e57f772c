//! Drawing a flow plan as Mermaid or Graphviz DOT text: edges labelled with their `on`, `if`
//! and `errors`; `foreach` and `while` loops drawn as self-loops with their bound; `parallel`
//! branches inside a box of their own. With the flows that `flow` agents call, the drawing is
//! still one document: each called flow (drawn once, however many steps call it) is a Mermaid
//! `subgraph` or a DOT `cluster`, its node ids prefixed `f<N>_`, and a dotted `calls` edge
//! joins each calling step to its start. Labels are escaped so that they render as written.

use std::fmt::Write as _;

use petgraph::stable_graph::NodeIndex;

use super::{AgentPlanSpec, CallPlan, FlowPlan, FlowRef, Plan, StepPlanKind};
use crate::model::EdgeOn;

pub(super) fn call_label(c: &CallPlan) -> String {
    let kind = c.agent.kind().as_str();
    let name = &c.agent.name;
    match &c.agent.spec {
        AgentPlanSpec::Llm(l) => format!("{kind} {name} ({})", l.model),
        _ => format!("{kind} {name}"),
    }
}

/// One-line description of what a step does, for node labels.
pub(super) fn describe(flow: &FlowPlan, n: NodeIndex) -> (String, &'static str) {
    let Some(step) = flow.step(n) else {
        return ("end".into(), "end");
    };
    let (detail, shape) = match &step.kind {
        StepPlanKind::Call(c) => (call_label(c), "agent"),
        StepPlanKind::Foreach(f) => (
            format!("foreach {} → {}", f.as_name, call_label(&f.body)),
            "foreach",
        ),
        StepPlanKind::While(w) => (format!("while → {}", call_label(&w.body)), "while"),
        StepPlanKind::Set(s) => {
            let dests: Vec<&str> = s.iter().take(3).map(|(d, _)| d.text()).collect();
            let more = s.len().saturating_sub(3);
            let more = if more > 0 {
                format!(", … (+{more})")
            } else {
                String::new()
            };
            (format!("set {}{more}", dests.join(", ")), "set")
        }
        StepPlanKind::Parallel(p) => (format!("parallel ×{}", p.branches.len()), "parallel"),
        StepPlanKind::Interrupt(_) => ("interrupt: wait for a human".into(), "interrupt"),
        StepPlanKind::Fail { kind, .. } => (format!("fail: {kind}"), "fail"),
        StepPlanKind::Succeed => ("succeed".into(), "succeed"),
    };
    (format!("{}\n{}", step.id, detail), shape)
}

/// Text inside a quoted Mermaid label: `#` first (it starts Mermaid's entity codes), then the
/// characters Mermaid or the HTML it renders to would read (`&`, `"`, `<`, `>`, a backtick
/// that would start a Markdown string, a backslash, which Mermaid would read with the `n` after
/// it as a line break); line breaks become `<br/>`.
fn mermaid_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '#' => out.push_str("#35;"),
            '&' => out.push_str("#amp;"),
            '"' => out.push_str("#quot;"),
            '<' => out.push_str("#lt;"),
            '>' => out.push_str("#gt;"),
            '`' => out.push_str("#96;"),
            '\\' => out.push_str("#92;"),
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' | '\r' => out.push_str("<br/>"),
            c => out.push(c),
        }
    }
    out
}

pub(super) fn node_id(flow: &FlowPlan, n: NodeIndex, prefix: &str) -> String {
    match flow.step(n) {
        Some(s) => format!("{prefix}s_{}", s.id),
        None => format!("{prefix}done"),
    }
}

/// The flows a drawing holds: the top flow, then (with `nested`) every flow that `flow`
/// agents call, transitively, each once, in the order first called; each with the prefix of
/// its node ids.
pub(super) fn drawn(plan: &Plan, nested: bool) -> Vec<(FlowRef, String)> {
    let mut flows = vec![plan.root];
    let mut i = 0;
    while nested && i < flows.len() {
        for (_, child) in calls(plan.flow(flows[i])) {
            if !flows.contains(&child) {
                flows.push(child);
            }
        }
        i += 1;
    }
    flows
        .into_iter()
        .enumerate()
        .map(|(i, r)| (r, if i == 0 { String::new() } else { format!("f{i}_") }))
        .collect()
}

/// The steps of `flow` that call another flow, with the flow they call (a `parallel` step once
/// per branch that does).
pub(super) fn calls(flow: &FlowPlan) -> Vec<(NodeIndex, FlowRef)> {
    let mut out = Vec::new();
    for n in flow.steps.values() {
        let Some(step) = flow.step(*n) else { continue };
        let bodies: Vec<&CallPlan> = match &step.kind {
            StepPlanKind::Call(c) => vec![c],
            StepPlanKind::Foreach(f) => vec![&f.body],
            StepPlanKind::While(w) => vec![&w.body],
            StepPlanKind::Parallel(p) => p.branches.iter().map(|(_, c)| c).collect(),
            _ => Vec::new(),
        };
        for c in bodies {
            if let AgentPlanSpec::Flow(child) = &c.agent.spec
                && !out.contains(&(*n, *child))
            {
                out.push((*n, *child));
            }
        }
    }
    out
}

/// The `calls` edges of a drawing: from each calling step to the start of the flow it calls.
pub(super) fn call_edges(plan: &Plan, flows: &[(FlowRef, String)]) -> Vec<(String, String)> {
    let prefix_of = |r: FlowRef| flows.iter().find(|(f, _)| *f == r).map(|(_, p)| p.as_str());
    let mut out = Vec::new();
    for (r, prefix) in flows {
        let flow = plan.flow(*r);
        for (n, child) in calls(flow) {
            if let Some(child_prefix) = prefix_of(child) {
                out.push((node_id(flow, n, prefix), format!("{child_prefix}start")));
            }
        }
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Line {
    Solid,
    /// A `foreach`/`while` self-loop.
    Loop,
    /// An `on: failure` edge.
    Failure,
}

/// One drawn edge, the same for every output format.
pub(super) struct DrawEdge {
    pub from: String,
    pub to: String,
    pub label: String,
    pub line: Line,
}

/// Every edge to draw — loops, routes, and the implicit ends (`done`, `failed`) — and whether
/// any leads to `failed`.
pub(super) fn edges(flow: &FlowPlan, prefix: &str) -> (Vec<DrawEdge>, bool) {
    let mut out = Vec::new();
    let mut failed = false;
    for n in flow.steps.values() {
        let from = node_id(flow, *n, prefix);
        let step = flow.step(*n).expect("steps are step nodes");
        let edge = |to: String, label: String, line: Line| DrawEdge {
            from: from.clone(),
            to,
            label,
            line,
        };
        match &step.kind {
            StepPlanKind::Foreach(f) => out.push(edge(
                from.clone(),
                format!(
                    "each {} (max {}, {} at once)",
                    f.as_name, f.max_items, f.concurrency
                ),
                Line::Loop,
            )),
            StepPlanKind::While(w) => out.push(edge(
                from.clone(),
                format!("while {} (max {})", w.cond.text(), w.max_iterations),
                Line::Loop,
            )),
            _ => {}
        }
        if matches!(step.kind, StepPlanKind::Fail { .. }) {
            failed = true;
            out.push(edge(format!("{prefix}failed"), String::new(), Line::Solid));
        } else if !step.has_next {
            out.push(edge(format!("{prefix}done"), String::new(), Line::Solid));
        } else {
            for (route, to) in flow.routes(step) {
                let line = if route.on == EdgeOn::Failure {
                    Line::Failure
                } else {
                    Line::Solid
                };
                out.push(edge(node_id(flow, to, prefix), route.label(), line));
            }
        }
    }
    (out, failed)
}

/// Mermaid `flowchart` text: one document, the top flow at its top level and, with `nested`,
/// each called flow in a `subgraph`.
pub fn mermaid(plan: &Plan, nested: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "flowchart TD");
    let flows = drawn(plan, nested);
    for (r, prefix) in &flows {
        let flow = plan.flow(*r);
        if prefix.is_empty() {
            mermaid_flow(&mut out, flow, prefix, "  ");
        } else {
            let label = mermaid_text(&format!("flow {}", flow.name));
            let _ = writeln!(out, "  subgraph {prefix}flow [\"{label}\"]");
            mermaid_flow(&mut out, flow, prefix, "    ");
            let _ = writeln!(out, "  end");
        }
    }
    for (from, to) in call_edges(plan, &flows) {
        let _ = writeln!(out, "  {from} -.->|\"calls\"| {to}");
    }
    out
}

/// One flow's nodes and edges, ids prefixed with `prefix`, lines indented by `ind`.
fn mermaid_flow(out: &mut String, flow: &FlowPlan, prefix: &str, ind: &str) {
    let _ = writeln!(out, "{ind}{prefix}start((\"{}\"))", mermaid_text(&flow.name));
    let _ = writeln!(out, "{ind}{prefix}done((\"end\"))");
    for n in flow.steps.values() {
        let (label, shape) = describe(flow, *n);
        let id = node_id(flow, *n, prefix);
        let l = mermaid_text(&label);
        let step = flow.step(*n).expect("steps are step nodes");
        match (&step.kind, shape) {
            (StepPlanKind::Parallel(p), _) => {
                let _ = writeln!(out, "{ind}subgraph {id} [\"{l}\"]");
                let _ = writeln!(out, "{ind}  direction LR");
                for (name, c) in &p.branches {
                    let _ = writeln!(
                        out,
                        "{ind}  {id}__{name}[\"{}\"]",
                        mermaid_text(&format!("{name}\n{}", call_label(c)))
                    );
                }
                let _ = writeln!(out, "{ind}end");
            }
            (_, "foreach") => {
                let _ = writeln!(out, "{ind}{id}[[\"{l}\"]]");
            }
            (_, "while") => {
                let _ = writeln!(out, "{ind}{id}{{{{\"{l}\"}}}}");
            }
            (_, "set") => {
                let _ = writeln!(out, "{ind}{id}[/\"{l}\"/]");
            }
            (_, "interrupt") => {
                let _ = writeln!(out, "{ind}{id}>\"{l}\"]");
            }
            (_, "fail") | (_, "succeed") => {
                let _ = writeln!(out, "{ind}{id}([\"{l}\"])");
            }
            _ => {
                let _ = writeln!(out, "{ind}{id}[\"{l}\"]");
            }
        }
    }
    let _ = writeln!(
        out,
        "{ind}{prefix}start --> {}",
        node_id(flow, flow.start, prefix)
    );
    let (edges, failed) = edges(flow, prefix);
    for e in &edges {
        let arrow = if e.line == Line::Solid { "-->" } else { "-.->" };
        if e.label.is_empty() {
            let _ = writeln!(out, "{ind}{} {arrow} {}", e.from, e.to);
        } else {
            let _ = writeln!(
                out,
                "{ind}{} {arrow}|\"{}\"| {}",
                e.from,
                mermaid_text(&e.label),
                e.to
            );
        }
    }
    if failed {
        let _ = writeln!(out, "{ind}{prefix}failed((\"failed\"))");
    }
}

/// Text inside a quoted DOT string: backslashes and quotes escaped, `&` as `&amp;` (Graphviz
/// reads HTML entities in labels), line breaks as `\n`.
fn dot_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '&' => out.push_str("&amp;"),
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' | '\r' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Graphviz DOT text: one `digraph`, the top flow at its top level and, with `nested`, each
/// called flow in a `cluster` subgraph.
pub fn dot(plan: &Plan, nested: bool) -> String {
    let mut out = String::new();
    let root = plan.flow(plan.root);
    let _ = writeln!(out, "digraph \"{}\" {{", dot_text(&root.name));
    let _ = writeln!(out, "  rankdir=TB;");
    let _ = writeln!(out, "  node [fontname=\"Helvetica\", fontsize=11];");
    let _ = writeln!(out, "  edge [fontname=\"Helvetica\", fontsize=10];");
    let flows = drawn(plan, nested);
    for (r, prefix) in &flows {
        let flow = plan.flow(*r);
        if prefix.is_empty() {
            dot_flow(&mut out, flow, prefix, "  ");
        } else {
            let label = dot_text(&format!("flow {}", flow.name));
            let _ = writeln!(out, "  subgraph cluster_{prefix}flow {{");
            let _ = writeln!(out, "    label=\"{label}\"; style=dashed;");
            dot_flow(&mut out, flow, prefix, "    ");
            let _ = writeln!(out, "  }}");
        }
    }
    for (from, to) in call_edges(plan, &flows) {
        let _ = writeln!(out, "  {from} -> {to} [label=\"calls\", style=dotted];");
    }
    let _ = writeln!(out, "}}");
    out
}

/// One flow's nodes and edges, ids prefixed with `prefix`, lines indented by `ind`.
fn dot_flow(out: &mut String, flow: &FlowPlan, prefix: &str, ind: &str) {
    let _ = writeln!(
        out,
        "{ind}{prefix}start [shape=circle, label=\"{}\"];",
        dot_text(&flow.name)
    );
    let _ = writeln!(out, "{ind}{prefix}done [shape=doublecircle, label=\"end\"];");
    for n in flow.steps.values() {
        let (label, shape) = describe(flow, *n);
        let id = node_id(flow, *n, prefix);
        let step = flow.step(*n).expect("step");
        if let StepPlanKind::Parallel(p) = &step.kind {
            let _ = writeln!(out, "{ind}subgraph cluster_{id} {{");
            let _ = writeln!(out, "{ind}  label=\"{}\"; style=rounded;", dot_text(&label));
            let _ = writeln!(out, "{ind}  {id} [shape=point];");
            for (name, c) in &p.branches {
                let _ = writeln!(
                    out,
                    "{ind}  {id}__{name} [shape=box, label=\"{}\"];",
                    dot_text(&format!("{name}\n{}", call_label(c)))
                );
                let _ = writeln!(out, "{ind}  {id} -> {id}__{name} [style=dotted, arrowhead=none];");
            }
            let _ = writeln!(out, "{ind}}}");
            continue;
        }
        let attrs = match shape {
            "foreach" => "shape=box, peripheries=2",
            "while" => "shape=hexagon",
            "set" => "shape=parallelogram",
            "interrupt" => "shape=house",
            "fail" | "succeed" => "shape=box, style=rounded",
            _ => "shape=box",
        };
        let _ = writeln!(out, "{ind}{id} [{attrs}, label=\"{}\"];", dot_text(&label));
    }
    let _ = writeln!(
        out,
        "{ind}{prefix}start -> {};",
        node_id(flow, flow.start, prefix)
    );
    let (edges, failed) = edges(flow, prefix);
    for e in &edges {
        let style = match e.line {
            Line::Solid => "",
            Line::Loop => ", style=dashed",
            Line::Failure => ", style=dashed, color=firebrick",
        };
        if e.label.is_empty() && style.is_empty() {
            let _ = writeln!(out, "{ind}{} -> {};", e.from, e.to);
        } else {
            let _ = writeln!(
                out,
                "{ind}{} -> {} [label=\"{}\"{style}];",
                e.from,
                e.to,
                dot_text(&e.label)
            );
        }
    }
    if failed {
        let _ = writeln!(
            out,
            "{ind}{prefix}failed [shape=doublecircle, color=firebrick, label=\"failed\"];"
        );
    }
}
