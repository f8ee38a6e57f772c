//! The payload's type at every step (SPEC §5.1, "Types flow through the graph").
//!
//! [`walk`] starts from `input.schema` ([`Ty::Any`] without one) at the start step and follows
//! the edges: a success edge carries the payload as the step's output left it, a failure edge
//! as it was before the step (a failed step merges nothing), an `always` edge either. Where
//! paths meet, the types are joined ([`Ty::join`]): a field written on one path only is maybe
//! absent after. Each step kind writes what SPEC §3 and §5.3 say: `set` and `output` mappings
//! (a map, `"*"` deep merge, an allowlist, under `scope`), `while` after every iteration, a
//! `foreach` its list of results. Written values are typed by what is known: an agent's
//! `result_schema`, an `interrupt`'s decision `schema`, a literal, a JSONPath source's type at
//! its path, an expression's static type ([`expr_type`]).
//!
//! The step graph of a valid flow is acyclic (back edges are SY206), so the steps are visited
//! once each in reverse postorder, every predecessor first, and a step's entry type is dropped
//! once it has been visited: a long chain holds a few types at a time, not one per step. A
//! graph with a cycle is first iterated to a fixpoint, each step at most [`MAX_VISITS`] times
//! before its entry is widened to [`Ty::Any`].
//!
//! This module computes types and reports nothing; `rules::payload_types` reads them. It does
//! no I/O of its own (schema files come from the loaded project).

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use crate::expr::Expr;
use crate::expr::cache::ParseCache;
use crate::expr::path::Seg;
use crate::expr::ty::{Field, Lookup, Obj, Ty};
use crate::expr::types::Scope;
use crate::lint::FlowCx;
use crate::model::{
    Agent, AgentRef, AgentSpec, Branch, Edge, EdgeOn, InputSpec, Next, OutputSpec, SchemaRef, Source, Step,
    StepKind,
};
use crate::syntax::Node as YNode;

/// How many times a step on a cycle is re-visited before its entry type is widened to
/// [`Ty::Any`] (the top of the lattice, so the iteration then stops).
const MAX_VISITS: usize = 8;

/// How many parts of types (fields, elements, members) the walk may copy or join over a
/// whole flow. Copies are made where a step has a failure edge or several edges, and joins
/// where paths meet, so a long flow whose payload grows at every step could cost the square
/// of its length; past this budget the payload is [`Ty::Any`] (nothing more is reported),
/// which bounds lint's time whatever the flow.
const COPY_BUDGET: usize = 1 << 20;

/// How many times a `while` step's output is applied to find the payload its condition can
/// see; not settled by then, the loop's payload is [`Ty::Any`].
const MAX_LOOP_ROUNDS: usize = 4;

/// What is known when a step starts.
pub struct Before<'a> {
    /// The step's index in the flow's `steps`.
    pub index: usize,
    pub step: &'a Step,
    /// The payload when the step starts: what `foreach`, `set` and `fail` read.
    pub entry: &'a Ty,
    /// The payload the step's input, message and output expressions see: `entry`, or for a
    /// `while` step the payload of any iteration (the entry joined with what iterations wrote).
    pub during: &'a Ty,
    /// The result as `output` reads it: the agent's result (after `select`, a `foreach`'s
    /// list of them; a `while`'s per iteration); an `interrupt`'s decision. [`Ty::Any`] where
    /// nothing is known.
    pub result: &'a Ty,
    /// The agent's own result, what `select` reads (the same as `result` but for `foreach`).
    pub agent_result: &'a Ty,
    /// Each `parallel` branch's result, in written order.
    pub branches: &'a [Ty],
}

/// What is known when a step has finished.
pub struct After<'a> {
    pub index: usize,
    pub step: &'a Step,
    /// The payload after the step succeeded (its output applied): success edges.
    pub success: &'a Ty,
    /// The payload after the step failed, when an edge is taken on failure.
    pub failure: Option<&'a Ty>,
}

impl After<'_> {
    /// The payload an edge's `if:` reads, by the outcome it is taken on.
    pub fn on_edge(&self, e: &Edge) -> Cow<'_, Ty> {
        match (edge_outcome(e), self.failure) {
            (Outcome::Success, _) => Cow::Borrowed(self.success),
            (Outcome::Failure, Some(f)) => Cow::Borrowed(f),
            (Outcome::Always, Some(f)) => Cow::Owned(self.success.join(f)),
            (_, None) => Cow::Owned(Ty::Any),
        }
    }
}

/// What `walk` tells its visitor, in order: each step's [`Before`], then its [`After`].
pub trait Visit {
    fn before(&mut self, b: &Before, parsed: &mut ParseCache);
    fn after(&mut self, a: &After, parsed: &mut ParseCache);
}

/// Computes the payload type at every step reachable from the start and tells `visit` about
/// each, in reverse postorder (predecessors first), with `parsed` to read expressions.
/// Returns the type of the payload a successful run ends with (`None`: no step ends one).
///
/// A step's entry type is consumed by its own writes (no copy of the payload per step) and
/// moved on along its edge; it is copied only where a step has several edges or a failure
/// edge, and where paths join.
pub fn walk(cx: &FlowCx, parsed: &mut ParseCache, visit: &mut dyn Visit) -> Option<Ty> {
    let steps = &cx.flow.steps;
    let start = cx.start().and_then(|s| steps.get_index_of(s))?;
    let mut end: Option<Ty> = None;
    let (order, cyclic) = reverse_postorder(cx, start);
    let input = cx
        .flow
        .input
        .as_ref()
        .and_then(|i| i.schema.as_ref())
        .and_then(|s| schema_value(cx, s))
        .map_or(Ty::Any, |s| Ty::from_schema(&s));
    let mut tx = Transfer {
        cx,
        results: HashMap::new(),
    };
    let mut entries: Vec<Option<Ty>> = vec![None; steps.len()];
    entries[start] = Some(input);
    let mut budget = Budget { spent: 0 };
    if cyclic {
        fixpoint(&mut tx, &mut budget, parsed, &order, &mut entries);
    }
    for &i in &order {
        let entry = if cyclic {
            entries[i].clone()
        } else {
            entries[i].take()
        };
        let Some(entry) = entry else { continue };
        let step = &steps[i];
        let known = tx.known(step, &entry, parsed);
        visit.before(
            &Before {
                index: i,
                step,
                entry: &entry,
                during: known.during.as_ref().unwrap_or(&entry),
                result: &known.result,
                agent_result: &known.agent_result,
                branches: &known.branches,
            },
            parsed,
        );
        let (success, failure) = tx.finish(step, entry, known, parsed);
        visit.after(
            &After {
                index: i,
                step,
                success: &success,
                failure: failure.as_ref(),
            },
            parsed,
        );
        ends(step, &success, failure.as_ref(), |ty| join_into(&mut end, ty));
        if !cyclic {
            let (success, failure) = budget.charge(step, success, failure, &entries, cx);
            propagate(cx, step, success, failure, parsed, |j, ty| {
                join_into(&mut entries[j], ty)
            });
        }
    }
    end
}

