//! The `mock` agent, for flow tests and benchmarks (SPEC §6, §11): scripted results, latency
//! and failures, all deterministic.
//!
//! This module owns how one call of a [`MockPlan`] behaves, given only its
//! [`CallContext::call_index`] (the engine counts calls per agent per run, attempts included,
//! through [`AgentState::next_call`](super::AgentState::next_call)). A call:
//!
//! 1. waits `latency` of wall-clock time ([`super::timer`]: precise to well under a millisecond,
//!    never early; cancelled by `cx.cancel` with kind `cancelled`);
//! 2. fails with kind `agent` if its index is below `fail_times` ("mock failure 1 of 2"), or,
//!    with `fail_rate`, if a hash of (`seed`, call index) says so — the same seed gives the same
//!    pattern on every run and machine (the hash is defined here, not by a `rand` version);
//! 3. otherwise returns entry `call_index` of `sequence` (the last entry repeats once the
//!    sequence is used up; a failing call uses up its entry too), else the `returns` value
//!    template, else `{}` — an empty object, so that a bare mock merged with `output: "*"`
//!    changes nothing.
//!
//! A value of the result that is a mapping whose only key is `file`, itself a mapping
//! (`{file: {text: "...", name: a.txt, media_type?}}` or `{file: {path: fixtures/x.png,
//! name?, media_type?}}`, [`crate::model::mock_files`]), is a file the call makes: stored
//! through `cx.files` and replaced by its reference. A `path` is relative to the flow file's
//! directory and read at the call; `name` defaults to its last segment. Otherwise it does no
//! I/O, and it keeps no state of its own.

use serde_json::{Map, Value};

use super::transform::eval_value_template;
use super::{Agent, CallContext};
use crate::expr::value::ValueTemplate;
use crate::files::FileSink;
use crate::plan::MockPlan;
use crate::record::files::FileRef;
use crate::record::{ErrorKind, StepError};

/// A `mock` agent, borrowing its plan (the engine holds the plan in an `Arc` for the run).
#[derive(Clone, Copy, Debug)]
pub struct MockAgent<'p>(pub &'p MockPlan);

impl Agent for MockAgent<'_> {
    async fn call(&self, input: &Value, cx: CallContext<'_>) -> Result<Value, StepError> {
        let plan = self.0;
        if let Some(latency) = plan.latency.filter(|d| !d.is_zero()) {
            tokio::select! {
                biased;
                _ = cx.cancel.cancelled() => {
                    return Err(StepError::new(ErrorKind::Cancelled, "mock call cancelled"));
                }
                _ = super::timer::sleep(latency) => {}
            }
        }
        if let Some(err) = scripted_failure(plan, cx.call_index) {
            return Err(err);
        }
        match pick(plan, cx.call_index) {
            Some(template) => {
                let mut value = eval_value_template(template, input, &cx)?;
                make_files(&mut value, plan, cx.files).await?;
                Ok(value)
            }
            None => Ok(Value::Object(Map::new())),
        }
    }
}

/// Stores the mock files in `value` through `files`, each replaced by its reference, in
/// document order.
async fn make_files(value: &mut Value, plan: &MockPlan, files: &FileSink) -> Result<(), StepError> {
    let mut stack = vec![value];
    let mut found = Vec::new();
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) if m.len() == 1 && m.get("file").is_some_and(Value::is_object) => found.push(v),
            Value::Object(m) => stack.extend(m.values_mut().rev()),
            Value::Array(a) => stack.extend(a.iter_mut().rev()),
            _ => {}
        }
    }
    for v in found {
        let spec = v["file"].take();
        *v = make_file(&spec, plan, files).await?.to_value();
    }
    Ok(())
}

async fn make_file(spec: &Value, plan: &MockPlan, files: &FileSink) -> Result<FileRef, StepError> {
    let field = |k: &str| spec.get(k).and_then(Value::as_str);
    let bad = |why: String| StepError::new(ErrorKind::Agent, format!("mock file: {why}"));
    let media_type = field("media_type");
    match (field("text"), field("path")) {
        (Some(text), None) => {
            let name = field("name").ok_or_else(|| bad("`text` needs a `name`".into()))?;
            files
                .store_bytes(text.as_bytes(), name.to_string(), media_type)
                .await
        }
        (None, Some(path)) => {
            let full = plan.dir.join(path);
            // A FIFO would block the call for good, a directory fails less clearly.
            match tokio::fs::metadata(&full).await {
                Ok(m) if !m.is_file() => {
                    return Err(bad(format!("cannot read `{path}`: not a regular file")));
                }
                _ => {}
            }
            let bytes = tokio::fs::read(&full)
                .await
                .map_err(|e| bad(format!("cannot read `{path}`: {e}")))?;
            let name = match field("name") {
                Some(n) => n.to_string(),
                None => std::path::Path::new(path)
                    .file_name()
                    .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned()),
            };
            files.store_bytes(&bytes, name, media_type).await
        }
        _ => Err(bad(format!(
            "`{}` has one of `text` and `path`, as strings",
            serde_json::to_string(spec).unwrap_or_default()
        ))),
    }
}

