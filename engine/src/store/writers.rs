//! Who advances a run (SPEC §7.3, one writer per run): the [`Writer`] a process takes a run
//! as, and how another process tells whether that writer is still alive.
//!
//! A writer names its host and process (pid and the process's start time, so that a pid
//! reused by a later process is not taken for it) and carries a random token of its own,
//! new for every take: a release or a renewal touches only its own holding. Stores keep the
//! writer of each run a `run` or a `resume` advances ([`super::Store::take_run`]); a holding
//! whose lease lapsed, or whose process is verifiably gone on this host, is free to take.

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::sync::{LazyLock, Mutex};

/// The tokens of this process's writers that are not retired: within the process, a holding
/// whose holder was dropped (a run's future dropped mid-way) is known gone without its pid.
static LIVE: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Mutex::default);

/// A process advancing a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Writer {
    /// Random, new for each take.
    pub token: String,
    /// The machine's name.
    pub host: String,
    pub pid: u32,
    /// When the process started (clock ticks since boot, from `/proc/PID/stat`), when known.
    pub started: Option<u64>,
}

impl Writer {
    /// This process, with a new token, live until [`Writer::retire`]d.
    pub fn this_process() -> Writer {
        let pid = std::process::id();
        let token = new_token();
        live().insert(token.clone());
        Writer {
            token,
            host: host_name(),
            pid,
            started: process_start(pid),
        }
    }

    /// Marks this writer of this process gone: what it still holds may be taken at once.
    pub fn retire(&self) {
        live().remove(&self.token);
    }

    /// Whether the writer is verifiably gone: it ran on this host, and no process of its pid
    /// exists now, or the one that does started at another time — or it is this process's
    /// and retired. False whenever that cannot be told (another host): then only its lease
    /// lapsing frees the run.
    pub fn is_gone(&self) -> bool {
        if self.host != host_name() {
            return false;
        }
        if self.pid == std::process::id() && self.started == process_start(self.pid) {
            return !live().contains(&self.token);
        }
        let Ok(pid) = libc::pid_t::try_from(self.pid) else {
            return false;
        };
        // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
        let exists = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if !exists {
            return true;
        }
        // A process that exited but whose parent has not reaped it yet (a zombie) still has
        // its pid and start time, and holds nothing.
        if process_state(self.pid).is_some_and(|s| s == 'Z' || s == 'X') {
            return true;
        }
        match (self.started, process_start(self.pid)) {
            (Some(then), Some(now)) => then != now,
            _ => false,
        }
    }
}

fn live() -> std::sync::MutexGuard<'static, HashSet<String>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process and host a submitted run's lease holder's id names (a worker's id,
/// `HOST-PID-RANDOM`, or a `resume`'s, `resume-HOST-PID-RANDOM`), when it has that shape.
pub fn lease_holder_process(id: &str) -> Option<(u32, String)> {
    let mut parts = id.rsplitn(3, '-');
    let _random = parts.next()?;
    let pid = parts.next()?.parse().ok()?;
    let host = parts.next()?;
    Some((pid, host.strip_prefix("resume-").unwrap_or(host).to_string()))
}

/// This machine's name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The process holding the `flock` of `file` (a batch's output file), from `/proc/locks`,
/// when this host tells it.
pub fn lock_holder(file: &std::fs::File) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata().ok()?;
    // The file as `/proc/locks` names it: its device's major and minor numbers in hex, and
    // its inode.
    let dev = meta.dev();
    let file_id = format!("{:02x}:{:02x}:{}", libc::major(dev), libc::minor(dev), meta.ino());
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        // `1: FLOCK  ADVISORY  WRITE 12345 fe:00:5497306 0 EOF`; a waiter's line has `->`.
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, "FLOCK", _, _, pid, id, ..] = fields.as_slice() else {
            return None;
        };
        (*id == file_id).then(|| pid.parse().ok()).flatten()
    })
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`, after the parenthesized
/// command name, which may hold spaces and parentheses itself).
fn process_start(pid: u32) -> Option<u64> {
    // Fields from the third (state) on: the start time is the 20th of them.
    stat_fields(pid)?.split_whitespace().nth(19)?.parse().ok()
}

/// The state of process `pid` (field 3 of `/proc/PID/stat`: `R`, `S`, `Z` for a zombie, ...).
fn process_state(pid: u32) -> Option<char> {
    stat_fields(pid)?.split_whitespace().next()?.chars().next()
}

/// `/proc/PID/stat` from its third field on.
fn stat_fields(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat[stat.rfind(')')? + 1..].to_string())
}

fn new_token() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::hash::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_finished_child_is_gone() {
        let me = Writer::this_process();
        assert!(!me.is_gone());
        assert!(me.started.is_some(), "/proc gives the start time");
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait");
        let gone = Writer {
            pid,
            started: Some(1),
            ..Writer::this_process()
        };
        assert!(gone.is_gone());
        let elsewhere = Writer {
            host: format!("{}-elsewhere", host_name()),
            ..gone
        };
        assert!(
            !elsewhere.is_gone(),
            "a process on another host cannot be told gone"
        );
    }

    #[test]
    fn an_exited_child_not_yet_reaped_is_gone() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        let started = process_start(pid);
        // Until this process waits for it, the child stays a zombie.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while process_state(pid) != Some('Z') {
            assert!(std::time::Instant::now() < deadline, "the child never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let zombie = Writer {
            pid,
            started,
            ..Writer::this_process()
        };
        assert!(zombie.is_gone(), "a zombie holds nothing");
        child.wait().expect("wait");
    }

    #[test]
    fn the_holder_of_a_files_lock_is_found() {
        let path = std::env::temp_dir().join(format!("sy-lock-holder-{}", std::process::id()));
        let held = std::fs::File::create(&path).expect("create");
        assert_eq!(lock_holder(&held), None);
        held.lock().expect("lock");
        let other = std::fs::File::open(&path).expect("open");
        assert_eq!(lock_holder(&other), Some(std::process::id()));
        drop(held);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_retired_writer_of_this_process_is_gone() {
        let me = Writer::this_process();
        let other = Writer::this_process();
        me.retire();
        assert!(me.is_gone() && !other.is_gone());
    }

    #[test]
    fn a_reused_pid_is_not_the_writer() {
        let me = Writer::this_process();
        let earlier = Writer {
            started: me.started.map(|s| s + 1),
            ..me.clone()
        };
        assert!(earlier.is_gone());
        assert_ne!(Writer::this_process().token, me.token);
    }
}
