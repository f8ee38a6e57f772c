//! Store URLs: `sqlite:PATH`, `sqlite::memory:`, `postgres://...` (optionally with
//! `?schema=NAME`), parsed into what to connect to and a name to show in messages (the path,
//! or the PostgreSQL URL without its password). It knows nothing of tables or records.

use std::path::PathBuf;
use std::str::FromStr;

use sqlx::any::AnyConnectOptions;

use super::Dialect;
use crate::store::StoreError;

/// Where a store lives.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    /// A SQLite file (absolute path), created with its directory when missing.
    SqliteFile(PathBuf),
    /// A private in-memory SQLite database: one connection, gone when the store is dropped.
    SqliteMemory,
    /// A PostgreSQL database; `url` is what the driver gets (the `schema` option removed),
    /// `shown` the same without its password.
    Postgres {
        url: String,
        shown: String,
        schema: Option<String>,
    },
}

impl Target {
    pub(crate) fn dialect(&self) -> Dialect {
        match self {
            Target::SqliteFile(_) | Target::SqliteMemory => Dialect::Sqlite,
            Target::Postgres { .. } => Dialect::Postgres,
        }
    }

    /// The URL handed to the `any` driver, opening a SQLite file as `access` says.
    pub(crate) fn driver_url(&self, access: Access) -> String {
        match self {
            Target::SqliteFile(path) => {
                let mode = match access {
                    Access::Write => "mode=rwc",
                    Access::Read => "mode=ro",
                    Access::Immutable => "mode=ro&immutable=1",
                };
                format!("sqlite://{}?{mode}", encode_path(path))
            }
            Target::SqliteMemory => "sqlite::memory:".to_string(),
            Target::Postgres { url, .. } => url.clone(),
        }
    }
}

/// How a SQLite file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Read and write, created when missing.
    Write,
    /// Read only; SQLite still needs to create the WAL's index beside the file.
    Read,
    /// Read only, assuming nobody writes the file meanwhile: for a file in a directory this
    /// process cannot write, where the WAL's index cannot be created.
    Immutable,
}

/// A parsed store URL and the name messages use for it.
#[derive(Clone, Debug)]
pub(crate) struct Location {
    pub target: Target,
    pub name: String,
    /// SQLite options given in the URL (`sqlite:PATH?synchronous=normal&busy_timeout_ms=200&max_pages=N`).
    pub sqlite: SqliteParams,
}

/// What a SQLite URL may set of [`super::SqlOptions`].
#[derive(Clone, Debug, Default)]
pub(crate) struct SqliteParams {
    pub synchronous: Option<super::Synchronous>,
    pub busy_timeout_ms: Option<u64>,
    pub max_pages: Option<u64>,
}

/// Parses `k=v&...` of a SQLite URL.
fn sqlite_params(query: &str) -> Result<SqliteParams, String> {
    let mut p = SqliteParams::default();
    for pair in query.split('&').filter(|s| !s.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let number = || {
            v.parse::<u64>()
                .map_err(|_| format!("`{k}` takes a whole number, not `{v}`"))
        };
        match k {
            "synchronous" => {
                p.synchronous = Some(match v {
                    "full" => super::Synchronous::Full,
                    "normal" => super::Synchronous::Normal,
                    _ => return Err(format!("`synchronous` is `full` or `normal`, not `{v}`")),
                })
            }
            "busy_timeout_ms" => p.busy_timeout_ms = Some(number()?),
            "max_pages" => p.max_pages = Some(number()?),
            _ => {
                return Err(format!(
                    "unknown SQLite option `{k}` (options: synchronous=full|normal, busy_timeout_ms=N, max_pages=N)"
                ));
            }
        }
    }
    Ok(p)
}

impl Location {
    /// Puts a PostgreSQL store's tables in `schema`.
    pub(crate) fn set_schema(&mut self, name: &str) -> Result<(), StoreError> {
        let bad = |message: String| StoreError::BadUrl {
            url: self.name.clone(),
            message,
        };
        let Target::Postgres { shown, schema, .. } = &mut self.target else {
            return Err(bad("only PostgreSQL stores have schemas".into()));
        };
        check_schema_name(name).map_err(bad)?;
        *schema = Some(name.to_string());
        self.name = postgres_name(shown, Some(name));
        Ok(())
    }
}

/// `shown` with the schema option, the way users would write it.
fn postgres_name(shown: &str, schema: Option<&str>) -> String {
    match schema {
        None => shown.to_string(),
        Some(s) if shown.contains('?') => format!("{shown}&schema={s}"),
        Some(s) => format!("{shown}?schema={s}"),
    }
}

