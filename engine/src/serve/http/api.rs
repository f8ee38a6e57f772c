//! The JSON API under `/v1` (SPEC §15): the inbox (groups, one item, a decision, bulk), the
//! decisions' log, runs and batches, starting a run. Each handler takes the caller
//! ([`Authed`]) and checks its scope first; errors are `{"error": ...}` with the status the
//! SPEC names. Bodies are read as JSON here, so that a bad one is told with its line and
//! column.

// A refused request is an axum `Response`, returned as handlers return it.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::AppState;
use super::auth::{Authed, Scope, error};
use crate::api::{Flow, RunConfig, Switchyard};
use crate::inbox::filter::Filter;
use crate::inbox::{self, DecideError};
use crate::record::inbox::InboxItem;
use crate::record::{RunRecord, RunStatus};
use crate::runtime::engine::RunControls;
use crate::store::inbox::{ItemQuery, LogQuery, Refusal};
use crate::store::{RunFilter, Store, StoreError};

/// The `/v1` routes (the events' are `events.rs`').
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/inbox", get(inbox_groups))
        .route("/v1/inbox/bulk", post(bulk))
        .route("/v1/inbox/{id}", get(inbox_item))
        .route("/v1/inbox/{id}/decision", post(decision))
        .route("/v1/decisions", get(decisions))
        .route("/v1/runs", get(runs).post(start_run))
        .route("/v1/runs/{id}", get(run))
        .route("/v1/batches/{name}", get(batch))
}

/// `GET /healthz`: `ok` while the server serves.
pub async fn healthz() -> Response {
    "ok\n".into_response()
}

/// A handler's answer: JSON, or an error answer.
type Answer = Result<Response, Response>;

fn store_error(e: impl std::fmt::Display) -> Response {
    tracing::warn!("store: {e}");
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        &format!("the store failed: {e}"),
    )
}

/// The body as a `T`, or a 400 naming the line and column (or the field) that is wrong.
fn body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Response> {
    serde_json::from_slice(bytes).map_err(|e| {
        let at = if e.is_data() {
            String::new()
        } else {
            format!(" (line {}, column {})", e.line(), e.column())
        };
        error(
            StatusCode::BAD_REQUEST,
            &format!("the body is not the JSON this takes{at}: {e}"),
        )
    })
}

/// The query string as a `T`, or a 400 naming the parameter.
fn query<T>(q: Result<Query<T>, axum::extract::rejection::QueryRejection>) -> Result<T, Response> {
    q.map(|Query(q)| q)
        .map_err(|e| error(StatusCode::BAD_REQUEST, &format!("bad query: {}", e.body_text())))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InboxQuery {
    batch: Option<String>,
    flow: Option<String>,
    step: Option<String>,
    filter: Option<String>,
    /// At most this many items listed per group (all when absent); `count` counts them all.
    items: Option<usize>,
}

fn filter_of(text: Option<&str>) -> Result<Option<Filter>, Response> {
    match text.map(str::trim).filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(t) => Filter::parse(t).map(Some).map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                Json(json!({
                    "error": e.render().replacen("--filter", "filter", 1),
                    "column": e.text[..e.start.min(e.text.len())].chars().count() + 1,
                })),
            )
                .into_response()
        }),
    }
}

/// One item as a group lists it.
fn brief(i: &InboxItem) -> Value {
    json!({
        "id": i.id,
        "run_id": i.run_id,
        "batch": i.batch,
        "item": i.item,
        "question": i.question,
        "expires_at": i.expires_at,
    })
}

