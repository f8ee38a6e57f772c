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
        Node::Literal(LiteralValue::Double(d)) if d.inner().is_finite() => Some(Direct::Double(*d.inner())),
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
