//! Drawing a flow plan as SVG (`graph --format svg`, SPEC §13), laid out in process: the
//! `dagre` crate (a port of dagre.js, the layered layout Mermaid draws with) ranks the steps,
//! orders each rank to cut crossings, places every node and routes every edge; this module
//! sizes the boxes from their text and writes the picture.
//!
//! What is drawn: a box per step (its id, then what it does), the flow's start, its end and,
//! when a `fail` step leads there, `failed`; an edge per route, labelled with its `on`, `if`
//! and `errors` (numbered, with `else`, where a step has rival edges: `draw::route_labels`),
//! failure edges red and dashed. A `foreach` or `while` step is a box around the step, titled
//! with what it iterates and its bound; a `parallel` step a box holding a fork, its branches
//! side by side and a join. An agent loop's tools are nodes below the step (inside its box,
//! if it has one), each joined to it by a dashed `tool` edge without an arrowhead. With
//! `nested`, each flow that `flow` agents call (drawn once) is a box of its own titled
//! `flow NAME`, and a dotted `calls` edge joins each calling step or tool to its start.
//!
//! Text is escaped for XML and shown as written: control characters as their Unicode
//! pictures, long lines wrapped (the whole text is the element's `<title>`, the tooltip).
//! Every node is a `<g class="node …">` holding one `<rect>` (or `<ellipse>`) with its box, and
//! `data-flow`/`data-step` naming it (a tool node `data-tool` too: its name, after the branch
//! and the tools it is reached through), for the tests and for pages that colour a run's route.

use std::collections::HashMap;
use std::fmt::Write as _;

use dagre::graph::{Graph, GraphOptions};
use dagre::{EdgeLabel, LayoutOptions, NodeLabel, RankDir};

use super::draw::{self, DrawEdge, Line};
use super::{FlowPlan, Plan, StepPlanKind};

/// The width of one character of the drawing's monospace font, and the height of a line.
const CHAR_W: f64 = 7.4;
const LINE_H: f64 = 16.0;
/// Padding inside a step's box.
const PAD_X: f64 = 12.0;
const PAD_Y: f64 = 8.0;
/// Where text is wrapped: node text, and edge labels.
const WRAP_NODE: usize = 44;
const WRAP_EDGE: usize = 36;

/// What a laid-out node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    Start,
    End,
    Failed,
    /// A step; its shape is the step's kind (`agent`, `set`, `interrupt`, `fail`, …).
    Step(&'static str),
    /// A `parallel` step's branch.
    Branch,
    /// The bars a `parallel` step's branches leave from and meet at.
    Fork,
    Join,
    /// The title line of a box (a loop, a `parallel` step, a called flow).
    Title,
    /// A tool of an agent loop.
    Tool,
}

