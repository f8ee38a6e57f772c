//! Hostile and broken inputs (SPEC §2, §10): lint gives one clear diagnostic, never a crash or a
//! hang. Each input is generated into a fresh temp dir and linted by the real binary, which is
//! killed (and the test failed) if it runs longer than [`support::HANG`]; timing is otherwise
//! not asserted.

use crate::support::{self, JsonDiagnostic, TempDir};

/// What one broken input must produce: exactly one diagnostic, with this code, on this line
/// (when known), whose message contains `needle`.
struct Expect {
    code: &'static str,
    line: Option<usize>,
    column: Option<usize>,
    needle: &'static str,
}

fn lint_bytes(name: &str, bytes: &[u8], expect: Expect) -> JsonDiagnostic {
    let dir = TempDir::new("corpus");
    dir.write(name, bytes);
    let out = support::lint_json(dir.path(), &[name]);
    assert_eq!(
        out.code(),
        1,
        "{name}: exit code 1 (errors) expected; stderr:\n{}",
        out.stderr
    );
    let diags = out.diagnostics();
    assert_eq!(
        diags.len(),
        1,
        "{name}: exactly one diagnostic expected, got {diags:#?}"
    );
    let d = diags.into_iter().next().expect("one");
    assert_eq!(d.code, expect.code, "{name}: {d:#?}");
    assert_eq!(d.severity, "error", "{name}");
    assert_eq!(d.file, name, "{name}: the diagnostic names the file");
    assert!(d.line >= 1 && d.column >= 1, "{name}: 1-based position: {d:#?}");
    assert!(
        (d.end_line, d.end_column) >= (d.line, d.column),
        "{name}: the span ends after it starts: {d:#?}"
    );
    if let Some(line) = expect.line {
        assert_eq!(d.line, line, "{name}: wrong line: {d:#?}");
    }
    if let Some(column) = expect.column {
        assert_eq!(d.column, column, "{name}: wrong column: {d:#?}");
    }
    assert!(
        d.message.contains(expect.needle),
        "{name}: the message should name the problem ({:?}): {:?}",
        expect.needle,
        d.message
    );
    d
}

/// Deterministic pseudo-random bytes (xorshift64*), so failures reproduce.
fn pseudo_random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.max(1);
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

const VALID_FLOW: &str = "\
flow: valid
agents:
  fetcher: {kind: mock, returns: {ok: true}}
steps:
  fetch:
    agent: fetcher
    description: first
    next: done
  done:
    succeed: {}
";

#[test]
fn alias_bomb_hits_the_expansion_budget() {
    let mut s = String::from(
        "flow: laughs\na: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    for w in names.windows(2) {
        s += &format!(
            "{}: &{} [{}]\n",
            w[1],
            w[1],
            vec![format!("*{}", w[0]); 9].join(",")
        );
    }
    s += "steps:\n  one: {succeed: {}}\n";
    assert!(s.len() < 1000, "a few hundred bytes: {}", s.len());
    lint_bytes(
        "bomb.yaml",
        s.as_bytes(),
        Expect {
            code: "SY101",
            line: None,
            column: None,
            needle: "alias",
        },
    );
}

#[test]
fn quadratic_alias_blowup_in_keys_and_values_hits_a_budget() {
    // Every mapping entry refers to the previous entry twice: 2^40 nodes if expanded.
    let mut s = String::from("flow: doubling\nx0: &x0 [a, b]\n");
    for i in 1..40 {
        s += &format!("x{i}: &x{i} {{l: *x{}, r: *x{}}}\n", i - 1, i - 1);
    }
    s += "steps:\n  one: {succeed: {}}\n";
    lint_bytes(
        "doubling.yaml",
        s.as_bytes(),
        Expect {
            code: "SY101",
            line: None,
            column: None,
            needle: "limit exceeded",
        },
    );
}

#[test]
fn fifty_thousand_deep_flow_nesting_hits_the_depth_limit() {
    lint_bytes(
        "brackets.yaml",
        "[".repeat(50_000).as_bytes(),
        Expect {
            code: "SY101",
            line: Some(1),
            column: None,
            needle: "nesting depth",
        },
    );
    lint_bytes(
        "braces.yaml",
        "{a: ".repeat(50_000).as_bytes(),
        Expect {
            code: "SY101",
            line: Some(1),
            column: None,
            needle: "nesting depth",
        },
    );
}

