//! Data rules: JSONPath syntax (SY401) and singular destinations (SY402), expression syntax
//! (SY403), variables in scope (SY404), field names against declared schemas (SY405), template
//! syntax (SY406), `steps.x` where `x` may not have run (SY407), calls of functions that do not
//! exist (SY410, SY411, in `unknown_function`), unknown `parallel` branches
//! (SY212) and agent results that nothing uses (SY502, warning).
//!
//! Scopes follow SPEC §5.1: `item`/`index` (or the `as` name) only inside `foreach`,
//! `iteration` only inside `while`, `result` only where a step has one. Agent definitions
//! (`result`, `returns`, `prompt`, `system`, `run`, `body`, `attach`) see `input` (the
//! agent's input document), `message` and `context`.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::HashSet;

use serde_json::Value;

use crate::diag::{Diagnostic, codes, did_you_mean};
use crate::expr::cache::ParseCache;
use crate::expr::functions;
use crate::expr::path;
use crate::expr::ty::{Field, Lookup, Obj, Ty};
use crate::expr::types::{self, Scope};
use crate::lint::FlowCx;
use crate::lint::flow_types::schema_value;
use crate::lint::rules::expression_types;
use crate::model::{
    Agent, AgentRef, AgentSpec, InputSpec, Next, OutputSpec, SchemaRef, Source, Sp, Step, StepKind,
};
use crate::source::Span;
use crate::syntax::{Node, Value as YValue, str_sub_span};

/// The places a `parallel` branch writes: the segments of each path, with its span. `None`
/// segments (a path that does not parse, or is not a plain chain) are not compared.
type WriteSet = Vec<(Option<Vec<path::Seg>>, Span)>;

/// What a JSONPath is for, which decides whether it must be singular.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// A source, `foreach`, `select`, a context path: may match many places.
    Read,
    /// A destination (a key of `input`/`output`/`set` maps, `scope`): one place.
    Destination,
    /// An entry of the list form of `input` (a downstream filter): one place.
    Filter,
    /// An entry of the list form of `output` (an upstream allowlist): one place.
    Allowlist,
}

/// The most names in scope at one place: the run's four, a loop's two, a `while`'s two,
/// `result` and `step`, with room to spare.
const MAX_VARS: usize = 16;

/// Which variables an expression or template may use at one place. Small and `Copy`: one is
/// made for every place checked, without allocating.
#[derive(Clone, Copy, Debug)]
struct Vars<'a> {
    names: [&'a str; MAX_VARS],
    len: usize,
    /// Where we are, for "which steps have run on every path to here" (`steps.x`).
    ran: Option<Ran>,
    /// The step whose `result` is `result` here, for field checks.
    result_of: Option<&'a str>,
    /// `input` is the run input (checked against `input.schema`), not an agent's document.
    input_is_run_input: bool,
    /// The name of the current `foreach` step's item, when in scope.
    item: Option<&'a str>,
    /// `result` may be `null` here: a failed step's (failure and `always` edges).
    result_null: bool,
}

impl<'a> Vars<'a> {
    fn new(names: &[&'a str]) -> Self {
        Vars {
            names: [""; MAX_VARS],
            len: 0,
            ran: None,
            result_of: None,
            input_is_run_input: false,
            item: None,
            result_null: false,
        }
        .with(names)
    }

    fn with(mut self, extra: &[&'a str]) -> Self {
        for name in extra {
            // The places checked need at most ten names; more would be a bug here, not a
            // problem of the flow, and is ignored rather than panicking.
            debug_assert!(self.len < MAX_VARS, "too many variables in scope");
            if self.len < MAX_VARS {
                self.names[self.len] = name;
                self.len += 1;
            }
        }
        self
    }

    fn names(&self) -> &[&'a str] {
        &self.names[..self.len]
    }
}

struct Checker<'a, 'p> {
    cx: &'a FlowCx<'p>,
    out: &'a mut Vec<Diagnostic>,
    /// Paths, expressions and templates by text, parsed once.
    parsed: &'a mut ParseCache,
    /// The dominator tree of the steps, built when a `steps.x` reference first needs it
    /// (`None` inside: the flow has no start step).
    dominators: Option<Option<Dominators>>,
    /// The index of the start step.
    start: Option<usize>,
    /// Step ids referenced through `steps.x` anywhere.
    referenced: HashSet<&'p str>,
    input_schema: Option<Value>,
    /// The static type of the run input, from `input.schema`.
    input_ty: Ty,
    /// The static type of each step's result, by step index, computed on first use.
    result_tys: Vec<OnceCell<Ty>>,
    /// The type of each step's record (`steps.<id>`), computed on first use.
    records: Vec<OnceCell<Ty>>,
    /// The static type of the item of the `foreach` step being checked.
    item_ty: Ty,
}

/// The error kinds of SPEC §9 (a `fail` step may name others).
pub(crate) const KINDS: &[&str] = &[
    "agent",
    "timeout",
    "rate_limited",
    "invalid_output",
    "mapping",
    "expression",
    "limit",
    "depth",
    "capability",
    "no_route",
    "in_doubt",
    "cancelled",
    "lost",
];

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>, parsed: &mut ParseCache) {
    let start = cx.start().and_then(|s| cx.flow.steps.get_index_of(s));
    let input_schema = cx
        .flow
        .input
        .as_ref()
        .and_then(|i| i.schema.as_ref())
        .and_then(|s| schema_value(cx, s));
    let input_ty = input_schema.as_ref().map_or(Ty::Any, Ty::from_schema);
    let mut c = Checker {
        cx,
        out,
        parsed,
        dominators: None,
        start,
        referenced: HashSet::new(),
        input_schema,
        input_ty,
        result_tys: (0..cx.flow.steps.len()).map(|_| OnceCell::new()).collect(),
        records: (0..cx.flow.steps.len()).map(|_| OnceCell::new()).collect(),
        item_ty: Ty::Any,
    };
    c.flow();
}

/// A place in the step graph: before step `step` runs, or (edges) after it finished.
#[derive(Clone, Copy, Debug)]
struct Ran {
    step: usize,
    include_self: bool,
}

/// The dominator tree of the step graph: step `x` has run on every path from `start` to `s`
/// exactly when `x` dominates `s`. Linear to build (petgraph's Cooper–Harvey–Kennedy), so a
/// 5,000-step flow costs no quadratic sets; a query walks the immediate-dominator chain.
struct Dominators {
    idom: Vec<Option<usize>>,
}

impl Dominators {
    fn build(cx: &FlowCx) -> Option<Dominators> {
        let start = cx.start()?;
        let steps = &cx.flow.steps;
        let mut g = petgraph::graph::DiGraph::<(), ()>::with_capacity(steps.len(), steps.len());
        for _ in 0..steps.len() {
            g.add_node(());
        }
        for (i, step) in steps.values().enumerate() {
            cx.for_each_successor(step, |j| {
                g.add_edge(
                    petgraph::graph::NodeIndex::new(i),
                    petgraph::graph::NodeIndex::new(j),
                    (),
                );
            });
        }
        let root = petgraph::graph::NodeIndex::new(steps.get_index_of(start)?);
        let doms = petgraph::algo::dominators::simple_fast(&g, root);
        let idom = (0..steps.len())
            .map(|i| {
                doms.immediate_dominator(petgraph::graph::NodeIndex::new(i))
                    .map(|n| n.index())
            })
            .collect();
        Some(Dominators { idom })
    }