/// What the walk has copied and joined so far, against [`COPY_BUDGET`].
struct Budget {
    spent: usize,
}

impl Budget {
    /// Charges what passing a step's payload on will copy and join, and gives back the types
    /// to pass on: [`Ty::Any`] once the budget is spent.
    fn charge(
        &mut self,
        step: &Step,
        success: Ty,
        failure: Option<Ty>,
        entries: &[Option<Ty>],
        cx: &FlowCx,
    ) -> (Ty, Option<Ty>) {
        if self.spent > COPY_BUDGET {
            return (Ty::Any, failure.map(|_| Ty::Any));
        }
        let mut edges = 0usize;
        let mut joins = 0usize;
        cx.for_each_successor(step, |j| {
            edges += 1;
            if entries[j].is_some() {
                joins += 1;
            }
        });
        let copies = edges.saturating_sub(1) + joins + usize::from(failure.is_some()) * 2;
        if copies > 0 {
            let left = COPY_BUDGET - self.spent;
            let size = size_of(&success, left).max(failure.as_ref().map_or(0, |f| size_of(f, left)));
            self.spent = self.spent.saturating_add(size.saturating_mul(copies));
        }
        if self.spent > COPY_BUDGET {
            return (Ty::Any, failure.map(|_| Ty::Any));
        }
        (success, failure)
    }
}

/// The number of parts of a type, counted up to `limit`.
fn size_of(t: &Ty, limit: usize) -> usize {
    fn count(t: &Ty, n: &mut usize, limit: usize) {
        *n += 1;
        if *n > limit {
            return;
        }
        match t {
            Ty::List(e) => count(e, n, limit),
            Ty::Object(o) => {
                for f in o.fields.values() {
                    count(&f.ty, n, limit);
                    if *n > limit {
                        return;
                    }
                }
            }
            Ty::Union(m) => m.iter().for_each(|m| count(m, n, limit)),
            _ => {}
        }
    }
    let mut n = 0;
    count(t, &mut n, limit);
    n
}

/// The outcome an edge is taken on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Success,
    Failure,
    Always,
}

fn edge_outcome(e: &Edge) -> Outcome {
    match (e.on.as_ref().map(|o| o.value), e.errors.is_some()) {
        // `errors:` without `on:` implies `on: failure`.
        (Some(EdgeOn::Failure), _) | (None, true) => Outcome::Failure,
        (Some(EdgeOn::Always), _) => Outcome::Always,
        _ => Outcome::Success,
    }
}

/// Whether a step has an edge taken on failure (so the payload before it is needed after).
fn has_failure_edge(step: &Step) -> bool {
    matches!(&step.next, Some(Next::Edges(edges)) if edges.iter().any(|e| edge_outcome(e) != Outcome::Success))
}

fn edge_type(e: &Edge, success: &Ty, failure: Option<&Ty>) -> Ty {
    match (edge_outcome(e), failure) {
        (Outcome::Success, _) => success.clone(),
        (Outcome::Failure, Some(f)) => f.clone(),
        (Outcome::Always, Some(f)) => success.join(f),
        (_, None) => Ty::Any,
    }
}

/// Calls `f` with the payload type of each way `step` ends the run successfully: no `next`
/// (but a `fail` step), or an edge to `end`.
fn ends(step: &Step, success: &Ty, failure: Option<&Ty>, mut f: impl FnMut(Ty)) {
    match &step.next {
        None if matches!(step.kind, StepKind::Fail(_)) => {}
        None => f(success.clone()),
        Some(Next::One(to)) if to.value == "end" => f(success.clone()),
        Some(Next::One(_)) => {}
        Some(Next::Edges(edges)) => {
            for e in edges.iter().filter(|e| e.to.value == "end") {
                f(edge_type(e, success, failure));
            }
        }
    }
}

/// The order to visit steps in, from `start`, and whether a cycle was found.
fn reverse_postorder(cx: &FlowCx, start: usize) -> (Vec<usize>, bool) {
    let steps = &cx.flow.steps;
    // 0: not seen, 1: on the stack, 2: done.
    let mut state = vec![0u8; steps.len()];
    let mut post = Vec::with_capacity(steps.len());
    let mut cyclic = false;
    let succ = |i: usize| {
        let mut v = Vec::new();
        cx.for_each_successor(&steps[i], |j| v.push(j));
        v
    };
    let mut stack: Vec<(usize, Vec<usize>, usize)> = vec![(start, succ(start), 0)];
    state[start] = 1;
    while let Some((node, next, at)) = stack.last_mut() {
        if let Some(&j) = next.get(*at) {
            *at += 1;
            match state[j] {
                0 => {
                    state[j] = 1;
                    let s = succ(j);
                    stack.push((j, s, 0));
                }
                1 => cyclic = true,
                _ => {}
            }
        } else {
            state[*node] = 2;
            post.push(*node);
            stack.pop();
        }
    }
    post.reverse();
    (post, cyclic)
}

