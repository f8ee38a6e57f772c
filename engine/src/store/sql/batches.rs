//! Submitted batches and the workers registered with a store, as `batches`, `collect` and
//! `runs list --batch` read them (SPEC §12).

use serde_json::Value;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::rows::{sum_nanos, summed};
use crate::record::cost::Cost;

/// A batch as `submit` recorded it (a row of `batches`).
#[derive(Clone, Debug, PartialEq)]
pub struct SubmittedBatch {
    pub name: String,
    /// The content hash of the flow bundle its runs run.
    pub bundle: String,
    /// The top flow's name and covering hash.
    pub flow: String,
    pub flow_hash: String,
    /// The input file as given to `submit`, made absolute (for messages).
    pub input: String,
    pub id_field: String,
    /// `--context` of the submit, every run's.
    pub context: Value,
    /// Takeovers from dead workers a run may have before it fails with kind `lost`.
    pub max_recoveries: u64,
    /// `submit --max-cost-usd`: what the batch may spend, checked by workers before every
    /// model call.
    pub max_cost_usd: Option<f64>,
    /// Lines of the input (blank ones included, as item indices count them).
    pub items: u64,
    /// Every line has its run: `submit` finished.
    pub complete: bool,
    /// Unix milliseconds.
    pub submitted_at: u64,
}

/// A worker registered with the store (a row of `workers`).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerRow {
    pub id: String,
    pub host: String,
    pub pid: u64,
    /// `--batch`: the only batch it claims from, if any.
    pub batch: Option<String>,
    pub concurrency: u64,
    pub lease_ms: u64,
    /// Unix milliseconds, the database's clock.
    pub started_at: u64,
    pub heartbeat_at: u64,
    /// Set when it stopped cleanly.
    pub stopped_at: Option<u64>,
}

/// What the runs of a submitted batch come to: each item counted once, by its latest run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BatchCounts {
    /// Waiting for a worker: never claimed, or given back unfinished (`given_back`).
    pub queued: u64,
    /// Of `queued`, runs a worker started and gave back (its drain, a store failure): still
    /// `running` on record, with no lease, for the next claim to resume.
    pub given_back: u64,
    /// Held by a worker (its lease may have run out, if the worker died).
    pub running: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub interrupted: u64,
    pub cancelled: u64,
    /// The cost of every run of the batch, retried ones included.
    pub cost_usd: Cost,
    /// Model calls of those runs whose cost is unknown (no `usage` reported).
    pub cost_unknown_calls: u64,
    /// Items whose latest run a worker (or `resume`) ended in the last minute (the rate): lines
    /// refused at submit, never claimed, are not.
    pub finished_last_minute: u64,
}

impl BatchCounts {
    /// Items whose latest run is queued or running.
    pub fn unfinished(&self) -> u64 {
        self.queued + self.running
    }

    pub fn total(&self) -> u64 {
        self.queued + self.running + self.succeeded + self.failed + self.interrupted + self.cancelled
    }
}

impl super::SqlStore {
    /// Every submitted batch, oldest first.
    pub async fn submitted_batches(&self) -> Result<Vec<SubmittedBatch>, super::StoreError> {
        const WHAT: &str = "reading the submitted batches";
        let rows = sqlx::query(
            "SELECT name, bundle, flow, flow_hash, input, id_field, context, max_recoveries, items, complete, \
             submitted_at, max_cost_usd FROM batches ORDER BY submitted_at, name",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.ctx.error(WHAT, &e))?;
        rows.iter()
            .map(|r| {
                decode_batch(r).map_err(|m| super::StoreError::Database {
                    store: self.ctx.store.to_string(),
                    what: WHAT.to_string(),
                    message: m,
                })
            })
            .collect()
    }

