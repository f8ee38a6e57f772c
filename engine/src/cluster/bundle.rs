//! The flow bundle (SPEC §12): the files a submitted batch runs from, by content hash, so that
//! workers need no flow files of their own.
//!
//! A bundle holds every file the flow was loaded from (the top flow, the flows it calls, the
//! files it imports, its schema files), every file a `command` agent names by a literal
//! argument (`run: [python3, tools/score.py]`) and every file a stdio MCP server's `command:`
//! names (relative to the flow file's directory, where it starts), and every file its `bundle:` patterns match
//! (`bundle: [tools/*.py]`, relative to the flow file, under the project root, at most
//! [`MAX_LISTED_BYTES`] per agent), each by its path relative to the project root. Files of
//! a script's kind beside it or in the command's working directory that the bundle lacks are
//! reported ([`Unshipped`]) so `submit` can warn before workers fail on them.
//! Its hash covers the format, the top flow's path, the directory commands run in, and every
//! file's path, mode and bytes, so the same files give the same bundle on any machine.
//!
//! A worker writes a bundle once under its cache directory (`<cache>/<hash>/`, through a
//! temporary directory renamed into place, so a half-written bundle is never read) and loads
//! the flow from there as `batch` loads one from disk. Commands without a `cwd` run in the
//! bundle's copy of the directory `submit` ran in, so the relative paths they name resolve as
//! they did there.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::plan::{AgentPlan, AgentPlanSpec, CallPlan, Plan, PlanNode, StepPlanKind};
use crate::project::Project;

/// The bundle format this build writes and reads. A worker refuses a bundle of another.
pub const BUNDLE_FORMAT: i64 = 1;

/// The largest file a bundle takes (a command's script, a schema): larger ones are refused at
/// `submit`, where the user can do something about it.
const MAX_FILE_BYTES: u64 = 64 << 20;

/// The most bytes the files of one agent's `bundle:` patterns may come to.
const MAX_LISTED_BYTES: u64 = 64 << 20;

/// The most files one warning names.
const UNSHIPPED_NAMED: usize = 20;

/// One file of a bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleFile {
    /// Relative to the project root, `/`-separated, with no `.` or `..` parts.
    pub path: String,
    pub bytes: Vec<u8>,
    /// Whether the file is executable (a script a command runs as its program).
    pub executable: bool,
}

/// A flow and the files it reads, by content hash.
#[derive(Clone, Debug)]
pub struct Bundle {
    /// SHA-256 (hex) of the format, `top`, `cwd` and every file.
    pub hash: String,
    pub format: i64,
    /// The top flow's path in the bundle.
    pub top: String,
    /// Where commands without a `cwd` run, in the bundle (`""`: its root).
    pub cwd: String,
    /// By path.
    pub files: Vec<BundleFile>,
    /// What [`Bundle::gather`] found missing: files beside a command's scripts, or in its
    /// working directory, that the bundle lacks. Not stored.
    pub unshipped: Vec<Unshipped>,
}

/// Files a command's directories hold that the bundle lacks: of the kind of the scripts it
/// runs (the same extension), in their directories or the directory it runs in. A script's
/// sibling module is the usual one (`from helpers import score`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unshipped {
    pub agent: String,
    /// Relative to the project root.
    pub files: Vec<String>,
}

/// A bundle written out under a cache directory.
#[derive(Clone, Debug)]
pub struct Materialized {
    /// The project root: the bundle's directory.
    pub root: PathBuf,
    /// The top flow file.
    pub top: PathBuf,
    /// The directory commands without a `cwd` run in.
    pub cwd: PathBuf,
}

/// The encoded form of [`Bundle::files`] and [`Bundle::cwd`], as stored.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Encoded {
    cwd: String,
    files: BTreeMap<String, EncodedFile>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EncodedFile {
    /// The bytes, when they are UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    /// The bytes in hex, when they are not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hex: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    exec: bool,
}

