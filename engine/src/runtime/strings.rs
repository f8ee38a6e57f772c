//! The strings extension of cel-go (`ext.Strings()`), registered on the root CEL environment
//! by [`register`]: `charAt`, `indexOf`, `lastIndexOf`, `lowerAscii`, `upperAscii`, `replace`,
//! `split`, `substring`, `trim`, `join` and `format` (SPEC §5.1).
//!
//! Semantics are cel-go's, function by function (its documentation and tests), not the `cel`
//! crate's own extension, which differs where an empty search string meets an offset. Indices
//! and offsets count code points, not bytes. Receivers and arguments are any CEL `string` or
//! `list`, so JSON strings and arrays read lazily from the payload take part without being
//! copied first. This module knows nothing of flows, variables or JSON.

use cel::common::traits::Indexer;
use cel::common::types::{
    self as cel_types, CelBool, CelBytes, CelDouble, CelInt, CelList, CelString, CelType, CelUInt, Kind,
};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

/// Registers every function of the extension on `env`.
pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    use cel_types::{INT_TYPE as I, LIST_TYPE as L, STRING_TYPE as S};
    env.add_member_overload("charAt", "sy_string_char_at_int", S, vec![I], char_at)?;
    env.add_member_overload("indexOf", "sy_string_index_of_string", S, vec![S], index_of)?;
    env.add_member_overload(
        "indexOf",
        "sy_string_index_of_string_int",
        S,
        vec![S, I],
        index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "sy_string_last_index_of_string",
        S,
        vec![S],
        last_index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "sy_string_last_index_of_string_int",
        S,
        vec![S, I],
        last_index_of,
    )?;
    env.add_member_overload("lowerAscii", "sy_string_lower_ascii", S, vec![], lower_ascii)?;
    env.add_member_overload("upperAscii", "sy_string_upper_ascii", S, vec![], upper_ascii)?;
    env.add_member_overload(
        "replace",
        "sy_string_replace_string_string",
        S,
        vec![S, S],
        replace,
    )?;
    env.add_member_overload(
        "replace",
        "sy_string_replace_string_string_int",
        S,
        vec![S, S, I],
        replace,
    )?;
    env.add_member_overload("split", "sy_string_split_string", S, vec![S], split)?;
    env.add_member_overload("split", "sy_string_split_string_int", S, vec![S, I], split)?;
    env.add_member_overload("substring", "sy_string_substring_int", S, vec![I], substring)?;
    env.add_member_overload(
        "substring",
        "sy_string_substring_int_int",
        S,
        vec![I, I],
        substring,
    )?;
    env.add_member_overload("trim", "sy_string_trim", S, vec![], trim)?;
    env.add_member_overload("join", "sy_list_join", L, vec![], join)?;
    env.add_member_overload("join", "sy_list_join_string", L, vec![S], join)?;
    env.add_member_overload("format", "sy_string_format_list", S, vec![L], format)?;
    Ok(())
}

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Out<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

fn string_arg<'a>(args: &'a [CowVal<'_, '_>], i: usize) -> Result<&'a str, ExecutionError> {
    let v = args
        .get(i)
        .ok_or_else(|| ExecutionError::invalid_argument_count(i + 1, args.len()))?;
    v.downcast_ref::<CelString>()
        .map(|s| s.inner())
        .ok_or_else(|| unexpected(v.as_ref(), "string"))
}

fn int_arg(args: &[CowVal<'_, '_>], i: usize) -> Result<i64, ExecutionError> {
    let v = args
        .get(i)
        .ok_or_else(|| ExecutionError::invalid_argument_count(i + 1, args.len()))?;
    v.downcast_ref::<CelInt>()
        .map(|n| *n.inner())
        .ok_or_else(|| unexpected(v.as_ref(), "int"))
}

fn unexpected(v: &dyn Val, want: &str) -> ExecutionError {
    ExecutionError::UnexpectedType {
        got: v.get_type().name().to_owned(),
        want: want.to_owned(),
    }
}

fn string_out<'b, 'v>(s: String) -> Out<'b, 'v> {
    Ok(CowVal::owned(CelString::from(s)))
}

fn int_out<'b, 'v>(i: i64) -> Out<'b, 'v> {
    Ok(CowVal::owned(CelInt::from(i)))
}

fn fail(function: &str, message: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, message)
}

fn out_of_range(function: &str, i: i64) -> ExecutionError {
    fail(function, format!("index out of range: {i}"))
}

/// A length or position in code points, as an `i64` (strings are far shorter than 2^63).
fn count(s: &str) -> i64 {
    i64::try_from(s.chars().count()).unwrap_or(i64::MAX)
}

