//! HTTP plumbing shared by the `llm` and `http` agents: the client, capped body reads,
//! `Retry-After`, `allow_hosts` checks, secret resolution and redaction, and the short
//! quotes of bodies and URLs that errors carry.
//!
//! It knows nothing of chat completions or of the engine: the agents decide what a status
//! means. Secret values resolved here stay in [`Secrets`]; every message an agent builds from
//! text it does not control (a response body, a transport error, a URL) passes through
//! [`Secrets::redact`] before it can reach a record, a log or an error.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

use super::redact::Matcher;
use crate::record::{ErrorKind, StepError};

/// How much of a response body an error quotes.
pub const BODY_HEAD: usize = 200;

/// The largest number of redirects an `http` agent follows.
pub const MAX_REDIRECTS: usize = 5;

/// The HTTP client of this thread. One per thread rather than one per process: a client's
/// pooled connections are tasks of the tokio runtime that opened them, and a process may run
/// several runtimes one after another (tests do); a runtime's worker threads are its own. The
/// client follows no redirect by itself ([`MAX_REDIRECTS`] is the `http` agent's business)
/// and uses rustls with the ring provider, installed here on first use.
pub fn client() -> Result<reqwest::Client, StepError> {
    thread_local! {
        static CLIENT: Result<reqwest::Client, String> = build_client();
    }
    CLIENT.with(|c| c.clone().map_err(|e| StepError::new(ErrorKind::Agent, e)))
}

/// The TLS set-up every client shares: the system's roots through the platform verifier, as
/// reqwest would build it, made once per process (reading the roots takes milliseconds).
fn tls_config() -> Result<rustls::ClientConfig, String> {
    static CONFIG: std::sync::OnceLock<Result<rustls::ClientConfig, String>> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            // `Err` means a provider is installed already (by us on another thread, or by the
            // host program), which is all we need.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let provider = rustls::crypto::CryptoProvider::get_default()
                .cloned()
                .unwrap_or_else(|| std::sync::Arc::new(rustls::crypto::ring::default_provider()));
            let verifier = rustls_platform_verifier::Verifier::new(provider.clone())
                .map_err(|e| format!("cannot set up TLS: {e}"))?;
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("cannot set up TLS: {e}"))?
                .dangerous()
                .with_custom_certificate_verifier(std::sync::Arc::new(verifier))
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(config)
        })
        .clone()
}

fn build_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .use_preconfigured_tls(tls_config()?)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(30))
        .user_agent(concat!("switchyard/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot set up the HTTP client: {e}"))
}

