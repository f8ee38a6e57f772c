//! Lowering a linted project into a [`Plan`]: agents resolved, defaults applied, paths,
//! expressions and templates compiled once.

use std::collections::{BTreeSet, HashMap};
use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Duration;

use indexmap::IndexMap;
use petgraph::stable_graph::StableDiGraph;
use serde_json::Value;

use crate::diag::{Diagnostic, codes};
use crate::expr::cache::ParseCache;
use crate::expr::path::Path;
use crate::expr::template::Template;
use crate::expr::value;
use crate::expr::{self, Expr};
use crate::model::{
    Agent, AgentRef, AgentSpec, EdgeOn, Flow, InputSpec, Jitter, McpServer, MessageMode, OutputSpec,
    Provider, Retry, SchemaRef, Source, Sp, Step, StepKind, Tolerate,
};
use crate::plan::*;
use crate::project::{FlowId, Project};
use crate::source::FileId;

/// Default per-attempt timeout of agent steps (SPEC §3).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default cap on a command's stdout and an HTTP response body.
pub const DEFAULT_MAX_OUTPUT: u64 = 16 << 20;
/// Default cap on what one MCP tool call returns (`max_result_bytes`).
pub const DEFAULT_MAX_MCP_RESULT: u64 = 1 << 20;
/// Default `foreach` `max_items`.
pub const DEFAULT_MAX_ITEMS: u64 = 10_000;

/// Compiles flow `id` of a project that lint found without errors, and everything it calls;
/// `diags` are lint's (warnings), returned with the plan, or with the problems lint should
/// have caught. Commands compile through `lint::lint_and_compile`, which lints first.
///
/// Lowering takes every path, expression and template from what lint parsed (`parsed`), so
/// each is parsed once per command.
pub fn compile(
    project: &Project,
    id: FlowId,
    diags: Vec<Diagnostic>,
    parsed: ParseCache,
) -> (Option<Plan>, Vec<Diagnostic>) {
    let mut c = Compiler {
        project,
        flows: Vec::new(),
        by_key: HashMap::new(),
        hashes: HashMap::new(),
        errors: Vec::new(),
        parsed,
        mcp_servers: HashMap::new(),
    };
    let root = c.flow_file(id);
    if !c.errors.is_empty() || root.is_none() {
        let mut all = diags;
        all.extend(c.errors);
        return (None, all);
    }
    let flows = c
        .flows
        .into_iter()
        .map(|f| f.expect("every reserved flow is compiled"))
        .collect();
    (
        Some(Plan {
            flows,
            root: root.expect("checked"),
        }),
        diags,
    )
}

struct Compiler<'p> {
    project: &'p Project,
    flows: Vec<Option<Arc<FlowPlan>>>,
    by_key: HashMap<String, FlowRef>,
    /// The covering hashes of flow files (see [`Project::flow_hash`]), as computed so far.
    hashes: HashMap<FlowId, String>,
    /// Problems lint should have caught; reported rather than panicking.
    errors: Vec<Diagnostic>,
    /// What lint parsed, by text.
    parsed: ParseCache,
    /// The MCP servers lowered so far, by their key: agents naming one definition share it.
    mcp_servers: HashMap<String, Arc<McpServerPlan>>,
}

/// What one flow body can see while compiling.
struct Scope<'p> {
    id: FlowId,
    file: FileId,
    text: &'p str,
    agents: IndexMap<&'p str, &'p Agent>,
    providers: IndexMap<&'p str, &'p Provider>,
    mcp_servers: IndexMap<&'p str, &'p McpServer>,
    defaults: Option<&'p crate::model::Defaults>,
    /// The flow's hash, and its key in `by_key`: the file's covering hash, with a suffix
    /// naming the agent for an inline flow.
    key: String,
    compiled_agents: HashMap<String, Arc<AgentPlan>>,
    /// The agent loops being lowered (`name@offset`), innermost last: a tool that leads
    /// back to one of them is left out rather than lowered forever.
    lowering: Vec<String>,
}

impl<'p> Compiler<'p> {
    /// `file:line:col` of a span, for errors found only at run time.
    fn at(&self, span: crate::source::Span) -> String {
        let file = self.project.sources.get(span.file);
        let (line, col) = file.line_col(span.start as usize);
        format!("{}:{line}:{col}", file.name)
    }

    fn flow_file(&mut self, id: FlowId) -> Option<FlowRef> {
        let loaded = self.project.flow(id);
        let hash = self.project.flow_hash(id, &mut self.hashes);
        if let Some(r) = self.by_key.get(&hash) {
            return Some(*r);
        }
        let flow = loaded.flow.as_ref()?;
        let mut agents = IndexMap::new();
        let mut providers = IndexMap::new();
        let mut ignored = Vec::new();
        self.project
            .visible_definitions(id, &mut agents, &mut providers, &mut ignored);
        let mcp_servers = self.project.visible_mcp_servers(id, &mut ignored);
        let scope = Scope {
            id,
            file: loaded.file,
            text: &self.project.sources.get(loaded.file).text,
            agents,
            providers,
            mcp_servers,
            defaults: flow.defaults.as_ref(),
            key: hash,
            compiled_agents: HashMap::new(),
            lowering: Vec::new(),
        };
        Some(self.flow_body(flow, scope))
    }

