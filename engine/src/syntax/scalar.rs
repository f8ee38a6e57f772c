//! Plain scalars under the YAML 1.2 core schema: which text is null, a boolean, an integer, a
//! float or a string. Shared by the full parser (`yaml.rs`, also for `!!int`-style tags) and
//! the fast path (`fast.rs`).

use super::Value;

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

pub(super) fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// `[-+]?[0-9]+` without redundant leading zeros, `0o[0-7]+`, `0x[0-9a-fA-F]+`, within i64.
pub(super) fn parse_int(text: &str) -> Option<i64> {
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
pub(super) fn parse_float(text: &str) -> Option<f64> {
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
