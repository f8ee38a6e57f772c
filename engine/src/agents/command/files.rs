//! A command's files (SPEC §6.5): each attempt gets two fresh directories under the system
//! temp directory, `$SWITCHYARD_OUTPUT_DIR` (empty when the program starts) and
//! `$SWITCHYARD_INPUT_DIR` (the files of its input document); both are removed when the
//! attempt ends, however it ends (a guard removes them when the call is dropped, and
//! [`remove_live_dirs`] before an `exit`). Those a switchyard killed between its program's exit
//! and their removal left behind are removed by the next process's first call ([`sweep_dead`]).
//!
//! After a program that exited successfully, every regular file under the output directory
//! (recursively; symlinks are neither followed nor taken) is stored through the call's
//! [`FileSink`](crate::files::FileSink), named by its path relative to the directory with `/`,
//! in name order, and its reference goes into the result's `files`. This module knows nothing of
//! processes: `command.rs` runs the program between [`Dirs::create`] and
//! [`Dirs::take_outputs`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value, json};

use crate::files::FileSink;
use crate::files::names::Unique;
use crate::record::files::{FileRef, refs_in};
use crate::record::{ErrorKind, StepError};

/// The directories of the calls in flight, for [`remove_live_dirs`].
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes the directories of every call still in flight: for a process about to `exit`,
/// which skips destructors (a second Ctrl-C). Their programs are killed with the process.
pub fn remove_live_dirs() {
    let dirs = std::mem::take(&mut *live());
    for d in dirs {
        remove_tree(&d);
    }
}

/// The directories of one attempt, removed when dropped.
pub(super) struct Dirs {
    input: PathBuf,
    output: PathBuf,
    /// Whether they are still ours to remove.
    armed: bool,
}

impl Dirs {
    /// Two fresh directories (mode 0700) side by side under the system temp directory,
    /// `switchyard-command-PID-N-SALT-in` and `-out`, distinct from every other call's in this
    /// process and in others. Two, not one holding both: on some file systems every directory
    /// removed costs a journal commit, and two are removed at once.
    pub fn create() -> Result<Self, StepError> {
        use std::os::unix::fs::DirBuilderExt;
        static N: AtomicU64 = AtomicU64::new(0);
        static SWEPT: std::sync::Once = std::sync::Once::new();
        let base = std::env::temp_dir();
        SWEPT.call_once(|| sweep_dead(&base));
        let mut builder = std::fs::DirBuilder::new();
        builder.mode(0o700);
        let mut tries = 0;
        loop {
            let n = N.fetch_add(1, Ordering::Relaxed);
            // Against directories left by an earlier process with this pid.
            let salt = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .subsec_nanos();
            let stem = format!("switchyard-command-{}-{n}-{salt:08x}", std::process::id());
            let output = base.join(format!("{stem}-out"));
            let input = base.join(format!("{stem}-in"));
            let made = builder.create(&output).and_then(|()| {
                live().push(output.clone());
                builder.create(&input).inspect_err(|_| {
                    let _ = std::fs::remove_dir(&output);
                    forget(&output);
                })
            });
            match made {
                Ok(()) => {
                    live().push(input.clone());
                    return Ok(Dirs {
                        input,
                        output,
                        armed: true,
                    });
                }
                // Left by a process that had this pid: other names.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 16 => tries += 1,
                Err(e) => return Err(dir_error(&base, &e)),
            }
        }
    }

    /// Removes the directories now, both at once, off the async threads; dropping them
    /// removes them too.
    pub async fn remove(mut self) {
        self.armed = false;
        let gone = |d: PathBuf| {
            tokio::task::spawn_blocking(move || {
                remove_tree(&d);
                forget(&d);
            })
        };
        let (a, b) = (gone(self.input.clone()), gone(self.output.clone()));
        let _ = tokio::join!(a, b);
    }

    /// `$SWITCHYARD_INPUT_DIR`.
    pub fn input(&self) -> &Path {
        &self.input
    }

    /// `$SWITCHYARD_OUTPUT_DIR`.
    pub fn output(&self) -> &Path {
        &self.output
    }

