//! Files that agents make and read (SPEC §6.5): hashing bytes as they stream, the limits on
//! them, their media types, and the names they are written out under.
//!
//! An agent call gets a [`FileSink`] in its [`crate::agents::CallContext`]: it stores what the
//! agent makes (each file hashed once while read, its bytes written to the store only when the
//! store lacks them) and remembers it, so that the engine puts the files on the step's record
//! and the run's ([`crate::record::RunFile`]). The bytes themselves are the store's
//! ([`crate::store::blobs`]).

pub mod names;
pub mod out;
pub mod sniff;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::Digest;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::record::files::FileRef;
use crate::record::{ErrorKind, StepError};
use crate::store::blobs::{Blobs, MemoryBlobs, hex};

/// `limits.max_file_bytes`' default: 64 MiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 64 << 20;

/// The chunk files are read, hashed and stored in.
pub const CHUNK: usize = 256 << 10;

/// The limits on the files of one run (SPEC §6.5): each file, and all files the run made.
/// A child run's limits hold its parent's: a file the child makes counts against both, and
/// the tightest `max_file_bytes` of the tree applies.
#[derive(Debug)]
pub struct FileLimits {
    /// `limits.max_file_bytes`.
    pub max_file_bytes: u64,
    /// `limits.max_run_file_bytes`, if set.
    pub max_run_file_bytes: Option<u64>,
    /// Bytes of the files the run made so far (a file made twice counts twice).
    pub run_bytes: AtomicU64,
    /// How errors name the two limits: the flow's field (`limits.max_file_bytes`) or the
    /// flag that narrowed it (`--max-file-bytes`).
    pub names: (&'static str, &'static str),
    /// The parent run's limits, for a child run.
    pub parent: Option<Arc<FileLimits>>,
}

impl Default for FileLimits {
    fn default() -> Self {
        FileLimits {
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_run_file_bytes: None,
            run_bytes: AtomicU64::new(0),
            names: ("limits.max_file_bytes", "limits.max_run_file_bytes"),
            parent: None,
        }
    }
}

impl FileLimits {
    /// The largest file allowed here: the tightest `max_file_bytes` up the tree, with the
    /// name of the limit that sets it.
    fn file_limit(&self) -> (u64, &'static str) {
        let mut best = (self.max_file_bytes, self.names.0);
        let mut up = self.parent.as_deref();
        while let Some(p) = up {
            if p.max_file_bytes < best.0 {
                best = (p.max_file_bytes, p.names.0);
            }
            up = p.parent.as_deref();
        }
        best
    }

    /// Counts `size` bytes against this run and every run above it; when one of them would
    /// go over its `max_run_file_bytes`, counts nothing and returns that limit and its name.
    pub fn charge(&self, size: u64) -> Result<(), (u64, &'static str)> {
        let mut charged: Vec<&FileLimits> = Vec::new();
        let mut at = Some(self);
        while let Some(l) = at {
            let before = l.run_bytes.fetch_add(size, Ordering::Relaxed);
            charged.push(l);
            if let Some(max) = l.max_run_file_bytes
                && before + size > max
            {
                for c in charged {
                    c.run_bytes.fetch_sub(size, Ordering::Relaxed);
                }
                return Err((max, l.names.1));
            }
            at = l.parent.as_deref();
        }
        Ok(())
    }

    /// Counts bytes made before (a resumed run's replayed files) against this run and every
    /// run above it, without checking the limits: they were within them when made.
    pub fn count_made(&self, size: u64) {
        let mut at = Some(self);
        while let Some(l) = at {
            l.run_bytes.fetch_add(size, Ordering::Relaxed);
            at = l.parent.as_deref();
        }
    }
}

/// Where one agent call stores the files it makes, and what it made.
pub struct FileSink {
    blobs: Arc<dyn Blobs>,
    limits: Arc<FileLimits>,
    made: Mutex<Vec<FileRef>>,
}

