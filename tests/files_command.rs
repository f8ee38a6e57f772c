//! Files out of `command` agents and into them (SPEC §6.5), through `switchyard run` on SQLite
//! and PostgreSQL: what a program writes under `$SWITCHYARD_OUTPUT_DIR` becomes files of its
//! result and of the run's record, by hash and in name order; what its input document refers
//! to is written under `$SWITCHYARD_INPUT_DIR` with the references rewritten to paths; both
//! directories are fresh per call and gone after it.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::Digest;

use crate::cluster::Pg;
use crate::engine::run_error;
use crate::support::{self, TempDir, run, switchyard};

/// `sha256:` and the hex digest of `bytes`.
fn hash(bytes: &[u8]) -> String {
    let digest = sha2::Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
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

/// Writes `scripts` (name, Python source) and the flow into `dir`; returns the flow's path.
fn project(dir: &TempDir, flow: &str, scripts: &[(&str, &str)]) -> PathBuf {
    for (name, source) in scripts {
        dir.write(name, source);
    }
    dir.write("flow.yaml", flow)
}

/// The SQLite store of a test's directory.
const SQLITE: &str = "sqlite:runs.db";

/// `switchyard run flow.yaml --input INPUT` in `dir`, on `store` (SQLite when `None`).
fn run_flow(dir: &TempDir, input: &Value, store: Option<&str>) -> support::Output {
    let mut cmd = switchyard(dir.path());
    cmd.args(["run", "flow.yaml", "--input", &input.to_string()])
        .args(["--store", store.unwrap_or(SQLITE)]);
    run(&mut cmd)
}

/// `runs show --json` of the only run in the store.
fn the_run(dir: &TempDir, store: Option<&str>) -> Value {
    let with_store = |cmd: &mut std::process::Command| {
        cmd.args(["--store", store.unwrap_or(SQLITE)]);
    };
    let mut list = switchyard(dir.path());
    list.args(["runs", "list", "--json"]);
    with_store(&mut list);
    let list = run(&mut list);
    let lines: Vec<&str> = list.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one run: {}", list.stdout);
    let id = serde_json::from_str::<Value>(lines[0]).expect("JSON")["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let mut show = switchyard(dir.path());
    show.args(["runs", "show", &id, "--json"]);
    with_store(&mut show);
    let show = run(&mut show);
    assert_eq!(show.code(), 0, "{}", show.stderr);
    serde_json::from_str(&show.stdout).expect("JSON")
}

/// The hashes of the bytes in the SQLite store of `dir`, sorted.
fn stored_hashes(dir: &TempDir) -> Vec<String> {
    use sqlx::Connection;
    let url = format!("sqlite://{}", dir.path().join("runs.db").display());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut conn = sqlx::SqliteConnection::connect(&url).await.expect("open runs.db");
        sqlx::query_scalar("SELECT hash FROM files ORDER BY hash")
            .fetch_all(&mut conn)
            .await
            .expect("query files")
    })
}

/// The step records numbered `number`, every attempt.
fn records<'a>(doc: &'a Value, number: &str) -> Vec<&'a Value> {
    doc["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|s| s["number"] == number)
        .collect()
}

const MAKE: &str = r#"
import json, os, shutil, sys
out = os.environ["SWITCHYARD_OUTPUT_DIR"]
os.makedirs(os.path.join(out, "out"))
with open(os.path.join(out, "out", "a.txt"), "wb") as f:
    f.write(b"hello, files\n")
shutil.copy(sys.argv[1], os.path.join(out, "pic.png"))
print(json.dumps({"out_dir": out, "in_dir": os.environ["SWITCHYARD_INPUT_DIR"]}))
"#;

/// Reads every rewritten reference of `docs`: where it is, its members, and the sha256 of the
/// bytes at its path.
const READ: &str = r#"
import hashlib, json, os, sys
doc = json.load(sys.stdin)
in_dir = os.environ["SWITCHYARD_INPUT_DIR"]
seen = []
for d in doc["docs"]:
    p = d["path"]
    with open(p, "rb") as f:
        data = f.read()
    seen.append({
        "keys": sorted(d),
        "absolute": os.path.isabs(p),
        "rel": os.path.relpath(p, in_dir),
        "name": d["name"],
        "media_type": d["media_type"],
        "size": d["size"],
        "hash": "sha256:" + hashlib.sha256(data).hexdigest(),
    })
