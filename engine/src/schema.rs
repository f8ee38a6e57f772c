//! The JSON Schema of flow files, generated from the model types. `schemas/flow.schema.json`
//! is this text; a test fails when they drift. Editors using the YAML language server pick it
//! up from the first line of a flow:
//! `# yaml-language-server: $schema=../schemas/flow.schema.json`.

use serde_json::{Map, Value};

use crate::model::build::{AGENT_COMMON_KEYS, IDENT_PATTERN, agent_keys};
use crate::model::{AgentKind, Flow};

/// The schema as pretty JSON text, with a trailing newline.
pub fn flow_schema_json() -> String {
    let schema = schemars::generate::SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<Flow>();
    let mut value = serde_json::to_value(&schema).expect("a schema is JSON");
    if let Value::Object(o) = &mut value {
        o.insert(
            "$id".into(),
            "https://switchyard.dev/schemas/flow.schema.json".into(),
        );
    }
    tidy(&mut value);
    close_agents(&mut value);
    name_identifiers(&mut value);
    let mut s = serde_json::to_string_pretty(&value).expect("a schema serializes");
    s.push('\n');
    s
}

/// Post-processing for editors:
/// - optional fields are absent, not `null`: drop the `null` alternatives that `Option<T>`
///   adds (a `key: ~` in a flow is then flagged, as the reader rejects it too);
/// - an object that forbids unknown keys and lists its kind keys in `oneOf` variants (a step)
///   declares those keys itself, or `additionalProperties: false` would reject them.
fn tidy(v: &mut Value) {
    match v {
        Value::Object(o) => {
            for child in o.values_mut() {
                tidy(child);
            }
            drop_null(o);
            lift_variant_properties(o);
        }
        Value::Array(items) => items.iter_mut().for_each(tidy),
        _ => {}
    }
}

fn drop_null(o: &mut Map<String, Value>) {
    if let Some(Value::Array(types)) = o.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let t = types.remove(0);
            o.insert("type".into(), t);
        }
    }
    if let Some(Value::Array(alts)) = o.get_mut("anyOf") {
        alts.retain(|a| {
            a.get("type") != Some(&Value::String("null".into())) || a.as_object().is_some_and(|m| m.len() > 1)
        });
        if alts.len() == 1 {
            let Some(Value::Object(only)) = alts.pop() else {
                return;
            };
            o.remove("anyOf");
            for (k, val) in only {
                o.entry(k).or_insert(val);
            }
        }
    }
}

fn lift_variant_properties(o: &mut Map<String, Value>) {
    if o.get("additionalProperties") != Some(&Value::Bool(false)) {
        return;
    }
    let Some(Value::Array(variants)) = o.get("oneOf") else {
        return;
    };
    let names: Vec<String> = variants
        .iter()
        .filter_map(|v| v.get("properties").and_then(Value::as_object))
        .flat_map(|p| p.keys().cloned())
        .collect();
    let props = o.entry("properties").or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(props) = props {
        for n in names {
            props.entry(n).or_insert_with(|| Value::Object(Map::new()));
        }
    }
}

