//! Batches (SPEC §10), being split by concept: for now all of it is in `input.rs`.

mod input;

pub use input::*;
pub(crate) use input::{Earlier, Lines, record_line, scan};
