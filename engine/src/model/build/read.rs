//! The generic readers every part of a flow is lowered with: a node as a string, a list, a
//! number, a boolean, a duration, a size, one of a set of names, a schema, a map of named
//! entries, a mapping with its keys checked; and identifiers (step, agent, provider and
//! branch names), with the fix a bad one is given.

use std::time::Duration;

use indexmap::IndexMap;

use super::cx::Cx;
use crate::diag::{Diagnostic, codes, did_you_mean};
use crate::model::*;
use crate::syntax::{Key, Node, Value};

/// [`is_ident`] as a regular expression, for the JSON Schema.
pub const IDENT_PATTERN: &str = "^[a-z][a-z0-9_]*$";

/// Whether `s` is a step or agent identifier: `[a-z][a-z0-9_]*`.
pub fn is_ident(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

pub(super) fn suggest_ident(s: &str, allow_hyphen: bool) -> String {
    let mut out: String = s
        .chars()
        .map(|c| match c {
            'A'..='Z' => c.to_ascii_lowercase(),
            'a'..='z' | '0'..='9' | '_' => c,
            '-' if allow_hyphen => '-',
            _ => '_',
        })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_lowercase()) {
        out.insert(0, 'x');
        out.insert(1, '_');
    }
    out
}

/// Checks a step, agent, provider or branch name.
pub(super) fn check_ident(cx: &mut Cx, what: &str, key: &Key) {
    if key.name == "end" && what == "step" {
        cx.push(
            Diagnostic::new(
                &codes::RESERVED_IDENTIFIER,
                key.span,
                "`end` is reserved and cannot be a step id",
            )
            .label("reserved")
            .help("`to: end` finishes the run; name this step something else, e.g. `finish`"),
        );
    } else if !is_ident(&key.name) {
        let fix = suggest_ident(&key.name, false);
        let why = if key.name.contains('-') {
            "a hyphen would read as subtraction in expressions".to_string()
        } else {
            "identifiers are `[a-z][a-z0-9_]*`".to_string()
        };
        cx.push(
            Diagnostic::new(
                &codes::INVALID_IDENTIFIER,
                key.span,
                format!("invalid {what} id `{}`", key.name),
            )
            .label(why)
            .help(format!("rename it to `{fix}`")),
        );
    }
}

pub(super) fn type_error(cx: &mut Cx, node: &Node, expected: &str) {
    cx.push(
        Diagnostic::new(
            &codes::INVALID_TYPE,
            node.span,
            format!("expected {expected}, found {}", node.type_name()),
        )
        .label(format!("expected {expected}")),
    );
}

pub(super) fn map<'n>(cx: &mut Cx, node: &'n Node, what: &str) -> Option<&'n [(Key, Node)]> {
    match &node.value {
        Value::Map(m) => Some(m),
        _ => {
            cx.push(
                Diagnostic::new(
                    &codes::INVALID_TYPE,
                    node.span,
                    format!("expected {what} to be a mapping, found {}", node.type_name()),
                )
                .label("expected a mapping"),
            );
            None
        }
    }
}

/// Reports keys of `m` that are not in `valid`, with "did you mean" and the valid list.
pub(super) fn check_keys(cx: &mut Cx, m: &[(Key, Node)], what: &str, valid: &[&str]) {
    for (k, _) in m {
        if !valid.contains(&k.name.as_str()) {
            unknown_key(cx, k, what, valid);
        }
    }
}

