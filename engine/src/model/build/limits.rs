//! A flow's `defaults` and `limits`, and the `retry` policy of a flow, an agent, a step or a
//! branch.

use super::cx::Cx;
use super::read::{bool_, check_keys, duration, f64_, map, size, string_list, type_error, u64_};
use crate::model::*;
use crate::syntax::{Node, Value};

pub(super) fn defaults(cx: &mut Cx, node: &Node) -> Option<Defaults> {
    let m = map(cx, node, "`defaults`")?;
    check_keys(cx, m, "`defaults`", &["timeout", "retry", "idempotent"]);
    Some(Defaults {
        timeout: node.get("timeout").and_then(|n| duration(cx, n)),
        retry: node.get("retry").and_then(|n| retry(cx, n)),
        idempotent: node.get("idempotent").and_then(|n| bool_(cx, n)),
    })
}

pub(super) fn limits(cx: &mut Cx, node: &Node) -> Option<Limits> {
    let m = map(cx, node, "`limits`")?;
    check_keys(
        cx,
        m,
        "`limits`",
        &[
            "max_steps",
            "max_depth",
            "timeout",
            "max_payload_bytes",
            "max_cost_usd",
            "max_file_bytes",
            "max_run_file_bytes",
        ],
    );
    Some(Limits {
        max_steps: node.get("max_steps").and_then(|n| u64_(cx, n)),
        max_depth: node.get("max_depth").and_then(|n| u64_(cx, n)),
        timeout: node.get("timeout").and_then(|n| duration(cx, n)),
        max_payload_bytes: node.get("max_payload_bytes").and_then(|n| size(cx, n)),
        max_cost_usd: node.get("max_cost_usd").and_then(|n| f64_(cx, n)),
        max_file_bytes: node.get("max_file_bytes").and_then(|n| size(cx, n)),
        max_run_file_bytes: node.get("max_run_file_bytes").and_then(|n| size(cx, n)),
    })
}

pub(super) fn retry(cx: &mut Cx, node: &Node) -> Option<Retry> {
    let m = map(cx, node, "`retry`")?;
    check_keys(
        cx,
        m,
        "`retry`",
        &["attempts", "backoff", "factor", "max_backoff", "jitter", "on"],
    );
    Some(Retry {
        attempts: node.get("attempts").and_then(|n| u64_(cx, n)),
        backoff: node.get("backoff").and_then(|n| duration(cx, n)),
        factor: node.get("factor").and_then(|n| f64_(cx, n)),
        max_backoff: node.get("max_backoff").and_then(|n| duration(cx, n)),
        jitter: node.get("jitter").and_then(|n| match &n.value {
            Value::Bool(b) => Some(Sp::new(Jitter::Bool(*b), n.span)),
            Value::Int(_) | Value::Float(_) => {
                f64_(cx, n).map(|f| Sp::new(Jitter::Fraction(f.value), f.span))
            }
            _ => {
                type_error(cx, n, "`true`, `false` or a fraction");
                None
            }
        }),
        on: node.get("on").map(|n| string_list(cx, n)),
        span: node.span,
    })
}
