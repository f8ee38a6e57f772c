//! `foreach`: items counted against `max_steps` up front, iterations one by one or in a
//! sliding window of `concurrency`, `tolerate`, `select`, results kept in item order and the
//! output mapped once at the end.

use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::Value;

use super::{Run, StepOutcome};
use crate::agents::StepNumber;
use crate::expr::path::type_name;
use crate::plan::*;
use crate::record::{self, RunStatus, Usage};
use crate::record::{ErrorKind, StepError};
use crate::runtime::data;
use crate::store::Store;

impl<'e, S: Store> Run<'e, S> {
    pub(super) async fn foreach_step(
        &mut self,
        step: &StepPlan,
        f: &ForeachPlan,
        number: &str,
    ) -> StepOutcome {
        let mut o = self.foreach_items(step, f, number).await;
        // A foreach step that failed before its first iteration (not an array, `max_items`,
        // `max_steps`) still has `step.failed` as a list and `step.iterations` as a count, so
        // that edges reading them do not fail with an expression error.
        if o.failed.is_null() {
            o.failed = Value::Array(Vec::new());
        }
        o.iterations.get_or_insert(0);
        o
    }

    async fn foreach_items(&mut self, step: &StepPlan, f: &ForeachPlan, number: &str) -> StepOutcome {
        // A path source is read in place: iterations only read the payload.
        let source = {
            let vars = self.vars(&[]);
            match data::eval_source_ref(&f.over, &self.payload, &vars) {
                Ok(v) => v,
                Err(e) => return StepOutcome::err(e),
            }
        };
        let items: &[Value] = match &*source {
            Value::Array(items) => items,
            other => {
                return StepOutcome::err(StepError::mapping(format!(
                    "`foreach` of step `{}` must yield an array, got {}",
                    step.id,
                    type_name(other)
                )));
            }
        };
        let n = items.len() as u64;
        if n > f.max_items {
            return StepOutcome::err(StepError::new(
                ErrorKind::Limit,
                format!(
                    "`foreach` of step `{}` has {n} items, over `max_items` ({})",
                    step.id, f.max_items
                ),
            ));
        }
        let tolerated = match f.tolerate {
            Tolerance::Count(c) => c,
            Tolerance::Percent(p) => ((n as f64) * p / 100.0).floor() as u64,
        };
        let mut results: Vec<Value> = vec![Value::Null; items.len()];
        let mut failed: Vec<(usize, StepError)> = Vec::new();
        let mut usage = Usage::default();
        let mut stopped = false;
        // Paused, or an iteration in doubt: no new iterations; the step ends without a result.
        let mut halt: Option<(RunStatus, Option<StepError>)> = None;
        // Count every iteration up front: `max_steps` bounds them like steps.
        for _ in 0..n {
            if let Err(e) = self.count_step() {
                return StepOutcome::err(e);
            }
        }
        if f.concurrency <= 1 {
            for (i, item) in items.iter().enumerate() {
                if self.tree.pause.is_cancelled() {
                    halt = Some((RunStatus::Running, None));
                    break;
                }
                let r = self.iteration(step, f, item, i, number).await;
                usage.add(r.usage);
                if r.stop == Some(RunStatus::Interrupted) {
                    halt = Some((RunStatus::Interrupted, r.error));
                    break;
                }
                match r.error {
                    None => results[i] = r.result.map_or(Value::Null, Arc::unwrap_or_clone),
                    Some(e) => {
                        failed.push((i, e));
                        if failed.len() as u64 > tolerated {
                            stopped = true;
                            break;
                        }
                    }
                }
            }
        } else {
            // A sliding window: a new iteration starts as soon as one finishes.
            let this = &*self;
            let start = |i: usize| async move { (i, this.iteration(step, f, &items[i], i, number).await) };
            let mut in_flight = FuturesUnordered::new();
            // The box of the last iteration that finished on its first poll, for the next one:
            // an iteration's future is kilobytes, too large for the allocator's fast path.
            let mut spare = None;
            let mut next = 0usize;
            loop {
                if halt.is_none() && self.tree.pause.is_cancelled() {
                    halt = Some((RunStatus::Running, None));
                }
                // An iteration is polled once as it starts: one that finishes then (a
                // transform body, say) is taken at once and never joins the window's set.
                // The first window always starts whole: an iteration that stops to ask a
                // human does not keep the others started with it from asking too, however
                // fast it got there (a queued record is not waited for).
                let mut done = None;
                while done.is_none()
                    && !stopped
                    && (halt.is_none()
                        || (next < f.concurrency && matches!(halt, Some((RunStatus::Interrupted, _)))))
                    && in_flight.len() < f.concurrency
                    && next < items.len()
                {
                    let i = next;
                    next += 1;
                    let mut fut = match spare.take() {
                        Some(mut b) => {
                            std::pin::Pin::set(&mut b, start(i));
                            b
                        }
                        None => Box::pin(start(i)),
                    };
                    match std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await {
                        std::task::Poll::Ready(r) => {
                            done = Some(r);
                            spare = Some(fut);
                        }
                        std::task::Poll::Pending => in_flight.push(fut),
                    }
                }
                let next_done = match done {
                    Some(r) => Some(r),
                    None => in_flight.next().await,
                };
                let Some((i, r)) = next_done else {
                    break;
                };
                usage.add(r.usage);
                if r.stop == Some(RunStatus::Interrupted) {
                    if halt.is_none() {
                        halt = Some((RunStatus::Interrupted, r.error));
                    }
                    continue;
                }
                match r.error {
                    None => results[i] = r.result.map_or(Value::Null, Arc::unwrap_or_clone),
                    Some(e) => {
                        failed.push((i, e));
                        if failed.len() as u64 > tolerated {
                            stopped = true;
                        }
                    }
                }
            }
        }
        if let Some((status, error)) = halt {
            let mut o = StepOutcome::ok(None);
            o.usage = usage;
            o.error = error;
            o.stop = Some(status);
            return o;
        }
        failed.sort_by_key(|(i, _)| *i);
        let failed_json = Value::Array(
            failed
                .iter()
                .map(|(i, e)| serde_json::json!({"index": i, "error": e.to_json()}))
                .collect(),
        );
        let mut o = StepOutcome::ok(None);
        o.usage = usage;
        o.failed = failed_json;
        o.iterations = Some(n);
        if stopped {
            let (first_i, first) = &failed[0];
            o.error = Some(
                StepError::new(
                    ErrorKind::Limit,
                    format!(
                        "{} of {n} iterations of step `{}` failed, more than `tolerate` allows ({tolerated}); first: item {first_i}: {first}",
                        failed.len(),
                        step.id
                    ),
                )
                .with_details(o.failed.clone()),
            );
            o.result = Some(Arc::new(Value::Array(results)));
            return o;
        }
        drop(source);
        // The output maps the array of results once, at the end.
        let result = Arc::new(Value::Array(results));
        self.apply(&f.body, &result, &[], &mut o);
        o.result = Some(result);
        o
    }

