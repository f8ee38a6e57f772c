//! The `http` agent (SPEC §6, §6.5): sends a body to `url` (`method`, default `POST`; `GET`
//! and `HEAD` send no body) and returns the JSON response body, or the file a response that
//! is not JSON carries.
//!
//! The body is `body:`'s value (a value template over `input`), else the input document: a
//! file reference sends the file's bytes (read from the store, checked against their hash)
//! with its media type as `Content-Type`; any other value is sent as JSON. A `Content-Type`
//! among the configured `headers` wins over either.
//!
//! Each request carries the configured `headers` (values may hold `${env:NAME}` secret
//! references, resolved now), `Idempotency-Key` (stable across retries and resumes of the same
//! step of the same item), `X-Switchyard-Run`, `X-Switchyard-Step` and `X-Switchyard-Attempt`.
//!
//! Statuses: 2xx → the body as JSON (`null` when empty; not JSON → kind `invalid_output`) when
//! the response's `Content-Type` is JSON (`application/json`, `…+json`) or absent; a 2xx body
//! of any other `Content-Type` becomes a file ([`store_body`]), streamed into the store and
//! bounded by `limits.max_file_bytes` (kind `limit`), not by `max_response`: the result is
//! its reference. A 204, 205 or `Content-Length: 0` is `null` whatever its type.
//! 408 → kind `timeout`; 429 → kind `rate_limited`; 5xx → kind `agent` — the retryable kinds
//! of the step's `retry` policy, with `Retry-After` in the error's details
//! (`retry_after_ms`), which the engine's retry honours; any other status → kind `agent`
//! with the status and the start of the body, marked `retryable: false` (asking again does not
//! change a 404 or a 401, so the engine does not). Redirects are followed up to
//! [`MAX_REDIRECTS`](super::net::MAX_REDIRECTS), each target checked against `allow_hosts`;
//! a redirect to another origin drops the configured headers (they may hold credentials), and
//! 303 — or 301/302 after a `POST` — continues as a `GET` without body. A JSON body over
//! `max_response` fails with kind `invalid_output`. The step's `timeout` bounds the whole
//! attempt (the engine enforces it).

use std::time::SystemTime;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use serde_json::{Value, json};

