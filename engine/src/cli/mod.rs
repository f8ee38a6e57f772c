//! The command line: clap definitions, one file per subcommand. The only code that prints,
//! picks colours and chooses exit codes.

mod explain;
mod graph;
mod lint;
mod schema;

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
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check flows the way a compiler checks code: every problem, in one pass.
    Lint(lint::Args),
    /// Explain a lint code (`SY201`) or rule name (`unknown-step`), with examples.
    Explain(explain::Args),
    /// Draw a flow as a Mermaid or Graphviz diagram.
    Graph(graph::Args),
    /// Print the JSON Schema of flow files.
    Schema(schema::Args),
}

/// Parses the command line and runs the command.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { exit::OK };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let code = match cli.command {
        Command::Lint(a) => lint::run(a),
        Command::Explain(a) => explain::run(a),
        Command::Graph(a) => graph::run(a),
        Command::Schema(a) => schema::run(a),
    };
    ExitCode::from(code)
}

/// Whether stdout should be coloured: a terminal, and `NO_COLOR` unset.
pub(crate) fn color_stdout() -> bool {
    use std::io::IsTerminal;
    std::env::var_os("NO_COLOR").is_none() && std::io::stdout().is_terminal()
}

/// Terminal width for rendering, or 100.
pub(crate) fn width() -> usize {
    std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()).unwrap_or(100)
}

/// Whether stderr should be coloured: a terminal, and `NO_COLOR` unset.
pub(crate) fn color_stderr() -> bool {
    use std::io::IsTerminal;
    std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal()
}