/// A node of the drawing, with its box (top-left corner and size).
#[derive(Clone, Debug)]
pub struct NodeBox {
    pub kind: NodeKind,
    /// The flow's place in the drawing: `` for the top flow, `f1_`, `f2_`... for called ones.
    pub flow: String,
    /// The step it draws (for steps, branches, forks and joins), or whose loop may call it
    /// (for tools).
    pub step: Option<String>,
    /// Of a tool: its name, after the `parallel` branch whose loop it is a tool of
    /// (`a/search`) and the tools it is reached through (`helper.search`).
    pub tool: Option<String>,
    pub lines: Vec<String>,
    /// The whole text, unwrapped.
    pub text: String,
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

/// A box around other nodes: a loop, a `parallel` step, a called flow.
#[derive(Clone, Debug)]
pub struct GroupBox {
    /// `loop`, `parallel` or `flow`.
    pub kind: &'static str,
    pub flow: String,
    pub step: Option<String>,
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

impl GroupBox {
    /// A box not placed yet.
    fn new(kind: &'static str, flow: &str, step: Option<String>) -> GroupBox {
        GroupBox {
            kind,
            flow: flow.to_string(),
            step,
            x: 0.0,
            y: 0.0,
            w: 0.0,
            h: 0.0,
        }
    }
}

/// A drawn edge: its path, and its label's box when it has one.
#[derive(Clone, Debug)]
pub struct EdgeLine {
    /// `route`, `failure` or `calls`; `branch` for a `parallel` step's fork and join; `tool`
    /// from an agent loop to one of its tools.
    pub kind: &'static str,
    pub points: Vec<(f64, f64)>,
    pub label: Option<NodeBox>,
    pub from: String,
    pub to: String,
    /// Of a route of the drawing's top flow: the step it leaves and the step it goes to
    /// (`end` for the end), for marking the route a run took.
    pub route: Option<(String, String)>,
    /// Of an edge to a tool of the top flow: the step and the tool (as [`NodeBox::tool`]).
    pub tool: Option<(String, String)>,
}

/// What a run did, for colouring its flow's drawing: each top-level step's state (`ok`,
/// `failed`, `interrupted`, `running`), the routes it took (step, next step or `end`) and the
/// state of the tools its steps' agent loops called (step, tool name: `ok` when a call of it
/// succeeded, else how its last call ended). Steps with no state were never reached; a
/// loop's tools with none were never called.
#[derive(Clone, Debug, Default)]
pub struct Marks {
    pub steps: HashMap<String, &'static str>,
    pub routes: std::collections::HashSet<(String, String)>,
    pub tools: HashMap<(String, String), &'static str>,
}

/// A laid-out drawing.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub title: String,
    pub nodes: Vec<NodeBox>,
    pub groups: Vec<GroupBox>,
    pub edges: Vec<EdgeLine>,
    pub width: f64,
    pub height: f64,
}

/// An edge given to the layout: its ends (layout keys), its name among parallel edges, its
/// kind, its label, and the route it draws.
struct PendingEdge {
    from: String,
    to: String,
    name: String,
    kind: &'static str,
    label: Option<NodeBox>,
    route: Option<(String, String)>,
    tool: Option<(String, String)>,
}

/// What the layout is given, before `dagre` places it.
struct Builder {
    graph: Graph<NodeLabel, EdgeLabel>,
    nodes: Vec<(String, NodeBox)>,
    groups: Vec<(String, GroupBox)>,
    edges: Vec<PendingEdge>,
    /// The node an edge into (or out of) a drawn step's key goes to: a loop's inner step, a
    /// `parallel` step's fork (or join).
    into: HashMap<String, String>,
    out_of: HashMap<String, String>,
}

impl Builder {
    fn new() -> Self {
        let mut graph = Graph::with_options(GraphOptions {
            directed: true,
            multigraph: true,
            compound: true,
        });
        graph.set_default_edge_label(|_| EdgeLabel::default());
        Builder {
            graph,
            nodes: Vec::new(),
            groups: Vec::new(),
            edges: Vec::new(),
            into: HashMap::new(),
            out_of: HashMap::new(),
        }
    }

    fn node(&mut self, key: &str, parent: Option<&str>, b: NodeBox) {
        let label = NodeLabel {
            width: b.w,
            height: b.h,
            ..NodeLabel::default()
        };
        self.graph.set_node(key.to_string(), Some(label));
        if let Some(p) = parent {
            self.graph.set_parent(key, Some(p));
        }
        self.nodes.push((key.to_string(), b));
    }

    fn group(&mut self, key: &str, parent: Option<&str>, g: GroupBox) {
        self.graph.set_node(key.to_string(), Some(NodeLabel::default()));
        if let Some(p) = parent {
            self.graph.set_parent(key, Some(p));
        }
        self.groups.push((key.to_string(), g));
    }

    /// An edge between drawn keys (a step's key stands for the node that draws it).
    fn edge(&mut self, from: &str, to: &str, kind: &'static str, label: Option<NodeBox>) {
        let from = self.out_of.get(from).cloned().unwrap_or_else(|| from.to_string());
        let to = self.into.get(to).cloned().unwrap_or_else(|| to.to_string());
        self.raw_edge(&from, &to, kind, label);
    }

    /// A route of a flow: drawn as [`Builder::edge`], marked with its steps.
    fn route(
        &mut self,
        from: &str,
        to: &str,
        kind: &'static str,
        label: Option<NodeBox>,
        route: (String, String),
    ) {
        self.edge(from, to, kind, label);
        if let Some(e) = self.edges.last_mut() {
            e.route = Some(route);
        }
    }

