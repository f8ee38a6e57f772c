//! Loading a project: the top flow, the files it imports, the flows it calls and the JSON
//! Schemas it names, each parsed once. This is the only module before the runtime that reads
//! files; everything after it (lint, compile) works on the loaded [`Project`].
//!
//! Paths are relative to the file that names them and may not leave the project root (the
//! directory of the top flow, or `--root`). Problems of reach (a missing file, a path outside
//! the root) are diagnostics here; cycles are found by `lint` from the recorded edges.
//!
//! Reading, hashing, parsing and lowering a file into the model is pure work on its bytes
//! (`PreparedFile`); adding it to the project and resolving what it names is not.
//! [`Project::load_tops`] does the first part for many top-level files on every core and the
//! second in order on the calling thread, with the same result as loading them one by one.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;
use sha2::{Digest, Sha256};

use crate::diag::{Diagnostic, codes};
use crate::glob::normalize;
use crate::model::build::{self, Cx, Library};
use crate::model::{Agent, AgentRef, AgentSpec, Flow, McpServer, Provider, SchemaRef, Sp, StepKind};
use crate::source::{FileId, SourceFile, SourceMap, Span};
use crate::syntax::{self, Limits, Node};

/// Index of a flow in [`Project::flows`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowId(pub usize);

/// Index of an imported file in [`Project::libraries`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LibId(pub usize);

/// A flow file as loaded.
#[derive(Debug)]
pub struct LoadedFlow {
    pub path: PathBuf,
    pub file: FileId,
    /// `None` when the file could not be parsed into a flow at all.
    pub flow: Option<Flow>,
    /// SHA-256 of the file's bytes, hex; empty when the file was too large to read.
    pub hash: String,
    /// Each `imports:` entry and the library it resolved to.
    pub imports: Vec<(Sp<String>, Option<LibId>)>,
    /// Steps (of this flow and its inline flows) whose kind could not be read, by the span of
    /// their id. The model keeps them with a placeholder kind, so that edges to them resolve
    /// and the steps after them stay reachable; lint checks no kind-specific rule on them.
    /// Their problem is already an error, so the flow never compiles.
    pub malformed_steps: HashSet<Span>,
}

/// An imported file of agents and providers.
#[derive(Debug)]
pub struct LoadedLibrary {
    pub path: PathBuf,
    pub file: FileId,
    pub library: Library,
    /// SHA-256 of the file's bytes, hex; empty when the file was too large to read.
    pub hash: String,
    pub imports: Vec<(Sp<String>, Option<LibId>)>,
}

/// An agent-change file named on the command line: its YAML tree when it parsed (its syntax
/// problems are in the project's diagnostics). `lint` reads the changes from it and reports
/// what stops them from being read (`runtime::changes::from_node`): replacement agents are
/// plan parts, made above this module.
#[derive(Debug)]
pub struct LoadedChanges {
    pub file: FileId,
    pub node: Option<Node>,
}

/// A JSON Schema file named by a flow.
#[derive(Debug)]
pub struct LoadedSchema {
    pub file: FileId,
    pub node: Option<Node>,
}

/// Everything one command needs from disk.
#[derive(Debug, Default)]
pub struct Project {
    pub root: PathBuf,
    pub sources: SourceMap,
    pub flows: Vec<LoadedFlow>,
    pub libraries: Vec<LoadedLibrary>,
    /// Schema files by canonical path.
    pub schemas: HashMap<PathBuf, LoadedSchema>,
    /// Agent-change files named on the command line (`--agent-change` files, SPEC §8.4).
    pub changes: Vec<LoadedChanges>,
    /// Flow files called by `flow` agents: (calling flow, the `path` span, the callee).
    pub calls: Vec<(FlowId, Sp<String>, Option<FlowId>)>,
    /// Problems found while loading (parse errors, shape errors, missing files).
    pub diags: Vec<Diagnostic>,
    /// Where `command` agents without a `cwd` run; `None`: the process's working directory.
    /// A worker sets it to its copy of the directory `submit` ran in (SPEC §12).
    pub command_dir: Option<PathBuf>,
    by_path: HashMap<PathBuf, Loaded>,
}

#[derive(Clone, Copy, Debug)]
enum Loaded {
    Flow(FlowId),
    Library(LibId),
}

/// A file over the size limit, with its size in bytes: refused before it was read.
#[derive(Clone, Copy, Debug)]
struct TooLarge(usize);

/// The bytes of a file, or why they were not read.
type Contents = Result<Vec<u8>, TooLarge>;

/// The outcome of reading a file: its contents, or the error that stopped the read.
type FileRead = std::io::Result<Contents>;

/// Reads a file whole, once. A file larger than `max` bytes is not read: its size comes from
/// its metadata. A file that grows past the limit while it is read (or whose size the metadata
/// does not tell, like a pipe) is read only one byte past the limit.
fn read_limited(path: &Path, max: usize) -> FileRead {
    use std::io::Read as _;
    let file = std::fs::File::open(path)?;
    let len = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
    if len > max {
        return Ok(Err(TooLarge(len)));
    }
    let mut bytes = Vec::with_capacity(len);
    let cap = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    file.take(cap).read_to_end(&mut bytes)?;
    if bytes.len() > max {
        return Ok(Err(TooLarge(bytes.len().max(len))));
    }
    Ok(Ok(bytes))
}

/// Options for loading.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// The project root; default the directory of the first flow loaded.
    pub root: Option<PathBuf>,
    pub limits: Limits,
}

impl Project {
    /// An empty project rooted at `root`.
    pub fn new(root: PathBuf) -> Self {
        Project {
            root,
            ..Default::default()
        }
    }

    /// Loads a top-level file named on the command line, with its own project root: a flow
    /// (and everything it names), or a file of shared agents (checked for shape only). Which
    /// one is decided by its keys: a flow has `flow:` or `steps:`.
    pub fn load_top(&mut self, path: &Path, root: PathBuf, limits: &Limits) -> Option<FlowId> {
        let prepared = prepare_top(path, self.sources.next_id(), limits, Parse::Spawn);
        self.load_top_prepared(prepared, root, limits)
    }

