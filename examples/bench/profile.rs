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
    // Runtime workloads add their sizes here, e.g. `w1_runs: 2000` / `200`.
}

impl Profile {
    pub const FULL: Profile = Profile {
        name: "full",
        w6_steps: 5000,
        w8_files: 1000,
        w8_steps: 50,
    };
    /// W6 and W8 are cheap: the same sizes as `full`.
    pub const QUICK: Profile = Profile {
        name: "quick",
        w6_steps: 5000,
        w8_files: 1000,
        w8_steps: 50,
    };

    pub fn by_name(name: &str) -> Option<Profile> {
        match name {
            "full" => Some(Self::FULL),
            "quick" => Some(Self::QUICK),
            _ => None,
        }
    }
}
