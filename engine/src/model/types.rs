//! Model types. See the module documentation of [`crate::model`].
#![allow(clippy::large_enum_variant)]

use std::borrow::Cow;
use std::time::Duration;

use indexmap::IndexMap;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

use crate::source::{FileId, Span};
use crate::syntax::Node;

/// A value with the span of its text.
#[derive(Clone, Debug, PartialEq)]
pub struct Sp<T> {
    pub value: T,
    pub span: Span,
}

impl<T> Sp<T> {
    pub fn new(value: T, span: Span) -> Self {
        Sp { value, span }
    }
}

impl<T: JsonSchema> JsonSchema for Sp<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }
    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }
    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
}

/// Any YAML value, kept as spanned nodes (JSON Schemas, value templates, test data).
#[derive(Clone, Debug, PartialEq)]
pub struct Any(pub Node);

impl JsonSchema for Any {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Any".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!(true)
    }
}

/// A duration written `250ms`, `20s`, `5m`, `2h`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dur(pub Duration);

impl JsonSchema for Dur {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": "^[0-9]+(\\.[0-9]+)?(ms|s|m|h)$",
            "description": "a duration: `250ms`, `20s`, `5m`, `2h`"
        })
    }
}

/// A duration as a flow writes it: `250ms`, `20s`, `5m`, `2h` (whole milliseconds), for
/// messages that name a flow's timeouts.
pub fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms > 0 && ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms > 0 && ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// A size in bytes written `512KiB`, `8MiB`, or a plain integer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Size(pub u64);

impl JsonSchema for Size {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Size".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": "^[0-9]+(B|KiB|MiB|GiB|KB|MB|GB)?$"}
            ],
            "description": "a size: `512KiB`, `8MiB`, or a number of bytes"
        })
    }
}

/// A flow file.
#[derive(Clone, Debug, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    title = "Switchyard flow",
    description = "A Switchyard flow file (see SPEC §2)"
)]
pub struct Flow {
    #[serde(skip)]
    pub file: FileId,
    /// The flow's name: `[a-z][a-z0-9_-]*`.
    #[serde(rename = "flow")]
    #[schemars(pattern(r"^[a-z][a-z0-9_-]*$"))]
    pub name: Sp<String>,
    pub description: Option<String>,
    /// The run input: its JSON Schema.
    pub input: Option<FlowInput>,
    /// The run output: its JSON Schema and the JSONPath choosing it.
    pub output: Option<FlowOutput>,
    /// Files whose `agents:` and `providers:` are merged in.
    #[serde(default)]
    pub imports: Vec<Sp<String>>,
    /// LLM endpoints.
    #[serde(default)]
    pub providers: IndexMap<String, Provider>,
    /// MCP servers whose tools `mcp` agents (and agent loops) call (SPEC §6.4).
    #[serde(default)]
    pub mcp_servers: IndexMap<String, McpServer>,
    /// Named agents.
    #[serde(default)]
    pub agents: IndexMap<String, Agent>,
    /// Names under `agents:` whose definition could not be read (an invalid `kind`, not a
    /// mapping). Their error is reported where they are; steps naming them are not told again
    /// that the agent is unknown.
    #[serde(skip)]
    pub unreadable_agents: Vec<String>,
    /// `timeout`, `retry`, `idempotent` for every step that does not set them.
    pub defaults: Option<Defaults>,
    pub limits: Option<Limits>,
    /// Agent kinds this flow and everything it calls may use; default all.
    pub allow: Option<Vec<Sp<AgentKind>>>,
    /// Hosts `http` agents may call; default any.
    pub allow_hosts: Option<Vec<Sp<String>>>,
    /// The first step; default the first key under `steps`.
    pub start: Option<Sp<String>>,
    /// Step id → step, in the order written.
    pub steps: IndexMap<String, Step>,
    /// Flow tests, run by `switchyard test`.
    #[serde(default)]
    pub tests: Vec<FlowTest>,
    /// The span of the whole document (for problems of the file as a whole).
    #[serde(skip)]
    pub span: Span,
}

