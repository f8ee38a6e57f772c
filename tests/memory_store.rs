//! The memory store (`--store memory`) over long loops: what a run keeps of its steps grows with
//! the text of their values, not with copies of value trees. Measured as the peak resident
//! memory of the real binary (`wait4`'s `ru_maxrss` of that one child).

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{TempDir, switchyard};

/// Runs `switchyard run FLOW --input INPUT --store memory` in `dir` and returns its exit code,
/// its output's text and its peak resident memory in MiB.
// The child is reaped by `wait4`, which also gives its own resource usage.
#[allow(clippy::zombie_processes)]
fn run_measured(dir: &TempDir, flow: &str, input: &str) -> (i32, String, u64) {
    let out = dir.path().join("out.json");
    let mut child = switchyard(dir.path())
        .args(["run", flow, "--input", input, "--store", "memory"])
        .stdout(std::fs::File::create(&out).expect("output file"))
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    let pid = child.id() as libc::pid_t;
    let t0 = Instant::now();
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: a zeroed `rusage` is a valid value for `wait4` to fill.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `pid` is our child, not yet reaped; both pointers are to live locals.
        let reaped = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        assert!(reaped >= 0, "wait4: {}", std::io::Error::last_os_error());
        if reaped == pid {
            break (status, usage);
        }
        if t0.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`run {flow}` did not end within 5 minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        libc::WIFEXITED(status),
        "`run {flow}` ended by a signal: {status}"
    );
    let output = std::fs::read_to_string(&out).expect("output");
    // Linux gives `ru_maxrss` in KiB.
    (libc::WEXITSTATUS(status), output, usage.ru_maxrss as u64 / 1024)
}

/// A `while` that appends to a list, 2,000 times, and one that nests its value 1,000 deep: each
/// iteration's record holds a value as large as the loop has run, which as value trees came to
/// hundreds of MB (634 MB for the list); as text, far less.
#[test]
fn long_loops_that_grow_their_value_stay_small_on_the_memory_store() {
    let dir = TempDir::new("memory-store-loops");
    dir.write(
        "grow.yaml",
        r#"flow: grow
agents:
  add:
    kind: transform
    result:
      items: "=input.items + [size(input.items)]"
steps:
  grow:
    while: =size(payload.items) < 2000
    max_iterations: 2000
    agent: add
    output: {$.items: $.items}
"#,
    );
    let (code, output, mib) = run_measured(&dir, "grow.yaml", r#"{"items": []}"#);
    assert_eq!(code, 0, "{output}");
    let output: Value = serde_json::from_str(&output).unwrap_or_else(|e| panic!("{e}: {output}"));
    assert_eq!(output["items"].as_array().map(Vec::len), Some(2000));
    // Measured at 57 MiB alone and once at 185 MiB inside a loaded full test run (freed memory
    // the allocator kept); value trees kept per iteration took 584 MiB.
    assert!(mib < 300, "a list grown 2,000 times peaked at {mib} MiB");

    dir.write(
        "nest.yaml",
        r#"flow: nest
agents:
  wrap:
    kind: transform
    result:
      v: "={'inner': input.v}"
      n: "=input.n + 1"
steps:
  grow:
    while: =payload.n < 1000
    max_iterations: 1000
    agent: wrap
    output: {$.v: $.v, $.n: $.n}
"#,
    );
    let (code, output, mib) = run_measured(&dir, "nest.yaml", r#"{"n": 0, "v": 0}"#);
    assert_eq!(code, 0);
    // Deeper than serde_json reads by default: the text says enough.
    assert!(
        output.starts_with("{\n  \"n\": 1000,\n  \"v\": {\n    \"inner\": {"),
        "{}",
        &output[..200]
    );
    assert_eq!(output.matches("\"inner\"").count(), 1000);
    assert!(mib < 300, "a value nested 1,000 deep peaked at {mib} MiB");
}
