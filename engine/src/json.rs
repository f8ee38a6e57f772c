//! Reading JSON texts that enter the engine (`--input`, `--context`, batch lines, decisions,
//! what `command`, `http` and `llm` agents return): [`from_str`] and [`from_slice`] are
//! serde_json's, except that a number never silently changes and a key is never given twice.
//!
//! serde_json keeps integers that fit 64 bits (`i64`, or `u64` above it) exactly and reads a
//! larger one as the nearest double: `18446744073709551617` would come out as
//! `1.8446744073709552e19`. Such an integer is an error here, naming its JSON pointer, line and
//! column; a number written with a fraction or an exponent is a double, as written. (Keeping
//! every number's text instead, serde_json's `arbitrary_precision`, would turn every number of
//! every payload into a string behind the `Number`, for every computation and every value
//! a store writes back.)
//!
//! The check costs one pass over the bytes looking for a run of 19 digits; only a text that
//! has one is walked again to find where its numbers are.
//!
//! An object with a key given twice is refused too (serde_json would keep the last value, and
//! YAML refuses it): the error names the key and its JSON pointer. Values are built by a
//! visitor of ours that checks each key as it inserts it; only a text found to have a
//! duplicate is walked again, to name where.

use serde_json::Value;

/// Why a JSON text was refused: serde_json's syntax error, or an integer that does not fit 64
/// bits. Displayed as serde_json displays its errors: "cause at line L column C".
#[derive(Debug)]
pub struct JsonError {
    cause: String,
    line: usize,
    column: usize,
}

impl JsonError {
    /// The 1-based line of the error.
    pub fn line(&self) -> usize {
        self.line
    }

    /// The 1-based column (in bytes) of the error.
    pub fn column(&self) -> usize {
        self.column
    }

    /// The error without its position.
    pub fn cause(&self) -> &str {
        &self.cause
    }
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at line {} column {}", self.cause, self.line, self.column)
    }
}

impl std::error::Error for JsonError {}

impl From<serde_json::Error> for JsonError {
    fn from(e: serde_json::Error) -> Self {
        let text = e.to_string();
        let cause = match text.rfind(" at line ") {
            Some(i) => text[..i].to_owned(),
            None => text,
        };
        JsonError {
            cause,
            line: e.line(),
            column: e.column(),
        }
    }
}

/// A JSON text as a value; see the module's documentation.
pub fn from_str(text: &str) -> Result<Value, JsonError> {
    from_slice(text.as_bytes())
}

/// [`from_str`] of bytes.
pub fn from_slice(bytes: &[u8]) -> Result<Value, JsonError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde::de::DeserializeSeed::deserialize(Strict, &mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| explained(bytes, e))?;
    if has_long_digit_run(bytes)
        && let Some(Found { pointer, at, .. }) = Scan::new(bytes).find(Want::BigInteger)
    {
        let number = number_at(bytes, at);
        let before = &bytes[..at];
        let line = before.iter().filter(|b| **b == b'\n').count() + 1;
        let column = at - before.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1) + 1;
        return Err(JsonError {
            cause: format!(
                "the integer {number} at `{pointer}` does not fit in 64 bits, and would be rounded \
                 (numbers are 64-bit integers or doubles; write it as a string to keep its digits)"
            ),
            line,
            column,
        });
    }
    Ok(value)
}

/// The text of bytes read from a file or a stream, or an error naming where they stop being
/// UTF-8: "invalid UTF-8 at byte N" (1-based), at its line and column.
pub fn text_of(bytes: &[u8]) -> Result<&str, JsonError> {
    std::str::from_utf8(bytes).map_err(|e| {
        let at = e.valid_up_to();
        let (line, column) = line_column(bytes, at);
        JsonError {
            cause: format!("invalid UTF-8 at byte {}", at + 1),
            line,
            column,
        }
    })
}

