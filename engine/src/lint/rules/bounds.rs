//! Loops without a bound (SY301) and limits, counts and bounds outside their range (SY302).

use crate::diag::{Diagnostic, codes};
use crate::lint::FlowCx;
use crate::model::{Agent, AgentRef, AgentSpec, MessageMode, Retry, Size, Sp, StepKind};

/// `max_iterations` range (SPEC §3.3), of a `while` loop and of an agent loop.
pub const MAX_ITERATIONS: u64 = 100_000;
/// The deepest `limits.max_depth` accepted.
pub const MAX_DEPTH: u64 = 32;
/// The most `retry.attempts` accepted.
pub const MAX_ATTEMPTS: u64 = 100;
/// The largest `foreach` `max_items` accepted.
pub const MAX_ITEMS: u64 = 10_000_000;

fn range(out: &mut Vec<Diagnostic>, v: &Sp<u64>, what: &str, lo: u64, hi: u64) {
    if v.value < lo || v.value > hi {
        out.push(
            Diagnostic::new(
                &codes::LIMIT_OUT_OF_RANGE,
                v.span,
                format!("`{what}` is {}, outside {lo}..={hi}", v.value),
            )
            .label("out of range")
            .help(format!("`{what}` must be between {lo} and {hi}")),
        );
    }
}

fn range_f(out: &mut Vec<Diagnostic>, v: &Sp<f64>, what: &str, lo: f64, hi: f64) {
    if v.value < lo || v.value > hi {
        out.push(
            Diagnostic::new(
                &codes::LIMIT_OUT_OF_RANGE,
                v.span,
                format!("`{what}` is {}, outside {lo}..={hi}", v.value),
            )
            .label("out of range")
            .help(format!("`{what}` must be between {lo} and {hi}")),
        );
    }
}

fn retry(out: &mut Vec<Diagnostic>, r: &Retry) {
    if let Some(a) = &r.attempts {
        range(out, a, "retry.attempts", 1, MAX_ATTEMPTS);
    }
    if let Some(f) = &r.factor {
        range_f(out, f, "retry.factor", 1.0, 10.0);
    }
    if let Some(Sp {
        value: crate::model::Jitter::Fraction(j),
        span,
    }) = &r.jitter
    {
        range_f(out, &Sp::new(*j, *span), "retry.jitter", 0.0, 1.0);
    }
    if let (Some(b), Some(m)) = (&r.backoff, &r.max_backoff)
        && m.value.0 < b.value.0
    {
        out.push(
            Diagnostic::new(
                &codes::LIMIT_OUT_OF_RANGE,
                m.span,
                "`max_backoff` is shorter than `backoff`",
            )
            .with_secondary(b.span, "the first wait")
            .help("`max_backoff` caps the growing wait; make it at least `backoff`"),
        );
    }
}

