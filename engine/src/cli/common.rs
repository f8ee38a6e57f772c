//! Flags and helpers shared by the commands that run flows.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::model::AgentKind;
use crate::plan::AgentChanges;
use crate::plan::Plan;
use crate::record::RunRecord;
use crate::runtime::engine::RunOptions;
use crate::store::Store;

/// `--store URL`.
#[derive(clap::Args, Debug, Clone)]
pub struct StoreArg {
    /// Where runs are recorded: `sqlite:PATH`, `postgres://...` or `memory` (kept by nothing).
    #[arg(long = "store", env = "SWITCHYARD_STORE", default_value = crate::store::any::DEFAULT_STORE, value_name = "URL")]
    pub url: String,
}

impl StoreArg {
    /// Opens the store, or says why not.
    pub async fn open(&self) -> Result<crate::store::any::AnyStore, String> {
        crate::store::any::AnyStore::open(&self.url)
            .await
            .map_err(open_error)
    }

    /// The exit status when the store cannot be opened: usage (2) for a URL of no known
    /// form, failure (1) for a store that is there but cannot be opened.
    pub fn open_failed(&self) -> u8 {
        if self.url != "memory" && crate::store::sql::check_url(&self.url).is_err() {
            super::exit::USAGE
        } else {
            super::exit::FAILED
        }
    }

    /// Opens a store that is there already, for a command that only reads or updates what
    /// was recorded (`runs`, `resume`): a SQLite file that does not exist is not created,
    /// so a mistyped path says so instead of showing an empty store ([`Missing::File`], with
    /// what to say).
    pub async fn open_existing(&self) -> Result<crate::store::any::AnyStore, Missing> {
        self.check_exists()?;
        self.open().await.map_err(Missing::Error)
    }

    /// [`StoreArg::open_existing`] only to read (`runs list`, `runs show`): a store this
    /// process may not write is read all the same.
    pub async fn open_to_read(&self) -> Result<crate::store::any::AnyStore, Missing> {
        self.check_exists()?;
        crate::store::any::AnyStore::open_read_only(&self.url)
            .await
            .map_err(|e| Missing::Error(e.to_string()))
    }

    fn check_exists(&self) -> Result<(), Missing> {
        if let Some(path) = crate::store::sql::sqlite_file(&self.url)
            && !path.exists()
        {
            return Err(Missing::File(format!(
                "no store at {}: nothing has been recorded there{}",
                path.display(),
                if self.url == crate::store::any::DEFAULT_STORE {
                    " yet (the default store; --store names another)"
                } else {
                    ""
                }
            )));
        }
        Ok(())
    }

    /// Opens the store for a batch ([`crate::store::any::AnyStore::open_for_batch`]).
    pub async fn open_for_batch(&self) -> Result<crate::store::any::AnyStore, String> {
        crate::store::any::AnyStore::open_for_batch(&self.url)
            .await
            .map_err(open_error)
    }
}

/// Why [`StoreArg::open_existing`] opened nothing.
#[derive(Debug)]
pub enum Missing {
    /// The store's file is not there.
    File(String),
    /// It could not be opened.
    Error(String),
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::File(m) | Missing::Error(m) => f.write_str(m),
        }
    }
}

impl StoreArg {
    /// ` --store URL` for a command printed as a hint, when the store is not the default
    /// one (nor `memory`, whose runs do not outlive the process): the URL with its password
    /// hidden, quoted for a POSIX shell.
    pub fn hint(&self) -> String {
        if self.url == crate::store::any::DEFAULT_STORE || self.url == "memory" {
            return String::new();
        }
        format!(" --store {}", shell_word(&crate::store::sql::redact(&self.url)))
    }
}

/// `word` as one POSIX shell word: as it is when it holds nothing the shell reads specially,
/// else in single quotes.
pub fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

