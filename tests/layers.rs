//! The rooms of `engine/src` are used one way (ARCHITECTURE.md, "Layers"): a module may use
//! only the modules of the layers below its own, and no files import each other, directly or
//! round a longer cycle. Read from the code itself: every `crate::`, `super::` and `self::`
//! path outside comments and `#[cfg(test)]` code (tests may use anything). And no source
//! file is over 1,500 lines.
//!
//! Paths relative to a module (`child::f()` in a `mod.rs`) are not read: a module's parent
//! owns its children. An arrow that must run up for a while may be allowlisted below; an
//! allowlisted arrow that no longer exists fails the test, so the list only shrinks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The top-level modules from the ground up. A module may use the modules of the layers below
/// its own, never one of its own layer or above.
const LAYERS: &[&[&str]] = &[
    // Leaves: files and spans, JSON input, glob patterns, the allocator, and the records every
    // layer above shares (step errors, usage and cost, run and step records).
    &["source", "json", "glob", "alloc", "record"],
    // Diagnostics; the store, which keeps records and knows no flow.
    &["diag", "store"],
    // Files agents make and read: hashed, limited, typed and named, their bytes the store's.
    &["files"],
    &["syntax"],
    // The small languages inside a flow, parsed once: CEL (evaluation, types, functions,
    // strings, time), JSONPath, templates, value templates; static types of JSON values.
    &["expr"],
    &["model"],
    // Reading files: imports, called flows, schemas, change files.
    &["project"],
    &["plan"],
    // Model and project lowered into a plan.
    &["compile"],
    &["agents"],
    &["runtime"],
    &["lint", "report", "otel", "batch", "schema"],
    &["cluster", "api"],
    // Decisions at batch scale: the inbox the engine fills, answered and continued.
    &["inbox"],
    // Serving flows to other programs (MCP) through the library's surface.
    &["serve"],
    &["cli"],
];

/// Layers named before their module exists. Remove a name once its module is in `lib.rs`.
const PLANNED: &[&str] = &[];

/// Arrows that run up, each until the work named beside it lands: (file, the path it uses, or
/// a module path in front of it). None today; an entry that no longer exists fails the test.
const UP_ALLOWED: &[(&str, &str)] = &[
    // The SQL store stores bytes in the chunks the file sink reads them in: one size for both.
    ("store/sql/files.rs", "files::CHUNK"),
];

/// Files that import each other, until the work named beside them lands. None today.
const CYCLE_ALLOWED: &[(&str, &str)] = &[];

struct Source {
    /// Relative to `engine/src`, with `/`.
    path: String,
    /// The module path of the file (`runtime/engine/mod.rs`: `runtime::engine`).
    module: Vec<String>,
    /// The absolute module paths the file's product code names.
    uses: Vec<Vec<String>>,
}

fn src_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/src")
}

fn sources() -> Vec<Source> {
    let root = src_dir();
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    files
        .into_iter()
        .filter_map(|p| {
            let path = p
                .strip_prefix(&root)
                .expect("under engine/src")
                .to_string_lossy()
                .replace('\\', "/");
            if path == "lib.rs" || path == "main.rs" {
                return None;
            }
            let text = std::fs::read_to_string(&p).expect("a source file reads");
            let module = module_of(&path);
            let uses = paths_in(&product_code(&text))
                .into_iter()
                .filter_map(|(head, rest)| absolute(&module, &head, rest))
                .collect();
            Some(Source { path, module, uses })
        })
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source directory reads") {
        let p = entry.expect("a directory entry").path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn module_of(path: &str) -> Vec<String> {
    let mut parts: Vec<String> = path
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// The text without comment lines and without `#[cfg(test)]` items (rustfmt's layout: the
/// item's closing brace at its own indentation).
fn product_code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim();
        if t == "#[cfg(test)]" {
            let mut j = i + 1;
            while j < lines.len() && lines[j].trim_start().starts_with("#[") {
                j += 1;
            }
            let Some(item) = lines.get(j) else { break };
            if item.trim_end().ends_with('{') {
                let indent = &item[..item.len() - item.trim_start().len()];
                let close = format!("{indent}}}");
                j += 1;
                while j < lines.len() && lines[j].trim_end() != close {
                    j += 1;
                }
            }
            i = j + 1;
            continue;
        }
        if !t.starts_with("//") {
            out.push_str(lines[i]);
            out.push('\n');
        }
        i += 1;
    }
    out
}

