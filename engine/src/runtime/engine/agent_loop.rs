//! Agent loops (SPEC §6.3): an `llm` agent with `tools:` asks its model turn after turn; the
//! tools each turn calls run (concurrently, up to `max_parallel_tools`) and answer in the
//! model's order, until the model answers without calls, the `until_tool`'s result lands, or
//! `max_iterations` turns have passed (kind `limit`).
//!
//! Every model turn and every tool call is a step part of its own, recorded as it finishes:
//! `3.t2` is turn 2 of step 3, `3.t2.1` the first call of that turn (a `flow` tool's child
//! run numbers its steps below that). A resumed loop rebuilds its conversation from those
//! records (a turn's assistant message, a call's result) instead of asking again; a tool
//! call that started and never finished is in doubt as any call is ([`super::invoke`]).
//! A call of an `approve` tool stops the run `interrupted` at an `approval` part
//! (`3.t2.approval`) holding the turn's proposed calls; the decision given to `resume`
//! approves, edits or rejects each, and is recorded there.
//!
//! In flow tests a `mock` that stands in for the loop's agent stands in for its model: each
//! value it returns is a turn, `{tool_calls: [{name, arguments}]}` or the final answer.

use std::sync::Arc;

use futures_util::stream::{self, StreamExt};
use serde_json::{Map, Value, json};

use super::loop_tools::{Offered, Tools};
use super::{Run, StepOutcome, backoff};
use crate::agents::llm::{self, ToolCall, Turn};
use crate::agents::{self, CallContext, StepNumber};
use crate::plan::*;
use crate::record::{self, RunStatus, StepStatus, Usage};
use crate::record::{ErrorKind, StepError};
use crate::store::Store;

/// The most of a message's text, or a call's arguments, the transcript on a step's record
/// keeps.
const KEPT_TEXT: usize = 4 * 1024;
/// The most messages the transcript keeps: the first ones and the last ones.
const KEPT_MESSAGES: usize = 200;

