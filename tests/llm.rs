//! `llm` agents against a local OpenAI-compatible server ([`mock_server::Llm`], real HTTP on
//! 127.0.0.1): requests as sent, structured output and repairs, retries of 429s and 5xx,
//! timeouts, tokens and cost rolled up, rate limits shared by many runs in the process
//! (measured by the server, in paused time), the conversation and context, and secrets that
//! never reach a stream, a record or a file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard::__private::lint;
use switchyard::__private::plan::Plan;
use switchyard::__private::project::Project;
use switchyard::__private::record::RunStatus;
use switchyard::__private::runtime::engine::{Engine, RunOptions, RunOutcome};
use switchyard::__private::store::Store;
use switchyard::__private::store::memory::MemoryStore;

use crate::mock_server::{Llm, Reply, classification};
use crate::support::{self, TempDir};

/// A flow with provider `local` at `base_url` and an agent `classifier` with a result schema.
/// `provider` and `agent` are extra YAML lines (indented by the caller's 4 spaces).
pub(crate) fn flow_text(base_url: &str, provider: &str, agent: &str, step: &str) -> String {
    format!(
        r#"flow: classify
providers:
  local:
    base_url: {base_url}
    prices: {{m1: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}}}
{provider}
agents:
  classifier:
    kind: llm
    provider: local
    model: m1
    system: You classify support tickets.
    prompt: "{{{{ message }}}} Ticket: {{{{ input.text }}}}"
    max_tokens: 50
    result_schema:
      type: object
      required: [category, confidence]
      properties:
        category: {{type: string, enum: [billing, technical, other]}}
        confidence: {{type: number, minimum: 0, maximum: 1}}
{agent}
steps:
  classify:
    agent: classifier
    message: Classify this ticket.
    input: {{$.text: $.text}}
    output: {{$.classification: $}}
{step}
"#
    )
}

pub(crate) fn write_flow(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    dir.write(name, text)
}

/// Loads and compiles a flow file, panicking with its diagnostics.
pub fn plan_of(path: &Path) -> Arc<Plan> {
    let mut project = Project::default();
    let root = path.parent().expect("a parent").to_path_buf();
    let id = project
        .load_top(path, root, &switchyard::__private::syntax::Limits::default())
        .expect("a flow");
    let (plan, diags) = lint::lint_and_compile(&project, id);
    Arc::new(plan.unwrap_or_else(|| {
        panic!(
            "{}",
            diags
                .iter()
                .map(|d| d.message.clone())
                .collect::<Vec<_>>()
                .join("\n")
        )
    }))
}

pub(crate) async fn run(engine: &Engine<MemoryStore>, plan: &Arc<Plan>, input: Value) -> RunOutcome {
    engine
        .run(plan.clone(), input, json!({}), RunOptions::default())
        .await
}

pub(crate) fn memory_engine() -> Engine<MemoryStore> {
    Engine::new(Arc::new(MemoryStore::new()))
}

