//! Model → plan: names resolved, every JSONPath, expression and template parsed once (by
//! `crate::expr`'s parsers, through its `cache`, so that what lint parsed is what lowering
//! compiles).

mod lower;
pub use lower::{
    DEFAULT_MAX_ITEMS, DEFAULT_MAX_MCP_RESULT, DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT, compile, mcp_server_plan,
};
