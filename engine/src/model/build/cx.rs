//! The state of one lowering.

use crate::diag::Diagnostic;
use crate::model::{Flow, Sp};
use crate::source::Span;
use crate::syntax::Node;

/// The state of one lowering: the source text (for spans inside strings), the diagnostics, and
/// the steps kept with a placeholder kind.
pub struct Cx<'a> {
    pub source: &'a str,
    pub diags: Vec<Diagnostic>,
    /// The id spans of steps whose kind could not be read (no kind key, an agent that could
    /// not be lowered, not a mapping at all). Each has an error in `diags` saying why; the
    /// step stays in the model with [`super::placeholder_kind`], so that edges to it resolve and the
    /// steps after it stay reachable. Lint skips its kind-specific rules.
    pub malformed_steps: Vec<Span>,
    /// Lowers the body of a flow an agent holds inline (`kind: flow` with `steps:`): the
    /// flow's lowering, which holds agents in turn, handed in by [`Cx::new`] so that the
    /// files lowering agents and flows do not import each other.
    pub(super) inline_flow: fn(&mut Cx, &Node, Sp<String>) -> Flow,
}

impl Cx<'_> {
    pub(super) fn push(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }
}
