//! The inbox's tables (SPEC §15): pending items and the append-only decisions log, behind
//! one object-safe trait every store hands out ([`crate::store::Store::inbox`]), so the
//! engine, the command line and `serve` read and write them without knowing the store.
//!
//! A decision applies only to a `waiting` item whose expiry has not passed, in the one
//! transaction that marks it decided and appends its row; a submitted run (SPEC §12) whose
//! item is decided or expired is queued again in that transaction, for the workers.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;

use super::blobs::BlobFuture;
use crate::record::inbox::{DecisionRow, InboxItem, ItemState, Via};

/// Which items a listing reads.
#[derive(Clone, Debug, Default)]
pub struct ItemQuery {
    /// Only items in this state (any when `None`).
    pub state: Option<ItemState>,
    pub batch: Option<String>,
    pub flow: Option<String>,
    pub step: Option<String>,
    /// Only items of these root runs (any when empty).
    pub root_runs: Vec<String>,
    /// Only these items (any when empty).
    pub ids: Vec<String>,
    /// At most this many, oldest first.
    pub limit: Option<usize>,
}

/// Which decisions the log reads.
#[derive(Clone, Debug, Default)]
pub struct LogQuery {
    /// Of this run (the run whose part was answered, or its root).
    pub run: Option<String>,
    /// At or after this time (Unix ms).
    pub since: Option<u64>,
    pub limit: Option<usize>,
}

/// An answer to record ([`Inbox::decide`]).
#[derive(Clone, Debug)]
pub struct NewDecision {
    pub item_id: String,
    pub actor: String,
    pub via: Via,
    pub decision: Value,
    pub reason: Option<String>,
    pub edited: Option<Value>,
    pub bulk_id: Option<String>,
}

/// Why an answer was not recorded.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// No item of that id.
    NotFound,
    /// Decided before: by whom, how and when.
    Decided { actor: String, via: Via, at: u64 },
    /// Its expiry passed (at `at`, Unix ms) before this answer.
    Expired { at: u64 },
    /// Its run ended another way.
    Cancelled,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotFound => f.write_str("no such item"),
            Refusal::Decided { actor, via, at } => write!(
                f,
                "already decided by {actor} ({}) at {}",
                via.as_str(),
                crate::record::inbox::format_ms(*at)
            ),
            Refusal::Expired { at } => write!(f, "expired at {}", crate::record::inbox::format_ms(*at)),
            Refusal::Cancelled => f.write_str("its run ended without it (cancelled)"),
        }
    }
}

/// A bulk operation's preview: the items it counted, for `inbox bulk --token`.
#[derive(Clone, Debug, PartialEq)]
pub struct BulkPreview {
    pub token: String,
    pub filter: String,
    /// The decision previewed with it, if one was given: the one it must be applied with.
    pub decision: Option<Value>,
    pub items: Vec<String>,
    pub created_at: u64,
    /// When it was applied (a token is applied once), and its bulk id.
    pub applied: Option<(u64, String)>,
}

/// What the engine reads back when it resumes a run: the settled items of its parts.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// Decided: the decision.
    Decided(Value),
    /// Expired without a decision.
    Expired,
}

/// Group counts of waiting items, computed by the store ([`Inbox::groups`]).
#[derive(Clone, Debug, PartialEq)]
pub struct GroupCount {
    pub shape: String,
    pub flow: String,
    pub step: String,
    pub kind: String,
    pub schema: Value,
    pub count: u64,
    pub oldest: u64,
    pub soonest_expiry: Option<u64>,
}

