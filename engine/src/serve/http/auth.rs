//! Who may ask `serve` what (SPEC §15): tokens (names with hashed secrets and scopes), the
//! UI's sessions, and the `Origin` and `Host` checks every request passes first.
//!
//! A tokens file holds one token a line, `NAME SCOPES sha256:HEX`: a name (the actor its
//! decisions are recorded under), its scopes comma-separated (`read`, `decide`, `run`), and
//! the SHA-256 of its secret in hex (`printf %s SECRET | sha256sum`). Blank lines and lines
//! starting with `#` are skipped. API clients send the secret as `Authorization: Bearer
//! SECRET`; the UI sends it once to `POST /login` and keeps a session cookie. Without a
//! tokens file (loopback only) every request is allowed, as the OS user.

// A refused request is an axum `Response`, returned as handlers return it.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::sync::Mutex;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::json;
use sha2::Digest;

use super::AppState;
use crate::inbox::Actor;
use crate::record::inbox::Via;

/// The name of the session cookie the UI keeps.
pub const SESSION_COOKIE: &str = "switchyard_session";

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Read the inbox, the decisions, runs and batches.
    Read,
    /// Answer inbox items, one or in bulk.
    Decide,
    /// Start runs (`POST /v1/runs`).
    Run,
}

impl Scope {
    pub const ALL: [Scope; 3] = [Scope::Read, Scope::Decide, Scope::Run];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Decide => "decide",
            Scope::Run => "run",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|x| x.as_str() == s)
    }

    fn bit(self) -> u8 {
        match self {
            Scope::Read => 1,
            Scope::Decide => 2,
            Scope::Run => 4,
        }
    }
}

/// A set of scopes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    pub fn all() -> Scopes {
        Scopes(7)
    }

    pub fn has(self, s: Scope) -> bool {
        self.0 & s.bit() != 0
    }

    fn with(self, s: Scope) -> Scopes {
        Scopes(self.0 | s.bit())
    }

    /// The scopes' names, in the order `read`, `decide`, `run`.
    pub fn names(self) -> Vec<&'static str> {
        Scope::ALL
            .into_iter()
            .filter(|s| self.has(*s))
            .map(Scope::as_str)
            .collect()
    }
}

/// One token of the tokens file.
#[derive(Clone, Debug)]
struct Token {
    name: String,
    scopes: Scopes,
    hash: [u8; 32],
}

/// The tokens of a tokens file.
#[derive(Clone, Debug, Default)]
pub struct Tokens(Vec<Token>);

impl Tokens {
    /// Reads a tokens file's text; `file` names it in errors (`FILE:LINE: ...`), every bad
    /// line told.
    pub fn parse(text: &str, file: &str) -> Result<Tokens, Vec<String>> {
        let mut tokens: Vec<Token> = Vec::new();
        let mut problems = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match parse_line(line) {
                Ok(t) => {
                    if tokens.iter().any(|o| o.name == t.name) {
                        problems.push(format!("{file}:{}: token `{}` is named twice", n + 1, t.name));
                    } else if tokens.iter().any(|o| o.hash == t.hash) {
                        problems.push(format!(
                            "{file}:{}: token `{}` has the secret of another token: each needs its own",
                            n + 1,
                            t.name
                        ));
                    } else {
                        tokens.push(t);
                    }
                }
                Err(e) => problems.push(format!("{file}:{}: {e}", n + 1)),
            }
        }
        if tokens.is_empty() && problems.is_empty() {
            problems.push(format!(
                "{file}: holds no token (a line is `NAME SCOPES sha256:HEX`, scopes of read,decide,run)"
            ));
        }
        if problems.is_empty() {
            Ok(Tokens(tokens))
        } else {
            Err(problems)
        }
    }

    /// The token whose secret is `secret`.
    fn find(&self, secret: &str) -> Option<&Token> {
        let hash: [u8; 32] = sha2::Sha256::digest(secret.as_bytes()).into();
        self.0.iter().find(|t| same(&t.hash, &hash))
    }
}

fn parse_line(line: &str) -> Result<Token, String> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [name, scopes, hash] = fields[..] else {
        return Err(format!(
            "expected `NAME SCOPES sha256:HEX` (three fields), found {}",
            fields.len()
        ));
    };
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
    {
        return Err(format!(
            "token name `{name}`: use letters, digits, `-`, `_`, `.` and `@`"
        ));
    }
    let mut set = Scopes::default();
    for s in scopes.split(',').filter(|s| !s.is_empty()) {
        set = set.with(
            Scope::parse(s)
                .ok_or_else(|| format!("token `{name}`: unknown scope `{s}` (scopes: read, decide, run)"))?,
        );
    }
    let hex = hash.strip_prefix("sha256:").ok_or_else(|| {
        format!("token `{name}`: the secret's hash must be written `sha256:HEX`, not `{hash}`")
    })?;
    let hash = decode_hex(hex).ok_or_else(|| {
        format!("token `{name}`: `sha256:{hex}` is not 64 hex digits (`printf %s SECRET | sha256sum`)")
    })?;
    Ok(Token {
        name: name.to_string(),
        scopes: set,
        hash,
    })
}

