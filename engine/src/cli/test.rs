//! `switchyard test PATH...`: runs the `tests:` of flows (SPEC §11) with mocked agents.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::agents::AgentState;
use crate::expr::value;
use crate::model::{FlowTest, RunStatusExpect};
use crate::plan::AgentChanges;
use crate::plan::{AgentPlan, AgentPlanSpec, Plan};
use crate::project::Project;
use crate::record::RunStatus;
use crate::runtime::changes;
use crate::runtime::engine::{Engine, RunOptions, RunOutcome};
use crate::store::memory::MemoryStore;
use crate::syntax::Limits;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Agents named under a test's `mocks:` are replaced by mocks in every flow of the run;\n\
                        an `llm`, `http` or `command` agent that a test calls without mocking it fails the\n\
                        test. Exit status: 0 all passed, 1 a test failed, 2 invalid flow or usage."
)]
pub struct Args {
    /// Flow files and directories (searched for *.yaml and *.yml with `tests:`).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Run only tests whose name contains this text.
    #[arg(long)]
    pub filter: Option<String>,
}

pub fn run(args: Args) -> u8 {
    let files = match super::lint::collect(&args.paths, None) {
        Ok(f) => f,
        Err(e) => {
            super::stderr::error(e);
            return super::exit::USAGE;
        }
    };
    let rt = super::common::runtime();
    let (mut passed, mut failed, mut invalid) = (0usize, 0usize, false);
    for (file, root) in &files {
        let root = root.canonicalize().unwrap_or_else(|_| root.clone());
        let mut project = Project::default();
        let Some(id) = project.load_top(file, root, &Limits::default()) else {
            continue;
        };
        let Some(flow) = project.flow(id).flow.as_ref() else {
            // The file did not parse as a flow: whatever tests it holds cannot run. Saying
            // nothing would count it as passed.
            let diags = crate::lint::lint_project(&project);
            let opts = crate::diag::render::HumanOptions {
                color: super::color_stderr(),
                width: super::width(),
            };
            eprint!("{}", crate::diag::render::human(&diags, &project.sources, &opts));
            eprintln!(
                "error: `{}` is not a valid flow; its tests did not run",
                file.display()
            );
            invalid = true;
            continue;
        };
        let tests: Vec<FlowTest> = flow.tests.clone();
        if tests.is_empty() {
            continue;
        }
        let (plan, diags) = crate::lint::lint_and_compile(&project, id);
        let Some(plan) = plan else {
            let opts = crate::diag::render::HumanOptions {
                color: super::color_stderr(),
                width: super::width(),
            };
            eprint!("{}", crate::diag::render::human(&diags, &project.sources, &opts));
            eprintln!(
                "error: `{}` does not lint clean; its tests did not run",
                file.display()
            );
            invalid = true;
            continue;
        };
        let plan = Arc::new(plan);
        let text = project.sources.get(project.flow(id).file).text.clone();
        let selected: Vec<&FlowTest> = tests
            .iter()
            .filter(|t| {
                args.filter
                    .as_ref()
                    .is_none_or(|f| t.name.value.contains(f.as_str()))
            })
            .collect();
        // What the mocks script for agent loops, checked before anything runs: all of the
        // file's problems at once, each at its place.
        let turn_diags: Vec<Vec<crate::diag::Diagnostic>> =
            selected.iter().map(|t| mock_turn_diagnostics(&plan, t)).collect();
        let all: Vec<crate::diag::Diagnostic> = turn_diags.iter().flatten().cloned().collect();
        if !all.is_empty() {
            let opts = crate::diag::render::HumanOptions {
                color: super::color_stderr(),
                width: super::width(),
            };
            eprint!("{}", crate::diag::render::human(&all, &project.sources, &opts));
        }
        for (t, diags) in selected.into_iter().zip(&turn_diags) {
            let errors: Vec<&crate::diag::Diagnostic> = diags
                .iter()
                .filter(|d| d.severity == crate::diag::Severity::Error)
                .collect();
            if !errors.is_empty() {
                failed += 1;
                invalid = true;
                println!("FAILED {} :: {}", display(file), t.name.value);
                println!("       not run: the turns its mocks script are malformed");
                for d in errors {
                    let f = project.sources.get(d.primary.span.file);
                    let (line, col) = f.line_col(d.primary.span.start as usize);
                    println!(
                        "       {}:{line}:{col}: {}[{}]: {}",
                        f.name,
                        d.severity.as_str(),
                        d.rule.code,
                        d.message
                    );
                }
                continue;
            }
            let dir = project.flow(id).path.parent().unwrap_or(Path::new("."));
            let result = rt.block_on(run_test(&plan, t, &text, dir));
            match result {
                Ok(()) => {
                    passed += 1;
                    println!("ok     {} :: {}", display(file), t.name.value);
                }
                Err(why) => {
                    failed += 1;
                    println!("FAILED {} :: {}", display(file), t.name.value);
                    for line in why.lines() {
                        println!("       {line}");
                    }
                }
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if invalid {
        super::exit::USAGE
    } else if failed > 0 {
        super::exit::FAILED
    } else {
        super::exit::OK
    }
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

/// Runs one test: mocks in, effectful agents that are not mocked out, then the expectations.
/// Mock files' paths are relative to `dir`, the flow file's directory.
pub async fn run_test(plan: &Arc<Plan>, t: &FlowTest, text: &str, dir: &Path) -> Result<(), String> {
    let agent_changes = mocks(plan, t, text, dir)?;
    let options = RunOptions {
        allow: None,
        agent_changes: Arc::new(agent_changes),
        now: t.now.as_ref().map(|n| n.value),
        origin: crate::record::Origin::Cli,
        ..RunOptions::default()
    };
    let input = t
        .input
        .as_ref()
        .map_or(Value::Object(Default::default()), |n| n.0.to_json());
    let context = t
        .context
        .as_ref()
        .map_or(Value::Object(Default::default()), |n| n.0.to_json());
    let state = Arc::new(AgentState::default());
    let engine = Engine::new(Arc::new(MemoryStore::new()));
    let outcome = engine
        .run_with_state(
            plan.clone(),
            input,
            context,
            options,
            state.clone(),
            Default::default(),
        )
        .await;
    check(t, &outcome, &state)
}

/// Why a test may not call an agent it did not mock.
const NOT_MOCKED: &str =
    "not mocked: a test may not call `llm`, `http`, `command` or `native` agents; add it under `mocks:`";

fn mocks(plan: &Plan, t: &FlowTest, text: &str, dir: &Path) -> Result<AgentChanges, String> {
    let compile = |n: &crate::syntax::Node| -> Result<value::ValueTemplate, String> {
        let (v, errors) = value::compile(n, text);
        match errors.first() {
            Some((_, e)) => Err(format!("mock: {}", e.message)),
            None => Ok(v.unwrap_or(value::ValueTemplate::Literal(Value::Null))),
        }
    };
    let mut mocked = std::collections::HashMap::new();
    for (name, m) in &t.mocks {
        // Rebuild the mock's YAML fields into a plan (the model keeps them typed).
        let spec = crate::plan::MockPlan {
            returns: m.returns.as_ref().map(|r| compile(&r.0)).transpose()?,
            sequence: m
                .sequence
                .iter()
                .flatten()
                .map(|r| compile(&r.0))
                .collect::<Result<_, _>>()?,
            latency: m.latency.as_ref().map(|l| l.value.0),
            fail_times: m.fail_times.as_ref().map_or(0, |f| f.value),
            fail_rate: m.fail_rate.as_ref().map_or(0.0, |f| f.value),
            seed: m.seed.as_ref().map_or(0, |s| s.value),
            dir: dir.to_path_buf(),
        };
        mocked.insert(
            name.clone(),
            Arc::new(AgentPlan {
                name: name.clone(),
                spec: AgentPlanSpec::Mock(spec),
                result_schema: None,
                input_schema: None,
                description: None,
            }),
        );
    }
    let mut per_flow = std::collections::HashMap::new();
    for (i, flow) in plan.flows.iter().enumerate() {
        let mut entry = std::collections::HashMap::new();
        for agent in changes::calls(flow) {
            if let Some(m) = mocked.get(&agent.name) {
                // Keep the agent's result schema: a mock must return what the agent would.
                let with_schema = AgentPlan {
                    name: m.name.clone(),
                    spec: match &m.spec {
                        AgentPlanSpec::Mock(p) => AgentPlanSpec::Mock(p.clone()),
                        _ => unreachable!("mocks are mock plans"),
                    },
                    result_schema: agent.result_schema.clone(),
                    input_schema: agent.input_schema.clone(),
                    description: agent.description.clone(),
                };
                entry.insert(agent.name.clone(), Some(Arc::new(with_schema)));
            } else if matches!(
                agent.spec,
                AgentPlanSpec::Llm(_)
                    | AgentPlanSpec::Http(_)
                    | AgentPlanSpec::Command(_)
                    | AgentPlanSpec::Native(_)
                    | AgentPlanSpec::Mcp(_)
            ) {
                entry.insert(agent.name.clone(), None);
            }
        }
        per_flow.insert(i, entry);
    }
    Ok(AgentChanges {
        per_flow,
        removed_reason: Some(NOT_MOCKED.into()),
        stand_ins: true,
        source: None,
    })
}

fn check(t: &FlowTest, o: &RunOutcome, state: &AgentState) -> Result<(), String> {
    let mut problems = Vec::new();
    let e = &t.expect;
    let want = e.status.as_ref().map(|s| match s.value {
        RunStatusExpect::Succeeded => RunStatus::Succeeded,
        RunStatusExpect::Failed => RunStatus::Failed,
        RunStatusExpect::Interrupted => RunStatus::Interrupted,
    });
    // Without `status`, a test expects success unless it expects an error.
    let want = want.or_else(|| e.error.is_none().then_some(RunStatus::Succeeded));
    if let Some(w) = want
        && w != o.status
    {
        let why = o.error.as_ref().map(|e| format!(": {e}")).unwrap_or_default();
        problems.push(format!(
            "status: expected {}, got {}{why}",
            w.as_str(),
            o.status.as_str()
        ));
    }
    if let Some(path) = &e.path {
        let want: Vec<&str> = path.iter().map(|p| p.value.as_str()).collect();
        if want != o.path {
            problems.push(format!(
                "path: expected [{}], got [{}]",
                want.join(", "),
                o.path.join(", ")
            ));
        }
    }
    if let Some(out) = &e.output {
        let want = out.0.to_json();
        match &o.output {
            Some(got) => {
                for diff in subset(&want, got, "$") {
                    problems.push(format!("output: {diff}"));
                }
            }
            None => problems.push("output: the run has no output".into()),
        }
    }
    if let Some(err) = &e.error {
        let want = err.0.to_json();
        match &o.error {
            Some(got) => {
                let got = got.to_json();
                // `message` matches as a substring; other fields as a subset.
                let mut want_rest = want.clone();
                if let (Some(Value::String(m)), Some(obj)) = (want.get("message"), want_rest.as_object_mut())
                {
                    obj.remove("message");
                    let gm = got.get("message").and_then(Value::as_str).unwrap_or("");
                    if !gm.contains(m.as_str()) {
                        problems.push(format!("error.message: expected it to contain {m:?}, got {gm:?}"));
                    }
                }
                for diff in subset(&want_rest, &got, "error") {
                    problems.push(format!("error: {diff}"));
                }
            }
            None => problems.push("error: expected an error, the run has none".into()),
        }
    }
    // A call of an unmocked effectful agent fails the test even when the flow routed around
    // the failure, or the test expected one.
    for agent in state.refused() {
        problems.push(format!("agent `{agent}` was called but is {NOT_MOCKED}"));
    }
    let counts = state.counts();
    for (agent, n) in &e.calls {
        let got = counts.get(agent).copied().unwrap_or(0);
        if got != n.value {
            problems.push(format!("calls.{agent}: expected {}, got {got}", n.value));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Every difference between `want` and `got` (empty when every field of `want` is in `got`
/// with the same value: objects recursively, arrays element by element), each naming where.
pub fn subset(want: &Value, got: &Value, at: &str) -> Vec<String> {
    let mut diffs = Vec::new();
    differences(want, got, at, &mut diffs);
    diffs
}

fn differences(want: &Value, got: &Value, at: &str, diffs: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                let here = format!("{at}.{k}");
                match g.get(k) {
                    Some(gv) => differences(wv, gv, &here, diffs),
                    None => diffs.push(format!("`{here}` is missing")),
                }
            }
        }
        (Value::Array(w), Value::Array(g)) => {
            if w.len() != g.len() {
                diffs.push(format!("`{at}` has {} elements, expected {}", g.len(), w.len()));
                return;
            }
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                differences(wv, gv, &format!("{at}[{i}]"), diffs);
            }
        }
        (Value::Number(a), Value::Number(b)) if same_number(a, b) => {}
        _ if want == got => {}
        _ => diffs.push(format!("`{at}` is {got}, expected {want}")),
    }
}

/// Integers compare exactly (two 64-bit integers that round to the same double differ);
/// otherwise as doubles, so that `1` matches `1.0`.
fn same_number(a: &serde_json::Number, b: &serde_json::Number) -> bool {
    let int = |n: &serde_json::Number| n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from));
    match (int(a), int(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a.as_f64() == b.as_f64(),
    }
}

// ----- the turns a test scripts for an agent loop -------------------------------------------

/// What a test's mocks script for agent loops (SPEC §6.3, §11), checked before the test runs:
/// a mock of a loop's agent stands in for its model, and each value it returns is a turn,
/// `{tool_calls: [{name, arguments}]}` or the final answer. A turn that is not of that shape
/// (`tool_calls` not a list, or empty; a call that is not a map, has no `name`, or a key
/// besides `name` and `arguments`; `arguments` neither a map nor a string; a key beside
/// `tool_calls`) is an error: the test would not do what it says. A call of a name that is not
/// one of the loop's tools is a warning: the run answers the model `unknown tool`, which a test
/// may mean to show. Values that are expressions are not checked.
pub fn mock_turn_diagnostics(plan: &Plan, t: &FlowTest) -> Vec<crate::diag::Diagnostic> {
    let mut out = Vec::new();
    for (name, m) in &t.mocks {
        let tools = loop_tools(plan, name);
        if tools.is_empty() {
            continue;
        }
        if let Some(r) = &m.returns {
            check_turn(&r.0, name, "every turn", &tools, &mut out);
        }
        for (i, r) in m.sequence.iter().flatten().enumerate() {
            check_turn(&r.0, name, &format!("turn {}", i + 1), &tools, &mut out);
        }
    }
    out.sort_by_key(|d| d.primary.span);
    out
}

/// The tools of the agent loops named `name` in any flow of the plan (none: it is no loop).
fn loop_tools(plan: &Plan, name: &str) -> Vec<String> {
    let mut tools: Vec<String> = Vec::new();
    for flow in &plan.flows {
        for agent in changes::calls(flow) {
            if agent.name != name {
                continue;
            }
            if let AgentPlanSpec::Llm(l) = &agent.spec
                && let Some(lp) = &l.agent_loop
            {
                for t in &lp.tools {
                    if !tools.contains(&t.name) {
                        tools.push(t.name.clone());
                    }
                }
            }
        }
    }
    tools
}

/// An expression in a value template (`=...`, but not the escaped literal `==...`).
fn is_expression(n: &crate::syntax::Node) -> bool {
    matches!(&n.value, crate::syntax::Value::Str(s) if s.starts_with('=') && !s.starts_with("=="))
}

fn check_turn(
    turn: &crate::syntax::Node,
    agent: &str,
    which: &str,
    tools: &[String],
    out: &mut Vec<crate::diag::Diagnostic>,
) {
    use crate::diag::{Diagnostic, Severity, codes};
    use crate::syntax::Value as Y;
    const SHAPE: &str = "a turn is `{tool_calls: [{name: <tool>, arguments: {...}}]}` or the final answer";
    let Y::Map(entries) = &turn.value else { return };
    let Some((_, calls)) = entries.iter().find(|(k, _)| k.name == "tool_calls") else {
        return;
    };
    let whose = format!("{which} of the mock of agent loop `{agent}`");
    for (k, _) in entries.iter().filter(|(k, _)| k.name != "tool_calls") {
        out.push(
            Diagnostic::new(
                &codes::UNKNOWN_KEY,
                k.span,
                format!(
                    "{whose} calls tools and also has `{}`, which the run ignores",
                    k.name
                ),
            )
            .label("not part of a turn that calls tools")
            .help(format!("{SHAPE}, not both")),
        );
    }
    if is_expression(calls) {
        return;
    }
    let Y::Seq(list) = &calls.value else {
        out.push(
            Diagnostic::new(
                &codes::INVALID_TYPE,
                calls.span,
                format!("`tool_calls` of {whose} is not a list"),
            )
            .label("expected a list of calls")
            .help(SHAPE),
        );
        return;
    };
    if list.is_empty() {
        out.push(
            Diagnostic::new(
                &codes::INVALID_VALUE,
                calls.span,
                format!("`tool_calls` of {whose} is empty"),
            )
            .label("no call")
            .help(format!(
                "{SHAPE}; a turn that calls no tool is written as the answer itself"
            )),
        );
        return;
    }
    for (i, call) in list.iter().enumerate() {
        if is_expression(call) {
            continue;
        }
        let at = format!("call {} of {whose}", i + 1);
        let Y::Map(fields) = &call.value else {
            out.push(
                Diagnostic::new(&codes::INVALID_TYPE, call.span, format!("{at} is not a map"))
                    .label("expected `{name, arguments}`")
                    .help(SHAPE),
            );
            continue;
        };
        for (k, _) in fields
            .iter()
            .filter(|(k, _)| k.name != "name" && k.name != "arguments")
        {
            let help = crate::diag::did_you_mean(&k.name, ["name", "arguments"])
                .unwrap_or_else(|| "a call has `name` and `arguments`".to_string());
            out.push(
                Diagnostic::new(
                    &codes::UNKNOWN_KEY,
                    k.span,
                    format!("unknown key `{}` in {at}", k.name),
                )
                .label("not a key of a call")
                .help(help),
            );
        }
        match fields.iter().find(|(k, _)| k.name == "arguments") {
            Some((_, a)) if matches!(a.value, Y::Map(_) | Y::Str(_)) => {}
            Some((_, a)) => out.push(
                Diagnostic::new(
                    &codes::INVALID_TYPE,
                    a.span,
                    format!("the `arguments` of {at} are neither a map nor a string"),
                )
                .label("expected a map (or the model's text, as a string)")
                .help("`arguments: {q: refund}`; a string is sent as the model's text, e.g. to show arguments that are not JSON"),
            ),
            None => {}
        }
        let Some((_, n)) = fields.iter().find(|(k, _)| k.name == "name") else {
            out.push(
                Diagnostic::new(&codes::MISSING_KEY, call.span, format!("{at} has no `name`"))
                    .label("missing `name`")
                    .help(format!("name one of the tools of `{agent}`: {}", listed(tools))),
            );
            continue;
        };
        if is_expression(n) {
            continue;
        }
        let Y::Str(tool) = &n.value else {
            out.push(
                Diagnostic::new(
                    &codes::INVALID_TYPE,
                    n.span,
                    format!("the `name` of {at} is not a string"),
                )
                .label("expected a tool's name")
                .help(format!("the tools of `{agent}` are: {}", listed(tools))),
            );
            continue;
        };
        let tool = tool
            .strip_prefix('=')
            .filter(|_| tool.starts_with("=="))
            .unwrap_or(tool);
        if !tools.iter().any(|t| t == tool) {
            let mut d = Diagnostic::new(
                &codes::UNKNOWN_TOOL,
                n.span,
                format!("{at} calls `{tool}`, which is not a tool of `{agent}`"),
            )
            .label("no such tool");
            d.severity = Severity::Warning;
            let near = crate::diag::did_you_mean(tool, tools.iter().map(String::as_str))
                .map(|h| format!("{h} "))
                .unwrap_or_default();
            out.push(d.help(format!(
                "{near}the tools are: {}; the run answers this call `unknown tool` and the model goes on",
                listed(tools)
            )));
        }
    }
}

fn listed(tools: &[String]) -> String {
    tools
        .iter()
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