fn user_messages(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}: {}",
                m["role"].as_str().unwrap(),
                m["content"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn answers_are_validated_and_tokens_and_cost_recorded() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::Answer(classification("billing", 0.9)));
    let dir = TempDir::new("llm-ok");
    let path = write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
    let engine = memory_engine();
    let out = run(&engine, &plan_of(&path), json!({"text": "charged twice"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    assert_eq!(
        out.output.as_ref().unwrap()["classification"],
        json!({"category": "billing", "confidence": 0.9})
    );
    let hits = server.hits();
    assert_eq!(hits.len(), 1);
    let body = &hits[0].body;
    assert_eq!(body["model"], "m1");
    assert_eq!(body["max_tokens"], 50);
    assert_eq!(body["response_format"]["type"], "json_schema");
    assert_eq!(
        body["response_format"]["json_schema"]["schema"]["required"],
        json!(["category", "confidence"])
    );
    assert_eq!(
        user_messages(body),
        [
            "system: You classify support tickets.",
            "user: Classify this ticket. Ticket: charged twice"
        ]
    );
    assert!(
        hits[0].headers.get("authorization").is_none(),
        "no api_key, no header"
    );

    // The server's token counts, on the step, the run and the outcome; cost from `prices`.
    let resp_tokens = hits[0].tokens;
    let steps = engine.store.steps(&out.run_id).await.unwrap();
    let u = steps[0].usage;
    assert_eq!(u.input_tokens + u.output_tokens, resp_tokens);
    assert!(u.input_tokens > 0 && u.output_tokens > 0);
    // $1 and $2 per million tokens: 1,000 and 2,000 nano-dollars a token.
    let cost = u.input_tokens * 1_000 + u.output_tokens * 2_000;
    assert_eq!(u.cost_usd.nanos(), cost, "{u:?}");
    let record = engine.store.get_run(&out.run_id).await.unwrap();
    assert_eq!(record.usage, u);
    assert_eq!(out.usage, u);
}

#[tokio::test]
async fn usage_rolls_up_from_a_child_run() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::Answer(classification("technical", 0.8)));
    let dir = TempDir::new("llm-nested");
    write_flow(&dir, "child.yaml", &flow_text(&server.base_url(), "", "", ""));
    let parent = write_flow(
        &dir,
        "parent.yaml",
        "flow: parent\nagents:\n  child:\n    kind: flow\n    path: child.yaml\nsteps:\n  \
         first:\n    agent: child\n    output: {$.a: $.classification}\n    next: second\n  \
         second:\n    agent: child\n    output: {$.b: $.classification}\n",
    );
    let engine = memory_engine();
    let out = run(&engine, &plan_of(&parent), json!({"text": "crash"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let tokens: u64 = server.hits().iter().map(|h| h.tokens).sum();
    assert_eq!(out.usage.input_tokens + out.usage.output_tokens, tokens);
    let children = engine.store.children(&out.run_id).await.unwrap();
    assert_eq!(children.len(), 2);
    let child_sum: switchyard::Cost = children.iter().map(|c| c.usage.cost_usd).sum();
    assert!(!child_sum.is_zero() && out.usage.cost_usd == child_sum);
    let steps = engine.store.steps(&out.run_id).await.unwrap();
    let top: Vec<_> = steps.iter().filter(|s| !s.number.contains('.')).collect();
    assert_eq!(top.len(), 2);
    assert_eq!(
        top[0].usage,
        children
            .iter()
            .find(|c| c.parent_step.as_deref() == Some("1"))
            .unwrap()
            .usage
    );
}

#[tokio::test]
async fn a_fenced_answer_is_accepted() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::Answer(format!(
        "Here is the classification:\n```json\n{}\n```",
        classification("other", 0.7)
    )));
    let dir = TempDir::new("llm-fenced");
    let path = write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
    let out = run(&memory_engine(), &plan_of(&path), json!({"text": "hi"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    assert_eq!(out.output.unwrap()["classification"]["category"], "other");
    assert_eq!(server.hits().len(), 1);
}

#[tokio::test]
async fn prose_is_repaired_by_asking_again_with_the_error() {
    let server = Llm::spawn().await;
    server.script([
        Reply::Answer("The category is billing, I am fairly sure.".into()),
        Reply::Answer(classification("billing", 0.95)),
    ]);
    let dir = TempDir::new("llm-repair");
    let path = write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
    let engine = memory_engine();
    let out = run(&engine, &plan_of(&path), json!({"text": "hi"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    let second = user_messages(&hits[1].body);
    assert_eq!(second.len(), 4, "{second:?}");
    assert_eq!(second[2], "assistant: The category is billing, I am fairly sure.");
    assert!(
        second[3].starts_with("user: Your answer could not be used: the answer is not valid JSON"),
        "{}",
        second[3]
    );
    // Both requests' tokens count.
    let tokens: u64 = hits.iter().map(|h| h.tokens).sum();
    assert_eq!(out.usage.input_tokens + out.usage.output_tokens, tokens);
}

#[tokio::test]
async fn a_schema_violation_fails_with_invalid_output_naming_the_pointer() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::Answer(classification("billing", 1.5)));
    let dir = TempDir::new("llm-violation");
    let path = write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
    let out = run(&memory_engine(), &plan_of(&path), json!({"text": "hi"})).await;
    assert_eq!(out.status, RunStatus::Failed);
    let e = out.error.unwrap();
    assert_eq!(e.kind.as_str(), "invalid_output");
    assert!(e.message.contains("at `/confidence`"), "{}", e.message);
    assert!(e.message.ends_with("(after 2 requests)"), "{}", e.message);
    assert_eq!(e.details.unwrap()["pointer"], "/confidence");
    assert_eq!(server.hits().len(), 2, "repair_attempts defaults to 1");
    // The repair request named the violation.
    let last = user_messages(&server.hits()[1].body).pop().unwrap();
    assert!(last.contains("at `/confidence`"), "{last}");
}

#[tokio::test]
async fn truncated_answers_fail_without_repairs_when_none_are_allowed() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::Answer("{\"category\": \"bill".into()));
    let dir = TempDir::new("llm-truncated");
    let path = write_flow(
        &dir,
        "f.yaml",
        &flow_text(&server.base_url(), "", "    repair_attempts: 0", ""),
    );
    let out = run(&memory_engine(), &plan_of(&path), json!({"text": "hi"})).await;
    let e = out.error.unwrap();
    assert_eq!(e.kind.as_str(), "invalid_output");
    assert!(
        e.message.contains("is not valid JSON: EOF while parsing"),
        "{}",
        e.message
    );
    assert_eq!(server.hits().len(), 1);
}

#[tokio::test]
async fn answers_without_a_schema_are_text() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::Answer("Dear customer, ...".into()));
    let dir = TempDir::new("llm-text");
    let text = flow_text(&server.base_url(), "", "", "").replace(
        "    result_schema:\n      type: object\n      required: [category, confidence]\n      properties:\n        category: {type: string, enum: [billing, technical, other]}\n        confidence: {type: number, minimum: 0, maximum: 1}\n",
        "",
    );
    let path = write_flow(&dir, "f.yaml", &text);
    let out = run(&memory_engine(), &plan_of(&path), json!({"text": "hi"})).await;
    assert_eq!(
        out.output.unwrap()["classification"],
        json!({"text": "Dear customer, ..."})
    );
    assert!(server.hits()[0].body.get("response_format").is_none());
}

#[tokio::test]
async fn server_errors_are_retried_and_a_broken_response_fails() {
    let server = Llm::spawn().await;
    server.script([
        Reply::Status(500, None, "boom".into()),
        Reply::Status(503, Some("0".into()), "busy".into()),
        Reply::Answer(classification("billing", 0.9)),
        Reply::Raw("{\"choices\": [{\"message\": {\"content\": \"{".into()),
    ]);
    let dir = TempDir::new("llm-5xx");
    let path = write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
    let plan = plan_of(&path);
    let engine = memory_engine();
    let out = run(&engine, &plan, json!({"text": "hi"})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    assert_eq!(server.hits().len(), 3);
    let statuses: Vec<u16> = server.hits().iter().map(|h| h.status).collect();
    assert_eq!(statuses, [500, 503, 200]);
    // A response that is not a completion is an `agent` error, not retried by the transport.
    let out = run(&engine, &plan, json!({"text": "hi"})).await;
    let e = out.error.unwrap();
    assert_eq!(e.kind.as_str(), "agent");
    assert!(e.message.contains("the response is not JSON"), "{}", e.message);
    assert_eq!(server.hits().len(), 4);
}

#[tokio::test]
async fn a_slow_answer_times_out() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::Slow(
        Duration::from_secs(3),
        classification("billing", 0.9),
    ));
    let dir = TempDir::new("llm-slow");
    let path = write_flow(
        &dir,
        "f.yaml",
        &flow_text(&server.base_url(), "", "", "    timeout: 200ms"),
    );
    let t0 = std::time::Instant::now();
    let out = run(&memory_engine(), &plan_of(&path), json!({"text": "hi"})).await;
    let e = out.error.unwrap();
    assert_eq!(e.kind.as_str(), "timeout");
    assert!(e.message.contains("did not answer within 200ms"), "{}", e.message);
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_429_beyond_the_retry_deadline_fails_rate_limited_at_once() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::Status(429, Some("600".into()), "slow down".into()));
    let dir = TempDir::new("llm-429-long");
    let path = write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
    let t0 = std::time::Instant::now();
    let out = run(&memory_engine(), &plan_of(&path), json!({"text": "hi"})).await;
    let e = out.error.unwrap();
    assert_eq!(e.kind.as_str(), "rate_limited");
    assert!(
        e.message.contains("429 Too Many Requests: slow down"),
        "{}",
        e.message
    );
    assert_eq!(server.hits().len(), 1);
    assert!(t0.elapsed() < Duration::from_secs(2));
}

