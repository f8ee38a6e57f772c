//! CEL's `timestamp` and `duration` (SPEC §5.1): the two value types, their parsing and
//! text, their accessors, arithmetic and ordering, registered into cel's root environment by
//! [`register`].
//!
//! This module owns the time values expressions see and nothing else: it knows nothing of
//! runs, payloads or the store (the engine decides what `now` is and hands it over as a
//! [`Timestamp`]). The calendar arithmetic is done here, over Unix seconds; a named time zone's
//! offset at an instant comes from [`zone`](super::zone), over the bundled IANA database, so
//! every machine routes alike whatever its own `/usr/share/zoneinfo` holds.
//!
//! **Ranges, as CEL has them.** A timestamp lies between `0001-01-01T00:00:00Z` and
//! `9999-12-31T23:59:59.999999999Z`; a duration is a signed 64-bit count of nanoseconds (about
//! ±292 years, cel-go's range). Parsing, converting or computing past either is an error
//! naming the range, never a wrapped or clamped value.
//!
//! **Text.** `string(t)` is RFC 3339 in UTC with the fraction trimmed of trailing zeros
//! (`2009-02-13T23:31:30Z`, `…:30.5Z`); `string(d)` is seconds with the fraction trimmed
//! (`86400s`, `1.5s`, `-0.000000001s`). Both read back through `timestamp()`/`duration()`,
//! and they are what a mapping writes into JSON.

use std::cmp::Ordering;
use std::fmt;

use cel::common::traits::{Adder, Comparer, Negator, Subtractor, Zeroer};
use cel::common::types::{self as cel_types, CelInt, CelString, Kind, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{Env, ExecutionError};

/// `google.protobuf.Timestamp`, the type of [`Timestamp`] values.
pub const TIMESTAMP_TYPE: Type = Type::simple_type(Kind::Timestamp, "google.protobuf.Timestamp");
/// `google.protobuf.Duration`, the type of [`Duration`] values.
pub const DURATION_TYPE: Type = Type::simple_type(Kind::Duration, "google.protobuf.Duration");

static TIMESTAMP_TYPE_REF: Type = TIMESTAMP_TYPE;
static DURATION_TYPE_REF: Type = DURATION_TYPE;

const NANOS_PER_SEC: i64 = 1_000_000_000;
/// `0001-01-01T00:00:00Z` in Unix seconds.
const MIN_SECS: i64 = -62_135_596_800;
/// `9999-12-31T23:59:59Z` in Unix seconds.
const MAX_SECS: i64 = 253_402_300_799;

/// An instant in UTC: whole Unix seconds (floored) and the nanoseconds past them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    secs: i64,
    nanos: u32,
}

/// A signed span of time in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration {
    nanos: i64,
}

/// Why a time value could not be made: the message of an expression error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeError(pub String);

impl fmt::Display for TimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn range_error(what: &str) -> TimeError {
    TimeError(format!(
        "{what} is out of range (timestamps lie between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999999999Z)"
    ))
}

fn duration_range_error(what: &str) -> TimeError {
    TimeError(format!(
        "{what} is out of range (durations are at most 9223372036.854775807s either way)"
    ))
}

impl Timestamp {
    /// The instant `secs` seconds and `nanos` nanoseconds after the Unix epoch, if it is in
    /// CEL's range.
    pub fn new(secs: i64, nanos: u32) -> Option<Self> {
        (nanos < 1_000_000_000 && (MIN_SECS..=MAX_SECS).contains(&secs)).then_some(Timestamp { secs, nanos })
    }

    /// The current time, to the microsecond (what a store records).
    pub fn now() -> Self {
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        Self::from_unix_micros(micros).unwrap_or(Timestamp { secs: 0, nanos: 0 })
    }

    /// The instant `micros` microseconds after the Unix epoch, if it is in CEL's range.
    pub fn from_unix_micros(micros: i64) -> Option<Self> {
        let secs = micros.div_euclid(1_000_000);
        let nanos = u32::try_from(micros.rem_euclid(1_000_000) * 1000).ok()?;
        Self::new(secs, nanos)
    }

    /// Unix microseconds, the fraction below a microsecond dropped.
    pub fn unix_micros(&self) -> i64 {
        self.secs * 1_000_000 + i64::from(self.nanos / 1000)
    }

    /// Unix seconds, floored (`int(t)`).
    pub fn unix_secs(&self) -> i64 {
        self.secs
    }

    fn total_nanos(&self) -> i128 {
        i128::from(self.secs) * i128::from(NANOS_PER_SEC) + i128::from(self.nanos)
    }

    fn from_total_nanos(n: i128) -> Option<Self> {
        let secs = i64::try_from(n.div_euclid(i128::from(NANOS_PER_SEC))).ok()?;
        let nanos = u32::try_from(n.rem_euclid(i128::from(NANOS_PER_SEC))).ok()?;
        Self::new(secs, nanos)
    }

