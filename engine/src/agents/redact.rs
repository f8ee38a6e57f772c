//! Finding secret values in text in whatever spelling a server echoes them: one matcher over
//! every value a call sent that carries a secret (the secret itself, and a whole header value
//! built from it such as `Bearer <key>`).
//!
//! Each value is kept as a few byte patterns: the value, its base64 (standard and URL-safe,
//! with and without padding), and the base64 characters that stay the same wherever the value
//! sits inside a longer encoded text (the three alignments). The matcher reads the text
//! decoding as it goes, so any mix of literal and escaped characters matches: percent-escapes
//! (`%2F`, `%2f`, or the `/` left literal as Python's `quote` leaves it), `+` for a space (and
//! a space for a `+` that a form decoding turned into one), and JSON string escapes (`\/`,
//! `\"`, `\u002f`, surrogate pairs).
//!
//! It knows nothing of HTTP or of records: callers hand it text and values.

/// Values shorter than this get no alignment-free base64 patterns: a few characters of base64
/// would match unrelated text.
const MIN_ALIGNED: usize = 12;

/// The patterns of the values remembered, and which text bytes may start a match.
#[derive(Default)]
pub struct Matcher {
    /// Longest first, so a longer spelling wins over a shorter one at the same place.
    patterns: Vec<Vec<u8>>,
    /// `starts[b]` lists the patterns whose first byte is `b`.
    starts: Vec<Vec<usize>>,
}

impl Matcher {
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Adds `value` and its encodings.
    pub fn add(&mut self, value: &str) {
        if value.is_empty() {
            return;
        }
        let bytes = value.as_bytes();
        let mut forms = vec![bytes.to_vec()];
        for url_safe in [false, true] {
            let full = base64(bytes, url_safe);
            forms.push(full.trim_end_matches('=').as_bytes().to_vec());
            forms.push(full.into_bytes());
            if bytes.len() >= MIN_ALIGNED {
                forms.extend((1..3).map(|k| aligned_base64(bytes, k, url_safe)));
            }
        }
        for f in forms {
            if !f.is_empty() && !self.patterns.contains(&f) {
                self.patterns.push(f);
            }
        }
        self.patterns.sort_by_key(|f| std::cmp::Reverse(f.len()));
        self.starts = vec![Vec::new(); 256];
        for (i, p) in self.patterns.iter().enumerate() {
            self.starts[usize::from(p[0])].push(i);
        }
    }

    /// The first place (byte range) where a remembered value is spelt in `text`, the longest
    /// spelling where several start at the same place.
    pub fn find(&self, text: &str) -> Option<(usize, usize)> {
        self.find_from(text.as_bytes(), 0)
    }

    fn find_from(&self, text: &[u8], from: usize) -> Option<(usize, usize)> {
        if self.patterns.is_empty() {
            return None;
        }
        let longest = |at: usize, candidates: &mut dyn Iterator<Item = usize>| {
            candidates
                .filter_map(|i| match_at(text, at, &self.patterns[i]))
                .max()
        };
        for (at, &b) in text.iter().enumerate().skip(from) {
            let end = if matches!(b, b'%' | b'\\' | b'+') {
                longest(at, &mut (0..self.patterns.len()))
            } else {
                let starting = &self.starts[usize::from(b)];
                if starting.is_empty() {
                    continue;
                }
                longest(at, &mut starting.iter().copied())
            };
            if let Some(end) = end {
                return Some((at, end));
            }
        }
        None
    }

    /// `text` with every spelling of a remembered value replaced by `[redacted]`.
    pub fn redact(&self, text: &str) -> String {
        let bytes = text.as_bytes();
        let mut out = Vec::with_capacity(text.len());
        let mut done = 0;
        while let Some((start, end)) = self.find_from(bytes, done) {
            out.extend_from_slice(&bytes[done..start]);
            out.extend_from_slice(b"[redacted]");
            done = end;
        }
        if done == 0 {
            return text.to_owned();
        }
        out.extend_from_slice(&bytes[done..]);
        // Matches start and end on character boundaries (patterns are whole characters, and
        // escapes are ASCII); a lossy conversion is only a guard.
        String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }
}

/// Where a spelling of `pattern` starting at `text[at]` ends, reading escapes as the bytes they
/// stand for. Where a byte could be read either way (a literal `%` that also starts an escape),
/// both readings are tried.
fn match_at(text: &[u8], at: usize, pattern: &[u8]) -> Option<usize> {
    let Some((&want, rest)) = pattern.split_first() else {
        return Some(at);
    };
    let &c = text.get(at)?;
    if c == want
        && let Some(end) = match_at(text, at + 1, rest)
    {
        return Some(end);
    }
    match c {
        // A form encoding's `+` for a space, and a `+` a form decoding read as a space.
        b'+' if want == b' ' => match_at(text, at + 1, rest),
        b' ' if want == b'+' => match_at(text, at + 1, rest),
        b'%' => {
            let byte = hex(text.get(at + 1..at + 3)?)?;
            (byte as u8 == want).then(|| match_at(text, at + 3, rest))?
        }
        b'\\' => {
            let (decoded, len) = json_escape(text, at)?;
            let mut buf = [0u8; 4];
            let decoded = decoded.encode_utf8(&mut buf).as_bytes();
            let rest = pattern.strip_prefix(decoded)?;
            match_at(text, at + len, rest)
        }
        _ => None,
    }
}