    fn raw_edge(&mut self, from: &str, to: &str, kind: &'static str, label: Option<NodeBox>) {
        let name = self.edges.len().to_string();
        let mut e = EdgeLabel::default();
        if let Some(l) = &label {
            e.width = l.w;
            e.height = l.h;
        }
        // Titles sit above what they title: an edge that is laid out but not drawn.
        if kind == "title" {
            e.weight = 4;
        }
        self.graph.set_edge(from, to, Some(e), Some(&name));
        self.edges.push(PendingEdge {
            from: from.to_string(),
            to: to.to_string(),
            name,
            kind,
            label,
            route: None,
            tool: None,
        });
    }
}

/// Lays out the drawing of `plan` (with `nested`, the flows it calls too).
pub fn layout(plan: &Plan, nested: bool) -> Result<Layout, String> {
    let mut b = Builder::new();
    let flows = draw::drawn(plan, nested);
    for (r, prefix) in &flows {
        let flow = plan.flow(*r);
        let parent = if prefix.is_empty() {
            None
        } else {
            let key = format!("{prefix}flow");
            b.group(&key, None, GroupBox::new("flow", prefix, None));
            Some(key)
        };
        add_flow(&mut b, flow, prefix, parent.as_deref());
    }
    for (from, to) in draw::call_edges(plan, &flows) {
        b.edge(
            &from,
            &to,
            "calls",
            Some(text_box(NodeKind::Title, "", None, "calls", WRAP_EDGE)),
        );
    }
    let options = LayoutOptions {
        rankdir: RankDir::TB,
        nodesep: 28.0,
        edgesep: 14.0,
        ranksep: 36.0,
        marginx: 16.0,
        marginy: 16.0,
        ..LayoutOptions::default()
    };
    let mut graph = b.graph;
    let laid = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        dagre::layout(&mut graph, Some(options));
        graph
    }))
    .map_err(|_| "the layout of the drawing failed".to_string())?;
    let mut out = Layout {
        title: plan.flow(plan.root).name.clone(),
        ..Layout::default()
    };
    let place = |key: &str| -> Option<(f64, f64, f64, f64)> {
        let n = laid.node(key)?;
        let (x, y) = (n.x?, n.y?);
        Some((x - n.width / 2.0, y - n.height / 2.0, n.width, n.height))
    };
    for (key, mut n) in b.nodes {
        let (x, y, w, h) = place(&key).ok_or_else(|| format!("node `{key}` was not placed"))?;
        (n.x, n.y, n.w, n.h) = (x, y, w, h);
        out.nodes.push(n);
    }
    for (key, mut g) in b.groups {
        let (x, y, w, h) = place(&key).ok_or_else(|| format!("box `{key}` was not placed"))?;
        (g.x, g.y, g.w, g.h) = (x, y, w, h);
        out.groups.push(g);
    }
    for PendingEdge {
        from,
        to,
        name,
        kind,
        label,
        route,
        tool,
    } in b.edges
    {
        if kind == "title" {
            continue;
        }
        let e = laid
            .edge(&from, &to, Some(&name))
            .ok_or_else(|| format!("edge `{from}` → `{to}` was not routed"))?;
        let label = match (label, e.x, e.y) {
            (Some(mut l), Some(x), Some(y)) if !l.text.is_empty() => {
                l.x = x - l.w / 2.0;
                l.y = y - l.h / 2.0;
                Some(l)
            }
            _ => None,
        };
        out.edges.push(EdgeLine {
            kind,
            points: e.points.iter().map(|p| (p.x, p.y)).collect(),
            label,
            from,
            to,
            route,
            tool,
        });
    }
    // The drawing's extent: everything placed, with the margin.
    let mut right: f64 = 0.0;
    let mut bottom: f64 = 0.0;
    let mut grow = |x: f64, y: f64| {
        if x.is_finite() && y.is_finite() {
            right = right.max(x);
            bottom = bottom.max(y);
        }
    };
    for n in &out.nodes {
        grow(n.x + n.w, n.y + n.h);
    }
    for g in &out.groups {
        grow(g.x + g.w, g.y + g.h);
    }
    for e in &out.edges {
        for (x, y) in &e.points {
            grow(*x, *y);
        }
        if let Some(l) = &e.label {
            grow(l.x + l.w, l.y + l.h);
        }
    }
    out.width = (right + 16.0).ceil();
    out.height = (bottom + 16.0).ceil();
    Ok(out)
}

