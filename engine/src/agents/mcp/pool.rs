//! The process's MCP servers: one running server per definition ([`McpServerPlan::key`]),
//! started at its first use and shared by every run, item and step of the process; its
//! `tools/list` read once; restarted when it died, a bounded number of times; and all of them
//! ended together by [`shutdown`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::process::ServerProcess;
use super::sdk::{self, Client, ToolInfo};
use crate::agents::net::Secrets;
use crate::plan::{McpServerPlan, McpTransport, Schema};

/// Restarts of a server that died before its calls fail for good.
pub const MAX_RESTARTS: u32 = 3;
/// How long starting a server (its handshake) may take.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `tools/list` may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// A live session with a server.
pub struct Connection {
    pub client: Client,
    /// A stdio server's process; none over HTTP.
    pub process: Option<Arc<ServerProcess>>,
    /// The values its `env:` and `headers:` resolved to, kept out of results and errors.
    pub secrets: Secrets,
}

impl Connection {
    /// Why the server is gone, when it is: how its process ended and its stderr's tail.
    pub fn gone(&self) -> Option<String> {
        if !self.client.is_closed() && self.process.as_ref().is_none_or(|p| p.exited().is_none()) {
            return None;
        }
        Some(self.describe_end())
    }

    /// Waits a moment for a stdio server whose connection closed to be seen exiting, so that
    /// what is told of its end says how.
    pub async fn settle(&self) {
        let Some(p) = &self.process else { return };
        for _ in 0..50 {
            if p.exited().is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// How the server's process ended (or that the connection closed), with its stderr.
    pub fn describe_end(&self) -> String {
        let (how, tail) = self.end_parts();
        if tail.is_empty() {
            how
        } else {
            format!("{how}; its stderr ended with: {tail}")
        }
    }

    /// How the server ended, and the tail of its stderr (secrets redacted; empty over HTTP).
    pub fn end_parts(&self) -> (String, String) {
        match &self.process {
            Some(p) => (
                p.exited().unwrap_or_else(|| "closed the connection".into()),
                self.secrets.redact(&p.stderr_tail()),
            ),
            None => ("closed the connection".into(), String::new()),
        }
    }
}

/// Why a server cannot be used.
#[derive(Debug)]
pub enum Unavailable {
    /// It could not be started or reached: a call never reached it (worth retrying).
    Start(String),
    /// It died too often, or its tools cannot be listed.
    Broken(String),
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::Start(m) | Unavailable::Broken(m) => f.write_str(m),
        }
    }
}

/// One server of the process.
struct Slot {
    state: tokio::sync::Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    connection: Option<Arc<Connection>>,
    /// Times it was started again after dying, and starts that failed.
    restarts: u32,
    /// Why it is no longer started, once it died (or failed to start) more than
    /// [`MAX_RESTARTS`] times.
    given_up: Option<String>,
    tools: Option<Arc<Tools>>,
}

/// A server's tools, as listed once, with their schemas compiled.
pub struct Tools {
    pub list: Vec<ToolInfo>,
    pub inputs: HashMap<String, Option<Arc<Schema>>>,
    pub outputs: HashMap<String, Option<Arc<Schema>>>,
}

impl Tools {
    pub fn get(&self, name: &str) -> Option<&ToolInfo> {
        self.list.iter().find(|t| t.name == name)
    }
}

#[derive(Default)]
struct Pool {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Every process started, ended by [`shutdown`] whatever became of its slot.
    processes: Mutex<Vec<Arc<ServerProcess>>>,
    /// Set by [`shutdown`]: nothing is started after it.
    closed: AtomicBool,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(Pool::default)
}

fn slot(plan: &McpServerPlan) -> Arc<Slot> {
    let mut slots = pool().slots.lock().unwrap_or_else(|e| e.into_inner());
    slots
        .entry(plan.key.clone())
        .or_insert_with(|| {
            Arc::new(Slot {
                state: tokio::sync::Mutex::new(SlotState::default()),
            })
        })
        .clone()
}

