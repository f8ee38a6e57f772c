//! Lowering YAML nodes into the model: every shape problem becomes a diagnostic, and whatever
//! could be read is kept, so that later phases still check the rest of the file.

use std::time::Duration;

use indexmap::IndexMap;

use crate::model::*;
use crate::diag::{Diagnostic, article, codes, did_you_mean};
use crate::source::Span;
use crate::syntax::{Key, Node, Value};

/// A file of shared definitions, named in `imports:`.
#[derive(Clone, Debug, Default)]
pub struct Library {
    pub imports: Vec<Sp<String>>,
    pub providers: IndexMap<String, Provider>,
    pub agents: IndexMap<String, Agent>,
    /// See [`Flow::unreadable_agents`].
    pub unreadable_agents: Vec<String>,
}

/// The state of one lowering: the source text (for spans inside strings), the diagnostics, and
/// the steps kept with a placeholder kind.
pub struct Cx<'a> {
    pub source: &'a str,
    pub diags: Vec<Diagnostic>,
    /// The id spans of steps whose kind could not be read (no kind key, an agent that could
    /// not be lowered, not a mapping at all). Each has an error in `diags` saying why; the
    /// step stays in the model with [`placeholder_kind`], so that edges to it resolve and the
    /// steps after it stay reachable. Lint skips its kind-specific rules.
    pub malformed_steps: Vec<Span>,
}

impl<'a> Cx<'a> {
    pub fn new(source: &'a str) -> Self {
        Cx {
            source,
            diags: Vec::new(),
            malformed_steps: Vec::new(),
        }
    }

    fn push(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }
}

const FLOW_KEYS: &[&str] = &[
    "flow",
    "description",
    "input",
    "output",
    "imports",
    "providers",
    "agents",
    "defaults",
    "limits",
    "allow",
    "allow_hosts",
    "start",
    "steps",
    "tests",
];
const INLINE_FLOW_KEYS: &[&str] = &[
    "description",
    "input",
    "output",
    "agents",
    "defaults",
    "limits",
    "allow",
    "allow_hosts",
    "start",
    "steps",
];
const LIBRARY_KEYS: &[&str] = &["description", "imports", "providers", "agents"];

/// Lowers a flow file. `None` only when the document is not a mapping at all.
pub fn flow(cx: &mut Cx, node: &Node) -> Option<Flow> {
    if matches!(node.value, Value::Null) {
        cx.push(
            Diagnostic::new(&codes::MISSING_KEY, node.span, "empty flow file")
                .help("a flow needs at least `flow:` (its name) and `steps:`"),
        );
        return None;
    }
    let m = map(cx, node, "a flow file")?;
    check_keys(cx, m, "a flow file", FLOW_KEYS);
    let name = match node.get("flow") {
        Some(n) => string(cx, n).inspect(|name| check_flow_name(cx, name)),
        None => {
            cx.push(
                Diagnostic::new(
                    &codes::MISSING_KEY,
                    first_line(node),
                    "missing `flow:`, the flow's name",
                )
                .help("add `flow: my-flow` at the top of the file"),
            );
            None
        }
    };
    let name = name.unwrap_or_else(|| Sp::new(String::new(), node.span));
    Some(flow_body(cx, node, name, true))
}

/// Lowers the body of a flow: everything but `flow:`. Shared by files and inline `flow` agents.
fn flow_body(cx: &mut Cx, node: &Node, name: Sp<String>, top: bool) -> Flow {
    let steps = match node.get("steps") {
        Some(n) => steps(cx, n),
        None => {
            cx.push(
                Diagnostic::new(&codes::MISSING_KEY, first_line(node), "missing `steps:`")
                    .help("a flow needs at least one step under `steps:`"),
            );
            IndexMap::new()
        }
    };
    let tests = if top {
        node.get("tests")
            .map(|n| list(cx, n, flow_test))
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let (agents, unreadable_agents) = agents_of(cx, node);
    Flow {
        file: node.file(),
        name,
        description: node
            .get("description")
            .and_then(|n| string(cx, n))
            .map(|s| s.value),
        input: node.get("input").and_then(|n| flow_input(cx, n)),
        output: node.get("output").and_then(|n| flow_output(cx, n)),
        imports: node
            .get("imports")
            .map(|n| string_list(cx, n))
            .unwrap_or_default(),
        providers: node
            .get("providers")
            .map(|n| providers(cx, n))
            .unwrap_or_default(),
        agents,
        unreadable_agents,
        defaults: node.get("defaults").and_then(|n| defaults(cx, n)),
        limits: node.get("limits").and_then(|n| limits(cx, n)),
        allow: node.get("allow").map(|n| list(cx, n, agent_kind)),
        allow_hosts: node.get("allow_hosts").map(|n| string_list(cx, n)),
        start: node.get("start").and_then(|n| string(cx, n)),
        steps,
        tests,
        span: node.span,
    }
}

/// Lowers an imported file of shared agents and providers.
pub fn library(cx: &mut Cx, node: &Node) -> Library {
    if matches!(node.value, Value::Null) {
        return Library::default();
    }
    let Some(m) = map(cx, node, "an imported file") else {
        return Library::default();
    };
    check_keys(cx, m, "an imported file", LIBRARY_KEYS);
    let (agents, unreadable_agents) = agents_of(cx, node);
    Library {
        imports: node
            .get("imports")
            .map(|n| string_list(cx, n))
            .unwrap_or_default(),
        providers: node
            .get("providers")
            .map(|n| providers(cx, n))
            .unwrap_or_default(),
        agents,
        unreadable_agents,
    }
}

fn first_line(node: &Node) -> Span {
    Span::new(node.span.file, node.span.start as usize, node.span.start as usize)
}

fn check_flow_name(cx: &mut Cx, name: &Sp<String>) {
    let s = &name.value;
    let ok = s.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !ok {
        cx.push(
            Diagnostic::new(
                &codes::INVALID_IDENTIFIER,
                name.span,
                format!("invalid flow name `{s}`"),
            )
            .label("not `[a-z][a-z0-9_-]*`")
            .help(format!(
                "flow names are lower case letters, digits, `_` and `-`, starting with a letter: `{}`",
                suggest_ident(s, true)
            )),
        );
    }
}

/// [`is_ident`] as a regular expression, for the JSON Schema.
pub const IDENT_PATTERN: &str = "^[a-z][a-z0-9_]*$";

/// Whether `s` is a step or agent identifier: `[a-z][a-z0-9_]*`.
pub fn is_ident(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn suggest_ident(s: &str, allow_hyphen: bool) -> String {
    let mut out: String = s
        .chars()
        .map(|c| match c {
            'A'..='Z' => c.to_ascii_lowercase(),
            'a'..='z' | '0'..='9' | '_' => c,
            '-' if allow_hyphen => '-',
            _ => '_',
        })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_lowercase()) {
        out.insert(0, 'x');
        out.insert(1, '_');
    }
    out
}

/// Checks a step, agent, provider or branch name.
fn check_ident(cx: &mut Cx, what: &str, key: &Key) {
    if key.name == "end" && what == "step" {
        cx.push(
            Diagnostic::new(
                &codes::RESERVED_IDENTIFIER,
                key.span,
                "`end` is reserved and cannot be a step id",
            )
            .label("reserved")
            .help("`to: end` finishes the run; name this step something else, e.g. `finish`"),
        );
    } else if !is_ident(&key.name) {
        let fix = suggest_ident(&key.name, false);
        let why = if key.name.contains('-') {
            "a hyphen would read as subtraction in expressions".to_string()
        } else {
            "identifiers are `[a-z][a-z0-9_]*`".to_string()
        };
        cx.push(
            Diagnostic::new(
                &codes::INVALID_IDENTIFIER,
                key.span,
                format!("invalid {what} id `{}`", key.name),
            )
            .label(why)
            .help(format!("rename it to `{fix}`")),
        );
    }
}

// ----- generic readers -------------------------------------------------------------------------

fn type_error(cx: &mut Cx, node: &Node, expected: &str) {
    cx.push(
        Diagnostic::new(
            &codes::INVALID_TYPE,
            node.span,
            format!("expected {expected}, found {}", node.type_name()),
        )
        .label(format!("expected {expected}")),
    );
}

fn map<'n>(cx: &mut Cx, node: &'n Node, what: &str) -> Option<&'n [(Key, Node)]> {
    match &node.value {
        Value::Map(m) => Some(m),
        _ => {
            cx.push(
                Diagnostic::new(
                    &codes::INVALID_TYPE,
                    node.span,
                    format!("expected {what} to be a mapping, found {}", node.type_name()),
                )
                .label("expected a mapping"),
            );
            None
        }
    }
}

