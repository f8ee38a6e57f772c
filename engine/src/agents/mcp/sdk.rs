//! The MCP SDK (`rmcp`) behind our own small types: the only file of the client side that
//! imports it, so that its next major version touches this file alone.
//!
//! It connects over a child's pipes or Streamable HTTP, negotiating the protocol revision
//! (the stateless `2026-07-28` by `server/discover`, falling back to the `initialize`
//! handshake of `2025-11-25` for servers that do not know it), lists tools, and calls one with
//! a timeout that progress notifications extend up to a ceiling, cancelling the request
//! (`notifications/cancelled`) when the time is up or the caller gives up.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ClientRequest, ElicitRequestParams,
    ElicitResult, ElicitationAction, Implementation, ProtocolVersion, Request, ServerResult,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt as _, NotificationContext, PeerRequestOptions, RequestContext,
    RunningService, ServiceError,
};
use rmcp::{ClientHandler, ErrorData, RoleClient};
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use crate::agents::elicit::{Asked, Elicitor, Reply};

/// The most times one call is sent again with answers to what its server asked.
const MAX_INPUT_ROUNDS: usize = 8;

fn to_json(r: &ElicitResult) -> Value {
    serde_json::to_value(r).unwrap_or(Value::Null)
}

/// A tool as a server lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolInfo {
    pub name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    /// The JSON Schema of its arguments.
    pub input_schema: Value,
    /// The JSON Schema of its `structuredContent`, when it gives one.
    pub output_schema: Option<Value>,
    /// What the server says of it (untrusted unless the flow says `trust: trusted`).
    pub annotations: Annotations,
}

/// A tool's annotations (hints), each absent when the server does not say.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Annotations {
    pub read_only: Option<bool>,
    pub destructive: Option<bool>,
    pub idempotent: Option<bool>,
    pub open_world: Option<bool>,
}

impl Annotations {
    /// As MCP's JSON writes them, only those given.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        for (k, v) in [
            ("readOnlyHint", self.read_only),
            ("destructiveHint", self.destructive),
            ("idempotentHint", self.idempotent),
            ("openWorldHint", self.open_world),
        ] {
            if let Some(v) = v {
                m.insert(k.into(), Value::Bool(v));
            }
        }
        Value::Object(m)
    }
}

/// What a `tools/call` answered.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResult {
    /// The content blocks, each as MCP's JSON writes it (`{type: text, text}`, ...).
    pub content: Vec<Value>,
    /// `structuredContent`, when given.
    pub structured: Option<Value>,
    pub is_error: bool,
}

/// Why a request failed.
#[derive(Debug)]
pub enum SdkError {
    /// No answer within the time allowed; the request was cancelled.
    Timeout(Duration),
    /// The caller gave up (the run was cancelled); the request was cancelled.
    Cancelled,
    /// The request could not be sent: the server never saw it.
    NotSent(String),
    /// The connection closed before the answer came: the server may have acted.
    Closed(String),
    /// The server answered with a JSON-RPC error.
    Protocol(String),
    /// The server asks the client for input before it can finish (the stateless revision's
    /// `input_required`): its requests as JSON.
    InputRequired(Value),
    /// The server asked a question the call's elicitor has no answer for: the call was
    /// abandoned, the question is the elicitor's.
    NeedsAnswer,
    /// An answer that is not a tool's result.
    Unexpected(String),
}

impl std::fmt::Display for SdkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SdkError::Timeout(d) => write!(f, "no answer within {} ms", d.as_millis()),
            SdkError::Cancelled => write!(f, "cancelled"),
            SdkError::NotSent(e) => write!(f, "the request could not be sent: {e}"),
            SdkError::Closed(e) => write!(f, "the connection closed before the answer: {e}"),
            SdkError::Protocol(e) => write!(f, "the server answered with an error: {e}"),
            SdkError::InputRequired(_) => write!(f, "the server asks for input (elicitation)"),
            SdkError::NeedsAnswer => write!(f, "the server asks for input a human must give"),
            SdkError::Unexpected(e) => write!(f, "an unexpected answer: {e}"),
        }
    }
}

