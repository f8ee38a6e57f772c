//! The parser's behaviour, through [`parse`] and [`parse_collecting`]: the core schema,
//! spans, keys, aliases and merges, every budget, and the errors of bad YAML.

use super::*;
use crate::diag::codes::{DUPLICATE_KEY, YAML_BUDGET};
use crate::syntax::Value;
use crate::syntax::yaml::MAX_DUPLICATES;

const F: FileId = FileId(3);

fn ok(src: &str) -> Node {
    parse(F, src.as_bytes(), &Limits::default()).unwrap_or_else(|d| panic!("{src:?}: {d:?}"))
}

fn err(bytes: impl AsRef<[u8]>) -> Diagnostic {
    err_with(bytes, &Limits::default())
}

#[test]
fn a_bare_secret_reference_in_a_flow_mapping_gets_quoting_help() {
    let d = err("a: {h: ${env:TOKEN}}\n");
    assert_eq!(
        d.help.as_deref(),
        Some(
            "quote the value: `\"${env:TOKEN}\"`; unquoted, its `{` starts a mapping inside the flow mapping"
        )
    );
    // A quoted reference on the line is not the problem.
    let d = err("a: {h: \"${env:TOKEN}\", b: [}\n");
    assert_eq!(d.help, None, "{d:?}");
}

fn err_with(bytes: impl AsRef<[u8]>, limits: &Limits) -> Diagnostic {
    match parse(F, bytes.as_ref(), limits) {
        Ok(node) => panic!("expected an error, got {node:?}"),
        Err(d) => d,
    }
}

/// The source text under a span.
fn text(src: impl AsRef<[u8]>, span: Span) -> String {
    assert_eq!(span.file, F);
    String::from_utf8_lossy(&src.as_ref()[span.start as usize..span.end as usize]).into_owned()
}

fn line(src: impl AsRef<[u8]>, span: Span) -> usize {
    1 + src.as_ref()[..span.start as usize]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
}

fn value<'n>(node: &'n Node, path: &[&str]) -> &'n Node {
    path.iter().fold(node, |n, k| match k.parse::<usize>() {
        Ok(i) => &n.as_seq().expect("a list")[i],
        Err(_) => n.get(k).unwrap_or_else(|| panic!("no key `{k}`")),
    })
}

#[test]
fn scalars_follow_yaml_1_2() {
    let src = "no: NO\nyes: yes\non: on\nzip: 007\nneg: -01\nmode: 0o755\nhex: 0x1F\nupper: 0X1F\n\
               under: 1_000\nf: 1.5\nexp: 1e3\ndot: .5\nt: true\nT: TRUE\nn: ~\nnull: null\nempty:\n\
               int: -42\nplus: +7\nbig: 9223372036854775807\ninf: -.inf\nnan: .nan\nq: \"12\"\n\
               s: \'true\'\ntag: !!str 12\nbang: ! 12\ni: !!int \"12\"\nfl: !!float 3\n";
    let root = ok(src);
    let v = |k: &str| value(&root, &[k]).value.clone();
    assert_eq!(v("no"), Value::Str("NO".into()));
    assert_eq!(v("yes"), Value::Str("yes".into()));
    assert_eq!(v("on"), Value::Str("on".into()));
    assert_eq!(v("zip"), Value::Str("007".into()));
    assert_eq!(v("neg"), Value::Str("-01".into()));
    assert_eq!(v("mode"), Value::Int(0o755));
    assert_eq!(v("hex"), Value::Int(31));
    assert_eq!(v("upper"), Value::Str("0X1F".into()));
    assert_eq!(v("under"), Value::Str("1_000".into()));
    assert_eq!(v("f"), Value::Float(1.5));
    assert_eq!(v("exp"), Value::Float(1000.0));
    assert_eq!(v("dot"), Value::Float(0.5));
    assert_eq!(v("t"), Value::Bool(true));
    assert_eq!(v("T"), Value::Bool(true));
    assert_eq!(v("n"), Value::Null);
    assert_eq!(v("null"), Value::Null);
    assert_eq!(v("empty"), Value::Null);
    assert_eq!(v("int"), Value::Int(-42));
    assert_eq!(v("plus"), Value::Int(7));
    assert_eq!(v("big"), Value::Int(i64::MAX));
    // An integer beyond 64 bits is an error at it, never a rounded float.
    for big in ["9223372036854775808", "-99999999999999999999"] {
        let d = err(format!("a: 1\nbig: {big}\n"));
        assert_eq!(
            d.message,
            format!(
                "the integer `{big}` does not fit in 64 bits, and would be rounded; quote it to keep its digits as a string"
            )
        );
        assert_eq!(
            (d.primary.span.start, d.primary.span.end),
            (10, 10 + big.len() as u32)
        );
    }
    assert_eq!(v("inf"), Value::Float(f64::NEG_INFINITY));
    assert!(matches!(v("nan"), Value::Float(f) if f.is_nan()));
    assert_eq!(v("q"), Value::Str("12".into()));
    assert_eq!(v("s"), Value::Str("true".into()));
    assert_eq!(v("tag"), Value::Str("12".into()));
    assert_eq!(v("bang"), Value::Str("12".into()));
    assert_eq!(v("i"), Value::Int(12));
    assert_eq!(v("fl"), Value::Float(3.0));
}

