//! The pages of `switchyard serve` (SPEC §15) in real headless Chromium over WebDriver (the
//! harness of `tests/report.rs`): a store with runs stopped for a human — a batch at an
//! `interrupt` step and agent loops waiting for approval of a call, against a loopback
//! OpenAI-compatible server — served with a tokens file. The browser signs in through
//! `/login`; on `/inbox` one item is approved with the keyboard, one call's arguments are
//! edited through the form generated from its tool's `input_schema` (the change shown, a bad
//! value refused in the page), and a filtered group is approved in bulk after its count is
//! confirmed. The store's decision log then holds exactly those answers, by the token's name,
//! via `ui`. No console error, no request to another origin, and a question holding markup
//! is shown as text and runs nothing.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::agent_loop_durable::approval_flow;
use crate::mock_server::{Llm, Reply};
use crate::report::{Driver, Session};
use crate::support::{TempDir, run, run_id_from, switchyard};

const SECRET: &str = "pages-test-secret-alice";

/// A `switchyard serve` on a free loopback port, stopped when dropped.
struct Serve {
    child: Child,
    base: String,
}

impl Serve {
    fn start(dir: &Path, args: &[&str]) -> Serve {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .current_dir(dir)
            .args(["serve", "--http", &format!("127.0.0.1:{port}")])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts");
        let s = Serve {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(30), "serve did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tokens file with token `alice` (read, decide) whose secret is [`SECRET`].
fn tokens(dir: &TempDir) {
    use sha2::Digest;
    let hex: String = sha2::Sha256::digest(SECRET.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    dir.write("tokens", format!("alice read,decide sha256:{hex}\n"));
}

const GATE: &str = r#"flow: gate
agents:
  pay:
    kind: transform
    result: {paid: =input.amount}
steps:
  approve:
    interrupt:
      prompt: "Refund {{ input.amount }}? Note: {{ input.note }}"
      schema: {type: object, required: [ok], properties: {ok: {type: boolean}, why: {type: string}}}
      expires: 72h
    input: [$.amount, $.note]
    output: {$.approval: $}
    next:
      - to: refund
        if: payload.approval.ok
      - to: end
  refund:
    agent: pay
    input: [$.amount]
    output: {$.paid: $.paid}
"#;

/// Polls `f` until it answers `Some`, failing with `what` after a minute.
fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn element(s: &Session, css: &str) -> String {
    let v = s.post("/element", json!({"using": "css selector", "value": css}));
    v.as_object()
        .and_then(|o| o.values().next())
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no element `{css}`: {v}"))
        .to_string()
}

fn click(s: &Session, css: &str) {
    let id = element(s, css);
    s.post(&format!("/element/{id}/click"), json!({}));
}

fn type_into(s: &Session, css: &str, text: &str) {
    let id = element(s, css);
    s.post(&format!("/element/{id}/clear"), json!({}));
    s.post(&format!("/element/{id}/value"), json!({"text": text}));
}

fn key(s: &Session, k: &str) {
    s.post(
        "/actions",
        json!({"actions": [{"type": "key", "id": "keys", "actions": [
            {"type": "keyDown", "value": k}, {"type": "keyUp", "value": k}]}]}),
    );
}

fn text(s: &Session, css: &str) -> String {
    s.post(
        "/execute/sync",
        json!({"script": "var e = document.querySelector(arguments[0]); return e ? e.textContent : null;", "args": [css]}),
    )
    .as_str()
    .unwrap_or("")
    .to_string()
}

/// The JSON of a same-origin GET, fetched by the page (with its session).
fn fetch(s: &Session, path: &str) -> Value {
    s.post(
        "/execute/async",
        json!({"script": "var done = arguments[arguments.length - 1]; fetch(arguments[0], {credentials: 'same-origin'}).then(r => r.json()).then(done, e => done({error: String(e)}));", "args": [path]}),
    )
}

/// Signs in through `/login` (reached from `path`) and waits for the inbox's list.
fn sign_in(s: &Session, base: &str, path: &str) {
    s.post("/url", json!({"url": format!("{base}{path}")}));
    let url = s.script("return location.pathname;");
    assert_eq!(
        url,
        json!("/login"),
        "a page without a session sends the browser to /login"
    );
    type_into(s, "#token", SECRET);
    click(s, "#login button[type=submit]");
    wait_for("the page after signing in", || {
        (s.script("return location.pathname;") == json!(path)).then_some(())
    });
}

/// The decisions the store logged.
fn decisions(db: &Path) -> Vec<Value> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        use switchyard::__private::store::Store;
        let url = format!("sqlite:{}", db.display());
        let store = switchyard::__private::store::sql::SqlStore::open(&url)
            .await
            .expect("opens");
        let q = switchyard::__private::store::inbox::LogQuery::default();
        store
            .inbox()
            .log(&q)
            .await
            .expect("the log")
            .into_iter()
            .map(|d| serde_json::to_value(d).expect("a row"))
            .collect()
    })
}

#[test]
fn the_inbox_page_decides_by_keyboard_by_form_and_in_bulk_as_ui() {
    let dir = TempDir::new("serve-pages");
    tokens(&dir);
    let store = ["--store", "sqlite:runs.db"];
    // Two agent loops, each stopped before a call of `refund`.
    let llm = Llm::start();
    llm.script([
        Reply::calls(1, &[("refund", r#"{"amount": 100}"#)]),
        Reply::calls(1, &[("refund", r#"{"amount": 200}"#)]),
    ]);
    llm.default_reply(Reply::Answer("Done.".into()));
    let paid = dir.path().join("paid");
    dir.write("refunds.yaml", approval_flow(&llm.base_url(), &paid));
    let mut loops = Vec::new();
    for text in ["refund order 1", "refund order 2"] {
        let out = run(switchyard(dir.path())
            .args([
                "run",
                "refunds.yaml",
                "--input",
                &json!({"text": text}).to_string(),
            ])
            .args(store));
        assert_eq!(out.code(), 3, "{out:?}");
        loops.push(run_id_from(&out.stderr));
    }
    // A batch of three stopped at an interrupt; two notes hold markup.
    dir.write("gate.yaml", GATE);
    let items = [
        json!({"id": "a", "amount": 10, "note": "<img src=x onerror=\"window.__pwned = 1\">"}),
        json!({"id": "b", "amount": 20, "note": "</script><script>window.__pwned = 2</script>"}),
        json!({"id": "c", "amount": 500, "note": "large"}),
    ];
    dir.write(
        "in.jsonl",
        items.iter().map(|i| format!("{i}\n")).collect::<String>(),
    );
    let out = run(switchyard(dir.path())
        .args([
            "batch",
            "gate.yaml",
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
        ])
        .args(store));
    assert_eq!(out.code(), 3, "{out:?}");

    let server = Serve::start(dir.path(), &["--store", "sqlite:runs.db", "--tokens", "tokens"]);
    let driver = Driver::start();
    let s = Session::new(&driver, &dir.path().join("profile"));
    sign_in(&s, &server.base, "/inbox");
    wait_for("five waiting items listed", || {
        (s.script("return document.querySelectorAll('tr.item').length;") == json!(5)).then_some(())
    });

    // The items of the two loops, by run.
    let inbox = fetch(&s, "/v1/inbox");
    let all: Vec<Value> = inbox["groups"]
        .as_array()
        .unwrap_or_else(|| panic!("groups: {inbox}"))
        .iter()
        .flat_map(|g| g["items"].as_array().cloned().unwrap_or_default())
        .collect();
    let of_run = |run: &str| {
        all.iter()
            .find(|i| i["run_id"] == run)
            .and_then(|i| i["id"].as_str())
            .unwrap_or_else(|| panic!("no item of run {run}: {inbox}"))
            .to_string()
    };
    let (first, second) = (of_run(&loops[0]), of_run(&loops[1]));

    // A question holding markup is text: nothing ran, no element was made of it.
    let listed = text(&s, "#groups");
    assert!(listed.contains("<img src=x onerror="), "{listed}");
    assert!(listed.contains("</script><script>"), "{listed}");
    assert_eq!(
        s.script("return window.__pwned === undefined && document.querySelectorAll('img').length === 0;"),
        json!(true)
    );

    // `j` down to the first loop's item, then `a`.
    wait_for("the first loop's item under the cursor", || {
        let sel = s
            .script("var r = document.querySelector('tr.sel'); return r ? r.getAttribute('data-id') : null;");
        if sel == json!(first) {
            return Some(());
        }
        key(&s, "j");
        None
    });
    wait_for("the item shown", || {
        (s.script("return document.body.getAttribute('data-shown');") == json!(first)
            && s.script("return !!document.getElementById('approve');") == json!(true))
        .then_some(())
    });
    let shown = text(&s, "#item");
    assert!(
        shown.contains("refund order 1"),
        "the run's input is shown: {shown}"
    );
    assert!(
        shown.contains("\"amount\": 100"),
        "the proposed call is shown: {shown}"
    );
    key(&s, "a");
    wait_for("the keyboard's decision answered", || {
        text(&s, "#outcome")
            .contains("decided by alice (ui)")
            .then_some(())
    });

    // The second loop's call, edited through its tool's form: a bad value is refused in the
    // page, the change is shown before and after.
    click(&s, &format!("tr[data-id='{second}']"));
    wait_for("the second item shown", || {
        (s.script("return document.body.getAttribute('data-shown');") == json!(second)
            && s.script("return !!document.getElementById('edit');") == json!(true))
        .then_some(())
    });
    key(&s, "e");
    type_into(&s, "#edit-box input[data-pointer='/amount']", "1.5");
    click(&s, "#approve");
    let refused = text(&s, "#outcome");
    assert!(refused.contains("/amount: must be an integer"), "{refused}");
    type_into(&s, "#edit-box input[data-pointer='/amount']", "150");
    let diff = text(&s, "#diff");
    assert!(
        diff.contains("- amount: 200") && diff.contains("+ amount: 150"),
        "{diff}"
    );
    click(&s, "#approve");
    wait_for("the edit answered", || {
        text(&s, "#outcome")
            .contains("decided by alice (ui)")
            .then_some(())
    });

    // A filter the server cannot read is told as its error, as text.
    type_into(&s, "#filter", "input.amount <");
    click(&s, "#apply-filter");
    wait_for("the filter's error", || {
        (!text(&s, "#filter-error").is_empty()).then_some(())
    });

    // Bulk: the two small refunds of the batch, counted first, then applied.
    type_into(&s, "#filter", "flow == \"gate\" && input.amount < 100");
    type_into(&s, "#bulk-decision", r#"{"ok": true}"#);
    click(&s, "#bulk");
    wait_for("the bulk preview's count", || {
        text(&s, "#bulk-count").contains("2 item(s) match").then_some(())
    });
    click(&s, "#bulk-apply");
    wait_for("the bulk applied", || {
        text(&s, "#bulk-done")
            .contains("applied 2, refused 0")
            .then_some(())
    });

    // The store logged exactly those four answers, by alice, via ui.
    let log = decisions(&dir.path().join("runs.db"));
    assert_eq!(log.len(), 4, "{log:#?}");
    assert!(
        log.iter().all(|d| d["actor"] == "alice" && d["via"] == "ui"),
        "{log:#?}"
    );
    let by_item = |id: &str| {
        log.iter()
            .find(|d| d["item_id"] == id)
            .unwrap_or_else(|| panic!("no decision of {id}: {log:#?}"))
    };
    assert_eq!(by_item(&first)["decision"], json!({"approve": true}));
    let edit = by_item(&second);
    assert_eq!(edit["decision"], json!({"edit": {"amount": 150}}));
    assert_eq!(edit["edited"][0]["before"], json!({"amount": 200}));
    assert_eq!(edit["edited"][0]["after"], json!({"amount": 150}));
    let bulk: Vec<&Value> = log.iter().filter(|d| !d["bulk_id"].is_null()).collect();
    assert_eq!(bulk.len(), 2, "{log:#?}");
    assert!(bulk.iter().all(|d| d["decision"] == json!({"ok": true})));
    let gate_items: Vec<&Value> = all
        .iter()
        .filter(|i| i["id"] != first && i["id"] != second)
        .collect();
    let large = gate_items
        .iter()
        .find(|i| i["item"] == "c")
        .unwrap_or_else(|| panic!("item c: {inbox}"));
    assert!(
        log.iter().all(|d| d["item_id"] != large["id"]),
        "the large refund was left"
    );

    // The edited call reached the tool with the edited arguments (the server continued it).
    wait_for("the edited refund paid", || {
        std::fs::read_to_string(&paid).ok().filter(|p| p.contains("150"))
    });

    // The run's page shows the loop, live.
    s.post(
        "/url",
        json!({"url": format!("{}/runs/{}", server.base, loops[0])}),
    );
    wait_for("the run page's steps", || {
        (s.script("return document.querySelectorAll('#steps tr.item').length > 0 && document.getElementById('run-status').textContent !== '';")
            == json!(true))
        .then_some(())
    });

    // The one error the browser logs is the refused filter's 400, as asked.
    let errors: Vec<String> = s
        .console_errors()
        .into_iter()
        .filter(|e| !(e.contains("filter=input.amount%20%3C ") && e.contains("400")))
        .collect();
    assert!(errors.is_empty(), "console errors: {errors:?}");
    let elsewhere = s.script(
        "return performance.getEntriesByType('resource').map(e => e.name).filter(n => !n.startsWith(location.origin + '/'));",
    );
    assert_eq!(elsewhere, json!([]), "requests to another origin");
}

/// The inbox page over a group of 10,000 items: how long until its list is drawn (printed; no
/// assertion on time).
#[test]
fn the_inbox_page_of_ten_thousand_items_loads() {
    use switchyard::__private::record::inbox::{InboxItem, ItemState, item_id};
    use switchyard::__private::store::Store;
    let dir = TempDir::new("serve-pages-10k");
    let db = dir.path().join("runs.db");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    rt.block_on(async {
        let store = switchyard::__private::store::sql::SqlStore::open(&format!("sqlite:{}", db.display()))
            .await
            .expect("opens");
        let items: Vec<InboxItem> = (0..10_000u64)
            .map(|i| {
                let run = format!("r{i:08}");
                InboxItem {
                    id: item_id(&run, "1", None),
                    run_id: run.clone(),
                    root_run: run,
                    number: "1".into(),
                    iteration: None,
                    flow: "gate".into(),
                    step: "approve".into(),
                    batch: Some("big".into()),
                    item: Some(format!("item-{i}")),
                    kind: "interrupt".into(),
                    question: format!("Refund {i}?"),
                    schema: json!({"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}),
                    calls: vec![],
                    shape: "s-gate".into(),
                    created_at: now - 1000 + i / 100,
                    expires_at: Some(now + 3_600_000 + i),
                    state: ItemState::Waiting,
                    settled_at: None,
                }
            })
            .collect();
        for chunk in items.chunks(1000) {
            store.inbox().add(chunk).await.expect("added");
        }
    });
    let server = Serve::start(dir.path(), &["--store", "sqlite:runs.db"]);
    let driver = Driver::start();
    let s = Session::new(&driver, &dir.path().join("profile"));
    let t0 = Instant::now();
    s.post("/url", json!({"url": format!("{}/inbox", server.base)}));
    let drawn = wait_for("the list drawn", || {
        s.script("return document.body.getAttribute('data-rendered');")
            .as_str()
            .map(str::to_string)
    });
    let wall = t0.elapsed();
    let total = text(&s, "#total");
    assert_eq!(total, "(10000)", "the group's count");
    let rows = s.script("return document.querySelectorAll('tr.item').length;");
    assert_eq!(rows, json!(200), "the first items listed, the rest counted");
    let api = s.script(
        "var e = performance.getEntriesByType('resource').filter(e => e.name.endsWith('/v1/inbox'))[0]; \
         return e ? [Math.round(e.duration), e.encodedBodySize] : null;",
    );
    eprintln!(
        "inbox page, one group of 10,000 items: drawn {drawn} ms after the page started \
         (GET /v1/inbox [ms, bytes]: {api}); {} ms from navigation to seeing it",
        wall.as_millis()
    );
    let errors = s.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:?}");
}