/// What stands in for the model of a loop.
enum Model<'a> {
    Llm(llm::LlmAgent<'a>),
    /// A flow test's mock: each value it returns is a turn.
    Mock(&'a MockPlan),
}

/// How one tool call ended, as its `tool` message and its record say.
struct CallEnd {
    /// The `tool` message's content.
    content: String,
    /// The tool's result, when it succeeded.
    result: Option<Arc<Value>>,
    usage: Usage,
    /// The loop stops here (a call in doubt, a child run interrupted, a spent budget).
    stop: Option<(Option<RunStatus>, StepError)>,
    failed: bool,
}

/// What a loop has used and done so far, for the step's record.
#[derive(Default)]
struct Tally {
    usage: Usage,
    /// What the turns' requests put on record (abandoned requests), merged.
    notes: Value,
    tool_calls: u64,
    tool_failures: u64,
}

impl Tally {
    /// The loop's outcome `o` after `turns` turns, with the tokens and cost of all of them
    /// and its record's `answers`: the counts and the capped transcript.
    fn close(&mut self, mut o: StepOutcome, transcript: &[Value], turns: u64) -> StepOutcome {
        o.usage = self.usage;
        let mut m = match std::mem::take(&mut self.notes) {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        // The loop's model calls are its turns, each with its own record: the loop's is not
        // one of them.
        m.remove("model");
        m.remove("response_model");
        m.insert("turns".into(), json!(turns));
        m.insert("tool_calls".into(), json!(self.tool_calls));
        if self.tool_failures > 0 {
            m.insert("tool_failures".into(), json!(self.tool_failures));
        }
        m.insert("transcript".into(), kept_transcript(transcript));
        o.answers = Some(Value::Object(m));
        o
    }
}

/// A human's answer to one proposed call.
pub(super) enum Decision {
    Approve,
    Edit(Value),
    Reject(String),
}

impl<'e, S: Store> Run<'e, S> {
    /// Whether `call` runs as an agent loop with `agent` (its agent after `--agent-change`):
    /// the loop's own agent, or a flow test's mock standing in for its model.
    pub(super) fn loop_of<'a>(
        call: &'a CallPlan,
        agent: &AgentPlan,
        stand_ins: bool,
    ) -> Option<&'a LoopPlan> {
        let AgentPlanSpec::Llm(l) = &call.agent.spec else {
            return None;
        };
        let lp = l.agent_loop.as_ref()?;
        match &agent.spec {
            AgentPlanSpec::Llm(e) if e.agent_loop.is_some() => Some(lp),
            AgentPlanSpec::Mock(_) if stand_ins => Some(lp),
            _ => None,
        }
    }

    /// Runs an agent loop as the call of a step (or an iteration, or a branch) numbered
    /// `number`; the result is the final answer. Boxed, and `Send` by its signature: a loop's
    /// tools are calls through [`Run::invoke`], which may run a loop again.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn agent_loop<'a>(
        &'a self,
        step: &'a StepPlan,
        call: &'a CallPlan,
        agent: &'a Arc<AgentPlan>,
        lp: &'a LoopPlan,
        input: &'a Value,
        message: Option<&'a str>,
        number: StepNumber<'a>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = StepOutcome> + Send + 'a>> {
        Box::pin(self.run_loop(step, call, agent, lp, input, message, number))
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_loop(
        &self,
        step: &StepPlan,
        call: &CallPlan,
        agent: &Arc<AgentPlan>,
        lp: &LoopPlan,
        input: &Value,
        message: Option<&str>,
        number: StepNumber<'_>,
    ) -> StepOutcome {
        let base = number.to_string();
        let name = &call.agent.name;
        let who = format!("agent loop `{name}`");
        if let Err(e) = Self::check_input(call, input) {
            return StepOutcome::err(e);
        }
        // A flow test's mock model starts no MCP server: calls of their tools are refused.
        let servers = !matches!(agent.spec, AgentPlanSpec::Mock(_));
        let tools = match self.loop_tools(name, lp, servers).await {
            Ok(t) => t,
            Err(e) => return StepOutcome::err(e),
        };
        let definitions = tools.definitions();
        let notes_cell = std::sync::Mutex::new(None);
        let model = match &agent.spec {
            AgentPlanSpec::Mock(m) => Model::Mock(m),
            AgentPlanSpec::Llm(l) => match self.llm_agent(agent, l, &notes_cell) {
                Ok(a) => Model::Llm(a),
                Err(e) => return StepOutcome::err(e),
            },
            _ => unreachable!("an agent loop's model is an llm agent or a mock"),
        };
        let mut transcript: Vec<Value> = match &model {
            Model::Llm(m) => match m
                .loop_messages(input, &self.loop_cx(step, call, message, &base, 0))
                .await
            {
                Ok(t) => t,
                Err(e) => return StepOutcome::err(e),
            },
            Model::Mock(_) => vec![json!({"role": "user", "content": input.to_string()})],
        };
        let mut tally = Tally::default();
        let mut repairs = 0u64;
        let wrap_after = (lp.max_iterations * 7).div_ceil(10);
        let mut wrapped = false;
        let schema = agent
            .result_schema
            .as_deref()
            .or(call.agent.result_schema.as_deref());
        // The answer is asked for in the schema's form unless the loop ends at a tool (whose
        // result is the answer); one call at a time when only one may run at once.
        let form = (
            schema.filter(|_| lp.until_tool.is_none()),
            lp.max_parallel_tools == 1,
        );
        for turn_no in 1..=lp.max_iterations {
            if self.tree.pause.is_cancelled() {
                let mut o = StepOutcome::ok(None);
                o.stop = Some(RunStatus::Running);
                o.usage = tally.usage;
                return o;
            }
            if !wrapped && turn_no > wrap_after && lp.max_iterations > 1 {
                wrapped = true;
                transcript.push(json!({
                    "role": "system",
                    "content": format!(
                        "You have used {} of your {} turns. Stop calling tools and give your final answer now.",
                        turn_no - 1,
                        lp.max_iterations
                    ),
                }));
            }
            let num = format!("{base}.t{turn_no}");
            let started = record::Stamp::now();
            // The turn: recorded before, or asked now.
            let recorded = self.replay.as_ref().and_then(|r| r.finished(&num, None));
            let turn = match recorded {
                Some(rec) => {
                    self.state.next_call(name);
                    tally.usage.add(rec.usage);
                    self.tree.spend(&rec.usage, true);
                    if let Some(n) = &rec.answers {
                        llm::merge_notes(&mut tally.notes, n.clone());
                    }
                    match (&rec.error, &rec.result) {
                        (Some(e), _) => Err(e.clone()),
                        (None, Some(m)) => Ok(Turn::from_message((**m).clone())),
                        (None, None) => Err(StepError::new(
                            ErrorKind::Agent,
                            format!("{who}: turn {turn_no} has no record of its message"),
                        )),
                    }
                }
                None => {
                    if let Err(e) = self.check_budget().await {
                        return tally.close(StepOutcome::err(e), &transcript, turn_no - 1);
                    }
                    // A model turn has no `started` record: what came before it (the last
                    // turn and its tool calls, queued) is committed before it is paid for.
                    if let Err(e) = self.barrier().await {
                        return tally.close(StepOutcome::err(e), &transcript, turn_no - 1);
                    }
                    let (turn, used, turn_notes, attempts) = self
                        .ask(&model, &transcript, &definitions, form, step, call, message, &num)
                        .await;
                    tally.usage.add(used);
                    if let Some(n) = &turn_notes {
                        llm::merge_notes(&mut tally.notes, n.clone());
                    }
                    let mut o = match &turn {
                        Ok(t) => StepOutcome::ok(Some(t.message.clone())),
                        Err(e) => StepOutcome::err(e.clone()),
                    };
                    o.usage = used;
                    o.attempts = attempts;
                    o.answers = turn_notes;
                    tracing::debug!(
                        run_id = %self.record.id, step = %step.id, number = %num,
                        calls = turn.as_ref().map_or(0, |t| t.calls.len()),
                        error = %o.error.as_ref().map(|e| e.to_string()).unwrap_or_default(),
                        input_tokens = used.input_tokens, output_tokens = used.output_tokens,
                        "model turn"
                    );
                    self.record_part(step, num.clone(), "turn", None, None, &mut o, started)
                        .await;
                    if let Some(e) = o.error.filter(|_| turn.is_ok()) {
                        // The turn's record could not be written.
                        Err(e)
                    } else {
                        turn
                    }
                }
            };
            let turn = match turn {
                Ok(t) => t,
                Err(e) => {
                    return tally.close(StepOutcome::err(e), &transcript, turn_no);
                }
            };
            transcript.push(turn.message.clone());
            if turn.calls.is_empty()
                && let Some(until) = &lp.until_tool
            {
                // A loop that ends at a tool ends only there: a text answer is not taken.
                if turn_no == lp.max_iterations {
                    break;
                }
                let request = format!("Call `{until}` to finish; an answer in text is not taken.");
                transcript.push(json!({"role": "user", "content": request}));
                continue;
            }
            if turn.calls.is_empty() {
                // The final answer (a mock's is the value itself).
                let answer = match &model {
                    Model::Mock(_) => match turn.message.get("answer") {
                        Some(v) => match schema.map(|s| s.check(v)) {
                            Some(Err(v)) => Err((
                                String::new(),
                                StepError::new(
                                    ErrorKind::InvalidOutput,
                                    format!("{who}: the answer does not match `result_schema` {v}"),
                                ),
                            )),
                            _ => Ok(v.clone()),
                        },
                        None => Ok(Value::Null),
                    },
                    Model::Llm(_) => llm::final_answer(
                        &who,
                        &turn.content,
                        turn.finish_reason.as_deref(),
                        schema,
                        repairs + 1,
                    ),
                };
                match answer {
                    Ok(v) => {
                        let o = StepOutcome::ok(Some(v));
                        return tally.close(o, &transcript, turn_no);
                    }
                    Err((request, e)) => {
                        let Model::Llm(m) = &model else {
                            return tally.close(StepOutcome::err(e), &transcript, turn_no);
                        };
                        if repairs >= m.plan.repair_attempts || turn_no == lp.max_iterations {
                            return tally.close(StepOutcome::err(e), &transcript, turn_no);
                        }
                        repairs += 1;
                        transcript.push(json!({"role": "user", "content": request}));
                        continue;
                    }
                }
            }
            // Calls that need a human first stop the turn before any of its calls runs.
            let decisions = match self.approvals(step, name, &turn, &num, &tools).await {
                Ok(d) => d,
                Err(o) => return tally.close(o, &transcript, turn_no),
            };
            // Started in the model's order, at most `max_parallel_tools` at once, and
            // answered in that order whatever order they finish in.
            let mut calls = Vec::with_capacity(turn.calls.len());
            for (i, c) in turn.calls.iter().enumerate() {
                let decision = decisions.get(i).and_then(Option::as_ref);
                calls.push(self.tool_call(step, &tools, c, format!("{num}.{}", i + 1), decision));
            }
            let ends: Vec<CallEnd> = stream::iter(calls)
                .buffered(lp.max_parallel_tools)
                .collect()
                .await;
            let mut until_result = None;
            let mut stop = None;
            for (c, end) in turn.calls.iter().zip(ends) {
                tally.tool_calls += 1;
                if end.failed {
                    tally.tool_failures += 1;
                }
                tally.usage.add(end.usage);
                if stop.is_none() {
                    stop = end.stop;
                }
                transcript.push(json!({"role": "tool", "tool_call_id": c.id, "content": end.content}));
                if lp.until_tool.as_deref() == Some(c.name.as_str())
                    && until_result.is_none()
                    && let Some(r) = end.result
                {
                    until_result = Some(r);
                }
            }
            if let Some((status, e)) = stop {
                let mut o = StepOutcome::err(e);
                o.stop = status;
                return tally.close(o, &transcript, turn_no);
            }
            if let Some(r) = until_result {
                let o = match schema.map(|s| s.check(&r)) {
                    Some(Err(v)) => StepOutcome::err(StepError::new(
                        ErrorKind::InvalidOutput,
                        format!(
                            "{who}: the result of `{}` does not match `result_schema` {v}",
                            lp.until_tool.as_deref().unwrap_or("")
                        ),
                    )),
                    _ => StepOutcome::shared(Some(r)),
                };
                return tally.close(o, &transcript, turn_no);
            }
        }
        let o = StepOutcome::err(StepError::new(
            ErrorKind::Limit,
            format!(
                "{who} reached `max_iterations` ({}) without a final answer",
                lp.max_iterations
            ),
        ));
        tally.close(o, &transcript, lp.max_iterations)
    }

    /// One model turn, retried as the step's `retry` says; its tokens and cost count against
    /// the budget as it finishes. `form` is what the request asks of the answer: the
    /// `result_schema` to ask for, and whether calls come one at a time.
    #[allow(clippy::too_many_arguments)]
    async fn ask(
        &self,
        model: &Model<'_>,
        transcript: &[Value],
        definitions: &[Value],
        form: (Option<&Schema>, bool),
        step: &StepPlan,
        call: &CallPlan,
        message: Option<&str>,
        num: &str,
    ) -> (Result<Turn, StepError>, Usage, Option<Value>, u32) {
        if let Some(why) = &self.tree.resume.lost {
            return (
                Err(StepError::new(ErrorKind::Lost, why.clone())),
                Usage::default(),
                None,
                1,
            );
        }
        let name = &call.agent.name;
        let mut usage = Usage::default();
        let mut notes = Value::Null;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let call_index = self.state.next_call(name);
            let mut c = self.loop_cx(step, call, message, num, call_index);
            c.attempt = attempt;
            let (turn, used, turn_notes) = match model {
                Model::Llm(m) => {
                    let r = Box::pin(m.turn(transcript, definitions, form.0, form.1, &c)).await;
                    (r.turn, r.usage, r.notes)
                }
                Model::Mock(m) => {
                    use crate::agents::Agent as _;
                    let input = Value::Array(transcript.to_vec());
                    let r = agents::mock::MockAgent(m).call(&input, c).await;
                    (r.and_then(|v| mock_turn(v, num)), Usage::default(), None)
                }
            };
            self.tree.spend(&used, false);
            usage.add(used);
            if let Some(n) = turn_notes {
                llm::merge_notes(&mut notes, n);
            }
            let notes = || (!notes.is_null()).then(|| notes.clone());
            match turn {
                Ok(t) => return (Ok(t), usage, notes(), attempt),
                Err(e) => {
                    let policy = &call.retry;
                    let again = attempt < policy.attempts
                        && policy.on.iter().any(|k| k == e.kind.as_str())
                        && !self.tree.cancel.is_cancelled()
                        && self.check_budget().await.is_ok();
                    if !again {
                        return (Err(e), usage, notes(), attempt);
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff(policy, attempt)) => {}
                        _ = self.tree.cancel.cancelled() => return (Err(e), usage, notes(), attempt),
                    }
                }
            }
        }
    }

    /// The context of a model turn numbered `num`.
    fn loop_cx<'c>(
        &'c self,
        step: &'c StepPlan,
        call: &CallPlan,
        message: Option<&'c str>,
        num: &'c str,
        call_index: u64,
    ) -> CallContext<'c> {
        CallContext {
            run_id: &self.record.id,
            step: &step.id,
            step_number: StepNumber::of(num),
            attempt: 1,
            message,
            context: &self.tree.context,
            cancel: &self.tree.cancel,
            timeout: call.timeout,
            call_index,
            now: Some(self.tree.now),
            files: &self.turn_files,
        }
    }

    /// The decisions for the calls of `turn` that need approval (by the call's place; `None`
    /// for the others), or the outcome that stops the run to ask for them.
    async fn approvals(
        &self,
        step: &StepPlan,
        agent: &str,
        turn: &Turn,
        num: &str,
        tools: &Tools<'_>,
    ) -> Result<Vec<Option<Decision>>, StepOutcome> {
        let pending: Vec<usize> = turn
            .calls
            .iter()
            .enumerate()
            .filter(|(_, c)| tools.offered(&c.name).is_some_and(|o| o.approve))
            .map(|(i, _)| i)
            .collect();
        let mut out: Vec<Option<Decision>> = turn.calls.iter().map(|_| None).collect();
        if pending.is_empty() {
            return Ok(out);
        }
        let part = format!("{num}.approval");
        let earlier = self.replay.as_ref().and_then(|r| r.part(&part, None));
        let given = match earlier {
            Some(rec) if rec.status == StepStatus::Succeeded => {
                Some(rec.result.as_deref().cloned().unwrap_or(Value::Null))
            }
            // The decision given to `resume` answers the stop the tree waits at (its latest,
            // the one `resume` checked the decision against and `runs show` names) and no
            // other: another approval left waiting (a foreach's other iteration, another child
            // run) stops again to be asked on its own, rather than take a decision made for
            // other calls.
            Some(rec) if rec.status == StepStatus::Interrupted => match self.given(&part, rec.iteration) {
                Some(super::inbox::Given::Decision(d)) => Some(d),
                // Expired without a decision (SPEC §15): the calls are rejected, the model
                // told, with `on_expire: reject`; otherwise the step fails.
                Some(super::inbox::Given::Expired) => match loop_of_step(step) {
                    Some(lp) if lp.reject_on_expire => Some(Value::Array(
                        pending
                            .iter()
                            .map(|_| json!({"reject": "the approval expired without a decision"}))
                            .collect(),
                    )),
                    _ => {
                        return Err(StepOutcome::err(StepError::new(
                            ErrorKind::Timeout,
                            format!(
                                "the approval of the calls agent loop `{agent}` of step `{}` proposed expired without a decision",
                                step.id
                            ),
                        )));
                    }
                },
                None => None,
            },
            _ => None,
        };
        let proposed: Vec<Value> = pending
            .iter()
            .map(|&i| {
                let c = &turn.calls[i];
                let arguments = crate::json::from_str(&c.arguments)
                    .unwrap_or_else(|_| Value::String(c.arguments.clone()));
                json!({"id": c.id, "tool": c.name, "arguments": arguments})
            })
            .collect();
        let Some(given) = given else {
            // Stop and ask: the record holds the proposed calls, in the model's order, each
            // with the schema of its arguments (for an edit), and when the question expires.
            let asked: Vec<Value> = pending
                .iter()
                .zip(&proposed)
                .map(|(&i, p)| {
                    let mut p = p.clone();
                    if let Some(o) = tools.offered(&turn.calls[i].name) {
                        p["input_schema"] = o.tool.parameters.clone();
                    }
                    p
                })
                .collect();
            // The part's record is stamped now, and its expiry counts from that stamp.
            let started = record::Stamp::now();
            let expires_at = loop_of_step(step).and_then(|lp| lp.approve_expires).map(|d| {
                started
                    .ms()
                    .saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            });
            let mut o = StepOutcome::ok(Some(json!({
                "prompt": format!(
                    "agent loop `{agent}` of step `{}` wants to call {}: approve, edit or reject each",
                    step.id,
                    {
                        // Each tool once, in the order first proposed.
                        let mut names: Vec<String> = Vec::new();
                        for p in &proposed {
                            let n = format!("`{}`", p["tool"].as_str().unwrap_or(""));
                            if !names.contains(&n) {
                                names.push(n);
                            }
                        }
                        names.join(", ")
                    }
                ),
                "agent": agent,
                "calls": asked,
            })));
            if let (Some(at), Some(Value::Object(r))) = (expires_at, o.result.as_deref().cloned()) {
                let mut r = r;
                r.insert("expires_at".into(), at.into());
                o.result = Some(std::sync::Arc::new(Value::Object(r)));
            }
            o.stop = Some(RunStatus::Interrupted);
            self.record_part(step, part, "approval", None, None, &mut o, started)
                .await;
            o.result = None;
            if o.error.is_none() {
                o.stop = Some(RunStatus::Interrupted);
            }
            return Err(o);
        };
        let decisions = match parse_decisions(&given, pending.len()) {
            Ok(d) => d,
            Err(why) => return Err(StepOutcome::err(StepError::new(ErrorKind::Agent, why))),
        };
        if earlier.is_some_and(|r| r.status == StepStatus::Interrupted) {
            // The decision is on record before any call it allows is made.
            let mut o = StepOutcome::ok(Some(given.clone()));
            let started = record::Stamp::now();
            self.record_part(
                step,
                part,
                "approval",
                None,
                Some(Value::Array(proposed)),
                &mut o,
                started,
            )
            .await;
            if let Some(e) = o.error {
                return Err(StepOutcome::err(e));
            }
        }
        for (i, d) in pending.into_iter().zip(decisions) {
            out[i] = Some(d);
        }
        Ok(out)
    }

    /// One tool call, numbered `num` (`3.t2.1`): refused, rejected or answered with an error
    /// as a `tool` message; otherwise the tool's agent called with its own retries and
    /// timeout, and recorded.
    #[allow(clippy::too_many_arguments)]
    async fn tool_call(
        &self,
        step: &StepPlan,
        tools: &Tools<'_>,
        c: &ToolCall,
        num: String,
        decision: Option<&Decision>,
    ) -> CallEnd {
        let started = record::Stamp::now();
        let failure = |content: String| CallEnd {
            content,
            result: None,
            usage: Usage::default(),
            stop: None,
            failed: true,
        };
        let Some(Offered { tool, .. }) = tools.offered(&c.name) else {
            let why = match tools.refused.iter().find(|r| r.tool.name == c.name) {
                _ if c.name.is_empty() => format!(
                    "the call names no tool (its `function.name` is missing or not a string); the tools are: {}",
                    tools.names()
                ),
                Some(r) => {
                    // Called after all: a refusal on record (a flow test's unmocked agent).
                    let _ = self.agent_for(&r.tool.call, true);
                    format!("tool `{}` is not available here: {}", c.name, r.why)
                }
                None if let Some(server) = tools.unlisted.iter().find(|s| {
                    c.name
                        .strip_prefix(**s)
                        .is_some_and(|rest| rest.starts_with("__"))
                }) =>
                {
                    self.state.refuse(&c.name);
                    format!(
                        "tool `{}` of MCP server `{server}` is not mocked: a flow test starts no MCP server",
                        c.name
                    )
                }
                None => format!("unknown tool `{}`; the tools are: {}", c.name, tools.names()),
            };
            self.record_refusal(step, &num, c, &why, started).await;
            return failure(why);
        };
        let arguments = match decision {
            Some(Decision::Reject(why)) => {
                let text = format!("the call of `{}` was rejected: {why}", c.name);
                self.record_refusal(step, &num, c, &text, started).await;
                return failure(text);
            }
            Some(Decision::Edit(args)) => Ok(args.clone()),
            _ if c.arguments.trim().is_empty() => Ok(json!({})),
            _ => crate::json::from_str(&c.arguments).map_err(|e| e.to_string()),
        };
        let arguments = match arguments {
            Ok(a) => a,
            Err(e) => {
                let text = format!("the arguments of `{}` are not valid JSON: {e}", c.name);
                self.record_refusal(step, &num, c, &text, started).await;
                return failure(text);
            }
        };
        if let Some(schema) = &tool.call.agent.input_schema
            && let Err(v) = schema.check(&arguments)
        {
            let text = format!("the arguments of `{}` do not match its parameters {v}", c.name);
            self.record_refusal(step, &num, c, &text, started).await;
            return failure(text);
        }
        let mut o =
            Box::pin(self.invoke(step, &tool.call, &arguments, None, StepNumber::of(&num), "tool")).await;
        let interrupted = o.stop == Some(RunStatus::Interrupted);
        let result = o.result.clone();
        let error = o.error.clone();
        let mut end = CallEnd {
            content: String::new(),
            result: None,
            usage: o.usage,
            stop: None,
            failed: false,
        };
        match error {
            None => {
                let r = result.unwrap_or_else(|| Arc::new(Value::Null));
                end.content = match (&tool.call.agent.spec, &*r) {
                    // An MCP tool's result: its text, else its structured value.
                    (AgentPlanSpec::Mcp(_), r) => mcp_text(r),
                    // A string is the text itself; any other value, its JSON.
                    (_, Value::String(s)) => s.clone(),
                    (_, v) => serde_json::to_string(v).expect("JSON values serialize"),
                };
                end.result = Some(r);
            }
            Some(e) if interrupted => end.stop = Some((Some(RunStatus::Interrupted), e)),
            Some(e) if e.kind == ErrorKind::Limit || e.kind == ErrorKind::Cancelled => {
                end.stop = Some((None, e))
            }
            Some(e) if e.kind == ErrorKind::Depth => {
                end.failed = true;
                end.content = format!(
                    "{}. Do this task yourself instead of delegating it further.",
                    e.message
                );
            }
            // An MCP tool's `is_error` result: what it says is the tool message.
            Some(e) if let Some(text) = mcp_error_text(&tool.call.agent.spec, &e) => {
                end.failed = true;
                end.content = text;
            }
            Some(e) => {
                end.failed = true;
                end.content = format!(
                    "tool `{}` failed (kind `{}`): {}",
                    c.name,
                    e.kind.as_str(),
                    e.message
                );
            }
        }
        if let Some(Decision::Edit(args)) = decision
            && end.stop.is_none()
        {
            // The model's own message still holds the arguments it proposed: its tool message
            // says the call ran with others, lest it take the proposed ones as done.
            end.content = format!(
                "the arguments were edited before the call ran: {}; the result: {}",
                serde_json::to_string(args).expect("JSON values serialize"),
                end.content
            );
        }
        if end.failed {
            // The failed call's record keeps what the model was told (`runs show` prints it).
            told(&mut o, &end.content);
        }
        named(&mut o, c);
        tracing::debug!(
            run_id = %self.record.id, step = %step.id, number = %num, tool = %c.name,
            failed = end.failed, replayed = o.replayed, "tool call"
        );
        if !interrupted {
            self.record_part(step, num.clone(), "tool", None, Some(arguments), &mut o, started)
                .await;
        }
        // A store write that failed (this record's, or another's in the tree) fails the loop.
        if let Some(failure) = self.store_failed() {
            let e = o
                .error
                .unwrap_or_else(|| StepError::new(ErrorKind::Agent, format!("store: {failure}")));
            end.stop = Some((None, e));
        }
        end
    }

    /// The record of a call that never reached its tool (unknown, refused, bad arguments,
    /// rejected): failed, with what the model was told. Replayed runs have it already.
    async fn record_refusal(
        &self,
        step: &StepPlan,
        num: &str,
        c: &ToolCall,
        why: &str,
        started: record::Stamp,
    ) {
        if self.replay.as_ref().and_then(|r| r.finished(num, None)).is_some() {
            return;
        }
        let mut o = StepOutcome::err(StepError::new(ErrorKind::Agent, why.to_string()));
        told(&mut o, why);
        named(&mut o, c);
        let arguments = &c.arguments;
        let input = crate::json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()));
        self.record_part(step, num.to_string(), "tool", None, Some(input), &mut o, started)
            .await;
    }
}

