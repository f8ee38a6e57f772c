//! The static type of a CEL expression, given the types of its variables (SPEC §5.1, "Types
//! flow through the graph"), and the type problems found on the way: comparisons that can never
//! be true, arithmetic CEL has no operator for, fields a known object does not have.
//!
//! Types are [`Ty`]s. What lint cannot say is [`Ty::Any`], and nothing is reported about it: a
//! problem needs both sides known. Arithmetic follows CEL, with the project's one extension:
//! an integer with a double computes in double. `timestamp()`, `duration()` and their
//! accessors are [`Ty::Any`] for now.

use std::borrow::Cow;

use cel::common::ast::{EntryExpr, Expr as Node, LiteralValue};
use cel::parser::Expression;
use indexmap::IndexMap;

use crate::expr::ty::{Field, Lookup, Obj, Ty};
use crate::expr::{Expr, Macro, macro_of};

/// The types of the variables an expression may read.
pub trait Scope {
    /// The type of variable `name` ([`Ty::Any`] when unknown or not in scope).
    fn var(&self, name: &str) -> Cow<'_, Ty>;

    /// The type of `name.field`, for variables whose fields are cheaper to give one at a time
    /// than the whole (`steps.<id>`). `None`: the field of [`Scope::var`].
    fn member(&self, _name: &str, _field: &str) -> Option<Cow<'_, Ty>> {
        None
    }

    /// Whether the static field chains of variable `name` (`name.a.b`) are checked elsewhere
    /// (lint's variable references), so that missing fields on them are not reported again.
    fn chains_checked(&self, _name: &str) -> bool {
        false
    }
}

impl<F: Fn(&str) -> Ty> Scope for F {
    fn var(&self, name: &str) -> Cow<'_, Ty> {
        Cow::Owned(self(name))
    }
}

/// What is wrong at one place of an expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProblemKind {
    /// `==`, `!=`, `in` between types that are never equal, or ordering CEL cannot do.
    NeverTrue,
    /// Arithmetic with no CEL operator for its operand types.
    Arithmetic,
    /// An operand of `&&`, `||` or `!`, or the condition of `?:`, that is never a boolean.
    NotBool,
    /// A field a known object does not have, or a field of a value that is not an object,
    /// after an index, a call or on a comprehension variable (static chains from a variable are
    /// checked by the variable references).
    UnknownField,
    /// An argument whose type is known and is not one the function takes (`file(1)`).
    ArgumentType,
}

/// A type problem: `start..end` are bytes of the expression text (the operator, or the field
/// name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub kind: ProblemKind,
    pub start: usize,
    pub end: usize,
    pub message: String,
    pub label: String,
    pub help: String,
}

/// The static type of `expr` with its variables typed by `scope`.
pub fn expr_type(expr: &Expr, scope: &dyn Scope) -> Ty {
    let mut t = Typer {
        scope,
        bound: Vec::new(),
        found: Vec::new(),
    };
    t.ty(expr.ast())
}

/// [`expr_type`], and every type problem of `expr`, in source order.
pub fn check(expr: &Expr, scope: &dyn Scope) -> (Ty, Vec<Problem>) {
    let mut t = Typer {
        scope,
        bound: Vec::new(),
        found: Vec::new(),
    };
    let ty = t.ty(expr.ast());
    if t.found.is_empty() {
        return (ty, Vec::new());
    }
    let spans = expr.node_spans();
    let mut problems: Vec<Problem> = t
        .found
        .into_iter()
        .map(|f| {
            let (mut start, end) = spans
                .binary_search_by_key(&f.id, |s| s.0)
                .map_or((0, expr.text().len()), |i| (spans[i].1, spans[i].2));
            if f.kind == ProblemKind::NotBool {
                // An operand's span is its last field name: widen it to the chain it ends.
                start = chain_start(expr.text(), start);
            }
            Problem {
                kind: f.kind,
                start,
                end,
                message: f.message,
                label: f.label,
                help: f.help,
            }
        })
        .collect();
    problems.sort_by_key(|p| (p.start, p.end));
    problems.dedup();
    (ty, problems)
}

/// The start of the `a.b.c` chain whose last name starts at byte `at` of `text` (`at` itself
/// when nothing written before it belongs to the chain, as after a call or an index).
fn chain_start(text: &str, at: usize) -> usize {
    let before = &text.as_bytes()[..at];
    let start = before
        .iter()
        .rposition(|&c| !(c.is_ascii_alphanumeric() || c == b'_' || c == b'.'))
        .map_or(0, |i| i + 1);
    // After `f(x).` or `m[0].` only the name itself is the operand's own text.
    let chain = &text[start..at];
    if chain.is_empty() || chain.starts_with('.') || chain.starts_with(|c: char| c.is_ascii_digit()) {
        at
    } else {
        start
    }
}

/// A problem at the AST node `id`, before its span is known.
struct Found {
    id: u64,
    kind: ProblemKind,
    message: String,
    label: String,
    help: String,
}

struct Typer<'s> {
    scope: &'s dyn Scope,
    /// Comprehension variables in scope, innermost last.
    bound: Vec<(String, Ty)>,
    found: Vec<Found>,
}