fn open_error(e: crate::store::StoreError) -> String {
    match e {
        crate::store::StoreError::Open { .. } => format!(
            "{e}\n  help: record elsewhere with --store sqlite:PATH, or keep nothing with --store memory"
        ),
        e => e.to_string(),
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Caller-given context as JSON, visible as `context` and passed to nested flows unchanged.
    #[arg(long)]
    pub context: Option<String>,
    /// Agent kinds the run may use (comma-separated: llm,command,http,flow,transform,mock);
    /// intersected with every flow's `allow`.
    #[arg(long, value_delimiter = ',')]
    pub allow: Option<Vec<String>>,
    /// A YAML file of runtime agent changes (SPEC §8.4).
    #[arg(long)]
    pub agent_change: Option<PathBuf>,
    /// The project root that file paths may not leave; default the flow's directory.
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// A JSON file holding the run's conversation: an array of {"role", "content"} messages
    /// (`llm` agents see them by their `message_mode`; nested flows get them too).
    #[arg(long, value_name = "FILE")]
    pub messages: Option<PathBuf>,
    /// Hosts `http` and `llm` agents may reach (comma-separated: `api.example.com`,
    /// `host:8443`, `*.example.com`); others fail with kind `capability`. Applies on top of
    /// every flow's `allow_hosts`.
    #[arg(long, value_delimiter = ',', value_name = "HOSTS")]
    pub allow_hosts: Option<Vec<String>>,
    /// At most this many step executions per run, iterations included (`limits.max_steps`;
    /// only narrows the flow's).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_steps: Option<u64>,
    /// A time bound for the run (`limits.timeout`: `30s`, `5m`, `250ms`; only narrows the
    /// flow's).
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout)]
    pub timeout: Option<std::time::Duration>,
    /// How deep `flow` agents may nest (`limits.max_depth`; only narrows the flow's).
    #[arg(long, value_name = "N")]
    pub max_depth: Option<u64>,
    /// The largest payload a run may hold (`limits.max_payload_bytes`: `64KiB`, `1MB`,
    /// `4096`; only narrows the flow's).
    #[arg(long, value_name = "SIZE", value_parser = parse_payload_size)]
    pub max_payload_bytes: Option<u64>,
    /// The largest file a step may make or read through `file()` (`limits.max_file_bytes`:
    /// `1MiB`, `4096`; only narrows the flow's).
    #[arg(long, value_name = "SIZE", value_parser = parse_file_size)]
    pub max_file_bytes: Option<u64>,
    /// All the bytes of the files a run may make (`limits.max_run_file_bytes`; only narrows
    /// the flow's).
    #[arg(long, value_name = "SIZE", value_parser = parse_file_size)]
    pub max_run_file_bytes: Option<u64>,
    /// A directory `file("path")` may read from besides the project root (repeatable).
    #[arg(long = "files-root", value_name = "DIR")]
    pub files_roots: Vec<PathBuf>,
}

/// `--now`: RFC 3339, to the microsecond at most.
pub fn parse_now(s: &str) -> Result<crate::expr::time::Timestamp, String> {
    crate::model::build::parse_now(s)
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    match crate::model::build::parse_duration(s) {
        Some(d) if !d.is_zero() => Ok(d),
        Some(_) => Err("a timeout of zero would stop every run before its first step".into()),
        None => Err(format!("`{s}` is not a duration (`250ms`, `30s`, `1.5m`, `2h`)")),
    }
}

fn parse_file_size(s: &str) -> Result<u64, String> {
    crate::model::build::parse_size(s).ok_or_else(|| format!("`{s}` is not a size (`4096`, `64KiB`, `1MB`)"))
}

fn parse_payload_size(s: &str) -> Result<u64, String> {
    match crate::model::build::parse_size(s) {
        Some(n) if n > 0 => Ok(n),
        Some(_) => Err("a payload limit of zero bytes fits no payload".into()),
        None => Err(format!("`{s}` is not a size (`4096`, `64KiB`, `1MB`)")),
    }
}

impl RunArgs {
    /// Narrows the plan's top flow by `--max-steps`, `--timeout`, `--max-depth` and
    /// `--max-payload-bytes`; warns of each flag that is looser than the flow, which it does
    /// not loosen.
    pub fn narrow_limits(&self, flow: &mut crate::api::Flow) {
        let flags = crate::plan::NarrowLimits {
            max_steps: self.max_steps,
            max_depth: self.max_depth,
            timeout: self.timeout,
            max_payload_bytes: self.max_payload_bytes,
            max_file_bytes: self.max_file_bytes,
            max_run_file_bytes: self.max_run_file_bytes,
        };
        let looser = flow
            .narrow_limits(&flags)
            .expect("a flow just loaded is not shared");
        for (flag, flow) in looser {
            let field = flag.trim_start_matches("--").replace('-', "_");
            tracing::warn!(
                "{flag} is looser than the flow's limits.{field} ({flow}), which applies: the flag only narrows it"
            );
        }
    }

