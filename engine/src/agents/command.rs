//! The `command` agent (SPEC §6): runs a program — never through a shell — with the input
//! document as JSON on stdin, and parses its stdout as one JSON value.
//!
//! This module is the only place that starts subprocesses (STYLE "Errors, I/O and safety"). It
//! owns the child's argv (each `run` argument a template rendered with `input`, `message` and
//! `context`; the results are argv entries, never re-parsed), its environment (cleared; then
//! `PATH` inherited from this process, the `env:` entries — which may replace `PATH` — with
//! their `${env:NAME}` secret references resolved at the call ([`super::net::resolve_secret_refs`]), then
//! `SWITCHYARD_RUN_ID`, `SWITCHYARD_STEP`, `SWITCHYARD_ATTEMPT`, `SWITCHYARD_IDEMPOTENCY_KEY`,
//! `SWITCHYARD_INPUT_DIR` and `SWITCHYARD_OUTPUT_DIR` (the attempt's directories, [`files`]),
//! which `env:` cannot override), its own process group, and the reading of its output: stdin is
//! written while stdout and stderr are read, concurrently, so a child that writes much to stderr
//! before reading stdin does not deadlock. stdout is capped at `max_output`; only the last
//! [`STDERR_TAIL`] bytes of stderr are kept.
//!
//! The group is led by a small **supervisor** ([`supervise`], forked between `fork` and `exec`)
//! whose child is the program. On timeout (`cx.timeout`, enforced here too), cancellation
//! (`cx.cancel`), an output overflow, or when the call's future is dropped, the whole group is
//! killed with `SIGKILL` before the supervisor is reaped, so no grandchild outlives the call.
//! When the program exits by itself, the supervisor kills what it left running in the group and
//! exits as the program did; the call reads what is left in the pipes for at most [`DRAIN`]
//! and is done, even if a process that left the group holds them open. When the engine dies
//! (`kill -9` of a batch), the supervisor learns it through `PR_SET_PDEATHSIG` and kills the
//! group. That signal follows the *thread* that forked: the tokio worker threads that start
//! commands live as long as the runtime, and a command still running when the runtime shuts
//! down is killed with it.
//!
//! Secret values are never logged and never put in an error: errors name the variable only,
//! and the resolved values of `env:` are redacted from the result and the error (stdout and
//! the tail of stderr), in their common encodings too ([`super::net::Secrets::remember`]).

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{ChildStdin, Command};

mod files;

pub use files::remove_live_dirs;

use super::transform::agent_vars;
use super::{Agent, CallContext};
use crate::expr::eval;
use crate::plan::CommandPlan;
use crate::record::{ErrorKind, StepError};

/// How much of the end of stderr an error carries (cut on a UTF-8 character boundary).
pub const STDERR_TAIL: usize = 2048;

/// How much of the start of an invalid stdout an error quotes.
const STDOUT_HEAD: usize = 200;

/// How long to wait for a killed child to be reaped before leaving it to tokio's orphan reaper.
const REAP_GRACE: Duration = Duration::from_secs(5);

/// How long the output of a program that exited is still read: what it wrote is already in the
/// pipes; this bounds only a process that left its group and holds them open.
const DRAIN: Duration = Duration::from_millis(100);

/// A `command` agent, borrowing its plan (the engine holds the plan in an `Arc` for the run).
#[derive(Clone, Copy, Debug)]
pub struct CommandAgent<'p>(pub &'p CommandPlan);

impl Agent for CommandAgent<'_> {
    async fn call(&self, input: &Value, cx: CallContext<'_>) -> Result<Value, StepError> {
        let plan = self.0;
        let mut secrets = super::net::Secrets::default();
        let env = resolve_env(plan, &mut secrets)?;
        // Removed when the attempt ends, and when this call is dropped (a timeout, a cancel).
        let dirs = files::Dirs::create()?;
        // The program reads its input's files under $SWITCHYARD_INPUT_DIR, its arguments too.
        let rewritten = dirs.write_inputs(input, cx.files).await?;
        let input = rewritten.as_ref().unwrap_or(input);
        let argv = render_argv(plan, input, &cx)?;
        let stdin = serde_json::to_vec(input).expect("a JSON value serializes");
        // A program may print what it was given: no secret value leaves the call.
        let result = match run(plan, &argv, env, stdin, &dirs, &cx).await {
            Ok(mut v) => {
                secrets.redact_value(&mut v);
                // Only a program that succeeded has its files taken.
                dirs.take_outputs(&argv[0], v, cx.files).await
            }
            Err(e) => Err(secrets.redact_error(e)),
        };
        dirs.remove().await;
        result
    }
}

/// Renders each `run` argument; plain text (no template tags) is taken as is.
fn render_argv(plan: &CommandPlan, input: &Value, cx: &CallContext<'_>) -> Result<Vec<String>, StepError> {
    if plan.run.is_empty() {
        return Err(StepError::new(
            ErrorKind::Agent,
            "command agent has an empty `run`",
        ));
    }
    if plan.run.iter().all(|t| t.is_plain()) {
        return Ok(plan.run.iter().map(|t| t.text().to_owned()).collect());
    }
    let message = cx.message.map(|m| Value::String(m.to_owned()));
    let vars = agent_vars(input, message.as_ref(), cx);
    plan.run
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.is_plain() {
                return Ok(t.text().to_owned());
            }
            eval::render(t, &vars).map_err(|e| StepError {
                message: format!("`run` argument {}: {}", i + 1, e.message),
                ..e
            })
        })
        .collect()
}

