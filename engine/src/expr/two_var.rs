//! cel-go's two-variable comprehensions (SPEC §5.1): `r.all(k, v, p)`, `r.exists(k, v, p)`,
//! `r.existsOne(k, v, p)` (and `exists_one`), `r.transformList(k, v, [filter,] f)`,
//! `r.transformMap(k, v, [filter,] f)` and `r.transformMapEntry(k, v, [filter,] f)`. Over a
//! list, `k` is the index and `v` the element; over a map, `k` is the key and `v` its value.
//!
//! cel's parser expands only the standard one-variable macros, and leaves these as calls. So
//! [`expand`] rewrites each such call, after parsing, into the comprehension cel-go builds: the
//! two names as its `iter_var` and `iter_var2`, the accumulator `@result`. The steps of
//! `transformMap` and `transformMapEntry` call [`TRANSFORM_MAP`] and [`TRANSFORM_MAP_ENTRY`]
//! on the accumulator and the written value (the key is the iteration's own). cel's
//! interpreter iterates one variable only: the evaluator lowers these comprehensions before it
//! runs them (`eval/two_var.rs`).

use cel::common::ast::{
    CallExpr, ComprehensionExpr, Expr as Node, ListExpr, LiteralValue, MapExpr, operators,
};
use cel::parser::Expression;

/// The step of `transformMap`: `@transform_map(@result, value)` adds `key: value`.
pub const TRANSFORM_MAP: &str = "@transform_map";
/// The step of `transformMapEntry`: `@transform_map_entry(@result, entry)` adds the entries
/// of the map `entry`.
pub const TRANSFORM_MAP_ENTRY: &str = "@transform_map_entry";

const ACCU: &str = "@result";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    All,
    Exists,
    ExistsOne,
    TransformList,
    TransformMap,
    TransformMapEntry,
}

/// The two-variable macro a call is written as, by its name and argument count.
fn kind_of(call: &CallExpr) -> Option<Kind> {
    call.target.as_ref()?;
    let n = call.args.len();
    Some(match call.func_name.as_str() {
        operators::ALL if n == 3 => Kind::All,
        operators::EXISTS if n == 3 => Kind::Exists,
        "existsOne" | operators::EXISTS_ONE if n == 3 => Kind::ExistsOne,
        "transformList" if n == 3 || n == 4 => Kind::TransformList,
        "transformMap" if n == 3 || n == 4 => Kind::TransformMap,
        "transformMapEntry" if n == 3 || n == 4 => Kind::TransformMapEntry,
        _ => return None,
    })
}

/// Whether `name` called on a receiver with `args` arguments is a two-variable macro.
pub fn is_two_var(name: &str, args: usize) -> bool {
    match name {
        "all" | "exists" | "existsOne" | "exists_one" => args == 3,
        "transformList" | "transformMap" | "transformMapEntry" => args == 3 || args == 4,
        _ => false,
    }
}

/// A call that cannot be expanded: the AST id of the call, and why.
pub struct Refused {
    pub id: u64,
    pub message: String,
}

/// Whether `e` holds a call of a two-variable macro; the first that cannot be expanded (its
/// variables are not simple names, or the same name twice) is an error.
pub fn check(e: &Expression) -> Result<bool, Refused> {
    let mut found = false;
    let mut refused = None;
    super::eval::visit(e, &mut |x| {
        if refused.is_some() {
            return;
        }
        if let Node::Call(call) = &x.expr
            && kind_of(call).is_some()
        {
            found = true;
            let name = |a: &Expression| match &a.expr {
                Node::Ident(n) => Some(n.clone()),
                _ => None,
            };
            refused = match (name(&call.args[0]), name(&call.args[1])) {
                (Some(k), Some(v)) if k == v => Some(Refused {
                    id: x.id,
                    message: format!("`{}` declares `{k}` twice", call.func_name),
                }),
                (Some(_), Some(_)) => None,
                _ => Some(Refused {
                    id: x.id,
                    message: format!(
                        "the first two arguments of `{}` must be simple names",
                        call.func_name
                    ),
                }),
            };
        }
    });
    match refused {
        Some(r) => Err(r),
        None => Ok(found),
    }
}

