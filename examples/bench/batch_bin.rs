//! Shared plumbing of the batch-binary workloads (W5 `batch-binary`, W5x, W7, W9): the
//! generated JSONL input, one `switchyard batch` process timed from spawn to exit and reaped
//! with `wait4` (its own CPU time), its peak RSS, and the check of its output file.
//!
//! Peak RSS is the child's `VmHWM` (`/proc/PID/status`), polled every millisecond until it exits
//! ([`run_polled`], in processes that are not timed), not `wait4`'s `ru_maxrss`: Linux carries the
//! high-water mark of the memory the child had before `exec` (a copy of the harness's, or the
//! harness's own with `vfork`) into `ru_maxrss`, so a small child of a 20 MiB harness reports
//! 20 MiB.
//!
//! Every item is `{"i": k}` and is identified by `--id-field i`, so output line k must be
//! `{"id": k, "status": "succeeded", "output": {"i": k, "result": 2k}, ...}`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The flow every batch workload runs (BENCH.md W5): one 50 ms mock call per run.
pub const FLOW: &str = "w5_batch.yaml";
/// The mock agent's latency.
pub const LATENCY_S: f64 = 0.05;

/// One `switchyard batch` command line, run in `cwd` (so that nothing the binary writes relative
/// to the working directory lands in the repository).
#[derive(Clone, Debug)]
pub struct BatchCmd {
    pub bin: PathBuf,
    pub input: PathBuf,
    /// Absolute: the batch is identified by its output path.
    pub output: PathBuf,
    pub concurrency: usize,
    /// `memory` or `sqlite:PATH`.
    pub store: String,
    pub cwd: PathBuf,
    /// Where the process's stdout and stderr go.
    pub log: PathBuf,
}

/// How one process ended, measured by its parent.
#[derive(Clone, Debug)]
pub struct Exit {
    /// Spawn to reaped exit.
    pub wall_s: f64,
    /// The child's own CPU time (user + system, every thread), from `wait4`.
    pub cpu_s: f64,
    /// The raw wait status.
    status: i32,
}

impl Exit {
    pub fn success(&self) -> bool {
        libc::WIFEXITED(self.status) && libc::WEXITSTATUS(self.status) == 0
    }

    pub fn killed_by_sigkill(&self) -> bool {
        libc::WIFSIGNALED(self.status) && libc::WTERMSIG(self.status) == libc::SIGKILL
    }

    pub fn describe(&self) -> String {
        if libc::WIFEXITED(self.status) {
            format!("exit status {}", libc::WEXITSTATUS(self.status))
        } else if libc::WIFSIGNALED(self.status) {
            format!("killed by signal {}", libc::WTERMSIG(self.status))
        } else {
            format!("wait status {:#x}", self.status)
        }
    }
}

/// The flow file, absolute.
pub fn flow_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/bench")
        .join(FLOW)
}

/// Writes `n` lines `{"i": k}`.
/// A batch in a fresh folder `dir/name` with its own SQLite store (`name/runs.db`, output
/// `name/out.jsonl`); returns the command and the store URL.
pub fn fresh_sqlite(
    bin: &Path,
    dir: &Path,
    input: &Path,
    name: &str,
    concurrency: usize,
) -> Result<(BatchCmd, String), String> {
    let sub = dir.join(name);
    if sub.exists() {
        std::fs::remove_dir_all(&sub).map_err(|e| format!("cannot empty `{}`: {e}", sub.display()))?;
    }
    std::fs::create_dir_all(&sub).map_err(|e| format!("cannot create `{}`: {e}", sub.display()))?;
    let url = format!("sqlite:{}", sub.join("runs.db").display());
    Ok((
        BatchCmd {
            bin: bin.to_path_buf(),
            input: input.to_path_buf(),
            output: sub.join("out.jsonl"),
            concurrency,
            store: url.clone(),
            cwd: sub.clone(),
            log: sub.join("log.txt"),
        },
        url,
    ))
}

pub fn write_input(path: &Path, n: usize) -> Result<(), String> {
    let mut text = String::with_capacity(n * 12);
    for k in 0..n {
        text.push_str("{\"i\":");
        text.push_str(&k.to_string());
        text.push_str("}\n");
    }
    crate::util::write_file(path, &text)
}