#[derive(Clone, Debug, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FlowInput {
    /// JSON Schema of the run input (inline, or a path relative to this file).
    pub schema: Option<SchemaRef>,
}

#[derive(Clone, Debug, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FlowOutput {
    /// JSON Schema of the run output (inline, or a path relative to this file).
    pub schema: Option<SchemaRef>,
    /// JSONPath over the final payload choosing the run's output.
    pub select: Option<Sp<String>>,
}

/// A JSON Schema, inline or as a path to a JSON or YAML file relative to the flow.
#[derive(Clone, Debug, JsonSchema)]
#[serde(untagged)]
pub enum SchemaRef {
    Path(Sp<String>),
    Inline(Any),
}

#[derive(Clone, Debug, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    #[serde(skip)]
    pub name: Sp<String>,
    /// The OpenAI-compatible endpoint, e.g. `http://127.0.0.1:8000/v1`.
    pub base_url: Sp<String>,
    /// A secret reference: `${env:NAME}`.
    pub api_key: Option<Sp<String>>,
    /// Extra request headers (values may be secret references).
    #[serde(default)]
    pub headers: IndexMap<String, Sp<String>>,
    pub max_concurrency: Option<Sp<u64>>,
    /// The tokens a response without `usage` is counted as, priced with `prices`. Unset,
    /// such a response's cost is unknown, and a run with a cost budget stops at it.
    pub assume_tokens_per_call: Option<Sp<u64>>,
    pub rate_limit: Option<RateLimit>,
    /// Model name → prices in USD per million tokens.
    #[serde(default)]
    pub prices: IndexMap<String, Price>,
    /// Per-request timeout.
    pub timeout: Option<Sp<Dur>>,
    /// How a `result_schema` is asked for. Unset: `json_schema`, falling back to
    /// `json_object` once when the server refuses that form.
    pub structured_output: Option<Sp<StructuredOutput>>,
}

/// An MCP server (SPEC §6.4): a program started over stdio (`command`) or a Streamable HTTP
/// endpoint (`url`), and the tools of it a flow may call.
#[derive(Clone, Debug, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    #[serde(skip)]
    pub name: Sp<String>,
    /// The program and its arguments, started over stdio; never through a shell. A path is
    /// relative to the flow file's directory.
    #[serde(default)]
    pub command: Vec<Sp<String>>,
    /// A Streamable HTTP endpoint, e.g. `http://127.0.0.1:8931/mcp`.
    pub url: Option<Sp<String>>,
    /// Environment of a stdio server (values may be secret references); only these and
    /// `PATH`, `HOME`, `LANG`, `TMPDIR` reach it.
    #[serde(default)]
    pub env: IndexMap<String, Sp<String>>,
    /// Request headers of an HTTP server (values may be secret references).
    #[serde(default)]
    pub headers: IndexMap<String, Sp<String>>,
    /// The tools a flow may call: names, or `"*"` for every tool the server lists.
    pub tools: Vec<Sp<String>>,
    /// Tools whose calls wait for a human decision.
    #[serde(default)]
    pub approve: Vec<Sp<String>>,
    /// Tools marked destructive by a trusted server that need no approval.
    #[serde(default)]
    pub no_approval: Vec<Sp<String>>,
    /// Whether the server's annotations (read-only, destructive, idempotent) count; default
    /// `untrusted`.
    pub trust: Option<Sp<Trust>>,
    /// Tools safe to call again after a crash cut a call.
    #[serde(default)]
    pub idempotent: Vec<Sp<String>>,
    /// Per call; progress notifications extend it, up to `max_time`.
    pub timeout: Option<Sp<Dur>>,
    /// The longest a call may take, progress or not.
    pub max_time: Option<Sp<Dur>>,
    /// The largest result kept of a call (its content blocks); default 1MiB.
    pub max_result_bytes: Option<Sp<Size>>,
    /// The span of the whole definition.
    #[serde(skip)]
    pub span: Span,
}

