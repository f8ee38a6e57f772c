//! YAML parsing with serde-saphyr into [`Node`](super::Node)s, under hard budgets.
//!
//! The text is deserialized through serde-saphyr's `deserialize_any` into a raw tree whose every
//! value and key is wrapped in [`serde_saphyr::Spanned`], then converted into [`Node`]s with byte
//! spans. The conversion also rejects duplicate and non-scalar keys, and picks each node's span:
//! the text that defines it, except that the top of an alias expansion points at the `*alias`.
//!
//! Budgets are enforced twice: serde-saphyr's own `Budget`/`AliasLimits` stop the event stream
//! (nesting, nodes, aliases), and the visitor counts every node it builds, alias expansions
//! included, and the nesting it recurses into. Parsing runs on its own thread with a stack of
//! [`PARSE_STACK_BYTES`] plus a per-level allowance, so no input can overflow the caller's stack.
//! This module knows YAML, not flows.

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::budget::BudgetBreach;
use serde_saphyr::granit_parser::ErrorKind as ScanErrorKind;
use serde_saphyr::{
    DuplicateKeyPolicy, ExternalMessageSource, MessageFormatter, NonFiniteFloatPolicy, Spanned,
};

use super::{Key, Node, Value};
use crate::diag::codes::{DUPLICATE_KEY, YAML_BUDGET, YAML_SYNTAX};
use crate::diag::Diagnostic;
use crate::source::{FileId, Span};

/// Hard limits on one file. Every limit names itself and its value when it is hit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest file accepted, in bytes, checked before parsing. Default: 8 MiB.
    pub max_bytes: usize,
    /// Deepest nesting of mappings and sequences (the top-level mapping is level 1).
    /// Default: 128, room for JSON Schemas nested dozens of levels inside a flow.
    pub max_depth: usize,
    /// Most nodes (scalars, mappings, sequences and mapping keys), counting every copy that an
    /// alias expands to. Default: 1,000,000.
    pub max_nodes: usize,
    /// Most parser events that aliases may replay in one file, which bounds what `*alias`
    /// references can add to the tree ("billion laughs"). Default: 100,000.
    pub max_alias_expansions: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_bytes: 8 << 20, max_depth: 128, max_nodes: 1_000_000, max_alias_expansions: 100_000 }
    }
}

/// Stack of the parsing thread before the per-level allowance: serde's recursion and the
/// YAML scanner need well under this for a flat file.
pub const PARSE_STACK_BYTES: usize = 16 << 20;

/// Stack allowed per nesting level on top of [`PARSE_STACK_BYTES`]. One YAML level is a dozen
/// serde frames (value → `Spanned` → map access → value); unoptimized builds use the most.
const STACK_BYTES_PER_LEVEL: usize = 64 << 10;

/// Largest stack requested for the parsing thread, whatever `max_depth` asks for. It is
/// reserved address space, committed only as deep nesting actually touches it.
const MAX_PARSE_STACK_BYTES: usize = 1 << 30;

/// Parses one file into a spanned [`Node`] tree.
///
/// An empty file, or one holding only comments, gives a [`Value::Null`] node. Every problem is a
/// diagnostic: `SY100` (not UTF-8, not YAML, more than one document), `SY101` (a limit of
/// [`Limits`] was crossed) or `SY102` (a duplicate key). This function never panics.
pub fn parse(file: FileId, bytes: &[u8], limits: &Limits) -> Result<Node, Diagnostic> {
    if bytes.len() > limits.max_bytes {
        return Err(too_large(file, bytes.len(), limits.max_bytes));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| not_utf8(file, bytes, &e))?;
    let stack = STACK_BYTES_PER_LEVEL
        .saturating_mul(limits.max_depth)
        .saturating_add(PARSE_STACK_BYTES)
        .min(MAX_PARSE_STACK_BYTES);
    let stack = std::env::var("SY_STACK").ok().and_then(|v| v.parse().ok()).unwrap_or(stack); // TEMP
    std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .name("switchyard-yaml".into())
            .stack_size(stack)
            .spawn_scoped(scope, || parse_text(file, text, limits));
        match spawned {
            Ok(handle) => handle.join().unwrap_or_else(|_| Err(internal(file, "the YAML parser failed"))),
            Err(e) => Err(internal(file, &format!("cannot start the YAML parser thread: {e}"))),
        }
    })
}

