//! A `command` agent that runs a shell (`sh -c`, `bash -c`) with templated input (SY504,
//! warning): payload text would be parsed by the shell.

use crate::diag::{Diagnostic, codes};
use crate::lint::FlowCx;
use crate::model::{AgentRef, AgentSpec};

const SHELLS: &[&str] = &["sh", "bash", "zsh", "dash", "ksh", "fish", "csh", "tcsh", "ash"];

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    let mut agents: Vec<&crate::model::Agent> = cx.flow.agents.values().collect();
    for (_, _, r) in cx.agent_refs() {
        if let AgentRef::Inline(a) = r {
            agents.push(a);
        }
    }
    for a in agents {
        agent(out, a);
    }
}

pub fn agent(out: &mut Vec<Diagnostic>, a: &crate::model::Agent) {
    {
        let AgentSpec::Command(c) = &a.spec else { return };
        let Some(program) = c.run.first() else { return };
        let base = |s: &str| s.rsplit('/').next().unwrap_or("").to_string();
        // The shell itself: the program, or what `env` runs (`/usr/bin/env bash -c ...`).
        let shell = match base(&program.value).as_str() {
            b if SHELLS.contains(&b) => program,
            "env" => match c.run.get(1) {
                Some(s) if SHELLS.contains(&base(&s.value).as_str()) => s,
                _ => return,
            },
            _ => return,
        };
        if !c
            .run
            .iter()
            .any(|s| s.value == "-c" || s.value.starts_with("-c") || s.value == "-lc")
        {
            return;
        }
        if let Some(t) = c
            .run
            .iter()
            .find(|s| s.value.contains("{{") || s.value.contains("{%"))
        {
            out.push(
                Diagnostic::new(&codes::SHELL_WITH_TEMPLATE, t.span, format!("agent `{}` runs a shell with templated input", a.name.value))
                    .label("payload text would be parsed by the shell")
                    .with_secondary(shell.span, "a shell")
                    .help("run the program directly (`run: [python3, tool.py]`) and read the input document from stdin"),
            );
        }
    }
}
