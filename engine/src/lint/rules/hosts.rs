//! Hosts outside the flow's `allow_hosts` (SY505), where lint can see them: the `url` of an
//! `http` agent and the `base_url` of an `llm` agent's provider, when they are plain URLs (a
//! URL with a secret reference or a template is only known at the call). Only agents that a
//! step calls are checked; the run would refuse them with kind `capability`.

use std::collections::HashSet;

use crate::agents::net::host_matches;
use crate::diag::{Diagnostic, codes};
use crate::lint::FlowCx;
use crate::model::{AgentSpec, Sp};

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    let Some(allowed) = &cx.flow.allow_hosts else {
        return;
    };
    let mut seen = HashSet::new();
    for (_, _, r) in cx.agent_refs() {
        let Some(agent) = cx.agent(r) else { continue };
        if !seen.insert(std::ptr::from_ref(agent)) {
            continue;
        }
        let (url, what): (&Sp<String>, String) = match &agent.spec {
            AgentSpec::Http(h) => (&h.url, format!("agent `{}`", agent.name.value)),
            AgentSpec::Llm(l) => match cx.providers.get(l.provider.value.as_str()) {
                Some(p) => (
                    &p.base_url,
                    format!("agent `{}` (provider `{}`)", agent.name.value, p.name.value),
                ),
                None => continue,
            },
            _ => continue,
        };
        if url.value.contains("${") || url.value.contains("{{") || url.value.contains("{%") {
            continue;
        }
        let Ok(parsed) = reqwest::Url::parse(&url.value) else {
            continue;
        };
        let Some(host) = parsed.host_str() else { continue };
        let port = parsed.port_or_known_default();
        if allowed.iter().any(|p| host_matches(&p.value, host, port)) {
            continue;
        }
        let list: Vec<String> = allowed.iter().map(|h| format!("`{}`", h.value)).collect();
        let mut d = Diagnostic::new(
            &codes::HOST_NOT_ALLOWED,
            url.span,
            format!("{what} reaches host `{host}`, which is not in `allow_hosts`"),
        )
        .label(format!("host `{host}`"))
        .help(if list.is_empty() {
            "`allow_hosts` is empty: no host is allowed".to_string()
        } else {
            format!("allowed hosts: {}", list.join(", "))
        });
        if let Some(first) = allowed.first() {
            d = d.with_secondary(first.span, "`allow_hosts` is set here");
        }
        out.push(d);
    }
}
