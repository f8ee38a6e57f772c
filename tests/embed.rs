//! Switchyard as a library (`switchyard::Switchyard`): native agents registered by name, the
//! event stream, runs, resumes and batches recorded in a real SQLite store that the binary
//! then reads; and the binary, which registers no native agents, refusing flows that need
//! them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use switchyard::__private::store::Store;
use switchyard::{BatchOptions, Progress, ResumeOptions, StepStatus};
use switchyard::{ErrorKind, Event, Flow, NativeCall, RunConfig, RunStatus, StepError, Switchyard};

use crate::support::{self, TempDir};

const FLOW: &str = r#"
flow: embedded
agents:
  classify:
    kind: native
    result_schema:
      type: object
      required: [category]
      properties: {category: {type: string}}
  flaky:
    kind: native
    retry: {attempts: 3, backoff: 1ms, on: [agent]}
  page:
    kind: native
    function: pager
  inner:
    kind: flow
    steps:
      again:
        agent: classify
        input: {$.text: $.text}
        output: {$.inner_category: $.category}
steps:
  classify:
    agent: classify
    input: {$.text: $.text}
    output: {$.category: $.category}
    next: flaky
  flaky:
    agent: flaky
    output: {$.tries: $.attempt}
    next: each
  each:
    foreach: $.words
    as: word
    agent: classify
    input: {$.text: =word}
    select: $.category
    output: {$.word_categories: $}
    next: child
  child:
    agent: inner
    input: {$.text: $.text}
    output: {$.inner: $.inner_category}
    next: page
  page:
    agent: page
    input: {$.category: $.category}
    output: {$.paged: $.ticket}
    next:
      - to: end
      - to: declined
        on: failure
        errors: [declined]
  declined:
    set:
      $.paged: {value: declined}
"#;

fn classify(input: Value) -> Result<Value, StepError> {
    let text = input["text"]
        .as_str()
        .ok_or_else(|| StepError::new(ErrorKind::Agent, "no text"))?;
    Ok(json!({"category": if text.contains("down") { "outage" } else { "other" }}))
}

/// A Switchyard on `store` with the flow's native agents; `pages` counts the pager's calls,
/// which decline category `other` with an error kind of the application's own.
async fn switchyard(store: &str, pages: Arc<AtomicU64>) -> Switchyard {
    let mut sy = Switchyard::open(store).await.expect("the store opens");
    sy.register_pure("classify", |input: Value, _call: NativeCall| async move {
        classify(input)
    });
    sy.register_pure("flaky", |_input: Value, call: NativeCall| async move {
        if call.attempt < 3 {
            return Err(StepError::new(
                ErrorKind::Agent,
                format!("attempt {} fails", call.attempt),
            ));
        }
        Ok(json!({"attempt": call.attempt}))
    });
    sy.register("pager", move |input: Value, call: NativeCall| {
        let pages = pages.clone();
        async move {
            pages.fetch_add(1, Ordering::SeqCst);
            if input["category"] == "other" {
                return Err(StepError::new(
                    ErrorKind::Custom("declined".into()),
                    "nobody is paged for that",
                ));
            }
            Ok(json!({"ticket": call.idempotency_key()}))
        }
    });
    sy
}

