//! Property test of expressions over JSON through the library (`expr::parse` +
//! `expr::eval`, what `set`, mappings and `if:` edges run): a value read from the payload
//! and the same value written as a CEL literal give the same answer (SPEC §5.1).
//!
//! For random JSON values and random expression shapes — `==`, `!=` and `in`, nested in list
//! and map literals, with each operand on either side; the order a list's elements or a map's
//! keys are visited in (`map()`); `+` on lists — the expression is written twice: once
//! reading some values from the payload (`payload.v0`), once with every value written as a
//! literal (maps with their keys in reverse order). Both must give the same value, or the same
//! error, as a value (`eval`) and as a condition (`eval_bool`). Values come in pairs that CEL
//! calls equal (keys in another order, `1` and `1.0`), so that equalities hold often, not only
//! by chance. Cases are few (256) so the suite stays fast; proptest shrinks a failure to a small
//! case and prints it.

use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Map, Value, json};
use switchyard::__private::expr;
use switchyard::__private::expr::eval::{Vars, eval, eval_bool};

use crate::support::{TempDir, lint_json, run, switchyard};

// ----- values --------------------------------------------------------------------------------

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-2i64..=3).prop_map(Value::from),
        select(vec![-1.5f64, 0.0, 1.0, 2.0, 0.25, 1e300]).prop_map(|f| json!(f)),
        select(vec![i64::MAX]).prop_map(Value::from),
        Just(json!(u64::MAX)),
        select(vec!["", "a", "b", "é\"\\\n'"]).prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((select(vec!["a", "b", "k"]), inner), 0..4).prop_map(|entries| {
                Value::Object(entries.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

/// A value CEL calls equal to `v`: object keys in reverse order, small integers as doubles.
fn twin(v: &Value) -> Value {
    match v {
        Value::Number(n) => match n.as_i64() {
            Some(i) if i.abs() < 10 => json!(i as f64),
            _ => v.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(twin).collect()),
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, v) in m.iter().rev() {
                out.insert(k.clone(), twin(v));
            }
            Value::Object(out)
        }
        _ => v.clone(),
    }
}

/// `v` as a CEL literal: an integer beyond `int` is a `uint` (as the payload reads it), a
/// double keeps its exact value, strings escape every character outside printable ASCII.
fn literal(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.to_string()
            } else if let Some(u) = n.as_u64() {
                format!("{u}u")
            } else {
                format!("{:?}", n.as_f64().expect("a JSON number"))
            }
        }
        Value::String(s) => {
            let mut out = String::from("\"");
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    ' '..='~' => out.push(c),
                    _ => out.push_str(&format!("\\U{:08x}", u32::from(c))),
                }
            }
            out.push('"');
            out
        }
        Value::Array(items) => format!("[{}]", items.iter().map(literal).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => {
            let entries: Vec<String> = m
                .iter()
                .rev()
                .map(|(k, v)| format!("{}: {}", literal(&Value::String(k.clone())), literal(v)))
                .collect();
            format!("{{{}}}", entries.join(", "))
        }
    }
}

// ----- expression shapes ---------------------------------------------------------------------

/// How many values a case has: three random ones and the twin of each.
const VALUES: usize = 6;

#[derive(Clone, Debug)]
enum Term {
    /// Value `i`: read from the payload, or written as a literal.
    Hole(usize),
    /// A constant, the same in both writings.
    Const(Value),
    List(Vec<Term>),
    Map(Vec<(&'static str, Term)>),
}

#[derive(Clone, Debug)]
enum Shape {
    Eq(Term, Term),
    Ne(Term, Term),
    In(Term, Term),
    /// `a.map(x, x)`: a list's elements, a map's keys, in the order visited.
    Visit(Term),
    /// `size(a + b) >= 0`: concatenation, of lists only.
    Concat(Term, Term),
    Not(Box<Shape>),
    And(Box<Shape>, Box<Shape>),
    Or(Box<Shape>, Box<Shape>),
}

fn term() -> impl Strategy<Value = Term> {
    let leaf = prop_oneof![
        4 => (0..VALUES).prop_map(Term::Hole),
        1 => leaf().prop_map(Term::Const),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Term::List),
            prop::collection::btree_map(select(vec!["a", "b", "k"]), inner, 0..3)
                .prop_map(|m| Term::Map(m.into_iter().collect())),
        ]
    })
}

