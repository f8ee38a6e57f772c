//! `switchyard batch`, `resume` and `runs`: the real binary over real SQLite stores, killed
//! with SIGKILL at random points and run again.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{TempDir, interrupt, run, switchyard};

/// A flow whose first step is a non-idempotent command that appends the item's id to a
/// side-effect file (one line per execution), then a foreach over a transform, then a set.
pub(crate) fn items_flow(effects: &Path) -> String {
    format!(
        r#"flow: items
input:
  schema: {{type: object, required: [id, n], properties: {{n: {{type: integer}}}}}}
agents:
  side:
    kind: command
    # Input torn by a kill of the batch is not a call: only whole documents count.
    run: [sh, -c, 'read -r x; case "$x" in *}}) ;; *) exit 1 ;; esac; printf "%s\n" "$x" >> "{effects}"; sleep 0.05; printf "%s" "$x"']
    idempotent: false
  double:
    kind: transform
    result: {{v: =input * 2}}
steps:
  call:
    agent: side
    output: {{$.seen: $.n}}
    next: spread
  spread:
    foreach: =[payload.n, payload.n + 1, payload.n + 2]
    concurrency: 2
    agent: double
    select: $.v
    output: {{$.doubled: $}}
    next: total
  total:
    set:
      $.sum: =payload.doubled[0] + payload.doubled[1] + payload.doubled[2]
"#,
        effects = effects.display()
    )
}

pub(crate) fn write_input(dir: &TempDir, n: usize) -> std::path::PathBuf {
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&json!({"id": format!("item-{i}"), "n": i}).to_string());
        text.push('\n');
    }
    dir.write("in.jsonl", text)
}

pub(crate) fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Executions per id recorded in the side-effect file.
pub(crate) fn effects(path: &Path) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let v: Value = serde_json::from_str(line).expect("effects lines are the command's input");
        *out.entry(v["id"].as_str().expect("an id").to_string())
            .or_default() += 1;
    }
    out
}

