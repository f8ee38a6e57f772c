//! YAML text → spanned [`Node`](super::Node)s, under hard budgets.
//!
//! The YAML parser is serde-saphyr's own (`serde_saphyr::granit_parser`, pinned with it). This
//! module reads its event stream and builds the [`Node`] tree itself, with an explicit stack.
//! Going through serde-saphyr's `Deserialize` layer instead, with `Spanned<T>` at every node, was
//! three times slower on flow-sized files (the parser itself is most of what remains), recursed
//! a dozen stack frames per nesting level, and knew only where collections start.
//!
//! Semantics: YAML 1.2 core schema. Only `true`/`false` (and `True`, `TRUE`, ...) are booleans;
//! `~`, `null` and empty are null; integers with leading zeros (`007`) and YAML 1.1 spellings
//! (`yes`, `on`, `1_000`, `0X1F`) are strings. Quoted scalars are strings. `!!str`, `!!int`,
//! `!!float`, `!!bool`, `!!null`, `!!map`, `!!seq` and the non-specific `!` are honoured; other
//! tags are errors. Anchors and aliases work (an alias copies its anchor's node); merge keys
//! (`<<: *base`) merge, the mapping's own keys winning. Duplicate keys are errors;
//! [`parse_collecting`] reports every one of them and keeps the first of each in the tree.
//!
//! Spans are byte offsets. A scalar spans its text (quotes included; a block scalar spans its
//! content lines, not the `|` header). A flow collection spans `[`…`]`; a block collection spans
//! its first key or `-` to the end of its last value. A node copied by an alias spans the
//! `*alias` token; the nodes inside it keep the spans of the text that defines them. A file that
//! is not UTF-8 has no tree: its one diagnostic spans the U+FFFD that replaces the first invalid
//! bytes in `String::from_utf8_lossy` of the file, the text kept for rendering.
//!
//! Budgets ([`Limits`]): the file size is checked first; nesting depth, node count and alias
//! expansion are counted as events arrive, so every limit stops the parse where it is crossed.
//! The builder does not recurse, but cloning and dropping nodes do (one level per nesting level),
//! so parsing runs on a thread whose stack grows with [`Limits::max_depth`]. This module knows
//! YAML, not flows.
//!
//! Most flow files never reach the parser: [`super::fast`] reads plain flow text (block
//! collections, one-line scalars and flow collections, nothing deeper than 64 levels) into the
//! same tree several times faster, on the caller's thread, and hands everything else to it.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_saphyr::granit_parser::{
    ErrorKind, Event, Marker, Options, Parser, ScalarStyle, ScanError, StructureStyle, Tag,
};

use super::limits::{Limits, MAX_IMPLICIT_KEY_CHARS};
use super::scalar::{parse_bool, parse_float, parse_int, resolve_plain, too_large_integer};
use super::{Key, Node, Value};
use crate::diag::Diagnostic;
use crate::diag::codes::{DUPLICATE_KEY, YAML_BUDGET, YAML_SYNTAX};
use crate::source::{FileId, Span};

/// Stack of the parsing thread, before the per-level allowance.
const BASE_STACK_BYTES: usize = 4 << 20;
/// Stack allowed per nesting level, for cloning and dropping nested nodes (a few hundred bytes
/// per level in release builds, a few KiB unoptimized).
const STACK_BYTES_PER_LEVEL: usize = 16 << 10;
/// Cap on the parsing thread's stack. Address space is reserved, and only touched as needed.
const MAX_STACK_BYTES: usize = 1 << 30;

/// Parses one file into a spanned [`Node`] tree.
///
/// An empty file, or one holding only comments, gives a [`Value::Null`] node: the caller decides
/// what an empty flow means. A problem is a diagnostic: `SY100` (not UTF-8, not YAML, more than
/// one document, an unsupported tag), `SY101` (a limit of [`Limits`] crossed) or `SY102` (a
/// duplicate key); this returns the first one in the file. [`parse_collecting`] returns every
/// duplicate key and the tree. Text the fast path reads is parsed on the calling thread (its
/// recursion is bounded); anything else on a thread of its own (spawning it costs some 40 µs),
/// with a stack of 4 MiB plus 16 KiB per allowed nesting level, at most 1 GiB: no input can
/// overflow it, make it panic or hang.
#[allow(clippy::result_large_err, reason = "one diagnostic per file, returned once")]
pub fn parse(file: FileId, bytes: &[u8], limits: &Limits) -> Result<Node, Diagnostic> {
    let (node, diagnostics) = parse_collecting(file, bytes, limits);
    match (node, diagnostics.into_iter().next()) {
        (_, Some(first)) => Err(first),
        (Some(node), None) => Ok(node),
        (None, None) => Err(internal(file, "the YAML parser returned nothing")),
    }
}

/// Parses one file like [`parse`], but goes on past duplicate keys: it returns the tree (where
/// each mapping keeps the first of duplicate keys, so keys stay unique) and a `SY102` for every
/// duplicate (the first 1,000), in file order. Any other problem stops the parse: then there is
/// no tree, and the last diagnostic is that problem.
pub fn parse_collecting(file: FileId, bytes: &[u8], limits: &Limits) -> (Option<Node>, Vec<Diagnostic>) {
    parse_collecting_with(file, bytes, limits, || ()).0
}

/// The stack a thread needs to parse (and to clone and drop the tree of) a file under
/// `limits`: 4 MiB plus 16 KiB per allowed nesting level, at most 1 GiB.
pub(crate) fn stack_bytes(limits: &Limits) -> usize {
    STACK_BYTES_PER_LEVEL
        .saturating_mul(limits.max_depth)
        .saturating_add(BASE_STACK_BYTES)
        .min(MAX_STACK_BYTES)
}

/// [`parse_collecting`], running `meanwhile` on the calling thread while the parsing thread
/// works (hashing the same bytes, say), and returning both results.
pub(crate) fn parse_collecting_with<R>(
    file: FileId,
    bytes: &[u8],
    limits: &Limits,
    meanwhile: impl FnOnce() -> R,
) -> ((Option<Node>, Vec<Diagnostic>), R) {
    if bytes.len() > limits.max_bytes {
        return (
            (None, vec![too_large(file, bytes.len(), limits.max_bytes)]),
            meanwhile(),
        );
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => return ((None, vec![not_utf8(file, bytes, &e)]), meanwhile()),
    };
    // The fast path recurses boundedly and builds shallow trees: it runs right here, so that
    // the tree is allocated (and later freed) by the thread that uses it. Only the full
    // parser needs a thread of its own.
    if let Some(node) = super::fast::parse(file, text, limits) {
        return ((Some(node), Vec::new()), meanwhile());
    }
    std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .name("switchyard-yaml".into())
            .stack_size(stack_bytes(limits))
            .spawn_scoped(scope, || Builder::new(file, text, limits).run());
        let other = meanwhile();
        let parsed = match spawned {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|_| (None, vec![internal(file, "the YAML parser failed")])),
            Err(e) => (
                None,
                vec![internal(file, &format!("cannot start the YAML parser: {e}"))],
            ),
        };
        (parsed, other)
    })
}

/// [`parse_collecting`] on the calling thread, without a thread of its own: for workers that
/// parse many files and were started with a stack of at least [`stack_bytes`] for `limits`.
pub(crate) fn parse_collecting_here(
    file: FileId,
    bytes: &[u8],
    limits: &Limits,
) -> (Option<Node>, Vec<Diagnostic>) {
    if bytes.len() > limits.max_bytes {
        return (None, vec![too_large(file, bytes.len(), limits.max_bytes)]);
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => parse_text(file, text, limits),
        Err(e) => (None, vec![not_utf8(file, bytes, &e)]),
    }
}

/// Parses UTF-8 text within the size limit: by the fast path when the text is plain enough
/// for it (see [`super::fast`]), else by the full parser.
fn parse_text(file: FileId, text: &str, limits: &Limits) -> (Option<Node>, Vec<Diagnostic>) {
    match super::fast::parse(file, text, limits) {
        Some(node) => (Some(node), Vec::new()),
        None => Builder::new(file, text, limits).run(),
    }
}

/// The full parser alone, for tests that hold the fast path to it.
#[cfg(test)]
pub(super) fn parse_full(file: FileId, text: &str, limits: &Limits) -> (Option<Node>, Vec<Diagnostic>) {
    Builder::new(file, text, limits).run()
}

/// Inside the parser, a diagnostic travels boxed, so that results stay small on the hot path.
fn fail<T>(d: Diagnostic) -> Result<T, Box<Diagnostic>> {
    Err(Box::new(d))
}