    /// [`load_top`](Self::load_top) of a file made ready by [`prepare_top`]: it is added as
    /// the next file of the project (re-numbered, and lowered into the model again, when it
    /// was prepared as another file), then everything it names is loaded.
    fn load_top_prepared(&mut self, prepared: PreparedTop, root: PathBuf, limits: &Limits) -> Option<FlowId> {
        self.root = root;
        let (canonical, read) = match prepared.prepared {
            Ok(p) => p,
            Err(e) => {
                self.unreadable_top(&prepared.path, &e);
                return None;
            }
        };
        match self.by_path.get(&canonical) {
            Some(Loaded::Flow(id)) => return Some(*id),
            Some(Loaded::Library(_)) => return None,
            None => {}
        }
        match read {
            Prepared::Failed(e) => self.load_flow_read(canonical, display(&prepared.path), Err(e), limits),
            Prepared::Flow(file) => {
                let file = file.renumbered(self.sources.next_id(), limits);
                self.finish_flow(canonical, file, limits)
            }
            Prepared::Library(file) => {
                let file = file.renumbered(self.sources.next_id(), limits);
                self.finish_library(canonical, file, limits);
                None
            }
            Prepared::Changes(file) => {
                let file = file.renumbered(self.sources.next_id(), limits);
                let Added { file, node, .. } = self.add_file(file);
                self.changes.push(LoadedChanges { file, node });
                None
            }
        }
    }

    /// Loads a flow file and, transitively, everything it names. Returns its id, or `None`
    /// (with a diagnostic) when the file cannot be read.
    pub fn load_flow(&mut self, path: &Path, limits: &Limits) -> Option<FlowId> {
        let canonical = match path.canonicalize() {
            Ok(p) => p,
            Err(e) => {
                self.unreadable_top(path, &e);
                return None;
            }
        };
        self.load_flow_at(canonical, display(path), limits)
    }

    /// `SY210` for a file named on the command line that cannot be found or read.
    fn unreadable_top(&mut self, path: &Path, e: &std::io::Error) {
        let file = self.sources.add(SourceFile::new(display(path), None, ""));
        self.diags.push(
            Diagnostic::new(
                &codes::MISSING_FILE,
                Span::file_start(file),
                format!("cannot read `{}`: {}", display(path), io_reason(e)),
            )
            .label("cannot read"),
        );
    }

    fn load_flow_at(&mut self, canonical: PathBuf, name: String, limits: &Limits) -> Option<FlowId> {
        if let Some(Loaded::Flow(id)) = self.by_path.get(&canonical) {
            return Some(*id);
        }
        let read = read_limited(&canonical, limits.max_bytes);
        self.load_flow_read(canonical, name, read, limits)
    }

    /// Loads a flow whose file has been read (or failed to be), then everything it names.
    fn load_flow_read(
        &mut self,
        canonical: PathBuf,
        name: String,
        read: FileRead,
        limits: &Limits,
    ) -> Option<FlowId> {
        let contents = match read {
            Ok(contents) => contents,
            Err(e) => {
                let file = self
                    .sources
                    .add(SourceFile::new(name.clone(), Some(canonical), ""));
                self.diags.push(
                    Diagnostic::new(
                        &codes::MISSING_FILE,
                        Span::file_start(file),
                        format!("cannot read `{name}`: {}", io_reason(&e)),
                    )
                    .label("cannot read"),
                );
                return None;
            }
        };
        let file = PreparedFile::new(
            self.sources.next_id(),
            name,
            canonical.clone(),
            contents,
            limits,
            Kind::Flow,
            Parse::Spawn,
        );
        self.finish_flow(canonical, file, limits)
    }

    /// Adds a flow file that has been parsed and lowered, then loads everything it names.
    fn finish_flow(&mut self, canonical: PathBuf, prepared: PreparedFile, limits: &Limits) -> Option<FlowId> {
        let Added {
            file, hash, model, ..
        } = self.add_file(prepared);
        let (flow, malformed_steps) = match model {
            Model::Flow { flow, malformed } => (flow, malformed.into_iter().collect()),
            _ => (None, HashSet::new()),
        };
        let id = FlowId(self.flows.len());
        self.by_path.insert(canonical.clone(), Loaded::Flow(id));
        self.flows.push(LoadedFlow {
            path: canonical.clone(),
            file,
            flow,
            hash,
            imports: Vec::new(),
            malformed_steps,
        });
        let dir = canonical.parent().map(Path::to_path_buf).unwrap_or_default();

        // Imports.
        let import_specs = self.flows[id.0]
            .flow
            .as_ref()
            .map(|f| f.imports.clone())
            .unwrap_or_default();
        let imports = import_specs
            .into_iter()
            .map(|spec| {
                let lib = self
                    .resolve(&dir, &spec)
                    .and_then(|p| self.load_library(p, &spec, limits));
                (spec, lib)
            })
            .collect();
        self.flows[id.0].imports = imports;

        // Flow agents by path, and schema files, in this flow and in its inline flows.
        let mut flow_paths = Vec::new();
        let mut schema_paths = Vec::new();
        let mut bundle_patterns = Vec::new();
        let mut fixtures = Vec::new();
        if let Some(flow) = &self.flows[id.0].flow {
            let mut refs = Refs {
                flows: &mut flow_paths,
                schemas: &mut schema_paths,
                bundles: &mut bundle_patterns,
                fixtures: &mut fixtures,
            };
            collect_refs(flow, &mut refs);
        }
        for spec in flow_paths {
            let callee = self.resolve(&dir, &spec).and_then(|p| {
                let name = self.display_relative(&p);
                self.load_flow_at(p, name, limits)
            });
            self.calls.push((id, spec, callee));
        }
        for spec in schema_paths {
            if let Some(p) = self.resolve(&dir, &spec) {
                self.load_schema(p, limits);
            }
        }
        for spec in bundle_patterns {
            self.check_bundle_pattern(&dir, &spec);
        }
        // Mock files by path: read when the mock is called, so they must exist now, and be
        // files (a FIFO would block the call, a directory cannot be read).
        for spec in fixtures {
            if let Some(p) = self.resolve(&dir, &spec)
                && !p.is_file()
            {
                self.diags.push(
                    Diagnostic::new(
                        &codes::MISSING_FILE,
                        spec.span,
                        format!("cannot read `{}`: not a regular file", spec.value),
                    )
                    .label("not a regular file")
                    .help("a mock file's `path` names a file whose bytes the mock returns"),
                );
            }
        }
        Some(id)
    }

