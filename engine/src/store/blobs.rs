//! The bytes of files (SPEC §6.5), stored once by content hash beside the records. Every
//! store keeps its own: the memory store in memory, SQL stores in their database (so every
//! worker of a PostgreSQL store reads the same files). The trait is object-safe: agents hold
//! an `Arc<dyn Blobs>` without knowing which store is behind it.
//!
//! Callers hash (`crate::files`); a store only keeps and returns bytes, and checks them
//! against their hash when they are read back.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use sha2::Digest;

use super::StoreError;

/// Bytes stored or marked in use this recently are never pruned, whatever `--older-than` says.
pub const PRUNE_FLOOR: std::time::Duration = std::time::Duration::from_secs(60);

/// How stale a reused file's mark may get before [`Blobs::reuse`] writes it again: well within
/// [`PRUNE_FLOOR`], so a mark is a write only for bytes not made for a while.
pub const REUSE_MARK: std::time::Duration = std::time::Duration::from_secs(10);

pub type BlobFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// What `prune` removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    pub files: u64,
    pub bytes: u64,
}

/// Bytes by content hash. `hash` is always `sha256:<64 lowercase hex>` ([`crate::record::files::is_hash`]).
pub trait Blobs: Send + Sync {
    /// The size of the bytes stored under `hash`, if any.
    fn size<'a>(&'a self, hash: &'a str) -> BlobFuture<'a, Option<u64>>;
    /// Stores the file at `path` (of `size` bytes, whose hash the caller computed) under
    /// `hash`, reading it in chunks, never whole; nothing when `hash` is stored already. A
    /// store that fails half-way keeps nothing of it.
    fn put_path<'a>(&'a self, hash: &'a str, size: u64, path: &'a Path) -> BlobFuture<'a, ()>;
    /// Stores `bytes` under `hash` unless stored already.
    fn put_bytes<'a>(&'a self, hash: &'a str, bytes: &'a [u8]) -> BlobFuture<'a, ()>;
    /// Writes the bytes stored under `hash` to `out` chunk by chunk, checking them against
    /// the hash as they go; returns how many were written. Missing bytes, or bytes that do not
    /// match their hash, are an error (what was written before is the caller's to discard).
    fn read_to<'a>(&'a self, hash: &'a str, out: &'a mut (dyn std::io::Write + Send)) -> BlobFuture<'a, u64>;
    /// Whether the bytes of `hash` are stored; if so, marks them in use now, as if stored now
    /// (at most every [`REUSE_MARK`]): a file made again from bytes an earlier attempt left
    /// on no record is not pruned before the record that refers to it lands.
    fn reuse<'a>(&'a self, hash: &'a str) -> BlobFuture<'a, bool>;
    /// Removes the bytes that no run or step record refers to and that were stored (or
    /// marked in use) longer than `older_than` ago — never less than [`PRUNE_FLOOR`], the
    /// time a file being made now has to reach its record — by the database's clock.
    fn prune(&self, older_than: std::time::Duration) -> BlobFuture<'_, Pruned>;
}

impl dyn Blobs {
    /// The bytes stored under `hash`, read whole: for what must be in memory anyway (a
    /// request body, an attachment), bounded by the callers' limits.
    pub async fn read_bytes(&self, hash: &str) -> Result<Vec<u8>, StoreError> {
        let mut out = Vec::new();
        self.read_to(hash, &mut out).await?;
        Ok(out)
    }
}

/// Checks bytes against their hash as they are written out.
pub struct Verify<'a> {
    hasher: sha2::Sha256,
    hash: &'a str,
    pub written: u64,
}

impl<'a> Verify<'a> {
    pub fn new(hash: &'a str) -> Self {
        Verify {
            hasher: sha2::Sha256::new(),
            hash,
            written: 0,
        }
    }

    pub fn update(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
        self.written += chunk.len() as u64;
    }

    /// Ok when what was written hashes to the expected hash.
    pub fn finish(self, store: &str) -> Result<u64, StoreError> {
        let got = format!("sha256:{}", hex(&self.hasher.finalize()));
        if got == self.hash {
            Ok(self.written)
        } else {
            Err(StoreError::Other(format!(
                "{store}: the bytes stored for file {} do not match their hash (read {got}): the store is damaged",
                self.hash
            )))
        }
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// The memory store's bytes: gone with the process.
#[derive(Default, Debug)]
pub struct MemoryBlobs {
    bytes: Mutex<HashMap<String, Arc<[u8]>>>,
}

impl MemoryBlobs {
    pub fn new() -> Self {
        Self::default()
    }

    fn get(&self, hash: &str) -> Option<Arc<[u8]>> {
        self.bytes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(hash)
            .cloned()
    }

    fn insert(&self, hash: &str, bytes: Arc<[u8]>) {
        self.bytes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(hash.to_string())
            .or_insert(bytes);
    }
}

impl Blobs for MemoryBlobs {
    fn size<'a>(&'a self, hash: &'a str) -> BlobFuture<'a, Option<u64>> {
        Box::pin(async move { Ok(self.get(hash).map(|b| b.len() as u64)) })
    }

    fn put_path<'a>(&'a self, hash: &'a str, _size: u64, path: &'a Path) -> BlobFuture<'a, ()> {
        Box::pin(async move {
            if self.get(hash).is_some() {
                return Ok(());
            }
            let bytes = tokio::fs::read(path)
                .await
                .map_err(|e| StoreError::Other(format!("cannot read {}: {e}", path.display())))?;
            self.insert(hash, bytes.into());
            Ok(())
        })
    }

    fn put_bytes<'a>(&'a self, hash: &'a str, bytes: &'a [u8]) -> BlobFuture<'a, ()> {
        Box::pin(async move {
            if self.get(hash).is_none() {
                self.insert(hash, bytes.into());
            }
            Ok(())
        })
    }

    fn read_to<'a>(&'a self, hash: &'a str, out: &'a mut (dyn std::io::Write + Send)) -> BlobFuture<'a, u64> {
        Box::pin(async move {
            let bytes = self
                .get(hash)
                .ok_or_else(|| StoreError::Other(format!("file {hash} is not in the store")))?;
            let mut check = Verify::new(hash);
            for chunk in bytes.chunks(1 << 20) {
                check.update(chunk);
                out.write_all(chunk)
                    .map_err(|e| StoreError::Other(format!("cannot write file {hash}: {e}")))?;
            }
            check.finish("the memory store")
        })
    }

    fn reuse<'a>(&'a self, hash: &'a str) -> BlobFuture<'a, bool> {
        Box::pin(async move { Ok(self.get(hash).is_some()) })
    }

    /// Removes nothing: the memory store's files live as long as its records, in one process.
    fn prune(&self, _older_than: std::time::Duration) -> BlobFuture<'_, Pruned> {
        Box::pin(async move { Ok(Pruned::default()) })
    }
}