    /// Whether step `x` (an index of the flow's steps) has finished on every path to the
    /// place `at`.
    fn has_run(&self, x: usize, at: Ran) -> bool {
        if at.include_self && x == at.step {
            return true;
        }
        let mut cur = self.idom[at.step];
        let mut guard = 0usize;
        while let Some(d) = cur {
            if d == x {
                return true;
            }
            cur = self.idom[d];
            guard += 1;
            if guard > self.idom.len() {
                break;
            }
        }
        false
    }

    /// Whether step `i` (an index of the flow's steps) is reachable from step `start`.
    fn reachable(&self, i: usize, start: usize) -> bool {
        self.idom.get(i).is_some_and(Option::is_some) || start == i
    }
}

const RUN_VARS: &[&str] = &["payload", "input", "context", "steps", "now"];
const AGENT_VARS: &[&str] = &["input", "message", "context", "now"];

impl<'p> Checker<'_, 'p> {
    fn flow(&mut self) {
        let cx = self.cx;
        let flow = cx.flow;
        if let Some(sel) = flow.output.as_ref().and_then(|o| o.select.as_ref()) {
            self.path(sel, Role::Read);
        }
        for schema in [
            flow.input.as_ref().and_then(|i| i.schema.as_ref()),
            flow.output.as_ref().and_then(|o| o.schema.as_ref()),
        ]
        .into_iter()
        .flatten()
        {
            self.schema(schema);
        }
        for a in flow.agents.values() {
            self.agent(a);
        }
        for (i, step) in flow.steps.values().enumerate() {
            self.step(i, step);
        }
        // Unused results, once every reference is known.
        for step in flow.steps.values() {
            self.unused_result(step);
        }
    }

    /// The place before step `index` runs, when the flow has a start step. Whether the step
    /// is reachable (and so whether `steps.x` is checked there) is decided when a reference
    /// needs it.
    fn ran_before(&self, index: usize) -> Option<Ran> {
        self.start?;
        Some(Ran {
            step: index,
            include_self: false,
        })
    }

    /// The dominator tree, built on first use.
    fn dominators(&mut self) -> Option<&Dominators> {
        let cx = self.cx;
        self.dominators
            .get_or_insert_with(|| Dominators::build(cx))
            .as_ref()
    }

