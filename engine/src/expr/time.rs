//! CEL's `timestamp` and `duration` (SPEC §5.1): the two value types, their parsing and
//! text, their accessors, arithmetic and ordering, registered into cel's root environment by
//! [`register`].
//!
//! This module owns the time values expressions see and nothing else: it knows nothing of
//! runs, payloads or the store (the engine decides what `now` is and hands it over as a
//! [`Timestamp`]). The calendar and the time zones are `jiff`'s: a date's fields, its weekday
//! and day of the year, and a named zone's offset at an instant, read from the IANA database
//! that `jiff` bundles (`TimeZoneDatabase::bundled`, never the machine's
//! `/usr/share/zoneinfo`), so every machine routes alike. What is CEL's stays here: the
//! ranges, the text of both types (cel-go's, which is Go's) and their errors.
//!
//! **Ranges, as CEL has them.** A timestamp lies between `0001-01-01T00:00:00Z` and
//! `9999-12-31T23:59:59.999999999Z`; a duration is a signed 64-bit count of nanoseconds (about
//! ±292 years, cel-go's range). Parsing, converting or computing past either is an error
//! naming the range, never a wrapped or clamped value. (`jiff::Timestamp` stops 26 hours short
//! of CEL's last instant, so that any offset still gives a civil time; a timestamp here is a
//! `jiff::SignedDuration` since the Unix epoch, read on `jiff`'s civil calendar.)
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
use jiff::SignedDuration;
use jiff::civil::DateTime;
use jiff::tz::{Offset, TimeZone, TimeZoneDatabase};

/// `google.protobuf.Timestamp`, the type of [`Timestamp`] values.
pub const TIMESTAMP_TYPE: Type = Type::simple_type(Kind::Timestamp, "google.protobuf.Timestamp");
/// `google.protobuf.Duration`, the type of [`Duration`] values.
pub const DURATION_TYPE: Type = Type::simple_type(Kind::Duration, "google.protobuf.Duration");

static TIMESTAMP_TYPE_REF: Type = TIMESTAMP_TYPE;
static DURATION_TYPE_REF: Type = DURATION_TYPE;

const NANOS_PER_SEC: i64 = 1_000_000_000;
/// `0001-01-01T00:00:00Z`, the first instant in CEL's range, since the Unix epoch.
const MIN: SignedDuration = SignedDuration::from_secs(-62_135_596_800);
/// `9999-12-31T23:59:59.999999999Z`, the last.
const MAX: SignedDuration = SignedDuration::new(253_402_300_799, 999_999_999);
/// The civil time Unix seconds count from.
const EPOCH: DateTime = DateTime::constant(1970, 1, 1, 0, 0, 0, 0);
/// 400 Gregorian years: 146,097 days, whole weeks, after which the calendar repeats exactly.
const GREGORIAN_CYCLE: SignedDuration = SignedDuration::from_hours(146_097 * 24);

