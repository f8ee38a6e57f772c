//! Provider limits held across the workers of a store (SPEC §12): the rows of `provider_pace`
//! and `provider_slots` (schema 6), and the short statements that read and move them. What a
//! limit is, and when to call these, is the provider registry's business
//! (`agents::provider`); this module knows only keys, microseconds and slots.
//!
//! - **Pace** (a rate limit): `provider_pace.due_us` is the database-clock time at which the
//!   next unit of the limit is due. [`SqlLimits::pace`] reserves the next `cost_us` in one
//!   upsert (GCRA: `due = GREATEST(due, now) + cost`) and returns the start of the reserved
//!   span with the database's `now`, so the caller waits by the difference on its own clock.
//!   Spans never overlap, whichever worker reserved them: requests start at least `cost_us`
//!   apart on the database's clock.
//! - **Slots** (a `max_concurrency`): `provider_slots` holds one row per slot ever used
//!   (`slot` from 0, dense), each leased to a worker until `until_ms` (database clock). A
//!   claim takes a free or expired slot below the caller's `max`, or adds the next slot row;
//!   a worker's heartbeat renews its slots ([`SqlLimits::renew_slots`]), so those of a worker
//!   that died come free after its lease.
//!
//! Every statement is short and autocommitted: no row lock is held across a request.

use std::time::Duration;

use sqlx::{AnyPool, AssertSqlSafe, Row};

use super::error::Ctx;
use super::{SqlStore, StoreError};

/// The shared-limit statements of one store: cheap to clone (the pool is shared).
#[derive(Clone, Debug)]
pub struct SqlLimits {
    pool: AnyPool,
    ctx: Ctx,
}

/// What [`SqlLimits::pace`] reserved: the span `[start_us, start_us + cost)` of the limit, and
/// the database's clock when it did, both Unix microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Paced {
    pub start_us: i64,
    pub now_us: i64,
}

impl Paced {
    /// How long from the reservation until its span starts (zero when it started already).
    pub fn wait(&self) -> Duration {
        Duration::from_micros(u64::try_from(self.start_us - self.now_us).unwrap_or(0))
    }
}

impl SqlStore {
    /// The statements of the provider limits shared through this store.
    pub fn limits(&self) -> SqlLimits {
        SqlLimits {
            pool: self.pool.clone(),
            ctx: self.ctx.clone(),
        }
    }
}

impl SqlLimits {
    /// Reserves the next `cost_us` of the pace of `key`, after moving what is due by
    /// `adjust_us` (a settled reservation: negative gives time back, never before now). One
    /// statement.
    pub async fn pace(&self, key: &str, cost_us: i64, adjust_us: i64) -> Result<Paced, StoreError> {
        const WHAT: &str = "pacing a shared provider limit";
        let d = self.ctx.dialect;
        let now = d.now_us();
        let sql = format!(
            "INSERT INTO provider_pace (key, due_us) VALUES ($1, {now} + $2) \
             ON CONFLICT (key) DO UPDATE SET due_us = {} + $2 \
             RETURNING due_us, {now} AS now_us",
            d.greatest("provider_pace.due_us + $3", now),
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(key.to_string())
            .bind(cost_us)
            .bind(adjust_us)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.ctx.error(WHAT, &e))?;
        let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
        let due: i64 = row.try_get("due_us").map_err(err)?;
        let now_us: i64 = row.try_get("now_us").map_err(err)?;
        Ok(Paced {
            start_us: due - cost_us,
            now_us,
        })
    }

    /// Claims a slot of `key` below `max` for `worker` until `lease` from now: a free or
    /// expired one, else the next slot row while fewer than `max` exist. `None`: all `max`
    /// are held. One statement, two when a slot row is added.
    pub async fn claim_slot(
        &self,
        key: &str,
        max: u64,
        worker: &str,
        lease: Duration,
    ) -> Result<Option<u64>, StoreError> {
        const WHAT: &str = "claiming a shared provider slot";
        let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
        let d = self.ctx.dialect;
        let now = d.now_ms();
        let free = format!("(worker IS NULL OR until_ms < {now})");
        // `slot = (SELECT ...)`, not `slot IN (SELECT ...)`: PostgreSQL may run an `IN`
        // subquery again for every row the update scans (a semi-join), and with `SKIP LOCKED`
        // each run skips the row the last one locked, so one claim would take every free
        // slot. A scalar subquery runs once.
        let claim = format!(
            "UPDATE provider_slots SET worker = $1, until_ms = {now} + $2 \
             WHERE key = $3 AND {free} AND slot = (SELECT slot FROM provider_slots \
             WHERE key = $3 AND slot < $4 AND {free} ORDER BY slot LIMIT 1{lock}) \
             RETURNING slot",
            lock = d.claim_lock_clause(),
        );
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let lease = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        let slot: Option<i64> = sqlx::query_scalar(AssertSqlSafe(claim))
            .bind(worker.to_string())
            .bind(lease)
            .bind(key.to_string())
            .bind(max)
            .fetch_optional(&self.pool)
            .await
            .map_err(err)?;
        if let Some(s) = slot {
            return Ok(u64::try_from(s).ok());
        }
        // Slot rows are dense from 0, so the next one is numbered by their count. Two workers
        // adding the same one: the second adds nothing and polls again.
        let add = format!(
            "INSERT INTO provider_slots (key, slot, worker, until_ms) \
             SELECT $1, n, $2, {now} + $3 FROM (SELECT COUNT(*) AS n FROM provider_slots WHERE key = $1) c \
             WHERE n < $4 ON CONFLICT (key, slot) DO NOTHING RETURNING slot"
        );
        let slot: Option<i64> = sqlx::query_scalar(AssertSqlSafe(add))
            .bind(key.to_string())
            .bind(worker.to_string())
            .bind(lease)
            .bind(max)
            .fetch_optional(&self.pool)
            .await
            .map_err(err)?;
        Ok(slot.and_then(|s| u64::try_from(s).ok()))
    }