    /// Writes every file of `input` (each [`FileRef`] in it, in document order) under the input
    /// directory,
    /// its name made safe and distinct ([`Unique`]); the same bytes under the same name are
    /// written once. Returns the document the program reads, each reference rewritten to
    /// `{path, name, media_type, size}` with `path` absolute, or `None` when `input` holds no
    /// file. The bytes are checked against their hash as they are written; a file missing
    /// from the store fails the call with kind `agent`, naming its hash and its name.
    pub async fn write_inputs(&self, input: &Value, sink: &FileSink) -> Result<Option<Value>, StepError> {
        let mut refs = Vec::new();
        refs_in(input, &mut refs);
        if refs.is_empty() {
            return Ok(None);
        }
        let mut names = Unique::new();
        let mut written: HashMap<(String, String), Value> = HashMap::new();
        for r in refs {
            let key = (r.file.clone(), r.name.clone());
            if written.contains_key(&key) {
                continue;
            }
            let path = self.input.join(names.path_for(&r.name));
            let size = write_input(&r, &path, sink).await?;
            let mut m = Map::with_capacity(4);
            m.insert("path".into(), Value::String(path.to_string_lossy().into_owned()));
            m.insert("name".into(), Value::String(r.name));
            m.insert("media_type".into(), Value::String(r.media_type));
            m.insert("size".into(), Value::from(size));
            written.insert(key, Value::Object(m));
        }
        let mut doc = input.clone();
        rewrite(&mut doc, &written);
        Ok(Some(doc))
    }

    /// Stores the files the program wrote under the output directory and adds their references to `result`
    /// as `files`, in name order. A result without files is returned as it is; with files it
    /// must be a JSON object without a `files` member, else the call fails with kind
    /// `invalid_output` (and nothing is stored).
    pub async fn take_outputs(
        &self,
        program: &str,
        result: Value,
        sink: &FileSink,
    ) -> Result<Value, StepError> {
        let output = self.output.clone();
        let found = tokio::task::spawn_blocking(move || regular_files(&output))
            .await
            .map_err(|e| StepError::new(ErrorKind::Agent, format!("listing the output directory: {e}")))?
            .map_err(|e| {
                StepError::new(
                    ErrorKind::Agent,
                    format!("command `{program}`: cannot list $SWITCHYARD_OUTPUT_DIR: {e}"),
                )
            })?;
        if found.is_empty() {
            return Ok(result);
        }
        let mut result = match result {
            Value::Object(o) => o,
            other => {
                return Err(StepError::new(
                    ErrorKind::InvalidOutput,
                    format!(
                        "command `{program}` wrote {} to $SWITCHYARD_OUTPUT_DIR but printed {}, not a JSON object \
                         (a command with files must print an object: its result gets them as `files`)",
                        count(found.len()),
                        crate::expr::path::type_name(&other)
                    ),
                ));
            }
        };
        if result.contains_key("files") {
            return Err(StepError::new(
                ErrorKind::InvalidOutput,
                format!(
                    "command `{program}` wrote {} to $SWITCHYARD_OUTPUT_DIR and printed an object with a \
                     `files` member of its own: the result's `files` is where the written files go",
                    count(found.len())
                ),
            ));
        }
        let mut refs = Vec::with_capacity(found.len());
        for (name, path) in found {
            refs.push(sink.store_path(&path, name).await?.to_value());
        }
        result.insert("files".into(), Value::Array(refs));
        Ok(Value::Object(result))
    }
}

/// Writes the bytes of `r` to a new file at `path` (its directories made); returns their size.
async fn write_input(r: &FileRef, path: &Path, sink: &FileSink) -> Result<u64, StepError> {
    let missing = || {
        StepError::new(
            ErrorKind::Agent,
            format!("input file `{}` ({}) is not in the store", r.name, r.file),
        )
        .with_details(json!({"file": r.file, "name": r.name}))
    };
    match sink.blobs().size(&r.file).await {
        Ok(Some(_)) => {}
        Ok(None) => return Err(missing()),
        Err(e) => {
            return Err(StepError::new(
                ErrorKind::Agent,
                format!("input file `{}` ({}): {e}", r.name, r.file),
            ));
        }
    }
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await.map_err(|e| {
            StepError::new(
                ErrorKind::Agent,
                format!("cannot write input file `{}`: {}: {e}", r.name, dir.display()),
            )
        })?;
    }
    sink.write_to_path(r, path).await.map_err(|e| StepError {
        message: format!("input file `{}` ({}): {}", r.name, r.file, e.message),
        ..e
    })
}

