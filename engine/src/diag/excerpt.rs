//! The part of a file a human report shows, with long lines cut around the labels.
//!
//! miette draws a snippet from whole lines and pads its label lines to the label's column with
//! a width argument, which cannot exceed 65,535: a minified or generated flow (a whole flow on
//! one line, a long description) would panic the renderer, and a line of a few thousand
//! characters would be unreadable anyway. An [`Excerpt`] is the text miette is given instead:
//! the lines from the first label's line to the last one's (with their context lines; miette
//! may show any line between them), where a line longer than [`LONG_LINE`] characters keeps
//! only [`KEEP`] characters either side of each label's start and end, joined by `…`. Label
//! spans are mapped into the excerpt; line numbers and the header's column stay those of the
//! file, and so do the line counts miette decides from which snippets to join.
//!
//! It knows spans and lines, nothing of diagnostics' meaning.

use miette::{MietteError, MietteSpanContents, SourceCode, SourceSpan, SpanContents};

use crate::source::SourceFile;

/// Lines longer than this many characters are cut.
pub(super) const LONG_LINE: usize = 160;
/// Characters kept either side of a label's start and of its end on a cut line.
pub(super) const KEEP: usize = 40;
/// Stands for the characters cut out of a line.
const ELLIPSIS: &str = "…";

/// The text of the lines a report shows, and where each of them came from.
pub(super) struct Excerpt<'a> {
    file: &'a SourceFile,
    text: String,
    /// The 0-based line of the file the excerpt starts at.
    first_line: usize,
    lines: Vec<Line>,
}

/// One line of the excerpt: where it starts in the file and in the excerpt, and the pieces of
/// its content that were kept.
struct Line {
    real_start: usize,
    virt_start: usize,
    /// Kept ranges of the file, in order, each with its offset in the excerpt.
    pieces: Vec<Piece>,
    /// Where the line's content ends (before its `\n` or `\r\n`), in the file and the excerpt.
    real_end: usize,
    virt_end: usize,
}

#[derive(Clone, Copy)]
struct Piece {
    from: usize,
    to: usize,
    virt: usize,
}

impl<'a> Excerpt<'a> {
    /// The excerpt showing `spans` (byte ranges of `file`, clamped to its text and to character
    /// boundaries) with `context` lines before and after each.
    pub(super) fn new(file: &'a SourceFile, spans: &[(usize, usize)], context: usize) -> Self {
        let last = file.line_count() - 1;
        let shown: Vec<(usize, usize)> = spans
            .iter()
            .map(|&(s, e)| {
                let (a, b) = (file.line_index(s), file.line_index(e));
                (a.saturating_sub(context), (b + context).min(last))
            })
            .collect();
        let first_line = shown.iter().map(|r| r.0).min().unwrap_or(0);
        let last_line = shown.iter().map(|r| r.1).max().unwrap_or(0);
        let mut excerpt = Excerpt {
            file,
            text: String::new(),
            first_line,
            lines: Vec::with_capacity(last_line + 1 - first_line),
        };
        for n in first_line..=last_line {
            excerpt.push_line(n, spans);
        }
        excerpt
    }

    fn push_line(&mut self, n: usize, spans: &[(usize, usize)]) {
        let text = &self.file.text;
        let (start, next) = self.file.line_bounds(n);
        let mut end = next;
        if text[start..end].ends_with('\n') {
            end -= 1;
        }
        if text[start..end].ends_with('\r') {
            end -= 1;
        }
        let ranges = if text[start..end].chars().nth(LONG_LINE).is_none() {
            vec![(start, end)]
        } else {
            kept_ranges(text, start, end, spans)
        };
        let virt_start = self.text.len();
        let mut pieces = Vec::with_capacity(ranges.len());
        let mut at = start;
        for (from, to) in ranges {
            if from > at {
                self.text.push_str(ELLIPSIS);
            }
            pieces.push(Piece {
                from,
                to,
                virt: self.text.len(),
            });
            self.text.push_str(&text[from..to]);
            at = to;
        }
        if at < end {
            self.text.push_str(ELLIPSIS);
        }
        let virt_end = self.text.len();
        self.text.push_str(&text[end..next]);
        self.lines.push(Line {
            real_start: start,
            virt_start,
            pieces,
            real_end: end,
            virt_end,
        });
    }

