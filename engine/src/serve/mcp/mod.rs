//! Flows as the tools of MCP clients (SPEC §14): each served flow is a tool named after its
//! `flow:` name, and two tools more, `switchyard_run_status` and `switchyard_run_resume`,
//! continue the runs that stopped for a human. A call runs the flow on the store through the
//! library ([`Switchyard`]), recorded with origin `mcp`; its answer is the run's output, its
//! error (`is_error`), or what it waits for.
//!
//! The protocol itself is the official SDK's, behind `sdk.rs` (the only file here that knows
//! `rmcp`); `http.rs` hosts it over Streamable HTTP with the token and `Origin` checks. What
//! is here knows no protocol: tools are [`ToolDef`]s, answers [`Answer`]s.

pub mod http;
mod sdk;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use indexmap::IndexMap;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::api::{Event, Events, Flow, RunConfig, Switchyard};
use crate::plan::{AgentPlanSpec, Plan, StepPlanKind};
use crate::record::{Origin, RunStatus};
use crate::runtime::engine::{RunControls, RunOptions, RunOutcome};
use crate::runtime::resume::{Question, ResumeOptions, WaitingFor};
use crate::store::Store;
use crate::store::any::AnyStore;

pub use sdk::serve_stdio;

/// The tool that tells where a run is.
pub const STATUS_TOOL: &str = "switchyard_run_status";
/// The tool that continues a run that stopped for a human.
pub const RESUME_TOOL: &str = "switchyard_run_resume";

/// One tool as `tools/list` gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema of `type: object`.
    pub input_schema: Map<String, Value>,
    pub output_schema: Option<Map<String, Value>>,
}

/// What a tool call answers: `structuredContent` (when the value is an object), the text
/// content, and whether it is an error.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub structured: Option<Value>,
    pub text: String,
    pub is_error: bool,
}

impl Answer {
    /// An answer whose text is the JSON of `value`, which is also its structured content.
    fn value(value: Value) -> Answer {
        let text = serde_json::to_string(&value).expect("JSON values serialize");
        Answer {
            structured: value.is_object().then_some(value),
            text,
            is_error: false,
        }
    }

    /// A call that could not be done, saying why.
    fn refused(message: impl Into<String>) -> Answer {
        Answer {
            structured: None,
            text: message.into(),
            is_error: true,
        }
    }
}

/// A call's tool name that no tool has: a protocol error, not an answer.
#[derive(Debug)]
pub struct UnknownTool(pub String);

