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
//! A transaction that fails is rolled back whole. When the failure concerns one record (a
//! constraint, say), the batch is replayed one record per transaction so the others still
//! commit and only the culprit gets the error; when it concerns the store (disk full, locked,
//! connection lost), every request of the batch gets it.

use std::collections::{HashMap, HashSet};

use sqlx::{AnyConnection, AnyPool, AssertSqlSafe, Connection, Row};
use tokio::sync::{mpsc, oneshot};

use super::Dialect;
use super::error::Ctx;
use super::rows::{RunRow, StepRow};
use super::statements::{chunks, existing_runs, update_runs, upsert_runs, upsert_steps};
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
        }
    }
}

pub(crate) struct Request {
    pub op: Op,
    /// `None`: queued, nobody waits for the outcome.
    pub done: Option<oneshot::Sender<Result<(), StoreError>>>,
}

pub(crate) struct Writer {
    pub pool: AnyPool,
    pub ctx: Ctx,
    pub max_batch: usize,
    /// Runs a queued write of which failed, with the error: their later writes are refused.
    pub failed: HashMap<String, String>,
}

impl Op {
    fn run_id(&self) -> &str {
        match self {
            Op::CreateRun(r) | Op::UpdateRun(r) => &r.id,
            Op::Step(s) => &s.run_id,
        }
    }
}

impl Writer {
    /// Serves requests until every sender is gone, then returns (after the last commit).
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        while rx.recv_many(&mut batch, self.max_batch).await > 0 {
            self.commit(&mut batch).await;
        }
    }

    async fn commit(&mut self, batch: &mut Vec<Request>) {
        // Writes of a run whose queued write failed are not made.
        if !self.failed.is_empty() {
            let mut i = 0;
            while i < batch.len() {
                if let Some(why) = self.failed.get(batch[i].op.run_id()) {
                    let req = batch.remove(i);
                    let e = StoreError::Other(format!(
                        "{}: not written, an earlier write of the run failed: {why}",
                        req.op.describe()
                    ));
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
        let ops: Vec<&Op> = batch.iter().map(|r| &r.op).collect();
        let outcomes = match self.transaction(&ops).await {
            Ok(outcomes) => outcomes,
            Err((i, e)) if ops.len() > 1 && !self.ctx.is_store_wide(&e) => {
                tracing::debug!(
                    store = &*self.ctx.store,
                    "a grouped commit failed at {i}; replaying it one by one"
                );
                let mut outcomes = Vec::with_capacity(ops.len());
                for op in &ops {
                    outcomes.push(match self.transaction(&[op]).await {
                        Ok(mut one) => one.pop().unwrap_or(Ok(())),
                        Err((_, e)) => Err(self.error(op, &e)),
                    });
                }
                outcomes
            }
            Err((_, e)) => ops.iter().map(|op| Err(self.error(op, &e))).collect(),
        };
        for (req, outcome) in batch.drain(..).zip(outcomes) {
            match (req.done, outcome) {
                // The caller may have gone away (cancelled); its record is committed all the same.
                (Some(done), outcome) => {
                    let _ = done.send(outcome);
                }
                (None, Err(e)) => {
                    tracing::error!(store = &*self.ctx.store, error = %e, "a queued write failed");
                    self.failed.insert(req.op.run_id().to_string(), e.to_string());
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

    /// Runs `ops` in one transaction. `Ok` holds each op's own outcome (an update of a
    /// missing run is `NotFound` and writes nothing); `Err` the index of the failing op (or
    /// `ops.len()` for begin/commit) and the error, after a rollback.
    async fn transaction(&self, ops: &[&Op]) -> Result<Vec<Result<(), StoreError>>, (usize, sqlx::Error)> {
        let mut conn = self.pool.acquire().await.map_err(|e| (ops.len(), e))?;
        let plan = Plan::new(ops, self.ctx.dialect);
        if plan.statements() == 1 {
            // One statement is a transaction of its own: no BEGIN and COMMIT round trips.
            return plan.execute(&mut conn).await;
        }
        let mut tx = conn
            .begin_with(self.ctx.dialect.begin_write())
            .await
            .map_err(|e| (ops.len(), e))?;
        let failed = match plan.execute(&mut tx).await {
            Ok(outcomes) => match tx.commit().await {
                Ok(()) => return Ok(outcomes),
                Err(e) => {
                    conn.close_on_drop();
                    (ops.len(), e)
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
            Op::CreateRun(r) => Key::Create(&r.id),
            Op::UpdateRun(r) if created.contains(r.id.as_str()) => Key::Create(&r.id),
            Op::UpdateRun(r) => Key::Update(&r.id),
            Op::Step(s) => Key::Step(&s.run_id, &s.number, s.attempt, s.iteration),
        };
        let mut last = HashMap::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            last.insert(key(op), i);
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
        for op in ops {
            let key = key(op);
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

    /// How many statements [`Plan::execute`] runs (when no update misses its run).
    fn statements(&self) -> usize {
        chunks(self.creates.len()).count()
            + chunks(self.updates.len()).count()
            + chunks(self.steps.len()).count()
    }

    fn run(&self, i: usize) -> &'a RunRow {
        match self.ops[i] {
            Op::CreateRun(r) | Op::UpdateRun(r) => r,
            Op::Step(_) => unreachable!("op {i} is a step"),
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