/// The nodes, boxes and edges of one flow, keys prefixed with `prefix`, inside `parent`.
fn add_flow(b: &mut Builder, flow: &FlowPlan, prefix: &str, parent: Option<&str>) {
    let p = prefix.to_string();
    if let Some(parent) = parent {
        let title = format!("{prefix}flow__title");
        b.node(
            &title,
            Some(parent),
            text_box(
                NodeKind::Title,
                &p,
                None,
                &format!("flow {}", flow.name),
                WRAP_NODE,
            ),
        );
        b.raw_edge(&title, &format!("{prefix}start"), "title", None);
    }
    b.node(
        &format!("{prefix}start"),
        parent,
        text_box(NodeKind::Start, &p, None, &flow.name, WRAP_NODE),
    );
    b.node(
        &format!("{prefix}done"),
        parent,
        text_box(NodeKind::End, &p, None, "end", WRAP_NODE),
    );
    let (edges, failed) = draw::edges(flow, prefix);
    if failed {
        b.node(
            &format!("{prefix}failed"),
            parent,
            text_box(NodeKind::Failed, &p, None, "failed", WRAP_NODE),
        );
    }
    for n in flow.steps.values() {
        let Some(step) = flow.step(*n) else { continue };
        let key = draw::node_id(flow, *n, prefix);
        let id = Some(step.id.clone());
        match &step.kind {
            StepPlanKind::Parallel(pl) => {
                let group = format!("{key}__box");
                b.group(&group, parent, GroupBox::new("parallel", &p, id.clone()));
                let title = format!("{key}__title");
                let text = format!("{}\nparallel ×{}", step.id, pl.branches.len());
                b.node(
                    &title,
                    Some(&group),
                    text_box(NodeKind::Title, &p, id.clone(), &text, WRAP_NODE),
                );
                let (fork, join) = (format!("{key}__fork"), format!("{key}__join"));
                b.node(
                    &fork,
                    Some(&group),
                    bar(NodeKind::Fork, &p, id.clone(), pl.branches.len()),
                );
                b.node(
                    &join,
                    Some(&group),
                    bar(NodeKind::Join, &p, id.clone(), pl.branches.len()),
                );
                b.raw_edge(&title, &fork, "title", None);
                for (name, c) in &pl.branches {
                    let branch = format!("{key}__{name}");
                    let text = format!("{name}\n{}", draw::call_label(c));
                    b.node(
                        &branch,
                        Some(&group),
                        text_box(NodeKind::Branch, &p, id.clone(), &text, WRAP_NODE),
                    );
                    b.raw_edge(&fork, &branch, "branch", None);
                    b.raw_edge(&branch, &join, "branch", None);
                }
                b.into.insert(key.clone(), fork);
                b.out_of.insert(key, join);
            }
            StepPlanKind::Foreach(_) | StepPlanKind::While(_) => {
                let group = format!("{key}__box");
                b.group(&group, parent, GroupBox::new("loop", &p, id.clone()));
                let title = format!("{key}__title");
                let text = match &step.kind {
                    StepPlanKind::Foreach(f) => {
                        format!(
                            "foreach {} (max {}, {} at once)",
                            f.as_name, f.max_items, f.concurrency
                        )
                    }
                    StepPlanKind::While(w) => format!("while {} (max {})", w.cond.text(), w.max_iterations),
                    _ => String::new(),
                };
                b.node(
                    &title,
                    Some(&group),
                    text_box(NodeKind::Title, &p, id.clone(), &text, WRAP_NODE),
                );
                let body = match &step.kind {
                    StepPlanKind::Foreach(f) => draw::call_label(&f.body),
                    StepPlanKind::While(w) => draw::call_label(&w.body),
                    _ => String::new(),
                };
                let shape = if matches!(step.kind, StepPlanKind::Foreach(_)) {
                    "foreach"
                } else {
                    "while"
                };
                b.node(
                    &key,
                    Some(&group),
                    text_box(
                        NodeKind::Step(shape),
                        &p,
                        id.clone(),
                        &format!("{}\n{body}", step.id),
                        WRAP_NODE,
                    ),
                );
                b.raw_edge(&title, &key, "title", None);
            }
            _ => {
                let (text, shape) = draw::describe(flow, *n);
                b.node(
                    &key,
                    parent,
                    text_box(NodeKind::Step(shape), &p, id, &text, WRAP_NODE),
                );
            }
        }
    }

    // An agent loop's tools, below the node of the step or branch whose loop calls them, in
    // the step's box when it has one.
    for t in draw::tools(flow, prefix) {
        let boxed = flow
            .steps
            .get(t.step)
            .and_then(|n| flow.step(*n))
            .is_some_and(|s| {
                matches!(
                    s.kind,
                    StepPlanKind::Foreach(_) | StepPlanKind::While(_) | StepPlanKind::Parallel(_)
                )
            });
        let group = boxed.then(|| format!("{}__box", draw::node_id(flow, flow.steps[t.step], prefix)));
        let mut node = text_box(NodeKind::Tool, &p, Some(t.step.to_string()), &t.label, WRAP_NODE);
        node.tool = Some(t.path.clone());
        b.node(&t.id, group.as_deref().or(parent), node);
        let label = text_box(NodeKind::Title, &p, None, "tool", WRAP_EDGE);
        b.raw_edge(&t.from, &t.id, "tool", Some(label));
        if let Some(e) = b.edges.last_mut()
            && prefix.is_empty()
        {
            e.tool = Some((t.step.to_string(), t.path));
        }
    }

    let step_of = |key: &str| -> String {
        let key = &key[prefix.len()..];
        match key.strip_prefix("s_") {
            Some(id) => id.to_string(),
            None if key == "done" => "end".to_string(),
            None => key.to_string(),
        }
    };
    let first = draw::node_id(flow, flow.start, prefix);
    let into_first = ("start".to_string(), step_of(&first));
    b.route(&format!("{prefix}start"), &first, "route", None, into_first);
    for DrawEdge {
        from,
        to,
        label,
        line,
    } in edges
    {
        let kind = match line {
            // A loop is its box.
            Line::Loop => continue,
            Line::Failure => "failure",
            Line::Solid => "route",
        };
        let label = (!label.is_empty()).then(|| text_box(NodeKind::Title, &p, None, &label, WRAP_EDGE));
        let route = (step_of(&from), step_of(&to));
        b.route(&from, &to, kind, label, route);
    }
}