// ---------------------------------------------------------------------------------------------
// The builder: parser events → nodes, with an explicit stack.

struct Builder<'a> {
    file: FileId,
    text: &'a str,
    limits: &'a Limits,
    stack: Vec<Frame>,
    /// Copies of anchored nodes, by the parser's anchor id.
    anchors: HashMap<usize, Anchored>,
    root: Option<Node>,
    documents: usize,
    /// Duplicate keys found so far (at most [`MAX_DUPLICATES`]); the parse goes on past them.
    duplicates: Vec<Diagnostic>,
    lines: Lines,
    nodes: usize,
    expanded: usize,
    chars: CharCursor,
}

/// An open mapping or list.
struct Frame {
    start: usize,
    /// End of the content so far: the end of the last child.
    end: usize,
    flow: bool,
    anchor: usize,
    /// Nodes in this subtree, keys and the frame itself included.
    size: usize,
    /// Nesting levels in this subtree: 1 for a mapping of scalars.
    height: usize,
    body: Body,
}

enum Body {
    Seq(Vec<Node>),
    Map(MapFrame),
}

#[derive(Default)]
struct MapFrame {
    entries: Vec<(Key, Node)>,
    pending: Option<Pending>,
    /// Values of `<<` keys, merged when the mapping ends.
    merges: Vec<Node>,
    /// Entry index by key name, built once the mapping is large.
    index: HashMap<String, usize>,
}

/// A key read, waiting for its value.
enum Pending {
    Key(Key),
    Merge(Span),
    /// The key was a duplicate: its value is read and dropped.
    Skip,
}

/// A node as an alias copies it.
struct Anchored {
    node: Node,
    /// The scalar's text, for an anchored scalar later used as a key.
    text: Option<String>,
    size: usize,
    height: usize,
}

/// What a finished node brings to its parent besides itself.
struct Done {
    /// The scalar's text (for keys), when it is a scalar.
    text: Option<String>,
    /// A plain `<<` (or `!!merge`) scalar: a merge key in key position.
    merge: bool,
    size: usize,
    height: usize,
}

/// Where an event is: its byte range, and its tag's when it has one.
#[derive(Clone, Copy)]
struct At {
    start: usize,
    end: usize,
    tag: Option<(usize, usize)>,
}

/// Duplicate keys reported per file at most; further ones are still dropped from the tree.
const MAX_DUPLICATES: usize = 1_000;

/// Mapping keys up to this many are checked for duplicates by scanning; larger mappings
/// get a hash index.
const SCAN_KEYS: usize = 16;

impl<'a> Builder<'a> {
    fn new(file: FileId, text: &'a str, limits: &'a Limits) -> Self {
        Builder {
            file,
            text,
            limits,
            stack: Vec::new(),
            anchors: HashMap::new(),
            root: None,
            documents: 0,
            duplicates: Vec::new(),
            lines: Lines::default(),
            nodes: 0,
            expanded: 0,
            chars: CharCursor::default(),
        }
    }

    /// The tree, or none when a problem stopped the parse; the duplicate keys found, then that
    /// problem.
    fn run(mut self) -> (Option<Node>, Vec<Diagnostic>) {
        match self.build() {
            Ok(node) => (Some(node), self.duplicates),
            Err(problem) => {
                let mut diagnostics = std::mem::take(&mut self.duplicates);
                diagnostics.push(*problem);
                (None, diagnostics)
            }
        }
    }

    /// The parser's options: YAML 1.2's indentation rules when `strict`, not PyYAML's (the
    /// continuation lines of a quoted or plain scalar and of a flow collection are indented
    /// past the block that holds them, s-flow-line-prefix(n), production [69]).
    fn options(&self, strict: bool) -> Options {
        let nesting = self.limits.max_depth.saturating_add(1);
        let mut options = Options::default();
        options.strict_indentation = strict;
        options.simple_key_max_lookahead = MAX_IMPLICIT_KEY_CHARS;
        options.flow_nesting_limit = nesting;
        options.block_nesting_limit = nesting;
        options.set_emit_comments(false);
        options
    }

    /// A line indented too little for the quoted scalar or flow collection it continues may
    /// follow one that was never closed, whose quote or bracket runs on past it. Then the
    /// parser's lax reading, which takes any indentation, fails on the unclosed construct, and
    /// that is the error to report (the cause, where the construct is). Read only when the
    /// strict reading failed on indentation.
    fn unclosed_construct(&self) -> Option<ScanError> {
        let mut parser = Parser::new_from_str_with_options(self.text, self.options(false));
        while let Some(next) = parser.next_event() {
            if let Err(e) = next {
                let unclosed = matches!(
                    e.kind(),
                    ErrorKind::UnclosedQuotedScalar
                        | ErrorKind::UnclosedFlowCollection { .. }
                        | ErrorKind::ExpectedFlowMappingSeparator
                        | ErrorKind::ExpectedFlowSequenceSeparator
                );
                return unclosed.then_some(e);
            }
        }
        None
    }

    fn build(&mut self) -> Result<Node, Box<Diagnostic>> {
        let mut parser = Parser::new_from_str_with_options(self.text, self.options(true));
        while let Some(next) = parser.next_event() {
            let (event, span) = next.map_err(|e| {
                let e = match e.kind() {
                    ErrorKind::InvalidQuotedScalarIndent
                    | ErrorKind::InvalidIndentation
                    | ErrorKind::TabInIndentation => self.unclosed_construct().unwrap_or(e),
                    _ => e,
                };
                self.scan_error(&e)
            })?;
            let (start, end) = (self.byte(span.start), self.byte(span.end));
            // Tag tokens are ASCII: as many bytes as characters.
            let tag = span.tag_span().map(|t| {
                let s = self.byte(t.start);
                (s, s + t.end.index().saturating_sub(t.start.index()))
            });
            let at = At { start, end, tag };
            match event {
                Event::DocumentStart(..) => {
                    if self.documents > 0 {
                        return fail(self.second_document(start, end));
                    }
                    self.documents += 1;
                }
                Event::Scalar(value, style, anchor, tag) => {
                    let block = matches!(style, ScalarStyle::Literal | ScalarStyle::Folded);
                    self.scalar(value, style, anchor, tag.as_deref(), at)?;
                    if block && let Some(tab) = tab_after_block_scalar(self.text, end) {
                        return fail(self.tab_after_block_scalar(tab));
                    }
                }
                Event::SequenceStart(style, anchor, tag) => {
                    self.open(style, anchor, tag.as_deref(), at, Body::Seq(Vec::new()))?;
                }
                Event::MappingStart(style, anchor, tag) => {
                    self.open(style, anchor, tag.as_deref(), at, Body::Map(MapFrame::default()))?;
                }
                Event::SequenceEnd | Event::MappingEnd => self.close(end)?,
                Event::Alias(id) => self.alias(id, start, end)?,
                _ => {}
            }
        }
        Ok(self.root.take().unwrap_or(Node {
            span: Span::file_start(self.file),
            value: Value::Null,
        }))
    }

    fn span(&self, start: usize, end: usize) -> Span {
        Span::new(self.file, start, end)
    }

    /// The span of an event's tag, or of the event when it has none.
    fn tag_span(&self, at: At) -> Span {
        let (start, end) = at.tag.unwrap_or((at.start, at.end));
        self.span(start, end)
    }

    fn scalar(
        &mut self,
        text: Cow<'_, str>,
        style: ScalarStyle,
        anchor: usize,
        tag: Option<&Tag>,
        at: At,
    ) -> Result<(), Box<Diagnostic>> {
        let start = at.start;
        let end = trim_end(self.text, start, at.end);
        let span = self.span(start, end);
        self.count(1, span)?;
        let resolved = scalar_value(&text, style, tag).map_err(|problem| match problem {
            TagProblem::Unsupported(message) => Diagnostic::new(&YAML_SYNTAX, self.tag_span(at), message)
                .label("unsupported tag")
                .help(CORE_TAGS_HELP),
            TagProblem::Mismatch(message) => Diagnostic::new(&YAML_SYNTAX, span, message).label("here"),
        })?;
        let merge = style == ScalarStyle::Plain
            && text == "<<"
            && tag.is_none_or(|t| t.suffix_in_namespace(CORE).as_deref() == Some("merge"));
        // A string is its text; other scalars keep their text too, as the name of a key.
        let (value, text) = match resolved {
            None => (Value::Str(text.into_owned()), None),
            Some(value) => (value, Some(text.into_owned())),
        };
        let node = Node { span, value };
        if anchor != 0 {
            self.count(1, span)?;
            let anchored = Anchored {
                node: node.clone(),
                text: text.clone(),
                size: 1,
                height: 0,
            };
            self.anchors.insert(anchor, anchored);
        }
        self.add(
            node,
            Done {
                text,
                merge,
                size: 1,
                height: 0,
            },
        )
    }