/// Where a call tells its progress: once per finished step of the run, with a message naming
/// the step, counting from 1.
pub trait Progress: Send + Sync {
    fn step(&self, done: u64, message: String) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// The served flows over one store.
pub struct Server {
    flows: IndexMap<String, Flow>,
    store: Arc<AnyStore>,
    options: RunOptions,
    /// Cancelled when the server stops: the runs in flight pause at their next recorded point.
    stopping: CancellationToken,
    /// Calls in flight, and a wake-up for [`Server::drained`] as each ends.
    in_flight: std::sync::atomic::AtomicUsize,
    ended: tokio::sync::Notify,
}

impl Server {
    /// Serves `flows` (each loaded and linted) over `store`, their runs started with
    /// `options` (recorded with origin `mcp`). Refused, with every reason: two flows with one
    /// name, a flow named like one of the run tools, an `input.schema` that does not take an
    /// object.
    pub fn new(flows: Vec<Flow>, store: Arc<AnyStore>, options: RunOptions) -> Result<Server, Vec<String>> {
        let mut problems = Vec::new();
        let mut by_name: IndexMap<String, Flow> = IndexMap::new();
        for flow in flows {
            let name = flow.name().to_string();
            if name == STATUS_TOOL || name == RESUME_TOOL {
                problems.push(format!(
                    "{}: flow `{name}` has the name of a tool that `mcp serve` serves itself: rename the flow",
                    flow.name_location()
                ));
                continue;
            }
            if let Some(schema) = &flow.plan().root().input_schema
                && !takes_objects(&schema.value)
            {
                problems.push(format!(
                    "{}: flow `{name}`: its `input.schema` must be of `type: object` to be an MCP tool's `inputSchema`",
                    flow.name_location()
                ));
            }
            match by_name.get(&name) {
                Some(first) => problems.push(format!(
                    "{}: two flows are named `{name}` (the other at {}): a tool name is served once; rename one",
                    flow.name_location(),
                    first.name_location()
                )),
                None => {
                    by_name.insert(name, flow);
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let options = RunOptions {
            origin: Origin::Mcp,
            ..options
        };
        Ok(Server {
            flows: by_name,
            store,
            options,
            stopping: CancellationToken::new(),
            in_flight: Default::default(),
            ended: tokio::sync::Notify::new(),
        })
    }

    /// Stops the runs in flight at their next recorded point (the steps running finish and
    /// are recorded): they stay `running` in the store, and their calls answer that
    /// `switchyard_run_resume` continues them. Calls made after this are refused.
    pub fn stop_runs(&self) {
        self.stopping.cancel();
    }

    /// Waits until no call is in flight.
    pub async fn drained(&self) {
        loop {
            let ended = self.ended.notified();
            if self.in_flight.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                return;
            }
            ended.await;
        }
    }

    /// The served flows.
    pub fn flows(&self) -> impl Iterator<Item = &Flow> {
        self.flows.values()
    }

    /// The store the runs are recorded in.
    pub fn store(&self) -> &Arc<AnyStore> {
        &self.store
    }

    /// Every tool, the flows' in the order given, then the two run tools.
    pub fn tools(&self) -> Vec<ToolDef> {
        let mut tools: Vec<ToolDef> = self.flows.values().map(flow_tool).collect();
        tools.push(ToolDef {
            name: STATUS_TOOL.into(),
            description: Some(
                "Where a run of a flow served here is: its status, and its output, its error or what it waits for."
                    .into(),
            ),
            input_schema: object(json!({
                "type": "object",
                "properties": {"run_id": {"type": "string", "description": "The run's id, as a call answered it."}},
                "required": ["run_id"],
            })),
            output_schema: None,
        });
        tools.push(ToolDef {
            name: RESUME_TOOL.into(),
            description: Some(
                "Continues a run that stopped for a human (status `interrupted`) with the decision it waits for: \
                 for an `interrupt`, a value its schema accepts; for an approval, {\"approve\": true}, \
                 {\"edit\": {...arguments}} or {\"reject\": \"why\"} (a list of them for several calls). Answers like \
                 the flow's own tool: the output, or what the run waits for next."
                    .into(),
            ),
            input_schema: object(json!({
                "type": "object",
                "properties": {
                    "run_id": {"type": "string", "description": "The run's id."},
                    "decision": {"description": "The answer to what the run waits for (`waiting_for`)."},
                    "retry_in_doubt": {
                        "type": "boolean",
                        "description": "Call again an attempt that started and never finished (a run stopped `in_doubt`)."
                    },
                },
                "required": ["run_id"],
            })),
            output_schema: None,
        });
        tools
    }

    /// Calls tool `name` with `arguments`. `progress` hears of each finished step; `cancel`
    /// cancels the run (the client cancelled the request).
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<Map<String, Value>>,
        progress: Option<&dyn Progress>,
        cancel: CancellationToken,
    ) -> Result<Answer, UnknownTool> {
        let arguments = arguments.unwrap_or_default();
        if name == STATUS_TOOL {
            return Ok(self.status(&arguments).await);
        }
        let flow = match name {
            RESUME_TOOL => None,
            _ => Some(
                self.flows
                    .get(name)
                    .ok_or_else(|| UnknownTool(name.to_string()))?,
            ),
        };
        // Counted before the check: a stop either sees this call or refuses it.
        let _call = InFlight::enter(self);
        if self.stopping.is_cancelled() {
            return Ok(Answer::refused("the server is stopping: no run starts now"));
        }
        Ok(match flow {
            None => self.resume(&arguments, progress, cancel).await,
            Some(flow) => self.run(flow, Value::Object(arguments), progress, cancel).await,
        })
    }

    fn switchyard(&self) -> Switchyard<AnyStore> {
        Switchyard::with_store(self.store.clone())
    }

    fn config(&self, cancel: CancellationToken) -> RunConfig {
        RunConfig {
            context: None,
            options: self.options.clone(),
            controls: RunControls {
                cancel,
                pause: self.stopping.child_token(),
                released: None,
            },
        }
    }

    async fn run(
        &self,
        flow: &Flow,
        input: Value,
        progress: Option<&dyn Progress>,
        cancel: CancellationToken,
    ) -> Answer {
        let sy = self.switchyard();
        let events = progress.map(|_| sy.events());
        let run = sy.run_with(flow, input, self.config(cancel));
        match reporting(run, events, progress).await {
            Ok(outcome) => answer(outcome),
            Err(e) => Answer::refused(format!("the run did not start: {e}")),
        }
    }

    /// The root run `arguments.run_id` names, if it is a run of a flow served here.
    async fn served_run(
        &self,
        arguments: &Map<String, Value>,
    ) -> Result<(crate::record::RunRecord, &Flow), Answer> {
        let Some(id) = arguments.get("run_id").and_then(Value::as_str) else {
            return Err(Answer::refused("`run_id` is required: the run's id, as a string"));
        };
        let record = match self.store.get_run(id).await {
            Ok(r) => r,
            Err(crate::store::StoreError::NotFound(_)) => {
                return Err(Answer::refused(format!("there is no run `{id}` in the store")));
            }
            Err(e) => return Err(Answer::refused(format!("could not read run `{id}`: {e}"))),
        };
        if let Some(parent) = &record.parent_run {
            return Err(Answer::refused(format!(
                "run `{id}` is a child run (of `{parent}`): ask for its root run"
            )));
        }
        match self.flows.get(&record.flow) {
            Some(flow) => Ok((record, flow)),
            None => Err(Answer::refused(format!(
                "run `{id}` is a run of flow `{}`, which is not served here",
                record.flow
            ))),
        }
    }

    async fn status(&self, arguments: &Map<String, Value>) -> Answer {
        let record = match self.served_run(arguments).await {
            Ok((r, _)) => r,
            Err(refused) => return refused,
        };
        let mut v = json!({"run_id": record.id, "flow": record.flow, "status": record.status.as_str()});
        match record.status {
            RunStatus::Succeeded => v["output"] = record.output.unwrap_or(Value::Null),
            RunStatus::Interrupted => {
                match crate::runtime::resume::waiting_at(&*self.store, &record.id).await {
                    Ok(w) => v["waiting_for"] = w.map_or(Value::Null, |w| waiting_json(&w.waiting_for())),
                    Err(e) => {
                        return Answer::refused(format!(
                            "could not read what run `{}` waits for: {e}",
                            record.id
                        ));
                    }
                }
                if let Some(e) = &record.error {
                    v["error"] = error_json(e);
                }
            }
            _ => {
                if let Some(e) = &record.error {
                    v["error"] = error_json(e);
                }
            }
        }
        Answer::value(v)
    }

    async fn resume(
        &self,
        arguments: &Map<String, Value>,
        progress: Option<&dyn Progress>,
        cancel: CancellationToken,
    ) -> Answer {
        let (record, flow) = match self.served_run(arguments).await {
            Ok(x) => x,
            Err(refused) => return refused,
        };
        if let Some(batch) = &record.batch {
            return Answer::refused(format!(
                "run `{}` is an item of batch `{batch}`: continue it with `switchyard resume`, which keeps the batch's output",
                record.id
            ));
        }
        let retry_in_doubt = match arguments.get("retry_in_doubt") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Answer::refused("`retry_in_doubt` must be true or false"),
        };
        let mut options = ResumeOptions::default().retry_in_doubt(retry_in_doubt);
        if let Some(d) = arguments.get("decision") {
            options = options.decision(d.clone());
        }
        let sy = self.switchyard();
        let events = progress.map(|_| sy.events());
        let run = sy.resume(flow, &record.id, options, self.config(cancel));
        match reporting(run, events, progress).await {
            Ok(outcome) => answer(outcome),
            Err(e) => Answer::refused(format!("run `{}` was not resumed: {e}", record.id)),
        }
    }
}

/// A call in flight, counted until it ends.
struct InFlight<'s>(&'s Server);

