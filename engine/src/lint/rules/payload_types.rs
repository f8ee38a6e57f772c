//! Reads of the payload against its type where they are written (SPEC §5.1, "Types flow
//! through the graph"): a `payload.x.y` read that cannot exist on the path to it (SY412), one
//! that is only maybe there without a `has()` guard (SY413, warning), and a mapping, `foreach`
//! or `select` source path, or an `input` filter path, that can never match (SY414).
//!
//! The types come from [`crate::lint::flow_types::walk`]; where a type says nothing (no
//! schema, an agent without `result_schema`, an open object), nothing is reported.
//!
//! **The guard rule** (SY413): `has(payload.a.b)` anywhere in an expression guards the
//! presence of `b` in every read of `payload.a.b` and below it (`payload.a.b.c`) in that
//! expression; `a` must still be there, and `c`, where it may be absent, needs a guard of its
//! own (`has(payload.a.b.c)`). `payload.a.m != null` guards the fields of `m` the same way:
//! a value that may be null has its fields once tested not null. Templates are checked for SY412 only: Jinja has its own
//! guards (`is defined`, `default`).

use std::borrow::Cow;

use cel::common::ast::{EntryExpr, Expr as Node, LiteralValue};
use cel::parser::Expression;

use crate::expr::cache::ParseCache;

use crate::diag::{Diagnostic, closest, codes};
use crate::expr::ty::Ty;
use crate::expr::types::Scope;
use crate::lint::FlowCx;
use crate::lint::flow_types::{self, After, Before, FieldOf, PSeg, Visit};
use crate::lint::rules::data::inner_span;
use crate::lint::rules::expression_types;
use crate::model::{InputSpec, Next, OutputSpec, Source, Sp, StepKind};
use crate::source::Span;
use crate::syntax::str_sub_span;

/// How many field names the help lists when none is close.
const MAX_NAMES: usize = 12;

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>, parsed: &mut ParseCache) {
    let mut rule = Rule { cx, out: &mut *out };
    let end = flow_types::walk(cx, parsed, &mut rule);
    if let (Some(end), Some(sel)) = (end, cx.flow.output.as_ref().and_then(|o| o.select.as_ref())) {
        Checker {
            cx,
            out,
            parsed,
            item: None,
        }
        .path(sel, &end, Doc::Final);
    }
}

/// The rule, as the type flow's visitor.
struct Rule<'a, 'p> {
    cx: &'a FlowCx<'p>,
    out: &'a mut Vec<Diagnostic>,
}

impl Visit for Rule<'_, '_> {
    fn before(&mut self, b: &Before, parsed: &mut ParseCache) {
        Checker {
            cx: self.cx,
            out: self.out,
            parsed,
            item: None,
        }
        .before(b);
    }

    fn after(&mut self, a: &After, parsed: &mut ParseCache) {
        Checker {
            cx: self.cx,
            out: self.out,
            parsed,
            item: None,
        }
        .after(a);
    }
}

struct Checker<'a, 'p> {
    cx: &'a FlowCx<'p>,
    out: &'a mut Vec<Diagnostic>,
    parsed: &'a mut ParseCache,
    /// The `foreach` item's name and type, while the step's input is checked.
    item: Option<(String, Ty)>,
}

/// The variables of an expression as this rule types them: `payload` by the type flow, and
/// in a `foreach` step's input the item (and `index`) by what the payload's collection holds;
/// the others unknown. Static `payload` chains are this rule's own (SY412, SY413).
struct PayloadScope<'a>(&'a Ty, Option<&'a (String, Ty)>);

impl Scope for PayloadScope<'_> {
    fn var(&self, name: &str) -> Cow<'_, Ty> {
        match (name, self.1) {
            ("payload", _) => Cow::Borrowed(self.0),
            (_, Some((item, ty))) if item == name => Cow::Borrowed(ty),
            ("index", Some(_)) => Cow::Owned(Ty::Int),
            _ => Cow::Owned(Ty::Any),
        }
    }

    fn chains_checked(&self, name: &str) -> bool {
        name == "payload"
    }
}

