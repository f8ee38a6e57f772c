//! `mcp_servers:` (SPEC §6.4): how each server is reached (a program over stdio, or a URL),
//! its allowlist of tools and what it says about them. The problems of one definition are
//! found here: a server reached both ways or neither, an empty command, a URL that is not
//! `http(s)`, a secret where it would be shown, entries outside the allowlist.

use indexmap::IndexMap;

use super::cx::Cx;
use super::read::{
    check_ident, check_keys, duration, enum_, map, named, size, string, string_list, string_map,
};
use crate::diag::{Diagnostic, codes};
use crate::model::*;
use crate::syntax::{Key, Node, Value};

pub(super) fn mcp_servers(cx: &mut Cx, node: &Node) -> IndexMap<String, McpServer> {
    named(cx, node, "`mcp_servers`", |cx, k, v| {
        check_ident(cx, "MCP server", k);
        server(cx, k, v)
    })
}

const SERVER_KEYS: &[&str] = &[
    "command",
    "url",
    "env",
    "headers",
    "tools",
    "approve",
    "no_approval",
    "trust",
    "idempotent",
    "timeout",
    "max_time",
    "max_result_bytes",
];

fn server(cx: &mut Cx, key: &Key, node: &Node) -> Option<McpServer> {
    let m = map(cx, node, "an MCP server")?;
    check_keys(cx, m, "an MCP server", SERVER_KEYS);
    let name = Sp::new(key.name.clone(), key.span);
    let command = node.get("command").map(|n| command(cx, n)).unwrap_or_default();
    let url = node.get("url").and_then(|n| string(cx, n));
    match (node.get("command"), node.get("url")) {
        (None, None) => cx.push(
            Diagnostic::new(
                &codes::MISSING_KEY,
                key.span,
                format!("MCP server `{}` has neither `command` nor `url`", key.name),
            )
            .label("no way to reach it")
            .help("add `command: [program, args...]` (stdio) or `url: http://127.0.0.1:8931/mcp`"),
        ),
        (Some(_), Some(u)) => cx.push(
            Diagnostic::new(
                &codes::INVALID_VALUE,
                u.span,
                format!("MCP server `{}` has both `command` and `url`", key.name),
            )
            .label("a second way to reach it")
            .help("keep `command` for a server started over stdio, or `url` for one over HTTP"),
        ),
        _ => {}
    }
    if let Some(u) = &url {
        check_url(cx, u);
    }
    for part in command.iter().chain(&url) {
        secret_in_target(cx, &key.name, part);
    }
    let env = node
        .get("env")
        .map(|n| string_map(cx, n, "`env`"))
        .unwrap_or_default();
    let headers = node
        .get("headers")
        .map(|n| string_map(cx, n, "`headers`"))
        .unwrap_or_default();
    if let (Some(n), Some(_)) = (node.get("env"), &url) {
        misplaced(cx, n, "`env` is for a server started with `command`");
    }
    if let (Some(n), Some(_)) = (node.get("headers"), node.get("command")) {
        misplaced(cx, n, "`headers` are for a server reached by `url`");
    }
    let tools = match node.get("tools") {
        Some(n) => allowlist(cx, n),
        None => {
            cx.push(
                Diagnostic::new(
                    &codes::MISSING_KEY,
                    key.span,
                    format!("MCP server `{}` has no `tools:` allowlist", key.name),
                )
                .label("`tools` missing")
                .help(
                    "name the tools a flow may call, `tools: [git_log]`, or write `tools: [\"*\"]` for all",
                ),
            );
            Vec::new()
        }
    };
    let server = McpServer {
        name,
        command,
        url,
        env,
        headers,
        tools,
        approve: node
            .get("approve")
            .map(|n| string_list(cx, n))
            .unwrap_or_default(),
        no_approval: node
            .get("no_approval")
            .map(|n| string_list(cx, n))
            .unwrap_or_default(),
        trust: node.get("trust").and_then(|n| {
            enum_(
                cx,
                n,
                "trust",
                &[("trusted", Trust::Trusted), ("untrusted", Trust::Untrusted)],
            )
        }),
        idempotent: node
            .get("idempotent")
            .map(|n| string_list(cx, n))
            .unwrap_or_default(),
        timeout: node.get("timeout").and_then(|n| duration(cx, n)),
        max_time: node.get("max_time").and_then(|n| duration(cx, n)),
        max_result_bytes: node.get("max_result_bytes").and_then(|n| size(cx, n)),
        span: node.span,
    };
    if node.get("tools").is_some() {
        for (field, list) in [
            ("approve", &server.approve),
            ("no_approval", &server.no_approval),
            ("idempotent", &server.idempotent),
        ] {
            for entry in list {
                if !server.allows(&entry.value) {
                    cx.push(not_allowed(&server, entry, field));
                }
            }
        }
    }
    Some(server)
}