print(json.dumps({"seen": seen, "argv": sys.argv[1:], "in_dir": in_dir,
                  "out_dir": os.environ["SWITCHYARD_OUTPUT_DIR"]}))
"#;

const ROUND_TRIP: &str = r#"
flow: files_round_trip
agents:
  make:
    kind: command
    run: [python3, make.py, pic-source.png]
    cwd: .
  read:
    kind: command
    run: [python3, read.py, "{{ input.docs[1].path }}"]
    cwd: .
steps:
  make:
    agent: make
    output: {$.made: $}
    next: read
  read:
    agent: read
    input: {$.docs: $.made.files}
    output: {$.read: $}
"#;

/// A command writes a text file (in a subdirectory) and a PNG; a second command finds them
/// under its input directory, byte for byte, and its argument template sees their paths; the
/// run's record lists them with the number of the step that made them.
fn round_trip(store: Option<&str>) {
    let dir = TempDir::new("files-cmd");
    let png = png_bytes();
    dir.write("pic-source.png", &png);
    project(&dir, ROUND_TRIP, &[("make.py", MAKE), ("read.py", READ)]);
    let out = run_flow(&dir, &json!({}), store);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("JSON");

    let text_ref = json!({
        "file": hash(b"hello, files\n"),
        "name": "out/a.txt",
        "media_type": "text/plain",
        "size": 13,
    });
    let png_ref = json!({
        "file": hash(&png),
        "name": "pic.png",
        "media_type": "image/png",
        "size": png.len(),
    });
    assert_eq!(output["made"]["files"], json!([text_ref, png_ref]));

    let read = &output["read"];
    let seen = |r: &Value, rel: &str| {
        json!({
            "keys": ["media_type", "name", "path", "size"],
            "absolute": true,
            "rel": rel,
            "name": r["name"],
            "media_type": r["media_type"],
            "size": r["size"],
            "hash": r["file"],
        })
    };
    assert_eq!(
        read["seen"],
        json!([seen(&text_ref, "out/a.txt"), seen(&png_ref, "pic.png")])
    );
    let in_dir = read["in_dir"].as_str().expect("in_dir");
    assert_eq!(read["argv"], json!([format!("{in_dir}/pic.png")]));

    // Every directory of both calls is gone, and no two were the same.
    let dirs = [
        &output["made"]["out_dir"],
        &output["made"]["in_dir"],
        &read["out_dir"],
        &read["in_dir"],
    ]
    .map(|d| d.as_str().expect("a path").to_owned());
    for d in &dirs {
        assert!(Path::new(d).is_absolute(), "{d}");
        assert!(!Path::new(d).exists(), "{d} outlived its call");
    }
    assert_ne!(dirs[0], dirs[2]);
    assert_ne!(dirs[1], dirs[3]);

    // The record: the files by the number of the step that made them; the reading step made
    // none and its recorded input keeps the references.
    let doc = the_run(&dir, store);
    let numbered = |r: &Value| {
        let mut v = json!({"number": "1"});
        v.as_object_mut()
            .expect("an object")
            .extend(r.as_object().expect("a reference").clone());
        v
    };
    assert_eq!(
        doc["run"]["files"],
        json!([numbered(&text_ref), numbered(&png_ref)])
    );
    let read_rec = records(&doc, "2");
    assert_eq!(read_rec.len(), 1);
    assert_eq!(read_rec[0]["input"], json!({"docs": [text_ref, png_ref]}));
    assert!(
        read_rec[0]["files"].as_array().is_none_or(|f| f.is_empty()),
        "{}",
        read_rec[0]
    );
}

#[test]
fn a_commands_files_reach_the_next_command_byte_for_byte_on_sqlite() {
    round_trip(None);
}