/// Starts the batch; the instant is taken just before the spawn.
pub fn spawn(cmd: &BatchCmd) -> Result<(Child, Instant), String> {
    spawn_flow(cmd, &flow_path())
}

/// [`spawn`] with another flow file than [`FLOW`].
pub fn spawn_flow(cmd: &BatchCmd, flow: &Path) -> Result<(Child, Instant), String> {
    spawn_with(cmd, flow, &[])
}

/// [`spawn_flow`] with more arguments after the others (`--files DIR`).
pub fn spawn_with(cmd: &BatchCmd, flow: &Path, extra: &[&str]) -> Result<(Child, Instant), String> {
    let log =
        std::fs::File::create(&cmd.log).map_err(|e| format!("cannot create `{}`: {e}", cmd.log.display()))?;
    let log2 = log
        .try_clone()
        .map_err(|e| format!("cannot share `{}`: {e}", cmd.log.display()))?;
    let mut c = Command::new(&cmd.bin);
    c.arg("batch")
        .arg(flow)
        .arg("--input")
        .arg(&cmd.input)
        .arg("--output")
        .arg(&cmd.output)
        .arg("--concurrency")
        .arg(cmd.concurrency.to_string())
        .args(["--id-field", "i", "--store", &cmd.store])
        .args(extra)
        .current_dir(&cmd.cwd)
        .env_remove("SWITCHYARD_STORE")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    let t0 = Instant::now();
    let child = c
        .spawn()
        .map_err(|e| format!("cannot start `{}`: {e}", cmd.bin.display()))?;
    Ok((child, t0))
}

/// Reaps `child` with `wait4` (blocking, or `None` at once if it still runs and `block` is
/// false). The `Child` must not be waited for by anyone else.
pub fn reap(child: &Child, t0: Instant, block: bool) -> Result<Option<Exit>, String> {
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: `wait4` writes only into the status and rusage it is given; zero is a valid rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let flags = if block { 0 } else { libc::WNOHANG };
    loop {
        // SAFETY: as above; `pid` is our own unreaped child.
        let r = unsafe { libc::wait4(pid, &mut status, flags, &mut ru) };
        if r == pid {
            let wall_s = t0.elapsed().as_secs_f64();
            let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
            return Ok(Some(Exit {
                wall_s,
                cpu_s: tv(ru.ru_utime) + tv(ru.ru_stime),
                status,
            }));
        }
        if r == 0 {
            return Ok(None);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("wait4({pid}): {e}"));
        }
    }
}

/// Runs the batch to its end; anything but exit 0 fails the benchmark (with the log's tail).
pub fn run(cmd: &BatchCmd) -> Result<Exit, String> {
    run_flow(cmd, &flow_path())
}

/// [`run`] with another flow file than [`FLOW`].
pub fn run_flow(cmd: &BatchCmd, flow: &Path) -> Result<Exit, String> {
    run_with(cmd, flow, &[])
}

/// [`run_flow`] with more arguments ([`spawn_with`]).
pub fn run_with(cmd: &BatchCmd, flow: &Path, extra: &[&str]) -> Result<Exit, String> {
    let (child, t0) = spawn_with(cmd, flow, extra)?;
    let exit = reap(&child, t0, true)?.ok_or("wait4 returned nothing")?;
    if !exit.success() {
        return Err(format!(
            "`switchyard batch` ({} items file `{}`, store `{}`) ended with {}: {}",
            count_lines(&cmd.input),
            cmd.input.display(),
            cmd.store,
            exit.describe(),
            log_tail(&cmd.log)
        ));
    }
    Ok(exit)
}

/// Runs the batch to its end like [`run`], reading its `VmHWM` every millisecond meanwhile:
/// returns the exit (its wall is only good to the millisecond, and the polling disturbs it a
/// little: do not time these) and the highest `VmHWM` seen, in KiB. The last read is at most a
/// millisecond before the exit.
pub fn run_polled(cmd: &BatchCmd) -> Result<(Exit, u64), String> {
    run_polled_flow(cmd, &flow_path())
}

/// [`run_polled`] with another flow file than [`FLOW`].
pub fn run_polled_flow(cmd: &BatchCmd, flow: &Path) -> Result<(Exit, u64), String> {
    run_polled_with(cmd, flow, &[])
}

