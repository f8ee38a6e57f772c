//! The few places where SQLite and PostgreSQL differ. Tables, queries and the upserts are
//! the same SQL on both (`$N` parameters, `INSERT ... ON CONFLICT ... DO UPDATE`); what is
//! left is how a write transaction starts, how migrations keep out of each other's way, how a
//! table is looked up, how the many parameters of a group commit's statements are spelled,
//! and — for the distributed work queue of SPEC §12 — how a worker claims a run.

/// The database behind a [`SqlStore`](super::SqlStore).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// Starts a write transaction. SQLite: `BEGIN IMMEDIATE` takes the write lock up front, so
    /// waiting for another writer happens here, under the busy timeout, and never half-way
    /// through a transaction. PostgreSQL: rows are locked as they are written.
    pub(crate) fn begin_write(self) -> &'static str {
        match self {
            Dialect::Sqlite => "BEGIN IMMEDIATE",
            Dialect::Postgres => "BEGIN",
        }
    }

    /// Run first in the migration transaction so that two processes opening a fresh store at
    /// once migrate it one after the other. SQLite needs nothing: `BEGIN IMMEDIATE` already
    /// holds the only write lock. PostgreSQL: a transaction-scoped advisory lock.
    pub(crate) fn migration_lock(self) -> Option<&'static str> {
        match self {
            Dialect::Sqlite => None,
            Dialect::Postgres => Some("SELECT 1 FROM (SELECT pg_advisory_xact_lock(7365420891)) AS l"),
        }
    }

    /// The `n`th (1-based) parameter of a statement whose parameters are bound in the order
    /// they appear. SQLite: an anonymous `?`, because binding `$N` looks each name up in a
    /// list, which makes a statement of many rows quadratic in its parameters. PostgreSQL:
    /// `$N`, its only form.
    pub(crate) fn param(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => "?".to_string(),
            Dialect::Postgres => format!("${n}"),
        }
    }

    /// Counts the tables named `$1` in the store (0 or 1), without touching anything.
    pub(crate) fn table_exists(self) -> &'static str {
        match self {
            Dialect::Sqlite => "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = $1",
            Dialect::Postgres => {
                "SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_name = $1"
            }
        }
    }

    /// The database's clock as Unix milliseconds, an SQL expression: leases, heartbeats and
    /// shared limits are timed by the one clock every worker shares, never by a worker's own.
    pub fn now_ms(self) -> &'static str {
        match self {
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS BIGINT)",
            Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        }
    }

    /// [`Dialect::now_ms`] in microseconds.
    pub fn now_us(self) -> &'static str {
        match self {
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS BIGINT)",
            Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)",
        }
    }

    /// The larger of two SQL values (`GREATEST` in PostgreSQL, the two-argument `MAX` in SQLite).
    pub fn greatest(self, a: &str, b: &str) -> String {
        match self {
            Dialect::Sqlite => format!("MAX({a}, {b})"),
            Dialect::Postgres => format!("GREATEST({a}, {b})"),
        }
    }

    /// Appended to the `SELECT` of the runs a fenced write checks (their lease epochs), inside
    /// the write's transaction: PostgreSQL holds them share-locked until the commit, so a
    /// takeover's claim (which locks them for update) comes wholly before or wholly after the
    /// write. SQLite's `BEGIN IMMEDIATE` already holds the only write lock.
    pub fn fence_lock_clause(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR SHARE",
        }
    }

    /// The seam for claiming queued runs (SPEC §12): appended to the `SELECT`
    /// that picks the next runs inside the claiming transaction. PostgreSQL lets many workers
    /// claim at once, each skipping the rows another holds; SQLite has one writer at a time
    /// (the claim's `BEGIN IMMEDIATE` serializes claimers), so it needs no row locks.
    /// What makes a transaction's commit return before its WAL is flushed (PostgreSQL), for
    /// claims: a claim lost in a crash of the database only undoes itself — the run's first
    /// fenced write, which waits for the flush of everything before it, would find the epoch
    /// it was claimed at missing and write nothing — and a claim no longer waits for a disk
    /// flush of its own. `None`: the database has nothing of the kind (SQLite).
    pub fn async_commit(self) -> Option<&'static str> {
        match self {
            Dialect::Sqlite => None,
            Dialect::Postgres => Some("SET LOCAL synchronous_commit TO OFF"),
        }
    }

    pub fn claim_lock_clause(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
        }
    }
}
