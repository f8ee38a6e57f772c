//! Budgets several run trees share (SPEC §6.1): a batch's `--max-cost-usd`, across its items
//! in flight and, through a worker's own implementation, across workers. The engine asks
//! [`SharedBudget::check`] before every agent call (every model turn of an agent loop
//! included) and tells [`SharedBudget::spend`] what each call used as it finishes, so a cap
//! is overshot by at most the calls already in flight when it was reached.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::record::Cost;
use crate::record::Usage;
use crate::record::{ErrorKind, StepError};

/// What [`SharedBudget::check`] returns.
pub type CheckFuture<'a> = Pin<Box<dyn Future<Output = Result<(), StepError>> + Send + 'a>>;

/// A cost budget shared by run trees.
pub trait SharedBudget: Send + Sync + std::fmt::Debug {
    /// `Err` (kind `limit`) once no new call may start: the budget is spent, or a call whose
    /// cost is unknown makes it impossible to tell. A budget held with other processes may
    /// ask them first.
    fn check(&self) -> CheckFuture<'_>;
    /// What a finished call used. `replayed`: a call of an earlier start whose record stands
    /// in for it on resume (spent then, not now).
    fn spend(&self, usage: &Usage, replayed: bool);
}

/// A budget counted in one process: `limit` USD (named `by`, e.g. `--max-cost-usd`) against
/// what was counted so far, in nano-dollars.
#[derive(Debug)]
pub struct CostCap {
    /// As written, for messages; compared as [`Cost::budget`].
    pub limit: f64,
    pub by: &'static str,
    spent_nano: AtomicU64,
    unknown: AtomicU64,
}

impl CostCap {
    pub fn new(limit: f64, by: &'static str) -> CostCap {
        CostCap {
            limit,
            by,
            spent_nano: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
        }
    }

    /// Counts what was spent outside the calls this process makes (items of an earlier
    /// start, other workers).
    pub fn add(&self, usage: &Usage) {
        self.spent_nano
            .fetch_add(usage.cost_usd.nanos(), Ordering::Relaxed);
        self.unknown
            .fetch_add(usage.cost_unknown_calls, Ordering::Relaxed);
    }

    /// What was counted so far.
    pub fn spent(&self) -> Usage {
        Usage {
            cost_usd: Cost::from_nanos(self.spent_nano.load(Ordering::Relaxed)),
            cost_unknown_calls: self.unknown.load(Ordering::Relaxed),
            ..Usage::default()
        }
    }

    /// Whether `spent` leaves room for another call under this cap.
    pub fn allows(&self, spent: &Usage) -> Result<(), StepError> {
        batch_check(self.limit, self.by, spent)
    }
}

impl SharedBudget for CostCap {
    fn check(&self) -> CheckFuture<'_> {
        Box::pin(std::future::ready(self.allows(&self.spent())))
    }

    fn spend(&self, usage: &Usage, _replayed: bool) {
        self.add(usage);
    }
}

/// Whether `spent` is still under the budget `limit` USD, compared in whole nano-dollars
/// ([`Cost::budget`]): `0` allows calls until one costs something. A limit past what a count
/// can reach never is; one that is no amount (negative, not a number: refused where it is
/// read) is taken as `0`.
pub fn under(spent: Cost, limit: f64) -> bool {
    spent.is_zero()
        || match Cost::budget(limit) {
            Some(cap) => spent < cap,
            None => limit.is_finite() && limit > 0.0 || limit == f64::INFINITY,
        }
}

/// Whether a batch that has `spent` leaves room for another call under `limit` USD (named
/// `by`): a call of unknown cost leaves none, and `0` allows calls until one costs something.
pub fn batch_check(limit: f64, by: &str, spent: &Usage) -> Result<(), StepError> {
    if spent.cost_unknown_calls > 0 {
        return Err(unknown_cost(by, limit, spent.cost_unknown_calls));
    }
    if under(spent.cost_usd, limit) {
        return Ok(());
    }
    Err(StepError::new(
        ErrorKind::Limit,
        format!(
            "cost limit reached: the batch has spent {} ({by} {limit})",
            spent.cost_usd
        ),
    )
    .with_details(serde_json::json!({"spent_usd": spent.cost_usd, "limit_usd": limit})))
}

/// Why a batch with `--max-cost-usd` `max` stopped starting items, having spent `cost` with
/// `unknown` calls of unknown cost (earlier starts included).
pub fn batch_stopped(max: f64, cost: Cost, unknown: u64) -> String {
    if unknown > 0 {
        return unknown_cost("--max-cost-usd", max, unknown).message;
    }
    format!(
        "the cost limit was reached: the batch has spent {cost} of --max-cost-usd {max} (earlier starts included)"
    )
}

/// The error of a budget that cannot be checked: `unknown` calls reported no usage.
pub fn unknown_cost(by: &str, limit: f64, unknown: u64) -> StepError {
    let calls = if unknown == 1 {
        "1 model call".to_string()
    } else {
        format!("{unknown} model calls")
    };
    StepError::new(
        ErrorKind::Limit,
        format!(
            "cost limit cannot be checked ({by} {limit}): the provider reported no usage for {calls}, \
             so what was spent is unknown; set `assume_tokens_per_call` on the provider to count such calls"
        ),
    )
    .with_details(serde_json::json!({"cost_unknown_calls": unknown, "limit_usd": limit}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_compared_in_whole_nano_dollars() {
        let usd = |x: f64| Cost::from_usd(x).expect("a cost");
        // Anything goes until something is spent; then the limit itself is too much.
        assert!(under(Cost::ZERO, 0.0) && !under(Cost::from_nanos(1), 0.0));
        assert!(under(usd(0.2999999), 0.3) && !under(usd(0.1) + usd(0.2), 0.3));
        assert!(under(usd(1e9), f64::INFINITY) && under(usd(1e9), 1e20));
        // No amount: as 0.
        assert!(!under(Cost::from_nanos(1), -1.0) && !under(Cost::from_nanos(1), f64::NAN));
        let spent = Usage {
            cost_usd: usd(0.005),
            ..Usage::default()
        };
        let e = batch_check(0.005, "--max-cost-usd", &spent).expect_err("spent");
        assert_eq!(
            e.message,
            "cost limit reached: the batch has spent $0.0050 (--max-cost-usd 0.005)"
        );
        assert!(batch_check(0.0050000001, "--max-cost-usd", &spent).is_ok());
    }
}
