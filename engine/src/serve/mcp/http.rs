//! `mcp serve --http`: the Streamable HTTP endpoint `/mcp`, behind two checks made before the
//! protocol sees a request. A request whose `Origin` is present and is neither a loopback
//! origin nor one of `--allow-origin` is refused with 403 (a web page the user visits must not
//! reach tools on their machine); with a token, a request without `Authorization: Bearer
//! <token>` is refused with 401.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;

use super::Server;
use crate::serve::http::auth::{bearer, same};

/// How the endpoint is guarded.
#[derive(Clone, Debug, Default)]
pub struct HttpOptions {
    /// The bearer token every request must carry (`--token-file`).
    pub token: Option<String>,
    /// Origins allowed besides loopback ones (`--allow-origin`), as `scheme://host[:port]`;
    /// `*` allows every origin.
    pub allow_origins: Vec<String>,
    /// Listening on an address other than loopback (`--bind`): any `Host` is taken.
    pub any_host: bool,
}

/// How long answers already made have to reach their clients once the server stops, before
/// the sessions still open (a client's standing event stream) are closed.
const ANSWERS_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves `server` on `listener` until `shutdown` is cancelled: then no connection is taken,
/// the answers under way are written, and the sessions left are closed.
pub async fn serve(
    server: Arc<Server>,
    listener: tokio::net::TcpListener,
    options: HttpOptions,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let hosts = (!options.any_host).then(|| vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]);
    let sessions = CancellationToken::new();
    let router = super::sdk::http_router(server, hosts, sessions.clone())
        .layer(from_fn_with_state(Arc::new(options), guard));
    let closing = sessions.clone();
    let stopped = shutdown.clone();
    tokio::spawn(async move {
        stopped.cancelled().await;
        tokio::time::sleep(ANSWERS_GRACE).await;
        closing.cancel();
    });
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await;
    sessions.cancel();
    served
}

/// Whether an address is a loopback one (what `--http` may name without `--bind`).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

async fn guard(State(options): State<Arc<HttpOptions>>, request: Request, next: Next) -> Response {
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let allowed = origin
            .to_str()
            .is_ok_and(|o| origin_allowed(o, &options.allow_origins));
        if !allowed {
            tracing::warn!(origin = ?origin, "refused a request from another origin");
            return (
                StatusCode::FORBIDDEN,
                "forbidden: requests from this Origin are refused (mcp serve --allow-origin allows one)\n",
            )
                .into_response();
        }
    }
    if let Some(token) = &options.token {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer);
        if !given.is_some_and(|g| same(g.as_bytes(), token.as_bytes())) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "unauthorized: send the token as `Authorization: Bearer <token>`\n",
            )
                .into_response();
        }
    }
    next.run(request).await
}

/// A loopback origin (`http://localhost:3000`, `http://127.0.0.1`, `http://[::1]:8080`), or
/// one `allowed` names exactly (a trailing `/` ignored), or any with `*`.
fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    let origin = origin.trim().trim_end_matches('/');
    if allowed
        .iter()
        .any(|a| a == "*" || a.trim_end_matches('/').eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    if !matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https") {
        return false;
    }
    let host = match rest.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or("", |(h, _)| h),
        None => rest.split(':').next().unwrap_or(""),
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_origins_pass_and_others_need_a_flag() {
        for o in [
            "http://localhost:3000",
            "http://127.0.0.1",
            "https://[::1]:8443/",
            "http://127.0.0.2:1",
        ] {
            assert!(origin_allowed(o, &[]), "{o}");
        }
        for o in [
            "https://evil.example",
            "http://localhost.evil.example",
            "null",
            "file://localhost",
            "http://[::2]",
        ] {
            assert!(!origin_allowed(o, &[]), "{o}");
        }
        let allowed = vec!["https://app.example.com/".to_string()];
        assert!(origin_allowed("https://app.example.com", &allowed));
        assert!(!origin_allowed("https://app.example.com:8443", &allowed));
        assert!(origin_allowed("null", &["*".to_string()]));
    }

    #[test]
    fn bearer_tokens_are_read_in_any_case_and_compared_whole() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd") && !same(b"abc", b"abcd"));
    }
}