/// Reports keys of `m` that are not in `valid`, with "did you mean" and the valid list.
fn check_keys(cx: &mut Cx, m: &[(Key, Node)], what: &str, valid: &[&str]) {
    for (k, _) in m {
        if !valid.contains(&k.name.as_str()) {
            unknown_key(cx, k, what, valid);
        }
    }
}

fn unknown_key(cx: &mut Cx, k: &Key, what: &str, valid: &[&str]) {
    let list = valid
        .iter()
        .map(|v| format!("`{v}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let help = match did_you_mean(&k.name, valid.iter().copied()) {
        Some(dym) => format!("{dym} valid keys are: {list}"),
        None => format!("valid keys are: {list}"),
    };
    cx.push(
        Diagnostic::new(
            &codes::UNKNOWN_KEY,
            k.span,
            format!("unknown key `{}` in {what}", k.name),
        )
        .label("unknown key")
        .help(help),
    );
}

fn string(cx: &mut Cx, node: &Node) -> Option<Sp<String>> {
    match &node.value {
        Value::Str(s) => Some(Sp::new(s.clone(), node.span)),
        Value::Int(_) | Value::Float(_) | Value::Bool(_) => {
            cx.push(
                Diagnostic::new(
                    &codes::INVALID_TYPE,
                    node.span,
                    format!("expected a string, found {}", node.type_name()),
                )
                .label("expected a string")
                .help(format!("quote it: \"{}\"", node.to_json())),
            );
            None
        }
        _ => {
            type_error(cx, node, "a string");
            None
        }
    }
}

fn string_list(cx: &mut Cx, node: &Node) -> Vec<Sp<String>> {
    list(cx, node, string)
}

fn list<T>(cx: &mut Cx, node: &Node, mut f: impl FnMut(&mut Cx, &Node) -> Option<T>) -> Vec<T> {
    match &node.value {
        Value::Seq(items) => items.iter().filter_map(|n| f(cx, n)).collect(),
        _ => {
            type_error(cx, node, "a list");
            Vec::new()
        }
    }
}

fn u64_(cx: &mut Cx, node: &Node) -> Option<Sp<u64>> {
    match &node.value {
        Value::Int(i) if *i >= 0 => Some(Sp::new(*i as u64, node.span)),
        Value::Int(_) => {
            cx.push(
                Diagnostic::new(
                    &codes::LIMIT_OUT_OF_RANGE,
                    node.span,
                    "expected a non-negative integer",
                )
                .label("negative"),
            );
            None
        }
        _ => {
            type_error(cx, node, "an integer");
            None
        }
    }
}

fn f64_(cx: &mut Cx, node: &Node) -> Option<Sp<f64>> {
    match &node.value {
        Value::Int(i) => Some(Sp::new(*i as f64, node.span)),
        Value::Float(f) if f.is_finite() => Some(Sp::new(*f, node.span)),
        _ => {
            type_error(cx, node, "a number");
            None
        }
    }
}

fn bool_(cx: &mut Cx, node: &Node) -> Option<Sp<bool>> {
    match &node.value {
        Value::Bool(b) => Some(Sp::new(*b, node.span)),
        Value::Str(s)
            if matches!(
                s.to_ascii_lowercase().as_str(),
                "yes" | "no" | "on" | "off" | "y" | "n"
            ) =>
        {
            cx.push(
                Diagnostic::new(
                    &codes::INVALID_TYPE,
                    node.span,
                    format!("expected a boolean, found the string `{s}`"),
                )
                .label("a string in YAML 1.2")
                .help("write `true` or `false`"),
            );
            None
        }
        _ => {
            type_error(cx, node, "a boolean");
            None
        }
    }
}

fn any(node: &Node) -> Any {
    Any(node.clone())
}

/// Parses `250ms`, `20s`, `1.5m`, `2h`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.')?);
    let n: f64 = num.parse().ok()?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    (secs.is_finite() && (0.0..1e10).contains(&secs)).then(|| Duration::from_secs_f64(secs))
}

/// Parses `512KiB`, `8MiB`, `1GiB`, `100KB`, `123B`, `123`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

fn duration(cx: &mut Cx, node: &Node) -> Option<Sp<Dur>> {
    let s = match &node.value {
        Value::Str(s) => s,
        Value::Int(_) | Value::Float(_) => {
            cx.push(
                Diagnostic::new(&codes::INVALID_VALUE, node.span, "a duration needs a unit")
                    .label("no unit")
                    .help(format!("write `{}s` or `{}ms`", node.to_json(), node.to_json())),
            );
            return None;
        }
        _ => {
            type_error(cx, node, "a duration");
            return None;
        }
    };
    match parse_duration(s) {
        Some(d) => Some(Sp::new(Dur(d), node.span)),
        None => {
            cx.push(
                Diagnostic::new(
                    &codes::INVALID_VALUE,
                    node.span,
                    format!("invalid duration `{s}`"),
                )
                .label("not a duration")
                .help("durations are a number and a unit: `250ms`, `20s`, `5m`, `2h`"),
            );
            None
        }
    }
}

fn size(cx: &mut Cx, node: &Node) -> Option<Sp<Size>> {
    match &node.value {
        Value::Int(i) if *i >= 0 => Some(Sp::new(Size(*i as u64), node.span)),
        Value::Str(s) => match parse_size(s) {
            Some(n) => Some(Sp::new(Size(n), node.span)),
            None => {
                cx.push(
                    Diagnostic::new(&codes::INVALID_VALUE, node.span, format!("invalid size `{s}`"))
                        .label("not a size")
                        .help("sizes are a number of bytes or a number and a unit: `512KiB`, `8MiB`, `1GiB`"),
                );
                None
            }
        },
        _ => {
            type_error(cx, node, "a size");
            None
        }
    }
}