impl Bundle {
    /// Gathers the bundle of `flow`, loaded as `project` and compiled as `plan`: every file the
    /// project read, and every file a command names by a literal argument. Errors name the
    /// file that cannot go in and why.
    pub fn gather(flow: &Path, project: &Project, plan: &Plan) -> Result<Bundle, String> {
        let root = project
            .root
            .canonicalize()
            .unwrap_or_else(|_| project.root.clone());
        let mut files: BTreeMap<String, BundleFile> = BTreeMap::new();
        for (_, source) in project.sources.files() {
            let Some(path) = &source.path else { continue };
            let rel = relative(&root, path).ok_or_else(|| {
                format!(
                    "`{}` is outside the project root `{}`; pass `--root` with a directory that holds it",
                    path.display(),
                    root.display()
                )
            })?;
            files.insert(
                rel.clone(),
                BundleFile {
                    path: rel,
                    bytes: source.text.as_bytes().to_vec(),
                    executable: is_executable(path),
                },
            );
        }
        let top_path = flow
            .canonicalize()
            .map_err(|e| format!("`{}`: {e}", flow.display()))?;
        let top = relative(&root, &top_path).ok_or_else(|| {
            format!(
                "`{}` is outside the project root `{}`",
                flow.display(),
                root.display()
            )
        })?;
        let here = std::env::current_dir()
            .ok()
            .and_then(|d| d.canonicalize().ok())
            .unwrap_or_else(|| root.clone());
        let cwd = relative(&root, &here).unwrap_or_default();
        let mut listed_bytes = 0u64;
        let mut ran = Vec::new();
        for command in commands(plan) {
            let AgentPlanSpec::Command(c) = &command.spec else {
                continue;
            };
            let base = c.cwd.clone().unwrap_or_else(|| here.clone());
            let scripts = named_files(&root, &command.name, c, &base)?;
            for (rel, canonical) in &scripts {
                add_file(&mut files, rel, canonical, &command.name)?;
            }
            for pattern in &c.bundle {
                let found = crate::glob::expand(&root, &c.flow_dir, pattern)
                    .map_err(|e| format!("agent `{}`: `bundle` pattern `{pattern}` {e}", command.name))?;
                for canonical in found {
                    let Some(rel) = relative(&root, &canonical) else {
                        continue;
                    };
                    listed_bytes += add_file(&mut files, &rel, &canonical, &command.name)?;
                    if listed_bytes > MAX_LISTED_BYTES {
                        return Err(format!(
                            "agent `{}`: the files its `bundle` patterns name come to more than {MAX_LISTED_BYTES} bytes; \
                             name the files the program needs",
                            command.name
                        ));
                    }
                }
            }
            ran.push((command.name.clone(), base, scripts));
        }
        // A stdio MCP server's program and the files its arguments name, relative to the flow
        // file's directory where it starts, go in like a command's scripts.
        for server in mcp_servers(plan) {
            let crate::plan::McpTransport::Stdio { argv, dir, .. } = &server.transport else {
                continue;
            };
            let who = format!("MCP server `{}`", server.name);
            for (rel, canonical) in named_args(&root, &who, argv.iter().map(String::as_str), dir)? {
                add_file(&mut files, &rel, &canonical, &server.name)?;
            }
        }
        // A mock's files (`{file: {path}}`, relative to its flow file's directory) go in too: a
        // worker's mock reads them from the materialized bundle.
        for agent in commands(plan) {
            let AgentPlanSpec::Mock(m) = &agent.spec else {
                continue;
            };
            let mut paths = Vec::new();
            for t in m.returns.iter().chain(&m.sequence) {
                mock_file_paths(t, &mut paths);
            }
            for path in paths {
                let full = m.dir.join(path);
                let canonical = full
                    .canonicalize()
                    .map_err(|e| format!("agent `{}`: mock file `{path}`: {e}", agent.name))?;
                let rel = relative(&root, &canonical).ok_or_else(|| {
                    format!(
                        "agent `{}`: mock file `{path}` is outside the project root `{}`",
                        agent.name,
                        root.display()
                    )
                })?;
                add_file(&mut files, &rel, &canonical, &agent.name)?;
            }
        }
        let unshipped = unshipped(&root, &ran, &files);
        let files: Vec<BundleFile> = files.into_values().collect();
        let hash = hash(BUNDLE_FORMAT, &top, &cwd, &files);
        Ok(Bundle {
            hash,
            format: BUNDLE_FORMAT,
            top,
            cwd,
            files,
            unshipped,
        })
    }