#[test]
fn spans_are_byte_ranges_after_multibyte_characters() {
    // `é` is 2 bytes, `🎉` is 4: character and byte offsets differ from line 1 on.
    let src = "# café 🎉\nname: héllo 🎉 wörld\n\"clé\": [é, 🎉]\nlast: {k: ü}\n";
    let root = ok(src);
    let entries = root.as_map().expect("a mapping");
    let keys: Vec<_> = entries
        .iter()
        .map(|(k, _)| (k.name.as_str(), text(src, k.span)))
        .collect();
    assert_eq!(
        keys,
        [
            ("name", "name".into()),
            ("clé", "\"clé\"".into()),
            ("last", "last".into())
        ]
    );
    assert_eq!(
        entries[0].0.span.start as usize,
        src.find("name").expect("in src")
    );
    let name = value(&root, &["name"]);
    assert_eq!(name.as_str(), Some("héllo 🎉 wörld"));
    assert_eq!(text(src, name.span), "héllo 🎉 wörld");
    assert_eq!(text(src, value(&root, &["clé"]).span), "[é, 🎉]");
    assert_eq!(text(src, value(&root, &["clé", "1"]).span), "🎉");
    assert_eq!(text(src, value(&root, &["last"]).span), "{k: ü}");
    assert_eq!(text(src, value(&root, &["last", "k"]).span), "ü");
    assert_eq!(line(src, value(&root, &["last", "k"]).span), 4);
}

#[test]
fn nested_block_and_flow_collections() {
    let src = "flow: {a: [1, 2], b: {}}\nsteps:\n  one:\n    next: [two]\n  two:\n    - x\n    \
               - y: 1\n      z: 2\n\n# end\n";
    let root = ok(src);
    assert_eq!(
        root.to_json(),
        serde_json::json!({
            "flow": {"a": [1, 2], "b": {}},
            "steps": {"one": {"next": ["two"]}, "two": ["x", {"y": 1, "z": 2}]}
        })
    );
    assert_eq!(text(src, value(&root, &["flow"]).span), "{a: [1, 2], b: {}}");
    assert_eq!(text(src, value(&root, &["flow", "a"]).span), "[1, 2]");
    assert_eq!(text(src, value(&root, &["flow", "b"]).span), "{}");
    // Block collections run from their first key or `-` to the end of their last value.
    assert_eq!(text(src, value(&root, &["steps", "one"]).span), "next: [two]");
    assert_eq!(
        text(src, value(&root, &["steps", "two"]).span),
        "- x\n    - y: 1\n      z: 2"
    );
    assert_eq!(
        text(src, value(&root, &["steps", "two", "1"]).span),
        "y: 1\n      z: 2"
    );
    assert!(text(src, root.span).starts_with("flow:"));
    assert!(text(src, root.span).ends_with("z: 2"));
    let (key, _) = &value(&root, &["steps"]).as_map().expect("a mapping")[1];
    assert_eq!((key.name.as_str(), line(src, key.span)), ("two", 5));
}

