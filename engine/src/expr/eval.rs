//! Evaluating CEL expressions and rendering templates over the run's JSON values (SPEC §5.1,
//! §5.4), without converting whole payloads.
//!
//! This module owns [`Vars`] (the variables an expression sees, all borrowed), [`eval`],
//! [`eval_bool`], [`render`] and [`to_json`]. It knows nothing of steps, routing or mappings, and
//! does no I/O.
//!
//! **Lazy values.** Variables reach cel through a [`VariableResolver`] over the borrowed
//! [`Vars`], so an evaluation allocates nothing for the variables it does not read. cel hands
//! the resolver a whole static member chain first (`payload.ticket.id`), which is walked in the
//! JSON directly: only the leaf is converted. A JSON scalar becomes the native CEL value (an
//! integer that fits `i64` is an `int`, a larger one a `uint`, any other number a `double`;
//! strings are borrowed, not copied); an array or object becomes a [`JsonView`], a `list` or
//! `map` that converts an element only when it is reached (`[i]`, `.f`, `has()`, `in`,
//! `size()`, comprehensions, `==`).
//!
//! **Equality is CEL's, on either side.** A view equals any list or map with the same
//! elements (keys in any order), and numbers compare across `int`, `uint` and `double` inside
//! them as at the top (`[1] == [1.0]`). cel's own lists and maps only equal their own kind, so
//! where an expression compares and also builds containers (`[1] == payload.v`, `payload.v in
//! [[1]]`, `{'k': [1]} == {'k': payload.v}`), its views stand in for cel's list or map when
//! cel asks for one, converted one level at a time ([`stand_ins`], [`JsonView`]).
//!
//! **Mixed numbers.** Arithmetic that mixes an `int` (or `uint`) and a `double` computes in
//! double, in either order (`payload.amount * 0.029` with `amount: 100` is `2.9000000000000004`)
//! — the one deliberate extension to CEL (SPEC §5.1). `int` with `int` stays `int` and an
//! overflow stays an error; `int` with `uint` stays an error, as `%` on a `double` does (CEL
//! defines `%` on integers only). cel dispatches an operator on its left operand's own type, so
//! an evaluation that fails is evaluated again with arithmetic that mixes ([`mixed`]); the
//! direct path computes the common mixed forms without cel. Comparisons mix in CEL already
//! (`1 < 1.5`).
//!
//! **Contexts.** The root environment ([`root_env`]: the standard library and the mixed
//! arithmetic) is built once (a static root context); each evaluation adds a child scope
//! holding only the resolver.
//!
//! **Semantics kept from CEL.** A missing key is an error (`has(payload.x)` tests for it).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, OnceLock};

use cel::common::traits::{
    self, Adder, Container, Divider, Indexer, Iterable, Modder, Multiplier, Sizer, Subtractor, Zeroer,
};
use cel::common::types::{
    self as cel_types, CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelOptional,
    CelString, CelUInt, Kind, Type,
};
use cel::common::value::{Builtin, BuiltinRef, CowVal, StaticVal, Val};
use cel::context::VariableResolver;
use cel::parser::Expression;
use cel::{Context, Env, ExecutionError};
use serde_json::{Map, Number, Value};

use crate::expr::template::Template;
use crate::expr::time::{self, Duration, Timestamp};
use crate::expr::{Derived, Expr};
use crate::record::error::StepError;

/// The variables an expression or template sees (SPEC §5.1), all borrowed.
///
/// `step` and `steps` are [`VarSource`]s: the engine builds their JSON only when an
/// expression or template reads them (most never do), and a plain `&Value` is one too.
#[derive(Clone, Copy, Debug, Default)]
pub struct Vars<'a> {
    pub payload: Option<&'a Value>,
    pub input: Option<&'a Value>,
    pub context: Option<&'a Value>,
    pub result: Option<&'a Value>,
    pub step: Option<&'a dyn VarSource>,
    pub steps: Option<&'a dyn VarSource>,
    pub message: Option<&'a Value>,
    /// `item` (or the `as` name), `index`, `iteration`.
    pub locals: &'a [(&'a str, &'a Value)],
    /// `now`: the run tree's timestamp, fixed at its first start.
    pub now: Option<Timestamp>,
}

/// A variable whose JSON may be built on first read: [`Vars::get`] asks for it only when an
/// expression or template names the variable. A source hands out the same value for as long
/// as it is borrowed (build it once, e.g. in a `OnceLock`).
pub trait VarSource: Sync + std::fmt::Debug {
    fn value(&self) -> &Value;
}

