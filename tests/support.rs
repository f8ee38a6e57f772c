//! Shared helpers of the integration tests: running the real `switchyard` binary with a time
//! limit, reading its JSON diagnostics, and temporary directories that clean up after
//! themselves.
//!
//! Nothing here knows about particular rules; the test modules say what they expect.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_switchyard");

/// How long any one run of the binary may take before it is killed and the test fails as a
/// hang. Generous: debug builds on a loaded CI machine are slow; this only catches hangs.
pub const HANG: Duration = Duration::from_secs(20);

/// The directory of the lint fixtures, one folder per rule.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lint")
}

/// What a finished run of the binary printed.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The exit code; panics (naming the output) when the process was killed by a signal.
    pub fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("killed by a signal: {self:?}"))
    }

    /// stdout parsed as the JSON array of `--format json`.
    pub fn diagnostics(&self) -> Vec<JsonDiagnostic> {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not a JSON array of diagnostics ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

/// A `switchyard` command with colour off, a fixed width and no inherited `COLUMNS`.
pub fn switchyard(cwd: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.current_dir(cwd)
        .env("NO_COLOR", "1")
        .env("COLUMNS", "100")
        // Runs are recorded in memory unless a test names a store with `--store`.
        .env("SWITCHYARD_STORE", "memory")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null());
    cmd
}

/// Runs `cmd` to completion, killing it (and failing the test) after [`HANG`].
pub fn run(cmd: &mut Command) -> Output {
    run_with_limit(cmd, HANG)
}

/// Runs `cmd`, killing it after `limit`; panics with a clear message on a hang.
pub fn run_with_limit(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let stdout = drain(child.stdout.take().expect("piped"));
    let stderr = drain(child.stderr.take().expect("piped"));
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait().expect("waiting for the child") {
            Some(status) => break status,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{cmd:?} did not finish within {limit:?}: a hang");
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

/// Reads a pipe to its end on a thread, so a chatty child never blocks on a full pipe.
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// `switchyard lint ARGS... --format json` in `cwd`.
pub fn lint_json(cwd: &Path, args: &[&str]) -> Output {
    run(switchyard(cwd).arg("lint").args(args).args(["--format", "json"]))
}

/// One diagnostic of `--format json`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct JsonDiagnostic {
    pub code: String,
    pub rule: String,
    pub severity: String,
    pub message: String,
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
    pub help: Option<String>,
    pub labels: Vec<JsonLabel>,
}

/// A label of a JSON diagnostic: the primary one first, then the secondary ones.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct JsonLabel {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
    pub message: String,
    pub primary: bool,
}

/// A directory under the system temp dir with a name no other test (or test process) uses;
/// removed with everything in it when dropped.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!(
            "switchyard-test-{tag}-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&path).expect("create a temp dir");
        // Canonical, so that paths the binary prints relative to its working directory match.
        let path = path.canonicalize().expect("canonical temp dir");
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `contents` to `name` (a relative path, parent folders created) and returns the
    /// full path.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let p = self.path.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("create parent folders");
        }
        std::fs::write(&p, contents).expect("write a temp file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A small flow that lints clean.
pub const CLEAN_FLOW: &str = "\
flow: clean
agents:
  fetcher:
    kind: mock
    returns: {ok: true}
steps:
  fetch:
    agent: fetcher
    output: {$.fetched: $}
    next: done
  done:
    succeed: {}
";

/// A flow whose only problem is a warning (SY211: conditional edges without a fallback).
pub const WARNING_FLOW: &str = "\
flow: warns
agents:
  fetcher:
    kind: mock
    returns: {ok: true}
steps:
  fetch:
    agent: fetcher
    next:
      - to: done
        if: result.ok
  done:
    succeed: {}
";

/// A flow with errors: an edge to a step that does not exist (SY201), which leaves the step it
/// meant unreachable (SY205).
pub const ERROR_FLOW: &str = "\
flow: broken
agents:
  fetcher:
    kind: mock
    returns: {ok: true}
steps:
  fetch:
    agent: fetcher
    output: {$.fetched: $}
    next: fetch_doc
  fetch_docs:
    succeed: {}
";

/// The run id in "continue it with `switchyard resume ID ...`".
pub fn run_id_from(stderr: &str) -> String {
    stderr
        .split("switchyard resume ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("names the run: {stderr}"))
        .to_string()
}

/// Sends SIGINT to `child` (as Ctrl-C does) and waits for it: its exit code (`None` if a
/// signal ended it) and its stderr.
pub fn interrupt(child: std::process::Child) -> (Option<i32>, String) {
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -INT {}", child.id());
    let out = child.wait_with_output().expect("exits");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A flow of `command` steps run one after another (`steps`, in order), each appending a line
/// to `calls` and taking 0.4 s: long enough to stop a run between two of them.
pub fn slow_steps_flow(calls: &Path, steps: &[&str]) -> String {
    let mut flow = format!(
        "flow: slow\nagents:\n  work:\n    kind: command\n    run: [sh, -c, 'cat >/dev/null; echo x >> \"{}\"; sleep 0.4; echo \"{{\\\"ok\\\": true}}\"']\nsteps:\n",
        calls.display()
    );
    for (i, step) in steps.iter().enumerate() {
        let next = steps
            .get(i + 1)
            .map(|n| format!(", next: {n}"))
            .unwrap_or_default();
        flow.push_str(&format!(
            "  {step}: {{agent: work, output: {{$.{step}: $.ok}}{next}}}\n"
        ));
    }
    flow
}

/// The proptest configuration of the property tests: `cases` cases with a fixed seed, so CI
/// runs are reproducible; `PROPTEST_RNG_SEED=<n>` explores other inputs and
/// `PROPTEST_CASES=<n>` runs more of them. Failures are not persisted to files; proptest
/// prints the shrunk input instead.
pub fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    use proptest::test_runner::{Config, RngSeed};
    let mut config = Config {
        failure_persistence: None,
        ..Config::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(0x5eed_2026);
    }
    config
}

/// The MCP fixture server (`examples/mcp_fixture.rs`), beside the binary under test:
/// `cargo test` builds the examples with the tests. A focused run (`cargo test --test main`)
/// does not; build it once with `cargo build --example mcp_fixture`.
pub fn mcp_fixture() -> PathBuf {
    let bin = Path::new(BIN);
    let dir = bin.parent().expect("the binary's directory");
    let path = dir.join("examples").join("mcp_fixture");
    assert!(
        path.is_file(),
        "{} is missing: `cargo test` builds it, or `cargo build --example mcp_fixture`",
        path.display()
    );
    path
}

/// The pids a fixture server wrote to its `MCP_FIXTURE_PIDS` file, one per process started.
pub fn fixture_pids(file: &Path) -> Vec<i32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|line| line.trim().parse().expect("a pid per line"))
        .collect()
}

/// Whether a process (or a zombie not yet reaped) has this pid.
pub fn process_alive(pid: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command's closing parenthesis; a zombie has exited.
    match status.rsplit_once(") ") {
        Some((_, rest)) => !rest.starts_with('Z'),
        None => false,
    }
}