    /// A `command` agent's `bundle:` pattern must name files under the root: `SY210` when it
    /// matches none, `SY209` when it leaves the root, `SY108` when it matches too many.
    fn check_bundle_pattern(&mut self, dir: &Path, spec: &Sp<String>) {
        let Err(e) = crate::glob::expand(&self.root, dir, &spec.value) else {
            return;
        };
        let d = match e {
            crate::glob::GlobError::LeavesRoot(_) => Diagnostic::new(
                &codes::PATH_OUTSIDE_ROOT,
                spec.span,
                format!("`bundle` pattern `{}` {e}", spec.value),
            )
            .label("outside the root")
            .help(format!(
                "a bundle holds files under `{}` only",
                self.root.display()
            )),
            crate::glob::GlobError::NoMatch => Diagnostic::new(
                &codes::MISSING_FILE,
                spec.span,
                format!("`bundle` pattern `{}` matches no file", spec.value),
            )
            .label("no file")
            .help(format!(
                "patterns are relative to the file that names them (`{}`)",
                self.display_relative(dir)
            )),
            crate::glob::GlobError::TooMany => Diagnostic::new(
                &codes::INVALID_VALUE,
                spec.span,
                format!("`bundle` pattern `{}` {e}", spec.value),
            )
            .label("too many files")
            .help("name the files the program needs, not a whole tree"),
        };
        self.diags.push(d);
    }

    /// Adds a prepared file to the source map and its problems (parse, then model) to the
    /// project's.
    fn add_file(&mut self, prepared: PreparedFile) -> Added {
        let file = self.sources.add(prepared.source);
        debug_assert_eq!(
            file, prepared.file,
            "a file is prepared as the next file of the project"
        );
        self.diags.extend(prepared.diags);
        self.diags.extend(prepared.model_diags);
        Added {
            file,
            hash: prepared.hash,
            node: prepared.node,
            model: prepared.model,
        }
    }

    /// Loads the libraries imported by a library, recursively.
    fn load_library(&mut self, canonical: PathBuf, spec: &Sp<String>, limits: &Limits) -> Option<LibId> {
        match self.by_path.get(&canonical) {
            Some(Loaded::Library(id)) => return Some(*id),
            Some(Loaded::Flow(_)) => {
                self.diags.push(
                    Diagnostic::new(&codes::INVALID_VALUE, spec.span, format!("`{}` is a flow, not a file of shared agents", spec.value))
                        .label("a flow file")
                        .help("import files that hold only `agents:` and `providers:`; call flows with a `flow` agent"),
                );
                return None;
            }
            None => {}
        }
        let read = read_limited(&canonical, limits.max_bytes);
        let name = self.display_relative(&canonical);
        let contents = match read {
            Ok(contents) => contents,
            Err(e) => {
                self.diags.push(
                    Diagnostic::new(
                        &codes::MISSING_FILE,
                        spec.span,
                        format!("cannot read `{}`: {}", spec.value, io_reason(&e)),
                    )
                    .label("cannot read"),
                );
                return None;
            }
        };
        let file = PreparedFile::new(
            self.sources.next_id(),
            name,
            canonical.clone(),
            contents,
            limits,
            Kind::Library,
            Parse::Spawn,
        );
        self.finish_library(canonical, file, limits)
    }

    /// Adds a library file that has been parsed and lowered, then the files it imports.
    fn finish_library(
        &mut self,
        canonical: PathBuf,
        prepared: PreparedFile,
        limits: &Limits,
    ) -> Option<LibId> {
        let Added {
            file, hash, model, ..
        } = self.add_file(prepared);
        let library = match model {
            Model::Library { library } => library,
            _ => Library::default(),
        };
        let id = LibId(self.libraries.len());
        self.by_path.insert(canonical.clone(), Loaded::Library(id));
        let specs = library.imports.clone();
        self.libraries.push(LoadedLibrary {
            path: canonical.clone(),
            file,
            library,
            hash,
            imports: Vec::new(),
        });
        let dir = canonical.parent().map(Path::to_path_buf).unwrap_or_default();
        let imports = specs
            .into_iter()
            .map(|spec| {
                let lib = self
                    .resolve(&dir, &spec)
                    .and_then(|p| self.load_library(p, &spec, limits));
                (spec, lib)
            })
            .collect();
        self.libraries[id.0].imports = imports;
        Some(id)
    }

    fn load_schema(&mut self, canonical: PathBuf, limits: &Limits) {
        if self.schemas.contains_key(&canonical) {
            return;
        }
        let name = self.display_relative(&canonical);
        let (file, node) = match read_limited(&canonical, limits.max_bytes) {
            Ok(contents) => {
                let prepared = PreparedFile::new(
                    self.sources.next_id(),
                    name,
                    canonical.clone(),
                    contents,
                    limits,
                    Kind::Schema,
                    Parse::Spawn,
                );
                let Added { file, node, .. } = self.add_file(prepared);
                (file, node)
            }
            Err(e) => {
                let file = self
                    .sources
                    .add(SourceFile::new(name.clone(), Some(canonical.clone()), ""));
                self.diags.push(Diagnostic::new(
                    &codes::MISSING_FILE,
                    Span::file_start(file),
                    format!("cannot read `{name}`: {}", io_reason(&e)),
                ));
                (file, None)
            }
        };
        self.schemas.insert(canonical, LoadedSchema { file, node });
    }

    /// Resolves `spec` relative to `dir`: the canonical path, or a diagnostic when it leaves
    /// the root or does not exist.
    pub fn resolve(&mut self, dir: &Path, spec: &Sp<String>) -> Option<PathBuf> {
        let joined = normalize(&dir.join(&spec.value));
        if !joined.starts_with(&self.root) {
            self.diags.push(
                Diagnostic::new(&codes::PATH_OUTSIDE_ROOT, spec.span, format!("`{}` leaves the project root", spec.value))
                    .label("outside the root")
                    .help(format!("files must be under `{}`; move the file, or pass `--root` with a directory that holds both", self.root.display())),
            );
            return None;
        }
        match joined.canonicalize() {
            Ok(p) if p.starts_with(&self.root) => Some(p),
            Ok(_) => {
                self.diags.push(
                    Diagnostic::new(
                        &codes::PATH_OUTSIDE_ROOT,
                        spec.span,
                        format!("`{}` is a link that leaves the project root", spec.value),
                    )
                    .label("outside the root"),
                );
                None
            }
            Err(e) => {
                self.diags.push(
                    Diagnostic::new(
                        &codes::MISSING_FILE,
                        spec.span,
                        format!("cannot read `{}`: {}", spec.value, io_reason(&e)),
                    )
                    .label("no such file")
                    .help(format!(
                        "paths are relative to the file that names them (`{}`)",
                        self.display_relative(dir)
                    )),
                );
                None
            }
        }
    }