/// Every path that starts with `crate`, `super` or `self`: its head and the segments after it,
/// a `{...}` group giving one path per item.
fn paths_in(code: &str) -> Vec<(String, Vec<String>)> {
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        if !ident(b[i]) || (i > 0 && (ident(b[i - 1]) || b[i - 1] == b':' && i >= 2 && b[i - 2] == b':')) {
            i += 1;
            continue;
        }
        while i < b.len() && ident(b[i]) {
            i += 1;
        }
        let head = &code[start..i];
        if !matches!(head, "crate" | "super" | "self") || !code[i..].starts_with("::") {
            continue;
        }
        let (rest, end) = segments(code, i);
        i = end;
        match rest {
            Segs::Path(segs) => out.push((head.to_owned(), segs)),
            Segs::Group(prefix, items) => {
                for item in items {
                    let mut segs = prefix.clone();
                    segs.extend(item.into_iter().filter(|s| s != "self"));
                    out.push((head.to_owned(), segs));
                }
            }
        }
    }
    out
}

enum Segs {
    Path(Vec<String>),
    Group(Vec<String>, Vec<Vec<String>>),
}

/// The segments of a path from `at` (at its first `::`), and where it ends.
fn segments(code: &str, mut at: usize) -> (Segs, usize) {
    let b = code.as_bytes();
    let mut segs = Vec::new();
    while code[at..].starts_with("::") {
        at += 2;
        if b.get(at) == Some(&b'{') {
            let mut depth = 0;
            let mut end = at;
            for (k, c) in code[at..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = at + k;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let inner = &code[at + 1..end];
            let mut items = Vec::new();
            let mut depth = 0;
            let mut from = 0;
            for (k, c) in inner.char_indices().chain([(inner.len(), ',')]) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        let item: Vec<String> = inner[from..k]
                            .split("::")
                            .map(|s| s.trim().split(' ').next().unwrap_or("").to_owned())
                            .take_while(|s| !s.is_empty() && !s.starts_with('{') && s != "*")
                            .collect();
                        items.push(item);
                        from = k + 1;
                    }
                    _ => {}
                }
            }
            return (Segs::Group(segs, items), end + 1);
        }
        let from = at;
        while b.get(at).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_') {
            at += 1;
        }
        if at == from {
            break;
        }
        segs.push(code[from..at].to_owned());
    }
    (Segs::Path(segs), at)
}

/// The absolute module path a path names from `module`.
fn absolute(module: &[String], head: &str, rest: Vec<String>) -> Option<Vec<String>> {
    let mut base: Vec<String> = match head {
        "crate" => Vec::new(),
        "self" => module.to_vec(),
        _ => module[..module.len().checked_sub(1)?].to_vec(),
    };
    let mut rest = rest.into_iter().peekable();
    while rest.peek().is_some_and(|s| s == "super") {
        rest.next();
        base.pop()?;
    }
    base.extend(rest);
    (!base.is_empty()).then_some(base)
}

/// The deepest file among `files` that a module path lands in.
fn file_of(files: &BTreeSet<String>, path: &[String]) -> Option<String> {
    (1..=path.len()).rev().find_map(|n| {
        let base = path[..n].join("/");
        [format!("{base}.rs"), format!("{base}/mod.rs")]
            .into_iter()
            .find(|c| files.contains(c))
    })
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The modules `lib.rs` declares.
fn declared_modules() -> Vec<String> {
    let lib = std::fs::read_to_string(src_dir().join("lib.rs")).expect("lib.rs reads");
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';').map(String::from))
        .collect()
}

#[test]
fn every_module_has_its_layer() {
    let declared = declared_modules();
    assert!(declared.len() > 10, "lib.rs's modules are read: {declared:?}");
    let placed: Vec<&str> = LAYERS.iter().flat_map(|l| l.iter().copied()).collect();
    for m in &declared {
        assert!(
            placed.contains(&m.as_str()),
            "module `{m}` has no layer: place it in LAYERS (tests/layers.rs) and ARCHITECTURE.md"
        );
        assert!(
            !PLANNED.contains(&m.as_str()),
            "module `{m}` exists now: take it out of PLANNED (tests/layers.rs)"
        );
    }
    for m in placed {
        assert!(
            declared.iter().any(|d| d == m) || PLANNED.contains(&m),
            "LAYERS names `{m}`, which lib.rs does not declare"
        );
    }
}

