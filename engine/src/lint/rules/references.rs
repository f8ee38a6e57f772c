//! Unknown references: steps (SY201), agents (SY202: of steps, of tests' mocks and calls, and
//! the tools of agent loops), providers (SY203), with the closest name.

use std::collections::HashSet;

use crate::diag::{Diagnostic, codes, did_you_mean};
use crate::lint::FlowCx;
use crate::model::{AgentRef, AgentSpec, Next, Sp};

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    let flow = cx.flow;
    let step_names = || flow.steps.keys().map(String::as_str);
    let unknown_step = |to: &Sp<String>, out: &mut Vec<Diagnostic>, allow_end: bool| {
        if (allow_end && to.value == "end") || flow.steps.contains_key(&to.value) {
            return;
        }
        let mut d = Diagnostic::new(
            &codes::UNKNOWN_STEP,
            to.span,
            format!("unknown step `{}`", to.value),
        )
        .label("no such step");
        let candidates: Vec<&str> = step_names().chain(allow_end.then_some("end")).collect();
        d = match did_you_mean(&to.value, candidates.iter().copied()) {
            Some(h) => d.help(h),
            None => d.help(format!("steps are: {}", list(step_names()))),
        };
        out.push(d);
    };
    if let Some(start) = &flow.start {
        unknown_step(start, out, false);
    }
    for step in flow.steps.values() {
        match &step.next {
            Some(Next::One(to)) => unknown_step(to, out, true),
            Some(Next::Edges(edges)) => edges.iter().for_each(|e| unknown_step(&e.to, out, true)),
            None => {}
        }
    }
    for (_, _, r) in cx.agent_refs() {
        if let AgentRef::Named(name) = r
            && !cx.agents.contains_key(name.value.as_str())
            && !unreadable(cx, &name.value)
        {
            out.push(unknown_agent(cx, name));
        }
    }
    // The tools of agent loops, named in this flow's scope as steps name agents.
    for a in cx.agent_loops() {
        let AgentSpec::Llm(l) = &a.spec else { continue };
        for t in &l.tools.list {
            // An MCP server's tools: the server, or `server.tool`.
            let server = t
                .name
                .value
                .split_once('.')
                .map_or(t.name.value.as_str(), |(s, _)| s);
            if cx.mcp_servers.contains_key(server) && !cx.agents.contains_key(t.name.value.as_str()) {
                continue;
            }
            if !cx.agents.contains_key(t.name.value.as_str()) && !unreadable(cx, &t.name.value) {
                let d = unknown_agent(cx, &t.name);
                out.push(Diagnostic {
                    message: format!(
                        "tool `{}` of agent loop `{}` names no agent",
                        t.name.value, a.name.value
                    ),
                    ..d
                });
            }
        }
    }
    // Providers of every llm agent defined here (named or inline).
    let mut defined: Vec<&crate::model::Agent> = flow.agents.values().collect();
    for (_, _, r) in cx.agent_refs() {
        if let AgentRef::Inline(a) = r {
            defined.push(a);
        }
    }
    for a in defined {
        if let AgentSpec::Llm(l) = &a.spec
            && !l.provider.value.is_empty()
            && !cx.providers.contains_key(l.provider.value.as_str())
        {
            let mut d = Diagnostic::new(
                &codes::UNKNOWN_PROVIDER,
                l.provider.span,
                format!("unknown provider `{}`", l.provider.value),
            )
            .label("no such provider");
            d = match did_you_mean(&l.provider.value, cx.providers.keys().copied()) {
                Some(h) => d.help(h),
                None if cx.providers.is_empty() => {
                    d.help("define it under `providers:` (here or in an imported file)")
                }
                None => d.help(format!("providers are: {}", list(cx.providers.keys().copied()))),
            };
            out.push(d);
        }
    }
    // Tests name steps and agents too.
    if !cx.inline {
        for t in &flow.tests {
            for p in t.expect.path.iter().flatten() {
                unknown_step(p, out, false);
            }
            for (name, m) in &t.mocks {
                if !cx.agents.contains_key(name.as_str()) {
                    let span = m.returns.as_ref().map(|r| r.0.span).unwrap_or(t.span);
                    let key = t_key_span(cx, t, name).unwrap_or(span);
                    out.push(unknown_agent(cx, &Sp::new(name.clone(), key)));
                }
            }
        }
        // `expect.calls` counts calls by agent name anywhere in the run tree: a name that no
        // flow of the project defines would be expected to be called 0 times, and always is.
        let mut known = HashSet::new();
        if flow.tests.iter().any(|t| !t.expect.calls.is_empty()) {
            for f in cx.project.flows.iter().filter_map(|f| f.flow.as_ref()) {
                agent_names(f, &mut known);
            }
            for l in &cx.project.libraries {
                known.extend(l.library.agents.keys().map(String::as_str));
            }
        }
        for t in &flow.tests {
            for (name, n) in &t.expect.calls {
                if !known.contains(name.as_str()) {
                    let key = key_before(cx, n.span, name).unwrap_or(n.span);
                    let d = unknown_agent(cx, &Sp::new(name.clone(), key));
                    out.push(Diagnostic {
                        message: format!("`expect.calls` names unknown agent `{name}`"),
                        ..d
                    });
                }
            }
        }
    }
}