    /// A path for messages: relative to the working directory when under it.
    pub fn display_relative(&self, p: &Path) -> String {
        display_relative(p)
    }

    /// Fills `agents` and `providers` with the flow's own definitions and those of every file it
    /// imports (transitively), reporting names defined twice with both places (SY204). `lint`
    /// and `compile` see the same names through it.
    pub fn visible_definitions<'p>(
        &'p self,
        id: FlowId,
        agents: &mut IndexMap<&'p str, &'p Agent>,
        providers: &mut IndexMap<&'p str, &'p Provider>,
        out: &mut Vec<Diagnostic>,
    ) {
        let loaded = self.flow(id);
        let Some(flow) = &loaded.flow else { return };
        let mut agent_at: IndexMap<&str, Span> = IndexMap::new();
        let mut provider_at: IndexMap<&str, Span> = IndexMap::new();
        for (name, a) in &flow.agents {
            agents.insert(name, a);
            agent_at.insert(name, a.name.span);
        }
        for (name, p) in &flow.providers {
            providers.insert(name, p);
            provider_at.insert(name, p.name.span);
        }
        let mut seen = Vec::new();
        let mut stack: Vec<LibId> = loaded.imports.iter().filter_map(|(_, l)| *l).collect();
        stack.reverse();
        while let Some(lib) = stack.pop() {
            if seen.contains(&lib) {
                continue;
            }
            seen.push(lib);
            let l = &self.libraries[lib.0];
            for (name, a) in &l.library.agents {
                if let Some(first) = agent_at.get(name.as_str()) {
                    out.push(duplicate("agent", name, a.name.span, *first));
                } else {
                    agents.insert(name, a);
                    agent_at.insert(name, a.name.span);
                }
            }
            for (name, p) in &l.library.providers {
                if let Some(first) = provider_at.get(name.as_str()) {
                    out.push(duplicate("provider", name, p.name.span, *first));
                } else {
                    providers.insert(name, p);
                    provider_at.insert(name, p.name.span);
                }
            }
            for (_, inner) in l.imports.iter().rev() {
                if let Some(inner) = inner {
                    stack.push(*inner);
                }
            }
        }
    }

    /// The MCP servers flow `id` sees: its own `mcp_servers:` and those of every file it
    /// imports (transitively), as [`Project::visible_definitions`] finds agents, reporting
    /// names defined twice with both places (SY204).
    pub fn visible_mcp_servers(&self, id: FlowId, out: &mut Vec<Diagnostic>) -> IndexMap<&str, &McpServer> {
        let mut servers: IndexMap<&str, &McpServer> = IndexMap::new();
        let loaded = self.flow(id);
        let Some(flow) = &loaded.flow else { return servers };
        for (name, server) in &flow.mcp_servers {
            servers.insert(name, server);
        }
        let mut seen = Vec::new();
        let mut stack: Vec<LibId> = loaded.imports.iter().filter_map(|(_, l)| *l).collect();
        stack.reverse();
        while let Some(lib) = stack.pop() {
            if seen.contains(&lib) {
                continue;
            }
            seen.push(lib);
            let l = &self.libraries[lib.0];
            for (name, server) in &l.library.mcp_servers {
                match servers.get(name.as_str()) {
                    Some(first) => out.push(duplicate("MCP server", name, server.name.span, first.name.span)),
                    None => {
                        servers.insert(name, server);
                    }
                }
            }
            for (_, inner) in l.imports.iter().rev() {
                if let Some(inner) = inner {
                    stack.push(*inner);
                }
            }
        }
        servers
    }

    /// The flow with this id.
    pub fn flow(&self, id: FlowId) -> &LoadedFlow {
        &self.flows[id.0]
    }

    /// The loaded schema that a `SchemaRef::Path` in `flow` names.
    pub fn schema_for(&self, flow: FlowId, path: &str) -> Option<&LoadedSchema> {
        let dir = self.flows[flow.0].path.parent()?;
        let p = normalize(&dir.join(path)).canonicalize().ok()?;
        self.schemas.get(&p)
    }

    /// The hash a run of flow `id` records, and `resume` compares (SPEC §7.3): it covers the
    /// flow's file, every file it imports (transitively) and every flow file it calls (by
    /// that flow's own covering hash, so transitively too). A flow that imports nothing and
    /// calls no flow file has its file's hash, as every flow had before imports and calls
    /// were covered, so runs recorded then still resume. Otherwise it is the SHA-256 of the
    /// file's hash, the imported files' hashes (each once, in the order first met) and the
    /// called flows' covering hashes (each once, in the order written).
    ///
    /// `memo` keeps the hashes already computed, for the next call. A flow met again while
    /// its own hash is being computed (a cycle of calls, which lint refuses) counts by its
    /// file's hash. The walk keeps its own stack: a long chain of calls cannot overflow the
    /// thread's.
    pub fn flow_hash(&self, id: FlowId, memo: &mut HashMap<FlowId, String>) -> String {
        if let Some(h) = memo.get(&id) {
            return h.clone();
        }
        // Post-order: a flow's hash is made once the flows it calls have theirs.
        let mut open = HashSet::new();
        let mut stack = vec![(id, false)];
        while let Some((flow, callees_done)) = stack.pop() {
            if memo.contains_key(&flow) {
                continue;
            }
            if callees_done {
                let hash = self.covering_hash(flow, memo);
                open.remove(&flow);
                memo.insert(flow, hash);
                continue;
            }
            if !open.insert(flow) {
                continue;
            }
            stack.push((flow, true));
            let callees = self.callees(flow);
            for callee in callees.into_iter().rev() {
                if !memo.contains_key(&callee) && !open.contains(&callee) {
                    stack.push((callee, false));
                }
            }
        }
        memo.get(&id).cloned().unwrap_or_default()
    }

    /// The covering hash of `id`, its callees' being in `memo` (or open, in a cycle).
    fn covering_hash(&self, id: FlowId, memo: &HashMap<FlowId, String>) -> String {
        let loaded = &self.flows[id.0];
        let libraries = self.imported_libraries(id);
        let callees = self.callees(id);
        if libraries.is_empty() && callees.is_empty() {
            return loaded.hash.clone();
        }
        let mut h = Sha256::new();
        h.update(b"flow ");
        h.update(loaded.hash.as_bytes());
        for lib in libraries {
            h.update(b"\nimports ");
            h.update(self.libraries[lib.0].hash.as_bytes());
        }
        for callee in callees {
            let hash = memo.get(&callee).unwrap_or(&self.flows[callee.0].hash);
            h.update(b"\ncalls ");
            h.update(hash.as_bytes());
        }
        hex(&h.finalize())
    }

    /// The files flow `id` imports, transitively, each once, in the order first met.
    fn imported_libraries(&self, id: FlowId) -> Vec<LibId> {
        let mut seen = Vec::new();
        let mut stack: Vec<LibId> = self.flows[id.0]
            .imports
            .iter()
            .rev()
            .filter_map(|(_, l)| *l)
            .collect();
        while let Some(lib) = stack.pop() {
            if seen.contains(&lib) {
                continue;
            }
            seen.push(lib);
            stack.extend(self.libraries[lib.0].imports.iter().rev().filter_map(|(_, l)| *l));
        }
        seen
    }

    /// The flow files flow `id` calls (from its inline flows too), each once, in the order
    /// written.
    fn callees(&self, id: FlowId) -> Vec<FlowId> {
        let mut callees = Vec::new();
        for (caller, _, callee) in &self.calls {
            if let Some(callee) = callee
                && *caller == id
                && !callees.contains(callee)
            {
                callees.push(*callee);
            }
        }
        callees
    }
}