pub fn agent(out: &mut Vec<Diagnostic>, a: &Agent) {
    if let Some(r) = &a.common.retry {
        retry(out, r);
    }
    match &a.spec {
        AgentSpec::Llm(l) => {
            if let Some(t) = &l.temperature {
                range_f(out, t, "temperature", 0.0, 2.0);
            }
            if let Some(m) = &l.max_tokens {
                range(out, m, "max_tokens", 1, 10_000_000);
            }
            if let Some(r) = &l.repair_attempts {
                range(out, r, "repair_attempts", 0, 10);
            }
            if let Some(m) = &l.max_iterations {
                range(out, m, "max_iterations", 1, MAX_ITERATIONS);
            }
            if let Some(m) = &l.max_parallel_tools {
                range(out, m, "max_parallel_tools", 1, 100_000);
            }
            // As `limits.max_file_bytes`: 0 would refuse every attachment.
            if let Some(m) = &l.max_attach_bytes {
                size_range(out, m, "max_attach_bytes", (1, "1 byte"), (16 << 30, "16GiB"));
            }
            let mode = l
                .message_mode
                .as_ref()
                .map(|m| m.value)
                .unwrap_or(MessageMode::None);
            match (&l.max_messages, mode) {
                (Some(m), MessageMode::Bookend) => range(out, m, "max_messages", 3, 100_000),
                (Some(m), _) => range(out, m, "max_messages", 1, 100_000),
                (None, MessageMode::Latest | MessageMode::Bookend) => out.push(
                    Diagnostic::new(
                        &codes::MISSING_KEY,
                        l.message_mode.as_ref().expect("set").span,
                        "`latest` and `bookend` need `max_messages`",
                    )
                    .help("add `max_messages: 10`"),
                ),
                _ => {}
            }
        }
        AgentSpec::Mock(m) => {
            if let Some(r) = &m.fail_rate {
                range_f(out, r, "fail_rate", 0.0, 1.0);
            }
        }
        _ => {}
    }
}

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    let flow = cx.flow;
    if let Some(l) = &flow.limits {
        if let Some(v) = &l.max_steps {
            range(out, v, "limits.max_steps", 1, 100_000_000);
        }
        if let Some(v) = &l.max_depth {
            range(out, v, "limits.max_depth", 0, MAX_DEPTH);
        }
        if let Some(v) = &l.max_payload_bytes
            && (v.value.0 < 1024 || v.value.0 > 1 << 30)
        {
            out.push(
                Diagnostic::new(
                    &codes::LIMIT_OUT_OF_RANGE,
                    v.span,
                    format!(
                        "`limits.max_payload_bytes` is {} bytes, outside 1KiB..=1GiB",
                        v.value.0
                    ),
                )
                .label("out of range"),
            );
        }
        if let Some(v) = &l.max_file_bytes {
            size_range(
                out,
                v,
                "limits.max_file_bytes",
                (1, "1 byte"),
                (16 << 30, "16GiB"),
            );
        }
        if let Some(v) = &l.max_run_file_bytes {
            size_range(
                out,
                v,
                "limits.max_run_file_bytes",
                (1, "1 byte"),
                (1 << 40, "1TiB"),
            );
        }
        if let Some(v) = &l.max_cost_usd {
            range_f(out, v, "limits.max_cost_usd", 0.0, 1e9);
        }
        if let Some(t) = &l.timeout
            && t.value.0.is_zero()
        {
            out.push(
                Diagnostic::new(&codes::LIMIT_OUT_OF_RANGE, t.span, "`limits.timeout` is zero")
                    .label("out of range"),
            );
        }
    }
    if let Some(d) = &flow.defaults
        && let Some(r) = &d.retry
    {
        retry(out, r);
    }
    for p in flow.providers.values() {
        if let Some(m) = &p.max_concurrency {
            range(out, m, "max_concurrency", 1, 100_000);
        }
        // A negative price would count calls as paying back.
        for price in p.prices.values() {
            range_f(out, &price.input_per_mtok, "input_per_mtok", 0.0, 1e6);
            range_f(out, &price.output_per_mtok, "output_per_mtok", 0.0, 1e6);
        }
        if let Some(t) = &p.assume_tokens_per_call {
            range(out, t, "assume_tokens_per_call", 1, u64::MAX);
        }
        if let Some(r) = &p.rate_limit {
            for v in [&r.requests_per_minute, &r.tokens_per_minute]
                .into_iter()
                .flatten()
            {
                range(out, v, "rate_limit", 1, u64::MAX);
            }
        }
    }
    for a in flow.agents.values() {
        agent(out, a);
    }
    for step in flow.steps.values() {
        if let Some(r) = &step.retry {
            retry(out, r);
        }
        if let Some(t) = &step.timeout
            && t.value.0.is_zero()
        {
            out.push(
                Diagnostic::new(&codes::LIMIT_OUT_OF_RANGE, t.span, "`timeout` is zero")
                    .label("out of range"),
            );
        }
        match &step.kind {
            StepKind::Agent(AgentRef::Inline(a)) => agent(out, a),
            StepKind::Parallel(branches) => {
                for b in branches.values() {
                    if let AgentRef::Inline(a) = &b.agent {
                        agent(out, a);
                    }
                    if let Some(r) = &b.retry {
                        retry(out, r);
                    }
                }
            }
            _ => {}
        }
        let l = &step.looping;
        if let Some(w) = &l.while_ {
            match &l.max_iterations {
                None if l.max_iterations_written => {}
                None => out.push(
                    Diagnostic::new(&codes::WHILE_WITHOUT_BOUND, w.span, format!("`while` loop `{}` has no `max_iterations`", step.id.value))
                        .label("unbounded loop")
                        .help("add `max_iterations: N` (1..=100000); reaching it while the condition holds fails the step with kind `limit`"),
                ),
                Some(m) => range(out, m, "max_iterations", 1, MAX_ITERATIONS),
            }
        }
        if let Some(c) = &step.concurrency {
            range(out, c, "concurrency", 1, 100_000);
        }
        if let Some(m) = &l.max_items {
            range(out, m, "max_items", 1, MAX_ITEMS);
        }
    }
}

/// A size limit outside `lo..=hi` (each a number of bytes and how it is written).
fn size_range(out: &mut Vec<Diagnostic>, v: &Sp<Size>, what: &str, lo: (u64, &str), hi: (u64, &str)) {
    if v.value.0 < lo.0 || v.value.0 > hi.0 {
        out.push(
            Diagnostic::new(
                &codes::LIMIT_OUT_OF_RANGE,
                v.span,
                format!("`{what}` is {} bytes, outside {}..={}", v.value.0, lo.1, hi.1),
            )
            .label("out of range"),
        );
    }
}