/// The `env:` entries with their secret references resolved. The values are secrets: they go
/// to the child only.
/// The `env:` entries with their secret references resolved, each value remembered in
/// `secrets` for redaction.
fn resolve_env<'p>(
    plan: &'p CommandPlan,
    secrets: &mut super::net::Secrets,
) -> Result<Vec<(&'p str, String)>, StepError> {
    plan.env
        .iter()
        .map(|(k, v)| secrets.resolve(v, &format!("env `{k}`")).map(|v| (k.as_str(), v)))
        .collect()
}

/// How the child's run ended, before its output is judged.
enum Ended {
    Exited {
        status: ExitStatus,
        stdout: Vec<u8>,
        stderr: Tail,
    },
    Overflow,
    TimedOut,
    Cancelled,
    Io(io::Error),
}

/// The child's process group, killed with `SIGKILL` when dropped while armed — that is, until
/// the child has been reaped (after which its id may name another process group).
struct Group {
    pgid: libc::pid_t,
    armed: bool,
}

impl Group {
    fn kill(&self) {
        // SAFETY: killpg only sends a signal. While `armed`, the group leader (our child) is not
        // yet reaped, so `pgid` still names its group and no other.
        unsafe {
            libc::killpg(self.pgid, libc::SIGKILL);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.armed {
            self.kill();
        }
    }
}

async fn run(
    plan: &CommandPlan,
    argv: &[String],
    env: Vec<(&str, String)>,
    stdin: Vec<u8>,
    dirs: &files::Dirs,
    cx: &CallContext<'_>,
) -> Result<Value, StepError> {
    let program = argv[0].as_str();
    let mut cmd = Command::new(program);
    cmd.args(&argv[1..]).env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd.envs(env)
        .env("SWITCHYARD_RUN_ID", cx.run_id)
        .env("SWITCHYARD_STEP", cx.step)
        .env("SWITCHYARD_ATTEMPT", cx.attempt.to_string())
        .env("SWITCHYARD_IDEMPOTENCY_KEY", cx.idempotency_key())
        .env("SWITCHYARD_INPUT_DIR", dirs.input())
        .env("SWITCHYARD_OUTPUT_DIR", dirs.output());
    if let Some(dir) = &plan.cwd {
        cmd.current_dir(dir);
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let parent_gone = libc::SIGRTMIN();
    // SAFETY: `supervise` makes only async-signal-safe calls (no allocation, no locks), as
    // the code between `fork` and `exec` of a threaded process must.
    unsafe {
        cmd.pre_exec(move || supervise(parent_gone));
    }

    let mut child = cmd
        .spawn()
        .map_err(|e| spawn_error(program, plan.cwd.as_deref(), &e))?;
    let pid = child.id().expect("a child that was just spawned has a pid");
    let mut group = Group {
        pgid: libc::pid_t::try_from(pid).expect("pids fit in pid_t"),
        armed: true,
    };
    tracing::debug!(
        program,
        pid,
        run = cx.run_id,
        step = cx.step,
        attempt = cx.attempt,
        "command started"
    );

    let child_stdin = child.stdin.take().expect("stdin is piped");
    let child_stdout = child.stdout.take().expect("stdout is piped");
    let child_stderr = child.stderr.take().expect("stderr is piped");
    let max_output = plan.max_output;
    let io = async {
        let mut stdout = Vec::new();
        let mut stderr = Tail::default();
        let mut streams = Box::pin(async {
            tokio::try_join!(
                write_stdin(child_stdin, stdin),
                read_capped(child_stdout, max_output, &mut stdout),
                read_tail(child_stderr, &mut stderr),
            )
            .map(|_| ())
        });
        let status = tokio::select! {
            r = &mut streams => {
                r?;
                child.wait().await.map_err(Ended::Io)?
            }
            s = child.wait() => {
                let status = s.map_err(Ended::Io)?;
                // The program has exited: what it wrote is in the pipes, and its supervisor
                // has killed what it left in its group. A process that left the group and
                // holds stdout or stderr open does not hold the call.
                if let Ok(r) = tokio::time::timeout(DRAIN, &mut streams).await {
                    r?;
                }
                status
            }
        };
        drop(streams);
        Ok::<_, Ended>(Ended::Exited {
            status,
            stdout,
            stderr,
        })
    };
    let ended = tokio::select! {
        biased;
        _ = cx.cancel.cancelled() => Ended::Cancelled,
        r = tokio::time::timeout(cx.timeout, io) => match r {
            Err(_) => Ended::TimedOut,
            Ok(Ok(ended) | Err(ended)) => ended,
        },
    };
    if !matches!(ended, Ended::Exited { .. }) {
        group.kill();
        if tokio::time::timeout(REAP_GRACE, child.wait()).await.is_err() {
            tracing::warn!(program, pid, "killed command not reaped yet; left to the runtime");
        }
    }
    // Reaped (or handed to tokio's orphan reaper by `kill_on_drop`): never signal the group again.
    group.armed = false;
    tracing::debug!(program, pid, "command finished");

    match ended {
        Ended::Exited {
            status,
            stdout,
            stderr,
        } => judge(program, status, &stdout, &stderr),
        Ended::Overflow => Err(StepError::new(
            ErrorKind::InvalidOutput,
            format!(
                "command `{program}`: stdout exceeded {} (max_output)",
                fmt_size(plan.max_output)
            ),
        )),
        Ended::TimedOut => Err(StepError::new(
            ErrorKind::Timeout,
            format!("command `{program}` timed out after {}", fmt_duration(cx.timeout)),
        )),
        Ended::Cancelled => Err(StepError::new(
            ErrorKind::Cancelled,
            format!("command `{program}` cancelled"),
        )),
        Ended::Io(e) => Err(StepError::new(
            ErrorKind::Agent,
            format!("command `{program}`: reading its output: {e}"),
        )),
    }
}

/// The signals the supervisor waits for: its program's exit, the death of the thread that
/// started it (`parent_gone`, through `PR_SET_PDEATHSIG`), and those it passes on to the program.
fn watched_signals(parent_gone: libc::c_int) -> libc::sigset_t {
    // SAFETY: a sigset_t is plain data, initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [
            libc::SIGCHLD,
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            parent_gone,
        ] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Runs in the child between `fork` and `exec`, as the leader of the agent's new process group,
/// so it makes only async-signal-safe calls. It forks once more: the new process returns to
/// exec the program (and is killed if this one dies); this one stays as its **supervisor** and
/// never returns:
///
/// - when the thread that started it dies (the engine's process killed with `SIGKILL`, or its
///   runtime gone), it kills the whole group, so no agent process outlives the engine;
/// - when the program exits, it kills what the program left running in the group (the call
///   is over; nothing else owns those processes) and exits as the program did, with its code
///   or by its signal;
/// - `SIGINT`, `SIGTERM`, `SIGHUP` and `SIGQUIT` sent to it are passed on to the program.
///
/// The supervisor holds no file descriptor, so the program's pipes close as the program (and
/// the rest of its group) close them, and `spawn` learns of a failed `exec` as it would without it.
fn supervise(parent_gone: libc::c_int) -> io::Result<()> {
    let watched = watched_signals(parent_gone);
    // SAFETY: only system calls on this (single-threaded, forked) process's own state.
    unsafe {
        let parent = libc::getppid();
        let me = libc::getpid();
        let mut before: libc::sigset_t = std::mem::zeroed();
        // Blocked before the second fork, so no exit of the program is missed.
        if libc::sigprocmask(libc::SIG_BLOCK, &watched, &mut before) != 0 {
            return Err(io::Error::last_os_error());
        }
        let program = libc::fork();
        if program < 0 {
            return Err(io::Error::last_os_error());
        }
        if program == 0 {
            libc::sigprocmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
            #[cfg(target_os = "linux")]
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != me {
                libc::_exit(127);
            }
            return Ok(());
        }
        #[cfg(target_os = "linux")]
        libc::prctl(libc::PR_SET_PDEATHSIG, parent_gone);
        if libc::getppid() != parent {
            libc::killpg(0, libc::SIGKILL);
        }
        close_all_fds();
        let mut status: libc::c_int = 0;
        loop {
            let signal = libc::sigwaitinfo(&watched, std::ptr::null_mut());
            if signal == libc::SIGCHLD {
                if libc::waitpid(program, &mut status, libc::WNOHANG) == program {
                    break;
                }
            } else if signal == parent_gone {
                if libc::getppid() != parent {
                    libc::killpg(0, libc::SIGKILL);
                }
            } else if signal > 0 {
                libc::kill(program, signal);
            }
        }
        // Out of the group (into the engine's), then kill what is left in it.
        let group = libc::getpgrp();
        if libc::setpgid(0, libc::getpgid(parent)) == 0 {
            libc::killpg(group, libc::SIGKILL);
        }
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        let signal = libc::WTERMSIG(status);
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(signal, libc::SIG_DFL);
        let mut only: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut only);
        libc::sigaddset(&mut only, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
        libc::kill(me, signal);
        libc::_exit(128 + signal)
    }
}

/// Closes every file descriptor of this process (between `fork` and `exec`).
fn close_all_fds() {
    // SAFETY: closing descriptors this process owns; nothing in it uses them afterwards.
    unsafe {
        #[cfg(target_os = "linux")]
        if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) == 0 {
            return;
        }
        let mut limit: libc::rlimit = std::mem::zeroed();
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur.min(1 << 16) as libc::c_int
        } else {
            1024
        };
        for fd in 0..max {
            libc::close(fd);
        }
    }
}

