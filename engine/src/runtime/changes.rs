//! Runtime agent changes (`--agent-change FILE`, SPEC §8.4): which agents are available for
//! one run or batch, without editing flows. Also how flow tests swap agents for mocks.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use crate::diag::{Diagnostic, codes};
use crate::expr::value;
use crate::plan::{AgentChanges, AgentPlan, AgentPlanSpec, MockPlan, Plan};
use crate::source::Span;
use crate::syntax::{self, Node, Value as Y};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Global,
    Root,
    AllSubagents,
    Specific,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Add,
    Remove,
    Replace,
}

/// One entry of an agent-change file.
#[derive(Debug)]
pub struct Change {
    pub scope: Scope,
    pub mode: Mode,
    /// For `specific`: the flow names.
    pub flows: Vec<String>,
    /// Agent name → replacement (`None` for `remove`).
    pub agents: Vec<(String, Option<Arc<AgentPlan>>)>,
    /// Where each of `flows`, then each of `agents`, is written.
    pub flow_spans: Vec<Span>,
    pub agent_spans: Vec<Span>,
}

/// A flow of the run's tree, as a change file's names are checked against it.
#[derive(Debug)]
pub struct TreeFlow<'a> {
    pub name: &'a str,
    pub root: bool,
    /// The agents its steps call.
    pub agents: Vec<&'a str>,
}

/// A name in a change file that matches nothing in the run's tree.
#[derive(Debug, PartialEq, Eq)]
pub struct UnknownName {
    pub span: Span,
    pub message: String,
    pub help: String,
}

/// Parses an agent-change file. Replacement agents may be `mock` or `transform` agents
/// (self-contained); errors name the file, line and column.
pub fn parse(name: &str, text: &str) -> Result<Vec<Change>, String> {
    parse_with_source(name, text).map(|(changes, _)| changes)
}

/// [`parse`], and the file as canonical JSON ([`AgentChanges::source`]).
fn parse_with_source(name: &str, text: &str) -> Result<(Vec<Change>, Value), String> {
    let node = syntax::parse(
        crate::source::FileId(0),
        text.as_bytes(),
        &syntax::Limits::default(),
    )
    .map_err(|d| located(name, text, &d))?;
    let changes = from_node(&node, text).map_err(|ds| {
        ds.iter()
            .map(|d| located(name, text, d))
            .collect::<Vec<_>>()
            .join("\nerror: ")
    })?;
    Ok((changes, node.to_json()))
}

/// `file:line:column: message (help) [code]`.
fn located(name: &str, text: &str, d: &Diagnostic) -> String {
    let help = d.help.as_ref().map(|h| format!(" ({h})")).unwrap_or_default();
    format!(
        "{}{help} [{}]",
        at(name, text, &d.primary.span, &d.message),
        d.code()
    )
}

/// The problems of a change file that stop it from being read.
pub type Problems = Vec<Diagnostic>;

/// A problem of a change file, as a diagnostic of `rule` at `span`.
fn bad(rule: &'static crate::diag::Rule, span: &Span, message: &str) -> Problems {
    vec![Diagnostic::new(rule, *span, message)]
}

