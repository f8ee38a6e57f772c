//! The provider limits a worker holds with the other workers of its store (SPEC §12): the
//! provider registry's [`SharedLimits`] over the store's statements ([`SqlLimits`]), under
//! this worker's id and lease. What is limited, and when, is the registry's
//! (`agents::provider`); the rows and statements are the store's (`store::sql::limits`).
//!
//! Slots are given back in the background (the registry spawns the giving back: a request's
//! admission is dropped in sync code).
//! The heartbeat renews every slot of the worker, so a slot whose giving back failed would be
//! held for good: it is given back again before each renewal until that works.
//! [`WorkerLimits::finish`] waits for those still on their way when the worker stops, then
//! gives back whatever slot this worker still holds, so none waits for its lease to run out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::agents::provider::{SharedFuture, SharedLimits};
use crate::store::StoreError;
use crate::store::sql::SqlLimits;

/// A worker's [`SharedLimits`].
pub struct WorkerLimits {
    sql: SqlLimits,
    worker: String,
    lease: Duration,
    /// Slots being given back now.
    releasing: Arc<AtomicUsize>,
    /// Slots whose giving back failed: (key, slot), tried again by [`WorkerLimits::renew`].
    unreleased: Arc<Mutex<Vec<(String, u64)>>>,
}

impl WorkerLimits {
    /// Limits held through `sql` by worker `worker`, whose slots are leased for `lease`.
    pub fn new(sql: SqlLimits, worker: String, lease: Duration) -> WorkerLimits {
        WorkerLimits {
            sql,
            worker,
            lease,
            releasing: Arc::default(),
            unreleased: Arc::default(),
        }
    }

    /// Extends the leases of this worker's slots (its heartbeat), after giving back again
    /// those whose giving back failed.
    pub async fn renew(&self) -> Result<u64, StoreError> {
        let retry = std::mem::take(&mut *self.unreleased.lock().unwrap_or_else(|p| p.into_inner()));
        for (i, (key, slot)) in retry.iter().enumerate() {
            if let Err(e) = self.sql.release_slot(key, *slot, &self.worker).await {
                self.unreleased
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(retry[i..].iter().cloned());
                return Err(e);
            }
        }
        self.sql.renew_slots(&self.worker, self.lease).await
    }

    /// Waits up to `within` for slots being given back, then gives back every slot this
    /// worker still holds (requests cut off at the drain, a release that failed).
    pub async fn finish(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.releasing.load(Ordering::Acquire) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        match self.sql.release_slots(&self.worker).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(worker = %self.worker, slots = n, "gave back the provider slots still held")
            }
            Err(e) => tracing::warn!(
                worker = %self.worker, error = %e,
                "could not give back provider slots: they free themselves when the lease runs out"
            ),
        }
    }
}

impl SharedLimits for WorkerLimits {
    fn pace(&self, key: &str, cost: Duration, adjust_us: i64) -> SharedFuture<Duration> {
        let (sql, key) = (self.sql.clone(), key.to_string());
        let cost_us = i64::try_from(cost.as_micros()).unwrap_or(i64::MAX);
        Box::pin(async move {
            // The database reads its clock as the statement returns (after any wait for the
            // row), so waiting from the answer's arrival adds only the trip back.
            sql.pace(&key, cost_us, adjust_us)
                .await
                .map(|p| p.wait())
                .map_err(|e| e.to_string())
        })
    }

    fn try_slot(&self, key: &str, max: u64) -> SharedFuture<Option<u64>> {
        let (sql, key, worker, lease) = (self.sql.clone(), key.to_string(), self.worker.clone(), self.lease);
        Box::pin(async move {
            sql.claim_slot(&key, max, &worker, lease)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn release_slot(&self, key: &str, slot: u64) -> SharedFuture<()> {
        let (sql, key, worker) = (self.sql.clone(), key.to_string(), self.worker.clone());
        // On its way from now: counted until the future ends, or is dropped unpolled.
        let on_its_way = Releasing::new(&self.releasing);
        let unreleased = self.unreleased.clone();
        Box::pin(async move {
            let _on_its_way = on_its_way;
            if let Err(e) = sql.release_slot(&key, slot, &worker).await {
                tracing::warn!(
                    provider = %key, slot, error = %e,
                    "could not give back a provider slot: trying again at the next heartbeat"
                );
                unreleased
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((key, slot));
            }
            Ok(())
        })
    }
}

/// One slot on its way back, counted in [`WorkerLimits::finish`]'s wait while it lives.
struct Releasing(Arc<AtomicUsize>);

impl Releasing {
    fn new(count: &Arc<AtomicUsize>) -> Releasing {
        count.fetch_add(1, Ordering::AcqRel);
        Releasing(count.clone())
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