/// A batch started in the background, its output discarded.
pub(crate) fn spawn_batch(dir: &TempDir, flow: &Path) -> std::process::Child {
    batch_cmd(dir, flow, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts")
}

pub(crate) fn batch_cmd(dir: &TempDir, flow: &Path, extra: &[&str]) -> Command {
    let mut cmd = switchyard(dir.path());
    cmd.arg("batch")
        .arg(flow)
        .args([
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
            "--concurrency",
            "8",
        ])
        .args(["--store", "sqlite:runs.db"])
        .args(extra);
    cmd
}

/// `--concurrency N` bounds the agent calls in flight, also while finished runs wait for
/// the commit of their end (they no longer hold a place then).
#[test]
fn concurrency_bounds_the_agent_calls_in_flight() {
    let dir = TempDir::new("batch-concurrency");
    let log = dir.path().join("calls");
    let flow = dir.write(
        "slow.yaml",
        format!(
            r#"flow: slow
agents:
  slow:
    kind: command
    run: [sh, -c, 'read -r x; echo + >> "{log}"; sleep 0.03; echo - >> "{log}"; printf "%s" "$x"']
steps:
  call:
    agent: slow
    output: {{$.seen: $.n}}
"#,
            log = log.display()
        ),
    );
    write_input(&dir, 24);
    let mut cmd = switchyard(dir.path());
    cmd.arg("batch").arg(&flow).args([
        "--input",
        "in.jsonl",
        "--output",
        "out.jsonl",
        "--concurrency",
        "3",
        "--store",
        "sqlite:runs.db",
    ]);
    let out = run(&mut cmd);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(read_lines(&dir.path().join("out.jsonl")).len(), 24);
    let (mut now, mut most, mut calls) = (0i32, 0i32, 0);
    for event in std::fs::read_to_string(&log).expect("the call log").lines() {
        match event {
            "+" => {
                now += 1;
                calls += 1;
            }
            "-" => now -= 1,
            other => panic!("unexpected log line {other:?}"),
        }
        most = most.max(now);
    }
    assert_eq!(calls, 24);
    assert!(most <= 3, "{most} calls in flight at once with --concurrency 3");
    assert!(most >= 2, "calls never overlapped: the batch ran them one by one");
}

/// A line that is not JSON is named `line:N`, never `N`: with numeric ids, its line number
/// could be another line's id, and the batch would be refused for a duplicate.
#[test]
fn a_broken_line_among_numeric_ids_is_a_failed_item_not_a_duplicate() {
    let dir = TempDir::new("batch-broken-numeric");
    let flow = dir.write(
        "echo.yaml",
        "flow: echo\nsteps:\n  copy:\n    set:\n      $.seen: =payload.id\n",
    );
    dir.write("in.jsonl", "{\"id\": 1}\n{\"id\": 2}\n{\"id\": 3\n{\"id\": 3}\n");
    let out = run(&mut batch_cmd(&dir, &flow, &[]));
    assert_eq!(out.code(), 1, "the broken line fails its item: {}", out.stderr);
    assert!(
        out.stderr.contains("4 items: 3 succeeded, 1 failed"),
        "{}",
        out.stderr
    );
    let lines = read_lines(&dir.path().join("out.jsonl"));
    let ids: Vec<&Value> = lines.iter().map(|l| &l["id"]).collect();
    assert_eq!(ids, [&json!(1), &json!(2), &json!("line:3"), &json!(3)]);
    assert_eq!(lines[2]["status"], "failed");
    assert_eq!(lines[2]["error"]["kind"], "mapping");
    let message = lines[2]["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("line 3 is not JSON: "), "{message}");
    assert_eq!(lines[3]["output"]["seen"], json!(3));
}

#[test]
fn a_batch_writes_every_line_in_input_order_with_bad_lines_as_failed_items() {
    let dir = TempDir::new("batch-order");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", items_flow(&fx));
    let mut input = String::new();
    for i in 0..30 {
        input.push_str(&json!({"id": format!("item-{i}"), "n": i}).to_string());
        input.push('\n');
        if i == 10 {
            input.push_str("{not json\n\n");
        }
        if i == 20 {
            input.push_str(&json!({"id": "wrong", "n": "seven"}).to_string());
            input.push('\n');
        }
    }
    dir.write("in.jsonl", input);
    let out = run(&mut batch_cmd(&dir, &flow, &[]));
    assert_eq!(out.code(), 1, "bad lines fail their items: {}", out.stderr);
    assert!(
        out.stderr.contains("32 items: 30 succeeded, 2 failed"),
        "{}",
        out.stderr
    );
    let lines = read_lines(&dir.path().join("out.jsonl"));
    let ids: Vec<&str> = lines.iter().map(|l| l["id"].as_str().unwrap()).collect();
    let mut expected: Vec<String> = (0..=10).map(|i| format!("item-{i}")).collect();
    expected.push("line:12".into()); // the line that is not JSON: identified by its position
    expected.extend((11..=20).map(|i| format!("item-{i}")));
    expected.push("wrong".into());
    expected.extend((21..30).map(|i| format!("item-{i}")));
    assert_eq!(ids, expected);
    let bad = &lines[11];
    assert_eq!(bad["status"], "failed");
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("line 12 is not JSON"),
        "{bad}"
    );
    let wrong = &lines[22];
    assert!(
        wrong["error"]["message"]
            .as_str()
            .unwrap()
            .contains("line 24: the input does not match `input.schema` at `/n`"),
        "{wrong}"
    );
    let item7 = &lines[7];
    assert_eq!(item7["status"], "succeeded");
    assert_eq!(item7["output"]["sum"], json!(2 * (7 + 8 + 9)));
    assert!(item7["run_id"].as_str().unwrap().starts_with('r'));
    for key in [
        "id",
        "status",
        "output",
        "error",
        "run_id",
        "cost_usd",
        "duration_ms",
    ] {
        assert!(item7.get(key).is_some(), "{key} missing: {item7}");
    }
    // Each good item's command ran once.
    let fx = effects(&fx);
    assert_eq!(fx.len(), 30);
    assert!(fx.values().all(|n| *n == 1), "{fx:?}");

    // Again: everything is finished; nothing runs, and the same output is written.
    let before = std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap();
    let again = run(&mut batch_cmd(&dir, &flow, &[]));
    assert_eq!(again.code(), 1);
    assert!(
        again.stderr.contains("(30 from an earlier start)"),
        "{}",
        again.stderr
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap(),
        before
    );
    assert_eq!(effects(&dir.path().join("effects")).values().sum::<usize>(), 30);
}

#[test]
fn duplicate_ids_are_reported_before_anything_runs() {
    let dir = TempDir::new("batch-dups");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", items_flow(&fx));
    dir.write(
        "in.jsonl",
        "{\"id\": \"a\", \"n\": 1}\n{\"id\": \"b\", \"n\": 2}\n{\"id\": \"a\", \"n\": 3}\n{\"id\": \"b\", \"n\": 4}\n{\"id\": \"a\", \"n\": 5}\n",
    );
    let out = run(&mut batch_cmd(&dir, &flow, &[]));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("in.jsonl: duplicate ids: `a` on lines 1, 3, 5; `b` on lines 2, 4"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("named by its line number"), "{}", out.stderr);
    assert!(!fx.exists(), "nothing ran");
    // A line without an id is named by its line number, which another line may use.
    dir.write("in.jsonl", "{\"n\": 1}\n{\"id\": \"1\", \"n\": 2}\n");
    let out = run(&mut batch_cmd(&dir, &flow, &[]));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "duplicate ids: `1` on lines 1, 2 (a line without `id` is named by its line number: give it an id of its own)"
        ),
        "{}",
        out.stderr
    );
    assert!(!fx.exists(), "nothing ran");
}

