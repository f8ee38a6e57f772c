//! Steps that no path from `start` reaches (SY205).
//!
//! Malformed steps (see [`FlowCx::is_malformed`]) are reported only by their own error: the
//! search starts from each of them as well as from `start`, so neither they nor the steps
//! after them are called unreachable until their shape is fixed.

use crate::diag::{Diagnostic, codes};
use crate::lint::FlowCx;

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    let Some(start) = cx.start() else { return };
    let steps = &cx.flow.steps;
    let mut seen = vec![false; steps.len()];
    let mut stack: Vec<usize> = steps.get_index_of(start).into_iter().collect();
    stack.extend(
        steps
            .values()
            .enumerate()
            .filter(|(_, s)| cx.is_malformed(s))
            .map(|(i, _)| i),
    );
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        cx.for_each_successor(&steps[i], |j| {
            if !seen[j] {
                stack.push(j);
            }
        });
    }
    for ((id, step), seen) in steps.iter().zip(seen) {
        if !seen {
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
