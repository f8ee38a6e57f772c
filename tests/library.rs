//! The library's surface as an application sees it, imports from the crate root only: the
//! `approve` example (its own code, included) run to its question and resumed; what a run
//! stopped for an agent loop's approval waits for; an event stream that ends with its run.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use switchyard::{
    Error, Event, Flow, NativeCall, Origin, Question, Refusal, ResumeError, ResumeOptions, RunConfig,
    RunStatus, Switchyard, Via, WaitingFor,
};

use crate::mock_server::{Llm, Reply};
use crate::support::TempDir;

/// `examples/approve.rs` as it is: the test runs the example's own code.
#[allow(dead_code)]
#[path = "../examples/approve.rs"]
mod approve_example;

/// How long a call may take before the test says it hung: a guard, not a measure (a stream
/// that never ends would leave its reader waiting forever).
const HANG: Duration = Duration::from_secs(120);

fn example_flow() -> String {
    format!("{}/examples/approve.yaml", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approve_example_reads_its_question_from_the_outcome_and_resumes_with_a_decision() {
    let dir = TempDir::new("library-approve");
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    let asked = Arc::new(Mutex::new(None));
    let seen = asked.clone();
    let done = tokio::time::timeout(
        HANG,
        approve_example::approve(
            &example_flow(),
            &store,
            json!({"customer": "C-9", "amount": 40}),
            move |w: &WaitingFor| {
                *seen.lock().unwrap() = Some(w.clone());
                json!({"approved": true, "note": "fine"})
            },
        ),
    )
    .await
    .expect("both calls and their event streams end")
    .expect("the example runs");

    // The question, typed: the interrupt's rendered prompt and the schema of its decision.
    let w = &done.waiting;
    assert_eq!(asked.lock().unwrap().as_ref(), Some(w));
    assert_eq!(
        (w.flow.as_str(), w.step.as_str(), w.number.as_str()),
        ("approve", "approve", "1")
    );
    assert_eq!(w.run_id, done.outcome.run_id, "the root run's own step waits");
    let Question::Interrupt(q) = &w.question else {
        panic!("an interrupt's question: {w:?}");
    };
    assert_eq!(q.prompt.as_deref(), Some("Refund 40 USD to C-9?"));
    assert_eq!(q.schema.as_ref().unwrap()["required"], json!(["approved"]));
    assert_eq!(q.expires_at, None);

    assert_eq!(
        done.outcome.status,
        RunStatus::Succeeded,
        "{:?}",
        done.outcome.error
    );
    assert_eq!(done.outcome.waiting, None, "a finished run waits for nothing");
    let out = done.outcome.output.clone().unwrap();
    assert_eq!(out["approval"], json!({"approved": true, "note": "fine"}));
    assert_eq!(done.refunds, vec![json!({"customer": "C-9", "amount": 40})]);
    // The decision is on record in the inbox, via `library`.
    assert_eq!(done.decisions.len(), 1, "{:?}", done.decisions);
    assert_eq!(done.decisions[0].via, Via::Library);
    assert_eq!(
        done.decisions[0].decision,
        json!({"approved": true, "note": "fine"})
    );
    assert!(!done.decisions[0].actor.is_empty());

    // Each call's stream ended after its run's last event: the stop, then the end.
    let ends: Vec<String> = done
        .events
        .iter()
        .map(|call| match call.last() {
            Some(Event::RunFinished(r)) => r.status.as_str().to_string(),
            other => panic!("the stream's last event: {other:?}"),
        })
        .collect();
    assert_eq!(ends, ["interrupted", "succeeded"]);
    // Started through the library: recorded with origin `api`.
    let origins: Vec<Option<Origin>> = done
        .events
        .iter()
        .filter_map(|call| match call.last() {
            Some(Event::RunFinished(r)) => Some(r.origin),
            _ => None,
        })
        .collect();
    assert_eq!(origins, [Some(Origin::Api), Some(Origin::Api)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_resumes_the_example_without_a_refund() {
    let dir = TempDir::new("library-refuse");
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    let done = tokio::time::timeout(
        HANG,
        approve_example::approve(
            &example_flow(),
            &store,
            json!({"customer": "C-9", "amount": 4000}),
            |_: &WaitingFor| json!({"approved": false}),
        ),
    )
    .await
    .expect("both calls end")
    .expect("the example runs");
    assert_eq!(done.outcome.status, RunStatus::Succeeded);
    assert!(done.refunds.is_empty(), "{:?}", done.refunds);
    assert_eq!(done.outcome.path, ["approve"]);
}

/// An agent loop whose `refund` tool (a native agent) needs approval.
fn approval_flow(base_url: &str) -> String {
    format!(
        r#"flow: refunds
providers:
  local: {{base_url: "{base_url}"}}
agents:
  agent:
    kind: llm
    provider: local
    model: m1
    prompt: "Ticket: {{{{ input.text }}}}"
    tools: [refund, lookup]
    approve: [refund]
  refund:
    kind: native
    idempotent: false
    input_schema:
      type: object
      required: [amount]
      properties: {{amount: {{type: integer}}}}
  lookup:
    kind: mock
    returns: {{order: 7}}
steps:
  answer:
    agent: agent
    input: {{$.text: $.text}}
    output: {{$.reply: $}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stopped_for_approval_names_each_pending_call_in_its_outcome() {
    let server = Llm::start();
    server.script([
        Reply::calls(
            1,
            &[("refund", r#"{"amount": 100}"#), ("refund", r#"{"amount": 7}"#)],
        ),
        Reply::Answer("Refunded.".into()),
    ]);
    let dir = TempDir::new("library-approval");
    let path = dir.write("refunds.yaml", approval_flow(&server.base_url()));
    let flow = Flow::load(&path).expect("the flow loads");
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    let mut sy = Switchyard::open(&store).await.unwrap();
    let paid = Arc::new(Mutex::new(Vec::new()));
    let log = paid.clone();
    sy.register("refund", move |input: Value, _call: NativeCall| {
        log.lock().unwrap().push(input);
        async { Ok(json!({"refunded": true})) }
    });

    let stopped = sy.run(&flow, json!({"text": "refund my order"})).await.unwrap();
    assert_eq!(stopped.status, RunStatus::Interrupted, "{:?}", stopped.error);
    let w = stopped.waiting.clone().expect("the run says what it waits for");
    assert_eq!(
        (w.run_id.as_str(), w.step.as_str()),
        (stopped.run_id.as_str(), "answer")
    );
    let Question::Approval(a) = &w.question else {
        panic!("an approval: {w:?}");
    };
    assert_eq!(a.agent, "agent");
    assert!(a.prompt.contains("`refund`"), "{}", a.prompt);
    let calls: Vec<(&str, &str, &Value)> = a
        .calls
        .iter()
        .map(|c| (c.id.as_str(), c.tool.as_str(), &c.arguments))
        .collect();
    assert_eq!(
        calls,
        [
            ("call_1_1", "refund", &json!({"amount": 100})),
            ("call_1_2", "refund", &json!({"amount": 7})),
        ]
    );
    assert!(
        paid.lock().unwrap().is_empty(),
        "nothing is paid before the decision"
    );

    // One decision per pending call, in the outcome's order.
    let decision = json!([{"approve": true}, {"reject": "too small to bother"}]);
    let done = sy
        .resume(
            &flow,
            &stopped.run_id,
            ResumeOptions::default().decision(decision),
            RunConfig::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.status, RunStatus::Succeeded, "{:?}", done.error);
    assert_eq!(*paid.lock().unwrap(), [json!({"amount": 100})]);
}

/// A decision given to `Switchyard::resume` is an answer like `inbox decide`: recorded in the
/// inbox via `library`, by the actor the application names, with its reason and what it
/// edited (before → after), and read back with `Switchyard::decisions`. A second answer to a
/// question decided elsewhere is refused, naming who decided, and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_decision_is_recorded_in_the_inbox_and_a_second_one_is_refused() {
    let server = Llm::start();
    server.script([
        Reply::calls(1, &[("refund", r#"{"amount": 100}"#)]),
        Reply::Answer("Refunded 40.".into()),
        Reply::calls(1, &[("refund", r#"{"amount": 9}"#)]),
    ]);
    let dir = TempDir::new("library-decision");
    let path = dir.write("refunds.yaml", approval_flow(&server.base_url()));
    let flow = Flow::load(&path).expect("the flow loads");
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    let mut sy = Switchyard::open(&store).await.unwrap();
    let paid = Arc::new(Mutex::new(Vec::new()));
    let log = paid.clone();
    sy.register("refund", move |input: Value, _call: NativeCall| {
        log.lock().unwrap().push(input);
        async { Ok(json!({"refunded": true})) }
    });

    let stopped = sy.run(&flow, json!({"text": "refund my order"})).await.unwrap();
    assert_eq!(stopped.status, RunStatus::Interrupted, "{:?}", stopped.error);
    let done = sy
        .resume(
            &flow,
            &stopped.run_id,
            ResumeOptions::default()
                .decision(json!({"edit": {"amount": 40}}))
                .actor("ana")
                .reason("the order was 40 <script>alert(1)</script>"),
            RunConfig::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.status, RunStatus::Succeeded, "{:?}", done.error);
    assert_eq!(*paid.lock().unwrap(), [json!({"amount": 40})]);
    let rows = sy.decisions(&stopped.run_id).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(
        (
            row.actor.as_str(),
            row.via,
            row.run_id.as_str(),
            row.reason.as_deref()
        ),
        (
            "ana",
            Via::Library,
            stopped.run_id.as_str(),
            Some("the order was 40 <script>alert(1)</script>")
        )
    );
    assert_eq!(row.decision, json!({"edit": {"amount": 40}}));
    assert_eq!(
        row.edited,
        Some(
            json!([{"call": "call_1_1", "tool": "refund", "before": {"amount": 100}, "after": {"amount": 40}}])
        )
    );
    assert_eq!(row.bulk_id, None);
    // `runs show` prints it, as text and in `--json`.
    let store_arg = ["--store".to_string(), store.clone()];
    let show = crate::support::run(
        crate::support::switchyard(dir.path())
            .args(["runs", "show", &stopped.run_id])
            .args(&store_arg),
    );
    assert_eq!(show.code(), 0, "{show:?}");
    assert!(
        show.stdout.contains(" ana via library: {\"edit\":{\"amount\":40}}\n    reason: the order was 40 <script>alert(1)</script>\n    edited refund (call_1_1): {\"amount\":100} → {\"amount\":40}\n"),
        "{}",
        show.stdout
    );
    let json = crate::support::run(
        crate::support::switchyard(dir.path())
            .args(["runs", "show", &stopped.run_id, "--json"])
            .args(&store_arg),
    );
    let doc: Value = serde_json::from_str(&json.stdout).expect("json");
    assert_eq!(doc["decisions"][0]["actor"], "ana", "{}", json.stdout);
    assert_eq!(doc["decisions"][0]["via"], "library");
    assert_eq!(doc["decisions"][0]["edited"][0]["after"], json!({"amount": 40}));
    // The run page: the decision, its reason escaped, its edit as before → after.
    let page = crate::support::run(
        crate::support::switchyard(dir.path())
            .args(["runs", "show", &stopped.run_id, "--format", "html"])
            .args(&store_arg),
    );
    assert_eq!(page.code(), 0, "{page:?}");
    assert!(
        page.stdout
            .contains("<section id=\"decisions\"><h2>Decisions</h2>"),
        "{}",
        page.stdout
    );
    assert!(
        page.stdout.contains(" by ana via library</dd>"),
        "{}",
        page.stdout
    );
    assert!(
        page.stdout
            .contains("<dd>the order was 40 &lt;script&gt;alert(1)&lt;/script&gt;</dd>"),
        "{}",
        page.stdout
    );
    assert!(
        !page.stdout.contains("<script>alert(1)"),
        "hostile text reached the page unescaped"
    );
    assert!(
        page.stdout
            .contains("<dt>edited refund</dt><dd>{&quot;amount&quot;:100} → {&quot;amount&quot;:40}</dd>")
            || page
                .stdout
                .contains("<dt>edited refund</dt><dd>{\"amount\":100} → {\"amount\":40}</dd>"),
        "{}",
        page.stdout
    );

    // A second run, answered elsewhere first (as `inbox decide` would): the library's
    // answer is refused with who decided, and the run is not continued here.
    let again = sy.run(&flow, json!({"text": "and this one"})).await.unwrap();
    assert_eq!(again.status, RunStatus::Interrupted, "{:?}", again.error);
    let w = again.waiting.clone().expect("waits");
    let item = switchyard::__private::record::inbox::item_id(&w.run_id, &w.number, None);
    let inbox = switchyard::__private::store::Store::inbox(&**switchyard::__private::api_store(&sy));
    let first = inbox
        .decide(vec![switchyard::__private::store::inbox::NewDecision {
            item_id: item.clone(),
            actor: "bob".into(),
            via: Via::Cli,
            decision: json!({"reject": "no"}),
            reason: None,
            edited: None,
            bulk_id: None,
        }])
        .await
        .unwrap();
    assert!(first[0].is_ok(), "{first:?}");
    let refused = sy
        .resume(
            &flow,
            &again.run_id,
            ResumeOptions::default().decision(json!({"approve": true})),
            RunConfig::default(),
        )
        .await
        .expect_err("a second answer is refused");
    match &refused {
        Error::Resume(ResumeError::Refused {
            refusal: Refusal::Decided { actor, via, .. },
            ..
        }) => assert_eq!((actor.as_str(), *via), ("bob", Via::Cli)),
        other => panic!("refused as decided: {other:?}"),
    }
    assert!(
        refused.to_string().contains("already decided by bob (cli) at "),
        "{refused}"
    );
    assert_eq!(paid.lock().unwrap().len(), 1, "nothing more was paid");
    assert_eq!(sy.decisions(&again.run_id).await.unwrap().len(), 1);
}

const TWO_STEPS: &str = r#"
flow: two
agents:
  double: {kind: native}
steps:
  first:
    agent: double
    input: {$.n: $.n}
    output: {$.n: $.n}
    next: second
  second:
    agent: double
    input: {$.n: $.n}
    output: {$.n: $.n}
"#;

/// Reads `events` to its end, or fails the test if it does not end.
async fn drain(mut events: switchyard::Events) -> Vec<Event> {
    tokio::time::timeout(HANG, async move {
        let mut seen = Vec::new();
        while let Some(e) = events.next().await {
            seen.push(e);
        }
        seen
    })
    .await
    .expect("the stream ends once its run has ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_ends_after_the_last_event_of_the_run_it_watches() {
    let dir = TempDir::new("library-events");
    let path = dir.write("two.yaml", TWO_STEPS);
    let flow = Flow::load(&path).unwrap();
    let mut sy = Switchyard::open("memory").await.unwrap();
    sy.register_pure("double", |input: Value, _c: NativeCall| async move {
        Ok(json!({"n": input["n"].as_i64().unwrap_or(0) * 2}))
    });

    // Read while the run goes on: the reader's loop ends by itself, the Switchyard alive.
    let reader = tokio::spawn(drain(sy.events()));
    let first = sy.run(&flow, json!({"n": 1})).await.unwrap();
    assert_eq!(first.output.clone().unwrap()["n"], 4);
    let seen = reader.await.unwrap();
    let names: Vec<String> = seen
        .iter()
        .map(|e| e.to_json()["event"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        ["run_started", "step_finished", "step_finished", "run_finished"]
    );
    assert!(
        seen.iter()
            .all(|e| e.to_json()["run_id"] == first.run_id.as_str())
    );

    // A stream taken now watches the next run only, and ends with it too.
    let second_events = sy.events();
    let second = sy.run(&flow, json!({"n": 3})).await.unwrap();
    let seen = drain(second_events).await;
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(matches!(seen.last(), Some(Event::RunFinished(r)) if r.id == second.run_id));
    assert!(
        seen.iter()
            .all(|e| e.to_json()["run_id"] == second.run_id.as_str())
    );
    drop(sy);
}

/// Each type a public signature names, named from the crate root: each function pointer,
/// closure and function below only compiles when the signature's type is the root's. A bad `now` is an
/// error, not a panic.
#[test]
fn every_type_a_public_signature_names_is_exported_at_the_root() {
    use std::path::{Path, PathBuf};
    use switchyard::{
        AgentKind, BatchError, BatchOptions, BatchSummary, CancellationToken, Change, Cost, Diagnostic,
        Error, ErrorKind, Events, FileId, FlowError, Interrupt, Label, NativeFuture, Natives, Otlp,
        PendingCall, Progress, ResumeError, Rule, RunControls, RunOptions, RunOutcome, RunRecord, Severity,
        Span, StepError, StepRecord, StepStatus, StoreError, Usage, Violation,
    };

    let _: fn(&Path, Option<PathBuf>) -> Result<Flow, FlowError> = Flow::load_under;
    let _: fn(&Flow) -> &[Diagnostic] = Flow::warnings;
    fn _diagnostic(d: &Diagnostic) -> (&'static Rule, Severity, &Label, Span, FileId) {
        (
            d.rule,
            d.severity,
            &d.primary,
            d.primary.span,
            d.primary.span.file,
        )
    }
    let _: fn(&Switchyard) -> Events = Switchyard::events;
    let _: fn(&Switchyard) -> &Natives = Switchyard::natives;
    let _: fn(&Switchyard, &Flow, &RunOptions) -> Result<(), Error> = Switchyard::check;
    let _ = |e: Error| -> Option<ResumeError> {
        match e {
            Error::Resume(r) => Some(r),
            Error::Batch(b) => {
                let _: BatchError = b;
                None
            }
            _ => None,
        }
    };
    let _ = |e: ResumeError| -> Option<StoreError> {
        match e {
            ResumeError::Store(s) => Some(s),
            _ => None,
        }
    };
    fn _outcome(o: &RunOutcome) -> (&Option<WaitingFor>, &Usage, &Option<StepError>) {
        (&o.waiting, &o.usage, &o.error)
    }
    fn _cost(u: &Usage) -> Cost {
        u.cost_usd
    }
    fn _question(w: &WaitingFor) -> Option<(&Interrupt, Option<&PendingCall>)> {
        match &w.question {
            Question::Interrupt(i) => Some((i, None)),
            Question::Approval(a) => {
                let _ = a.calls.first();
                None
            }
            _ => None,
        }
    }
    fn _run_record(r: &RunRecord) -> (RunStatus, &Option<StepError>) {
        (r.status, &r.error)
    }
    fn _step_record(s: &StepRecord) -> (StepStatus, &[Change], &[Violation]) {
        (s.status, &s.changes, &s.violations)
    }
    fn _native_call(c: &NativeCall) -> &CancellationToken {
        &c.cancel
    }
    fn _step_error(e: &StepError) -> &ErrorKind {
        &e.kind
    }
    let _: fn(&BatchSummary) -> u64 = |s| s.total;
    let _: fn(&Progress) -> u64 = Progress::done;
    let _: fn(&str) -> Result<Otlp, String> = Otlp::install;
    let _: Option<NativeFuture> = None;
    let _: BatchOptions = BatchOptions::new("in.jsonl", "out.jsonl");

    let _: RunOptions = RunOptions::default()
        .allow([AgentKind::Native, AgentKind::Transform])
        .allow_hosts(["api.example.com"])
        .max_cost_usd(0.5)
        .messages(vec![json!({"role": "user", "content": "hi"})])
        .now("2026-01-02T03:04:05Z")
        .expect("RFC 3339");
    let bad = RunOptions::default().now("yesterday").unwrap_err();
    assert!(bad.contains("yesterday"), "{bad}");
    let controls = RunControls::with_cancel(CancellationToken::new());
    let theirs = controls.clone();
    controls.pause();
    assert!(
        theirs.is_paused() && !theirs.is_cancelled(),
        "clones share their state"
    );
    let _: ResumeOptions = ResumeOptions::default()
        .decision(json!({"approved": true}))
        .retry_in_doubt(true)
        .allow_changed(false);
}
