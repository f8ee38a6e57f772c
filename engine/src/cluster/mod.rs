//! Many machines (SPEC §12): one batch spread over any number of `worker` processes that share
//! one PostgreSQL database, which is the coordinator; there is no Switchyard server.
//!
//! - [`bundle`]: the flow and every file it reads, by content hash, stored with the batch so
//!   workers need no flow files.
//! - [`submit`]: the batch and one queued run per input line, streaming, idempotent per line.
//! - [`collect`]: the results in input order, each item once.
//! - [`worker`]: the claim loop, leases by heartbeat, takeovers, the drain.
//! - [`limits`]: provider limits held with the other workers of the store.
//! - [`budget`]: a batch's `--max-cost-usd` held by its workers together.

pub mod budget;
pub mod bundle;
pub mod collect;
pub mod limits;
pub mod submit;
pub mod worker;
