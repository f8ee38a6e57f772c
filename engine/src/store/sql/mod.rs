//! The SQL store: SQLite (the default, `.switchyard/runs.db`) and PostgreSQL through sqlx's
//! `any` driver, one schema ([`schema`]) and one code path; the few differences live in
//! [`Dialect`]. Writes go through one writer task that commits many runs' records together
//! ([`writer`]: group commit); reads go straight to the connection pool.
//!
//! SQLite runs in WAL mode with `synchronous=FULL` by default: every commit syncs the WAL, and
//! because commits are grouped across concurrent runs that is one fsync per group, not per
//! step per run — what SPEC §7.3 asks for (records survive kill -9 and power loss).
//! [`Synchronous::Normal`] skips the per-commit fsync (the WAL is synced at checkpoints): a
//! killed process still loses nothing committed, a power loss may lose the last commits,
//! never corrupting the file; it is about 10–20% faster under load.
//!
//! It knows nothing of flows or the engine: it stores the records it is given.

pub mod batches;
mod dialect;
mod error;
pub mod files;
pub mod inbox;
pub mod limits;
pub mod queue;
mod rows;
pub mod schema;
mod sqlite_file;
mod statements;
mod url;

pub use url::{check_url, redact, sqlite_file};
mod writer;
mod writers;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::AnyPool;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

pub use dialect::Dialect;
use error::Ctx;
pub use limits::{Paced, SqlLimits};
use rows::{RunRow, StepRow, decode_run, decode_step};
pub use schema::SCHEMA_VERSION;
use url::{Access, Target};
use writer::{Fence, Op, Request, Writer};

use super::{RunFilter, Store, StoreError};
use crate::record::{RunRecord, RunStatus, StepRecord};
use crate::store::Writer as RunWriter;

/// Where records go when no `--store` is given.
pub const DEFAULT_URL: &str = "sqlite:.switchyard/runs.db";

macro_rules! run_columns {
    () => {
        "id, flow, flow_hash, parent_run, parent_step, depth, status, input, output, error, started_at, \
         finished_at, input_tokens, output_tokens, cost_usd, steps, context, batch, item_id, item_index, flow_path, messages, now_us, cost_unknown_calls, agent_changes, origin, files"
    };
}

macro_rules! step_columns {
    () => {
        "run_id, number, attempt, iteration, step, kind, status, iterations, input, result, changes, \
         violations, error, started_at, finished_at, input_tokens, output_tokens, cost_usd, child_run, route, answers, cost_unknown_calls, files"
    };
}

/// How SQLite makes a commit durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// No fsync per commit; the WAL is synced at checkpoints. Survives a killed process, may
    /// lose the latest commits on power loss.
    Normal,
    /// An fsync of the WAL per commit (per group of records): survives power loss.
    #[default]
    Full,
}

/// Tuning for [`SqlStore::open_with`]; [`SqlStore::open`] takes the defaults.
#[derive(Clone, Debug)]
pub struct SqlOptions {
    /// How long a write waits for a lock another process holds before failing with
    /// [`StoreError::Locked`] (SQLite `busy_timeout`, PostgreSQL `lock_timeout`). 5 s.
    pub busy_timeout: Duration,
    /// SQLite only. [`Synchronous::Full`].
    pub synchronous: Synchronous,
    /// The most records one group commit holds. 512.
    pub max_batch: usize,
    /// Connections in the pool (readers and the writer). 8; an in-memory SQLite store has 1.
    pub max_connections: u32,
    /// SQLite only: the most pages (4 KiB each) the file may grow to (`PRAGMA
    /// max_page_count`); past it writes fail with [`StoreError::DiskFull`], as on a full
    /// disk. None: no limit.
    pub max_pages: Option<u64>,
    /// PostgreSQL only: keep the tables in this schema (created if missing), as the URL option
    /// `?schema=NAME` does.
    pub schema: Option<String>,
    /// Open only to read (`runs list`, `runs show`): a SQLite file this process may not write
    /// is opened read-only (and not migrated), so it can still be read. False.
    pub read_only: bool,
}

