//! Drawing a flow plan as Mermaid or Graphviz DOT text: edges labelled with their `on`, `if`
//! and `errors`; `foreach` and `while` loops drawn as self-loops with their bound; `parallel`
//! branches inside a box of their own.

use std::fmt::Write as _;

use petgraph::stable_graph::NodeIndex;

use super::{AgentPlanSpec, CallPlan, FlowPlan, PlanNode, StepPlanKind};
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

/// Mermaid `flowchart` text.
pub fn mermaid(flow: &FlowPlan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "flowchart TD");
    let _ = writeln!(out, "  start((\"{}\"))", mermaid_text(&flow.name));
    let _ = writeln!(out, "  done((\"end\"))");
    let mut failed = false;
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
    for n in flow.steps.values() {
        let id = node_id(flow, *n);
        let step = flow.step(*n).expect("step");
        match &step.kind {
            StepPlanKind::Foreach(f) => {
                let _ = writeln!(
                    out,
                    "  {id} -.->|\"{}\"| {id}",
                    mermaid_text(&format!(
                        "each {} (max {}, {} at once)",
                        f.as_name, f.max_items, f.concurrency
                    ))
                );
            }
            StepPlanKind::While(w) => {
                let _ = writeln!(
                    out,
                    "  {id} -.->|\"{}\"| {id}",
                    mermaid_text(&format!("while {} (max {})", w.cond.text(), w.max_iterations))
                );
            }
            _ => {}
        }
        if matches!(step.kind, StepPlanKind::Fail { .. }) {
            failed = true;
            let _ = writeln!(out, "  {id} --> failed");
            continue;
        }
        if !step.has_next {
            let _ = writeln!(out, "  {id} --> done");
            continue;
        }
        for (edge, to) in flow.routes(step) {
            let to_id = node_id(flow, to);
            let label = edge.label();
            let dotted = edge.on == EdgeOn::Failure;
            match (label.is_empty(), dotted) {
                (true, false) => {
                    let _ = writeln!(out, "  {id} --> {to_id}");
                }
                (true, true) => {
                    let _ = writeln!(out, "  {id} -.-> {to_id}");
                }
                (false, false) => {
                    let _ = writeln!(out, "  {id} -->|\"{}\"| {to_id}", mermaid_text(&label));
                }
                (false, true) => {
                    let _ = writeln!(out, "  {id} -.->|\"{}\"| {to_id}", mermaid_text(&label));
                }
            }
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
    let mut failed = false;
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
    for n in flow.steps.values() {
        let id = node_id(flow, *n);
        let step = flow.step(*n).expect("step");
        match &step.kind {
            StepPlanKind::Foreach(f) => {
                let _ = writeln!(
                    out,
                    "  {id} -> {id} [style=dashed, label=\"{}\"];",
                    dot_text(&format!("each {} (max {})", f.as_name, f.max_items))
                );
            }
            StepPlanKind::While(w) => {
                let _ = writeln!(
                    out,
                    "  {id} -> {id} [style=dashed, label=\"{}\"];",
                    dot_text(&format!("while {} (max {})", w.cond.text(), w.max_iterations))
                );
            }
            _ => {}
        }
        if matches!(step.kind, StepPlanKind::Fail { .. }) {
            failed = true;
            let _ = writeln!(out, "  {id} -> failed;");
            continue;
        }
        if !step.has_next {
            let _ = writeln!(out, "  {id} -> done;");
            continue;
        }
        for (edge, to) in flow.routes(step) {
            let style = if edge.on == EdgeOn::Failure {
                ", style=dashed, color=firebrick"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  {id} -> {} [label=\"{}\"{style}];",
                node_id(flow, to),
                dot_text(&edge.label())
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
    let _ = PlanNode::End;
    out
}