/// The names calls are counted by in `flow` and the inline flows in it: its agents' (an inline
/// agent is named by its step), and its steps' ids.
fn agent_names<'p>(flow: &'p crate::model::Flow, known: &mut HashSet<&'p str>) {
    for (name, agent) in &flow.agents {
        known.insert(name.as_str());
        inline_flow_names(agent, known);
    }
    for (id, step) in &flow.steps {
        known.insert(id.as_str());
        let refs: Vec<&AgentRef> = match &step.kind {
            crate::model::StepKind::Agent(r) => vec![r],
            crate::model::StepKind::Parallel(branches) => {
                known.extend(branches.iter().map(|(b, _)| b.as_str()));
                branches.iter().map(|(_, b)| &b.agent).collect()
            }
            _ => Vec::new(),
        };
        for r in refs {
            if let AgentRef::Inline(a) = r {
                known.insert(a.name.value.as_str());
                inline_flow_names(a, known);
            }
        }
    }
}

fn inline_flow_names<'p>(agent: &'p crate::model::Agent, known: &mut HashSet<&'p str>) {
    if let AgentSpec::Flow(f) = &agent.spec
        && let Some(inner) = &f.inline
    {
        agent_names(inner, known);
    }
}

/// The span of `name` as the key written just before the value at `value`.
fn key_before(cx: &FlowCx, value: crate::source::Span, name: &str) -> Option<crate::source::Span> {
    let text = &cx.project.sources.get(cx.file()).text;
    let before = text.get(..value.start as usize)?;
    let at = before.rfind(name)?;
    Some(crate::source::Span {
        start: at as u32,
        end: (at + name.len()) as u32,
        ..value
    })
}

/// The span of a key under a test's `mocks:` (the model keeps mock values, not key spans).
fn t_key_span(cx: &FlowCx, t: &crate::model::FlowTest, name: &str) -> Option<crate::source::Span> {
    let text = cx.project.sources.get(cx.file()).slice(t.span);
    let at = text.find(&format!("{name}:"))?;
    Some(t.span.sub(at, at + name.len()))
}

/// Whether `name` is an agent defined in this flow, the file's flow around it (for an inline
/// flow) or an imported file whose definition could not be read: its own error says why, and a step naming it is not told it is unknown.
fn unreadable(cx: &FlowCx, name: &str) -> bool {
    let listed = |names: &[String]| names.iter().any(|n| n == name);
    let file_flow = cx.project.flow(cx.id).flow.as_ref();
    listed(&cx.flow.unreadable_agents)
        || file_flow.is_some_and(|f| listed(&f.unreadable_agents))
        || cx
            .project
            .libraries
            .iter()
            .any(|l| listed(&l.library.unreadable_agents))
}

fn unknown_agent(cx: &FlowCx, name: &Sp<String>) -> Diagnostic {
    let d = Diagnostic::new(
        &codes::UNKNOWN_AGENT,
        name.span,
        format!("unknown agent `{}`", name.value),
    )
    .label("no such agent");
    match did_you_mean(&name.value, cx.agents.keys().copied()) {
        Some(h) => d.help(h),
        None if cx.agents.is_empty() => d.help(
            "define it under `agents:` (here or in an imported file), or inline as `agent: {kind: ...}`",
        ),
        None => d.help(format!("agents are: {}", list(cx.agents.keys().copied()))),
    }
}

pub(crate) fn list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<String> = names.take(20).map(|n| format!("`{n}`")).collect();
    v.join(", ")
}
