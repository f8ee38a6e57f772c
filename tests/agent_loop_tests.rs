//! Agent loops in flow tests (SPEC §6.3, §11), through the real binary: a mock of a loop's
//! agent scripts its model's turns, `expect.calls` counts the turns and the tool calls, and
//! `switchyard test` checks the scripted turns before it runs them (a malformed turn is an
//! error at its place, a call of a name that is no tool of the loop a warning). Then the
//! repository's `flows/support-triage-agent.yaml` for real: against the local
//! OpenAI-compatible server, with its command tools, its child flow, and a refund that waits
//! for `resume --decision`.

use std::path::Path;

use serde_json::{Value, json};

use crate::mock_server::{Llm, Reply};
use crate::support::{self, TempDir, run_id_from};

/// A loop `helper` with tools `kb_search` (a command: tests must mock it) and `crm_lookup`
/// (a mock with an `input_schema`), whose step routes a `limit` failure to `out_of_turns`;
/// `tests` is the YAML of its `tests:` list.
fn loop_flow(tests: &str) -> String {
    format!(
        r#"flow: loops
providers:
  local: {{base_url: "http://127.0.0.1:9/v1"}}
agents:
  helper:
    kind: llm
    provider: local
    model: m1
    prompt: "Ticket: {{{{ input.text }}}}"
    tools: [kb_search, crm_lookup]
    max_iterations: 3
    result_schema:
      type: object
      required: [answer]
      properties: {{answer: {{type: string}}}}
  kb_search:
    kind: command
    run: [cat]
    input_schema: {{type: object, required: [q], properties: {{q: {{type: string}}}}}}
  crm_lookup:
    kind: mock
    input_schema: {{type: object, required: [id], properties: {{id: {{type: integer}}}}}}
    returns: {{customer: "=input.id"}}
steps:
  answer:
    agent: helper
    input: {{$.text: $.text}}
    output: {{$.reply: $}}
    next:
      - to: out_of_turns
        on: failure
        errors: [limit]
      - to: end
  out_of_turns:
    set: {{$.gave_up: {{value: true}}}}
tests:
{tests}"#
    )
}

fn flow_test(dir: &TempDir, file: &str) -> support::Output {
    support::run(support::switchyard(dir.path()).args(["test", file]))
}

fn summary(out: &support::Output) -> &str {
    out.stdout
        .lines()
        .find(|l| l.ends_with(" failed"))
        .unwrap_or_else(|| panic!("no summary: {out:?}"))
}

/// Each value of the loop mock's `sequence` is a turn: calls run the (mocked) tools, the last
/// turn is the answer, checked by `result_schema`; `expect.calls` counts each model turn as a
/// call of the loop's agent and each tool call as a call of the tool. A tool that fails, or
/// arguments against a tool's `input_schema`, go back to the model, which goes on; a model
/// that never answers hits `max_iterations` and the `limit` edge routes the run.
#[test]
fn a_test_scripts_the_turns_of_a_loop_and_counts_its_tool_calls() {
    let dir = TempDir::new("loop-tests");
    let tests = r#"  - name: two turns of calls, then the answer
    input: {text: refund}
    mocks:
      helper:
        sequence:
          - tool_calls:
              - {name: kb_search, arguments: {q: refund}}
              - {name: crm_lookup, arguments: {id: 7}}
          - tool_calls: [{name: kb_search, arguments: '{"q": "refund policy"}'}]
          - {answer: Refunds take 5 days.}
      kb_search: {returns: {articles: ["=input.q"]}}
    expect:
      path: [answer]
      output: {reply: {answer: Refunds take 5 days.}}
      calls: {helper: 3, kb_search: 2, crm_lookup: 1}
  - name: a failing tool and bad arguments go back to the model
    input: {text: x}
    mocks:
      helper:
        sequence:
          - tool_calls:
              - {name: kb_search, arguments: {q: x}}
              - {name: crm_lookup, arguments: {id: seven}}
          - {answer: without the tools}
      kb_search: {fail_times: 1, returns: {}}
    expect:
      output: {reply: {answer: without the tools}}
      calls: {helper: 2, kb_search: 1, crm_lookup: 0}
  - name: out of turns
    input: {text: x}
    mocks:
      helper:
        returns: {tool_calls: [{name: kb_search, arguments: {q: again}}]}
      kb_search: {returns: {articles: []}}
    expect:
      path: [answer, out_of_turns]
      output: {gave_up: true}
      calls: {helper: 3, kb_search: 3}
  - name: an answer against the result schema
    input: {text: x}
    mocks:
      helper: {sequence: [{wrong: 1}]}
      kb_search: {returns: {}}
    expect:
      status: failed
      error: {kind: invalid_output, message: "agent loop `helper`: the answer does not match `result_schema`"}
"#;
    dir.write("loops.yaml", loop_flow(tests));
    let out = flow_test(&dir, "loops.yaml");
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(summary(&out), "4 passed, 0 failed", "{}", out.stdout);
    assert_eq!(out.stderr, "", "no diagnostics for well-formed turns");
}

