//! The command line: clap definitions, one file per subcommand. The only code that prints,
//! picks colours and chooses exit codes.

mod batch;
mod batches;
mod collect;
mod common;
mod explain;
mod graph;
mod lint;
mod mcp_check;
mod mcp_list;
mod mcp_serve;
mod report;
mod resume;
mod run;
mod runs;
mod runs_files;
mod schema;
mod serve;
mod stderr;
mod submit;
mod test;
mod trace;
mod worker;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit codes (SPEC §10).
pub mod exit {
    pub const OK: u8 = 0;
    /// A run or item failed; lint found errors.
    pub const FAILED: u8 = 1;
    /// Invalid flow or usage.
    pub const USAGE: u8 = 2;
    /// Runs left interrupted.
    pub const INTERRUPTED: u8 = 3;
}

#[derive(Parser, Debug)]
#[command(
    name = "switchyard",
    version,
    about = "A declarative flow-graph engine for agent pipelines",
    long_about = "Switchyard runs agent pipelines written as YAML flows: steps that call sub-agents, \
                  joined by success, failure and conditional edges, with foreach, while and \
                  parallel nodes. Check flows with `switchyard lint` before they run.",
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// More logs: -v run events, -vv step events, -vvv everything.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Export traces over OTLP/HTTP to this collector (`http://127.0.0.1:4318`; `/v1/traces`
    /// is added when the URL names no path): a span per run, step, iteration, model turn and
    /// tool call, one trace per root run. Never holds a run up: spans the collector does not
    /// take are dropped and counted.
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    /// One JSON object per event.
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check flows the way a compiler checks code: every problem, in one pass.
    Lint(lint::Args),
    /// Explain a lint code (`SY201`) or rule name (`unknown-step`), with examples.
    Explain(explain::Args),
    /// Draw a flow: Mermaid, Graphviz DOT, or an SVG picture laid out here.
    Graph(graph::Args),
    /// Print the JSON Schema of flow files.
    Schema(schema::Args),
    /// Run a flow once and print its output JSON.
    Run(run::Args),
    /// Run the `tests:` of flows with mocked agents.
    Test(test::Args),
    /// Run a flow once per line of a JSONL file; run it again after a crash to continue.
    Batch(batch::Args),
    /// Store a flow and one queued run per line of a JSONL file, for workers on any number of
    /// machines sharing one PostgreSQL database.
    Submit(submit::Args),
    /// Claim and run the queued runs of submitted batches; run one on each machine.
    Worker(worker::Args),
    /// Write a submitted batch's results, in input order, each line once.
    Collect(collect::Args),
    /// Show submitted batches: counts, cost, rate, ETA and live workers.
    Batches(batches::Args),
    /// Inspect and continue stored runs.
    Runs(runs::Args),
    /// Continue a stored run (the same as `runs resume`).
    Resume(resume::ResumeArgs),
    /// Write a batch's report: one self-contained HTML page of its items (counts, cost, the
    /// slowest and the failed ones by error kind), each linked to its run's page.
    Report(report::Args),
    /// The Model Context Protocol: list a flow's MCP servers and their tools, or serve flows
    /// as the tools of MCP clients.
    Mcp(McpArgs),
    /// Serve a store's inbox, runs and batches over HTTP: a JSON API under /v1, live events
    /// and pages.
    Serve(serve::Args),
}

#[derive(clap::Args, Debug)]
#[command(
    after_long_help = "A flow uses MCP servers' tools through `mcp_servers:` (see the README, \"Tools from MCP servers\"). \
`switchyard lint --mcp FLOW` starts them and checks the tools the flow names against what they list."
)]
pub struct McpArgs {
    #[command(subcommand)]
    pub command: McpCommand,
}

#[derive(Subcommand, Debug)]
pub enum McpCommand {
    /// Start each MCP server a flow defines and print the tools it lists: their input and
    /// output schemas and annotations.
    List(mcp_list::ListArgs),
    /// Serve flows as MCP tools, over stdio or Streamable HTTP: each call runs its flow.
    Serve(mcp_serve::Args),
}