    fn flow_body(&mut self, flow: &'p Flow, mut scope: Scope<'p>) -> FlowRef {
        let r = FlowRef(self.flows.len());
        self.flows.push(None);
        self.by_key.insert(scope.key.clone(), r);
        // A node per step and `end`; about an edge per step.
        let n = flow.steps.len();
        let mut graph = StableDiGraph::with_capacity(n + 1, n);
        let end = graph.add_node(PlanNode::End);
        let mut steps = IndexMap::with_capacity(n);
        // Nodes first (so edges can point forward), then routes.
        let mut pending = Vec::with_capacity(n);
        for (i, (id, step)) in flow.steps.iter().enumerate() {
            let kind = self.step_kind(step, &mut scope);
            let n = graph.add_node(PlanNode::Step(StepPlan {
                id: id.clone(),
                index: i,
                kind,
                routes: Vec::new(),
                has_next: step.next.is_some(),
            }));
            steps.insert(id.clone(), n);
            pending.push((n, step));
        }
        for (n, step) in pending {
            let Some(next) = &step.next else { continue };
            let mut routes = Vec::new();
            for (order, e) in next.edges().iter().enumerate() {
                let to = if e.to.value == "end" {
                    Some(end)
                } else {
                    steps.get(&e.to.value).copied()
                };
                let Some(to) = to else { continue };
                let edge = RouteEdge {
                    on: e.on.as_ref().map(|o| o.value).unwrap_or(EdgeOn::Success),
                    errors: e
                        .errors
                        .as_ref()
                        .map(|v| v.iter().map(|s| s.value.clone()).collect()),
                    cond: e
                        .if_
                        .as_ref()
                        // Always an expression: a leading `=` (as in values) is allowed.
                        .and_then(|c| self.expr(&scope, c, c.value.strip_prefix('=').unwrap_or(&c.value))),
                    order,
                };
                routes.push(graph.add_edge(n, to, edge));
            }
            if let PlanNode::Step(s) = &mut graph[n] {
                s.routes = routes;
            }
        }
        let start = match &flow.start {
            Some(s) => steps.get(&s.value).copied(),
            None => steps.values().next().copied(),
        }
        .unwrap_or(end);
        let limits = flow.limits.as_ref();
        let plan = FlowPlan {
            name: flow.name.value.clone(),
            hash: scope.key.clone(),
            // Absolute: run records keep it for `resume`, which may run elsewhere.
            path: Some({
                let p = &self.project.flow(scope.id).path;
                std::path::absolute(p).unwrap_or_else(|_| p.clone())
            }),
            graph,
            start,
            end,
            steps,
            input_schema: flow
                .input
                .as_ref()
                .and_then(|i| i.schema.as_ref())
                .and_then(|s| self.schema(&scope, s)),
            output_schema: flow
                .output
                .as_ref()
                .and_then(|o| o.schema.as_ref())
                .and_then(|s| self.schema(&scope, s)),
            output_select: flow
                .output
                .as_ref()
                .and_then(|o| o.select.as_ref())
                .and_then(|s| self.path(&scope, s)),
            limits: FlowLimits {
                max_steps: limits
                    .and_then(|l| l.max_steps.as_ref())
                    .map_or(10_000, |v| v.value),
                max_depth: limits.and_then(|l| l.max_depth.as_ref()).map_or(3, |v| v.value),
                timeout: limits.and_then(|l| l.timeout.as_ref()).map(|v| v.value.0),
                max_payload_bytes: limits
                    .and_then(|l| l.max_payload_bytes.as_ref())
                    .map_or(8 << 20, |v| v.value.0),
                max_cost_usd: limits.and_then(|l| l.max_cost_usd.as_ref()).map(|v| v.value),
                max_file_bytes: limits
                    .and_then(|l| l.max_file_bytes.as_ref())
                    .map_or(64 << 20, |v| v.value.0),
                max_run_file_bytes: limits
                    .and_then(|l| l.max_run_file_bytes.as_ref())
                    .map(|v| v.value.0),
                by_flag: Default::default(),
            },
            allow: flow
                .allow
                .as_ref()
                .map(|a| a.iter().map(|k| k.value).collect::<BTreeSet<_>>()),
            allow_hosts: flow
                .allow_hosts
                .as_ref()
                .map(|h| h.iter().map(|s| s.value.clone()).collect()),
        };
        self.flows[r.0] = Some(Arc::new(plan));
        r
    }