/// The 1-based line and column (in bytes) of byte offset `at`.
fn line_column(bytes: &[u8], at: usize) -> (usize, usize) {
    let before = &bytes[..at.min(bytes.len())];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let column = before.len() - before.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// serde_json's error made to say what it means where its words do not: bytes that are not
/// UTF-8, a lone surrogate escape, a key given twice.
fn explained(bytes: &[u8], e: serde_json::Error) -> JsonError {
    if let Err(not_text) = text_of(bytes) {
        return not_text;
    }
    let text = e.to_string();
    if (text.contains("hex escape") || text.contains("surrogate"))
        && let Some(found) = lone_surrogate(bytes, e.line(), e.column())
    {
        return found;
    }
    duplicate_named(bytes, e)
}

/// The `\uD800`–`\uDFFF` escape just before serde_json's error at `line`:`column` (it stops
/// past the escape, looking for the other half of the pair): the error at the escape.
fn lone_surrogate(bytes: &[u8], line: usize, column: usize) -> Option<JsonError> {
    let line_start = if line <= 1 {
        0
    } else {
        bytes
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .nth(line - 2)
            .map(|(i, _)| i + 1)?
    };
    let end = (line_start + column).min(bytes.len());
    let from = end.saturating_sub(13);
    let start = (from..end).rev().find(|&i| {
        bytes[i..].starts_with(b"\\u")
            && bytes
                .get(i + 2..i + 6)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u16::from_str_radix(h, 16).ok())
                .is_some_and(|u| (0xD800..=0xDFFF).contains(&u))
    })?;
    let escape = String::from_utf8_lossy(&bytes[start..start + 6]).into_owned();
    let (line, column) = line_column(bytes, start);
    Some(JsonError {
        cause: format!(
            "lone surrogate `{escape}` (half of a UTF-16 pair, without the other half: no character)"
        ),
        line,
        column,
    })
}

/// The marker of the error [`Strict`] raises for a key given twice, which [`duplicate_named`]
/// replaces with the key's JSON pointer.
const DUPLICATE: &str = "duplicate key";

/// serde_json's error, or for a duplicate key, an error naming the key and its JSON pointer
/// (found by a second walk, made only then), at the key.
fn duplicate_named(bytes: &[u8], e: serde_json::Error) -> JsonError {
    if !e.to_string().starts_with(DUPLICATE) {
        return e.into();
    }
    let Some(Found { pointer, at, key }) = Scan::new(bytes).find(Want::DuplicateKey) else {
        return e.into();
    };
    let (line, column) = line_column(bytes, at);
    JsonError {
        cause: format!("duplicate key `{key}` at `{pointer}` (a key may appear once in an object)"),
        line,
        column,
    }
}

/// Reads a JSON value as serde_json's `Value` does, refusing an object with a key given twice
/// (serde_json would keep the last value silently).
struct Strict;

impl<'de> serde::de::DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(v) = seq.next_element_seed(Strict)? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut m = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match m.entry(key) {
                serde_json::map::Entry::Vacant(slot) => {
                    slot.insert(map.next_value_seed(Strict)?);
                }
                serde_json::map::Entry::Occupied(_) => {
                    return Err(serde::de::Error::custom(DUPLICATE));
                }
            }
        }
        Ok(Value::Object(m))
    }
}

