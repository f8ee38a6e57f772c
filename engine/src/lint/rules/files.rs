//! Cross-file rules: definitions duplicated across imports (SY204), import cycles (SY208) and
//! flows that call each other in a cycle (SY207). Which agents and providers a flow can see,
//! and the duplicates among them, are the project's ([`Project::visible_definitions`]).

use crate::diag::{Diagnostic, codes};
use crate::project::{FlowId, LibId, Project};

pub fn check(project: &Project, out: &mut Vec<Diagnostic>) {
    import_cycles(project, out);
    call_cycles(project, out);
}

fn import_cycles(project: &Project, out: &mut Vec<Diagnostic>) {
    // Library import graph; a cycle is reported once, at the import that closes it.
    let n = project.libraries.len();
    let mut state = vec![0u8; n]; // 0 new, 1 on stack, 2 done
    let mut path: Vec<LibId> = Vec::new();
    fn visit(
        project: &Project,
        lib: LibId,
        state: &mut [u8],
        path: &mut Vec<LibId>,
        out: &mut Vec<Diagnostic>,
    ) {
        state[lib.0] = 1;
        path.push(lib);
        for (spec, target) in &project.libraries[lib.0].imports {
            let Some(t) = target else { continue };
            match state[t.0] {
                0 => visit(project, *t, state, path, out),
                1 => {
                    let from = path.iter().position(|l| l == t).expect("on stack");
                    let chain: Vec<String> = path[from..]
                        .iter()
                        .chain(std::iter::once(t))
                        .map(|l| project.display_relative(&project.libraries[l.0].path))
                        .collect();
                    out.push(
                        Diagnostic::new(
                            &codes::IMPORT_CYCLE,
                            spec.span,
                            format!("import cycle: {}", chain.join(" -> ")),
                        )
                        .label("closes the cycle")
                        .help("move the shared agents into one file that both import"),
                    );
                }
                _ => {}
            }
        }
        path.pop();
        state[lib.0] = 2;
    }
    for i in 0..n {
        if state[i] == 0 {
            visit(project, LibId(i), &mut state, &mut path, out);
        }
    }
}

fn call_cycles(project: &Project, out: &mut Vec<Diagnostic>) {
    let n = project.flows.len();
    let mut state = vec![0u8; n];
    let mut path: Vec<FlowId> = Vec::new();
    fn visit(
        project: &Project,
        f: FlowId,
        state: &mut [u8],
        path: &mut Vec<FlowId>,
        out: &mut Vec<Diagnostic>,
    ) {
        state[f.0] = 1;
        path.push(f);
        for (caller, spec, callee) in &project.calls {
            if *caller != f {
                continue;
            }
            let Some(t) = callee else { continue };
            match state[t.0] {
                0 => visit(project, *t, state, path, out),
                1 => {
                    let from = path.iter().position(|x| x == t).expect("on stack");
                    let chain: Vec<String> = path[from..]
                        .iter()
                        .chain(std::iter::once(t))
                        .map(|x| {
                            project
                                .flow(*x)
                                .flow
                                .as_ref()
                                .map(|fl| fl.name.value.clone())
                                .filter(|s| !s.is_empty())
                                .unwrap_or_else(|| project.display_relative(&project.flow(*x).path))
                        })
                        .collect();
                    out.push(
                        Diagnostic::new(&codes::FLOW_CALL_CYCLE, spec.span, format!("flows call each other in a cycle: {}", chain.join(" -> ")))
                            .label("closes the cycle")
                            .help("a flow may not call itself through other flows; repeat work with `while` or `foreach` instead"),
                    );
                }
                _ => {}
            }
        }
        path.pop();
        state[f.0] = 2;
    }
    for i in 0..n {
        if state[i] == 0 {
            visit(project, FlowId(i), &mut state, &mut path, out);
        }
    }
}
