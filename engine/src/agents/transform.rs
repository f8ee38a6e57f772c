//! The `transform` agent: computes its result in-process from a value template (SPEC §6) over
//! the agent's input document, the step's `message` and the caller's `context`.
//!
//! This module also owns how every agent-side template sees its variables
//! ([`eval_value_template`]), which `mock` reuses for `returns` and `sequence`. It does no I/O
//! and knows nothing of payloads, steps or routing: `payload`, `result`, `step` and `steps` are
//! not visible to agent templates.

use serde_json::Value;

use super::{Agent, CallContext};
use crate::expr::eval::{self, Vars};
use crate::expr::value::ValueTemplate;
use crate::record::StepError;

/// A `transform` agent, borrowing its compiled `result:` template from the plan (the engine holds
/// the plan in an `Arc` for the whole run, so building one per call costs nothing).
#[derive(Clone, Copy, Debug)]
pub struct TransformAgent<'p>(pub &'p ValueTemplate);

impl Agent for TransformAgent<'_> {
    async fn call(&self, input: &Value, cx: CallContext<'_>) -> Result<Value, StepError> {
        eval_value_template(self.0, input, &cx)
    }
}

/// Evaluates an agent's value template with `input` (the agent's input document), `message`
/// (the rendered step message as a JSON string; unset when the step has none, so reading it is
/// an error) and `context`. A literal template is cloned without evaluation. Errors are of kind
/// `expression` and name the expression ([`eval::eval`]).
pub(crate) fn eval_value_template(
    template: &ValueTemplate,
    input: &Value,
    cx: &CallContext<'_>,
) -> Result<Value, StepError> {
    if let Some(v) = template.as_literal() {
        return Ok(v.clone());
    }
    let message = cx.message.map(|m| Value::String(m.to_owned()));
    let vars = agent_vars(input, message.as_ref(), cx);
    template.evaluate(&mut |expr| eval::eval(expr, &vars))
}

/// The variables of a template inside an agent definition: only `input`, `message`,
/// `context` and `now` (SPEC §6: "`input` is the agent's input document").
pub(crate) fn agent_vars<'a>(input: &'a Value, message: Option<&'a Value>, cx: &CallContext<'a>) -> Vars<'a> {
    Vars {
        input: Some(input),
        message,
        context: Some(cx.context),
        now: cx.now,
        ..Vars::default()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::expr;
    use crate::record::ErrorKind;

    /// A call context for tests: run `r1`, step `s`, attempt 1, the given call index.
    pub(crate) fn test_cx<'a>(
        call_index: u64,
        message: Option<&'a str>,
        context: &'a Value,
        cancel: &'a CancellationToken,
    ) -> CallContext<'a> {
        CallContext {
            run_id: "r1",
            step: "s",
            step_number: crate::agents::StepNumber::of("1"),
            attempt: 1,
            message,
            context,
            cancel,
            timeout: Duration::from_secs(30),
            call_index,
            now: None,
            files: detached_files(),
        }
    }

    /// A sink over memory for tests' calls, made once and kept.
    pub(crate) fn detached_files() -> &'static crate::files::FileSink {
        static SINK: std::sync::OnceLock<crate::files::FileSink> = std::sync::OnceLock::new();
        SINK.get_or_init(crate::files::FileSink::detached)
    }

    pub(crate) fn expr_t(text: &str) -> ValueTemplate {
        ValueTemplate::Expr(Arc::new(expr::parse(text).expect("valid expression")))
    }

    async fn run(t: &ValueTemplate, input: Value, message: Option<&str>) -> Result<Value, StepError> {
        let cancel = CancellationToken::new();
        let context = json!({"tenant": "acme"});
        TransformAgent(t)
            .call(&input, test_cx(0, message, &context, &cancel))
            .await
    }

    #[tokio::test]
    async fn literal_templates_are_cloned() {
        let t = ValueTemplate::Literal(json!({"a": [1, "=not an expression"]}));
        assert_eq!(
            run(&t, json!(null), None).await.unwrap(),
            json!({"a": [1, "=not an expression"]})
        );
    }

    #[tokio::test]
    async fn expressions_see_input_message_and_context() {
        let t = ValueTemplate::Object(vec![
            ("id".into(), expr_t("input.id")),
            ("v".into(), expr_t("input.v * 2")),
            ("msg".into(), expr_t("message")),
            ("tenant".into(), expr_t("context.tenant")),
            ("source".into(), ValueTemplate::Literal(json!("transform"))),
        ]);
        let got = run(&t, json!({"id": "x", "v": 21}), Some("hello")).await.unwrap();
        assert_eq!(
            got,
            json!({"id": "x", "v": 42, "msg": "hello", "tenant": "acme", "source": "transform"})
        );
        // Without a step message, `message` is not set: reading it is an error.
        let t = ValueTemplate::Array(vec![expr_t("message")]);
        assert_eq!(
            run(&t, json!({}), None).await.unwrap_err().kind,
            ErrorKind::Expression
        );
    }

    #[tokio::test]
    async fn expression_errors_name_the_expression() {
        let t = ValueTemplate::Object(vec![("n".into(), expr_t("input.missing + 1"))]);
        let err = run(&t, json!({"id": 1}), None).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Expression);
        assert!(
            err.message.starts_with("`input.missing + 1`: "),
            "{}",
            err.message
        );
        assert_eq!(err.details, Some(json!({"expression": "input.missing + 1"})));
    }
}
