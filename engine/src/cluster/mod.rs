//! Many machines (SPEC §12): one batch spread over any number of `worker` processes that share
//! one PostgreSQL database, which is the coordinator; there is no Switchyard server.
//!
//! - [`bundle`]: the flow and every file it reads, by content hash, stored with the batch so
//!   workers need no flow files.

pub mod bundle;
