//! Lint rules, one file per pattern caught. Each exposes `check`, which appends diagnostics.

pub mod bounds;
pub mod capability;
pub mod change_targets;
pub mod cycles;
pub mod data;
pub mod error_kind_never_raised;
pub mod expiry_without_approval;
pub mod expression_types;
pub mod fallback;
pub mod files;
pub mod hosts;
pub mod loop_mcp_tools;
pub mod loop_without_tools;
pub mod mcp_tools;
pub mod mock_files;
pub mod payload_types;
pub mod reachability;
pub mod references;
pub mod secrets;
pub mod shell;
pub mod tool_cycle;
pub mod tool_input;
pub mod unknown_function;
pub mod unknown_tool;
