//! `switchyard serve`, the JSON API of SPEC §15, driven over loopback HTTP against the real
//! binary and a SQLite store: tokens and scopes, `Origin`, sessions, decisions (one answer
//! wins, a schema violation records nothing), runs started by idempotency key, server-sent
//! events, and a decided run continued by the server.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::Digest;

use crate::support::{TempDir, run, run_id_from, switchyard};

/// `serve --http 127.0.0.1:0 --store sqlite:DIR/runs.db --root DIR ARGS...`: the process and
/// its `host:port`.
#[allow(clippy::zombie_processes)]
fn serve(dir: &TempDir, args: &[&str]) -> (Child, String) {
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    let mut child = switchyard(dir.path())
        .args(["serve", "--http", "127.0.0.1:0", "--store", &store, "--root"])
        .arg(dir.path())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve starts");
    let mut stderr = BufReader::new(child.stderr.take().expect("piped"));
    let mut line = String::new();
    loop {
        line.clear();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve said no URL");
        }
        if let Some(at) = line.find("http://") {
            let authority = line[at + 7..]
                .split('/')
                .next()
                .expect("an authority")
                .to_string();
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut stderr, &mut std::io::sink());
            });
            return (child, authority);
        }
    }
}

fn stop(mut child: Child) {
    // SAFETY: signalling a child this test started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("waits").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An HTTP answer: status, headers (names lower case), body.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("JSON ({e}): {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One request on its own connection, read to its end (an event stream: until it ends).
fn request(authority: &str, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>) -> Reply {
    let body = body.unwrap_or("");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    let mut stream = std::net::TcpStream::connect(authority).expect("connects");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("a timeout");
    stream.write_all(req.as_bytes()).expect("writes");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("reads the answer");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").expect("a head");
    let mut lines = head.lines();
    let status = lines.next().expect("a status line")[9..12]
        .parse()
        .expect("a status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk(rest) } else { rest.to_string() };
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

fn get(authority: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    request(authority, "GET", path, headers, None)
}

fn post(authority: &str, path: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    request(authority, "POST", path, headers, Some(&body.to_string()))
}

fn sha(secret: &str) -> String {
    sha2::Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A tokens file: alice and bob decide (and read), reader reads, runner starts runs.
fn tokens(dir: &TempDir) -> String {
    let text = format!(
        "# name scopes hash\nalice read,decide sha256:{}\nbob read,decide sha256:{}\nreader read sha256:{}\nrunner read,run sha256:{}\n",
        sha("alice-secret"),
        sha("bob-secret"),
        sha("reader-secret"),
        sha("runner-secret")
    );
    dir.write("tokens", text).display().to_string()
}

const ALICE: (&str, &str) = ("Authorization", "Bearer alice-secret");
const BOB: (&str, &str) = ("Authorization", "Bearer bob-secret");
const READER: (&str, &str) = ("Authorization", "Bearer reader-secret");
const RUNNER: (&str, &str) = ("Authorization", "Bearer runner-secret");

/// A flow that asks for approval, then runs `after` (a command appending to `calls`) when
/// approved.
fn approve_flow(calls: &Path) -> String {
    format!(
        r#"flow: approve
agents:
  after:
    kind: command
    run: [sh, -c, 'cat > /dev/null; echo ran >> "{}"; echo "{{}}"']
    idempotent: false
steps:
  gate:
    interrupt:
      prompt: "Refund {{{{ input.amount }}}}?"
      schema: {{type: object, required: [approved], properties: {{approved: {{type: boolean}}}}}}
    input: [$.amount]
    output: {{$.approval: $}}
    next:
      - to: pay
        if: payload.approval.approved
      - to: end
  pay:
    agent: after
"#,
        calls.display()
    )
}

/// Runs `approve.yaml` to its interrupt on the directory's store: the run id.
fn interrupted_run(dir: &TempDir) -> String {
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    let out = run(switchyard(dir.path()).args([
        "run",
        "approve.yaml",
        "--input",
        r#"{"amount": 30}"#,
        "--store",
        &store,
    ]));
    assert_eq!(out.code(), 3, "interrupted: {}", out.stderr);
    run_id_from(&out.stderr)
}

/// Polls `GET /v1/runs/{id}` until the run is no longer interrupted, queued or running.
fn wait_for_end(authority: &str, id: &str, auth: (&str, &str)) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = get(authority, &format!("/v1/runs/{id}"), &[auth]).json();
        let status = r["run"]["status"].as_str().expect("a status").to_string();
        if !["interrupted", "queued", "running"].contains(&status.as_str()) {
            return r;
        }
        assert!(Instant::now() < deadline, "run `{id}` is still {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn tokens_scopes_origins_and_sessions() {
    let dir = TempDir::new("serve-auth");
    let tokens = tokens(&dir);
    let (server, at) = serve(&dir, &["--tokens", &tokens]);
    assert_eq!(get(&at, "/healthz", &[]).status, 200);
    let none = get(&at, "/v1/inbox", &[]);
    assert_eq!(none.status, 401, "{}", none.body);
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    assert_eq!(
        get(&at, "/v1/inbox", &[("Authorization", "Bearer nope")]).status,
        401
    );
    let read = get(&at, "/v1/inbox", &[READER]);
    assert_eq!((read.status, read.json()), (200, json!({"groups": []})));
    // Scopes: a reader may not decide, a decider may not start runs.
    let d = post(&at, "/v1/inbox/q0/decision", &[READER], &json!({"decision": {}}));
    assert_eq!(d.status, 403, "{}", d.body);
    assert!(d.body.contains("lacks the `decide` scope"), "{}", d.body);
    let r = post(&at, "/v1/runs", &[ALICE], &json!({"flow": "x.yaml", "input": {}}));
    assert_eq!(r.status, 403, "{}", r.body);
    // Origin: another one is refused before anything else; the server's own is let through.
    let evil = post(
        &at,
        "/v1/inbox/q0/decision",
        &[ALICE, ("Origin", "https://evil.example")],
        &json!({"decision": {}}),
    );
    assert_eq!(evil.status, 403, "{}", evil.body);
    assert!(evil.body.contains("another origin"), "{}", evil.body);
    let own = format!("http://{at}");
    let ok = post(
        &at,
        "/v1/inbox/q0/decision",
        &[ALICE, ("Origin", &own)],
        &json!({"decision": {}}),
    );
    assert_eq!(ok.status, 404, "{}", ok.body);
    // Sessions: the secret once, then the cookie.
    let login = request(
        &at,
        "POST",
        "/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        Some("token=reader-secret&next=%2Finbox"),
    );
    assert_eq!(login.status, 303, "{}", login.body);
    assert_eq!(login.header("location"), Some("/inbox"));
    let cookie = login.header("set-cookie").expect("a cookie").to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().expect("name=value").to_string();
    assert_eq!(get(&at, "/v1/inbox", &[("Cookie", &session)]).status, 200);
    let d = post(
        &at,
        "/v1/inbox/q0/decision",
        &[("Cookie", &session)],
        &json!({"decision": {}}),
    );
    assert_eq!(d.status, 403, "the session has the reader's scopes: {}", d.body);
    let bad = request(
        &at,
        "POST",
        "/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        Some("token=wrong"),
    );
    assert_eq!(bad.status, 401);
    assert_eq!(
        get(&at, "/v1/inbox", &[("Cookie", "switchyard_session=forged")]).status,
        401
    );
    // Another Host (DNS rebinding) is refused on loopback.
    let mut s = std::net::TcpStream::connect(&at).expect("connects");
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
        .expect("writes");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("reads");
    assert!(reply.starts_with("HTTP/1.1 403"), "{reply}");
    stop(server);
}

#[test]
fn a_public_address_needs_tokens_and_a_bad_tokens_file_is_told() {
    let dir = TempDir::new("serve-usage");
    let out = run(switchyard(dir.path()).args(["serve", "--http", "0.0.0.0:0", "--store", "memory"]));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("--tokens"), "{}", out.stderr);
    let out = run(switchyard(dir.path()).args(["serve", "--bind-any", "--store", "memory"]));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    dir.write("bad", "alice read,write sha256:00\n");
    let out = run(switchyard(dir.path()).args(["serve", "--tokens", "bad", "--store", "memory"]));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("bad:1: token `alice`: unknown scope `write`"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_decision_over_http_wins_once_and_the_server_continues_the_run() {
    let dir = TempDir::new("serve-decide");
    let calls = dir.path().join("calls");
    dir.write("approve.yaml", approve_flow(&calls));
    let run_id = interrupted_run(&dir);
    let tokens = tokens(&dir);
    let (server, at) = serve(&dir, &["--tokens", &tokens]);

    let inbox = get(&at, "/v1/inbox?flow=approve", &[READER]).json();
    let group = &inbox["groups"][0];
    assert_eq!(
        (group["step"].as_str(), group["count"].as_u64()),
        (Some("gate"), Some(1)),
        "{inbox}"
    );
    assert_eq!(group["question"], "Refund 30?");
    let id = group["items"][0]["id"].as_str().expect("an item id").to_string();
    assert_eq!(group["items"][0]["run_id"], run_id.as_str());
    let filtered = get(&at, "/v1/inbox?filter=input.amount%20%3E%20100", &[READER]).json();
    assert_eq!(filtered["groups"], json!([]));
    let broken = get(&at, "/v1/inbox?filter=input.amount%20%3E", &[READER]);
    assert_eq!(broken.status, 400, "{}", broken.body);
    let item = get(&at, &format!("/v1/inbox/{id}"), &[READER]).json();
    assert_eq!(
        (item["state"].as_str(), &item["input"]),
        (Some("waiting"), &json!({"amount": 30}))
    );

    // A decision the schema refuses: 422 with its pointer, nothing recorded.
    let bad = post(
        &at,
        &format!("/v1/inbox/{id}/decision"),
        &[ALICE],
        &json!({"decision": {"approved": "yes"}}),
    );
    assert_eq!(bad.status, 422, "{}", bad.body);
    assert_eq!(bad.json()["pointer"], "/approved");
    assert_eq!(
        get(&at, "/v1/decisions", &[READER]).json()["decisions"],
        json!([])
    );
    let not_json = request(
        &at,
        "POST",
        &format!("/v1/inbox/{id}/decision"),
        &[ALICE],
        Some("{\"decision\": "),
    );
    assert_eq!(not_json.status, 400, "{}", not_json.body);
    assert!(not_json.body.contains("line 1, column"), "{}", not_json.body);

    // Two answers at once: one is recorded, the other is told who answered.
    let answers: Vec<(&str, Reply)> = std::thread::scope(|s| {
        let each = [("alice", ALICE), ("bob", BOB)].map(|(name, auth)| {
            let (at, path) = (&at, format!("/v1/inbox/{id}/decision"));
            s.spawn(move || {
                let body = json!({"decision": {"approved": true}, "reason": format!("{name} checked")});
                (name, post(at, &path, &[auth], &body))
            })
        });
        each.into_iter().map(|h| h.join().expect("answers")).collect()
    });
    let won: Vec<&(&str, Reply)> = answers.iter().filter(|(_, r)| r.status == 200).collect();
    let lost: Vec<&(&str, Reply)> = answers.iter().filter(|(_, r)| r.status != 200).collect();
    assert_eq!(
        (won.len(), lost.len()),
        (1, 1),
        "{:?}",
        answers.iter().map(|(_, r)| &r.body).collect::<Vec<_>>()
    );
    let (winner, row) = (won[0].0, won[0].1.json());
    assert_eq!(
        (row["actor"].as_str(), row["via"].as_str()),
        (Some(winner), Some("api")),
        "{row}"
    );
    assert_eq!(row["decision"], json!({"approved": true}));
    assert_eq!(lost[0].1.status, 409, "{}", lost[0].1.body);
    assert_eq!(lost[0].1.json()["decided_by"], winner);

    // The server continues the run: the step after the interrupt runs once.
    let done = wait_for_end(&at, &run_id, READER);
    assert_eq!(done["run"]["status"], "succeeded", "{done}");
    assert_eq!(std::fs::read_to_string(&calls).expect("the step ran"), "ran\n");
    let log = get(&at, &format!("/v1/decisions?run={run_id}"), &[READER]).json();
    assert_eq!(log["decisions"].as_array().map(Vec::len), Some(1), "{log}");
    let again = post(
        &at,
        &format!("/v1/inbox/{id}/decision"),
        &[BOB],
        &json!({"decision": {"approved": false}}),
    );
    assert_eq!(again.status, 409, "{}", again.body);
    assert_eq!(get(&at, "/v1/inbox/qnothing", &[READER]).status, 404);
    stop(server);
    assert_eq!(std::fs::read_to_string(&calls).expect("calls"), "ran\n");
}

#[test]
fn runs_start_once_per_key_and_stream_their_steps() {
    let dir = TempDir::new("serve-runs");
    let calls = dir.path().join("calls");
    dir.write(
        "flows/slow.yaml",
        crate::support::slow_steps_flow(&calls, &["one", "two"]),
    );
    dir.write("outside.yaml", crate::support::CLEAN_FLOW);
    let tokens = tokens(&dir);
    let (server, at) = serve(&dir, &["--tokens", &tokens]);

    let body = json!({"flow": "flows/slow.yaml", "input": {}, "idempotency_key": "order-17"});
    let first = post(&at, "/v1/runs", &[RUNNER], &body);
    assert_eq!(first.status, 202, "{}", first.body);
    let id = first.json()["run_id"].as_str().expect("a run id").to_string();
    let second = post(&at, "/v1/runs", &[RUNNER], &body);
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(
        (
            second.json()["run_id"].as_str(),
            second.json()["created"].as_bool()
        ),
        (Some(id.as_str()), Some(false))
    );

    // The run's events: each step as recorded, then its end; the stream ends with the run.
    let events = get(&at, &format!("/v1/runs/{id}/events"), &[READER]);
    assert_eq!(events.status, 200, "{}", events.body);
    assert_eq!(events.header("content-type"), Some("text/event-stream"));
    let parsed: Vec<(String, Value)> = events
        .body
        .split("\n\n")
        .filter_map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name.to_string(), serde_json::from_str(data).expect("JSON data")))
        })
        .collect();
    let finished: Vec<&str> = parsed
        .iter()
        .filter(|(n, d)| n == "step" && d["status"] == "succeeded")
        .filter_map(|(_, d)| d["step"].as_str())
        .collect();
    assert_eq!(finished, ["one", "two"], "{}", events.body);
    let last = parsed.last().expect("events");
    assert_eq!(
        (last.0.as_str(), &last.1["status"]),
        ("status", &json!("succeeded")),
        "{}",
        events.body
    );

    let third = post(&at, "/v1/runs", &[RUNNER], &body).json();
    assert_eq!(
        (third["run_id"].as_str(), third["status"].as_str()),
        (Some(id.as_str()), Some("succeeded"))
    );
    assert_eq!(
        std::fs::read_to_string(&calls).expect("calls"),
        "x\nx\n",
        "one run"
    );
    let listed = get(&at, "/v1/runs?status=succeeded", &[READER]).json();
    assert_eq!(listed["runs"].as_array().map(Vec::len), Some(1), "{listed}");
    let record = get(&at, &format!("/v1/runs/{id}"), &[READER]).json();
    assert_eq!(record["steps"].as_array().map(Vec::len), Some(2), "{record}");

    for (flow, status) in [
        ("../outside.yaml", 400),
        ("/etc/passwd", 400),
        ("flows/none.yaml", 400),
    ] {
        let r = post(&at, "/v1/runs", &[RUNNER], &json!({"flow": flow, "input": {}}));
        assert_eq!(r.status, status, "{flow}: {}", r.body);
    }
    assert_eq!(get(&at, "/v1/runs/rnone/events", &[READER]).status, 404);
    stop(server);
}
