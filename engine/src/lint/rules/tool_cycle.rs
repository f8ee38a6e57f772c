//! Agent loops whose tools lead back to themselves (SY507): a loop listing its own agent, or
//! reaching it through other loops' tools (`researcher -> helper -> researcher`). `compile`
//! leaves such a tool out; lint reports it, once per cycle, at the tool that closes it.

use std::collections::HashMap;

use crate::diag::{Diagnostic, codes};
use crate::lint::FlowCx;
use crate::model::{Agent, Tool};

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    OnPath,
    Done,
}

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    let mut state: HashMap<*const Agent, State> = HashMap::new();
    for root in cx.agent_loops() {
        if state.contains_key(&std::ptr::from_ref(root)) {
            continue;
        }
        // A depth-first walk with its own stack: each entry an agent on the path and its
        // tools still to visit.
        let mut path: Vec<(&Agent, std::vec::IntoIter<(&Tool, &Agent)>)> = Vec::new();
        state.insert(root, State::OnPath);
        path.push((root, cx.tools_of(root).into_iter()));
        while let Some((_, tools)) = path.last_mut() {
            let Some((tool, to)) = tools.next() else {
                let (done, _) = path.pop().expect("not empty");
                state.insert(done, State::Done);
                continue;
            };
            match state.get(&std::ptr::from_ref(to)) {
                None => {
                    state.insert(to, State::OnPath);
                    path.push((to, cx.tools_of(to).into_iter()));
                }
                Some(State::OnPath) => {
                    let from = path
                        .iter()
                        .position(|(a, _)| std::ptr::eq(*a, to))
                        .expect("on the path");
                    let chain: Vec<&str> = path[from..]
                        .iter()
                        .map(|(a, _)| a.name.value.as_str())
                        .chain(std::iter::once(to.name.value.as_str()))
                        .collect();
                    let caller = path.last().map_or("", |(a, _)| a.name.value.as_str());
                    out.push(report(tool, caller, &chain));
                }
                Some(State::Done) => {}
            }
        }
    }
}

fn report(tool: &Tool, caller: &str, chain: &[&str]) -> Diagnostic {
    let d = if chain.len() == 2 {
        Diagnostic::new(
            &codes::TOOL_CYCLE,
            tool.name.span,
            format!("agent loop `{caller}` lists itself as a tool"),
        )
        .label("its own agent")
    } else {
        Diagnostic::new(
            &codes::TOOL_CYCLE,
            tool.name.span,
            format!(
                "agent loops call each other as tools in a cycle: {}",
                chain.join(" -> ")
            ),
        )
        .label("closes the cycle")
    };
    d.help("a loop may not reach itself through its tools; to do more turns, raise `max_iterations`, or give the inner loop its own tools")
}
