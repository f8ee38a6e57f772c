//! Decisions at batch scale (SPEC §15): what the command line and `serve` do with the
//! inbox the engine fills. Each answer is checked against its item's own decision schema
//! before it is recorded; recording is the store's one transaction ([`Inbox::decide`]);
//! continuing the run after is [`continue_runs`] (a run of this machine's store, resumed
//! here) or the workers' (a submitted run, queued again by the store in that transaction).
//!
//! - [`decide`]: one answer to one item (an item id, or the id of a run waiting at one).
//! - [`preview`] and [`apply`]: a bulk operation, counted by a filter ([`filter::Filter`]) and
//!   stored under a token, then applied to exactly the items counted.
//! - [`settle_expired`]: items whose expiry passed, marked expired, their runs to continue.

pub mod filter;

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use crate::api::{Flow, RunConfig, Switchyard};
use crate::plan::Schema;
use crate::record::RunStatus;
use crate::record::inbox::{DecisionRow, InboxItem, ItemState, Via};
use crate::runtime::engine::RunOutcome;
use crate::runtime::resume::ResumeOptions;
use crate::store::any::AnyStore;
use crate::store::inbox::{BulkPreview, ItemQuery, NewDecision, Refusal};
use crate::store::{Store, StoreError};
use filter::Filter;

/// Who answers, and how.
#[derive(Clone, Debug)]
pub struct Actor {
    pub name: String,
    pub via: Via,
}

impl Actor {
    /// The OS user (`$USER`, else `$LOGNAME`, else `unknown`), answering on the command line.
    pub fn os_user() -> Actor {
        Actor {
            name: crate::record::inbox::os_user(),
            via: Via::Cli,
        }
    }
}

/// Why an answer was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No item of that id, and no run waiting at exactly one.
    #[error("no inbox item `{0}` (`switchyard inbox list` lists the waiting ones)")]
    NotFound(String),
    /// A run id given for an item, where the run waits at several.
    #[error("run `{run}` waits at {count} items; give one of their ids: {}", ids.join(", "))]
    Several {
        run: String,
        count: usize,
        ids: Vec<String>,
    },
    /// The decision does not match the item's schema.
    #[error("the decision does not match the schema of item `{id}` (step `{step}`) at `{pointer}`: {reason}")]
    Invalid {
        id: String,
        step: String,
        pointer: String,
        reason: String,
    },
    /// Answered before, expired, or closed.
    #[error("item `{id}` was not decided here: {refusal}")]
    Refused { id: String, refusal: Refusal },
}

impl DecideError {
    /// An HTTP status for the API: 404, 422, 409 (decided or closed), 410 (expired).
    pub fn http_status(&self) -> u16 {
        match self {
            DecideError::Store(_) => 500,
            DecideError::NotFound(_) => 404,
            DecideError::Several { .. } | DecideError::Invalid { .. } => 422,
            DecideError::Refused {
                refusal: Refusal::Expired { .. },
                ..
            } => 410,
            DecideError::Refused {
                refusal: Refusal::NotFound,
                ..
            } => 404,
            DecideError::Refused { .. } => 409,
        }
    }
}

/// The item `id` names: an item id, or the id of a run (root or child) waiting at exactly
/// one waiting item.
pub async fn find(store: &impl Store, id: &str) -> Result<InboxItem, DecideError> {
    let inbox = store.inbox();
    if let Some(item) = inbox.get(id).await? {
        return Ok(item);
    }
    let of_run = inbox
        .list(&ItemQuery {
            state: Some(ItemState::Waiting),
            root_runs: vec![id.to_string()],
            ..ItemQuery::default()
        })
        .await?;
    match of_run.len() {
        0 => {
            // A run whose items were all answered: its latest item, so that a second answer
            // is told who gave the first.
            let any = inbox
                .list(&ItemQuery {
                    root_runs: vec![id.to_string()],
                    ..ItemQuery::default()
                })
                .await?;
            any.into_iter()
                .last()
                .ok_or_else(|| DecideError::NotFound(id.to_string()))
        }
        1 => Ok(of_run.into_iter().next().unwrap_or_else(|| unreachable!())),
        n => Err(DecideError::Several {
            run: id.to_string(),
            count: n,
            ids: of_run.into_iter().map(|i| i.id).collect(),
        }),
    }
}

/// Compiled decision schemas by shape, for checking many answers.
#[derive(Default)]
pub struct Schemas {
    by_shape: HashMap<String, Result<Arc<Schema>, String>>,
}

