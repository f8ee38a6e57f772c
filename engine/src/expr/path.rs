//! JSONPath (RFC 9535) queries, parsed once and applied many times.
//!
//! This module owns [`Path`]: the query text, the parsed query, and — when the query is
//! *singular* (only name and index selectors, like `$.a.b`, `$.a[2]`, `$['odd key']`, with no
//! blank space inside the brackets) — its
//! [`Seg`]ments, so reads ([`Path::get`]) and writes ([`Path::set`]) walk a document directly
//! without the query engine. It also owns the small helpers that messages and lint need:
//! [`nearest_key`] ("did you mean `$.ticket.body`?") and [`write_paths_overlap`]. It knows
//! nothing of flows, steps or YAML: errors carry byte offsets inside the path text, which
//! callers turn into spans in the file.

use std::fmt;

use serde_json::{Map, Value};
use serde_json_path::JsonPath;

/// One step of a singular path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Seg {
    /// `.name` or `['name']`: a member of an object.
    Key(String),
    /// `[n]`: an element of an array; negative counts from the end.
    Index(i64),
}

/// A parsed JSONPath query.
#[derive(Clone, Debug)]
pub struct Path {
    text: String,
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    /// Only name and index selectors: walked directly, no query engine needed.
    Singular(Vec<Seg>),
    Query(JsonPath),
}

/// A JSONPath syntax error: `start..end` are byte offsets inside the path text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PathError {
    pub start: usize,
    pub end: usize,
    pub message: String,
}

/// Why [`Path::set`] could not write. `segment` is the index of the failing [`Seg`]; `at` is
/// the path of the value that was in the way.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    #[error("`{path}` is not a singular path; only names and indexes can be written")]
    NotSingular { path: String },
    #[error("`{path}`: `{at}` is {found}, not {expected}")]
    WrongType {
        path: String,
        segment: usize,
        at: String,
        found: &'static str,
        expected: &'static str,
    },
    #[error("`{path}`: index {index} is out of range for `{at}` (length {len})")]
    OutOfRange {
        path: String,
        segment: usize,
        at: String,
        index: i64,
        len: usize,
    },
}

/// Parses a JSONPath query. Errors point at the offending bytes of `text`.
///
/// Singular paths are recognised by a strict scanner of their RFC 9535 grammar (ten times
/// faster than the general parser); everything else goes to `serde_json_path`.
pub fn parse(text: &str) -> Result<Path, PathError> {
    let kind = match singular_segments(text) {
        Some(segs) => Kind::Singular(segs),
        None => {
            Kind::Query(JsonPath::parse(text).map_err(|e| describe_error(text, e.position(), e.message()))?)
        }
    };
    Ok(Path {
        text: text.to_owned(),
        kind,
    })
}

impl Path {
    /// The path as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the query names at most one value (only name and index selectors).
    pub fn is_singular(&self) -> bool {
        matches!(self.kind, Kind::Singular(_))
    }

    /// The segments of a singular path (`$` alone has none); `None` otherwise.
    pub fn segments(&self) -> Option<&[Seg]> {
        match &self.kind {
            Kind::Singular(segs) => Some(segs),
            Kind::Query(_) => None,
        }
    }

