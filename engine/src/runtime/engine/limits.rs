//! Limits of a run (SPEC §9): `max_steps`, `max_payload_bytes` (with the bound that spares
//! measuring the payload after every write) and the cost budget of `max_cost_usd` and
//! `--max-cost-usd` down the tree. `limits.timeout` is the walk's; `max_depth` is child runs'.

use std::sync::atomic::Ordering;

use serde_json::Value;

use super::{Run, Tree};
use crate::record::Change;
use crate::record::Usage;
use crate::record::cost::Cost;
use crate::record::{ErrorKind, StepError};
use crate::runtime::budget;
use crate::store::Store;

impl Tree {
    pub(super) fn spent(&self) -> Cost {
        Cost::from_nanos(self.spent_nano.load(Ordering::Relaxed))
    }

    pub(super) fn unknown_calls(&self) -> u64 {
        self.unknown_calls.load(Ordering::Relaxed)
    }

    /// Counts what a finished call used against the tree's budgets and the shared one.
    /// `replayed`: the record of a call of an earlier start, standing in for it.
    pub(super) fn spend(&self, usage: &Usage, replayed: bool) {
        self.spent_nano
            .fetch_add(usage.cost_usd.nanos(), Ordering::Relaxed);
        self.unknown_calls
            .fetch_add(usage.cost_unknown_calls, Ordering::Relaxed);
        if let Some(shared) = &self.options.shared_budget {
            shared.spend(usage, replayed);
        }
    }
}

/// A cost budget (SPEC §9 `max_cost_usd`): `limit` USD from the tree's spending at `base`
/// (a child flow's own limit counts from when it starts), and the calls of unknown cost from
/// `unknown_base` on. Reached, or a call's cost unknown, it stops new agent calls.
#[derive(Clone, Copy, Debug)]
pub(super) struct Budget {
    pub(super) base: Cost,
    pub(super) unknown_base: u64,
    /// As written; compared in whole nano-dollars ([`Cost::budget`]).
    pub(super) limit: f64,
    pub(super) by: &'static str,
}

impl Budget {
    /// The tree's spending at which this budget is spent: exact, so a child's budget that
    /// begins at `$0.1` with `0.2` to spend ends at `$0.3`, not a float's hair past it.
    fn ceiling(&self) -> Option<Cost> {
        Cost::budget(self.limit).map(|limit| self.base + limit)
    }

    /// The tighter of two budgets; calls of unknown cost count from the earlier start of
    /// the two, since both budgets hold.
    pub(super) fn min(a: Option<Budget>, b: Option<Budget>) -> Option<Budget> {
        match (a, b) {
            (Some(a), Some(b)) => {
                let unknown_base = a.unknown_base.min(b.unknown_base);
                // `None` (no ceiling a count can reach) is the loosest.
                let tighter = match (a.ceiling(), b.ceiling()) {
                    (Some(x), Some(y)) if y < x => b,
                    (None, Some(_)) => b,
                    _ => a,
                };
                Some(Budget {
                    unknown_base,
                    ..tighter
                })
            }
            (a, b) => a.or(b),
        }
    }
}
impl<'e, S: Store> Run<'e, S> {
    /// Counts a step execution against `limits.max_steps`.
    pub(super) fn count_step(&self) -> Result<(), StepError> {
        let executed = self.executed.fetch_add(1, Ordering::Relaxed) + 1;
        let max = self.flow.limits.max_steps;
        if executed > max {
            return Err(StepError::new(
                ErrorKind::Limit,
                format!("step limit reached ({} {max})", self.flow.limits.max_steps_name()),
            ));
        }
        Ok(())
    }

    /// Measures the payload against `limits.max_payload_bytes` (the run input, before any
    /// step), and starts the bound [`Run::check_payload_size`] keeps.
    pub(super) fn measure_payload(&mut self) -> Result<(), StepError> {
        let max = self.flow.limits.max_payload_bytes;
        let size = json_size(&self.payload, max + 1);
        if size > max {
            return Err(payload_limit(self.flow.limits.max_payload_bytes_name(), max));
        }
        self.payload_bound = size;
        Ok(())
    }

