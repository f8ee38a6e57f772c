//! The on-disk format of SQL stores and its migrations. One schema serves SQLite and
//! PostgreSQL: portable types only (`TEXT`, `BIGINT`, `DOUBLE PRECISION`), JSON values as
//! `TEXT`, no auto-increment.
//!
//! `schema_version` holds one row per applied migration; its shape never changes, so every
//! switchyard can tell how new a store is. Opening a store newer than [`SCHEMA_VERSION`] fails
//! before anything is written ([`StoreError::NewerSchema`]). Migrations run in order, each
//! batch in one transaction: a store is either at the old version or the new one.
//!
//! To change the schema, append a [`Migration`] (never edit a released one) and raise
//! [`SCHEMA_VERSION`].

use sqlx::{Acquire, AnyConnection, Connection};

use super::Dialect;
use super::error::Ctx;
use crate::record::now_ms;
use crate::store::StoreError;

/// The newest schema this build reads and writes.
pub const SCHEMA_VERSION: i64 = 13;

struct Migration {
    version: i64,
    description: &'static str,
    statements: &'static [&'static str],
}

const VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_version (
    version BIGINT PRIMARY KEY,
    applied_at BIGINT NOT NULL,
    description TEXT NOT NULL
)";

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "runs and steps",
        statements: &[
            // `batch`, `item_id` and `item_index` are for batches (one run per input line).
            "CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            flow TEXT NOT NULL,
            flow_hash TEXT NOT NULL,
            parent_run TEXT,
            parent_step TEXT,
            depth BIGINT NOT NULL,
            status TEXT NOT NULL,
            input TEXT NOT NULL,
            output TEXT,
            error TEXT,
            started_at BIGINT NOT NULL,
            finished_at BIGINT,
            input_tokens BIGINT NOT NULL,
            output_tokens BIGINT NOT NULL,
            cost_usd DOUBLE PRECISION NOT NULL,
            steps BIGINT NOT NULL,
            batch TEXT,
            item_id TEXT,
            item_index BIGINT
        )",
            "CREATE INDEX runs_by_status ON runs (status, started_at)",
            "CREATE INDEX runs_by_flow ON runs (flow, started_at)",
            "CREATE INDEX runs_by_parent ON runs (parent_run)",
            "CREATE INDEX runs_by_batch ON runs (batch, item_index)",
            // `iteration` is -1 for records that are not an iteration (a key column cannot be
            // NULL); `seq` is the record order, store-wide, kept when a record is replaced. Rows
            // are found by run through the primary key; `seq` grows at one end of its index, so a
            // group commit dirties few of its pages.
            "CREATE TABLE steps (
            run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            number TEXT NOT NULL,
            attempt BIGINT NOT NULL,
            iteration BIGINT NOT NULL,
            seq BIGINT NOT NULL,
            step TEXT NOT NULL,
            kind TEXT NOT NULL,
            status TEXT NOT NULL,
            iterations BIGINT,
            input TEXT,
            result TEXT,
            changes TEXT NOT NULL,
            violations TEXT NOT NULL,
            error TEXT,
            started_at BIGINT NOT NULL,
            finished_at BIGINT,
            input_tokens BIGINT NOT NULL,
            output_tokens BIGINT NOT NULL,
            cost_usd DOUBLE PRECISION NOT NULL,
            child_run TEXT,
            route TEXT,
            PRIMARY KEY (run_id, number, attempt, iteration)
        )",
            "CREATE INDEX steps_by_seq ON steps (seq)",
        ],
    },
    Migration {
        version: 2,
        description: "run context, conversation and flow file, for resume",
        statements: &[
            "ALTER TABLE runs ADD COLUMN context TEXT",
            "ALTER TABLE runs ADD COLUMN flow_path TEXT",
            "ALTER TABLE runs ADD COLUMN messages TEXT",
        ],
    },
    Migration {
        version: 3,
        description: "the answers an llm call needed repairs for",
        statements: &["ALTER TABLE steps ADD COLUMN answers TEXT"],
    },
    Migration {
        version: 4,
        description: "runs indexed by parent only when they have one",
        // Top-level runs (every batch item) have no parent: a full index held an entry per run
        // that no query reads. `parent_run = $1` implies `IS NOT NULL`, so both databases still
        // find a run's children through it.
        statements: &[
            "DROP INDEX runs_by_parent",
            "CREATE INDEX runs_by_parent ON runs (parent_run) WHERE parent_run IS NOT NULL",
        ],
    },
    Migration {
        version: 5,
        description: "the run tree's `now`, for resume",
        // Unix microseconds. Runs recorded before have none; a resume takes their start.
        statements: &["ALTER TABLE runs ADD COLUMN now_us BIGINT"],
    },
    Migration {
        version: 6,
        description: "submitted batches: queued runs, leases, workers, flow bundles, shared provider limits",
        statements: &[
            // A submitted run (SPEC §12) has a lease epoch: 0 while queued, raised by every
            // claim; runs of `run` and local batches have none. `lease_until` is Unix
            // milliseconds on the database's clock; `recoveries` counts takeovers from workers
            // whose lease ran out.
            "ALTER TABLE runs ADD COLUMN lease_epoch BIGINT",
            "ALTER TABLE runs ADD COLUMN lease_owner TEXT",
            "ALTER TABLE runs ADD COLUMN lease_until BIGINT",
            "ALTER TABLE runs ADD COLUMN recoveries BIGINT",
            // What a claim scans: the submitted runs not finished, in batch and input order.
            "CREATE INDEX runs_claim ON runs (batch, item_index) \
             WHERE lease_epoch IS NOT NULL AND status IN ('queued', 'running')",
            // A flow with every file it reads, by content hash: what workers run.
            "CREATE TABLE bundles (
            hash TEXT PRIMARY KEY,
            format BIGINT NOT NULL,
            top TEXT NOT NULL,
            files TEXT NOT NULL,
            created_at BIGINT NOT NULL
        )",
            // One row per submitted batch. `items` is the input's line count; `complete` is 1
            // once every line has its run.
            "CREATE TABLE batches (
            name TEXT PRIMARY KEY,
            bundle TEXT NOT NULL REFERENCES bundles (hash),
            flow TEXT NOT NULL,
            flow_hash TEXT NOT NULL,
            input TEXT NOT NULL,
            id_field TEXT NOT NULL,
            context TEXT NOT NULL,
            max_recoveries BIGINT NOT NULL,
            items BIGINT NOT NULL,
            complete BIGINT NOT NULL,
            submitted_at BIGINT NOT NULL
        )",
            // Workers registered with the store; `heartbeat_at` on the database's clock.
            "CREATE TABLE workers (
            id TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            pid BIGINT NOT NULL,
            batch TEXT,
            concurrency BIGINT NOT NULL,
            lease_ms BIGINT NOT NULL,
            started_at BIGINT NOT NULL,
            heartbeat_at BIGINT NOT NULL,
            stopped_at BIGINT
        )",
            // Provider limits held across workers: the pacing of each rate limit (the time
            // its next unit is due, database clock, microseconds) and the slots of each
            // `max_concurrency`, leased to a worker.
            "CREATE TABLE provider_pace (
            key TEXT PRIMARY KEY,
            due_us BIGINT NOT NULL
        )",
            "CREATE TABLE provider_slots (
            key TEXT NOT NULL,
            slot BIGINT NOT NULL,
            worker TEXT,
            until_ms BIGINT,
            PRIMARY KEY (key, slot)
        )",
        ],
    },
    Migration {
        version: 7,
        description: "the process that advances each run of `run` or `resume`",
        statements: &[
            // One writer per run (SPEC §7.3). `token` is the holder's, new for each take;
            // `started` the holder process's start (to tell a reused pid); `until_ms` its lease
            // on the database's clock. A row outlives a crashed holder, and is taken over once
            // its lease lapses or its process is found gone.
            "CREATE TABLE run_writers (
            run_id TEXT PRIMARY KEY,
            token TEXT NOT NULL,
            host TEXT NOT NULL,
            pid BIGINT NOT NULL,
            started BIGINT,
            since BIGINT NOT NULL,
            until_ms BIGINT NOT NULL
        )",
        ],
    },
    Migration {
        version: 8,
        description: "calls of unknown cost; a submitted batch's cost cap",
        statements: &[
            // Model calls whose response reported no usage (SPEC §6.1); NULL on records
            // written before, which had none counted.
            "ALTER TABLE runs ADD COLUMN cost_unknown_calls BIGINT",
            "ALTER TABLE steps ADD COLUMN cost_unknown_calls BIGINT",
            // `submit --max-cost-usd`: what the batch may spend, checked by workers.
            "ALTER TABLE batches ADD COLUMN max_cost_usd DOUBLE PRECISION",
            // What each worker's own model calls of a batch have cost (replays of another
            // worker's calls not counted again), as it last told: the batch's spend is
            // their sum.
            "CREATE TABLE batch_spend (
            batch TEXT NOT NULL,
            worker TEXT NOT NULL,
            cost_usd DOUBLE PRECISION NOT NULL,
            cost_unknown_calls BIGINT NOT NULL,
            PRIMARY KEY (batch, worker)
        )",
        ],
    },
    Migration {
        version: 9,
        description: "the agent changes a run started with, for resume",
        // The canonical JSON of the run's `--agent-change` file (SPEC §8.4); NULL: none, as
        // on every run recorded before.
        statements: &["ALTER TABLE runs ADD COLUMN agent_changes TEXT"],
    },
    Migration {
        version: 10,
        description: "what started each run (a command, an MCP client, the library)",
        // `cli`, `mcp` or `api`; NULL on every run recorded before, whose origin is unknown.
        statements: &["ALTER TABLE runs ADD COLUMN origin TEXT"],
    },
    Migration {
        version: 11,
        description: "files: bytes by content hash, and the files each run and step made",
        // SPEC §6.5. A file's bytes are split in chunks (`crate::files::CHUNK`), so that no
        // statement holds a whole large file; `files` gets its row in the transaction that
        // writes the last chunk, so a file with a row is whole. `BYTEA` is `BLOB` on SQLite
        // (see `run_migrations`). `runs.files` and `steps.files`: JSON lists of
        // `{number, file, name, media_type, size}`, NULL when none.
        statements: &[
            "CREATE TABLE files (
            hash TEXT PRIMARY KEY,
            size BIGINT NOT NULL,
            chunks BIGINT NOT NULL,
            created_at BIGINT NOT NULL
        )",
            "CREATE TABLE file_chunks (
            hash TEXT NOT NULL,
            seq BIGINT NOT NULL,
            data BYTEA NOT NULL,
            PRIMARY KEY (hash, seq)
        )",
            "ALTER TABLE runs ADD COLUMN files TEXT",
            "ALTER TABLE steps ADD COLUMN files TEXT",
        ],
    },
    Migration {
        version: 12,
        description: "the inbox: the questions runs wait at, and the decisions that answer them",
        // SPEC §15. A question's shape (flow, step, kind, decision schema) is kept once, in
        // `inbox_shapes`; each waiting part is a row of `inbox` (`iteration` -1 when none,
        // `calls` JSON or NULL); `decisions` is append-only; `inbox_bulk` keeps each bulk
        // preview's items until it is applied.
        statements: &[
            "CREATE TABLE inbox_shapes (
            shape TEXT PRIMARY KEY,
            flow TEXT NOT NULL,
            step TEXT NOT NULL,
            kind TEXT NOT NULL,
            schema TEXT NOT NULL
        )",
            "CREATE TABLE inbox (
            id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL,
            root_run TEXT NOT NULL,
            number TEXT NOT NULL,
            iteration BIGINT NOT NULL,
            shape TEXT NOT NULL,
            batch TEXT,
            item TEXT,
            question TEXT NOT NULL,
            calls TEXT,
            created_at BIGINT NOT NULL,
            expires_at BIGINT,
            state TEXT NOT NULL,
            settled_at BIGINT
        )",
            "CREATE INDEX inbox_by_state ON inbox (state, created_at)",
            "CREATE INDEX inbox_by_expiry ON inbox (state, expires_at)",
            "CREATE INDEX inbox_by_run ON inbox (run_id)",
            "CREATE INDEX inbox_by_root ON inbox (root_run)",
            "CREATE TABLE decisions (
            id TEXT PRIMARY KEY,
            item_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            root_run TEXT NOT NULL,
            actor TEXT NOT NULL,
            via TEXT NOT NULL,
            decision TEXT NOT NULL,
            reason TEXT,
            edited TEXT,
            bulk_id TEXT,
            at BIGINT NOT NULL
        )",
            "CREATE INDEX decisions_by_item ON decisions (item_id)",
            "CREATE INDEX decisions_by_at ON decisions (at, id)",
            "CREATE INDEX decisions_by_root ON decisions (root_run, at)",
            "CREATE TABLE inbox_bulk (
            token TEXT PRIMARY KEY,
            filter TEXT NOT NULL,
            decision TEXT,
            items TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            applied_at BIGINT,
            bulk_id TEXT
        )",
        ],
    },
    Migration {
        version: 13,
        description: "what the runs of a batch share kept once; steps keyed by run, ordered per run",
        // What every run of a batch repeats (its flow, the flow's hash and file, the batch,
        // what started it) is one row of `run_heads`; `runs.head` names it. A head's id is
        // derived from its content (`rows::RunHead`) and the writer checks that a stored head
        // matches what it names; heads moved here from older runs are numbered from 1, below
        // every derived id. `run_records` reads a run as one row, as `runs` did.
        //
        // `steps` is keyed by its primary key alone (no second copy of the key; `WITHOUT
        // ROWID` on SQLite), and `seq` orders the records of one run, read from the run's own
        // rows; store-wide `seq`s carried over keep their order within each run. Empty
        // `changes` and `violations` are NULL.
        //
        // Indexes: a run's batch, or its flow, is found through its head (`runs_by_head`);
        // `runs_running` holds only the runs still running (what a resume looks for); lists
        // by other statuses read the runs.
        statements: &[
            "CREATE TABLE run_heads (
            id BIGINT PRIMARY KEY NOT NULL,
            flow TEXT NOT NULL,
            flow_hash TEXT NOT NULL,
            flow_path TEXT,
            batch TEXT,
            origin TEXT
        )",
            "INSERT INTO run_heads (id, flow, flow_hash, flow_path, batch, origin)
            SELECT ROW_NUMBER() OVER (ORDER BY flow, flow_hash, flow_path, batch, origin),
            flow, flow_hash, flow_path, batch, origin
            FROM (SELECT DISTINCT flow, flow_hash, flow_path, batch, origin FROM runs) d",
            "ALTER TABLE runs ADD COLUMN head BIGINT",
            "UPDATE runs SET head = (SELECT h.id FROM run_heads h WHERE h.flow = runs.flow
            AND h.flow_hash = runs.flow_hash AND h.flow_path IS NOT DISTINCT FROM runs.flow_path
            AND h.batch IS NOT DISTINCT FROM runs.batch AND h.origin IS NOT DISTINCT FROM runs.origin)",
            "DROP INDEX runs_by_status",
            "DROP INDEX runs_by_flow",
            "DROP INDEX runs_by_batch",
            "DROP INDEX runs_claim",
            "ALTER TABLE runs DROP COLUMN flow",
            "ALTER TABLE runs DROP COLUMN flow_hash",
            "ALTER TABLE runs DROP COLUMN flow_path",
            "ALTER TABLE runs DROP COLUMN batch",
            "ALTER TABLE runs DROP COLUMN origin",
            "CREATE INDEX runs_by_head ON runs (head, item_index)",
            "CREATE INDEX runs_running ON runs (started_at) WHERE status = 'running'",
            "CREATE INDEX runs_claim ON runs (head, item_index) \
             WHERE lease_epoch IS NOT NULL AND status IN ('queued', 'running')",
            "CREATE VIEW run_records AS SELECT r.id, h.flow, h.flow_hash, r.parent_run, r.parent_step,
            r.depth, r.status, r.input, r.output, r.error, r.started_at, r.finished_at,
            r.input_tokens, r.output_tokens, r.cost_usd, r.steps, h.batch, r.item_id, r.item_index,
            r.context, h.flow_path, r.messages, r.now_us, r.lease_epoch, r.lease_owner,
            r.lease_until, r.recoveries, r.cost_unknown_calls, r.agent_changes, h.origin, r.files,
            r.head
            FROM runs r JOIN run_heads h ON h.id = r.head",
            "CREATE TABLE steps_13 (
            run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            number TEXT NOT NULL,
            attempt BIGINT NOT NULL,
            iteration BIGINT NOT NULL,
            seq BIGINT NOT NULL,
            step TEXT NOT NULL,
            kind TEXT NOT NULL,
            status TEXT NOT NULL,
            iterations BIGINT,
            input TEXT,
            result TEXT,
            changes TEXT,
            violations TEXT,
            error TEXT,
            started_at BIGINT NOT NULL,
            finished_at BIGINT,
            input_tokens BIGINT NOT NULL,
            output_tokens BIGINT NOT NULL,
            cost_usd DOUBLE PRECISION NOT NULL,
            child_run TEXT,
            route TEXT,
            answers TEXT,
            cost_unknown_calls BIGINT,
            files TEXT,
            PRIMARY KEY (run_id, number, attempt, iteration)
        ) WITHOUT ROWID",
            "INSERT INTO steps_13 SELECT run_id, number, attempt, iteration, seq, step, kind, status,
            iterations, input, result, CASE WHEN changes = '[]' THEN NULL ELSE changes END,
            CASE WHEN violations = '[]' THEN NULL ELSE violations END, error, started_at,
            finished_at, input_tokens, output_tokens, cost_usd, child_run, route, answers,
            cost_unknown_calls, files FROM steps",
            "DROP TABLE steps",
            "ALTER TABLE steps_13 RENAME TO steps",
        ],
    },
];

