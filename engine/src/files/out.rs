//! Writing stored files out under a directory (`runs files --output`, `batch --files`,
//! `collect --files`): each file under its name made safe and unique ([`super::names`]),
//! streamed from the store chunk by chunk into a temporary file beside it, checked against its
//! hash, then renamed into place. Nothing is written outside the directory (no `..`, no
//! absolute path, no symlink followed out of it), and writing the same files again is
//! idempotent: a file already there with the right bytes is left as it is.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::Digest;

use super::names::{Unique, safe_segment};
use crate::record::files::RunFile;
use crate::store::blobs::{Blobs, hex};

/// The prefix of the temporary files bytes are streamed into before they are renamed into
/// place; left over only by a process that was killed, and removed by the next write there.
pub const PARTIAL_PREFIX: &str = ".switchyard-partial-";

/// Why a file could not be written out.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot write {path}: {message}")]
    Io { path: String, message: String },
    #[error("file `{name}` ({hash}): {message}")]
    Store {
        name: String,
        hash: String,
        message: String,
    },
}

/// A file written out (or found there already with the same bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// Its path relative to the directory written to, `/`-separated.
    pub path: String,
    /// The bytes were written now (false: the file was there already, the same bytes).
    pub wrote: bool,
}

/// Writes `files` under `dir` (created if missing), in order, each under a safe name unique
/// in `dir` (the same files in the same order get the same names every time). Stops at the
/// first file that cannot be written: its partial bytes are removed, the files before it stay.
pub async fn write_files(
    blobs: &dyn Blobs,
    files: &[RunFile],
    dir: &Path,
) -> Result<Vec<Written>, WriteError> {
    let mut out = Vec::with_capacity(files.len());
    write_files_into(blobs, files, dir, &mut out).await?;
    Ok(out)
}

/// [`write_files`], pushing each file onto `out` as it is written: when it stops at a file
/// that cannot be written, `out` holds those before it (what was written, and where).
pub async fn write_files_into(
    blobs: &dyn Blobs,
    files: &[RunFile],
    dir: &Path,
    out: &mut Vec<Written>,
) -> Result<(), WriteError> {
    make_dir(dir)?;
    let mut names = Unique::new();
    let mut swept = HashSet::new();
    for f in files {
        let rel = names.path_for(&f.file.name);
        let target = dir.join(&rel);
        let parent = target.parent().unwrap_or(dir).to_path_buf();
        make_dirs(dir, &rel)?;
        if swept.insert(parent.clone()) {
            sweep_partials(&parent);
        }
        let wrote = if same_bytes(&target, f.file.size, f.file.hex()) {
            false
        } else {
            write_one(blobs, f, &parent, &target).await?;
            true
        };
        out.push(Written { path: rel, wrote });
    }
    Ok(())
}

/// Makes sure `dir` is a directory files can be written under, creating it (and its parents)
/// if missing: a path that is not a directory, or a directory that cannot be written to, is an
/// error before anything is run (`batch --files`, `collect --files`, `runs files --output`).
pub fn prepare_dir(dir: &Path) -> Result<(), WriteError> {
    make_dir(dir)?;
    // Written to as the files will be: a temporary file made and removed.
    let probe = dir.join(format!("{PARTIAL_PREFIX}{}-probe", std::process::id()));
    let _ = std::fs::remove_file(&probe);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| WriteError::Io {
            path: dir.display().to_string(),
            message: format!("cannot write in it: {e}"),
        })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// `dir`, created with its parents if missing; a path that is there and is not a directory
/// is an error that says so.
fn make_dir(dir: &Path) -> Result<(), WriteError> {
    let err = |message: String| WriteError::Io {
        path: dir.display().to_string(),
        message,
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(err("it is there and is not a directory".into())),
        Err(_) => std::fs::create_dir_all(dir).map_err(|e| err(e.to_string())),
    }
}

