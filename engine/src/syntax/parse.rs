//! The entry points: one file's bytes to a tree, by the fast path when the text is plain
//! enough for it, else by the full parser on a thread of its own.
//!
//! The size limit and UTF-8 are checked first. Most flow files never reach the full parser:
//! [`super::fast`] reads plain flow text (block collections, one-line scalars and flow
//! collections, nothing deeper than 64 levels) into the same tree several times faster, on the
//! caller's thread, and hands everything else to [`super::yaml`]. The full parser does not
//! recurse, but cloning and dropping nodes do (one level per nesting level), so it runs on a
//! thread whose stack grows with [`Limits::max_depth`].

use super::Node;
use super::limits::{Limits, too_large};
use super::yaml::parse_full;
use crate::diag::Diagnostic;
use crate::diag::codes::YAML_SYNTAX;
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
/// An empty file, or one holding only comments, gives a [`Value::Null`](super::Value::Null) node: the caller decides
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
            .spawn_scoped(scope, || parse_full(file, text, limits));
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
        None => parse_full(file, text, limits),
    }
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

#[cfg(test)]
mod tests;