/// Rewrites the agent definition as one closed object per kind: `kind` with its value, the
/// kind's own fields and the common ones, nothing else (`additionalProperties: false`), so an
/// editor flags a key lint reports as unknown. serde's flattened, tagged layout gives an open
/// object instead; an inline `flow` agent's keys (`steps`, `agents`, ...) are not in the model's
/// schema at all and are taken from the flow file's. The keys are lint's lists (`model/build/agents.rs`).
fn close_agents(root: &mut Value) {
    let flow_props = root["properties"].clone();
    let defs = root["definitions"]
        .as_object_mut()
        .expect("the schema has definitions");
    let Some(Value::Object(agent)) = defs.get("Agent").cloned() else {
        return;
    };
    let common = agent.get("properties").cloned().unwrap_or_default();
    let mut variants = Vec::new();
    for kind in AgentKind::ALL {
        let own_name = match kind {
            AgentKind::Llm => "LlmAgent",
            AgentKind::Command => "CommandAgent",
            AgentKind::Http => "HttpAgent",
            AgentKind::Flow => "FlowAgent",
            AgentKind::Transform => "TransformAgent",
            AgentKind::Mock => "MockAgent",
            AgentKind::Native => "NativeAgent",
            AgentKind::Mcp => "McpAgent",
        };
        let own = defs.get(own_name).cloned().unwrap_or_default();
        let mut props = Map::new();
        props.insert(
            "kind".into(),
            serde_json::json!({"type": "string", "const": kind.as_str()}),
        );
        for key in AGENT_COMMON_KEYS.iter().skip(1).chain(agent_keys(kind)) {
            let schema = own["properties"]
                .get(*key)
                .or_else(|| common.get(*key))
                .or_else(|| (kind == AgentKind::Flow).then(|| flow_props.get(*key)).flatten())
                .cloned()
                .unwrap_or_else(|| Value::Object(Map::new()));
            props.insert((*key).to_owned(), schema);
        }
        let mut required = vec![Value::from("kind")];
        if let Some(Value::Array(r)) = own.get("required") {
            required.extend(r.iter().cloned());
        }
        let mut variant = Map::new();
        variant.insert("type".into(), "object".into());
        variant.insert("properties".into(), Value::Object(props));
        variant.insert("required".into(), Value::Array(required));
        variant.insert("additionalProperties".into(), Value::Bool(false));
        variants.push(Value::Object(variant));
    }
    let mut closed = Map::new();
    if let Some(d) = agent.get("description") {
        closed.insert("description".into(), d.clone());
    }
    closed.insert("type".into(), "object".into());
    closed.insert("required".into(), serde_json::json!(["kind"]));
    closed.insert("oneOf".into(), Value::Array(variants));
    defs.insert("Agent".into(), Value::Object(closed));
    // The kinds' own definitions are inlined now; keep only those still referenced (a test's
    // `mocks` are `MockAgent`s).
    let text = serde_json::to_string(&*root).expect("a schema serializes");
    let defs = root["definitions"].as_object_mut().expect("definitions");
    defs.retain(|name, _| {
        !name.ends_with("Agent") || name == "Agent" || text.contains(&format!("\"#/definitions/{name}\""))
    });
}

