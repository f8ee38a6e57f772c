//! The flow as written: spanned, typed, unvalidated. Names are still strings.
//!
//! [`build::flow`] lowers a YAML [`Node`](crate::syntax::Node) tree into a [`Flow`], reporting
//! every shape problem (unknown keys, wrong types, bad durations) as a diagnostic and keeping
//! whatever it could read. Cross-references (steps, agents, providers, files) are checked by
//! `lint` and resolved by `compile`, never here.
//!
//! The types also derive [`JsonSchema`](schemars::JsonSchema): `schemas/flow.schema.json` is generated from them, so
//! their `serde` attributes describe the YAML surface (the names users write), not a Rust
//! serialisation.

pub mod build;
pub mod mock_files;
mod types;

pub use types::*;