/// Loads the flows at `paths` into one project rooted at the first flow's directory (or
/// `opts.root`).
pub fn load(paths: &[PathBuf], opts: &LoadOptions) -> (Project, Vec<Option<FlowId>>) {
    let root = opts
        .root
        .clone()
        .or_else(|| paths.first().and_then(|p| p.parent().map(Path::to_path_buf)))
        .map(|r| {
            if r.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                r
            }
        })
        .and_then(|r| r.canonicalize().ok())
        .unwrap_or_else(|| PathBuf::from("/"));
    let mut project = Project::new(root);
    let ids = paths.iter().map(|p| project.load_flow(p, &opts.limits)).collect();
    (project, ids)
}

/// How a file is parsed: on a thread of its own, while the caller hashes it and indexes its
/// lines (the caller's stack then never limits the parse), or right here, by a worker that was
/// started with a stack of [`syntax::stack_bytes`].
#[derive(Clone, Copy, Debug)]
enum Parse {
    Spawn,
    Here,
}

/// What a file is loaded as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Flow,
    Library,
    Schema,
    Changes,
}

/// A file's model, as far as it could be built. One per file, moved once into the project:
/// boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Model {
    None,
    Flow {
        flow: Option<Flow>,
        malformed: Vec<Span>,
    },
    Library {
        library: Library,
    },
}

/// A file read, hashed (flows and imported files), parsed and lowered into the model as file `file` of a
/// project — everything loading does before the file is added to the project and what it
/// names is resolved. Pure work, so it can run on any thread.
#[derive(Debug)]
struct PreparedFile {
    file: FileId,
    kind: Kind,
    source: SourceFile,
    hash: String,
    /// Whether the text was parsed (it is UTF-8 and within the size limit); its tree is kept
    /// for schemas only, the model is what the rest of loading needs.
    parsed: bool,
    /// The tree of a schema file.
    node: Option<Node>,
    /// Problems of the parse.
    diags: Vec<Diagnostic>,
    model: Model,
    /// Problems of the model.
    model_diags: Vec<Diagnostic>,
}

/// A prepared file once added to the project.
struct Added {
    file: FileId,
    hash: String,
    node: Option<Node>,
    model: Model,
}

impl PreparedFile {
    /// The text is the bytes themselves when they are UTF-8 (no copy), else their lossy
    /// reading, which is what the parser's spans then point into. A file over the size limit
    /// was not read: it gets the parser's own `SY101` and no tree.
    fn new(
        file: FileId,
        name: String,
        canonical: PathBuf,
        contents: Contents,
        limits: &Limits,
        kind: Kind,
        parse: Parse,
    ) -> Self {
        let bytes = match contents {
            Ok(bytes) => bytes,
            Err(TooLarge(len)) => {
                return PreparedFile {
                    file,
                    kind,
                    source: SourceFile::new(name, Some(canonical), ""),
                    hash: String::new(),
                    parsed: false,
                    node: None,
                    diags: vec![syntax::too_large(file, len, limits.max_bytes)],
                    model: Model::None,
                    model_diags: Vec::new(),
                };
            }
        };
        let digest = |bytes: &[u8]| match kind {
            Kind::Flow | Kind::Library => hex(&Sha256::digest(bytes)),
            Kind::Schema | Kind::Changes => String::new(),
        };
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => {
                let hash = digest(e.as_bytes());
                let (_, diags) = syntax::parse_collecting_here(file, e.as_bytes(), limits);
                let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
                return PreparedFile {
                    file,
                    kind,
                    source: SourceFile::new(name, Some(canonical), text),
                    hash,
                    parsed: false,
                    node: None,
                    diags,
                    model: Model::None,
                    model_diags: Vec::new(),
                };
            }
        };
        let text: Arc<str> = text.into();
        // The file's hash and line index are made while it is parsed.
        let meanwhile = || {
            let hash = digest(text.as_bytes());
            (SourceFile::new(name, Some(canonical), Arc::clone(&text)), hash)
        };
        let ((node, diags), (source, hash)) = match parse {
            Parse::Spawn => syntax::parse_collecting_with(file, text.as_bytes(), limits, meanwhile),
            Parse::Here => {
                let parsed = syntax::parse_collecting_here(file, text.as_bytes(), limits);
                (parsed, meanwhile())
            }
        };
        let mut prepared = PreparedFile {
            file,
            kind,
            source,
            hash,
            parsed: true,
            node: None,
            diags,
            model: Model::None,
            model_diags: Vec::new(),
        };
        prepared.lower(node);
        prepared
    }

    /// Lowers the tree into the model of its kind (a file without a tree has none), then
    /// keeps the tree of a schema and drops any other (a worker drops its own trees).
    fn lower(&mut self, node: Option<Node>) {
        self.model = Model::None;
        self.model_diags = Vec::new();
        let Some(node) = node else { return };
        let mut cx = Cx::new(&self.source.text);
        self.model = match self.kind {
            Kind::Flow => {
                let flow = build::flow(&mut cx, &node);
                Model::Flow {
                    flow,
                    malformed: std::mem::take(&mut cx.malformed_steps),
                }
            }
            Kind::Library => Model::Library {
                library: build::library(&mut cx, &node),
            },
            Kind::Schema | Kind::Changes => Model::None,
        };
        self.model_diags = cx.diags;
        if matches!(self.kind, Kind::Schema | Kind::Changes) {
            self.node = Some(node);
        }
    }

    /// This file as file `file` of the project: when it was prepared as another, it is parsed
    /// and lowered again as `file` (its problems without a tree just move).
    fn renumbered(mut self, file: FileId, limits: &Limits) -> Self {
        if self.file == file {
            return self;
        }
        self.file = file;
        if self.parsed {
            let text = Arc::clone(&self.source.text);
            let (node, diags) = syntax::parse_collecting(file, text.as_bytes(), limits);
            self.diags = diags;
            self.lower(node);
        } else {
            for d in &mut self.diags {
                d.primary.span.file = file;
                for label in &mut d.secondary {
                    label.span.file = file;
                }
            }
        }
        self
    }
}