    fn step_kind(&mut self, step: &'p Step, scope: &mut Scope<'p>) -> StepPlanKind {
        match &step.kind {
            StepKind::Agent(r) => {
                let call = self.call(step_call(step, r), scope);
                let l = &step.looping;
                if let Some(over) = &l.foreach {
                    StepPlanKind::Foreach(ForeachPlan {
                        over: self
                            .source_text(scope, over)
                            .unwrap_or(SourcePlan::Literal(Value::Array(Vec::new()))),
                        as_name: l
                            .as_name
                            .as_ref()
                            .map_or_else(|| "item".to_string(), |a| a.value.clone()),
                        concurrency: step.concurrency.as_ref().map_or(1, |c| c.value.max(1) as usize),
                        max_items: l.max_items.as_ref().map_or(DEFAULT_MAX_ITEMS, |m| m.value),
                        tolerate: match l.tolerate.as_ref().map(|t| t.value) {
                            Some(Tolerate::Count(n)) => Tolerance::Count(n),
                            Some(Tolerate::Percent(p)) => Tolerance::Percent(p),
                            None => Tolerance::Count(0),
                        },
                        select: l.select.as_ref().and_then(|s| self.path(scope, s)),
                        body: call,
                    })
                } else if let Some(cond) = &l.while_ {
                    let text = cond.value.strip_prefix('=').unwrap_or(&cond.value);
                    let cond = self
                        .expr(scope, cond, text)
                        .unwrap_or_else(|| Arc::new(expr::parse("false").expect("a literal parses")));
                    StepPlanKind::While(WhilePlan {
                        cond,
                        max_iterations: l.max_iterations.as_ref().map_or(1, |m| m.value),
                        delay: l.delay.as_ref().map_or(Duration::ZERO, |d| d.value.0),
                        body: call,
                    })
                } else {
                    StepPlanKind::Call(call)
                }
            }
            StepKind::Set(m) => StepPlanKind::Set(self.mappings(scope, &m.0)),
            StepKind::Parallel(branches) => StepPlanKind::Parallel(ParallelPlan {
                branches: branches
                    .iter()
                    .map(|(name, b)| {
                        let spec = CallSpec {
                            agent: &b.agent,
                            message: b.message.as_ref(),
                            scope: b.scope.as_ref(),
                            input: b.input.as_ref(),
                            output: b.output.as_ref(),
                            timeout: b.timeout.as_ref().or(step.timeout.as_ref()),
                            retry: b.retry.as_ref().or(step.retry.as_ref()),
                            idempotent: b.idempotent.as_ref().or(step.idempotent.as_ref()),
                        };
                        (name.clone(), self.call(spec, scope))
                    })
                    .collect(),
                concurrency: step
                    .concurrency
                    .as_ref()
                    .map_or(usize::MAX, |c| c.value.max(1) as usize),
                fail_fast: step.fail_fast.as_ref().is_some_and(|f| f.value),
            }),
            StepKind::Interrupt(i) => StepPlanKind::Interrupt(InterruptPlan {
                prompt: i.prompt.as_ref().and_then(|p| self.template(scope, p)),
                schema: i.schema.as_ref().and_then(|s| self.schema(scope, s)),
                expires: i.expires.as_ref().map(|d| d.value.0),
                scope: step.scope.as_ref().and_then(|s| self.path(scope, s)),
                input: self.input(scope, step.input.as_ref()),
                output: self.output(scope, step.output.as_ref()),
            }),
            StepKind::Fail(f) => StepPlanKind::Fail {
                kind: f
                    .kind
                    .as_ref()
                    .map_or_else(|| "fail".to_string(), |k| k.value.clone()),
                message: f.message.as_ref().and_then(|m| self.template(scope, m)),
            },
            StepKind::Succeed(_) => StepPlanKind::Succeed,
        }
    }