/// A node sized to its text, wrapped at `wrap` characters.
fn text_box(kind: NodeKind, flow: &str, step: Option<String>, text: &str, wrap: usize) -> NodeBox {
    let lines = wrap_text(text, wrap);
    let widest = lines.iter().map(|l| text_width(l)).fold(0.0, f64::max);
    let (w, h) = match kind {
        NodeKind::Start | NodeKind::End | NodeKind::Failed => {
            let w = (widest + 2.0 * PAD_X).max(44.0);
            (w, 32.0)
        }
        NodeKind::Title => (widest + 8.0, lines.len() as f64 * LINE_H + 4.0),
        _ => (widest + 2.0 * PAD_X, lines.len() as f64 * LINE_H + 2.0 * PAD_Y),
    };
    NodeBox {
        kind,
        flow: flow.to_string(),
        step,
        tool: None,
        lines,
        text: text.to_string(),
        x: 0.0,
        y: 0.0,
        w: w.ceil(),
        h: h.ceil(),
    }
}

/// A `parallel` step's fork or join bar, as wide as a few branches.
fn bar(kind: NodeKind, flow: &str, step: Option<String>, branches: usize) -> NodeBox {
    NodeBox {
        kind,
        flow: flow.to_string(),
        step,
        tool: None,
        lines: Vec::new(),
        text: String::new(),
        x: 0.0,
        y: 0.0,
        w: 40.0 + 20.0 * branches.min(6) as f64,
        h: 6.0,
    }
}

/// Lines of at most `max` characters: the text's own lines, each broken at spaces (a word
/// longer than a line is cut).
fn wrap_text(text: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut current = String::new();
        let mut len = 0usize;
        for word in line.split(' ') {
            let wlen = word.chars().count();
            if len > 0 && len + 1 + wlen > max {
                out.push(std::mem::take(&mut current));
                len = 0;
            }
            if len > 0 {
                current.push(' ');
                len += 1;
            }
            if wlen > max {
                for c in word.chars() {
                    if len == max {
                        out.push(std::mem::take(&mut current));
                        len = 0;
                    }
                    current.push(c);
                    len += 1;
                }
            } else {
                current.push_str(word);
                len += wlen;
            }
        }
        out.push(current);
    }
    if out.is_empty() {
        out.push(String::new());
    }
    out
}

