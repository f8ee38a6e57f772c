//! Two-variable comprehensions (`m.all(k, v, p)`, `l.transformList(i, v, f)`, ..., see
//! `expr/two_var.rs`) as cel runs them. cel's interpreter binds one variable per iteration, so
//! [`lower`] rewrites each such comprehension to iterate [`ENTRIES`]`(range)`, a list of
//! `[key, value]` pairs (a list's index and element, a map's key and value, keys in the order
//! of `order.rs`), into a hidden variable, and binds the two written names to the pair's
//! halves around each written part, as `cel.bind` does. The loop keeps the shape of the macro
//! it came from, so cel treats errors of `all` and `exists` as it does for one variable (a
//! later `false` in `all` absorbs an earlier error) and appends in place for `transformList`.
//! `transformMap` and `transformMapEntry` add to their map with [`MAP_INSERT`] and
//! [`MAP_INSERT_ENTRY`]; a key added twice is an error.

use std::collections::HashMap;

use cel::Env;
use cel::ExecutionError;
use cel::common::ast::{CallExpr, ComprehensionExpr, Expr as Node, ListExpr, LiteralValue, operators};
use cel::common::types::{self as cel_types, CelInt, CelList, CelMap, CelMapKey, Kind};
use cel::common::value::{CowVal, Val};
use cel::parser::Expression;

use crate::expr::{Macro, macro_of};

pub const ENTRIES: &str = "@entries";
pub const MAP_INSERT: &str = "@map_insert";
pub const MAP_INSERT_ENTRY: &str = "@map_insert_entry";

/// The variable holding the current `[key, value]` pair.
const PAIR: &str = "@pair";

/// Declares the functions lowered comprehensions call.
pub fn register(env: &mut Env) {
    let dyn_n = |n| (0..n).map(|_| cel_types::DYN_TYPE).collect::<Vec<_>>();
    env.add_overload(ENTRIES, ENTRIES, dyn_n(1), |args| {
        let range = args.first().ok_or_else(|| internal(ENTRIES))?;
        entries(&**range).map(CowVal::owned)
    })
    .expect("the name is new to the standard library");
    env.add_overload(MAP_INSERT, MAP_INSERT, dyn_n(3), |args| {
        let [map, key, value] = <[_; 3]>::try_from(args).map_err(|_| internal(MAP_INSERT))?;
        let mut out = copy(&*map)?;
        insert(&mut out, key.into_owned(), value.into_owned(), "transformMap")?;
        Ok(CowVal::owned(CelMap::from(out)))
    })
    .expect("the name is new to the standard library");
    env.add_overload(MAP_INSERT_ENTRY, MAP_INSERT_ENTRY, dyn_n(2), |args| {
        let [map, entry] = <[_; 2]>::try_from(args).map_err(|_| internal(MAP_INSERT_ENTRY))?;
        let mut out = copy(&*map)?;
        let function = "transformMapEntry";
        let keys = entry
            .as_iterable()
            .filter(|_| entry.get_type().kind() == Kind::Map)
            .ok_or_else(|| {
                ExecutionError::function_error(
                    function,
                    format!("the value must be a map, got {}", entry.get_type().name()),
                )
            })?;
        let indexer = entry.as_indexer().ok_or_else(|| internal(MAP_INSERT_ENTRY))?;
        let mut it = keys.iter();
        while let Some(k) = it.next() {
            let value = indexer.get(k)?.into_owned();
            insert(&mut out, k.clone_as_boxed(), value, function)?;
        }
        Ok(CowVal::owned(CelMap::from(out)))
    })
    .expect("the name is new to the standard library");
}

fn internal(function: &str) -> ExecutionError {
    ExecutionError::function_error(function, "called with the wrong arguments")
}