impl McpServer {
    /// Whether `tool` is in the allowlist (`"*"` allows every tool).
    pub fn allows(&self, tool: &str) -> bool {
        self.tools.iter().any(|t| t.value == "*" || t.value == tool)
    }
}

/// Whether an MCP server's tool annotations are believed.
#[derive(Clone, Debug, PartialEq, Eq, Copy, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    Trusted,
    Untrusted,
}

/// How an `llm` call with a `result_schema` asks the provider for structured output.
#[derive(Clone, Debug, PartialEq, Eq, Copy, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutput {
    /// `response_format: {type: json_schema, json_schema: {name, schema}}` (OpenAI, vLLM,
    /// llama.cpp's server).
    JsonSchema,
    /// `response_format: {type: json_object, schema}` with the schema in the system message
    /// (llama-cpp-python's server, JSON mode elsewhere).
    JsonObject,
    /// No `response_format`: the schema is only in the system message.
    Prompt,
}

impl StructuredOutput {
    pub fn as_str(self) -> &'static str {
        match self {
            StructuredOutput::JsonSchema => "json_schema",
            StructuredOutput::JsonObject => "json_object",
            StructuredOutput::Prompt => "prompt",
        }
    }
}

#[derive(Clone, Debug, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub requests_per_minute: Option<Sp<u64>>,
    pub tokens_per_minute: Option<Sp<u64>>,
}

#[derive(Clone, Debug, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: Sp<f64>,
    pub output_per_mtok: Sp<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentKind {
    Llm,
    Command,
    Http,
    Flow,
    Transform,
    Mock,
    Native,
    Mcp,
}

impl AgentKind {
    pub const ALL: [AgentKind; 8] = [
        AgentKind::Llm,
        AgentKind::Command,
        AgentKind::Http,
        AgentKind::Flow,
        AgentKind::Transform,
        AgentKind::Mock,
        AgentKind::Native,
        AgentKind::Mcp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AgentKind::Llm => "llm",
            AgentKind::Command => "command",
            AgentKind::Http => "http",
            AgentKind::Flow => "flow",
            AgentKind::Transform => "transform",
            AgentKind::Mock => "mock",
            AgentKind::Native => "native",
            AgentKind::Mcp => "mcp",
        }
    }

    pub fn parse(s: &str) -> Option<AgentKind> {
        AgentKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether steps calling this kind are idempotent unless they say otherwise (SPEC §3).
    /// A `native` agent is the application's own code, which may have effects: not. An `mcp`
    /// tool is idempotent only as its server's definition says (SPEC §6.4).
    pub fn idempotent_by_default(self) -> bool {
        !matches!(
            self,
            AgentKind::Command | AgentKind::Http | AgentKind::Native | AgentKind::Mcp
        )
    }
}

/// A named or inline agent definition.
#[derive(Clone, Debug, JsonSchema)]
pub struct Agent {
    /// The name under `agents:` (for inline agents: the step id).
    #[serde(skip)]
    pub name: Sp<String>,
    #[serde(skip)]
    pub kind: Sp<AgentKind>,
    #[serde(flatten)]
    pub spec: AgentSpec,
    #[serde(flatten)]
    pub common: AgentCommon,
    /// The span of the whole definition.
    #[serde(skip)]
    pub span: Span,
}

/// Fields every agent kind may have.
#[derive(Clone, Debug, Default, JsonSchema)]
pub struct AgentCommon {
    pub description: Option<String>,
    /// JSON Schema of the agent's input document, checked before each call; for a tool of
    /// an agent loop, its parameters.
    pub input_schema: Option<SchemaRef>,
    /// JSON Schema the result must satisfy (inline, or a path).
    pub result_schema: Option<SchemaRef>,
    /// Default per-attempt timeout for steps calling this agent.
    pub timeout: Option<Sp<Dur>>,
    /// Default retry policy for steps calling this agent.
    pub retry: Option<Retry>,
    /// Default idempotence for steps calling this agent.
    pub idempotent: Option<Sp<bool>>,
}

