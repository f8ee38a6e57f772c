//! A small MCP server for the tests and the benchmark, written with the SDK's server side.
//!
//! It speaks stdio by default, and Streamable HTTP with `--http 127.0.0.1:PORT` (port 0 picks
//! one; the server's URL, `http://ADDR/mcp`, is printed as the first line of stdout). It
//! speaks every protocol revision up to the stateless 2026-07-28, or with `--legacy` only
//! those with the `initialize` handshake (up to 2025-11-25). Its tools
//! each exercise one part of a client: text, structured content and its output schema, errors,
//! progress, a crash mid-call, large and non-text results (image, audio, embedded resources), annotations, a call counter, an
//! environment variable given back, and elicitation. When `MCP_FIXTURE_PIDS` names a file, the process appends its pid to it on
//! start, so a test can count the servers started and check that none is left running; when
//! `MCP_FIXTURE_LOG` does, it appends `call TOOL` for each call and `cancelled slow` for a
//! `slow` call cancelled, and over HTTP `session opened ID` and `session closed ID` (a
//! client's `DELETE` of its session).

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ElicitRequestParams, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProtocolVersion, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{Value, json};

/// Calls served by this process, over every session.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// A 1×1 PNG.
const PNG: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

/// "RIFF....WAVE" and nothing else: the 12 bytes a WAV file starts with.
const WAV: &str = "UklGRgQAAABXQVZF";

/// "%PDF-1.4 fixture\n".
const PDF: &str = "JVBERi0xLjQgZml4dHVyZQo=";

#[derive(Clone)]
struct Fixture {
    /// Speaks only the revisions with the `initialize` handshake (up to 2025-11-25).
    legacy: bool,
}

fn tools() -> Vec<Tool> {
    let text = json!({
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    });
    let empty = json!({"type": "object", "properties": {}});
    let defs = vec![
        json!({"name": "echo", "description": "Returns its text.", "inputSchema": text}),
        json!({
            "name": "add",
            "description": "Adds two numbers.",
            "inputSchema": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
            "outputSchema": {
                "type": "object",
                "properties": {"sum": {"type": "number"}},
                "required": ["sum"],
            },
            "annotations": {"readOnlyHint": true},
        }),
        json!({
            "name": "bad_output",
            "description": "Structured content that breaks its output schema.",
            "inputSchema": empty,
            "outputSchema": {
                "type": "object",
                "properties": {"sum": {"type": "number"}},
                "required": ["sum"],
            },
        }),
        json!({"name": "fail", "description": "Fails with isError.", "inputSchema": empty}),
        json!({"name": "json_text", "description": "One text block holding JSON.", "inputSchema": empty}),
        json!({
            "name": "slow",
            "description": "Sleeps `ms`, sending progress every `progress_every_ms`.",
            "annotations": {"readOnlyHint": false, "idempotentHint": true},
            "inputSchema": {
                "type": "object",
                "properties": {
                    "ms": {"type": "integer", "minimum": 0},
                    "progress_every_ms": {"type": "integer", "minimum": 1},
                },
                "required": ["ms"],
            },
        }),
        json!({"name": "crash", "description": "Exits mid-call (exit 3).", "inputSchema": empty}),
        json!({
            "name": "big",
            "description": "A text block of `bytes` bytes.",
            "inputSchema": {
                "type": "object",
                "properties": {"bytes": {"type": "integer", "minimum": 0}},
                "required": ["bytes"],
            },
        }),
        json!({"name": "image", "description": "An image block.", "inputSchema": empty}),
        json!({"name": "audio", "description": "A text block and an audio block.", "inputSchema": empty}),
        json!({
            "name": "resource",
            "description": "An embedded blob resource and an embedded text resource.",
            "inputSchema": empty,
        }),
        json!({
            "name": "destructive",
            "description": "Marked destructive.",
            "inputSchema": empty,
            "annotations": {"destructiveHint": true, "readOnlyHint": false},
        }),
        json!({
            "name": "read_only",
            "description": "Marked read-only.",
            "inputSchema": empty,
            "annotations": {"readOnlyHint": true},
        }),
        json!({"name": "count", "description": "Calls this process has served.", "inputSchema": empty}),
        json!({
            "name": "env",
            "description": "The value of an environment variable of the server (a server that leaks a secret).",
            "inputSchema": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            },
        }),
        json!({
            "name": "elicit",
            "description": "Asks the client a yes/no question and returns the answer.",
            "inputSchema": text_message(),
        }),
    ];
    defs.into_iter()
        .map(|def| serde_json::from_value(def).expect("a tool definition"))
        .collect()
}

