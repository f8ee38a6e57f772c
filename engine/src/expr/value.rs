//! Value templates: any JSON value in which every string that starts with `=` is a CEL
//! expression (`==` at the start stands for a literal `=`), as in `transform` results, `mock`
//! returns and `{value: ...}` mappings.
//!
//! This module owns [`ValueTemplate`] — compiled from a YAML [`Node`] once, with constant
//! subtrees collapsed into a single [`ValueTemplate::Literal`] — and the `=`/`==` rule for one
//! string ([`classify`]). Expression errors come back with their span inside the YAML string.
//! It does not evaluate expressions: [`ValueTemplate::evaluate`] takes the evaluator as a
//! closure. Mapping keys are always literal. Recursion is one level per YAML nesting level,
//! which the syntax budgets bound.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::expr::cache::ParseCache;
use crate::expr::{self, Expr, ExprError};
use crate::source::Span;
use crate::syntax::{self, Node};

/// A compiled value template.
#[derive(Clone, Debug)]
pub enum ValueTemplate {
    /// A subtree without any expression, built once.
    Literal(Value),
    Expr(Arc<Expr>),
    Array(Vec<ValueTemplate>),
    /// Entries in document order.
    Object(Vec<(String, ValueTemplate)>),
}

/// What one YAML string stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrValue<'a> {
    /// `=expr`: the expression text, without the `=`.
    Expr(&'a str),
    /// Any other string; `==x` is the literal `=x`.
    Literal(&'a str),
}

/// Applies the `=`/`==` rule to one string.
pub fn classify(s: &str) -> StrValue<'_> {
    match s.strip_prefix('=') {
        Some(rest) if rest.starts_with('=') => StrValue::Literal(rest),
        Some(rest) => StrValue::Expr(rest),
        None => StrValue::Literal(s),
    }
}

/// An expression found in a value template, with the YAML string node it came from.
#[derive(Clone, Debug)]
pub struct ExprSite<'n> {
    pub node: &'n Node,
    pub expr: Arc<Expr>,
}

impl ExprSite<'_> {
    /// The file span of bytes `start..end` of the expression text (for example a
    /// [`Reference`](super::expr::Reference)'s range); the whole node when the string is not
    /// verbatim in the source (escapes, folded lines).
    pub fn span(&self, source: &str, start: usize, end: usize) -> Span {
        self.node.str_sub_span(source, start + 1, end + 1)
    }
}

/// Everything [`compile_with_sites`] finds.
#[derive(Debug)]
pub struct Compiled<'n> {
    /// `None` when any expression failed to parse.
    pub template: Option<ValueTemplate>,
    /// Every expression that parsed, in document order, for lint to check its variables.
    pub sites: Vec<ExprSite<'n>>,
    /// Every expression that did not parse, with the span of the error inside the YAML string.
    pub errors: Vec<(Span, ExprError)>,
}

/// Compiles a YAML value into a template. Returns the template (`None` if any expression
/// failed) and every expression error with its span in the file.
pub fn compile(node: &Node, source: &str) -> (Option<ValueTemplate>, Vec<(Span, ExprError)>) {
    let compiled = compile_with_sites(node, source);
    (compiled.template, compiled.errors)
}

/// Like [`compile`], and also lists each expression with the node it came from.
pub fn compile_with_sites<'n>(node: &'n Node, source: &str) -> Compiled<'n> {
    compile_parsing(node, source, &mut |text| expr::parse(text).map(Arc::new))
}

/// [`compile`] with expressions taken from `cache` (parsed there when it does not have them).
pub fn compile_cached(
    node: &Node,
    source: &str,
    cache: &mut ParseCache,
) -> (Option<ValueTemplate>, Vec<(Span, ExprError)>) {
    let compiled = compile_parsing(node, source, &mut |text| cache.expr(text).expr.clone());
    (compiled.template, compiled.errors)
}

type Parse<'f> = dyn FnMut(&str) -> Result<Arc<Expr>, ExprError> + 'f;

fn compile_parsing<'n>(node: &'n Node, source: &str, parse: &mut Parse<'_>) -> Compiled<'n> {
    let mut compiled = Compiled {
        template: None,
        sites: Vec::new(),
        errors: Vec::new(),
    };
    compiled.template = build(node, source, &mut compiled, parse);
    compiled
}

