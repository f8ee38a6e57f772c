//! Local HTTP servers for the `llm` and `http` agent tests: real HTTP on 127.0.0.1, an
//! ephemeral port, axum.
//!
//! [`Llm`] speaks OpenAI's chat completions (`POST /v1/chat/completions`) and answers from a
//! script — correctly, slowly, with 429 + `Retry-After`, 500s, truncated JSON, prose, fenced
//! JSON, schema violations, a refusal of `response_format` json_schema as llama-cpp-python's
//! server answers it — recording every request it received (arrival time on tokio's
//! clock, headers, body, tokens) so tests can measure request and token rates. [`Service`]
//! is a small JSON service with echo, status, size and redirect routes for `http` agents.
//!
//! A server runs on the current tokio runtime ([`Llm::spawn`], for paused-time tests: the
//! server then counts in the same virtual time as the engine) or on a thread of its own
//! ([`Llm::start`], for tests that run the `switchyard` binary).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use serde_json::{Value, json};
use tokio::time::Instant;

/// What the LLM server does with one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200 with this message content.
    Answer(String),
    /// This status, an optional `Retry-After`, and a body.
    Status(u16, Option<String>, String),
    /// Waits, then answers.
    Slow(Duration, String),
    /// 200 with this exact body (not a completion).
    Raw(String),
    /// 200 whose content is the request's `Authorization` header (a leaky echo server).
    EchoAuth,
    /// 200 whose content is a JSON object of the `Authorization` header in many spellings
    /// ([`auth_spellings`]).
    EchoAuthSpelt,
    /// 200 with an assistant message that calls tools (`content: null`, `tool_calls`,
    /// `finish_reason: tool_calls`), as OpenAI's API writes it.
    Calls(Vec<Call>),
}