    fn call(&mut self, spec: CallSpec<'p>, scope: &mut Scope<'p>) -> CallPlan {
        let agent_model = match spec.agent {
            AgentRef::Named(n) => scope.agents.get(n.value.as_str()).copied(),
            AgentRef::Inline(a) => Some(&**a),
        };
        let agent = match agent_model {
            Some(a) => self.agent(a, scope),
            None => {
                let name = match spec.agent {
                    AgentRef::Named(n) => n,
                    AgentRef::Inline(a) => &a.name,
                };
                self.errors.push(Diagnostic::new(
                    &codes::UNKNOWN_AGENT,
                    name.span,
                    format!("unknown agent `{}`", name.value),
                ));
                Arc::new(AgentPlan {
                    name: name.value.clone(),
                    spec: AgentPlanSpec::Transform(value::ValueTemplate::Literal(Value::Null)),
                    result_schema: None,
                    input_schema: None,
                    description: None,
                })
            }
        };
        let (mut timeout, retry, mut idempotent) = call_settings(
            (spec.timeout, spec.retry, spec.idempotent),
            agent_model.map(|a| &a.common),
            scope.defaults,
            agent.kind(),
        );
        if let AgentPlanSpec::Mcp(m) = &agent.spec {
            let common = agent_model.map(|a| &a.common);
            let defaults = scope.defaults;
            let set_timeout = spec.timeout.is_some()
                || common.is_some_and(|c| c.timeout.is_some())
                || defaults.is_some_and(|d| d.timeout.is_some());
            if !set_timeout && let Some(t) = m.server.timeout {
                timeout = t;
            }
            let set_idempotent = spec.idempotent.is_some()
                || common.is_some_and(|c| c.idempotent.is_some())
                || defaults.is_some_and(|d| d.idempotent.is_some());
            if !set_idempotent {
                idempotent = m.server.idempotent.contains(&m.tool);
            }
        }
        CallPlan {
            scope: spec.scope.and_then(|s| self.path(scope, s)),
            input: self.input(scope, spec.input),
            output: self.output(scope, spec.output),
            message: spec.message.and_then(|m| self.template(scope, m)),
            agent,
            retry,
            timeout,
            idempotent,
        }
    }

