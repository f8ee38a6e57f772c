//! Records ↔ rows: [`RunRecord`] and [`StepRecord`] flattened into the columns of `runs` and
//! `steps`, JSON values as text. Encoding happens in the recording task, so the single writer
//! only binds and executes.

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::any::{AnyArguments, AnyRow};
use sqlx::query::Query;
use sqlx::{Any, Row};

use crate::record::cost::Cost;
use crate::record::{RunRecord, RunStatus, StepRecord, StepStatus, Usage};
use crate::store::StoreError;

/// The `iteration` key of a record that is not an iteration.
const NO_ITERATION: i64 = -1;

pub(crate) type AnyQuery = Query<'static, Any, AnyArguments>;

/// A run record ready to bind.
#[derive(Debug)]
pub(crate) struct RunRow {
    pub id: String,
    pub head: RunHead,
    pub parent_run: Option<String>,
    parent_step: Option<String>,
    depth: i64,
    status: &'static str,
    input: String,
    output: Option<String>,
    error: Option<String>,
    started_at: i64,
    finished_at: Option<i64>,
    input_tokens: i64,
    output_tokens: i64,
    cost_usd: f64,
    steps: i64,
    context: Option<String>,
    item_id: Option<String>,
    item_index: Option<i64>,
    messages: Option<String>,
    now_us: Option<i64>,
    cost_unknown_calls: i64,
    agent_changes: Option<String>,
    files: Option<String>,
}

impl RunRow {
    pub(crate) fn encode(r: &RunRecord) -> Result<RunRow, StoreError> {
        Ok(RunRow {
            id: r.id.clone(),
            head: RunHead::new(r),
            parent_run: r.parent_run.clone(),
            parent_step: r.parent_step.clone(),
            depth: int(u64::from(r.depth), "depth")?,
            status: r.status.as_str(),
            input: json(&r.input)?,
            output: r.output.as_ref().map(json).transpose()?,
            error: r.error.as_ref().map(json).transpose()?,
            started_at: int(r.started_at, "started_at")?,
            finished_at: r.finished_at.map(|t| int(t, "finished_at")).transpose()?,
            input_tokens: int(r.usage.input_tokens, "input_tokens")?,
            output_tokens: int(r.usage.output_tokens, "output_tokens")?,
            cost_usd: r.usage.cost_usd.usd(),
            steps: int(r.steps, "steps")?,
            context: (!r.context.is_null()).then(|| json(&r.context)).transpose()?,
            item_id: r.item_id.clone(),
            item_index: r.item_index.map(|i| int(i, "item_index")).transpose()?,
            messages: r.messages.as_ref().map(json).transpose()?,
            now_us: r.now_us,
            cost_unknown_calls: int(r.usage.cost_unknown_calls, "cost_unknown_calls")?,
            agent_changes: r.agent_changes.as_ref().map(json).transpose()?,
            files: (!r.files.is_empty()).then(|| json(&r.files)).transpose()?,
        })
    }

    /// Binds the row's values in the order of [`RUN_COLUMNS`](super::statements::RUN_COLUMNS).
    pub(crate) fn bind_to(&self, q: AnyQuery) -> AnyQuery {
        q.bind(self.id.clone())
            .bind(self.head.id)
            .bind(self.parent_run.clone())
            .bind(self.parent_step.clone())
            .bind(self.depth)
            .bind(self.status)
            .bind(self.input.clone())
            .bind(self.output.clone())
            .bind(self.error.clone())
            .bind(self.started_at)
            .bind(self.finished_at)
            .bind(self.input_tokens)
            .bind(self.output_tokens)
            .bind(self.cost_usd)
            .bind(self.steps)
            .bind(self.context.clone())
            .bind(self.item_id.clone())
            .bind(self.item_index)
            .bind(self.messages.clone())
            .bind(self.now_us)
            .bind(self.cost_unknown_calls)
            .bind(self.agent_changes.clone())
            .bind(self.files.clone())
    }
}

/// What the runs of one batch share, stored once in `run_heads` and named by `runs.head`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct RunHead {
    /// Derived from the rest: see [`RunHead::new`].
    pub id: i64,
    pub flow: String,
    pub flow_hash: String,
    pub flow_path: Option<String>,
    pub batch: Option<String>,
    pub origin: Option<&'static str>,
}

