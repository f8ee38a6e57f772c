//! Files written out, listed, pruned and shown (SPEC §6.5, §10, §12, §13), through the real
//! binary on SQLite and PostgreSQL: `runs files --output` (safe names, exact bytes, a damaged
//! store refused), `batch --files` and `collect --files` (a directory per item, each distinct
//! bytes stored once, a crash mid-batch neither duplicating nor losing files), `runs prune`
//! (bytes on no record removed, referenced ones kept), and the run page in headless Chromium
//! (thumbnails of raster images only, hostile names inert).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::Digest;

use crate::cluster::{Pg, log_of, spawn_worker, wait_exit, wait_for};
use crate::support::{TempDir, run, run_with_limit, switchyard};

const SQLITE: &str = "sqlite:runs.db";

/// `sha256:` and the hex digest of `bytes`.
fn hash(bytes: &[u8]) -> String {
    let digest = sha2::Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Writes the files its input lists under `sys.argv[1]` (`[[name, text], ...]`, text as
/// Latin-1 bytes) into `$SWITCHYARD_OUTPUT_DIR`, and prints `{}`.
const MAKE: &str = r#"
import json, os, sys
doc = json.load(sys.stdin)
out = os.environ["SWITCHYARD_OUTPUT_DIR"]
for name, text in doc[sys.argv[1]]:
    p = os.path.join(out, name)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(text.encode("latin-1"))
print("{}")
"#;

/// Every regular file under `dir`, by its path relative to `dir`, with its bytes; fails on
/// anything under it that is not a directory or a regular file, or that resolves outside it.
fn walk(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let root = dir.canonicalize().expect("the directory is there");
    let mut out = BTreeMap::new();
    let mut todo = vec![root.clone()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read dir") {
            let p = e.expect("entry").path();
            let real = p.canonicalize().expect("canonical");
            assert!(
                real.starts_with(&root),
                "{} is outside {}",
                real.display(),
                root.display()
            );
            let m = std::fs::symlink_metadata(&p).expect("metadata");
            if m.is_dir() {
                todo.push(p);
            } else {
                assert!(m.is_file(), "{} is not a regular file", p.display());
                let rel = p
                    .strip_prefix(&root)
                    .expect("under root")
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, std::fs::read(&p).expect("read"));
            }
        }
    }
    out
}