impl<'s> InFlight<'s> {
    fn enter(server: &'s Server) -> Self {
        server.in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InFlight(server)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
}

/// A flow's tool: its name, description, `input.schema` (`{type: object}` when it has none)
/// and, as `outputSchema`, its `output.schema` when that describes an object. A flow that can
/// stop for a human answers such a stop with `{run_id, status, waiting_for}`, so its
/// `outputSchema` takes that answer too.
fn flow_tool(flow: &Flow) -> ToolDef {
    let root = flow.plan().root();
    let input_schema = match &root.input_schema {
        Some(s) => object(s.value.clone()),
        None => object(json!({"type": "object"})),
    };
    let output_schema = root
        .output_schema
        .as_ref()
        .filter(|s| describes_objects(&s.value))
        .map(|s| {
            if may_wait_for_a_human(flow.plan()) {
                object(json!({"type": "object", "anyOf": [s.value, interrupted_schema()]}))
            } else {
                object(s.value.clone())
            }
        });
    ToolDef {
        name: flow.name().to_string(),
        description: flow.description().map(str::to_string),
        input_schema,
        output_schema,
    }
}

/// The answer of a run that stopped for a human, as a JSON Schema.
fn interrupted_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "run_id": {"type": "string"},
            "status": {"const": "interrupted"},
            "waiting_for": {"type": ["object", "null"]},
        },
        "required": ["run_id", "status", "waiting_for"],
    })
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// Whether a schema may take an object: `type` absent, `object`, or a list holding it.
fn takes_objects(schema: &Value) -> bool {
    match schema.get("type") {
        None => schema.is_object(),
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        Some(_) => false,
    }
}

