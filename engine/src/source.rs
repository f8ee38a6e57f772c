//! Source files, byte spans and line/column lookup.
//!
//! Every diagnostic points into a [`SourceFile`] through a [`Span`] of byte offsets. This module
//! owns the mapping from byte offsets to the 1-based line and column that users see; it knows
//! nothing of YAML or flows.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Index of a file in a [`SourceMap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FileId(pub u32);

/// A byte range in one source file. `start..end`, both byte offsets into the file's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Span {
    pub file: FileId,
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(file: FileId, start: usize, end: usize) -> Self {
        let start = u32::try_from(start).unwrap_or(u32::MAX);
        let end = u32::try_from(end).unwrap_or(u32::MAX).max(start);
        Span { file, start, end }
    }

    /// An empty span at the start of `file`, for problems that concern a whole file.
    pub fn file_start(file: FileId) -> Self {
        Span {
            file,
            start: 0,
            end: 0,
        }
    }

    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// The sub-range `start..end` (relative to this span's start), clamped to this span.
    pub fn sub(&self, start: usize, end: usize) -> Span {
        let s = (self.start as usize + start).min(self.end as usize);
        let e = (self.start as usize + end).clamp(s, self.end as usize);
        Span::new(self.file, s, e)
    }
}

/// One loaded file: its display path and its text.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// The path as given (or relative to the working directory), used in diagnostics.
    pub name: String,
    /// The canonical path on disk, when the file came from disk.
    pub path: Option<PathBuf>,
    pub text: Arc<str>,
    line_starts: Vec<usize>,
}

impl SourceFile {
    pub fn new(name: impl Into<String>, path: Option<PathBuf>, text: impl Into<Arc<str>>) -> Self {
        let text: Arc<str> = text.into();
        let mut line_starts = vec![0];
        line_starts.extend(
            text.bytes()
                .enumerate()
                .filter(|(_, b)| *b == b'\n')
                .map(|(i, _)| i + 1),
        );
        SourceFile {
            name: name.into(),
            path,
            text,
            line_starts,
        }
    }

    /// 1-based line and 1-based column (in characters) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = match self.line_starts.binary_search(&offset) {
            Ok(l) => l,
            Err(l) => l - 1,
        };
        let start = self.line_starts[line];
        let mut end = offset;
        while end > start && !self.text.is_char_boundary(end) {
            end -= 1;
        }
        let col = self.text[start..end].chars().count() + 1;
        (line + 1, col)
    }

    /// The number of lines (a final line without a newline counts; an empty text has one).
    pub fn line_count(&self) -> usize {
        self.line_starts.len()
    }

    /// The 0-based line a byte offset is on (offsets past the end are on the last line).
    pub fn line_index(&self, offset: usize) -> usize {
        match self.line_starts.binary_search(&offset.min(self.text.len())) {
            Ok(l) => l,
            Err(l) => l - 1,
        }
    }

    /// Byte offsets of a 0-based line: where it starts, and where the next one starts (the
    /// text's length for the last line), so its newline is inside.
    pub fn line_bounds(&self, line: usize) -> (usize, usize) {
        let start = self.line_starts[line.min(self.line_starts.len() - 1)];
        let next = self.line_starts.get(line + 1).copied().unwrap_or(self.text.len());
        (start, next)
    }

    /// The text of a span (empty when the span does not fall on character boundaries).
    pub fn slice(&self, span: Span) -> &str {
        self.text
            .get(span.start as usize..span.end as usize)
            .unwrap_or("")
    }

    /// Byte offset of the `n`th character (0-based); the text length when past the end.
    pub fn char_to_byte(&self, n: usize) -> usize {
        self.text
            .char_indices()
            .nth(n)
            .map(|(i, _)| i)
            .unwrap_or(self.text.len())
    }
}

/// All files loaded for one command: the flows, their imports and the flows they call.
#[derive(Debug, Default, Clone)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

impl SourceMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, file: SourceFile) -> FileId {
        self.files.push(file);
        FileId(u32::try_from(self.files.len() - 1).expect("fewer than 4 billion files"))
    }

    /// The id the next file added will get.
    pub fn next_id(&self) -> FileId {
        FileId(u32::try_from(self.files.len()).expect("fewer than 4 billion files"))
    }

    pub fn get(&self, id: FileId) -> &SourceFile {
        &self.files[id.0 as usize]
    }

    pub fn files(&self) -> impl Iterator<Item = (FileId, &SourceFile)> {
        self.files.iter().enumerate().map(|(i, f)| (FileId(i as u32), f))
    }

    /// The file already loaded from this canonical path, if any.
    pub fn find_path(&self, path: &Path) -> Option<FileId> {
        self.files()
            .find(|(_, f)| f.path.as_deref() == Some(path))
            .map(|(id, _)| id)
    }
}

/// A fast hasher for the engine's own tables keyed by short source strings (step ids, keys,
/// expression texts), where SipHash dominated the cost of lookups. Words of eight bytes are
/// mixed by multiplication (as in FxHash) from a per-process random seed, and `finish` folds
/// the high bits down, so that hashbrown's control bytes see well-mixed bits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FastHasher(u64);

const FAST_K: u64 = 0xf135_7aea_2e62_a9c5;

impl FastHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        self.0 = (self.0 ^ word).wrapping_mul(FAST_K).rotate_left(26);
    }
}

impl std::hash::Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.mix(u64::from_le_bytes(c.try_into().expect("eight bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(FAST_K);
        h ^ (h >> 32)
    }
}

/// Builds [`FastHasher`]s from one random seed per process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FastState(u64);

impl Default for FastState {
    fn default() -> Self {
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        let seed = *SEED.get_or_init(|| {
            use std::hash::BuildHasher as _;
            std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64)
        });
        FastState(seed)
    }
}

impl std::hash::BuildHasher for FastState {
    type Hasher = FastHasher;
    #[inline]
    fn build_hasher(&self) -> FastHasher {
        FastHasher(self.0)
    }
}

/// A `HashMap` with [`FastHasher`].
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, FastState>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_characters() {
        let f = SourceFile::new("a.yaml", None, "ab\nçd: x\n");
        assert_eq!(f.line_col(0), (1, 1));
        assert_eq!(f.line_col(3), (2, 1));
        // 'ç' is two bytes; the byte after it is column 2.
        assert_eq!(f.line_col(5), (2, 2));
        assert_eq!(f.line_col(100), (3, 1));
    }
}