    fn open(
        &mut self,
        style: StructureStyle,
        anchor: usize,
        tag: Option<&Tag>,
        at: At,
        body: Body,
    ) -> Result<(), Box<Diagnostic>> {
        let (start, end) = (at.start, at.end);
        let span = self.span(start, end);
        let (kind, what) = match body {
            Body::Seq(_) => ("seq", "a list"),
            Body::Map(_) => ("map", "a mapping"),
        };
        if let Some(tag) = tag
            && tag.core_suffix() != Some(kind)
        {
            let message = format!("unsupported tag `{}` on {what}", tag.original());
            return fail(
                Diagnostic::new(&YAML_SYNTAX, self.tag_span(at), message)
                    .label("unsupported tag")
                    .help(CORE_TAGS_HELP),
            );
        }
        if self.stack.len() >= self.limits.max_depth {
            return fail(depth_exceeded(span, self.limits));
        }
        self.count(1, span)?;
        let flow = style == StructureStyle::Flow;
        self.stack.push(Frame {
            start,
            end,
            flow,
            anchor,
            size: 1,
            height: 1,
            body,
        });
        Ok(())
    }

    fn close(&mut self, end: usize) -> Result<(), Box<Diagnostic>> {
        let Some(frame) = self.stack.pop() else {
            return Ok(());
        };
        // A flow collection's end event spans its closing bracket; a block collection's is an
        // empty span at the next token, past blank and comment lines.
        let end = if frame.flow {
            end.max(frame.start)
        } else {
            frame.end
        };
        let span = self.span(frame.start, end);
        let value = match frame.body {
            Body::Seq(items) => Value::Seq(items),
            Body::Map(map) => Value::Map(merge(map)),
        };
        let node = Node { span, value };
        if frame.anchor != 0 {
            self.count(frame.size, span)?;
            let anchored = Anchored {
                node: node.clone(),
                text: None,
                size: frame.size,
                height: frame.height,
            };
            self.anchors.insert(frame.anchor, anchored);
        }
        self.add(
            node,
            Done {
                text: None,
                merge: false,
                size: frame.size,
                height: frame.height,
            },
        )
    }

    fn alias(&mut self, id: usize, start: usize, end: usize) -> Result<(), Box<Diagnostic>> {
        let span = self.span(start, end);
        let Some(anchored) = self.anchors.get(&id) else {
            return fail(
                Diagnostic::new(&YAML_SYNTAX, span, "alias refers to the value that contains it")
                    .label("recursive alias")
                    .help("an alias can only repeat a value that is complete before it"),
            );
        };
        let (size, height) = (anchored.size, anchored.height);
        if self.expanded.saturating_add(size) > self.limits.max_alias_expansions {
            return fail(aliases_exceeded(span, self.limits));
        }
        if self.stack.len().saturating_add(height) > self.limits.max_depth {
            return fail(depth_exceeded(span, self.limits));
        }
        let mut node = anchored.node.clone();
        let text = anchored.text.clone();
        node.span = span;
        self.count(size, span)?;
        self.expanded += size;
        self.add(
            node,
            Done {
                text,
                merge: false,
                size,
                height,
            },
        )
    }

    /// Counts `n` more nodes, the last of them at `span`.
    fn count(&mut self, n: usize, span: Span) -> Result<(), Box<Diagnostic>> {
        self.nodes = self.nodes.saturating_add(n);
        if self.nodes > self.limits.max_nodes {
            return fail(nodes_exceeded(span, self.limits));
        }
        Ok(())
    }

    /// Hands a finished node to the open collection (or makes it the root).
    fn add(&mut self, node: Node, done: Done) -> Result<(), Box<Diagnostic>> {
        let Some(frame) = self.stack.last_mut() else {
            self.root = Some(node);
            return Ok(());
        };
        frame.size = frame.size.saturating_add(done.size);
        frame.height = frame.height.max(done.height + 1);
        frame.end = frame.end.max(node.span.end as usize);
        let map = match &mut frame.body {
            Body::Seq(items) => {
                items.push(node);
                return Ok(());
            }
            Body::Map(map) => map,
        };
        match map.pending.take() {
            Some(Pending::Key(key)) => {
                map.entries.push((key, node));
                let n = map.entries.len();
                if n == SCAN_KEYS {
                    map.index.extend(
                        map.entries
                            .iter()
                            .enumerate()
                            .map(|(i, (k, _))| (k.name.clone(), i)),
                    );
                } else if n > SCAN_KEYS {
                    map.index.insert(map.entries[n - 1].0.name.clone(), n - 1);
                }
            }
            Some(Pending::Merge(at)) => {
                let mergeable = match &node.value {
                    Value::Map(_) => true,
                    Value::Seq(items) => items.iter().all(|i| matches!(i.value, Value::Map(_))),
                    _ => false,
                };
                if !mergeable {
                    return fail(
                        Diagnostic::new(
                            &YAML_SYNTAX,
                            node.span,
                            "a merge key `<<` takes a mapping or a list of mappings",
                        )
                        .label(format!("{} given", node.type_name()))
                        .with_secondary(at, "merge key"),
                    );
                }
                map.merges.push(node);
            }
            Some(Pending::Skip) => {}
            None if done.merge => map.pending = Some(Pending::Merge(node.span)),
            None => {
                let name = match (node.value, done.text) {
                    (Value::Seq(_), _) => return fail(non_scalar_key(node.span, "list")),
                    (Value::Map(_), _) => return fail(non_scalar_key(node.span, "mapping")),
                    // Keys keep their spelling: `200: x` has key "200", `0x1F: x` has "0x1F".
                    (Value::Str(s), _) => s,
                    (_, Some(text)) => text,
                    (_, None) => String::new(),
                };
                let key = Key {
                    name,
                    span: node.span,
                };
                map.pending = Some(match find_key(map, &key.name) {
                    Some(first) => {
                        if self.duplicates.len() < MAX_DUPLICATES {
                            let first = &map.entries[first].0;
                            let line = self.lines.line_of(self.text, first.span.start as usize);
                            self.duplicates.push(duplicate(first, &key, line));
                        }
                        Pending::Skip
                    }
                    None => Pending::Key(key),
                });
            }
        }
        Ok(())
    }

    /// Byte offset of a parser marker (which has one for text input; else from its character
    /// offset).
    fn byte(&mut self, marker: Marker) -> usize {
        match marker.byte_offset() {
            Some(b) => b.min(self.text.len()),
            None => self.chars.byte_of(self.text, marker.index()),
        }
    }