    fn agent(&mut self, a: &'p Agent, scope: &mut Scope<'p>) -> Arc<AgentPlan> {
        let cache_key = format!("{}@{}", a.name.value, a.span.start);
        if let Some(p) = scope.compiled_agents.get(&cache_key) {
            return p.clone();
        }
        let spec = match &a.spec {
            AgentSpec::Llm(l) => {
                let provider = scope
                    .providers
                    .get(l.provider.value.as_str())
                    .map(|p| provider_plan(p));
                AgentPlanSpec::Llm(LlmPlan {
                    provider: Arc::new(provider.unwrap_or_else(|| ProviderPlan {
                        name: l.provider.value.clone(),
                        base_url: String::new(),
                        api_key: None,
                        headers: Vec::new(),
                        max_concurrency: None,
                        assume_tokens_per_call: None,
                        requests_per_minute: None,
                        tokens_per_minute: None,
                        prices: IndexMap::new(),
                        timeout: None,
                        structured_output: None,
                    })),
                    model: l.model.value.clone(),
                    system: l.system.as_ref().and_then(|t| self.template(scope, t)),
                    prompt: l.prompt.as_ref().and_then(|t| self.template(scope, t)),
                    temperature: l.temperature.as_ref().map(|t| t.value),
                    max_tokens: l.max_tokens.as_ref().map(|t| t.value),
                    repair_attempts: l.repair_attempts.as_ref().map_or(1, |r| r.value),
                    context_paths: l
                        .context_paths
                        .iter()
                        .filter_map(|p| self.path(scope, p))
                        .collect(),
                    message_mode: l.message_mode.as_ref().map_or(MessageMode::None, |m| m.value),
                    max_messages: l.max_messages.as_ref().map(|m| m.value),
                    agent_loop: self.agent_loop(a, l, scope),
                    attach: l
                        .attach
                        .as_ref()
                        .map(|t| Box::new(self.value_template(scope, &t.0))),
                    max_attach_bytes: l
                        .max_attach_bytes
                        .as_ref()
                        .map_or(crate::plan::DEFAULT_MAX_ATTACH_BYTES, |m| m.value.0),
                })
            }
            AgentSpec::Command(c) => {
                let flow_dir = self
                    .project
                    .flow(scope.id)
                    .path
                    .parent()
                    .map(FsPath::to_path_buf)
                    .unwrap_or_default();
                AgentPlanSpec::Command(CommandPlan {
                    run: c.run.iter().filter_map(|arg| self.template(scope, arg)).collect(),
                    env: c.env.iter().map(|(k, v)| (k.clone(), v.value.clone())).collect(),
                    cwd: c
                        .cwd
                        .as_ref()
                        .map(|d| flow_dir.join(&d.value))
                        .or_else(|| self.project.command_dir.clone()),
                    max_output: c.max_output.as_ref().map_or(DEFAULT_MAX_OUTPUT, |m| m.value.0),
                    bundle: c.bundle.iter().map(|p| p.value.clone()).collect(),
                    flow_dir,
                })
            }
            AgentSpec::Http(h) => AgentPlanSpec::Http(HttpPlan {
                url: h.url.value.clone(),
                method: h
                    .method
                    .as_ref()
                    .map_or_else(|| "POST".to_string(), |m| m.value.to_ascii_uppercase()),
                headers: h
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.value.clone()))
                    .collect(),
                max_response: h.max_response.as_ref().map_or(DEFAULT_MAX_OUTPUT, |m| m.value.0),
                body: h.body.as_ref().map(|t| self.value_template(scope, &t.0)),
            }),
            AgentSpec::Flow(f) => {
                let callee = if let Some(inline) = &f.inline {
                    let mut agents = scope.agents.clone();
                    for (k, v) in &inline.agents {
                        agents.insert(k.as_str(), v);
                    }
                    let inner = Scope {
                        id: scope.id,
                        file: scope.file,
                        text: scope.text,
                        agents,
                        providers: scope.providers.clone(),
                        mcp_servers: scope.mcp_servers.clone(),
                        defaults: inline.defaults.as_ref().or(scope.defaults),
                        key: format!("{}#{}@{}", scope.key, a.name.value, a.span.start),
                        compiled_agents: HashMap::new(),
                        lowering: Vec::new(),
                    };
                    match self.by_key.get(&inner.key) {
                        Some(r) => Some(*r),
                        None => Some(self.flow_body(inline, inner)),
                    }
                } else {
                    let path = f.path.as_ref();
                    let callee = self
                        .project
                        .calls
                        .iter()
                        .find(|(caller, spec, _)| *caller == scope.id && Some(spec) == path)
                        .and_then(|(_, _, callee)| *callee);
                    callee.and_then(|id| self.flow_file(id))
                };
                match callee {
                    Some(r) => AgentPlanSpec::Flow(r),
                    None => {
                        self.errors.push(Diagnostic::new(
                            &codes::MISSING_FILE,
                            a.kind.span,
                            format!("flow of agent `{}` could not be loaded", a.name.value),
                        ));
                        AgentPlanSpec::Transform(value::ValueTemplate::Literal(Value::Null))
                    }
                }
            }
            AgentSpec::Transform(t) => AgentPlanSpec::Transform(self.value_template(scope, &t.result.0)),
            AgentSpec::Mock(m) => AgentPlanSpec::Mock(self.mock(scope, m)),
            AgentSpec::Native(n) => AgentPlanSpec::Native(NativePlan {
                function: n
                    .function
                    .as_ref()
                    .map_or_else(|| a.name.value.clone(), |f| f.value.clone()),
                at: self.at(a.name.span),
            }),
            AgentSpec::Mcp(m) => {
                let server = match scope.mcp_servers.get(m.server.value.as_str()) {
                    Some(server) => self.mcp_server(scope.id, server),
                    None => {
                        self.errors.push(Diagnostic::new(
                            &codes::UNKNOWN_MCP_SERVER,
                            m.server.span,
                            format!("unknown MCP server `{}`", m.server.value),
                        ));
                        Arc::new(unknown_mcp_server(&m.server.value))
                    }
                };
                AgentPlanSpec::Mcp(McpPlan {
                    server,
                    tool: m.tool.value.clone(),
                })
            }
        };
        let plan = Arc::new(AgentPlan {
            name: a.name.value.clone(),
            spec,
            result_schema: a
                .common
                .result_schema
                .as_ref()
                .and_then(|s| self.schema(scope, s)),
            input_schema: a.common.input_schema.as_ref().and_then(|s| self.schema(scope, s)),
            description: a.common.description.clone(),
        });
        scope.compiled_agents.insert(cache_key, plan.clone());
        plan
    }

    /// An `llm` agent's `tools:` and bounds; `None` without tools. A tool is an agent of the
    /// same scope, lowered like a step's; one that names no agent, or that would lead back to
    /// the agent being lowered (lint reports both), is left out.
    fn agent_loop(
        &mut self,
        a: &'p Agent,
        l: &'p crate::model::LlmAgent,
        scope: &mut Scope<'p>,
    ) -> Option<LoopPlan> {
        if l.tools.list.is_empty() {
            return None;
        }
        let key = format!("{}@{}", a.name.value, a.span.start);
        scope.lowering.push(key);
        let mut tools = Vec::new();
        let mut servers = Vec::new();
        for t in &l.tools.list {
            let Some(&agent) = scope.agents.get(t.name.value.as_str()) else {
                // An MCP server's tools: the server's name, or `server.tool`.
                let (name, only) = match t.name.value.split_once('.') {
                    Some((server, tool)) => (server, Some(tool.to_string())),
                    None => (t.name.value.as_str(), None),
                };
                if let Some(&server) = scope.mcp_servers.get(name) {
                    let server = self.mcp_server(scope.id, server);
                    let (mut timeout, retry, _) = call_settings(
                        (None, None, None),
                        None,
                        scope.defaults,
                        crate::model::AgentKind::Mcp,
                    );
                    if scope.defaults.is_none_or(|d| d.timeout.is_none())
                        && let Some(t) = server.timeout
                    {
                        timeout = t;
                    }
                    servers.push(LoopServerPlan {
                        server,
                        only,
                        timeout,
                        retry,
                    });
                }
                continue;
            };
            if scope
                .lowering
                .contains(&format!("{}@{}", agent.name.value, agent.span.start))
            {
                continue;
            }
            let plan = self.agent(agent, scope);
            // A tool is called by the model, not by a step: its agent's settings, else the
            // flow's defaults.
            let (timeout, retry, idempotent) = call_settings(
                (None, None, None),
                Some(&agent.common),
                scope.defaults,
                plan.kind(),
            );
            let call = CallPlan {
                scope: None,
                input: InputPlan::All,
                output: OutputPlan::None,
                message: None,
                timeout,
                retry,
                idempotent,
                agent: plan,
            };
            let parameters = call
                .agent
                .input_schema
                .as_ref()
                .map_or_else(|| serde_json::json!({"type": "object"}), |s| s.value.clone());
            tools.push(ToolPlan {
                name: t.name.value.clone(),
                description: t
                    .description
                    .as_ref()
                    .map(|d| d.value.clone())
                    .or_else(|| agent.common.description.clone()),
                parameters,
                call,
            });
        }
        scope.lowering.pop();
        Some(LoopPlan {
            tools,
            max_iterations: l.max_iterations.as_ref().map_or(30, |m| m.value.max(1)),
            max_parallel_tools: l
                .max_parallel_tools
                .as_ref()
                .map_or(5, |m| usize::try_from(m.value.max(1)).unwrap_or(usize::MAX)),
            until_tool: l.until_tool.as_ref().map(|u| u.value.clone()),
            approve: l.approve.iter().map(|a| a.value.clone()).collect(),
            servers,
            approve_expires: l.approve_expires.as_ref().map(|d| d.value.0),
            reject_on_expire: l
                .on_expire
                .as_ref()
                .is_some_and(|o| o.value == crate::model::OnExpire::Reject),
        })
    }

    fn mock(&mut self, scope: &Scope<'p>, m: &'p crate::model::MockAgent) -> MockPlan {
        MockPlan {
            returns: m.returns.as_ref().map(|r| self.value_template(scope, &r.0)),
            sequence: m
                .sequence
                .iter()
                .flatten()
                .map(|r| self.value_template(scope, &r.0))
                .collect(),
            latency: m.latency.as_ref().map(|l| l.value.0),
            fail_times: m.fail_times.as_ref().map_or(0, |f| f.value),
            fail_rate: m.fail_rate.as_ref().map_or(0.0, |f| f.value),
            seed: m.seed.as_ref().map_or(0, |s| s.value),
            dir: self
                .project
                .flow(scope.id)
                .path
                .parent()
                .map(FsPath::to_path_buf)
                .unwrap_or_default(),
        }
    }

    fn value_template(&mut self, scope: &Scope<'p>, node: &crate::syntax::Node) -> value::ValueTemplate {
        let (t, errors) = value::compile_cached(node, scope.text, &mut self.parsed);
        for (span, e) in errors {
            self.errors
                .push(Diagnostic::new(&codes::EXPRESSION_SYNTAX, span, e.message));
        }
        t.unwrap_or(value::ValueTemplate::Literal(Value::Null))
    }

    fn input(&mut self, scope: &Scope<'p>, spec: Option<&'p InputSpec>) -> InputPlan {
        match spec {
            None | Some(InputSpec::All(_)) => InputPlan::All,
            Some(InputSpec::Paths(p)) => {
                InputPlan::Paths(p.iter().filter_map(|p| self.path(scope, p)).collect())
            }
            Some(InputSpec::Map(m)) => InputPlan::Map(self.mappings(scope, &m.0)),
        }
    }

    fn output(&mut self, scope: &Scope<'p>, spec: Option<&'p OutputSpec>) -> OutputPlan {
        match spec {
            None => OutputPlan::None,
            Some(OutputSpec::All(_)) => OutputPlan::All,
            Some(OutputSpec::Paths(p)) => {
                OutputPlan::Paths(p.iter().filter_map(|p| self.path(scope, p)).collect())
            }
            Some(OutputSpec::Map(m)) => OutputPlan::Map(self.mappings(scope, &m.0)),
        }
    }

    fn mappings(&mut self, scope: &Scope<'p>, m: &'p [(Sp<String>, Source)]) -> Vec<(Path, SourcePlan)> {
        m.iter()
            .filter_map(|(dest, src)| {
                let d = self.path(scope, dest)?;
                let s = match src {
                    Source::Text(t) => self.source_text(scope, t)?,
                    Source::WithDefault { path, default } => {
                        SourcePlan::WithDefault(self.path(scope, path)?, default.0.to_json())
                    }
                    Source::Literal { value } => SourcePlan::Literal(value.0.to_json()),
                };
                Some((d, s))
            })
            .collect()
    }

    fn source_text(&mut self, scope: &Scope<'p>, t: &'p Sp<String>) -> Option<SourcePlan> {
        match t.value.strip_prefix('=') {
            Some(e) => self.expr(scope, t, e).map(SourcePlan::Expr),
            None => self.path(scope, t).map(SourcePlan::Path),
        }
    }

    fn path(&mut self, _scope: &Scope<'p>, p: &Sp<String>) -> Option<Path> {
        match self.parsed.path(&p.value) {
            Ok(path) => Some(path.clone()),
            Err(e) => {
                let message = e.message.clone();
                self.errors
                    .push(Diagnostic::new(&codes::JSONPATH_SYNTAX, p.span, message));
                None
            }
        }
    }

    fn expr(&mut self, _scope: &Scope<'p>, at: &Sp<String>, text: &str) -> Option<Arc<Expr>> {
        match &self.parsed.expr(text).expr {
            Ok(e) => Some(Arc::clone(e)),
            Err(e) => {
                self.errors.push(Diagnostic::new(
                    &codes::EXPRESSION_SYNTAX,
                    at.span,
                    e.message.clone(),
                ));
                None
            }
        }
    }

    fn template(&mut self, _scope: &Scope<'p>, t: &Sp<String>) -> Option<Template> {
        match self.parsed.template(&t.value) {
            Ok(compiled) => Some(compiled.clone()),
            Err(e) => {
                let message = e.message.clone();
                self.errors
                    .push(Diagnostic::new(&codes::TEMPLATE_SYNTAX, t.span, message));
                None
            }
        }
    }

    fn schema(&mut self, scope: &Scope<'p>, s: &SchemaRef) -> Option<Arc<Schema>> {
        let (value, span) = match s {
            SchemaRef::Inline(node) => (node.0.to_json(), node.0.span),
            SchemaRef::Path(p) => {
                let loaded = self.project.schema_for(scope.id, &p.value)?;
                (loaded.node.as_ref()?.to_json(), p.span)
            }
        };
        match Schema::new(value) {
            Ok(s) => Some(Arc::new(s)),
            Err(e) => {
                self.errors.push(Diagnostic::new(
                    &codes::INVALID_SCHEMA,
                    span,
                    format!("invalid JSON Schema: {e}"),
                ));
                None
            }
        }
    }
}