fn build<'n>(
    node: &'n Node,
    source: &str,
    out: &mut Compiled<'n>,
    parse: &mut Parse<'_>,
) -> Option<ValueTemplate> {
    match &node.value {
        syntax::Value::Str(s) => match classify(s) {
            StrValue::Literal(text) => Some(ValueTemplate::Literal(Value::String(text.to_owned()))),
            StrValue::Expr(text) => match parse(text) {
                Ok(e) => {
                    out.sites.push(ExprSite {
                        node,
                        expr: Arc::clone(&e),
                    });
                    Some(ValueTemplate::Expr(e))
                }
                Err(err) => {
                    out.errors
                        .push((node.str_sub_span(source, err.start + 1, err.end + 1), err));
                    None
                }
            },
        },
        syntax::Value::Seq(items) => {
            // Build every item, so that every error is reported.
            let built: Vec<_> = items.iter().map(|item| build(item, source, out, parse)).collect();
            let items: Vec<ValueTemplate> = built.into_iter().collect::<Option<_>>()?;
            Some(if items.iter().all(ValueTemplate::is_literal) {
                ValueTemplate::Literal(Value::Array(
                    items
                        .into_iter()
                        .filter_map(ValueTemplate::into_literal)
                        .collect(),
                ))
            } else {
                ValueTemplate::Array(items)
            })
        }
        syntax::Value::Map(entries) => {
            let built: Vec<_> = entries
                .iter()
                .map(|(k, v)| (k.name.clone(), build(v, source, out, parse)))
                .collect();
            let entries: Vec<(String, ValueTemplate)> = built
                .into_iter()
                .map(|(k, v)| v.map(|v| (k, v)))
                .collect::<Option<_>>()?;
            Some(if entries.iter().all(|(_, v)| v.is_literal()) {
                ValueTemplate::Literal(Value::Object(
                    entries
                        .into_iter()
                        .filter_map(|(k, v)| Some((k, v.into_literal()?)))
                        .collect(),
                ))
            } else {
                ValueTemplate::Object(entries)
            })
        }
        _ => Some(ValueTemplate::Literal(node.to_json())),
    }
}

impl ValueTemplate {
    pub fn is_literal(&self) -> bool {
        matches!(self, ValueTemplate::Literal(_))
    }

    /// The value, when the template holds no expression at all.
    pub fn as_literal(&self) -> Option<&Value> {
        match self {
            ValueTemplate::Literal(v) => Some(v),
            _ => None,
        }
    }

    fn into_literal(self) -> Option<Value> {
        match self {
            ValueTemplate::Literal(v) => Some(v),
            _ => None,
        }
    }

