//! W9 crash-resume (BENCH.md): the W7 batch (`switchyard batch w5_batch.yaml --concurrency 64
//! --store sqlite:DIR/runs.db`) killed with SIGKILL at 50%, then the same command again, to the
//! end.
//!
//! Each repetition, in fresh folders: the batch uninterrupted (t_uninterrupted); then two crashes,
//! each in a new folder, SIGKILLed and reaped (t_killed, spawn to reaped), then run again with the
//! same command line (t_resume, spawn to exit):
//!
//! - `default`: killed when half the items are done — the output holds N / 2 lines, the batch's
//!   progress as its progress bar shows it ("killed at 50%").
//! - `at-half-wall`: killed at half the uninterrupted wall, shifted by (j / RUNS − 1/2) of the
//!   mock's 50 ms latency in repetition j. Every run of this flow waits the same 50 ms, so the
//!   runs move in waves of 64, and what a kill loses is the part of the wave in flight: from
//!   nothing (just after a wave ends) to a whole wave (just before). Spreading the kills over one
//!   wave measures a crash at an arbitrary moment rather than at one fixed phase.
//!
//! The output file after each resume must hold every item exactly once, in order, succeeded,
//! right (the same check as W5), and the store, read back in-process, exactly one succeeded run
//! per item (0 lost, 0 run twice). Any failure of these fails the workload. One repetition as a
//! checked warm-up, then [`RUNS`] timed.
//!
//! Reported per variant: `extra_wall_pct` = ((t_killed + t_resume) / t_uninterrupted − 1) × 100,
//! the three walls, and `items_reused`: the items the resume took from the store (finished before
//! the kill), as the resume's summary line says.

use std::time::Duration;

use crate::Options;
use crate::batch_bin::{self, BatchCmd, KillAt};
use crate::profile::{Profile, RUNS};
use crate::report::{Report, median};
use crate::util;

pub const ID: &str = "W9";
const CONCURRENCY: usize = 64;
const TARGET_EXTRA_PCT: f64 = 10.0;
const HALF_WALL: &str = "at-half-wall";

/// One crash and its resume.
struct Crash {
    killed: f64,
    resume: f64,
    lines_at_kill: usize,
    reused: u64,
}