/// The byte offset of code point `i` of `s` (`0 <= i <= count(s)`).
fn byte_at(s: &str, i: i64) -> usize {
    let i = usize::try_from(i).unwrap_or(0);
    s.char_indices().nth(i).map_or(s.len(), |(b, _)| b)
}

// ---------------------------------------------------------------------------------------------
// The functions, each as cel-go defines it

/// `s.charAt(i)`: the code point at `i`; `""` at the end; an error before 0 or past the end.
fn char_at<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (s, i) = (string_arg(&args, 0)?, int_arg(&args, 1)?);
    if i < 0 || i > count(s) {
        return Err(out_of_range("charAt", i));
    }
    string_out(s.chars().nth(i as usize).map(String::from).unwrap_or_default())
}

/// `s.indexOf(sub[, from])`: the first code-point index of `sub` at or after `from`, or -1.
/// An empty `sub` is found where the search starts (`from` as given, as in cel-go); a
/// non-empty one with `from` before 0 or at or past the end is an error. Without `from`, an
/// empty `s` holds no `sub` (-1): there is no offset to be out of range.
fn index_of<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (s, sub) = (string_arg(&args, 0)?, string_arg(&args, 1)?);
    let from = if args.len() > 2 {
        Some(int_arg(&args, 2)?)
    } else {
        None
    };
    int_out(index_in(s, sub, from).map_err(|i| out_of_range("indexOf", i))?)
}

fn index_in(s: &str, sub: &str, from: Option<i64>) -> Result<i64, i64> {
    let start = from.unwrap_or(0);
    if sub.is_empty() {
        return Ok(start);
    }
    let runes: Vec<char> = s.chars().collect();
    let len = runes.len() as i64;
    if from.is_some() && (start < 0 || start >= len) {
        return Err(start);
    }
    let needle: Vec<char> = sub.chars().collect();
    if needle.len() > runes.len() {
        return Ok(-1);
    }
    let last = runes.len() - needle.len();
    Ok((start as usize..=last)
        .find(|&i| runes[i..i + needle.len()] == needle[..])
        .map_or(-1, |i| i as i64))
}

/// `s.lastIndexOf(sub[, from])`: the last code-point index at or before `from` where `sub`
/// starts, or -1. Without `from` the search starts at the end (an empty `sub` is found at the
/// length); with it, an empty `sub` is found at `from` as given, and a non-empty one with
/// `from` before 0 or at or past the end is an error.
fn last_index_of<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (s, sub) = (string_arg(&args, 0)?, string_arg(&args, 1)?);
    let from = if args.len() > 2 {
        Some(int_arg(&args, 2)?)
    } else {
        None
    };
    int_out(last_index_in(s, sub, from).map_err(|i| out_of_range("lastIndexOf", i))?)
}

fn last_index_in(s: &str, sub: &str, from: Option<i64>) -> Result<i64, i64> {
    let runes: Vec<char> = s.chars().collect();
    let len = runes.len() as i64;
    if sub.is_empty() {
        return Ok(from.unwrap_or(len));
    }
    let start = from.unwrap_or(len - 1);
    if from.is_some() && (start < 0 || start >= len) {
        return Err(start);
    }
    let needle: Vec<char> = sub.chars().collect();
    if needle.len() > runes.len() {
        return Ok(-1);
    }
    let first = (start as usize).min(runes.len() - needle.len());
    Ok((0..=first)
        .rev()
        .find(|&i| runes[i..i + needle.len()] == needle[..])
        .map_or(-1, |i| i as i64))
}

/// `s.lowerAscii()`: ASCII letters lower-cased, every other code point kept.
fn lower_ascii<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    string_out(string_arg(&args, 0)?.to_ascii_lowercase())
}

/// `s.upperAscii()`: ASCII letters upper-cased, every other code point kept.
fn upper_ascii<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    string_out(string_arg(&args, 0)?.to_ascii_uppercase())
}

/// `s.replace(old, new[, n])`: the first `n` occurrences of `old` replaced (all of them
/// without `n` or when it is negative; none when it is 0). An empty `old` matches before
/// every code point and at the end, as Go's `strings.Replace`.
fn replace<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (s, old, new) = (
        string_arg(&args, 0)?,
        string_arg(&args, 1)?,
        string_arg(&args, 2)?,
    );
    let n = if args.len() > 3 { int_arg(&args, 3)? } else { -1 };
    string_out(match usize::try_from(n) {
        Ok(n) => s.replacen(old, new, n),
        Err(_) => s.replace(old, new),
    })
}

