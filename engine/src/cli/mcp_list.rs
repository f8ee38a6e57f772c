//! `switchyard mcp list FLOW`: each MCP server a flow defines, started, with the tools it
//! lists (schemas and annotations).

use std::path::PathBuf;

use serde_json::{Value, json};

use super::mcp_check::servers;
use crate::agents::mcp::{self, ToolInfo};
use crate::plan::McpServerPlan;

#[derive(clap::Args, Debug)]
#[command(
    after_long_help = "The servers are those the flow defines or imports, each started as a run would start it \
(stdio: its command, from the flow file's directory; Streamable HTTP: its URL with its headers) and ended before \
the command exits. Each tool is printed with its input schema, its output schema and annotations when it has them, \
and `(not allowed)` when the server's `tools:` allowlist leaves it out.\n\n\
Exit status: 0 every server listed its tools, 1 a server could not be started or listed (named on stderr), \
2 a broken flow or usage."
)]
pub struct ListArgs {
    /// The flow file.
    pub flow: PathBuf,
    /// One JSON object: server name → `{protocol, tools}` (or `{error}`).
    #[arg(long)]
    pub json: bool,
}

pub fn list(args: ListArgs) -> u8 {
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
                    json!({"protocol": protocol, "tools": tools.iter().map(|t| tool_json(t, &s.plan)).collect::<Vec<_>>()}),
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

fn tool_json(t: &ToolInfo, server: &McpServerPlan) -> Value {
    json!({
        "name": t.name,
        "allowed": server.allows(&t.name),
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