    /// Parses RFC 3339 as cel-go does (Go's `time.RFC3339` layout):
    /// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, with an upper-case `T` and `Z`, at most nine
    /// fraction digits, and no leap second.
    pub fn parse(text: &str) -> Result<Self, TimeError> {
        let bad = || {
            TimeError(format!(
                "`{text}` is not an RFC 3339 timestamp (like `2009-02-13T23:31:30Z` or `1972-01-01T10:00:20.021-05:00`)"
            ))
        };
        let b = text.as_bytes();
        // A year of more than four digits is a valid shape past CEL's range.
        let year_digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
        if year_digits > 4 && b.get(year_digits) == Some(&b'-') {
            return Err(range_error(&format!("`{text}`")));
        }
        let num = |from: usize, len: usize| -> Option<i64> {
            let s = b.get(from..from + len)?;
            s.iter()
                .all(u8::is_ascii_digit)
                .then(|| s.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
        };
        let at = |i: usize, c: u8| b.get(i) == Some(&c);
        if !(at(4, b'-') && at(7, b'-') && at(10, b'T') && at(13, b':') && at(16, b':')) {
            return Err(bad());
        }
        let (year, month, day) = (
            num(0, 4).ok_or_else(bad)?,
            num(5, 2).ok_or_else(bad)?,
            num(8, 2).ok_or_else(bad)?,
        );
        let (hour, minute, second) = (
            num(11, 2).ok_or_else(bad)?,
            num(14, 2).ok_or_else(bad)?,
            num(17, 2).ok_or_else(bad)?,
        );
        let mut i = 19;
        let mut nanos = 0u32;
        if at(i, b'.') {
            let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            if digits == 0 || digits > 9 {
                return Err(bad());
            }
            let frac = num(i + 1, digits).ok_or_else(bad)?;
            nanos = u32::try_from(frac * 10i64.pow(9 - digits as u32)).map_err(|_| bad())?;
            i += 1 + digits;
        }
        let offset = match b.get(i) {
            Some(b'Z') if i + 1 == b.len() => 0,
            Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && at(i + 3, b':') => {
                let (h, m) = (num(i + 1, 2).ok_or_else(bad)?, num(i + 4, 2).ok_or_else(bad)?);
                if h > 23 || m > 59 {
                    return Err(bad());
                }
                let secs = h * 3600 + m * 60;
                if *sign == b'-' { -secs } else { secs }
            }
            _ => return Err(bad()),
        };
        if !(1..=12).contains(&month)
            || day < 1
            || day > days_in_month(year, month)
            || hour > 23
            || minute > 59
            || second > 59
        {
            return Err(bad());
        }
        let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset;
        Self::new(secs, nanos).ok_or_else(|| range_error(&format!("`{text}`")))
    }

    /// `timestamp(int)`: Unix seconds.
    pub fn from_unix_secs(secs: i64) -> Result<Self, TimeError> {
        Self::new(secs, 0).ok_or_else(|| range_error(&format!("{secs} seconds since the Unix epoch")))
    }

    /// `self + d`, in range.
    pub fn checked_add(&self, d: Duration) -> Result<Self, TimeError> {
        Self::from_total_nanos(self.total_nanos() + i128::from(d.nanos))
            .ok_or_else(|| range_error(&format!("`{self} + {d}`")))
    }

    /// `self - d`, in range.
    pub fn checked_sub(&self, d: Duration) -> Result<Self, TimeError> {
        Self::from_total_nanos(self.total_nanos() - i128::from(d.nanos))
            .ok_or_else(|| range_error(&format!("`{self} - {d}`")))
    }

    /// `self - other`, as a duration in range.
    pub fn since(&self, other: &Timestamp) -> Result<Duration, TimeError> {
        i64::try_from(self.total_nanos() - other.total_nanos())
            .map(|nanos| Duration { nanos })
            .map_err(|_| duration_range_error(&format!("`{self} - {other}`")))
    }

    /// The calendar fields of this instant in `zone` (UTC when `None`).
    pub fn civil(&self, zone: Option<&str>) -> Result<Civil, TimeError> {
        let offset = match zone {
            None => 0,
            Some(z) => zone_offset(z, self)?,
        };
        let local = self.secs + offset;
        let days = local.div_euclid(86_400);
        let secs_of_day = local.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        Ok(Civil {
            year,
            month,
            day,
            day_of_year: days - days_from_civil(year, 1, 1),
            // 1970-01-01 was a Thursday; Sunday is 0.
            day_of_week: (days + 4).rem_euclid(7),
            hours: secs_of_day / 3600,
            minutes: secs_of_day % 3600 / 60,
            seconds: secs_of_day % 60,
            millis: i64::from(self.nanos / 1_000_000),
        })
    }
}

/// RFC 3339 in UTC, the fraction trimmed of trailing zeros (cel-go's `string(timestamp)`).
impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (year, month, day) = civil_from_days(self.secs.div_euclid(86_400));
        let sod = self.secs.rem_euclid(86_400);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
            sod / 3600,
            sod % 3600 / 60,
            sod % 60
        )?;
        write_fraction(f, self.nanos)?;
        f.write_str("Z")
    }
}

/// The calendar fields CEL's accessors read, in one time zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    /// 1-based.
    pub month: i64,
    /// 1-based.
    pub day: i64,
    /// 0-based.
    pub day_of_year: i64,
    /// 0 is Sunday.
    pub day_of_week: i64,
    pub hours: i64,
    pub minutes: i64,
    pub seconds: i64,
    pub millis: i64,
}

impl Duration {
    pub fn from_nanos(nanos: i64) -> Self {
        Duration { nanos }
    }

    pub fn nanos(&self) -> i64 {
        self.nanos
    }

