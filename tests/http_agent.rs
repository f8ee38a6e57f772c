//! `http` agents against a local JSON service ([`mock_server::Service`], real HTTP on
//! 127.0.0.1): what the service receives (body, headers, idempotency key, secrets), how
//! statuses map to error kinds and retries, the response size cap, redirects, and
//! `allow_hosts` at flow and command-line level.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard::__private::record::RunStatus;
use switchyard::__private::runtime::engine::{Engine, RunOptions, RunOutcome};
use switchyard::__private::store::memory::MemoryStore;

use crate::llm::plan_of;
use crate::mock_server::Service;
use crate::support::{self, TempDir};

/// A flow with one `http` agent `svc` (extra agent lines in `agent`) called by step `call`.
fn flow_text(url: &str, agent: &str, top: &str, step: &str) -> String {
    format!(
        "flow: call\n{top}\nagents:\n  svc:\n    kind: http\n    url: {url}\n{agent}\nsteps:\n  call:\n    agent: svc\n{step}\n"
    )
}

async fn run_flow(text: &str, input: Value) -> RunOutcome {
    let dir = TempDir::new("http-agent");
    let path = dir.write("f.yaml", text);
    let engine = Engine::new(std::sync::Arc::new(MemoryStore::new()));
    engine
        .run(plan_of(&path), input, json!({}), RunOptions::default())
        .await
}

fn kind_and_message(out: &RunOutcome) -> (String, String) {
    let e = out
        .error
        .as_ref()
        .unwrap_or_else(|| panic!("the run should fail: {out:?}"));
    (e.kind.as_str().to_owned(), e.message.clone())
}

#[test]
fn the_service_receives_the_input_headers_secrets_and_idempotency_key() {
    let svc = Service::start();
    let dir = TempDir::new("http-echo");
    let text = flow_text(
        &svc.url("/echo"),
        "    headers:\n      X-Api-Key: ${env:SWITCHYARD_TEST_HTTP_KEY}\n      X-Tenant: acme",
        "",
        "    output: {$.echo: $}",
    );
    dir.write("f.yaml", text);
    let key = "http-secret-0123456789";
    let input = json!({"ticket": {"id": "T-1", "body": "héllo"}});
    let out = support::run(
        support::switchyard(dir.path())
            .env("SWITCHYARD_TEST_HTTP_KEY", key)
            .args(["run", "f.yaml", "--input", &input.to_string()]),
    );
    assert_eq!(out.code(), 0, "{out:?}");
    let echo = &serde_json::from_str::<Value>(&out.stdout).unwrap()["echo"];
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["body"], input);
    assert_eq!(echo["tenant"], "acme");
    assert_eq!(echo["api_key"], key.len());
    let run = echo["run"].as_str().unwrap();
    assert!(run.starts_with('r'), "{run}");
    assert_eq!(echo["idempotency_key"], format!("{run}:1"));
    assert_eq!(
        (echo["step"].as_str(), echo["attempt"].as_str()),
        (Some("1"), Some("1"))
    );
    let hit = &svc.hits()[0];
    assert_eq!(hit.headers["x-api-key"], key);
    assert_eq!(hit.headers["content-type"], "application/json");
    assert!(!out.stdout.contains(key) && !out.stderr.contains(key));
}