/// `s.split(sep[, n])`: the pieces between occurrences of `sep`, at most `n` of them (the last
/// holding the rest); all of them without `n` or when it is negative, none when it is 0. An
/// empty `sep` splits between code points, as Go's `strings.SplitN`.
fn split<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (s, sep) = (string_arg(&args, 0)?, string_arg(&args, 1)?);
    let n = if args.len() > 2 { int_arg(&args, 2)? } else { -1 };
    let pieces = split_n(s, sep, n);
    let list: Vec<Box<dyn Val + 'v>> = pieces
        .into_iter()
        .map(|p| Box::new(CelString::from(p.to_owned())) as Box<dyn Val + 'v>)
        .collect();
    Ok(CowVal::owned(CelList::from(list)))
}

fn split_n<'s>(s: &'s str, sep: &str, n: i64) -> Vec<&'s str> {
    let limit = usize::try_from(n).ok();
    if limit == Some(0) {
        return Vec::new();
    }
    if !sep.is_empty() {
        return match limit {
            Some(n) => s.splitn(n, sep).collect(),
            None => s.split(sep).collect(),
        };
    }
    // Code point by code point, the last piece holding the rest.
    let max = limit.unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if out.len() + 1 == max {
            out.push(rest);
            return out;
        }
        let (head, tail) = rest.split_at(c.len_utf8());
        out.push(head);
        rest = tail;
    }
    out
}

/// `s.substring(start[, end])`: code points `start..end` (to the end without `end`). A start
/// after the end, or either outside `0..=size`, is an error.
fn substring<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0)?;
    let start = int_arg(&args, 1)?;
    let len = count(s);
    let end = if args.len() > 2 { int_arg(&args, 2)? } else { len };
    if args.len() > 2 && start > end {
        return Err(fail(
            "substring",
            format!("invalid substring range. start: {start}, end: {end}"),
        ));
    }
    if start < 0 || start > len {
        return Err(out_of_range("substring", start));
    }
    if end < 0 || end > len {
        return Err(out_of_range("substring", end));
    }
    string_out(s[byte_at(s, start)..byte_at(s, end)].to_owned())
}

/// `s.trim()`: leading and trailing white space removed, by Unicode's `White_Space` property
/// (Go's `unicode.IsSpace`): zero-width spaces and U+180E are not white space.
fn trim<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    string_out(string_arg(&args, 0)?.trim_matches(char::is_whitespace).to_owned())
}

/// `list.join([sep])`: the strings of the list, `sep` (default `""`) between each. An element
/// that is not a string is an error.
fn join<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let list = args
        .first()
        .ok_or_else(|| ExecutionError::invalid_argument_count(1, 0))?;
    let sep = if args.len() > 1 { string_arg(&args, 1)? } else { "" };
    let items = list
        .as_iterable()
        .ok_or_else(|| unexpected(list.as_ref(), "list"))?;
    let mut it = items.iter();
    let mut out = String::new();
    let mut first = true;
    while let Some(item) = it.next() {
        let Some(s) = item.downcast_ref::<CelString>() else {
            return Err(fail(
                "join",
                format!("invalid input: {} is not a string", item.get_type().name()),
            ));
        };
        if !first {
            out.push_str(sep);
        }
        first = false;
        out.push_str(s.inner());
    }
    string_out(out)
}

/// `fmt.format(args)`: printf-style, as cel-go's `format` (its second version): `%s`, `%d`,
/// `%f`/`%.Nf`, `%e`/`%.Ne`, `%b`, `%o`, `%x`, `%X`, and `%%` for `%`. Each clause takes the
/// next element of `args`; too few elements, an unknown clause or a value a clause does not
/// take is an error.
fn format<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let text = string_arg(&args, 0)?;
    let list = args
        .get(1)
        .ok_or_else(|| ExecutionError::invalid_argument_count(2, 1))?;
    let items = list
        .as_iterable()
        .ok_or_else(|| unexpected(list.as_ref(), "list"))?;
    let mut values: Vec<&dyn Val> = Vec::new();
    let mut it = items.iter();
    while let Some(v) = it.next() {
        values.push(v);
    }
    let out = format_with(text, &values).map_err(|m| fail("format", m))?;
    string_out(out)
}

/// The largest precision a clause may ask for (cel-go's default limit).
const MAX_PRECISION: usize = 100;
const DEFAULT_PRECISION: usize = 6;