/// A tool is offered without being mocked; only a call of it needs the mock: a test whose
/// turns never call the command tool `kb_search` passes without mocking it, and one whose
/// turns do call it fails, naming it.
#[test]
fn only_the_tools_a_test_calls_must_be_mocked() {
    let dir = TempDir::new("loop-tests-unmocked");
    let tests = r#"  - name: kb_search offered, never called
    input: {text: x}
    mocks:
      helper:
        sequence:
          - tool_calls: [{name: crm_lookup, arguments: {id: 1}}]
          - {answer: found}
    expect:
      output: {reply: {answer: found}}
      calls: {helper: 2, crm_lookup: 1}
  - name: kb_search called, not mocked
    input: {text: x}
    mocks:
      helper:
        sequence:
          - tool_calls: [{name: kb_search, arguments: {q: x}}]
          - {answer: without it}
    expect:
      output: {reply: {answer: without it}}
"#;
    dir.write("loops.yaml", loop_flow(tests));
    let out = flow_test(&dir, "loops.yaml");
    assert_eq!(out.code(), 1, "{out:?}");
    assert_eq!(summary(&out), "1 passed, 1 failed", "{}", out.stdout);
    assert!(
        out.stdout
            .contains("agent `kb_search` was called but is not mocked"),
        "{}",
        out.stdout
    );
}

/// The counts are checked, not just parsed: a test that expects the wrong number of tool
/// calls or turns fails, saying which and how many there were.
#[test]
fn wrong_counts_of_turns_and_tool_calls_fail_the_test() {
    let dir = TempDir::new("loop-tests-counts");
    let tests = r#"  - name: miscounted
    input: {text: refund}
    mocks:
      helper:
        sequence:
          - tool_calls: [{name: kb_search, arguments: {q: a}}, {name: kb_search, arguments: {q: b}}]
          - {answer: done}
      kb_search: {returns: {articles: []}}
    expect:
      calls: {helper: 1, kb_search: 1}
"#;
    dir.write("loops.yaml", loop_flow(tests));
    let out = flow_test(&dir, "loops.yaml");
    assert_eq!(out.code(), 1, "{out:?}");
    assert_eq!(summary(&out), "0 passed, 1 failed");
    assert!(
        out.stdout.contains("FAILED loops.yaml :: miscounted")
            && out.stdout.contains("calls.helper: expected 1, got 2")
            && out.stdout.contains("calls.kb_search: expected 1, got 2"),
        "{}",
        out.stdout
    );
}