    /// Every value the query matches, in document order.
    pub fn query<'a>(&self, v: &'a Value) -> Vec<&'a Value> {
        match &self.kind {
            Kind::Singular(segs) => walk(v, segs).into_iter().collect(),
            Kind::Query(q) => q.query(v).all(),
        }
    }

    /// The value at a singular path, walking the segments directly; negative indexes count
    /// from the end. For a non-singular path, its first match.
    pub fn get<'a>(&self, v: &'a Value) -> Option<&'a Value> {
        match &self.kind {
            Kind::Singular(segs) => walk(v, segs),
            Kind::Query(q) => q.query(v).first(),
        }
    }

    /// Writes `value` at a singular path. `$` replaces the root.
    ///
    /// Missing containers are created on the way: a missing (or `null`) value becomes `{}` for a
    /// name segment and `[]` for an index segment. An index may address an existing element
    /// (negative counts from the end) or equal the array's length, which appends; anything else
    /// is [`SetError::OutOfRange`]. Writing through a value of the wrong kind (a string, or an
    /// array where a name follows) is [`SetError::WrongType`]. On error `root` is unchanged.
    pub fn set(&self, root: &mut Value, value: Value) -> Result<(), SetError> {
        let Kind::Singular(segs) = &self.kind else {
            return Err(SetError::NotSingular {
                path: self.text.clone(),
            });
        };
        self.check_set(segs, root)?;
        let mut cur = root;
        for (i, seg) in segs.iter().enumerate() {
            if cur.is_null() {
                *cur = match seg {
                    Seg::Key(_) => Value::Object(Map::new()),
                    Seg::Index(_) => Value::Array(Vec::new()),
                };
            }
            cur = match (seg, cur) {
                (Seg::Key(k), Value::Object(map)) => {
                    if !map.contains_key(k) {
                        map.insert(k.clone(), Value::Null);
                    }
                    match map.get_mut(k) {
                        Some(v) => v,
                        None => return Err(self.wrong_type(segs, i, &Value::Null)),
                    }
                }
                (Seg::Index(n), Value::Array(items)) => {
                    let len = items.len();
                    let idx = if usize::try_from(*n).is_ok_and(|n| n == len) {
                        items.push(Value::Null);
                        len
                    } else {
                        match resolve_index(*n, len) {
                            Some(idx) => idx,
                            None => return Err(self.out_of_range(segs, i, *n, len)),
                        }
                    };
                    &mut items[idx]
                }
                (_, other) => return Err(self.wrong_type(segs, i, other)),
            };
        }
        *cur = value;
        Ok(())
    }

    /// The read-only dry run of [`set`](Self::set), so a failed write changes nothing.
    fn check_set(&self, segs: &[Seg], root: &Value) -> Result<(), SetError> {
        // `None`: the container at this level does not exist yet and will be created empty.
        let mut cur = Some(root);
        for (i, seg) in segs.iter().enumerate() {
            cur = match (seg, cur) {
                (Seg::Key(_), None | Some(Value::Null)) => None,
                (Seg::Index(n), None | Some(Value::Null)) if *n == 0 => None,
                (Seg::Index(n), None | Some(Value::Null)) => {
                    return Err(self.out_of_range(segs, i, *n, 0));
                }
                (Seg::Key(k), Some(Value::Object(map))) => map.get(k),
                (Seg::Index(n), Some(Value::Array(items))) => {
                    let len = items.len();
                    if usize::try_from(*n).is_ok_and(|n| n == len) {
                        None
                    } else {
                        match resolve_index(*n, len) {
                            Some(idx) => items.get(idx),
                            None => return Err(self.out_of_range(segs, i, *n, len)),
                        }
                    }
                }
                (_, Some(other)) => return Err(self.wrong_type(segs, i, other)),
            };
        }
        Ok(())
    }

    fn wrong_type(&self, segs: &[Seg], i: usize, found: &Value) -> SetError {
        SetError::WrongType {
            path: self.text.clone(),
            segment: i,
            at: format_path(&segs[..i]),
            found: type_name(found),
            expected: match segs[i] {
                Seg::Key(_) => "an object",
                Seg::Index(_) => "an array",
            },
        }
    }

    fn out_of_range(&self, segs: &[Seg], i: usize, index: i64, len: usize) -> SetError {
        SetError::OutOfRange {
            path: self.text.clone(),
            segment: i,
            at: format_path(&segs[..i]),
            index,
            len,
        }
    }
}