/// Parses valid UTF-8 text on the current thread. The caller provides the stack (see [`parse`]).
fn parse_text(file: FileId, text: &str, limits: &Limits) -> Result<Node, Diagnostic> {
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: limits.max_depth,
            // The scanner checks flow nesting before the budget sees the events; one level of
            // slack lets the budget report the depth, the scanner error is mapped the same way.
            flow_nesting_limit: limits.max_depth.saturating_add(1),
            max_nodes: limits.max_nodes,
            max_events: limits.max_nodes.saturating_mul(3).saturating_add(16),
            max_aliases: limits.max_alias_expansions,
            // Many aliases of one anchor (`retry: *standard` in every step) is legitimate; the
            // replay limit below is what stops alias bombs.
            enforce_alias_anchor_ratio: false,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: limits.max_alias_expansions,
        },
        // Duplicates are found while converting, where both keys' spans are known.
        duplicate_keys: DuplicateKeyPolicy::PassThrough,
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        non_finite_float_policy: NonFiniteFloatPolicy::PassThrough,
        reject_unsupported_tags: true,
        with_snippet: false,
    };

    BUDGET.set(Budget { max_depth: limits.max_depth, max_nodes: limits.max_nodes, ..Budget::default() });
    let result = serde_saphyr::from_str_with_options::<Spanned<RawValue>>(text, options);
    let budget = BUDGET.replace(Budget::default());
    let mut conv = Converter { file, text, chars: CharCursor::default() };
    match result {
        Ok(root) => conv.node(Raw::from(root), None),
        Err(e) => Err(conv.error(&e, budget.tripped, limits)),
    }
}

// ---------------------------------------------------------------------------------------------
// Raw tree: what the serde visitor builds, with serde-saphyr's spans.

/// A value with the spans serde-saphyr gave it: where it is used (`*alias` for an alias) and
/// where it is defined (the anchored text).
struct Raw {
    referenced: serde_saphyr::Span,
    defined: serde_saphyr::Span,
    value: RawValue,
}

impl From<Spanned<RawValue>> for Raw {
    fn from(s: Spanned<RawValue>) -> Self {
        Raw { referenced: s.referenced.span(), defined: s.defined.span(), value: s.value }
    }
}

enum RawValue {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Raw>),
    Map(Vec<(Raw, Raw)>),
}

/// Counters of the visitor, per parsing thread. A thread-local because `Spanned<T>` needs
/// `T: Deserialize`, which cannot carry state of its own.
#[derive(Clone, Copy, Default)]
struct Budget {
    max_depth: usize,
    max_nodes: usize,
    depth: usize,
    nodes: usize,
    tripped: Option<Tripped>,
}

/// Which of the visitor's own limits stopped the parse, and where when known.
#[derive(Clone, Copy, Debug)]
enum Tripped {
    Depth,
    Nodes(serde_saphyr::Span),
}

thread_local! {
    static BUDGET: Cell<Budget> = const {
        Cell::new(Budget { max_depth: 0, max_nodes: 0, depth: 0, nodes: 0, tripped: None })
    };
}

fn enter<E: de::Error>() -> Result<(), E> {
    let mut b = BUDGET.get();
    b.depth += 1;
    if b.depth > b.max_depth {
        b.tripped = Some(Tripped::Depth);
        BUDGET.set(b);
        return Err(E::custom("nesting depth limit exceeded"));
    }
    BUDGET.set(b);
    Ok(())
}

fn leave() {
    let mut b = BUDGET.get();
    b.depth = b.depth.saturating_sub(1);
    BUDGET.set(b);
}

/// Counts one node built by the visitor (alias copies included).
fn count<E: de::Error>(node: &Spanned<RawValue>) -> Result<(), E> {
    let mut b = BUDGET.get();
    b.nodes += 1;
    if b.nodes > b.max_nodes {
        b.tripped = Some(Tripped::Nodes(node.referenced.span()));
        BUDGET.set(b);
        return Err(E::custom("node limit exceeded"));
    }
    BUDGET.set(b);
    Ok(())
}

