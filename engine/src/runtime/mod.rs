//! The runtime: a tokio executor over the compiled plan only — never YAML nodes, never
//! unresolved names.
//!
//! [`eval`] evaluates CEL expressions over shared JSON values without converting whole
//! payloads (with the strings extension of [`strings`]); [`data`] builds agent input documents and applies outputs (SPEC §5.2–5.4).

pub mod budget;
pub mod changes;
pub mod data;
pub mod engine;
pub mod eval;
pub mod observe;
pub mod resume;
pub mod steps;
pub mod strings;
pub mod time;
pub mod zone;

// The record types at the paths `batch.rs` and `eval.rs` still import them by.
pub(crate) use crate::record;
pub use crate::record::{ErrorKind, StepError, cost, error};