/// [`run_polled_flow`] with more arguments ([`spawn_with`]).
pub fn run_polled_with(cmd: &BatchCmd, flow: &Path, extra: &[&str]) -> Result<(Exit, u64), String> {
    let (child, t0) = spawn_with(cmd, flow, extra)?;
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0u64;
    let exit = loop {
        if let Some(hwm) = std::fs::read_to_string(&status)
            .ok()
            .as_deref()
            .and_then(vm_hwm_kib)
        {
            peak = peak.max(hwm);
        }
        if let Some(exit) = reap(&child, t0, false)? {
            break exit;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    if !exit.success() {
        return Err(format!(
            "`switchyard batch` (`{}`, store `{}`) ended with {}: {}",
            cmd.input.display(),
            cmd.store,
            exit.describe(),
            log_tail(&cmd.log)
        ));
    }
    if peak == 0 {
        return Err(format!(
            "never read the VmHWM of `switchyard batch` (`{}`)",
            cmd.input.display()
        ));
    }
    Ok((exit, peak))
}

/// `VmHWM` of a `/proc/PID/status` text, KiB (none once the process is a zombie).
fn vm_hwm_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// When [`run_killed`] sends the SIGKILL.
#[derive(Clone, Copy, Debug)]
pub enum KillAt {
    /// This long after the spawn.
    After(Duration),
    /// As soon as the output file holds this many complete lines (the batch's progress, as its
    /// progress bar counts it), watched every quarter of a millisecond.
    Lines(usize),
}

/// Runs the batch, SIGKILLs it at `at`, and reaps it. Fails if it ended on its own before the
/// kill (the crash then did not happen).
pub fn run_killed(cmd: &BatchCmd, at: KillAt) -> Result<Exit, String> {
    let (child, t0) = spawn(cmd)?;
    let ended_first = |exit: Exit| {
        Err(format!(
            "the batch ended ({}) after {:.3} s, before the SIGKILL planned at {at:?}: {}",
            exit.describe(),
            exit.wall_s,
            log_tail(&cmd.log)
        ))
    };
    match at {
        KillAt::After(after) => {
            let until = t0 + after;
            let now = Instant::now();
            if until > now {
                std::thread::sleep(until - now);
            }
            if let Some(exit) = reap(&child, t0, false)? {
                return ended_first(exit);
            }
        }
        KillAt::Lines(lines) => {
            let mut watch = LineWatch::new(&cmd.output);
            while watch.lines()? < lines {
                if let Some(exit) = reap(&child, t0, false)? {
                    return ended_first(exit);
                }
                std::thread::sleep(Duration::from_micros(250));
            }
        }
    }
    // SAFETY: sends a signal to our own child, which is not reaped yet (its pid is still ours).
    if unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) } != 0 {
        return Err(format!("kill: {}", std::io::Error::last_os_error()));
    }
    let exit = reap(&child, t0, true)?.ok_or("wait4 returned nothing")?;
    if !exit.killed_by_sigkill() {
        return Err(format!(
            "the batch ended with {} around the SIGKILL at {at:?}, not by it",
            exit.describe()
        ));
    }
    Ok(exit)
}

/// Counts the newlines of a file that a running batch appends to, reading only what is new
/// each time (the file need not exist yet). The batch must start it empty: a fresh output.
struct LineWatch<'a> {
    path: &'a Path,
    file: Option<std::fs::File>,
    lines: usize,
    buf: Vec<u8>,
}

impl<'a> LineWatch<'a> {
    fn new(path: &'a Path) -> Self {
        Self {
            path,
            file: None,
            lines: 0,
            buf: vec![0; 64 * 1024],
        }
    }

    fn lines(&mut self) -> Result<usize, String> {
        use std::io::Read;
        if self.file.is_none() {
            match std::fs::File::open(self.path) {
                Ok(f) => self.file = Some(f),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
                Err(e) => return Err(format!("cannot read `{}`: {e}", self.path.display())),
            }
        }
        let file = self.file.as_mut().expect("opened above");
        loop {
            let n = file
                .read(&mut self.buf)
                .map_err(|e| format!("cannot read `{}`: {e}", self.path.display()))?;
            if n == 0 {
                return Ok(self.lines);
            }
            self.lines += self.buf[..n].iter().filter(|&&c| c == b'\n').count();
        }
    }
}

/// The last lines the process wrote (for error messages).
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(6)..].join(" | ");
    if tail.is_empty() {
        "(no output)".to_string()
    } else {
        tail
    }
}