/// Whether a schema says its values are objects (`type: object`): what an `outputSchema` must.
fn describes_objects(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("object")
}

/// Whether a run of the plan can stop for a human: an `interrupt` step or an agent loop with
/// `approve:` anywhere in it (the flows it calls included).
fn may_wait_for_a_human(plan: &Plan) -> bool {
    let interrupts = plan.flows.iter().any(|f| {
        f.steps.values().any(|n| {
            f.step(*n)
                .is_some_and(|s| matches!(s.kind, StepPlanKind::Interrupt(_)))
        })
    });
    interrupts
        || plan.agents().into_iter().any(|(_, a)| match &a.spec {
            AgentPlanSpec::Llm(l) => l.agent_loop.as_ref().is_some_and(|lp| !lp.approve.is_empty()),
            _ => false,
        })
}

/// Runs `work` while telling `progress` of each finished top-level step of its root run.
async fn reporting<T>(
    work: impl Future<Output = T>,
    events: Option<Events>,
    progress: Option<&dyn Progress>,
) -> T {
    let (Some(mut events), Some(progress)) = (events, progress) else {
        return work.await;
    };
    let report = async {
        let mut root: Option<String> = None;
        let mut done = 0;
        while let Some(event) = events.next().await {
            match event {
                Event::RunStarted(r) if r.parent_run.is_none() => root = Some(r.id),
                Event::StepFinished(s)
                    if root.as_deref() == Some(s.run_id.as_str())
                        && s.iteration.is_none()
                        && !s.number.contains('.') =>
                {
                    done += 1;
                    progress
                        .step(done, format!("step `{}` {}", s.step, s.status.as_str()))
                        .await;
                }
                _ => {}
            }
        }
    };
    let (out, ()) = tokio::join!(work, report);
    out
}

/// What a call answers for a run that ended or stopped.
fn answer(outcome: RunOutcome) -> Answer {
    let id = outcome.run_id.clone();
    match outcome.status {
        RunStatus::Succeeded => Answer::value(outcome.output.unwrap_or(Value::Null)),
        RunStatus::Interrupted => {
            let mut v = json!({
                "run_id": id,
                "status": "interrupted",
                "waiting_for": outcome.waiting.as_ref().map_or(Value::Null, waiting_json),
            });
            // Stopped for another reason than a question (an attempt in doubt): what it is.
            if outcome.waiting.is_none()
                && let Some(e) = &outcome.error
            {
                v["error"] = error_json(e);
            }
            Answer::value(v)
        }
        // Paused at a recorded point: the server is stopping.
        RunStatus::Running => Answer {
            text: format!(
                "stopped: the server is stopping; run `{id}` is recorded up to its last finished step, and \
                 {RESUME_TOOL} continues it"
            ),
            structured: Some(json!({"run_id": id, "status": "running"})),
            is_error: true,
        },
        status => {
            let (kind, message) = match &outcome.error {
                Some(e) => (e.kind.as_str().to_string(), e.message.clone()),
                None => ("fail".to_string(), format!("the run ended {}", status.as_str())),
            };
            Answer {
                text: format!("error[{kind}]: {message} (run `{id}` {})", status.as_str()),
                structured: Some(json!({
                    "run_id": id,
                    "status": status.as_str(),
                    "error": {"kind": kind, "message": message},
                })),
                is_error: true,
            }
        }
    }
}

fn error_json(e: &crate::record::StepError) -> Value {
    json!({"kind": e.kind.as_str(), "message": e.message})
}

/// What a stopped run waits for, as JSON: where (run, flow, step, number) and the question.
fn waiting_json(w: &WaitingFor) -> Value {
    let mut v = json!({"run_id": w.run_id, "flow": w.flow, "step": w.step, "number": w.number});
    match &w.question {
        Question::Interrupt(i) => {
            v["kind"] = "interrupt".into();
            v["prompt"] = i.prompt.clone().into();
            v["schema"] = i.schema.clone().unwrap_or(Value::Null);
            v["expires_at"] = i.expires_at.into();
        }
        Question::Approval(a) => {
            v["kind"] = "approval".into();
            v["agent"] = a.agent.clone().into();
            v["prompt"] = a.prompt.clone().into();
            v["calls"] = a
                .calls
                .iter()
                .map(|c| json!({"id": c.id, "tool": c.tool, "arguments": c.arguments}))
                .collect();
        }
        Question::Elicitation(e) => {
            v["kind"] = "elicitation".into();
            v["server"] = e.server.clone().into();
            v["tool"] = e.tool.clone().into();
            v["prompt"] = e.message.clone().into();
            v["schema"] = e.schema.clone();
        }
    }
    v
}
