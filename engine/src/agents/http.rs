//! The `http` agent (SPEC §6): sends the input document as a JSON body to `url` (`method`,
//! default `POST`; `GET` and `HEAD` send no body) and returns the JSON response body.
//!
//! Each request carries the configured `headers` (values may hold `${env:NAME}` secret
//! references, resolved now), `Idempotency-Key` (stable across retries and resumes of the same
//! step of the same item), `X-Switchyard-Run`, `X-Switchyard-Step` and `X-Switchyard-Attempt`.
//!
//! Statuses: 2xx → the body as JSON (`null` when empty; not JSON → kind `invalid_output`);
//! 408 → kind `timeout`; 429 → kind `rate_limited`; 5xx → kind `agent` — the retryable kinds
//! of the step's `retry` policy, with `Retry-After` in the error's details
//! (`retry_after_ms`), which the engine's retry honours; any other status → kind `agent`
//! with the status and the start of the body, marked `retryable: false` (asking again does not
//! change a 404 or a 401, so the engine does not). Redirects are followed up to
//! [`MAX_REDIRECTS`](super::net::MAX_REDIRECTS), each target checked against `allow_hosts`;
//! a redirect to another origin drops the configured headers (they may hold credentials), and
//! 303 — or 301/302 after a `POST` — continues as a `GET` without body. A body over
//! `max_response` fails with kind `invalid_output`. The step's `timeout` bounds the whole
//! attempt (the engine enforces it).

use std::time::SystemTime;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use serde_json::{Value, json};

use super::net::{self, Hosts, MAX_REDIRECTS, ReadError, Secrets};
use super::{Agent, CallContext};
use crate::plan::HttpPlan;
use crate::record::{ErrorKind, StepError};

/// One `http` agent call's view of the world.
pub struct HttpAgent<'a> {
    pub name: &'a str,
    pub plan: &'a HttpPlan,
    pub hosts: Hosts<'a>,
}

impl Agent for HttpAgent<'_> {
    async fn call(&self, input: &Value, cx: CallContext<'_>) -> Result<Value, StepError> {
        let mut secrets = Secrets::default();
        let out = tokio::select! {
            biased;
            _ = cx.cancel.cancelled() => Err(StepError::new(
                ErrorKind::Cancelled,
                format!("agent `{}`: call cancelled", self.name),
            )),
            r = self.call_inner(input, &cx, &mut secrets) => r,
        };
        match out {
            Ok(mut v) => {
                secrets.redact_value(&mut v);
                Ok(v)
            }
            Err(e) => Err(secrets.redact_error(e)),
        }
    }
}

