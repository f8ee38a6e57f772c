//! Literals that look like secrets (SY503, warning): API keys, tokens and passwords belong in
//! the environment, referenced as `${env:NAME}`, never in a flow file that is committed.

use crate::diag::{Diagnostic, codes};
use crate::lint::FlowCx;
use crate::model::{Agent, AgentRef, AgentSpec, Sp};
use crate::source::Span;

/// Well-known token prefixes and the least number of token characters after them (fewer
/// than sixteen: [`find_tokens`] keeps a bit per prefix, and one for [`PEM`]).
const PREFIXES: &[(&str, usize)] = &[
    ("sk-", 20),
    ("ghp_", 30),
    ("gho_", 30),
    ("ghs_", 30),
    ("github_pat_", 30),
    ("glpat-", 20),
    ("xoxb-", 20),
    ("xoxp-", 20),
    ("AKIA", 16),
    ("AIza", 30),
    ("hf_", 30),
];
const _: () = assert!(PREFIXES.len() < 16);

/// The start of a PEM private key block.
const PEM: &str = "-----BEGIN";
/// The bit of [`PEM`] in [`find_tokens`]'s table of first bytes, after those of the prefixes.
const PEM_BIT: u16 = 1 << 15;

fn token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Byte ranges of token-looking substrings in `text`: a known prefix, not right after a token
/// character, followed by at least as many token characters as it needs, one of them a digit.
/// One pass over the text, looking closer only at bytes that start a prefix.
pub fn find_tokens(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    // Where the next match of each prefix may start: matches of one prefix do not overlap.
    let mut next = [0usize; PREFIXES.len()];
    // For each byte, the prefixes that start with it (a bit per prefix).
    let mut first = [0u16; 256];
    for (k, (prefix, _)) in PREFIXES.iter().enumerate() {
        first[usize::from(prefix.as_bytes()[0])] |= 1 << k;
    }
    first[usize::from(PEM.as_bytes()[0])] |= PEM_BIT;
    let mut pem = None;
    let mut out = Vec::new();
    for (start, &b) in bytes.iter().enumerate() {
        let mut candidates = first[usize::from(b)];
        if candidates == 0 {
            continue;
        }
        if candidates & PEM_BIT != 0 {
            candidates &= !PEM_BIT;
            if pem.is_none() && bytes[start..].starts_with(PEM.as_bytes()) {
                pem = Some(start);
            }
        }
        while candidates != 0 {
            let k = candidates.trailing_zeros() as usize;
            candidates &= candidates - 1;
            let (prefix, min) = PREFIXES[k];
            if start < next[k] || !bytes[start..].starts_with(prefix.as_bytes()) {
                continue;
            }
            next[k] = start + prefix.len();
            let before_ok = start == 0 || !token_byte(bytes[start - 1]);
            let body = &bytes[start + prefix.len()..];
            let len = body.iter().position(|&c| !token_byte(c)).unwrap_or(body.len());
            if before_ok && len >= min && body[..len].iter().any(u8::is_ascii_digit) {
                out.push((start, start + prefix.len() + len));
            }
        }
    }
    // The first PEM block only, when its line says it holds a private key.
    if let Some(i) = pem
        && text[i..]
            .lines()
            .next()
            .is_some_and(|l| l.contains("PRIVATE KEY"))
    {
        out.push((i, i + PEM.len()));
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn is_reference(s: &str) -> bool {
    let s = s.trim();
    s.is_empty()
        || (s.starts_with("${env:") && s.ends_with('}'))
        || s.starts_with("Bearer ${env:")
        || s.starts_with("Basic ${env:")
}

fn literal(out: &mut Vec<Diagnostic>, v: &Sp<String>, what: &str) {
    if is_reference(&v.value) || v.value.len() < 8 || v.value.contains("{{") {
        return;
    }
    out.push(
        Diagnostic::new(
            &codes::LITERAL_SECRET,
            v.span,
            format!("{what} is a literal; it looks like a secret"),
        )
        .label("literal secret")
        .help("keep secrets out of flow files: write `${env:NAME}` and set NAME in the environment"),
    );
}

const SENSITIVE: &[&str] = &[
    "authorization",
    "api-key",
    "x-api-key",
    "api_key",
    "token",
    "password",
    "secret",
];

fn sensitive(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    SENSITIVE.iter().any(|s| n.contains(s))
}

pub fn agent(out: &mut Vec<Diagnostic>, a: &Agent) {
    match &a.spec {
        AgentSpec::Http(h) => {
            for (k, v) in &h.headers {
                if sensitive(k) {
                    literal(out, v, &format!("header `{k}`"));
                }
            }
            if let Some(rest) = h.url.value.split("://").nth(1)
                && let Some(userinfo) = rest
                    .split('/')
                    .next()
                    .and_then(|auth| auth.rsplit_once('@'))
                    .map(|(u, _)| u)
                && userinfo.contains(':')
                && !userinfo.contains("${env:")
            {
                out.push(
                    Diagnostic::new(
                        &codes::LITERAL_SECRET,
                        h.url.span,
                        format!("the url of agent `{}` holds a password", a.name.value),
                    )
                    .label("credentials in the url")
                    .help("send credentials in a header whose value is `${env:NAME}`"),
                );
            }
        }
        AgentSpec::Command(c) => {
            for (k, v) in &c.env {
                if sensitive(k) {
                    literal(out, v, &format!("environment variable `{k}`"));
                }
            }
        }
        _ => {}
    }
}

pub fn provider(out: &mut Vec<Diagnostic>, p: &crate::model::Provider) {
    if let Some(k) = &p.api_key {
        literal(out, k, &format!("the `api_key` of provider `{}`", p.name.value));
    }
    for (k, v) in &p.headers {
        if sensitive(k) {
            literal(out, v, &format!("header `{k}`"));
        }
    }
}

/// Known token shapes anywhere in a file's text.
pub fn tokens(file: crate::source::FileId, text: &str, out: &mut Vec<Diagnostic>) {
    for (s, e) in find_tokens(text) {
        let span = Span::new(file, s, e);
        if out.iter().any(|d| {
            d.rule.code == codes::LITERAL_SECRET.code
                && d.primary.span.file == file
                && d.primary.span.start <= span.start
                && span.end <= d.primary.span.end
        }) {
            continue;
        }
        out.push(
            Diagnostic::new(&codes::LITERAL_SECRET, span, "this looks like an API token")
                .label("literal secret")
                .help("keep secrets out of flow files: write `${env:NAME}` and set NAME in the environment"),
        );
    }
}

pub fn check(cx: &FlowCx, out: &mut Vec<Diagnostic>) {
    for p in cx.flow.providers.values() {
        provider(out, p);
    }
    for a in cx.flow.agents.values() {
        agent(out, a);
    }
    for (_, _, r) in cx.agent_refs() {
        if let AgentRef::Inline(a) = r {
            agent(out, a);
        }
    }
    // Known token shapes anywhere in the file (once per file: only for the file's own flow).
    if !cx.inline {
        tokens(cx.file(), cx.text, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_known_token_shapes_only() {
        assert_eq!(find_tokens("key: sk-abc123def456ghi789jkl0mn").len(), 1);
        assert_eq!(find_tokens("AKIAABCDEFGHIJ123456").len(), 1);
        assert!(find_tokens("task-classification-step").is_empty());
        assert!(find_tokens("sk-short1").is_empty());
    }

    /// The one-pass scan finds what one search per prefix found: every non-overlapping match
    /// of each prefix, left to right.
    #[test]
    fn one_pass_matches_a_search_per_prefix() {
        fn per_prefix(text: &str) -> Vec<(usize, usize)> {
            let token_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
            let mut out = Vec::new();
            for (prefix, min) in PREFIXES {
                let mut from = 0;
                while let Some(i) = text[from..].find(prefix) {
                    let start = from + i;
                    let before_ok = text[..start].chars().next_back().is_none_or(|c| !token_char(c));
                    let body = &text[start + prefix.len()..];
                    let len = body.find(|c: char| !token_char(c)).unwrap_or(body.len());
                    if before_ok && len >= *min && body[..len].chars().any(|c| c.is_ascii_digit()) {
                        out.push((start, start + prefix.len() + len));
                    }
                    from = start + prefix.len();
                }
            }
            if let Some(i) = text.find("-----BEGIN")
                && text[i..]
                    .lines()
                    .next()
                    .is_some_and(|l| l.contains("PRIVATE KEY"))
            {
                out.push((i, i + "-----BEGIN".len()));
            }
            out.sort_unstable();
            out.dedup();
            out
        }
        let texts = [
            "AKIAKIAABCDEFGHIJ1234567 AKIAABCDEFGHIJ123456",
            "é sk-abc123def456ghi789jkl0mn, xsk-abc123def456ghi789jkl0mn ésk-abc123def456ghi789jkl0mn",
            "github_pat_0123456789abcdefghij0123456789 ghp_0123456789abcdefghij0123456789xx",
            "hf_hf_0123456789abcdefghij0123456789abc glpat-0123456789abcdefghij xoxb-xoxp-012345678901234567890",
            "AIzaAIza0123456789abcdefghij0123456789 gho_ ghs_ sk- AKIA",
            "- -----BEGIN CERTIFICATE\n-----BEGIN RSA PRIVATE KEY-----\n",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n",
        ];
        for t in texts {
            assert_eq!(find_tokens(t), per_prefix(t), "{t}");
        }
    }
}
