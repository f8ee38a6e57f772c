//! File bytes in a SQL store (SPEC §6.5): `file_chunks` holds each file's bytes in chunks of
//! [`crate::files::CHUNK`], `files` one row per whole file, written in the transaction of its
//! last chunk. Readers see a file only once it is whole; two processes storing the same bytes
//! at once store them once (the second finds the first's rows, or waits on them).

use std::collections::HashSet;
use std::path::Path;

use futures_util::TryStreamExt;
use sqlx::{AnyPool, Connection, Row};
use tokio::io::AsyncReadExt;

use super::error::Ctx;
use crate::record::files::{HASH_PREFIX, is_hash};
use crate::store::StoreError;
use crate::store::blobs::{BlobFuture, Blobs, Pruned, Verify};

/// The bytes of a SQL store's files.
pub struct SqlBlobs {
    pub(super) pool: AnyPool,
    pub(super) ctx: Ctx,
}

impl SqlBlobs {
    async fn put_chunks<F>(&self, hash: &str, size: u64, mut next: F) -> Result<(), StoreError>
    where
        F: AsyncChunks,
    {
        const WHAT: &str = "storing a file";
        let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
        let mut conn = self.pool.acquire().await.map_err(err)?;
        let mut tx = conn
            .begin_with(self.ctx.dialect.begin_write())
            .await
            .map_err(err)?;
        let have: Option<i64> = sqlx::query_scalar("SELECT size FROM files WHERE hash = $1")
            .bind(hash)
            .fetch_optional(&mut *tx)
            .await
            .map_err(err)?;
        if have.is_some() {
            return Ok(());
        }
        let mut seq = 0i64;
        let mut total = 0u64;
        while let Some(chunk) = next.next_chunk().await? {
            total += chunk.len() as u64;
            sqlx::query("INSERT INTO file_chunks (hash, seq, data) VALUES ($1, $2, $3) ON CONFLICT (hash, seq) DO NOTHING")
                .bind(hash)
                .bind(seq)
                .bind(chunk)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
            seq += 1;
        }
        if total != size {
            return Err(StoreError::Other(format!(
                "file {hash} changed while it was stored ({size} bytes when hashed, {total} when stored)"
            )));
        }
        sqlx::query(
            "INSERT INTO files (hash, size, chunks, created_at) VALUES ($1, $2, $3, $4) ON CONFLICT (hash) DO NOTHING",
        )
        .bind(hash)
        .bind(i64::try_from(size).unwrap_or(i64::MAX))
        .bind(seq)
        .bind(i64::try_from(crate::record::now_ms()).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)
    }
}

/// Chunks of a file being stored, one at a time.
trait AsyncChunks: Send {
    fn next_chunk(&mut self)
    -> impl std::future::Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send;
}

struct FileChunks<'a> {
    file: tokio::fs::File,
    path: &'a Path,
}

impl AsyncChunks for FileChunks<'_> {
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, StoreError> {
        let mut buf = vec![0u8; crate::files::CHUNK];
        let mut filled = 0;
        while filled < buf.len() {
            let n = self
                .file
                .read(&mut buf[filled..])
                .await
                .map_err(|e| StoreError::Other(format!("cannot read {}: {e}", self.path.display())))?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            return Ok(None);
        }
        buf.truncate(filled);
        Ok(Some(buf))
    }
}

struct SliceChunks<'a>(std::slice::Chunks<'a, u8>);

impl AsyncChunks for SliceChunks<'_> {
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.0.next().map(<[u8]>::to_vec))
    }
}

