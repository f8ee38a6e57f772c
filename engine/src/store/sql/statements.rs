//! The write statements of the group commit, for any number of rows: one statement writes a
//! whole chunk of records instead of one round trip per record. Chunks have power-of-two
//! sizes up to [`MAX_ROWS`], so each statement has at most ten shapes per database, each built
//! once and then prepared once per connection.
//!
//! All of it is portable SQL: multi-row `VALUES`, `INSERT ... ON CONFLICT ... DO UPDATE`,
//! `UPDATE ... FROM (VALUES ...)` (SQLite ≥ 3.33), whose columns both databases name
//! `column1`, `column2`, ...

use std::ops::Range;
use std::sync::OnceLock;

use super::Dialect;
use super::rows::RunHead;

/// The most rows one statement writes.
pub(crate) const MAX_ROWS: usize = 512;
const SHAPES: usize = MAX_ROWS.trailing_zeros() as usize + 1;

/// Built statements, by database and shape.
type Cache = [[OnceLock<String>; SHAPES]; 2];

/// The columns of `runs` a run record fills, in bind order (`id` first). The run's flow,
/// batch and origin are in its head ([`HEAD_COLUMNS`]).
pub(crate) const RUN_COLUMNS: [&str; 23] = [
    "id",
    "head",
    "parent_run",
    "parent_step",
    "depth",
    "status",
    "input",
    "output",
    "error",
    "started_at",
    "finished_at",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "steps",
    "context",
    "item_id",
    "item_index",
    "messages",
    "now_us",
    "cost_unknown_calls",
    "agent_changes",
    "files",
];

/// The columns of `run_heads`, in bind order.
pub(crate) const HEAD_COLUMNS: [&str; 6] = ["id", "flow", "flow_hash", "flow_path", "batch", "origin"];

/// The columns of `steps` a step record fills, in bind order: the key, `seq` (its place in
/// the statement, see [`upsert_steps`]), the rest.
pub(crate) const STEP_COLUMNS: [&str; 24] = [
    "run_id",
    "number",
    "attempt",
    "iteration",
    "seq",
    "step",
    "kind",
    "status",
    "iterations",
    "input",
    "result",
    "changes",
    "violations",
    "error",
    "started_at",
    "finished_at",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "child_run",
    "route",
    "answers",
    "cost_unknown_calls",
    "files",
];

const STEP_KEY: usize = 4;
const STEP_SEQ: usize = 4;

/// Splits `0..n` into runs of power-of-two lengths, largest first.
pub(crate) fn chunks(n: usize) -> impl Iterator<Item = Range<usize>> {
    let mut start = 0;
    std::iter::from_fn(move || {
        let left = n - start;
        if left == 0 {
            return None;
        }
        let len = MAX_ROWS.min(1 << left.ilog2());
        start += len;
        Some(start - len..start)
    })
}

/// Inserts `rows` runs; an existing run's recorded fields are replaced.
pub(crate) fn upsert_runs(dialect: Dialect, rows: usize) -> &'static str {
    static CACHE: Cache = [const { [const { OnceLock::new() }; SHAPES] }; 2];
    cached(&CACHE, dialect, rows, |dialect, rows| {
        format!(
            "INSERT INTO runs ({}) VALUES {} ON CONFLICT (id) DO UPDATE SET {}",
            RUN_COLUMNS.join(", "),
            values(dialect, RUN_COLUMNS.len(), rows),
            excluded(&RUN_COLUMNS[1..]),
        )
    })
}

/// Replaces the recorded fields of `rows` existing runs; missing ones are left alone (the
/// count of rows changed tells).
pub(crate) fn update_runs(dialect: Dialect, rows: usize) -> &'static str {
    static CACHE: Cache = [const { [const { OnceLock::new() }; SHAPES] }; 2];
    cached(&CACHE, dialect, rows, |dialect, rows| {
        let set: Vec<String> = RUN_COLUMNS
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, c)| format!("{c} = v.column{}", i + 1))
            .collect();
        format!(
            "UPDATE runs SET {} FROM (VALUES {}) AS v WHERE runs.id = v.column1",
            set.join(", "),
            values(dialect, RUN_COLUMNS.len(), rows)
        )
    })
}

