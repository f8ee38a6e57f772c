//! Files made where the tree of a run is deep (SPEC §6.4, §6.5, §11), through the real
//! `switchyard` binary: an MCP tool's image, audio and resource blocks stored as files (a
//! plain step, and a tool call of an agent loop), mock agents that make files, and every
//! run's `files` gathered from its steps, iterations, branches, tool calls and child runs —
//! once each after a kill -9 and `resume`, and after a worker of a submitted batch on
//! PostgreSQL dies and another takes over. Flow tests with mocked files.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::Digest as _;

use crate::cluster::{Pg, spawn_worker, submit, wait_exit, wait_for};
use crate::mock_server::{Llm, Reply};
use crate::support::{TempDir, lint_json, mcp_fixture, run, switchyard};

const STORE: [&str; 2] = ["--store", "sqlite:runs.db"];

/// The fixture server's bytes: its 1×1 PNG, its WAV header and its PDF.
const PNG_SHA: &str = "sha256:6b7fa434f92a8b80aab02d9bf1a12e49ffcae424e4013a1c4f68b67e3d2bbcd0";
const WAV: &[u8] = b"RIFF\x04\x00\x00\x00WAVE";
const PDF: &[u8] = b"%PDF-1.4 fixture\n";

fn sha(bytes: &[u8]) -> String {
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

fn file(bytes: &[u8], name: &str, media_type: &str) -> Value {
    json!({"file": sha(bytes), "name": name, "media_type": media_type, "size": bytes.len()})
}

/// `runs show RUN --json` on the store of `dir` (or `store`).
fn show(dir: &TempDir, id: &str, store: &[&str]) -> Value {
    let out = run(switchyard(dir.path())
        .args(["runs", "show", id, "--json"])
        .args(store));
    assert_eq!(out.code(), 0, "{out:?}");
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

/// A run's files as `(number, name)`, in the order its record lists them.
fn numbered(run: &Value) -> Vec<(String, String)> {
    run["files"]
        .as_array()
        .unwrap_or_else(|| panic!("no files in {run}"))
        .iter()
        .map(|f| {
            (
                f["number"].as_str().unwrap().to_owned(),
                f["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// The id of the only (or latest) root run of the store in `dir`.
fn only_run(dir: &TempDir) -> String {
    let list = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(STORE));
    let first = list
        .stdout
        .lines()
        .next()
        .unwrap_or_else(|| panic!("no run: {list:?}"));
    serde_json::from_str::<Value>(first).expect("a JSON line")["id"]
        .as_str()
        .expect("an id")
        .to_owned()
}

fn fixture_server() -> String {
    format!(
        "mcp_servers:\n  fx:\n    command: [\"{}\"]\n    tools: [image, audio, resource]\n",
        mcp_fixture().display()
    )
}

/// A plain `mcp` step's image, audio and blob resource become files: references in its
/// result's `content` (text and a text resource stay as they were), the bytes in the store by
/// their hash, the files on the step's record and the run's.
#[test]
fn mcp_image_audio_and_resource_blocks_become_files() {
    let dir = TempDir::new("files-mcp");
    dir.write(
        "flow.yaml",
        format!(
            "flow: mcp-files\n{}agents:\n  image: {{kind: mcp, server: fx, tool: image}}\n  audio: {{kind: mcp, server: fx, tool: audio}}\n  resource: {{kind: mcp, server: fx, tool: resource}}\nsteps:\n  a: {{agent: image, input: {{}}, output: {{$.image: $}}, next: b}}\n  b: {{agent: audio, input: {{}}, output: {{$.audio: $}}, next: c}}\n  c: {{agent: resource, input: {{}}, output: {{$.resource: $}}}}\n",
            fixture_server()
        ),
    );
    let out = run(switchyard(dir.path())
        .args(["run", "flow.yaml", "--input", "{}"])
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    let output: Value = serde_json::from_str(&out.stdout).expect("JSON output");
    let png = json!({"file": PNG_SHA, "name": "image-1.png", "media_type": "image/png", "size": 70});
    assert_eq!(
        output["image"],
        json!({"structured": null, "content": [{"type": "image", "file": png}], "is_error": false})
    );
    let wav = file(WAV, "audio-1.wav", "audio/wav");
    assert_eq!(
        output["audio"]["content"],
        json!(["a beep", {"type": "audio", "file": wav}])
    );
    let pdf = file(PDF, "report.pdf", "application/pdf");
    assert_eq!(
        output["resource"]["content"],
        json!([
            {"type": "resource", "uri": "file:///fixture/report.pdf", "file": pdf},
            {"type": "resource", "resource": {"uri": "file:///fixture/notes.txt", "mimeType": "text/plain", "text": "some notes"}},
        ])
    );
    let id = only_run(&dir);
    let shown = show(&dir, &id, &STORE);
    let mut with_numbers = Vec::new();
    for (n, f) in [("1", &png), ("2", &wav), ("3", &pdf)] {
        let mut f = f.clone();
        f["number"] = json!(n);
        with_numbers.push(f);
    }
    let listed: Vec<Value> = shown["run"]["files"].as_array().expect("files").clone();
    assert_eq!(listed.len(), 3, "{listed:?}");
    for (got, want) in listed.iter().zip(&with_numbers) {
        for k in ["number", "file", "name", "media_type", "size"] {
            assert_eq!(got[k], want[k], "{k} of {got}");
        }
    }
    let step_a = shown["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["number"] == "1")
        .expect("step 1");
    assert_eq!(step_a["files"][0]["file"], PNG_SHA, "{step_a}");
}

/// An agent loop's call of an MCP tool that returns an image: the file is on the tool call's
/// record (`1.t1.1`) and in the run's files under that number, and the model is told
/// `[file NAME (MEDIA_TYPE, SIZE bytes)]`.
#[test]
fn an_agent_loop_records_an_mcp_tools_file_on_its_tool_call() {
    let llm = Llm::start();
    llm.script([
        Reply::calls(1, &[("fx__image", "{}")]),
        Reply::Answer("a red pixel".into()),
    ]);
    let dir = TempDir::new("files-mcp-loop");
    dir.write(
        "flow.yaml",
        format!(
            "flow: mcp-loop-files\nproviders:\n  local:\n    base_url: {}\n{}agents:\n  looker:\n    kind: llm\n    provider: local\n    model: m1\n    prompt: Look.\n    tools: [fx.image]\nsteps:\n  answer: {{agent: looker, input: {{}}, output: {{$.reply: $}}}}\n",
            llm.base_url(),
            fixture_server()
        ),
    );
    let out = run(switchyard(dir.path())
        .args(["run", "flow.yaml", "--input", "{}"])
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    let hits = llm.hits();
    assert_eq!(hits.len(), 2);
    assert_eq!(
        crate::agent_loop::tool_messages(&hits[1].body),
        [(
            "call_1_1".to_owned(),
            "[file image-1.png (image/png, 70 bytes)]".to_owned()
        )]
    );
    let id = only_run(&dir);
    let shown = show(&dir, &id, &STORE);
    let call = shown["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["number"] == "1.t1.1")
        .unwrap_or_else(|| panic!("no record 1.t1.1: {shown}"));
    assert_eq!(call["kind"], "tool");
    assert_eq!(call["files"][0]["file"], PNG_SHA, "{call}");
    assert_eq!(call["result"]["content"][0]["file"]["name"], "image-1.png");
    assert_eq!(numbered(&shown["run"]), owned(&[("1.t1.1", "image-1.png")]));
}

/// `child.yaml`: one mock step that makes `report-<n>.txt` holding `report <n>`, after
/// `latency`; its result is the reference.
fn child_flow(latency: &str) -> String {
    format!(
        "flow: child\nagents:\n  maker:\n    kind: mock\n    latency: {latency}\n    returns: {{file: {{text: \"='report ' + string(input.n)\", name: \"='report-' + string(input.n) + '.txt'\"}}}}\nsteps:\n  make:\n    agent: maker\n    idempotent: true\n    output: {{$.made: $}}\noutput: {{select: $.made}}\n"
    )
}

fn report(n: u64) -> Value {
    file(
        format!("report {n}").as_bytes(),
        &format!("report-{n}.txt"),
        "text/plain",
    )
}

/// A step, a `foreach` over three child runs and a `parallel` step whose branches call the
/// child: the root run lists every file once, in record order (iterations by index, branches
/// by name), each with the number of the record that made it; a child run lists its own.
#[test]
fn a_runs_files_gather_its_steps_iterations_branches_and_child_runs() {
    let dir = TempDir::new("files-tree");
    dir.write("child.yaml", child_flow("1ms"));
    dir.write("fixtures/p.bin", b"\x89binary");
    dir.write(
        "parent.yaml",
        "flow: parent\nagents:\n  child: {kind: flow, path: child.yaml}\n  pic:\n    kind: mock\n    returns: {file: {path: fixtures/p.bin, name: pic.bin}}\nsteps:\n  first: {agent: pic, output: {$.pic: $}, next: each}\n  each:\n    foreach: $.items\n    concurrency: 3\n    agent: child\n    output: {$.reports: $}\n    next: both\n  both:\n    parallel:\n      b: {agent: child, input: {$.n: {value: 20}}, output: {$.b: $}}\n      a: {agent: child, input: {$.n: {value: 10}}, output: {$.a: $}}\n",
    );
    let out = run(switchyard(dir.path())
        .args([
            "run",
            "parent.yaml",
            "--input",
            r#"{"items": [{"n": 3}, {"n": 1}, {"n": 2}]}"#,
        ])
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    let output: Value = serde_json::from_str(&out.stdout).expect("JSON output");
    assert_eq!(
        output["pic"],
        file(b"\x89binary", "pic.bin", "application/octet-stream")
    );
    assert_eq!(output["reports"], json!([report(3), report(1), report(2)]));
    assert_eq!((&output["a"], &output["b"]), (&report(10), &report(20)));
    let id = only_run(&dir);
    let shown = show(&dir, &id, &STORE);
    assert_eq!(
        numbered(&shown["run"]),
        owned(&[
            ("1", "pic.bin"),
            ("2[0].1", "report-3.txt"),
            ("2[1].1", "report-1.txt"),
            ("2[2].1", "report-2.txt"),
            ("3.a.1", "report-10.txt"),
            ("3.b.1", "report-20.txt"),
        ])
    );
    let hashes: Vec<&Value> = shown["run"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| &f["file"])
        .collect();
    assert_eq!(hashes[1], &report(3)["file"]);
    assert_eq!(hashes[4], &report(10)["file"]);
    // A child run lists its own file, numbered in the tree as its records are.
    let child = shown["children"]
        .as_array()
        .expect("children")
        .iter()
        .find(|c| c["output"] == report(1))
        .unwrap_or_else(|| panic!("no child made report-1: {shown}"));
    assert_eq!(child["parent_step"], "2[1]");
    assert_eq!(numbered(child), owned(&[("2[1].1", "report-1.txt")]));
}

/// A `foreach` of six child runs, one at a time, killed with SIGKILL after two of them
/// finished: `resume` runs the rest and the root run lists each of the six files once.
#[test]
fn a_foreach_of_child_runs_killed_and_resumed_lists_each_file_once() {
    let dir = TempDir::new("files-kill");
    dir.write("child.yaml", child_flow("400ms"));
    dir.write(
        "parent.yaml",
        "flow: parent\nagents:\n  child: {kind: flow, path: child.yaml}\nsteps:\n  each:\n    foreach: $.items\n    concurrency: 1\n    agent: child\n    output: {$.reports: $}\n",
    );
    let input = json!({"items": (1..=6).map(|n| json!({"n": n})).collect::<Vec<_>>()}).to_string();
    let mut child = switchyard(dir.path())
        .args(["run", "parent.yaml", "--input", &input])
        .args(STORE)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run starts");
    // Two iterations are recorded (each with its file) before the kill.
    let t0 = Instant::now();
    let id = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no two iterations recorded"
        );
        std::thread::sleep(Duration::from_millis(50));
        let list = run(switchyard(dir.path())
            .args(["runs", "list", "--json"])
            .args(STORE));
        let Some(line) = list.stdout.lines().next() else {
            continue;
        };
        let Ok(first) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let id = first["id"].as_str().unwrap().to_owned();
        let shown = show(&dir, &id, &STORE);
        let done = shown["steps"].as_array().map_or(0, |s| {
            s.iter()
                .filter(|s| s["files"].as_array().is_some_and(|f| !f.is_empty()))
                .count()
        });
        if done >= 2 {
            break id;
        }
    };
    child.kill().expect("kill -9");
    child.wait().expect("reaped");
    let before = show(&dir, &id, &STORE);
    assert_eq!(before["run"]["status"], "running", "killed mid-run");
    let out = run(switchyard(dir.path()).args(["resume", &id]).args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    let shown = show(&dir, &id, &STORE);
    assert_eq!(shown["run"]["status"], "succeeded");
    let want: Vec<(String, String)> = (1..=6)
        .map(|n| (format!("1[{}].1", n - 1), format!("report-{n}.txt")))
        .collect();
    assert_eq!(numbered(&shown["run"]), want);
    assert_eq!(
        shown["run"]["output"]["reports"],
        json!((1..=6).map(report).collect::<Vec<_>>())
    );
}

/// A submitted batch on PostgreSQL whose worker is killed (SIGKILL) mid-way: another worker
/// takes its runs over, and every run lists each of its files exactly once.
#[test]
fn a_batch_taken_over_from_a_killed_worker_lists_each_runs_files_once() {
    const N: usize = 4;
    let pg = Pg::new("files");
    let dir = TempDir::new("files-cluster");
    dir.write("child.yaml", child_flow("300ms"));
    let flow = dir.write(
        "parent.yaml",
        "flow: parent\nagents:\n  child: {kind: flow, path: child.yaml}\nsteps:\n  each:\n    foreach: $.items\n    concurrency: 1\n    agent: child\n    output: {$.reports: $}\n",
    );
    let mut lines = String::new();
    for i in 0..N {
        let items: Vec<Value> = (0..3).map(|k| json!({"n": i * 10 + k})).collect();
        lines.push_str(&json!({"id": format!("item-{i}"), "items": items}).to_string());
        lines.push('\n');
    }
    dir.write("in.jsonl", lines);
    let out = submit(&dir, &flow, &pg.url("sy_files_submit"), "files", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let lease = ["--concurrency", "4", "--lease", "2s", "--heartbeat", "400ms"];
    let mut w1 = spawn_worker(&dir, &pg.url("sy_files_w1"), "w1", &lease);
    // Killed once some iterations are recorded and no run has finished.
    wait_for(Duration::from_secs(60), "iterations recorded", || {
        pg.count("SELECT COUNT(*) FROM steps WHERE number LIKE '1[%' AND status = 'succeeded'") >= 2
    });
    w1.kill().expect("kill -9");
    w1.wait().expect("reaped");
    let finished =
        |pg: &Pg| pg.count("SELECT COUNT(*) FROM runs WHERE parent_run IS NULL AND status = 'succeeded'");
    assert!(
        finished(&pg) < N as i64,
        "the kill came too late to test a takeover"
    );
    let mut w2 = spawn_worker(&dir, &pg.url("sy_files_w2"), "w2", &lease);
    wait_for(Duration::from_secs(120), "the batch to finish", || {
        finished(&pg) == N as i64
    });
    crate::cluster::signal(&w2, "TERM");
    let s2 = wait_exit(&mut w2, Duration::from_secs(30), "worker 2");
    assert!(s2.success(), "worker 2: {}", crate::cluster::log_of(&dir, "w2"));
    let store = ["--store".to_owned(), pg.url("sy_files_show")];
    let store: Vec<&str> = store.iter().map(String::as_str).collect();
    let ids = pg.query("SELECT id, item_id FROM runs WHERE parent_run IS NULL ORDER BY item_index");
    assert_eq!(ids.len(), N, "one run per item: {ids:?}");
    for row in ids {
        let id = row["id"].clone().expect("id");
        let i: usize = row["item_id"].as_deref().unwrap()["item-".len()..]
            .parse()
            .unwrap();
        let shown = show(&dir, &id, &store);
        assert_eq!(shown["run"]["status"], "succeeded");
        let want: Vec<(String, String)> = (0..3)
            .map(|k| (format!("1[{k}].1"), format!("report-{}.txt", i * 10 + k)))
            .collect();
        assert_eq!(numbered(&shown["run"]), want, "run {id}");
    }
}

/// A flow test whose mock makes a file (`text`, and `path` relative to the flow file) passes
/// when `expect.output` names what the reference holds (a subset match on `name`,
/// `media_type`, `size`) and fails, saying where, when it does not.
#[test]
fn a_flow_test_mocks_files_and_expects_their_names() {
    let dir = TempDir::new("files-flow-test");
    dir.write("fixtures/scan.png", b"\x89PNG\r\n\x1a\n0000");
    dir.write(
        "flow.yaml",
        "flow: scanner\nagents:\n  scanner: {kind: http, url: \"http://127.0.0.1:9/scan\"}\nsteps:\n  scan: {agent: scanner, output: {$.scan: $}}\ntests:\n  - name: the scan is a file\n    mocks:\n      scanner: {sequence: [{doc: {file: {text: \"hi\", name: a.txt}}, image: {file: {path: fixtures/scan.png}}}]}\n    expect:\n      output: {scan: {doc: {name: a.txt, media_type: text/plain, size: 2}, image: {name: scan.png, media_type: image/png, size: 12}}}\n  - name: a wrong name fails\n    mocks:\n      scanner: {returns: {doc: {file: {text: \"hi\", name: b.txt}}}}\n    expect:\n      output: {scan: {doc: {name: a.txt}}}\n",
    );
    let out = run(switchyard(dir.path()).args(["test", "flow.yaml"]));
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(
        out.stdout.contains("ok     flow.yaml :: the scan is a file"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("FAILED flow.yaml :: a wrong name fails"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("output: `$.scan.doc.name` is \"b.txt\", expected \"a.txt\""),
        "{}",
        out.stdout
    );
}

/// Mock files are checked before anything runs: a missing `path` (SY210, at the path), a mock
/// file with neither `text` nor `path` or `text` without `name` (SY105), an unknown key (SY103).
#[test]
fn lint_checks_mock_files() {
    let dir = TempDir::new("files-lint");
    dir.write(
        "flow.yaml",
        "flow: mocks\nagents:\n  a:\n    kind: mock\n    returns: {file: {path: fixtures/none.png}}\n  b:\n    kind: mock\n    sequence: [{x: {file: {name: a.txt}}}, {file: {text: hi}}]\n  c:\n    kind: mock\n    returns: {file: {text: hi, name: a.txt, size: 2}}\nsteps:\n  one: {agent: a, output: {$.a: $}, next: two}\n  two: {agent: b, output: {$.b: $}, next: three}\n  three: {agent: c, output: {$.c: $}}\noutput: {select: $}\n",
    );
    let out = lint_json(dir.path(), &["flow.yaml"]);
    assert_eq!(out.code(), 1, "{out:?}");
    let got: Vec<(String, usize, usize, String)> = out
        .diagnostics()
        .into_iter()
        .map(|d| (d.code, d.line, d.column, d.message))
        .collect();
    assert_eq!(
        got,
        [
            (
                "SY210".to_owned(),
                5,
                28,
                "cannot read `fixtures/none.png`: no such file".to_owned()
            ),
            (
                "SY105".to_owned(),
                8,
                27,
                "a mock file needs `text` or `path`".to_owned()
            ),
            (
                "SY105".to_owned(),
                8,
                51,
                "a mock file with `text` needs a `name`".to_owned()
            ),
            (
                "SY103".to_owned(),
                11,
                45,
                "unknown key `size` in a mock file".to_owned()
            ),
        ]
    );
}

/// `submit` ships a mock's fixture files with the flow: a worker in another directory, without
/// them, still makes the mocked files, and `collect --files` writes their bytes.
#[test]
fn a_submitted_batch_ships_its_mocks_fixture_files() {
    let pg = Pg::new("mockship");
    let url = pg.url("sy_mockship");
    let dir = TempDir::new("files-mock-ship");
    dir.write(
        "flow.yaml",
        "flow: shipped\nagents:\n  scan:\n    kind: mock\n    returns: {scan: {file: {path: fixtures/scan.bin, media_type: application/x-test}}}\nsteps:\n  s: {agent: scan, output: {$.scan: $.scan}}\n",
    );
    dir.write("fixtures/scan.bin", b"fixture bytes\x00\x01");
    dir.write("in.jsonl", "{\"id\": \"a\"}\n{\"id\": \"b\"}\n");
    let out = run(switchyard(dir.path()).args([
        "submit",
        "flow.yaml",
        "--input",
        "in.jsonl",
        "--batch",
        "ms",
        "--store",
        &url,
    ]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let elsewhere = TempDir::new("files-mock-ship-worker");
    let mut w = spawn_worker(&elsewhere, &url, "w", &["--exit-when-idle"]);
    assert!(wait_exit(&mut w, Duration::from_secs(120), "the worker").success());
    let collect = run(switchyard(dir.path()).args([
        "collect",
        "--batch",
        "ms",
        "--output",
        "out.jsonl",
        "--files",
        "got",
        "--store",
        &url,
    ]));
    assert_eq!(collect.code(), 0, "{}", collect.stderr);
    for id in ["a", "b"] {
        let bytes = std::fs::read(dir.path().join("got").join(id).join("scan.bin")).expect("written");
        assert_eq!(bytes, b"fixture bytes\x00\x01");
    }
    let lines = std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap();
    let first: Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert_eq!(first["output"]["scan"]["file"], sha(b"fixture bytes\x00\x01"));
    assert_eq!(first["output"]["scan"]["media_type"], "application/x-test");
}
