//! The work queue of submitted batches (SPEC §12): what `submit` writes (the flow bundle, the
//! batch, one queued run per line) and what workers do with it — claim runs, hold their leases
//! by heartbeat, give them back.
//!
//! A submitted run has a lease epoch (`runs.lease_epoch`): 0 while queued, raised by every
//! claim. A claim takes queued runs and runs whose lease ran out (or was given back) in one
//! short transaction, many at a time, skipping rows another claimer holds (`FOR UPDATE SKIP
//! LOCKED` on PostgreSQL; SQLite's single writer needs none — the only statement that differs
//! per database). The worker then writes the run's records under that epoch ([`SqlStore::hold`]):
//! once another worker claimed the run, the epoch moved on and those writes are refused.
//! Every time is the database's clock (`Dialect::now_ms`), never a worker's.
//!
//! No row lock is held across an agent call: claims, heartbeats, releases and the records are
//! each a short transaction of their own.

use std::time::Duration;

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Connection, Row};

use super::batches::{SubmittedBatch, WorkerRow, decode_batch};
use super::rows::{RunRow, decode_run, sum_nanos, summed};
use super::statements::{RUN_COLUMNS, write_heads};
use super::{SqlStore, StoreError};
use crate::record::RunRecord;
use crate::record::cost::Cost;

/// Which runs a claim takes ([`SqlStore::claim`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Queued runs, runs given back, runs taken over for the first time.
    Shared,
    /// One run whose workers died twice or more, for a worker holding nothing.
    Alone,
}

/// A run a worker claimed.
#[derive(Clone, Debug)]
pub struct Claimed {
    /// The run, `running` now.
    pub record: RunRecord,
    /// The lease epoch it was claimed at: its writes are made under it.
    pub epoch: i64,
    /// How many times it was taken over from a worker whose lease ran out (this claim
    /// included); a worker that takes back a run of its own does not count.
    pub recoveries: u64,
}

impl Claimed {
    /// Claimed from the queue for the first time: nothing of it is recorded yet.
    pub fn is_fresh(&self) -> bool {
        self.epoch == 1
    }
}

/// What a heartbeat found.
#[derive(Clone, Debug, Default)]
pub struct Beat {
    /// The held runs whose lease is still this worker's, at the epoch it claimed them.
    pub kept: Vec<(String, i64)>,
    /// The store's schema version: newer than this build's means stop.
    pub schema_version: i64,
}

/// A stored flow bundle: its format, top flow and files as [`crate::cluster::bundle`] encodes them.
#[derive(Clone, Debug)]
pub struct StoredBundle {
    pub hash: String,
    pub format: i64,
    pub top: String,
    pub files: String,
}

/// The chunk of queued runs one insert writes.
pub const SUBMIT_CHUNK: usize = 512;

/// How many claimed runs one read gives back.
const CLAIM_READ: usize = 512;

impl SqlStore {
    /// Stores a flow bundle unless one of the same hash is stored.
    pub async fn put_bundle(&self, b: &StoredBundle) -> Result<(), StoreError> {
        let what = format!("storing the flow bundle {}", b.hash);
        sqlx::query(
            "INSERT INTO bundles (hash, format, top, files, created_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (hash) DO NOTHING",
        )
        .bind(b.hash.clone())
        .bind(b.format)
        .bind(b.top.clone())
        .bind(b.files.clone())
        .bind(now_i64())
        .execute(&self.pool)
        .await
        .map_err(|e| self.ctx.error(&what, &e))?;
        Ok(())
    }

    /// The stored bundle of hash `hash`, if there is one.
    pub async fn get_bundle(&self, hash: &str) -> Result<Option<StoredBundle>, StoreError> {
        let what = format!("reading the flow bundle {hash}");
        let row = sqlx::query("SELECT hash, format, top, files FROM bundles WHERE hash = $1")
            .bind(hash.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.ctx.error(&what, &e))?;
        row.map(|r| {
            Ok(StoredBundle {
                hash: r.try_get("hash")?,
                format: r.try_get("format")?,
                top: r.try_get("top")?,
                files: r.try_get("files")?,
            })
        })
        .transpose()
        .map_err(|e: sqlx::Error| self.ctx.error(&what, &e))
    }

