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
