//! Group commit: one writer task owns every write of a store. Recording tasks send it their
//! encoded rows over a channel; it drains whatever is queued (up to `max_batch`) into one
//! transaction, commits, and only then answers each request. Many concurrent runs thus share
//! a commit — one WAL append (and, with `synchronous=FULL`, one fsync) for hundreds of step
//! records — while every `record_step(..).await` still returns only once its record is
//! committed (SPEC §7.3).
//!
//! Inside the transaction each kind of write (runs created, runs updated, steps recorded) is
//! one multi-row statement per chunk ([`statements`](super::statements)), not one per record;
//! a batch that needs a single statement runs it without `BEGIN`/`COMMIT`, as its own
//! transaction.
//!
//! A write may also be *queued*: its sender does not wait for it, and a later write that is
//! waited for commits it first (FIFO, one writer). If a queued write fails, no later write of
//! the same run is made: each fails with that error, so a run's records never skip one.
//!
//! A write of a submitted run carries its [`Fence`]: the root run whose lease it is made under
//! and the lease epoch this worker claimed it at. A group holding fenced writes first reads
//! those runs' epochs (share-locked on PostgreSQL, until the commit) and the store's schema
//! version, in its own transaction: a write whose run was taken over (its epoch moved on) is
//! refused with [`StoreError::LeaseLost`], every fenced write once a newer switchyard migrated
//! the store with [`StoreError::NewerSchema`] — so a worker that lost its lease, or that is older
//! than the store, commits nothing (SPEC §12).
//!
//! A transaction that fails is rolled back whole. When the failure concerns one record (a
//! constraint, say), the batch is replayed one record per transaction so the others still
//! commit and only the culprit gets the error; when it concerns the store (disk full, locked,
//! connection lost), every request of the batch gets it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, AnyPool, AssertSqlSafe, Connection, Row};
use tokio::sync::{mpsc, oneshot};

use super::Dialect;
use super::error::Ctx;
use super::rows::{RunRow, StepRow};
use super::statements::{chunks, existing_runs, update_runs, upsert_runs, upsert_steps, write_heads};
use crate::store::StoreError;

/// One write.
#[derive(Debug)]
pub(crate) enum Op {
    /// `create_run`: insert, or replace an existing run's record.
    CreateRun(RunRow),
    /// `update_run`: replace an existing run's record; `NotFound` when there is none.
    UpdateRun(RunRow),
    /// `record_step`: insert, or replace the record with the same key.
    Step(StepRow),
    /// `flush` of a run: writes nothing; answered once every write queued before it is
    /// committed (they are in earlier groups, or in this one), or with the error a write of
    /// the run would get (an earlier queued write of it failed, its lease was lost).
    Flush(String),
}

impl Op {
    /// What the write is, for error messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Op::CreateRun(r) | Op::UpdateRun(r) => format!("recording run `{}`", r.id),
            Op::Step(s) => {
                format!(
                    "recording step `{}` (attempt {}) of run `{}`",
                    s.number, s.attempt, s.run_id
                )
            }
            Op::Flush(id) => format!("committing the records of run `{id}`"),
        }
    }

    /// The error of a write refused because an earlier write of its run failed (`why`).
    fn refused(&self, why: &str) -> StoreError {
        StoreError::Other(format!(
            "{}: not written, an earlier write of the run failed: {why}",
            self.describe()
        ))
    }
}

/// The lease a write of a submitted run is made under (SPEC §12): the root run holding it
/// (child runs write under their root's) and the epoch it was claimed at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fence {
    pub root: Arc<str>,
    pub epoch: i64,
}

pub(crate) struct Request {
    pub op: Op,
    /// Set for the runs a worker holds.
    pub fence: Option<Fence>,
    /// `None`: queued, nobody waits for the outcome.
    pub done: Option<oneshot::Sender<Result<(), StoreError>>>,
}

/// How long queued writes alone wait for a write that is waited for ([`Writer::linger`]):
/// longer than a fast tool call takes, short next to anything a person would notice.
const LINGER: std::time::Duration = std::time::Duration::from_millis(50);