/// A file named on the command line, made ready by [`prepare_top`] to be added to a project
/// by [`Project::load_top_prepared`].
#[derive(Debug)]
struct PreparedTop {
    path: PathBuf,
    /// The canonical path and what was read there, or why the path could not be resolved.
    prepared: std::io::Result<(PathBuf, Prepared)>,
}

#[derive(Debug)]
enum Prepared {
    /// The file could not be read.
    Failed(std::io::Error),
    Flow(PreparedFile),
    Library(PreparedFile),
    Changes(PreparedFile),
}

/// Resolves, reads, hashes, parses and lowers a file named on the command line, as file
/// `file` of a project; which it is decided by its keys (see [`Project::load_top`]).
fn prepare_top(path: &Path, file: FileId, limits: &Limits, parse: Parse) -> PreparedTop {
    let canonical = match path.canonicalize() {
        Ok(p) => p,
        Err(e) => {
            return PreparedTop {
                path: path.to_path_buf(),
                prepared: Err(e),
            };
        }
    };
    let prepared = match read_limited(&canonical, limits.max_bytes) {
        Err(e) => Prepared::Failed(e),
        Ok(Ok(bytes)) if is_change_file(&bytes) => Prepared::Changes(PreparedFile::new(
            file,
            display(path),
            canonical.clone(),
            Ok(bytes),
            limits,
            Kind::Changes,
            parse,
        )),
        Ok(Ok(bytes)) if is_library(&bytes) => Prepared::Library(PreparedFile::new(
            file,
            display_relative(&canonical),
            canonical.clone(),
            Ok(bytes),
            limits,
            Kind::Library,
            parse,
        )),
        Ok(contents) => Prepared::Flow(PreparedFile::new(
            file,
            display(path),
            canonical.clone(),
            contents,
            limits,
            Kind::Flow,
            parse,
        )),
    };
    PreparedTop {
        path: path.to_path_buf(),
        prepared: Ok((canonical, prepared)),
    }
}

impl Project {
    /// [`load_top`](Self::load_top) of each `(file, root)` in order, with the same result,
    /// but with the files read, hashed, parsed and lowered on as many threads as the machine
    /// has cores (at most 8) while this thread adds them to the project in order. Each file
    /// is prepared as the file id it gets when every file before it adds exactly one file;
    /// one that gets another id (an earlier flow imported a file, or a path was named twice)
    /// is re-numbered and lowered again, which is cheap next to parsing it.
    pub fn load_tops(&mut self, tops: &[(PathBuf, PathBuf)], limits: &Limits) -> Vec<Option<FlowId>> {
        let workers = std::thread::available_parallelism()
            .map_or(1, std::num::NonZero::get)
            .min(8)
            .min(tops.len());
        if workers < 2 {
            return tops
                .iter()
                .map(|(file, root)| self.load_top(file, root.clone(), limits))
                .collect();
        }
        let first = self.sources.next_id().0 as usize;
        let next = std::sync::atomic::AtomicUsize::new(0);
        let (send, receive) = std::sync::mpsc::channel::<(usize, PreparedTop)>();
        std::thread::scope(|scope| {
            for _ in 0..workers {
                let send = send.clone();
                let next = &next;
                let work = move || {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((path, _)) = tops.get(i) else { break };
                        let file = FileId(u32::try_from(first + i).unwrap_or(u32::MAX));
                        if send
                            .send((i, prepare_top(path, file, limits, Parse::Here)))
                            .is_err()
                        {
                            break;
                        }
                    }
                };
                let spawned = std::thread::Builder::new()
                    .name("switchyard-load".into())
                    .stack_size(syntax::stack_bytes(limits))
                    .spawn_scoped(scope, work);
                if spawned.is_err() {
                    // Fewer workers: the others (or this thread, below) do the work.
                    break;
                }
            }
            drop(send);
            let mut ready: Vec<Option<PreparedTop>> = (0..tops.len()).map(|_| None).collect();
            let mut ids = Vec::with_capacity(tops.len());
            for (i, (path, root)) in tops.iter().enumerate() {
                while ready[i].is_none() {
                    match receive.recv() {
                        Ok((j, prepared)) => ready[j] = Some(prepared),
                        Err(_) => break,
                    }
                }
                let id = match ready[i].take() {
                    Some(prepared) => self.load_top_prepared(prepared, root.clone(), limits),
                    // No worker could be started: load it here.
                    None => self.load_top(path, root.clone(), limits),
                };
                ids.push(id);
            }
            ids
        })
    }
}

/// SY204: a name defined twice, with both places.
fn duplicate(what: &str, name: &str, second: Span, first: Span) -> Diagnostic {
    Diagnostic::new(
        &codes::DUPLICATE_DEFINITION,
        second,
        format!("{what} `{name}` is defined twice"),
    )
    .label("defined again here")
    .with_secondary(first, "first defined here")
    .help(format!("rename one of them, or keep one definition of `{name}`"))
}

