//! `switchyard mcp serve FLOW...`: the flows as the tools of MCP clients (SPEC §14), over
//! stdio (stdout carries the protocol only; everything else goes to stderr) or Streamable
//! HTTP (`--http`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use super::common::StoreArg;
use super::stderr::{self, Level};
use crate::api::Switchyard;
use crate::model::AgentKind;
use crate::runtime::engine::RunOptions;
use crate::serve::mcp::{Server, http};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Each flow is a tool named after its `flow:` name, with its `description`, its \
`input.schema` as the tool's inputSchema and its `output.schema` as its outputSchema. A call runs the flow on \
the store and answers with its output (structuredContent and the same JSON as text), or isError with the \
error's kind and message. A run that stops for a human answers {run_id, status: \"interrupted\", waiting_for}; \
the tools switchyard_run_status and switchyard_run_resume look at it and continue it. Runs are recorded with \
origin `mcp`.\n\n\
Over HTTP the endpoint is /mcp (the 2025-11-25 handshake and the stateless 2026-07-28 revision). A request \
whose Origin is not a loopback one (nor --allow-origin) is refused with 403; with --token-file, one without \
`Authorization: Bearer <token>` with 401. The address is loopback unless --bind.\n\n\
Over HTTP, Ctrl-C or SIGTERM stops the server: the runs in flight stop at their next recorded point, \
stay `running` and answer their calls that switchyard_run_resume continues them; a second Ctrl-C quits at once.\n\n\
Exit status: 0 when the client closed the session (stdio) or the server was stopped (Ctrl-C, SIGTERM), 1 when \
serving failed, 2 a broken flow or usage, 130 quit by a second Ctrl-C."
)]
pub struct Args {
    /// The flow files to serve, one tool each.
    #[arg(required = true, value_name = "FLOW")]
    pub flows: Vec<PathBuf>,
    /// Serve Streamable HTTP at this address (`127.0.0.1:8931`; port 0 picks one, told on
    /// stderr) instead of stdio.
    #[arg(long, value_name = "ADDR", value_parser = super::common::parse_addr)]
    pub http: Option<SocketAddr>,
    /// A file holding the bearer token HTTP requests must carry (whitespace around it ignored).
    #[arg(long, value_name = "FILE", requires = "http")]
    pub token_file: Option<PathBuf>,
    /// An origin (`https://app.example.com`) whose requests are taken besides loopback ones;
    /// repeat for more, `*` for any.
    #[arg(long, value_name = "ORIGIN", requires = "http")]
    pub allow_origin: Vec<String>,
    /// Listen on the non-loopback address --http names (needs --token-file).
    #[arg(long, requires = "http")]
    pub bind: bool,
    /// The project root that file paths may not leave; default each flow's directory.
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Agent kinds the runs may use (comma-separated), intersected with every flow's `allow`.
    #[arg(long, value_delimiter = ',')]
    pub allow: Option<Vec<String>>,
    /// Hosts `http` and `llm` agents may reach (comma-separated), on top of every flow's
    /// `allow_hosts`.
    #[arg(long, value_delimiter = ',', value_name = "HOSTS")]
    pub allow_hosts: Option<Vec<String>>,
    #[command(flatten)]
    pub store: StoreArg,
}

