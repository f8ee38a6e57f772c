//! The plan: what the runtime executes. Every name is resolved, every JSONPath, expression
//! and template is compiled, and steps refer to each other by graph index.
//!
//! A [`Plan`] holds every flow of a run tree, keyed by content hash: the top flow and each flow
//! file (or inline flow) that a `flow` agent calls. Each [`FlowPlan`] is a petgraph
//! `StableDiGraph` of [`PlanNode`]s whose edges are the routes of SPEC §4, tried in the order
//! written. Loop bodies (`foreach`, `while`) and `parallel` branches are [`CallPlan`]s inside
//! their node: sub-plans of one agent call each.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use indexmap::IndexMap;
use petgraph::stable_graph::{EdgeIndex, NodeIndex, StableDiGraph};
use serde_json::Value;

use crate::expr::Expr;
use crate::expr::path::Path;
use crate::expr::template::Template;
use crate::expr::value::ValueTemplate;
use crate::model::{AgentKind, EdgeOn, MessageMode};

/// A JSON Schema with its validator, built once at compile time.
pub struct Schema {
    pub value: Value,
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schema").field("value", &self.value).finish()
    }
}

/// A value that does not satisfy a schema: where (a JSON pointer) and which rule.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaViolation {
    pub pointer: String,
    pub message: String,
}

impl std::fmt::Display for SchemaViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.pointer.is_empty() {
            "/"
        } else {
            &self.pointer
        };
        write!(f, "at `{at}`: {}", self.message)
    }
}

impl Schema {
    pub fn new(value: Value) -> Result<Schema, String> {
        let validator = jsonschema::validator_for(&value).map_err(|e| e.to_string())?;
        Ok(Schema { value, validator })
    }

    /// Every violation of `instance`, in the validator's order.
    pub fn violations(&self, instance: &Value) -> Vec<SchemaViolation> {
        self.validator
            .iter_errors(instance)
            .map(|e| SchemaViolation {
                pointer: e.instance_path().to_string(),
                message: e.to_string(),
            })
            .collect()
    }

    /// The first violation of `instance`, if any.
    pub fn check(&self, instance: &Value) -> Result<(), SchemaViolation> {
        match self.validator.iter_errors(instance).next() {
            None => Ok(()),
            Some(e) => Err(SchemaViolation {
                pointer: e.instance_path().to_string(),
                message: e.to_string(),
            }),
        }
    }
}

/// Index of a flow in [`Plan::flows`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowRef(pub usize);

/// Every flow of a run tree, compiled.
#[derive(Debug)]
pub struct Plan {
    pub flows: Vec<Arc<FlowPlan>>,
    /// The top flow.
    pub root: FlowRef,
}

impl Plan {
    pub fn root(&self) -> &Arc<FlowPlan> {
        &self.flows[self.root.0]
    }

    pub fn flow(&self, r: FlowRef) -> &Arc<FlowPlan> {
        &self.flows[r.0]
    }

    /// Every agent the plan's steps can call — agent loops' tools and their tools too —
    /// each once per flow, with the index of its flow in [`Plan::flows`].
    pub fn agents(&self) -> Vec<(usize, &Arc<AgentPlan>)> {
        self.agents_of(true)
    }

    /// The agents the plan's steps call themselves (not the tools of agent loops, which the
    /// model may never call), each once per flow, with the index of its flow.
    pub fn step_agents(&self) -> Vec<(usize, &Arc<AgentPlan>)> {
        self.agents_of(false)
    }