impl<'de> Deserialize<'de> for RawValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = RawValue;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_unit<E>(self) -> Result<RawValue, E> {
        Ok(RawValue::Null)
    }

    fn visit_none<E>(self) -> Result<RawValue, E> {
        Ok(RawValue::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<RawValue, D::Error> {
        d.deserialize_any(RawVisitor)
    }

    fn visit_bool<E>(self, v: bool) -> Result<RawValue, E> {
        Ok(RawValue::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<RawValue, E> {
        Ok(RawValue::Int(v))
    }

    /// Integers beyond `i64` become floats, as JSON numbers would.
    fn visit_u64<E>(self, v: u64) -> Result<RawValue, E> {
        Ok(i64::try_from(v).map_or(RawValue::Float(v as f64), RawValue::Int))
    }

    fn visit_i128<E>(self, v: i128) -> Result<RawValue, E> {
        Ok(i64::try_from(v).map_or(RawValue::Float(v as f64), RawValue::Int))
    }

    fn visit_u128<E>(self, v: u128) -> Result<RawValue, E> {
        Ok(i64::try_from(v).map_or(RawValue::Float(v as f64), RawValue::Int))
    }

    fn visit_f64<E>(self, v: f64) -> Result<RawValue, E> {
        Ok(RawValue::Float(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<RawValue, E> {
        Ok(RawValue::Str(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<RawValue, E> {
        Ok(RawValue::Str(v))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<RawValue, E> {
        match std::str::from_utf8(v) {
            Ok(s) => Ok(RawValue::Str(s.to_owned())),
            Err(_) => Err(E::custom("binary data that is not UTF-8 text is not supported")),
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawValue, A::Error> {
        enter()?;
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(256));
        while let Some(item) = seq.next_element::<Spanned<RawValue>>()? {
            count(&item)?;
            items.push(Raw::from(item));
        }
        leave();
        Ok(RawValue::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawValue, A::Error> {
        enter()?;
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(256));
        while let Some(key) = map.next_key::<Spanned<RawValue>>()? {
            count(&key)?;
            let value = map.next_value::<Spanned<RawValue>>()?;
            count(&value)?;
            entries.push((Raw::from(key), Raw::from(value)));
        }
        leave();
        Ok(RawValue::Map(entries))
    }
}

// ---------------------------------------------------------------------------------------------
// Conversion: raw tree → nodes with byte spans; errors → diagnostics.

struct Converter<'a> {
    file: FileId,
    text: &'a str,
    chars: CharCursor,
}

impl Converter<'_> {
    /// Converts `raw`, whose parent was referenced at `parent_ref` (`None` for the root).
    fn node(&mut self, raw: Raw, parent_ref: Option<serde_saphyr::Span>) -> Result<Node, Diagnostic> {
        let Raw { referenced, defined, value } = raw;
        // Inside an alias expansion every node is "referenced" at the `*alias` token. The top of
        // the expansion keeps that span; the nodes below it point at the text that defines them.
        let alias_top = referenced != defined && parent_ref != Some(referenced);
        let own = if alias_top || defined == serde_saphyr::Span::UNKNOWN { referenced } else { defined };
        let (start, mut end) = self.range(own).unwrap_or((0, 0));
        let value = match value {
            RawValue::Null => Value::Null,
            RawValue::Bool(b) => Value::Bool(b),
            RawValue::Int(i) => Value::Int(i),
            RawValue::Float(f) => Value::Float(f),
            RawValue::Str(s) => {
                end = trim_end(self.text, start, end);
                Value::Str(s)
            }
            RawValue::Seq(items) => {
                let mut nodes = Vec::with_capacity(items.len());
                for item in items {
                    let node = self.node(item, Some(referenced))?;
                    end = end.max(node.span.end as usize);
                    nodes.push(node);
                }
                Value::Seq(nodes)
            }
            RawValue::Map(raw_entries) => {
                let mut entries: Vec<(Key, Node)> = Vec::with_capacity(raw_entries.len());
                let mut index: HashMap<String, usize> = HashMap::new();
                for (raw_key, raw_value) in raw_entries {
                    let key = self.key(raw_key, referenced)?;
                    if let Some(first) = find_key(&entries, &mut index, &key.name) {
                        return Err(self.duplicate(&entries[first].0, &key));
                    }
                    let node = self.node(raw_value, Some(referenced))?;
                    end = end.max(key.span.end as usize).max(node.span.end as usize);
                    entries.push((key, node));
                }
                Value::Map(entries)
            }
        };
        if !alias_top && matches!(value, Value::Seq(_) | Value::Map(_)) {
            end = close_flow(self.text, start, end);
        }
        Ok(Node { span: Span::new(self.file, start, end), value })
    }

    fn key(&mut self, raw: Raw, parent_ref: serde_saphyr::Span) -> Result<Key, Diagnostic> {
        let spelled = self.range(raw.defined).map(|(s, e)| (s, trim_end(self.text, s, e)));
        let node = self.node(raw, Some(parent_ref))?;
        let spelling = spelled.and_then(|(s, e)| self.text.get(s..e));
        let name = match node.value {
            Value::Str(s) => s,
            Value::Seq(_) | Value::Map(_) => {
                let what = if matches!(node.value, Value::Seq(_)) { "list" } else { "mapping" };
                return Err(Diagnostic::new(
                    &YAML_SYNTAX,
                    node.span,
                    format!("a mapping key must be a scalar, not a {what}"),
                )
                .label(format!("{what} used as a key"))
                .help("keys are names: write `name: value`"));
            }
            // Keys keep their spelling: `200: x` has key "200", `0x1F: x` has key "0x1F".
            Value::Null => spelling.unwrap_or("null").to_owned(),
            Value::Bool(b) => spelling.map_or_else(|| b.to_string(), str::to_owned),
            Value::Int(i) => spelling.map_or_else(|| i.to_string(), str::to_owned),
            Value::Float(f) => spelling.map_or_else(|| f.to_string(), str::to_owned),
        };
        Ok(Key { name, span: node.span })
    }

    fn duplicate(&self, first: &Key, second: &Key) -> Diagnostic {
        let line = line_of(self.text, first.span.start as usize);
        Diagnostic::new(&DUPLICATE_KEY, second.span, format!("duplicate key `{}`", second.name))
            .label("defined again here")
            .with_secondary(first.span, "first defined here")
            .help(format!("`{}` is first defined on line {line}; keep one of the two", second.name))
    }

    /// Byte range of a serde-saphyr span (which carries byte offsets for string input; the
    /// character offset is converted otherwise).
    fn range(&mut self, span: serde_saphyr::Span) -> Option<(usize, usize)> {
        if span == serde_saphyr::Span::UNKNOWN {
            return None;
        }
        let len = self.text.len();
        if let (Some(offset), Some(bytes)) = (span.byte_offset(), span.byte_len()) {
            let start = usize::try_from(offset).unwrap_or(len).min(len);
            let end = usize::try_from(offset.saturating_add(bytes)).unwrap_or(len).min(len);
            return Some((start, end));
        }
        let first = usize::try_from(span.offset()).unwrap_or(usize::MAX);
        let start = self.chars.byte_of(self.text, first);
        let end = self.chars.byte_of(self.text, first.saturating_add(usize::try_from(span.len()).unwrap_or(0)));
        Some((start, end))
    }

    /// Turns a serde-saphyr error into a diagnostic. `tripped` is the visitor's own limit, if
    /// that is what stopped the parse.
    fn error(&mut self, err: &serde_saphyr::Error, tripped: Option<Tripped>, limits: &Limits) -> Diagnostic {
        let err = innermost(err);
        let at = err.location().and_then(|l| self.range(l.span()));
        let span = at.map_or(Span::file_start(self.file), |(s, e)| Span::new(self.file, s, e));
        match tripped {
            Some(Tripped::Depth) => return depth_exceeded(span, limits),
            Some(Tripped::Nodes(node)) => {
                let span = self.range(node).map_or(span, |(s, e)| Span::new(self.file, s, e));
                return nodes_exceeded(span, limits);
            }
            None => {}
        }
        use serde_saphyr::Error as E;
        match err {
            E::Budget { breach, .. } => self.breach(breach, span, limits),
            E::AliasReplayLimitExceeded { .. } | E::AliasExpansionLimitExceeded { .. } => {
                aliases_exceeded(span, limits)
            }
            E::AliasReplayStackDepthExceeded { max_depth, .. } => Diagnostic::new(
                &YAML_BUDGET,
                span,
                format!("alias nesting limit exceeded ({max_depth} levels)"),
            )
            .label("alias expanded here")
            .help("an alias expands to a value that uses further aliases, too many levels deep"),
            E::ExternalMessage { source, .. }
                if matches!(source.as_ref(),
                    ExternalMessageSource::Parser(e) if matches!(e.kind(), ScanErrorKind::RecursionLimitExceeded)) =>
            {
                depth_exceeded(span, limits)
            }
            E::MultipleDocuments { .. } => self.second_document(span),
            E::DuplicateMappingKey { key, .. } => {
                let key = key.as_deref().unwrap_or("?");
                Diagnostic::new(&DUPLICATE_KEY, span, format!("duplicate key `{key}`")).label("defined again here")
            }
            E::InvalidUtf8Input => Diagnostic::new(&YAML_SYNTAX, span, "file is not valid UTF-8"),
            other => {
                let message = serde_saphyr::DefaultMessageFormatter.format_message(other);
                Diagnostic::new(&YAML_SYNTAX, span, clean_message(&message)).label("here")
            }
        }
    }

    fn breach(&self, breach: &BudgetBreach, span: Span, limits: &Limits) -> Diagnostic {
        match breach {
            BudgetBreach::Depth { .. } => depth_exceeded(span, limits),
            BudgetBreach::Nodes { .. } | BudgetBreach::Events { .. } => nodes_exceeded(span, limits),
            BudgetBreach::Aliases { .. } => aliases_exceeded(span, limits),
            BudgetBreach::Documents { .. } => self.second_document(span),
            other => Diagnostic::new(&YAML_BUDGET, span, format!("YAML budget exceeded: {}", breach_name(other)))
                .label("limit crossed here"),
        }
    }

    /// "one document" error, pointing at the `---` that starts the second document when it
    /// can be found just before the position serde-saphyr reports.
    fn second_document(&self, at: Span) -> Diagnostic {
        let span = find_document_marker(self.text, at.start as usize)
            .map_or(at, |s| Span::new(self.file, s, s + 3));
        Diagnostic::new(&YAML_SYNTAX, span, "a flow file holds one YAML document")
            .label("second document starts here")
            .help("remove the `---` separator, or move the second document to its own file")
    }
}

/// The index of the entry named `name`, if any. Small maps are scanned; larger ones get an index.
fn find_key(entries: &[(Key, Node)], index: &mut HashMap<String, usize>, name: &str) -> Option<usize> {
    const SCAN: usize = 16;
    if entries.len() < SCAN {
        return entries.iter().position(|(k, _)| k.name == name);
    }
    if index.is_empty() {
        index.extend(entries.iter().enumerate().map(|(i, (k, _))| (k.name.clone(), i)));
    } else {
        let (k, _) = entries.last().expect("entries is not empty");
        index.insert(k.name.clone(), entries.len() - 1);
    }
    index.get(name).copied()
}

/// Unwraps alias context and snippets down to the error that says what went wrong.
fn innermost(err: &serde_saphyr::Error) -> &serde_saphyr::Error {
    match err.without_snippet() {
        serde_saphyr::Error::AliasError { error, .. } => innermost(error),
        other => other,
    }
}

fn breach_name(breach: &BudgetBreach) -> String {
    let debug = format!("{breach:?}");
    debug.split([' ', '{', '(']).next().unwrap_or("limit").to_lowercase()
}

/// Terse, lower case, one line, no location suffix, no trailing period.
fn clean_message(message: &str) -> String {
    let one_line: String = message.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let mut out = one_line.split_whitespace().collect::<Vec<_>>().join(" ");
    while out.ends_with('.') {
        out.pop();
    }
    let mut chars = out.chars();
    let Some(first) = chars.next() else { return "invalid YAML".to_owned() };
    // Lower-case a capitalized first word, but keep acronyms ("YAML ...") as they are.
    if first.is_uppercase() && !chars.clone().next().is_some_and(char::is_uppercase) {
        first.to_lowercase().chain(chars).collect()
    } else {
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Limit diagnostics.

fn too_large(file: FileId, len: usize, max: usize) -> Diagnostic {
    let (mut size, mut limit) = (approx_size(len), exact_size(max));
    if size == approx_size(max) {
        (size, limit) = (format!("{len} bytes"), format!("{max}-byte"));
    }
    Diagnostic::new(&YAML_BUDGET, Span::file_start(file), format!("file is {size}, larger than the {limit} limit"))
        .label("file too large")
        .help("flow files are read whole; keep large data out of the flow file")
}

fn depth_exceeded(span: Span, limits: &Limits) -> Diagnostic {
    Diagnostic::new(&YAML_BUDGET, span, format!("nesting depth limit exceeded ({} levels)", limits.max_depth))
        .label("nested too deep here")
        .help("mappings and lists may nest this many levels, counting the top-level mapping")
}

fn nodes_exceeded(span: Span, limits: &Limits) -> Diagnostic {
    Diagnostic::new(&YAML_BUDGET, span, format!("node limit exceeded ({} nodes)", limits.max_nodes))
        .label("limit crossed here")
        .help("every key, value and alias copy counts as a node")
}

fn aliases_exceeded(span: Span, limits: &Limits) -> Diagnostic {
    Diagnostic::new(
        &YAML_BUDGET,
        span,
        format!("alias expansion limit exceeded ({} nodes)", limits.max_alias_expansions),
    )
    .label("alias expanded here")
    .help("aliases that expand to aliases multiply the document; use fewer levels of aliases")
}

fn not_utf8(file: FileId, bytes: &[u8], e: &std::str::Utf8Error) -> Diagnostic {
    let start = e.valid_up_to();
    let end = start + e.error_len().unwrap_or(bytes.len() - start);
    Diagnostic::new(&YAML_SYNTAX, Span::new(file, start, end), "file is not valid UTF-8")
        .label(format!("invalid byte 0x{:02x}", bytes.get(start).copied().unwrap_or(0)))
        .help("flow files are UTF-8 text; is this a binary file, or saved in another encoding?")
}

fn internal(file: FileId, message: &str) -> Diagnostic {
    Diagnostic::new(&YAML_SYNTAX, Span::file_start(file), message.to_owned())
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
    if n >= 1 << 20 && n % (1 << 20) == 0 {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n % (1 << 10) == 0 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n}-byte")
    }
}

// ---------------------------------------------------------------------------------------------
// Text helpers.

/// `end` moved back over trailing whitespace (block scalars' spans run to the next token).
fn trim_end(text: &str, start: usize, end: usize) -> usize {
    let bytes = text.as_bytes();
    let mut end = end.min(bytes.len());
    while end > start && matches!(bytes[end - 1], b' ' | b'\t' | b'\r' | b'\n') {
        end -= 1;
    }
    end
}

/// For a flow collection starting at `start` (`[` or `{`) whose content ends at `end`, the end
/// just past its closing bracket. serde-saphyr spans a collection's opening token only.
fn close_flow(text: &str, start: usize, end: usize) -> usize {
    let bytes = text.as_bytes();
    let close = match bytes.get(start) {
        Some(b'[') => b']',
        Some(b'{') => b'}',
        _ => return end,
    };
    let mut i = end.max(start + 1);
    while let Some(&b) = bytes.get(i) {
        match b {
            b if b == close => return i + 1,
            b' ' | b'\t' | b'\r' | b'\n' | b',' | b':' | b'?' => i += 1,
            b'#' => {
                while bytes.get(i).is_some_and(|&b| b != b'\n') {
                    i += 1;
                }
            }
            _ => break,
        }
    }
    end
}

/// Byte offset of the `---` that starts the document containing `at`, looking back over the
/// blank, comment and directive lines in between.
fn find_document_marker(text: &str, at: usize) -> Option<usize> {
    let at = at.min(text.len());
    let mut line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    if text[line_start..].starts_with("---") {
        return Some(line_start);
    }
    if !text[line_start..at].trim().is_empty() {
        return None;
    }
    while line_start > 0 {
        let prev = text[..line_start - 1].rfind('\n').map_or(0, |i| i + 1);
        let line = &text[prev..line_start - 1];
        if line.starts_with("---") {
            return Some(prev);
        }
        let trimmed = line.trim();
        if !(trimmed.is_empty() || trimmed.starts_with('#') || line.starts_with('%')) {
            return None;
        }
        line_start = prev;
    }
    None
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// Converts character offsets to byte offsets, walking on from the last answer when asked for
/// a later offset, so a forward sequence of lookups is linear in the text.
#[derive(Default)]
struct CharCursor {
    chars: usize,
    bytes: usize,
}

impl CharCursor {
    fn byte_of(&mut self, text: &str, n: usize) -> usize {
        if n < self.chars {
            *self = CharCursor::default();
        }
        for (i, (b, _)) in text[self.bytes..].char_indices().enumerate() {
            if self.chars + i == n {
                self.chars = n;
                self.bytes += b;
                return self.bytes;
            }
        }
        self.chars = n;
        self.bytes = text.len();
        text.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: FileId = FileId(7);

    fn ok(src: &str) -> Node {
        parse(F, src.as_bytes(), &Limits::default()).unwrap_or_else(|d| panic!("{src:?}: {d:?}"))
    }

    fn err(bytes: &[u8]) -> Diagnostic {
        err_with(bytes, &Limits::default())
    }

    fn err_with(bytes: &[u8], limits: &Limits) -> Diagnostic {
        match parse(F, bytes, limits) {
            Ok(node) => panic!("expected an error, got {node:?}"),
            Err(d) => d,
        }
    }

    /// The source text under a span.
    fn text<'a>(src: &'a str, span: Span) -> &'a str {
        assert_eq!(span.file, F);
        &src[span.start as usize..span.end as usize]
    }

    fn line(src: &str, span: Span) -> usize {
        line_of(src, span.start as usize)
    }

    #[test]
    fn debug_dump() {
        let bomb = {
            let mut s = String::from("a: &a [x,x,x,x,x,x,x,x,x]\n");
            let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
            for w in names.windows(2) {
                s += &format!("{}: &{} [{}]\n", w[1], w[1], vec![format!("*{}", w[0]); 9].join(","));
            }
            s
        };
        let cases: Vec<Vec<u8>> = vec![
            b"a: 1\nb: 2\na: 3\n".to_vec(),
            b"---\na: 1\n---\nb: 2\n".to_vec(),
            b"a: [1, 2\nb: 3\n".to_vec(),
            b"a:\n  b: 1\n c: 2\n".to_vec(),
            b"a: *nope\n".to_vec(),
            b"a: \"unterminated\n".to_vec(),
            b"x: .inf\ny: !!binary aGVsbG8=\nw: 99999999999999999999999\n".to_vec(),
            b"z: !foo bar\n".to_vec(),
            b"a: \x00b\n".to_vec(),
            b"{a: 1}: x\n".to_vec(),
            b"[a]: x\n".to_vec(),
            b"a: 1\n--- \n".to_vec(),
            b"a: \xffb\n".to_vec(),
            "[".repeat(50000).into_bytes(),
            "- ".repeat(100000).into_bytes(),
            "? ".repeat(100000).into_bytes(),
            "{a: ".repeat(50000).into_bytes(),
            (0..200).map(|i| format!("{}k:\n", " ".repeat(i))).collect::<String>().into_bytes(),
            bomb.into_bytes(),
            b"a: &x 1\n200: *x\n\"200\": 2\n".to_vec(),
            b"b: &b {k: 1}\nm:\n  <<: *b\n  j: 2\n".to_vec(),
            b"a: 1\n\tb: 2\n".to_vec(),
            b"a: b: c\n".to_vec(),
            b"- a\nb: 1\n".to_vec(),
            b"a: 'x\n".to_vec(),
            b"a: [}\n".to_vec(),
            b"%YAML 1.1\n---\na: yes\n".to_vec(),
            b"\xef\xbb\xbfa: 1\n".to_vec(),
        ];
        for c in cases {
            let t = std::time::Instant::now();
            let r = parse(F, &c, &Limits::default());
            let shown = String::from_utf8_lossy(&c[..c.len().min(60)]).into_owned();
            match r {
                Ok(n) => eprintln!("{shown:?} [{:?}] OK {:?}", t.elapsed(), n.to_json()),
                Err(d) => eprintln!("{shown:?} [{:?}] {} {:?} @{}..{} ({:?}) label={:?} help={:?}", t.elapsed(), d.code(), d.message, d.primary.span.start, d.primary.span.end, String::from_utf8_lossy(&c[d.primary.span.start as usize..(d.primary.span.end as usize).min(c.len())]), d.primary.message, d.help),
            }
        }
    }
}