impl PartialEq for Path {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// For a singular `path` that matches nothing in `root`: the same path with each missing name
/// replaced by the closest existing key at its level (by edit distance), when every level can
/// be repaired that way and the result exists — for messages like "`$.ticket.bdy` matched
/// nothing; did you mean `$.ticket.body`?". `None` when the path matches, is not singular, or
/// has no close match.
pub fn nearest_key(root: &Value, path: &Path) -> Option<String> {
    let segs = path.segments()?;
    let mut fixed = Vec::with_capacity(segs.len());
    let mut changed = false;
    let mut cur = root;
    for seg in segs {
        cur = match (seg, cur) {
            (Seg::Key(k), Value::Object(map)) => match map.get(k) {
                Some(v) => {
                    fixed.push(seg.clone());
                    v
                }
                None => {
                    let (key, v) = closest_key(k, map)?;
                    fixed.push(Seg::Key(key.to_owned()));
                    changed = true;
                    v
                }
            },
            (Seg::Index(n), Value::Array(items)) => {
                fixed.push(seg.clone());
                items.get(resolve_index(*n, items.len())?)?
            }
            _ => return None,
        };
    }
    changed.then(|| format_path(&fixed))
}

/// Whether two singular destinations may write the same value: one is a prefix of the other.
/// Indexes of different signs (`[0]` and `[-1]`) may name the same element, so they overlap.
pub fn write_paths_overlap(a: &[Seg], b: &[Seg]) -> bool {
    a.iter().zip(b).all(|pair| match pair {
        (Seg::Key(x), Seg::Key(y)) => x == y,
        (Seg::Index(x), Seg::Index(y)) => x == y || (*x < 0) != (*y < 0),
        _ => false,
    })
}

/// Formats segments as a path: `.name` where the name allows it, else `['name']`.
pub fn format_path(segs: &[Seg]) -> String {
    let mut out = String::from("$");
    for seg in segs {
        match seg {
            Seg::Key(k) if is_shorthand_name(k) => {
                out.push('.');
                out.push_str(k);
            }
            Seg::Key(k) => {
                out.push_str("['");
                for c in k.chars() {
                    match c {
                        '\'' => out.push_str("\\'"),
                        '\\' => out.push_str("\\\\"),
                        '\u{8}' => out.push_str("\\b"),
                        '\u{c}' => out.push_str("\\f"),
                        '\n' => out.push_str("\\n"),
                        '\r' => out.push_str("\\r"),
                        '\t' => out.push_str("\\t"),
                        c if c < ' ' => out.push_str(&format!("\\u{:04x}", c as u32)),
                        c => out.push(c),
                    }
                }
                out.push_str("']");
            }
            Seg::Index(i) => {
                out.push('[');
                out.push_str(&i.to_string());
                out.push(']');
            }
        }
    }
    out
}

fn walk<'a>(mut v: &'a Value, segs: &[Seg]) -> Option<&'a Value> {
    for seg in segs {
        v = match (seg, v) {
            (Seg::Key(k), Value::Object(map)) => map.get(k)?,
            (Seg::Index(n), Value::Array(items)) => items.get(resolve_index(*n, items.len())?)?,
            _ => return None,
        };
    }
    Some(v)
}

/// The position of index `n` in an array of `len` elements; negative counts from the end.
pub fn resolve_index(n: i64, len: usize) -> Option<usize> {
    if n >= 0 {
        usize::try_from(n).ok().filter(|&i| i < len)
    } else {
        len.checked_sub(usize::try_from(n.unsigned_abs()).ok()?)
    }
}

/// What kind of JSON value `v` is, for messages: "a string", "an object", ...
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn is_name_first(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || !c.is_ascii()
}

fn is_shorthand_name(k: &str) -> bool {
    let mut chars = k.chars();
    chars.next().is_some_and(is_name_first) && chars.all(|c| is_name_first(c) || c.is_ascii_digit())
}

/// The key of `map` closest to `key`, if close enough to be a likely typo.
fn closest_key<'a>(key: &str, map: &'a Map<String, Value>) -> Option<(&'a str, &'a Value)> {
    let limit = key.chars().count().max(3) / 3;
    let mut best: Option<(usize, &str, &Value)> = None;
    let mut row = Vec::new();
    for (candidate, v) in map {
        let d = if candidate.eq_ignore_ascii_case(key) {
            0
        } else {
            edit_distance(key, candidate, &mut row)
        };
        if d <= limit && best.is_none_or(|(bd, _, _)| d < bd) {
            best = Some((d, candidate, v));
        }
    }
    best.map(|(_, k, v)| (k, v))
}

/// Levenshtein distance over characters; `row` is a reusable buffer.
fn edit_distance(a: &str, b: &str, row: &mut Vec<usize>) -> usize {
    row.clear();
    row.extend(0..=b.chars().count());
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.chars().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diag + usize::from(ca != cb));
            diag = above;
        }
    }
    row[row.len() - 1]
}

