//! Edges that form a cycle (SY206). Loops are `while` or `retry`, always bounded.

use std::collections::HashMap;

use crate::diag::{Diagnostic, codes};
use crate::lint::FlowCx;
use crate::model::Next;

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    let ids: Vec<&str> = cx.flow.steps.keys().map(String::as_str).collect();
    let mut state: HashMap<&str, u8> = HashMap::new();
    let mut path: Vec<&str> = Vec::new();
    for id in &ids {
        if !state.contains_key(id) {
            visit(cx, id, &mut state, &mut path, out);
        }
    }
}

fn visit<'p>(
    cx: &FlowCx<'p>,
    id: &'p str,
    state: &mut HashMap<&'p str, u8>,
    path: &mut Vec<&'p str>,
    out: &mut Vec<Diagnostic>,
) {
    state.insert(id, 1);
    path.push(id);
    let step = &cx.flow.steps[id];
    let edges = step.next.as_ref().map(Next::edges).unwrap_or_default();
    for e in edges.iter() {
        let Some((to, _)) = cx.flow.steps.get_key_value(&e.to.value) else {
            continue;
        };
        let to = to.as_str();
        match state.get(to).copied() {
            None => visit(cx, to, state, path, out),
            Some(1) => {
                let from = path.iter().position(|s| *s == to).expect("on the stack");
                let mut chain: Vec<&str> = path[from..].to_vec();
                chain.push(to);
                let mut d = Diagnostic::new(&codes::EDGE_CYCLE, e.to.span, format!("edges form a cycle: {}", chain.join(" -> ")))
                    .label("back edge")
                    .help("flows are acyclic; repeat work with a `while` step (with `max_iterations`) or with `retry`");
                for s in &path[from..] {
                    if *s != id {
                        d = d.with_secondary(cx.flow.steps[*s].id.span, format!("`{s}` is in the cycle"));
                    }
                }
                out.push(d);
            }
            _ => {}
        }
    }
    path.pop();
    state.insert(id, 2);
}