impl VarSource for Value {
    fn value(&self) -> &Value {
        self
    }
}

impl<'a> Vars<'a> {
    /// The variable named `name`: a local first (an inner scope shadows), then the run's.
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        if let Some((_, v)) = self.locals.iter().rev().find(|(n, _)| *n == name) {
            return Some(v);
        }
        match name {
            "payload" => self.payload,
            "input" => self.input,
            "context" => self.context,
            "result" => self.result,
            "step" => self.step.map(VarSource::value),
            "steps" => self.steps.map(VarSource::value),
            "message" => self.message,
            _ => None,
        }
    }

    /// Whether `name` is a variable of the flow language, set here or not.
    fn is_known(&self, name: &str) -> bool {
        matches!(
            name,
            "payload" | "input" | "context" | "result" | "step" | "steps" | "message" | "now"
        ) || self.locals.iter().any(|(n, _)| *n == name)
    }
}

/// Evaluates an expression to JSON. Errors are of kind `expression`; the message names the
/// expression and the cause ("`payload.x.y`: no such key `x`"), and `details` holds
/// `{"expression": text}`.
pub fn eval(expr: &Expr, vars: &Vars) -> Result<Value, StepError> {
    if let Some(v) = direct::eval(expr.ast(), vars) {
        return Ok(v.into_json());
    }
    eval_cel(expr, vars)
}

/// [`eval`] by cel alone, without the direct path.
fn eval_cel(expr: &Expr, vars: &Vars) -> Result<Value, StepError> {
    evaluate(expr, vars, val_to_json)
}

/// Evaluates `expr` by cel and hands its value to `finish`, whose error is a cause for
/// [`expr_error`].
///
/// **Mixed numbers.** cel's arithmetic does not mix `int` (or `uint`) and `double`, and
/// dispatches on the left operand's own type, a literal's included. An evaluation that fails is
/// therefore evaluated again with the arithmetic operators of [`mixed`], when it has any:
/// they compute in double where one operand is a double, and do what cel does otherwise. CEL
/// is free of side effects, and an error it absorbs (`x || true`) leaves the value what it is
/// whatever `x` computes to, so the second answer is the one of CEL with mixed arithmetic. The
/// direct path takes the common mixed forms (`payload.amount * 0.029`) without cel. Both trees
/// are made once per expression, on its first evaluation ([`Derived`]).
fn evaluate<R>(
    expr: &Expr,
    vars: &Vars,
    finish: impl Fn(&dyn Val) -> Result<R, String>,
) -> Result<R, StepError> {
    let derived = expr.derived(|ast| {
        let exact = exact(ast);
        let retry = match exact {
            Some(_) => None,
            None => mixed::rewrite(ast).map(|t| {
                let s = stand_ins(&t);
                (t, s)
            }),
        };
        Derived {
            stand_ins: stand_ins(exact.as_ref().unwrap_or(ast)),
            exact,
            retry,
        }
    });
    if let Some(exact) = &derived.exact {
        return with_scope(vars, derived.stand_ins, |ctx| {
            let v = cel::Value::resolve_val(exact, ctx).map_err(|e| expr_error(expr, &cause(&e, vars)))?;
            finish(&*v).map_err(|e| expr_error(expr, &e))
        });
    }
    let ast = expr.ast();
    let first = with_scope(vars, derived.stand_ins, |ctx| {
        cel::Value::resolve_val(ast, ctx).map(|v| finish(&*v))
    });
    let error = match first {
        Ok(done) => return done.map_err(|e| expr_error(expr, &e)),
        Err(error) => error,
    };
    let Some((ast, stand_ins)) = &derived.retry else {
        return Err(expr_error(expr, &cause(&error, vars)));
    };
    with_scope(vars, *stand_ins, |ctx| {
        let v = cel::Value::resolve_val(ast, ctx).map_err(|e| expr_error(expr, &cause(&e, vars)))?;
        finish(&*v).map_err(|e| expr_error(expr, &e))
    })
}