#[test]
fn a_commands_files_reach_the_next_command_byte_for_byte_on_postgres() {
    let pg = Pg::new("files_cmd");
    let url = pg.url("files_cmd");
    round_trip(Some(&url));
    let rows = pg.query("SELECT hash, size FROM files ORDER BY size");
    let got: Vec<(Option<String>, Option<String>)> = rows
        .iter()
        .map(|r| (r["hash"].clone(), r["size"].clone()))
        .collect();
    assert_eq!(
        got,
        [(Some(hash(b"hello, files\n")), Some("13".into())), {
            let png = png_bytes();
            (Some(hash(&png)), Some(png.len().to_string()))
        }]
    );
}

/// A flow of one step calling a command that runs `script` (sh) with `args`.
fn one_command(script: &str, step: &str) -> String {
    format!(
        r#"
flow: one_command
agents:
  tool:
    kind: command
    run: [sh, -c, '{script}']
steps:
  only:
    agent: tool
    output: {{$.result: $}}
{step}
"#
    )
}

#[test]
fn nested_files_are_named_by_their_paths_in_name_order_and_symlinks_are_not_taken() {
    let dir = TempDir::new("files-cmd");
    let script = r#"cd "$SWITCHYARD_OUTPUT_DIR" && mkdir -p b/c empty && printf z > z.txt && printf d > b/c/d.txt && printf ba > b/a.txt && printf A > A.txt && printf 0 > "b/c/sp ace.txt" && ln -s z.txt link.txt && ln -s b dirlink && echo "{\"ok\": true}""#;
    project(&dir, &one_command(script, ""), &[]);
    let out = run_flow(&dir, &json!({}), None);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("JSON");
    let files = output["result"]["files"].as_array().expect("files");
    let got: Vec<(&str, &str, u64)> = files
        .iter()
        .map(|f| {
            (
                f["name"].as_str().expect("name"),
                f["file"].as_str().expect("hash"),
                f["size"].as_u64().expect("size"),
            )
        })
        .collect();
    let (a, ba, d, sp, z) = (hash(b"A"), hash(b"ba"), hash(b"d"), hash(b"0"), hash(b"z"));
    assert_eq!(
        got,
        [
            ("A.txt", a.as_str(), 1),
            ("b/a.txt", ba.as_str(), 2),
            ("b/c/d.txt", d.as_str(), 1),
            ("b/c/sp ace.txt", sp.as_str(), 1),
            ("z.txt", z.as_str(), 1),
        ]
    );
    assert_eq!(output["result"]["ok"], json!(true));
    assert!(
        out.stderr
            .contains("a symlink in $SWITCHYARD_OUTPUT_DIR is not taken"),
        "a skipped symlink is warned about: {}",
        out.stderr
    );
    let doc = the_run(&dir, None);
    let names: Vec<&str> = doc["run"]["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        ["A.txt", "b/a.txt", "b/c/d.txt", "b/c/sp ace.txt", "z.txt"]
    );
}

#[test]
fn a_command_with_files_that_prints_no_object_fails_with_invalid_output() {
    let dir = TempDir::new("files-cmd");
    let script = r#"printf x > "$SWITCHYARD_OUTPUT_DIR/x.txt"; printf y > "$SWITCHYARD_OUTPUT_DIR/y.txt"; echo "[1, 2]""#;
    project(&dir, &one_command(script, ""), &[]);
    let out = run_flow(&dir, &json!({}), None);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(
        run_error(&out),
        (
            "invalid_output".to_owned(),
            "step `only`: command `sh` wrote 2 files to $SWITCHYARD_OUTPUT_DIR but printed an array, \
             not a JSON object (a command with files must print an object: its result gets them as `files`)"
                .to_owned()
        )
    );
    let doc = the_run(&dir, None);
    assert!(
        doc["run"]["files"].as_array().is_none_or(|f| f.is_empty()),
        "{}",
        doc["run"]
    );

    let dir = TempDir::new("files-cmd");
    let script = r#"printf x > "$SWITCHYARD_OUTPUT_DIR/x.txt"; echo "{\"files\": []}""#;
    project(&dir, &one_command(script, ""), &[]);
    let out = run_flow(&dir, &json!({}), None);
    assert_eq!(
        run_error(&out),
        (
            "invalid_output".to_owned(),
            "step `only`: command `sh` wrote 1 file to $SWITCHYARD_OUTPUT_DIR and printed an object with a \
             `files` member of its own: the result's `files` is where the written files go"
                .to_owned()
        )
    );
}