/// What a source path is read from, for messages.
#[derive(Clone, Copy)]
enum Doc<'a> {
    Payload,
    /// The payload a successful run ends with (`output.select`).
    Final,
    /// The result of the named step (its agent's, or a `parallel` branch's).
    Result(&'a str),
}

impl Checker<'_, '_> {
    /// Everything a step reads before it finishes.
    fn before(&mut self, t: &Before) {
        let step = t.step;
        let id = step.id.value.as_str();
        let l = &step.looping;
        if let Some(f) = &l.foreach {
            self.source_text(f, t.entry, t.entry, Doc::Payload);
        }
        if let Some(s) = &l.select {
            self.path(s, t.agent_result, Doc::Result(id));
        }
        if let Some(w) = &l.while_
            && let Some(e) = w.value.strip_prefix('=')
        {
            self.expr(w.span, &w.value, e, 1, t.during, Some("while"));
        }
        if let Some(m) = &step.message {
            self.template(m, t.during);
        }
        match &step.kind {
            StepKind::Agent(_) | StepKind::Interrupt(_) => {
                let scoped = self.scoped(step.scope.as_ref(), t.during);
                if let Some(f) = &l.foreach {
                    self.item = Some((
                        l.as_name.as_ref().map_or("item", |a| a.value.as_str()).to_owned(),
                        self.item_type(&f.value, t.entry),
                    ));
                }
                self.input(step.input.as_ref(), t.during, &scoped);
                self.item = None;
                if let StepKind::Interrupt(i) = &step.kind
                    && let Some(p) = &i.prompt
                {
                    // The prompt's `input` is the step's input document: the (scoped) payload
                    // when `input` is omitted or `"*"`.
                    let doc = matches!(step.input, None | Some(InputSpec::All(_))).then_some(&*scoped);
                    self.template_with(p, t.during, doc);
                }
                self.output(step.output.as_ref(), t.during, t.result, id);
            }
            StepKind::Set(m) => {
                for (_, src) in &m.0 {
                    self.source(src, t.entry, t.entry, Doc::Payload);
                }
            }
            StepKind::Parallel(branches) => {
                for (b, r) in branches.values().zip(t.branches) {
                    if let Some(m) = &b.message {
                        self.template(m, t.entry);
                    }
                    let scoped = self.scoped(b.scope.as_ref(), t.entry);
                    self.input(b.input.as_ref(), t.entry, &scoped);
                    self.output(b.output.as_ref(), t.entry, r, id);
                }
            }
            StepKind::Fail(f) => {
                if let Some(m) = &f.message {
                    self.template(m, t.entry);
                }
            }
            StepKind::Succeed(_) => {}
        }
    }

    /// The edges' conditions, each against the payload of the outcome it is taken on.
    fn after(&mut self, t: &After) {
        if let Some(Next::Edges(edges)) = &t.step.next {
            for e in edges {
                if let Some(c) = &e.if_ {
                    let text = c.value.strip_prefix('=').unwrap_or(&c.value);
                    let offset = c.value.len() - text.len();
                    let payload = t.on_edge(e);
                    self.expr(c.span, &c.value, text, offset, &payload, Some("if"));
                }
            }
        }
    }

    /// The type of an item of the collection a `foreach` source (a path or `=expression`)
    /// gives over the payload `entry`.
    fn item_type(&mut self, source: &str, entry: &Ty) -> Ty {
        if entry.is_any() {
            return Ty::Any;
        }
        let list = match source.strip_prefix('=') {
            Some(e) => match &self.parsed.expr(e).expr {
                Ok(e) => crate::expr::types::expr_type(e, &PayloadScope(entry, None)),
                Err(_) => Ty::Any,
            },
            None => flow_types::path_type(entry, source, self.parsed),
        };
        crate::expr::types::element_of(&list)
    }