/// The call-shaped fields of a step or branch.
struct CallSpec<'p> {
    agent: &'p AgentRef,
    message: Option<&'p Sp<String>>,
    scope: Option<&'p Sp<String>>,
    input: Option<&'p InputSpec>,
    output: Option<&'p OutputSpec>,
    timeout: Option<&'p Sp<crate::model::Dur>>,
    retry: Option<&'p Retry>,
    idempotent: Option<&'p Sp<bool>>,
}

fn step_call<'p>(step: &'p Step, agent: &'p AgentRef) -> CallSpec<'p> {
    CallSpec {
        agent,
        message: step.message.as_ref(),
        scope: step.scope.as_ref(),
        input: step.input.as_ref(),
        output: step.output.as_ref(),
        timeout: step.timeout.as_ref(),
        retry: step.retry.as_ref(),
        idempotent: step.idempotent.as_ref(),
    }
}

/// A call's `timeout`, `retry` and `idempotent`: the caller's own (a step's or a branch's),
/// else its agent's, else the flow's `defaults`, else the engine's defaults for the kind.
fn call_settings(
    (timeout, retry, idempotent): (Option<&Sp<crate::model::Dur>>, Option<&Retry>, Option<&Sp<bool>>),
    common: Option<&crate::model::AgentCommon>,
    defaults: Option<&crate::model::Defaults>,
    kind: crate::model::AgentKind,
) -> (std::time::Duration, RetryPolicy, bool) {
    let timeout = timeout
        .or(common.and_then(|c| c.timeout.as_ref()))
        .or(defaults.and_then(|d| d.timeout.as_ref()))
        .map_or(DEFAULT_TIMEOUT, |t| t.value.0);
    let retry = retry
        .or(common.and_then(|c| c.retry.as_ref()))
        .or(defaults.and_then(|d| d.retry.as_ref()))
        .map(retry_policy)
        .unwrap_or_default();
    let idempotent = idempotent
        .or(common.and_then(|c| c.idempotent.as_ref()))
        .or(defaults.and_then(|d| d.idempotent.as_ref()))
        .map_or_else(|| kind.idempotent_by_default(), |b| b.value);
    (timeout, retry, idempotent)
}

