//! `step` and `steps` as expressions and templates see them (SPEC §3, §4, §5.1), built only
//! when one reads them.
//!
//! Most flows never read `step` or `steps`, yet every step finishing changes both. So a run
//! keeps what they are made of — per step that finished, its [`StepFacts`] and its result,
//! moved in, not copied — and builds the JSON on the first read after a change:
//!
//! - [`StepVar`] is `step` on the edges of the step that just finished: `{id, status, error,
//!   attempts, duration_ms, failed, iterations}`, built on first read;
//! - [`StepsVar`] is `steps`: `{<id>: {...the same..., result}}` for every step that finished,
//!   in the order they first finished, the latest execution of each. It keeps the object it
//!   built and, on the next read, updates only the entries of steps that finished since, so a
//!   flow reading `steps` at every step pays for the steps that changed, not for all of them.
//!
//! Both implement [`VarSource`]: [`Vars::get`](super::eval::Vars::get) asks for the value only
//! when an expression names the variable.

use std::sync::{Arc, Mutex, OnceLock};

use petgraph::stable_graph::NodeIndex;
use serde_json::{Map, Value};

use crate::expr::eval::VarSource;
use crate::plan::{FlowPlan, StepPlan};
use crate::record::StepError;
use crate::record::StepStatus;

/// What `step` says about one finished step execution, besides its result.
#[derive(Debug)]
pub struct StepFacts {
    pub status: StepStatus,
    pub error: Option<StepError>,
    pub attempts: u32,
    pub duration_ms: u64,
    pub failed: Value,
    pub iterations: Option<u64>,
}

impl StepFacts {
    /// `{id, status, error, attempts, duration_ms, failed, iterations}`.
    fn to_map(&self, id: &str) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), Value::String(id.to_owned()));
        m.insert("status".into(), Value::String(self.status.as_str().into()));
        m.insert(
            "error".into(),
            self.error.as_ref().map_or(Value::Null, StepError::to_json),
        );
        m.insert("attempts".into(), Value::from(self.attempts));
        m.insert("duration_ms".into(), Value::from(self.duration_ms));
        m.insert("failed".into(), self.failed.clone());
        m.insert(
            "iterations".into(),
            self.iterations.map_or(Value::Null, Value::from),
        );
        m
    }
}

/// `step` on the edges of the step that just finished.
pub struct StepVar<'a> {
    id: &'a str,
    facts: &'a StepFacts,
    built: OnceLock<Value>,
}

impl<'a> StepVar<'a> {
    pub fn new(id: &'a str, facts: &'a StepFacts) -> Self {
        StepVar {
            id,
            facts,
            built: OnceLock::new(),
        }
    }
}

impl std::fmt::Debug for StepVar<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepVar").field("id", &self.id).finish()
    }
}

impl VarSource for StepVar<'_> {
    fn value(&self) -> &Value {
        self.built
            .get_or_init(|| Value::Object(self.facts.to_map(self.id)))
    }
}

/// The latest execution of one step.
#[derive(Debug)]
pub struct Entry {
    node: NodeIndex,
    pub facts: StepFacts,
    /// `None` for steps without a result (`set`, ...): `null` in `steps`. Shared with the
    /// step's record ([`StepRecord::result`](crate::record::StepRecord::result)).
    pub result: Option<Arc<Value>>,
    /// Changed since `steps` was last built.
    dirty: bool,
}

impl Entry {
    pub fn result_or_null(&self) -> &Value {
        const NULL: &Value = &Value::Null;
        self.result.as_deref().unwrap_or(NULL)
    }
}

/// Up to this many entries, an entry is found by a search rather than an index.
const SCAN: usize = 16;

/// `steps` of one run.
pub struct StepsVar {
    flow: Arc<FlowPlan>,
    /// Step index (position in `steps:`) → position in `entries`; `u32::MAX`: none yet.
    /// Built once there are more than [`SCAN`] entries; before, `entries` is searched.
    position: Vec<u32>,
    /// One per step that finished, in the order they first finished.
    entries: Vec<Entry>,
    /// Positions of entries changed since `steps` was last built, each once.
    changed: Vec<u32>,
    /// The object, when built since the last change.
    built: OnceLock<Value>,
    /// The object last built, taken out of `built` at the next change, to update in place.
    stale: Mutex<Map<String, Value>>,
}

impl std::fmt::Debug for StepsVar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepsVar")
            .field("steps", &self.entries.len())
            .finish()
    }
}

