//! Routing (SPEC §4): the first edge whose `on`, `errors` and `if` match the finished step,
//! and, when none does, an error listing the edges tried.

use serde_json::Value;

use super::{NodeIdx, Run, StepOutcome};
use crate::expr::eval::{self, Vars};
use crate::model::EdgeOn;
use crate::plan::*;
use crate::record::{ErrorKind, StepError};
use crate::runtime::steps::StepVar;
use crate::store::Store;

impl<'e, S: Store> Run<'e, S> {
    /// Picks the edge to follow (SPEC §4). `Ok(None)`: the step has no `next`.
    pub(super) fn route(
        &self,
        step: &StepPlan,
        number: &str,
        outcome: &StepOutcome,
        entry: usize,
    ) -> Result<Option<NodeIdx>, StepError> {
        if !step.has_next {
            return Ok(None);
        }
        let failed = outcome.error.is_some();
        let kind = outcome.error.as_ref().map_or("", |e| e.kind.as_str());
        // Edges that were tried and did not match: explained only if none does.
        let mut tried = Vec::new();
        let entry = self.steps.entry(entry);
        // `step` is built only if a condition reads it.
        let step_var = StepVar::new(&step.id, &entry.facts);
        let target = |to: NodeIdx| self.flow.step(to).map_or("end", |s| s.id.as_str());
        for (edge, to) in self.flow.routes(step) {
            let on_matches = match edge.on {
                EdgeOn::Success => !failed,
                EdgeOn::Failure => failed,
                EdgeOn::Always => true,
            };
            if !on_matches {
                continue;
            }
            if let Some(kinds) = &edge.errors
                && !kinds.iter().any(|k| k == kind)
            {
                tried.push((edge, to));
                continue;
            }
            if let Some(cond) = &edge.cond {
                let vars = Vars {
                    payload: Some(&self.payload),
                    input: Some(&self.record.input),
                    context: Some(&self.tree.context),
                    result: Some(entry.result_or_null()),
                    step: Some(&step_var),
                    steps: Some(&self.steps),
                    message: None,
                    locals: &[],
                    now: Some(self.tree.now),
                };
                match eval::eval_bool(cond, &vars) {
                    Ok(true) => {}
                    Ok(false) => {
                        tried.push((edge, to));
                        continue;
                    }
                    Err(e) => {
                        // `e.message` already starts with the expression: "`cond`: cause".
                        return Err(StepError::expression(format!(
                            "step `{}`: the condition of the edge to `{}` failed: {}",
                            step.id,
                            target(to),
                            e.message
                        )));
                    }
                }
            }
            tracing::debug!(run_id = %self.record.id, step = %step.id, number, to = %target(to), "route");
            return Ok(Some(to));
        }
        match &outcome.error {
            // An unmatched failure fails the run with the step's own error.
            Some(e) => Err(e.clone()),
            None => {
                let tried: Vec<String> = tried
                    .into_iter()
                    .map(|(edge, to)| match (&edge.errors, &edge.cond) {
                        (Some(kinds), _) if !kinds.iter().any(|k| k == kind) => format!(
                            "to `{}`: errors [{}] (kind was `{kind}`)",
                            target(to),
                            kinds.join(", ")
                        ),
                        (_, Some(cond)) => format!("to `{}`: if {} → false", target(to), cond.text()),
                        (_, None) => format!("to `{}`", target(to)),
                    })
                    .collect();
                let listed = if tried.is_empty() {
                    "it has no success edge".to_string()
                } else {
                    tried.join("; ")
                };
                Err(StepError::new(
                    ErrorKind::NoRoute,
                    format!("step `{}`: no edge matched: {listed}", step.id),
                )
                .with_details(Value::Array(tried.into_iter().map(Value::String).collect())))
            }
        }
    }
}