/// Creates the directories of `rel` under `dir`, refusing to go through a symlink or a file.
fn make_dirs(dir: &Path, rel: &str) -> Result<(), WriteError> {
    let segments: Vec<&str> = rel.split('/').collect();
    let mut at = dir.to_path_buf();
    for seg in &segments[..segments.len().saturating_sub(1)] {
        at.push(seg);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(WriteError::Io {
                    path: at.display().to_string(),
                    message: "it is in the way of a directory (a file or a symlink): not written through"
                        .into(),
                });
            }
            Err(_) => std::fs::create_dir(&at).map_err(|e| WriteError::Io {
                path: at.display().to_string(),
                message: e.to_string(),
            })?,
        }
    }
    let target = dir.join(rel);
    if let Ok(m) = std::fs::symlink_metadata(&target)
        && !m.is_file()
    {
        return Err(WriteError::Io {
            path: target.display().to_string(),
            message: "it is not a regular file (a directory or a symlink): not written over".into(),
        });
    }
    Ok(())
}

/// Removes the temporary files a killed writer left in `dir`.
fn sweep_partials(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(PARTIAL_PREFIX) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Whether `path` is a regular file of `size` bytes hashing to `hex`.
fn same_bytes(path: &Path, size: u64, hex_digest: &str) -> bool {
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return false;
    };
    if !m.is_file() || m.len() != size {
        return false;
    }
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; super::CHUNK];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(_) => return false,
        }
    }
    hex(&hasher.finalize()) == hex_digest
}