/// Items whose lines have the same output in two batches (run ids and timings aside).
fn comparable(lines: &[Value]) -> Vec<Value> {
    lines
        .iter()
        .map(|l| json!({"id": l["id"], "status": l["status"], "output": l["output"]}))
        .collect()
}

#[test]
fn a_batch_killed_at_random_points_ends_with_every_item_once_in_order() {
    const N: usize = 120;
    // The reference: an uninterrupted batch.
    let reference = {
        let dir = TempDir::new("batch-reference");
        let flow = dir.write("items.yaml", items_flow(&dir.path().join("effects")));
        write_input(&dir, N);
        let out = run(&mut batch_cmd(&dir, &flow, &[]));
        assert_eq!(out.code(), 0, "{}", out.stderr);
        read_lines(&dir.path().join("out.jsonl"))
    };
    assert_eq!(reference.len(), N);

    let dir = TempDir::new("batch-kill");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", items_flow(&fx));
    write_input(&dir, N);
    // Kill it several times at pseudo-random moments (from the first write to the end).
    let mut seed = u64::from(std::process::id()) ^ 0x9e37_79b9_7f4a_7c15;
    let mut kills = 0;
    for round in 0..10 {
        if kills == 5 {
            break;
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_millis(40 + seed % 250);
        let mut child = spawn_batch(&dir, &flow);
        std::thread::sleep(delay);
        if child.try_wait().expect("wait").is_none() {
            child.kill().expect("SIGKILL");
            kills += 1;
        }
        let _ = child.wait();
        // The output so far is a prefix of the reference's ids (its last line may be torn).
        let text = std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap_or_default();
        for (i, line) in text.lines().enumerate() {
            if let Ok(v) = serde_json::from_str::<Value>(line) {
                assert_eq!(v["id"], reference[i]["id"], "round {round}, line {}", i + 1);
            }
        }
    }
    assert!(
        kills >= 3,
        "the batch was killed mid-way at least 3 times ({kills})"
    );

    // Run to the end without retrying in-doubt attempts: no item's command ran twice.
    let out = run(&mut batch_cmd(&dir, &flow, &[]));
    let lines = read_lines(&dir.path().join("out.jsonl"));
    assert_eq!(lines.len(), N, "{}", out.stderr);
    let in_doubt: HashSet<String> = lines
        .iter()
        .filter(|l| l["status"] == "interrupted")
        .map(|l| {
            assert_eq!(l["error"]["kind"], "in_doubt", "{l}");
            l["id"].as_str().unwrap().to_string()
        })
        .collect();
    let counts = effects(&fx);
    for (id, n) in &counts {
        assert_eq!(*n, 1, "`{id}` ran {n} times without being reported in doubt");
    }
    for l in lines.iter().filter(|l| l["status"] != "interrupted") {
        assert_eq!(l["status"], "succeeded", "{l}");
    }

    // Retrying the in-doubt items finishes the batch: the same results as the reference.
    let out = run(&mut batch_cmd(&dir, &flow, &["--retry-in-doubt"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let lines = read_lines(&dir.path().join("out.jsonl"));
    assert_eq!(comparable(&lines), comparable(&reference));
    let counts = effects(&fx);
    assert_eq!(counts.len(), N);
    for (id, n) in &counts {
        assert!(
            *n == 1 || (*n == 2 && in_doubt.contains(id)),
            "`{id}` ran {n} times; in doubt: {in_doubt:?}"
        );
    }
}

#[test]
fn a_crashed_run_resumes_and_reruns_only_unfinished_iterations() {
    let dir = TempDir::new("resume-foreach");
    let fx = dir.path().join("effects");
    // Ten iterations, two at a time, each a command (idempotent: retried after a crash).
    dir.write(
        "fan.yaml",
        format!(
            r#"flow: fan
agents:
  slow:
    kind: command
    run: [sh, -c, 'read x; printf "%s\n" "$x" >> "{}"; sleep 0.3; printf "%s" "$x"']
    idempotent: true
steps:
  each:
    foreach: $.ids
    as: id
    concurrency: 2
    agent: slow
    input: {{$.id: =id}}
    select: $.id
    output: {{$.done: $}}
"#,
            fx.display()
        ),
    );
    let ids: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    let input = json!({"ids": ids}).to_string();
    let mut child = switchyard(dir.path())
        .args(["run", "fan.yaml", "--store", "sqlite:runs.db", "--input", &input])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    // About half of the iterations have finished.
    std::thread::sleep(Duration::from_millis(800));
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let before = effects(&fx).values().sum::<usize>();
    assert!((2..10).contains(&before), "killed mid-way: {before} calls");

    let list = run(switchyard(dir.path()).args(["runs", "list", "--store", "sqlite:runs.db", "--json"]));
    let run_id = serde_json::from_str::<Value>(list.stdout.lines().next().expect("one run")).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(list.stdout.contains("\"status\":\"running\""), "{}", list.stdout);

    let out = run(switchyard(dir.path()).args(["runs", "resume", &run_id, "--store", "sqlite:runs.db"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let output: Value = serde_json::from_str(&out.stdout).expect("the output JSON");
    assert_eq!(output["done"], json!(ids));
    // Finished iterations were not called again: at most the two in flight were repeated.
    let counts = effects(&fx);
    assert_eq!(counts.len(), 10);
    let total: usize = counts.values().sum();
    assert!(total <= 10 + 2, "{total} calls for 10 items: {counts:?}");

    // The record: succeeded, and `runs show` prints the tree.
    let show = run(switchyard(dir.path()).args(["runs", "show", &run_id, "--store", "sqlite:runs.db"]));
    assert_eq!(show.code(), 0, "{}", show.stderr);
    assert!(show.stdout.contains("status    succeeded"), "{}", show.stdout);
    assert!(show.stdout.contains("1 each [foreach]"), "{}", show.stdout);
    assert!(show.stdout.contains("set $.done = [\"k0\""), "{}", show.stdout);
    // Nothing left to resume.
    let again = run(switchyard(dir.path()).args(["resume", &run_id, "--store", "sqlite:runs.db"]));
    assert_eq!(again.code(), 2);
    assert!(
        again.stderr.contains("already ended succeeded"),
        "{}",
        again.stderr
    );
}

/// From the summary line `batch: N items: S succeeded, F failed, I interrupted… in T
/// (R items/s)`: S + F + I, T in seconds (printed as `…ms` or whole `…s`), and R.
fn summary_rate(stderr: &str) -> (f64, f64, f64) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("batch: "))
        .unwrap_or_else(|| panic!("no summary line: {stderr}"));
    let count = |what: &str| -> f64 {
        let before = line.split(what).next().expect("split");
        before
            .rsplit([' ', ':'])
            .find(|w| !w.is_empty())
            .expect("a count")
            .parse()
            .expect("a number")
    };
    let done = count(" succeeded") + count(" failed") + count(" interrupted");
    let (_, tail) = line.rsplit_once(" in ").expect("` in `");
    let (t, rest) = tail.split_once(" (").expect("` (`");
    let secs = match t.strip_suffix("ms") {
        Some(ms) => ms.parse::<f64>().expect("ms") / 1000.0,
        None => t.strip_suffix('s').expect("s").parse::<f64>().expect("s"),
    };
    let rate = rest.split_once(' ').expect("rate").0.parse().expect("a rate");
    (done, secs, rate)
}

#[test]
fn ctrl_c_stops_a_batch_at_a_recorded_point_and_the_same_command_continues() {
    const N: usize = 40;
    let dir = TempDir::new("batch-sigint");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", items_flow(&fx));
    write_input(&dir, N);
    let child = batch_cmd(&dir, &flow, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    // Stop it once an item has finished (the summary's rate needs one), however loaded the
    // machine is.
    let started = std::time::Instant::now();
    while read_lines(&dir.path().join("out.jsonl")).is_empty() && started.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, stderr) = interrupt(child);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("stopping: no new items"), "{stderr}");
    // The command to continue is the one given, every option kept.
    let hint = stderr
        .lines()
        .find_map(|l| l.strip_prefix("to continue, run the same command again: "))
        .unwrap_or_else(|| panic!("no command to continue: {stderr}"));
    assert!(
        hint.ends_with("--output out.jsonl --concurrency 8 --store sqlite:runs.db"),
        "{hint}"
    );
    let partial = read_lines(&dir.path().join("out.jsonl"));
    assert!(partial.len() < N, "stopped early: {} lines", partial.len());
    // The rate counts the items that finished, not the ones never started.
    let (done, secs, rate) = summary_rate(&stderr);
    // (Lines stop at the first unfinished item; items after it may have finished too.)
    assert!(done >= partial.len() as f64 && done < N as f64, "{stderr}");
    assert!((rate - done / secs).abs() <= 0.02 * rate + 0.1, "{stderr}");
    // Nothing stopped half-way was left in doubt: in-flight steps finished and were recorded.
    let out = run(&mut batch_cmd(&dir, &flow, &[]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let lines = read_lines(&dir.path().join("out.jsonl"));
    assert_eq!(lines.len(), N);
    assert!(lines.iter().all(|l| l["status"] == "succeeded"));
    let counts = effects(&fx);
    assert_eq!(counts.len(), N);
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");

    // On a throwaway store there is nothing to continue: it says so rather than send anyone
    // to run the command again.
    let child = switchyard(dir.path())
        .arg("batch")
        .arg(&flow)
        .args([
            "--input",
            "in.jsonl",
            "--output",
            "memory.jsonl",
            "--concurrency",
            "1",
        ])
        .args(["--store", "memory"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    std::thread::sleep(Duration::from_millis(300));
    let (code, stderr) = interrupt(child);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr.contains("with `--store memory` nothing of this batch was kept")
            && !stderr.contains("to continue"),
        "{stderr}"
    );
}

#[test]
fn retry_failed_runs_only_the_failed_items_again() {
    let dir = TempDir::new("batch-retry-failed");
    let fx = dir.path().join("effects");
    let broken = dir.path().join("broken");
    // Odd items fail while the `broken` file exists.
    dir.write(
        "flaky.yaml",
        format!(
            r#"flow: flaky
agents:
  work:
    kind: command
    run: [sh, -c, 'read -r x; printf "%s\n" "$x" >> "{fx}"; case "$x" in *[13579]\"*) test -e "{broken}" && exit 3;; esac; printf "%s" "$x"']
    idempotent: true
steps:
  go:
    agent: work
    output: {{$.done: $.id}}
"#,
            fx = fx.display(),
            broken = broken.display()
        ),
    );
    dir.write("broken", "");
    let mut input = String::new();
    for i in 0..10 {
        input.push_str(&json!({"id": format!("t{i}")}).to_string());
        input.push('\n');
    }
    dir.write("in.jsonl", input);
    let batch = |extra: &[&str]| {
        run(switchyard(dir.path())
            .args([
                "batch",
                "flaky.yaml",
                "--input",
                "in.jsonl",
                "--output",
                "out.jsonl",
            ])
            .args(["--store", "sqlite:runs.db"])
            .args(extra))
    };
    let out = batch(&[]);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    let lines = read_lines(&dir.path().join("out.jsonl"));
    let failed: Vec<&str> = lines
        .iter()
        .filter(|l| l["status"] == "failed")
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["t1", "t3", "t5", "t7", "t9"]);
    assert_eq!(lines[1]["error"]["kind"], "agent");
    std::fs::remove_file(&broken).unwrap();
    // Without --retry-failed the failures stand.
    assert_eq!(batch(&[]).code(), 1);
    assert_eq!(effects(&fx).values().sum::<usize>(), 10);
    let out = batch(&["--retry-failed"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let lines = read_lines(&dir.path().join("out.jsonl"));
    assert!(lines.iter().all(|l| l["status"] == "succeeded"), "{lines:?}");
    // Only the five failed items ran again.
    let counts = effects(&fx);
    for i in 0..10 {
        assert_eq!(counts[&format!("t{i}")], if i % 2 == 1 { 2 } else { 1 }, "t{i}");
    }
}

#[test]
fn a_batch_whose_flow_changed_is_not_resumed_without_allow_changed() {
    let dir = TempDir::new("batch-changed");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", items_flow(&fx));
    write_input(&dir, 80);
    let mut child = spawn_batch(&dir, &flow);
    // Until some runs are under way, then a crash.
    let waited = std::time::Instant::now();
    while effects(&fx).len() < 10 {
        assert!(
            waited.elapsed() < Duration::from_secs(15),
            "the batch never started runs"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let text = std::fs::read_to_string(&flow).unwrap();
    dir.write(
        "items.yaml",
        text.replace("flow: items\n", "flow: items\ndescription: edited\n"),
    );
    let out = run(&mut batch_cmd(&dir, &flow, &[]));
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("started from another version of the flow `items`")
            && out.stderr.contains("--allow-changed"),
        "{}",
        out.stderr
    );
    let out = run(&mut batch_cmd(
        &dir,
        &flow,
        &["--allow-changed", "--retry-in-doubt"],
    ));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(read_lines(&dir.path().join("out.jsonl")).len(), 80);
}

#[test]
fn without_a_terminal_a_batch_prints_plain_progress_lines_and_a_summary() {
    let dir = TempDir::new("batch-progress");
    dir.write(
        "slow.yaml",
        "flow: slow\nagents:\n  wait:\n    kind: mock\n    latency: 300ms\n    returns: {ok: true}\nsteps:\n  go:\n    agent: wait\n    output: {$.ok: $.ok}\n",
    );
    let mut input = String::new();
    for i in 0..8 {
        input.push_str(&format!("{{\"id\": \"p{i}\"}}\n"));
    }
    dir.write("in.jsonl", input);
    let out = run(switchyard(dir.path()).args([
        "batch",
        "slow.yaml",
        "--input",
        "in.jsonl",
        "--output",
        "out.jsonl",
        "--concurrency",
        "2",
        "--progress-every",
        "1",
    ]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let progress: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("batch: ") && l.contains("/8 done"))
        .collect();
    assert!(!progress.is_empty(), "{}", out.stderr);
    assert!(
        progress[0].contains("in flight") && progress[0].contains("/s") && progress[0].contains("ETA"),
        "{}",
        progress[0]
    );
    assert!(
        out.stderr
            .contains("batch: 8 items: 8 succeeded, 0 failed, 0 interrupted"),
        "{}",
        out.stderr
    );

    // With `--log-format json` they are JSON lines too: every line on stderr parses.
    let out = run(switchyard(dir.path()).args([
        "--log-format",
        "json",
        "batch",
        "slow.yaml",
        "--input",
        "in.jsonl",
        "--output",
        "json.jsonl",
        "--concurrency",
        "2",
        "--progress-every",
        "1",
    ]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let events: Vec<Value> = out
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let progress: Vec<_> = events.iter().filter(|e| e["event"] == "batch_progress").collect();
    assert!(!progress.is_empty(), "{}", out.stderr);
    assert!(
        progress
            .iter()
            .all(|p| p["total"] == 8 && p["in_flight"].as_u64() <= Some(2)),
        "{progress:?}"
    );
    let summary: Vec<_> = events.iter().filter(|e| e["event"] == "batch_summary").collect();
    assert_eq!(summary.len(), 1, "{}", out.stderr);
    assert_eq!(
        (&summary[0]["succeeded"], &summary[0]["total"]),
        (&json!(8), &json!(8))
    );
}

/// A batch refuses what would lose or misreport data: an output that is its own input (under
/// any name), and an input line that is no longer what its recorded run started from.
#[test]
fn a_batch_refuses_its_input_as_output_and_a_line_changed_under_its_run() {
    let dir = TempDir::new("batch-refuse");
    dir.write(
        "f.yaml",
        "flow: f\nagents:\n  dbl: {kind: transform, result: {v: =input.n * 2}}\nsteps:\n  go:\n    agent: dbl\n    output: {$.v: $.v}\n",
    );
    let input = "{\"id\": \"a\", \"n\": 1}\n{\"id\": \"b\", \"n\": 2}\n";
    dir.write("in.jsonl", input);
    let batch = |output: &str, extra: &[&str]| {
        run(switchyard(dir.path())
            .args(["batch", "f.yaml", "--input", "in.jsonl", "--output", output])
            .args(["--store", "sqlite:runs.db"])
            .args(extra))
    };
    std::os::unix::fs::symlink(dir.path().join("in.jsonl"), dir.path().join("link.jsonl"))
        .expect("a symlink");
    for output in ["in.jsonl", "./in.jsonl", "link.jsonl"] {
        let out = batch(output, &[]);
        assert_eq!(out.code(), 2, "{}", out.stderr);
        assert!(
            out.stderr.contains("is both the input and the output"),
            "{}",
            out.stderr
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("in.jsonl")).unwrap(),
            input
        );
    }

    let out = batch("out.jsonl", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let first = read_lines(&dir.path().join("out.jsonl"));
    assert_eq!(first[0]["output"]["v"], 2);
    // Item `a` changed, its id did not: its recorded result is not this line's.
    dir.write(
        "in.jsonl",
        "{\"id\": \"a\", \"n\": 100}\n{\"id\": \"b\", \"n\": 2}\n",
    );
    let out = batch("out.jsonl", &[]);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "in.jsonl line 1: item `a` is not the input its recorded run `{}` started from",
            first[0]["run_id"].as_str().unwrap()
        )),
        "{}",
        out.stderr
    );
    // The same input again continues as before.
    dir.write("in.jsonl", input);
    let out = batch("out.jsonl", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(read_lines(&dir.path().join("out.jsonl")), first);
}

/// While a `batch` process runs, its runs are its own: `resume` and `runs cancel` of one are
/// refused (the batch continues it itself), and the step is called once.
#[test]
fn a_running_batchs_runs_are_not_resumed_or_cancelled_by_another_command() {
    let dir = TempDir::new("batch-live");
    let calls = dir.path().join("calls");
    let flow = dir.write(
        "slow.yaml",
        format!(
            r#"flow: slow
agents:
  pay:
    kind: command
    run: [sh, -c, 'cat >/dev/null; echo x >> "{}"; sleep 1; echo "{{\"paid\": true}}"']
    idempotent: false
steps:
  pay: {{agent: pay, output: "*"}}
"#,
            calls.display()
        ),
    );
    dir.write("in.jsonl", "{\"id\": \"only\"}\n");
    let batch = batch_cmd(&dir, &flow, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let started = std::time::Instant::now();
    while !calls.exists() {
        assert!(started.elapsed() < crate::support::HANG, "the call never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let listed = run(switchyard(dir.path()).args(["runs", "list", "--json", "--store", "sqlite:runs.db"]));
    let run_id =
        serde_json::from_str::<Value>(listed.stdout.lines().next().expect("a run")).expect("JSON")["id"]
            .as_str()
            .expect("an id")
            .to_string();
    for (command, act) in [
        (vec!["resume", &run_id], "resume"),
        (vec!["runs", "cancel", &run_id], "cancel"),
    ] {
        let out = run(switchyard(dir.path())
            .args(&command)
            .args(["--store", "sqlite:runs.db"]));
        assert_eq!(out.code(), 2, "{command:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(&format!(
                "run `{run_id}` is being run by another process (pid {}, host {}): it is an item of the batch \
                 writing {}",
                batch.id(),
                switchyard::__private::store::writers::host_name(),
                dir.path().join("out.jsonl").display()
            )) && out.stderr.contains(&format!("before you {act} the run here")),
            "{command:?}: {}",
            out.stderr
        );
    }
    let out = batch.wait_with_output().expect("exits");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = read_lines(&dir.path().join("out.jsonl"));
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["status"], "succeeded");
    assert_eq!(lines[0]["output"], json!({"id": "only", "paid": true}));
    assert_eq!(std::fs::read_to_string(&calls).unwrap().lines().count(), 1);
    // Once the batch is done the lock is free again: an ended run is refused for what it is.
    let out = run(switchyard(dir.path()).args(["runs", "cancel", &run_id, "--store", "sqlite:runs.db"]));
    assert!(out.stderr.contains("already ended succeeded"), "{}", out.stderr);
}

/// A batch is its output file, however it is spelled: killed while writing `out.jsonl`, it
/// continues through a symlinked directory and through `..`, with no item started over (its
/// non-idempotent command ran once, or is reported in doubt) and no run left behind.
#[test]
fn every_spelling_of_the_output_file_continues_the_same_batch() {
    const N: usize = 40;
    let dir = TempDir::new("batch-spelling");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", items_flow(&fx));
    write_input(&dir, N);
    std::fs::create_dir_all(dir.path().join("sub")).unwrap();
    std::os::unix::fs::symlink(dir.path(), dir.path().join("link")).expect("a symlink");
    let batch = |output: &str, extra: &[&str]| {
        let mut cmd = switchyard(dir.path());
        cmd.arg("batch")
            .arg(&flow)
            .args(["--input", "in.jsonl", "--output", output, "--concurrency", "4"])
            .args(["--store", "sqlite:runs.db"])
            .args(extra);
        cmd
    };
    // Killed once some commands ran, with others in flight.
    let mut child = batch("out.jsonl", &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    while effects(&fx).len() < 8 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the batch ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().expect("SIGKILL");
    let _ = child.wait();

    // Through a symlinked directory: it continues, and runs no command twice.
    let out = run(&mut batch("link/out.jsonl", &[]));
    assert!(out.stderr.contains("from an earlier start"), "{}", out.stderr);
    let lines = read_lines(&dir.path().join("out.jsonl"));
    assert_eq!(lines.len(), N, "{}", out.stderr);
    for (id, n) in effects(&fx) {
        assert_eq!(n, 1, "`{id}` ran {n} times: the batch started over");
    }
    // Through `..`: the in-doubt items are retried, and the batch is the same one.
    let out = run(&mut batch("sub/../out.jsonl", &["--retry-in-doubt"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(out.stderr.contains(&format!("{N} succeeded")), "{}", out.stderr);
    // One run per item, none of them left running.
    let listed = run(switchyard(dir.path()).args([
        "runs",
        "list",
        "--json",
        "--limit",
        "1000",
        "--store",
        "sqlite:runs.db",
    ]));
    let runs: Vec<Value> = listed
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line per run"))
        .collect();
    assert_eq!(runs.len(), N, "{}", listed.stdout);
    assert!(
        runs.iter().all(|r| r["status"] == "succeeded"),
        "{}",
        listed.stdout
    );
    // Once finished, every spelling writes the same lines from the store.
    let finished = read_lines(&dir.path().join("out.jsonl"));
    for output in [
        "./link/sub/../out.jsonl",
        &dir.path().join("out.jsonl").display().to_string(),
    ] {
        let out = run(&mut batch(output, &[]));
        assert!(
            out.stderr.contains(&format!("({N} from an earlier start)")),
            "{}",
            out.stderr
        );
        assert_eq!(read_lines(&dir.path().join("out.jsonl")), finished);
    }
}

/// `--id-field` takes a dotted path; the output's `id` is the input's value as it was (a
/// number stays a number, also when written again from the store); a field no line has, and
/// an id that is neither a string nor a number, are refused before anything runs.
#[test]
fn the_id_field_is_a_dotted_path_and_ids_keep_their_type() {
    let dir = TempDir::new("batch-id-field");
    let fx = dir.path().join("effects");
    dir.write(
        "f.yaml",
        format!(
            "flow: f\nagents:\n  side:\n    kind: command\n    run: [sh, -c, 'cat >> \"{fx}\"; echo >> \"{fx}\"; echo {{}}']\n    idempotent: false\nsteps:\n  go:\n    agent: side\n",
            fx = fx.display()
        ),
    );
    let batch = |field: &str, command: &str| {
        run(switchyard(dir.path())
            .args([command, "f.yaml", "--input", "in.jsonl", "--output", "out.jsonl"])
            .args(["--id-field", field, "--store", "sqlite:runs.db"]))
    };
    dir.write(
        "in.jsonl",
        concat!(
            "{\"ticket\": {\"id\": 0, \"subject\": \"a\"}}\n",
            "{\"ticket\": {\"id\": \"T-2\"}, \"id\": \"top\"}\n",
            "{\"ticket\": {\"subject\": \"no id\"}}\n",
            "{\"ticket\": {\"id\": 4.5}}\n",
        ),
    );
    let ids = || -> Vec<Value> {
        read_lines(&dir.path().join("out.jsonl"))
            .iter()
            .map(|l| l["id"].clone())
            .collect()
    };
    let expected = vec![json!(0), json!("T-2"), json!("3"), json!(4.5)];
    let out = batch("ticket.id", "batch");
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(ids(), expected);
    // Written again from the store, and exported: the same ids, of the same types.
    let out = batch("ticket.id", "batch");
    assert!(out.stderr.contains("(4 from an earlier start)"), "{}", out.stderr);
    assert_eq!(ids(), expected);
    let out = run(switchyard(dir.path())
        .args([
            "runs",
            "export",
            "f.yaml",
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
        ])
        .args(["--id-field", "ticket.id", "--store", "sqlite:runs.db"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(ids(), expected);
    let ran = std::fs::read_to_string(&fx).unwrap().lines().count();
    assert_eq!(ran, 4);

    // A field that no line has (a typo, a top-level key for a nested one).
    std::fs::remove_file(dir.path().join("out.jsonl")).unwrap();
    let out = batch("tiket.id", "batch");
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("in.jsonl: no line has the id field `tiket.id`"),
        "{}",
        out.stderr
    );
    // An id that cannot be one: named by its line, not replaced by the line number.
    for (value, what) in [
        ("null", "null"),
        ("true", "a boolean"),
        ("{\"n\": 1}", "an object"),
    ] {
        dir.write(
            "in.jsonl",
            format!("{{\"ticket\": {{\"id\": \"T-1\"}}}}\n\n{{\"ticket\": {{\"id\": {value}}}}}\n"),
        );
        let out = batch("ticket.id", "batch");
        assert_eq!(out.code(), 2, "{}", out.stderr);
        assert!(
            out.stderr.contains(&format!(
                "in.jsonl line 3: the id field `ticket.id` is {what}: an id is a string or a number"
            )),
            "{}",
            out.stderr
        );
    }
    assert!(!dir.path().join("out.jsonl").exists(), "nothing was written");
    assert_eq!(
        std::fs::read_to_string(&fx).unwrap().lines().count(),
        ran,
        "nothing ran"
    );
    // Without --id-field, lines without `id` are named by their line number, as before.
    dir.write("in.jsonl", "{\"n\": 1}\n{\"n\": 2}\n");
    let out = run(switchyard(dir.path())
        .args([
            "batch",
            "f.yaml",
            "--input",
            "in.jsonl",
            "--output",
            "plain.jsonl",
        ])
        .args(["--store", "sqlite:runs.db"]));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let plain: Vec<Value> = read_lines(&dir.path().join("plain.jsonl"))
        .iter()
        .map(|l| l["id"].clone())
        .collect();
    assert_eq!(plain, [json!("1"), json!("2")]);
}

/// Whether the process `pid` is gone (or a zombie nobody reaped yet).
fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// A batch killed with SIGKILL takes its `command` agents with it: the programs in flight and
/// what they started in the background.
#[test]
fn a_batch_killed_with_sigkill_leaves_no_agent_process_running() {
    let dir = TempDir::new("batch-kill-agents");
    let pids = dir.path().join("pids");
    let flow = dir.write(
        "slow.yaml",
        format!(
            r#"flow: slow
agents:
  slow:
    kind: command
    run: [sh, -c, 'read -r x; sleep 60 & echo "$$ $!" >> "{}"; wait; printf "%s" "$x"']
steps:
  call:
    agent: slow
    output: "*"
"#,
            pids.display()
        ),
    );
    write_input(&dir, 4);
    let mut child = batch_cmd(&dir, &flow, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    let started: Vec<i32> = (0..500)
        .find_map(|_| {
            let text = std::fs::read_to_string(&pids).unwrap_or_default();
            let all: Vec<i32> = text.split_whitespace().filter_map(|p| p.parse().ok()).collect();
            if all.len() >= 8 {
                return Some(all);
            }
            std::thread::sleep(Duration::from_millis(20));
            None
        })
        .expect("four agents started");
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let survivors =
        |pids: &[i32]| -> Vec<i32> { pids.iter().copied().filter(|p| !process_gone(*p)).collect() };
    let mut left = survivors(&started);
    for _ in 0..100 {
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        left = survivors(&left);
    }
    for pid in &left {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(
        left.is_empty(),
        "agent processes outlived the batch: {left:?} of {started:?}"
    );
}
