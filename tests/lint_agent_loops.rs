//! Lint of agent loops (SPEC §6.3) beyond the rules' own fixtures (`unknown-tool`,
//! `tool-cycle`, `loop-setting-without-tools`, `tool-input-not-object`, and the tools cases of
//! `unknown-agent`, `capability-not-allowed`, `limit-out-of-range`, `invalid-schema`,
//! `missing-file`): a whole loop that lints clean, the type of its answer, and loops defined in
//! an imported file.

use crate::support::{self, TempDir};

/// An agent loop with every setting: tools as a map, an `until_tool` whose result is the
/// answer (typed by that tool's `result_schema`), an approval, bounds and tool inputs.
const CLEAN_LOOP: &str = r#"flow: support
input:
  schema:
    type: object
    properties: {text: {type: string}}
    required: [text]
providers:
  local: {base_url: "http://127.0.0.1:8000/v1"}
agents:
  kb_search:
    kind: mock
    description: search the knowledge base
    returns: {hits: []}
    input_schema:
      type: object
      properties: {query: {type: string}}
      required: [query]
  refund:
    kind: mock
    returns: {ok: true}
    input_schema: {type: object, properties: {amount: {type: number}}}
  submit:
    kind: mock
    returns: {answer: "done", confidence: 0.9}
    result_schema:
      type: object
      properties: {answer: {type: string}, confidence: {type: number}}
      required: [answer, confidence]
      additionalProperties: false
  support:
    kind: llm
    provider: local
    model: m
    prompt: "{{ input.text }}"
    tools:
      kb_search:
      refund: {description: refund the customer}
      submit: {description: submit the final answer}
    max_iterations: 12
    max_parallel_tools: 2
    until_tool: submit
    approve: [refund]
steps:
  answer:
    agent: support
    input: {$.text: $.text}
    output: {$.answer: $.answer, $.confidence: $.confidence}
    next:
      - to: escalate
        if: =result.confidence < 0.5
      - to: end
  escalate:
    set: {$.escalated: "=payload.answer"}
"#;

#[test]
fn a_clean_agent_loop_lints_clean() {
    let dir = TempDir::new("loop-clean");
    dir.write("loop.yaml", CLEAN_LOOP);
    let out = support::lint_json(dir.path(), &["loop.yaml"]);
    assert_eq!(out.diagnostics(), Vec::new());
    assert_eq!(out.code(), 0, "{out:?}");
}

#[test]
fn the_answer_of_a_loop_with_until_tool_is_that_tools_result() {
    let dir = TempDir::new("loop-answer");
    let typo = CLEAN_LOOP.replace("$.confidence: $.confidence", "$.confidence: $.confidense");
    assert_ne!(typo, CLEAN_LOOP);
    dir.write("loop.yaml", &typo);
    let out = support::lint_json(dir.path(), &["loop.yaml"]);
    let found: Vec<(String, String, Option<String>)> = out
        .diagnostics()
        .into_iter()
        .map(|d| (d.code, d.message, d.help))
        .collect();
    assert_eq!(
        found,
        vec![(
            "SY414".to_string(),
            "`$.confidense` can never match the result of `answer`: `$` has no field `confidense`"
                .to_string(),
            Some("did you mean `confidence`?".to_string())
        )]
    );
    // An expression reading the answer is checked against the tool's `result_schema`.
    let typo = CLEAN_LOOP.replace("=result.confidence < 0.5", "=result.confidense < 0.5");
    assert_ne!(typo, CLEAN_LOOP);
    dir.write("loop.yaml", &typo);
    let found: Vec<(String, String)> = support::lint_json(dir.path(), &["loop.yaml"])
        .diagnostics()
        .into_iter()
        .map(|d| (d.code, d.message))
        .collect();
    assert_eq!(
        found,
        vec![(
            "SY405".to_string(),
            "`result` has no field `confidense` in the `result_schema` of `submit`, whose result is the answer of `answer`'s agent"
                .to_string()
        )]
    );
    // Without `until_tool` the answer is the model's text, which has no `answer`.
    let text = CLEAN_LOOP.replace("    until_tool: submit\n", "");
    assert_ne!(text, CLEAN_LOOP);
    dir.write("loop.yaml", &text);
    let codes: Vec<String> = support::lint_json(dir.path(), &["loop.yaml"])
        .diagnostics()
        .into_iter()
        .map(|d| d.code)
        .collect();
    assert!(codes.contains(&"SY414".to_string()), "{codes:?}");
}

const LIBRARY: &str = "\
# Shared agents: a loop whose tools the flow importing it provides.
providers:
  local: {base_url: \"http://127.0.0.1:8000/v1\"}
agents:
  researcher:
    kind: llm
    provider: local
    model: m
    tools: [kb_search]
";

#[test]
fn an_imported_loop_names_its_tools_in_the_flow_that_calls_it() {
    let dir = TempDir::new("loop-import");
    dir.write("lib.yaml", LIBRARY);
    let flow = |tool: &str| {
        format!(
            "flow: research\nimports: [lib.yaml]\nallow: [llm, mock]\nagents:\n{tool}steps:\n  go:\n    agent: researcher\n    output: {{$.r: $}}\n"
        )
    };
    dir.write("with.yaml", flow("  kb_search: {kind: mock, returns: {}}\n"));
    let out = support::lint_json(dir.path(), &["with.yaml"]);
    assert_eq!(out.diagnostics(), Vec::new());
    // A flow that provides no `kb_search`: the tool names no agent there.
    dir.write("without.yaml", flow("  other: {kind: mock, returns: {}}\n"));
    let out = support::lint_json(dir.path(), &["without.yaml"]);
    let found: Vec<(String, String, String, usize)> = out
        .diagnostics()
        .into_iter()
        .map(|d| (d.code, d.message, d.file, d.line))
        .collect();
    assert_eq!(
        found,
        vec![(
            "SY202".to_string(),
            "tool `kb_search` of agent loop `researcher` names no agent".to_string(),
            "lib.yaml".to_string(),
            9
        )]
    );
    // The importing flow's ceiling bounds the imported loop's tools.
    dir.write(
        "command.yaml",
        flow("  kb_search: {kind: command, run: [echo]}\n"),
    );
    let out = support::lint_json(dir.path(), &["command.yaml"]);
    let found: Vec<(String, String)> = out
        .diagnostics()
        .into_iter()
        .map(|d| (d.code, d.message))
        .collect();
    assert_eq!(
        found,
        vec![(
            "SY501".to_string(),
            "tool `kb_search` of agent loop `researcher` is a `command` agent, which is not allowed here"
                .to_string()
        )]
    );
}