/// Paused time: the server runs on the test's runtime and counts in the same virtual clock.
#[tokio::test(start_paused = true)]
async fn a_429_storm_pauses_every_run_for_its_retry_after() {
    let server = Llm::spawn().await;
    server.script((0..5).map(|_| Reply::Status(429, Some("2".into()), "slow down".into())));
    server.default_reply(Reply::Answer(classification("billing", 0.9)));
    let dir = TempDir::new("llm-429-storm");
    let path = write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
    let plan = plan_of(&path);
    let engine = memory_engine();
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..20 {
        let (engine, plan) = (engine.clone(), plan.clone());
        runs.spawn(async move { run(&engine, &plan, json!({"text": format!("t{i}")})).await });
    }
    while let Some(out) = runs.join_next().await {
        let out = out.unwrap();
        assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    }
    let mut hits = server.hits();
    hits.sort_by_key(|h| h.at);
    assert_eq!(hits.iter().filter(|h| h.status == 429).count(), 5);
    assert_eq!(hits.iter().filter(|h| h.status == 200).count(), 20);
    // After a 429 asking for 2s, no new request arrives for 2s: the whole provider waits
    // (requests already in flight with it arrive at the same instant).
    for h in hits.iter().filter(|h| h.status == 429) {
        for later in hits.iter().filter(|x| x.at > h.at) {
            assert!(
                later.at - h.at >= Duration::from_secs(2),
                "a request {:?} after a 429",
                later.at - h.at
            );
        }
    }
    assert!(hits.last().unwrap().at - hits[0].at >= Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn endless_429s_give_up_at_the_retry_deadline() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::Status(429, Some("10".into()), "slow down".into()));
    let dir = TempDir::new("llm-429-endless");
    let path = write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
    let t0 = tokio::time::Instant::now();
    let out = run(&memory_engine(), &plan_of(&path), json!({"text": "hi"})).await;
    let e = out.error.unwrap();
    assert_eq!(e.kind.as_str(), "rate_limited");
    // Tries at 0s, 10s, ... 120s; the next would start after the deadline.
    assert!(
        e.message.contains("gave up after 13 tries in 2m"),
        "{}",
        e.message
    );
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(120) && took <= Duration::from_secs(121),
        "{took:?}"
    );
    assert_eq!(server.hits().len(), 13);
}