/// Inserts `rows` step records, or replaces those with the same (run, number, attempt,
/// iteration), keeping their `seq`. A new record's `seq` is the largest its run has before the
/// statement (read through the primary key) plus its rank among the statement's records of
/// that run, by their place in it (bound where `seq` goes): the run's record order, read under
/// the write lock, so a run another process wrote before (one that crashed, or whose lease
/// ran out) continues after it. Both databases evaluate the subquery before inserting: SQLite
/// materializes a `SELECT` that reads the table it inserts into, and PostgreSQL reads the
/// statement's snapshot.
pub(crate) fn upsert_steps(dialect: Dialect, rows: usize) -> &'static str {
    static CACHE: Cache = [const { [const { OnceLock::new() }; SHAPES] }; 2];
    cached(&CACHE, dialect, rows, |dialect, rows| {
        let select: Vec<String> = (1..=STEP_COLUMNS.len())
            .map(|i| {
                if i == STEP_SEQ + 1 {
                    format!(
                        "(SELECT COALESCE(MAX(s.seq), 0) FROM steps s WHERE s.run_id = v.column1) \
                         + ROW_NUMBER() OVER (PARTITION BY v.column1 ORDER BY v.column{i})"
                    )
                } else {
                    format!("v.column{i}")
                }
            })
            .collect();
        format!(
            "INSERT INTO steps ({}) SELECT {} FROM (VALUES {}) AS v WHERE true ON CONFLICT ({}) DO UPDATE SET {}",
            STEP_COLUMNS.join(", "),
            select.join(", "),
            values(dialect, STEP_COLUMNS.len(), rows),
            STEP_COLUMNS[..STEP_KEY].join(", "),
            excluded(&STEP_COLUMNS[STEP_SEQ + 1..]),
        )
    })
}

/// Inserts `rows` run heads; a head stored already is left as it is (and checked with
/// [`stored_heads`]).
pub(crate) fn insert_heads(dialect: Dialect, rows: usize) -> &'static str {
    static CACHE: Cache = [const { [const { OnceLock::new() }; SHAPES] }; 2];
    cached(&CACHE, dialect, rows, |dialect, rows| {
        format!(
            "INSERT INTO run_heads ({}) VALUES {} ON CONFLICT (id) DO NOTHING",
            HEAD_COLUMNS.join(", "),
            values(dialect, HEAD_COLUMNS.len(), rows),
        )
    })
}

/// The stored heads of `rows` ids.
pub(crate) fn stored_heads(dialect: Dialect, rows: usize) -> String {
    let params: Vec<String> = (1..=rows).map(|i| dialect.param(i)).collect();
    format!(
        "SELECT {} FROM run_heads WHERE id IN ({})",
        HEAD_COLUMNS.join(", "),
        params.join(", ")
    )
}

/// Stores the heads of the runs a commit writes, before the runs: each head once. A head
/// this process has not written before is read back and compared, so that two heads whose
/// ids collide fail the commit instead of one naming the other's runs.
pub(crate) async fn write_heads<'h>(
    conn: &mut sqlx::AnyConnection,
    dialect: Dialect,
    heads: impl Iterator<Item = &'h RunHead>,
) -> Result<(), sqlx::Error> {
    use std::collections::{HashMap, HashSet};
    use std::sync::Mutex;
    static CHECKED: Mutex<Option<HashSet<i64>>> = Mutex::new(None);
    let mut unique: HashMap<i64, &RunHead> = HashMap::new();
    for h in heads {
        unique.entry(h.id).or_insert(h);
    }
    // In id order: two transactions inserting the same new heads wait for each other in
    // one order (PostgreSQL), never in a cycle.
    let mut heads: Vec<&RunHead> = unique.into_values().collect();
    heads.sort_unstable_by_key(|h| h.id);
    for chunk in chunks(heads.len()).map(|r| &heads[r]) {
        let q = chunk
            .iter()
            .fold(sqlx::query(insert_heads(dialect, chunk.len())), |q, h| {
                h.bind_to(q)
            });
        q.execute(&mut *conn).await?;
    }
    let unchecked: Vec<&RunHead> = {
        let checked = CHECKED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        heads
            .into_iter()
            .filter(|h| !checked.as_ref().is_some_and(|c| c.contains(&h.id)))
            .collect()
    };
    for chunk in unchecked.chunks(MAX_ROWS) {
        let rows = chunk
            .iter()
            .fold(
                sqlx::query(sqlx::AssertSqlSafe(stored_heads(dialect, chunk.len()))),
                |q, h| q.bind(h.id),
            )
            .fetch_all(&mut *conn)
            .await?;
        for h in chunk {
            let mut found = false;
            for row in &rows {
                if sqlx::Row::try_get::<i64, _>(row, "id")? == h.id {
                    found = h.matches(row)?;
                }
            }
            if !found {
                return Err(sqlx::Error::Protocol(format!(
                    "run head {} is stored with other contents than flow `{}` (hash {}) of batch {:?}: \
                     two heads share an id",
                    h.id, h.flow, h.flow_hash, h.batch
                )));
            }
        }
        CHECKED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert_with(HashSet::new)
            .extend(chunk.iter().map(|h| h.id));
    }
    Ok(())
}

