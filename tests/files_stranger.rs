//! Files used the way someone new to them would, together with the rest (SPEC §6.5): what a
//! killed switchyard leaves behind, `--files` and `--output` pointed at the wrong thing, a
//! damaged store read back.

use std::path::Path;

use crate::support::{TempDir, run, switchyard};

/// A flow whose `command` agent writes one file and prints `{"ok": true}`.
const ONE_FILE: &str = r#"flow: one_file
agents:
  tool:
    kind: command
    run: [sh, -c, 'cat >/dev/null; printf made > "$SWITCHYARD_OUTPUT_DIR/made.txt"; echo "{\"ok\": true}"']
steps:
  only:
    agent: tool
    output: {$.result: $}
"#;

/// The `switchyard-command-*` entries under `tmp`, sorted.
fn command_dirs(tmp: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(tmp)
        .expect("tmp")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("switchyard-command-"))
        .collect();
    names.sort();
    names
}

/// A pid that no process has: one of a child that has been reaped.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().expect("true");
    let pid = child.id();
    child.wait().expect("reaped");
    pid
}

#[test]
fn directories_a_killed_switchyard_left_are_removed_by_the_next_one() {
    // A switchyard killed after its program exited and before it removed the call's
    // directories leaves them, full of the program's files; no supervisor is left to remove
    // them. The next switchyard that runs a command removes those of dead processes only.
    let dir = TempDir::new("files-stranger");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    let dead = dead_pid();
    let left = [
        format!("switchyard-command-{dead}-3-1cea7ea2-in"),
        format!("switchyard-command-{dead}-3-1cea7ea2-out"),
    ];
    for d in &left {
        std::fs::create_dir(tmp.join(d)).expect("left dir");
        std::fs::write(tmp.join(d).join("f0.txt"), "a file of a dead call").expect("file");
    }
    // A live process's (this test's) directories and other names are not touched.
    let live = format!("switchyard-command-{}-0-0badf00d-out", std::process::id());
    std::fs::create_dir(tmp.join(&live)).expect("live dir");
    std::fs::create_dir(tmp.join("switchyard-command-notes")).expect("other dir");
    dir.write("flow.yaml", ONE_FILE);
    let out = run(switchyard(dir.path())
        .args(["run", "flow.yaml", "--input", "{}", "--store", "sqlite:runs.db"])
        .env("TMPDIR", &tmp));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(command_dirs(&tmp), [live, "switchyard-command-notes".to_string()]);
}

/// `sha256:` and the hex digest of `bytes`.
fn hash(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Runs `code` with `db`, the SQLite store `runs.db` of `dir`, and commits.
fn sqlite(dir: &TempDir, code: &str) {
    let script = format!("import sqlite3\ndb = sqlite3.connect('runs.db')\n{code}\ndb.commit()\n");
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .current_dir(dir.path())
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn files_pointed_at_a_file_is_refused_before_any_run_starts() {
    let dir = TempDir::new("files-stranger");
    dir.write("flow.yaml", ONE_FILE);
    dir.write("in.jsonl", "{\"id\": 1}\n{\"id\": 2}\n");
    dir.write("taken", "a file, not a directory");
    let out = run(switchyard(dir.path()).args([
        "batch",
        "flow.yaml",
        "--input",
        "in.jsonl",
        "--output",
        "out.jsonl",
        "--files",
        "taken",
        "--store",
        "sqlite:runs.db",
    ]));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert_eq!(
        out.stderr.trim(),
        "error: --files: cannot write taken: it is there and is not a directory"
    );
    // Nothing ran: no output, no run, no file; the file in the way is as it was.
    assert!(!dir.path().join("out.jsonl").exists());
    assert!(!dir.path().join("runs.db").exists());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("taken")).unwrap(),
        "a file, not a directory"
    );

    // `runs files --output` at a file says the same, and writes nothing.
    let ran =
        run(switchyard(dir.path()).args(["run", "flow.yaml", "--input", "{}", "--store", "sqlite:runs.db"]));
    assert_eq!(ran.code(), 0, "{}", ran.stderr);
    let list = run(switchyard(dir.path()).args(["runs", "list", "--json", "--store", "sqlite:runs.db"]));
    let id =
        serde_json::from_str::<serde_json::Value>(list.stdout.lines().next().expect("a run")).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
    let out = run(switchyard(dir.path()).args([
        "runs",
        "files",
        &id,
        "--output",
        "taken",
        "--store",
        "sqlite:runs.db",
    ]));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert_eq!(
        out.stderr.trim(),
        "error: --output: cannot write taken: it is there and is not a directory"
    );
    assert_eq!(out.stdout, "");
}