    /// The stored form of the files and the command directory (JSON).
    pub fn encode_files(&self) -> String {
        let files = self
            .files
            .iter()
            .map(|f| {
                let (text, hex) = match std::str::from_utf8(&f.bytes) {
                    Ok(t) => (Some(t.to_string()), None),
                    Err(_) => (None, Some(to_hex(&f.bytes))),
                };
                (
                    f.path.clone(),
                    EncodedFile {
                        text,
                        hex,
                        exec: f.executable,
                    },
                )
            })
            .collect();
        serde_json::to_string(&Encoded {
            cwd: self.cwd.clone(),
            files,
        })
        .expect("a bundle serializes")
    }

    /// Reads a stored bundle back, refusing one of a format this build does not know, one whose
    /// paths leave its directory, and one whose contents do not have its hash.
    pub fn decode(hash: &str, format: i64, top: &str, files: &str) -> Result<Bundle, String> {
        if format != BUNDLE_FORMAT {
            return Err(format!(
                "the flow bundle {hash} has format {format}, and this switchyard reads format {BUNDLE_FORMAT} only; \
                 run a worker of the switchyard that submitted it"
            ));
        }
        let encoded: Encoded =
            serde_json::from_str(files).map_err(|e| format!("the flow bundle {hash} cannot be read: {e}"))?;
        let mut out = Vec::with_capacity(encoded.files.len());
        for (path, f) in encoded.files {
            if !safe_relative(&path) {
                return Err(format!(
                    "the flow bundle {hash} has a file `{path}` that leaves its directory"
                ));
            }
            let bytes = match (f.text, f.hex) {
                (Some(t), None) => t.into_bytes(),
                (None, Some(h)) => from_hex(&h)
                    .ok_or_else(|| format!("the flow bundle {hash}: file `{path}` is not valid hex"))?,
                _ => {
                    return Err(format!(
                        "the flow bundle {hash}: file `{path}` needs one of `text` and `hex`"
                    ));
                }
            };
            out.push(BundleFile {
                path,
                bytes,
                executable: f.exec,
            });
        }
        let cwd_ok = encoded.cwd.is_empty() || safe_relative(&encoded.cwd);
        for (what, p, ok) in [
            ("top flow", top, safe_relative(top)),
            ("command directory", encoded.cwd.as_str(), cwd_ok),
        ] {
            if !ok {
                return Err(format!(
                    "the flow bundle {hash} has a {what} `{p}` that leaves its directory"
                ));
            }
        }
        if !out.iter().any(|f| f.path == top) {
            return Err(format!(
                "the flow bundle {hash} does not hold its top flow `{top}`"
            ));
        }
        let actual = self::hash(format, top, &encoded.cwd, &out);
        if actual != hash {
            return Err(format!(
                "the flow bundle {hash} does not have its hash (its contents hash to {actual}); it was changed in the store"
            ));
        }
        Ok(Bundle {
            hash: hash.to_string(),
            format,
            top: top.to_string(),
            cwd: encoded.cwd,
            files: out,
            unshipped: Vec::new(),
        })
    }