#[test]
fn a_failed_attempt_leaves_no_files_on_the_record_and_no_directory_behind() {
    let dir = TempDir::new("files-cmd");
    // Attempt 1 writes a file and fails; attempt 2 writes another and succeeds. Each notes its
    // output directory in dirs.txt.
    let log = dir.path().join("dirs.txt");
    let script = format!(
        r#"echo "$SWITCHYARD_OUTPUT_DIR" >> {log}; printf "attempt $SWITCHYARD_ATTEMPT" > "$SWITCHYARD_OUTPUT_DIR/attempt-$SWITCHYARD_ATTEMPT.txt"; if [ "$SWITCHYARD_ATTEMPT" = 1 ]; then echo boom >&2; exit 3; fi; echo "{{\"attempt\": $SWITCHYARD_ATTEMPT}}""#,
        log = log.display()
    );
    let flow = one_command(
        &script,
        "    retry: {attempts: 2, backoff: 1ms, jitter: 0, on: [agent]}",
    );
    project(&dir, &flow, &[]);
    let out = run_flow(&dir, &json!({}), None);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("JSON");
    let second = json!({
        "file": hash(b"attempt 2"),
        "name": "attempt-2.txt",
        "media_type": "text/plain",
        "size": 9,
    });
    assert_eq!(output["result"], json!({"attempt": 2, "files": [second]}));
    let doc = the_run(&dir, None);
    // The step's record is its last attempt's, with that attempt's file only.
    let attempts = records(&doc, "1");
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["attempt"], json!(2));
    let mut numbered = second.clone();
    numbered["number"] = json!("1");
    assert_eq!(attempts[0]["files"], json!([numbered]));
    let names: Vec<&str> = doc["run"]["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["attempt-2.txt"]);
    // The failed attempt's bytes never reached the store.
    assert_eq!(stored_hashes(&dir), [hash(b"attempt 2")]);
    let dirs = std::fs::read_to_string(&log).expect("dirs.txt");
    let dirs: Vec<&str> = dirs.lines().collect();
    assert_eq!(dirs.len(), 2, "{dirs:?}");
    assert_ne!(dirs[0], dirs[1]);
    for d in dirs {
        assert!(!Path::new(d).exists(), "{d} outlived its attempt");
    }
}

#[test]
fn a_timed_out_command_leaves_no_files_and_no_directory() {
    let dir = TempDir::new("files-cmd");
    let log = dir.path().join("dir.txt");
    let script = format!(
        r#"printf x > "$SWITCHYARD_OUTPUT_DIR/x.txt"; echo "$SWITCHYARD_OUTPUT_DIR" > {log}; sleep 30"#,
        log = log.display()
    );
    let flow = one_command(&script, "    timeout: 500ms");
    project(&dir, &flow, &[]);
    let out = run_flow(&dir, &json!({}), None);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(run_error(&out).0, "timeout");
    let doc = the_run(&dir, None);
    assert!(
        doc["run"]["files"].as_array().is_none_or(|f| f.is_empty()),
        "{}",
        doc["run"]
    );
    let d = std::fs::read_to_string(&log).expect("dir.txt");
    assert!(!Path::new(d.trim()).exists(), "{d} outlived the timeout");
}

