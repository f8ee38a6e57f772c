//! `file("path")` in an agent's input (SPEC §6.5): the markers the expression left in the
//! input document ([`crate::expr::file`]) become the references of files read from under the
//! project root or a `--files-root`, stored once by hash. They are made by the step whose input
//! names them: on its record, and the run's, when the step succeeds.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::Run;
use crate::agents::StepNumber;
use crate::expr::file as marker;
use crate::record::files::FileRef;
use crate::record::{ErrorKind, RunFile, StepError};
use crate::store::Store;

impl<S: Store> Run<'_, S> {
    /// The input with every `file()` marker replaced by the reference of its file, and the
    /// files read; `None` when the input has no marker (the common case: nothing copied).
    pub(super) async fn input_files(
        &self,
        input: &Value,
        number: StepNumber<'_>,
    ) -> Result<Option<(Value, Vec<RunFile>)>, StepError> {
        if !marker::has_marker(input) {
            return Ok(None);
        }
        let roots = self.files_roots();
        let sink = crate::files::FileSink::new(self.engine.store.blobs(), self.file_limits.clone());
        let mut doc = input.clone();
        let mut done: HashMap<String, Value> = HashMap::new();
        let mut found = Vec::new();
        collect(&mut doc, &mut found);
        // Every path is checked before any is read: a refused one reads nothing.
        let mut resolved = Vec::with_capacity(found.len());
        for p in &found {
            resolved.push(confine(p, &roots)?);
        }
        for (p, real) in found.iter().zip(&resolved) {
            if done.contains_key(p) {
                continue;
            }
            let name = Path::new(p)
                .file_name()
                .map_or_else(|| p.clone(), |n| n.to_string_lossy().into_owned());
            let r: FileRef = sink.store_path(real, name).await.map_err(|e| StepError {
                message: format!("file(`{p}`): {}", e.message),
                ..e
            })?;
            done.insert(p.clone(), r.to_value());
        }
        replace(&mut doc, &done);
        let key = number.to_string();
        let files = sink
            .take()
            .into_iter()
            .map(|file| RunFile {
                number: key.clone(),
                file,
            })
            .collect();
        Ok(Some((doc, files)))
    }

    /// The directories `file()` may read under: `--files-root`'s (the project root first), or
    /// the directory of the top flow.
    fn files_roots(&self) -> Vec<PathBuf> {
        let given = &self.tree.options.files_roots;
        if !given.is_empty() {
            return given.to_vec();
        }
        let top = self.tree.plan.root();
        match &top.path {
            Some(p) => vec![crate::project::root_of(p, None)],
            None => std::env::current_dir()
                .and_then(|d| d.canonicalize())
                .map(|d| vec![d])
                .unwrap_or_default(),
        }
    }
}

/// The paths of the markers in `v`, in document order.
fn collect(v: &mut Value, out: &mut Vec<String>) {
    if let Some(p) = marker::path_of(v) {
        out.push(p.to_owned());
        return;
    }
    match v {
        Value::Object(m) => m.values_mut().for_each(|v| collect(v, out)),
        Value::Array(a) => a.iter_mut().for_each(|v| collect(v, out)),
        _ => {}
    }
}

/// Puts each marker's reference in its place.
fn replace(v: &mut Value, refs: &HashMap<String, Value>) {
    if let Some(r) = marker::path_of(v).and_then(|p| refs.get(p)) {
        *v = r.clone();
        return;
    }
    match v {
        Value::Object(m) => m.values_mut().for_each(|v| replace(v, refs)),
        Value::Array(a) => a.iter_mut().for_each(|v| replace(v, refs)),
        _ => {}
    }
}

/// The real path of `p` (relative to the first root, the project root), links followed, if
/// it is a regular file under one of `roots`; else kind `mapping`, naming `p`.
fn confine(p: &str, roots: &[PathBuf]) -> Result<PathBuf, StepError> {
    let refuse = |why: String| {
        StepError::new(ErrorKind::Mapping, format!("file(`{p}`): {why}"))
            .with_details(serde_json::json!({"path": p}))
    };
    if p.is_empty() {
        return Err(refuse("the path is empty".into()));
    }
    let Some(project) = roots.first() else {
        return Err(refuse("there is no project root to read under".into()));
    };
    let joined = project.join(p);
    let real = joined.canonicalize().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => refuse("no such file".into()),
        _ => refuse(format!("cannot resolve the path: {e}")),
    })?;
    if !roots.iter().any(|r| real.starts_with(r)) {
        let listed: Vec<String> = roots.iter().map(|r| format!("`{}`", r.display())).collect();
        return Err(refuse(format!(
            "the path is outside the project root and every --files-root ({})",
            listed.join(", ")
        )));
    }
    if !real.is_file() {
        return Err(refuse("not a regular file".into()));
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_confined_to_the_roots_links_followed() {
        let dir = std::env::temp_dir().join(format!("switchyard-confine-{}", std::process::id()));
        let root = dir.join("root");
        let other = dir.join("other");
        std::fs::create_dir_all(root.join("data")).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(root.join("data/a.txt"), "a").unwrap();
        std::fs::write(other.join("b.txt"), "b").unwrap();
        let root = root.canonicalize().unwrap();
        let other = other.canonicalize().unwrap();
        let roots = vec![root.clone()];
        assert_eq!(confine("data/a.txt", &roots).unwrap(), root.join("data/a.txt"));
        let e = confine("../other/b.txt", &roots).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mapping);
        assert!(
            e.message
                .starts_with("file(`../other/b.txt`): the path is outside"),
            "{}",
            e.message
        );
        let abs = other.join("b.txt").display().to_string();
        assert!(confine(&abs, &roots).is_err());
        assert!(confine(&abs, &[root.clone(), other.clone()]).is_ok());
        assert_eq!(
            confine("data", &roots).unwrap_err().message,
            "file(`data`): not a regular file"
        );
        assert_eq!(
            confine("nope", &roots).unwrap_err().message,
            "file(`nope`): no such file"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
