//! Agent definitions (SPEC §6), named or inline in a step: the keys of each kind, the fields
//! each kind requires, inline `flow` agents (lowered as a flow's body), an agent loop's
//! `tools:`, and `mock` agents (also a flow test's `mocks:`).

use indexmap::IndexMap;

use super::cx::Cx;
use super::limits::retry;
use super::read::{
    any, bool_, check_ident, duration, enum_, f64_, list, map, named, schema_ref, size, string, string_list,
    string_map, u64_, unknown_key,
};
use crate::diag::{Diagnostic, article, codes};
use crate::model::*;
use crate::source::Span;
use crate::syntax::{Node, Value};

/// The keys of a flow an agent holds inline: a flow file's, but for its name and what
/// only a file declares.
pub(super) const INLINE_FLOW_KEYS: &[&str] = &[
    "description",
    "input",
    "output",
    "agents",
    "defaults",
    "limits",
    "allow",
    "allow_hosts",
    "start",
    "steps",
];

/// The `agents:` of a flow or library node: those that could be lowered, and the names of
/// those that could not (each with its error).
pub(super) fn agents_of(cx: &mut Cx, node: &Node) -> (IndexMap<String, Agent>, Vec<String>) {
    let Some(n) = node.get("agents") else {
        return Default::default();
    };
    let agents = agents(cx, n);
    let unreadable = match &n.value {
        Value::Map(m) => m
            .iter()
            .map(|(k, _)| &k.name)
            .filter(|k| !agents.contains_key(k.as_str()))
            .cloned()
            .collect(),
        _ => Vec::new(),
    };
    (agents, unreadable)
}

fn agents(cx: &mut Cx, node: &Node) -> IndexMap<String, Agent> {
    named(cx, node, "`agents`", |cx, k, v| {
        check_ident(cx, "agent", k);
        agent(cx, Sp::new(k.name.clone(), k.span), v)
    })
}

/// The keys every agent definition may have, `kind` first.
pub const AGENT_COMMON_KEYS: &[&str] = &[
    "kind",
    "description",
    "input_schema",
    "result_schema",
    "timeout",
    "retry",
    "idempotent",
];

/// The keys an agent of `kind` has besides [`AGENT_COMMON_KEYS`].
pub fn agent_keys(kind: AgentKind) -> &'static [&'static str] {
    match kind {
        AgentKind::Llm => &[
            "provider",
            "model",
            "system",
            "prompt",
            "temperature",
            "max_tokens",
            "repair_attempts",
            "context_paths",
            "message_mode",
            "max_messages",
            "tools",
            "max_iterations",
            "max_parallel_tools",
            "until_tool",
            "approve",
            "approve_expires",
            "on_expire",
            "attach",
            "max_attach_bytes",
        ],
        AgentKind::Command => &["run", "env", "cwd", "max_output", "bundle"],
        AgentKind::Http => &["url", "method", "headers", "max_response", "body"],
        AgentKind::Flow => &[
            "path",
            "steps",
            "start",
            "agents",
            "input",
            "output",
            "defaults",
            "limits",
            "allow",
            "allow_hosts",
        ],
        AgentKind::Transform => &["result"],
        AgentKind::Native => &["function"],
        AgentKind::Mcp => &["server", "tool"],
        AgentKind::Mock => &[
            "returns",
            "sequence",
            "latency",
            "fail_times",
            "fail_rate",
            "seed",
        ],
    }
}

