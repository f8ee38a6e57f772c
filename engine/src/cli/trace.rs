//! The step tree of a run, as `--trace` and `runs show` print it.

use std::fmt::Write as _;

use serde_json::Value;

use crate::record::{
    StepRecord, StepStatus, Usage, fmt_unknown, group_order, loop_order, loop_owner, tool_name,
};
use crate::report::question::{self, capped};
use crate::runtime::resume::Waiting;
use crate::store::Store;

/// What `runs show` adds to the tree: each step's payload changes and cost, the question of
/// each `interrupt` step that stopped its run, and how to answer the one the tree waits at.
pub struct Detail<'a> {
    /// The interrupt the run tree waits at, and the command that answers it.
    pub answer: Option<(&'a Waiting, String)>,
    /// Now, in Unix milliseconds: expiries are told relative to it.
    pub now_ms: u64,
    /// Print each agent loop's transcript under its step (else a line saying how).
    pub transcript: bool,
    /// The most characters of each transcript message printed.
    pub message_cap: usize,
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
        // record; show them under it. So are an agent loop's turns, tool calls and approvals:
        // under the step (or iteration, or branch) whose loop they are, in the loop's order.
        let is_group = StepRecord::is_group;
        let is_loop_part = StepRecord::is_loop_part;
        let is_part = |s: &StepRecord| is_group(s) || is_loop_part(s);
        let part_of = |p: &StepRecord, number: &str| p.is_group_of(number);
        let key = StepRecord::key;
        for s in steps.iter().filter(|s| !is_part(s)) {
            print_one(store, s, None, depth, color, detail, out).await;
            loop_parts(store, &steps, &s.number, depth + 1, color, detail, out).await;
            let mut groups: Vec<&StepRecord> = steps
                .iter()
                .filter(|p| is_group(p) && part_of(p, &s.number))
                .collect();
            group_order(&mut groups, Some(s));
            for p in groups {
                print_one(store, p, None, depth + 1, color, detail, out).await;
                loop_parts(store, &steps, &key(p), depth + 2, color, detail, out).await;
            }
        }
        // The parts of a step that has no record of its own yet (the run stopped while the
        // step ran): what finished of it, under a line for the step.
        let mut open: Vec<(String, &str, &str)> = Vec::new();
        for p in steps.iter().filter(|p| is_part(p)) {
            let owner = if is_loop_part(p) {
                loop_owner(&p.number)
            } else if p.kind == "branch" {
                p.number.rsplit_once('.').map_or(p.number.as_str(), |(n, _)| n)
            } else {
                p.number.as_str()
            };
            let has_step = if is_loop_part(p) {
                steps.iter().any(|s| !is_loop_part(s) && key(s) == owner)
            } else {
                steps.iter().any(|s| !is_part(s) && s.number == owner)
            };
            if !has_step && !open.iter().any(|(n, ..)| n == owner) {
                let parts = if is_loop_part(p) {
                    "turns"
                } else if p.kind == "branch" {
                    "branches"
                } else {
                    "iterations"
                };
                open.push((owner.to_string(), p.step.as_str(), parts));
            }
        }
        for (number, step, parts) in open {
            if parts == "turns" {
                let done = steps
                    .iter()
                    .filter(|p| {
                        p.kind == "turn" && loop_owner(&p.number) == number && p.status != StepStatus::Started
                    })
                    .count();
                let _ = writeln!(
                    out,
                    "{}… {number} {step} · not finished · {done} {parts} finished",
                    "  ".repeat(depth)
                );
                loop_parts(store, &steps, &number, depth + 1, color, detail, out).await;
                continue;
            }
            let done = steps
                .iter()
                .filter(|p| is_group(p) && part_of(p, &number) && p.status != StepStatus::Started)
                .count();
            let _ = writeln!(
                out,
                "{}… {number} {step} · not finished · {done} {parts} finished",
                "  ".repeat(depth)
            );
            let mut groups: Vec<&StepRecord> = steps
                .iter()
                .filter(|p| is_group(p) && part_of(p, &number))
                .collect();
            group_order(&mut groups, None);
            for p in groups {
                print_one(store, p, None, depth + 1, color, detail, out).await;
                loop_parts(store, &steps, &key(p), depth + 2, color, detail, out).await;
            }
        }
    })
}

