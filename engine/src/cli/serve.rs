//! `switchyard serve`: the inbox, runs and batches of a store over HTTP (SPEC §15): the JSON
//! API under `/v1`, server-sent events and the pages.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use super::common::StoreArg;
use super::stderr::{self, Level};
use crate::serve::http::{self, AppState, auth};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Without --tokens the server listens on loopback only and lets every request in: \
decisions are recorded under the OS user ($USER). With --tokens FILE, each request needs a token: \
`Authorization: Bearer SECRET` (API clients, recorded via `api`) or a session from `POST /login` (the \
pages, via `ui`). The file holds one token a line, `NAME SCOPES sha256:HEX`: the name decisions are \
recorded under, scopes from read,decide,run (comma-separated), and the SHA-256 of the secret in hex \
(`printf %s SECRET | sha256sum`); `#` starts a comment line.\n\n\
Every POST whose Origin is present and not this server's own is refused with 403. On loopback, a request \
for another Host is refused too.\n\n\
After a decision, a run of this store is continued here (after the answer is sent); a submitted run \
(PostgreSQL) is queued again for the workers, and no agent code runs here for it. Expired items are \
settled every few seconds.\n\n\
Ctrl-C or SIGTERM stops the server: runs continuing here stop at their next recorded point and stay \
resumable. Exit status: 0 stopped, 1 serving failed, 2 usage."
)]
pub struct Args {
    /// The address to listen on; port 0 picks one (told on stderr).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8787", value_parser = super::common::parse_addr)]
    pub http: SocketAddr,
    /// The tokens file (see below); needed for a non-loopback address.
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// The directory `POST /v1/runs` starts flow files from (they may not leave it); default
    /// the current directory.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Listen on every interface at --http's port (needs --tokens).
    #[arg(long)]
    pub bind_any: bool,
    #[command(flatten)]
    pub store: StoreArg,
}

pub fn run(args: Args) -> u8 {
    let tokens = match &args.tokens {
        None => None,
        Some(path) => {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => {
                    return super::common::fail(format!("cannot read --tokens `{}`: {e}", path.display()));
                }
            };
            match auth::Tokens::parse(&text, &path.display().to_string()) {
                Ok(t) => Some(t),
                Err(problems) => {
                    for p in problems {
                        stderr::error(p);
                    }
                    return super::exit::USAGE;
                }
            }
        }
    };
    let addr = if args.bind_any {
        SocketAddr::from(([0, 0, 0, 0], args.http.port()))
    } else {
        args.http
    };
    let loopback = addr.ip().is_loopback();
    if !loopback && tokens.is_none() {
        return super::common::fail(format!(
            "--http {addr} listens beyond this machine: give tokens with --tokens FILE"
        ));
    }
    let root = args.root.clone().unwrap_or_else(|| PathBuf::from("."));
    let root = match std::fs::canonicalize(&root) {
        Ok(r) if r.is_dir() => r,
        Ok(_) => return super::common::fail(format!("--root `{}` is not a directory", root.display())),
        Err(e) => return super::common::fail(format!("--root `{}`: {e}", root.display())),
    };
    let rt = super::common::runtime();
    let store = match rt.block_on(args.store.open()) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            stderr::error(e);
            return args.store.open_failed();
        }
    };
    let (state, background) = AppState::new(store.clone(), auth::Auth::new(tokens, loopback), root);
    let code = rt.block_on(serve(state, background, addr));
    if let Ok(store) = Arc::try_unwrap(store) {
        rt.block_on(store.close());
    }
    code
}

async fn serve(state: AppState, background: http::Background, addr: SocketAddr) -> u8 {
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
        "serving",
        &format!("serving at http://{local}/ (Ctrl-C stops)"),
        serde_json::json!({"url": format!("http://{local}/")}),
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
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
        stderr::say(
            Level::Warn,
            "stopping",
            "stopping: runs continuing here stop at their next recorded point",
            serde_json::Value::Null,
        );
        stop.cancel();
    });
    match http::serve(state, background, listener, shutdown).await {
        Ok(()) => super::exit::OK,
        Err(e) => {
            stderr::error(format!("serving on {local} failed: {e}"));
            super::exit::FAILED
        }
    }
}
