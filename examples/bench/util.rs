//! Shared plumbing: where generated inputs go, finding the release binary, fresh child
//! processes of the harness itself, and reading peak memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The hidden first argument that makes the harness a measured child process.
pub const CHILD_ARG: &str = "--child";

/// A folder of generated inputs, `examples/bench/generated/<name>.<pid>` (the folder is
/// gitignored). Each harness process has its own, so that concurrent runs do not trample each
/// other's files; it is removed when dropped unless `--keep-generated` was given. Folders left
/// by harness processes that no longer exist are removed on creation.
pub struct GeneratedDir {
    pub path: PathBuf,
    keep: bool,
}

impl GeneratedDir {
    pub fn create(name: &str, keep: bool) -> Result<GeneratedDir, String> {
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/bench/generated");
        remove_stale(&base, name);
        let path = base.join(format!("{name}.{}", std::process::id()));
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(|e| format!("cannot empty `{}`: {e}", path.display()))?;
        }
        std::fs::create_dir_all(&path).map_err(|e| format!("cannot create `{}`: {e}", path.display()))?;
        Ok(GeneratedDir { path, keep })
    }
}

impl Drop for GeneratedDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Removes `<name>.<pid>` folders under `base` whose process is gone.
fn remove_stale(base: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let file_name = e.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(name)?.strip_prefix('.'))
        else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Writes a generated file, naming it in the error.
pub fn write_file(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write `{}`: {e}", path.display()))
}

/// The release `switchyard` binary: `target/release/switchyard`, next to this example's own
/// `target/release/examples/bench`. Warns on stderr when the library was rebuilt after it (the
/// binary is then probably stale: `cargo run --example` does not rebuild binaries).
pub fn release_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the harness executable: {e}"))?;
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("unexpected harness location `{}`", exe.display()))?;
    let bin = dir.join(format!("switchyard{}", std::env::consts::EXE_SUFFIX));
    let meta = std::fs::metadata(&bin).map_err(|_| {
        format!("`{}` not found: build it first with `cargo build --release` (or `cargo build --release --examples --bins`)", bin.display())
    })?;
    if let (Ok(bin_time), Some(lib_time)) = (meta.modified(), newest_lib(dir))
        && lib_time > bin_time
    {
        eprintln!(
            "warning: `{}` is older than the library it is built from; run `cargo build --release` to measure the current code",
            bin.display()
        );
    }
    Ok(bin)
}

/// The modification time of the newest `libswitchyard-*.rlib` under `target/<profile>/deps`.
fn newest_lib(profile_dir: &Path) -> Option<std::time::SystemTime> {
    std::fs::read_dir(profile_dir.join("deps"))
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("libswitchyard-") && name.ends_with(".rlib")
        })
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .max()
}

/// Runs the harness itself as `--child <args...>` in a fresh process and returns its stdout.
/// Its stderr goes to ours. A non-zero exit is a failed benchmark.
pub fn run_child(args: &[&str]) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the harness executable: {e}"))?;
    let out = Command::new(&exe)
        .arg(CHILD_ARG)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start `{}`: {e}", exe.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "child `{}` failed ({}): {}",
            args.join(" "),
            out.status,
            stdout.trim()
        ));
    }
    Ok(stdout)
}

/// Parses `key=value key=value ...` (one child's answer) into numbers.
pub fn parse_fields(text: &str) -> Result<BTreeMap<String, f64>, String> {
    text.split_whitespace()
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("bad child output `{kv}`"))?;
            let v: f64 = v
                .parse()
                .map_err(|_| format!("bad number in child output `{kv}`"))?;
            Ok((k.to_string(), v))
        })
        .collect()
}

/// A named field of a child's answer.
pub fn field(fields: &BTreeMap<String, f64>, key: &str) -> Result<f64, String> {
    fields
        .get(key)
        .copied()
        .ok_or_else(|| format!("child output lacks `{key}`"))
}

/// This process's peak resident set (`VmHWM` in `/proc/self/status`), in KiB.
pub fn peak_rss_kib() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmHWM in /proc/self/status".to_string())
}

/// Milliseconds, as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A flow of this folder (`examples/bench/NAME`), loaded, linted and compiled the way every
/// command does it (`Project::load_top`, `lint::lint_and_compile`). Any diagnostic, a warning
/// included, fails the benchmark: the bench flows lint clean.
pub fn load_plan(name: &str) -> Result<std::sync::Arc<switchyard::__private::plan::Plan>, String> {
    use switchyard::__private::project::Project;
    use switchyard::__private::syntax::Limits;
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/bench")
        .join(name);
    let root = file
        .parent()
        .ok_or("the flow file has no directory")?
        .canonicalize()
        .map_err(|e| format!("cannot resolve the folder of `{}`: {e}", file.display()))?;
    let mut project = Project::default();
    let id = project.load_top(&file, root, &Limits::default());
    let Some(id) = id else {
        let text: Vec<String> = project
            .diags
            .iter()
            .map(|d| format!("{} {}", d.rule.code, d.message))
            .collect();
        return Err(format!(
            "`{}` did not load as a flow: {}",
            file.display(),
            text.join("; ")
        ));
    };
    let (plan, diags) = switchyard::__private::lint::lint_and_compile(&project, id);
    if !diags.is_empty() {
        let text: Vec<String> = diags
            .iter()
            .map(|d| format!("{} {}", d.rule.code, d.message))
            .collect();
        return Err(format!(
            "`{}` does not lint clean: {}",
            file.display(),
            text.join("; ")
        ));
    }
    let plan = plan.ok_or_else(|| format!("`{}` did not compile", file.display()))?;
    Ok(std::sync::Arc::new(plan))
}

/// The tokio runtime runtime workloads run on: multi-threaded, as the commands use.
pub fn tokio_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a tokio runtime: {e}"))
}

/// This process's resource usage so far (`getrusage(RUSAGE_SELF)`), zeroed if it fails.
fn rusage() -> libc::rusage {
    // SAFETY: `getrusage` writes only into the struct it is given; zero is a valid rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        // SAFETY: as above.
        return unsafe { std::mem::zeroed() };
    }
    ru
}

/// CPU time this process has used so far (user + system, every thread).
pub fn cpu_time() -> Duration {
    let ru = rusage();
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Page faults this process has taken so far (minor: no disk), for breakdowns.
pub fn minor_faults() -> u64 {
    rusage().ru_minflt as u64
}

/// Prints (stderr) how much of a workload's time is the memory store's: its median with the
/// memory store against the same runs on a store that keeps nothing.
pub fn store_share(id: &str, unit: &str, with_store: f64, without: f64) {
    eprintln!(
        "{id} breakdown: {with_store:.3} {unit} with the memory store, {without:.3} without a store \
         (a store that keeps nothing): the memory store is {:.0}% of the time",
        100.0 * (with_store - without) / with_store
    );
}