#[derive(Clone, Debug, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AgentSpec {
    Llm(LlmAgent),
    Command(CommandAgent),
    Http(HttpAgent),
    Flow(FlowAgent),
    Transform(TransformAgent),
    Mock(MockAgent),
    Native(NativeAgent),
    Mcp(McpAgent),
}

impl AgentSpec {
    pub fn kind(&self) -> AgentKind {
        match self {
            AgentSpec::Llm(_) => AgentKind::Llm,
            AgentSpec::Command(_) => AgentKind::Command,
            AgentSpec::Http(_) => AgentKind::Http,
            AgentSpec::Flow(_) => AgentKind::Flow,
            AgentSpec::Transform(_) => AgentKind::Transform,
            AgentSpec::Mock(_) => AgentKind::Mock,
            AgentSpec::Native(_) => AgentKind::Native,
            AgentSpec::Mcp(_) => AgentKind::Mcp,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Copy, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MessageMode {
    None,
    All,
    Latest,
    Bookend,
}

/// What an agent loop's approval that expired without a decision does (`on_expire:`).
#[derive(Clone, Debug, PartialEq, Eq, Copy, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnExpire {
    /// The step fails with kind `timeout`.
    Fail,
    /// The calls are rejected: the model is told, and the loop goes on.
    Reject,
}

#[derive(Clone, Debug, JsonSchema)]
pub struct LlmAgent {
    /// A name from `providers`.
    pub provider: Sp<String>,
    pub model: Sp<String>,
    /// System message template.
    pub system: Option<Sp<String>>,
    /// User message template; sees `input` (the agent's input document) and `message`.
    pub prompt: Option<Sp<String>>,
    pub temperature: Option<Sp<f64>>,
    pub max_tokens: Option<Sp<u64>>,
    /// Re-asks when the answer is not valid JSON or violates `result_schema`; default 1.
    pub repair_attempts: Option<Sp<u64>>,
    /// Payload paths rendered as a context message before the task.
    #[serde(default)]
    pub context_paths: Vec<Sp<String>>,
    pub message_mode: Option<Sp<MessageMode>>,
    pub max_messages: Option<Sp<u64>>,
    /// Agents of the flow the model may call as tools, which makes the agent an agent loop
    /// (SPEC §6.3), and MCP servers or their tools (`repo`, `repo.git_log`; SPEC §6.4): a
    /// list of names, or a map name → `{description}`.
    #[serde(default)]
    pub tools: Tools,
    /// Model turns at most; default 30. Reaching it fails the step with kind `limit`.
    #[schemars(range(min = 1, max = 100_000))]
    pub max_iterations: Option<Sp<u64>>,
    /// Tool calls of one turn in flight at once; default 5.
    #[schemars(range(min = 1, max = 100_000))]
    pub max_parallel_tools: Option<Sp<u64>>,
    /// The loop ends when this tool's result lands; that result is the answer.
    pub until_tool: Option<Sp<String>>,
    /// Tools whose calls wait for a human decision first; an MCP server's as `repo.git_commit`
    /// or `repo.*`.
    #[serde(default)]
    pub approve: Vec<Sp<String>>,
    /// How long an approval waits for a decision (SPEC §15), e.g. `72h`; unset, it waits
    /// until answered.
    pub approve_expires: Option<Sp<Dur>>,
    /// What an approval that expired without a decision does: `fail` (the default) fails the
    /// step with kind `timeout`; `reject` rejects the calls and tells the model so.
    pub on_expire: Option<Sp<OnExpire>>,
    /// Files sent with the user message (SPEC §6.5): a value template over `input` that gives
    /// a file reference or a list of them (`=input.scans`); raster images become image parts,
    /// text files text parts; `null` sends none.
    pub attach: Option<Any>,
    /// The most bytes all attachments of one call may have; default 20MiB. Over it the step
    /// fails with kind `limit` before any request.
    pub max_attach_bytes: Option<Sp<Size>>,
}

/// An agent loop's tools, in the order written.
#[derive(Clone, Debug, Default)]
pub struct Tools {
    pub list: Vec<Tool>,
    /// The span of the whole `tools:` value (none when absent).
    pub span: Option<Span>,
}

/// One tool of an agent loop: an agent of the flow, by name.
#[derive(Clone, Debug)]
pub struct Tool {
    pub name: Sp<String>,
    /// What the model is told the tool does, instead of the agent's own `description`.
    pub description: Option<Sp<String>>,
}

impl JsonSchema for Tools {
    fn schema_name() -> Cow<'static, str> {
        "Tools".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "agents of this flow the model may call, and MCP servers (`repo`: every tool its allowlist lets through) or their tools (`repo.git_log`), offered as `<server>__<tool>`: a list of names, or a map name → {description}",
            "oneOf": [
                {"type": "array", "items": {"type": "string"}},
                {
                    "type": "object",
                    "additionalProperties": {
                        "oneOf": [
                            {"type": "null"},
                            {
                                "type": "object",
                                "properties": {"description": {"type": "string"}},
                                "additionalProperties": false
                            }
                        ]
                    }
                }
            ]
        })
    }
}