/// The client's side of the session: our name, and what the server asks during calls
/// (`elicitation/create`): answered by the [`Elicitor`] of the call in flight that registered
/// first, declined when none did (counted, so that a call's error can say the server asked).
/// A session's requests carry no link to the call that caused them: with several calls of one
/// session in flight, the earliest one's elicitor that has not stopped to ask answers. The stateless revision's
/// `input_required` results are exact: they answer the call itself.
#[derive(Clone, Default)]
struct Handler {
    elicitations: Arc<AtomicU64>,
    elicitors: Arc<std::sync::Mutex<Vec<Registration>>>,
    next_call: Arc<AtomicU64>,
}

/// A question of the server as an elicitor reads it; `None` for what a human cannot answer
/// here (a URL to visit).
fn asked(params: &ElicitRequestParams) -> Option<Asked> {
    match params {
        ElicitRequestParams::FormElicitationParams {
            message,
            requested_schema,
            ..
        } => Some(Asked {
            message: message.clone(),
            schema: serde_json::to_value(requested_schema).unwrap_or(Value::Null),
        }),
        _ => None,
    }
}

/// A human's reply as MCP's answer: accepted content, or declined (the reason stays with us);
/// no reply (the call stops to ask) cancels.
fn elicit_result(reply: Option<Reply>) -> ElicitResult {
    match reply {
        Some(Reply::Accept(content)) => ElicitResult::new(ElicitationAction::Accept).with_content(content),
        Some(Reply::Decline(_)) => ElicitResult::new(ElicitationAction::Decline),
        None => ElicitResult::new(ElicitationAction::Cancel),
    }
}

/// A call in flight (by a number of its session) and its elicitor.
type Registration = (u64, Arc<Elicitor>);

/// A call's elicitor, registered with the session while the call is in flight.
struct Registered<'a> {
    handler: &'a Handler,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.handler
            .elicitors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(id, _)| *id != self.id);
    }
}

impl Handler {
    fn register(&self, elicitor: &Arc<Elicitor>) -> Registered<'_> {
        let id = self.next_call.fetch_add(1, Ordering::Relaxed);
        self.elicitors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, elicitor.clone()));
        Registered { handler: self, id }
    }
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        // Form elicitation: a server's question stops the run for a human (SPEC §6.4).
        capabilities.elicitation = serde_json::from_value(serde_json::json!({"form": {}})).ok();
        let mut info = ClientConfig::new(
            capabilities,
            Implementation::new("switchyard", env!("CARGO_PKG_VERSION")),
        );
        info.protocol_version = ProtocolVersion::V_2025_11_25;
        info
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.elicitations.fetch_add(1, Ordering::Relaxed);
        let first = self
            .elicitors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(_, e)| e.open().is_none())
            .map(|(_, e)| e.clone());
        match (first, asked(&request)) {
            (Some(elicitor), Some(asked)) => Ok(elicit_result(elicitor.answer(asked))),
            _ => Ok(ElicitResult::new(ElicitationAction::Decline)),
        }
    }

    async fn on_progress(
        &self,
        _params: rmcp::model::ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
    }
}

/// A connected session with one server.
pub struct Client {
    running: RunningService<RoleClient, Handler>,
}

/// The revisions offered: the stateless one first (a server that does not know
/// `server/discover` is asked again with the `initialize` handshake on the same connection), or
/// only the `initialize` handshake of 2025-11-25 (`legacy`).
fn lifecycle(legacy: bool) -> ClientLifecycleMode {
    if legacy {
        return ClientLifecycleMode::Initialize;
    }
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: Some(ProtocolVersion::V_2025_11_25),
    }
}

