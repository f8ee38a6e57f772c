//! The inbox in a SQL store (SPEC §15): the tables of schema 12, read and written on the
//! pool (not through the writer of run records). A decision marks its item decided, appends
//! its row and queues a submitted run again in one transaction per chunk of answers; an
//! item counts as decided only through the `UPDATE ... WHERE state = 'waiting'` that found
//! it waiting, so of two answers at once exactly one is recorded.

use std::collections::HashMap;

use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::{AnyPool, AssertSqlSafe, Connection, Row};

use super::error::Ctx;
use crate::record::inbox::{DecisionRow, InboxItem, ItemState, Via};
use crate::store::StoreError;
use crate::store::blobs::BlobFuture;
use crate::store::inbox::{
    Answer, BulkPreview, GroupCount, Inbox, ItemQuery, LogQuery, NewDecision, Refusal,
};

/// How many items one statement names.
const CHUNK: usize = 500;

const ITEM_COLUMNS: &str = "i.id, i.run_id, i.root_run, i.number, i.iteration, i.shape, i.batch, i.item, \
     i.question, i.calls, i.created_at, i.expires_at, i.state, i.settled_at, \
     s.flow, s.step, s.kind, s.schema";

const DECISION_COLUMNS: &str = "id, item_id, run_id, actor, via, decision, reason, edited, bulk_id, at";