/// Iterates the entry types of a graph with cycles until they settle, widening a step visited
/// [`MAX_VISITS`] times to [`Ty::Any`].
fn fixpoint(
    tx: &mut Transfer,
    budget: &mut Budget,
    parsed: &mut ParseCache,
    order: &[usize],
    entries: &mut [Option<Ty>],
) {
    let cx = tx.cx;
    let steps = &cx.flow.steps;
    let mut rank = vec![usize::MAX; steps.len()];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r;
    }
    let mut visits = vec![0usize; steps.len()];
    let mut work: BTreeSet<usize> = order.first().map(|_| 0).into_iter().collect();
    while let Some(r) = work.pop_first() {
        let i = order[r];
        let Some(entry) = entries[i].clone() else {
            continue;
        };
        visits[i] += 1;
        let known = tx.known(&steps[i], &entry, parsed);
        let (success, failure) = tx.finish(&steps[i], entry, known, parsed);
        let (success, failure) = budget.charge(&steps[i], success, failure, entries, cx);
        propagate(cx, &steps[i], success, failure, parsed, |j, ty| {
            let before = entries[j].clone();
            join_into(&mut entries[j], ty);
            if visits[j] >= MAX_VISITS {
                entries[j] = Some(Ty::Any);
            }
            if entries[j] != before && rank[j] != usize::MAX {
                work.insert(rank[j]);
            }
        });
    }
}

fn join_into(slot: &mut Option<Ty>, ty: Ty) {
    *slot = Some(match slot.take() {
        None => ty,
        Some(t) => t.join(&ty),
    });
}

/// Calls `f` with each successor of `step` and the payload type its edge carries; the last
/// success edge gets `success` itself. An edge taken only when its `if` holds carries what
/// that says of the payload: a field tested with `has(payload.a.b)` (alone or as one of the
/// condition's `&&`) is there.
fn propagate(
    cx: &FlowCx,
    step: &Step,
    success: Ty,
    failure: Option<Ty>,
    parsed: &mut ParseCache,
    mut f: impl FnMut(usize, Ty),
) {
    let Some(next) = &step.next else { return };
    let steps = &cx.flow.steps;
    match next {
        Next::One(to) => {
            if let Some(j) = steps.get_index_of(&to.value) {
                f(j, success);
            }
        }
        Next::Edges(edges) => {
            let targets: Vec<(usize, &Edge)> = edges
                .iter()
                .filter_map(|e| Some((steps.get_index_of(&e.to.value)?, e)))
                .collect();
            let last_success = targets
                .iter()
                .rposition(|(_, e)| edge_outcome(e) == Outcome::Success);
            let mut success = Some(success);
            for (k, (j, e)) in targets.iter().enumerate() {
                let mut ty = if Some(k) == last_success {
                    success.take().unwrap_or(Ty::Any)
                } else {
                    edge_type(e, success.as_ref().unwrap_or(&Ty::Any), failure.as_ref())
                };
                if let Some(c) = &e.if_
                    && !ty.is_any()
                    && let Ok(cond) = &parsed.expr(c.value.strip_prefix('=').unwrap_or(&c.value)).expr
                {
                    let mut tested = Vec::new();
                    tested_fields(cond.ast(), &mut tested);
                    for fields in tested {
                        ty.assume_present(&fields);
                    }
                }
                f(*j, ty);
            }
        }
    }
}

/// What a step's kind and agent make known before it runs.
struct Known {
    /// The payload its expressions see, when it is not the entry (`while`).
    during: Option<Ty>,
    result: Ty,
    agent_result: Ty,
    branches: Vec<Ty>,
}

/// The transfer function of steps, with the result types of agents computed once each.
struct Transfer<'a, 'p> {
    cx: &'a FlowCx<'p>,
    /// By the agent's address: agents live as long as the flow.
    results: HashMap<*const Agent, Ty>,
}

impl Transfer<'_, '_> {
    /// The type of an agent's result: its `result_schema` (checked at run time), else what
    /// its kind returns: an `llm` agent `{text}`, a `transform` or `mock` agent the shape of
    /// its value template; else unknown.
    fn agent_result(&mut self, r: &AgentRef) -> Ty {
        match self.cx.agent(r) {
            Some(agent) => self.agent_type(agent),
            None => Ty::Any,
        }
    }

    /// [`Transfer::agent_result`] of an agent; an agent loop that ends at its `until_tool`
    /// answers with that tool's result.
    fn agent_type(&mut self, agent: &Agent) -> Ty {
        let key: *const Agent = agent;
        if let Some(t) = self.results.get(&key) {
            return t.clone();
        }
        let ty = match agent.common.result_schema.as_ref() {
            Some(s) => schema_value(self.cx, s).map_or(Ty::Any, |s| Ty::from_schema(&s)),
            None => match &agent.spec {
                // Unknown while it is being typed: loops that end at each other.
                AgentSpec::Llm(_) => match self.cx.until_tool(agent) {
                    Some(until) => {
                        self.results.insert(key, Ty::Any);
                        self.agent_type(until)
                    }
                    None => Ty::of_value(&serde_json::json!({"text": ""})),
                },
                AgentSpec::Transform(t) => template_type(&t.result.0),
                AgentSpec::Mock(m) => {
                    let sequence = m.sequence.as_deref().unwrap_or_default();
                    let answers: Vec<&crate::model::Any> = if sequence.is_empty() {
                        m.returns.iter().collect()
                    } else {
                        sequence.iter().collect()
                    };
                    answers
                        .into_iter()
                        .map(|a| template_type(&a.0))
                        .reduce(|a, b| a.join(&b))
                        // Neither `returns` nor `sequence`: an empty object.
                        .unwrap_or_else(|| Ty::Object(Obj::default()))
                }
                // A child run's output, checked against its `output.schema` when it ends.
                AgentSpec::Flow(f) => self
                    .child_output_schema(f)
                    .map_or(Ty::Any, |s| Ty::from_schema(&s)),
                _ => Ty::Any,
            },
        };
        self.results.insert(key, ty.clone());
        ty
    }