pub(super) fn unknown_key(cx: &mut Cx, k: &Key, what: &str, valid: &[&str]) {
    let list = valid
        .iter()
        .map(|v| format!("`{v}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let help = match did_you_mean(&k.name, valid.iter().copied()) {
        Some(dym) => format!("{dym} valid keys are: {list}"),
        None => format!("valid keys are: {list}"),
    };
    cx.push(
        Diagnostic::new(
            &codes::UNKNOWN_KEY,
            k.span,
            format!("unknown key `{}` in {what}", k.name),
        )
        .label("unknown key")
        .help(help),
    );
}

pub(super) fn string(cx: &mut Cx, node: &Node) -> Option<Sp<String>> {
    match &node.value {
        Value::Str(s) => Some(Sp::new(s.clone(), node.span)),
        Value::Int(_) | Value::Float(_) | Value::Bool(_) => {
            cx.push(
                Diagnostic::new(
                    &codes::INVALID_TYPE,
                    node.span,
                    format!("expected a string, found {}", node.type_name()),
                )
                .label("expected a string")
                .help(format!("quote it: \"{}\"", node.to_json())),
            );
            None
        }
        _ => {
            type_error(cx, node, "a string");
            None
        }
    }
}

pub(super) fn string_list(cx: &mut Cx, node: &Node) -> Vec<Sp<String>> {
    list(cx, node, string)
}

pub(super) fn list<T>(cx: &mut Cx, node: &Node, mut f: impl FnMut(&mut Cx, &Node) -> Option<T>) -> Vec<T> {
    match &node.value {
        Value::Seq(items) => items.iter().filter_map(|n| f(cx, n)).collect(),
        _ => {
            type_error(cx, node, "a list");
            Vec::new()
        }
    }
}

pub(super) fn u64_(cx: &mut Cx, node: &Node) -> Option<Sp<u64>> {
    match &node.value {
        Value::Int(i) if *i >= 0 => Some(Sp::new(*i as u64, node.span)),
        Value::Int(_) => {
            cx.push(
                Diagnostic::new(
                    &codes::LIMIT_OUT_OF_RANGE,
                    node.span,
                    "expected a non-negative integer",
                )
                .label("negative"),
            );
            None
        }
        _ => {
            type_error(cx, node, "an integer");
            None
        }
    }
}

pub(super) fn f64_(cx: &mut Cx, node: &Node) -> Option<Sp<f64>> {
    match &node.value {
        Value::Int(i) => Some(Sp::new(*i as f64, node.span)),
        Value::Float(f) if f.is_finite() => Some(Sp::new(*f, node.span)),
        _ => {
            type_error(cx, node, "a number");
            None
        }
    }
}

pub(super) fn bool_(cx: &mut Cx, node: &Node) -> Option<Sp<bool>> {
    match &node.value {
        Value::Bool(b) => Some(Sp::new(*b, node.span)),
        Value::Str(s)
            if matches!(
                s.to_ascii_lowercase().as_str(),
                "yes" | "no" | "on" | "off" | "y" | "n"
            ) =>
        {
            cx.push(
                Diagnostic::new(
                    &codes::INVALID_TYPE,
                    node.span,
                    format!("expected a boolean, found the string `{s}`"),
                )
                .label("a string in YAML 1.2")
                .help("write `true` or `false`"),
            );
            None
        }
        _ => {
            type_error(cx, node, "a boolean");
            None
        }
    }
}

pub(super) fn any(node: &Node) -> Any {
    Any(node.clone())
}

/// Parses `250ms`, `20s`, `1.5m`, `2h`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.')?);
    let n: f64 = num.parse().ok()?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    (secs.is_finite() && (0.0..1e10).contains(&secs)).then(|| Duration::from_secs_f64(secs))
}

/// Parses `512KiB`, `8MiB`, `1GiB`, `100KB`, `123B`, `123`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

pub(super) fn duration(cx: &mut Cx, node: &Node) -> Option<Sp<Dur>> {
    let s = match &node.value {
        Value::Str(s) => s,
        Value::Int(_) | Value::Float(_) => {
            cx.push(
                Diagnostic::new(&codes::INVALID_VALUE, node.span, "a duration needs a unit")
                    .label("no unit")
                    .help(format!("write `{}s` or `{}ms`", node.to_json(), node.to_json())),
            );
            return None;
        }
        _ => {
            type_error(cx, node, "a duration");
            return None;
        }
    };
    match parse_duration(s) {
        Some(d) => Some(Sp::new(Dur(d), node.span)),
        None => {
            cx.push(
                Diagnostic::new(
                    &codes::INVALID_VALUE,
                    node.span,
                    format!("invalid duration `{s}`"),
                )
                .label("not a duration")
                .help("durations are a number and a unit: `250ms`, `20s`, `5m`, `2h`"),
            );
            None
        }
    }
}