    /// One `foreach` iteration: its input from the payload as it was when the step started,
    /// with the item in scope; the call; then `select`. Iterations never write the payload.
    async fn iteration(
        &self,
        step: &StepPlan,
        f: &ForeachPlan,
        item: &Value,
        index: usize,
        number: &str,
    ) -> StepOutcome {
        let index_v = Value::from(index as u64);
        let locals: [(&str, &Value); 2] = [(f.as_name.as_str(), item), ("index", &index_v)];
        let call = &f.body;
        let prepared = {
            let vars = self.vars(&locals);
            // Borrowed when it is the item or the whole payload: copied only for a store that
            // keeps it.
            let input = match &call.input {
                // Without `input`, each iteration's input document is the item itself.
                InputPlan::All if call.scope.is_none() => Ok(std::borrow::Cow::Borrowed(item)),
                spec => data::build_input_ref(spec, call.scope.as_ref(), &self.payload, &vars),
            };
            input.and_then(|i| Ok((i, self.message(call, &vars)?)))
        };
        let (input, message) = match prepared {
            Ok(p) => p,
            Err(e) => return StepOutcome::err(e),
        };
        let iter_number = StepNumber {
            step: number,
            iteration: Some(index as u64),
        };
        // Resuming: a finished iteration's record holds its result after `select`.
        if let Some(rec) = self
            .replay
            .as_ref()
            .and_then(|r| r.finished(number, Some(index as u64)))
        {
            // Its files are the run's again, as a replayed step's are.
            let o = self.replayed(call, rec);
            self.note_files(&o.files);
            return o;
        }
        let started = record::Stamp::now();
        let mut o = self
            .invoke(step, call, &input, message.as_deref(), iter_number, "iteration")
            .await;
        if o.error.is_none()
            && let (Some(sel), Some(r)) = (&f.select, &o.result)
        {
            let picked = if sel.is_singular() {
                sel.get(r).cloned()
            } else {
                Some(Value::Array(sel.query(r).into_iter().cloned().collect()))
            };
            match picked {
                Some(v) => o.result = Some(Arc::new(v)),
                None => {
                    o.error = Some(StepError::mapping(format!(
                        "`select` `{}` matched nothing in the result of item {index}",
                        sel.text()
                    )));
                    o.result = None;
                }
            }
        }
        self.record_part(
            step,
            number.to_string(),
            "iteration",
            Some(index as u64),
            self.recorded_input(Self::called_with(&mut o, input)),
            &mut o,
            started,
        )
        .await;
        o
    }
}