/// 200 runs in one process share one provider limited to 60 requests per minute: the server
/// never sees more than 60 in any minute, and nobody fails; the runs take the time the limit
/// dictates (200 requests at one per second).
#[tokio::test(start_paused = true)]
async fn two_hundred_runs_stay_under_the_request_limit_by_waiting() {
    let server = Llm::spawn().await;
    server
        .default_reply(Reply::Answer(classification("billing", 0.9)))
        .latency(Duration::from_millis(50));
    let dir = TempDir::new("llm-rpm");
    let path = write_flow(
        &dir,
        "f.yaml",
        &flow_text(
            &server.base_url(),
            "    max_concurrency: 50\n    rate_limit: {requests_per_minute: 60}",
            "",
            "    timeout: 5s",
        ),
    );
    let plan = plan_of(&path);
    let engine = memory_engine();
    let t0 = tokio::time::Instant::now();
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (engine, plan) = (engine.clone(), plan.clone());
        runs.spawn(async move { run(&engine, &plan, json!({"text": format!("t{i}")})).await });
    }
    while let Some(out) = runs.join_next().await {
        let out = out.unwrap();
        assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    }
    let took = t0.elapsed().as_secs_f64();
    assert_eq!(server.hits().len(), 200);
    assert!(server.max_requests_in(Duration::from_secs(60)) <= 60);
    // 199 intervals of (60s + margin) / 60, plus the last answer's latency.
    let expect = 199.0 * 60.5 / 60.0;
    assert!(
        (took - expect).abs() / expect < 0.05,
        "took {took}s, expected about {expect}s"
    );
}

/// Tokens per minute: every request reserves its estimate (request size and `max_tokens`),
/// settled to the server's count; the server never counts more than the limit in a minute.
#[tokio::test(start_paused = true)]
async fn many_runs_stay_under_the_token_limit() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::Answer(classification("billing", 0.9)));
    let dir = TempDir::new("llm-tpm");
    let path = write_flow(
        &dir,
        "f.yaml",
        &flow_text(
            &server.base_url(),
            "    rate_limit: {tokens_per_minute: 600}",
            "",
            "    timeout: 5s",
        ),
    );
    let plan = plan_of(&path);
    let engine = memory_engine();
    let t0 = tokio::time::Instant::now();
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..60 {
        let (engine, plan) = (engine.clone(), plan.clone());
        runs.spawn(async move { run(&engine, &plan, json!({"text": format!("ticket {i}")})).await });
    }
    while let Some(out) = runs.join_next().await {
        assert_eq!(out.unwrap().status, RunStatus::Succeeded);
    }
    let total: u64 = server.hits().iter().map(|h| h.tokens).sum();
    let max = server.max_tokens_in(Duration::from_secs(60));
    assert!(max <= 600, "{max} tokens in a minute");
    // It had to wait: four times the tokens one minute allows, spread over the minutes needed.
    assert!(total > 2400, "{total}");
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    assert!(
        minutes >= (total as f64 / 600.0) - 1.0,
        "{minutes} minutes for {total} tokens"
    );
}