fn spawn_error(program: &str, cwd: Option<&Path>, e: &io::Error) -> StepError {
    let why = match e.kind() {
        io::ErrorKind::NotFound => match cwd {
            Some(dir) if !dir.is_dir() => format!("working directory `{}` does not exist", dir.display()),
            _ => "no such program".to_owned(),
        },
        io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => e.to_string(),
    };
    StepError::new(ErrorKind::Agent, format!("cannot run `{program}`: {why}"))
}

/// Writes the input document and closes stdin. A child that exits without reading all of it
/// is not an error (its exit status and output decide).
async fn write_stdin(mut w: ChildStdin, bytes: Vec<u8>) -> Result<(), Ended> {
    if let Err(e) = w.write_all(&bytes).await
        && e.kind() != io::ErrorKind::BrokenPipe
    {
        tracing::debug!(error = %e, "writing the input document to a command");
    }
    drop(w);
    Ok(())
}

/// Reads all of `r` into `buf`, failing with [`Ended::Overflow`] as soon as it holds more than
/// `max` bytes.
async fn read_capped(r: impl AsyncRead + Unpin, max: u64, buf: &mut Vec<u8>) -> Result<(), Ended> {
    r.take(max.saturating_add(1))
        .read_to_end(buf)
        .await
        .map_err(Ended::Io)?;
    if buf.len() as u64 > max {
        return Err(Ended::Overflow);
    }
    Ok(())
}

/// The end of a stream, and whether anything before it was dropped.
#[derive(Default)]
struct Tail {
    bytes: Vec<u8>,
    cut: bool,
}

/// Reads all of `r` into `tail`, keeping only (at least) its last [`STDERR_TAIL`] bytes.
async fn read_tail(mut r: impl AsyncRead + Unpin, tail: &mut Tail) -> Result<(), Ended> {
    let mut chunk = vec![0u8; 8192];
    loop {
        let n = r.read(&mut chunk).await.map_err(Ended::Io)?;
        if n == 0 {
            return Ok(());
        }
        tail.bytes.extend_from_slice(&chunk[..n]);
        if tail.bytes.len() > 4 * STDERR_TAIL {
            let excess = tail.bytes.len() - STDERR_TAIL;
            tail.bytes.drain(..excess);
            tail.cut = true;
        }
    }
}

