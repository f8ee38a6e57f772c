//! `--otlp-endpoint` (SPEC §13): traces received on a loopback OTLP/HTTP endpoint, decoded
//! with the official protobuf definitions (`opentelemetry-proto`): the span tree of a run with a
//! `foreach`, a child flow and a failure edge — parents, attributes, route events — one trace
//! per batch item (many run trees filled at once among them), and a run that goes on when the
//! collector is down, its spans counted as dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Av;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

use crate::support::{TempDir, run, switchyard};

/// A loopback OTLP/HTTP collector keeping every span it is sent, and the resource of every
/// request.
pub struct Collector {
    pub url: String,
    spans: Arc<Mutex<Vec<Span>>>,
    resources: Arc<Mutex<Vec<Resource>>>,
    _rt: tokio::runtime::Runtime,
}

impl Collector {
    pub fn start() -> Collector {
        use axum::routing::post;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let resources: Arc<Mutex<Vec<Resource>>> = Arc::default();
        let kept = spans.clone();
        let kept_resources = resources.clone();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("a port");
        let addr = listener.local_addr().expect("an address");
        let app = axum::Router::new().route(
            "/v1/traces",
            post(move |body: axum::body::Bytes| {
                let kept = kept.clone();
                let kept_resources = kept_resources.clone();
                async move {
                    let req = ExportTraceServiceRequest::decode(body).expect("an OTLP trace request");
                    for rs in req.resource_spans {
                        kept_resources
                            .lock()
                            .unwrap()
                            .push(rs.resource.unwrap_or_default());
                        for ss in rs.scope_spans {
                            kept.lock().unwrap().extend(ss.spans);
                        }
                    }
                    ""
                }
            }),
        );
        rt.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Collector {
            url: format!("http://{addr}"),
            spans,
            resources,
            _rt: rt,
        }
    }

    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The resource of each request received, in order.
    pub fn resources(&self) -> Vec<Resource> {
        self.resources.lock().unwrap().clone()
    }
}

/// The value of attribute `key` of a resource, as text.
pub fn resource_attr(r: &Resource, key: &str) -> Option<String> {
    r.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
        .map(|v| match v {
            Av::StringValue(s) => s.clone(),
            Av::IntValue(i) => i.to_string(),
            other => format!("{other:?}"),
        })
}

pub fn attr(s: &Span, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
        .map(|v| match v {
            Av::StringValue(s) => s.clone(),
            Av::IntValue(i) => i.to_string(),
            Av::DoubleValue(d) => d.to_string(),
            Av::BoolValue(b) => b.to_string(),
            other => format!("{other:?}"),
        })
}

const FLOW: &str = r#"flow: traced
agents:
  double:
    kind: transform
    result: {v: =input * 2}
  child:
    kind: flow
    steps:
      inner:
        set: {$.done: =true}
  broken:
    kind: command
    run: [sh, -c, 'exit 3']
steps:
  each:
    foreach: $.items
    agent: double
    select: $.v
    output: {$.doubled: $}
    next: call
  call:
    agent: child
    output: {$.child: $}
    next: try
  try:
    agent: broken
    next:
      - to: recover
        on: failure
  recover:
    set: {$.recovered: =true}
"#;