    /// Every expression in the template, in document order.
    pub fn expressions(&self) -> impl Iterator<Item = &Expr> + '_ {
        let mut stack = vec![self];
        std::iter::from_fn(move || {
            while let Some(t) = stack.pop() {
                match t {
                    ValueTemplate::Literal(_) => {}
                    ValueTemplate::Expr(e) => return Some(&**e),
                    ValueTemplate::Array(items) => stack.extend(items.iter().rev()),
                    ValueTemplate::Object(entries) => stack.extend(entries.iter().rev().map(|(_, v)| v)),
                }
            }
            None
        })
    }

    /// Builds the value, computing each expression with `eval` (in document order) and
    /// cloning the literal parts. The first error stops the build.
    pub fn evaluate<E>(&self, eval: &mut impl FnMut(&Expr) -> Result<Value, E>) -> Result<Value, E> {
        Ok(match self {
            ValueTemplate::Literal(v) => v.clone(),
            ValueTemplate::Expr(e) => eval(e)?,
            ValueTemplate::Array(items) => {
                Value::Array(items.iter().map(|t| t.evaluate(eval)).collect::<Result<_, E>>()?)
            }
            ValueTemplate::Object(entries) => {
                let mut map = Map::with_capacity(entries.len());
                for (k, t) in entries {
                    map.insert(k.clone(), t.evaluate(eval)?);
                }
                Value::Object(map)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::FileId;
    use crate::syntax::Key;
    use serde_json::json;

    /// Builds nodes by hand, spanning their text in `src`, so these tests need no YAML parser.
    struct Src<'a>(&'a str);

    impl Src<'_> {
        fn span(&self, raw: &str) -> Span {
            let start = self.0.find(raw).expect("text in source");
            Span::new(FileId(0), start, start + raw.len())
        }
        /// A string scalar written as `raw` (with its quotes, if any) meaning `value`.
        fn str(&self, raw: &str, value: &str) -> Node {
            Node {
                span: self.span(raw),
                value: syntax::Value::Str(value.into()),
            }
        }
        fn map(&self, raw: &str, entries: Vec<(&str, Node)>) -> Node {
            let entries = entries
                .into_iter()
                .map(|(k, v)| {
                    (
                        Key {
                            name: k.into(),
                            span: v.span,
                        },
                        v,
                    )
                })
                .collect();
            Node {
                span: self.span(raw),
                value: syntax::Value::Map(entries),
            }
        }
        fn seq(&self, raw: &str, items: Vec<Node>) -> Node {
            Node {
                span: self.span(raw),
                value: syntax::Value::Seq(items),
            }
        }
        fn int(&self, raw: &str, i: i64) -> Node {
            Node {
                span: self.span(raw),
                value: syntax::Value::Int(i),
            }
        }
    }

    #[test]
    fn the_equals_rule() {
        assert_eq!(classify("=payload.x"), StrValue::Expr("payload.x"));
        assert_eq!(classify("==x"), StrValue::Literal("=x"));
        assert_eq!(classify("==="), StrValue::Literal("=="));
        assert_eq!(classify(" =x"), StrValue::Literal(" =x"));
        assert_eq!(classify("plain"), StrValue::Literal("plain"));
        assert_eq!(classify("="), StrValue::Expr(""));
    }

    #[test]
    fn constant_subtrees_collapse() {
        let src = "{a: 1, b: [x, '==y'], c: {d: '=payload.n + 1', e: [2]}}";
        let s = Src(src);
        let node = s.map(
            src,
            vec![
                ("a", s.int("1", 1)),
                (
                    "b",
                    s.seq("[x, '==y']", vec![s.str("x", "x"), s.str("'==y'", "==y")]),
                ),
                (
                    "c",
                    s.map(
                        "{d: '=payload.n + 1', e: [2]}",
                        vec![
                            ("d", s.str("'=payload.n + 1'", "=payload.n + 1")),
                            ("e", s.seq("[2]", vec![s.int("2", 2)])),
                        ],
                    ),
                ),
            ],
        );
        let compiled = compile_with_sites(&node, src);
        assert!(compiled.errors.is_empty());
        let Some(ValueTemplate::Object(entries)) = &compiled.template else {
            panic!("an object with an expression: {:?}", compiled.template)
        };
        assert_eq!(entries[0].1.as_literal(), Some(&json!(1)));
        assert_eq!(entries[1].1.as_literal(), Some(&json!(["x", "=y"])));
        let ValueTemplate::Object(inner) = &entries[2].1 else {
            panic!("c holds an expression")
        };
        assert!(matches!(inner[0].1, ValueTemplate::Expr(_)));
        assert_eq!(inner[1].1.as_literal(), Some(&json!([2])));

        let template = compiled.template.as_ref().expect("compiled");
        let texts: Vec<_> = template.expressions().map(Expr::text).collect();
        assert_eq!(texts, vec!["payload.n + 1"]);
        let value = template.evaluate(&mut |e| Ok::<_, ()>(json!(e.text()))).unwrap();
        assert_eq!(
            value,
            json!({"a": 1, "b": ["x", "=y"], "c": {"d": "payload.n + 1", "e": [2]}})
        );

        // Each site maps expression offsets back into the file (inside the quotes).
        let site = &compiled.sites[0];
        let r = &site.expr.references()[0];
        let span = site.span(src, r.start, r.end);
        assert_eq!(&src[span.start as usize..span.end as usize], "payload.n");
    }

    #[test]
    fn a_template_without_expressions_is_one_literal() {
        let src = "[1, [a, b], {k: v}]";
        let s = Src(src);
        let node = s.seq(
            src,
            vec![
                s.int("1", 1),
                s.seq("[a, b]", vec![s.str("a", "a"), s.str("b", "b")]),
                s.map("{k: v}", vec![("k", s.str("v", "v"))]),
            ],
        );
        let (template, errors) = compile(&node, src);
        assert!(errors.is_empty());
        assert_eq!(
            template.and_then(ValueTemplate::into_literal),
            Some(json!([1, ["a", "b"], {"k": "v"}]))
        );
    }

    #[test]
    fn every_expression_error_is_reported_with_its_span() {
        let src = "[=payload.x +, \"=a &b\", =ok]";
        let s = Src(src);
        let node = s.seq(
            src,
            vec![
                s.str("=payload.x +", "=payload.x +"),
                s.str("\"=a &b\"", "=a &b"),
                s.str("=ok", "=ok"),
            ],
        );
        let compiled = compile_with_sites(&node, src);
        assert!(compiled.template.is_none());
        assert_eq!(compiled.sites.len(), 1);
        let found: Vec<_> = compiled
            .errors
            .iter()
            .map(|(span, e)| (&src[span.start as usize..span.end as usize], e.message.as_str()))
            .collect();
        assert_eq!(
            found,
            vec![
                ("", "expected an expression"),
                ("&", "unexpected single `&`, expected `&&`")
            ]
        );
        assert_eq!(compiled.errors[0].0.start as usize, src.find(',').unwrap());
    }

    #[test]
    fn a_single_expression() {
        let src = "=steps.a.result";
        let node = Src(src).str(src, src);
        let (template, errors) = compile(&node, src);
        assert!(errors.is_empty());
        let template = template.expect("compiled");
        assert!(matches!(template, ValueTemplate::Expr(_)));
        assert_eq!(template.expressions().count(), 1);
    }
}