    /// Records batch `b` unless a batch of its name exists; either way returns the stored one
    /// (the caller compares). `items` and `complete` of a new batch are as given.
    pub async fn put_batch(&self, b: &SubmittedBatch) -> Result<SubmittedBatch, StoreError> {
        let what = format!("recording batch `{}`", b.name);
        let context = serde_json::to_string(&b.context).map_err(|e| StoreError::Other(e.to_string()))?;
        sqlx::query(
            "INSERT INTO batches (name, bundle, flow, flow_hash, input, id_field, context, max_recoveries, items, \
             complete, submitted_at, max_cost_usd) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(b.name.clone())
        .bind(b.bundle.clone())
        .bind(b.flow.clone())
        .bind(b.flow_hash.clone())
        .bind(b.input.clone())
        .bind(b.id_field.clone())
        .bind(context)
        .bind(int(b.max_recoveries))
        .bind(int(b.items))
        .bind(i64::from(b.complete))
        .bind(int(b.submitted_at))
        .bind(b.max_cost_usd)
        .execute(&self.pool)
        .await
        .map_err(|e| self.ctx.error(&what, &e))?;
        self.submitted_batch(&b.name)
            .await?
            .ok_or_else(|| StoreError::Other(format!("batch `{}` vanished while it was recorded", b.name)))
    }

    /// The batch named `name` as `submit` recorded it.
    pub async fn submitted_batch(&self, name: &str) -> Result<Option<SubmittedBatch>, StoreError> {
        let what = format!("reading batch `{name}`");
        let row = sqlx::query(
            "SELECT name, bundle, flow, flow_hash, input, id_field, context, max_recoveries, items, complete, \
             submitted_at, max_cost_usd FROM batches WHERE name = $1",
        )
        .bind(name.to_string())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.ctx.error(&what, &e))?;
        row.map(|r| decode_batch(&r))
            .transpose()
            .map_err(|m| StoreError::Database {
                store: self.ctx.store.to_string(),
                what,
                message: m,
            })
    }

    /// Points batch `name` at another bundle (`submit --allow-changed`): runs claimed from now
    /// on run it.
    pub async fn set_batch_bundle(
        &self,
        name: &str,
        bundle: &str,
        flow_hash: &str,
    ) -> Result<(), StoreError> {
        let what = format!("updating batch `{name}`");
        sqlx::query("UPDATE batches SET bundle = $1, flow_hash = $2 WHERE name = $3")
            .bind(bundle.to_string())
            .bind(flow_hash.to_string())
            .bind(name.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.ctx.error(&what, &e))?;
        Ok(())
    }

    /// Sets batch `name`'s cost cap (`submit --max-cost-usd` given again): workers read it at
    /// their next refresh of the batch's spend.
    pub async fn set_batch_cap(&self, name: &str, max_cost_usd: f64) -> Result<(), StoreError> {
        let what = format!("updating batch `{name}`");
        sqlx::query("UPDATE batches SET max_cost_usd = $1 WHERE name = $2")
            .bind(max_cost_usd)
            .bind(name.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.ctx.error(&what, &e))?;
        Ok(())
    }

