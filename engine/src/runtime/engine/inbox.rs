//! The engine's side of the inbox (SPEC §15): every part that stops its run for a human is
//! noted as it is recorded, and when the run ends `interrupted` each becomes a pending
//! [`InboxItem`] (added before the run's end is recorded, so a run on record as waiting has
//! its items). A resumed part reads back the item's answer: the decision, or its expiry.
//! A run that ends another way closes the items it left waiting (`cancelled`).

use serde_json::{Value, json};

use super::Run;
use crate::plan::StepPlanKind;
use crate::record::inbox::{InboxItem, ItemState, item_id, shape_of};
use crate::record::{StepRecord, StepStatus};
use crate::runtime::resume::asks_human;
use crate::store::Store;
use crate::store::inbox::Answer;

/// A part that stopped its run to ask, as its record said.
#[derive(Clone, Debug)]
pub(super) struct Asked {
    number: String,
    iteration: Option<u64>,
    step: String,
    kind: String,
    result: Option<std::sync::Arc<Value>>,
    started_at: u64,
}

/// The root of a run tree, for the items of its runs.
#[derive(Clone, Debug, Default)]
pub(super) struct RootOf {
    pub id: String,
    pub batch: Option<String>,
    pub item: Option<String>,
}

/// What a waiting part is given when its run resumes.
pub(super) enum Given {
    /// A decision: given to this resume, or recorded in the inbox.
    Decision(Value),
    /// Its question expired without one.
    Expired,
}

/// The decision schema of an approval of `calls` (`[{…, input_schema}]`): for one call one
/// of `{"approve": true}`, `{"edit": <arguments>}`, `{"reject": "why"}`; for several a list
/// of them, one per call in order.
pub fn approval_schema(calls: &[Value]) -> Value {
    let one = |c: &Value| {
        let args = c
            .get("input_schema")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        json!({"oneOf": [
            {"type": "object", "properties": {"approve": {"const": true}}, "required": ["approve"], "additionalProperties": false},
            {"type": "object", "properties": {"edit": args}, "required": ["edit"], "additionalProperties": false},
            {"type": "object", "properties": {"reject": {"type": "string"}}, "required": ["reject"], "additionalProperties": false},
        ]})
    };
    let mut schema = if calls.len() == 1 {
        one(&calls[0])
    } else {
        let each: Vec<Value> = calls.iter().map(one).collect();
        json!({"type": "array", "prefixItems": each, "items": false, "minItems": calls.len(), "maxItems": calls.len()})
    };
    schema["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    schema
}

/// The JSON Schema of the input of step `step`'s agent (an approval's edited arguments):
/// its `input_schema`, else any object.
pub(super) fn agent_input_schema(step: &crate::plan::StepPlan) -> Value {
    let agent = match &step.kind {
        StepPlanKind::Call(c) => Some(&c.agent),
        StepPlanKind::Foreach(f) => Some(&f.body.agent),
        StepPlanKind::While(w) => Some(&w.body.agent),
        _ => None,
    };
    agent
        .and_then(|a| a.input_schema.as_ref())
        .map_or_else(|| json!({"type": "object"}), |s| s.value.clone())
}

/// The decision schema of an MCP server's question: a value of its schema, or a refusal.
fn elicitation_schema(schema: &Value) -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "anyOf": [
            if schema.is_null() { json!(true) } else { schema.clone() },
            {"type": "object", "properties": {"reject": {"type": "string"}}, "required": ["reject"], "additionalProperties": false},
        ]
    })
}

impl<'e, S: Store> Run<'e, S> {
    /// Notes a record about to be written: a part that stops the run to ask.
    pub(super) fn note_asked(&self, r: &StepRecord) {
        if r.status == StepStatus::Interrupted && asks_human(r) {
            let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
            asked.retain(|a| !(a.number == r.number && a.iteration == r.iteration));
            asked.push(Asked {
                number: r.number.clone(),
                iteration: r.iteration,
                step: r.step.clone(),
                kind: r.kind.clone(),
                result: r.result.clone(),
                started_at: r.started_at,
            });
        }
    }

    /// What waiting part `number` (`iteration`) is given by this resume: the decision
    /// `resume --decision` gave it, else its inbox item's answer.
    pub(super) fn given(&self, number: &str, iteration: Option<u64>) -> Option<Given> {
        if let Some(d) = self.tree.resume.decision_at(&self.record.id, number, iteration) {
            return Some(Given::Decision(d.clone()));
        }
        match self.replay.as_ref()?.answer(number, iteration)? {
            Answer::Decided(v) => Some(Given::Decision(v.clone())),
            Answer::Expired => Some(Given::Expired),
        }
    }

