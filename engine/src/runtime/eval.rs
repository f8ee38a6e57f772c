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

use super::error::StepError;
use super::time::{self, Duration, Timestamp};
use crate::compile::expr::{Derived, Expr};
use crate::compile::template::Template;

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
/// iterating its keys in order ([`order::unordered`]). `None` when neither can happen.
fn exact(ast: &Expression) -> Option<Expression> {
    use cel::common::ast::Expr as Node;
    // One walk over the tree, once per expression (kept in its `Derived`).
    let (mut add, mut unordered) = (false, false);
    visit(ast, &mut |e| match &e.expr {
        Node::Call(call) => add |= mixed::list_add_may_take_a_map(call),
        Node::Comprehension(c) => unordered |= order::unordered(c),
        _ => {}
    });
    if !add && !unordered {
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
mod direct {
    use cel::common::ast::{Expr as Node, LiteralValue, operators};
    use cel::parser::Expression;
    use serde_json::{Number, Value};

    use super::Vars;

    /// How deep the direct path follows nested operators before giving up.
    const MAX_DEPTH: u32 = 8;

    /// A value the direct path computed.
    #[derive(Debug, PartialEq)]
    pub enum Direct<'a> {
        /// A value in the variables, by reference.
        Json(&'a Value),
        Int(i64),
        /// Always finite.
        Double(f64),
        Bool(bool),
        Str(&'a str),
    }

    /// A number the direct path computes with.
    #[derive(Clone, Copy)]
    enum Num {
        Int(i64),
        Double(f64),
    }

    impl Num {
        fn f64(self) -> f64 {
            match self {
                Num::Int(i) => i as f64,
                Num::Double(d) => d,
            }
        }
    }

    impl Direct<'_> {
        /// The value as JSON, as [`super::val_to_json`] would write cel's.
        pub fn into_json(self) -> Value {
            match self {
                Direct::Json(v) => v.clone(),
                Direct::Int(i) => Value::from(i),
                Direct::Double(d) => Number::from_f64(d).map_or(Value::Null, Value::Number),
                Direct::Bool(b) => Value::Bool(b),
                Direct::Str(s) => Value::String(s.to_owned()),
            }
        }

        /// An `int` or a `double`, as the resolver converts it (a `uint` is neither).
        fn num(&self) -> Option<Num> {
            match self {
                Direct::Int(i) => Some(Num::Int(*i)),
                Direct::Double(d) => Some(Num::Double(*d)),
                Direct::Json(Value::Number(n)) => match n.as_i64() {
                    Some(i) => Some(Num::Int(i)),
                    None if n.is_f64() => n.as_f64().map(Num::Double),
                    None => None,
                },
                _ => None,
            }
        }

        fn str(&self) -> Option<&str> {
            match self {
                Direct::Str(s) => Some(s),
                Direct::Json(Value::String(s)) => Some(s),
                _ => None,
            }
        }

        fn bool(&self) -> Option<bool> {
            match self {
                Direct::Bool(b) => Some(*b),
                Direct::Json(Value::Bool(b)) => Some(*b),
                _ => None,
            }
        }
    }

    /// `expr`'s value, or `None`: let cel evaluate it.
    pub fn eval<'a>(expr: &'a Expression, vars: &Vars<'a>) -> Option<Direct<'a>> {
        node(&expr.expr, vars, 0)
    }

    fn node<'a>(e: &'a Node, vars: &Vars<'a>, depth: u32) -> Option<Direct<'a>> {
        match e {
            Node::Ident(_) | Node::Select(_) => chain(e, vars).map(Direct::Json),
            Node::Literal(LiteralValue::Int(i)) => Some(Direct::Int(*i.inner())),
            Node::Literal(LiteralValue::Double(d)) if d.inner().is_finite() => {
                Some(Direct::Double(*d.inner()))
            }
            Node::Literal(LiteralValue::String(s)) => Some(Direct::Str(s.inner())),
            Node::Literal(LiteralValue::Boolean(b)) => Some(Direct::Bool(*b.inner())),
            Node::Call(call) if call.target.is_none() && call.args.len() == 2 && depth < MAX_DEPTH => {
                let op = call.func_name.as_str();
                if !is_binary(op) {
                    return None;
                }
                let l = node(&call.args[0].expr, vars, depth + 1)?;
                let r = node(&call.args[1].expr, vars, depth + 1)?;
                binary(op, &l, &r)
            }
            _ => None,
        }
    }

    fn is_binary(op: &str) -> bool {
        matches!(
            op,
            operators::ADD
                | operators::SUBSTRACT
                | operators::MULTIPLY
                | operators::DIVIDE
                | operators::MODULO
                | operators::LESS
                | operators::LESS_EQUALS
                | operators::GREATER
                | operators::GREATER_EQUALS
                | operators::EQUALS
                | operators::NOT_EQUALS
        )
    }

    fn binary<'a>(op: &str, l: &Direct<'a>, r: &Direct<'a>) -> Option<Direct<'a>> {
        match (l.num(), r.num()) {
            (Some(Num::Int(a)), Some(Num::Int(b))) => return int_binary(op, a, b),
            (Some(a), Some(b)) => return double_binary(op, a.f64(), b.f64()),
            _ => {}
        }
        let equal = if let (Some(a), Some(b)) = (l.str(), r.str()) {
            a == b
        } else if let (Some(a), Some(b)) = (l.bool(), r.bool()) {
            a == b
        } else {
            return None;
        };
        match op {
            operators::EQUALS => Some(Direct::Bool(equal)),
            operators::NOT_EQUALS => Some(Direct::Bool(!equal)),
            _ => None,
        }
    }

    fn int_binary<'a>(op: &str, a: i64, b: i64) -> Option<Direct<'a>> {
        Some(match op {
            // `None` on overflow and for a zero divisor: cel reports those.
            operators::ADD => Direct::Int(a.checked_add(b)?),
            operators::SUBSTRACT => Direct::Int(a.checked_sub(b)?),
            operators::MULTIPLY => Direct::Int(a.checked_mul(b)?),
            operators::DIVIDE => Direct::Int(a.checked_div(b)?),
            operators::MODULO => Direct::Int(a.checked_rem(b)?),
            operators::LESS => Direct::Bool(a < b),
            operators::LESS_EQUALS => Direct::Bool(a <= b),
            operators::GREATER => Direct::Bool(a > b),
            operators::GREATER_EQUALS => Direct::Bool(a >= b),
            operators::EQUALS => Direct::Bool(a == b),
            operators::NOT_EQUALS => Direct::Bool(a != b),
            _ => return None,
        })
    }

    /// Doubles, or an integer and a double computing in double (an `int` converted to the
    /// nearest double, as cel compares them). `%` is cel's error; a result that is not finite
    /// is cel's to give (it cannot be JSON, and `NaN` does not compare).
    fn double_binary<'a>(op: &str, a: f64, b: f64) -> Option<Direct<'a>> {
        let d = match op {
            operators::ADD => a + b,
            operators::SUBSTRACT => a - b,
            operators::MULTIPLY => a * b,
            operators::DIVIDE => a / b,
            operators::LESS => return Some(Direct::Bool(a < b)),
            operators::LESS_EQUALS => return Some(Direct::Bool(a <= b)),
            operators::GREATER => return Some(Direct::Bool(a > b)),
            operators::GREATER_EQUALS => return Some(Direct::Bool(a >= b)),
            operators::EQUALS => return Some(Direct::Bool(a == b)),
            operators::NOT_EQUALS => return Some(Direct::Bool(a != b)),
            _ => return None,
        };
        d.is_finite().then_some(Direct::Double(d))
    }

    /// The value a member chain (`a.b.c`, no presence test) names, walked through objects the
    /// way the resolver walks it; `None` when the root is not a variable or a key is missing.
    fn chain<'a>(e: &'a Node, vars: &Vars<'a>) -> Option<&'a Value> {
        // Fields from the leaf up: chains are short.
        let mut fields: [&str; 8] = [""; 8];
        let mut n = 0;
        let mut cur = e;
        let root = loop {
            match cur {
                Node::Ident(name) => break name.as_str(),
                Node::Select(s) if !s.test && n < fields.len() => {
                    fields[n] = s.field.as_str();
                    n += 1;
                    cur = &s.operand.expr;
                }
                _ => return None,
            }
        };
        let mut v = vars.get(root)?;
        for field in fields[..n].iter().rev() {
            v = v.as_object()?.get(*field)?;
        }
        Some(v)
    }
}

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
fn visit(e: &Expression, f: &mut impl FnMut(&Expression)) {
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
fn visit_mut(e: &mut Expression, f: &mut impl FnMut(&mut Expression)) {
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
mod mixed {
    use cel::common::ast::{Expr as Node, operators};
    use cel::common::types::{self as cel_types, CelDouble, CelInt, CelUInt, Kind};
    use cel::common::value::{CowVal, Val};
    use cel::parser::Expression;
    use cel::{Env, ExecutionError};

    pub const ADD: &str = "@mixed_add";
    pub const SUB: &str = "@mixed_sub";
    pub const MUL: &str = "@mixed_mul";
    pub const DIV: &str = "@mixed_div";

    #[derive(Clone, Copy)]
    enum Op {
        Add,
        Sub,
        Mul,
        Div,
    }

    /// Declares the operators on `env`.
    pub fn register(env: &mut Env) {
        let dyn2 = || vec![cel_types::DYN_TYPE, cel_types::DYN_TYPE];
        let ops: [(&str, cel::common::functions::Function); 4] = [
            (ADD, |args| apply(Op::Add, args)),
            (SUB, |args| apply(Op::Sub, args)),
            (MUL, |args| apply(Op::Mul, args)),
            (DIV, |args| apply(Op::Div, args)),
        ];
        for (name, op) in ops {
            env.add_overload(name, name, dyn2(), op)
                .expect("the names are new to the standard library");
        }
    }

    /// `ast` with its `+ - * /` calling the operators here, or `None` when it has none.
    /// A `+` with a list literal on the right is left to cel: it concatenates, and is the step
    /// cel recognises in `map()` and `filter()` to append in place.
    pub fn rewrite(ast: &Expression) -> Option<Expression> {
        let mut any = false;
        super::visit(ast, &mut |e| any |= mixed_name(e).is_some());
        if !any {
            return None;
        }
        let mut out = ast.clone();
        let mut rename = |e: &mut Expression| {
            if let Some(name) = mixed_name(e)
                && let Node::Call(call) = &mut e.expr
            {
                call.func_name = name.to_owned();
            }
        };
        rename(&mut out);
        super::visit_mut(&mut out, &mut rename);
        Some(out)
    }

    /// Whether `call` is a `+` that cel's own operator may get wrong: cel's lists append
    /// anything iterable, so a list built by cel (a literal, a `map()`, a variable of a
    /// comprehension) plus a map appends the map's keys where CEL has no such overload. Views
    /// of JSON refuse that themselves, and a literal on the right is never a map, so
    /// `payload.items + [x]` and `payload.n + 1` keep cel's operator.
    pub fn list_add_may_take_a_map(call: &cel::common::ast::CallExpr) -> bool {
        call.func_name == operators::ADD
            && call.target.is_none()
            && call.args.len() == 2
            && !matches!(call.args[1].expr, Node::Literal(_) | Node::List(_))
            && !reads_json(&call.args[0])
    }

    /// Whether `e` is a field chain from a variable the run provides (its values are views).
    pub(super) fn reads_json(e: &Expression) -> bool {
        match &e.expr {
            Node::Select(s) if !s.test => reads_json(&s.operand),
            Node::Ident(name) => {
                matches!(
                    name.as_str(),
                    "payload" | "input" | "context" | "result" | "steps" | "step"
                )
            }
            _ => false,
        }
    }

    /// The name of the operator here that takes the place of `e`'s, if `e` is one.
    fn mixed_name(e: &Expression) -> Option<&'static str> {
        let Node::Call(call) = &e.expr else {
            return None;
        };
        if call.target.is_some() || call.args.len() != 2 {
            return None;
        }
        Some(match call.func_name.as_str() {
            operators::ADD if !matches!(call.args[1].expr, Node::List(_)) => ADD,
            operators::SUBSTRACT => SUB,
            operators::MULTIPLY => MUL,
            operators::DIVIDE => DIV,
            _ => return None,
        })
    }

    fn apply<'b, 'v>(op: Op, mut args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
        let (Some(rhs), Some(lhs), None) = (args.pop(), args.pop(), args.pop()) else {
            return Err(ExecutionError::function_error("arithmetic", "takes two operands"));
        };
        if let Some((a, b)) = mixed(&*lhs, &*rhs) {
            let d = match op {
                Op::Add => a + b,
                Op::Sub => a - b,
                Op::Mul => a * b,
                Op::Div => a / b,
            };
            return Ok(CowVal::owned(CelDouble::from(d)));
        }
        // cel's own operator, as its interpreter applies it.
        let (l, r) = (&*lhs, &*rhs);
        let unsupported = |name| {
            ExecutionError::UnsupportedBinaryOperator(name, super::message_value(l), super::message_value(r))
        };
        // cel's lists append anything iterable, a map's keys included: CEL's `+` on a list
        // takes a list only.
        if matches!(op, Op::Add) && l.get_type().kind() == Kind::List && r.get_type().kind() != Kind::List {
            return Err(unsupported("add"));
        }
        let out = match op {
            Op::Add => l
                .as_adder()
                .ok_or_else(|| unsupported("add"))?
                .add(r)?
                .into_owned(),
            Op::Sub => l
                .as_subtractor()
                .ok_or_else(|| unsupported("sub"))?
                .sub(r)?
                .into_owned(),
            Op::Mul => l
                .as_multiplier()
                .ok_or_else(|| unsupported("mul"))?
                .mul(r)?
                .into_owned(),
            Op::Div => l
                .as_divider()
                .ok_or_else(|| unsupported("div"))?
                .div(r)?
                .into_owned(),
        };
        Ok(CowVal::Owned(out))
    }

    /// Both operands as doubles, when exactly one is a `double` and the other an `int` or a
    /// `uint` (converted to the nearest double).
    fn mixed(lhs: &dyn Val, rhs: &dyn Val) -> Option<(f64, f64)> {
        let num = |v: &dyn Val| -> Option<(f64, bool)> {
            if let Some(d) = v.downcast_ref::<CelDouble>() {
                Some((*d.inner(), true))
            } else if let Some(i) = v.downcast_ref::<CelInt>() {
                Some((*i.inner() as f64, false))
            } else {
                v.downcast_ref::<CelUInt>().map(|u| (*u.inner() as f64, false))
            }
        };
        let (a, a_double) = num(lhs)?;
        let (b, b_double) = num(rhs)?;
        (a_double != b_double).then_some((a, b))
    }
}

/// The order a comprehension (`all`, `exists`, `exists_one`, `map`, `filter`) visits a map's
/// keys in. cel keeps the maps it builds (`{'b': 1, 'a': 2}`) in hash maps whose order changes
/// from one process to the next, so `{'b': 1, 'a': 2}.map(k, k)` would give `['a', 'b']` in one
/// run and `['b', 'a']` in its resume. CEL leaves the order open; here it is fixed: the keys in
/// ascending order (booleans, then integers by value, then strings by code point), the order a
/// map read from the payload is visited in too (whatever the order of its document), so that
/// a map gives the same answer read from the payload or written as a literal.
mod order {
    use std::cmp::Ordering;

    use cel::Env;
    use cel::common::ast::{CallExpr, Expr as Node};
    use cel::common::types::{self as cel_types, CelBool, CelInt, CelList, CelString, CelUInt, Kind};
    use cel::common::value::{CowVal, Val};
    use cel::parser::Expression;

    use super::{JSON_MAP_TYPE, mixed};

    pub const IN_ORDER: &str = "@in_order";

    /// Declares the function that puts a comprehension's range in order.
    pub fn register(env: &mut Env) {
        env.add_overload(IN_ORDER, IN_ORDER, vec![cel_types::DYN_TYPE], |mut args| {
            let range = args
                .pop()
                .ok_or_else(|| cel::ExecutionError::function_error("iteration", "takes one range"))?;
            if range.get_type().kind() != Kind::Map || std::ptr::eq(range.get_type(), &JSON_MAP_TYPE) {
                return Ok(range);
            }
            let Some(keys) = range.as_iterable() else {
                return Ok(range);
            };
            let mut sorted: Vec<Box<dyn Val>> = Vec::new();
            let mut it = keys.iter();
            while let Some(k) = it.next() {
                sorted.push(k.clone_as_boxed());
            }
            sorted.sort_by(|a, b| compare(&**a, &**b));
            Ok(CowVal::owned(CelList::from(sorted)))
        })
        .expect("the name is new to the standard library");
    }

    /// Map keys in order: `bool`, then `int` and `uint` by value, then `string`.
    fn compare(a: &dyn Val, b: &dyn Val) -> Ordering {
        fn rank(v: &dyn Val) -> (u8, i128, &str) {
            if let Some(b) = v.downcast_ref::<CelBool>() {
                (0, i128::from(*b.inner()), "")
            } else if let Some(i) = v.downcast_ref::<CelInt>() {
                (1, i128::from(*i.inner()), "")
            } else if let Some(u) = v.downcast_ref::<CelUInt>() {
                (1, i128::from(*u.inner()), "")
            } else if let Some(s) = v.downcast_ref::<CelString>() {
                (2, 0, s.inner())
            } else {
                (3, 0, "")
            }
        }
        rank(a).cmp(&rank(b))
    }

    /// Whether `c` is a comprehension over one variable whose range may be a map cel built:
    /// not a list literal, not a field chain from a variable of the run (a view).
    pub fn unordered(c: &cel::common::ast::ComprehensionExpr) -> bool {
        c.iter_var2.is_none()
            && !matches!(c.iter_range.expr, Node::List(_))
            && !mixed::reads_json(&c.iter_range)
            && !matches!(&c.iter_range.expr, Node::Call(call) if call.func_name == IN_ORDER)
    }

    /// Wraps the range of each such comprehension in `ast` in [`IN_ORDER`].
    pub fn in_order(ast: &mut Expression) {
        let mut wrap = |e: &mut Expression| {
            if let Node::Comprehension(c) = &mut e.expr
                && unordered(c)
            {
                let range = std::mem::take(&mut c.iter_range);
                c.iter_range = Expression {
                    id: range.id,
                    expr: Node::Call(CallExpr {
                        func_name: IN_ORDER.to_owned(),
                        target: None,
                        args: vec![range],
                    }),
                };
            }
        };
        wrap(ast);
        super::visit_mut(ast, &mut wrap);
    }
}

// ---------------------------------------------------------------------------------------------
// The lazy view of a JSON array or object

/// The types of views: equal to cel's `list` and `map` (overloads such as `size` pick them),
/// but at their own addresses, so a view is told apart from cel's containers.
static JSON_LIST_TYPE: Type = cel_types::LIST_TYPE;
static JSON_MAP_TYPE: Type = cel_types::MAP_TYPE;

/// A JSON array (a CEL `list`) or object (a `map` with string keys), borrowed. Elements are
/// converted when reached; iterating converts the elements (or, for a map, the keys) once.
///
/// **Equality with cel's own lists and maps.** A view compares itself by content with any list
/// or map ([`json_equals`]), but cel's lists and maps only equal their own kind: `[1] ==
/// payload.v` asks the literal, which downcasts `payload.v` to a cel list. A view that
/// `stand_in`s answers that downcast with itself converted one level deep (its elements are
/// views again), built once: so the literal on the left, a list literal holding the view, and
/// `payload.v in [[1]]` all compare by content. Only expressions that can compare a view with
/// a container cel built get such views ([`stand_ins`]), as cel asks every value it reads a
/// field of whether it is an optional, which is such a downcast too.
#[derive(Debug)]
struct JsonView<'a> {
    value: &'a Value,
    stand_in: bool,
    /// An array's converted elements, built on first iteration (or downcast).
    list: OnceLock<CelList<'a>>,
    /// An object's keys, in order, built on first iteration.
    keys: OnceLock<Vec<Box<dyn Val + 'a>>>,
    /// An object as a cel map, built on first downcast.
    map: OnceLock<CelMap<'a>>,
}

impl<'a> JsonView<'a> {
    fn new(value: &'a Value, stand_in: bool) -> Self {
        JsonView {
            value,
            stand_in,
            list: OnceLock::new(),
            keys: OnceLock::new(),
            map: OnceLock::new(),
        }
    }

    fn is_list(&self) -> bool {
        self.value.is_array()
    }

    fn len(&self) -> usize {
        match self.value {
            Value::Array(a) => a.len(),
            Value::Object(m) => m.len(),
            _ => 0,
        }
    }

    fn list(&self) -> &CelList<'a> {
        self.list.get_or_init(|| cel_list(self.value, self.stand_in))
    }

    fn map(&self) -> &CelMap<'a> {
        self.map.get_or_init(|| cel_map(self.value, self.stand_in))
    }

    fn items(&self) -> &[Box<dyn Val + 'a>] {
        match self.value {
            Value::Array(_) => self.list().inner(),
            // In ascending order, as a comprehension visits a map cel built ([`order`]): the
            // same map read from the payload or written as a literal is visited alike.
            Value::Object(m) => self.keys.get_or_init(|| {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort_unstable();
                keys.into_iter()
                    .map(|k| Box::new(CelString::from(k.as_str())) as Box<dyn Val + 'a>)
                    .collect()
            }),
            _ => &[],
        }
    }
}

/// A JSON array's elements as a cel list (of views, for nested containers).
fn cel_list(value: &Value, stand_in: bool) -> CelList<'_> {
    let items = match value {
        Value::Array(a) => a.iter().map(|v| json_val(v, stand_in)).collect(),
        _ => Vec::new(),
    };
    CelList::from(items)
}