impl Schemas {
    /// Checks `decision` against item `item`'s schema.
    pub fn check(&mut self, item: &InboxItem, decision: &Value) -> Result<(), DecideError> {
        let schema = self
            .by_shape
            .entry(item.shape.clone())
            .or_insert_with(|| Schema::new(item.schema.clone()).map(Arc::new));
        let invalid = |pointer: String, reason: String| DecideError::Invalid {
            id: item.id.clone(),
            step: item.step.clone(),
            pointer,
            reason,
        };
        match schema {
            Err(e) => Err(invalid(
                String::new(),
                format!("the item's schema does not compile: {e}"),
            )),
            Ok(s) => s.check(decision).map_err(|v| {
                let pointer = if v.pointer.is_empty() {
                    "/".to_string()
                } else {
                    v.pointer
                };
                invalid(pointer, v.message)
            }),
        }
    }
}

/// What an approval's decision edited: `[{call, tool, before, after}]` for each `edit`,
/// `None` when nothing was.
pub fn edited(item: &InboxItem, decision: &Value) -> Option<Value> {
    crate::record::inbox::edited(item, decision)
}

/// Records `decision` for the item `id` names ([`find`]), checked against its schema.
pub async fn decide(
    store: &impl Store,
    id: &str,
    decision: Value,
    reason: Option<String>,
    actor: &Actor,
) -> Result<(InboxItem, DecisionRow), DecideError> {
    let item = find(store, id).await?;
    // An item no longer waiting is refused by the store, with who and when; only a waiting
    // one needs its schema checked first.
    if item.state == ItemState::Waiting {
        Schemas::default().check(&item, &decision)?;
    }
    match store
        .inbox()
        .decide(vec![answer(&item, decision, reason, actor, None)])
        .await?
        .pop()
    {
        Some(Ok(row)) => Ok((item, row)),
        Some(Err(refusal)) => Err(DecideError::Refused { id: item.id, refusal }),
        None => Err(DecideError::NotFound(id.to_string())),
    }
}

fn answer(
    item: &InboxItem,
    decision: Value,
    reason: Option<String>,
    actor: &Actor,
    bulk: Option<&str>,
) -> NewDecision {
    NewDecision {
        item_id: item.id.clone(),
        actor: actor.name.clone(),
        via: actor.via,
        edited: edited(item, &decision),
        decision,
        reason,
        bulk_id: bulk.map(str::to_string),
    }
}

/// The waiting items `query` selects that `filter` matches (all of them without one), each
/// with its root run's input; and the items the filter could not be evaluated on, with why.
pub async fn select(
    store: &impl Store,
    query: &ItemQuery,
    filter: Option<&Filter>,
) -> Result<(Vec<InboxItem>, Vec<(String, String)>), StoreError> {
    let q = ItemQuery {
        state: Some(ItemState::Waiting),
        ..query.clone()
    };
    let items = store.inbox().list(&q).await?;
    let Some(filter) = filter else {
        return Ok((items, Vec::new()));
    };
    let now = store.inbox().now().await?;
    // The root runs' inputs, a chunk of runs per statement (not a read per item).
    let mut roots: Vec<String> = Vec::new();
    {
        let mut seen = std::collections::HashSet::new();
        for i in &items {
            if seen.insert(i.root_run.as_str()) {
                roots.push(i.root_run.clone());
            }
        }
    }
    let mut inputs: HashMap<String, Value> = store.inbox().inputs(&roots).await?;
    let mut out = Vec::new();
    let mut failed = Vec::new();
    for item in items {
        if !inputs.contains_key(&item.root_run) {
            let input = match store.get_run(&item.root_run).await {
                Ok(r) => r.input,
                Err(StoreError::NotFound(_)) => Value::Null,
                Err(e) => return Err(e),
            };
            inputs.insert(item.root_run.clone(), input);
        }
        let input = &inputs[&item.root_run];
        match filter.matches(&item, input, now) {
            Ok(true) => out.push(item),
            Ok(false) => {}
            Err(why) => failed.push((item.id.clone(), why)),
        }
    }
    Ok((out, failed))
}

/// A bulk operation's preview.
#[derive(Clone, Debug)]
pub struct Preview {
    pub token: String,
    pub matched: usize,
    /// Distinct question shapes among the matched items.
    pub shapes: usize,
    /// Up to five matched items.
    pub samples: Vec<InboxItem>,
    /// With a decision: the matched items it does not fit, with why.
    pub unfit: Vec<(String, String)>,
    /// Items the filter could not be evaluated on (not counted), with why.
    pub failed: Vec<(String, String)>,
}

