//! Workload sizes: `full` (BENCH.md's sizes) and `quick` (the same shapes, for a run of a few
//! minutes). A workload reads its sizes from here and nowhere else.

/// Timed repetitions per measurement (after one checked warm-up); `value` is their median.
pub const RUNS: usize = 5;

#[derive(Clone, Debug)]
pub struct Profile {
    pub name: &'static str,
    /// W6: steps of the generated linear flow.
    pub w6_steps: usize,
    /// W8: flow files linted by one `switchyard lint DIR`.
    pub w8_files: usize,
    /// W8: steps per flow file (approximately: the generator varies it a little).
    pub w8_steps: usize,
    /// W1: sequential runs of the 20-step chain.
    pub w1_runs: usize,
    /// W2: sequential runs of the branching flow.
    pub w2_runs: usize,
    /// W3: items of the `foreach` (the linearity check also runs twice as many).
    pub w3_items: usize,
    /// W4: iterations of the `while` loop (the linearity check also runs twice as many).
    pub w4_iterations: usize,
    /// W5 (both variants) and W7: runs of the 50 ms mock flow, 64 in flight.
    pub w5_runs: usize,
    /// W5x: items of the wide batch.
    pub w5x_runs: usize,
    /// W5x: runs in flight.
    pub w5x_concurrency: usize,
    /// W9: items of the batch killed and resumed (64 in flight, SQLite).
    pub w9_runs: usize,
    /// W10: lines of the long batch on the memory store.
    pub w10_memory_lines: usize,
    /// W10: lines of the long batch on SQLite.
    pub w10_sqlite_lines: usize,
    /// W12: agent loops of the batch, all in flight at once.
    pub w12_loops: usize,
    /// W11: items of the latency-bound batch run by 1, 2 and 4 workers.
    pub w11_items: usize,
    /// W11: items of the zero-latency batch run by one worker.
    pub w11_zero_items: usize,
    /// W13: items of the batch of MCP tool calls (each transport).
    pub w13_items: usize,
    /// W14: items each making one file of 100 KiB (the RSS check also runs twice as many).
    pub w14_items: usize,
    /// W15: waiting items in the inbox (as many interrupted runs).
    pub w15_items: usize,
}

impl Profile {
    pub const FULL: Profile = Profile {
        name: "full",
        w6_steps: 5000,
        w8_files: 1000,
        w8_steps: 50,
        w1_runs: 2000,
        w2_runs: 20000,
        w3_items: 10000,
        w4_iterations: 10000,
        w5_runs: 2000,
        w5x_runs: 20000,
        w5x_concurrency: 2000,
        w9_runs: 2000,
        w10_memory_lines: 1_000_000,
        w10_sqlite_lines: 1_000_000,
        w12_loops: 20,
        w11_items: 2000,
        w11_zero_items: 20000,
        w13_items: 10000,
        w14_items: 10000,
        w15_items: 100_000,
    };
    /// W6, W8 and W5x (0.5 s of ideal wall) are cheap: the same sizes as `full`; the runtime
    /// workloads are smaller.
    pub const QUICK: Profile = Profile {
        name: "quick",
        w6_steps: 5000,
        w8_files: 1000,
        w8_steps: 50,
        w1_runs: 200,
        w2_runs: 1000,
        w3_items: 2000,
        w4_iterations: 2000,
        w5_runs: 640,
        w5x_runs: 20000,
        w5x_concurrency: 2000,
        w9_runs: 640,
        w10_memory_lines: 100_000,
        w10_sqlite_lines: 20_000,
        w12_loops: 20,
        w11_items: 640,
        w11_zero_items: 20000,
        w13_items: 2000,
        w14_items: 2000,
        w15_items: 100_000,
    };

    pub fn by_name(name: &str) -> Option<Profile> {
        match name {
            "full" => Some(Self::FULL),
            "quick" => Some(Self::QUICK),
            _ => None,
        }
    }
}
