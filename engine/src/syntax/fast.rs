//! A fast path for the plain YAML that flows are made of: block mappings and lists, one-line
//! flow collections, one-line plain and quoted scalars, comments.
//!
//! [`parse`] reads such text straight into the [`Node`] tree that the full parser
//! ([`super::yaml`], over serde-saphyr's `granit_parser`) builds for it — same values, same
//! spans, same key spellings — about ten times faster. It gives up (returns `None`) at the
//! first thing outside that subset, and the full parser then reads the file from the start:
//! anchors, aliases, tags, block scalars (`|`, `>`), scalars or flow collections over several
//! lines, explicit keys (`?`), document markers and directives, tabs, carriage returns,
//! escapes in double quotes, empty list entries, empty values in flow collections, duplicate
//! keys, merge keys, anything deeper than [`MAX_DEPTH`] levels or over a [`Limits`] budget,
//! and every syntax error. So every problem is still found, worded and placed by the full
//! parser, and the fast path only ever answers for text it reads exactly as the full parser
//! does (the tests check both on the repository's flows and on thousands of mutations).
//!
//! Recursion is one call per nesting level, at most [`MAX_DEPTH`], so the fast path runs on
//! any thread, and the trees it builds are shallow enough to drop anywhere.

use std::hash::BuildHasher as _;

use super::limits::{Limits, MAX_IMPLICIT_KEY_CHARS};
use super::scalar::{resolve_plain, too_large_integer};
use super::{Key, Node, Value};
use crate::source::{FastState, FileId, Span};

/// The deepest nesting of collections the fast path reads.
pub(super) const MAX_DEPTH: usize = 64;

/// The longest implicit key YAML allows (production [154], `ns-s-implicit-yaml-key`: the key
/// and the spaces between it and its `:`, "at most 1024 characters altogether"), counted here
/// in bytes, which is stricter: a key the count refuses goes to the full parser, which counts
/// characters.
const MAX_KEY_BYTES: usize = MAX_IMPLICIT_KEY_CHARS;

/// Mappings of up to this many keys are checked for duplicates by scanning.
const SCAN_KEYS: usize = 16;

/// The fast path gave up: the text is outside what it reads (not a problem of the text).
struct Bail;

type R<T> = Result<T, Bail>;

/// The tree of `text` as file `file`, or `None` when the text is outside the fast path's
/// subset (see the module documentation) and the full parser must read it.
pub(super) fn parse(file: FileId, text: &str, limits: &Limits) -> Option<Node> {
    if !plain_characters(text.as_bytes()) {
        return None;
    }
    let mut p = Fast {
        b: text.as_bytes(),
        text,
        file,
        limits,
        nodes: 0,
        depth: 0,
        hasher: FastState::default(),
    };
    p.document().ok()
}

/// Whether every character is one the fast path takes as it is: printable, no tab, no
/// carriage return, no byte order mark, no C1 control, no line or paragraph separator.
fn plain_characters(b: &[u8]) -> bool {
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c < 0x80 {
            if (c < 0x20 && c != b'\n') || c == 0x7F {
                return false;
            }
            i += 1;
            continue;
        }
        let next = |k: usize| b.get(i + k).copied().unwrap_or(0);
        let bad = match c {
            // U+0080..U+009F (C1 controls, NEL among them).
            0xC2 => (0x80..=0x9F).contains(&next(1)),
            // U+2028, U+2029.
            0xE2 => next(1) == 0x80 && matches!(next(2), 0xA8 | 0xA9),
            // U+FEFF (a byte order mark), U+FFFE, U+FFFF.
            0xEF => {
                (next(1) == 0xBB && next(2) == 0xBF) || (next(1) == 0xBF && matches!(next(2), 0xBE | 0xBF))
            }
            _ => false,
        };
        if bad {
            return false;
        }
        i += 1;
    }
    true
}

/// Where a scalar is: which characters end a plain scalar depends on it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Block,
    Flow,
}

/// A line with content (not blank, not only a comment).
#[derive(Clone, Copy, Debug)]
struct Line {
    /// Byte offset of the line's first character.
    start: usize,
    /// Spaces before the content.
    indent: usize,
    /// Byte offset of the first character of the content.
    content: usize,
}

/// A plain scalar's extent: its text ends at `end` (trailing spaces excluded); scanning
/// stopped at `stop`, on `:` when `colon`.
struct PlainScan {
    end: usize,
    stop: usize,
    colon: bool,
}

/// A key read, and the offset just past its `:`.
struct ReadKey {
    key: Key,
    colon: usize,
}

struct Fast<'a> {
    text: &'a str,
    b: &'a [u8],
    file: FileId,
    limits: &'a Limits,
    nodes: usize,
    depth: usize,
    hasher: FastState,
}