fn retry_policy(r: &Retry) -> RetryPolicy {
    let d = RetryPolicy::default();
    RetryPolicy {
        attempts: r
            .attempts
            .as_ref()
            .map_or(d.attempts, |a| a.value.clamp(1, 1000) as u32),
        backoff: r.backoff.as_ref().map_or(d.backoff, |b| b.value.0),
        factor: r.factor.as_ref().map_or(d.factor, |f| f.value),
        max_backoff: r.max_backoff.as_ref().map_or(d.max_backoff, |m| m.value.0),
        jitter: match r.jitter.as_ref().map(|j| j.value) {
            Some(Jitter::Bool(true)) => 0.5,
            Some(Jitter::Bool(false)) => 0.0,
            Some(Jitter::Fraction(f)) => f,
            None => d.jitter,
        },
        on: r
            .on
            .as_ref()
            .map_or(d.on, |on| on.iter().map(|s| s.value.clone()).collect()),
    }
}

impl Compiler<'_> {
    /// An MCP server's plan, shared by every agent naming a definition with the same key.
    fn mcp_server(&mut self, id: FlowId, server: &McpServer) -> Arc<McpServerPlan> {
        let plan = mcp_server_plan(self.project, id, server);
        self.mcp_servers
            .entry(plan.key.clone())
            .or_insert_with(|| Arc::new(plan))
            .clone()
    }
}