/// The changes of a parsed change file (`text` is its source), or its problems: the first
/// problem of its structure, or every shape problem of its agent definitions (checked as a
/// flow's agents are: unknown keys, wrong types).
pub fn from_node(node: &Node, text: &str) -> Result<Vec<Change>, Problems> {
    let Y::Seq(items) = &node.value else {
        return Err(bad(
            &codes::INVALID_TYPE,
            &node.span,
            "an agent-change file is a list of changes",
        ));
    };
    let mut out = Vec::new();
    let mut shape = Problems::new();
    for item in items {
        let Some(m) = item.as_map() else {
            return Err(bad(&codes::INVALID_TYPE, &item.span, "a change is a mapping"));
        };
        for (k, _) in m {
            if !["scope", "mode", "agents", "flows"].contains(&k.name.as_str()) {
                return Err(bad(
                    &codes::UNKNOWN_KEY,
                    &k.span,
                    &format!(
                        "unknown key `{}` in a change; valid keys are: `scope`, `mode`, `agents`, `flows`",
                        k.name
                    ),
                ));
            }
        }
        let str_of = |key: &str| -> Result<Option<(&str, &Node)>, Problems> {
            match item.get(key) {
                None => Ok(None),
                Some(n) => match n.as_str() {
                    Some(s) => Ok(Some((s, n))),
                    None => Err(bad(
                        &codes::INVALID_TYPE,
                        &n.span,
                        &format!("`{key}` is a string"),
                    )),
                },
            }
        };
        let scope = match str_of("scope")? {
            None => Scope::Global,
            Some(("global", _)) => Scope::Global,
            Some(("root", _)) => Scope::Root,
            Some(("all_subagents", _)) => Scope::AllSubagents,
            Some(("specific", _)) => Scope::Specific,
            Some((other, n)) => {
                return Err(bad(
                    &codes::INVALID_VALUE,
                    &n.span,
                    &format!(
                        "unknown scope `{other}`; scopes are `global`, `root`, `all_subagents`, `specific`"
                    ),
                ));
            }
        };
        let mode = match str_of("mode")? {
            None => {
                return Err(bad(
                    &codes::MISSING_KEY,
                    &item.span,
                    "a change needs `mode`: `add`, `remove` or `replace`",
                ));
            }
            Some(("add", _)) => Mode::Add,
            Some(("remove", _)) => Mode::Remove,
            Some(("replace", _)) => Mode::Replace,
            Some((other, n)) => {
                return Err(bad(
                    &codes::INVALID_VALUE,
                    &n.span,
                    &format!("unknown mode `{other}`; modes are `add`, `remove`, `replace`"),
                ));
            }
        };
        let (flows, flow_spans): (Vec<String>, Vec<Span>) = match item.get("flows") {
            None => Default::default(),
            Some(n) => n
                .as_seq()
                .ok_or_else(|| bad(&codes::INVALID_TYPE, &n.span, "`flows` is a list of flow names"))?
                .iter()
                .map(|f| {
                    f.as_str()
                        .map(|s| (s.to_string(), f.span))
                        .ok_or_else(|| bad(&codes::INVALID_TYPE, &f.span, "a flow name is a string"))
                })
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .unzip(),
        };
        if scope != Scope::Specific && !flows.is_empty() {
            return Err(bad(
                &codes::INVALID_VALUE,
                &flow_spans[0],
                "`flows` is only for `scope: specific`",
            ));
        }
        if scope == Scope::Specific && flows.is_empty() {
            return Err(bad(
                &codes::MISSING_KEY,
                &item.span,
                "`scope: specific` needs `flows: [names]`",
            ));
        }
        let Some(agents_node) = item.get("agents") else {
            return Err(bad(&codes::MISSING_KEY, &item.span, "a change needs `agents`"));
        };
        let mut agent_spans = Vec::new();
        let agents = match (mode, &agents_node.value) {
            (Mode::Remove, Y::Seq(names)) => names
                .iter()
                .map(|n| {
                    agent_spans.push(n.span);
                    n.as_str()
                        .map(|s| (s.to_string(), None))
                        .ok_or_else(|| bad(&codes::INVALID_TYPE, &n.span, "an agent name is a string"))
                })
                .collect::<Result<Vec<_>, _>>()?,
            (Mode::Remove, _) => {
                return Err(bad(
                    &codes::INVALID_TYPE,
                    &agents_node.span,
                    "`remove` takes a list of agent names",
                ));
            }
            (_, Y::Map(entries)) => {
                let mut agents = Vec::new();
                for (k, def) in entries {
                    agent_spans.push(k.span);
                    match replacement(text, &k.name, k.span, def) {
                        Ok(a) => agents.push((k.name.clone(), Some(a))),
                        Err(problems) => shape.extend(problems),
                    }
                }
                agents
            }
            _ => {
                return Err(bad(
                    &codes::INVALID_TYPE,
                    &agents_node.span,
                    "`add` and `replace` take a map of agent name → definition",
                ));
            }
        };
        out.push(Change {
            scope,
            mode,
            flows,
            agents,
            flow_spans,
            agent_spans,
        });
    }
    if !shape.is_empty() {
        return Err(shape);
    }
    Ok(out)
}

