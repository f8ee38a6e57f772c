//! One model turn of an agent loop (SPEC §6.3) in the OpenAI tool-calling protocol: the
//! request carries the conversation so far and the tools offered (`tools`, each
//! `{type: function, function: {name, description, parameters}}`, with `tool_choice: auto`);
//! the answer is either tool calls (`message.tool_calls`, `finish_reason: tool_calls`) or
//! the final answer's text. The engine runs the calls and answers each with a `tool` message
//! naming its `tool_call_id`; that is [`crate::runtime`]'s part, as is the loop itself.
//!
//! A loop's requests ask for the `result_schema` as a single call does, in the provider's
//! structured-output form (`response_format` of type `json_schema` by default, sent beside
//! `tools`: OpenAI's API takes both and constrains only the final answer, never a tool
//! call); a loop that ends at its `until_tool` asks for none, its answer being that tool's
//! result. The final answer is parsed and checked by the loop, with repairs.

use serde_json::{Map, Value, json};

use super::answer::ToolCall;
use super::{LlmAgent, Notes};
use crate::agents::CallContext;
use crate::agents::net::Secrets;
use crate::model::StructuredOutput;
use crate::plan::Schema;
use crate::record::StepError;
use crate::record::Usage;

/// What one model turn said.
#[derive(Clone, Debug)]
pub struct Turn {
    /// The assistant message as it enters the conversation: `role`, `content` (null when
    /// the model wrote none) and, with calls, `tool_calls` as the protocol writes them.
    pub message: Value,
    /// The tool calls, in the model's order; none for a final answer.
    pub calls: Vec<ToolCall>,
    /// The text of the answer (empty when there are only calls).
    pub content: String,
    pub finish_reason: Option<String>,
}