/// Turns of the wrong shape are found before anything runs: each is an error with its file,
/// line and column, rendered on stderr with its code and help, and listed under the test,
/// which does not run; the file's other tests still do. Exit 2, as for a flow that does not
/// lint clean.
#[test]
fn malformed_turns_are_errors_at_their_place_and_their_test_does_not_run() {
    let dir = TempDir::new("loop-tests-malformed");
    let tests = r#"  - name: malformed
    input: {text: x}
    mocks:
      helper:
        sequence:
          - {tool_calls: {name: kb_search}}
          - {tool_calls: []}
          - tool_calls:
              - {nme: kb_search, arguments: {q: 1}}
              - kb_search
              - {name: crm_lookup, arguments: [7]}
            answer: both
    expect: {status: succeeded}
  - name: fine
    input: {text: x}
    mocks:
      helper: {sequence: [{answer: ok}]}
      kb_search: {returns: {}}
    expect:
      output: {reply: {answer: ok}}
"#;
    dir.write("loops.yaml", loop_flow(tests));
    let out = flow_test(&dir, "loops.yaml");
    assert_eq!(out.code(), 2, "{out:?}");
    assert_eq!(summary(&out), "1 passed, 1 failed", "{}", out.stdout);
    assert!(out.stdout.contains("ok     loops.yaml :: fine"), "{}", out.stdout);
    let listed: Vec<&str> = out
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("FAILED loops.yaml :: malformed"))
        .skip(2)
        .take_while(|l| l.starts_with("       loops.yaml:"))
        .map(str::trim)
        .collect();
    let who = "of the mock of agent loop `helper`";
    assert_eq!(
        listed,
        [
            format!("loops.yaml:42:26: error[SY104]: `tool_calls` of turn 1 {who} is not a list"),
            format!("loops.yaml:43:26: error[SY108]: `tool_calls` of turn 2 {who} is empty"),
            format!("loops.yaml:45:17: error[SY105]: call 1 of turn 3 {who} has no `name`"),
            format!("loops.yaml:45:18: error[SY103]: unknown key `nme` in call 1 of turn 3 {who}"),
            format!("loops.yaml:46:17: error[SY104]: call 2 of turn 3 {who} is not a map"),
            format!(
                "loops.yaml:47:47: error[SY104]: the `arguments` of call 3 of turn 3 {who} are neither a map nor a string"
            ),
            format!(
                "loops.yaml:48:13: error[SY103]: turn 3 {who} calls tools and also has `answer`, which the run ignores"
            ),
        ],
        "{}",
        out.stdout
    );
    // The same problems, drawn under their spans with help.
    let e = &out.stderr;
    assert!(
        e.contains("error[SY104] invalid-type")
            && e.contains("╭─[loops.yaml:42:26]")
            && e.contains("expected a list of calls")
            && e.contains("help: did you mean `name`?")
            && e.contains(
                "help: a turn is `{tool_calls: [{name: <tool>, arguments: {...}}]}` or the final answer"
            ),
        "{e}"
    );
}

/// A turn that calls a name the loop has no tool of is a warning at that name (with the
/// closest tool), and the test runs: the model is told `unknown tool` and goes on, which is
/// what such a test may mean to show.
#[test]
fn a_turn_calling_no_tool_of_the_loop_is_a_warning_and_the_test_runs() {
    let dir = TempDir::new("loop-tests-unknown-tool");
    let tests = r#"  - name: a typo in a tool's name
    input: {text: x}
    mocks:
      helper:
        sequence:
          - tool_calls: [{name: kb_serch, arguments: {q: x}}]
          - {answer: went on}
      kb_search: {returns: {}}
    expect:
      output: {reply: {answer: went on}}
      calls: {helper: 2, kb_search: 0}
"#;
    dir.write("loops.yaml", loop_flow(tests));
    let out = flow_test(&dir, "loops.yaml");
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(summary(&out), "1 passed, 0 failed");
    let e = &out.stderr;
    assert!(
        e.contains("warning[SY506] unknown-tool")
            && e.contains("╭─[loops.yaml:42:33]")
            && e.contains("calls `kb_serch`, which is not a tool of")
            && e.contains("── no such tool")
            && e.contains("did you mean `kb_search`?"),
        "{e}"
    );
}

// ----- flows/support-triage-agent.yaml ------------------------------------------------------

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The triage flow, the flow it calls, the shared agents and the tools, copied into `dir`.
fn copy_triage_flow(dir: &TempDir) {
    for f in [
        "support-triage-agent.yaml",
        "support-reply.yaml",
        "agents/common.yaml",
        "tools/kb_search.py",
        "tools/crm_lookup.py",
    ] {
        let text = std::fs::read(repo().join("flows").join(f)).expect("read a flow file");
        dir.write(&format!("flows/{f}"), text);
    }
}