#[test]
fn modules_use_only_the_layers_below_their_own() {
    let declared = declared_modules();
    let mut up = Vec::new();
    let mut seen_allowed = BTreeSet::new();
    for s in sources() {
        let from = s.module[0].as_str();
        let Some(own) = layer_of(from) else { continue };
        for used in &s.uses {
            let to = used[0].as_str();
            if to == from {
                continue;
            }
            match layer_of(to) {
                Some(l) if l < own => {}
                // Not a module of the crate (a crate-root item, a macro's path): not an arrow.
                None if !declared.iter().any(|d| d == to) => {}
                _ => {
                    let path = used.join("::");
                    let allowed = UP_ALLOWED
                        .iter()
                        .find(|(f, p)| *f == s.path && (path == *p || path.starts_with(&format!("{p}::"))));
                    if let Some(a) = allowed {
                        seen_allowed.insert(*a);
                    } else {
                        up.push(format!("{} uses `{}` ({})", s.path, to, used.join("::")));
                    }
                }
            }
        }
    }
    up.sort();
    up.dedup();
    assert!(
        up.is_empty(),
        "modules use a module of their own layer or above (see ARCHITECTURE.md, \"Layers\"):\n{}",
        up.join("\n")
    );
    let stale: Vec<_> = UP_ALLOWED.iter().filter(|a| !seen_allowed.contains(a)).collect();
    assert!(
        stale.is_empty(),
        "these allowlisted arrows no longer exist: take them out of UP_ALLOWED: {stale:?}"
    );
}

#[test]
fn no_files_import_each_other() {
    let sources = sources();
    let files: BTreeSet<String> = sources.iter().map(|s| s.path.clone()).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in &sources {
        for used in &s.uses {
            if let Some(to) = file_of(&files, used)
                && to != s.path
            {
                edges.entry(s.path.clone()).or_default().insert(to);
            }
        }
    }
    let mut stale = Vec::new();
    for (from, to) in CYCLE_ALLOWED {
        let removed = edges.get_mut(*from).is_some_and(|tos| tos.remove(*to));
        if !removed {
            stale.push((from, to));
        }
    }
    assert!(
        stale.is_empty(),
        "these allowlisted imports no longer exist: take them out of CYCLE_ALLOWED: {stale:?}"
    );
    // Depth-first, reporting the first cycle found as `a -> b -> a`.
    let mut state: BTreeMap<&str, u8> = BTreeMap::new();
    let mut stack: Vec<&str> = Vec::new();
    fn visit<'a>(
        f: &'a str,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<&'a str, u8>,
        stack: &mut Vec<&'a str>,
    ) -> Option<String> {
        state.insert(f, 1);
        stack.push(f);
        for to in edges.get(f).into_iter().flatten() {
            match state.get(to.as_str()) {
                Some(1) => {
                    let at = stack.iter().position(|s| *s == to).expect("on the stack");
                    let mut cycle: Vec<&str> = stack[at..].to_vec();
                    cycle.push(to);
                    return Some(cycle.join(" -> "));
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(to, edges, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(f, 2);
        None
    }
    for f in &files {
        if !state.contains_key(f.as_str())
            && let Some(cycle) = visit(f, &edges, &mut state, &mut stack)
        {
            panic!("files import each other: {cycle}; move what they share to where it belongs");
        }
    }
}

/// The most lines a source file may have: past it, a file holds more than one concept and is
/// split by concept (as `runtime/engine/`, `model/build/` and `batch/` were).
const MAX_LINES: usize = 1_500;

/// No source file of the engine, its tests or its examples is over [`MAX_LINES`] lines.
#[test]
fn no_file_is_over_the_line_bound() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["engine/src", "tests", "examples"] {
        walk(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "the walk found the sources: {}", files.len());
    let mut long: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let n = std::fs::read_to_string(p)
                .expect("a source file reads")
                .lines()
                .count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", p.strip_prefix(root).unwrap().display()))
        })
        .collect();
    long.sort();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines, to split by concept: {long:?}"
    );
}

/// The reader itself: the paths it finds, and what it skips.
#[test]
fn the_reader_finds_paths_outside_comments_and_tests() {
    let code = product_code(
        "use crate::a::B;\n\
         // use crate::commented::Out;\n\
         use super::{c, d::E, self};\n\
         fn f() { crate::g::h(); self::k(); }\n\
         #[cfg(test)]\n\
         mod tests {\n    use crate::tested::Out;\n}\n\
         use super::super::m::N;\n",
    );
    let module: Vec<String> = ["x", "y"].map(String::from).to_vec();
    let mut found: Vec<String> = paths_in(&code)
        .into_iter()
        .filter_map(|(h, r)| absolute(&module, &h, r))
        .map(|p| p.join("::"))
        .collect();
    found.sort();
    assert_eq!(found, ["a::B", "g::h", "m::N", "x", "x::c", "x::d::E", "x::y::k"]);
}