/// Replaces every secret reference `${env:NAME}` in `s` with the value of `NAME` in this
/// process's environment, read now. Other text, including a `$` or `${...}` that is not a secret
/// reference, is kept as is; substituted values are not scanned again.
///
/// Errors (kind `agent`) name the variable, never a value: a variable that is not set or not
/// valid UTF-8, an unterminated reference, or a name that is not letters, digits and `_`.
pub fn resolve_secret_refs(s: &str) -> Result<String, StepError> {
    const OPEN: &str = "${env:";
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(OPEN) {
        out.push_str(&rest[..at]);
        let after = &rest[at + OPEN.len()..];
        let Some(end) = after.find('}') else {
            return Err(StepError::new(
                ErrorKind::Agent,
                "unterminated secret reference: `${env:` without a closing `}`",
            ));
        };
        let name = &after[..end];
        if !is_var_name(name) {
            // The text may be a secret pasted in by mistake: do not quote it.
            return Err(StepError::new(
                ErrorKind::Agent,
                "invalid secret reference: write `${env:NAME}` with NAME made of letters, digits and `_`",
            ));
        }
        match std::env::var(name) {
            Ok(value) => out.push_str(&value),
            Err(std::env::VarError::NotPresent) => {
                return Err(StepError::new(
                    ErrorKind::Agent,
                    format!("environment variable {name} is not set"),
                ));
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(StepError::new(
                    ErrorKind::Agent,
                    format!("environment variable {name} is not valid UTF-8"),
                ));
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

pub(crate) fn is_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Secret values resolved for one call, so that nothing derived from them leaves the call:
/// each value, and each whole text it was substituted into (a header value as sent, such as
/// `Bearer <key>`), in every spelling [`Matcher`] knows.
#[derive(Default)]
pub struct Secrets(Matcher);

impl Secrets {
    /// Resolves the `${env:NAME}` references in `text` (now, from this process's environment),
    /// remembering every substituted value and the resolved text as a whole. `what` names the
    /// field for errors, which name the variable and never a value.
    pub fn resolve(&mut self, text: &str, what: &str) -> Result<String, StepError> {
        if !text.contains("${env:") {
            return Ok(text.to_owned());
        }
        let resolved = resolve_secret_refs(text).map_err(|e| StepError {
            message: format!("{what}: {}", e.message),
            ..e
        })?;
        // The values are what the references became: remember each variable's value.
        let mut rest = text;
        while let Some(at) = rest.find("${env:") {
            let after = &rest[at + 6..];
            let Some(end) = after.find('}') else { break };
            if let Ok(v) = std::env::var(&after[..end]) {
                self.remember(&v);
            }
            rest = &after[end + 1..];
        }
        self.remember(&resolved);
        Ok(resolved)
    }

    /// Remembers a secret value (see [`Matcher::add`] for the spellings it is found in).
    pub fn remember(&mut self, value: &str) {
        self.0.add(value);
    }

    /// `text` with every secret value replaced by `[redacted]`.
    pub fn redact(&self, text: &str) -> String {
        self.0.redact(text)
    }

    fn holds_secret(&self, text: &str) -> bool {
        self.0.find(text).is_some()
    }

    /// Redacts every string (and object key) of a JSON value in place: a service that echoes
    /// a credential back does not get it into a result.
    pub fn redact_value(&self, v: &mut serde_json::Value) {
        if self.0.is_empty() {
            return;
        }
        match v {
            serde_json::Value::String(s) if self.holds_secret(s) => {
                *s = self.redact(s);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(|x| self.redact_value(x)),
            serde_json::Value::Object(m) => {
                if m.keys().any(|k| self.holds_secret(k)) {
                    let old = std::mem::take(m);
                    for (k, mut x) in old {
                        self.redact_value(&mut x);
                        m.insert(self.redact(&k), x);
                    }
                } else {
                    m.values_mut().for_each(|x| self.redact_value(x));
                }
            }
            _ => {}
        }
    }

    /// An error with its message redacted.
    pub fn redact_error(&self, mut e: StepError) -> StepError {
        e.message = self.redact(&e.message);
        if let Some(d) = &mut e.details {
            self.redact_value(d);
        }
        e
    }
}

/// The `allow_hosts` lists in force for a call: the flow's, its callers' and `--allow-hosts`.
/// A host must be allowed by every list; no list allows every host.
#[derive(Clone, Copy, Debug, Default)]
pub struct Hosts<'a>(pub &'a [Arc<[String]>]);

impl Hosts<'_> {
    /// `Err` (kind `capability`) naming the host when some list does not allow `url`'s host.
    pub fn check(&self, url: &reqwest::Url, who: &str) -> Result<(), StepError> {
        let host = url.host_str().unwrap_or("");
        let port = url.port_or_known_default();
        for list in self.0 {
            if !list.iter().any(|p| host_matches(p, host, port)) {
                return Err(StepError::new(
                    ErrorKind::Capability,
                    format!(
                        "{who}: host `{host}` is not in `allow_hosts` (allowed: {})",
                        if list.is_empty() {
                            "none".to_owned()
                        } else {
                            list.join(", ")
                        }
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Whether an `allow_hosts` entry allows `host` (as `Url::host_str` writes it: IPv6 in
/// brackets) on `port`: `example.com` (any port), `example.com:8443`, `*.example.com` (any
/// subdomain, not the domain itself), `127.0.0.1`, `[::1]:8080`. Case-insensitive.
pub fn host_matches(pattern: &str, host: &str, port: Option<u16>) -> bool {
    let pattern = pattern.trim().to_ascii_lowercase();
    let host = host.to_ascii_lowercase();
    // A port is a `:digits` suffix after the host (after the `]` of an IPv6 literal).
    let (pat_host, pat_port) = match pattern.rsplit_once(':') {
        Some((h, p))
            if !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && (!h.contains(':') || h.ends_with(']')) =>
        {
            (h.to_owned(), p.parse::<u16>().ok())
        }
        _ => (pattern.clone(), None),
    };
    if let Some(want) = pat_port
        && Some(want) != port
    {
        return false;
    }
    match pat_host.strip_prefix("*.") {
        Some(domain) => host.len() > domain.len() + 1 && host.ends_with(&format!(".{domain}")),
        None => pat_host == host,
    }
}

/// The wait a `Retry-After` header asks for: delay seconds (a fraction is accepted) or an
/// HTTP date (a date in the past is no wait). `None` without a readable header.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Why a body could not be read whole.
pub enum ReadError {
    TooLarge,
    Transport(reqwest::Error),
}

/// Reads a response body, failing as soon as it holds more than `max` bytes (a
/// `Content-Length` over `max` fails before reading).
pub async fn read_capped(resp: &mut reqwest::Response, max: u64) -> Result<Vec<u8>, ReadError> {
    if resp.content_length().is_some_and(|n| n > max) {
        return Err(ReadError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(ReadError::Transport)? {
        if (body.len() + chunk.len()) as u64 > max {
            return Err(ReadError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The start of a body as text for an error: at most [`BODY_HEAD`] bytes, cut on a character
/// boundary, whitespace collapsed, `…` marking a cut; `(empty body)` for nothing.
pub fn body_head(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let collapsed: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.is_empty() {
        return "(empty body)".to_owned();
    }
    if collapsed.len() <= BODY_HEAD {
        return collapsed;
    }
    let mut end = BODY_HEAD;
    while !collapsed.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &collapsed[..end])
}

/// A URL for messages: scheme, host, port and path; no user, password, query or fragment
/// (any of which may hold a credential).
pub fn url_for_messages(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

/// A transport error for messages: what failed, without the URL (the caller names it).
pub fn transport_error(e: &reqwest::Error) -> String {
    use std::error::Error as _;
    let mut msg = if e.is_connect() {
        "cannot connect".to_owned()
    } else if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_body() || e.is_decode() {
        "reading the response failed".to_owned()
    } else {
        "request failed".to_owned()
    };
    // The innermost cause says why (connection refused, dns, tls, ...).
    let mut source = e.source();
    let mut last = None;
    while let Some(s) = source {
        last = Some(s.to_string());
        source = s.source();
    }
    if let Some(l) = last {
        msg.push_str(": ");
        msg.push_str(&l);
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_patterns() {
        assert!(host_matches("api.example.com", "API.example.com", Some(443)));
        assert!(!host_matches("api.example.com", "example.com", Some(443)));
        assert!(host_matches("example.com:8443", "example.com", Some(8443)));
        assert!(!host_matches("example.com:8443", "example.com", Some(443)));
        assert!(host_matches("*.example.com", "a.b.example.com", Some(80)));
        assert!(!host_matches("*.example.com", "example.com", Some(80)));
        assert!(!host_matches("*.example.com", "badexample.com", Some(80)));
        assert!(host_matches("127.0.0.1", "127.0.0.1", Some(9)));
        assert!(host_matches("[::1]:8080", "[::1]", Some(8080)));
        assert!(host_matches("[::1]", "[::1]", Some(1)));
        assert!(!host_matches("[::1]:8080", "[::1]", Some(1)));
    }

    #[test]
    fn hosts_need_every_list() {
        let a: Arc<[String]> = vec!["a.test".to_owned(), "b.test".to_owned()].into();
        let b: Arc<[String]> = vec!["b.test".to_owned()].into();
        let lists = [a, b];
        let hosts = Hosts(&lists);
        assert!(
            hosts
                .check(&"http://b.test/x".parse().unwrap(), "agent `x`")
                .is_ok()
        );
        let e = hosts
            .check(&"http://a.test/x".parse().unwrap(), "agent `x`")
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Capability);
        assert_eq!(
            e.message,
            "agent `x`: host `a.test` is not in `allow_hosts` (allowed: b.test)"
        );
        assert!(Hosts(&[]).check(&"http://z.test/".parse().unwrap(), "x").is_ok());
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut h = HeaderMap::new();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        assert_eq!(retry_after(&h, now), None);
        h.insert("retry-after", "3".parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(3)));
        h.insert("retry-after", "0.25".parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(250)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(7));
        h.insert("retry-after", later.parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(7)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(7));
        h.insert("retry-after", earlier.parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::ZERO));
        h.insert("retry-after", "soon".parse().unwrap());
        assert_eq!(retry_after(&h, now), None);
        h.insert("retry-after", "-1".parse().unwrap());
        assert_eq!(retry_after(&h, now), None);
    }

    #[test]
    fn bodies_and_urls_are_quoted_short_and_clean() {
        assert_eq!(body_head(b"  not\n found "), "not found");
        assert_eq!(body_head(b""), "(empty body)");
        let long = "é".repeat(300);
        let head = body_head(long.as_bytes());
        assert!(head.ends_with('…') && head.len() <= BODY_HEAD + 3, "{head}");
        let u: reqwest::Url = "https://user:pw@h.test:8443/a/b?token=x#f".parse().unwrap();
        assert_eq!(url_for_messages(&u), "https://h.test:8443/a/b");
    }

    #[test]
    fn secrets_are_remembered_and_redacted() {
        // `PATH` is set in every test environment; setting a variable here would race with
        // the tests that start processes.
        let path = std::env::var("PATH").expect("PATH is set");
        let mut s = Secrets::default();
        let v = s.resolve("Bearer ${env:PATH}", "header `Authorization`").unwrap();
        assert_eq!(v, format!("Bearer {path}"));
        assert_eq!(s.redact(&format!("echo: {v}!")), "echo: [redacted]!");
        assert_eq!(s.redact(&format!("echo: {path}!")), "echo: [redacted]!");
        let mut j = serde_json::json!({"a": [format!("x {path}")], path.clone(): 1});
        s.redact_value(&mut j);
        assert_eq!(j, serde_json::json!({"a": ["x [redacted]"], "[redacted]": 1}));
        let e = s
            .resolve(
                "${env:SWITCHYARD_NET_TEST_UNSET_VAR}",
                "the `api_key` of provider `p`",
            )
            .unwrap_err();
        assert_eq!(
            e.message,
            "the `api_key` of provider `p`: environment variable SWITCHYARD_NET_TEST_UNSET_VAR is not set"
        );
    }
}