/// One tool call of a [`Reply::Calls`]: `arguments` is the JSON text the model wrote (it may
/// be malformed on purpose).
#[derive(Clone, Debug)]
pub struct Call {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl Reply {
    /// Calls of `(tool, arguments)` with ids `call_<turn>_<i>`.
    pub fn calls(turn: u32, calls: &[(&str, &str)]) -> Reply {
        Reply::Calls(
            calls
                .iter()
                .enumerate()
                .map(|(i, (name, args))| Call {
                    id: format!("call_{turn}_{}", i + 1),
                    name: (*name).to_owned(),
                    arguments: (*args).to_owned(),
                })
                .collect(),
        )
    }
}

/// One request the server received.
#[derive(Clone, Debug)]
pub struct Hit {
    pub at: Instant,
    pub headers: HeaderMap,
    pub body: Value,
    pub status: u16,
    /// prompt + completion tokens reported (0 for an error).
    pub tokens: u64,
}

#[derive(Default)]
pub struct LlmState {
    script: Mutex<VecDeque<Reply>>,
    default: Mutex<Option<Reply>>,
    hits: Mutex<Vec<Hit>>,
    /// Chooses the reply from the request, before the script (for concurrent conversations,
    /// whose requests arrive in no fixed order).
    responder: Mutex<Option<Responder>>,
    /// Latency of every answer.
    latency: Mutex<Duration>,
    /// The status and body answered to a request asking for `response_format` of type
    /// `json_schema`, before the script is consulted (a server that refuses that form).
    refuse_json_schema: Mutex<Option<(u16, String)>>,
    /// Requests being answered now, and the most there ever were at once.
    in_flight: Mutex<(u64, u64)>,
    /// What answers report as `usage`.
    usage: Mutex<UsageMode>,
    /// The `model` answers name, from the request's: none when `None` (as some servers).
    response_model: Mutex<Option<ModelNaming>>,
}

/// How an answer names its model (`model`) from the one the request asked for.
pub type ModelNaming = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// What a 200 answer says of its tokens.
#[derive(Clone, Copy, Debug, Default)]
pub enum UsageMode {
    /// `usage` with tokens counted from the request and the answer.
    #[default]
    Counted,
    /// No `usage` at all (a server that does not report it).
    Omitted,
    /// `usage` with these prompt and completion tokens, whatever was asked.
    Fixed(u64, u64),
}

/// What llama-cpp-python's server answers a `response_format` of type `json_schema`: a 500
/// (it turns the request's validation error into an internal error) whose body names the
/// field, in OpenAI's error shape. It takes `text`, and `json_object` with a `schema`.
pub const LLAMA_CPP_PYTHON_REFUSAL: &str = r#"{"error": {"message": "1 validation error for CreateChatCompletionRequest\nresponse_format.type\n  Input should be 'text' or 'json_object' [type=literal_error, input_value='json_schema', input_type=str]", "type": "internal_server_error", "param": null, "code": null}}"#;

/// A reply chosen from the request's body.
pub type Responder = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

/// A scripted OpenAI-compatible server.
#[derive(Clone)]
pub struct Llm {
    pub addr: SocketAddr,
    pub state: Arc<LlmState>,
    /// This server's own first path segment. The engine keeps what it learns of a provider
    /// (a structured-output form, a 429 pause) by name and base URL for the life of the
    /// process; a port reused by a later test must not inherit it.
    prefix: String,
}

/// Numbers the servers of the test process, for their path prefixes.
static SERVERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Llm {
    /// Serves on the current runtime.
    pub async fn spawn() -> Llm {
        let state = Arc::new(LlmState::default());
        let app = axum::Router::new()
            .route("/{server}/v1/chat/completions", post(completion))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        let n = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Llm {
            addr,
            state,
            prefix: format!("s{n}"),
        }
    }

    /// Serves on a thread of its own, for the life of the test process.
    pub fn start() -> Llm {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                tx.send(Llm::spawn().await).expect("send");
                std::future::pending::<()>().await;
            });
        });
        rx.recv().expect("the server starts")
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/{}/v1", self.addr, self.prefix)
    }

    /// Replies used in order, before the default.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) -> &Self {
        self.state.script.lock().unwrap().extend(replies);
        self
    }

    /// Every reply chosen by `f` from the request's body; the script is not consulted.
    pub fn respond_with(&self, f: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> &Self {
        *self.state.responder.lock().unwrap() = Some(Arc::new(f));
        self
    }

    /// The reply once the script is used up.
    pub fn default_reply(&self, r: Reply) -> &Self {
        *self.state.default.lock().unwrap() = Some(r);
        self
    }

    /// Answers `status` with `body` to every request asking for the `json_schema` form.
    pub fn refuse_json_schema(&self, status: u16, body: &str) -> &Self {
        *self.state.refuse_json_schema.lock().unwrap() = Some((status, body.to_owned()));
        self
    }

    /// What answers report as `usage` from now on.
    pub fn usage(&self, mode: UsageMode) -> &Self {
        *self.state.usage.lock().unwrap() = mode;
        self
    }

    /// Answers name their model from now on, as `f` says from the request's (OpenAI answers
    /// `gpt-4o` with `gpt-4o-2024-08-06`).
    pub fn name_model(&self, f: impl Fn(&str) -> String + Send + Sync + 'static) -> &Self {
        *self.state.response_model.lock().unwrap() = Some(Arc::new(f));
        self
    }

    pub fn latency(&self, d: Duration) -> &Self {
        *self.state.latency.lock().unwrap() = d;
        self
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.state.hits.lock().unwrap().clone()
    }

    /// How many requests the server is answering now.
    pub fn in_flight(&self) -> u64 {
        self.state.in_flight.lock().unwrap().0
    }

    /// The most requests the server was answering at once.
    pub fn max_in_flight(&self) -> u64 {
        self.state.in_flight.lock().unwrap().1
    }

    /// The most requests received in any window of `period` (starting at a request).
    pub fn max_requests_in(&self, period: Duration) -> u64 {
        max_in(&self.hits().iter().map(|h| (h.at, 1)).collect::<Vec<_>>(), period)
    }

    /// The most tokens reported in any window of `period`.
    pub fn max_tokens_in(&self, period: Duration) -> u64 {
        max_in(
            &self.hits().iter().map(|h| (h.at, h.tokens)).collect::<Vec<_>>(),
            period,
        )
    }
}

fn max_in(events: &[(Instant, u64)], period: Duration) -> u64 {
    let mut events = events.to_vec();
    events.sort_by_key(|e| e.0);
    let mut best = 0;
    for (i, &(t0, _)) in events.iter().enumerate() {
        let sum: u64 = events[i..]
            .iter()
            .take_while(|(t, _)| *t < t0 + period)
            .map(|(_, n)| n)
            .sum();
        best = best.max(sum);
    }
    best
}

/// Tokens as the server counts them: a token per 4 bytes of the request's messages.
fn prompt_tokens(body: &Value) -> u64 {
    (body["messages"].to_string().len() as u64).div_ceil(4)
}

/// Each request is answered by a task of its own, which finishes (and records its hit, its
/// tokens counted) even when the client has given up on it: a real server bills those too.
async fn completion(State(s): State<Arc<LlmState>>, headers: HeaderMap, body: Bytes) -> Response {
    tokio::spawn(answer_request(s, headers, body))
        .await
        .expect("the answering task")
}

