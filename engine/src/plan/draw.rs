//! Drawing a flow plan as Mermaid or Graphviz DOT text: edges labelled with their `on`, `if`
//! and `errors`; `foreach` and `while` loops drawn as self-loops with their bound; `parallel`
//! branches inside a box of their own. Where a step has rival edges (more than one that could
//! be taken on the same outcome), every edge of the step is numbered with its place in `next`,
//! the order they are tried in (SPEC §4), and an unconditional edge after rivals is `else`.
//!
//! An agent loop's tools (SPEC §6.3) are nodes of their own, joined to the step (or `parallel`
//! branch) whose agent is the loop by a dashed edge labelled `tool` with no arrowhead; a tool
//! that is itself a loop has its tools joined to it the same way. With the flows that `flow`
//! agents call, the drawing is still one document: each called flow (drawn once, however many
//! steps or tools call it) is a Mermaid `subgraph` or a DOT `cluster`, its node ids prefixed
//! `f<N>_`, and a dotted `calls` edge joins each calling step or tool to its start. Labels are
//! escaped so that they render as written.

use std::fmt::Write as _;

use petgraph::stable_graph::NodeIndex;

use super::{AgentPlanSpec, CallPlan, FlowPlan, FlowRef, LlmPlan, LoopPlan, Plan, RouteEdge, StepPlanKind};
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
/// agents call, steps' and tools' alike, transitively, each once, in the order first called;
/// each with the prefix of its node ids.
pub(super) fn drawn(plan: &Plan, nested: bool) -> Vec<(FlowRef, String)> {
    let mut flows = vec![plan.root];
    let mut i = 0;
    while nested && i < flows.len() {
        for (_, child) in calls(plan.flow(flows[i]), "") {
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

/// One agent call a step makes, with the node that draws it (the step's own node, or a
/// `parallel` step's branch) and the branch's name.
struct StepCall<'a> {
    node: String,
    branch: Option<&'a str>,
    call: &'a CallPlan,
}

/// The agent calls a step makes, each with the node that draws it.
fn step_calls<'a>(flow: &'a FlowPlan, n: NodeIndex, prefix: &str) -> Vec<StepCall<'a>> {
    let Some(step) = flow.step(n) else {
        return Vec::new();
    };
    let id = node_id(flow, n, prefix);
    match &step.kind {
        StepPlanKind::Parallel(p) => p
            .branches
            .iter()
            .map(|(name, c)| StepCall {
                node: format!("{id}__{name}"),
                branch: Some(name),
                call: c,
            })
            .collect(),
        kind => kind
            .calls()
            .into_iter()
            .map(|c| StepCall {
                node: id.clone(),
                branch: None,
                call: c,
            })
            .collect(),
    }
}

/// The nodes of `flow`'s drawing that call another flow, with the flow they call, each pair
/// once: a step whose agent is a `flow` agent (a `parallel` step once per branch that calls
/// one, from the step), and a tool node whose agent is.
pub(super) fn calls(flow: &FlowPlan, prefix: &str) -> Vec<(String, FlowRef)> {
    let mut out: Vec<(String, FlowRef)> = Vec::new();
    let mut push = |from: String, child: FlowRef| {
        if !out.iter().any(|(f, c)| *f == from && *c == child) {
            out.push((from, child));
        }
    };
    let tools = tools(flow, prefix);
    for n in flow.steps.values() {
        for c in step_calls(flow, *n, prefix) {
            if let AgentPlanSpec::Flow(child) = &c.call.agent.spec {
                push(node_id(flow, *n, prefix), *child);
            }
        }
        let step = flow.step(*n).map(|s| s.id.as_str());
        for t in tools.iter().filter(|t| Some(t.step) == step) {
            if let Some(AgentPlanSpec::Flow(child)) = t.call.map(|c| &c.agent.spec) {
                push(t.id.clone(), *child);
            }
        }
    }
    out
}

