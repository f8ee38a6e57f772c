//! Group commit: one writer task owns every write of a store. Recording tasks send it their
//! encoded rows over a channel; it drains whatever is queued (up to `max_batch`) into one
//! transaction, commits, and only then answers each request. Many concurrent runs thus share
//! a commit — one WAL append (and, with `synchronous=FULL`, one fsync) for hundreds of step
//! records — while every `record_step(..).await` still returns only once its record is
//! committed (SPEC §7.3).
//!
//! A transaction that fails is rolled back whole. When the failure concerns one record (a
//! constraint, say), the batch is replayed one record per transaction so the others still
//! commit and only the culprit gets the error; when it concerns the store (disk full, locked,
//! connection lost), every request of the batch gets it.

use sqlx::AnyPool;
use sqlx::Connection;
use tokio::sync::{mpsc, oneshot};

use super::error::Ctx;
use super::rows::{RunRow, StepRow, UPDATE_RUN, UPSERT_RUN};
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
    pub done: oneshot::Sender<Result<(), StoreError>>,
}

pub(crate) struct Writer {
    pub pool: AnyPool,
    pub ctx: Ctx,
    pub max_batch: usize,
}

impl Writer {
    /// Serves requests until every sender is gone, then returns (after the last commit).
    pub(crate) async fn run(self, mut rx: mpsc::Receiver<Request>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        while rx.recv_many(&mut batch, self.max_batch).await > 0 {
            self.commit(&mut batch).await;
        }
    }

    async fn commit(&self, batch: &mut Vec<Request>) {
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
            // The caller may have gone away (cancelled); its record is committed all the same.
            let _ = req.done.send(outcome);
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
        let mut tx = conn
            .begin_with(self.ctx.dialect.begin_write())
            .await
            .map_err(|e| (ops.len(), e))?;
        let mut outcomes = Vec::with_capacity(ops.len());
        let mut failed = None;
        for (i, op) in ops.iter().enumerate() {
            let done = match op {
                Op::CreateRun(r) => r.bind(UPSERT_RUN).execute(&mut *tx).await.map(|_| Ok(())),
                Op::UpdateRun(r) => r.bind(UPDATE_RUN).execute(&mut *tx).await.map(|done| {
                    if done.rows_affected() == 0 {
                        Err(StoreError::NotFound(r.id.clone()))
                    } else {
                        Ok(())
                    }
                }),
                Op::Step(s) => s.bind().execute(&mut *tx).await.map(|_| Ok(())),
            };
            match done {
                Ok(outcome) => outcomes.push(outcome),
                Err(e) => {
                    failed = Some((i, e));
                    break;
                }
            }
        }
        let failed = match failed {
            None => match tx.commit().await {
                Ok(()) => return Ok(outcomes),
                Err(e) => {
                    conn.close_on_drop();
                    (ops.len(), e)
                }
            },
            Some(failed) => {
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
