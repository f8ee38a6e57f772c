//! What can be wrong with a SQLite store's file before any record is read: a directory or a
//! file this process may not write, a file that is not a SQLite database. Each is told at
//! once, with the path and the cause, instead of surfacing as a pool that times out.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Whether this process may write `path` (by its effective user, as opening it would).
fn writable(path: &Path) -> std::io::Result<bool> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a path with a NUL byte"))?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call; faccessat reads nothing else.
    let rc = unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EROFS) | Some(libc::EPERM) => Ok(false),
        _ => Err(e),
    }
}

/// Checks that a store at `path` can be written: the file, when it is there, and its
/// directory (SQLite keeps its write-ahead log and its index beside the file, and creates a
/// new store there). The message names what cannot be written.
pub(crate) fn check_writable(path: &Path) -> Result<(), String> {
    let read_only_hint = "`switchyard runs list` and `runs show` can still read it";
    if path.exists() {
        match writable(path) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "the file is read-only for this user (permission denied); {read_only_hint}"
                ));
            }
            Err(e) => return Err(format!("cannot check the file: {e}")),
        }
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match writable(dir) {
        Ok(true) => Ok(()),
        Ok(false) if path.exists() => Err(format!(
            "its directory {} is read-only for this user (SQLite writes its journal beside the store); {read_only_hint}",
            dir.display()
        )),
        Ok(false) => Err(format!(
            "cannot create it: the directory {} is read-only for this user",
            dir.display()
        )),
        Err(e) => Err(format!("cannot check the directory {}: {e}", dir.display())),
    }
}

/// The SQLite result code of a database error, its primary part.
pub(crate) fn primary_code(e: &sqlx::Error) -> Option<i32> {
    let sqlx::Error::Database(db) = e else {
        return None;
    };
    db.code()?.parse::<i32>().ok().map(|c| c & 0xff)
}

/// What a failure to open or first read a SQLite file means, in words.
pub(crate) fn describe(e: &sqlx::Error) -> String {
    let cause = super::error::message(e);
    match primary_code(e) {
        // SQLITE_NOTADB
        Some(26) => {
            format!("the file is not a SQLite database (truncated, or another kind of file) ({cause})")
        }
        // SQLITE_CORRUPT
        Some(11) => format!("the file is damaged ({cause})"),
        // SQLITE_CANTOPEN, SQLITE_PERM, SQLITE_READONLY
        Some(14) | Some(3) | Some(8) => format!("the file cannot be opened ({cause})"),
        _ => cause,
    }
}

/// Whether a read-only open failed because the WAL's index could not be created (a store in a
/// directory this process cannot write), so an immutable open would succeed.
pub(crate) fn needs_immutable(e: &sqlx::Error, path: &Path) -> bool {
    let wal = {
        let mut p = path.as_os_str().to_owned();
        p.push("-wal");
        std::path::PathBuf::from(p)
    };
    // A log with records in it would be left unread by an immutable open: those records are
    // the newest, so rather fail than show a store without them.
    let unread_log = std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0);
    matches!(primary_code(e), Some(8) | Some(14)) && !unread_log
}