impl Default for SqlOptions {
    fn default() -> Self {
        SqlOptions {
            busy_timeout: Duration::from_secs(5),
            synchronous: Synchronous::Full,
            max_batch: 512,
            max_connections: 8,
            max_pages: None,
            schema: None,
            read_only: false,
        }
    }
}

/// Run and step records in SQLite or PostgreSQL.
pub struct SqlStore {
    pool: AnyPool,
    ctx: Ctx,
    writes: mpsc::Sender<Request>,
    writer: JoinHandle<()>,
    /// The submitted runs this process holds leases of, and their child runs: run id → the
    /// fence its writes are made under ([`SqlStore::hold`]). Empty outside a worker.
    fences: std::sync::Mutex<std::collections::HashMap<String, Fence>>,
    /// The bytes of files (SPEC §6.5), read and written on the pool, not through the writer.
    blobs: Arc<files::SqlBlobs>,
    /// The inbox (SPEC §15), read and written on the pool.
    inbox: Arc<inbox::SqlInbox>,
}

impl std::fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("store", &self.ctx.store)
            .field("dialect", &self.ctx.dialect)
            .finish()
    }
}

impl SqlStore {
    /// Opens (creating if needed) the store at `url`: `sqlite:PATH`, `sqlite::memory:`, or
    /// `postgres://...[?schema=NAME]`. Brings an older schema up to date; refuses a newer one
    /// with [`StoreError::NewerSchema`] before writing anything. Must run inside a tokio
    /// runtime, which then hosts the store's writer task.
    pub async fn open(url: &str) -> Result<SqlStore, StoreError> {
        Self::open_with(url, SqlOptions::default()).await
    }

    /// [`SqlStore::open`] with options.
    pub async fn open_with(url: &str, options: SqlOptions) -> Result<SqlStore, StoreError> {
        sqlx::any::install_default_drivers();
        let mut location = url::parse(url)?;
        // What the URL says wins over the defaults.
        let mut options = options;
        if let Some(s) = location.sqlite.synchronous {
            options.synchronous = s;
        }
        if let Some(ms) = location.sqlite.busy_timeout_ms {
            options.busy_timeout = Duration::from_millis(ms);
        }
        if let Some(pages) = location.sqlite.max_pages {
            options.max_pages = Some(pages);
        }
        if let Some(name) = &options.schema {
            location.set_schema(name)?;
        }
        let target = location.target;
        let ctx = Ctx {
            dialect: target.dialect(),
            store: location.name.into(),
            busy_ms: u64::try_from(options.busy_timeout.as_millis()).unwrap_or(u64::MAX),
        };
        let open_err = |message: String| StoreError::Open {
            store: ctx.store.to_string(),
            message,
        };

        // Only a SQLite file this process may not write is opened read-only: any other store
        // opens as for writing, so an older schema is brought up to date as usual.
        let read_only = options.read_only
            && matches!(&target, Target::SqliteFile(p) if sqlite_file::check_writable(p).is_err());
        let mut access = if read_only { Access::Read } else { Access::Write };
        match &target {
            Target::SqliteFile(path) => {
                if !read_only {
                    if let Some(dir) = path.parent() {
                        std::fs::create_dir_all(dir).map_err(|e| {
                            open_err(format!("cannot create the directory {}: {e}", dir.display()))
                        })?;
                    }
                    sqlite_file::check_writable(path).map_err(open_err)?;
                }
                // One connection first, outside the pool: a file that is not a database, or
                // that cannot be opened, says so at once, where the pool would retry setting
                // up connections until its acquire timeout and report only that.
                match probe_sqlite(&target, &options, access).await {
                    Ok(()) => {}
                    Err(e) if access == Access::Read && sqlite_file::needs_immutable(&e, path) => {
                        access = Access::Immutable;
                        probe_sqlite(&target, &options, access)
                            .await
                            .map_err(|e| open_err(sqlite_file::describe(&e)))?;
                    }
                    Err(e) => return Err(open_err(sqlite_file::describe(&e))),
                }
            }
            Target::Postgres {
                url,
                schema: Some(schema),
                ..
            } => create_schema(url, schema).await.map_err(open_err)?,
            _ => {}
        }

        let pool = connect(&target, &options, access).await.map_err(|e| {
            match ctx.error("opening the store", &e) {
                StoreError::Database { message, .. } => open_err(message),
                other => other,
            }
        })?;
        if let Err(e) = prepare(&pool, &target, &ctx, read_only).await {
            pool.close().await;
            return Err(e);
        }

        let (tx, rx) = mpsc::channel(options.max_batch.max(1) * 4);
        let writer = Writer {
            pool: pool.clone(),
            ctx: ctx.clone(),
            max_batch: options.max_batch.max(1),
            failed: std::collections::HashMap::new(),
            conn: Default::default(),
        };
        let writer = tokio::spawn(writer.run(rx));
        let blobs = Arc::new(files::SqlBlobs::new(
            pool.clone(),
            ctx.clone(),
            options.synchronous,
        ));
        let inbox = Arc::new(inbox::SqlInbox {
            pool: pool.clone(),
            ctx: ctx.clone(),
        });
        Ok(SqlStore {
            pool,
            ctx,
            writes: tx,
            writer,
            fences: Default::default(),
            blobs,
            inbox,
        })
    }