#[test]
fn concurrent_iterations_of_a_foreach_get_directories_of_their_own() {
    let dir = TempDir::new("files-cmd");
    // Each iteration notes its directory, then waits (up to 10s) until the other has noted its
    // own, so both are in flight together; then writes its index into a file of the same name.
    let script = r#"
import json, os, sys, time
i = json.load(sys.stdin)["i"]
out = os.environ["SWITCHYARD_OUTPUT_DIR"]
with open(f"seen-{i}", "w") as f:
    f.write(out)
deadline = time.monotonic() + 10
while not os.path.exists(f"seen-{1 - i}") and time.monotonic() < deadline:
    time.sleep(0.01)
both = os.path.exists(f"seen-{1 - i}")
with open(os.path.join(out, "item.txt"), "w") as f:
    f.write(f"item {i}")
print(json.dumps({"i": i, "both": both, "out_dir": out, "in_dir": os.environ["SWITCHYARD_INPUT_DIR"]}))
"#;
    let flow = r#"
flow: foreach_files
agents:
  item:
    kind: command
    run: [python3, item.py]
    cwd: .
steps:
  each:
    foreach: $.items
    concurrency: 2
    agent: item
    input: {$.i: =item}
    output: {$.results: $}
"#;
    project(&dir, flow, &[("item.py", script)]);
    let out = run_flow(&dir, &json!({"items": [0, 1]}), None);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("JSON");
    let results = output["results"].as_array().expect("results");
    assert_eq!(results.len(), 2);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["i"], json!(i));
        assert_eq!(r["both"], json!(true), "both iterations in flight together");
        let text = format!("item {i}");
        assert_eq!(
            r["files"],
            json!([{"file": hash(text.as_bytes()), "name": "item.txt", "media_type": "text/plain", "size": 6}])
        );
    }
    let dirs: Vec<&str> = results
        .iter()
        .flat_map(|r| [&r["out_dir"], &r["in_dir"]])
        .map(|d| d.as_str().expect("a path"))
        .collect();
    let distinct: std::collections::HashSet<&&str> = dirs.iter().collect();
    assert_eq!(distinct.len(), 4, "{dirs:?}");
    for d in &dirs {
        assert!(!Path::new(d).exists(), "{d} outlived its iteration");
    }
    let doc = the_run(&dir, None);
    let files: Vec<(&str, &str)> = doc["run"]["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            (
                f["number"].as_str().expect("number"),
                f["file"].as_str().expect("hash"),
            )
        })
        .collect();
    let (h0, h1) = (hash(b"item 0"), hash(b"item 1"));
    assert_eq!(files, [("1[0]", h0.as_str()), ("1[1]", h1.as_str())]);
}

#[test]
fn input_names_are_written_safely_under_the_input_directory() {
    let dir = TempDir::new("files-cmd");
    // The first command makes two files; a `set` step refers to their bytes under names that
    // try to leave the directory, collide, or hold odd characters; the second command lists
    // what it finds under its input directory.
    let make = r#"printf secret > "$SWITCHYARD_OUTPUT_DIR/a.txt"; printf other > "$SWITCHYARD_OUTPUT_DIR/b.txt"; echo "{}""#;
    let list = r#"
import json, os, sys
doc = json.load(sys.stdin)
in_dir = os.environ["SWITCHYARD_INPUT_DIR"]
found = []
for root, dirs, files in os.walk(in_dir):
    for f in files:
        p = os.path.join(root, f)
        with open(p) as fh:
            found.append([os.path.relpath(p, in_dir), fh.read()])
found.sort()
paths = [os.path.relpath(d["path"], in_dir) for d in doc["docs"]]
names = [d["name"] for d in doc["docs"]]
real = all(os.path.realpath(d["path"]).startswith(os.path.realpath(in_dir) + os.sep) for d in doc["docs"])
print(json.dumps({"found": found, "paths": paths, "names": names, "inside": real}))
"#;
    let flow = format!(
        r#"
flow: odd_names
agents:
  make:
    kind: command
    run: [sh, -c, '{make}']
  list:
    kind: command
    run: [python3, list.py]
    cwd: .
steps:
  make:
    agent: make
    output: {{$.made: $.files}}
    next: rename
  rename:
    set:
      $.docs: '=[
        {{"file": payload.made[0].file, "name": "../../escape.txt", "media_type": "text/plain", "size": 6}},
        {{"file": payload.made[1].file, "name": "../../escape.txt", "media_type": "text/plain", "size": 5}},
        {{"file": payload.made[0].file, "name": "/abs/x\ny:z.txt", "media_type": "text/plain", "size": 6}},
        {{"file": payload.made[1].file, "name": ".", "media_type": "text/plain", "size": 5}},
        {{"file": payload.made[0].file, "name": "../../escape.txt", "media_type": "text/plain", "size": 6}}]'
    next: list
  list:
    agent: list
    input: {{$.docs: $.docs}}
    output: {{$.listed: $}}
"#
    );
    project(&dir, &flow, &[("list.py", list)]);
    let out = run_flow(&dir, &json!({}), None);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("JSON");
    let listed = &output["listed"];
    assert_eq!(
        listed["found"],
        json!([
            ["__/__/escape-2.txt", "other"],
            ["__/__/escape.txt", "secret"],
            ["abs/x_y_z.txt", "secret"],
            ["file", "other"],
        ])
    );
    // The same bytes under the same name are written once; names are passed on as given.
    assert_eq!(
        listed["paths"],
        json!([
            "__/__/escape.txt",
            "__/__/escape-2.txt",
            "abs/x_y_z.txt",
            "file",
            "__/__/escape.txt"
        ])
    );
    assert_eq!(
        listed["names"],
        json!([
            "../../escape.txt",
            "../../escape.txt",
            "/abs/x\ny:z.txt",
            ".",
            "../../escape.txt"
        ])
    );
    assert_eq!(listed["inside"], json!(true));
    // Nothing was written outside.
    assert!(!dir.path().join("escape.txt").exists());
}