/// The template that answers call `call_index`: its `sequence` entry (the last one once used
/// up), else `returns`; `None` when the mock has neither.
fn pick(plan: &MockPlan, call_index: u64) -> Option<&ValueTemplate> {
    if plan.sequence.is_empty() {
        return plan.returns.as_ref();
    }
    let i = usize::try_from(call_index)
        .unwrap_or(usize::MAX)
        .min(plan.sequence.len() - 1);
    plan.sequence.get(i)
}

/// The failure scripted for call `call_index`, if any.
fn scripted_failure(plan: &MockPlan, call_index: u64) -> Option<StepError> {
    if call_index < plan.fail_times {
        let msg = format!("mock failure {} of {}", call_index + 1, plan.fail_times);
        return Some(StepError::new(ErrorKind::Agent, msg));
    }
    if plan.fail_rate > 0.0 && unit(plan.seed, call_index) < plan.fail_rate {
        let msg = format!(
            "mock failure (fail_rate {}, seed {}, call {})",
            plan.fail_rate, plan.seed, call_index
        );
        return Some(StepError::new(ErrorKind::Agent, msg));
    }
    None
}

/// A number in `[0, 1)` that depends only on `(seed, call_index)`: SplitMix64 finalisers over
/// both, so neighbouring seeds and indices give unrelated values.
fn unit(seed: u64, call_index: u64) -> f64 {
    let h = splitmix64(seed ^ splitmix64(call_index.wrapping_add(0x632b_e59b_d9b4_e019)));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::agents::transform::tests::{expr_t, test_cx};

    fn plan() -> MockPlan {
        MockPlan {
            returns: None,
            sequence: Vec::new(),
            latency: None,
            fail_times: 0,
            fail_rate: 0.0,
            seed: 0,
            dir: std::path::PathBuf::new(),
        }
    }

    async fn call(plan: &MockPlan, i: u64, input: Value) -> Result<Value, StepError> {
        let cancel = CancellationToken::new();
        let context = json!({"who": "ctx"});
        MockAgent(plan)
            .call(&input, test_cx(i, Some("do it"), &context, &cancel))
            .await
    }

    #[tokio::test]
    async fn without_returns_or_sequence_the_result_is_an_empty_object() {
        assert_eq!(call(&plan(), 0, json!({"a": 1})).await.unwrap(), json!({}));
    }

    #[tokio::test]
    async fn returns_is_a_value_template_over_input_message_and_context() {
        let p = MockPlan {
            returns: Some(ValueTemplate::Object(vec![
                ("echo".into(), expr_t("input.a + 1")),
                ("m".into(), expr_t("message")),
                ("c".into(), expr_t("context.who")),
                ("fixed".into(), ValueTemplate::Literal(json!(true))),
            ])),
            ..plan()
        };
        assert_eq!(
            call(&p, 0, json!({"a": 1})).await.unwrap(),
            json!({"echo": 2, "m": "do it", "c": "ctx", "fixed": true})
        );
    }

    #[tokio::test]
    async fn a_sequence_is_consumed_in_order_and_its_last_entry_repeats() {
        let p = MockPlan {
            returns: Some(ValueTemplate::Literal(json!("ignored when a sequence is given"))),
            sequence: vec![
                ValueTemplate::Literal(json!({"n": 1})),
                ValueTemplate::Object(vec![("n".into(), expr_t("input.n"))]),
                ValueTemplate::Literal(json!({"n": 3})),
            ],
            ..plan()
        };
        let mut got = Vec::new();
        for i in 0..5 {
            got.push(call(&p, i, json!({"n": 2})).await.unwrap()["n"].clone());
        }
        assert_eq!(got, vec![json!(1), json!(2), json!(3), json!(3), json!(3)]);
        assert_eq!(call(&p, u64::MAX, json!({})).await.unwrap(), json!({"n": 3}));
    }

    #[tokio::test]
    async fn the_first_fail_times_calls_fail_with_kind_agent() {
        let p = MockPlan {
            fail_times: 2,
            returns: Some(ValueTemplate::Literal(json!("ok"))),
            ..plan()
        };
        let e1 = call(&p, 0, json!({})).await.unwrap_err();
        assert_eq!(
            (e1.kind, e1.message.as_str()),
            (ErrorKind::Agent, "mock failure 1 of 2")
        );
        let e2 = call(&p, 1, json!({})).await.unwrap_err();
        assert_eq!(e2.message, "mock failure 2 of 2");
        assert_eq!(call(&p, 2, json!({})).await.unwrap(), json!("ok"));
    }

    #[tokio::test]
    async fn fail_rate_is_deterministic_for_a_seed() {
        let pattern = |seed: u64| {
            let p = MockPlan {
                fail_rate: 0.3,
                seed,
                ..plan()
            };
            (0..200)
                .map(|i| scripted_failure(&p, i).is_some())
                .collect::<Vec<_>>()
        };
        let a = pattern(42);
        assert_eq!(a, pattern(42), "same seed, same pattern");
        assert_ne!(a, pattern(43), "another seed, another pattern");
        let failures = a.iter().filter(|f| **f).count();
        assert!((30..=90).contains(&failures), "about 30% of 200 fail: {failures}");
        // The pattern is part of the contract: flow tests written against it must keep passing.
        let first: Vec<u64> = (0..200).filter(|&i| a[i as usize]).take(5).collect();
        assert_eq!(first, vec![1, 3, 4, 5, 9]);

        let p = MockPlan {
            fail_rate: 0.3,
            seed: 42,
            ..plan()
        };
        let i = first[0];
        let err = call(&p, i, json!({})).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Agent);
        assert_eq!(
            err.message,
            format!("mock failure (fail_rate 0.3, seed 42, call {i})")
        );
        assert!(
            call(
                &MockPlan {
                    fail_rate: 1.0,
                    ..plan()
                },
                7,
                json!({})
            )
            .await
            .is_err()
        );
        assert!((0..1000).all(|i| {
            scripted_failure(
                &MockPlan {
                    fail_rate: 0.0,
                    ..plan()
                },
                i,
            )
            .is_none()
        }));
    }

    #[tokio::test]
    async fn mock_files_are_stored_and_become_references() {
        let dir = std::env::temp_dir().join(format!("switchyard-mock-files-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("fixtures")).unwrap();
        std::fs::write(dir.join("fixtures/scan.bin"), b"\x00\x01\x02").unwrap();
        let p = MockPlan {
            returns: Some(ValueTemplate::Literal(json!({
                "a": {"file": {"text": "hello", "name": "a.txt"}},
                "list": [{"file": {"path": "fixtures/scan.bin", "media_type": "application/x-test"}}],
                "real": {"file": "sha256:00"},
            }))),
            dir: dir.clone(),
            ..plan()
        };
        let cancel = CancellationToken::new();
        let context = json!({});
        let sink = crate::files::FileSink::detached();
        let mut cx = test_cx(0, None, &context, &cancel);
        cx.files = &sink;
        let out = MockAgent(&p).call(&json!({}), cx).await.unwrap();
        assert_eq!(
            out["a"],
            json!({"file": "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
                   "name": "a.txt", "media_type": "text/plain", "size": 5})
        );
        assert_eq!(out["list"][0]["name"], "scan.bin");
        assert_eq!(out["list"][0]["media_type"], "application/x-test");
        assert_eq!(out["list"][0]["size"], 3);
        assert_eq!(
            out["real"],
            json!({"file": "sha256:00"}),
            "a reference is left alone"
        );
        let made = sink.take();
        assert_eq!(made.len(), 2);
        assert_eq!(made[0].name, "a.txt");
        assert_eq!(sink.read_bytes(&made[1]).await.unwrap(), b"\x00\x01\x02");

        let p = MockPlan {
            returns: Some(ValueTemplate::Literal(
                json!({"file": {"path": "fixtures/none.png"}}),
            )),
            dir: dir.clone(),
            ..plan()
        };
        let mut cx = test_cx(0, None, &context, &cancel);
        cx.files = &sink;
        let e = MockAgent(&p).call(&json!({}), cx).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Agent);
        assert!(
            e.message
                .starts_with("mock file: cannot read `fixtures/none.png`: "),
            "{}",
            e.message
        );

        // A directory (or a FIFO, which would block the read for good) is no file.
        let p = MockPlan {
            returns: Some(ValueTemplate::Literal(json!({"file": {"path": "fixtures"}}))),
            dir: dir.clone(),
            ..plan()
        };
        let mut cx = test_cx(0, None, &context, &cancel);
        cx.files = &sink;
        let e = MockAgent(&p).call(&json!({}), cx).await.unwrap_err();
        assert_eq!(e.message, "mock file: cannot read `fixtures`: not a regular file");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    // Latency is wall-clock time: these tests use short real waits and check lower bounds.
    #[tokio::test]
    async fn latency_waits_on_the_wall_clock() {
        let p = MockPlan {
            latency: Some(Duration::from_millis(200)),
            ..plan()
        };
        let start = std::time::Instant::now();
        assert_eq!(call(&p, 0, json!({})).await.unwrap(), json!({}));
        assert!(start.elapsed() >= Duration::from_millis(200));

        // Failing calls take their latency too.
        let p = MockPlan {
            latency: Some(Duration::from_millis(100)),
            fail_times: 1,
            ..plan()
        };
        let start = std::time::Instant::now();
        assert!(call(&p, 0, json!({})).await.is_err());
        assert!(start.elapsed() >= Duration::from_millis(100));
    }

    #[tokio::test]
    async fn latency_is_cancellable() {
        let p = MockPlan {
            latency: Some(Duration::from_secs(3600)),
            ..plan()
        };
        let cancel = CancellationToken::new();
        let context = json!({});
        let start = tokio::time::Instant::now();
        let canceller = {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                cancel.cancel();
            })
        };
        let err = MockAgent(&p)
            .call(&json!({}), test_cx(0, None, &context, &cancel))
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Cancelled);
        assert!(start.elapsed() >= Duration::from_millis(100));
        assert!(start.elapsed() < Duration::from_secs(60));
        canceller.await.expect("canceller");
    }
}