    /// The database behind the store.
    pub fn dialect(&self) -> Dialect {
        self.ctx.dialect
    }

    /// The store as messages name it: a file path, or a URL without its password.
    pub fn name(&self) -> &str {
        &self.ctx.store
    }

    /// Waits for queued writes to commit and closes every connection. Dropping the store
    /// also lets queued writes finish, in the background.
    pub async fn close(self) {
        let SqlStore {
            pool, writes, writer, ..
        } = self;
        drop(writes);
        let _ = writer.await;
        pool.close().await;
    }

    /// From now on, writes of run `run_id` (a submitted root run this process claimed at lease
    /// epoch `epoch`) and of the child runs it starts are made only while the store still
    /// holds that epoch for it: once another worker took it over, they fail with
    /// [`StoreError::LeaseLost`] and write nothing. Held already (claimed again by this
    /// worker, under a newer epoch), the run and its child runs are fenced by the new epoch.
    pub fn hold(&self, run_id: &str, epoch: i64) {
        let mut fences = self.fences.lock().unwrap_or_else(|p| p.into_inner());
        if fences.contains_key(run_id) {
            for f in fences.values_mut().filter(|f| &*f.root == run_id) {
                f.epoch = epoch;
            }
        }
        let fence = Fence {
            root: run_id.into(),
            epoch,
        };
        fences.insert(run_id.to_string(), fence);
    }

    /// The epoch writes of run `run_id` are fenced by, if any.
    #[cfg(test)]
    pub(crate) fn fence_epoch(&self, run_id: &str) -> Option<i64> {
        self.fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run_id)
            .map(|f| f.epoch)
    }

    /// Forgets the fence of root run `run_id` and of its child runs ([`SqlStore::hold`]).
    pub fn let_go(&self, run_id: &str) {
        self.fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, f| &*f.root != run_id);
    }

    /// The fence a write is made under: its run's, or, for a child run being created, its
    /// parent's (which it keeps from then on).
    fn fence_of(&self, op: &Op) -> Option<Fence> {
        let mut fences = self.fences.lock().unwrap_or_else(|p| p.into_inner());
        if fences.is_empty() {
            return None;
        }
        let (id, parent) = match op {
            Op::CreateRun(r) => (&r.id, r.parent_run.as_ref()),
            Op::UpdateRun(r) => (&r.id, None),
            Op::Step(s) => (&s.run_id, None),
            Op::Flush(id) => (id, None),
        };
        if let Some(f) = fences.get(id) {
            return Some(f.clone());
        }
        let f = fences.get(parent?)?.clone();
        fences.insert(id.clone(), f.clone());
        Some(f)
    }

    async fn write(&self, op: Op) -> Result<(), StoreError> {
        let closed = || StoreError::Closed {
            store: self.ctx.store.to_string(),
        };
        let (done, answer) = oneshot::channel();
        let fence = self.fence_of(&op);
        self.writes
            .send(Request {
                op,
                fence,
                done: Some(done),
            })
            .await
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }

    /// Queues a write without waiting for its commit.
    async fn queue(&self, op: Op) -> Result<(), StoreError> {
        let fence = self.fence_of(&op);
        self.writes
            .send(Request {
                op,
                fence,
                done: None,
            })
            .await
            .map_err(|_| StoreError::Closed {
                store: self.ctx.store.to_string(),
            })
    }

    async fn fetch_runs(
        &self,
        sql: String,
        binds: Vec<String>,
        what: &str,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for b in binds {
            q = q.bind(b);
        }
        let rows = q
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.ctx.error(what, &e))?;
        rows.iter()
            .map(|r| decode_run(r).map_err(|m| self.corrupt(what, m)))
            .collect()
    }

    fn corrupt(&self, what: &str, message: String) -> StoreError {
        StoreError::Database {
            store: self.ctx.store.to_string(),
            what: what.to_string(),
            message,
        }
    }
}