    /// Checks `limits.max_payload_bytes` after the writes `changes` made. Walking the whole
    /// payload after every write would cost O(payload) per step (quadratic over a loop that
    /// grows it), so the run keeps an upper bound of the payload's size: a write adds at most
    /// the size of its value and of the containers its path creates. Only when that bound
    /// passes the limit is the payload measured (and the bound reset to its size): the step
    /// fails exactly when the payload is over the limit, as if it were measured every time.
    pub(super) fn check_payload_size(&mut self, changes: &[Change]) -> Result<(), StepError> {
        let max = self.flow.limits.max_payload_bytes;
        let mut bound = self.payload_bound;
        for c in changes {
            if bound > max {
                break;
            }
            bound = bound
                .saturating_add(json_size(&c.value, max + 1))
                .saturating_add(write_overhead(&c.path));
        }
        if bound <= max {
            self.payload_bound = bound;
            return Ok(());
        }
        self.measure_payload()
    }

    /// Fails with kind `limit` once the tree has spent its budget, once a call of unknown
    /// cost makes the budget impossible to check, and once the shared budget (a batch's)
    /// refuses: asked before every agent call.
    pub(super) async fn check_budget(&self) -> Result<(), StepError> {
        if let Some(shared) = &self.tree.options.shared_budget {
            shared.check().await?;
        }
        let Some(b) = self.lineage.budget else {
            return Ok(());
        };
        let unknown = self.tree.unknown_calls().saturating_sub(b.unknown_base);
        if unknown > 0 {
            return Err(budget::unknown_cost(b.by, b.limit, unknown));
        }
        // Since this budget began; `max_cost_usd: 0` allows calls until one costs something.
        let spent = self.tree.spent().saturating_sub(b.base);
        if budget::under(spent, b.limit) {
            return Ok(());
        }
        Err(StepError::new(
            ErrorKind::Limit,
            format!("cost limit reached: {spent} spent ({} {})", b.by, b.limit),
        )
        .with_details(serde_json::json!({"spent_usd": spent, "limit_usd": b.limit})))
    }
}
fn payload_limit(name: &str, max: u64) -> StepError {
    StepError::new(
        ErrorKind::Limit,
        format!("payload size limit reached ({name} {max})"),
    )
}

/// At most what a write at `path` (a change's path: `$.a.b`, `$['k'][0]`) adds to the size
/// of the payload besides its value: the keys and brackets of the containers it creates and a
/// comma at each level. Every key's text is inside the path's text, and each segment costs
/// at least one character of it, so a few characters per character of the path are plenty.
fn write_overhead(path: &str) -> u64 {
    6 * path.len() as u64 + 8
}

/// The size of `v` as JSON text, counted up to a little past `cap`.
pub fn json_size(v: &Value, cap: u64) -> u64 {
    pub(super) fn walk(v: &Value, acc: &mut u64, cap: u64) {
        if *acc > cap {
            return;
        }
        match v {
            Value::Null => *acc += 4,
            Value::Bool(b) => *acc += if *b { 4 } else { 5 },
            Value::Number(n) => *acc += number_len(n),
            Value::String(s) => *acc += s.len() as u64 + 2,
            Value::Array(a) => {
                *acc += 2 + a.len().saturating_sub(1) as u64;
                for x in a {
                    walk(x, acc, cap);
                }
            }
            Value::Object(m) => {
                *acc += 2 + m.len().saturating_sub(1) as u64;
                for (k, x) in m {
                    *acc += k.len() as u64 + 3;
                    walk(x, acc, cap);
                }
            }
        }
    }
    let mut acc = 0;
    walk(v, &mut acc, cap);
    acc
}