/// `ast` as it must run when cel's own evaluation of it could give a wrong answer or one that
/// depends on chance: with its `+` mixed where a list of cel's could take a map
/// ([`mixed::list_add_may_take_a_map`]), and with a comprehension over a map cel built
/// iterating its keys in order ([`order::unordered`]); and with its two-variable
/// comprehensions lowered to what cel runs ([`two_var::lower`]). `None` when none of these
/// apply.
fn exact(ast: &Expression) -> Option<Expression> {
    use cel::common::ast::Expr as Node;
    // One walk over the tree, once per expression (kept in its `Derived`).
    let lowered = two_var::any(ast).then(|| {
        let mut t = ast.clone();
        two_var::lower(&mut t);
        t
    });
    let ast = lowered.as_ref().unwrap_or(ast);
    let (mut add, mut unordered) = (false, false);
    visit(ast, &mut |e| match &e.expr {
        Node::Call(call) => add |= mixed::list_add_may_take_a_map(call),
        Node::Comprehension(c) => unordered |= order::unordered(c),
        _ => {}
    });
    if lowered.is_none() && !add && !unordered {
        return None;
    }
    // The mixed operators do what cel's do unless numbers mix: they can always take their place.
    let mut out = mixed::rewrite(ast).unwrap_or_else(|| ast.clone());
    if unordered {
        order::in_order(&mut out);
    }
    Some(out)
}

/// The right operand of `expr` when it adds to a value of the payload, `payload.a.b + rhs`,
/// and `fields` (`["a", "b"]`) names that value: its value when it is a list, else `None`.
/// A mapping that writes the sum back to where the left operand came from (`$.a.b`) appends
/// these elements in place, rather than building the whole list again (which costs as much
/// as the list, on every write: quadratic over a loop that grows it). `None` too when the
/// operand fails; the whole expression is evaluated then, and reports its own error.
pub fn appended(expr: &Expr, fields: &[&str], vars: &Vars) -> Option<Vec<Value>> {
    use cel::common::ast::{Expr as Node, operators};
    let Node::Call(call) = &expr.ast().expr else {
        return None;
    };
    if call.func_name != operators::ADD || call.target.is_some() || call.args.len() != 2 {
        return None;
    }
    // The left operand, from the leaf up, must be `payload` followed by `fields`.
    let mut cur = &call.args[0].expr;
    for field in fields.iter().rev() {
        match cur {
            Node::Select(s) if !s.test && s.field == *field => cur = &s.operand.expr,
            _ => return None,
        }
    }
    if !matches!(cur, Node::Ident(name) if name == "payload") {
        return None;
    }
    let operand = &call.args[1];
    if two_var::any(operand) {
        return None; // it runs lowered, with the whole expression
    }
    let value = |ast: &Expression| {
        with_scope(vars, stand_ins(ast), |ctx| {
            let v = cel::Value::resolve_val(ast, ctx).ok()?;
            val_to_json(&*v).ok()
        })
    };
    // Mixed numbers as in `evaluate`.
    match value(operand).or_else(|| value(&mixed::rewrite(operand)?))? {
        Value::Array(items) => Some(items),
        _ => None,
    }
}

/// Evaluates a condition. A result that is not a boolean is an error of kind `expression`
/// ("`payload.n`: must return a boolean, got int 3").
pub fn eval_bool(expr: &Expr, vars: &Vars) -> Result<bool, StepError> {
    match direct::eval(expr.ast(), vars) {
        Some(direct::Direct::Bool(b)) => return Ok(b),
        Some(direct::Direct::Json(Value::Bool(b))) => return Ok(*b),
        _ => {}
    }
    eval_bool_cel(expr, vars)
}

/// [`eval_bool`] by cel alone, without the direct path.
fn eval_bool_cel(expr: &Expr, vars: &Vars) -> Result<bool, StepError> {
    evaluate(expr, vars, |v| match v.downcast_ref::<CelBool>() {
        Some(b) => Ok(*b.inner()),
        None => Err(format!("must return a boolean, got {}", describe(v))),
    })
}

/// Renders a template. The template sees a document built only from the variables it names,
/// and of those only the static attribute chains it reads (`{{ payload.ticket.id }}` copies
/// `payload.ticket.id`, not the payload); a variable used any other way (`payload[k]`,
/// `payload | items`) is copied whole. An undefined variable or attribute, like any render
/// error, is kind `expression` ("template: `input.x` is undefined (line 2)").
pub fn render(template: &Template, vars: &Vars) -> Result<String, StepError> {
    if template.is_plain() {
        return Ok(template.text().to_owned());
    }
    let ctx = template_context(template, vars);
    template
        .render(&ctx)
        .map_err(|e| StepError::expression(format!("template: {e}")))
}