pub fn run(args: Args) -> u8 {
    let mut flows = Vec::new();
    let mut broken = false;
    for path in &args.flows {
        match super::graph::load_flow(path, args.root.clone()) {
            Some(f) => flows.push(f),
            None => broken = true,
        }
    }
    if broken {
        return super::exit::USAGE;
    }
    let options = match run_options(&args) {
        Ok(o) => o,
        Err(e) => return super::common::fail(e),
    };
    let token = match &args.token_file {
        None => None,
        Some(path) => match std::fs::read_to_string(path) {
            Ok(t) if !t.trim().is_empty() => Some(t.trim().to_string()),
            Ok(_) => return super::common::fail(format!("--token-file `{}` holds no token", path.display())),
            Err(e) => {
                return super::common::fail(format!("cannot read --token-file `{}`: {e}", path.display()));
            }
        },
    };
    if let Some(addr) = &args.http
        && !http::is_loopback(addr)
    {
        if !args.bind {
            return super::common::fail(format!(
                "--http {addr} is not a loopback address: pass --bind to listen there (with --token-file)"
            ));
        }
        if token.is_none() {
            return super::common::fail(format!(
                "--http {addr} --bind listens beyond this machine: give a token with --token-file"
            ));
        }
    }
    let rt = super::common::runtime();
    let store = match rt.block_on(args.store.open()) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            stderr::error(e);
            return args.store.open_failed();
        }
    };
    let checks = Switchyard::with_store(store.clone());
    for flow in &flows {
        if let Err(e) = checks.check(flow, &options) {
            return super::common::fail(format!("flow `{}` cannot run here: {e}", flow.name()));
        }
    }
    drop(checks);
    let server = match Server::new(flows, store.clone(), options) {
        Ok(s) => Arc::new(s),
        Err(problems) => {
            for p in problems {
                stderr::error(p);
            }
            return super::exit::USAGE;
        }
    };
    let code = match args.http {
        None => {
            tracing::info!("serving {} flow(s) over stdio", server.flows().count());
            match rt.block_on(crate::serve::mcp::serve_stdio(server)) {
                Ok(()) => super::exit::OK,
                Err(e) => {
                    stderr::error(e);
                    super::exit::FAILED
                }
            }
        }
        Some(addr) => {
            let options = http::HttpOptions {
                token,
                allow_origins: args.allow_origin.clone(),
                any_host: args.bind,
            };
            rt.block_on(serve_http(server, addr, options))
        }
    };
    if let Ok(store) = Arc::try_unwrap(store) {
        rt.block_on(store.close());
    }
    code
}

async fn serve_http(server: Arc<Server>, addr: SocketAddr, options: http::HttpOptions) -> u8 {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            stderr::error(format!("cannot listen on {addr}: {e}"));
            return super::exit::FAILED;
        }
    };
    let local = listener.local_addr().unwrap_or(addr);
    stderr::say(
        Level::Info,
        "mcp_serving",
        &format!(
            "serving {} flow(s) at http://{local}/mcp (Ctrl-C stops)",
            server.flows().count()
        ),
        serde_json::json!({"url": format!("http://{local}/mcp")}),
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    let (stop, stopping) = (shutdown.clone(), server.clone());
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        signalled(&mut term).await;
        stderr::say(
            Level::Warn,
            "mcp_stopping",
            "stopping: the runs in flight stop at their next recorded point (Ctrl-C again to quit now)",
            serde_json::Value::Null,
        );
        stopping.stop_runs();
        tokio::select! {
            () = stopping.drained() => {}
            () = signalled(&mut term) => {
                stderr::say(
                    Level::Warn,
                    "quit",
                    "quit: runs still in flight are left `running`: `switchyard resume RUN_ID` continues them",
                    serde_json::Value::Null,
                );
                // exit skips destructors: the MCP servers the flows call are ended here, commands'
                // directories removed.
                crate::agents::mcp::shutdown();
                crate::agents::command::remove_live_dirs();
                std::process::exit(130);
            }
        }
        stop.cancel();
    });
    let served = http::serve(server.clone(), listener, options, shutdown).await;
    drop(server);
    match served {
        Ok(()) => super::exit::OK,
        Err(e) => {
            stderr::error(format!("serving on {local} failed: {e}"));
            super::exit::FAILED
        }
    }
}

/// Ctrl-C or SIGTERM.
async fn signalled(term: &mut Option<tokio::signal::unix::Signal>) {
    let terminated = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminated => {}
    }
}

/// The run options `--allow` and `--allow-hosts` give.
fn run_options(args: &Args) -> Result<RunOptions, String> {
    let mut options = RunOptions::default();
    if let Some(kinds) = &args.allow {
        let kinds = kinds
            .iter()
            .filter(|k| !k.trim().is_empty())
            .map(|k| {
                AgentKind::parse(k.trim()).ok_or_else(|| {
                    let all: Vec<&str> = AgentKind::ALL.iter().map(|k| k.as_str()).collect();
                    format!("--allow: unknown agent kind `{k}` (kinds: {})", all.join(", "))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        options = options.allow(kinds);
    }
    if let Some(hosts) = &args.allow_hosts {
        options = options.allow_hosts(
            hosts
                .iter()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty()),
        );
    }
    Ok(options)
}
