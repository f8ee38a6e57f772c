//! Files from and to `http` agents and attachments of `llm` agents (SPEC §6.5), through the
//! binary and a SQLite store, against one loopback server ([`Files`]) that serves files,
//! takes uploads and answers chat completions in the OpenAI-compatible vision format.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use base64::Engine as _;
use serde_json::{Value, json};
use sha2::Digest;

use crate::mock_server::{Llm, Reply};
use crate::support::{TempDir, run, switchyard};

const STORE: [&str; 2] = ["--store", "sqlite:runs.db"];

/// A PNG as servers send it: the signature, then an IHDR chunk (1×1, RGBA).
const PNG: &[u8] =
    b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89\0\0\0\0IEND\xaeB`\x82";
/// SVG, which its server labels `image/png`.
const SVG: &[u8] =
    b"<?xml version=\"1.0\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" onload=\"alert(1)\"/>";
const NOTES: &[u8] = b"total: 48.20 EUR\nthank you";
/// One byte over the default `max_file_bytes` (64 MiB).
const BIG: usize = (64 << 20) + 1;

/// One request the server got.
#[derive(Clone, Debug)]
struct Hit {
    path: String,
    content_type: Option<String>,
    body: Vec<u8>,
}

/// Routes: `/scan` (the PNG, named `invoice-7.png` by `Content-Disposition`), `/img/logo.png`
/// (the SVG labelled `image/png`, no `Content-Disposition`), `/notes` (text, named by an RFC
/// 5987 `filename*`), `/json` (a JSON body), `/big.bin` (one byte over 64 MiB), `/upload` (takes a body, answers its size),
/// `/v1/chat/completions` (answers `a cat`).
#[derive(Clone)]
struct Files {
    addr: SocketAddr,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Files {
    fn start() -> Files {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let hits = Arc::new(Mutex::new(Vec::new()));
                let app = axum::Router::new()
                    .route("/{*rest}", any(serve))
                    .with_state(hits.clone());
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
                let addr = listener.local_addr().expect("local addr");
                tx.send(Files { addr, hits }).expect("send");
                axum::serve(listener, app).await.expect("serve");
            });
        });
        rx.recv().expect("the server starts")
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn hits_on(&self, path: &str) -> Vec<Hit> {
        self.hits
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.path == path)
            .cloned()
            .collect()
    }
}

async fn serve(
    State(hits): State<Arc<Mutex<Vec<Hit>>>>,
    Path(rest): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/{rest}");
    hits.lock().unwrap().push(Hit {
        path: path.clone(),
        content_type: headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body: body.to_vec(),
    });
    match path.as_str() {
        "/scan" => (
            [
                (header::CONTENT_TYPE, "image/png"),
                (header::CONTENT_DISPOSITION, "attachment; filename=\"invoice-7.png\""),
            ],
            PNG,
        )
            .into_response(),
        "/img/logo.png" => ([(header::CONTENT_TYPE, "image/png")], SVG).into_response(),
        "/notes" => (
            [
                (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"notes.txt\"; filename*=UTF-8''notes%20%C3%A9.txt",
                ),
            ],
            NOTES,
        )
            .into_response(),
        "/json" => axum::Json(json!({"plain": "json"})).into_response(),
        "/big.bin" => (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            vec![7u8; BIG],
        )
            .into_response(),
        "/upload" => axum::Json(json!({"received": body.len()})).into_response(),
        "/v1/chat/completions" => axum::Json(json!({
            "id": "c1",
            "object": "chat.completion",
            "model": "vision-1",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "a cat"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
        }))
        .into_response(),
        _ => (StatusCode::NOT_FOUND, "no such route").into_response(),
    }
}

fn sha256(bytes: &[u8]) -> String {
    let hex: String = sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// Writes `flow` and runs it on the SQLite store: the output (or `null`), and the run as
/// `runs show --json` shows it.
fn run_flow(dir: &TempDir, flow: &str) -> (Value, Value) {
    dir.write("f.yaml", flow);
    let out = run(switchyard(dir.path())
        .args(["run", "f.yaml", "--input", "{}"])
        .args(STORE));
    let output = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
    let list = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(STORE));
    let first = list.stdout.lines().next().unwrap_or_default();
    let listed: Value = serde_json::from_str(first).unwrap_or_else(|e| panic!("{e}: {list:?}"));
    let id = listed["id"].as_str().expect("a run id").to_owned();
    let show = run(switchyard(dir.path())
        .args(["runs", "show", &id, "--json"])
        .args(STORE));
    let doc: Value = serde_json::from_str(&show.stdout).unwrap_or_else(|e| panic!("{e}: {show:?}"));
    (output, doc["run"].clone())
}

fn provider(files: &Files) -> String {
    format!("providers:\n  vision:\n    base_url: {}\n", files.url("/v1"))
}

#[test]
fn a_body_that_is_not_json_becomes_a_file_and_a_file_is_sent_back_as_a_body() {
    let files = Files::start();
    let dir = TempDir::new("files-http");
    let flow = format!(
        "flow: fetch\nagents:\n  get:\n    kind: http\n    method: GET\n    url: {}\n  put:\n    kind: http\n    url: {}\n    body: =input.scan\nstart: fetch\nsteps:\n  fetch:\n    agent: get\n    output: {{$.scan: $}}\n    next: upload\n  upload:\n    agent: put\n    input: {{$.scan: $.scan}}\n    output: {{$.uploaded: $}}\n",
        files.url("/scan"),
        files.url("/upload"),
    );
    let (output, run) = run_flow(&dir, &flow);
    let scan = json!({
        "file": sha256(PNG),
        "name": "invoice-7.png",
        "media_type": "image/png",
        "size": PNG.len(),
    });
    assert_eq!(
        output,
        json!({"scan": scan, "uploaded": {"received": PNG.len()}}),
        "{run}"
    );
    // The upload is the stored bytes, of the file's media type.
    let uploads = files.hits_on("/upload");
    assert_eq!(uploads.len(), 1);
    assert_eq!(uploads[0].body, PNG);
    assert_eq!(uploads[0].content_type.as_deref(), Some("image/png"));
    // The run lists the file, made by step 1.
    let mut listed = scan.clone();
    listed["number"] = json!("1");
    assert_eq!(run["files"], json!([listed]));
}

#[test]
fn media_types_are_judged_by_the_bytes_and_names_come_from_the_url_or_rfc_5987() {
    let files = Files::start();
    let dir = TempDir::new("files-http-types");
    let flow = format!(
        "flow: fetch\nagents:\n  logo:\n    kind: http\n    method: GET\n    url: {}\n  notes:\n    kind: http\n    method: GET\n    url: {}\n  data:\n    kind: http\n    method: GET\n    url: {}\nstart: logo\nsteps:\n  logo:\n    agent: logo\n    output: {{$.logo: $}}\n    next: notes\n  notes:\n    agent: notes\n    output: {{$.notes: $}}\n    next: data\n  data:\n    agent: data\n    output: {{$.data: $}}\n",
        files.url("/img/logo.png"),
        files.url("/notes"),
        files.url("/json"),
    );
    let (output, run) = run_flow(&dir, &flow);
    assert_eq!(
        output,
        json!({
            "logo": {"file": sha256(SVG), "name": "logo.png", "media_type": "image/svg+xml", "size": SVG.len()},
            "notes": {"file": sha256(NOTES), "name": "notes é.txt", "media_type": "text/plain", "size": NOTES.len()},
            "data": {"plain": "json"},
        }),
        "{run}"
    );
    let names: Vec<&str> = run["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["logo.png", "notes é.txt"]);
}

/// A flow that fetches the PNG and the notes, then asks `describe` about them with
/// `attach:` (extra agent lines in `extra`).
fn describe_flow(files: &Files, attach: &str, extra: &str) -> String {
    format!(
        "flow: describe\n{}agents:\n  get_scan:\n    kind: http\n    method: GET\n    url: {}\n  get_notes:\n    kind: http\n    method: GET\n    url: {}\n  describe:\n    kind: llm\n    provider: vision\n    model: vision-1\n    prompt: Describe the invoice.\n    attach: {attach}\n{extra}start: scan\nsteps:\n  scan:\n    agent: get_scan\n    output: {{$.scan: $}}\n    next: notes\n  notes:\n    agent: get_notes\n    output: {{$.notes: $}}\n    next: describe\n  describe:\n    agent: describe\n    input: {{$.scan: $.scan, $.notes: $.notes}}\n    output: {{$.description: $}}\n",
        provider(files),
        files.url("/scan"),
        files.url("/notes"),
    )
}

#[test]
fn attachments_are_image_and_text_parts_of_the_user_message() {
    let files = Files::start();
    let dir = TempDir::new("files-llm-attach");
    let (output, run) = run_flow(
        &dir,
        &describe_flow(&files, "[=input.scan, =input.notes, null]", ""),
    );
    assert_eq!(output["description"], json!({"text": "a cat"}), "{run}");
    let asked = files.hits_on("/v1/chat/completions");
    assert_eq!(asked.len(), 1);
    let request: Value = serde_json::from_slice(&asked[0].body).unwrap();
    let messages = request["messages"].as_array().unwrap();
    let content = &messages.last().unwrap()["content"];
    let url = content[1]["image_url"]["url"].as_str().unwrap();
    let data = url
        .strip_prefix("data:image/png;base64,")
        .unwrap_or_else(|| panic!("a PNG data URL: {url}"));
    assert_eq!(
        base64::engine::general_purpose::STANDARD.decode(data).unwrap(),
        PNG
    );
    assert_eq!(
        content,
        &json!([
            {"type": "text", "text": "Describe the invoice."},
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": format!("File `notes é.txt` (text/plain):\n{}", std::str::from_utf8(NOTES).unwrap())},
        ])
    );
}

#[test]
fn attachments_over_max_attach_bytes_fail_with_kind_limit_before_any_request() {
    let files = Files::start();
    let dir = TempDir::new("files-llm-limit");
    let max = PNG.len() + NOTES.len() - 1;
    let (_, run) = run_flow(
        &dir,
        &describe_flow(
            &files,
            "[=input.scan, =input.notes]",
            &format!("    max_attach_bytes: {max}\n"),
        ),
    );
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["kind"], "limit");
    assert_eq!(
        run["error"]["message"],
        format!(
            "step `describe`: agent `describe`: the attachments are {} bytes, over the limit max_attach_bytes ({max} bytes)",
            PNG.len() + NOTES.len()
        )
    );
    assert!(files.hits_on("/v1/chat/completions").is_empty());
}

#[test]
fn a_file_a_model_cannot_read_fails_with_kind_agent_before_any_request() {
    let files = Files::start();
    let dir = TempDir::new("files-llm-svg");
    let flow = format!(
        "flow: describe\n{}agents:\n  get:\n    kind: http\n    method: GET\n    url: {}\n  describe:\n    kind: llm\n    provider: vision\n    model: vision-1\n    attach: =input.logo\nstart: logo\nsteps:\n  logo:\n    agent: get\n    output: {{$.logo: $}}\n    next: describe\n  describe:\n    agent: describe\n    input: {{$.logo: $.logo}}\n    retry: {{attempts: 3, backoff: 10ms}}\n",
        provider(&files),
        files.url("/img/logo.png"),
    );
    let (_, run) = run_flow(&dir, &flow);
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["kind"], "agent");
    assert_eq!(
        run["error"]["message"],
        "step `describe`: agent `describe`: cannot attach file `logo.png` of type `image/svg+xml`: a model is sent raster images (png, jpeg, gif, webp, bmp) and text files only"
    );
    assert!(files.hits_on("/v1/chat/completions").is_empty());
}

/// An agent loop sends its attachments in its first user message, every turn (the
/// conversation so far), and its recorded transcript keeps no image data.
#[test]
fn an_agent_loop_sends_its_attachments_in_its_first_message() {
    let files = Files::start();
    let model = Llm::start();
    model.script([
        Reply::calls(1, &[("greet", "{}")]),
        Reply::Answer("a cat, greeted".into()),
    ]);
    let dir = TempDir::new("files-llm-loop");
    let flow = format!(
        "flow: describe\nproviders:\n  local:\n    base_url: {}\nagents:\n  get:\n    kind: http\n    method: GET\n    url: {}\n  helper:\n    kind: llm\n    provider: local\n    model: m1\n    prompt: Describe it.\n    tools: [greet]\n    attach: =input.scan\n  greet:\n    kind: mock\n    description: Says hello.\n    returns: hello\nstart: scan\nsteps:\n  scan:\n    agent: get\n    output: {{$.scan: $}}\n    next: answer\n  answer:\n    agent: helper\n    input: {{$.scan: $.scan}}\n    output: {{$.reply: $}}\n",
        model.base_url(),
        files.url("/scan"),
    );
    let (output, record) = run_flow(&dir, &flow);
    assert_eq!(output["reply"], json!({"text": "a cat, greeted"}), "{record}");
    let data = base64::engine::general_purpose::STANDARD.encode(PNG);
    let hits = model.hits();
    assert_eq!(hits.len(), 2);
    for hit in &hits {
        let first_user = hit.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "user")
            .expect("a user message");
        assert_eq!(
            first_user["content"],
            json!([
                {"type": "text", "text": "Describe it."},
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{data}")}},
            ])
        );
    }
    let show = run(switchyard(dir.path())
        .args([
            "runs",
            "show",
            record["id"].as_str().unwrap(),
            "--json",
            "--transcript",
        ])
        .args(STORE));
    assert_eq!(show.code(), 0, "{show:?}");
    assert!(
        show.stdout.contains("data:image/png;base64,… ("),
        "{}",
        show.stdout
    );
    assert!(!show.stdout.contains(&data), "the record keeps no image data");
}

/// A body over `max_file_bytes` fails the step with kind `limit` while it streams; nothing is
/// listed.
#[test]
fn a_body_over_max_file_bytes_fails_with_kind_limit() {
    let files = Files::start();
    let dir = TempDir::new("files-http-big");
    let url = files.url("/big.bin");
    let flow = format!(
        "flow: fetch\nagents:\n  get:\n    kind: http\n    method: GET\n    url: {url}\nsteps:\n  fetch:\n    agent: get\n    output: {{$.big: $}}\n"
    );
    let (_, record) = run_flow(&dir, &flow);
    assert_eq!(record["status"], "failed", "{record}");
    assert_eq!(record["error"]["kind"], "limit");
    assert_eq!(
        record["error"]["message"],
        format!(
            "step `fetch`: agent `get`: GET {url}: file `big.bin` is over the limit limits.max_file_bytes (67108864 bytes)"
        )
    );
    assert_eq!(record.get("files"), None);
}