/// Converts an owned CEL value to JSON: integers stay integers (`int` and `uint`), `double`s
/// stay numbers with a fraction, `optional.none()` is `null` and a present optional its value.
/// JSON object keys are strings: `int`, `uint` and `bool` map keys are written as their text
/// (`{1: "a"}` gives `{"1": "a"}`; two keys with the same text are an error) and keys are
/// sorted, as CEL maps have no order. `NaN`, infinities, bytes, types and other values JSON
/// cannot hold are errors of kind `expression`.
pub fn to_json(v: &cel::Value) -> Result<Value, StepError> {
    value_to_json(v).map_err(StepError::expression)
}

fn value_to_json(v: &cel::Value) -> Result<Value, String> {
    Ok(match v {
        cel::Value::Null => Value::Null,
        cel::Value::Bool(b) => Value::Bool(*b),
        cel::Value::Int(i) => Value::from(*i),
        cel::Value::UInt(u) => Value::from(*u),
        cel::Value::Float(f) => float_to_json(*f)?,
        cel::Value::String(s) => Value::String(s.to_string()),
        cel::Value::List(items) => Value::Array(items.iter().map(value_to_json).collect::<Result<_, _>>()?),
        cel::Value::Map(m) => {
            let mut entries = m
                .map
                .iter()
                .map(|(k, v)| {
                    let key = match k {
                        cel::objects::Key::String(s) => s.to_string(),
                        cel::objects::Key::Int(i) => i.to_string(),
                        cel::objects::Key::Uint(u) => u.to_string(),
                        cel::objects::Key::Bool(b) => b.to_string(),
                    };
                    Ok((key, value_to_json(v)?))
                })
                .collect::<Result<Vec<_>, String>>()?;
            sorted_object(&mut entries)?
        }
        other => return Err(format!("a {} value cannot be written as JSON", other.type_of())),
    })
}

/// An object from entries, sorted by key; a repeated key is an error.
fn sorted_object(entries: &mut Vec<(String, Value)>) -> Result<Value, String> {
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(w) = entries.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!("map key `{}` appears twice once written as text", w[0].0));
    }
    Ok(Value::Object(entries.drain(..).collect()))
}

fn float_to_json(f: f64) -> Result<Value, String> {
    Number::from_f64(f)
        .map(Value::Number)
        .ok_or_else(|| format!("`{f}` cannot be written as JSON"))
}

// ---------------------------------------------------------------------------------------------
// The direct path

/// The most common expressions evaluated without cel: a variable's member chain
/// (`payload.ticket.id`, `input.v`), and arithmetic (`+ - * /`, and `%` on `int`s) and
/// comparisons (`< <= > >= == !=`) of `int`s and `double`s over such chains and literals
/// (mixed, they compute in double), the equalities also over strings and booleans. cel spends
/// most of an evaluation resolving names and building values and error contexts; these need
/// none of it.
///
/// The answer is exactly cel's (with [`mixed`] arithmetic): a chain is walked the way the
/// [`Resolver`] walks it, and anything off the path — another operator or type, a missing key,
/// an overflow, a division by zero, a double that is not finite, a `uint` operand — makes
/// [`eval`](direct::eval) give up (`None`), and cel evaluates the whole expression, errors and
/// all. Giving up costs a walk of the top of the AST.
mod direct;

// ---------------------------------------------------------------------------------------------
// Contexts and variables

/// The root context, built once.
static ROOT: LazyLock<Context<'static, 'static>> = LazyLock::new(|| Context::with_env(Arc::new(root_env())));

/// The environment of every expression: CEL's standard library, the strings extension
/// (`strings.rs`), the time functions (`time.rs`), and the arithmetic operators that mix
/// numbers ([`mixed`]).
fn root_env() -> Env {
    let mut env = Env::stdlib();
    super::strings::register(&mut env).expect("the strings extension is registered once");
    time::register(&mut env);
    mixed::register(&mut env);
    order::register(&mut env);
    two_var::register(&mut env);
    super::file::register(&mut env);
    env
}

/// The shared root context, at the lifetimes of one evaluation.
fn root<'a>() -> &'a Context<'a, 'a> {
    &ROOT
}

/// Runs `f` in a fresh child scope of the root whose variables come from `vars`; `stand_in`
/// is what [`stand_ins`] says of the expression to evaluate.
fn with_scope<R>(vars: &Vars, stand_in: bool, f: impl FnOnce(&Context) -> R) -> R {
    let resolver = Resolver {
        vars: *vars,
        stand_in,
    };
    let mut ctx = root().new_inner_scope();
    ctx.set_variable_resolver(&resolver);
    f(&ctx)
}