/// `GET /v1/inbox?batch=&flow=&step=&filter=&items=`: the waiting items by question shape,
/// as `inbox list --json` prints them (times in Unix ms); `items` caps the items listed per
/// group (the inbox page asks for the first 200).
async fn inbox_groups(
    State(state): State<AppState>,
    who: Authed,
    q: Result<Query<InboxQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    who.require(Scope::Read)?;
    let q = query(q)?;
    let filter = filter_of(q.filter.as_deref())?;
    let items_q = ItemQuery {
        batch: q.batch,
        flow: q.flow,
        step: q.step,
        ..ItemQuery::default()
    };
    let (items, failed) = inbox::select(&*state.store, &items_q, filter.as_ref())
        .await
        .map_err(store_error)?;
    let cap = q.items.unwrap_or(usize::MAX);
    let mut by_shape: std::collections::HashMap<&str, Vec<&InboxItem>> = std::collections::HashMap::new();
    for i in &items {
        by_shape.entry(i.shape.as_str()).or_default().push(i);
    }
    let mut groups: Vec<(String, Value, Vec<Value>)> = Vec::new();
    for g in crate::store::inbox::group_items(&items) {
        let mut members: Vec<&InboxItem> = by_shape.remove(g.shape.as_str()).unwrap_or_default();
        members.truncate(cap);
        let question = members.first().map(|i| i.question.clone()).unwrap_or_default();
        groups.push((
            g.shape.clone(),
            json!({
                "flow": g.flow,
                "step": g.step,
                "kind": g.kind,
                "schema": g.schema,
                "question": question,
                "count": g.count,
                "oldest": g.oldest,
                "soonest_expiry": g.soonest_expiry,
            }),
            members.into_iter().map(brief).collect(),
        ));
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(_, mut g, items)| {
            g["items"] = Value::Array(items);
            g
        })
        .collect();
    let mut out = json!({"groups": groups});
    if !failed.is_empty() {
        out["filter_failed"] = failed
            .into_iter()
            .map(|(id, why)| json!({"id": id, "reason": why}))
            .collect();
    }
    Ok(Json(out).into_response())
}

/// `GET /v1/inbox/{id}`: one item (an item id, or a run waiting at one), with its state and
/// its root run's input.
async fn inbox_item(State(state): State<AppState>, who: Authed, UrlPath(id): UrlPath<String>) -> Answer {
    who.require(Scope::Read)?;
    let item = inbox::find(&*state.store, &id).await.map_err(decide_error)?;
    let input = match state.store.get_run(&item.root_run).await {
        Ok(r) => r.input,
        Err(StoreError::NotFound(_)) => Value::Null,
        Err(e) => return Err(store_error(e)),
    };
    let mut v = serde_json::to_value(&item).map_err(store_error)?;
    v["input"] = input;
    Ok(Json(v).into_response())
}

/// A refused answer as JSON: the status [`DecideError::http_status`] names, with who and when
/// for a second answer, the pointer for a schema violation.
fn decide_error(e: DecideError) -> Response {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut v = json!({"error": e.to_string()});
    match &e {
        DecideError::Invalid { pointer, reason, .. } => {
            v["pointer"] = json!(pointer);
            v["reason"] = json!(reason);
        }
        DecideError::Refused {
            refusal: Refusal::Decided { actor, via, at },
            ..
        } => {
            v["decided_by"] = json!(actor);
            v["via"] = json!(via.as_str());
            v["decided_at"] = json!(crate::record::inbox::format_ms(*at));
        }
        DecideError::Refused {
            refusal: Refusal::Expired { at },
            ..
        } => v["expired_at"] = json!(crate::record::inbox::format_ms(*at)),
        DecideError::Several { ids, .. } => v["items"] = json!(ids),
        _ => {}
    }
    if status.is_server_error() {
        tracing::warn!("{e}");
    }
    (status, Json(v)).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    decision: Value,
    #[serde(default)]
    reason: Option<String>,
}