#[test]
fn the_conversation_and_context_reach_the_request() {
    let server = Llm::start();
    server.default_reply(Reply::Answer(classification("billing", 0.9)));
    let dir = TempDir::new("llm-conversation");
    let flow = flow_text(
        &server.base_url(),
        "",
        "    message_mode: bookend\n    max_messages: 4\n    context_paths: [$.customer]",
        "",
    );
    write_flow(&dir, "f.yaml", &flow);
    let messages: Vec<Value> = (0..6)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("m{i}")}))
        .collect();
    dir.write("messages.json", serde_json::to_string(&messages).unwrap());
    let input = json!({"text": "charged twice", "customer": {"tier": "pro"}});
    let out = support::run(support::switchyard(dir.path()).args([
        "run",
        "f.yaml",
        "--messages",
        "messages.json",
        "--input",
        &input.to_string(),
    ]));
    assert_eq!(out.code(), 0, "{out:?}");
    let body = &server.hits()[0].body;
    assert_eq!(
        user_messages(body),
        [
            "system: You classify support tickets.",
            "user: m0",
            "assistant: m1",
            "user: [2 earlier messages left out]",
            "user: m4",
            "assistant: m5",
            "user: Context:\n$.customer = {\"tier\":\"pro\"}",
            "user: Classify this ticket. Ticket: charged twice",
        ]
    );

    // A bad conversation file is a usage error before the run.
    dir.write("bad.json", "[{\"content\": \"no role\"}]");
    let out = support::run(support::switchyard(dir.path()).args(["run", "f.yaml", "--messages", "bad.json"]));
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr
            .contains("message 0 is not an object with a string `role`"),
        "{}",
        out.stderr
    );
    assert_eq!(server.hits().len(), 1);
}

#[test]
fn a_missing_secret_is_an_error_before_the_run_starts() {
    let server = Llm::start();
    let dir = TempDir::new("llm-missing-secret");
    let flow = flow_text(
        &server.base_url(),
        "    api_key: ${env:SWITCHYARD_TEST_SURELY_UNSET_KEY}",
        "",
        "",
    );
    write_flow(&dir, "f.yaml", &flow);
    let out = support::run(
        support::switchyard(dir.path())
            .env_remove("SWITCHYARD_TEST_SURELY_UNSET_KEY")
            .args(["run", "f.yaml", "--input", "{\"text\": \"x\"}"]),
    );
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr.contains(
            "environment variable SWITCHYARD_TEST_SURELY_UNSET_KEY is not set, needed by the `api_key` of provider `local` in flow `classify`"
        ),
        "{}",
        out.stderr
    );
    assert!(server.hits().is_empty());
    // `lint` stays offline: it does not read the environment.
    let out = support::run(support::switchyard(dir.path()).args(["lint", "f.yaml"]));
    assert_eq!(out.code(), 0, "{out:?}");
}

pub const CANARY: &str = "canary-7f3a9c1e-secret-do-not-leak";

/// A flow whose api key is the canary: the server echoes it back in one answer and in the
/// body of an error; it is never in stdout, stderr, `--trace` or the JSON logs.
#[test]
fn secrets_never_reach_streams_traces_or_logs() {
    let server = Llm::start();
    server.script([
        // Retried (and logged) before the echo.
        Reply::Status(500, Some("0".into()), format!("oops Bearer {CANARY}")),
        Reply::EchoAuth,
        Reply::Status(400, None, format!("bad key Bearer {CANARY}")),
    ]);
    let dir = TempDir::new("llm-canary");
    let text = flow_text(
        &server.base_url(),
        "    api_key: ${env:SWITCHYARD_CANARY_KEY}",
        "",
        "",
    )
    .replace(
        "      required: [category, confidence]\n",
        "      required: [echo]\n",
    );
    write_flow(&dir, "f.yaml", &text);
    let run = |extra: &[&str]| {
        support::run(
            support::switchyard(dir.path())
                .env("SWITCHYARD_CANARY_KEY", CANARY)
                .args([
                    "--log-format",
                    "json",
                    "-vv",
                    "run",
                    "f.yaml",
                    "--trace",
                    "--store",
                    "sqlite:runs.db",
                    "--input",
                    "{\"text\": \"x\"}",
                ])
                .args(extra),
        )
    };
    let ok = run(&[]);
    assert_eq!(ok.code(), 0, "{ok:?}");
    let failed = run(&[]);
    assert_eq!(failed.code(), 1, "{failed:?}");
    // The server did get the key.
    let hits = server.hits();
    assert_eq!(hits[0].headers["authorization"], format!("Bearer {CANARY}"));
    // The echo came back redacted.
    let output: Value = serde_json::from_str(&ok.stdout).unwrap();
    assert_eq!(output["classification"]["echo"], "[redacted]");
    assert!(failed.stderr.contains("bad key [redacted]"), "{}", failed.stderr);
    for (what, text) in [
        ("stdout", &ok.stdout),
        ("stderr", &ok.stderr),
        ("stdout", &failed.stdout),
        ("stderr", &failed.stderr),
    ] {
        assert!(!text.contains(CANARY), "the secret leaked into {what}:\n{text}");
    }
    assert!(
        ok.stderr.contains("retrying the provider") && ok.stderr.contains("oops [redacted]"),
        "{}",
        ok.stderr
    );
    // `runs list` and `runs show` (human and JSON) read the SQLite store back.
    let runs = |args: &[&str]| {
        let out = support::run(
            support::switchyard(dir.path())
                .args(["runs"])
                .args(args)
                .args(["--store", "sqlite:runs.db"]),
        );
        assert_eq!(out.code(), 0, "{out:?}");
        out.stdout
    };
    let list = runs(&["list", "--json"]);
    let ids: Vec<String> = list
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 2, "{list}");
    for id in &ids {
        for shown in [runs(&["show", id]), runs(&["show", id, "--json"])] {
            assert!(!shown.contains(CANARY), "the secret is in `runs show`:\n{shown}");
        }
    }
    assert!(
        runs(&["show", &ids[0], "--json"]).contains("[redacted]")
            || runs(&["show", &ids[1], "--json"]).contains("[redacted]")
    );
    assert!(dir.path().join("runs.db").exists());
    assert_no_canary_in(dir.path());
}

