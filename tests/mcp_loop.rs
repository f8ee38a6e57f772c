//! MCP tools in agent loops, approvals and elicitation (SPEC §6.3, §6.4), through the real
//! `switchyard` binary, the SQLite store, the fixture MCP server (`examples/mcp_fixture.rs`)
//! over stdio and the loopback OpenAI-compatible server: the tool definitions a loop sends
//! from the server's `tools/list`, the tool messages of its results and errors, names that
//! collide, approvals set on the server, on the agent and by a trusted server's annotations,
//! a plain step's approval, a server's questions answered by `resume`, and a loop killed with
//! an MCP call in flight.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

use crate::agent_loop::tool_messages;
use crate::mock_server::{Llm, Reply};
use crate::support::{TempDir, lint_json, mcp_fixture, run, run_id_from, switchyard};

const STORE: [&str; 2] = ["--store", "sqlite:runs.db"];

/// A flow whose step `answer` is agent loop `helper` over the fixture server `fixture`.
/// `server` is more YAML under the server, `agent` under the loop agent (4 spaces), `tools`
/// the loop's `tools:`.
fn loop_flow(base_url: &str, tools: &str, server: &str, agent: &str) -> String {
    format!(
        r#"flow: mcp-loop
providers:
  local:
    base_url: {base_url}
mcp_servers:
  fixture:
    command: ["{fixture}"]
{server}
agents:
  helper:
    kind: llm
    provider: local
    model: m1
    system: You help.
    prompt: "Task: {{{{ input.text }}}}"
    tools: {tools}
{agent}
steps:
  answer:
    agent: helper
    input: {{$.text: $.text}}
    output: {{$.reply: $}}
"#,
        fixture = mcp_fixture().display()
    )
}

