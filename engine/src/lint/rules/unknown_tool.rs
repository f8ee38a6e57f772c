//! `until_tool` and `approve` entries that are not one of the agent loop's tools (SY506). An
//! `approve` entry may name an MCP tool of a server the loop lists: `server.tool`, `server.*`.

use crate::diag::{Diagnostic, codes, did_you_mean};
use crate::lint::rules::references::list;
use crate::model::{Agent, AgentSpec, Sp};

/// Checks one agent's `until_tool` and `approve` against its `tools:`. Without tools they do
/// nothing, which `loop_without_tools` reports instead.
pub fn agent(out: &mut Vec<Diagnostic>, a: &Agent) {
    let AgentSpec::Llm(l) = &a.spec else { return };
    if l.tools.list.is_empty() {
        return;
    }
    let tools = || l.tools.list.iter().map(|t| t.name.value.as_str());
    let entries = l
        .until_tool
        .iter()
        .map(|u| ("until_tool", u))
        .chain(l.approve.iter().map(|e| ("approve", e)));
    for (key, entry) in entries {
        if tools().any(|t| t == entry.value) {
            continue;
        }
        // An MCP tool's approval: `server.tool` or `server.*` of a server the loop lists
        // (whole, or one of its tools).
        if key == "approve"
            && let Some((server, tool)) = entry.value.split_once('.')
            && tools().any(|t| {
                t == server
                    || t.split_once('.')
                        .is_some_and(|(s, x)| s == server && (tool == "*" || x == tool))
            })
        {
            continue;
        }
        out.push(unknown(key, entry, &a.name.value, tools()));
    }
}

fn unknown<'a>(
    key: &str,
    entry: &Sp<String>,
    agent: &str,
    tools: impl Iterator<Item = &'a str> + Clone,
) -> Diagnostic {
    let all = format!("the tools of `{agent}` are: {}", list(tools.clone()));
    let help = match did_you_mean(&entry.value, tools) {
        Some(d) => format!("{d} {all}"),
        None => format!("{all}; a tool named here must also be listed in `tools`"),
    };
    Diagnostic::new(
        &codes::UNKNOWN_TOOL,
        entry.span,
        format!(
            "`{key}` names `{}`, which is not a tool of agent loop `{agent}`",
            entry.value
        ),
    )
    .label("not a tool")
    .help(help)
}