    /// The root of this run's tree.
    pub(super) fn root_of(&self) -> RootOf {
        match &self.lineage.root {
            Some(r) => (**r).clone(),
            None => RootOf {
                id: self.record.id.clone(),
                batch: self.record.batch.clone(),
                item: self.record.item_id.clone(),
            },
        }
    }

    /// The items of the parts this run stopped at.
    fn items(&self) -> Vec<InboxItem> {
        let asked = std::mem::take(&mut *self.asked.lock().unwrap_or_else(|p| p.into_inner()));
        let root = self.root_of();
        asked
            .into_iter()
            .map(|a| {
                let result = a.result.as_deref();
                let text = |k: &str| result.and_then(|r| r.get(k)).and_then(Value::as_str);
                let calls: Vec<Value> = result
                    .and_then(|r| r.get("calls"))
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let (question, schema) = match a.kind.as_str() {
                    "approval" => (
                        text("prompt").unwrap_or_default().to_string(),
                        approval_schema(&calls),
                    ),
                    "elicitation" => (
                        text("prompt").unwrap_or_default().to_string(),
                        elicitation_schema(result.and_then(|r| r.get("schema")).unwrap_or(&Value::Null)),
                    ),
                    _ => (
                        text("prompt").map_or_else(|| format!("interrupt step `{}`", a.step), str::to_string),
                        result
                            .and_then(|r| r.get("schema"))
                            .cloned()
                            .or_else(|| self.interrupt_schema(&a.step))
                            .unwrap_or(Value::Bool(true)),
                    ),
                };
                let shape = shape_of(&self.flow.name, &a.step, &schema);
                InboxItem {
                    id: item_id(&self.record.id, &a.number, a.iteration),
                    run_id: self.record.id.clone(),
                    root_run: root.id.clone(),
                    number: a.number,
                    iteration: a.iteration,
                    flow: self.flow.name.clone(),
                    step: a.step,
                    batch: root.batch.clone(),
                    item: root.item.clone(),
                    kind: a.kind,
                    question,
                    schema,
                    calls,
                    shape,
                    created_at: a.started_at,
                    expires_at: result.and_then(|r| r.get("expires_at")).and_then(Value::as_u64),
                    state: ItemState::Waiting,
                    settled_at: None,
                }
            })
            .collect()
    }

    /// The `schema` of interrupt step `step` of this run's flow.
    fn interrupt_schema(&self, step: &str) -> Option<Value> {
        let node = self.flow.steps.get(step)?;
        match &self.flow.step(*node)?.kind {
            StepPlanKind::Interrupt(i) => i.schema.as_ref().map(|s| s.value.clone()),
            _ => None,
        }
    }

    /// At the run's end, before it is recorded: an interrupted run adds its items; a run
    /// that ends another way after it waited closes what it left waiting. Returns the ids of
    /// the items added.
    pub(super) async fn settle_inbox(&self, interrupted: bool) -> Vec<String> {
        if !self.engine.store.keeps_steps() {
            return Vec::new();
        }
        let inbox = self.engine.store.inbox();
        if interrupted {
            let items = self.items();
            if items.is_empty() {
                return Vec::new();
            }
            // The records of the parts the items ask about are committed before the items.
            if self.barrier().await.is_err() {
                return Vec::new();
            }
            if let Err(e) = inbox.add(&items).await {
                tracing::error!(run_id = %self.record.id, error = %e, "could not add the run's questions to the inbox");
                self.store_error(&e);
                return Vec::new();
            }
            items.into_iter().map(|i| i.id).collect()
        } else {
            if self.replay.is_some()
                && let Err(e) = inbox.cancel_runs(std::slice::from_ref(&self.record.id)).await
            {
                tracing::warn!(run_id = %self.record.id, error = %e, "could not close the run's questions in the inbox");
            }
            Vec::new()
        }
    }

    /// After an interrupted run's end is recorded: whether one of the items it just added
    /// was answered meanwhile (decided or expired between the add and the end), which
    /// nothing would continue; the tree is then resumed again at once.
    pub(super) async fn answered_meanwhile(&self, added: &[String]) {
        if added.is_empty() {
            return;
        }
        match self.engine.store.inbox().answers(&self.record.id).await {
            Ok(answers) if !answers.is_empty() => {
                let any = answers
                    .keys()
                    .any(|(n, i)| added.contains(&item_id(&self.record.id, n, *i)));
                if any {
                    self.tree
                        .answered
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(run_id = %self.record.id, error = %e, "could not read the run's answers")
            }
        }
    }
}
