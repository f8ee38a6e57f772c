//! Agent kinds outside the flow's `allow` list, or its callers' (SY501), where lint can see them.

use crate::diag::{Diagnostic, article, codes};
use crate::lint::FlowCx;
use crate::model::AgentRef;

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
        let a = article(kind.as_str());
        let allowed: Vec<String> = allow.iter().map(|k| format!("`{}`", k.as_str())).collect();
        let own = cx
            .flow
            .allow
            .as_ref()
            .is_some_and(|a| a.iter().all(|k| k.value != kind));
        let mut d = Diagnostic::new(
            &codes::CAPABILITY_NOT_ALLOWED,
            span,
            format!(
                "{at} calls {a} `{}` agent, which is not allowed here",
                kind.as_str()
            ),
        )
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
        out.push(d);
    }
}
