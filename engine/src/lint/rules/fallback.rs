//! Steps whose `next` can leave success without an edge (SY211, warning): conditional success
//! edges with no unconditional fallback, or no success edge at all (only `on: failure` edges).
//! Either way a success the edges do not cover fails the run with `no_route`.

use crate::diag::{Diagnostic, codes};
use crate::lint::FlowCx;
use crate::model::{EdgeOn, Next};
use crate::source::Span;

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    for step in cx.flow.steps.values() {
        let Some(Next::Edges(edges)) = &step.next else {
            continue;
        };
        // Only success can end in `no_route`: an unmatched failure fails the run with the
        // step's own error, as documented. An edge with `errors:` never matches a success.
        let success: Vec<_> = edges
            .iter()
            .filter(|e| {
                e.errors.is_none()
                    && matches!(
                        e.on.as_ref().map(|o| o.value),
                        None | Some(EdgeOn::Success | EdgeOn::Always)
                    )
            })
            .collect();
        if success.is_empty() {
            let span = match (edges.first(), edges.last()) {
                (Some(first), Some(last)) => {
                    Span::new(first.span.file, first.span.start as usize, last.span.end as usize)
                }
                _ => step.id.span,
            };
            out.push(
                Diagnostic::new(
                    &codes::MISSING_FALLBACK,
                    span,
                    format!("step `{}` has no success edge", step.id.value),
                )
                .label("when the step succeeds, the run fails with `no_route`")
                .help("add an edge for success after the failure edges, e.g. `- to: end`"),
            );
            continue;
        }
        let fallback = success.iter().any(|e| e.if_.is_none());
        if let Some(last) = success.iter().rev().find(|e| e.if_.is_some())
            && !fallback
        {
            out.push(
                Diagnostic::new(
                    &codes::MISSING_FALLBACK,
                    last.span,
                    format!(
                        "step `{}` has conditional success edges and no fallback",
                        step.id.value
                    ),
                )
                .label("when no condition holds, the run fails with `no_route`")
                .help("add a last edge without `if`, e.g. `- to: end`"),
            );
        }
    }
}