/// Runs Python on the SQLite store of `dir` (`db` is the connection) and returns its stdout.
fn sqlite(dir: &TempDir, code: &str) -> String {
    let script = format!("import json, sqlite3, sys\ndb = sqlite3.connect('runs.db')\n{code}\ndb.commit()\n");
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .current_dir(dir.path())
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The id of the only run in the store of `dir`.
fn only_run(dir: &TempDir, store: &str) -> String {
    let list = run(switchyard(dir.path()).args(["runs", "list", "--json", "--store", store]));
    let lines: Vec<&str> = list.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{}", list.stdout);
    serde_json::from_str::<Value>(lines[0]).unwrap()["id"]
        .as_str()
        .expect("an id")
        .to_string()
}

const TWO_MAKERS: &str = r#"
flow: makers
agents:
  make1:
    kind: command
    run: [python3, make.py, first]
    cwd: .
  make2:
    kind: command
    run: [python3, make.py, second]
    cwd: .
steps:
  first:
    agent: make1
    output: {$.one: $}
    next: second
  second:
    agent: make2
    output: {$.two: $}
"#;

#[test]
fn runs_files_writes_exact_bytes_under_safe_names_and_nothing_escapes() {
    let dir = TempDir::new("files-out");
    dir.write("make.py", MAKE);
    dir.write("flow.yaml", TWO_MAKERS);
    let long_path = format!("{}/{}", "d".repeat(140), "e".repeat(159));
    assert_eq!(long_path.chars().count(), 300);
    let input = json!({
        "first": [["a.txt", "first a"], [long_path, "deep"], ["line\nbreak.txt", "newline"]],
        "second": [["a.txt", "second a"], ["x1", "dot dot"], ["x2", "passwd"], ["x3", "long"]],
    });
    let out = run(switchyard(dir.path()).args([
        "run",
        "flow.yaml",
        "--input",
        &input.to_string(),
        "--store",
        SQLITE,
    ]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let id = only_run(&dir, SQLITE);
    // Names as an http body or an MCP tool could give them: written into the record.
    let long_name = "f".repeat(300);
    sqlite(
        &dir,
        &format!(
            "names = {{'x1': '../../x', 'x2': '/etc/passwd', 'x3': '{long_name}'}}\n\
             (files,) = db.execute('SELECT files FROM runs WHERE id = ?', ('{id}',)).fetchone()\n\
             files = json.loads(files)\n\
             for f in files: f['name'] = names.get(f['name'], f['name'])\n\
             db.execute('UPDATE runs SET files = ? WHERE id = ?', (json.dumps(files), '{id}'))"
        ),
    );

    let listed = run(switchyard(dir.path()).args(["runs", "files", &id, "--store", SQLITE]));
    assert_eq!(listed.code(), 0, "{}", listed.stderr);
    assert!(listed.stdout.contains("7 file(s), 43 bytes"), "{}", listed.stdout);
    assert!(listed.stdout.contains("line\\nbreak.txt"), "{}", listed.stdout);
    assert!(listed.stdout.contains(&hash(b"dot dot")), "{}", listed.stdout);

    let wrote = run(switchyard(dir.path()).args([
        "runs", "files", &id, "--output", "out", "--json", "--store", SQLITE,
    ]));
    assert_eq!(wrote.code(), 0, "{}", wrote.stderr);
    let doc: Value = serde_json::from_str(&wrote.stdout).expect("JSON");
    assert_eq!(doc["complete"], true);
    let files = doc["files"].as_array().expect("files");
    let numbers: Vec<&str> = files.iter().map(|f| f["number"].as_str().unwrap()).collect();
    assert_eq!(numbers, ["1", "1", "1", "2", "2", "2", "2"]);
    let expected: BTreeMap<String, Vec<u8>> = [
        ("a.txt".to_string(), b"first a".to_vec()),
        (long_path.clone(), b"deep".to_vec()),
        ("line_break.txt".to_string(), b"newline".to_vec()),
        ("a-2.txt".to_string(), b"second a".to_vec()),
        ("__/__/x".to_string(), b"dot dot".to_vec()),
        ("etc/passwd".to_string(), b"passwd".to_vec()),
        ("f".repeat(200), b"long".to_vec()),
    ]
    .into_iter()
    .collect();
    let got = walk(&dir.path().join("out"));
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    assert_eq!(got, expected);
    for f in files {
        let path = dir.path().join(f["path"].as_str().expect("a path"));
        assert_eq!(hash(&std::fs::read(&path).unwrap()), f["file"].as_str().unwrap());
    }
    assert!(!dir.path().join("x").exists() && !Path::new("/etc/passwd").starts_with(dir.path()));

    // Again: the same names, nothing rewritten.
    let again =
        run(switchyard(dir.path()).args(["runs", "files", &id, "--output", "out", "--store", SQLITE]));
    assert_eq!(again.code(), 0, "{}", again.stderr);
    assert!(
        again
            .stdout
            .contains("wrote 0 file(s) under out (7 there already"),
        "{}",
        again.stdout
    );
    assert_eq!(walk(&dir.path().join("out")), expected);

    // A damaged store: the bytes of `a.txt` no longer match their hash.
    let a = hash(b"first a");
    sqlite(
        &dir,
        &format!("db.execute(\"UPDATE file_chunks SET data = ? WHERE hash = '{a}'\", (b'first A',))"),
    );
    let damaged =
        run(switchyard(dir.path()).args(["runs", "files", &id, "--output", "out2", "--store", SQLITE]));
    assert_eq!(damaged.code(), 1, "{}\n{}", damaged.stdout, damaged.stderr);
    assert!(
        damaged.stderr.contains("do not match their hash"),
        "{}",
        damaged.stderr
    );
    assert!(damaged.stderr.contains(&a), "{}", damaged.stderr);
    assert_eq!(
        walk(&dir.path().join("out2")),
        BTreeMap::new(),
        "no partial file is left"
    );

    let unknown = run(switchyard(dir.path()).args(["runs", "files", "run-nope", "--store", SQLITE]));
    assert_eq!(unknown.code(), 2, "{}", unknown.stderr);
    assert!(unknown.stderr.contains("run-nope"), "{}", unknown.stderr);
}

/// One command per item, writing `out.bin`: 8 KiB that items `2k` and `2k+1` share (their
/// `pair`), after `sleep` seconds.
const ITEM_FLOW: &str = r#"
flow: items
agents:
  make:
    kind: command
    idempotent: true
    run: [sh, -c, 'cat >/dev/null; sleep "$1"; yes "bytes of pair $0;" | head -c 8192 > "$SWITCHYARD_OUTPUT_DIR/out.bin"; printf "{}"', "{{ input.pair }}", "{{ input.sleep }}"]
steps:
  make:
    agent: make
    output: {$.made: $}
"#;

fn item_bytes(n: usize) -> Vec<u8> {
    format!("bytes of pair {};\n", n / 2).repeat(600).into_bytes()[..8192].to_vec()
}

/// The lines of `out.jsonl` of items that did not succeed.
fn failed_lines(dir: &TempDir) -> String {
    std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.contains("\"status\":\"succeeded\""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn items_input(dir: &TempDir, n: usize, sleep: f64) {
    let lines: String = (0..n)
        .map(|i| json!({"id": format!("item-{i}"), "pair": i / 2, "sleep": sleep}).to_string() + "\n")
        .collect();
    dir.write("in.jsonl", lines);
}

/// The store's file rows and their bytes: (files, SUM(size), bytes in chunks).
fn stored(dir: &TempDir) -> (u64, u64, u64) {
    let out = sqlite(
        dir,
        "print(*db.execute('SELECT COUNT(*), COALESCE(SUM(size), 0) FROM files').fetchone(), \
         db.execute('SELECT COALESCE(SUM(LENGTH(data)), 0) FROM file_chunks').fetchone()[0])",
    );
    let n: Vec<u64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (n[0], n[1], n[2])
}

#[test]
fn batch_files_for_a_thousand_items_store_each_distinct_bytes_once() {
    const N: usize = 1000;
    let dir = TempDir::new("files-batch");
    dir.write("flow.yaml", ITEM_FLOW);
    items_input(&dir, N, 0.0);
    let batch = || {
        run_with_limit(
            switchyard(dir.path()).args([
                "batch",
                "flow.yaml",
                "--input",
                "in.jsonl",
                "--output",
                "out.jsonl",
                "--files",
                "files",
                "--concurrency",
                "32",
                "--store",
                SQLITE,
            ]),
            Duration::from_secs(300),
        )
    };
    let out = batch();
    assert_eq!(out.code(), 0, "{}\n{}", out.stderr, failed_lines(&dir));
    let db_size = std::fs::metadata(dir.path().join("runs.db")).unwrap().len();

    // Each distinct 8 KiB once: 500 files, and no more bytes than theirs.
    assert_eq!(stored(&dir), (500, 500 * 8192, 500 * 8192));
    let lines: Vec<Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), N);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["id"], format!("item-{i}"));
        assert_eq!(
            l["files"],
            json!([{"number": "1", "file": hash(&item_bytes(i)), "name": "out.bin",
                    "media_type": "application/octet-stream", "size": 8192}]),
            "{l}"
        );
    }
    let expected: BTreeMap<String, Vec<u8>> = (0..N)
        .map(|i| (format!("item-{i}/out.bin"), item_bytes(i)))
        .collect();
    assert_eq!(walk(&dir.path().join("files")), expected);

    // Run again: nothing runs, nothing is duplicated; what was lost from DIR is written again.
    std::fs::remove_dir_all(dir.path().join("files/item-7")).unwrap();
    std::fs::write(dir.path().join("files/item-8/out.bin"), b"scribbled").unwrap();
    let again = batch();
    assert_eq!(again.code(), 0, "{}", again.stderr);
    assert_eq!(walk(&dir.path().join("files")), expected);
    assert_eq!(stored(&dir), (500, 500 * 8192, 500 * 8192));
    // The store grew by the records and one copy of the distinct bytes, not a copy per item.
    assert!(db_size < 1000 * 8192, "runs.db is {db_size} bytes");
}

#[test]
fn a_batch_killed_mid_way_and_run_again_neither_loses_nor_duplicates_files() {
    const N: usize = 40;
    let dir = TempDir::new("files-crash");
    dir.write("flow.yaml", ITEM_FLOW);
    items_input(&dir, N, 0.05);
    let args = [
        "batch",
        "flow.yaml",
        "--input",
        "in.jsonl",
        "--output",
        "out.jsonl",
        "--files",
        "files",
        "--concurrency",
        "4",
        "--store",
        SQLITE,
    ];
    let mut child = switchyard(dir.path())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("batch starts");
    let files = dir.path().join("files");
    wait_for(Duration::from_secs(60), "files of ten items", || {
        std::fs::read_dir(&files)
            .map(|d| d.count() >= 10)
            .unwrap_or(false)
    });
    child.kill().expect("kill -9");
    child.wait().expect("reaped");
    let before = walk(&files).len();
    assert!(before < N, "the batch was killed before its end ({before} files)");

    let out = run_with_limit(switchyard(dir.path()).args(args), Duration::from_secs(120));
    assert_eq!(out.code(), 0, "{}\n{}", out.stderr, failed_lines(&dir));
    let expected: BTreeMap<String, Vec<u8>> = (0..N)
        .map(|i| (format!("item-{i}/out.bin"), item_bytes(i)))
        .collect();
    assert_eq!(
        walk(&files),
        expected,
        "every item's file once, no partial file left"
    );
    assert_eq!(std::fs::read_dir(&files).unwrap().count(), N);
}

#[test]
fn a_submitted_batch_collects_its_files_from_postgres_into_a_directory_per_id() {
    let pg = Pg::new("filesout");
    let url = pg.url("sy_filesout");
    let dir = TempDir::new("files-submit");
    dir.write("flow.yaml", ITEM_FLOW);
    let ids = [
        json!("a/b"),
        json!("a_b"),
        json!("A_B"),
        json!(7),
        json!("../up"),
        json!("ok"),
    ];
    let lines: String = ids
        .iter()
        .enumerate()
        .map(|(i, id)| json!({"id": id, "pair": i / 2, "sleep": 0}).to_string() + "\n")
        .collect();
    dir.write("in.jsonl", lines);
    let out = run(switchyard(dir.path()).args([
        "submit",
        "flow.yaml",
        "--input",
        "in.jsonl",
        "--batch",
        "fb",
        "--store",
        &url,
    ]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    // The worker runs elsewhere, without the flow or its script.
    let elsewhere = TempDir::new("files-worker");
    let mut w = spawn_worker(&elsewhere, &url, "w", &["--exit-when-idle"]);
    let status = wait_exit(&mut w, Duration::from_secs(120), "the worker");
    assert!(status.success(), "{}", log_of(&elsewhere, "w"));

    let collect = run(switchyard(dir.path()).args([
        "collect",
        "--batch",
        "fb",
        "--output",
        "out.jsonl",
        "--files",
        "files",
        "--store",
        &url,
    ]));
    assert_eq!(collect.code(), 0, "{}", collect.stderr);
    let got = walk(&dir.path().join("files"));
    let dirs = ["a_b", "a_b-2", "A_B-3", "7", ".._up", "ok"];
    let expected: BTreeMap<String, Vec<u8>> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("{d}/out.bin"), item_bytes(i)))
        .collect();
    assert_eq!(got, expected);
    let lines: Vec<Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), ids.len());
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["id"], ids[i]);
        assert_eq!(l["files"][0]["file"], hash(&item_bytes(i)), "{l}");
    }
    // Collected again: the same directories, nothing added.
    let again = run(switchyard(dir.path()).args([
        "collect",
        "--batch",
        "fb",
        "--output",
        "out.jsonl",
        "--files",
        "files",
        "--store",
        &url,
    ]));
    assert_eq!(again.code(), 0, "{}", again.stderr);
    assert_eq!(walk(&dir.path().join("files")), expected);
}