/// The drawn width of `s` in the monospace font: wide (East Asian, emoji) characters take two
/// cells, combining marks none.
fn text_width(s: &str) -> f64 {
    let cells: usize = s
        .chars()
        .map(|c| match c as u32 {
            0x0300..=0x036F | 0x200B..=0x200F | 0xFE00..=0xFE0F => 0,
            0x1100..=0x115F
            | 0x2E80..=0xA4CF
            | 0xAC00..=0xD7A3
            | 0xF900..=0xFAFF
            | 0xFE30..=0xFE4F
            | 0xFF00..=0xFF60
            | 0xFFE0..=0xFFE6
            | 0x1F300..=0x1FAFF
            | 0x20000..=0x3FFFD => 2,
            _ => 1,
        })
        .sum();
    cells as f64 * CHAR_W
}

/// Text for XML character data and attribute values: markup characters as entities; line
/// breaks and tabs kept (a `\r\n` as `\n`); the characters XML 1.0 cannot hold, or would
/// change (a lone `\r`), shown as what they are: C0 controls as their Unicode control
/// pictures, noncharacters as U+FFFD.
pub fn xml_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' | '\t' => out.push(c),
            '\r' if chars.peek() == Some(&'\n') => {}
            c if (c as u32) < 0x20 => out.push(char::from_u32(0x2400 + c as u32).unwrap_or('\u{FFFD}')),
            '\u{7F}' => out.push('\u{2421}'),
            '\u{FFFE}' | '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn num(v: f64) -> String {
    let r = (v * 10.0).round() / 10.0;
    if r == r.trunc() {
        format!("{}", r as i64)
    } else {
        format!("{r:.1}")
    }
}

const STYLE: &str = "\
.node rect,.node ellipse{fill:#fff;stroke:#4a5568;stroke-width:1.2}\
.node.start ellipse,.node.end ellipse{fill:#edf2f7}\
.node.failed ellipse{fill:#fff5f5;stroke:#c53030}\
.node.fail rect{stroke:#c53030}\
.node.succeed rect{stroke:#2f855a}\
.node.interrupt rect{fill:#fffaf0;stroke:#b7791f}\
.node.set rect{fill:#f7fafc;stroke-dasharray:4 2}\
.node.fork rect,.node.join rect{fill:#4a5568;stroke:none}\
.node.tool rect{fill:#e6fffa;stroke:#319795;stroke-dasharray:4 2}\
.node text,.group text{fill:#1a202c}\
.node text .id{font-weight:bold}\
.group rect{fill:none;stroke:#a0aec0;stroke-width:1;stroke-dasharray:5 3}\
.group.loop rect{stroke:#3182ce;stroke-dasharray:none;fill:#ebf8ff;fill-opacity:.35}\
.group.parallel rect{stroke:#805ad5;stroke-dasharray:none;fill:#faf5ff;fill-opacity:.35}\
.edge path{fill:none;stroke:#4a5568;stroke-width:1.2}\
.edge.failure path{stroke:#c53030;stroke-dasharray:6 3}\
.edge.calls path{stroke:#718096;stroke-dasharray:2 3}\
.edge.branch path{stroke:#805ad5}\
.edge.tool path{stroke:#319795;stroke-dasharray:4 3}\
.edge.tool .label text{fill:#2c7a7b}\
.edge .label rect{fill:#fff;fill-opacity:.9;stroke:none}\
.edge .label text{fill:#2d3748;font-size:11px}\
.edge.failure .label text{fill:#c53030}\
.node.ok rect{stroke:#2f855a;stroke-width:2.2;fill:#f0fff4}\
.node.step.failed rect,.node.tool.failed rect{stroke:#c53030;stroke-width:2.2;fill:#fff5f5}\
.node.interrupted rect,.node.running rect{stroke:#b7791f;stroke-width:2.2;fill:#fffff0}\
.node.unreached{opacity:.4}\
.edge.taken path{stroke:#2b6cb0;stroke-width:2.6}\
.edge.tool.taken path{stroke:#319795;stroke-width:2.2}";

