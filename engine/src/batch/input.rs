//! Streaming the JSONL input, a line at a time, in the two ways a batch reads it: whole lines
//! with their values, to run them, or only their ids (the ids pass, `ids.rs`), which name
//! every line as the whole reading does without building its value. A line that cannot be
//! read (too long, not UTF-8, not JSON) is an item that fails, named by its line number.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde_json::Value;

use super::error::BatchError;

/// The longest input line read (SPEC §9 engine-wide caps): longer lines are failed items.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// One input line, read.
pub(crate) struct Line {
    /// 0-based index among the file's lines (blank lines count, and are skipped).
    pub(crate) index: u64,
    /// The id as text: what the store records and duplicates are found by.
    pub(crate) id: String,
    /// The id as the output writes it: the input's string or number as it was, or the line
    /// number (as a string) for a line without one.
    pub(crate) id_value: Value,
    pub(crate) parsed: Result<Value, String>,
}

/// Streams the items of a JSONL file.
pub(crate) struct Lines {
    reader: BufReader<std::fs::File>,
    path: String,
    index: u64,
    id_field: String,
    /// `id_field`'s segments.
    id_path: Vec<String>,
    buf: Vec<u8>,
}

impl Lines {
    pub(crate) fn open(path: &Path, id_field: &str) -> Result<Lines, BatchError> {
        let file = std::fs::File::open(path).map_err(|e| BatchError::Input {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(Lines {
            reader: BufReader::with_capacity(1 << 16, file),
            path: path.display().to_string(),
            index: 0,
            id_field: id_field.to_string(),
            id_path: id_field.split('.').map(str::to_string).collect(),
            buf: Vec::new(),
        })
    }

    /// The next non-blank line.
    pub(crate) fn next_line(&mut self) -> Result<Option<Line>, BatchError> {
        let Some((index, text)) = self.next_text()? else {
            return Ok(None);
        };
        let line_no = index + 1;
        let text = match text {
            Ok(()) => self.text(),
            Err(message) => {
                let (id, id_value) = broken_line_id(index);
                return Ok(Some(Line {
                    index,
                    id,
                    id_value,
                    parsed: Err(message),
                }));
            }
        };
        let parsed: Result<Value, String> = crate::json::from_str(text).map_err(|e| {
            // The error says where as " at line 1 column N": the line is ours to name.
            format!(
                "line {line_no} is not JSON: {} (column {})",
                e.cause(),
                e.column()
            )
        });
        // A line refused for what it holds rather than how it is written is named as the
        // ids alone name it ([`Lines::next_id`]).
        let at = match &parsed {
            Ok(v) => Some(id_at(v, &self.id_path)),
            Err(_) => self.id_of_text(),
        };
        let (id, id_value) = match at {
            None => broken_line_id(index),
            Some(at) => match self.checked(index, at)? {
                Some(v) => (id_text(&v), v),
                None => (line_no.to_string(), Value::String(line_no.to_string())),
            },
        };
        Ok(Some(Line {
            index,
            id,
            id_value,
            parsed,
        }))
    }

    /// The id a line's field holds (`None`: it has none), or the error of one that cannot
    /// be an id.
    fn checked(&self, index: u64, at: IdAt) -> Result<Option<Value>, BatchError> {
        match at {
            IdAt::Missing => Ok(None),
            IdAt::Id(v) => Ok(Some(v)),
            IdAt::Bad(what) => Err(BatchError::BadId {
                path: self.path.clone(),
                line: index + 1,
                field: self.id_field.clone(),
                what,
            }),
        }
    }

    /// The index and id of the next non-blank line, as [`Lines::next_line`] names it, and
    /// whether the line has the id field (`None`: it is not JSON, and can be no duplicate),
    /// without building the line's value: the id field is read, the rest only checked.
    pub(super) fn next_id(&mut self) -> Result<Option<(u64, String, Option<bool>)>, BatchError> {
        let Some((index, text)) = self.next_text()? else {
            return Ok(None);
        };
        let at = match text {
            Ok(()) => self.id_of_text(),
            Err(_) => None,
        };
        let Some(at) = at else {
            return Ok(Some((index, broken_line_id(index).0, None)));
        };
        Ok(Some(match self.checked(index, at)? {
            Some(v) => (index, id_text(&v), Some(true)),
            None => (index, (index + 1).to_string(), Some(false)),
        }))
    }

    /// What the line [`Lines::next_text`] read holds at its id field, reading nothing else
    /// into values; `None` if it is not JSON at all.
    fn id_of_text(&self) -> Option<IdAt> {
        let text = self.text();
        // Only an object has an id field; any other JSON value is named by its line number.
        if !text.starts_with('{') {
            return serde_json::from_str::<serde::de::IgnoredAny>(text)
                .ok()
                .map(|_| IdAt::Missing);
        }
        let mut de = serde_json::Deserializer::from_str(text);
        serde::de::DeserializeSeed::deserialize(IdOf(&self.id_path), &mut de)
            .and_then(|id| de.end().map(|()| id))
            .ok()
    }

    /// The line [`Lines::next_text`] read, trimmed.
    fn text(&self) -> &str {
        // Checked to be UTF-8 by `next_text`.
        std::str::from_utf8(&self.buf).map_or("", str::trim)
    }

    /// Reads the next non-blank line into `buf`: its index, and whether it can be read as
    /// text at all (a line over the size limit or not UTF-8 cannot, and says why).
    fn next_text(&mut self) -> Result<Option<(u64, Readable)>, BatchError> {
        loop {
            self.buf.clear();
            let n = (&mut self.reader)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| BatchError::Input {
                    path: self.path.clone(),
                    message: e.to_string(),
                })?;
            if n == 0 {
                return Ok(None);
            }
            let index = self.index;
            self.index += 1;
            let line_no = index + 1;
            // A UTF-8 byte order mark, which some editors put at the start of a file, is not
            // part of the first line.
            if index == 0 && self.buf.starts_with(b"\xEF\xBB\xBF") {
                self.buf.drain(..3);
            }
            if self.buf.len() > MAX_LINE_BYTES && !self.buf.ends_with(b"\n") {
                // Skip the rest of the over-long line.
                let mut rest = Vec::new();
                loop {
                    rest.clear();
                    let m = (&mut self.reader)
                        .take(1 << 20)
                        .read_until(b'\n', &mut rest)
                        .map_err(|e| BatchError::Input {
                            path: self.path.clone(),
                            message: e.to_string(),
                        })?;
                    if m == 0 || rest.ends_with(b"\n") {
                        break;
                    }
                }
                return Ok(Some((
                    index,
                    Err(format!(
                        "line {line_no} is longer than {MAX_LINE_BYTES} bytes (the JSONL line size limit)"
                    )),
                )));
            }
            match std::str::from_utf8(&self.buf) {
                Ok(t) if t.trim().is_empty() => continue,
                Ok(_) => return Ok(Some((index, Ok(())))),
                Err(e) => {
                    return Ok(Some((
                        index,
                        Err(format!(
                            "line {line_no} is not UTF-8 (byte {} of the line)",
                            e.valid_up_to() + 1
                        )),
                    )));
                }
            }
        }
    }
}

/// The id of a line that is not JSON (or not text): `line:N`, which names no other line, as
/// the number `N` would name a line without the id field or one whose id is `N`.
fn broken_line_id(index: u64) -> (String, Value) {
    let id = format!("line:{}", index + 1);
    (id.clone(), Value::String(id))
}

/// Whether a line read is text ([`Lines::text`]), or why not.
type Readable = Result<(), String>;

/// What a line holds at its id field.
enum IdAt {
    /// Not there (or not under an object): the line is named by its line number.
    Missing,
    /// A string or a number.
    Id(Value),
    /// Something that cannot be an id: what it is.
    Bad(&'static str),
}

/// The value at the dotted path `path` of a line, as an id.
fn id_at(v: &Value, path: &[String]) -> IdAt {
    let mut v = v;
    for key in path {
        match v.as_object().and_then(|m| m.get(key)) {
            Some(inner) => v = inner,
            None => return IdAt::Missing,
        }
    }
    id_kind(v)
}

fn id_kind(v: &Value) -> IdAt {
    match v {
        Value::String(_) | Value::Number(_) => IdAt::Id(v.clone()),
        Value::Null => IdAt::Bad("null"),
        Value::Bool(_) => IdAt::Bad("a boolean"),
        Value::Object(_) => IdAt::Bad("an object"),
        Value::Array(_) => IdAt::Bad("an array"),
    }
}

/// An id's text: a string as it is, a number as JSON writes it.
fn id_text(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Reads a JSON object for its id field only ([`id_at`]), skipping the other values
/// without building them (but the objects on a dotted path to it). Like a parsed object, a
/// key given twice counts as its last value.
struct IdOf<'a>(&'a [String]);

impl<'de> serde::de::DeserializeSeed<'de> for IdOf<'_> {
    type Value = IdAt;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for IdOf<'_> {
    type Value = IdAt;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut id = IdAt::Missing;
        while let Some(is_id) = map.next_key_seed(KeyIs(&self.0[0]))? {
            if is_id {
                id = match &self.0[1..] {
                    [] => id_kind(&map.next_value::<Value>()?),
                    rest => id_at(&map.next_value::<Value>()?, rest),
                };
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(id)
    }
}

/// Whether a key is the given one, without keeping it.
struct KeyIs<'a>(&'a str);

impl<'de> serde::de::DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Named = Vec<(u64, String)>;