/// The `calls` edges of a drawing: from each calling step or tool to the start of the flow
/// it calls.
pub(super) fn call_edges(plan: &Plan, flows: &[(FlowRef, String)]) -> Vec<(String, String)> {
    let prefix_of = |r: FlowRef| flows.iter().find(|(f, _)| *f == r).map(|(_, p)| p.as_str());
    let mut out = Vec::new();
    for (r, prefix) in flows {
        for (from, child) in calls(plan.flow(*r), prefix) {
            if let Some(child_prefix) = prefix_of(child) {
                out.push((from, format!("{child_prefix}start")));
            }
        }
    }
    out
}

/// A tool of an agent loop, drawn as a node of its own.
pub(super) struct ToolNode<'a> {
    /// Its node id: `t_<step>__<tool>` (`t_<step>__<branch>__<tool>` for a `parallel`
    /// branch's loop, `<outer tool's id>__<tool>` for a tool of a tool), prefixed with the
    /// flow's prefix; made unique with a number where two would be alike.
    pub id: String,
    /// The node of the loop that may call it: a step, a branch, or the tool it is a tool of.
    pub from: String,
    /// The id of the step it belongs to.
    pub step: &'a str,
    /// Its name, after the `parallel` branch whose loop it is a tool of (`a/search`) and
    /// the tools it is reached through (`helper.search`): how the run page names it.
    pub path: String,
    /// The tool's name (its agent's), then its agent's kind (`command`; `llm (model)`), and a
    /// line more when its calls wait for approval or its result ends the loop.
    pub label: String,
    /// Its call; none for an MCP server's tools, listed when the loop starts.
    pub call: Option<&'a CallPlan>,
}

/// The agent loop an agent is, if any.
fn loop_of(c: &CallPlan) -> Option<&LoopPlan> {
    match &c.agent.spec {
        AgentPlanSpec::Llm(LlmPlan {
            agent_loop: Some(l), ..
        }) => Some(l),
        _ => None,
    }
}