pub(super) fn size(cx: &mut Cx, node: &Node) -> Option<Sp<Size>> {
    match &node.value {
        Value::Int(i) if *i >= 0 => Some(Sp::new(Size(*i as u64), node.span)),
        Value::Str(s) => match parse_size(s) {
            Some(n) => Some(Sp::new(Size(n), node.span)),
            None => {
                cx.push(
                    Diagnostic::new(&codes::INVALID_VALUE, node.span, format!("invalid size `{s}`"))
                        .label("not a size")
                        .help("sizes are a number of bytes or a number and a unit: `512KiB`, `8MiB`, `1GiB`"),
                );
                None
            }
        },
        _ => {
            type_error(cx, node, "a size");
            None
        }
    }
}

pub(super) fn enum_<T: Copy>(cx: &mut Cx, node: &Node, what: &str, options: &[(&str, T)]) -> Option<Sp<T>> {
    let s = string(cx, node)?;
    if let Some((_, v)) = options.iter().find(|(n, _)| *n == s.value) {
        return Some(Sp::new(*v, s.span));
    }
    let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
    let list = names
        .iter()
        .map(|v| format!("`{v}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let help = match did_you_mean(&s.value, names.iter().copied()) {
        Some(d) => format!("{d} {what} is one of {list}"),
        None => format!("{what} is one of {list}"),
    };
    cx.push(
        Diagnostic::new(
            &codes::INVALID_VALUE,
            s.span,
            format!("invalid {what} `{}`", s.value),
        )
        .label(format!("not a valid {what}"))
        .help(help),
    );
    None
}

pub(super) fn schema_ref(cx: &mut Cx, node: &Node) -> Option<SchemaRef> {
    match &node.value {
        Value::Str(s) => Some(SchemaRef::Path(Sp::new(s.clone(), node.span))),
        Value::Map(_) | Value::Bool(_) => Some(SchemaRef::Inline(any(node))),
        _ => {
            type_error(cx, node, "a JSON Schema (a mapping) or a path to one");
            None
        }
    }
}

pub(super) fn named<T>(
    cx: &mut Cx,
    node: &Node,
    what: &str,
    mut f: impl FnMut(&mut Cx, &Key, &Node) -> Option<T>,
) -> IndexMap<String, T> {
    if matches!(node.value, Value::Null) {
        return IndexMap::new();
    }
    let Some(m) = map(cx, node, what) else {
        return IndexMap::new();
    };
    let mut out = IndexMap::with_capacity(m.len());
    for (k, v) in m {
        if let Some(t) = f(cx, k, v) {
            out.insert(k.name.clone(), t);
        }
    }
    out
}

pub(super) fn string_map(cx: &mut Cx, node: &Node, what: &str) -> IndexMap<String, Sp<String>> {
    named(cx, node, what, |cx, _, v| string(cx, v))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("5d"), None);
        assert_eq!(parse_size("512KiB"), Some(512 * 1024));
        assert_eq!(parse_size("8MiB"), Some(8 << 20));
        assert_eq!(parse_size("12"), Some(12));
        assert_eq!(parse_size("12 parsecs"), None);
    }

    #[test]
    fn identifiers() {
        assert!(is_ident("fetch_docs2"));
        assert!(!is_ident("fetch-docs"));
        assert!(!is_ident("Fetch"));
        assert_eq!(suggest_ident("fetch-docs", false), "fetch_docs");
    }
}
