//! `switchyard run FLOW`: one run, in-process, output JSON on stdout.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use std::fmt::Write as _;

use super::common::{self, RunArgs, StoreArg};
use super::stderr::{self, Level};
use crate::api::{RunConfig, Switchyard};
use crate::record::ErrorKind;
use crate::record::RunStatus;
use crate::runtime::engine::{RunControls, RunOutcome};
use crate::runtime::resume::{Approval, Question, WaitingFor};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Exit status: 0 succeeded, 1 the run failed, 2 invalid flow or usage, 3 interrupted, 130 stopped \
                  by Ctrl-C.\n\
                  The output JSON goes to stdout; errors, --trace and logs go to stderr.\n\
                  Ctrl-C stops the run at its next recorded point (the steps in flight finish and are recorded); \
                  `switchyard resume RUN_ID` continues it. Ctrl-C again quits at once."
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
    /// The run's `now` for expressions (RFC 3339: `2026-03-01T09:00:00Z`), recorded with the
    /// run; default the time it starts. For replaying what a run did at a given time.
    #[arg(long, value_name = "TIMESTAMP", value_parser = common::parse_now)]
    pub now: Option<crate::expr::time::Timestamp>,
    #[command(flatten)]
    pub common: RunArgs,
    #[command(flatten)]
    pub store: StoreArg,
}

pub fn run(args: Args) -> u8 {
    let Some(mut flow) = super::graph::load_flow(&args.flow, args.common.root.clone()) else {
        return super::exit::USAGE;
    };
    args.common.narrow_limits(&mut flow);
    let input = match common::read_input(args.input.as_deref(), args.input_file.as_deref()) {
        Ok(v) => v,
        Err(e) => {
            stderr::error(e);
            return super::exit::USAGE;
        }
    };
    let (context, mut options) = match args.common.options(flow.plan()) {
        Ok(x) => x,
        Err(e) => {
            stderr::error(e);
            return super::exit::USAGE;
        }
    };
    if let Some(v) = args.max_cost_usd {
        if !(v.is_finite() && v >= 0.0) {
            stderr::error(format!(
                "--max-cost-usd must be a number of dollars, 0 or more (got {v})"
            ));
            return super::exit::USAGE;
        }
        options.max_cost_usd = Some(v);
    }
    options.now = args.now;
    let rt = common::runtime();
    let store = match rt.block_on(args.store.open()) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            stderr::error(e);
            return args.store.open_failed();
        }
    };
    let switchyard = Switchyard::with_store(store.clone());
    let controls = RunControls::default();
    let outcome = rt.block_on(async {
        pause_on_ctrl_c(&controls);
        let config = RunConfig {
            context: Some(context),
            options,
            controls,
        };
        switchyard.run_with(&flow, input, config).await
    });
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            stderr::error(e);
            return super::exit::USAGE;
        }
    };
    if args.trace {
        let tree = rt.block_on(super::trace::render(
            &*store,
            &outcome.run_id,
            super::color_stderr(),
        ));
        stderr::say(
            Level::Info,
            "trace",
            &tree,
            serde_json::json!({"run_id": outcome.run_id}),
        );
    }
    drop(switchyard);
    if let Ok(store) = Arc::try_unwrap(store) {
        rt.block_on(store.close());
    }
    report(outcome, &args.store)
}

/// What a run stopped at an agent loop's approval waits for: the tools the loop wants to
/// call, each call (tool and arguments), and the decision's shape.
fn approval_wait(text: &mut String, id: &str, w: &WaitingFor, a: &Approval, child: &str) -> std::fmt::Result {
    let calls = &a.calls;
    let mut tools: Vec<&str> = calls.iter().map(|c| c.tool.as_str()).collect();
    tools.dedup();
    let tools = tools
        .iter()
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let what = if calls.len() == 1 {
        format!("a call of {tools}")
    } else {
        format!("{} calls of {tools}", calls.len())
    };
    let agent = if a.agent.is_empty() {
        String::new()
    } else if crate::record::loop_split(&w.number).is_some() {
        format!(" by agent loop `{}`", a.agent)
    } else {
        // A plain step's call (SPEC §6.4).
        format!(" by agent `{}`", a.agent)
    };
    writeln!(
        text,
        "interrupted: run `{id}` waits for approval of {what}{agent} at step `{}`{child}",
        w.step
    )?;
    for (i, c) in calls.iter().enumerate() {
        let tool = if c.tool.is_empty() { "?" } else { &c.tool };
        writeln!(text, "  call {}: {} {}", i + 1, tool, c.arguments)?;
    }
    let forms = r#"{"approve": true}, {"edit": {<arguments>}} or {"reject": "why"}"#;
    if calls.len() > 1 {
        writeln!(
            text,
            "  the decision: a list of {} decisions, in order, each {forms}",
            calls.len()
        )
    } else {
        writeln!(text, "  the decision: {forms}")
    }
}

