//! Calling an agent: the agent after `--agent-change` and the capability check, attempts with
//! retries and backoff, the timeout of each attempt, the record of an attempt started before a
//! call with effects, `result_schema`, in-doubt attempts on resume, and dispatch by kind.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::{CallResult, Run, StepOutcome};
use crate::agents::{self, CallContext, StepNumber};
use crate::model::fmt_duration;
use crate::plan::*;
use crate::record::{self, RunStatus, StepRecord, StepStatus, Usage};
use crate::record::{ErrorKind, StepError};
use crate::store::Store;

impl<'e, S: Store> Run<'e, S> {
    /// The agent a call uses after `--agent-change`, checked against the capability set.
    pub(super) fn effective_agent(&self, call: &CallPlan) -> Result<Arc<AgentPlan>, StepError> {
        self.agent_for(call, true)
    }

    /// [`Run::effective_agent`]; with `calling` false only asks (an agent loop choosing the
    /// tools to offer): a removed agent is not counted as refused, since nothing called it.
    pub(super) fn agent_for(&self, call: &CallPlan, calling: bool) -> Result<Arc<AgentPlan>, StepError> {
        let mut agent = call.agent.clone();
        let mut kind = agent.kind();
        if let Some(changes) = self.tree.options.agent_changes.per_flow.get(&self.flow_ref.0)
            && let Some(change) = changes.get(&agent.name)
        {
            match change {
                Some(replacement) => {
                    agent = replacement.clone();
                    if !self.tree.options.agent_changes.stand_ins {
                        kind = agent.kind();
                    }
                }
                None => {
                    if calling {
                        self.state.refuse(&agent.name);
                    }
                    let why = self
                        .tree
                        .options
                        .agent_changes
                        .removed_reason
                        .as_deref()
                        .unwrap_or("removed by an agent change");
                    return Err(StepError::new(
                        ErrorKind::Capability,
                        format!("agent `{}` of flow `{}` is {why}", agent.name, self.flow.name),
                    ));
                }
            }
        }
        if let Some(allow) = &self.lineage.allow
            && !allow.contains(&kind)
        {
            let allowed: Vec<&str> = allow.iter().map(|k| k.as_str()).collect();
            return Err(StepError::new(
                ErrorKind::Capability,
                format!(
                    "agent `{}` is of kind `{}`, which is not allowed here (allowed: {})",
                    agent.name,
                    kind.as_str(),
                    if allowed.is_empty() {
                        "none".to_string()
                    } else {
                        allowed.join(", ")
                    }
                ),
            ));
        }
        Ok(agent)
    }

    /// A call that finished before a resume: its record stands in for it. Its calls still
    /// count, so that scripted agents continue where they were, and what it cost still counts
    /// against the budget.
    pub(super) fn replayed(&self, call: &CallPlan, rec: &StepRecord) -> StepOutcome {
        for _ in 0..rec.attempt {
            self.state.next_call(&call.agent.name);
        }
        let mut o = match &rec.error {
            Some(e) => StepOutcome::err(e.clone()),
            None => StepOutcome::shared(rec.result.clone()),
        };
        o.attempts = rec.attempt;
        o.usage = rec.usage;
        self.tree.spend(&rec.usage, true);
        o.child_run = rec.child_run.clone();
        o.replayed = true;
        o.files = rec.files.clone();
        o
    }

    /// Calls an agent with retries and per-attempt timeouts; returns its result, not mapped.
    /// `part` is the kind its records have: `agent`, `iteration` or `branch`.
    /// A run given up as `lost` ([`ResumeOptions::lost`]) makes no call: the outcome that
    /// fails it.
    ///
    /// [`ResumeOptions::lost`]: crate::runtime::resume::ResumeOptions::lost
    pub(super) fn lost(&self) -> Option<StepOutcome> {
        let why = self.tree.resume.lost.as_ref()?;
        let mut o = StepOutcome::err(StepError::new(ErrorKind::Lost, why.clone()));
        o.stop = Some(RunStatus::Failed);
        Some(o)
    }