/// The segments of `text` when it is a valid singular query, by RFC 9535's grammar:
/// `$`, then `.name` or `['name']` / `["name"]` / `[int]` segments, with blank space allowed
/// before a segment but not inside its brackets (§2.3.5.1: a `name-segment` is `[` right
/// before its selector and `]` right after it; `$[ 'a']` is a bracketed selection, a valid
/// query that is not singular). `None` for anything else, valid or not, which the general
/// parser then handles.
fn singular_segments(text: &str) -> Option<Vec<Seg>> {
    let b = text.as_bytes();
    if b.first() != Some(&b'$') {
        return None;
    }
    let mut i = 1;
    let mut segs = Vec::new();
    loop {
        let before = i;
        i = skip_space(b, i);
        match b.get(i) {
            // Blank space must be followed by a segment.
            None if i == before => return Some(segs),
            Some(b'.') => {
                i += 1;
                let start = i;
                if !b
                    .get(i)
                    .is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_' || c >= 0x80)
                {
                    return None; // `..`, `.*`, `.1`
                }
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] >= 0x80) {
                    i += 1;
                }
                segs.push(Seg::Key(text.get(start..i)?.to_owned()));
            }
            Some(b'[') => {
                i += 1;
                let seg = match *b.get(i)? {
                    q @ (b'\'' | b'"') => {
                        let (name, next) = unquote(text, i + 1, q)?;
                        i = next;
                        Seg::Key(name)
                    }
                    b'-' | b'0'..=b'9' => {
                        let (index, next) = int(b, i)?;
                        i = next;
                        Seg::Index(index)
                    }
                    _ => return None, // wildcard, filter, blank space
                };
                if b.get(i) != Some(&b']') {
                    return None; // several selectors, a slice, blank space
                }
                i += 1;
                segs.push(seg);
            }
            _ => return None,
        }
    }
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// An RFC 9535 `int` at byte `i` (`0`, or an optional `-` and digits without a leading zero,
/// within ±(2⁵³−1)), and the index after it.
fn int(b: &[u8], mut i: usize) -> Option<(i64, usize)> {
    const MAX: i64 = (1 << 53) - 1;
    let start = i;
    if b[i] == b'0' {
        return Some((0, i + 1));
    }
    if b[i] == b'-' {
        i += 1;
    }
    if !b.get(i).is_some_and(|c| (b'1'..=b'9').contains(c)) {
        return None;
    }
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let n: i64 = std::str::from_utf8(&b[start..i]).ok()?.parse().ok()?;
    (-MAX..=MAX).contains(&n).then_some((n, i))
}

/// Decodes a quoted name starting at byte `i` (after the opening quote); returns the name and
/// the index after the closing quote. Only the escapes RFC 9535 allows are accepted: the
/// other quote character is written as itself, control characters are escaped.
fn unquote(text: &str, i: usize, quote: u8) -> Option<(String, usize)> {
    let quote = char::from(quote);
    let mut out = String::new();
    let mut chars = text.get(i..)?.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            c if c == quote => return Some((out, i + at + 1)),
            '\\' => {
                let (_, e) = chars.next()?;
                out.push(match e {
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    '/' | '\\' => e,
                    e if e == quote => e,
                    'u' => {
                        let hi = hex4(&mut chars)?;
                        if (0xD800..0xDC00).contains(&hi) {
                            let (_, bs) = chars.next()?;
                            let (_, u) = chars.next()?;
                            if bs != '\\' || u != 'u' {
                                return None;
                            }
                            let lo = hex4(&mut chars)?;
                            if !(0xDC00..0xE000).contains(&lo) {
                                return None;
                            }
                            char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?
                        } else {
                            char::from_u32(hi)? // a lone low surrogate is not a char
                        }
                    }
                    _ => return None,
                });
            }
            c if c < ' ' => return None,
            c => out.push(c),
        }
    }
    None
}

fn hex4(chars: &mut std::str::CharIndices<'_>) -> Option<u32> {
    let mut n = 0;
    for _ in 0..4 {
        n = n * 16 + chars.next()?.1.to_digit(16)?;
    }
    Some(n)
}

