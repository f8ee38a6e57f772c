//! Agent kinds outside the flow's `allow` list, or its callers' (SY501), where lint can see them:
//! the agents of steps, and the tools of the agent loops a run can reach.

use std::collections::BTreeSet;

use crate::diag::{Diagnostic, article, codes};
use crate::lint::FlowCx;
use crate::model::{AgentKind, AgentRef};

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    let Some(allow) = &cx.allow else { return };
    for (step, branch, r) in cx.agent_refs() {
        let Some(agent) = cx.agent(r) else { continue };
        let kind = agent.spec.kind();
        if allow.contains(&kind) {
            continue;
        }
        let span = match r {
            AgentRef::Named(n) => n.span,
            AgentRef::Inline(a) => a.kind.span,
        };
        let at = match branch {
            Some(b) => format!("branch `{b}` of step `{}`", step.id.value),
            None => format!("step `{}`", step.id.value),
        };
        let message = format!(
            "{at} calls {} `{}` agent, which is not allowed here",
            article(kind.as_str()),
            kind.as_str()
        );
        out.push(not_allowed(cx, allow, kind, span, message));
    }
    // The tools of the agent loops a run can reach (a loop whose own kind is refused never
    // runs, and its step is reported above).
    if !allow.contains(&AgentKind::Llm) {
        return;
    }
    for l in cx.reachable_agents() {
        for (tool, agent) in cx.tools_of(l) {
            let kind = agent.spec.kind();
            if allow.contains(&kind) {
                continue;
            }
            let message = format!(
                "tool `{}` of agent loop `{}` is {} `{}` agent, which is not allowed here",
                tool.name.value,
                l.name.value,
                article(kind.as_str()),
                kind.as_str()
            );
            out.push(not_allowed(cx, allow, kind, tool.name.span, message));
        }
    }
}

/// The report of an agent of kind `kind` used at `span` where `allow` refuses it.
fn not_allowed(
    cx: &FlowCx,
    allow: &BTreeSet<AgentKind>,
    kind: AgentKind,
    span: crate::source::Span,
    message: String,
) -> Diagnostic {
    let a = article(kind.as_str());
    let allowed: Vec<String> = allow.iter().map(|k| format!("`{}`", k.as_str())).collect();
    let own = cx
        .flow
        .allow
        .as_ref()
        .is_some_and(|a| a.iter().all(|k| k.value != kind));
    let mut d = Diagnostic::new(&codes::CAPABILITY_NOT_ALLOWED, span, message)
        .label(format!("{a} `{}` agent", kind.as_str()))
        .help(if allowed.is_empty() {
            "no agent kind is allowed here".to_string()
        } else {
            format!("allowed kinds: {}", allowed.join(", "))
        });
    if !own {
        d = d.help(format!(
                "a calling flow's `allow` excludes `{}`; a child never has a capability its parent lacks (allowed: {})",
                kind.as_str(),
                allowed.join(", ")
            ));
    }
    if let Some(a) = &cx.flow.allow
        && own
        && let Some(first) = a.first()
    {
        d = d.with_secondary(first.span, "`allow` is set here");
    }
    d
}
