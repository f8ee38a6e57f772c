//! A submitted batch's budget (`submit --max-cost-usd`, SPEC §6.1 and §12) held by all its
//! workers together. Each worker counts what its own model calls of the batch cost (a
//! replayed call of a run taken over is not counted again: the worker that made it did) and
//! shares that count through the store (`batch_spend`, one row per batch and worker); the
//! batch has spent the sum of the rows.
//!
//! Before every agent call of a batch with a cap, a worker shares its count and reads the
//! others' and the cap in one short transaction (`SqlStore::share_spend`); checks that wait
//! meanwhile take the answer of a refresh that began after they did, so a worker makes one
//! at a time however many runs it holds. A finished call wakes the background refresh at
//! once, so the others see it within a round trip. So a batch overshoots its cap by at most
//! the calls in flight on all workers when it was reached. A worker that cannot reach the
//! store checks against what it last read; a worker that dies leaves out of the count what
//! its calls cost since its last refresh.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::record::StepError;
use crate::record::Usage;
use crate::record::cost::Cost;
use crate::runtime::budget::{CheckFuture, SharedBudget, batch_check};
use crate::store::StoreError;
use crate::store::any::AnyStore;

/// How often a worker shares its spend of a batch with a cap when nothing wakes it sooner.
pub const REFRESH: Duration = Duration::from_millis(200);
/// How often (in [`REFRESH`]es) for a batch without a cap: `submit` may give it one later.
const REFRESH_UNCAPPED: u32 = 10;

/// One batch's spend as one worker sees it.
pub struct BatchSpend {
    batch: String,
    worker: String,
    store: Arc<AnyStore>,
    /// The batch's cap as last read.
    cap: Mutex<Option<f64>>,
    /// This worker's own calls, in nano-USD, and those of unknown cost.
    mine_nano: AtomicU64,
    mine_unknown: AtomicU64,
    /// The other workers' calls, as of the last refresh.
    others_nano: AtomicU64,
    others_unknown: AtomicU64,
    /// When the last refresh began; held while one runs.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
    /// Wakes the background refresh: a call finished.
    spent: Arc<Notify>,
}

impl std::fmt::Debug for BatchSpend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchSpend")
            .field("batch", &self.batch)
            .field("cap", &self.cap())
            .field("mine_nano", &self.mine_nano)
            .field("others_nano", &self.others_nano)
            .finish_non_exhaustive()
    }
}

impl BatchSpend {
    fn cap(&self) -> Option<f64> {
        *self.cap.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shares this worker's count and reads the cap and the others' counts.
    async fn refresh(&self) -> Result<(), StoreError> {
        let AnyStore::Sql(sql) = &*self.store else {
            return Ok(());
        };
        let mine = Cost::from_nanos(self.mine_nano.load(Ordering::Relaxed));
        let unknown = self.mine_unknown.load(Ordering::Relaxed);
        let (cap, others, others_unknown) = sql.share_spend(&self.batch, &self.worker, mine, unknown).await?;
        *self.cap.lock().unwrap_or_else(|p| p.into_inner()) = cap;
        self.others_nano.store(others.nanos(), Ordering::Relaxed);
        self.others_unknown.store(others_unknown, Ordering::Relaxed);
        Ok(())
    }

    /// A refresh that begins after `asked`, or the answer of one that began after it.
    async fn refresh_since(&self, asked: Instant) {
        let mut last = self.refreshed.lock().await;
        if last.is_some_and(|t| t >= asked) {
            return;
        }
        *last = Some(Instant::now());
        if let Err(e) = self.refresh().await {
            tracing::warn!(worker = %self.worker, batch = %self.batch, error = %e,
                "cannot read the batch's spend: checking against the last one read");
        }
    }

    /// The cap against the counts as they are now.
    fn allows(&self) -> Result<(), StepError> {
        let Some(cap) = self.cap() else {
            return Ok(());
        };
        let spent_nano = self.mine_nano.load(Ordering::Relaxed) + self.others_nano.load(Ordering::Relaxed);
        let spent = Usage {
            cost_usd: Cost::from_nanos(spent_nano),
            cost_unknown_calls: self.mine_unknown.load(Ordering::Relaxed)
                + self.others_unknown.load(Ordering::Relaxed),
            ..Usage::default()
        };
        batch_check(cap, "submit --max-cost-usd", &spent)
    }
}

impl SharedBudget for BatchSpend {
    fn check(&self) -> CheckFuture<'_> {
        Box::pin(async move {
            if self.cap().is_none() {
                return Ok(());
            }
            self.refresh_since(Instant::now()).await;
            self.allows()
        })
    }

    fn spend(&self, usage: &Usage, replayed: bool) {
        if replayed {
            return;
        }
        self.mine_nano
            .fetch_add(usage.cost_usd.nanos(), Ordering::Relaxed);
        self.mine_unknown
            .fetch_add(usage.cost_unknown_calls, Ordering::Relaxed);
        self.spent.notify_one();
    }
}

/// The spend of every batch a worker runs, refreshed in the background.
pub struct WorkerBudgets {
    worker: String,
    store: Arc<AnyStore>,
    batches: Mutex<HashMap<String, Arc<BatchSpend>>>,
    spent: Arc<Notify>,
}

impl WorkerBudgets {
    pub fn new(worker: String, store: Arc<AnyStore>) -> WorkerBudgets {
        WorkerBudgets {
            worker,
            store,
            batches: Mutex::default(),
            spent: Arc::default(),
        }
    }

    /// Batch `name`'s spend, read from the store before it is first given out, so that a
    /// worker joining a batch late starts from what the others spent.
    pub async fn of(&self, name: &str) -> Result<Arc<BatchSpend>, StoreError> {
        let known = self
            .batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned();
        if let Some(b) = known {
            return Ok(b);
        }
        let b = Arc::new(BatchSpend {
            batch: name.to_string(),
            worker: self.worker.clone(),
            store: self.store.clone(),
            cap: Mutex::new(None),
            mine_nano: AtomicU64::new(0),
            mine_unknown: AtomicU64::new(0),
            others_nano: AtomicU64::new(0),
            others_unknown: AtomicU64::new(0),
            refreshed: tokio::sync::Mutex::new(None),
            spent: self.spent.clone(),
        });
        b.refresh().await?;
        let mut batches = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        Ok(batches.entry(name.to_string()).or_insert(b).clone())
    }

    /// Shares and reads the spend of the batches with a cap, and every
    /// [`REFRESH_UNCAPPED`]th `tick` of the others too.
    async fn refresh(&self, tick: u32) {
        let batches: Vec<Arc<BatchSpend>> = self
            .batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for b in batches {
            if b.cap().is_some() || tick.is_multiple_of(REFRESH_UNCAPPED) {
                b.refresh_since(Instant::now()).await;
            }
        }
    }

    /// Refreshes every [`REFRESH`], and at once after a call finished, until `stop`; then
    /// once more, so the store keeps what this worker's last calls cost.
    pub async fn keep_fresh(&self, stop: CancellationToken) {
        let mut tick = 0u32;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(REFRESH) => tick = tick.wrapping_add(1),
                _ = self.spent.notified() => {}
                _ = stop.cancelled() => break,
            }
            self.refresh(tick).await;
        }
        self.refresh(0).await;
    }
}