    /// Writes the bundle under `cache` (once: a bundle already there is used as it is) and
    /// says where its files are.
    pub fn materialize(&self, cache: &Path) -> std::io::Result<Materialized> {
        let dir = cache.join(&self.hash);
        let done = Materialized {
            top: dir.join(&self.top),
            cwd: dir.join(&self.cwd),
            root: dir.clone(),
        };
        if dir.is_dir() {
            return Ok(done);
        }
        std::fs::create_dir_all(cache)?;
        let tmp = cache.join(format!(
            ".{}.{}.{}",
            self.hash,
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        let written = (|| {
            std::fs::create_dir_all(&tmp)?;
            std::fs::create_dir_all(tmp.join(&self.cwd))?;
            for f in &self.files {
                let path = tmp.join(&f.path);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(&path, &f.bytes)?;
                if f.executable {
                    set_executable(&path)?;
                }
            }
            std::fs::rename(&tmp, &dir)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&tmp);
            // Another worker on this machine wrote it first.
            if dir.is_dir() {
                return Ok(done);
            }
            return Err(std::io::Error::new(
                e.kind(),
                format!("writing the flow bundle under `{}`: {e}", cache.display()),
            ));
        }
        Ok(done)
    }
}

/// The files a command names by a literal argument (`run: [python3, tools/score.py]`),
/// relative to the directory it runs in: (path in the bundle, canonical path).
fn named_files(
    root: &Path,
    agent: &str,
    c: &crate::plan::CommandPlan,
    base: &Path,
) -> Result<Vec<(String, PathBuf)>, String> {
    let args = c.run.iter().filter(|t| t.is_plain()).map(|t| t.text());
    named_args(root, &format!("agent `{agent}`"), args, base)
}

/// The files that literal arguments name, relative to `base`: (path in the bundle, canonical
/// path). `who` names what runs them in errors.
fn named_args<'a>(
    root: &Path,
    who: &str,
    args: impl Iterator<Item = &'a str>,
    base: &Path,
) -> Result<Vec<(String, PathBuf)>, String> {
    let mut out = Vec::new();
    for arg in args {
        if arg.is_empty() || arg.starts_with('-') || Path::new(arg).is_absolute() {
            continue;
        }
        let candidate = base.join(arg);
        if !std::fs::metadata(&candidate).is_ok_and(|m| m.is_file()) {
            continue;
        }
        let canonical = candidate.canonicalize().unwrap_or(candidate.clone());
        let Some(rel) = relative(root, &canonical) else {
            return Err(format!(
                "{who} runs `{arg}`, which is `{}`, outside the project root `{}`: workers could not \
                 find it; pass `--root` with a directory that holds it",
                canonical.display(),
                root.display()
            ));
        };
        out.push((rel, canonical));
    }
    Ok(out)
}

/// Adds a file to the bundle unless it is there already; its size (0 when it was there).
fn add_file(
    files: &mut BTreeMap<String, BundleFile>,
    rel: &str,
    canonical: &Path,
    agent: &str,
) -> Result<u64, String> {
    if files.contains_key(rel) {
        return Ok(0);
    }
    let len = std::fs::metadata(canonical)
        .map_err(|e| format!("`{}`: {e}", canonical.display()))?
        .len();
    if len > MAX_FILE_BYTES {
        return Err(format!(
            "agent `{agent}` needs `{rel}`, {len} bytes: a bundle takes files of at most {MAX_FILE_BYTES} bytes"
        ));
    }
    let bytes = std::fs::read(canonical).map_err(|e| format!("`{}`: {e}", canonical.display()))?;
    files.insert(
        rel.to_owned(),
        BundleFile {
            path: rel.to_owned(),
            bytes,
            executable: is_executable(canonical),
        },
    );
    Ok(len)
}

/// A command as `submit` saw it: its agent, the directory it runs in, the files it names
/// (path in the bundle, canonical path).
type Ran = (String, PathBuf, Vec<(String, PathBuf)>);

/// For each command (agent, working directory, its scripts), the files of its scripts' kinds
/// in their directories and in its working directory that the bundle lacks.
fn unshipped(root: &Path, ran: &[Ran], files: &BTreeMap<String, BundleFile>) -> Vec<Unshipped> {
    let mut out: Vec<Unshipped> = Vec::new();
    for (agent, base, scripts) in ran {
        let kinds: Vec<&std::ffi::OsStr> = scripts.iter().filter_map(|(_, p)| p.extension()).collect();
        if kinds.is_empty() {
            continue;
        }
        let mut dirs: Vec<PathBuf> = scripts
            .iter()
            .filter_map(|(_, p)| p.parent().map(Path::to_path_buf))
            .collect();
        dirs.push(base.canonicalize().unwrap_or_else(|_| base.clone()));
        dirs.sort();
        dirs.dedup();
        let mut lacking = Vec::new();
        for dir in dirs {
            let Ok(read) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in read.flatten() {
                let path = e.path();
                let hidden = e.file_name().to_string_lossy().starts_with('.');
                if hidden || !e.file_type().is_ok_and(|t| t.is_file()) {
                    continue;
                }
                if !path.extension().is_some_and(|x| kinds.contains(&x)) {
                    continue;
                }
                if let Some(rel) = relative(root, &path)
                    && !files.contains_key(&rel)
                {
                    lacking.push(rel);
                }
            }
        }
        lacking.sort();
        lacking.dedup();
        lacking.truncate(UNSHIPPED_NAMED);
        if !lacking.is_empty() && !out.iter().any(|u| u.agent == *agent && u.files == lacking) {
            out.push(Unshipped {
                agent: agent.clone(),
                files: lacking,
            });
        }
    }
    out
}

/// Where workers write bundles: `SWITCHYARD_BUNDLE_DIR`, else the user's cache directory
/// (`$XDG_CACHE_HOME/switchyard/bundles`, `~/.cache/switchyard/bundles`), else the system's
/// temporary directory.
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SWITCHYARD_BUNDLE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("switchyard").join("bundles");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(h).join(".cache").join("switchyard").join("bundles");
    }
    std::env::temp_dir().join("switchyard-bundles")
}