/// The inbox's tables.
pub trait Inbox: Send + Sync {
    /// Adds `items` (state `waiting`); an item whose id is stored already is left as it is.
    fn add<'a>(&'a self, items: &'a [InboxItem]) -> BlobFuture<'a, ()>;
    /// The item of id `id`.
    fn get<'a>(&'a self, id: &'a str) -> BlobFuture<'a, Option<InboxItem>>;
    /// The items `q` selects, oldest first (then by id).
    fn list<'a>(&'a self, q: &'a ItemQuery) -> BlobFuture<'a, Vec<InboxItem>>;
    /// Waiting items by question shape, counted by the store (no item is read).
    fn groups<'a>(&'a self, q: &'a ItemQuery) -> BlobFuture<'a, Vec<GroupCount>>;
    /// The settled answers of run `run_id`'s parts, by (number, iteration).
    fn answers<'a>(&'a self, run_id: &'a str) -> BlobFuture<'a, HashMap<(String, Option<u64>), Answer>>;
    /// Records each answer that finds its item `waiting` and unexpired, marking the item
    /// decided in the same transaction (many per transaction); the others are refused and
    /// not recorded. Results in the order given.
    fn decide<'a>(&'a self, answers: Vec<NewDecision>) -> BlobFuture<'a, Vec<Result<DecisionRow, Refusal>>>;
    /// Marks the waiting items whose expiry passed (by the store's clock) `expired`; returns
    /// them.
    fn expire_due(&self) -> BlobFuture<'_, Vec<InboxItem>>;
    /// Marks the waiting items of runs `run_ids` `cancelled` (their runs ended without them).
    fn cancel_runs<'a>(&'a self, run_ids: &'a [String]) -> BlobFuture<'a, u64>;
    /// The decisions `q` selects, in the order they were made.
    fn log<'a>(&'a self, q: &'a LogQuery) -> BlobFuture<'a, Vec<DecisionRow>>;
    /// Stores a bulk preview.
    fn put_bulk<'a>(&'a self, p: &'a BulkPreview) -> BlobFuture<'a, ()>;
    /// The bulk preview of token `token`.
    fn get_bulk<'a>(&'a self, token: &'a str) -> BlobFuture<'a, Option<BulkPreview>>;
    /// Marks the preview of `token` applied as bulk `bulk_id`; false when it was applied
    /// before (by another process meanwhile).
    fn mark_bulk<'a>(&'a self, token: &'a str, bulk_id: &'a str) -> BlobFuture<'a, bool>;
    /// The store's clock, Unix ms.
    fn now(&self) -> BlobFuture<'_, u64>;
    /// The inputs of the runs `run_ids`, as many as one statement per chunk reads: what a
    /// filter over `input` sees. A run missing from the answer is read by the caller
    /// (a store without the runs at hand answers none).
    fn inputs<'a>(&'a self, run_ids: &'a [String]) -> BlobFuture<'a, HashMap<String, Value>>;
}

/// The inbox of a memory store.
#[derive(Debug, Default)]
pub struct MemoryInbox {
    state: Mutex<MemoryState>,
}

#[derive(Debug, Default)]
struct MemoryState {
    items: Vec<InboxItem>,
    index: HashMap<String, usize>,
    log: Vec<DecisionRow>,
    bulks: HashMap<String, BulkPreview>,
}

impl MemoryInbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether item `i` is selected by `q`.
pub fn selects(q: &ItemQuery, i: &InboxItem) -> bool {
    q.state.is_none_or(|s| s == i.state)
        && q.batch.as_ref().is_none_or(|b| i.batch.as_ref() == Some(b))
        && q.flow.as_ref().is_none_or(|f| *f == i.flow)
        && q.step.as_ref().is_none_or(|s| *s == i.step)
        && (q.root_runs.is_empty() || q.root_runs.contains(&i.root_run) || q.root_runs.contains(&i.run_id))
        && (q.ids.is_empty() || q.ids.contains(&i.id))
}

