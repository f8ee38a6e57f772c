//! Budgets ([`Limits`]): the file size is checked first; nesting depth, node count and alias
//! expansion are counted as events arrive, so every limit stops the parse where it is crossed,
//! and names itself and its value in its `SY101`. Also YAML 1.2's bound on an implicit key,
//! which both parsers keep.

use crate::diag::Diagnostic;
use crate::diag::codes::YAML_BUDGET;
use crate::source::{FileId, Span};

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

/// `SY101` for a file of `len` bytes over the `max`-byte limit. [`super::parse()`] reports it for bytes
/// it is given; a loader that checks the size before reading reports the same one.
pub fn too_large(file: FileId, len: usize, max: usize) -> Diagnostic {
    let (mut size, mut limit) = (approx_size(len), exact_size(max));
    if size == approx_size(max) {
        (size, limit) = (format!("{len} bytes"), format!("{max}-byte"));
    }
    Diagnostic::new(
        &YAML_BUDGET,
        Span::file_start(file),
        format!("file is {size}, larger than the {limit} limit"),
    )
    .label("file too large")
    .help("flow files are read whole; keep large data out of the flow file")
}

pub(super) fn depth_exceeded(span: Span, limits: &Limits) -> Diagnostic {
    Diagnostic::new(
        &YAML_BUDGET,
        span,
        format!("nesting depth limit exceeded ({} levels)", limits.max_depth),
    )
    .label("nested too deep here")
    .help("mappings and lists may nest this many levels, counting the top-level mapping")
}

pub(super) fn nodes_exceeded(span: Span, limits: &Limits) -> Diagnostic {
    Diagnostic::new(
        &YAML_BUDGET,
        span,
        format!("node limit exceeded ({} nodes)", limits.max_nodes),
    )
    .label("limit crossed here")
    .help("every key and value counts as a node, and so does every copy an alias or anchor makes")
}

pub(super) fn aliases_exceeded(span: Span, limits: &Limits) -> Diagnostic {
    Diagnostic::new(
        &YAML_BUDGET,
        span,
        format!(
            "alias expansion limit exceeded ({} nodes)",
            limits.max_alias_expansions
        ),
    )
    .label("alias expanded here")
    .help("aliases of values that hold aliases multiply the document; use fewer levels of aliases")
}

fn approx_size(n: usize) -> String {
    const KIB: f64 = 1024.0;
    let x = n as f64;
    if x >= KIB * KIB {
        format!("{:.1} MiB", x / (KIB * KIB))
    } else if x >= KIB {
        format!("{:.1} KiB", x / KIB)
    } else {
        format!("{n} bytes")
    }
}

fn exact_size(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n}-byte")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_limits() {
        let l = Limits::default();
        assert_eq!(
            (l.max_bytes, l.max_depth, l.max_nodes, l.max_alias_expansions),
            (8 << 20, 128, 1_000_000, 100_000)
        );
    }
}
