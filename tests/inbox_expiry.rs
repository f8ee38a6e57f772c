//! An agent loop's approval expiry (SPEC §15, `approve_expires` and `on_expire`) through the
//! binary, a SQLite store and the loopback model server: the approval is an inbox item whose
//! schema takes the three decisions, and once its expiry passed `resume` without a decision
//! rejects the calls (the model is told) or fails the step with kind `timeout`.

use std::path::Path;

use serde_json::{Value, json};
use switchyard::__private::plan::Schema;
use switchyard::__private::record::inbox::{InboxItem, ItemState};
use switchyard::__private::store::Store;
use switchyard::__private::store::inbox::ItemQuery;
use switchyard::__private::store::sql::SqlStore;

use crate::agent_loop::tool_messages;
use crate::mock_server::{Llm, Reply};
use crate::support::{TempDir, run, run_id_from, switchyard};

const STORE: [&str; 2] = ["--store", "sqlite:runs.db"];

/// A loop whose `refund` calls need approval, expiring after `expires`, with `on_expire`
/// when given; `refund` appends its input to `paid`.
fn expiring_flow(base_url: &str, paid: &Path, expires: &str, on_expire: Option<&str>) -> String {
    let on_expire = on_expire.map_or(String::new(), |o| format!("    on_expire: {o}\n"));
    format!(
        r#"flow: refunds
providers:
  local:
    base_url: {base_url}
agents:
  agent:
    kind: llm
    provider: local
    model: m1
    prompt: "Ticket: {{{{ input.text }}}}"
    tools: [refund]
    approve: [refund]
    approve_expires: {expires}
{on_expire}  refund:
    kind: command
    input_schema:
      type: object
      required: [amount]
      properties: {{amount: {{type: integer}}}}
    run: [sh, -c, 'cat >> "{paid}"; printf "{{\"refunded\": true}}"']
    idempotent: false
steps:
  answer:
    agent: agent
    input: {{$.text: $.text}}
    output: {{$.reply: $}}
"#,
        paid = paid.display()
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The inbox items of the store `db`, oldest first.
fn items(db: &Path) -> Vec<InboxItem> {
    runtime().block_on(async {
        let store = SqlStore::open(&format!("sqlite:{}", db.display()))
            .await
            .expect("opens");
        let items = store.inbox().list(&ItemQuery::default()).await.expect("lists");
        store.close().await;
        items
    })
}

/// Waits (without asserting on time) until the store's clock is past `at`.
fn wait_past(db: &Path, at: u64) {
    loop {
        let now = runtime().block_on(async {
            let store = SqlStore::open(&format!("sqlite:{}", db.display()))
                .await
                .expect("opens");
            let now = store.inbox().now().await.expect("a clock");
            store.close().await;
            now
        });
        if now > at {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(u64::min(at - now + 1, 200)));
    }
}

/// Runs the flow of `dir` to its approval (exit 3); the run's id.
fn run_to_approval(dir: &TempDir) -> String {
    let out = run(switchyard(dir.path())
        .args(["run", "refunds.yaml", "--input", r#"{"text": "refund my order"}"#])
        .args(STORE));
    assert_eq!(out.code(), 3, "{out:?}");
    run_id_from(&out.stderr)
}

/// The approval is one inbox item of kind `approval`, expiring `approve_expires` after it was
/// asked; its schema takes an approval, an edit that matches the tool's `input_schema` and a
/// rejection, and refuses an edit that does not, as `resume --decision` does.
#[test]
fn an_expiring_approval_is_an_inbox_item_whose_schema_takes_the_three_decisions() {
    let server = Llm::start();
    server.script([Reply::calls(1, &[("refund", r#"{"amount": 100}"#)])]);
    let dir = TempDir::new("inbox-expiry-item");
    let paid = dir.path().join("paid");
    dir.write(
        "refunds.yaml",
        expiring_flow(&server.base_url(), &paid, "1h", Some("reject")),
    );
    let id = run_to_approval(&dir);
    let items = items(&dir.path().join("runs.db"));
    assert_eq!(items.len(), 1, "{items:?}");
    let item = &items[0];
    assert_eq!(
        (
            item.kind.as_str(),
            item.run_id.as_str(),
            item.step.as_str(),
            item.state
        ),
        ("approval", id.as_str(), "answer", ItemState::Waiting)
    );
    assert_eq!(item.calls.len(), 1);
    assert_eq!(item.calls[0]["tool"], "refund");
    assert_eq!(item.calls[0]["arguments"], json!({"amount": 100}));
    let expires = item.expires_at.expect("an expiry");
    // Stamped when the question was asked: an hour after (the part's start is a moment
    // before the stamp).
    assert!(
        expires >= item.created_at + 3_600_000 && expires < item.created_at + 3_600_000 + 600_000,
        "created {} expires {expires}",
        item.created_at
    );
    let schema = Schema::new(item.schema.clone()).expect("the item's schema compiles");
    for good in [
        json!({"approve": true}),
        json!({"edit": {"amount": 40}}),
        json!({"reject": "over the limit"}),
    ] {
        assert!(schema.check(&good).is_ok(), "{good} refused");
    }
    for bad in [
        json!({"edit": {"amount": "forty"}}),
        json!({"edit": {}}),
        json!({"approve": false}),
        json!([{"approve": true}, {"approve": true}]),
    ] {
        assert!(schema.check(&bad).is_err(), "{bad} accepted");
    }
    // `resume --decision` refuses the edit the schema refuses, and nothing runs.
    let bad = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"edit": {"amount": "forty"}}"#])
        .args(STORE));
    assert_eq!(bad.code(), 2, "{bad:?}");
    assert!(
        bad.stderr
            .contains("do not match its `input_schema` at `/amount`"),
        "{}",
        bad.stderr
    );
    assert!(!paid.exists());
    assert_eq!(server.hits().len(), 1);
}

/// `on_expire: reject`: once the expiry passed, `resume` without a decision settles the item
/// expired and the model is told the call was rejected; the loop goes on to its answer and
/// the tool never ran. A decision given after the expiry is refused as late.
#[test]
fn an_expired_approval_with_on_expire_reject_tells_the_model_and_the_loop_goes_on() {
    let server = Llm::start();
    server.script([
        Reply::calls(1, &[("refund", r#"{"amount": 100}"#)]),
        Reply::Answer("I could not refund it.".into()),
    ]);
    let dir = TempDir::new("inbox-expiry-reject");
    let db = dir.path().join("runs.db");
    let paid = dir.path().join("paid");
    dir.write(
        "refunds.yaml",
        expiring_flow(&server.base_url(), &paid, "1s", Some("reject")),
    );
    let id = run_to_approval(&dir);
    let expires = items(&db)[0].expires_at.expect("an expiry");
    wait_past(&db, expires);

    let late = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"approve": true}"#])
        .args(STORE));
    assert_eq!(late.code(), 2, "{late:?}");
    assert!(late.stderr.contains("expired at"), "{}", late.stderr);
    assert!(!paid.exists(), "a late approval ran the tool");

    let out = run(switchyard(dir.path()).args(["resume", &id]).args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(!paid.exists(), "the rejected call ran");
    let hits = server.hits();
    assert_eq!(hits.len(), 2, "the model is asked once more");
    let told = tool_messages(&hits[1].body);
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].0, "call_1_1");
    assert!(
        told[0].1.contains("rejected") && told[0].1.contains("the approval expired without a decision"),
        "{}",
        told[0].1
    );
    let items = items(&db);
    assert_eq!(items[0].state, ItemState::Expired);
    let show = run(switchyard(dir.path())
        .args(["runs", "show", &id, "--json"])
        .args(STORE));
    let shown: Value = serde_json::from_str(&show.stdout).expect("json");
    assert_eq!(shown["run"]["status"], "succeeded", "{}", show.stdout);
}

/// Without `on_expire` (`fail`): once the expiry passed, `resume` without a decision fails
/// the step with kind `timeout`; the tool never ran and the model is not asked again.
#[test]
fn an_expired_approval_without_on_expire_fails_the_step_with_timeout() {
    let server = Llm::start();
    server.script([Reply::calls(1, &[("refund", r#"{"amount": 100}"#)])]);
    let dir = TempDir::new("inbox-expiry-fail");
    let db = dir.path().join("runs.db");
    let paid = dir.path().join("paid");
    dir.write(
        "refunds.yaml",
        expiring_flow(&server.base_url(), &paid, "1s", None),
    );
    let id = run_to_approval(&dir);
    let expires = items(&db)[0].expires_at.expect("an expiry");
    wait_past(&db, expires);
    let out = run(switchyard(dir.path()).args(["resume", &id]).args(STORE));
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(!paid.exists());
    assert_eq!(server.hits().len(), 1);
    let show = run(switchyard(dir.path())
        .args(["runs", "show", &id, "--json"])
        .args(STORE));
    let shown: Value = serde_json::from_str(&show.stdout).expect("json");
    assert_eq!(shown["run"]["status"], "failed", "{}", show.stdout);
    assert_eq!(shown["run"]["error"]["kind"], "timeout", "{}", show.stdout);
    assert_eq!(items(&db)[0].state, ItemState::Expired);
}
