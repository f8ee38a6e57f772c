//! Conditional edges with no unconditional fallback for the outcome (SY211, warning): when no
//! `if` holds, the run fails with `no_route`.

use crate::diag::{codes, Diagnostic};
use crate::lint::FlowCx;
use crate::model::{EdgeOn, Next};

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    for step in cx.flow.steps.values() {
        let Some(Next::Edges(edges)) = &step.next else { continue };
        // Only success can end in `no_route`: an unmatched failure fails the run with the
        // step's own error, as documented.
        for outcome in [EdgeOn::Success] {
            let applies = |on: Option<EdgeOn>| {
                let on = on.unwrap_or(EdgeOn::Success);
                on == outcome || on == EdgeOn::Always
            };
            let relevant: Vec<_> = edges.iter().filter(|e| applies(e.on.as_ref().map(|o| o.value))).collect();
            let conditional: Vec<_> = relevant.iter().filter(|e| e.if_.is_some() || e.errors.is_some()).collect();
            let fallback = relevant.iter().any(|e| e.if_.is_none() && e.errors.is_none());
            let has_if = conditional.iter().any(|e| e.if_.is_some());
            if !fallback && has_if {
                let last = conditional.last().expect("non-empty");
                let what = "success";
                out.push(
                    Diagnostic::new(
                        &codes::MISSING_FALLBACK,
                        last.span,
                        format!("step `{}` has conditional {what} edges and no fallback", step.id.value),
                    )
                    .label("when no condition holds, the run fails with `no_route`")
                    .help("add a last edge without `if`, e.g. `- to: end`"),
                );
            }
        }
    }
}
