//! Reading a chat completion and its answer: the first choice's content and the usage
//! ([`parse_completion`]), the answer as JSON ([`parse_answer`], a fenced block accepted), and
//! what to tell the model, or the engine, when it is not right ([`Problem`]).

use serde_json::{Value, json};

use crate::agents::net;
use crate::record::{ErrorKind, StepError};

/// What a completion said.
#[derive(Debug, PartialEq)]
pub struct Answer {
    /// The message's text; empty when it has only tool calls.
    pub content: String,
    pub finish_reason: Option<String>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// The tools the model called (the OpenAI protocol's `message.tool_calls`), in its order.
    pub tool_calls: Vec<ToolCall>,
    /// The model the response named (`model`), which may be more precise than the one asked
    /// for (`gpt-4o` answered by `gpt-4o-2024-08-06`); at most [`KEPT_MODEL`] bytes of it.
    pub model: Option<String>,
}

/// The most of a response's `model` an answer keeps.
const KEPT_MODEL: usize = 256;

/// One call of a tool, as the model wrote it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The id the `tool` message answering it names (`tool_call_id`); `call_<i>` for a
    /// server that gives none.
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them: a JSON text, not yet parsed (a server that
    /// sends an object has it written out).
    pub arguments: String,
}

/// The `tool_calls` of a completion's message: each with `function.name` (empty when the
/// model wrote none) and `function.arguments`.
fn tool_calls(message: Option<&Value>) -> Result<Vec<ToolCall>, String> {
    let Some(calls) = message.and_then(|m| m.get("tool_calls")) else {
        return Ok(Vec::new());
    };
    let calls = match calls {
        Value::Null => return Ok(Vec::new()),
        Value::Array(a) => a,
        other => {
            return Err(format!(
                "`tool_calls` is not a list: {}",
                net::body_head(other.to_string().as_bytes())
            ));
        }
    };
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let f = c.get("function");
            // A call without a name (missing, null, not a string) is kept with an empty one:
            // the loop answers it with a `tool` message, as it does an unknown tool.
            let name = f
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let arguments = match f.and_then(|f| f.get("arguments")) {
                Some(Value::String(a)) => a.clone(),
                None | Some(Value::Null) => String::new(),
                Some(other) => other.to_string(),
            };
            let id = c
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| !id.is_empty())
                .map_or_else(|| format!("call_{}", i + 1), str::to_owned);
            Ok(ToolCall {
                id,
                name: name.to_owned(),
                arguments,
            })
        })
        .collect()
}

/// Reads a chat completion response: the first choice's message content and the usage.
pub fn parse_completion(body: &[u8]) -> Result<Answer, String> {
    let v: Value = crate::json::from_slice(body)
        .map_err(|e| format!("the response is not JSON ({e}): {}", net::body_head(body)))?;
    let choice = v
        .get("choices")
        .and_then(|c| c.get(0))
        .ok_or_else(|| format!("the response has no `choices`: {}", net::body_head(body)))?;
    let message = choice.get("message");
    let tool_calls = tool_calls(message)?;
    let content = match message.and_then(|m| m.get("content")) {
        Some(Value::String(s)) => s.clone(),
        _ if !tool_calls.is_empty() => String::new(),
        _ => {
            let why = message
                .and_then(|m| m.get("refusal"))
                .and_then(Value::as_str)
                .map_or_else(
                    || "no text content".to_owned(),
                    |r| format!("the model refused: {r}"),
                );
            return Err(format!("the answer has {why}"));
        }
    };
    let usage = v.get("usage");
    let tokens = |k: &str| usage.and_then(|u| u.get(k)).and_then(Value::as_u64);
    Ok(Answer {
        content,
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
        input_tokens: tokens("prompt_tokens"),
        output_tokens: tokens("completion_tokens"),
        tool_calls,
        model: v
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .map(|m| kept_within(m, KEPT_MODEL)),
    })
}

/// Parses an answer as JSON: the whole text, or else the content of its first fenced code
/// block (` ```json ... ``` `), which is accepted and reported (`true`). The error is the
/// whole text's.
pub fn parse_answer(text: &str) -> Result<(Value, bool), String> {
    let whole = match crate::json::from_str(text.trim()) {
        Ok(v) => return Ok((v, false)),
        Err(e) => e.to_string(),
    };
    if let Some(start) = text.find("```") {
        let after = &text[start + 3..];
        // Skip the info string (`json`) to the end of its line.
        let body_start = after.find('\n').map_or(after.len(), |i| i + 1);
        let body = &after[body_start..];
        if let Some(end) = body.find("```")
            && let Ok(v) = crate::json::from_str(body[..end].trim())
        {
            return Ok((v, true));
        }
    }
    Err(whole)
}

/// The most of a model's answer a step's record keeps.
pub(super) const KEPT_ANSWER: usize = 16 * 1024;

/// `text` as a record keeps it: whole up to [`KEPT_ANSWER`] bytes, else cut at a character
/// boundary with a note of how much was left out.
pub(super) fn kept(text: &str) -> String {
    kept_within(text, KEPT_ANSWER)
}

/// `text` whole up to `max` bytes, else cut at a character boundary with a note of how much
/// was left out.
pub fn kept_within(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let cut = (0..=max).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
    format!("{}… [{} more bytes not kept]", &text[..cut], text.len() - cut)
}

/// What was wrong with an answer.
pub(super) enum Problem {
    Json(String),
    Schema(crate::plan::SchemaViolation),
}

impl Problem {
    pub(super) fn describe(&self, answer: &Answer) -> String {
        let cut = if answer.finish_reason.as_deref() == Some("length") {
            " (the answer was cut off at `max_tokens`)"
        } else {
            ""
        };
        match self {
            Problem::Json(e) => format!("the answer is not valid JSON: {e}{cut}"),
            Problem::Schema(v) => format!("the answer does not match `result_schema` {v}"),
        }
    }

