//! The Switchyard benchmark harness (BENCH.md).
//!
//! ```text
//! cargo run --release --example bench -- [--profile quick|full] [--only W5,W5x,W7,W9] [--breakdown]
//! ```
//!
//! Prints one JSON object per line on stdout and nothing else there; progress and diagnostics
//! go to stderr. Each workload is a module with a `run(&Profile, &Options)` returning its
//! [`Report`]s; [`WORKLOADS`] lists the implemented ones, in BENCH.md's order. A workload that
//! needs a fresh process re-executes this binary with the hidden `--child NAME ARGS...`
//! (see [`CHILDREN`]).
//!
//! Adding a workload: a module `wN_name.rs` with `pub const ID`, `pub fn run`, its sizes in
//! [`Profile`], one line in [`WORKLOADS`], and a section in `README.md`.

mod batch_bin;
mod discard;
mod profile;
mod report;
mod util;
mod w10_long;
mod w10w_while;
mod w11_workers;
mod w12_loops;
mod w13_mcp;
mod w14_files;
mod w15_inbox;
mod w1_chain;
mod w2_branch;
mod w3_foreach;
mod w4_while;
mod w5_batch;
mod w5_binary;
mod w5x_wide;
mod w6_build;
mod w7_durable;
mod w8_lint;
mod w9_resume;

use std::process::ExitCode;

use profile::Profile;
use report::Report;

/// Options every workload sees.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Also time each phase separately (in extra, untimed child processes) and print the
    /// breakdown to stderr. Automatic when a workload misses its target.
    pub breakdown: bool,
    /// Keep the generated inputs under `examples/bench/generated/` after the run.
    pub keep_generated: bool,
}

type RunFn = fn(&Profile, &Options) -> Result<Vec<Report>, String>;
type ChildFn = fn(&[String]) -> Result<(), String>;

/// The implemented workloads, in the order they run. W5 has two entries, its variants
/// `in-process` and `batch-binary`: `--only W5` runs both, and one failing does not stop the other.
const WORKLOADS: &[(&str, RunFn)] = &[
    (w1_chain::ID, w1_chain::run),
    (w2_branch::ID, w2_branch::run),
    (w3_foreach::ID, w3_foreach::run),
    (w4_while::ID, w4_while::run),
    (w5_batch::ID, w5_batch::run),
    (w5_binary::ID, w5_binary::run),
    (w5x_wide::ID, w5x_wide::run),
    (w6_build::ID, w6_build::run),
    (w7_durable::ID, w7_durable::run),
    (w8_lint::ID, w8_lint::run),
    (w9_resume::ID, w9_resume::run),
    (w10_long::ID, w10_long::run),
    (w10w_while::ID, w10w_while::run),
    (w11_workers::ID, w11_workers::run),
    (w12_loops::ID, w12_loops::run),
    (w13_mcp::ID, w13_mcp::run),
    (w14_files::ID, w14_files::run),
    (w15_inbox::ID, w15_inbox::run),
];

/// Measured child processes: `--child NAME ARGS...`.
const CHILDREN: &[(&str, ChildFn)] = &[
    ("w1-repeat", w1_chain::child_repeat),
    ("w2-repeat", w2_branch::child_repeat),
    ("w3-repeat", w3_foreach::child_repeat),
    ("w4-repeat", w4_while::child_repeat),
    ("w6", w6_build::child),
    ("w6-phases", w6_build::child_phases),
    ("w8-phases", w8_lint::child_phases),
    ("w10w", w10w_while::child),
    ("w14-sink", w14_files::child_sink),
];

const USAGE: &str = "\
Switchyard benchmark harness (see examples/bench/README.md and BENCH.md)

usage: cargo run --release --example bench -- [OPTIONS]

options:
  --profile quick|full   workload sizes (default: quick)
  --only W6,W8           run only these workloads (comma-separated, case-insensitive)
  --breakdown            also print per-phase timings to stderr
  --keep-generated       keep the generated inputs (examples/bench/generated/NAME.PID)
  -h, --help             this help

Prints one JSON object per line on stdout: {\"peer\",\"version\",\"workload\",\"variant\",
\"metric\",\"value\",\"runs\",\"n\",\"profile\",\"samples\",\"notes\"}; value is the median of the
samples (5 timed repetitions after one checked warm-up). Progress goes to stderr.

Exit status: 0 all ran and checked, 1 a benchmark failed (wrong answer or error), 2 usage.";

struct Args {
    profile: Profile,
    only: Option<Vec<&'static str>>,
    opts: Options,
}

fn main() -> ExitCode {
    // The engine as the `switchyard` binary runs it (see `switchyard::__private::alloc`).
    let _ = switchyard::__private::alloc::keep_freed_memory();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some(util::CHILD_ARG) {
        return child(&argv[1..]);
    }
    let args = match parse_args(&argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    for (id, run) in WORKLOADS {
        if args.only.as_ref().is_some_and(|only| !only.contains(id)) {
            continue;
        }
        eprintln!("== {id} ({} profile)", args.profile.name);
        match run(&args.profile, &args.opts) {
            Ok(reports) => report::emit(&reports, &args.profile),
            Err(e) => {
                eprintln!("{id} FAILED: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `Ok(None)`: help was asked for.
fn parse_args(argv: &[String]) -> Result<Option<Args>, String> {
    let mut profile = Profile::QUICK;
    let mut only = None;
    let mut opts = Options::default();
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("`{name}` needs a value"))
        };
        match flag {
            "-h" | "--help" => return Ok(None),
            "--profile" => {
                let v = value("--profile")?;
                profile =
                    Profile::by_name(&v).ok_or_else(|| format!("unknown profile `{v}` (quick or full)"))?;
            }
            "--only" => only = Some(parse_only(&value("--only")?)?),
            "--breakdown" => opts.breakdown = true,
            "--keep-generated" => opts.keep_generated = true,
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    Ok(Some(Args { profile, only, opts }))
}

fn parse_only(list: &str) -> Result<Vec<&'static str>, String> {
    let mut ids = Vec::new();
    for raw in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if let Some((id, _)) = WORKLOADS.iter().find(|(id, _)| id.eq_ignore_ascii_case(raw)) {
            ids.push(*id);
        } else {
            return Err(format!("unknown workload `{raw}` (available: {})", available()));
        }
    }
    if ids.is_empty() {
        return Err("`--only` names no workload".to_string());
    }
    Ok(ids)
}

fn available() -> String {
    let mut ids: Vec<&str> = WORKLOADS.iter().map(|(id, _)| *id).collect();
    ids.dedup();
    ids.join(", ")
}

fn child(argv: &[String]) -> ExitCode {
    let Some((name, rest)) = argv.split_first() else {
        eprintln!("error: `{}` needs a child name", util::CHILD_ARG);
        return ExitCode::from(2);
    };
    let Some((_, f)) = CHILDREN.iter().find(|(n, _)| n == name) else {
        eprintln!("error: unknown child `{name}`");
        return ExitCode::from(2);
    };
    match f(rest) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("child {name} FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
