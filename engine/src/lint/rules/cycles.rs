//! Edges that form a cycle (SY206). Loops are `while` or `retry`, always bounded.

use crate::diag::{Diagnostic, codes};
use crate::lint::FlowCx;
use crate::model::{Next, Sp};

/// The target of edge `k` of `next`, in edge order.
fn edge_to(next: &Next, k: usize) -> Option<&Sp<String>> {
    match next {
        Next::One(to) => (k == 0).then_some(to),
        Next::Edges(edges) => edges.get(k).map(|e| &e.to),
    }
}

/// A depth-first search from each step in order, following edges in order; an edge to a step
/// on the current path closes a cycle. The search keeps its own stack, so a chain of any
/// length needs no deeper call stack.
pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    let steps = &cx.flow.steps;
    let n = steps.len();
    // 0 new, 1 on the path, 2 done.
    let mut state = vec![0u8; n];
    let mut path: Vec<usize> = Vec::new();
    // (step, index of its next edge to follow), one per step on the path.
    let mut frames: Vec<(usize, usize)> = Vec::new();
    for root in 0..n {
        if state[root] != 0 {
            continue;
        }
        state[root] = 1;
        path.push(root);
        frames.push((root, 0));
        while let Some(frame) = frames.last_mut() {
            let (id, k) = *frame;
            let Some(to) = steps[id].next.as_ref().and_then(|next| edge_to(next, k)) else {
                frames.pop();
                path.pop();
                state[id] = 2;
                continue;
            };
            frame.1 += 1;
            let Some(t) = steps.get_index_of(&to.value) else {
                continue;
            };
            match state[t] {
                0 => {
                    state[t] = 1;
                    path.push(t);
                    frames.push((t, 0));
                }
                1 => out.push(cycle(cx, &path, id, t, to)),
                _ => {}
            }
        }
    }
}

/// The diagnostic for the edge `to` from step `id` back to step `t`, which is on `path`.
fn cycle(cx: &FlowCx, path: &[usize], id: usize, t: usize, to: &Sp<String>) -> Diagnostic {
    let steps = &cx.flow.steps;
    let name = |i: usize| steps.get_index(i).map_or("", |(k, _)| k.as_str());
    let from = path.iter().position(|s| *s == t).expect("on the stack");
    let mut chain: Vec<&str> = path[from..].iter().map(|&s| name(s)).collect();
    chain.push(name(t));
    let mut d = Diagnostic::new(
        &codes::EDGE_CYCLE,
        to.span,
        format!("edges form a cycle: {}", chain.join(" -> ")),
    )
    .label("back edge")
    .help("flows are acyclic; repeat work with a `while` step (with `max_iterations`) or with `retry`");
    for &s in &path[from..] {
        if s != id {
            d = d.with_secondary(steps[s].id.span, format!("`{}` is in the cycle", name(s)));
        }
    }
    d
}