/// `SELECT id FROM runs WHERE id IN (...)` for `rows` ids: which runs exist.
pub(crate) fn existing_runs(dialect: Dialect, rows: usize) -> String {
    let params: Vec<String> = (1..=rows).map(|i| dialect.param(i)).collect();
    format!("SELECT id FROM runs WHERE id IN ({})", params.join(", "))
}

fn cached(
    cache: &'static Cache,
    dialect: Dialect,
    rows: usize,
    build: fn(Dialect, usize) -> String,
) -> &'static str {
    assert!(
        rows.is_power_of_two() && rows <= MAX_ROWS,
        "a chunk of {rows} rows"
    );
    let by_dialect = match dialect {
        Dialect::Sqlite => &cache[0],
        Dialect::Postgres => &cache[1],
    };
    by_dialect[rows.trailing_zeros() as usize].get_or_init(|| build(dialect, rows))
}

/// `($1, ..., $cols), ($cols+1, ...), ...` for `rows` rows.
fn values(dialect: Dialect, cols: usize, rows: usize) -> String {
    let row = |r: usize| {
        let params: Vec<String> = (1..=cols).map(|c| dialect.param(r * cols + c)).collect();
        format!("({})", params.join(", "))
    };
    (0..rows).map(row).collect::<Vec<_>>().join(", ")
}

fn excluded(columns: &[&str]) -> String {
    columns
        .iter()
        .map(|c| format!("{c} = excluded.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_powers_of_two_covering_everything() {
        let lens = |n| chunks(n).map(|r| r.len()).collect::<Vec<_>>();
        assert_eq!(lens(0), Vec::<usize>::new());
        assert_eq!(lens(1), [1]);
        assert_eq!(lens(45), [32, 8, 4, 1]);
        assert_eq!(lens(1100), [512, 512, 64, 8, 4]);
        assert_eq!(chunks(45).last(), Some(44..45));
    }

    #[test]
    fn statements_number_their_parameters_row_by_row() {
        use Dialect::{Postgres, Sqlite};
        assert_eq!(values(Postgres, 2, 2), "($1, $2), ($3, $4)");
        assert_eq!(values(Sqlite, 2, 2), "(?, ?), (?, ?)");
        let sql = upsert_steps(Postgres, 2);
        assert!(
            sql.starts_with("INSERT INTO steps (run_id, number, attempt, iteration, seq, step,"),
            "{sql}"
        );
        assert!(
            sql.contains(
                "v.column4, (SELECT COALESCE(MAX(s.seq), 0) FROM steps s WHERE s.run_id = v.column1) \
                 + ROW_NUMBER() OVER (PARTITION BY v.column1 ORDER BY v.column5), v.column6"
            ),
            "{sql}"
        );
        assert!(
            sql.contains("$24), ($25, $26,")
                && sql.ends_with(
                    "answers = excluded.answers, cost_unknown_calls = excluded.cost_unknown_calls, files = excluded.files"
                ),
            "{sql}"
        );
        assert!(
            sql.contains(
                "ON CONFLICT (run_id, number, attempt, iteration) DO UPDATE SET step = excluded.step"
            )
        );
        assert!(upsert_steps(Sqlite, 2).contains("(?, ?, ?,"));
        assert!(
            update_runs(Postgres, 1).starts_with("UPDATE runs SET head = v.column2, parent_run = v.column3")
        );
        assert!(upsert_runs(Sqlite, 1).contains("ON CONFLICT (id) DO UPDATE SET head = excluded.head"));
        assert_eq!(
            existing_runs(Postgres, 2),
            "SELECT id FROM runs WHERE id IN ($1, $2)"
        );
    }
}