/// `POST /v1/inbox/{id}/decision {decision, reason?}`: 200 with the decision row; 409
/// decided before (by whom, when), 410 expired, 422 the schema refused it (its pointer), 404.
/// The run continues after the answer: here, or by the workers.
async fn decision(
    State(state): State<AppState>,
    who: Authed,
    UrlPath(id): UrlPath<String>,
    bytes: Bytes,
) -> Answer {
    who.require(Scope::Decide)?;
    let b: DecisionBody = body(&bytes)?;
    let (item, row) = inbox::decide(&*state.store, &id, b.decision, b.reason, &who.actor())
        .await
        .map_err(decide_error)?;
    state.work.continue_items(vec![item]);
    Ok(Json(row).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkBody {
    #[serde(default)]
    preview: bool,
    filter: Option<String>,
    token: Option<String>,
    decision: Option<Value>,
    reason: Option<String>,
    batch: Option<String>,
    flow: Option<String>,
    step: Option<String>,
}

/// `POST /v1/inbox/bulk`: `{filter, decision?, preview: true}` counts the waiting items the
/// filter matches, `{matched, shapes, samples, token}`; `{token, decision, reason?}` applies
/// the decision to exactly the items that preview counted, `{bulk_id, applied, refused}`.
async fn bulk(State(state): State<AppState>, who: Authed, bytes: Bytes) -> Answer {
    who.require(Scope::Decide)?;
    let b: BulkBody = body(&bytes)?;
    if b.preview {
        let Some(filter) = filter_of(b.filter.as_deref())? else {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "a preview needs `filter` (CEL over the item; `true` for every waiting item)",
            ));
        };
        let q = ItemQuery {
            batch: b.batch,
            flow: b.flow,
            step: b.step,
            ..ItemQuery::default()
        };
        let p = inbox::preview(&*state.store, &filter, &q, b.decision.as_ref())
            .await
            .map_err(store_error)?;
        let pairs = |v: Vec<(String, String)>| -> Vec<Value> {
            v.into_iter()
                .map(|(id, why)| json!({"id": id, "reason": why}))
                .collect()
        };
        return Ok(Json(json!({
            "matched": p.matched,
            "shapes": p.shapes,
            "samples": p.samples.iter().map(brief).collect::<Vec<_>>(),
            "token": p.token,
            "unfit": pairs(p.unfit),
            "filter_failed": pairs(p.failed),
        }))
        .into_response());
    }
    let (Some(token), Some(decision)) = (b.token, b.decision) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "give `{filter, preview: true}` to preview, or `{token, decision}` to apply a preview",
        ));
    };
    let applied = match inbox::apply(&*state.store, &token, &decision, b.reason, &who.actor()).await {
        Ok(a) => a,
        Err(inbox::BulkError::Store(e)) => return Err(store_error(e)),
        Err(e @ inbox::BulkError::UnknownToken(_)) => {
            return Err(error(StatusCode::NOT_FOUND, &e.to_string()));
        }
        Err(e) => return Err(error(StatusCode::CONFLICT, &e.to_string())),
    };
    state.work.continue_items(applied.items);
    Ok(Json(json!({
        "bulk_id": applied.bulk_id,
        "applied": applied.applied.iter().map(|r| &r.item_id).collect::<Vec<_>>(),
        "refused": applied
            .refused
            .into_iter()
            .map(|(id, why)| json!({"id": id, "reason": why}))
            .collect::<Vec<_>>(),
    }))
    .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogParams {
    run: Option<String>,
    since: Option<String>,
    limit: Option<usize>,
}

/// A time as Unix ms (`1733356800000`) or RFC 3339 (`2026-12-05T00:00:00Z`).
fn parse_time(s: &str) -> Option<u64> {
    if let Ok(ms) = s.parse::<u64>() {
        return Some(ms);
    }
    let t: jiff::Timestamp = s.parse().ok()?;
    u64::try_from(t.as_millisecond()).ok()
}

/// `GET /v1/decisions?run=&since=&limit=`: the decisions' log, in the order they were made.
async fn decisions(
    State(state): State<AppState>,
    who: Authed,
    q: Result<Query<LogParams>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    who.require(Scope::Read)?;
    let q = query(q)?;
    let since = match q.since.as_deref() {
        None | Some("") => None,
        Some(s) => Some(parse_time(s).ok_or_else(|| {
            error(
                StatusCode::BAD_REQUEST,
                &format!("since: `{s}` is neither Unix milliseconds nor an RFC 3339 time"),
            )
        })?),
    };
    let rows = state
        .store
        .inbox()
        .log(&LogQuery {
            run: q.run,
            since,
            limit: q.limit,
        })
        .await
        .map_err(store_error)?;
    Ok(Json(json!({ "decisions": rows })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunsParams {
    status: Option<String>,
    batch: Option<String>,
    flow: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/runs?status=&batch=&flow=&limit=`: root runs, newest first (at most 100 unless
/// `limit` says).
async fn runs(
    State(state): State<AppState>,
    who: Authed,
    q: Result<Query<RunsParams>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    who.require(Scope::Read)?;
    let q = query(q)?;
    let status = match q.status.as_deref() {
        None | Some("") => None,
        Some(s) => Some(RunStatus::parse(s).ok_or_else(|| {
            error(
                StatusCode::BAD_REQUEST,
                &format!("status: `{s}` is not a run status (queued, running, succeeded, failed, interrupted, cancelled)"),
            )
        })?),
    };
    let runs = state
        .store
        .list_runs(&RunFilter {
            status,
            flow: q.flow,
            limit: Some(q.limit.unwrap_or(100)),
            roots_only: true,
            batches: q.batch.into_iter().collect(),
        })
        .await
        .map_err(store_error)?;
    Ok(Json(json!({ "runs": runs })).into_response())
}

/// `GET /v1/runs/{id}`: the run's record, its steps (in record order) and its child runs.
async fn run(State(state): State<AppState>, who: Authed, UrlPath(id): UrlPath<String>) -> Answer {
    who.require(Scope::Read)?;
    let record = match state.store.get_run(&id).await {
        Ok(r) => r,
        Err(StoreError::NotFound(_)) => {
            return Err(error(StatusCode::NOT_FOUND, &format!("there is no run `{id}`")));
        }
        Err(e) => return Err(store_error(e)),
    };
    let steps = state.store.steps(&id).await.map_err(store_error)?;
    let children = state.store.children(&id).await.map_err(store_error)?;
    let children: Vec<Value> = children
        .iter()
        .map(|c| json!({"id": c.id, "flow": c.flow, "status": c.status.as_str(), "parent_step": c.parent_step}))
        .collect();
    Ok(Json(json!({"run": record, "steps": steps, "children": children})).into_response())
}

/// The runs of batch `name`, counted by status; `None` when it has none.
pub(super) async fn batch_counts(state: &AppState, name: &str) -> Result<Option<Value>, StoreError> {
    const PAGE: usize = 1000;
    // The latest run of each item: an item run again comes after its earlier runs.
    let mut latest: BTreeMap<u64, RunStatus> = BTreeMap::new();
    let mut other = 0u64;
    let mut from = 0;
    loop {
        let page = state.store.batch_runs(name, from, PAGE).await?;
        let n = page.len();
        for r in &page {
            match r.item_index {
                Some(i) => {
                    latest.insert(i, r.status);
                    from = from.max(i);
                }
                None => other += 1,
            }
        }
        if n < PAGE {
            break;
        }
        from += 1;
    }
    if latest.is_empty() && other == 0 {
        return Ok(None);
    }
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for s in latest.values() {
        *counts.entry(s.as_str()).or_default() += 1;
    }
    let done = latest
        .values()
        .all(|s| !matches!(s, RunStatus::Queued | RunStatus::Running));
    Ok(Some(json!({
        "batch": name,
        "items": latest.len(),
        "counts": counts,
        "finished": done,
    })))
}

/// `GET /v1/batches/{name}`: the batch's items counted by the status of their latest run.
async fn batch(State(state): State<AppState>, who: Authed, UrlPath(name): UrlPath<String>) -> Answer {
    who.require(Scope::Read)?;
    match batch_counts(&state, &name).await.map_err(store_error)? {
        Some(v) => Ok(Json(v).into_response()),
        None => Err(error(
            StatusCode::NOT_FOUND,
            &format!("there is no batch `{name}`"),
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartBody {
    flow: String,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// The run id an idempotency key stands for: the same key, the same id, in every process.
pub fn keyed_run_id(key: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"switchyard serve idempotency key\0");
    h.update(key.as_bytes());
    let hash = h.finalize();
    let mut id = String::from("rk");
    for b in &hash[..12] {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

/// `flow` as a path under `root`: relative, no `..`, and (links resolved) still under it.
fn flow_under(root: &Path, flow: &str) -> Result<PathBuf, String> {
    let rel = Path::new(flow);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "flow: `{flow}` must be a path under the server's --root, without `..`"
        ));
    }
    let path = root.join(rel);
    let real = std::fs::canonicalize(&path).map_err(|e| format!("flow: `{flow}`: {e}"))?;
    if !real.starts_with(root) {
        return Err(format!("flow: `{flow}` leads out of the server's --root"));
    }
    if !real.is_file() {
        return Err(format!("flow: `{flow}` is not a file"));
    }
    Ok(real)
}

/// `POST /v1/runs {flow, input, idempotency_key?}`: starts a run of the flow file `flow`
/// (under `--root`) and answers at once, 202 `{run_id, status: "started"}`; with a key seen
/// before (by any `serve` on this store), 200 with that run's id and status and no second run.
async fn start_run(State(state): State<AppState>, who: Authed, bytes: Bytes) -> Answer {
    who.require(Scope::Run)?;
    let b: StartBody = body(&bytes)?;
    if state.work.stopping() {
        return Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is stopping: no run starts now",
        ));
    }
    let id = match b.idempotency_key.as_deref() {
        Some("") => return Err(error(StatusCode::BAD_REQUEST, "idempotency_key: empty")),
        Some(key) => keyed_run_id(key),
        None => crate::record::new_run_id(),
    };
    if b.idempotency_key.is_some()
        && let Some(answer) = existing(&state, &id).await?
    {
        return Ok(answer);
    }
    let path = flow_under(&state.root, &b.flow).map_err(|e| error(StatusCode::BAD_REQUEST, &e))?;
    let root = state.root.clone();
    let flow = tokio::task::spawn_blocking(move || Flow::load_under(&path, Some(root)))
        .await
        .map_err(store_error)?;
    let flow = flow.map_err(|e| {
        let why = e.message().map_or_else(
            || "it has lint errors (`switchyard lint` tells them)".to_string(),
            str::to_string,
        );
        error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("flow `{}` does not load: {why}", b.flow),
        )
    })?;
    {
        let mut starting = state.work.starting.lock().unwrap_or_else(|p| p.into_inner());
        if !starting.insert(id.clone()) {
            return Ok((
                StatusCode::OK,
                Json(json!({"run_id": id, "status": "started", "created": false})),
            )
                .into_response());
        }
    }
    let sy = Switchyard::with_store(state.store.clone());
    if let Err(e) = sy.check(&flow, &Default::default()) {
        state
            .work
            .starting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        return Err(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("flow `{}` cannot run here: {e}", b.flow),
        ));
    }
    let work = state.work.clone();
    let (run_id, input) = (id.clone(), b.input);
    tracing::info!(run_id = %id, actor = %who.name, "starting a run of `{}`", b.flow);
    state.work.tasks.spawn(async move {
        let config = RunConfig {
            context: None,
            options: Default::default(),
            controls: RunControls {
                pause: work.stopping.child_token(),
                ..RunControls::default()
            },
        };
        match sy.run_as(&flow, input, config, run_id.clone()).await {
            Ok(o) => tracing::info!(run_id = %run_id, status = o.status.as_str(), "the run ended"),
            Err(crate::api::Error::Exists(_)) => {
                tracing::info!(run_id = %run_id, "the run was started elsewhere")
            }
            Err(e) => tracing::warn!(run_id = %run_id, "the run did not start: {e}"),
        }
        work.starting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&run_id);
    });
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"run_id": id, "status": "started", "created": true})),
    )
        .into_response())
}

/// The answer for a keyed run that exists (recorded, or being started here).
async fn existing(state: &AppState, id: &str) -> Result<Option<Response>, Response> {
    let seen = |r: RunRecord| {
        (
            StatusCode::OK,
            Json(json!({"run_id": r.id, "status": r.status.as_str(), "created": false})),
        )
            .into_response()
    };
    match state.store.get_run(id).await {
        Ok(r) => return Ok(Some(seen(r))),
        Err(StoreError::NotFound(_)) => {}
        Err(e) => return Err(store_error(e)),
    }
    let starting = state
        .work
        .starting
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(id);
    Ok(starting.then(|| {
        (
            StatusCode::OK,
            Json(json!({"run_id": id, "status": "started", "created": false})),
        )
            .into_response()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_one_run_id() {
        assert_eq!(keyed_run_id("a"), keyed_run_id("a"));
        assert_ne!(keyed_run_id("a"), keyed_run_id("b"));
        assert!(keyed_run_id("a").starts_with("rk") && keyed_run_id("a").len() == 26);
    }

    #[test]
    fn flows_are_taken_under_the_root_only() {
        let dir = std::env::temp_dir().join(format!("sy-serve-root-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("flows")).expect("dir");
        std::fs::write(dir.join("flows/a.yaml"), "x").expect("file");
        let root = std::fs::canonicalize(&dir).expect("root");
        assert!(flow_under(&root, "flows/a.yaml").is_ok());
        for bad in [
            "../a.yaml",
            "/etc/passwd",
            "flows/../../x",
            "flows/none.yaml",
            "flows",
        ] {
            assert!(flow_under(&root, bad).is_err(), "{bad}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn times_are_ms_or_rfc3339() {
        assert_eq!(parse_time("1000"), Some(1000));
        assert_eq!(parse_time("1970-01-01T00:00:01Z"), Some(1000));
        assert_eq!(parse_time("yesterday"), None);
    }
}
