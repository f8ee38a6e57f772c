//! The full parser: YAML text → spanned [`Node`]s, under hard budgets.
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
//! [`super::parse_collecting`] reports every one of them and keeps the first of each in the tree.
//!
//! Spans are byte offsets. A scalar spans its text (quotes included; a block scalar spans its
//! content lines, not the `|` header). A flow collection spans `[`…`]`; a block collection spans
//! its first key or `-` to the end of its last value. A node copied by an alias spans the
//! `*alias` token; the nodes inside it keep the spans of the text that defines them. A file that
//! is not UTF-8 has no tree: its one diagnostic spans the U+FFFD that replaces the first invalid
//! bytes in `String::from_utf8_lossy` of the file, the text kept for rendering.
//!
//! Budgets ([`Limits`], `limits.rs`) are counted as events arrive, so every limit stops the
//! parse where it is crossed. Scalar values are `scalar.rs`'s, byte offsets and line numbers
//! `text.rs`'s. The entry points (`parse.rs`) call this parser only for what the fast path
//! (`fast.rs`) does not read, on a thread of its own. This module knows YAML, not flows.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_saphyr::granit_parser::{
    ErrorKind, Event, Marker, Options, Parser, ScalarStyle, ScanError, StructureStyle, Tag,
};

use super::limits::{Limits, MAX_IMPLICIT_KEY_CHARS, aliases_exceeded, depth_exceeded, nodes_exceeded};
use super::scalar::{CORE, CORE_TAGS_HELP, TagProblem, scalar_value};
use super::text::{CharCursor, Lines, tab_after_block_scalar, trim_end};
use super::{Key, Node, Value};
use crate::diag::Diagnostic;
use crate::diag::codes::{DUPLICATE_KEY, YAML_SYNTAX};
use crate::source::{FileId, Span};

/// The full parser alone: the tree of UTF-8 text within the size limit, or none when a problem
/// stopped the parse, and the problems found. [`super::parse()`] tries the fast path first;
/// tests hold the fast path to this.
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
pub(super) const MAX_DUPLICATES: usize = 1_000;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_cleaned_up() {
        assert_eq!(
            clean_message("While parsing a node.\n  at line 3"),
            "while parsing a node. at line 3"
        );
        assert_eq!(clean_message("YAML error."), "YAML error");
        assert_eq!(clean_message(""), "invalid YAML");
    }
}
