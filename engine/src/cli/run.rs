//! `switchyard run FLOW`: one run, in-process, output JSON on stdout.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use super::common::{self, RunArgs, StoreArg};
use crate::runtime::engine::{Engine, RunOutcome};
use crate::runtime::record::RunStatus;

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
    /// A cost budget in USD for the run and its child runs: once spent, no new agent call
    /// starts (the step fails with kind `limit`). On top of the flows' `limits.max_cost_usd`.
    #[arg(long, value_name = "USD")]
    pub max_cost_usd: Option<f64>,
    #[command(flatten)]
    pub common: RunArgs,
    #[command(flatten)]
    pub store: StoreArg,
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
    let (context, mut options) = match args.common.options(&plan) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            return super::exit::USAGE;
        }
    };
    if let Some(v) = args.max_cost_usd {
        if !(v.is_finite() && v >= 0.0) {
            eprintln!("error: --max-cost-usd must be a number of dollars, 0 or more (got {v})");
            return super::exit::USAGE;
        }
        options.max_cost_usd = Some(v);
    }
    let plan = Arc::new(plan);
    let rt = common::runtime();
    let store = match rt.block_on(args.store.open()) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("error: {e}");
            return super::exit::FAILED;
        }
    };
    let engine = Engine::new(store.clone());
    let outcome = rt.block_on(engine.run(plan, input, context, options));
    if args.trace {
        let tree = rt.block_on(super::trace::render(
            &*store,
            &outcome.run_id,
            super::color_stderr(),
        ));
        eprint!("{tree}");
    }
    drop(engine);
    if let Ok(store) = Arc::try_unwrap(store) {
        rt.block_on(store.close());
    }
    report(outcome)
}

/// Prints a finished run's output (stdout) or error (stderr); returns the exit code.
pub(crate) fn report(outcome: RunOutcome) -> u8 {
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
            match &outcome.error {
                Some(e) => eprintln!("interrupted[{}]: {}", e.kind, e.message),
                None => eprintln!("interrupted: run `{}` waits for a decision", outcome.run_id),
            }
            eprintln!(
                "  continue it with `switchyard resume {} {}`",
                outcome.run_id,
                if outcome.error.is_some() {
                    "--retry-in-doubt"
                } else {
                    "--decision JSON"
                }
            );
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
