//! Every function and macro an expression may call (SPEC §5.1), with how it is called — as a
//! global function (`size(x)`) or on a receiver (`x.size()`) — and the argument counts it
//! takes, and the names of CEL's types (`int`, `string`, ... `type`), which are values, not
//! variables.
//!
//! The table covers CEL's standard library as the `cel` crate implements it (its macros and
//! the `optional` library included), the strings extension (`expr::strings`) and the time
//! functions with their accessors, by CEL's language definition. Lint checks each call against
//! it ([`check`]); nothing here evaluates.

/// A function or macro: its name, whether it is called on a receiver, the fewest and most
/// arguments it takes (the receiver not counted), and how it is written (in backticks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Function {
    pub name: &'static str,
    pub member: bool,
    pub min: usize,
    pub max: usize,
    pub usage: &'static str,
}

const fn global(name: &'static str, min: usize, max: usize, usage: &'static str) -> Function {
    Function {
        name,
        member: false,
        min,
        max,
        usage,
    }
}

const fn member(name: &'static str, min: usize, max: usize, usage: &'static str) -> Function {
    Function {
        name,
        member: true,
        min,
        max,
        usage,
    }
}

/// Every function and macro, global ones first, each group by name.
pub static FUNCTIONS: &[Function] = &[
    // Macros.
    global("has", 1, 1, "`has(m.field)`"),
    member(
        "all",
        2,
        3,
        "`list.all(x, predicate)` or `m.all(k, v, predicate)`",
    ),
    member(
        "exists",
        2,
        3,
        "`list.exists(x, predicate)` or `m.exists(k, v, predicate)`",
    ),
    member(
        "exists_one",
        2,
        3,
        "`list.exists_one(x, predicate)` or `m.exists_one(k, v, predicate)`",
    ),
    member(
        "existsOne",
        2,
        3,
        "`list.existsOne(x, predicate)` or `m.existsOne(k, v, predicate)`",
    ),
    member("filter", 2, 2, "`list.filter(x, predicate)`"),
    member(
        "map",
        2,
        3,
        "`list.map(x, value)` or `list.map(x, predicate, value)`",
    ),
    member(
        "transformList",
        3,
        4,
        "`m.transformList(k, v, value)` or `m.transformList(k, v, predicate, value)`",
    ),
    member(
        "transformMap",
        3,
        4,
        "`m.transformMap(k, v, value)` or `m.transformMap(k, v, predicate, value)`",
    ),
    member(
        "transformMapEntry",
        3,
        4,
        "`m.transformMapEntry(k, v, {key: value})` or `m.transformMapEntry(k, v, predicate, {key: value})`",
    ),
    // Conversions and the standard library.
    global("bool", 1, 1, "`bool(x)`"),
    global("bytes", 1, 1, "`bytes(x)`"),
    global("double", 1, 1, "`double(x)`"),
    global("duration", 1, 1, "`duration('1h30m')`"),
    global("dyn", 1, 1, "`dyn(x)`"),
    global("file", 1, 1, "`file('data/scan.png')`"),
    global("int", 1, 1, "`int(x)`"),
    global("matches", 2, 2, "`matches(s, regex)`"),
    global("optional.none", 0, 0, "`optional.none()`"),
    global("optional.of", 1, 1, "`optional.of(x)`"),
    global("optional.ofNonZeroValue", 1, 1, "`optional.ofNonZeroValue(x)`"),
    global("size", 1, 1, "`size(x)`"),
    global("string", 1, 1, "`string(x)`"),
    global("timestamp", 1, 1, "`timestamp('2024-01-01T00:00:00Z')`"),
    global("type", 1, 1, "`type(x)`"),
    global("uint", 1, 1, "`uint(x)`"),
    member("contains", 1, 1, "`s.contains(sub)`"),
    member("endsWith", 1, 1, "`s.endsWith(suffix)`"),
    member("hasValue", 0, 0, "`opt.hasValue()`"),
    member("matches", 1, 1, "`s.matches(regex)`"),
    member("or", 1, 1, "`opt.or(other)`"),
    member("orValue", 1, 1, "`opt.orValue(default)`"),
    member("size", 0, 0, "`x.size()`"),
    member("startsWith", 1, 1, "`s.startsWith(prefix)`"),
    member("value", 0, 0, "`opt.value()`"),
    // Accessors of timestamps (an optional time zone) and durations.
    member("getDate", 0, 1, "`t.getDate()` or `t.getDate(tz)`"),
    member(
        "getDayOfMonth",
        0,
        1,
        "`t.getDayOfMonth()` or `t.getDayOfMonth(tz)`",
    ),
    member("getDayOfWeek", 0, 1, "`t.getDayOfWeek()` or `t.getDayOfWeek(tz)`"),
    member("getDayOfYear", 0, 1, "`t.getDayOfYear()` or `t.getDayOfYear(tz)`"),
    member("getFullYear", 0, 1, "`t.getFullYear()` or `t.getFullYear(tz)`"),
    member(
        "getHours",
        0,
        1,
        "`t.getHours()`, `t.getHours(tz)` or `d.getHours()`",
    ),
    member(
        "getMilliseconds",
        0,
        1,
        "`t.getMilliseconds()`, `t.getMilliseconds(tz)` or `d.getMilliseconds()`",
    ),
    member(
        "getMinutes",
        0,
        1,
        "`t.getMinutes()`, `t.getMinutes(tz)` or `d.getMinutes()`",
    ),
    member("getMonth", 0, 1, "`t.getMonth()` or `t.getMonth(tz)`"),
    member(
        "getSeconds",
        0,
        1,
        "`t.getSeconds()`, `t.getSeconds(tz)` or `d.getSeconds()`",
    ),
    // The strings extension.
    member("charAt", 1, 1, "`s.charAt(i)`"),
    member("format", 1, 1, "`'%s and %d'.format([a, b])`"),
    member("indexOf", 1, 2, "`s.indexOf(sub)` or `s.indexOf(sub, from)`"),
    member("join", 0, 1, "`list.join()` or `list.join(sep)`"),
    member(
        "lastIndexOf",
        1,
        2,
        "`s.lastIndexOf(sub)` or `s.lastIndexOf(sub, from)`",
    ),
    member("lowerAscii", 0, 0, "`s.lowerAscii()`"),
    member(
        "replace",
        2,
        3,
        "`s.replace(old, new)` or `s.replace(old, new, n)`",
    ),
    member("split", 1, 2, "`s.split(sep)` or `s.split(sep, n)`"),
    member(
        "substring",
        1,
        2,
        "`s.substring(start)` or `s.substring(start, end)`",
    ),
    member("trim", 0, 0, "`s.trim()`"),
    member("upperAscii", 0, 0, "`s.upperAscii()`"),
];

