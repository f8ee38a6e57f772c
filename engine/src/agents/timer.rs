//! A wall-clock timer precise to the operating system's timer slack (tens of microseconds),
//! for the `mock` agent's `latency`.
//!
//! tokio's timer wheel counts whole milliseconds and rounds both the deadline and its own park
//! timeout up, so a `tokio::time::sleep(50ms)` ends 50.5–51.5 ms later: a simulated agent would
//! take 2–3 % longer than it says, and a batch bound by such agents would measure the timer,
//! not the engine. Here one thread keeps the deadlines in a heap and waits on a condition
//! variable until the earliest; a waiter is woken through a oneshot channel, never before its
//! deadline. Deadlines due together are fired in one pass, so a thousand sleeps ending in the
//! same instant cost one wake-up of this thread.
//!
//! The thread starts at the first sleep and lives as long as the process. If it cannot be
//! started, sleeps fall back to tokio's timer. Paused tokio time (tests) does not shorten
//! these sleeps: they are measured on [`std::time::Instant`].

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// Waits `duration` of wall-clock time, ending no earlier than that.
pub async fn sleep(duration: Duration) {
    let deadline = Instant::now() + duration;
    match timer() {
        Some(timer) => {
            let rx = timer.register(deadline);
            // The sender is dropped unsent only if the thread died; the deadline still counts.
            if rx.await.is_err() {
                tokio::time::sleep_until(deadline.into()).await;
            }
        }
        None => tokio::time::sleep_until(deadline.into()).await,
    }
}

struct Timer {
    due: Mutex<BinaryHeap<Reverse<Due>>>,
    changed: Condvar,
}

struct Due {
    deadline: Instant,
    /// Registration order: equal deadlines fire in it, and the heap needs a total order.
    seq: u64,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.seq) == (other.deadline, other.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.deadline, self.seq).cmp(&(other.deadline, other.seq))
    }
}

fn timer() -> Option<&'static Timer> {
    static TIMER: OnceLock<Option<&'static Timer>> = OnceLock::new();
    *TIMER.get_or_init(|| {
        let timer: &'static Timer = Box::leak(Box::new(Timer {
            due: Mutex::new(BinaryHeap::new()),
            changed: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("switchyard-timer".into())
            .spawn(move || timer.run())
            .ok()
            .map(|_| timer)
    })
}

impl Timer {
    fn lock(&self) -> std::sync::MutexGuard<'_, BinaryHeap<Reverse<Due>>> {
        self.due.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(&self, deadline: Instant) -> oneshot::Receiver<()> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let earliest = {
            let mut due = self.lock();
            let earliest = due.peek().is_none_or(|Reverse(d)| deadline < d.deadline);
            due.push(Reverse(Due {
                deadline,
                seq,
                wake: tx,
            }));
            earliest
        };
        // Only a new earliest deadline shortens the thread's wait.
        if earliest {
            self.changed.notify_one();
        }
        rx
    }

    fn run(&self) {
        let mut fired = Vec::new();
        let mut due = self.lock();
        loop {
            let now = Instant::now();
            while due.peek().is_some_and(|Reverse(d)| d.deadline <= now) {
                if let Some(Reverse(d)) = due.pop() {
                    fired.push(d.wake);
                }
            }
            if !fired.is_empty() {
                drop(due);
                // A dropped receiver (its call was cancelled) just refuses the send.
                for wake in fired.drain(..) {
                    let _ = wake.send(());
                }
                due = self.lock();
                continue;
            }
            due = match due.peek().map(|Reverse(d)| d.deadline) {
                Some(next) => {
                    self.changed
                        .wait_timeout(due, next - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.changed.wait(due).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn never_ends_early_and_ends_close_to_the_deadline() {
        for ms in [1u64, 7, 20] {
            let start = Instant::now();
            sleep(Duration::from_millis(ms)).await;
            let took = start.elapsed();
            assert!(took >= Duration::from_millis(ms), "{ms} ms took {took:?}");
            // Generous: a loaded machine may be late, but not by the timer's own rounding.
            assert!(took < Duration::from_millis(ms + 200), "{ms} ms took {took:?}");
        }
    }

    #[tokio::test]
    async fn many_sleeps_end_in_deadline_order_whatever_the_registration_order() {
        let start = Instant::now();
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, ms) in [30u64, 10, 20, 10, 5].into_iter().enumerate() {
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                sleep(Duration::from_millis(ms)).await;
                assert!(start.elapsed() >= Duration::from_millis(ms));
                order.lock().unwrap().push((ms, i));
            }));
        }
        for t in tasks {
            t.await.expect("sleeper");
        }
        let order = order.lock().unwrap().clone();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(
            order.iter().map(|o| o.0).collect::<Vec<_>>(),
            sorted.iter().map(|o| o.0).collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn a_dropped_sleep_does_not_stop_the_others() {
        let dropped = tokio::time::timeout(Duration::from_millis(5), sleep(Duration::from_secs(3600))).await;
        assert!(dropped.is_err());
        let start = Instant::now();
        sleep(Duration::from_millis(10)).await;
        assert!(start.elapsed() >= Duration::from_millis(10));
    }
}