/// The inbox of a SQL store.
pub struct SqlInbox {
    pub(super) pool: AnyPool,
    pub(super) ctx: Ctx,
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn uint(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn json_text(v: &Value) -> String {
    v.to_string()
}

fn parse_json(text: &str, what: &str) -> Result<Value, String> {
    crate::json::from_str(text).map_err(|e| format!("{what}: {}", e.cause()))
}

/// Decodes an item row; `schemas` keeps each shape's schema parsed once, since every item
/// of a shape repeats it.
fn decode_item(row: &AnyRow, schemas: &mut HashMap<String, Value>) -> Result<InboxItem, String> {
    let get_s = |c: &str| {
        row.try_get::<String, _>(c)
            .map_err(|e| format!("column `{c}`: {e}"))
    };
    let get_os = |c: &str| {
        row.try_get::<Option<String>, _>(c)
            .map_err(|e| format!("column `{c}`: {e}"))
    };
    let get_i = |c: &str| row.try_get::<i64, _>(c).map_err(|e| format!("column `{c}`: {e}"));
    let get_oi = |c: &str| {
        row.try_get::<Option<i64>, _>(c)
            .map_err(|e| format!("column `{c}`: {e}"))
    };
    let iteration = get_i("iteration")?;
    let state = get_s("state")?;
    let calls = match get_os("calls")? {
        Some(t) => match parse_json(&t, "column `calls`")? {
            Value::Array(a) => a,
            _ => return Err("column `calls`: not a list".into()),
        },
        None => Vec::new(),
    };
    Ok(InboxItem {
        id: get_s("id")?,
        run_id: get_s("run_id")?,
        root_run: get_s("root_run")?,
        number: get_s("number")?,
        iteration: u64::try_from(iteration).ok(),
        flow: get_s("flow")?,
        step: get_s("step")?,
        batch: get_os("batch")?,
        item: get_os("item")?,
        kind: get_s("kind")?,
        question: get_s("question")?,
        schema: {
            let shape = get_s("shape")?;
            match schemas.get(&shape) {
                Some(v) => v.clone(),
                None => {
                    let v = parse_json(&get_s("schema")?, "column `schema`")?;
                    schemas.insert(shape, v.clone());
                    v
                }
            }
        },
        calls,
        shape: get_s("shape")?,
        created_at: uint(get_i("created_at")?),
        expires_at: get_oi("expires_at")?.map(uint),
        state: ItemState::parse(&state).ok_or_else(|| format!("column `state`: unknown state `{state}`"))?,
        settled_at: get_oi("settled_at")?.map(uint),
    })
}

fn decode_decision(row: &AnyRow) -> Result<DecisionRow, String> {
    let get_s = |c: &str| {
        row.try_get::<String, _>(c)
            .map_err(|e| format!("column `{c}`: {e}"))
    };
    let get_os = |c: &str| {
        row.try_get::<Option<String>, _>(c)
            .map_err(|e| format!("column `{c}`: {e}"))
    };
    let via = get_s("via")?;
    Ok(DecisionRow {
        id: get_s("id")?,
        item_id: get_s("item_id")?,
        run_id: get_s("run_id")?,
        actor: get_s("actor")?,
        via: Via::parse(&via).ok_or_else(|| format!("column `via`: unknown channel `{via}`"))?,
        decision: parse_json(&get_s("decision")?, "column `decision`")?,
        reason: get_os("reason")?,
        edited: get_os("edited")?
            .map(|t| parse_json(&t, "column `edited`"))
            .transpose()?,
        bulk_id: get_os("bulk_id")?,
        at: uint(
            row.try_get::<i64, _>("at")
                .map_err(|e| format!("column `at`: {e}"))?,
        ),
    })
}

impl SqlInbox {
    fn corrupt(&self, what: &str, m: String) -> StoreError {
        StoreError::Database {
            store: self.ctx.store.to_string(),
            what: what.to_string(),
            message: m,
        }
    }

    /// `$from, $from+1, …` for `n` parameters.
    fn params(&self, from: usize, n: usize) -> String {
        (from..from + n)
            .map(|i| self.ctx.dialect.param(i))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The WHERE clause of `q` and its parameters in order, from parameter `from`.
    fn item_where(&self, q: &ItemQuery, from: usize) -> (String, Vec<String>) {
        let mut clauses = vec!["1 = 1".to_string()];
        let mut binds = Vec::new();
        let mut next = from;
        let mut eq = |col: &str, v: &str, clauses: &mut Vec<String>, binds: &mut Vec<String>| {
            clauses.push(format!("{col} = {}", self.ctx.dialect.param(next)));
            binds.push(v.to_string());
            next += 1;
        };
        if let Some(s) = q.state {
            eq("i.state", s.as_str(), &mut clauses, &mut binds);
        }
        if let Some(b) = &q.batch {
            eq("i.batch", b, &mut clauses, &mut binds);
        }
        if let Some(f) = &q.flow {
            eq("s.flow", f, &mut clauses, &mut binds);
        }
        if let Some(s) = &q.step {
            eq("s.step", s, &mut clauses, &mut binds);
        }
        if !q.root_runs.is_empty() {
            let a = self.params(next, q.root_runs.len());
            let b = self.params(next + q.root_runs.len(), q.root_runs.len());
            clauses.push(format!("(i.root_run IN ({a}) OR i.run_id IN ({b}))"));
            binds.extend(q.root_runs.iter().cloned());
            binds.extend(q.root_runs.iter().cloned());
            next += 2 * q.root_runs.len();
        }
        if !q.ids.is_empty() {
            clauses.push(format!("i.id IN ({})", self.params(next, q.ids.len())));
            binds.extend(q.ids.iter().cloned());
        }
        (clauses.join(" AND "), binds)
    }

    async fn list_items(&self, q: &ItemQuery) -> Result<Vec<InboxItem>, StoreError> {
        const WHAT: &str = "reading the inbox";
        // Many ids: read a chunk at a time.
        if q.ids.len() > CHUNK {
            let mut out = Vec::new();
            for chunk in q.ids.chunks(CHUNK) {
                let part = ItemQuery {
                    ids: chunk.to_vec(),
                    limit: None,
                    ..q.clone()
                };
                out.extend(Box::pin(self.list_items(&part)).await?);
            }
            out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
            if let Some(n) = q.limit {
                out.truncate(n);
            }
            return Ok(out);
        }
        let (clause, binds) = self.item_where(q, 1);
        let limit = q.limit.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
        let sql = format!(
            "SELECT {ITEM_COLUMNS} FROM inbox i JOIN inbox_shapes s ON s.shape = i.shape \
             WHERE {clause} ORDER BY i.created_at, i.id{limit}"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for b in binds {
            query = query.bind(b);
        }
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.ctx.error(WHAT, &e))?;
        let mut schemas = HashMap::new();
        rows.iter()
            .map(|r| decode_item(r, &mut schemas).map_err(|m| self.corrupt(WHAT, m)))
            .collect()
    }

    /// The refusal of item `id`, which an answer did not find waiting and unexpired.
    async fn refusal(&self, id: &str, conn: &mut sqlx::AnyConnection) -> Result<Refusal, StoreError> {
        const WHAT: &str = "reading a decided item";
        let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
        let row = sqlx::query("SELECT state, expires_at, settled_at FROM inbox WHERE id = $1")
            .bind(id.to_string())
            .fetch_optional(&mut *conn)
            .await
            .map_err(err)?;
        let Some(row) = row else {
            return Ok(Refusal::NotFound);
        };
        let state: String = row.try_get("state").map_err(err)?;
        let expires: Option<i64> = row.try_get("expires_at").map_err(err)?;
        let settled: Option<i64> = row.try_get("settled_at").map_err(err)?;
        Ok(match ItemState::parse(&state) {
            Some(ItemState::Decided) => {
                let d = sqlx::query(
                    "SELECT actor, via, at FROM decisions WHERE item_id = $1 ORDER BY at DESC, id DESC LIMIT 1",
                )
                .bind(id.to_string())
                .fetch_optional(&mut *conn)
                .await
                .map_err(err)?;
                match d {
                    Some(d) => Refusal::Decided {
                        actor: d.try_get("actor").map_err(err)?,
                        via: Via::parse(&d.try_get::<String, _>("via").map_err(err)?).unwrap_or(Via::Cli),
                        at: uint(d.try_get("at").map_err(err)?),
                    },
                    None => Refusal::Cancelled,
                }
            }
            Some(ItemState::Cancelled) => Refusal::Cancelled,
            // Expired, or waiting with its expiry passed.
            _ => Refusal::Expired {
                at: uint(expires.or(settled).unwrap_or(0)),
            },
        })
    }

    /// Queues again the submitted runs among `roots` that wait `interrupted` and that no
    /// process holds: the workers continue them.
    ///
    /// Every interrupted run named is locked, held or not (the lease is tested in `SET`, not
    /// in `WHERE`): a worker giving a run back at this moment either committed first, and
    /// this sees its lease gone, or waits for this commit, and its release then finds the
    /// answer and queues the run itself ([`SqlStore::release`](super::SqlStore::release)).
    async fn requeue(&self, roots: &[String], conn: &mut sqlx::AnyConnection) -> Result<(), sqlx::Error> {
        let now = self.ctx.dialect.now_ms();
        for chunk in roots.chunks(CHUNK) {
            let sql = format!(
                "UPDATE runs SET status = CASE WHEN lease_owner IS NULL OR lease_until < {now} \
                 THEN 'queued' ELSE status END WHERE id IN ({}) AND status = 'interrupted' \
                 AND lease_epoch IS NOT NULL",
                self.params(1, chunk.len())
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for r in chunk {
                q = q.bind(r.clone());
            }
            q.execute(&mut *conn).await?;
        }
        Ok(())
    }

    async fn decide_chunk(
        &self,
        answers: Vec<NewDecision>,
    ) -> Result<Vec<Result<DecisionRow, Refusal>>, StoreError> {
        const WHAT: &str = "recording decisions";
        let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
        let now = self.ctx.dialect.now_ms();
        let mut conn = self.pool.acquire().await.map_err(err)?;
        let mut tx = conn
            .begin_with(self.ctx.dialect.begin_write())
            .await
            .map_err(err)?;
        let at: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT {now}")))
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?;
        // One answer per item in a statement: a second answer to one item in the same call
        // is refused like any other second answer.
        let mut taken: HashMap<String, (String, String)> = HashMap::new();
        let ids: Vec<String> = {
            let mut seen = std::collections::HashSet::new();
            answers
                .iter()
                .filter(|a| seen.insert(a.item_id.clone()))
                .map(|a| a.item_id.clone())
                .collect()
        };
        if !ids.is_empty() {
            let sql = format!(
                "UPDATE inbox SET state = 'decided', settled_at = {at} WHERE id IN ({}) AND state = 'waiting' \
                 AND (expires_at IS NULL OR expires_at > {at}) RETURNING id, run_id, root_run",
                self.params(1, ids.len())
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for id in &ids {
                q = q.bind(id.clone());
            }
            for row in q.fetch_all(&mut *tx).await.map_err(err)? {
                let id: String = row.try_get("id").map_err(err)?;
                let run: String = row.try_get("run_id").map_err(err)?;
                let root: String = row.try_get("root_run").map_err(err)?;
                taken.insert(id, (run, root));
            }
        }
        let mut out = Vec::with_capacity(answers.len());
        let mut rows: Vec<(DecisionRow, String)> = Vec::new();
        let mut refused: Vec<(usize, String)> = Vec::new();
        for (n, a) in answers.into_iter().enumerate() {
            match taken.remove(&a.item_id) {
                Some((run, root)) => {
                    let row = DecisionRow {
                        id: crate::record::inbox::new_id('d'),
                        item_id: a.item_id,
                        run_id: run,
                        actor: a.actor,
                        via: a.via,
                        decision: a.decision,
                        reason: a.reason,
                        edited: a.edited,
                        bulk_id: a.bulk_id,
                        at: uint(at),
                    };
                    rows.push((row.clone(), root));
                    out.push(Ok(row));
                }
                None => {
                    // Why is read once the transaction ends.
                    refused.push((n, a.item_id));
                    out.push(Err(Refusal::NotFound));
                }
            }
        }
        for chunk in rows.chunks(CHUNK / 10) {
            let cols = 11;
            let values: Vec<String> = (0..chunk.len())
                .map(|r| format!("({})", self.params(r * cols + 1, cols)))
                .collect();
            let sql = format!(
                "INSERT INTO decisions (id, item_id, run_id, root_run, actor, via, decision, reason, edited, bulk_id, at) \
                 VALUES {}",
                values.join(", ")
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (d, root) in chunk {
                q = q
                    .bind(d.id.clone())
                    .bind(d.item_id.clone())
                    .bind(d.run_id.clone())
                    .bind(root.clone())
                    .bind(d.actor.clone())
                    .bind(d.via.as_str())
                    .bind(json_text(&d.decision))
                    .bind(d.reason.clone())
                    .bind(d.edited.as_ref().map(json_text))
                    .bind(d.bulk_id.clone())
                    .bind(int(d.at));
            }
            q.execute(&mut *tx).await.map_err(err)?;
        }
        let roots: Vec<String> = {
            let mut seen = std::collections::HashSet::new();
            rows.iter()
                .filter(|(_, r)| seen.insert(r.clone()))
                .map(|(_, r)| r.clone())
                .collect()
        };
        self.requeue(&roots, &mut tx).await.map_err(err)?;
        tx.commit().await.map_err(err)?;
        for (n, id) in refused {
            out[n] = Err(self.refusal(&id, &mut conn).await?);
        }
        Ok(out)
    }
}

impl SqlInbox {
    /// Marks the waiting items whose expiry passed (by the database's clock) `expired` and
    /// queues their submitted runs again, in one transaction; returns their ids. With
    /// nothing due it is one `UPDATE` that finds nothing (by `inbox_by_expiry`): cheap enough
    /// for every worker's heartbeat.
    pub async fn expire(&self) -> Result<Vec<String>, StoreError> {
        const WHAT: &str = "settling expired questions";
        let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
        let now = self.ctx.dialect.now_ms();
        let mut conn = self.pool.acquire().await.map_err(err)?;
        let mut tx = conn
            .begin_with(self.ctx.dialect.begin_write())
            .await
            .map_err(err)?;
        let rows = sqlx::query(AssertSqlSafe(format!(
            "UPDATE inbox SET state = 'expired', settled_at = {now} \
             WHERE state = 'waiting' AND expires_at IS NOT NULL AND expires_at <= {now} RETURNING id, root_run"
        )))
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        let mut ids = Vec::with_capacity(rows.len());
        let mut seen = std::collections::HashSet::new();
        let mut roots = Vec::new();
        for r in rows {
            ids.push(r.try_get::<String, _>("id").map_err(err)?);
            let root: String = r.try_get("root_run").map_err(err)?;
            if seen.insert(root.clone()) {
                roots.push(root);
            }
        }
        self.requeue(&roots, &mut tx).await.map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(ids)
    }
}

impl Inbox for SqlInbox {
    fn add<'a>(&'a self, items: &'a [InboxItem]) -> BlobFuture<'a, ()> {
        Box::pin(async move {
            const WHAT: &str = "adding to the inbox";
            let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
            if items.is_empty() {
                return Ok(());
            }
            let mut conn = self.pool.acquire().await.map_err(err)?;
            let mut tx = conn
                .begin_with(self.ctx.dialect.begin_write())
                .await
                .map_err(err)?;
            let mut shapes: Vec<&InboxItem> = Vec::new();
            for i in items {
                if !shapes.iter().any(|s| s.shape == i.shape) {
                    shapes.push(i);
                }
            }
            for s in shapes {
                sqlx::query(
                    "INSERT INTO inbox_shapes (shape, flow, step, kind, schema) VALUES ($1, $2, $3, $4, $5) \
                     ON CONFLICT (shape) DO NOTHING",
                )
                .bind(s.shape.clone())
                .bind(s.flow.clone())
                .bind(s.step.clone())
                .bind(s.kind.clone())
                .bind(json_text(&s.schema))
                .execute(&mut *tx)
                .await
                .map_err(err)?;
            }
            for chunk in items.chunks(CHUNK / 10) {
                let cols = 14;
                let values: Vec<String> = (0..chunk.len())
                    .map(|r| format!("({})", self.params(r * cols + 1, cols)))
                    .collect();
                let sql = format!(
                    "INSERT INTO inbox (id, run_id, root_run, number, iteration, shape, batch, item, question, \
                     calls, created_at, expires_at, state, settled_at) VALUES {} ON CONFLICT (id) DO NOTHING",
                    values.join(", ")
                );
                let mut q = sqlx::query(AssertSqlSafe(sql));
                for i in chunk {
                    q = q
                        .bind(i.id.clone())
                        .bind(i.run_id.clone())
                        .bind(i.root_run.clone())
                        .bind(i.number.clone())
                        .bind(i.iteration.map_or(-1, int))
                        .bind(i.shape.clone())
                        .bind(i.batch.clone())
                        .bind(i.item.clone())
                        .bind(i.question.clone())
                        .bind((!i.calls.is_empty()).then(|| json_text(&Value::Array(i.calls.clone()))))
                        .bind(int(i.created_at))
                        .bind(i.expires_at.map(int))
                        .bind(i.state.as_str())
                        .bind(i.settled_at.map(int));
                }
                q.execute(&mut *tx).await.map_err(err)?;
            }
            tx.commit().await.map_err(err)
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BlobFuture<'a, Option<InboxItem>> {
        Box::pin(async move {
            let q = ItemQuery {
                ids: vec![id.to_string()],
                ..ItemQuery::default()
            };
            Ok(self.list_items(&q).await?.into_iter().next())
        })
    }

    fn list<'a>(&'a self, q: &'a ItemQuery) -> BlobFuture<'a, Vec<InboxItem>> {
        Box::pin(self.list_items(q))
    }

    fn groups<'a>(&'a self, q: &'a ItemQuery) -> BlobFuture<'a, Vec<GroupCount>> {
        Box::pin(async move {
            const WHAT: &str = "counting the inbox";
            let q = ItemQuery {
                state: Some(ItemState::Waiting),
                ..q.clone()
            };
            let (clause, binds) = self.item_where(&q, 1);
            let sql = format!(
                "SELECT s.shape, s.flow, s.step, s.kind, s.schema, COUNT(*) AS n, MIN(i.created_at) AS oldest, \
                 MIN(i.expires_at) AS soonest FROM inbox i JOIN inbox_shapes s ON s.shape = i.shape \
                 WHERE {clause} GROUP BY s.shape, s.flow, s.step, s.kind, s.schema ORDER BY MIN(i.created_at)"
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for b in binds {
                query = query.bind(b);
            }
            let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
            let rows = query.fetch_all(&self.pool).await.map_err(err)?;
            rows.iter()
                .map(|r| {
                    Ok(GroupCount {
                        shape: r.try_get("shape").map_err(err)?,
                        flow: r.try_get("flow").map_err(err)?,
                        step: r.try_get("step").map_err(err)?,
                        kind: r.try_get("kind").map_err(err)?,
                        schema: parse_json(
                            &r.try_get::<String, _>("schema").map_err(err)?,
                            "column `schema`",
                        )
                        .map_err(|m| self.corrupt(WHAT, m))?,
                        count: uint(r.try_get("n").map_err(err)?),
                        oldest: uint(r.try_get("oldest").map_err(err)?),
                        soonest_expiry: r.try_get::<Option<i64>, _>("soonest").map_err(err)?.map(uint),
                    })
                })
                .collect()
        })
    }

    fn answers<'a>(&'a self, run_id: &'a str) -> BlobFuture<'a, HashMap<(String, Option<u64>), Answer>> {
        Box::pin(async move {
            const WHAT: &str = "reading the decisions of a run";
            let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
            let rows = sqlx::query(
                "SELECT i.id, i.number, i.iteration, i.state, \
                 (SELECT d.decision FROM decisions d WHERE d.item_id = i.id ORDER BY d.at DESC, d.id DESC LIMIT 1) AS decision \
                 FROM inbox i WHERE i.run_id = $1 AND i.state IN ('decided', 'expired')",
            )
            .bind(run_id.to_string())
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
            let mut out = HashMap::new();
            for r in rows {
                let number: String = r.try_get("number").map_err(err)?;
                let iteration: i64 = r.try_get("iteration").map_err(err)?;
                let state: String = r.try_get("state").map_err(err)?;
                let answer = if state == "expired" {
                    Answer::Expired
                } else {
                    let text: Option<String> = r.try_get("decision").map_err(err)?;
                    let Some(text) = text else { continue };
                    Answer::Decided(
                        parse_json(&text, "column `decision`").map_err(|m| self.corrupt(WHAT, m))?,
                    )
                };
                out.insert((number, u64::try_from(iteration).ok()), answer);
            }
            Ok(out)
        })
    }

    fn decide<'a>(&'a self, answers: Vec<NewDecision>) -> BlobFuture<'a, Vec<Result<DecisionRow, Refusal>>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(answers.len());
            let mut answers = answers.into_iter().peekable();
            while answers.peek().is_some() {
                let chunk: Vec<NewDecision> = answers.by_ref().take(CHUNK).collect();
                out.extend(self.decide_chunk(chunk).await?);
            }
            Ok(out)
        })
    }

    fn expire_due(&self) -> BlobFuture<'_, Vec<InboxItem>> {
        Box::pin(async move {
            let ids = self.expire().await?;
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            self.list_items(&ItemQuery {
                ids,
                ..ItemQuery::default()
            })
            .await
        })
    }

    fn cancel_runs<'a>(&'a self, run_ids: &'a [String]) -> BlobFuture<'a, u64> {
        Box::pin(async move {
            const WHAT: &str = "closing the questions of ended runs";
            let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
            let now = self.ctx.dialect.now_ms();
            let mut n = 0;
            for chunk in run_ids.chunks(CHUNK) {
                let sql = format!(
                    "UPDATE inbox SET state = 'cancelled', settled_at = {now} WHERE state = 'waiting' AND run_id IN ({})",
                    self.params(1, chunk.len())
                );
                let mut q = sqlx::query(AssertSqlSafe(sql));
                for r in chunk {
                    q = q.bind(r.clone());
                }
                n += q.execute(&self.pool).await.map_err(err)?.rows_affected();
            }
            Ok(n)
        })
    }

    fn log<'a>(&'a self, q: &'a LogQuery) -> BlobFuture<'a, Vec<DecisionRow>> {
        Box::pin(async move {
            const WHAT: &str = "reading the decisions log";
            let mut clauses = vec!["1 = 1".to_string()];
            let mut q_run = None;
            if let Some(r) = &q.run {
                clauses.push("(run_id = $1 OR root_run = $1)".into());
                q_run = Some(r.clone());
            }
            if let Some(t) = q.since {
                clauses.push(format!("at >= {}", int(t)));
            }
            let limit = q.limit.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
            let sql = format!(
                "SELECT {DECISION_COLUMNS} FROM decisions WHERE {} ORDER BY at, id{limit}",
                clauses.join(" AND ")
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            if let Some(r) = q_run {
                query = query.bind(r);
            }
            let rows = query
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.ctx.error(WHAT, &e))?;
            rows.iter()
                .map(|r| decode_decision(r).map_err(|m| self.corrupt(WHAT, m)))
                .collect()
        })
    }

    fn put_bulk<'a>(&'a self, p: &'a BulkPreview) -> BlobFuture<'a, ()> {
        Box::pin(async move {
            const WHAT: &str = "storing a bulk preview";
            sqlx::query(
                "INSERT INTO inbox_bulk (token, filter, decision, items, created_at) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(p.token.clone())
            .bind(p.filter.clone())
            .bind(p.decision.as_ref().map(json_text))
            .bind(json_text(&Value::from(p.items.clone())))
            .bind(int(p.created_at))
            .execute(&self.pool)
            .await
            .map_err(|e| self.ctx.error(WHAT, &e))?;
            Ok(())
        })
    }

    fn get_bulk<'a>(&'a self, token: &'a str) -> BlobFuture<'a, Option<BulkPreview>> {
        Box::pin(async move {
            const WHAT: &str = "reading a bulk preview";
            let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
            let row = sqlx::query(
                "SELECT token, filter, decision, items, created_at, applied_at, bulk_id FROM inbox_bulk WHERE token = $1",
            )
            .bind(token.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(err)?;
            let Some(r) = row else { return Ok(None) };
            let items: Vec<String> = serde_json::from_str(&r.try_get::<String, _>("items").map_err(err)?)
                .map_err(|e| self.corrupt(WHAT, format!("column `items`: {e}")))?;
            let decision = r
                .try_get::<Option<String>, _>("decision")
                .map_err(err)?
                .map(|t| parse_json(&t, "column `decision`"))
                .transpose()
                .map_err(|m| self.corrupt(WHAT, m))?;
            let applied_at: Option<i64> = r.try_get("applied_at").map_err(err)?;
            let bulk_id: Option<String> = r.try_get("bulk_id").map_err(err)?;
            Ok(Some(BulkPreview {
                token: r.try_get("token").map_err(err)?,
                filter: r.try_get("filter").map_err(err)?,
                decision,
                items,
                created_at: uint(r.try_get("created_at").map_err(err)?),
                applied: applied_at.zip(bulk_id).map(|(a, b)| (uint(a), b)),
            }))
        })
    }

    fn mark_bulk<'a>(&'a self, token: &'a str, bulk_id: &'a str) -> BlobFuture<'a, bool> {
        Box::pin(async move {
            const WHAT: &str = "marking a bulk preview applied";
            let now = self.ctx.dialect.now_ms();
            let done = sqlx::query(AssertSqlSafe(format!(
                "UPDATE inbox_bulk SET applied_at = {now}, bulk_id = $1 WHERE token = $2 AND applied_at IS NULL"
            )))
            .bind(bulk_id.to_string())
            .bind(token.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.ctx.error(WHAT, &e))?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn now(&self) -> BlobFuture<'_, u64> {
        Box::pin(async move {
            let now = self.ctx.dialect.now_ms();
            let at: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT {now}")))
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.ctx.error("reading the store's clock", &e))?;
            Ok(uint(at))
        })
    }

    fn inputs<'a>(&'a self, run_ids: &'a [String]) -> BlobFuture<'a, HashMap<String, Value>> {
        Box::pin(async move {
            const WHAT: &str = "reading the inputs of waiting runs";
            let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
            let mut out = HashMap::with_capacity(run_ids.len());
            for chunk in run_ids.chunks(CHUNK) {
                let sql = format!(
                    "SELECT id, input FROM runs WHERE id IN ({})",
                    self.params(1, chunk.len())
                );
                let q = chunk
                    .iter()
                    .fold(sqlx::query(AssertSqlSafe(sql)), |q, id| q.bind(id.clone()));
                for r in q.fetch_all(&self.pool).await.map_err(err)? {
                    let id: String = r.try_get("id").map_err(err)?;
                    let text: String = r.try_get("input").map_err(err)?;
                    let input = parse_json(&text, "column `input`").map_err(|m| self.corrupt(WHAT, m))?;
                    out.insert(id, input);
                }
            }
            Ok(out)
        })
    }
}