/// An instant in UTC, within CEL's range.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    since_epoch: SignedDuration,
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
        let nanos = i32::try_from(nanos).ok().filter(|n| *n < 1_000_000_000)?;
        Self::since_epoch(SignedDuration::new(secs, nanos))
    }

    /// The instant `d` after the Unix epoch (before it if negative), if it is in CEL's range.
    fn since_epoch(d: SignedDuration) -> Option<Self> {
        (MIN..=MAX).contains(&d).then_some(Timestamp { since_epoch: d })
    }

    /// The current time, to the microsecond (what a store records).
    pub fn now() -> Self {
        Self::from_unix_micros(jiff::Timestamp::now().as_microsecond()).unwrap_or(Timestamp {
            since_epoch: SignedDuration::ZERO,
        })
    }

    /// The instant `micros` microseconds after the Unix epoch, if it is in CEL's range.
    pub fn from_unix_micros(micros: i64) -> Option<Self> {
        Self::since_epoch(SignedDuration::from_micros(micros))
    }

    /// Unix microseconds, floored: the fraction below a microsecond dropped.
    pub fn unix_micros(&self) -> i64 {
        self.floored(1_000)
    }

    /// Unix seconds, floored (`int(t)`).
    pub fn unix_secs(&self) -> i64 {
        self.floored(1_000_000_000)
    }

    /// Whole units of `unit` nanoseconds since the epoch, floored; every instant in range
    /// counts in an `i64` of microseconds.
    fn floored(&self, unit: i128) -> i64 {
        let n = self.since_epoch.as_nanos().div_euclid(unit);
        i64::try_from(n).expect("an instant in CEL's range counts in 64 bits")
    }

    /// Parses RFC 3339 as cel-go does (Go's `time.RFC3339` layout):
    /// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, with an upper-case `T` and `Z`, at most nine
    /// fraction digits, and no leap second. The layout is read here; the date and time are
    /// checked on `jiff`'s calendar.
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
        // Two digits, which always fit an `i8`.
        let two = |from: usize| num(from, 2).and_then(|n| i8::try_from(n).ok());
        let at = |i: usize, c: u8| b.get(i) == Some(&c);
        if !(at(4, b'-') && at(7, b'-') && at(10, b'T') && at(13, b':') && at(16, b':')) {
            return Err(bad());
        }
        let year = num(0, 4).and_then(|n| i16::try_from(n).ok()).ok_or_else(bad)?;
        let (month, day) = (two(5).ok_or_else(bad)?, two(8).ok_or_else(bad)?);
        let (hour, minute, second) = (
            two(11).ok_or_else(bad)?,
            two(14).ok_or_else(bad)?,
            two(17).ok_or_else(bad)?,
        );
        let mut i = 19;
        let mut nanos = 0i32;
        if at(i, b'.') {
            let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            if digits == 0 || digits > 9 {
                return Err(bad());
            }
            let frac = num(i + 1, digits).ok_or_else(bad)?;
            nanos = i32::try_from(frac * 10i64.pow(9 - digits as u32)).map_err(|_| bad())?;
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
        // `jiff` refuses a day past its month's end, the 29th of February out of a leap
        // year, hour 24 and second 60.
        let local = DateTime::new(year, month, day, hour, minute, second, nanos).map_err(|_| bad())?;
        let since_epoch = local.duration_since(EPOCH) - SignedDuration::from_secs(offset);
        Self::since_epoch(since_epoch).ok_or_else(|| range_error(&format!("`{text}`")))
    }

    /// `timestamp(int)`: Unix seconds.
    pub fn from_unix_secs(secs: i64) -> Result<Self, TimeError> {
        Self::new(secs, 0).ok_or_else(|| range_error(&format!("{secs} seconds since the Unix epoch")))
    }

    /// `self + d`, in range.
    pub fn checked_add(&self, d: Duration) -> Result<Self, TimeError> {
        self.since_epoch
            .checked_add(d.to_jiff())
            .and_then(Self::since_epoch)
            .ok_or_else(|| range_error(&format!("`{self} + {d}`")))
    }

    /// `self - d`, in range.
    pub fn checked_sub(&self, d: Duration) -> Result<Self, TimeError> {
        self.since_epoch
            .checked_sub(d.to_jiff())
            .and_then(Self::since_epoch)
            .ok_or_else(|| range_error(&format!("`{self} - {d}`")))
    }

    /// `self - other`, as a duration in range.
    pub fn since(&self, other: &Timestamp) -> Result<Duration, TimeError> {
        // Two instants in range are at most 10,000 years apart: no overflow in jiff's seconds.
        let nanos = (self.since_epoch - other.since_epoch).as_nanos();
        i64::try_from(nanos)
            .map(|nanos| Duration { nanos })
            .map_err(|_| duration_range_error(&format!("`{self} - {other}`")))
    }

    /// The calendar fields of this instant in `zone` (UTC when `None`).
    pub fn civil(&self, zone: Option<&str>) -> Result<Civil, TimeError> {
        let (at, years) = self.to_jiff();
        let offset = match zone {
            None => Offset::UTC,
            Some(z) => zone_offset(z, at)?,
        };
        let dt = offset.to_datetime(at);
        Ok(Civil {
            year: i64::from(dt.year()) + years,
            month: i64::from(dt.month()),
            day: i64::from(dt.day()),
            day_of_year: i64::from(dt.day_of_year()) - 1,
            day_of_week: i64::from(dt.weekday().to_sunday_zero_offset()),
            hours: i64::from(dt.hour()),
            minutes: i64::from(dt.minute()),
            seconds: i64::from(dt.second()),
            millis: i64::from(dt.millisecond()),
        })
    }

    /// This instant as a `jiff::Timestamp`, and the years to add to the dates `jiff` reads of
    /// it: none, but for CEL's last 26 hours, past `jiff::Timestamp::MAX` (which leaves room
    /// for any offset east of UTC within the year 9999). Those are read 400 years earlier,
    /// where the calendar is the same, weekdays and all, and every zone keeps the last rule
    /// the database gives it, as in 9999.
    fn to_jiff(self) -> (jiff::Timestamp, i64) {
        if let Ok(at) = jiff::Timestamp::from_duration(self.since_epoch) {
            return (at, 0);
        }
        let earlier = jiff::Timestamp::from_duration(self.since_epoch - GREGORIAN_CYCLE);
        (
            earlier.expect("400 years before an instant in CEL's range is in jiff's"),
            400,
        )
    }
}