/// A tool named by `field` (`approve`, `tool`, ...) that the server's allowlist leaves out.
pub fn not_allowed(server: &McpServer, tool: &Sp<String>, field: &str) -> Diagnostic {
    let allowed = server
        .tools
        .iter()
        .map(|t| format!("`{}`", t.value))
        .collect::<Vec<_>>()
        .join(", ");
    Diagnostic::new(
        &codes::MCP_TOOL_NOT_ALLOWED,
        tool.span,
        format!(
            "`{}` in `{field}` is not in the `tools:` of MCP server `{}`",
            tool.value, server.name.value
        ),
    )
    .label("not in the allowlist")
    .help(format!(
        "the server allows: {allowed}; add it to `tools:` to allow it"
    ))
}

fn command(cx: &mut Cx, node: &Node) -> Vec<Sp<String>> {
    if let Value::Str(_) = &node.value {
        cx.push(
            Diagnostic::new(
                &codes::INVALID_TYPE,
                node.span,
                "`command` is a list of arguments, not a command line",
            )
            .label("a string")
            .help("write the program and each argument as list items: `command: [uvx, mcp-server-git]`; servers never start through a shell"),
        );
        return Vec::new();
    }
    let argv = string_list(cx, node);
    if node.as_seq().is_some_and(|s| s.is_empty()) {
        cx.push(
            Diagnostic::new(&codes::INVALID_VALUE, node.span, "`command` is empty")
                .help("name the program that serves MCP over stdio"),
        );
    }
    argv
}

fn check_url(cx: &mut Cx, url: &Sp<String>) {
    let rest = url
        .value
        .strip_prefix("http://")
        .or_else(|| url.value.strip_prefix("https://"));
    let host = rest.map(|r| r.split(['/', '?', '#']).next().unwrap_or_default());
    let ok = host.is_some_and(|h| !h.is_empty() && !h.starts_with(':'))
        && !url.value.chars().any(char::is_whitespace);
    if !ok {
        cx.push(
            Diagnostic::new(
                &codes::INVALID_VALUE,
                url.span,
                format!("`{}` is not an http(s) URL", url.value),
            )
            .label("not a URL")
            .help("write the server's Streamable HTTP endpoint: `url: http://127.0.0.1:8931/mcp`"),
        );
    }
}

fn secret_in_target(cx: &mut Cx, server: &str, part: &Sp<String>) {
    if part.value.contains("${env:") {
        cx.push(
            Diagnostic::new(
                &codes::SECRET_IN_MCP_TARGET,
                part.span,
                format!("a secret in the `url` or `command` of MCP server `{server}`"),
            )
            .label("would be shown wherever the server is named")
            .help("pass secrets in `env:` (stdio) or `headers:` (HTTP), whose values are never shown"),
        );
    }
}

fn misplaced(cx: &mut Cx, node: &Node, why: &str) {
    cx.push(
        Diagnostic::new(&codes::INVALID_VALUE, node.span, why.to_string()).label("not used by this server"),
    );
}

fn allowlist(cx: &mut Cx, node: &Node) -> Vec<Sp<String>> {
    let tools = string_list(cx, node);
    if node.as_seq().is_some_and(|s| s.is_empty()) {
        cx.push(
            Diagnostic::new(
                &codes::INVALID_VALUE,
                node.span,
                "`tools` is empty: no tool may be called",
            )
            .help("name the tools a flow may call, or write `tools: [\"*\"]` for all"),
        );
    }
    tools
}