/// The names of CEL's types: each is a value (`type(x) == int`).
pub const TYPE_NAMES: &[&str] = &[
    "bool",
    "bytes",
    "double",
    "int",
    "list",
    "map",
    "null_type",
    "string",
    "type",
    "uint",
];

/// The qualified names of CEL's well-known types that expressions can name (`type(t) ==
/// google.protobuf.Timestamp`): a root and its fields.
pub const QUALIFIED_TYPE_NAMES: &[(&str, &[&str])] = &[
    ("google", &["protobuf", "Timestamp"]),
    ("google", &["protobuf", "Duration"]),
];

/// Whether a reference (a root and its static fields) names one of CEL's types.
pub fn is_type_name(root: &str, fields: &[String]) -> bool {
    (fields.is_empty() && TYPE_NAMES.contains(&root))
        || QUALIFIED_TYPE_NAMES
            .iter()
            .any(|(r, f)| *r == root && f.len() == fields.len() && f.iter().zip(fields).all(|(a, b)| a == b))
}

/// Namespaces of global functions: `optional.of(x)` is written as a call on `optional`.
pub const NAMESPACES: &[&str] = &["optional"];

/// What is wrong with a call, if anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// No function or macro of that name. `closest` is the nearest name called the same way.
    Unknown { closest: Option<&'static str> },
    /// It exists, but only called the other way (`x.int()`, `contains(a, b)`).
    WrongStyle(&'static Function),
    /// It is called the right way with an argument count it does not take.
    WrongCount(&'static Function),
}

/// Checks a call of `name`, on a receiver or not, with `args` arguments (the receiver not
/// counted). `None`: the call is one the table has.
pub fn check(name: &str, member: bool, args: usize) -> Option<Problem> {
    let same_name = || FUNCTIONS.iter().filter(move |f| f.name == name);
    let same_style = || same_name().filter(move |f| f.member == member);
    if same_style().any(|f| (f.min..=f.max).contains(&args)) {
        return None;
    }
    if let Some(f) = same_style().next() {
        return Some(Problem::WrongCount(f));
    }
    if let Some(f) = same_name().next() {
        return Some(Problem::WrongStyle(f));
    }
    let alias = ALIASES
        .iter()
        .find(|(other, _)| *other == name)
        .map(|(_, cel)| *cel);
    let candidates = FUNCTIONS.iter().filter(|f| f.member == member).map(|f| f.name);
    Some(Problem::Unknown {
        closest: alias.or_else(|| closest(name, candidates)),
    })
}

/// Names other languages give to functions CEL has under another name.
const ALIASES: &[(&str, &str)] = &[
    ("includes", "contains"),
    ("len", "size"),
    ("length", "size"),
    ("lower", "lowerAscii"),
    ("lowerCase", "lowerAscii"),
    ("lowercase", "lowerAscii"),
    ("strip", "trim"),
    ("toLower", "lowerAscii"),
    ("toLowerCase", "lowerAscii"),
    ("toUpper", "upperAscii"),
    ("toUpperCase", "upperAscii"),
    ("upper", "upperAscii"),
    ("upperCase", "upperAscii"),
    ("uppercase", "upperAscii"),
];

/// The candidate nearest to `name`, as `diag::did_you_mean` picks it.
fn closest(name: &str, candidates: impl Iterator<Item = &'static str>) -> Option<&'static str> {
    crate::diag::closest(name, candidates)
}

/// How many arguments `f` takes, in words: "no arguments", "1 argument", "1 or 2 arguments".
pub fn arity(f: &Function) -> String {
    let noun = |n: usize| if n == 1 { "argument" } else { "arguments" };
    match (f.min, f.max) {
        (0, 0) => "no arguments".to_owned(),
        (a, b) if a == b => format!("{a} {}", noun(a)),
        (a, b) if b == a + 1 => format!("{a} or {b} {}", noun(b)),
        (a, b) => format!("{a} to {b} {}", noun(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_checked_by_style_and_count() {
        assert_eq!(check("size", false, 1), None);
        assert_eq!(check("size", true, 0), None);
        assert_eq!(check("split", true, 1), None);
        assert_eq!(check("split", true, 2), None);
        assert_eq!(check("getHours", true, 1), None);
        assert!(matches!(check("split", true, 3), Some(Problem::WrongCount(f)) if f.name == "split"));
        assert!(matches!(check("size", false, 2), Some(Problem::WrongCount(f)) if !f.member));
        assert!(matches!(check("contains", false, 2), Some(Problem::WrongStyle(f)) if f.member));
        assert!(matches!(check("int", true, 0), Some(Problem::WrongStyle(f)) if !f.member));
        assert_eq!(
            check("splt", true, 1),
            Some(Problem::Unknown {
                closest: Some("split")
            })
        );
        assert_eq!(
            check("toLowerCase", true, 0),
            Some(Problem::Unknown {
                closest: Some("lowerAscii")
            })
        );
        assert_eq!(check("xyzzy", true, 0), Some(Problem::Unknown { closest: None }));
        assert_eq!(
            check("timestmp", false, 1),
            Some(Problem::Unknown {
                closest: Some("timestamp")
            })
        );
    }

    #[test]
    fn arities_read_as_words() {
        let f = |name: &str, member: bool| {
            FUNCTIONS
                .iter()
                .find(|f| f.name == name && f.member == member)
                .expect("in the table")
        };
        assert_eq!(arity(f("trim", true)), "no arguments");
        assert_eq!(arity(f("charAt", true)), "1 argument");
        assert_eq!(arity(f("split", true)), "1 or 2 arguments");
        assert_eq!(arity(f("map", true)), "2 or 3 arguments");
        assert_eq!(arity(f("transformMap", true)), "3 or 4 arguments");
    }

    /// Every function of the table that the runtime implements can be called with every
    /// argument count the table allows (the arguments are of the wrong types here, so a call
    /// fails with "no matching overload" at worst, never "unknown function").
    #[test]
    fn the_table_matches_the_runtime() {
        use crate::expr::eval::{Vars, eval};
        let pending = [
            "timestamp",
            "duration",
            "getDate",
            "getDayOfMonth",
            "getDayOfWeek",
            "getDayOfYear",
            "getFullYear",
            "getHours",
            "getMilliseconds",
            "getMinutes",
            "getMonth",
            "getSeconds",
        ];
        let macros = [
            "has",
            "all",
            "exists",
            "exists_one",
            "existsOne",
            "filter",
            "map",
            "transformList",
            "transformMap",
            "transformMapEntry",
        ];
        for f in FUNCTIONS {
            if pending.contains(&f.name) || macros.contains(&f.name) {
                continue;
            }
            for n in f.min..=f.max {
                let args = vec!["null"; n].join(", ");
                let text = if f.member {
                    format!("null.{}({args})", f.name)
                } else {
                    format!("{}({args})", f.name)
                };
                let e = crate::expr::parse(&text).expect("parses");
                if let Err(err) = eval(&e, &Vars::default()) {
                    assert!(
                        !err.message.contains("undeclared") && !err.message.contains("unknown"),
                        "`{text}`: {}",
                        err.message
                    );
                }
            }
        }
    }
}