/// Creates a PostgreSQL schema unless it exists.
async fn create_schema(url: &str, schema: &str) -> Result<(), String> {
    let mut conn = sqlx::AnyConnection::connect(url)
        .await
        .map_err(|e| error::message(&e))?;
    // `CREATE SCHEMA IF NOT EXISTS` is not safe against another process doing the same at
    // the same moment: processes starting together on a new schema take turns.
    let created = setup_lock(&mut conn, async |conn| {
        let exists: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM pg_namespace WHERE nspname = $1")
            .bind(schema)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| error::message(&e))?;
        if exists == 0 {
            sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"")))
                .execute(&mut *conn)
                .await
                .map_err(|e| format!("cannot create the schema `{schema}`: {}", error::message(&e)))?;
        }
        Ok(())
    })
    .await;
    let closed = conn.close().await.map_err(|e| error::message(&e));
    created.and(closed)
}

/// The PostgreSQL advisory lock that processes setting up a store (creating its schema,
/// migrating it) take turns on: one key for every switchyard store.
const SETUP_LOCK: i64 = 0x5377_6974_6368_7964; // "Swtchyd"

/// Runs `f` on `conn` holding [`SETUP_LOCK`], released after whatever `f` gave.
async fn setup_lock<T, E: From<String>>(
    conn: &mut sqlx::AnyConnection,
    f: impl AsyncFnOnce(&mut sqlx::AnyConnection) -> Result<T, E>,
) -> Result<T, E> {
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(SETUP_LOCK)
        .execute(&mut *conn)
        .await
        .map_err(|e| E::from(format!("cannot take the setup lock: {}", error::message(&e))))?;
    let out = f(conn).await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(SETUP_LOCK)
        .execute(&mut *conn)
        .await;
    match (out, unlocked) {
        (Ok(_), Err(e)) => Err(E::from(format!(
            "cannot release the setup lock: {}",
            error::message(&e)
        ))),
        (out, _) => out,
    }
}

/// The statements that set up each connection.
fn setup_sql(target: &Target, options: &SqlOptions) -> String {
    let busy_ms = options.busy_timeout.as_millis();
    match target {
        Target::SqliteFile(_) | Target::SqliteMemory => {
            let sync = match options.synchronous {
                Synchronous::Normal => "NORMAL",
                Synchronous::Full => "FULL",
            };
            let mut setup = format!(
                "PRAGMA synchronous = {sync}; PRAGMA busy_timeout = {busy_ms}; PRAGMA foreign_keys = ON;"
            );
            if let Some(pages) = options.max_pages {
                setup.push_str(&format!(" PRAGMA max_page_count = {pages};"));
            }
            setup
        }
        Target::Postgres { schema, .. } => {
            let path = schema
                .as_ref()
                .map(|s| format!("SET search_path TO \"{s}\"; "))
                .unwrap_or_default();
            // A session frozen inside a transaction (a worker stopped by SIGSTOP, a machine
            // that hangs) loses it after this, with the row locks it held: it cannot block
            // another worker's takeover for longer (SPEC §12).
            let idle_ms = busy_ms.max(10_000);
            format!(
                "{path}SET lock_timeout = '{busy_ms}ms'; SET idle_in_transaction_session_timeout = '{idle_ms}ms';"
            )
        }
    }
}