    pub(super) fn repair_request(&self, answer: &Answer) -> String {
        format!(
            "Your answer could not be used: {}. Reply with only the corrected JSON value, \
             matching the requested JSON schema, and nothing else.",
            self.describe(answer)
        )
    }

    /// The error of a call whose last `answer` could not be used: its details keep that
    /// answer ([`kept`]) and the `repairs` asked before it (each earlier answer and the
    /// request that followed it), so the step's record shows what the model said.
    pub(super) fn into_error(
        self,
        who: &str,
        requests: u64,
        answer: &Answer,
        repairs: Vec<Value>,
    ) -> StepError {
        let tail = if requests > 1 {
            format!(" (after {requests} requests)")
        } else {
            String::new()
        };
        let message = format!("{who}: {}{tail}", self.describe(answer));
        let mut details = match &self {
            Problem::Json(e) => {
                json!({"answer_start": net::body_head(answer.content.as_bytes()), "error": e})
            }
            Problem::Schema(v) => json!({"pointer": v.pointer, "rule": v.message}),
        };
        details["answer"] = Value::String(kept(&answer.content));
        if !repairs.is_empty() {
            details["repairs"] = Value::Array(repairs);
        }
        StepError::new(ErrorKind::InvalidOutput, message).with_details(details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_whole_or_fenced() {
        assert_eq!(parse_answer(" {\"a\": 1}\n").unwrap(), (json!({"a": 1}), false));
        let fenced = "Here you go:\n```json\n{\"a\": 2}\n```\nAnything else?";
        assert_eq!(parse_answer(fenced).unwrap(), (json!({"a": 2}), true));
        assert_eq!(parse_answer("```\n[1]\n```").unwrap(), (json!([1]), true));
        let e = parse_answer("Sure! The category is billing.").unwrap_err();
        assert!(e.contains("line 1 column 1"), "{e}");
        assert!(parse_answer("{\"category\": \"bill").is_err(), "truncated JSON");
        assert!(parse_answer("```json\n{\"a\": \n```").is_err());
    }

    #[test]
    fn problems_say_what_to_fix() {
        let cut = Answer {
            content: "{\"a\": ".into(),
            finish_reason: Some("length".into()),
            input_tokens: None,
            output_tokens: None,
            tool_calls: Vec::new(),
            model: None,
        };
        let p = Problem::Json(parse_answer(&cut.content).unwrap_err());
        assert_eq!(
            p.describe(&cut),
            "the answer is not valid JSON: EOF while parsing a value at line 1 column 5 \
             (the answer was cut off at `max_tokens`)"
        );
        assert!(
            p.repair_request(&cut)
                .starts_with("Your answer could not be used: the answer is not valid JSON")
        );
        let e = p.into_error("agent `a`", 2, &cut, vec![json!({"answer": "x"})]);
        assert_eq!(e.kind, ErrorKind::InvalidOutput);
        assert!(
            e.message.starts_with("agent `a`: the answer is not valid JSON")
                && e.message.ends_with("(after 2 requests)")
        );
        let details = e.details.unwrap();
        assert_eq!(details["answer_start"], "{\"a\":");
        assert_eq!(details["answer"], "{\"a\": ");
        assert_eq!(details["repairs"][0]["answer"], "x");
        let long = "é".repeat(KEPT_ANSWER);
        let k = kept(&long);
        assert!(
            k.len() < KEPT_ANSWER + 40 && k.ends_with(&format!("… [{} more bytes not kept]", KEPT_ANSWER)),
            "{}",
            &k[k.len() - 40..]
        );
    }

    #[test]
    fn completions_parse() {
        let body = br#"{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],
                        "usage":{"prompt_tokens":12,"completion_tokens":3}}"#;
        let a = parse_completion(body).unwrap();
        assert_eq!(
            a,
            Answer {
                content: "hi".into(),
                finish_reason: Some("stop".into()),
                input_tokens: Some(12),
                output_tokens: Some(3),
                tool_calls: Vec::new(),
                model: None,
            }
        );
        // Tool calls: the content may be null; arguments are a JSON text (an object some
        // servers send is written out); a call without an id gets one by its place.
        let body = br#"{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[
            {"id":"call_a","type":"function","function":{"name":"kb_search","arguments":"{\"q\":\"refund\"}"}},
            {"type":"function","function":{"name":"crm","arguments":{"id":7}}}]},
            "finish_reason":"tool_calls"}]}"#;
        let a = parse_completion(body).unwrap();
        assert_eq!(a.content, "");
        assert_eq!(a.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            a.tool_calls,
            [
                ToolCall {
                    id: "call_a".into(),
                    name: "kb_search".into(),
                    arguments: r#"{"q":"refund"}"#.into()
                },
                ToolCall {
                    id: "call_2".into(),
                    name: "crm".into(),
                    arguments: r#"{"id":7}"#.into()
                },
            ]
        );
        let a = parse_completion(
            br#"{"choices":[{"message":{"tool_calls":[{"function":{}},{"function":{"name":null}}]}}]}"#,
        )
        .unwrap();
        let names: Vec<&str> = a.tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["", ""]);
        let e =
            parse_completion(br#"{"choices":[{"message":{"content":null,"refusal":"no"}}]}"#).unwrap_err();
        assert_eq!(e, "the answer has the model refused: no");
        assert!(
            parse_completion(b"<html>")
                .unwrap_err()
                .starts_with("the response is not JSON")
        );
        assert!(
            parse_completion(b"{}")
                .unwrap_err()
                .starts_with("the response has no `choices`")
        );
    }
}