/// What the model is told of an MCP tool's result (`{structured, content, is_error}`): the
/// text of its content (a file as `[file NAME (MEDIA_TYPE, SIZE bytes)]`), else its structured
/// value as JSON, else its content as JSON.
fn mcp_text(result: &Value) -> String {
    let texts: Vec<String> = result
        .get("content")
        .and_then(Value::as_array)
        .map(|c| {
            c.iter()
                .filter_map(|b| {
                    b.as_str()
                        .map(str::to_string)
                        .or_else(|| crate::agents::mcp::files::describe(b))
                })
                .collect()
        })
        .unwrap_or_default();
    if !texts.is_empty() {
        return texts.join("\n");
    }
    match result.get("structured") {
        Some(s) if !s.is_null() => serde_json::to_string(s).expect("JSON values serialize"),
        _ => serde_json::to_string(result.get("content").unwrap_or(&Value::Null))
            .expect("JSON values serialize"),
    }
}

/// The text of an MCP tool's `is_error` result, from its error.
fn mcp_error_text(spec: &AgentPlanSpec, e: &StepError) -> Option<String> {
    let AgentPlanSpec::Mcp(_) = spec else { return None };
    let d = e.details.as_ref()?;
    if d.get("is_error") != Some(&Value::Bool(true)) {
        return None;
    }
    d.get("text").and_then(Value::as_str).map(str::to_string)
}