/// Prints a finished run's output (stdout) or error (stderr); returns the exit code. An
/// interrupted run is told how to continue: with a decision when it `waits` at an interrupt
/// (its own or a child run's), with `--retry-in-doubt` when an attempt is in doubt, and with
/// the `store` it is recorded in.
/// Ctrl-C: the run stops at its next recorded point, to be resumed. Again: now. Called
/// within the runtime that runs the run.
pub(super) fn pause_on_ctrl_c(controls: &RunControls) {
    let pause = controls.pause.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stderr::say(
                Level::Warn,
                "stopping",
                "\nstopping: the steps in flight finish and are recorded (Ctrl-C again to quit now)",
                Value::Null,
            );
            pause.cancel();
            if tokio::signal::ctrl_c().await.is_ok() {
                stderr::say(
                    Level::Warn,
                    "quit",
                    "quit: `switchyard resume RUN_ID` continues the run (`switchyard runs list` names it)",
                    Value::Null,
                );
                // exit skips destructors: the MCP servers are ended here, commands' directories removed.
                crate::agents::mcp::shutdown();
                crate::agents::command::remove_live_dirs();
                std::process::exit(130);
            }
        }
    });
}

pub(crate) fn report(outcome: RunOutcome, store: &StoreArg) -> u8 {
    let id = &outcome.run_id;
    let waiting = outcome.waiting.as_ref();
    let fields = |status: &str| {
        serde_json::json!({
            "run_id": id,
            "status": status,
            "steps": outcome.steps,
            "error": outcome.error.as_ref().map(crate::record::StepError::to_json),
        })
    };
    match outcome.status {
        RunStatus::Succeeded => {
            let out = outcome.output.clone().unwrap_or(Value::Null);
            println!(
                "{}",
                serde_json::to_string_pretty(&out).expect("JSON values serialize")
            );
            super::exit::OK
        }
        RunStatus::Interrupted => {
            let mut text = String::new();
            let in_doubt = outcome
                .error
                .as_ref()
                .is_some_and(|e| e.kind == ErrorKind::InDoubt);
            let _ = match (&outcome.error, waiting) {
                (Some(e), _) if in_doubt => writeln!(text, "interrupted[{}]: {}", e.kind, e.message),
                (_, Some(w)) => {
                    let child = if w.run_id == *id {
                        String::new()
                    } else {
                        format!(" of child run `{}` (flow `{}`)", w.run_id, w.flow)
                    };
                    match &w.question {
                        Question::Approval(a) => approval_wait(&mut text, id, w, a, &child),
                        Question::Elicitation(e) => writeln!(
                            text,
                            "interrupted: run `{id}` waits for an answer to MCP server `{}` (tool `{}`) at step `{}`{child}\n  asks: {}\n  answer schema: {}\n  decision: a value of that schema, or {{\"reject\": \"why\"}} to decline",
                            e.server, e.tool, w.step, e.message, e.schema
                        ),
                        _ => writeln!(
                            text,
                            "interrupted: run `{id}` waits for a decision at interrupt step `{}`{child}",
                            w.step
                        ),
                    }
                }
                (Some(e), None) => writeln!(text, "interrupted[{}]: {}", e.kind, e.message),
                (None, None) => writeln!(text, "interrupted: run `{id}` waits for a decision"),
            };
            if store.url == "memory" {
                text.push_str(
                    "  with `--store memory` nothing of the run was kept: run it on a durable store (the \
                     default SQLite one) to resume it\n",
                );
            } else {
                // A decision answers an interrupt of this run or of a child run: it is given
                // to this one, the root.
                let mut flags = String::new();
                if waiting.is_some() || outcome.error.is_none() {
                    flags.push_str(" --decision JSON");
                }
                if in_doubt {
                    flags.push_str(" --retry-in-doubt");
                }
                flags.push_str(&store.hint());
                let _ = writeln!(text, "  continue it with `switchyard resume {id}{flags}`");
                match waiting {
                    Some(WaitingFor {
                        question: Question::Approval(_),
                        ..
                    }) => {
                        let _ = writeln!(
                            text,
                            "  `switchyard runs show {id}{}` shows the proposed calls",
                            store.hint()
                        );
                    }
                    Some(_) => {
                        let _ = writeln!(
                            text,
                            "  `switchyard runs show {id}{}` shows the question and the schema the decision must match",
                            store.hint()
                        );
                    }
                    None => {}
                }
            }
            stderr::say(
                Level::Warn,
                "run_interrupted",
                &text,
                fields(outcome.status.as_str()),
            );
            super::exit::INTERRUPTED
        }
        // Paused by Ctrl-C at a recorded point: the record stays `running`, to be resumed.
        RunStatus::Running => {
            let text = if store.url == "memory" {
                format!(
                    "stopped: run `{id}` after {} steps; with `--store memory` nothing of it was kept",
                    outcome.steps
                )
            } else {
                format!(
                    "stopped: run `{id}` is recorded up to its last finished step\n  continue it with \
                     `switchyard resume {id}{}`",
                    store.hint()
                )
            };
            stderr::say(Level::Warn, "run_stopped", &text, fields(outcome.status.as_str()));
            130
        }
        status => {
            let mut text = match &outcome.error {
                Some(e) => format!("error[{}]: {}\n", e.kind, e.message),
                None => format!("error: the run ended {}\n", status.as_str()),
            };
            let _ = write!(
                text,
                "  run `{id}` {} after {} steps",
                status.as_str(),
                outcome.steps
            );
            stderr::say(Level::Error, "run_failed", &text, fields(status.as_str()));
            super::exit::FAILED
        }
    }
}