    /// The directories `file()` reads under: the project root (`--root`, else the top flow's
    /// directory), then each `--files-root`, canonical.
    fn files_roots(&self, plan: &Plan) -> Result<Vec<PathBuf>, String> {
        let project = match &plan.root().path {
            Some(flow) => crate::project::root_of(flow, self.root.clone()),
            None => crate::project::root_of(Path::new("flow.yaml"), self.root.clone()),
        };
        let mut roots = vec![project];
        for r in &self.files_roots {
            let real = r
                .canonicalize()
                .map_err(|e| format!("--files-root `{}`: {e}", r.display()))?;
            if !real.is_dir() {
                return Err(format!("--files-root `{}` is not a directory", r.display()));
            }
            roots.push(real);
        }
        Ok(roots)
    }

    /// The context value and run options, validated.
    pub fn options(&self, plan: &Plan) -> Result<(Value, RunOptions), String> {
        self.options_for(plan, None)
    }

    /// The run options of a resume of `run` (SPEC §8.4): the agent changes it started with
    /// apply again without --agent-change; an --agent-change other than those is refused.
    pub fn resume_options(&self, plan: &Plan, run: &RunRecord) -> Result<RunOptions, String> {
        self.options_for(plan, Some(run)).map(|(_, o)| o)
    }

    /// The agent changes of a run: --agent-change's; for a resume of `resumed`, those it
    /// recorded, which an --agent-change must repeat (SPEC §8.4: a resume never swaps or
    /// drops them).
    fn agent_changes(&self, plan: &Plan, resumed: Option<&RunRecord>) -> Result<Arc<AgentChanges>, String> {
        let given = match &self.agent_change {
            Some(path) => {
                let bytes = std::fs::read(path)
                    .map_err(|e| format!("cannot read --agent-change `{}`: {e}", path.display()))?;
                let text = crate::json::text_of(&bytes).map_err(|e| {
                    format!(
                        "--agent-change `{}` is not UTF-8 text: {} (line {}, column {})",
                        path.display(),
                        e.cause(),
                        e.line(),
                        e.column()
                    )
                })?;
                crate::runtime::changes::load(&path.display().to_string(), text, plan)?
            }
            None => AgentChanges::default(),
        };
        let given = Arc::new(given);
        match resumed {
            None => Ok(given),
            Some(run) => {
                crate::runtime::changes::for_resume(plan, run, given, false).map_err(|e| e.to_string())
            }
        }
    }

    fn options_for(&self, plan: &Plan, resumed: Option<&RunRecord>) -> Result<(Value, RunOptions), String> {
        let context = match &self.context {
            Some(text) => {
                crate::json::from_str(text).map_err(|e| format!("--context is not valid JSON: {e}"))?
            }
            None => Value::Object(Default::default()),
        };
        let allow = match &self.allow {
            Some(kinds) => Some(
                kinds
                    .iter()
                    .filter(|k| !k.is_empty())
                    .map(|k| {
                        AgentKind::parse(k.trim()).ok_or_else(|| {
                            let kinds: Vec<&str> = AgentKind::ALL.iter().map(|k| k.as_str()).collect();
                            format!("--allow: unknown agent kind `{k}` (kinds: {})", kinds.join(", "))
                        })
                    })
                    .collect::<Result<BTreeSet<_>, _>>()?,
            ),
            None => None,
        };
        let agent_changes = self.agent_changes(plan, resumed)?;
        // Secrets are read at each call; a variable that is not set fails now, before any
        // step runs, rather than at the first call.
        crate::agents::secrets::check_env(plan, &agent_changes)?;
        let messages = match &self.messages {
            Some(path) => {
                let bytes = std::fs::read(path)
                    .map_err(|e| format!("cannot read --messages `{}`: {e}", path.display()))?;
                let v: Value = crate::json::from_slice(&bytes).map_err(|e| {
                    format!(
                        "--messages `{}` is not valid JSON: {e} (line {}, column {})",
                        path.display(),
                        e.line(),
                        e.column()
                    )
                })?;
                crate::agents::llm::check_conversation(&v)
                    .map_err(|e| format!("--messages `{}`: {e}", path.display()))?
            }
            None => Vec::new(),
        };
        let allow_hosts = self.allow_hosts.as_ref().map(|hosts| {
            hosts
                .iter()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
                .collect()
        });
        Ok((
            context,
            RunOptions {
                allow,
                agent_changes,
                messages: Arc::new(messages),
                allow_hosts,
                max_cost_usd: None,
                shared_budget: None,
                now: None,
                origin: crate::record::Origin::Cli,
                files_roots: Arc::new(self.files_roots(plan)?),
            },
        ))
    }
}