/// Whether a file's text is an agent-change file rather than a flow: its first line that is
/// not blank, a comment or a document start is a list item that starts with a key of a change
/// (`- scope:`, `- mode:`, `- agents:`, `- flows:`) or a flow mapping (`- {`). Any other list
/// is a broken flow, and reported as one.
fn is_change_file(text: &[u8]) -> bool {
    let Some(first) = text
        .split(|b| *b == b'\n')
        .map(<[u8]>::trim_ascii)
        .find(|l| !l.is_empty() && !l.starts_with(b"#") && *l != b"---")
    else {
        return false;
    };
    let Some(item) = first.strip_prefix(b"-") else {
        return false;
    };
    let item = item.trim_ascii_start();
    item.starts_with(b"{")
        || ["scope", "mode", "agents", "flows"].iter().any(|k| {
            item.strip_prefix(k.as_bytes())
                .is_some_and(|rest| rest.trim_ascii_start().starts_with(b":"))
        })
}

/// Whether a YAML file is a file of shared agents rather than a flow: a top-level mapping
/// without `flow:` or `steps:` but with `agents:`, `providers:` or `imports:`.
fn is_library(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    let top_keys: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with([' ', '\t', '#', '-']) && !l.is_empty())
        .filter_map(|l| l.split(':').next())
        .collect();
    !top_keys.iter().any(|k| *k == "flow" || *k == "steps")
        && top_keys
            .iter()
            .any(|k| *k == "agents" || *k == "providers" || *k == "imports")
}

/// What a flow names by path: called flows, schema files, `bundle:` patterns, mock files.
struct Refs<'a> {
    flows: &'a mut Vec<Sp<String>>,
    schemas: &'a mut Vec<Sp<String>>,
    bundles: &'a mut Vec<Sp<String>>,
    fixtures: &'a mut Vec<Sp<String>>,
}

fn collect_refs(flow: &Flow, refs: &mut Refs<'_>) {
    let schema = |s: &Option<SchemaRef>, out: &mut Vec<Sp<String>>| {
        if let Some(SchemaRef::Path(p)) = s {
            out.push(p.clone());
        }
    };
    schema(&flow.input.as_ref().and_then(|i| i.schema.clone()), refs.schemas);
    schema(&flow.output.as_ref().and_then(|o| o.schema.clone()), refs.schemas);
    let agent = |a: &crate::model::Agent, refs: &mut Refs<'_>| {
        schema(&a.common.input_schema, refs.schemas);
        schema(&a.common.result_schema, refs.schemas);
        match &a.spec {
            AgentSpec::Flow(f) => {
                if let Some(p) = &f.path {
                    refs.flows.push(p.clone());
                }
                if let Some(inline) = &f.inline {
                    collect_refs(inline, refs);
                }
            }
            AgentSpec::Command(c) => refs.bundles.extend(c.bundle.iter().cloned()),
            AgentSpec::Mock(m) => {
                let specs = crate::model::mock_files::of_mock(m);
                refs.fixtures
                    .extend(specs.into_iter().filter_map(crate::model::mock_files::path));
            }
            _ => {}
        }
    };
    for a in flow.agents.values() {
        agent(a, refs);
    }
    for t in &flow.tests {
        for m in t.mocks.values() {
            let specs = crate::model::mock_files::of_mock(m);
            refs.fixtures
                .extend(specs.into_iter().filter_map(crate::model::mock_files::path));
        }
    }
    for step in flow.steps.values() {
        match &step.kind {
            StepKind::Agent(AgentRef::Inline(a)) => agent(a, refs),
            StepKind::Parallel(branches) => {
                for b in branches.values() {
                    if let AgentRef::Inline(a) = &b.agent {
                        agent(a, refs);
                    }
                }
            }
            StepKind::Interrupt(i) => {
                if let Some(SchemaRef::Path(p)) = &i.schema {
                    refs.schemas.push(p.clone());
                }
            }
            _ => {}
        }
    }
}

/// Removes `.` and resolves `..` lexically (without touching the disk).
/// The project root a flow is loaded under: `root` as given, else the flow's directory.
pub fn root_of(flow: &Path, root: Option<PathBuf>) -> PathBuf {
    let root = root
        .or_else(|| flow.parent().map(Path::to_path_buf))
        .filter(|r| !r.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("."));
    root.canonicalize().unwrap_or(root)
}

