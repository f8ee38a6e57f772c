//! Snapshots of the rendered human output of `switchyard lint` (insta), for a few fixtures whose
//! rendering matters most: did-you-mean help, the valid-key list, a cycle with its secondary
//! labels, and a duplicate whose other definition is in another file.
//!
//! The binary runs as users see it in CI logs: not a terminal, `NO_COLOR=1`, `COLUMNS=100`, in
//! the fixture's folder so file names are short and machine-independent. The snapshots live in
//! `tests/snapshots/`; review changes with `cargo insta review` (or `INSTA_UPDATE=always` and
//! read the `.snap` diff).

use crate::lint_fixtures::rule_dir;
use crate::support;

/// The human output of linting `fixture` in the folder of `rule`, after checking how it ran.
fn human(rule: &str, fixture: &str) -> String {
    let out = support::run(support::switchyard(&rule_dir(rule)).args(["lint", fixture]));
    assert_eq!(out.code(), 1, "{rule}/{fixture} should fail lint: {out:?}");
    assert!(out.stderr.is_empty(), "nothing on stderr: {}", out.stderr);
    assert!(
        !out.stdout.contains('\u{1b}'),
        "no colour codes with NO_COLOR and a pipe:\n{}",
        out.stdout
    );
    format!("$ switchyard lint {fixture}\n{}", out.stdout)
}

#[test]
fn typo_in_step_reference_suggests_the_closest_step() {
    insta::assert_snapshot!("unknown_step_typo", human("unknown-step", "typo.yaml"));
}

#[test]
fn unknown_key_lists_the_valid_keys() {
    insta::assert_snapshot!(
        "unknown_key_edge_and_nested",
        human("unknown-key", "edge-and-nested.yaml")
    );
}

#[test]
fn edge_cycle_shows_the_cycle_and_its_steps() {
    insta::assert_snapshot!("edge_cycle_three_steps", human("edge-cycle", "three-steps.yaml"));
}

#[test]
fn duplicate_definition_points_at_both_files() {
    insta::assert_snapshot!(
        "duplicate_definition_across_imports",
        human("duplicate-definition", "across-imports.yaml")
    );
}