#[derive(Clone, Debug, JsonSchema)]
pub struct CommandAgent {
    /// The program and its arguments; never run through a shell. Arguments are templates.
    pub run: Vec<Sp<String>>,
    /// Environment variables (values may be secret references); only these and `PATH` are set.
    #[serde(default)]
    pub env: IndexMap<String, Sp<String>>,
    /// Working directory, relative to the flow file.
    pub cwd: Option<Sp<String>>,
    /// Largest stdout accepted; default 16MiB.
    pub max_output: Option<Sp<Size>>,
    /// Files the program needs that it does not name by a literal argument (a script's sibling
    /// modules, data), shipped to workers in the flow bundle: glob patterns relative to the
    /// flow file (`tools/*.py`, `lib/**/*.py`; a directory ships all its files).
    #[serde(default)]
    pub bundle: Vec<Sp<String>>,
}

#[derive(Clone, Debug, JsonSchema)]
pub struct HttpAgent {
    pub url: Sp<String>,
    /// Default `POST`.
    pub method: Option<Sp<String>>,
    /// Header values may be secret references.
    #[serde(default)]
    pub headers: IndexMap<String, Sp<String>>,
    /// Largest JSON response body accepted; default 16MiB. A body that is not JSON becomes a
    /// file, bounded by `limits.max_file_bytes`.
    pub max_response: Option<Sp<Size>>,
    /// What is sent: a value template over `input` (default: the input document as JSON). A
    /// file reference (`=input.scan`) sends the file's bytes, of its media type.
    pub body: Option<Any>,
}

#[derive(Clone, Debug, JsonSchema)]
pub struct FlowAgent {
    /// Another flow file, relative to this one.
    pub path: Option<Sp<String>>,
    /// An inline flow: `steps:` (with optional `start`, `agents`, `input`, `output`, ...).
    #[serde(flatten)]
    #[schemars(skip)]
    pub inline: Option<Box<Flow>>,
}

#[derive(Clone, Debug, JsonSchema)]
pub struct TransformAgent {
    /// A value template over `input`: strings starting with `=` are expressions.
    pub result: Any,
}

/// An agent implemented in Rust by the application that embeds Switchyard, registered under
/// a name (`switchyard::Natives::register`).
#[derive(Clone, Debug, JsonSchema)]
pub struct NativeAgent {
    /// The name the application registered the agent under; default the agent's own name.
    pub function: Option<Sp<String>>,
}

/// One tool of an MCP server, called with the step's input document as its arguments.
#[derive(Clone, Debug, JsonSchema)]
pub struct McpAgent {
    /// A name from `mcp_servers`.
    pub server: Sp<String>,
    /// The tool: one of the server's `tools:`.
    pub tool: Sp<String>,
}