/// A JSON object as a cel map with string keys (of views, for nested containers).
fn cel_map(value: &Value, stand_in: bool) -> CelMap<'_> {
    let entries: HashMap<CelMapKey<'_>, Box<dyn Val + '_>> = match value {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| {
                (
                    CelMapKey::String(CelString::from(k.as_str())),
                    json_val(v, stand_in),
                )
            })
            .collect(),
        _ => HashMap::new(),
    };
    CelMap::from(entries)
}

impl Val for JsonView<'_> {
    fn get_type(&self) -> &Type {
        if self.is_list() {
            &JSON_LIST_TYPE
        } else {
            &JSON_MAP_TYPE
        }
    }

    /// Views have no single static type; only `add_overload!` asks, and it is never used
    /// with them.
    fn cel_type() -> &'static Type {
        &cel_types::DYN_TYPE
    }

    fn as_adder<'b, 'v>(&'b self) -> Option<&'b (dyn Adder + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    // The other arithmetic operators only fail on a view, but with its own type in the message
    // (cel would name the left operand by its `Value`, which a view has none of).
    fn as_subtractor<'b, 'v>(&'b self) -> Option<&'b (dyn Subtractor + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_multiplier<'b, 'v>(&'b self) -> Option<&'b (dyn Multiplier + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_divider<'b, 'v>(&'b self) -> Option<&'b (dyn Divider + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_modder<'b, 'v>(&'b self) -> Option<&'b (dyn Modder + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_container(&self) -> Option<&dyn Container> {
        Some(self)
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_iterable<'b, 'v>(&'b self) -> Option<&'b (dyn Iterable + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(self)
    }

    fn as_zeroer(&self) -> Option<&dyn Zeroer> {
        Some(self)
    }

    fn equals(&self, other: &dyn Val) -> bool {
        json_equals(self.value, other)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(JsonView::new(self.value, self.stand_in))
    }

    /// Indexing a view cel owns goes through here once [`Val::as_builtin`] names a built-in
    /// type; it is the same indexing.
    fn into_indexer<'v>(self: Box<Self>) -> Option<Box<dyn Indexer + 'v>>
    where
        Self: 'v,
    {
        Some(self)
    }

    /// A view that stands in is, to cel, its own list or map (see [`JsonView`]).
    fn as_builtin<'b, 'v>(&'b self) -> BuiltinRef<'b, 'v>
    where
        Self: 'v,
    {
        match self.value {
            _ if !self.stand_in => BuiltinRef::Other,
            Value::Array(_) => BuiltinRef::List(self.list()),
            Value::Object(_) => BuiltinRef::Map(self.map()),
            _ => BuiltinRef::Other,
        }
    }

    /// Agrees with [`Val::as_builtin`], as cel requires.
    fn into_builtin<'v>(self: Box<Self>) -> Option<Builtin<'v>>
    where
        Self: 'v,
    {
        let JsonView {
            value,
            stand_in,
            list,
            map,
            ..
        } = *self;
        match value {
            _ if !stand_in => None,
            Value::Array(_) => Some(Builtin::List(
                list.into_inner().unwrap_or_else(|| cel_list(value, stand_in)),
            )),
            Value::Object(_) => Some(Builtin::Map(
                map.into_inner().unwrap_or_else(|| cel_map(value, stand_in)),
            )),
            _ => None,
        }
    }
}

impl Indexer for JsonView<'_> {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        if idx.as_any().is_some_and(|a| a.is::<Probe>()) {
            return Ok(CowVal::owned(JsonClone(self.value.clone())));
        }
        match self.value {
            Value::Object(m) => match string_key(idx) {
                Some(key) => match m.get(key) {
                    Some(v) => Ok(CowVal::Owned(json_val(v, self.stand_in))),
                    None => Err(ExecutionError::no_such_key(key)),
                },
                // As cel's maps: another key type finds nothing, a value of no key type is
                // the wrong type.
                None if is_key_type(idx) => Err(ExecutionError::no_such_key(&key_text_of(idx))),
                None => Err(ExecutionError::UnexpectedType {
                    got: idx.get_type().name().to_owned(),
                    want: "map key".to_owned(),
                }),
            },
            Value::Array(items) => {
                let i = list_index(idx)?;
                usize::try_from(i)
                    .ok()
                    .and_then(|i| items.get(i))
                    .map(|v| CowVal::Owned(json_val(v, self.stand_in)))
                    .ok_or_else(|| ExecutionError::IndexOutOfBounds(cel::Value::Int(i)))
            }
            _ => Err(ExecutionError::no_such_key(&key_text_of(idx))),
        }
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

/// A list index: an `int`, a `uint`, or a whole `double`.
fn list_index(idx: &dyn Val) -> Result<i64, ExecutionError> {
    if let Some(i) = idx.downcast_ref::<CelInt>() {
        Ok(*i.inner())
    } else if let Some(u) = idx.downcast_ref::<CelUInt>() {
        Ok(i64::try_from(*u.inner()).unwrap_or(i64::MAX))
    } else if let Some(d) = idx.downcast_ref::<CelDouble>().map(|d| *d.inner())
        && d.fract() == 0.0
        && d.abs() < 9.0e15
    {
        Ok(d as i64)
    } else {
        Err(ExecutionError::UnexpectedType {
            got: idx.get_type().name().to_owned(),
            want: "int".to_owned(),
        })
    }
}

impl Container for JsonView<'_> {
    fn contains(&self, value: &dyn Val) -> Result<bool, ExecutionError> {
        Ok(match self.value {
            Value::Array(items) => items.iter().any(|item| json_equals(item, value)),
            Value::Object(m) => match string_key(value) {
                Some(k) => m.contains_key(k),
                None if is_key_type(value) => false,
                // As cel's maps: a value that can be no key is an error.
                None => {
                    return Err(ExecutionError::UnsupportedKeyType(
                        cel::Value::try_from(value).unwrap_or(cel::Value::Null),
                    ));
                }
            },
            _ => false,
        })
    }
}

/// `v` as a string map key. The kind is asked first: a downcast of a view that stands in
/// converts it.
fn string_key(v: &dyn Val) -> Option<&str> {
    if v.get_type().kind() != Kind::String {
        return None;
    }
    v.downcast_ref::<CelString>().map(|s| s.inner())
}

/// Whether cel looks `v` up in a map (finding nothing where the keys are strings): a key
/// type, or a `double`.
fn is_key_type(v: &dyn Val) -> bool {
    matches!(
        v.get_type().kind(),
        Kind::String | Kind::Int | Kind::UInt | Kind::Boolean | Kind::Double
    )
}

impl<'a> Iterable for JsonView<'a> {
    fn iter<'b, 'v>(&'b self) -> Box<dyn traits::Iterator<'b, 'v> + 'b>
    where
        Self: 'v,
    {
        Box::new(ItemIter(self.items().iter()))
    }
}

/// Lends the converted elements of a [`JsonView`].
struct ItemIter<'b, 'a>(std::slice::Iter<'b, Box<dyn Val + 'a>>);

impl<'b, 'a: 'v, 'v> traits::Iterator<'b, 'v> for ItemIter<'b, 'a> {
    fn next(&mut self) -> Option<&'b (dyn Val + 'v)> {
        self.0.next().map(|b| b.as_ref() as &(dyn Val + 'v))
    }
}

impl Sizer for JsonView<'_> {
    fn size(&self) -> CelInt {
        CelInt::from(i64::try_from(self.len()).unwrap_or(i64::MAX))
    }
}

impl Zeroer for JsonView<'_> {
    fn is_zero_value(&self) -> bool {
        self.len() == 0
    }
}

impl Adder for JsonView<'_> {
    fn add<'b, 'v>(&'b self, rhs: &(dyn Val + 'v)) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        let rhs_items = rhs
            .as_iterable()
            .filter(|_| self.is_list() && rhs.get_type().kind() == Kind::List);
        let Some(rhs_items) = rhs_items else {
            return Err(no_overload("_+_", self, rhs));
        };
        let mut out: Vec<Box<dyn Val + 'v>> = Vec::with_capacity(self.len());
        if let Value::Array(items) = self.value {
            out.extend(
                items
                    .iter()
                    .map(|v| json_val(v, self.stand_in) as Box<dyn Val + 'v>),
            );
        }
        let mut it = rhs_items.iter();
        while let Some(v) = it.next() {
            out.push(v.clone_as_boxed());
        }
        Ok(CowVal::owned(CelList::from(out)))
    }
}

/// The error of an arithmetic operator on a view.
fn no_overload(op: &str, lhs: &dyn Val, rhs: &dyn Val) -> ExecutionError {
    let word = match op {
        "_+_" => "add",
        "_-_" => "sub",
        "_*_" => "mul",
        "_/_" => "div",
        _ => "rem",
    };
    ExecutionError::UnsupportedBinaryOperator(word, message_value(lhs), message_value(rhs))
}

/// `v` as a cel value, for an error's message: a view, or a container holding views, converts
/// to no cel value, and is written as an empty one of its kind (the message names its type).
fn message_value(v: &dyn Val) -> cel::Value {
    cel::Value::try_from(v).unwrap_or_else(|_| match v.get_type().kind() {
        Kind::List => cel::Value::List(Arc::default()),
        Kind::Map => cel::Value::from(std::collections::HashMap::<String, cel::Value>::new()),
        _ => cel::Value::Null,
    })
}

macro_rules! no_arithmetic {
    ($($trait:ident :: $method:ident => $op:literal),* $(,)?) => {$(
        impl $trait for JsonView<'_> {
            fn $method<'b, 'v>(&'b self, rhs: &(dyn Val + 'v)) -> Result<CowVal<'b, 'v>, ExecutionError>
            where
                Self: 'v,
            {
                Err(no_overload($op, self, rhs))
            }
        }
    )*};
}

no_arithmetic! {
    Subtractor::sub => "_-_",
    Multiplier::mul => "_*_",
    Divider::div => "_/_",
    Modder::modulo => "_%_",
}

/// Whether a JSON value equals a CEL value, by CEL's rules (`1 == 1.0`, lists element-wise,
/// maps by keys and values). Nothing is converted beyond a scalar on the stack.
fn json_equals(j: &Value, other: &dyn Val) -> bool {
    match j {
        Value::Null => other.get_type().kind() == Kind::NullType,
        Value::Bool(b) => other.downcast_ref::<CelBool>().is_some_and(|o| o.inner() == b),
        Value::String(s) => string_key(other).is_some_and(|o| o == s),
        Value::Number(n) => number_val(n).equals(other),
        Value::Array(items) => {
            if other.get_type().kind() != Kind::List || !same_size(other, items.len()) {
                return false;
            }
            let Some(iterable) = other.as_iterable() else {
                return false;
            };
            let mut it = iterable.iter();
            items
                .iter()
                .all(|item| it.next().is_some_and(|o| json_equals(item, o)))
        }
        Value::Object(m) => {
            if other.get_type().kind() != Kind::Map || !same_size(other, m.len()) {
                return false;
            }
            let Some(indexer) = other.as_indexer() else {
                return false;
            };
            m.iter().all(|(k, v)| {
                indexer
                    .get(&CelString::from(k.as_str()))
                    .is_ok_and(|o| json_equals(v, &*o))
            })
        }
    }
}

fn same_size(v: &dyn Val, len: usize) -> bool {
    v.as_sizer()
        .is_some_and(|s| usize::try_from(*s.size().inner()).is_ok_and(|n| n == len))
}

/// The key [`val_to_json`] indexes a view with to get a copy of its JSON in one piece.
#[derive(Debug)]
struct Probe;

impl Val for Probe {
    fn get_type(&self) -> &Type {
        &cel_types::DYN_TYPE
    }
    fn cel_type() -> &'static Type {
        &cel_types::DYN_TYPE
    }
    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(Probe)
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

impl StaticVal for Probe {}

/// A copy of a view's JSON, handed out for a [`Probe`].
#[derive(Debug)]
struct JsonClone(Value);

impl Val for JsonClone {
    fn get_type(&self) -> &Type {
        &cel_types::DYN_TYPE
    }
    fn cel_type() -> &'static Type {
        &cel_types::DYN_TYPE
    }
    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(JsonClone(self.0.clone()))
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

impl StaticVal for JsonClone {}

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
mod tests {
    use serde_json::json;

    use super::*;
    use crate::compile::{expr, template};
    use crate::runtime::ErrorKind;

    fn ev(text: &str, payload: &Value) -> Result<Value, StepError> {
        let e = expr::parse(text).expect("valid expression");
        eval(
            &e,
            &Vars {
                payload: Some(payload),
                ..Vars::default()
            },
        )
    }

    fn ok(text: &str, payload: Value) -> Value {
        ev(text, &payload).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn err(text: &str, payload: Value) -> StepError {
        match ev(text, &payload) {
            Ok(v) => panic!("{text}: expected an error, got {v}"),
            Err(e) => e,
        }
    }

    #[test]
    fn comprehensions_visit_the_keys_of_a_built_map_in_order() {
        // cel's maps are hash maps: without an order, each evaluation could differ.
        for _ in 0..16 {
            assert_eq!(
                ok("{'e': 1, 'b': 2, 'd': 3, 'a': 4, 'c': 5}.map(k, k)", json!({})),
                json!(["a", "b", "c", "d", "e"])
            );
            assert_eq!(
                ok(
                    "{2: 0, 'x': 0, true: 0, -1: 0, 3u: 0}.filter(k, k != 2)",
                    json!({})
                ),
                json!([true, -1, 3, "x"])
            );
            assert_eq!(
                ok("[{'b': 1, 'a': 2.5}].map(m, m.map(k, m[k] + 1))", json!({})),
                json!([[3.5, 2]])
            );
        }
        // A map of the payload is visited in the same order, whatever its document's.
        let p = json!({"m": {"b": 1, "é": 0, "a": 2, "c": 3}});
        let keys = json!(["a", "b", "c", "é"]);
        assert_eq!(ok("payload.m.map(k, k)", p.clone()), keys);
        assert_eq!(ok("dyn(payload.m).map(k, k)", p.clone()), keys);
        assert_eq!(ok("[payload.m][0].filter(k, true)", p.clone()), keys);
        assert_eq!(ok("payload.m.map(k, payload.m[k])", p), json!([2, 1, 3, 0]));
    }

    #[test]
    fn nan_is_not_ordered_and_says_so() {
        for text in [
            "double('NaN') < payload.d",
            "payload.n >= double('NaN')",
            "double('NaN') > 2u",
            "[double('NaN')].exists(v, v <= payload.n)",
        ] {
            let e = err(text, json!({"d": 1.5, "n": 1}));
            assert!(
                e.message
                    .contains("does not order NaN (not a number) with any number"),
                "{text}: {}",
                e.message
            );
        }
        let e = err("payload.x < 1", json!({"x": "a"}));
        assert!(!e.message.contains("NaN"), "{}", e.message);
    }

    #[test]
    fn a_list_plus_a_map_is_no_overload() {
        // CEL's `+` on a list takes a list; a map is not one (its keys are not appended).
        for text in [
            "[1] + payload.m",
            "[] + payload.m",
            "[1] + dyn({'b': 'x'})",
            "dyn([]) + dyn({'b': 'x'})",
            "payload.l + payload.m",
        ] {
            let e = err(text, json!({"l": [1], "m": {"b": "x"}}));
            assert!(
                e.message.ends_with("`+` does not apply to list and map"),
                "{text}: {}",
                e.message
            );
        }
        assert_eq!(ok("[1] + payload.l", json!({"l": [2]})), json!([1, 2]));
        assert_eq!(ok("dyn([1]) + dyn([2])", json!({})), json!([1, 2]));
    }

    #[test]
    fn integers_stay_integers() {
        let v = ok("payload.n + 1", json!({"n": 0}));
        assert_eq!(v, json!(1));
        assert!(v.is_i64(), "{v:?} is an integer");
        assert_eq!(ok("payload.x * 2.0", json!({"x": 1.5})), json!(3.0));
        assert!(ok("payload.x", json!({"x": 1.5})).is_f64());
        assert_eq!(ok("payload.big", json!({"big": u64::MAX})), json!(u64::MAX));
        assert_eq!(ok("payload.neg - 1", json!({"neg": -5})), json!(-6));
    }

    #[test]
    fn comparisons_and_logic() {
        assert_eq!(ok("payload.score >= 50", json!({"score": 50})), json!(true));
        assert_eq!(ok("payload.score >= 50", json!({"score": 49})), json!(false));
        // int against double
        assert_eq!(ok("payload.score >= 49.5", json!({"score": 50})), json!(true));
        assert_eq!(ok("payload.x < 1", json!({"x": 0.5})), json!(true));
        assert_eq!(ok("payload.x == 1", json!({"x": 1.0})), json!(true));
        let p = json!({"ticket": {"priority": "p2", "vip": true}});
        assert_eq!(
            ok("payload.ticket.priority == \"p1\" || payload.ticket.vip", p),
            json!(true)
        );
        let p = json!({"ticket": {"priority": "p1", "vip": false}});
        assert_eq!(
            ok("payload.ticket.priority == \"p1\" || payload.ticket.vip", p),
            json!(true)
        );
        let p = json!({"ticket": {"priority": "p3", "vip": false}});
        assert_eq!(
            ok("payload.ticket.priority == 'p1' || payload.ticket.vip", p),
            json!(false)
        );
    }

    #[test]
    fn size_of_lists_maps_and_strings() {
        assert_eq!(ok("size(payload.rows) == 0", json!({"rows": []})), json!(true));
        assert_eq!(ok("size(payload.rows)", json!({"rows": [1, 2]})), json!(2));
        assert_eq!(ok("payload.rows.size()", json!({"rows": [1, 2, 3]})), json!(3));
        assert_eq!(ok("size(payload.m)", json!({"m": {"a": 1}})), json!(1));
        assert_eq!(ok("size(payload.s)", json!({"s": "héllo"})), json!(5));
        assert_eq!(ok("size(payload)", json!({"a": 1, "b": 2})), json!(2));
    }

    #[test]
    fn locals_and_other_variables() {
        let item = json!({"id": 7, "v": 21});
        let index = json!(3);
        let locals = [("item", &item), ("index", &index)];
        let vars = Vars {
            locals: &locals,
            ..Vars::default()
        };
        let e = |t: &str| eval(&expr::parse(t).unwrap(), &vars).unwrap();
        assert_eq!(e("item.v * 2"), json!(42));
        assert_eq!(e("index + 1"), json!(4));
        assert_eq!(e("{'id': item.id, 'v': item.v * 2}"), json!({"id": 7, "v": 42}));

        let steps = json!({"classify": {"result": {"confidence": 0.5}, "status": "succeeded"}});
        let vars = Vars {
            steps: Some(&steps),
            ..Vars::default()
        };
        let cond = expr::parse("steps.classify.result.confidence < 0.6").unwrap();
        assert!(eval_bool(&cond, &vars).unwrap());
        let steps = json!({"classify": {"result": {"confidence": 0.9}}});
        let vars = Vars {
            steps: Some(&steps),
            ..Vars::default()
        };
        assert!(!eval_bool(&cond, &vars).unwrap());

        // A local shadows a run variable of the same name.
        let p = json!({"a": 1});
        let shadow = json!({"a": 2});
        let locals = [("payload", &shadow)];
        let vars = Vars {
            payload: Some(&p),
            locals: &locals,
            ..Vars::default()
        };
        assert_eq!(eval(&expr::parse("payload.a").unwrap(), &vars).unwrap(), json!(2));
    }

    #[test]
    fn comprehensions() {
        assert_eq!(ok("[1,2,3].exists(x, x > 2)", json!({})), json!(true));
        let p = json!({"items": [{"id": "a", "v": 1}, {"id": "b", "v": 2}, {"id": "c", "v": 3}]});
        assert_eq!(
            ok("payload.items.map(i, i.id)", p.clone()),
            json!(["a", "b", "c"])
        );
        assert_eq!(ok("payload.items.filter(i, i.v > 1).size()", p.clone()), json!(2));
        assert_eq!(
            ok("payload.items.filter(i, i.v > 1)", p.clone()),
            json!([{"id": "b", "v": 2}, {"id": "c", "v": 3}])
        );
        assert_eq!(ok("payload.items.all(i, i.v > 0)", p.clone()), json!(true));
        assert_eq!(ok("payload.items.exists(i, i.id == 'c')", p.clone()), json!(true));
        assert_eq!(
            ok("payload.items.exists_one(i, i.v >= 3)", p.clone()),
            json!(true)
        );
        assert_eq!(
            ok("payload.items.map(i, i.v * 10).exists(x, x == 30)", p.clone()),
            json!(true)
        );
        // Over a map's keys.
        let p = json!({"m": {"a": 1, "b": 2}});
        assert_eq!(ok("payload.m.all(k, payload.m[k] > 0)", p.clone()), json!(true));
        assert_eq!(ok("payload.m.map(k, k)", p.clone()), json!(["a", "b"]));
        assert_eq!(ok("payload.m.exists(k, k == 'b')", p), json!(true));
        // Nested lists.
        let p = json!({"rows": [[1, 2], [3]]});
        assert_eq!(ok("payload.rows.map(r, size(r))", p), json!([2, 1]));
    }

    #[test]
    fn has_on_lazy_values() {
        assert_eq!(ok("has(payload.a)", json!({"a": null})), json!(true));
        assert_eq!(ok("has(payload.a)", json!({"b": 1})), json!(false));
        assert_eq!(ok("has(payload.a.b)", json!({"a": {"b": 1}})), json!(true));
        assert_eq!(ok("has(payload.a.c)", json!({"a": {"b": 1}})), json!(false));
        assert_eq!(
            ok("has(payload.a) && payload.a > 1", json!({"b": 1})),
            json!(false)
        );
        let e = err("has(payload.a.b)", json!({}));
        assert!(e.message.contains("no such key `a`"), "{}", e.message);
    }

    #[test]
    fn in_and_string_functions() {
        let p = json!({"tags": ["x", "y"], "m": {"k": 1}, "s": "hello world", "n": 2});
        assert_eq!(ok("\"x\" in payload.tags", p.clone()), json!(true));
        assert_eq!(ok("'z' in payload.tags", p.clone()), json!(false));
        assert_eq!(ok("'k' in payload.m", p.clone()), json!(true));
        assert_eq!(ok("'q' in payload.m", p.clone()), json!(false));
        assert_eq!(ok("2 in [1, payload.n]", p.clone()), json!(true));
        assert_eq!(ok("payload.s.contains('lo w')", p.clone()), json!(true));
        assert_eq!(ok("payload.s.startsWith('hell')", p.clone()), json!(true));
        assert_eq!(ok("payload.s.endsWith('world')", p.clone()), json!(true));
        assert_eq!(ok("payload.s.matches('^h.*d$')", p.clone()), json!(true));
        assert_eq!(ok("payload.s + '!'", p.clone()), json!("hello world!"));
        assert_eq!(ok("int('12') + payload.n", p.clone()), json!(14));
        assert_eq!(ok("double(payload.n) / 4.0", p.clone()), json!(0.5));
        assert_eq!(ok("string(payload.n)", p.clone()), json!("2"));
        assert_eq!(ok("int(2.7)", p.clone()), json!(2));
        assert_eq!(ok("payload.tags[1]", p.clone()), json!("y"));
        assert_eq!(ok("payload.m['k']", p.clone()), json!(1));
        assert_eq!(ok("payload.tags + ['z']", p.clone()), json!(["x", "y", "z"]));
        assert_eq!(ok("['w'] + payload.tags", p.clone()), json!(["w", "x", "y"]));
        assert_eq!(ok("type(payload.tags) == list", p.clone()), json!(true));
        assert_eq!(
            ok("type(payload.m) == map && type(payload.n) == int", p),
            json!(true)
        );
    }

    #[test]
    fn equality_of_json_containers() {
        let p = json!({"l": [1, "a", {"k": [true]}], "m": {"x": 1, "y": [2]}, "c": [1, "a", {"k": [true]}]});
        assert_eq!(ok("payload.l == [1, 'a', {'k': [true]}]", p.clone()), json!(true));
        assert_eq!(ok("payload.l == [1, 'a']", p.clone()), json!(false));
        assert_eq!(ok("payload.m == {'y': [2], 'x': 1.0}", p.clone()), json!(true));
        assert_eq!(ok("payload.m == {'x': 1}", p.clone()), json!(false));
        assert_eq!(ok("payload.l == payload.c", p.clone()), json!(true));
        assert_eq!(ok("payload.l != payload.m", p.clone()), json!(true));
        assert_eq!(ok("[payload.m] == [payload.m]", p), json!(true));
    }

    /// Evaluates `text` as a value and as a condition, with `payload`.
    fn both(text: &str, payload: &Value) -> (Value, bool) {
        let e = expr::parse(text).expect("valid expression");
        let vars = Vars {
            payload: Some(payload),
            ..Vars::default()
        };
        let v = eval(&e, &vars).unwrap_or_else(|err| panic!("{text}: {err}"));
        let b = eval_bool(&e, &vars).unwrap_or_else(|err| panic!("{text} as a condition: {err}"));
        (v, b)
    }

    #[test]
    fn views_compare_by_content_on_either_side() {
        let p = json!({"v": [1], "w": [1, 2], "m": {"a": 1}, "n": {"k": [1]}, "s": "x",
                       "o": {"b": 2, "a": [1, {"c": null}]}, "e": [], "em": {}});
        let truths = [
            // The examples of the differential check: each was false (or true), silently.
            "[1] == payload.v",
            "!([1, 2] != payload.w)",
            "{'a': 1} == payload.m",
            "[[1]] == [payload.v]",
            "[payload.v] == [[1]]",
            "{'k': [1]} == {'k': payload.v}",
            "{'k': payload.v} == {'k': [1]}",
            "payload.v in [[1]]",
            "payload.m in [{'a': 1}]",
            "payload.n == {'k': [1]}",
            "{'k': [1]} == payload.n",
            // Key order is no part of a map.
            "{'a': [1, {'c': null}], 'b': 2} == payload.o",
            "payload.o == {'a': [1, {'c': null}], 'b': 2}",
            "[{'a': [1, {'c': null}], 'b': 2}] == [payload.o]",
            // Unequal, either way round.
            "[1, 2] != payload.v",
            "payload.v != [1, 2]",
            "[2] != payload.v",
            "{'a': 2} != payload.m",
            "{'a': 1, 'b': 1} != payload.m",
            "!(payload.v in [[2], [1, 1]])",
            "[payload.s] != [[payload.s]]",
            "[] == payload.e && {} == payload.em && payload.e != payload.em",
            // Views in containers cel built, compared with views.
            "[payload.v] == [payload.v]",
            "{'x': payload.m} == {'x': payload.m}",
            "[payload.v, payload.m] == [[1], {'a': 1}]",
            "payload.w.map(x, [x]) == [[1], [2]]",
            "[[1], [2]] == payload.w.map(x, [x])",
            "payload.w.filter(x, x > 1) == [2]",
            "payload.v + [2] == payload.w",
            "payload.w == payload.v + [2]",
            "[[1]].exists(x, x == payload.v)",
            "[payload.v].exists(x, x == [1])",
            // Nested deeper than one level.
            "[[[1]]] == [[payload.v]]",
            "{'a': {'b': payload.n}} == {'a': {'b': {'k': [1]}}}",
        ];
        for text in truths {
            assert_eq!(both(text, &p), (json!(true), true), "`{text}`");
        }
    }

    #[test]
    fn numbers_compare_across_types_inside_containers() {
        // CEL's equality is heterogeneous for numbers: `int`, `uint` and `double` compare as
        // values on one number line, in lists and maps as at the top.
        let p = json!({"i": [1], "d": [1.0], "u": {"a": 18446744073709551615u64}, "m": {"a": 1}});
        for text in [
            "[1] == [1.0]",
            "[1u] == [1]",
            "{'a': 1u} == {'a': 1}",
            "{'a': 1} == {'a': 1.0}",
            "payload.i == [1.0]",
            "[1.0] == payload.i",
            "payload.d == [1]",
            "[1u] == payload.d",
            "payload.i == payload.d",
            "{'a': 1u} == payload.m",
            "payload.m == {'a': 1.0}",
            "payload.u == {'a': 18446744073709551615u}",
            "1.0 in payload.i",
            "1u in payload.d",
            "[1.0] in [payload.i]",
            "payload.i in [[1u]]",
        ] {
            assert_eq!(both(text, &p), (json!(true), true), "`{text}`");
        }
        for text in [
            "[1] == [true]",
            "[1] == ['1']",
            "payload.i == ['1']",
            "{'a': 1} == {'a': 1.5}",
            "payload.m == {1: 1}",
            "{1: 1} == payload.m",
            "[1] == [1.5]",
        ] {
            assert_eq!(both(text, &p), (json!(false), false), "`{text}`");
        }
    }

    #[test]
    fn membership_in_views_matches_cel_maps() {
        let p = json!({"m": {"a": 1, "1": 2}, "l": [1]});
        assert_eq!(
            ok("1 in payload.m", p.clone()),
            ok("1 in {'a': 1, '1': 2}", p.clone())
        );
        assert_eq!(ok("1 in payload.m", p.clone()), json!(false));
        assert_eq!(ok("'1' in payload.m", p.clone()), json!(true));
        assert_eq!(ok("2.5 in payload.m", p.clone()), json!(false));
        // A value of no key type is an error, for a map literal and a view alike.
        let literal = err("[1] in {'a': 1}", p.clone());
        let view = err("payload.l in payload.m", p.clone());
        assert_eq!(
            literal.message,
            "`[1] in {'a': 1}`: found no matching overload for `@in` applied to `(list, map)`"
        );
        assert_eq!(
            view.message,
            "`payload.l in payload.m`: found no matching overload for `@in` applied to `(list, map)`"
        );
        let cause = |text: &str| {
            let m = err(text, p.clone()).message;
            m[m.find("`: ").expect("a cause") + 3..].to_owned()
        };
        assert_eq!(cause("payload.m[[1]]"), cause("{'a': 1, '1': 2}[[1]]"));
        assert_eq!(cause("payload.m[2]"), "no such key `2`");
        assert_eq!(cause("payload.m[2]"), cause("{'a': 1, '1': 2}[2]"));
    }

    #[test]
    fn reads_of_views_that_stand_in() {
        // Expressions that compare and build containers get views that stand in for cel's
        // lists and maps; every other read of them works as before.
        let p = json!({"items": [{"v": 1, "tags": ["a"]}, {"v": 2, "tags": []}], "m": {"k": [3]}});
        assert_eq!(ok("payload.items.map(i, i.v) == [1, 2]", p.clone()), json!(true));
        assert_eq!(ok("payload.items[0].tags == ['a']", p.clone()), json!(true));
        assert_eq!(
            ok("payload.items.filter(i, i.tags == [])", p.clone()),
            json!([{"v": 2, "tags": []}])
        );
        assert_eq!(
            ok("[payload.m.k[0], size(payload.items)]", p.clone()),
            json!([3, 2])
        );
        assert_eq!(ok("payload.m['k'] + [4] == [3, 4]", p.clone()), json!(true));
        assert_eq!(
            ok("has(payload.items[0].v) && [payload.items[1]] != []", p.clone()),
            json!(true)
        );
        assert_eq!(ok("[payload.items][0][1].v", p.clone()), json!(2));
        assert_eq!(ok("{'x': payload.m}.x.k", p.clone()), json!([3]));
        assert_eq!(ok("payload.m.all(k, [k] == ['k'])", p.clone()), json!(true));
        let e = err("[payload.items][0][5]", p);
        assert_eq!(e.message, "`[payload.items][0][5]`: index 5 is out of range");
    }

    #[test]
    fn mixed_numbers_compute_in_double() {
        let p = json!({"amount": 100, "half": 0.5, "n": 7, "big": u64::MAX, "max": i64::MAX,
                       "items": [{"price": 10}, {"price": 3}]});
        // Either operand order, on the direct path and through cel (inside a list, a map,
        // a comprehension), and for `if:` conditions alike.
        for (text, want) in [
            ("payload.amount * 0.5", json!(50.0)),
            ("payload.amount * 0.029", json!(2.9000000000000004)),
            ("[payload.amount * 0.029]", json!([2.9000000000000004])),
            ("0.5 * payload.amount", json!(50.0)),
            ("payload.amount * payload.half", json!(50.0)),
            ("payload.half * payload.amount", json!(50.0)),
            ("payload.n / 2.0", json!(3.5)),
            ("7.0 / payload.n", json!(1.0)),
            ("payload.n + 0.25", json!(7.25)),
            ("0.25 + payload.n", json!(7.25)),
            ("payload.n - 0.5", json!(6.5)),
            ("10.5 - payload.n", json!(3.5)),
            ("2 * 0.25", json!(0.5)),
            ("[payload.amount * 0.5]", json!([50.0])),
            ("[0.5 * payload.amount]", json!([50.0])),
            ("{'fee': payload.amount * 0.25}", json!({"fee": 25.0})),
            ("payload.items.map(i, i.price * 1.5)", json!([15.0, 4.5])),
            ("payload.items.map(i, 0.5 * i.price)", json!([5.0, 1.5])),
            ("size(payload.items) * 0.5", json!(1.0)),
            ("payload.big * 0.5", json!(u64::MAX as f64 * 0.5)),
            ("1u + 0.5", json!(1.5)),
            ("payload.amount * 0.5 + 1", json!(51.0)),
            ("payload.amount * 0.5 > 49 ? 'high' : 'low'", json!("high")),
            ("-payload.n * 0.5", json!(-3.5)),
            // int with int stays int; double with double stays double.
            ("payload.n / 2", json!(3)),
            ("payload.n * 2", json!(14)),
            ("payload.half * 2.0", json!(1.0)),
            ("[payload.n + 1]", json!([8])),
        ] {
            assert_eq!(ok(text, p.clone()), want, "`{text}`");
            let v = ok(text, p.clone());
            assert_eq!(v.is_f64(), want.is_f64(), "`{text}` gives {v}");
        }
        for text in [
            "payload.amount * 0.5 == 50.0",
            "payload.amount * 0.5 == 50",
            "[payload.amount * 0.5] == [50]",
            "payload.items.exists(i, i.price * 0.5 == 1.5)",
            "payload.items.all(i, i.price / 2.0 > 1)",
            "payload.missing || payload.n * 0.5 > 3",
            "payload.n * 0.5 > 3 || payload.missing",
        ] {
            assert_eq!(both(text, &p), (json!(true), true), "`{text}`");
        }
        // What stays an error: `%` on a double, int with uint, integer overflow, strings.
        let e = err("payload.n % 2.0", p.clone());
        assert_eq!(
            e.message,
            "`payload.n % 2.0`: `%` does not apply to int and double: CEL defines it on integers only"
        );
        let e = err("[payload.half % 2]", p.clone());
        assert!(
            e.message.ends_with("CEL defines it on integers only"),
            "{}",
            e.message
        );
        let e = err("payload.max + 1", p.clone());
        assert_eq!(
            e.message,
            "`payload.max + 1`: `+` overflows on 9223372036854775807 and 1"
        );
        let e = err("[payload.max * 2]", p.clone());
        assert!(e.message.contains("`*` overflows"), "{}", e.message);
        let e = err("payload.n + 1u", p.clone());
        assert_eq!(e.message, "`payload.n + 1u`: `+` does not apply to int and uint");
        let e = err("'a' * 0.5", p.clone());
        assert!(e.message.starts_with("`'a' * 0.5`: "), "{}", e.message);
        // The first error still names what failed when mixing is not the cause.
        let e = err("payload.amount * 0.5 + payload.missing", p);
        assert_eq!(
            e.message,
            "`payload.amount * 0.5 + payload.missing`: no such key `missing`"
        );
    }

    #[test]
    fn an_append_in_place_mixes_numbers() {
        let p = json!({"log": [1], "a": 3});
        let vars = Vars {
            payload: Some(&p),
            ..Vars::default()
        };
        let e = expr::parse("payload.log + [payload.a * 0.5, 0.5 * payload.a]").unwrap();
        assert_eq!(appended(&e, &["log"], &vars), Some(vec![json!(1.5), json!(1.5)]));
        let e = expr::parse("payload.log + [payload.a % 0.5]").unwrap();
        assert_eq!(appended(&e, &["log"], &vars), None);
    }

    #[test]
    fn results_convert_to_json() {
        let p = json!({"obj": {"b": 1, "a": [1, 2.5, null, "s"]}, "n": 1});
        // A JSON subtree comes back whole, in its own key order.
        assert_eq!(
            ok("payload.obj", p.clone()).to_string(),
            r#"{"b":1,"a":[1,2.5,null,"s"]}"#
        );
        assert_eq!(ok("payload", p.clone()), p);
        // CEL maps have no order: keys come back sorted.
        assert_eq!(
            ok("{'z': 1, 'a': payload.n}", p.clone()).to_string(),
            r#"{"a":1,"z":1}"#
        );
        assert_eq!(
            ok("{1: 'x', true: 'y'}", p.clone()),
            json!({"1": "x", "true": "y"})
        );
        assert_eq!(
            ok("[payload.obj.a[1], payload.obj]", p.clone()),
            json!([2.5, {"b": 1, "a": [1, 2.5, null, "s"]}])
        );
        assert_eq!(ok("null", p.clone()), json!(null));
        assert_eq!(ok("3u", p.clone()), json!(3));
        let e = err("b'abc'", p.clone());
        assert!(e.message.contains("cannot be written as JSON"), "{}", e.message);
        let e = err("{1: 'a', '1': 'b'}", p);
        assert!(e.message.contains("appears twice"), "{}", e.message);

        assert_eq!(to_json(&cel::Value::Int(3)).unwrap(), json!(3));
        let list = cel::Value::List(Arc::new(vec![
            cel::Value::Float(0.5),
            cel::Value::String(Arc::new("x".into())),
        ]));
        assert_eq!(to_json(&list).unwrap(), json!([0.5, "x"]));
        assert_eq!(
            to_json(&cel::Value::Float(f64::NAN)).unwrap_err().kind,
            ErrorKind::Expression
        );
    }

    #[test]
    fn errors_name_the_expression_and_the_cause() {
        let e = err("payload.x.y", json!({"a": 1}));
        assert_eq!(e.kind, ErrorKind::Expression);
        assert_eq!(e.message, "`payload.x.y`: no such key `x`");
        assert_eq!(e.details, Some(json!({"expression": "payload.x.y"})));
        let e = err("payload.a.missing > 1", json!({"a": {"b": 1}}));
        assert_eq!(e.message, "`payload.a.missing > 1`: no such key `missing`");
        let e = err("payload.l[5]", json!({"l": [1]}));
        assert_eq!(e.message, "`payload.l[5]`: index 5 is out of range");
        let e = err("payload.s + 1", json!({"s": "x"}));
        assert!(e.message.starts_with("`payload.s + 1`: "), "{}", e.message);
        let e = err("payload.x % 2", json!({"x": 2.5}));
        assert_eq!(
            e.message,
            "`payload.x % 2`: `%` does not apply to double and int: CEL defines it on integers only"
        );
        let e = err("payload.n + 1u", json!({"n": 2}));
        assert_eq!(e.message, "`payload.n + 1u`: `+` does not apply to int and uint");
        let e = err("payload.n / 0", json!({"n": 1}));
        assert_eq!(e.message, "`payload.n / 0`: division by zero");
        let e = err("payload.m + 1", json!({"m": {}}));
        assert_eq!(e.message, "`payload.m + 1`: `+` does not apply to map and int");
        let e = err("payload.l * 2", json!({"l": []}));
        assert_eq!(e.message, "`payload.l * 2`: `*` does not apply to list and int");
        let e = err("payload.l < 2", json!({"l": []}));
        assert!(e.message.contains("(list, int)"), "{}", e.message);
        let e = err("result.ok", json!({}));
        assert_eq!(e.message, "`result.ok`: `result` is not available here");
        let e = err("nope + 1", json!({}));
        assert_eq!(e.message, "`nope + 1`: unknown name `nope`");
    }

    #[test]
    fn eval_bool_requires_a_boolean() {
        let p = json!({"n": 3, "ok": true});
        let vars = Vars {
            payload: Some(&p),
            ..Vars::default()
        };
        assert!(eval_bool(&expr::parse("payload.ok").unwrap(), &vars).unwrap());
        let e = eval_bool(&expr::parse("payload.n").unwrap(), &vars).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Expression);
        assert_eq!(e.message, "`payload.n`: must return a boolean, got int 3");
        let e = eval_bool(&expr::parse("payload.missing").unwrap(), &vars).unwrap_err();
        assert_eq!(e.message, "`payload.missing`: no such key `missing`");
    }

    #[test]
    fn templates_see_only_what_they_name() {
        let p = json!({"amount": 12, "customer": {"name": "Ann", "id": 4}, "big": [1, 2, 3]});
        let item = json!({"id": 9});
        let locals = [("item", &item)];
        let vars = Vars {
            payload: Some(&p),
            locals: &locals,
            ..Vars::default()
        };
        let t =
            template::compile("Refund {{ payload.amount }} to {{ payload.customer.name }} ({{ item.id }})")
                .unwrap();
        assert_eq!(render(&t, &vars).unwrap(), "Refund 12 to Ann (9)");
        assert_eq!(
            template_context(&t, &vars),
            json!({"payload": {"amount": 12, "customer": {"name": "Ann"}}, "item": {"id": 9}})
        );
        // Used another way, a variable is copied whole at that level.
        let t = template::compile("{% for x in payload.big %}{{ x }}{% endfor %} {{ payload['amount'] }}")
            .unwrap();
        assert_eq!(render(&t, &vars).unwrap(), "123 12");
        assert_eq!(template_context(&t, &vars), json!({"payload": p}));
        let t = template::compile("{{ payload.customer.name | upper }} {{ payload . amount }}").unwrap();
        assert_eq!(render(&t, &vars).unwrap(), "ANN 12");
        // A missing key is copied around, so the error names it.
        let t = template::compile("{{ payload.customer.nmae }}").unwrap();
        let e = render(&t, &vars).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Expression);
        assert!(
            e.message.contains("`payload.customer.nmae` is undefined"),
            "{}",
            e.message
        );
        let t = template::compile("{{ result }}").unwrap();
        let e = render(&t, &vars).unwrap_err();
        assert!(e.message.contains("`result` is undefined"), "{}", e.message);
        // Plain text is not a template.
        let t = template::compile("no tags here").unwrap();
        assert_eq!(render(&t, &Vars::default()).unwrap(), "no tags here");
    }

    /// Not a timed assertion: prints what one evaluation costs (run with `--release
    /// --nocapture` for meaningful numbers).
    #[test]
    fn measure_eval_cost() {
        let mut payload = json!({"n": 0});
        for k in 0..19 {
            payload[format!("key{k}")] = json!({"text": "some text", "list": [1, 2, 3], "k": k});
        }
        let e = expr::parse("payload.n + 1").unwrap();
        let cond = expr::parse("payload.score >= 50").unwrap();
        payload["score"] = json!(70);
        let rounds = 20_000;
        let start = std::time::Instant::now();
        let mut sum = 0;
        for _ in 0..rounds {
            let vars = Vars {
                payload: Some(&payload),
                ..Vars::default()
            };
            sum += eval(&e, &vars).expect("evaluates").as_i64().expect("an integer");
        }
        let per_eval = start.elapsed().as_secs_f64() * 1e9 / f64::from(rounds);
        assert_eq!(sum, i64::from(rounds));
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            let vars = Vars {
                payload: Some(&payload),
                ..Vars::default()
            };
            assert!(eval_bool(&cond, &vars).expect("evaluates"));
        }
        let per_bool = start.elapsed().as_secs_f64() * 1e9 / f64::from(rounds);
        println!(
            "eval `payload.n + 1` over a 21-key payload: {per_eval:.0} ns; eval_bool `payload.score >= 50`: {per_bool:.0} ns"
        );
    }

    /// The direct path and cel agree: same value, or the direct path gives up (and cel
    /// answers, errors included).
    fn agree(text: &str, vars: &Vars) {
        let e = expr::parse(text).expect("valid expression");
        let cel = eval_cel(&e, vars);
        match direct::eval(e.ast(), vars) {
            Some(d) => {
                let cel = cel.unwrap_or_else(|err| panic!("`{text}`: direct answered, cel failed: {err}"));
                assert_eq!(d.into_json(), cel, "`{text}`");
            }
            None => {
                // Nothing to compare; `eval` is cel then.
                assert_eq!(eval(&e, vars).map_err(|x| x.message), cel.map_err(|x| x.message));
            }
        }
        let cel_bool = eval_bool_cel(&e, vars).map_err(|x| x.message);
        assert_eq!(
            eval_bool(&e, vars).map_err(|x| x.message),
            cel_bool,
            "`{text}` as a condition"
        );
    }

    #[test]
    fn the_direct_path_answers_as_cel_does() {
        let payload = json!({
            "n": 7, "z": 0, "neg": -3, "max": i64::MAX, "min": i64::MIN, "big": u64::MAX,
            "f": 2.5, "one": 1.0, "s": "low", "t": true, "nul": null,
            "o": {"a": {"b": 4}, "s": "x"}, "l": [1, 2],
        });
        let context = json!({"n": 10});
        let item = json!({"id": 3, "v": 21});
        let locals = [("item", &item)];
        let vars = Vars {
            payload: Some(&payload),
            context: Some(&context),
            locals: &locals,
            ..Vars::default()
        };
        let operands = [
            "payload.n",
            "payload.z",
            "payload.neg",
            "payload.max",
            "payload.min",
            "payload.big",
            "payload.f",
            "payload.one",
            "payload.s",
            "payload.t",
            "payload.nul",
            "payload.o",
            "payload.o.a.b",
            "payload.o.s",
            "payload.l",
            "payload.missing",
            "payload.o.a.missing",
            "context.n",
            "item.v",
            "nope",
            "0",
            "2",
            "-1",
            "1.0",
            "2u",
            "'low'",
            "\"x\"",
            "true",
            "null",
            "payload.n + 1",
        ];
        let ops = ["+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!="];
        for a in operands {
            agree(a, &vars);
            for op in ops {
                for b in operands {
                    agree(&format!("{a} {op} {b}"), &vars);
                }
            }
        }
        for text in [
            "has(payload.n)",
            "payload.n < context.n && payload.t",
            "-payload.n",
            "payload['n'] + 1",
            "payload.l[0] + 1",
            "size(payload.l) > 1",
            "(payload.n + 1) * (item.v - 1) % 5 == 0",
        ] {
            agree(text, &vars);
        }
    }

    #[test]
    fn the_direct_path_takes_the_common_forms() {
        let payload = json!({"n": 7, "s": "a", "o": {"x": [1]}});
        let vars = Vars {
            payload: Some(&payload),
            ..Vars::default()
        };
        let d = |text: &str| {
            direct::eval(expr::parse(text).expect("valid").ast(), &vars).map(direct::Direct::into_json)
        };
        assert_eq!(d("payload.n + 1"), Some(json!(8)));
        assert_eq!(d("payload.n % 5 >= 2"), Some(json!(true)));
        assert_eq!(d("payload.s != 'a'"), Some(json!(false)));
        assert_eq!(d("payload.o"), Some(json!({"x": [1]})));
        // Off the path: cel's.
        assert_eq!(d("payload.n / 0"), None);
        assert_eq!(d("payload.missing"), None);
        assert_eq!(d("payload.n + 1.5"), Some(json!(8.5)));
        assert_eq!(d("0.5 * payload.n"), Some(json!(3.5)));
        assert_eq!(d("payload.n % 2.0"), None);
        assert_eq!(d("payload.n / 0.0"), None);
    }
}
