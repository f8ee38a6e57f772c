//! The decisions of a run in `runs show` (SPEC §15): each answer the inbox recorded for the
//! run or the runs of its tree, in the order made — who, how, when, the decision, the reason,
//! what it edited (before → after) and its bulk operation. Text from people and models is
//! shown with its control characters escaped, so it cannot move the terminal's cursor.

use std::fmt::Write as _;

use serde_json::Value;

use crate::record::inbox::{DecisionRow, format_ms};
use crate::store::Store;
use crate::store::inbox::LogQuery;

/// The decisions recorded for run `run_id` (none for a store that keeps no steps).
pub async fn of_run(s: &impl Store, run_id: &str) -> Result<Vec<DecisionRow>, String> {
    if !s.keeps_steps() {
        return Ok(Vec::new());
    }
    s.inbox()
        .log(&LogQuery {
            run: Some(run_id.to_string()),
            ..LogQuery::default()
        })
        .await
        .map_err(|e| e.to_string())
}

/// Appends the `decisions` section of `rows` (nothing when there are none).
pub fn lines(out: &mut String, rows: &[DecisionRow]) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "decisions");
    for d in rows {
        let _ = writeln!(
            out,
            "  {} {} via {}: {}",
            format_ms(d.at),
            plain(&d.actor),
            d.via.as_str(),
            plain(&d.decision.to_string())
        );
        if let Some(r) = &d.reason {
            let _ = writeln!(out, "    reason: {}", plain(r));
        }
        for e in d.edited.as_ref().and_then(Value::as_array).into_iter().flatten() {
            let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
            let json = |k: &str| e.get(k).map_or_else(|| "null".to_string(), Value::to_string);
            let _ = writeln!(
                out,
                "    edited {} ({}): {} → {}",
                plain(&text("tool")),
                plain(&text("call")),
                plain(&json("before")),
                plain(&json("after"))
            );
        }
        if let Some(b) = &d.bulk_id {
            let _ = writeln!(out, "    bulk {}", plain(b));
        }
        let _ = writeln!(out, "    item {} (run {})", d.item_id, d.run_id);
    }
    out.push('\n');
}

/// `s` with its control characters escaped (`\n`, `\u{1b}`).
pub(super) fn plain(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::inbox::Via;
    use serde_json::json;

    #[test]
    fn a_decision_shows_who_how_what_why_and_its_edit_with_control_characters_escaped() {
        let row = DecisionRow {
            id: "d1".into(),
            item_id: "q1".into(),
            run_id: "r1".into(),
            actor: "ana\u{1b}[2J".into(),
            via: Via::Library,
            decision: json!({"edit": {"amount": 40}}),
            reason: Some("line one\nline two".into()),
            edited: Some(
                json!([{"call": "call_1_1", "tool": "refund", "before": {"amount": 100}, "after": {"amount": 40}}]),
            ),
            bulk_id: Some("b7".into()),
            at: 0,
        };
        let mut out = String::new();
        lines(&mut out, &[row]);
        assert_eq!(
            out,
            "decisions\n  1970-01-01T00:00:00.000Z ana\\u{1b}[2J via library: {\"edit\":{\"amount\":40}}\n    reason: line one\\nline two\n    edited refund (call_1_1): {\"amount\":100} → {\"amount\":40}\n    bulk b7\n    item q1 (run r1)\n\n"
        );
        let mut none = String::new();
        lines(&mut none, &[]);
        assert_eq!(none, "");
    }
}
