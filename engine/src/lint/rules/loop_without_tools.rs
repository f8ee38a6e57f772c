//! Agent loop settings on an `llm` agent without `tools:` (SY508, a warning): they do
//! nothing there.

use crate::diag::{Diagnostic, codes};
use crate::model::{Agent, AgentSpec};
use crate::source::Span;

/// Checks one agent. `text` is the file its spans point into, to find the keys.
pub fn agent(out: &mut Vec<Diagnostic>, a: &Agent, text: &str) {
    let AgentSpec::Llm(l) = &a.spec else { return };
    if !l.tools.list.is_empty() {
        return;
    }
    // `tools` written as something else than an empty list or map has its own error.
    let written_empty = l.tools.span.map(|s| {
        let v: String = text
            .get(s.start as usize..s.end as usize)
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        v == "[]" || v == "{}"
    });
    if written_empty == Some(false) {
        return;
    }
    let written = [
        ("max_iterations", l.max_iterations.as_ref().map(|m| m.span)),
        (
            "max_parallel_tools",
            l.max_parallel_tools.as_ref().map(|m| m.span),
        ),
        ("until_tool", l.until_tool.as_ref().map(|u| u.span)),
        ("approve", l.approve.first().map(|e| e.span)),
        ("approve_expires", l.approve_expires.as_ref().map(|d| d.span)),
        ("on_expire", l.on_expire.as_ref().map(|o| o.span)),
    ];
    let empty = if l.tools.span.is_some() {
        "an empty `tools`"
    } else {
        "no `tools`"
    };
    for (key, value) in written {
        let Some(value) = value else { continue };
        out.push(
            Diagnostic::new(
                &codes::LOOP_SETTING_WITHOUT_TOOLS,
                key_before(text, value, key).unwrap_or(value),
                format!("`{key}` does nothing: `{}` has {empty}", a.name.value),
            )
            .label("ignored")
            .help(format!(
                "an `llm` agent is an agent loop only with `tools:` (the agents it may call); add them, or remove `{key}`"
            )),
        );
    }
}

/// The span of `key` written as the key of the value at `value`: the last `key` before it
/// followed by nothing but a colon, quotes, blanks and comments (and, for a list, its
/// opening). A `key` inside a comment in between is not it.
pub(super) fn key_before(text: &str, value: Span, key: &str) -> Option<Span> {
    let before = text.get(..value.start as usize)?;
    let (at, _) = before
        .rmatch_indices(key)
        .find(|(at, _)| only_a_colon(&before[at + key.len()..]))?;
    Some(Span::new(value.file, at, at + key.len()))
}

/// Whether `between` (a key's end to its value's start) holds a colon and otherwise only
/// quotes, blanks, a list's opening and comments.
fn only_a_colon(between: &str) -> bool {
    let mut colon = false;
    for line in between.split('\n') {
        let code = line.split_once('#').map_or(line, |(code, _)| code);
        for c in code.chars() {
            match c {
                ':' => colon = true,
                '"' | '\'' | '[' | '-' => {}
                c if c.is_whitespace() => {}
                _ => return false,
            }
        }
    }
    colon
}