impl FileSink {
    pub fn new(blobs: Arc<dyn Blobs>, limits: Arc<FileLimits>) -> Self {
        FileSink {
            blobs,
            limits,
            made: Mutex::new(Vec::new()),
        }
    }

    /// A sink over bytes kept in memory, for calls outside a run (tests, `lint --mcp`).
    pub fn detached() -> Self {
        Self::new(Arc::new(MemoryBlobs::new()), Arc::new(FileLimits::default()))
    }

    /// The store's bytes: to read the files of an agent's input.
    pub fn blobs(&self) -> &Arc<dyn Blobs> {
        &self.blobs
    }

    /// The files made through this sink so far, in the order they were made; the sink
    /// forgets them.
    pub fn take(&self) -> Vec<FileRef> {
        std::mem::take(&mut *self.made.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Stores the file at `path` as a file named `name` (its media type sniffed from its first
    /// bytes, else taken from `name`'s extension) and notes it as made. A file over
    /// `max_file_bytes`, or one that takes the run over `max_run_file_bytes`, fails with kind
    /// `limit` and is not stored.
    pub async fn store_path(&self, path: &Path, name: String) -> Result<FileRef, StepError> {
        // Read and hashed on one blocking thread, in one trip: a file of a few chunks costs
        // less than the hops of reading it chunk by chunk from the async threads.
        let (owned, (max, limit)) = (path.to_path_buf(), self.limits.file_limit());
        let (hash, size, head, name) = tokio::task::spawn_blocking(move || {
            let hashed = hash_file(&owned, &name, max, limit);
            hashed.map(|(hash, size, head)| (hash, size, head, name))
        })
        .await
        .map_err(|e| {
            StepError::new(
                ErrorKind::Agent,
                format!("cannot read file {}: {e}", path.display()),
            )
        })??;
        self.charge(&name, size)?;
        if self.stored(&hash, size).await? {
            // Bytes we have already: not read again.
        } else {
            self.blobs
                .put_path(&hash, size, path)
                .await
                .map_err(|e| store_error(&name, e))?;
        }
        Ok(self.made(hash, name, size, &head, None))
    }

    /// Stores `bytes` as a file named `name`, of `media_type` if given (else sniffed, then
    /// taken from the extension), and notes it as made. Limits as [`FileSink::store_path`].
    pub async fn store_bytes(
        &self,
        bytes: &[u8],
        name: String,
        media_type: Option<&str>,
    ) -> Result<FileRef, StepError> {
        let size = bytes.len() as u64;
        self.check_size(&name, size)?;
        let hash = format!("sha256:{}", hex(&sha2::Sha256::digest(bytes)));
        self.charge(&name, size)?;
        if !self.stored(&hash, size).await? {
            self.blobs
                .put_bytes(&hash, bytes)
                .await
                .map_err(|e| store_error(&name, e))?;
        }
        let head = &bytes[..bytes.len().min(sniff::HEAD)];
        Ok(self.made(hash, name, size, head, media_type))
    }

    /// Stores what `reader` yields (an HTTP body) as a file named `name`: streamed through a
    /// temporary file while hashed, never held whole in memory; stops reading as soon as it is
    /// over `max_file_bytes`. Limits as [`FileSink::store_path`].
    pub async fn store_reader(
        &self,
        mut reader: impl AsyncRead + Unpin,
        name: String,
        media_type: Option<&str>,
    ) -> Result<FileRef, StepError> {
        use tokio::io::AsyncWriteExt;
        let tmp = TempFile::new()?;
        let mut out = tokio::fs::File::create(&tmp.0)
            .await
            .map_err(|e| StepError::new(ErrorKind::Agent, format!("cannot write a temporary file: {e}")))?;
        let mut hasher = sha2::Sha256::new();
        let mut size = 0u64;
        let mut head = Vec::new();
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = reader
                .read(&mut buf)
                .await
                .map_err(|e| StepError::new(ErrorKind::Agent, format!("cannot read file `{name}`: {e}")))?;
            if n == 0 {
                break;
            }
            size += n as u64;
            self.check_size(&name, size)?;
            if head.len() < sniff::HEAD {
                let take = (sniff::HEAD - head.len()).min(n);
                head.extend_from_slice(&buf[..take]);
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).await.map_err(|e| {
                StepError::new(ErrorKind::Agent, format!("cannot write a temporary file: {e}"))
            })?;
        }
        out.flush()
            .await
            .map_err(|e| StepError::new(ErrorKind::Agent, format!("cannot write a temporary file: {e}")))?;
        drop(out);
        let hash = format!("sha256:{}", hex(&hasher.finalize()));
        self.charge(&name, size)?;
        if !self.stored(&hash, size).await? {
            self.blobs
                .put_path(&hash, size, &tmp.0)
                .await
                .map_err(|e| store_error(&name, e))?;
        }
        Ok(self.made(hash, name, size, &head, media_type))
    }

    /// Writes the bytes of `file` to a new file at `path`, checked against their hash.
    pub async fn write_to_path(&self, file: &FileRef, path: &Path) -> Result<u64, StepError> {
        let mut out = std::fs::File::create(path)
            .map_err(|e| StepError::new(ErrorKind::Agent, format!("cannot write {}: {e}", path.display())))?;
        let n = self
            .blobs
            .read_to(&file.file, &mut out)
            .await
            .map_err(|e| store_error(&file.name, e))?;
        Ok(n)
    }

    /// The bytes of `file`, read whole (bounded by the caller's limits), checked against
    /// their hash.
    pub async fn read_bytes(&self, file: &FileRef) -> Result<Vec<u8>, StepError> {
        self.blobs
            .read_bytes(&file.file)
            .await
            .map_err(|e| store_error(&file.name, e))
    }

    fn check_size(&self, name: &str, size: u64) -> Result<(), StepError> {
        let (max, limit) = self.limits.file_limit();
        check_size(name, size, max, limit)
    }

    /// Counts `size` bytes against the run's `max_run_file_bytes` (and its parents').
    fn charge(&self, name: &str, size: u64) -> Result<(), StepError> {
        self.limits.charge(size).map_err(|(max, limit)| {
            StepError::new(
                ErrorKind::Limit,
                format!(
                    "file `{name}` ({size} bytes) takes the run's files over the limit {limit} ({max} bytes)"
                ),
            )
            .with_details(serde_json::json!({"limit": "max_run_file_bytes", "value": max, "file": name}))
        })
    }

    /// Whether the store has the bytes of `hash` already.
    async fn stored(&self, hash: &str, _size: u64) -> Result<bool, StepError> {
        self.blobs.reuse(hash).await.map_err(|e| store_error(hash, e))
    }

    fn made(&self, hash: String, name: String, size: u64, head: &[u8], media_type: Option<&str>) -> FileRef {
        let media_type = match media_type {
            Some(m) if !m.is_empty() => sniff::refine(m, head),
            _ => sniff::media_type(head, &name),
        };
        let r = FileRef {
            file: hash,
            name,
            media_type,
            size,
        };
        self.made
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(r.clone());
        r
    }
}

/// `max_file_bytes`: a file of `size` bytes (so far) over `max` fails with kind `limit`.
/// Fails with kind `limit` when `size` is over `max`, the limit named `limit`.
fn check_size(name: &str, size: u64, max: u64, limit: &str) -> Result<(), StepError> {
    if size > max {
        return Err(StepError::new(
            ErrorKind::Limit,
            format!("file `{name}` is over the limit {limit} ({max} bytes)"),
        )
        .with_details(serde_json::json!({"limit": "max_file_bytes", "value": max, "file": name})));
    }
    Ok(())
}

/// Hashes the file at `path` chunk by chunk (blocking); fails as soon as it is over `max`
/// bytes. Returns the hash, the size and the first bytes (for sniffing).
fn hash_file(path: &Path, name: &str, max: u64, limit: &str) -> Result<(String, u64, Vec<u8>), StepError> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|e| {
        StepError::new(
            ErrorKind::Agent,
            format!("cannot read file {}: {e}", path.display()),
        )
    })?;
    let mut hasher = sha2::Sha256::new();
    let mut size = 0u64;
    let mut head = Vec::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(StepError::new(
                    ErrorKind::Agent,
                    format!("cannot read file `{name}`: {e}"),
                ));
            }
        };
        size += n as u64;
        check_size(name, size, max, limit)?;
        if head.len() < sniff::HEAD {
            let take = (sniff::HEAD - head.len()).min(n);
            head.extend_from_slice(&buf[..take]);
        }
        hasher.update(&buf[..n]);
    }
    Ok((format!("sha256:{}", hex(&hasher.finalize())), size, head))
}

