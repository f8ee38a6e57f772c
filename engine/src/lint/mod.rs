//! `switchyard lint`: every problem of a loaded project, in one pass, in a stable order.
//!
//! Each rule lives in its own file under [`rules`], named after the pattern it catches, and
//! reads the model through a [`FlowCx`]: one flow (a file's, or an inline `flow` agent's) with
//! the agents and providers visible to it. Rules never read files and never stop early.

pub mod flow_types;
pub mod rules;

use std::collections::BTreeSet;

use indexmap::IndexMap;

use crate::diag::{self, Diagnostic};
use crate::expr::cache::ParseCache;
use crate::model::{
    Agent, AgentKind, AgentRef, AgentSpec, Flow, McpServer, Provider, SchemaRef, Step, StepKind, Tool,
};
use crate::plan::Plan;
use crate::project::{FlowId, Project};
use crate::source::FileId;

/// One flow being checked, with what it can see.
pub struct FlowCx<'p> {
    pub project: &'p Project,
    /// The file the flow belongs to (for inline flows: the enclosing file).
    pub id: FlowId,
    pub flow: &'p Flow,
    pub text: &'p str,
    /// Agents visible by name: the flow's own, its imports', and (inline flows) the enclosing
    /// flow's. The file that defines each is kept for duplicate reports.
    pub agents: IndexMap<&'p str, &'p Agent>,
    pub providers: IndexMap<&'p str, &'p Provider>,
    /// MCP servers visible by name: the flow's own and its imports' (inline flows: the
    /// enclosing file's).
    pub mcp_servers: IndexMap<&'p str, &'p McpServer>,
    /// The agent kinds allowed here: the intersection of this flow's `allow` and every caller's
    /// that lint can see. `None` means all.
    pub allow: Option<BTreeSet<AgentKind>>,
    /// Whether this is an inline flow (no `tests:`, no `flow:` name).
    pub inline: bool,
}

impl<'p> FlowCx<'p> {
    /// The file text the flow's spans point into.
    pub fn file(&self) -> FileId {
        self.project.flow(self.id).file
    }

