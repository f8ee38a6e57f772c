//! File references (SPEC §6.5): what payloads, results and records carry of a file whose
//! bytes live in the store once, by content hash.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `{"file": "sha256:<hex>", "name", "media_type", "size"}`: a file as values carry it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    /// `sha256:` and the lowercase hex SHA-256 of the bytes.
    pub file: String,
    /// As given by whatever made the file (a path relative to an output directory, a
    /// `Content-Disposition` filename, ...): made safe wherever it is written or shown, never
    /// here.
    pub name: String,
    pub media_type: String,
    pub size: u64,
}

/// The prefix of every file reference's `file`.
pub const HASH_PREFIX: &str = "sha256:";

impl FileRef {
    /// The value a payload or result carries.
    pub fn to_value(&self) -> Value {
        let mut m = Map::with_capacity(4);
        m.insert("file".into(), Value::String(self.file.clone()));
        m.insert("name".into(), Value::String(self.name.clone()));
        m.insert("media_type".into(), Value::String(self.media_type.clone()));
        m.insert("size".into(), Value::from(self.size));
        Value::Object(m)
    }

    /// The reference `v` is, if it is one: an object whose `file` is `sha256:` and 64 hex
    /// digits, with a string `name` and `media_type` and an unsigned `size` (other members
    /// are allowed and ignored).
    pub fn from_value(v: &Value) -> Option<FileRef> {
        let o = v.as_object()?;
        let file = o.get("file")?.as_str()?;
        if !is_hash(file) {
            return None;
        }
        Some(FileRef {
            file: file.to_string(),
            name: o.get("name")?.as_str()?.to_string(),
            media_type: o.get("media_type")?.as_str()?.to_string(),
            size: o.get("size")?.as_u64()?,
        })
    }

    /// The hex digest, without `sha256:`.
    pub fn hex(&self) -> &str {
        self.file.strip_prefix(HASH_PREFIX).unwrap_or(&self.file)
    }
}

/// Whether `s` is `sha256:` and 64 lowercase hex digits.
pub fn is_hash(s: &str) -> bool {
    s.strip_prefix(HASH_PREFIX).is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Every file reference in `v`, depth first, in document order (a reference's own members
/// are not searched further).
pub fn refs_in(v: &Value, out: &mut Vec<FileRef>) {
    match v {
        Value::Object(o) => {
            if o.contains_key("file")
                && let Some(r) = FileRef::from_value(v)
            {
                out.push(r);
                return;
            }
            for x in o.values() {
                refs_in(x, out);
            }
        }
        Value::Array(a) => {
            for x in a {
                refs_in(x, out);
            }
        }
        _ => {}
    }
}

/// One file a run's steps, iterations, branches, tool calls or child runs made, with the
/// number of the record that made it (`2`, `3[1]`, `1.4`, `5.t2.1`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFile {
    pub number: String,
    #[serde(flatten)]
    pub file: FileRef,
}

/// Sorts a run's files by record number: segments compared as numbers where they are
/// numbers (`2 < 10`), iterations by index (`3[2] < 3[10]`), loop parts by turn (`t2 < t10`),
/// branch names by name. Stable: files of one record keep their order.
pub fn sort_run_files(files: &mut [RunFile]) {
    files.sort_by(|a, b| cmp_numbers(&a.number, &b.number));
}

/// Compares two record numbers as [`sort_run_files`] orders them.
pub fn cmp_numbers(a: &str, b: &str) -> std::cmp::Ordering {
    let mut x = a.split('.');
    let mut y = b.split('.');
    loop {
        match (x.next(), y.next()) {
            (None, None) => return std::cmp::Ordering::Equal,
            (None, Some(_)) => return std::cmp::Ordering::Less,
            (Some(_), None) => return std::cmp::Ordering::Greater,
            (Some(s), Some(t)) => {
                let o = segment_key(s).cmp(&segment_key(t));
                if o.is_ne() {
                    return o;
                }
            }
        }
    }
}

/// A segment's order: `(0, n, iteration, "")` for `n` or `n[i]`, `(1, k, 0, "")` for a loop
/// turn `tk`, `(2, 0, 0, s)` for anything else (a branch name, `approval`).
fn segment_key(s: &str) -> (u8, u64, u64, &str) {
    let (head, iteration) = match s.strip_suffix(']').and_then(|r| r.split_once('[')) {
        Some((h, i)) => (h, i.parse().unwrap_or(0)),
        None => (s, 0),
    };
    if let Ok(n) = head.parse::<u64>() {
        return (0, n, iteration, "");
    }
    if let Some(k) = head.strip_prefix('t').and_then(|k| k.parse::<u64>().ok()) {
        return (1, k, iteration, "");
    }
    (2, 0, iteration, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rf(number: &str) -> RunFile {
        RunFile {
            number: number.into(),
            file: FileRef {
                file: format!("sha256:{}", "a".repeat(64)),
                name: number.into(),
                media_type: "text/plain".into(),
                size: 1,
            },
        }
    }

    #[test]
    fn run_files_sort_by_record_number() {
        let mut files: Vec<RunFile> = [
            "10", "2[10]", "2[2]", "2", "1.3.b", "1.3.a", "5.t10.1", "5.t2.1", "1.10", "1.9",
        ]
        .into_iter()
        .map(rf)
        .collect();
        sort_run_files(&mut files);
        let got: Vec<&str> = files.iter().map(|f| f.number.as_str()).collect();
        assert_eq!(
            got,
            [
                "1.3.a", "1.3.b", "1.9", "1.10", "2", "2[2]", "2[10]", "5.t2.1", "5.t10.1", "10"
            ]
        );
    }

    #[test]
    fn references_are_found_and_checked() {
        let hash = format!("sha256:{}", "0f".repeat(32));
        let v = serde_json::json!({
            "a": {"file": hash, "name": "x.png", "media_type": "image/png", "size": 3},
            "b": [{"file": "sha256:zz", "name": "y", "media_type": "t", "size": 1}, {"file": "notes.txt"}],
        });
        let mut out = Vec::new();
        refs_in(&v, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].name, "x.png");
        assert_eq!(FileRef::from_value(&out[0].to_value()), Some(out[0].clone()));
        assert!(!is_hash(&format!("sha256:{}", "0F".repeat(32))));
    }
}
