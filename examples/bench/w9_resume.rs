//! W9 crash-resume (BENCH.md): the W7 batch (`switchyard batch w5_batch.yaml --concurrency 64
//! --store sqlite:DIR/runs.db`) killed with SIGKILL at half its wall time, then the same command
//! again, to the end.
//!
//! Each repetition, in fresh folders: the batch uninterrupted (t_uninterrupted); the batch again
//! in a new folder, SIGKILLed t_uninterrupted / 2 after its spawn and reaped (t_killed, spawn to
//! reaped), then the same command line (t_resume, spawn to exit). The output file after the
//! resume must hold every item exactly once, in order, succeeded, right (the same check as W5),
//! and the store, read back in-process, exactly one succeeded run per item (0 lost, 0 run
//! twice). Any failure of these fails the workload. One such repetition as a checked warm-up,
//! then [`RUNS`] timed.
//!
//! Reported: `extra_wall_pct` = ((t_killed + t_resume) / t_uninterrupted − 1) × 100, the three
//! walls, and `items_reused`: the items the resume took from the store (finished before the
//! kill), as the resume's summary line says.

use std::time::Duration;

use crate::Options;
use crate::batch_bin::{self, BatchCmd};
use crate::profile::{Profile, RUNS};
use crate::report::{Report, median};
use crate::util;

pub const ID: &str = "W9";
const CONCURRENCY: usize = 64;
const TARGET_EXTRA_PCT: f64 = 10.0;

struct Rep {
    uninterrupted: f64,
    killed: f64,
    resume: f64,
    lines_at_kill: usize,
    reused: u64,
}

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let n = profile.w9_runs;
    let bin = util::release_binary()?;
    let generated = util::GeneratedDir::create("w9", opts.keep_generated)?;
    let dir = &generated.path;
    let input = dir.join("in.jsonl");
    batch_bin::write_input(&input, n)?;
    let fresh = |name: &str| batch_bin::fresh_sqlite(&bin, dir, &input, name, CONCURRENCY);
    let rep = |name: &str| -> Result<Rep, String> {
        let (whole, url) = fresh(&format!("{name}-whole"))?;
        let u = batch_bin::run(&whole)?;
        batch_bin::check_output(&whole.output, n)?;
        batch_bin::check_store(&url, &whole.output, n)?;
        let (crash, url) = fresh(&format!("{name}-crash"))?;
        let killed_cmd = BatchCmd {
            log: crash.cwd.join("log_killed.txt"),
            ..crash.clone()
        };
        let k = batch_bin::run_killed(&killed_cmd, Duration::from_secs_f64(u.wall_s / 2.0))?;
        let lines_at_kill = batch_bin::count_lines(&crash.output);
        let r = batch_bin::run(&crash)?;
        batch_bin::check_output(&crash.output, n)
            .map_err(|e| format!("after the SIGKILL at {:.3} s and the resume: {e}", k.wall_s))?;
        batch_bin::check_store(&url, &crash.output, n)
            .map_err(|e| format!("after the SIGKILL at {:.3} s and the resume: {e}", k.wall_s))?;
        let reused = batch_bin::reused_items(&crash.log);
        if !opts.keep_generated {
            let _ = std::fs::remove_dir_all(&whole.cwd);
            let _ = std::fs::remove_dir_all(&crash.cwd);
        }
        Ok(Rep {
            uninterrupted: u.wall_s,
            killed: k.wall_s,
            resume: r.wall_s,
            lines_at_kill,
            reused,
        })
    };
    eprintln!(
        "W9: `switchyard batch {} --concurrency {CONCURRENCY} --store sqlite:DIR/runs.db`, {n} items: uninterrupted, \
         then SIGKILL at half that wall and the same command again; warm-up, then {RUNS} timed",
        batch_bin::FLOW
    );
    rep("warm-up")?;
    let reps = (0..RUNS)
        .map(|r| rep(&format!("rep{r}")))
        .collect::<Result<Vec<_>, _>>()?;
    let col = |f: fn(&Rep) -> f64| reps.iter().map(f).collect::<Vec<f64>>();
    let extra = col(|r| ((r.killed + r.resume) / r.uninterrupted - 1.0) * 100.0);
    let (unint, killed, resume) = (col(|r| r.uninterrupted), col(|r| r.killed), col(|r| r.resume));
    let reused = col(|r| r.reused as f64);
    let lines = col(|r| r.lines_at_kill as f64);
    eprintln!(
        "W9: uninterrupted {:.3} s; killed at {:.3} s with {:.0} output lines written, resumed in {:.3} s reusing {:.0} \
         of {n} items: {:.2}% extra wall time (target < {TARGET_EXTRA_PCT}%); every output line once and in order, \
         one run per item in the store (medians)",
        median(&unint),
        median(&killed),
        median(&lines),
        median(&resume),
        median(&reused),
        median(&extra)
    );
    let what = format!(
        "{n} items of `{}` (50 ms mock) through `switchyard batch --concurrency {CONCURRENCY} --store sqlite:DIR/runs.db` \
         (release binary, whole processes), SIGKILLed at half the uninterrupted wall of the same repetition, then run \
         again; output and store checked: every item once, in order",
        batch_bin::FLOW
    );
    let r = |metric: &'static str, samples: Vec<f64>, notes: String| {
        Report::new(ID, metric, n as u64, samples, notes)
    };
    Ok(vec![
        r(
            "extra_wall_pct",
            extra,
            format!(
                "{what}; ((t_killed + t_resume) / t_uninterrupted − 1) × 100; target < {TARGET_EXTRA_PCT}; what a kill \
                 costs is about constant (the runs in flight at the kill, a second start-up), so this shrinks as N \
                 grows: compare at the same N"
            ),
        ),
        r(
            "uninterrupted_s",
            unint,
            format!("{what}; wall of the uninterrupted batch"),
        ),
        r(
            "killed_s",
            killed,
            format!("{what}; spawn to reaped, of the killed start"),
        ),
        r(
            "resume_s",
            resume,
            format!("{what}; spawn to exit, of the second start"),
        ),
        r(
            "items_reused",
            reused,
            format!("{what}; items the second start took from the store (its summary line)"),
        ),
    ])
}