    /// Where a byte offset of the file is in the excerpt: a cut-out offset goes to the `…` that
    /// stands for it, an offset outside the excerpt's lines to its nearest end.
    pub(super) fn to_virtual(&self, real: usize) -> usize {
        let n = self.file.line_index(real);
        let Some(line) = n.checked_sub(self.first_line).and_then(|i| self.lines.get(i)) else {
            return if n < self.first_line { 0 } else { self.text.len() };
        };
        if real >= line.real_end {
            return line.virt_end + (real - line.real_end);
        }
        let mut virt = line.virt_start;
        for p in &line.pieces {
            if real < p.from {
                return virt;
            }
            if real <= p.to {
                return p.virt + (real - p.from);
            }
            virt = p.virt + (p.to - p.from);
        }
        virt
    }

    /// Where an offset of the excerpt is in the file (the inverse of [`Excerpt::to_virtual`];
    /// an offset inside a `…` goes to the first character it stands for).
    fn to_real(&self, virt: usize) -> usize {
        let i = self.lines.partition_point(|l| l.virt_start <= virt);
        let Some(line) = i.checked_sub(1).and_then(|i| self.lines.get(i)) else {
            return self.lines.first().map_or(0, |l| l.real_start);
        };
        if virt >= line.virt_end {
            return line.real_end + (virt - line.virt_end);
        }
        let mut real = line.real_start;
        for p in &line.pieces {
            if virt < p.virt {
                return real;
            }
            if virt <= p.virt + (p.to - p.from) {
                return p.from + (virt - p.virt);
            }
            real = p.to;
        }
        real
    }
}

/// The ranges of the line `start..end` that a cut keeps: [`KEEP`] characters either side of
/// every span start and end on it, a span's whole text when it is short, and the line's start
/// when nothing else is on it (a context line, the middle of a long span); overlapping and
/// nearly touching ranges are joined.
fn kept_ranges(text: &str, start: usize, end: usize, spans: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let back = |at: usize, n: usize| {
        text[start..at]
            .char_indices()
            .rev()
            .nth(n.saturating_sub(1))
            .map_or(start, |(i, _)| start + i)
    };
    let fwd = |at: usize, n: usize| text[at..end].char_indices().nth(n).map_or(end, |(i, _)| at + i);
    let mut ranges = Vec::new();
    for &(s, e) in spans {
        let on_line = |p: usize| start <= p && p <= end;
        if on_line(s) && on_line(e) && text[s..e].chars().nth(2 * KEEP).is_none() {
            ranges.push((back(s, KEEP), fwd(e, KEEP)));
            continue;
        }
        for p in [s, e].into_iter().filter(|&p| on_line(p)) {
            ranges.push((back(p, KEEP), fwd(p, KEEP)));
        }
    }
    if ranges.is_empty() {
        ranges.push((start, fwd(start, 2 * KEEP)));
    }
    ranges.sort_unstable();
    let mut joined: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (from, to) in ranges {
        match joined.last_mut() {
            // A gap of a few characters is not worth an ellipsis.
            Some(last) if from <= fwd(last.1, 4) => last.1 = last.1.max(to),
            _ => joined.push((from, to)),
        }
    }
    joined
}