impl Tail {
    /// The last [`STDERR_TAIL`] bytes at most, starting on a character boundary, trimmed; `…`
    /// marks a cut.
    fn text(&self) -> String {
        let mut start = self.bytes.len().saturating_sub(STDERR_TAIL);
        let mut cut = self.cut || start > 0;
        while start < self.bytes.len() && (self.bytes[start] & 0b1100_0000) == 0b1000_0000 {
            start += 1;
            cut = true;
        }
        let text = String::from_utf8_lossy(&self.bytes[start..]);
        let text = text.trim();
        if cut && !text.is_empty() {
            format!("…{text}")
        } else {
            text.to_owned()
        }
    }
}

/// The result of a child that exited: its stdout as JSON, or an error for a failed exit or an
/// invalid output.
fn judge(program: &str, status: ExitStatus, stdout: &[u8], stderr: &Tail) -> Result<Value, StepError> {
    let stderr_tail = stderr.text();
    let with_stderr = |msg: String| {
        if stderr_tail.is_empty() {
            format!("{msg} (stderr is empty)")
        } else {
            format!("{msg}: {stderr_tail}")
        }
    };
    if let Some(code) = status.code() {
        if code != 0 {
            let msg = with_stderr(format!("command `{program}` exited with status {code}"));
            return Err(StepError::new(ErrorKind::Agent, msg)
                .with_details(json!({"exit_code": code, "stderr_tail": stderr_tail})));
        }
    } else if let Some(signal) = status.signal() {
        let msg = with_stderr(format!(
            "command `{program}` was killed by signal {signal}{}",
            signal_name(signal)
        ));
        return Err(StepError::new(ErrorKind::Agent, msg)
            .with_details(json!({"signal": signal, "stderr_tail": stderr_tail})));
    }
    let text = stdout.trim_ascii();
    if text.is_empty() {
        return Err(StepError::new(
            ErrorKind::InvalidOutput,
            format!("command `{program}` printed nothing on stdout (expected one JSON value)"),
        ));
    }
    crate::json::from_slice(text).map_err(|e| {
        StepError::new(
            ErrorKind::InvalidOutput,
            format!(
                "command `{program}` printed invalid JSON on stdout ({e}): {}",
                head(text)
            ),
        )
    })
}

/// The first [`STDOUT_HEAD`] bytes of `bytes`, cut on a character boundary, `…` marking a cut.
fn head(bytes: &[u8]) -> String {
    if bytes.len() <= STDOUT_HEAD {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let mut end = STDOUT_HEAD;
    while end > 0 && (bytes[end] & 0b1100_0000) == 0b1000_0000 {
        end -= 1;
    }
    format!("{}…", String::from_utf8_lossy(&bytes[..end]))
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGHUP => " (SIGHUP)",
        libc::SIGINT => " (SIGINT)",
        libc::SIGQUIT => " (SIGQUIT)",
        libc::SIGILL => " (SIGILL)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGBUS => " (SIGBUS)",
        libc::SIGFPE => " (SIGFPE)",
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGPIPE => " (SIGPIPE)",
        libc::SIGALRM => " (SIGALRM)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGUSR1 => " (SIGUSR1)",
        libc::SIGUSR2 => " (SIGUSR2)",
        _ => "",
    }
}

/// `20s`, `5m`, `1h`, `250ms`, `1.5s`.
fn fmt_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        match d.as_secs() {
            s if s > 0 && s.is_multiple_of(3600) => format!("{}h", s / 3600),
            s if s > 0 && s.is_multiple_of(60) => format!("{}m", s / 60),
            s => format!("{s}s"),
        }
    } else if d.as_secs() == 0 && d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.subsec_millis())
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