impl RunHead {
    /// The head of run `r`. Its id is the first 62 bits of the SHA-256 of its fields (each
    /// length-prefixed, absent ones marked) with bit 62 set: positive, and above the ids
    /// migration 13 gave the heads of older runs (1, 2, ...).
    pub(crate) fn new(r: &RunRecord) -> RunHead {
        let origin = r.origin.map(crate::record::Origin::as_str);
        RunHead {
            id: head_id([
                Some(r.flow.as_str()),
                Some(r.flow_hash.as_str()),
                r.flow_path.as_deref(),
                r.batch.as_deref(),
                origin,
            ]),
            flow: r.flow.clone(),
            flow_hash: r.flow_hash.clone(),
            flow_path: r.flow_path.clone(),
            batch: r.batch.clone(),
            origin,
        }
    }

    /// Binds the head in the order of [`HEAD_COLUMNS`](super::statements::HEAD_COLUMNS).
    pub(crate) fn bind_to(&self, q: AnyQuery) -> AnyQuery {
        q.bind(self.id)
            .bind(self.flow.clone())
            .bind(self.flow_hash.clone())
            .bind(self.flow_path.clone())
            .bind(self.batch.clone())
            .bind(self.origin)
    }

    /// Whether a stored head (read with the columns of [`HEAD_COLUMNS`](super::statements::HEAD_COLUMNS)) is this one.
    pub(crate) fn matches(&self, row: &AnyRow) -> Result<bool, sqlx::Error> {
        Ok(row.try_get::<i64, _>("id")? == self.id
            && row.try_get::<String, _>("flow")? == self.flow
            && row.try_get::<String, _>("flow_hash")? == self.flow_hash
            && row.try_get::<Option<String>, _>("flow_path")? == self.flow_path
            && row.try_get::<Option<String>, _>("batch")? == self.batch
            && row.try_get::<Option<String>, _>("origin")?.as_deref() == self.origin)
    }
}

/// See [`RunHead::new`].
fn head_id(fields: [Option<&str>; 5]) -> i64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for field in fields {
        match field {
            None => h.update([0u8]),
            Some(s) => {
                h.update([1u8]);
                h.update((s.len() as u64).to_be_bytes());
                h.update(s.as_bytes());
            }
        }
    }
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let id = (u64::from_be_bytes(first) & ((1 << 62) - 1)) | (1 << 62);
    i64::try_from(id).unwrap_or(i64::MAX)
}

/// A step record ready to bind.
#[derive(Debug)]
pub(crate) struct StepRow {
    pub run_id: String,
    pub number: String,
    pub attempt: i64,
    pub iteration: i64,
    step: String,
    kind: String,
    status: &'static str,
    iterations: Option<i64>,
    input: Option<String>,
    result: Option<String>,
    changes: Option<String>,
    violations: Option<String>,
    error: Option<String>,
    started_at: i64,
    finished_at: Option<i64>,
    input_tokens: i64,
    output_tokens: i64,
    cost_usd: f64,
    child_run: Option<String>,
    route: Option<String>,
    answers: Option<String>,
    cost_unknown_calls: i64,
    files: Option<String>,
}

impl StepRow {
    pub(crate) fn encode(s: &StepRecord) -> Result<StepRow, StoreError> {
        Ok(StepRow {
            run_id: s.run_id.clone(),
            number: s.number.clone(),
            attempt: i64::from(s.attempt),
            iteration: s.iteration.map_or(Ok(NO_ITERATION), |i| int(i, "iteration"))?,
            step: s.step.clone(),
            kind: s.kind.clone(),
            status: s.status.as_str(),
            iterations: s.iterations.map(|i| int(i, "iterations")).transpose()?,
            input: s.input.as_ref().map(json).transpose()?,
            result: s.result.as_ref().map(json).transpose()?,
            changes: (!s.changes.is_empty()).then(|| json(&s.changes)).transpose()?,
            violations: (!s.violations.is_empty())
                .then(|| json(&s.violations))
                .transpose()?,
            error: s.error.as_ref().map(json).transpose()?,
            started_at: int(s.started_at, "started_at")?,
            finished_at: s.finished_at.map(|t| int(t, "finished_at")).transpose()?,
            input_tokens: int(s.usage.input_tokens, "input_tokens")?,
            output_tokens: int(s.usage.output_tokens, "output_tokens")?,
            cost_usd: s.usage.cost_usd.usd(),
            child_run: s.child_run.clone(),
            route: s.route.clone(),
            answers: s.answers.as_ref().map(json).transpose()?,
            cost_unknown_calls: int(s.usage.cost_unknown_calls, "cost_unknown_calls")?,
            files: (!s.files.is_empty()).then(|| json(&s.files)).transpose()?,
        })
    }