    /// Gives slot `slot` of `key` back, if `worker` still holds it.
    pub async fn release_slot(&self, key: &str, slot: u64, worker: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE provider_slots SET worker = NULL, until_ms = NULL \
             WHERE key = $1 AND slot = $2 AND worker = $3",
        )
        .bind(key.to_string())
        .bind(i64::try_from(slot).unwrap_or(i64::MAX))
        .bind(worker.to_string())
        .execute(&self.pool)
        .await
        .map_err(|e| self.ctx.error("giving back a shared provider slot", &e))?;
        Ok(())
    }

    /// Extends the leases of every slot `worker` holds to `lease` from now (its heartbeat).
    /// Returns how many it holds.
    pub async fn renew_slots(&self, worker: &str, lease: Duration) -> Result<u64, StoreError> {
        let now = self.ctx.dialect.now_ms();
        let done = sqlx::query(AssertSqlSafe(format!(
            "UPDATE provider_slots SET until_ms = {now} + $1 WHERE worker = $2"
        )))
        .bind(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX))
        .bind(worker.to_string())
        .execute(&self.pool)
        .await
        .map_err(|e| self.ctx.error("renewing shared provider slots", &e))?;
        Ok(done.rows_affected())
    }

    /// Gives back every slot `worker` holds (its exit).
    pub async fn release_slots(&self, worker: &str) -> Result<u64, StoreError> {
        let done = sqlx::query("UPDATE provider_slots SET worker = NULL, until_ms = NULL WHERE worker = $1")
            .bind(worker.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.ctx.error("giving back shared provider slots", &e))?;
        Ok(done.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn store() -> (SqlStore, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "sy-limits-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let url = format!("sqlite:{}", dir.join("runs.db").display());
        (SqlStore::open(&url).await.expect("open"), dir)
    }

    #[tokio::test]
    async fn paces_never_overlap_and_start_at_most_now() {
        let (s, dir) = store().await;
        let l = s.limits();
        let first = l.pace("p requests", 100_000, 0).await.unwrap();
        assert_eq!(first.wait(), Duration::ZERO, "{first:?}");
        let mut last = first.start_us;
        for _ in 0..5 {
            let p = l.pace("p requests", 100_000, 0).await.unwrap();
            assert!(p.start_us >= last + 100_000, "{p:?} after {last}");
            assert!(p.wait() <= Duration::from_millis(600));
            last = p.start_us;
        }
        // Time given back moves what is due, never before now.
        let p = l.pace("p requests", 1, -10_000_000_000).await.unwrap();
        assert!(
            p.start_us >= p.now_us - 1000 && p.wait() == Duration::ZERO,
            "{p:?}"
        );
        // Another key has its own pace.
        assert_eq!(
            l.pace("q requests", 100_000, 0).await.unwrap().wait(),
            Duration::ZERO
        );
        s.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn slots_are_held_up_to_max_released_and_expire() {
        let (s, dir) = store().await;
        let l = s.limits();
        let lease = Duration::from_secs(30);
        let a = l.claim_slot("p", 2, "w1", lease).await.unwrap();
        let b = l.claim_slot("p", 2, "w2", lease).await.unwrap();
        assert_eq!((a, b), (Some(0), Some(1)));
        assert_eq!(l.claim_slot("p", 2, "w1", lease).await.unwrap(), None);
        // A caller allowing more adds a slot; one allowing fewer sees only its own.
        assert_eq!(l.claim_slot("p", 3, "w3", lease).await.unwrap(), Some(2));
        l.release_slot("p", 0, "w2").await.unwrap();
        assert_eq!(
            l.claim_slot("p", 2, "w1", lease).await.unwrap(),
            None,
            "w2 does not hold slot 0"
        );
        l.release_slot("p", 0, "w1").await.unwrap();
        assert_eq!(l.claim_slot("p", 2, "w2", lease).await.unwrap(), Some(0));
        assert_eq!(l.renew_slots("w2", lease).await.unwrap(), 2);
        // A lease that ran out frees the slot for another worker.
        assert_eq!(l.renew_slots("w3", Duration::from_millis(1)).await.unwrap(), 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(l.claim_slot("p", 3, "w1", lease).await.unwrap(), Some(2));
        assert_eq!(l.release_slots("w2").await.unwrap(), 2);
        assert_eq!(l.claim_slot("p", 2, "w1", lease).await.unwrap(), Some(0));
        s.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }
}