/// The length of a JSON number as serde_json writes it, without building the text.
fn number_len(n: &serde_json::Number) -> u64 {
    fn digits(mut u: u64) -> u64 {
        let mut d = 1;
        while u >= 10 {
            u /= 10;
            d += 1;
        }
        d
    }
    if let Some(u) = n.as_u64() {
        digits(u)
    } else if let Some(i) = n.as_i64() {
        1 + digits(i.unsigned_abs())
    } else {
        // A float: serde_json's own formatting (the shortest round-trip text), on the stack.
        let mut buf = [0u8; 64];
        let mut w = &mut buf[..];
        match serde_json::to_writer(&mut w, n) {
            Ok(()) => 64 - w.len() as u64,
            Err(_) => n.to_string().len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ErrorKind;
    use crate::record::{self, RunStatus};
    use crate::runtime::engine::{Engine, RunOptions, RunOutcome};
    use std::sync::Arc;

    #[test]
    fn json_size_matches_serialization() {
        let v = serde_json::json!({"a": [1, 2.5, "x"], "b": {"c": null, "d": true}, "e": "é",
            "n": [0, 9, 10, 99, 100, -1, -10, -9_999, u64::MAX, i64::MIN, 1e21, -1.5e-7, 0.1, 123456.789]});
        assert_eq!(
            json_size(&v, u64::MAX),
            serde_json::to_string(&v).expect("json").len() as u64
        );
    }

    /// Compiles `flow` (YAML text) from a temporary file and runs it on `input`.
    async fn run_flow_text(flow: &str, input: Value) -> RunOutcome {
        use crate::project::Project;
        use crate::syntax::Limits;
        let dir = std::env::temp_dir().join(format!(
            "switchyard-engine-test-{}-{}",
            std::process::id(),
            record::new_run_id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("flow.yaml");
        std::fs::write(&file, flow).expect("write the flow");
        let mut project = Project::default();
        let id = project
            .load_top(&file, dir.canonicalize().expect("canonical"), &Limits::default())
            .expect("the flow loads");
        let (plan, diags) = crate::lint::lint_and_compile(&project, id);
        let plan = plan.unwrap_or_else(|| panic!("the flow compiles: {diags:?}"));
        let _ = std::fs::remove_dir_all(&dir);
        let engine = Engine::new(Arc::new(crate::store::memory::MemoryStore::new()));
        engine
            .run(
                Arc::new(plan),
                input,
                serde_json::json!({}),
                RunOptions::default(),
            )
            .await
    }

    const PAYLOAD_LOOP: &str = "flow: payload-loop
limits: {max_payload_bytes: 1KiB}
agents:
  grow: {kind: transform, result: {s: '=input.s + input.add'}}
steps:
  loop:
    while: =iteration < 150
    max_iterations: 150
    agent: grow
    output: {$.s: $.s}
";

    #[tokio::test]
    async fn the_payload_limit_sees_through_its_bound() {
        // Rewriting a value again and again adds to the bound, never to the payload: the
        // bound passes the limit, the payload is measured, and the run goes on.
        let o = run_flow_text(PAYLOAD_LOOP, serde_json::json!({"s": "", "add": ""})).await;
        assert_eq!(o.status, RunStatus::Succeeded, "{:?}", o.error);
        // Growing it by 10 bytes an iteration fails exactly when the payload passes 1024
        // bytes: `{"s":"…","add":"0123456789"}` is 27 bytes + 10 per iteration.
        let o = run_flow_text(PAYLOAD_LOOP, serde_json::json!({"s": "", "add": "0123456789"})).await;
        assert_eq!(o.status, RunStatus::Failed);
        let e = o.error.expect("an error");
        assert_eq!(e.kind, ErrorKind::Limit);
        assert_eq!(
            e.message,
            "step `loop`: payload size limit reached (limits.max_payload_bytes 1024)"
        );
        // The 100th iteration brings it to 1027 bytes (the 99th to 1017): the step and 100
        // iterations ran.
        assert_eq!(o.steps, 101);
    }
}