/// The turns, tool calls and approvals of the loop of step `owner`, in the loop's order; a
/// call is named by its tool, as the turn that made it says.
fn loop_parts<'a, S: Store>(
    store: &'a S,
    steps: &'a [StepRecord],
    owner: &'a str,
    depth: usize,
    color: bool,
    detail: Option<&'a Detail<'a>>,
    out: &'a mut String,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
    Box::pin(async move {
        let mut parts: Vec<&StepRecord> = steps
            .iter()
            .filter(|p| p.is_loop_part() && loop_owner(&p.number) == owner)
            .collect();
        parts.sort_by_key(|p| loop_order(&p.number));
        for p in parts {
            let tool = (p.kind == "tool").then(|| tool_name(&p.number, steps)).flatten();
            print_one(store, p, tool, depth, color, detail, out).await;
        }
    })
}

fn print_one<'a, S: Store>(
    store: &'a S,
    s: &'a StepRecord,
    tool: Option<&'a str>,
    depth: usize,
    color: bool,
    detail: Option<&'a Detail<'a>>,
    out: &'a mut String,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
    Box::pin(async move {
        let _ = writeln!(out, "{}{}", "  ".repeat(depth), line(s, tool, color));
        llm_notes(s, &"  ".repeat(depth + 1), out);
        if s.kind == "approval" {
            approval(s, detail, &"  ".repeat(depth + 1), out);
        }
        if let Some(detail) = detail {
            if question::asks(s) {
                question(s, detail, &"  ".repeat(depth + 1), out);
            }
            transcript(s, detail, &"  ".repeat(depth + 1), out);
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
            // A turn's line has its tokens and cost already.
            if s.kind != "turn"
                && (!s.usage.cost_usd.is_zero() || s.usage.input_tokens > 0 || s.usage.cost_unknown_calls > 0)
            {
                let _ = writeln!(
                    out,
                    "{}  tokens {} in, {} out · {}{}",
                    "  ".repeat(depth),
                    s.usage.input_tokens,
                    s.usage.output_tokens,
                    s.usage.cost_usd,
                    fmt_unknown(s.usage.cost_unknown_calls)
                );
            }
        }
        // A failed tool call: what the model was told (it names the error).
        let told = (s.kind == "tool")
            .then(|| s.answers.as_ref()?.get("told")?.as_str())
            .flatten();
        if let Some(told) = told {
            let _ = writeln!(
                out,
                "{}  told the model: {}",
                "  ".repeat(depth),
                capped(told, 300)
            );
        } else if let Some(e) = &s.error {
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

/// The question of an `interrupt` step or an approval that stopped its run, under it
/// ([`question::question`]): and, for the one the tree waits at, the command that answers it.
fn question(s: &StepRecord, detail: &Detail<'_>, pad: &str, out: &mut String) {
    let command = match &detail.answer {
        Some((w, command)) if w.run_id == s.run_id && w.step.number == s.number => Some(command.as_str()),
        _ => None,
    };
    print_lines(&question::question(s, detail.now_ms, command), pad, out);
}

/// `label: text` lines, a text's later lines under its first, a command in backticks.
fn print_lines(lines: &[question::Line], pad: &str, out: &mut String) {
    for l in lines {
        let under = format!("\n{pad}{}", " ".repeat(l.label.chars().count() + 2));
        let text = l.text.replace('\n', &under);
        if l.command {
            let _ = writeln!(out, "{pad}{}: `{text}`", l.label);
        } else {
            let _ = writeln!(out, "{pad}{}: {text}", l.label);
        }
    }
}

/// An agent loop's approval part: the calls it holds (proposed, or decided on), and the
/// decision once given; while it waits, with `runs show`, the question and how to answer.
fn approval(s: &StepRecord, detail: Option<&Detail<'_>>, pad: &str, out: &mut String) {
    if s.status == StepStatus::Interrupted {
        // With `runs show`, the question (which lists the calls) says it all.
        if detail.is_none() {
            proposed(s.result.as_deref().and_then(|r| r.get("calls")), pad, out);
        }
        return;
    }
    proposed(s.input.as_ref(), pad, out);
    if let Some(d) = s.result.as_deref() {
        let _ = writeln!(out, "{pad}decision: {d}");
    }
}

/// `call 1: refund {"amount":100}`, one line per call an approval holds.
fn proposed(calls: Option<&Value>, pad: &str, out: &mut String) {
    print_lines(&question::calls(calls), pad, out);
}

/// The messages of the agent loop a record ran: a step's, or an iteration's or a branch's
/// (whose loops keep their transcripts on their own records).
pub fn loop_transcript(s: &StepRecord) -> Option<&Vec<Value>> {
    s.answers
        .as_ref()
        .filter(|_| matches!(s.kind.as_str(), "agent" | "iteration" | "branch"))
        .and_then(|a| a.get("transcript"))
        .and_then(Value::as_array)
}

/// The transcript an agent loop's step, iteration or branch keeps, with `runs show
/// --transcript`: headed by the record's number and step, one line per message, each
/// capped; otherwise a line saying how to see it.
fn transcript(s: &StepRecord, detail: &Detail<'_>, pad: &str, out: &mut String) {
    let Some(messages) = loop_transcript(s) else {
        return;
    };
    if !detail.transcript {
        let _ = writeln!(
            out,
            "{pad}transcript: {} messages (`runs show --transcript` prints them)",
            messages.len()
        );
        return;
    }
    let _ = writeln!(
        out,
        "{pad}transcript of {} {} ({} messages):",
        s.key(),
        s.step,
        messages.len()
    );
    for m in messages {
        let role = m["role"].as_str().unwrap_or("?");
        let mut text = match &m["content"] {
            Value::String(c) => c.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        if role == "tool" {
            text = format!("[{}] {text}", m["tool_call_id"].as_str().unwrap_or("?"));
        }
        for c in m
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !text.is_empty() {
                text.push(' ');
            }
            let _ = write!(
                text,
                "→ {}({}) [{}]",
                c.pointer("/function/name").and_then(Value::as_str).unwrap_or("?"),
                c.pointer("/function/arguments")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
                c["id"].as_str().unwrap_or("?")
            );
        }
        let _ = writeln!(out, "{pad}  {role}: {}", capped(&text, detail.message_cap));
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

fn line(s: &StepRecord, tool: Option<&str>, color: bool) -> String {
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
        ("turn", _) => format!("{mark} {} turn {}ms", s.number, ms),
        ("approval", _) => format!("{mark} {} approval {}ms", s.number, ms),
        ("tool", _) => format!("{mark} {} {} [tool] {}ms", s.number, tool.unwrap_or("?"), ms),
        _ => format!("{mark} {} {} [{}] {}ms", s.number, s.step, s.kind, ms),
    };
    if s.attempt > 1 {
        let _ = write!(l, " · {} attempts", s.attempt);
    }
    if let Some(n) = s.iterations {
        let _ = write!(l, " · {n} iterations");
    }
    if let Some(a) = s
        .answers
        .as_ref()
        .filter(|_| matches!(s.kind.as_str(), "agent" | "iteration" | "branch"))
        && let Some(turns) = a.get("turns").and_then(Value::as_u64)
    {
        let calls = a.get("tool_calls").and_then(Value::as_u64).unwrap_or(0);
        let s = |n: u64| if n == 1 { "" } else { "s" };
        let _ = write!(l, " · {turns} turn{}, {calls} tool call{}", s(turns), s(calls));
        if let Some(f) = a.get("tool_failures").and_then(Value::as_u64) {
            let _ = write!(l, " ({f} failed)");
        }
    }
    l.push_str(&usage(&s.usage));
    if s.kind == "turn"
        && let Some(m) = s.result.as_deref()
    {
        let calls: Vec<&str> = m
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(|c| {
                c.iter()
                    .filter_map(|c| c.pointer("/function/name")?.as_str())
                    .collect()
            })
            .unwrap_or_default();
        if calls.is_empty() {
            l.push_str(" → answer");
        } else {
            let _ = write!(l, " → calls {}", calls.join(", "));
        }
    }
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

/// ` · 120 tokens (100 in, 20 out) · $0.0001`, or nothing when no tokens were used.
fn usage(u: &Usage) -> String {
    if u.input_tokens + u.output_tokens == 0 && u.cost_usd.is_zero() && u.cost_unknown_calls == 0 {
        return String::new();
    }
    format!(
        " · {} tokens ({} in, {} out) · {}{}",
        u.input_tokens + u.output_tokens,
        u.input_tokens,
        u.output_tokens,
        u.cost_usd,
        fmt_unknown(u.cost_unknown_calls)
    )
}