/// The flow's own tests: every scenario passes offline, the refund one stopping
/// `interrupted`.
#[test]
fn the_support_triage_flow_passes_its_tests() {
    let out = support::run(support::switchyard(repo()).args([
        "test",
        "flows/support-triage-agent.yaml",
        "flows/support-reply.yaml",
    ]));
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(summary(&out), "7 passed, 0 failed", "{}", out.stdout);
    assert!(
        out.stdout
            .contains("ok     flows/support-triage-agent.yaml :: a refund waits for a human"),
        "{}",
        out.stdout
    );
}

/// The `content` of every `tool` message of a request, in order.
fn tool_messages(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().expect("content").to_owned())
        .collect()
}

const TICKET: &str = r#"{"ticket": {"id": "T-1", "subject": "Charged twice", "body": "I see two charges of $480.", "customer_id": "C-9"}}"#;

/// The flow for real, against the local server: the model's first turn calls both lookups
/// (the real scripts answer), the second hands the writing to `support-reply.yaml` (a child
/// run, whose own model is the same server), the third answers; the edges send the reply.
#[test]
fn the_support_triage_flow_runs_its_tools_and_child_flow_for_real() {
    let server = Llm::start();
    let reply = json!({"subject": "Re: Charged twice", "body": "Hi Dana, it is a pre-authorisation (KB-12).", "cited": ["KB-12"]});
    server.script([
        Reply::calls(
            1,
            &[
                ("search_kb", r#"{"query": "charged twice"}"#),
                ("lookup_customer", r#"{"customer_id": "C-9"}"#),
            ],
        ),
        Reply::calls(
            2,
            &[(
                "write_reply",
                r#"{"ticket_id": "T-1", "customer_name": "Dana", "question": "Why was I charged twice?",
                   "facts": ["a pre-authorisation"],
                   "articles": [{"id": "KB-12", "title": "Why was I charged twice?", "url": "https://help.example.com/kb/12"}]}"#,
            )],
        ),
        // The child flow's `writer`.
        Reply::Answer(reply.to_string()),
        Reply::Answer(
            json!({"resolution": "answered", "summary": "explained the pre-authorisation", "reply": reply})
                .to_string(),
        ),
    ]);
    let dir = TempDir::new("triage-real");
    copy_triage_flow(&dir);
    let out = support::run(
        support::switchyard(dir.path())
            .env("SWITCHYARD_PROVIDER_LOCAL_BASE_URL", server.base_url())
            .args(["run", "flows/support-triage-agent.yaml", "--input", TICKET]),
    );
    assert_eq!(out.code(), 0, "{out:?}");
    let v: Value = serde_json::from_str(&out.stdout).expect("the output is JSON");
    assert_eq!(
        (&v["status"], &v["queue"], &v["reply"]),
        (&json!("answered"), &json!("outbox"), &reply)
    );
    let hits = server.hits();
    assert_eq!(hits.len(), 4);
    // The tools offered are the four of the loop, with their input schemas as parameters.
    let tools: Vec<&str> = hits[0].body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["function"]["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(tools, ["search_kb", "lookup_customer", "write_reply", "refund"]);
    assert_eq!(
        hits[0].body["tools"][1]["function"]["parameters"]["required"],
        json!(["customer_id"])
    );
    // The scripts' answers, in the model's order.
    let first = tool_messages(&hits[1].body);
    assert_eq!(first.len(), 2);
    let kb: Value = serde_json::from_str(&first[0]).expect("the search's JSON");
    assert_eq!(kb["articles"][0]["id"], "KB-12");
    let crm: Value = serde_json::from_str(&first[1]).expect("the lookup's JSON");
    assert_eq!(crm["customer"]["name"], "Dana Whitfield");
    // The child flow's model saw what the loop gave `write_reply`; its result went back.
    let child_prompt = hits[2].body["messages"].to_string();
    assert!(
        child_prompt.contains("[KB-12] Why was I charged twice?"),
        "{child_prompt}"
    );
    let last = tool_messages(&hits[3].body);
    let written: Value = serde_json::from_str(&last[2]).expect("the child's output");
    assert_eq!(written, reply);
}

/// A proposed refund stops the run (exit 3) before the billing service is called; `runs show`
/// holds the proposed call; `resume --decision '{"reject": ...}'` tells the model, whose
/// next turn escalates, and the edges route the ticket to tier 2.
#[test]
fn a_proposed_refund_waits_for_a_decision_and_a_rejection_reaches_the_model() {
    let server = Llm::start();
    server.script([
        Reply::calls(1, &[("lookup_customer", r#"{"customer_id": "C-9"}"#)]),
        Reply::calls(
            2,
            &[(
                "refund",
                r#"{"customer_id": "C-9", "invoice_id": "INV-2042", "amount_usd": 480, "reason": "duplicate"}"#,
            )],
        ),
        Reply::Answer(
            json!({"resolution": "escalate", "summary": "refund refused by billing; needs a manager"})
                .to_string(),
        ),
    ]);
    let dir = TempDir::new("triage-refund");
    copy_triage_flow(&dir);
    let sy = || {
        let mut c = support::switchyard(dir.path());
        c.env("SWITCHYARD_PROVIDER_LOCAL_BASE_URL", server.base_url());
        c
    };
    let out = support::run(sy().args([
        "run",
        "flows/support-triage-agent.yaml",
        "--store",
        "sqlite:runs.db",
        "--input",
        TICKET,
    ]));
    assert_eq!(out.code(), 3, "{out:?}");
    let id = run_id_from(&out.stderr);
    assert_eq!(server.hits().len(), 2);

    let shown = support::run(sy().args(["runs", "show", &id, "--json", "--store", "sqlite:runs.db"]));
    assert_eq!(shown.code(), 0, "{shown:?}");
    let doc: Value = serde_json::from_str(&shown.stdout).expect("runs show --json");
    let approval = doc["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["number"] == "1.t2.approval")
        .unwrap_or_else(|| panic!("an approval part: {doc}"));
    assert_eq!(approval["status"], "interrupted");
    assert_eq!(approval["result"]["calls"][0]["tool"], "refund");
    assert_eq!(approval["result"]["calls"][0]["arguments"]["amount_usd"], 480);

    let resumed = support::run(sy().args([
        "resume",
        &id,
        "--decision",
        r#"{"reject": "refunds over $200 need a manager"}"#,
        "--store",
        "sqlite:runs.db",
    ]));
    assert_eq!(resumed.code(), 0, "{resumed:?}");
    let v: Value = serde_json::from_str(&resumed.stdout).expect("the output is JSON");
    assert_eq!(
        (&v["status"], &v["queue"]),
        (&json!("escalated"), &json!("tier2"))
    );
    let hits = server.hits();
    assert_eq!(hits.len(), 3, "the recorded turns are not asked again");
    assert_eq!(
        tool_messages(&hits[2].body).last().map(String::as_str),
        Some("the call of `refund` was rejected: refunds over $200 need a manager")
    );
}

/// The README's example of a loop's test (its section "Agent loops") is a passing test of the
/// support flow.
#[test]
fn the_readmes_loop_test_passes_against_the_support_flow() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let section = &readme[readme.find("## Agent loops").expect("the section")..];
    let start = section.find("```yaml\n    mocks:\n").expect("the test's example") + "```yaml\n".len();
    let block = &section[start..start + section[start..].find("```").expect("the block ends")];
    let dir = TempDir::new("triage-readme");
    copy_triage_flow(&dir);
    let path = dir.path().join("flows/support-triage-agent.yaml");
    let text = std::fs::read_to_string(&path).expect("the flow");
    let flow = &text[..text.find("\ntests:\n").expect("the flow's tests")];
    let test = format!(
        "{flow}\ntests:\n  - name: the README's\n    input:\n      ticket: {{id: T-9, subject: Locked out, body: I cannot log in., customer_id: C-404}}\n{block}"
    );
    std::fs::write(&path, test).expect("write the flow");
    let out = support::run(support::switchyard(dir.path()).args(["test", "flows/support-triage-agent.yaml"]));
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(summary(&out), "1 passed, 0 failed", "{}", out.stdout);
}
