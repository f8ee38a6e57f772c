//! `switchyard mcp list FLOW`: each MCP server a flow defines, started, with the tools it
//! lists (schemas and annotations); and `lint --mcp`'s check of `tool:` and `tools:` names
//! against what the servers list.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::agents::mcp::{self, ToolInfo};
use crate::model::{AgentSpec, McpServer};
use crate::plan::McpServerPlan;
use crate::project::{FlowId, Project};
use crate::source::Span;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: McpCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum McpCommand {
    /// Start each MCP server a flow defines and print the tools it lists: their input and
    /// output schemas and annotations.
    List(ListArgs),
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// The flow file.
    pub flow: PathBuf,
    /// One JSON object: server name → `{protocol, tools}` (or `{error}`).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> u8 {
    match args.command {
        McpCommand::List(a) => list(a),
    }
}

/// A server of the project, as written and as reached.
struct Server<'p> {
    model: &'p McpServer,
    plan: McpServerPlan,
}

/// Every server the project's flows define or import, once per definition.
fn servers(project: &Project) -> Vec<Server<'_>> {
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

fn list(args: ListArgs) -> u8 {
    let files = match super::lint::collect(std::slice::from_ref(&args.flow), None) {
        Ok(f) => f,
        Err(e) => return super::common::fail(e),
    };
    let (project, diags) = super::lint::check(&files);
    if diags.iter().any(|d| d.is_error()) {
        let human = crate::diag::render::human(
            &diags,
            &project.sources,
            &crate::diag::render::HumanOptions {
                color: super::color_stderr(),
                width: super::width(),
            },
        );
        super::stderr::diagnostics(&crate::diag::render::json(&diags, &project.sources), &human);
        return super::exit::USAGE;
    }
    let servers = servers(&project);
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
    let mut failed = false;
    let mut all = serde_json::Map::new();
    let mut text = String::new();
    for (s, result) in servers.iter().zip(listed) {
        match result {
            Ok((tools, protocol)) => {
                all.insert(
                    s.plan.name.clone(),
                    json!({"protocol": protocol, "tools": tools.iter().map(tool_json).collect::<Vec<_>>()}),
                );
                text.push_str(&format!("{} ({protocol}): {} tools\n", s.plan.name, tools.len()));
                for t in &tools {
                    text.push_str(&describe(t, &s.plan));
                }
            }
            Err(e) => {
                failed = true;
                all.insert(s.plan.name.clone(), json!({"error": e}));
                super::stderr::error(e);
            }
        }
    }
    let out = if args.json {
        serde_json::to_string_pretty(&Value::Object(all)).expect("JSON prints")
    } else {
        text
    };
    if let Err(e) = super::lint::write_stdout(&out) {
        super::stderr::error(format!("cannot write the list: {e}"));
        return super::exit::FAILED;
    }
    if failed {
        super::exit::FAILED
    } else {
        super::exit::OK
    }
}

fn tool_json(t: &ToolInfo) -> Value {
    json!({
        "name": t.name,
        "title": t.title,
        "description": t.description,
        "input_schema": t.input_schema,
        "output_schema": t.output_schema,
        "annotations": t.annotations.to_json(),
    })
}

fn describe(t: &ToolInfo, server: &McpServerPlan) -> String {
    let mut s = format!("  {}", t.name);
    if !server.allows(&t.name) {
        s.push_str(" (not allowed)");
    }
    if let Some(d) = &t.description {
        s.push_str(&format!(": {}", d.lines().next().unwrap_or_default()));
    }
    s.push('\n');
    let compact = |v: &Value| serde_json::to_string(v).unwrap_or_default();
    s.push_str(&format!("    input: {}\n", compact(&t.input_schema)));
    if let Some(o) = &t.output_schema {
        s.push_str(&format!("    output: {}\n", compact(o)));
    }
    let a = t.annotations.to_json();
    if a.as_object().is_some_and(|m| !m.is_empty()) {
        s.push_str(&format!("    annotations: {}\n", compact(&a)));
    }
    s
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
