//! Database errors → [`StoreError`]: a full disk and a lock held by someone else get their
//! own variants with a message that names the store and what was being done; everything else
//! keeps the driver's message.

use std::sync::Arc;

use super::Dialect;
use crate::store::StoreError;

/// What every error message needs to know about the store.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    pub dialect: Dialect,
    /// The store as messages name it: a path, or a URL without its password.
    pub store: Arc<str>,
    /// How long a write waits for another's lock before giving up.
    pub busy_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    DiskFull,
    Locked,
    Other,
}

fn classify(dialect: Dialect, e: &sqlx::Error) -> Class {
    match e {
        sqlx::Error::Database(db) => {
            let code = db.code();
            let code = code.as_deref().unwrap_or("");
            match dialect {
                // The extended result code; its low byte is the primary one.
                Dialect::Sqlite => match code.parse::<i32>().map(|c| c & 0xff) {
                    Ok(13) => Class::DiskFull,      // SQLITE_FULL
                    Ok(5) | Ok(6) => Class::Locked, // SQLITE_BUSY, SQLITE_LOCKED
                    _ => Class::Other,
                },
                Dialect::Postgres => match code {
                    "53100" => Class::DiskFull, // disk_full
                    "55P03" => Class::Locked,   // lock_not_available (lock_timeout)
                    _ => Class::Other,
                },
            }
        }
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::StorageFull => Class::DiskFull,
        _ => Class::Other,
    }
}

/// The driver's message; for an error the server returned, only its text (the server's own
/// source position, which some drivers append, means nothing to a user).
pub(crate) fn message(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => format!("the database said: {}", db.message()),
        other => other.to_string(),
    }
}

impl Ctx {
    /// Maps a database error met while doing `what` ("recording step `3` ...").
    pub(crate) fn error(&self, what: &str, e: &sqlx::Error) -> StoreError {
        let store = self.store.to_string();
        match classify(self.dialect, e) {
            Class::DiskFull => StoreError::DiskFull {
                store,
                what: what.to_string(),
            },
            Class::Locked => StoreError::Locked {
                store,
                what: what.to_string(),
                waited_ms: self.busy_ms,
            },
            Class::Other => StoreError::Database {
                store,
                what: what.to_string(),
                message: message(e),
            },
        }
    }

    /// Whether the error is a foreign key violation: a step recorded for a run the store
    /// does not have.
    pub(crate) fn is_missing_run(&self, e: &sqlx::Error) -> bool {
        let sqlx::Error::Database(db) = e else {
            return false;
        };
        let code = db.code();
        match self.dialect {
            Dialect::Sqlite => code.as_deref() == Some("787"), // SQLITE_CONSTRAINT_FOREIGNKEY
            Dialect::Postgres => code.as_deref() == Some("23503"), // foreign_key_violation
        }
    }

    /// Whether the error concerns the whole store (a full disk, a lock, a lost connection)
    /// rather than one record, so retrying records one by one would not help.
    pub(crate) fn is_store_wide(&self, e: &sqlx::Error) -> bool {
        classify(self.dialect, e) != Class::Other || !matches!(e, sqlx::Error::Database(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_storage_full_is_disk_full() {
        let e = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::StorageFull));
        assert_eq!(classify(Dialect::Sqlite, &e), Class::DiskFull);
        let ctx = Ctx {
            dialect: Dialect::Sqlite,
            store: "/d/runs.db".into(),
            busy_ms: 5000,
        };
        let msg = ctx.error("recording run `r1`", &e).to_string();
        assert!(
            msg.starts_with("the disk holding the store /d/runs.db is full while recording run `r1`"),
            "{msg}"
        );
        assert!(ctx.is_store_wide(&e));
        assert!(ctx.is_store_wide(&sqlx::Error::PoolTimedOut));
    }
}