    /// The `output.schema` of the flow a `flow` agent calls: its inline flow's, or the flow
    /// file's its `path` names (as loaded for this flow).
    fn child_output_schema(&self, f: &crate::model::FlowAgent) -> Option<Value> {
        if let Some(inner) = &f.inline {
            return schema_value(self.cx, inner.output.as_ref()?.schema.as_ref()?);
        }
        let p = f.path.as_ref()?;
        let project = self.cx.project;
        let callee = project
            .calls
            .iter()
            .find(|(from, spec, _)| *from == self.cx.id && spec.span == p.span)?
            .2?;
        let child = project.flow(callee).flow.as_ref()?;
        match child.output.as_ref()?.schema.as_ref()? {
            SchemaRef::Inline(n) => Some(n.0.to_json()),
            SchemaRef::Path(sp) => project
                .schema_for(callee, &sp.value)
                .and_then(|l| l.node.as_ref())
                .map(YNode::to_json),
        }
    }

    /// The result types of a step, and (for `while`) the payload of its iterations.
    fn known(&mut self, step: &Step, entry: &Ty, parsed: &mut ParseCache) -> Known {
        let mut k = Known {
            during: None,
            result: Ty::Any,
            agent_result: Ty::Any,
            branches: Vec::new(),
        };
        if self.cx.is_malformed(step) {
            return k;
        }
        match &step.kind {
            StepKind::Agent(r) => {
                let agent_result = self.agent_result(r);
                let l = &step.looping;
                if l.foreach.is_some() {
                    let mut item = match &l.select {
                        Some(s) => path_type(&agent_result, &s.value, parsed),
                        None => agent_result.clone(),
                    };
                    if l.tolerate.is_some() {
                        // A failed iteration's place holds `null`.
                        item = item.join(&Ty::Null);
                    }
                    k.result = Ty::List(Box::new(item));
                } else {
                    k.result = agent_result.clone();
                    if l.while_.is_some() {
                        k.during = Some(self.iterations(step, entry, &agent_result, parsed));
                    }
                }
                k.agent_result = agent_result;
            }
            StepKind::Parallel(branches) => {
                k.branches = branches.values().map(|b| self.agent_result(&b.agent)).collect();
                k.result = Ty::Object(Obj {
                    fields: branches
                        .keys()
                        .zip(&k.branches)
                        .map(|(name, t)| {
                            (
                                name.clone(),
                                Field {
                                    ty: t.clone(),
                                    always: true,
                                },
                            )
                        })
                        .collect(),
                    open: false,
                });
            }
            StepKind::Interrupt(i) => {
                k.result = i
                    .schema
                    .as_ref()
                    .and_then(|s| schema_value(self.cx, s))
                    .map_or(Ty::Any, |s| Ty::from_schema(&s));
                k.agent_result = k.result.clone();
            }
            StepKind::Set(_) | StepKind::Fail(_) | StepKind::Succeed(_) => {}
        }
        k
    }

    /// The payload of any iteration of a `while` step: the entry, joined with what each
    /// iteration writes, until it settles ([`Ty::Any`] if it does not).
    fn iterations(&mut self, step: &Step, entry: &Ty, result: &Ty, parsed: &mut ParseCache) -> Ty {
        let scope = step.scope.as_ref().and_then(|s| segs_of(parsed, &s.value));
        let mut during = entry.clone();
        for _ in 0..MAX_LOOP_ROUNDS {
            let once = output(
                during.clone(),
                step.output.as_ref(),
                scope.as_deref(),
                result,
                parsed,
            );
            let next = during.join(&once);
            if next == during {
                return during;
            }
            during = next;
        }
        Ty::Any
    }

    /// The payload after the step succeeded (made from `entry`), and, when an edge is taken
    /// on failure, after it failed.
    fn finish(&mut self, step: &Step, entry: Ty, known: Known, parsed: &mut ParseCache) -> (Ty, Option<Ty>) {
        if self.cx.is_malformed(step) {
            return (Ty::Any, has_failure_edge(step).then_some(Ty::Any));
        }
        if let Some(mut during) = known.during {
            // A `while`: iterations before a failed one have written their output too.
            let failure = has_failure_edge(step).then(|| during.clone());
            // It succeeds when its condition is false: a field it waits for
            // (`!has(payload.a.b)`, one of the `||` of the condition) is there after it.
            if let Some(w) = &step.looping.while_
                && let Some(text) = w.value.strip_prefix('=')
                && let Ok(e) = &parsed.expr(text).expr
            {
                let mut waited = Vec::new();
                awaited_fields(e.ast(), &mut waited);
                for fields in waited {
                    during.assume_present(&fields);
                }
            }
            return (during, failure);
        }
        let failure = has_failure_edge(step).then(|| entry.clone());
        let scope = step.scope.as_ref().and_then(|s| segs_of(parsed, &s.value));
        let success = match &step.kind {
            StepKind::Agent(_) | StepKind::Interrupt(_) => output(
                entry,
                step.output.as_ref(),
                scope.as_deref(),
                &known.result,
                parsed,
            ),
            StepKind::Set(m) => {
                // Every source reads the payload as it was before any of the writes.
                let mut writes = Vec::with_capacity(m.0.len());
                for (dest, src) in &m.0 {
                    let Some(segs) = segs_of(parsed, &dest.value) else {
                        return (Ty::Any, failure);
                    };
                    writes.push((segs, source_type(src, &entry, &entry, None, parsed)));
                }
                let mut after = entry;
                for (segs, ty) in writes {
                    write_at(&mut after, &segs, ty);
                }
                after
            }
            StepKind::Parallel(branches) => {
                let mut after = entry;
                for (b, r) in branches.values().zip(&known.branches) {
                    after = branch_output(after, b, r, parsed);
                }
                after
            }
            StepKind::Fail(_) | StepKind::Succeed(_) => entry,
        };
        (success, failure)
    }
}

