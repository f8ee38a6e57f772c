//! The MCP servers of a loaded project as `mcp list` and `lint --mcp` see them, and
//! `lint --mcp`'s check against what the servers list: the `tool:` of `mcp` agents, the
//! servers' allowlists and `approve:`, an agent loop's `server.tool` entries of `tools:` and
//! `approve:`, and two tools of a loop that would be offered under one name once a `"*"`
//! server's tools are known (static lint checks only the names it can know).

use std::collections::BTreeMap;

use crate::agents::mcp;
use crate::diag::{Diagnostic, codes};
use crate::model::{Agent, AgentSpec, McpServer};
use crate::plan::{McpServerPlan, mcp_tool_name};
use crate::project::{FlowId, Project};
use crate::source::Span;

/// A server of the project, as written and as reached.
pub(super) struct Server<'p> {
    pub model: &'p McpServer,
    pub plan: McpServerPlan,
}

/// Every server the project's flows define or import, once per definition.
pub(super) fn servers(project: &Project) -> Vec<Server<'_>> {
    let mut out: Vec<Server<'_>> = Vec::new();
    for i in 0..project.flows.len() {
        let mut ignored = Vec::new();
        for server in project.visible_mcp_servers(FlowId(i), &mut ignored).into_values() {
            if out.iter().any(|s| s.model.span == server.span) {
                continue;
            }
            out.push(Server {
                model: server,
                plan: crate::compile::mcp_server_plan(project, FlowId(i), server),
            });
        }
    }
    out
}

/// `lint --mcp`: starts every server the linted flows define and checks the tools named by
/// `mcp` agents and by the allowlists against what each server lists: a diagnostic for each
/// problem (SY513 a server that cannot be started or listed, SY514 a tool it does not list,
/// SY512 two tools of a loop under one name), rendered with the static ones.
pub(super) fn check_live(project: &Project) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let servers = servers(project);
    if servers.is_empty() {
        return out;
    }
    let rt = super::common::runtime();
    let listed = rt.block_on(async {
        let mut out = Vec::new();
        for s in &servers {
            out.push(mcp::list(&s.plan).await);
        }
        out
    });
    drop(rt);
    mcp::shutdown();
    // The tools each `mcp` agent names, by the server definition it resolves to.
    let mut named: BTreeMap<(u32, u32), Vec<(String, Span)>> = BTreeMap::new();
    for i in 0..project.flows.len() {
        let Some(flow) = &project.flow(FlowId(i)).flow else {
            continue;
        };
        let mut ignored = Vec::new();
        let visible = project.visible_mcp_servers(FlowId(i), &mut ignored);
        for agent in flow.agents.values() {
            if let AgentSpec::Mcp(m) = &agent.spec
                && let Some(server) = visible.get(m.server.value.as_str())
            {
                named
                    .entry(key(server.span))
                    .or_default()
                    .push((m.tool.value.clone(), m.tool.span));
            }
        }
    }
    // What each server that could be listed lists, by its definition.
    let mut lists: BTreeMap<(u32, u32), Vec<String>> = BTreeMap::new();
    for (s, result) in servers.iter().zip(listed) {
        let tools = match result {
            Ok((tools, _)) => tools,
            Err(e) => {
                out.push(
                    Diagnostic::new(&codes::MCP_SERVER_UNREACHABLE, s.model.name.span, e.to_string())
                        .label("started and asked for its tools by `lint --mcp`"),
                );
                continue;
            }
        };
        lists.insert(key(s.model.span), tools.iter().map(|t| t.name.clone()).collect());
        let has = |name: &str| tools.iter().any(|t| t.name == name);
        let lists = tools
            .iter()
            .map(|t| format!("`{}`", t.name))
            .collect::<Vec<_>>()
            .join(", ");
        let wanted = s
            .model
            .tools
            .iter()
            .chain(&s.model.approve)
            .filter(|t| t.value != "*")
            .map(|t| (t.value.clone(), t.span))
            .chain(named.get(&key(s.model.span)).into_iter().flatten().cloned());
        for (tool, span) in wanted {
            if !has(&tool) {
                let d = Diagnostic::new(
                    &codes::MCP_TOOL_NOT_LISTED,
                    span,
                    format!("MCP server `{}` lists no tool `{tool}`", s.plan.name),
                )
                .label("not among the tools the server lists")
                .help(
                    match crate::diag::did_you_mean(&tool, tools.iter().map(|t| t.name.as_str())) {
                        Some(h) => format!("{h} (it lists: {lists})"),
                        None => format!("it lists: {lists}"),
                    },
                );
                out.push(d);
            }
        }
    }
    out.extend(loop_problems(project, &lists));
    out
}