#[test]
fn a_damaged_file_stops_the_writing_and_the_count_and_name_say_what_happened() {
    let dir = TempDir::new("files-stranger");
    dir.write(
        "flow.yaml",
        r#"flow: two_files
agents:
  tool:
    kind: command
    run: [python3, -c, 'import os, sys; sys.stdin.read(); d = os.environ["SWITCHYARD_OUTPUT_DIR"]; open(d + "/a.txt", "w").write("first"); open(d + "/b\nc.txt", "w").write("second"); print("{}")']
steps:
  only:
    agent: tool
    output: {$.result: $}
"#,
    );
    let ran =
        run(switchyard(dir.path()).args(["run", "flow.yaml", "--input", "{}", "--store", "sqlite:runs.db"]));
    assert_eq!(ran.code(), 0, "{}", ran.stderr);
    let list = run(switchyard(dir.path()).args(["runs", "list", "--json", "--store", "sqlite:runs.db"]));
    let id =
        serde_json::from_str::<serde_json::Value>(list.stdout.lines().next().expect("a run")).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
    let b = hash(b"second");
    sqlite(
        &dir,
        &format!("db.execute(\"UPDATE file_chunks SET data = ? WHERE hash = '{b}'\", (b'Second',))"),
    );
    let out = run(switchyard(dir.path()).args([
        "runs",
        "files",
        &id,
        "--output",
        "out",
        "--store",
        "sqlite:runs.db",
    ]));
    assert_eq!(out.code(), 1, "{}\n{}", out.stdout, out.stderr);
    // `a.txt` was written before `b\nc.txt` stopped the writing, and the count says so.
    assert!(
        out.stdout
            .contains("wrote 1 file(s) under out (0 there already with the same bytes)"),
        "{}",
        out.stdout
    );
    assert_eq!(std::fs::read(dir.path().join("out/a.txt")).unwrap(), b"first");
    let mut names: Vec<String> = std::fs::read_dir(dir.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a.txt"], "no partial file is left");
    // The error is one line: the name's newline escaped, the hash named.
    let err = out.stderr.trim_end();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("error: file `b\\nc.txt` ({b}): ")),
        "{err}"
    );
    assert!(err.ends_with("the store is damaged"), "{err}");

    // Bytes of another length say so, not that chunks are missing.
    sqlite(
        &dir,
        &format!("db.execute(\"UPDATE file_chunks SET data = ? WHERE hash = '{b}'\", (b'second!',))"),
    );
    let out = run(switchyard(dir.path()).args([
        "runs",
        "files",
        &id,
        "--output",
        "out2",
        "--store",
        "sqlite:runs.db",
    ]));
    assert_eq!(out.code(), 1, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.trim_end().ends_with(&format!(
            "the bytes stored for file {b} are 7 bytes, not 6: the store is damaged"
        )),
        "{}",
        out.stderr
    );
}

#[test]
fn lint_wants_max_attach_bytes_of_at_least_one_byte_like_the_other_file_limits() {
    let dir = TempDir::new("files-stranger");
    dir.write(
        "flow.yaml",
        r#"flow: attach
providers:
  local: {base_url: "http://127.0.0.1:9/v1"}
agents:
  read:
    kind: llm
    provider: local
    model: m
    prompt: Read it.
    attach: =input.scan
    max_attach_bytes: 0
  wide:
    kind: llm
    provider: local
    model: m
    prompt: Read it.
    attach: =input.scan
    max_attach_bytes: 17GiB
steps:
  read: {agent: read, output: {$.text: $}, next: wide}
  wide: {agent: wide, output: {$.wide: $}}
"#,
    );
    let out = crate::support::lint_json(dir.path(), &["flow.yaml"]);
    let found: Vec<(String, usize, usize, String)> = out
        .diagnostics()
        .into_iter()
        .map(|d| (d.code, d.line, d.column, d.message))
        .collect();
    assert_eq!(
        found,
        [
            (
                "SY302".to_string(),
                11,
                23,
                "`max_attach_bytes` is 0 bytes, outside 1 byte..=16GiB".to_string()
            ),
            (
                "SY302".to_string(),
                18,
                23,
                "`max_attach_bytes` is 18253611008 bytes, outside 1 byte..=16GiB".to_string()
            ),
        ]
    );
}

