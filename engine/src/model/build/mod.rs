//! Lowering YAML nodes into the model: every shape problem becomes a diagnostic, and whatever
//! could be read is kept, so that later phases still check the rest of the file.
//!
//! This file holds the state of a lowering ([`Cx`]) and the entry points: a flow file, an
//! imported file, and the body they share with inline `flow` agents. Each part of a flow is
//! lowered in the file named for it: `agents.rs` (agent definitions by kind, agent-loop tools,
//! mocks), `providers.rs`, `limits.rs` (`defaults`, `limits`, `retry`), `steps.rs` (steps by
//! kind, `foreach`/`while` fields, `parallel` branches), `edges.rs` (`next`), `mappings.rs`
//! (`input`, `output`, `set` and their sources) and `flow_tests.rs` (a flow's `tests:`), all
//! over the generic readers of `read.rs` (strings, numbers, durations, sizes, names, checked
//! keys, identifiers).

mod agents;
mod cx;
mod edges;
mod flow_tests;
mod limits;
mod mappings;
mod mcp_servers;
mod providers;
mod read;
mod steps;

pub use agents::{AGENT_COMMON_KEYS, agent, agent_keys};
pub use cx::Cx;
pub use flow_tests::parse_now;
pub use mcp_servers::not_allowed as mcp_tool_not_allowed;
pub use read::{IDENT_PATTERN, is_ident, parse_duration, parse_size};
pub use steps::placeholder_kind;

use indexmap::IndexMap;

use self::agents::{agent_kind, agents_of};
use self::flow_tests::flow_test;
use self::limits::{defaults, limits};
use self::mcp_servers::mcp_servers;
use self::providers::providers;
use self::read::{check_keys, list, map, schema_ref, string, string_list, suggest_ident};
use self::steps::steps;
use super::*;
use crate::diag::{Diagnostic, codes};
use crate::source::Span;
use crate::syntax::{Node, Value};

/// A file of shared definitions, named in `imports:`.
#[derive(Clone, Debug, Default)]
pub struct Library {
    pub imports: Vec<Sp<String>>,
    pub providers: IndexMap<String, Provider>,
    pub mcp_servers: IndexMap<String, McpServer>,
    pub agents: IndexMap<String, Agent>,
    /// See [`Flow::unreadable_agents`].
    pub unreadable_agents: Vec<String>,
}

impl<'a> Cx<'a> {
    pub fn new(source: &'a str) -> Self {
        Cx {
            source,
            diags: Vec::new(),
            malformed_steps: Vec::new(),
            inline_flow: |cx, node, name| flow_body(cx, node, name, false),
        }
    }
}

const FLOW_KEYS: &[&str] = &[
    "flow",
    "description",
    "input",
    "output",
    "imports",
    "providers",
    "mcp_servers",
    "agents",
    "defaults",
    "limits",
    "allow",
    "allow_hosts",
    "start",
    "steps",
    "tests",
];
const LIBRARY_KEYS: &[&str] = &["description", "imports", "providers", "mcp_servers", "agents"];

/// Lowers a flow file. `None` only when the document is not a mapping at all.
pub fn flow(cx: &mut Cx, node: &Node) -> Option<Flow> {
    if matches!(node.value, Value::Null) {
        cx.push(
            Diagnostic::new(&codes::MISSING_KEY, node.span, "empty flow file")
                .help("a flow needs at least `flow:` (its name) and `steps:`"),
        );
        return None;
    }
    let m = map(cx, node, "a flow file")?;
    check_keys(cx, m, "a flow file", FLOW_KEYS);
    let name = match node.get("flow") {
        Some(n) => string(cx, n).inspect(|name| check_flow_name(cx, name)),
        None => {
            cx.push(
                Diagnostic::new(
                    &codes::MISSING_KEY,
                    first_line(node),
                    "missing `flow:`, the flow's name",
                )
                .help("add `flow: my-flow` at the top of the file"),
            );
            None
        }
    };
    let name = name.unwrap_or_else(|| Sp::new(String::new(), node.span));
    Some(flow_body(cx, node, name, true))
}