/// The problems of every agent loop the project's flows see (their own agents and their
/// imports'), against what the servers list (`lists`, by definition; a server that could not
/// be listed is left out, already reported): a `server.tool` entry of `tools:` or `approve:`
/// naming a tool the server does not list, and two tools offered under one name where one
/// of them comes from a `"*"` server's listing (the other clashes static lint reports).
fn loop_problems(project: &Project, lists: &BTreeMap<(u32, u32), Vec<String>>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let mut seen: Vec<*const Agent> = Vec::new();
    for i in 0..project.flows.len() {
        let (mut agents, mut providers, mut ignored) = Default::default();
        project.visible_definitions(FlowId(i), &mut agents, &mut providers, &mut ignored);
        let servers = project.visible_mcp_servers(FlowId(i), &mut ignored);
        for agent in agents.values() {
            let AgentSpec::Llm(l) = &agent.spec else { continue };
            if l.tools.list.is_empty() || seen.contains(&std::ptr::from_ref(*agent)) {
                continue;
            }
            seen.push(std::ptr::from_ref(*agent));
            let listing = |entry| listing(entry, &servers, lists);
            let unlisted = |server: &str, tool: &str, span: Span, field: &str| {
                Diagnostic::new(
                    &codes::MCP_TOOL_NOT_LISTED,
                    span,
                    format!(
                        "agent loop `{}`: `{field}` names `{server}.{tool}`, but MCP server `{server}` lists no tool `{tool}`",
                        agent.name.value
                    ),
                )
                .label("not among the tools the server lists")
            };
            // Each name offered, with its entry and whether a `"*"` listing made it.
            let mut names: Vec<(String, Span, bool)> = Vec::new();
            for t in &l.tools.list {
                let entry = t.name.value.as_str();
                let offered: Vec<(String, bool)> = if agents.contains_key(entry) {
                    vec![(entry.to_string(), false)]
                } else if let Some((server, s, only, listed)) = listing(entry) {
                    match only {
                        Some(tool) if !listed.iter().any(|n| n == tool) => {
                            out.push(unlisted(server, tool, t.name.span, "tools"));
                            Vec::new()
                        }
                        Some(tool) => vec![(mcp_tool_name(server, tool), false)],
                        None => {
                            let all = s.tools.iter().any(|t| t.value == "*");
                            listed
                                .iter()
                                .filter(|n| s.allows(n))
                                .map(|n| (mcp_tool_name(server, n), all))
                                .collect()
                        }
                    }
                } else {
                    Vec::new()
                };
                for (name, wild) in offered {
                    match names.iter().find(|(n, _, _)| *n == name) {
                        Some((_, first, first_wild)) if wild || *first_wild => out.push(
                            Diagnostic::new(
                                &codes::TOOL_NAME_COLLISION,
                                t.name.span,
                                format!(
                                    "agent loop `{}` would offer two tools as `{name}` (the other is offered at {}): a model calls a tool by its name",
                                    agent.name.value,
                                    at(project, *first)
                                ),
                            )
                            .label(format!("offers `{name}` once the server lists its tools"))
                            .with_secondary(*first, format!("`{name}` is offered here too")),
                        ),
                        Some(_) => {}
                        None => names.push((name, t.name.span, wild)),
                    }
                }
            }
            for a in &l.approve {
                if let Some((server, _, Some(tool), listed)) = listing(&a.value)
                    && tool != "*"
                    && !listed.iter().any(|n| n == tool)
                {
                    out.push(unlisted(server, tool, a.span, "approve"));
                }
            }
        }
    }
    out
}

/// A loop entry naming a server (`repo`, `repo.tool`): the server's name, its definition, the
/// tool named, and what the server lists; `None` when the entry names no server or the server
/// could not be listed.
#[allow(clippy::type_complexity)]
fn listing<'e, 'p>(
    entry: &'e str,
    servers: &indexmap::IndexMap<&str, &'p McpServer>,
    lists: &'p BTreeMap<(u32, u32), Vec<String>>,
) -> Option<(&'e str, &'p McpServer, Option<&'e str>, &'p Vec<String>)> {
    let (server, tool) = match entry.split_once('.') {
        Some((s, t)) => (s, Some(t)),
        None => (entry, None),
    };
    let s = *servers.get(server)?;
    Some((server, s, tool, lists.get(&key(s.span))?))
}

fn key(span: Span) -> (u32, u32) {
    (span.file.0, span.start)
}

/// `file:line:col` of a span.
fn at(project: &Project, span: Span) -> String {
    let file = project.sources.get(span.file);
    let (line, col) = file.line_col(span.start as usize);
    format!("{}:{line}:{col}", file.name)
}
