//! File bytes in a SQL store (SPEC §6.5): `file_chunks` holds each file's bytes in chunks of
//! [`crate::files::CHUNK`], `files` one row per whole file, written in the transaction of its
//! last chunk. Readers see a file only once it is whole; two processes storing the same bytes
//! at once store them once (the second finds the first's rows, or waits on them).
//!
//! Throughput (BENCH.md W14): a file's transaction does not wait for the disk. On SQLite it is
//! committed with `synchronous=NORMAL` (set on the connection around it, restored after), on
//! PostgreSQL with `synchronous_commit` off: its rows reach the log before the record that
//! refers to them, whose own durable commit (the writer's) flushes the log up to and past them.
//! A file lost in a crash is thus one that no durable record names. The stores of one process
//! take turns on a lock of their own rather than in SQLite's busy handler, which sleeps
//! (milliseconds, growing) between tries.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};

use futures_util::TryStreamExt;
use sqlx::{AnyPool, Connection, Row};

use super::Synchronous;
use super::error::Ctx;
use crate::record::files::{HASH_PREFIX, is_hash};
use crate::store::StoreError;
use crate::store::blobs::{BlobFuture, Blobs, Pruned, Verify};

/// The bytes of a SQL store's files.
pub struct SqlBlobs {
    pub(super) pool: AnyPool,
    pub(super) ctx: Ctx,
    /// SQLite: the level the connections run at, restored after a file's transaction.
    pub(super) synchronous: Synchronous,
    /// SQLite: this process's stores of files, one at a time.
    pub(super) turn: tokio::sync::Mutex<()>,
}

impl SqlBlobs {
    pub(super) fn new(pool: AnyPool, ctx: Ctx, synchronous: Synchronous) -> Self {
        SqlBlobs {
            pool,
            ctx,
            synchronous,
            turn: tokio::sync::Mutex::new(()),
        }
    }

    async fn put_chunks<F>(&self, hash: &str, size: u64, mut next: F) -> Result<(), StoreError>
    where
        F: AsyncChunks,
    {
        const WHAT: &str = "storing a file";
        let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
        let sqlite = self.ctx.dialect == super::Dialect::Sqlite;
        let _turn = if sqlite {
            Some(self.turn.lock().await)
        } else {
            None
        };
        let mut conn = self.pool.acquire().await.map_err(err)?;
        // SQLite cannot change `synchronous` inside a transaction: around it, then.
        let relax = sqlite && self.synchronous == Synchronous::Full;
        if relax {
            sqlx::query("PRAGMA synchronous = NORMAL")
                .execute(&mut *conn)
                .await
                .map_err(err)?;
        }
        let stored = async {
            let mut tx = conn.begin_with(self.ctx.dialect.begin_write()).await?;
            if let Some(sql) = self.ctx.dialect.async_commit() {
                sqlx::query(sql).execute(&mut *tx).await?;
            }
            let have: Option<i64> = sqlx::query_scalar("SELECT size FROM files WHERE hash = $1")
                .bind(hash)
                .fetch_optional(&mut *tx)
                .await?;
            if have.is_some() {
                // Stored meanwhile by another process: in use now, as `reuse` marks it.
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE files SET created_at = {} WHERE hash = $1",
                    self.ctx.dialect.now_ms()
                )))
                .bind(hash)
                .execute(&mut *tx)
                .await?;
                return tx.commit().await.map(Ok);
            }
            let mut seq = 0i64;
            let mut total = 0u64;
            while let Some(chunk) = match next.next_chunk().await {
                Ok(c) => c,
                Err(e) => return Ok(Err(e)),
            } {
                total += chunk.len() as u64;
                sqlx::query("INSERT INTO file_chunks (hash, seq, data) VALUES ($1, $2, $3) ON CONFLICT (hash, seq) DO NOTHING")
                    .bind(hash)
                    .bind(seq)
                    .bind(chunk)
                    .execute(&mut *tx)
                    .await?;
                seq += 1;
            }
            if total != size {
                return Ok(Err(StoreError::Other(format!(
                    "file {hash} changed while it was stored ({size} bytes when hashed, {total} when stored)"
                ))));
            }
            // Timed by the database's clock, as `prune` and `reuse` compare it.
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO files (hash, size, chunks, created_at) VALUES ($1, $2, $3, {}) ON CONFLICT (hash) DO NOTHING",
                self.ctx.dialect.now_ms()
            )))
            .bind(hash)
            .bind(i64::try_from(size).unwrap_or(i64::MAX))
            .bind(seq)
            .execute(&mut *tx)
            .await?;
            tx.commit().await.map(Ok)
        }
        .await;
        if relax {
            let level = "PRAGMA synchronous = FULL";
            if sqlx::query(level).execute(&mut *conn).await.is_err() {
                // Never back in the pool at a weaker level than the store's.
                conn.close_on_drop();
            }
        }
        stored.map_err(err)?
    }
}