    /// The part of the payload a `scope` narrows the agent to (unknown when the scope path
    /// is not a plain one, or has nothing known there).
    fn scoped<'t>(&mut self, scope: Option<&Sp<String>>, payload: &'t Ty) -> Cow<'t, Ty> {
        let Some(s) = scope else {
            return Cow::Borrowed(payload);
        };
        Cow::Owned(match flow_types::segs_of(self.parsed, &s.value) {
            Some(segs) => match flow_types::type_at_segs(payload, &segs) {
                flow_types::At::Found(t, _) => t,
                _ => Ty::Any,
            },
            None => Ty::Any,
        })
    }

    fn input(&mut self, spec: Option<&InputSpec>, payload: &Ty, doc: &Ty) {
        match spec {
            // A filter path that matches nothing is a `mapping` error too.
            Some(InputSpec::Paths(paths)) => paths.iter().for_each(|p| self.path(p, doc, Doc::Payload)),
            _ => {
                for (_, src) in flow_types::input_sources(spec) {
                    self.source(src, doc, payload, Doc::Payload);
                }
            }
        }
    }

    fn output(&mut self, spec: Option<&OutputSpec>, payload: &Ty, result: &Ty, id: &str) {
        if let Some(OutputSpec::Map(m)) = spec {
            for (_, src) in &m.0 {
                self.source(src, result, payload, Doc::Result(id));
            }
        }
    }

    /// A mapping source: a path over `doc`, or an expression reading `payload`.
    fn source(&mut self, src: &Source, doc: &Ty, payload: &Ty, what: Doc) {
        match src {
            Source::Text(t) => self.source_text(t, doc, payload, what),
            // A path with a default is expected to match nothing at times.
            Source::WithDefault { .. } => {}
            Source::Literal { .. } => {}
        }
    }

    fn source_text(&mut self, t: &Sp<String>, doc: &Ty, payload: &Ty, what: Doc) {
        match t.value.strip_prefix('=') {
            Some(e) => self.expr(t.span, &t.value, e, 1, payload, None),
            None => self.path(t, doc, what),
        }
    }

    /// SY414: a source path that no value of `doc`'s type has anything at.
    fn path(&mut self, p: &Sp<String>, doc: &Ty, what: Doc) {
        let Some(rp) = flow_types::read_path(self.parsed, &p.value) else {
            return;
        };
        let mut cur = Cow::Borrowed(doc);
        let mut shown = String::from("$");
        for s in &rp.segs {
            let (why, key, names) = match s {
                PSeg::Key(k) => match flow_types::field_of(cur.clone(), k) {
                    FieldOf::Unknown => return,
                    FieldOf::Field(ty, _) => {
                        cur = ty;
                        push_key(&mut shown, k);
                        continue;
                    }
                    FieldOf::Missing(names) => (format!("`{shown}` has no field `{k}`"), k.as_str(), names),
                    FieldOf::NotObject => {
                        (format!("`{shown}` is {}, not an object", a(&cur)), "", Vec::new())
                    }
                },
                PSeg::Index(_) | PSeg::All => match flow_types::list_element(&cur) {
                    Some(Some(e)) => {
                        cur = Cow::Owned(e);
                        match s {
                            PSeg::Index(n) => shown.push_str(&format!("[{n}]")),
                            _ => shown.push_str("[*]"),
                        }
                        continue;
                    }
                    Some(None) => return,
                    None if *s == PSeg::All && matches!(*cur, Ty::Object(_)) => return,
                    None => (format!("`{shown}` is {}, not a list", a(&cur)), "", Vec::new()),
                },
            };
            let whose = match what {
                Doc::Payload => "the payload here".to_owned(),
                Doc::Final => "the final payload".to_owned(),
                Doc::Result(id) => format!("the result of `{id}`"),
            };
            let span = str_sub_span(p.span, &p.value, self.cx.text, 0, p.value.len());
            let mut d = Diagnostic::new(
                &codes::SOURCE_NEVER_MATCHES,
                span,
                format!("`{}` can never match {whose}: {why}", p.value),
            )
            .label("matches nothing");
            if let Some(h) = help(key, &names) {
                d = d.help(h);
            }
            self.out.push(d);
            return;
        }
    }

    /// SY412 and SY413 for the `payload` reads of the expression `text`, which is `value`
    /// (the YAML string at `span`) from byte `offset` on.
    /// The `payload` reads of an expression against the payload's type, and the expression's
    /// types with `payload` typed (SY415–SY417 where only the payload's type tells: the other
    /// variables are unknown here, and were checked with their own types by `data.rs`). `cond`
    /// names the field of a condition (`if`, `while`), which must be a boolean.
    fn expr(&mut self, span: Span, value: &str, text: &str, offset: usize, payload: &Ty, cond: Option<&str>) {
        if payload.is_any() {
            return;
        }
        let parsed = self.parsed.expr(text);
        let Ok(e) = &parsed.expr else { return };
        let source = self.cx.text;
        let span_of = |start: usize, end: usize| inner_span(span, value, source, offset, start, end);
        let ty = expression_types::check(e, &PayloadScope(payload, self.item.as_ref()), &span_of, self.out);
        if let Some(key) = cond {
            expression_types::condition(key, &ty, span_of(0, text.len()), self.out);
        }
        let mut guards = Vec::new();
        has_guards(e.ast(), &mut guards);
        for r in &parsed.refs {
            if r.root != "payload" {
                continue;
            }
            // The fields whose presence a guard on a prefix of the chain tests.
            let guarded: Vec<usize> = guards
                .iter()
                .filter(|g| g.field < r.fields.len() && r.fields[..g.chain.len()] == g.chain[..])
                .map(|g| g.field)
                .collect();
            let ref_text = &text[r.start..r.end];
            let at = |k: usize| {
                let end = r.start + chain_end(ref_text, k + 1);
                str_sub_span(span, value, self.cx.text, offset + r.start, offset + end)
            };
            self.chain(&r.fields, payload, Some(&guarded), &at);
        }
    }

    /// SY412 for the `payload` reads of a template.
    fn template(&mut self, t: &Sp<String>, payload: &Ty) {
        self.template_with(t, payload, None);
    }

    /// SY412 for the `payload` reads of a template, and its `input` reads where the input
    /// document's type is `input`.
    fn template_with(&mut self, t: &Sp<String>, payload: &Ty, input: Option<&Ty>) {
        if payload.is_any() {
            return;
        }
        let checked = self.parsed.template_check(&t.value);
        let Ok(info) = &*checked else { return };
        for v in &info.vars {
            let (root, ty) = match (v.root.as_str(), input) {
                ("payload", _) => ("payload", payload),
                ("input", Some(doc)) => ("input", doc),
                _ => continue,
            };
            let ref_text = &t.value[v.start..v.end];
            let at = |k: usize| {
                let end = v.start + chain_end(ref_text, k + 1);
                str_sub_span(t.span, &t.value, self.cx.text, v.start, end)
            };
            self.chain_of(root, &v.fields, ty, None, &at);
        }
    }

    /// Walks `payload.<fields>` through the type. `guarded`: `None` to skip SY413, else the
    /// indexes of the fields a `has()` guards. `at(k)` is the span from `payload` through
    /// field `k`.
    fn chain(
        &mut self,
        fields: &[String],
        payload: &Ty,
        guarded: Option<&[usize]>,
        at: &dyn Fn(usize) -> Span,
    ) {
        self.chain_of("payload", fields, payload, guarded, at);
    }

    /// As [`Checker::chain`], for a chain from the variable `root` of type `of`.
    fn chain_of(
        &mut self,
        root: &str,
        fields: &[String],
        of: &Ty,
        guarded: Option<&[usize]>,
        at: &dyn Fn(usize) -> Span,
    ) {
        let mut cur = Cow::Borrowed(of);
        let mut warned = false;
        let path = |k: usize| {
            let mut p = String::from(root);
            for f in &fields[..k] {
                p.push('.');
                p.push_str(f);
            }
            p
        };
        for (k, f) in fields.iter().enumerate() {
            match flow_types::field_of(cur.clone(), f) {
                FieldOf::Unknown => return,
                FieldOf::Field(ty, always) => {
                    if !always
                        && !warned
                        && let Some(guarded) = guarded
                        && !guarded.contains(&k)
                    {
                        warned = true;
                        let read = format!("{}.{f}", path(k));
                        let help = if cur.members().contains(&Ty::Null) {
                            // `has()` of a field of null is an error: the value is tested first.
                            format!(
                                "`{}` may be null: test `{} != null` before reading its fields",
                                path(k),
                                path(k)
                            )
                        } else {
                            format!(
                                "guard the read with `has({read})`, or write `{}` on every path to here",
                                &read[root.len()..].replacen('.', "$.", 1)
                            )
                        };
                        self.out.push(
                            Diagnostic::new(
                                &codes::MAYBE_ABSENT_FIELD,
                                at(k),
                                format!("`{read}` may be absent here"),
                            )
                            .label("not there on every path to here")
                            .help(help),
                        );
                    }
                    cur = ty;
                }
                FieldOf::Missing(names) => {
                    let mut d = Diagnostic::new(
                        &codes::UNKNOWN_PAYLOAD_FIELD,
                        at(k),
                        format!("`{}` has no field `{f}` on any path to here", path(k)),
                    )
                    .label("no such field");
                    if let Some(h) = help(f, &names) {
                        d = d.help(h);
                    }
                    self.out.push(d);
                    return;
                }
                FieldOf::NotObject => {
                    self.out.push(
                        Diagnostic::new(
                            &codes::UNKNOWN_PAYLOAD_FIELD,
                            at(k),
                            format!("`{}` is {}, it has no field `{f}`", path(k), a(&cur)),
                        )
                        .label("not an object"),
                    );
                    return;
                }
            }
        }
    }
}

