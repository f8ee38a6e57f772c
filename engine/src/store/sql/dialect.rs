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

    /// The seam for claiming queued runs (SPEC §12, a later issue): appended to the `SELECT`
    /// that picks the next runs inside the claiming transaction. PostgreSQL lets many workers
    /// claim at once, each skipping the rows another holds; SQLite has one writer at a time
    /// (the claim's `BEGIN IMMEDIATE` serializes claimers), so it needs no row locks.
    pub fn claim_lock_clause(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
        }
    }
}
