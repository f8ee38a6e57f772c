//! Drawing a flow plan as Mermaid or Graphviz DOT text: edges labelled with their `on`, `if`
//! and `errors`; `foreach` and `while` loops drawn as self-loops with their bound; `parallel`
//! branches inside a box of their own.

use std::fmt::Write as _;

use petgraph::stable_graph::NodeIndex;

use super::{AgentPlanSpec, CallPlan, FlowPlan, StepPlanKind};
use crate::model::EdgeOn;

fn call_label(c: &CallPlan) -> String {
    let kind = c.agent.kind().as_str();
    let name = &c.agent.name;
    match &c.agent.spec {
        AgentPlanSpec::Llm(l) => format!("{kind} {name} ({})", l.model),
        _ => format!("{kind} {name}"),
    }
}

/// One-line description of what a step does, for node labels.
fn describe(flow: &FlowPlan, n: NodeIndex) -> (String, &'static str) {
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

fn mermaid_text(s: &str) -> String {
    s.replace('"', "#quot;")
        .replace('<', "#lt;")
        .replace('>', "#gt;")
        .replace('\n', "<br/>")
}

fn node_id(flow: &FlowPlan, n: NodeIndex) -> String {
    match flow.step(n) {
        Some(s) => format!("s_{}", s.id),
        None => "done".into(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Line {
    Solid,
    /// A `foreach`/`while` self-loop.
    Loop,
    /// An `on: failure` edge.
    Failure,
}

/// One drawn edge, the same for every output format.
struct DrawEdge {
    from: String,
    to: String,
    label: String,
    line: Line,
}

/// Every edge to draw — loops, routes, and the implicit ends (`done`, `failed`) — and whether
/// any leads to `failed`.
fn edges(flow: &FlowPlan) -> (Vec<DrawEdge>, bool) {
    let mut out = Vec::new();
    let mut failed = false;
    for n in flow.steps.values() {
        let from = node_id(flow, *n);
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
            out.push(edge("failed".into(), String::new(), Line::Solid));
        } else if !step.has_next {
            out.push(edge("done".into(), String::new(), Line::Solid));
        } else {
            for (route, to) in flow.routes(step) {
                let line = if route.on == EdgeOn::Failure {
                    Line::Failure
                } else {
                    Line::Solid
                };
                out.push(edge(node_id(flow, to), route.label(), line));
            }
        }
    }
    (out, failed)
}

/// Mermaid `flowchart` text.
pub fn mermaid(flow: &FlowPlan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "flowchart TD");
    let _ = writeln!(out, "  start((\"{}\"))", mermaid_text(&flow.name));
    let _ = writeln!(out, "  done((\"end\"))");
    for n in flow.steps.values() {
        let (label, shape) = describe(flow, *n);
        let id = node_id(flow, *n);
        let l = mermaid_text(&label);
        let step = flow.step(*n).expect("steps are step nodes");
        match (&step.kind, shape) {
            (StepPlanKind::Parallel(p), _) => {
                let _ = writeln!(out, "  subgraph {id} [\"{l}\"]");
                let _ = writeln!(out, "    direction LR");
                for (name, c) in &p.branches {
                    let _ = writeln!(
                        out,
                        "    {id}__{name}[\"{}\"]",
                        mermaid_text(&format!("{name}\n{}", call_label(c)))
                    );
                }
                let _ = writeln!(out, "  end");
            }
            (_, "foreach") => {
                let _ = writeln!(out, "  {id}[[\"{l}\"]]");
            }
            (_, "while") => {
                let _ = writeln!(out, "  {id}{{{{\"{l}\"}}}}");
            }
            (_, "set") => {
                let _ = writeln!(out, "  {id}[/\"{l}\"/]");
            }
            (_, "interrupt") => {
                let _ = writeln!(out, "  {id}>\"{l}\"]");
            }
            (_, "fail") | (_, "succeed") => {
                let _ = writeln!(out, "  {id}([\"{l}\"])");
            }
            _ => {
                let _ = writeln!(out, "  {id}[\"{l}\"]");
            }
        }
    }
    let _ = writeln!(out, "  start --> {}", node_id(flow, flow.start));
    let (edges, failed) = edges(flow);
    for e in &edges {
        let arrow = if e.line == Line::Solid { "-->" } else { "-.->" };
        if e.label.is_empty() {
            let _ = writeln!(out, "  {} {arrow} {}", e.from, e.to);
        } else {
            let _ = writeln!(
                out,
                "  {} {arrow}|\"{}\"| {}",
                e.from,
                mermaid_text(&e.label),
                e.to
            );
        }
    }
    if failed {
        let _ = writeln!(out, "  failed((\"failed\"))");
    }
    out
}

fn dot_text(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Graphviz DOT text.
pub fn dot(flow: &FlowPlan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", dot_text(&flow.name));
    let _ = writeln!(out, "  rankdir=TB;");
    let _ = writeln!(out, "  node [fontname=\"Helvetica\", fontsize=11];");
    let _ = writeln!(out, "  edge [fontname=\"Helvetica\", fontsize=10];");
    let _ = writeln!(out, "  start [shape=circle, label=\"{}\"];", dot_text(&flow.name));
    let _ = writeln!(out, "  done [shape=doublecircle, label=\"end\"];");
    for n in flow.steps.values() {
        let (label, shape) = describe(flow, *n);
        let id = node_id(flow, *n);
        let step = flow.step(*n).expect("step");
        if let StepPlanKind::Parallel(p) = &step.kind {
            let _ = writeln!(out, "  subgraph cluster_{id} {{");
            let _ = writeln!(out, "    label=\"{}\"; style=rounded;", dot_text(&label));
            let _ = writeln!(out, "    {id} [shape=point];");
            for (name, c) in &p.branches {
                let _ = writeln!(
                    out,
                    "    {id}__{name} [shape=box, label=\"{}\"];",
                    dot_text(&format!("{name}\n{}", call_label(c)))
                );
                let _ = writeln!(out, "    {id} -> {id}__{name} [style=dotted, arrowhead=none];");
            }
            let _ = writeln!(out, "  }}");
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
        let _ = writeln!(out, "  {id} [{attrs}, label=\"{}\"];", dot_text(&label));
    }
    let _ = writeln!(out, "  start -> {};", node_id(flow, flow.start));
    let (edges, failed) = edges(flow);
    for e in &edges {
        let style = match e.line {
            Line::Solid => "",
            Line::Loop => ", style=dashed",
            Line::Failure => ", style=dashed, color=firebrick",
        };
        if e.label.is_empty() && style.is_empty() {
            let _ = writeln!(out, "  {} -> {};", e.from, e.to);
        } else {
            let _ = writeln!(
                out,
                "  {} -> {} [label=\"{}\"{style}];",
                e.from,
                e.to,
                dot_text(&e.label)
            );
        }
    }
    if failed {
        let _ = writeln!(
            out,
            "  failed [shape=doublecircle, color=firebrick, label=\"failed\"];"
        );
    }
    let _ = writeln!(out, "}}");
    out
}
