//! Server-sent events of a run and of a batch (SPEC §15): the store polled every
//! [`POLL`], each newly recorded step and the status sent as it changes, the stream ended
//! when the run (or the batch) ends.

use std::time::Duration;

use axum::Router;

use super::AppState;

/// How often the store is read for news.
pub const POLL: Duration = Duration::from_millis(250);

/// `GET /v1/runs/{id}/events` and `GET /v1/batches/{name}/events`.
pub fn routes() -> Router<AppState> {
    Router::new()
}
