//! `kind: mcp` (SPEC §6.4): one tool of an MCP server, called with the step's input document
//! as its arguments.
//!
//! [`sdk`] is the only file that speaks to the SDK; [`process`] starts and ends a stdio
//! server's process group; [`pool`] keeps one server per definition for the whole process and
//! ends them all ([`shutdown`]). This file is the call: the allowlist, the arguments checked
//! against the tool's `inputSchema` before anything is sent, the timeout that progress
//! extends, and the result `{structured, content, is_error}`, capped in size, its
//! `structuredContent` checked against the tool's `outputSchema`, its images, audio and blob
//! resources stored as files ([`files`]).

pub mod files;
pub mod pool;
pub mod process;
pub mod sdk;

use std::time::Duration;

use serde_json::{Value, json};

pub use self::pool::{MAX_RESTARTS, ShutdownGuard, shutdown};
pub use self::sdk::{Annotations, ToolInfo};
use self::sdk::{SdkError, ToolResult};
use super::CallContext;
use crate::model::fmt_duration;
use crate::plan::{McpPlan, McpServerPlan, McpTransport};
use crate::record::{ErrorKind, StepError};

/// How long a call may be extended by progress notifications when the server sets no
/// `max_time`: this many times its timeout.
const DEFAULT_MAX_TIME_FACTOR: u32 = 10;

/// A step's call of an MCP tool. `timeout` is the call's (the step's, its agent's, the flow's
/// `defaults`, else the server's `timeout`).
/// With an `elicitor`, what the server asks during the call is answered from it; a question
/// it has no answer for abandons the call (the elicitor keeps the question, for the run to
/// stop and ask). A tool that needs approval is refused unless `approved` (the runtime asked
/// a human, or its agent loop did).
pub async fn call(
    plan: &McpPlan,
    input: &Value,
    cx: CallContext<'_>,
    elicitor: Option<&std::sync::Arc<crate::agents::elicit::Elicitor>>,
    approved: bool,
) -> Result<Value, StepError> {
    let (out, connection) = call_on(plan, input, cx, elicitor, approved).await;
    // What the server sent back may hold the secrets it was given: never in a record or log.
    match (out, connection) {
        (Ok(mut value), Some(c)) => {
            c.secrets.redact_value(&mut value);
            Ok(value)
        }
        (Err(e), Some(c)) => Err(c.secrets.redact_error(e)),
        (out, None) => out,
    }
}

async fn call_on(
    plan: &McpPlan,
    input: &Value,
    cx: CallContext<'_>,
    elicitor: Option<&std::sync::Arc<crate::agents::elicit::Elicitor>>,
    approved: bool,
) -> (Result<Value, StepError>, Option<std::sync::Arc<pool::Connection>>) {
    let server = &*plan.server;
    let tool = plan.tool.as_str();
    if !server.allows(tool) {
        return (
            Err(permanent(format!(
                "tool `{tool}` is not in the `tools:` of MCP server `{}`; it is never called",
                server.name
            ))),
            None,
        );
    }
    let Value::Object(arguments) = input else {
        return (
            Err(permanent(format!(
                "the arguments of MCP tool `{}.{tool}` are an object; the input document is {}",
                server.name,
                crate::expr::path::type_name(input)
            ))),
            None,
        );
    };
    let connection = match pool::connection(server).await {
        Ok(c) => c,
        Err(e) => return (Err(unavailable(e)), None),
    };
    let out = call_tool(server, tool, arguments, &connection, cx, (elicitor, approved)).await;
    (out, Some(connection))
}

