//! What a batch is told ([`BatchOptions`]) and what it tells while it runs ([`Progress`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::record::Usage;
use crate::record::cost::Cost;

/// What a batch reads and writes and how it runs its items: [`BatchOptions::new`] gives
/// `switchyard batch`'s defaults, and the public fields are its flags.
#[derive(Clone, Debug)]
pub struct BatchOptions {
    pub input: PathBuf,
    pub output: PathBuf,
    pub concurrency: usize,
    /// The field of each input object holding its id, a dotted path (`ticket.id`); lines
    /// without it are identified by their line number.
    pub id_field: String,
    /// The id field was named (`--id-field`), not the default: an input in which no line
    /// has it is refused.
    pub(crate) id_field_given: bool,
    /// The batch's budget: checked before every agent call of its items in flight, and no
    /// item starts once it is spent.
    pub max_cost_usd: Option<f64>,
    /// Write each item's files under `DIR/<id made safe>/` (`--files DIR`).
    pub files_dir: Option<PathBuf>,
    /// Run failed items again (a new run each).
    pub retry_failed: bool,
    pub retry_in_doubt: bool,
    pub allow_changed: bool,
    /// The store holds nothing of earlier batches (`--store memory`): nothing to look up.
    pub(crate) fresh_store: bool,
    /// Sync OUT.jsonl to disk before returning. Worth it only when the store is durable too:
    /// with `--store memory` a crash or power loss leaves nothing to continue from anyway, so
    /// its output is left to the operating system like any other file a tool writes.
    pub(crate) sync_output: bool,
    /// Run nothing: write OUT.jsonl from the store (`runs export`), in input order, up to the
    /// first item that has not finished.
    pub(crate) export_only: bool,
}

/// Counters the caller shows while the batch runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Items in the input.
    pub total: AtomicU64,
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    pub interrupted: AtomicU64,
    /// Runs doing work (agents, steps), as `--concurrency` bounds them; a run waiting only
    /// for the commit of its end is no longer counted.
    pub in_flight: AtomicU64,
    /// Items whose result came from an earlier start of the batch.
    pub reused: AtomicU64,
    /// Cost in nano-dollars, the unit providers count in: an item of a cheap local model
    /// costs well under a micro-dollar.
    pub cost_nanos: AtomicU64,
    /// Model calls whose cost is unknown (no `usage` reported), not in `cost_nanos`.
    pub cost_unknown_calls: AtomicU64,
}

impl Progress {
    pub fn done(&self) -> u64 {
        self.succeeded.load(Ordering::Relaxed)
            + self.failed.load(Ordering::Relaxed)
            + self.interrupted.load(Ordering::Relaxed)
    }

    pub fn cost_usd(&self) -> Cost {
        Cost::from_nanos(self.cost_nanos.load(Ordering::Relaxed))
    }

    pub(super) fn add_cost(&self, usage: &Usage) {
        self.cost_nanos
            .fetch_add(usage.cost_usd.nanos(), Ordering::Relaxed);
        self.cost_unknown_calls
            .fetch_add(usage.cost_unknown_calls, Ordering::Relaxed);
    }
}
