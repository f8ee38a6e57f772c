//! Secrets echoed back in other spellings: an `http` service and an OpenAI-compatible model
//! that answer with the `Authorization` header they received, base64-encoded (whole, inside a
//! longer text, as Basic auth), percent-encoded fully and as Python's `quote` leaves it, JSON-
//! and unicode-escaped. The key is in none of the places a result reaches: the batch's output
//! file, `runs show` in every format, `report`, the SQLite file, PostgreSQL's `runs`/`steps`.

use std::path::Path;

use serde_json::Value;

use crate::cluster::Pg;
use crate::mock_server::{Llm, Reply, Service, auth_spellings, base64};
use crate::support::{self, TempDir};

/// A key in a base64-like alphabet, with `/` and `+` to exercise the encodings.
const KEY: &str = "sk-Ab+c/De+f/0123/GhIj+kLmN/9xYz";

/// Every spelling of the key and of its header a test looks for in what was written.
fn leaks() -> Vec<String> {
    let header = format!("Bearer {KEY}");
    let mut out = vec![KEY.to_owned(), base64(KEY.as_bytes(), false)];
    if let Value::Object(m) = auth_spellings(&header) {
        out.extend(m.values().filter_map(|v| v.as_str().map(str::to_owned)));
    }
    out
}

fn assert_clean(what: &str, text: &str) {
    for leak in leaks() {
        assert!(!text.contains(&leak), "`{leak}` leaked into {what}:\n{text}");
    }
}

fn flow(dir: &TempDir, svc: &Service, llm: &Llm) {
    dir.write(
        "leak.yaml",
        format!(
            r#"flow: leak
providers:
  local:
    base_url: {base}
    api_key: ${{env:SWITCHYARD_LEAK_KEY}}
agents:
  svc:
    kind: http
    url: {url}
    headers:
      Authorization: Bearer ${{env:SWITCHYARD_LEAK_KEY}}
  model:
    kind: llm
    provider: local
    model: m1
    prompt: "echo {{{{ input.n }}}}"
    result_schema: {{type: object}}
steps:
  call:
    agent: svc
    output: {{$.svc: $}}
    next: ask
  ask:
    agent: model
    input: {{$.n: $.n}}
    output: {{$.model: $}}
"#,
            base = llm.base_url(),
            url = svc.url("/echo-auth"),
        ),
    );
    dir.write(
        "in.jsonl",
        "{\"id\": \"a\", \"n\": 1}\n{\"id\": \"b\", \"n\": 2}\n",
    );
}

/// Runs the batch on `store`; checks the servers got the key and the output is clean.
fn batch(dir: &TempDir, store: &str, svc: &Service) {
    let out = support::run(
        support::switchyard(dir.path())
            .env("SWITCHYARD_LEAK_KEY", KEY)
            .args([
                "batch",
                "leak.yaml",
                "--input",
                "in.jsonl",
                "--output",
                "OUT.jsonl",
            ])
            .args(["--store", store]),
    );
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(svc.hits()[0].headers["authorization"], format!("Bearer {KEY}"));
    let written = std::fs::read_to_string(dir.path().join("OUT.jsonl")).expect("OUT.jsonl");
    assert_eq!(written.lines().count(), 2, "{written}");
    // The echoes are there, redacted.
    assert!(written.contains("[redacted]"), "{written}");
    assert_clean("OUT.jsonl", &written);
    assert_clean("stdout", &out.stdout);
    assert_clean("stderr", &out.stderr);
}

fn run_ids(dir: &TempDir, store: &str) -> Vec<String> {
    let out =
        support::run(support::switchyard(dir.path()).args(["runs", "list", "--json", "--store", store]));
    assert_eq!(out.code(), 0, "{out:?}");
    let ids: Vec<String> = out
        .stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            v["id"].as_str().expect("a run id").to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 2, "{}", out.stdout);
    ids
}

fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("a directory").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn echoed_secrets_in_any_spelling_reach_no_output_page_or_sqlite_store() {
    let (svc, llm) = (Service::start(), Llm::start());
    llm.default_reply(Reply::EchoAuthSpelt);
    let dir = TempDir::new("leak-sqlite");
    flow(&dir, &svc, &llm);
    batch(&dir, "sqlite:runs.db", &svc);
    for id in run_ids(&dir, "sqlite:runs.db") {
        for args in [&[][..], &["--json"], &["--transcript"], &["--format", "html"]] {
            let out = support::run(
                support::switchyard(dir.path())
                    .args(["runs", "show", &id, "--store", "sqlite:runs.db"])
                    .args(args),
            );
            assert_eq!(out.code(), 0, "{out:?}");
            assert_clean(&format!("`runs show {args:?}`"), &out.stdout);
        }
    }
    let out = support::run(support::switchyard(dir.path()).args([
        "report",
        "OUT.jsonl",
        "--store",
        "sqlite:runs.db",
    ]));
    assert_eq!(out.code(), 0, "{out:?}");
    // Every file written: the store and its WAL, the output, the report and its run pages.
    for path in files_under(dir.path()) {
        let bytes = std::fs::read(&path).expect("readable");
        assert_clean(&path.display().to_string(), &String::from_utf8_lossy(&bytes));
    }
}

#[test]
fn echoed_secrets_in_any_spelling_reach_no_postgresql_table() {
    let (svc, llm) = (Service::start(), Llm::start());
    llm.default_reply(Reply::EchoAuthSpelt);
    let pg = Pg::new("leak");
    let dir = TempDir::new("leak-pg");
    flow(&dir, &svc, &llm);
    batch(&dir, &pg.url("leak"), &svc);
    for table in ["runs", "steps"] {
        let rows = pg.query(&format!("SELECT t::text AS row FROM {table} t"));
        assert!(!rows.is_empty(), "no rows in {table}");
        for row in rows {
            assert_clean(table, row["row"].as_deref().unwrap_or(""));
        }
    }
    let out = support::run(
        support::switchyard(dir.path())
            .args(["runs", "show", &run_ids(&dir, &pg.url("list"))[0], "--json"])
            .args(["--store", &pg.url("show")]),
    );
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(out.stdout.contains("[redacted]"), "{}", out.stdout);
    assert_clean("`runs show --json`", &out.stdout);
}