    /// Records what worker `worker`'s own calls of batch `batch` have cost so far (`spent`,
    /// and `unknown` calls of unknown cost), and returns the batch's cap and what every other
    /// worker recorded, added up in whole nano-dollars: one short transaction.
    pub async fn share_spend(
        &self,
        batch: &str,
        worker: &str,
        spent: Cost,
        unknown: u64,
    ) -> Result<(Option<f64>, Cost, u64), StoreError> {
        let what = format!("sharing the spend of batch `{batch}`");
        let err = |e: sqlx::Error| self.ctx.error(&what, &e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        sqlx::query(
            "INSERT INTO batch_spend (batch, worker, cost_usd, cost_unknown_calls) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (batch, worker) DO UPDATE SET cost_usd = excluded.cost_usd, \
             cost_unknown_calls = excluded.cost_unknown_calls",
        )
        .bind(batch.to_string())
        .bind(worker.to_string())
        .bind(spent.usd())
        .bind(int(unknown))
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT (SELECT max_cost_usd FROM batches WHERE name = $1) AS cap, \
             {} AS nanos, CAST(SUM(cost_unknown_calls) AS BIGINT) AS unknown \
             FROM batch_spend WHERE batch = $1 AND worker <> $2",
            sum_nanos("cost_usd")
        )))
        .bind(batch.to_string())
        .bind(worker.to_string())
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        let cap: Option<f64> = row.try_get("cap").map_err(err)?;
        let nanos: Option<i64> = row.try_get("nanos").map_err(err)?;
        let others = summed(nanos, "cost_usd").map_err(|m| self.corrupt(&what, m))?;
        let unknown: Option<i64> = row.try_get("unknown").map_err(err)?;
        Ok((cap, others, u64::try_from(unknown.unwrap_or(0)).unwrap_or(0)))
    }

    /// Marks batch `name` complete: every one of its `items` lines has its run.
    pub async fn complete_batch(&self, name: &str, items: u64) -> Result<(), StoreError> {
        let what = format!("completing batch `{name}`");
        sqlx::query("UPDATE batches SET complete = 1, items = $1 WHERE name = $2")
            .bind(int(items))
            .bind(name.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.ctx.error(&what, &e))?;
        // The claim reads the queue in input order through `runs_claim`; without statistics
        // of the rows just written, PostgreSQL's planner sorts the whole queue for every claim
        // instead (tens of milliseconds at 20,000 runs, against a tenth of one). Autovacuum
        // would analyze the table too, but only once a batch is well under way.
        if self.ctx.dialect == super::Dialect::Postgres {
            sqlx::query("ANALYZE runs")
                .execute(&self.pool)
                .await
                .map_err(|e| self.ctx.error(&what, &e))?;
        }
        Ok(())
    }

    /// Inserts submitted runs (queued ones, and lines failed at submit) in one transaction per
    /// [`SUBMIT_CHUNK`]; a run whose id is stored already is left as it is.
    pub async fn insert_submitted(&self, runs: &[RunRecord]) -> Result<(), StoreError> {
        let what = "recording submitted runs";
        for chunk in runs.chunks(SUBMIT_CHUNK) {
            let encoded: Vec<RunRow> = chunk.iter().map(RunRow::encode).collect::<Result<_, _>>()?;
            let mut conn = self.pool.acquire().await.map_err(|e| self.ctx.error(what, &e))?;
            let mut tx = conn.begin().await.map_err(|e| self.ctx.error(what, &e))?;
            write_heads(&mut tx, self.ctx.dialect, encoded.iter().map(|r| &r.head))
                .await
                .map_err(|e| self.ctx.error(what, &e))?;
            let cols = RUN_COLUMNS.len() + 1;
            let rows: Vec<String> = (0..chunk.len())
                .map(|r| {
                    let params: Vec<String> =
                        (1..=cols).map(|c| self.ctx.dialect.param(r * cols + c)).collect();
                    format!("({})", params.join(", "))
                })
                .collect();
            let sql = format!(
                "INSERT INTO runs ({}, lease_epoch) VALUES {} ON CONFLICT (id) DO NOTHING",
                RUN_COLUMNS.join(", "),
                rows.join(", ")
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for r in &encoded {
                q = r.bind_to(q).bind(0i64);
            }
            q.execute(&mut *tx).await.map_err(|e| self.ctx.error(what, &e))?;
            tx.commit().await.map_err(|e| self.ctx.error(what, &e))?;
        }
        Ok(())
    }

    /// Registers worker `w` (its heartbeat starts now, on the database's clock).
    pub async fn register_worker(&self, w: &WorkerRow) -> Result<(), StoreError> {
        let what = format!("registering worker `{}`", w.id);
        let now = self.ctx.dialect.now_ms();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO workers (id, host, pid, batch, concurrency, lease_ms, started_at, heartbeat_at) \
             VALUES ($1, $2, $3, $4, $5, $6, {now}, {now})"
        )))
        .bind(w.id.clone())
        .bind(w.host.clone())
        .bind(int(w.pid))
        .bind(w.batch.clone())
        .bind(int(w.concurrency))
        .bind(int(w.lease_ms))
        .execute(&self.pool)
        .await
        .map_err(|e| self.ctx.error(&what, &e))?;
        Ok(())
    }

    /// Marks worker `id` stopped (a clean exit).
    pub async fn stop_worker(&self, id: &str) -> Result<(), StoreError> {
        let what = format!("unregistering worker `{id}`");
        let now = self.ctx.dialect.now_ms();
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE workers SET stopped_at = {now} WHERE id = $1"
        )))
        .bind(id.to_string())
        .execute(&self.pool)
        .await
        .map_err(|e| self.ctx.error(&what, &e))?;
        Ok(())
    }

    /// Claims up to `n` runs for worker `worker` under a lease of `lease`, of batch `batch`
    /// (any when `None`), in batch and input order. One short transaction; rows another
    /// claimer holds are skipped.
    ///
    /// [`Claim::Shared`] takes queued runs, runs given back, and runs whose worker died while
    /// holding them for the first time. A run whose workers died twice or more is a suspect —
    /// it may be what kills them — and only [`Claim::Alone`] takes it, one at a time, for a
    /// worker that holds nothing else: a poison item then takes no other run down with it.
    pub async fn claim(
        &self,
        worker: &str,
        batch: Option<&str>,
        n: usize,
        lease: Duration,
        kind: Claim,
    ) -> Result<Vec<Claimed>, StoreError> {
        const WHAT: &str = "claiming queued runs";
        let now = self.ctx.dialect.now_ms();
        let only = if batch.is_some() {
            " AND head IN (SELECT id FROM run_heads WHERE batch = $4)"
        } else {
            ""
        };
        let (which, n) = match kind {
            Claim::Shared => (
                format!(
                    "(status = 'queued' OR lease_owner IS NULL OR (lease_until < {now} AND COALESCE(recoveries, 0) = 0))"
                ),
                n,
            ),
            Claim::Alone => (
                format!(
                    "(status = 'running' AND lease_owner IS NOT NULL AND lease_until < {now} AND COALESCE(recoveries, 0) >= 1)"
                ),
                1,
            ),
        };
        let sql = format!(
            // The runs are picked once, in a materialized CTE: a `LIMIT` subquery under `IN`
            // may be evaluated again per row, and then take more than `n` runs.
            "WITH picked AS MATERIALIZED (SELECT id FROM runs WHERE lease_epoch IS NOT NULL \
             AND status IN ('queued', 'running') AND {which}{only} \
             ORDER BY head, item_index LIMIT $3{lock}) \
             UPDATE runs SET status = 'running', lease_owner = $1, lease_until = {now} + $2, \
             started_at = CASE WHEN lease_epoch = 0 THEN {now} ELSE started_at END, \
             recoveries = COALESCE(recoveries, 0) + CASE WHEN status = 'running' AND lease_owner IS NOT NULL \
             AND lease_owner <> $1 THEN 1 ELSE 0 END, \
             lease_epoch = lease_epoch + 1 \
             WHERE id IN (SELECT id FROM picked) \
             RETURNING id",
            lock = self.ctx.dialect.claim_lock_clause(),
        );
        let mut q = sqlx::query(AssertSqlSafe(sql))
            .bind(worker.to_string())
            .bind(millis(lease))
            .bind(i64::try_from(n).unwrap_or(i64::MAX));
        if let Some(b) = batch {
            q = q.bind(b.to_string());
        }
        let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
        let mut conn = self.pool.acquire().await.map_err(err)?;
        let mut tx = conn.begin().await.map_err(err)?;
        if let Some(set) = self.ctx.dialect.async_commit() {
            sqlx::query(set).execute(&mut *tx).await.map_err(err)?;
        }
        let ids: Vec<String> = q
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?
            .iter()
            .map(|r| r.try_get("id"))
            .collect::<Result<_, _>>()
            .map_err(err)?;
        // The claimed runs as records, with what they share from their heads.
        let mut rows = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(CLAIM_READ) {
            let params: Vec<String> = (1..=chunk.len()).map(|i| self.ctx.dialect.param(i)).collect();
            let read = format!("SELECT * FROM run_records WHERE id IN ({})", params.join(", "));
            let q = chunk
                .iter()
                .fold(sqlx::query(AssertSqlSafe(read)), |q, id| q.bind(id.clone()));
            rows.extend(q.fetch_all(&mut *tx).await.map_err(err)?);
        }
        tx.commit().await.map_err(err)?;
        let mut claimed: Vec<Claimed> = rows
            .iter()
            .map(|r| decode_claimed(r).map_err(|m| self.corrupt(WHAT, m)))
            .collect::<Result<_, _>>()?;
        // RETURNING gives no order: the input's.
        claimed.sort_by(|a, b| {
            (&a.record.batch, a.record.item_index).cmp(&(&b.record.batch, b.record.item_index))
        });
        Ok(claimed)
    }

    /// Worker `worker`'s heartbeat: its own row, and the leases of the runs it holds (`held`:
    /// run id and the epoch it claimed it at) extended by `lease`. Returns the held runs that
    /// are still its own and the store's schema version. One transaction.
    pub async fn heartbeat(
        &self,
        worker: &str,
        held: &[(String, i64)],
        lease: Duration,
    ) -> Result<Beat, StoreError> {
        const WHAT: &str = "renewing the worker's leases";
        let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
        let now = self.ctx.dialect.now_ms();
        let mut conn = self.pool.acquire().await.map_err(err)?;
        let mut tx = conn.begin().await.map_err(err)?;
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE workers SET heartbeat_at = {now} WHERE id = $1"
        )))
        .bind(worker.to_string())
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        let mut kept = Vec::with_capacity(held.len());
        for chunk in held.chunks(SUBMIT_CHUNK) {
            let params: Vec<String> = (3..chunk.len() + 3).map(|i| format!("${i}")).collect();
            let sql = format!(
                // A run that finished since the snapshot is still this worker's: its end is
                // recorded under its lease, and extending a finished run's lease is harmless.
                "UPDATE runs SET lease_until = {now} + $2 WHERE lease_owner = $1 \
                 AND id IN ({}) RETURNING id, lease_epoch",
                params.join(", ")
            );
            let q = chunk.iter().fold(
                sqlx::query(AssertSqlSafe(sql))
                    .bind(worker.to_string())
                    .bind(millis(lease)),
                |q, (id, _)| q.bind(id.clone()),
            );
            for row in q.fetch_all(&mut *tx).await.map_err(err)? {
                let id: String = row.try_get("id").map_err(err)?;
                let epoch: Option<i64> = row.try_get("lease_epoch").map_err(err)?;
                if let Some(e) = epoch
                    && chunk.iter().any(|(h, at)| *h == id && *at == e)
                {
                    kept.push((id, e));
                }
            }
        }
        let schema_version: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM schema_version")
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(Beat { kept, schema_version })
    }

    /// Gives back the leases of `runs` (id, epoch) that worker `worker` still holds, so another
    /// worker takes them at once, without counting a recovery (or, of a run stopped
    /// `interrupted`, a `resume` at once). The epoch moves on: whatever
    /// this worker might still write of them is refused. Their records stay: a claim
    /// resumes them from their last recorded step. A run stopped `interrupted` whose
    /// question was answered meanwhile is queued again in the same transaction.
    pub async fn release(&self, worker: &str, runs: &[(String, i64)]) -> Result<(), StoreError> {
        const WHAT: &str = "giving back leases";
        let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
        if runs.is_empty() {
            return Ok(());
        }
        let mut conn = self.pool.acquire().await.map_err(err)?;
        let mut tx = conn.begin().await.map_err(err)?;
        for (id, epoch) in runs {
            sqlx::query(
                "UPDATE runs SET lease_owner = NULL, lease_until = NULL, lease_epoch = lease_epoch + 1 \
                 WHERE id = $1 AND lease_epoch = $2 AND lease_owner = $3 AND status IN ('running', 'interrupted')",
            )
            .bind(id.clone())
            .bind(*epoch)
            .bind(worker.to_string())
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        // A run that stopped `interrupted` while one of its questions was answered after the
        // engine last looked (decided or expired between its check and this release) is
        // queued again here: the answer's own transaction found the lease still held and
        // left it. The answer's requeue locks the run's row first ([`super::inbox`]), so
        // of the two one sees the other's commit. A settled item counts while its part has
        // no finished record (an answer given to an earlier stop was applied then).
        for chunk in runs.chunks(SUBMIT_CHUNK) {
            let params: Vec<String> = (1..=chunk.len()).map(|i| self.ctx.dialect.param(i)).collect();
            let sql = format!(
                "UPDATE runs SET status = 'queued' WHERE id IN ({}) AND status = 'interrupted' \
                 AND lease_epoch IS NOT NULL AND lease_owner IS NULL AND EXISTS (SELECT 1 FROM inbox i \
                 WHERE i.root_run = runs.id AND i.state IN ('decided', 'expired') AND NOT EXISTS \
                 (SELECT 1 FROM steps s WHERE s.run_id = i.run_id AND s.number = i.number \
                 AND s.iteration = i.iteration AND s.status IN ('succeeded', 'failed')))",
                params.join(", ")
            );
            let q = chunk
                .iter()
                .fold(sqlx::query(AssertSqlSafe(sql)), |q, (id, _)| q.bind(id.clone()));
            q.execute(&mut *tx).await.map_err(err)?;
        }
        tx.commit().await.map_err(err)
    }

    /// Ends submitted run `run` as `record` says (cancelled, or failed `lost`) whoever holds it:
    /// its lease epoch moves on, so a worker still running it writes nothing more of it.
    /// False when the run is not a submitted one that has not ended.
    pub async fn end_submitted(&self, record: &RunRecord) -> Result<bool, StoreError> {
        let what = format!("ending run `{}`", record.id);
        let error = record
            .error
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| StoreError::Other(e.to_string()))?;
        let done = sqlx::query(
            "UPDATE runs SET status = $1, error = $2, finished_at = $3, lease_epoch = lease_epoch + 1, \
             lease_owner = NULL, lease_until = NULL \
             WHERE id = $4 AND lease_epoch IS NOT NULL AND status IN ('queued', 'running')",
        )
        .bind(record.status.as_str())
        .bind(error)
        .bind(record.finished_at.map(int))
        .bind(record.id.clone())
        .execute(&self.pool)
        .await
        .map_err(|e| self.ctx.error(&what, &e))?;
        Ok(done.rows_affected() > 0)
    }

    /// Takes the lease of stopped submitted run `id` for `holder` (a `resume` of it): the run
    /// must be `interrupted` or `running`, with no live lease (the worker that stopped it gave
    /// it back; two `resume`s do not both take it). Its status is left as it is.
    /// Returns the new epoch, or `None` when a worker holds it now.
    pub async fn take_over(
        &self,
        holder: &str,
        id: &str,
        lease: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let what = format!("taking the lease of run `{id}`");
        let now = self.ctx.dialect.now_ms();
        let epoch: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "UPDATE runs SET lease_owner = $1, lease_until = {now} + $2, lease_epoch = lease_epoch + 1 \
             WHERE id = $3 AND lease_epoch IS NOT NULL AND status IN ('interrupted', 'running') \
             AND (lease_owner IS NULL OR lease_until < {now}) RETURNING lease_epoch"
        )))
        .bind(holder.to_string())
        .bind(millis(lease))
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.ctx.error(&what, &e))?;
        Ok(epoch)
    }

    /// How many submitted runs (of batch `batch`, or of any) are queued or running.
    pub async fn unfinished_submitted(&self, batch: Option<&str>) -> Result<u64, StoreError> {
        const WHAT: &str = "counting unfinished submitted runs";
        let only = if batch.is_some() {
            " AND head IN (SELECT id FROM run_heads WHERE batch = $1)"
        } else {
            ""
        };
        let mut q = sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM runs WHERE lease_epoch IS NOT NULL AND status IN ('queued', 'running'){only}"
        )));
        if let Some(b) = batch {
            q = q.bind(b.to_string());
        }
        let n = q
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.ctx.error(WHAT, &e))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The lease of run `id`: its epoch (None: not a submitted run), holder, and whether the
    /// lease is live on the database's clock.
    pub async fn lease_of(&self, id: &str) -> Result<Option<(i64, Option<String>, bool)>, StoreError> {
        let what = format!("reading the lease of run `{id}`");
        let now = self.ctx.dialect.now_ms();
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT lease_epoch, lease_owner, CASE WHEN lease_until > {now} THEN 1 ELSE 0 END AS live \
             FROM runs WHERE id = $1"
        )))
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.ctx.error(&what, &e))?;
        let Some(row) = row else {
            return Err(StoreError::NotFound(id.to_string()));
        };
        let err = |e: sqlx::Error| self.ctx.error(&what, &e);
        let epoch: Option<i64> = row.try_get("lease_epoch").map_err(err)?;
        let owner: Option<String> = row.try_get("lease_owner").map_err(err)?;
        let live: i64 = row.try_get("live").map_err(err)?;
        Ok(epoch.map(|e| (e, owner, live == 1)))
    }
}

fn decode_claimed(row: &AnyRow) -> Result<Claimed, String> {
    let record = decode_run(row)?;
    let epoch: i64 = row
        .try_get("lease_epoch")
        .map_err(|e| format!("column `lease_epoch`: {e}"))?;
    let recoveries: Option<i64> = row
        .try_get("recoveries")
        .map_err(|e| format!("column `recoveries`: {e}"))?;
    Ok(Claimed {
        record,
        epoch,
        recoveries: u64::try_from(recoveries.unwrap_or(0)).unwrap_or(0),
    })
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn now_i64() -> i64 {
    int(crate::record::now_ms())
}
