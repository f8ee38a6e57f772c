//! The MCP servers of a loaded project as `mcp list` and `lint --mcp` see them, and
//! `lint --mcp`'s check of the `tool:` and `tools:` names against what the servers list.

use std::collections::BTreeMap;

use crate::agents::mcp;
use crate::model::{AgentSpec, McpServer};
use crate::plan::McpServerPlan;
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
/// `mcp` agents and by the allowlists against what each server lists. Prints each problem on
/// stderr with its file, line and column; `false` when there was one.
pub(super) fn check_live(project: &Project) -> bool {
    let servers = servers(project);
    if servers.is_empty() {
        return true;
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
    let mut ok = true;
    for (s, result) in servers.iter().zip(listed) {
        let tools = match result {
            Ok((tools, _)) => tools,
            Err(e) => {
                ok = false;
                super::stderr::error(format!("{}: {e}", at(project, s.model.name.span)));
                continue;
            }
        };
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
            .filter(|t| t.value != "*")
            .map(|t| (t.value.clone(), t.span))
            .chain(named.get(&key(s.model.span)).into_iter().flatten().cloned());
        for (tool, span) in wanted {
            if !has(&tool) {
                ok = false;
                super::stderr::error(format!(
                    "{}: MCP server `{}` lists no tool `{tool}` (it lists: {lists})",
                    at(project, span),
                    s.plan.name
                ));
            }
        }
    }
    ok
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
