//! Safe names for files written out (`runs files --output`, `batch --files`, `collect
//! --files`, a command's `$SWITCHYARD_INPUT_DIR`): a recorded name is kept as given and made
//! safe only where it becomes a path. Nothing escapes the directory written to.

use std::collections::HashSet;

/// The longest name segment written (bytes), below every common file system's limit.
const MAX_SEGMENT: usize = 200;

/// `name` as a relative path that stays under any directory: `/`-separated segments with
/// `..`, `.`, empty segments, NUL and control characters, backslashes, and a leading `~`
/// or drive letter made harmless; each segment cut to [`MAX_SEGMENT`] bytes. Never empty:
/// a name with nothing left is `file`.
pub fn safe_relative(name: &str) -> String {
    let mut parts = Vec::new();
    for seg in name.split(['/', '\\']) {
        let mut s: String = seg
            .chars()
            .map(|c| if c.is_control() || c == ':' { '_' } else { c })
            .collect();
        let trimmed = s.trim();
        if trimmed.is_empty() || trimmed == "." {
            continue;
        }
        if trimmed.chars().all(|c| c == '.') {
            // `..` and friends name no directory of ours.
            s = "_".repeat(trimmed.len());
        } else {
            s = trimmed.to_string();
        }
        if s.starts_with('~') || s.starts_with('-') {
            s.insert(0, '_');
        }
        parts.push(cut(s));
    }
    if parts.is_empty() {
        return "file".to_string();
    }
    parts.join("/")
}

/// `id` as one path segment (a batch item's directory): as [`safe_relative`], with `/`
/// replaced too.
pub fn safe_segment(id: &str) -> String {
    let s = safe_relative(&id.replace(['/', '\\'], "_"));
    s.replace('/', "_")
}

fn cut(mut s: String) -> String {
    if s.len() > MAX_SEGMENT {
        let mut at = MAX_SEGMENT;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

/// Hands out distinct safe paths under one directory: a name already handed out (or one
/// that only differs in case, for file systems that do not tell them apart), or one that is
/// a directory of another, gets a numeric suffix before its extension (`report.pdf`,
/// `report-2.pdf`); a name under a directory that is a file already is flattened (`a/b` →
/// `a_b`).
#[derive(Default)]
pub struct Unique {
    /// Paths handed out, lowercased.
    taken: HashSet<String>,
    /// Every directory of a path handed out, lowercased.
    dirs: HashSet<String>,
}

impl Unique {
    pub fn new() -> Self {
        Self::default()
    }

    /// The safe, not yet taken relative path for `name`.
    pub fn path_for(&mut self, name: &str) -> String {
        let mut base = safe_relative(name);
        if self.under_a_file(&base.to_lowercase()) {
            // A directory of it is a file handed out already: flattened.
            base = base.replace('/', "_");
        }
        let (stem, ext) = split_ext(&base);
        let mut candidate = base.clone();
        let mut n = 1u64;
        loop {
            let lower = candidate.to_lowercase();
            if !self.taken.contains(&lower) && !self.dirs.contains(&lower) && !self.under_a_file(&lower) {
                let mut at = 0;
                while let Some(i) = lower[at..].find('/') {
                    self.dirs.insert(lower[..at + i].to_string());
                    at += i + 1;
                }
                self.taken.insert(lower);
                return candidate;
            }
            n += 1;
            candidate = format!("{stem}-{n}{ext}");
        }
    }

    /// Whether a directory of `lower` is a file handed out already.
    fn under_a_file(&self, lower: &str) -> bool {
        let mut at = 0;
        while let Some(i) = lower[at..].find('/') {
            if self.taken.contains(&lower[..at + i]) {
                return true;
            }
            at += i + 1;
        }
        false
    }
}

fn split_ext(path: &str) -> (&str, &str) {
    let base_at = path.rfind('/').map_or(0, |i| i + 1);
    match path[base_at..].rfind('.') {
        Some(i) if i > 0 => path.split_at(base_at + i),
        _ => (path, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_never_leave_the_directory() {
        assert_eq!(safe_relative("../../etc/passwd"), "__/__/etc/passwd");
        assert_eq!(safe_relative("/abs/x.png"), "abs/x.png");
        assert_eq!(safe_relative("a\\..\\b"), "a/__/b");
        assert_eq!(safe_relative("C:evil"), "C_evil");
        assert_eq!(safe_relative("~root"), "_~root");
        assert_eq!(safe_relative("x\u{0}y\n"), "x_y_");
        assert_eq!(safe_relative("./."), "file");
        assert_eq!(safe_relative(""), "file");
        assert_eq!(safe_segment("a/../b"), "a_.._b");
        assert!(safe_relative(&"é".repeat(300)).len() <= MAX_SEGMENT);
    }

    #[test]
    fn collisions_get_numeric_suffixes() {
        let mut u = Unique::new();
        assert_eq!(u.path_for("report.pdf"), "report.pdf");
        assert_eq!(u.path_for("report.pdf"), "report-2.pdf");
        assert_eq!(u.path_for("REPORT.pdf"), "REPORT-3.pdf");
        assert_eq!(u.path_for("../report.pdf"), "__/report.pdf");
        assert_eq!(u.path_for("a"), "a");
        assert_eq!(u.path_for("a/b"), "a_b");
        assert_eq!(u.path_for("d/x"), "d/x");
        assert_eq!(u.path_for("d"), "d-2");
        assert_eq!(u.path_for("noext"), "noext");
        assert_eq!(u.path_for("noext"), "noext-2");
    }
}
