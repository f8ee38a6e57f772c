//! YAML text → spanned nodes, under hard budgets. No flow semantics live here.
//!
//! [`parse`] turns the bytes of one file into a tree of [`Node`]s, each carrying the byte
//! [`Span`] of its text. YAML 1.2 core schema: only `true`/`false` are booleans (`yes`, `NO`,
//! `on` are strings), numbers with leading zeros stay strings, duplicate keys are errors.
//! Indentation follows YAML 1.2 too (continuation lines indented past their block, no tab
//! where indentation is due, implicit keys of at most 1024 characters), whichever path reads.
//! Every budget (file size, nesting depth, node count, alias expansion) names itself when hit.
//! Plain flow text (block mappings and lists, one-line scalars and flow collections) is read by
//! a fast path of bounded recursion, on the caller's thread (`fast`); anything else, and every
//! problem, by the full parser, on a thread with a known stack (`yaml`), so no input can
//! overflow the caller's.

mod fast;
mod limits;
mod scalar;
mod yaml;

use crate::source::{FileId, Span};

pub use limits::Limits;
pub use yaml::{parse, parse_collecting, too_large};
pub(crate) use yaml::{parse_collecting_here, parse_collecting_with, stack_bytes};

/// A YAML node with the span of its text in the source file.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub span: Span,
    pub value: Value,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Entries in document order. Keys are unique (duplicates are rejected by the parser).
    Map(Vec<(Key, Node)>),
}

/// A mapping key: scalar keys are kept as their text (`200: x` has key `"200"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    pub name: String,
    pub span: Span,
}

impl Node {
    pub fn file(&self) -> FileId {
        self.span.file
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&[(Key, Node)]> {
        match &self.value {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_seq(&self) -> Option<&[Node]> {
        match &self.value {
            Value::Seq(s) => Some(s),
            _ => None,
        }
    }

    /// The value under `key` when this node is a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_map()?.iter().find(|(k, _)| k.name == key).map(|(_, v)| v)
    }

    /// The key entry (with its span) under `key` when this node is a mapping.
    pub fn get_key(&self, key: &str) -> Option<&Key> {
        self.as_map()?.iter().find(|(k, _)| k.name == key).map(|(k, _)| k)
    }

    /// What kind of YAML value this is, for messages: "a string", "a mapping", ...
    pub fn type_name(&self) -> &'static str {
        match &self.value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    /// This node as a JSON value. Floats that are not finite become `null`.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::Str(s) => J::String(s.clone()),
            Value::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(entries) => J::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.name.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// The span of the characters `range` (byte offsets into this string's *value*) in the
    /// source, when the value appears verbatim there (plain or simply quoted scalars);
    /// otherwise the whole node's span. Used to put labels inside expressions and paths.
    pub fn str_sub_span(&self, source: &str, start: usize, end: usize) -> Span {
        let Value::Str(value) = &self.value else {
            return self.span;
        };
        str_sub_span(self.span, value, source, start, end)
    }
}

/// [`Node::str_sub_span`] for a string scalar given by its span and value, without a node:
/// the span of bytes `start..end` of `value` in `source` when the value appears verbatim
/// under `span` (plain, or right after an opening quote); otherwise `span` itself.
pub fn str_sub_span(span: Span, value: &str, source: &str, start: usize, end: usize) -> Span {
    let raw = source.get(span.start as usize..span.end as usize).unwrap_or("");
    let offset = if raw.starts_with(value) {
        Some(0)
    } else if (raw.starts_with('"') || raw.starts_with('\''))
        && raw.get(1..).is_some_and(|r| r.starts_with(value))
    {
        Some(1)
    } else {
        None
    };
    match offset {
        Some(o) if end <= value.len() => span.sub(o + start, o + end),
        _ => span,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn str_node(start: usize, end: usize, value: &str) -> Node {
        Node {
            span: Span::new(FileId(0), start, end),
            value: Value::Str(value.into()),
        }
    }

    #[test]
    fn sub_span_inside_plain_and_quoted_scalars() {
        let src = "if: a + b\nx: \"a + b\"\n";
        let plain = str_node(4, 9, "a + b");
        assert_eq!(plain.str_sub_span(src, 4, 5), Span::new(FileId(0), 8, 9));
        let quoted = str_node(13, 20, "a + b");
        assert_eq!(quoted.str_sub_span(src, 4, 5), Span::new(FileId(0), 18, 19));
    }
}