/// The store's schema version: 0 for an empty store. Reads only.
pub(crate) async fn version(conn: &mut AnyConnection, dialect: Dialect) -> Result<i64, sqlx::Error> {
    let tables: i64 = sqlx::query_scalar(dialect.table_exists())
        .bind("schema_version")
        .fetch_one(&mut *conn)
        .await?;
    if tables == 0 {
        return Ok(0);
    }
    sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM schema_version")
        .fetch_one(&mut *conn)
        .await
}

/// Fails with [`StoreError::NewerSchema`] when the store was written by a newer switchyard.
pub(crate) fn check_not_newer(found: i64, store: &str) -> Result<(), StoreError> {
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            store: store.to_string(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(())
}

/// Brings the store up to [`SCHEMA_VERSION`] in one transaction, re-reading the version under
/// the write lock (another process may have migrated meanwhile).
pub(crate) async fn migrate(conn: &mut AnyConnection, ctx: &Ctx) -> Result<(), StoreError> {
    const WHAT: &str = "upgrading the schema";
    let err = |e: sqlx::Error| ctx.error(WHAT, &e);
    let mut tx = conn.begin_with(ctx.dialect.begin_write()).await.map_err(err)?;
    if let Some(lock) = ctx.dialect.migration_lock() {
        sqlx::query(lock).execute(&mut *tx).await.map_err(err)?;
    }
    let found = version(tx.acquire().await.map_err(err)?, ctx.dialect)
        .await
        .map_err(err)?;
    check_not_newer(found, &ctx.store)?;
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    sqlx::query(VERSION_TABLE).execute(&mut *tx).await.map_err(err)?;
    for m in MIGRATIONS.iter().filter(|m| m.version > found) {
        tracing::info!(
            store = &*ctx.store,
            version = m.version,
            "migrating the store: {}",
            m.description
        );
        for statement in m.statements {
            // The one type the two databases spell differently; PostgreSQL tables have no
            // rowid to leave out.
            let statement = match ctx.dialect {
                Dialect::Sqlite => statement.replace("BYTEA", "BLOB"),
                Dialect::Postgres => statement.replace(") WITHOUT ROWID", ")"),
            };
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .execute(&mut *tx)
                .await
                .map_err(err)?;
        }
        let applied_at = i64::try_from(now_ms()).unwrap_or(i64::MAX);
        sqlx::query("INSERT INTO schema_version (version, applied_at, description) VALUES ($1, $2, $3)")
            .bind(m.version)
            .bind(applied_at)
            .bind(m.description)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
    }
    tx.commit().await.map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_in_order_and_end_at_the_version() {
        let versions: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
        let expected: Vec<i64> = (1..=SCHEMA_VERSION).collect();
        assert_eq!(versions, expected);
    }

    #[test]
    fn newer_schema_names_both_versions() {
        let err = check_not_newer(SCHEMA_VERSION + 1, "/x/runs.db").expect_err("newer");
        assert_eq!(
            err.to_string(),
            format!(
                "the store at /x/runs.db was written by a newer switchyard (schema {}; this one knows up to {SCHEMA_VERSION})",
                SCHEMA_VERSION + 1
            )
        );
        assert!(check_not_newer(1, "s").is_ok() && check_not_newer(0, "s").is_ok());
    }
}
