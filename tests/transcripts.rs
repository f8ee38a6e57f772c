//! Agent loops seen wherever they run (SPEC §6.3, §13), through the real binary and SQLite:
//! `runs show --transcript` (and `--json --transcript`) prints the conversation of a loop in a
//! `foreach` iteration, a `parallel` branch and a child run, each headed by its record; the
//! run page's timeline puts a step's row above its loop's turns and calls (checked in headless
//! Chromium); a run waiting for a human shows the question and the command that answers it on
//! its page; a batch's page names its flow and when it started.

use serde_json::{Value, json};

use crate::mock_server::{Llm, Reply};
use crate::report::{Driver, Session};
use crate::support::{Output, TempDir, run, run_id_from, switchyard};

const STORE: [&str; 2] = ["--store", "sqlite:runs.db"];

/// The model of every loop here: a first turn calls `lookup` with the task, the next
/// answers `done <task>`.
fn model(body: &Value) -> Reply {
    let messages = body["messages"].as_array().expect("messages");
    let task = messages
        .iter()
        .filter_map(|m| m["content"].as_str())
        .find_map(|c| c.strip_prefix("Task: "))
        .unwrap_or("?")
        .to_owned();
    if messages.iter().any(|m| m["role"] == "tool") {
        Reply::Answer(format!("done {task}"))
    } else {
        Reply::calls(1, &[("lookup", &format!(r#"{{"q": "{task}"}}"#))])
    }
}

/// Flow `spread`: step `each` runs agent loop `helper` over `$.tasks` (a `foreach`), then
/// step `both` runs it in branch `a` and, in branch `b`, flow `sub` (`sub.yaml`), whose step
/// `inner` runs a loop of its own.
fn spread_flow(base_url: &str) -> String {
    format!(
        r#"flow: spread
providers:
  local:
    base_url: {base_url}
agents:
  helper:
    kind: llm
    provider: local
    model: m1
    system: You help.
    prompt: "Task: {{{{ input.task }}}}"
    tools: [lookup]
  lookup:
    kind: mock
    returns: {{found: "=input.q"}}
  sub:
    kind: flow
    path: sub.yaml
steps:
  each:
    foreach: $.tasks
    agent: helper
    input: {{$.task: "=item"}}
    output: {{$.each: $}}
    next: both
  both:
    parallel:
      a: {{agent: helper, input: {{$.task: "=\"branch\""}}, output: {{$.a: $}}}}
      b: {{agent: sub, input: {{$.task: "=\"child\""}}, output: {{$.b: $}}}}
"#
    )
}

fn sub_flow(base_url: &str) -> String {
    format!(
        r#"flow: sub
providers:
  local:
    base_url: {base_url}
agents:
  helper:
    kind: llm
    provider: local
    model: m1
    system: You help.
    prompt: "Task: {{{{ input.task }}}}"
    tools: [lookup]
  lookup:
    kind: mock
    returns: {{found: "=input.q"}}
steps:
  inner:
    agent: helper
    input: {{$.task: $.task}}
    output: {{$.r: $}}
output:
  select: $.r
"#
    )
}

/// Runs `spread.yaml` (and `sub.yaml`) on `tasks` into `runs.db` of a new directory; the
/// directory and the run's id.
fn run_spread(name: &str, server: &Llm, tasks: Value) -> (TempDir, String) {
    let dir = TempDir::new(name);
    dir.write("spread.yaml", spread_flow(&server.base_url()));
    dir.write("sub.yaml", sub_flow(&server.base_url()));
    let out = run(switchyard(dir.path())
        .args([
            "run",
            "spread.yaml",
            "--input",
            &json!({"tasks": tasks}).to_string(),
        ])
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    let id = newest_run(&dir);
    (dir, id)
}

/// The id of the newest root run in `runs.db` of `dir`.
fn newest_run(dir: &TempDir) -> String {
    let list = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(STORE));
    let first = list.stdout.lines().next().expect("a run");
    serde_json::from_str::<Value>(first).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn show(dir: &TempDir, args: &[&str]) -> Output {
    let out = run(switchyard(dir.path())
        .args(["runs", "show"])
        .args(args)
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    out
}

/// The messages printed under the transcript headed `head`, trimmed.
fn printed_transcript<'a>(text: &'a str, head: &str) -> Vec<&'a str> {
    let mut lines = text.lines().skip_while(|l| l.trim() != head);
    assert!(lines.next().is_some(), "no `{head}` in:\n{text}");
    let n: usize = head
        .rsplit_once(" (")
        .and_then(|(_, n)| n.strip_suffix(" messages):"))
        .and_then(|n| n.parse().ok())
        .expect("a message count");
    lines.take(n).map(str::trim).collect()
}

/// The conversation of a loop of `helper` on `task`.
fn conversation(task: &str) -> Vec<String> {
    vec![
        "system: You help.".into(),
        format!("user: Task: {task}"),
        format!(r#"assistant: → lookup({{"q": "{task}"}}) [call_1_1]"#),
        format!(r#"tool: [call_1_1] {{"found":"{task}"}}"#),
        format!("assistant: done {task}"),
    ]
}

/// `runs show --transcript` prints the conversation of every agent loop of the run tree: in
/// each `foreach` iteration, in a `parallel` branch and in the child run of another branch,
/// each headed by its record's number and step; without the flag, a line under each says how
/// to see it. `--json --transcript` lists the same transcripts, child runs' included.
#[test]
fn transcripts_of_loops_in_iterations_branches_and_child_runs() {
    let server = Llm::start();
    server.respond_with(model);
    let (dir, id) = run_spread("tx-spread", &server, json!(["one", "two"]));

    let full = show(&dir, &[&id, "--transcript"]).stdout;
    let expected = [
        ("1[0] each", "one"),
        ("1[1] each", "two"),
        ("2.a both", "branch"),
        ("2.b.1 inner", "child"),
    ];
    for (record, task) in expected {
        let head = format!("transcript of {record} (5 messages):");
        assert_eq!(printed_transcript(&full, &head), conversation(task), "{full}");
    }
    // Each under its own record's line.
    let heads: Vec<&str> = full
        .lines()
        .filter(|l| l.contains("transcript of "))
        .map(str::trim)
        .collect();
    assert_eq!(heads.len(), 4, "{full}");
    for (record, _) in expected {
        let (number, _) = record.split_once(' ').unwrap();
        let at = full.find(&format!("transcript of {record} ")).unwrap();
        let line = full[..at].lines().rev().find(|l| l.contains('✓')).unwrap();
        assert!(
            line.trim_start().starts_with(&format!("✓ {number} ")),
            "{line}\n{full}"
        );
        assert!(line.contains(" · 2 turns, 1 tool call · "), "{line}");
    }

    let short = show(&dir, &[&id]).stdout;
    assert_eq!(
        short
            .matches("transcript: 5 messages (`runs show --transcript` prints them)")
            .count(),
        4,
        "{short}"
    );
    assert!(!short.contains("user: Task:"), "{short}");

    let doc: Value = serde_json::from_str(&show(&dir, &[&id, "--json", "--transcript"]).stdout).unwrap();
    let listed: Vec<(String, String, String)> = doc["transcripts"]
        .as_array()
        .expect("transcripts")
        .iter()
        .map(|t| {
            let messages = t["messages"].as_array().unwrap();
            (
                t["number"].as_str().unwrap().to_owned(),
                t["step"].as_str().unwrap().to_owned(),
                messages.last().unwrap()["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, String, String)> = expected
        .iter()
        .map(|(record, task)| {
            let (number, step) = record.split_once(' ').unwrap();
            (number.to_owned(), step.to_owned(), format!("done {task}"))
        })
        .collect();
    assert_eq!(listed, want, "{doc}");
    let child = doc["children"][0]["id"].as_str().unwrap();
    assert_eq!(doc["transcripts"][3]["run"], child, "{doc}");
    assert!(
        show(&dir, &[&id, "--json"])
            .stdout
            .find("\"transcripts\"")
            .is_none()
    );
}

/// The numbers of the timeline's record rows of the page at `path`, in document order, each
/// with the top of its row on the screen.
fn timeline(s: &Session, path: &std::path::Path) -> Vec<(String, f64)> {
    s.post("/url", json!({"url": format!("file://{}", path.display())}));
    let rows = s.script(
        "return Array.from(document.querySelectorAll('#timeline tr.rec')).map(r =>
           [r.querySelector('td.name').textContent, r.getBoundingClientRect().top]);",
    );
    assert!(s.console_errors().is_empty(), "{:?}", s.console_errors());
    rows.as_array()
        .expect("rows")
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_owned(), r[1].as_f64().unwrap()))
        .collect()
}

/// On the run page, a step's row comes before its loop's turns and tool calls, an iteration's
/// and a branch's before theirs, and a child run's under the branch that started it: in the
/// document and on the screen.
#[test]
fn the_timeline_puts_each_row_above_its_loops_turns_and_calls() {
    let server = Llm::start();
    server.respond_with(model);
    let (dir, id) = run_spread("tx-timeline", &server, json!(["one", "two"]));
    let page = dir.write("run.html", show(&dir, &[&id, "--format", "html"]).stdout);

    let driver = Driver::start();
    let s = Session::new(&driver, &dir.path().join("profile"));
    let rows = timeline(&s, &page);
    let numbers: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        numbers,
        [
            "1",
            "1[0]",
            "1[0].t1",
            "1[0].t1.1",
            "1[0].t2",
            "1[1]",
            "1[1].t1",
            "1[1].t1.1",
            "1[1].t2",
            "2",
            "2.a",
            "2.a.t1",
            "2.a.t1.1",
            "2.a.t2",
            "2.b",
            "2.b.1",
            "2.b.1.t1",
            "2.b.1.t1.1",
            "2.b.1.t2",
        ],
        "{rows:?}"
    );
    assert!(
        rows.windows(2).all(|w| w[0].1 < w[1].1),
        "rows overlap or go up: {rows:?}"
    );

    // A plain agent step: its row, then its turns and call.
    let flow = sub_flow(&server.base_url()).replace("output:\n  select: $.r\n", "");
    dir.write("plain.yaml", flow);
    let out = run(switchyard(dir.path())
        .args(["run", "plain.yaml", "--input", r#"{"task": "plain"}"#])
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    let id = newest_run(&dir);
    let page = dir.write("plain.html", show(&dir, &[&id, "--format", "html"]).stdout);
    let rows = timeline(&s, &page);
    let numbers: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(numbers, ["1", "1.t1", "1.t1.1", "1.t2"], "{rows:?}");
    assert!(rows.windows(2).all(|w| w[0].1 < w[1].1), "{rows:?}");
}

/// The text of the page at `path`'s `#waiting` section, empty when there is none.
fn waiting_text(s: &Session, path: &std::path::Path) -> String {
    s.post("/url", json!({"url": format!("file://{}", path.display())}));
    let text = s.script("var w = document.getElementById('waiting'); return w ? w.innerText : '';");
    assert!(s.console_errors().is_empty(), "{:?}", s.console_errors());
    text.as_str().expect("text").to_owned()
}

/// The command `runs show` says answers the run: the text between "answer: `" and "`".
fn answer_of(show: &str) -> String {
    let at = show
        .find("answer: `")
        .unwrap_or_else(|| panic!("no answer in:\n{show}"))
        + "answer: `".len();
    show[at..].split('`').next().unwrap().to_owned()
}

/// Runs the command `command` (`switchyard resume … --decision JSON …`) with `decision` for
/// its `JSON`.
fn answer(dir: &TempDir, command: &str, decision: &str) -> Output {
    let words: Vec<&str> = command.split(' ').collect();
    assert_eq!(words[..2], ["switchyard", "resume"], "{command}");
    let args: Vec<&str> = words[1..]
        .iter()
        .map(|w| if *w == "JSON" { decision } else { w })
        .collect();
    run(switchyard(dir.path()).args(args))
}

/// A run stopped for approval of an agent loop's call, or at an `interrupt` step: its page
/// shows the proposed call (tool and arguments) or the question, and the command that answers
/// it, the same as `runs show` prints; that command, given the decision, continues the run.
#[test]
fn a_waiting_runs_page_shows_the_question_and_the_command_that_answers_it() {
    let server = Llm::start();
    server.respond_with(model);
    let dir = TempDir::new("tx-waiting");
    let flow = sub_flow(&server.base_url()).replace(
        "    tools: [lookup]\n",
        "    tools: [lookup]\n    approve: [lookup]\n",
    );
    dir.write("approve.yaml", flow);
    let out = run(switchyard(dir.path())
        .args(["run", "approve.yaml", "--input", r#"{"task": "refund"}"#])
        .args(STORE));
    assert_eq!(out.code(), 3, "{out:?}");
    let id = run_id_from(&out.stderr);
    let text = show(&dir, &[&id]).stdout;
    let command = answer_of(&text);
    assert_eq!(
        command,
        format!("switchyard resume {id} --decision JSON --store sqlite:runs.db")
    );
    assert!(text.contains(r#"call 1: lookup {"q":"refund"}"#), "{text}");
    let page = dir.write("approve.html", show(&dir, &[&id, "--format", "html"]).stdout);

    let driver = Driver::start();
    let s = Session::new(&driver, &dir.path().join("profile"));
    let waiting = waiting_text(&s, &page);
    for needle in [
        "Waiting for approval of the calls an agent loop proposed (step inner · number 1.t1.approval)",
        "call 1\nlookup {\"q\":\"refund\"}",
        &format!("answer\n{command}"),
        "decision\n{\"approve\": true} | {\"edit\": {<arguments>}} | {\"reject\": \"why\"}",
    ] {
        assert!(waiting.contains(needle), "no `{needle}` in:\n{waiting}");
    }
    let done = answer(&dir, &command, r#"{"approve": true}"#);
    assert_eq!(done.code(), 0, "{done:?}");
    assert!(done.stdout.contains("done refund"), "{done:?}");
    let page = dir.write("done.html", show(&dir, &[&id, "--format", "html"]).stdout);
    assert_eq!(waiting_text(&s, &page), "", "an answered run waits for nothing");

    // An `interrupt` step: the prompt, the decision's schema and the command.
    dir.write(
        "ask.yaml",
        "flow: ask\nsteps:\n  ask:\n    interrupt:\n      prompt: \"Refund {{ input.amount }} cents?\"\n      \
         schema: {type: object, required: [ok], properties: {ok: {type: boolean}}}\n    \
         input: {$.amount: $.amount}\n    output: {$.ok: $.ok}\n",
    );
    let out = run(switchyard(dir.path())
        .args(["run", "ask.yaml", "--input", r#"{"amount": 250}"#])
        .args(STORE));
    assert_eq!(out.code(), 3, "{out:?}");
    let id = run_id_from(&out.stderr);
    let command = answer_of(&show(&dir, &[&id]).stdout);
    let page = dir.write("ask.html", show(&dir, &[&id, "--format", "html"]).stdout);
    let waiting = waiting_text(&s, &page);
    for needle in [
        "Waiting for a decision (step ask · number 1)",
        "prompt\nRefund 250 cents?",
        "decision schema\n{\"type\":\"object\",\"required\":[\"ok\"],\"properties\":{\"ok\":{\"type\":\"boolean\"}}}",
        &format!("answer\n{command}"),
    ] {
        assert!(waiting.contains(needle), "no `{needle}` in:\n{waiting}");
    }
    let done = answer(&dir, &command, r#"{"ok": true}"#);
    assert_eq!(done.code(), 0, "{done:?}");
}

/// The header of a batch's page names the flow the batch ran and when it started (its first
/// run's start, in UTC), from the store; a submitted batch's, when it was submitted. A store
/// without the batch's runs leaves them unknown, and says so.
#[test]
fn a_batch_report_names_its_flow_and_when_it_started() {
    let dir = TempDir::new("tx-batch");
    dir.write(
        "double.yaml",
        "flow: doubler\nagents:\n  double:\n    kind: transform\n    result: {v: =input.n * 2}\n\
         steps:\n  go:\n    agent: double\n    output: {$.v: $.v}\n",
    );
    dir.write(
        "in.jsonl",
        "{\"id\": 1, \"n\": 1}\n{\"id\": 2, \"n\": 2}\n{\"id\": 3, \"n\": 3}\n",
    );
    let out = run(switchyard(dir.path())
        .args([
            "batch",
            "double.yaml",
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
        ])
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    let list = run(switchyard(dir.path())
        .args(["runs", "list", "--json"])
        .args(STORE));
    let first = list
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["started_at"]
                .as_u64()
                .unwrap()
        })
        .min()
        .expect("runs");
    let when = utc(first);

    let header = |args: &[&str], page: &str| {
        let out = run(switchyard(dir.path())
            .arg("report")
            .args(args)
            .arg("--no-run-pages"));
        assert_eq!(out.code(), 0, "{out:?}");
        let html = std::fs::read_to_string(dir.path().join(page)).unwrap();
        let at = html
            .find("<div id=\"batch-of\">")
            .expect("the header's flow line");
        html[at..html[at..].find("</div>").unwrap() + at].to_owned()
    };
    let h = header(&["out.jsonl", "--store", "sqlite:runs.db"], "out.report.html");
    assert!(h.contains("flow <b>doubler</b>"), "{h}");
    assert!(h.contains(&format!("started <time>{when}</time> (UTC)")), "{h}");
    let h = header(&["out.jsonl", "--store", "memory"], "out.report.html");
    assert!(
        h.contains("flow unknown: the store read holds none of its runs"),
        "{h}"
    );
    assert!(!h.contains("started"), "{h}");

    // A submitted batch: the flow and the time it was submitted.
    let before = now_ms();
    let out = run(switchyard(dir.path())
        .args([
            "submit",
            "double.yaml",
            "--input",
            "in.jsonl",
            "--batch",
            "nightly",
        ])
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    let after = now_ms();
    let h = header(
        &["--batch", "nightly", "--store", "sqlite:runs.db"],
        "nightly.report.html",
    );
    assert!(h.contains("flow <b>doubler</b>"), "{h}");
    let shown = h
        .split("<time>")
        .nth(1)
        .and_then(|t| t.split("</time>").next())
        .unwrap_or_else(|| panic!("no time in {h}"));
    assert!(
        (before / 1000..=after / 1000).any(|s| utc(s * 1000) == shown),
        "{shown} is not between {} and {}",
        utc(before),
        utc(after)
    );
}

/// Unix milliseconds as the page writes them: RFC 3339 in UTC, to the second.
fn utc(ms: u64) -> String {
    switchyard::__private::expr::time::Timestamp::from_unix_secs((ms / 1000) as i64)
        .unwrap()
        .to_string()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Branches are shown in the order they are written, whatever order they finished in: branch
/// `slow`, written first, finishes after `fast`. `runs show` and the run page list `slow`
/// first; a tool call's row on the page names its tool.
#[test]
fn branches_are_shown_as_written_and_tool_rows_name_their_tool() {
    let server = Llm::start();
    server.respond_with(model);
    let dir = TempDir::new("tx-branch-order");
    dir.write(
        "order.yaml",
        format!(
            r#"flow: order
providers:
  local:
    base_url: {}
agents:
  helper:
    kind: llm
    provider: local
    model: m1
    prompt: "Task: {{{{ input.task }}}}"
    tools: [lookup]
  lookup:
    kind: mock
    returns: {{found: "=input.q"}}
  slow:
    kind: mock
    latency: 400ms
    returns: {{v: 1}}
  fast:
    kind: mock
    returns: {{v: 2}}
steps:
  both:
    parallel:
      zslow: {{agent: slow, output: {{$.s: $.v}}}}
      fast: {{agent: fast, output: {{$.f: $.v}}}}
      mid: {{agent: helper, input: {{$.task: "=\"m\""}}, output: {{$.m: $}}}}
"#,
            server.base_url()
        ),
    );
    let out = run(switchyard(dir.path())
        .args(["run", "order.yaml", "--input", "{}"])
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    let id = newest_run(&dir);

    // Recorded as they finished: `fast` before `zslow`.
    let json: Value = serde_json::from_str(&show(&dir, &[&id, "--json"]).stdout).unwrap();
    let recorded: Vec<&str> = json["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "branch")
        .map(|s| s["number"].as_str().unwrap())
        .collect();
    let at = |list: &[&str], n: &str| list.iter().position(|x| *x == n).unwrap();
    assert!(at(&recorded, "1.fast") < at(&recorded, "1.zslow"), "{recorded:?}");

    let text = show(&dir, &[&id]).stdout;
    let pos = |n: &str| {
        text.find(&format!("{n} branch"))
            .unwrap_or_else(|| panic!("{n} in {text}"))
    };
    assert!(
        pos("1.zslow") < pos("1.fast") && pos("1.fast") < pos("1.mid"),
        "{text}"
    );

    let html = show(&dir, &[&id, "--format", "html"]).stdout;
    let row = |n: &str| html.find(&format!(">{n}</td>")).unwrap_or_else(|| panic!("{n}"));
    assert!(row("1.zslow") < row("1.fast") && row("1.fast") < row("1.mid"));
    assert!(html.contains("<td>tool lookup</td>"), "no row names the tool");
}