fn decode_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Who a request is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub scopes: Scopes,
}

/// The tokens and the UI's sessions of one server.
#[derive(Debug)]
pub struct Auth {
    /// `None`: no tokens file; every request is the OS user's, with every scope.
    tokens: Option<Tokens>,
    /// Session id → who logged in; kept in memory (a restart logs everyone out).
    sessions: Mutex<HashMap<String, Principal>>,
    /// Listening on loopback: a request's `Host` must name a loopback host (no DNS
    /// rebinding).
    loopback: bool,
    /// The OS user, the actor when there are no tokens.
    os_user: String,
}

impl Auth {
    pub fn new(tokens: Option<Tokens>, loopback: bool) -> Auth {
        Auth {
            tokens,
            sessions: Mutex::default(),
            loopback,
            os_user: Actor::os_user().name,
        }
    }

    /// Whether requests need a token.
    pub fn needs_token(&self) -> bool {
        self.tokens.is_some()
    }

    /// Who the secret `secret` is.
    pub fn bearer(&self, secret: &str) -> Option<Principal> {
        match &self.tokens {
            None => Some(self.open()),
            Some(t) => t.find(secret).map(|t| Principal {
                name: t.name.clone(),
                scopes: t.scopes,
            }),
        }
    }

    fn open(&self) -> Principal {
        Principal {
            name: self.os_user.clone(),
            scopes: Scopes::all(),
        }
    }

    /// Opens a session for the secret `secret`: its id, or `None` for a secret no token has.
    pub fn login(&self, secret: &str) -> Option<String> {
        let who = self.bearer(secret)?;
        let id = hex(&crate::record::inbox::random_bytes::<32>());
        self.lock().insert(id.clone(), who);
        Some(id)
    }

    /// Ends session `id`.
    pub fn logout(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Who session `id` is.
    pub fn session(&self, id: &str) -> Option<Principal> {
        self.lock().get(id).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Principal>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Who a request with these headers is: by its bearer token, else its session cookie,
    /// else (without tokens) the OS user. `Err` when it is no one.
    fn who(&self, headers: &HeaderMap) -> Result<Authed, Refused> {
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let secret = value
                .to_str()
                .ok()
                .and_then(bearer)
                .ok_or(Refused::BadAuthorization)?;
            return self
                .bearer(secret)
                .map(|p| Authed::new(p, Via::Api))
                .ok_or(Refused::UnknownToken);
        }
        if let Some(id) = session_cookie(headers) {
            if let Some(p) = self.session(id) {
                return Ok(Authed::new(p, Via::Ui));
            }
            if self.tokens.is_some() {
                return Err(Refused::SessionEnded);
            }
        }
        match self.tokens {
            None => Ok(Authed::new(self.open(), Via::Api)),
            Some(_) => Err(Refused::NoToken),
        }
    }
}

/// Why a request was not let in.
#[derive(Clone, Copy, Debug)]
enum Refused {
    NoToken,
    BadAuthorization,
    UnknownToken,
    SessionEnded,
}

impl Refused {
    fn message(self) -> &'static str {
        match self {
            Refused::NoToken => {
                "unauthorized: send a token as `Authorization: Bearer SECRET` (or log in at /login)"
            }
            Refused::BadAuthorization => "unauthorized: the Authorization header must be `Bearer SECRET`",
            Refused::UnknownToken => "unauthorized: no token has this secret",
            Refused::SessionEnded => "unauthorized: the session ended; log in again at /login",
        }
    }
}

/// A request's caller, as extracted from its headers: who, with which scopes, and how
/// (`api` for a bearer token or no token, `ui` for a session).
#[derive(Clone, Debug)]
pub struct Authed {
    pub name: String,
    pub scopes: Scopes,
    pub via: Via,
}

impl Authed {
    fn new(p: Principal, via: Via) -> Authed {
        Authed {
            name: p.name,
            scopes: p.scopes,
            via,
        }
    }

    /// `Ok` when the caller has scope `s`; else the 403 answer to send.
    pub fn require(&self, s: Scope) -> Result<(), Response> {
        if self.scopes.has(s) {
            return Ok(());
        }
        Err(error(
            StatusCode::FORBIDDEN,
            &format!(
                "forbidden: token `{}` lacks the `{}` scope (it has: {})",
                self.name,
                s.as_str(),
                match self.scopes.names() {
                    n if n.is_empty() => "none".to_string(),
                    n => n.join(", "),
                }
            ),
        ))
    }

    /// The actor its decisions are recorded under.
    pub fn actor(&self) -> Actor {
        Actor {
            name: self.name.clone(),
            via: self.via,
        }
    }
}

impl FromRequestParts<AppState> for Authed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        state.auth.who(&parts.headers).map_err(|r| {
            let mut res = error(StatusCode::UNAUTHORIZED, r.message());
            res.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            res
        })
    }
}

