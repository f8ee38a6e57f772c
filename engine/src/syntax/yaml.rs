//! YAML parsing with serde-saphyr into [`Node`](super::Node)s.
use super::Node;
use crate::diag::Diagnostic;
use crate::source::FileId;

/// Hard limits on one file.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_bytes: usize,
    pub max_depth: usize,
    pub max_nodes: usize,
    pub max_alias_expansions: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_bytes: 8 << 20, max_depth: 64, max_nodes: 1_000_000, max_alias_expansions: 10_000 }
    }
}

/// Parses one file.
pub fn parse(_file: FileId, _bytes: &[u8], _limits: &Limits) -> Result<Node, Diagnostic> {
    unimplemented!("syntax::parse")
}
