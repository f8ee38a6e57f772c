//! MCP servers people really run (SPEC §6.4), through the binary: the reference "everything"
//! server (npm) and `mcp-server-time` (PyPI) over stdio, installed pinned under
//! `target/test-tools` by `.ci/run`; and batches of thousands of calls through one server of
//! the project's own fixture (`examples/mcp_fixture.rs`), whose processes are counted by the
//! pids it writes to `MCP_FIXTURE_PIDS`.
//!
//! A missing server fails the test with the command that installs it: these tests never skip.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{
    Output, TempDir, fixture_pids, interrupt, mcp_fixture, process_alive, run_with_limit, switchyard,
};

/// The folder of the flows below.
fn real_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp/real")
}

fn test_tools() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tools")
}

/// The everything server's bin, or a failure naming the install command.
fn require_everything() {
    let bin = test_tools().join("node_modules/.bin/mcp-server-everything");
    assert!(
        bin.exists(),
        "`{}` is missing: install the reference MCP server with \
         `npm install --prefix target/test-tools @modelcontextprotocol/server-everything@2026.8.31` \
         (.ci/run does)",
        bin.display()
    );
}

/// The time server's bin, or a failure naming the install command.
fn require_time() {
    let bin = test_tools().join("py/bin/mcp-server-time");
    assert!(
        bin.exists(),
        "`{}` is missing: install it with `python3 -m venv target/test-tools/py && \
         target/test-tools/py/bin/pip install mcp-server-time==2026.10.19` (.ci/run does)",
        bin.display()
    );
}

/// Node and Python start slowly on a loaded machine: a real server's run gets longer than
/// [`crate::support::HANG`].
const SLOW: Duration = Duration::from_secs(60);

/// `switchyard ARGS...` in the flows' folder.
fn sy(args: &[&str]) -> Output {
    run_with_limit(switchyard(&real_dir()).args(args), SLOW)
}

/// `switchyard run FLOW --input INPUT` that must succeed: its output.
fn run_ok(flow: &str, input: &Value) -> Value {
    let out = sy(&["run", flow, "--input", &input.to_string()]);
    assert_eq!(out.code(), 0, "`run {flow}` with {input} failed: {out:?}");
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout of `run {flow}` is not JSON ({e}): {out:?}"))
}

// ---------------------------------------------------------------- the everything server

#[test]
fn a_text_tool_of_the_everything_server_answers_with_its_text_block() {
    require_everything();
    let out = run_ok("everything_echo.yaml", &json!({"message": "hello, MCP"}));
    let said = &out["said"];
    assert_eq!(said["is_error"], false, "{out}");
    // Text blocks are kept as text.
    assert_eq!(said["content"], json!(["Echo: hello, MCP"]), "{out}");
    // A text that is not JSON gives no structured value.
    assert!(said["structured"].is_null(), "{out}");
}

