//! `string.format(list)`, as cel-go's second formatter (`ext/formatting_v2.go`) writes it:
//! each clause `%[.precision]verb` takes the next element of the list, `%%` is a `%`. Values
//! are any CEL value, JSON views of the payload included; timestamps and durations are not
//! written here yet (their types come with the time functions).

use cel::ExecutionError;
use cel::common::traits::Indexer;
use cel::common::types::{CelBool, CelBytes, CelDouble, CelInt, CelString, CelType, CelUInt, Kind};
use cel::common::value::Val;

use crate::expr::time::{Duration, Timestamp};

use super::{Args, MAX_STRING_BYTES, Out, fail, string_arg, string_out, unexpected};

/// `fmt.format(args)`: printf-style, as cel-go's `format` (its second version): `%s`, `%d`,
/// `%f`/`%.Nf`, `%e`/`%.Ne`, `%b`, `%o`, `%x`, `%X`, and `%%` for `%`. Each clause takes the
/// next element of `args`; too few elements, an unknown clause or a value a clause does not
/// take is an error.
pub(super) fn format<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
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
        if out.len() + formatted.len() > MAX_STRING_BYTES {
            return Err(format!(
                "the result would be longer than the {} MiB a string may hold",
                MAX_STRING_BYTES >> 20
            ));
        }
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
    /// A timestamp or a duration, as its `string()` text.
    Time(String),
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
    found
        .or_else(|| v.downcast_ref::<Timestamp>().map(|t| Arg::Time(t.to_string())))
        .or_else(|| v.downcast_ref::<Duration>().map(|d| Arg::Time(d.to_string())))
        .unwrap_or(Arg::Other)
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
        Arg::Time(t) => t,
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
    //! Expected values are cel-go's: its documentation's examples and its formatting tests.

    use super::super::tests::{fails, is};

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
        // Timestamps and durations print as their `string()` (cel-go's `%s` of them).
        is(
            "'%s after %s'.format([duration('1h30m'), timestamp('2023-01-01T23:00:00-05:00')])",
            "5400s after 2023-01-02T04:00:00Z",
        );
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
}