/// Opens one connection to a SQLite file as `access` says, sets it up and reads its schema
/// table (which reads the file's header), then closes it.
async fn probe_sqlite(target: &Target, options: &SqlOptions, access: Access) -> Result<(), sqlx::Error> {
    let connect = AnyConnectOptions::from_str(&target.driver_url(access))?;
    let mut conn = sqlx::AnyConnection::connect_with(&connect).await?;
    let checked = async {
        sqlx::raw_sql(AssertSqlSafe(setup_sql(target, options)))
            .execute(&mut conn)
            .await?;
        sqlx::query("SELECT COUNT(*) FROM sqlite_master")
            .fetch_one(&mut conn)
            .await?;
        Ok::<_, sqlx::Error>(())
    }
    .await;
    let closed = conn.close().await;
    checked.and(closed)
}

/// The pool, with every connection set up by the same statements.
async fn connect(target: &Target, options: &SqlOptions, access: Access) -> Result<AnyPool, sqlx::Error> {
    let setup: Arc<str> = setup_sql(target, options).into();
    let mut pool = AnyPoolOptions::new().after_connect(move |conn, _| {
        let setup = setup.clone();
        Box::pin(async move {
            sqlx::raw_sql(AssertSqlSafe(setup.to_string()))
                .execute(conn)
                .await?;
            Ok(())
        })
    });
    pool = match target {
        // Each connection to `:memory:` is its own database: keep exactly one, forever.
        Target::SqliteMemory => pool
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None),
        Target::SqliteFile(_) => pool
            .max_connections(options.max_connections.max(2))
            .test_before_acquire(false),
        Target::Postgres { .. } => pool.max_connections(options.max_connections.max(2)),
    };
    let connect = AnyConnectOptions::from_str(&target.driver_url(access))?;
    if let Target::Postgres { .. } = target {
        // One connection first, outside the pool: a server that refuses or does not exist
        // says so at once, where the pool would retry until its acquire timeout and then
        // report only that it timed out.
        use sqlx::Connection as _;
        sqlx::AnyConnection::connect_with(&connect).await?.close().await?;
    }
    pool.connect_with(connect).await
}

/// Checks the schema version, switches SQLite files to WAL, and migrates — in that order, so
/// a store from a newer switchyard is refused before anything is written to it.
async fn prepare(pool: &AnyPool, target: &Target, ctx: &Ctx, read_only: bool) -> Result<(), StoreError> {
    let what = "opening the store";
    let mut conn = pool.acquire().await.map_err(|e| ctx.error(what, &e))?;
    if let Target::Postgres { .. } = target {
        // Processes opening a new store together would migrate it together: they take turns.
        let open = |message: String| StoreError::Open {
            store: ctx.store.to_string(),
            message,
        };
        return setup_lock(&mut conn, async |conn| -> Result<(), Setup> {
            prepare_on(conn, target, ctx, read_only)
                .await
                .map_err(Setup::Store)
        })
        .await
        .map_err(|e| match e {
            Setup::Store(e) => e,
            Setup::Lock(m) => open(m),
        });
    }
    prepare_on(&mut conn, target, ctx, read_only).await
}

/// What [`setup_lock`] around [`prepare_on`] can fail with.
enum Setup {
    Store(StoreError),
    Lock(String),
}

impl From<String> for Setup {
    fn from(m: String) -> Self {
        Setup::Lock(m)
    }
}