impl StepsVar {
    pub fn new(flow: Arc<FlowPlan>) -> Self {
        StepsVar {
            flow,
            position: Vec::new(),
            entries: Vec::new(),
            changed: Vec::new(),
            built: OnceLock::new(),
            stale: Mutex::new(Map::new()),
        }
    }

    /// Records that `step` (at `node`) finished; returns its entry's position.
    pub fn finish(
        &mut self,
        step: &StepPlan,
        node: NodeIndex,
        facts: StepFacts,
        result: Option<Arc<Value>>,
    ) -> usize {
        if let Some(Value::Object(m)) = self.built.take() {
            // The object was read since the last change: what changed is in it now.
            *self.stale.get_mut().unwrap_or_else(|e| e.into_inner()) = m;
            for &p in &self.changed {
                self.entries[p as usize].dirty = false;
            }
            self.changed.clear();
        }
        let found = if self.position.is_empty() {
            // Few entries: a search costs less than the index.
            self.entries.iter().position(|e| e.node == node)
        } else {
            match self.position.get(step.index) {
                Some(&p) if p != u32::MAX => Some(p as usize),
                _ => None,
            }
        };
        let p = match found {
            Some(p) => {
                let e = &mut self.entries[p];
                e.facts = facts;
                e.result = result;
                p
            }
            None => {
                let p = self.entries.len();
                if self.entries.capacity() == 0 {
                    self.entries.reserve(self.flow.steps.len().clamp(1, SCAN));
                }
                self.entries.push(Entry {
                    node,
                    facts,
                    result,
                    dirty: false,
                });
                if !self.position.is_empty() || self.entries.len() > SCAN {
                    self.index_position(step.index, p);
                }
                p
            }
        };
        let e = &mut self.entries[p];
        if !e.dirty {
            e.dirty = true;
            self.changed.push(p as u32);
        }
        p
    }

    /// Records that the step at `index` is at `p` in `entries`, building the index from the
    /// entries the first time.
    fn index_position(&mut self, index: usize, p: usize) {
        if self.position.is_empty() {
            let len = self.flow.steps.len().max(index + 1);
            self.position = vec![u32::MAX; len];
            for (q, e) in self.entries.iter().enumerate() {
                if let Some(s) = self.flow.step(e.node) {
                    self.position[s.index] = q as u32;
                }
            }
        }
        if index >= self.position.len() {
            self.position.resize(index + 1, u32::MAX);
        }
        self.position[index] = u32::try_from(p).expect("fewer than 2^32 steps");
    }

    pub fn entry(&self, p: usize) -> &Entry {
        &self.entries[p]
    }

    pub fn entry_mut(&mut self, p: usize) -> &mut Entry {
        &mut self.entries[p]
    }

    fn id(&self, e: &Entry) -> &str {
        self.flow.step(e.node).map_or("end", |s| s.id.as_str())
    }

    fn entry_json(&self, e: &Entry) -> Value {
        let mut m = e.facts.to_map(self.id(e));
        m.insert("result".into(), e.result_or_null().clone());
        Value::Object(m)
    }

    /// The object: the one last built, with the entries changed since updated in place and
    /// the steps that finished for the first time since appended, in the order they did.
    fn build(&self) -> Value {
        let mut map = std::mem::take(&mut *self.stale.lock().unwrap_or_else(|e| e.into_inner()));
        let known = map.len();
        for &p in &self.changed {
            let e = &self.entries[p as usize];
            if (p as usize) < known
                && let Some(v) = map.get_mut(self.id(e))
            {
                *v = self.entry_json(e);
            }
        }
        for e in &self.entries[known..] {
            map.insert(self.id(e).to_owned(), self.entry_json(e));
        }
        Value::Object(map)
    }
}