/// Counts the waiting items `filter` matches and stores them under a fresh token: the items
/// `apply` will answer, and no others.
pub async fn preview(
    store: &impl Store,
    filter: &Filter,
    query: &ItemQuery,
    decision: Option<&Value>,
) -> Result<Preview, StoreError> {
    let (items, failed) = select(store, query, Some(filter)).await?;
    let mut schemas = Schemas::default();
    let unfit: Vec<(String, String)> = match decision {
        Some(d) => items
            .iter()
            .filter_map(|i| schemas.check(i, d).err().map(|e| (i.id.clone(), e.to_string())))
            .collect(),
        None => Vec::new(),
    };
    let mut shapes: Vec<&str> = items.iter().map(|i| i.shape.as_str()).collect();
    shapes.sort_unstable();
    shapes.dedup();
    let token = {
        let bytes = crate::record::inbox::random_bytes::<16>();
        let mut t = String::from("bt_");
        for b in bytes {
            t.push_str(&format!("{b:02x}"));
        }
        t
    };
    store
        .inbox()
        .put_bulk(&BulkPreview {
            token: token.clone(),
            filter: filter.text().to_string(),
            decision: decision.cloned(),
            items: items.iter().map(|i| i.id.clone()).collect(),
            created_at: crate::record::now_ms(),
            applied: None,
        })
        .await?;
    Ok(Preview {
        token,
        matched: items.len(),
        shapes: shapes.len(),
        samples: items.iter().take(5).cloned().collect(),
        unfit,
        failed,
    })
}

/// Why a bulk operation could not start.
#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no bulk preview has token `{0}` (`inbox bulk --filter CEL --preview` makes one)")]
    UnknownToken(String),
    #[error("the preview of token `{token}` was applied already, as bulk `{bulk_id}`: preview again")]
    Applied { token: String, bulk_id: String },
    #[error("the decision differs from the one previewed with token `{0}`: preview again with this decision")]
    OtherDecision(String),
}

/// What applying a bulk operation did.
#[derive(Clone, Debug)]
pub struct Applied {
    pub bulk_id: String,
    pub applied: Vec<DecisionRow>,
    /// (item id, why) for the counted items not answered: decided or expired meanwhile, or
    /// the decision does not fit their schema.
    pub refused: Vec<(String, String)>,
    /// The items answered (for continuing their runs).
    pub items: Vec<InboxItem>,
}

/// Applies `decision` to exactly the items the preview of `token` counted.
pub async fn apply(
    store: &impl Store,
    token: &str,
    decision: &Value,
    reason: Option<String>,
    actor: &Actor,
) -> Result<Applied, BulkError> {
    let inbox = store.inbox();
    let preview = inbox
        .get_bulk(token)
        .await?
        .ok_or_else(|| BulkError::UnknownToken(token.to_string()))?;
    if let Some((_, bulk_id)) = &preview.applied {
        return Err(BulkError::Applied {
            token: token.to_string(),
            bulk_id: bulk_id.clone(),
        });
    }
    if preview.decision.as_ref().is_some_and(|d| d != decision) {
        return Err(BulkError::OtherDecision(token.to_string()));
    }
    let bulk_id = crate::record::inbox::new_id('b');
    if !inbox.mark_bulk(token, &bulk_id).await? {
        let again = inbox.get_bulk(token).await?;
        return Err(BulkError::Applied {
            token: token.to_string(),
            bulk_id: again.and_then(|p| p.applied).map(|(_, b)| b).unwrap_or_default(),
        });
    }
    let items = inbox
        .list(&ItemQuery {
            ids: preview.items.clone(),
            ..ItemQuery::default()
        })
        .await?;
    let by_id: HashMap<&str, &InboxItem> = items.iter().map(|i| (i.id.as_str(), i)).collect();
    let mut schemas = Schemas::default();
    let mut refused = Vec::new();
    let mut answers = Vec::new();
    let mut asked: Vec<&InboxItem> = Vec::new();
    for id in &preview.items {
        let Some(item) = by_id.get(id.as_str()) else {
            refused.push((id.clone(), Refusal::NotFound.to_string()));
            continue;
        };
        if let Err(e) = schemas.check(item, decision) {
            refused.push((id.clone(), e.to_string()));
            continue;
        }
        answers.push(answer(
            item,
            decision.clone(),
            reason.clone(),
            actor,
            Some(&bulk_id),
        ));
        asked.push(item);
    }
    let results = inbox.decide(answers).await?;
    let mut applied = Vec::new();
    let mut done = Vec::new();
    for (item, r) in asked.into_iter().zip(results) {
        match r {
            Ok(row) => {
                applied.push(row);
                done.push(item.clone());
            }
            Err(refusal) => refused.push((item.id.clone(), refusal.to_string())),
        }
    }
    Ok(Applied {
        bulk_id,
        applied,
        refused,
        items: done,
    })
}