    fn step(&mut self, index: usize, step: &'p Step) {
        let mut base = Vars::new(RUN_VARS);
        base.ran = self.ran_before(index);
        base.input_is_run_input = true;
        let l = &step.looping;
        let mut inner = base;
        if let Some(f) = &l.foreach {
            self.item_ty = match f.value.strip_prefix('=') {
                Some(e) => self
                    .expr(f.span, &f.value, e, 1, &base)
                    .map_or(Ty::Any, |t| types::element_of(&t)),
                None => {
                    self.path(f, Role::Read);
                    Ty::Any
                }
            };
            let name = l.as_name.as_ref().map_or("item", |a| a.value.as_str());
            if let Some(a) = &l.as_name
                && (!crate::model::build::is_ident(&a.value) || RUN_VARS.contains(&a.value.as_str()))
            {
                self.out.push(
                    Diagnostic::new(
                        &codes::INVALID_IDENTIFIER,
                        a.span,
                        format!("invalid loop variable `{}`", a.value),
                    )
                    .help("`as` names the item in expressions: `[a-z][a-z0-9_]*`, not a built-in variable"),
                );
            }
            inner = inner.with(&[name, "index"]);
            inner.item = Some(name);
            if let Some(s) = &l.select {
                self.path(s, Role::Read);
            }
        }
        if let Some(w) = &l.while_ {
            let mut vars = base.with(&["iteration", "result"]);
            vars.result_of = Some(&step.id.value);
            match w.value.strip_prefix('=') {
                Some(e) => {
                    if let Some(t) = self.expr(w.span, &w.value, e, 1, &vars) {
                        let at = inner_span(w.span, &w.value, self.cx.text, 1, 0, e.len());
                        expression_types::condition("while", &t, at, self.out);
                    }
                }
                None => self.out.push(
                    Diagnostic::new(
                        &codes::EXPRESSION_SYNTAX,
                        w.span,
                        "`while` takes an expression starting with `=`",
                    )
                    .help(format!("write `while: ={}`", w.value)),
                ),
            }
            inner = inner.with(&["iteration", "result"]);
            inner.result_of = Some(&step.id.value);
        }
        if let Some(s) = &step.scope {
            self.path(s, Role::Destination);
        }
        if let Some(m) = &step.message {
            self.template(m, &inner);
        }
        match &step.kind {
            StepKind::Agent(r) => {
                self.input(step.input.as_ref(), &inner);
                let mut out_vars = inner.with(&["result"]);
                out_vars.result_of = Some(&step.id.value);
                self.output(step.output.as_ref(), &out_vars);
                if let AgentRef::Inline(a) = r {
                    self.agent(a);
                }
            }
            StepKind::Set(m) => {
                for (dest, src) in &m.0 {
                    self.path(dest, Role::Destination);
                    self.source(src, &inner);
                }
            }
            StepKind::Parallel(branches) => {
                for b in branches.values() {
                    if let Some(s) = &b.scope {
                        self.path(s, Role::Destination);
                    }
                    if let Some(m) = &b.message {
                        self.template(m, &inner);
                    }
                    self.input(b.input.as_ref(), &inner);
                    self.output(b.output.as_ref(), &inner.with(&["result"]));
                    if let AgentRef::Inline(a) = &b.agent {
                        self.agent(a);
                    }
                }
                self.parallel_conflicts(step, branches);
            }
            StepKind::Interrupt(i) => {
                self.input(step.input.as_ref(), &inner);
                self.output(step.output.as_ref(), &inner.with(&["result"]));
                let mut vars = inner;
                vars.input_is_run_input = false;
                if let Some(p) = &i.prompt {
                    self.template(p, &vars);
                }
                if let Some(s) = &i.schema {
                    self.schema(s);
                }
            }
            StepKind::Fail(f) => {
                if let Some(m) = &f.message {
                    self.template(m, &inner);
                }
            }
            StepKind::Succeed(_) => {}
        }
        // Edges: the step has finished, so it counts as run; `result` where there is one.
        let mut edge_vars = base.with(&["step"]);
        if let Some(ran) = &mut edge_vars.ran {
            ran.include_self = true;
        }
        if matches!(
            step.kind,
            StepKind::Agent(_) | StepKind::Parallel(_) | StepKind::Interrupt(_)
        ) {
            edge_vars = edge_vars.with(&["result"]);
            edge_vars.result_of = Some(&step.id.value);
        }
        if let Some(Next::Edges(edges)) = &step.next {
            for e in edges {
                let mut edge_vars = edge_vars;
                edge_vars.result_null = e.errors.is_some()
                    || e.on
                        .as_ref()
                        .is_some_and(|o| o.value != crate::model::EdgeOn::Success);
                if let Some(c) = &e.if_ {
                    let text = c.value.strip_prefix('=').unwrap_or(&c.value);
                    let offset = c.value.len() - text.len();
                    if let Some(t) = self.expr(c.span, &c.value, text, offset, &edge_vars) {
                        let at = inner_span(c.span, &c.value, self.cx.text, offset, 0, text.len());
                        expression_types::condition("if", &t, at, self.out);
                    }
                }
                for k in e.errors.iter().flatten() {
                    self.error_kind(k);
                }
            }
        }
        if let Some(r) = &step.retry {
            for k in r.on.iter().flatten() {
                self.error_kind(k);
            }
        }
    }

    fn error_kind(&mut self, k: &Sp<String>) {
        if KINDS.contains(&k.value.as_str()) {
            return;
        }
        // Kinds named by `fail` steps anywhere in the flow are valid too.
        let custom = self.cx.flow.steps.values().any(
            |s| matches!(&s.kind, StepKind::Fail(f) if f.kind.as_ref().is_some_and(|fk| fk.value == k.value)),
        );
        if custom {
            return;
        }
        if let Some(d) = did_you_mean(&k.value, KINDS.iter().copied()) {
            self.out.push(
                Diagnostic::new(
                    &codes::INVALID_VALUE,
                    k.span,
                    format!("unknown error kind `{}`", k.value),
                )
                .label("no such error kind")
                .help(format!("{d} error kinds are: {}", KINDS.join(", "))),
            );
        }
    }

    fn agent(&mut self, a: &Agent) {
        let vars = Vars::new(AGENT_VARS);
        for s in [&a.common.input_schema, &a.common.result_schema]
            .into_iter()
            .flatten()
        {
            self.schema(s);
        }
        match &a.spec {
            AgentSpec::Llm(l) => {
                for t in [&l.system, &l.prompt].into_iter().flatten() {
                    self.template(t, &vars);
                }
                for p in &l.context_paths {
                    self.path(p, Role::Read);
                }
                if let Some(t) = &l.attach {
                    self.value_template(&t.0, &vars);
                }
            }
            AgentSpec::Command(c) => {
                for arg in &c.run {
                    self.template(arg, &vars);
                }
            }
            AgentSpec::Transform(t) => self.value_template(&t.result.0, &vars),
            AgentSpec::Mock(m) => {
                for v in m.returns.iter().chain(m.sequence.iter().flatten()) {
                    self.value_template(&v.0, &vars);
                }
            }
            AgentSpec::Http(h) => {
                if let Some(t) = &h.body {
                    self.value_template(&t.0, &vars);
                }
            }
            AgentSpec::Flow(_) | AgentSpec::Native(_) | AgentSpec::Mcp(_) => {}
        }
    }

    fn value_template(&mut self, node: &Node, vars: &Vars) {
        match &node.value {
            YValue::Str(s) if s.starts_with('=') && !s.starts_with("==") => {
                self.expr(node.span, s, &s[1..], 1, vars);
            }
            YValue::Seq(items) => items.iter().for_each(|n| self.value_template(n, vars)),
            YValue::Map(entries) => entries.iter().for_each(|(_, n)| self.value_template(n, vars)),
            _ => {}
        }
    }