/// Notes on a failed call's record what the model was told of it, as `answers.told`.
fn told(o: &mut StepOutcome, content: &str) {
    let mut notes = match o.answers.take() {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    notes.insert("told".into(), Value::String(content.to_string()));
    o.answers = Some(Value::Object(notes));
}

/// Notes on a call's record the tool the model named and the id it gave the call, as
/// `answers.tool` and `answers.call_id`: the record is the call's own, whichever process reads
/// it (its OpenTelemetry span is `execute_tool {tool}`, SPEC §13), without the turn's.
fn named(o: &mut StepOutcome, c: &ToolCall) {
    let mut notes = match o.answers.take() {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    notes.insert("tool".into(), Value::String(c.name.clone()));
    notes.insert("call_id".into(), Value::String(c.id.clone()));
    o.answers = Some(Value::Object(notes));
}

/// A mock's value as a turn: `{tool_calls: [{name, arguments}]}` calls tools (ids
/// `call_<i>`); anything else is the final answer, kept whole in the message's `answer`.
fn mock_turn(v: Value, num: &str) -> Result<Turn, StepError> {
    let Some(calls) = v.get("tool_calls") else {
        let content = serde_json::to_string(&v).expect("JSON values serialize");
        let mut t = Turn::new(content, Vec::new(), Some("stop".into()));
        t.message["answer"] = v;
        return Ok(t);
    };
    let bad = |why: String| {
        StepError::new(
            ErrorKind::Agent,
            format!(
                "the mock's turn {num}: {why} (a turn is `{{tool_calls: [{{name, arguments}}]}}` or the final answer)"
            ),
        )
    };
    let calls = calls
        .as_array()
        .ok_or_else(|| bad("`tool_calls` is not a list".into()))?;
    let calls = calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let name = c
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("tool call {} has no `name`", i + 1)))?;
            let arguments = match c.get("arguments") {
                None => "{}".to_string(),
                Some(Value::String(s)) => s.clone(),
                Some(a) => a.to_string(),
            };
            Ok(ToolCall {
                id: format!("call_{}", i + 1),
                name: name.to_string(),
                arguments,
            })
        })
        .collect::<Result<Vec<_>, StepError>>()?;
    Ok(Turn::new(String::new(), calls, Some("tool_calls".into())))
}