/// The same through the library with a SQLite store: every file written (the database and its
/// WAL) is free of the canary. The environment variable is set only in a child test process
/// (setting it here would race with other tests reading the environment).
#[test]
fn secrets_stay_out_of_the_sqlite_store() {
    if std::env::var("SWITCHYARD_CANARY_CHILD").is_ok() {
        return secrets_child();
    }
    let server = Llm::start();
    server.script([
        Reply::EchoAuth,
        Reply::Status(401, None, format!("unknown key {CANARY}")),
    ]);
    let dir = TempDir::new("llm-canary-sqlite");
    let text = flow_text(
        &server.base_url(),
        "    api_key: ${env:SWITCHYARD_CANARY_KEY}",
        "",
        "",
    )
    .replace(
        "      required: [category, confidence]\n",
        "      required: [echo]\n",
    );
    write_flow(&dir, "f.yaml", &text);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "llm::secrets_stay_out_of_the_sqlite_store",
            "--nocapture",
        ])
        .env("SWITCHYARD_CANARY_CHILD", dir.path())
        .env("SWITCHYARD_CANARY_KEY", CANARY)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child test failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert!(!stdout.contains(CANARY) && !stderr.contains(CANARY));
    assert_eq!(server.hits().len(), 2);
    assert!(dir.path().join("runs.db").exists());
    assert_no_canary_in(dir.path());
}

fn secrets_child() {
    let dir = PathBuf::from(std::env::var("SWITCHYARD_CANARY_CHILD").unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = format!("sqlite:{}", dir.join("runs.db").display());
        let store = switchyard::__private::store::sql::SqlStore::open(&url)
            .await
            .expect("opens");
        let engine = Engine::new(Arc::new(store));
        let plan = plan_of(&dir.join("f.yaml"));
        let ok = engine
            .run(
                plan.clone(),
                json!({"text": "x"}),
                json!({}),
                RunOptions::default(),
            )
            .await;
        assert_eq!(ok.status, RunStatus::Succeeded, "{:?}", ok.error);
        let failed = engine
            .run(plan, json!({"text": "x"}), json!({}), RunOptions::default())
            .await;
        let e = failed.error.unwrap();
        assert!(e.message.contains("unknown key [redacted]"), "{}", e.message);
        // Keep the WAL: read the records back without closing the store.
        let steps = engine.store.steps(&ok.run_id).await.unwrap();
        assert_eq!(steps[0].result.as_ref().unwrap()["echo"], "[redacted]");
        assert!(dir.join("runs.db-wal").exists() || dir.join("runs.db").exists());
    });
}

/// Every file under `dir` (recursively) is free of the canary.
pub fn assert_no_canary_in(dir: &Path) {
    let mut stack = vec![dir.to_path_buf()];
    let mut files = 0;
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            files += 1;
            let bytes = std::fs::read(&p).unwrap();
            assert!(
                !bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()),
                "the secret is in {}",
                p.display()
            );
        }
    }
    assert!(files > 0);
}

