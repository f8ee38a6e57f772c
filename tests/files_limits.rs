//! Limits on files and `file("path")` in mappings (SPEC §6.5, §9), through the real binary:
//! `limits.max_file_bytes` and `limits.max_run_file_bytes` and the flags that narrow them;
//! `file()` reading under the project root or a `--files-root`, by hash, and refusing every
//! path that leaves them (`..`, absolute paths, symlinks), naming the path; a resumed run
//! counting the files it made before it stopped.

use serde_json::{Value, json};
use sha2::Digest;

use crate::engine::run_error;
use crate::support::{self, TempDir, lint_json, run, switchyard};

/// `sha256:` and the hex digest of `bytes`.
fn hash(bytes: &[u8]) -> String {
    let digest = sha2::Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The first bytes of a PNG: enough for its media type to be sniffed from its content.
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x03\0\0\0\x02\x08\x02\0\0\0";

const SQLITE: &str = "sqlite:runs.db";

/// `switchyard run flow.yaml --input INPUT ARGS...` in `dir`, on SQLite.
fn run_flow(dir: &TempDir, input: &Value, args: &[&str]) -> support::Output {
    run(switchyard(dir.path())
        .args(["run", "flow.yaml", "--input", &input.to_string()])
        .args(["--store", SQLITE])
        .args(args))
}

/// `runs show --json` of the latest run in the store.
fn latest_run(dir: &TempDir) -> Value {
    let list = run(switchyard(dir.path()).args(["runs", "list", "--json", "--store", SQLITE]));
    assert_eq!(list.code(), 0, "{}", list.stderr);
    let id = serde_json::from_str::<Value>(list.stdout.lines().next().expect("a run")).expect("a JSON line")
        ["id"]
        .as_str()
        .expect("an id")
        .to_string();
    let show = run(switchyard(dir.path()).args(["runs", "show", &id, "--json", "--store", SQLITE]));
    assert_eq!(show.code(), 0, "{}", show.stderr);
    serde_json::from_str(&show.stdout).expect("runs show --json")
}

/// A flow of `command` steps, one after another, each writing `<step>.bin` of `size` bytes
/// into its output directory; `limits` goes under `limits:`.
fn making_flow(limits: &str, steps: &[(&str, usize)]) -> String {
    let mut flow = format!("flow: makes\nlimits: {limits}\nagents:\n");
    for (step, size) in steps {
        flow.push_str(&format!(
            "  make_{step}:\n    kind: command\n    run: [sh, -c, 'head -c {size} /dev/zero > \"$SWITCHYARD_OUTPUT_DIR/{step}.bin\"; echo \"{{}}\"']\n"
        ));
    }
    flow.push_str("steps:\n");
    for (i, (step, _)) in steps.iter().enumerate() {
        let next = steps
            .get(i + 1)
            .map(|(n, _)| format!(", next: {n}"))
            .unwrap_or_default();
        flow.push_str(&format!(
            "  {step}: {{agent: make_{step}, output: {{$.{step}: $.files}}{next}}}\n"
        ));
    }
    flow
}

#[test]
fn a_file_over_max_file_bytes_fails_its_step_with_kind_limit() {
    let dir = TempDir::new("files-limits-file");
    dir.write("flow.yaml", making_flow("{max_file_bytes: 8}", &[("a", 9)]));
    let out = run_flow(&dir, &json!({}), &[]);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(
        run_error(&out),
        (
            "limit".to_string(),
            "step `a`: file `a.bin` is over the limit limits.max_file_bytes (8 bytes)".to_string()
        )
    );
    let shown = latest_run(&dir);
    assert_eq!(shown["run"].get("files"), None, "no files: {shown}");
    assert_eq!(
        shown["run"]["error"]["details"],
        json!({"limit": "max_file_bytes", "value": 8, "file": "a.bin"}),
        "{shown}"
    );
    // At the limit is within it.
    dir.write("flow.yaml", making_flow("{max_file_bytes: 8}", &[("a", 8)]));
    let out = run_flow(&dir, &json!({}), &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("the output");
    assert_eq!(output["a"][0]["size"], 8, "{output}");
    assert_eq!(output["a"][0]["file"], hash(&[0; 8]), "{output}");
}

#[test]
fn max_run_file_bytes_counts_the_files_of_every_step() {
    let dir = TempDir::new("files-limits-run");
    dir.write(
        "flow.yaml",
        making_flow("{max_run_file_bytes: 10}", &[("a", 6), ("b", 5)]),
    );
    let out = run_flow(&dir, &json!({}), &[]);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(
        run_error(&out),
        (
            "limit".to_string(),
            "step `b`: file `b.bin` (5 bytes) takes the run's files over the limit limits.max_run_file_bytes (10 bytes)"
                .to_string()
        )
    );
    // The first step's file stays the run's.
    let shown = latest_run(&dir);
    assert_eq!(
        shown["run"]["files"],
        json!([{"number": "1", "file": hash(&[0; 6]), "name": "a.bin", "media_type": "application/octet-stream", "size": 6}]),
        "{shown}"
    );
    dir.write(
        "flow.yaml",
        making_flow("{max_run_file_bytes: 11}", &[("a", 6), ("b", 5)]),
    );
    let out = run_flow(&dir, &json!({}), &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
}

#[test]
fn flags_only_narrow_the_file_limits() {
    let dir = TempDir::new("files-limits-flags");
    dir.write(
        "flow.yaml",
        making_flow("{max_file_bytes: 1KiB}", &[("a", 6), ("b", 6)]),
    );
    let out = run_flow(&dir, &json!({}), &["--max-file-bytes", "5"]);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(
        run_error(&out).1,
        "step `a`: file `a.bin` is over the limit --max-file-bytes (5 bytes)"
    );
    let out = run_flow(&dir, &json!({}), &["--max-run-file-bytes", "11"]);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(
        run_error(&out),
        (
            "limit".to_string(),
            "step `b`: file `b.bin` (6 bytes) takes the run's files over the limit --max-run-file-bytes (11 bytes)"
                .to_string()
        )
    );
    // A looser flag changes nothing, and says so.
    dir.write("flow.yaml", making_flow("{max_file_bytes: 5}", &[("a", 6)]));
    let out = run_flow(&dir, &json!({}), &["--max-file-bytes", "1MiB"]);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "--max-file-bytes is looser than the flow's limits.max_file_bytes (5), which applies: the flag only narrows it"
        ),
        "{}",
        out.stderr
    );
    assert_eq!(
        run_error(&out).1,
        "step `a`: file `a.bin` is over the limit limits.max_file_bytes (5 bytes)"
    );
    let out = run(switchyard(dir.path()).args(["run", "flow.yaml", "--max-file-bytes", "lots"]));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("`lots` is not a size"), "{}", out.stderr);
}