fn format_with(text: &str, values: &[&dyn Val]) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut next = 0;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('%') {
            out.push('%');
            rest = after;
            continue;
        }
        let value = values
            .get(next)
            .ok_or_else(|| format!("index {next} out of range"))?;
        if rest.is_empty() {
            return Err("unexpected end of string".to_owned());
        }
        let (clause, after) = clause(rest).map_err(|e| format!("could not parse formatting clause: {e}"))?;
        let formatted = apply(clause, *value).map_err(|e| format!("error during formatting: {e}"))?;
        out.push_str(&formatted);
        rest = after;
        next += 1;
    }
    out.push_str(rest);
    Ok(out)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Clause {
    Str,
    Decimal,
    Fixed(usize),
    Scientific(usize),
    Binary,
    Octal,
    Hex(bool),
}

/// The clause at the start of `text` (after its `%`) and the text after it.
fn clause(text: &str) -> Result<(Clause, &str), String> {
    let (precision, text) = match text.strip_prefix('.') {
        None => (DEFAULT_PRECISION, text),
        Some(digits) => {
            let end = digits
                .find(|c: char| !c.is_ascii_digit())
                .ok_or("error while parsing precision: could not find end of precision specifier")?;
            let p: usize = digits[..end].parse().map_err(|_| {
                format!(
                    "error while parsing precision: error while converting precision to integer: \
                     strconv.Atoi: parsing \"{}\": invalid syntax",
                    &digits[..end]
                )
            })?;
            if p > MAX_PRECISION {
                return Err(format!(
                    "error while parsing precision: precision {p} exceeds maximum allowed precision {MAX_PRECISION}"
                ));
            }
            (p, &digits[end..])
        }
    };
    let mut chars = text.chars();
    let c = chars.next().ok_or("unexpected end of string")?;
    let clause = match c {
        's' => Clause::Str,
        'd' => Clause::Decimal,
        'f' => Clause::Fixed(precision),
        'e' => Clause::Scientific(precision),
        'b' => Clause::Binary,
        'o' => Clause::Octal,
        'x' => Clause::Hex(false),
        'X' => Clause::Hex(true),
        other => return Err(format!("unrecognized formatting clause \"{other}\"")),
    };
    Ok((clause, chars.as_str()))
}