#[tokio::test]
async fn statuses_map_to_kinds_and_client_errors_are_not_retried() {
    let svc = Service::start();
    let retry = "    retry: {attempts: 3, backoff: 10ms, jitter: false}";
    let call = |path: &str| flow_text(&svc.url(path), "", "", retry);

    let out = run_flow(&call("/status/404"), json!({})).await;
    let (kind, message) = kind_and_message(&out);
    assert_eq!(kind, "agent");
    assert!(
        message.ends_with(&format!(
            "POST {} answered 404 Not Found: status 404: the service says no",
            svc.url("/status/404")
        )),
        "{message}"
    );
    assert_eq!(svc.hits_on("/status/404"), 1, "a 404 is not asked again");

    let out = run_flow(&call("/status/503"), json!({})).await;
    assert_eq!(kind_and_message(&out).0, "agent");
    assert_eq!(svc.hits_on("/status/503"), 3, "a 5xx is retried");

    let out = run_flow(&call("/status/408"), json!({})).await;
    assert_eq!(kind_and_message(&out).0, "timeout");
    assert_eq!(svc.hits_on("/status/408"), 3);

    // 429 carries `Retry-After: 1`: the engine's retry waits at least that long.
    let t0 = Instant::now();
    let out = run_flow(
        &flow_text(
            &svc.url("/status/429"),
            "",
            "",
            "    retry: {attempts: 2, backoff: 10ms}",
        ),
        json!({}),
    )
    .await;
    assert_eq!(kind_and_message(&out).0, "rate_limited");
    assert_eq!(svc.hits_on("/status/429"), 2);
    assert!(t0.elapsed() >= Duration::from_secs(1), "{:?}", t0.elapsed());

    // Failure edges see the kind.
    let routed = format!(
        "{}    next:\n      - to: fallback\n        on: failure\n        errors: [agent]\n  fallback:\n    set: {{$.routed: {{value: true}}}}\n",
        call("/status/400")
    );
    let out = run_flow(&routed, json!({})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    assert_eq!(out.output.unwrap()["routed"], true);
}

#[tokio::test]
async fn responses_are_capped_and_must_be_json() {
    let svc = Service::start();
    let capped = |path: &str| {
        flow_text(
            &svc.url(path),
            "    max_response: 1KiB",
            "",
            "    output: {$.r: $}",
        )
    };
    let out = run_flow(&capped("/big/500"), json!({})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let out = run_flow(&capped("/big/2000"), json!({})).await;
    let (kind, message) = kind_and_message(&out);
    assert_eq!(kind, "invalid_output");
    assert!(
        message.contains("larger than 1024 bytes (max_response)"),
        "{message}"
    );
    let out = run_flow(&capped("/bad-json"), json!({})).await;
    let (kind, message) = kind_and_message(&out);
    assert_eq!(kind, "invalid_output");
    assert!(
        message.contains("the response is not JSON") && message.ends_with("<html>not json</html>"),
        "{message}"
    );
    // A body of another type is a file, not bound by `max_response`.
    let out = run_flow(&capped("/text"), json!({})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let text = b"<html>not json</html>";
    assert_eq!(
        out.output.as_ref().map(|o| o["r"].clone()),
        Some(json!({
            "file": format!("sha256:{}", switchyard::__private::store::blobs::hex(&<sha2::Sha256 as sha2::Digest>::digest(text))),
            "name": "text",
            "media_type": "text/plain",
            "size": text.len(),
        }))
    );
}

#[tokio::test]
async fn redirects_are_followed_up_to_five() {
    let svc = Service::start();
    let flow = |path: &str| {
        flow_text(
            &svc.url(path),
            "    headers: {X-Tenant: acme}",
            "",
            "    output: {$.r: $}",
        )
    };
    let out = run_flow(&flow("/redirect/5"), json!({"a": 1})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let r = &out.output.unwrap()["r"];
    // A 302 after a POST continues as a GET, without the body; same origin keeps headers.
    assert_eq!(
        (r["method"].as_str(), r["tenant"].as_str()),
        (Some("GET"), Some("acme"))
    );
    let last = svc.hits().into_iter().rfind(|h| h.path == "/echo").unwrap();
    assert_eq!((last.method.as_str(), last.body.len()), ("GET", 0));
    let out = run_flow(&flow("/redirect/6"), json!({})).await;
    let (kind, message) = kind_and_message(&out);
    assert_eq!(kind, "agent");
    assert!(message.ends_with("more than 5 redirects"), "{message}");

    // A redirect to another origin (307 keeps the method and body) drops configured headers.
    let out = run_flow(&flow("/away"), json!({"a": 1})).await;
    assert_eq!(out.status, RunStatus::Succeeded, "{:?}", out.error);
    let r = &out.output.unwrap()["r"];
    assert_eq!(
        (r["method"].as_str(), &r["body"]),
        (Some("POST"), &json!({"a": 1}))
    );
    assert_eq!(r["tenant"], Value::Null);
}

#[tokio::test]
async fn allow_hosts_refuses_other_hosts_with_kind_capability() {
    let svc = Service::start();
    // What lint can see, it reports (SY505) and the run does not start.
    let dir = TempDir::new("http-hosts-lint");
    dir.write(
        "f.yaml",
        flow_text(&svc.url("/echo"), "", "allow_hosts: [api.example.com]", ""),
    );
    let out = support::run(support::switchyard(dir.path()).args(["run", "f.yaml"]));
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(
        out.stderr
            .contains("agent `svc` reaches host `127.0.0.1`, which is not in `allow_hosts`"),
        "{}",
        out.stderr
    );
    // A URL known only at the call is checked at the call.
    let text = flow_text(
        &svc.url("/echo")
            .replace("127.0.0.1", "${env:SWITCHYARD_TEST_LOOPBACK}"),
        "",
        "allow_hosts: [api.example.com]",
        "",
    );
    dir.write("g.yaml", text);
    let out = support::run(
        support::switchyard(dir.path())
            .env("SWITCHYARD_TEST_LOOPBACK", "127.0.0.1")
            .args(["run", "g.yaml"]),
    );
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(
        out.stderr.contains(
            // The host came from a secret reference: it is not shown.
            "error[capability]: step `call`: agent `svc`: host `[redacted]` is not in `allow_hosts` (allowed: api.example.com)"
        ),
        "{}",
        out.stderr
    );
    assert_eq!(svc.hits_on("/echo"), 0);

    // Allowed, then redirected to a host that is not.
    let out = run_flow(
        &flow_text(&svc.url("/away"), "", "allow_hosts: [127.0.0.1]", ""),
        json!({}),
    )
    .await;
    let (kind, message) = kind_and_message(&out);
    assert_eq!(kind, "capability");
    assert!(
        message.contains("host `localhost` is not in `allow_hosts`"),
        "{message}"
    );
    assert_eq!(svc.hits_on("/echo"), 0);

    // A child flow never reaches more than its caller allows.
    let dir = TempDir::new("http-hosts-nested");
    dir.write(
        "child.yaml",
        flow_text(&svc.url("/echo"), "", "allow_hosts: [127.0.0.1]", ""),
    );
    let parent = dir.write(
        "parent.yaml",
        "flow: parent\nallow_hosts: [api.example.com]\nagents:\n  child:\n    kind: flow\n    path: child.yaml\nsteps:\n  go:\n    agent: child\n",
    );
    let engine = Engine::new(std::sync::Arc::new(MemoryStore::new()));
    let out = engine
        .run(plan_of(&parent), json!({}), json!({}), RunOptions::default())
        .await;
    assert_eq!(kind_and_message(&out).0, "capability");
    assert_eq!(svc.hits_on("/echo"), 0);
}

#[test]
fn allow_hosts_on_the_command_line() {
    let svc = Service::start();
    let dir = TempDir::new("http-hosts-cli");
    dir.write(
        "f.yaml",
        flow_text(&svc.url("/echo"), "", "", "    output: {$.r: $}"),
    );
    let run = |hosts: &str| {
        support::run(support::switchyard(dir.path()).args(["run", "f.yaml", "--allow-hosts", hosts]))
    };
    let out = run("api.example.com,*.example.org");
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(
        out.stderr.contains(
            "error[capability]: step `call`: agent `svc`: host `127.0.0.1` is not in `allow_hosts` (allowed: api.example.com, *.example.org)"
        ),
        "{}",
        out.stderr
    );
    assert_eq!(svc.hits_on("/echo"), 0);
    let out = run(&format!("api.example.com,127.0.0.1:{}", svc.addr.port()));
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(svc.hits_on("/echo"), 1);
}

#[tokio::test]
async fn each_attempt_is_bounded_by_the_step_timeout() {
    let svc = Service::start();
    let text = flow_text(
        &svc.url("/slow/3000"),
        "",
        "",
        "    timeout: 200ms\n    retry: {attempts: 2, backoff: 10ms, on: [timeout]}",
    );
    let t0 = Instant::now();
    let out = run_flow(&text, json!({})).await;
    let (kind, message) = kind_and_message(&out);
    assert_eq!(kind, "timeout");
    assert!(message.contains("timed out after 200ms (attempt 2)"), "{message}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(svc.hits_on("/slow/3000"), 2);
}