fn store_error(what: &str, e: crate::store::StoreError) -> StepError {
    StepError::new(ErrorKind::Agent, format!("file `{what}`: {e}"))
}

/// A temporary file removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new() -> Result<Self, StepError> {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("switchyard-file-{}-{n}", std::process::id()));
        Ok(TempFile(path))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(max_file: u64, max_run: Option<u64>) -> FileSink {
        FileSink::new(
            Arc::new(MemoryBlobs::new()),
            Arc::new(FileLimits {
                max_file_bytes: max_file,
                max_run_file_bytes: max_run,
                ..FileLimits::default()
            }),
        )
    }

    #[tokio::test]
    async fn bytes_are_stored_once_by_hash_and_read_back() {
        let s = sink(1 << 20, None);
        let a = s.store_bytes(b"hello", "a.txt".into(), None).await.unwrap();
        let b = s.store_bytes(b"hello", "b.txt".into(), None).await.unwrap();
        assert_eq!(a.file, b.file);
        assert_eq!(
            a.file,
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(a.media_type, "text/plain");
        assert_eq!(s.read_bytes(&a).await.unwrap(), b"hello");
        assert_eq!(s.take().len(), 2);
        assert!(s.take().is_empty());
    }

    #[tokio::test]
    async fn limits_fail_with_kind_limit() {
        let s = sink(4, None);
        let e = s.store_bytes(b"hello", "a".into(), None).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Limit);
        assert!(e.message.contains("max_file_bytes"), "{}", e.message);
        let s = sink(100, Some(8));
        s.store_bytes(b"hello", "a".into(), None).await.unwrap();
        let e = s.store_bytes(b"hello", "b".into(), None).await.unwrap_err();
        assert!(e.message.contains("max_run_file_bytes"), "{}", e.message);
        let e = s
            .store_reader(&b"0123456789"[..], "c".into(), None)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Limit);
    }

    #[test]
    fn a_child_counts_against_its_parents_and_the_tightest_file_limit_applies() {
        let parent = Arc::new(FileLimits {
            max_file_bytes: 8,
            max_run_file_bytes: Some(10),
            ..FileLimits::default()
        });
        let child = FileLimits {
            max_file_bytes: 100,
            max_run_file_bytes: None,
            names: ("--max-file-bytes", "--max-run-file-bytes"),
            parent: Some(parent.clone()),
            ..FileLimits::default()
        };
        assert_eq!(child.file_limit(), (8, "limits.max_file_bytes"));
        child.count_made(4);
        assert_eq!(child.charge(6), Ok(()));
        assert_eq!(child.charge(1), Err((10, "limits.max_run_file_bytes")));
        // Refused bytes are counted nowhere.
        assert_eq!(child.run_bytes.load(Ordering::Relaxed), 10);
        assert_eq!(parent.run_bytes.load(Ordering::Relaxed), 10);
    }

    #[tokio::test]
    async fn a_stream_is_stored_through_a_temporary_file() {
        let s = sink(1 << 20, None);
        let data = vec![7u8; 3 * CHUNK + 5];
        let r = s.store_reader(&data[..], "blob.bin".into(), None).await.unwrap();
        assert_eq!(r.size, data.len() as u64);
        assert_eq!(r.media_type, "application/octet-stream");
        assert_eq!(s.read_bytes(&r).await.unwrap(), data);
    }
}