    fn input(&mut self, spec: Option<&InputSpec>, vars: &Vars) {
        match spec {
            Some(InputSpec::Paths(p)) => p.iter().for_each(|p| self.path(p, Role::Filter)),
            Some(InputSpec::Map(m)) => {
                for (dest, src) in &m.0 {
                    self.path(dest, Role::Destination);
                    self.source(src, vars);
                }
            }
            _ => {}
        }
    }

    fn output(&mut self, spec: Option<&OutputSpec>, vars: &Vars) {
        match spec {
            Some(OutputSpec::Paths(p)) => p.iter().for_each(|p| self.path(p, Role::Allowlist)),
            Some(OutputSpec::Map(m)) => {
                for (dest, src) in &m.0 {
                    self.path(dest, Role::Destination);
                    self.source(src, vars);
                }
            }
            _ => {}
        }
    }

    fn source(&mut self, src: &Source, vars: &Vars) {
        match src {
            Source::Text(t) => self.source_text(t, vars),
            Source::WithDefault { path, .. } => self.path(path, Role::Read),
            Source::Literal { .. } => {}
        }
    }

    fn source_text(&mut self, t: &Sp<String>, vars: &Vars) {
        match t.value.strip_prefix('=') {
            Some(e) => {
                self.expr(t.span, &t.value, e, 1, vars);
            }
            None => self.path(t, Role::Read),
        }
    }

    /// Parses a JSONPath; every role but [`Role::Read`] needs a singular path.
    fn path(&mut self, p: &Sp<String>, role: Role) {
        match self.parsed.path(&p.value) {
            Ok(parsed) => {
                let help = match role {
                    Role::Read => return,
                    _ if parsed.is_singular() => return,
                    Role::Destination => "destinations name one place",
                    Role::Filter => {
                        "a filter path names one place (the `input` list keeps exactly the places it names)"
                    }
                    Role::Allowlist => {
                        "an allowlist path names one place (the `output` list lets exactly the places it names come back)"
                    }
                };
                let mut help = format!(
                    "{help}: `$.a.b`, `$.a[2]`, `$['odd key']`; no wildcards, slices, filters or `..`"
                );
                if role != Role::Destination {
                    help.push_str("; to take several values, map them: `{$.dest: $.items[*]}`");
                }
                self.out.push(
                    Diagnostic::new(
                        &codes::NON_SINGULAR_DESTINATION,
                        p.span,
                        format!("`{}` can match more than one place", p.value),
                    )
                    .label("not a singular path")
                    .help(help),
                );
            }
            Err(e) => {
                let span = inner_span(p.span, &p.value, self.cx.text, 0, e.start, e.end);
                self.out.push(
                    Diagnostic::new(
                        &codes::JSONPATH_SYNTAX,
                        span,
                        format!("invalid JSONPath `{}`: {}", p.value, e.message),
                    )
                    .label(e.message.clone())
                    .help("paths are RFC 9535 JSONPath: `$.ticket.body`, `$.items[0]`, `$['odd key']`"),
                );
            }
        }
    }

    /// The span of the last of `words` in the source text under `span`, each found as a whole
    /// word after the one before it: for `steps.x.result.b` and `["steps", "x", "result", "b"]`,
    /// the `b`. `None` when they are not all there (a scalar whose text is not its value).
    fn word_span(&self, span: Span, words: &[&str]) -> Option<Span> {
        let text = self.cx.text.get(span.start as usize..span.end as usize)?;
        let ident = |c: char| c.is_alphanumeric() || c == '_';
        let mut from = 0;
        let mut found = None;
        for w in words {
            let at = text[from..].match_indices(w).map(|(i, _)| from + i).find(|&i| {
                !text[..i].chars().next_back().is_some_and(ident)
                    && !text[i + w.len()..].chars().next().is_some_and(ident)
            })?;
            found = Some((at, at + w.len()));
            from = at + w.len();
        }
        found.map(|(start, end)| span.sub(start, end))
    }

    /// Checks the expression `text`, which is `value` (the YAML string at `span`) from byte
    /// `offset` on: its syntax, each variable it reads, then its types. Returns its static
    /// type when it parses.
    fn expr(&mut self, span: Span, value: &str, text: &str, offset: usize, vars: &Vars) -> Option<Ty> {
        let parsed = self.parsed.expr(text);
        if let Err(e) = &parsed.expr {
            let span = inner_span(span, value, self.cx.text, offset, e.start, e.end);
            self.out.push(
                Diagnostic::new(
                    &codes::EXPRESSION_SYNTAX,
                    span,
                    format!("invalid expression: {}", e.message),
                )
                .label(e.message.clone())
                .help("expressions are CEL: `payload.score >= 50`, `size(payload.rows) == 0`"),
            );
            return None;
        }
        for r in &parsed.refs {
            let span = inner_span(span, value, self.cx.text, offset, r.start, r.end);
            // `int`, `string`, `google.protobuf.Timestamp`, ... are CEL's types, values of
            // their own (`type(x) == int`).
            if functions::is_type_name(&r.root, &r.fields) && !vars.names().contains(&r.root.as_str()) {
                continue;
            }
            self.reference(&r.root, &r.fields, span, vars, "expression");
        }
        let text = self.cx.text;
        super::unknown_function::check(&parsed.calls, self.out, |start, end| {
            inner_span(span, value, text, offset, start, end)
        });
        let e = parsed.expr.as_ref().ok()?;
        let mut found = Vec::new();
        let scope = TypeScope { c: self, vars };
        let source = self.cx.text;
        let ty = expression_types::check(
            e,
            &scope,
            &|start, end| inner_span(span, value, source, offset, start, end),
            &mut found,
        );
        self.out.extend(found);
        Some(ty)
    }