async fn call_tool(
    server: &McpServerPlan,
    tool: &str,
    arguments: &serde_json::Map<String, Value>,
    connection: &pool::Connection,
    cx: CallContext<'_>,
    (elicitor, approved): (Option<&std::sync::Arc<crate::agents::elicit::Elicitor>>, bool),
) -> Result<Value, StepError> {
    let tools = pool::tools(server, connection).await.map_err(unavailable)?;
    if tools.get(tool).is_none() {
        return Err(permanent(format!(
            "MCP server `{}` lists no tool `{tool}`",
            server.name
        )));
    }
    if !approved && let Some(why) = needs_approval(server, tools.get(tool)) {
        return Err(permanent(format!(
            "MCP tool `{}.{tool}` needs approval ({why}), which a plain `mcp` step does not ask for; it was not called",
            server.name
        )));
    }
    let input = Value::Object(arguments.clone());
    if let Some(Some(schema)) = tools.inputs.get(tool)
        && let Err(v) = schema.check(&input)
    {
        return Err(permanent(format!(
            "the arguments of MCP tool `{}.{tool}` do not match its `inputSchema` {v}; it was not called",
            server.name
        ))
        .with_details(json!({"retryable": false, "pointer": v.pointer, "rule": v.message})));
    }
    let max_time = server
        .max_time
        .unwrap_or(cx.timeout.saturating_mul(DEFAULT_MAX_TIME_FACTOR))
        .max(cx.timeout);
    let answer = connection
        .client
        .call(
            tool,
            arguments.clone(),
            cx.timeout,
            Some(max_time),
            cx.cancel,
            elicitor,
        )
        .await;
    let mut result = match answer {
        Ok(r) => r,
        Err(e) => {
            if matches!(e, SdkError::Closed(_)) {
                connection.settle().await;
            }
            return Err(call_error(server, tool, e, connection, cx.timeout, max_time));
        }
    };
    if !result.is_error {
        // Images, audio and blob resources become files (SPEC §6.5) before the result is
        // capped: a reference is small.
        let secret = |text: &str| connection.secrets.redact(text) != text;
        result.content = files::store(tool, std::mem::take(&mut result.content), cx.files, &secret).await?;
    }
    let output = tools.outputs.get(tool).cloned().flatten();
    shape(server, tool, result, output.as_deref())
}

/// Why a call of `info` on `server` waits for a human (SPEC §6.4): the tool is in `approve:`,
/// or the server is trusted, marks it destructive and `no_approval:` does not list it.
pub fn needs_approval(server: &McpServerPlan, info: Option<&ToolInfo>) -> Option<String> {
    let tool = info?.name.as_str();
    if server.approve.iter().any(|t| t == tool || t == "*") {
        return Some(format!("`approve:` of MCP server `{}`", server.name));
    }
    let destructive = info.is_some_and(|i| i.annotations.destructive == Some(true));
    if server.trusted && destructive && !server.no_approval.iter().any(|t| t == tool || t == "*") {
        return Some(format!(
            "trusted MCP server `{}` marks it destructive and `no_approval:` does not list it",
            server.name
        ));
    }
    None
}

/// The result of a call as a step sees it. `is_error` fails the step with the text of its
/// content.
fn shape(
    server: &McpServerPlan,
    tool: &str,
    result: ToolResult,
    output: Option<&crate::plan::Schema>,
) -> Result<Value, StepError> {
    if result.is_error {
        let text = texts(&result.content);
        let text = if text.is_empty() {
            "no text".to_string()
        } else {
            cut_text(&text, 2000)
        };
        // The tool's own words are kept apart: an agent loop tells the model them alone.
        return Err(StepError::new(
            ErrorKind::Agent,
            format!("MCP tool `{}.{tool}` failed: {text}", server.name),
        )
        .with_details(json!({"is_error": true, "text": text})));
    }
    let structured = match result.structured {
        Some(s) => {
            if let Some(schema) = output
                && let Err(v) = schema.check(&s)
            {
                return Err(StepError::new(
                    ErrorKind::InvalidOutput,
                    format!(
                        "the structured content of MCP tool `{}.{tool}` does not match its `outputSchema` {v}",
                        server.name
                    ),
                )
                .with_details(json!({"pointer": v.pointer, "rule": v.message})));
            }
            s
        }
        None => json_text(&result.content).unwrap_or(Value::Null),
    };
    let content = cap(result.content, server.max_result_bytes);
    Ok(json!({"structured": structured, "content": content, "is_error": false}))
}