pub(crate) struct Writer {
    pub pool: AnyPool,
    pub ctx: Ctx,
    pub max_batch: usize,
    /// Runs a queued write of which failed, with the error and the lease epoch it was made
    /// under: their later writes (under that epoch) are refused.
    pub failed: HashMap<String, (String, Option<i64>)>,
    /// The connection of the last commit, kept for the next (in a mutex only so that the
    /// writer's futures, which borrow it, may move between threads).
    pub conn: std::sync::Mutex<Option<PoolConnection<Any>>>,
}

impl Op {
    fn run_id(&self) -> &str {
        match self {
            Op::CreateRun(r) | Op::UpdateRun(r) => &r.id,
            Op::Step(s) => &s.run_id,
            Op::Flush(id) => id,
        }
    }
}

impl Writer {
    /// Serves requests until every sender is gone, then returns (after the last commit).
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        while rx.recv_many(&mut batch, self.max_batch).await > 0 {
            self.linger(&mut rx, &mut batch).await;
            self.commit(&mut batch).await;
        }
    }

    /// Queued writes alone do not make a commit at once: they wait, up to [`LINGER`], for a
    /// write somebody waits for (which commits them with it), or for a full batch. An agent
    /// loop's turn and its tool calls are then one commit (with the barrier before the next
    /// turn), not one each. Nothing waits on them meanwhile; a crash in the wait loses only
    /// what a queued write may lose (work without effects, redone by a resume).
    async fn linger(&self, rx: &mut mpsc::Receiver<Request>, batch: &mut Vec<Request>) {
        if batch.iter().any(|r| r.done.is_some()) {
            return;
        }
        let until = tokio::time::Instant::now() + LINGER;
        while batch.len() < self.max_batch {
            let from = batch.len();
            let room = self.max_batch - from;
            match tokio::time::timeout_at(until, rx.recv_many(batch, room)).await {
                // Every sender is gone: commit what there is.
                Ok(0) | Err(_) => return,
                Ok(_) if batch[from..].iter().any(|r| r.done.is_some()) => return,
                Ok(_) => {}
            }
        }
    }

    async fn commit(&mut self, batch: &mut Vec<Request>) {
        // Writes of a run whose queued write failed are not made.
        if !self.failed.is_empty() {
            let mut i = 0;
            while i < batch.len() {
                let epoch = batch[i].fence.as_ref().map(|f| f.epoch);
                if let Some((why, _)) = self
                    .failed
                    .get(batch[i].op.run_id())
                    .filter(|(_, at)| *at == epoch)
                {
                    let req = batch.remove(i);
                    let e = req.op.refused(why);
                    if let Some(done) = req.done {
                        let _ = done.send(Err(e));
                    }
                } else {
                    i += 1;
                }
            }
            if batch.is_empty() {
                return;
            }
        }
        let reqs: Vec<&Request> = batch.iter().collect();
        let t0 = std::time::Instant::now();
        let first = self.transaction(&reqs).await;
        tracing::debug!(
            writes = reqs.len(),
            ms = t0.elapsed().as_secs_f64() * 1000.0,
            "group commit"
        );
        let outcomes = match first {
            Ok(outcomes) => outcomes,
            Err((i, e)) if reqs.len() > 1 && !self.ctx.is_store_wide(&e) => {
                tracing::debug!(
                    store = &*self.ctx.store,
                    "a grouped commit failed at {i}; replaying it one by one"
                );
                let mut outcomes = Vec::with_capacity(reqs.len());
                // Runs a write of which failed here: their later writes in the group are not
                // made (a run's records never skip one), their flushes fail.
                let mut lost: HashMap<&str, String> = HashMap::new();
                for req in &reqs {
                    if let Some(why) = lost.get(req.op.run_id()) {
                        outcomes.push(Err(req.op.refused(why)));
                        continue;
                    }
                    let outcome = match self.transaction(&[req]).await {
                        Ok(mut one) => one.pop().unwrap_or(Ok(())),
                        Err((_, e)) => Err(self.error(&req.op, &e)),
                    };
                    if let Err(e) = &outcome {
                        lost.entry(req.op.run_id()).or_insert_with(|| e.to_string());
                    }
                    outcomes.push(outcome);
                }
                outcomes
            }
            Err((_, e)) => reqs.iter().map(|r| Err(self.error(&r.op, &e))).collect(),
        };
        for (req, outcome) in batch.drain(..).zip(outcomes) {
            match (req.done, outcome) {
                // The caller may have gone away (cancelled); its record is committed all the same.
                (Some(done), outcome) => {
                    let _ = done.send(outcome);
                }
                (None, Err(e)) => {
                    tracing::error!(store = &*self.ctx.store, error = %e, "a queued write failed");
                    let epoch = req.fence.as_ref().map(|f| f.epoch);
                    self.failed
                        .insert(req.op.run_id().to_string(), (e.to_string(), epoch));
                }
                (None, Ok(())) => {}
            }
        }
    }

    fn error(&self, op: &Op, e: &sqlx::Error) -> StoreError {
        match op {
            Op::Step(s) if self.ctx.is_missing_run(e) => StoreError::NotFound(s.run_id.clone()),
            _ => self.ctx.error(&op.describe(), e),
        }
    }

    /// Runs the writes of `reqs` in one transaction. `Ok` holds each one's own outcome (an
    /// update of a missing run is `NotFound` and writes nothing; a fenced write whose lease
    /// is gone is `LeaseLost`); `Err` the index of the failing write (or `reqs.len()` for
    /// begin/commit) and the error, after a rollback.
    async fn transaction(
        &self,
        reqs: &[&Request],
    ) -> Result<Vec<Result<(), StoreError>>, (usize, sqlx::Error)> {
        let fenced = reqs.iter().any(|r| r.fence.is_some());
        let ops: Vec<&Op> = reqs.iter().map(|r| &r.op).collect();
        let plan = (!fenced).then(|| Plan::new(&ops, self.ctx.dialect));
        if let Some(plan) = &plan
            && plan.statements() == 0
        {
            // Flushes alone: what was queued before them is in earlier groups, committed.
            return Ok(reqs.iter().map(|_| Ok(())).collect());
        }
        // The writer keeps the connection of its last commit: its prepared statements
        // (one per statement shape) stay prepared. After a failure it goes back to the pool.
        let held = self.conn.lock().unwrap_or_else(|p| p.into_inner()).take();
        let mut conn = match held {
            Some(conn) => conn,
            None => self.pool.acquire().await.map_err(|e| (reqs.len(), e))?,
        };
        let done = self.writes(&mut conn, reqs, plan.as_ref()).await;
        // A store of one connection (SQLite in memory) lends it to readers between commits.
        if done.is_ok() && self.pool.options().get_max_connections() > 1 {
            *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn);
        }
        done
    }

    /// [`Writer::transaction`] on `conn`.
    async fn writes(
        &self,
        conn: &mut PoolConnection<Any>,
        reqs: &[&Request],
        plan: Option<&Plan<'_>>,
    ) -> Result<Vec<Result<(), StoreError>>, (usize, sqlx::Error)> {
        if let Some(plan) = plan
            && plan.statements() == 1
        {
            // One statement is a transaction of its own: no BEGIN and COMMIT round trips.
            return plan.execute(conn).await;
        }
        let mut tx = conn
            .begin_with(self.ctx.dialect.begin_write())
            .await
            .map_err(|e| (reqs.len(), e))?;
        let executed = match plan {
            Some(plan) => plan.execute(&mut tx).await,
            None => self.fenced(&mut tx, reqs).await,
        };
        let failed = match executed {
            Ok(outcomes) => match tx.commit().await {
                Ok(()) => return Ok(outcomes),
                Err(e) => {
                    conn.close_on_drop();
                    (reqs.len(), e)
                }
            },
            Err(failed) => {
                if let Err(e) = tx.rollback().await {
                    // SQLite rolls back by itself on some errors (SQLITE_FULL among them); a
                    // connection whose state is unclear is not reused.
                    tracing::debug!(store = &*self.ctx.store, "rollback: {e}");
                    conn.close_on_drop();
                }
                failed
            }
        };
        Err(failed)
    }

    /// Inside a transaction: checks the fences of `reqs` and makes the writes that pass.
    async fn fenced(
        &self,
        conn: &mut AnyConnection,
        reqs: &[&Request],
    ) -> Result<Vec<Result<(), StoreError>>, (usize, sqlx::Error)> {
        let mut roots: Vec<&str> = reqs
            .iter()
            .filter_map(|r| r.fence.as_ref().map(|f| &*f.root))
            .collect();
        roots.sort_unstable();
        roots.dedup();
        let params: Vec<String> = (1..=roots.len()).map(|i| self.ctx.dialect.param(i)).collect();
        let sql = format!(
            "SELECT id, lease_epoch, (SELECT COALESCE(MAX(version), 0) FROM schema_version) AS version \
             FROM runs WHERE id IN ({}){}",
            params.join(", "),
            self.ctx.dialect.fence_lock_clause()
        );
        let rows = roots
            .iter()
            .fold(sqlx::query(AssertSqlSafe(sql)), |q, id| q.bind(*id))
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| (reqs.len(), e))?;
        let mut epochs: HashMap<String, Option<i64>> = HashMap::with_capacity(rows.len());
        let mut version = 0i64;
        for row in &rows {
            let id: String = row.try_get("id").map_err(|e| (reqs.len(), e))?;
            let epoch: Option<i64> = row.try_get("lease_epoch").map_err(|e| (reqs.len(), e))?;
            version = version.max(row.try_get("version").map_err(|e| (reqs.len(), e))?);
            epochs.insert(id, epoch);
        }
        let newer = version > super::SCHEMA_VERSION;
        let refused: Vec<Option<StoreError>> = reqs
            .iter()
            .map(|r| {
                let f = r.fence.as_ref()?;
                if newer {
                    return Some(StoreError::NewerSchema {
                        store: self.ctx.store.to_string(),
                        found: version,
                        supported: super::SCHEMA_VERSION,
                    });
                }
                (epochs.get(&*f.root).copied().flatten() != Some(f.epoch)).then(|| StoreError::LeaseLost {
                    run: r.op.run_id().to_string(),
                })
            })
            .collect();
        let kept: Vec<usize> = (0..reqs.len()).filter(|&i| refused[i].is_none()).collect();
        let ops: Vec<&Op> = kept.iter().map(|&i| &reqs[i].op).collect();
        let plan = Plan::new(&ops, self.ctx.dialect);
        let mut done = plan
            .execute(conn)
            .await
            .map_err(|(i, e)| (kept.get(i).copied().unwrap_or(reqs.len()), e))?
            .into_iter();
        Ok(refused
            .into_iter()
            .map(|r| match r {
                Some(e) => Err(e),
                None => done.next().unwrap_or(Ok(())),
            })
            .collect())
    }
}