    fn agents_of(&self, tools: bool) -> Vec<(usize, &Arc<AgentPlan>)> {
        fn add<'a>(
            i: usize,
            agent: &'a Arc<AgentPlan>,
            tools: bool,
            seen: &mut std::collections::HashSet<(usize, *const AgentPlan)>,
            out: &mut Vec<(usize, &'a Arc<AgentPlan>)>,
        ) {
            if !seen.insert((i, Arc::as_ptr(agent))) {
                return;
            }
            out.push((i, agent));
            if let AgentPlanSpec::Llm(LlmPlan {
                agent_loop: Some(lp), ..
            }) = &agent.spec
                && tools
            {
                for tool in &lp.tools {
                    add(i, &tool.call.agent, tools, seen, out);
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (i, flow) in self.flows.iter().enumerate() {
            for node in flow.graph.node_weights() {
                let PlanNode::Step(step) = node else { continue };
                for call in step.kind.calls() {
                    add(i, &call.agent, tools, &mut seen, &mut out);
                }
            }
        }
        out
    }
}

/// One compiled flow.
#[derive(Debug)]
pub struct FlowPlan {
    pub name: String,
    /// What a run records and `resume` compares: the hash of the flow's file, covering the
    /// files it imports and the flows it calls (`Project::flow_hash`), with a suffix naming
    /// the agent for inline flows.
    pub hash: String,
    /// The file the flow came from (for inline flows: the enclosing file).
    pub path: Option<PathBuf>,
    pub graph: StableDiGraph<PlanNode, RouteEdge>,
    pub start: NodeIndex,
    /// The node `to: end` leads to.
    pub end: NodeIndex,
    /// Step id → node, in the order written.
    pub steps: IndexMap<String, NodeIndex>,
    pub input_schema: Option<Arc<Schema>>,
    pub output_schema: Option<Arc<Schema>>,
    pub output_select: Option<Path>,
    pub limits: FlowLimits,
    /// Agent kinds allowed by this flow (before intersecting with callers'); `None`: all.
    pub allow: Option<BTreeSet<AgentKind>>,
    pub allow_hosts: Option<Vec<String>>,
}

impl FlowPlan {
    /// The step at a node; `None` for the end node.
    pub fn step(&self, n: NodeIndex) -> Option<&StepPlan> {
        match &self.graph[n] {
            PlanNode::Step(s) => Some(s),
            PlanNode::End => None,
        }
    }

    /// A step's routes, in the order written.
    pub fn routes(&self, step: &StepPlan) -> impl Iterator<Item = (&RouteEdge, NodeIndex)> {
        step.routes.iter().map(|e| {
            let (_, to) = self.graph.edge_endpoints(*e).expect("route edges exist");
            (&self.graph[*e], to)
        })
    }
}

/// `limits:` with defaults applied (SPEC §9), narrowed by the command's flags
/// ([`FlowLimits::narrow`]).
#[derive(Clone, Debug, PartialEq)]
pub struct FlowLimits {
    pub max_steps: u64,
    pub max_depth: u64,
    pub timeout: Option<Duration>,
    pub max_payload_bytes: u64,
    pub max_cost_usd: Option<f64>,
    /// The largest file a step may make, or read through `file()` (SPEC §6.5).
    pub max_file_bytes: u64,
    /// All the bytes of the files a run makes, its child runs' included.
    pub max_run_file_bytes: Option<u64>,
    /// The limits a flag set (tighter than the flow's), so that their errors name the flag.
    pub by_flag: LimitFlags,
}

/// Which limits of a flow a command's flags narrowed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LimitFlags {
    pub max_steps: bool,
    pub timeout: bool,
    pub max_payload_bytes: bool,
    pub max_file_bytes: bool,
    pub max_run_file_bytes: bool,
}

/// Limits given as flags (`--max-steps`, ...): each applies where it is tighter than the
/// flow's own.
#[derive(Clone, Debug, Default)]
pub struct NarrowLimits {
    pub max_steps: Option<u64>,
    pub max_depth: Option<u64>,
    pub timeout: Option<Duration>,
    pub max_payload_bytes: Option<u64>,
    pub max_file_bytes: Option<u64>,
    pub max_run_file_bytes: Option<u64>,
}

impl Default for FlowLimits {
    fn default() -> Self {
        FlowLimits {
            max_steps: 10_000,
            max_depth: 3,
            timeout: None,
            max_payload_bytes: 8 << 20,
            max_cost_usd: None,
            max_file_bytes: 64 << 20,
            max_run_file_bytes: None,
            by_flag: LimitFlags::default(),
        }
    }
}

impl FlowLimits {
    /// Applies the flags that are tighter than these limits; returns, for each flag that is
    /// not (it changes nothing), its name and the flow's value.
    pub fn narrow(&mut self, flags: &NarrowLimits) -> Vec<(&'static str, String)> {
        let mut looser = Vec::new();
        if let Some(v) = flags.max_steps {
            if v < self.max_steps {
                self.max_steps = v;
                self.by_flag.max_steps = true;
            } else if v > self.max_steps {
                looser.push(("--max-steps", self.max_steps.to_string()));
            }
        }
        if let Some(v) = flags.max_depth {
            if v < self.max_depth {
                self.max_depth = v;
            } else if v > self.max_depth {
                looser.push(("--max-depth", self.max_depth.to_string()));
            }
        }
        if let Some(v) = flags.timeout {
            match self.timeout {
                Some(t) if t < v => looser.push(("--timeout", format!("{}ms", t.as_millis()))),
                Some(t) if t == v => {}
                _ => {
                    self.timeout = Some(v);
                    self.by_flag.timeout = true;
                }
            }
        }
        if let Some(v) = flags.max_payload_bytes {
            if v < self.max_payload_bytes {
                self.max_payload_bytes = v;
                self.by_flag.max_payload_bytes = true;
            } else if v > self.max_payload_bytes {
                looser.push(("--max-payload-bytes", self.max_payload_bytes.to_string()));
            }
        }
        if let Some(v) = flags.max_file_bytes {
            if v < self.max_file_bytes {
                self.max_file_bytes = v;
                self.by_flag.max_file_bytes = true;
            } else if v > self.max_file_bytes {
                looser.push(("--max-file-bytes", self.max_file_bytes.to_string()));
            }
        }
        if let Some(v) = flags.max_run_file_bytes {
            match self.max_run_file_bytes {
                Some(m) if m < v => looser.push(("--max-run-file-bytes", m.to_string())),
                Some(m) if m == v => {}
                _ => {
                    self.max_run_file_bytes = Some(v);
                    self.by_flag.max_run_file_bytes = true;
                }
            }
        }
        looser
    }

    /// How an error names the step limit: the flag that set it, or the flow's field.
    pub fn max_steps_name(&self) -> &'static str {
        if self.by_flag.max_steps {
            "--max-steps"
        } else {
            "limits.max_steps"
        }
    }

    pub fn timeout_name(&self) -> &'static str {
        if self.by_flag.timeout {
            "--timeout"
        } else {
            "limits.timeout"
        }
    }