/// A decision for `n` pending calls: one object (for one call) or a list of `n`, each
/// `{"approve": true}`, `{"edit": {<arguments>}}` or `{"reject": "why"}`.
pub(super) fn parse_decisions(given: &Value, n: usize) -> Result<Vec<Decision>, String> {
    let list: Vec<&Value> = match given {
        Value::Array(a) => a.iter().collect(),
        one if n == 1 => vec![one],
        _ => {
            return Err(format!(
                "the decision must be a list of {n} decisions, one for each call waiting for approval, in order"
            ));
        }
    };
    if list.len() != n {
        return Err(format!(
            "the decision lists {} decisions for {n} calls waiting for approval",
            list.len()
        ));
    }
    list.into_iter()
        .enumerate()
        .map(|(i, d)| {
            let obj = d.as_object().filter(|o| o.len() == 1);
            let at = if n > 1 { format!(" (decision {})", i + 1) } else { String::new() };
            match obj.and_then(|o| o.iter().next()) {
                Some((k, Value::Bool(true))) if k == "approve" => Ok(Decision::Approve),
                Some((k, v)) if k == "edit" => Ok(Decision::Edit(v.clone())),
                Some((k, Value::String(why))) if k == "reject" => Ok(Decision::Reject(why.clone())),
                _ => Err(format!(
                    "each decision is `{{\"approve\": true}}`, `{{\"edit\": {{<arguments>}}}}` or `{{\"reject\": \"why\"}}`{at}: got {d}"
                )),
            }
        })
        .collect()
}