/// `[[key, value], ...]`: a list's indexes and elements, or a map's keys (in order) and values.
fn entries<'v>(range: &(dyn Val + 'v)) -> Result<CelList<'v>, ExecutionError> {
    let ty = range.get_type();
    let not_iterable = || ExecutionError::UnexpectedType {
        got: ty.name().to_owned(),
        want: "list or map".to_owned(),
    };
    let items = range.as_iterable().ok_or_else(not_iterable)?;
    let mut out: Vec<Box<dyn Val + 'v>> = Vec::new();
    let pair = |k: Box<dyn Val + 'v>, v: Box<dyn Val + 'v>| -> Box<dyn Val + 'v> {
        Box::new(CelList::from(vec![k, v]))
    };
    match ty.kind() {
        Kind::List => {
            let mut it = items.iter();
            let mut i = 0i64;
            while let Some(v) = it.next() {
                out.push(pair(Box::new(CelInt::from(i)), v.clone_as_boxed()));
                i += 1;
            }
        }
        Kind::Map => {
            let indexer = range.as_indexer().ok_or_else(not_iterable)?;
            let mut keys: Vec<Box<dyn Val + 'v>> = Vec::new();
            let mut it = items.iter();
            while let Some(k) = it.next() {
                keys.push(k.clone_as_boxed());
            }
            keys.sort_by(|a, b| super::order::compare(&**a, &**b));
            for k in keys {
                let v = indexer.get(&*k)?.into_owned();
                out.push(pair(k, v));
            }
        }
        _ => return Err(not_iterable()),
    }
    Ok(CelList::from(out))
}

/// The entries of the accumulated map (`{}` at first), copied.
fn copy<'v>(map: &(dyn Val + 'v)) -> Result<HashMap<CelMapKey<'v>, Box<dyn Val + 'v>>, ExecutionError> {
    let map = map.downcast_ref::<CelMap>().ok_or_else(|| internal(MAP_INSERT))?;
    Ok(map
        .inner()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone_as_boxed()))
        .collect())
}

fn insert<'v>(
    map: &mut HashMap<CelMapKey<'v>, Box<dyn Val + 'v>>,
    key: Box<dyn Val + 'v>,
    value: Box<dyn Val + 'v>,
    function: &str,
) -> Result<(), ExecutionError> {
    let shown = super::key_text_of(&*key);
    let key = CelMapKey::try_from(key)
        .map_err(|_| ExecutionError::function_error(function, format!("{shown} cannot be a map key")))?;
    if map.contains_key(&key) {
        return Err(ExecutionError::function_error(
            function,
            format!("insert failed: key {shown} already exists"),
        ));
    }
    map.insert(key, value);
    Ok(())
}

/// Whether `ast` holds a two-variable comprehension.
pub fn any(ast: &Expression) -> bool {
    let mut found = false;
    super::visit(ast, &mut |e| {
        found |= matches!(&e.expr, Node::Comprehension(c) if c.iter_var2.is_some());
    });
    found
}

/// Rewrites every two-variable comprehension in `ast` into one cel runs (see the module).
pub fn lower(ast: &mut Expression) {
    let mut next_id = max_id(ast);
    let mut each = |e: &mut Expression| {
        if let Node::Comprehension(c) = &mut e.expr
            && c.iter_var2.is_some()
            && let Some(lowered) = lower_one(c, &mut next_id)
        {
            **c = lowered;
        }
    };
    each(ast);
    super::visit_mut(ast, &mut each);
}

fn max_id(ast: &Expression) -> u64 {
    let mut max = 0;
    super::visit(ast, &mut |e| max = max.max(e.id));
    max
}

