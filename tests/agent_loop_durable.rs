//! Agent loops (SPEC §6.3) through the real `switchyard` binary and the SQLite store: a batch
//! of loops killed with SIGKILL mid-way and run again (no recorded model turn asked again, no
//! non-idempotent tool call made twice unless reported in doubt), approvals end to end
//! (`runs show`, `resume --decision` with edit, reject and malformed decisions), and how
//! `runs show` and `run --trace` show a loop's turns, calls and transcript.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard::__private::store::Store;

use crate::agent_loop::tool_messages;
use crate::mock_server::{Llm, Reply};
use crate::support::{TempDir, run, run_id_from, switchyard};

const STORE: [&str; 2] = ["--store", "sqlite:runs.db"];

// ------------------------------------------------------------------ a killed batch of loops

/// A flow whose step `answer` is an agent loop `helper` with two `command` tools: `lookup`
/// (idempotent) and `log` (not idempotent: it appends its SWITCHYARD_IDEMPOTENCY_KEY to
/// `side`, then takes a while, a window for a kill to leave it in doubt).
fn batch_flow(base_url: &str, side: &Path, lookups: &Path) -> String {
    format!(
        r#"flow: tickets
providers:
  local:
    base_url: {base_url}
agents:
  helper:
    kind: llm
    provider: local
    model: m1
    system: You resolve tickets.
    prompt: "Ticket: {{{{ input.id }}}}"
    tools: [lookup, log]
  lookup:
    kind: command
    description: Looks a ticket up.
    run: [sh, -c, 'cat >/dev/null; printf "%s\n" "$SWITCHYARD_IDEMPOTENCY_KEY" >> "{lookups}"; printf "{{\"found\": true}}"']
    idempotent: true
  log:
    kind: command
    description: Writes a note on the ticket.
    run: [sh, -c, 'cat >/dev/null; printf "%s\n" "$SWITCHYARD_IDEMPOTENCY_KEY" >> "{side}"; sleep 0.15; printf "{{\"logged\": true}}"']
    idempotent: false
steps:
  answer:
    agent: helper
    input: {{$.id: $.id}}
    output: {{$.reply: $}}
"#,
        side = side.display(),
        lookups = lookups.display()
    )
}

/// The item a request of `batch_flow` is for (`item-7` → 7) and its turn (1 + the
/// assistant messages in it).
fn item_and_turn(body: &Value) -> (u64, u32) {
    let messages = body["messages"].as_array().expect("messages");
    let item = messages
        .iter()
        .filter_map(|m| m["content"].as_str())
        .find_map(|c| c.strip_prefix("Ticket: item-"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("a ticket in {body}"));
    let turn = 1 + messages.iter().filter(|m| m["role"] == "assistant").count() as u32;
    (item, turn)
}

/// Item `n` takes `2 + n % 3` turns: each but the last calls `log` (the first one `lookup`
/// too, both at once); the last answers.
fn turns_of(item: u64) -> u32 {
    2 + (item % 3) as u32
}

fn loop_model(body: &Value) -> Reply {
    let (item, turn) = item_and_turn(body);
    if turn >= turns_of(item) {
        return Reply::Answer(format!("ticket item-{item} resolved"));
    }
    let log = json!({"item": item, "turn": turn}).to_string();
    let lookup = json!({"q": format!("item-{item}")}).to_string();
    if turn == 1 {
        Reply::calls(turn, &[("log", &log), ("lookup", &lookup)])
    } else {
        Reply::calls(turn, &[("log", &log)])
    }
}

fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    lines_of(path)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The model turns the store has finished records of, as `(item, turn)`.
fn recorded_turns(db: &Path) -> HashSet<(u64, u32)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let url = format!("sqlite:{}", db.display());
        let store = switchyard::__private::store::sql::SqlStore::open(&url)
            .await
            .expect("opens");
        let filter = switchyard::__private::store::RunFilter {
            limit: Some(1000),
            ..Default::default()
        };
        let mut out = HashSet::new();
        for r in store.list_runs(&filter).await.expect("runs") {
            let item: u64 = r
                .item_id
                .as_deref()
                .and_then(|i| i.strip_prefix("item-"))
                .and_then(|n| n.parse().ok())
                .expect("an item id");
            for s in store.steps(&r.id).await.expect("steps") {
                if s.kind == "turn" && s.status.as_str() == "succeeded" {
                    let turn = s.number.rsplit_once(".t").expect("a turn number").1;
                    out.insert((item, turn.parse().expect("a turn")));
                }
            }
        }
        store.close().await;
        out
    })
}