fn text_message() -> Value {
    json!({
        "type": "object",
        "properties": {"message": {"type": "string"}},
        "required": ["message"],
    })
}

fn elicit_schema() -> Value {
    json!({"type": "object", "properties": {"ok": {"type": "boolean"}}})
}

fn result(value: Value) -> Result<CallToolResponse, ErrorData> {
    let result: CallToolResult = serde_json::from_value(value).expect("a tool result");
    Ok(result.into())
}

fn text(text: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": text.into()}]})
}

fn arg_u64(args: &serde_json::Map<String, Value>, name: &str) -> Option<u64> {
    args.get(name).and_then(Value::as_u64)
}

impl Fixture {
    async fn slow(
        &self,
        args: &serde_json::Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let ms = arg_u64(args, "ms").unwrap_or(0);
        let every = arg_u64(args, "progress_every_ms");
        let token = context.meta.get_progress_token();
        let end = tokio::time::Instant::now() + Duration::from_millis(ms);
        let mut step = 0u32;
        loop {
            let now = tokio::time::Instant::now();
            if now >= end {
                break;
            }
            let wait = match every {
                Some(every) => Duration::from_millis(every).min(end - now),
                None => end - now,
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = context.ct.cancelled() => {
                    eprintln!("mcp_fixture: slow cancelled");
                    log("cancelled slow");
                    return Err(ErrorData::internal_error("cancelled", None));
                }
            }
            if let (Some(token), Some(_)) = (&token, every) {
                step += 1;
                let param = ProgressNotificationParam::new(token.clone(), f64::from(step));
                let _ = context.peer.notify_progress(param).await;
            }
        }
        result(text(format!("slept {ms} ms")))
    }

    async fn elicit(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.clone().unwrap_or_default();
        let message = args
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("ok?")
            .to_owned();
        let params = json!({"mode": "form", "message": message, "requestedSchema": elicit_schema()});
        let stateless = context
            .protocol_version()
            .is_some_and(|version| !version.has_initialize());
        if stateless {
            // The stateless revision forbids requests to the client: ask with an
            // input-required result, and read the answer from the retried call.
            if let Some(answer) = request.input_responses.as_ref().and_then(|r| r.get("ok")) {
                return result(json!({"content": [], "structuredContent": {"answer": answer}}));
            }
            let required = json!({
                "resultType": "input_required",
                "inputRequests": {"ok": {"method": "elicitation/create", "params": params}},
            });
            let required = serde_json::from_value(required).expect("an input-required result");
            return Ok(CallToolResponse::InputRequired(required));
        }
        let params: ElicitRequestParams = serde_json::from_value(params).expect("elicit params");
        match context.peer.create_elicitation(params).await {
            Ok(answer) => {
                let answer = serde_json::to_value(answer).expect("an elicitation answer");
                result(json!({"content": [], "structuredContent": {"answer": answer}}))
            }
            Err(error) => result(json!({
                "content": [{"type": "text", "text": format!("elicitation failed: {error}")}],
                "isError": true,
            })),
        }
    }
}

