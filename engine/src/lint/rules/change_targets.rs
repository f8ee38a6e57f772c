//! SY213 `unknown-change-target`: a name in an agent-change file (SPEC §8.4) that matches no
//! flow, or no agent called in the change's scope, of the flows linted with it. A change meant
//! to take an agent away must never fail open because of a typo.
//!
//! `lint` does not know which flow a change file will be given to, so it checks the file
//! against the flows of the same command (`lint flow.yaml changes.yaml`, or a directory holding
//! both): each flow named on the command line is a top flow, the flows they call are nested.
//! A change file linted without any flow is checked for its shape only; `run` and `batch`
//! check its names against the run's tree exactly. What stops a change file from being read
//! (its shape, its replacement agents' definitions) is reported here too: `project` keeps the
//! file's tree, and the changes are read from it here.

use std::collections::HashSet;

use crate::diag::{Diagnostic, codes};
use crate::model::{AgentRef, StepKind};
use crate::project::Project;
use crate::runtime::changes::{TreeFlow, from_node, unknown_names};

pub fn check(project: &Project, out: &mut Vec<Diagnostic>) {
    let mut read = Vec::new();
    for loaded in &project.changes {
        let Some(node) = &loaded.node else { continue };
        match from_node(node, &project.sources.get(loaded.file).text) {
            Ok(changes) => read.push((loaded.file, changes)),
            // What stops the file from being read: its shape, its replacement agents.
            Err(problems) => out.extend(problems),
        }
    }
    if read.is_empty() || project.flows.is_empty() {
        return;
    }
    let called: HashSet<usize> = project
        .calls
        .iter()
        .filter_map(|(_, _, callee)| callee.map(|c| c.0))
        .collect();
    let tree: Vec<TreeFlow<'_>> = project
        .flows
        .iter()
        .enumerate()
        .filter_map(|(i, loaded)| {
            let flow = loaded.flow.as_ref()?;
            fn name(r: &AgentRef) -> &str {
                match r {
                    AgentRef::Named(n) => n.value.as_str(),
                    AgentRef::Inline(a) => a.name.value.as_str(),
                }
            }
            let mut agents = Vec::new();
            for step in flow.steps.values() {
                match &step.kind {
                    StepKind::Agent(r) => agents.push(name(r)),
                    StepKind::Parallel(branches) => agents.extend(branches.values().map(|b| name(&b.agent))),
                    _ => {}
                }
            }
            Some(TreeFlow {
                name: flow.name.value.as_str(),
                root: !called.contains(&i),
                agents,
            })
        })
        .collect();
    for (file, changes) in &read {
        for u in unknown_names(changes, &tree) {
            let mut span = u.span;
            span.file = *file;
            out.push(
                Diagnostic::new(&codes::UNKNOWN_CHANGE_TARGET, span, u.message)
                    .label("matches nothing")
                    .help(u.help),
            );
        }
    }
}