#[test]
fn block_scalars_span_their_content() {
    let src = "prompt: |\n  Classify this.\n  {{ input }}\n\nfolded: >-\n  a\n  b\nnext: x\n";
    let root = ok(src);
    let prompt = value(&root, &["prompt"]);
    assert_eq!(prompt.as_str(), Some("Classify this.\n{{ input }}\n"));
    assert_eq!(text(src, prompt.span), "Classify this.\n  {{ input }}");
    let folded = value(&root, &["folded"]);
    assert_eq!(folded.as_str(), Some("a b"));
    assert_eq!(text(src, folded.span), "a\n  b");
}

#[test]
fn keys_keep_their_spelling() {
    let root = ok("200: ok\n0x1F: hex\ntrue: t\n~: n\n\"quoted key\": q\n1.50: f\n");
    let names: Vec<_> = root
        .as_map()
        .expect("a mapping")
        .iter()
        .map(|(k, _)| k.name.as_str())
        .collect();
    assert_eq!(names, ["200", "0x1F", "true", "~", "quoted key", "1.50"]);
}

#[test]
fn non_scalar_keys_are_errors() {
    for (src, found) in [("{a: 1}: x\n", "{a: 1}"), ("ok: 1\n? [a, b]\n: x\n", "[a, b]")] {
        let d = err(src);
        assert_eq!(d.code(), "SY100", "{src}");
        assert!(
            d.message.starts_with("a mapping key must be a scalar"),
            "{}",
            d.message
        );
        assert_eq!(text(src, d.primary.span), found);
    }
}

#[test]
fn duplicate_keys_point_at_the_second_key() {
    let src = "flow: a\nsteps:\n  fetch: {agent: x}\n  other: {agent: y}\n  fetch: {agent: z}\n";
    let d = err(src);
    assert_eq!(d.rule, &DUPLICATE_KEY);
    assert_eq!(d.code(), "SY102");
    assert_eq!(d.message, "duplicate key `fetch`");
    assert_eq!(
        (line(src, d.primary.span), text(src, d.primary.span)),
        (5, "fetch".into())
    );
    assert_eq!(line(src, d.secondary[0].span), 3);
    assert!(
        d.help.as_deref().is_some_and(|h| h.contains("line 3")),
        "{:?}",
        d.help
    );

    // In flow mappings, between spellings of the same text, and in large mappings too.
    let d = err("a: {x: 1, y: 2, x: 3}\n");
    assert_eq!((d.code(), d.primary.span.start), ("SY102", 16));
    let d = err("200: a\n\"200\": b\n");
    assert_eq!((d.code(), d.primary.span.start), ("SY102", 7));
    let big: String = (0..40).map(|i| format!("k{i}: {i}\n")).collect::<String>() + "k7: again\n";
    let d = err(&big);
    assert_eq!(
        (
            d.code(),
            line(&big, d.primary.span),
            line(&big, d.secondary[0].span)
        ),
        ("SY102", 41, 8)
    );
}

#[test]
fn collecting_reports_every_duplicate_and_keeps_the_first() {
    let src = "a: {x: 1, x: 2}\nb: 1\nb: 2\nb: 3\nc: ok\n";
    let (node, diags) = parse_collecting(F, src.as_bytes(), &Limits::default());
    let node = node.expect("the file parses");
    assert_eq!(
        node.to_json(),
        serde_json::json!({"a": {"x": 1}, "b": 1, "c": "ok"})
    );
    let found: Vec<_> = diags
        .iter()
        .map(|d| (d.code(), line(src, d.primary.span)))
        .collect();
    assert_eq!(found, [("SY102", 1), ("SY102", 3), ("SY102", 4)]);
    assert!(diags.iter().skip(1).all(|d| line(src, d.secondary[0].span) == 2));

    // A problem that stops the parse comes last, after the duplicates before it; `parse`
    // returns the first diagnostic in the file.
    let src = "a: 1\na: 2\nb: [\n";
    let (node, diags) = parse_collecting(F, src.as_bytes(), &Limits::default());
    assert!(node.is_none());
    assert_eq!(
        diags.iter().map(Diagnostic::code).collect::<Vec<_>>(),
        ["SY102", "SY100"]
    );
    assert_eq!(err(src).code(), "SY102");

    // Many duplicates: a bounded report, found in linear time.
    let src = "a: 1\n".repeat(200_000);
    let (node, diags) = parse_collecting(F, src.as_bytes(), &Limits::default());
    assert_eq!(node.expect("parses").to_json(), serde_json::json!({"a": 1}));
    assert_eq!(diags.len(), MAX_DUPLICATES);
    assert_eq!(line(&src, diags[999].primary.span), 1001);
}

