//! `switchyard serve` (SPEC §15): the inbox, runs and batches of one store over HTTP — the
//! JSON API under `/v1` (`api.rs`), server-sent events of runs and batches (`events.rs`), and
//! the pages (`pages.rs`), all behind the checks of `auth.rs` (tokens and scopes, sessions,
//! `Origin` and `Host`).
//!
//! The server holds no state a second `serve` on the same store would need: decisions are
//! the store's transactions, runs are the store's records. What it keeps in memory is the
//! UI's sessions and the runs it started or continues itself. After a decision, a run of
//! this machine's store is continued here, in the background ([`Work::continue_items`]); a
//! submitted run was queued again for the workers by the store, and no agent code runs here
//! for it. Expired items are settled every few seconds ([`settle`]).

pub mod api;
pub mod auth;
pub mod events;
pub mod pages;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::record::inbox::InboxItem;
use crate::store::any::AnyStore;

/// How often expired items are looked for.
pub const SETTLE_EVERY: Duration = Duration::from_secs(3);

/// How many runs are continued here at once.
const CONTINUE_AT_ONCE: usize = 4;

/// What every handler reads: the store, who may ask, the directory flows are started from.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<AnyStore>,
    pub auth: Arc<auth::Auth>,
    /// `--root`, canonical: `POST /v1/runs` starts flow files under it only, and continued
    /// runs' flows may not leave it.
    pub root: PathBuf,
    pub work: Arc<Work>,
}

impl AppState {
    /// The state of a server over `store`; its background work starts with [`serve`].
    pub fn new(store: Arc<AnyStore>, auth: auth::Auth, root: PathBuf) -> (AppState, Background) {
        let (tx, rx) = mpsc::unbounded_channel();
        let work = Arc::new(Work {
            continuing: tx,
            starting: Mutex::default(),
            stopping: CancellationToken::new(),
            closing: CancellationToken::new(),
            tasks: tokio_util::task::TaskTracker::new(),
        });
        (
            AppState {
                store,
                auth: Arc::new(auth),
                root,
                work,
            },
            Background { continuing: rx },
        )
    }
}

/// The runs this server runs itself: continued after a decision or an expiry, or started by
/// `POST /v1/runs`.
pub struct Work {
    continuing: mpsc::UnboundedSender<Vec<InboxItem>>,
    /// Idempotency keys whose run is being started here.
    pub(crate) starting: Mutex<HashSet<String>>,
    /// Cancelled when the server stops: runs in flight pause at their next recorded point.
    pub(crate) stopping: CancellationToken,
    /// Cancelled when the server is told to stop: event streams end, so that the requests
    /// in flight can finish.
    pub(crate) closing: CancellationToken,
    pub(crate) tasks: tokio_util::task::TaskTracker,
}

impl Work {
    /// Continues the root runs of `items` (answered or expired) in the background: runs of
    /// this machine's store here, submitted runs are the workers'.
    pub fn continue_items(&self, items: Vec<InboxItem>) {
        if !items.is_empty() && self.continuing.send(items).is_err() {
            tracing::warn!("the server is stopping: answered runs are left for `switchyard resume`");
        }
    }

    /// Whether the server is stopping.
    pub fn stopping(&self) -> bool {
        self.stopping.is_cancelled()
    }
}

/// The receiving end of [`Work::continue_items`], run by [`serve`].
pub struct Background {
    continuing: mpsc::UnboundedReceiver<Vec<InboxItem>>,
}

/// Every route: the API, the events, the pages, login and `/healthz`, behind [`auth::guard`].
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/login", post(auth::login))
        .route("/logout", post(auth::logout))
        .merge(api::routes())
        .merge(events::routes())
        .merge(pages::routes())
        .layer(from_fn_with_state(state.clone(), auth::guard))
        .with_state(state)
}

/// Serves `state` on `listener` until `shutdown`; then the runs in flight here pause at
/// their next recorded point and are waited for.
pub async fn serve(
    state: AppState,
    background: Background,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let work = state.work.clone();
    let continuing = tokio::spawn(continue_loop(state.clone(), background));
    let settling = tokio::spawn(settle(state.clone(), shutdown.clone()));
    let served = axum::serve(listener, router(state))
        .with_graceful_shutdown({
            let (shutdown, work) = (shutdown.clone(), work.clone());
            async move {
                shutdown.cancelled().await;
                work.closing.cancel();
            }
        })
        .await;
    work.stopping.cancel();
    settling.abort();
    continuing.abort();
    work.tasks.close();
    work.tasks.wait().await;
    served
}

async fn continue_loop(state: AppState, mut background: Background) {
    while let Some(items) = background.continuing.recv().await {
        let (store, root) = (state.store.clone(), state.root.clone());
        state.work.tasks.spawn(async move {
            for (run, how) in crate::inbox::continue_runs(&store, &items, CONTINUE_AT_ONCE, Some(root)).await
            {
                match how {
                    crate::inbox::Continued::Ran(o) => {
                        tracing::info!(run_id = %run, status = o.status.as_str(), "continued the run")
                    }
                    crate::inbox::Continued::Queued => {
                        tracing::info!(run_id = %run, "queued for the workers")
                    }
                    crate::inbox::Continued::Elsewhere(why) => {
                        tracing::info!(run_id = %run, "not continued here: {why}")
                    }
                    crate::inbox::Continued::Failed(why) => {
                        tracing::warn!(run_id = %run, "could not continue the run: {why}")
                    }
                }
            }
        });
    }
}

/// Every [`SETTLE_EVERY`]: marks the items whose expiry passed and continues their runs.
async fn settle(state: AppState, shutdown: CancellationToken) {
    loop {
        match crate::inbox::settle_expired(&*state.store).await {
            Ok(items) => {
                if !items.is_empty() {
                    tracing::info!("{} inbox item(s) expired", items.len());
                }
                state.work.continue_items(items);
            }
            Err(e) => tracing::warn!("could not settle expired inbox items: {e}"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(SETTLE_EVERY) => {}
        }
    }
}