#[test]
fn structured_content_of_the_everything_server_is_the_structured_result() {
    require_everything();
    let out = run_ok("everything_structured.yaml", &json!({"city": "Chicago"}));
    assert_eq!(
        out["weather"],
        json!({"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82}),
        "{out}"
    );
}

#[test]
fn an_image_of_the_everything_server_becomes_a_file_in_content() {
    require_everything();
    let out = run_ok("everything_image.yaml", &json!({}));
    let content = out["picture"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no content blocks: {out}"));
    let image = content
        .iter()
        .find(|b| b["type"] == "image")
        .unwrap_or_else(|| panic!("no image block: {out}"));
    // The block became a file (SPEC §6.5): a reference, the bytes in the store. An image's
    // media type is sniffed from its bytes: `image/png` says they are a PNG.
    let file = &image["file"];
    assert_eq!(file["name"], "get-tiny-image-1.png", "{image}");
    assert_eq!(file["media_type"], "image/png", "{image}");
    assert!(
        file["file"]
            .as_str()
            .is_some_and(|h| h.starts_with("sha256:") && h.len() == 71),
        "{image}"
    );
    assert!(file["size"].as_u64().is_some_and(|n| n > 8), "{image}");
    assert!(
        image.get("data").is_none(),
        "no base64 left in the result: {image}"
    );
    // The text blocks around it are kept, as text, in the server's order.
    assert_eq!(content.len(), 3, "{out}");
    assert_eq!(content[0], "Here's the image you requested:", "{out}");
    assert_eq!(content[1]["type"], "image", "{out}");
    assert_eq!(content[2], "The image above is the MCP logo.", "{out}");
}

#[test]
fn progress_of_a_long_running_tool_extends_its_timeout() {
    require_everything();
    // Four seconds of work, with progress every half second: each notification extends the
    // server's two-second timeout.
    let started = Instant::now();
    let out = run_ok("everything_progress.yaml", &json!({"duration": 4, "steps": 8}));
    assert!(started.elapsed() >= Duration::from_secs(4), "{out}");
    assert_eq!(
        out["done"]["content"][0], "Long running operation completed. Duration: 4 seconds, Steps: 8.",
        "{out}"
    );
    // Ten seconds with one notification only, at the end: the timeout holds.
    let started = Instant::now();
    let out = sy(&[
        "run",
        "everything_progress.yaml",
        "--input",
        r#"{"duration": 10, "steps": 1}"#,
    ]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(
        out.stderr.contains("error[timeout]"),
        "a call without progress for 2 s times out: {}",
        out.stderr
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "timed out after {:?}, not at two seconds",
        started.elapsed()
    );
}

/// The everything server over Streamable HTTP on a free loopback port, killed when dropped.
struct EverythingHttp {
    child: Child,
    url: String,
}

impl EverythingHttp {
    fn start() -> Self {
        require_everything();
        // A port nobody holds now; the server binds it a moment later.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = std::process::Command::new(test_tools().join("node_modules/.bin/mcp-server-everything"))
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the everything server starts");
        let server = EverythingHttp {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        };
        let deadline = Instant::now() + SLOW;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the everything server never listened on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }
}

impl Drop for EverythingHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_everything_server_answers_over_streamable_http() {
    let server = EverythingHttp::start();
    let dir = TempDir::new("mcp-everything-http");
    dir.write(
        "http.yaml",
        format!(
            "flow: everything-http
mcp_servers:
  everything:
    url: {url}
    tools: [echo, get-structured-content]
agents:
  echo: {{kind: mcp, server: everything, tool: echo}}
  weather: {{kind: mcp, server: everything, tool: get-structured-content}}
steps:
  say:
    agent: echo
    input: {{$.message: $.message}}
    output: {{$.said: $.content}}
    next: forecast
  forecast:
    agent: weather
    input: {{$.location: {{value: New York}}}}
    output: {{$.weather: $.structured}}
",
            url = server.url
        ),
    );
    let out = run_with_limit(
        switchyard(dir.path()).args(["run", "http.yaml", "--input", r#"{"message": "over HTTP"}"#]),
        SLOW,
    );
    assert_eq!(out.code(), 0, "{out:?}");
    let out: Value = serde_json::from_str(&out.stdout).expect("the output is JSON");
    assert_eq!(out["said"], json!(["Echo: over HTTP"]), "{out}");
    assert_eq!(
        out["weather"],
        json!({"temperature": 33, "conditions": "Cloudy", "humidity": 82}),
        "{out}"
    );
    let listed = run_with_limit(switchyard(dir.path()).args(["mcp", "list", "http.yaml"]), SLOW);
    assert_eq!(listed.code(), 0, "{listed:?}");
    assert!(
        listed.stdout.starts_with("everything (2025-11-25): 14 tools\n"),
        "{}",
        listed.stdout
    );
}

// ---------------------------------------------------------------- the time server

#[test]
fn the_time_server_gives_the_current_time_in_utc_as_structured_json() {
    require_time();
    let before = std::time::SystemTime::now();
    let out = run_ok("time_now.yaml", &json!({"tz": "UTC"}));
    let now = &out["now"];
    assert_eq!(now["timezone"], "UTC", "{out}");
    assert_eq!(now["is_dst"], false, "{out}");
    let datetime = now["datetime"].as_str().unwrap_or_default();
    assert!(datetime.ends_with("+00:00"), "{out}");
    // The server's clock is this machine's: the time is the time of the run, to the second.
    let secs = unix_seconds(datetime).unwrap_or_else(|| panic!("not a datetime: {datetime}"));
    let at = before
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    assert!((secs - at).abs() <= 60, "{datetime} is not now ({at})");
}

/// Seconds since 1970 of `YYYY-MM-DDTHH:MM:SS+00:00`.
fn unix_seconds(text: &str) -> Option<i64> {
    let (date, time) = text.strip_suffix("+00:00")?.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':').map(|p| p.parse::<i64>().ok());
    let (h, min, s) = (t.next()??, t.next()??, t.next()??);
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + min * 60 + s)
}

#[test]
fn a_bad_time_zone_is_the_servers_error_and_fails_the_step_with_kind_agent() {
    require_time();
    let out = sy(&["run", "time_now.yaml", "--input", r#"{"tz": "Nowhere/Bad"}"#]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stderr.contains("error[agent]"), "{}", out.stderr);
    assert!(
        out.stderr.contains("Invalid timezone"),
        "the server's words: {}",
        out.stderr
    );
}

// ---------------------------------------------------------------- lint --mcp and mcp list

#[test]
fn lint_mcp_checks_the_tools_against_what_the_real_servers_list() {
    require_everything();
    require_time();
    for flow in ["everything_echo.yaml", "everything_image.yaml", "time_now.yaml"] {
        let out = sy(&["lint", flow, "--mcp"]);
        assert_eq!(out.code(), 0, "`lint {flow} --mcp`: {out:?}");
    }
    // A tool the server does not list: plain lint cannot know; `--mcp` asks the server, and
    // names both places that use it.
    let plain = sy(&["lint", "everything_unlisted.yaml"]);
    assert_eq!(plain.code(), 0, "{plain:?}");
    let out = sy(&["lint", "everything_unlisted.yaml", "--mcp", "--format", "json"]);
    assert_eq!(out.code(), 1, "{out:?}");
    let found: Vec<(String, usize, usize, String)> = out
        .diagnostics()
        .into_iter()
        .map(|d| (d.code, d.line, d.column, d.message))
        .collect();
    let unlisted = "MCP server `everything` lists no tool `no-such-tool`".to_string();
    assert_eq!(
        found,
        [
            ("SY514".to_string(), 6, 19, unlisted.clone()),
            ("SY514".to_string(), 11, 11, unlisted)
        ],
    );
    // What it lists is told, so that a typo is plain to see.
    let d = out.diagnostics();
    assert!(
        d[0].help.as_deref().unwrap_or_default().contains("`get-sum`"),
        "{d:?}"
    );
}

#[test]
fn mcp_list_prints_the_tools_of_the_real_servers_with_their_schemas() {
    require_everything();
    require_time();
    let out = sy(&["mcp", "list", "everything_echo.yaml"]);
    assert_eq!(out.code(), 0, "{out:?}");
    // 14: the server offers `trigger-elicitation-request` to clients that, like switchyard,
    // declare they answer questions (elicitation).
    assert!(
        out.stdout.starts_with("everything (2025-11-25): 14 tools\n"),
        "{}",
        out.stdout
    );
    // Every tool the server lists, those outside the allowlist marked.
    assert!(
        out.stdout.contains("\n  echo: Echoes back the input string\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("\n  get-env (not allowed): "),
        "{}",
        out.stdout
    );

    let listed = |flow: &str| -> Value {
        let out = sy(&["mcp", "list", flow, "--json"]);
        assert_eq!(out.code(), 0, "{out:?}");
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
    };
    let tool = |listed: &Value, server: &str, name: &str| -> Value {
        listed[server]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("no tools of `{server}`: {listed}"))
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no `{name}` in {listed}"))
            .clone()
    };
    let everything = listed("everything_structured.yaml");
    let weather = tool(&everything, "everything", "get-structured-content");
    assert_eq!(
        weather["input_schema"]["properties"]["location"]["enum"],
        json!(["New York", "Chicago", "Los Angeles"]),
        "{weather}"
    );
    assert_eq!(
        weather["output_schema"]["required"],
        json!(["temperature", "conditions", "humidity"]),
        "{weather}"
    );
    assert_eq!(weather["annotations"]["readOnlyHint"], true, "{weather}");
    // What the allowlist keeps out is said in JSON too.
    assert_eq!(weather["allowed"], true, "{weather}");
    assert_eq!(tool(&everything, "everything", "get-env")["allowed"], false);
    // The Python server speaks the stateless revision, the Node one 2025-11-25.
    let clock = listed("time_now.yaml");
    assert_eq!(clock["clock"]["protocol"], "2026-07-28", "{clock}");
    let now = tool(&clock, "clock", "get_current_time");
    assert_eq!(now["input_schema"]["required"], json!(["timezone"]), "{now}");
    assert_eq!(
        now["output_schema"]["required"],
        json!(["timezone", "datetime", "day_of_week", "is_dst"]),
        "{now}"
    );
    tool(&clock, "clock", "convert_time");
}

// ---------------------------------------------------------------- one server per batch

/// A flow of one `mcp` step calling the fixture's `add` over stdio; the fixture writes its pid
/// to `pids`.
fn add_flow(dir: &TempDir, pids: &Path) -> PathBuf {
    dir.write(
        "add.yaml",
        format!(
            "flow: add
mcp_servers:
  fixture:
    command: [{bin}]
    env: {{MCP_FIXTURE_PIDS: {pids}}}
    tools: [add]
agents:
  add:
    kind: mcp
    server: fixture
    tool: add
steps:
  call:
    agent: add
    input: {{$.a: $.i, $.b: $.i}}
    output: {{$.sum: $.structured.sum}}
",
            bin = json!(mcp_fixture().display().to_string()),
            pids = json!(pids.display().to_string()),
        ),
    )
}

fn write_items(dir: &TempDir, n: usize) {
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!("{{\"i\": {i}}}\n"));
    }
    dir.write("in.jsonl", text);
}

/// Exactly one server was started, and none of those started is running.
fn one_server_none_left(pids_file: &Path, when: &str) {
    let pids = fixture_pids(pids_file);
    assert_eq!(pids.len(), 1, "{when}: servers started: {pids:?}");
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|&p| process_alive(p)) {
        assert!(
            Instant::now() < deadline,
            "{when}: server {pids:?} still running after the batch ended"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn output_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("an output line is JSON"))
        .collect()
}

fn check_sums(lines: &[Value], n: usize) {
    assert_eq!(lines.len(), n);
    for (k, line) in lines.iter().enumerate() {
        assert_eq!(line["id"], k, "line {k}: {line}");
        assert_eq!(line["status"], "succeeded", "line {k}: {line}");
        assert_eq!(line["output"]["sum"], 2 * k, "line {k}: {line}");
    }
}

const ITEMS: usize = 2000;

#[test]
fn a_batch_of_two_thousand_calls_starts_one_server_and_leaves_none() {
    let dir = TempDir::new("mcp-batch");
    let pids = dir.path().join("pids");
    let flow = add_flow(&dir, &pids);
    write_items(&dir, ITEMS);
    let out = run_with_limit(
        switchyard(dir.path()).arg("batch").arg(&flow).args([
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
            "--concurrency",
            "64",
            "--id-field",
            "i",
        ]),
        SLOW,
    );
    assert_eq!(out.code(), 0, "{out:?}");
    check_sums(&output_lines(&dir.path().join("out.jsonl")), ITEMS);
    one_server_none_left(&pids, "after the batch");
}

/// Starts the batch on SQLite, in the background.
fn spawn_batch(dir: &TempDir, flow: &Path) -> Child {
    switchyard(dir.path())
        .arg("batch")
        .arg(flow)
        .args([
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
            "--concurrency",
            "64",
            "--id-field",
            "i",
            "--store",
            "sqlite:runs.db",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the batch starts")
}

/// Waits until the output file holds `lines` lines (the batch is that far), failing after
/// [`SLOW`].
fn wait_for_lines(out: &Path, lines: usize, child: &mut Child) {
    let deadline = Instant::now() + SLOW;
    loop {
        let have = std::fs::read_to_string(out)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if have >= lines {
            return;
        }
        if let Some(status) = child.try_wait().expect("the batch") {
            panic!("the batch ended ({status}) before {lines} items were done ({have})");
        }
        assert!(Instant::now() < deadline, "the batch did not reach {lines} items");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_batch_stopped_with_sigint_halfway_leaves_no_server_and_resumes_with_one() {
    let dir = TempDir::new("mcp-batch-sigint");
    let pids = dir.path().join("pids");
    let flow = add_flow(&dir, &pids);
    write_items(&dir, ITEMS);
    let out = dir.path().join("out.jsonl");
    let mut child = spawn_batch(&dir, &flow);
    wait_for_lines(&out, ITEMS / 2, &mut child);
    let (code, stderr) = interrupt(child);
    assert_eq!(code, Some(130), "{stderr}");
    let done = output_lines(&out).len();
    assert!(done < ITEMS, "the batch was stopped before its end: {done} lines");
    one_server_none_left(&pids, "after SIGINT");
    // Run again, it finishes the rest with one new server, and again leaves none.
    std::fs::remove_file(&pids).expect("the pids file");
    let again = run_with_limit(
        switchyard(dir.path()).arg("batch").arg(&flow).args([
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
            "--concurrency",
            "64",
            "--id-field",
            "i",
            "--store",
            "sqlite:runs.db",
        ]),
        SLOW,
    );
    assert_eq!(again.code(), 0, "{again:?}");
    check_sums(&output_lines(&out), ITEMS);
    one_server_none_left(&pids, "after the batch ran again");
}
