//! The writer of each run a `run` or a `resume` advances (SPEC §7.3, one writer per run): a
//! row of `run_writers` per held run, with the holder's token, host, pid and process start,
//! and a lease on the database's clock that the holder renews.
//!
//! A take is one statement: an insert that, on a row already there, replaces it only when its
//! lease lapsed (or when it is the holding of a process found gone on this host, named by its
//! token) — PostgreSQL's row lock and SQLite's single writer make two takes of one run come one
//! after the other, so only one of them gets it. Submitted runs are held by their lease
//! (`runs.lease_owner`, [`super::queue`]): a take of one whose lease is live is refused too.
//! Local batches hold their runs by their output file's lock.

use std::time::Duration;

use sqlx::{AssertSqlSafe, Row};

use super::{SqlStore, StoreError};
use crate::store::Writer;

impl SqlStore {
    /// [`crate::store::Store::take_run`].
    pub(super) async fn take_writer(
        &self,
        run_id: &str,
        writer: &Writer,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let mut stale = String::new();
        // A holder that gives the run back between a refused take and the read of it leaves
        // no row: the take is tried again.
        for _ in 0..3 {
            if self.upsert_writer(run_id, writer, lease, &stale).await? {
                return self.not_leased(run_id, writer).await;
            }
            let Some((current, _)) = self.holder_of(run_id).await? else {
                continue;
            };
            if current.token != stale && current.is_gone() {
                stale = current.token;
                continue;
            }
            return Err(StoreError::Held {
                run: run_id.to_string(),
                pid: current.pid,
                host: current.host,
            });
        }
        Err(StoreError::Other(format!(
            "run `{run_id}`: its writer changed three times while this process tried to take it"
        )))
    }

    /// Gives `run_id` back to refuse it when it is a submitted run whose lease is live (a
    /// worker, or a `resume` of it, runs it: [`super::queue`]).
    async fn not_leased(&self, run_id: &str, writer: &Writer) -> Result<(), StoreError> {
        let leased = match self.lease_of(run_id).await {
            Ok(Some((_, Some(owner), true))) => owner,
            Ok(_) | Err(StoreError::NotFound(_)) => return Ok(()),
            Err(e) => {
                self.give_back_writer(run_id, writer).await?;
                return Err(e);
            }
        };
        self.give_back_writer(run_id, writer).await?;
        Err(match crate::store::writers::lease_holder_process(&leased) {
            Some((pid, host)) => StoreError::Held {
                run: run_id.to_string(),
                pid,
                host,
            },
            None => StoreError::Other(format!(
                "run `{run_id}` is being run by another process (`{leased}` holds its lease)"
            )),
        })
    }

    /// Inserts `writer`'s row for `run_id`, or replaces one whose lease lapsed or whose token
    /// is `stale`. True when the run is `writer`'s now.
    async fn upsert_writer(
        &self,
        run_id: &str,
        writer: &Writer,
        lease: Duration,
        stale: &str,
    ) -> Result<bool, StoreError> {
        let what = format!("taking run `{run_id}`");
        let now = self.ctx.dialect.now_ms();
        let row = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO run_writers (run_id, token, host, pid, started, since, until_ms) \
             VALUES ($1, $2, $3, $4, $5, {now}, {now} + $6) \
             ON CONFLICT (run_id) DO UPDATE SET token = excluded.token, host = excluded.host, \
             pid = excluded.pid, started = excluded.started, since = excluded.since, until_ms = excluded.until_ms \
             WHERE run_writers.until_ms < {now} OR run_writers.token = $7 \
             RETURNING token"
        )))
        .bind(run_id.to_string())
        .bind(writer.token.clone())
        .bind(writer.host.clone())
        .bind(i64::from(writer.pid))
        .bind(writer.started.and_then(|s| i64::try_from(s).ok()))
        .bind(millis(lease))
        .bind(stale.to_string())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.ctx.error(&what, &e))?;
        Ok(row.is_some())
    }

    /// The writer holding `run_id` for a `run` or a `resume`, if a row names one, and whether
    /// its lease is live on the database's clock.
    pub async fn holder_of(&self, run_id: &str) -> Result<Option<(Writer, bool)>, StoreError> {
        let what = format!("reading who runs run `{run_id}`");
        let err = |e: sqlx::Error| self.ctx.error(&what, &e);
        let now = self.ctx.dialect.now_ms();
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT token, host, pid, started, CAST(CASE WHEN until_ms > {now} THEN 1 ELSE 0 END AS BIGINT) AS live \
             FROM run_writers WHERE run_id = $1"
        )))
        .bind(run_id.to_string())
        .fetch_optional(&self.pool)
        .await
        .map_err(err)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let pid: i64 = row.try_get("pid").map_err(err)?;
        let started: Option<i64> = row.try_get("started").map_err(err)?;
        let live: i64 = row.try_get("live").map_err(err)?;
        let writer = Writer {
            token: row.try_get("token").map_err(err)?,
            host: row.try_get("host").map_err(err)?,
            pid: u32::try_from(pid).unwrap_or(0),
            started: started.and_then(|s| u64::try_from(s).ok()),
        };
        Ok(Some((writer, live == 1)))
    }

    /// [`crate::store::Store::renew_run`].
    pub(super) async fn renew_writer(
        &self,
        run_id: &str,
        writer: &Writer,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let what = format!("renewing the lease on run `{run_id}`");
        let now = self.ctx.dialect.now_ms();
        let done = sqlx::query(AssertSqlSafe(format!(
            "UPDATE run_writers SET until_ms = {now} + $1 WHERE run_id = $2 AND token = $3"
        )))
        .bind(millis(lease))
        .bind(run_id.to_string())
        .bind(writer.token.clone())
        .execute(&self.pool)
        .await
        .map_err(|e| self.ctx.error(&what, &e))?;
        Ok(done.rows_affected() > 0)
    }

    /// [`crate::store::Store::give_back_run`].
    pub(super) async fn give_back_writer(&self, run_id: &str, writer: &Writer) -> Result<(), StoreError> {
        let what = format!("giving back run `{run_id}`");
        sqlx::query("DELETE FROM run_writers WHERE run_id = $1 AND token = $2")
            .bind(run_id.to_string())
            .bind(writer.token.clone())
            .execute(&self.pool)
            .await
            .map_err(|e| self.ctx.error(&what, &e))?;
        Ok(())
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