/// Chunks of a file being stored, one at a time.
trait AsyncChunks: Send {
    fn next_chunk(&mut self)
    -> impl std::future::Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send;
}

/// A file read chunk by chunk, each read one trip to a blocking thread.
struct FileChunks {
    file: Option<std::fs::File>,
    path: PathBuf,
}

impl AsyncChunks for FileChunks {
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(mut file) = self.file.take() else {
            return Ok(None);
        };
        let (file, read) = tokio::task::spawn_blocking(move || {
            let read = read_chunk(&mut file);
            (file, read)
        })
        .await
        .map_err(|e| StoreError::Other(format!("cannot read {}: {e}", self.path.display())))?;
        let chunk =
            read.map_err(|e| StoreError::Other(format!("cannot read {}: {e}", self.path.display())))?;
        if chunk.len() == crate::files::CHUNK {
            self.file = Some(file);
        }
        Ok((!chunk.is_empty()).then_some(chunk))
    }
}

/// Up to [`crate::files::CHUNK`] bytes of `file`: fewer only at its end.
fn read_chunk(file: &mut std::fs::File) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(crate::files::CHUNK);
    file.take(crate::files::CHUNK as u64).read_to_end(&mut buf)?;
    Ok(buf)
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

    fn reuse<'a>(&'a self, hash: &'a str) -> BlobFuture<'a, bool> {
        Box::pin(async move {
            const WHAT: &str = "reading a file";
            let err = |e: sqlx::Error| self.ctx.error(WHAT, &e);
            let now = self.ctx.dialect.now_ms();
            let row: Option<(i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT created_at, {now} FROM files WHERE hash = $1"
            )))
            .bind(hash)
            .fetch_optional(&self.pool)
            .await
            .map_err(err)?;
            let Some((marked, now_ms)) = row else {
                return Ok(false);
            };
            if now_ms.saturating_sub(marked) < super::super::blobs::REUSE_MARK.as_millis() as i64 {
                return Ok(true);
            }
            // A write only for bytes not made for a while; none when `prune` took them first.
            let marked = sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE files SET created_at = {now} WHERE hash = $1"
            )))
            .bind(hash)
            .execute(&self.pool)
            .await
            .map_err(|e| self.ctx.error("marking a file in use", &e))?;
            Ok(marked.rows_affected() > 0)
        })
    }

    fn put_path<'a>(&'a self, hash: &'a str, size: u64, path: &'a Path) -> BlobFuture<'a, ()> {
        Box::pin(async move {
            let file = std::fs::File::open(path)
                .map_err(|e| StoreError::Other(format!("cannot read {}: {e}", path.display())))?;
            let chunks = FileChunks {
                file: Some(file),
                path: path.to_path_buf(),
            };
            self.put_chunks(hash, size, chunks).await
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

    fn prune(&self, older_than: std::time::Duration) -> BlobFuture<'_, Pruned> {
        Box::pin(async move {
            let older_than = older_than.max(super::super::blobs::PRUNE_FLOOR);
            let older_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
            let now = self.ctx.dialect.now_ms();
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
            let stale: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT hash, size FROM files WHERE created_at < {now} - $1"
            )))
            .bind(older_ms)
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
                // Checked again under the write lock: bytes marked in use since are kept.
                let gone = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DELETE FROM files WHERE hash = $1 AND created_at < {now} - $2"
                )))
                .bind(&hash)
                .bind(older_ms)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
                if gone.rows_affected() == 0 {
                    tx.rollback().await.map_err(err)?;
                    continue;
                }
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
    use std::sync::Arc;

    use super::super::SqlStore;
    use crate::store::blobs::{Blobs, hex};

    async fn store(name: &str) -> (SqlStore, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "sy-files-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let url = format!("sqlite:{}", dir.join("runs.db").display());
        (SqlStore::open(&url).await.expect("open"), dir)
    }

    fn hash(bytes: &[u8]) -> String {
        use sha2::Digest;
        format!("sha256:{}", hex(&sha2::Sha256::digest(bytes)))
    }

    /// `PRAGMA synchronous` of every connection of the pool (2: FULL).
    async fn levels(s: &SqlStore) -> Vec<i64> {
        let mut held = Vec::new();
        let mut levels = Vec::new();
        for _ in 0..s.pool.num_idle() {
            let mut c = s.pool.acquire().await.expect("connection");
            levels.push(
                sqlx::query_scalar::<_, i64>("PRAGMA synchronous")
                    .fetch_one(&mut *c)
                    .await
                    .expect("pragma"),
            );
            held.push(c);
        }
        levels
    }

    /// Moves every file's mark two minutes back, past `prune`'s floor.
    async fn backdate(s: &SqlStore) {
        sqlx::query("UPDATE files SET created_at = created_at - 120000")
            .execute(&s.pool)
            .await
            .expect("backdate");
    }

    #[tokio::test]
    async fn bytes_made_again_are_marked_in_use_and_outlive_a_prune() {
        use std::time::Duration;
        let (s, dir) = store("reuse").await;
        let blobs = crate::store::Store::blobs(&s);
        let h = hash(b"orphan");
        blobs.put_bytes(&h, b"orphan").await.expect("put");
        // Fresh bytes are within the floor, whatever the grace.
        assert_eq!(blobs.prune(Duration::ZERO).await.expect("prune").files, 0);
        backdate(&s).await;
        // Made again: marked in use now, so a prune that had found them stale keeps them.
        assert!(blobs.reuse(&h).await.expect("reuse"));
        assert_eq!(blobs.prune(Duration::ZERO).await.expect("prune").files, 0);
        backdate(&s).await;
        let pruned = blobs.prune(Duration::ZERO).await.expect("prune");
        assert_eq!((pruned.files, pruned.bytes), (1, 6));
        assert!(!blobs.reuse(&h).await.expect("reuse"));
        let rest: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM file_chunks")
            .fetch_one(&s.pool)
            .await
            .expect("count");
        assert_eq!(rest, 0);
        s.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn concurrent_stores_keep_each_file_once_and_the_pool_at_the_store_level() {
        let (s, dir) = store("many").await;
        let blobs: Arc<dyn Blobs> = s.blobs.clone();
        let mut paths = Vec::new();
        for k in 0..24usize {
            // Three chunks and a bit; every other file the same bytes.
            let seed = if k % 2 == 0 { 0 } else { k };
            let bytes: Vec<u8> = (0..3 * crate::files::CHUNK + 7)
                .map(|i| (i * 31 + seed * 7 + i / 251) as u8)
                .collect();
            let path = dir.join(format!("{k}.bin"));
            std::fs::write(&path, &bytes).expect("write");
            paths.push((path, hash(&bytes), bytes));
        }
        let mut tasks = tokio::task::JoinSet::new();
        for (path, h, bytes) in paths.clone() {
            let blobs = blobs.clone();
            tasks.spawn(async move { blobs.put_path(&h, bytes.len() as u64, &path).await });
        }
        while let Some(r) = tasks.join_next().await {
            r.expect("task").expect("stored");
        }
        for (_, h, bytes) in &paths {
            assert_eq!(&blobs.read_bytes(h).await.expect("read"), bytes);
        }
        let (files, chunks): (i64, i64) =
            sqlx::query_as("SELECT (SELECT COUNT(*) FROM files), (SELECT COUNT(*) FROM file_chunks)")
                .fetch_one(&s.pool)
                .await
                .expect("count");
        assert_eq!((files, chunks), (13, 13 * 4));
        assert!(levels(&s).await.iter().all(|&l| l == 2), "{:?}", levels(&s).await);
        s.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_file_that_changed_size_leaves_no_rows_and_the_level_restored() {
        let (s, dir) = store("changed").await;
        let path = dir.join("f.bin");
        std::fs::write(&path, vec![1u8; crate::files::CHUNK + 10]).expect("write");
        let e = s
            .blobs
            .put_path(&hash(b"other"), 5, &path)
            .await
            .expect_err("sizes differ");
        assert!(e.to_string().contains("changed while it was stored"), "{e}");
        let rows: i64 =
            sqlx::query_scalar("SELECT (SELECT COUNT(*) FROM files) + (SELECT COUNT(*) FROM file_chunks)")
                .fetch_one(&s.pool)
                .await
                .expect("count");
        assert_eq!(rows, 0);
        assert!(levels(&s).await.iter().all(|&l| l == 2));
        s.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn hashes_are_found_in_text() {
        let h = format!("sha256:{}", "ab".repeat(32));
        let mut out = std::collections::HashSet::new();
        super::hashes_in(&format!(r#"[{{"file":"{h}"}}, "sha256:xyz", "{h}"]"#), &mut out);
        assert_eq!(out.len(), 1);
        assert!(out.contains(&h));
    }
}
