//! Runtime agent changes (`--agent-change FILE`, SPEC §8.4): which agents are available for
//! one run or batch, without editing flows. Also how flow tests swap agents for mocks.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::engine::AgentChanges;
use crate::compile::value;
use crate::plan::{AgentPlan, AgentPlanSpec, MockPlan, Plan};
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
}

/// Parses an agent-change file. Replacement agents may be `mock` or `transform` agents
/// (self-contained); errors name the file, line and column.
pub fn parse(name: &str, text: &str) -> Result<Vec<Change>, String> {
    let node = syntax::parse(
        crate::source::FileId(0),
        text.as_bytes(),
        &syntax::Limits::default(),
    )
    .map_err(|d| at(name, text, &d.primary.span, &d.message))?;
    let Y::Seq(items) = &node.value else {
        return Err(at(
            name,
            text,
            &node.span,
            "an agent-change file is a list of changes",
        ));
    };
    let mut out = Vec::new();
    for item in items {
        let Some(m) = item.as_map() else {
            return Err(at(name, text, &item.span, "a change is a mapping"));
        };
        for (k, _) in m {
            if !["scope", "mode", "agents", "flows"].contains(&k.name.as_str()) {
                return Err(at(
                    name,
                    text,
                    &k.span,
                    &format!(
                        "unknown key `{}` in a change; valid keys are: `scope`, `mode`, `agents`, `flows`",
                        k.name
                    ),
                ));
            }
        }
        let str_of = |key: &str| -> Result<Option<(&str, &Node)>, String> {
            match item.get(key) {
                None => Ok(None),
                Some(n) => match n.as_str() {
                    Some(s) => Ok(Some((s, n))),
                    None => Err(at(name, text, &n.span, &format!("`{key}` is a string"))),
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
                return Err(at(
                    name,
                    text,
                    &n.span,
                    &format!(
                        "unknown scope `{other}`; scopes are `global`, `root`, `all_subagents`, `specific`"
                    ),
                ));
            }
        };
        let mode = match str_of("mode")? {
            None => {
                return Err(at(
                    name,
                    text,
                    &item.span,
                    "a change needs `mode`: `add`, `remove` or `replace`",
                ));
            }
            Some(("add", _)) => Mode::Add,
            Some(("remove", _)) => Mode::Remove,
            Some(("replace", _)) => Mode::Replace,
            Some((other, n)) => {
                return Err(at(
                    name,
                    text,
                    &n.span,
                    &format!("unknown mode `{other}`; modes are `add`, `remove`, `replace`"),
                ));
            }
        };
        let flows: Vec<String> = match item.get("flows") {
            None => Vec::new(),
            Some(n) => n
                .as_seq()
                .ok_or_else(|| at(name, text, &n.span, "`flows` is a list of flow names"))?
                .iter()
                .map(|f| {
                    f.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| at(name, text, &f.span, "a flow name is a string"))
                })
                .collect::<Result<_, _>>()?,
        };
        if scope == Scope::Specific && flows.is_empty() {
            return Err(at(
                name,
                text,
                &item.span,
                "`scope: specific` needs `flows: [names]`",
            ));
        }
        let Some(agents_node) = item.get("agents") else {
            return Err(at(name, text, &item.span, "a change needs `agents`"));
        };
        let agents = match (mode, &agents_node.value) {
            (Mode::Remove, Y::Seq(names)) => names
                .iter()
                .map(|n| {
                    n.as_str()
                        .map(|s| (s.to_string(), None))
                        .ok_or_else(|| at(name, text, &n.span, "an agent name is a string"))
                })
                .collect::<Result<Vec<_>, _>>()?,
            (Mode::Remove, _) => {
                return Err(at(
                    name,
                    text,
                    &agents_node.span,
                    "`remove` takes a list of agent names",
                ));
            }
            (_, Y::Map(entries)) => entries
                .iter()
                .map(|(k, def)| replacement(name, text, &k.name, def).map(|a| (k.name.clone(), Some(a))))
                .collect::<Result<Vec<_>, _>>()?,
            _ => {
                return Err(at(
                    name,
                    text,
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
        });
    }
    Ok(out)
}

fn at(name: &str, text: &str, span: &crate::source::Span, message: &str) -> String {
    let f = crate::source::SourceFile::new(name, None, text);
    let (l, c) = f.line_col(span.start as usize);
    format!("{name}:{l}:{c}: {message}")
}

/// A replacement agent: `kind: mock` (`returns`, `sequence`, `latency`, `fail_times`,
/// `fail_rate`, `seed`) or `kind: transform` (`result`).
fn replacement(file: &str, text: &str, agent: &str, def: &Node) -> Result<Arc<AgentPlan>, String> {
    let kind = def.get("kind").and_then(Node::as_str).unwrap_or("");
    let compile = |n: &Node| -> Result<value::ValueTemplate, String> {
        let (t, errors) = value::compile(n, text);
        if let Some((span, e)) = errors.first() {
            return Err(at(file, text, span, &e.message));
        }
        Ok(t.unwrap_or(value::ValueTemplate::Literal(Value::Null)))
    };
    let spec = match kind {
        "mock" => AgentPlanSpec::Mock(mock_plan(def, &compile)?),
        "transform" => match def.get("result") {
            Some(r) => AgentPlanSpec::Transform(compile(r)?),
            None => {
                return Err(at(
                    file,
                    text,
                    &def.span,
                    &format!("transform agent `{agent}` needs `result`"),
                ));
            }
        },
        _ => {
            return Err(at(
                file,
                text,
                &def.span,
                &format!("replacement agent `{agent}` must be `kind: mock` or `kind: transform`"),
            ));
        }
    };
    Ok(Arc::new(AgentPlan {
        name: agent.to_string(),
        spec,
        result_schema: None,
    }))
}

/// A mock plan from mock fields (`returns`, `sequence`, `latency`, `fail_times`, `fail_rate`,
/// `seed`) given as YAML.
pub fn mock_plan(
    def: &Node,
    compile: &dyn Fn(&Node) -> Result<value::ValueTemplate, String>,
) -> Result<MockPlan, String> {
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
    }
}

/// Whether any step of `flow` calls an agent named `name`.
pub fn flow_calls(flow: &crate::plan::FlowPlan, name: &str) -> bool {
    calls(flow).iter().any(|a| a.name == name)
}

/// Every agent the steps of a flow call (with duplicates).
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
    out
}
