//! Child runs: a `flow` agent runs its flow one level deeper (`max_depth`), with its own
//! payload and the intersection of capability sets, host lists and budgets down the tree; on
//! resume, a child run the step started before goes on, or its end stands.

use std::sync::Arc;

use serde_json::Value;

use super::limits::Budget;
use super::{CallResult, Engine, Lineage, Run, RunOutcome, Tree, intersect};
use crate::agents::{AgentState, StepNumber};
use crate::plan::*;
use crate::record::{ErrorKind, StepError};
use crate::record::{RunRecord, RunStatus, Usage};
use crate::runtime::resume::Replay;
use crate::store::Store;

impl<S: Store> Engine<S> {
    fn run_flow<'a>(
        &'a self,
        tree: &'a Arc<Tree>,
        flow_ref: FlowRef,
        input: Value,
        lineage: Lineage,
        state: &'a Arc<AgentState>,
        resumed: Option<(RunRecord, Arc<Replay>)>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = RunOutcome> + Send + 'a>> {
        Box::pin(async move {
            let flow = tree.plan.flow(flow_ref).clone();
            let mut run = Run::new(self, tree, flow, flow_ref, input, lineage, state, resumed);
            run.execute().await
        })
    }
}
impl<'e, S: Store> Run<'e, S> {
    /// A child run that ended under a holder that then stopped without recording a stop
    /// ([`Tree::carry`]): its records and its descendants' go to the observer, which was told
    /// nothing of them.
    async fn carry_ended(&self, child: &RunRecord) {
        let (Some(o), Some(since)) = (self.engine.observer.as_deref(), self.tree.carry) else {
            return;
        };
        let mut runs = vec![child.clone()];
        while let Some(run) = runs.pop() {
            let replay = match Replay::load(&*self.engine.store, &run.id).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(run_id = %run.id, error = %e, "the records of an ended child run could not be read for its spans");
                    continue;
                }
            };
            let watch = o.run_started(&run, &self.watch);
            replay.finished_since(since).for_each(|r| o.replayed(&watch, r));
            runs.extend(replay.children().cloned());
            o.run_ended(&watch, &run);
        }
    }

    /// A `flow` agent: a child run one level deeper, with its own payload.
    pub(super) async fn child_run(&self, child: FlowRef, input: Value, number: StepNumber<'_>) -> CallResult {
        let depth = self.lineage.depth;
        let max = self.lineage.max_depth;
        if u64::from(depth) + 1 > max {
            return Err((
                StepError::new(
                    ErrorKind::Depth,
                    format!("nesting limit reached (depth {depth} of {max})"),
                ),
                Usage::default(),
                None,
                false,
            ));
        }
        let child_flow = self.tree.plan.flow(child);
        let prefix = number.to_string();
        // Resuming: a child run this step started before goes on (or, if it ended, its end
        // stands), instead of a new one.
        let earlier = self.replay.as_ref().and_then(|r| r.child(&prefix)).cloned();
        let out = match earlier {
            Some(rec) if !crate::runtime::resume::resumable(rec.status) => {
                self.carry_ended(&rec).await;
                RunOutcome {
                    run_id: rec.id,
                    status: rec.status,
                    output: rec.output,
                    error: rec.error,
                    path: Vec::new(),
                    usage: rec.usage,
                    steps: rec.steps,
                    duration_ms: rec
                        .finished_at
                        .unwrap_or(rec.started_at)
                        .saturating_sub(rec.started_at),
                    store_failure: None,
                    waiting: None,
                    files: rec.files,
                }
            }
            earlier => {
                let replay = match &earlier {
                    Some(rec) => match Replay::load(&*self.engine.store, &rec.id).await {
                        Ok(r) => Some(Arc::new(r)),
                        Err(e) => {
                            let e = self.store_error(&e);
                            return Err((e, Usage::default(), Some(rec.id.clone()), false));
                        }
                    },
                    None => None,
                };
                let lineage = Lineage {
                    parent_run: Some(self.record.id.clone()),
                    prefix,
                    depth: depth + 1,
                    max_depth: max,
                    allow: intersect(self.lineage.allow.clone(), child_flow.allow.clone()),
                    hosts: {
                        let mut h = self.lineage.hosts.clone();
                        h.extend(child_flow.allow_hosts.iter().map(|l| Arc::from(l.as_slice())));
                        h
                    },
                    budget: Budget::min(
                        self.lineage.budget,
                        child_flow.limits.max_cost_usd.map(|limit| Budget {
                            base: self.tree.spent(),
                            unknown_base: self.tree.unknown_calls(),
                            limit,
                            by: "limits.max_cost_usd",
                        }),
                    ),
                    files: Some(self.file_limits.clone()),
                    root: Some(Arc::new(self.root_of())),
                    watch: self.watch.clone(),
                };
                let resumed = earlier.zip(replay);
                self.engine
                    .run_flow(self.tree, child, input, lineage, self.state, resumed)
                    .await
            }
        };
        let id = Some(out.run_id.clone());
        if out.status == RunStatus::Succeeded && !out.files.is_empty() {
            // The child's files, numbered in the tree already, are the calling step's.
            self.made_files(number.to_string(), out.files);
        }
        match out.status {
            RunStatus::Succeeded => Ok((out.output.unwrap_or(Value::Null), out.usage, id)),
            status => Err((
                out.error.unwrap_or_else(|| {
                    let message = if status == RunStatus::Interrupted {
                        // Stopped at an `interrupt`: the decision is given to the root run.
                        format!("the child run `{}` waits for a decision", out.run_id)
                    } else {
                        format!("the child run `{}` ended {}", out.run_id, status.as_str())
                    };
                    StepError::new(ErrorKind::Agent, message)
                }),
                out.usage,
                id,
                matches!(status, RunStatus::Interrupted | RunStatus::Running),
            )),
        }
    }
}