/// The `payload` chains a condition tests with `!has(...)` in its top-level `||`: when the
/// condition is false, each of them is there.
fn awaited_fields(e: &cel::parser::Expression, out: &mut Vec<Vec<String>>) {
    use cel::common::ast::Expr as N;
    let N::Call(c) = &e.expr else { return };
    match (c.func_name.as_str(), &c.args[..]) {
        ("_||_", [a, b]) => {
            awaited_fields(a, out);
            awaited_fields(b, out);
        }
        ("!_", [x]) => out.extend(has_chain(x)),
        _ => {}
    }
}

/// The `payload` chains a condition tests with `has(...)` in its top-level `&&`: when the
/// condition is true, each of them is there.
fn tested_fields(e: &cel::parser::Expression, out: &mut Vec<Vec<String>>) {
    use cel::common::ast::Expr as N;
    match &e.expr {
        N::Call(c) if c.func_name == "_&&_" && c.args.len() == 2 => {
            tested_fields(&c.args[0], out);
            tested_fields(&c.args[1], out);
        }
        _ => out.extend(has_chain(e)),
    }
}

/// The fields of `payload.a.b` when `e` is `has(payload.a.b)`.
fn has_chain(e: &cel::parser::Expression) -> Option<Vec<String>> {
    use cel::common::ast::Expr as N;
    let N::Select(s) = &e.expr else { return None };
    if !s.test {
        return None;
    }
    let mut fields = vec![s.field.clone()];
    let mut cur = &*s.operand;
    while let N::Select(inner) = &cur.expr {
        if inner.test {
            return None;
        }
        fields.push(inner.field.clone());
        cur = &inner.operand;
    }
    if !matches!(&cur.expr, N::Ident(n) if n == "payload") {
        return None;
    }
    fields.reverse();
    Some(fields)
}

fn branch_output(payload: Ty, b: &Branch, result: &Ty, parsed: &mut ParseCache) -> Ty {
    let scope = b.scope.as_ref().and_then(|s| segs_of(parsed, &s.value));
    output(payload, b.output.as_ref(), scope.as_deref(), result, parsed)
}

/// The payload after an `output` mapping (SPEC §5.3) of a result of type `result` into
/// `payload`, under `scope`; its expressions see `payload` as it was before the writes.
fn output(
    payload: Ty,
    spec: Option<&OutputSpec>,
    scope: Option<&[Seg]>,
    result: &Ty,
    parsed: &mut ParseCache,
) -> Ty {
    let Some(spec) = spec else {
        return payload;
    };
    let scope: &[Seg] = scope.unwrap_or(&[]);
    let mut after = payload;
    match spec {
        OutputSpec::All(_) => merge_at(&mut after, scope, result),
        OutputSpec::Paths(paths) => {
            for p in paths {
                let Some(segs) = segs_of(parsed, &p.value) else {
                    return Ty::Any;
                };
                let mut at: Vec<Seg> = scope.to_vec();
                at.extend(segs.iter().cloned());
                match type_at_segs(result, &segs) {
                    At::Never => {}
                    At::Found(t, true) => merge_at(&mut after, &at, &t),
                    At::Found(t, false) => {
                        let mut written = after.clone();
                        merge_at(&mut written, &at, &t);
                        after = after.join(&written);
                    }
                    // Nothing is known of the result: nor whether it has the path, so the
                    // path is not said to be maybe absent (nothing is assumed, nothing reported).
                    At::Unknown => merge_at(&mut after, &at, &Ty::Any),
                }
            }
        }
        OutputSpec::Map(m) => {
            let mut writes = Vec::with_capacity(m.0.len());
            for (dest, src) in &m.0 {
                let Some(segs) = segs_of(parsed, &dest.value) else {
                    return Ty::Any;
                };
                let mut at: Vec<Seg> = scope.to_vec();
                at.extend(segs);
                writes.push((at, source_type(src, result, &after, Some(result), parsed)));
            }
            for (at, ty) in writes {
                write_at(&mut after, &at, ty);
            }
        }
    }
    after
}

/// The type of the value a mapping source gives: a JSONPath over `doc`, an expression seeing
/// `payload` (and `result`), a literal.
fn source_type(src: &Source, doc: &Ty, payload: &Ty, result: Option<&Ty>, parsed: &mut ParseCache) -> Ty {
    match src {
        Source::Text(t) => match t.value.strip_prefix('=') {
            Some(text) => {
                let e = parsed.expr(text);
                match &e.expr {
                    Ok(e) => expr_type(e, &Env { payload, result }),
                    Err(_) => Ty::Any,
                }
            }
            None => path_type(doc, &t.value, parsed),
        },
        Source::WithDefault { path, default } => {
            path_type(doc, &path.value, parsed).join(&Ty::of_value(&default.0.to_json()))
        }
        Source::Literal { value } => Ty::of_value(&value.0.to_json()),
    }
}

/// The type of what the JSONPath `text` gives over a document of type `doc`: for a singular
/// path, the value there; for a query, a list of what it selects.
pub fn path_type(doc: &Ty, text: &str, parsed: &mut ParseCache) -> Ty {
    let Some(p) = read_path(parsed, text) else {
        return Ty::Any;
    };
    let found = match type_at(doc, &p.segs) {
        At::Found(t, _) if p.complete => t,
        _ => Ty::Any,
    };
    if p.singular {
        found
    } else {
        Ty::List(Box::new(found))
    }
}

/// The segments of a singular path, when it parses and is one.
pub fn segs_of(parsed: &mut ParseCache, text: &str) -> Option<Vec<Seg>> {
    parsed.path(text).as_ref().ok()?.segments().map(<[Seg]>::to_vec)
}