#[test]
fn a_binary_file_whose_first_bytes_are_not_text_is_stored_not_a_panic() {
    // Random bytes, a gzip header: the sniffer reads them as text with replacement characters
    // and must not cut one in half.
    let dir = TempDir::new("files-stranger");
    dir.write(
        "flow.yaml",
        r#"flow: binary
agents:
  tool:
    kind: command
    run: [python3, -c, 'import os, sys; sys.stdin.read(); d = os.environ["SWITCHYARD_OUTPUT_DIR"]; open(d + "/a.bin", "wb").write(b"abcdefg\xffhijk"); open(d + "/b.gz", "wb").write(bytes([0x1f, 0x8b, 8, 0, 0xa5, 0xd2, 0x9c, 1, 0xff, 3])); print("{}")']
steps:
  only:
    agent: tool
    output: {$.result: $}
"#,
    );
    let out =
        run(switchyard(dir.path()).args(["run", "flow.yaml", "--input", "{}", "--store", "sqlite:runs.db"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(
        output["result"]["files"],
        serde_json::json!([
            {"file": hash(b"abcdefg\xffhijk"), "name": "a.bin", "media_type": "application/octet-stream", "size": 12},
            {"file": hash(&[0x1f, 0x8b, 8, 0, 0xa5, 0xd2, 0x9c, 1, 0xff, 3]), "name": "b.gz", "media_type": "application/gzip", "size": 10},
        ])
    );
}

#[test]
fn a_text_file_that_opens_with_bm_is_text_not_a_bitmap() {
    // `BM` alone made any such text `image/bmp`: shown as a broken thumbnail on the run page
    // and sent to a model as an image.
    let dir = TempDir::new("files-stranger");
    dir.write(
        "flow.yaml",
        r#"flow: cars
agents:
  tool:
    kind: command
    run: [sh, -c, 'cat >/dev/null; printf "BMW sales rose in March, Audi fell.\n" > "$SWITCHYARD_OUTPUT_DIR/cars.txt"; echo "{}"']
steps:
  only:
    agent: tool
    output: {$.result: $}
"#,
    );
    let out =
        run(switchyard(dir.path()).args(["run", "flow.yaml", "--input", "{}", "--store", "sqlite:runs.db"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    let text = b"BMW sales rose in March, Audi fell.\n";
    assert_eq!(
        output["result"]["files"],
        serde_json::json!([{"file": hash(text), "name": "cars.txt", "media_type": "text/plain", "size": text.len()}])
    );
}

#[test]
fn a_mock_file_that_is_a_fifo_or_a_directory_is_refused_not_waited_on() {
    let dir = TempDir::new("files-stranger");
    std::fs::create_dir(dir.path().join("adir")).expect("dir");
    let made = std::process::Command::new("mkfifo")
        .arg(dir.path().join("pipe"))
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let flow = |path: &str| {
        format!(
            r#"flow: scans
agents:
  scanner: {{kind: mock, returns: {{x: 1}}}}
steps:
  scan: {{agent: scanner, output: {{$.scan: $}}}}
tests:
  - name: the scan is stored
    input: {{}}
    mocks:
      scanner:
        returns: {{f: {{file: {{path: {path}}}}}}}
    expect: {{status: succeeded}}
"#
        )
    };
    for path in ["adir", "pipe"] {
        dir.write("flow.yaml", flow(path));
        let out = crate::support::lint_json(dir.path(), &["flow.yaml"]);
        let found: Vec<(String, usize, usize, String)> = out
            .diagnostics()
            .into_iter()
            .map(|d| (d.code, d.line, d.column, d.message))
            .collect();
        assert_eq!(
            found,
            [(
                "SY210".to_string(),
                11,
                36,
                format!("cannot read `{path}`: not a regular file")
            )],
            "{path}"
        );
        // `test` refuses it in the same words, at once (a FIFO no longer blocks it).
        let tested = run(switchyard(dir.path()).args(["test", "flow.yaml"]));
        assert_eq!(tested.code(), 2, "{}\n{}", tested.stdout, tested.stderr);
        assert!(
            tested
                .stderr
                .contains(&format!("cannot read `{path}`: not a regular file")),
            "{}",
            tested.stderr
        );
    }
}