/// Marks the waiting items whose expiry passed `expired`; returns them (their runs are to
/// be continued: [`continue_runs`], or by the workers for submitted runs).
pub async fn settle_expired(store: &impl Store) -> Result<Vec<InboxItem>, StoreError> {
    store.inbox().expire_due().await
}

/// How a run whose item was answered went on.
#[derive(Debug)]
pub enum Continued {
    /// Resumed here: its outcome.
    Ran(Box<RunOutcome>),
    /// A submitted run: queued again for the workers by the store.
    Queued,
    /// Another process holds it, or it moved on: that process applies the answer.
    Elsewhere(String),
    /// It could not be resumed here (its flow changed or cannot be loaded): why. The answer
    /// stays recorded; `switchyard resume RUN_ID` continues it.
    Failed(String),
}

/// The flows [`continue_runs`] loaded, by file: each loaded once.
type Loaded = tokio::sync::Mutex<HashMap<String, Result<Arc<Flow>, String>>>;

/// Continues the root runs of `items` here, `concurrency` at a time, each from its recorded
/// flow file (loaded once per file), so the recorded answers apply; submitted runs are the
/// workers' (queued again by the store when the answer was recorded). Returns each root run
/// once, in the order first named.
pub async fn continue_runs(
    store: &Arc<AnyStore>,
    items: &[InboxItem],
    concurrency: usize,
    root: Option<std::path::PathBuf>,
) -> Vec<(String, Continued)> {
    let mut roots: Vec<String> = Vec::new();
    for i in items {
        if !roots.contains(&i.root_run) {
            roots.push(i.root_run.clone());
        }
    }
    let switchyard = Arc::new(Switchyard::with_store(store.clone()));
    let flows: Arc<Loaded> = Arc::default();
    let places = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut running = tokio::task::JoinSet::new();
    for (n, run_id) in roots.iter().enumerate() {
        let Ok(place) = places.clone().acquire_owned().await else {
            break;
        };
        let (store, switchyard, flows, run_id, root) = (
            store.clone(),
            switchyard.clone(),
            flows.clone(),
            run_id.clone(),
            root.clone(),
        );
        running.spawn(async move {
            let out = continue_one(&store, &switchyard, &flows, &run_id, root).await;
            drop(place);
            (n, run_id, out)
        });
    }
    let mut out: Vec<(usize, String, Continued)> = Vec::new();
    while let Some(done) = running.join_next().await {
        if let Ok(d) = done {
            out.push(d);
        }
    }
    out.sort_by_key(|(n, _, _)| *n);
    out.into_iter().map(|(_, id, c)| (id, c)).collect()
}

async fn continue_one(
    store: &Arc<AnyStore>,
    switchyard: &Switchyard<AnyStore>,
    flows: &Loaded,
    run_id: &str,
    root: Option<std::path::PathBuf>,
) -> Continued {
    let record = match store.get_run(run_id).await {
        Ok(r) => r,
        Err(e) => return Continued::Failed(e.to_string()),
    };
    if let AnyStore::Sql(sql) = &**store {
        match sql.lease_of(run_id).await {
            Ok(Some(_)) => return Continued::Queued,
            Ok(None) => {}
            Err(e) => return Continued::Failed(e.to_string()),
        }
    }
    if !matches!(record.status, RunStatus::Interrupted) {
        return Continued::Elsewhere(format!("run `{run_id}` is {} now", record.status.as_str()));
    }
    let Some(path) = record.flow_path.clone() else {
        return Continued::Failed(format!("run `{run_id}` has no recorded flow file"));
    };
    let flow = {
        let mut flows = flows.lock().await;
        flows
            .entry(path.clone())
            .or_insert_with(|| {
                let loaded =
                    tokio::task::block_in_place(|| Flow::load_under(std::path::Path::new(&path), root));
                loaded.map(Arc::new).map_err(|e| {
                    format!(
                        "the flow `{path}` does not load: {}",
                        e.message()
                            .map_or_else(|| "it has lint errors".to_string(), str::to_string)
                    )
                })
            })
            .clone()
    };
    let flow = match flow {
        Ok(f) => f,
        Err(e) => return Continued::Failed(e),
    };
    let resume = ResumeOptions::default().answered(true);
    match switchyard
        .resume(&flow, run_id, resume, RunConfig::default())
        .await
    {
        Ok(o) => Continued::Ran(Box::new(o)),
        Err(crate::api::Error::Resume(
            e @ (crate::runtime::resume::ResumeError::MovedOn { .. }
            | crate::runtime::resume::ResumeError::Store(StoreError::Held { .. })),
        )) => Continued::Elsewhere(e.to_string()),
        Err(e) => Continued::Failed(e.to_string()),
    }
}