#[test]
fn aliases_copy_their_anchor() {
    let src = "defaults: &retry {attempts: 3, on: [timeout]}\na: {retry: *retry}\nname: &n fetch\n*n : 1\n";
    let root = ok(src);
    assert_eq!(
        value(&root, &["a", "retry"]).to_json(),
        serde_json::json!({"attempts": 3, "on": ["timeout"]})
    );
    // The copy spans the alias; the values inside it, the text that defines them.
    assert_eq!(text(src, value(&root, &["a", "retry"]).span), "*retry");
    let attempts = value(&root, &["a", "retry", "attempts"]);
    assert_eq!(
        (text(src, attempts.span), line(src, attempts.span)),
        ("3".into(), 1)
    );
    // An anchored scalar used as a key.
    assert_eq!(value(&root, &["fetch"]).value, Value::Int(1));
}

#[test]
fn merge_keys_merge_with_own_keys_winning() {
    let root = ok("base: &b {x: 1, y: 2}\nmore: &m {z: 3, x: 0}\nc:\n  <<: [*b, *m]\n  y: 9\n");
    assert_eq!(
        value(&root, &["c"]).to_json(),
        serde_json::json!({"y": 9, "x": 1, "z": 3})
    );
    let d = err("c:\n  <<: 5\n");
    assert_eq!(d.code(), "SY100");
    assert!(d.message.contains("merge key"), "{}", d.message);
}

#[test]
fn recursive_and_unknown_aliases_are_errors() {
    let d = err("a: &a [1, *a]\n");
    assert_eq!((d.code(), d.primary.span.start), ("SY100", 10));
    let src = "a: 1\nb: *nope\n";
    let d = err(src);
    assert_eq!(d.code(), "SY100");
    assert_eq!(d.message, "unknown anchor `nope`");
    assert_eq!(
        (line(src, d.primary.span), text(src, d.primary.span)),
        (2, "*nope".into())
    );
}

fn alias_bomb() -> String {
    let mut src = String::from("a: &a [x, x, x, x, x, x, x, x, x]\n");
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    for w in names.windows(2) {
        let aliases = vec![format!("*{}", w[0]); 9].join(", ");
        src += &format!("{}: &{} [{aliases}]\n", w[1], w[1]);
    }
    src
}

#[test]
fn alias_bombs_stop_at_the_expansion_limit() {
    let src = alias_bomb();
    assert!(src.len() < 400);
    let d = err(&src);
    assert_eq!(d.rule, &YAML_BUDGET);
    assert_eq!(d.code(), "SY101");
    assert_eq!(d.message, "alias expansion limit exceeded (100000 nodes)");
    assert!(text(&src, d.primary.span).starts_with('*'));

    let small = Limits {
        max_alias_expansions: 50,
        ..Limits::default()
    };
    let d = err_with(&src, &small);
    assert_eq!(d.message, "alias expansion limit exceeded (50 nodes)");
    assert_eq!(
        (line(&src, d.primary.span), text(&src, d.primary.span)),
        (2, "*a".into())
    );
}

#[test]
fn deep_flow_nesting_is_a_clear_error() {
    for src in [
        "[".repeat(50_000),
        "{a: ".repeat(50_000),
        format!("k: {}x{}", "[".repeat(50_000), "]".repeat(50_000)),
    ] {
        let d = err(&src);
        assert_eq!(d.code(), "SY101");
        assert_eq!(d.message, "nesting depth limit exceeded (128 levels)");
        assert_eq!(line(&src, d.primary.span), 1);
        assert!(d.primary.span.start < 1_000);
    }
}