/// A JSON error answer: `{"error": message}`.
pub fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

/// Whether a request's `Origin` (if any) is the server's own: the scheme `http` or `https`
/// and exactly the `Host` the request was sent to. Absent: true (a client that is no
/// browser; tokens decide).
pub fn origin_ok(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let (Ok(origin), Some(Ok(host))) = (origin.to_str(), headers.get(header::HOST).map(|h| h.to_str()))
    else {
        return false;
    };
    let origin = origin.trim().trim_end_matches('/');
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https") && rest.eq_ignore_ascii_case(host.trim())
}

/// Whether a `Host` header names a loopback host (`localhost`, `127.0.0.1`, `[::1]`, any
/// port).
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or("", |(h, _)| h),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The checks every request passes before its handler: on loopback, a `Host` naming
/// loopback (403 otherwise); for a POST, an `Origin` that is absent or the server's own
/// (403 otherwise).
pub async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if state.auth.loopback {
        let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok());
        if !host.is_some_and(loopback_host) {
            return error(
                StatusCode::FORBIDDEN,
                "forbidden: this server answers requests for a loopback host only",
            );
        }
    }
    if request.method() == Method::POST && !origin_ok(request.headers()) {
        tracing::warn!(origin = ?request.headers().get(header::ORIGIN), "refused a POST from another origin");
        return error(
            StatusCode::FORBIDDEN,
            "forbidden: a POST from another origin is refused",
        );
    }
    next.run(request).await
}

/// The login form: the token's secret, and where to go after.
#[derive(serde::Deserialize)]
pub struct Login {
    pub token: String,
    #[serde(default)]
    pub next: Option<String>,
}

/// `POST /login`: opens a session for the token's secret and sets its cookie (HttpOnly,
/// SameSite=Strict), then sends the browser to `next` (a path here) or `/`; 401 for a secret
/// no token has.
pub async fn login(State(state): State<AppState>, axum::Form(form): axum::Form<Login>) -> Response {
    let Some(id) = state.auth.login(form.token.trim()) else {
        return error(StatusCode::UNAUTHORIZED, "unauthorized: no token has this secret");
    };
    let next = form
        .next
        .filter(|n| n.starts_with('/') && !n.starts_with("//") && !n.contains('\\'))
        .unwrap_or_else(|| "/".to_string());
    let cookie = format!("{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict");
    let mut res = Redirect::to(&next).into_response();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("hex ids are header-safe"),
    );
    res
}

/// `POST /logout`: ends the session and clears its cookie.
pub async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(id) = session_cookie(&headers) {
        state.auth.logout(id);
    }
    let mut res = Redirect::to("/").into_response();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&format!(
            "{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
        ))
        .expect("a fixed cookie"),
    );
    res
}

/// The session id of the request's cookie.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| {
            let (k, v) = c.trim().split_once('=')?;
            (k == SESSION_COOKIE).then_some(v)
        })
}

/// The token of an `Authorization: Bearer <token>` value (the scheme in any case).
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Compares in time that depends on the lengths only.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(s: &str) -> String {
        hex(&sha2::Sha256::digest(s.as_bytes()))
    }

    #[test]
    fn tokens_files_are_read_with_every_bad_line_told() {
        let text = format!(
            "# who\nalice read,decide sha256:{}\n\nbot run sha256:{}\n",
            sha("a-secret"),
            sha("b-secret")
        );
        let t = Tokens::parse(&text, "t").expect("valid");
        let a = t.find("a-secret").expect("alice");
        assert_eq!(
            (a.name.as_str(), a.scopes.names()),
            ("alice", vec!["read", "decide"])
        );
        assert!(t.find("b-secret").is_some_and(|b| b.scopes.names() == ["run"]));
        assert!(t.find("nope").is_none());
        let bad = format!("x read\ny write sha256:{}\nz read md5:00\n", sha("1"));
        let e = Tokens::parse(&bad, "t").expect_err("bad");
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[0].starts_with("t:1: expected"), "{e:?}");
        assert!(e[1].contains("unknown scope `write`"), "{e:?}");
        assert!(e[2].contains("sha256:HEX"), "{e:?}");
        assert!(Tokens::parse("# none\n", "t").is_err());
    }

    #[test]
    fn an_origin_is_the_servers_own_when_it_names_its_host() {
        let mut h = HeaderMap::new();
        assert!(origin_ok(&h), "no Origin");
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        h.insert(header::ORIGIN, HeaderValue::from_static("http://127.0.0.1:8080"));
        assert!(origin_ok(&h));
        for o in [
            "http://127.0.0.1:8081",
            "https://evil.example",
            "null",
            "http://127.0.0.1",
        ] {
            h.insert(header::ORIGIN, HeaderValue::from_str(o).expect("header"));
            assert!(!origin_ok(&h), "{o}");
        }
        assert!(loopback_host("localhost:1") && loopback_host("[::1]:80") && loopback_host("127.0.0.1"));
        assert!(!loopback_host("evil.example:80") && !loopback_host("10.0.0.1:80"));
    }
}
