//! What commands tell on stderr besides logs: errors, interrupts, hints, a `--trace` tree.
//! With `--log-format json` each message is one JSON object per line, as log events are:
//! `{"level", "event", "message", ...}`, where `message` is the first line of the text and
//! `detail` the lines under it (hints, the command that continues a run); otherwise the text
//! is printed as it is.

use serde_json::{Map, Value};

/// How serious a message is, as log levels name it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Level {
    Error,
    Warn,
    Info,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Error => "ERROR",
            Level::Warn => "WARN",
            Level::Info => "INFO",
        }
    }
}

/// Prints `text` on stderr: as it is, or, with `--log-format json`, as one JSON line naming
/// the `event`, with `fields` (an object, or null) merged in.
pub(crate) fn say(level: Level, event: &str, text: &str, fields: Value) {
    if !super::json_logs() {
        eprintln!("{}", text.trim_end_matches('\n'));
        return;
    }
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let message = lines.next().unwrap_or("");
    let detail: Vec<&str> = lines.collect();
    eprintln!("{}", line(level, event, message, &detail, fields));
}

/// An `error` event: `error: TEXT` as text.
pub(crate) fn error(text: impl std::fmt::Display) {
    // The level says it is an error; the text says so only where there is no level.
    let text = if super::json_logs() {
        text.to_string()
    } else {
        format!("error: {text}")
    };
    say(Level::Error, "error", &text, Value::Null);
}

/// The JSON line of [`say`].
fn line(level: Level, event: &str, message: &str, detail: &[&str], fields: Value) -> String {
    let mut obj = Map::new();
    obj.insert("timestamp".into(), Value::String(timestamp()));
    obj.insert("level".into(), Value::String(level.as_str().into()));
    obj.insert("event".into(), Value::String(event.into()));
    obj.insert("message".into(), Value::String(message.into()));
    if !detail.is_empty() {
        obj.insert(
            "detail".into(),
            Value::Array(detail.iter().map(|d| Value::String((*d).into())).collect()),
        );
    }
    if let Value::Object(fields) = fields {
        obj.extend(fields);
    }
    Value::Object(obj).to_string()
}

/// Diagnostics rendered as [`crate::diag::render::json`] gives them: one `diagnostic` line
/// each with `--log-format json`; `human` (their text) otherwise.
pub(crate) fn diagnostics(json: &str, human: &str) {
    if !super::json_logs() {
        eprint!("{human}");
        return;
    }
    let items: Vec<Value> = serde_json::from_str(json).expect("diagnostics render as a JSON array");
    for d in items {
        let level = match d["severity"].as_str() {
            Some("error") => Level::Error,
            Some("warning") => Level::Warn,
            _ => Level::Info,
        };
        let message = d["message"].as_str().unwrap_or("").to_string();
        eprintln!("{}", line(level, "diagnostic", &message, &[], d));
    }
}

/// Now as RFC 3339 UTC with microseconds, as the log lines have it.
fn timestamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let (date, time) = date_time(now.as_secs());
    format!("{date}T{time}.{:06}Z", now.subsec_micros())
}

/// A time in Unix milliseconds as `YYYY-MM-DD HH:MM:SS` (UTC).
pub(crate) fn utc_seconds(ms: u64) -> String {
    let (date, time) = date_time(ms / 1000);
    format!("{date} {time}")
}

/// `YYYY-MM-DD` and `HH:MM:SS` (UTC) of a time in Unix seconds.
fn date_time(secs: u64) -> (String, String) {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60),
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_from_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(20_513), (2026, 3, 1));
        assert_eq!(utc_seconds(1_700_000_000_123), "2023-11-14 22:13:20");
    }

    #[test]
    fn a_json_line_has_the_first_line_as_message_and_the_rest_as_detail() {
        let l = line(
            Level::Error,
            "run_failed",
            "error[timeout]: slow",
            &["run `r1` failed after 2 steps"],
            serde_json::json!({"run_id": "r1"}),
        );
        let v: Value = serde_json::from_str(&l).expect("JSON");
        assert_eq!(v["level"], "ERROR");
        assert_eq!(v["event"], "run_failed");
        assert_eq!(v["message"], "error[timeout]: slow");
        assert_eq!(v["detail"][0], "run `r1` failed after 2 steps");
        assert_eq!(v["run_id"], "r1");
    }
}