    /// Parses a duration as cel-go does (Go's `time.ParseDuration`): an optional sign, then
    /// one or more decimal numbers each with a unit — `ns`, `us` (or `µs`), `ms`, `s`, `m`,
    /// `h` — as in `"24h"`, `"1.5s"`, `"1h30m"`, `"-300ms"`; `"0"` alone needs no unit.
    pub fn parse(text: &str) -> Result<Self, TimeError> {
        let bad = |why: &str| {
            TimeError(format!(
                "`{text}` is not a duration ({why}; write a number and a unit: `24h`, `1.5s`, `1h30m`, `300ms`)"
            ))
        };
        let (negative, mut rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        if rest == "0" {
            return Ok(Duration { nanos: 0 });
        }
        if rest.is_empty() {
            return Err(bad("it is empty"));
        }
        let mut total: i128 = 0;
        while !rest.is_empty() {
            let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
            let (int_part, after) = rest.split_at(int_len);
            let (frac_part, after) = match after.strip_prefix('.') {
                Some(a) => {
                    let n = a.bytes().take_while(u8::is_ascii_digit).count();
                    a.split_at(n)
                }
                None => ("", after),
            };
            if int_part.is_empty() && frac_part.is_empty() {
                return Err(bad("a number is missing"));
            }
            let unit_len = after
                .char_indices()
                .find(|(_, c)| c.is_ascii_digit() || *c == '.')
                .map_or(after.len(), |(i, _)| i);
            let (unit, after) = after.split_at(unit_len);
            let scale: i128 = match unit {
                "ns" => 1,
                "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
                "ms" => 1_000_000,
                "s" => 1_000_000_000,
                "m" => 60_000_000_000,
                "h" => 3_600_000_000_000,
                "" => return Err(bad("a unit is missing")),
                other => return Err(bad(&format!("unknown unit `{other}`"))),
            };
            let too_big = || duration_range_error(&format!("`{text}`"));
            // Digits past what any value in range can hold would only overflow.
            let int: i128 = if int_part.len() > 20 {
                return Err(too_big());
            } else if int_part.is_empty() {
                0
            } else {
                int_part.parse().map_err(|_| too_big())?
            };
            let frac_digits = &frac_part[..frac_part.len().min(18)];
            let frac: i128 = if frac_digits.is_empty() {
                0
            } else {
                frac_digits.parse::<i128>().map_err(|_| too_big())? * scale
                    / 10i128.pow(frac_digits.len() as u32)
            };
            total += int.checked_mul(scale).ok_or_else(too_big)? + frac;
            if total > i128::from(i64::MAX) + 1 {
                return Err(too_big());
            }
            rest = after;
        }
        let signed = if negative { -total } else { total };
        i64::try_from(signed)
            .map(|nanos| Duration { nanos })
            .map_err(|_| duration_range_error(&format!("`{text}`")))
    }

    pub fn checked_add(&self, other: Duration) -> Result<Self, TimeError> {
        self.nanos
            .checked_add(other.nanos)
            .map(|nanos| Duration { nanos })
            .ok_or_else(|| duration_range_error(&format!("`{self} + {other}`")))
    }

    pub fn checked_sub(&self, other: Duration) -> Result<Self, TimeError> {
        self.nanos
            .checked_sub(other.nanos)
            .map(|nanos| Duration { nanos })
            .ok_or_else(|| duration_range_error(&format!("`{self} - {other}`")))
    }

    /// `getHours()`: whole hours, truncated toward zero.
    pub fn hours(&self) -> i64 {
        self.nanos / 3_600_000_000_000
    }

    /// `getMinutes()`: whole minutes, truncated toward zero.
    pub fn minutes(&self) -> i64 {
        self.nanos / 60_000_000_000
    }

    /// `getSeconds()`: whole seconds, truncated toward zero.
    pub fn seconds(&self) -> i64 {
        self.nanos / NANOS_PER_SEC
    }

    /// `getMilliseconds()`: the milliseconds past the whole seconds (-999 to 999).
    pub fn millis(&self) -> i64 {
        self.nanos / 1_000_000 % 1000
    }
}

/// Seconds, the fraction trimmed of trailing zeros, and `s` (`86400s`, `1.5s`, `-0.25s`).
impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = i128::from(self.nanos);
        let sign = if n < 0 { "-" } else { "" };
        let abs = n.unsigned_abs();
        write!(f, "{sign}{}", abs / 1_000_000_000)?;
        write_fraction(f, (abs % 1_000_000_000) as u32)?;
        f.write_str("s")
    }
}

/// `.` and the nanoseconds without trailing zeros; nothing for zero.
fn write_fraction(f: &mut fmt::Formatter<'_>, nanos: u32) -> fmt::Result {
    if nanos == 0 {
        return Ok(());
    }
    let digits = format!("{nanos:09}");
    write!(f, ".{}", digits.trim_end_matches('0'))
}

// ---------------------------------------------------------------------------------------------
// The calendar (proleptic Gregorian)

pub(crate) fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

pub(crate) fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given date. Years are counted from March, so that the leap day
/// ends a year; eras of 400 years repeat exactly.
pub(crate) fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y.rem_euclid(400);
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The year of the date `days` after 1970-01-01.
pub(crate) fn civil_year(days: i64) -> i64 {
    civil_from_days(days).0
}

/// The date `days` after 1970-01-01: the inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

// ---------------------------------------------------------------------------------------------
// Time zones

/// The offset from UTC, in seconds, of `zone` at `at`: a fixed `[+|-]HH:MM` (cel-go reads
/// any text with a colon so, the sign optional), else an IANA name (`Europe/Paris`, `UTC`,
/// `US/Central`); the empty name is UTC.
fn zone_offset(zone: &str, at: &Timestamp) -> Result<i64, TimeError> {
    let unknown = || {
        TimeError(format!(
            "unknown time zone `{zone}` (write an IANA name like `Europe/Paris` or an offset like `+05:30`)"
        ))
    };
    if zone.is_empty() {
        return Ok(0);
    }
    if let Some((h, m)) = zone.split_once(':') {
        let (negative, digits) = match h.as_bytes().first() {
            Some(b'-') => (true, &h[1..]),
            Some(b'+') => (false, &h[1..]),
            _ => (false, h),
        };
        let two_digits = |s: &str| {
            (s.len() == 2 && s.bytes().all(|c| c.is_ascii_digit()))
                .then(|| s.parse::<i64>().ok())
                .flatten()
        };
        let (Some(hours), Some(minutes)) = (two_digits(digits), two_digits(m)) else {
            return Err(unknown());
        };
        if hours > 23 || minutes > 59 {
            return Err(TimeError(format!(
                "time zone offset `{zone}` is out of range (hours 00 to 23, minutes 00 to 59)"
            )));
        }
        let secs = hours * 3600 + minutes * 60;
        return Ok(if negative { -secs } else { secs });
    }
    super::zone::offset_at(zone, at.secs).ok_or_else(unknown)
}

// ---------------------------------------------------------------------------------------------
// CEL values

impl Val for Timestamp {
    fn get_type(&self) -> &Type {
        &TIMESTAMP_TYPE_REF
    }