fn lower_one(c: &ComprehensionExpr, next_id: &mut u64) -> Option<ComprehensionExpr> {
    let (k, v) = (c.iter_var.as_str(), c.iter_var2.as_deref()?);
    let mut b = Builder { next_id, k, v };
    let accu = c.accu_var.as_str();
    let step = match macro_of(c)? {
        Macro::All(p) | Macro::Exists(p) => {
            let op = match &c.loop_step.expr {
                Node::Call(call) => call.func_name.clone(),
                _ => return None,
            };
            let (a, p) = (b.ident(accu), b.bound(p));
            b.call(&op, vec![a, p])
        }
        Macro::ExistsOne(p) => {
            let p = b.bound(p);
            let (a, one) = (b.ident(accu), b.int(1));
            let plus = b.call(operators::ADD, vec![a, one]);
            let a = b.ident(accu);
            b.call(operators::CONDITIONAL, vec![p, plus, a])
        }
        Macro::Map { filter, transform } => {
            let (a, f) = (b.ident(accu), b.bound(transform));
            let one = b.node(Node::List(ListExpr {
                elements: vec![f],
                optional_indices: Vec::new(),
            }));
            let add = b.call(operators::ADD, vec![a, one]);
            b.guarded(filter, add, accu)
        }
        Macro::TransformMap {
            filter,
            transform,
            entry,
        } => {
            let (a, f) = (b.ident(accu), b.bound(transform));
            let add = if entry {
                b.call(MAP_INSERT_ENTRY, vec![a, f])
            } else {
                let key = b.half(0);
                b.call(MAP_INSERT, vec![a, key, f])
            };
            b.guarded(filter, add, accu)
        }
    };
    let range = c.iter_range.clone();
    Some(ComprehensionExpr {
        iter_range: b.call(ENTRIES, vec![range]),
        iter_var: PAIR.to_owned(),
        iter_var2: None,
        accu_var: c.accu_var.clone(),
        accu_init: c.accu_init.clone(),
        loop_cond: c.loop_cond.clone(),
        loop_step: step,
        result: c.result.clone(),
    })
}

/// Makes the nodes of a lowered comprehension, with fresh ids.
struct Builder<'a> {
    next_id: &'a mut u64,
    k: &'a str,
    v: &'a str,
}