/// Why a start failed, in words: a transport's error as its own message and its first
/// cause (a refused connection, a broken pipe), without the SDK's type names.
fn start_error(e: &rmcp::service::ClientInitializeError) -> String {
    let rmcp::service::ClientInitializeError::TransportError { error, context } = e else {
        return e.to_string();
    };
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    let mut why = error.error.to_string();
    // The HTTP client's error is held without being named as its cause.
    let mut cause = match error.error.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
        Some(StreamableHttpError::Client(e)) => Some(e as &(dyn std::error::Error + 'static)),
        _ => std::error::Error::source(&*error.error),
    };
    let mut root = None;
    while let Some(c) = cause {
        root = Some(c.to_string());
        cause = c.source();
    }
    if let Some(root) = root.filter(|r| !why.contains(r.as_str())) {
        why = format!("{why}: {root}");
    }
    format!("{why} ({context})")
}

/// Whether a failed start is a server that knows `server/discover` but none of the
/// revisions offered there: worth a new connection with the `initialize` handshake.
pub fn wants_legacy(start_error: &str) -> bool {
    start_error.contains("no compatible protocol version")
}

impl Client {
    /// A session over a child's stdout (read) and stdin (written).
    pub async fn over_pipes<R, W>(read: R, write: W, legacy: bool) -> Result<Client, String>
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let running = Handler::default()
            .serve_with_lifecycle((read, write), lifecycle(legacy))
            .await
            .map_err(|e| start_error(&e))?;
        Ok(Client { running })
    }

    /// A session over Streamable HTTP, with these headers on every request.
    pub async fn over_http(
        http: reqwest::Client,
        url: &str,
        headers: &[(String, String)],
        legacy: bool,
    ) -> Result<Client, String> {
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        let mut custom = std::collections::HashMap::new();
        for (k, v) in headers {
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("`{k}` is not a header name"))?;
            let value = reqwest::header::HeaderValue::from_str(v)
                .map_err(|_| format!("the value of header `{k}` is not valid in a header"))?;
            custom.insert(name, value);
        }
        let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
        config.custom_headers = custom;
        let transport = StreamableHttpClientTransport::with_client(http, config);
        let running = Handler::default()
            .serve_with_lifecycle(transport, lifecycle(legacy))
            .await
            .map_err(|e| start_error(&e))?;
        Ok(Client { running })
    }

    /// The protocol revision agreed on (`2026-07-28`, `2025-11-25`, ...).
    pub fn protocol(&self) -> String {
        self.running
            .peer()
            .peer_info()
            .map(|i| i.protocol_version.to_string())
            .unwrap_or_default()
    }

    /// Whether the connection has closed (a stdio server that exited).
    pub fn is_closed(&self) -> bool {
        self.running.is_closed() || self.running.peer().is_transport_closed()
    }

    /// How many times the server asked for input (declined).
    pub fn elicitations(&self) -> u64 {
        self.running.service().elicitations.load(Ordering::Relaxed)
    }

    /// Every tool the server lists (all pages).
    pub async fn list_tools(&self, timeout: Duration) -> Result<Vec<ToolInfo>, SdkError> {
        let tools = tokio::time::timeout(timeout, self.running.peer().list_all_tools())
            .await
            .map_err(|_| SdkError::Timeout(timeout))?
            .map_err(classify)?;
        Ok(tools
            .into_iter()
            .map(|t| {
                let a = t.annotations.clone().unwrap_or_default();
                ToolInfo {
                    name: t.name.to_string(),
                    title: t.title.clone(),
                    description: t.description.as_ref().map(|d| d.to_string()),
                    input_schema: Value::Object((*t.input_schema).clone()),
                    output_schema: t.output_schema.as_ref().map(|s| Value::Object((**s).clone())),
                    annotations: Annotations {
                        read_only: a.read_only_hint,
                        destructive: a.destructive_hint,
                        idempotent: a.idempotent_hint,
                        open_world: a.open_world_hint,
                    },
                }
            })
            .collect())
    }

    /// Calls `tool` with `arguments`. `timeout` runs from the request and again from each
    /// progress notification, never past `max_time`; `cancel` gives up. Either way the
    /// request is cancelled at the server. With an `elicitor`, what the server asks during
    /// the call is answered from it; a question it has no answer for abandons the call
    /// ([`SdkError::NeedsAnswer`]).
    pub async fn call(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
        timeout: Duration,
        max_time: Option<Duration>,
        cancel: &CancellationToken,
        elicitor: Option<&Arc<Elicitor>>,
    ) -> Result<ToolResult, SdkError> {
        let _registered = elicitor.map(|e| self.running.service().register(e));
        let mut params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        // The stateless revision asks by answering `input_required`; the call is sent again
        // with the answers, a few rounds at most.
        for _ in 0..MAX_INPUT_ROUNDS {
            let r = match self
                .send_call(params.clone(), timeout, max_time, cancel, elicitor)
                .await?
            {
                Ok(result) => return Ok(result),
                Err(required) => required,
            };
            let Some(elicitor) = elicitor else {
                return Err(SdkError::InputRequired(
                    serde_json::to_value(&r.input_requests).unwrap_or(Value::Null),
                ));
            };
            let mut responses = rmcp::model::InputResponses::new();
            for (key, request) in r.input_requests.iter().flatten() {
                let rmcp::model::InputRequest::Elicitation(e) = request else {
                    return Err(SdkError::InputRequired(
                        serde_json::to_value(&r.input_requests).unwrap_or(Value::Null),
                    ));
                };
                let Some(asked) = asked(&e.params) else {
                    responses.insert(
                        key.clone(),
                        to_json(&elicit_result(Some(Reply::Decline(String::new())))),
                    );
                    continue;
                };
                match elicitor.answer(asked) {
                    Some(reply) => {
                        responses.insert(key.clone(), to_json(&elicit_result(Some(reply))));
                    }
                    None => return Err(SdkError::NeedsAnswer),
                }
            }
            params = params.with_input_responses(responses);
            if let Some(state) = r.request_state {
                params = params.with_request_state(state);
            }
        }
        Err(SdkError::Unexpected(format!(
            "the server asked for input more than {MAX_INPUT_ROUNDS} times in one call"
        )))
    }

    /// One `tools/call` request: its result, or the input the server requires first.
    async fn send_call(
        &self,
        params: CallToolRequestParams,
        timeout: Duration,
        max_time: Option<Duration>,
        cancel: &CancellationToken,
        elicitor: Option<&Arc<Elicitor>>,
    ) -> Result<Result<ToolResult, rmcp::model::InputRequiredResult>, SdkError> {
        let mut options = PeerRequestOptions::with_timeout(timeout).reset_timeout_on_progress();
        options.max_total_timeout = max_time;
        let request = ClientRequest::CallToolRequest(Request::new(params));
        let peer = self.running.peer();
        let handle = peer
            .send_request_with_option(request, options)
            .await
            .map_err(|e| SdkError::NotSent(e.to_string()))?;
        let id = handle.id.clone();
        let stopped = async {
            match elicitor {
                Some(e) => e.stopped().await,
                None => std::future::pending().await,
            }
        };
        let answer = tokio::select! {
            answer = handle.await_response() => answer,
            () = cancel.cancelled() => {
                let param = rmcp::model::CancelledNotificationParam::new(
                    Some(id),
                    Some("the run was cancelled".into()),
                );
                let _ = peer.notify_cancelled(param).await;
                return Err(SdkError::Cancelled);
            }
            () = stopped => {
                let param = rmcp::model::CancelledNotificationParam::new(
                    Some(id),
                    Some("the run stopped to ask a human".into()),
                );
                let _ = peer.notify_cancelled(param).await;
                return Err(SdkError::NeedsAnswer);
            }
        };
        match answer {
            Ok(ServerResult::CallToolResult(r)) => Ok(Ok(ToolResult {
                content: r
                    .content
                    .iter()
                    .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
                    .collect(),
                structured: r.structured_content.clone(),
                is_error: r.is_error.unwrap_or(false),
            })),
            Ok(ServerResult::InputRequiredResult(r)) => Ok(Err(r)),
            Ok(ServerResult::EmptyResult(_)) => Ok(Ok(ToolResult {
                content: Vec::new(),
                structured: None,
                is_error: false,
            })),
            Ok(other) => Err(SdkError::Unexpected(
                serde_json::to_string(&other).unwrap_or_default(),
            )),
            Err(ServiceError::Timeout { timeout }) => Err(SdkError::Timeout(timeout)),
            Err(e) => Err(classify(e)),
        }
    }

    /// Ends the session: the transport closes (a child's stdin with it), waiting at most
    /// `grace`.
    pub async fn close(mut self, grace: Duration) {
        let _ = self.running.close_with_timeout(grace).await;
    }

    /// Asks the session to end without waiting for it (another holder still has it).
    pub fn cancel(&self) {
        self.running.cancellation_token().cancel();
    }
}

fn classify(e: ServiceError) -> SdkError {
    match e {
        ServiceError::Timeout { timeout } => SdkError::Timeout(timeout),
        ServiceError::McpError(e) => SdkError::Protocol(e.message.to_string()),
        ServiceError::TransportSend(e) => SdkError::NotSent(e.to_string()),
        ServiceError::TransportClosed => SdkError::Closed("the server closed the connection".into()),
        ServiceError::Cancelled { reason } => SdkError::Closed(reason.unwrap_or_else(|| "cancelled".into())),
        other => SdkError::Unexpected(other.to_string()),
    }
}
