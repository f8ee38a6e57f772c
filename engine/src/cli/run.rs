//! `switchyard run FLOW`: one run, in-process, output JSON on stdout.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use super::common::{self, RunArgs};
use crate::runtime::engine::Engine;
use crate::runtime::record::RunStatus;
use crate::store::memory::MemoryStore;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Exit status: 0 succeeded, 1 the run failed, 2 invalid flow or usage, 3 interrupted.\n\
                        The output JSON goes to stdout; errors, --trace and logs go to stderr."
)]
pub struct Args {
    /// The flow file.
    pub flow: PathBuf,
    /// The run input, as JSON text.
    #[arg(long, conflicts_with = "input_file")]
    pub input: Option<String>,
    /// A file holding the run input as JSON (`-` for stdin).
    #[arg(long)]
    pub input_file: Option<PathBuf>,
    /// Print the step tree (numbers, ids, status, duration, route, iterations) to stderr.
    #[arg(long)]
    pub trace: bool,
    #[command(flatten)]
    pub common: RunArgs,
}

pub fn run(args: Args) -> u8 {
    let Some(plan) = super::graph::load_plan(&args.flow, args.common.root.clone()) else {
        return super::exit::USAGE;
    };
    let input = match common::read_input(args.input.as_deref(), args.input_file.as_deref()) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return super::exit::USAGE;
        }
    };
    let (context, options) = match args.common.options(&plan) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            return super::exit::USAGE;
        }
    };
    let plan = Arc::new(plan);
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone());
    let rt = common::runtime();
    let outcome = rt.block_on(engine.run(plan, input, context, options));
    if args.trace {
        let tree = rt.block_on(super::trace::render(
            &*store,
            &outcome.run_id,
            super::color_stderr(),
        ));
        eprint!("{tree}");
    }
    match outcome.status {
        RunStatus::Succeeded => {
            let out = outcome.output.unwrap_or(Value::Null);
            println!(
                "{}",
                serde_json::to_string_pretty(&out).expect("JSON values serialize")
            );
            super::exit::OK
        }
        RunStatus::Interrupted => {
            eprintln!("interrupted: run `{}` waits for a decision", outcome.run_id);
            super::exit::INTERRUPTED
        }
        status => {
            if let Some(e) = &outcome.error {
                eprintln!("error[{}]: {}", e.kind, e.message);
            } else {
                eprintln!("error: the run ended {}", status.as_str());
            }
            eprintln!(
                "  run `{}` {} after {} steps",
                outcome.run_id,
                status.as_str(),
                outcome.steps
            );
            super::exit::FAILED
        }
    }
}