#[derive(Clone, Debug, JsonSchema)]
pub struct MockAgent {
    /// A value template returned by every call.
    pub returns: Option<Any>,
    /// Value templates returned call by call (the last repeats).
    pub sequence: Option<Vec<Any>>,
    pub latency: Option<Sp<Dur>>,
    /// The first N calls fail with kind `agent`.
    pub fail_times: Option<Sp<u64>>,
    /// The fraction of calls that fail with kind `agent`.
    pub fail_rate: Option<Sp<f64>>,
    pub seed: Option<Sp<u64>>,
}

#[derive(Clone, Debug, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    pub timeout: Option<Sp<Dur>>,
    pub retry: Option<Retry>,
    pub idempotent: Option<Sp<bool>>,
}

#[derive(Clone, Debug, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Step executions per run, iterations included; default 10000.
    pub max_steps: Option<Sp<u64>>,
    /// Deepest nesting of `flow` agents; default 3.
    pub max_depth: Option<Sp<u64>>,
    /// Per run.
    pub timeout: Option<Sp<Dur>>,
    /// Default 8MiB.
    pub max_payload_bytes: Option<Sp<Size>>,
    pub max_cost_usd: Option<Sp<f64>>,
    /// The largest file a step may make or read through `file()`; default 64MiB.
    pub max_file_bytes: Option<Sp<Size>>,
    /// All the bytes of the files a run makes (its child runs' included); no default.
    pub max_run_file_bytes: Option<Sp<Size>>,
}

#[derive(Clone, Debug, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    /// Tries in all, counting the first; default 1.
    pub attempts: Option<Sp<u64>>,
    /// The first wait; default 1s.
    pub backoff: Option<Sp<Dur>>,
    /// Growth of the wait per attempt; default 2.
    pub factor: Option<Sp<f64>>,
    pub max_backoff: Option<Sp<Dur>>,
    /// Random spread of each wait: `true` (±50%), `false`, or a fraction 0..=1.
    pub jitter: Option<Sp<Jitter>>,
    /// Error kinds retried; default `[timeout, agent, rate_limited]`.
    pub on: Option<Vec<Sp<String>>>,
    #[serde(skip)]
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, JsonSchema)]
#[serde(untagged)]
pub enum Jitter {
    Bool(bool),
    Fraction(f64),
}

/// One step: exactly one kind key, plus the fields every step may have.
#[derive(Clone, Debug, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Step {
    #[serde(skip)]
    pub id: Sp<String>,
    pub description: Option<String>,
    #[serde(flatten)]
    pub kind: StepKind,
    /// Edges, tried in order; a string is one success edge.
    pub next: Option<Next>,
    /// Per attempt; default from `defaults`, else `5m` for agent steps.
    pub timeout: Option<Sp<Dur>>,
    pub retry: Option<Retry>,
    pub idempotent: Option<Sp<bool>>,
    /// The task message handed to the agent (a template).
    pub message: Option<Sp<String>>,
    /// The agent sees and writes only this subtree.
    pub scope: Option<Sp<String>>,
    /// How the agent's input document is built.
    pub input: Option<InputSpec>,
    /// How the result comes back into the payload.
    pub output: Option<OutputSpec>,
    #[serde(flatten)]
    pub looping: LoopFields,
    /// `parallel`: branches in flight at once; `foreach`: iterations in flight.
    pub concurrency: Option<Sp<u64>>,
    /// `parallel`: cancel the other branches at the first failure.
    pub fail_fast: Option<Sp<bool>>,
    /// The span of the step's whole mapping.
    #[serde(skip)]
    pub span: Span,
}