#[test]
fn a_runs_spans_nest_steps_iterations_and_child_runs_with_their_attributes_and_routes() {
    let c = Collector::start();
    let dir = TempDir::new("otel-run");
    dir.write("traced.yaml", FLOW);
    let out = run(switchyard(dir.path())
        .args(["run", "traced.yaml", "--input", r#"{"items": [1, 2, 3]}"#])
        .args(["--otlp-endpoint", &c.url]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(!out.stderr.contains("otlp:"), "{}", out.stderr);
    let spans = c.spans();
    let by_id: HashMap<Vec<u8>, &Span> = spans.iter().map(|s| (s.span_id.clone(), s)).collect();
    let named = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let one = |name: &str| -> &Span {
        let v = named(name);
        assert_eq!(
            v.len(),
            1,
            "spans named `{name}`: {:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        v[0]
    };
    let parent = |s: &Span| by_id.get(&s.parent_span_id).map(|p| p.name.clone());
    // One trace.
    assert!(
        spans
            .iter()
            .all(|s| s.trace_id == spans[0].trace_id && s.trace_id.len() == 16)
    );
    let root = one("run traced");
    assert!(root.parent_span_id.is_empty());
    assert_eq!(attr(root, "switchyard.status").as_deref(), Some("succeeded"));
    assert_eq!(attr(root, "switchyard.flow").as_deref(), Some("traced"));
    // Steps under the run, iterations under their loop, the child run under its calling step.
    for step in ["step each", "step call", "step try", "step recover"] {
        assert_eq!(parent(one(step)).as_deref(), Some("run traced"), "{step}");
    }
    let iterations = named("iteration each [0]").len()
        + named("iteration each [1]").len()
        + named("iteration each [2]").len();
    assert_eq!(iterations, 3);
    for s in spans.iter().filter(|s| s.name.starts_with("iteration each")) {
        assert_eq!(parent(s).as_deref(), Some("step each"));
        assert!(attr(s, "switchyard.iteration").is_some());
    }
    let child = one("run child");
    assert_eq!(parent(child).as_deref(), Some("step call"));
    assert_eq!(parent(one("step inner")).as_deref(), Some("run child"));
    // The failed step: its status, its error kind, its route to `recover` as an event.
    let failed = one("step try");
    assert_eq!(attr(failed, "switchyard.status").as_deref(), Some("failed"));
    assert_eq!(attr(failed, "switchyard.error.kind").as_deref(), Some("agent"));
    assert_eq!(attr(failed, "switchyard.kind").as_deref(), Some("agent"));
    assert_eq!(attr(failed, "switchyard.attempt").as_deref(), Some("1"));
    assert_eq!(failed.status.as_ref().map(|s| s.code), Some(2), "an error status");
    let route = failed
        .events
        .iter()
        .find(|e| e.name == "route")
        .expect("a route event");
    assert_eq!(
        route.attributes[0].value.as_ref().and_then(|v| v.value.clone()),
        Some(Av::StringValue("recover".into()))
    );
    // Times nest: every span within its parent.
    for s in &spans {
        if let Some(p) = by_id.get(&s.parent_span_id) {
            assert!(
                s.start_time_unix_nano >= p.start_time_unix_nano,
                "{} starts before {}",
                s.name,
                p.name
            );
            assert!(
                s.end_time_unix_nano <= p.end_time_unix_nano + 1_000_000,
                "{} ends after {}",
                s.name,
                p.name
            );
        }
        assert!(s.end_time_unix_nano >= s.start_time_unix_nano, "{}", s.name);
    }
}

#[test]
fn a_batch_is_one_trace_per_item_even_on_a_store_that_keeps_no_steps() {
    let c = Collector::start();
    let dir = TempDir::new("otel-batch");
    dir.write("traced.yaml", FLOW);
    dir.write(
        "in.jsonl",
        "{\"id\": \"a\", \"items\": [1]}\n{\"id\": \"b\", \"items\": [2, 3]}\n",
    );
    let out = run(switchyard(dir.path())
        .args([
            "batch",
            "traced.yaml",
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
            "--store",
            "memory",
        ])
        .args(["--otlp-endpoint", &c.url]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let spans = c.spans();
    let roots: Vec<&Span> = spans.iter().filter(|s| s.name == "run traced").collect();
    assert_eq!(roots.len(), 2);
    assert_ne!(roots[0].trace_id, roots[1].trace_id);
    let mut items: Vec<String> = roots
        .iter()
        .filter_map(|r| attr(r, "switchyard.item_id"))
        .collect();
    items.sort();
    assert_eq!(items, ["a", "b"]);
    for r in &roots {
        let steps = spans
            .iter()
            .filter(|s| s.trace_id == r.trace_id && s.name.starts_with("step "))
            .count();
        assert_eq!(steps, 5, "each, call, inner, try, recover");
    }
}

#[test]
fn a_collector_that_is_down_holds_nothing_up_and_the_dropped_spans_are_told() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = TempDir::new("otel-down");
    dir.write("traced.yaml", FLOW);
    let t0 = Instant::now();
    let out = run(switchyard(dir.path())
        .args(["run", "traced.yaml", "--input", r#"{"items": [1, 2]}"#])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{port}")));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    assert!(out.stderr.contains("otlp: "), "{}", out.stderr);
    assert!(out.stderr.contains("span(s) not exported"), "{}", out.stderr);
    assert!(out.stdout.contains("\"recovered\": true"), "{}", out.stdout);
    let bad = run(switchyard(dir.path()).args([
        "run",
        "traced.yaml",
        "--input",
        "{}",
        "--otlp-endpoint",
        "127.0.0.1:4318",
    ]));
    assert_eq!(bad.code(), 2);
    assert!(
        bad.stderr.contains("an http:// or https:// URL"),
        "{}",
        bad.stderr
    );
}

/// Every exported span carries its run's flow (SPEC §13): steps, iterations and the steps of
/// a child run (its own flow's name) as much as runs.
#[test]
fn every_span_names_the_flow_of_its_run() {
    let c = Collector::start();
    let dir = TempDir::new("otel-flow-attr");
    dir.write("traced.yaml", FLOW);
    let out = run(switchyard(dir.path())
        .args(["run", "traced.yaml", "--input", r#"{"items": [1, 2]}"#])
        .args(["--otlp-endpoint", &c.url]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let spans = c.spans();
    assert!(spans.len() >= 8, "{spans:?}");
    let child_flow = spans
        .iter()
        .find(|s| s.name == "run child")
        .and_then(|s| attr(s, "switchyard.flow"))
        .expect("the child run's span names its flow");
    for s in &spans {
        let flow = attr(s, "switchyard.flow").unwrap_or_else(|| panic!("`{}` has no flow", s.name));
        let expected = if s.name == "step inner" || s.name == "run child" {
            child_flow.as_str()
        } else {
            "traced"
        };
        assert_eq!(flow, expected, "{}", s.name);
    }
}

/// An agent loop whose tool `refund` needs approval; `lookup` does not. Both tools are mocks.
fn approval_flow(base_url: &str) -> String {
    format!(
        r#"flow: refunds
providers:
  local:
    base_url: {base_url}
agents:
  clerk:
    kind: llm
    provider: local
    model: m1
    prompt: "Ticket: {{{{ input.text }}}}"
    tools:
      refund: {{description: Refunds an amount.}}
      lookup: {{}}
    approve: [refund]
  refund:
    kind: mock
    returns: {{refunded: true}}
  lookup:
    kind: mock
    returns: {{order: 7, total: 100}}
steps:
  answer:
    agent: clerk
    input: {{$.text: $.text}}
    output: {{$.reply: $}}
"#
    )
}

/// A loop stopped at an approval by one process and resumed with the decision by another,
/// both exporting: each span is sent once, by the process that finished its record; the tool
/// call made after the decision hangs off its turn as the one made before it does off its own;
/// the two exports together are one tree with one root, the run's, sent by the process that
/// ended the run.
#[test]
fn a_loop_resumed_after_an_approval_in_another_process_continues_its_trace_once() {
    use crate::mock_server::{Llm, Reply};
    let server = Llm::start();
    server.script([
        Reply::calls(1, &[("lookup", r#"{"order": 7}"#)]),
        Reply::calls(2, &[("refund", r#"{"amount": 100}"#)]),
        Reply::Answer("Refunded.".into()),
    ]);
    let c = Collector::start();
    let dir = TempDir::new("otel-approval");
    dir.write("refunds.yaml", approval_flow(&server.base_url()));
    let store = ["--store", "sqlite:runs.db"];
    let stopped = run(switchyard(dir.path())
        .args(["run", "refunds.yaml", "--input", r#"{"text": "refund my order"}"#])
        .args(store)
        .args(["--otlp-endpoint", &c.url]));
    assert_eq!(stopped.code(), 3, "{}", stopped.stderr);
    let id = crate::support::run_id_from(&stopped.stderr);
    let first = c.spans();
    let resumed = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"approve": true}"#])
        .args(store)
        .args(["--otlp-endpoint", &c.url]));
    assert_eq!(resumed.code(), 0, "{}", resumed.stderr);
    let all = c.spans();
    let second = &all[first.len()..];
    // A span by its record's number (`run` for the run's).
    let key = |s: &Span| attr(s, "switchyard.number").unwrap_or_else(|| "run".into());
    let keys = |spans: &[Span]| -> Vec<String> {
        let mut v: Vec<String> = spans.iter().map(key).collect();
        v.sort();
        v
    };
    // What each process finished: the first, the two turns and the call before the stop; the
    // second, the decision, the call after it, the last turn, the loop's step and the run.
    assert_eq!(keys(&first), ["1.t1", "1.t1.1", "1.t2"], "{first:?}");
    assert_eq!(
        keys(second),
        ["1", "1.t2.1", "1.t2.approval", "1.t3", "run"],
        "{second:?}"
    );
    // The stopped process's spans name the flow as the finishing one's do (its root, not
    // ended there, is known from its stop, not from a run record).
    for s in &all {
        assert_eq!(attr(s, "switchyard.flow").as_deref(), Some("refunds"), "{s:?}");
    }
    // No span id twice, one trace.
    let mut ids: Vec<&Vec<u8>> = all.iter().map(|s| &s.span_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), all.len(), "a span id sent twice: {all:?}");
    assert!(all.iter().all(|s| s.trace_id == all[0].trace_id));
    // One tree: one root, every other span's parent among the spans.
    let by_id: HashMap<&Vec<u8>, &Span> = all.iter().map(|s| (&s.span_id, s)).collect();
    let roots: Vec<&Span> = all.iter().filter(|s| s.parent_span_id.is_empty()).collect();
    assert_eq!(roots.len(), 1, "{roots:?}");
    assert_eq!(roots[0].name, "run refunds");
    assert_eq!(attr(roots[0], "switchyard.status").as_deref(), Some("succeeded"));
    let parent = |number: &str| -> String {
        let s = all
            .iter()
            .find(|s| key(s) == number)
            .unwrap_or_else(|| panic!("no `{number}`"));
        key(by_id
            .get(&s.parent_span_id)
            .unwrap_or_else(|| panic!("the parent of `{number}` was never sent")))
    };
    assert_eq!(parent("1.t1.1"), "1.t1");
    assert_eq!(parent("1.t2.1"), "1.t2");
    assert_eq!(parent("1.t2.approval"), "1.t2");
    for turn in ["1.t1", "1.t2", "1.t3"] {
        assert_eq!(parent(turn), "1", "{turn}");
    }
    assert_eq!(parent("1"), "run");
    for s in &all {
        assert_eq!(
            attr(s, "switchyard.flow").as_deref(),
            Some("refunds"),
            "{}",
            s.name
        );
    }
}

/// A submitted flow: a quick `set`, then a command that takes a second (idempotent, so a
/// takeover calls it again), a `foreach` and a `set`.
const SLOW_FLOW: &str = r#"flow: slow
agents:
  wait:
    kind: command
    run: [sh, -c, 'read -r x; sleep 1; printf "%s" "$x"']
    idempotent: true
  double:
    kind: transform
    result: {v: =input * 2}
steps:
  prepare:
    set: {$.ready: =true}
    next: call
  call:
    agent: wait
    output: {$.seen: $.n}
    next: spread
  spread:
    foreach: =[payload.n, payload.n + 1]
    agent: double
    select: $.v
    output: {$.doubled: $}
    next: total
  total:
    set:
      $.sum: =payload.doubled[0] + payload.doubled[1]
"#;

/// A worker frozen (SIGSTOP) past its lease while its runs are taken over by another, each
/// exporting to a collector of its own: after it thaws and the batch ends, each run's span is
/// sent once, by the worker that ended the run, with its success; the frozen worker sends
/// nothing of the runs it lost, and what it had finished of them before freezing is sent by
/// the worker that took them over, so each run is one whole tree; no span id is sent twice.
#[test]
fn a_worker_frozen_past_its_lease_sends_nothing_of_the_runs_it_lost() {
    use crate::cluster::{Pg, log_of, signal, spawn_worker, submit, wait_exit, wait_for, write_input};
    const N: usize = 8;
    let pg = Pg::new("otel");
    let dir = TempDir::new("otel-cluster");
    let flow = dir.write("slow.yaml", SLOW_FLOW);
    write_input(&dir, N);
    let out = submit(&dir, &flow, &pg.url("sy_otel_submit"), "traced", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let (c1, c2) = (Collector::start(), Collector::start());
    let lease = [
        "--concurrency",
        "3",
        "--lease",
        "2s",
        "--heartbeat",
        "400ms",
        "--grace",
        "5s",
    ];
    let with = |c: &Collector| -> Vec<String> {
        lease
            .iter()
            .map(|a| a.to_string())
            .chain(["--otlp-endpoint".to_string(), c.url.clone()])
            .collect()
    };
    let (a1, a2) = (with(&c1), with(&c2));
    let (a1, a2): (Vec<&str>, Vec<&str>) = (
        a1.iter().map(String::as_str).collect(),
        a2.iter().map(String::as_str).collect(),
    );
    let mut w1 = spawn_worker(&dir, &pg.url("sy_otel_w1"), "w1", &a1);
    let runs_in = |status: &str| {
        pg.count(&format!(
            "SELECT COUNT(*) FROM runs WHERE status = '{status}' AND parent_run IS NULL"
        ))
    };
    // Freeze the first worker once it has ended a run and holds others mid-way.
    wait_for(Duration::from_secs(60), "a first run to end", || {
        runs_in("succeeded") >= 1
    });
    signal(&w1, "STOP");
    let mut w2 = spawn_worker(&dir, &pg.url("sy_otel_w2"), "w2", &a2);
    wait_for(Duration::from_secs(60), "a run taken over", || {
        pg.count("SELECT COUNT(*) FROM runs WHERE recoveries > 0") >= 1
    });
    signal(&w1, "CONT");
    wait_for(Duration::from_secs(120), "the batch to end", || {
        runs_in("succeeded") == N as i64
    });
    signal(&w1, "TERM");
    signal(&w2, "TERM");
    assert!(
        wait_exit(&mut w1, Duration::from_secs(30), "worker 1").success(),
        "{}",
        log_of(&dir, "w1")
    );
    assert!(
        wait_exit(&mut w2, Duration::from_secs(30), "worker 2").success(),
        "{}",
        log_of(&dir, "w2")
    );
    // The runs the frozen worker found taken when it thawed.
    let log1 = log_of(&dir, "w1");
    let lost: std::collections::BTreeSet<String> = log1
        .lines()
        .filter(|l| l.contains("dropp"))
        .filter_map(|l| l.split("run_id=").nth(1))
        .filter_map(|r| r.split_whitespace().next())
        .map(|r| r.trim_matches('"').to_string())
        .collect();
    assert!(!lost.is_empty(), "worker 1 lost no run: {log1}");

    let (s1, s2) = (c1.spans(), c2.spans());
    let all: Vec<&Span> = s1.iter().chain(&s2).collect();
    let mut ids: Vec<&Vec<u8>> = all.iter().map(|s| &s.span_id).collect();
    ids.sort();
    ids.dedup();
    let twice = |s: &Span| all.iter().filter(|o| o.span_id == s.span_id).count() > 1;
    let sent_twice: Vec<(&str, &str, Option<String>, &[u8])> = s1
        .iter()
        .map(|s| ("worker 1", s))
        .chain(s2.iter().map(|s| ("worker 2", s)))
        .filter(|(_, s)| twice(s))
        .map(|(w, s)| (w, s.name.as_str(), attr(s, "switchyard.number"), &s.trace_id[..4]))
        .collect();
    assert_eq!(
        ids.len(),
        all.len(),
        "a span id sent twice: {sent_twice:?}\nworker 1: {log1}\nworker 2: {}",
        log_of(&dir, "w2")
    );
    // Every run's span once, a success.
    let roots: Vec<&&Span> = all.iter().filter(|s| s.parent_span_id.is_empty()).collect();
    let mut items: Vec<String> = roots
        .iter()
        .filter_map(|r| attr(r, "switchyard.item_id"))
        .collect();
    items.sort();
    let expected: Vec<String> = (0..N).map(|i| format!("item-{i}")).collect();
    assert_eq!(items, expected, "one run span per item");
    for r in &roots {
        assert_eq!(r.name, "run slow");
        assert_eq!(attr(r, "switchyard.status").as_deref(), Some("succeeded"));
        assert!(r.status.as_ref().is_none_or(|s| s.code != 2), "{r:?}");
        // One whole tree per run: its 4 steps and 2 iterations under it, whoever sent them.
        let trace: Vec<&&Span> = all.iter().filter(|s| s.trace_id == r.trace_id).collect();
        assert_eq!(
            trace.len(),
            7,
            "{:?}",
            trace.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        for s in &trace {
            assert!(
                s.parent_span_id.is_empty() || trace.iter().any(|p| p.span_id == s.parent_span_id),
                "the parent of `{}` was never sent",
                s.name
            );
        }
    }
    // Nothing of a lost run from the worker that lost it: its run span and every step came
    // from the other.
    for id in &lost {
        let root = roots
            .iter()
            .find(|r| attr(r, "switchyard.run_id").as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("no span of run {id}"));
        assert!(
            !s1.iter().any(|s| s.trace_id == root.trace_id),
            "worker 1 sent spans of run {id}, which it lost"
        );
    }
    assert!(!s1.is_empty(), "worker 1 sent nothing of the runs it ended");
}

/// A worker frozen past its lease with no other worker beside it, thawed while its runs are
/// still in flight: whether its heartbeat renews the leases first or its claim takes the runs
/// back, each run is carried on by one execution, ends once and is sent once — a run taken
/// back while its first execution is still stopping waits for that one to let go.
#[test]
fn a_lone_worker_frozen_past_its_lease_runs_and_sends_each_run_once() {
    use crate::cluster::{Pg, log_of, signal, spawn_worker, submit, wait_exit, wait_for, write_input};
    const N: usize = 4;
    let pg = Pg::new("otel_alone");
    let dir = TempDir::new("otel-alone");
    let flow = dir.write("slow.yaml", SLOW_FLOW.replace("sleep 1;", "sleep 2;"));
    write_input(&dir, N);
    let out = submit(&dir, &flow, &pg.url("sy_alone_submit"), "alone", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let c = Collector::start();
    let args = [
        "--concurrency",
        "16",
        "--lease",
        "1s",
        "--heartbeat",
        "200ms",
        "--grace",
        "5s",
        "--otlp-endpoint",
        &c.url,
    ];
    let mut w = spawn_worker(&dir, &pg.url("sy_alone_w"), "w", &args);
    // Frozen once every run is in its two-second call, for longer than a lease.
    wait_for(Duration::from_secs(60), "every run in its call", || {
        pg.count("SELECT COUNT(*) FROM steps WHERE step = 'prepare'") >= N as i64
    });
    std::thread::sleep(Duration::from_millis(300));
    signal(&w, "STOP");
    std::thread::sleep(Duration::from_millis(1600));
    signal(&w, "CONT");
    wait_for(Duration::from_secs(120), "the batch to end", || {
        pg.count("SELECT COUNT(*) FROM runs WHERE status = 'succeeded' AND parent_run IS NULL") == N as i64
    });
    signal(&w, "TERM");
    assert!(
        wait_exit(&mut w, Duration::from_secs(30), "the worker").success(),
        "{}",
        log_of(&dir, "w")
    );
    let log = log_of(&dir, "w");
    let spans = c.spans();
    let mut ids: Vec<&Vec<u8>> = spans.iter().map(|s| &s.span_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), spans.len(), "a span id sent twice: {log}");
    let roots: Vec<&Span> = spans.iter().filter(|s| s.parent_span_id.is_empty()).collect();
    assert_eq!(roots.len(), N, "{log}");
    for r in &roots {
        assert_eq!(attr(r, "switchyard.status").as_deref(), Some("succeeded"));
        assert_eq!(spans.iter().filter(|s| s.trace_id == r.trace_id).count(), 7);
    }
    // Each run ended once: one execution carried it on, one `run finished` line.
    for r in &roots {
        let id = attr(r, "switchyard.run_id").expect("a run id");
        let ended = log
            .lines()
            .filter(|l| l.contains("run finished") && l.contains(&id) && l.contains("succeeded"))
            .count();
        assert_eq!(ended, 1, "run {id} ended {ended} times: {log}");
    }
    // A run whose lease ran out and came back in the worker's own claim (claimed twice) says
    // so, and is not counted as recovered from a worker that stopped.
    assert_eq!(pg.count("SELECT COUNT(*) FROM runs WHERE recoveries > 0"), 0);
    let taken_back = pg.count("SELECT COUNT(*) FROM runs WHERE lease_epoch > 1");
    let said = log
        .lines()
        .filter(|l| l.contains("it goes on here") || l.contains("it starts once that one has"))
        .count();
    assert_eq!(said as i64, taken_back, "{log}");
}

/// A loop stopped at an approval (first process), resumed with the decision by a second
/// process killed during the approved call, and resumed again by a third: the third sends
/// what the killed one had finished (the decision) and what it finishes itself, and nothing
/// the first had sent already.
#[test]
fn a_run_resumed_after_its_resumer_died_sends_what_that_one_finished_and_no_more() {
    use crate::mock_server::{Llm, Reply};
    let server = Llm::start();
    server.script([
        Reply::calls(1, &[("lookup", r#"{"order": 7}"#)]),
        Reply::calls(2, &[("refund", r#"{"amount": 100}"#)]),
        Reply::Answer("Refunded.".into()),
    ]);
    let c = Collector::start();
    let dir = TempDir::new("otel-approval-killed");
    let marker = dir.path().join("refund-started");
    // The first call of `refund` marks its start and hangs; the next one answers.
    let flow = approval_flow(&server.base_url()).replace(
        "  refund:\n    kind: mock\n    returns: {refunded: true}\n",
        &format!(
            "  refund:\n    kind: command\n    idempotent: true\n    run: [sh, -c, 'if [ -e \"{m}\" ]; then printf \"{{\\\"refunded\\\": true}}\"; else touch \"{m}\"; sleep 60; fi']\n",
            m = marker.display()
        ),
    );
    assert!(flow.contains("kind: command"), "{flow}");
    dir.write("refunds.yaml", &flow);
    let store = ["--store", "sqlite:runs.db"];
    let otlp = ["--otlp-endpoint", &c.url];
    let stopped = run(switchyard(dir.path())
        .args(["run", "refunds.yaml", "--input", r#"{"text": "refund my order"}"#])
        .args(store)
        .args(otlp));
    assert_eq!(stopped.code(), 3, "{}", stopped.stderr);
    let id = crate::support::run_id_from(&stopped.stderr);
    let sent_first = c.spans().len();
    let mut resumer = switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"approve": true}"#])
        .args(store)
        .args(otlp)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("resume starts");
    crate::cluster::wait_for(Duration::from_secs(30), "the approved call to start", || {
        marker.exists()
    });
    resumer.kill().expect("kill -9");
    resumer.wait().expect("the resumer exits");
    assert_eq!(c.spans().len(), sent_first, "a killed process sent spans");
    let again = run(switchyard(dir.path())
        .args(["resume", &id])
        .args(store)
        .args(otlp));
    assert_eq!(again.code(), 0, "{}", again.stderr);
    let all = c.spans();
    let key = |s: &Span| attr(s, "switchyard.number").unwrap_or_else(|| "run".into());
    let mut third: Vec<String> = all[sent_first..].iter().map(key).collect();
    third.sort();
    assert_eq!(third, ["1", "1.t2.1", "1.t2.approval", "1.t3", "run"]);
    let mut ids: Vec<&Vec<u8>> = all.iter().map(|s| &s.span_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), all.len(), "a span id sent twice");
    assert_eq!(all.len(), 8);
    // Named from their own records, whichever process sent them.
    let mut names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "approval 1.t2",
            "chat m1",
            "chat m1",
            "chat m1",
            "execute_tool lookup",
            "execute_tool refund",
            "run refunds",
            "step answer"
        ]
    );
    assert!(
        all.iter()
            .all(|s| s.parent_span_id.is_empty() || all.iter().any(|p| p.span_id == s.parent_span_id))
    );
}

/// A collector that takes the connection and never answers: the process still ends within its
/// bounded wait, and every span it could not hand over is told as not exported, none as sent.
#[test]
fn a_collector_that_never_answers_leaves_every_span_told_as_not_exported() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("an address").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            match conn {
                Ok(c) => held.push(c),
                Err(_) => break,
            }
        }
    });
    let dir = TempDir::new("otel-mute");
    dir.write(
        "mute.yaml",
        "flow: mute\nsteps:\n  one:\n    set: {$.a: '=1'}\n    next: two\n  two:\n    set: {$.b: '=2'}\n",
    );
    let t0 = Instant::now();
    let out = run(switchyard(dir.path()).args([
        "run",
        "mute.yaml",
        "--input",
        "{}",
        "--store",
        "memory",
        "--otlp-endpoint",
        &format!("http://127.0.0.1:{port}"),
    ]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    // The run's span and its two steps'.
    assert!(
        out.stderr.contains("otlp: 3 span(s) not exported"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("; 0 exported"), "{}", out.stderr);
}

/// An agent loop whose model calls two tools in one turn, then answers; then a plain `llm`
/// step summarizes. The server names a more precise model than the one asked for.
fn helper_flow(base_url: &str) -> String {
    format!(
        r#"flow: helper
providers:
  local:
    base_url: {base_url}
agents:
  clerk:
    kind: llm
    provider: local
    model: m1
    prompt: "Question: {{{{ input.q }}}}"
    tools:
      lookup: {{description: Finds an order.}}
      calc: {{description: Adds numbers.}}
  lookup:
    kind: mock
    returns: {{order: 7, total: 100}}
  calc:
    kind: mock
    returns: {{sum: 107}}
  writer:
    kind: llm
    provider: local
    model: m2
    prompt: "Summarize: {{{{ input.text }}}}"
steps:
  answer:
    agent: clerk
    input: {{$.q: $.q}}
    output: {{$.reply: $.text}}
    next: sum_up
  sum_up:
    agent: writer
    input: {{$.text: $.reply}}
    output: {{$.summary: $.text}}
"#
    )
}

/// OpenTelemetry's GenAI conventions (SPEC §13): each model turn is `chat {model}` and each
/// tool call `execute_tool {tool}` with the `gen_ai.*` attributes — the tool's name and the id
/// the model gave the call, the models asked for and answered with, the tokens — a plain `llm`
/// step has a `chat` span of its own, tokens are counted once per trace, the resource names the
/// service, its version and the host, and spans have their lengths in nanoseconds.
#[test]
fn model_turns_and_tool_calls_follow_the_gen_ai_conventions() {
    use crate::mock_server::{Llm, Reply};
    let server = Llm::start();
    server
        .script([
            Reply::calls(
                1,
                &[("lookup", r#"{"order": 7}"#), ("calc", r#"{"a": 100, "b": 7}"#)],
            ),
            Reply::Answer("The total is 107.".into()),
            Reply::Answer("107.".into()),
        ])
        .name_model(|m| format!("{m}-2026-01-01"));
    let c = Collector::start();
    let dir = TempDir::new("otel-gen-ai");
    dir.write("helper.yaml", helper_flow(&server.base_url()));
    let out = run(switchyard(dir.path())
        .args(["run", "helper.yaml", "--input", r#"{"q": "what is my total?"}"#])
        .args(["--otlp-endpoint", &c.url]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let spans = c.spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let one = |name: &str| -> &Span {
        let v: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(v.len(), 1, "spans named `{name}`: {names:?}");
        v[0]
    };
    let by_id: HashMap<&Vec<u8>, &Span> = spans.iter().map(|s| (&s.span_id, s)).collect();
    let parent = |s: &Span| by_id.get(&s.parent_span_id).map(|p| p.name.clone());
    let number = |s: &Span| attr(s, "switchyard.number").unwrap_or_default();

    // The tool calls, under the turn that made them.
    for (tool, id, n) in [("lookup", "call_1_1", "1.t1.1"), ("calc", "call_1_2", "1.t1.2")] {
        let s = one(&format!("execute_tool {tool}"));
        assert_eq!(attr(s, "gen_ai.operation.name").as_deref(), Some("execute_tool"));
        assert_eq!(attr(s, "gen_ai.tool.name").as_deref(), Some(tool));
        assert_eq!(attr(s, "gen_ai.tool.call.id").as_deref(), Some(id));
        assert_eq!(attr(s, "gen_ai.tool.type").as_deref(), Some("function"));
        assert_eq!(number(s), n);
        let turn = by_id.get(&s.parent_span_id).expect("the turn's span");
        assert_eq!(number(turn), "1.t1");
    }
    // The turns: `chat m1`, under the loop's step.
    let turns: Vec<&Span> = spans.iter().filter(|s| s.name == "chat m1").collect();
    assert_eq!(turns.len(), 2, "{names:?}");
    for t in &turns {
        assert_eq!(parent(t).as_deref(), Some("step answer"));
        assert_eq!(attr(t, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(attr(t, "gen_ai.provider.name").as_deref(), Some("openai"));
        assert_eq!(attr(t, "gen_ai.system").as_deref(), Some("openai"));
        assert_eq!(attr(t, "gen_ai.request.model").as_deref(), Some("m1"));
        assert_eq!(attr(t, "gen_ai.response.model").as_deref(), Some("m1-2026-01-01"));
        for k in ["gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"] {
            let n: u64 = attr(t, k).and_then(|v| v.parse().ok()).unwrap_or(0);
            assert!(n > 0, "{k} of {}: {n}", number(t));
        }
    }
    // The loop's step is not a model call of its own: its calls are its turns.
    let looped = one("step answer");
    let mut under: Vec<String> = spans
        .iter()
        .filter(|s| s.parent_span_id == looped.span_id)
        .map(number)
        .collect();
    under.sort();
    assert_eq!(under, ["1.t1", "1.t2"], "{names:?}");
    // A plain `llm` step: its span, and the call's `chat` span under it with the same tokens.
    let step = one("step sum_up");
    let chat = one("chat m2");
    assert_eq!(parent(chat).as_deref(), Some("step sum_up"));
    assert_eq!(attr(chat, "gen_ai.operation.name").as_deref(), Some("chat"));
    assert_eq!(attr(chat, "gen_ai.request.model").as_deref(), Some("m2"));
    assert_eq!(
        attr(chat, "gen_ai.response.model").as_deref(),
        Some("m2-2026-01-01")
    );
    assert_eq!(attr(chat, "switchyard.flow").as_deref(), Some("helper"));
    assert_eq!(
        attr(chat, "gen_ai.usage.input_tokens"),
        attr(step, "switchyard.usage.input_tokens")
    );
    assert!(attr(step, "gen_ai.usage.input_tokens").is_none());
    // Tokens once per trace: `gen_ai.usage` only on the model calls, which add up to the
    // run's total.
    let sum = |k: &str| -> u64 {
        spans
            .iter()
            .filter_map(|s| attr(s, k))
            .map(|v| v.parse::<u64>().expect("a count"))
            .sum()
    };
    let root = one("run helper");
    let total = |k: &str| -> u64 { attr(root, k).and_then(|v| v.parse().ok()).expect("a count") };
    assert!(total("switchyard.usage.input_tokens") > 0);
    assert_eq!(
        sum("gen_ai.usage.input_tokens"),
        total("switchyard.usage.input_tokens")
    );
    assert_eq!(
        sum("gen_ai.usage.output_tokens"),
        total("switchyard.usage.output_tokens")
    );
    // Every span once, within its parent (a tool call hangs off the turn that asked for it,
    // and starts once that turn has its answer); times to the nanosecond, not whole
    // milliseconds.
    let mut ids: Vec<&Vec<u8>> = spans.iter().map(|s| &s.span_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), spans.len(), "{names:?}");
    assert_eq!(spans.len(), 8, "{names:?}");
    for s in &spans {
        assert!(s.end_time_unix_nano >= s.start_time_unix_nano, "{}", s.name);
        if let Some(p) = by_id.get(&s.parent_span_id)
            && s.name.starts_with("execute_tool")
        {
            assert!(s.start_time_unix_nano >= p.end_time_unix_nano, "{}", s.name);
        } else if let Some(p) = by_id.get(&s.parent_span_id) {
            assert!(
                s.start_time_unix_nano >= p.start_time_unix_nano
                    && s.end_time_unix_nano <= p.end_time_unix_nano,
                "{} is not within {}",
                s.name,
                p.name
            );
        }
    }
    assert!(
        spans.iter().any(|s| s.end_time_unix_nano > s.start_time_unix_nano
            && (s.start_time_unix_nano % 1_000_000 != 0 || s.end_time_unix_nano % 1_000_000 != 0)),
        "every span in whole milliseconds"
    );
    // The resource: the service, its version, the host and the process; no worker.
    let resources = c.resources();
    assert!(!resources.is_empty());
    for r in &resources {
        assert_eq!(resource_attr(r, "service.name").as_deref(), Some("switchyard"));
        assert_eq!(
            resource_attr(r, "service.version").as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        assert!(resource_attr(r, "host.name").is_some_and(|h| !h.is_empty()));
        assert!(resource_attr(r, "process.pid").is_some());
        assert_eq!(resource_attr(r, "switchyard.worker.id"), None);
    }
}

/// A worker's spans say which worker sent them: the resource names its id, the one the
/// store knows it by, beside the service, its version and the host.
#[test]
fn a_workers_spans_name_the_worker() {
    use crate::cluster::{Pg, log_of, spawn_worker, submit, wait_exit, write_input};
    let pg = Pg::new("otel_worker");
    let dir = TempDir::new("otel-worker");
    let flow = dir.write(
        "quick.yaml",
        "flow: quick\nsteps:\n  one:\n    set: {$.seen: =true}\n",
    );
    write_input(&dir, 2);
    let out = submit(&dir, &flow, &pg.url("sy_otel_wsubmit"), "quick", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let c = Collector::start();
    let mut w = spawn_worker(
        &dir,
        &pg.url("sy_otel_worker"),
        "w",
        &["--exit-when-idle", "--otlp-endpoint", &c.url],
    );
    assert!(
        wait_exit(&mut w, Duration::from_secs(60), "the worker").success(),
        "{}",
        log_of(&dir, "w")
    );
    let workers = pg.query("SELECT id FROM workers");
    assert_eq!(workers.len(), 1, "{workers:?}");
    let id = workers[0]["id"].clone().expect("a worker id");
    assert_eq!(c.spans().iter().filter(|s| s.name == "run quick").count(), 2);
    let resources = c.resources();
    assert!(!resources.is_empty());
    for r in &resources {
        assert_eq!(
            resource_attr(r, "switchyard.worker.id").as_deref(),
            Some(id.as_str())
        );
        assert_eq!(
            resource_attr(r, "service.instance.id").as_deref(),
            Some(id.as_str())
        );
        assert_eq!(resource_attr(r, "service.name").as_deref(), Some("switchyard"));
        assert!(resource_attr(r, "host.name").is_some_and(|h| id.starts_with(&h)));
    }
}

/// A batch whose items each run child flows three at a time (so that many run trees are filled
/// at once, on every thread of the runtime, their child runs ending on other threads than
/// their root): every span comes once, in its item's trace, under the right parent.
#[test]
fn concurrent_run_trees_each_send_every_span_once_under_its_parent() {
    const ITEMS: usize = 120;
    let c = Collector::start();
    let dir = TempDir::new("otel-fan");
    dir.write(
        "fan.yaml",
        r#"flow: fan
agents:
  child:
    kind: flow
    agents:
      wait:
        kind: mock
        latency: 2ms
        returns: {v: =input.n * 10}
    steps:
      call:
        agent: wait
        input: {$.n: $.n}
        output: {$.v: $.v}
        next: done
      done:
        set: {$.ok: =true}
steps:
  each:
    foreach: $.ns
    concurrency: 3
    agent: child
    output: {$.vs: $}
"#,
    );
    let input: String = (0..ITEMS)
        .map(|i| {
            let ns: Vec<String> = (i..i + 4).map(|n| format!("{{\"n\": {n}}}")).collect();
            format!("{{\"id\": \"i{i}\", \"ns\": [{}]}}\n", ns.join(", "))
        })
        .collect();
    dir.write("in.jsonl", &input);
    let out = run(switchyard(dir.path())
        .args([
            "batch",
            "fan.yaml",
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
        ])
        .args(["--concurrency", "32", "--otlp-endpoint", &c.url]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(!out.stderr.contains("dropped"), "{}", out.stderr);
    let spans = c.spans();
    // Per item: its run, `each`, 4 iterations, 4 child runs of 2 steps each.
    assert_eq!(spans.len(), ITEMS * (1 + 1 + 4 + 4 * 3), "spans received");
    let mut ids: Vec<&[u8]> = spans.iter().map(|s| &s.span_id[..]).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), spans.len(), "a span id came twice");
    let by_id: HashMap<&[u8], &Span> = spans.iter().map(|s| (&s.span_id[..], s)).collect();
    let mut traces: HashMap<&[u8], Vec<&Span>> = HashMap::new();
    for s in &spans {
        traces.entry(&s.trace_id[..]).or_default().push(s);
    }
    assert_eq!(traces.len(), ITEMS, "one trace per item");
    let mut items = Vec::new();
    for (trace, spans) in &traces {
        let roots: Vec<&&Span> = spans.iter().filter(|s| s.parent_span_id.is_empty()).collect();
        assert_eq!(roots.len(), 1, "one root span per trace");
        let root = roots[0];
        assert_eq!(root.name, "run fan");
        let item = attr(root, "switchyard.item_id").expect("the root names its item");
        let i: u64 = item.trim_start_matches('i').parse().expect("an item id");
        items.push(i);
        for s in spans.iter().filter(|s| !s.parent_span_id.is_empty()) {
            let parent = by_id
                .get(&s.parent_span_id[..])
                .unwrap_or_else(|| panic!("{}: its parent was not sent", s.name));
            assert_eq!(
                &parent.trace_id[..],
                *trace,
                "{} under a span of another trace",
                s.name
            );
            let expected = match s.name.as_str() {
                "step each" => "run fan",
                "run child" => "iteration each",
                "step call" | "step done" => "run child",
                n if n.starts_with("iteration each [") => "step each",
                other => panic!("unexpected span {other}"),
            };
            assert!(
                parent.name.starts_with(expected),
                "{} under {}",
                s.name,
                parent.name
            );
            // A child run's steps name the run they are of, and it is their parent's.
            if parent.name == "run child" {
                assert_eq!(attr(s, "switchyard.run_id"), attr(parent, "switchyard.run_id"));
            }
            assert_eq!(
                attr(s, "switchyard.status").as_deref(),
                Some("succeeded"),
                "{}",
                s.name
            );
        }
        // Each iteration called one child run, under it; iterations 0 to 3 each once.
        let mut iterations: Vec<u64> = Vec::new();
        for it in spans.iter().filter(|s| s.name.starts_with("iteration each [")) {
            let under = spans
                .iter()
                .filter(|s| s.name == "run child" && s.parent_span_id == it.span_id)
                .count();
            assert_eq!(under, 1, "{}: child runs under it", it.name);
            iterations.push(
                attr(it, "switchyard.iteration")
                    .and_then(|k| k.parse().ok())
                    .expect("an iteration number"),
            );
        }
        iterations.sort_unstable();
        assert_eq!(iterations, [0, 1, 2, 3]);
    }
    items.sort_unstable();
    assert_eq!(items, (0..ITEMS as u64).collect::<Vec<_>>());
}
