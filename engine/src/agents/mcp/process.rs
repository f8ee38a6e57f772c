//! A stdio MCP server's process: started without a shell in its own process group, in the
//! flow file's directory, with only its `env:` and `PATH`, `HOME`, `LANG`, `TMPDIR`; the tail
//! of its stderr kept for errors; and its end, in order: stdin closed, then SIGTERM, then
//! SIGKILL of the whole group, even when the leader already exited.

use std::collections::VecDeque;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt as _, AsyncWrite, BufReader};
use tokio::process::{ChildStdin, ChildStdout};

/// The variables of this process a server gets besides its `env:`.
const PASSED: &[&str] = &["PATH", "HOME", "LANG", "TMPDIR"];
/// Lines of stderr kept.
const TAIL_LINES: usize = 20;
/// How long each stage of the shutdown waits for the group to go.
const STAGE: Duration = Duration::from_millis(1000);

/// A started server process.
pub struct ServerProcess {
    pid: i32,
    stdin: Arc<Mutex<Option<ChildStdin>>>,
    child: Mutex<Option<tokio::process::Child>>,
    tail: Arc<Mutex<VecDeque<String>>>,
}

/// The write half given to the session: writes to the child's stdin until [`ServerProcess::end`]
/// closes it.
pub struct Stdin(Arc<Mutex<Option<ChildStdin>>>);

impl AsyncWrite for Stdin {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut() {
            Some(w) => Pin::new(w).poll_write(cx, buf),
            None => Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut() {
            Some(w) => Pin::new(w).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut() {
            Some(w) => Pin::new(w).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

impl ServerProcess {
    /// Starts `argv` in `dir`. `env` holds resolved values. The pipes are for the session.
    pub fn start(
        argv: &[String],
        dir: &Path,
        env: &[(String, String)],
    ) -> std::io::Result<(ServerProcess, ChildStdout, Stdin)> {
        let Some(program) = argv.first() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "`command` is empty",
            ));
        };
        // A program named by a path is relative to the flow's directory; a bare name is
        // looked up in PATH.
        let program = if program.contains('/') {
            dir.join(program).into_os_string()
        } else {
            program.into()
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(&argv[1..])
            .current_dir(dir)
            .env_clear()
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(false);
        for name in PASSED {
            if let Some(v) = std::env::var_os(name) {
                cmd.env(name, v);
            }
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn()?;
        let pid = child.id().map_or(0, |p| p as i32);
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let keep = tail.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            // Kept for errors, which redact the server's secrets; never logged as it comes.
            while let Ok(Some(line)) = lines.next_line().await {
                let mut t = keep.lock().unwrap_or_else(|e| e.into_inner());
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(line);
            }
        });
        let stdin = Arc::new(Mutex::new(Some(stdin)));
        let process = ServerProcess {
            pid,
            stdin: stdin.clone(),
            child: Mutex::new(Some(child)),
            tail,
        };
        Ok((process, stdout, Stdin(stdin)))
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The last lines the server wrote to stderr, joined.
    pub fn stderr_tail(&self) -> String {
        let t = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        t.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Whether the leader has exited, with how (reaping it).
    pub fn exited(&self) -> Option<String> {
        let mut guard = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let child = guard.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(describe(status)),
            Ok(None) => None,
            Err(e) => Some(format!("cannot be waited for ({e})")),
        }
    }

    /// Ends the server and everything in its group: stdin closed and a moment to exit, then
    /// SIGTERM to the group and a moment, then SIGKILL to the group. Blocking; needs no
    /// runtime.
    pub fn end(&self) {
        // Closing stdin is how a stdio server is told to stop.
        drop(self.stdin.lock().unwrap_or_else(|e| e.into_inner()).take());
        if self.pid <= 0 {
            return;
        }
        let leader_gone = |deadline: Instant| {
            while Instant::now() < deadline {
                if self.exited().is_some() || self.child_missing() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            false
        };
        leader_gone(Instant::now() + STAGE);
        // The group may hold what the server started, even when the server itself is gone.
        if group_alive(self.pid) {
            signal_group(self.pid, libc::SIGTERM);
            let deadline = Instant::now() + STAGE;
            while Instant::now() < deadline && group_alive(self.pid) {
                let _ = self.exited();
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        signal_group(self.pid, libc::SIGKILL);
        // Reap the leader, so that no zombie is left behind.
        let deadline = Instant::now() + STAGE;
        while Instant::now() < deadline && self.exited().is_none() && !self.child_missing() {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn child_missing(&self) -> bool {
        self.child.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if !self.child_missing() {
            self.end();
        }
    }
}

/// Whether any process of the group led by `pgid` exists.
fn group_alive(pgid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the group exists.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

fn signal_group(pgid: i32, signal: libc::c_int) {
    // SAFETY: signals the group the server leads; an ended group is ESRCH, ignored.
    unsafe {
        libc::kill(-pgid, signal);
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "exited".to_string(),
    }
}