/// An MCP server definition as the runtime reaches it: a stdio server's `command` runs in the
/// directory of the file that defines it (flow `id`'s when that file is not on disk).
pub fn mcp_server_plan(project: &Project, id: FlowId, server: &McpServer) -> McpServerPlan {
    let file = project.sources.get(server.name.span.file);
    let dir = file
        .path
        .as_deref()
        .and_then(FsPath::parent)
        .map(FsPath::to_path_buf)
        .or_else(|| project.flow(id).path.parent().map(FsPath::to_path_buf))
        .unwrap_or_default();
    let dir = dir.canonicalize().unwrap_or(dir);
    let transport = match &server.url {
        Some(url) => McpTransport::Http {
            url: url.value.clone(),
            headers: server
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.value.clone()))
                .collect(),
        },
        None => McpTransport::Stdio {
            argv: server.command.iter().map(|a| a.value.clone()).collect(),
            dir,
            env: server
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.value.clone()))
                .collect(),
        },
    };
    let names = |l: &[Sp<String>]| l.iter().map(|t| t.value.clone()).collect::<Vec<_>>();
    let key = serde_json::to_string(&match &transport {
        McpTransport::Stdio { argv, dir, env } => {
            serde_json::json!({"argv": argv, "dir": dir.to_string_lossy(), "env": env})
        }
        McpTransport::Http { url, headers } => serde_json::json!({"url": url, "headers": headers}),
    })
    .expect("a key serializes");
    McpServerPlan {
        name: server.name.value.clone(),
        transport,
        tools: names(&server.tools),
        approve: names(&server.approve),
        no_approval: names(&server.no_approval),
        trusted: server
            .trust
            .as_ref()
            .is_some_and(|t| t.value == crate::model::Trust::Trusted),
        idempotent: names(&server.idempotent),
        timeout: server.timeout.as_ref().map(|t| t.value.0),
        max_time: server.max_time.as_ref().map(|t| t.value.0),
        max_result_bytes: server
            .max_result_bytes
            .as_ref()
            .map_or(DEFAULT_MAX_MCP_RESULT, |s| s.value.0),
        key: format!("{}:{key}", server.name.value),
    }
}

/// The stand-in plan of a server lint should have found unknown.
fn unknown_mcp_server(name: &str) -> McpServerPlan {
    McpServerPlan {
        name: name.to_string(),
        transport: McpTransport::Stdio {
            argv: Vec::new(),
            dir: Default::default(),
            env: Vec::new(),
        },
        tools: Vec::new(),
        approve: Vec::new(),
        no_approval: Vec::new(),
        trusted: false,
        idempotent: Vec::new(),
        timeout: None,
        max_time: None,
        max_result_bytes: DEFAULT_MAX_MCP_RESULT,
        key: String::new(),
    }
}

fn provider_plan(p: &Provider) -> ProviderPlan {
    ProviderPlan {
        name: p.name.value.clone(),
        base_url: p.base_url.value.clone(),
        api_key: p.api_key.as_ref().map(|k| k.value.clone()),
        headers: p
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.value.clone()))
            .collect(),
        max_concurrency: p.max_concurrency.as_ref().map(|m| m.value),
        assume_tokens_per_call: p.assume_tokens_per_call.as_ref().map(|m| m.value),
        requests_per_minute: p
            .rate_limit
            .as_ref()
            .and_then(|r| r.requests_per_minute.as_ref())
            .map(|v| v.value),
        tokens_per_minute: p
            .rate_limit
            .as_ref()
            .and_then(|r| r.tokens_per_minute.as_ref())
            .map(|v| v.value),
        prices: p
            .prices
            .iter()
            .map(|(k, v)| (k.clone(), (v.input_per_mtok.value, v.output_per_mtok.value)))
            .collect(),
        timeout: p.timeout.as_ref().map(|t| t.value.0),
        structured_output: p.structured_output.as_ref().map(|s| s.value),
    }
}