async fn answer_request(s: Arc<LlmState>, headers: HeaderMap, body: Bytes) -> Response {
    let at = Instant::now();
    {
        let mut f = s.in_flight.lock().unwrap();
        f.0 += 1;
        f.1 = f.1.max(f.0);
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let refusal = s.refuse_json_schema.lock().unwrap().clone();
    let reply = match refusal {
        Some((code, text)) if body["response_format"]["type"] == "json_schema" => {
            Reply::Status(code, None, text)
        }
        _ if s.responder.lock().unwrap().is_some() => {
            let f = s.responder.lock().unwrap().clone().expect("a responder");
            f(&body)
        }
        _ => {
            let next = s.script.lock().unwrap().pop_front();
            next.or_else(|| s.default.lock().unwrap().clone())
                .unwrap_or_else(|| Reply::Answer("{}".into()))
        }
    };
    let latency = *s.latency.lock().unwrap();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let mode = *s.usage.lock().unwrap();
    let naming = s.response_model.lock().unwrap().clone();
    // The tokens of an answer as `mode` reports them, and the model as `naming` names it,
    // written into `resp`.
    let report = |resp: &mut Value, prompt: u64, completion: u64| {
        if let Some(f) = &naming {
            resp["model"] = Value::String(f(body["model"].as_str().unwrap_or("")));
        }
        let (prompt, completion) = match mode {
            UsageMode::Counted => (prompt, completion),
            UsageMode::Fixed(p, c) => (p, c),
            UsageMode::Omitted => return 0,
        };
        resp["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
        prompt + completion
    };
    let answer = |content: String| {
        let prompt = prompt_tokens(&body);
        let completion = (content.len() as u64).div_ceil(4).max(1);
        let mut resp = json!({
            "id": "chatcmpl-test", "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        });
        let tokens = report(&mut resp, prompt, completion);
        (tokens, axum::Json(resp).into_response())
    };
    let (status, tokens, resp) = match reply {
        Reply::Answer(c) => {
            let (t, r) = answer(c);
            (200, t, r)
        }
        Reply::Slow(d, c) => {
            tokio::time::sleep(d).await;
            let (t, r) = answer(c);
            (200, t, r)
        }
        Reply::EchoAuth => {
            let auth = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let (t, r) = answer(format!("{{\"echo\": \"{auth}\"}}"));
            (200, t, r)
        }
        Reply::EchoAuthSpelt => {
            let auth = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let (t, r) = answer(auth_spellings(auth).to_string());
            (200, t, r)
        }
        Reply::Calls(calls) => {
            let prompt = prompt_tokens(&body);
            let written: Vec<Value> = calls
                .iter()
                .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                .collect();
            let completion = (Value::Array(written.clone()).to_string().len() as u64).div_ceil(4);
            let mut resp = json!({
                "id": "chatcmpl-test", "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": written}, "finish_reason": "tool_calls"}],
            });
            let tokens = report(&mut resp, prompt, completion);
            (200, tokens, axum::Json(resp).into_response())
        }
        Reply::Raw(text) => (
            200,
            0,
            ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        ),
        Reply::Status(code, retry_after, text) => {
            let code = StatusCode::from_u16(code).expect("a status");
            let mut r = (code, text).into_response();
            if let Some(ra) = retry_after {
                r.headers_mut()
                    .insert(header::RETRY_AFTER, ra.parse().expect("a header value"));
            }
            (code.as_u16(), 0, r)
        }
    };
    s.hits.lock().unwrap().push(Hit {
        at,
        headers,
        body,
        status,
        tokens,
    });
    s.in_flight.lock().unwrap().0 -= 1;
    resp
}

/// A completion's message content for a classification.
pub fn classification(category: &str, confidence: f64) -> String {
    json!({"category": category, "confidence": confidence}).to_string()
}

// ---------------------------------------------------------------- a JSON service

/// What the service received on one request.
#[derive(Clone, Debug)]
pub struct ServiceHit {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

#[derive(Default)]
pub struct ServiceState {
    hits: Mutex<Vec<ServiceHit>>,
}

/// Routes: `/echo` (the request back as JSON), `/status/{code}` (that status; 429 with
/// `Retry-After: 1`), `/big/{bytes}` (a JSON string of that size), `/redirect/{n}` (`n`
/// redirects, the last to `/echo`), `/away` (a redirect to the same server named `localhost`),
/// `/text` (200 with a `text/plain` body), `/bad-json` (200 with a body that is not JSON,
/// labelled JSON), `/slow/{ms}` (answers after that long).
#[derive(Clone)]
pub struct Service {
    pub addr: SocketAddr,
    pub state: Arc<ServiceState>,
}

impl Service {
    /// Serves on a thread of its own.
    pub fn start() -> Service {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let state = Arc::new(ServiceState::default());
                let app = axum::Router::new()
                    .route("/{*rest}", any(service))
                    .with_state(state.clone());
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
                let addr = listener.local_addr().expect("local addr");
                tx.send(Service { addr, state }).expect("send");
                axum::serve(listener, app).await.expect("serve");
            });
        });
        rx.recv().expect("the service starts")
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn hits(&self) -> Vec<ServiceHit> {
        self.state.hits.lock().unwrap().clone()
    }

    pub fn hits_on(&self, path: &str) -> usize {
        self.hits().iter().filter(|h| h.path == path).count()
    }
}