impl HttpAgent<'_> {
    async fn call_inner(
        &self,
        input: &Value,
        cx: &CallContext<'_>,
        secrets: &mut Secrets,
    ) -> Result<Value, StepError> {
        let who = format!("agent `{}`", self.name);
        let url_text = secrets.resolve(&self.plan.url, "`url`")?;
        let mut url: Url = url_text
            .parse()
            .map_err(|e| StepError::new(ErrorKind::Agent, format!("{who}: invalid `url`: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(StepError::new(
                ErrorKind::Agent,
                format!(
                    "{who}: the `url` scheme must be http or https, not `{}`",
                    url.scheme()
                ),
            ));
        }
        let mut method = Method::from_bytes(self.plan.method.as_bytes()).map_err(|_| {
            StepError::new(
                ErrorKind::Agent,
                format!("{who}: invalid `method` `{}`", self.plan.method),
            )
        })?;
        let mut configured = HeaderMap::new();
        for (k, v) in &self.plan.headers {
            let v = secrets.resolve(v, &format!("header `{k}`"))?;
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| StepError::new(ErrorKind::Agent, format!("{who}: invalid header name `{k}`")))?;
            let mut value = HeaderValue::from_str(&v).map_err(|_| {
                StepError::new(
                    ErrorKind::Agent,
                    format!("{who}: header `{k}` holds characters HTTP does not allow"),
                )
            })?;
            value.set_sensitive(true);
            configured.insert(name, value);
        }
        let body = serde_json::to_vec(input).expect("JSON values serialize");
        let client = net::client()?;
        let origin = url.origin();
        let mut send_body = !matches!(method, Method::GET | Method::HEAD);
        let mut redirects = 0usize;
        loop {
            self.hosts.check(&url, &who)?;
            let mut req = client
                .request(method.clone(), url.clone())
                .header(reqwest::header::ACCEPT, "application/json")
                .header("Idempotency-Key", cx.idempotency_key())
                .header("X-Switchyard-Run", cx.run_id)
                .header("X-Switchyard-Step", cx.step_number.to_string())
                .header("X-Switchyard-Attempt", cx.attempt.to_string());
            if url.origin() == origin {
                req = req.headers(configured.clone());
            }
            if send_body {
                req = req
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone());
            }
            let shown = net::url_for_messages(&url);
            let mut resp = req.send().await.map_err(|e| {
                let kind = if e.is_timeout() {
                    ErrorKind::Timeout
                } else {
                    ErrorKind::Agent
                };
                StepError::new(
                    kind,
                    format!("{who}: {method} {shown}: {}", net::transport_error(&e)),
                )
            })?;
            let status = resp.status();
            if status.is_redirection()
                && let Some(location) = resp.headers().get(reqwest::header::LOCATION)
            {
                redirects += 1;
                if redirects > MAX_REDIRECTS {
                    return Err(StepError::new(
                        ErrorKind::Agent,
                        format!("{who}: {method} {shown}: more than {MAX_REDIRECTS} redirects"),
                    ));
                }
                let next = location
                    .to_str()
                    .ok()
                    .and_then(|l| url.join(l).ok())
                    .ok_or_else(|| {
                        StepError::new(
                            ErrorKind::Agent,
                            format!("{who}: {method} {shown}: {status} with an unreadable `Location`"),
                        )
                    })?;
                if status == StatusCode::SEE_OTHER
                    || (matches!(status, StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND)
                        && method == Method::POST)
                {
                    method = Method::GET;
                    send_body = false;
                }
                tracing::debug!(run_id = cx.run_id, step = cx.step, agent = self.name, %status,
                    to = %secrets.redact(&net::url_for_messages(&next)), "following a redirect");
                url = next;
                continue;
            }
            let retry_after = net::retry_after(resp.headers(), SystemTime::now());
            let bytes = match net::read_capped(&mut resp, self.plan.max_response).await {
                Ok(b) => b,
                Err(ReadError::TooLarge) => {
                    return Err(StepError::new(
                        ErrorKind::InvalidOutput,
                        format!(
                            "{who}: {method} {shown}: the response is larger than {} bytes (max_response)",
                            self.plan.max_response
                        ),
                    ));
                }
                Err(ReadError::Transport(e)) => {
                    return Err(StepError::new(
                        ErrorKind::Agent,
                        format!("{who}: {method} {shown}: {}", net::transport_error(&e)),
                    ));
                }
            };
            return judge(&who, &method, &shown, status, retry_after, &bytes);
        }
    }
}

/// The result (or error) of a final response.
fn judge(
    who: &str,
    method: &Method,
    shown: &str,
    status: StatusCode,
    retry_after: Option<std::time::Duration>,
    body: &[u8],
) -> Result<Value, StepError> {
    if status.is_success() {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        return crate::json::from_slice(body).map_err(|e| {
            StepError::new(
                ErrorKind::InvalidOutput,
                format!(
                    "{who}: {method} {shown}: the response is not JSON ({e}): {}",
                    net::body_head(body)
                ),
            )
        });
    }
    let code = status.as_u16();
    let (kind, retryable) = match code {
        408 => (ErrorKind::Timeout, true),
        429 => (ErrorKind::RateLimited, true),
        500..=599 => (ErrorKind::Agent, true),
        _ => (ErrorKind::Agent, false),
    };
    let mut details = json!({"status": code, "retryable": retryable});
    if let Some(wait) = retry_after {
        details["retry_after_ms"] = json!(wait.as_millis() as u64);
    }
    Err(StepError::new(
        kind,
        format!(
            "{who}: {method} {shown} answered {status}: {}",
            net::body_head(body)
        ),
    )
    .with_details(details))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_kinds() {
        let j = |code: u16, body: &[u8]| {
            judge(
                "agent `a`",
                &Method::POST,
                "http://h.test/x",
                StatusCode::from_u16(code).unwrap(),
                Some(std::time::Duration::from_secs(2)),
                body,
            )
        };
        assert_eq!(j(200, b"{\"a\":1}").unwrap(), json!({"a": 1}));
        assert_eq!(j(204, b"").unwrap(), Value::Null);
        let e = j(200, b"<html>").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidOutput);
        assert_eq!(j(408, b"").unwrap_err().kind, ErrorKind::Timeout);
        let e = j(429, b"slow down").unwrap_err();
        assert_eq!(e.kind, ErrorKind::RateLimited);
        assert_eq!(e.details.as_ref().unwrap()["retry_after_ms"], 2000);
        let e = j(503, b"").unwrap_err();
        assert_eq!(
            (e.kind.clone(), e.details.as_ref().unwrap()["retryable"].clone()),
            (ErrorKind::Agent, json!(true))
        );
        let e = j(404, b"no such thing").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Agent);
        assert_eq!(e.details.as_ref().unwrap()["retryable"], false);
        assert_eq!(
            e.message,
            "agent `a`: POST http://h.test/x answered 404 Not Found: no such thing"
        );
    }
}
