//! Switchyard: a declarative flow-graph engine for agent pipelines.
//!
//! The crate reads as a pipeline: `source` files → `syntax` (YAML → spanned nodes) →
//! `model` (typed, unresolved flow) → `lint` (every problem, as diagnostics) → `compile`
//! (names resolved, paths/expressions/templates parsed once) → `plan` (the petgraph graph the
//! runtime executes). `cli` is the only module that prints.
//!
//! An application embedding Switchyard uses what is exported here, and only that: [`Flow`]
//! (load and lint), [`Switchyard`] (run, resume, batch, events, native agents) and the types
//! their signatures name. Every type a public signature of these names is exported here too,
//! so `use switchyard::{...}` is all an application writes.
//!
//! The modules are private. [`__private`] reaches into them for the `switchyard` binary, the
//! benchmark and the integration tests: it is not part of the API, hidden from the
//! documentation, and changes in any release without notice.

mod agents;
mod alloc;
mod api;
mod batch;
mod cli;
mod cluster;
mod compile;
mod diag;
mod expr;
mod files;
mod glob;
mod inbox;
mod json;
mod lint;
mod model;
mod otel;
mod plan;
mod project;
mod record;
mod report;
mod runtime;
mod schema;
mod serve;
mod source;
mod store;
mod syntax;

pub use api::{
    AgentKind, Approval, BatchError, BatchOptions, BatchSummary, CancellationToken, Change, Cost,
    DecisionRow, Diagnostic, Elicitation, Error, ErrorKind, Event, Events, FileId, Flow, FlowError,
    Interrupt, Label, NativeAgent, NativeCall, NativeFuture, Natives, Origin, Otlp, PendingCall, Progress,
    Question, Refusal, ResumeError, ResumeOptions, Rule, RunConfig, RunControls, RunOptions, RunOutcome,
    RunRecord, RunStatus, Severity, Span, StepError, StepRecord, StepStatus, StoreError, Switchyard, Usage,
    Via, Violation, WaitingFor,
};

/// The engine's insides, for the `switchyard` binary, its benchmark and its integration
/// tests. **Not part of the API**: nothing here is documented or kept stable, and any release
/// may change or remove it. Applications use the crate root's exports.
#[doc(hidden)]
pub mod __private {
    pub mod agents {
        pub use crate::agents::*;
    }
    pub mod alloc {
        pub use crate::alloc::*;
    }
    pub mod batch {
        pub use crate::batch::*;
    }
    pub mod cli {
        pub use crate::cli::*;
    }
    pub mod cluster {
        pub use crate::cluster::*;
    }
    pub mod compile {
        pub use crate::compile::*;
    }
    pub mod diag {
        pub use crate::diag::*;
    }
    pub mod expr {
        pub use crate::expr::*;
    }
    pub mod files {
        pub use crate::files::*;
    }
    pub mod glob {
        pub use crate::glob::*;
    }
    pub mod inbox {
        pub use crate::inbox::*;
    }
    pub mod json {
        pub use crate::json::*;
    }
    pub mod lint {
        pub use crate::lint::*;
    }
    pub mod model {
        pub use crate::model::*;
    }
    pub mod otel {
        pub use crate::otel::*;
    }
    pub mod plan {
        pub use crate::plan::*;
    }
    pub mod project {
        pub use crate::project::*;
    }
    pub mod record {
        pub use crate::record::*;
    }
    pub mod report {
        pub use crate::report::*;
    }
    pub mod runtime {
        pub use crate::runtime::*;
    }
    pub mod schema {
        pub use crate::schema::*;
    }
    pub mod serve {
        pub use crate::serve::*;
    }
    pub mod source {
        pub use crate::source::*;
    }
    pub mod store {
        pub use crate::store::*;
    }
    pub mod syntax {
        pub use crate::syntax::*;
    }

    use std::sync::Arc;

    /// A [`crate::Switchyard`] over any store (the memory store, a `SqlStore`).
    pub fn with_store<S: crate::store::Store>(store: Arc<S>) -> crate::Switchyard<S> {
        crate::Switchyard::with_store(store)
    }

    /// The store a [`crate::Switchyard`] records in.
    pub fn store_of<S: crate::store::Store>(switchyard: &crate::Switchyard<S>) -> &Arc<S> {
        switchyard.store()
    }

    /// The engine a [`crate::Switchyard`] runs with.
    pub fn engine_of<S: crate::store::Store>(
        switchyard: &crate::Switchyard<S>,
    ) -> crate::runtime::engine::Engine<S> {
        switchyard.engine()
    }

    /// The store a [`Switchyard`](crate::Switchyard) runs on.
    pub fn api_store<S: crate::store::Store>(switchyard: &crate::Switchyard<S>) -> &Arc<S> {
        switchyard.store()
    }

    /// A loaded flow's compiled plan.
    pub fn plan_of(flow: &crate::Flow) -> &Arc<crate::plan::Plan> {
        flow.plan()
    }

    /// The files a flow was loaded from.
    pub fn project_of(flow: &crate::Flow) -> &crate::project::Project {
        flow.project()
    }

    /// Run options with agent changes (`--agent-change`) resolved against a plan.
    pub fn with_agent_changes(
        mut options: crate::RunOptions,
        changes: crate::plan::AgentChanges,
    ) -> crate::RunOptions {
        options.agent_changes = Arc::new(changes);
        options
    }

    /// Batch options for a store that holds nothing of earlier batches, the output left
    /// unsynced: what `batch --store memory` runs with.
    pub fn on_fresh_store(mut options: crate::BatchOptions) -> crate::BatchOptions {
        options.fresh_store = true;
        options.sync_output = false;
        options
    }
}