/// The help of an unknown field: the closest name, else the names there are.
fn help(name: &str, names: &[String]) -> Option<String> {
    if names.is_empty() {
        return None;
    }
    if let Some(c) = closest(name, names.iter().map(String::as_str)) {
        return Some(format!("did you mean `{c}`?"));
    }
    let mut listed: Vec<String> = names.iter().take(MAX_NAMES).map(|n| format!("`{n}`")).collect();
    if names.len() > MAX_NAMES {
        listed.push("…".into());
    }
    Some(format!("fields here: {}", listed.join(", ")))
}

/// Appends `.k` (or `['k']`) to a path being shown.
fn push_key(shown: &mut String, k: &str) {
    if k.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        shown.push('.');
        shown.push_str(k);
    } else {
        shown.push_str(&format!("['{}']", k.replace('\\', "\\\\").replace('\'', "\\'")));
    }
}

/// `a string`, `an integer`, `a list of string`.
fn a(t: &Ty) -> String {
    let d = t.describe();
    format!("{} {d}", crate::diag::article(&d))
}

/// A test in an expression that guards the presence of field `field` (an index into a
/// `payload` chain) in reads of `payload.<chain>` and below.
#[derive(Debug, PartialEq)]
struct Guard {
    chain: Vec<String>,
    field: usize,
}