impl ServerHandler for Fixture {
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        let newest = if self.legacy {
            ProtocolVersion::V_2025_11_25
        } else {
            ProtocolVersion::V_2026_07_28
        };
        std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(&newest))
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_instructions("switchyard's MCP test fixture")
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let served = CALLS.fetch_add(1, Ordering::SeqCst) + 1;
        log(&format!("call {}", request.name));
        let args = request.arguments.clone().unwrap_or_default();
        match request.name.as_ref() {
            "echo" => {
                let text_arg = args.get("text").and_then(Value::as_str).unwrap_or_default();
                result(text(text_arg))
            }
            "add" => {
                let sum = match (args.get("a"), args.get("b")) {
                    (Some(Value::Number(a)), Some(Value::Number(b))) => match (a.as_i64(), b.as_i64()) {
                        (Some(a), Some(b)) => json!(a.saturating_add(b)),
                        _ => json!(a.as_f64().unwrap_or(0.0) + b.as_f64().unwrap_or(0.0)),
                    },
                    _ => json!(0),
                };
                result(json!({
                    "content": [{"type": "text", "text": sum.to_string()}],
                    "structuredContent": {"sum": sum},
                }))
            }
            "bad_output" => result(json!({
                "content": [{"type": "text", "text": "sum is missing"}],
                "structuredContent": {"total": "three"},
            })),
            "fail" => result(json!({
                "content": [{"type": "text", "text": "the tool failed on purpose"}],
                "isError": true,
            })),
            "json_text" => result(text(r#"{"answer": 42, "items": ["a", "b"]}"#)),
            "slow" => self.slow(&args, &context).await,
            "crash" => {
                eprintln!("mcp_fixture: crashing mid-call");
                std::process::exit(3);
            }
            "big" => {
                let bytes = usize::try_from(arg_u64(&args, "bytes").unwrap_or(0)).unwrap_or(0);
                result(text("x".repeat(bytes)))
            }
            "image" => result(json!({
                "content": [{"type": "image", "data": PNG, "mimeType": "image/png"}],
            })),
            "audio" => result(json!({
                "content": [
                    {"type": "text", "text": "a beep"},
                    {"type": "audio", "data": WAV, "mimeType": "audio/wav"},
                ],
            })),
            "resource" => result(json!({
                "content": [
                    {"type": "resource", "resource": {
                        "uri": "file:///fixture/report.pdf", "mimeType": "application/pdf", "blob": PDF,
                    }},
                    {"type": "resource", "resource": {
                        "uri": "file:///fixture/notes.txt", "mimeType": "text/plain", "text": "some notes",
                    }},
                ],
            })),
            "destructive" => result(text("destroyed")),
            "read_only" => result(text("read")),
            "count" => result(json!({
                "content": [{"type": "text", "text": served.to_string()}],
                "structuredContent": {"count": served, "pid": std::process::id()},
            })),
            "elicit" => self.elicit(&request, &context).await,
            "env" => {
                let name = args.get("name").and_then(Value::as_str).unwrap_or_default();
                result(text(std::env::var(name).unwrap_or_default()))
            }
            other => Err(ErrorData::invalid_params(format!("unknown tool `{other}`"), None)),
        }
    }
}

/// Appends a line to the file `MCP_FIXTURE_LOG` names, if set: each call's tool, and each
/// call cancelled, so that a test sees what reached the server.
fn log(line: &str) {
    let Some(path) = std::env::var_os("MCP_FIXTURE_LOG") else {
        return;
    };
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(&path) {
        let _ = writeln!(file, "{line}");
    }
}

fn record_pid() {
    let Some(path) = std::env::var_os("MCP_FIXTURE_PIDS") else {
        return;
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("MCP_FIXTURE_PIDS names a writable file");
    writeln!(file, "{}", std::process::id()).expect("the pid is written");
}

/// Logs the sessions a client opens (the id an answer gives it) and closes (its `DELETE`).
async fn log_sessions(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    const SESSION: &str = "mcp-session-id";
    let id = |h: &axum::http::HeaderMap| h.get(SESSION).and_then(|v| v.to_str().ok()).map(String::from);
    let closing = (request.method() == axum::http::Method::DELETE)
        .then(|| id(request.headers()))
        .flatten();
    let asked = id(request.headers());
    let response = next.run(request).await;
    if let Some(closed) = closing {
        if response.status().is_success() {
            log(&format!("session closed {closed}"));
        }
    } else if asked.is_none()
        && let Some(opened) = id(response.headers())
    {
        log(&format!("session opened {opened}"));
    }
    response
}

async fn serve_http(addr: &str, legacy: bool) -> Result<(), Box<dyn std::error::Error>> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let service = StreamableHttpService::new(
        move || Ok(Fixture { legacy }),
        std::sync::Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_sse_keep_alive(None),
    );
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(log_sessions));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    println!("http://{bound}/mcp");
    std::io::stdout().flush()?;
    eprintln!("mcp_fixture: listening on http://{bound}/mcp");
    axum::serve(listener, router).await?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    record_pid();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let legacy = args.iter().any(|a| a == "--legacy");
    args.retain(|a| a != "--legacy");
    match args.as_slice() {
        [] => {
            let running = Fixture { legacy }.serve(rmcp::transport::stdio()).await?;
            running.waiting().await?;
            Ok(())
        }
        [flag, addr] if flag == "--http" => serve_http(addr, legacy).await,
        _ => {
            eprintln!("usage: mcp_fixture [--legacy] [--http 127.0.0.1:PORT]");
            std::process::exit(2);
        }
    }
}