/// The README's recipe: `flows/ticket-classify.yaml` pointed at a local server with one
/// environment variable (here the mock; `…_MODEL` renames the model as Ollama wants).
#[test]
fn the_ticket_classify_flow_runs_against_a_local_server() {
    let server = Llm::start();
    server.default_reply(Reply::Answer(
        json!({"category": "billing", "priority": "normal", "confidence": 0.92, "summary": "Charged twice."})
            .to_string(),
    ));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let input = json!({"ticket": {"id": "T-1", "subject": "Charged twice", "body": "My card was charged twice.",
        "customer": {"id": "C-9", "tier": "pro"}}});
    let out = support::run(
        support::switchyard(root)
            .env("SWITCHYARD_PROVIDER_LOCAL_BASE_URL", server.base_url())
            .env("SWITCHYARD_PROVIDER_LOCAL_MODEL", "qwen2.5:7b-instruct")
            .args([
                "run",
                "flows/ticket-classify.yaml",
                "--trace",
                "--input",
                &input.to_string(),
            ]),
    );
    assert_eq!(out.code(), 0, "{out:?}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        (v["queue"].as_str(), v["status"].as_str()),
        (Some("billing"), Some("queued"))
    );
    let body = &server.hits()[0].body;
    assert_eq!(body["model"], "qwen2.5:7b-instruct");
    assert_eq!(
        (body["temperature"].as_f64(), body["max_tokens"].as_u64()),
        (Some(0.0), Some(200))
    );
    let messages = user_messages(body);
    assert!(
        messages[1].starts_with("user: Context:\n$.ticket.customer = {\"id\":\"C-9\""),
        "{messages:?}"
    );
    // The trace shows the tokens; a renamed model has no price, so no cost.
    assert!(
        out.stderr.contains(" tokens (") && out.stderr.contains(" · $0.0000\n"),
        "{}",
        out.stderr
    );
}

/// A nested flow passes the conversation on: a child run's `llm` agent sees the messages the
/// root run was given.
#[tokio::test]
async fn a_child_flow_sees_the_conversation() {
    let server = Llm::spawn().await;
    server.default_reply(Reply::Answer(classification("billing", 0.9)));
    let dir = TempDir::new("llm-nested-conversation");
    write_flow(
        &dir,
        "child.yaml",
        &flow_text(
            &server.base_url(),
            "",
            "    message_mode: latest\n    max_messages: 1",
            "",
        ),
    );
    let parent = write_flow(
        &dir,
        "parent.yaml",
        "flow: parent\nagents:\n  child:\n    kind: flow\n    path: child.yaml\nsteps:\n  go:\n    agent: child\n",
    );
    let options = RunOptions::default().messages(vec![
        json!({"role": "user", "content": "first"}),
        json!({"role": "assistant", "content": "last"}),
    ]);
    let out = memory_engine()
        .run(plan_of(&parent), json!({"text": "hi"}), json!({}), options)
        .await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let messages = user_messages(&server.hits()[0].body);
    assert_eq!(messages[1], "assistant: last");
    assert_eq!(messages.len(), 3);
}