/// `keep` makes a file that stays on the record; `bad` makes one and then fails its
/// `result_schema`, so its file is stored but on no record.
const ORPHAN_FLOW: &str = r#"
flow: orphan
agents:
  keep:
    kind: command
    run: [python3, make.py, keep]
    cwd: .
  bad:
    kind: command
    run: [python3, make.py, bad]
    cwd: .
    result_schema: {type: object, required: [ok]}
steps:
  keep:
    agent: keep
    output: {$.kept: $}
    next: bad
  bad:
    agent: bad
"#;

/// `backdate` moves every stored file's time two minutes back, past `runs prune`'s floor.
fn prune_keeps_referenced_files(
    dir: &TempDir,
    store: &str,
    count_files: impl Fn() -> u64,
    backdate: impl Fn(),
) {
    dir.write("make.py", MAKE);
    dir.write("flow.yaml", ORPHAN_FLOW);
    let input = json!({"keep": [["kept.txt", "kept bytes"]], "bad": [["orphan.txt", "orphan bytes!"]]});
    let out = run(switchyard(dir.path()).args([
        "run",
        "flow.yaml",
        "--input",
        &input.to_string(),
        "--store",
        store,
    ]));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("invalid_output"), "{}", out.stderr);
    assert_eq!(count_files(), 2);

    // Within the grace period nothing goes, nor within the floor of a minute.
    let p = run(switchyard(dir.path()).args(["runs", "prune", "--store", store]));
    assert_eq!(p.code(), 0, "{}", p.stderr);
    assert!(p.stdout.starts_with("removed 0 file(s), 0 bytes"), "{}", p.stdout);
    let p = run(switchyard(dir.path()).args(["runs", "prune", "--older-than", "0s", "--store", store]));
    assert!(
        p.stdout
            .starts_with("removed 0 file(s), 0 bytes: stored more than 1m ago"),
        "{}",
        p.stdout
    );
    backdate();
    let p =
        run(switchyard(dir.path()).args(["runs", "prune", "--older-than", "0s", "--json", "--store", store]));
    assert_eq!(p.code(), 0, "{}", p.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(&p.stdout).unwrap(),
        json!({"files": 1, "bytes": 13})
    );
    assert_eq!(count_files(), 1);
    let again = run(switchyard(dir.path()).args(["runs", "prune", "--older-than", "0s", "--store", store]));
    assert!(
        again.stdout.starts_with("removed 0 file(s), 0 bytes"),
        "{}",
        again.stdout
    );

    // The referenced file is whole.
    let id = only_run(dir, store);
    let w = run(switchyard(dir.path()).args(["runs", "files", &id, "--output", "kept", "--store", store]));
    assert_eq!(w.code(), 0, "{}", w.stderr);
    assert_eq!(
        walk(&dir.path().join("kept")),
        [("kept.txt".to_string(), b"kept bytes".to_vec())]
            .into_iter()
            .collect()
    );
}

