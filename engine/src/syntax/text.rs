//! Text helpers of the full parser: byte offsets from the parser's character offsets, line
//! numbers, and what YAML 1.2 allows after a block scalar.

/// The offset of a tab that starts a line after a block scalar ending at `end`, before the
/// next token or comment line. Those lines are indented less than the scalar's content (else
/// they would be part of it), so YAML 1.2 allows them only indentation spaces and a line break
/// (`l-chomped-empty`, `l-strip-empty`), until a comment line (`l-trail-comments`) after which
/// any blank line may follow. Such a tab is neither content nor
/// indentation: `foo: |` followed by a line holding only a tab is an error (`Y79Y` in the YAML
/// test suite), and one level in as much as at the top. The parser checks this only at column
/// 0, so the builder checks the rest.
pub(super) fn tab_after_block_scalar(text: &str, end: usize) -> Option<usize> {
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
pub(super) fn trim_end(text: &str, start: usize, end: usize) -> usize {
    let bytes = text.as_bytes();
    let mut end = end.min(bytes.len());
    while end > start && matches!(bytes[end - 1], b' ' | b'\t' | b'\r' | b'\n') {
        end -= 1;
    }
    end
}

/// Line numbers of byte offsets, from an index of line starts built on first use.
#[derive(Default)]
pub(super) struct Lines {
    starts: Vec<usize>,
}

impl Lines {
    /// 1-based line of a byte offset.
    pub(super) fn line_of(&mut self, text: &str, offset: usize) -> usize {
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
pub(super) struct CharCursor {
    chars: usize,
    bytes: usize,
}

impl CharCursor {
    pub(super) fn byte_of(&mut self, text: &str, n: usize) -> usize {
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