/// Streams `f`'s bytes into a temporary file in `parent`, checked against the hash, and
/// renames it to `target`; on any failure the temporary file is removed.
async fn write_one(blobs: &dyn Blobs, f: &RunFile, parent: &Path, target: &Path) -> Result<(), WriteError> {
    static N: AtomicU64 = AtomicU64::new(0);
    let tmp = Partial(parent.join(format!(
        "{PARTIAL_PREFIX}{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )));
    let io = |path: &Path, e: std::io::Error| WriteError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp.0)
        .map_err(|e| io(target, e))?;
    let mut w = std::io::BufWriter::with_capacity(super::CHUNK, file);
    blobs
        .read_to(&f.file.file, &mut w)
        .await
        .map_err(|e| WriteError::Store {
            // One line of text: a name's control characters escaped (`new\nline.txt`).
            name: f
                .file
                .name
                .chars()
                .flat_map(|c| {
                    let one: Vec<char> = if c.is_control() {
                        c.escape_default().collect()
                    } else {
                        vec![c]
                    };
                    one
                })
                .collect(),
            hash: f.file.file.clone(),
            message: e.to_string(),
        })?;
    let file = w.into_inner().map_err(|e| io(target, e.into_error()))?;
    file.sync_data().map_err(|e| io(target, e))?;
    drop(file);
    std::fs::rename(&tmp.0, target).map_err(|e| io(target, e))?;
    tmp.keep();
    Ok(())
}

/// A temporary file removed when dropped, unless kept (renamed into place).
struct Partial(PathBuf);

impl Partial {
    fn keep(mut self) {
        self.0 = PathBuf::new();
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// Hands out the directories of a batch's items under `--files DIR`: each id made one safe
/// path segment, and ids that become the same segment (or differ only in case) told apart by
/// a numeric suffix (`a_b`, `a_b-2`). The same ids in the same order get the same
/// directories every time.
#[derive(Default)]
pub struct ItemDirs {
    taken: HashSet<String>,
}

impl ItemDirs {
    pub fn new() -> Self {
        Self::default()
    }

    /// The directory name of the item with this id (its text; a number as written).
    pub fn dir_for(&mut self, id: &str) -> String {
        let base = safe_segment(id);
        let mut candidate = base.clone();
        let mut n = 1u64;
        while !self.taken.insert(candidate.to_lowercase()) {
            n += 1;
            candidate = format!("{base}-{n}");
        }
        candidate
    }
}

/// Writes the files of a batch's items under `DIR/<item>/` (`batch --files`, `collect
/// --files`): every item is told in input order, whether it made files or not, so that each
/// id gets the same directory on every start of the batch.
pub struct ItemFiles {
    dir: PathBuf,
    dirs: ItemDirs,
    blobs: std::sync::Arc<dyn Blobs>,
}

impl ItemFiles {
    pub fn new(dir: PathBuf, blobs: std::sync::Arc<dyn Blobs>) -> Self {
        ItemFiles {
            dir,
            dirs: ItemDirs::new(),
            blobs,
        }
    }

    /// Writes the files of the item `id` (none: nothing is written, but the id takes its
    /// directory name); returns how many were written now.
    pub async fn write(&mut self, id: &serde_json::Value, files: &[RunFile]) -> Result<usize, WriteError> {
        let seg = self.dirs.dir_for(&id_text(id));
        if files.is_empty() {
            return Ok(0);
        }
        let w = write_files(&*self.blobs, files, &self.dir.join(seg)).await?;
        Ok(w.iter().filter(|w| w.wrote).count())
    }
}

/// The text an item's id is made into a directory from: a string as it is, anything else as
/// its JSON.
pub fn id_text(id: &serde_json::Value) -> String {
    match id {
        serde_json::Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::files::FileRef;
    use crate::store::blobs::MemoryBlobs;

    async fn stored(blobs: &MemoryBlobs, bytes: &[u8], name: &str, number: &str) -> RunFile {
        let hash = format!("sha256:{}", hex(&sha2::Sha256::digest(bytes)));
        blobs.put_bytes(&hash, bytes).await.unwrap();
        RunFile {
            number: number.into(),
            file: FileRef {
                file: hash,
                name: name.into(),
                media_type: "application/octet-stream".into(),
                size: bytes.len() as u64,
            },
        }
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("switchyard-out-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[tokio::test]
    async fn files_are_written_under_safe_unique_names_once() {
        let blobs = MemoryBlobs::new();
        let files = vec![
            stored(&blobs, b"one", "../../x", "1").await,
            stored(&blobs, b"two", "/etc/passwd", "2").await,
            stored(&blobs, b"three", "a.txt", "3").await,
            stored(&blobs, b"four", "a.txt", "3").await,
        ];
        let dir = tmpdir("names");
        let w = write_files(&blobs, &files, &dir).await.unwrap();
        let paths: Vec<&str> = w.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(paths, ["__/__/x", "etc/passwd", "a.txt", "a-2.txt"]);
        assert!(w.iter().all(|w| w.wrote));
        assert_eq!(std::fs::read(dir.join("a-2.txt")).unwrap(), b"four");
        assert_eq!(std::fs::read(dir.join("__/__/x")).unwrap(), b"one");
        // Again: nothing rewritten, same names.
        let again = write_files(&blobs, &files, &dir).await.unwrap();
        assert!(again.iter().all(|w| !w.wrote));
        // A damaged copy is written again; a leftover partial file is swept.
        std::fs::write(dir.join("a.txt"), b"thre3").unwrap();
        std::fs::write(dir.join(format!("{PARTIAL_PREFIX}1-1")), b"x").unwrap();
        let third = write_files(&blobs, &files, &dir).await.unwrap();
        assert_eq!(third.iter().filter(|w| w.wrote).count(), 1);
        assert_eq!(std::fs::read(dir.join("a.txt")).unwrap(), b"three");
        assert!(!dir.join(format!("{PARTIAL_PREFIX}1-1")).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn missing_bytes_leave_no_partial_file() {
        let blobs = MemoryBlobs::new();
        let mut f = stored(&blobs, b"real", "r.bin", "1").await;
        f.file.file = format!("sha256:{}", "0".repeat(64));
        let dir = tmpdir("missing");
        let e = write_files(&blobs, &[f], &dir).await.unwrap_err();
        assert!(matches!(e, WriteError::Store { .. }), "{e}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_symlinked_directory_is_not_written_through() {
        let blobs = MemoryBlobs::new();
        let f = stored(&blobs, b"x", "link/x", "1").await;
        let dir = tmpdir("link");
        let away = tmpdir("away");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&away).unwrap();
        std::os::unix::fs::symlink(&away, dir.join("link")).unwrap();
        let e = write_files(&blobs, &[f], &dir).await.unwrap_err();
        assert!(e.to_string().contains("not written through"), "{e}");
        assert_eq!(std::fs::read_dir(&away).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&away).unwrap();
    }

    #[test]
    fn item_dirs_never_collide() {
        let mut d = ItemDirs::new();
        assert_eq!(d.dir_for("a/b"), "a_b");
        assert_eq!(d.dir_for("a_b"), "a_b-2");
        assert_eq!(d.dir_for("A_B"), "A_B-3");
        assert_eq!(d.dir_for(".."), "__");
        assert_eq!(d.dir_for("7"), "7");
        assert_eq!(id_text(&serde_json::json!(7)), "7");
        assert_eq!(id_text(&serde_json::json!("x")), "x");
    }
}