fn shape() -> impl Strategy<Value = Shape> {
    let leaf = prop_oneof![
        (term(), term()).prop_map(|(a, b)| Shape::Eq(a, b)),
        (term(), term()).prop_map(|(a, b)| Shape::Ne(a, b)),
        // `in` mostly over a list or a map, sometimes over anything (an error both ways).
        (term(), prop::collection::vec(term(), 0..3)).prop_map(|(a, l)| Shape::In(a, Term::List(l))),
        (term(), term()).prop_map(|(a, b)| Shape::In(a, b)),
    ];
    let logic = leaf.prop_recursive(2, 6, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|s| Shape::Not(Box::new(s))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Shape::And(Box::new(a), Box::new(b))),
            (inner.clone(), inner).prop_map(|(a, b)| Shape::Or(Box::new(a), Box::new(b))),
        ]
    });
    // Alone: which of two errors `&&` and `||` report is cel's choice, not CEL's.
    prop_oneof![
        4 => logic,
        1 => term().prop_map(Shape::Visit),
        // Of values only: an error's message names a literal container holding a value of the
        // payload by no type (cel cannot convert it), a known difference of messages.
        1 => (0..VALUES, 0..VALUES).prop_map(|(a, b)| Shape::Concat(Term::Hole(a), Term::Hole(b))),
    ]
}