use super::net::{self, Hosts, MAX_REDIRECTS, ReadError, Secrets};
use super::transform::eval_value_template;
use super::{Agent, CallContext};
use crate::plan::HttpPlan;
use crate::record::files::FileRef;
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
        let client = net::client()?;
        let origin = url.origin();
        let mut send_body = !matches!(method, Method::GET | Method::HEAD);
        let body = if send_body {
            Some(self.body(input, cx, &who).await?)
        } else {
            None
        };
        let mut redirects = 0usize;
        loop {
            self.hosts.check(&url, &who)?;
            let mut req = client
                .request(method.clone(), url.clone())
                .header(reqwest::header::ACCEPT, "application/json, */*;q=0.5")
                .header("Idempotency-Key", cx.idempotency_key())
                .header("X-Switchyard-Run", cx.run_id)
                .header("X-Switchyard-Step", cx.step_number.to_string())
                .header("X-Switchyard-Attempt", cx.attempt.to_string());
            let same_origin = url.origin() == origin;
            if same_origin {
                req = req.headers(configured.clone());
            }
            if let Some(body) = body.as_ref().filter(|_| send_body) {
                if !(same_origin && configured.contains_key(reqwest::header::CONTENT_TYPE)) {
                    req = req.header(reqwest::header::CONTENT_TYPE, body.content_type.clone());
                }
                req = req.body(body.bytes.clone());
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
            if status.is_success() && method != Method::HEAD && is_file(status, resp.headers()) {
                return store_body(resp, &url, cx)
                    .await
                    .map(|f| f.to_value())
                    .map_err(|e| StepError {
                        message: format!("{who}: {method} {shown}: {}", e.message),
                        ..e
                    });
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

impl HttpAgent<'_> {
    /// What a request sends: `body:`'s value, else the input document; a file reference as
    /// its bytes and media type, anything else as JSON.
    async fn body(&self, input: &Value, cx: &CallContext<'_>, who: &str) -> Result<Body, StepError> {
        let evaluated;
        let doc = match &self.plan.body {
            Some(t) => {
                evaluated = eval_value_template(t, input, cx).map_err(|e| StepError {
                    message: format!("{who}: `body`: {}", e.message),
                    ..e
                })?;
                &evaluated
            }
            None => input,
        };
        if let Some(file) = FileRef::from_value(doc) {
            let bytes = cx.files.read_bytes(&file).await.map_err(|e| StepError {
                message: format!("{who}: the body: {}", e.message),
                ..e
            })?;
            let content_type = HeaderValue::from_str(&file.media_type)
                .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
            return Ok(Body { bytes, content_type });
        }
        Ok(Body {
            bytes: serde_json::to_vec(doc).expect("JSON values serialize"),
            content_type: HeaderValue::from_static("application/json"),
        })
    }
}

/// What a request sends.
struct Body {
    bytes: Vec<u8>,
    content_type: HeaderValue,
}

/// Whether a successful response's body is a file: it has one (not a 204 or 205, not
/// `Content-Length: 0`) and a `Content-Type` that is not JSON. Without a `Content-Type` the
/// body is read as JSON.
fn is_file(status: StatusCode, headers: &HeaderMap) -> bool {
    if matches!(status, StatusCode::NO_CONTENT | StatusCode::RESET_CONTENT) {
        return false;
    }
    let empty = headers
        .get(reqwest::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim() == "0");
    let Some(ct) = headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    !empty && !is_json_type(ct)
}

/// `application/json` or a `+json` type, parameters aside.
fn is_json_type(content_type: &str) -> bool {
    let base = media_base(content_type);
    base == "application/json" || base.ends_with("+json")
}

/// A `Content-Type`'s type and subtype, lower case.
fn media_base(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Streams a response body into the store as a file, never whole in memory, and returns its
/// reference. Its name is `Content-Disposition`'s filename, else the URL's last path
/// segment, else `response`; its media type the `Content-Type` corrected by the content for
/// images (`application/octet-stream` says nothing: the name's extension does).
async fn store_body(resp: reqwest::Response, url: &Url, cx: &CallContext<'_>) -> Result<FileRef, StepError> {
    let header = |h| resp.headers().get(h).and_then(|v: &HeaderValue| v.to_str().ok());
    let declared = header(reqwest::header::CONTENT_TYPE)
        .filter(|c| media_base(c) != "application/octet-stream")
        .map(str::to_owned);
    let name = resp
        .headers()
        .get(reqwest::header::CONTENT_DISPOSITION)
        .and_then(|v| disposition_filename(v.as_bytes()))
        .or_else(|| url_name(url))
        .unwrap_or_else(|| "response".to_owned());
    let chunks = futures_util::stream::unfold(resp, |mut r| async move {
        match r.chunk().await {
            Ok(Some(b)) => Some((Ok(b), r)),
            Ok(None) => None,
            Err(e) => Some((Err(std::io::Error::other(net::transport_error(&e))), r)),
        }
    });
    let reader = tokio_util::io::StreamReader::new(Box::pin(chunks));
    cx.files.store_reader(reader, name, declared.as_deref()).await
}

/// The file name a `Content-Disposition` value gives: `filename*` (RFC 5987:
/// `UTF-8''caf%C3%A9.png`) before `filename` (quoted, with `\` escapes, or a token); only
/// its last path component, never empty.
fn disposition_filename(value: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(value);
    let mut plain = None;
    let mut extended = None;
    for (key, val) in disposition_params(&text) {
        match key.as_str() {
            "filename*" => {
                let mut parts = val.splitn(3, '\'');
                let (charset, _lang, encoded) = (parts.next()?, parts.next(), parts.next());
                if let Some(encoded) = encoded
                    && matches!(charset.to_ascii_lowercase().as_str(), "utf-8" | "iso-8859-1" | "")
                {
                    let bytes = percent_decode(encoded);
                    extended = Some(if charset.eq_ignore_ascii_case("iso-8859-1") {
                        bytes.iter().map(|&b| char::from(b)).collect()
                    } else {
                        String::from_utf8_lossy(&bytes).into_owned()
                    });
                }
            }
            "filename" => plain = Some(val),
            _ => {}
        }
    }
    let name = extended.or(plain)?;
    let last = name.rsplit(['/', '\\']).next().unwrap_or("").trim();
    (!last.is_empty() && last != "." && last != "..").then(|| last.to_owned())
}

/// The `key=value` parameters after a `Content-Disposition`'s type, keys lower case, quoted
/// values unquoted.
fn disposition_params(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = match text.split_once(';') {
        Some((_, r)) => r,
        None => return out,
    };
    loop {
        rest = rest.trim_start_matches([' ', '\t', ';']);
        let Some(eq) = rest.find('=') else { break };
        let key = rest[..eq].trim().to_ascii_lowercase();
        rest = rest[eq + 1..].trim_start();
        let value;
        if let Some(q) = rest.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = q.char_indices();
            let mut end = q.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            v.push(n);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => v.push(c),
                }
            }
            value = v;
            rest = &q[end.min(q.len())..];
        } else {
            let end = rest.find(';').unwrap_or(rest.len());
            value = rest[..end].trim().to_owned();
            rest = &rest[end..];
        }
        out.push((key, value));
    }
    out
}

/// The URL's last path segment, percent-decoded; `None` when the path ends in `/`.
fn url_name(url: &Url) -> Option<String> {
    let last = url.path_segments()?.next_back()?;
    let name = String::from_utf8_lossy(&percent_decode(last)).into_owned();
    (!name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\'])).then_some(name)
}

/// `%XX` escapes decoded; anything else kept as it is.
fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
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

    #[test]
    fn file_names_come_from_content_disposition_then_the_url() {
        let d = |v: &str| disposition_filename(v.as_bytes());
        assert_eq!(
            d("attachment; filename=\"invoice 7.png\"").as_deref(),
            Some("invoice 7.png")
        );
        assert_eq!(d("attachment; filename=plain.txt").as_deref(), Some("plain.txt"));
        assert_eq!(
            d("attachment; filename=\"fallback.png\"; filename*=UTF-8''caf%C3%A9.png").as_deref(),
            Some("café.png")
        );
        assert_eq!(d("inline; filename=\"a\\\"b.txt\"").as_deref(), Some("a\"b.txt"));
        assert_eq!(
            d("attachment; filename=\"../../etc/passwd\"").as_deref(),
            Some("passwd")
        );
        assert_eq!(d("attachment; filename=\"..\""), None);
        assert_eq!(d("attachment"), None);
        let u = |s: &str| url_name(&s.parse().unwrap());
        assert_eq!(
            u("http://h.test/scans/page%201.png?x=1").as_deref(),
            Some("page 1.png")
        );
        assert_eq!(u("http://h.test/scans/"), None);
        assert_eq!(u("http://h.test/a%2Fb"), None);
        assert!(is_json_type("application/problem+json; charset=utf-8"));
        assert!(is_json_type("Application/JSON"));
        assert!(!is_json_type("text/plain"));
    }
}