/// The value of the only text block, when it is JSON.
fn json_text(content: &[Value]) -> Option<Value> {
    let mut texts = content.iter().filter(|b| b["type"] == "text");
    let only = texts.next()?;
    if texts.next().is_some() {
        return None;
    }
    crate::json::from_str(only["text"].as_str()?).ok()
}

/// The blocks as a result holds them: a text block as its text, any other block as MCP's
/// JSON of it; cut at `max` bytes, with a note saying so.
fn cap(blocks: Vec<Value>, max: u64) -> Vec<Value> {
    let size = |b: &Value| match b.get("type").and_then(Value::as_str) {
        Some("text") => b["text"].as_str().map_or(0, str::len) as u64,
        _ => serde_json::to_string(b).map_or(0, |s| s.len()) as u64,
    };
    let total: u64 = blocks.iter().map(size).sum();
    let mut out = Vec::with_capacity(blocks.len());
    let mut used = 0u64;
    for b in blocks {
        let n = size(&b);
        let room = max.saturating_sub(used);
        let is_text = b.get("type").and_then(Value::as_str) == Some("text");
        if n <= room {
            used += n;
            out.push(if is_text { b["text"].clone() } else { b });
            continue;
        }
        if is_text && room > 0 {
            let text = b["text"].as_str().unwrap_or_default();
            let cut = floor_char_boundary(text, room as usize);
            used += cut as u64;
            out.push(Value::String(text[..cut].to_string()));
        }
        break;
    }
    if used < total {
        out.push(Value::String(format!("[result cut at {used} bytes of {total}]")));
    }
    out
}

fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn texts(content: &[Value]) -> String {
    content
        .iter()
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

fn cut_text(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    format!("{}…", &s[..floor_char_boundary(s, max)])
}

fn call_error(
    server: &McpServerPlan,
    tool: &str,
    e: SdkError,
    connection: &pool::Connection,
    timeout: Duration,
    max_time: Duration,
) -> StepError {
    let name = format!("{}.{tool}", server.name);
    match e {
        SdkError::Timeout(after) => {
            let why = if after >= max_time && max_time > timeout {
                format!("its `max_time` of {}", fmt_duration(max_time))
            } else {
                format!("{} without an answer or progress", fmt_duration(timeout))
            };
            StepError::new(
                ErrorKind::Timeout,
                format!("MCP tool `{name}` timed out after {why}; the request was cancelled"),
            )
        }
        SdkError::Cancelled => StepError::new(
            ErrorKind::Cancelled,
            format!("MCP tool `{name}`: the run was cancelled"),
        ),
        SdkError::NotSent(why) => StepError::new(
            ErrorKind::Agent,
            format!(
                "MCP tool `{name}`: {} (the request never reached the server)",
                connection.secrets.redact(&why)
            ),
        ),
        SdkError::Closed(_) => {
            let (how, tail) = connection.end_parts();
            let tail = if tail.is_empty() {
                String::new()
            } else {
                format!("; its stderr ended with: {tail}")
            };
            permanent(format!(
                "MCP server `{}` {how} during a call of `{tool}`{tail}",
                server.name
            ))
        }
        SdkError::InputRequired(_) => permanent(format!(
            "MCP tool `{name}` asks for input this client cannot give (only form elicitation is answered)"
        )),
        SdkError::NeedsAnswer => StepError::new(
            ErrorKind::Agent,
            format!("MCP tool `{name}` asks for input a human must give"),
        ),
        other => permanent(format!(
            "MCP tool `{name}`: {}",
            connection.secrets.redact(&other.to_string())
        )),
    }
}

fn unavailable(u: pool::Unavailable) -> StepError {
    match u {
        // Nothing was sent: asking again may reach a server that starts this time.
        pool::Unavailable::Start(why) => StepError::new(ErrorKind::Agent, why),
        pool::Unavailable::Broken(why) => permanent(why),
    }
}

/// An `agent` error that asking again cannot help.
fn permanent(message: String) -> StepError {
    StepError::new(ErrorKind::Agent, message).with_details(json!({"retryable": false}))
}

/// Whether a plain step's call of `plan` may be sent again after a crash cut it (SPEC §7.3):
/// the tool is in the server's `idempotent:` (decided at compile time), or the server is
/// trusted and marks it read-only or idempotent. Starts the server to read its tools.
pub async fn idempotent_by_annotations(plan: &McpPlan) -> bool {
    if !plan.server.trusted {
        return false;
    }
    let Ok(c) = pool::connection(&plan.server).await else {
        return false;
    };
    let Ok(tools) = pool::tools(&plan.server, &c).await else {
        return false;
    };
    tools
        .get(&plan.tool)
        .is_some_and(|t| t.annotations.read_only == Some(true) || t.annotations.idempotent == Some(true))
}

/// Every tool `server` lists, for `lint --mcp` and `mcp list`: starts it if needed.
pub async fn list(server: &McpServerPlan) -> Result<(Vec<ToolInfo>, String), String> {
    let c = pool::connection(server).await.map_err(|e| e.to_string())?;
    let tools = pool::tools(server, &c).await.map_err(|e| e.to_string())?;
    Ok((tools.list.clone(), c.client.protocol()))
}

/// What a call of `m` notes on its record for its OpenTelemetry span (SPEC §13, OpenTelemetry's
/// MCP conventions): the server, the tool, the transport (`pipe` for stdio, `tcp` for HTTP),
/// the protocol revision the session agreed on, and an HTTP server's address and port.
pub fn call_notes(m: &McpPlan) -> serde_json::Value {
    let mut notes = serde_json::Map::new();
    notes.insert("server".into(), m.server.name.clone().into());
    notes.insert("tool".into(), m.tool.clone().into());
    match &m.server.transport {
        McpTransport::Stdio { .. } => {
            notes.insert("transport".into(), "pipe".into());
        }
        McpTransport::Http { url, .. } => {
            notes.insert("transport".into(), "tcp".into());
            if let Ok(u) = reqwest::Url::parse(url) {
                if let Some(host) = u.host_str() {
                    notes.insert("address".into(), host.into());
                }
                if let Some(port) = u.port_or_known_default() {
                    notes.insert("port".into(), port.to_string().into());
                }
            }
        }
    }
    if let Some(p) = pool::protocol(&m.server).filter(|p| !p.is_empty()) {
        notes.insert("protocol".into(), p.into());
    }
    serde_json::Value::Object(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_over_its_cap_is_cut_with_a_note() {
        let blocks = vec![
            json!({"type": "text", "text": "abcdef"}),
            json!({"type": "text", "text": "gh"}),
        ];
        assert_eq!(cap(blocks.clone(), 100), vec![json!("abcdef"), json!("gh")]);
        assert_eq!(
            cap(blocks, 4),
            vec![json!("abcd"), json!("[result cut at 4 bytes of 8]")]
        );
    }

    #[test]
    fn the_only_text_block_holding_json_is_the_structured_value() {
        let one = vec![json!({"type": "text", "text": "{\"a\": 1}"})];
        assert_eq!(json_text(&one), Some(json!({"a": 1})));
        let two = vec![one[0].clone(), one[0].clone()];
        assert_eq!(json_text(&two), None);
        assert_eq!(json_text(&[json!({"type": "text", "text": "plain"})]), None);
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        let blocks = vec![json!({"type": "text", "text": "ééé"})];
        assert_eq!(cap(blocks, 3)[0], json!("é"));
    }
}