#[test]
fn deep_block_nesting_is_a_clear_error() {
    // 100,000 levels of block lists (`- - - x`) and of block mappings (`? ? ? x`).
    for unit in ["- ", "? "] {
        let src = unit.repeat(100_000) + "x\n";
        let d = err(&src);
        assert_eq!(
            (d.code(), d.message.as_str()),
            ("SY101", "nesting depth limit exceeded (128 levels)")
        );
        assert_eq!(d.primary.span.start, 256);
    }
    let src: String = (0..200).map(|i| format!("{}k:\n", " ".repeat(i))).collect();
    let d = err(&src);
    assert_eq!(d.code(), "SY101");
    assert_eq!(line(&src, d.primary.span), 129);
}

#[test]
fn nesting_at_the_limit_parses() {
    let limits = Limits {
        max_depth: 5,
        ..Limits::default()
    };
    assert!(parse(F, b"[[[[[x]]]]]", &limits).is_ok());
    let d = err_with(b"[[[[[[x]]]]]]", &limits);
    assert_eq!(
        (d.code(), d.message.as_str()),
        ("SY101", "nesting depth limit exceeded (5 levels)")
    );
    assert_eq!(d.primary.span.start, 5);
    // An alias that would nest deeper than the limit.
    let src = "a: &a [[[1]]]\nb: [[*a]]\n";
    let d = err_with(src, &limits);
    assert_eq!((d.code(), text(src, d.primary.span)), ("SY101", "*a".into()));
}

#[test]
fn very_deep_nesting_with_a_raised_limit_does_not_overflow() {
    let limits = Limits {
        max_depth: 200_000,
        max_alias_expansions: 1_000_000,
        ..Limits::default()
    };
    let src = format!("a: &a {}1{}\nb: *a\n", "[".repeat(100_000), "]".repeat(100_000));
    let node = parse(F, src.as_bytes(), &limits).expect("parses");
    // Drop the deep tree on a thread with room for it.
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || drop(node))
        .expect("spawn")
        .join()
        .expect("drop");
}

#[test]
fn node_limit() {
    let limits = Limits {
        max_nodes: 10,
        ..Limits::default()
    };
    let src = "a: [1, 2, 3]\nb: [4, 5, 6]\n";
    let d = err_with(src, &limits);
    assert_eq!(
        (d.code(), d.message.as_str()),
        ("SY101", "node limit exceeded (10 nodes)")
    );
    assert_eq!(text(src, d.primary.span), "6");
}

#[test]
fn oversized_files_fail_before_parsing() {
    let big = vec![b'a'; 20 << 20];
    let d = err(&big);
    assert_eq!(d.code(), "SY101");
    assert_eq!(d.message, "file is 20.0 MiB, larger than the 8 MiB limit");
    assert_eq!(d.primary.span, Span::file_start(F));
    let d = err_with(
        b"a: 12345",
        &Limits {
            max_bytes: 4,
            ..Limits::default()
        },
    );
    assert_eq!(d.message, "file is 8 bytes, larger than the 4-byte limit");
}

#[test]
fn invalid_utf8_points_at_the_first_bad_byte() {
    let src = "name: café\nnext: \u{1F389}\nbad: "
        .as_bytes()
        .iter()
        .copied()
        .chain([0xC3, 0x28, b'\n'])
        .collect::<Vec<_>>();
    let d = err(&src);
    assert_eq!(
        (d.code(), d.message.as_str()),
        ("SY100", "file is not valid UTF-8")
    );
    assert_eq!(d.primary.span.start as usize, src.len() - 3);
    assert_eq!(line(&src, d.primary.span), 3);
    // The span is in the text kept for the file, the lossy reading of its bytes: it covers
    // the whole U+FFFD that stands for the bad byte there.
    let lossy = String::from_utf8_lossy(&src);
    let (start, end) = (d.primary.span.start as usize, d.primary.span.end as usize);
    assert_eq!(&lossy[start..end], "\u{FFFD}");
    assert_eq!(d.primary.message, "invalid byte 0xc3");
    // A UTF-16 file.
    let d = err([0xFF, 0xFE, b'a', 0, b':', 0]);
    assert_eq!((d.code(), d.primary.span.start), ("SY100", 0));
}