    pub fn max_payload_bytes_name(&self) -> &'static str {
        if self.by_flag.max_payload_bytes {
            "--max-payload-bytes"
        } else {
            "limits.max_payload_bytes"
        }
    }

    pub fn max_file_bytes_name(&self) -> &'static str {
        if self.by_flag.max_file_bytes {
            "--max-file-bytes"
        } else {
            "limits.max_file_bytes"
        }
    }

    pub fn max_run_file_bytes_name(&self) -> &'static str {
        if self.by_flag.max_run_file_bytes {
            "--max-run-file-bytes"
        } else {
            "limits.max_run_file_bytes"
        }
    }
}

impl Plan {
    /// Narrows the top flow's limits by a command's flags ([`FlowLimits::narrow`]): they
    /// bound the run the command starts (and, for `max_depth`, its tree). Call before the
    /// plan is shared.
    pub fn narrow_limits(&mut self, flags: &NarrowLimits) -> Vec<(&'static str, String)> {
        let root = self.root.0;
        let flow = Arc::get_mut(&mut self.flows[root]).expect("the plan is not shared yet");
        flow.limits.narrow(flags)
    }
}

// Plan nodes are built once at compile time and never moved on hot paths; boxing the
// variants would add an indirection to every step for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum PlanNode {
    Step(StepPlan),
    /// `to: end`: finish the run successfully.
    End,
}