/// Waits (without a clock: until the file has grown or the process ended) for `n` lines
/// in `path`; whether the process is still running.
fn wait_for_lines(child: &mut std::process::Child, path: &Path, n: usize) -> bool {
    loop {
        if lines_of(path).len() >= n {
            return child.try_wait().expect("wait").is_none();
        }
        if child.try_wait().expect("wait").is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A batch of 20 agent loops killed twice mid-way, then the same command again: every item
/// once in the output; no model turn the store had recorded at a kill is asked again, and
/// a turn asked twice (in flight at a kill) is asked with the same conversation; the
/// non-idempotent tool ran once per call, except calls reported in doubt, which
/// `--retry-in-doubt` runs again.
#[test]
fn a_killed_batch_of_agent_loops_asks_no_recorded_turn_again() {
    const N: u64 = 20;
    let server = Llm::start();
    server.latency(Duration::from_millis(30));
    server.respond_with(loop_model);
    let dir = TempDir::new("loop-batch-kill");
    let side = dir.path().join("side");
    let lookups = dir.path().join("lookups");
    let flow = dir.write("tickets.yaml", batch_flow(&server.base_url(), &side, &lookups));
    let mut input = String::new();
    for i in 0..N {
        input.push_str(&json!({"id": format!("item-{i}")}).to_string());
        input.push('\n');
    }
    dir.write("in.jsonl", input);
    let db = dir.path().join("runs.db");
    let batch = |extra: &[&str]| {
        let mut cmd = switchyard(dir.path());
        cmd.arg("batch")
            .arg(&flow)
            .args([
                "--input",
                "in.jsonl",
                "--output",
                "out.jsonl",
                "--concurrency",
                "4",
            ])
            .args(STORE)
            .args(extra);
        cmd
    };
    let total_logs: u64 = (0..N).map(|i| u64::from(turns_of(i)) - 1).sum();
    // Killed once a third, then two thirds, of the `log` calls have started.
    let mut kills = Vec::new();
    for at in [total_logs / 3, 2 * total_logs / 3] {
        let mut child = batch(&[])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts");
        let running = wait_for_lines(&mut child, &side, at as usize);
        assert!(running, "the batch ended before {at} `log` calls");
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        // What the server had answered, then what the store had recorded, at the kill.
        let hits = server.hits().len();
        kills.push((hits, recorded_turns(&db)));
        if kills.len() == 1 {
            // The loop whose `log` call was in flight has no record of its step: `runs show`
            // prints what finished of it under a line for the step.
            let list = run(switchyard(dir.path())
                .args(["runs", "list", "--status", "running", "--json"])
                .args(STORE));
            let shows: Vec<String> = list
                .stdout
                .lines()
                .map(|l| {
                    serde_json::from_str::<Value>(l).unwrap()["id"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                })
                .map(|id| run(switchyard(dir.path()).args(["runs", "show", &id]).args(STORE)).stdout)
                .collect();
            assert!(
                shows.iter().any(|s| s.contains("  … 1 answer · not finished · ")
                    && s.contains(" turns finished\n    ✓ 1.t1 turn ")),
                "{shows:#?}"
            );
        }
    }

    let out = run(&mut batch(&[]));
    let lines = read_jsonl(&dir.path().join("out.jsonl"));
    assert_eq!(lines.len(), N as usize, "{}", out.stderr);
    let in_doubt: HashSet<String> = lines
        .iter()
        .filter(|l| l["status"] != "succeeded")
        .map(|l| {
            assert_eq!(l["status"], "interrupted", "{l}");
            assert_eq!(l["error"]["kind"], "in_doubt", "{l}");
            l["id"].as_str().unwrap().to_owned()
        })
        .collect();
    let mut repeated_after_doubt = HashSet::new();
    if !in_doubt.is_empty() {
        assert_eq!(out.code(), 3, "{}", out.stderr);
        let before: HashSet<String> = lines_of(&side).into_iter().collect();
        let out = run(&mut batch(&["--retry-in-doubt"]));
        assert_eq!(out.code(), 0, "{}", out.stderr);
        for k in lines_of(&side) {
            if !before.contains(&k) {
                continue;
            }
            repeated_after_doubt.insert(k);
        }
    } else {
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }

    // Every item once, in input order, answered after its own number of turns.
    let lines = read_jsonl(&dir.path().join("out.jsonl"));
    let ids: Vec<String> = lines
        .iter()
        .map(|l| l["id"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..N).map(|i| format!("item-{i}")).collect();
    assert_eq!(ids, expected);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["status"], "succeeded", "{l}");
        assert_eq!(
            l["output"]["reply"],
            json!({"text": format!("ticket item-{i} resolved")}),
            "{l}"
        );
    }

    // The model: no turn recorded at a kill was asked after it; a turn asked twice was asked
    // with the same conversation; each next turn extends the conversation of the one before.
    let hits = server.hits();
    for (at, recorded) in &kills {
        for h in &hits[*at..] {
            let key = item_and_turn(&h.body);
            assert!(
                !recorded.contains(&key),
                "turn {} of item-{} was recorded before a kill and asked again",
                key.1,
                key.0
            );
        }
    }
    let mut asked: HashMap<(u64, u32), Vec<&Value>> = HashMap::new();
    for h in &hits {
        asked.entry(item_and_turn(&h.body)).or_default().push(&h.body);
    }
    for item in 0..N {
        for turn in 1..=turns_of(item) {
            let bodies = asked
                .get(&(item, turn))
                .unwrap_or_else(|| panic!("turn {turn} of item-{item} was asked"));
            for b in bodies {
                assert_eq!(b["messages"], bodies[0]["messages"], "item-{item} turn {turn}");
            }
            if turn > 1 {
                let before = asked[&(item, turn - 1)][0]["messages"].as_array().unwrap();
                let now = bodies[0]["messages"].as_array().unwrap();
                assert_eq!(&now[..before.len()], &before[..], "item-{item} turn {turn}");
            }
        }
        assert!(!asked.contains_key(&(item, turns_of(item) + 1)));
    }
    let final_turns = recorded_turns(&db);
    let all: usize = (0..N).map(|i| turns_of(i) as usize).sum();
    assert_eq!(final_turns.len(), all);

    // The side effects: every `log` call once, except a call in doubt, whose item was
    // reported so, run again by `--retry-in-doubt`.
    let mut counts: HashMap<String, usize> = HashMap::new();
    for k in lines_of(&side) {
        *counts.entry(k).or_default() += 1;
    }
    assert_eq!(counts.len() as u64, total_logs, "{counts:?}");
    // Each key is `<run>:<step>.t<turn>.<call>`: `log` is the first call of its turn.
    for key in counts.keys() {
        let (run_id, part) = key.split_once(':').expect("`<run>:<part>`");
        assert!(run_id.starts_with('r'), "{key}");
        let (turn, call) = part
            .strip_prefix("1.t")
            .and_then(|p| p.split_once('.'))
            .unwrap_or_else(|| panic!("{key}"));
        assert!(turn.parse::<u32>().is_ok() && call == "1", "{key}");
    }
    let run_items = run_items(&db);
    for (key, n) in &counts {
        let run_id = key.split(':').next().unwrap();
        let item = &run_items[run_id];
        if *n > 1 {
            assert_eq!(*n, 2, "{key}");
            assert!(
                in_doubt.contains(item) && repeated_after_doubt.contains(key),
                "`{key}` ran {n} times; items reported in doubt: {in_doubt:?}"
            );
        }
    }
    // The idempotent tool ran once per call too, or again after a kill: never lost.
    let lookups: HashSet<String> = lines_of(&lookups).into_iter().collect();
    assert_eq!(lookups.len() as u64, N);
}

/// The item id of each run of the store.
fn run_items(db: &Path) -> HashMap<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let url = format!("sqlite:{}", db.display());
        let store = switchyard::__private::store::sql::SqlStore::open(&url)
            .await
            .expect("opens");
        let filter = switchyard::__private::store::RunFilter {
            limit: Some(1000),
            ..Default::default()
        };
        let runs = store.list_runs(&filter).await.expect("runs");
        store.close().await;
        runs.into_iter()
            .map(|r| (r.id, r.item_id.expect("an item id")))
            .collect()
    })
}

