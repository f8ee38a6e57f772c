//! Agent loops (SPEC §6.3) against the local OpenAI-compatible server over real HTTP: the
//! exact requests the engine sends (tools, tool_choice, the assistant's tool calls echoed,
//! `tool` messages in the model's order), several calls per turn finishing out of order,
//! malformed arguments, unknown tools, a failing tool, 429s mid-loop, budget pressure and
//! `max_iterations`, `until_tool`, and the records of every turn and call.

use std::sync::Arc;

use serde_json::{Value, json};
use switchyard::__private::record::RunStatus;
use switchyard::__private::runtime::engine::Engine;
use switchyard::__private::store::Store;
use switchyard::__private::store::memory::MemoryStore;

use crate::llm::plan_of;
use crate::mock_server::{Llm, Reply};
use crate::support::TempDir;

/// A flow whose step `answer` calls agent loop `researcher` with tools `kb_search` (a mock
/// answering after `kb_latency`), `crm_lookup` (a mock answering at once, with an
/// `input_schema`) and `broken` (a mock that always fails). `extra` is more YAML under the
/// loop agent (indented 4 spaces).
fn loop_flow(base_url: &str, extra: &str, kb_latency: &str) -> String {
    format!(
        r#"flow: support
providers:
  local:
    base_url: {base_url}
    prices: {{m1: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}}}
agents:
  researcher:
    kind: llm
    provider: local
    model: m1
    system: You answer support questions.
    prompt: "Ticket: {{{{ input.text }}}}"
    tools:
      kb_search: {{description: Search the knowledge base.}}
      crm_lookup: {{}}
      broken: {{}}
{extra}
  kb_search:
    kind: mock
    description: Finds articles.
    latency: {kb_latency}
    returns: {{articles: ["=input.q"]}}
  crm_lookup:
    kind: mock
    description: Looks up a customer.
    input_schema:
      type: object
      required: [id]
      properties: {{id: {{type: integer}}}}
    returns: {{customer: "=input.id", plan: pro}}
  broken:
    kind: mock
    fail_times: 100
    returns: {{}}
steps:
  answer:
    agent: researcher
    input: {{$.text: $.text}}
    output: {{$.reply: $}}
"#
    )
}

fn engine() -> Engine<MemoryStore> {
    Engine::new(Arc::new(MemoryStore::new()))
}

async fn run(
    engine: &Engine<MemoryStore>,
    path: &std::path::Path,
    input: Value,
) -> switchyard::__private::runtime::engine::RunOutcome {
    engine
        .run(plan_of(path), input, json!({}), Default::default())
        .await
}