fn enum_<T: Copy>(cx: &mut Cx, node: &Node, what: &str, options: &[(&str, T)]) -> Option<Sp<T>> {
    let s = string(cx, node)?;
    if let Some((_, v)) = options.iter().find(|(n, _)| *n == s.value) {
        return Some(Sp::new(*v, s.span));
    }
    let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
    let list = names
        .iter()
        .map(|v| format!("`{v}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let help = match did_you_mean(&s.value, names.iter().copied()) {
        Some(d) => format!("{d} {what} is one of {list}"),
        None => format!("{what} is one of {list}"),
    };
    cx.push(
        Diagnostic::new(
            &codes::INVALID_VALUE,
            s.span,
            format!("invalid {what} `{}`", s.value),
        )
        .label(format!("not a valid {what}"))
        .help(help),
    );
    None
}

fn agent_kind(cx: &mut Cx, node: &Node) -> Option<Sp<AgentKind>> {
    let options: Vec<(&str, AgentKind)> = AgentKind::ALL.iter().map(|k| (k.as_str(), *k)).collect();
    enum_(cx, node, "agent kind", &options)
}

// ----- flow sections ---------------------------------------------------------------------------

fn schema_ref(cx: &mut Cx, node: &Node) -> Option<SchemaRef> {
    match &node.value {
        Value::Str(s) => Some(SchemaRef::Path(Sp::new(s.clone(), node.span))),
        Value::Map(_) | Value::Bool(_) => Some(SchemaRef::Inline(any(node))),
        _ => {
            type_error(cx, node, "a JSON Schema (a mapping) or a path to one");
            None
        }
    }
}

fn flow_input(cx: &mut Cx, node: &Node) -> Option<FlowInput> {
    let m = map(cx, node, "`input`")?;
    check_keys(cx, m, "the flow's `input`", &["schema"]);
    Some(FlowInput {
        schema: node.get("schema").and_then(|n| schema_ref(cx, n)),
    })
}

fn flow_output(cx: &mut Cx, node: &Node) -> Option<FlowOutput> {
    let m = map(cx, node, "`output`")?;
    check_keys(cx, m, "the flow's `output`", &["schema", "select"]);
    Some(FlowOutput {
        schema: node.get("schema").and_then(|n| schema_ref(cx, n)),
        select: node.get("select").and_then(|n| string(cx, n)),
    })
}

fn named<T>(
    cx: &mut Cx,
    node: &Node,
    what: &str,
    mut f: impl FnMut(&mut Cx, &Key, &Node) -> Option<T>,
) -> IndexMap<String, T> {
    if matches!(node.value, Value::Null) {
        return IndexMap::new();
    }
    let Some(m) = map(cx, node, what) else {
        return IndexMap::new();
    };
    let mut out = IndexMap::with_capacity(m.len());
    for (k, v) in m {
        if let Some(t) = f(cx, k, v) {
            out.insert(k.name.clone(), t);
        }
    }
    out
}

fn providers(cx: &mut Cx, node: &Node) -> IndexMap<String, Provider> {
    named(cx, node, "`providers`", |cx, k, v| {
        check_ident(cx, "provider", k);
        provider(cx, k, v)
    })
}

const PROVIDER_KEYS: &[&str] = &[
    "base_url",
    "api_key",
    "headers",
    "max_concurrency",
    "rate_limit",
    "prices",
    "timeout",
    "structured_output",
    "assume_tokens_per_call",
];

fn provider(cx: &mut Cx, key: &Key, node: &Node) -> Option<Provider> {
    let m = map(cx, node, "a provider")?;
    check_keys(cx, m, "a provider", PROVIDER_KEYS);
    let base_url = match node.get("base_url") {
        Some(n) => string(cx, n),
        None => {
            cx.push(
                Diagnostic::new(
                    &codes::MISSING_KEY,
                    key.span,
                    format!("provider `{}` has no `base_url`", key.name),
                )
                .help("add `base_url: http://127.0.0.1:8000/v1` (an OpenAI-compatible endpoint)"),
            );
            None
        }
    };
    Some(Provider {
        name: Sp::new(key.name.clone(), key.span),
        base_url: base_url.unwrap_or_else(|| Sp::new(String::new(), key.span)),
        api_key: node.get("api_key").and_then(|n| string(cx, n)),
        headers: node
            .get("headers")
            .map(|n| string_map(cx, n, "`headers`"))
            .unwrap_or_default(),
        max_concurrency: node.get("max_concurrency").and_then(|n| u64_(cx, n)),
        assume_tokens_per_call: node.get("assume_tokens_per_call").and_then(|n| u64_(cx, n)),
        rate_limit: node.get("rate_limit").and_then(|n| {
            let m = map(cx, n, "`rate_limit`")?;
            check_keys(
                cx,
                m,
                "`rate_limit`",
                &["requests_per_minute", "tokens_per_minute"],
            );
            Some(RateLimit {
                requests_per_minute: n.get("requests_per_minute").and_then(|n| u64_(cx, n)),
                tokens_per_minute: n.get("tokens_per_minute").and_then(|n| u64_(cx, n)),
            })
        }),
        prices: node
            .get("prices")
            .map(|n| {
                named(cx, n, "`prices`", |cx, k, v| {
                    let m = map(cx, v, "a price")?;
                    check_keys(cx, m, "a price", &["input_per_mtok", "output_per_mtok"]);
                    let field = |cx: &mut Cx, f: &str| match v.get(f) {
                        Some(n) => f64_(cx, n),
                        None => {
                            cx.push(Diagnostic::new(
                                &codes::MISSING_KEY,
                                k.span,
                                format!("price of `{}` has no `{f}`", k.name),
                            ));
                            None
                        }
                    };
                    Some(Price {
                        input_per_mtok: field(cx, "input_per_mtok")?,
                        output_per_mtok: field(cx, "output_per_mtok")?,
                    })
                })
            })
            .unwrap_or_default(),
        timeout: node.get("timeout").and_then(|n| duration(cx, n)),
        structured_output: node.get("structured_output").and_then(|n| {
            enum_(
                cx,
                n,
                "structured output form",
                &[
                    ("json_schema", StructuredOutput::JsonSchema),
                    ("json_object", StructuredOutput::JsonObject),
                    ("prompt", StructuredOutput::Prompt),
                ],
            )
        }),
    })
}

fn string_map(cx: &mut Cx, node: &Node, what: &str) -> IndexMap<String, Sp<String>> {
    named(cx, node, what, |cx, _, v| string(cx, v))
}

/// The `agents:` of a flow or library node: those that could be lowered, and the names of
/// those that could not (each with its error).
fn agents_of(cx: &mut Cx, node: &Node) -> (IndexMap<String, Agent>, Vec<String>) {
    let Some(n) = node.get("agents") else {
        return Default::default();
    };
    let agents = agents(cx, n);
    let unreadable = match &n.value {
        Value::Map(m) => m
            .iter()
            .map(|(k, _)| &k.name)
            .filter(|k| !agents.contains_key(k.as_str()))
            .cloned()
            .collect(),
        _ => Vec::new(),
    };
    (agents, unreadable)
}

fn agents(cx: &mut Cx, node: &Node) -> IndexMap<String, Agent> {
    named(cx, node, "`agents`", |cx, k, v| {
        check_ident(cx, "agent", k);
        agent(cx, Sp::new(k.name.clone(), k.span), v)
    })
}

/// The keys every agent definition may have, `kind` first.
pub const AGENT_COMMON_KEYS: &[&str] = &[
    "kind",
    "description",
    "input_schema",
    "result_schema",
    "timeout",
    "retry",
    "idempotent",
];

/// The keys an agent of `kind` has besides [`AGENT_COMMON_KEYS`].
pub fn agent_keys(kind: AgentKind) -> &'static [&'static str] {
    match kind {
        AgentKind::Llm => &[
            "provider",
            "model",
            "system",
            "prompt",
            "temperature",
            "max_tokens",
            "repair_attempts",
            "context_paths",
            "message_mode",
            "max_messages",
            "tools",
            "max_iterations",
            "max_parallel_tools",
            "until_tool",
            "approve",
        ],
        AgentKind::Command => &["run", "env", "cwd", "max_output", "bundle"],
        AgentKind::Http => &["url", "method", "headers", "max_response"],
        AgentKind::Flow => &[
            "path",
            "steps",
            "start",
            "agents",
            "input",
            "output",
            "defaults",
            "limits",
            "allow",
            "allow_hosts",
        ],
        AgentKind::Transform => &["result"],
        AgentKind::Native => &["function"],
        AgentKind::Mock => &[
            "returns",
            "sequence",
            "latency",
            "fail_times",
            "fail_rate",
            "seed",
        ],
    }
}