impl Blobs for SqlBlobs {
    fn size<'a>(&'a self, hash: &'a str) -> BlobFuture<'a, Option<u64>> {
        Box::pin(async move {
            let size: Option<i64> = sqlx::query_scalar("SELECT size FROM files WHERE hash = $1")
                .bind(hash)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.ctx.error("reading a file", &e))?;
            Ok(size.map(|s| s as u64))
        })
    }

    fn put_path<'a>(&'a self, hash: &'a str, size: u64, path: &'a Path) -> BlobFuture<'a, ()> {
        Box::pin(async move {
            let file = tokio::fs::File::open(path)
                .await
                .map_err(|e| StoreError::Other(format!("cannot read {}: {e}", path.display())))?;
            self.put_chunks(hash, size, FileChunks { file, path }).await
        })
    }

    fn put_bytes<'a>(&'a self, hash: &'a str, bytes: &'a [u8]) -> BlobFuture<'a, ()> {
        Box::pin(async move {
            self.put_chunks(
                hash,
                bytes.len() as u64,
                SliceChunks(bytes.chunks(crate::files::CHUNK)),
            )
            .await
        })
    }

    fn read_to<'a>(&'a self, hash: &'a str, out: &'a mut (dyn std::io::Write + Send)) -> BlobFuture<'a, u64> {
        Box::pin(async move {
            const WHAT: &str = "reading a file";
            let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
            let row: Option<(i64, i64)> = sqlx::query_as("SELECT size, chunks FROM files WHERE hash = $1")
                .bind(hash)
                .fetch_optional(&self.pool)
                .await
                .map_err(err)?;
            let Some((size, chunks)) = row else {
                return Err(StoreError::Other(format!(
                    "{}: file {hash} is not in the store",
                    self.ctx.store
                )));
            };
            let mut check = Verify::new(hash);
            let mut expected = 0i64;
            let mut rows = sqlx::query("SELECT seq, data FROM file_chunks WHERE hash = $1 ORDER BY seq")
                .bind(hash)
                .fetch(&self.pool);
            while let Some(row) = rows.try_next().await.map_err(err)? {
                let seq: i64 = row.try_get(0).map_err(err)?;
                let data: Vec<u8> = row.try_get(1).map_err(err)?;
                if seq != expected {
                    break;
                }
                expected += 1;
                check.update(&data);
                out.write_all(&data)
                    .map_err(|e| StoreError::Other(format!("cannot write file {hash}: {e}")))?;
            }
            if expected != chunks {
                return Err(StoreError::Other(format!(
                    "{}: the bytes stored for file {hash} are incomplete (chunk {expected} of {chunks}): the store is damaged",
                    self.ctx.store
                )));
            }
            if check.written != size as u64 {
                return Err(StoreError::Other(format!(
                    "{}: the bytes stored for file {hash} are {} bytes, not {size}: the store is damaged",
                    self.ctx.store, check.written
                )));
            }
            check.finish(&self.ctx.store)
        })
    }

    fn prune(&self, before_ms: u64) -> BlobFuture<'_, Pruned> {
        Box::pin(async move {
            const WHAT: &str = "pruning files";
            let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
            // Conservative: a hash written anywhere in a record (its files, input, output,
            // result) is referred to.
            let mut referred = HashSet::new();
            for sql in [
                "SELECT files FROM runs WHERE files IS NOT NULL",
                "SELECT input FROM runs WHERE input LIKE '%sha256:%'",
                "SELECT output FROM runs WHERE output LIKE '%sha256:%'",
                "SELECT files FROM steps WHERE files IS NOT NULL",
                "SELECT input FROM steps WHERE input LIKE '%sha256:%'",
                "SELECT result FROM steps WHERE result LIKE '%sha256:%'",
            ] {
                let mut rows = sqlx::query(sql).fetch(&self.pool);
                while let Some(row) = rows.try_next().await.map_err(err)? {
                    let text: Option<String> = row.try_get(0).map_err(err)?;
                    if let Some(t) = text {
                        hashes_in(&t, &mut referred);
                    }
                }
            }
            let stale: Vec<(String, i64)> =
                sqlx::query_as("SELECT hash, size FROM files WHERE created_at < $1")
                    .bind(i64::try_from(before_ms).unwrap_or(i64::MAX))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(err)?;
            let mut pruned = Pruned::default();
            for (hash, size) in stale.into_iter().filter(|(h, _)| !referred.contains(h)) {
                let mut conn = self.pool.acquire().await.map_err(err)?;
                let mut tx = conn
                    .begin_with(self.ctx.dialect.begin_write())
                    .await
                    .map_err(err)?;
                sqlx::query("DELETE FROM files WHERE hash = $1")
                    .bind(&hash)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
                sqlx::query("DELETE FROM file_chunks WHERE hash = $1")
                    .bind(&hash)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
                tx.commit().await.map_err(err)?;
                pruned.files += 1;
                pruned.bytes += size as u64;
            }
            Ok(pruned)
        })
    }
}

/// Adds every `sha256:<64 hex>` in `text` to `out`.
fn hashes_in(text: &str, out: &mut HashSet<String>) {
    let mut at = 0;
    while let Some(i) = text[at..].find(HASH_PREFIX) {
        let start = at + i;
        let end = start + HASH_PREFIX.len() + 64;
        if let Some(h) = text.get(start..end)
            && is_hash(h)
        {
            out.insert(h.to_string());
        }
        at = start + HASH_PREFIX.len();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hashes_are_found_in_text() {
        let h = format!("sha256:{}", "ab".repeat(32));
        let mut out = std::collections::HashSet::new();
        super::hashes_in(&format!(r#"[{{"file":"{h}"}}, "sha256:xyz", "{h}"]"#), &mut out);
        assert_eq!(out.len(), 1);
        assert!(out.contains(&h));
    }
}