struct Rep {
    uninterrupted: f64,
    at_half_items: Crash,
    at_half_wall: Crash,
}

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let n = profile.w9_runs;
    let bin = util::release_binary()?;
    let generated = util::GeneratedDir::create("w9", opts.keep_generated)?;
    let dir = &generated.path;
    let input = dir.join("in.jsonl");
    batch_bin::write_input(&input, n)?;
    let fresh = |name: &str| batch_bin::fresh_sqlite(&bin, dir, &input, name, CONCURRENCY);
    let crash = |name: &str, at: KillAt| -> Result<Crash, String> {
        let (cmd, url) = fresh(name)?;
        let killed_cmd = BatchCmd {
            log: cmd.cwd.join("log_killed.txt"),
            ..cmd.clone()
        };
        let k = batch_bin::run_killed(&killed_cmd, at)?;
        let lines_at_kill = batch_bin::count_lines(&cmd.output);
        let r = batch_bin::run(&cmd)?;
        let after = |e: String| {
            format!(
                "after the SIGKILL at {:.3} s ({at:?}) and the resume: {e}",
                k.wall_s
            )
        };
        batch_bin::check_output(&cmd.output, n).map_err(after)?;
        batch_bin::check_store(&url, &cmd.output, n).map_err(after)?;
        let reused = batch_bin::reused_items(&cmd.log);
        if !opts.keep_generated {
            let _ = std::fs::remove_dir_all(&cmd.cwd);
        }
        Ok(Crash {
            killed: k.wall_s,
            resume: r.wall_s,
            lines_at_kill,
            reused,
        })
    };
    let rep = |name: &str, phase: f64| -> Result<Rep, String> {
        let (whole, url) = fresh(&format!("{name}-whole"))?;
        let u = batch_bin::run(&whole)?;
        batch_bin::check_output(&whole.output, n)?;
        batch_bin::check_store(&url, &whole.output, n)?;
        if !opts.keep_generated {
            let _ = std::fs::remove_dir_all(&whole.cwd);
        }
        let at_half_items = crash(&format!("{name}-half-items"), KillAt::Lines(n / 2))?;
        let shift = (phase - 0.5) * batch_bin::LATENCY_S;
        let at_half_wall = crash(
            &format!("{name}-half-wall"),
            KillAt::After(Duration::from_secs_f64(u.wall_s / 2.0 + shift)),
        )?;
        Ok(Rep {
            uninterrupted: u.wall_s,
            at_half_items,
            at_half_wall,
        })
    };
    eprintln!(
        "W9: `switchyard batch {} --concurrency {CONCURRENCY} --store sqlite:DIR/runs.db`, {n} items: uninterrupted, \
         then SIGKILL at 50% of the items (and, variant `{HALF_WALL}`, at half the wall, the kills spread over one \
         50 ms wave) and the same command again; warm-up, then {RUNS} timed",
        batch_bin::FLOW
    );
    rep("warm-up", 0.5)?;
    let reps = (0..RUNS)
        .map(|j| rep(&format!("rep{j}"), j as f64 / RUNS as f64))
        .collect::<Result<Vec<_>, _>>()?;
    let unint: Vec<f64> = reps.iter().map(|r| r.uninterrupted).collect();
    let what = format!(
        "{n} items of `{}` (50 ms mock) through `switchyard batch --concurrency {CONCURRENCY} --store sqlite:DIR/runs.db` \
         (release binary, whole processes), SIGKILLed, then run again; output and store checked: every item once, in \
         order",
        batch_bin::FLOW
    );
    let mut reports = Vec::new();
    for (variant, when, pick) in [
        (
            "default",
            "killed when the output holds half the items (50% done)",
            (|r: &Rep| &r.at_half_items) as fn(&Rep) -> &Crash,
        ),
        (
            HALF_WALL,
            "killed at half the uninterrupted wall of the same repetition, shifted by (j / 5 − 1/2) × 50 ms in \
             repetition j: the kills spread over one wave of the 50 ms mock",
            |r: &Rep| &r.at_half_wall,
        ),
    ] {
        let col = |f: fn(&Crash) -> f64| reps.iter().map(|r| f(pick(r))).collect::<Vec<f64>>();
        let extra: Vec<f64> = reps
            .iter()
            .map(|r| ((pick(r).killed + pick(r).resume) / r.uninterrupted - 1.0) * 100.0)
            .collect();
        let (killed, resume) = (col(|c| c.killed), col(|c| c.resume));
        let (reused, lines) = (col(|c| c.reused as f64), col(|c| c.lines_at_kill as f64));
        eprintln!(
            "W9 {variant}: uninterrupted {:.3} s; killed at {:.3} s with {:.0} output lines written, resumed in {:.3} s \
             reusing {:.0} of {n} items: {:.2}% extra wall time (target < {TARGET_EXTRA_PCT}%; samples {}); every \
             output line once and in order, one run per item in the store (medians)",
            median(&unint),
            median(&killed),
            median(&lines),
            median(&resume),
            median(&reused),
            median(&extra),
            extra
                .iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let what = format!("{what}; {when}");
        let r = |metric: &'static str, samples: Vec<f64>, notes: String| {
            let mut r = Report::new(ID, metric, n as u64, samples, notes);
            r.variant = variant.to_string();
            r
        };
        reports.extend([
            r(
                "extra_wall_pct",
                extra,
                format!(
                    "{what}; ((t_killed + t_resume) / t_uninterrupted − 1) × 100; target < {TARGET_EXTRA_PCT}; what a \
                     kill costs is about constant (the runs in flight at the kill, a second start-up), so this shrinks \
                     as N grows: compare at the same N"
                ),
            ),
            r(
                "uninterrupted_s",
                unint.clone(),
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
        ]);
    }
    Ok(reports)
}