/// A value as the clauses tell them apart.
enum Arg<'a> {
    Bool(bool),
    Int(i64),
    UInt(u64),
    Double(f64),
    Str(&'a str),
    Bytes(&'a [u8]),
    Null,
    Type(&'a str),
    List,
    Map,
    Other,
}

fn arg_of(v: &dyn Val) -> Arg<'_> {
    let found = match v.get_type().kind() {
        Kind::Boolean => v.downcast_ref::<CelBool>().map(|b| Arg::Bool(*b.inner())),
        Kind::Int => v.downcast_ref::<CelInt>().map(|i| Arg::Int(*i.inner())),
        Kind::UInt => v.downcast_ref::<CelUInt>().map(|u| Arg::UInt(*u.inner())),
        Kind::Double => v.downcast_ref::<CelDouble>().map(|d| Arg::Double(*d.inner())),
        Kind::String => v.downcast_ref::<CelString>().map(|s| Arg::Str(s.inner())),
        Kind::Bytes => v.downcast_ref::<CelBytes>().map(|b| Arg::Bytes(b.inner())),
        Kind::NullType => Some(Arg::Null),
        Kind::Type => v.downcast_ref::<CelType>().map(|t| Arg::Type(t.name())),
        Kind::List if v.as_iterable().is_some() => Some(Arg::List),
        Kind::Map if v.as_iterable().is_some() && v.as_indexer().is_some() => Some(Arg::Map),
        _ => None,
    };
    found.unwrap_or(Arg::Other)
}

fn type_error(what: &str, v: &dyn Val) -> String {
    format!("{what}, was given {}", v.get_type().name())
}

fn apply(clause: Clause, v: &dyn Val) -> Result<String, String> {
    let arg = arg_of(v);
    let number = |arg: &Arg| match *arg {
        Arg::Int(i) => Some(i as f64),
        Arg::UInt(u) => Some(u as f64),
        Arg::Double(d) => Some(d),
        _ => None,
    };
    match clause {
        Clause::Str => as_string(v),
        Clause::Decimal => match arg {
            Arg::Int(i) => Ok(i.to_string()),
            Arg::UInt(u) => Ok(u.to_string()),
            Arg::Double(d) => Ok(shortest(d)),
            _ => Err(type_error(
                "decimal clause can only be used on ints, uints, and doubles",
                v,
            )),
        },
        Clause::Fixed(p) => match number(&arg) {
            Some(d) => Ok(non_finite(d).map_or_else(|| format!("{d:.p$}"), str::to_owned)),
            None => Err(type_error(
                "fixed-point clause can only be used on ints, uints, and doubles",
                v,
            )),
        },
        Clause::Scientific(p) => match number(&arg) {
            Some(d) => Ok(non_finite(d).map_or_else(|| scientific(d, p), str::to_owned)),
            None => Err(type_error(
                "scientific clause can only be used on ints, uints, and doubles",
                v,
            )),
        },
        Clause::Binary => match arg {
            Arg::Bool(b) => Ok(if b { "1" } else { "0" }.to_owned()),
            Arg::Int(i) => Ok(signed(i, |m| format!("{m:b}"))),
            Arg::UInt(u) => Ok(format!("{u:b}")),
            _ => Err(type_error(
                "only ints, uints, and bools can be formatted as binary",
                v,
            )),
        },
        Clause::Octal => match arg {
            Arg::Int(i) => Ok(signed(i, |m| format!("{m:o}"))),
            Arg::UInt(u) => Ok(format!("{u:o}")),
            _ => Err(type_error("octal clause can only be used on ints and uints", v)),
        },
        Clause::Hex(upper) => {
            let text = match arg {
                Arg::Int(i) => signed(i, |m| format!("{m:x}")),
                Arg::UInt(u) => format!("{u:x}"),
                Arg::Str(s) => hex_bytes(s.as_bytes()),
                Arg::Bytes(b) => hex_bytes(b),
                _ => {
                    return Err(type_error(
                        "only ints, uints, bytes, and strings can be formatted as hex",
                        v,
                    ));
                }
            };
            Ok(if upper { text.to_ascii_uppercase() } else { text })
        }
    }
}

/// `%s`: scalars as `string()` writes them, lists as `[a, b]` and maps as `{k: v}` sorted by
/// the written key, their elements written the same way (strings unquoted).
fn as_string(v: &dyn Val) -> Result<String, String> {
    Ok(match arg_of(v) {
        Arg::Bool(b) => b.to_string(),
        Arg::Int(i) => i.to_string(),
        Arg::UInt(u) => u.to_string(),
        Arg::Double(d) => shortest(d),
        Arg::Str(s) => s.to_owned(),
        Arg::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        Arg::Null => "null".to_owned(),
        Arg::Type(t) => t.to_owned(),
        Arg::List => {
            let mut it = v.as_iterable().expect("checked by arg_of").iter();
            let mut parts = Vec::new();
            while let Some(item) = it.next() {
                parts.push(as_string(item)?);
            }
            format!("[{}]", parts.join(", "))
        }
        Arg::Map => {
            let values: &dyn Indexer = v.as_indexer().expect("checked by arg_of");
            let mut it = v.as_iterable().expect("checked by arg_of").iter();
            let mut entries = Vec::new();
            while let Some(key) = it.next() {
                let value = values.get(key).map_err(|e| e.to_string())?;
                entries.push((as_string(key)?, as_string(value.as_ref())?));
            }
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            let parts: Vec<String> = entries.into_iter().map(|(k, v)| format!("{k}: {v}")).collect();
            format!("{{{}}}", parts.join(", "))
        }
        Arg::Other => {
            return Err(type_error(
                "string clause can only be used on strings, bools, bytes, ints, doubles, maps, \
                 lists, types, durations, and timestamps",
                v,
            ));
        }
    })
}

fn non_finite(d: f64) -> Option<&'static str> {
    if d.is_nan() {
        Some("NaN")
    } else if d == f64::INFINITY {
        Some("Infinity")
    } else if d == f64::NEG_INFINITY {
        Some("-Infinity")
    } else {
        None
    }
}

/// The fewest digits that read back as `d`, without an exponent (Go's `'f', -1`).
fn shortest(d: f64) -> String {
    non_finite(d).map_or_else(|| d.to_string(), str::to_owned)
}

