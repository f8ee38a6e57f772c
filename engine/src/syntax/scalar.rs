//! Scalars under the YAML 1.2 core schema: the value of a plain scalar (shared by both
//! parsers), and of a tagged one.

use serde_saphyr::granit_parser::{ScalarStyle, Tag};

use super::Value;

pub(super) const CORE: &str = "tag:yaml.org,2002:";

pub(super) const CORE_TAGS_HELP: &str =
    "flows use the YAML 1.2 core tags only: `!!str`, `!!int`, `!!float`, `!!bool`, `!!null`";

/// Why a tagged scalar has no value.
pub(super) enum TagProblem {
    /// A tag outside the core schema (labelled at the tag).
    Unsupported(String),
    /// A core tag whose scalar does not parse as its type (labelled at the scalar).
    Mismatch(String),
}

/// The value of a scalar with this style and tag: `None` for a string (the text itself), or
/// why it has no value.
pub(super) fn scalar_value(
    text: &str,
    style: ScalarStyle,
    tag: Option<&Tag>,
) -> Result<Option<Value>, TagProblem> {
    let Some(tag) = tag else {
        if style != ScalarStyle::Plain {
            return Ok(None);
        }
        // A decimal integer is never rounded into the nearest double.
        if too_large_integer(text) {
            return Err(TagProblem::Mismatch(format!(
                "the integer `{text}` does not fit in 64 bits, and would be rounded; quote it to keep its digits as a string"
            )));
        }
        return Ok(resolve_plain(text));
    };
    let core = tag.suffix_in_namespace(CORE);
    let wrong = |what: &str| {
        TagProblem::Mismatch(format!(
            "`{text}` is not {what}, as tag `{}` says",
            tag.original()
        ))
    };
    match core.as_deref() {
        Some("str") => Ok(None),
        Some("null") => Ok(Some(Value::Null)),
        Some("bool") => parse_bool(text)
            .map(|b| Some(Value::Bool(b)))
            .ok_or_else(|| wrong("a boolean")),
        Some("int") => parse_int(text)
            .map(|i| Some(Value::Int(i)))
            .ok_or_else(|| wrong("an integer")),
        Some("float") => parse_int(text)
            .map(|i| i as f64)
            .or_else(|| parse_float(text))
            .map(|f| Some(Value::Float(f)))
            .ok_or_else(|| wrong("a number")),
        Some("merge") if text == "<<" => Ok(None),
        // The non-specific tag `!` makes a scalar a string.
        _ if tag.parts() == ("", "!") => Ok(None),
        _ => Err(TagProblem::Unsupported(format!(
            "unsupported tag `{}`",
            tag.original()
        ))),
    }
}

/// Whether a plain scalar is a decimal integer outside `i64`: an error, never a rounded float.
pub(super) fn too_large_integer(text: &str) -> bool {
    is_decimal(text) && !has_leading_zero(text) && text.parse::<i64>().is_err()
}

/// A plain scalar's value under the YAML 1.2 core schema; `None` when it is a string.
pub(super) fn resolve_plain(text: &str) -> Option<Value> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Some(Value::Null),
        _ => {}
    }
    if let Some(b) = parse_bool(text) {
        return Some(Value::Bool(b));
    }
    let first = text.as_bytes()[0];
    if !(first.is_ascii_digit() || matches!(first, b'-' | b'+' | b'.')) {
        return None;
    }
    if is_decimal(text) {
        if has_leading_zero(text) {
            return None;
        }
        // An integer too large for i64 is a float, as a JSON number would be.
        return match text.parse::<i64>() {
            Ok(i) => Some(Value::Int(i)),
            Err(_) => text.parse::<f64>().ok().map(Value::Float),
        };
    }
    parse_int(text)
        .map(Value::Int)
        .or_else(|| parse_float(text).map(Value::Float))
}

fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// `[-+]?[0-9]+` without redundant leading zeros, `0o[0-7]+`, `0x[0-9a-fA-F]+`, within i64.
fn parse_int(text: &str) -> Option<i64> {
    if let Some(hex) = text.strip_prefix("0x") {
        return hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
            .then(|| i64::from_str_radix(hex, 16).ok())?;
    }
    if let Some(oct) = text.strip_prefix("0o") {
        return oct
            .bytes()
            .all(|b| matches!(b, b'0'..=b'7'))
            .then(|| i64::from_str_radix(oct, 8).ok())?;
    }
    if is_decimal(text) && !has_leading_zero(text) {
        text.parse().ok()
    } else {
        None
    }
}

/// `[-+]?[0-9]+`.
fn is_decimal(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// `007`, `-01`, `+00`: kept as strings (zip codes, file modes, version parts).
fn has_leading_zero(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    digits.len() > 1 && digits.starts_with('0')
}

/// `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`, `[-+]?.inf`, `.nan` (in the three
/// cases the core schema allows).
fn parse_float(text: &str) -> Option<f64> {
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    let negative = text.starts_with('-');
    match unsigned {
        ".inf" | ".Inf" | ".INF" => {
            return Some(if negative {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            });
        }
        ".nan" | ".NaN" | ".NAN" if unsigned.len() == text.len() => return Some(f64::NAN),
        _ => {}
    }
    let b = unsigned.as_bytes();
    let digits = |mut i: usize| {
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    let int_end = digits(0);
    let mut i = int_end;
    let mut frac = 0;
    if b.get(i) == Some(&b'.') {
        let frac_end = digits(i + 1);
        frac = frac_end - (i + 1);
        i = frac_end;
    }
    if int_end == 0 && frac == 0 {
        return None;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(b.get(j), Some(b'-' | b'+')) {
            j += 1;
        }
        let exp_end = digits(j);
        if exp_end == j {
            return None;
        }
        i = exp_end;
    }
    if i != b.len() {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_scalar_resolution_edge_cases() {
        for (text, expected) in [
            ("0", Value::Int(0)),
            ("-0", Value::Int(0)),
            ("00", Value::Str("00".into())),
            ("1.", Value::Float(1.0)),
            ("01.5", Value::Float(1.5)),
            (".", Value::Str(".".into())),
            ("1e", Value::Str("1e".into())),
            ("-", Value::Str("-".into())),
            ("+.inf", Value::Float(f64::INFINITY)),
            ("-.nan", Value::Str("-.nan".into())),
            ("0x", Value::Str("0x".into())),
            ("0o8", Value::Str("0o8".into())),
            ("1.2.3", Value::Str("1.2.3".into())),
            ("2h", Value::Str("2h".into())),
            ("9223372036854775807", Value::Int(i64::MAX)),
            ("-9223372036854775808", Value::Int(i64::MIN)),
            ("0xFFFFFFFFFFFFFFFFF", Value::Str("0xFFFFFFFFFFFFFFFFF".into())),
            ("yes", Value::Str("yes".into())),
            ("Off", Value::Str("Off".into())),
        ] {
            let value = resolve_plain(text).unwrap_or_else(|| Value::Str(text.to_owned()));
            assert_eq!(value, expected, "{text}");
        }
    }
}
