//! What an agent loop's requests ask of the model (SPEC §6.3), through the real `switchyard`
//! binary against the local OpenAI-compatible server: a loop with `result_schema` asks for
//! its answer with `response_format` beside its tools (in the provider's form, falling back
//! as a single call does), a tool's string result reaches the model as the text itself, and
//! `max_parallel_tools: 1` sends `parallel_tool_calls: false`.

use serde_json::{Value, json};

use crate::agent_loop::tool_messages;
use crate::mock_server::{self, Llm, Reply};
use crate::support::{TempDir, run, switchyard};

/// A flow whose step `answer` is agent loop `helper` with tools `greet` (a mock that returns
/// the string `hello`) and `lookup` (a mock that returns an object). `provider` is more YAML
/// under the provider, `extra` under the loop agent (both indented 4 spaces).
fn flow(base_url: &str, provider: &str, extra: &str) -> String {
    format!(
        r#"flow: requests
providers:
  local:
    base_url: {base_url}
{provider}
agents:
  helper:
    kind: llm
    provider: local
    model: m1
    system: You help.
    prompt: "Ticket: {{{{ input.text }}}}"
    tools: [greet, lookup]
{extra}
  greet:
    kind: mock
    description: Says hello.
    returns: hello
  lookup:
    kind: mock
    description: Looks up an order.
    returns: {{order: 7, note: "a \"quoted\" word"}}
steps:
  answer:
    agent: helper
    input: {{$.text: $.text}}
    output: {{$.reply: $}}
"#
    )
}

const SCHEMA: &str =
    "    result_schema: {type: object, required: [status], properties: {status: {type: string}}}";

/// Runs `requests.yaml` in `dir` with `{"text": "hi"}`: its output (`null` unless it
/// succeeded) and stderr.
fn run_flow(dir: &TempDir) -> (Value, String) {
    let out = run(switchyard(dir.path()).args(["run", "requests.yaml", "--input", r#"{"text": "hi"}"#]));
    let output = if out.code() == 0 {
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
    } else {
        Value::Null
    };
    (output, out.stderr)
}

/// The system message of a request.
fn system(body: &Value) -> String {
    body["messages"][0]["content"].as_str().unwrap_or("").to_owned()
}

/// Every request of a loop with `result_schema` carries `response_format` of type
/// `json_schema` beside its tools (a call may still be a tool call), and the system message
/// is left as written; the answer is checked against the schema.
#[test]
fn a_loops_answer_is_asked_for_with_response_format() {
    let server = Llm::start();
    server.script([
        Reply::calls(1, &[("lookup", "{}")]),
        Reply::Answer(r#"{"status": "shipped"}"#.into()),
    ]);
    let dir = TempDir::new("loop-response-format");
    dir.write("requests.yaml", flow(&server.base_url(), "", SCHEMA));
    let (output, stderr) = run_flow(&dir);
    assert_eq!(output["reply"], json!({"status": "shipped"}), "{stderr}");
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    for h in &hits {
        let format = &h.body["response_format"];
        assert_eq!(format["type"], "json_schema", "{}", h.body);
        assert_eq!(format["json_schema"]["name"], "helper");
        assert_eq!(format["json_schema"]["schema"]["required"], json!(["status"]));
        assert_eq!(h.body["tools"].as_array().map(Vec::len), Some(2));
        assert_eq!(system(&h.body), "You help.", "the schema is not repeated as text");
        assert!(h.body.get("parallel_tool_calls").is_none(), "{}", h.body);
    }
}

/// A server that refuses `json_schema` is asked again, within the same turn, with
/// `json_object` and the schema in the system message, as a single call is; a provider that
/// says `prompt` gets the schema as text only. A loop that ends at its `until_tool` asks for
/// no form: its answer is that tool's result.
#[test]
fn a_loops_answer_form_follows_the_provider() {
    let server = Llm::start();
    server.refuse_json_schema(500, mock_server::LLAMA_CPP_PYTHON_REFUSAL);
    server.script([Reply::Answer(r#"{"status": "open"}"#.into())]);
    let dir = TempDir::new("loop-response-format-fallback");
    dir.write("requests.yaml", flow(&server.base_url(), "", SCHEMA));
    let (output, stderr) = run_flow(&dir);
    assert_eq!(output["reply"], json!({"status": "open"}), "{stderr}");
    let hits = server.hits();
    assert_eq!(hits.len(), 2, "refused once, then asked with json_object");
    assert_eq!(hits[0].body["response_format"]["type"], "json_schema");
    assert_eq!(hits[1].body["response_format"]["type"], "json_object");
    assert_eq!(
        hits[1].body["response_format"]["schema"]["required"],
        json!(["status"])
    );
    assert!(system(&hits[1].body).contains("matches this JSON Schema"));
    assert!(hits[1].body["tools"].is_array());

    let server = Llm::start();
    server.script([Reply::Answer(r#"{"status": "open"}"#.into())]);
    dir.write(
        "requests.yaml",
        flow(&server.base_url(), "    structured_output: prompt", SCHEMA),
    );
    let (output, stderr) = run_flow(&dir);
    assert_eq!(output["reply"], json!({"status": "open"}), "{stderr}");
    let body = &server.hits()[0].body;
    assert!(body.get("response_format").is_none(), "{body}");
    assert!(system(body).contains("matches this JSON Schema"), "{body}");

    let server = Llm::start();
    server.script([Reply::calls(1, &[("lookup", "{}")])]);
    let extra = "    until_tool: lookup\n    result_schema: {type: object, required: [order]}";
    dir.write("requests.yaml", flow(&server.base_url(), "", extra));
    let (output, stderr) = run_flow(&dir);
    assert_eq!(output["reply"]["order"], 7, "{stderr}");
    let body = &server.hits()[0].body;
    assert!(body.get("response_format").is_none(), "{body}");
    assert_eq!(system(body), "You help.");
}

/// A tool's string result is the `tool` message's content as it is, not JSON-quoted; an
/// object stays its JSON text.
#[test]
fn a_string_result_reaches_the_model_as_its_text() {
    let server = Llm::start();
    server.script([
        Reply::calls(1, &[("greet", "{}"), ("lookup", "{}")]),
        Reply::Answer("done".into()),
    ]);
    let dir = TempDir::new("loop-string-result");
    dir.write("requests.yaml", flow(&server.base_url(), "", ""));
    let (output, stderr) = run_flow(&dir);
    assert_eq!(output["reply"], json!({"text": "done"}), "{stderr}");
    let hits = server.hits();
    assert_eq!(
        tool_messages(&hits[1].body),
        [
            ("call_1_1".to_owned(), "hello".to_owned()),
            (
                "call_1_2".to_owned(),
                r#"{"order":7,"note":"a \"quoted\" word"}"#.to_owned()
            ),
        ]
    );
}

/// `max_parallel_tools: 1` tells the model to call one tool at a time
/// (`parallel_tool_calls: false`) in every request; the default sends nothing.
#[test]
fn one_tool_at_a_time_is_told_to_the_model() {
    let server = Llm::start();
    server.script([Reply::calls(1, &[("greet", "{}")]), Reply::Answer("done".into())]);
    let dir = TempDir::new("loop-parallel-tool-calls");
    dir.write(
        "requests.yaml",
        flow(&server.base_url(), "", "    max_parallel_tools: 1"),
    );
    let (output, stderr) = run_flow(&dir);
    assert_eq!(output["reply"], json!({"text": "done"}), "{stderr}");
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    for h in &hits {
        assert_eq!(h.body["parallel_tool_calls"], false, "{}", h.body);
    }
}