#[test]
fn fifty_thousand_deep_block_nesting_hits_the_depth_limit() {
    // `- - - ... x`: each `- ` opens a block sequence inside the previous one.
    let text = format!("{}x\n", "- ".repeat(50_000));
    lint_bytes(
        "dashes.yaml",
        text.as_bytes(),
        Expect {
            code: "SY101",
            line: Some(1),
            column: None,
            needle: "nesting depth",
        },
    );
    let text = format!("{}x\n", "? ".repeat(50_000));
    lint_bytes(
        "keys.yaml",
        text.as_bytes(),
        Expect {
            code: "SY101",
            line: Some(1),
            column: None,
            needle: "nesting depth",
        },
    );
}

#[test]
fn deeply_indented_block_mappings_hit_the_depth_limit() {
    // 1,000 levels by indentation, one space each (half a megabyte).
    let text: String = (0..1_000).map(|i| format!("{}k{i}:\n", " ".repeat(i))).collect();
    lint_bytes(
        "indented.yaml",
        text.as_bytes(),
        Expect {
            code: "SY101",
            line: None,
            column: None,
            needle: "nesting depth",
        },
    );
}

#[test]
fn twenty_megabyte_file_is_refused_by_size() {
    let mut bytes = VALID_FLOW.as_bytes().to_vec();
    let filler = "# padding padding padding padding padding padding padding padding padding\n";
    while bytes.len() < 20 << 20 {
        bytes.extend_from_slice(filler.as_bytes());
    }
    lint_bytes(
        "huge.yaml",
        &bytes,
        Expect {
            code: "SY101",
            line: Some(1),
            column: None,
            needle: "larger than",
        },
    );
}

#[test]
fn random_binary_garbage_is_a_syntax_error() {
    for seed in [1, 2, 3, 0x5eed] {
        let bytes = pseudo_random_bytes(seed, 64 << 10);
        lint_bytes(
            &format!("garbage-{seed}.yaml"),
            &bytes,
            Expect {
                code: "SY100",
                line: None,
                column: None,
                needle: "UTF-8",
            },
        );
    }
}

#[test]
fn nul_bytes_are_a_syntax_error_at_the_nul() {
    // Line 7 is `    description: first`; the NUL replaces the `r` of `first` (column 20).
    let text = VALID_FLOW.replace("description: first", "description: fi\0st");
    lint_bytes(
        "nul.yaml",
        text.as_bytes(),
        Expect {
            code: "SY100",
            line: Some(7),
            column: Some(20),
            needle: "character",
        },
    );
    lint_bytes(
        "all-nul.yaml",
        &[0u8; 4096],
        Expect {
            code: "SY100",
            line: Some(1),
            column: Some(1),
            needle: "character",
        },
    );
}

#[test]
fn invalid_utf8_in_the_middle_points_at_its_line() {
    // Line 7 is `    description: first`; the bad byte sits at column 20 (after `fi`).
    let mut bytes = Vec::new();
    for (i, line) in VALID_FLOW.lines().enumerate() {
        if i == 6 {
            bytes.extend_from_slice(b"    description: fi\xff\xfest");
        } else {
            bytes.extend_from_slice(line.as_bytes());
        }
        bytes.push(b'\n');
    }
    lint_bytes(
        "latin1.yaml",
        &bytes,
        Expect {
            code: "SY100",
            line: Some(7),
            column: Some(20),
            needle: "UTF-8",
        },
    );
}

#[test]
fn empty_file_is_a_missing_flow() {
    lint_bytes(
        "empty.yaml",
        b"",
        Expect {
            code: "SY105",
            line: Some(1),
            column: Some(1),
            needle: "empty",
        },
    );
    lint_bytes(
        "comments.yaml",
        b"# nothing but a comment\n\n# and another\n",
        Expect {
            code: "SY105",
            line: None,
            column: None,
            needle: "empty",
        },
    );
}

#[test]
fn a_list_is_not_a_flow() {
    lint_bytes(
        "list.yaml",
        b"- flow: listed\n- steps: {}\n",
        Expect {
            code: "SY104",
            line: Some(1),
            column: Some(1),
            needle: "mapping",
        },
    );
    lint_bytes(
        "scalar.yaml",
        b"just some text\n",
        Expect {
            code: "SY104",
            line: Some(1),
            column: Some(1),
            needle: "mapping",
        },
    );
}

#[test]
fn a_second_document_is_an_error_at_its_marker() {
    let text = format!("{VALID_FLOW}---\n{VALID_FLOW}");
    lint_bytes(
        "two-docs.yaml",
        text.as_bytes(),
        Expect {
            code: "SY100",
            line: Some(11),
            column: Some(1),
            needle: "one YAML document",
        },
    );
}