    /// The step the run starts at: `start`, else the first step.
    pub fn start(&self) -> Option<&'p str> {
        match &self.flow.start {
            Some(s) => self.flow.steps.get_key_value(&s.value).map(|(k, _)| k.as_str()),
            None => self.flow.steps.keys().next().map(String::as_str),
        }
    }

    /// The agent a reference names, when it resolves.
    pub fn agent(&self, r: &'p AgentRef) -> Option<&'p Agent> {
        match r {
            AgentRef::Named(n) => self.agents.get(n.value.as_str()).copied(),
            AgentRef::Inline(a) => Some(a),
        }
    }

    /// Whether a step's kind could not be read (its problem is already reported): the model
    /// keeps it with a placeholder kind so that edges to it resolve, and rules about kinds
    /// and agents skip it.
    pub fn is_malformed(&self, step: &Step) -> bool {
        let malformed = &self.project.flow(self.id).malformed_steps;
        !malformed.is_empty() && malformed.contains(&step.id.span)
    }

    /// Every agent reference of the flow's steps, with the step (and branch) making it.
    /// Malformed steps make none.
    pub fn agent_refs(&self) -> Vec<(&'p Step, Option<&'p str>, &'p AgentRef)> {
        let mut out = Vec::new();
        for step in self.flow.steps.values() {
            if self.is_malformed(step) {
                continue;
            }
            match &step.kind {
                StepKind::Agent(r) => out.push((step, None, r)),
                StepKind::Parallel(branches) => {
                    for (name, b) in branches {
                        out.push((step, Some(name.as_str()), &b.agent));
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// The agents defined in this flow: under `agents:`, then inline in its steps and
    /// branches, in the order written.
    pub fn defined_agents(&self) -> Vec<&'p Agent> {
        let mut out: Vec<&'p Agent> = self.flow.agents.values().collect();
        for (_, _, r) in self.agent_refs() {
            if let AgentRef::Inline(a) = r {
                out.push(a);
            }
        }
        out
    }

    /// The tools of an agent loop (an `llm` agent with `tools:`) that name an agent visible
    /// here, with that agent, in the order written. Other agents have none.
    pub fn tools_of(&self, a: &'p Agent) -> Vec<(&'p Tool, &'p Agent)> {
        let AgentSpec::Llm(l) = &a.spec else {
            return Vec::new();
        };
        l.tools
            .list
            .iter()
            .filter_map(|t| Some((t, *self.agents.get(t.name.value.as_str())?)))
            .collect()
    }

    /// The `until_tool` of an agent loop, when it is one of the loop's tools and names an
    /// agent here: that agent's result is the loop's answer.
    pub fn until_tool(&self, a: &'p Agent) -> Option<&'p Agent> {
        let AgentSpec::Llm(l) = &a.spec else { return None };
        let until = l.until_tool.as_ref()?;
        self.tools_of(a)
            .into_iter()
            .find(|(t, _)| t.name.value == until.value)
            .map(|(_, agent)| agent)
    }

    /// The JSON Schema a call of `a` is checked against: its `result_schema`; for an agent
    /// loop without one that ends at its `until_tool`, that tool's (SPEC §6.3), followed
    /// through loops that end at other loops. `None` when nothing types it.
    pub fn result_schema(&self, a: &'p Agent) -> Option<&'p SchemaRef> {
        self.result_schema_owner(a)?.common.result_schema.as_ref()
    }

    /// The agent whose `result_schema` [`FlowCx::result_schema`] is: `a`, or the `until_tool`
    /// (of the `until_tool` ...) whose result is its answer.
    pub fn result_schema_owner(&self, a: &'p Agent) -> Option<&'p Agent> {
        let mut seen = Vec::new();
        let mut at = a;
        loop {
            if at.common.result_schema.is_some() {
                return Some(at);
            }
            seen.push(std::ptr::from_ref(at));
            at = self.until_tool(at)?;
            if seen.contains(&std::ptr::from_ref(at)) {
                return None;
            }
        }
    }

    /// The agents a run of this flow can call: those its steps name and, through the tools of
    /// agent loops, those these can call in turn; each once, in the order first met.
    pub fn reachable_agents(&self) -> Vec<&'p Agent> {
        let mut out: Vec<&'p Agent> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (_, _, r) in self.agent_refs() {
            if let Some(a) = self.agent(r)
                && seen.insert(std::ptr::from_ref(a))
            {
                out.push(a);
            }
        }
        let mut i = 0;
        while i < out.len() {
            for (_, tool) in self.tools_of(out[i]) {
                if seen.insert(std::ptr::from_ref(tool)) {
                    out.push(tool);
                }
            }
            i += 1;
        }
        out
    }

    /// The agent loops whose tools are checked in this flow's scope: those defined here, then
    /// those a run can reach (an imported or enclosing flow's agent has its tools named in the
    /// scope of the flow that calls it, as `compile` lowers them); each once.
    pub fn agent_loops(&self) -> Vec<&'p Agent> {
        let mut seen = std::collections::HashSet::new();
        self.defined_agents()
            .into_iter()
            .chain(self.reachable_agents())
            .filter(|a| matches!(&a.spec, AgentSpec::Llm(l) if !l.tools.list.is_empty()))
            .filter(|a| seen.insert(std::ptr::from_ref(*a)))
            .collect()
    }

    /// Calls `f` with the index (in `steps`) of each successor of a step (edge targets other
    /// than `end` that name a step), in edge order, without allocating.
    pub fn for_each_successor(&self, step: &Step, mut f: impl FnMut(usize)) {
        let Some(next) = &step.next else { return };
        match next {
            crate::model::Next::One(to) => {
                if let Some(i) = self.flow.steps.get_index_of(&to.value) {
                    f(i);
                }
            }
            crate::model::Next::Edges(edges) => {
                for e in edges {
                    if let Some(i) = self.flow.steps.get_index_of(&e.to.value) {
                        f(i);
                    }
                }
            }
        }
    }

    /// Successor step ids of a step (edge targets other than `end`), in edge order.
    pub fn successors(&self, step: &'p Step) -> Vec<&'p str> {
        let Some(next) = &step.next else { return Vec::new() };
        match next {
            crate::model::Next::One(to) => self
                .flow
                .steps
                .get_key_value(&to.value)
                .map(|(k, _)| vec![k.as_str()])
                .unwrap_or_default(),
            crate::model::Next::Edges(edges) => edges
                .iter()
                .filter_map(|e| {
                    self.flow
                        .steps
                        .get_key_value(&e.to.value)
                        .map(|(k, _)| k.as_str())
                })
                .collect(),
        }
    }
}

/// Lints every flow of the project (those named on the command line and those they call),
/// returning all diagnostics, loader problems included, sorted.
pub fn lint_project(project: &Project) -> Vec<Diagnostic> {
    lint(project, false).0
}

/// [`lint_project`], also returning every path, expression and template it parsed, for
/// `compile` to lower without parsing them again.
pub fn lint_project_parsed(project: &Project) -> (Vec<Diagnostic>, ParseCache) {
    lint(project, true)
}

/// Lints the project and, when it has no errors, compiles flow `id` and everything it calls
/// ([`crate::compile::compile`], from what lint parsed). Returns every diagnostic (warnings
/// included) either way: how every command gets its plan.
pub fn lint_and_compile(project: &Project, id: FlowId) -> (Option<Plan>, Vec<Diagnostic>) {
    let (diags, parsed) = lint_project_parsed(project);
    if diags.iter().any(Diagnostic::is_error) {
        return (None, diags);
    }
    crate::compile::compile(project, id, diags, parsed)
}

/// Projects of at least this many flows are linted on several threads.
const PARALLEL_FLOWS: usize = 8;

/// Stack of each linting thread: what the main thread has.
const LINT_STACK_BYTES: usize = 8 << 20;

/// Lints the project. Flows are independent, so a project of many flows is linted on as many
/// threads as the machine has cores (at most 8), each flow's diagnostics kept apart and then
/// appended in flow order: the result is the one a single thread gives. The parse tables of
/// the threads are merged only when `keep_parsed`.
fn lint(project: &Project, keep_parsed: bool) -> (Vec<Diagnostic>, ParseCache) {
    let mut parsed = ParseCache::new();
    let mut out = project.diags.clone();
    rules::files::check(project, &mut out);
    rules::change_targets::check(project, &mut out);
    for lib in &project.libraries {
        let l = &lib.library;
        for p in l.providers.values() {
            rules::secrets::provider(&mut out, p);
        }
        for a in l.agents.values() {
            rules::secrets::agent(&mut out, a);
            rules::shell::agent(&mut out, a);
            rules::bounds::agent(&mut out, a);
            rules::unknown_tool::agent(&mut out, a);
            rules::loop_without_tools::agent(&mut out, a, &project.sources.get(lib.file).text);
            rules::expiry_without_approval::agent(&mut out, a, &project.sources.get(lib.file).text, |s| {
                l.mcp_servers.get(s)
            });
        }
        rules::secrets::tokens(lib.file, &project.sources.get(lib.file).text, &mut out);
    }
    let allow = inherited_allow(project);
    let flows = project.flows.len();
    let workers = if flows >= PARALLEL_FLOWS {
        std::thread::available_parallelism()
            .map_or(1, std::num::NonZero::get)
            .min(8)
    } else {
        1
    };
    if workers < 2 {
        for i in 0..flows {
            lint_file_flow(project, &allow, FlowId(i), &mut out, &mut parsed);
        }
    } else {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let mut per_flow: Vec<Option<Vec<Diagnostic>>> = (0..flows).map(|_| None).collect();
        let results = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .filter_map(|_| {
                    let (next, allow) = (&next, &allow);
                    std::thread::Builder::new()
                        .name("switchyard-lint".into())
                        .stack_size(LINT_STACK_BYTES)
                        .spawn_scoped(scope, move || {
                            let mut parsed = ParseCache::new();
                            let mut done = Vec::new();
                            loop {
                                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                if i >= flows {
                                    break;
                                }
                                let mut diags = Vec::new();
                                lint_file_flow(project, allow, FlowId(i), &mut diags, &mut parsed);
                                done.push((i, diags));
                            }
                            (done, parsed)
                        })
                        .ok()
                })
                .collect();
            handles.into_iter().map(|h| h.join()).collect::<Vec<_>>()
        });
        for result in results {
            match result {
                Ok((done, worker_parsed)) => {
                    for (i, diags) in done {
                        per_flow[i] = Some(diags);
                    }
                    if keep_parsed {
                        parsed.merge(worker_parsed);
                    }
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        for (i, diags) in per_flow.into_iter().enumerate() {
            match diags {
                Some(diags) => out.extend(diags),
                // Not linted by a worker (none could be started): lint it here.
                None => lint_file_flow(project, &allow, FlowId(i), &mut out, &mut parsed),
            }
        }
    }
    dedup(&mut out);
    diag::sort(&mut out);
    (out, parsed)
}

/// Lints the flow of one file (and its inline flows).
fn lint_file_flow(
    project: &Project,
    allow: &std::collections::HashMap<FlowId, Option<BTreeSet<AgentKind>>>,
    id: FlowId,
    out: &mut Vec<Diagnostic>,
    parsed: &mut ParseCache,
) {
    let loaded = project.flow(id);
    let Some(flow) = &loaded.flow else { return };
    let mut agents = IndexMap::new();
    let mut providers = IndexMap::new();
    project.visible_definitions(id, &mut agents, &mut providers, out);
    let mcp_servers = project.visible_mcp_servers(id, out);
    let own_allow = flow
        .allow
        .as_ref()
        .map(|a| a.iter().map(|k| k.value).collect::<BTreeSet<_>>());
    let eff = intersect(own_allow, allow.get(&id).cloned().flatten());
    let cx = FlowCx {
        project,
        id,
        flow,
        text: &project.sources.get(loaded.file).text,
        agents,
        providers,
        mcp_servers,
        allow: eff,
        inline: false,
    };
    lint_flow(&cx, out, parsed);
}

fn intersect(a: Option<BTreeSet<AgentKind>>, b: Option<BTreeSet<AgentKind>>) -> Option<BTreeSet<AgentKind>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.intersection(&b).copied().collect()),
        (a, None) => a,
        (None, b) => b,
    }
}

/// For each flow file, the allow set its callers impose (the intersection over the call chain
/// from flows that set `allow`). Computed by propagating along `flow` agent calls.
fn inherited_allow(project: &Project) -> std::collections::HashMap<FlowId, Option<BTreeSet<AgentKind>>> {
    let mut imposed: std::collections::HashMap<FlowId, Option<BTreeSet<AgentKind>>> = Default::default();
    // Fixed point over the call graph; sets only shrink, so this terminates.
    let own = |id: FlowId| {
        project
            .flow(id)
            .flow
            .as_ref()
            .and_then(|f| f.allow.as_ref())
            .map(|a| a.iter().map(|k| k.value).collect())
    };
    let mut changed = true;
    let mut rounds = 0;
    while changed && rounds < 64 {
        changed = false;
        rounds += 1;
        for (caller, _, callee) in &project.calls {
            let Some(callee) = callee else { continue };
            let caller_eff = intersect(own(*caller), imposed.get(caller).cloned().flatten());
            let Some(caller_eff) = caller_eff else { continue };
            let entry = imposed.entry(*callee).or_insert(None);
            let next = intersect(entry.clone(), Some(caller_eff));
            if *entry != next {
                *entry = next;
                changed = true;
            }
        }
    }
    imposed
}

/// Lints one flow and, recursively, its inline flows. `parsed` keeps what it parses.
pub fn lint_flow(cx: &FlowCx, out: &mut Vec<Diagnostic>, parsed: &mut ParseCache) {
    rules::references::check(cx, out);
    rules::reachability::check(cx, out);
    rules::cycles::check(cx, out);
    rules::fallback::check(cx, out);
    rules::error_kind_never_raised::check(cx, out);
    rules::bounds::check(cx, out);
    rules::capability::check(cx, out);
    for a in cx.defined_agents() {
        rules::unknown_tool::agent(out, a);
        rules::loop_without_tools::agent(out, a, cx.text);
        rules::expiry_without_approval::agent(out, a, cx.text, |s| cx.mcp_servers.get(s).copied());
    }
    rules::tool_cycle::check(cx, out);
    rules::tool_input::check(cx, out);
    rules::mcp_tools::check(cx, out);
    rules::loop_mcp_tools::check(cx, out);
    rules::mock_files::check(cx, out);
    rules::hosts::check(cx, out);
    rules::secrets::check(cx, out);
    rules::shell::check(cx, out);
    rules::data::check(cx, out, parsed);
    rules::payload_types::check(cx, out, parsed);
    for agent in inline_flow_agents(cx) {
        let AgentSpec::Flow(f) = &agent.spec else { continue };
        let Some(inner) = &f.inline else { continue };
        let mut agents = cx.agents.clone();
        for (k, a) in &inner.agents {
            agents.insert(k.as_str(), a);
        }
        let own = inner
            .allow
            .as_ref()
            .map(|a| a.iter().map(|k| k.value).collect::<BTreeSet<_>>());
        let inner_cx = FlowCx {
            project: cx.project,
            id: cx.id,
            flow: inner,
            text: cx.text,
            agents,
            providers: cx.providers.clone(),
            mcp_servers: cx.mcp_servers.clone(),
            allow: intersect(own, cx.allow.clone()),
            inline: true,
        };
        lint_flow(&inner_cx, out, parsed);
    }
}

/// Agents defined in this flow (named or inline in steps) whose kind is `flow` with inline steps.
fn inline_flow_agents<'p>(cx: &FlowCx<'p>) -> Vec<&'p Agent> {
    let mut out: Vec<&Agent> = cx.flow.agents.values().collect();
    for (_, _, r) in cx.agent_refs() {
        if let AgentRef::Inline(a) = r {
            out.push(a);
        }
    }
    out.retain(|a| matches!(&a.spec, AgentSpec::Flow(f) if f.inline.is_some()));
    out
}

fn dedup(out: &mut Vec<Diagnostic>) {
    let mut seen = std::collections::HashSet::new();
    out.retain(|d| seen.insert((d.rule.code, d.primary.span, d.message.clone())));
}
