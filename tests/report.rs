//! `runs show RUN_ID --format html` (SPEC §13): one self-contained page, loaded in real
//! headless Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`, which
//! `.ci/run` installs): no console errors, no network requests, the route's nodes and the
//! timeline's bars there for the steps that ran, a click on a step's row showing its payload
//! change, and a screenshot that is not blank. A batch's page links each run by a relative,
//! percent-encoded address, so an output file's name neither runs script nor breaks a link.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{TempDir, run, switchyard};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A chromedriver process on a loopback port, killed when dropped.
pub(crate) struct Driver {
    child: Child,
    base: String,
    client: reqwest::Client,
    rt: tokio::runtime::Runtime,
}

impl Driver {
    pub(crate) fn start() -> Driver {
        for bin in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(bin).exists(),
                "{bin} is missing: the browser tests need Debian's chromium and chromium-driver \
                 (`apt-get install chromium chromium-driver`; .ci/run installs them)"
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let d = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            client: {
                // Plain HTTP on loopback; reqwest still wants a TLS provider installed.
                let _ = rustls::crypto::ring::default_provider().install_default();
                reqwest::Client::new()
            },
            rt,
        };
        let t0 = Instant::now();
        while d.try_call("GET", "/status", None).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "chromedriver did not answer"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        d
    }

    fn try_call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let url = format!("{}{path}", self.base);
        self.rt.block_on(async {
            let req = match method {
                "GET" => self.client.get(&url),
                "DELETE" => self.client.delete(&url),
                _ => self
                    .client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.unwrap_or(json!({})).to_string()),
            };
            let res = req.send().await.map_err(|e| e.to_string())?;
            let bytes = res.bytes().await.map_err(|e| e.to_string())?;
            serde_json::from_slice::<Value>(&bytes).map_err(|e| e.to_string())
        })
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let v = self
            .try_call(method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        if let Some(err) = v["value"].get("error") {
            panic!("{method} {path}: {err}: {}", v["value"]["message"]);
        }
        v["value"].clone()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A browser session of `d`, closed when dropped.
pub(crate) struct Session<'a> {
    d: &'a Driver,
    id: String,
}

impl<'a> Session<'a> {
    pub(crate) fn new(d: &'a Driver, profile: &Path) -> Session<'a> {
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                    "--window-size=1200,900", format!("--user-data-dir={}", profile.display()),
                ],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let v = d.call("POST", "/session", Some(caps));
        Session {
            d,
            id: v["sessionId"].as_str().expect("a session id").to_string(),
        }
    }

    pub(crate) fn post(&self, path: &str, body: Value) -> Value {
        self.d
            .call("POST", &format!("/session/{}{path}", self.id), Some(body))
    }

    /// GET of the session, or the WebDriver error it answered (`no such alert`, say).
    pub(crate) fn try_get(&self, path: &str) -> Result<Value, String> {
        let v = self
            .d
            .try_call("GET", &format!("/session/{}{path}", self.id), None)?;
        match v["value"].get("error") {
            Some(e) => Err(e.to_string()),
            None => Ok(v["value"].clone()),
        }
    }

    fn get(&self, path: &str) -> Value {
        self.d.call("GET", &format!("/session/{}{path}", self.id), None)
    }

    pub(crate) fn script(&self, body: &str) -> Value {
        self.post("/execute/sync", json!({"script": body, "args": []}))
    }

    /// Console messages of level SEVERE (errors), from chromedriver's browser log.
    pub(crate) fn console_errors(&self) -> Vec<String> {
        self.post("/se/log", json!({"type": "browser"}))
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or("").to_string())
            .collect()
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let _ = self.d.try_call("DELETE", &format!("/session/{}", self.id), None);
    }
}

/// How many distinct colours a PNG's pixels take, sampled: a blank page has one or two.
fn colours(png_bytes: &[u8]) -> usize {
    let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut buf).expect("a frame");
    let bytes = &buf[..info.buffer_size()];
    let px = info.color_type.samples();
    let mut seen = std::collections::HashSet::new();
    for p in bytes.chunks(px).step_by(7) {
        seen.insert(p.to_vec());
    }
    seen.len()
}