#[test]
fn an_input_file_missing_from_the_store_fails_the_step_naming_it() {
    let dir = TempDir::new("files-cmd");
    let calls = dir.path().join("called");
    let script = format!("touch {}; echo {{}}", calls.display());
    project(&dir, &one_command(&script, "    input: {$.scan: $.scan}"), &[]);
    let missing = format!("sha256:{}", "ab".repeat(32));
    let input =
        json!({"scan": {"file": missing, "name": "scan-7.png", "media_type": "image/png", "size": 10}});
    let out = run_flow(&dir, &input, None);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(
        run_error(&out),
        (
            "agent".to_owned(),
            format!("step `only`: input file `scan-7.png` ({missing}) is not in the store")
        )
    );
    assert!(!calls.exists(), "the program never ran");
}

#[test]
fn both_directories_are_set_and_empty_for_a_command_without_files() {
    let dir = TempDir::new("files-cmd");
    let script = r#"test -d "$SWITCHYARD_INPUT_DIR" && test -d "$SWITCHYARD_OUTPUT_DIR" && test -z "$(ls -A "$SWITCHYARD_INPUT_DIR")" && test -z "$(ls -A "$SWITCHYARD_OUTPUT_DIR")" && cat"#;
    project(&dir, &one_command(script, "    input: {$.x: $.x}"), &[]);
    let out = run_flow(&dir, &json!({"x": {"file": "not a hash", "n": 1}}), None);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("JSON");
    // No files: the input reaches the program as it is, and the result has no `files`.
    assert_eq!(output["result"], json!({"x": {"file": "not a hash", "n": 1}}));
}

#[test]
fn quitting_with_a_second_ctrl_c_removes_the_directories_of_commands_in_flight() {
    use std::io::BufRead;
    let dir = TempDir::new("files-cmd");
    let noted = dir.path().join("dir.txt");
    let script = format!(
        r#"printf x > "$SWITCHYARD_OUTPUT_DIR/x.txt"; echo "$SWITCHYARD_OUTPUT_DIR" > {noted}.tmp; mv {noted}.tmp {noted}; sleep 30"#,
        noted = noted.display()
    );
    project(&dir, &one_command(&script, ""), &[]);
    let mut child = switchyard(dir.path())
        .args(["run", "flow.yaml", "--input", "{}", "--store", SQLITE])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    let stderr = child.stderr.take().expect("piped");
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + support::HANG;
    while !noted.exists() {
        assert!(std::time::Instant::now() < deadline, "the command never started");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out_dir = PathBuf::from(std::fs::read_to_string(&noted).expect("dir.txt").trim());
    assert!(out_dir.is_dir());
    let sigint = || {
        let status = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    };
    sigint();
    // The second Ctrl-C once the first is taken: the run stops waiting for the step.
    loop {
        let line = lines
            .recv_timeout(support::HANG)
            .expect("the run says it is stopping");
        if line.starts_with("stopping:") {
            break;
        }
    }
    sigint();
    let status = child.wait().expect("exits");
    assert_eq!(status.code(), Some(130));
    let in_dir = PathBuf::from(
        out_dir
            .to_str()
            .and_then(|d| d.strip_suffix("-out"))
            .map(|stem| format!("{stem}-in"))
            .expect("…-out"),
    );
    for d in [&out_dir, &in_dir] {
        assert!(!d.exists(), "{} outlived the quit", d.display());
    }
}