/// The names of `changes` that match nothing in `tree`: a flow of `flows:` that is not in the
/// tree, an agent that no flow in the change's scope calls. A change meant to take an agent away
/// must not fail open because of a typo (SPEC §8.4).
pub fn unknown_names(changes: &[Change], tree: &[TreeFlow<'_>]) -> Vec<UnknownName> {
    let mut out = Vec::new();
    let listed = |names: Vec<&str>, what: &str| -> String {
        if names.is_empty() {
            format!("there are no {what} here")
        } else {
            format!(
                "{what} are: {}",
                names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    };
    let help = |name: &str, mut names: Vec<&str>, what: &str| -> String {
        names.sort_unstable();
        names.dedup();
        crate::diag::did_you_mean(name, names.iter().copied()).unwrap_or_else(|| listed(names, what))
    };
    for c in changes {
        for (f, span) in c.flows.iter().zip(&c.flow_spans) {
            if !tree.iter().any(|t| t.name == f) {
                out.push(UnknownName {
                    span: *span,
                    message: format!("unknown flow `{f}`: the run's tree has no flow of that name"),
                    help: help(f, tree.iter().map(|t| t.name).collect(), "flows"),
                });
            }
        }
        let in_scope: Vec<&TreeFlow<'_>> = tree
            .iter()
            .filter(|t| match c.scope {
                Scope::Global => true,
                Scope::Root => t.root,
                Scope::AllSubagents => !t.root,
                Scope::Specific => c.flows.iter().any(|f| f == t.name),
            })
            .collect();
        if c.scope == Scope::Specific && in_scope.is_empty() {
            // Every flow name is already reported.
            continue;
        }
        let where_ = match c.scope {
            Scope::Global => "any flow of the run's tree".to_owned(),
            Scope::Root => "the top flow".to_owned(),
            Scope::AllSubagents => "any nested flow".to_owned(),
            Scope::Specific => in_scope
                .iter()
                .map(|t| format!("`{}`", t.name))
                .collect::<Vec<_>>()
                .join(", "),
        };
        for ((a, _), span) in c.agents.iter().zip(&c.agent_spans) {
            if !in_scope.iter().any(|t| t.agents.contains(&a.as_str())) {
                out.push(UnknownName {
                    span: *span,
                    message: format!("unknown agent `{a}`: no step of {where_} calls it"),
                    help: help(
                        a,
                        in_scope.iter().flat_map(|t| t.agents.iter().copied()).collect(),
                        "agents",
                    ),
                });
            }
        }
    }
    out
}

/// The flows of a plan, as [`unknown_names`] checks a change file against them.
pub fn plan_tree(plan: &Plan) -> Vec<TreeFlow<'_>> {
    plan.flows
        .iter()
        .enumerate()
        .map(|(i, f)| TreeFlow {
            name: &f.name,
            root: i == plan.root.0,
            agents: flow_agent_names(f),
        })
        .collect()
}

fn flow_agent_names(flow: &crate::plan::FlowPlan) -> Vec<&str> {
    use crate::plan::StepPlanKind;
    let mut agents: Vec<&AgentPlan> = Vec::new();
    for n in flow.steps.values() {
        let Some(step) = flow.step(*n) else { continue };
        match &step.kind {
            StepPlanKind::Call(c) => agents.push(&c.agent),
            StepPlanKind::Foreach(f) => agents.push(&f.body.agent),
            StepPlanKind::While(w) => agents.push(&w.body.agent),
            StepPlanKind::Parallel(p) => agents.extend(p.branches.iter().map(|(_, c)| &*c.agent)),
            _ => {}
        }
    }
    // The tools of agent loops are agents of the flow too.
    let mut i = 0;
    while i < agents.len() {
        if let crate::plan::AgentPlanSpec::Llm(l) = &agents[i].spec
            && let Some(lp) = &l.agent_loop
        {
            for t in &lp.tools {
                if !agents.iter().any(|a| std::ptr::eq(*a, &*t.call.agent)) {
                    agents.push(&t.call.agent);
                }
            }
        }
        i += 1;
    }
    agents.into_iter().map(|a| a.name.as_str()).collect()
}

/// Parses a change file and checks its names against the run's tree: the resolved changes, or
/// every problem, each as `file:line:column: message` with its help.
pub fn load(name: &str, text: &str, plan: &Plan) -> Result<AgentChanges, String> {
    let (changes, source) = parse_with_source(name, text)?;
    let unknown = unknown_names(&changes, &plan_tree(plan));
    if !unknown.is_empty() {
        return Err(unknown
            .iter()
            .map(|u| {
                format!(
                    "{} ({}) [{}]",
                    at(name, text, &u.span, &u.message),
                    u.help,
                    codes::UNKNOWN_CHANGE_TARGET.code
                )
            })
            .collect::<Vec<_>>()
            .join("\nerror: "));
    }
    Ok(AgentChanges {
        source: Some(source),
        ..resolve(&changes, plan)
    })
}

/// The agent changes run `run_id` recorded ([`AgentChanges::source`]), resolved against
/// `plan` as when it started. Its names are checked again: the flow may have changed since.
pub fn load_recorded(run_id: &str, recorded: &Value, plan: &Plan) -> Result<AgentChanges, String> {
    // JSON is YAML: the recorded form reads as a change file.
    let text = recorded.to_string();
    load(
        &format!("agent changes recorded with run `{run_id}`"),
        &text,
        plan,
    )
}

fn at(name: &str, text: &str, span: &crate::source::Span, message: &str) -> String {
    let f = crate::source::SourceFile::new(name, None, text);
    let (l, c) = f.line_col(span.start as usize);
    format!("{name}:{l}:{c}: {message}")
}

/// A replacement agent: `kind: mock` (`returns`, `sequence`, `latency`, `fail_times`,
/// `fail_rate`, `seed`) or `kind: transform` (`result`). Its definition first goes through
/// the shape checks of a flow's agents, whatever its kind.
fn replacement(text: &str, agent: &str, at: Span, def: &Node) -> Result<Arc<AgentPlan>, Problems> {
    let mut cx = crate::model::build::Cx::new(text);
    crate::model::build::agent(&mut cx, crate::model::Sp::new(agent.to_owned(), at), def);
    let shape: Problems = cx.diags.into_iter().filter(Diagnostic::is_error).collect();
    if !shape.is_empty() {
        return Err(shape);
    }
    let kind = def.get("kind").and_then(Node::as_str).unwrap_or("");
    let compile = |n: &Node| -> Result<value::ValueTemplate, Problems> {
        let (t, errors) = value::compile(n, text);
        if let Some((span, e)) = errors.first() {
            return Err(bad(&codes::EXPRESSION_SYNTAX, span, &e.message));
        }
        Ok(t.unwrap_or(value::ValueTemplate::Literal(Value::Null)))
    };
    let spec = match kind {
        "mock" => AgentPlanSpec::Mock(mock_plan(def, &compile)?),
        "transform" => match def.get("result") {
            Some(r) => AgentPlanSpec::Transform(compile(r)?),
            None => {
                return Err(bad(
                    &codes::MISSING_KEY,
                    &def.span,
                    &format!("transform agent `{agent}` needs `result`"),
                ));
            }
        },
        _ => {
            return Err(bad(
                &codes::INVALID_VALUE,
                &def.span,
                &format!("replacement agent `{agent}` must be `kind: mock` or `kind: transform`"),
            ));
        }
    };
    Ok(Arc::new(AgentPlan {
        name: agent.to_string(),
        spec,
        result_schema: None,
        input_schema: None,
        description: None,
    }))
}

/// A mock plan from mock fields (`returns`, `sequence`, `latency`, `fail_times`, `fail_rate`,
/// `seed`) given as YAML.
pub fn mock_plan<E>(
    def: &Node,
    compile: &dyn Fn(&Node) -> Result<value::ValueTemplate, E>,
) -> Result<MockPlan, E> {
    let num = |k: &str| def.get(k).map(|n| n.to_json()).and_then(|v| v.as_f64());
    Ok(MockPlan {
        returns: def.get("returns").map(compile).transpose()?,
        sequence: def
            .get("sequence")
            .and_then(Node::as_seq)
            .unwrap_or(&[])
            .iter()
            .map(compile)
            .collect::<Result<_, _>>()?,
        latency: def
            .get("latency")
            .and_then(Node::as_str)
            .and_then(crate::model::build::parse_duration),
        fail_times: num("fail_times").map_or(0, |v| v as u64),
        fail_rate: num("fail_rate").unwrap_or(0.0),
        seed: num("seed").map_or(0, |v| v as u64),
        dir: std::path::PathBuf::new(),
    })
}

/// Resolves changes against a plan: for every flow in scope, which of its agents change.
/// Changes apply in the order written. `replace` swaps the agent, `remove` takes it away,
/// and `add` makes an agent available without overriding one the flow has: it fills a name
/// that an earlier change removed (so "remove everywhere, then add back for one flow"
/// works), and is otherwise a no-op for compiled steps, which name agents the flow defines.
pub fn resolve(changes: &[Change], plan: &Plan) -> AgentChanges {
    let mut per_flow: HashMap<usize, HashMap<String, Option<Arc<AgentPlan>>>> = HashMap::new();
    for (i, flow) in plan.flows.iter().enumerate() {
        let is_root = i == plan.root.0;
        for c in changes {
            let in_scope = match c.scope {
                Scope::Global => true,
                Scope::Root => is_root,
                Scope::AllSubagents => !is_root,
                Scope::Specific => c.flows.iter().any(|f| *f == flow.name),
            };
            if !in_scope {
                continue;
            }
            let entry = per_flow.entry(i).or_default();
            for (name, agent) in &c.agents {
                match c.mode {
                    Mode::Add => match entry.get(name) {
                        // Removed earlier: available again, as the added definition.
                        Some(None) => {
                            entry.insert(name.clone(), agent.clone());
                        }
                        // Replaced earlier: the replacement stays.
                        Some(Some(_)) => {}
                        // The flow's own agent wins; a name it does not call changes nothing.
                        None => {}
                    },
                    Mode::Replace | Mode::Remove => {
                        entry.insert(name.clone(), agent.clone());
                    }
                }
            }
        }
    }
    AgentChanges {
        per_flow,
        removed_reason: None,
        stand_ins: false,
        source: None,
    }
}

/// Whether any step of `flow` calls an agent named `name`.
pub fn flow_calls(flow: &crate::plan::FlowPlan, name: &str) -> bool {
    calls(flow).iter().any(|a| a.name == name)
}

/// Every agent the steps of a flow call (with duplicates), and the tools of the agent loops
/// among them, theirs too.
pub fn calls(flow: &crate::plan::FlowPlan) -> Vec<Arc<AgentPlan>> {
    use crate::plan::StepPlanKind;
    let mut out = Vec::new();
    for n in flow.steps.values() {
        let Some(step) = flow.step(*n) else { continue };
        match &step.kind {
            StepPlanKind::Call(c) => out.push(c.agent.clone()),
            StepPlanKind::Foreach(f) => out.push(f.body.agent.clone()),
            StepPlanKind::While(w) => out.push(w.body.agent.clone()),
            StepPlanKind::Parallel(p) => out.extend(p.branches.iter().map(|(_, c)| c.agent.clone())),
            _ => {}
        }
    }
    let mut i = 0;
    while i < out.len() {
        if let crate::plan::AgentPlanSpec::Llm(l) = &out[i].spec
            && let Some(lp) = &l.agent_loop
        {
            let tools: Vec<_> = lp
                .tools
                .iter()
                .map(|t| t.call.agent.clone())
                .filter(|a| !out.iter().any(|o| Arc::ptr_eq(o, a)))
                .collect();
            out.extend(tools);
        }
        i += 1;
    }
    out
}

/// The agent changes a resumed run goes on under (SPEC §8.4): those it recorded when none are
/// `given`, the given ones when they are the same. Other changes than the recorded ones are
/// refused unless the caller allows a changed run (`batch --allow-changed`): a change that
/// takes an agent away must not be dropped or swapped by a resume.
pub fn for_resume(
    plan: &Plan,
    record: &crate::record::RunRecord,
    given: Arc<AgentChanges>,
    allow_changed: bool,
) -> Result<Arc<AgentChanges>, crate::runtime::resume::ResumeError> {
    use crate::runtime::resume::ResumeError;
    match (&record.agent_changes, given.source.as_ref()) {
        (recorded, source) if recorded.as_ref() == source => Ok(given),
        (Some(recorded), None) => {
            load_recorded(&record.id, recorded, plan)
                .map(Arc::new)
                .map_err(|message| ResumeError::RecordedChanges {
                    id: record.id.clone(),
                    message,
                })
        }
        _ if allow_changed => Ok(given),
        (recorded, _) => Err(ResumeError::OtherChanges {
            id: record.id.clone(),
            recorded: recorded.is_some(),
        }),
    }
}