/// YAML 1.2 indentation and key-length rules, refused with the file, line and column of the
/// offending character, whichever way the file would be read.
#[test]
fn yaml_indentation_and_key_length_errors_are_located() {
    let flow = |body: &str| format!("flow: f\nsteps:\n  a:\n{body}    succeed: {{}}\n");
    // A double-quoted scalar continued in column 0 inside the step's mapping.
    lint_bytes(
        "quoted.yaml",
        flow("    description: \"one\ntwo\"\n").as_bytes(),
        Expect {
            code: "SY100",
            line: Some(5),
            column: Some(1),
            needle: "invalid indentation in multiline quoted scalar",
        },
    );
    // A flow list continued in its key's column.
    lint_bytes(
        "flow-list.yaml",
        flow("    tags: [x,\n    y]\n").as_bytes(),
        Expect {
            code: "SY100",
            line: Some(5),
            column: Some(5),
            needle: "invalid indentation",
        },
    );
    // A block scalar whose first line starts with a tab, in the step's column.
    lint_bytes(
        "block-tab.yaml",
        flow("    description: |\n    \t\n").as_bytes(),
        Expect {
            code: "SY100",
            line: Some(5),
            column: Some(5),
            needle: "tab cannot be used as indentation",
        },
    );
    // A key of 1024 characters and a space before its `:`.
    lint_bytes(
        "long-key.yaml",
        format!("flow: f\nsteps:\n  {} : {{succeed: {{}}}}\n", "k".repeat(1024)).as_bytes(),
        Expect {
            code: "SY100",
            line: Some(3),
            column: Some(1028),
            needle: "at most 1024 characters",
        },
    );
}

/// A whole flow on one line, as a generator or minifier writes it, with an unknown agent past
/// column 65,535 (where the snippet renderer's padding used to overflow and panic).
fn minified_flow() -> (String, usize) {
    let head = format!(
        "{{flow: mini, description: \"{}\", steps: {{a: {{agent: ",
        "y".repeat(70_000)
    );
    let column = head.chars().count() + 1;
    (format!("{head}nope}}}}}}\n"), column)
}

#[test]
fn a_problem_past_column_65535_is_rendered_with_a_cut_snippet() {
    let (text, column) = minified_flow();
    assert!(column > 65_535);
    lint_bytes(
        "mini.yaml",
        text.as_bytes(),
        Expect {
            code: "SY202",
            line: Some(1),
            column: Some(column),
            needle: "unknown agent `nope`",
        },
    );
    let dir = TempDir::new("corpus");
    dir.write("mini.yaml", &text);
    let snippet = format!(
        "   ╭─[mini.yaml:1:{column}]\n 1 │ …{}\", steps: {{a: {{agent: nope}}}}}}\n   ·{}──┬─\n   ·{}╰── no such agent\n   ╰────\n",
        // 40 characters of context before the span.
        "y".repeat(40 - "\", steps: {a: {agent: ".len()),
        " ".repeat(42),
        " ".repeat(44),
    );
    let lint = support::run(support::switchyard(dir.path()).args(["lint", "mini.yaml"]));
    assert_eq!(lint.code(), 1, "{lint:?}");
    assert!(lint.stdout.contains(&snippet), "{}", lint.stdout);
    let run = support::run(support::switchyard(dir.path()).args(["run", "mini.yaml", "--input", "{}"]));
    assert_eq!(run.code(), 2, "{run:?}");
    assert!(run.stderr.contains(&snippet), "{}", run.stderr);
}

#[test]
fn a_long_line_is_cut_around_each_problem_on_it() {
    // Line 3 holds a 100,000-character description and, after it, an unknown key; the line
    // after it is context, shown whole.
    let text = format!(
        "flow: long\nsteps:\n  a: {{succeed: {{}}, description: \"{}\", bogus: 1}}\n  # the end\n",
        "d".repeat(100_000)
    );
    let dir = TempDir::new("corpus");
    dir.write("long.yaml", &text);
    let out = support::run(support::switchyard(dir.path()).args(["lint", "long.yaml"]));
    assert_eq!(out.code(), 1, "{out:?}");
    let column = 100_037;
    let expected = format!(
        "   ╭─[long.yaml:3:{column}]\n 2 │ steps:\n 3 │ …{}\", bogus: 1}}\n   ·{}──┬──\n   ·{}╰── ",
        "d".repeat(40 - "\", ".len()),
        " ".repeat(42),
        " ".repeat(44),
    );
    assert!(out.stdout.contains(&expected), "{}", out.stdout);
    assert!(out.stdout.contains(" 4 │   # the end\n"), "{}", out.stdout);
    assert!(
        out.stdout.lines().all(|l| l.chars().count() < 200),
        "every line of the report is short:\n{}",
        out.stdout
    );
}