/// The `tool` messages of a request: (`tool_call_id`, content), in order.
pub fn tool_messages(body: &Value) -> Vec<(String, String)> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Two calls in one turn, the first slower: both run at once, their results enter the
/// conversation in the model's order; the second request carries the tools, the
/// assistant's calls as sent and a `tool` message for each; the answer is the step's result,
/// and each turn and call is a record numbered under the step.
#[tokio::test]
async fn tool_calls_run_and_answer_in_the_models_order() {
    let server = Llm::spawn().await;
    server.script([
        Reply::calls(
            1,
            &[
                ("kb_search", r#"{"q": "refund"}"#),
                ("crm_lookup", r#"{"id": 7}"#),
            ],
        ),
        Reply::Answer("Refunds take 5 days.".into()),
    ]);
    let dir = TempDir::new("loop-order");
    let path = dir.write("f.yaml", loop_flow(&server.base_url(), "", "200ms"));
    let engine = engine();
    let out = run(&engine, &path, json!({"text": "where is my refund"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    assert_eq!(
        out.output.as_ref().unwrap()["reply"],
        json!({"text": "Refunds take 5 days."})
    );
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    let first = &hits[0].body;
    assert_eq!(first["tool_choice"], "auto");
    let names: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert_eq!(t["type"], "function");
            t["function"]["name"].as_str().unwrap()
        })
        .collect();
    assert_eq!(names, ["kb_search", "crm_lookup", "broken"]);
    assert_eq!(
        first["tools"][0]["function"]["description"],
        "Search the knowledge base."
    );
    assert_eq!(
        first["tools"][1]["function"]["description"],
        "Looks up a customer."
    );
    assert_eq!(
        first["tools"][1]["function"]["parameters"]["required"],
        json!(["id"])
    );
    assert_eq!(
        first["tools"][2]["function"]["parameters"],
        json!({"type": "object"})
    );
    assert!(first.get("response_format").is_none());
    let second = &hits[1].body;
    let msgs = second["messages"].as_array().unwrap();
    let assistant = &msgs[msgs.len() - 3];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["content"], Value::Null);
    assert_eq!(assistant["tool_calls"][0]["id"], "call_1_1");
    assert_eq!(assistant["tool_calls"][1]["function"]["name"], "crm_lookup");
    assert_eq!(
        assistant["tool_calls"][1]["function"]["arguments"],
        r#"{"id": 7}"#
    );
    assert_eq!(
        tool_messages(second),
        [
            ("call_1_1".to_owned(), r#"{"articles":["refund"]}"#.to_owned()),
            ("call_1_2".to_owned(), r#"{"customer":7,"plan":"pro"}"#.to_owned()),
        ]
    );
    let steps = engine.store.steps(&out.run_id).await.unwrap();
    let parts: Vec<(String, String, String)> = steps
        .iter()
        .map(|s| (s.number.clone(), s.kind.clone(), s.status.as_str().to_owned()))
        .collect();
    let has = |n: &str, k: &str| {
        parts
            .iter()
            .any(|(pn, pk, st)| pn == n && pk == k && st == "succeeded")
    };
    assert!(
        has("1.t1", "turn")
            && has("1.t1.1", "tool")
            && has("1.t1.2", "tool")
            && has("1.t2", "turn")
            && has("1", "agent"),
        "{parts:?}"
    );
    let step = steps.iter().find(|s| s.number == "1").unwrap();
    let answers = step.answers.as_ref().unwrap();
    assert_eq!(answers["turns"], 2);
    assert_eq!(answers["tool_calls"], 2);
    assert_eq!(answers["transcript"].as_array().unwrap().len(), msgs.len() + 1);
    // Every turn's tokens roll up into the step and the run.
    let tokens: u64 = hits.iter().map(|h| h.tokens).sum();
    assert_eq!(step.usage.input_tokens + step.usage.output_tokens, tokens);
    assert_eq!(out.usage.input_tokens + out.usage.output_tokens, tokens);
}

/// Malformed arguments, arguments against `input_schema`, an unknown tool and a tool that
/// fails each become a `tool` message saying so, recorded as a failed call, and the model
/// goes on.
#[tokio::test]
async fn bad_calls_become_tool_messages() {
    let server = Llm::spawn().await;
    server.script([
        Reply::calls(
            1,
            &[
                ("kb_search", r#"{"q": "x"#),
                ("crm_lookup", r#"{"id": "seven"}"#),
                ("refund", "{}"),
                ("broken", "{}"),
            ],
        ),
        Reply::Answer("done".into()),
    ]);
    let dir = TempDir::new("loop-bad-calls");
    let path = dir.write("f.yaml", loop_flow(&server.base_url(), "", "0ms"));
    let engine = engine();
    let out = run(&engine, &path, json!({"text": "hi"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let tools = tool_messages(&server.hits()[1].body);
    assert_eq!(tools.len(), 4);
    assert!(
        tools[0]
            .1
            .starts_with("the arguments of `kb_search` are not valid JSON: "),
        "{}",
        tools[0].1
    );
    assert!(
        tools[1]
            .1
            .starts_with("the arguments of `crm_lookup` do not match its parameters "),
        "{}",
        tools[1].1
    );
    assert_eq!(
        tools[2].1,
        "unknown tool `refund`; the tools are: kb_search, crm_lookup, broken"
    );
    assert!(
        tools[3].1.starts_with("tool `broken` failed (kind `agent`): "),
        "{}",
        tools[3].1
    );
    let steps = engine.store.steps(&out.run_id).await.unwrap();
    for i in 1..=4 {
        let n = format!("1.t1.{i}");
        let rec = steps
            .iter()
            .find(|s| s.number == n)
            .unwrap_or_else(|| panic!("{n} recorded"));
        assert_eq!(rec.status.as_str(), "failed", "{n}");
    }
    let step = steps.iter().find(|s| s.number == "1").unwrap();
    assert_eq!(step.answers.as_ref().unwrap()["tool_failures"], 4);
}

/// A call whose `function.name` is null is answered with a `tool` message saying so, like an
/// unknown tool, and the calls beside it run: the step does not fail.
#[tokio::test]
async fn a_call_without_a_name_becomes_a_tool_message() {
    let server = Llm::spawn().await;
    let turn = json!({
        "choices": [{
            "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": null, "arguments": "{}"}},
                {"id": "call_b", "type": "function", "function": {"name": "kb_search", "arguments": "{\"q\": \"x\"}"}}
            ]},
            "finish_reason": "tool_calls"
        }],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5}
    });
    server.script([Reply::Raw(turn.to_string()), Reply::Answer("done".into())]);
    let dir = TempDir::new("loop-nameless-call");
    let path = dir.write("f.yaml", loop_flow(&server.base_url(), "", "0ms"));
    let engine = engine();
    let out = run(&engine, &path, json!({"text": "hi"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let tools = tool_messages(&server.hits()[1].body);
    assert_eq!(
        tools,
        [
            (
                "call_a".to_owned(),
                "the call names no tool (its `function.name` is missing or not a string); the tools are: \
                 kb_search, crm_lookup, broken"
                    .to_owned()
            ),
            ("call_b".to_owned(), r#"{"articles":["x"]}"#.to_owned()),
        ]
    );
    let steps = engine.store.steps(&out.run_id).await.unwrap();
    let nameless = steps
        .iter()
        .find(|s| s.number == "1.t1.1")
        .expect("1.t1.1 recorded");
    assert_eq!(nameless.status.as_str(), "failed");
    let step = steps.iter().find(|s| s.number == "1").unwrap();
    assert_eq!(step.answers.as_ref().unwrap()["tool_failures"], 1);
}

/// At 70% of `max_iterations` the model is told once to answer; a model that goes on calling
/// tools fails the step with kind `limit` at the bound.
#[tokio::test]
async fn budget_pressure_then_the_limit() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::calls(1, &[("kb_search", r#"{"q": "again"}"#)]));
    let dir = TempDir::new("loop-limit");
    let path = dir.write(
        "f.yaml",
        loop_flow(&server.base_url(), "    max_iterations: 4", "0ms"),
    );
    let engine = engine();
    let out = run(&engine, &path, json!({"text": "hi"})).await;
    assert_eq!(out.status, RunStatus::Failed);
    let e = out.error.unwrap();
    assert_eq!(e.kind.as_str(), "limit");
    assert_eq!(
        e.message,
        "step `answer`: agent loop `researcher` reached `max_iterations` (4) without a final answer"
    );
    let hits = server.hits();
    assert_eq!(hits.len(), 4);
    let notes = |b: &Value| {
        b["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "system" && m["content"].as_str().unwrap().starts_with("You have used"))
            .count()
    };
    // ceil(0.7 × 4) = 3 turns completed before the note: it is in the 4th request, once.
    assert_eq!(notes(&hits[2].body), 0);
    assert_eq!(notes(&hits[3].body), 1);
}

/// 429s in the middle of a loop are waited out like any request's; the loop goes on.
#[tokio::test]
async fn a_429_mid_loop_is_waited_out() {
    let server = Llm::spawn().await;
    server.script([
        Reply::calls(1, &[("kb_search", r#"{"q": "a"}"#)]),
        Reply::Status(429, Some("0".into()), "slow down".into()),
        Reply::Answer("ok".into()),
    ]);
    let dir = TempDir::new("loop-429");
    let path = dir.write("f.yaml", loop_flow(&server.base_url(), "", "0ms"));
    let engine = engine();
    let out = run(&engine, &path, json!({"text": "hi"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let hits = server.hits();
    assert_eq!(hits.iter().map(|h| h.status).collect::<Vec<_>>(), [200, 429, 200]);
    assert_eq!(hits[1].body["messages"], hits[2].body["messages"]);
}

/// `until_tool`: the loop ends when that tool's result lands, and that result, checked by
/// `result_schema`, is the step's.
#[tokio::test]
async fn until_tool_ends_the_loop_with_its_result() {
    let server = Llm::spawn().await;
    server.script([Reply::calls(1, &[("crm_lookup", r#"{"id": 3}"#)])]);
    let dir = TempDir::new("loop-until");
    let extra = "    until_tool: crm_lookup\n    result_schema: {type: object, required: [customer]}";
    let path = dir.write("f.yaml", loop_flow(&server.base_url(), extra, "0ms"));
    let engine = engine();
    let out = run(&engine, &path, json!({"text": "hi"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    assert_eq!(
        out.output.unwrap()["reply"],
        json!({"customer": 3, "plan": "pro"})
    );
    assert_eq!(server.hits().len(), 1);
}

/// A `flow` tool is a sub-agent with a child run numbered under the call (`1.t1.1`); a call
/// beyond `max_depth` becomes a tool message in Jazz's words, and the model goes on.
#[tokio::test]
async fn a_flow_tool_is_a_child_run_and_depth_is_a_tool_message() {
    let server = Llm::spawn().await;
    server.script([
        Reply::calls(1, &[("writer", r#"{"topic": "refund"}"#)]),
        Reply::Answer("sent".into()),
    ]);
    let dir = TempDir::new("loop-flow-tool");
    dir.write(
        "writer.yaml",
        "flow: writer\nagents:\n  draft:\n    kind: transform\n    result: {reply: '=\"About \" + input.topic'}\n\
         steps:\n  write:\n    agent: draft\n    output: {$.reply: $.reply}\noutput:\n  select: $.reply\n",
    );
    let extra = "  writer:\n    kind: flow\n    path: writer.yaml\n    description: Writes the reply.";
    let text = loop_flow(&server.base_url(), "", "0ms")
        .replace("      broken: {}\n", "      broken: {}\n      writer: {}\n")
        .replace("  broken:\n", &format!("{extra}\n  broken:\n"));
    let path = dir.write("f.yaml", &text);
    let engine = engine();
    let out = run(&engine, &path, json!({"text": "hi"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let tools = tool_messages(&server.hits()[1].body);
    assert_eq!(tools[0].1, "About refund");
    let children = engine.store.children(&out.run_id).await.unwrap();
    assert_eq!(children.len(), 1);
    assert_eq!(children[0].parent_step.as_deref(), Some("1.t1.1"));
    let child_steps = engine.store.steps(&children[0].id).await.unwrap();
    assert_eq!(child_steps[0].number, "1.t1.1.1");

    // With no depth left, the call is refused and the model is told to do it itself.
    server.script([
        Reply::calls(1, &[("writer", r#"{"topic": "refund"}"#)]),
        Reply::Answer("done myself".into()),
    ]);
    let shallow = dir.write(
        "shallow.yaml",
        text.replace("steps:\n  answer:", "limits: {max_depth: 0}\nsteps:\n  answer:"),
    );
    let out = run(&engine, &shallow, json!({"text": "hi"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let hits = server.hits();
    let tools = tool_messages(&hits[hits.len() - 1].body);
    assert_eq!(
        tools[0].1,
        "nesting limit reached (depth 0 of 0). Do this task yourself instead of delegating it further."
    );
}

/// The ceiling: a tool whose kind the flow does not `allow`, or that an agent change takes
/// away, is not offered to the model; a call of it anyway is answered as not available.
#[tokio::test]
async fn tools_outside_the_ceiling_are_not_offered() {
    let server = Llm::spawn().await;
    server.script([
        Reply::calls(1, &[("kb_search", r#"{"q": "x"}"#)]),
        Reply::Answer("ok".into()),
    ]);
    let dir = TempDir::new("loop-ceiling");
    let text = loop_flow(&server.base_url(), "", "0ms");
    let path = dir.write("f.yaml", &text);
    let plan = plan_of(&path);
    let changes = switchyard::__private::runtime::changes::load(
        "change.yaml",
        "- scope: global\n  mode: remove\n  agents: [kb_search]\n",
        &plan,
    )
    .expect("a change");
    let options = switchyard::__private::with_agent_changes(switchyard::RunOptions::default(), changes);
    let engine = engine();
    let out = engine.run(plan, json!({"text": "hi"}), json!({}), options).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let hits = server.hits();
    let offered: Vec<&str> = hits[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["crm_lookup", "broken"]);
    let tools = tool_messages(&hits[1].body);
    assert_eq!(
        tools[0].1,
        "tool `kb_search` is not available here: agent `kb_search` of flow `support` is removed by an agent change"
    );
}

/// Every turn's and tool's cost counts against `max_cost_usd`: once spent, the loop asks
/// the model no more and fails with kind `limit`.
#[tokio::test]
async fn a_spent_budget_stops_the_loop() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::calls(1, &[("kb_search", r#"{"q": "again"}"#)]));
    let dir = TempDir::new("loop-budget");
    let text = loop_flow(&server.base_url(), "", "0ms").replace(
        "steps:\n  answer:",
        "limits: {max_cost_usd: 0.0002}\nsteps:\n  answer:",
    );
    let path = dir.write("f.yaml", &text);
    let engine = engine();
    let out = run(&engine, &path, json!({"text": "hi"})).await;
    let e = out.error.expect("an error");
    assert_eq!(e.kind.as_str(), "limit", "{e:?}");
    assert!(e.message.contains("cost limit reached"), "{}", e.message);
    let turns = server.hits().len();
    assert!((2..30).contains(&turns), "{turns} turns");
    assert!(out.usage.cost_usd.usd() >= 0.0002, "{:?}", out.usage);
}

/// `context_paths` and the run's conversation reach the first request as for a single call.
#[tokio::test]
async fn context_and_conversation_reach_the_loop() {
    let server = Llm::spawn().await;
    server.script([Reply::Answer("ok".into())]);
    let dir = TempDir::new("loop-context");
    let extra = "    context_paths: [$.account]\n    message_mode: all";
    let path = dir.write("f.yaml", loop_flow(&server.base_url(), extra, "0ms"));
    let engine = engine();
    let options =
        switchyard::RunOptions::default().messages(vec![json!({"role": "user", "content": "earlier"})]);
    let out = engine
        .run(
            plan_of(&path),
            json!({"text": "hi", "account": {"tier": "gold"}}),
            json!({}),
            options,
        )
        .await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let body = &server.hits()[0].body;
    let contents: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        contents,
        [
            "You answer support questions.",
            "earlier",
            "Context:\n$.account = {\"tier\":\"gold\"}",
            "Ticket: hi"
        ]
    );
}

/// The provider's key stays a reference: a server that echoes it into a tool call's
/// arguments and into its answer leaves it in no record, no transcript, no stream.
#[test]
fn secrets_in_a_loop_are_redacted() {
    use crate::llm::{CANARY, assert_no_canary_in};
    let server = Llm::start();
    server.script([
        Reply::calls(1, &[("kb_search", &format!(r#"{{"q": "Bearer {CANARY}"}}"#))]),
        Reply::Answer(format!("the key is {CANARY}")),
    ]);
    let dir = TempDir::new("loop-secrets");
    let text = loop_flow(&server.base_url(), "", "0ms").replace(
        "    prices:",
        "    api_key: ${env:SWITCHYARD_LOOP_KEY}\n    prices:",
    );
    dir.write("f.yaml", &text);
    let out = crate::support::run(
        crate::support::switchyard(dir.path())
            .args(["run", "f.yaml", "--trace", "--store", "sqlite:runs.db"])
            .args(["--input", r#"{"text": "hi"}"#])
            .env("SWITCHYARD_LOOP_KEY", CANARY),
    );
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(
        !out.stdout.contains(CANARY) && !out.stderr.contains(CANARY),
        "{out:?}"
    );
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    assert_eq!(
        hits[0].headers["authorization"].to_str().unwrap(),
        format!("Bearer {CANARY}")
    );
    assert_no_canary_in(dir.path());
}

/// With `until_tool`, a text answer is not taken and not parsed: the model is told to call
/// the tool, and its result is the answer.
#[tokio::test]
async fn until_tool_does_not_take_a_text_answer() {
    let server = Llm::spawn().await;
    server.script([
        Reply::Answer("I think the customer is 3.".into()),
        Reply::calls(2, &[("crm_lookup", r#"{"id": 3}"#)]),
    ]);
    let dir = TempDir::new("loop-until-text");
    let extra = "    until_tool: crm_lookup\n    result_schema: {type: object, required: [customer]}";
    let path = dir.write("f.yaml", loop_flow(&server.base_url(), extra, "0ms"));
    let engine = engine();
    let out = run(&engine, &path, json!({"text": "hi"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    assert_eq!(
        out.output.unwrap()["reply"],
        json!({"customer": 3, "plan": "pro"})
    );
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    let last = hits[1].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        last,
        json!({"role": "user", "content": "Call `crm_lookup` to finish; an answer in text is not taken."})
    );
}

/// A turn's calls run at once: the first call waits for a file the second writes, and sees
/// it; with `max_parallel_tools: 1` the first runs alone and gives up before the second
/// starts. Both answer in the model's order.
#[tokio::test]
async fn calls_of_a_turn_run_concurrently_up_to_max_parallel_tools() {
    for (limit, saw) in [("", true), ("    max_parallel_tools: 1\n", false)] {
        let server = Llm::spawn().await;
        server.script([
            Reply::calls(1, &[("waiter", "{}"), ("writer", "{}")]),
            Reply::Answer("done".into()),
        ]);
        let dir = TempDir::new("loop-concurrent");
        let marker = dir.path().join("writer.done");
        let text = format!(
            r#"flow: concurrent
providers:
  local: {{base_url: "{base}"}}
agents:
  bot:
    kind: llm
    provider: local
    model: m1
    prompt: "go"
    tools: [waiter, writer]
{limit}  waiter:
    kind: command
    run: [sh, -c, 'cat >/dev/null; for i in $(seq 60); do [ -f "{m}" ] && break; sleep 0.05; done; if [ -f "{m}" ]; then echo "{{\"saw\": true}}"; else echo "{{\"saw\": false}}"; fi']
  writer:
    kind: command
    run: [sh, -c, 'cat >/dev/null; touch "{m}"; echo "{{\"wrote\": true}}"']
steps:
  go:
    agent: bot
    output: {{$.reply: $}}
"#,
            base = server.base_url(),
            m = marker.display()
        );
        let path = dir.write("f.yaml", text);
        let out = run(&engine(), &path, json!({})).await;
        assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
        assert_eq!(
            tool_messages(&server.hits()[1].body),
            [
                ("call_1_1".to_owned(), format!(r#"{{"saw":{saw}}}"#)),
                ("call_1_2".to_owned(), r#"{"wrote":true}"#.to_owned()),
            ],
            "max_parallel_tools {limit:?}"
        );
    }
}