impl Builder<'_> {
    fn node(&mut self, expr: Node) -> Expression {
        *self.next_id += 1;
        Expression {
            id: *self.next_id,
            expr,
        }
    }

    fn ident(&mut self, name: &str) -> Expression {
        self.node(Node::Ident(name.to_owned()))
    }

    fn int(&mut self, i: i64) -> Expression {
        self.node(Node::Literal(LiteralValue::Int(i.into())))
    }

    fn call(&mut self, name: &str, args: Vec<Expression>) -> Expression {
        self.node(Node::Call(CallExpr {
            func_name: name.to_owned(),
            target: None,
            args,
        }))
    }

    /// `@pair[i]`.
    fn half(&mut self, i: i64) -> Expression {
        let (pair, i) = (self.ident(PAIR), self.int(i));
        self.call(operators::INDEX, vec![pair, i])
    }

    /// `cond ? add : accu`, or `add` without a condition.
    fn guarded(&mut self, filter: Option<&Expression>, add: Expression, accu: &str) -> Expression {
        match filter {
            Some(p) => {
                let p = self.bound(p);
                let a = self.ident(accu);
                self.call(operators::CONDITIONAL, vec![p, add, a])
            }
            None => add,
        }
    }

    /// `e` with the two variables bound to the halves of the pair.
    fn bound(&mut self, e: &Expression) -> Expression {
        let (k, v) = (self.k.to_owned(), self.v.to_owned());
        let value = self.half(1);
        let inner = self.bind(v, value, e.clone());
        let key = self.half(0);
        self.bind(k, key, inner)
    }

    /// `cel.bind(name, init, body)`: a comprehension over nothing whose accumulator is `name`.
    fn bind(&mut self, name: String, init: Expression, body: Expression) -> Expression {
        let range = self.node(Node::List(ListExpr::default()));
        let cond = self.node(Node::Literal(LiteralValue::Boolean(false.into())));
        let step = self.ident(&name);
        self.node(Node::Comprehension(Box::new(ComprehensionExpr {
            iter_range: range,
            iter_var: "#unused".to_owned(),
            iter_var2: None,
            accu_var: name,
            accu_init: init,
            loop_cond: cond,
            loop_step: step,
            result: body,
        })))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::expr::eval::{Vars, eval};

    fn ev(text: &str, payload: &Value) -> Result<Value, String> {
        let e = crate::expr::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let vars = Vars {
            payload: Some(payload),
            ..Vars::default()
        };
        eval(&e, &vars).map_err(|e| e.message)
    }

    /// Each case gives the same answer with its range written as a literal and read from
    /// the payload (`payload.r`, a lazy view).
    fn same(cases: &[(&str, &str, Value)]) {
        for (range, rest, want) in cases {
            let literal = format!("{range}.{rest}");
            assert_eq!(ev(&literal, &json!({})).as_ref(), Ok(want), "`{literal}`");
            let r: Value = serde_json::from_str(&range.replace('\'', "\"")).expect("JSON");
            let read = format!("payload.r.{rest}");
            assert_eq!(
                ev(&read, &json!({ "r": r })).as_ref(),
                Ok(want),
                "`{read}` over {range}"
            );
        }
    }

    fn fails(text: &str, cause: &str) {
        match ev(text, &json!({})) {
            Ok(v) => panic!("`{text}`: expected an error, got {v}"),
            Err(e) => assert!(e.contains(cause), "`{text}`: {e}"),
        }
    }

    #[test]
    fn quantifiers_see_index_and_element_or_key_and_value() {
        same(&[
            ("[5, 6, 7]", "all(i, v, v == i + 5)", json!(true)),
            ("[5, 6, 7]", "all(i, v, i < 2)", json!(false)),
            ("[]", "all(i, v, false)", json!(true)),
            ("[5, 6, 7]", "exists(i, v, i == 2 && v == 7)", json!(true)),
            ("[5, 6, 7]", "exists(i, v, i == v)", json!(false)),
            (
                "{'a': 1, 'b': 2}",
                "exists(k, v, k == 'b' && v == 2)",
                json!(true),
            ),
            ("{'a': 1, 'b': 2}", "all(k, v, k == 'a' || v > 1)", json!(true)),
            ("[4, 9, 4]", "existsOne(i, v, v == 4)", json!(false)),
            ("[4, 9, 4]", "existsOne(i, v, v == 4 && i > 0)", json!(true)),
            ("{'a': 1, 'b': 1}", "exists_one(k, v, v == 1)", json!(false)),
        ]);
    }

    #[test]
    fn quantifiers_keep_cels_errors() {
        // A later `false` absorbs an earlier error in `all`, a later `true` in `exists`.
        assert_eq!(
            ev("[0, 1, 2].all(i, v, 6 / v > 0 && i > 1)", &json!({})),
            Ok(json!(false))
        );
        assert_eq!(ev("[0, 1].exists(i, v, 1 / v == 1)", &json!({})), Ok(json!(true)));
        fails("[1, 2, 3].all(i, v, v / i > 0)", "division by zero");
        // `existsOne` evaluates every element.
        fails("[3, 2, 1, 0].existsOne(i, v, v / i > 1)", "division by zero");
    }

    #[test]
    fn transform_list_in_order_with_or_without_a_filter() {
        same(&[
            (
                "[2, 4, 6]",
                "transformList(i, v, v * 10 + i)",
                json!([20, 41, 62]),
            ),
            (
                "[2, 4, 6]",
                "transformList(i, v, i != 1, v * 10 + i)",
                json!([20, 62]),
            ),
            ("[]", "transformList(i, v, i)", json!([])),
            (
                "{'b': 2, 'a': 1}",
                "transformList(k, v, k + string(v))",
                json!(["a1", "b2"]),
            ),
            ("{'b': 2, 'a': 1}", "transformList(k, v, v > 1, k)", json!(["b"])),
        ]);
        fails("[2, 1, 0].transformList(i, v, v / i)", "division by zero");
        fails("[2, 1, 0].transformList(i, v, v / i > 0, v)", "division by zero");
    }

    #[test]
    fn transform_map_keeps_the_keys() {
        same(&[
            (
                "{'a': 'x', 'b': 'y'}",
                "transformMap(k, v, k + v)",
                json!({"a": "ax", "b": "by"}),
            ),
            (
                "{'a': 'x', 'b': 'y'}",
                "transformMap(k, v, k != 'a', v)",
                json!({"b": "y"}),
            ),
            ("{}", "transformMap(k, v, v)", json!({})),
            // Over a list, the keys are the indexes.
            ("[10, 20]", "transformMap(i, v, v + i)", json!({"0": 10, "1": 21})),
        ]);
        fails("{'a': 1, 'b': 0}.transformMap(k, v, 4 / v)", "division by zero");
        fails(
            "{'a': 1, 'b': 0}.transformMap(k, v, 4 / v > 0, v)",
            "division by zero",
        );
    }

    #[test]
    fn transform_map_entry_merges_the_entries_it_makes() {
        same(&[
            (
                "{'a': 'x', 'b': 'y'}",
                "transformMapEntry(k, v, {v: k})",
                json!({"x": "a", "y": "b"}),
            ),
            (
                "['p', 'q']",
                "transformMapEntry(i, v, {v: i, v + v: i})",
                json!({"p": 0, "pp": 0, "q": 1, "qq": 1}),
            ),
            (
                "['p', 'q']",
                "transformMapEntry(i, v, i > 0, {v: i})",
                json!({"q": 1}),
            ),
            ("[]", "transformMapEntry(i, v, {v: i})", json!({})),
        ]);
        fails(
            "{'a': 1, 'b': 1}.transformMapEntry(k, v, {v: k})",
            "insert failed: key 1 already exists",
        );
        fails(
            "[1, 2].transformMapEntry(i, v, v)",
            "the value must be a map, got int",
        );
    }

    #[test]
    fn nested_and_shadowing_comprehensions() {
        assert_eq!(
            ev(
                "[[1, 2], [3]].transformList(i, l, l.transformList(j, v, [i, j, v]))",
                &json!({})
            ),
            Ok(json!([[[0, 0, 1], [0, 1, 2]], [[1, 0, 3]]]))
        );
        // `k` inside the one-variable `map` is that macro's own.
        assert_eq!(
            ev("{'a': [1, 2]}.transformList(k, v, v.map(k, k * 2))", &json!({})),
            Ok(json!([[2, 4]]))
        );
        assert_eq!(
            ev(
                "payload.m.all(k, v, payload.m[k] == v)",
                &json!({"m": {"x": [1], "y": {"z": null}}})
            ),
            Ok(json!(true))
        );
    }

    #[test]
    fn appending_to_the_payload_runs_the_comprehension_lowered() {
        let payload = json!({"log": ["a"], "l": ["x", "y"]});
        let text = "payload.log + payload.l.transformList(i, v, i)";
        let e = crate::expr::parse(text).unwrap();
        let vars = Vars {
            payload: Some(&payload),
            ..Vars::default()
        };
        assert_eq!(crate::expr::eval::appended(&e, &["log"], &vars), None);
        assert_eq!(ev(text, &payload), Ok(json!(["a", 0, 1])));
        // Mixed numbers, with nothing else to rewrite.
        assert_eq!(
            ev("[2].transformList(i, v, v * 1.5)", &json!({})),
            Ok(json!([3.0]))
        );
        assert_eq!(ev("payload.l.all(i, v, i * 1.5 < 2)", &payload), Ok(json!(true)));
    }

    #[test]
    fn ranges_that_are_neither_lists_nor_maps_fail() {
        fails("'abc'.all(k, v, true)", "expected list or map, got string");
        assert!(
            ev("payload.n.transformList(k, v, v)", &json!({"n": 1}))
                .is_err_and(|e| e.contains("expected list or map, got int"))
        );
    }
}