/// Parses a store URL. Relative SQLite paths are taken from the current directory.
pub(crate) fn parse(url: &str) -> Result<Location, StoreError> {
    let bad = |message: String| StoreError::BadUrl {
        url: redact(url),
        message,
    };
    if let Some(rest) = url.strip_prefix("sqlite:") {
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        if rest == ":memory:" {
            return Ok(Location {
                target: Target::SqliteMemory,
                name: "sqlite::memory:".into(),
                sqlite: SqliteParams::default(),
            });
        }
        let (rest, params) = match rest.split_once('?') {
            Some((path, query)) => (path, sqlite_params(query).map_err(bad)?),
            None => (rest, SqliteParams::default()),
        };
        if rest.is_empty() {
            return Err(bad("the SQLite store URL names no file: use `sqlite:PATH`".into()));
        }
        let path = std::path::absolute(rest).map_err(|e| bad(format!("bad path `{rest}`: {e}")))?;
        let name = path.display().to_string();
        return Ok(Location {
            target: Target::SqliteFile(path),
            name,
            sqlite: params,
        });
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let opts = AnyConnectOptions::from_str(url).map_err(|e| bad(e.to_string()))?;
        let mut parsed = opts.database_url;
        let mut schema = None;
        let mut rest = Vec::new();
        for (k, v) in parsed.query_pairs() {
            if k == "schema" {
                schema = Some(v.into_owned());
            } else {
                rest.push((k.into_owned(), v.into_owned()));
            }
        }
        if let Some(s) = &schema {
            check_schema_name(s).map_err(bad)?;
        }
        parsed.set_query(None);
        if !rest.is_empty() {
            parsed.query_pairs_mut().extend_pairs(rest);
        }
        let driver_url = parsed.to_string();
        let _ = parsed.set_password(None);
        let shown = parsed.to_string();
        let name = postgres_name(&shown, schema.as_deref());
        return Ok(Location {
            target: Target::Postgres {
                url: driver_url,
                shown,
                schema,
            },
            name,
            sqlite: SqliteParams::default(),
        });
    }
    Err(bad(
        "expected `sqlite:PATH`, `sqlite::memory:` or `postgres://...`".into(),
    ))
}

/// A PostgreSQL schema name this store accepts: an unquoted identifier, at most 63 bytes.
pub(crate) fn check_schema_name(s: &str) -> Result<(), String> {
    let mut chars = s.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first_ok && s.len() <= 63 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(format!(
            "bad schema name `{s}`: use letters, digits and `_`, at most 63, not starting with a digit"
        ))
    }
}

/// Whether `url` is a store URL this crate can open (its form only: nothing is opened).
pub fn check_url(url: &str) -> Result<(), StoreError> {
    parse(url).map(|_| ())
}

/// The file of a `sqlite:PATH` store URL (`None` for any other URL, or a bad one).
pub fn sqlite_file(url: &str) -> Option<std::path::PathBuf> {
    match parse(url).ok()?.target {
        Target::SqliteFile(path) => Some(path),
        _ => None,
    }
}

/// The URL with its password (if any) replaced by `***`, for messages.
pub fn redact(url: &str) -> String {
    match AnyConnectOptions::from_str(url) {
        Ok(opts) if opts.database_url.password().is_some() => {
            let mut u = opts.database_url;
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

/// Percent-encodes a path for a `sqlite://` URL (the driver decodes it back).
fn encode_path(path: &std::path::Path) -> String {
    let s = path.to_string_lossy();
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls() {
        let l = parse("sqlite:.switchyard/runs.db").expect("parses");
        let Target::SqliteFile(p) = &l.target else {
            panic!("not a file: {l:?}")
        };
        assert!(p.is_absolute() && p.ends_with(".switchyard/runs.db"));
        assert!(matches!(
            parse("sqlite::memory:").expect("parses").target,
            Target::SqliteMemory
        ));
        assert!(matches!(
            parse("sqlite:///tmp/a b#?.db"),
            Err(StoreError::BadUrl { .. })
        ));
        let l = parse("sqlite:///tmp/a b%#.db").expect("parses");
        assert_eq!(l.name, "/tmp/a b%#.db");
        assert_eq!(
            l.target.driver_url(Access::Write),
            "sqlite:///tmp/a%20b%25%23.db?mode=rwc"
        );
        assert!(parse("sqlite:").is_err());
        assert!(parse("mysql://x").is_err());
        let l = parse("sqlite:runs.db?synchronous=normal&busy_timeout_ms=250&max_pages=64").expect("parses");
        assert!(l.name.ends_with("/runs.db"), "{}", l.name);
        assert_eq!(l.sqlite.synchronous, Some(crate::store::sql::Synchronous::Normal));
        assert_eq!(
            (l.sqlite.busy_timeout_ms, l.sqlite.max_pages),
            (Some(250), Some(64))
        );
        let err = parse("sqlite:runs.db?fast=1")
            .expect_err("unknown option")
            .to_string();
        assert!(err.contains("unknown SQLite option `fast`"), "{err}");
        let err = parse("sqlite:runs.db?max_pages=lots")
            .expect_err("not a number")
            .to_string();
        assert!(
            err.contains("`max_pages` takes a whole number, not `lots`"),
            "{err}"
        );
    }

    #[test]
    fn postgres_urls() {
        let l = parse("postgres://u:secret@127.0.0.1:5432/test?schema=sy_1&sslmode=disable").expect("parses");
        let Target::Postgres { url, schema, .. } = &l.target else {
            panic!("not postgres")
        };
        assert_eq!(schema.as_deref(), Some("sy_1"));
        assert_eq!(url, "postgres://u:secret@127.0.0.1:5432/test?sslmode=disable");
        assert_eq!(
            l.name,
            "postgres://u@127.0.0.1:5432/test?sslmode=disable&schema=sy_1"
        );
        let mut l = parse("postgres://u@h/db").expect("parses");
        l.set_schema("other").expect("a schema");
        assert_eq!(l.name, "postgres://u@h/db?schema=other");
        assert!(parse("sqlite::memory:").expect("parses").set_schema("x").is_err());
        assert!(parse("postgres://u@h/db?schema=a;drop").is_err());
        let err = parse("postgres://u:pw@h/db?schema=1x").expect_err("bad schema");
        assert!(!err.to_string().contains("pw"), "{err}");
    }
}