/// Rewrites every call of a two-variable macro in `e` into its comprehension. [`check`] must
/// have passed. New nodes take ids from `next_id` up.
pub fn expand(e: &mut Expression, next_id: &mut u64) {
    let mut each = |x: &mut Expression| expand_one(x, next_id);
    each(e);
    super::eval::visit_mut(e, &mut each);
}

fn expand_one(e: &mut Expression, next_id: &mut u64) {
    let Node::Call(call) = &mut e.expr else { return };
    let Some(kind) = kind_of(call) else { return };
    let mut node = |expr: Node| {
        *next_id += 1;
        Expression { id: *next_id, expr }
    };
    let range = *call.target.take().expect("a receiver");
    let mut args = std::mem::take(&mut call.args).into_iter();
    let ident = |a: Option<Expression>| match a.map(|a| a.expr) {
        Some(Node::Ident(n)) => n,
        _ => unreachable!("checked: a simple name"),
    };
    let (k, v) = (ident(args.next()), ident(args.next()));
    let rest: Vec<Expression> = args.collect();
    let (filter, f) = match <[Expression; 2]>::try_from(rest) {
        Ok([filter, f]) => (Some(filter), f),
        Err(mut one) => (None, one.pop().expect("one argument left")),
    };
    let call_node = |node: &mut dyn FnMut(Node) -> Expression, name: &str, args: Vec<Expression>| {
        node(Node::Call(CallExpr {
            func_name: name.to_owned(),
            target: None,
            args,
        }))
    };
    let accu = |node: &mut dyn FnMut(Node) -> Expression| node(Node::Ident(ACCU.to_owned()));
    let boolean = |node: &mut dyn FnMut(Node) -> Expression, b: bool| {
        node(Node::Literal(LiteralValue::Boolean(b.into())))
    };
    let int =
        |node: &mut dyn FnMut(Node) -> Expression, i: i64| node(Node::Literal(LiteralValue::Int(i.into())));
    let node: &mut dyn FnMut(Node) -> Expression = &mut node;
    let (init, cond, step, result) = match kind {
        Kind::All | Kind::Exists => {
            let all = kind == Kind::All;
            let init = boolean(node, all);
            let a = accu(node);
            let cond_arg = if all {
                a
            } else {
                call_node(node, operators::LOGICAL_NOT, vec![a])
            };
            let cond = call_node(node, operators::NOT_STRICTLY_FALSE, vec![cond_arg]);
            let a = accu(node);
            let op = if all {
                operators::LOGICAL_AND
            } else {
                operators::LOGICAL_OR
            };
            let step = call_node(node, op, vec![a, f]);
            (init, cond, step, accu(node))
        }
        Kind::ExistsOne => {
            let init = int(node, 0);
            let cond = boolean(node, true);
            let (a, one) = (accu(node), int(node, 1));
            let plus = call_node(node, operators::ADD, vec![a, one]);
            let a = accu(node);
            let step = call_node(node, operators::CONDITIONAL, vec![f, plus, a]);
            let (a, one) = (accu(node), int(node, 1));
            let result = call_node(node, operators::EQUALS, vec![a, one]);
            (init, cond, step, result)
        }
        Kind::TransformList | Kind::TransformMap | Kind::TransformMapEntry => {
            let init = match kind {
                Kind::TransformList => node(Node::List(ListExpr::default())),
                _ => node(Node::Map(MapExpr::default())),
            };
            let cond = boolean(node, true);
            let a = accu(node);
            let add = match kind {
                Kind::TransformList => {
                    let one = node(Node::List(ListExpr {
                        elements: vec![f],
                        optional_indices: Vec::new(),
                    }));
                    call_node(node, operators::ADD, vec![a, one])
                }
                Kind::TransformMap => call_node(node, TRANSFORM_MAP, vec![a, f]),
                _ => call_node(node, TRANSFORM_MAP_ENTRY, vec![a, f]),
            };
            let step = match filter {
                Some(p) => {
                    let a = accu(node);
                    call_node(node, operators::CONDITIONAL, vec![p, add, a])
                }
                None => add,
            };
            (init, cond, step, accu(node))
        }
    };
    e.expr = Node::Comprehension(Box::new(ComprehensionExpr {
        iter_range: range,
        iter_var: k,
        iter_var2: Some(v),
        accu_var: ACCU.to_owned(),
        accu_init: init,
        loop_cond: cond,
        loop_step: step,
        result,
    }));
}

