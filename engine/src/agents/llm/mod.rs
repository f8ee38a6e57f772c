//! The `llm` agent (SPEC §6.1, §6.2): one chat completion on an OpenAI-compatible endpoint
//! (`POST {base_url}/chat/completions`), the protocol of OpenAI, vLLM, llama.cpp's server,
//! Ollama, LiteLLM and most gateways.
//!
//! The request's messages are, in order: the rendered `system` template; the run's
//! conversation as `message_mode` selects it ([`select_messages`]); a context message with
//! the `context_paths` values (read from the payload by the engine); and the task — the
//! rendered `prompt`, or, without one, the step's message and the input document as JSON —
//! with the files of `attach:` as parts after its text ([`attach`]).
//!
//! With `result_schema` the request asks for structured output in the provider's
//! `structured_output` form: `json_schema` (`response_format` of that type, the default),
//! `json_object` (OpenAI's JSON mode, with the `schema` llama-cpp-python's server reads) or
//! `prompt` (no `response_format`); with the last two the schema is also in the system
//! message. A server that refuses `json_schema` (a 400, 422 or 500 naming `response_format`)
//! is asked once more with `json_object`, and its provider remembers that form. The answer
//! is parsed ([`parse_answer`]: a fenced code block is accepted
//! and noted) and validated; an answer that is not JSON or violates the schema is shown to the
//! model with the error, up to `repair_attempts` times, before the call fails with kind
//! `invalid_output` naming the JSON pointer. Without a schema the result is `{"text": ...}`.
//!
//! `SWITCHYARD_PROVIDER_<NAME>_BASE_URL` and `SWITCHYARD_PROVIDER_<NAME>_MODEL`
//! ([`provider_override`]) replace a provider's `base_url` and its agents' `model` for this
//! process: one variable points a flow at a local model server.
//!
//! Transport: every request first takes its place at the provider ([`ProviderState::admit`]:
//! `max_concurrency` and rate limits shared by the whole process). A 429 or a 5xx is retried
//! here, honouring `Retry-After` (at least 0.5s; a 429 pauses the whole provider), with
//! exponential backoff otherwise, until [`RETRY_DEADLINE`] after the call's first request; a
//! 429 still there then fails with kind `rate_limited`, a 5xx with kind `agent`. Errors that
//! asking again cannot mend fail at once: 4xx, 501 and 505, and a 5xx that says the request is
//! invalid and says it again on the next try. A request that takes longer than the step's
//! `timeout` (or the provider's, if shorter) fails with kind `timeout`: the `timeout` bounds
//! each request, never the wait for the provider's capacity. Such a request is abandoned
//! while the server may still finish (and bill) it: its tokens are unknown, and the call's
//! [`Notes`] and the provider count it, so that the cost shown can say it is a lower bound.
//! Tokens and cost (from `prices`) of every request, repairs included, are the call's
//! [`Usage`].

use std::time::{Duration, SystemTime};

use serde_json::{Map, Value, json};

mod answer;
mod attach;
mod conversation;
mod tools;

use answer::Problem;
pub use answer::{Answer, ToolCall, kept_within, parse_answer, parse_completion};
pub use conversation::{check_conversation, select_messages};
pub use tools::{Turn, TurnResult, final_answer};

use super::CallContext;
use super::net::{self, Hosts, ReadError, Secrets};
use super::provider::{self, ProviderState, Providers};
use super::transform::agent_vars;
use crate::expr::eval;
use crate::model::StructuredOutput;
use crate::plan::{LlmPlan, Schema};
use crate::record::Usage;
use crate::record::{ErrorKind, StepError};

/// How long 429s and 5xx are retried after a call's first request.
pub const RETRY_DEADLINE: Duration = Duration::from_secs(120);
/// The first backoff without `Retry-After`; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Requests that fail to connect (or lose the connection) are tried at most this often.
const CONNECT_TRIES: u32 = 3;
/// The largest response body read from a provider.
const MAX_RESPONSE: u64 = 16 << 20;
/// Completion tokens reserved against `tokens_per_minute` when `max_tokens` is not set.
const COMPLETION_ESTIMATE: u64 = 256;

