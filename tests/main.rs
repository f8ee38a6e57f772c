//! The one integration-test binary of Switchyard. It drives the real `switchyard` binary (and,
//! for the property tests, the library) the way users do:
//!
//! - [`lint_fixtures`]: YAML fixtures per rule with inline caret expectations;
//! - [`snapshots`]: rendered human output, snapshot-tested with insta;
//! - [`cli`]: exit codes, output formats, `explain`, `--help`;
//! - [`engine`]: runs and flow tests: every runtime semantic, through `run` and `test`;
//! - [`corpus`]: hostile inputs (alias bombs, deep nesting, huge and binary files);
//! - [`fuzz`]: property tests over generated and mutated flows.

mod batch;
mod cli;
mod corpus;
mod engine;
mod fuzz;
mod graph;
mod lint_fixtures;
mod logs;
mod readme;
mod snapshots;
mod store;
mod support;
