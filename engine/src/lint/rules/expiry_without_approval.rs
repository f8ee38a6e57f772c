//! An agent loop's approval expiry that does nothing (SY515, a warning): `approve_expires` or
//! `on_expire` on a loop none of whose calls ever waits for a human (no `approve:`, and no MCP
//! server among its tools that can ask: one with `approve:` or `trust: trusted`), and
//! `on_expire` without `approve_expires`, where approvals wait until answered. A loop without
//! `tools` is `loop_without_tools`' to report.

use super::loop_without_tools::key_before;
use crate::diag::{Diagnostic, codes};
use crate::model::{Agent, AgentSpec, McpServer, Trust};
use crate::source::Span;

/// Checks one agent. `text` is the file its spans point into, to find the keys; `server`
/// finds an MCP server visible where the agent is defined.
pub fn agent<'a>(
    out: &mut Vec<Diagnostic>,
    a: &Agent,
    text: &str,
    server: impl Fn(&str) -> Option<&'a McpServer>,
) {
    let AgentSpec::Llm(l) = &a.spec else { return };
    if l.tools.list.is_empty() || (l.approve_expires.is_none() && l.on_expire.is_none()) {
        return;
    }
    let key = |key: &str, value: Span| key_before(text, value, key).unwrap_or(value);
    let asks = !l.approve.is_empty()
        || l.tools.list.iter().any(|t| {
            let name = t.name.value.as_str();
            let s = name.split_once('.').map_or(name, |(s, _)| s);
            server(s).is_some_and(|s| {
                !s.approve.is_empty() || s.trust.as_ref().is_some_and(|t| t.value == Trust::Trusted)
            })
        });
    if !asks {
        let written = [
            ("approve_expires", l.approve_expires.as_ref().map(|d| d.span)),
            ("on_expire", l.on_expire.as_ref().map(|o| o.span)),
        ];
        for (k, value) in written {
            let Some(value) = value else { continue };
            out.push(
                Diagnostic::new(
                    &codes::EXPIRY_WITHOUT_APPROVAL,
                    key(k, value),
                    format!(
                        "`{k}` does nothing: agent loop `{}` asks for no approval",
                        a.name.value
                    ),
                )
                .label("ignored")
                .help(format!(
                    "list the tools whose calls wait for a human in `approve:`, or remove `{k}`"
                )),
            );
        }
        return;
    }
    if let (Some(o), None) = (&l.on_expire, &l.approve_expires) {
        out.push(
            Diagnostic::new(
                &codes::EXPIRY_WITHOUT_APPROVAL,
                key("on_expire", o.span),
                format!(
                    "`on_expire` does nothing: the approvals of `{}` never expire without `approve_expires`",
                    a.name.value
                ),
            )
            .label("ignored")
            .help("add `approve_expires:` (how long an approval waits, e.g. `72h`), or remove `on_expire`"),
        );
    }
}