    fn scan_error(&mut self, e: &ScanError) -> Diagnostic {
        let mut start = self.byte(*e.marker());
        // The scanner reports a misplaced tab just after it; point at the tab itself.
        let tab_error = matches!(
            e.kind(),
            ErrorKind::TabNotAllowed
                | ErrorKind::TabInBlockIndentation
                | ErrorKind::TabInIndentation
                | ErrorKind::TabInPlainScalar
                | ErrorKind::TabAtBlockScalarStart
        );
        if tab_error && start > 0 && self.text.as_bytes()[start - 1] == b'\t' {
            start -= 1;
        }
        let width = self
            .text
            .get(start..)
            .and_then(|s| s.chars().next())
            .map_or(0, char::len_utf8);
        let span = self.span(start, start + width);
        match e.kind() {
            ErrorKind::RecursionLimitExceeded => return depth_exceeded(span, self.limits),
            ErrorKind::UnknownAnchor => {
                if let Some(alias) = self.text.get(start..).and_then(|t| t.strip_prefix('*')) {
                    let end = alias
                        .find(|c: char| c.is_whitespace() || ",[]{}".contains(c))
                        .unwrap_or(alias.len());
                    let name = &alias[..end];
                    let span = self.span(start, start + 1 + end);
                    return Diagnostic::new(&YAML_SYNTAX, span, format!("unknown anchor `{name}`"))
                        .label("alias of an unknown anchor")
                        .help(format!(
                            "define the value first, as `&{name} value`; aliases refer back, never forward"
                        ));
                }
            }
            ErrorKind::MappingValueNotAllowed | ErrorKind::ExpectedFlowMappingSeparator
                if self.chars_before_on_line(start) > MAX_IMPLICIT_KEY_CHARS =>
            {
                return Diagnostic::new(&YAML_SYNTAX, span, "a key before `:` is at most 1024 characters")
                    .label("`:` after a key longer than that")
                    .help(
                        "a key and the spaces before its `:` may be 1024 characters long; write a \
                         longer key as `? key` on a line of its own and its value as `: value` below",
                    );
            }
            _ => {}
        }
        let d = Diagnostic::new(&YAML_SYNTAX, span, clean_message(&e.kind().to_string())).label("here");
        if tab_error {
            return d.help("indent with spaces: YAML does not allow tabs in indentation");
        }
        // A secret reference written bare inside `{...}`: its `{` reads as a nested mapping.
        let line_start = self.text[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = self.text[start..]
            .find('\n')
            .map_or(self.text.len(), |i| start + i);
        let bare = self.text[line_start..line_end]
            .match_indices("${")
            .map(|(i, _)| i)
            .take_while(|i| line_start + i <= start)
            .filter(|&i| !self.text[..line_start + i].ends_with(['"', '\'']))
            .last();
        if let Some(at) = bare {
            let reference = &self.text[line_start + at..];
            let reference = &reference[..reference.find('}').map_or(reference.len(), |i| i + 1)];
            return d.help(format!(
                "quote the value: `\"{reference}\"`; unquoted, its `{{` starts a mapping inside the flow mapping"
            ));
        }
        d
    }

    /// How many characters precede `offset` on its line.
    fn chars_before_on_line(&self, offset: usize) -> usize {
        let line = self.text[..offset].rfind('\n').map_or(0, |i| i + 1);
        self.text[line..offset].chars().count()
    }

    fn tab_after_block_scalar(&self, tab: usize) -> Diagnostic {
        Diagnostic::new(
            &YAML_SYNTAX,
            self.span(tab, tab + 1),
            "tab cannot be used as indentation",
        )
        .label("tab before the block scalar's indentation")
        .help(
            "a block scalar's lines are indented with spaces, past its key or `-`; this line is \
             not part of the scalar above, and a tab cannot start it",
        )
    }

    fn second_document(&self, start: usize, end: usize) -> Diagnostic {
        let span = self.span(start, end);
        Diagnostic::new(&YAML_SYNTAX, span, "a flow file holds one YAML document")
            .label("second document starts here")
            .help("remove the `---` separator, or move the second document to its own file")
    }
}

/// The mapping's entries, with the entries of its `<<` merge values that it does not define
/// itself appended in order (an earlier merge value wins over a later one).
fn merge(mut map: MapFrame) -> Vec<(Key, Node)> {
    if map.merges.is_empty() {
        return map.entries;
    }
    let mut seen: std::collections::HashSet<String> =
        map.entries.iter().map(|(k, _)| k.name.clone()).collect();
    for source in std::mem::take(&mut map.merges) {
        let maps = match source.value {
            Value::Seq(items) => items,
            value => vec![Node {
                span: source.span,
                value,
            }],
        };
        for m in maps {
            if let Value::Map(entries) = m.value {
                for (key, value) in entries {
                    if seen.insert(key.name.clone()) {
                        map.entries.push((key, value));
                    }
                }
            }
        }
    }
    map.entries
}

/// The index of the entry named `name`, if any.
fn find_key(map: &MapFrame, name: &str) -> Option<usize> {
    if map.entries.len() < SCAN_KEYS {
        map.entries.iter().position(|(k, _)| k.name == name)
    } else {
        map.index.get(name).copied()
    }
}

// ---------------------------------------------------------------------------------------------
// Scalars: YAML 1.2 core schema.

const CORE: &str = "tag:yaml.org,2002:";

const CORE_TAGS_HELP: &str =
    "flows use the YAML 1.2 core tags only: `!!str`, `!!int`, `!!float`, `!!bool`, `!!null`";

/// Why a tagged scalar has no value.
enum TagProblem {
    /// A tag outside the core schema (labelled at the tag).
    Unsupported(String),
    /// A core tag whose scalar does not parse as its type (labelled at the scalar).
    Mismatch(String),
}

/// The value of a scalar with this style and tag: `None` for a string (the text itself), or
/// why it has no value.
fn scalar_value(text: &str, style: ScalarStyle, tag: Option<&Tag>) -> Result<Option<Value>, TagProblem> {
    let Some(tag) = tag else {
        if style != ScalarStyle::Plain {
            return Ok(None);
        }
        // A decimal integer is never rounded into the nearest double.
        if too_large_integer(text) {
            return Err(TagProblem::Mismatch(format!(
                "the integer `{text}` does not fit in 64 bits, and would be rounded; quote it to keep its digits as a string"
            )));
        }
        return Ok(resolve_plain(text));
    };
    let core = tag.suffix_in_namespace(CORE);
    let wrong = |what: &str| {
        TagProblem::Mismatch(format!(
            "`{text}` is not {what}, as tag `{}` says",
            tag.original()
        ))
    };
    match core.as_deref() {
        Some("str") => Ok(None),
        Some("null") => Ok(Some(Value::Null)),
        Some("bool") => parse_bool(text)
            .map(|b| Some(Value::Bool(b)))
            .ok_or_else(|| wrong("a boolean")),
        Some("int") => parse_int(text)
            .map(|i| Some(Value::Int(i)))
            .ok_or_else(|| wrong("an integer")),
        Some("float") => parse_int(text)
            .map(|i| i as f64)
            .or_else(|| parse_float(text))
            .map(|f| Some(Value::Float(f)))
            .ok_or_else(|| wrong("a number")),
        Some("merge") if text == "<<" => Ok(None),
        // The non-specific tag `!` makes a scalar a string.
        _ if tag.parts() == ("", "!") => Ok(None),
        _ => Err(TagProblem::Unsupported(format!(
            "unsupported tag `{}`",
            tag.original()
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// Diagnostics.

/// `first_line` is the 1-based line of `first`.
fn duplicate(first: &Key, second: &Key, first_line: usize) -> Diagnostic {
    let line = first_line;
    Diagnostic::new(
        &DUPLICATE_KEY,
        second.span,
        format!("duplicate key `{}`", second.name),
    )
    .label("defined again here")
    .with_secondary(first.span, "first defined here")
    .help(format!(
        "`{}` is first defined on line {line}; keep one of the two",
        second.name
    ))
}

fn non_scalar_key(span: Span, what: &str) -> Diagnostic {
    Diagnostic::new(
        &YAML_SYNTAX,
        span,
        format!("a mapping key must be a scalar, not a {what}"),
    )
    .label(format!("{what} used as a key"))
    .help("keys are names: write `name: value`")
}

/// `SY101` for a file of `len` bytes over the `max`-byte limit. [`parse`] reports it for bytes
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

fn depth_exceeded(span: Span, limits: &Limits) -> Diagnostic {
    Diagnostic::new(
        &YAML_BUDGET,
        span,
        format!("nesting depth limit exceeded ({} levels)", limits.max_depth),
    )
    .label("nested too deep here")
    .help("mappings and lists may nest this many levels, counting the top-level mapping")
}

fn nodes_exceeded(span: Span, limits: &Limits) -> Diagnostic {
    Diagnostic::new(
        &YAML_BUDGET,
        span,
        format!("node limit exceeded ({} nodes)", limits.max_nodes),
    )
    .label("limit crossed here")
    .help("every key and value counts as a node, and so does every copy an alias or anchor makes")
}

fn aliases_exceeded(span: Span, limits: &Limits) -> Diagnostic {
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

/// The first invalid byte sequence of a file that is not UTF-8. The span points into the text
/// the source map keeps for the file, [`String::from_utf8_lossy`] of its bytes: everything
/// before the first invalid sequence is valid, so it starts at the same offset as in the bytes,
/// and it covers the whole U+FFFD that replaces the sequence there (three bytes).
fn not_utf8(file: FileId, bytes: &[u8], e: &std::str::Utf8Error) -> Diagnostic {
    let start = e.valid_up_to();
    let end = start + char::REPLACEMENT_CHARACTER.len_utf8();
    Diagnostic::new(
        &YAML_SYNTAX,
        Span::new(file, start, end),
        "file is not valid UTF-8",
    )
    .label(format!(
        "invalid byte 0x{:02x}",
        bytes.get(start).copied().unwrap_or(0)
    ))
    .help("flow files are UTF-8 text; is this a binary file, or saved in another encoding?")
}

fn internal(file: FileId, message: &str) -> Diagnostic {
    Diagnostic::new(&YAML_SYNTAX, Span::file_start(file), message.to_owned())
}

/// Terse, lower case, one line, no trailing period.
fn clean_message(message: &str) -> String {
    let one_line: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut out = one_line.split_whitespace().collect::<Vec<_>>().join(" ");
    while out.ends_with('.') {
        out.pop();
    }
    let mut chars = out.chars();
    let Some(first) = chars.next() else {
        return "invalid YAML".to_owned();
    };
    // Lower-case a capitalized first word, but keep acronyms ("YAML ...") as they are.
    if first.is_uppercase() && !chars.clone().next().is_some_and(char::is_uppercase) {
        first.to_lowercase().chain(chars).collect()
    } else {
        out
    }
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

// ---------------------------------------------------------------------------------------------
// Text helpers.

/// The offset of a tab that starts a line after a block scalar ending at `end`, before the
/// next token or comment line. Those lines are indented less than the scalar's content (else
/// they would be part of it), so YAML 1.2 allows them only indentation spaces and a line break
/// (`l-chomped-empty`, `l-strip-empty`), until a comment line (`l-trail-comments`) after which
/// any blank line may follow. Such a tab is neither content nor
/// indentation: `foo: |` followed by a line holding only a tab is an error (`Y79Y` in the YAML
/// test suite), and one level in as much as at the top. The parser checks this only at column
/// 0, so the builder checks the rest.
fn tab_after_block_scalar(text: &str, end: usize) -> Option<usize> {
    let b = text.as_bytes();
    if end >= b.len() {
        return None;
    }
    // The scalar ends on the line that does not belong to it, after some of its spaces.
    let mut i = b[..end].iter().rposition(|&c| c == b'\n').map_or(0, |k| k + 1);
    loop {
        while b.get(i) == Some(&b' ') {
            i += 1;
        }
        match b.get(i) {
            Some(b'\t') => return Some(i),
            Some(b'\n') => i += 1,
            Some(b'\r') if b.get(i + 1) == Some(&b'\n') => i += 2,
            _ => return None,
        }
    }
}

/// `end` moved back over trailing whitespace (a block scalar's span runs to the next token).
fn trim_end(text: &str, start: usize, end: usize) -> usize {
    let bytes = text.as_bytes();
    let mut end = end.min(bytes.len());
    while end > start && matches!(bytes[end - 1], b' ' | b'\t' | b'\r' | b'\n') {
        end -= 1;
    }
    end
}

/// Line numbers of byte offsets, from an index of line starts built on first use.
#[derive(Default)]
struct Lines {
    starts: Vec<usize>,
}

impl Lines {
    /// 1-based line of a byte offset.
    fn line_of(&mut self, text: &str, offset: usize) -> usize {
        if self.starts.is_empty() {
            self.starts.push(0);
            self.starts.extend(
                text.bytes()
                    .enumerate()
                    .filter(|&(_, b)| b == b'\n')
                    .map(|(i, _)| i + 1),
            );
        }
        self.starts.partition_point(|&start| start <= offset)
    }
}

/// Converts character offsets to byte offsets, walking on from the last answer when asked for
/// a later offset, so lookups in document order are linear in the text overall.
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
        *self = CharCursor::default();
        text.len()
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    const F: FileId = FileId(3);

    fn ok(src: &str) -> Node {
        parse(F, src.as_bytes(), &Limits::default()).unwrap_or_else(|d| panic!("{src:?}: {d:?}"))
    }

    fn err(bytes: impl AsRef<[u8]>) -> Diagnostic {
        err_with(bytes, &Limits::default())
    }

    #[test]
    fn a_bare_secret_reference_in_a_flow_mapping_gets_quoting_help() {
        let d = err("a: {h: ${env:TOKEN}}\n");
        assert_eq!(
            d.help.as_deref(),
            Some(
                "quote the value: `\"${env:TOKEN}\"`; unquoted, its `{` starts a mapping inside the flow mapping"
            )
        );
        // A quoted reference on the line is not the problem.
        let d = err("a: {h: \"${env:TOKEN}\", b: [}\n");
        assert_eq!(d.help, None, "{d:?}");
    }

    fn err_with(bytes: impl AsRef<[u8]>, limits: &Limits) -> Diagnostic {
        match parse(F, bytes.as_ref(), limits) {
            Ok(node) => panic!("expected an error, got {node:?}"),
            Err(d) => d,
        }
    }

    /// The source text under a span.
    fn text(src: impl AsRef<[u8]>, span: Span) -> String {
        assert_eq!(span.file, F);
        String::from_utf8_lossy(&src.as_ref()[span.start as usize..span.end as usize]).into_owned()
    }

    fn line(src: impl AsRef<[u8]>, span: Span) -> usize {
        1 + src.as_ref()[..span.start as usize]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
    }

    fn value<'n>(node: &'n Node, path: &[&str]) -> &'n Node {
        path.iter().fold(node, |n, k| match k.parse::<usize>() {
            Ok(i) => &n.as_seq().expect("a list")[i],
            Err(_) => n.get(k).unwrap_or_else(|| panic!("no key `{k}`")),
        })
    }

    #[test]
    fn scalars_follow_yaml_1_2() {
        let src = "no: NO\nyes: yes\non: on\nzip: 007\nneg: -01\nmode: 0o755\nhex: 0x1F\nupper: 0X1F\n\
                   under: 1_000\nf: 1.5\nexp: 1e3\ndot: .5\nt: true\nT: TRUE\nn: ~\nnull: null\nempty:\n\
                   int: -42\nplus: +7\nbig: 9223372036854775807\ninf: -.inf\nnan: .nan\nq: \"12\"\n\
                   s: \'true\'\ntag: !!str 12\nbang: ! 12\ni: !!int \"12\"\nfl: !!float 3\n";
        let root = ok(src);
        let v = |k: &str| value(&root, &[k]).value.clone();
        assert_eq!(v("no"), Value::Str("NO".into()));
        assert_eq!(v("yes"), Value::Str("yes".into()));
        assert_eq!(v("on"), Value::Str("on".into()));
        assert_eq!(v("zip"), Value::Str("007".into()));
        assert_eq!(v("neg"), Value::Str("-01".into()));
        assert_eq!(v("mode"), Value::Int(0o755));
        assert_eq!(v("hex"), Value::Int(31));
        assert_eq!(v("upper"), Value::Str("0X1F".into()));
        assert_eq!(v("under"), Value::Str("1_000".into()));
        assert_eq!(v("f"), Value::Float(1.5));
        assert_eq!(v("exp"), Value::Float(1000.0));
        assert_eq!(v("dot"), Value::Float(0.5));
        assert_eq!(v("t"), Value::Bool(true));
        assert_eq!(v("T"), Value::Bool(true));
        assert_eq!(v("n"), Value::Null);
        assert_eq!(v("null"), Value::Null);
        assert_eq!(v("empty"), Value::Null);
        assert_eq!(v("int"), Value::Int(-42));
        assert_eq!(v("plus"), Value::Int(7));
        assert_eq!(v("big"), Value::Int(i64::MAX));
        // An integer beyond 64 bits is an error at it, never a rounded float.
        for big in ["9223372036854775808", "-99999999999999999999"] {
            let d = err(format!("a: 1\nbig: {big}\n"));
            assert_eq!(
                d.message,
                format!(
                    "the integer `{big}` does not fit in 64 bits, and would be rounded; quote it to keep its digits as a string"
                )
            );
            assert_eq!(
                (d.primary.span.start, d.primary.span.end),
                (10, 10 + big.len() as u32)
            );
        }
        assert_eq!(v("inf"), Value::Float(f64::NEG_INFINITY));
        assert!(matches!(v("nan"), Value::Float(f) if f.is_nan()));
        assert_eq!(v("q"), Value::Str("12".into()));
        assert_eq!(v("s"), Value::Str("true".into()));
        assert_eq!(v("tag"), Value::Str("12".into()));
        assert_eq!(v("bang"), Value::Str("12".into()));
        assert_eq!(v("i"), Value::Int(12));
        assert_eq!(v("fl"), Value::Float(3.0));
    }

    #[test]
    fn plain_scalar_resolution_edge_cases() {
        for (text, expected) in [
            ("0", Value::Int(0)),
            ("-0", Value::Int(0)),
            ("00", Value::Str("00".into())),
            ("1.", Value::Float(1.0)),
            ("01.5", Value::Float(1.5)),
            (".", Value::Str(".".into())),
            ("1e", Value::Str("1e".into())),
            ("-", Value::Str("-".into())),
            ("+.inf", Value::Float(f64::INFINITY)),
            ("-.nan", Value::Str("-.nan".into())),
            ("0x", Value::Str("0x".into())),
            ("0o8", Value::Str("0o8".into())),
            ("1.2.3", Value::Str("1.2.3".into())),
            ("2h", Value::Str("2h".into())),
            ("9223372036854775807", Value::Int(i64::MAX)),
            ("-9223372036854775808", Value::Int(i64::MIN)),
            ("0xFFFFFFFFFFFFFFFFF", Value::Str("0xFFFFFFFFFFFFFFFFF".into())),
            ("yes", Value::Str("yes".into())),
            ("Off", Value::Str("Off".into())),
        ] {
            let value = resolve_plain(text).unwrap_or_else(|| Value::Str(text.to_owned()));
            assert_eq!(value, expected, "{text}");
        }
    }

    #[test]
    fn spans_are_byte_ranges_after_multibyte_characters() {
        // `é` is 2 bytes, `🎉` is 4: character and byte offsets differ from line 1 on.
        let src = "# café 🎉\nname: héllo 🎉 wörld\n\"clé\": [é, 🎉]\nlast: {k: ü}\n";
        let root = ok(src);
        let entries = root.as_map().expect("a mapping");
        let keys: Vec<_> = entries
            .iter()
            .map(|(k, _)| (k.name.as_str(), text(src, k.span)))
            .collect();
        assert_eq!(
            keys,
            [
                ("name", "name".into()),
                ("clé", "\"clé\"".into()),
                ("last", "last".into())
            ]
        );
        assert_eq!(
            entries[0].0.span.start as usize,
            src.find("name").expect("in src")
        );
        let name = value(&root, &["name"]);
        assert_eq!(name.as_str(), Some("héllo 🎉 wörld"));
        assert_eq!(text(src, name.span), "héllo 🎉 wörld");
        assert_eq!(text(src, value(&root, &["clé"]).span), "[é, 🎉]");
        assert_eq!(text(src, value(&root, &["clé", "1"]).span), "🎉");
        assert_eq!(text(src, value(&root, &["last"]).span), "{k: ü}");
        assert_eq!(text(src, value(&root, &["last", "k"]).span), "ü");
        assert_eq!(line(src, value(&root, &["last", "k"]).span), 4);
    }

    #[test]
    fn nested_block_and_flow_collections() {
        let src = "flow: {a: [1, 2], b: {}}\nsteps:\n  one:\n    next: [two]\n  two:\n    - x\n    \
                   - y: 1\n      z: 2\n\n# end\n";
        let root = ok(src);
        assert_eq!(
            root.to_json(),
            serde_json::json!({
                "flow": {"a": [1, 2], "b": {}},
                "steps": {"one": {"next": ["two"]}, "two": ["x", {"y": 1, "z": 2}]}
            })
        );
        assert_eq!(text(src, value(&root, &["flow"]).span), "{a: [1, 2], b: {}}");
        assert_eq!(text(src, value(&root, &["flow", "a"]).span), "[1, 2]");
        assert_eq!(text(src, value(&root, &["flow", "b"]).span), "{}");
        // Block collections run from their first key or `-` to the end of their last value.
        assert_eq!(text(src, value(&root, &["steps", "one"]).span), "next: [two]");
        assert_eq!(
            text(src, value(&root, &["steps", "two"]).span),
            "- x\n    - y: 1\n      z: 2"
        );
        assert_eq!(
            text(src, value(&root, &["steps", "two", "1"]).span),
            "y: 1\n      z: 2"
        );
        assert!(text(src, root.span).starts_with("flow:"));
        assert!(text(src, root.span).ends_with("z: 2"));
        let (key, _) = &value(&root, &["steps"]).as_map().expect("a mapping")[1];
        assert_eq!((key.name.as_str(), line(src, key.span)), ("two", 5));
    }

    #[test]
    fn block_scalars_span_their_content() {
        let src = "prompt: |\n  Classify this.\n  {{ input }}\n\nfolded: >-\n  a\n  b\nnext: x\n";
        let root = ok(src);
        let prompt = value(&root, &["prompt"]);
        assert_eq!(prompt.as_str(), Some("Classify this.\n{{ input }}\n"));
        assert_eq!(text(src, prompt.span), "Classify this.\n  {{ input }}");
        let folded = value(&root, &["folded"]);
        assert_eq!(folded.as_str(), Some("a b"));
        assert_eq!(text(src, folded.span), "a\n  b");
    }

    #[test]
    fn keys_keep_their_spelling() {
        let root = ok("200: ok\n0x1F: hex\ntrue: t\n~: n\n\"quoted key\": q\n1.50: f\n");
        let names: Vec<_> = root
            .as_map()
            .expect("a mapping")
            .iter()
            .map(|(k, _)| k.name.as_str())
            .collect();
        assert_eq!(names, ["200", "0x1F", "true", "~", "quoted key", "1.50"]);
    }

    #[test]
    fn non_scalar_keys_are_errors() {
        for (src, found) in [("{a: 1}: x\n", "{a: 1}"), ("ok: 1\n? [a, b]\n: x\n", "[a, b]")] {
            let d = err(src);
            assert_eq!(d.code(), "SY100", "{src}");
            assert!(
                d.message.starts_with("a mapping key must be a scalar"),
                "{}",
                d.message
            );
            assert_eq!(text(src, d.primary.span), found);
        }
    }

    #[test]
    fn duplicate_keys_point_at_the_second_key() {
        let src = "flow: a\nsteps:\n  fetch: {agent: x}\n  other: {agent: y}\n  fetch: {agent: z}\n";
        let d = err(src);
        assert_eq!(d.rule, &DUPLICATE_KEY);
        assert_eq!(d.code(), "SY102");
        assert_eq!(d.message, "duplicate key `fetch`");
        assert_eq!(
            (line(src, d.primary.span), text(src, d.primary.span)),
            (5, "fetch".into())
        );
        assert_eq!(line(src, d.secondary[0].span), 3);
        assert!(
            d.help.as_deref().is_some_and(|h| h.contains("line 3")),
            "{:?}",
            d.help
        );

        // In flow mappings, between spellings of the same text, and in large mappings too.
        let d = err("a: {x: 1, y: 2, x: 3}\n");
        assert_eq!((d.code(), d.primary.span.start), ("SY102", 16));
        let d = err("200: a\n\"200\": b\n");
        assert_eq!((d.code(), d.primary.span.start), ("SY102", 7));
        let big: String = (0..40).map(|i| format!("k{i}: {i}\n")).collect::<String>() + "k7: again\n";
        let d = err(&big);
        assert_eq!(
            (
                d.code(),
                line(&big, d.primary.span),
                line(&big, d.secondary[0].span)
            ),
            ("SY102", 41, 8)
        );
    }

    #[test]
    fn collecting_reports_every_duplicate_and_keeps_the_first() {
        let src = "a: {x: 1, x: 2}\nb: 1\nb: 2\nb: 3\nc: ok\n";
        let (node, diags) = parse_collecting(F, src.as_bytes(), &Limits::default());
        let node = node.expect("the file parses");
        assert_eq!(
            node.to_json(),
            serde_json::json!({"a": {"x": 1}, "b": 1, "c": "ok"})
        );
        let found: Vec<_> = diags
            .iter()
            .map(|d| (d.code(), line(src, d.primary.span)))
            .collect();
        assert_eq!(found, [("SY102", 1), ("SY102", 3), ("SY102", 4)]);
        assert!(diags.iter().skip(1).all(|d| line(src, d.secondary[0].span) == 2));

        // A problem that stops the parse comes last, after the duplicates before it; `parse`
        // returns the first diagnostic in the file.
        let src = "a: 1\na: 2\nb: [\n";
        let (node, diags) = parse_collecting(F, src.as_bytes(), &Limits::default());
        assert!(node.is_none());
        assert_eq!(
            diags.iter().map(Diagnostic::code).collect::<Vec<_>>(),
            ["SY102", "SY100"]
        );
        assert_eq!(err(src).code(), "SY102");

        // Many duplicates: a bounded report, found in linear time.
        let src = "a: 1\n".repeat(200_000);
        let (node, diags) = parse_collecting(F, src.as_bytes(), &Limits::default());
        assert_eq!(node.expect("parses").to_json(), serde_json::json!({"a": 1}));
        assert_eq!(diags.len(), MAX_DUPLICATES);
        assert_eq!(line(&src, diags[999].primary.span), 1001);
    }

    #[test]
    fn aliases_copy_their_anchor() {
        let src =
            "defaults: &retry {attempts: 3, on: [timeout]}\na: {retry: *retry}\nname: &n fetch\n*n : 1\n";
        let root = ok(src);
        assert_eq!(
            value(&root, &["a", "retry"]).to_json(),
            serde_json::json!({"attempts": 3, "on": ["timeout"]})
        );
        // The copy spans the alias; the values inside it, the text that defines them.
        assert_eq!(text(src, value(&root, &["a", "retry"]).span), "*retry");
        let attempts = value(&root, &["a", "retry", "attempts"]);
        assert_eq!(
            (text(src, attempts.span), line(src, attempts.span)),
            ("3".into(), 1)
        );
        // An anchored scalar used as a key.
        assert_eq!(value(&root, &["fetch"]).value, Value::Int(1));
    }

    #[test]
    fn merge_keys_merge_with_own_keys_winning() {
        let root = ok("base: &b {x: 1, y: 2}\nmore: &m {z: 3, x: 0}\nc:\n  <<: [*b, *m]\n  y: 9\n");
        assert_eq!(
            value(&root, &["c"]).to_json(),
            serde_json::json!({"y": 9, "x": 1, "z": 3})
        );
        let d = err("c:\n  <<: 5\n");
        assert_eq!(d.code(), "SY100");
        assert!(d.message.contains("merge key"), "{}", d.message);
    }

    #[test]
    fn recursive_and_unknown_aliases_are_errors() {
        let d = err("a: &a [1, *a]\n");
        assert_eq!((d.code(), d.primary.span.start), ("SY100", 10));
        let src = "a: 1\nb: *nope\n";
        let d = err(src);
        assert_eq!(d.code(), "SY100");
        assert_eq!(d.message, "unknown anchor `nope`");
        assert_eq!(
            (line(src, d.primary.span), text(src, d.primary.span)),
            (2, "*nope".into())
        );
    }

    fn alias_bomb() -> String {
        let mut src = String::from("a: &a [x, x, x, x, x, x, x, x, x]\n");
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
        for w in names.windows(2) {
            let aliases = vec![format!("*{}", w[0]); 9].join(", ");
            src += &format!("{}: &{} [{aliases}]\n", w[1], w[1]);
        }
        src
    }

    #[test]
    fn alias_bombs_stop_at_the_expansion_limit() {
        let src = alias_bomb();
        assert!(src.len() < 400);
        let d = err(&src);
        assert_eq!(d.rule, &YAML_BUDGET);
        assert_eq!(d.code(), "SY101");
        assert_eq!(d.message, "alias expansion limit exceeded (100000 nodes)");
        assert!(text(&src, d.primary.span).starts_with('*'));

        let small = Limits {
            max_alias_expansions: 50,
            ..Limits::default()
        };
        let d = err_with(&src, &small);
        assert_eq!(d.message, "alias expansion limit exceeded (50 nodes)");
        assert_eq!(
            (line(&src, d.primary.span), text(&src, d.primary.span)),
            (2, "*a".into())
        );
    }

    #[test]
    fn deep_flow_nesting_is_a_clear_error() {
        for src in [
            "[".repeat(50_000),
            "{a: ".repeat(50_000),
            format!("k: {}x{}", "[".repeat(50_000), "]".repeat(50_000)),
        ] {
            let d = err(&src);
            assert_eq!(d.code(), "SY101");
            assert_eq!(d.message, "nesting depth limit exceeded (128 levels)");
            assert_eq!(line(&src, d.primary.span), 1);
            assert!(d.primary.span.start < 1_000);
        }
    }

    #[test]
    fn deep_block_nesting_is_a_clear_error() {
        // 100,000 levels of block lists (`- - - x`) and of block mappings (`? ? ? x`).
        for unit in ["- ", "? "] {
            let src = unit.repeat(100_000) + "x\n";
            let d = err(&src);
            assert_eq!(
                (d.code(), d.message.as_str()),
                ("SY101", "nesting depth limit exceeded (128 levels)")
            );
            assert_eq!(d.primary.span.start, 256);
        }
        let src: String = (0..200).map(|i| format!("{}k:\n", " ".repeat(i))).collect();
        let d = err(&src);
        assert_eq!(d.code(), "SY101");
        assert_eq!(line(&src, d.primary.span), 129);
    }

    #[test]
    fn nesting_at_the_limit_parses() {
        let limits = Limits {
            max_depth: 5,
            ..Limits::default()
        };
        assert!(parse(F, b"[[[[[x]]]]]", &limits).is_ok());
        let d = err_with(b"[[[[[[x]]]]]]", &limits);
        assert_eq!(
            (d.code(), d.message.as_str()),
            ("SY101", "nesting depth limit exceeded (5 levels)")
        );
        assert_eq!(d.primary.span.start, 5);
        // An alias that would nest deeper than the limit.
        let src = "a: &a [[[1]]]\nb: [[*a]]\n";
        let d = err_with(src, &limits);
        assert_eq!((d.code(), text(src, d.primary.span)), ("SY101", "*a".into()));
    }

    #[test]
    fn very_deep_nesting_with_a_raised_limit_does_not_overflow() {
        let limits = Limits {
            max_depth: 200_000,
            max_alias_expansions: 1_000_000,
            ..Limits::default()
        };
        let src = format!("a: &a {}1{}\nb: *a\n", "[".repeat(100_000), "]".repeat(100_000));
        let node = parse(F, src.as_bytes(), &limits).expect("parses");
        // Drop the deep tree on a thread with room for it.
        std::thread::Builder::new()
            .stack_size(256 << 20)
            .spawn(move || drop(node))
            .expect("spawn")
            .join()
            .expect("drop");
    }

    #[test]
    fn node_limit() {
        let limits = Limits {
            max_nodes: 10,
            ..Limits::default()
        };
        let src = "a: [1, 2, 3]\nb: [4, 5, 6]\n";
        let d = err_with(src, &limits);
        assert_eq!(
            (d.code(), d.message.as_str()),
            ("SY101", "node limit exceeded (10 nodes)")
        );
        assert_eq!(text(src, d.primary.span), "6");
    }

    #[test]
    fn oversized_files_fail_before_parsing() {
        let big = vec![b'a'; 20 << 20];
        let d = err(&big);
        assert_eq!(d.code(), "SY101");
        assert_eq!(d.message, "file is 20.0 MiB, larger than the 8 MiB limit");
        assert_eq!(d.primary.span, Span::file_start(F));
        let d = err_with(
            b"a: 12345",
            &Limits {
                max_bytes: 4,
                ..Limits::default()
            },
        );
        assert_eq!(d.message, "file is 8 bytes, larger than the 4-byte limit");
    }

    #[test]
    fn invalid_utf8_points_at_the_first_bad_byte() {
        let src = "name: café\nnext: \u{1F389}\nbad: "
            .as_bytes()
            .iter()
            .copied()
            .chain([0xC3, 0x28, b'\n'])
            .collect::<Vec<_>>();
        let d = err(&src);
        assert_eq!(
            (d.code(), d.message.as_str()),
            ("SY100", "file is not valid UTF-8")
        );
        assert_eq!(d.primary.span.start as usize, src.len() - 3);
        assert_eq!(line(&src, d.primary.span), 3);
        // The span is in the text kept for the file, the lossy reading of its bytes: it covers
        // the whole U+FFFD that stands for the bad byte there.
        let lossy = String::from_utf8_lossy(&src);
        let (start, end) = (d.primary.span.start as usize, d.primary.span.end as usize);
        assert_eq!(&lossy[start..end], "\u{FFFD}");
        assert_eq!(d.primary.message, "invalid byte 0xc3");
        // A UTF-16 file.
        let d = err([0xFF, 0xFE, b'a', 0, b':', 0]);
        assert_eq!((d.code(), d.primary.span.start), ("SY100", 0));
    }

    /// Deterministic xorshift bytes.
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn binary_garbage_is_an_error_not_a_panic() {
        let d = err(noise(42, 4096));
        assert_eq!(d.code(), "SY100");
        assert!(d.primary.span.end as usize <= 4096);
        let d = err(b"flow: a\nsteps:\x00\x00\x01\n  x: 1\n");
        assert_eq!((d.code(), line(b"flow: a\nsteps:", d.primary.span)), ("SY100", 2));
        assert_eq!(d.primary.span.start, 14);
    }

    #[test]
    fn corpus_of_bad_inputs_never_panics() {
        // Random bytes, random ASCII, and random YAML punctuation: any outcome but a panic,
        // and every error is a syntax-family code with a span inside the file.
        const ALPHABET: &[u8] = b"[]{}:,-?!&*|>#'\"%@` \n\t\r\\ab01.~<";
        for seed in 0..300u64 {
            let len = (seed as usize * 37) % 700;
            let bytes = noise(seed, len);
            let ascii: Vec<u8> = bytes.iter().map(|b| b & 0x7F).collect();
            let yamlish: Vec<u8> = bytes
                .iter()
                .map(|b| ALPHABET[*b as usize % ALPHABET.len()])
                .collect();
            for input in [bytes, ascii, yamlish] {
                if let Err(d) = parse(F, &input, &Limits::default()) {
                    assert!(
                        d.code().starts_with("SY10"),
                        "{:?}: {d:?}",
                        String::from_utf8_lossy(&input)
                    );
                    // Spans point into the text kept for the file: the lossy reading of
                    // bytes that are not UTF-8.
                    let text = String::from_utf8_lossy(&input);
                    let (start, end) = (d.primary.span.start as usize, d.primary.span.end as usize);
                    assert!(end <= text.len(), "{d:?}");
                    assert!(
                        text.is_char_boundary(start) && text.is_char_boundary(end),
                        "{d:?}"
                    );
                    assert!(!d.message.is_empty());
                }
            }
        }
    }

    #[test]
    fn one_document_per_file() {
        let src = "---\nflow: a\n---\nflow: b\n";
        let d = err(src);
        assert_eq!(
            (d.code(), d.message.as_str()),
            ("SY100", "a flow file holds one YAML document")
        );
        assert_eq!(
            (line(src, d.primary.span), text(src, d.primary.span)),
            (3, "---".into())
        );
        let d = err("a: 1\n...\nb: 2\n");
        assert_eq!((d.code(), d.primary.span.start), ("SY100", 9));
        // A document end marker, and comments after it, are fine.
        assert_eq!(ok("a: 1\n...\n# done\n").to_json(), serde_json::json!({"a": 1}));
    }

    #[test]
    fn empty_files_are_null() {
        for src in ["", "# only a comment\n\n# another\n", "---\n", "\u{FEFF}"] {
            assert_eq!(ok(src).value, Value::Null, "{src:?}");
        }
    }

    #[test]
    fn byte_order_mark_is_skipped_and_spans_stay_right() {
        let src = "\u{FEFF}flow: a\n";
        let root = ok(src);
        let (key, _) = &root.as_map().expect("a mapping")[0];
        assert_eq!((key.span.start, text(src, key.span)), (3, "flow".into()));
    }

    #[test]
    fn syntax_errors_are_terse_and_located() {
        let src = "flow: a\nsteps:\n  x: \"unterminated\n";
        let d = err(src);
        assert_eq!((d.code(), d.message.as_str()), ("SY100", "unclosed quote"));
        assert_eq!(
            (line(src, d.primary.span), text(src, d.primary.span)),
            (3, "\"".into())
        );
        let src = "a:\n  b: 1\n c: 2\n";
        let d = err(src);
        assert_eq!(d.code(), "SY100");
        assert_eq!(
            (line(src, d.primary.span), text(src, d.primary.span)),
            (3, "c".into())
        );
        assert!(
            d.message.chars().next().is_some_and(char::is_lowercase),
            "{}",
            d.message
        );
        let src = "é: [1, 2\nb: 3\n";
        let d = err(src);
        assert_eq!((d.code(), line(src, d.primary.span)), ("SY100", 2));
        assert!(std::str::from_utf8(&src.as_bytes()[d.primary.span.start as usize..]).is_ok());
    }

    #[test]
    fn yaml_1_2_indentation_is_enforced_and_located() {
        // A double-quoted scalar continued in column 0 inside an indented mapping.
        let src = "a:\n  b: \"one\ntwo\"\n";
        let d = err(src);
        assert_eq!(
            (d.code(), d.message.as_str()),
            ("SY100", "invalid indentation in multiline quoted scalar")
        );
        assert_eq!((line(src, d.primary.span), d.primary.span.start), (3, 13));
        // A flow list continued in its key's column.
        let src = "a:\n  b: [1,\n  2]\n";
        let d = err(src);
        assert_eq!((d.code(), d.message.as_str()), ("SY100", "invalid indentation"));
        assert_eq!(
            (line(src, d.primary.span), text(src, d.primary.span)),
            (3, "2".into())
        );
        // A block scalar whose first line starts with a tab, one level in.
        let src = "a:\n  foo: |\n  \t\n  bar: 1\n";
        let d = err(src);
        assert_eq!(
            (d.code(), d.message.as_str()),
            ("SY100", "tab cannot be used as indentation")
        );
        assert_eq!(
            (line(src, d.primary.span), text(src, d.primary.span)),
            (3, "\t".into())
        );
        // A key longer than 1024 characters with the spaces before its `:`.
        let src = format!("a:\n  {} : 1\n", "k".repeat(1024));
        let d = err(&src);
        assert_eq!(
            (d.code(), d.message.as_str()),
            ("SY100", "a key before `:` is at most 1024 characters")
        );
        assert_eq!(
            (line(&src, d.primary.span), text(&src, d.primary.span)),
            (2, ":".into())
        );
        // Their valid neighbours.
        for src in [
            "a:\n  b: \"one\n   two\"\n",
            "a:\n  b: [1,\n   2]\n",
            "a:\n  foo: |\n   \t\n  bar: 1\n",
            "foo: |\n \t\nbar: 1\n",
        ] {
            ok(src);
        }
        assert_eq!(
            ok("a:\n  b: \"one\n   two\"\n")
                .get("a")
                .and_then(|a| a.get("b"))
                .and_then(Node::as_str),
            Some("one two")
        );
        ok(&format!("a:\n  {}: 1\n", "k".repeat(1024)));
        // A quote left open still says so, at the quote, though its next line is indented
        // too little for a continuation.
        let src = "a:\n  b: \"one\nc: 1\n";
        let d = err(src);
        assert_eq!((d.message.as_str(), d.primary.span.start), ("unclosed quote", 8));
    }

    #[test]
    fn tab_indentation_points_at_the_tab() {
        let src = "flow: tabs\nsteps:\n\tone:\n\t\tsucceed: {}\n";
        let d = err(src);
        assert_eq!(d.code(), "SY100");
        assert_eq!(
            (d.primary.span.start, text(src, d.primary.span)),
            (18, "\t".into())
        );
    }

    #[test]
    fn unsupported_tags_are_errors() {
        let src = "a: !Ref other\n";
        let d = err(src);
        assert_eq!(
            (d.code(), d.message.as_str()),
            ("SY100", "unsupported tag `!Ref`")
        );
        assert_eq!(text(src, d.primary.span), "!Ref");
        let src = "a: !<tag:example.com,2000:x> [1]\n";
        let d = err(src);
        assert_eq!(d.message, "unsupported tag `!<tag:example.com,2000:x>` on a list");
        assert_eq!(text(src, d.primary.span), "!<tag:example.com,2000:x>");

        let d = err("a: !!int twelve\n");
        assert_eq!(d.message, "`twelve` is not an integer, as tag `!!int` says");
        assert_eq!(err("a: !!seq {x: 1}\n").code(), "SY100");
        assert!(ok("a: !!map {x: 1}\nb: !!seq [1]\n").get("b").is_some());
    }

    #[test]
    fn messages_are_cleaned_up() {
        assert_eq!(
            clean_message("While parsing a node.\n  at line 3"),
            "while parsing a node. at line 3"
        );
        assert_eq!(clean_message("YAML error."), "YAML error");
        assert_eq!(clean_message(""), "invalid YAML");
    }

    #[test]
    fn default_limits() {
        let l = Limits::default();
        assert_eq!(
            (l.max_bytes, l.max_depth, l.max_nodes, l.max_alias_expansions),
            (8 << 20, 128, 1_000_000, 100_000)
        );
    }

    #[test]
    fn a_json_schema_nested_twenty_deep_parses() {
        let mut schema = String::from("type: string");
        for i in 0..20 {
            let inner = schema
                .lines()
                .map(|l| format!("      {l}"))
                .collect::<Vec<_>>()
                .join("\n");
            schema =
                format!("type: object\nrequired: [p{i}]\nproperties:\n  p{i}:\n    allOf:\n    -\n{inner}");
        }
        let body = schema
            .lines()
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n");
        let src = format!("flow: deep\ninput:\n  schema:\n{body}\nsteps: {{}}\n");
        let root = ok(&src);
        assert!(root.get("steps").is_some());
    }
}