/// Parses the command line and runs the command.
pub fn main() -> ExitCode {
    // Elsewhere than glibc there is nothing to set.
    let _ = crate::alloc::keep_freed_memory();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            if !e.use_stderr() {
                let _ = e.print();
                return ExitCode::from(exit::OK);
            }
            if asks_for_json_logs(std::env::args_os().skip(1)) {
                JSON_LOGS.store(true, std::sync::atomic::Ordering::Relaxed);
                let text = e.render().to_string();
                stderr::error(text.strip_prefix("error: ").unwrap_or(&text));
            } else {
                let _ = e.print();
            }
            return ExitCode::from(exit::USAGE);
        }
    };
    init_logging(cli.log_format, cli.verbose);
    // Commands that only print (no agent runs, no child processes) stop quietly when their
    // reader goes away (`switchyard runs list --json | head -1`), as other tools do, rather
    // than panic on the broken pipe. Their sockets (a PostgreSQL store) write with
    // MSG_NOSIGNAL, so the signal reaches only the standard streams.
    let prints_only = match &cli.command {
        Command::Lint(_)
        | Command::Explain(_)
        | Command::Graph(_)
        | Command::Schema(_)
        | Command::Batches(_) => true,
        Command::Runs(r) => matches!(
            r.command,
            runs::RunsCommand::List(_)
                | runs::RunsCommand::Show(_)
                | runs::RunsCommand::Export(_)
                | runs::RunsCommand::Files(_)
        ),
        _ => false,
    };
    if prints_only {
        // SAFETY: setting a signal's disposition to its default, before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let exporter = match cli.otlp_endpoint.as_deref().filter(|e| !e.trim().is_empty()) {
        None => None,
        Some(endpoint) => match crate::otel::Exporter::start(endpoint) {
            Ok(e) => {
                crate::runtime::observe::install(e.clone());
                Some(e)
            }
            Err(e) => {
                stderr::error(e);
                return ExitCode::from(exit::USAGE);
            }
        },
    };
    // Every MCP server the command starts ends with it, whichever way it ends.
    let mcp_servers = crate::agents::mcp::ShutdownGuard::new();
    let code = match cli.command {
        Command::Lint(a) => lint::run(a),
        Command::Explain(a) => explain::run(a),
        Command::Graph(a) => graph::run(a),
        Command::Schema(a) => schema::run(a),
        Command::Run(a) => run::run(a),
        Command::Test(a) => test::run(a),
        Command::Batch(a) => batch::run(a),
        Command::Submit(a) => submit::run(a),
        Command::Worker(a) => worker::run(a, exporter.as_deref()),
        Command::Collect(a) => collect::run(a),
        Command::Batches(a) => batches::run(a),
        Command::Runs(a) => runs::run(a),
        Command::Resume(a) => resume::resume(a),
        Command::Report(a) => report::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Mcp(a) => match a.command {
            McpCommand::List(a) => mcp_list::list(a),
            McpCommand::Serve(a) => mcp_serve::run(a),
        },
    };
    drop(mcp_servers);
    if let Some(e) = exporter {
        let (exported, dropped, why) = e.finish(std::time::Duration::from_secs(5));
        if dropped > 0 {
            stderr::say(
                stderr::Level::Warn,
                "otlp_dropped",
                &format!(
                    "otlp: {dropped} span(s) not exported to {} ({}); {exported} exported",
                    e.url(),
                    why.as_deref().unwrap_or("unknown")
                ),
                serde_json::json!({"exported": exported, "dropped": dropped, "url": e.url()}),
            );
        }
    }
    ExitCode::from(code)
}

/// Whether stdout should be coloured: a terminal, and `NO_COLOR` unset.
pub(crate) fn color_stdout() -> bool {
    use std::io::IsTerminal;
    std::env::var_os("NO_COLOR").is_none() && std::io::stdout().is_terminal()
}

/// Terminal width for rendering, or 100.
pub(crate) fn width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(100)
}

/// Whether stderr should be coloured: a terminal, and `NO_COLOR` unset.
pub(crate) fn color_stderr() -> bool {
    use std::io::IsTerminal;
    std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal()
}

/// Logs go to stderr: warnings by default, more with `-v`; `SWITCHYARD_LOG` (an
/// `EnvFilter` directive) overrides the level.
/// `--log-format json`: what commands print on stderr besides logs (a batch's progress and
/// summary) is then a JSON object per line too.
static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether stderr carries JSON lines (`--log-format json`).
pub(crate) fn json_logs() -> bool {
    JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether a command line that did not parse asked for `--log-format json`: its usage error
/// is then a JSON line too.
fn asks_for_json_logs(args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    let mut json = false;
    let mut value_next = false;
    for a in args {
        let a = a.to_string_lossy();
        if value_next {
            json = a == "json";
            value_next = false;
        } else if a == "--" {
            break;
        } else if a == "--log-format" {
            value_next = true;
        } else if let Some(v) = a.strip_prefix("--log-format=") {
            json = v == "json";
        }
    }
    json
}

fn init_logging(format: LogFormat, verbose: u8) {
    JSON_LOGS.store(
        matches!(format, LogFormat::Json),
        std::sync::atomic::Ordering::Relaxed,
    );
    use tracing_subscriber::EnvFilter;
    // sqlx's slow-statement warnings (a count over a million-run batch takes seconds) are
    // for `-vv`, not for every command's stderr; so are the MCP SDK's own logs (a server that
    // cannot be reached is told once, by the step's error).
    let level = match verbose {
        0 => "warn,sqlx::query=error,rmcp=off",
        1 => "switchyard=info,warn,sqlx::query=error,rmcp=off",
        2 => "switchyard=debug,info",
        _ => "trace",
    };
    let filter = std::env::var("SWITCHYARD_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().with_current_span(false).try_init(),
        LogFormat::Text => builder.with_ansi(color_stderr()).try_init(),
    };
}