/// Deterministic xorshift bytes.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn binary_garbage_is_an_error_not_a_panic() {
    let d = err(noise(42, 4096));
    assert_eq!(d.code(), "SY100");
    assert!(d.primary.span.end as usize <= 4096);
    let d = err(b"flow: a\nsteps:\x00\x00\x01\n  x: 1\n");
    assert_eq!((d.code(), line(b"flow: a\nsteps:", d.primary.span)), ("SY100", 2));
    assert_eq!(d.primary.span.start, 14);
}

#[test]
fn corpus_of_bad_inputs_never_panics() {
    // Random bytes, random ASCII, and random YAML punctuation: any outcome but a panic,
    // and every error is a syntax-family code with a span inside the file.
    const ALPHABET: &[u8] = b"[]{}:,-?!&*|>#'\"%@` \n\t\r\\ab01.~<";
    for seed in 0..300u64 {
        let len = (seed as usize * 37) % 700;
        let bytes = noise(seed, len);
        let ascii: Vec<u8> = bytes.iter().map(|b| b & 0x7F).collect();
        let yamlish: Vec<u8> = bytes
            .iter()
            .map(|b| ALPHABET[*b as usize % ALPHABET.len()])
            .collect();
        for input in [bytes, ascii, yamlish] {
            if let Err(d) = parse(F, &input, &Limits::default()) {
                assert!(
                    d.code().starts_with("SY10"),
                    "{:?}: {d:?}",
                    String::from_utf8_lossy(&input)
                );
                // Spans point into the text kept for the file: the lossy reading of
                // bytes that are not UTF-8.
                let text = String::from_utf8_lossy(&input);
                let (start, end) = (d.primary.span.start as usize, d.primary.span.end as usize);
                assert!(end <= text.len(), "{d:?}");
                assert!(
                    text.is_char_boundary(start) && text.is_char_boundary(end),
                    "{d:?}"
                );
                assert!(!d.message.is_empty());
            }
        }
    }
}

#[test]
fn one_document_per_file() {
    let src = "---\nflow: a\n---\nflow: b\n";
    let d = err(src);
    assert_eq!(
        (d.code(), d.message.as_str()),
        ("SY100", "a flow file holds one YAML document")
    );
    assert_eq!(
        (line(src, d.primary.span), text(src, d.primary.span)),
        (3, "---".into())
    );
    let d = err("a: 1\n...\nb: 2\n");
    assert_eq!((d.code(), d.primary.span.start), ("SY100", 9));
    // A document end marker, and comments after it, are fine.
    assert_eq!(ok("a: 1\n...\n# done\n").to_json(), serde_json::json!({"a": 1}));
}

#[test]
fn empty_files_are_null() {
    for src in ["", "# only a comment\n\n# another\n", "---\n", "\u{FEFF}"] {
        assert_eq!(ok(src).value, Value::Null, "{src:?}");
    }
}

#[test]
fn byte_order_mark_is_skipped_and_spans_stay_right() {
    let src = "\u{FEFF}flow: a\n";
    let root = ok(src);
    let (key, _) = &root.as_map().expect("a mapping")[0];
    assert_eq!((key.span.start, text(src, key.span)), (3, "flow".into()));
}

#[test]
fn syntax_errors_are_terse_and_located() {
    let src = "flow: a\nsteps:\n  x: \"unterminated\n";
    let d = err(src);
    assert_eq!((d.code(), d.message.as_str()), ("SY100", "unclosed quote"));
    assert_eq!(
        (line(src, d.primary.span), text(src, d.primary.span)),
        (3, "\"".into())
    );
    let src = "a:\n  b: 1\n c: 2\n";
    let d = err(src);
    assert_eq!(d.code(), "SY100");
    assert_eq!(
        (line(src, d.primary.span), text(src, d.primary.span)),
        (3, "c".into())
    );
    assert!(
        d.message.chars().next().is_some_and(char::is_lowercase),
        "{}",
        d.message
    );
    let src = "é: [1, 2\nb: 3\n";
    let d = err(src);
    assert_eq!((d.code(), line(src, d.primary.span)), ("SY100", 2));
    assert!(std::str::from_utf8(&src.as_bytes()[d.primary.span.start as usize..]).is_ok());
}