/// Every agent of the plan that a step, a branch, a loop body or an agent loop's tool calls.
fn commands(plan: &Plan) -> Vec<&AgentPlan> {
    fn call<'a>(c: &'a CallPlan, out: &mut Vec<&'a AgentPlan>) {
        out.push(&c.agent);
        if let AgentPlanSpec::Llm(l) = &c.agent.spec
            && let Some(lp) = &l.agent_loop
        {
            for t in &lp.tools {
                call(&t.call, out);
            }
        }
    }
    let mut out = Vec::new();
    for flow in &plan.flows {
        for node in flow.graph.node_weights() {
            let PlanNode::Step(s) = node else { continue };
            match &s.kind {
                StepPlanKind::Call(c) => call(c, &mut out),
                StepPlanKind::Foreach(f) => call(&f.body, &mut out),
                StepPlanKind::While(w) => call(&w.body, &mut out),
                StepPlanKind::Parallel(p) => p.branches.iter().for_each(|(_, c)| call(c, &mut out)),
                _ => {}
            }
        }
    }
    out
}

/// The literal `path`s of the mock file specs (`{file: {path: ...}}`) in `t`.
fn mock_file_paths<'t>(t: &'t crate::expr::value::ValueTemplate, out: &mut Vec<&'t str>) {
    use crate::expr::value::ValueTemplate;
    fn literal<'v>(v: &'v serde_json::Value, out: &mut Vec<&'v str>) {
        match v {
            serde_json::Value::Object(o) => {
                if let Some(p) = o
                    .get("file")
                    .and_then(|f| f.get("path"))
                    .and_then(serde_json::Value::as_str)
                {
                    out.push(p);
                }
                o.values().for_each(|x| literal(x, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| literal(x, out)),
            _ => {}
        }
    }
    match t {
        ValueTemplate::Literal(v) => literal(v, out),
        ValueTemplate::Expr(_) => {}
        ValueTemplate::Array(items) => items.iter().for_each(|x| mock_file_paths(x, out)),
        ValueTemplate::Object(entries) => {
            for (k, v) in entries {
                if k == "file"
                    && let ValueTemplate::Object(spec) = v
                    && let Some((_, ValueTemplate::Literal(serde_json::Value::String(p)))) =
                        spec.iter().find(|(k, _)| k == "path")
                {
                    out.push(p);
                }
                mock_file_paths(v, out);
            }
        }
    }
}

/// Every MCP server a step's agent or an agent loop's tools reach, once each.
fn mcp_servers(plan: &Plan) -> Vec<&crate::plan::McpServerPlan> {
    let mut out: Vec<&crate::plan::McpServerPlan> = Vec::new();
    for agent in commands(plan) {
        let found: Vec<&crate::plan::McpServerPlan> = match &agent.spec {
            AgentPlanSpec::Mcp(m) => vec![&*m.server],
            AgentPlanSpec::Llm(l) => l
                .agent_loop
                .iter()
                .flat_map(|lp| lp.servers.iter().map(|s| &*s.server))
                .collect(),
            _ => Vec::new(),
        };
        for server in found {
            if !out.iter().any(|s| std::ptr::eq(*s, server)) {
                out.push(server);
            }
        }
    }
    out
}

