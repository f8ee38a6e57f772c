//! The step tree of a run, as `--trace` and `runs show` print it.

use std::fmt::Write as _;

use serde_json::Value;

use crate::runtime::record::{StepRecord, StepStatus, Usage};
use crate::runtime::resume::Waiting;
use crate::store::Store;

/// What `runs show` adds to the tree: each step's payload changes and cost, the question of
/// each `interrupt` step that stopped its run, and how to answer the one the tree waits at.
pub struct Detail<'a> {
    /// The interrupt the run tree waits at, and the command that answers it.
    pub answer: Option<(&'a Waiting, String)>,
    /// Now, in Unix milliseconds: expiries are told relative to it.
    pub now_ms: u64,
}

/// Renders the steps of `run_id` and, indented under their calling steps, its child runs.
pub async fn render<S: Store>(store: &S, run_id: &str, color: bool) -> String {
    render_with(store, run_id, color, None).await
}

/// [`render`], with the [`Detail`] of `runs show` when given.
pub async fn render_with<S: Store>(
    store: &S,
    run_id: &str,
    color: bool,
    detail: Option<&Detail<'_>>,
) -> String {
    let mut out = String::new();
    let Ok(run) = store.get_run(run_id).await else {
        return format!("run `{run_id}` not found\n");
    };
    let _ = writeln!(
        out,
        "run {} · {} · {}{}",
        run.id,
        run.flow,
        run.status.as_str(),
        usage(&run.usage)
    );
    walk(store, run_id, 1, color, detail, &mut out).await;
    out
}

fn walk<'a, S: Store>(
    store: &'a S,
    run_id: &'a str,
    depth: usize,
    color: bool,
    detail: Option<&'a Detail<'a>>,
    out: &'a mut String,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
    Box::pin(async move {
        // The latest attempt of each step: an earlier attempt's `started` record is history.
        let steps = store.latest_steps(run_id).await.unwrap_or_default();
        // Iterations and branches are recorded as they finish, before their step's own
        // record; show them under it.
        let is_part = |s: &StepRecord| s.kind == "iteration" || s.kind == "branch";
        let part_of = |p: &StepRecord, number: &str| {
            p.number == number || p.number.strip_prefix(number).is_some_and(|r| r.starts_with('.'))
        };
        for s in steps.iter().filter(|s| !is_part(s)) {
            print_one(store, s, depth, color, detail, out).await;
            for p in steps.iter().filter(|p| is_part(p) && part_of(p, &s.number)) {
                print_one(store, p, depth + 1, color, detail, out).await;
            }
        }
        // The parts of a step that has no record of its own yet (the run stopped while the
        // step ran): what finished of it, under a line for the step.
        let mut open: Vec<(String, &str, &str)> = Vec::new();
        for p in steps.iter().filter(|p| is_part(p)) {
            let owner = if p.kind == "branch" {
                p.number.rsplit_once('.').map_or(p.number.as_str(), |(n, _)| n)
            } else {
                p.number.as_str()
            };
            let has_step = steps.iter().any(|s| !is_part(s) && s.number == owner);
            if !has_step && !open.iter().any(|(n, ..)| n == owner) {
                let parts = if p.kind == "branch" {
                    "branches"
                } else {
                    "iterations"
                };
                open.push((owner.to_string(), p.step.as_str(), parts));
            }
        }
        for (number, step, parts) in open {
            let done = steps
                .iter()
                .filter(|p| is_part(p) && part_of(p, &number) && p.status != StepStatus::Started)
                .count();
            let _ = writeln!(
                out,
                "{}… {number} {step} · not finished · {done} {parts} finished",
                "  ".repeat(depth)
            );
            for p in steps.iter().filter(|p| is_part(p) && part_of(p, &number)) {
                print_one(store, p, depth + 1, color, detail, out).await;
            }
        }
    })
}