/// A flow whose step `take` reads `file(payload.path)` into its input and returns that input.
const TAKES: &str = "\
flow: takes
agents:
  echo:
    kind: transform
    result: {got: =input}
steps:
  take:
    agent: echo
    input:
      $.scan: =file(payload.path)
      $.note: =payload.note
    output: {$.got: $.got}
";

#[test]
fn file_in_a_mapping_reaches_the_step_as_a_reference() {
    let dir = TempDir::new("files-limits-take");
    dir.write("flow.yaml", TAKES);
    dir.write("data/scan.png", PNG);
    let out = run_flow(&dir, &json!({"path": "data/scan.png", "note": "n"}), &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let reference = json!({
        "file": hash(PNG),
        "name": "scan.png",
        "media_type": "image/png",
        "size": PNG.len(),
    });
    let output: Value = serde_json::from_str(&out.stdout).expect("the output");
    assert_eq!(output["got"], json!({"scan": reference, "note": "n"}), "{output}");
    // The step made it: on its record, with the input that holds the reference, and the run's.
    let shown = latest_run(&dir);
    let step = &shown["steps"][0];
    assert_eq!(step["input"]["scan"], reference, "{step}");
    assert_eq!(step["files"][0]["file"], hash(PNG), "{step}");
    let mut listed = reference.clone();
    listed["number"] = json!("1");
    assert_eq!(shown["run"]["files"], json!([listed]), "{shown}");
    // Over `max_file_bytes`, the step fails with kind `limit`.
    let out = run_flow(
        &dir,
        &json!({"path": "data/scan.png", "note": "n"}),
        &["--max-file-bytes", "10"],
    );
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(
        run_error(&out),
        (
            "limit".to_string(),
            "step `take`: file(`data/scan.png`): file `scan.png` is over the limit --max-file-bytes (10 bytes)"
                .to_string()
        )
    );
}

#[test]
fn file_refuses_every_path_outside_the_roots_and_reads_nothing() {
    let dir = TempDir::new("files-limits-confine");
    dir.write("project/flow.yaml", TAKES);
    dir.write("project/data/scan.png", PNG);
    let secret = dir.write("outside/secret.txt", "TOP-SECRET-CONTENT");
    std::os::unix::fs::symlink(&secret, dir.path().join("project/data/link.txt")).expect("a symlink");
    std::os::unix::fs::symlink(dir.path().join("outside"), dir.path().join("project/away"))
        .expect("a symlink");
    let root = dir.path().join("project");
    let absolute = secret.display().to_string();
    for path in [
        "../outside/secret.txt",
        absolute.as_str(),
        "data/link.txt",
        "away/secret.txt",
    ] {
        let out = run(switchyard(&root)
            .args(["run", "flow.yaml", "--store", SQLITE])
            .args(["--input", &json!({"path": path, "note": "n"}).to_string()]));
        assert_eq!(out.code(), 1, "{path}: {}", out.stderr);
        assert_eq!(
            run_error(&out),
            (
                "mapping".to_string(),
                format!(
                    "step `take`: file(`{path}`): the path is outside the project root and every --files-root (`{}`)",
                    root.display()
                )
            ),
            "{path}"
        );
    }
    // Nothing was stored: no run has files, and the store holds no bytes of the secret.
    let db = std::fs::read(root.join("runs.db")).expect("the store");
    assert!(
        !db.windows(18).any(|w| w == b"TOP-SECRET-CONTENT"),
        "the secret's bytes are in the store"
    );
    let out = run(switchyard(&root).args(["run", "flow.yaml"]).args([
        "--input",
        &json!({"path": "data/none.png", "note": "n"}).to_string(),
    ]));
    assert_eq!(
        run_error(&out),
        (
            "mapping".to_string(),
            "step `take`: file(`data/none.png`): no such file".to_string()
        )
    );
}

#[test]
fn files_root_adds_a_root() {
    let dir = TempDir::new("files-limits-roots");
    dir.write("project/flow.yaml", TAKES);
    let shared = dir.write("shared/a.txt", "shared text");
    std::os::unix::fs::symlink(&shared, dir.path().join("project/link.txt")).expect("a symlink");
    let root = dir.path().join("project");
    let reference = json!({
        "file": hash(b"shared text"),
        "name": "a.txt",
        "media_type": "text/plain",
        "size": 11,
    });
    for path in [
        shared.display().to_string(),
        "link.txt".to_string(),
        "../shared/a.txt".to_string(),
    ] {
        let out = run(switchyard(&root)
            .args(["run", "flow.yaml", "--files-root", "../shared"])
            .args(["--input", &json!({"path": path, "note": 1}).to_string()]));
        assert_eq!(out.code(), 0, "{path}: {}", out.stderr);
        let output: Value = serde_json::from_str(&out.stdout).expect("the output");
        let mut expected = reference.clone();
        if path == "link.txt" {
            expected["name"] = json!("link.txt");
        }
        assert_eq!(output["got"]["scan"], expected, "{path}");
    }
    // And so on `batch`, each line naming its own file.
    dir.write("shared/b.txt", "bee");
    dir.write(
        "project/in.jsonl",
        "{\"id\": 1, \"path\": \"../shared/a.txt\", \"note\": 1}\n{\"id\": 2, \"path\": \"../shared/b.txt\", \"note\": 2}\n",
    );
    let out = run(switchyard(&root)
        .args([
            "batch",
            "flow.yaml",
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
        ])
        .args(["--files-root", "../shared"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let lines: Vec<Value> = std::fs::read_to_string(root.join("out.jsonl"))
        .expect("the output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines[0]["output"]["got"]["scan"]["file"], hash(b"shared text"));
    assert_eq!(lines[1]["output"]["got"]["scan"]["file"], hash(b"bee"));
    let out = run(switchyard(&root)
        .args(["run", "flow.yaml", "--files-root", "../nowhere"])
        .args(["--input", r#"{"path": "x"}"#]));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("--files-root `../nowhere`"), "{}", out.stderr);
}

#[test]
fn a_resumed_run_goes_on_counting_the_files_it_made() {
    let dir = TempDir::new("files-limits-resume");
    let marker = dir.path().join("crashed");
    dir.write("a.bin", [1u8; 6]);
    dir.write("b.bin", [2u8; 6]);
    dir.write(
        "flow.yaml",
        format!(
            r#"flow: counts
limits: {{max_run_file_bytes: 10}}
agents:
  echo: {{kind: transform, result: {{got: =input}}}}
  once:
    kind: command
    # The program's parent is its supervisor; the engine is the supervisor's parent.
    run: [sh, -c, 'if [ ! -e "{marker}" ]; then : > "{marker}"; kill -9 $(cut -d" " -f4 /proc/$PPID/stat); sleep 2; fi; echo "{{}}"']
    idempotent: true
steps:
  first: {{agent: echo, input: {{$.f: '=file("a.bin")'}}, output: {{}}, next: crash}}
  crash: {{agent: once, output: {{}}, next: second}}
  second: {{agent: echo, input: {{$.f: '=file("b.bin")'}}, output: {{}}}}
"#,
            marker = marker.display()
        ),
    );
    let crashed = run_flow(&dir, &json!({}), &[]);
    assert!(crashed.status.code().is_none(), "killed: {crashed:?}");
    let id = latest_run(&dir)["run"]["id"].as_str().expect("an id").to_string();
    let out = run(switchyard(dir.path()).args(["resume", &id, "--store", SQLITE]));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(
        run_error(&out),
        (
            "limit".to_string(),
            "step `second`: file(`b.bin`): file `b.bin` (6 bytes) takes the run's files over the limit limits.max_run_file_bytes (10 bytes)"
                .to_string()
        )
    );
    let shown = latest_run(&dir);
    assert_eq!(shown["run"]["files"][0]["file"], hash(&[1u8; 6]), "{shown}");
    assert_eq!(shown["run"]["files"].as_array().map(Vec::len), Some(1), "{shown}");
}

#[test]
fn lint_checks_file_limits_and_file_calls() {
    let dir = TempDir::new("files-limits-lint");
    dir.write(
        "flow.yaml",
        "\
flow: bad
limits: {max_file_bytes: 0, max_run_file_bytes: 2048GiB}
agents:
  echo: {kind: transform, result: {got: =input}}
steps:
  take:
    agent: echo
    input: {$.f: '=file(\"a\", \"b\")'}
",
    );
    let out = lint_json(dir.path(), &["flow.yaml"]);
    assert_eq!(out.code(), 1, "{}", out.stdout);
    let found: Vec<(String, usize, usize, String)> = out
        .diagnostics()
        .into_iter()
        .map(|d| (d.code, d.line, d.column, d.message))
        .collect();
    assert!(
        found.contains(&(
            "SY302".into(),
            2,
            26,
            "`limits.max_file_bytes` is 0 bytes, outside 1 byte..=16GiB".into()
        )),
        "{found:?}"
    );
    assert!(
        found.iter().any(|(_, line, _, m)| *line == 2
            && m.contains("`limits.max_run_file_bytes` is 2199023255552 bytes, outside 1 byte..=1TiB")),
        "{found:?}"
    );
    assert!(
        found.contains(&(
            "SY411".into(),
            8,
            20,
            "`file` takes 1 argument, not 2 arguments".into()
        )),
        "{found:?}"
    );
    dir.write(
        "flow.yaml",
        "\
flow: good
limits: {max_file_bytes: 1MiB, max_run_file_bytes: 10MiB}
agents:
  echo: {kind: transform, result: {got: =input}}
steps:
  take:
    agent: echo
    input: {$.f: '=file(payload.path)'}
",
    );
    let out = lint_json(dir.path(), &["flow.yaml"]);
    assert_eq!(out.code(), 0, "{}", out.stdout);
}

#[test]
fn a_child_runs_files_count_against_its_parent() {
    let dir = TempDir::new("files-limits-child");
    dir.write("a.bin", [1u8; 6]);
    dir.write("b.bin", [2u8; 6]);
    dir.write(
        "child.yaml",
        "\
flow: child
limits: {max_file_bytes: 1KiB}
agents:
  echo: {kind: transform, result: {got: =input}}
steps:
  take: {agent: echo, input: {$.f: '=file(\"b.bin\")'}, output: {$.got: $.got}}
",
    );
    dir.write(
        "flow.yaml",
        "\
flow: parent
limits: {max_run_file_bytes: 10, max_file_bytes: 8}
agents:
  echo: {kind: transform, result: {got: =input}}
  child: {kind: flow, path: child.yaml}
steps:
  first: {agent: echo, input: {$.f: '=file(\"a.bin\")'}, output: {}, next: nested}
  nested: {agent: child, output: {}}
",
    );
    let out = run_flow(&dir, &json!({}), &[]);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    let (kind, message) = run_error(&out);
    assert_eq!(kind, "limit", "{message}");
    assert!(
        message.ends_with(
            "file(`b.bin`): file `b.bin` (6 bytes) takes the run's files over the limit limits.max_run_file_bytes (10 bytes)"
        ),
        "{message}"
    );
    // The parent's tighter `max_file_bytes` binds the child too.
    dir.write("b.bin", [2u8; 9]);
    dir.write("a.bin", [1u8; 1]);
    let out = run_flow(&dir, &json!({}), &[]);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    let (kind, message) = run_error(&out);
    assert_eq!(kind, "limit", "{message}");
    assert!(
        message.ends_with("file(`b.bin`): file `b.bin` is over the limit limits.max_file_bytes (8 bytes)"),
        "{message}"
    );
    // Within both, the parent lists the child's file as made by its `flow` step.
    dir.write("b.bin", [2u8; 8]);
    let out = run_flow(&dir, &json!({}), &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let shown = latest_run(&dir);
    let numbers: Vec<&str> = shown["run"]["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["number"].as_str().expect("a number"))
        .collect();
    assert_eq!(numbers, ["1", "2.1"], "{shown}");
}

#[test]
fn file_stores_its_bytes_once_on_postgres_and_the_run_limit_holds_there() {
    let pg = crate::cluster::Pg::new("files_limits");
    let url = pg.url("files_limits");
    let dir = TempDir::new("files-limits-pg");
    dir.write("flow.yaml", TAKES);
    dir.write("data/scan.png", PNG);
    let take = |args: &[&str]| {
        run(switchyard(dir.path())
            .args(["run", "flow.yaml", "--store", &url])
            .args(["--input", r#"{"path": "data/scan.png", "note": 1}"#])
            .args(args))
    };
    for _ in 0..2 {
        let out = take(&[]);
        assert_eq!(out.code(), 0, "{}", out.stderr);
        let output: Value = serde_json::from_str(&out.stdout).expect("the output");
        assert_eq!(output["got"]["scan"]["file"], hash(PNG), "{output}");
    }
    // Two runs made the same bytes: stored once.
    let rows = pg.query("SELECT hash, size FROM files");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["hash"].as_deref(), Some(hash(PNG).as_str()));
    assert_eq!(rows[0]["size"].as_deref(), Some(PNG.len().to_string().as_str()));
    let out = take(&["--max-run-file-bytes", "10"]);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(
        run_error(&out),
        (
            "limit".to_string(),
            format!(
                "step `take`: file(`data/scan.png`): file `scan.png` ({} bytes) takes the run's files over the limit --max-run-file-bytes (10 bytes)",
                PNG.len()
            )
        )
    );
}

/// A submitted batch's `file()` reads on the worker's machine: a worker started elsewhere
/// reads relative paths under its first `--files-root`, and refuses one it was not given.
#[test]
fn a_worker_reads_file_paths_under_its_files_root() {
    use crate::cluster::{Pg, log_of, spawn_worker, wait_exit};
    let pg = Pg::new("filesroot");
    let url = pg.url("sy_filesroot");
    let dir = TempDir::new("files-root-submit");
    dir.write("flow.yaml", TAKES);
    dir.write(
        "in.jsonl",
        "{\"id\": 1, \"path\": \"data/scan.png\", \"note\": \"a\"}\n{\"id\": 2, \"path\": \"../secret.txt\", \"note\": \"b\"}\n",
    );
    let out = run(switchyard(dir.path()).args([
        "submit",
        "flow.yaml",
        "--input",
        "in.jsonl",
        "--batch",
        "fr",
        "--store",
        &url,
    ]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    // The worker's machine: the file under its own root, and one outside it.
    let elsewhere = TempDir::new("files-root-worker");
    elsewhere.write("shared/data/scan.png", PNG);
    elsewhere.write("secret.txt", "no");
    let root = elsewhere.path().join("shared");
    let mut w = spawn_worker(
        &elsewhere,
        &url,
        "w",
        &["--exit-when-idle", "--files-root", root.to_str().unwrap()],
    );
    let status = wait_exit(&mut w, std::time::Duration::from_secs(120), "the worker");
    assert!(status.success(), "{}", log_of(&elsewhere, "w"));
    let collect = run(switchyard(dir.path()).args([
        "collect",
        "--batch",
        "fr",
        "--output",
        "out.jsonl",
        "--store",
        &url,
    ]));
    assert_eq!(collect.code(), 1, "{}", collect.stderr);
    let lines: Vec<Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["status"], "succeeded", "{}", lines[0]);
    assert_eq!(lines[0]["output"]["got"]["scan"]["file"], hash(PNG));
    assert_eq!(lines[0]["files"][0]["number"], "1");
    assert_eq!(lines[1]["status"], "failed", "{}", lines[1]);
    assert_eq!(lines[1]["error"]["kind"], "mapping");
    let message = lines[1]["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("../secret.txt") && message.contains("outside"),
        "{message}"
    );
    // A root that is not a directory is a usage error, before anything is claimed.
    let bad = run(switchyard(elsewhere.path()).args([
        "worker",
        "--store",
        &url,
        "--files-root",
        "secret.txt",
        "--exit-when-idle",
    ]));
    assert_eq!(bad.code(), 2, "{}", bad.stderr);
    assert!(
        bad.stderr
            .contains("--files-root `secret.txt` is not a directory"),
        "{}",
        bad.stderr
    );
}
