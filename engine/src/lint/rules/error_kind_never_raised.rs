//! Failure edges filtered on an error kind their step can never fail with (SY214). A `foreach`
//! step fails only as a whole: with `limit` (`max_items`, `max_steps`, the cost budget, more
//! failed iterations than `tolerate` allows, whatever their own kinds were), `mapping` (the
//! source is not an array, the output cannot be written) or `expression` (the source or the
//! output's expressions fail). An iteration's own kind never reaches the step's edges, so an
//! edge waiting for `timeout` is never taken.

use super::data::KINDS;
use crate::diag::{Diagnostic, codes};
use crate::lint::FlowCx;
use crate::model::{Next, StepKind};

/// The kinds a `foreach` step's failure can have.
pub const FOREACH_KINDS: &[&str] = &["limit", "mapping", "expression"];

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    for step in cx.flow.steps.values() {
        if step.looping.foreach.is_none() || !matches!(step.kind, StepKind::Agent(_)) {
            continue;
        }
        let Some(Next::Edges(edges)) = &step.next else {
            continue;
        };
        for kind in edges.iter().flat_map(|e| e.errors.iter().flatten()) {
            let k = kind.value.as_str();
            // An unknown kind is reported as such (SY108), not here.
            let known = KINDS.contains(&k)
                || cx.flow.steps.values().any(|s| {
                    matches!(&s.kind, StepKind::Fail(f) if f.kind.as_ref().is_some_and(|fk| fk.value == k))
                });
            if FOREACH_KINDS.contains(&k) || !known {
                continue;
            }
            out.push(
                Diagnostic::new(
                    &codes::ERROR_KIND_NEVER_RAISED,
                    kind.span,
                    format!("`foreach` step `{}` never fails with kind `{k}`", step.id.value),
                )
                .label("this edge is never taken")
                .help(format!(
                    "a `foreach` fails with {} only; an iteration's `{k}` counts against `tolerate` \
                     (more than it allows fail the step with `limit`, the first failure in its message)",
                    FOREACH_KINDS
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            );
        }
    }
}