/// `d` as `d.ddde±XX`: `p` digits after the point, at least two in the exponent (Go's `%e`).
fn scientific(d: f64, p: usize) -> String {
    let rust = format!("{d:.p$e}");
    let (mantissa, exp) = rust.split_once('e').unwrap_or((&rust, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
}

/// A signed integer in another base, as Go writes it: a `-` and the magnitude's digits.
fn signed(i: i64, digits: impl Fn(u64) -> String) -> String {
    let m = digits(i.unsigned_abs());
    if i < 0 { format!("-{m}") } else { m }
}

fn hex_bytes(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    //! Expected values are cel-go's: the examples of its strings extension documentation and
    //! the cases of its `ext/strings_test.go` and `ext/formatting_v2_test.go`.

    use std::sync::{Arc, LazyLock};

    use cel::{Context, Env};

    fn ctx() -> &'static Context<'static, 'static> {
        static CTX: LazyLock<Context<'static, 'static>> = LazyLock::new(|| {
            let mut env = Env::stdlib();
            super::register(&mut env).expect("registers once");
            Context::with_env(Arc::new(env))
        });
        &CTX
    }

    fn eval(text: &str) -> Result<cel::Value, String> {
        let e = crate::compile::expr::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        cel::Value::resolve(e.ast(), ctx()).map_err(|e| match e {
            cel::ExecutionError::FunctionError { message, .. } => message,
            other => other.to_string(),
        })
    }

    #[track_caller]
    fn yes(text: &str) {
        assert_eq!(eval(text), Ok(cel::Value::Bool(true)), "{text}");
    }

    #[track_caller]
    fn is(text: &str, want: &str) {
        assert_eq!(
            eval(text),
            Ok(cel::Value::String(Arc::new(want.to_owned()))),
            "{text}"
        );
    }

    #[track_caller]
    fn fails(text: &str, message: &str) {
        match eval(text) {
            Err(m) => assert!(m.contains(message), "{text}: {m}"),
            Ok(v) => panic!("{text}: got {v:?}, wanted an error {message:?}"),
        }
    }

    #[test]
    fn char_at() {
        yes("'tacocat'.charAt(3) == 'o'");
        yes("'tacocat'.charAt(7) == ''");
        yes("'©αT'.charAt(0) == '©' && '©αT'.charAt(1) == 'α' && '©αT'.charAt(2) == 'T'");
        yes("'hello'.charAt(4) == 'o'");
        fails("'tacocat'.charAt(30)", "index out of range: 30");
        fails("'hello'.charAt(-1)", "index out of range: -1");
    }

    #[test]
    fn index_of() {
        yes("'tacocat'.indexOf('') == 0");
        yes("'tacocat'.indexOf('ac') == 1");
        yes("'tacocat'.indexOf('none') == -1");
        yes("'tacocat'.indexOf('', 3) == 3");
        yes("'tacocat'.indexOf('a', 3) == 5");
        yes("'tacocat'.indexOf('at', 3) == 5");
        yes("'ta©o©αT'.indexOf('©') == 2");
        yes("'ta©o©αT'.indexOf('©', 3) == 4");
        yes("'ta©o©αT'.indexOf('©αT', 3) == 4");
        yes("'ta©o©αT'.indexOf('©α', 5) == -1");
        yes("'ijk'.indexOf('k') == 2");
        yes("'hello wello'.indexOf('hello wello') == 0");
        yes("'hello wello'.indexOf('ello', 6) == 7");
        yes("'hello wello'.indexOf('elbo room!!') == -1");
        yes("'hello mellow'.indexOf('ello', 2) == 7");
        fails("'tacocat'.indexOf('a', 30)", "index out of range: 30");
        fails("'hello mellow'.indexOf('ello', 20)", "index out of range: 20");
        fails("'abc'.indexOf('a', -1)", "index out of range: -1");
        // An empty search string is found where the search starts, as given.
        yes("'abc'.indexOf('', 20) == 20");
        yes("''.indexOf('') == 0");
        yes("''.indexOf('a') == -1");
    }

    #[test]
    fn last_index_of() {
        yes("'tacocat'.lastIndexOf('') == 7");
        yes("'tacocat'.lastIndexOf('at') == 5");
        yes("'tacocat'.lastIndexOf('none') == -1");
        yes("'tacocat'.lastIndexOf('', 3) == 3");
        yes("'tacocat'.lastIndexOf('a', 3) == 1");
        yes("'ta©o©αT'.lastIndexOf('©') == 4");
        yes("'ta©o©αT'.lastIndexOf('©', 3) == 2");
        yes("'ta©o©αT'.lastIndexOf('©α', 4) == 4");
        yes("'hello wello'.lastIndexOf('ello', 6) == 1");
        yes("'hello wello'.lastIndexOf('low') == -1");
        yes("'hello wello'.lastIndexOf('elbo room!!') == -1");
        yes("'hello wello'.lastIndexOf('hello wello') == 0");
        yes("'bananananana'.lastIndexOf('nana', 8) == 8");
        yes("'hello mellow'.lastIndexOf('') == 12");
        yes("'hello mellow'.lastIndexOf('ello') == 7");
        yes("''.lastIndexOf('@@') == -1");
        fails("'tacocat'.lastIndexOf('a', -1)", "index out of range: -1");
        fails("'tacocat'.lastIndexOf('a', 30)", "index out of range: 30");
        yes("'abc'.lastIndexOf('', 20) == 20");
    }

    #[test]
    fn ascii_case() {
        is("'TacoCat'.lowerAscii()", "tacocat");
        is("'TacoCÆt Xii'.lowerAscii()", "tacocÆt xii");
        is("'TacoCat'.upperAscii()", "TACOCAT");
        is("'TacoCÆt Xii'.upperAscii()", "TACOCÆT XII");
    }

    #[test]
    fn replace() {
        is("'hello hello'.replace('he', 'we')", "wello wello");
        is("'hello hello'.replace('he', 'we', -1)", "wello wello");
        is("'hello hello'.replace('he', 'we', 1)", "wello hello");
        is("'hello hello'.replace('he', 'we', 0)", "hello hello");
        is("'hello hello'.replace('', '_')", "_h_e_l_l_o_ _h_e_l_l_o_");
        is("'hello hello'.replace('h', '')", "ello ello");
        yes("\"12 days 12 hours\".replace(\"{0}\", \"2\") == \"12 days 12 hours\"");
        yes("\"{0} days {0} hours\".replace(\"{0}\", \"2\") == \"2 days 2 hours\"");
        yes(
            "\"{0} days {0} hours\".replace(\"{0}\", \"2\", 1).replace(\"{0}\", \"23\") == \"2 days 23 hours\"",
        );
        yes("\"1 ©αT taco\".replace(\"αT\", \"o©α\") == \"1 ©o©α taco\"");
        is("'ab'.replace('', '-', 2)", "-a-b");
    }

    #[test]
    fn split() {
        yes("'hello hello hello'.split(' ') == ['hello', 'hello', 'hello']");
        yes("'hello hello hello'.split(' ', 0) == []");
        yes("'hello hello hello'.split(' ', 1) == ['hello hello hello']");
        yes("'hello hello hello'.split(' ', 2) == ['hello', 'hello hello']");
        yes("'hello hello hello'.split(' ', -1) == ['hello', 'hello', 'hello']");
        yes("\"o©o©o©o\".split(\"©\", -1) == [\"o\", \"o\", \"o\", \"o\"]");
        yes("'a©c'.split('') == ['a', '©', 'c']");
        yes("'abc'.split('', 2) == ['a', 'bc']");
        yes("''.split(',') == ['']");
        yes("''.split('') == []");
        yes("'a,b,'.split(',') == ['a', 'b', '']");
    }

    #[test]
    fn substring() {
        is("'tacocat'.substring(4)", "cat");
        is("'tacocat'.substring(7)", "");
        is("'tacocat'.substring(0, 4)", "taco");
        is("'tacocat'.substring(4, 4)", "");
        is("'ta©o©αT'.substring(2, 6)", "©o©α");
        is("'ta©o©αT'.substring(7, 7)", "");
        fails("'tacocat'.substring(40)", "index out of range: 40");
        fails("'tacocat'.substring(-1)", "index out of range: -1");
        fails("'tacocat'.substring(1, 50)", "index out of range: 50");
        fails("'tacocat'.substring(49, 50)", "index out of range: 49");
        fails(
            "'tacocat'.substring(4, 3)",
            "invalid substring range. start: 4, end: 3",
        );
        fails("'tacocat'.substring(-2, -1)", "index out of range: -2");
    }

    #[test]
    fn trim() {
        is("' \\f\\n\\r\\t\\vtext  '.trim()", "text");
        is("'\\u0085\\u00a0\\u1680text'.trim()", "text");
        is(
            "'text\\u2000\\u2001\\u2002\\u2003\\u2004\\u2004\\u2006\\u2007\\u2008\\u2009'.trim()",
            "text",
        );
        is("'\\u200atext\\u2028\\u2029\\u202F\\u205F\\u3000'.trim()", "text");
        // Not white space: U+180E and the zero-width characters.
        is(
            "'\\u180etext\\u200b\\u200c\\u200d\\u2060\\ufeff'.trim()",
            "\u{180e}text\u{200b}\u{200c}\u{200d}\u{2060}\u{feff}",
        );
    }

    #[test]
    fn join() {
        is("['hello', 'mellow'].join()", "hellomellow");
        is("['hello', 'mellow'].join(' ')", "hello mellow");
        is("[].join()", "");
        is("[].join('/')", "");
        fails("['a', 1].join()", "invalid input: int is not a string");
    }

    #[test]
    fn format_examples_of_the_documentation() {
        is(
            "\"this is a string: %s\\nand an integer: %d\".format([\"str\", 42])",
            "this is a string: str\nand an integer: 42",
        );
        is(
            "\"a double substituted with %%s: %s\".format([64.2])",
            "a double substituted with %s: 64.2",
        );
        // The documentation writes `type(string)`, which is `type` in CEL; the type of a
        // string, and the type name itself, print as `string`.
        is("\"string type: %s\".format([type('')])", "string type: string");
        is("\"string type: %s\".format([string])", "string type: string");
        is("\"%s\".format([type(string)])", "type");
        is("\"%f\".format([3.14])", "3.140000");
        is("\"5 in binary: %b\".format([5])", "5 in binary: 101");
        is("\"26 in hex: %x\".format([26])", "26 in hex: 1a");
        is(
            "\"26 in hex (uppercase): %X\".format([26])",
            "26 in hex (uppercase): 1A",
        );
        is("\"30 in octal: %o\".format([30])", "30 in octal: 36");
        is(
            "\"a map inside a list: %s\".format([[1, 2, 3, {\"a\": \"x\", \"b\": \"y\", \"c\": \"z\"}]])",
            "a map inside a list: [1, 2, 3, {a: x, b: y, c: z}]",
        );
        is(
            "\"true bool: %s - false bool: %s\\nbinary bool: %b\".format([true, false, true])",
            "true bool: true - false bool: false\nbinary bool: 1",
        );
    }

    #[test]
    fn format_clauses() {
        is("'%s %s %s'.format([null, 2u, -1.5])", "null 2 -1.5");
        is("'%d %d %d'.format([-12, 12u, 1.5])", "-12 12 1.5");
        is("'%.3f %.0f %f'.format([1.0005, 2.5, 2])", "1.000 2 2.000000");
        is("'%.2f'.format([-1.005])", "-1.00");
        is(
            "'%f %e'.format([double('NaN'), double('-Infinity')])",
            "NaN -Infinity",
        );
        is("'%e'.format([2.71828])", "2.718280e+00");
        is("'%.1e %e'.format([-0.000314, 1e100])", "-3.1e-04 1.000000e+100");
        is(
            "'%b %b %o %x %X'.format([-5, false, -8, -255, 255u])",
            "-101 0 -10 -ff FF",
        );
        is("'%x %X'.format(['Hi!', b'\\x0a\\xff'])", "486921 0AFF");
        is(
            "'%s'.format([{'b': [1.0], 'a': {}, 'c': true}])",
            "{a: {}, b: [1], c: true}",
        );
        is("'%s'.format([1e21])", "1000000000000000000000");
        is("'100%% %s'.format(['sure', 'unused'])", "100% sure");
        is("'©%sα'.format(['T'])", "©Tα");
    }

    #[test]
    fn format_errors() {
        fails("'%d %d'.format([1])", "index 1 out of range");
        fails("'%'.format([])", "index 0 out of range");
        fails("'%'.format([1])", "unexpected end of string");
        fails(
            "'%a'.format([1])",
            "could not parse formatting clause: unrecognized formatting clause \"a\"",
        );
        fails(
            "'%.3'.format([1])",
            "error while parsing precision: could not find end of precision specifier",
        );
        fails("'%.101f'.format([1])", "exceeds maximum allowed precision 100");
        fails(
            "'%d'.format(['1'])",
            "error during formatting: decimal clause can only be used on ints, uints, and doubles, was given string",
        );
        fails(
            "'%f'.format([null])",
            "fixed-point clause can only be used on ints, uints, and doubles, was given null_type",
        );
        fails(
            "'%e'.format([true])",
            "scientific clause can only be used on ints, uints, and doubles",
        );
        fails(
            "'%b'.format([1.0])",
            "only ints, uints, and bools can be formatted as binary, was given double",
        );
        fails(
            "'%o'.format(['x'])",
            "octal clause can only be used on ints and uints",
        );
        fails(
            "'%x'.format([[]])",
            "only ints, uints, bytes, and strings can be formatted as hex, was given list",
        );
        fails(
            "'%s'.format([optional.none()])",
            "string clause can only be used on strings",
        );
    }

    #[test]
    fn wrong_types_find_no_overload() {
        for text in [
            "42.charAt(2)",
            "'hello'.charAt(true)",
            "'42'.indexOf(4, 0)",
            "'42'.split(2)",
            "'42'.replace('2', 1)",
            "'tacocat'.substring(0, false)",
            "[1].format([])",
        ] {
            let e = eval(text).expect_err(text);
            assert!(e.contains("overload"), "{text}: {e}");
        }
    }
}