    /// Binds the row's values in the order of [`STEP_COLUMNS`](super::statements::STEP_COLUMNS),
    /// `place` being its place among the statement's rows (1-based).
    pub(crate) fn bind_to(&self, q: AnyQuery, place: i64) -> AnyQuery {
        q.bind(self.run_id.clone())
            .bind(self.number.clone())
            .bind(self.attempt)
            .bind(self.iteration)
            .bind(place)
            .bind(self.step.clone())
            .bind(self.kind.clone())
            .bind(self.status)
            .bind(self.iterations)
            .bind(self.input.clone())
            .bind(self.result.clone())
            .bind(self.changes.clone())
            .bind(self.violations.clone())
            .bind(self.error.clone())
            .bind(self.started_at)
            .bind(self.finished_at)
            .bind(self.input_tokens)
            .bind(self.output_tokens)
            .bind(self.cost_usd)
            .bind(self.child_run.clone())
            .bind(self.route.clone())
            .bind(self.answers.clone())
            .bind(self.cost_unknown_calls)
            .bind(self.files.clone())
    }
}

/// A row of `runs` (the columns of `run_columns!`) back into a record.
pub(crate) fn decode_run(row: &AnyRow) -> Result<RunRecord, String> {
    let status: String = get(row, "status")?;
    Ok(RunRecord {
        id: get(row, "id")?,
        flow: get(row, "flow")?,
        flow_hash: get(row, "flow_hash")?,
        parent_run: get(row, "parent_run")?,
        parent_step: get(row, "parent_step")?,
        depth: u32::try_from(get::<i64>(row, "depth")?).map_err(|_| "`depth` out of range".to_string())?,
        status: RunStatus::parse(&status).ok_or_else(|| format!("unknown run status `{status}`"))?,
        input: from_json(&get::<String>(row, "input")?, "input")?,
        output: opt_json(row, "output")?,
        error: opt_json(row, "error")?,
        started_at: uint(get(row, "started_at")?, "started_at")?,
        finished_at: get::<Option<i64>>(row, "finished_at")?
            .map(|t| uint(t, "finished_at"))
            .transpose()?,
        started_ns: None,
        finished_ns: None,
        usage: usage(row)?,
        steps: uint(get(row, "steps")?, "steps")?,
        context: opt_json(row, "context")?.unwrap_or(serde_json::Value::Null),
        batch: get(row, "batch")?,
        item_id: get(row, "item_id")?,
        item_index: get::<Option<i64>>(row, "item_index")?
            .map(|i| uint(i, "item_index"))
            .transpose()?,
        flow_path: get(row, "flow_path")?,
        messages: opt_json(row, "messages")?,
        now_us: get(row, "now_us")?,
        agent_changes: opt_json(row, "agent_changes")?,
        origin: match get::<Option<String>>(row, "origin")? {
            None => None,
            Some(o) => {
                Some(crate::record::Origin::parse(&o).ok_or_else(|| format!("unknown run origin `{o}`"))?)
            }
        },
        files: opt_json(row, "files")?.unwrap_or_default(),
    })
}

/// A row of `steps` (the columns of `step_columns!`) back into a record.
pub(crate) fn decode_step(row: &AnyRow) -> Result<StepRecord, String> {
    let status: String = get(row, "status")?;
    let iteration: i64 = get(row, "iteration")?;
    Ok(StepRecord {
        run_id: get(row, "run_id")?,
        number: get(row, "number")?,
        step: get(row, "step")?,
        kind: get(row, "kind")?,
        attempt: u32::try_from(get::<i64>(row, "attempt")?)
            .map_err(|_| "`attempt` out of range".to_string())?,
        status: step_status(&status).ok_or_else(|| format!("unknown step status `{status}`"))?,
        iteration: if iteration == NO_ITERATION {
            None
        } else {
            Some(uint(iteration, "iteration")?)
        },
        iterations: get::<Option<i64>>(row, "iterations")?
            .map(|i| uint(i, "iterations"))
            .transpose()?,
        input: opt_json(row, "input")?,
        result: opt_json(row, "result")?,
        changes: opt_json(row, "changes")?.unwrap_or_default(),
        violations: opt_json(row, "violations")?.unwrap_or_default(),
        error: opt_json(row, "error")?,
        started_at: uint(get(row, "started_at")?, "started_at")?,
        finished_at: get::<Option<i64>>(row, "finished_at")?
            .map(|t| uint(t, "finished_at"))
            .transpose()?,
        started_ns: None,
        finished_ns: None,
        usage: usage(row)?,
        child_run: get(row, "child_run")?,
        route: get(row, "route")?,
        answers: opt_json(row, "answers")?,
        files: opt_json(row, "files")?.unwrap_or_default(),
    })
}