    fn cel_type() -> &'static Type {
        &TIMESTAMP_TYPE_REF
    }

    fn as_adder<'b, 'v>(&'b self) -> Option<&'b (dyn Adder + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_subtractor<'b, 'v>(&'b self) -> Option<&'b (dyn Subtractor + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_comparer(&self) -> Option<&dyn Comparer> {
        Some(self)
    }

    fn as_zeroer(&self) -> Option<&dyn Zeroer> {
        Some(self)
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Timestamp>().is_some_and(|o| o == self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(*self)
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

impl StaticVal for Timestamp {}

impl Val for Duration {
    fn get_type(&self) -> &Type {
        &DURATION_TYPE_REF
    }

    fn cel_type() -> &'static Type {
        &DURATION_TYPE_REF
    }

    fn as_adder<'b, 'v>(&'b self) -> Option<&'b (dyn Adder + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_subtractor<'b, 'v>(&'b self) -> Option<&'b (dyn Subtractor + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_negator<'b, 'v>(&'b self) -> Option<&'b (dyn Negator + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_comparer(&self) -> Option<&dyn Comparer> {
        Some(self)
    }

    fn as_zeroer(&self) -> Option<&dyn Zeroer> {
        Some(self)
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Duration>().is_some_and(|o| o == self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(*self)
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

impl StaticVal for Duration {}

/// An operator's error: `op` does not apply to these operands.
fn no_overload(op: &str, lhs: &dyn Val, rhs: &dyn Val) -> ExecutionError {
    ExecutionError::no_such_overload(
        op,
        vec![lhs.get_type().name().to_owned(), rhs.get_type().name().to_owned()],
    )
}

fn failed(function: &str, e: TimeError) -> ExecutionError {
    ExecutionError::function_error(function, e.0)
}

impl Adder for Timestamp {
    fn add<'b, 'v>(&'b self, rhs: &(dyn Val + 'v)) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        match rhs.downcast_ref::<Duration>() {
            Some(d) => Ok(CowVal::owned(self.checked_add(*d).map_err(|e| failed("+", e))?)),
            None => Err(no_overload("_+_", self, rhs)),
        }
    }
}

impl Subtractor for Timestamp {
    fn sub<'b, 'v>(&'b self, rhs: &(dyn Val + 'v)) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        if let Some(d) = rhs.downcast_ref::<Duration>() {
            return Ok(CowVal::owned(self.checked_sub(*d).map_err(|e| failed("-", e))?));
        }
        match rhs.downcast_ref::<Timestamp>() {
            Some(t) => Ok(CowVal::owned(self.since(t).map_err(|e| failed("-", e))?)),
            None => Err(no_overload("_-_", self, rhs)),
        }
    }
}

impl Comparer for Timestamp {
    fn compare(&self, rhs: &dyn Val) -> Result<Ordering, ExecutionError> {
        match rhs.downcast_ref::<Timestamp>() {
            Some(t) => Ok(self.cmp(t)),
            None => Err(no_overload("_<_", self, rhs)),
        }
    }
}

impl Zeroer for Timestamp {
    fn is_zero_value(&self) -> bool {
        self.secs == 0 && self.nanos == 0
    }
}

impl Adder for Duration {
    fn add<'b, 'v>(&'b self, rhs: &(dyn Val + 'v)) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        if let Some(d) = rhs.downcast_ref::<Duration>() {
            return Ok(CowVal::owned(self.checked_add(*d).map_err(|e| failed("+", e))?));
        }
        match rhs.downcast_ref::<Timestamp>() {
            Some(t) => Ok(CowVal::owned(t.checked_add(*self).map_err(|e| failed("+", e))?)),
            None => Err(no_overload("_+_", self, rhs)),
        }
    }
}

impl Subtractor for Duration {
    fn sub<'b, 'v>(&'b self, rhs: &(dyn Val + 'v)) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        match rhs.downcast_ref::<Duration>() {
            Some(d) => Ok(CowVal::owned(self.checked_sub(*d).map_err(|e| failed("-", e))?)),
            None => Err(no_overload("_-_", self, rhs)),
        }
    }
}

impl Negator for Duration {
    fn negate<'v>(&self) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        match self.nanos.checked_neg() {
            Some(nanos) => Ok(Box::new(Duration { nanos })),
            None => Err(failed("-", duration_range_error(&format!("`-{self}`")))),
        }
    }
}

impl Comparer for Duration {
    fn compare(&self, rhs: &dyn Val) -> Result<Ordering, ExecutionError> {
        match rhs.downcast_ref::<Duration>() {
            Some(d) => Ok(self.cmp(d)),
            None => Err(no_overload("_<_", self, rhs)),
        }
    }
}

impl Zeroer for Duration {
    fn is_zero_value(&self) -> bool {
        self.nanos == 0
    }
}

// ---------------------------------------------------------------------------------------------
// Functions

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Out<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

fn arg<'a, T: StaticVal>(args: &'a [CowVal<'_, '_>], i: usize) -> &'a T {
    args.get(i)
        .and_then(|a| a.downcast_ref::<T>())
        .expect("cel picks an overload only for arguments of its declared types")
}

fn str_arg<'a>(args: &'a [CowVal<'_, '_>], i: usize) -> &'a str {
    args.get(i)
        .and_then(|a| a.downcast_ref::<CelString>())
        .map(|s| s.inner())
        .expect("cel picks an overload only for arguments of its declared types")
}

fn int(n: i64) -> CowVal<'static, 'static> {
    CowVal::owned(CelInt::from(n))
}

fn timestamp_of_string<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    Ok(CowVal::owned(
        Timestamp::parse(str_arg(&args, 0)).map_err(|e| failed("timestamp", e))?,
    ))
}

fn timestamp_of_int<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let secs = *arg::<CelInt>(&args, 0).inner();
    Ok(CowVal::owned(
        Timestamp::from_unix_secs(secs).map_err(|e| failed("timestamp", e))?,
    ))
}

fn duration_of_string<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    Ok(CowVal::owned(
        Duration::parse(str_arg(&args, 0)).map_err(|e| failed("duration", e))?,
    ))
}

