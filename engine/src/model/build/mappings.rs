//! Mappings (SPEC §5): a step's `input` and `output` (`"*"`, a list of paths, or a map) and
//! `set`, each entry's source a JSONPath, an expression, `{path, default}` or `{value}`.

use super::cx::Cx;
use super::read::{any, check_keys, map, string, string_list};
use crate::diag::{Diagnostic, codes};
use crate::model::*;
use crate::syntax::{Node, Value};

fn source(cx: &mut Cx, node: &Node) -> Option<Source> {
    match &node.value {
        Value::Str(s) if s.starts_with('$') || s.starts_with('=') => {
            Some(Source::Text(Sp::new(s.clone(), node.span)))
        }
        Value::Map(m) if node.get("value").is_some() => {
            check_keys(cx, m, "a literal source", &["value"]);
            Some(Source::Literal {
                value: any(node.get("value").expect("checked")),
            })
        }
        Value::Map(m) if node.get("path").is_some() => {
            check_keys(cx, m, "a source with a default", &["path", "default"]);
            // Whether it is a JSONPath is lint's to say (SY401), once.
            let path = string(cx, node.get("path").expect("checked"))?;
            let default = match node.get("default") {
                Some(d) => any(d),
                None => {
                    cx.push(
                        Diagnostic::new(
                            &codes::MISSING_KEY,
                            node.span,
                            "a `{path}` source needs `default`",
                        )
                        .help("write `{path: $.x, default: null}`, or the path alone when it must exist"),
                    );
                    return None;
                }
            };
            Some(Source::WithDefault { path, default })
        }
        _ => {
            let help = match &node.value {
                Value::Str(s) => format!("for the literal string, write `{{value: {s:?}}}`"),
                _ => format!("for a literal, write `{{value: {}}}`", node.to_json()),
            };
            cx.push(
                Diagnostic::new(
                    &codes::INVALID_VALUE,
                    node.span,
                    "a source is a JSONPath `$...`, an expression `=...`, `{path, default}` or `{value}`",
                )
                .label("not a source")
                .help(help),
            );
            None
        }
    }
}

pub(super) fn mappings(cx: &mut Cx, node: &Node, what: &str) -> Option<Mappings> {
    let m = map(cx, node, what)?;
    let mut out = Vec::new();
    for (k, v) in m {
        if let Some(s) = source(cx, v) {
            out.push((Sp::new(k.name.clone(), k.span), s));
        }
    }
    Some(Mappings(out))
}

fn star(node: &Node) -> bool {
    node.as_str() == Some("*")
}

pub(super) fn input_spec(cx: &mut Cx, node: &Node) -> Option<InputSpec> {
    match &node.value {
        _ if star(node) => Some(InputSpec::All(node.span)),
        Value::Seq(_) => Some(InputSpec::Paths(string_list(cx, node))),
        Value::Map(_) => mappings(cx, node, "`input`").map(InputSpec::Map),
        _ => {
            cx.push(
                Diagnostic::new(&codes::INVALID_TYPE, node.span, format!("invalid `input`: {}", node.type_name()))
                    .help("`input` is `\"*\"` (the whole payload), a list of paths, or a map of destination path → source"),
            );
            None
        }
    }
}

pub(super) fn output_spec(cx: &mut Cx, node: &Node) -> Option<OutputSpec> {
    match &node.value {
        _ if star(node) => Some(OutputSpec::All(node.span)),
        Value::Seq(_) => Some(OutputSpec::Paths(string_list(cx, node))),
        Value::Map(_) => mappings(cx, node, "`output`").map(OutputSpec::Map),
        _ => {
            cx.push(
                Diagnostic::new(&codes::INVALID_TYPE, node.span, format!("invalid `output`: {}", node.type_name()))
                    .help("`output` is `\"*\"` (deep merge), a list of allowed paths, or a map of destination path → source"),
            );
            None
        }
    }
}