/// The run input from `--input` or `--input-file` (`-`: stdin); `{}` when neither is given.
pub fn read_input(input: Option<&str>, file: Option<&Path>) -> Result<Value, String> {
    // Read as bytes: text that is not UTF-8 is an error naming where, as a JSON error is.
    let (bytes, what) = match (input, file) {
        (Some(t), _) => (t.as_bytes().to_vec(), "--input".to_string()),
        (None, Some(p)) if p == Path::new("-") => {
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
                .map_err(|e| format!("cannot read stdin: {e}"))?;
            (b, "stdin".to_string())
        }
        (None, Some(p)) => (
            std::fs::read(p).map_err(|e| format!("cannot read `{}`: {e}", p.display()))?,
            format!("`{}`", p.display()),
        ),
        (None, None) => return Ok(Value::Object(Default::default())),
    };
    crate::json::from_slice(&bytes).map_err(|e| {
        format!(
            "{what} is not valid JSON: {} (line {}, column {})",
            e.cause(),
            e.line(),
            e.column()
        )
    })
}

/// A multi-threaded tokio runtime for one command.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime starts")
}

/// Says what is wrong on stderr: a usage error (exit 2).
pub(super) fn fail(e: impl std::fmt::Display) -> u8 {
    super::stderr::error(e);
    super::exit::USAGE
}

/// The root run of `run`'s tree (`run` itself for a root run).
pub(super) async fn root_of<S: Store>(store: &S, run: &RunRecord) -> Result<RunRecord, String> {
    let mut root = run.clone();
    while let Some(parent) = root.parent_run.clone() {
        root = store.get_run(&parent).await.map_err(|e| e.to_string())?;
    }
    Ok(root)
}

/// Locks the batch that `root` (the root of run `run_id`'s tree) belongs to, for as long as
/// the lock is held: a `batch` process writing it works on its runs itself, and is refused
/// while this command does. Refuses to `act` on the run while that batch runs.
pub(super) fn lock_batch(
    root: &RunRecord,
    run_id: &str,
    act: &str,
) -> Result<crate::batch::BatchLock, String> {
    crate::batch::lock_batch_of(root).map_err(|e| match e {
        crate::batch::BatchError::Busy { path, holder } => {
            let by = match holder {
                Some(pid) => format!(
                    "run `{run_id}` is being run by another process (pid {pid}, host {})",
                    crate::store::writers::host_name()
                ),
                None => format!("run `{run_id}` is being run by another process"),
            };
            format!(
                "{by}: it is an item of the batch writing {path}, which a `switchyard batch` process is \
                 running now and continues the run itself: stop that batch (Ctrl-C) before you {act} the run here"
            )
        }
        other => other.to_string(),
    })
}

/// How a command uses the store.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Use {
    Read,
    Write,
}

/// Runs `f` with the opened store on a runtime, closing the store after. A store that is
/// not there is not created ([`StoreArg::open_existing`]); one opened only to read may be
/// read-only ([`StoreArg::open_to_read`]).
pub(super) fn with_store<T>(
    store: &StoreArg,
    to: Use,
    f: impl AsyncFnOnce(&Arc<crate::store::any::AnyStore>) -> T,
) -> Result<T, Missing> {
    let rt = runtime();
    rt.block_on(async {
        let store = Arc::new(match to {
            Use::Read => store.open_to_read().await?,
            Use::Write => store.open_existing().await?,
        });
        let out = f(&store).await;
        if let Ok(s) = Arc::try_unwrap(store) {
            s.close().await;
        }
        Ok(out)
    })
}

/// An `--http` address: `127.0.0.1:PORT`, `[::1]:PORT` or `localhost:PORT` (`serve`, `mcp serve`).
pub(crate) fn parse_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Some(port) = s.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| format!("`{port}` is not a port"))?;
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse()
        .map_err(|_| format!("`{s}` is not an address with a port (`127.0.0.1:8787`)"))
}
