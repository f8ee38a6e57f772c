//! A flow's `tests:`: input, context, a pinned `now`, mocks and what the run must do.

use super::agents::{MOCK_KEYS, mock};
use super::cx::Cx;
use super::read::{any, check_keys, enum_, map, named, string, string_list, u64_};
use crate::diag::{Diagnostic, codes};
use crate::model::*;
use crate::syntax::Node;

pub(super) fn flow_test(cx: &mut Cx, node: &Node) -> Option<FlowTest> {
    let m = map(cx, node, "a test")?;
    check_keys(
        cx,
        m,
        "a test",
        &["name", "input", "context", "now", "mocks", "expect"],
    );
    let name = match node.get("name") {
        Some(n) => string(cx, n)?,
        None => {
            cx.push(
                Diagnostic::new(&codes::MISSING_KEY, node.span, "test without `name`")
                    .label("missing `name`"),
            );
            return None;
        }
    };
    let mocks = node
        .get("mocks")
        .map(|n| {
            named(cx, n, "`mocks`", |cx, k, v| {
                let mm = map(cx, v, &format!("mock `{}`", k.name))?;
                check_keys(cx, mm, "a mock", MOCK_KEYS);
                mock(cx, v, k.span)
            })
        })
        .unwrap_or_default();
    let expect = match node.get("expect") {
        Some(n) => expect(cx, n)?,
        None => {
            cx.push(
                Diagnostic::new(
                    &codes::MISSING_KEY,
                    name.span,
                    format!("test `{}` has no `expect`", name.value),
                )
                .help("say what the run must do: `expect: {status: succeeded}`"),
            );
            return None;
        }
    };
    Some(FlowTest {
        name,
        input: node.get("input").map(any),
        context: node.get("context").map(any),
        now: node.get("now").and_then(|n| now(cx, n)),
        mocks,
        expect,
        span: node.span,
    })
}

/// A test's `now`: an RFC 3339 timestamp the store can record as it is (to the microsecond).
fn now(cx: &mut Cx, node: &Node) -> Option<Sp<crate::expr::time::Timestamp>> {
    let text = string(cx, node)?;
    match parse_now(&text.value) {
        Ok(t) => Some(Sp::new(t, text.span)),
        Err(why) => {
            cx.push(
                Diagnostic::new(&codes::INVALID_VALUE, text.span, format!("invalid `now`: {why}"))
                    .label("not a timestamp the run can take")
                    .help("`now` is an RFC 3339 timestamp: `now: \"2026-03-01T09:00:00Z\"`"),
            );
            None
        }
    }
}

/// Parses a pinned `now` (a test's `now:`, `--now`): RFC 3339 as CEL's `timestamp()` takes
/// it, with no digit past the microsecond, since the run records `now` to the microsecond and
/// a resumed run must see what the first start saw.
pub fn parse_now(text: &str) -> Result<crate::expr::time::Timestamp, String> {
    use crate::expr::time::Timestamp;
    let t = Timestamp::parse(text).map_err(|e| e.to_string())?;
    if Timestamp::from_unix_micros(t.unix_micros()) != Some(t) {
        return Err(format!(
            "`{text}` is finer than a microsecond, and a run records `now` to the microsecond"
        ));
    }
    Ok(t)
}

fn expect(cx: &mut Cx, node: &Node) -> Option<Expect> {
    let m = map(cx, node, "`expect`")?;
    check_keys(cx, m, "`expect`", &["status", "path", "output", "error", "calls"]);
    Some(Expect {
        status: node.get("status").and_then(|n| {
            enum_(
                cx,
                n,
                "status",
                &[
                    ("succeeded", RunStatusExpect::Succeeded),
                    ("failed", RunStatusExpect::Failed),
                    ("interrupted", RunStatusExpect::Interrupted),
                ],
            )
        }),
        path: node.get("path").map(|n| string_list(cx, n)),
        output: node.get("output").map(any),
        error: node.get("error").map(any),
        calls: node
            .get("calls")
            .map(|n| named(cx, n, "`calls`", |cx, _, v| u64_(cx, v)))
            .unwrap_or_default(),
    })
}