    /// Every line's (index, id) by both readers, or the error each gave.
    fn both(content: &[u8], id_field: &str) -> Result<(Named, Named), (String, String)> {
        let dir = std::env::temp_dir().join(format!("switchyard-lines-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{id_field}.jsonl"));
        std::fs::write(&path, content).unwrap();
        let full = (|| {
            let mut full = Vec::new();
            let mut lines = Lines::open(&path, id_field)?;
            while let Some(l) = lines.next_line()? {
                full.push((l.index, l.id));
            }
            Ok::<_, BatchError>(full)
        })();
        let ids = (|| {
            let mut ids = Vec::new();
            let mut lines = Lines::open(&path, id_field)?;
            while let Some((index, id, _)) = lines.next_id()? {
                ids.push((index, id));
            }
            Ok::<_, BatchError>(ids)
        })();
        std::fs::remove_file(&path).unwrap();
        // Errors name the file by its path here: the message from there on.
        let rest = |e: BatchError| {
            let text = e.to_string();
            text.strip_prefix(&path.display().to_string())
                .map_or(text.clone(), str::to_string)
        };
        match (full, ids) {
            (Ok(full), Ok(ids)) => Ok((full, ids)),
            (full, ids) => Err((
                full.map_or_else(rest, |v| format!("{v:?}")),
                ids.map_or_else(rest, |v| format!("{v:?}")),
            )),
        }
    }