/// The `foreach` and `while` modifiers of an agent step.
#[derive(Clone, Debug, Default, JsonSchema)]
pub struct LoopFields {
    /// JSONPath or `=expression` yielding the array to map over.
    pub foreach: Option<Sp<String>>,
    /// The item's name in expressions; default `item`.
    #[serde(rename = "as")]
    pub as_name: Option<Sp<String>>,
    /// Default 10000.
    pub max_items: Option<Sp<u64>>,
    /// Failed iterations tolerated: a count or a percentage (`5%`).
    pub tolerate: Option<Sp<Tolerate>>,
    /// JSONPath applied to each iteration's result.
    pub select: Option<Sp<String>>,
    /// `=expression` checked before every iteration.
    #[serde(rename = "while")]
    pub while_: Option<Sp<String>>,
    /// Required with `while`: 1..=100000.
    pub max_iterations: Option<Sp<u64>>,
    /// Whether `max_iterations` is written, read or not: one whose value is unreadable is
    /// reported as such, not again as missing.
    #[serde(skip)]
    pub max_iterations_written: bool,
    /// Wait between `while` iterations.
    pub delay: Option<Sp<Dur>>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerate {
    Count(u64),
    Percent(f64),
}

impl JsonSchema for Tolerate {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Tolerate".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?%$"}
            ],
            "description": "failed iterations tolerated: a count, or a percentage like `5%`"
        })
    }
}

#[derive(Clone, Debug, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Call a sub-agent: a name from `agents`, or an inline definition.
    Agent(AgentRef),
    /// Compute values without an agent: destination path → source.
    Set(Mappings),
    /// Several sub-agents at once: branch name → branch.
    Parallel(IndexMap<String, Branch>),
    /// Wait for a human decision.
    Interrupt(Interrupt),
    /// End the run as failed.
    Fail(FailSpec),
    /// End the run as succeeded.
    Succeed(SucceedSpec),
}

impl StepKind {
    pub fn name(&self) -> &'static str {
        match self {
            StepKind::Agent(_) => "agent",
            StepKind::Set(_) => "set",
            StepKind::Parallel(_) => "parallel",
            StepKind::Interrupt(_) => "interrupt",
            StepKind::Fail(_) => "fail",
            StepKind::Succeed(_) => "succeed",
        }
    }
}

#[derive(Clone, Debug, JsonSchema)]
#[serde(untagged)]
pub enum AgentRef {
    Named(Sp<String>),
    Inline(Box<Agent>),
}

#[derive(Clone, Debug, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Branch {
    #[serde(skip)]
    pub name: Sp<String>,
    pub agent: AgentRef,
    pub message: Option<Sp<String>>,
    pub scope: Option<Sp<String>>,
    pub input: Option<InputSpec>,
    pub output: Option<OutputSpec>,
    pub timeout: Option<Sp<Dur>>,
    pub retry: Option<Retry>,
    pub idempotent: Option<Sp<bool>>,
    #[serde(skip)]
    pub span: Span,
}

#[derive(Clone, Debug, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Interrupt {
    /// Template shown to the human; `input` is the step's input document.
    pub prompt: Option<Sp<String>>,
    /// JSON Schema the decision must satisfy.
    pub schema: Option<SchemaRef>,
    /// A decision after this fails the step with kind `timeout`.
    pub expires: Option<Sp<Dur>>,
}

#[derive(Clone, Debug, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FailSpec {
    /// Error kind; default `fail`.
    pub kind: Option<Sp<String>>,
    /// Template.
    pub message: Option<Sp<String>>,
}

#[derive(Clone, Debug, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SucceedSpec {}

/// A string is one success edge to that step.
#[derive(Clone, Debug, JsonSchema)]
#[serde(untagged)]
pub enum Next {
    One(Sp<String>),
    Edges(Vec<Edge>),
}

impl Next {
    /// The edges, the shorthand turned into one success edge.
    pub fn edges(&self) -> Cow<'_, [Edge]> {
        match self {
            Next::One(to) => Cow::Owned(vec![Edge {
                to: to.clone(),
                on: None,
                if_: None,
                errors: None,
                span: to.span,
            }]),
            Next::Edges(e) => Cow::Borrowed(e),
        }
    }
}