impl VarSource for StepsVar {
    fn value(&self) -> &Value {
        self.built.get_or_init(|| self.build())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(attempts: u32) -> StepFacts {
        StepFacts {
            status: StepStatus::Succeeded,
            error: None,
            attempts,
            duration_ms: 0,
            failed: Value::Null,
            iterations: None,
        }
    }

    fn flow(ids: &[&str]) -> (Arc<FlowPlan>, Vec<NodeIndex>) {
        use crate::plan::{FlowLimits, PlanNode, StepPlanKind};
        let mut graph = petgraph::stable_graph::StableDiGraph::new();
        let mut steps = indexmap::IndexMap::new();
        let mut nodes = Vec::new();
        for (index, id) in ids.iter().enumerate() {
            let n = graph.add_node(PlanNode::Step(StepPlan {
                id: (*id).to_string(),
                index,
                kind: StepPlanKind::Succeed,
                routes: Vec::new(),
                has_next: false,
            }));
            steps.insert((*id).to_string(), n);
            nodes.push(n);
        }
        let end = graph.add_node(PlanNode::End);
        let plan = FlowPlan {
            name: "f".into(),
            hash: "h".into(),
            path: None,
            graph,
            start: nodes[0],
            end,
            steps,
            input_schema: None,
            output_schema: None,
            output_select: None,
            limits: FlowLimits::default(),
            allow: None,
            allow_hosts: None,
        };
        (Arc::new(plan), nodes)
    }

    fn keys(v: &Value) -> Vec<&str> {
        v.as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect()
    }

    #[test]
    fn steps_keep_first_finish_order_and_the_latest_execution() {
        let (plan, nodes) = flow(&["a", "b", "c"]);
        let step = |i: usize| plan.step(nodes[i]).expect("a step");
        let mut s = StepsVar::new(plan.clone());
        assert_eq!(s.value(), &Value::Object(Map::new()));
        s.finish(step(1), nodes[1], facts(1), Some(Arc::new(Value::from(1))));
        s.finish(step(0), nodes[0], facts(1), None);
        // Read, then change an entry that is in the built object, and add one.
        assert_eq!(keys(s.value()), ["b", "a"]);
        assert_eq!(s.value()["b"]["result"], Value::from(1));
        assert_eq!(s.value()["a"]["result"], Value::Null);
        s.finish(step(1), nodes[1], facts(2), Some(Arc::new(Value::from(2))));
        s.finish(step(2), nodes[2], facts(1), Some(Arc::new(Value::from(3))));
        assert_eq!(keys(s.value()), ["b", "a", "c"]);
        assert_eq!(s.value()["b"]["result"], Value::from(2));
        assert_eq!(s.value()["b"]["attempts"], Value::from(2));
        assert_eq!(s.value()["c"]["id"], Value::from("c"));
        // Changes that nobody reads in between are all there at the next read.
        s.finish(step(0), nodes[0], facts(3), Some(Arc::new(Value::from(4))));
        s.finish(step(0), nodes[0], facts(4), Some(Arc::new(Value::from(5))));
        s.finish(step(2), nodes[2], facts(5), None);
        let v = s.value();
        assert_eq!(keys(v), ["b", "a", "c"]);
        assert_eq!(v["a"]["result"], Value::from(5));
        assert_eq!(v["a"]["attempts"], Value::from(4));
        assert_eq!(v["c"]["result"], Value::Null);
        assert_eq!(
            v["b"],
            serde_json::json!({"id": "b", "status": "succeeded", "error": null, "attempts": 2,
                "duration_ms": 0, "failed": null, "iterations": null, "result": 2})
        );
    }

    #[test]
    fn many_steps_are_found_through_the_index() {
        let ids: Vec<String> = (0..40).map(|i| format!("s{i}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let (plan, nodes) = flow(&refs);
        let step = |i: usize| plan.step(nodes[i]).expect("a step");
        let mut s = StepsVar::new(plan.clone());
        // Backwards, so that the order of first finishing differs from the order written.
        for i in (0..40).rev() {
            s.finish(step(i), nodes[i], facts(1), Some(Arc::new(Value::from(i))));
        }
        for round in 2..4u32 {
            for i in (0..40).step_by(3) {
                s.finish(
                    step(i),
                    nodes[i],
                    facts(round),
                    Some(Arc::new(Value::from(i * 100))),
                );
            }
        }
        let v = s.value();
        let want: Vec<String> = (0..40).rev().map(|i| format!("s{i}")).collect();
        assert_eq!(keys(v), want);
        for i in 0..40 {
            let (r, a) = if i % 3 == 0 { (i * 100, 3) } else { (i, 1) };
            assert_eq!(v[&ids[i]]["result"], Value::from(r), "{i}");
            assert_eq!(v[&ids[i]]["attempts"], Value::from(a), "{i}");
        }
    }

    #[test]
    fn step_is_built_from_its_facts() {
        let f = StepFacts {
            status: StepStatus::Failed,
            error: Some(StepError::mapping("no")),
            attempts: 3,
            duration_ms: 7,
            failed: Value::Array(vec![]),
            iterations: Some(2),
        };
        let v = StepVar::new("x", &f);
        assert_eq!(v.value()["id"], Value::from("x"));
        assert_eq!(v.value()["status"], Value::from("failed"));
        assert_eq!(v.value()["error"]["kind"], Value::from("mapping"));
        assert_eq!(v.value()["iterations"], Value::from(2));
        assert!(v.value().get("result").is_none());
    }
}