/// The `payload` fields an expression tests before reading them: `has(payload.a.b)` guards
/// `b`, and `payload.a.m != null` (or `null != payload.a.m`) guards the fields of `m` (a value
/// that is an object or null has its fields once it is not null).
fn has_guards(e: &Expression, out: &mut Vec<Guard>) {
    match &e.expr {
        Node::Select(s) => {
            if s.test {
                let mut chain = if matches!(&s.operand.expr, Node::Ident(n) if n == "payload") {
                    Some(Vec::new())
                } else {
                    payload_chain(&s.operand)
                };
                if let Some(chain) = &mut chain {
                    chain.push(s.field.clone());
                    let field = chain.len() - 1;
                    out.push(Guard {
                        chain: std::mem::take(chain),
                        field,
                    });
                }
            }
            has_guards(&s.operand, out);
        }
        Node::Call(c) => {
            if c.func_name == "_!=_"
                && let [a, b] = &c.args[..]
            {
                let null = |x: &Expression| matches!(&x.expr, Node::Literal(LiteralValue::Null));
                let tested = if null(b) {
                    Some(a)
                } else if null(a) {
                    Some(b)
                } else {
                    None
                };
                if let Some(chain) = tested.and_then(payload_chain) {
                    let field = chain.len();
                    out.push(Guard { chain, field });
                }
            }
            if let Some(t) = &c.target {
                has_guards(t, out);
            }
            c.args.iter().for_each(|a| has_guards(a, out));
        }
        Node::Comprehension(c) => {
            for x in [&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result] {
                has_guards(x, out);
            }
        }
        Node::List(l) => l.elements.iter().for_each(|x| has_guards(x, out)),
        Node::Map(m) => {
            for entry in &m.entries {
                if let EntryExpr::MapEntry(me) = &entry.expr {
                    has_guards(&me.key, out);
                    has_guards(&me.value, out);
                }
            }
        }
        Node::Struct(s) => {
            for entry in &s.entries {
                if let EntryExpr::StructField(f) = &entry.expr {
                    has_guards(&f.value, out);
                }
            }
        }
        Node::Ident(_) | Node::Literal(_) | Node::Unspecified => {}
    }
}