/// The character a JSON string escape at `text[at]` (a backslash) stands for, and its length.
fn json_escape(text: &[u8], at: usize) -> Option<(char, usize)> {
    let c = match *text.get(at + 1)? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let hi = hex(text.get(at + 2..at + 6)?)?;
            if !(0xD800..0xDC00).contains(&hi) {
                return Some((char::from_u32(hi)?, 6));
            }
            if text.get(at + 6..at + 8)? != b"\\u" {
                return None;
            }
            let lo = hex(text.get(at + 8..at + 12)?)?;
            if !(0xDC00..0xE000).contains(&lo) {
                return None;
            }
            return Some((
                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?,
                12,
            ));
        }
        _ => return None,
    };
    Some((c, 2))
}

/// The value of hex digits (either case).
fn hex(digits: &[u8]) -> Option<u32> {
    digits
        .iter()
        .try_fold(0u32, |n, &d| Some(n * 16 + char::from(d).to_digit(16)?))
}

/// Base64 of `bytes`: the standard alphabet with padding, or the URL-safe one (padded too;
/// callers trim).
pub fn base64(bytes: &[u8], url_safe: bool) -> String {
    let alphabet: &[u8; 64] = if url_safe {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    } else {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    };
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(chunk.get(1).copied().unwrap_or(0)) << 8)
            | u32::from(chunk.get(2).copied().unwrap_or(0));
        for i in 0..=chunk.len() {
            out.push(char::from(alphabet[(n >> (18 - 6 * i)) as usize & 63]));
        }
        for _ in chunk.len()..3 {
            out.push('=');
        }
    }
    out
}

/// The base64 characters of `bytes` that depend on nothing around them when `bytes` starts
/// `k` bytes into a 3-byte group of a longer text (`Authorization: Bearer <key>` encoded
/// whole, `user:<key>` in Basic auth).
fn aligned_base64(bytes: &[u8], k: usize, url_safe: bool) -> Vec<u8> {
    let mut shifted = vec![0u8; k];
    shifted.extend_from_slice(bytes);
    let encoded = base64(&shifted, url_safe);
    // Character j holds bits [6j, 6j + 6); the value's bits are [8k, 8(k + len)).
    let first = (8 * k).div_ceil(6);
    let end = (8 * (k + bytes.len())) / 6;
    encoded.as_bytes()[first..end].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(values: &[&str]) -> Matcher {
        let mut m = Matcher::default();
        values.iter().for_each(|v| m.add(v));
        m
    }

    #[test]
    fn every_spelling_of_a_value_is_redacted() {
        let m = matcher(&["a/b c\"d"]);
        for echoed in [
            "a/b c\"d",
            "a%2Fb%20c%22d",
            "a%2fb%20c%22d",
            "a%2Fb+c%22d",
            "a/b%20c%22d",
            "a%2Fb c\"d",
            "a\\/b c\\\"d",
            "a\\u002Fb\\u0020c\\u0022d",
            "YS9iIGMiZA==",
            "YS9iIGMiZA",
            "YS9iIGMiZA%3D%3D",
        ] {
            assert_eq!(m.redact(&format!("<{echoed}>")), "<[redacted]>", "{echoed}");
        }
        assert_eq!(m.redact("a/b c"), "a/b c");
        assert_eq!(base64(b"hi?>", false), "aGk/Pg==");
        assert_eq!(base64(b"hi?>", true), "aGk_Pg==");
    }

    #[test]
    fn a_whole_header_and_the_key_inside_longer_encoded_text_are_redacted() {
        let key = "sk-AbC/12+xyz/9876+QrSt";
        let header = format!("Bearer {key}");
        let m = matcher(&[key, &header]);
        for text in [
            base64(header.as_bytes(), false),
            base64(header.as_bytes(), true).trim_end_matches('=').to_owned(),
            base64(format!("Authorization: {header}").as_bytes(), false),
            base64(format!("u:{key}").as_bytes(), false),
            base64(format!("ab{key}").as_bytes(), true),
        ] {
            let out = m.redact(&text);
            assert!(out.contains("[redacted]"), "{text} -> {out}");
            for k in 0..3 {
                for url_safe in [false, true] {
                    let core = aligned_base64(key.as_bytes(), k, url_safe);
                    let core = std::str::from_utf8(&core).unwrap();
                    assert!(!out.contains(core), "{text} -> {out}");
                }
            }
        }
        // Python's `quote` keeps `/`; `+` is encoded.
        let quoted = "Bearer%20sk-AbC/12%2Bxyz/9876%2BQrSt";
        assert_eq!(m.redact(quoted), "[redacted]");
        assert_eq!(m.redact("key: sk-AbC/12 xyz/9876 QrSt"), "key: [redacted]");
        assert_eq!(m.redact("é sk-AbC/12+xyz/9876+QrSt é"), "é [redacted] é");
    }

    #[test]
    fn non_ascii_values_match_their_unicode_escapes() {
        let m = matcher(&["clé😀"]);
        assert_eq!(m.redact("x clé😀 y"), "x [redacted] y");
        assert_eq!(m.redact("cl\\u00e9\\ud83d\\ude00"), "[redacted]");
        assert_eq!(m.redact("cl%C3%A9%F0%9F%98%80!"), "[redacted]!");
        assert_eq!(m.redact("\\ud83d"), "\\ud83d");
    }
}
