use serde_json::json;

use super::*;
use crate::expr;
use crate::expr::template;
use crate::record::ErrorKind;

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
    let t = template::compile("Refund {{ payload.amount }} to {{ payload.customer.name }} ({{ item.id }})")
        .unwrap();
    assert_eq!(render(&t, &vars).unwrap(), "Refund 12 to Ann (9)");
    assert_eq!(
        template_context(&t, &vars),
        json!({"payload": {"amount": 12, "customer": {"name": "Ann"}}, "item": {"id": 9}})
    );
    // Used another way, a variable is copied whole at that level.
    let t =
        template::compile("{% for x in payload.big %}{{ x }}{% endfor %} {{ payload['amount'] }}").unwrap();
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
