//! Switchyard: a declarative flow-graph engine for agent pipelines.
//!
//! The crate reads as a pipeline: [`source`] files → [`syntax`] (YAML → spanned nodes) →
//! [`model`] (typed, unresolved flow) → [`lint`] (every problem, as [`diag`]nostics) →
//! [`compile`] (names resolved, paths/expressions/templates parsed once) → [`plan`] (the
//! petgraph graph the runtime executes). `cli` is the only module that prints.
//!
//! An application embedding Switchyard starts at [`api`], whose main types are re-exported
//! here: [`Flow`] (load and lint), [`Switchyard`] (run, resume, batch, events, native
//! agents).

pub mod agents;
pub mod alloc;
pub mod api;
pub mod batch;
pub mod cli;
pub mod cluster;
pub mod compile;
pub mod diag;
pub mod glob;
pub mod json;
pub mod lint;
pub mod model;
pub mod otel;
pub mod plan;
pub mod project;
pub mod report;
pub mod runtime;
pub mod schema;
pub mod source;
pub mod store;
pub mod syntax;

pub use api::{
    BatchOptions, BatchSummary, Error, ErrorKind, Event, Events, Flow, FlowError, NativeAgent, NativeCall,
    Natives, RunConfig, RunOptions, RunOutcome, RunStatus, StepError, Switchyard,
};