/// A route: taken when `on` matches the outcome, the error kind is in `errors` (if any) and
/// `cond` (if any) is true.
#[derive(Debug, Clone)]
pub struct RouteEdge {
    pub on: EdgeOn,
    pub errors: Option<Vec<String>>,
    pub cond: Option<Arc<Expr>>,
    /// Position among the step's edges.
    pub order: usize,
}

impl RouteEdge {
    /// The label drawn on the edge: `if`, `on`, `errors`.
    pub fn label(&self) -> String {
        let mut parts = Vec::new();
        match self.on {
            EdgeOn::Success => {}
            EdgeOn::Failure => parts.push("on failure".to_string()),
            EdgeOn::Always => parts.push("always".to_string()),
        }
        if let Some(e) = &self.errors {
            parts.push(format!("errors: {}", e.join(", ")));
        }
        if let Some(c) = &self.cond {
            parts.push(format!("if {}", c.text()));
        }
        parts.join("; ")
    }
}

#[derive(Debug)]
pub struct StepPlan {
    pub id: String,
    /// Position in `steps:`.
    pub index: usize,
    pub kind: StepPlanKind,
    /// Routing edges, in the order written (indices into the graph).
    pub routes: Vec<EdgeIndex>,
    /// Whether the step has `next` at all (no `next`: success ends the run).
    pub has_next: bool,
}

#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum StepPlanKind {
    Call(CallPlan),
    Foreach(ForeachPlan),
    While(WhilePlan),
    Set(Vec<(Path, SourcePlan)>),
    Parallel(ParallelPlan),
    Interrupt(InterruptPlan),
    Fail { kind: String, message: Option<Template> },
    Succeed,
}

impl StepPlanKind {
    /// The agent calls of a step of this kind (a `parallel` step's: one per branch).
    pub fn calls(&self) -> Vec<&CallPlan> {
        match self {
            StepPlanKind::Call(c) => vec![c],
            StepPlanKind::Foreach(f) => vec![&f.body],
            StepPlanKind::While(w) => vec![&w.body],
            StepPlanKind::Parallel(p) => p.branches.iter().map(|(_, c)| c).collect(),
            _ => Vec::new(),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            StepPlanKind::Call(_) => "agent",
            StepPlanKind::Foreach(_) => "foreach",
            StepPlanKind::While(_) => "while",
            StepPlanKind::Set(_) => "set",
            StepPlanKind::Parallel(_) => "parallel",
            StepPlanKind::Interrupt(_) => "interrupt",
            StepPlanKind::Fail { .. } => "fail",
            StepPlanKind::Succeed => "succeed",
        }
    }
}

/// One agent call: how its input is built, how its result comes back, and its policies.
#[derive(Debug)]
pub struct CallPlan {
    pub agent: Arc<AgentPlan>,
    pub scope: Option<Path>,
    pub input: InputPlan,
    pub output: OutputPlan,
    pub message: Option<Template>,
    pub retry: RetryPolicy,
    pub timeout: Duration,
    pub idempotent: bool,
}

