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