async fn service(
    State(s): State<Arc<ServiceState>>,
    Path(rest): Path<String>,
    method: axum::http::Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/{rest}");
    s.hits.lock().unwrap().push(ServiceHit {
        method: method.to_string(),
        path: path.clone(),
        headers: headers.clone(),
        body: body.to_vec(),
    });
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        ["echo"] => {
            let h = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            axum::Json(json!({
                "method": method.to_string(),
                "body": body,
                "idempotency_key": h("idempotency-key"),
                "run": h("x-switchyard-run"),
                "step": h("x-switchyard-step"),
                "attempt": h("x-switchyard-attempt"),
                "api_key": h("x-api-key").map(|k| k.len()),
                "tenant": h("x-tenant"),
            }))
            .into_response()
        }
        ["echo-auth"] => {
            let auth = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            axum::Json(auth_spellings(auth)).into_response()
        }
        ["status", code] => {
            let code: u16 = code.parse().unwrap_or(500);
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut r = (status, format!("status {code}: the service says no")).into_response();
            if code == 429 {
                r.headers_mut().insert(header::RETRY_AFTER, "1".parse().unwrap());
            }
            r
        }
        ["big", n] => {
            let n: usize = n.parse().unwrap_or(0);
            axum::Json(Value::String("x".repeat(n))).into_response()
        }
        ["redirect", n] => {
            let n: u32 = n.parse().unwrap_or(1);
            let to = if n <= 1 {
                "/echo".to_owned()
            } else {
                format!("/redirect/{}", n - 1)
            };
            (StatusCode::FOUND, [(header::LOCATION, to)]).into_response()
        }
        ["away"] => {
            let port = host.rsplit(':').next().unwrap_or("80");
            let to = format!("http://localhost:{port}/echo");
            (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, to)]).into_response()
        }
        ["text"] => "<html>not json</html>".into_response(),
        ["bad-json"] => (
            [(header::CONTENT_TYPE, "application/json")],
            "<html>not json</html>",
        )
            .into_response(),
        ["slow", ms] => {
            tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
            axum::Json(json!({"slow": true})).into_response()
        }
        _ => (StatusCode::NOT_FOUND, "no such route").into_response(),
    }
}

/// A header value as leaky servers echo it: as it is, base64 of the whole value (standard,
/// URL-safe without padding), base64 of `Authorization: <value>` and of `user:<key>` (Basic
/// auth), fully percent-encoded in lower case, as Python's `quote` writes it (`/` kept), JSON
/// text inside a string (`/` as `\/`), and every character as a `\uXXXX` escape.
pub fn auth_spellings(auth: &str) -> Value {
    let key = auth.strip_prefix("Bearer ").unwrap_or(auth);
    let percent = |keep: &[u8], upper: bool| -> String {
        auth.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
                    char::from(b).to_string()
                } else if upper {
                    format!("%{b:02X}")
                } else {
                    format!("%{b:02x}")
                }
            })
            .collect()
    };
    let escaped: String = auth.chars().map(|c| format!("\\u{:04x}", u32::from(c))).collect();
    json!({
        "raw": auth,
        "base64": base64(auth.as_bytes(), false),
        "base64url": base64(auth.as_bytes(), true).trim_end_matches('='),
        "base64_header": base64(format!("Authorization: {auth}").as_bytes(), false),
        "basic": base64(format!("user:{key}").as_bytes(), false),
        "percent": percent(b"", false),
        "quote": percent(b"/", true),
        "json_text": format!("{{\"auth\":\"{}\"}}", auth.replace('/', "\\/")),
        "unicode": escaped,
    })
}

/// Base64 in the standard alphabet with padding, or the URL-safe one.
pub fn base64(bytes: &[u8], url_safe: bool) -> String {
    let alphabet: &[u8] = if url_safe {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    } else {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    };
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                char::from(alphabet[(n >> (18 - 6 * i)) as usize & 63])
            } else {
                '='
            });
        }
    }
    out
}
