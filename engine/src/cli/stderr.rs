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
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

/// A time in Unix milliseconds as `YYYY-MM-DD HH:MM:SS` (UTC); one past the year 9999 as its
/// number.
pub(crate) fn utc_seconds(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(
            || format!("{ms} ms after 1970"),
            |at| at.strftime("%Y-%m-%d %H:%M:%S").to_string(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_in_utc() {
        assert_eq!(utc_seconds(0), "1970-01-01 00:00:00");
        assert_eq!(utc_seconds(1_704_067_200_000), "2024-01-01 00:00:00");
        assert_eq!(utc_seconds(1_772_323_199_999), "2026-02-28 23:59:59");
        assert_eq!(utc_seconds(1_700_000_000_123), "2023-11-14 22:13:20");
        assert_eq!(utc_seconds(u64::MAX), "18446744073709551615 ms after 1970");
        let now = timestamp();
        assert_eq!(
            (now.len(), &now[10..11], &now[19..20], &now[26..]),
            (27, "T", ".", "Z"),
            "{now}"
        );
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
