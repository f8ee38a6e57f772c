//! The MCP protocol, from the official Rust SDK (`rmcp`): the one file of the server side that
//! knows it. It turns [`Server`]'s tools and answers into the SDK's types, sends progress
//! notifications, and gives the two transports: stdio, and the Streamable HTTP service that
//! `http.rs` mounts at `/mcp` (the 2025-11-25 handshake with sessions, and the stateless
//! 2026-07-28 revision, both as the SDK serves them).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData, Implementation,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::{Peer, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ServerHandler, ServiceExt};
use tokio_util::sync::CancellationToken;

use super::{Answer, Progress, Server, ToolDef};

/// [`Server`] as the SDK's handler, with the token cancelled when a stdio client closes stdin
/// (never, over HTTP, where each request's own token says the client went away).
#[derive(Clone)]
struct Handler(Arc<Server>, CancellationToken);

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("switchyard", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Each tool runs a Switchyard flow. A run that stops for a human answers with its run_id and \
                 what it waits for: continue it with switchyard_run_resume, look at it with switchyard_run_status.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.0.tools().into_iter().map(tool).collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.0.tools().into_iter().find(|t| t.name == name).map(tool)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let progress = context.meta.get_progress_token().map(|token| Notifier {
            peer: context.peer.clone(),
            token,
        });
        // The run is cancelled when the client cancels the request or closes the session.
        let cancel = self.1.child_token();
        let watch = {
            let (request, run) = (context.ct.clone(), cancel.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = request.cancelled() => run.cancel(),
                    () = run.cancelled() => {}
                }
            })
        };
        let answer = self
            .0
            .call(
                &request.name,
                request.arguments,
                progress.as_ref().map(|p| p as &dyn Progress),
                cancel,
            )
            .await;
        watch.abort();
        let answer = answer
            .map_err(|unknown| ErrorData::invalid_params(format!("unknown tool `{}`", unknown.0), None))?;
        Ok(result(answer).into())
    }
}

/// Progress notifications for one request's token.
struct Notifier {
    peer: Peer<RoleServer>,
    token: ProgressToken,
}

impl Progress for Notifier {
    fn step(&self, done: u64, message: String) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let param = ProgressNotificationParam::new(self.token.clone(), done as f64).with_message(message);
            if let Err(e) = self.peer.notify_progress(param).await {
                tracing::debug!("a progress notification was not sent: {e}");
            }
        })
    }
}

fn tool(def: ToolDef) -> Tool {
    let mut t = Tool::new(
        def.name,
        def.description.unwrap_or_default(),
        Arc::new(def.input_schema),
    );
    if let Some(out) = def.output_schema {
        t = t.with_raw_output_schema(Arc::new(out));
    }
    t
}

fn result(answer: Answer) -> CallToolResult {
    let content = vec![ContentBlock::text(answer.text)];
    let mut r = if answer.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    r.structured_content = answer.structured;
    r
}

/// Serves over stdin and stdout until the client closes stdin. A client that closes it with a
/// call in flight has gone: that call's run is cancelled at once (not only after the SDK's
/// drain), and this returns once every run has recorded its end.
pub async fn serve_stdio(server: Arc<Server>) -> Result<(), String> {
    let gone = CancellationToken::new();
    let (stdin, stdout) = rmcp::transport::stdio();
    let stdin = EofWatch {
        inner: stdin,
        gone: gone.clone(),
    };
    let running = Handler(server.clone(), gone.clone())
        .serve((stdin, stdout))
        .await
        .map_err(|e| format!("the MCP session did not start: {e}"))?;
    let ended = running
        .waiting()
        .await
        .map(|_| ())
        .map_err(|e| format!("the MCP session ended badly: {e}"));
    gone.cancel();
    server.drained().await;
    ended
}

/// Stdin that tells when it ends.
struct EofWatch<R> {
    inner: R,
    gone: CancellationToken,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for EofWatch<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, std::task::Poll::Ready(Ok(())))
            && buf.filled().len() == before
            && buf.remaining() > 0
        {
            self.gone.cancel();
        }
        polled
    }
}

/// The Streamable HTTP service mounted at `/mcp`. `hosts`: the `Host` values accepted
/// (`None`: any, for a non-loopback bind). Stopped with `shutdown`.
pub(super) fn http_router(
    server: Arc<Server>,
    hosts: Option<Vec<String>>,
    shutdown: CancellationToken,
) -> axum::Router {
    let mut config = StreamableHttpServerConfig::default().with_cancellation_token(shutdown);
    config = match hosts {
        Some(h) => config.with_allowed_hosts(h),
        None => config.disable_allowed_hosts(),
    };
    let handler = Handler(server, CancellationToken::new());
    let service: StreamableHttpService<Handler, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(handler.clone()), Arc::default(), config);
    axum::Router::new().nest_service("/mcp", service)
}