/// One step of a read path as lint follows it.
#[derive(Clone, Debug, PartialEq)]
pub enum PSeg {
    /// `.name`, `['name']`.
    Key(String),
    /// `[n]`.
    Index(i64),
    /// `[*]`, `.*`: every element (or member).
    All,
}

/// A source path as lint reads it: its leading segments, and whether they are all of it.
pub struct ReadPath {
    pub segs: Vec<PSeg>,
    /// A singular path (one value, or a `mapping` error when it matches nothing).
    pub singular: bool,
    /// The segments are the whole path (a query may go on with what lint does not follow:
    /// filters, slices, `..`).
    pub complete: bool,
}

/// The read path of a JSONPath source that parses.
pub fn read_path(parsed: &mut ParseCache, text: &str) -> Option<ReadPath> {
    let p = parsed.path(text).as_ref().ok()?;
    if let Some(segs) = p.segments() {
        return Some(ReadPath {
            segs: segs
                .iter()
                .map(|s| match s {
                    Seg::Key(k) => PSeg::Key(k.clone()),
                    Seg::Index(n) => PSeg::Index(*n),
                })
                .collect(),
            singular: true,
            complete: true,
        });
    }
    let (segs, complete) = query_prefix(text);
    Some(ReadPath {
        segs,
        singular: false,
        complete,
    })
}

/// The leading `.name`, `[n]`, `[*]` and `.*` segments of a query (which has parsed).
pub fn query_prefix(text: &str) -> (Vec<PSeg>, bool) {
    let b = text.as_bytes();
    let mut segs = Vec::new();
    let mut i = 1; // after `$`
    let name = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
    while i < b.len() {
        if b[i] == b'.' && b.get(i + 1) == Some(&b'*') {
            segs.push(PSeg::All);
            i += 2;
        } else if b[i] == b'.' && b.get(i + 1).is_some_and(|&c| name(c) && !c.is_ascii_digit()) {
            let start = i + 1;
            i = start;
            while i < b.len() && name(b[i]) {
                i += 1;
            }
            segs.push(PSeg::Key(text[start..i].to_owned()));
        } else if text[i..].starts_with("[*]") {
            segs.push(PSeg::All);
            i += 3;
        } else if b[i] == b'[' {
            let digits = text[i + 1..].bytes().take_while(u8::is_ascii_digit).count();
            if digits > 0
                && b.get(i + 1 + digits) == Some(&b']')
                && let Ok(n) = text[i + 1..i + 1 + digits].parse()
            {
                segs.push(PSeg::Index(n));
                i += digits + 2;
            } else {
                return (segs, false);
            }
        } else {
            return (segs, false);
        }
    }
    (segs, true)
}

/// What a path finds in a value of a type.
#[derive(Debug, PartialEq)]
pub enum At {
    /// Nothing is known there.
    Unknown,
    /// A value of this type; `true` when it is always there.
    Found(Ty, bool),
    /// No value of the type has anything there.
    Never,
}

/// Field `name` of a value of a type, borrowed from it where it can be (a payload type is
/// large; a read needs only the part it reads).
pub enum FieldOf<'a> {
    /// Nothing is known (an open object, [`Ty::Any`], or a union with such a member).
    Unknown,
    /// The field's type, and whether it is always there.
    Field(Cow<'a, Ty>, bool),
    /// No value of the type has the field; the fields that do exist.
    Missing(Vec<String>),
    /// The value is not an object.
    NotObject,
}

/// [`FieldOf`] the type `cur`.
pub fn field_of<'a>(cur: Cow<'a, Ty>, name: &str) -> FieldOf<'a> {
    fn owned<'b>(l: Lookup<'_>) -> FieldOf<'b> {
        match l {
            Lookup::Unknown => FieldOf::Unknown,
            Lookup::Field { ty, always } => FieldOf::Field(Cow::Owned(ty), always),
            Lookup::Missing { names } => FieldOf::Missing(names.into_iter().map(str::to_owned).collect()),
            Lookup::NotObject => FieldOf::NotObject,
        }
    }
    match cur {
        Cow::Borrowed(Ty::Object(o)) => match o.fields.get(name) {
            Some(f) => FieldOf::Field(Cow::Borrowed(&f.ty), f.always),
            None if o.open => FieldOf::Unknown,
            None => FieldOf::Missing(o.fields.keys().cloned().collect()),
        },
        Cow::Borrowed(t) => owned(t.field(name)),
        Cow::Owned(t) => owned(t.field(name)),
    }
}

/// Follows `segs` through `ty`.
pub fn type_at(ty: &Ty, segs: &[PSeg]) -> At {
    let mut cur = Cow::Borrowed(ty);
    let mut always = true;
    for s in segs {
        match s {
            PSeg::Key(k) => match field_of(cur, k) {
                FieldOf::Unknown => return At::Unknown,
                FieldOf::Field(ty, a) => {
                    always &= a;
                    cur = ty;
                }
                FieldOf::Missing(_) | FieldOf::NotObject => return At::Never,
            },
            PSeg::Index(_) | PSeg::All => match list_element(&cur) {
                Some(Some(e)) => {
                    always = false;
                    cur = Cow::Owned(e);
                }
                Some(None) => return At::Unknown,
                None if *s == PSeg::All && matches!(*cur, Ty::Object(_)) => return At::Unknown,
                None => return At::Never,
            },
        }
    }
    At::Found(cur.into_owned(), always)
}

/// The type of a singular destination's value in `ty`, for scopes.
pub fn type_at_segs(ty: &Ty, segs: &[Seg]) -> At {
    let p: Vec<PSeg> = segs
        .iter()
        .map(|s| match s {
            Seg::Key(k) => PSeg::Key(k.clone()),
            Seg::Index(n) => PSeg::Index(*n),
        })
        .collect();
    type_at(ty, &p)
}