/// Whether `bytes` has 19 ASCII digits in a row: an integer of fewer always fits `i64`.
fn has_long_digit_run(bytes: &[u8]) -> bool {
    let mut run = 0;
    for b in bytes {
        if b.is_ascii_digit() {
            run += 1;
            if run >= 19 {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

/// The number token that starts at `at`.
fn number_at(bytes: &[u8], at: usize) -> String {
    let end = bytes[at..]
        .iter()
        .position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
        .map_or(bytes.len(), |n| at + n);
    String::from_utf8_lossy(&bytes[at..end]).into_owned()
}

/// A step of the path to where the scan is.
enum Step {
    /// The key's token, quotes included, as written.
    Key(usize, usize),
    Index(usize),
}

/// What a [`Scan`] looks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    /// An integer that does not fit 64 bits.
    BigInteger,
    /// A key given twice in one object.
    DuplicateKey,
}

/// Where a [`Scan`] found what it looked for.
struct Found {
    pointer: String,
    /// Where its token starts.
    at: usize,
    /// The key given twice (empty for a number).
    key: String,
}

/// A walk over a text that serde_json has read up to an error or to its end (well formed that
/// far, and nested at most 128 deep), looking for the first place of one kind.
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
    path: Vec<Step>,
}

impl<'a> Scan<'a> {
    fn new(b: &'a [u8]) -> Self {
        Scan {
            b,
            i: 0,
            path: Vec::new(),
        }
    }

    fn peek(&self) -> u8 {
        self.b.get(self.i).copied().unwrap_or(0)
    }

    fn ws(&mut self) {
        while matches!(self.peek(), b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    /// The first place, in document order, where `want` is found: its JSON pointer, where its
    /// token starts, and for a duplicate key, the key.
    fn find(&mut self, want: Want) -> Option<Found> {
        self.ws();
        match self.peek() {
            b'{' => {
                self.i += 1;
                let mut keys = std::collections::HashSet::new();
                loop {
                    self.ws();
                    if self.peek() != b'"' {
                        // `}`: the end of the object (or an empty one).
                        self.i += 1;
                        return None;
                    }
                    let start = self.i;
                    self.string();
                    self.path.push(Step::Key(start, self.i));
                    if want == Want::DuplicateKey {
                        let key: String = serde_json::from_slice(&self.b[start..self.i]).unwrap_or_default();
                        if !keys.insert(key.clone()) {
                            return Some(Found {
                                pointer: self.pointer(),
                                at: start,
                                key,
                            });
                        }
                    }
                    self.ws();
                    self.i += 1; // `:`
                    if let Some(found) = self.find(want) {
                        return Some(found);
                    }
                    self.path.pop();
                    self.ws();
                    if self.peek() == b',' {
                        self.i += 1;
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let mut index = 0;
                loop {
                    self.ws();
                    if self.i >= self.b.len() {
                        return None;
                    }
                    if self.peek() == b']' {
                        self.i += 1;
                        return None;
                    }
                    self.path.push(Step::Index(index));
                    if let Some(found) = self.find(want) {
                        return Some(found);
                    }
                    self.path.pop();
                    index += 1;
                    self.ws();
                    if self.peek() == b',' {
                        self.i += 1;
                    }
                }
            }
            b'"' => {
                self.string();
                None
            }
            b'-' | b'0'..=b'9' => {
                let start = self.i;
                let mut integer = true;
                while let c @ (b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') = self.peek() {
                    integer &= matches!(c, b'0'..=b'9' | b'-');
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.b[start..self.i]).unwrap_or("");
                let fits = text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok();
                (want == Want::BigInteger && integer && !fits).then(|| Found {
                    pointer: self.pointer(),
                    at: start,
                    key: String::new(),
                })
            }
            _ => {
                // `true`, `false`, `null`.
                while self.peek().is_ascii_alphabetic() {
                    self.i += 1;
                }
                None
            }
        }
    }

    /// Past a string token (at its opening quote).
    fn string(&mut self) {
        self.i += 1;
        while self.i < self.b.len() {
            match self.b[self.i] {
                b'\\' => self.i += 2,
                b'"' => {
                    self.i += 1;
                    return;
                }
                _ => self.i += 1,
            }
        }
    }

    /// RFC 6901: `/key/0`, with `~` and `/` in keys escaped as `~0` and `~1`; `` for the root.
    fn pointer(&self) -> String {
        let mut p = String::new();
        for step in &self.path {
            p.push('/');
            match step {
                Step::Index(i) => p.push_str(&i.to_string()),
                Step::Key(start, end) => {
                    let key: String = serde_json::from_slice(&self.b[*start..*end]).unwrap_or_default();
                    p.push_str(&key.replace('~', "~0").replace('/', "~1"));
                }
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refused(text: &str) -> String {
        from_str(text).unwrap_err().to_string()
    }

    #[test]
    fn integers_that_fit_64_bits_stay_exact() {
        let v =
            from_str(r#"{"a": 9223372036854775807, "b": 18446744073709551615, "c": -9223372036854775808}"#)
                .unwrap();
        assert_eq!(v["a"].as_i64(), Some(i64::MAX));
        assert_eq!(v["b"].as_u64(), Some(u64::MAX));
        assert_eq!(v["c"].as_i64(), Some(i64::MIN));
        // Doubles are doubles as written, however many digits; digits in strings are text.
        let v =
            from_str(r#"[1.8446744073709551617e3, 12345678901234567890123.5, "123456789012345678901234"]"#)
                .unwrap();
        assert!(v[0].is_f64() && v[1].is_f64() && v[2].is_string(), "{v}");
    }

    #[test]
    fn a_larger_integer_is_an_error_naming_its_pointer_line_and_column() {
        let e = refused(r#"{"n": 18446744073709551617}"#);
        assert_eq!(
            e,
            "the integer 18446744073709551617 at `/n` does not fit in 64 bits, and would be rounded \
             (numbers are 64-bit integers or doubles; write it as a string to keep its digits) at line 1 column 7"
        );
        let e = from_str("{\"a\": [1, {\"x\\\"/~\": \"12345678901234567890\"}],\n \"b\": {\"c\": [0, -9223372036854775809]}}")
            .unwrap_err();
        assert!(e.cause().contains("-9223372036854775809 at `/b/c/1`"), "{e}");
        assert_eq!((e.line(), e.column()), (2, 17));
        let e = refused(r#"{"k\"/~": [[], {}, 100000000000000000000]}"#);
        assert!(e.contains("at `/k\"~1~0/2`"), "{e}");
        assert!(refused("100000000000000000000").contains("at ``"));
    }

    #[test]
    fn a_key_given_twice_is_an_error_naming_it_and_its_pointer() {
        let e = from_str("{\"a\": 1,\n \"b\": [0, {\"c\": 1, \"c\": 2}], \"a\": 3}").unwrap_err();
        assert_eq!(
            e.to_string(),
            "duplicate key `c` at `/b/1/c` (a key may appear once in an object) at line 2 column 20"
        );
        // Keys are compared as decoded: an escape spells the same key.
        let e = from_str(r#"{"k/~": 1, "k\u002f~": 2}"#).unwrap_err();
        assert!(e.cause().starts_with("duplicate key `k/~` at `/k~1~0`"), "{e}");
        // The same key in different objects is fine, and values are as serde_json reads them.
        let text = r#"{"a": {"x": 1}, "b": {"x": [1.5, -2, 18446744073709551615, null, true, "s"]}}"#;
        assert_eq!(
            from_str(text).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
        assert!(from_str("{\"a\": 1} x").is_err());
    }

    #[test]
    fn bytes_that_are_not_utf8_and_lone_surrogates_are_named_where_they_are() {
        let e = from_slice(b"{\"a\": 1,\n \"s\": \"x\xffy\"}").unwrap_err();
        assert_eq!(e.to_string(), "invalid UTF-8 at byte 18 at line 2 column 9");
        let e = text_of(b"ok\n\xc3").unwrap_err();
        assert_eq!(
            (e.cause(), e.line(), e.column()),
            ("invalid UTF-8 at byte 4", 2, 1)
        );
        assert_eq!(text_of("été".as_bytes()).unwrap(), "été");
        for (text, column) in [
            (r#"{"s": "\ud800"}"#, 8),
            (r#"{"s": "ab\uD800x"}"#, 10),
            (r#"["\udc00"]"#, 3),
            (r#"{"s": "\ud800\u0041"}"#, 8),
        ] {
            let e = from_str(text).unwrap_err();
            assert!(e.cause().starts_with("lone surrogate `\\u"), "{text}: {e}");
            assert_eq!((e.line(), e.column()), (1, column), "{text}: {e}");
        }
        // A pair is one character.
        assert_eq!(from_str(r#""\ud83d\ude00""#).unwrap(), json!("😀"));
    }

    #[test]
    fn syntax_errors_are_serde_json_s() {
        let e = from_str("{\"a\": }").unwrap_err();
        assert_eq!(e.to_string(), "expected value at line 1 column 7");
        assert_eq!(from_str("[1, 2]").unwrap(), json!([1, 2]));
    }
}
