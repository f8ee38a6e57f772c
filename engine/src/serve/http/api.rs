//! The JSON API under `/v1` (SPEC §15): the inbox (groups, one item, a decision, bulk), the
//! decisions' log, runs and batches, starting a run. Each handler takes the caller
//! ([`Authed`]) and checks its scope first; errors are `{"error": ...}` with the status the
//! SPEC names.

use axum::Router;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// The `/v1` routes.
pub fn routes() -> Router<AppState> {
    Router::new()
}

/// `GET /healthz`: `ok` while the server serves.
pub async fn healthz() -> Response {
    "ok\n".into_response()
}
