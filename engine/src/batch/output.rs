//! The output file: the name a batch is known by in the store (the file's canonical path),
//! its lock (one process per batch; a `resume` or `runs cancel` of one of its runs takes it
//! too), writing it anew on every start, and the line each item is written as.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::BatchError;
use super::options::BatchOptions;
use crate::record::StepError;
use crate::record::cost::Cost;
use crate::record::files::RunFile;
use crate::record::{RunRecord, Usage};
use crate::runtime::engine::RunOutcome;
use crate::store::Store;

/// Holds the lock of a batch's output file while a run of that batch is resumed or cancelled
/// by another command, so that the batch and that command never work on the run at once.
#[derive(Debug)]
pub struct BatchLock {
    _file: Option<std::fs::File>,
}

/// Takes the lock of the batch `run` belongs to (its output file), if it is one's and the file
/// is there; [`BatchError::Busy`] while a `batch` process (or another such command) holds it.
pub fn lock_batch_of(run: &RunRecord) -> Result<BatchLock, BatchError> {
    let Some(path) = run.batch.as_deref() else {
        return Ok(BatchLock { _file: None });
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        // Nothing writes a batch whose output is gone; the run is free to take.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BatchLock { _file: None }),
        Err(e) => {
            return Err(BatchError::Output {
                path: path.to_string(),
                message: e.to_string(),
            });
        }
    };
    match file.try_lock() {
        Ok(()) => Ok(BatchLock { _file: Some(file) }),
        Err(std::fs::TryLockError::WouldBlock) => Err(BatchError::Busy {
            path: path.to_string(),
            holder: crate::store::writers::lock_holder(&file),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(BatchError::Output {
            path: path.to_string(),
            message: e.to_string(),
        }),
    }
}

/// The output file, locked and emptied, written through a buffer. Every start writes it anew
/// from the store, from the first line on, so a torn last line of a killed batch is repaired
/// and an item is never written twice.
pub(super) struct Output {
    out: BufWriter<std::fs::File>,
    /// The file as named, for errors.
    path: String,
}

impl Output {
    /// Opens (or creates) the output file, and its directory, takes its lock and empties it.
    /// One process per batch: the output file is locked while the batch runs, and emptied
    /// only once the lock is held.
    pub(super) fn create(options: &BatchOptions) -> Result<Output, BatchError> {
        let path = options.output.display().to_string();
        let out_err = |e: std::io::Error| BatchError::Output {
            path: path.clone(),
            message: e.to_string(),
        };
        if let Some(dir) = options.output.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(out_err)?;
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&options.output)
            .map_err(out_err)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(BatchError::Busy {
                    path: path.clone(),
                    holder: crate::store::writers::lock_holder(&file),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(out_err(e)),
        }
        file.set_len(0).map_err(out_err)?;
        Ok(Output {
            out: BufWriter::with_capacity(1 << 16, file),
            path,
        })
    }

    /// An error of the output file's.
    pub(super) fn error(&self, message: String) -> BatchError {
        BatchError::Output {
            path: self.path.clone(),
            message,
        }
    }

    /// Writes one item's line.
    pub(super) fn write_line(&mut self, text: &str) -> Result<(), BatchError> {
        self.out
            .write_all(text.as_bytes())
            .map_err(|e| self.error(e.to_string()))?;
        self.out.write_all(b"\n").map_err(|e| self.error(e.to_string()))
    }

    /// Writes out what the buffer holds.
    pub(super) fn flush(&mut self) -> Result<(), BatchError> {
        self.out.flush().map_err(|e| self.error(e.to_string()))
    }

    /// Flushes the file and, with `sync`, syncs it to disk; its lock is let go with it.
    pub(super) fn close(mut self, sync: bool) -> Result<(), BatchError> {
        self.flush()?;
        if sync {
            self.out
                .get_ref()
                .sync_all()
                .map_err(|e| self.error(e.to_string()))?;
        }
        Ok(())
    }
}

/// The name a batch is known by in the store: its output file's canonical path, so that
/// every spelling of one file (through a symlink, with `..`, relative or absolute) is one
/// batch. A batch recorded under its plain absolute path (as batches were named before) keeps
/// that name.
pub(super) async fn batch_name<S: Store>(store: &S, options: &BatchOptions) -> Result<String, BatchError> {
    let canonical = canonical_path(&options.output, 40)
        .map_err(|e| BatchError::Output {
            path: options.output.display().to_string(),
            message: e.to_string(),
        })?
        .display()
        .to_string();
    if options.fresh_store {
        return Ok(canonical);
    }
    if let Ok(plain) = std::path::absolute(&options.output) {
        let plain = plain.display().to_string();
        if plain != canonical
            && store.batch_runs(&canonical, 0, 1).await?.is_empty()
            && !store.batch_runs(&plain, 0, 1).await?.is_empty()
        {
            return Ok(plain);
        }
    }
    Ok(canonical)
}

/// `path` made absolute with every symlink and `..` resolved, whether or not the file (or
/// its directory) exists yet: the part that exists is resolved by the file system, a dangling
/// symlink is followed to where it points (at most `hops` times), and the rest, which holds
/// no symlinks since it does not exist, is resolved by its components.
fn canonical_path(path: &Path, hops: u32) -> std::io::Result<PathBuf> {
    use std::path::Component;
    let path = std::path::absolute(path)?;
    match std::fs::canonicalize(&path) {
        Ok(p) => return Ok(p),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    let parent = path.parent().unwrap_or(Path::new("/"));
    if let Ok(target) = std::fs::read_link(&path) {
        if hops == 0 {
            return Err(std::io::Error::other("too many levels of symbolic links"));
        }
        return canonical_path(&parent.join(target), hops - 1);
    }
    let mut base = canonical_path(parent, hops)?;
    match path.components().next_back() {
        Some(Component::Normal(name)) => base.push(name),
        Some(Component::ParentDir) => {
            base.pop();
        }
        _ => {}
    }
    Ok(base)
}

/// Whether two paths name one existing file (hard and symbolic links included).
pub(super) fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        ma.dev() == mb.dev() && ma.ino() == mb.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (ma, mb);
        std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok()
    }
}

/// The id and the files of an output line (none when it has no `files`).
pub(crate) fn line_files(text: &str) -> (Value, Vec<RunFile>) {
    #[derive(serde::Deserialize)]
    struct Line {
        id: Value,
        #[serde(default)]
        files: Vec<RunFile>,
    }
    match serde_json::from_str::<Line>(text) {
        Ok(l) => (l.id, l.files),
        Err(_) => (Value::Null, Vec::new()),
    }
}

/// The line of an item written from its run's record; `id` is the line's (the record keeps
/// its text).
pub(crate) fn record_line(r: &RunRecord, id: &Value) -> String {
    let ms = r.finished_at.map(|f| f.saturating_sub(r.started_at)).unwrap_or(0);
    item_line(
        id,
        r.status.as_str(),
        r.output.as_ref(),
        r.error.as_ref(),
        Some(&r.id),
        r.usage,
        ms,
        &r.files,
    )
}

pub(super) fn outcome_line(id: &Value, o: &RunOutcome) -> String {
    item_line(
        id,
        o.status.as_str(),
        o.output.as_ref(),
        o.error.as_ref(),
        Some(&o.run_id),
        o.usage,
        o.duration_ms,
        &o.files,
    )
}

/// The line of an item that failed without a run to show.
pub(super) fn failed_line(id: &Value, e: &StepError, ms: u64) -> String {
    item_line(id, "failed", None, Some(e), None, Usage::default(), ms, &[])
}

#[allow(clippy::too_many_arguments)]
fn item_line(
    id: &Value,
    status: &str,
    output: Option<&Value>,
    error: Option<&StepError>,
    run_id: Option<&str>,
    usage: Usage,
    duration_ms: u64,
    files: &[RunFile],
) -> String {
    /// The line, serialized straight from borrowed parts (no intermediate JSON value).
    #[derive(serde::Serialize)]
    struct ItemLine<'a> {
        id: &'a Value,
        status: &'a str,
        output: Option<&'a Value>,
        error: Option<ErrorLine<'a>>,
        run_id: Option<&'a str>,
        cost_usd: Cost,
        /// Calls whose cost is unknown: written only when there are some.
        #[serde(skip_serializing_if = "crate::record::is_zero")]
        cost_unknown_calls: u64,
        duration_ms: u64,
        /// The run's files (SPEC §6.5): written only when it made some.
        #[serde(skip_serializing_if = "<[RunFile]>::is_empty")]
        files: &'a [RunFile],
    }
    /// As [`StepError::to_json`]: `details` is always there.
    #[derive(serde::Serialize)]
    struct ErrorLine<'a> {
        kind: &'a str,
        message: &'a str,
        details: &'a Option<Value>,
    }
    let line = ItemLine {
        id,
        status,
        output,
        error: error.map(|e| ErrorLine {
            kind: e.kind.as_str(),
            message: &e.message,
            details: &e.details,
        }),
        run_id,
        cost_usd: usage.cost_usd,
        cost_unknown_calls: usage.cost_unknown_calls,
        duration_ms,
        files,
    };
    serde_json::to_string(&line).expect("JSON values serialize")
}