fn step_status(s: &str) -> Option<StepStatus> {
    Some(match s {
        "started" => StepStatus::Started,
        "succeeded" => StepStatus::Succeeded,
        "failed" => StepStatus::Failed,
        "interrupted" => StepStatus::Interrupted,
        _ => return None,
    })
}

fn usage(row: &AnyRow) -> Result<Usage, String> {
    let unknown: Option<i64> = get(row, "cost_unknown_calls")?;
    Ok(Usage {
        input_tokens: uint(get(row, "input_tokens")?, "input_tokens")?,
        output_tokens: uint(get(row, "output_tokens")?, "output_tokens")?,
        cost_usd: cost(get(row, "cost_usd")?, "cost_usd")?,
        cost_unknown_calls: uint(unknown.unwrap_or(0), "cost_unknown_calls")?,
    })
}

/// A `cost_usd` column (USD, `DOUBLE PRECISION`, written as [`Cost::usd`]) read back in
/// whole nano-dollars: rounding gives back the amount written, and mends the float drift of
/// sums recorded before costs were counted in nano-dollars.
pub(crate) fn cost(usd: f64, col: &str) -> Result<Cost, String> {
    Cost::from_usd(usd).ok_or_else(|| format!("column `{col}`: {usd} is not a cost in USD"))
}

/// The SQL of the sum of a `cost_usd` column in whole nano-dollars (`BIGINT`; NULL over no
/// rows): each row is rounded to the nano-dollar before they are added, as integers, so the
/// sum of a million rows is exact where a sum of doubles drifts. PostgreSQL sums `BIGINT`s
/// as `NUMERIC`, which the Any driver does not read: cast back.
pub(crate) fn sum_nanos(column: &str) -> String {
    format!("CAST(SUM(CAST(ROUND({column} * 1000000000) AS BIGINT)) AS BIGINT)")
}

/// A [`sum_nanos`] as read.
pub(crate) fn summed(nanos: Option<i64>, col: &str) -> Result<Cost, String> {
    uint(nanos.unwrap_or(0), col).map(Cost::from_nanos)
}

fn get<'r, T>(row: &'r AnyRow, col: &str) -> Result<T, String>
where
    T: sqlx::Decode<'r, Any> + sqlx::Type<Any>,
{
    row.try_get(col).map_err(|e| format!("column `{col}`: {e}"))
}

fn opt_json<T: DeserializeOwned>(row: &AnyRow, col: &str) -> Result<Option<T>, String> {
    get::<Option<String>>(row, col)?
        .map(|s| from_json(&s, col))
        .transpose()
}

fn from_json<T: DeserializeOwned>(s: &str, col: &str) -> Result<T, String> {
    serde_json::from_str(s).map_err(|e| format!("column `{col}`: {e}"))
}

fn json<T: Serialize + ?Sized>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Other(format!("cannot encode a record as JSON: {e}")))
}

fn int(v: u64, field: &str) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Other(format!("`{field}` = {v} is too large to store")))
}

fn uint(v: i64, col: &str) -> Result<u64, String> {
    u64::try_from(v).map_err(|_| format!("column `{col}`: negative value {v}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_statuses_round_trip() {
        for s in [
            StepStatus::Started,
            StepStatus::Succeeded,
            StepStatus::Failed,
            StepStatus::Interrupted,
        ] {
            assert_eq!(step_status(s.as_str()), Some(s));
        }
        assert_eq!(step_status("nope"), None);
    }

    #[test]
    fn head_ids_are_above_migrated_ones_and_tell_absent_from_empty() {
        let id = |batch: Option<&str>| head_id([Some("f"), Some("h"), None, batch, Some("cli")]);
        for b in [None, Some(""), Some("out.jsonl")] {
            assert!(id(b) >= 1 << 62, "{b:?}");
        }
        assert_eq!(id(Some("out.jsonl")), id(Some("out.jsonl")));
        assert_ne!(id(None), id(Some("")));
        assert_ne!(
            head_id([Some("ab"), Some("c"), None, None, None]),
            head_id([Some("a"), Some("bc"), None, None, None])
        );
    }

    #[test]
    fn out_of_range_values_are_refused_not_wrapped() {
        assert!(int(u64::MAX, "started_at").is_err());
        assert!(uint(-2, "steps").is_err());
    }
}
