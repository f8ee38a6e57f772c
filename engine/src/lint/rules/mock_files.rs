//! The shape of files in mocks (SY103, SY104, SY105, SY108): `{file: {text, name}}` or
//! `{file: {path}}` in a `mock` agent's or a test mock's `returns` and `sequence`
//! ([`crate::model::mock_files`]). That a `path` exists is the loader's check (SY210).

use crate::diag::Diagnostic;
use crate::lint::FlowCx;
use crate::model::{AgentSpec, mock_files};

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    for a in cx.defined_agents() {
        if let AgentSpec::Mock(m) = &a.spec {
            for spec in mock_files::of_mock(m) {
                mock_files::check(spec, out);
            }
        }
    }
    for t in &cx.flow.tests {
        for m in t.mocks.values() {
            for spec in mock_files::of_mock(m) {
                mock_files::check(spec, out);
            }
        }
    }
}
