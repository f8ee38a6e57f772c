//! The JSON Schema of flow files, generated from the model types. `schemas/flow.schema.json`
//! is this text; a test fails when they drift.

use crate::model::Flow;

/// The schema as pretty JSON text, with a trailing newline.
pub fn flow_schema_json() -> String {
    let mut schema = schemars::generate::SchemaSettings::draft07().into_generator().into_root_schema_for::<Flow>();
    schema.insert("$id".into(), "https://switchyard.dev/schemas/flow.schema.json".into());
    let mut s = serde_json::to_string_pretty(&schema).expect("a schema serializes");
    s.push('\n');
    s
}
