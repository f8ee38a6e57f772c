//! The tools an agent loop offers its model (SPEC §6.3, §6.4): the flow's agents named in
//! `tools:` and the MCP servers' tools (listed from each server when the loop starts, named
//! `<server>__<tool>`), those the capability ceiling allows, each with its definition, and
//! whether a call of it waits for a human. What is refused is kept, so that a call of it
//! after all is told why.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::Run;
use crate::agents::mcp::{self, ToolInfo};
use crate::plan::*;
use crate::record::{ErrorKind, StepError};
use crate::store::Store;

/// A tool as the loop holds it: one of its plan's, or one made when the loop starts.
pub(super) enum ToolRef<'a> {
    Plan(&'a ToolPlan),
    Made(Arc<ToolPlan>),
}

impl std::ops::Deref for ToolRef<'_> {
    type Target = ToolPlan;

    fn deref(&self) -> &ToolPlan {
        match self {
            ToolRef::Plan(t) => t,
            ToolRef::Made(t) => t,
        }
    }
}

/// A tool offered to the model.
pub(super) struct Offered<'a> {
    pub tool: ToolRef<'a>,
    /// A call of it waits for a human decision.
    pub approve: bool,
}

/// A tool the loop names that is not offered, and why.
pub(super) struct Refused<'a> {
    pub tool: ToolRef<'a>,
    pub why: String,
}

/// What a loop offers and refuses.
pub(super) struct Tools<'a> {
    pub offered: Vec<Offered<'a>>,
    pub refused: Vec<Refused<'a>>,
    /// The MCP servers whose tools were not listed (a flow test's mock stands in for the
    /// model, and a flow test starts no server): a call of one of their tools is refused.
    pub unlisted: Vec<&'a str>,
}

impl Tools<'_> {
    /// The offered tool named `name`.
    pub fn offered(&self, name: &str) -> Option<&Offered<'_>> {
        self.offered.iter().find(|o| o.tool.name == name)
    }

    /// The definitions the model is sent, in the protocol's form.
    pub fn definitions(&self) -> Vec<Value> {
        self.offered
            .iter()
            .map(|o| {
                let t = &o.tool;
                let mut f = Map::new();
                f.insert("name".into(), Value::String(t.name.clone()));
                if let Some(d) = &t.description {
                    f.insert("description".into(), Value::String(d.clone()));
                }
                f.insert("parameters".into(), t.parameters.clone());
                json!({"type": "function", "function": f})
            })
            .collect()
    }

    /// The names of the tools offered, for the model: `kb_search, crm`, or `none`.
    pub fn names(&self) -> String {
        if self.offered.is_empty() {
            return "none".to_string();
        }
        self.offered
            .iter()
            .map(|o| o.tool.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl<'e, S: Store> Run<'e, S> {
    /// The tools loop `lp` of agent `agent` offers: those the ceiling allows are offered, the
    /// others are unknown to the model. An MCP server's tools are listed from the server
    /// (started if it is not running); one that cannot be listed fails the loop. Without
    /// `servers` (a flow test's mock model), no server is started and none of its tools is
    /// offered.
    pub(super) async fn loop_tools<'a>(
        &self,
        agent: &str,
        lp: &'a LoopPlan,
        servers: bool,
    ) -> Result<Tools<'a>, StepError> {
        let mut tools = Tools {
            offered: Vec::new(),
            refused: Vec::new(),
            unlisted: Vec::new(),
        };
        if !servers {
            tools.unlisted = lp.servers.iter().map(|s| s.server.name.as_str()).collect();
        }
        for t in &lp.tools {
            match self.agent_for(&t.call, false) {
                Ok(_) => tools.offered.push(Offered {
                    approve: lp.approve.contains(&t.name),
                    tool: ToolRef::Plan(t),
                }),
                Err(e) => tools.refused.push(Refused {
                    tool: ToolRef::Plan(t),
                    why: e.message,
                }),
            }
        }
        for s in lp.servers.iter().filter(|_| servers) {
            let server = &s.server;
            let listed = async {
                let c = mcp::pool::connection(server).await?;
                mcp::pool::tools(server, &c).await
            }
            .await
            .map_err(|e| {
                StepError::new(
                    ErrorKind::Agent,
                    format!(
                        "agent loop `{agent}`: the tools of MCP server `{}` could not be listed: {e}",
                        server.name
                    ),
                )
            })?;
            for info in &listed.list {
                if !server.allows(&info.name) || s.only.as_ref().is_some_and(|o| *o != info.name) {
                    continue;
                }
                let tool = Arc::new(mcp_tool(
                    s,
                    info,
                    listed.inputs.get(&info.name).cloned().flatten(),
                ));
                if let Some(other) = tools.offered.iter().find(|o| o.tool.name == tool.name) {
                    return Err(StepError::new(
                        ErrorKind::Agent,
                        format!(
                            "agent loop `{agent}`: tool `{}` of MCP server `{}` would be offered as `{}`, the name of another of its tools{}",
                            info.name,
                            server.name,
                            tool.name,
                            match &other.tool.call.agent.spec {
                                AgentPlanSpec::Mcp(m) => format!(" (`{}.{}`)", m.server.name, m.tool),
                                _ => String::new(),
                            }
                        ),
                    ));
                }
                let approve = needs_approval(server, info, &lp.approve);
                match self.agent_for(&tool.call, false) {
                    Ok(_) => tools.offered.push(Offered {
                        approve,
                        tool: ToolRef::Made(tool),
                    }),
                    Err(e) => tools.refused.push(Refused {
                        tool: ToolRef::Made(tool),
                        why: e.message,
                    }),
                }
            }
        }
        Ok(tools)
    }
}