/// Step, agent, provider and branch names are identifiers, and `end` is no step's id: the maps
/// they key say so with `propertyNames` (lint's SY106 and SY107).
fn name_identifiers(root: &mut Value) {
    let ident = serde_json::json!({"pattern": IDENT_PATTERN});
    let step_id = serde_json::json!({"pattern": IDENT_PATTERN, "not": {"const": "end"}});
    let name = |map: Option<&mut Value>, names: &Value| {
        if let Some(Value::Object(o)) = map {
            o.insert("propertyNames".into(), names.clone());
        }
    };
    name(root["properties"].get_mut("steps"), &step_id);
    name(root["properties"].get_mut("agents"), &ident);
    name(root["properties"].get_mut("providers"), &ident);
    let defs = &mut root["definitions"];
    for variant in defs["Agent"]["oneOf"].as_array_mut().into_iter().flatten() {
        name(variant["properties"].get_mut("steps"), &step_id);
        name(variant["properties"].get_mut("agents"), &ident);
    }
    for variant in defs["Step"]["oneOf"].as_array_mut().into_iter().flatten() {
        name(variant["properties"].get_mut("parallel"), &ident);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_in_schema_matches_the_model() {
        let checked_in = include_str!("../../schemas/flow.schema.json");
        assert!(
            checked_in == flow_schema_json(),
            "schemas/flow.schema.json is out of date: run `cargo run -- schema > schemas/flow.schema.json`"
        );
    }

    #[test]
    fn step_kind_keys_are_declared() {
        let v: Value = serde_json::from_str(&flow_schema_json()).expect("json");
        let step = &v["definitions"]["Step"];
        for k in [
            "agent",
            "set",
            "parallel",
            "interrupt",
            "fail",
            "succeed",
            "next",
            "foreach",
            "while",
        ] {
            assert!(
                step["properties"].get(k).is_some(),
                "{k} missing from Step properties"
            );
        }
        assert_eq!(step["additionalProperties"], Value::Bool(false));
    }

    #[test]
    fn flow_files_validate_against_the_schema() {
        let schema: Value = serde_json::from_str(&flow_schema_json()).expect("json");
        let validator = jsonschema::validator_for(&schema).expect("a valid schema");
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut checked = 0;
        for dir in ["flows", "examples"] {
            for entry in std::fs::read_dir(root.join(dir)).expect("dir exists") {
                let path = entry.expect("entry").path();
                if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
                    continue;
                }
                let bytes = std::fs::read(&path).expect("readable");
                let node = crate::syntax::parse(
                    crate::source::FileId(0),
                    &bytes,
                    &crate::syntax::Limits::default(),
                )
                .expect("flows parse");
                let errors: Vec<String> = validator
                    .iter_errors(&node.to_json())
                    .map(|e| format!("{} at {}", e, e.instance_path()))
                    .collect();
                assert!(
                    errors.is_empty(),
                    "{} does not validate: {errors:#?}",
                    path.display()
                );
                checked += 1;
            }
        }
        assert!(checked >= 5, "expected flow files, found {checked}");
    }

    #[test]
    fn agent_loop_fields_validate_as_lint_reads_them() {
        let schema: Value = serde_json::from_str(&flow_schema_json()).expect("json");
        let validator = jsonschema::validator_for(&schema).expect("a valid schema");
        let flow = |researcher: Value| {
            serde_json::json!({
                "flow": "x",
                "agents": {
                    "kb_search": {"kind": "mock", "returns": {}, "input_schema": {"type": "object"}},
                    "researcher": researcher,
                },
                "steps": {"a": {"agent": "researcher"}},
            })
        };
        let llm = |extra: Value| {
            let mut a = serde_json::json!({"kind": "llm", "provider": "p", "model": "m"});
            for (k, v) in extra.as_object().expect("a map") {
                a[k] = v.clone();
            }
            flow(a)
        };
        for good in [
            llm(
                serde_json::json!({"tools": ["kb_search"], "until_tool": "kb_search", "approve": ["kb_search"]}),
            ),
            llm(serde_json::json!({"tools": {"kb_search": {"description": "search"}, "other": null}})),
            llm(serde_json::json!({"tools": ["kb_search"], "max_iterations": 1, "max_parallel_tools": 5})),
            llm(serde_json::json!({"input_schema": "schemas/in.json"})),
        ] {
            let errors: Vec<String> = validator.iter_errors(&good).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{good}: {errors:?}");
        }
        for bad in [
            llm(serde_json::json!({"tools": "kb_search"})),
            llm(serde_json::json!({"tools": {"kb_search": {"desc": "search"}}})),
            llm(serde_json::json!({"tools": ["kb_search"], "max_iterations": 0})),
            llm(serde_json::json!({"tools": ["kb_search"], "max_parallel_tools": 0})),
            llm(serde_json::json!({"tools": ["kb_search"], "approve": "kb_search"})),
            llm(serde_json::json!({"tools": ["kb_search"], "until_tool": ["kb_search"]})),
            flow(serde_json::json!({"kind": "mock", "returns": {}, "tools": ["kb_search"]})),
        ] {
            assert!(!validator.is_valid(&bad), "{bad} validates");
        }
    }

    #[test]
    fn a_typo_fails_schema_validation() {
        let schema: Value = serde_json::from_str(&flow_schema_json()).expect("json");
        let validator = jsonschema::validator_for(&schema).expect("a valid schema");
        let bad = serde_json::json!({"flow": "x", "steps": {"a": {"set": {"$.a": "=1"}, "nxt": "b"}}});
        assert!(!validator.is_valid(&bad));
        let good = serde_json::json!({"flow": "x", "steps": {"a": {"set": {"$.a": "=1"}, "next": "end"}}});
        assert!(
            validator.is_valid(&good),
            "{:?}",
            validator
                .iter_errors(&good)
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
        );
    }
}