fn identity<'b, 'v>(mut args: Args<'b, 'v>) -> Out<'b, 'v> {
    Ok(args.swap_remove(0))
}

fn int_of_timestamp<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    Ok(int(arg::<Timestamp>(&args, 0).unix_secs()))
}

fn string_of_timestamp<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    Ok(CowVal::owned(CelString::from(
        arg::<Timestamp>(&args, 0).to_string(),
    )))
}

fn string_of_duration<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    Ok(CowVal::owned(CelString::from(
        arg::<Duration>(&args, 0).to_string(),
    )))
}

/// The calendar fields of the receiver, in the zone of the second argument when given.
fn civil_of(args: &[CowVal<'_, '_>], function: &str) -> Result<Civil, ExecutionError> {
    let zone = (args.len() > 1).then(|| str_arg(args, 1));
    arg::<Timestamp>(args, 0)
        .civil(zone)
        .map_err(|e| failed(function, e))
}

macro_rules! accessors {
    ($($name:literal, $fn:ident => |$c:ident| $get:expr;)*) => {
        $(
            fn $fn<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
                let $c = civil_of(&args, $name)?;
                Ok(int($get))
            }
        )*
        /// Every timestamp accessor: its name and implementation (the zone argument optional).
        const TIMESTAMP_ACCESSORS: &[(&str, cel::common::functions::Function)] = &[$(($name, $fn)),*];
    };
}

accessors! {
    "getFullYear", get_full_year => |c| c.year;
    "getMonth", get_month => |c| c.month - 1;
    "getDate", get_date => |c| c.day;
    "getDayOfMonth", get_day_of_month => |c| c.day - 1;
    "getDayOfWeek", get_day_of_week => |c| c.day_of_week;
    "getDayOfYear", get_day_of_year => |c| c.day_of_year;
    "getHours", get_hours => |c| c.hours;
    "getMinutes", get_minutes => |c| c.minutes;
    "getSeconds", get_seconds => |c| c.seconds;
    "getMilliseconds", get_milliseconds => |c| c.millis;
}

fn duration_hours<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    Ok(int(arg::<Duration>(&args, 0).hours()))
}

fn duration_minutes<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    Ok(int(arg::<Duration>(&args, 0).minutes()))
}

fn duration_seconds<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    Ok(int(arg::<Duration>(&args, 0).seconds()))
}

fn duration_millis<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    Ok(int(arg::<Duration>(&args, 0).millis()))
}