#[test]
fn yaml_1_2_indentation_is_enforced_and_located() {
    // A double-quoted scalar continued in column 0 inside an indented mapping.
    let src = "a:\n  b: \"one\ntwo\"\n";
    let d = err(src);
    assert_eq!(
        (d.code(), d.message.as_str()),
        ("SY100", "invalid indentation in multiline quoted scalar")
    );
    assert_eq!((line(src, d.primary.span), d.primary.span.start), (3, 13));
    // A flow list continued in its key's column.
    let src = "a:\n  b: [1,\n  2]\n";
    let d = err(src);
    assert_eq!((d.code(), d.message.as_str()), ("SY100", "invalid indentation"));
    assert_eq!(
        (line(src, d.primary.span), text(src, d.primary.span)),
        (3, "2".into())
    );
    // A block scalar whose first line starts with a tab, one level in.
    let src = "a:\n  foo: |\n  \t\n  bar: 1\n";
    let d = err(src);
    assert_eq!(
        (d.code(), d.message.as_str()),
        ("SY100", "tab cannot be used as indentation")
    );
    assert_eq!(
        (line(src, d.primary.span), text(src, d.primary.span)),
        (3, "\t".into())
    );
    // A key longer than 1024 characters with the spaces before its `:`.
    let src = format!("a:\n  {} : 1\n", "k".repeat(1024));
    let d = err(&src);
    assert_eq!(
        (d.code(), d.message.as_str()),
        ("SY100", "a key before `:` is at most 1024 characters")
    );
    assert_eq!(
        (line(&src, d.primary.span), text(&src, d.primary.span)),
        (2, ":".into())
    );
    // Their valid neighbours.
    for src in [
        "a:\n  b: \"one\n   two\"\n",
        "a:\n  b: [1,\n   2]\n",
        "a:\n  foo: |\n   \t\n  bar: 1\n",
        "foo: |\n \t\nbar: 1\n",
    ] {
        ok(src);
    }
    assert_eq!(
        ok("a:\n  b: \"one\n   two\"\n")
            .get("a")
            .and_then(|a| a.get("b"))
            .and_then(Node::as_str),
        Some("one two")
    );
    ok(&format!("a:\n  {}: 1\n", "k".repeat(1024)));
    // A quote left open still says so, at the quote, though its next line is indented
    // too little for a continuation.
    let src = "a:\n  b: \"one\nc: 1\n";
    let d = err(src);
    assert_eq!((d.message.as_str(), d.primary.span.start), ("unclosed quote", 8));
}

#[test]
fn tab_indentation_points_at_the_tab() {
    let src = "flow: tabs\nsteps:\n\tone:\n\t\tsucceed: {}\n";
    let d = err(src);
    assert_eq!(d.code(), "SY100");
    assert_eq!(
        (d.primary.span.start, text(src, d.primary.span)),
        (18, "\t".into())
    );
}

#[test]
fn unsupported_tags_are_errors() {
    let src = "a: !Ref other\n";
    let d = err(src);
    assert_eq!(
        (d.code(), d.message.as_str()),
        ("SY100", "unsupported tag `!Ref`")
    );
    assert_eq!(text(src, d.primary.span), "!Ref");
    let src = "a: !<tag:example.com,2000:x> [1]\n";
    let d = err(src);
    assert_eq!(d.message, "unsupported tag `!<tag:example.com,2000:x>` on a list");
    assert_eq!(text(src, d.primary.span), "!<tag:example.com,2000:x>");

    let d = err("a: !!int twelve\n");
    assert_eq!(d.message, "`twelve` is not an integer, as tag `!!int` says");
    assert_eq!(err("a: !!seq {x: 1}\n").code(), "SY100");
    assert!(ok("a: !!map {x: 1}\nb: !!seq [1]\n").get("b").is_some());
}

#[test]
fn a_json_schema_nested_twenty_deep_parses() {
    let mut schema = String::from("type: string");
    for i in 0..20 {
        let inner = schema
            .lines()
            .map(|l| format!("      {l}"))
            .collect::<Vec<_>>()
            .join("\n");
        schema = format!("type: object\nrequired: [p{i}]\nproperties:\n  p{i}:\n    allOf:\n    -\n{inner}");
    }
    let body = schema
        .lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n");
    let src = format!("flow: deep\ninput:\n  schema:\n{body}\nsteps: {{}}\n");
    let root = ok(&src);
    assert!(root.get("steps").is_some());
}