/// Resolves variables, and whole member chains of them (`payload.ticket.id`), from [`Vars`].
struct Resolver<'a> {
    vars: Vars<'a>,
    /// Whether the views it hands out stand in for cel's lists and maps ([`JsonView::stand_in`]).
    stand_in: bool,
}

impl VariableResolver for Resolver<'_> {
    fn resolve<'b>(&'b self, name: &str) -> Option<CowVal<'b, 'b>> {
        let mut parts = name.split('.');
        let first = parts.next()?;
        if first == "now"
            && let Some(now) = self.vars.now
            && !self.vars.locals.iter().any(|(n, _)| *n == "now")
        {
            // A timestamp has no fields: `now.x` is cel's error, from the shorter chain.
            return parts.next().is_none().then(|| CowVal::Owned(Box::new(now)));
        }
        let mut v = self.vars.get(first)?;
        for field in parts {
            // `None`: cel tries the shorter chain, and reports the missing key from there.
            v = v.as_object()?.get(field)?;
        }
        Some(CowVal::Owned(json_val(v, self.stand_in)))
    }
}

/// A JSON value as a CEL value: scalars converted (strings borrowed), containers as views.
fn json_val(v: &Value, stand_in: bool) -> Box<dyn Val + '_> {
    match v {
        Value::Null => Box::new(CelNull),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        Value::Number(n) => number_val(n),
        Value::String(s) => Box::new(CelString::from(s.as_str())),
        Value::Array(_) | Value::Object(_) => Box::new(JsonView::new(v, stand_in)),
    }
}

fn number_val(n: &Number) -> Box<dyn Val> {
    if let Some(i) = n.as_i64() {
        Box::new(CelInt::from(i))
    } else if let Some(u) = n.as_u64() {
        Box::new(CelUInt::from(u))
    } else {
        Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN)))
    }
}

// ---------------------------------------------------------------------------------------------
// What an expression needs of the evaluation

/// Whether the views of an evaluation of `ast` must stand in for cel's lists and maps
/// ([`JsonView`]): when it compares (`==`, `!=`, `in`) and builds containers of its own (list
/// and map literals, `map()` and `filter()`, `+`), or calls a function not known to do neither.
/// Elsewhere a view is never compared with a container cel built, and is not converted.
fn stand_ins(ast: &Expression) -> bool {
    use cel::common::ast::{Expr as Node, operators};
    let (mut compares, mut builds) = (false, false);
    visit(ast, &mut |e| match &e.expr {
        Node::List(_) | Node::Map(_) | Node::Struct(_) => builds = true,
        Node::Call(call) => match call.func_name.as_str() {
            operators::EQUALS | operators::NOT_EQUALS | operators::IN => compares = true,
            operators::ADD | mixed::ADD => builds = true,
            operators::LOGICAL_AND
            | operators::LOGICAL_OR
            | operators::LOGICAL_NOT
            | operators::NOT_STRICTLY_FALSE
            | operators::CONDITIONAL
            | operators::NEGATE
            | operators::INDEX
            | operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS
            | operators::SUBSTRACT
            | operators::MULTIPLY
            | operators::DIVIDE
            | operators::MODULO
            | mixed::SUB
            | mixed::MUL
            | mixed::DIV
            | "size"
            | "int"
            | "uint"
            | "double"
            | "string"
            | "bool"
            | "bytes"
            | "type"
            | "dyn"
            | "contains"
            | "startsWith"
            | "endsWith"
            | "matches" => {}
            _ => (compares, builds) = (true, true),
        },
        _ => {}
    });
    compares && builds
}

/// Calls `f` on `e` and every expression inside it.
pub(super) fn visit(e: &Expression, f: &mut impl FnMut(&Expression)) {
    use cel::common::ast::{EntryExpr, Expr as Node};
    f(e);
    match &e.expr {
        Node::Call(call) => {
            if let Some(target) = &call.target {
                visit(target, f);
            }
            for arg in &call.args {
                visit(arg, f);
            }
        }
        Node::Comprehension(c) => {
            for part in [&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result] {
                visit(part, f);
            }
        }
        Node::List(list) => {
            for item in &list.elements {
                visit(item, f);
            }
        }
        Node::Map(cel::common::ast::MapExpr { entries })
        | Node::Struct(cel::common::ast::StructExpr { entries, .. }) => {
            for entry in entries {
                match &entry.expr {
                    EntryExpr::MapEntry(m) => {
                        visit(&m.key, f);
                        visit(&m.value, f);
                    }
                    EntryExpr::StructField(s) => visit(&s.value, f),
                }
            }
        }
        Node::Select(s) => visit(&s.operand, f),
        Node::Ident(_) | Node::Literal(_) | Node::Unspecified => {}
    }
}