/// The server's live connection: the one there is, or a new one when there was none or it
/// died (counted against [`MAX_RESTARTS`]).
pub async fn connection(plan: &McpServerPlan) -> Result<Arc<Connection>, Unavailable> {
    let slot = slot(plan);
    let mut state = slot.state.lock().await;
    if let Some(why) = &state.given_up {
        return Err(Unavailable::Broken(why.clone()));
    }
    if let Some(c) = &state.connection {
        match c.gone() {
            None => return Ok(c.clone()),
            Some(why) => {
                state.restarts += 1;
                tracing::warn!(server = %plan.name, restarts = state.restarts, why = %why, "mcp server died");
                if state.restarts > MAX_RESTARTS {
                    let why = format!(
                        "MCP server `{}` died {} times and is not started again (last: {why})",
                        plan.name, state.restarts
                    );
                    state.given_up = Some(why.clone());
                    state.connection = None;
                    return Err(Unavailable::Broken(why));
                }
                state.connection = None;
            }
        }
    }
    if pool().closed.load(Ordering::SeqCst) {
        return Err(Unavailable::Start(format!(
            "MCP server `{}` is not started: the process is shutting down",
            plan.name
        )));
    }
    let started = match start(plan, false).await {
        Err(Unavailable::Start(why)) if sdk::wants_legacy(&why) => start(plan, true).await,
        other => other,
    };
    let c = match started {
        Ok(c) => c,
        // A server that cannot be started counts as one that died: past [`MAX_RESTARTS`] its
        // calls fail at once, rather than each waiting for a start of its own that fails.
        Err(e) => {
            state.restarts += 1;
            if state.restarts > MAX_RESTARTS {
                let why = format!(
                    "MCP server `{}` failed to start {} times and is not started again (last: {e})",
                    plan.name, state.restarts
                );
                state.given_up = Some(why);
            }
            return Err(e);
        }
    };
    let c = Arc::new(c);
    state.connection = Some(c.clone());
    Ok(c)
}

/// The protocol revision of the server's live session, if it has one (starts nothing).
pub fn protocol(plan: &McpServerPlan) -> Option<String> {
    let slot = slot(plan);
    let state = slot.state.try_lock().ok()?;
    state.connection.as_ref().map(|c| c.client.protocol())
}

/// The server's tools, listed once per process (a restarted server is not asked again).
pub async fn tools(plan: &McpServerPlan, c: &Connection) -> Result<Arc<Tools>, Unavailable> {
    let slot = slot(plan);
    let mut state = slot.state.lock().await;
    if let Some(t) = &state.tools {
        return Ok(t.clone());
    }
    let list = c.client.list_tools(LIST_TIMEOUT).await.map_err(|e| {
        Unavailable::Broken(format!(
            "MCP server `{}` did not list its tools: {}",
            plan.name,
            c.secrets.redact(&e.to_string())
        ))
    })?;
    let compile = |s: &Option<serde_json::Value>| match s {
        Some(v) => match Schema::new(v.clone()) {
            Ok(s) => Some(Arc::new(s)),
            Err(e) => {
                tracing::warn!(server = %plan.name, error = %e, "a tool's schema cannot be used; not checked");
                None
            }
        },
        None => None,
    };
    let inputs = list
        .iter()
        .map(|t| (t.name.clone(), compile(&Some(t.input_schema.clone()))))
        .collect();
    let outputs = list
        .iter()
        .map(|t| (t.name.clone(), compile(&t.output_schema)))
        .collect();
    let tools = Arc::new(Tools {
        list,
        inputs,
        outputs,
    });
    state.tools = Some(tools.clone());
    Ok(tools)
}