/// Writes `t`; value `i` is read from the payload where `from_payload[i]`.
fn write_term(t: &Term, values: &[Value], from_payload: &[bool]) -> String {
    match t {
        Term::Hole(i) if from_payload[*i] => format!("payload.v{i}"),
        Term::Hole(i) => literal(&values[*i]),
        Term::Const(v) => literal(v),
        Term::List(items) => format!(
            "[{}]",
            items
                .iter()
                .map(|t| write_term(t, values, from_payload))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Term::Map(entries) => format!(
            "{{{}}}",
            entries
                .iter()
                .map(|(k, t)| format!("'{k}': {}", write_term(t, values, from_payload)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn write_shape(s: &Shape, values: &[Value], from_payload: &[bool]) -> String {
    let t = |t: &Term| write_term(t, values, from_payload);
    let s2 = |s: &Shape| write_shape(s, values, from_payload);
    match s {
        Shape::Eq(a, b) => format!("{} == {}", t(a), t(b)),
        Shape::Ne(a, b) => format!("{} != {}", t(a), t(b)),
        Shape::In(a, b) => format!("{} in {}", t(a), t(b)),
        Shape::Visit(a) => format!("({}).map(x, x)", t(a)),
        Shape::Concat(a, b) => format!("size(({}) + ({})) >= 0", t(a), t(b)),
        Shape::Not(x) => format!("!({})", s2(x)),
        Shape::And(a, b) => format!("({}) && ({})", s2(a), s2(b)),
        Shape::Or(a, b) => format!("({}) || ({})", s2(a), s2(b)),
    }
}

/// The answer for `text`, as a value and as a condition: an error is its cause, without the
/// expression's text that starts the message.
type Answer = (Result<Value, String>, Result<bool, String>);

fn answer(text: &str, payload: &Value) -> Answer {
    let e = expr::parse(text).unwrap_or_else(|err| panic!("`{text}` does not parse: {err}"));
    let vars = Vars {
        payload: Some(payload),
        ..Vars::default()
    };
    let cause = |message: String| {
        let prefix = format!("`{text}`: ");
        message
            .strip_prefix(&prefix)
            .map(str::to_owned)
            .unwrap_or(message)
    };
    (
        eval(&e, &vars).map_err(|err| cause(err.message)),
        // A value that is no condition is described as read, its objects' keys in the order of
        // their document: the value itself is compared on the line above.
        eval_bool(&e, &vars).map_err(|err| match cause(err.message) {
            m if m.starts_with("must return a boolean, got ") => "must return a boolean".to_owned(),
            m => m,
        }),
    )
}

proptest! {
    #![proptest_config(crate::support::proptest_config(256))]

    #[test]
    fn payload_values_compare_as_their_literals(
        random in prop::collection::vec(json_value(), 3),
        shape in shape(),
        from_payload in prop::collection::vec(any::<bool>(), VALUES),
    ) {
        let mut values = random.clone();
        values.extend(random.iter().map(twin));
        let payload = Value::Object(
            values.iter().enumerate().map(|(i, v)| (format!("v{i}"), v.clone())).collect(),
        );
        let literals = write_shape(&shape, &values, &[false; VALUES]);
        let read = write_shape(&shape, &values, &from_payload);
        let want = answer(&literals, &payload);
        let got = answer(&read, &payload);
        prop_assert_eq!(&got, &want, "`{}` against `{}` with payload {}", read, literals, payload);
        // Every value read from the payload, too.
        let all = write_shape(&shape, &values, &[true; VALUES]);
        let got = answer(&all, &payload);
        prop_assert_eq!(&got, &want, "`{}` against `{}` with payload {}", all, literals, payload);
    }
}

/// The values of the examples, as a plain test: what the property test shrinks to when it
/// fails is one of these.
#[test]
fn the_examples_of_the_differential_check() {
    let payload = json!({"v0": [1], "v1": {"a": 1}, "v2": {"b": [1], "a": {"c": 2}}});
    for (read, literal) in [
        ("[1] == payload.v0", "[1] == [1]"),
        ("[1, 2] != payload.v0", "[1, 2] != [1]"),
        ("{'a': 1} == payload.v1", "{'a': 1} == {'a': 1}"),
        ("[[1]] == [payload.v0]", "[[1]] == [[1]]"),
        ("[payload.v0] == [[1]]", "[[1]] == [[1]]"),
        ("{'k': [1]} == {'k': payload.v0}", "{'k': [1]} == {'k': [1]}"),
        ("payload.v0 in [[1]]", "[1] in [[1]]"),
        ("{'a': {'c': 2}, 'b': [1]} == payload.v2", "true"),
        ("payload.v2 == {'a': {'c': 2.0}, 'b': [1u]}", "true"),
    ] {
        assert_eq!(answer(read, &payload), answer(literal, &payload), "`{read}`");
    }
}

/// cel-go's two-variable comprehensions through the binary: `set` mappings and `if:` edges
/// over the payload (lazy views) and over literals (SPEC §5.1).
const TWO_VARIABLES: &str = r#"flow: two-variables
steps:
  shape:
    set:
      $.priced: "=payload.items.transformList(i, item, {'line': i + 1, 'total': item.qty * item.price})"
      $.cheap: "=payload.items.transformList(i, item, item.price < 2.0, item.name)"
      $.by_name: "=payload.items.transformMapEntry(i, item, {item.name: i})"
      $.stock: "=payload.stock.transformMap(name, n, n > 0, n * 10)"
      $.first_two: "={'x': 1, 'y': 2, 'z': 3}.transformMap(k, v, v < 3, k + string(v))"
    next:
      - to: ordered
        if: payload.items.all(i, item, item.qty > 0) && input.stock.existsOne(name, n, n == 0)
      - to: unordered
  ordered:
    set: {$.route: {value: ordered}}
    next:
      - to: found
        if: payload.stock.exists(name, n, name == 'pen' && n == 30)
      - to: end
  unordered:
    set: {$.route: {value: unordered}}
  found:
    set: {$.found: {value: true}}
"#;

#[test]
fn two_variable_comprehensions_run_in_mappings_and_edges() {
    let dir = TempDir::new("two-var");
    dir.write("flow.yaml", TWO_VARIABLES);
    let lint = lint_json(dir.path(), &["flow.yaml"]);
    assert_eq!(lint.code(), 0, "{lint:?}");
    let input = json!({
        "items": [
            {"name": "pen", "qty": 2, "price": 1.5},
            {"name": "pad", "qty": 1, "price": 4.0},
        ],
        "stock": {"pen": 3, "pad": 0, "ink": 5},
    });
    let out = run(switchyard(dir.path()).args(["run", "flow.yaml", "--input", &input.to_string()]));
    assert_eq!(out.code(), 0, "{out:?}");
    let payload: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(
        payload["priced"],
        json!([{"line": 1, "total": 3.0}, {"line": 2, "total": 4.0}])
    );
    assert_eq!(payload["cheap"], json!(["pen"]));
    assert_eq!(payload["by_name"], json!({"pen": 0, "pad": 1}));
    assert_eq!(payload["stock"], json!({"pen": 30, "ink": 50}));
    assert_eq!(payload["first_two"], json!({"x": "x1", "y": "y2"}));
    assert_eq!(payload["route"], json!("ordered"));
    assert_eq!(payload["found"], json!(true));
}

#[test]
fn a_key_made_twice_by_transform_map_entry_fails_the_step() {
    let dir = TempDir::new("two-var-dup");
    dir.write(
        "flow.yaml",
        "flow: dup\nsteps:\n  index:\n    set: {$.by_tag: \"=payload.items.transformMapEntry(i, t, {t: i})\"}\n",
    );
    let out =
        run(switchyard(dir.path()).args(["run", "flow.yaml", "--input", r#"{"items": ["a", "b", "a"]}"#]));
    assert_ne!(out.code(), 0, "{out:?}");
    assert!(
        out.stderr
            .contains("`transformMapEntry`: insert failed: key \"a\" already exists"),
        "{}",
        out.stderr
    );
}

#[test]
fn lint_checks_two_variable_comprehensions() {
    let dir = TempDir::new("two-var-lint");
    dir.write(
        "flow.yaml",
        r#"flow: checks
input:
  schema:
    type: object
    required: [tags, counts]
    properties:
      tags: {type: array, items: {type: string}}
      counts: {type: object, properties: {a: {type: integer}}, additionalProperties: false}
steps:
  check:
    set:
      $.a: "=input.tags.transformList(i, t)"
      $.b: "=input.tags.all(i, t, t == 1)"
      $.c: "=input.tags.exists(i, t, i == 'first')"
      $.d: "=input.counts.exists(k, n, n == 'x')"
      $.e: "=input.tags.all(i, i, true)"
      $.f: "=input.tags.existsOne(i.x, t, true)"
"#,
    );
    let diags = lint_json(dir.path(), &["flow.yaml"]).diagnostics();
    let got: Vec<(&str, &str)> = diags
        .iter()
        .map(|d| (d.code.as_str(), d.message.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("SY411", "`transformList` takes 3 or 4 arguments, not 2 arguments"),
            ("SY404", "unknown variable `i` in expression"),
            ("SY404", "unknown variable `t` in expression"),
            ("SY415", "`==` between string and integer is never true"),
            ("SY415", "`==` between integer and string is never true"),
            ("SY415", "`==` between integer and string is never true"),
            ("SY403", "invalid expression: `all` declares `i` twice"),
            (
                "SY403",
                "invalid expression: the first two arguments of `existsOne` must be simple names"
            ),
        ],
        "{diags:#?}"
    );
}

#[test]
fn an_empty_map_literal_may_hold_any_key() {
    let dir = TempDir::new("empty-map");
    dir.write(
        "flow.yaml",
        "flow: empty\nsteps:\n  check:\n    set: {$.in_empty: \"=7 in {}\", $.in_ints: \"=7 in {7: 'a'}\"}\n",
    );
    let lint = lint_json(dir.path(), &["flow.yaml"]);
    assert_eq!(lint.diagnostics(), [], "{lint:?}");
    let out = run(switchyard(dir.path()).args(["run", "flow.yaml", "--input", "{}"]));
    assert_eq!(out.code(), 0, "{out:?}");
    let payload: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(payload, json!({"in_empty": false, "in_ints": true}));
}
