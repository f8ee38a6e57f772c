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
pub fn compare(a: &dyn Val, b: &dyn Val) -> Ordering {
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
