//! MCP calls in traces (SPEC §13, OpenTelemetry's MCP conventions): a plain `kind: mcp` step's
//! call is a `tools/call {tool}` client span under its step's, and a loop's MCP tool call
//! keeps its `execute_tool` span with the MCP attributes added, over stdio and Streamable HTTP.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};

use crate::mock_server::{Llm, Reply};
use crate::otel::{Collector, attr};
use crate::support::{TempDir, mcp_fixture, run, switchyard};

#[test]
fn mcp_calls_follow_the_mcp_conventions() {
    let llm = Llm::start();
    llm.script([
        Reply::calls(1, &[("fixture__add", r#"{"a": 2, "b": 3}"#)]),
        Reply::Answer("5".into()),
    ]);
    let mut web = Command::new(mcp_fixture())
        .args(["--http", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the fixture starts");
    let mut url = String::new();
    BufReader::new(web.stdout.take().expect("piped"))
        .read_line(&mut url)
        .expect("the fixture prints its url");
    let port = url
        .trim()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches("/mcp")
        .to_string();
    let dir = TempDir::new("otel-mcp");
    dir.write(
        "flow.yaml",
        format!(
            r#"flow: traced-mcp
providers:
  local: {{base_url: "{base}"}}
mcp_servers:
  fixture:
    command: ["{fixture}"]
    tools: ["*"]
  web:
    url: {url}
    tools: [echo]
agents:
  echo: {{kind: mcp, server: fixture, tool: echo}}
  remote: {{kind: mcp, server: web, tool: echo}}
  helper: {{kind: llm, provider: local, model: m1, prompt: "add", tools: [fixture.add]}}
steps:
  first: {{agent: echo, input: {{$.text: $.text}}, output: {{$.a: $}}, next: second}}
  second: {{agent: remote, input: {{$.text: $.text}}, output: {{$.b: $}}, next: third}}
  third: {{agent: helper, input: {{}}, output: {{$.c: $}}}}
"#,
            base = llm.base_url(),
            fixture = mcp_fixture().display(),
            url = url.trim()
        ),
    );
    let c = Collector::start();
    let out = run(switchyard(dir.path())
        .args(["run", "flow.yaml", "--input", r#"{"text": "hi"}"#])
        .args(["--otlp-endpoint", &c.url]));
    let _ = web.kill();
    let _ = web.wait();
    assert_eq!(out.code(), 0, "{out:?}");
    let spans = c.spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let named = |name: &str| spans.iter().filter(|s| s.name == name).collect::<Vec<_>>();
    let parent_of = |s: &opentelemetry_proto::tonic::trace::v1::Span| {
        spans
            .iter()
            .find(|p| p.span_id == s.parent_span_id)
            .map(|p| p.name.clone())
    };

    // The plain steps' calls: client spans under their steps.
    let calls = named("tools/call echo");
    assert_eq!(calls.len(), 2, "{names:?}");
    for s in &calls {
        assert_eq!(s.kind, 3, "a client span");
        assert_eq!(attr(s, "mcp.method.name").as_deref(), Some("tools/call"));
        assert_eq!(attr(s, "gen_ai.operation.name").as_deref(), Some("execute_tool"));
        assert_eq!(attr(s, "gen_ai.tool.name").as_deref(), Some("echo"));
        assert_eq!(attr(s, "mcp.protocol.version").as_deref(), Some("2026-07-28"));
    }
    let stdio = calls
        .iter()
        .find(|s| parent_of(s).as_deref() == Some("step first"))
        .expect("the stdio call under `step first`");
    assert_eq!(attr(stdio, "network.transport").as_deref(), Some("pipe"));
    assert_eq!(attr(stdio, "switchyard.mcp.server").as_deref(), Some("fixture"));
    assert_eq!(attr(stdio, "server.address"), None);
    let http = calls
        .iter()
        .find(|s| parent_of(s).as_deref() == Some("step second"))
        .expect("the HTTP call under `step second`");
    assert_eq!(attr(http, "network.transport").as_deref(), Some("tcp"));
    assert_eq!(attr(http, "network.protocol.name").as_deref(), Some("http"));
    assert_eq!(attr(http, "server.address").as_deref(), Some("127.0.0.1"));
    assert_eq!(attr(http, "server.port"), Some(port));

    // The loop's MCP tool call: its GenAI span carries the MCP attributes; no second span.
    let tool = named("execute_tool fixture__add");
    assert_eq!(tool.len(), 1, "{names:?}");
    let tool = tool[0];
    assert_eq!(attr(tool, "gen_ai.tool.name").as_deref(), Some("fixture__add"));
    assert_eq!(attr(tool, "mcp.method.name").as_deref(), Some("tools/call"));
    assert_eq!(attr(tool, "network.transport").as_deref(), Some("pipe"));
    assert_eq!(attr(tool, "switchyard.mcp.server").as_deref(), Some("fixture"));
    assert!(!names.contains(&"tools/call add"), "{names:?}");
    // Other steps have no MCP attributes.
    let third = named("step third");
    assert_eq!(attr(third[0], "mcp.method.name"), None);
}