impl Turn {
    /// A turn from the assistant message a record kept ([`Turn::message`]).
    pub fn from_message(message: Value) -> Turn {
        let content = message
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let calls = message
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| ToolCall {
                        id: c["id"].as_str().unwrap_or("").to_owned(),
                        name: c["function"]["name"].as_str().unwrap_or("").to_owned(),
                        arguments: c["function"]["arguments"].as_str().unwrap_or("").to_owned(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Turn {
            message,
            calls,
            content,
            finish_reason: None,
        }
    }

    /// A turn made of `content` and `calls`, its message written as a server would send it.
    pub fn new(content: String, calls: Vec<ToolCall>, finish_reason: Option<String>) -> Turn {
        let mut m = Map::new();
        m.insert("role".into(), Value::String("assistant".into()));
        m.insert(
            "content".into(),
            if content.is_empty() && !calls.is_empty() {
                Value::Null
            } else {
                Value::String(content.clone())
            },
        );
        if !calls.is_empty() {
            let written: Vec<Value> = calls
                .iter()
                .map(|c| {
                    json!({
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    })
                })
                .collect();
            m.insert("tool_calls".into(), Value::Array(written));
        }
        Turn {
            message: Value::Object(m),
            calls,
            content,
            finish_reason,
        }
    }
}

/// A turn's outcome, the tokens and cost of its requests either way, and what it puts on the
/// record (requests abandoned, as [`super::merge_notes`] reads them).
pub struct TurnResult {
    pub turn: Result<Turn, StepError>,
    pub usage: Usage,
    pub notes: Option<Value>,
}

impl LlmAgent<'_> {
    /// The messages a loop starts from: those of a single call (system, conversation,
    /// context, task with its attachments). How the answer's `result_schema` is asked for is
    /// each request's ([`LlmAgent::turn`]).
    pub async fn loop_messages(&self, input: &Value, cx: &CallContext<'_>) -> Result<Vec<Value>, StepError> {
        let mut messages = self.messages(input, cx)?;
        let who = format!("agent `{}`", self.name);
        super::attach::append(
            &mut messages,
            super::attach::parts(self.plan, &who, input, cx).await?,
        );
        Ok(messages)
    }

    /// One request: the conversation so far and the tools offered (their definitions as the
    /// protocol writes them), under the provider's limits and retries and the step's
    /// `timeout` per request. `answer` is the `result_schema` the final answer is asked for
    /// with, in the provider's structured-output form as a single call asks for it
    /// (`response_format` beside the tools; a server that refuses `json_schema` is asked
    /// again with `json_object`, remembered); `one_at_a_time` sends
    /// `parallel_tool_calls: false`.
    pub async fn turn(
        &self,
        messages: &[Value],
        tools: &[Value],
        answer: Option<&Schema>,
        one_at_a_time: bool,
        cx: &CallContext<'_>,
    ) -> TurnResult {
        let mut secrets = Secrets::default();
        let mut usage = Usage::default();
        let mut notes = Notes::default();
        let turn = async {
            let (url, model, headers) = self.endpoint(&mut secrets)?;
            let p = &self.plan.provider;
            let state = self.providers.get(p);
            let mut form = answer.map(|_| {
                p.structured_output
                    .or_else(|| state.learned_form())
                    .unwrap_or(StructuredOutput::JsonSchema)
            });
            loop {
                // Written from the conversation as it is: a loop's requests grow with every turn.
                let mut body = self.request_body(&model, messages, answer, form);
                if !tools.is_empty() {
                    let b = body.as_object_mut().expect("a request is an object");
                    b.insert("tools".into(), Value::Array(tools.to_vec()));
                    b.insert("tool_choice".into(), Value::String("auto".into()));
                    if one_at_a_time {
                        b.insert("parallel_tool_calls".into(), Value::Bool(false));
                    }
                }
                let body = serde_json::to_vec(&body).expect("JSON values serialize");
                let fallback = p.structured_output.is_none() && form == Some(StructuredOutput::JsonSchema);
                let sent = (&url, model.as_str(), &headers);
                match self
                    .request(&state, sent, body, cx, &secrets, &mut usage, &mut notes, fallback)
                    .await
                {
                    Ok(answer) => {
                        notes.form = form;
                        return Ok(Turn::new(answer.content, answer.tool_calls, answer.finish_reason));
                    }
                    Err(super::RequestError::Step(e)) => return Err(e),
                    Err(super::RequestError::FormRefused { status, message }) => {
                        form = Some(self.form_refused(&state, cx, &secrets, status, message, &mut notes));
                    }
                }
            }
        }
        .await;
        let turn = match turn {
            Ok(mut t) => {
                secrets.redact_value(&mut t.message);
                t.content = secrets.redact(&t.content);
                for c in &mut t.calls {
                    c.arguments = secrets.redact(&c.arguments);
                }
                Ok(t)
            }
            Err(e) => Err(secrets.redact_error(e)),
        };
        let notes = notes.into_value().map(|mut v| {
            secrets.redact_value(&mut v);
            v
        });
        TurnResult { turn, usage, notes }
    }
}

/// A loop's final answer from its text: `{text}` without a schema; with one, the JSON the
/// text holds (a fenced block accepted), checked. When it cannot be used: what to tell the
/// model (a repair request) and the error the step fails with if no repair is left.
#[allow(clippy::result_large_err)]
pub fn final_answer(
    who: &str,
    content: &str,
    finish_reason: Option<&str>,
    schema: Option<&crate::plan::Schema>,
    requests: u64,
) -> Result<Value, (String, StepError)> {
    use super::answer::{Answer, Problem, parse_answer};
    let Some(schema) = schema else {
        return Ok(json!({"text": content}));
    };
    let problem = match parse_answer(content) {
        Ok((value, _)) => match schema.check(&value) {
            Ok(()) => return Ok(value),
            Err(v) => Problem::Schema(v),
        },
        Err(e) => Problem::Json(e),
    };
    let answer = Answer {
        content: content.to_owned(),
        finish_reason: finish_reason.map(str::to_owned),
        input_tokens: None,
        output_tokens: None,
        tool_calls: Vec::new(),
        model: None,
    };
    let request = problem.repair_request(&answer);
    Err((request, problem.into_error(who, requests, &answer, Vec::new())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_writes_its_message_as_the_protocol_does_and_reads_it_back() {
        let calls = vec![ToolCall {
            id: "call_1".into(),
            name: "kb_search".into(),
            arguments: r#"{"q":"x"}"#.into(),
        }];
        let t = Turn::new(String::new(), calls.clone(), Some("tool_calls".into()));
        assert_eq!(
            t.message,
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "kb_search", "arguments": "{\"q\":\"x\"}"}}
            ]})
        );
        let back = Turn::from_message(t.message.clone());
        assert_eq!(back.calls, calls);
        assert_eq!(back.content, "");
        let answer = Turn::new("done".into(), Vec::new(), None);
        assert_eq!(answer.message, json!({"role": "assistant", "content": "done"}));
        assert!(Turn::from_message(answer.message).calls.is_empty());
    }
}
