//! The MCP tools of agent loops (SPEC §6.4): a `server.tool` entry of `tools:` outside its
//! server's allowlist (SY510), and two entries offered to the model under one name (SY512):
//! `<server>__<tool>` cut to 64 characters, or an agent of the flow by its own name. A server
//! whose allowlist is `"*"` offers what it lists, which lint does not know: its tools are
//! checked when the loop starts.

use crate::diag::{Diagnostic, codes};
use crate::lint::FlowCx;
use crate::model::build::mcp_tool_not_allowed;
use crate::model::{AgentSpec, McpServer, Sp, Tool};
use crate::plan::mcp_tool_name;
use crate::source::Span;

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    for a in cx.agent_loops() {
        let AgentSpec::Llm(l) = &a.spec else { continue };
        // Each name offered, with the entry that offers it.
        let mut names: Vec<(String, Span)> = Vec::new();
        for t in &l.tools.list {
            for name in offered(cx, t, out) {
                match names.iter().find(|(n, _)| *n == name) {
                    Some((_, first)) => out.push(collision(&name, &a.name.value, t, *first)),
                    None => names.push((name, t.name.span)),
                }
            }
        }
    }
}

/// The names entry `t` offers the model, as far as lint can know them; a `server.tool`
/// outside the allowlist is reported.
fn offered(cx: &FlowCx, t: &Tool, out: &mut Vec<Diagnostic>) -> Vec<String> {
    let entry = &t.name.value;
    if cx.agents.contains_key(entry.as_str()) {
        return vec![entry.clone()];
    }
    let (server, only) = match entry.split_once('.') {
        Some((s, tool)) => (s, Some(tool)),
        None => (entry.as_str(), None),
    };
    let Some(&s) = cx.mcp_servers.get(server) else {
        return Vec::new();
    };
    match only {
        Some(tool) => {
            if !s.tools.is_empty() && !s.allows(tool) {
                out.push(mcp_tool_not_allowed(
                    s,
                    &Sp::new(tool.to_string(), t.name.span),
                    "tools",
                ));
                return Vec::new();
            }
            vec![mcp_tool_name(server, tool)]
        }
        None => listed(s).map(|t| mcp_tool_name(server, t)).collect(),
    }
}

/// The tools a server's allowlist names, when it names them all (no `"*"`).
fn listed(s: &McpServer) -> impl Iterator<Item = &str> {
    let all = s.tools.iter().any(|t| t.value == "*");
    s.tools.iter().filter(move |_| !all).map(|t| t.value.as_str())
}

fn collision(name: &str, agent: &str, t: &Tool, first: Span) -> Diagnostic {
    Diagnostic::new(
        &codes::TOOL_NAME_COLLISION,
        t.name.span,
        format!(
            "agent loop `{agent}` would offer two tools as `{name}`"
        ),
    )
    .label(format!("offers `{name}` again"))
    .with_secondary(first, "first offered here")
    .help("a model calls a tool by its name: list each tool once, and rename an agent that takes an MCP tool's name (`<server>__<tool>`, cut to 64 characters)")
}