#[derive(Debug)]
pub struct ForeachPlan {
    pub over: SourcePlan,
    pub as_name: String,
    pub concurrency: usize,
    pub max_items: u64,
    pub tolerate: Tolerance,
    pub select: Option<Path>,
    /// The per-item call; its `output` is applied once, to the array of results.
    pub body: CallPlan,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tolerance {
    Count(u64),
    Percent(f64),
}

#[derive(Debug)]
pub struct WhilePlan {
    pub cond: Arc<Expr>,
    pub max_iterations: u64,
    pub delay: Duration,
    pub body: CallPlan,
}

#[derive(Debug)]
pub struct ParallelPlan {
    pub branches: Vec<(String, CallPlan)>,
    pub concurrency: usize,
    pub fail_fast: bool,
}

#[derive(Debug)]
pub struct InterruptPlan {
    pub prompt: Option<Template>,
    pub schema: Option<Arc<Schema>>,
    pub expires: Option<Duration>,
    pub scope: Option<Path>,
    pub input: InputPlan,
    pub output: OutputPlan,
}

#[derive(Debug)]
pub enum InputPlan {
    /// The whole payload (or scope).
    All,
    /// Only these paths, structure kept.
    Paths(Vec<Path>),
    /// A new document.
    Map(Vec<(Path, SourcePlan)>),
}

#[derive(Debug)]
pub enum OutputPlan {
    /// Nothing merged.
    None,
    /// Deep merge.
    All,
    /// Deep merge under these paths only; anything else is a violation.
    Paths(Vec<Path>),
    /// Destination → source in the result.
    Map(Vec<(Path, SourcePlan)>),
}

#[derive(Debug)]
pub enum SourcePlan {
    Path(Path),
    Expr(Arc<Expr>),
    WithDefault(Path, Value),
    Literal(Value),
}

/// `retry:` with defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub backoff: Duration,
    pub factor: f64,
    pub max_backoff: Duration,
    /// Fraction of each wait randomised (0 = none).
    pub jitter: f64,
    pub on: Vec<String>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 1,
            backoff: Duration::from_secs(1),
            factor: 2.0,
            max_backoff: Duration::from_secs(60),
            jitter: 0.5,
            on: vec!["timeout".into(), "agent".into(), "rate_limited".into()],
        }
    }
}

/// A resolved agent.
#[derive(Debug)]
pub struct AgentPlan {
    pub name: String,
    pub spec: AgentPlanSpec,
    pub result_schema: Option<Arc<Schema>>,
    /// The JSON Schema of the agent's input document, checked before each call.
    pub input_schema: Option<Arc<Schema>>,
    /// What the agent does, for the model when it is a tool.
    pub description: Option<String>,
}

impl AgentPlan {
    pub fn kind(&self) -> AgentKind {
        match &self.spec {
            AgentPlanSpec::Llm(_) => AgentKind::Llm,
            AgentPlanSpec::Command(_) => AgentKind::Command,
            AgentPlanSpec::Http(_) => AgentKind::Http,
            AgentPlanSpec::Flow(_) => AgentKind::Flow,
            AgentPlanSpec::Transform(_) => AgentKind::Transform,
            AgentPlanSpec::Mock(_) => AgentKind::Mock,
            AgentPlanSpec::Native(_) => AgentKind::Native,
            AgentPlanSpec::Mcp(_) => AgentKind::Mcp,
        }
    }
}

#[derive(Debug)]
pub enum AgentPlanSpec {
    Llm(LlmPlan),
    Command(CommandPlan),
    Http(HttpPlan),
    Flow(FlowRef),
    Transform(ValueTemplate),
    Mock(MockPlan),
    Native(NativePlan),
    Mcp(McpPlan),
}

/// A `kind: mcp` agent: one tool of one server, called with the input document as its
/// arguments (SPEC §6.4).
#[derive(Debug)]
pub struct McpPlan {
    pub server: Arc<McpServerPlan>,
    pub tool: String,
}

/// An MCP server as the runtime reaches it. Every agent naming one definition shares one
/// `Arc` of it, and the process shares one running server per [`McpServerPlan::key`].
#[derive(Debug)]
pub struct McpServerPlan {
    /// The name under `mcp_servers:`.
    pub name: String,
    pub transport: McpTransport,
    /// The allowlist; `"*"` allows every tool the server lists.
    pub tools: Vec<String>,
    pub approve: Vec<String>,
    pub no_approval: Vec<String>,
    /// Whether the server's annotations count (`trust: trusted`).
    pub trusted: bool,
    /// Tools safe to call again after a crash cut a call.
    pub idempotent: Vec<String>,
    /// Per call, when the step, its agent and the flow's `defaults` set none.
    pub timeout: Option<Duration>,
    /// The longest a call may take, progress notifications or not.
    pub max_time: Option<Duration>,
    /// The largest result kept of a call.
    pub max_result_bytes: u64,
    /// What makes two definitions one server: the transport with its settings (secrets as
    /// written, unresolved), and the flow file's directory for a stdio server.
    pub key: String,
}