/// Calls `f` on every expression inside `e` (not `e` itself), outermost first.
pub(super) fn visit_mut(e: &mut Expression, f: &mut impl FnMut(&mut Expression)) {
    use cel::common::ast::{EntryExpr, Expr as Node};
    let mut each = |child: &mut Expression| {
        f(child);
        visit_mut(child, f);
    };
    match &mut e.expr {
        Node::Call(call) => {
            if let Some(target) = &mut call.target {
                each(target);
            }
            for arg in &mut call.args {
                each(arg);
            }
        }
        Node::Comprehension(c) => {
            let c = &mut **c;
            for part in [
                &mut c.iter_range,
                &mut c.accu_init,
                &mut c.loop_cond,
                &mut c.loop_step,
                &mut c.result,
            ] {
                each(part);
            }
        }
        Node::List(list) => {
            for item in &mut list.elements {
                each(item);
            }
        }
        Node::Map(cel::common::ast::MapExpr { entries })
        | Node::Struct(cel::common::ast::StructExpr { entries, .. }) => {
            for entry in entries {
                match &mut entry.expr {
                    EntryExpr::MapEntry(m) => {
                        each(&mut m.key);
                        each(&mut m.value);
                    }
                    EntryExpr::StructField(s) => each(&mut s.value),
                }
            }
        }
        Node::Select(s) => each(&mut s.operand),
        Node::Ident(_) | Node::Literal(_) | Node::Unspecified => {}
    }
}

/// Arithmetic that mixes `int` or `uint` with `double` and computes in double (SPEC §5.1): the
/// one deliberate extension to CEL. `+ - * /` are functions of the root environment under
/// names no expression can spell; [`rewrite`] calls them in place of cel's operators, and each
/// does exactly what cel's operator does unless exactly one operand is a `double` and the
/// other an integer. `%` stays CEL's: it is defined on integers only.
mod mixed;

/// The order a comprehension (`all`, `exists`, `exists_one`, `map`, `filter`) visits a map's
/// keys in. cel keeps the maps it builds (`{'b': 1, 'a': 2}`) in hash maps whose order changes
/// from one process to the next, so `{'b': 1, 'a': 2}.map(k, k)` would give `['a', 'b']` in one
/// run and `['b', 'a']` in its resume. CEL leaves the order open; here it is fixed: the keys in
/// ascending order (booleans, then integers by value, then strings by code point), the order a
/// map read from the payload is visited in too (whatever the order of its document), so that
/// a map gives the same answer read from the payload or written as a literal.
mod order;

/// Two-variable comprehensions, lowered to the one-variable comprehensions cel runs.
mod two_var;

// ---------------------------------------------------------------------------------------------
// The lazy view of a JSON array or object

mod view;
use view::*;

// ---------------------------------------------------------------------------------------------
// Results