/// Starts (or reaches) the server; `legacy`: with the `initialize` handshake only.
async fn start(plan: &McpServerPlan, legacy: bool) -> Result<Connection, Unavailable> {
    let mut secrets = Secrets::default();
    let fail =
        |why: String| Unavailable::Start(format!("MCP server `{}` could not be started: {why}", plan.name));
    match &plan.transport {
        McpTransport::Stdio { argv, dir, env } => {
            let mut resolved = Vec::with_capacity(env.len());
            for (k, v) in env {
                let v = secrets
                    .resolve(v, &format!("`env.{k}`"))
                    .map_err(|e| fail(e.message))?;
                resolved.push((k.clone(), v));
            }
            let (process, stdout, stdin) = ServerProcess::start(argv, dir, &resolved)
                .map_err(|e| fail(format!("`{}` in {}: {e}", argv.join(" "), dir.display())))?;
            let process = Arc::new(process);
            pool()
                .processes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(process.clone());
            let client =
                match tokio::time::timeout(START_TIMEOUT, Client::over_pipes(stdout, stdin, legacy)).await {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => {
                        let c = secrets.redact(&e);
                        let tail = secrets.redact(&process.stderr_tail());
                        process.end();
                        let how = process.exited().unwrap_or_default();
                        return Err(fail(join([c, how, tail])));
                    }
                    Err(_) => {
                        process.end();
                        return Err(fail(format!("no handshake within {} s", START_TIMEOUT.as_secs())));
                    }
                };
            tracing::info!(server = %plan.name, pid = process.pid(), protocol = %client.protocol(), "mcp server started");
            Ok(Connection {
                client,
                process: Some(process),
                secrets,
            })
        }
        McpTransport::Http { url, headers } => {
            let mut resolved = Vec::with_capacity(headers.len());
            for (k, v) in headers {
                let v = secrets
                    .resolve(v, &format!("header `{k}`"))
                    .map_err(|e| fail(e.message))?;
                resolved.push((k.clone(), v));
            }
            let http = crate::agents::net::client().map_err(|e| fail(e.message))?;
            // The session lives on the sessions' runtime, so that `shutdown` can end it
            // (its `DELETE`) after the command's runtime is gone.
            let url_owned = url.clone();
            let session = sessions_runtime()
                .spawn(async move { Client::over_http(http, &url_owned, &resolved, legacy).await });
            let abort = session.abort_handle();
            let client = match tokio::time::timeout(START_TIMEOUT, session).await {
                Ok(Ok(Ok(c))) => c,
                Ok(Err(e)) => return Err(fail(format!("{url}: {e}"))),
                Ok(Ok(Err(e))) => return Err(fail(format!("{url}: {}", secrets.redact(&e)))),
                Err(_) => {
                    abort.abort();
                    return Err(fail(format!(
                        "{url}: no handshake within {} s",
                        START_TIMEOUT.as_secs()
                    )));
                }
            };
            tracing::info!(server = %plan.name, url = %url, protocol = %client.protocol(), "mcp server connected");
            Ok(Connection {
                client,
                process: None,
                secrets,
            })
        }
    }
}

fn join(parts: [String; 3]) -> String {
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// How long ending a Streamable HTTP session (its `DELETE`) may take at shutdown.
const SESSION_END_GRACE: Duration = Duration::from_secs(3);

/// The runtime Streamable HTTP sessions run on: its own thread, for the life of the process,
/// so that a session outlives the runtime of the command that opened it and is ended by
/// [`shutdown`].
fn sessions_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("mcp-sessions")
            .enable_all()
            .build()
            .expect("a tokio runtime starts")
    })
}

/// Ends each Streamable HTTP session: the session's transport closes, which sends the server
/// the `DELETE` with its session id (a server that keeps no session is told nothing).
fn end_sessions() {
    let slots: Vec<Arc<Slot>> = pool()
        .slots
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .cloned()
        .collect();
    if slots.is_empty() {
        return;
    }
    let end = async move {
        let mut ended = 0;
        for slot in slots {
            let Ok(mut state) = tokio::time::timeout(SESSION_END_GRACE, slot.state.lock()).await else {
                continue;
            };
            let Some(c) = state.connection.take_if(|c| c.process.is_none()) else {
                continue;
            };
            drop(state);
            match Arc::try_unwrap(c) {
                Ok(c) => c.client.close(SESSION_END_GRACE).await,
                // A call still holds it (the command was cut mid-call): ask it to end.
                Err(c) => c.client.cancel(),
            }
            ended += 1;
        }
        tracing::debug!(sessions = ended, "mcp sessions ended");
    };
    // On a thread of its own: `shutdown` may be called from inside another runtime.
    std::thread::scope(|s| {
        s.spawn(|| sessions_runtime().block_on(end));
    });
}

/// Ends every server the process started (Streamable HTTP sessions closed; stdio servers:
/// stdin closed, SIGTERM, SIGKILL of each group) and starts none after. Blocking, needs no
/// runtime; calling it again does nothing more.
pub fn shutdown() {
    pool().closed.store(true, Ordering::SeqCst);
    end_sessions();
    let processes = std::mem::take(&mut *pool().processes.lock().unwrap_or_else(|e| e.into_inner()));
    if processes.is_empty() {
        return;
    }
    // Each server's group is ended on its own thread: their grace periods overlap.
    std::thread::scope(|s| {
        for p in &processes {
            s.spawn(|| p.end());
        }
    });
    tracing::debug!(servers = processes.len(), "mcp servers ended");
}

/// Ends the servers when dropped: what a command holds for as long as it may start any, so
/// that none outlives it, whichever way it ends.
pub struct ShutdownGuard(());

impl ShutdownGuard {
    pub fn new() -> ShutdownGuard {
        ShutdownGuard(())
    }
}

impl Default for ShutdownGuard {
    fn default() -> Self {
        ShutdownGuard::new()
    }
}

impl Drop for ShutdownGuard {
    fn drop(&mut self) {
        shutdown();
    }
}