impl SourceCode for Excerpt<'_> {
    fn read_span<'b>(
        &'b self,
        span: &SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn SpanContents<'b> + 'b>, MietteError> {
        let inner = self
            .text
            .as_str()
            .read_span(span, context_lines_before, context_lines_after)?;
        // The header shows the span's start as the file counts it: line and character column.
        let column = if context_lines_before == 0 {
            self.file.line_col(self.to_real(span.offset())).1 - 1
        } else {
            inner.column()
        };
        Ok(Box::new(MietteSpanContents::new_named(
            self.file.name.clone(),
            inner.data(),
            *inner.span(),
            self.first_line + inner.line(),
            column,
            // miette counts the lines from the start of its text; ours starts at `first_line`.
            self.first_line + inner.line_count(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> SourceFile {
        SourceFile::new("f.yaml", None, text)
    }

    #[test]
    fn short_lines_are_kept_whole() {
        let f = file("a: 1\nb: 2\nc: 3\nd: 4\ne: 5\nf: 6\n");
        // Spans on lines 2 and 5 (0-based 1 and 4), one context line each.
        let b = f.text.find("b:").expect("b");
        let e = f.text.find("e:").expect("e");
        let x = Excerpt::new(&f, &[(b, b + 1), (e, e + 1)], 1);
        assert_eq!(x.text, "a: 1\nb: 2\nc: 3\nd: 4\ne: 5\nf: 6\n");
        let x = Excerpt::new(&f, &[(b, b + 1), (b, b + 1)], 0);
        assert_eq!(x.text, "b: 2\n");
        assert_eq!(x.first_line, 1);
        assert_eq!(x.to_virtual(b), 0);
        let x = Excerpt::new(&f, &[(e, e + 1)], 0);
        assert_eq!(x.text, "e: 5\n");
        assert_eq!(x.to_virtual(e), 0);
        assert_eq!(x.to_real(0), e);
    }

    #[test]
    fn a_long_line_keeps_the_text_around_each_label() {
        let line = format!(
            "k: \"{}X{}Y{}\"",
            "a".repeat(100),
            "b".repeat(200),
            "c".repeat(100)
        );
        let f = file(&format!("{line}\nnext: 1\n"));
        let xs = f.text.find('X').expect("X");
        let ys = f.text.find('Y').expect("Y");
        let x = Excerpt::new(&f, &[(xs, xs + 1), (ys, ys + 1)], 1);
        let first = x.text.lines().next().expect("a line");
        assert_eq!(
            first,
            format!(
                "…{}X{}…{}Y{}…",
                "a".repeat(40),
                "b".repeat(40),
                "b".repeat(40),
                "c".repeat(40)
            )
        );
        assert!(x.text.ends_with("\nnext: 1\n"), "{}", x.text);
        for real in [xs, xs + 1, ys, ys + 1] {
            let v = x.to_virtual(real);
            assert_eq!(&x.text[v..v + 1], &f.text[real..real + 1]);
            assert_eq!(x.to_real(v), real);
        }
        // An offset cut out goes to its ellipsis, and back to the first character cut.
        let v = x.to_virtual(xs + 100);
        assert_eq!(&x.text[v..v + ELLIPSIS.len()], ELLIPSIS);
        assert_eq!(x.to_real(v), xs + 1 + KEEP);
    }

    #[test]
    fn a_long_span_keeps_its_start_and_end() {
        let line = format!("k: {}", "é".repeat(1000));
        let f = file(&line);
        let start = 3;
        let x = Excerpt::new(&f, &[(start, f.text.len())], 1);
        assert_eq!(x.text, format!("k: {}…{}", "é".repeat(40), "é".repeat(40)));
        assert_eq!(x.to_virtual(f.text.len()), x.text.len());
    }

    #[test]
    fn crlf_lines_keep_their_ends() {
        let f = file(&format!("a: 1\r\nb: {}\r\nc: 3\r\n", "x".repeat(500)));
        let x = Excerpt::new(&f, &[(0, 1)], 1);
        assert_eq!(x.text, format!("a: 1\r\nb: {}…\r\n", "x".repeat(2 * KEEP - 3)));
    }
}