/// Lowers an agent definition (named, or inline in a step).
pub fn agent(cx: &mut Cx, name: Sp<String>, node: &Node) -> Option<Agent> {
    let m = map(cx, node, "an agent")?;
    let kind = match node.get("kind") {
        Some(n) => agent_kind(cx, n)?,
        None => {
            let list = AgentKind::ALL
                .iter()
                .map(|k| format!("`{}`", k.as_str()))
                .collect::<Vec<_>>()
                .join(", ");
            cx.push(
                Diagnostic::new(
                    &codes::MISSING_KEY,
                    name.span,
                    format!("agent `{}` has no `kind`", name.value),
                )
                .label("missing `kind`")
                .help(format!("add `kind:`, one of {list}")),
            );
            return None;
        }
    };
    let mut valid: Vec<&str> = AGENT_COMMON_KEYS.to_vec();
    valid.extend_from_slice(agent_keys(kind.value));
    let what = format!("{} `{}` agent", article(kind.value.as_str()), kind.value.as_str());
    for (k, _) in m {
        if !valid.contains(&k.name.as_str()) {
            let other = AgentKind::ALL
                .into_iter()
                .find(|o| agent_keys(*o).contains(&k.name.as_str()));
            match other {
                Some(o) => cx.push(
                    Diagnostic::new(
                        &codes::UNKNOWN_KEY,
                        k.span,
                        format!("`{}` is not a field of {what}", k.name),
                    )
                    .label(format!("a field of `{}` agents", o.as_str()))
                    .help(format!(
                        "valid keys are: {}",
                        valid
                            .iter()
                            .map(|v| format!("`{v}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                ),
                None => unknown_key(cx, k, &what, &valid),
            }
        }
    }
    let required = |cx: &mut Cx, field: &str| -> Option<Sp<String>> {
        match node.get(field) {
            Some(n) => string(cx, n),
            None => {
                cx.push(
                    Diagnostic::new(&codes::MISSING_KEY, kind.span, format!("{what} needs `{field}`"))
                        .label(format!("`{field}` missing")),
                );
                None
            }
        }
    };
    let spec = match kind.value {
        AgentKind::Llm => {
            let provider = required(cx, "provider");
            let model = required(cx, "model");
            AgentSpec::Llm(LlmAgent {
                provider: provider.unwrap_or_else(|| Sp::new(String::new(), kind.span)),
                model: model.unwrap_or_else(|| Sp::new(String::new(), kind.span)),
                system: node.get("system").and_then(|n| string(cx, n)),
                prompt: node.get("prompt").and_then(|n| string(cx, n)),
                temperature: node.get("temperature").and_then(|n| f64_(cx, n)),
                max_tokens: node.get("max_tokens").and_then(|n| u64_(cx, n)),
                repair_attempts: node.get("repair_attempts").and_then(|n| u64_(cx, n)),
                context_paths: node
                    .get("context_paths")
                    .map(|n| string_list(cx, n))
                    .unwrap_or_default(),
                message_mode: node.get("message_mode").and_then(|n| {
                    enum_(
                        cx,
                        n,
                        "message mode",
                        &[
                            ("none", MessageMode::None),
                            ("all", MessageMode::All),
                            ("latest", MessageMode::Latest),
                            ("bookend", MessageMode::Bookend),
                        ],
                    )
                }),
                max_messages: node.get("max_messages").and_then(|n| u64_(cx, n)),
                tools: node.get("tools").map(|n| tools(cx, n)).unwrap_or_default(),
                max_iterations: node.get("max_iterations").and_then(|n| u64_(cx, n)),
                max_parallel_tools: node.get("max_parallel_tools").and_then(|n| u64_(cx, n)),
                until_tool: node.get("until_tool").and_then(|n| string(cx, n)),
                approve: node
                    .get("approve")
                    .map(|n| string_list(cx, n))
                    .unwrap_or_default(),
            })
        }
        AgentKind::Command => {
            let run = match node.get("run") {
                Some(
                    n @ Node {
                        value: Value::Str(_), ..
                    },
                ) => {
                    cx.push(
                        Diagnostic::new(&codes::INVALID_TYPE, n.span, "`run` is a list of arguments, not a command line")
                            .label("a string")
                            .help("write the program and each argument as list items: `run: [python3, tools/x.py, --top, \"3\"]`; commands never run through a shell"),
                    );
                    Vec::new()
                }
                Some(n) => string_list(cx, n),
                None => {
                    required(cx, "run");
                    Vec::new()
                }
            };
            if let Some(n) = node.get("run")
                && n.as_seq().is_some_and(|s| s.is_empty())
            {
                cx.push(
                    Diagnostic::new(&codes::INVALID_VALUE, n.span, "`run` is empty")
                        .help("name the program to run"),
                );
            }
            AgentSpec::Command(CommandAgent {
                run,
                env: node
                    .get("env")
                    .map(|n| string_map(cx, n, "`env`"))
                    .unwrap_or_default(),
                cwd: node.get("cwd").and_then(|n| string(cx, n)),
                max_output: node.get("max_output").and_then(|n| size(cx, n)),
                bundle: node.get("bundle").map(|n| string_list(cx, n)).unwrap_or_default(),
            })
        }
        AgentKind::Http => {
            let url = required(cx, "url");
            AgentSpec::Http(HttpAgent {
                url: url.unwrap_or_else(|| Sp::new(String::new(), kind.span)),
                method: node.get("method").and_then(|n| string(cx, n)),
                headers: node
                    .get("headers")
                    .map(|n| string_map(cx, n, "`headers`"))
                    .unwrap_or_default(),
                max_response: node.get("max_response").and_then(|n| size(cx, n)),
            })
        }
        AgentKind::Flow => {
            let path = node.get("path").and_then(|n| string(cx, n));
            let inline = node.get("steps").is_some();
            if path.is_some() && inline {
                cx.push(
                    Diagnostic::new(
                        &codes::INVALID_VALUE,
                        kind.span,
                        "a `flow` agent has either `path` or inline `steps`, not both",
                    )
                    .label("both given"),
                );
            } else if path.is_none() && !inline && node.get("path").is_none() {
                cx.push(
                    Diagnostic::new(
                        &codes::MISSING_KEY,
                        kind.span,
                        "a `flow` agent needs `path` (a flow file) or inline `steps`",
                    )
                    .label("no flow given"),
                );
            }
            let inline = (inline && path.is_none()).then(|| {
                for (k, _) in m {
                    let n = k.name.as_str();
                    if !INLINE_FLOW_KEYS.contains(&n) && !AGENT_COMMON_KEYS.contains(&n) && n != "path" {
                        unknown_key(cx, k, "an inline flow", INLINE_FLOW_KEYS);
                    }
                }
                Box::new(flow_body(cx, node, Sp::new(name.value.clone(), name.span), false))
            });
            AgentSpec::Flow(FlowAgent { path, inline })
        }
        AgentKind::Transform => match node.get("result") {
            Some(n) => AgentSpec::Transform(TransformAgent { result: any(n) }),
            None => {
                required(cx, "result");
                return None;
            }
        },
        AgentKind::Mock => AgentSpec::Mock(mock(cx, node, kind.span)?),
        AgentKind::Native => AgentSpec::Native(NativeAgent {
            function: node.get("function").and_then(|n| string(cx, n)),
        }),
    };
    Some(Agent {
        name,
        kind,
        spec,
        common: AgentCommon {
            description: node
                .get("description")
                .and_then(|n| string(cx, n))
                .map(|s| s.value),
            input_schema: node.get("input_schema").and_then(|n| schema_ref(cx, n)),
            result_schema: node.get("result_schema").and_then(|n| schema_ref(cx, n)),
            timeout: node.get("timeout").and_then(|n| duration(cx, n)),
            retry: node.get("retry").and_then(|n| retry(cx, n)),
            idempotent: node.get("idempotent").and_then(|n| bool_(cx, n)),
        },
        span: node.span,
    })
}

/// An agent loop's `tools:`: a list of agent names, or a map name → `{description}` (or
/// nothing).
fn tools(cx: &mut Cx, node: &Node) -> Tools {
    let mut list = Vec::new();
    if node.as_seq().is_some() {
        for name in string_list(cx, node) {
            if list.iter().any(|t: &Tool| t.name.value == name.value) {
                cx.push(
                    Diagnostic::new(
                        &codes::INVALID_VALUE,
                        name.span,
                        format!("`{}` is listed twice in `tools`", name.value),
                    )
                    .label("listed before")
                    .help("remove this entry: each tool is listed once"),
                );
                continue;
            }
            list.push(Tool {
                name,
                description: None,
            });
        }
    } else if node.as_map().is_some() {
        for (_, tool) in named(cx, node, "`tools`", |cx, k, v| {
            let name = Sp::new(k.name.clone(), k.span);
            let description = match &v.value {
                Value::Null => None,
                _ => {
                    let m = map(cx, v, "a tool")?;
                    for (k, _) in m {
                        if k.name != "description" {
                            unknown_key(cx, k, "a tool", &["description"]);
                        }
                    }
                    v.get("description").and_then(|n| string(cx, n))
                }
            };
            Some(Tool { name, description })
        }) {
            list.push(tool);
        }
    } else {
        cx.push(
            Diagnostic::new(
                &codes::INVALID_TYPE,
                node.span,
                "`tools` is a list of agent names, or a map name → `{description}`",
            )
            .label("neither a list nor a map")
            .help("write `tools: [kb_search, crm_lookup]`"),
        );
    }
    Tools {
        list,
        span: Some(node.span),
    }
}

const MOCK_KEYS: &[&str] = &[
    "returns",
    "sequence",
    "latency",
    "fail_times",
    "fail_rate",
    "seed",
];

fn mock(cx: &mut Cx, node: &Node, at: Span) -> Option<MockAgent> {
    let returns = node.get("returns").map(any);
    let sequence = node.get("sequence").map(|n| list(cx, n, |_, n| Some(any(n))));
    if returns.is_some() && sequence.is_some() {
        cx.push(
            Diagnostic::new(
                &codes::INVALID_VALUE,
                at,
                "a mock has `returns` or `sequence`, not both",
            )
            .label("both given"),
        );
    }
    if let Some(s) = &sequence
        && s.is_empty()
    {
        let n = node.get("sequence").expect("sequence present");
        cx.push(
            Diagnostic::new(&codes::INVALID_VALUE, n.span, "`sequence` is empty")
                .help("give at least one value"),
        );
    }
    let fail_rate = node.get("fail_rate").and_then(|n| f64_(cx, n));
    if let Some(r) = &fail_rate
        && !(0.0..=1.0).contains(&r.value)
    {
        cx.push(
            Diagnostic::new(
                &codes::LIMIT_OUT_OF_RANGE,
                r.span,
                format!("`fail_rate` is {}, outside 0..=1", r.value),
            )
            .label("a fraction of calls"),
        );
    }
    Some(MockAgent {
        returns,
        sequence,
        latency: node.get("latency").and_then(|n| duration(cx, n)),
        fail_times: node.get("fail_times").and_then(|n| u64_(cx, n)),
        fail_rate,
        seed: node.get("seed").and_then(|n| u64_(cx, n)),
    })
}

fn defaults(cx: &mut Cx, node: &Node) -> Option<Defaults> {
    let m = map(cx, node, "`defaults`")?;
    check_keys(cx, m, "`defaults`", &["timeout", "retry", "idempotent"]);
    Some(Defaults {
        timeout: node.get("timeout").and_then(|n| duration(cx, n)),
        retry: node.get("retry").and_then(|n| retry(cx, n)),
        idempotent: node.get("idempotent").and_then(|n| bool_(cx, n)),
    })
}

fn limits(cx: &mut Cx, node: &Node) -> Option<Limits> {
    let m = map(cx, node, "`limits`")?;
    check_keys(
        cx,
        m,
        "`limits`",
        &[
            "max_steps",
            "max_depth",
            "timeout",
            "max_payload_bytes",
            "max_cost_usd",
        ],
    );
    Some(Limits {
        max_steps: node.get("max_steps").and_then(|n| u64_(cx, n)),
        max_depth: node.get("max_depth").and_then(|n| u64_(cx, n)),
        timeout: node.get("timeout").and_then(|n| duration(cx, n)),
        max_payload_bytes: node.get("max_payload_bytes").and_then(|n| size(cx, n)),
        max_cost_usd: node.get("max_cost_usd").and_then(|n| f64_(cx, n)),
    })
}

fn retry(cx: &mut Cx, node: &Node) -> Option<Retry> {
    let m = map(cx, node, "`retry`")?;
    check_keys(
        cx,
        m,
        "`retry`",
        &["attempts", "backoff", "factor", "max_backoff", "jitter", "on"],
    );
    Some(Retry {
        attempts: node.get("attempts").and_then(|n| u64_(cx, n)),
        backoff: node.get("backoff").and_then(|n| duration(cx, n)),
        factor: node.get("factor").and_then(|n| f64_(cx, n)),
        max_backoff: node.get("max_backoff").and_then(|n| duration(cx, n)),
        jitter: node.get("jitter").and_then(|n| match &n.value {
            Value::Bool(b) => Some(Sp::new(Jitter::Bool(*b), n.span)),
            Value::Int(_) | Value::Float(_) => {
                f64_(cx, n).map(|f| Sp::new(Jitter::Fraction(f.value), f.span))
            }
            _ => {
                type_error(cx, n, "`true`, `false` or a fraction");
                None
            }
        }),
        on: node.get("on").map(|n| string_list(cx, n)),
        span: node.span,
    })
}

// ----- steps -----------------------------------------------------------------------------------

const STEP_KINDS: &[&str] = &["agent", "set", "parallel", "interrupt", "fail", "succeed"];
const STEP_COMMON: &[&str] = &["description", "next", "timeout", "retry", "idempotent"];
const AGENT_STEP: &[&str] = &[
    "message",
    "scope",
    "input",
    "output",
    "foreach",
    "as",
    "max_items",
    "tolerate",
    "select",
    "concurrency",
    "while",
    "max_iterations",
    "delay",
];
const FOREACH_ONLY: &[&str] = &["as", "max_items", "tolerate", "select"];
const WHILE_ONLY: &[&str] = &["max_iterations", "delay"];

/// The keys a step of kind `kind` may have, in the order messages list them: the common
/// keys, the kind, then the kind's own.
fn step_keys(kind: &str) -> &'static [&'static str] {
    match kind {
        "agent" => &[
            "description",
            "next",
            "timeout",
            "retry",
            "idempotent",
            "agent",
            "message",
            "scope",
            "input",
            "output",
            "foreach",
            "as",
            "max_items",
            "tolerate",
            "select",
            "concurrency",
            "while",
            "max_iterations",
            "delay",
        ],
        "set" => &["description", "next", "timeout", "retry", "idempotent", "set"],
        "parallel" => &[
            "description",
            "next",
            "timeout",
            "retry",
            "idempotent",
            "parallel",
            "concurrency",
            "fail_fast",
        ],
        "interrupt" => &[
            "description",
            "next",
            "timeout",
            "retry",
            "idempotent",
            "interrupt",
            "scope",
            "input",
            "output",
        ],
        "fail" => &["description", "fail"],
        _ => &["description", "succeed"],
    }
}

fn steps(cx: &mut Cx, node: &Node) -> IndexMap<String, Step> {
    if let Value::Map(m) = &node.value
        && m.is_empty()
    {
        cx.push(
            Diagnostic::new(&codes::MISSING_KEY, node.span, "`steps` is empty")
                .help("a flow needs at least one step"),
        );
    }
    if matches!(node.value, Value::Null) {
        cx.push(
            Diagnostic::new(&codes::MISSING_KEY, node.span, "`steps` is empty")
                .help("a flow needs at least one step"),
        );
        return IndexMap::new();
    }
    let Some(m) = map(cx, node, "`steps`") else {
        return IndexMap::new();
    };
    let mut out: IndexMap<String, Step> = IndexMap::with_capacity(m.len());
    for (k, v) in m {
        if !matches!(v.value, Value::Map(_))
            && let Some((_, previous)) = out.last_mut()
            && step_keys("agent").iter().chain(STEP_KINDS).any(|f| *f == k.name)
        {
            dedented_field(cx, k, v, previous);
            continue;
        }
        check_ident(cx, "step", k);
        out.insert(k.name.clone(), step(cx, k, v));
    }
    out
}

/// A step's field written at the indentation of step ids (`next: b` two spaces short): one
/// error saying so, and no step of that name. A `next` becomes the step's above when it has
/// none, so that the steps it leads to stay reachable and raise no error of their own.
fn dedented_field(cx: &mut Cx, key: &Key, value: &Node, previous: &mut Step) {
    cx.push(
        Diagnostic::new(
            &codes::INVALID_TYPE,
            key.span,
            format!("`{}` is indented as a step id, under `steps:`", key.name),
        )
        .label("at the indentation of a step")
        .help(format!(
            "indent it under `{}:` (as deep as that step's other fields) to make it that step's `{}`",
            previous.id.value, key.name
        )),
    );
    if key.name == "next" && previous.next.is_none() {
        previous.next = next(cx, value);
    }
}

/// The kind a malformed step is kept with: an `agent` step whose agent lint cannot see (an
/// empty name, which no agent has). Steps with this kind are listed in
/// [`Cx::malformed_steps`]; lint reports nothing about their kind, and the error that made
/// them malformed keeps the flow from compiling.
pub fn placeholder_kind(at: Span) -> StepKind {
    StepKind::Agent(AgentRef::Named(Sp::new(String::new(), at)))
}

/// The entries of a step's mapping that [`step`] reads, found in one pass over its keys.
#[derive(Default)]
struct StepFields<'n> {
    description: Option<&'n (Key, Node)>,
    next: Option<&'n (Key, Node)>,
    timeout: Option<&'n (Key, Node)>,
    retry: Option<&'n (Key, Node)>,
    idempotent: Option<&'n (Key, Node)>,
    message: Option<&'n (Key, Node)>,
    scope: Option<&'n (Key, Node)>,
    input: Option<&'n (Key, Node)>,
    output: Option<&'n (Key, Node)>,
    foreach: Option<&'n (Key, Node)>,
    as_name: Option<&'n (Key, Node)>,
    max_items: Option<&'n (Key, Node)>,
    tolerate: Option<&'n (Key, Node)>,
    select: Option<&'n (Key, Node)>,
    while_: Option<&'n (Key, Node)>,
    max_iterations: Option<&'n (Key, Node)>,
    delay: Option<&'n (Key, Node)>,
    concurrency: Option<&'n (Key, Node)>,
    fail_fast: Option<&'n (Key, Node)>,
}

impl<'n> StepFields<'n> {
    /// The fields of `node` (none when it is not a mapping). Keys are unique: the parser
    /// keeps the first of duplicates.
    fn of(node: &'n Node) -> Self {
        let mut f = StepFields::default();
        for entry in node.as_map().unwrap_or_default() {
            let slot = match entry.0.name.as_str() {
                "description" => &mut f.description,
                "next" => &mut f.next,
                "timeout" => &mut f.timeout,
                "retry" => &mut f.retry,
                "idempotent" => &mut f.idempotent,
                "message" => &mut f.message,
                "scope" => &mut f.scope,
                "input" => &mut f.input,
                "output" => &mut f.output,
                "foreach" => &mut f.foreach,
                "as" => &mut f.as_name,
                "max_items" => &mut f.max_items,
                "tolerate" => &mut f.tolerate,
                "select" => &mut f.select,
                "while" => &mut f.while_,
                "max_iterations" => &mut f.max_iterations,
                "delay" => &mut f.delay,
                "concurrency" => &mut f.concurrency,
                "fail_fast" => &mut f.fail_fast,
                _ => continue,
            };
            slot.get_or_insert(entry);
        }
        f
    }
}

/// The value node of an entry.
fn val(entry: Option<&(Key, Node)>) -> Option<&Node> {
    entry.map(|(_, v)| v)
}

/// Lowers one step. A step whose kind cannot be read is still returned, with
/// [`placeholder_kind`] and its other fields as written, so that one problem gives one
/// diagnostic rather than unknown-step and unreachable-step errors around it.
fn step(cx: &mut Cx, key: &Key, node: &Node) -> Step {
    let m = match &node.value {
        Value::Map(m) => Some(m.as_slice()),
        _ => map(cx, node, &format!("step `{}`", key.name)),
    };
    let f = StepFields::of(node);
    let kind = m.and_then(|m| step_kind(cx, key, m, &f));
    let kind = kind.unwrap_or_else(|| {
        cx.malformed_steps.push(key.span);
        placeholder_kind(key.span)
    });
    let looping = LoopFields {
        foreach: val(f.foreach).and_then(|n| string(cx, n)),
        as_name: val(f.as_name).and_then(|n| string(cx, n)),
        max_items: val(f.max_items).and_then(|n| u64_(cx, n)),
        tolerate: val(f.tolerate).and_then(|n| tolerate(cx, n)),
        select: val(f.select).and_then(|n| string(cx, n)),
        while_: val(f.while_).and_then(|n| string(cx, n)),
        max_iterations: val(f.max_iterations).and_then(|n| u64_(cx, n)),
        max_iterations_written: f.max_iterations.is_some(),
        delay: val(f.delay).and_then(|n| duration(cx, n)),
    };
    if let (Some((fk, _)), Some((w, _))) = (f.foreach, f.while_) {
        cx.push(
            Diagnostic::new(
                &codes::STEP_KIND,
                w.span,
                "a step is either a `foreach` or a `while` loop, not both",
            )
            .with_secondary(fk.span, "`foreach` here")
            .help("nest one loop in a `flow` agent called by the other"),
        );
    }
    if f.foreach.is_none() {
        // FOREACH_ONLY, in its order.
        for (k, entry) in FOREACH_ONLY
            .iter()
            .zip([f.as_name, f.max_items, f.tolerate, f.select])
        {
            if let Some((key, _)) = entry {
                cx.push(
                    Diagnostic::new(
                        &codes::UNKNOWN_KEY,
                        key.span,
                        format!("`{k}` applies only to `foreach` steps"),
                    )
                    .label("no `foreach` here")
                    .help("add `foreach:` or remove this key"),
                );
            }
        }
    }
    if f.while_.is_none() {
        // WHILE_ONLY, in its order.
        for (k, entry) in WHILE_ONLY.iter().zip([f.max_iterations, f.delay]) {
            if let Some((key, _)) = entry {
                cx.push(
                    Diagnostic::new(
                        &codes::UNKNOWN_KEY,
                        key.span,
                        format!("`{k}` applies only to `while` steps"),
                    )
                    .label("no `while` here")
                    .help("add `while:` or remove this key"),
                );
            }
        }
    }
    // The kind key that counts (the first, when there are several).
    let kname = m.and_then(|m| {
        m.iter()
            .map(|(k, _)| k.name.as_str())
            .find(|n| STEP_KINDS.contains(n))
    });
    if kname == Some("agent")
        && f.foreach.is_none()
        && let Some((key, _)) = f.concurrency
    {
        cx.push(
            Diagnostic::new(
                &codes::UNKNOWN_KEY,
                key.span,
                "`concurrency` applies only to `foreach` and `parallel` steps",
            )
            .label("no `foreach` here"),
        );
    }
    Step {
        id: Sp::new(key.name.clone(), key.span),
        description: val(f.description).and_then(|n| string(cx, n)).map(|s| s.value),
        kind,
        next: val(f.next).and_then(|n| next(cx, n)),
        timeout: val(f.timeout).and_then(|n| duration(cx, n)),
        retry: val(f.retry).and_then(|n| retry(cx, n)),
        idempotent: val(f.idempotent).and_then(|n| bool_(cx, n)),
        message: val(f.message).and_then(|n| string(cx, n)),
        scope: val(f.scope).and_then(|n| string(cx, n)),
        input: val(f.input).and_then(|n| input_spec(cx, n)),
        output: val(f.output).and_then(|n| output_spec(cx, n)),
        looping,
        concurrency: val(f.concurrency).and_then(|n| u64_(cx, n)),
        fail_fast: val(f.fail_fast).and_then(|n| bool_(cx, n)),
        span: node.span,
    }
}

/// The kind of a step (a mapping), with the problems of its kind key and of the keys that do not
/// apply to that kind. `None`, with an error, when no kind can be read.
fn step_kind(cx: &mut Cx, key: &Key, m: &[(Key, Node)], f: &StepFields) -> Option<StepKind> {
    let mut kinds = m.iter().filter(|(k, _)| STEP_KINDS.contains(&k.name.as_str()));
    let Some((kind_key, kind_node)) = kinds.next() else {
        let looping = f.foreach.or(f.while_).is_some();
        let help = if looping {
            "`foreach` and `while` modify an `agent` step: add `agent: <name>`".to_string()
        } else {
            let mut h = format!(
                "give it one of {}",
                STEP_KINDS
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for (k, _) in m {
                if let Some(d) = did_you_mean(&k.name, STEP_KINDS.iter().copied()) {
                    h = format!("{d} ({h})");
                    break;
                }
            }
            h
        };
        cx.push(
            Diagnostic::new(
                &codes::STEP_KIND,
                key.span,
                format!("step `{}` has no kind", key.name),
            )
            .label("no kind key")
            .help(help),
        );
        return None;
    };
    for (extra, _) in kinds {
        cx.push(
            Diagnostic::new(
                &codes::STEP_KIND,
                extra.span,
                format!(
                    "step `{}` has more than one kind: `{}` and `{}`",
                    key.name, kind_key.name, extra.name
                ),
            )
            .label("second kind key")
            .with_secondary(kind_key.span, "first kind key")
            .help("a step does one thing; split it into two steps joined by `next`"),
        );
    }
    let kname = kind_key.name.as_str();
    let valid = step_keys(kname);
    for (k, _) in m {
        let n = k.name.as_str();
        if valid.contains(&n) || STEP_KINDS.contains(&n) {
            continue;
        }
        let a = article(kname);
        let all: Vec<&str> = STEP_COMMON
            .iter()
            .chain(AGENT_STEP)
            .chain(&["concurrency", "fail_fast"])
            .copied()
            .collect();
        if all.contains(&n) {
            cx.push(
                Diagnostic::new(
                    &codes::UNKNOWN_KEY,
                    k.span,
                    format!("`{n}` does not apply to {a} `{kname}` step"),
                )
                .label(format!("not a field of `{kname}` steps"))
                .help(format!(
                    "valid keys of {a} `{kname}` step are: {}",
                    valid
                        .iter()
                        .map(|v| format!("`{v}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            );
        } else {
            unknown_key(cx, k, &format!("{a} `{kname}` step"), valid);
        }
    }
    // A body that cannot be read keeps the kind, empty: its problem is reported, and the
    // step still does what its kind says. Only an agent cannot be made up.
    let kind = match kname {
        "agent" => StepKind::Agent(agent_ref(cx, key, kind_node)?),
        "set" => StepKind::Set(mappings(cx, kind_node, "`set`").unwrap_or_default()),
        "parallel" => StepKind::Parallel(branches(cx, kind_node)),
        "interrupt" => StepKind::Interrupt(match map(cx, kind_node, "`interrupt`") {
            Some(im) => {
                check_keys(cx, im, "`interrupt`", &["prompt", "schema", "expires"]);
                Interrupt {
                    prompt: kind_node.get("prompt").and_then(|n| string(cx, n)),
                    schema: kind_node.get("schema").and_then(|n| schema_ref(cx, n)),
                    expires: kind_node.get("expires").and_then(|n| duration(cx, n)),
                }
            }
            None => Interrupt {
                prompt: None,
                schema: None,
                expires: None,
            },
        }),
        "fail" => StepKind::Fail(if matches!(kind_node.value, Value::Null) {
            FailSpec::default()
        } else {
            match map(cx, kind_node, "`fail`") {
                Some(fm) => {
                    check_keys(cx, fm, "`fail`", &["kind", "message"]);
                    FailSpec {
                        kind: kind_node.get("kind").and_then(|n| string(cx, n)),
                        message: kind_node.get("message").and_then(|n| string(cx, n)),
                    }
                }
                None => FailSpec::default(),
            }
        }),
        _ => {
            if !matches!(kind_node.value, Value::Null)
                && let Some(sm) = map(cx, kind_node, "`succeed`")
            {
                check_keys(cx, sm, "`succeed`", &[]);
            }
            StepKind::Succeed(SucceedSpec {})
        }
    };
    Some(kind)
}

fn tolerate(cx: &mut Cx, node: &Node) -> Option<Sp<Tolerate>> {
    match &node.value {
        Value::Int(i) if *i >= 0 => Some(Sp::new(Tolerate::Count(*i as u64), node.span)),
        Value::Str(s) if s.ends_with('%') => match s[..s.len() - 1].trim().parse::<f64>() {
            Ok(p) if (0.0..=100.0).contains(&p) => Some(Sp::new(Tolerate::Percent(p), node.span)),
            _ => {
                cx.push(
                    Diagnostic::new(
                        &codes::INVALID_VALUE,
                        node.span,
                        format!("invalid percentage `{s}`"),
                    )
                    .help("`tolerate` is a count (`3`) or a percentage from 0% to 100% (`5%`)"),
                );
                None
            }
        },
        _ => {
            cx.push(
                Diagnostic::new(&codes::INVALID_VALUE, node.span, "invalid `tolerate`")
                    .label(node.type_name())
                    .help("`tolerate` is a count (`3`) or a percentage (`5%`)"),
            );
            None
        }
    }
}

fn agent_ref(cx: &mut Cx, step: &Key, node: &Node) -> Option<AgentRef> {
    match &node.value {
        Value::Str(s) => Some(AgentRef::Named(Sp::new(s.clone(), node.span))),
        Value::Map(_) => {
            agent(cx, Sp::new(step.name.clone(), step.span), node).map(|a| AgentRef::Inline(Box::new(a)))
        }
        _ => {
            type_error(cx, node, "an agent name or an inline agent definition");
            None
        }
    }
}

const BRANCH_KEYS: &[&str] = &[
    "agent",
    "message",
    "scope",
    "input",
    "output",
    "timeout",
    "retry",
    "idempotent",
];

fn branches(cx: &mut Cx, node: &Node) -> IndexMap<String, Branch> {
    let out = named(cx, node, "`parallel`", |cx, k, v| {
        check_ident(cx, "branch", k);
        let m = map(cx, v, &format!("branch `{}`", k.name))?;
        check_keys(cx, m, "a `parallel` branch", BRANCH_KEYS);
        let agent = match v.get("agent") {
            Some(a) => agent_ref(cx, k, a)?,
            None => {
                cx.push(
                    Diagnostic::new(
                        &codes::MISSING_KEY,
                        k.span,
                        format!("branch `{}` has no `agent`", k.name),
                    )
                    .label("missing `agent`"),
                );
                return None;
            }
        };
        Some(Branch {
            name: Sp::new(k.name.clone(), k.span),
            agent,
            message: v.get("message").and_then(|n| string(cx, n)),
            scope: v.get("scope").and_then(|n| string(cx, n)),
            input: v.get("input").and_then(|n| input_spec(cx, n)),
            output: v.get("output").and_then(|n| output_spec(cx, n)),
            timeout: v.get("timeout").and_then(|n| duration(cx, n)),
            retry: v.get("retry").and_then(|n| retry(cx, n)),
            idempotent: v.get("idempotent").and_then(|n| bool_(cx, n)),
            span: v.span,
        })
    });
    if out.is_empty() && node.as_map().is_some_and(|m| m.is_empty()) {
        cx.push(Diagnostic::new(
            &codes::MISSING_KEY,
            node.span,
            "`parallel` has no branches",
        ));
    }
    out
}

fn next(cx: &mut Cx, node: &Node) -> Option<Next> {
    match &node.value {
        Value::Str(s) => Some(Next::One(Sp::new(s.clone(), node.span))),
        Value::Seq(items) => Some(Next::Edges(items.iter().filter_map(|n| edge(cx, n)).collect())),
        _ => {
            type_error(cx, node, "a step id or a list of edges");
            None
        }
    }
}

fn edge(cx: &mut Cx, node: &Node) -> Option<Edge> {
    if let Value::Str(s) = &node.value {
        let sp = Sp::new(s.clone(), node.span);
        return Some(Edge {
            to: sp,
            on: None,
            if_: None,
            errors: None,
            span: node.span,
        });
    }
    let m = map(cx, node, "an edge")?;
    check_keys(cx, m, "an edge", &["to", "on", "if", "errors"]);
    let to = match node.get("to") {
        Some(n) => string(cx, n)?,
        None => {
            cx.push(
                Diagnostic::new(&codes::MISSING_KEY, node.span, "edge without `to`")
                    .label("missing `to`")
                    .help("every edge names its target: a step id, or `end`"),
            );
            return None;
        }
    };
    let on = node.get("on").and_then(|n| {
        // `on` unquoted is a string in YAML 1.2; a boolean here means YAML 1.1 habits.
        enum_(
            cx,
            n,
            "edge outcome",
            &[
                ("success", EdgeOn::Success),
                ("failure", EdgeOn::Failure),
                ("always", EdgeOn::Always),
            ],
        )
    });
    let errors = node.get("errors").map(|n| string_list(cx, n));
    if let (Some(e), Some(on)) = (node.get_key("errors"), &on)
        && on.value == EdgeOn::Success
    {
        cx.push(
            Diagnostic::new(
                &codes::INVALID_VALUE,
                e.span,
                "`errors` filters failures, but this edge is `on: success`",
            )
            .with_secondary(on.span, "success edge")
            .help("use `on: failure` with `errors:`"),
        );
    }
    let on = match (on, node.get_key("errors")) {
        // `errors:` alone implies a failure edge.
        (None, Some(k)) => Some(Sp::new(EdgeOn::Failure, k.span)),
        (on, _) => on,
    };
    let if_ = node.get("if").and_then(|n| match &n.value {
        Value::Bool(_) => {
            cx.push(
                Diagnostic::new(
                    &codes::INVALID_TYPE,
                    n.span,
                    "`if` is an expression, not a boolean literal",
                )
                .help("remove `if` for an unconditional edge"),
            );
            None
        }
        _ => string(cx, n),
    });
    Some(Edge {
        to,
        on,
        if_,
        errors,
        span: node.span,
    })
}

fn source(cx: &mut Cx, node: &Node) -> Option<Source> {
    match &node.value {
        Value::Str(s) if s.starts_with('$') || s.starts_with('=') => {
            Some(Source::Text(Sp::new(s.clone(), node.span)))
        }
        Value::Map(m) if node.get("value").is_some() => {
            check_keys(cx, m, "a literal source", &["value"]);
            Some(Source::Literal {
                value: any(node.get("value").expect("checked")),
            })
        }
        Value::Map(m) if node.get("path").is_some() => {
            check_keys(cx, m, "a source with a default", &["path", "default"]);
            // Whether it is a JSONPath is lint's to say (SY401), once.
            let path = string(cx, node.get("path").expect("checked"))?;
            let default = match node.get("default") {
                Some(d) => any(d),
                None => {
                    cx.push(
                        Diagnostic::new(
                            &codes::MISSING_KEY,
                            node.span,
                            "a `{path}` source needs `default`",
                        )
                        .help("write `{path: $.x, default: null}`, or the path alone when it must exist"),
                    );
                    return None;
                }
            };
            Some(Source::WithDefault { path, default })
        }
        _ => {
            let help = match &node.value {
                Value::Str(s) => format!("for the literal string, write `{{value: {s:?}}}`"),
                _ => format!("for a literal, write `{{value: {}}}`", node.to_json()),
            };
            cx.push(
                Diagnostic::new(
                    &codes::INVALID_VALUE,
                    node.span,
                    "a source is a JSONPath `$...`, an expression `=...`, `{path, default}` or `{value}`",
                )
                .label("not a source")
                .help(help),
            );
            None
        }
    }
}

fn mappings(cx: &mut Cx, node: &Node, what: &str) -> Option<Mappings> {
    let m = map(cx, node, what)?;
    let mut out = Vec::new();
    for (k, v) in m {
        if let Some(s) = source(cx, v) {
            out.push((Sp::new(k.name.clone(), k.span), s));
        }
    }
    Some(Mappings(out))
}

fn star(node: &Node) -> bool {
    node.as_str() == Some("*")
}

fn input_spec(cx: &mut Cx, node: &Node) -> Option<InputSpec> {
    match &node.value {
        _ if star(node) => Some(InputSpec::All(node.span)),
        Value::Seq(_) => Some(InputSpec::Paths(string_list(cx, node))),
        Value::Map(_) => mappings(cx, node, "`input`").map(InputSpec::Map),
        _ => {
            cx.push(
                Diagnostic::new(&codes::INVALID_TYPE, node.span, format!("invalid `input`: {}", node.type_name()))
                    .help("`input` is `\"*\"` (the whole payload), a list of paths, or a map of destination path → source"),
            );
            None
        }
    }
}

fn output_spec(cx: &mut Cx, node: &Node) -> Option<OutputSpec> {
    match &node.value {
        _ if star(node) => Some(OutputSpec::All(node.span)),
        Value::Seq(_) => Some(OutputSpec::Paths(string_list(cx, node))),
        Value::Map(_) => mappings(cx, node, "`output`").map(OutputSpec::Map),
        _ => {
            cx.push(
                Diagnostic::new(&codes::INVALID_TYPE, node.span, format!("invalid `output`: {}", node.type_name()))
                    .help("`output` is `\"*\"` (deep merge), a list of allowed paths, or a map of destination path → source"),
            );
            None
        }
    }
}

// ----- tests -----------------------------------------------------------------------------------

fn flow_test(cx: &mut Cx, node: &Node) -> Option<FlowTest> {
    let m = map(cx, node, "a test")?;
    check_keys(
        cx,
        m,
        "a test",
        &["name", "input", "context", "now", "mocks", "expect"],
    );
    let name = match node.get("name") {
        Some(n) => string(cx, n)?,
        None => {
            cx.push(
                Diagnostic::new(&codes::MISSING_KEY, node.span, "test without `name`")
                    .label("missing `name`"),
            );
            return None;
        }
    };
    let mocks = node
        .get("mocks")
        .map(|n| {
            named(cx, n, "`mocks`", |cx, k, v| {
                let mm = map(cx, v, &format!("mock `{}`", k.name))?;
                check_keys(cx, mm, "a mock", MOCK_KEYS);
                mock(cx, v, k.span)
            })
        })
        .unwrap_or_default();
    let expect = match node.get("expect") {
        Some(n) => expect(cx, n)?,
        None => {
            cx.push(
                Diagnostic::new(
                    &codes::MISSING_KEY,
                    name.span,
                    format!("test `{}` has no `expect`", name.value),
                )
                .help("say what the run must do: `expect: {status: succeeded}`"),
            );
            return None;
        }
    };
    Some(FlowTest {
        name,
        input: node.get("input").map(any),
        context: node.get("context").map(any),
        now: node.get("now").and_then(|n| now(cx, n)),
        mocks,
        expect,
        span: node.span,
    })
}

/// A test's `now`: an RFC 3339 timestamp the store can record as it is (to the microsecond).
fn now(cx: &mut Cx, node: &Node) -> Option<Sp<crate::runtime::time::Timestamp>> {
    let text = string(cx, node)?;
    match parse_now(&text.value) {
        Ok(t) => Some(Sp::new(t, text.span)),
        Err(why) => {
            cx.push(
                Diagnostic::new(&codes::INVALID_VALUE, text.span, format!("invalid `now`: {why}"))
                    .label("not a timestamp the run can take")
                    .help("`now` is an RFC 3339 timestamp: `now: \"2026-03-01T09:00:00Z\"`"),
            );
            None
        }
    }
}

/// Parses a pinned `now` (a test's `now:`, `--now`): RFC 3339 as CEL's `timestamp()` takes
/// it, with no digit past the microsecond, since the run records `now` to the microsecond and
/// a resumed run must see what the first start saw.
pub fn parse_now(text: &str) -> Result<crate::runtime::time::Timestamp, String> {
    use crate::runtime::time::Timestamp;
    let t = Timestamp::parse(text).map_err(|e| e.to_string())?;
    if Timestamp::from_unix_micros(t.unix_micros()) != Some(t) {
        return Err(format!(
            "`{text}` is finer than a microsecond, and a run records `now` to the microsecond"
        ));
    }
    Ok(t)
}

fn expect(cx: &mut Cx, node: &Node) -> Option<Expect> {
    let m = map(cx, node, "`expect`")?;
    check_keys(cx, m, "`expect`", &["status", "path", "output", "error", "calls"]);
    Some(Expect {
        status: node.get("status").and_then(|n| {
            enum_(
                cx,
                n,
                "status",
                &[
                    ("succeeded", RunStatusExpect::Succeeded),
                    ("failed", RunStatusExpect::Failed),
                    ("interrupted", RunStatusExpect::Interrupted),
                ],
            )
        }),
        path: node.get("path").map(|n| string_list(cx, n)),
        output: node.get("output").map(any),
        error: node.get("error").map(any),
        calls: node
            .get("calls")
            .map(|n| named(cx, n, "`calls`", |cx, _, v| u64_(cx, v)))
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("5d"), None);
        assert_eq!(parse_size("512KiB"), Some(512 * 1024));
        assert_eq!(parse_size("8MiB"), Some(8 << 20));
        assert_eq!(parse_size("12"), Some(12));
        assert_eq!(parse_size("12 parsecs"), None);
    }

    #[test]
    fn step_keys_are_the_common_keys_the_kind_and_its_own() {
        for kind in STEP_KINDS {
            let mut v: Vec<&str> = STEP_COMMON.to_vec();
            v.push(kind);
            match *kind {
                "agent" => v.extend_from_slice(AGENT_STEP),
                "parallel" => v.extend_from_slice(&["concurrency", "fail_fast"]),
                "interrupt" => v.extend_from_slice(&["scope", "input", "output"]),
                "fail" | "succeed" => {
                    v.retain(|k| *k != "next" && *k != "retry" && *k != "timeout" && *k != "idempotent")
                }
                _ => {}
            }
            assert_eq!(step_keys(kind), v.as_slice(), "{kind}");
        }
    }

    #[test]
    fn identifiers() {
        assert!(is_ident("fetch_docs2"));
        assert!(!is_ident("fetch-docs"));
        assert!(!is_ident("Fetch"));
        assert_eq!(suggest_ident("fetch-docs", false), "fetch_docs");
    }
}