#[test]
fn runs_prune_removes_bytes_on_no_record_and_keeps_the_rest_on_sqlite() {
    let dir = TempDir::new("files-prune");
    prune_keeps_referenced_files(
        &dir,
        SQLITE,
        || stored(&dir).0,
        || {
            sqlite(
                &dir,
                "db.execute('UPDATE files SET created_at = created_at - 120000')",
            );
        },
    );
}

#[test]
fn runs_prune_removes_bytes_on_no_record_and_keeps_the_rest_on_postgres() {
    let pg = Pg::new("fprune");
    let dir = TempDir::new("files-prune-pg");
    prune_keeps_referenced_files(
        &dir,
        &pg.url("sy_fprune"),
        || pg.count("SELECT COUNT(*) FROM files") as u64,
        || {
            pg.query("UPDATE files SET created_at = created_at - 120000");
        },
    );
}

/// A real 3×2 RGB PNG.
fn png_bytes() -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, 3, 2);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().expect("png header");
        w.write_image_data(&[255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 9, 9, 200, 100, 50, 1, 2, 3])
            .expect("png data");
    }
    out
}

#[test]
fn the_run_page_shows_raster_thumbnails_and_runs_no_script_of_names_or_svg() {
    let dir = TempDir::new("files-page");
    dir.write("make.py", MAKE);
    dir.write("flow.yaml", TWO_MAKERS);
    let hostile = "<img src=x onerror=alert(1)>.png";
    let png: String = png_bytes().iter().map(|&b| b as char).collect();
    let svg = r#"<svg xmlns="http://www.w3.org/2000/svg" onload="alert(2)"><script>alert(3)</script></svg>"#;
    let input = json!({
        "first": [[hostile, png], ["evil.svg", svg]],
        "second": [["page.html", "<script>alert(4)</script>"]],
    });
    let out = run(switchyard(dir.path()).args([
        "run",
        "flow.yaml",
        "--input",
        &input.to_string(),
        "--store",
        SQLITE,
    ]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let id = only_run(&dir, SQLITE);

    let text = run(switchyard(dir.path()).args(["runs", "show", &id, "--store", SQLITE]));
    assert!(text.stdout.contains("files     3 ("), "{}", text.stdout);
    assert!(
        text.stdout.contains(hostile) && text.stdout.contains("image/svg+xml"),
        "{}",
        text.stdout
    );

    let page = run(switchyard(dir.path()).args(["runs", "show", &id, "--format", "html", "--store", SQLITE]));
    assert_eq!(page.code(), 0, "{}", page.stderr);
    assert_eq!(page.stdout.matches("src=\"data:").count(), 1, "one thumbnail");
    let path = dir.write("page.html", &page.stdout);

    let driver = crate::report::Driver::start();
    let s = crate::report::Session::new(&driver, &dir.path().join("profile"));
    s.post("/url", json!({"url": format!("file://{}", path.display())}));
    let state = s.script(
        "var imgs = Array.from(document.querySelectorAll('img'));
         return {
           imgs: imgs.map(i => [i.className, i.alt, i.complete, i.naturalWidth, i.naturalHeight,
                                getComputedStyle(i).maxWidth]),
           rows: Array.from(document.querySelectorAll('#files tr.file')).map(r =>
                   Array.from(r.cells).slice(0, 4).map(c => c.textContent)),
           scripts: document.scripts.length,
           handlers: document.querySelectorAll('[onerror],[onload]').length,
           svgs: document.querySelectorAll('#files svg').length,
         };",
    );
    assert_eq!(
        state["imgs"],
        json!([["thumb", hostile, true, 3, 2, "160px"]]),
        "{state}"
    );
    assert_eq!(
        state["rows"],
        json!([
            ["1", hostile, "image/png", png_bytes().len().to_string()],
            ["1", "evil.svg", "image/svg+xml", svg.len().to_string()],
            ["2", "page.html", "text/html", "25"],
        ]),
        "{state}"
    );
    assert_eq!(state["scripts"], 2, "the page's own two: {state}");
    assert_eq!(state["handlers"], 0, "{state}");
    assert_eq!(state["svgs"], 0, "{state}");
    // No alert is open, and nothing went to the console as an error.
    let alert = driver_alert(&s);
    assert!(alert.is_none(), "an alert ran: {alert:?}");
    assert_eq!(s.console_errors(), Vec::<String>::new());
}

/// The text of an open alert, if one is open.
fn driver_alert(s: &crate::report::Session) -> Option<String> {
    s.try_get("/alert/text")
        .ok()
        .and_then(|v| v.as_str().map(String::from))
}