    /// Calls the agent of `call` with `input` (its retries, its replay on resume): the
    /// `file()` references of an input mapping read and stored first, unless the step
    /// replays.
    pub(super) async fn invoke(
        &self,
        step: &StepPlan,
        call: &CallPlan,
        input: &Value,
        message: Option<&str>,
        number: StepNumber<'_>,
        part: &'static str,
    ) -> StepOutcome {
        // Only an input mapping evaluates `file()`; a step that replays read its files before.
        let reads_files = matches!(call.input, InputPlan::Map(_))
            && self
                .replay
                .as_ref()
                .and_then(|r| r.finished(number.step, number.iteration))
                .is_none();
        if reads_files {
            match self.input_files(input, number).await {
                Err(e) => return StepOutcome::err(e),
                Ok(Some((doc, files))) => {
                    let mut o = self.invoke_agent(step, call, &doc, message, number, part).await;
                    if o.error.is_none() && !o.replayed {
                        // Made by this step, before what its call made.
                        o.files.splice(0..0, files);
                    }
                    o.resolved_input = Some(doc);
                    return o;
                }
                Ok(None) => {}
            }
        }
        self.invoke_agent(step, call, input, message, number, part).await
    }

    async fn invoke_agent(
        &self,
        step: &StepPlan,
        call: &CallPlan,
        input: &Value,
        message: Option<&str>,
        number: StepNumber<'_>,
        part: &'static str,
    ) -> StepOutcome {
        if let AgentPlanSpec::Llm(LlmPlan {
            agent_loop: Some(_), ..
        }) = &call.agent.spec
        {
            // An agent loop's turns and tool calls have records of their own; the step's
            // stands in only once it finished.
            if let Some(rec) = self
                .replay
                .as_ref()
                .and_then(|r| r.finished(number.step, number.iteration))
            {
                // Each of its turns was a call of the loop's agent: a scripted model
                // continues after them.
                let turns = rec
                    .answers
                    .as_ref()
                    .and_then(|a| a.get("turns"))
                    .and_then(Value::as_u64)
                    .unwrap_or(1);
                for _ in 1..turns {
                    self.state.next_call(&call.agent.name);
                }
                return self.replayed(call, rec);
            }
            let agent = match self.effective_agent(call) {
                Ok(a) => a,
                Err(e) => return StepOutcome::err(e),
            };
            if let Some(lp) = Self::loop_of(call, &agent, self.tree.options.agent_changes.stand_ins) {
                return self
                    .agent_loop(step, call, &agent, lp, input, message, number)
                    .await;
            }
        }
        let mut attempt = 0u32;
        // Attempts that stopped to ask a human (an approval before the call, a question its
        // MCP server asked during it): on record, but no failure, so no part of `retry`.
        let mut asked = 0u32;
        if let Some(rec) = self
            .replay
            .as_ref()
            .and_then(|r| r.part(number.step, number.iteration))
        {
            match rec.status {
                StepStatus::Succeeded | StepStatus::Failed => return self.replayed(call, rec),
                StepStatus::Started | StepStatus::Interrupted => {
                    // An attempt started and never finished: it may have had its effect,
                    // unless the engine abandoned it to ask a human (an approval, or what its
                    // MCP server asked).
                    let stopped_to_ask = self.stopped_to_ask(number);
                    if !(call.idempotent
                        || self.tree.resume.retry_in_doubt
                        || stopped_to_ask
                        || Self::mcp_idempotent(call).await)
                    {
                        let mut o = StepOutcome::err(
                            StepError::new(
                                ErrorKind::InDoubt,
                                format!(
                                    "step `{}` ({number}) started attempt {} and never finished, and it is not \
                                     idempotent: it may have had its effect. \
                                     Resume with --retry-in-doubt to call it again",
                                    step.id, rec.attempt
                                ),
                            )
                            .with_details(serde_json::json!({"number": number.to_string(), "attempt": rec.attempt})),
                        );
                        o.attempts = rec.attempt;
                        o.stop = Some(RunStatus::Interrupted);
                        return o;
                    }
                    // The lost attempt was a call: it counts, and stays on record as started;
                    // the call made now is the next attempt, with the same idempotency key.
                    for _ in 0..rec.attempt {
                        self.state.next_call(&call.agent.name);
                    }
                    attempt = rec.attempt;
                    if stopped_to_ask {
                        asked = rec.attempt;
                    }
                }
            }
        }
        if let Some(o) = self.lost() {
            return o;
        }
        let agent = match self.effective_agent(call) {
            Ok(a) => a,
            Err(e) => return StepOutcome::err(e),
        };
        // The input document the agent says it takes (SPEC §6.3), checked before each call.
        if let Err(e) = Self::check_input(call, input) {
            return StepOutcome::err(e);
        }
        // A plain step's MCP call that needs a human's approval waits for it (an agent loop's
        // calls are approved by the loop, before they get here).
        let approved;
        let input = match &agent.spec {
            AgentPlanSpec::Mcp(m) if part != "tool" && super::loop_tools::mcp_needs_approval(m).await => {
                let tool = format!("{}.{}", m.server.name, m.tool);
                match self.approve_call(step, number, &agent.name, &tool, input).await {
                    super::approve::Approved::Call(v) => {
                        approved = v;
                        &approved
                    }
                    super::approve::Approved::Done(o) => return *o,
                }
            }
            _ => input,
        };
        let policy = &call.retry;
        let effects = has_effects(&agent, &self.engine.natives);
        // Tokens and cost of every attempt, failed ones included.
        let mut used = Usage::default();
        loop {
            attempt += 1;
            // A spent budget stops new calls, retries included.
            if let Err(e) = self.check_budget().await {
                let mut o = StepOutcome::err(e);
                o.usage = used;
                o.attempts = attempt.saturating_sub(1).max(1);
                o.answers = self.take_answers(number);
                return o;
            }
            let result = self
                .attempt(step, call, &agent, input, message, number, attempt, part)
                .await;
            let (mut o, retry) = match result {
                Ok((value, usage, child)) => {
                    let mut o = StepOutcome::ok(Some(value));
                    used.add(usage);
                    o.child_run = child;
                    o.files = self.take_made(number);
                    (o, None)
                }
                Err((e, usage, child, interrupted)) => {
                    // What the call made before it failed (a child run's) is no file of it.
                    self.take_made(number);
                    // An agent may say that asking again cannot help (an HTTP 4xx), or how
                    // long to wait first (`Retry-After`).
                    let hint = |k: &str| e.details.as_ref().and_then(|d| d.get(k));
                    let permanent = hint("retryable").and_then(Value::as_bool) == Some(false);
                    let wait_at_least = hint("retry_after_ms")
                        .and_then(Value::as_u64)
                        .map_or(Duration::ZERO, Duration::from_millis);
                    let retryable = !permanent && policy.on.iter().any(|k| k == e.kind.as_str());
                    let again = retryable
                        && !interrupted
                        && attempt - asked < policy.attempts
                        && !self.tree.cancel.is_cancelled();
                    let mut o = StepOutcome::err(e);
                    used.add(usage);
                    o.child_run = child;
                    if interrupted {
                        o.stop = Some(RunStatus::Interrupted);
                    }
                    (
                        o,
                        again.then(|| backoff(policy, attempt - asked).max(wait_at_least)),
                    )
                }
            };
            o.usage = used;
            o.attempts = attempt;
            o.effects = effects;
            let Some(wait) = retry else {
                o.answers = self.take_answers(number);
                return o;
            };
            tracing::info!(
                run_id = %self.record.id, step = %step.id, number = %number, attempt,
                error = %o.error.as_ref().map(|e| e.to_string()).unwrap_or_default(),
                wait_ms = wait.as_millis() as u64, "retry"
            );
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.tree.cancel.cancelled() => {
                    o.answers = self.take_answers(number);
                    return o;
                }
            }
        }
    }

    /// What the `llm` calls of step `number` put on its record, over all its attempts.
    fn take_answers(&self, number: StepNumber<'_>) -> Option<Value> {
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&number.to_string())
    }

    /// One attempt: the call under its timeout, then the result schema.
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        step: &StepPlan,
        call: &CallPlan,
        agent: &Arc<AgentPlan>,
        input: &Value,
        message: Option<&str>,
        number: StepNumber<'_>,
        attempt: u32,
        part: &'static str,
    ) -> CallResult {
        if has_effects(agent, &self.engine.natives) {
            // SPEC §7.3: the attempt is on record before the call can have its effect.
            let rec = || StepRecord {
                run_id: self.record.id.clone(),
                number: number.step.to_string(),
                step: step.id.clone(),
                kind: part.to_string(),
                attempt,
                status: StepStatus::Started,
                iteration: number.iteration,
                iterations: None,
                input: None,
                result: None,
                changes: Vec::new(),
                violations: Vec::new(),
                error: None,
                started_at: record::now_ms(),
                finished_at: None,
                started_ns: None,
                finished_ns: None,
                usage: Usage::default(),
                child_run: None,
                route: None,
                answers: None,
                files: Vec::new(),
            };
            if let Err(e) = self.record(rec).await {
                return Err((e, Usage::default(), None, false));
            }
        }
        let call_index = self.state.next_call(&agent.name);
        // An agent that holds resources of its own (a child process) gets a token of its own,
        // cancelled when the attempt times out; the others stop when their future is dropped,
        // and share the run's token.
        let own_token = holds_resources(agent).then(|| self.tree.cancel.child_token());
        // What an earlier attempt of this call made is not this attempt's.
        self.take_made(number);
        let files = crate::files::FileSink::new(self.engine.store.blobs(), self.file_limits.clone());
        let cx = CallContext {
            run_id: &self.record.id,
            step: &step.id,
            step_number: number,
            attempt,
            message,
            context: &self.tree.context,
            cancel: own_token.as_ref().unwrap_or(&self.tree.cancel),
            timeout: call.timeout,
            call_index,
            now: Some(self.tree.now),
            files: &files,
        };
        let call_future = self.dispatch(step, agent, input, cx, number);
        // A call that never waits finishes on its first poll, and a timeout never fires on
        // such a call (tokio checks the future first): no timer for it.
        // An `llm` agent times each request itself: waiting for its provider's capacity is
        // not part of the step's `timeout`.
        // An `mcp` call times itself too: progress notifications extend its timeout.
        let timed =
            if never_waits(agent) || matches!(agent.spec, AgentPlanSpec::Llm(_) | AgentPlanSpec::Mcp(_)) {
                Ok(call_future.await)
            } else {
                tokio::time::timeout(call.timeout, call_future).await
            };
        let out = match timed {
            Ok(r) => r,
            Err(_) => {
                if let Some(token) = &own_token {
                    token.cancel();
                }
                Err((
                    StepError::new(
                        ErrorKind::Timeout,
                        format!(
                            "step `{}` timed out after {} (attempt {attempt})",
                            step.id,
                            fmt_duration(call.timeout)
                        ),
                    ),
                    Usage::default(),
                    None,
                    false,
                ))
            }
        };
        // Cost counts against the tree's budget as calls finish; a child run's calls have
        // counted themselves.
        if !matches!(agent.spec, AgentPlanSpec::Flow(_)) {
            let usage = match &out {
                Ok((_, u, _)) | Err((_, u, _, _)) => u,
            };
            self.tree.spend(usage, false);
        }
        let (value, usage, child) = out?;
        let made = files.take();
        if !made.is_empty() {
            let key = number.to_string();
            let made = made
                .into_iter()
                .map(|file| crate::record::RunFile {
                    number: key.clone(),
                    file,
                })
                .collect();
            self.made_files(key.clone(), made);
        }
        if let Some(schema) = &agent.result_schema
            && let Err(v) = schema.check(&value)
        {
            return Err((
                StepError::new(
                    ErrorKind::InvalidOutput,
                    format!(
                        "the result of agent `{}` does not match its `result_schema` {v}",
                        agent.name
                    ),
                )
                .with_details(serde_json::json!({"pointer": v.pointer, "rule": v.message})),
                usage,
                child,
                false,
            ));
        }
        Ok((value, usage, child))
    }

    #[allow(clippy::result_large_err)]
    async fn dispatch(
        &self,
        step: &StepPlan,
        agent: &Arc<AgentPlan>,
        input: &Value,
        cx: CallContext<'_>,
        number: StepNumber<'_>,
    ) -> CallResult {
        use crate::agents::Agent as _;
        let plain = |r: Result<Value, StepError>| {
            r.map(|v| (v, Usage::default(), None))
                .map_err(|e| (e, Usage::default(), None, false))
        };
        match &agent.spec {
            AgentPlanSpec::Transform(t) => plain(agents::transform::TransformAgent(t).call(input, cx).await),
            AgentPlanSpec::Mock(m) => plain(agents::mock::MockAgent(m).call(input, cx).await),
            // Boxed: its future is large, and it starts a process anyway.
            AgentPlanSpec::Command(c) => {
                plain(Box::pin(agents::command::CommandAgent(c).call(input, cx)).await)
            }
            AgentPlanSpec::Flow(child) => self.child_run(*child, input.clone(), number).await,
            AgentPlanSpec::Native(n) => plain(self.engine.natives.call(&n.function, input, cx).await),
            AgentPlanSpec::Mcp(m) => Box::pin(self.mcp_call(step, m, input, cx, number)).await,
            AgentPlanSpec::Llm(l) => {
                let notes = std::sync::Mutex::new(None);
                let llm = match self.llm_agent(agent, l, &notes) {
                    Ok(a) => a,
                    Err(e) => return plain(Err(e)),
                };
                let out = Box::pin(llm.call(input, cx)).await;
                if let Some(a) = notes.into_inner().unwrap_or_else(|e| e.into_inner()) {
                    let mut all = self.answers.lock().unwrap_or_else(|e| e.into_inner());
                    let entry = all.entry(number.to_string()).or_insert(Value::Null);
                    agents::llm::merge_notes(entry, a);
                }
                match out {
                    Ok((v, usage)) => Ok((v, usage, None)),
                    Err((e, usage)) => Err((e, usage, None, false)),
                }
            }
            AgentPlanSpec::Http(h) => {
                let http = agents::http::HttpAgent {
                    name: &agent.name,
                    plan: h,
                    hosts: agents::net::Hosts(&self.lineage.hosts),
                };
                plain(Box::pin(http.call(input, cx)).await)
            }
        }
    }

    /// An `llm` agent's view of this run: its plan, its conversation and context, the hosts
    /// it may reach, the process's providers; `notes` receives what it puts on the record.
    pub(super) fn llm_agent<'a>(
        &'a self,
        agent: &'a AgentPlan,
        l: &'a LlmPlan,
        notes: &'a std::sync::Mutex<Option<Value>>,
    ) -> Result<agents::llm::LlmAgent<'a>, StepError> {
        Ok(agents::llm::LlmAgent {
            notes,
            name: &agent.name,
            plan: l,
            schema: agent.result_schema.as_deref(),
            conversation: &self.tree.options.messages,
            context: self.llm_context(l)?,
            hosts: agents::net::Hosts(&self.lineage.hosts),
            providers: agents::provider::Providers::global(),
        })
    }

    /// Whether an in-doubt `mcp` call may be sent again because its trusted server marks the
    /// tool read-only or idempotent (SPEC §6.4); its `idempotent:` list is in `call.idempotent`.
    async fn mcp_idempotent(call: &CallPlan) -> bool {
        match &call.agent.spec {
            AgentPlanSpec::Mcp(m) => agents::mcp::idempotent_by_annotations(m).await,
            _ => false,
        }
    }

    /// The input document against the agent's `input_schema` (SPEC §6.3), before a call.
    pub(super) fn check_input(call: &CallPlan, input: &Value) -> Result<(), StepError> {
        match &call.agent.input_schema {
            Some(schema) => schema.check(input).map_err(|v| {
                StepError::mapping(format!(
                    "the input of agent `{}` does not match its `input_schema` {v}",
                    call.agent.name
                ))
                .with_details(serde_json::json!({"pointer": v.pointer, "rule": v.message}))
            }),
            None => Ok(()),
        }
    }

    /// An `llm` agent's `context_paths` and their values in the payload; a singular path that
    /// matches nothing is a `mapping` error, like a mapping source.
    pub(super) fn llm_context(&self, l: &LlmPlan) -> Result<Vec<(String, Value)>, StepError> {
        l.context_paths
            .iter()
            .map(|p| {
                let v = if p.is_singular() {
                    p.get(&self.payload).cloned().ok_or_else(|| {
                        StepError::mapping(format!(
                            "context path `{}` matched nothing in the payload",
                            p.text()
                        ))
                    })?
                } else {
                    Value::Array(p.query(&self.payload).into_iter().cloned().collect())
                };
                Ok((p.text().to_owned(), v))
            })
            .collect()
    }
}
/// Whether calls of `agent` can have effects outside the run (SPEC §7.3): each attempt is
/// recorded as started before it is made.
fn has_effects(agent: &AgentPlan, natives: &agents::native::Natives) -> bool {
    match &agent.spec {
        AgentPlanSpec::Command(_)
        | AgentPlanSpec::Http(_)
        | AgentPlanSpec::Llm(_)
        | AgentPlanSpec::Mcp(_) => true,
        AgentPlanSpec::Native(n) => natives.has_effects(&n.function),
        AgentPlanSpec::Flow(_) | AgentPlanSpec::Transform(_) | AgentPlanSpec::Mock(_) => false,
    }
}