/// Turns the JSONPath parser's error (a byte position and a generic message) into a terse
/// message and the byte range it concerns.
fn describe_error(text: &str, pos: usize, raw: &str) -> PathError {
    let pos = floor_char_boundary(text, pos.min(text.len()));
    // The character at `pos`, or the last one when the error is at the end.
    let (start, end) = match text[pos..].chars().next() {
        Some(c) => (pos, pos + c.len_utf8()),
        None => match text.chars().next_back() {
            Some(c) => (text.len() - c.len_utf8(), text.len()),
            None => (0, 0),
        },
    };
    let found = || match text[pos..].chars().next() {
        None => "unexpected end of path".to_owned(),
        Some(c) if c.is_whitespace() => "unexpected space".to_owned(),
        Some(c) => format!("unexpected `{c}`"),
    };
    let err = |start, end, message: String| PathError { start, end, message };
    if text.is_empty() {
        return err(0, 0, "empty path; a path starts with `$`".into());
    }
    if !text.starts_with('$') {
        return err(
            0,
            text.chars().next().map_or(0, char::len_utf8),
            "a path starts with `$`".into(),
        );
    }
    let before = &text[..pos];
    let message = if raw.contains("must start with") {
        if before.ends_with("..") {
            "expected a name, `*` or `[` after `..`".to_owned()
        } else if text[pos..].starts_with(|c: char| c.is_ascii_digit()) {
            "expected a name after `.`; use `[n]` for an index".to_owned()
        } else {
            "expected a name or `*` after `.`".to_owned()
        }
    } else if raw.contains("ending quote") {
        "unterminated string or invalid escape".to_owned()
    } else if raw.contains("closing ']'") {
        if pos >= text.len() {
            "missing `]`".to_owned()
        } else {
            format!("{} in `[...]`", found())
        }
    } else if text[pos..].starts_with('[') {
        "invalid selector in `[...]`".to_owned()
    } else {
        found()
    };
    err(start, end, message)
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(text: &str) -> Path {
        parse(text).expect("valid path")
    }

    fn key(k: &str) -> Seg {
        Seg::Key(k.into())
    }

    #[test]
    fn singular_paths_have_segments() {
        assert_eq!(p("$").segments(), Some(&[][..]));
        assert_eq!(p("$.a.b").segments(), Some(&[key("a"), key("b")][..]));
        assert_eq!(p("$.a[2]").segments(), Some(&[key("a"), Seg::Index(2)][..]));
        assert_eq!(p("$['odd key']").segments(), Some(&[key("odd key")][..]));
        assert_eq!(p(r#"$["x"][0]"#).segments(), Some(&[key("x"), Seg::Index(0)][..]));
        assert_eq!(p("$ [-1]").segments(), Some(&[Seg::Index(-1)][..]));
        assert_eq!(p("$.é_1").segments(), Some(&[key("é_1")][..]));
        assert_eq!(p(r"$['it\'s']").segments(), Some(&[key("it's")][..]));
        assert_eq!(
            p(r#"$["a\"b\\c\u00e9\uD83D\uDE00"]"#).segments(),
            Some(&[key("a\"b\\cé😀")][..])
        );
    }

    /// The singular scanner accepts exactly what the general parser accepts (and reads the
    /// same values), on a corpus of near-misses.
    #[test]
    fn singular_scanner_agrees_with_the_general_parser() {
        let doc = json!({"a": {"b": [10, 20, {"c": 1}]}, "x y": 2, "it's": 3, "q\"": 4, "é": 5,
            "_": 6, "a1": 7, "\n": 8, "😀": 9});
        let corpus = [
            "$",
            "$.a",
            "$.a.b",
            "$.a.b[0]",
            "$.a.b[-1]",
            "$.a.b[2].c",
            "$ .a",
            "$\n.a",
            "$.a [0]",
            "$['x y']",
            "$[ 'x y' ]",
            r#"$["x y"]"#,
            r"$['it\'s']",
            r#"$["it's"]"#,
            r#"$['q"']"#,
            r#"$["q\""]"#,
            r"$['\u00e9']",
            r"$['\uD83D\uDE00']",
            r"$['\n']",
            "$._",
            "$.a1",
            "$.é",
            "$[0]",
            "$[-0]",
            "$[01]",
            "$[-01]",
            "$[9007199254740991]",
            "$[9007199254740992]",
            "$[-9007199254740991]",
            "$.a ",
            "$ ",
            " $.a",
            "$.",
            "$..a",
            "$.1",
            "$.a.",
            "$[]",
            "$['a'",
            "$['a',]",
            "$[\"x\"",
            r#"$["it\'s"]"#,
            r#"$['q\"']"#,
            r"$['\x']",
            r"$['\uDE00']",
            r"$['\uD83D']",
            r"$['\uD83Dx']",
            "$['tab\there']",
            "$[1:2]",
            "$['a','b']",
            "$[*]",
            "$.*",
            "$[?@.a]",
            "$.a-b",
            "$$",
            "@.a",
            "$[ 0 ]",
            "$[\t0\r]",
            "$[ 'a']",
            "$['x y' ]",
            "$.a\t.b",
        ];
        for text in corpus {
            let general = JsonPath::parse(text);
            match singular_segments(text) {
                Some(segs) => {
                    let general = general.unwrap_or_else(|e| panic!("{text:?}: {e}"));
                    assert_eq!(walk(&doc, &segs), general.query(&doc).first(), "{text:?}");
                }
                // Valid but not singular, or invalid.
                None if general.is_ok() => {
                    let blank_in_brackets = ["[ ", "[\t", "[\n", "[\r", " ]", "\t]", "\n]", "\r]"]
                        .iter()
                        .any(|b| text.contains(b));
                    assert!(
                        text.contains(['*', ',', ':', '?']) || text.contains("..") || blank_in_brackets,
                        "{text:?}"
                    );
                }
                None => assert!(parse(text).is_err(), "{text:?}"),
            }
        }
    }

    #[test]
    fn other_queries_are_not_singular() {
        for text in [
            // Blank space inside brackets makes a bracketed selection (RFC 9535 §2.3.5.1).
            "$[ 'a']",
            "$['a' ]",
            "$[ 0 ]",
            "$.x[\t-1]",
            "$.*",
            "$..a",
            "$[*]",
            "$[0,1]",
            "$['a','b']",
            "$[1:2]",
            "$[?@.a]",
            "$.a[-1:]",
        ] {
            assert!(!p(text).is_singular(), "{text}");
        }
    }

    #[test]
    fn errors_point_into_the_text() {
        let e = parse("$.").unwrap_err();
        assert_eq!(
            (e.start, e.end, e.message.as_str()),
            (1, 2, "expected a name or `*` after `.`")
        );
        let e = parse("$.a.1b").unwrap_err();
        assert_eq!((e.start, e.end), (4, 5));
        assert!(e.message.contains("use `[n]`"), "{}", e.message);
        let e = parse("a.b").unwrap_err();
        assert_eq!(
            (e.start, e.end, e.message.as_str()),
            (0, 1, "a path starts with `$`")
        );
        let e = parse("$['a'").unwrap_err();
        assert_eq!(e.message, "missing `]`");
        let e = parse("$.a b").unwrap_err();
        assert_eq!((e.start, e.end, e.message.as_str()), (3, 4, "unexpected space"));
        let e = parse("$..").unwrap_err();
        assert_eq!(e.message, "expected a name, `*` or `[` after `..`");
        assert_eq!(
            parse("").unwrap_err().message,
            "empty path; a path starts with `$`"
        );
        let e = parse("$['\\x']").unwrap_err();
        assert!(e.start <= e.end && e.end <= 7);
    }

    #[test]
    fn get_and_query() {
        let doc = json!({"a": {"b": [1, 2, 3]}, "odd key": true, "items": [{"id": 1}, {"id": 2}]});
        assert_eq!(p("$.a.b[0]").get(&doc), Some(&json!(1)));
        assert_eq!(p("$.a.b[-1]").get(&doc), Some(&json!(3)));
        assert_eq!(p("$.a.b[-4]").get(&doc), None);
        assert_eq!(p("$.a.b[3]").get(&doc), None);
        assert_eq!(p("$['odd key']").get(&doc), Some(&json!(true)));
        assert_eq!(p("$.a.x").get(&doc), None);
        assert_eq!(p("$.a.b.c").get(&doc), None);
        assert_eq!(p("$").get(&doc), Some(&doc));
        assert_eq!(p("$.items[*].id").query(&doc), vec![&json!(1), &json!(2)]);
        assert_eq!(p("$.items[*].id").get(&doc), Some(&json!(1)));
        assert_eq!(p("$.a.b[1]").query(&doc), vec![&json!(2)]);
        assert!(p("$.nope").query(&doc).is_empty());
    }

    #[test]
    fn set_creates_missing_objects_and_appends() {
        let mut doc = json!({"a": {"keep": 1}, "n": null, "list": [0]});
        p("$.a.b.c").set(&mut doc, json!("x")).unwrap();
        p("$.n.m").set(&mut doc, json!(1)).unwrap();
        p("$.list[1]").set(&mut doc, json!(1)).unwrap();
        p("$.list[-2]").set(&mut doc, json!(9)).unwrap();
        p("$.fresh[0].id").set(&mut doc, json!(7)).unwrap();
        assert_eq!(
            doc,
            json!({"a": {"keep": 1, "b": {"c": "x"}}, "n": {"m": 1}, "list": [9, 1], "fresh": [{"id": 7}]})
        );
        p("$").set(&mut doc, json!([1])).unwrap();
        assert_eq!(doc, json!([1]));
    }

    #[test]
    fn set_errors_name_the_segment_and_change_nothing() {
        let mut doc = json!({"a": "text", "list": [1]});
        let before = doc.clone();
        let e = p("$.a.b").set(&mut doc, json!(1)).unwrap_err();
        assert_eq!(e.to_string(), "`$.a.b`: `$.a` is a string, not an object");
        let e = p("$.list[3]").set(&mut doc, json!(1)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`$.list[3]`: index 3 is out of range for `$.list` (length 1)"
        );
        let e = p("$.new.deep[2]").set(&mut doc, json!(1)).unwrap_err();
        assert!(
            matches!(
                e,
                SetError::OutOfRange {
                    segment: 2,
                    len: 0,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = p("$.list.x").set(&mut doc, json!(1)).unwrap_err();
        assert_eq!(e.to_string(), "`$.list.x`: `$.list` is an array, not an object");
        let e = p("$[0]").set(&mut doc, json!(1)).unwrap_err();
        assert!(matches!(
            e,
            SetError::WrongType {
                segment: 0,
                expected: "an array",
                ..
            }
        ));
        let e = p("$..a").set(&mut doc, json!(1)).unwrap_err();
        assert!(matches!(e, SetError::NotSingular { .. }));
        assert_eq!(doc, before);
    }

    #[test]
    fn nearest_key_repairs_typos() {
        let doc = json!({"ticket": {"body": "hi", "id": 3, "odd key": 1}, "items": [{"name": 1}]});
        assert_eq!(
            nearest_key(&doc, &p("$.ticket.bdy")).as_deref(),
            Some("$.ticket.body")
        );
        assert_eq!(
            nearest_key(&doc, &p("$.tickt.bdy")).as_deref(),
            Some("$.ticket.body")
        );
        assert_eq!(nearest_key(&doc, &p("$.Ticket")).as_deref(), Some("$.ticket"));
        assert_eq!(
            nearest_key(&doc, &p("$.ticket.odd_key")).as_deref(),
            Some("$.ticket['odd key']")
        );
        assert_eq!(
            nearest_key(&doc, &p("$.items[0].nam")).as_deref(),
            Some("$.items[0].name")
        );
        assert_eq!(nearest_key(&doc, &p("$.ticket.zzzzzz")), None);
        assert_eq!(nearest_key(&doc, &p("$.ticket.body")), None);
        assert_eq!(nearest_key(&doc, &p("$.items[5].name")), None);
        assert_eq!(nearest_key(&doc, &p("$..body")), None);
    }

    #[test]
    fn overlapping_writes() {
        let segs = |t: &str| p(t).segments().expect("singular").to_vec();
        assert!(write_paths_overlap(&segs("$.a"), &segs("$.a.b")));
        assert!(write_paths_overlap(&segs("$.a.b"), &segs("$.a")));
        assert!(write_paths_overlap(&segs("$"), &segs("$.x")));
        assert!(write_paths_overlap(&segs("$.a[0]"), &segs("$.a[-1]")));
        assert!(!write_paths_overlap(&segs("$.a.b"), &segs("$.a.c")));
        assert!(!write_paths_overlap(&segs("$.a[0]"), &segs("$.a[1]")));
        assert!(!write_paths_overlap(&segs("$.a[0]"), &segs("$.a.x")));
    }

    #[test]
    fn format_path_round_trips() {
        let segs = vec![
            key("a"),
            key("odd 'key'"),
            Seg::Index(-1),
            key("1x"),
            key("tab\t"),
        ];
        let text = format_path(&segs);
        assert_eq!(text, r"$.a['odd \'key\''][-1]['1x']['tab\t']");
        assert_eq!(p(&text).segments(), Some(&segs[..]));
    }
}