/// `16 MiB`, `64 KiB`, `1000 bytes`.
fn fmt_size(n: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * 1024 * 1024;
    match n {
        n if n >= GIB && n.is_multiple_of(GIB) => format!("{} GiB", n / GIB),
        n if n >= MIB && n.is_multiple_of(MIB) => format!("{} MiB", n / MIB),
        n if n >= KIB && n.is_multiple_of(KIB) => format!("{} KiB", n / KIB),
        1 => "1 byte".to_owned(),
        n => format!("{n} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Instant;

    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::agents::transform::tests::test_cx;
    use crate::expr::template;

    const ECHO: &str = "import json,sys; d=json.load(sys.stdin); print(json.dumps({'got': d}))";

    fn plan(run: &[&str]) -> CommandPlan {
        CommandPlan {
            run: run
                .iter()
                .map(|a| template::compile(a).expect("valid template"))
                .collect(),
            env: Vec::new(),
            cwd: None,
            max_output: 16 << 20,
            bundle: Vec::new(),
            flow_dir: std::path::PathBuf::new(),
        }
    }

    async fn call(plan: &CommandPlan, input: Value) -> Result<Value, StepError> {
        call_with(plan, input, Duration::from_secs(30), &CancellationToken::new()).await
    }

    async fn call_with(
        plan: &CommandPlan,
        input: Value,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<Value, StepError> {
        let context = json!({"tenant": "acme"});
        let mut cx = test_cx(3, Some("be brief"), &context, cancel);
        cx.timeout = timeout;
        CommandAgent(plan).call(&input, cx).await
    }

    /// A fresh path in the temp directory.
    fn temp_path(what: &str) -> std::path::PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        std::env::temp_dir().join(format!("switchyard-command-{}-{what}-{n}", std::process::id()))
    }

    /// A shell script that starts `sleep 30` in the background (in the same process group),
    /// writes its pid to the file given as `$1`, and waits.
    const SPAWN_GRANDCHILD: &str = "sleep 30 & echo $! > \"$1\"; wait";

    /// Reads the grandchild pid written by [`SPAWN_GRANDCHILD`].
    async fn grandchild_pid(file: &Path) -> libc::pid_t {
        for _ in 0..200 {
            if let Ok(text) = std::fs::read_to_string(file)
                && let Ok(pid) = text.trim().parse()
            {
                let _ = std::fs::remove_file(file);
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no pid in {}", file.display());
    }

    /// Whether `pid` is gone (or a zombie waiting for init), polling for up to a second.
    async fn gone(pid: libc::pid_t) -> bool {
        for _ in 0..100 {
            // SAFETY: signal 0 only checks that the process exists.
            let alive = unsafe { libc::kill(pid, 0) } == 0;
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .map(|(_, rest)| rest.trim_start().starts_with('Z'))
                })
                .unwrap_or(false);
            if !alive || zombie {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn the_input_goes_to_stdin_and_stdout_is_the_result() {
        let p = plan(&["python3", "-c", ECHO]);
        let input = json!({"ticket": {"id": 7, "text": "héllo"}, "list": [1, 2]});
        assert_eq!(call(&p, input.clone()).await.unwrap(), json!({"got": input}));
    }

    #[tokio::test]
    async fn arguments_are_rendered_and_never_reach_a_shell() {
        let p = plan(&[
            "python3",
            "-c",
            "import json,sys; print(json.dumps(sys.argv[1:]))",
            "{{ input.name }}",
            "{{ message }}/{{ context.tenant }}",
            "plain {",
        ]);
        let got = call(&p, json!({"name": "x; rm -rf / $(id) {{ input }}"}))
            .await
            .unwrap();
        assert_eq!(
            got,
            json!(["x; rm -rf / $(id) {{ input }}", "be brief/acme", "plain {"])
        );
        let err = call(&plan(&["echo", "{{ input.nope }}"]), json!({}))
            .await
            .unwrap_err();
        assert!(err.message.starts_with("`run` argument 2: "), "{}", err.message);
    }

    #[tokio::test]
    async fn surrounding_whitespace_is_allowed() {
        let p = plan(&["sh", "-c", "cat >/dev/null; printf '\\n  {\"a\": 1}  \\n\\n'"]);
        assert_eq!(call(&p, json!({})).await.unwrap(), json!({"a": 1}));
    }

    #[tokio::test]
    async fn a_non_zero_exit_fails_with_the_tail_of_stderr() {
        let p = plan(&[
            "sh",
            "-c",
            "echo '{}'; echo first >&2; echo 'second line' >&2; exit 3",
        ]);
        let err = call(&p, json!({})).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Agent);
        assert_eq!(
            err.message,
            "command `sh` exited with status 3: first\nsecond line"
        );
        assert_eq!(
            err.details,
            Some(json!({"exit_code": 3, "stderr_tail": "first\nsecond line"}))
        );

        let err = call(&plan(&["sh", "-c", "exit 1"]), json!({})).await.unwrap_err();
        assert_eq!(err.message, "command `sh` exited with status 1 (stderr is empty)");
    }

    #[tokio::test]
    async fn a_long_stderr_is_cut_to_its_tail_on_a_character_boundary() {
        let script = "import sys; sys.stderr.write('é' * 5001 + 'END'); sys.exit(2)";
        let err = call(&plan(&["python3", "-c", script]), json!({}))
            .await
            .unwrap_err();
        let tail = err
            .details
            .as_ref()
            .and_then(|d| d["stderr_tail"].as_str())
            .expect("a tail")
            .to_owned();
        assert!(tail.starts_with('…') && tail.ends_with("éEND"), "{tail}");
        assert!(tail.len() <= STDERR_TAIL + '…'.len_utf8(), "{}", tail.len());
        assert!(tail.len() >= STDERR_TAIL - 4, "{}", tail.len());
        assert!(!tail.contains('\u{fffd}'));
    }

    #[tokio::test]
    async fn a_signal_is_named() {
        let err = call(&plan(&["sh", "-c", "echo bye >&2; kill -TERM $$"]), json!({}))
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Agent);
        assert_eq!(err.message, "command `sh` was killed by signal 15 (SIGTERM): bye");
        assert_eq!(err.details, Some(json!({"signal": 15, "stderr_tail": "bye"})));
    }

    #[tokio::test]
    async fn invalid_or_empty_stdout_is_invalid_output() {
        let err = call(&plan(&["sh", "-c", "echo 'not json at all'"]), json!({}))
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidOutput);
        assert!(
            err.message
                .starts_with("command `sh` printed invalid JSON on stdout ("),
            "{}",
            err.message
        );
        assert!(err.message.ends_with("): not json at all"), "{}", err.message);

        let err = call(&plan(&["sh", "-c", "echo '{\"a\": 1} {\"b\": 2}'"]), json!({}))
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidOutput, "one JSON value, not two");

        let err = call(&plan(&["python3", "-c", "print('x' * 1000)"]), json!({}))
            .await
            .unwrap_err();
        assert!(
            err.message.ends_with(&format!(": {}…", "x".repeat(STDOUT_HEAD))),
            "{}",
            err.message
        );

        let err = call(&plan(&["true"]), json!({})).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidOutput);
        assert_eq!(
            err.message,
            "command `true` printed nothing on stdout (expected one JSON value)"
        );
    }

    #[tokio::test]
    async fn a_missing_program_or_directory_is_an_agent_error() {
        let err = call(&plan(&["switchyard-no-such-program"]), json!({}))
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Agent);
        assert_eq!(
            err.message,
            "cannot run `switchyard-no-such-program`: no such program"
        );

        let mut p = plan(&["true"]);
        let dir = temp_path("missing-dir");
        p.cwd = Some(dir.clone());
        let err = call(&p, json!({})).await.unwrap_err();
        assert_eq!(
            err.message,
            format!(
                "cannot run `true`: working directory `{}` does not exist",
                dir.display()
            )
        );
    }

    #[tokio::test]
    async fn cwd_sets_the_working_directory() {
        let dir = temp_path("cwd");
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut p = plan(&["python3", "-c", "import json,os; print(json.dumps(os.getcwd()))"]);
        p.cwd = Some(dir.clone());
        let got = call(&p, json!({})).await.unwrap();
        let _ = std::fs::remove_dir(&dir);
        assert_eq!(
            got,
            json!(
                dir.canonicalize()
                    .unwrap_or(dir)
                    .to_str()
                    .expect("utf-8 temp dir")
            )
        );
    }

    /// A variable of this process's environment (not PATH), with its value.
    fn some_outside_var() -> (String, String) {
        std::env::vars()
            .find(|(k, v)| {
                k != "PATH"
                    && !k.starts_with("SWITCHYARD_")
                    && crate::agents::net::is_var_name(k)
                    && !v.is_empty()
            })
            .expect("the test process has some environment variable besides PATH")
    }

    #[tokio::test]
    async fn the_environment_is_only_env_path_and_switchyard_vars() {
        let (outside, _) = some_outside_var();
        // The interpreter itself, not a wrapper script (pyenv's shims add variables of their own).
        let python = call(
            &plan(&[
                "python3",
                "-c",
                "import json,sys; print(json.dumps(sys.executable))",
            ]),
            json!({}),
        )
        .await
        .unwrap();
        let python = python.as_str().expect("a path");
        let mut p = plan(&[
            python,
            "-c",
            "import json,os; print(json.dumps(dict(os.environ)))",
        ]);
        p.env = vec![
            ("GREETING".into(), "hi ${not a ref} $HOME".into()),
            ("SECRET".into(), format!("Bearer ${{env:{outside}}}!")),
            // Python would add LC_CTYPE to its own environment in the C locale.
            ("PYTHONCOERCECLOCALE".into(), "0".into()),
        ];
        let mut got = call(&p, json!({})).await.unwrap();
        for var in ["SWITCHYARD_INPUT_DIR", "SWITCHYARD_OUTPUT_DIR"] {
            let dir = got
                .as_object_mut()
                .and_then(|o| o.remove(var))
                .unwrap_or_else(|| panic!("{var} is set"));
            let dir = Path::new(dir.as_str().expect("a path"));
            assert!(dir.is_absolute() && !dir.exists(), "{}", dir.display());
        }
        let mut expected = json!({
            "GREETING": "hi ${not a ref} $HOME",
            // The program got the value; what it prints has the whole value the secret was
            // put in redacted.
            "SECRET": "[redacted]",
            "PYTHONCOERCECLOCALE": "0",
            "SWITCHYARD_RUN_ID": "r1",
            "SWITCHYARD_STEP": "s",
            "SWITCHYARD_ATTEMPT": "1",
            "SWITCHYARD_IDEMPOTENCY_KEY": "r1:1",
        });
        if let Ok(path) = std::env::var("PATH") {
            expected["PATH"] = json!(path);
        }
        assert_eq!(got, expected);
        assert!(got.get(&outside).is_none());
    }

    #[tokio::test]
    async fn a_missing_secret_fails_without_running_the_program() {
        let file = temp_path("never-written");
        let mut p = plan(&["sh", "-c", "touch \"$1\"", "sh", file.to_str().expect("utf-8")]);
        p.env = vec![(
            "TOKEN".into(),
            "${env:SWITCHYARD_TEST_SURELY_UNSET_VARIABLE}".into(),
        )];
        let err = call(&p, json!({})).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Agent);
        assert_eq!(
            err.message,
            "env `TOKEN`: environment variable SWITCHYARD_TEST_SURELY_UNSET_VARIABLE is not set"
        );
        assert!(!file.exists());
    }

    #[test]
    fn secret_references_are_resolved() {
        use crate::agents::net::resolve_secret_refs;
        let (name, value) = some_outside_var();
        assert_eq!(resolve_secret_refs("plain").unwrap(), "plain");
        assert_eq!(resolve_secret_refs(&format!("${{env:{name}}}")).unwrap(), value);
        assert_eq!(
            resolve_secret_refs(&format!("a ${{env:{name}}} b ${{env:{name}}}$")).unwrap(),
            format!("a {value} b {value}$")
        );
        assert_eq!(
            resolve_secret_refs("${HOME} $env ${envx}").unwrap(),
            "${HOME} $env ${envx}"
        );
        let err = resolve_secret_refs("${env:SWITCHYARD_TEST_SURELY_UNSET_VARIABLE}").unwrap_err();
        assert_eq!(err.kind, ErrorKind::Agent);
        assert_eq!(
            err.message,
            "environment variable SWITCHYARD_TEST_SURELY_UNSET_VARIABLE is not set"
        );
        let err = resolve_secret_refs("${env:sk-live-123 }").unwrap_err();
        assert!(!err.message.contains("sk-live"), "{}", err.message);
        assert!(
            resolve_secret_refs("x ${env:NAME")
                .unwrap_err()
                .message
                .contains("unterminated")
        );
        assert!(resolve_secret_refs("${env:}").is_err());
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_process_group() {
        let file = temp_path("timeout-pid");
        let p = plan(&["sh", "-c", SPAWN_GRANDCHILD, "sh", file.to_str().expect("utf-8")]);
        let start = Instant::now();
        let err = call_with(
            &p,
            json!({}),
            Duration::from_millis(500),
            &CancellationToken::new(),
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Timeout);
        assert_eq!(err.message, "command `sh` timed out after 500ms");
        assert!(start.elapsed() < Duration::from_secs(10));
        let pid = grandchild_pid(&file).await;
        assert!(gone(pid).await, "grandchild {pid} survived the timeout");
    }

    #[tokio::test]
    async fn cancellation_kills_the_whole_process_group() {
        let file = temp_path("cancel-pid");
        let p = plan(&["sh", "-c", SPAWN_GRANDCHILD, "sh", file.to_str().expect("utf-8")]);
        let cancel = CancellationToken::new();
        let canceller = {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                cancel.cancel();
            })
        };
        let start = Instant::now();
        let err = call_with(&p, json!({}), Duration::from_secs(30), &cancel)
            .await
            .unwrap_err();
        assert_eq!(
            (err.kind, err.message.as_str()),
            (ErrorKind::Cancelled, "command `sh` cancelled")
        );
        assert!(start.elapsed() < Duration::from_secs(10));
        canceller.await.expect("canceller");
        let pid = grandchild_pid(&file).await;
        assert!(gone(pid).await, "grandchild {pid} survived the cancellation");
    }

    #[tokio::test]
    async fn dropping_the_call_kills_the_whole_process_group() {
        let file = temp_path("drop-pid");
        let p = plan(&["sh", "-c", SPAWN_GRANDCHILD, "sh", file.to_str().expect("utf-8")]);
        let cancel = CancellationToken::new();
        let call = call_with(&p, json!({}), Duration::from_secs(30), &cancel);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), call)
                .await
                .is_err()
        );
        let pid = grandchild_pid(&file).await;
        assert!(gone(pid).await, "grandchild {pid} survived the dropped call");
    }

    #[tokio::test]
    async fn a_program_that_exited_is_done_and_what_it_left_running_is_killed() {
        let file = temp_path("left-pid");
        // The background `sleep` holds stdout open; the program itself exits at once.
        let script = "sleep 30 & echo $! > \"$1\"; echo '{\"a\": 1}'";
        let p = plan(&["sh", "-c", script, "sh", file.to_str().expect("utf-8")]);
        let start = Instant::now();
        assert_eq!(call(&p, json!({})).await.unwrap(), json!({"a": 1}));
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
        let pid = grandchild_pid(&file).await;
        assert!(
            gone(pid).await,
            "the program's background child {pid} outlived the call"
        );
    }

    #[tokio::test]
    async fn a_process_that_left_the_group_does_not_hold_the_call() {
        // `setsid` puts the sleep in a session of its own, out of reach of the group's kill; it
        // still holds stdout, which must not keep the call waiting.
        let p = plan(&["sh", "-c", "setsid sleep 3 & echo '{\"a\": 2}'"]);
        let start = Instant::now();
        assert_eq!(call(&p, json!({})).await.unwrap(), json!({"a": 2}));
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    }

    #[tokio::test]
    async fn the_exit_code_and_the_signal_of_the_program_come_through_its_supervisor() {
        let err = call(&plan(&["sh", "-c", "exit 7"]), json!({})).await.unwrap_err();
        assert_eq!(err.details.as_ref().unwrap()["exit_code"], json!(7));
        let err = call(&plan(&["sh", "-c", "kill -SEGV $$"]), json!({}))
            .await
            .unwrap_err();
        assert_eq!(err.details.as_ref().unwrap()["signal"], json!(libc::SIGSEGV));
    }

    #[tokio::test]
    async fn output_beyond_max_output_is_cut_off() {
        let mut p = plan(&["yes"]);
        p.max_output = 1024;
        let start = Instant::now();
        let err = call(&p, json!({})).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidOutput);
        assert_eq!(err.message, "command `yes`: stdout exceeded 1 KiB (max_output)");
        assert!(start.elapsed() < Duration::from_secs(10));

        // Exactly at the cap is fine.
        let mut p = plan(&[
            "python3",
            "-c",
            "import sys; sys.stdout.write('\"' + 'a' * 1022 + '\"')",
        ]);
        p.max_output = 1024;
        assert_eq!(call(&p, json!({})).await.unwrap(), json!("a".repeat(1022)));
        p.max_output = 1023;
        assert_eq!(
            call(&p, json!({})).await.unwrap_err().message,
            "command `python3`: stdout exceeded 1023 bytes (max_output)"
        );
    }

    #[tokio::test]
    async fn much_stderr_before_reading_stdin_does_not_deadlock() {
        let script = "import json,sys; sys.stderr.write('x' * 1000000); sys.stderr.flush(); \
                      d=json.load(sys.stdin); print(json.dumps(len(d['s'])))";
        let input = json!({"s": "y".repeat(1_000_000)});
        let got = tokio::time::timeout(
            Duration::from_secs(20),
            call(&plan(&["python3", "-c", script]), input),
        )
        .await
        .expect("no deadlock");
        assert_eq!(got.unwrap(), json!(1_000_000));
    }

    #[tokio::test]
    async fn a_child_that_does_not_read_stdin_is_fine() {
        let input = json!({"s": "y".repeat(1_000_000)});
        assert_eq!(call(&plan(&["echo", "[1]"]), input).await.unwrap(), json!([1]));
    }

    /// Calls `plan` with a sink of its own; returns the result and what the sink holds.
    async fn call_with_files(
        plan: &CommandPlan,
        input: Value,
        sink: &crate::files::FileSink,
    ) -> Result<Value, StepError> {
        let context = json!({});
        let cancel = CancellationToken::new();
        let mut cx = test_cx(0, None, &context, &cancel);
        cx.files = sink;
        CommandAgent(plan).call(&input, cx).await
    }

    /// Writes `a.txt`, `sub/b/c.txt` and `B.txt` under the output directory, a symlink and an
    /// empty directory, prints its path as `dir`.
    const WRITE_FILES: &str = "cd \"$SWITCHYARD_OUTPUT_DIR\" && mkdir -p sub/b empty && printf A > a.txt && \
                               printf C > sub/b/c.txt && printf BB > B.txt && ln -s a.txt link.txt && \
                               printf '{\"dir\": \"%s\"}' \"$SWITCHYARD_OUTPUT_DIR\"";

    #[tokio::test]
    async fn files_written_to_the_output_directory_join_the_result_in_name_order() {
        let sink = crate::files::FileSink::detached();
        let got = call_with_files(&plan(&["sh", "-c", WRITE_FILES]), json!({}), &sink)
            .await
            .unwrap();
        let dir = Path::new(got["dir"].as_str().expect("dir"));
        assert!(!dir.exists(), "{} outlived the call", dir.display());
        let names: Vec<&str> = got["files"]
            .as_array()
            .expect("files")
            .iter()
            .map(|f| f["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names, ["B.txt", "a.txt", "sub/b/c.txt"]);
        let made = sink.take();
        assert_eq!(
            made.iter().map(|f| f.to_value()).collect::<Vec<_>>(),
            got["files"].as_array().expect("files").clone()
        );
        assert_eq!(sink.read_bytes(&made[2]).await.unwrap(), b"C");
        assert_eq!(made[0].size, 2);
        assert_eq!(made[1].media_type, "text/plain");
    }

    #[tokio::test]
    async fn a_command_with_files_must_print_an_object_without_files() {
        let sink = crate::files::FileSink::detached();
        let write = "printf x > \"$SWITCHYARD_OUTPUT_DIR/x.txt\"; echo \"$1\"";
        let err = call_with_files(&plan(&["sh", "-c", write, "sh", "[1]"]), json!({}), &sink)
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidOutput);
        assert_eq!(
            err.message,
            "command `sh` wrote 1 file to $SWITCHYARD_OUTPUT_DIR but printed an array, not a JSON \
             object (a command with files must print an object: its result gets them as `files`)"
        );
        let err = call_with_files(
            &plan(&["sh", "-c", write, "sh", "{\"files\": []}"]),
            json!({}),
            &sink,
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidOutput);
        assert_eq!(
            err.message,
            "command `sh` wrote 1 file to $SWITCHYARD_OUTPUT_DIR and printed an object with a `files` \
             member of its own: the result's `files` is where the written files go"
        );
        assert!(sink.take().is_empty(), "nothing stored");
        // Without files, any value and any `files` member are the program's own.
        let got = call_with_files(&plan(&["echo", "{\"files\": 3}"]), json!({}), &sink)
            .await
            .unwrap();
        assert_eq!(got, json!({"files": 3}));
        let got = call_with_files(&plan(&["echo", "[2]"]), json!({}), &sink)
            .await
            .unwrap();
        assert_eq!(got, json!([2]));
    }

    #[tokio::test]
    async fn a_failed_or_timed_out_program_stores_nothing_and_its_directory_goes() {
        let sink = crate::files::FileSink::detached();
        let script = "printf x > \"$SWITCHYARD_OUTPUT_DIR/x.txt\"; echo \"$SWITCHYARD_OUTPUT_DIR\" > \"$1\"; \
                      chmod 500 \"$SWITCHYARD_OUTPUT_DIR\"; exit 4";
        let file = temp_path("failed-dir");
        let err = call_with_files(
            &plan(&["sh", "-c", script, "sh", file.to_str().expect("utf-8")]),
            json!({}),
            &sink,
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Agent);
        assert!(sink.take().is_empty());
        let dir = std::fs::read_to_string(&file).expect("the program wrote its dir");
        let _ = std::fs::remove_file(&file);
        assert!(!Path::new(dir.trim()).exists(), "{dir} outlived the failed call");

        let script =
            "printf x > \"$SWITCHYARD_OUTPUT_DIR/x.txt\"; echo \"$SWITCHYARD_OUTPUT_DIR\" > \"$1\"; sleep 30";
        let file = temp_path("timeout-dir");
        let context = json!({});
        let cancel = CancellationToken::new();
        let mut cx = test_cx(0, None, &context, &cancel);
        cx.files = &sink;
        cx.timeout = Duration::from_millis(300);
        let p = plan(&["sh", "-c", script, "sh", file.to_str().expect("utf-8")]);
        let err = CommandAgent(&p).call(&json!({}), cx).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Timeout);
        assert!(sink.take().is_empty());
        let dir = std::fs::read_to_string(&file).expect("the program wrote its dir");
        let _ = std::fs::remove_file(&file);
        assert!(
            !Path::new(dir.trim()).exists(),
            "{dir} outlived the timed-out call"
        );
    }

    #[test]
    fn durations_and_sizes_read_well() {
        assert_eq!(fmt_duration(Duration::from_secs(20)), "20s");
        assert_eq!(fmt_duration(Duration::from_secs(300)), "5m");
        assert_eq!(fmt_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(fmt_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(fmt_duration(Duration::ZERO), "0s");
        assert_eq!(fmt_size(16 << 20), "16 MiB");
        assert_eq!(fmt_size(64 << 10), "64 KiB");
        assert_eq!(fmt_size(1000), "1000 bytes");
        assert_eq!(fmt_size(1), "1 byte");
    }
}