/// Whether calls of `agent` hold resources of their own that need a signal to be released
/// when the attempt times out (a child process and its group).
fn holds_resources(agent: &AgentPlan) -> bool {
    matches!(
        agent.spec,
        AgentPlanSpec::Command(_) | AgentPlanSpec::Llm(_) | AgentPlanSpec::Http(_) | AgentPlanSpec::Mcp(_)
    )
}

/// Whether calls of `agent` finish without ever waiting: computed in place (`transform`, a
/// `mock` without latency).
fn never_waits(agent: &AgentPlan) -> bool {
    match &agent.spec {
        AgentPlanSpec::Transform(_) => true,
        AgentPlanSpec::Mock(m) => m.latency.is_none_or(|d| d.is_zero()),
        _ => false,
    }
}

/// The wait before attempt `attempt + 1`: exponential from `backoff` by `factor`, capped at
/// `max_backoff`, spread by ±`jitter`.
pub fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    let base = policy.backoff.as_secs_f64() * policy.factor.powi(attempt.saturating_sub(1) as i32);
    let capped = base.min(policy.max_backoff.as_secs_f64());
    let jitter = policy.jitter.clamp(0.0, 1.0);
    let factor = if jitter > 0.0 {
        use rand::{Rng, SeedableRng};
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ u64::from(attempt).rotate_left(32));
        1.0 + rng.random_range(-jitter..=jitter)
    } else {
        1.0
    };
    Duration::from_secs_f64((capped * factor).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let p = RetryPolicy {
            attempts: 5,
            backoff: Duration::from_secs(1),
            factor: 2.0,
            max_backoff: Duration::from_secs(3),
            jitter: 0.0,
            on: vec![],
        };
        assert_eq!(backoff(&p, 1), Duration::from_secs(1));
        assert_eq!(backoff(&p, 2), Duration::from_secs(2));
        assert_eq!(backoff(&p, 3), Duration::from_secs(3));
        let j = RetryPolicy { jitter: 0.5, ..p };
        for _ in 0..100 {
            let d = backoff(&j, 1);
            assert!(
                d >= Duration::from_millis(500) && d <= Duration::from_millis(1500),
                "{d:?}"
            );
        }
    }
}