/// Tool `info` of the loop's server `s` as a tool of the loop: named `<server>__<tool>`,
/// described and typed as the server lists it, called as a `kind: mcp` agent of that name.
fn mcp_tool(s: &LoopServerPlan, info: &ToolInfo, input: Option<Arc<Schema>>) -> ToolPlan {
    let name = mcp_tool_name(&s.server.name, &info.name);
    let description = info.description.clone().or_else(|| info.title.clone());
    let agent = AgentPlan {
        name: name.clone(),
        spec: AgentPlanSpec::Mcp(McpPlan {
            server: s.server.clone(),
            tool: info.name.clone(),
        }),
        result_schema: None,
        input_schema: input,
        description: description.clone(),
    };
    ToolPlan {
        name,
        description,
        parameters: info.input_schema.clone(),
        call: CallPlan {
            agent: Arc::new(agent),
            scope: None,
            input: InputPlan::All,
            output: OutputPlan::None,
            message: None,
            retry: s.retry.clone(),
            timeout: s.timeout,
            // A trusted server's read-only and idempotent tools are sent again after a
            // crash too: `invoke` asks their annotations.
            idempotent: s.server.idempotent.contains(&info.name),
        },
    }
}

/// Whether a call of `info` of `server` waits for a human (SPEC §6.4): the server's
/// `approve:`, a trusted server's `destructiveHint` not excused by `no_approval:`
/// ([`mcp::needs_approval`]), or the agent's `approve:` (`server.tool`, `server.*`).
pub(super) fn needs_approval(server: &McpServerPlan, info: &ToolInfo, agent: &[String]) -> bool {
    let by_agent = agent.iter().any(|a| {
        a.split_once('.')
            .is_some_and(|(s, t)| s == server.name && (t == "*" || t == info.name))
    });
    by_agent || mcp::needs_approval(server, Some(info)).is_some()
}

/// Whether a plain step's call of `m` waits for a human: the server's `approve:`, or a trusted
/// server's `destructiveHint` not excused by `no_approval:` (read from its tools, the server
/// started if it is not running; a server that cannot list them is left to the call to
/// report). Only a trusted server's annotations count, so only such a server is started here.
pub(super) async fn mcp_needs_approval(m: &McpPlan) -> bool {
    let server = &m.server;
    if server.approve.iter().any(|t| *t == m.tool || t == "*") {
        return true;
    }
    if !server.trusted {
        return false;
    }
    let listed = async {
        let c = mcp::pool::connection(server).await?;
        mcp::pool::tools(server, &c).await
    }
    .await;
    listed.is_ok_and(|l| mcp::needs_approval(server, l.get(&m.tool)).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::mcp::Annotations;

    fn server(approve: &[&str], no_approval: &[&str], trusted: bool) -> McpServerPlan {
        let names = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        McpServerPlan {
            name: "repo".into(),
            transport: McpTransport::Http {
                url: "http://127.0.0.1:9/mcp".into(),
                headers: Vec::new(),
            },
            tools: vec!["*".into()],
            approve: names(approve),
            no_approval: names(no_approval),
            trusted,
            idempotent: Vec::new(),
            timeout: None,
            max_time: None,
            max_result_bytes: 1 << 20,
            key: "repo".into(),
        }
    }

    fn tool(name: &str, destructive: bool) -> ToolInfo {
        ToolInfo {
            name: name.into(),
            title: None,
            description: None,
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: None,
            annotations: Annotations {
                destructive: Some(destructive),
                ..Annotations::default()
            },
        }
    }

    #[test]
    fn approval_comes_from_the_server_the_agent_or_trusted_annotations() {
        let none: &[String] = &[];
        assert!(needs_approval(
            &server(&["commit"], &[], false),
            &tool("commit", false),
            none
        ));
        assert!(!needs_approval(
            &server(&[], &[], false),
            &tool("reset", true),
            none
        ));
        assert!(needs_approval(
            &server(&[], &[], true),
            &tool("reset", true),
            none
        ));
        assert!(!needs_approval(
            &server(&[], &["reset"], true),
            &tool("reset", true),
            none
        ));
        let agent = ["repo.log".to_string(), "docs.*".to_string()];
        assert!(needs_approval(
            &server(&[], &[], false),
            &tool("log", false),
            &agent
        ));
        assert!(!needs_approval(
            &server(&[], &[], false),
            &tool("status", false),
            &agent
        ));
        let all = ["repo.*".to_string()];
        assert!(needs_approval(
            &server(&[], &[], false),
            &tool("status", false),
            &all
        ));
    }

    #[test]
    fn names_are_server_and_tool_cut_to_64() {
        assert_eq!(mcp_tool_name("repo", "git_log"), "repo__git_log");
        let long = mcp_tool_name("repo", &"x".repeat(100));
        assert_eq!(long.chars().count(), MAX_TOOL_NAME);
        assert!(long.starts_with("repo__xxx"));
    }
}
