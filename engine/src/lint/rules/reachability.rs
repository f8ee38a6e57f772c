//! Steps that no path from `start` reaches (SY205).
//!
//! Malformed steps (see [`FlowCx::is_malformed`]) are reported only by their own error: the
//! search starts from each of them as well as from `start`, so neither they nor the steps
//! after them are called unreachable until their shape is fixed.

use std::collections::HashSet;

use crate::diag::{Diagnostic, codes};
use crate::lint::FlowCx;

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    let Some(start) = cx.start() else { return };
    let mut seen: HashSet<&str> = HashSet::new();
    let mut stack = vec![start];
    stack.extend(
        cx.flow
            .steps
            .iter()
            .filter(|(_, s)| cx.is_malformed(s))
            .map(|(id, _)| id.as_str()),
    );
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        if let Some(step) = cx.flow.steps.get(id) {
            stack.extend(cx.successors(step));
        }
    }
    for (id, step) in &cx.flow.steps {
        if !seen.contains(id.as_str()) {
            out.push(
                Diagnostic::new(
                    &codes::UNREACHABLE_STEP,
                    step.id.span,
                    format!("step `{id}` is unreachable from `{start}`"),
                )
                .label("never runs")
                .help("add an edge to it with `next`, or remove it"),
            );
        }
    }
}