impl McpServerPlan {
    /// Whether `tool` is in the allowlist.
    pub fn allows(&self, tool: &str) -> bool {
        self.tools.iter().any(|t| t == "*" || t == tool)
    }
}

/// How an MCP server is reached.
#[derive(Debug, Clone, PartialEq)]
pub enum McpTransport {
    /// A program started over stdio, in `dir` (the flow file's directory), with only `env`
    /// (values may be secret references) and `PATH`, `HOME`, `LANG`, `TMPDIR`.
    Stdio {
        argv: Vec<String>,
        dir: std::path::PathBuf,
        env: Vec<(String, String)>,
    },
    /// Streamable HTTP; header values may be secret references.
    Http {
        url: String,
        headers: Vec<(String, String)>,
    },
}

/// A `native` agent: the application's own Rust code, looked up by name in the engine's
/// [`crate::agents::native::Natives`] when a run starts.
#[derive(Debug)]
pub struct NativePlan {
    /// The name it is registered under.
    pub function: String,
    /// Where the flow defines it (`flow.yaml:12:5`), for the error when nothing is registered
    /// under that name.
    pub at: String,
}

#[derive(Debug)]
pub struct ProviderPlan {
    pub name: String,
    pub base_url: String,
    /// A secret reference (`${env:NAME}`), resolved at call time.
    pub api_key: Option<String>,
    pub headers: Vec<(String, String)>,
    pub max_concurrency: Option<u64>,
    /// The tokens a response without `usage` is counted as (`assume_tokens_per_call`).
    pub assume_tokens_per_call: Option<u64>,
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
    /// Model → (input, output) USD per million tokens.
    pub prices: IndexMap<String, (f64, f64)>,
    pub timeout: Option<Duration>,
    /// The structured-output form the provider was given; `None`: `json_schema`, falling
    /// back to `json_object` when the server refuses it.
    pub structured_output: Option<crate::model::StructuredOutput>,
}

#[derive(Debug)]
pub struct LlmPlan {
    pub provider: Arc<ProviderPlan>,
    pub model: String,
    pub system: Option<Template>,
    pub prompt: Option<Template>,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u64>,
    pub repair_attempts: u64,
    pub context_paths: Vec<Path>,
    pub message_mode: MessageMode,
    pub max_messages: Option<u64>,
    /// With `tools:`, the agent is an agent loop (SPEC §6.3).
    pub agent_loop: Option<LoopPlan>,
    /// `attach:`: the files sent with the user message (SPEC §6.5).
    pub attach: Option<Box<ValueTemplate>>,
    /// All attachments of one call at most, in bytes (default 20MiB).
    pub max_attach_bytes: u64,
}

/// `max_attach_bytes`' default: 20 MiB.
pub const DEFAULT_MAX_ATTACH_BYTES: u64 = 20 << 20;

/// An agent loop's bounds and tools.
#[derive(Debug)]
pub struct LoopPlan {
    /// In the order written; what the model is offered is those the capability ceiling
    /// allows.
    pub tools: Vec<ToolPlan>,
    /// Model turns at most (default 30).
    pub max_iterations: u64,
    /// Tool calls of one turn in flight at once (default 5).
    pub max_parallel_tools: usize,
    /// The tool whose result ends the loop and is its answer.
    pub until_tool: Option<String>,
    /// Tools whose calls wait for a human decision: agents' names, and MCP tools as
    /// `server.tool` or `server.*`.
    pub approve: Vec<String>,
    /// The MCP servers whose tools the loop offers, in the order written (SPEC §6.4).
    pub servers: Vec<LoopServerPlan>,
    /// `approve_expires`: how long an approval waits before it is settled (SPEC §15).
    pub approve_expires: Option<Duration>,
    /// `on_expire: reject`: an expired approval rejects the calls (the model is told)
    /// instead of failing the step with kind `timeout`.
    pub reject_on_expire: bool,
}