    #[test]
    fn reading_only_the_ids_names_every_line_as_parsing_it_does() {
        let content = [
            r#"{"id": "a", "x": {"id": "nested"}, "l": [1, {"id": 2}]}"#,
            r#"{"x": 1, "id": 7}"#,
            r#"{"id": 1.5e3}"#,
            r#"{"id": 18446744073709551615}"#,
            r#"{"id": -3}"#,
            r#"{"i\u0064": "escaped key"}"#,
            r#"{"id": "first", "id": "last"}"#,
            r#"{"id": {"nested": 1}, "id": "after an object"}"#,
            r#"{"no_id": true}"#,
            "",
            "   ",
            r#"["id", "a"]"#,
            r#""id""#,
            "42",
            r#"{"id": "x""#,
            r#"{"id": null"#,
            r#"{"id": "y"} trailing"#,
            r#"{"id": "z", }"#,
            r#"  {"id": "padded"}  "#,
            r#"{"id": "\u00e9t\u00e9"}"#,
        ]
        .join("\n");
        let mut bytes = content.into_bytes();
        bytes.extend_from_slice(b"\n{\"id\": \"bad \xff utf8\"}\n{\"id\": \"last line, no newline\"}");
        let (full, ids) = both(&bytes, "id").unwrap();
        assert_eq!(full, ids);
        // The expected names, to be sure both are right and not merely alike.
        let names: Vec<&str> = ids.iter().map(|(_, id)| id.as_str()).collect();
        assert_eq!(
            names,
            [
                "a",
                "7",
                "1500.0",
                "18446744073709551615",
                "-3",
                "escaped key",
                "last",
                "after an object",
                "9",
                "12",
                "13",
                "14",
                "line:15",
                "line:16",
                "line:17",
                "line:18",
                "padded",
                "été",
                "line:21",
                "last line, no newline"
            ]
        );
        // Another id field.
        let (full, ids) = both(b"{\"key\": \"k1\", \"id\": \"no\"}\n{\"id\": \"k2\"}\n", "key").unwrap();
        assert_eq!(full, ids);
        assert_eq!(ids, [(0, "k1".to_string()), (1, "2".to_string())]);
        // A dotted path names a nested field; a literal key with a dot in it is not it.
        let (full, ids) = both(
            br#"{"ticket": {"id": "T-1", "x": [1]}, "ticket.id": "no"}
{"ticket": {"other": 1}}
{"ticket": "T-3"}
{"ticket": {"id": 4}, "ticket": {"id": "T-4"}}
{"ticket.id": "no", "ticket": {"meta": {"id": 9}, "id": 5}}
"#,
            "ticket.id",
        )
        .unwrap();
        assert_eq!(full, ids);
        let names: Vec<&str> = ids.iter().map(|(_, id)| id.as_str()).collect();
        assert_eq!(names, ["T-1", "2", "3", "T-4", "5"]);
        // A byte order mark opening the file is not part of the first line; elsewhere it is.
        let (full, ids) = both(
            b"\xEF\xBB\xBF{\"id\": \"a\"}\n\xEF\xBB\xBF{\"id\": \"b\"}\n",
            "id",
        )
        .unwrap();
        assert_eq!(full, ids);
        assert_eq!(ids, [(0, "a".to_string()), (1, "line:2".to_string())]);
        // An id field that holds no string or number is an error naming its line, the same
        // from both readers.
        for (line, what) in [
            (r#"{"id": null}"#, "null"),
            (r#"{"id": true}"#, "a boolean"),
            (r#"{"id": {"a": 1}}"#, "an object"),
            (r#"{"id": ["a"]}"#, "an array"),
            (r#"{"id": "first", "id": null}"#, "null"),
        ] {
            let content = format!("{{\"id\": \"ok\"}}\n\n{line}\n");
            let (full, ids) = both(content.as_bytes(), "id").unwrap_err();
            assert_eq!(full, ids);
            assert_eq!(
                full,
                format!(" line 3: the id field `id` is {what}: an id is a string or a number")
            );
        }
    }
}