/// How many items the last start took from an earlier one (`(N from an earlier start)` in the
/// summary line `switchyard batch` prints on stderr); 0 when it does not say.
pub fn reused_items(log: &Path) -> u64 {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .rev()
        .find_map(|l| {
            let (before, _) = l.split_once(" from an earlier start")?;
            before.rsplit('(').next()?.trim().parse().ok()
        })
        .unwrap_or(0)
}

/// Lines of a file (0 if it cannot be read).
pub fn count_lines(path: &Path) -> usize {
    std::fs::read(path)
        .map(|b| b.iter().filter(|&&c| c == b'\n').count())
        .unwrap_or(0)
}

/// Output line k is item k, succeeded, with output `{i: k, result: 2k}`: every id exactly once,
/// in input order, nothing missing, nothing extra.
pub fn check_output(path: &Path, n: usize) -> Result<(), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the output `{}`: {e}", path.display()))?;
    let mut count = 0usize;
    for (k, line) in text.lines().enumerate() {
        count += 1;
        if k >= n {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .map_err(|e| format!("output line {}: not JSON ({e}): {line}", k + 1))?;
        // The id is the input's `i`, a number.
        let id = v.get("id").and_then(Value::as_u64);
        if id != Some(k as u64) {
            return Err(format!(
                "output line {}: expected item `{k}`, got id {:?} (output out of order, lost or duplicated)",
                k + 1,
                v.get("id")
            ));
        }
        if v.get("status").and_then(Value::as_str) != Some("succeeded") {
            return Err(format!("output line {}: item {k} did not succeed: {line}", k + 1));
        }
        let want = json!({"i": k, "result": 2 * k});
        if v.get("output") != Some(&want) {
            return Err(format!(
                "output line {}: item {k}: expected output {want}, got {:?}",
                k + 1,
                v.get("output")
            ));
        }
    }
    if count != n {
        return Err(format!("`{}` has {count} lines for {n} items", path.display()));
    }
    if !text.is_empty() && !text.ends_with('\n') {
        return Err(format!("`{}` ends with a torn line", path.display()));
    }
    Ok(())
}

/// Ideal wall of a batch per BENCH.md: N × 0.05 s / concurrency.
pub fn ideal_s(n: usize, concurrency: usize) -> f64 {
    n as f64 * LATENCY_S / concurrency as f64
}

/// Reads a finished batch back from its SQLite store, in-process (after the command exited):
/// every item has exactly one run, and it succeeded. Returns the number of runs. A second run of
/// an item (a finished item run again after a crash) or a missing one fails the benchmark.
pub fn check_store(url: &str, output: &Path, n: usize) -> Result<usize, String> {
    use switchyard::__private::record::RunStatus;
    use switchyard::__private::store::Store;
    use switchyard::__private::store::any::AnyStore;
    // The batch is named by its output's canonical path.
    let batch = std::fs::canonicalize(output)
        .map_err(|e| format!("cannot resolve `{}`: {e}", output.display()))?
        .display()
        .to_string();
    let rt = crate::util::tokio_runtime()?;
    rt.block_on(async {
        let store = AnyStore::open(url)
            .await
            .map_err(|e| format!("cannot open `{url}`: {e}"))?;
        let runs = store
            .batch_runs(&batch, 0, 2 * n + 16)
            .await
            .map_err(|e| format!("`{url}`: {e}"));
        store.close().await;
        let runs = runs?;
        let mut per_item = vec![0u32; n];
        for r in &runs {
            let k = r.item_index.unwrap_or(u64::MAX) as usize;
            let Some(c) = per_item.get_mut(k) else {
                return Err(format!("run `{}` of the batch has item index {:?}", r.id, r.item_index));
            };
            *c += 1;
            if r.status != RunStatus::Succeeded {
                return Err(format!("run `{}` (item {k}) is {} in the store", r.id, r.status.as_str()));
            }
        }
        let lost = per_item.iter().filter(|&&c| c == 0).count();
        let dup = per_item.iter().filter(|&&c| c > 1).count();
        if lost > 0 || dup > 0 {
            return Err(format!(
                "the store holds {} runs for {n} items: {lost} item(s) without a run, {dup} item(s) run more than once",
                runs.len()
            ));
        }
        Ok(runs.len())
    })
}