/// An MCP server's tools in an agent loop: every tool its allowlist lets through (a server
/// named in `tools:`) or one of them (`server.tool`), listed from the server (`tools/list`)
/// when the loop starts and offered as `<server>__<tool>` ([`mcp_tool_name`]).
#[derive(Debug)]
pub struct LoopServerPlan {
    pub server: Arc<McpServerPlan>,
    /// `server.tool`: that tool alone.
    pub only: Option<String>,
    /// Each call's: the server's `timeout`, else the flow's `defaults`.
    pub timeout: Duration,
    pub retry: RetryPolicy,
}

/// The most characters of a tool's name a model is offered (OpenAI's limit).
pub const MAX_TOOL_NAME: usize = 64;

/// The name a model is offered for tool `tool` of MCP server `server`: `<server>__<tool>`,
/// cut to [`MAX_TOOL_NAME`] characters.
pub fn mcp_tool_name(server: &str, tool: &str) -> String {
    format!("{server}__{tool}").chars().take(MAX_TOOL_NAME).collect()
}

impl LoopPlan {
    pub fn tool(&self, name: &str) -> Option<&ToolPlan> {
        self.tools.iter().find(|t| t.name == name)
    }
}

/// One tool: an agent of the flow, called with the model's arguments as its input document,
/// with its own `timeout`, `retry` and `idempotent` (from the agent, else the flow's
/// `defaults`).
#[derive(Debug)]
pub struct ToolPlan {
    pub name: String,
    /// The tool's `description`, else its agent's.
    pub description: Option<String>,
    /// The JSON Schema of the arguments: the agent's `input_schema`, else any object.
    pub parameters: Value,
    pub call: CallPlan,
}

#[derive(Debug)]
pub struct CommandPlan {
    pub run: Vec<Template>,
    /// Values may be secret references, resolved at call time.
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    pub max_output: u64,
    /// The `bundle:` patterns, relative to `flow_dir`; only `submit` reads them.
    pub bundle: Vec<String>,
    /// The directory of the flow file that defines the agent.
    pub flow_dir: PathBuf,
}

#[derive(Debug)]
pub struct HttpPlan {
    pub url: String,
    pub method: String,
    pub headers: Vec<(String, String)>,
    pub max_response: u64,
    /// `body:`; `None` sends the input document.
    pub body: Option<ValueTemplate>,
}

#[derive(Debug, Clone)]
pub struct MockPlan {
    pub returns: Option<ValueTemplate>,
    pub sequence: Vec<ValueTemplate>,
    pub latency: Option<Duration>,
    pub fail_times: u64,
    pub fail_rate: f64,
    pub seed: u64,
    /// The directory a mock file's `path` is relative to: the flow file's (a change file's
    /// mocks: the current directory).
    pub dir: std::path::PathBuf,
}
/// Agent changes resolved against a plan: for each flow (by index into `Plan::flows`),
/// agent name → what to use instead (`None`: removed). Made from a change file
/// (`--agent-change`, `runtime::changes`) or a flow test's mocks; the runtime calls agents
/// through them, and `agents::secrets` leaves out of its check the agents they take away.
#[derive(Debug, Default)]
pub struct AgentChanges {
    pub per_flow: HashMap<usize, HashMap<String, Option<Arc<AgentPlan>>>>,
    /// Why removed agents are gone, for the error (flow tests: "not mocked").
    pub removed_reason: Option<String>,
    /// Replacements stand in for the agents they replace (flow test mocks): the capability
    /// check uses the replaced agent's kind, so mocking an agent never changes what a flow
    /// may call. Otherwise (`--agent-change`) the replacement is checked as itself.
    pub stand_ins: bool,
    /// The change file these come from, as canonical JSON: what a root run records, so that
    /// a resume applies the same changes without the file. `None` when there is no file.
    pub source: Option<Value>,
}

pub mod draw;
pub mod svg;