fn print_one<'a, S: Store>(
    store: &'a S,
    s: &'a StepRecord,
    depth: usize,
    color: bool,
    detail: Option<&'a Detail<'a>>,
    out: &'a mut String,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
    Box::pin(async move {
        let _ = writeln!(out, "{}{}", "  ".repeat(depth), line(s, color));
        llm_notes(s, &"  ".repeat(depth + 1), out);
        if let Some(detail) = detail {
            if s.kind == "interrupt" && s.status == StepStatus::Interrupted {
                question(s, detail, &"  ".repeat(depth + 1), out);
            }
            for c in &s.changes {
                let mut value = c.value.to_string();
                if value.len() > 120 {
                    let cut = (0..=117).rev().find(|i| value.is_char_boundary(*i)).unwrap_or(0);
                    value.truncate(cut);
                    value.push('…');
                }
                let _ = writeln!(out, "{}  set {} = {value}", "  ".repeat(depth), c.path);
            }
            // Records written before the notes were one object kept the repairs as a bare list.
            let repairs = match &s.answers {
                Some(Value::Array(r)) => Some(r),
                Some(a) => a.get("repairs").and_then(Value::as_array),
                None => None,
            };
            if let Some(repairs) = repairs {
                let pad = "  ".repeat(depth + 1);
                let _ = writeln!(
                    out,
                    "{pad}repaired: the answer was used after {} repair request(s)",
                    repairs.len()
                );
                answers(&serde_json::json!({"repairs": repairs}), &pad, out);
            }
            if s.usage.cost_usd > 0.0 || s.usage.input_tokens > 0 {
                let _ = writeln!(
                    out,
                    "{}  tokens {} in, {} out · ${:.6}",
                    "  ".repeat(depth),
                    s.usage.input_tokens,
                    s.usage.output_tokens,
                    s.usage.cost_usd
                );
            }
        }
        if let Some(e) = &s.error {
            let _ = writeln!(out, "{}  error[{}]: {}", "  ".repeat(depth), e.kind, e.message);
            if detail.is_some()
                && let Some(d) = &e.details
            {
                answers(d, &"  ".repeat(depth + 1), out);
            }
        }
        for v in &s.violations {
            let _ = writeln!(
                out,
                "{}  violation: {} ({})",
                "  ".repeat(depth),
                v.path,
                v.reason
            );
        }
        if let Some(child) = &s.child_run {
            walk(store, child, depth + 1, color, detail, out).await;
        }
    })
}

/// The question of an `interrupt` step that stopped its run, under it: the prompt, the schema
/// the decision must match, the expiry, and (for the interrupt the tree waits at) the command
/// that answers it. Records of versions that kept only the prompt show only the prompt.
fn question(s: &StepRecord, detail: &Detail<'_>, pad: &str, out: &mut String) {
    let result = s.result.as_deref();
    let field = |k: &str| result.and_then(|r| r.get(k));
    if let Some(prompt) = field("prompt").and_then(Value::as_str) {
        let text = prompt.trim_end().replace('\n', &format!("\n{pad}        "));
        let _ = writeln!(out, "{pad}prompt: {text}");
    }
    if let Some(schema) = field("schema") {
        let _ = writeln!(out, "{pad}decision schema: {schema}");
    }
    if let Some(at) = field("expires_at").and_then(Value::as_u64) {
        let when = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_millis(at));
        if at >= detail.now_ms {
            let _ = writeln!(out, "{pad}expires: {when} (in {})", span(at - detail.now_ms));
        } else {
            let _ = writeln!(
                out,
                "{pad}expired: {when} ({} ago): a decision now fails the step with kind `timeout`",
                span(detail.now_ms - at)
            );
        }
    }
    if let Some((w, command)) = &detail.answer
        && w.run_id == s.run_id
        && w.step.number == s.number
    {
        let _ = writeln!(out, "{pad}answer: `{command}`");
    }
}