/// The element type of a list type: `Some(None)` when unknown (`Any`, or a union with a list
/// of unknown elements), `None` when the type is never a list.
pub fn list_element(ty: &Ty) -> Option<Option<Ty>> {
    match ty {
        Ty::Any => Some(None),
        Ty::List(e) if e.is_any() => Some(None),
        Ty::List(e) => Some(Some((**e).clone())),
        Ty::Union(m) => m.iter().find_map(|t| match t {
            Ty::List(e) if e.is_any() => Some(None),
            Ty::List(e) => Some(Some((**e).clone())),
            _ => None,
        }),
        _ => None,
    }
}

/// Writes a value of type `value` at `segs` (a singular destination), creating objects on the
/// way as a mapping does. A write through a list element keeps the list, its element type
/// joined with the written one.
fn write_at(ty: &mut Ty, segs: &[Seg], value: Ty) {
    let Some((first, rest)) = segs.split_first() else {
        *ty = value;
        return;
    };
    match first {
        Seg::Key(k) => {
            if !matches!(ty, Ty::Object(_)) {
                *ty = Ty::open_object();
            }
            if let Ty::Object(o) = ty {
                let slot = o.fields.entry(k.clone()).or_insert(Field {
                    ty: Ty::Any,
                    always: true,
                });
                slot.always = true;
                write_at(&mut slot.ty, rest, value);
            }
        }
        Seg::Index(_) => match ty {
            Ty::List(e) => {
                let mut elem = (**e).clone();
                write_at(&mut elem, rest, value);
                **e = e.join(&elem);
            }
            _ => *ty = Ty::Any,
        },
    }
}

/// Deep-merges a value of type `value` into the part of `ty` at `segs` (`output: "*"` under a
/// scope, an allowlist path), creating what is missing on the way.
fn merge_at(ty: &mut Ty, segs: &[Seg], value: &Ty) {
    let Some((first, rest)) = segs.split_first() else {
        ty.merge(value);
        return;
    };
    match first {
        Seg::Key(k) => {
            if !matches!(ty, Ty::Object(_)) {
                *ty = Ty::open_object();
            }
            let Ty::Object(o) = ty else { return };
            let open = o.open;
            match o.fields.get_mut(k) {
                Some(slot) => {
                    let mut merged = slot.ty.clone();
                    merge_at(&mut merged, rest, value);
                    if !slot.always {
                        merged = merged.join(&fresh(rest, value, false));
                    }
                    *slot = Field {
                        ty: merged,
                        always: true,
                    };
                }
                None => {
                    // Absent (or, in an open object, unknown): merged into nothing.
                    o.fields.insert(
                        k.clone(),
                        Field {
                            ty: fresh(rest, value, open),
                            always: true,
                        },
                    );
                }
            }
        }
        Seg::Index(_) => *ty = Ty::Any,
    }
}

/// What merging `value` at `rest` into a missing value gives (into an unknown one when
/// `unknown`).
fn fresh(rest: &[Seg], value: &Ty, unknown: bool) -> Ty {
    let mut t = if unknown {
        Ty::Any
    } else {
        Ty::Object(Obj::default())
    };
    merge_at(&mut t, rest, value);
    t
}

/// The types the variables of an expression have.
struct Env<'a> {
    payload: &'a Ty,
    result: Option<&'a Ty>,
}

impl Scope for Env<'_> {
    fn var(&self, name: &str) -> Cow<'_, Ty> {
        match name {
            "payload" => Cow::Borrowed(self.payload),
            "result" => self.result.map_or(Cow::Owned(Ty::Any), Cow::Borrowed),
            _ => Cow::Owned(Ty::Any),
        }
    }
}

/// The static type of an expression, by lint's typer ([`crate::expr::types`]) with
/// `payload` and `result` typed as `env` says and every other variable unknown.
fn expr_type(e: &Expr, env: &Env) -> Ty {
    crate::expr::types::expr_type(e, env)
}

/// The type of what a value template (a `transform`'s `result`, a `mock`'s `returns`) gives:
/// its structure as written; a string `=expr` is typed by [`expr_type`], knowing nothing of
/// the variables.
fn template_type(node: &YNode) -> Ty {
    use crate::expr::value::{StrValue, classify};
    use crate::syntax::Value as Y;
    match &node.value {
        Y::Null => Ty::Null,
        Y::Bool(_) => Ty::Bool,
        Y::Int(_) => Ty::Int,
        Y::Float(_) => Ty::Double,
        Y::Str(s) => match classify(s) {
            StrValue::Literal(_) => Ty::String,
            StrValue::Expr(text) => match crate::expr::parse(text) {
                Ok(e) => expr_type(
                    &e,
                    &Env {
                        payload: &Ty::Any,
                        result: None,
                    },
                ),
                Err(_) => Ty::Any,
            },
        },
        Y::Seq(items) => Ty::List(Box::new(
            items
                .iter()
                .map(template_type)
                .reduce(|a, b| a.join(&b))
                .unwrap_or(Ty::Any),
        )),
        Y::Map(entries) => Ty::Object(Obj {
            fields: entries
                .iter()
                .map(|(k, v)| {
                    (
                        k.name.clone(),
                        Field {
                            ty: template_type(v),
                            always: true,
                        },
                    )
                })
                .collect(),
            open: false,
        }),
    }
}

/// A schema as JSON: inline, or the loaded file a path names.
pub fn schema_value(cx: &FlowCx, s: &SchemaRef) -> Option<Value> {
    match s {
        SchemaRef::Inline(n) => Some(n.0.to_json()),
        SchemaRef::Path(p) => cx
            .project
            .schema_for(cx.id, &p.value)
            .and_then(|l| l.node.as_ref())
            .map(YNode::to_json),
    }
}