fn base64_decode(s: &str) -> Vec<u8> {
    let table = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter_map(table) {
        acc = (acc << 6) | c;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// Runs `examples/foreach.yaml` into a SQLite store in `dir` and writes its page; returns the
/// page's path.
fn foreach_report(dir: &TempDir) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let flow = root.join("examples/foreach.yaml");
    let input = r#"{"order": {"lines": [{"sku": "MUG-1", "qty": 2, "unit_cents": 1250}, {"sku": "LAMP-3", "qty": 1, "unit_cents": 8900}]}}"#;
    let out = run(switchyard(dir.path()).arg("run").arg(&flow).args([
        "--input",
        input,
        "--store",
        "sqlite:runs.db",
    ]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let page = latest_page(dir);
    dir.write("report.html", page)
}

/// The page of the newest run in `dir`'s `runs.db`.
fn latest_page(dir: &TempDir) -> String {
    let list = run(switchyard(dir.path()).args(["runs", "list", "--json", "--store", "sqlite:runs.db"]));
    let first = list.stdout.lines().next().expect("a run");
    let id = serde_json::from_str::<Value>(first).unwrap()["id"]
        .as_str()
        .expect("a run id")
        .to_string();
    let page = run(switchyard(dir.path()).args([
        "runs",
        "show",
        &id,
        "--format",
        "html",
        "--store",
        "sqlite:runs.db",
    ]));
    assert_eq!(page.code(), 0, "{}", page.stderr);
    page.stdout
}

#[test]
fn the_run_report_is_self_contained_and_shows_the_route_the_timeline_and_payload_changes() {
    let dir = TempDir::new("report-run");
    let page = foreach_report(&dir);
    let text = std::fs::read_to_string(&page).unwrap();
    // Self-contained: nothing is fetched from anywhere.
    for needle in ["http://", "https://", "src=", "<link", "@import"] {
        let outside_svg_ns = text.replace("http://www.w3.org/2000/svg", "");
        assert!(!outside_svg_ns.contains(needle), "the page refers to `{needle}`");
    }

    let driver = Driver::start();
    let profile = dir.path().join("profile");
    let s = Session::new(&driver, &profile);
    s.post("/url", json!({"url": format!("file://{}", page.display())}));
    let state = s.script(
        "return {
           steps: Array.from(document.querySelectorAll('svg g.node.step')).map(n => [n.getAttribute('data-step'), n.getAttribute('class')]),
           taken: document.querySelectorAll('svg g.edge.taken').length,
           bars: document.querySelectorAll('#timeline .bar-fill').length,
           rows: document.querySelectorAll('#timeline tr.rec').length,
           resources: performance.getEntriesByType('resource').length,
           title: document.title,
         };",
    );
    let steps = state["steps"].as_array().expect("steps");
    let class_of = |id: &str| {
        steps
            .iter()
            .find(|s| s[0] == id)
            .and_then(|s| s[1].as_str())
            .unwrap_or_else(|| panic!("no node for step `{id}`: {state}"))
            .to_string()
    };
    assert!(class_of("price_lines").split(' ').any(|c| c == "ok"), "{state}");
    assert!(class_of("flag").split(' ').any(|c| c == "ok"), "{state}");
    assert!(state["taken"].as_u64().unwrap() >= 3, "{state}");
    // A bar for each record: the loop, its two iterations, and `flag`.
    assert_eq!(state["rows"], json!(4), "{state}");
    assert_eq!(state["bars"], json!(4), "{state}");
    assert_eq!(state["resources"], json!(0), "{state}");

    // A click on `flag`'s row shows what it changed in the payload.
    let row = s.post(
        "/element",
        json!({"using": "css selector", "value": "#timeline tr.rec[data-step='flag']"}),
    );
    let eid = row
        .as_object()
        .and_then(|o| o.values().next())
        .and_then(Value::as_str)
        .expect("the row's element id")
        .to_string();
    s.post(&format!("/element/{eid}/click"), json!({}));
    let detail = s.script("return document.getElementById('detail').textContent;");
    let detail = detail.as_str().unwrap_or("");
    assert!(detail.contains("payload changes"), "{detail}");
    assert!(detail.contains("$.line_count"), "{detail}");
    assert!(detail.contains("$.needs_approval"), "{detail}");

    let errors = s.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:?}");
    let shot = s.get("/screenshot");
    let png = base64_decode(shot.as_str().expect("a screenshot"));
    std::fs::write(dir.path().join("report.png"), &png).unwrap();
    let n = colours(&png);
    assert!(n > 20, "the screenshot looks blank ({n} colours)");
}

#[test]
fn the_report_of_a_ten_thousand_iteration_loop_stays_small() {
    let dir = TempDir::new("report-big");
    dir.write(
        "big.yaml",
        "flow: bigloop\nagents:\n  double:\n    kind: transform\n    result: {v: =input * 2}\nsteps:\n  each:\n    \
         foreach: $.items\n    agent: double\n    concurrency: 16\n    select: $.v\n    output: {$.doubled: $}\n",
    );
    let items: Vec<u64> = (0..9_990).collect();
    dir.write("in.json", json!({"items": items}).to_string());
    let out = run(switchyard(dir.path()).args([
        "run",
        "big.yaml",
        "--input-file",
        "in.json",
        "--store",
        "sqlite:runs.db",
    ]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let html = latest_page(&dir);
    assert!(html.len() < 512 * 1024, "{} bytes", html.len());
    assert_eq!(
        html.matches("<tr class=\"rec\"").count(),
        51,
        "the loop and its first 50 iterations"
    );
    assert!(
        html.contains("… 9940 more iterations of step 1"),
        "the rest summed up"
    );
}

#[test]
fn the_batch_report_counts_items_lists_failures_by_kind_and_links_each_to_its_run() {
    let dir = TempDir::new("report-batch");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut lines = String::new();
    for i in 0..40 {
        let amount = if i % 10 == 0 { 0 } else { 1000 + i * 37 };
        let country = ["FR", "US", "BR", "DE"][i % 4];
        lines.push_str(&json!({"id": format!("O-{i}"), "order": {"id": format!("O-{i}"), "amount_cents": amount, "country": country}}).to_string());
        lines.push('\n');
    }
    dir.write("orders.jsonl", lines);
    let out = run(switchyard(dir.path())
        .arg("batch")
        .arg(root.join("examples/branching.yaml"))
        .args([
            "--input",
            "orders.jsonl",
            "--output",
            "out.jsonl",
            "--store",
            "sqlite:runs.db",
        ]));
    assert_eq!(out.code(), 1, "four items fail: {}", out.stderr);
    let rep = run(switchyard(dir.path()).args(["report", "out.jsonl", "--store", "sqlite:runs.db"]));
    assert_eq!(rep.code(), 0, "{}", rep.stderr);
    assert!(
        rep.stderr.contains("report: out.report.html (40 items;"),
        "{}",
        rep.stderr
    );
    let page = dir.path().join("out.report.html");
    assert!(dir.path().join("out.report.runs").is_dir());

    let driver = Driver::start();
    let s = Session::new(&driver, &dir.path().join("profile"));
    s.post("/url", json!({"url": format!("file://{}", page.display())}));
    let state = s.script(
        "return {
           counts: Array.from(document.querySelectorAll('#counts span')).map(e => e.textContent),
           kinds: Array.from(document.querySelectorAll('#failed details')).map(d => d.getAttribute('data-kind')),
           failedLinks: document.querySelectorAll('#failed a').length,
           slowest: document.querySelectorAll('#slowest tr').length - 1,
           bars: document.querySelectorAll('#durations .hist div').length,
           resources: performance.getEntriesByType('resource').length,
         };",
    );
    assert_eq!(state["counts"], json!(["4 failed", "36 succeeded"]), "{state}");
    assert_eq!(state["kinds"], json!(["invalid_order"]), "{state}");
    assert_eq!(state["failedLinks"], json!(4), "{state}");
    assert_eq!(state["slowest"], json!(20), "{state}");
    assert_eq!(state["bars"], json!(20), "{state}");
    assert_eq!(state["resources"], json!(0), "{state}");
    assert!(s.console_errors().is_empty(), "{:?}", s.console_errors());

    // A failed item's link opens its run's page, with the failed step marked.
    let link = s.post("/element", json!({"using": "css selector", "value": "#failed a"}));
    let eid = link
        .as_object()
        .and_then(|o| o.values().next())
        .and_then(Value::as_str)
        .unwrap()
        .to_string();
    s.post(&format!("/element/{eid}/click"), json!({}));
    let run_page = s.script(
        "return {
           title: document.title,
           failed: Array.from(document.querySelectorAll('svg g.node.step.failed')).map(n => n.getAttribute('data-step')),
           status: document.querySelector('header .status').textContent,
         };",
    );
    assert!(
        run_page["title"].as_str().unwrap().starts_with("run r"),
        "{run_page}"
    );
    assert_eq!(run_page["status"], "failed", "{run_page}");
    assert_eq!(run_page["failed"], json!(["reject"]), "{run_page}");
    assert!(s.console_errors().is_empty(), "{:?}", s.console_errors());
    let png = base64_decode(s.get("/screenshot").as_str().expect("a screenshot"));
    assert!(colours(&png) > 20, "the screenshot looks blank");

    // A line that is not a batch's output is named.
    dir.write("bad.jsonl", "{\"id\": 1, \"status\": \"succeeded\"}\nnot json\n");
    let bad = run(switchyard(dir.path()).args(["report", "bad.jsonl", "--no-run-pages"]));
    assert_eq!(bad.code(), 2);
    assert!(
        bad.stderr.contains("bad.jsonl: line 2: not JSON"),
        "{}",
        bad.stderr
    );
}

/// `s` with each byte outside `A-Z a-z 0-9 - . _ ~ /` percent-encoded: a file URL of a path.
fn file_url(path: &Path) -> String {
    let mut out = String::from("file://");
    for b in path.to_string_lossy().bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[test]
fn run_links_of_hostile_output_names_are_encoded_and_open_the_run_page_without_script() {
    let dir = TempDir::new("report-hostile");
    dir.write(
        "f.yaml",
        "flow: f\nagents:\n  m:\n    kind: mock\n    returns: {ok: true}\nsteps:\n  go:\n    agent: m\n    output: {$.ok: $.ok}\n",
    );
    dir.write("in.jsonl", "{\"id\": \"a\"}\n");
    let driver = Driver::start();
    let s = Session::new(&driver, &dir.path().join("profile"));
    // A link that a browser would run as script (it sets the title), and one whose `:`, `#`,
    // `?`, `%` and spaces would make it lead nowhere.
    for (name, encoded) in [
        (
            "javascript:document.title='pwned';x",
            "javascript%3Adocument.title%3D%27pwned%27%3Bx",
        ),
        ("a: b#c?d%41e f", "a%3A%20b%23c%3Fd%2541e%20f"),
    ] {
        let out = run(switchyard(dir.path())
            .args([
                "batch",
                "f.yaml",
                "--input",
                "in.jsonl",
                "--store",
                "sqlite:runs.db",
            ])
            .arg("--output")
            .arg(format!("{name}.jsonl")));
        assert_eq!(out.code(), 0, "{out:?}");
        let rep = run(switchyard(dir.path())
            .arg("report")
            .arg(format!("{name}.jsonl"))
            .args(["--store", "sqlite:runs.db"]));
        assert_eq!(rep.code(), 0, "{rep:?}");
        let page = dir.path().join(format!("{name}.report.html"));
        s.post("/url", json!({"url": file_url(&page)}));
        let href = s.script("return document.querySelector('#slowest a').getAttribute('href');");
        let href = href.as_str().expect("a link to the run");
        let prefix = format!("./{encoded}.report.runs/r");
        assert!(href.starts_with(&prefix) && href.ends_with(".html"), "{href}");
        let link = s.post(
            "/element",
            json!({"using": "css selector", "value": "#slowest a"}),
        );
        let eid = link
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .expect("an element id")
            .to_string();
        s.post(&format!("/element/{eid}/click"), json!({}));
        let shown = s.script("return {title: document.title, url: location.href, status: document.querySelector('header .status')?.textContent};");
        assert!(
            shown["title"].as_str().unwrap_or("").starts_with("run r"),
            "{name}: {shown}"
        );
        assert_eq!(shown["status"], "succeeded", "{name}: {shown}");
        assert!(shown["url"].as_str().unwrap_or("").ends_with(".html"), "{shown}");
    }
}