/// A batch sorted for multi-row statements: runs created, runs updated, steps recorded —
/// each kind in request order, the last request for a key written in the place of the first
/// (one statement may not touch a row twice). Runs are created first, so the steps of a run
/// created in the same batch find it.
struct Plan<'a> {
    ops: &'a [&'a Op],
    dialect: Dialect,
    creates: Vec<usize>,
    updates: Vec<usize>,
    steps: Vec<usize>,
    /// For each op, the op whose outcome it shares (itself unless superseded).
    kept: Vec<usize>,
}

impl<'a> Plan<'a> {
    fn new(ops: &'a [&'a Op], dialect: Dialect) -> Plan<'a> {
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        enum Key<'k> {
            Create(&'k str),
            Update(&'k str),
            Step(&'k str, &'k str, i64, i64),
        }
        // A run created in this batch and updated later in it is written once, by the
        // create's upsert with the update's values: one statement fewer.
        let created: HashSet<&str> = ops
            .iter()
            .filter_map(|op| match op {
                Op::CreateRun(r) => Some(r.id.as_str()),
                _ => None,
            })
            .collect();
        let key = |op: &'a Op| match op {
            Op::CreateRun(r) => Some(Key::Create(&r.id)),
            Op::UpdateRun(r) if created.contains(r.id.as_str()) => Some(Key::Create(&r.id)),
            Op::UpdateRun(r) => Some(Key::Update(&r.id)),
            Op::Step(s) => Some(Key::Step(&s.run_id, &s.number, s.attempt, s.iteration)),
            Op::Flush(_) => None,
        };
        let mut last = HashMap::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            if let Some(k) = key(op) {
                last.insert(k, i);
            }
        }
        let mut plan = Plan {
            ops,
            dialect,
            creates: vec![],
            updates: vec![],
            steps: vec![],
            kept: Vec::with_capacity(ops.len()),
        };
        let mut seen = HashSet::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            // A flush writes nothing: its outcome is its own.
            let Some(key) = key(op) else {
                plan.kept.push(i);
                continue;
            };
            let kept = last[&key];
            plan.kept.push(kept);
            // In the place of the first request for the key, as if the later ones replaced it.
            if seen.insert(key) {
                match key {
                    Key::Create(_) => plan.creates.push(kept),
                    Key::Update(_) => plan.updates.push(kept),
                    Key::Step(..) => plan.steps.push(kept),
                }
            }
        }
        plan
    }

    /// How many statements [`Plan::execute`] runs (when no update misses its run), at least:
    /// the runs' heads take one or more.
    fn statements(&self) -> usize {
        usize::from(!self.creates.is_empty() || !self.updates.is_empty())
            + chunks(self.creates.len()).count()
            + chunks(self.updates.len()).count()
            + chunks(self.steps.len()).count()
    }

    fn run(&self, i: usize) -> &'a RunRow {
        match self.ops[i] {
            Op::CreateRun(r) | Op::UpdateRun(r) => r,
            Op::Step(_) | Op::Flush(_) => unreachable!("op {i} is not a run"),
        }
    }

    fn step(&self, i: usize) -> &'a StepRow {
        match self.ops[i] {
            Op::Step(s) => s,
            _ => unreachable!("op {i} is not a step"),
        }
    }

    async fn execute(
        &self,
        conn: &mut AnyConnection,
    ) -> Result<Vec<Result<(), StoreError>>, (usize, sqlx::Error)> {
        let mut missing: HashSet<&str> = HashSet::new();
        let runs = self.creates.iter().chain(&self.updates);
        if let Some(&first) = runs.clone().next() {
            write_heads(conn, self.dialect, runs.map(|&i| &self.run(i).head))
                .await
                .map_err(|e| (first, e))?;
        }
        for chunk in chunks(self.creates.len()).map(|r| &self.creates[r]) {
            let q = chunk
                .iter()
                .fold(sqlx::query(upsert_runs(self.dialect, chunk.len())), |q, &i| {
                    self.run(i).bind_to(q)
                });
            q.execute(&mut *conn).await.map_err(|e| (chunk[0], e))?;
        }
        for chunk in chunks(self.updates.len()).map(|r| &self.updates[r]) {
            let q = chunk
                .iter()
                .fold(sqlx::query(update_runs(self.dialect, chunk.len())), |q, &i| {
                    self.run(i).bind_to(q)
                });
            let done = q.execute(&mut *conn).await.map_err(|e| (chunk[0], e))?;
            if done.rows_affected() < chunk.len() as u64 {
                let ids: Vec<&str> = chunk.iter().map(|&i| self.run(i).id.as_str()).collect();
                let q = ids.iter().fold(
                    sqlx::query(AssertSqlSafe(existing_runs(self.dialect, ids.len()))),
                    |q, id| q.bind(*id),
                );
                let found: Vec<String> = q
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(|e| (chunk[0], e))?
                    .iter()
                    .map(|row| row.try_get("id"))
                    .collect::<Result<_, _>>()
                    .map_err(|e| (chunk[0], e))?;
                missing.extend(ids.into_iter().filter(|id| !found.iter().any(|f| f == id)));
            }
        }
        for chunk in chunks(self.steps.len()).map(|r| &self.steps[r]) {
            let q = chunk.iter().zip(1..).fold(
                sqlx::query(upsert_steps(self.dialect, chunk.len())),
                |q, (&i, k)| self.step(i).bind_to(q, k),
            );
            q.execute(&mut *conn).await.map_err(|e| (chunk[0], e))?;
        }
        Ok(self
            .kept
            .iter()
            .map(|&k| match self.ops[k] {
                Op::UpdateRun(r) if missing.contains(r.id.as_str()) => {
                    Err(StoreError::NotFound(r.id.clone()))
                }
                _ => Ok(()),
            })
            .collect())
    }
}