/// RFC 3339 in UTC, the fraction trimmed of trailing zeros (cel-go's `string(timestamp)`).
impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (at, years) = self.to_jiff();
        let dt = Offset::UTC.to_datetime(at);
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            i64::from(dt.year()) + years,
            dt.month(),
            dt.day(),
            dt.hour(),
            dt.minute(),
            dt.second()
        )?;
        write_fraction(f, dt.subsec_nanosecond().unsigned_abs())?;
        f.write_str("Z")
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({self})")
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

    fn to_jiff(self) -> SignedDuration {
        SignedDuration::from_nanos(self.nanos)
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
// Time zones

/// The offset from UTC of `zone` at `at`: a fixed `[+|-]HH:MM` (cel-go reads any text with a
/// colon so, the sign optional), else an IANA name (`Europe/Paris`, `UTC`, `US/Central`); the
/// empty name is UTC.
fn zone_offset(zone: &str, at: jiff::Timestamp) -> Result<Offset, TimeError> {
    let unknown = || {
        TimeError(format!(
            "unknown time zone `{zone}` (write an IANA name like `Europe/Paris` or an offset like `+05:30`)"
        ))
    };
    if zone.is_empty() {
        return Ok(Offset::UTC);
    }
    if let Some((h, m)) = zone.split_once(':') {
        let (negative, digits) = match h.as_bytes().first() {
            Some(b'-') => (true, &h[1..]),
            Some(b'+') => (false, &h[1..]),
            _ => (false, h),
        };
        let two_digits = |s: &str| {
            (s.len() == 2 && s.bytes().all(|c| c.is_ascii_digit()))
                .then(|| s.parse::<i32>().ok())
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
        return Offset::from_seconds(if negative { -secs } else { secs }).map_err(|_| unknown());
    }
    Ok(named_zone(zone).ok_or_else(unknown)?.to_offset(at))
}

/// The IANA zone `name`, from the database `jiff` bundles, spelled exactly as the database
/// spells it (`jiff` would also take `europe/paris`; cel-go, reading zone files by name, does
/// not). `Etc/Unknown`, `jiff`'s name for a zone it could not find, is no zone.
fn named_zone(name: &str) -> Option<TimeZone> {
    let tz = TimeZoneDatabase::bundled().get(name).ok()?;
    (tz.iana_name() == Some(name) && !tz.is_unknown()).then_some(tz)
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
        self.since_epoch.is_zero()
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
    fn the_range_ends_on_jiffs_calendar() {
        let first = Timestamp::parse("0001-01-01T00:00:00Z").unwrap();
        assert_eq!(first.unix_secs(), -62_135_596_800);
        let last = Timestamp::parse("9999-12-31T23:59:59.999999999Z").unwrap();
        assert_eq!(last.unix_secs(), 253_402_300_799);
        let fields = |c: Civil| {
            (
                c.year,
                c.month,
                c.day,
                c.day_of_year,
                c.day_of_week,
                c.hours,
                c.millis,
            )
        };
        // Past `jiff::Timestamp::MAX`, in UTC: a Friday.
        assert_eq!(fields(last.civil(None).unwrap()), (9999, 12, 31, 364, 5, 23, 999));
        // East of UTC on CEL's last day, the year 10000 (as Go reads it), a Saturday.
        assert_eq!(
            fields(last.civil(Some("+01:00")).unwrap()),
            (10000, 1, 1, 0, 6, 0, 999)
        );
        assert_eq!(
            fields(last.civil(Some("Asia/Tokyo")).unwrap()),
            (10000, 1, 1, 0, 6, 8, 999)
        );
        // West of UTC on its first day, the year 0 (a leap year), a Sunday.
        assert_eq!(
            fields(first.civil(Some("-01:00")).unwrap()),
            (0, 12, 31, 365, 0, 23, 0)
        );
    }

    fn hours(zone: &str, text: &str) -> f64 {
        let (at, _) = Timestamp::parse(text).expect("valid").to_jiff();
        let offset = zone_offset(zone, at).unwrap_or_else(|e| panic!("{zone}: {e}"));
        f64::from(offset.seconds()) / 3600.0
    }

    #[test]
    fn zones_with_and_without_daylight_saving() {
        assert_eq!(hours("UTC", "2026-07-01T00:00:00Z"), 0.0);
        assert_eq!(hours("Asia/Kathmandu", "2009-02-13T23:31:30Z"), 5.75);
        assert_eq!(hours("Asia/Kolkata", "2030-01-01T00:00:00Z"), 5.5);
        // The United States, 2026: CDT from 8 March 08:00 UTC to 1 November 07:00 UTC.
        assert_eq!(hours("US/Central", "2026-03-08T07:59:59Z"), -6.0);
        assert_eq!(hours("US/Central", "2026-03-08T08:00:00Z"), -5.0);
        assert_eq!(hours("America/Chicago", "2026-11-01T06:59:59Z"), -5.0);
        assert_eq!(hours("America/Chicago", "2026-11-01T07:00:00Z"), -6.0);
        // The European Union, 2026: summer time from 29 March to 25 October, 01:00 UTC.
        assert_eq!(hours("Europe/Paris", "2026-03-29T00:59:59Z"), 1.0);
        assert_eq!(hours("Europe/Paris", "2026-03-29T01:00:00Z"), 2.0);
        assert_eq!(hours("Europe/Paris", "2026-10-25T00:59:59Z"), 2.0);
        assert_eq!(hours("Europe/Paris", "2026-10-25T01:00:00Z"), 1.0);
        // The south: Sydney's summer spans the new year (ends 5 April, starts 4 October 2026).
        assert_eq!(hours("Australia/Sydney", "2026-01-15T00:00:00Z"), 11.0);
        assert_eq!(hours("Australia/Sydney", "2026-04-04T15:59:59Z"), 11.0);
        assert_eq!(hours("Australia/Sydney", "2026-04-04T16:00:00Z"), 10.0);
        assert_eq!(hours("Australia/Sydney", "2026-10-03T15:59:59Z"), 10.0);
        assert_eq!(hours("Australia/Sydney", "2026-10-03T16:00:00Z"), 11.0);
        // Half-hour offsets with daylight saving; from the recorded transitions (2009).
        assert_eq!(hours("America/St_Johns", "2009-02-13T02:00:00Z"), -3.5);
        assert_eq!(hours("America/St_Johns", "2031-07-01T12:00:00Z"), -2.5);
        assert_eq!(hours("Australia/Sydney", "2009-02-13T23:31:30Z"), 11.0);
        // Far future (past `jiff::Timestamp::MAX` too) and far past (local mean time).
        assert_eq!(hours("Europe/Paris", "9999-07-01T00:00:00Z"), 2.0);
        assert_eq!(hours("Europe/Paris", "9999-12-31T23:59:59Z"), 1.0);
        assert_eq!(hours("Australia/Sydney", "9999-12-31T23:59:59Z"), 11.0);
        assert_eq!(
            hours("America/New_York", "0001-01-01T00:00:00Z") * 3600.0,
            -17_762.0
        );
    }

    #[test]
    fn unknown_zones_and_spellings() {
        let (t, _) = Timestamp::parse("2026-07-01T00:00:00Z").expect("valid").to_jiff();
        for bad in [
            "Mars/Olympus",
            "europe/paris",
            "utc",
            "Etc/Unknown",
            "/",
            "Europe/",
        ] {
            let e = zone_offset(bad, t).expect_err(bad);
            assert!(e.0.contains(&format!("unknown time zone `{bad}`")), "{bad}: {e}");
        }
        assert_eq!(zone_offset("", t), Ok(Offset::UTC));
        let e = zone_offset("+24:00", t).expect_err("+24:00");
        assert!(e.0.contains("is out of range (hours 00 to 23"), "{e}");
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
        let t = crate::expr::template::compile("at {{ now }}").expect("the template parses");
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