impl Typer<'_> {
    fn ty(&mut self, e: &Expression) -> Ty {
        match &e.expr {
            Node::Literal(l) => match l {
                LiteralValue::Boolean(_) => Ty::Bool,
                LiteralValue::Int(_) | LiteralValue::UInt(_) => Ty::Int,
                LiteralValue::Double(_) => Ty::Double,
                LiteralValue::String(_) => Ty::String,
                LiteralValue::Null => Ty::Null,
                LiteralValue::Bytes(_) => Ty::Any,
            },
            Node::Ident(name) => self.ident(name),
            Node::Select(s) => {
                if s.test {
                    // `has(x.f)`: the operand is read, the field only tested.
                    self.ty(&s.operand);
                    return Ty::Bool;
                }
                if let Some(t) = self.plain_chain(e) {
                    return t;
                }
                if let Node::Ident(root) = &s.operand.expr
                    && !self.is_bound(root)
                    && let Some(t) = self.scope.member(root, &s.field)
                {
                    return t.into_owned();
                }
                let operand = self.ty(&s.operand);
                let rooted = self.rooted(&s.operand);
                let name = chain_name(&s.operand);
                self.field(e.id, &operand, &s.field, rooted, name.as_deref())
            }
            Node::List(l) => Ty::List(Box::new(
                l.elements
                    .iter()
                    .map(|x| self.ty(x))
                    .reduce(|a, b| a.join(&b))
                    .unwrap_or(Ty::Any),
            )),
            Node::Map(m) => {
                let mut fields = IndexMap::new();
                let mut open = false;
                // A map whose keys are not (known to be) strings is no JSON object: `Ty` has
                // no type for it (`1 in {1: 'a'}` is true), so nothing is said of it. Nor are
                // the keys of an empty map known (`7 in {}` is false, not a type error).
                let mut other_keys = m.entries.is_empty();
                for entry in &m.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(me) => {
                            other_keys |= self.ty(&me.key) != Ty::String;
                            let value = self.ty(&me.value);
                            match &me.key.expr {
                                Node::Literal(LiteralValue::String(k)) if !me.optional => {
                                    fields.insert(
                                        k.inner().to_owned(),
                                        Field {
                                            ty: value,
                                            always: true,
                                        },
                                    );
                                }
                                _ => open = true,
                            }
                        }
                        EntryExpr::StructField(f) => {
                            self.ty(&f.value);
                            open = true;
                        }
                    }
                }
                if other_keys {
                    Ty::Any
                } else if open {
                    Ty::open_object()
                } else {
                    Ty::Object(Obj { fields, open: false })
                }
            }
            Node::Struct(s) => {
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        self.ty(&f.value);
                    }
                }
                Ty::Any
            }
            Node::Comprehension(c) => {
                let range = self.ty(&c.iter_range);
                let Some(m) = macro_of(c) else { return Ty::Any };
                let depth = self.bound.len();
                match &c.iter_var2 {
                    None => self.bound.push((c.iter_var.clone(), element_of(&range))),
                    Some(v) => {
                        self.bound.push((c.iter_var.clone(), key_of(&range)));
                        self.bound.push((v.clone(), value_of(&range)));
                    }
                }
                let out = match m {
                    Macro::All(p) | Macro::Exists(p) | Macro::ExistsOne(p) => {
                        self.ty(p);
                        Ty::Bool
                    }
                    Macro::Map { filter, transform } => {
                        if let Some(f) = filter {
                            self.ty(f);
                        }
                        Ty::List(Box::new(self.ty(transform)))
                    }
                    // A map whose keys may not be strings (a list's indexes, or whatever
                    // entries the transform makes) has no `Ty`: nothing is said of it.
                    Macro::TransformMap {
                        filter, transform, ..
                    } => {
                        if let Some(f) = filter {
                            self.ty(f);
                        }
                        self.ty(transform);
                        Ty::Any
                    }
                };
                self.bound.truncate(depth);
                out
            }
            Node::Call(call) => {
                let target = call.target.as_ref().map(|t| self.ty(t));
                let args: Vec<Ty> = call.args.iter().map(|a| self.ty(a)).collect();
                if call.target.is_none() {
                    self.logic_operands(&call.func_name, &call.args, &args);
                }
                self.call(e.id, &call.func_name, target.as_ref(), &args)
            }
            Node::Unspecified => Ty::Any,
        }
    }

    fn is_bound(&self, name: &str) -> bool {
        self.bound.iter().any(|(n, _)| n == name)
    }

    fn ident(&self, name: &str) -> Ty {
        match self.bound.iter().rev().find(|(n, _)| n == name) {
            Some((_, t)) => t.clone(),
            None => self.scope.var(name).into_owned(),
        }
    }

    /// The type of a variable followed by field selections (`input.ticket.id`) that all
    /// exist, walked without copying the types on the way; `None` when the chain is not one,
    /// or a field is not found (the general path then says why).
    fn plain_chain(&self, e: &Expression) -> Option<Ty> {
        let mut fields: Vec<&str> = Vec::new();
        let mut cur = e;
        let root = loop {
            match &cur.expr {
                Node::Select(s) if !s.test => {
                    fields.push(&s.field);
                    cur = &s.operand;
                }
                Node::Ident(name) => break name.as_str(),
                _ => return None,
            }
        };
        fields.reverse();
        let base: Cow<'_, Ty> = match self.bound.iter().rev().find(|(n, _)| n == root) {
            Some((_, t)) => Cow::Borrowed(t),
            None => match self.scope.member(root, fields[0]) {
                Some(t) => {
                    fields.remove(0);
                    t
                }
                None => self.scope.var(root),
            },
        };
        let mut ty: &Ty = &base;
        for f in fields {
            match ty {
                Ty::Any => return Some(Ty::Any),
                Ty::Object(o) => match o.fields.get(f) {
                    Some(field) => ty = &field.ty,
                    None if o.open => return Some(Ty::Any),
                    None => return None,
                },
                _ => return None,
            }
        }
        Some(ty.clone())
    }

    /// Whether `e` is a variable read outside any comprehension, followed only by field
    /// selections, whose chains the scope says are checked already.
    fn rooted(&self, e: &Expression) -> bool {
        let mut cur = e;
        loop {
            match &cur.expr {
                Node::Select(s) if !s.test => cur = &s.operand,
                Node::Ident(name) => return !self.is_bound(name) && self.scope.chains_checked(name),
                _ => return false,
            }
        }
    }

    /// Field `name` of a value of type `of`; reports one that cannot be there unless the
    /// selection is part of a variable's static chain.
    fn field(&mut self, id: u64, of: &Ty, name: &str, rooted: bool, chain: Option<&str>) -> Ty {
        match of.field(name) {
            Lookup::Field { ty, .. } => ty,
            Lookup::Unknown => Ty::Any,
            Lookup::Missing { names } => {
                if !rooted {
                    let help = match crate::diag::did_you_mean(name, names.iter().copied()) {
                        Some(h) => h,
                        None => format!(
                            "its fields are: {}",
                            names
                                .iter()
                                .map(|n| format!("`{n}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    };
                    self.found.push(Found {
                        id,
                        kind: ProblemKind::UnknownField,
                        message: match chain {
                            Some(c) => format!("`{c}` has no field `{name}`"),
                            None => format!("no field `{name}` in this object"),
                        },
                        label: "unknown field".into(),
                        help,
                    });
                }
                Ty::Any
            }
            Lookup::NotObject => {
                if !rooted {
                    let help = if matches!(of, Ty::List(_)) {
                        format!("take an element first (`[0].{name}`) or map the list (`.map(x, x.{name})`)")
                    } else {
                        "only objects have fields".to_string()
                    };
                    self.found.push(Found {
                        id,
                        kind: ProblemKind::UnknownField,
                        message: match chain {
                            Some(c) => format!("`{c}` is {}: it has no field `{name}`", of.describe()),
                            None => format!("no field `{name}` on a value of type {}", of.describe()),
                        },
                        label: "not an object".into(),
                        help,
                    });
                }
                Ty::Any
            }
        }
    }

    fn call(&mut self, id: u64, func: &str, target: Option<&Ty>, args: &[Ty]) -> Ty {
        match (func, target, args) {
            ("_==_" | "_!=_", None, [a, b]) => {
                if !a.can_equal(b) {
                    let always = if func == "_==_" {
                        "never true"
                    } else {
                        "always true"
                    };
                    let op = &func[1..func.len() - 1];
                    self.found.push(Found {
                        id,
                        kind: ProblemKind::NeverTrue,
                        message: format!("`{op}` between {} and {} is {always}", a.describe(), b.describe()),
                        label: "never equal".into(),
                        help: convert_help(a, b),
                    });
                }
                Ty::Bool
            }
            ("_<_" | "_<=_" | "_>_" | "_>=_", None, [a, b]) => {
                if !can_order(a, b) {
                    let op = &func[1..func.len() - 1];
                    self.found.push(Found {
                        id,
                        kind: ProblemKind::NeverTrue,
                        message: format!("`{op}` cannot order {} and {}", a.describe(), b.describe()),
                        label: "no ordering".into(),
                        help: "CEL orders numbers with numbers, strings with strings and booleans with booleans; convert one side (`int(x)`, `double(x)`, `string(x)`)".into(),
                    });
                }
                Ty::Bool
            }
            ("@in", None, [a, b]) => {
                self.membership(id, a, b);
                Ty::Bool
            }
            ("_+_" | "_-_" | "_*_" | "_/_" | "_%_", None, [a, b]) => {
                let op = &func[1..func.len() - 1];
                match arithmetic(op, a, b) {
                    Some(t) => t,
                    None => {
                        self.found.push(Found {
                            id,
                            kind: ProblemKind::Arithmetic,
                            message: format!(
                                "`{op}` does not apply to {} and {}",
                                a.describe(),
                                b.describe()
                            ),
                            label: "no such operator".into(),
                            help: arithmetic_help(op, a, b),
                        });
                        Ty::Any
                    }
                }
            }
            ("-_", None, [a]) => match a {
                Ty::Int | Ty::Double => a.clone(),
                Ty::Union(m) if m.iter().all(|t| matches!(t, Ty::Int | Ty::Double)) => a.clone(),
                _ => Ty::Any,
            },
            ("!_" | "_&&_" | "_||_" | "@not_strictly_false", None, _) => Ty::Bool,
            ("_?_:_", None, [_, a, b]) => a.join(b),
            ("_[_]", None, [c, i]) => index(c, i),
            ("size", _, _) => Ty::Int,
            ("int" | "uint", None, [_]) => Ty::Int,
            ("double", None, [_]) => Ty::Double,
            ("string", None, [_]) => Ty::String,
            ("bool", None, [_]) => Ty::Bool,
            ("contains" | "startsWith" | "endsWith" | "matches", _, _) => Ty::Bool,
            ("split", Some(_), _) => Ty::List(Box::new(Ty::String)),
            ("join", Some(_), _) => Ty::String,
            (
                "lowerAscii" | "upperAscii" | "replace" | "trim" | "substring" | "charAt" | "format",
                Some(_),
                _,
            ) => Ty::String,
            ("indexOf" | "lastIndexOf", Some(_), _) => Ty::Int,
            ("file", None, [a]) => {
                if !a.is_any() && !a.members().contains(&Ty::String) {
                    self.found.push(Found {
                        id,
                        kind: ProblemKind::ArgumentType,
                        message: format!("`file` takes a path, a string, not {}", a.describe()),
                        label: format!("{} here", a.describe()),
                        help: "pass the path as a string: `file(\"data/scan.png\")`, `file(payload.path)`"
                            .into(),
                    });
                }
                Ty::Any
            }
            _ => Ty::Any,
        }
    }

    /// The operands of `&&`, `||` and `!`, and the condition of `?:`, that are known and can
    /// never be a boolean: CEL has no such operator, and the expression fails at run time
    /// (for `&&`/`||`, whenever the other operand does not decide the result alone).
    fn logic_operands(&mut self, func: &str, args: &[Expression], tys: &[Ty]) {
        let (what, checked) = match func {
            "_&&_" => ("an operand of `&&`", args.len()),
            "_||_" => ("an operand of `||`", args.len()),
            "!_" => ("the operand of `!`", args.len()),
            "_?_:_" => ("the condition of `?:`", 1),
            _ => return,
        };
        for (arg, ty) in args.iter().zip(tys).take(checked) {
            if ty.is_any() || ty.members().contains(&Ty::Bool) {
                continue;
            }
            self.found.push(Found {
                id: arg.id,
                kind: ProblemKind::NotBool,
                message: format!("{what} is {}, not a boolean", ty.describe()),
                label: format!("{} here", ty.describe()),
                help: format!(
                    "CEL does not read other values as true or false; {}",
                    bool_help(ty)
                ),
            });
        }
    }

    /// `a in b`: `b` must be a list whose elements can equal `a`, or a map (its keys are
    /// strings: JSON objects have no others).
    fn membership(&mut self, id: u64, a: &Ty, b: &Ty) {
        if a.is_any() || b.is_any() {
            return;
        }
        let mut containers = false;
        let possible = b.members().iter().any(|m| match m {
            Ty::List(e) => {
                containers = true;
                a.can_equal(e)
            }
            Ty::Object(_) => {
                containers = true;
                a.can_equal(&Ty::String)
            }
            _ => false,
        });
        if possible {
            return;
        }
        let (message, help) = if !containers {
            (
                format!("`in` needs a list or a map on its right, not {}", b.describe()),
                if b.members().contains(&Ty::String) && a.members().contains(&Ty::String) {
                    "to look for a substring, write `s.contains(t)`".to_string()
                } else {
                    "write `x in [a, b]`, or `key in object` for a key".to_string()
                },
            )
        } else if b.members().iter().any(|m| matches!(m, Ty::Object(_))) {
            (
                format!(
                    "`in` never finds {} among the keys of an object (they are strings)",
                    a.describe()
                ),
                "convert the key: `string(x) in m`".to_string(),
            )
        } else {
            (
                format!("`in` never finds {} in a {}", a.describe(), b.describe()),
                convert_help(a, &b.element()),
            )
        };
        self.found.push(Found {
            id,
            kind: ProblemKind::NeverTrue,
            message,
            label: "never true".into(),
            help,
        });
    }
}

/// `a.b.c` for a variable followed by field selections.
fn chain_name(e: &Expression) -> Option<String> {
    match &e.expr {
        Node::Ident(n) => Some(n.clone()),
        Node::Select(s) if !s.test => chain_name(&s.operand).map(|c| format!("{c}.{}", s.field)),
        _ => None,
    }
}

/// What iterating over a value of type `t` gives: a list's elements, a map's keys. (Iterating
/// `null` is an error, not a value: it adds nothing.)
pub fn element_of(t: &Ty) -> Ty {
    members_joined(t, |m| match m {
        Ty::List(e) => Some((**e).clone()),
        Ty::Object(_) => Some(Ty::String),
        _ => None,
    })
}

/// The first variable of a two-variable comprehension over a value of type `t`: a list's
/// index, a map's key.
fn key_of(t: &Ty) -> Ty {
    members_joined(t, |m| match m {
        Ty::List(_) => Some(Ty::Int),
        Ty::Object(_) => Some(Ty::String),
        _ => None,
    })
}

/// The second variable of a two-variable comprehension over a value of type `t`: a list's
/// element, a map's value (the join of its fields' types, when no other field may exist).
fn value_of(t: &Ty) -> Ty {
    members_joined(t, |m| match m {
        Ty::List(e) => Some((**e).clone()),
        Ty::Object(o) if !o.open => o.fields.values().map(|f| f.ty.clone()).reduce(|a, b| a.join(&b)),
        _ => None,
    })
}

/// `c[i]`: a list's element (a map's value by key is not followed).
fn index(c: &Ty, _i: &Ty) -> Ty {
    members_joined(c, |m| match m {
        Ty::List(e) => Some((**e).clone()),
        _ => None,
    })
}

/// The join of `f` over the members of `t`, `null` members left out; [`Ty::Any`] when a member
/// gives `None` or none is left.
fn members_joined(t: &Ty, f: impl Fn(&Ty) -> Option<Ty>) -> Ty {
    let mut out: Option<Ty> = None;
    for m in t.members() {
        if *m == Ty::Null {
            continue;
        }
        let Some(x) = f(m) else { return Ty::Any };
        out = Some(match out {
            None => x,
            Some(o) => o.join(&x),
        });
    }
    out.unwrap_or(Ty::Any)
}

fn is_number(t: &Ty) -> bool {
    matches!(t, Ty::Int | Ty::Double)
}

/// Whether CEL can order some value of `a` against some value of `b`.
fn can_order(a: &Ty, b: &Ty) -> bool {
    a.members().iter().any(|x| {
        b.members().iter().any(|y| match (x, y) {
            (Ty::Any, _) | (_, Ty::Any) => true,
            (x, y) if is_number(x) && is_number(y) => true,
            (Ty::String, Ty::String) | (Ty::Bool, Ty::Bool) => true,
            _ => false,
        })
    })
}

/// The type of `a op b` (`op` one of `+ - * / %`), or `None` when no pair of their members
/// has an operator. Integers with integers stay integers; a double on either side makes a
/// double (the project's extension of CEL); `+` also joins strings and concatenates lists.
fn arithmetic(op: &str, a: &Ty, b: &Ty) -> Option<Ty> {
    if a.is_any() || b.is_any() {
        return Some(Ty::Any);
    }
    let mut out: Option<Ty> = None;
    for x in a.members() {
        for y in b.members() {
            let t = match (x, y) {
                (Ty::Int, Ty::Int) => Some(Ty::Int),
                // CEL's `%` is on integers only: the mixed-number extension stops at `/`.
                (x, y) if is_number(x) && is_number(y) && op != "%" => Some(Ty::Double),
                (Ty::String, Ty::String) if op == "+" => Some(Ty::String),
                (Ty::List(p), Ty::List(q)) if op == "+" => Some(Ty::List(Box::new(p.join(q)))),
                _ => None,
            };
            if let Some(t) = t {
                out = Some(match out {
                    None => t,
                    Some(o) => o.join(&t),
                });
            }
        }
    }
    out
}

fn arithmetic_help(op: &str, a: &Ty, b: &Ty) -> String {
    let has = |t: &Ty, k: &Ty| t.members().contains(k);
    let numeric = |t: &Ty| t.members().iter().any(is_number);
    if op == "+" && (has(a, &Ty::String) && numeric(b) || has(b, &Ty::String) && numeric(a)) {
        return "convert first: `string(n)` to join as text, `int(s)` or `double(s)` to add numbers".into();
    }
    if op == "%" && (has(a, &Ty::Double) || has(b, &Ty::Double)) {
        return "`%` takes integers only, as CEL defines it; convert first: `int(x) % n`".into();
    }
    if op == "+" {
        "`+` adds numbers, joins two strings and concatenates two lists".into()
    } else {
        format!("`{op}` applies to numbers only")
    }
}

/// How to make a boolean of a value of type `ty`.
pub fn bool_help(ty: &Ty) -> &'static str {
    match ty {
        Ty::List(_) | Ty::Object(_) => "test its size: `size(x) > 0`, or compare one of its fields",
        Ty::String => "compare it: `x == \"done\"`, or test presence with `has(...)`",
        Ty::Int | Ty::Double => "compare it: `x > 0`",
        _ => "write a comparison, `has(...)` or another test that is `true` or `false`",
    }
}

/// How to compare values of two different kinds.
fn convert_help(a: &Ty, b: &Ty) -> String {
    let has = |t: &Ty, k: &Ty| t.members().contains(k);
    let numeric = |t: &Ty| t.members().iter().any(is_number);
    if has(a, &Ty::String) && numeric(b) || has(b, &Ty::String) && numeric(a) {
        return "a number never equals a string in CEL; convert one side: `string(n)` or `int(s)`".into();
    }
    if has(a, &Ty::Null) || has(b, &Ty::Null) {
        return "the value is never null here; test presence with `has(x.f)` instead".into();
    }
    "values of different types are never equal in CEL; compare like with like".into()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::expr::parse;

    fn input() -> Ty {
        Ty::from_schema(&json!({
            "type": "object",
            "required": ["count", "name", "tags", "items", "amount", "flag", "ticket"],
            "properties": {
                "count": {"type": "integer"},
                "amount": {"type": "number"},
                "name": {"type": "string"},
                "flag": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "items": {"type": "array", "items": {
                    "type": "object",
                    "required": ["id"],
                    "properties": {"id": {"type": "integer"}, "label": {"type": "string"}}
                }},
                "ticket": {"type": "object", "properties": {"id": {"type": "integer"}}},
                "meta": {"type": "object"},
                "maybe": {"type": ["string", "null"]}
            }
        }))
    }

    fn scope(name: &str) -> Ty {
        match name {
            "input" => input(),
            _ => Ty::Any,
        }
    }

    fn ty(text: &str) -> Ty {
        expr_type(&parse(text).expect("parses"), &scope)
    }

    fn problems(text: &str) -> Vec<(ProblemKind, String, &str)> {
        let (_, ps) = check(&parse(text).expect("parses"), &scope);
        ps.into_iter()
            .map(|p| (p.kind, p.message, &text[p.start..p.end]))
            .collect()
    }

    fn list(t: Ty) -> Ty {
        Ty::List(Box::new(t))
    }

    #[test]
    fn literals_and_collections() {
        assert_eq!(ty("1"), Ty::Int);
        assert_eq!(ty("1u"), Ty::Int);
        assert_eq!(ty("-1"), Ty::Int);
        assert_eq!(ty("1.5"), Ty::Double);
        assert_eq!(ty("'a'"), Ty::String);
        assert_eq!(ty("true"), Ty::Bool);
        assert_eq!(ty("null"), Ty::Null);
        assert_eq!(ty("b'a'"), Ty::Any);
        assert_eq!(ty("[1, 2]"), list(Ty::Int));
        assert_eq!(ty("[1, 'a']"), list(Ty::Union(vec![Ty::Int, Ty::String])));
        assert_eq!(ty("[]"), list(Ty::Any));
        let Ty::Object(o) = ty("{'a': 1, 'b': 'x'}") else {
            panic!()
        };
        assert!(!o.open);
        assert_eq!(o.fields["a"].ty, Ty::Int);
        assert_eq!(ty("{'a': 1}.a"), Ty::Int);
        assert_eq!(ty("{input.name: 1}"), Ty::open_object());
        // Maps with keys that are not strings are no JSON objects: nothing is said of them.
        assert_eq!(ty("{1: 'a'}"), Ty::Any);
        assert_eq!(ty("{input.count: 1}"), Ty::Any);
        assert_eq!(problems("1 in {1: 'a'} && {1: 'a'}.exists(k, k == 1)"), vec![]);
    }

    #[test]
    fn variables_fields_and_indexes() {
        assert_eq!(ty("input.count"), Ty::Int);
        assert_eq!(ty("input.amount"), Ty::number());
        assert_eq!(ty("input.tags"), list(Ty::String));
        assert_eq!(ty("input.tags[0]"), Ty::String);
        assert_eq!(ty("input.items[0].id"), Ty::Int);
        assert_eq!(ty("input.maybe"), Ty::Union(vec![Ty::String, Ty::Null]));
        // Open objects and unknown variables say nothing.
        assert_eq!(ty("input.meta.other"), Ty::Any);
        assert_eq!(ty("payload.x.y"), Ty::Any);
        assert_eq!(ty("payload[0]"), Ty::Any);
        assert_eq!(ty("has(input.count)"), Ty::Bool);
    }

    #[test]
    fn arithmetic_types() {
        assert_eq!(ty("input.count + 1"), Ty::Int);
        assert_eq!(ty("input.count % 2"), Ty::Int);
        assert_eq!(ty("input.count * 0.5"), Ty::Double);
        assert_eq!(ty("1.5 / 2"), Ty::Double);
        assert_eq!(ty("input.amount * 0.029"), Ty::Double);
        assert_eq!(ty("input.amount + 1"), Ty::number());
        // `%` is on integers only: a `number` may be a whole number, and then gives one.
        assert_eq!(ty("input.amount % 2"), Ty::Int);
        assert_eq!(ty("input.name + '!'"), Ty::String);
        assert_eq!(ty("input.tags + ['x']"), list(Ty::String));
        assert_eq!(ty("-input.count"), Ty::Int);
        assert_eq!(ty("payload.a + 1"), Ty::Any);
    }

    #[test]
    fn comparisons_logic_and_conditionals() {
        for t in [
            "input.count == 3",
            "input.count != 3",
            "input.count < 3.5",
            "input.name in input.tags",
            "!input.flag",
            "input.flag && payload.x",
            "payload.x || false",
        ] {
            assert_eq!(ty(t), Ty::Bool, "{t}");
        }
        assert_eq!(ty("input.flag ? 1 : 2"), Ty::Int);
        assert_eq!(ty("input.flag ? 1 : 'a'"), Ty::Union(vec![Ty::Int, Ty::String]));
        assert_eq!(ty("input.flag ? 1 : payload.x"), Ty::Any);
    }

    #[test]
    fn two_variable_comprehensions() {
        assert_eq!(ty("input.items.all(i, x, i > 0 && x.id > 0)"), Ty::Bool);
        assert_eq!(ty("input.tags.existsOne(i, t, t == 'a')"), Ty::Bool);
        assert_eq!(ty("input.tags.transformList(i, t, i)"), list(Ty::Int));
        assert_eq!(
            ty("input.items.transformList(i, x, x.id > 1, x.label)"),
            list(Ty::String)
        );
        assert_eq!(ty("{'a': 1, 'b': 2}.transformList(k, v, v)"), list(Ty::Int));
        assert_eq!(ty("{'a': 1, 'b': 2}.transformList(k, v, k)"), list(Ty::String));
        assert_eq!(ty("input.tags.transformMap(i, t, t)"), Ty::Any);
        assert_eq!(ty("input.tags.transformMapEntry(i, t, {t: i})"), Ty::Any);
        // The variables end with the macro.
        assert_eq!(ty("[input.tags.all(i, t, true), i][1]"), Ty::Any);
        let never = |t| problems(t).into_iter().map(|p| p.1).collect::<Vec<_>>();
        assert_eq!(
            never("input.tags.all(i, t, i == 'a' || t == 1)"),
            [
                "`==` between integer and string is never true",
                "`==` between string and integer is never true"
            ]
        );
        assert_eq!(
            never("input.items.transformList(i, x, x.idd)"),
            ["`x` has no field `idd`"]
        );
    }

    #[test]
    fn an_empty_map_may_hold_keys_of_any_type() {
        assert_eq!(ty("{}"), Ty::Any);
        assert_eq!(problems("7 in {}"), []);
        assert_eq!(problems("input.count in {}"), []);
    }

    #[test]
    fn macros_and_functions() {
        assert_eq!(ty("input.items.all(i, i.id > 0)"), Ty::Bool);
        assert_eq!(ty("input.items.exists(i, i.id > 0)"), Ty::Bool);
        assert_eq!(ty("input.items.exists_one(i, i.id > 0)"), Ty::Bool);
        assert_eq!(ty("input.items.map(i, i.id)"), list(Ty::Int));
        assert_eq!(ty("input.items.map(i, i.id > 1, i.label)"), list(Ty::String));
        assert_eq!(ty("input.tags.filter(t, t != 'x')"), list(Ty::String));
        assert_eq!(ty("input.items.filter(i, i.id > 1)[0].id"), Ty::Int);
        assert_eq!(ty("{'a': 1}.map(k, k)"), list(Ty::String));
        assert_eq!(ty("(input.flag ? null : input.tags).map(k, k)"), list(Ty::String));
        assert_eq!(ty("(input.flag ? null : input.tags)[0]"), Ty::String);
        assert_eq!(ty("(input.flag ? 1 : input.tags)[0]"), Ty::Any);
        assert_eq!(ty("size(input.tags)"), Ty::Int);
        assert_eq!(ty("input.tags.size()"), Ty::Int);
        assert_eq!(ty("int(input.name)"), Ty::Int);
        assert_eq!(ty("uint(1)"), Ty::Int);
        assert_eq!(ty("double(input.count)"), Ty::Double);
        assert_eq!(ty("string(input.count)"), Ty::String);
        assert_eq!(ty("bool('true')"), Ty::Bool);
        assert_eq!(ty("input.name.startsWith('a')"), Ty::Bool);
        assert_eq!(ty("input.name.matches('a+')"), Ty::Bool);
        assert_eq!(ty("input.name.split(',')"), list(Ty::String));
        assert_eq!(ty("input.tags.join(',')"), Ty::String);
        assert_eq!(ty("input.name.lowerAscii()"), Ty::String);
        assert_eq!(ty("input.name.upperAscii()"), Ty::String);
        assert_eq!(ty("input.name.replace('a', 'b')"), Ty::String);
        assert_eq!(ty("input.name.trim()"), Ty::String);
        assert_eq!(ty("input.name.substring(1)"), Ty::String);
        assert_eq!(ty("input.name.charAt(0)"), Ty::String);
        assert_eq!(ty("'%s'.format([1])"), Ty::String);
        assert_eq!(ty("input.name.indexOf('a')"), Ty::Int);
        assert_eq!(ty("input.name.lastIndexOf('a')"), Ty::Int);
        assert_eq!(ty("timestamp(input.name)"), Ty::Any);
        assert_eq!(ty("duration('1h')"), Ty::Any);
        assert_eq!(ty("unknown_function(1)"), Ty::Any);
    }

    #[test]
    fn comprehension_variables_shadow_and_end() {
        // `x` inside is the element; outside the scope's (unknown) `x`.
        assert_eq!(ty("input.tags.map(x, x)"), list(Ty::String));
        assert_eq!(ty("input.items.map(x, x.id).map(x, x + 1)"), list(Ty::Int));
        assert_eq!(
            ty("input.items.map(x, input.tags.map(x, x))"),
            list(list(Ty::String))
        );
        assert!(problems("input.tags.all(x, true) && x + 1 > 0").is_empty());
    }

    #[test]
    fn comparisons_that_are_never_true() {
        assert_eq!(
            problems("input.count == '3'"),
            vec![(
                ProblemKind::NeverTrue,
                "`==` between integer and string is never true".into(),
                "=="
            )]
        );
        assert_eq!(
            problems("input.flag && input.count != \"3\""),
            vec![(
                ProblemKind::NeverTrue,
                "`!=` between integer and string is always true".into(),
                "!="
            )]
        );
        assert_eq!(
            problems("input.name < 3"),
            vec![(
                ProblemKind::NeverTrue,
                "`<` cannot order string and integer".into(),
                "<"
            )]
        );
        assert_eq!(
            problems("input.count in input.tags"),
            vec![(
                ProblemKind::NeverTrue,
                "`in` never finds integer in a list of string".into(),
                "in"
            )]
        );
        assert_eq!(
            problems("'a' in input.name")[0].1,
            "`in` needs a list or a map on its right, not string"
        );
        assert_eq!(
            problems("1 in {'a': 1}")[0].1,
            "`in` never finds integer among the keys of an object (they are strings)"
        );
        assert_eq!(
            problems("[1] < [2]")[0].1,
            "`<` cannot order list of integer and list of integer"
        );
        // Numbers compare across kinds; unknown sides and unions that can match say nothing.
        for ok in [
            "input.count == 3.0",
            "input.amount > 1",
            "input.maybe == null",
            "input.maybe == 'x'",
            "payload.x == '3'",
            "input.name in payload.list",
            "'a' in input.tags",
            "'a' in {'a': 1}",
            "[1] == [[1]]",
            "input.items[0] == {'id': 1}",
        ] {
            assert_eq!(problems(ok), vec![], "{ok}");
        }
    }

    #[test]
    fn arithmetic_without_an_operator() {
        assert_eq!(
            problems("input.name * 2"),
            vec![(
                ProblemKind::Arithmetic,
                "`*` does not apply to string and integer".into(),
                "*"
            )]
        );
        assert_eq!(
            problems("\"a\" + 1"),
            vec![(
                ProblemKind::Arithmetic,
                "`+` does not apply to string and integer".into(),
                "+"
            )]
        );
        assert_eq!(
            problems("input.flag - 1")[0].1,
            "`-` does not apply to boolean and integer"
        );
        assert_eq!(
            problems("null + 1")[0].1,
            "`+` does not apply to null and integer"
        );
        assert_eq!(
            problems("input.tags * 2")[0].1,
            "`*` does not apply to list of string and integer"
        );
        assert_eq!(
            problems("{'a': 1} + {'b': 2}")[0].1,
            "`+` does not apply to object and object"
        );
        // The operator of the right place among several, with a negation before them.
        let text = "-1 - input.count - input.name";
        let (_, p) = check(&parse(text).unwrap(), &scope);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].start, text.rfind('-').unwrap());
        assert_eq!(p[0].message, "`-` does not apply to integer and string");
        assert_eq!(
            problems("input.count % 2.0"),
            vec![(
                ProblemKind::Arithmetic,
                "`%` does not apply to integer and double".into(),
                "%"
            )]
        );
        assert_eq!(
            problems("(input.count * 0.5) % 2")[0].1,
            "`%` does not apply to double and integer"
        );
        for ok in [
            "input.count * 0.029",
            "input.maybe + 'x'",
            "input.count % 2",
            "input.amount % 2",
            "2 % input.amount",
            "payload.x * 2",
            "[1] + [2]",
            "'a' + 'b'",
        ] {
            assert_eq!(problems(ok), vec![], "{ok}");
        }
    }

    #[test]
    fn logic_on_values_that_are_not_booleans() {
        assert_eq!(
            problems("input.flag && input.name"),
            vec![(
                ProblemKind::NotBool,
                "an operand of `&&` is string, not a boolean".into(),
                "input.name"
            )]
        );
        assert_eq!(
            problems("input.count || input.flag"),
            vec![(
                ProblemKind::NotBool,
                "an operand of `||` is integer, not a boolean".into(),
                "input.count"
            )]
        );
        assert_eq!(
            problems("!input.tags"),
            vec![(
                ProblemKind::NotBool,
                "the operand of `!` is list of string, not a boolean".into(),
                "input.tags"
            )]
        );
        assert_eq!(
            problems("input.name ? 1 : 2"),
            vec![(
                ProblemKind::NotBool,
                "the condition of `?:` is string, not a boolean".into(),
                "input.name"
            )]
        );
        assert_eq!(
            problems("null && true")[0].1,
            "an operand of `&&` is null, not a boolean"
        );
        for ok in [
            "input.flag && payload.x",
            "!payload.x",
            "payload.x ? 'a' : 1",
            "input.flag ? input.name : input.count",
            "has(input.meta.x) || input.count > 1",
            "(input.maybe == null) && !input.flag",
        ] {
            assert_eq!(problems(ok), vec![], "{ok}");
        }
    }

    #[test]
    fn problems_inside_macros_point_into_the_text() {
        let text = "input.items.exists(i, i.id == 'x') || input.items.map(j, j.label * 2).size() > 0";
        let ps = problems(text);
        assert_eq!(ps.len(), 2, "{ps:?}");
        assert_eq!(ps[0].2, "==");
        assert_eq!(ps[1].2, "*");
        assert!(ps[0].1.contains("integer and string"));
        // The synthetic `+` and `==` of `exists_one` are not reported or paired.
        let text = "input.items.exists_one(i, i.id > 0) && input.name + 1 == 'a'";
        let ps = problems(text);
        assert_eq!(ps.len(), 1, "{ps:?}");
        assert_eq!(ps[0].2, "+");
    }

    #[test]
    fn fields_a_known_value_cannot_have() {
        assert_eq!(
            problems("input.items[0].lable == 'x'"),
            vec![(
                ProblemKind::UnknownField,
                "no field `lable` in this object".into(),
                "lable"
            )]
        );
        assert_eq!(
            problems("input.items.all(i, i.idd > 0)"),
            vec![(ProblemKind::UnknownField, "`i` has no field `idd`".into(), "idd")]
        );
        assert_eq!(
            problems("input.tags[0].x"),
            vec![(
                ProblemKind::UnknownField,
                "no field `x` on a value of type string".into(),
                "x"
            )]
        );
        assert_eq!(problems("input.nope")[0].1, "`input` has no field `nope`");
        assert_eq!(
            problems("input.count.x")[0].1,
            "`input.count` is integer: it has no field `x`"
        );
        // Open objects say nothing.
        for ok in ["input.meta.x", "input.meta.x.y[0].z", "payload.a[0].b"] {
            assert_eq!(problems(ok), vec![], "{ok}");
        }
        // Static chains from a variable whose chains the scope checks are not reported.
        struct Checked;
        impl Scope for Checked {
            fn var(&self, name: &str) -> Cow<'_, Ty> {
                Cow::Owned(scope(name))
            }
            fn chains_checked(&self, name: &str) -> bool {
                name == "input"
            }
        }
        for text in ["input.nope", "input.count.x", "input.items.all(input, input.x)"] {
            let (_, ps) = check(&parse(text).unwrap(), &Checked);
            assert_eq!(ps.len(), usize::from(text.contains("all")), "{text}: {ps:?}");
        }
    }

    #[test]
    fn members_given_one_at_a_time() {
        struct Steps;
        impl Scope for Steps {
            fn var(&self, _: &str) -> Cow<'_, Ty> {
                Cow::Owned(Ty::Any)
            }
            fn member(&self, name: &str, field: &str) -> Option<Cow<'_, Ty>> {
                (name == "steps" && field == "a").then(|| {
                    let mut t = Ty::open_object();
                    t.set_path(&["result"], Ty::List(Box::new(Ty::Int)));
                    Cow::Owned(t)
                })
            }
        }
        let e = parse("steps.a.result[0] == 'x'").unwrap();
        let (t, ps) = check(&e, &Steps);
        assert_eq!(t, Ty::Bool);
        assert_eq!(ps.len(), 1);
        assert_eq!(
            expr_type(&parse("steps.a.result").unwrap(), &Steps),
            list(Ty::Int)
        );
        assert_eq!(expr_type(&parse("steps.b.result").unwrap(), &Steps), Ty::Any);
    }
}