/// What a model said in a call that failed on its answer (`details` of its error): each answer
/// a repair was asked for, with the request, then the last answer.
fn answers(details: &Value, pad: &str, out: &mut String) {
    let block = |label: &str, text: &str, out: &mut String| {
        let text = text.trim_end().replace('\n', &format!("\n{pad}  | "));
        let _ = writeln!(out, "{pad}{label}:\n{pad}  | {text}");
    };
    if let Some(Value::Array(repairs)) = details.get("repairs") {
        for (i, r) in repairs.iter().enumerate() {
            if let Some(a) = r.get("answer").and_then(Value::as_str) {
                block(&format!("answer {}", i + 1), a, out);
            }
            if let Some(q) = r.get("repair_request").and_then(Value::as_str) {
                block(&format!("repair {} asked", i + 1), q, out);
            }
        }
    }
    if let Some(a) = details.get("answer").and_then(Value::as_str) {
        let n = details
            .get("repairs")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        let label = if n > 0 {
            format!("answer {} (the last)", n + 1)
        } else {
            "answer".into()
        };
        block(&label, a, out);
    }
}

/// A duration in whole units, the two largest: `71h 59m`, `4m 10s`, `12s`.
fn span(ms: u64) -> String {
    let s = ms / 1000;
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m {s}s"),
        _ => format!("{h}h {m}m"),
    }
}

fn line(s: &StepRecord, color: bool) -> String {
    let (mark, paint) = match s.status {
        StepStatus::Succeeded => ("✓", "32"),
        StepStatus::Failed => ("✗", "31"),
        StepStatus::Interrupted => ("⏸", "33"),
        StepStatus::Started => ("…", "33"),
    };
    let mark = if color {
        format!("\x1b[{paint}m{mark}\x1b[0m")
    } else {
        mark.to_string()
    };
    let ms = s.finished_at.map(|f| f.saturating_sub(s.started_at)).unwrap_or(0);
    let mut l = match (s.kind.as_str(), s.iteration) {
        ("iteration", Some(i)) => format!("{mark} {}[{i}] {} {}ms", s.number, s.step, ms),
        ("branch", _) => format!("{mark} {} branch {}ms", s.number, ms),
        _ => format!("{mark} {} {} [{}] {}ms", s.number, s.step, s.kind, ms),
    };
    if s.attempt > 1 {
        let _ = write!(l, " · {} attempts", s.attempt);
    }
    if let Some(n) = s.iterations {
        let _ = write!(l, " · {n} iterations");
    }
    l.push_str(&usage(&s.usage));
    if let Some(route) = &s.route {
        let _ = write!(l, " → {route}");
    }
    l
}

/// What an `llm` call's record says beyond its tokens: a structured-output form the server
/// refused, and requests abandoned with their tokens unknown.
fn llm_notes(s: &StepRecord, pad: &str, out: &mut String) {
    let Some(notes) = s.answers.as_ref().filter(|a| a.is_object()) else {
        return;
    };
    if let Some(r) = notes.get("refused") {
        let _ = writeln!(
            out,
            "{pad}structured output: {} (the server refused {}: {})",
            notes["structured_output"].as_str().unwrap_or("?"),
            r["form"].as_str().unwrap_or("?"),
            r["message"].as_str().unwrap_or("")
        );
    }
    if let Some(n) = notes.get("abandoned_requests").and_then(Value::as_u64) {
        let _ = writeln!(
            out,
            "{pad}{n} request(s) abandoned (timed out or cancelled): the server may have finished and billed them; their tokens are unknown, so this cost is a lower bound"
        );
    }
}

/// The requests abandoned with their tokens unknown in a step record's `llm` notes.
pub fn abandoned_requests(s: &StepRecord) -> u64 {
    s.answers
        .as_ref()
        .and_then(|a| a.get("abandoned_requests"))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// ` · 120 tokens (100 in, 20 out) · $0.000140`, or nothing when no tokens were used.
fn usage(u: &Usage) -> String {
    if u.input_tokens + u.output_tokens == 0 && u.cost_usd == 0.0 {
        return String::new();
    }
    format!(
        " · {} tokens ({} in, {} out) · ${:.6}",
        u.input_tokens + u.output_tokens,
        u.input_tokens,
        u.output_tokens,
        u.cost_usd
    )
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