/// Groups `items` (waiting ones) by shape, in the order each shape first appears.
pub fn group_items<'a>(items: impl IntoIterator<Item = &'a InboxItem>) -> Vec<GroupCount> {
    let mut groups: Vec<GroupCount> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for i in items {
        let g = *at.entry(&i.shape).or_insert_with(|| {
            groups.push(GroupCount {
                shape: i.shape.clone(),
                flow: i.flow.clone(),
                step: i.step.clone(),
                kind: i.kind.clone(),
                schema: i.schema.clone(),
                count: 0,
                oldest: i.created_at,
                soonest_expiry: None,
            });
            groups.len() - 1
        });
        let g = &mut groups[g];
        g.count += 1;
        g.oldest = g.oldest.min(i.created_at);
        g.soonest_expiry = match (g.soonest_expiry, i.expires_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    groups
}

impl Inbox for MemoryInbox {
    fn add<'a>(&'a self, items: &'a [InboxItem]) -> BlobFuture<'a, ()> {
        Box::pin(async move {
            let mut s = self.lock();
            for i in items {
                if !s.index.contains_key(&i.id) {
                    let at = s.items.len();
                    s.index.insert(i.id.clone(), at);
                    s.items.push(i.clone());
                }
            }
            Ok(())
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BlobFuture<'a, Option<InboxItem>> {
        Box::pin(async move {
            let s = self.lock();
            Ok(s.index.get(id).map(|&i| s.items[i].clone()))
        })
    }

    fn list<'a>(&'a self, q: &'a ItemQuery) -> BlobFuture<'a, Vec<InboxItem>> {
        Box::pin(async move {
            let s = self.lock();
            let mut out: Vec<InboxItem> = s.items.iter().filter(|i| selects(q, i)).cloned().collect();
            out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
            if let Some(n) = q.limit {
                out.truncate(n);
            }
            Ok(out)
        })
    }

    fn groups<'a>(&'a self, q: &'a ItemQuery) -> BlobFuture<'a, Vec<GroupCount>> {
        Box::pin(async move {
            let q = ItemQuery {
                state: Some(ItemState::Waiting),
                limit: None,
                ..q.clone()
            };
            let items = self.list(&q).await?;
            Ok(group_items(&items))
        })
    }

    fn answers<'a>(&'a self, run_id: &'a str) -> BlobFuture<'a, HashMap<(String, Option<u64>), Answer>> {
        Box::pin(async move {
            let s = self.lock();
            let mut out = HashMap::new();
            for i in s.items.iter().filter(|i| i.run_id == run_id) {
                let answer = match i.state {
                    ItemState::Decided => s
                        .log
                        .iter()
                        .rev()
                        .find(|d| d.item_id == i.id)
                        .map(|d| Answer::Decided(d.decision.clone())),
                    ItemState::Expired => Some(Answer::Expired),
                    _ => None,
                };
                if let Some(a) = answer {
                    out.insert((i.number.clone(), i.iteration), a);
                }
            }
            Ok(out)
        })
    }

    fn decide<'a>(&'a self, answers: Vec<NewDecision>) -> BlobFuture<'a, Vec<Result<DecisionRow, Refusal>>> {
        Box::pin(async move {
            let now = crate::record::now_ms();
            let mut s = self.lock();
            let mut out = Vec::with_capacity(answers.len());
            for a in answers {
                let Some(&at) = s.index.get(&a.item_id) else {
                    out.push(Err(Refusal::NotFound));
                    continue;
                };
                let item = &s.items[at];
                let refusal = match item.state {
                    ItemState::Waiting => match item.expires_at {
                        Some(e) if e <= now => Some(Refusal::Expired { at: e }),
                        _ => None,
                    },
                    ItemState::Decided => {
                        let d = s.log.iter().rev().find(|d| d.item_id == a.item_id);
                        Some(d.map_or(Refusal::Cancelled, |d| Refusal::Decided {
                            actor: d.actor.clone(),
                            via: d.via,
                            at: d.at,
                        }))
                    }
                    ItemState::Expired => Some(Refusal::Expired {
                        at: item.expires_at.or(item.settled_at).unwrap_or(0),
                    }),
                    ItemState::Cancelled => Some(Refusal::Cancelled),
                };
                if let Some(r) = refusal {
                    out.push(Err(r));
                    continue;
                }
                let row = DecisionRow {
                    id: crate::record::inbox::new_id('d'),
                    item_id: a.item_id,
                    run_id: item.run_id.clone(),
                    actor: a.actor,
                    via: a.via,
                    decision: a.decision,
                    reason: a.reason,
                    edited: a.edited,
                    bulk_id: a.bulk_id,
                    at: now,
                };
                let item = &mut s.items[at];
                item.state = ItemState::Decided;
                item.settled_at = Some(now);
                s.log.push(row.clone());
                out.push(Ok(row));
            }
            Ok(out)
        })
    }

    fn expire_due(&self) -> BlobFuture<'_, Vec<InboxItem>> {
        Box::pin(async move {
            let now = crate::record::now_ms();
            let mut s = self.lock();
            let mut out = Vec::new();
            for i in &mut s.items {
                if i.state == ItemState::Waiting && i.expires_at.is_some_and(|e| e <= now) {
                    i.state = ItemState::Expired;
                    i.settled_at = Some(now);
                    out.push(i.clone());
                }
            }
            Ok(out)
        })
    }

    fn cancel_runs<'a>(&'a self, run_ids: &'a [String]) -> BlobFuture<'a, u64> {
        Box::pin(async move {
            let now = crate::record::now_ms();
            let mut s = self.lock();
            let mut n = 0;
            for i in &mut s.items {
                if i.state == ItemState::Waiting && run_ids.contains(&i.run_id) {
                    i.state = ItemState::Cancelled;
                    i.settled_at = Some(now);
                    n += 1;
                }
            }
            Ok(n)
        })
    }

    fn log<'a>(&'a self, q: &'a LogQuery) -> BlobFuture<'a, Vec<DecisionRow>> {
        Box::pin(async move {
            let s = self.lock();
            let roots: HashMap<&str, &str> = s
                .items
                .iter()
                .map(|i| (i.id.as_str(), i.root_run.as_str()))
                .collect();
            let mut out: Vec<DecisionRow> =
                s.log
                    .iter()
                    .filter(|d| {
                        q.run.as_ref().is_none_or(|r| {
                            d.run_id == *r || roots.get(d.item_id.as_str()) == Some(&r.as_str())
                        }) && q.since.is_none_or(|t| d.at >= t)
                    })
                    .cloned()
                    .collect();
            if let Some(n) = q.limit {
                out.truncate(n);
            }
            Ok(out)
        })
    }

    fn put_bulk<'a>(&'a self, p: &'a BulkPreview) -> BlobFuture<'a, ()> {
        Box::pin(async move {
            self.lock().bulks.insert(p.token.clone(), p.clone());
            Ok(())
        })
    }

    fn get_bulk<'a>(&'a self, token: &'a str) -> BlobFuture<'a, Option<BulkPreview>> {
        Box::pin(async move { Ok(self.lock().bulks.get(token).cloned()) })
    }

    fn mark_bulk<'a>(&'a self, token: &'a str, bulk_id: &'a str) -> BlobFuture<'a, bool> {
        Box::pin(async move {
            let mut s = self.lock();
            match s.bulks.get_mut(token) {
                Some(p) if p.applied.is_none() => {
                    p.applied = Some((crate::record::now_ms(), bulk_id.to_string()));
                    Ok(true)
                }
                _ => Ok(false),
            }
        })
    }

    fn now(&self) -> BlobFuture<'_, u64> {
        Box::pin(async move { Ok(crate::record::now_ms()) })
    }

    fn inputs<'a>(&'a self, _run_ids: &'a [String]) -> BlobFuture<'a, HashMap<String, Value>> {
        // The memory store's runs are its own: read one by one, in memory.
        Box::pin(async move { Ok(HashMap::new()) })
    }
}
