//! Money: an amount of USD counted in whole nano-dollars (10⁻⁹ USD), the one way costs are
//! added, compared, written and printed.
//!
//! A call's cost is rounded to the nano-dollar once, where it is priced; from there on every
//! sum (step → run → parent run → batch, budgets, the store's sums) adds integers, so a
//! thousand calls of `$0.0001` come to `$0.1000` exactly, never `0.09999999999999946`.
//! JSON and the store carry the amount as the `f64` nearest to `nanos / 10⁹`, whose
//! shortest decimal is that amount itself (`0.0784`, up to $9,007,199 per value), and read
//! it back by rounding to the nano-dollar, which also mends the drift of records written
//! before costs were counted this way.
//!
//! People read amounts through [`Cost`]'s `Display`, everywhere: four decimals (`$1.0800`,
//! `$0.0784`), rounded half up; an amount that is not zero but would show as `$0.0000`
//! (under $0.00005) shows its first two significant digits instead (`$0.000013`,
//! `$0.000000001`), so a cost is never hidden.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const NANOS_PER_USD: u64 = 1_000_000_000;
/// Nano-dollars in the fourth decimal of a dollar.
const TEN_THOUSANDTH: u64 = NANOS_PER_USD / 10_000;

/// An amount of USD, in nano-dollars.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cost(u64);

impl Cost {
    pub const ZERO: Cost = Cost(0);

    pub const fn from_nanos(nanos: u64) -> Cost {
        Cost(nanos)
    }

    pub const fn nanos(self) -> u64 {
        self.0
    }

    /// `usd` rounded to the nano-dollar; `None` for a negative amount (below half a
    /// nano-dollar), one that is not a number, or one past what 64 bits of nano-dollars hold
    /// (some $18 billion).
    pub fn from_usd(usd: f64) -> Option<Cost> {
        Cost::from_nanos_f64(usd * NANOS_PER_USD as f64)
    }

    /// `nanos` (a computed, fractional count) rounded to the nearest nano-dollar; `None` as
    /// [`Cost::from_usd`].
    pub fn from_nanos_f64(nanos: f64) -> Option<Cost> {
        let n = nanos.round();
        // `u64::MAX as f64` is 2⁶⁴, one past the largest `u64`.
        (n.is_finite() && n > -1.0 && n < u64::MAX as f64).then(|| Cost(n.max(0.0) as u64))
    }

    /// The budget `usd` as a count to compare whole nano-dollars with: a spend `s` is under
    /// it exactly when `s < Cost::budget(usd)`. An amount of whole nano-dollars (any limit
    /// written with 9 decimals or fewer) is itself, whatever its `f64` rounding; a finer one
    /// is rounded up, so no spend over the written limit passes as under it. `None` as
    /// [`Cost::from_usd`].
    pub fn budget(usd: f64) -> Option<Cost> {
        let x = usd * NANOS_PER_USD as f64;
        let near = x.round();
        // The product's own rounding error is far below a millionth of a nano-dollar (53
        // bits of a value under 2⁶⁴).
        let whole = (x - near).abs() <= 1e-6_f64.max(x.abs() * 1e-12);
        Cost::from_nanos_f64(if whole { near } else { x.ceil() })
    }

    /// The amount in USD, for JSON, the store and OTLP: the `f64` nearest to it, whose
    /// shortest decimal (what serde_json writes) is the amount exactly.
    pub fn usd(self) -> f64 {
        self.0 as f64 / NANOS_PER_USD as f64
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    pub fn saturating_sub(self, other: Cost) -> Cost {
        Cost(self.0.saturating_sub(other.0))
    }
}

impl std::ops::Add for Cost {
    type Output = Cost;
    fn add(self, other: Cost) -> Cost {
        Cost(self.0.saturating_add(other.0))
    }
}

impl std::ops::AddAssign for Cost {
    fn add_assign(&mut self, other: Cost) {
        *self = *self + other;
    }
}

impl std::iter::Sum for Cost {
    fn sum<I: Iterator<Item = Cost>>(iter: I) -> Cost {
        iter.fold(Cost::ZERO, |a, b| a + b)
    }
}

impl fmt::Display for Cost {
    /// `$1.0800`; `$0.000013` for an amount that four decimals would show as zero. Width
    /// and alignment apply (`{:>10}`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.text())
    }
}