/// `path` relative to `root`, `/`-separated; `None` when it is not under `root`.
fn relative(root: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(root).ok()?;
    let mut parts = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str()?.to_string()),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(parts.join("/"))
}

/// Whether a stored path stays inside the bundle's directory.
fn safe_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != ".." && !p.contains('\\') && !p.contains('\0'))
}

fn hash(format: i64, top: &str, cwd: &str, files: &[BundleFile]) -> String {
    let mut h = Sha256::new();
    h.update(format!("switchyard bundle {format}\0{top}\0{cwd}\0").as_bytes());
    // By path, whatever order they come in.
    let mut files: Vec<&BundleFile> = files.iter().collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    for f in files {
        h.update(f.path.as_bytes());
        h.update([0, u8::from(f.executable)]);
        h.update((f.bytes.len() as u64).to_le_bytes());
        h.update(&f.bytes);
    }
    to_hex(&h.finalize())
}

fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(_: &Path) -> bool {
    false
}

#[cfg(unix)]
fn set_executable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut p = std::fs::metadata(path)?.permissions();
    p.set_mode(p.mode() | 0o755);
    std::fs::set_permissions(path, p)
}

#[cfg(not(unix))]
fn set_executable(_: &Path) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(files: &[(&str, &[u8], bool)]) -> Bundle {
        let files: Vec<BundleFile> = files
            .iter()
            .map(|(p, b, x)| BundleFile {
                path: (*p).to_string(),
                bytes: b.to_vec(),
                executable: *x,
            })
            .collect();
        Bundle {
            hash: hash(BUNDLE_FORMAT, "flow.yaml", "", &files),
            format: BUNDLE_FORMAT,
            top: "flow.yaml".into(),
            cwd: String::new(),
            files,
            unshipped: Vec::new(),
        }
    }

    #[test]
    fn encodes_and_decodes_text_binary_and_modes() {
        let b = bundle(&[
            ("flow.yaml", b"flow: x\n", false),
            ("bin/tool", &[0xff, 0, 7], true),
        ]);
        let back = Bundle::decode(&b.hash, b.format, &b.top, &b.encode_files()).unwrap();
        let mut want = b.files.clone();
        want.sort_by(|x, y| x.path.cmp(&y.path));
        assert_eq!(back.files, want);
        assert_eq!(back.hash, b.hash);
    }

    #[test]
    fn refuses_another_format_a_changed_file_and_escaping_paths() {
        let b = bundle(&[("flow.yaml", b"flow: x\n", false)]);
        let err = Bundle::decode(&b.hash, 2, &b.top, &b.encode_files()).unwrap_err();
        assert!(err.contains("format 2"), "{err}");
        let changed = b.encode_files().replace("flow: x", "flow: y");
        let err = Bundle::decode(&b.hash, 1, &b.top, &changed).unwrap_err();
        assert!(err.contains("does not have its hash"), "{err}");
        let escaping = r#"{"cwd":"","files":{"../evil":{"text":"x"},"flow.yaml":{"text":"flow: x\n"}}}"#;
        let err = Bundle::decode(&b.hash, 1, &b.top, escaping).unwrap_err();
        assert!(err.contains("leaves its directory"), "{err}");
    }

    #[test]
    fn materializes_once_with_modes() {
        let cache = std::env::temp_dir().join(format!("sy-bundle-test-{}", std::process::id()));
        let b = bundle(&[
            ("flow.yaml", b"flow: x\n", false),
            ("bin/tool", b"#!/bin/sh\n", true),
        ]);
        let m = b.materialize(&cache).unwrap();
        assert_eq!(std::fs::read(&m.top).unwrap(), b"flow: x\n");
        assert!(is_executable(&m.root.join("bin/tool")));
        assert!(!is_executable(&m.top));
        // A second write finds it there.
        let again = b.materialize(&cache).unwrap();
        assert_eq!(again.root, m.root);
        std::fs::remove_dir_all(&cache).unwrap();
    }
}
