//! The expression language (CEL, SPEC §5.1) in one place: parsing and macro expansion
//! (`parse.rs`, and cel-go's two-variable comprehensions in `two_var.rs`), the table of functions and macros an expression may call (`functions.rs`),
//! static types for lint (`types.rs`), evaluation over the run's JSON (`eval.rs` and the
//! files under `eval/`), cel-go's strings extension (`strings.rs`), and `file()`'s markers (`file.rs`). Compile, lint and the
//! runtime call into it; it does no I/O.

pub mod cache;
pub mod eval;
pub mod file;
pub mod functions;
mod parse;
pub mod path;
pub mod strings;
pub mod template;
pub mod time;
mod two_var;
pub mod ty;
pub mod types;
pub mod value;

pub use parse::{Call, Derived, Expr, ExprError, Macro, Reference, macro_of, parse};