/// Whether an input spec reads the payload through paths (for the checks of its sources).
pub fn input_sources(spec: Option<&InputSpec>) -> &[(crate::model::Sp<String>, Source)] {
    match spec {
        Some(InputSpec::Map(m)) => &m.0,
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn expr(text: &str, payload: &Ty) -> Ty {
        let e = crate::expr::parse(text).expect("valid");
        expr_type(
            &e,
            &Env {
                payload,
                result: None,
            },
        )
    }

    fn segs(keys: &[&str]) -> Vec<Seg> {
        keys.iter().map(|k| Seg::Key((*k).to_owned())).collect()
    }

    #[test]
    fn expressions_have_the_types_of_literals_chains_and_fixed_operators() {
        let p = Ty::of_value(&json!({"a": {"b": 1, "s": "x"}, "l": [1.5]}));
        assert_eq!(expr("1", &p), Ty::Int);
        assert_eq!(expr("'x'", &p), Ty::String);
        assert_eq!(expr("payload.a.b", &p), Ty::Int);
        assert_eq!(expr("payload.l", &p), Ty::List(Box::new(Ty::Double)));
        assert_eq!(expr("payload.a.b == 2 || false", &p), Ty::Bool);
        assert_eq!(expr("has(payload.a.c)", &p), Ty::Bool);
        assert_eq!(expr("payload.a.b + 1", &p), Ty::Int);
        assert_eq!(expr("payload.a.b * 1", &p), Ty::Int);
        assert_eq!(
            expr("payload.a.s.upperAscii().split(' ')", &p),
            Ty::List(Box::new(Ty::String))
        );
        assert_eq!(expr("payload.a.b + 0.5", &p), Ty::Double);
        assert_eq!(expr("payload.a.s + 'y'", &p), Ty::String);
        assert_eq!(expr("true ? 1 : 'x'", &p), Ty::Union(vec![Ty::Int, Ty::String]));
        assert_eq!(expr("payload.zzz", &p), Ty::Any);
        assert_eq!(expr("payload.x", &Ty::Any), Ty::Any);
        assert_eq!(expr("{'k': [1, 2]}", &p), Ty::of_value(&json!({"k": [1, 2]})));
        assert_eq!(expr("[payload.a.s]", &p), Ty::List(Box::new(Ty::String)));
    }

    #[test]
    fn paths_find_fields_list_elements_or_nothing() {
        let t = Ty::of_value(&json!({"a": {"b": [{"c": true}]}}));
        assert_eq!(
            type_at_segs(&t, &segs(&["a", "b"])),
            At::Found(Ty::of_value(&json!([{"c": true}])), true)
        );
        let mut p = segs(&["a", "b"]);
        p.push(Seg::Index(0));
        p.push(Seg::Key("c".into()));
        assert_eq!(type_at_segs(&t, &p), At::Found(Ty::Bool, false));
        assert_eq!(type_at_segs(&t, &segs(&["a", "x"])), At::Never);
        assert_eq!(type_at_segs(&t, &segs(&["a", "b", "c"])), At::Never);
        assert_eq!(type_at_segs(&Ty::Any, &segs(&["a"])), At::Unknown);
        assert_eq!(type_at_segs(&Ty::open_object(), &segs(&["a"])), At::Unknown);
    }

    #[test]
    fn queries_are_followed_as_far_as_their_plain_segments_go() {
        assert_eq!(
            query_prefix("$.a[*].b"),
            (
                vec![PSeg::Key("a".into()), PSeg::All, PSeg::Key("b".into())],
                true
            )
        );
        assert_eq!(
            query_prefix("$.a.*[2]"),
            (vec![PSeg::Key("a".into()), PSeg::All, PSeg::Index(2)], true)
        );
        assert_eq!(
            query_prefix("$.a[?@.x > 1].b"),
            (vec![PSeg::Key("a".into())], false)
        );
        assert_eq!(query_prefix("$..a"), (vec![], false));
        let t = Ty::of_value(&json!({"pages": [{"text": "x"}]}));
        let mut parsed = ParseCache::new();
        assert_eq!(
            path_type(&t, "$.pages[*].text", &mut parsed),
            Ty::List(Box::new(Ty::String))
        );
        assert_eq!(
            path_type(&t, "$.pages[?@.text].text", &mut parsed),
            Ty::List(Box::new(Ty::Any))
        );
        let p = read_path(&mut parsed, "$.pagez[*].text").expect("parses");
        assert_eq!(type_at(&t, &p.segs), At::Never);
    }

    #[test]
    fn writes_create_objects_and_merges_keep_what_was_there() {
        let mut t = Ty::Any;
        write_at(&mut t, &segs(&["a", "b"]), Ty::Int);
        assert_eq!(type_at_segs(&t, &segs(&["a", "b"])), At::Found(Ty::Int, true));
        assert_eq!(type_at_segs(&t, &segs(&["z"])), At::Unknown);
        let mut m = Ty::of_value(&json!({"r": {"x": 1}}));
        merge_at(&mut m, &segs(&["r"]), &Ty::of_value(&json!({"y": "s"})));
        assert_eq!(type_at_segs(&m, &segs(&["r", "x"])), At::Found(Ty::Int, true));
        assert_eq!(type_at_segs(&m, &segs(&["r", "y"])), At::Found(Ty::String, true));
        // Writing through an element of a list keeps the list.
        let mut l = Ty::of_value(&json!({"l": [{"a": 1}]}));
        let mut p = segs(&["l"]);
        p.push(Seg::Index(0));
        p.push(Seg::Key("a".into()));
        write_at(&mut l, &p, Ty::String);
        assert_eq!(
            type_at_segs(&l, &segs(&["l"])),
            At::Found(
                Ty::List(Box::new(Ty::Object(Obj {
                    fields: [(
                        "a".to_owned(),
                        Field {
                            ty: Ty::Union(vec![Ty::Int, Ty::String]),
                            always: true
                        }
                    )]
                    .into_iter()
                    .collect(),
                    open: false
                }))),
                true
            )
        );
    }
}