/// Every tool node of `flow`'s drawing, step by step in the order written, each loop's tools
/// in the order written, a tool's own tools after it.
pub(super) fn tools<'a>(flow: &'a FlowPlan, prefix: &str) -> Vec<ToolNode<'a>> {
    fn add<'a>(
        lp: &'a LoopPlan,
        from: &str,
        base: &str,
        step: &'a str,
        path: &str,
        out: &mut Vec<ToolNode<'a>>,
    ) {
        let unique = |name: &str, out: &[ToolNode<'a>]| {
            let mut id = format!("{base}__{name}");
            let mut k = 2;
            while out.iter().any(|o| o.id == id) {
                id = format!("{base}__{name}_{k}");
                k += 1;
            }
            id
        };
        let path_of = |name: &str| {
            if path.is_empty() || path.ends_with('/') {
                format!("{path}{name}")
            } else {
                format!("{path}.{name}")
            }
        };
        for t in &lp.tools {
            let id = unique(&t.name, out);
            let path = path_of(&t.name);
            let agent = &t.call.agent;
            let mut label = match &agent.spec {
                AgentPlanSpec::Llm(l) => format!("{}\nllm ({})", t.name, l.model),
                _ => format!("{}\n{}", t.name, agent.kind().as_str()),
            };
            if lp.approve.contains(&t.name) {
                label.push_str("\nwaits for approval");
            }
            if lp.until_tool.as_deref() == Some(t.name.as_str()) {
                label.push_str("\nends the loop");
            }
            out.push(ToolNode {
                id: id.clone(),
                from: from.to_string(),
                step,
                path: path.clone(),
                label,
                call: Some(&t.call),
            });
            if let Some(inner) = loop_of(&t.call) {
                add(inner, &id, &id, step, &path, out);
            }
        }
        // An MCP server's tools: those its allowlist names (or the one `server.tool`
        // names), else one node for every tool it lists.
        for s in &lp.servers {
            let server = &s.server.name;
            let names: Vec<String> = match &s.only {
                Some(tool) => vec![tool.clone()],
                None if s.server.tools.iter().any(|t| t == "*") => vec!["*".to_string()],
                None => s.server.tools.clone(),
            };
            for tool in names {
                let name = super::mcp_tool_name(server, &tool);
                let id = unique(&name.replace('*', "all"), out);
                let mut label = format!("{name}\nmcp");
                let by_agent = lp
                    .approve
                    .iter()
                    .any(|a| *a == format!("{server}.{tool}") || *a == format!("{server}.*"));
                if s.server.approve.contains(&tool) || by_agent {
                    label.push_str("\nwaits for approval");
                }
                out.push(ToolNode {
                    id,
                    from: from.to_string(),
                    step,
                    path: path_of(&name),
                    label,
                    call: None,
                });
            }
        }
    }
    let mut out = Vec::new();
    for n in flow.steps.values() {
        let Some(step) = flow.step(*n) else { continue };
        for c in step_calls(flow, *n, prefix) {
            let Some(lp) = loop_of(c.call) else { continue };
            let base = match c.branch {
                Some(branch) => format!("{prefix}t_{}__{branch}", step.id),
                None => format!("{prefix}t_{}", step.id),
            };
            let path = c.branch.map_or_else(String::new, |b| format!("{b}/"));
            add(lp, &c.node, &base, &step.id, &path, &mut out);
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

/// The labels of a step's routes, in the order written: each route's `on`, `errors` and
/// `if`. Where some outcome has rivals (two routes or more that it could take), every route
/// is numbered with its place in `next`, the order routes are tried in (failure routes
/// too: they are tried in the same order), and a route with neither `if` nor `errors` after
/// a rival of its outcome is the fallback, `else`. A step without rivals keeps plain labels
/// (a lone unconditional route: none).
pub(super) fn route_labels<'r>(routes: impl IntoIterator<Item = &'r RouteEdge>) -> Vec<String> {
    let routes: Vec<&RouteEdge> = routes.into_iter().collect();
    let on_success = |r: &RouteEdge| r.on != EdgeOn::Failure;
    let on_failure = |r: &RouteEdge| r.on != EdgeOn::Success;
    let rivals =
        |r: &RouteEdge, o: &RouteEdge| (on_success(r) && on_success(o)) || (on_failure(r) && on_failure(o));
    let numbered = routes.iter().filter(|r| on_success(r)).count() > 1
        || routes.iter().filter(|r| on_failure(r)).count() > 1;
    routes
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut label = r.label();
            let fallback = r.cond.is_none() && r.errors.is_none() && routes[..i].iter().any(|o| rivals(r, o));
            if fallback {
                label = if label.is_empty() {
                    "else".to_string()
                } else {
                    format!("{label}; else")
                };
            }
            match (numbered, label.is_empty()) {
                (false, _) => label,
                (true, true) => format!("{}", i + 1),
                (true, false) => format!("{}: {label}", i + 1),
            }
        })
        .collect()
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
            let labels = route_labels(flow.routes(step).map(|(r, _)| r));
            for ((route, to), label) in flow.routes(step).zip(labels) {
                let line = if route.on == EdgeOn::Failure {
                    Line::Failure
                } else {
                    Line::Solid
                };
                out.push(edge(node_id(flow, to, prefix), label, line));
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
    for t in tools(flow, prefix) {
        let _ = writeln!(out, "{ind}{}(\"{}\")", t.id, mermaid_text(&t.label));
        let _ = writeln!(out, "{ind}{} -.-|\"tool\"| {}", t.from, t.id);
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
    for t in tools(flow, prefix) {
        let _ = writeln!(
            out,
            "{ind}{} [shape=box, style=\"rounded,dashed\", label=\"{}\"];",
            t.id,
            dot_text(&t.label)
        );
        let _ = writeln!(
            out,
            "{ind}{} -> {} [label=\"tool\", style=dashed, arrowhead=none, color=slategray, fontcolor=slategray];",
            t.from, t.id
        );
    }
    if failed {
        let _ = writeln!(
            out,
            "{ind}{prefix}failed [shape=doublecircle, color=firebrick, label=\"failed\"];"
        );
    }
}
