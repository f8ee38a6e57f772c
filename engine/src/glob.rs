//! Glob patterns of files under a directory, as a `command` agent's `bundle:` lists them
//! (`tools/*.py`, `lib/**/*.py`, `data/?.json`, a directory for all its files): the matcher
//! of one name, and the bounded walk that expands a pattern, confined to the project root.
//!
//! `*` matches any run of characters but `/`, `?` one character, a segment `**` any number
//! of directories. Names starting with `.` match only a pattern segment that starts with `.`,
//! and `**` does not enter them (`.git`, `.venv`). Symbolic links to directories are not
//! followed; a file (or a link to one) that resolves outside the root is refused.

use std::path::{Component, Path, PathBuf};

/// The most directory entries one pattern may look at.
const MAX_VISITED: usize = 100_000;

/// The most files one pattern may match.
pub const MAX_FILES: usize = 10_000;

/// Why a pattern gave no files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GlobError {
    /// The pattern leaves the root (`None`), or a file it matched resolves outside it.
    LeavesRoot(Option<String>),
    /// Nothing matched.
    NoMatch,
    /// The walk looked at more than [`MAX_VISITED`] entries or matched more than [`MAX_FILES`].
    TooMany,
}

impl std::fmt::Display for GlobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GlobError::LeavesRoot(None) => f.write_str("leaves the project root"),
            GlobError::LeavesRoot(Some(p)) => {
                write!(f, "matches `{p}`, which resolves outside the project root")
            }
            GlobError::NoMatch => f.write_str("matches no file"),
            GlobError::TooMany => write!(
                f,
                "matches too many files (a pattern may match {MAX_FILES} files among {MAX_VISITED} entries)"
            ),
        }
    }
}

/// The files `pattern` names under `base` (canonical paths, sorted), all under `root`.
pub fn expand(root: &Path, base: &Path, pattern: &str) -> Result<Vec<PathBuf>, GlobError> {
    if Path::new(pattern).is_absolute() {
        return Err(GlobError::LeavesRoot(None));
    }
    let segments: Vec<&str> = pattern
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    let literal = segments.iter().take_while(|s| !is_wild(s)).count();
    if segments[literal..].contains(&"..") {
        return Err(GlobError::LeavesRoot(None));
    }
    let start = normalize(&base.join(segments[..literal].join("/")));
    if !start.starts_with(root) {
        return Err(GlobError::LeavesRoot(None));
    }
    let mut walk = Walk {
        root,
        visited: 0,
        files: Vec::new(),
    };
    walk.segments(&start, &segments[literal..])?;
    if walk.files.is_empty() {
        return Err(GlobError::NoMatch);
    }
    walk.files.sort();
    walk.files.dedup();
    Ok(walk.files)
}

struct Walk<'a> {
    root: &'a Path,
    visited: usize,
    files: Vec<PathBuf>,
}

impl Walk<'_> {
    /// The files under `dir` that the rest of the pattern names.
    fn segments(&mut self, dir: &Path, rest: &[&str]) -> Result<(), GlobError> {
        let Some((&seg, after)) = rest.split_first() else {
            return self.whole(dir);
        };
        if seg == "**" {
            self.segments(dir, after)?;
            for (path, name, is_dir) in self.entries(dir)? {
                if is_dir && !name.starts_with('.') {
                    self.segments(&path, rest)?;
                }
            }
            return Ok(());
        }
        for (path, name, is_dir) in self.entries(dir)? {
            if !name_matches(seg, &name) {
                continue;
            }
            if after.is_empty() {
                self.whole(&path)?;
            } else if is_dir {
                self.segments(&path, after)?;
            }
        }
        Ok(())
    }

    /// A file, or every file under a directory (hidden ones aside).
    fn whole(&mut self, path: &Path) -> Result<(), GlobError> {
        let Ok(meta) = std::fs::metadata(path) else {
            return Ok(());
        };
        if meta.is_dir() {
            for (p, name, _) in self.entries(path)? {
                if !name.starts_with('.') {
                    self.whole(&p)?;
                }
            }
            return Ok(());
        }
        if !meta.is_file() {
            return Ok(());
        }
        let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        if !canonical.starts_with(self.root) {
            return Err(GlobError::LeavesRoot(Some(path.display().to_string())));
        }
        self.files.push(canonical);
        if self.files.len() > MAX_FILES {
            return Err(GlobError::TooMany);
        }
        Ok(())
    }

    /// The entries of `dir` (path, name, whether a directory not reached by a link), sorted;
    /// none when it cannot be read.
    fn entries(&mut self, dir: &Path) -> Result<Vec<(PathBuf, String, bool)>, GlobError> {
        let Ok(read) = std::fs::read_dir(dir) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for e in read.flatten() {
            self.visited += 1;
            if self.visited > MAX_VISITED {
                return Err(GlobError::TooMany);
            }
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            out.push((e.path(), name, is_dir));
        }
        out.sort();
        Ok(out)
    }
}

fn is_wild(segment: &str) -> bool {
    segment.contains(['*', '?'])
}

/// Whether a file name matches one pattern segment (`*`, `?`, literal characters).
pub fn name_matches(pattern: &str, name: &str) -> bool {
    if name.starts_with('.') && !pattern.starts_with('.') {
        return false;
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match, backtracking to the last `*`.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// `path` with `.` and `..` resolved lexically.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_stars_and_question_marks() {
        for (p, n, ok) in [
            ("*.py", "score.py", true),
            ("*.py", "score.pyc", false),
            ("s?ore.*", "score.py", true),
            ("*", ".hidden", false),
            (".*", ".hidden", true),
            ("a*b*c", "aXbYbc", true),
            ("a*b*c", "aXbYb", false),
            ("", "", true),
        ] {
            assert_eq!(name_matches(p, n), ok, "{p} {n}");
        }
    }

    #[test]
    fn patterns_expand_under_the_root_only() {
        let root = std::env::temp_dir()
            .join(format!("switchyard-glob-{}", std::process::id()))
            .join("root");
        let _ = std::fs::remove_dir_all(&root);
        for f in [
            "tools/a.py",
            "tools/b.py",
            "tools/c.txt",
            "tools/deep/d.py",
            "tools/.venv/e.py",
        ] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "x").unwrap();
        }
        let root = root.canonicalize().unwrap();
        let names = |pattern: &str| -> Result<Vec<String>, GlobError> {
            expand(&root, &root, pattern).map(|v| {
                v.iter()
                    .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
                    .collect()
            })
        };
        assert_eq!(names("tools/*.py").unwrap(), ["tools/a.py", "tools/b.py"]);
        assert_eq!(
            names("tools/**/*.py").unwrap(),
            ["tools/a.py", "tools/b.py", "tools/deep/d.py"]
        );
        assert_eq!(names("./tools/deep").unwrap(), ["tools/deep/d.py"]);
        assert_eq!(names("tools/c.txt").unwrap(), ["tools/c.txt"]);
        assert_eq!(names("tools/*.rs"), Err(GlobError::NoMatch));
        assert_eq!(names("tools/missing.py"), Err(GlobError::NoMatch));
        assert!(matches!(names("../*"), Err(GlobError::LeavesRoot(_))));
        assert!(matches!(
            names("tools/*/../../../x"),
            Err(GlobError::LeavesRoot(_))
        ));
        assert!(matches!(names("/etc/passwd"), Err(GlobError::LeavesRoot(_))));
        let _ = std::fs::remove_dir_all(root.parent().unwrap());
    }
}
