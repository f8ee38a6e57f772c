//! `file("path")` (SPEC §6.5): a file under the project root, or a `--files-root`, as a file
//! reference in a step's input mapping.
//!
//! The expression language does no I/O, and storing a file is the runtime's (it is async, and
//! it is what puts the file on the step's record). So `file("p")` only says which file: its
//! value is a marker, an object `{KEY: "p"}` whose one key holds a random part chosen when the
//! process starts ([`key`]), so that no input document, batch line or agent result can spell
//! one. The runtime finds the markers in an agent's input ([`path_of`]), reads each file once
//! (after checking that it is under a root), stores it, and puts its reference in the
//! marker's place.

use std::sync::LazyLock;

use cel::common::types::{self as cel_types, CelMap, CelMapKey, CelString};
use cel::common::value::{CowVal, Val};
use cel::{Env, ExecutionError};
use serde_json::Value;

/// The marker's one key: `$switchyard.file.` and 16 random hex digits.
static KEY: LazyLock<String> = LazyLock::new(|| {
    use std::hash::{BuildHasher, Hasher};
    // std's hasher keys come from the operating system's randomness.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("$switchyard.file.{:016x}", h.finish())
});

/// The key of the markers `file()` makes in this process.
pub fn key() -> &'static str {
    &KEY
}

/// Registers `file(string)`.
pub fn register(env: &mut Env) {
    env.add_overload(
        "file",
        "string_to_file",
        vec![cel_types::STRING_TYPE],
        file_of_string,
    )
    .expect("`file` is registered once, on an environment without it");
}

/// Whether this process made a marker yet: until it has, no value can hold one (no input can
/// spell the key), and [`has_marker`] looks at nothing.
static MADE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn file_of_string<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let path = args
        .first()
        .and_then(|a| a.downcast_ref::<CelString>())
        .map(|s| s.inner().to_owned())
        .expect("cel picks an overload only for arguments of its declared types");
    let mut entries: std::collections::HashMap<CelMapKey<'static>, Box<dyn Val>> =
        std::collections::HashMap::new();
    entries.insert(CelMapKey::from(KEY.clone()), Box::new(CelString::from(path)));
    MADE.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(CowVal::owned(CelMap::from(entries)))
}

/// The path of a marker `file()` made, if `v` is one.
pub fn path_of(v: &Value) -> Option<&str> {
    match v {
        Value::Object(m) if m.len() == 1 => m.get(key())?.as_str(),
        _ => None,
    }
}

/// A marker, as `file(path)` makes it (for tests and for the runtime's own checks).
pub fn marker(path: &str) -> Value {
    MADE.store(true, std::sync::atomic::Ordering::Relaxed);
    serde_json::json!({ key(): path })
}

/// Whether `v` holds a marker anywhere: walked only once this process made one, so a flow
/// without `file()` pays nothing for it.
pub fn has_marker(v: &Value) -> bool {
    MADE.load(std::sync::atomic::Ordering::Relaxed) && walk(v)
}

fn walk(v: &Value) -> bool {
    match v {
        Value::Object(m) => path_of(v).is_some() || m.values().any(walk),
        Value::Array(a) => a.iter().any(walk),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::eval::{Vars, eval};

    #[test]
    fn file_makes_a_marker_no_input_can_spell() {
        let e = crate::expr::parse("file('data/scan.png')").expect("parses");
        let v = eval(&e, &Vars::default()).expect("evaluates");
        assert_eq!(path_of(&v), Some("data/scan.png"));
        assert_eq!(v, marker("data/scan.png"));
        assert!(has_marker(&serde_json::json!({"a": [1, v]})));
        assert_eq!(path_of(&serde_json::json!({"$switchyard.file": "x"})), None);
        assert!(key().len() == "$switchyard.file.".len() + 16);
        let e = crate::expr::parse("file(1)").expect("parses");
        assert!(eval(&e, &Vars::default()).is_err());
    }
}
