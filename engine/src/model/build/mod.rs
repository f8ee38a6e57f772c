//! Lowering YAML nodes into the model (being split by concept; for now all of it is in
//! `steps.rs`).

mod steps;

pub use steps::*;