/// Lowers an agent definition (named, or inline in a step).
pub fn agent(cx: &mut Cx, name: Sp<String>, node: &Node) -> Option<Agent> {
    let m = map(cx, node, "an agent")?;
    let kind = match node.get("kind") {
        Some(n) => agent_kind(cx, n)?,
        None => {
            let list = AgentKind::ALL
                .iter()
                .map(|k| format!("`{}`", k.as_str()))
                .collect::<Vec<_>>()
                .join(", ");
            cx.push(
                Diagnostic::new(
                    &codes::MISSING_KEY,
                    name.span,
                    format!("agent `{}` has no `kind`", name.value),
                )
                .label("missing `kind`")
                .help(format!("add `kind:`, one of {list}")),
            );
            return None;
        }
    };
    let mut valid: Vec<&str> = AGENT_COMMON_KEYS.to_vec();
    valid.extend_from_slice(agent_keys(kind.value));
    let what = format!("{} `{}` agent", article(kind.value.as_str()), kind.value.as_str());
    for (k, _) in m {
        if !valid.contains(&k.name.as_str()) {
            let other = AgentKind::ALL
                .into_iter()
                .find(|o| agent_keys(*o).contains(&k.name.as_str()));
            match other {
                Some(o) => cx.push(
                    Diagnostic::new(
                        &codes::UNKNOWN_KEY,
                        k.span,
                        format!("`{}` is not a field of {what}", k.name),
                    )
                    .label(format!("a field of `{}` agents", o.as_str()))
                    .help(format!(
                        "valid keys are: {}",
                        valid
                            .iter()
                            .map(|v| format!("`{v}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                ),
                None => unknown_key(cx, k, &what, &valid),
            }
        }
    }
    let required = |cx: &mut Cx, field: &str| -> Option<Sp<String>> {
        match node.get(field) {
            Some(n) => string(cx, n),
            None => {
                cx.push(
                    Diagnostic::new(&codes::MISSING_KEY, kind.span, format!("{what} needs `{field}`"))
                        .label(format!("`{field}` missing")),
                );
                None
            }
        }
    };
    let spec = match kind.value {
        AgentKind::Llm => {
            let provider = required(cx, "provider");
            let model = required(cx, "model");
            AgentSpec::Llm(LlmAgent {
                provider: provider.unwrap_or_else(|| Sp::new(String::new(), kind.span)),
                model: model.unwrap_or_else(|| Sp::new(String::new(), kind.span)),
                system: node.get("system").and_then(|n| string(cx, n)),
                prompt: node.get("prompt").and_then(|n| string(cx, n)),
                temperature: node.get("temperature").and_then(|n| f64_(cx, n)),
                max_tokens: node.get("max_tokens").and_then(|n| u64_(cx, n)),
                repair_attempts: node.get("repair_attempts").and_then(|n| u64_(cx, n)),
                context_paths: node
                    .get("context_paths")
                    .map(|n| string_list(cx, n))
                    .unwrap_or_default(),
                message_mode: node.get("message_mode").and_then(|n| {
                    enum_(
                        cx,
                        n,
                        "message mode",
                        &[
                            ("none", MessageMode::None),
                            ("all", MessageMode::All),
                            ("latest", MessageMode::Latest),
                            ("bookend", MessageMode::Bookend),
                        ],
                    )
                }),
                max_messages: node.get("max_messages").and_then(|n| u64_(cx, n)),
                tools: node.get("tools").map(|n| tools(cx, n)).unwrap_or_default(),
                max_iterations: node.get("max_iterations").and_then(|n| u64_(cx, n)),
                max_parallel_tools: node.get("max_parallel_tools").and_then(|n| u64_(cx, n)),
                until_tool: node.get("until_tool").and_then(|n| string(cx, n)),
                approve: node
                    .get("approve")
                    .map(|n| string_list(cx, n))
                    .unwrap_or_default(),
                approve_expires: node.get("approve_expires").and_then(|n| duration(cx, n)),
                on_expire: node.get("on_expire").and_then(|n| {
                    enum_(
                        cx,
                        n,
                        "`on_expire`",
                        &[("fail", OnExpire::Fail), ("reject", OnExpire::Reject)],
                    )
                }),
                attach: node.get("attach").map(any),
                max_attach_bytes: node.get("max_attach_bytes").and_then(|n| size(cx, n)),
            })
        }
        AgentKind::Command => {
            let run = match node.get("run") {
                Some(
                    n @ Node {
                        value: Value::Str(_), ..
                    },
                ) => {
                    cx.push(
                        Diagnostic::new(&codes::INVALID_TYPE, n.span, "`run` is a list of arguments, not a command line")
                            .label("a string")
                            .help("write the program and each argument as list items: `run: [python3, tools/x.py, --top, \"3\"]`; commands never run through a shell"),
                    );
                    Vec::new()
                }
                Some(n) => string_list(cx, n),
                None => {
                    required(cx, "run");
                    Vec::new()
                }
            };
            if let Some(n) = node.get("run")
                && n.as_seq().is_some_and(|s| s.is_empty())
            {
                cx.push(
                    Diagnostic::new(&codes::INVALID_VALUE, n.span, "`run` is empty")
                        .help("name the program to run"),
                );
            }
            AgentSpec::Command(CommandAgent {
                run,
                env: node
                    .get("env")
                    .map(|n| string_map(cx, n, "`env`"))
                    .unwrap_or_default(),
                cwd: node.get("cwd").and_then(|n| string(cx, n)),
                max_output: node.get("max_output").and_then(|n| size(cx, n)),
                bundle: node.get("bundle").map(|n| string_list(cx, n)).unwrap_or_default(),
            })
        }
        AgentKind::Http => {
            let url = required(cx, "url");
            AgentSpec::Http(HttpAgent {
                url: url.unwrap_or_else(|| Sp::new(String::new(), kind.span)),
                method: node.get("method").and_then(|n| string(cx, n)),
                headers: node
                    .get("headers")
                    .map(|n| string_map(cx, n, "`headers`"))
                    .unwrap_or_default(),
                max_response: node.get("max_response").and_then(|n| size(cx, n)),
                body: node.get("body").map(any),
            })
        }
        AgentKind::Flow => {
            let path = node.get("path").and_then(|n| string(cx, n));
            let inline = node.get("steps").is_some();
            if path.is_some() && inline {
                cx.push(
                    Diagnostic::new(
                        &codes::INVALID_VALUE,
                        kind.span,
                        "a `flow` agent has either `path` or inline `steps`, not both",
                    )
                    .label("both given"),
                );
            } else if path.is_none() && !inline && node.get("path").is_none() {
                cx.push(
                    Diagnostic::new(
                        &codes::MISSING_KEY,
                        kind.span,
                        "a `flow` agent needs `path` (a flow file) or inline `steps`",
                    )
                    .label("no flow given"),
                );
            }
            let inline = (inline && path.is_none()).then(|| {
                for (k, _) in m {
                    let n = k.name.as_str();
                    if !INLINE_FLOW_KEYS.contains(&n) && !AGENT_COMMON_KEYS.contains(&n) && n != "path" {
                        unknown_key(cx, k, "an inline flow", INLINE_FLOW_KEYS);
                    }
                }
                Box::new((cx.inline_flow)(cx, node, Sp::new(name.value.clone(), name.span)))
            });
            AgentSpec::Flow(FlowAgent { path, inline })
        }
        AgentKind::Transform => match node.get("result") {
            Some(n) => AgentSpec::Transform(TransformAgent { result: any(n) }),
            None => {
                required(cx, "result");
                return None;
            }
        },
        AgentKind::Mock => AgentSpec::Mock(mock(cx, node, kind.span)?),
        AgentKind::Native => AgentSpec::Native(NativeAgent {
            function: node.get("function").and_then(|n| string(cx, n)),
        }),
        AgentKind::Mcp => {
            let server = required(cx, "server");
            let tool = required(cx, "tool");
            AgentSpec::Mcp(McpAgent {
                server: server.unwrap_or_else(|| Sp::new(String::new(), kind.span)),
                tool: tool.unwrap_or_else(|| Sp::new(String::new(), kind.span)),
            })
        }
    };
    Some(Agent {
        name,
        kind,
        spec,
        common: AgentCommon {
            description: node
                .get("description")
                .and_then(|n| string(cx, n))
                .map(|s| s.value),
            input_schema: node.get("input_schema").and_then(|n| schema_ref(cx, n)),
            result_schema: node.get("result_schema").and_then(|n| schema_ref(cx, n)),
            timeout: node.get("timeout").and_then(|n| duration(cx, n)),
            retry: node.get("retry").and_then(|n| retry(cx, n)),
            idempotent: node.get("idempotent").and_then(|n| bool_(cx, n)),
        },
        span: node.span,
    })
}

/// An agent loop's `tools:`: a list of agent names, or a map name → `{description}` (or
/// nothing).
fn tools(cx: &mut Cx, node: &Node) -> Tools {
    let mut list = Vec::new();
    if node.as_seq().is_some() {
        for name in string_list(cx, node) {
            if list.iter().any(|t: &Tool| t.name.value == name.value) {
                cx.push(
                    Diagnostic::new(
                        &codes::INVALID_VALUE,
                        name.span,
                        format!("`{}` is listed twice in `tools`", name.value),
                    )
                    .label("listed before")
                    .help("remove this entry: each tool is listed once"),
                );
                continue;
            }
            list.push(Tool {
                name,
                description: None,
            });
        }
    } else if node.as_map().is_some() {
        for (_, tool) in named(cx, node, "`tools`", |cx, k, v| {
            let name = Sp::new(k.name.clone(), k.span);
            let description = match &v.value {
                Value::Null => None,
                _ => {
                    let m = map(cx, v, "a tool")?;
                    for (k, _) in m {
                        if k.name != "description" {
                            unknown_key(cx, k, "a tool", &["description"]);
                        }
                    }
                    v.get("description").and_then(|n| string(cx, n))
                }
            };
            Some(Tool { name, description })
        }) {
            list.push(tool);
        }
    } else {
        cx.push(
            Diagnostic::new(
                &codes::INVALID_TYPE,
                node.span,
                "`tools` is a list of agent names, or a map name → `{description}`",
            )
            .label("neither a list nor a map")
            .help("write `tools: [kb_search, crm_lookup]`"),
        );
    }
    Tools {
        list,
        span: Some(node.span),
    }
}

pub(super) const MOCK_KEYS: &[&str] = &[
    "returns",
    "sequence",
    "latency",
    "fail_times",
    "fail_rate",
    "seed",
];

pub(super) fn mock(cx: &mut Cx, node: &Node, at: Span) -> Option<MockAgent> {
    let returns = node.get("returns").map(any);
    let sequence = node.get("sequence").map(|n| list(cx, n, |_, n| Some(any(n))));
    if returns.is_some() && sequence.is_some() {
        cx.push(
            Diagnostic::new(
                &codes::INVALID_VALUE,
                at,
                "a mock has `returns` or `sequence`, not both",
            )
            .label("both given"),
        );
    }
    if let Some(s) = &sequence
        && s.is_empty()
    {
        let n = node.get("sequence").expect("sequence present");
        cx.push(
            Diagnostic::new(&codes::INVALID_VALUE, n.span, "`sequence` is empty")
                .help("give at least one value"),
        );
    }
    let fail_rate = node.get("fail_rate").and_then(|n| f64_(cx, n));
    if let Some(r) = &fail_rate
        && !(0.0..=1.0).contains(&r.value)
    {
        cx.push(
            Diagnostic::new(
                &codes::LIMIT_OUT_OF_RANGE,
                r.span,
                format!("`fail_rate` is {}, outside 0..=1", r.value),
            )
            .label("a fraction of calls"),
        );
    }
    Some(MockAgent {
        returns,
        sequence,
        latency: node.get("latency").and_then(|n| duration(cx, n)),
        fail_times: node.get("fail_times").and_then(|n| u64_(cx, n)),
        fail_rate,
        seed: node.get("seed").and_then(|n| u64_(cx, n)),
    })
}

pub(super) fn agent_kind(cx: &mut Cx, node: &Node) -> Option<Sp<AgentKind>> {
    let options: Vec<(&str, AgentKind)> = AgentKind::ALL.iter().map(|k| (k.as_str(), *k)).collect();
    enum_(cx, node, "agent kind", &options)
}
