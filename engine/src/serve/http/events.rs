//! Server-sent events of a run and of a batch (SPEC §15): the store polled every [`POLL`],
//! so that a run recorded by any process (a worker, another `serve`) is seen. A run's stream
//! sends a `step` event for each step record that is new or changed (an attempt that
//! started, then its outcome) and a `status` event when the run's status changes; it ends
//! after the status a run ends with (`succeeded`, `failed`, `interrupted`, `cancelled`). A
//! batch's stream sends `counts` when they change and ends when no item is queued or
//! running. Both end when the server stops.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use futures_util::Stream;
use serde_json::{Value, json};

use super::AppState;
use super::auth::{Authed, Scope, error};
use crate::record::{RunStatus, StepRecord};
use crate::store::{Store, StoreError};

/// How often the store is read for news.
pub const POLL: Duration = Duration::from_millis(250);

/// `GET /v1/runs/{id}/events` and `GET /v1/batches/{name}/events`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/runs/{id}/events", get(run_events))
        .route("/v1/batches/{name}/events", get(batch_events))
}

/// What a stream polls for.
enum Watched {
    Run {
        id: String,
        /// (number, attempt, iteration) → the status last sent.
        sent: HashMap<(String, u32, Option<u64>), &'static str>,
        status: Option<RunStatus>,
    },
    Batch {
        name: String,
        counts: Option<Value>,
    },
}

struct Watch {
    state: AppState,
    what: Watched,
    pending: VecDeque<Event>,
    done: bool,
    first: bool,
}

impl Watch {
    fn new(state: AppState, what: Watched) -> Watch {
        Watch {
            state,
            what,
            pending: VecDeque::new(),
            done: false,
            first: true,
        }
    }

    fn push(&mut self, name: &str, data: &Value) {
        self.pending
            .push_back(Event::default().event(name).data(data.to_string()));
    }

    async fn poll(&mut self) -> Result<(), StoreError> {
        let store = self.state.store.clone();
        match &mut self.what {
            Watched::Run { id, sent, status } => {
                // The record first: when it has ended, every step it took is recorded.
                let record = match store.get_run(id).await {
                    Ok(r) => r,
                    Err(StoreError::NotFound(_)) => return Ok(()),
                    Err(e) => return Err(e),
                };
                let steps = store.steps(id).await?;
                let mut news = Vec::new();
                for s in &steps {
                    let key = (s.number.clone(), s.attempt, s.iteration);
                    let now = s.status.as_str();
                    if sent.get(&key) != Some(&now) {
                        sent.insert(key, now);
                        news.push(step_json(s));
                    }
                }
                let changed = *status != Some(record.status);
                *status = Some(record.status);
                let ended = !matches!(record.status, RunStatus::Queued | RunStatus::Running);
                let mut status_json = json!({"run_id": record.id, "status": record.status.as_str()});
                if let Some(e) = &record.error {
                    status_json["error"] = serde_json::to_value(e).unwrap_or(Value::Null);
                }
                if ended && let Some(o) = &record.output {
                    status_json["output"] = o.clone();
                }
                for n in news {
                    self.push("step", &n);
                }
                if changed {
                    self.push("status", &status_json);
                }
                self.done = ended;
            }
            Watched::Batch { name, counts } => {
                let now = super::api::batch_counts(&self.state, name).await?;
                let Some(now) = now else { return Ok(()) };
                let finished = now["finished"] == Value::Bool(true);
                if counts.as_ref() != Some(&now) {
                    *counts = Some(now.clone());
                    self.push("counts", &now);
                }
                self.done = finished;
            }
        }
        Ok(())
    }
}

fn step_json(s: &StepRecord) -> Value {
    json!({
        "run_id": s.run_id,
        "number": s.number,
        "step": s.step,
        "kind": s.kind,
        "attempt": s.attempt,
        "iteration": s.iteration,
        "status": s.status.as_str(),
        "error": s.error,
        "route": s.route,
        "child_run": s.child_run,
        "started_at": s.started_at,
        "finished_at": s.finished_at,
    })
}

/// The events of `watch`, polled until it is done or the server stops.
fn stream(watch: Watch) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold(watch, |mut w| async move {
        loop {
            if let Some(e) = w.pending.pop_front() {
                return Some((Ok(e), w));
            }
            if w.done || w.state.work.closing.is_cancelled() {
                return None;
            }
            if !w.first {
                tokio::select! {
                    () = w.state.work.closing.cancelled() => return None,
                    () = tokio::time::sleep(POLL) => {}
                }
            }
            w.first = false;
            if let Err(e) = w.poll().await {
                tracing::warn!("events: the store failed: {e}");
                let msg = json!({"error": format!("the store failed: {e}")});
                w.push("error", &msg);
                w.done = true;
            }
        }
    })
}

/// `GET /v1/runs/{id}/events`: the run's steps and status as they are recorded.
async fn run_events(
    State(state): State<AppState>,
    who: Authed,
    UrlPath(id): UrlPath<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Response> {
    who.require(Scope::Read)?;
    match state.store.get_run(&id).await {
        Ok(_) => {}
        Err(StoreError::NotFound(_)) => {
            let starting = state
                .work
                .starting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&id);
            if !starting {
                return Err(error(StatusCode::NOT_FOUND, &format!("there is no run `{id}`")));
            }
        }
        Err(e) => {
            return Err(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("the store failed: {e}"),
            ));
        }
    }
    let watch = Watch::new(
        state,
        Watched::Run {
            id,
            sent: HashMap::new(),
            status: None,
        },
    );
    Ok(Sse::new(stream(watch)).keep_alive(KeepAlive::default()))
}

/// `GET /v1/batches/{name}/events`: the batch's counts as they change.
async fn batch_events(
    State(state): State<AppState>,
    who: Authed,
    UrlPath(name): UrlPath<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Response> {
    who.require(Scope::Read)?;
    match super::api::batch_counts(&state, &name).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Err(error(
                StatusCode::NOT_FOUND,
                &format!("there is no batch `{name}`"),
            ));
        }
        Err(e) => {
            return Err(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("the store failed: {e}"),
            ));
        }
    }
    let watch = Watch::new(state, Watched::Batch { name, counts: None });
    Ok(Sse::new(stream(watch)).keep_alive(KeepAlive::default()))
}
