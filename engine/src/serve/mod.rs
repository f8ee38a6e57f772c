//! Serving flows to other programs (SPEC §14): `mcp` makes flows the tools of MCP clients.
//! It runs flows through the library's surface (`api`), as `switchyard run` does, and prints
//! nothing: the command that starts a server (`cli`) says what happened.

pub mod mcp;
