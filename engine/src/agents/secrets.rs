//! Secret references before a run (SPEC "Secrets"): which `${env:NAME}` variables the agents a
//! plan can call need, so that `run` (and `batch`) can refuse to start when one is not set,
//! instead of failing at the first call an hour in. `lint` never reads the environment.
//!
//! References are resolved again at each call ([`super::net::Secrets`],
//! [`super::net::resolve_secret_refs`]); this module only reads whether each variable is
//! set, and never holds or prints a value.

use std::collections::BTreeMap;

use crate::plan::{AgentChanges, AgentPlan, AgentPlanSpec, Plan};

/// Variables named by secret references that are not set (or not UTF-8) in this process's
/// environment, each with the places that name it (`the api_key of provider `local``), sorted
/// by name. Agents that `changes` replace or remove are not called and not checked, nor are
/// the tools of agent loops, which the model may never call: theirs fail at the call (a
/// loop's MCP servers are checked: they are started, to list their tools, when it starts).
pub fn missing_env(plan: &Plan, changes: &AgentChanges) -> Vec<(String, Vec<String>)> {
    let mut needed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (i, agent) in plan.step_agents() {
        if changes
            .per_flow
            .get(&i)
            .is_some_and(|c| c.contains_key(&agent.name))
        {
            continue;
        }
        refs_of(agent, &plan.flows[i].name, &mut needed);
    }
    needed
        .into_iter()
        .filter(|(name, _)| std::env::var(name).is_err())
        .map(|(name, mut places)| {
            places.dedup();
            (name, places)
        })
        .collect()
}

fn refs_of(agent: &AgentPlan, flow: &str, out: &mut BTreeMap<String, Vec<String>>) {
    let mut add = |text: &str, what: String| {
        for name in var_names(text) {
            out.entry(name.to_owned()).or_default().push(what.clone());
        }
    };
    match &agent.spec {
        AgentPlanSpec::Llm(l) => {
            let p = &l.provider;
            if let Some(k) = &p.api_key {
                add(
                    k,
                    format!("the `api_key` of provider `{}` in flow `{flow}`", p.name),
                );
            }
            for (h, v) in &p.headers {
                add(
                    v,
                    format!("header `{h}` of provider `{}` in flow `{flow}`", p.name),
                );
            }
            // A loop's MCP servers are started to list their tools before its first turn,
            // whatever the model calls.
            for ls in l.agent_loop.iter().flat_map(|lp| &lp.servers) {
                server_refs(&ls.server, flow, &mut add);
            }
        }
        AgentPlanSpec::Http(h) => {
            add(
                &h.url,
                format!("the `url` of agent `{}` in flow `{flow}`", agent.name),
            );
            for (k, v) in &h.headers {
                add(
                    v,
                    format!("header `{k}` of agent `{}` in flow `{flow}`", agent.name),
                );
            }
        }
        AgentPlanSpec::Command(c) => {
            for (k, v) in &c.env {
                add(v, format!("`env.{k}` of agent `{}` in flow `{flow}`", agent.name));
            }
        }
        AgentPlanSpec::Mcp(m) => server_refs(&m.server, flow, &mut add),
        AgentPlanSpec::Flow(_)
        | AgentPlanSpec::Transform(_)
        | AgentPlanSpec::Mock(_)
        | AgentPlanSpec::Native(_) => {}
    }
}

/// The references in MCP server `s`'s `env:` (stdio) or `headers:` (HTTP).
fn server_refs(s: &crate::plan::McpServerPlan, flow: &str, add: &mut impl FnMut(&str, String)) {
    match &s.transport {
        crate::plan::McpTransport::Stdio { env, .. } => {
            for (k, v) in env {
                add(
                    v,
                    format!("`env.{k}` of MCP server `{}` in flow `{flow}`", s.name),
                );
            }
        }
        crate::plan::McpTransport::Http { headers, .. } => {
            for (k, v) in headers {
                add(
                    v,
                    format!("header `{k}` of MCP server `{}` in flow `{flow}`", s.name),
                );
            }
        }
    }
}

/// [`missing_env`] as the error a run is refused with: a line per variable, naming what
/// needs it; `Ok` when every variable is set.
pub fn check_env(plan: &Plan, changes: &AgentChanges) -> Result<(), String> {
    let missing = missing_env(plan, changes);
    if missing.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = missing
        .iter()
        .map(|(name, places)| {
            format!(
                "environment variable {name} is not set, needed by {}",
                places.join(" and by ")
            )
        })
        .collect();
    Err(lines.join("\nerror: "))
}

/// The `NAME`s of the well-formed `${env:NAME}` references in `text` (malformed ones fail at
/// the call, with their own error).
pub fn var_names(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("${env:") {
        let after = &rest[at + 6..];
        let Some(end) = after.find('}') else { break };
        let name = &after[..end];
        let mut chars = name.chars();
        if chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            out.push(name);
        }
        rest = &after[end + 1..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_reference_names() {
        assert_eq!(var_names("Bearer ${env:KB_TOKEN}"), vec!["KB_TOKEN"]);
        assert_eq!(var_names("${env:A}:${env:_B2}"), vec!["A", "_B2"]);
        assert!(var_names("${env:bad name} ${env:").is_empty());
        assert!(var_names("plain $HOME ${HOME}").is_empty());
    }
}
