//! `llm` agents against the servers people run locally (llama-cpp-python, gateways, static
//! file servers): a refused `json_schema` form falls back to `json_object` and is remembered,
//! `structured_output` says the form up front, permanent server errors fail at once, and the
//! step's record tells which form a call used.

use serde_json::{Value, json};
use switchyard::__private::record::RunStatus;
use switchyard::__private::store::Store;

use crate::llm::{flow_text, memory_engine, plan_of, run, run_ids, write_flow};
use crate::mock_server::{self, Llm, Reply, classification};
use crate::support::{self, TempDir};

// ------------------------------------------------- servers people run locally

/// The `response_format` and the system message of a request.
fn form_of(body: &Value) -> (Value, String) {
    (
        body.get("response_format").cloned().unwrap_or(Value::Null),
        body["messages"][0]["content"].as_str().unwrap_or("").to_owned(),
    )
}

/// llama-cpp-python's server refuses `response_format: {type: json_schema}` with a 500 naming
/// the field: the call asks once more with `json_object` (the schema beside it and in the
/// system message), at once and not for two minutes; the provider remembers the form, so the
/// next call asks with it first; the step's record says which form was used and what the
/// server refused.
#[tokio::test]
async fn a_server_that_refuses_json_schema_is_asked_with_json_object_and_remembered() {
    let server = Llm::spawn().await;
    server.refuse_json_schema(500, mock_server::LLAMA_CPP_PYTHON_REFUSAL);
    server.default_reply(Reply::Answer(classification("billing", 0.9)));
    let dir = TempDir::new("llm-refuses-schema");
    let path = write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
    let plan = plan_of(&path);
    let engine = memory_engine();
    let out = run(&engine, &plan, json!({"text": "charged twice"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let hits = server.hits();
    let statuses: Vec<u16> = hits.iter().map(|h| h.status).collect();
    assert_eq!(statuses, [500, 200]);
    assert_eq!(hits[0].body["response_format"]["type"], "json_schema");
    let (format, system) = form_of(&hits[1].body);
    assert_eq!(format["type"], "json_object");
    assert_eq!(format["schema"]["required"], json!(["category", "confidence"]));
    assert!(
        system.starts_with("You classify support tickets.\n\nReply with only a JSON value")
            && system.contains(r#""required":["category","confidence"]"#),
        "{system}"
    );
    let steps = engine.store.steps(&out.run_id).await.unwrap();
    let notes = steps.last().unwrap().answers.clone().expect("the call's notes");
    assert_eq!(notes["structured_output"], "json_object", "{notes}");
    assert_eq!(notes["refused"]["form"], "json_schema", "{notes}");
    assert_eq!(notes["refused"]["status"], 500, "{notes}");
    assert!(
        notes["refused"]["message"]
            .as_str()
            .unwrap()
            .contains("response_format.type"),
        "{notes}"
    );
    // Tokens are the answered request's; the refusal used none.
    assert_eq!(out.usage.input_tokens + out.usage.output_tokens, hits[1].tokens);

    // The provider remembers: the next call asks with `json_object` first.
    let out = run(&engine, &plan, json!({"text": "again"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let hits = server.hits();
    assert_eq!(hits.len(), 3);
    assert_eq!(hits[2].body["response_format"]["type"], "json_object");
    let steps = engine.store.steps(&out.run_id).await.unwrap();
    let notes = steps.last().unwrap().answers.clone().expect("the call's notes");
    assert_eq!(notes, json!({"model": "m1", "structured_output": "json_object"}));
}

/// Other servers refuse the form with a 400 (a gateway whose backend lacks it) or a 422 (a
/// server that validates the request first): the same fallback, once.
#[tokio::test]
async fn a_400_or_422_naming_response_format_falls_back_too() {
    let gateway = r#"{"error": {"message": "litellm.UnsupportedParamsError: this model does not support parameters: ['response_format']", "type": "invalid_request_error", "code": "400"}}"#;
    let validating = r#"{"detail": [{"loc": ["body", "response_format", "type"], "msg": "unexpected value; permitted: 'text', 'json_object'"}]}"#;
    for (code, body) in [(400, gateway), (422, validating)] {
        let server = Llm::spawn().await;
        server.refuse_json_schema(code, body);
        server.default_reply(Reply::Answer(classification("billing", 0.9)));
        let dir = TempDir::new("llm-refuses-4xx");
        let path = write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
        let engine = memory_engine();
        let out = run(&engine, &plan_of(&path), json!({"text": "hi"})).await;
        assert_eq!(out.status, RunStatus::Succeeded, "{code}: {:?}", out.error);
        let statuses: Vec<u16> = server.hits().iter().map(|h| h.status).collect();
        assert_eq!(statuses, [code, 200]);
        let steps = engine.store.steps(&out.run_id).await.unwrap();
        let notes = steps.last().unwrap().answers.clone().expect("notes");
        assert_eq!(notes["refused"]["status"], code, "{notes}");
    }
}

/// `structured_output` on the provider says the form up front: `json_object` and `prompt`
/// are asked for from the first request; `json_schema` is kept even when refused (no
/// fallback), and the refusal, repeated, fails at once with the server's message.
#[tokio::test]
async fn a_provider_says_its_structured_output_form_up_front() {
    let server = Llm::spawn().await;
    server.refuse_json_schema(500, mock_server::LLAMA_CPP_PYTHON_REFUSAL);
    server.default_reply(Reply::Answer(classification("other", 0.5)));
    let dir = TempDir::new("llm-form-up-front");
    let engine = memory_engine();
    for (i, form) in ["json_object", "prompt"].into_iter().enumerate() {
        let provider = format!("    structured_output: {form}");
        let path = write_flow(
            &dir,
            &format!("{form}.yaml"),
            &flow_text(&server.base_url(), &provider, "", ""),
        );
        let out = run(&engine, &plan_of(&path), json!({"text": "hi"})).await;
        assert_eq!(out.status, RunStatus::Succeeded, "{form}: {:?}", out.error);
        let hits = server.hits();
        assert_eq!(hits.len(), i + 1, "{form}: one request");
        let (format, system) = form_of(&hits[i].body);
        match form {
            "json_object" => assert_eq!(format["type"], "json_object"),
            _ => assert_eq!(format, Value::Null, "no response_format"),
        }
        assert!(system.contains("matches this JSON Schema"), "{system}");
        let steps = engine.store.steps(&out.run_id).await.unwrap();
        assert_eq!(
            steps.last().unwrap().answers.as_ref().unwrap()["structured_output"],
            form
        );
    }
    let path = write_flow(
        &dir,
        "json_schema.yaml",
        &flow_text(&server.base_url(), "    structured_output: json_schema", "", ""),
    );
    let out = run(&engine, &plan_of(&path), json!({"text": "hi"})).await;
    let e = out.error.expect("refused");
    assert_eq!(e.kind.as_str(), "agent");
    assert!(
        e.message
            .contains("answered 500 Internal Server Error twice with the same error")
            && e.message.contains("Input should be 'text' or 'json_object'"),
        "{}",
        e.message
    );
    assert_eq!(server.hits().len(), 4, "asked twice, in the form it was told");
}

/// Permanent server errors fail at once: 501 (a `base_url` that is a static file server, as
/// Python's `http.server` answers a POST) and 505 are not retried, not even by the step's
/// `retry`; a 500 that says the request is invalid is asked once more and, the same again,
/// fails with the server's message. A 500 that does not say so is retried as before.
#[tokio::test]
async fn permanent_server_errors_fail_at_once() {
    let server = Llm::spawn().await;
    let dir = TempDir::new("llm-permanent");
    let path = write_flow(
        &dir,
        "f.yaml",
        &flow_text(
            &server.base_url(),
            "",
            "",
            "    retry: {attempts: 3, backoff: 10ms, on: [agent]}",
        ),
    );
    let plan = plan_of(&path);
    let engine = memory_engine();
    let static_files = "<!DOCTYPE HTML>\n<html><head><title>Error response</title></head><body>\
        <h1>Error response</h1><p>Error code: 501</p><p>Message: Unsupported method ('POST').</p></body></html>";
    for (code, seen) in [(501, 1), (505, 2)] {
        server.script([Reply::Status(code, None, static_files.into())]);
        let out = run(&engine, &plan, json!({"text": "hi"})).await;
        let e = out.error.expect("fails");
        assert_eq!(e.kind.as_str(), "agent", "{code}");
        assert!(
            e.message.contains(&format!("answered {code}"))
                && e.message.contains("not retried")
                && e.message.contains("Unsupported method ('POST')"),
            "{}",
            e.message
        );
        assert_eq!(server.hits().len(), seen, "{code} is asked once");
    }
    let invalid = r#"{"error": {"message": "invalid value for 'temperature': must be between 0 and 2", "type": "server_error"}}"#;
    server.default_reply(Reply::Status(500, None, invalid.into()));
    let out = run(&engine, &plan, json!({"text": "hi"})).await;
    let e = out.error.expect("fails");
    assert_eq!(e.kind.as_str(), "agent");
    assert!(
        e.message.ends_with(
            "answered 500 Internal Server Error twice with the same error, which says the request \
             itself is invalid (not retried): invalid value for 'temperature': must be between 0 and 2"
        ),
        "{}",
        e.message
    );
    assert_eq!(
        server.hits().len(),
        4,
        "the 500 is asked twice, the step not again"
    );

    // The same 500 that says nothing of the request is a server failing for a while.
    server.script([
        Reply::Status(500, Some("0".into()), "upstream overloaded".into()),
        Reply::Status(500, Some("0".into()), "upstream overloaded".into()),
        Reply::Answer(classification("billing", 0.9)),
    ]);
    let out = run(&engine, &plan, json!({"text": "hi"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    assert_eq!(server.hits().len(), 7);
}

/// `runs show --json` and `runs show` tell which structured-output form a call used, and
/// what the server refused.
#[test]
fn the_form_used_is_on_the_step_record() {
    let server = Llm::start();
    server.refuse_json_schema(500, mock_server::LLAMA_CPP_PYTHON_REFUSAL);
    server.default_reply(Reply::Answer(classification("billing", 0.9)));
    let dir = TempDir::new("llm-form-shown");
    write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
    let store = ["--store", "sqlite:runs.db"];
    let out = support::run(
        support::switchyard(dir.path())
            .args(["run", "f.yaml", "--input", r#"{"text": "hi"}"#])
            .args(store),
    );
    assert_eq!(out.code(), 0, "{out:?}");
    let id = run_ids(&dir, &store).remove(0);
    let json = support::run(
        support::switchyard(dir.path())
            .args(["runs", "show", &id, "--json"])
            .args(store),
    );
    let doc: Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(doc["steps"][0]["answers"]["structured_output"], "json_object");
    let shown = support::run(
        support::switchyard(dir.path())
            .args(["runs", "show", &id])
            .args(store),
    );
    assert!(
        shown
            .stdout
            .contains("structured output: json_object (the server refused json_schema: 1 validation error"),
        "{}",
        shown.stdout
    );
}