/// The conversation given with `--messages` is recorded with the run: resuming it (here, past
/// an interrupt) needs no `--messages` again, and the `llm` call after the resume sees it.
#[test]
fn a_resumed_run_keeps_its_conversation() {
    let server = Llm::start();
    server.default_reply(Reply::Answer(classification("billing", 0.9)));
    let dir = TempDir::new("llm-resume-conversation");
    let flow = flow_text(
        &server.base_url(),
        "",
        "    message_mode: all",
        "",
    )
    .replace(
        "steps:\n  classify:",
        "start: approve\nsteps:\n  approve:\n    interrupt:\n      prompt: go?\n    next: classify\n  classify:",
    );
    write_flow(&dir, "f.yaml", &flow);
    dir.write(
        "messages.json",
        r#"[{"role": "user", "content": "my card was charged twice"}]"#,
    );
    let store = ["--store", "sqlite:runs.db"];
    let out = support::run(
        support::switchyard(dir.path())
            .args([
                "run",
                "f.yaml",
                "--messages",
                "messages.json",
                "--input",
                r#"{"text": "t"}"#,
            ])
            .args(store),
    );
    assert_eq!(out.code(), 3, "{out:?}");
    assert!(server.hits().is_empty());
    let id = out
        .stderr
        .split("switchyard resume ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("names the run")
        .to_string();
    let out = support::run(
        support::switchyard(dir.path())
            .args(["resume", &id, "--decision", "{}"])
            .args(store),
    );
    assert_eq!(out.code(), 0, "{out:?}");
    let body = &server.hits()[0].body;
    assert!(
        user_messages(body).contains(&"user: my card was charged twice".to_string()),
        "{:?}",
        user_messages(body)
    );
}

/// An answer that failed `result_schema` after a repair is kept in the step's record: the
/// first answer, the repair request, the last answer (cut at 16 KiB), and `runs show` prints
/// them.
#[test]
fn a_failed_answer_and_its_repair_are_kept_and_shown() {
    let server = Llm::start();
    let long = format!("The category is billing. {}", "x".repeat(20 * 1024));
    server.script([
        Reply::Answer("Probably billing, I think.".into()),
        Reply::Answer(long),
    ]);
    let dir = TempDir::new("llm-kept-answer");
    write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
    let store = ["--store", "sqlite:runs.db"];
    let out = support::run(
        support::switchyard(dir.path())
            .args(["run", "f.yaml", "--input", r#"{"text": "hi"}"#])
            .args(store),
    );
    assert_eq!(out.code(), 1, "{out:?}");
    let id = out
        .stderr
        .split("run `")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .unwrap_or_else(|| panic!("names the run: {}", out.stderr))
        .to_string();
    let shown = support::run(
        support::switchyard(dir.path())
            .args(["runs", "show", &id])
            .args(store),
    );
    assert_eq!(shown.code(), 0, "{shown:?}");
    let text = &shown.stdout;
    assert!(
        text.contains("answer 1:\n") && text.contains("| Probably billing, I think."),
        "{text}"
    );
    assert!(
        text.contains("repair 1 asked:\n") && text.contains("| Your answer could not be used"),
        "{text}"
    );
    assert!(
        text.contains("answer 2 (the last):\n") && text.contains("| The category is billing. xxx"),
        "{text}"
    );
    assert!(text.contains("more bytes not kept]"), "{text}");

    let json = support::run(
        support::switchyard(dir.path())
            .args(["runs", "show", &id, "--json"])
            .args(store),
    );
    let doc: Value = serde_json::from_str(&json.stdout).expect("JSON");
    let details = &doc["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["status"] == "failed")
        .expect("the failed step")["error"]["details"];
    assert_eq!(details["repairs"][0]["answer"], "Probably billing, I think.");
    let last = details["answer"].as_str().expect("the last answer");
    assert!(last.len() <= 16 * 1024 + 64, "{}", last.len());
}

/// An answer repaired into one that is used leaves its trace in the step's record: the answer
/// that could not be used and the repair request, which `runs show` prints.
#[test]
fn a_repaired_answer_is_kept_and_shown() {
    let server = Llm::start();
    server.script([
        Reply::Answer("Billing, most likely.".into()),
        Reply::Answer(classification("billing", 0.9)),
    ]);
    let dir = TempDir::new("llm-kept-repair");
    write_flow(&dir, "f.yaml", &flow_text(&server.base_url(), "", "", ""));
    let store = ["--store", "sqlite:runs.db"];
    let out = support::run(
        support::switchyard(dir.path())
            .args(["run", "f.yaml", "--input", r#"{"text": "hi"}"#])
            .args(store),
    );
    assert_eq!(out.code(), 0, "{out:?}");
    let list = support::run(
        support::switchyard(dir.path())
            .args(["runs", "list", "--json"])
            .args(store),
    );
    let run: Value = serde_json::from_str(list.stdout.lines().next().expect("a run")).expect("JSON");
    let id = run["id"].as_str().expect("an id");
    let shown = support::run(
        support::switchyard(dir.path())
            .args(["runs", "show", id])
            .args(store),
    );
    let text = &shown.stdout;
    assert!(
        text.contains("repaired: the answer was used after 1 repair request(s)"),
        "{text}"
    );
    assert!(text.contains("| Billing, most likely."), "{text}");
    assert!(
        text.contains("repair 1 asked:\n") && text.contains("the answer is not valid JSON"),
        "{text}"
    );
    let json = support::run(
        support::switchyard(dir.path())
            .args(["runs", "show", id, "--json"])
            .args(store),
    );
    let doc: Value = serde_json::from_str(&json.stdout).expect("JSON");
    let step = &doc["steps"][0];
    assert_eq!(
        step["answers"]["repairs"][0]["answer"], "Billing, most likely.",
        "{step}"
    );
}

/// The ids of the runs in a store, newest first.
pub(crate) fn run_ids(dir: &TempDir, store: &[&str]) -> Vec<String> {
    let list = support::run(
        support::switchyard(dir.path())
            .args(["runs", "list", "--json"])
            .args(store),
    );
    list.stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("JSON");
            v["id"].as_str().expect("an id").to_owned()
        })
        .collect()
}
