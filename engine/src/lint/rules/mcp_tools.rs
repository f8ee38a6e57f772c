//! `mcp` agents (SPEC §6.4): a `server` that no `mcp_servers:` entry defines (SY215), and a
//! `tool` outside its server's `tools:` allowlist (SY510). The entries of a server's own
//! `approve`, `no_approval` and `idempotent` are checked where the server is read.

use crate::diag::{Diagnostic, codes, did_you_mean};
use crate::lint::FlowCx;
use crate::model::AgentSpec;
use crate::model::build::mcp_tool_not_allowed;

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    for a in cx.defined_agents() {
        let AgentSpec::Mcp(m) = &a.spec else { continue };
        if m.server.value.is_empty() {
            continue;
        }
        let Some(server) = cx.mcp_servers.get(m.server.value.as_str()) else {
            let mut d = Diagnostic::new(
                &codes::UNKNOWN_MCP_SERVER,
                m.server.span,
                format!("unknown MCP server `{}`", m.server.value),
            )
            .label("no such server under `mcp_servers:`");
            let names = cx.mcp_servers.keys().copied();
            d = match did_you_mean(&m.server.value, names.clone()) {
                Some(h) => d.help(h),
                None if cx.mcp_servers.is_empty() => {
                    d.help("define it under `mcp_servers:` (in this flow or a file it imports)")
                }
                None => d.help(format!(
                    "servers are: {}",
                    names.map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
                )),
            };
            out.push(d);
            continue;
        };
        if !m.tool.value.is_empty() && !server.tools.is_empty() && !server.allows(&m.tool.value) {
            out.push(mcp_tool_not_allowed(server, &m.tool, "tool"));
        }
    }
}
