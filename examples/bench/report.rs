//! The one output format of the harness: a JSON object per line on stdout (BENCH.md).
//!
//! Every workload builds its [`Report`]s from raw samples and hands them to [`emit`]; nothing
//! else in the harness writes to stdout. `value` is the median of the samples.

use std::io::Write;

use serde_json::json;

use crate::profile::Profile;

/// One line of output: one metric of one workload variant.
#[derive(Clone, Debug)]
pub struct Report {
    pub workload: &'static str,
    pub variant: String,
    pub metric: &'static str,
    /// The size the workload ran at (steps, files, items, runs: see the workload).
    pub n: u64,
    /// One value per timed repetition, in the order they ran.
    pub samples: Vec<f64>,
    pub notes: String,
}

impl Report {
    /// A report of the `default` variant.
    pub fn new(
        workload: &'static str,
        metric: &'static str,
        n: u64,
        samples: Vec<f64>,
        notes: impl Into<String>,
    ) -> Self {
        Report {
            workload,
            variant: "default".to_string(),
            metric,
            n,
            samples,
            notes: notes.into(),
        }
    }

    /// The median of the samples.
    pub fn value(&self) -> f64 {
        median(&self.samples)
    }

    /// The JSON line, without its newline.
    pub fn to_json_line(&self, profile: &Profile) -> String {
        json!({
            "peer": "switchyard",
            "version": env!("CARGO_PKG_VERSION"),
            "workload": self.workload,
            "variant": self.variant,
            "metric": self.metric,
            "value": round(self.value()),
            "runs": self.samples.len(),
            "n": self.n,
            "profile": profile.name,
            "samples": self.samples.iter().map(|&s| round(s)).collect::<Vec<_>>(),
            "notes": self.notes,
        })
        .to_string()
    }
}

/// Prints reports to stdout, one JSON object per line, flushed at once (so that a later
/// failure does not lose them).
pub fn emit(reports: &[Report], profile: &Profile) {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for r in reports {
        // A closed stdout (`| head`) is not the benchmark's failure: ignore write errors.
        let _ = writeln!(out, "{}", r.to_json_line(profile));
    }
    let _ = out.flush();
}

/// The median: the middle sample, or the mean of the two middle ones. NaN when empty.
pub fn median(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let mid = s.len() / 2;
    if s.len() % 2 == 1 {
        s[mid]
    } else {
        (s[mid - 1] + s[mid]) / 2.0
    }
}

/// Keeps four significant digits (at least three decimals below 1): timer noise is far larger
/// than the digits dropped, and the lines stay readable.
pub fn round(x: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let digits = (4 - 1 - x.abs().log10().floor() as i32).clamp(0, 9);
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn rounding() {
        assert_eq!(round(12.34567), 12.35);
        assert_eq!(round(1234.567), 1235.0);
        assert_eq!(round(0.0123456), 0.01235);
        assert_eq!(round(0.0), 0.0);
    }
}