/// [`prepare`] on one connection.
async fn prepare_on(
    conn: &mut sqlx::AnyConnection,
    target: &Target,
    ctx: &Ctx,
    read_only: bool,
) -> Result<(), StoreError> {
    let what = "opening the store";
    let found = schema::version(&mut *conn, ctx.dialect)
        .await
        .map_err(|e| ctx.error(what, &e))?;
    schema::check_not_newer(found, &ctx.store)?;
    if read_only {
        if found < SCHEMA_VERSION {
            return Err(StoreError::Open {
                store: ctx.store.to_string(),
                message: format!(
                    "its records are in an older form (schema {found}; this switchyard reads {SCHEMA_VERSION}): \
                     a command that records runs brings it up to date, with write access to it"
                ),
            });
        }
        return Ok(());
    }
    if let Target::SqliteFile(_) = target {
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode = WAL")
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| ctx.error(what, &e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Open {
                store: ctx.store.to_string(),
                message: format!("cannot switch to WAL journaling (the journal mode stays `{mode}`)"),
            });
        }
    }
    if found < SCHEMA_VERSION {
        schema::migrate(&mut *conn, ctx).await?;
    }
    Ok(())
}

impl SqlStore {
    /// Settles the questions whose expiry passed ([`inbox::SqlInbox::expire`]): how many.
    /// What a worker does every heartbeat.
    pub async fn expire_questions(&self) -> Result<usize, StoreError> {
        Ok(self.inbox.expire().await?.len())
    }
}

impl Store for SqlStore {
    fn blobs(&self) -> Arc<dyn crate::store::blobs::Blobs> {
        self.blobs.clone()
    }

    fn inbox(&self) -> Arc<dyn crate::store::inbox::Inbox> {
        self.inbox.clone()
    }

    async fn create_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        self.write(Op::CreateRun(RunRow::encode(run)?)).await
    }

    async fn update_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        self.write(Op::UpdateRun(RunRow::encode(run)?)).await
    }

    async fn record_step(&self, step: StepRecord) -> Result<(), StoreError> {
        self.write(Op::Step(StepRow::encode(&step)?)).await
    }

    async fn queue_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        self.queue(Op::CreateRun(RunRow::encode(run)?)).await
    }

    async fn queue_step(&self, step: StepRecord) -> Result<(), StoreError> {
        self.queue(Op::Step(StepRow::encode(&step)?)).await
    }

    async fn flush(&self, run_id: &str) -> Result<(), StoreError> {
        self.write(Op::Flush(run_id.to_string())).await
    }

    async fn get_run(&self, id: &str) -> Result<RunRecord, StoreError> {
        let what = format!("reading run `{id}`");
        let row: Option<AnyRow> = sqlx::query(concat!(
            "SELECT ",
            run_columns!(),
            " FROM run_records WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.ctx.error(&what, &e))?;
        let row = row.ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        decode_run(&row).map_err(|m| self.corrupt(&what, m))
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let (sql, binds) = list_query(filter, filter.status, "DESC");
        self.fetch_runs(sql, binds, "listing runs").await
    }

    async fn unfinished_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let (sql, binds) = list_query(filter, Some(RunStatus::Running), "ASC");
        self.fetch_runs(sql, binds, "listing unfinished runs").await
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let what = format!("reading the steps of run `{run_id}`");
        let rows = sqlx::query(concat!(
            "SELECT ",
            step_columns!(),
            " FROM steps WHERE run_id = $1 ORDER BY seq, number, attempt, iteration"
        ))
        .bind(run_id)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.ctx.error(&what, &e))?;
        rows.iter()
            .map(|r| decode_step(r).map_err(|m| self.corrupt(&what, m)))
            .collect()
    }

    async fn children(&self, run_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        let sql = concat!(
            "SELECT ",
            run_columns!(),
            " FROM run_records WHERE parent_run = $1 ORDER BY started_at, id"
        );
        self.fetch_runs(
            sql.to_string(),
            vec![run_id.to_string()],
            &format!("reading the children of run `{run_id}`"),
        )
        .await
    }

    async fn batch_runs(&self, batch: &str, from: u64, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let what = format!("reading the runs of batch `{batch}`");
        let from = i64::try_from(from).unwrap_or(i64::MAX);
        let limit_sql = i64::try_from(limit).unwrap_or(i64::MAX);
        // Head by head (a batch has one unless its flow changed), each read in input order
        // through `runs_by_head`, then merged: no page sorts the whole batch.
        let heads: Vec<i64> = sqlx::query_scalar("SELECT id FROM run_heads WHERE batch = $1 ORDER BY id")
            .bind(batch.to_string())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.ctx.error(&what, &e))?;
        let mut runs = Vec::new();
        for head in heads {
            let rows = sqlx::query(concat!(
                "SELECT ",
                run_columns!(),
                " FROM run_records WHERE head = $1 AND item_index >= $2 \
                 ORDER BY item_index, started_at, id LIMIT $3"
            ))
            .bind(head)
            .bind(from)
            .bind(limit_sql)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.ctx.error(&what, &e))?;
            for r in &rows {
                runs.push(decode_run(r).map_err(|m| self.corrupt(&what, m))?);
            }
        }
        runs.sort_by(|a, b| (a.item_index, a.started_at, &a.id).cmp(&(b.item_index, b.started_at, &b.id)));
        runs.truncate(limit);
        Ok(runs)
    }

    async fn take_run(&self, run_id: &str, writer: &RunWriter, lease: Duration) -> Result<(), StoreError> {
        self.take_writer(run_id, writer, lease).await
    }

    async fn renew_run(&self, run_id: &str, writer: &RunWriter, lease: Duration) -> Result<bool, StoreError> {
        self.renew_writer(run_id, writer, lease).await
    }

    async fn give_back_run(&self, run_id: &str, writer: &RunWriter) -> Result<(), StoreError> {
        self.give_back_writer(run_id, writer).await
    }
}

