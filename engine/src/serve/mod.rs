//! Serving flows and their stores to other programs: `mcp` makes flows the tools of MCP
//! clients (SPEC §14); `http` is `switchyard serve`, the inbox, runs and batches of a store
//! over HTTP (SPEC §15). They run flows through the library's surface (`api`) and the inbox
//! (`inbox`), and print nothing: the command that starts a server (`cli`) says what
//! happened.

pub mod http;
pub mod mcp;
