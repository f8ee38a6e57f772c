//! The JSON Schema of flow files, generated from the model types. `schemas/flow.schema.json`
//! is this text; a test fails when they drift. Editors using the YAML language server pick it
//! up from the first line of a flow:
//! `# yaml-language-server: $schema=../schemas/flow.schema.json`.

use serde_json::{Map, Value};

use crate::model::Flow;

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
