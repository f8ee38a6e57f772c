//! Tools whose `input_schema` does not describe an object (SY509): a tool's input is the
//! object of arguments the model sends (the `parameters` of the tool-calling protocol).

use std::collections::HashSet;

use serde_json::Value;

use crate::diag::{Diagnostic, codes};
use crate::lint::FlowCx;
use crate::lint::flow_types::schema_value;
use crate::model::{Agent, SchemaRef};

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    let mut seen: HashSet<*const Agent> = HashSet::new();
    for l in cx.agent_loops() {
        for (tool, agent) in cx.tools_of(l) {
            if !seen.insert(agent) {
                continue;
            }
            let Some(schema) = &agent.common.input_schema else {
                continue;
            };
            let Some(value) = schema_value(cx, schema) else {
                continue;
            };
            let ty = value.get("type");
            if ty == Some(&Value::from("object")) {
                continue;
            }
            // Inline, the `type` itself (or the whole schema); in a file, the path.
            let span = match schema {
                SchemaRef::Inline(n) => n.0.get("type").map_or(n.0.span, |t| t.span),
                SchemaRef::Path(p) => p.span,
            };
            let name = &agent.name.value;
            let (message, label) = match ty {
                None => (
                    format!("the `input_schema` of tool `{name}` does not say `type: object`"),
                    "no `type`".to_string(),
                ),
                Some(t) => {
                    let shown = t.as_str().map_or_else(|| t.to_string(), str::to_string);
                    (
                        format!("the `input_schema` of tool `{name}` has `type: {shown}`, not `object`"),
                        "not `object`".to_string(),
                    )
                }
            };
            out.push(
                Diagnostic::new(&codes::TOOL_INPUT_NOT_OBJECT, span, message)
                    .label(label)
                    .with_secondary(
                        tool.name.span,
                        format!("a tool of agent loop `{}`", l.name.value),
                    )
                    .help("a tool's input is the object of arguments the model sends; describe it as `{type: object, properties: {...}}`, one property per argument"),
            );
        }
    }
}
