//! The strings extension of cel-go (`ext.Strings()`), registered on the root CEL environment
//! by [`register`]: `charAt`, `indexOf`, `lastIndexOf`, `lowerAscii`, `upperAscii`, `replace`,
//! `split`, `substring`, `trim`, `join` and `format` (SPEC §5.1).
//!
//! Semantics are cel-go's, function by function (its documentation and tests), not the `cel`
//! crate's own extension, which differs where an empty search string meets an offset. Indices
//! and offsets count code points, not bytes. Receivers and arguments are any CEL `string` or
//! `list`, so JSON strings and arrays read lazily from the payload take part without being
//! copied first. This module knows nothing of flows, variables or JSON.

use cel::common::types::{self as cel_types, CelInt, CelList, CelString};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

mod format;

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
    env.add_member_overload("format", "sy_string_format_list", S, vec![L], format::format)?;
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

/// The longest string `replace`, `join` and `format` build, in bytes: twice the payload's
/// default limit, so that a value the payload can hold can be built, and a few calls
/// (`s.replace('x', s)` of `s.replace('x', s)`) cannot take the machine's memory.
pub const MAX_STRING_BYTES: usize = 16 << 20;

/// An error when a string of `len` bytes would be longer than [`MAX_STRING_BYTES`].
fn check_size(function: &str, len: usize) -> Result<(), ExecutionError> {
    if len > MAX_STRING_BYTES {
        return Err(fail(
            function,
            format!(
                "the result would be {len} bytes, longer than the {} MiB a string may hold",
                MAX_STRING_BYTES >> 20
            ),
        ));
    }
    Ok(())
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
    if new.len() > old.len() {
        // The length of the result, worked out before it is built.
        let limit = usize::try_from(n).unwrap_or(usize::MAX);
        let found = if old.is_empty() {
            s.chars().count() + 1
        } else {
            s.matches(old).take(limit).count()
        }
        .min(limit);
        let grows = (new.len() - old.len()).saturating_mul(found);
        check_size("replace", s.len().saturating_add(grows))?;
    }
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
        check_size("join", out.len() + s.inner().len())?;
        out.push_str(s.inner());
    }
    string_out(out)
}

#[cfg(test)]
mod tests {
    //! Expected values are cel-go's: the examples of its strings extension documentation and
    //! the cases of its `ext/strings_test.go` and `ext/formatting_v2_test.go`.

    use std::sync::{Arc, LazyLock};

    use cel::{Context, Env};

    pub(super) fn ctx() -> &'static Context<'static, 'static> {
        static CTX: LazyLock<Context<'static, 'static>> = LazyLock::new(|| {
            let mut env = Env::stdlib();
            super::register(&mut env).expect("registers once");
            crate::expr::time::register(&mut env);
            Context::with_env(Arc::new(env))
        });
        &CTX
    }

    pub(super) fn eval(text: &str) -> Result<cel::Value, String> {
        let e = crate::expr::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        cel::Value::resolve(e.ast(), ctx()).map_err(|e| match e {
            cel::ExecutionError::FunctionError { message, .. } => message,
            other => other.to_string(),
        })
    }

    #[track_caller]
    pub(super) fn yes(text: &str) {
        assert_eq!(eval(text), Ok(cel::Value::Bool(true)), "{text}");
    }

    #[track_caller]
    pub(super) fn is(text: &str, want: &str) {
        assert_eq!(
            eval(text),
            Ok(cel::Value::String(Arc::new(want.to_owned()))),
            "{text}"
        );
    }

    #[track_caller]
    pub(super) fn fails(text: &str, message: &str) {
        match eval(text) {
            Err(m) => assert!(m.contains(message), "{text}: {m}"),
            Ok(v) => panic!("{text}: got {v:?}, wanted an error {message:?}"),
        }
    }

    #[test]
    fn strings_longer_than_the_cap_are_refused_before_they_are_built() {
        // 4,096 bytes, replaced into itself three times, would be 2^48 bytes.
        let x = "'x'.replace('', 'xxxxxxxxxxxxxxx', 1)";
        let big = format!("{x}.replace('x', {x}).replace('x', {x})");
        yes(&format!("size({big}) == 4096"));
        let huge = format!("{big}.replace('x', {big})");
        fails(
            &format!("size({huge}.replace('x', {huge}).replace('x', {huge}))"),
            "longer than the 16 MiB a string may hold",
        );
        fails(&format!("size({big}.replace('', {big}))"), "16 MiB");
        // Right at the cap: 4,096 × 4,096 is 16 MiB exactly.
        yes(&format!("size({big}.replace('x', {big})) == 16777216"));
        fails(&format!("size([{huge}, {huge}].join())"), "16 MiB");
        fails(&format!("size('%s%s'.format([{huge}, {huge}]))"), "16 MiB");
        yes(&format!("size('%s'.format([{huge}])) == 16777216"));
        // Shrinking or equal-length replacements are not counted.
        yes(&format!("size({huge}.replace('x', 'y')) == 16777216"));
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