/// `SELECT` of runs matching `filter` (with `status` in its place), by start time. The status
/// is written out, not bound: a query for running runs then reads `runs_running`, the index
/// of those alone.
fn list_query(filter: &RunFilter, status: Option<RunStatus>, order: &str) -> (String, Vec<String>) {
    let mut sql = String::from(concat!("SELECT ", run_columns!(), " FROM run_records"));
    let mut binds = Vec::new();
    let mut conds = Vec::new();
    if let Some(s) = status {
        conds.push(format!("status = '{}'", s.as_str()));
    }
    if let Some(f) = &filter.flow {
        binds.push(f.clone());
        conds.push(format!("flow = ${}", binds.len()));
    }
    if filter.roots_only {
        conds.push("parent_run IS NULL".into());
    }
    if !filter.batches.is_empty() {
        let mut places = Vec::new();
        for b in &filter.batches {
            binds.push(b.clone());
            places.push(format!("${}", binds.len()));
        }
        conds.push(format!("batch IN ({})", places.join(", ")));
    }
    if !conds.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conds.join(" AND "));
    }
    sql.push_str(&format!(" ORDER BY started_at {order}, id {order}"));
    if let Some(limit) = filter.limit {
        sql.push_str(&format!(" LIMIT {limit}"));
    }
    (sql, binds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_query_binds_what_it_filters_on() {
        let f = RunFilter {
            status: Some(RunStatus::Failed),
            flow: Some("triage".into()),
            limit: Some(3),
            roots_only: true,
            batches: vec!["/a/out.jsonl".into(), "/b/out.jsonl".into()],
        };
        let (sql, binds) = list_query(&f, f.status, "DESC");
        assert!(
            sql.ends_with(
                " FROM run_records WHERE status = 'failed' AND flow = $1 AND parent_run IS NULL AND batch IN ($2, $3) \
                 ORDER BY started_at DESC, id DESC LIMIT 3"
            ),
            "{sql}"
        );
        assert_eq!(binds, ["triage", "/a/out.jsonl", "/b/out.jsonl"]);
        let (sql, binds) = list_query(&RunFilter::default(), None, "ASC");
        assert!(
            sql.ends_with(" FROM run_records ORDER BY started_at ASC, id ASC"),
            "{sql}"
        );
        assert!(binds.is_empty());
    }
}