/// Registers the two types and their functions on `env` (cel's standard library must be
/// there already: `int` and `string` gain overloads).
pub fn register(env: &mut Env) {
    const WHY: &str = "the time functions are registered once, on an environment without them";
    env.add_type(TIMESTAMP_TYPE).expect(WHY);
    env.add_type(DURATION_TYPE).expect(WHY);
    let s = || cel_types::STRING_TYPE;
    let global: [(&str, &str, Type, cel::common::functions::Function); 8] = [
        ("timestamp", "string_to_timestamp", s(), timestamp_of_string),
        (
            "timestamp",
            "int64_to_timestamp",
            cel_types::INT_TYPE,
            timestamp_of_int,
        ),
        ("timestamp", "timestamp_to_timestamp", TIMESTAMP_TYPE, identity),
        ("duration", "string_to_duration", s(), duration_of_string),
        ("duration", "duration_to_duration", DURATION_TYPE, identity),
        ("int", "timestamp_to_int64", TIMESTAMP_TYPE, int_of_timestamp),
        (
            "string",
            "timestamp_to_string",
            TIMESTAMP_TYPE,
            string_of_timestamp,
        ),
        ("string", "duration_to_string", DURATION_TYPE, string_of_duration),
    ];
    for (name, id, ty, f) in global {
        env.add_overload(name, id, vec![ty], f).expect(WHY);
    }
    for (name, f) in TIMESTAMP_ACCESSORS {
        env.add_member_overload(name, &format!("timestamp_{name}"), TIMESTAMP_TYPE, vec![], *f)
            .expect(WHY);
        env.add_member_overload(
            name,
            &format!("timestamp_{name}_tz"),
            TIMESTAMP_TYPE,
            vec![s()],
            *f,
        )
        .expect(WHY);
    }
    let durations: [(&str, cel::common::functions::Function); 4] = [
        ("getHours", duration_hours),
        ("getMinutes", duration_minutes),
        ("getSeconds", duration_seconds),
        ("getMilliseconds", duration_millis),
    ];
    for (name, f) in durations {
        env.add_member_overload(name, &format!("duration_{name}"), DURATION_TYPE, vec![], f)
            .expect(WHY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calendar_round_trips() {
        for days in [-719_162, -1, 0, 1, 10_956, 11_016, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1, 1, 1) * 86_400, MIN_SECS);
        assert_eq!(days_from_civil(9999, 12, 31) * 86_400 + 86_399, MAX_SECS);
    }

    #[test]
    fn timestamps_parse_as_rfc_3339() {
        let t = Timestamp::parse("2009-02-13T23:31:30Z").unwrap();
        assert_eq!(t.unix_secs(), 1_234_567_890);
        let t = Timestamp::parse("1972-01-01T10:00:20.021-05:00").unwrap();
        assert_eq!(t.to_string(), "1972-01-01T15:00:20.021Z");
        assert_eq!(
            Timestamp::parse("9999-12-31T23:59:59.999999999Z")
                .unwrap()
                .to_string(),
            "9999-12-31T23:59:59.999999999Z"
        );
        // Before the epoch, the seconds floor.
        assert_eq!(
            Timestamp::parse("1969-12-31T23:59:59.500Z").unwrap().unix_secs(),
            -1
        );
        for bad in [
            "",
            "2009-02-13",
            "2009-02-13 23:31:30Z",
            "2009-02-13t23:31:30Z",
            "2009-02-13T23:31:30",
            "2009-02-13T23:31:30+0100",
            "2009-02-30T00:00:00Z",
            "2009-13-01T00:00:00Z",
            "2009-02-13T24:00:00Z",
            "2009-02-13T23:31:60Z",
            "2009-02-13T23:31:30.Z",
            "2009-02-13T23:31:30.1234567891Z",
            "2009-02-13T23:31:30Zjunk",
        ] {
            let e = Timestamp::parse(bad).expect_err(bad);
            assert!(e.0.contains("is not an RFC 3339 timestamp"), "{bad}: {e}");
        }
        for out in [
            "0000-01-01T00:00:00Z",
            "10000-01-01T00:00:00Z",
            "0001-01-01T00:00:00+00:01",
        ] {
            let e = Timestamp::parse(out).expect_err(out);
            assert!(e.0.contains("out of range"), "{out}: {e}");
        }
        assert!(Timestamp::parse("0001-01-01T00:00:00Z").is_ok());
        assert!(Timestamp::parse("2020-02-29T00:00:00Z").is_ok());
        assert!(Timestamp::parse("2100-02-29T00:00:00Z").is_err());
    }

    #[test]
    fn durations_parse_as_go_does() {
        let ns = |t: &str| Duration::parse(t).map(|d| d.nanos());
        assert_eq!(ns("24h"), Ok(86_400 * NANOS_PER_SEC));
        assert_eq!(ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(ns("1h30m"), Ok(5_400 * NANOS_PER_SEC));
        assert_eq!(ns("-300ms"), Ok(-300_000_000));
        assert_eq!(ns("+.5m"), Ok(30 * NANOS_PER_SEC));
        assert_eq!(ns("1.s"), Ok(NANOS_PER_SEC));
        assert_eq!(ns("0"), Ok(0));
        assert_eq!(ns("-0"), Ok(0));
        assert_eq!(ns("1us"), Ok(1_000));
        assert_eq!(ns("1µs"), Ok(1_000));
        assert_eq!(ns("2h45m30.5s100ns"), Ok(9_930_500_000_100));
        assert_eq!(ns("-999999999ns"), Ok(-999_999_999));
        assert_eq!(ns("9223372036.854775807s"), Ok(i64::MAX));
        assert_eq!(ns("-9223372036.854775808s"), Ok(i64::MIN));
        for bad in ["", "s", "1", "1x", ".s", "1d", "1h-30m", "--1s", "1 s"] {
            assert!(ns(bad).is_err(), "{bad}");
        }
        for out in [
            "9223372036.854775808s",
            "320000000000s",
            "-320000000000s",
            "3000000h",
        ] {
            let e = Duration::parse(out).expect_err(out);
            assert!(e.0.contains("out of range"), "{out}: {e}");
        }
    }

    #[test]
    fn durations_write_as_seconds() {
        let text = |n: i64| Duration::from_nanos(n).to_string();
        assert_eq!(text(0), "0s");
        assert_eq!(text(1_000_000 * NANOS_PER_SEC), "1000000s");
        assert_eq!(text(1_500_000_000), "1.5s");
        assert_eq!(text(-1), "-0.000000001s");
        assert_eq!(text(86_400 * NANOS_PER_SEC), "86400s");
        assert_eq!(text(i64::MIN), "-9223372036.854775808s");
    }

    #[test]
    fn accessors_in_utc_and_in_zones() {
        // 1234567890 is Fri 2009-02-13 23:31:30 UTC (CEL's conformance tests).
        let t = Timestamp::parse("2009-02-13T23:31:30Z").unwrap();
        let c = t.civil(None).unwrap();
        assert_eq!(
            (c.year, c.month, c.day, c.day_of_year, c.day_of_week),
            (2009, 2, 13, 43, 5)
        );
        assert_eq!((c.hours, c.minutes, c.seconds), (23, 31, 30));
        let at = |z: &str| t.civil(Some(z)).unwrap();
        assert_eq!(at("Australia/Sydney").day, 14);
        assert_eq!(at("US/Central").day - 1, 12);
        assert_eq!(at("US/Central").day_of_year, 43);
        assert_eq!(at("+11:00").day - 1, 13);
        assert_eq!(at("-09:30").year, 2009);
        assert_eq!(at("02:00").hours, 1);
        assert_eq!(at("Asia/Kathmandu").minutes, 16);
        assert_eq!(at("UTC").day_of_week, 5);
        assert_eq!(at("-00:00").seconds, 30);
        let early = Timestamp::parse("2009-02-13T02:00:00Z").unwrap();
        assert_eq!(early.civil(Some("-02:30")).unwrap().day - 1, 11);
        assert_eq!(early.civil(Some("America/St_Johns")).unwrap().day - 1, 11);
        // A timestamp written with an offset reads in UTC without a zone.
        let t = Timestamp::parse("2023-01-01T23:00:00-05:00").unwrap();
        let c = t.civil(None).unwrap();
        assert_eq!((c.year, c.month, c.day, c.hours), (2023, 1, 2, 4));
        // Milliseconds truncate.
        let t = Timestamp::parse("2009-02-13T23:31:20.123456789Z").unwrap();
        assert_eq!(t.civil(None).unwrap().millis, 123);
        // A leap year's last day, and days of week across the epoch.
        let t = Timestamp::parse("2024-12-31T12:00:00Z").unwrap();
        assert_eq!(t.civil(None).unwrap().day_of_year, 365);
        assert_eq!(
            Timestamp::parse("1969-12-28T00:00:00Z")
                .unwrap()
                .civil(None)
                .unwrap()
                .day_of_week,
            0
        );
        for bad in ["Mars/Olympus", "+24:00", "1:00", "+01:60", "ab:cd"] {
            assert!(t.civil(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn arithmetic_stays_in_range() {
        let t = |s: &str| Timestamp::parse(s).unwrap();
        let d = |s: &str| Duration::parse(s).unwrap();
        assert_eq!(
            t("0001-01-01T00:00:01.000000001Z").checked_add(d("-999999999ns")),
            Ok(t("0001-01-01T00:00:00.000000002Z"))
        );
        assert_eq!(
            t("0001-01-01T00:00:01.999999999Z").checked_add(d("999999999ns")),
            Ok(t("0001-01-01T00:00:02.999999998Z"))
        );
        assert_eq!(
            t("2009-02-13T23:31:00Z").since(&t("2009-02-13T23:29:00Z")),
            Ok(d("120s"))
        );
        assert!(t("0001-01-01T00:00:00Z").checked_add(d("-1ns")).is_err());
        assert!(t("9999-12-31T23:59:59.999999999Z").checked_add(d("1ns")).is_err());
        assert!(
            t("9999-12-31T23:59:59Z")
                .since(&t("0001-01-01T00:00:00Z"))
                .is_err()
        );
        assert!(d("2000000h").checked_add(d("-2000000h")).is_ok());
        assert!(d("2000000h").checked_add(d("1000000h")).is_err());
        assert!(Timestamp::from_unix_secs(-62_135_596_800).is_ok());
        assert!(Timestamp::from_unix_secs(-62_135_596_801).is_err());
        assert!(Timestamp::from_unix_secs(253_402_300_800).is_err());
    }

    #[test]
    fn duration_accessors_convert() {
        let d = |s: &str| Duration::parse(s).unwrap();
        assert_eq!(d("10000s").hours(), 2);
        assert_eq!(d("3730s").minutes(), 62);
        assert_eq!(d("3730s").seconds(), 3730);
        assert_eq!(d("123.321456789s").millis(), 321);
        assert_eq!(d("-1.5s").seconds(), -1);
        assert_eq!(d("-1.5s").millis(), -500);
    }

    /// Evaluates `text` as the engine does, with a payload holding a lazy JSON string and
    /// `now` at 2026-12-02T00:00:00Z.
    fn cel(text: &str) -> Result<serde_json::Value, String> {
        use crate::expr::eval::{self, Vars};
        let expr = crate::expr::parse(text).expect("the expression parses");
        let payload = serde_json::json!({"ticket": {"created_at": "2026-11-30T09:00:00+01:00"}, "n": 3});
        let vars = Vars {
            payload: Some(&payload),
            now: Some(Timestamp::parse("2026-12-02T00:00:00Z").expect("valid")),
            ..Vars::default()
        };
        eval::eval(&expr, &vars).map_err(|e| e.message)
    }

    fn yes(text: &str) {
        assert_eq!(cel(text), Ok(serde_json::json!(true)), "{text}");
    }

    #[test]
    fn cel_functions_and_accessors() {
        use serde_json::json;
        // CEL's conformance tests (timestamps.textproto), through the engine's evaluator.
        assert_eq!(
            cel("int(timestamp('2009-02-13T23:31:30Z'))"),
            Ok(json!(1_234_567_890))
        );
        assert_eq!(
            cel("string(timestamp('2009-02-13T23:31:30Z'))"),
            Ok(json!("2009-02-13T23:31:30Z"))
        );
        assert_eq!(cel("string(duration('1000000s'))"), Ok(json!("1000000s")));
        yes("type(timestamp('2009-02-13T23:31:30Z')) == google.protobuf.Timestamp");
        yes("type(duration('1s')) == google.protobuf.Duration");
        let accessors = [
            ("getDate()", 13),
            ("getDayOfMonth()", 12),
            ("getDayOfWeek()", 5),
            ("getDayOfYear()", 43),
            ("getFullYear()", 2009),
            ("getHours()", 23),
            ("getMinutes()", 31),
            ("getMonth()", 1),
            ("getSeconds()", 30),
            ("getDate('Australia/Sydney')", 14),
            ("getDayOfMonth('US/Central')", 12),
            ("getDayOfMonth('+11:00')", 13),
            ("getDayOfWeek('UTC')", 5),
            ("getDayOfYear('US/Central')", 43),
            ("getFullYear('-09:30')", 2009),
            ("getHours('02:00')", 1),
            ("getMinutes('Asia/Kathmandu')", 16),
            ("getMonth('UTC')", 1),
            ("getSeconds('-00:00')", 30),
        ];
        for (call, want) in accessors {
            assert_eq!(
                cel(&format!("timestamp('2009-02-13T23:31:30Z').{call}")),
                Ok(json!(want)),
                "{call}"
            );
        }
        assert_eq!(
            cel("timestamp('2009-02-13T23:31:20.123456789Z').getMilliseconds()"),
            Ok(json!(123))
        );
        assert_eq!(
            cel("timestamp('2009-02-13T02:00:00Z').getDayOfMonth('America/St_Johns')"),
            Ok(json!(11))
        );
        assert_eq!(cel("duration('10000s').getHours()"), Ok(json!(2)));
        assert_eq!(cel("duration('3730s').getMinutes()"), Ok(json!(62)));
        assert_eq!(cel("duration('3730s').getSeconds()"), Ok(json!(3730)));
        assert_eq!(
            cel("duration('123.321456789s').getMilliseconds()"),
            Ok(json!(321))
        );
        assert_eq!(
            cel("timestamp(1234567890) == timestamp('2009-02-13T23:31:30Z')"),
            Ok(json!(true))
        );
        yes("timestamp(timestamp('2009-02-13T23:31:30Z')) == timestamp('2009-02-13T23:31:30Z')");
        yes("duration(duration('1h')) == duration('3600s')");
    }

    #[test]
    fn cel_arithmetic_and_comparisons() {
        yes("timestamp('2009-02-13T23:00:00Z') + duration('240s') == timestamp('2009-02-13T23:04:00Z')");
        yes("duration('120s') + timestamp('2009-02-13T23:01:00Z') == timestamp('2009-02-13T23:03:00Z')");
        yes("duration('600s') + duration('50s') == duration('650s')");
        yes("timestamp('2009-02-13T23:10:00Z') - duration('600s') == timestamp('2009-02-13T23:00:00Z')");
        yes("timestamp('2009-02-13T23:31:00Z') - timestamp('2009-02-13T23:29:00Z') == duration('120s')");
        yes("duration('900s') - duration('42s') == duration('858s')");
        yes("-duration('1.5s') == duration('-1500ms')");
        yes("timestamp('2009-02-13T23:00:00Z') <= timestamp('2009-02-13T23:00:00Z')");
        yes("!(timestamp('2009-02-13T23:00:00Z') <= timestamp('2009-02-13T22:59:59Z'))");
        yes("timestamp('2009-02-13T23:00:00Z') < timestamp('2009-03-13T23:00:00Z')");
        yes("timestamp('2009-02-13T23:59:00Z') > timestamp('2009-02-13T23:00:00Z')");
        yes("duration('200s') < duration('300s') && duration('300s') >= duration('200s')");
        yes("timestamp('2009-02-13T23:31:30Z') != timestamp('2009-02-13T23:31:29Z')");
        yes("duration('86400s') != duration('86164s')");
        // An offset is a way of writing the same instant.
        yes("timestamp('2009-02-14T00:31:30+01:00') == timestamp('2009-02-13T23:31:30Z')");
        // Values of other types are never equal, and do not order.
        yes("timestamp('2009-02-13T23:31:30Z') != '2009-02-13T23:31:30Z'");
        yes("duration('1s') != 1");
        assert!(cel("timestamp('2009-02-13T23:31:30Z') < 1").is_err());
        assert!(cel("timestamp('2009-02-13T23:31:30Z') + 1").is_err());
        assert!(cel("duration('1s') - timestamp('2009-02-13T23:31:30Z')").is_err());
    }

    #[test]
    fn cel_range_and_parse_errors() {
        for (text, says) in [
            ("timestamp('0000-01-01T00:00:00Z')", "out of range"),
            ("timestamp('10000-01-01T00:00:00Z')", "out of range"),
            (
                "timestamp('0001-01-01T00:00:00Z') + duration('-1s')",
                "out of range",
            ),
            (
                "timestamp('9999-12-31T23:59:59Z') + duration('1s')",
                "out of range",
            ),
            (
                "timestamp('9999-12-31T23:59:59.999999999Z') + duration('1ns')",
                "out of range",
            ),
            (
                "timestamp('9999-12-31T23:59:59Z') - timestamp('0001-01-01T00:00:00Z')",
                "out of range",
            ),
            (
                "timestamp('0001-01-01T00:00:00Z') - timestamp('9999-12-31T23:59:59Z')",
                "out of range",
            ),
            ("duration('-320000000000s')", "out of range"),
            ("duration('320000000000s')", "out of range"),
            ("duration('2000000h') + duration('2000000h')", "out of range"),
            ("duration('-2000000h') - duration('2000000h')", "out of range"),
            ("timestamp(253402300800)", "out of range"),
            (
                "timestamp('yesterday')",
                "`timestamp`: `yesterday` is not an RFC 3339 timestamp",
            ),
            (
                "duration('1d')",
                "`duration`: `1d` is not a duration (unknown unit `d`",
            ),
            (
                "timestamp('2009-02-13T23:31:30Z').getHours('Mars/Olympus')",
                "unknown time zone `Mars/Olympus`",
            ),
        ] {
            let e = cel(text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
            assert!(e.starts_with(&format!("`{text}`: ")), "{text}: {e}");
        }
    }

    #[test]
    fn now_and_lazy_json_strings() {
        use serde_json::json;
        // A string read from the payload parses; the offset is kept as the instant.
        assert_eq!(
            cel("string(timestamp(payload.ticket.created_at))"),
            Ok(json!("2026-11-30T08:00:00Z"))
        );
        yes("now - timestamp(payload.ticket.created_at) > duration('24h')");
        yes("now - timestamp(payload.ticket.created_at) == duration('40h')");
        assert_eq!(cel("now.getDayOfWeek()"), Ok(json!(3)));
        assert_eq!(cel("string(now)"), Ok(json!("2026-12-02T00:00:00Z")));
        // Written into JSON: their CEL text.
        assert_eq!(cel("now"), Ok(json!("2026-12-02T00:00:00Z")));
        assert_eq!(
            cel("[now - duration('1.5s'), duration('24h')]"),
            Ok(json!(["2026-12-01T23:59:58.5Z", "86400s"]))
        );
        assert_eq!(cel("{'at': now}"), Ok(json!({"at": "2026-12-02T00:00:00Z"})));
        // A timestamp has no fields.
        assert!(cel("now.year").is_err());
        // Inside lists, maps and comprehensions, as any value.
        yes("[now] == [now] && now in [now] && {'a': now}.a == now");
        yes("[duration('1s'), duration('2s')].exists(d, d > duration('1s'))");
        assert_eq!(
            cel("[now, now - duration('1h')].map(t, t.getHours())"),
            Ok(json!([0, 23]))
        );
        yes("(now > timestamp(payload.ticket.created_at) ? 'old' : 'new') == 'old'");
    }

    #[test]
    fn templates_see_now_as_text() {
        use crate::expr::eval::{self, Vars};
        let t = crate::compile::template::compile("at {{ now }}").expect("the template parses");
        let vars = Vars {
            now: Some(Timestamp::parse("2026-12-02T00:00:00.25Z").expect("valid")),
            ..Vars::default()
        };
        assert_eq!(
            eval::render(&t, &vars).expect("renders"),
            "at 2026-12-02T00:00:00.25Z"
        );
    }

    #[test]
    fn micros_round_trip() {
        let t = Timestamp::from_unix_micros(1_764_633_600_123_456).unwrap();
        assert_eq!(t.unix_micros(), 1_764_633_600_123_456);
        assert_eq!(t.to_string(), "2025-12-02T00:00:00.123456Z");
        let before = Timestamp::from_unix_micros(-1).unwrap();
        assert_eq!(before.to_string(), "1969-12-31T23:59:59.999999Z");
        assert_eq!(before.unix_micros(), -1);
    }
}