fn json_of(out: &support::Output) -> Value {
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", out.stdout))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_agents_run_with_the_records_of_any_agent_and_their_events_stream() {
    let dir = TempDir::new("embed-run");
    let path = dir.write("embedded.yaml", FLOW);
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    let flow = Flow::load(&path).expect("the flow loads");
    assert_eq!(flow.name(), "embedded");
    assert_eq!(flow.natives(), vec!["classify", "flaky", "pager"]);
    let pages = Arc::new(AtomicU64::new(0));
    let sy = switchyard(&store, pages.clone()).await;
    let mut events = sy.events();

    let input = json!({"text": "the site is down", "words": ["down", "up", "downtime"]});
    let outcome = sy.run(&flow, input).await.expect("the run starts");
    assert_eq!(outcome.status, RunStatus::Succeeded, "{:?}", outcome.error);
    let out = outcome.output.clone().unwrap();
    assert_eq!(out["category"], "outage");
    assert_eq!(
        out["tries"], 3,
        "the retries of `flaky` reached its third attempt"
    );
    assert_eq!(out["word_categories"], json!(["outage", "other", "outage"]));
    assert_eq!(out["inner"], "outage", "a child flow calls the same natives");
    assert_eq!(out["paged"], format!("{}:5", outcome.run_id));
    assert_eq!(pages.load(Ordering::SeqCst), 1);

    // The stream: the root's start first and its end last, a step event for each record, the
    // child run's own start and end in between.
    let mut seen = Vec::new();
    while let Some(e) = events.try_next() {
        seen.push(e);
    }
    let names: Vec<String> = seen
        .iter()
        .map(|e| e.to_json()["event"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names.first().map(String::as_str), Some("run_started"));
    assert_eq!(names.last().map(String::as_str), Some("run_finished"));
    let runs: Vec<&str> = seen
        .iter()
        .filter_map(|e| match e {
            Event::RunStarted(r) => Some(r.flow.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(runs.len(), 2, "the root and the child run: {runs:?}");
    let steps: Vec<(String, Option<u64>)> = seen
        .iter()
        .filter_map(|e| match e {
            Event::StepFinished(s) if s.run_id == outcome.run_id => Some((s.step.clone(), s.iteration)),
            _ => None,
        })
        .collect();
    for step in ["classify", "flaky", "child", "page"] {
        assert!(
            steps.iter().any(|(s, _)| s == step),
            "no event for {step}: {steps:?}"
        );
    }
    let iterations = steps.iter().filter(|(s, i)| s == "each" && i.is_some()).count();
    assert_eq!(iterations, 3, "{steps:?}");
    let flaky = seen
        .iter()
        .find_map(|e| match e {
            Event::StepFinished(s) if s.step == "flaky" => Some(s.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!((flaky.attempt, flaky.status), (3, StepStatus::Succeeded));
    let line = Event::StepFinished(flaky).to_json();
    assert_eq!(line["number"], "2");
    assert_eq!(line["route"], "each");
    assert_eq!(line["record"]["attempt"], 3);

    // The same records, read by the binary from the same store.
    drop(events);
    assert!(sy.close().await, "nothing else holds the store");
    let shown = support::run(support::switchyard(dir.path()).args([
        "runs",
        "show",
        &outcome.run_id,
        "--json",
        "--store",
        &store,
    ]));
    assert_eq!(shown.code(), 0, "{}", shown.stderr);
    let shown = json_of(&shown);
    assert_eq!(shown["run"]["status"], "succeeded", "{shown}");
    assert_eq!(shown["run"]["output"], out);
    let steps = shown["steps"].as_array().unwrap();
    let page: Vec<&Value> = steps.iter().filter(|s| s["step"] == "page").collect();
    assert_eq!(page.len(), 1, "{page:?}");
    assert_eq!(page[0]["result"]["ticket"], format!("{}:5", outcome.run_id));
    assert_eq!(page[0]["route"], "end");
    let flaky: Vec<&Value> = steps.iter().filter(|s| s["step"] == "flaky").collect();
    assert_eq!((flaky.len(), &flaky[0]["attempt"]), (1, &json!(3)), "{flaky:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_error_kind_routes_and_a_missing_registration_stops_the_run_before_it_starts() {
    let dir = TempDir::new("embed-errors");
    let path = dir.write("embedded.yaml", FLOW);
    let flow = Flow::load(&path).unwrap();
    let pages = Arc::new(AtomicU64::new(0));
    let sy = switchyard("memory", pages.clone()).await;
    let outcome = sy
        .run(&flow, json!({"text": "a question", "words": []}))
        .await
        .unwrap();
    assert_eq!(outcome.status, RunStatus::Succeeded, "{:?}", outcome.error);
    assert_eq!(outcome.output.unwrap()["paged"], "declined");
    assert_eq!(outcome.path.last().map(String::as_str), Some("declined"));

    // Nothing registered as `pager`: the run does not start, and the error names the agent,
    // the file, line and column that define it, and what is registered.
    let mut partial = Switchyard::open("memory").await.unwrap();
    partial.register_pure("classify", |i: Value, _c: NativeCall| async move { classify(i) });
    partial.register_pure("flaky", |_i: Value, _c: NativeCall| async move {
        Ok(json!({"attempt": 1}))
    });
    let mut events = partial.events();
    let err = partial.run(&flow, json!({"text": "x"})).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("native agent `page` (")
            && msg.contains("embedded.yaml:13:3)")
            && msg.contains("`pager`"),
        "{msg}"
    );
    assert!(msg.contains("registered: classify, flaky"), "{msg}");
    assert!(events.try_next().is_none(), "no run started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_off_during_a_native_call_resumes_with_its_attempt_in_doubt() {
    let dir = TempDir::new("embed-resume");
    let path = dir.write(
        "gate.yaml",
        r#"
flow: gate
agents:
  count: {kind: native}
  charge: {kind: native, timeout: 30s}
steps:
  first:
    agent: count
    output: {$.counted: $.n}
    next: charge
  charge:
    agent: charge
    output: {$.charged: $.ok}
"#,
    );
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    let flow = Flow::load(&path).unwrap();
    let counted = Arc::new(AtomicU64::new(0));
    let charges = Arc::new(AtomicU64::new(0));
    let make = |hang: bool| {
        let (counted, charges, store) = (counted.clone(), charges.clone(), store.clone());
        async move {
            let mut sy = Switchyard::open(&store).await.unwrap();
            sy.register_pure("count", move |_i: Value, _c: NativeCall| {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                async move { Ok(json!({"n": n})) }
            });
            sy.register("charge", move |_i: Value, _c: NativeCall| {
                charges.fetch_add(1, Ordering::SeqCst);
                async move {
                    if hang {
                        // The process dies here, as far as the run can tell.
                        std::future::pending::<()>().await;
                    }
                    Ok(json!({"ok": true}))
                }
            });
            sy
        }
    };
    // The run's future is dropped in the middle of `charge`: its attempt is on record as
    // started, and nothing says whether it had its effect.
    let sy = make(true).await;
    let cut = tokio::time::timeout(Duration::from_millis(500), sy.run(&flow, json!({}))).await;
    assert!(cut.is_err(), "the call hangs");
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    let runs = switchyard::__private::store_of(&sy)
        .list_runs(&Default::default())
        .await
        .unwrap();
    let run_id = runs[0].id.clone();
    assert_eq!(runs[0].status, RunStatus::Running);
    // An agent with effects has its attempt on record before the call is made; the pure
    // one before it has only its end.
    let steps = switchyard::__private::store_of(&sy).steps(&run_id).await.unwrap();
    let recorded: Vec<(&str, u32, StepStatus)> = steps
        .iter()
        .map(|s| (s.step.as_str(), s.attempt, s.status))
        .collect();
    assert_eq!(
        recorded,
        vec![
            ("first", 1, StepStatus::Succeeded),
            ("charge", 1, StepStatus::Started)
        ]
    );
    drop(sy);

    let sy = make(false).await;
    let stopped = sy
        .resume(&flow, &run_id, ResumeOptions::default(), RunConfig::default())
        .await
        .unwrap();
    assert_eq!(stopped.status, RunStatus::Interrupted);
    assert_eq!(
        stopped.error.as_ref().map(|e| e.kind.clone()),
        Some(ErrorKind::InDoubt)
    );
    assert_eq!(
        charges.load(Ordering::SeqCst),
        1,
        "not called again without --retry-in-doubt"
    );

    let resume = ResumeOptions::default().retry_in_doubt(true);
    let done = sy
        .resume(&flow, &run_id, resume, RunConfig::default())
        .await
        .unwrap();
    assert_eq!(done.status, RunStatus::Succeeded, "{:?}", done.error);
    assert_eq!(done.output.unwrap(), json!({"counted": 1, "charged": true}));
    assert_eq!(charges.load(Ordering::SeqCst), 2);
    assert_eq!(
        counted.load(Ordering::SeqCst),
        1,
        "the finished step is replayed, not called"
    );
    sy.close().await;

    // The binary sees the resumed run's end.
    let shown = support::run(
        support::switchyard(dir.path()).args(["runs", "show", &run_id, "--json", "--store", &store]),
    );
    assert_eq!(json_of(&shown)["run"]["status"], "succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_through_the_library_writes_its_output_in_input_order() {
    let dir = TempDir::new("embed-batch");
    let path = dir.write(
        "upper.yaml",
        r#"
flow: upper
agents:
  shout: {kind: native}
steps:
  shout:
    agent: shout
    input: {$.text: $.text}
    output: {$.loud: $.text}
"#,
    );
    let lines: String = (0..40)
        .map(|i| format!("{{\"id\": \"i{i}\", \"text\": \"item {i}\"}}\n"))
        .collect();
    let input = dir.write("in.jsonl", lines);
    let output = dir.path().join("out.jsonl");
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    let flow = Flow::load(&path).unwrap();
    let mut sy = Switchyard::open_for_batch(&store).await.unwrap();
    sy.register("shout", |i: Value, _c: NativeCall| async move {
        // Out of order on purpose: the output is in input order all the same.
        let n: u64 = i["text"].as_str().unwrap()[5..].parse().unwrap();
        tokio::time::sleep(Duration::from_millis(40 - n)).await;
        Ok(json!({"text": i["text"].as_str().unwrap().to_uppercase()}))
    });
    let progress = Arc::new(Progress::default());
    let mut options = BatchOptions::new(&input, &output);
    options.concurrency = 8;
    let summary = sy
        .batch(&flow, options, RunConfig::default(), progress.clone())
        .await
        .unwrap();
    assert_eq!((summary.total, summary.succeeded, summary.failed), (40, 40, 0));
    sy.close().await;
    let text = std::fs::read_to_string(&output).unwrap();
    let out: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(out.len(), 40);
    for (i, line) in out.iter().enumerate() {
        assert_eq!(line["id"], format!("i{i}"), "{line}");
        assert_eq!(line["output"]["loud"], format!("ITEM {i}"), "{line}");
    }
    // The binary reads the same batch from the same store.
    let listed =
        support::run(support::switchyard(dir.path()).args(["runs", "list", "--json", "--store", &store]));
    assert_eq!(listed.code(), 0, "{}", listed.stderr);
    assert_eq!(listed.stdout.lines().count(), 40, "{}", listed.stdout);
}

#[test]
fn the_binary_refuses_native_agents_it_does_not_register_and_tests_them_mocked() {
    let dir = TempDir::new("embed-cli");
    dir.write("embedded.yaml", FLOW);
    let ran = support::run(support::switchyard(dir.path()).args([
        "run",
        "embedded.yaml",
        "--input",
        r#"{"text": "x"}"#,
        "--store",
        "memory",
    ]));
    assert_eq!(ran.code(), 2, "{}", ran.stderr);
    for agent in [
        "`classify` (embedded.yaml:4:3)",
        "`flaky` (embedded.yaml:10:3)",
        "`page` (embedded.yaml:13:3)",
    ] {
        assert!(ran.stderr.contains(agent), "{agent}: {}", ran.stderr);
    }
    assert!(
        ran.stderr.contains("registers no native agents"),
        "{}",
        ran.stderr
    );
    let submitted = support::run(support::switchyard(dir.path()).args([
        "submit",
        "embedded.yaml",
        "--input",
        "nothing.jsonl",
        "--batch",
        "b",
    ]));
    assert_eq!(submitted.code(), 2, "{}", submitted.stderr);
    assert!(
        submitted.stderr.contains("native agent `page`"),
        "{}",
        submitted.stderr
    );
    let linted = support::run(support::switchyard(dir.path()).args(["lint", "embedded.yaml"]));
    assert_eq!(linted.code(), 0, "{}", linted.stderr);

    // A flow test mocks them; one it does not mock is refused like an unmocked `command`.
    dir.write(
        "tested.yaml",
        r#"
flow: tested
agents:
  score: {kind: native}
steps:
  s: {agent: score, output: {$.score: $.score}}
tests:
  - name: mocked
    mocks: {score: {returns: {score: 7}}}
    expect: {status: succeeded, output: {score: 7}}
  - name: not mocked
    expect: {status: failed}
"#,
    );
    let tested = support::run(support::switchyard(dir.path()).args(["test", "tested.yaml"]));
    let all = format!("{}{}", tested.stdout, tested.stderr);
    assert_eq!(tested.code(), 1, "{all}");
    assert!(all.contains("ok     tested.yaml :: mocked"), "{all}");
    assert!(
        all.contains("agent `score` was called but is not mocked"),
        "{all}"
    );
    assert!(all.contains("1 passed, 1 failed"), "{all}");
}

#[test]
fn a_flow_that_does_not_lint_does_not_load_and_says_where() {
    let dir = TempDir::new("embed-lint");
    let path = dir.write(
        "bad.yaml",
        "flow: bad\nagents:\n  n: {kind: native, function: 3}\nsteps:\n  s: {agent: m}\n",
    );
    let err = Flow::load(&path).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("bad.yaml:3:"), "{text}");
    assert!(
        text.contains("unknown agent `m`") || text.contains("`m`"),
        "{text}"
    );
    let json: Value = serde_json::from_str(&err.json()).unwrap();
    assert!(json.as_array().unwrap().len() >= 2, "{json}");
    let missing = Flow::load(dir.path().join("nope.yaml")).unwrap_err();
    assert!(missing.to_string().contains("nope.yaml"), "{missing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_agent_is_a_tool_of_an_agent_loop_against_a_loopback_model() {
    use crate::mock_server::{Llm, Reply};
    let server = Llm::start();
    server.script([
        Reply::calls(1, &[("lookup", r#"{"id": 42}"#)]),
        Reply::Answer(json!({"answer": "customer 42 is on pro"}).to_string()),
    ]);
    let dir = TempDir::new("embed-tool");
    let path = dir.write(
        "bot.yaml",
        format!(
            r#"
flow: bot
providers:
  local: {{base_url: "{}"}}
agents:
  bot:
    kind: llm
    provider: local
    model: m1
    prompt: "who is 42?"
    tools: [lookup]
  lookup:
    kind: native
    function: crm
    description: Looks a customer up.
    input_schema:
      type: object
      required: [id]
      properties: {{id: {{type: integer}}}}
steps:
  ask:
    agent: bot
    output: {{$.answer: $}}
"#,
            server.base_url()
        ),
    );
    let flow = Flow::load(&path).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut sy = Switchyard::open("memory").await.unwrap();
    let log = seen.clone();
    sy.register("crm", move |input: Value, _call: NativeCall| {
        log.lock().unwrap().push(input.clone());
        async move { Ok(json!({"customer": input["id"], "plan": "pro"})) }
    });
    let outcome = sy.run(&flow, json!({})).await.unwrap();
    assert_eq!(outcome.status, RunStatus::Succeeded, "{:?}", outcome.error);
    // Without a `result_schema` the loop's answer is the model's text.
    assert_eq!(
        outcome.output.unwrap()["answer"]["text"],
        json!({"answer": "customer 42 is on pro"}).to_string()
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0],
        json!({"id": 42}),
        "the model's arguments are the tool's input"
    );
    // The tool's result went back to the model in its second request.
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    let messages = hits[1].body["messages"].to_string();
    assert!(messages.contains(r#"\"plan\":\"pro\""#), "{messages}");
}
