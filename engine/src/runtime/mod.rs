//! The runtime: a tokio executor over the compiled plan only — never YAML nodes, never
//! unresolved names.
//!
//! [`data`] builds agent input documents and applies outputs (SPEC §5.2–5.4), evaluating
//! expressions with `crate::expr`.

pub mod budget;
pub mod changes;
pub mod data;
pub mod engine;
pub mod observe;
pub mod resume;
pub mod steps;
