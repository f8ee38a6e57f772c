//! A step's `next`: one step id, or a list of edges with `to`, `on`, `if` and `errors`.

use super::cx::Cx;
use super::read::{check_keys, enum_, map, string, string_list, type_error};
use crate::diag::{Diagnostic, codes};
use crate::model::*;
use crate::syntax::{Node, Value};

pub(super) fn next(cx: &mut Cx, node: &Node) -> Option<Next> {
    match &node.value {
        Value::Str(s) => Some(Next::One(Sp::new(s.clone(), node.span))),
        Value::Seq(items) => Some(Next::Edges(items.iter().filter_map(|n| edge(cx, n)).collect())),
        _ => {
            type_error(cx, node, "a step id or a list of edges");
            None
        }
    }
}

fn edge(cx: &mut Cx, node: &Node) -> Option<Edge> {
    if let Value::Str(s) = &node.value {
        let sp = Sp::new(s.clone(), node.span);
        return Some(Edge {
            to: sp,
            on: None,
            if_: None,
            errors: None,
            span: node.span,
        });
    }
    let m = map(cx, node, "an edge")?;
    check_keys(cx, m, "an edge", &["to", "on", "if", "errors"]);
    let to = match node.get("to") {
        Some(n) => string(cx, n)?,
        None => {
            cx.push(
                Diagnostic::new(&codes::MISSING_KEY, node.span, "edge without `to`")
                    .label("missing `to`")
                    .help("every edge names its target: a step id, or `end`"),
            );
            return None;
        }
    };
    let on = node.get("on").and_then(|n| {
        // `on` unquoted is a string in YAML 1.2; a boolean here means YAML 1.1 habits.
        enum_(
            cx,
            n,
            "edge outcome",
            &[
                ("success", EdgeOn::Success),
                ("failure", EdgeOn::Failure),
                ("always", EdgeOn::Always),
            ],
        )
    });
    let errors = node.get("errors").map(|n| string_list(cx, n));
    if let (Some(e), Some(on)) = (node.get_key("errors"), &on)
        && on.value == EdgeOn::Success
    {
        cx.push(
            Diagnostic::new(
                &codes::INVALID_VALUE,
                e.span,
                "`errors` filters failures, but this edge is `on: success`",
            )
            .with_secondary(on.span, "success edge")
            .help("use `on: failure` with `errors:`"),
        );
    }
    let on = match (on, node.get_key("errors")) {
        // `errors:` alone implies a failure edge.
        (None, Some(k)) => Some(Sp::new(EdgeOn::Failure, k.span)),
        (on, _) => on,
    };
    let if_ = node.get("if").and_then(|n| match &n.value {
        Value::Bool(_) => {
            cx.push(
                Diagnostic::new(
                    &codes::INVALID_TYPE,
                    n.span,
                    "`if` is an expression, not a boolean literal",
                )
                .help("remove `if` for an unconditional edge"),
            );
            None
        }
        _ => string(cx, n),
    });
    Some(Edge {
        to,
        on,
        if_,
        errors,
        span: node.span,
    })
}