/// A path for messages: relative to the working directory when under it.
fn display_relative(p: &Path) -> String {
    match std::env::current_dir()
        .ok()
        .and_then(|cwd| p.strip_prefix(cwd).ok().map(Path::to_path_buf))
    {
        Some(rel) if !rel.as_os_str().is_empty() => rel.display().to_string(),
        _ => p.display().to_string(),
    }
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string().to_lowercase(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary directory, removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Self {
            static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("switchyard-project-{tag}-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create a temporary directory");
            Dir(dir.canonicalize().expect("canonical temporary directory"))
        }

        fn write(&self, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, bytes).expect("write a test file");
            path
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn an_oversized_file_is_refused_with_the_parsers_message() {
        let dir = Dir::new("size");
        let bytes = "flow: big\nsteps:\n  one: {succeed: {}}\n".repeat(4);
        let path = dir.write("big.yaml", &bytes);
        let limits = Limits {
            max_bytes: 32,
            ..Limits::default()
        };
        let mut project = Project::default();
        let id = project
            .load_top(&path, dir.0.clone(), &limits)
            .expect("a flow entry");
        assert!(project.flow(id).flow.is_none());
        let parser =
            syntax::parse(FileId(0), bytes.as_bytes(), &limits).expect_err("too large for the parser");
        let [d] = project.diags.as_slice() else {
            panic!("one diagnostic: {:?}", project.diags)
        };
        assert_eq!((d.code(), &d.message), ("SY101", &parser.message));
        assert_eq!(
            d.message,
            format!("file is {} bytes, larger than the 32-byte limit", bytes.len())
        );
        // A file at the limit is read and parsed.
        let path = dir.write("small.yaml", "flow: s\nsteps: {a: {succeed: {}}}\n");
        let limits = Limits {
            max_bytes: 34,
            ..Limits::default()
        };
        let mut project = Project::default();
        let id = project
            .load_top(&path, dir.0.clone(), &limits)
            .expect("a flow entry");
        assert!(project.flow(id).flow.is_some(), "{:?}", project.diags);
        assert!(project.diags.is_empty(), "{:?}", project.diags);
    }

    #[test]
    fn a_file_that_is_not_utf8_keeps_spans_on_whole_characters() {
        let dir = Dir::new("utf8");
        let path = dir.write("bad.yaml", b"flow: caf\xe9\nsteps: {}\n");
        let mut project = Project::default();
        project.load_top(&path, dir.0.clone(), &Limits::default());
        let [d] = project.diags.as_slice() else {
            panic!("one diagnostic: {:?}", project.diags)
        };
        let text = &project.sources.get(d.primary.span.file).text;
        assert_eq!(
            text.get(d.primary.span.start as usize..d.primary.span.end as usize),
            Some("\u{FFFD}")
        );
    }

    #[test]
    fn malformed_steps_stay_in_the_model_and_the_flow_does_not_compile() {
        let dir = Dir::new("malformed");
        let path = dir.write(
            "flow.yaml",
            "flow: m\nagents:\n  w: {kind: mock, returns: {}}\nsteps:\n  a: {agent: w, output: {}, next: b}\n  \
             b: {description: no kind, next: c}\n  c: {agent: {kind: nope}, next: d}\n  d: {agent: w, output: {}}\n",
        );
        let mut project = Project::default();
        let id = project
            .load_top(&path, dir.0.clone(), &Limits::default())
            .expect("a flow");
        let loaded = project.flow(id);
        let flow = loaded.flow.as_ref().expect("a model");
        assert_eq!(flow.steps.keys().collect::<Vec<_>>(), ["a", "b", "c", "d"]);
        let malformed: Vec<&str> = flow
            .steps
            .values()
            .filter(|s| loaded.malformed_steps.contains(&s.id.span))
            .map(|s| s.id.value.as_str())
            .collect();
        assert_eq!(malformed, ["b", "c"]);
        let (plan, diags) = crate::lint::lint_and_compile(&project, id);
        assert!(plan.is_none(), "a flow with malformed steps never compiles");
        let codes: Vec<&str> = diags.iter().map(Diagnostic::code).collect();
        assert_eq!(codes, ["SY109", "SY108"], "{diags:#?}");
    }

    /// The covering hash of the flow at `path`, and the plan's hash of it.
    fn hashes(dir: &Dir, path: &Path) -> (String, String) {
        let mut project = Project::default();
        let id = project
            .load_top(path, dir.0.clone(), &Limits::default())
            .expect("a flow");
        let hash = project.flow_hash(id, &mut HashMap::new());
        let (plan, diags) = crate::lint::lint_and_compile(&project, id);
        let plan = plan.unwrap_or_else(|| panic!("the flow compiles: {diags:#?}"));
        (hash, plan.root().hash.clone())
    }

    #[test]
    fn a_flow_that_imports_and_calls_nothing_keeps_its_files_hash() {
        // Runs recorded before imports and calls were covered have this hash: they resume.
        let dir = Dir::new("plain-hash");
        let text = "flow: plain\nsteps:\n  a: {agent: {kind: transform, result: {x: 1}}, output: \"*\"}\n";
        let path = dir.write("plain.yaml", text);
        let (hash, plan) = hashes(&dir, &path);
        assert_eq!(hash, hex(&Sha256::digest(text.as_bytes())));
        assert_eq!(plan, hash);
    }

    #[test]
    fn the_flow_hash_covers_imported_files_and_called_flows() {
        let dir = Dir::new("covering-hash");
        dir.write(
            "lib.yaml",
            "imports: [more.yaml]\nagents:\n  calc: {kind: transform, result: {x: 1}}\n",
        );
        dir.write(
            "more.yaml",
            "agents:\n  more: {kind: transform, result: {y: 1}}\n",
        );
        dir.write(
            "grand.yaml",
            "flow: grand\nsteps:\n  g: {agent: {kind: transform, result: {z: 1}}, output: \"*\"}\n",
        );
        dir.write(
            "child.yaml",
            "flow: child\nagents:\n  grand: {kind: flow, path: grand.yaml}\nsteps:\n  c: {agent: grand, output: \"*\"}\n",
        );
        let top = dir.write(
            "top.yaml",
            "flow: top\nimports: [lib.yaml]\nagents:\n  child: {kind: flow, path: child.yaml}\n\
             steps:\n  a: {agent: calc, output: \"*\", next: b}\n  b: {agent: child, output: \"*\"}\n",
        );
        let (first, plan) = hashes(&dir, &top);
        assert_eq!(plan, first);
        let file = hex(&Sha256::digest(std::fs::read(&top).expect("read top.yaml")));
        assert_ne!(first, file, "the hash covers more than the flow's file");

        // A change in any file of the tree changes it; restoring the file restores it.
        let mut seen = vec![first.clone()];
        for (name, from, to) in [
            ("lib.yaml", "x: 1", "x: 2"),
            ("more.yaml", "y: 1", "y: 2"),
            ("child.yaml", "c: {", "c2: {"),
            ("grand.yaml", "z: 1", "z: 2"),
        ] {
            let path = dir.0.join(name);
            let before = std::fs::read_to_string(&path).expect("read");
            dir.write(name, before.replace(from, to));
            let (changed, _) = hashes(&dir, &top);
            assert!(!seen.contains(&changed), "a change in {name} changes the hash");
            seen.push(changed);
            dir.write(name, before);
            assert_eq!(hashes(&dir, &top).0, first, "{name} restored");
        }
    }

    #[test]
    fn a_cycle_of_calls_still_gets_a_hash() {
        // Lint refuses the cycle; hashing it must still end.
        let dir = Dir::new("cycle-hash");
        dir.write(
            "b.yaml",
            "flow: b\nagents:\n  a: {kind: flow, path: a.yaml}\nsteps:\n  s: {agent: a, output: \"*\"}\n",
        );
        let a = dir.write(
            "a.yaml",
            "flow: a\nagents:\n  b: {kind: flow, path: b.yaml}\nsteps:\n  s: {agent: b, output: \"*\"}\n",
        );
        let mut project = Project::default();
        let id = project
            .load_top(&a, dir.0.clone(), &Limits::default())
            .expect("a flow");
        let mut memo = HashMap::new();
        let hash = project.flow_hash(id, &mut memo);
        assert_eq!(hash.len(), 64);
        assert_ne!(hash, project.flow(id).hash);
        assert_eq!(memo.len(), 2);
        assert_eq!(project.flow_hash(id, &mut memo), hash);
    }
}