#[cfg(test)]
mod tests {
    use crate::expr::{Macro, macro_of, parse};
    use cel::common::ast::Expr as Node;

    fn refs(text: &str) -> Vec<(String, &str)> {
        let e = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        e.references()
            .into_iter()
            .map(|r| (r.root, &text[r.start..r.end]))
            .collect()
    }

    #[test]
    fn the_two_variables_are_bound_and_the_rest_is_read() {
        assert_eq!(
            refs("payload.m.all(k, v, k == payload.key && v > x)"),
            [
                ("payload".to_owned(), "payload.m"),
                ("payload".to_owned(), "payload.key"),
                ("x".to_owned(), "x"),
            ]
        );
        // The same names are read again after the macro, and in its range.
        assert_eq!(
            refs("k.transformMap(k, v, v) == v"),
            [("k".to_owned(), "k"), ("v".to_owned(), "v")]
        );
        let text = "l.transformList(i, v, i > 0, v) + [i]";
        let got = refs(text);
        assert_eq!(got.last().map(|r| r.1), Some("i"));
        assert_eq!(
            parse(text).unwrap().references().last().map(|r| r.start),
            Some(35)
        );
    }

    #[test]
    fn each_macro_becomes_its_comprehension() {
        for (text, want) in [
            ("m.all(k, v, v)", "all"),
            ("m.exists(k, v, v)", "exists"),
            ("m.existsOne(k, v, v)", "existsOne"),
            ("m.exists_one(k, v, v)", "existsOne"),
            ("m.transformList(k, v, v)", "map"),
            ("m.transformList(k, v, k > 0, v)", "map filter"),
            ("m.transformMap(k, v, v)", "transformMap"),
            ("m.transformMap(k, v, k > 0, v)", "transformMap filter"),
            ("m.transformMapEntry(k, v, {v: k})", "transformMapEntry"),
            (
                "m.transformMapEntry(k, v, k > 0, {v: k})",
                "transformMapEntry filter",
            ),
        ] {
            let e = parse(text).unwrap();
            let Node::Comprehension(c) = &e.ast().expr else {
                panic!("{text}: not expanded")
            };
            assert_eq!(
                (c.iter_var.as_str(), c.iter_var2.as_deref()),
                ("k", Some("v")),
                "{text}"
            );
            let got = match macro_of(c) {
                Some(Macro::All(_)) => "all",
                Some(Macro::Exists(_)) => "exists",
                Some(Macro::ExistsOne(_)) => "existsOne",
                Some(Macro::Map { filter: None, .. }) => "map",
                Some(Macro::Map { filter: Some(_), .. }) => "map filter",
                Some(Macro::TransformMap {
                    filter, entry: false, ..
                }) => ["transformMap", "transformMap filter"][usize::from(filter.is_some())],
                Some(Macro::TransformMap {
                    filter, entry: true, ..
                }) => ["transformMapEntry", "transformMapEntry filter"][usize::from(filter.is_some())],
                None => "none",
            };
            assert_eq!(got, want, "{text}");
            // Nothing of the expansion is a call a user wrote.
            assert_eq!(e.calls(), [], "{text}");
        }
    }

    #[test]
    fn other_arities_stay_calls() {
        for text in [
            "m.transformList(k, v)",
            "m.all(a, b, c, d)",
            "transformMap(k, v, v)",
        ] {
            let e = parse(text).unwrap();
            assert!(matches!(e.ast().expr, Node::Call(_)), "{text}");
            assert_eq!(e.calls().len(), 1, "{text}");
        }
    }

    #[test]
    fn variables_must_be_two_simple_names() {
        for (text, message, at) in [
            ("m.all(k, k, true)", "`all` declares `k` twice", "all"),
            (
                "[1].transformList(a.b, v, v)",
                "the first two arguments of `transformList` must be simple names",
                "transformList",
            ),
            (
                "x + m.exists(1, v, true)",
                "the first two arguments of `exists` must be simple names",
                "exists",
            ),
        ] {
            let err = parse(text).err().unwrap_or_else(|| panic!("{text}: parses"));
            assert_eq!(err.message, message, "{text}");
            assert_eq!(&text[err.start..err.end], at, "{text}");
        }
    }
}