/// Lowers the body of a flow: everything but `flow:`. Shared by files and inline `flow` agents.
fn flow_body(cx: &mut Cx, node: &Node, name: Sp<String>, top: bool) -> Flow {
    let steps = match node.get("steps") {
        Some(n) => steps(cx, n),
        None => {
            cx.push(
                Diagnostic::new(&codes::MISSING_KEY, first_line(node), "missing `steps:`")
                    .help("a flow needs at least one step under `steps:`"),
            );
            IndexMap::new()
        }
    };
    let tests = if top {
        node.get("tests")
            .map(|n| list(cx, n, flow_test))
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let (agents, unreadable_agents) = agents_of(cx, node);
    Flow {
        file: node.file(),
        name,
        description: node
            .get("description")
            .and_then(|n| string(cx, n))
            .map(|s| s.value),
        input: node.get("input").and_then(|n| flow_input(cx, n)),
        output: node.get("output").and_then(|n| flow_output(cx, n)),
        imports: node
            .get("imports")
            .map(|n| string_list(cx, n))
            .unwrap_or_default(),
        providers: node
            .get("providers")
            .map(|n| providers(cx, n))
            .unwrap_or_default(),
        mcp_servers: match node.get("mcp_servers") {
            Some(n) if top => mcp_servers(cx, n),
            _ => IndexMap::new(),
        },
        agents,
        unreadable_agents,
        defaults: node.get("defaults").and_then(|n| defaults(cx, n)),
        limits: node.get("limits").and_then(|n| limits(cx, n)),
        allow: node.get("allow").map(|n| list(cx, n, agent_kind)),
        allow_hosts: node.get("allow_hosts").map(|n| string_list(cx, n)),
        start: node.get("start").and_then(|n| string(cx, n)),
        steps,
        tests,
        span: node.span,
    }
}

/// Lowers an imported file of shared agents and providers.
pub fn library(cx: &mut Cx, node: &Node) -> Library {
    if matches!(node.value, Value::Null) {
        return Library::default();
    }
    let Some(m) = map(cx, node, "an imported file") else {
        return Library::default();
    };
    check_keys(cx, m, "an imported file", LIBRARY_KEYS);
    let (agents, unreadable_agents) = agents_of(cx, node);
    Library {
        imports: node
            .get("imports")
            .map(|n| string_list(cx, n))
            .unwrap_or_default(),
        providers: node
            .get("providers")
            .map(|n| providers(cx, n))
            .unwrap_or_default(),
        mcp_servers: node
            .get("mcp_servers")
            .map(|n| mcp_servers(cx, n))
            .unwrap_or_default(),
        agents,
        unreadable_agents,
    }
}

fn first_line(node: &Node) -> Span {
    Span::new(node.span.file, node.span.start as usize, node.span.start as usize)
}

fn check_flow_name(cx: &mut Cx, name: &Sp<String>) {
    let s = &name.value;
    let ok = s.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !ok {
        cx.push(
            Diagnostic::new(
                &codes::INVALID_IDENTIFIER,
                name.span,
                format!("invalid flow name `{s}`"),
            )
            .label("not `[a-z][a-z0-9_-]*`")
            .help(format!(
                "flow names are lower case letters, digits, `_` and `-`, starting with a letter: `{}`",
                suggest_ident(s, true)
            )),
        );
    }
}

fn flow_input(cx: &mut Cx, node: &Node) -> Option<FlowInput> {
    let m = map(cx, node, "`input`")?;
    check_keys(cx, m, "the flow's `input`", &["schema"]);
    Some(FlowInput {
        schema: node.get("schema").and_then(|n| schema_ref(cx, n)),
    })
}

fn flow_output(cx: &mut Cx, node: &Node) -> Option<FlowOutput> {
    let m = map(cx, node, "`output`")?;
    check_keys(cx, m, "the flow's `output`", &["schema", "select"]);
    Some(FlowOutput {
        schema: node.get("schema").and_then(|n| schema_ref(cx, n)),
        select: node.get("select").and_then(|n| string(cx, n)),
    })
}
