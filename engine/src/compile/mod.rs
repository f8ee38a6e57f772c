//! Model → plan: names resolved, every JSONPath, expression and template parsed once.
//!
//! The primitives ([`path`], [`expr`], [`template`], [`value`]) parse text into reusable,
//! pre-compiled forms and report problems with byte offsets inside the text, which callers
//! turn into spans inside the YAML string. [`functions`] is the table of every function and macro
//! an expression may call, which lint checks calls against. [`cache`] keeps them by text for one command, so
//! that what lint parsed is what lowering compiles.

pub mod cache;
pub mod path;
pub mod template;
pub mod value;

mod lower;
pub use lower::{DEFAULT_MAX_ITEMS, DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT, compile};