/// Converts an evaluation's result to JSON (see [`to_json`] for the rules).
fn val_to_json(v: &dyn Val) -> Result<Value, String> {
    let ty = v.get_type();
    if std::ptr::eq(ty, &JSON_LIST_TYPE) || std::ptr::eq(ty, &JSON_MAP_TYPE) {
        let copy = v.as_indexer().and_then(|i| i.get(&Probe).ok());
        if let Some(j) = copy.as_deref().and_then(|c| c.downcast_ref::<JsonClone>()) {
            return Ok(j.0.clone());
        }
    }
    Ok(match ty.kind() {
        Kind::NullType => Value::Null,
        Kind::Boolean => match v.downcast_ref::<CelBool>() {
            Some(b) => Value::Bool(*b.inner()),
            None => return Err(cannot_write(v)),
        },
        Kind::Int => match v.downcast_ref::<CelInt>() {
            Some(i) => Value::from(*i.inner()),
            None => return Err(cannot_write(v)),
        },
        Kind::UInt => match v.downcast_ref::<CelUInt>() {
            Some(u) => Value::from(*u.inner()),
            None => return Err(cannot_write(v)),
        },
        Kind::Double => match v.downcast_ref::<CelDouble>() {
            Some(d) => float_to_json(*d.inner())?,
            None => return Err(cannot_write(v)),
        },
        Kind::String => match v.downcast_ref::<CelString>() {
            Some(s) => Value::String(s.inner().to_owned()),
            None => return Err(cannot_write(v)),
        },
        Kind::List => {
            if let Some(list) = v.downcast_ref::<CelList>() {
                Value::Array(
                    list.inner()
                        .iter()
                        .map(|i| val_to_json(&**i))
                        .collect::<Result<_, _>>()?,
                )
            } else {
                let mut out = Vec::new();
                let mut it = v.as_iterable().ok_or_else(|| cannot_write(v))?.iter();
                while let Some(item) = it.next() {
                    out.push(val_to_json(item)?);
                }
                Value::Array(out)
            }
        }
        Kind::Map => {
            let Some(map) = v.downcast_ref::<CelMap>() else {
                return Err(cannot_write(v));
            };
            let mut entries = map
                .inner()
                .iter()
                .map(|(k, v)| Ok((key_text(k), val_to_json(&**v)?)))
                .collect::<Result<Vec<_>, String>>()?;
            sorted_object(&mut entries)?
        }
        Kind::Timestamp | Kind::Duration => match time_text(v) {
            Some(text) => Value::String(text),
            None => return Err(cannot_write(v)),
        },
        Kind::Opaque if v.downcast_ref::<CelOptional>().is_some() => {
            match v.downcast_ref::<CelOptional>().and_then(|o| o.option()) {
                Some(inner) => val_to_json(inner)?,
                None => Value::Null,
            }
        }
        _ => return Err(cannot_write(v)),
    })
}

/// A timestamp or duration as JSON holds it: its CEL text (`string(x)`), which
/// `timestamp()`/`duration()` read back.
fn time_text(v: &dyn Val) -> Option<String> {
    if let Some(t) = v.downcast_ref::<Timestamp>() {
        return Some(t.to_string());
    }
    v.downcast_ref::<Duration>().map(ToString::to_string)
}

fn key_text(k: &CelMapKey) -> String {
    match k {
        CelMapKey::String(s) => s.inner().to_owned(),
        CelMapKey::Int(i) => i.inner().to_string(),
        CelMapKey::UInt(u) => u.inner().to_string(),
        CelMapKey::Bool(b) => b.inner().to_string(),
    }
}

/// A key that is not a string, as text for a message.
fn key_text_of(v: &dyn Val) -> String {
    val_to_json(v).map_or_else(|_| v.get_type().name().to_owned(), |j| j.to_string())
}

fn cannot_write(v: &dyn Val) -> String {
    format!("a {} value cannot be written as JSON", v.get_type().name())
}

/// A value for messages: its type and, for small values, the value (`int 3`, `string "x"`,
/// `list [1,2]`).
fn describe(v: &dyn Val) -> String {
    let ty = v.get_type().name().to_owned();
    match val_to_json(v) {
        Ok(j) => {
            let text = j.to_string();
            if text.len() <= 60 {
                format!("{ty} {text}")
            } else {
                let cut = (0..=57).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
                format!("{ty} {}...", &text[..cut])
            }
        }
        Err(_) => ty,
    }
}

// ---------------------------------------------------------------------------------------------
// Errors

fn expr_error(expr: &Expr, cause: &str) -> StepError {
    StepError::expression(format!("`{}`: {cause}", expr.text()))
        .with_details(serde_json::json!({ "expression": expr.text() }))
}