/// The drawing as an SVG document.
pub fn svg(plan: &Plan, nested: bool) -> Result<String, String> {
    let l = layout(plan, nested)?;
    Ok(render(&l, None))
}

/// Writes a laid-out drawing as one SVG document; with `marks`, the top flow's steps carry
/// their state as a class (`ok`, `failed`, ..., `unreached`) and the routes taken `taken`.
pub fn render(l: &Layout, marks: Option<&Marks>) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" \
         font-family=\"ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', monospace\" font-size=\"12\">",
        w = num(l.width),
        h = num(l.height)
    );
    let _ = writeln!(o, "<title>flow {}</title>", xml_text(&l.title));
    let _ = writeln!(o, "<style>{STYLE}</style>");
    let _ = writeln!(
        o,
        "<defs>\
         <marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerUnits=\"userSpaceOnUse\" markerWidth=\"9\" markerHeight=\"9\" orient=\"auto-start-reverse\"><path d=\"M0,0L10,5L0,10z\" fill=\"#4a5568\"/></marker>\
         <marker id=\"arrow-failure\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerUnits=\"userSpaceOnUse\" markerWidth=\"9\" markerHeight=\"9\" orient=\"auto-start-reverse\"><path d=\"M0,0L10,5L0,10z\" fill=\"#c53030\"/></marker>\
         </defs>"
    );
    // Boxes first, the outer ones under the inner ones (a box holds what is drawn after it).
    let mut groups: Vec<&GroupBox> = l.groups.iter().collect();
    groups.sort_by(|a, b| (b.w * b.h).total_cmp(&(a.w * a.h)));
    for g in groups {
        let _ = write!(
            o,
            "<g class=\"group {}\" data-flow=\"{}\"",
            g.kind,
            xml_text(&g.flow)
        );
        if let Some(s) = &g.step {
            let _ = write!(o, " data-step=\"{}\"", xml_text(s));
        }
        let _ = writeln!(
            o,
            "><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"6\"/></g>",
            num(g.x),
            num(g.y),
            num(g.w),
            num(g.h)
        );
    }
    for e in &l.edges {
        let Some(((x0, y0), rest)) = e.points.split_first() else {
            continue;
        };
        let mut d = format!("M{},{}", num(*x0), num(*y0));
        for (x, y) in rest {
            let _ = write!(d, "L{},{}", num(*x), num(*y));
        }
        let marker = match e.kind {
            "failure" => " marker-end=\"url(#arrow-failure)\"",
            "branch" | "tool" => "",
            _ => " marker-end=\"url(#arrow)\"",
        };
        let taken = match (marks, &e.route, &e.tool) {
            (Some(m), Some(r), _) if m.routes.contains(r) => " taken",
            (Some(m), _, Some(t)) if m.tools.contains_key(t) => " taken",
            _ => "",
        };
        let _ = write!(o, "<g class=\"edge {}{taken}\"><path d=\"{d}\"{marker}/>", e.kind);
        if let Some(lb) = &e.label {
            let _ = write!(
                o,
                "<g class=\"label\"><title>{}</title><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>",
                xml_text(&lb.text),
                num(lb.x),
                num(lb.y),
                num(lb.w),
                num(lb.h)
            );
            text_lines(&mut o, lb, false);
            o.push_str("</g>");
        }
        o.push_str("</g>\n");
    }
    for n in &l.nodes {
        let class = match n.kind {
            NodeKind::Start => "start".to_string(),
            NodeKind::End => "end".to_string(),
            NodeKind::Failed => "failed".to_string(),
            NodeKind::Step(shape) => format!("step {shape}"),
            NodeKind::Branch => "branch".to_string(),
            NodeKind::Fork => "fork".to_string(),
            NodeKind::Join => "join".to_string(),
            NodeKind::Title => "title".to_string(),
            NodeKind::Tool => "tool".to_string(),
        };
        let state = match (marks, &n.step, &n.tool) {
            (Some(m), Some(step), None)
                if n.flow.is_empty() && matches!(n.kind, NodeKind::Step(_) | NodeKind::Branch) =>
            {
                format!(" {}", m.steps.get(step).copied().unwrap_or("unreached"))
            }
            // A tool the run called, by how its calls ended; one it never called, faded.
            (Some(m), Some(step), Some(tool)) if n.flow.is_empty() => {
                let state = m.tools.get(&(step.clone(), tool.clone()));
                format!(" {}", state.copied().unwrap_or("unreached"))
            }
            _ => String::new(),
        };
        let _ = write!(
            o,
            "<g class=\"node {class}{state}\" data-flow=\"{}\"",
            xml_text(&n.flow)
        );
        if let Some(s) = &n.step {
            let _ = write!(o, " data-step=\"{}\"", xml_text(s));
        }
        if let Some(t) = &n.tool {
            let _ = write!(o, " data-tool=\"{}\"", xml_text(t));
        }
        o.push('>');
        if !n.text.is_empty() {
            let _ = write!(o, "<title>{}</title>", xml_text(&n.text));
        }
        match n.kind {
            NodeKind::Start | NodeKind::End | NodeKind::Failed => {
                let _ = write!(
                    o,
                    "<ellipse cx=\"{}\" cy=\"{}\" rx=\"{}\" ry=\"{}\"/>",
                    num(n.x + n.w / 2.0),
                    num(n.y + n.h / 2.0),
                    num(n.w / 2.0),
                    num(n.h / 2.0)
                );
            }
            NodeKind::Title => {}
            _ => {
                let rx = match n.kind {
                    NodeKind::Step("fail") | NodeKind::Step("succeed") => 14.0,
                    NodeKind::Fork | NodeKind::Join => 3.0,
                    NodeKind::Tool => 10.0,
                    _ => 4.0,
                };
                let _ = write!(
                    o,
                    "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"{}\"/>",
                    num(n.x),
                    num(n.y),
                    num(n.w),
                    num(n.h),
                    num(rx)
                );
            }
        }
        let first_bold = matches!(n.kind, NodeKind::Step(_) | NodeKind::Branch | NodeKind::Tool);
        text_lines(&mut o, n, first_bold);
        o.push_str("</g>\n");
    }
    o.push_str("</svg>\n");
    o
}

