//! The runtime: a tokio executor over the compiled plan only — never YAML nodes, never
//! unresolved names.
//!
//! [`eval`] evaluates CEL expressions over shared JSON values without converting whole
//! payloads (with the strings extension of [`strings`]); [`data`] builds agent input documents and applies outputs (SPEC §5.2–5.4).

pub mod budget;
pub mod changes;
pub mod cost;
pub mod data;
pub mod engine;
pub mod error;
pub mod observe;
pub mod record;
pub mod resume;
pub mod steps;
pub mod time;

pub use error::{ErrorKind, StepError};
