//! Diagnostics: the one model of a problem found in a flow, its stable codes, and its renderers.
//!
//! Parsing, linting and compiling never fail on user input: they return what they could build
//! *and* every [`Diagnostic`] they found. Renderers (human, JSON, SARIF, GitHub annotations)
//! turn diagnostics into text; choosing which one and printing it is the CLI's job.

pub mod codes;
mod excerpt;
pub mod render;

use crate::source::Span;
pub use codes::{RULES, Rule};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    Error,
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// A span with a short message shown under it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub span: Span,
    pub message: String,
}

/// One problem: a stable code, a message, a label on the exact span, and help.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub rule: &'static Rule,
    pub severity: Severity,
    /// Terse, lower case, names in backticks.
    pub message: String,
    pub primary: Label,
    /// Other places involved (the other definition of a duplicate, the steps of a cycle).
    pub secondary: Vec<Label>,
    /// Finishes the thought: "did you mean `x`?", "valid keys are: ...".
    pub help: Option<String>,
}

impl Diagnostic {
    /// A diagnostic of `rule` at `span`, with the rule's default severity. The primary label
    /// repeats the message unless [`Diagnostic::label`] sets a shorter one.
    pub fn new(rule: &'static Rule, span: Span, message: impl Into<String>) -> Self {
        let message = message.into();
        Diagnostic {
            rule,
            severity: rule.severity,
            primary: Label {
                span,
                message: String::new(),
            },
            message,
            secondary: Vec::new(),
            help: None,
        }
    }

    pub fn label(mut self, message: impl Into<String>) -> Self {
        self.primary.message = message.into();
        self
    }

    pub fn with_secondary(mut self, span: Span, message: impl Into<String>) -> Self {
        self.secondary.push(Label {
            span,
            message: message.into(),
        });
        self
    }

    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn code(&self) -> &'static str {
        self.rule.code
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Sorts diagnostics into their stable order: file, position, code, message.
pub fn sort(diags: &mut [Diagnostic]) {
    diags.sort_by(|a, b| {
        (
            a.primary.span.file,
            a.primary.span.start,
            a.primary.span.end,
            a.rule.code,
            &a.message,
        )
            .cmp(&(
                b.primary.span.file,
                b.primary.span.start,
                b.primary.span.end,
                b.rule.code,
                &b.message,
            ))
    });
}

/// Collects diagnostics while a phase runs.
#[derive(Default, Debug)]
pub struct Sink {
    pub diags: Vec<Diagnostic>,
}

impl Sink {
    pub fn push(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    pub fn has_errors(&self) -> bool {
        self.diags.iter().any(Diagnostic::is_error)
    }
}

/// The closest of `candidates` to `name`, if it is close enough to be a likely typo.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = edit_distance(name, c);
        let limit = (name.chars().count().max(c.chars().count()) / 3).max(1);
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

/// Edit distance over characters: insertions, deletions, substitutions and transpositions of
/// two adjacent characters each cost 1 (the optimal string alignment distance), so `stpes` is
/// one edit from `steps`, as it is one slip of the fingers.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows of the table: two back (for transpositions), the previous one and this one.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 0..a.len() {
        cur[0] = i + 1;
        for j in 0..b.len() {
            let cost = usize::from(a[i] != b[j]);
            let mut d = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
            if i > 0 && j > 0 && a[i] == b[j - 1] && a[i - 1] == b[j] {
                d = d.min(before[j - 1] + 1);
            }
            cur[j + 1] = d;
        }
        std::mem::swap(&mut before, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// "did you mean `x`?" when a close candidate exists.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    closest(name, candidates).map(|c| format!("did you mean `{c}`?"))
}

/// The indefinite article for `word` as it is read aloud: "an `agent` step", "an `llm` agent",
/// "an `http` agent", but "a `set` step", "a `flow` agent". A word without vowels is read as
/// letters (`llm`, `http`, `sql`), so it takes "an" when the first letter's name starts with a
/// vowel sound (eff, aitch, ell, em, ...).
pub fn article(word: &str) -> &'static str {
    let w = word.trim_start_matches(['`', '"', '\'']).to_ascii_lowercase();
    let Some(first) = w.chars().next() else { return "a" };
    let spelled_out = !w.contains(['a', 'e', 'i', 'o', 'u', 'y']);
    let vowel_sound = if spelled_out {
        "aefhilmnorsx".contains(first)
    } else {
        // "a user", "a url", "a one-off": a vowel letter read as a consonant.
        const YOU: &[&str] = &["uni", "use", "usa", "usu", "uri", "url", "uti", "one", "eu"];
        "aeiou".contains(first) && !YOU.iter().any(|p| w.starts_with(p))
    };
    if vowel_sound { "an" } else { "a" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_finds_typos_only() {
        assert_eq!(
            closest("fetch_doc", ["fetch_docs", "classify"]),
            Some("fetch_docs")
        );
        assert_eq!(closest("zzz", ["fetch_docs", "classify"]), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn a_transposition_is_one_edit() {
        assert_eq!(edit_distance("stpes", "steps"), 1);
        assert_eq!(edit_distance("ab", "ba"), 1);
        assert_eq!(
            edit_distance("ca", "abc"),
            3,
            "optimal string alignment: no edits of a transposed pair"
        );
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("abc", ""), 3);
        assert_eq!(edit_distance("flow", "flow"), 0);
        assert_eq!(closest("stpes", ["flow", "steps", "start"]), Some("steps"));
        assert_eq!(closest("nxet", ["next", "on"]), Some("next"));
        assert_eq!(closest("ba", ["ab"]), Some("ab"));
        assert_eq!(closest("xy", ["ab"]), None);
    }

    #[test]
    fn articles_follow_the_sound() {
        for (word, a) in [
            ("agent", "an"),
            ("interrupt", "an"),
            ("llm", "an"),
            ("http", "an"),
            ("set", "a"),
            ("parallel", "a"),
            ("command", "a"),
            ("flow", "a"),
            ("transform", "a"),
            ("mock", "a"),
            ("fail", "a"),
            ("succeed", "a"),
            ("user", "a"),
            ("url", "a"),
            ("`agent`", "an"),
            ("", "a"),
        ] {
            assert_eq!(article(word), a, "{word}");
        }
    }
}