/// Checks a decision for the pending `calls` (`{tool, arguments}` as the approval recorded
/// them), for `resume` before anything runs: its shape, and that edited arguments match the
/// tool's `input_schema` when the loop's plan is known.
pub fn check_decisions(given: &Value, calls: &[Value], lp: Option<&LoopPlan>) -> Result<(), String> {
    let decisions = parse_decisions(given, calls.len())?;
    for (i, (d, c)) in decisions.iter().zip(calls).enumerate() {
        let Decision::Edit(args) = d else { continue };
        let tool = c.get("tool").and_then(Value::as_str).unwrap_or("");
        let schema = lp
            .and_then(|lp| lp.tool(tool))
            .and_then(|t| t.call.agent.input_schema.as_ref());
        if let Some(schema) = schema
            && let Err(v) = schema.check(args)
        {
            let at = if calls.len() > 1 {
                format!(" (decision {})", i + 1)
            } else {
                String::new()
            };
            return Err(format!(
                "the edited arguments of `{tool}`{at} do not match its `input_schema` {v}"
            ));
        }
    }
    Ok(())
}

/// The agent loop a step runs, if its agent is one.
pub fn loop_of_step(step: &StepPlan) -> Option<&LoopPlan> {
    let agent = match &step.kind {
        StepPlanKind::Call(c) => &c.agent,
        StepPlanKind::Foreach(f) => &f.body.agent,
        StepPlanKind::While(w) => &w.body.agent,
        _ => return None,
    };
    match &agent.spec {
        AgentPlanSpec::Llm(l) => l.agent_loop.as_ref(),
        _ => None,
    }
}