/// The fields of `e` when it is a selection chain `payload.a.b` (no `has()` in it).
fn payload_chain(e: &Expression) -> Option<Vec<String>> {
    let mut fields = Vec::new();
    let mut cur = e;
    while let Node::Select(s) = &cur.expr {
        if s.test {
            return None;
        }
        fields.push(s.field.clone());
        cur = &s.operand;
    }
    if fields.is_empty() || !matches!(&cur.expr, Node::Ident(n) if n == "payload") {
        return None;
    }
    fields.reverse();
    Some(fields)
}

/// The end (in bytes of `text`, a chain `root . a . b ...` as written) of the root and its
/// first `fields` selections.
fn chain_end(text: &str, fields: usize) -> usize {
    let b = text.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() && ident(b[i]) {
        i += 1;
    }
    let mut end = i;
    for _ in 0..fields {
        while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b'.') {
            i += 1;
        }
        while i < b.len() && ident(b[i]) {
            i += 1;
        }
        end = i;
    }
    end.max(1).min(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_ends_after_the_nth_field() {
        assert_eq!(chain_end("payload.a.bc", 0), 7);
        assert_eq!(chain_end("payload.a.bc", 1), 9);
        assert_eq!(chain_end("payload.a.bc", 2), 12);
        assert_eq!(chain_end("payload . a .\n b", 2), 16);
    }

    #[test]
    fn has_guards_are_the_chains_tested() {
        let e = crate::expr::parse("has(payload.a.b) && payload.a.b.c > 0 || has(input.x)").unwrap();
        let mut g = Vec::new();
        has_guards(e.ast(), &mut g);
        assert_eq!(
            g,
            vec![Guard {
                chain: vec!["a".to_owned(), "b".to_owned()],
                field: 1
            }]
        );
        let e = crate::expr::parse("null != payload.a.m && payload.a.m.x > 0").unwrap();
        let mut g = Vec::new();
        has_guards(e.ast(), &mut g);
        assert_eq!(
            g,
            vec![Guard {
                chain: vec!["a".to_owned(), "m".to_owned()],
                field: 2
            }]
        );
    }
}