    fn template(&mut self, t: &Sp<String>, vars: &Vars) {
        let checked = self.parsed.template_check(&t.value);
        match &*checked {
            Ok(info) => {
                for v in &info.vars {
                    let span = inner_span(t.span, &t.value, self.cx.text, 0, v.start, v.end);
                    self.reference(&v.root, &v.fields, span, vars, "template");
                }
            }
            Err(e) => {
                let span = inner_span(t.span, &t.value, self.cx.text, 0, e.start, e.end);
                self.out.push(
                    Diagnostic::new(
                        &codes::TEMPLATE_SYNTAX,
                        span,
                        format!("invalid template: {}", e.message),
                    )
                    .label(e.message.clone())
                    .help("templates are Jinja: `{{ input.ticket.id }}`"),
                );
            }
        }
    }

    /// Checks one variable use: in scope, `steps.x` known and run, fields in schemas.
    fn reference(&mut self, root: &str, fields: &[String], span: Span, vars: &Vars, what: &str) {
        if !vars.names().contains(&root) {
            let mut all: Vec<&str> = vars.names().to_vec();
            all.sort_unstable();
            let why = match root {
                "item" | "index" => " (only inside `foreach`)".to_string(),
                "iteration" => " (only inside `while`)".to_string(),
                "result" => " (only where the step has a result: its edges and `output`)".to_string(),
                "payload" | "steps" => {
                    " (agent definitions see only `input`, `message`, `context` and `now`)".to_string()
                }
                _ => String::new(),
            };
            let mut help = format!(
                "variables here: {}",
                all.iter()
                    .map(|v| format!("`{v}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if let Some(d) = did_you_mean(root, all.iter().copied()) {
                help = format!("{d} {help}");
            }
            self.out.push(
                Diagnostic::new(
                    &codes::UNKNOWN_VARIABLE,
                    span,
                    format!("unknown variable `{root}` in {what}{why}"),
                )
                .label("not in scope here")
                .help(help),
            );
            return;
        }
        match root {
            "steps" => self.steps_reference(fields, span, vars),
            "input" if vars.input_is_run_input => {
                if let Some(schema) = &self.input_schema {
                    check_fields(self.out, schema, fields, span, "input", "`input.schema`");
                }
            }
            "result" => {
                if let Some(step) = vars.result_of {
                    if let Some(schema) = self.result_schema(step) {
                        check_fields(
                            self.out,
                            &schema,
                            fields,
                            span,
                            "result",
                            &self.result_schema_source(step),
                        );
                    } else if let Some((ty, source)) = self.composite_result(step) {
                        check_ty_fields(self.out, &ty, fields, span, "result", &source);
                    } else if let Some(f) = fields.first() {
                        self.foreach_result_field(step, f, span, "result");
                    }
                }
            }
            _ => {}
        }
    }

    fn steps_reference(&mut self, fields: &[String], span: Span, vars: &Vars) {
        let Some(id) = fields.first() else { return };
        let steps = &self.cx.flow.steps;
        let Some((target_index, target_id, target)) = steps.get_full(id) else {
            let mut d = Diagnostic::new(
                &codes::UNKNOWN_STEP,
                span,
                format!("unknown step `{id}` in `steps.{id}`"),
            )
            .label("no such step");
            if let Some(h) = did_you_mean(id, steps.keys().map(String::as_str)) {
                d = d.help(h);
            }
            self.out.push(d);
            return;
        };
        self.referenced.insert(target_id);
        let start = self.start;
        if let Some(ran) = vars.ran
            && let Some(start) = start
            && let Some(doms) = self.dominators()
            && doms.reachable(ran.step, start)
            && !doms.has_run(target_index, ran)
        {
            self.out.push(
                Diagnostic::new(&codes::STEP_MAY_NOT_HAVE_RUN, span, format!("`steps.{id}` is read where `{id}` has not run on every path"))
                    .label(format!("`{id}` may not have run here"))
                    .with_secondary(target.id.span, "the step")
                    .help(format!("read it only after `{id}` on every path, or copy what you need into the payload with `output:`")),
            );
        }
        const STEP_FIELDS: &[&str] = &[
            "result",
            "status",
            "error",
            "attempts",
            "duration_ms",
            "failed",
            "iterations",
        ];
        if let Some(f) = fields.get(1) {
            if !STEP_FIELDS.contains(&f.as_str()) {
                let mut d = Diagnostic::new(
                    &codes::UNKNOWN_FIELD,
                    span,
                    format!("`steps.{id}` has no field `{f}`"),
                )
                .label("unknown field");
                d = d.help(match did_you_mean(f, STEP_FIELDS.iter().copied()) {
                    Some(h) => format!("{h} step records have {}", STEP_FIELDS.join(", ")),
                    None => format!("step records have {}", STEP_FIELDS.join(", ")),
                });
                self.out.push(d);
                return;
            }
            if f == "result" {
                if let StepKind::Parallel(branches) = &target.kind
                    && let Some(b) = fields.get(2)
                    && !branches.contains_key(b)
                {
                    let at = self.word_span(span, &["steps", id, "result", b]).unwrap_or(span);
                    let mut d =
                        Diagnostic::new(&codes::UNKNOWN_BRANCH, at, format!("`{id}` has no branch `{b}`"))
                            .label("no such branch");
                    d = d.help(match did_you_mean(b, branches.keys().map(String::as_str)) {
                        Some(h) => h,
                        None => format!(
                            "branches are: {}",
                            branches
                                .keys()
                                .map(|k| format!("`{k}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    });
                    self.out.push(d);
                } else if let Some(schema) = self.result_schema(id) {
                    check_fields(
                        self.out,
                        &schema,
                        &fields[2..],
                        span,
                        &format!("steps.{id}.result"),
                        &self.result_schema_source(id),
                    );
                } else if let Some((ty, source)) = self.composite_result(id) {
                    check_ty_fields(
                        self.out,
                        &ty,
                        &fields[2..],
                        span,
                        &format!("steps.{id}.result"),
                        &source,
                    );
                } else if let Some(f) = fields.get(2) {
                    self.foreach_result_field(id, f, span, &format!("steps.{id}.result"));
                }
            }
        }
    }

    /// The result schema of the agent a step calls, where it is the step's result: not for
    /// `foreach` steps, whose result is the list of their iterations' results. (A `while`
    /// step's result is its last iteration's.)
    fn result_schema(&self, step: &str) -> Option<Value> {
        let s = self.cx.flow.steps.get(step)?;
        if s.looping.foreach.is_some() {
            return None;
        }
        self.agent_result_schema(s)
    }

    /// The result type of a step whose result is not one agent's: a `parallel` step's
    /// `{branch: result}` and an `interrupt`'s decision, with what it is typed by (for messages).
    fn composite_result(&self, step: &str) -> Option<(Ty, String)> {
        let s = self.cx.flow.steps.get(step)?;
        let source = match &s.kind {
            StepKind::Parallel(_) => format!("the results of `{step}`'s branches"),
            StepKind::Interrupt(_) => format!("the decision `schema` of `{step}`"),
            _ => return None,
        };
        Some((self.result_ty(step).clone(), source))
    }

    /// What [`Self::result_schema`] of `step` is, for messages: its agent's `result_schema`, or
    /// that of the `until_tool` whose result is the answer of an agent loop.
    fn result_schema_source(&self, step: &str) -> String {
        let own = format!("the `result_schema` of `{step}`'s agent");
        let Some(StepKind::Agent(r)) = self.cx.flow.steps.get(step).map(|s| &s.kind) else {
            return own;
        };
        match self
            .cx
            .agent(r)
            .and_then(|a| Some((a, self.cx.result_schema_owner(a)?)))
        {
            Some((a, owner)) if !std::ptr::eq(a, owner) => format!(
                "the `result_schema` of `{}`, whose result is the answer of `{step}`'s agent",
                owner.name.value
            ),
            _ => own,
        }
    }

    fn agent_result_schema(&self, s: &Step) -> Option<Value> {
        let StepKind::Agent(r) = &s.kind else { return None };
        let agent = self.cx.agent(r)?;
        schema_value(self.cx, self.cx.result_schema(agent)?)
    }

    /// Reports field `f` read from the result of step `id` when that is a `foreach` step: its
    /// result is a list. `base` is how the result was named (`result`, `steps.x.result`).
    fn foreach_result_field(&mut self, id: &str, f: &str, span: Span, base: &str) {
        let Some(s) = self.cx.flow.steps.get(id) else {
            return;
        };
        if s.looping.foreach.is_none() || !matches!(s.kind, StepKind::Agent(_)) || self.cx.is_malformed(s) {
            return;
        }
        self.out.push(
            Diagnostic::new(
                &codes::UNKNOWN_FIELD,
                span,
                format!(
                    "`{base}` is a list (one result per item of `{id}`'s `foreach`): it has no field `{f}`"
                ),
            )
            .label("a list")
            .help(format!(
                "take one item's result (`{base}[0].{f}`) or map them all (`{base}.map(r, r.{f})`)"
            )),
        );
    }

    /// The static type of step `id`'s result (SPEC §3): the agent's `result_schema`; for
    /// `parallel`, an object of the branches' results; for `interrupt`, the decision its
    /// `schema` describes; for `foreach`, the list of the iterations' results (after `select`; `null` for failed
    /// iterations where `tolerate` lets some fail); for `while`, the last iteration's result or
    /// `null`. Computed once per step.
    fn result_ty(&self, id: &str) -> &Ty {
        match self.cx.flow.steps.get_full(id) {
            Some((i, _, s)) => self.result_tys[i].get_or_init(|| self.compute_result_ty(s)),
            None => &Ty::Any,
        }
    }

    fn compute_result_ty(&self, s: &Step) -> Ty {
        let schema_ty = |sc: Option<&SchemaRef>| {
            sc.and_then(|sc| schema_value(self.cx, sc))
                .map_or(Ty::Any, |v| Ty::from_schema(&v))
        };
        match &s.kind {
            // `{branch: result}`, a failed branch's `null`.
            StepKind::Parallel(branches) => {
                let fields = branches
                    .iter()
                    .map(|(name, b)| {
                        let ty = schema_ty(self.cx.agent(&b.agent).and_then(|a| self.cx.result_schema(a)));
                        (
                            name.clone(),
                            Field {
                                ty: ty.join(&Ty::Null),
                                always: true,
                            },
                        )
                    })
                    .collect();
                return Ty::Object(Obj { fields, open: false });
            }
            // The decision, checked against the step's `schema`.
            StepKind::Interrupt(i) => return schema_ty(i.schema.as_ref()),
            _ => {}
        }
        let one = self
            .agent_result_schema(s)
            .map_or(Ty::Any, |v| Ty::from_schema(&v));
        let l = &s.looping;
        if l.foreach.is_some() {
            let mut elem = match &l.select {
                Some(sel) => select_ty(&one, &sel.value),
                None => one,
            };
            let may_fail = l.tolerate.as_ref().is_some_and(|t| match t.value {
                crate::model::Tolerate::Count(n) => n > 0,
                crate::model::Tolerate::Percent(p) => p > 0.0,
            });
            if may_fail {
                elem = elem.join(&Ty::Null);
            }
            Ty::List(Box::new(elem))
        } else if l.while_.is_some() {
            one.join(&Ty::Null)
        } else {
            one
        }
    }

    /// The static type of variable `name` where `vars` are in scope (SPEC §5.1): the run
    /// input from `input.schema`, results from `result_schema`s, a `foreach` item from what its
    /// collection is known to hold. The payload is not typed here (unknown).
    fn var_type(&self, vars: &Vars, name: &str) -> Cow<'_, Ty> {
        if !vars.names().contains(&name) {
            return Cow::Owned(Ty::Any);
        }
        Cow::Owned(match name {
            "input" if vars.input_is_run_input => return Cow::Borrowed(&self.input_ty),
            "result" => match vars.result_of {
                Some(s) if vars.result_null => self.result_ty(s).join(&Ty::Null),
                Some(s) => return Cow::Borrowed(self.result_ty(s)),
                None => Ty::Any,
            },
            _ if vars.item == Some(name) => return Cow::Borrowed(&self.item_ty),
            "index" | "iteration" => Ty::Int,
            "step" => step_record(None),
            // `payload` (its shape changes along the graph), `context`, `message`.
            _ => Ty::Any,
        })
    }

    /// The type of `name.field` where it is given field by field: `steps.<id>`.
    fn member_type(&self, vars: &Vars, name: &str, field: &str) -> Option<Cow<'_, Ty>> {
        if name != "steps" || !vars.names().contains(&"steps") {
            return None;
        }
        let i = self.cx.flow.steps.get_index_of(field)?;
        // A step that failed (and was routed on) has a `null` result.
        Some(Cow::Borrowed(self.records[i].get_or_init(|| {
            step_record(Some(self.result_ty(field).join(&Ty::Null)))
        })))
    }

    fn schema(&mut self, s: &SchemaRef) {
        let (value, span) = match s {
            SchemaRef::Inline(n) => (n.0.to_json(), n.0.span),
            SchemaRef::Path(p) => match self
                .cx
                .project
                .schema_for(self.cx.id, &p.value)
                .and_then(|l| l.node.as_ref())
            {
                Some(n) => (n.to_json(), p.span),
                None => return,
            },
        };
        if let Err(e) = jsonschema::meta::validate(&value) {
            self.out.push(
                Diagnostic::new(&codes::INVALID_SCHEMA, span, format!("invalid JSON Schema: {e}"))
                    .label("not a valid schema")
                    .help("schemas follow JSON Schema (draft 2020-12 unless `$schema` says otherwise)"),
            );
        } else if let Err(e) = crate::plan::Schema::new(value) {
            // Valid in form, yet not one a run can build: a `$ref` to a resource it does not
            // hold (nothing is ever fetched).
            self.out.push(
                Diagnostic::new(&codes::INVALID_SCHEMA, span, format!("invalid JSON Schema: {e}"))
                    .label("not a valid schema")
                    .help(
                        "a `$ref` may point only inside its schema (`#/$defs/NAME`): nothing is fetched; \
                         give a schema file as the field's value (`schema: schemas/in.json`) instead",
                    ),
            );
        }
    }

    fn parallel_conflicts(
        &mut self,
        step: &Step,
        branches: &indexmap::IndexMap<String, crate::model::Branch>,
    ) {
        // Each branch's write set.
        let mut writes: Vec<(&str, WriteSet)> = Vec::new();
        for (name, b) in branches {
            let scope = b
                .scope
                .as_ref()
                .and_then(|s| path::parse(&s.value).ok())
                .and_then(|p| p.segments().map(<[_]>::to_vec));
            let prefix = |segs: Option<Vec<path::Seg>>| -> Option<Vec<path::Seg>> {
                let segs = segs?;
                Some(match &scope {
                    Some(s) => s.iter().cloned().chain(segs).collect(),
                    None => segs,
                })
            };
            let mut w = Vec::new();
            match &b.output {
                None => {}
                Some(OutputSpec::All(span)) => w.push((prefix(Some(Vec::new())), *span)),
                Some(OutputSpec::Paths(ps)) => {
                    for p in ps {
                        w.push((
                            prefix(
                                path::parse(&p.value)
                                    .ok()
                                    .and_then(|x| x.segments().map(<[_]>::to_vec)),
                            ),
                            p.span,
                        ));
                    }
                }
                Some(OutputSpec::Map(m)) => {
                    for (d, _) in &m.0 {
                        w.push((
                            prefix(
                                path::parse(&d.value)
                                    .ok()
                                    .and_then(|x| x.segments().map(<[_]>::to_vec)),
                            ),
                            d.span,
                        ));
                    }
                }
            }
            writes.push((name, w));
        }
        for i in 0..writes.len() {
            for j in i + 1..writes.len() {
                for (a, a_span) in &writes[i].1 {
                    for (b, b_span) in &writes[j].1 {
                        let overlap = match (a, b) {
                            (Some(a), Some(b)) => path::write_paths_overlap(a, b),
                            _ => false,
                        };
                        if overlap {
                            self.out.push(
                                Diagnostic::new(
                                    &codes::PARALLEL_OUTPUT_CONFLICT,
                                    *b_span,
                                    format!("branches `{}` and `{}` of `{}` can write the same path", writes[i].0, writes[j].0, step.id.value),
                                )
                                .label(format!("written by `{}`", writes[j].0))
                                .with_secondary(*a_span, format!("also written by `{}`", writes[i].0))
                                .help("give each branch its own destination; outputs are merged in written order, so overlaps hide results"),
                            );
                        }
                    }
                }
            }
        }
    }

    fn unused_result(&mut self, step: &Step) {
        let StepKind::Agent(r) = &step.kind else { return };
        // An agent that does not resolve is reported as unknown (SY202), a malformed step by
        // its own problem; whether its result is used is moot until then.
        if self.cx.is_malformed(step) || self.cx.agent(r).is_none() {
            return;
        }
        if step.output.is_some() || self.referenced.contains(step.id.value.as_str()) {
            return;
        }
        let uses_result = match &step.next {
            Some(Next::Edges(edges)) => edges
                .iter()
                .any(|e| e.if_.as_ref().is_some_and(|c| mentions(&c.value, "result"))),
            _ => false,
        } || step
            .looping
            .while_
            .as_ref()
            .is_some_and(|w| mentions(&w.value, "result"));
        if uses_result {
            return;
        }
        self.out.push(
            Diagnostic::new(&codes::UNUSED_RESULT, step.id.span, format!("the result of step `{}` is never used", step.id.value))
                .label("result neither mapped nor referenced")
                .help("map it into the payload with `output:`, read it as `steps.<id>.result`, or write `output: {}` when the call is for its effect only"),
        );
    }
}

/// The variable types of one place, for [`expression_types::check`].
struct TypeScope<'s, 'a, 'p, 'v> {
    c: &'s Checker<'a, 'p>,
    vars: &'s Vars<'v>,
}

impl Scope for TypeScope<'_, '_, '_, '_> {
    fn var(&self, name: &str) -> Cow<'_, Ty> {
        self.c.var_type(self.vars, name)
    }

    fn member(&self, name: &str, field: &str) -> Option<Cow<'_, Ty>> {
        self.c.member_type(self.vars, name, field)
    }

    /// [`Checker::reference`] checks the fields of these against their schemas.
    fn chains_checked(&self, name: &str) -> bool {
        matches!(name, "input" | "result" | "steps")
    }
}

/// A step record (`step`, or `steps.<id>` with its `result`), SPEC §5.1.
fn step_record(result: Option<Ty>) -> Ty {
    let field = |ty: Ty| Field { ty, always: true };
    let mut fields: indexmap::IndexMap<String, Field> = [
        ("status", Ty::String),
        ("error", Ty::Any),
        ("attempts", Ty::Int),
        ("duration_ms", Ty::Int),
        ("failed", Ty::Any),
        ("iterations", Ty::Any),
    ]
    .into_iter()
    .map(|(k, t)| (k.to_owned(), field(t)))
    .collect();
    match result {
        Some(r) => {
            fields.insert("result".into(), field(r));
        }
        None => {
            fields.insert("id".into(), field(Ty::String));
        }
    }
    Ty::Object(Obj { fields, open: false })
}

/// The type of what a `select` path picks from a value of type `of`: the value at a singular
/// path, the list of matches of any other.
fn select_ty(of: &Ty, text: &str) -> Ty {
    let Ok(p) = path::parse(text) else { return Ty::Any };
    let Some(segs) = p.segments() else {
        // A query: the list of what it selects, typed where lint follows the whole query.
        let (segs, complete) = crate::lint::flow_types::query_prefix(text);
        return Ty::List(Box::new(match crate::lint::flow_types::type_at(of, &segs) {
            crate::lint::flow_types::At::Found(t, _) if complete => t,
            _ => Ty::Any,
        }));
    };
    let mut cur = of.clone();
    for seg in segs {
        cur = match seg {
            path::Seg::Key(k) => match cur.field(k) {
                Lookup::Field { ty, .. } => ty,
                _ => Ty::Any,
            },
            path::Seg::Index(_) => cur.element(),
        };
    }
    cur
}

/// Walks `fields` through `properties`; reports the first that the schema does not declare
/// (only where the schema lists properties and does not allow others).
fn check_fields(
    out: &mut Vec<Diagnostic>,
    schema: &Value,
    fields: &[String],
    span: Span,
    base: &str,
    source: &str,
) {
    let mut cur = schema;
    let mut path = base.to_string();
    for f in fields {
        let Some(props) = cur.get("properties").and_then(Value::as_object) else {
            return;
        };
        if cur
            .get("additionalProperties")
            .is_some_and(|a| a != &Value::Bool(false))
            || cur.get("patternProperties").is_some()
        {
            return;
        }
        match props.get(f) {
            Some(next) => {
                cur = next;
                path.push('.');
                path.push_str(f);
            }
            None => {
                let names: Vec<&str> = props.keys().map(String::as_str).collect();
                out.push(unknown_field(&path, f, &names, span, source));
                return;
            }
        }
    }
}

/// SY405: `path` has no field `f` in `source`; the help names the closest of `names`, or all.
fn unknown_field(path: &str, f: &str, names: &[&str], span: Span, source: &str) -> Diagnostic {
    let help = match did_you_mean(f, names.iter().copied()) {
        Some(h) => h,
        None => format!(
            "declared fields: {}",
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Diagnostic::new(
        &codes::UNKNOWN_FIELD,
        span,
        format!("`{path}` has no field `{f}` in {source}"),
    )
    .label("unknown field")
    .help(help)
}

/// As [`check_fields`], against a type: the first field of `fields` that no value of `ty` has.
fn check_ty_fields(
    out: &mut Vec<Diagnostic>,
    ty: &Ty,
    fields: &[String],
    span: Span,
    base: &str,
    source: &str,
) {
    let mut cur = Cow::Borrowed(ty);
    let mut path = base.to_string();
    for f in fields {
        match cur.field(f) {
            Lookup::Field { ty, .. } => {
                cur = Cow::Owned(ty);
                path.push('.');
                path.push_str(f);
            }
            Lookup::Missing { names } if !names.is_empty() => {
                out.push(unknown_field(&path, f, &names, span, source));
                return;
            }
            _ => return,
        }
    }
}

/// The span of bytes `start..end` of the text that starts at byte `offset` of `value`, the
/// YAML string at `span` (the whole string when it is not verbatim in the source). An empty
/// range is widened to one byte where the text allows, so that a label has something to
/// point at.
pub(crate) fn inner_span(
    span: Span,
    value: &str,
    source: &str,
    offset: usize,
    start: usize,
    end: usize,
) -> Span {
    let end = end
        .max(start + 1)
        .min(value.len().saturating_sub(offset))
        .max(start);
    str_sub_span(span, value, source, offset + start, offset + end)
}

fn mentions(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}
