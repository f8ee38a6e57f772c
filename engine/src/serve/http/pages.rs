//! The HTML pages of `serve` (SPEC §15): `/`, `/inbox`, `/inbox/{id}`, `/runs/{id}`,
//! `/batches/{name}` and `/login`. Each is a shell from [`crate::report`] that holds no data
//! of the store: its script reads the JSON API (`/v1`) of this same server with the session's
//! cookie and puts what it reads into the page as text. Every answer carries a Content
//! Security Policy with a fresh nonce: the page's own inline script and style run, nothing
//! else, and the only connections allowed are to this origin. A page asked for without a
//! token (when the server has tokens) sends the browser to `/login`, which comes back after.

use axum::Router;
use axum::extract::{Path, Query};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use super::AppState;
use super::auth::Authed;
use crate::report::{inbox_page, live, page};

/// The pages' routes, merged into the server's router.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(home))
        .route("/inbox", get(inbox))
        .route("/inbox/{id}", get(inbox_item))
        .route("/runs/{id}", get(run))
        .route("/batches/{name}", get(batch))
        .route("/login", get(login))
}

/// A page's answer: the HTML with its policy, never cached, never framed.
fn html(nonce: &str, body: String) -> Response {
    let mut res = (StatusCode::OK, body).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_str(&page::csp(nonce)).expect("a nonce is hex"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: under it a browser sends `Origin: null` with a form's POST, which
    // the Origin check refuses.
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    res
}

/// The page `make` builds, for a caller who may read; else the way to `/login` and back to
/// `here`.
fn gated(who: Result<Authed, Response>, here: &str, make: impl FnOnce(&str) -> String) -> Response {
    match who {
        Ok(a) if a.require(super::auth::Scope::Read).is_ok() => {
            let nonce = page::nonce();
            let body = make(&nonce);
            html(&nonce, body)
        }
        Ok(_) => {
            let nonce = page::nonce();
            let body = page::login_html(
                &nonce,
                Some("this token lacks the `read` scope: sign in with another"),
                here,
            );
            let mut res = html(&nonce, body);
            *res.status_mut() = StatusCode::FORBIDDEN;
            res
        }
        Err(_) => Redirect::to(&format!("/login?next={}", encode(here))).into_response(),
    }
}

/// A path as a query value: all but unreserved characters and `/` percent-encoded.
fn encode(s: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

async fn home(who: Result<Authed, Response>) -> Response {
    gated(who, "/", live::home_html)
}

async fn inbox(who: Result<Authed, Response>) -> Response {
    gated(who, "/inbox", |n| inbox_page::inbox_html(n, None))
}

async fn inbox_item(who: Result<Authed, Response>, Path(id): Path<String>) -> Response {
    let here = format!("/inbox/{id}");
    gated(who, &here, |n| inbox_page::inbox_html(n, Some(&id)))
}

async fn run(who: Result<Authed, Response>, Path(id): Path<String>) -> Response {
    let here = format!("/runs/{id}");
    gated(who, &here, |n| live::run_html(n, &id))
}

async fn batch(who: Result<Authed, Response>, Path(name): Path<String>) -> Response {
    let here = format!("/batches/{name}");
    gated(who, &here, |n| live::batch_html(n, &name))
}

#[derive(serde::Deserialize)]
struct LoginQuery {
    #[serde(default)]
    next: Option<String>,
}

async fn login(Query(q): Query<LoginQuery>) -> Response {
    let nonce = page::nonce();
    let next = q
        .next
        .filter(|n| n.starts_with('/') && !n.starts_with("//") && !n.contains('\\'))
        .unwrap_or_else(|| "/".to_string());
    let body = page::login_html(&nonce, None, &next);
    html(&nonce, body)
}