/// cel's error, as a terse lower-case cause with names in backticks.
fn cause(e: &ExecutionError, vars: &Vars) -> String {
    match e {
        ExecutionError::NoSuchKey(k) => format!("no such key `{k}`"),
        ExecutionError::UndeclaredReference(name) if vars.is_known(name) => {
            format!("`{name}` is not available here")
        }
        ExecutionError::UndeclaredReference(name) => format!("unknown name `{name}`"),
        ExecutionError::UnexpectedType { got, want } => format!("expected {want}, got {got}"),
        ExecutionError::IndexOutOfBounds(i) => format!("index {} is out of range", cel_text(i)),
        ExecutionError::DivisionByZero(_) => "division by zero".to_owned(),
        ExecutionError::RemainderByZero(_) => "modulus by zero".to_owned(),
        ExecutionError::Overflow(op, a, b) => {
            format!(
                "`{}` overflows on {} and {}",
                operator(op),
                cel_text(a),
                cel_text(b)
            )
        }
        ExecutionError::UnsupportedBinaryOperator(op, a, b) => {
            let op = operator(op);
            let doubles = matches!(a, cel::Value::Float(_)) || matches!(b, cel::Value::Float(_));
            if op == "%" && doubles {
                format!(
                    "`%` does not apply to {} and {}: CEL defines it on integers only",
                    type_name(a),
                    type_name(b)
                )
            } else {
                format!("`{op}` does not apply to {} and {}", type_name(a), type_name(b))
            }
        }
        ExecutionError::ValuesNotComparable(a, b) => {
            format!("{} and {} cannot be compared", type_name(a), type_name(b))
        }
        ExecutionError::FunctionError { function, message } => format!("`{function}`: {message}"),
        // Numbers always have `<`: the one pair they fail on holds a NaN.
        ExecutionError::NoSuchOverload(o)
            if matches!(o.function(), "_<_" | "_<=_" | "_>_" | "_>=_")
                && o.argument_types().len() == 2
                && o.argument_types()
                    .iter()
                    .all(|t| matches!(t.as_str(), "int" | "uint" | "double"))
                && o.argument_types().iter().any(|t| t == "double") =>
        {
            format!(
                "`{}` does not order NaN (not a number) with any number",
                o.function().trim_matches('_')
            )
        }
        other => tidy(&other.to_string()),
    }
}

/// The operator cel names by a word (`add`), as written.
fn operator(name: &str) -> &str {
    match name {
        "add" => "+",
        "sub" => "-",
        "mul" => "*",
        "div" => "/",
        "rem" => "%",
        other => other,
    }
}

/// A cel value in a message: JSON where it has one, else its type.
fn cel_text(v: &cel::Value) -> String {
    value_to_json(v).map_or_else(|_| type_name(v), |j| j.to_string())
}

/// The CEL name of a value's type (cel's `ValueType` says `float` for `double`).
fn type_name(v: &cel::Value) -> String {
    match v {
        cel::Value::Float(_) => "double".to_owned(),
        cel::Value::Null => "null_type".to_owned(),
        other => other.type_of().to_string(),
    }
}

/// cel's messages: 'x' → `x`, first letter lower case.
fn tidy(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut open = false;
    for c in msg.chars() {
        if c == '\'' {
            out.push('`');
            open = !open;
        } else {
            out.push(c);
        }
    }
    if open {
        out = msg.to_owned();
    }
    let mut chars = out.chars();
    match chars.next() {
        Some(first) if first.is_uppercase() => first.to_lowercase().chain(chars).collect(),
        _ => out,
    }
}

// ---------------------------------------------------------------------------------------------
// Template contexts

/// The document a template renders with: each variable it names, pruned to the static
/// attribute chains it reads.
fn template_context(template: &Template, vars: &Vars) -> Value {
    let mut ctx = Map::new();
    for (root, chain) in template.vars() {
        if root == "now"
            && let Some(now) = vars.now
            && vars.get(root).is_none()
        {
            ctx.insert(root.clone(), Value::String(now.to_string()));
            continue;
        }
        let Some(src) = vars.get(root) else { continue };
        let fresh = !ctx.contains_key(root);
        let slot = ctx.entry(root.clone()).or_insert(Value::Null);
        include(src, chain, slot, fresh);
    }
    Value::Object(ctx)
}

/// Copies into `out` what a read of `chain` on `src` can see: the value at the end of the
/// chain, or all of `src` where the chain leaves the objects (a missing key, an index, a
/// method). `fresh` is whether `out` holds nothing yet.
fn include(src: &Value, chain: &[String], out: &mut Value, fresh: bool) {
    match (chain.split_first(), src) {
        (Some((key, rest)), Value::Object(m)) if m.contains_key(key) => {
            if fresh || !out.is_object() {
                *out = Value::Object(Map::new());
            }
            let (Some(child), Value::Object(o)) = (m.get(key), out) else {
                return;
            };
            let fresh_child = !o.contains_key(key);
            let slot = o.entry(key.clone()).or_insert(Value::Null);
            include(child, rest, slot, fresh_child);
        }
        _ => *out = src.clone(),
    }
}

#[cfg(test)]
mod tests;