/// Runs `flow.yaml` in `dir` on the SQLite store with `{"text": "go"}`.
fn run_flow(dir: &TempDir) -> crate::support::Output {
    run(switchyard(dir.path())
        .args(["run", "flow.yaml", "--input", r#"{"text": "go"}"#])
        .args(STORE))
}

fn resume(dir: &TempDir, id: &str, decision: &str) -> crate::support::Output {
    run(switchyard(dir.path())
        .args(["resume", id, "--decision", decision])
        .args(STORE))
}

/// `runs show RUN --json`.
fn show_json(dir: &TempDir, id: &str) -> Value {
    let out = run(switchyard(dir.path())
        .args(["runs", "show", id, "--json"])
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

/// The step records of a run, as `runs show --json` lists them.
fn records(dir: &TempDir, id: &str) -> Vec<Value> {
    show_json(dir, id)["steps"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn record<'a>(records: &'a [Value], number: &str) -> &'a Value {
    records
        .iter()
        .rev()
        .find(|r| r["number"] == number)
        .unwrap_or_else(|| panic!("no record {number} in {records:#?}"))
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A loop over a whole server is offered every allowed tool as `fixture__<tool>`, with the
/// server's description and `inputSchema`; results reach the model as their text, an
/// `is_error` result as its text, arguments that break `inputSchema` as a tool message
/// without a call; each call is a record named `fixture__<tool>`.
#[test]
fn an_agent_loop_calls_a_servers_tools() {
    let llm = Llm::start();
    llm.script([
        Reply::calls(
            1,
            &[
                ("fixture__echo", r#"{"text": "hello"}"#),
                ("fixture__add", r#"{"a": 2, "b": 3}"#),
            ],
        ),
        Reply::calls(2, &[("fixture__fail", "{}"), ("fixture__add", r#"{"a": "two"}"#)]),
        Reply::Answer("done".into()),
    ]);
    let dir = TempDir::new("mcp-loop-calls");
    dir.write(
        "flow.yaml",
        loop_flow(
            &llm.base_url(),
            "[fixture]",
            "    tools: [echo, add, fail, count]",
            "",
        ),
    );
    let out = run_flow(&dir);
    assert_eq!(out.code(), 0, "{out:?}");
    let id = run_id_from_list(&dir);
    let hits = llm.hits();
    assert_eq!(hits.len(), 3);
    let first = &hits[0].body;
    assert_eq!(
        tool_names(first),
        ["fixture__echo", "fixture__add", "fixture__fail", "fixture__count"]
    );
    let add = &first["tools"][1]["function"];
    assert_eq!(add["description"], "Adds two numbers.");
    assert_eq!(add["parameters"]["required"], json!(["a", "b"]));
    assert_eq!(
        tool_messages(&hits[1].body),
        [
            ("call_1_1".to_owned(), "hello".to_owned()),
            ("call_1_2".to_owned(), "5".to_owned()),
        ]
    );
    let second = tool_messages(&hits[2].body);
    assert_eq!(second[2].1, "the tool failed on purpose", "{second:?}");
    assert!(
        second[3]
            .1
            .contains("the arguments of `fixture__add` do not match its parameters"),
        "{second:?}"
    );
    let recs = records(&dir, &id);
    let echo = record(&recs, "1.t1.1");
    assert_eq!(echo["kind"], "tool");
    assert_eq!(echo["status"], "succeeded");
    assert_eq!(echo["answers"]["tool"], "fixture__echo", "{echo}");
    assert_eq!(echo["result"]["structured"], Value::Null);
    assert_eq!(record(&recs, "1.t1.2")["result"]["structured"], json!({"sum": 5}));
    assert_eq!(record(&recs, "1.t2.1")["status"], "failed");
    assert_eq!(record(&recs, "1.t2.2")["status"], "failed");
}

/// `server.tool` offers that tool alone; a name the model makes up is an unknown tool.
#[test]
fn a_loop_names_one_tool_of_a_server() {
    let llm = Llm::start();
    llm.script([
        Reply::calls(1, &[("fixture__count", "{}")]),
        Reply::Answer("done".into()),
    ]);
    let dir = TempDir::new("mcp-loop-one-tool");
    dir.write(
        "flow.yaml",
        loop_flow(&llm.base_url(), "[fixture.echo]", "    tools: [\"*\"]", ""),
    );
    let out = run_flow(&dir);
    assert_eq!(out.code(), 0, "{out:?}");
    let hits = llm.hits();
    assert_eq!(tool_names(&hits[0].body), ["fixture__echo"]);
    // The drawing shows the tool under the step, by the name the model is offered.
    let graph = run(switchyard(dir.path()).args(["graph", "flow.yaml"]));
    assert!(
        graph
            .stdout
            .contains(r#"t_answer__fixture__echo("fixture__echo<br/>mcp")"#),
        "{}",
        graph.stdout
    );
    assert!(
        tool_messages(&hits[1].body)[0]
            .1
            .starts_with("unknown tool `fixture__count`; the tools are: fixture__echo"),
        "{:?}",
        tool_messages(&hits[1].body)
    );
}

/// Two tools that would be offered under one name, and a `server.tool` outside the server's
/// allowlist, are lint errors at their line and column.
#[test]
fn colliding_names_and_tools_outside_the_allowlist_are_lint_errors() {
    let dir = TempDir::new("mcp-loop-lint");
    let text = loop_flow(
        "http://127.0.0.1:9/v1",
        "[fixture__echo, fixture.echo, fixture.nope]",
        "    tools: [echo]",
        "  fixture__echo:\n    kind: mock\n    returns: {}",
    );
    dir.write("flow.yaml", &text);
    let out = lint_json(dir.path(), &["flow.yaml"]);
    assert_eq!(out.code(), 1, "{out:?}");
    let diags = out.diagnostics();
    let line = text
        .lines()
        .position(|l| l.contains("tools: [fixture__echo"))
        .expect("the tools line")
        + 1;
    let collision = diags
        .iter()
        .find(|d| d.code == "SY512")
        .unwrap_or_else(|| panic!("{diags:#?}"));
    assert!(
        collision.message.contains("`fixture__echo`"),
        "{}",
        collision.message
    );
    assert_eq!(collision.line, line);
    assert_eq!(
        collision.column,
        text.lines().nth(line - 1).unwrap().find("fixture.echo").unwrap() + 1
    );
    let outside = diags
        .iter()
        .find(|d| d.code == "SY510")
        .unwrap_or_else(|| panic!("{diags:#?}"));
    assert!(outside.message.contains("`nope`"), "{}", outside.message);
    assert_eq!(outside.line, line);
}

/// Approvals of MCP tools in a loop: `approve:` on the server, `fixture.*` on the agent, and a
/// trusted server's `destructiveHint` (unless `no_approval:`) stop the run before the call;
/// an untrusted server's annotations count for nothing.
#[test]
fn mcp_tools_wait_for_approval_as_the_server_and_agent_say() {
    let cases = [
        // (server YAML, agent YAML, tool called, waits)
        (
            "    tools: [echo]\n    approve: [echo]",
            "",
            "fixture__echo",
            true,
        ),
        (
            "    tools: [echo]",
            "    approve: [fixture.*]",
            "fixture__echo",
            true,
        ),
        (
            "    tools: [destructive]\n    trust: trusted",
            "",
            "fixture__destructive",
            true,
        ),
        (
            "    tools: [destructive]\n    trust: trusted\n    no_approval: [destructive]",
            "",
            "fixture__destructive",
            false,
        ),
        ("    tools: [destructive]", "", "fixture__destructive", false),
    ];
    for (i, (server, agent, tool, waits)) in cases.into_iter().enumerate() {
        let llm = Llm::start();
        let args = if tool == "fixture__echo" {
            r#"{"text": "hi"}"#
        } else {
            "{}"
        };
        llm.script([Reply::calls(1, &[(tool, args)]), Reply::Answer("done".into())]);
        let dir = TempDir::new(&format!("mcp-loop-approve-{i}"));
        dir.write(
            "flow.yaml",
            loop_flow(&llm.base_url(), "[fixture]", server, agent),
        );
        let out = run_flow(&dir);
        if !waits {
            assert_eq!(out.code(), 0, "case {i}: {out:?}");
            continue;
        }
        assert_eq!(out.code(), 3, "case {i}: {out:?}");
        assert!(
            out.stderr
                .contains(&format!("waits for approval of a call of `{tool}`")),
            "case {i}: {}",
            out.stderr
        );
        assert_eq!(llm.hits().len(), 1);
        let id = run_id_from(&out.stderr);
        let recs = records(&dir, &id);
        assert!(
            recs.iter().all(|r| r["kind"] != "tool"),
            "case {i}: nothing called before the decision"
        );
        let done = resume(&dir, &id, r#"{"approve": true}"#);
        assert_eq!(done.code(), 0, "case {i}: {done:?}");
        let recs = records(&dir, &id);
        assert_eq!(record(&recs, "1.t1.1")["status"], "succeeded", "case {i}");
        assert_eq!(record(&recs, "1.t1.approval")["status"], "succeeded");
    }
}

/// An edit decision's arguments reach the MCP tool, and the model is told of the edit; a
/// rejection is the tool message and the server is not called.
#[test]
fn an_mcp_call_in_a_loop_is_edited_or_rejected() {
    for (decision, told) in [
        (
            r#"{"edit": {"text": "edited"}}"#,
            "the arguments were edited before the call ran",
        ),
        (
            r#"{"reject": "not that"}"#,
            "the call of `fixture__echo` was rejected: not that",
        ),
    ] {
        let llm = Llm::start();
        llm.script([
            Reply::calls(1, &[("fixture__echo", r#"{"text": "proposed"}"#)]),
            Reply::Answer("done".into()),
        ]);
        let dir = TempDir::new("mcp-loop-edit");
        dir.write(
            "flow.yaml",
            loop_flow(
                &llm.base_url(),
                "[fixture]",
                "    tools: [echo]\n    approve: [echo]",
                "",
            ),
        );
        let out = run_flow(&dir);
        assert_eq!(out.code(), 3, "{out:?}");
        let id = run_id_from(&out.stderr);
        let done = resume(&dir, &id, decision);
        assert_eq!(done.code(), 0, "{done:?}");
        let message = &tool_messages(&llm.hits()[1].body)[0].1;
        assert!(message.starts_with(told), "{message}");
        let recs = records(&dir, &id);
        let call = record(&recs, "1.t1.1");
        if decision.contains("edit") {
            assert!(message.ends_with("the result: edited"), "{message}");
            assert_eq!(call["result"]["content"], json!(["edited"]));
        } else {
            assert_eq!(call["status"], "failed");
            assert!(call.get("result").is_none_or(Value::is_null), "{call}");
        }
    }
}

/// A flow with a plain `kind: mcp` step `call` of `fixture.<tool>`, its input `input`.
fn plain_flow(server: &str, tool: &str) -> String {
    format!(
        r#"flow: mcp-plain
mcp_servers:
  fixture:
    command: ["{fixture}"]
{server}
agents:
  tool:
    kind: mcp
    server: fixture
    tool: {tool}
steps:
  call:
    agent: tool
    input: {{$: $}}
    output: {{$.out: $}}
"#,
        fixture = mcp_fixture().display()
    )
}

/// A plain step whose tool needs approval stops `interrupted` before the call; approve calls
/// it, edit calls it with the edited arguments, reject fails the step with kind `agent` and
/// the reason.
#[test]
fn a_plain_steps_call_waits_for_approval() {
    let dir = TempDir::new("mcp-plain-approve");
    dir.write(
        "flow.yaml",
        plain_flow("    tools: [echo]\n    approve: [echo]", "echo"),
    );
    let start = || {
        let out = run(switchyard(dir.path())
            .args(["run", "flow.yaml", "--input", r#"{"text": "hello"}"#])
            .args(STORE));
        assert_eq!(out.code(), 3, "{out:?}");
        assert!(
            out.stderr
                .contains("waits for approval of a call of `fixture.echo`"),
            "{}",
            out.stderr
        );
        run_id_from(&out.stderr)
    };
    let id = start();
    let show = run(switchyard(dir.path()).args(["runs", "show", &id]).args(STORE));
    assert!(
        show.stdout.contains(r#"call 1: fixture.echo {"text":"hello"}"#),
        "{}",
        show.stdout
    );
    let done = resume(&dir, &id, r#"{"approve": true}"#);
    assert_eq!(done.code(), 0, "{done:?}");
    let out: Value = serde_json::from_str(&done.stdout).expect("the output");
    assert_eq!(out["out"]["content"], json!(["hello"]));

    let id = start();
    let done = resume(&dir, &id, r#"{"edit": {"text": "edited"}}"#);
    assert_eq!(done.code(), 0, "{done:?}");
    let out: Value = serde_json::from_str(&done.stdout).expect("the output");
    assert_eq!(out["out"]["content"], json!(["edited"]));

    let id = start();
    let done = resume(&dir, &id, r#"{"reject": "not today"}"#);
    assert_eq!(done.code(), 1, "{done:?}");
    assert!(
        done.stderr
            .contains("the call of `fixture.echo` was rejected: not today"),
        "{}",
        done.stderr
    );
    let recs = records(&dir, &id);
    assert_eq!(record(&recs, "1")["error"]["kind"], "agent");
}

/// A server that asks for input during a plain step's call stops the run `interrupted` with
/// its message and schema; `resume --decision` answers it (the call is sent again and the
/// answer given to the server's question); `{"reject": ...}` declines. Over the stateless
/// revision (an `input_required` result) and a session (`elicitation/create`) alike.
#[test]
fn a_servers_question_during_a_plain_call_is_answered_by_resume() {
    for legacy in [false, true] {
        servers_question_in_a_plain_call(legacy);
    }
}

fn servers_question_in_a_plain_call(legacy: bool) {
    let dir = TempDir::new(&format!("mcp-plain-elicit-{legacy}"));
    let mut text = plain_flow("    tools: [elicit]", "elicit");
    if legacy {
        text = text.replacen("\"]\n", "\", --legacy]\n", 1);
        assert!(text.contains("--legacy"), "{text}");
    }
    dir.write("flow.yaml", text);
    let start = || {
        let out = run(switchyard(dir.path())
            .args(["run", "flow.yaml", "--input", r#"{"message": "Proceed?"}"#])
            .args(STORE));
        assert_eq!(out.code(), 3, "{out:?}");
        assert!(
            out.stderr
                .contains("waits for an answer to MCP server `fixture` (tool `elicit`)")
                && out.stderr.contains("asks: Proceed?"),
            "{}",
            out.stderr
        );
        run_id_from(&out.stderr)
    };
    let id = start();
    let show = run(switchyard(dir.path()).args(["runs", "show", &id]).args(STORE));
    assert!(
        show.stdout.contains("prompt: Proceed?") && show.stdout.contains(r#""ok""#),
        "{}",
        show.stdout
    );
    let page = run(switchyard(dir.path())
        .args(["runs", "show", &id, "--format", "html"])
        .args(STORE));
    assert!(
        page.stdout.contains("Proceed?"),
        "the run page shows the question"
    );
    // A decision the schema refuses is refused before anything runs.
    let bad = resume(&dir, &id, r#"{"ok": "yes"}"#);
    assert_eq!(bad.code(), 2, "{bad:?}");
    let done = resume(&dir, &id, r#"{"ok": true}"#);
    assert_eq!(done.code(), 0, "{done:?}");
    let out: Value = serde_json::from_str(&done.stdout).expect("the output");
    assert_eq!(
        out["out"]["structured"]["answer"]["content"],
        json!({"ok": true}),
        "{out}"
    );
    assert_eq!(out["out"]["structured"]["answer"]["action"], "accept");

    let id = start();
    let done = resume(&dir, &id, r#"{"reject": "no"}"#);
    assert_eq!(done.code(), 0, "{done:?}");
    let out: Value = serde_json::from_str(&done.stdout).expect("the output");
    assert_eq!(out["out"]["structured"]["answer"]["action"], "decline", "{out}");
}

/// A question asked during a loop's tool call stops the run the same way; answered, the call
/// is sent again and its result reaches the model.
#[test]
fn a_servers_question_during_a_loops_call_is_answered_by_resume() {
    let llm = Llm::start();
    llm.script([
        Reply::calls(1, &[("fixture__elicit", r#"{"message": "Delete?"}"#)]),
        Reply::Answer("done".into()),
    ]);
    let dir = TempDir::new("mcp-loop-elicit");
    dir.write(
        "flow.yaml",
        loop_flow(&llm.base_url(), "[fixture]", "    tools: [elicit]", ""),
    );
    let out = run_flow(&dir);
    assert_eq!(out.code(), 3, "{out:?}");
    assert!(out.stderr.contains("asks: Delete?"), "{}", out.stderr);
    let id = run_id_from(&out.stderr);
    assert_eq!(llm.hits().len(), 1);
    let done = resume(&dir, &id, r#"{"ok": false}"#);
    assert_eq!(done.code(), 0, "{done:?}");
    let hits = llm.hits();
    assert_eq!(hits.len(), 2, "the model is not asked again for the first turn");
    let told = &tool_messages(&hits[1].body)[0].1;
    let told: Value = serde_json::from_str(told).unwrap_or_else(|e| panic!("{e}: {told}"));
    assert_eq!(told["answer"]["content"], json!({"ok": false}));
    let recs = records(&dir, &id);
    assert_eq!(record(&recs, "1.t1.1.e1")["status"], "succeeded");
}

/// `switchyard` killed with SIGKILL while a loop's MCP call is in flight: on `resume` a
/// non-idempotent call is in doubt, and one the server lists as `idempotent` is sent again.
#[test]
fn a_loop_killed_mid_call_resumes_in_doubt_or_sends_again() {
    for idempotent in [false, true] {
        let llm = Llm::start();
        llm.script([
            Reply::calls(1, &[("fixture__slow", r#"{"ms": 1500}"#)]),
            Reply::Answer("done".into()),
        ]);
        let dir = TempDir::new(&format!("mcp-loop-kill-{idempotent}"));
        let server = if idempotent {
            "    tools: [slow]\n    idempotent: [slow]"
        } else {
            "    tools: [slow]"
        };
        dir.write("flow.yaml", loop_flow(&llm.base_url(), "[fixture]", server, ""));
        let mut child = switchyard(dir.path())
            .args(["run", "flow.yaml", "--input", r#"{"text": "go"}"#])
            .args(STORE)
            .stderr(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("switchyard starts");
        // The call is in flight once the model's first turn is answered and the call's
        // attempt is on record; the fixture sleeps 1.5 s.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while llm.hits().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(600));
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        let id = run_id_from_list(&dir);
        let out = run(switchyard(dir.path()).args(["resume", &id]).args(STORE));
        if idempotent {
            assert_eq!(out.code(), 0, "{out:?}");
            assert_eq!(llm.hits().len(), 2);
        } else {
            assert_eq!(out.code(), 3, "{out:?}");
            assert!(out.stderr.contains("interrupted[in_doubt]"), "{}", out.stderr);
            assert_eq!(llm.hits().len(), 1, "the model is not asked again");
        }
    }
}

/// The id of the one root run in the store of `dir`.
fn run_id_from_list(dir: &TempDir) -> String {
    let list = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(STORE));
    let first = list.stdout.lines().next().expect("a run");
    serde_json::from_str::<Value>(first).expect("a JSON line")["id"]
        .as_str()
        .expect("an id")
        .to_owned()
}