impl Fast<'_> {
    fn span(&self, start: usize, end: usize) -> Span {
        Span::new(self.file, start, end)
    }

    fn byte(&self, i: usize) -> u8 {
        self.b.get(i).copied().unwrap_or(b'\n')
    }

    /// Counts `n` more nodes, as the full parser does (every key and value, every collection).
    fn count(&mut self, n: usize) -> R<()> {
        self.nodes += n;
        if self.nodes > self.limits.max_nodes {
            return Err(Bail);
        }
        Ok(())
    }

    /// Opens a collection: one more level, one more node.
    fn open(&mut self) -> R<()> {
        if self.depth >= self.limits.max_depth || self.depth >= MAX_DEPTH {
            return Err(Bail);
        }
        self.depth += 1;
        self.count(1)
    }

    fn skip_spaces(&self, mut i: usize) -> usize {
        while self.b.get(i) == Some(&b' ') {
            i += 1;
        }
        i
    }

    /// The offset of the end of the line holding `i` (its `\n`, or the end of the text).
    fn line_end(&self, i: usize) -> usize {
        self.b[i.min(self.b.len())..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(self.b.len(), |k| i + k)
    }

    /// The first line with content at or after the line starting at `from`, skipping blank
    /// lines and comment lines. Document markers and directives end the fast path.
    fn content_line(&self, mut from: usize) -> R<Option<Line>> {
        loop {
            if from >= self.b.len() {
                return Ok(None);
            }
            let i = self.skip_spaces(from);
            match self.b.get(i) {
                None => return Ok(None),
                Some(b'\n') => from = i + 1,
                Some(b'#') => from = self.line_end(i) + 1,
                Some(&c) => {
                    if i == from {
                        let rest = &self.b[i..];
                        if c == b'%' || rest.starts_with(b"---") || rest.starts_with(b"...") {
                            return Err(Bail);
                        }
                    }
                    return Ok(Some(Line {
                        start: from,
                        indent: i - from,
                        content: i,
                    }));
                }
            }
        }
    }

    /// After an item that ends at `e`: only spaces and a comment may follow on its line.
    /// Returns the start of the next line.
    fn rest_of_line(&self, e: usize) -> R<usize> {
        let i = self.skip_spaces(e);
        match self.b.get(i) {
            None => Ok(self.b.len()),
            Some(b'\n') => Ok(i + 1),
            Some(b'#') if i > e => Ok(self.line_end(i) + 1),
            _ => Err(Bail),
        }
    }

    /// `- ` (or `-` ending the line) at `i`: a block list entry.
    fn is_entry(&self, i: usize) -> bool {
        self.byte(i) == b'-' && matches!(self.byte(i + 1), b' ' | b'\n')
    }

    fn document(&mut self) -> R<Node> {
        let Some(line) = self.content_line(0)? else {
            return Ok(Node {
                span: Span::file_start(self.file),
                value: Value::Null,
            });
        };
        if line.indent != 0 {
            return Err(Bail);
        }
        let (node, next) = self.block(line)?;
        if next.is_some() {
            return Err(Bail);
        }
        Ok(node)
    }

    /// The block collection whose first line is `line`: a list when it starts with `- `, else a
    /// mapping.
    fn block(&mut self, line: Line) -> R<(Node, Option<Line>)> {
        if self.is_entry(line.content) {
            self.list(line, false)
        } else {
            self.mapping(line.content, line.indent)
        }
    }

    /// A block mapping whose first key is at `first`, in column `col`. Returns it and the next
    /// line with content that is not part of it.
    fn mapping(&mut self, first: usize, col: usize) -> R<(Node, Option<Line>)> {
        self.open()?;
        let mut entries: Vec<(Key, Node)> = Vec::new();
        let mut end = first;
        let mut at = first;
        let next = loop {
            let ReadKey { key, colon } = self.key(at)?.ok_or(Bail)?;
            self.count(1)?;
            let v = self.skip_spaces(colon);
            let (value, next) =
                if matches!(self.b.get(v), None | Some(b'\n')) || (self.byte(v) == b'#' && v > colon) {
                    // The value is on the lines below, or there is none.
                    let below = self.content_line(self.line_end(v) + 1)?;
                    match below {
                        Some(l) if l.indent > col => self.block(l)?,
                        Some(l) if l.indent == col && self.is_entry(l.content) => self.list(l, true)?,
                        _ => {
                            self.count(1)?;
                            let at = colon - 1;
                            let null = Node {
                                span: self.span(at, at),
                                value: Value::Null,
                            };
                            (null, below)
                        }
                    }
                } else {
                    let (value, e) = self.inline(v, Ctx::Block)?;
                    let below = self.rest_of_line(e)?;
                    (value, self.content_line(below)?)
                };
            end = end.max(key.span.end as usize).max(value.span.end as usize);
            self.insert(&mut entries, key, value)?;
            match next {
                Some(l) if l.indent == col && !self.is_entry(l.content) => at = l.content,
                Some(l) if l.indent < col => break Some(l),
                None => break None,
                Some(_) => return Err(Bail),
            }
        };
        self.close_keys(&entries)?;
        self.depth -= 1;
        let node = Node {
            span: self.span(first, end),
            value: Value::Map(entries),
        };
        Ok((node, next))
    }

    /// Adds an entry to a mapping being read. A duplicate key ends the fast path (the full
    /// parser reports it): the first [`SCAN_KEYS`] keys are compared as they come, a larger
    /// mapping is checked once by [`Fast::close_keys`].
    fn insert(&self, entries: &mut Vec<(Key, Node)>, key: Key, value: Node) -> R<()> {
        if entries.len() < SCAN_KEYS && entries.iter().any(|(k, _)| k.name == key.name) {
            return Err(Bail);
        }
        entries.push((key, value));
        Ok(())
    }

    /// Checks the keys of a complete mapping of more than [`SCAN_KEYS`] entries for
    /// duplicates: their hashes are sorted, and keys of equal hashes compared by name.
    fn close_keys(&self, entries: &[(Key, Node)]) -> R<()> {
        if entries.len() <= SCAN_KEYS {
            return Ok(());
        }
        let mut hashed: Vec<(u64, usize)> = entries
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (self.hasher.hash_one(k.name.as_str()), i))
            .collect();
        hashed.sort_unstable();
        for run in hashed.chunk_by(|a, b| a.0 == b.0).filter(|run| run.len() > 1) {
            for (n, &(_, i)) in run.iter().enumerate() {
                if run[n + 1..]
                    .iter()
                    .any(|&(_, j)| entries[i].0.name == entries[j].0.name)
                {
                    return Err(Bail);
                }
            }
        }
        Ok(())
    }

    /// A block list whose first entry is on `first`. An indentless list (the value of a key,
    /// its `-` in the key's column) spans from its first entry's content, as the full parser
    /// has it; others from their first `-`.
    fn list(&mut self, first: Line, indentless: bool) -> R<(Node, Option<Line>)> {
        self.open()?;
        let col = first.indent;
        let mut items = Vec::new();
        let mut line = first;
        let mut start = None;
        let mut end = 0;
        let next = loop {
            let dash = line.content;
            if self.byte(dash + 1) != b' ' {
                return Err(Bail);
            }
            let c = self.skip_spaces(dash + 1);
            if matches!(self.byte(c), b'\n' | b'#') || self.is_entry(c) {
                return Err(Bail);
            }
            let first_at = *start.get_or_insert(if indentless { c } else { dash });
            end = end.max(first_at);
            let (item, next) = if self.is_key(c)? {
                self.mapping(c, c - line.start)?
            } else {
                let (item, e) = self.inline(c, Ctx::Block)?;
                let below = self.rest_of_line(e)?;
                (item, self.content_line(below)?)
            };
            end = end.max(item.span.end as usize);
            items.push(item);
            match next {
                Some(l) if l.indent == col && self.is_entry(l.content) => line = l,
                Some(l) if l.indent < col || (indentless && l.indent == col) => break Some(l),
                None => break None,
                Some(_) => return Err(Bail),
            }
        };
        self.depth -= 1;
        let node = Node {
            span: self.span(start.unwrap_or(first.content), end),
            value: Value::Seq(items),
        };
        Ok((node, next))
    }

    /// Whether a block mapping key (`key: ...`) is at `i`: [`Fast::key`] without reading it.
    fn is_key(&self, i: usize) -> R<bool> {
        let after = match self.byte(i) {
            b'\'' | b'"' => {
                let (_, e) = self.quoted(i)?;
                self.skip_spaces(e)
            }
            _ => {
                if self.plain_start(i).is_err() {
                    return Ok(false);
                }
                let scan = self.scan_plain(i, Ctx::Block);
                if !scan.colon {
                    return Ok(false);
                }
                scan.stop
            }
        };
        Ok(self.byte(after) == b':' && matches!(self.byte(after + 1), b' ' | b'\n'))
    }

    /// The key at `i` of a block mapping line (`key: ...`), or `None` when the line at `i` is
    /// not one.
    fn key(&self, i: usize) -> R<Option<ReadKey>> {
        let (name, end, after) = match self.byte(i) {
            b'\'' | b'"' => {
                let (name, e) = self.quoted(i)?;
                (name, e, self.skip_spaces(e))
            }
            _ => {
                if self.plain_start(i).is_err() {
                    return Ok(None);
                }
                let scan = self.scan_plain(i, Ctx::Block);
                if !scan.colon {
                    return Ok(None);
                }
                let name = self.text[i..scan.end].to_owned();
                if name == "<<" || too_large_integer(&name) {
                    // A merge key: the full parser merges. An integer key beyond 64 bits:
                    // the full parser reports it, as it does such a value.
                    return Err(Bail);
                }
                (name, scan.end, scan.stop)
            }
        };
        if self.byte(after) != b':' || !matches!(self.byte(after + 1), b' ' | b'\n') {
            return Ok(None);
        }
        if after - i > MAX_KEY_BYTES {
            return Err(Bail);
        }
        Ok(Some(ReadKey {
            key: Key {
                name,
                span: self.span(i, end),
            },
            colon: after + 1,
        }))
    }

    /// A scalar or flow collection at `i`, and the offset just past it.
    fn inline(&mut self, i: usize, ctx: Ctx) -> R<(Node, usize)> {
        match self.byte(i) {
            b'[' => self.flow_list(i),
            b'{' => self.flow_mapping(i),
            b'\'' | b'"' => {
                self.count(1)?;
                let (value, e) = self.quoted(i)?;
                Ok((
                    Node {
                        span: self.span(i, e),
                        value: Value::Str(value),
                    },
                    e,
                ))
            }
            _ => {
                self.plain_start(i)?;
                let scan = self.scan_plain(i, ctx);
                if scan.colon && ctx == Ctx::Block {
                    // `a: b: c`, an error the full parser words.
                    return Err(Bail);
                }
                self.count(1)?;
                let text = &self.text[i..scan.end];
                if too_large_integer(text) {
                    // The full parser reports it.
                    return Err(Bail);
                }
                let value = resolve_plain(text).unwrap_or_else(|| Value::Str(text.to_owned()));
                Ok((
                    Node {
                        span: self.span(i, scan.end),
                        value,
                    },
                    scan.end,
                ))
            }
        }
    }

    /// Whether a plain scalar may start at `i`: not empty, not at an indicator (`-` only
    /// before a letter, digit or `.`).
    fn plain_start(&self, i: usize) -> R<()> {
        match self.byte(i) {
            b'\n' | b' ' | b'?' | b':' | b',' | b'[' | b']' | b'{' | b'}' | b'#' | b'&' | b'*' | b'!'
            | b'|' | b'>' | b'\'' | b'"' | b'%' | b'@' | b'`' => Err(Bail),
            b'-' if !(self.byte(i + 1).is_ascii_alphanumeric() || self.byte(i + 1) == b'.') => Err(Bail),
            _ => Ok(()),
        }
    }

    /// Scans a plain scalar from `i` to the end of its line: it stops at `: ` (or `:` at the
    /// end of the line), at ` #`, and in flow collections at `,`, `[`, `]`, `{`, `}` and `:`
    /// before them.
    fn scan_plain(&self, i: usize, ctx: Ctx) -> PlainScan {
        let b = self.b;
        let mut j = i;
        let mut colon = false;
        while j < b.len() {
            let c = b[j];
            if c == b'\n' {
                break;
            }
            if c == b':' {
                let n = self.byte(j + 1);
                if n == b' '
                    || n == b'\n'
                    || (ctx == Ctx::Flow && matches!(n, b',' | b'[' | b']' | b'{' | b'}'))
                {
                    colon = true;
                    break;
                }
            }
            if c == b'#' && j > i && b[j - 1] == b' ' {
                break;
            }
            if ctx == Ctx::Flow && matches!(c, b',' | b'[' | b']' | b'{' | b'}') {
                break;
            }
            j += 1;
        }
        let mut end = j;
        while end > i && b[end - 1] == b' ' {
            end -= 1;
        }
        PlainScan { end, stop: j, colon }
    }

    /// A quoted scalar on one line at `i`: its value and the offset past its closing quote.
    /// Double quotes with escapes end the fast path.
    fn quoted(&self, i: usize) -> R<(String, usize)> {
        let quote = self.b[i];
        let mut value = String::new();
        let mut from = i + 1;
        let mut j = from;
        loop {
            match self.b.get(j) {
                None | Some(b'\n') | Some(b'\\') if quote == b'"' => return Err(Bail),
                None | Some(b'\n') => return Err(Bail),
                Some(&c) if c == quote => {
                    if quote == b'\'' && self.byte(j + 1) == b'\'' {
                        value.push_str(&self.text[from..=j]);
                        j += 2;
                        from = j;
                        continue;
                    }
                    value.push_str(&self.text[from..j]);
                    return Ok((value, j + 1));
                }
                Some(_) => j += 1,
            }
        }
    }

    /// A flow list on one line, `[` at `i`; returns it and the offset past its `]`.
    fn flow_list(&mut self, i: usize) -> R<(Node, usize)> {
        self.open()?;
        let mut items = Vec::new();
        let mut j = self.skip_spaces(i + 1);
        if self.byte(j) != b']' {
            loop {
                let (item, e) = self.flow_item(j)?;
                items.push(item);
                j = self.skip_spaces(e);
                match self.byte(j) {
                    b',' => {
                        j = self.skip_spaces(j + 1);
                        if self.byte(j) == b']' {
                            return Err(Bail);
                        }
                    }
                    b']' => break,
                    _ => return Err(Bail),
                }
            }
        }
        self.depth -= 1;
        let node = Node {
            span: self.span(i, j + 1),
            value: Value::Seq(items),
        };
        Ok((node, j + 1))
    }

    /// A flow mapping on one line, `{` at `i`; returns it and the offset past its `}`.
    fn flow_mapping(&mut self, i: usize) -> R<(Node, usize)> {
        self.open()?;
        let mut entries = Vec::new();
        let mut j = self.skip_spaces(i + 1);
        if self.byte(j) != b'}' {
            loop {
                let (name, key_end, after) = match self.byte(j) {
                    b'\'' | b'"' => {
                        let (name, e) = self.quoted(j)?;
                        (name, e, self.skip_spaces(e))
                    }
                    _ => {
                        self.plain_start(j)?;
                        let scan = self.scan_plain(j, Ctx::Flow);
                        let name = self.text[j..scan.end].to_owned();
                        if name == "<<" || too_large_integer(&name) {
                            return Err(Bail);
                        }
                        (name, scan.end, scan.stop)
                    }
                };
                if self.byte(after) != b':' || self.byte(after + 1) != b' ' || after - j > MAX_KEY_BYTES {
                    return Err(Bail);
                }
                self.count(1)?;
                let key = Key {
                    name,
                    span: self.span(j, key_end),
                };
                let v = self.skip_spaces(after + 1);
                if matches!(self.byte(v), b',' | b'}' | b'\n' | b'#') {
                    return Err(Bail);
                }
                let (value, e) = self.flow_item(v)?;
                self.insert(&mut entries, key, value)?;
                j = self.skip_spaces(e);
                match self.byte(j) {
                    b',' => {
                        j = self.skip_spaces(j + 1);
                        if self.byte(j) == b'}' {
                            return Err(Bail);
                        }
                    }
                    b'}' => break,
                    _ => return Err(Bail),
                }
            }
        }
        self.close_keys(&entries)?;
        self.depth -= 1;
        let node = Node {
            span: self.span(i, j + 1),
            value: Value::Map(entries),
        };
        Ok((node, j + 1))
    }

    /// An entry of a flow collection at `i`: a scalar or a nested flow collection, and the
    /// offset past it. A plain scalar followed by `:` (a one-pair mapping) ends the fast path.
    fn flow_item(&mut self, i: usize) -> R<(Node, usize)> {
        if matches!(self.byte(i), b'\n' | b'#' | b',') {
            return Err(Bail);
        }
        let (node, e) = self.inline(i, Ctx::Flow)?;
        if self.byte(self.skip_spaces(e)) == b':' {
            return Err(Bail);
        }
        Ok((node, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: FileId = FileId(7);

    /// The fast path, when it answers, answers what the full parser does: the same tree, and
    /// no problem. Returns whether it answered.
    fn agrees(src: &str) -> bool {
        let limits = Limits::default();
        let Some(fast) = parse(F, src, &limits) else {
            return false;
        };
        let (full, diags) = super::super::yaml::parse_full(F, src, &limits);
        assert!(
            diags.is_empty(),
            "fast path read {src:?}, which has problems: {diags:?}"
        );
        let full = full.unwrap_or_else(|| panic!("fast path read {src:?}, which does not parse"));
        assert_eq!(
            format!("{fast:?}"),
            format!("{full:?}"),
            "trees differ for {src:?}"
        );
        true
    }

    const SNIPPETS: &[&str] = &[
        "",
        "# only a comment\n\n",
        "a: b\n",
        "a: b",
        "a:\nb: 1\n",
        "a:   \n\n",
        "a:\n  # c\nb: 1 # x\n",
        "a: # c\n  b: 1\n",
        "a: # c\nb: 2\n",
        "a: {x: 1, y: [1, 2]}\nc:\n- 1\n- to: x\n  if: y\n",
        "s:\n  - to: a\n    if: b\n  - c\n\n# end\n",
        "k: 'it''s' \nq: \"x y\"  # c\n",
        "k: {a: 'x', \"b\": 2}\n",
        "- a\n- b: 1\n  c:\n",
        "x: [a, {b: c}]\n",
        "x: []\ny: {}\nz: [ ]\nw: { }\n",
        "key with spaces: v\n\"quoted key\": q\n'single': s\n",
        "200: ok\n0x1F: hex\ntrue: t\n~: n\n1.50: f\n-1: neg\n",
        "no: NO\nyes: yes\non: on\nzip: 007\nneg: -01\nmode: 0o755\nf: 1.5\nexp: 1e3\ndot: .5\nn: ~\nnull: null\n",
        "big: 9223372036854775807\nbigger: 9223372036854775808\ninf: -.inf\nnan: .nan\nq: \"12\"\ns: 'true'\n",
        "url: http://example.com:8080/x?y=1#frag\nhash: a#b\ncolon: a:b\n",
        "set: {$.n: =payload.n + 1, $.m: '=\"x\" + y'}\n",
        "a:\n  b:\n    c:\n      - d\n      - e: f\n        g: [h, i]\n  j: k\n",
        "flow: f\nsteps:\n  one:\n    set: {$.n: =payload.n + 1}\n    next: two\n  two:\n    set: {$.n: 1}\n",
        "a:\n- b\n- c\nd: e\n",
        "a:\n  - b\n  -  c\n",
        "-  a\n-   b:  1\n    c: 2\n",
        "a: b  \nc:    d\n",
        "é: ü\nnäme: héllo 🎉 wörld\n\"clé\": [é, 🎉]\n",
        "a: [1, 'two', \"three\", {four: 4}]\n",
        "a: {b: {c: {d: [[], [[1]]]}}}\n",
        "a: -x\nb: -.5\nc: .x\n",
        "a: 'x' # c\nb: [1] # c\n",
        "x:\n  - a\n\n\n  - b\n",
        "a: 1\n\n\nb: 2\n\n",
        "list:\n- a: 1\n  b:\n  - x\n  - y\n- c\n",
        "a  : 1\nb:\n",
        "a: {x : 1}\n",
        "\"a\" : 1\n",
        "a: b # c # d\n",
        "a: 'b # c'\n",
        "a: \"\"\nb: ''\n",
        // Outside the fast path: these must fall back (and the tests below check they do).
        "a: b: c\n",
        "a: &x 1\nb: *x\n",
        "a: !!str 1\n",
        "a: |\n  text\n",
        "a: >\n  text\n",
        "a: \"x\\ny\"\n",
        "a: b\n  c\n",
        "a: [1,\n  2]\n",
        "? a\n: b\n",
        "---\na: 1\n",
        "a: 1\n...\n",
        "%YAML 1.2\n---\na: 1\n",
        "a:\tb\n",
        "a: b\r\n",
        "a: 1\na: 2\n",
        "<<: {a: 1}\n",
        "a: [1, 2,]\n",
        "a: {b}\n",
        "a: {b: }\n",
        "a: [b: c]\n",
        "-\n  a: 1\n",
        "- - a\n",
        "a:\n  b: 1\n c: 2\n",
        "\u{FEFF}a: 1\n",
        "  a: 1\n",
        "a\n",
        "[a, b]\n",
        "a: 'x\n  y'\n",
        "a: {\"b\":1}\n",
        "a: @x\n",
        "a: `x\n",
        "9223372036854775808: v\n",
        "a: {9223372036854775808: v}\n",
        "9223372036854775807: v\n-9223372036854775808: w\n",
    ];

    #[test]
    fn snippets_agree_with_the_full_parser() {
        let mut read = 0;
        for src in SNIPPETS {
            if agrees(src) {
                read += 1;
            }
        }
        // Most of the plain ones are read by the fast path.
        assert!(read >= 35, "the fast path read only {read} snippets");
    }

    #[test]
    fn what_the_fast_path_leaves_to_the_full_parser() {
        for src in [
            "a: b: c\n",
            "a: &x 1\nb: *x\n",
            "a: |\n  text\n",
            "a: b\n  c\n",
            "a: 1\na: 2\n",
            "<<: {a: 1}\n",
            "---\na: 1\n",
            "a:\tb\n",
            "\u{FEFF}a: 1\n",
            "a: \"x\\ny\"\n",
            "9223372036854775808: v\n",
            "a: {-9223372036854775809: v}\n",
        ] {
            assert!(parse(F, src, &Limits::default()).is_none(), "{src:?}");
        }
        // Duplicates in large mappings too, in block and flow style.
        let big: String = (0..40).map(|i| format!("k{i}: {i}\n")).collect();
        assert!(agrees(&big));
        assert!(parse(F, &(big.clone() + "k7: again\n"), &Limits::default()).is_none());
        let flow = format!(
            "m: {{{}}}\n",
            (0..40)
                .map(|i| format!("k{i}: {i}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert!(agrees(&flow));
        assert!(parse(F, &flow.replace("k39:", "k3:"), &Limits::default()).is_none());
    }

    #[test]
    fn limits_are_left_to_the_full_parser() {
        let src = "a: [1, 2, 3]\nb: [4, 5, 6]\n";
        let few = Limits {
            max_nodes: 10,
            ..Limits::default()
        };
        assert!(parse(F, src, &few).is_none());
        let shallow = Limits {
            max_depth: 1,
            ..Limits::default()
        };
        assert!(parse(F, src, &shallow).is_none());
        let deep = "a: ".to_string() + &"[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1) + "\n";
        assert!(parse(F, &deep, &Limits::default()).is_none());
        assert!(agrees(
            &("a: ".to_string() + &"[".repeat(10) + &"]".repeat(10) + "\n")
        ));
    }

    /// Flows shaped like the benchmark's (W6's chain of `set` steps, W8's mix) take the fast
    /// path: a change that sent them to the full parser would cost several times the time.
    #[test]
    fn benchmark_shaped_flows_take_the_fast_path() {
        let mut chain = String::from("# A chain.\nflow: w6-build\ndescription: a long chain.\nsteps:\n");
        for i in 0..50 {
            chain += &format!(
                "  s{i:05}:\n    set: {{$.n: =payload.n + 1}}\n    next: s{:05}\n",
                i + 1
            );
        }
        chain += "  s00050:\n    set: {$.n: =payload.n + 1}\n";
        assert!(agrees(&chain));
        let mix = "flow: w8-lint-0000\ndescription: W8 lint benchmark flow 0, 45 steps.\n\ninput:\n  schema:\n    \
                   type: object\n    required: [n, items]\n    properties:\n      n: {type: integer}\n      \
                   items:\n        type: array\n        items:\n          type: object\n          \
                   properties:\n            id: {type: integer}\n\ndefaults:\n  timeout: 30s\n\nagents:\n  \
                   doubler:\n    kind: transform\n    result: {id: =input.id, v: =input.v * 2}\n  scorer:\n    \
                   kind: transform\n    result:\n      score: =input.n % 100\n      \
                   band: '=input.n > 50 ? \"high\" : \"low\"'\n\nsteps:\n  s000:\n    \
                   set: {$.n: =payload.n + 1}\n    next: s001\n  s001:\n    description: counts the items\n    \
                   set:\n      $.n: =payload.n + size(payload.items)\n      $.label: '=\"step 1\"'\n    \
                   next: s002\n  s002:\n    foreach: $.items\n    concurrency: 3\n    agent: doubler\n    \
                   input: {$.id: =item.id, $.v: =item.v + 2}\n    select: $.v\n    output: {$.doubled_2: $}\n    \
                   next: s003\n  s003:\n    agent: scorer\n    input: {$.n: $.n}\n    \
                   output: {$.score: $.score, $.band: $.band}\n    next:\n      - to: s004\n        \
                   if: result.score >= 50 && input.n > 0\n      - to: s004\n  s004:\n    \
                   set:\n      $.last_score: =steps.s003.result.score\n";
        assert!(agrees(mix));
    }

    /// Every YAML file of the repository (flows, examples, fixtures).
    fn repository_files() -> Vec<(String, String)> {
        fn walk(dir: &std::path::Path, out: &mut Vec<(String, String)>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            for p in paths {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if name.starts_with('.') || name == "target" || name == "generated" {
                    continue;
                }
                if p.is_dir() {
                    walk(&p, out);
                } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
                    && let Ok(text) = std::fs::read_to_string(&p)
                {
                    out.push((p.display().to_string(), text));
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut out = Vec::new();
        for dir in ["flows", "examples", "tests/fixtures"] {
            walk(&root.join(dir), &mut out);
        }
        out
    }

    #[test]
    fn repository_files_agree_with_the_full_parser() {
        let files = repository_files();
        assert!(files.len() > 50, "found {} YAML files", files.len());
        let read = files.iter().filter(|(_, text)| agrees(text)).count();
        assert!(
            read * 2 > files.len(),
            "the fast path read only {read} of {} files",
            files.len()
        );
    }

    /// Both ways of reading a file, the fast path first (`parse`) and the full parser alone,
    /// give the same answer for `src`: both accept it, with the same tree, or both refuse it.
    /// Returns whether it was accepted.
    fn both_paths(src: &str) -> bool {
        let limits = Limits::default();
        let via_parse = super::super::yaml::parse(F, src.as_bytes(), &limits);
        let (full, diags) = super::super::yaml::parse_full(F, src, &limits);
        let full = if diags.is_empty() { full } else { None };
        match (&via_parse, &full) {
            (Ok(a), Some(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}"), "trees differ for {src:?}"),
            (Err(_), None) => {}
            _ => panic!(
                "{src:?}: read as {:?} first, as {:?} by the full parser alone",
                via_parse.map(|_| "accepted"),
                full.map(|_| "accepted")
            ),
        }
        agrees(src);
        via_parse.is_ok()
    }

    /// `src` is accepted exactly when `valid`, the same by both paths.
    fn judged(src: &str, valid: bool) {
        assert_eq!(
            both_paths(src),
            valid,
            "{src:?} should be {}",
            if valid { "accepted" } else { "refused" }
        );
    }

    /// A mapping nested `depth` levels (two spaces each) whose last key is `last`, at column
    /// `2 * depth`; `rest` follows its `:`, and a sibling key `z: 1` follows on the next line.
    fn nested(depth: usize, last: &str, rest: &str) -> String {
        let mut src = String::new();
        for d in 0..depth {
            src += &format!("{}k{d}:\n", "  ".repeat(d));
        }
        let pad = "  ".repeat(depth);
        format!("{src}{pad}{last}{rest}\n{pad}z: 1\n")
    }

    /// Implicit keys (YAML 1.2 production [154]) of about 1,024 characters, with spaces before
    /// their `:`, plain and quoted, in block and flow mappings, one and two bytes a character:
    /// a key and its spaces of at most 1,024 characters are accepted, longer ones refused (in
    /// flow mappings too, where the parser keeps the same bound), by both paths.
    #[test]
    fn long_keys_are_judged_alike_by_both_paths() {
        for chars in 1019..=1026 {
            for spaces in 0..=3 {
                for (open, close) in [("", ""), ("'", "'"), ("\"", "\"")] {
                    for ch in ["k", "é"] {
                        let inner = chars - open.len() - close.len();
                        let key = format!("{open}{}{close}", ch.repeat(inner));
                        let sp = " ".repeat(spaces);
                        let valid = chars + spaces <= MAX_KEY_BYTES;
                        judged(&format!("{key}{sp}: v\n"), valid);
                        judged(&nested(1, &key, &format!("{sp}: v")), valid);
                        judged(&format!("m: {{{key}{sp}: v}}\n"), valid);
                        judged(&format!("- {key}{sp}: v\n"), valid);
                    }
                }
            }
        }
    }

    /// The continuation lines of multi-line quoted and plain scalars and of flow collections,
    /// at every column around the block that holds them: YAML 1.2 wants them indented past it
    /// (`s-flow-line-prefix(n)`), so `b: "one` in column 2 continues from column 3 on.
    #[test]
    fn continuation_lines_are_judged_alike_by_both_paths() {
        for depth in 0..3 {
            let col = 2 * depth;
            for spaces in 0..=col + 2 {
                let sp = " ".repeat(spaces);
                let valid = spaces > col;
                for value in [
                    format!("\"one\n{sp}two\""),
                    format!("'one\n{sp}two'"),
                    format!("[1,\n{sp}2]"),
                    format!("{{x: 1,\n{sp}y: 2}}"),
                ] {
                    judged(&nested(depth, "b", &format!(": {value}")), valid);
                    // As a list entry: past the `-`.
                    let pad = "  ".repeat(depth);
                    let mut list = String::new();
                    for d in 0..depth {
                        list += &format!("{}k{d}:\n", "  ".repeat(d));
                    }
                    judged(&format!("{list}{pad}- {value}\n{pad}- z\n"), valid);
                }
                // A plain scalar's continuation: at the key's column it is a key without `:`.
                judged(&nested(depth, "b", &format!(": one\n{sp}two")), valid);
            }
        }
    }

    /// Lines that start with a tab after a block scalar's header or content: a tab past the
    /// scalar's indentation is content, one before it is neither content nor indentation
    /// (YAML test suite `Y79Y`), at the top and nested alike; after a comment line, blank
    /// lines may hold tabs.
    #[test]
    fn tabs_after_block_scalars_are_judged_alike_by_both_paths() {
        for depth in 0..3 {
            let col = 2 * depth;
            let pad = " ".repeat(col);
            for header in ["|", ">", "|-", "|+"] {
                for spaces in 0..=col + 3 {
                    let sp = " ".repeat(spaces);
                    for after in ["", "x"] {
                        // The first line after the header: content from column `col + 1` on.
                        let first = format!(": {header}\n{sp}\t{after}");
                        judged(&nested(depth, "b", &first), spaces > col);
                        // After content in column `col + 2`.
                        let later = format!(": {header}\n{pad}  x\n{sp}\t{after}");
                        judged(&nested(depth, "b", &later), spaces >= col + 2);
                    }
                    // After a comment line that ends the scalar, a blank line may hold a tab.
                    let comment = format!(": {header}\n{pad}  x\n{pad}# note\n{sp}\t");
                    judged(&nested(depth, "b", &comment), true);
                }
            }
        }
        // The suite's own cases.
        judged("foo: |\n\t\nbar: 1\n", false);
        judged("foo: |\n \t\nbar: 1\n", true);
        judged("- >\n \t\n detected\n", true);
    }

    /// Deterministic xorshift.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            let x = &mut self.0;
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            *x
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// `text` changed in one to three places: a character inserted, removed or replaced by
    /// YAML punctuation, a space or a line break; a line duplicated, dropped or re-indented.
    fn mutate(text: &str, rng: &mut Rng) -> String {
        const ALPHABET: &[u8] = b" :-#'\"[]{},\n&*!|>?%@`~.=$0aZ\t\\";
        let mut b = text.as_bytes().to_vec();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(b.len() + 1);
            match rng.below(7) {
                0 => b.insert(at, ALPHABET[rng.below(ALPHABET.len())]),
                1 if at < b.len() => {
                    b.remove(at);
                }
                2 if at < b.len() => b[at] = ALPHABET[rng.below(ALPHABET.len())],
                3 => {
                    // Re-indent a line by one or two spaces.
                    let start = b[..at].iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
                    if rng.below(2) == 0 {
                        let spaces = 1 + rng.below(2);
                        b.splice(start..start, std::iter::repeat_n(b' ', spaces));
                    } else if b.get(start) == Some(&b' ') {
                        b.remove(start);
                    }
                }
                4 | 5 => {
                    // Duplicate or drop a line.
                    let start = b[..at].iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
                    let end = b[at..]
                        .iter()
                        .position(|&c| c == b'\n')
                        .map_or(b.len(), |i| at + i + 1);
                    if rng.below(2) == 0 {
                        let line = b[start..end].to_vec();
                        b.splice(end..end, line);
                    } else {
                        b.drain(start..end);
                    }
                }
                _ => b.insert(at, b' '),
            }
        }
        String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    #[test]
    fn mutated_files_agree_with_the_full_parser() {
        let mut bases: Vec<String> = SNIPPETS.iter().map(|s| s.to_string()).collect();
        bases.extend(repository_files().into_iter().map(|(_, text)| text));
        let mut rng = Rng(0x5eed_1234_abcd_0001);
        let (mut tried, mut read) = (0, 0);
        for base in &bases {
            for _ in 0..40 {
                let text = mutate(base, &mut rng);
                tried += 1;
                if agrees(&text) {
                    read += 1;
                }
            }
        }
        // The mutations keep many files readable: the comparison is not empty.
        assert!(
            read * 10 > tried,
            "the fast path read {read} of {tried} mutated files"
        );
    }
}