#[derive(Clone, Debug, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Edge {
    /// A step id, or `end`.
    pub to: Sp<String>,
    /// Default `success`.
    pub on: Option<Sp<EdgeOn>>,
    /// A CEL expression that must return a boolean.
    #[serde(rename = "if")]
    pub if_: Option<Sp<String>>,
    /// Only these error kinds (with `on: failure` or `always`).
    pub errors: Option<Vec<Sp<String>>>,
    #[serde(skip)]
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EdgeOn {
    Success,
    Failure,
    Always,
}

/// How an agent's input document is built.
#[derive(Clone, Debug, JsonSchema)]
#[serde(untagged)]
pub enum InputSpec {
    /// `"*"`: the whole payload.
    #[schemars(with = "AllMarker")]
    All(Span),
    /// A downstream filter: only these paths, structure kept.
    Paths(Vec<Sp<String>>),
    /// A new document: destination path → source.
    Map(Mappings),
}

/// How a result comes back into the payload.
#[derive(Clone, Debug, JsonSchema)]
#[serde(untagged)]
pub enum OutputSpec {
    /// `"*"`: deep-merge the result into the payload.
    #[schemars(with = "AllMarker")]
    All(Span),
    /// An upstream allowlist: only these paths may come back.
    Paths(Vec<Sp<String>>),
    /// Destination path in the payload → source in the result.
    Map(Mappings),
}

#[derive(JsonSchema)]
#[allow(dead_code)]
enum AllMarker {
    #[serde(rename = "*")]
    All,
}

/// Where a mapped value comes from.
#[derive(Clone, Debug, JsonSchema)]
#[serde(untagged)]
pub enum Source {
    /// `$...` (JSONPath) or `=...` (expression).
    Text(Sp<String>),
    /// A JSONPath with a default for when it matches nothing.
    WithDefault { path: Sp<String>, default: Any },
    /// A literal JSON value.
    Literal { value: Any },
}

/// Destination path → source, in the order written, with the destinations' spans.
#[derive(Clone, Debug, Default)]
pub struct Mappings(pub Vec<(Sp<String>, Source)>);

impl JsonSchema for Mappings {
    fn schema_name() -> Cow<'static, str> {
        "Mappings".into()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let source = generator.subschema_for::<Source>();
        json_schema!({
            "type": "object",
            "description": "destination JSONPath (singular) → source",
            "propertyNames": {"pattern": "^\\$"},
            "additionalProperties": source
        })
    }
}

#[derive(Clone, Debug, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FlowTest {
    pub name: Sp<String>,
    /// The run input.
    pub input: Option<Any>,
    pub context: Option<Any>,
    /// The run's `now` (RFC 3339, at most microseconds: `2026-03-01T09:00:00Z`); default the
    /// time the test starts.
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub now: Option<Sp<crate::expr::time::Timestamp>>,
    /// Agent name → mock fields (`returns`, `sequence`, `latency`, `fail_times`).
    #[serde(default)]
    pub mocks: IndexMap<String, MockAgent>,
    pub expect: Expect,
    #[serde(skip)]
    pub span: Span,
}

#[derive(Clone, Debug, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    pub status: Option<Sp<RunStatusExpect>>,
    /// The top-level steps visited, in order.
    pub path: Option<Vec<Sp<String>>>,
    /// Subset match against the run's output.
    pub output: Option<Any>,
    /// Subset match against the run's error (`kind`, `message`).
    pub error: Option<Any>,
    /// Agent name → number of calls.
    #[serde(default)]
    pub calls: IndexMap<String, Sp<u64>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatusExpect {
    Succeeded,
    Failed,
    Interrupted,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_in_flow_units() {
        assert_eq!(fmt_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(fmt_duration(Duration::from_secs(20)), "20s");
        assert_eq!(fmt_duration(Duration::from_secs(300)), "5m");
        assert_eq!(fmt_duration(Duration::from_secs(7200)), "2h");
    }
}