impl Cost {
    fn text(self) -> String {
        let n = self.0;
        let shown = n / TEN_THOUSANDTH + u64::from(n % TEN_THOUSANDTH >= TEN_THOUSANDTH / 2);
        if shown > 0 || n == 0 {
            return format!("${}.{:04}", shown / 10_000, shown % 10_000);
        }
        // Under $0.00005: two significant digits, rounded half up, in nano-dollars.
        let digits = |v: u64| v.checked_ilog10().map_or(1, |l| l + 1);
        let unit = 10u64.pow(digits(n).saturating_sub(2));
        let rounded = (n / unit + u64::from(n % unit >= unit.div_ceil(2))) * unit;
        let decimals = (11 - digits(rounded).min(11)).min(9) as usize;
        let frac = rounded / 10u64.pow(9 - decimals as u32);
        format!("$0.{frac:0decimals$}")
    }
}

impl Serialize for Cost {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.usd())
    }
}

impl<'de> Deserialize<'de> for Cost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Cost, D::Error> {
        let usd = f64::deserialize(d)?;
        Cost::from_usd(usd).ok_or_else(|| {
            serde::de::Error::custom(format!("a cost is a number of USD, 0 or more (got {usd})"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Cost;

    fn usd(x: f64) -> String {
        Cost::from_usd(x).expect("a cost").to_string()
    }

    #[test]
    fn people_read_four_decimals() {
        assert_eq!(usd(0.0), "$0.0000");
        assert_eq!(usd(1.08), "$1.0800");
        assert_eq!(usd(0.08), "$0.0800");
        assert_eq!(usd(0.0784), "$0.0784");
        assert_eq!(usd(12.5), "$12.5000");
        assert_eq!(usd(0.0123), "$0.0123");
        assert_eq!(usd(0.0001), "$0.0001");
        assert_eq!(usd(0.00012), "$0.0001");
        assert_eq!(usd(0.000081), "$0.0001");
        // Half up, on whole nano-dollars.
        assert_eq!(usd(0.00005), "$0.0001");
        assert_eq!(usd(0.00015), "$0.0002");
        assert_eq!(usd(0.99995), "$1.0000");
        assert_eq!(usd(1234.56789), "$1234.5679");
        assert_eq!(
            format!("{:>9}|{:<8}|", Cost::ZERO, Cost::from_nanos(1)),
            "  $0.0000|$0.000000001|"
        );
    }

    #[test]
    fn what_would_show_as_zero_shows_two_significant_digits() {
        assert_eq!(usd(0.000049999), "$0.000050");
        assert_eq!(usd(0.000013), "$0.000013");
        assert_eq!(usd(0.00001234), "$0.000012");
        assert_eq!(usd(0.000009996), "$0.000010");
        assert_eq!(usd(0.0000012), "$0.0000012");
        assert_eq!(usd(0.000000015), "$0.000000015");
        assert_eq!(usd(0.000000001), "$0.000000001");
        assert_eq!(usd(0.000000123), "$0.00000012");
        // Under half a nano-dollar is nothing: the engine counts no finer.
        assert_eq!(usd(1e-12), "$0.0000");
    }

    #[test]
    fn sums_are_exact_and_json_shows_the_decimal() {
        let call = Cost::from_usd(0.1).unwrap() + Cost::from_usd(0.2).unwrap();
        let three: Cost = [call, call, call].into_iter().sum();
        assert_eq!(three, Cost::from_usd(0.9).unwrap());
        assert_eq!(serde_json::to_string(&three).unwrap(), "0.9");
        assert_eq!(serde_json::to_string(&call).unwrap(), "0.3");
        let many: Cost = std::iter::repeat_n(Cost::from_usd(0.0784).unwrap(), 1000).sum();
        assert_eq!(serde_json::to_string(&many).unwrap(), "78.4");
        // Drift written by an older switchyard reads back as the amount it meant.
        assert_eq!(Cost::from_usd(0.1 + 0.2), Cost::from_usd(0.3));
        let back: Cost = serde_json::from_str("0.07839999999999998").unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), "0.0784");
        assert!(serde_json::from_str::<Cost>("-1").is_err());
        assert_eq!(Cost::from_usd(f64::NAN), None);
        assert_eq!(Cost::from_usd(f64::INFINITY), None);
        assert_eq!(Cost::from_usd(-0.0), Some(Cost::ZERO));
    }

    #[test]
    fn a_budget_is_the_written_limit_never_more() {
        assert_eq!(Cost::budget(0.005), Some(Cost::from_nanos(5_000_000)));
        assert_eq!(Cost::budget(0.0029), Some(Cost::from_nanos(2_900_000)));
        assert_eq!(Cost::budget(0.3), Some(Cost::from_nanos(300_000_000)));
        assert_eq!(
            Cost::budget(1e9),
            Some(Cost::from_nanos(1_000_000_000_000_000_000))
        );
        // Finer than a nano-dollar: rounded up, so 1 nano-dollar is under 1.5 and 2 is not.
        assert_eq!(Cost::budget(1.5e-9), Some(Cost::from_nanos(2)));
        assert_eq!(Cost::budget(0.0), Some(Cost::ZERO));
    }
}