/// A box's lines of text, centred in it.
fn text_lines(o: &mut String, n: &NodeBox, first_bold: bool) {
    if n.lines.iter().all(String::is_empty) {
        return;
    }
    let cx = n.x + n.w / 2.0;
    let top = n.y + (n.h - n.lines.len() as f64 * LINE_H) / 2.0;
    let _ = write!(o, "<text x=\"{}\" text-anchor=\"middle\">", num(cx));
    for (i, line) in n.lines.iter().enumerate() {
        let y = top + (i as f64 + 0.75) * LINE_H;
        let class = if i == 0 && first_bold { " class=\"id\"" } else { "" };
        let _ = write!(
            o,
            "<tspan x=\"{}\" y=\"{}\"{class}>{}</tspan>",
            num(cx),
            num(y),
            xml_text(line)
        );
    }
    o.push_str("</text>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_xml_and_controls_are_shown() {
        assert_eq!(
            xml_text("a < b && c > \"d\" 'e'"),
            "a &lt; b &amp;&amp; c &gt; &quot;d&quot; &#39;e&#39;"
        );
        assert_eq!(xml_text("x\u{1}y\u{7f}"), "x\u{2401}y\u{2421}");
        assert_eq!(xml_text("a\r\nb\rc\td"), "a\nb\u{240D}c\td");
        assert_eq!(xml_text("\u{FFFF}"), "\u{FFFD}");
    }

    #[test]
    fn long_lines_wrap_at_spaces_and_long_words_are_cut() {
        assert_eq!(wrap_text("a bb ccc", 4), vec!["a bb", "ccc"]);
        assert_eq!(wrap_text("abcdefghij", 4), vec!["abcd", "efgh", "ij"]);
        assert_eq!(wrap_text("one\ntwo", 10), vec!["one", "two"]);
        assert_eq!(wrap_text("", 10), vec![""]);
    }

    #[test]
    fn wide_characters_take_two_cells() {
        assert_eq!(text_width("ab"), 2.0 * CHAR_W);
        assert_eq!(text_width("日本"), 4.0 * CHAR_W);
    }
}