    /// The counts of batch `name`'s items by their latest run; `now_ms` is the reader's clock
    /// (runs record their end on their worker's).
    pub async fn batch_counts(&self, name: &str, now_ms: u64) -> Result<BatchCounts, super::StoreError> {
        use sqlx::Row as _;
        let what = format!("counting the runs of batch `{name}`");
        let err = |e: sqlx::Error| self.ctx.error(&what, &e);
        let since = i64::try_from(now_ms.saturating_sub(60_000)).unwrap_or(i64::MAX);
        // A `running` run without a lease owner was given back (`release`): it waits for a
        // claim like a queued one, and no worker runs it.
        let rows = sqlx::query(
            "SELECT CASE WHEN status = 'running' AND lease_epoch IS NOT NULL AND lease_owner IS NULL \
             THEN 'given_back' ELSE status END AS status, COUNT(*) AS n, \
             SUM(CASE WHEN finished_at >= $2 AND lease_epoch > 0 THEN 1 ELSE 0 END) AS recent FROM ( \
               SELECT status, finished_at, lease_epoch, lease_owner, ROW_NUMBER() OVER ( \
                 PARTITION BY item_index ORDER BY started_at DESC, id DESC) AS latest \
               FROM run_records WHERE batch = $1 AND parent_run IS NULL) items \
             WHERE latest = 1 GROUP BY 1",
        )
        .bind(name.to_string())
        .bind(since)
        .fetch_all(&self.pool)
        .await
        .map_err(err)?;
        let mut c = BatchCounts::default();
        for r in &rows {
            let status: String = r.try_get("status").map_err(err)?;
            let n: i64 = r.try_get("n").map_err(err)?;
            let recent: Option<i64> = r.try_get("recent").map_err(err)?;
            let n = u64::try_from(n).unwrap_or(0);
            match status.as_str() {
                "queued" => c.queued += n,
                "given_back" => {
                    c.queued += n;
                    c.given_back += n;
                }
                "running" => c.running += n,
                "succeeded" => c.succeeded += n,
                "failed" => c.failed += n,
                "interrupted" => c.interrupted += n,
                _ => c.cancelled += n,
            }
            c.finished_last_minute += u64::try_from(recent.unwrap_or(0)).unwrap_or(0);
        }
        let cost = sqlx::query(sqlx::AssertSqlSafe(format!(
            // PostgreSQL sums BIGINTs as NUMERIC, which the Any driver does not read.
            "SELECT {} AS cost, CAST(SUM(COALESCE(cost_unknown_calls, 0)) AS BIGINT) AS unknown \
             FROM run_records WHERE batch = $1 AND parent_run IS NULL",
            sum_nanos("cost_usd")
        )))
        .bind(name.to_string())
        .fetch_one(&self.pool)
        .await
        .map_err(err)?;
        let spent: Option<i64> = cost.try_get("cost").map_err(err)?;
        let unknown: Option<i64> = cost.try_get("unknown").map_err(err)?;
        c.cost_usd = summed(spent, "cost_usd").map_err(|m| super::StoreError::Database {
            store: self.ctx.store.to_string(),
            what: what.clone(),
            message: m,
        })?;
        c.cost_unknown_calls = u64::try_from(unknown.unwrap_or(0)).unwrap_or(0);
        Ok(c)
    }

    /// The workers whose heartbeat is within their lease on the database's clock and that
    /// have not stopped, with the database's clock now.
    pub async fn live_workers(&self) -> Result<(Vec<WorkerRow>, u64), super::StoreError> {
        use sqlx::Row as _;
        const WHAT: &str = "reading the workers";
        let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
        let now = self.ctx.dialect.now_ms();
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT id, host, pid, batch, concurrency, lease_ms, started_at, heartbeat_at, stopped_at, \
             {now} AS now_ms FROM workers WHERE stopped_at IS NULL AND heartbeat_at + lease_ms > {now} \
             ORDER BY started_at, id"
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(err)?;
        let mut db_now = 0;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let int = |c: &str| -> Result<u64, sqlx::Error> {
                let v: i64 = r.try_get(c)?;
                Ok(u64::try_from(v).unwrap_or(0))
            };
            db_now = int("now_ms").map_err(err)?;
            let stopped: Option<i64> = r.try_get("stopped_at").map_err(err)?;
            out.push(WorkerRow {
                id: r.try_get("id").map_err(err)?,
                host: r.try_get("host").map_err(err)?,
                pid: int("pid").map_err(err)?,
                batch: r.try_get("batch").map_err(err)?,
                concurrency: int("concurrency").map_err(err)?,
                lease_ms: int("lease_ms").map_err(err)?,
                started_at: int("started_at").map_err(err)?,
                heartbeat_at: int("heartbeat_at").map_err(err)?,
                stopped_at: stopped.and_then(|s| u64::try_from(s).ok()),
            });
        }
        Ok((out, db_now))
    }

    /// How many runs each live worker holds now.
    pub async fn held_by_worker(&self) -> Result<Vec<(String, u64)>, super::StoreError> {
        use sqlx::Row as _;
        const WHAT: &str = "counting the runs workers hold";
        let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
        let now = self.ctx.dialect.now_ms();
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT lease_owner, COUNT(*) AS n FROM runs WHERE lease_epoch IS NOT NULL AND status = 'running' \
             AND lease_owner IS NOT NULL AND lease_until > {now} GROUP BY lease_owner"
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(err)?;
        rows.iter()
            .map(|r| {
                let owner: String = r.try_get("lease_owner").map_err(err)?;
                let n: i64 = r.try_get("n").map_err(err)?;
                Ok((owner, u64::try_from(n).unwrap_or(0)))
            })
            .collect()
    }
}

/// A row of `batches` read back.
pub(super) fn decode_batch(r: &AnyRow) -> Result<SubmittedBatch, String> {
    let get_i = |c: &str| -> Result<u64, String> {
        let v: i64 = r.try_get(c).map_err(|e| format!("column `{c}`: {e}"))?;
        u64::try_from(v).map_err(|_| format!("column `{c}` is negative"))
    };
    let get_s =
        |c: &str| -> Result<String, String> { r.try_get(c).map_err(|e| format!("column `{c}`: {e}")) };
    let context: String = get_s("context")?;
    Ok(SubmittedBatch {
        name: get_s("name")?,
        bundle: get_s("bundle")?,
        flow: get_s("flow")?,
        flow_hash: get_s("flow_hash")?,
        input: get_s("input")?,
        id_field: get_s("id_field")?,
        context: serde_json::from_str(&context).map_err(|e| format!("column `context`: {e}"))?,
        max_recoveries: get_i("max_recoveries")?,
        items: get_i("items")?,
        complete: get_i("complete")? != 0,
        submitted_at: get_i("submitted_at")?,
        max_cost_usd: r
            .try_get("max_cost_usd")
            .map_err(|e| format!("column `max_cost_usd`: {e}"))?,
    })
}
