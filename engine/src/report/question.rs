//! The question a run stopped for a human asks, in one wording for every place that shows it:
//! an `interrupt` step's prompt, decision schema and expiry (SPEC §3.6), an agent loop's
//! proposed tool calls (SPEC §6.3), an MCP server's question during a call (SPEC §6.4), and, for the one the run tree waits at, the command that
//! answers it and the decision's shape. `runs show` prints the lines under the step; the run
//! page shows them at its top. It says what to show, not how: no printing here.

use serde_json::Value;

use crate::record::{StepRecord, StepStatus};
use crate::runtime::resume::{PendingCall, Question, pending_calls, question_of};

/// One labelled line of a question: `prompt`, `call 1`, `decision schema`, `expires`, …
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub label: String,
    pub text: String,
    /// The text is a command to type (the page shows it as code, the terminal in backticks).
    pub command: bool,
}

impl Line {
    fn new(label: impl Into<String>, text: impl Into<String>) -> Line {
        Line {
            label: label.into(),
            text: text.into(),
            command: false,
        }
    }
}

/// Whether record `s` stopped its run for a human: an `interrupt` step, an approval or an MCP
/// server's elicitation, `interrupted`.
pub fn asks(s: &StepRecord) -> bool {
    crate::runtime::resume::asks_human(s) && s.status == StepStatus::Interrupted
}

/// The question of record `s` (see [`asks`]), from its result: the prompt, the proposed calls,
/// the schema the decision must match and the expiry (told relative to `now_ms`, Unix ms);
/// then, when `command` is given (the run tree waits at this record), the command that
/// answers it and, for an approval, the decision's forms. Records of versions that kept only
/// the prompt give only the prompt.
pub fn question(s: &StepRecord, now_ms: u64, command: Option<&str>) -> Vec<Line> {
    let mut out = Vec::new();
    match question_of(s) {
        Question::Approval(a) => {
            if !a.prompt.is_empty() {
                out.push(Line::new("prompt", a.prompt.trim_end()));
            }
            // The calls it proposed, in the model's order.
            out.extend(call_lines(&a.calls));
        }
        Question::Elicitation(e) => {
            out.push(Line::new(
                "asked by",
                format!("MCP server `{}`, tool `{}`", e.server, e.tool),
            ));
            out.push(Line::new("prompt", e.message.trim_end()));
            out.push(Line::new("decision schema", e.schema.to_string()));
        }
        Question::Interrupt(i) => {
            if let Some(prompt) = &i.prompt {
                out.push(Line::new("prompt", prompt.trim_end()));
            }
            if let Some(schema) = &i.schema {
                out.push(Line::new("decision schema", schema.to_string()));
            }
            if let Some(at) = i.expires_at {
                expiry(&mut out, at, now_ms);
            }
        }
    }
    if let Some(command) = command {
        out.push(Line {
            label: "answer".into(),
            text: command.into(),
            command: true,
        });
        if s.kind == "approval" {
            let n = pending_calls(s.result.as_deref().and_then(|r| r.get("calls"))).len();
            let forms = r#"{"approve": true} | {"edit": {<arguments>}} | {"reject": "why"}"#;
            if n > 1 {
                out.push(Line::new(
                    "decision",
                    format!("a list of {n} decisions, in order, each {forms}"),
                ));
            } else {
                out.push(Line::new("decision", forms));
            }
        }
        if s.kind == "elicitation" {
            out.push(Line::new(
                "decision",
                r#"a value of the decision schema | {"reject": "why"} to decline"#,
            ));
        }
    }
    out
}

/// `call 1` · `refund {"amount":100}`: a line per call an approval holds (a list of
/// `{tool, arguments}`, as [`pending_calls`] reads it), the arguments cut at 300 characters.
pub fn calls(calls: Option<&Value>) -> Vec<Line> {
    call_lines(&pending_calls(calls))
}

/// The lines of one recorded decision (SPEC §15): who, how and when, the decision, the
/// reason, each edit as before → after, and its bulk operation.
pub fn decision_lines(d: &crate::record::inbox::DecisionRow) -> Vec<Line> {
    let mut out = vec![
        Line::new(
            "decided",
            format!(
                "{} by {} via {}",
                crate::record::inbox::format_ms(d.at),
                d.actor,
                d.via.as_str()
            ),
        ),
        Line::new("decision", d.decision.to_string()),
    ];
    if let Some(r) = &d.reason {
        out.push(Line::new("reason", r.clone()));
    }
    for e in d.edited.as_ref().and_then(Value::as_array).into_iter().flatten() {
        let json = |k: &str| e.get(k).map_or_else(|| "null".to_string(), Value::to_string);
        out.push(Line::new(
            format!("edited {}", e.get("tool").and_then(Value::as_str).unwrap_or("?")),
            format!("{} → {}", json("before"), json("after")),
        ));
    }
    if let Some(b) = &d.bulk_id {
        out.push(Line::new("bulk", b.clone()));
    }
    out
}

fn call_lines(calls: &[PendingCall]) -> Vec<Line> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let tool = if c.tool.is_empty() { "?" } else { &c.tool };
            Line::new(
                format!("call {}", i + 1),
                format!("{tool} {}", capped(&c.arguments.to_string(), 300)),
            )
        })
        .collect()
}

/// When an interrupt's decision is due (`at`, Unix ms), told relative to `now_ms`.
fn expiry(out: &mut Vec<Line>, at: u64, now_ms: u64) {
    let when = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_millis(at));
    if at >= now_ms {
        out.push(Line::new("expires", format!("{when} (in {})", span(at - now_ms))));
    } else {
        out.push(Line::new(
            "expired",
            format!(
                "{when} ({} ago): a decision now fails the step with kind `timeout`",
                span(now_ms - at)
            ),
        ));
    }
}

/// `text` on one line, at most `max` characters of it.
pub fn capped(text: &str, max: usize) -> String {
    let one = text.replace('\n', " ⏎ ");
    if one.chars().count() <= max {
        return one;
    }
    let mut out: String = one.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A duration in whole units, the two largest: `71h 59m`, `4m 10s`, `12s`.
pub fn span(ms: u64) -> String {
    let s = ms / 1000;
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m {s}s"),
        _ => format!("{h}h {m}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::span;

    #[test]
    fn spans_keep_their_two_largest_units() {
        assert_eq!(span(999), "0s");
        assert_eq!(span(12_000), "12s");
        assert_eq!(span(250_000), "4m 10s");
        assert_eq!(span(72 * 3_600_000 - 60_000), "71h 59m");
        assert_eq!(span(3_600_000), "1h 0m");
    }
}