/// Replaces each reference in `v` (as [`refs_in`] finds them) by what `written` has for it.
fn rewrite(v: &mut Value, written: &HashMap<(String, String), Value>) {
    if v.get("file").is_some()
        && let Some(r) = FileRef::from_value(v)
    {
        if let Some(w) = written.get(&(r.file, r.name)) {
            *v = w.clone();
        }
        return;
    }
    match v {
        Value::Object(o) => {
            for x in o.values_mut() {
                rewrite(x, written);
            }
        }
        Value::Array(a) => {
            for x in a {
                rewrite(x, written);
            }
        }
        _ => {}
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        if self.armed {
            for d in [&self.input, &self.output] {
                remove_tree(d);
                forget(d);
            }
        }
    }
}

/// Removes the directories that processes no longer alive left under `base`
/// (`switchyard-command-PID-…-in`, `-out`): a switchyard killed (`kill -9`) after its
/// program exited and before it removed them, when no supervisor is left to do it. Only
/// directories of this user whose pid names no process are touched.
fn sweep_dead(base: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = left_by(&name.to_string_lossy()) else {
            continue;
        };
        if pid == std::process::id() || process_exists(pid) {
            continue;
        }
        let path = e.path();
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() && m.uid() == uid => remove_tree(&path),
            _ => {}
        }
    }
}

/// The pid in a command directory's name (`switchyard-command-PID-N-SALT-in` or `-out`).
fn left_by(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("switchyard-command-")?;
    let rest = rest.strip_suffix("-in").or_else(|| rest.strip_suffix("-out"))?;
    let mut parts = rest.split('-');
    let pid = parts.next()?.parse::<u32>().ok()?;
    let n = parts.next()?;
    let salt = parts.next()?;
    let well_formed = parts.next().is_none()
        && !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
        && salt.len() == 8
        && salt.bytes().all(|b| b.is_ascii_hexdigit());
    (well_formed && pid > 0).then_some(pid)
}

/// Whether a process with this pid exists (one of another user's counts).
fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// No longer a directory in flight.
fn forget(root: &Path) {
    let mut live = live();
    if let Some(i) = live.iter().position(|d| d == root) {
        live.swap_remove(i);
    }
}

/// Removes `root` and all under it; a directory the program made unwritable or unreadable is
/// opened up first. What cannot be removed is logged, never an error of the call.
fn remove_tree(root: &Path) {
    match std::fs::remove_dir_all(root) {
        Ok(()) => return,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(_) => {}
    }
    open_up(root);
    if let Err(e) = std::fs::remove_dir_all(root)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %root.display(), error = %e, "cannot remove a command's directory");
    }
}

/// Gives the owner full access to every directory under `root` (symlinks not followed).
fn open_up(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                open_up(&entry.path());
            }
        }
    }
}

/// Every regular file under `dir`, recursively, with its name (the path relative to `dir`,
/// `/`-separated), sorted by name. Symlinks are skipped (with a warning), as is anything
/// that is neither a file nor a directory (a FIFO, a socket).
fn regular_files(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    walk(dir, "", &mut out)?;
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, PathBuf)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
        // `file_type` does not follow symlinks.
        let kind = entry.file_type()?;
        if kind.is_file() {
            out.push((name, entry.path()));
        } else if kind.is_dir() {
            walk(&entry.path(), &format!("{name}/"), out)?;
        } else if kind.is_symlink() {
            tracing::warn!(file = %name, "a symlink in $SWITCHYARD_OUTPUT_DIR is not taken");
        } else {
            tracing::warn!(file = %name, "$SWITCHYARD_OUTPUT_DIR holds something that is not a regular file: not taken");
        }
    }
    Ok(())
}

fn dir_error(base: &Path, e: &std::io::Error) -> StepError {
    StepError::new(
        ErrorKind::Agent,
        format!(
            "cannot create the command's directories in {}: {e}",
            base.display()
        ),
    )
}

fn count(n: usize) -> String {
    if n == 1 {
        "1 file".into()
    } else {
        format!("{n} files")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_command_directories_name_their_pid() {
        assert_eq!(left_by("switchyard-command-6532-156-1cea7ea2-in"), Some(6532));
        assert_eq!(left_by("switchyard-command-6532-156-1cea7ea2-out"), Some(6532));
        assert_eq!(left_by("switchyard-command-6532-156-1cea7ea2"), None);
        assert_eq!(left_by("switchyard-command-6532-156-1cea7e-in"), None);
        assert_eq!(left_by("switchyard-command-x-156-1cea7ea2-in"), None);
        assert_eq!(left_by("switchyard-command-0-1-1cea7ea2-in"), None);
        assert_eq!(left_by("switchyard-out-names-6532"), None);
        assert!(process_exists(std::process::id()));
    }
}
