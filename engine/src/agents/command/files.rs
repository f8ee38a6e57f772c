//! A command's files (SPEC §6.5): each attempt gets a fresh directory under the system temp
//! directory holding `out/` (`$SWITCHYARD_OUTPUT_DIR`, empty when the program starts) and `in/`
//! (`$SWITCHYARD_INPUT_DIR`, the files of its input document); the whole directory is removed
//! when the attempt ends, however it ends (a guard removes it when the call is dropped).
//!
//! After a program that exited successfully, every regular file under `out/` (recursively;
//! symlinks are neither followed nor taken) is stored through the call's
//! [`FileSink`](crate::files::FileSink), named by its path relative to `out/` with `/`, in name
//! order, and its reference goes into the result's `files`. This module knows nothing of
//! processes: `command.rs` runs the program between [`Dirs::create`] and
//! [`Dirs::take_outputs`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use crate::files::FileSink;
use crate::files::names::Unique;
use crate::record::files::{FileRef, refs_in};
use crate::record::{ErrorKind, StepError};

/// The directories of one attempt, removed when dropped.
pub(super) struct Dirs {
    root: PathBuf,
    input: PathBuf,
    output: PathBuf,
}

impl Dirs {
    /// A fresh directory (mode 0700) under the system temp directory, with `in/` and `out/`
    /// inside, distinct from every other call's in this process and in others.
    pub fn create() -> Result<Self, StepError> {
        use std::os::unix::fs::DirBuilderExt;
        static N: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        let mut builder = std::fs::DirBuilder::new();
        builder.mode(0o700);
        let mut tries = 0;
        let root = loop {
            let n = N.fetch_add(1, Ordering::Relaxed);
            let salt: u32 = rand::random();
            let root = base.join(format!(
                "switchyard-command-{}-{n}-{salt:08x}",
                std::process::id()
            ));
            match builder.create(&root) {
                Ok(()) => break root,
                // A directory left by a process that had this pid: another name.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 16 => tries += 1,
                Err(e) => return Err(dir_error(&root, &e)),
            }
        };
        let dirs = Dirs {
            input: root.join("in"),
            output: root.join("out"),
            root,
        };
        for d in [&dirs.input, &dirs.output] {
            builder.create(d).map_err(|e| dir_error(d, &e))?;
        }
        Ok(dirs)
    }

    /// Removes the directories now, off the async threads; dropping them removes them too.
    pub async fn remove(mut self) {
        let root = std::mem::take(&mut self.root);
        let _ = tokio::task::spawn_blocking(move || remove_tree(&root)).await;
    }

    /// `$SWITCHYARD_INPUT_DIR`.
    pub fn input(&self) -> &Path {
        &self.input
    }

    /// `$SWITCHYARD_OUTPUT_DIR`.
    pub fn output(&self) -> &Path {
        &self.output
    }

    /// Writes every file of `input` (each [`FileRef`] in it, in document order) under `in/`,
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

    /// Stores the files the program wrote under `out/` and adds their references to `result`
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
        if !self.root.as_os_str().is_empty() {
            remove_tree(&self.root);
        }
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

fn dir_error(dir: &Path, e: &std::io::Error) -> StepError {
    StepError::new(
        ErrorKind::Agent,
        format!("cannot create the command's directory {}: {e}", dir.display()),
    )
}

fn count(n: usize) -> String {
    if n == 1 {
        "1 file".into()
    } else {
        format!("{n} files")
    }
}
