//! The hard limits a YAML file is parsed under ([`Limits`]), shared by the full parser
//! (`yaml.rs`) and the fast path (`fast.rs`).

/// Hard limits on one file. Every limit names itself and its value when it is crossed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest file accepted, in bytes, checked before parsing. Default: 8 MiB.
    pub max_bytes: usize,
    /// Deepest nesting of mappings and lists; the top-level mapping is level 1. Default: 128,
    /// room for JSON Schemas nested dozens of levels deep inside a flow. The parse itself never
    /// recurses; code that walks or drops a tree recurses once per level, so raise this far
    /// (beyond a few thousand) only where that code runs on a big enough stack.
    pub max_depth: usize,
    /// Most nodes (scalars, mappings, lists and keys), counting the copies that aliases make
    /// and the copy kept of each anchored node. Default: 1,000,000.
    pub max_nodes: usize,
    /// Most nodes that aliases may copy into the tree in one file, which stops "billion laughs"
    /// alias bombs. Default: 100,000.
    pub max_alias_expansions: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 8 << 20,
            max_depth: 128,
            max_nodes: 1_000_000,
            max_alias_expansions: 100_000,
        }
    }
}

/// The longest implicit key, with the spaces before its `:` (YAML 1.2 production [154]); the
/// parser's `simple_key_max_lookahead` keeps this bound, in block and flow mappings alike.
pub(super) const MAX_IMPLICIT_KEY_CHARS: usize = 1024;
