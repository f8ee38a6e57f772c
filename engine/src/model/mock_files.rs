//! Files in mock results (SPEC §11): inside a mock's `returns` or `sequence`, a mapping whose
//! only key is `file` and whose `file` is a mapping is a file the mock makes when called:
//!
//! ```yaml
//! returns: {scan: {file: {text: "hello", name: a.txt, media_type: text/plain}}}
//! sequence: [{file: {path: fixtures/x.png}}]      # relative to the flow file
//! ```
//!
//! A real reference's `file` is a string (`"sha256:…"`), so the two never mix. Finding them
//! and checking their shape is here; the loader resolves `path` (`SY209`, `SY210`), the mock
//! agent stores them.

use crate::diag::{Diagnostic, codes};
use crate::syntax::{Node, Value};

/// The keys of a mock file.
pub const KEYS: [&str; 4] = ["text", "path", "name", "media_type"];

/// The mock files under `node`: each the mapping under its `file` key, in document order.
pub fn specs<'n>(node: &'n Node, out: &mut Vec<&'n Node>) {
    match &node.value {
        Value::Map(m) => {
            if let [(k, spec)] = m.as_slice()
                && k.name == "file"
                && spec.as_map().is_some()
            {
                out.push(spec);
                return;
            }
            for (_, v) in m {
                specs(v, out);
            }
        }
        Value::Seq(s) => s.iter().for_each(|v| specs(v, out)),
        _ => {}
    }
}

/// The mock files of a mock's `returns` and `sequence`.
pub fn of_mock(m: &super::MockAgent) -> Vec<&Node> {
    let mut out = Vec::new();
    for r in m.returns.iter().chain(m.sequence.iter().flatten()) {
        specs(&r.0, &mut out);
    }
    out
}

/// The literal `path` of a mock file, if it has one.
pub fn path(spec: &Node) -> Option<crate::model::Sp<String>> {
    let p = spec.get("path")?;
    Some(crate::model::Sp::new(p.as_str()?.to_string(), p.span))
}

/// Problems with the shape of a mock file: unknown keys (`SY103`), values that are not
/// strings (`SY104`), neither or both of `text` and `path`, `text` without `name` (`SY105`).
pub fn check(spec: &Node, out: &mut Vec<Diagnostic>) {
    let Some(map) = spec.as_map() else { return };
    for (k, v) in map {
        if !KEYS.contains(&k.name.as_str()) {
            out.push(
                Diagnostic::new(
                    &codes::UNKNOWN_KEY,
                    k.span,
                    format!("unknown key `{}` in a mock file", k.name),
                )
                .help("valid fields are: text, path, name, media_type"),
            );
        } else if v.as_str().is_none() {
            out.push(Diagnostic::new(
                &codes::INVALID_TYPE,
                v.span,
                format!("a mock file's `{}` is a string, not {}", k.name, v.type_name()),
            ));
        }
    }
    match (spec.get("text"), spec.get("path")) {
        (None, None) => out.push(
            Diagnostic::new(
                &codes::MISSING_KEY,
                spec.span,
                "a mock file needs `text` or `path`",
            )
            .help("`{file: {text: \"...\", name: a.txt}}` or `{file: {path: fixtures/a.png}}`"),
        ),
        (Some(_), Some(p)) => out.push(
            Diagnostic::new(
                &codes::INVALID_VALUE,
                p.span,
                "a mock file has `text` or `path`, not both",
            )
            .label("remove one"),
        ),
        (Some(_), None) if spec.get("name").is_none() => out.push(
            Diagnostic::new(
                &codes::MISSING_KEY,
                spec.span,
                "a mock file with `text` needs a `name`",
            )
            .help("`{file: {text: \"...\", name: a.txt}}`"),
        ),
        _ => {}
    }
}