/// One `llm` agent call's view of the world.
pub struct LlmAgent<'a> {
    /// Set when the call has something to put on the step's record ([`Notes`]): the
    /// structured-output form it used, the answers that needed repairs, requests abandoned.
    pub notes: &'a std::sync::Mutex<Option<Value>>,
    pub name: &'a str,
    pub plan: &'a LlmPlan,
    pub schema: Option<&'a Schema>,
    /// The run's whole conversation (`--messages`); `message_mode` picks from it.
    pub conversation: &'a [Value],
    /// The `context_paths` and their values in the payload, in the order written.
    pub context: Vec<(String, Value)>,
    pub hosts: Hosts<'a>,
    pub providers: &'a Providers,
}

/// A call's result or error, with the tokens and cost it used either way.
pub type LlmResult = Result<(Value, Usage), (StepError, Usage)>;

impl LlmAgent<'_> {
    pub async fn call(&self, input: &Value, cx: CallContext<'_>) -> LlmResult {
        let mut secrets = Secrets::default();
        let mut usage = Usage::default();
        let mut notes = Notes::default();
        let out = self
            .call_inner(input, &cx, &mut secrets, &mut usage, &mut notes)
            .await;
        if let Some(mut v) = notes.into_value() {
            secrets.redact_value(&mut v);
            *self.notes.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
        }
        match out {
            Ok(mut v) => {
                secrets.redact_value(&mut v);
                Ok((v, usage))
            }
            Err(e) => Err((secrets.redact_error(e), usage)),
        }
    }

    async fn call_inner(
        &self,
        input: &Value,
        cx: &CallContext<'_>,
        secrets: &mut Secrets,
        usage: &mut Usage,
        notes: &mut Notes,
    ) -> Result<Value, StepError> {
        let p = &self.plan.provider;
        let who = format!("agent `{}`", self.name);
        let (url, model, headers) = self.endpoint(secrets)?;
        let mut messages = self.messages(input, cx)?;
        attach::append(&mut messages, attach::parts(self.plan, &who, input, cx).await?);
        let state = self.providers.get(p);
        let repairs = self.plan.repair_attempts;
        // The form asked for: the provider's, else what an earlier call found it needs, else
        // `json_schema`, which a server may refuse once (then `json_object`, remembered).
        let mut form = self.schema.map(|_| {
            p.structured_output
                .or_else(|| state.learned_form())
                .unwrap_or(StructuredOutput::JsonSchema)
        });
        let may_fall_back = p.structured_output.is_none();
        // The answers that could not be used and what the model was told of each, kept for
        // the step's record should the call fail.
        let mut exchange: Vec<Value> = Vec::new();
        for round in 0..=repairs {
            let answer = loop {
                let body = serde_json::to_vec(&self.request_body(&model, &messages, self.schema, form))
                    .expect("JSON values serialize");
                let fallback = may_fall_back && form == Some(StructuredOutput::JsonSchema);
                let sent = (&url, model.as_str(), &headers);
                match self
                    .request(&state, sent, body, cx, secrets, usage, notes, fallback)
                    .await
                {
                    Ok(a) => break a,
                    Err(RequestError::Step(e)) => {
                        notes.form = form;
                        return Err(e);
                    }
                    Err(RequestError::FormRefused { status, message }) => {
                        form = Some(self.form_refused(&state, cx, secrets, status, message, notes));
                    }
                }
            };
            notes.form = form;
            let Some(schema) = self.schema else {
                return Ok(json!({"text": answer.content}));
            };
            let problem = match parse_answer(&answer.content) {
                Ok((value, fenced)) => {
                    if fenced {
                        tracing::info!(
                            run_id = cx.run_id,
                            step = cx.step,
                            agent = self.name,
                            "the answer was in a fenced code block; its content was used"
                        );
                    }
                    match schema.check(&value) {
                        Ok(()) => {
                            notes.repairs = std::mem::take(&mut exchange);
                            return Ok(value);
                        }
                        Err(v) => Problem::Schema(v),
                    }
                }
                Err(e) => Problem::Json(e),
            };
            let requests = round + 1;
            if round == repairs {
                return Err(problem.into_error(&who, requests, &answer, exchange));
            }
            tracing::info!(
                run_id = cx.run_id, step = cx.step, agent = self.name, round = requests,
                problem = %secrets.redact(&problem.describe(&answer)), "asking the model to repair its answer"
            );
            let request = problem.repair_request(&answer);
            exchange.push(json!({"answer": answer::kept(&answer.content), "repair_request": request}));
            messages.push(json!({"role": "assistant", "content": answer.content}));
            messages.push(json!({"role": "user", "content": request}));
        }
        unreachable!("the last round returns")
    }

    /// Where and how requests go: the URL of `chat/completions`, the model, and the headers
    /// with the provider's secrets resolved (and remembered in `secrets` for redaction).
    fn endpoint(
        &self,
        secrets: &mut Secrets,
    ) -> Result<(reqwest::Url, String, reqwest::header::HeaderMap), StepError> {
        let p = &self.plan.provider;
        let who = format!("agent `{}`", self.name);
        let base_url = provider_override(&p.name, "BASE_URL").unwrap_or_else(|| p.base_url.clone());
        let model = provider_override(&p.name, "MODEL").unwrap_or_else(|| self.plan.model.clone());
        if base_url.contains("${env:") {
            return Err(StepError::new(
                ErrorKind::Agent,
                format!(
                    "{who}: the `base_url` of provider `{}` holds a secret reference; secrets are for \
                     credentials: write the URL, and set {} to point the provider elsewhere",
                    p.name,
                    provider_var(&p.name, "BASE_URL")
                ),
            ));
        }
        let base = base_url.trim_end_matches('/');
        let url: reqwest::Url = format!("{base}/chat/completions").parse().map_err(|e| {
            StepError::new(
                ErrorKind::Agent,
                format!(
                    "{who}: provider `{}` has an invalid `base_url` `{base}`: {e}",
                    p.name
                ),
            )
        })?;
        self.hosts.check(&url, &who)?;
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(key) = &p.api_key {
            // Resolved as the header it becomes, so the header value as sent is remembered
            // for redaction as well as the key.
            let auth = secrets.resolve(
                &format!("Bearer {key}"),
                &format!("the `api_key` of provider `{}`", p.name),
            )?;
            headers.insert(reqwest::header::AUTHORIZATION, header_value(&auth)?);
        }
        for (k, v) in &p.headers {
            let v = secrets.resolve(v, &format!("header `{k}` of provider `{}`", p.name))?;
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
                StepError::new(
                    ErrorKind::Agent,
                    format!("provider `{}`: invalid header name `{k}`", p.name),
                )
            })?;
            headers.insert(name, header_value(&v)?);
        }

        Ok((url, model, headers))
    }

    /// System, conversation, context, task.
    fn messages(&self, input: &Value, cx: &CallContext<'_>) -> Result<Vec<Value>, StepError> {
        let message = cx.message.map(|m| Value::String(m.to_owned()));
        let vars = agent_vars(input, message.as_ref(), cx);
        let render = |t, what: &str| {
            eval::render(t, &vars).map_err(|e| StepError {
                message: format!("agent `{}`: `{what}`: {}", self.name, e.message),
                ..e
            })
        };
        let mut out = Vec::new();
        if let Some(t) = &self.plan.system {
            out.push(json!({"role": "system", "content": render(t, "system")?}));
        }
        out.extend(select_messages(
            self.conversation,
            self.plan.message_mode,
            self.plan.max_messages,
        ));
        if !self.context.is_empty() {
            let mut text = String::from("Context:");
            for (path, value) in &self.context {
                text.push('\n');
                text.push_str(path);
                text.push_str(" = ");
                text.push_str(&serde_json::to_string(value).expect("JSON values serialize"));
            }
            out.push(json!({"role": "user", "content": text}));
        }
        let task = match &self.plan.prompt {
            Some(t) => render(t, "prompt")?,
            None => {
                let doc = serde_json::to_string_pretty(input).expect("JSON values serialize");
                match cx.message {
                    Some(m) => format!("{m}\n\nInput:\n{doc}"),
                    None => doc,
                }
            }
        };
        out.push(json!({"role": "user", "content": task}));
        Ok(out)
    }

    /// The request: `form` says how `schema` (the `result_schema`) is asked for (`None`: no
    /// schema).
    fn request_body(
        &self,
        model: &str,
        messages: &[Value],
        schema: Option<&Schema>,
        form: Option<StructuredOutput>,
    ) -> Value {
        let mut messages = messages.to_vec();
        if let Some(schema) = schema
            && matches!(
                form,
                Some(StructuredOutput::JsonObject | StructuredOutput::Prompt)
            )
        {
            ask_schema(&mut messages, &schema.value);
        }
        let mut body = Map::new();
        body.insert("model".into(), Value::String(model.to_owned()));
        body.insert("messages".into(), Value::Array(messages));
        if let Some(t) = self.plan.temperature {
            body.insert("temperature".into(), json!(t));
        }
        if let Some(n) = self.plan.max_tokens {
            body.insert("max_tokens".into(), json!(n));
        }
        if let Some(schema) = schema {
            match form {
                Some(StructuredOutput::JsonSchema) | None => {
                    body.insert(
                        "response_format".into(),
                        json!({"type": "json_schema", "json_schema": {"name": schema_name(self.name), "schema": schema.value}}),
                    );
                }
                // OpenAI's JSON mode is `{type: json_object}`; llama-cpp-python's server
                // reads a `schema` beside it and constrains the answer to it.
                Some(StructuredOutput::JsonObject) => {
                    body.insert(
                        "response_format".into(),
                        json!({"type": "json_object", "schema": schema.value}),
                    );
                }
                Some(StructuredOutput::Prompt) => {}
            }
        }
        body.insert("stream".into(), Value::Bool(false));
        Value::Object(body)
    }

    /// The server refused `response_format` json_schema: says so, notes it for the step's
    /// record and remembers for the provider that it takes `json_object`, the form asked with
    /// from now on (returned).
    fn form_refused(
        &self,
        state: &ProviderState,
        cx: &CallContext<'_>,
        secrets: &Secrets,
        status: u16,
        message: String,
        notes: &mut Notes,
    ) -> StructuredOutput {
        tracing::warn!(
            run_id = cx.run_id, step = cx.step, agent = self.name, provider = %self.plan.provider.name,
            status, message = %secrets.redact(&message),
            "the server refused `response_format` json_schema; asking with json_object from now on"
        );
        notes.refused = Some(json!({
            "form": StructuredOutput::JsonSchema.as_str(),
            "status": status,
            "message": message,
        }));
        state.learn_form(StructuredOutput::JsonObject);
        StructuredOutput::JsonObject
    }

    /// One completion, with the provider's limits and the retries of 429s and 5xx. Messages
    /// it logs are redacted here; the error it returns is redacted by [`LlmAgent::call`].
    /// With `fallback`, a refusal of the `json_schema` form ([`refuses_form`]) is returned as
    /// [`RequestError::FormRefused`] at once, for the caller to ask in another form.
    #[allow(clippy::too_many_arguments)]
    async fn request(
        &self,
        state: &ProviderState,
        (url, model, headers): (&reqwest::Url, &str, &reqwest::header::HeaderMap),
        body: Vec<u8>,
        cx: &CallContext<'_>,
        secrets: &Secrets,
        usage: &mut Usage,
        notes: &mut Notes,
        fallback: bool,
    ) -> Result<Answer, RequestError> {
        let p = &self.plan.provider;
        let who = format!("agent `{}`: provider `{}`", self.name, p.name);
        let client = net::client()?;
        if notes.model.as_deref() != Some(model) {
            notes.model = Some(model.to_owned());
        }
        let estimate = (body.len() as u64).div_ceil(3) + self.plan.max_tokens.unwrap_or(COMPLETION_ESTIMATE);
        let timeout = p.timeout.map_or(cx.timeout, |t| t.min(cx.timeout));
        let started = tokio::time::Instant::now();
        let mut tries = 0u32;
        let mut connect_failures = 0u32;
        // The body of the last 5xx, to tell a server that keeps rejecting the request itself
        // from one that is failing for a while.
        let mut last_server_error: Option<Vec<u8>> = None;
        loop {
            tries += 1;
            // Set once the request has its place: from then on the server may be working on it.
            let admitted = std::sync::atomic::AtomicBool::new(false);
            let sent = async {
                let admission = state.admit(estimate).await;
                admitted.store(true, std::sync::atomic::Ordering::Relaxed);
                let req = client
                    .post(url.clone())
                    .headers(headers.clone())
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .header(reqwest::header::ACCEPT, "application/json")
                    .body(body.clone());
                let exchange = async {
                    let mut resp = req.send().await.map_err(Failure::Transport)?;
                    let status = resp.status();
                    let retry_after = net::retry_after(resp.headers(), SystemTime::now());
                    let bytes = net::read_capped(&mut resp, MAX_RESPONSE)
                        .await
                        .map_err(|e| match e {
                            ReadError::TooLarge => Failure::TooLarge,
                            ReadError::Transport(e) => Failure::Transport(e),
                        })?;
                    Ok::<_, Failure>((status, retry_after, bytes))
                };
                let r = match tokio::time::timeout(timeout, exchange).await {
                    Ok(r) => r,
                    Err(_) => Err(Failure::Timeout),
                };
                (r, admission)
            };
            let (result, admission) = tokio::select! {
                biased;
                _ = cx.cancel.cancelled() => {
                    if admitted.load(std::sync::atomic::Ordering::Relaxed) {
                        // Sent, perhaps: the server may finish it and bill its tokens.
                        state.abandon();
                        notes.abandoned += 1;
                    }
                    return Err(StepError::new(ErrorKind::Cancelled, format!("{who}: call cancelled")).into());
                }
                r = sent => r,
            };
            let failure = match result {
                Ok((status, _, bytes)) if status.is_success() => {
                    let answer = parse_completion(&bytes).map_err(|m| {
                        state.settle(&admission, Some(0));
                        StepError::new(ErrorKind::Agent, format!("{who}: {m}"))
                    })?;
                    let used = provider::response_usage(p, model, answer.input_tokens, answer.output_tokens);
                    let reported = answer.input_tokens.zip(answer.output_tokens).map(|(i, o)| i + o);
                    state.settle(&admission, reported);
                    state.count(used);
                    usage.add(used);
                    if answer.model.is_some() {
                        notes.response_model.clone_from(&answer.model);
                    }
                    return Ok(answer);
                }
                Ok((status, retry_after, bytes)) => {
                    state.settle(&admission, Some(0));
                    let code = status.as_u16();
                    if fallback && refuses_form(code, &bytes) {
                        return Err(RequestError::FormRefused {
                            status: code,
                            message: server_message(&bytes),
                        });
                    }
                    if matches!(code, 501 | 505) {
                        // Not Implemented, HTTP Version Not Supported: asking again cannot help
                        // (a `base_url` that is a static file server answers 501 to a POST).
                        return Err(permanent(
                            format!(
                                "{who} answered {status}: {} — not retried: the server does not \
                                 implement this request (is `base_url` an OpenAI-compatible endpoint?)",
                                net::body_head(&bytes)
                            ),
                            code,
                        ));
                    }
                    if status.is_server_error() {
                        if last_server_error.as_deref() == Some(&bytes[..]) && is_invalid_request(&bytes) {
                            return Err(permanent(
                                format!(
                                    "{who} answered {status} twice with the same error, which says the \
                                     request itself is invalid (not retried): {}",
                                    server_message(&bytes)
                                ),
                                code,
                            ));
                        }
                        last_server_error = Some(bytes.clone());
                    }
                    if code == 429 || status.is_server_error() {
                        Retry {
                            kind: if code == 429 {
                                ErrorKind::RateLimited
                            } else {
                                ErrorKind::Agent
                            },
                            what: format!("answered {status}: {}", net::body_head(&bytes)),
                            retry_after,
                            rate_limited: code == 429,
                        }
                    } else {
                        return Err(permanent(
                            format!("{who} answered {status}: {}", net::body_head(&bytes)),
                            code,
                        ));
                    }
                }
                Err(Failure::Timeout) => {
                    // The server may still finish the request and bill it: its tokens are
                    // unknown, and what the call is counted to cost is a lower bound.
                    state.settle(&admission, None);
                    state.abandon();
                    notes.abandoned += 1;
                    return Err(StepError::new(
                        ErrorKind::Timeout,
                        format!(
                            "{who} did not answer within {}; the request was abandoned, its tokens unknown",
                            fmt_secs(timeout)
                        ),
                    )
                    .with_details(json!({"tokens_unknown": true}))
                    .into());
                }
                Err(Failure::TooLarge) => {
                    state.settle(&admission, None);
                    return Err(StepError::new(
                        ErrorKind::Agent,
                        format!("{who}: the response is larger than {} MiB", MAX_RESPONSE >> 20),
                    )
                    .into());
                }
                Err(Failure::Transport(e)) => {
                    state.settle(&admission, Some(0));
                    connect_failures += 1;
                    let what = format!("{} ({})", net::transport_error(&e), net::url_for_messages(url));
                    if connect_failures >= CONNECT_TRIES {
                        return Err(StepError::new(ErrorKind::Agent, format!("{who}: {what}")).into());
                    }
                    Retry {
                        kind: ErrorKind::Agent,
                        what,
                        retry_after: None,
                        rate_limited: false,
                    }
                }
            };
            drop(admission);
            // `Retry-After` is honoured, but never below the first backoff: a server that
            // keeps answering `Retry-After: 0` is not asked again at once, forever.
            let wait = failure
                .retry_after
                .map_or_else(|| backoff(tries), |ra| ra.max(FIRST_BACKOFF));
            let elapsed = started.elapsed();
            if elapsed + wait > RETRY_DEADLINE {
                return Err(StepError::new(
                    failure.kind,
                    format!(
                        "{who} {} — gave up after {tries} tries in {} (retries stop {} after the first request)",
                        failure.what,
                        fmt_secs(elapsed),
                        fmt_secs(RETRY_DEADLINE)
                    ),
                )
                .into());
            }
            tracing::info!(
                run_id = cx.run_id, step = cx.step, agent = self.name, tries,
                wait_ms = wait.as_millis() as u64, problem = %secrets.redact(&failure.what), "retrying the provider"
            );
            if failure.rate_limited {
                // Everyone waits: the next admission is after the pause.
                state.pause_for(wait);
            } else {
                tokio::select! {
                    biased;
                    _ = cx.cancel.cancelled() => {
                        return Err(StepError::new(ErrorKind::Cancelled, format!("{who}: call cancelled")).into());
                    }
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

/// `SWITCHYARD_PROVIDER_<NAME>_<FIELD>` from the environment, if set and not empty: `NAME` is
/// the provider's name upper-cased with every other character than letters and digits as
/// `_` (`local` → `SWITCHYARD_PROVIDER_LOCAL_BASE_URL`). `BASE_URL` and `MODEL` point a flow
/// at another server (a local llama-server or Ollama) without editing it.
pub fn provider_override(provider: &str, field: &str) -> Option<String> {
    std::env::var(provider_var(provider, field))
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// The name of a provider override variable: `SWITCHYARD_PROVIDER_LOCAL_BASE_URL`.
pub fn provider_var(provider: &str, field: &str) -> String {
    let name: String = provider
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("SWITCHYARD_PROVIDER_{name}_{field}")
}

/// Why a request gave no answer.
enum RequestError {
    /// The call fails with this.
    Step(StepError),
    /// The server refused the `json_schema` form of `response_format` (status, its message).
    FormRefused { status: u16, message: String },
}

impl From<StepError> for RequestError {
    fn from(e: StepError) -> Self {
        RequestError::Step(e)
    }
}

/// What an `llm` call puts on its step's record (`StepRecord::answers`), as one JSON object:
/// `model` (the model its requests asked for) and `response_model` (the one the last
/// response that named one named), which OpenTelemetry's `chat` spans read (SPEC §13);
/// `structured_output` (the form used), `refused` (the form the server refused in this call,
/// with its status and message), `repairs` (of a call that succeeded after repairs: each
/// answer that could not be used and the repair request that followed it) and
/// `abandoned_requests` (requests given up on, past their timeout or cancelled, whose tokens
/// are unknown). Only what happened is written; a call that sent no request writes nothing.
#[derive(Default)]
struct Notes {
    model: Option<String>,
    response_model: Option<String>,
    form: Option<StructuredOutput>,
    refused: Option<Value>,
    repairs: Vec<Value>,
    abandoned: u64,
}

impl Notes {
    fn into_value(self) -> Option<Value> {
        let mut m = Map::new();
        if let Some(model) = self.model {
            m.insert("model".into(), Value::String(model));
        }
        if let Some(model) = self.response_model {
            m.insert("response_model".into(), Value::String(model));
        }
        if let Some(f) = self.form {
            m.insert("structured_output".into(), Value::String(f.as_str().into()));
        }
        if let Some(r) = self.refused {
            m.insert("refused".into(), r);
        }
        if !self.repairs.is_empty() {
            m.insert("repairs".into(), Value::Array(self.repairs));
        }
        if self.abandoned > 0 {
            m.insert("abandoned_requests".into(), json!(self.abandoned));
        }
        (!m.is_empty()).then_some(Value::Object(m))
    }
}

/// Adds what a later attempt of the same step put on its record to what earlier ones did:
/// `abandoned_requests` add up; the rest is the later attempt's (its form, its repairs), and
/// a `refused` form stays known.
pub fn merge_notes(into: &mut Value, later: Value) {
    let Value::Object(later) = later else { return };
    let Value::Object(earlier) = into else {
        *into = Value::Object(later);
        return;
    };
    let abandoned = |m: &Map<String, Value>| m.get("abandoned_requests").and_then(Value::as_u64).unwrap_or(0);
    let total = abandoned(earlier) + abandoned(&later);
    earlier.remove("repairs");
    for (k, v) in later {
        earlier.insert(k, v);
    }
    if total > 0 {
        earlier.insert("abandoned_requests".into(), json!(total));
    }
}

/// The error of a status that asking again cannot help with.
fn permanent(message: String, status: u16) -> RequestError {
    StepError::new(ErrorKind::Agent, message)
        .with_details(json!({"status": status, "retryable": false}))
        .into()
}

/// Whether a response refuses the request's `response_format`: a 400, 422 or 500 whose body
/// names it (llama-cpp-python's server answers 500 to `json_schema`; others 400 or 422).
fn refuses_form(status: u16, body: &[u8]) -> bool {
    matches!(status, 400 | 422 | 500) && body.windows(15).any(|w| w == b"response_format")
}

/// The server's own message in an error body: `error.message` (OpenAI's shape), `error`,
/// `message` or `detail` (FastAPI's) when the body is JSON that has one; else the body's start.
fn server_message(body: &[u8]) -> String {
    let v: Option<Value> = serde_json::from_slice(body).ok();
    let text = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    };
    let found = v.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .and_then(text)
            .or_else(|| v.get("error").filter(|e| e.is_string()).and_then(text))
            .or_else(|| v.get("message").and_then(text))
            .or_else(|| v.get("detail").and_then(text))
    });
    match found {
        Some(m) => net::body_head(m.as_bytes()),
        None => net::body_head(body),
    }
}

/// Whether a 5xx body says the request itself is wrong (as servers that answer every
/// exception with 500 do for bad parameters), rather than that the server is failing.
fn is_invalid_request(body: &[u8]) -> bool {
    const SAYS_INVALID: &[&str] = &[
        "invalid",
        "validation",
        "not supported",
        "unsupported",
        "must be",
        "must not",
        "is required",
        "required field",
        "missing",
        "expected",
        "unexpected",
        "unknown",
        "unrecognized",
        "not allowed",
        "bad request",
        "context length",
        "context window",
        "exceeds",
        "too long",
        "valueerror",
        "typeerror",
        "keyerror",
    ];
    let text = String::from_utf8_lossy(body).to_lowercase();
    SAYS_INVALID.iter().any(|w| text.contains(w))
}

/// Asks for `schema` in the system message: appended to the first message if it is the
/// system's, else a system message of its own first.
fn ask_schema(messages: &mut Vec<Value>, schema: &Value) {
    let text = schema_instruction(schema);
    match messages.first_mut() {
        Some(Value::Object(m)) if m.get("role").and_then(Value::as_str) == Some("system") => {
            let content = m.get("content").and_then(Value::as_str).unwrap_or("");
            let joined = format!("{content}\n\n{text}");
            m.insert("content".into(), Value::String(joined));
        }
        _ => messages.insert(0, json!({"role": "system", "content": text})),
    }
}

/// The system message text that asks for the schema when `response_format` cannot (or can
/// only loosely): OpenAI's JSON mode also wants the word JSON in a message.
fn schema_instruction(schema: &Value) -> String {
    format!(
        "Reply with only a JSON value that matches this JSON Schema, and nothing else:\n{}",
        serde_json::to_string(schema).expect("JSON values serialize")
    )
}

enum Failure {
    Timeout,
    TooLarge,
    Transport(reqwest::Error),
}

/// A failed request that may be tried again.
struct Retry {
    kind: ErrorKind,
    what: String,
    retry_after: Option<Duration>,
    rate_limited: bool,
}

/// The wait before try `tries + 1` without `Retry-After`: 0.5s doubling to 30s, ±25%.
fn backoff(tries: u32) -> Duration {
    use rand::{Rng, SeedableRng};
    let base = FIRST_BACKOFF.saturating_mul(1u32 << tries.saturating_sub(1).min(16));
    let base = base.min(MAX_BACKOFF);
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ u64::from(tries));
    base.mul_f64(rng.random_range(0.75..=1.25))
}

fn fmt_secs(d: Duration) -> String {
    crate::model::fmt_duration(Duration::from_millis(d.as_millis() as u64))
}

fn header_value(v: &str) -> Result<reqwest::header::HeaderValue, StepError> {
    let mut h = reqwest::header::HeaderValue::from_str(v).map_err(|_| {
        // The value may hold a secret: do not quote it.
        StepError::new(
            ErrorKind::Agent,
            "a header value holds characters HTTP does not allow",
        )
    })?;
    h.set_sensitive(true);
    Ok(h)
}

/// A `json_schema` name: letters, digits, `_` and `-`, at most 64 (OpenAI's rule).
fn schema_name(agent: &str) -> String {
    let s: String = agent
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if s.is_empty() { "result".to_owned() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_variables_are_named_after_the_provider() {
        assert_eq!(
            provider_var("local", "BASE_URL"),
            "SWITCHYARD_PROVIDER_LOCAL_BASE_URL"
        );
        assert_eq!(
            provider_var("open-ai.eu", "MODEL"),
            "SWITCHYARD_PROVIDER_OPEN_AI_EU_MODEL"
        );
    }

    #[test]
    fn refusals_and_invalid_requests_are_told_from_failing_servers() {
        let refusal =
            br#"{"error": {"message": "Input should be 'text' or 'json_object' at response_format.type"}}"#;
        assert!(refuses_form(500, refusal) && refuses_form(400, refusal) && refuses_form(422, refusal));
        assert!(
            !refuses_form(503, refusal),
            "a server that is down refuses nothing"
        );
        assert!(!refuses_form(500, b"internal error"));
        assert_eq!(
            server_message(refusal),
            "Input should be 'text' or 'json_object' at response_format.type"
        );
        assert_eq!(server_message(br#"{"error": "bad"}"#), "bad");
        assert_eq!(
            server_message(br#"{"detail": [{"msg": "x"}]}"#),
            r#"[{"msg":"x"}]"#
        );
        assert_eq!(server_message(b"  plain\n text "), "plain text");
        assert!(is_invalid_request(
            b"ValueError: temperature must be between 0 and 2"
        ));
        assert!(is_invalid_request(
            br#"{"error": {"message": "Requested tokens exceed context window"}}"#
        ));
        assert!(!is_invalid_request(b"upstream overloaded"));
        assert!(!is_invalid_request(b"CUDA out of memory"));
    }

    #[test]
    fn notes_add_up_over_attempts() {
        let mut all = Value::Null;
        merge_notes(
            &mut all,
            json!({"structured_output": "json_schema", "abandoned_requests": 1}),
        );
        merge_notes(
            &mut all,
            json!({"structured_output": "json_object", "refused": {"form": "json_schema"}, "abandoned_requests": 2}),
        );
        merge_notes(
            &mut all,
            json!({"structured_output": "json_object", "repairs": [1]}),
        );
        assert_eq!(
            all,
            json!({"structured_output": "json_object", "refused": {"form": "json_schema"},
                   "abandoned_requests": 3, "repairs": [1]})
        );
        assert_eq!(Notes::default().into_value(), None);
    }

    #[test]
    fn schema_names_are_safe() {
        assert_eq!(schema_name("classifier"), "classifier");
        assert_eq!(schema_name("a.b c"), "a_b_c");
        assert_eq!(schema_name(""), "result");
    }
}