// ------------------------------------------------------------------ approvals end to end

/// A flow whose step `answer` is an agent loop `agent` with tools `refund` (a command that
/// appends its input to `paid`; its calls need approval) and `lookup` (a mock).
pub(crate) fn approval_flow(base_url: &str, paid: &Path) -> String {
    format!(
        r#"flow: refunds
providers:
  local:
    base_url: {base_url}
    prices: {{m1: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}}}
agents:
  agent:
    kind: llm
    provider: local
    model: m1
    system: You handle refunds.
    prompt: "Ticket: {{{{ input.text }}}}"
    tools:
      refund: {{description: Refunds an amount.}}
      lookup: {{}}
    approve: [refund]
  refund:
    kind: command
    input_schema:
      type: object
      required: [amount]
      properties: {{amount: {{type: integer}}}}
    run: [sh, -c, 'cat >> "{paid}"; printf "\n" >> "{paid}"; printf "{{\"refunded\": true}}"']
    idempotent: false
  lookup:
    kind: mock
    returns: {{order: 7, total: 100}}
steps:
  answer:
    agent: agent
    input: {{$.text: $.text}}
    output: {{$.reply: $}}
"#,
        paid = paid.display()
    )
}

/// Runs the approval flow of `dir` to its stop for approval (exit 3); the run's id.
fn run_to_approval(dir: &TempDir) -> String {
    let out = run(switchyard(dir.path())
        .args(["run", "refunds.yaml", "--input", r#"{"text": "refund my order"}"#])
        .args(STORE));
    assert_eq!(out.code(), 3, "{out:?}");
    run_id_from(&out.stderr)
}

/// `approve: [refund]`: the run stops `interrupted` before the call; `runs show` prints the
/// proposed call and the command that answers; malformed decisions are refused before
/// anything runs; an `edit` decision's arguments reach the tool, and the model is not asked
/// again for the turn that proposed the call.
#[test]
fn an_approval_stops_the_run_and_an_edit_decision_reaches_the_tool() {
    let server = Llm::start();
    server.script([
        Reply::calls(1, &[("refund", r#"{"amount": 100}"#)]),
        Reply::Answer("Refunded 40.".into()),
    ]);
    let dir = TempDir::new("loop-approve-edit");
    let paid = dir.path().join("paid");
    dir.write("refunds.yaml", approval_flow(&server.base_url(), &paid));
    let out = run(switchyard(dir.path())
        .args([
            "run",
            "refunds.yaml",
            "--trace",
            "--input",
            r#"{"text": "refund my order"}"#,
        ])
        .args(STORE));
    assert_eq!(out.code(), 3, "{out:?}");
    let id = run_id_from(&out.stderr);
    // The trace shows the approval part with the call it holds; the message, what it waits
    // for and the decision's shape.
    assert!(
        out.stderr.contains("    ⏸ 1.t1.approval approval ")
            && out.stderr.contains("ms\n      call 1: refund {\"amount\":100}\n"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "  call 1: refund {\"amount\":100}\n  the decision: {\"approve\": true}, {\"edit\": {<arguments>}} or {\"reject\": \"why\"}\n"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!(
            "interrupted: run `{id}` waits for approval of a call of `refund` by agent loop `agent` at step `answer`"
        )),
        "{}",
        out.stderr
    );
    assert!(!paid.exists(), "nothing was refunded before the decision");
    assert_eq!(server.hits().len(), 1);

    let show = run(switchyard(dir.path()).args(["runs", "show", &id]).args(STORE));
    assert_eq!(show.code(), 0, "{show:?}");
    assert!(show.stdout.contains("status    interrupted"), "{}", show.stdout);
    assert!(
        show.stdout.contains("⏸ 1.t1.approval approval"),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains(
            "prompt: agent loop `agent` of step `answer` wants to call `refund`: approve, edit or reject each"
        ),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains(r#"call 1: refund {"amount":100}"#),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains(&format!(
            "answer: `switchyard resume {id} --decision JSON --store sqlite:runs.db`"
        )),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout
            .contains(r#"{"approve": true} | {"edit": {<arguments>}} | {"reject": "why"}"#),
        "{}",
        show.stdout
    );

    // Malformed decisions: refused with exit 2, nothing runs.
    for (decision, says) in [
        (
            r#"[{"approve": true}, {"approve": true}]"#,
            "the decision lists 2 decisions for 1 calls waiting for approval",
        ),
        (
            r#"{"approve": false}"#,
            r#"each decision is `{"approve": true}`, `{"edit": {<arguments>}}` or `{"reject": "why"}`: got {"approve":false}"#,
        ),
        (
            r#"{"yes": 1}"#,
            r#"each decision is `{"approve": true}`, `{"edit": {<arguments>}}` or `{"reject": "why"}`: got {"yes":1}"#,
        ),
        // Edited arguments are the human's: checked against the tool's input_schema now,
        // not handed to the model as a failed call.
        (
            r#"{"edit": {"amount": "forty"}}"#,
            r#"the edited arguments of `refund` do not match its `input_schema` at `/amount`: "forty" is not of type "integer""#,
        ),
    ] {
        let bad = run(switchyard(dir.path())
            .args(["resume", &id, "--decision", decision])
            .args(STORE));
        assert_eq!(bad.code(), 2, "{bad:?}");
        assert!(
            bad.stderr.contains(&format!(
                "the decision does not answer the approval at step `answer`: {says}"
            )),
            "{decision}: {}",
            bad.stderr
        );
    }
    let none = run(switchyard(dir.path()).args(["resume", &id]).args(STORE));
    assert_eq!(none.code(), 2, "{none:?}");
    assert!(
        none.stderr.contains(&format!(
            "run `{id}` waits for approval of 1 call(s) the agent loop of step `answer` proposed: give the decision with --decision JSON"
        )),
        "{}",
        none.stderr
    );
    assert!(!paid.exists());
    assert_eq!(server.hits().len(), 1);

    let ok = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"edit": {"amount": 40}}"#])
        .args(STORE));
    assert_eq!(ok.code(), 0, "{ok:?}");
    let output: Value = serde_json::from_str(&ok.stdout).unwrap();
    assert_eq!(output["reply"], json!({"text": "Refunded 40."}));
    // The edited arguments reached the tool, once.
    let paid_lines: Vec<Value> = read_jsonl(&paid);
    assert_eq!(paid_lines, [json!({"amount": 40})]);
    // The model was asked once more: for the turn after the call, told its result.
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    // The model is told the call ran with the edited arguments, not the ones it proposed.
    assert_eq!(
        tool_messages(&hits[1].body),
        [(
            "call_1_1".to_owned(),
            r#"the arguments were edited before the call ran: {"amount":40}; the result: {"refunded":true}"#
                .to_owned()
        )]
    );
    let msgs = hits[1].body["messages"].as_array().unwrap();
    assert_eq!(
        msgs[..msgs.len() - 2],
        hits[0].body["messages"].as_array().unwrap()[..]
    );

    // The record: the decision kept at the approval part, which succeeded.
    let show = run(switchyard(dir.path())
        .args(["runs", "show", &id, "--json"])
        .args(STORE));
    let doc: Value = serde_json::from_str(&show.stdout).unwrap();
    let steps = doc["steps"].as_array().unwrap();
    let part = |n: &str| {
        steps
            .iter()
            .find(|s| s["number"] == n)
            .unwrap_or_else(|| panic!("{n} in {steps:?}"))
    };
    assert_eq!(part("1.t1.approval")["status"], "succeeded");
    assert_eq!(part("1.t1.approval")["result"], json!({"edit": {"amount": 40}}));
    assert_eq!(part("1.t1.1")["input"], json!({"amount": 40}));
    assert_eq!(part("1")["answers"]["turns"], 2);
}

/// Two calls of `refund` in one turn need a list of two decisions; a `reject` becomes the
/// tool message with the reason, and only the approved call reaches the tool.
#[test]
fn two_pending_calls_need_two_decisions_and_a_rejection_is_told_to_the_model() {
    let server = Llm::start();
    server.script([
        Reply::calls(
            1,
            &[
                ("refund", r#"{"amount": 5}"#),
                ("lookup", r#"{}"#),
                ("refund", r#"{"amount": 500}"#),
            ],
        ),
        Reply::Answer("Refunded 5; 500 needs a manager.".into()),
    ]);
    let dir = TempDir::new("loop-approve-reject");
    let paid = dir.path().join("paid");
    dir.write("refunds.yaml", approval_flow(&server.base_url(), &paid));
    let id = run_to_approval(&dir);
    let show = run(switchyard(dir.path()).args(["runs", "show", &id]).args(STORE));
    assert!(
        show.stdout.contains(r#"call 1: refund {"amount":5}"#)
            && show.stdout.contains(r#"call 2: refund {"amount":500}"#),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains("a list of 2 decisions, in order"),
        "{}",
        show.stdout
    );

    let one = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"approve": true}"#])
        .args(STORE));
    assert_eq!(one.code(), 2, "{one:?}");
    assert!(
        one.stderr.contains(
            "the decision must be a list of 2 decisions, one for each call waiting for approval, in order"
        ),
        "{}",
        one.stderr
    );
    assert!(!paid.exists());

    let ok = run(switchyard(dir.path())
        .args([
            "resume",
            &id,
            "--decision",
            r#"[{"approve": true}, {"reject": "over the limit for an agent"}]"#,
        ])
        .args(STORE));
    assert_eq!(ok.code(), 0, "{ok:?}");
    assert_eq!(read_jsonl(&paid), [json!({"amount": 5})]);
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    assert_eq!(
        tool_messages(&hits[1].body),
        [
            ("call_1_1".to_owned(), r#"{"refunded":true}"#.to_owned()),
            ("call_1_2".to_owned(), r#"{"order":7,"total":100}"#.to_owned()),
            (
                "call_1_3".to_owned(),
                "the call of `refund` was rejected: over the limit for an agent".to_owned()
            ),
        ]
    );
}

// ------------------------------------------------------------------ showing a loop

/// A flow whose step `answer` is an agent loop with tools `lookup` (a mock) and `broken` (a
/// mock that always fails).
fn shown_flow(base_url: &str) -> String {
    format!(
        r#"flow: shown
providers:
  local:
    base_url: {base_url}
    prices: {{m1: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}}}
agents:
  agent:
    kind: llm
    provider: local
    model: m1
    system: You answer questions.
    prompt: "Question: {{{{ input.text }}}}"
    tools: [lookup, broken]
  lookup:
    kind: mock
    returns: {{order: 7}}
  broken:
    kind: mock
    fail_times: 100
    returns: {{}}
steps:
  answer:
    agent: agent
    input: {{$.text: $.text}}
    output: {{$.reply: $}}
"#
    )
}

/// `run --trace` and `runs show` print a loop's turns and calls under its step, in order,
/// each call named by its tool with its status, a failed call with what the model was told,
/// each turn's tokens and cost; `runs show --transcript` prints the conversation.
#[test]
fn runs_show_and_trace_print_a_loops_turns_calls_and_transcript() {
    let server = Llm::start();
    server.script([
        Reply::calls(1, &[("lookup", "{}"), ("nope", "{}")]),
        Reply::calls(2, &[("broken", "{}")]),
        Reply::Answer("Order 7 is on its way.".into()),
    ]);
    let dir = TempDir::new("loop-shown");
    dir.write("shown.yaml", shown_flow(&server.base_url()));
    let out = run(switchyard(dir.path())
        .args([
            "run",
            "shown.yaml",
            "--trace",
            "--input",
            r#"{"text": "where is my order"}"#,
        ])
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    let trace = &out.stderr;
    // The lines in order, without their durations and tokens.
    let shape: Vec<String> = trace
        .lines()
        .skip(1)
        .map(|l| {
            let l = l.split(" · ").next().unwrap();
            match l.rsplit_once(' ') {
                Some((head, ms)) if ms.ends_with("ms") => head.to_owned(),
                _ => l.to_owned(),
            }
        })
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(
        shape,
        [
            "  ✓ 1 answer [agent]",
            "    ✓ 1.t1 turn",
            "    ✓ 1.t1.1 lookup [tool]",
            "    ✗ 1.t1.2 nope [tool]",
            "      told the model: unknown tool `nope`; the tools are: lookup, broken",
            "    ✓ 1.t2 turn",
            "    ✗ 1.t2.1 broken [tool]",
            "      told the model: tool `broken` failed (kind `agent`): mock failure 1 of 100",
            "    ✓ 1.t3 turn",
        ],
        "{trace}"
    );
    assert!(
        trace.contains(" · 3 turns, 3 tool calls (2 failed) · "),
        "{trace}"
    );
    let hits = server.hits();
    for (i, h) in hits.iter().enumerate() {
        let line = trace
            .lines()
            .find(|l| l.contains(&format!("1.t{} turn", i + 1)))
            .unwrap();
        assert!(line.contains(&format!(" · {} tokens (", h.tokens)), "{line}");
        assert!(line.contains(" · $0.0"), "{line}");
    }
    assert!(
        trace.contains("1.t1 turn") && trace.contains("→ calls lookup, nope"),
        "{trace}"
    );
    assert!(trace.contains("→ answer"), "{trace}");

    let id = run_id_from_list(&dir);
    let show = run(switchyard(dir.path()).args(["runs", "show", &id]).args(STORE));
    assert_eq!(show.code(), 0, "{show:?}");
    assert!(
        show.stdout.contains("    ✗ 1.t1.2 nope [tool] ")
            && show.stdout.contains("told the model: unknown tool `nope`"),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout
            .contains("transcript: 8 messages (`runs show --transcript` prints them)"),
        "{}",
        show.stdout
    );
    let full = run(switchyard(dir.path())
        .args(["runs", "show", &id, "--transcript"])
        .args(STORE));
    assert_eq!(full.code(), 0, "{full:?}");
    let transcript: Vec<&str> = full
        .stdout
        .lines()
        .skip_while(|l| !l.contains("transcript of 1 answer (8 messages):"))
        .skip(1)
        .take(8)
        .map(str::trim)
        .collect();
    assert_eq!(
        transcript,
        [
            "system: You answer questions.",
            "user: Question: where is my order",
            "assistant: → lookup({}) [call_1_1] → nope({}) [call_1_2]",
            r#"tool: [call_1_1] {"order":7}"#,
            "tool: [call_1_2] unknown tool `nope`; the tools are: lookup, broken",
            "assistant: → broken({}) [call_2_1]",
            "tool: [call_2_1] tool `broken` failed (kind `agent`): mock failure 1 of 100",
            "assistant: Order 7 is on its way.",
        ],
        "{}",
        full.stdout
    );
}

/// The id of the one root run in the store of `dir`.
fn run_id_from_list(dir: &TempDir) -> String {
    let list = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(STORE));
    let first = list.stdout.lines().next().expect("a run");
    serde_json::from_str::<Value>(first).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Killed while the approved call runs: the decision is on record, so `resume` needs none;
/// the call (not idempotent) is in doubt and `resume` says so; `--retry-in-doubt` calls it
/// again, and the model is never asked again for the turn that proposed it.
#[test]
fn a_kill_after_the_decision_leaves_the_approved_call_in_doubt() {
    let server = Llm::start();
    server.script([
        Reply::calls(1, &[("refund", r#"{"amount": 100}"#)]),
        Reply::Answer("Refunded.".into()),
    ]);
    let dir = TempDir::new("loop-approve-kill");
    let paid = dir.path().join("paid");
    // A refund that takes a while after it wrote its line: a window for the kill.
    let flow = approval_flow(&server.base_url(), &paid).replace(
        r#"printf "\n" >> "{paid}";"#.replace("{paid}", &paid.display().to_string()).as_str(),
        &format!(r#"printf "\n" >> "{}"; sleep 30;"#, paid.display()),
    );
    assert!(flow.contains("sleep 30"), "{flow}");
    dir.write("refunds.yaml", flow);
    let id = run_to_approval(&dir);
    let mut child = switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"approve": true}"#])
        .args(STORE)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    assert!(
        wait_for_lines(&mut child, &paid, 1),
        "the resume ended before the refund ran"
    );
    child.kill().expect("SIGKILL");
    let _ = child.wait();

    // No decision needed now; the refund is in doubt.
    let again = run(switchyard(dir.path()).args(["resume", &id]).args(STORE));
    assert_eq!(again.code(), 3, "{again:?}");
    assert!(
        again.stderr.contains("interrupted[in_doubt]: "),
        "{}",
        again.stderr
    );
    assert!(
        again.stderr.contains(&format!(
            "continue it with `switchyard resume {id} --retry-in-doubt --store sqlite:runs.db`"
        )),
        "{}",
        again.stderr
    );
    assert_eq!(lines_of(&paid).len(), 1);
    // Retried (quickly this time), the run finishes; turn 1 was asked once.
    let flow = std::fs::read_to_string(dir.path().join("refunds.yaml"))
        .unwrap()
        .replace("sleep 30;", "");
    dir.write("refunds.yaml", flow);
    let done = run(switchyard(dir.path())
        .args(["resume", &id, "--retry-in-doubt", "--allow-changed"])
        .args(STORE));
    assert_eq!(done.code(), 0, "{done:?}");
    assert_eq!(lines_of(&paid).len(), 2);
    let hits = server.hits();
    assert_eq!(hits.len(), 2, "turn 1 once, turn 2 once");
    assert_eq!(
        tool_messages(&hits[1].body),
        [("call_1_1".to_owned(), r#"{"refunded":true}"#.to_owned())]
    );
}

/// Two iterations of a `foreach` whose body is an agent loop, each stopped at an approval:
/// a decision answers the approval the run waits at (the one `runs show` names) and no other;
/// the other is asked again, and its own decision answers it.
#[test]
fn a_decision_answers_one_approval_not_every_waiting_one() {
    let server = Llm::start();
    server.respond_with(|body| {
        let msgs = body["messages"].as_array().unwrap();
        let ticket = msgs
            .iter()
            .filter_map(|m| m["content"].as_str())
            .find_map(|c| c.strip_prefix("Ticket: "))
            .unwrap()
            .to_owned();
        let amount = if ticket == "a" { 10 } else { 20 };
        if msgs.iter().any(|m| m["role"] == "assistant") {
            Reply::Answer(format!("done {ticket}"))
        } else {
            Reply::calls(1, &[("refund", &json!({"amount": amount}).to_string())])
        }
    });
    let dir = TempDir::new("loop-approve-foreach");
    let paid = dir.path().join("paid");
    let flow = approval_flow(&server.base_url(), &paid).replace(
        "steps:\n  answer:\n    agent: agent\n    input: {$.text: $.text}\n    output: {$.reply: $}\n",
        "steps:\n  answer:\n    foreach: $.tickets\n    as: t\n    concurrency: 2\n    agent: agent\n    input: {$.text: =t}\n    output: {$.replies: $}\n",
    );
    assert!(flow.contains("foreach"), "{flow}");
    dir.write("refunds.yaml", flow);
    let out = run(switchyard(dir.path())
        .args(["run", "refunds.yaml", "--input", r#"{"tickets": ["a", "b"]}"#])
        .args(STORE));
    assert_eq!(out.code(), 3, "{out:?}");
    let id = run_id_from(&out.stderr);
    let doc = |dir: &TempDir| -> Value {
        let show = run(switchyard(dir.path())
            .args(["runs", "show", &id, "--json"])
            .args(STORE));
        serde_json::from_str(&show.stdout).unwrap()
    };
    let waiting = |doc: &Value| -> Vec<String> {
        doc["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["kind"] == "approval" && s["status"] == "interrupted")
            .map(|s| s["number"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(waiting(&doc(&dir)).len(), 2);

    // One decision: one refund.
    let first = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"edit": {"amount": 1}}"#])
        .args(STORE));
    assert_eq!(first.code(), 3, "one approval still waits: {first:?}");
    assert_eq!(read_jsonl(&paid), [json!({"amount": 1})]);
    assert_eq!(waiting(&doc(&dir)).len(), 1);

    let second = run(switchyard(dir.path())
        .args(["resume", &id, "--decision", r#"{"approve": true}"#])
        .args(STORE));
    assert_eq!(second.code(), 0, "{second:?}");
    let mut amounts: Vec<i64> = read_jsonl(&paid)
        .iter()
        .map(|v| v["amount"].as_i64().unwrap())
        .collect();
    amounts.sort();
    assert!(amounts == [1, 10] || amounts == [1, 20], "{amounts:?}");
    // Each ticket's turn 1 asked once, turn 2 once.
    assert_eq!(server.hits().len(), 4);
}

// ------------------------------------------------------------------ write-behind, with barriers

/// The records of a loop's turn and of its tool calls without effects (a `mock`) are queued,
/// not waited for, and committed before the next model turn is asked: the engine killed by
/// the model as its second turn arrives is resumed from that turn, and the first is asked once.
#[test]
fn a_loops_records_are_committed_before_its_next_turn_is_asked() {
    let server = Llm::start();
    let dir = TempDir::new("loop-barrier");
    let engine: std::sync::Arc<std::sync::Mutex<Option<u32>>> = Default::default();
    let victim = engine.clone();
    server.respond_with(move |body| {
        let msgs = body["messages"].as_array().unwrap();
        if !msgs.iter().any(|m| m["role"] == "tool") {
            return Reply::calls(1, &[("double", r#"{"n": 21}"#)]);
        }
        // The second turn: the first process dies before it gets an answer.
        if let Some(pid) = victim.lock().unwrap().take() {
            // At once, as the request arrives: a record still in the writer's queue is lost.
            // SAFETY: a signal to the child this test spawned and has not reaped.
            let killed = unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            assert_eq!(killed, 0);
            return Reply::Slow(Duration::from_secs(5), "too late".into());
        }
        Reply::Answer("42".into())
    });
    dir.write(
        "loop.yaml",
        format!(
            r#"flow: barrier
providers:
  local:
    base_url: {}
agents:
  helper:
    kind: llm
    provider: local
    model: m1
    prompt: "Double it."
    tools: [double]
  double:
    kind: mock
    description: Doubles a number.
    input_schema: {{type: object, required: [n], properties: {{n: {{type: integer}}}}}}
    returns: {{v: =input.n * 2}}
steps:
  answer:
    agent: helper
    output: {{$.reply: $}}
"#,
            server.base_url()
        ),
    );
    let mut child = switchyard(dir.path())
        .args(["run", "loop.yaml", "--input", "{}"])
        .args(STORE)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns");
    *engine.lock().unwrap() = Some(child.id());
    let status = child.wait().expect("waits");
    assert_eq!(status.code(), None, "killed by the model: {status:?}");
    let list = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(STORE));
    let id = serde_json::from_str::<Value>(list.stdout.lines().next().expect("a run")).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let resumed = run(switchyard(dir.path()).args(["resume", &id]).args(STORE));
    assert_eq!(resumed.code(), 0, "{resumed:?}");
    let first_turns = server
        .hits()
        .iter()
        .filter(|h| {
            !h.body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["role"] == "tool")
        })
        .count();
    assert_eq!(first_turns, 1, "the first turn was on record: not asked again");
    let show = run(switchyard(dir.path())
        .args(["runs", "show", &id, "--json"])
        .args(STORE));
    let doc: Value = serde_json::from_str(&show.stdout).unwrap();
    let numbers: Vec<String> = doc["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{} {}",
                s["number"].as_str().unwrap(),
                s["status"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        numbers,
        [
            "1.t1 succeeded",
            "1.t1.1 succeeded",
            "1.t2 succeeded",
            "1 succeeded"
        ]
    );
    assert_eq!(doc["run"]["output"]["reply"]["text"], "42");
}