/// The transcript as a record keeps it: each text and each call's arguments capped (an
/// attached image's data left out), and at most [`KEPT_MESSAGES`] messages (the first and
/// the last, with a marker between).
fn kept_transcript(messages: &[Value]) -> Value {
    let cap = |v: &Value| -> Value {
        let mut v = v.clone();
        match v.get_mut("content") {
            Some(Value::String(s)) => *s = llm::kept_within(s, KEPT_TEXT),
            // Attachments (`attach:`): text kept as text is; an image's data not at all.
            Some(Value::Array(parts)) => {
                for p in parts {
                    if let Some(Value::String(t)) = p.get_mut("text") {
                        *t = llm::kept_within(t, KEPT_TEXT);
                    }
                    if let Some(Value::String(url)) = p.pointer_mut("/image_url/url")
                        && let Some((head, data)) = url.split_once(";base64,")
                    {
                        *url = format!("{head};base64,… ({} characters not kept)", data.len());
                    }
                }
            }
            _ => {}
        }
        if let Some(Value::Array(calls)) = v.get_mut("tool_calls") {
            for c in calls {
                if let Some(Value::String(a)) = c.pointer_mut("/function/arguments") {
                    *a = llm::kept_within(a, KEPT_TEXT);
                }
            }
        }
        if let Some(obj) = v.as_object_mut() {
            obj.remove("answer");
        }
        v
    };
    if messages.len() <= KEPT_MESSAGES {
        return Value::Array(messages.iter().map(cap).collect());
    }
    let half = KEPT_MESSAGES / 2;
    let mut out: Vec<Value> = messages[..half].iter().map(cap).collect();
    out.push(json!({"role": "note", "content": format!("{} messages not kept", messages.len() - 2 * half)}));
    out.extend(messages[messages.len() - half..].iter().map(cap));
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_are_one_per_pending_call() {
        assert!(matches!(
            parse_decisions(&json!({"approve": true}), 1).unwrap()[..],
            [Decision::Approve]
        ));
        let d = parse_decisions(&json!([{"edit": {"amount": 5}}, {"reject": "no"}]), 2).unwrap();
        assert!(matches!(&d[0], Decision::Edit(v) if v == &json!({"amount": 5})));
        assert!(matches!(&d[1], Decision::Reject(w) if w == "no"));
        assert_eq!(
            parse_decisions(&json!([{"approve": true}]), 2).err().unwrap(),
            "the decision lists 1 decisions for 2 calls waiting for approval"
        );
        assert!(parse_decisions(&json!({"approve": false}), 1).is_err());
        assert!(parse_decisions(&json!({"approve": true, "edit": {}}), 1).is_err());
        assert!(parse_decisions(&json!({"approve": true}), 2).is_err());
    }

    #[test]
    fn mock_turns_are_calls_or_answers() {
        let t = mock_turn(
            json!({"tool_calls": [{"name": "kb", "arguments": {"q": 1}}, {"name": "crm"}]}),
            "3.t1",
        )
        .unwrap();
        assert_eq!(t.calls.len(), 2);
        assert_eq!(t.calls[0].arguments, r#"{"q":1}"#);
        assert_eq!(t.calls[1].arguments, "{}");
        assert_eq!(t.calls[1].id, "call_2");
        let a = mock_turn(json!({"category": "billing"}), "3.t2").unwrap();
        assert!(a.calls.is_empty());
        assert_eq!(a.message["answer"], json!({"category": "billing"}));
        assert!(mock_turn(json!({"tool_calls": [{"arguments": {}}]}), "3.t1").is_err());
    }

    #[test]
    fn transcripts_are_capped() {
        let long = "x".repeat(KEPT_TEXT + 10);
        let t = kept_transcript(&[json!({"role": "user", "content": long})]);
        assert!(
            t[0]["content"]
                .as_str()
                .unwrap()
                .ends_with("[10 more bytes not kept]")
        );
        let many: Vec<Value> = (0..KEPT_MESSAGES + 5)
            .map(|i| json!({"role": "user", "content": i.to_string()}))
            .collect();
        let t = kept_transcript(&many);
        assert_eq!(t.as_array().unwrap().len(), KEPT_MESSAGES + 1);
        assert_eq!(t[KEPT_MESSAGES / 2]["content"], "5 messages not kept");
    }
}
