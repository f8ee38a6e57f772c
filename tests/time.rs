//! Time in expressions, through the real binary (SPEC §5.1): `timestamp()`, `duration()` and
//! `now`, which is fixed once per run tree at its first start and recorded, so a run routes
//! the same when it is resumed later.

use serde_json::{Value, json};
use switchyard::__private::expr::time::{Duration, Timestamp};

use crate::support::{TempDir, run, run_id_from, switchyard};

const STORE: [&str; 2] = ["--store", "sqlite:runs.db"];

/// Routes a ticket by its age; records `now` as written into JSON, and what a child run, a
/// `foreach` iteration (in an agent definition) and a template see of it.
const AGE: &str = r#"flow: age
agents:
  child:
    kind: flow
    steps:
      look:
        set: {$.seen: "=string(now)"}
    output:
      select: $.seen
  stamp:
    kind: transform
    result: "=string(now)"
steps:
  route:
    set: {$.checked_at: "=now", $.window: "=duration('24h')", $.note: "={'at': now}"}
    next:
      - to: stale
        if: now - timestamp(payload.ticket.created_at) > duration('24h')
      - to: fresh
  stale:
    set: {$.age: {value: stale}}
    next: call
  fresh:
    set: {$.age: {value: fresh}}
    next: call
  call:
    agent: child
    output: {$.child_now: $}
    next: each
  each:
    foreach: $.items
    agent: stamp
    output: {$.item_now: $}
"#;

fn run_age(dir: &TempDir, created_at: &str) -> crate::support::Output {
    let input = json!({"ticket": {"created_at": created_at}, "items": [1, 2, 3]});
    run(switchyard(dir.path())
        .args(["run", "age.yaml", "--input", &input.to_string()])
        .args(STORE))
}

fn stdout_json(out: &crate::support::Output) -> Value {
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

#[test]
fn now_routes_on_the_age_of_a_ticket_and_is_one_value_per_run_tree() {
    let dir = TempDir::new("time-age");
    dir.write("age.yaml", AGE);
    let lint = run(switchyard(dir.path()).args(["lint", "age.yaml"]));
    assert_eq!(lint.code(), 0, "{lint:?}");

    let hour = Duration::parse("1h").expect("a duration");
    let old = Timestamp::now()
        .checked_sub(Duration::parse("25h").expect("a duration"))
        .expect("in range");
    let recent = Timestamp::now().checked_sub(hour).expect("in range");
    // Written with an offset: the same instant.
    let out = run_age(&dir, &old.to_string().replace('Z', "+00:00"));
    assert_eq!(out.code(), 0, "{out:?}");
    let stale = stdout_json(&out);
    assert_eq!(stale["age"], "stale", "{stale}");
    assert_eq!(stale["window"], "86400s");
    let out = run_age(&dir, &recent.to_string());
    assert_eq!(out.code(), 0, "{out:?}");
    let fresh = stdout_json(&out);
    assert_eq!(fresh["age"], "fresh", "{fresh}");

    // One `now` for the run, its child run and every iteration.
    let now = fresh["checked_at"].as_str().expect("now written as text");
    let parsed = Timestamp::parse(now).expect("RFC 3339");
    assert!(parsed > recent, "{now}");
    assert_eq!(fresh["note"], json!({"at": now}));
    assert_eq!(fresh["child_now"], now, "{fresh}");
    assert_eq!(fresh["item_now"], json!([now, now, now]), "{fresh}");
    // Each run has its own.
    assert_ne!(stale["checked_at"], fresh["checked_at"]);

    // A string that is no timestamp fails the edge, naming the expression.
    let out = run_age(&dir, "last week");
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(
        out.stderr
            .contains("`timestamp`: `last week` is not an RFC 3339 timestamp"),
        "{}",
        out.stderr
    );
}

/// Stops at an interrupt after writing `now`, and writes it again once resumed.
const HOLD: &str = r#"flow: hold
steps:
  before:
    set: {$.before: "=string(now)"}
    next: approve
  approve:
    interrupt: {prompt: "approve at {{ now }}?", schema: {type: object}}
    next: after
  after:
    set:
      $.after: "=string(now)"
      $.same: "=now == timestamp(payload.before)"
      $.waited: "=now - timestamp(payload.before) < duration('1s')"
"#;

fn stop_at_the_interrupt(dir: &TempDir) -> String {
    dir.write("hold.yaml", HOLD);
    let out = run(switchyard(dir.path())
        .args(["run", "hold.yaml", "--input", "{}"])
        .args(STORE));
    assert_eq!(out.code(), 3, "{out:?}");
    run_id_from(&out.stderr)
}

fn resume(dir: &TempDir, id: &str) -> Value {
    let out = run(switchyard(dir.path())
        .args(["resume", id, "--decision", "{}"])
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    stdout_json(&out)
}

#[test]
fn a_resumed_run_sees_the_now_of_its_first_start() {
    let dir = TempDir::new("time-resume");
    let id = stop_at_the_interrupt(&dir);
    let shown = run(switchyard(dir.path())
        .args(["runs", "show", &id, "--json"])
        .args(STORE));
    assert_eq!(shown.code(), 0, "{shown:?}");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let out = resume(&dir, &id);
    let before = out["before"].as_str().expect("before");
    assert_eq!(out["after"], before, "{out}");
    assert_eq!(out["same"], true);
    assert_eq!(out["waited"], true);
    // The interrupt's question was rendered with the same `now`.
    assert!(
        shown.stdout.contains(&format!("approve at {before}?")),
        "{}",
        shown.stdout
    );
}

/// A run recorded before `now` was (schema 4: no `now_us` column) resumes with its start
/// as `now`, and records it from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_from_a_schema_4_store_resumes_with_its_start_as_now() {
    use sqlx::Connection;
    let dir = TempDir::new("time-schema-4");
    let id = stop_at_the_interrupt(&dir);
    let db = dir.path().join("runs.db");
    let mut conn = crate::store::raw(&db).await;
    for sql in crate::store::SCHEMA_5_TO_4 {
        sqlx::query(*sql).execute(&mut conn).await.expect(sql);
    }
    let started_at: i64 = sqlx::query_scalar("SELECT started_at FROM runs WHERE id = $1")
        .bind(&id)
        .fetch_one(&mut conn)
        .await
        .expect("the run");
    conn.close().await.expect("close");

    let out = resume(&dir, &id);
    let start = Timestamp::from_unix_micros(started_at * 1000).expect("in range");
    assert_eq!(out["after"], start.to_string(), "{out}");
    // The first start's `now` and its recorded start are the same moment, give or take the
    // time between taking one and the other (small, but not bounded on a loaded machine).
    let before = Timestamp::parse(out["before"].as_str().expect("before")).expect("RFC 3339");
    assert!(
        (before.unix_micros() - start.unix_micros()).abs() < 1_000_000,
        "{out}"
    );

    let mut conn = crate::store::raw(&db).await;
    let recorded: Option<i64> = sqlx::query_scalar("SELECT now_us FROM runs WHERE id = $1")
        .bind(&id)
        .fetch_one(&mut conn)
        .await
        .expect("the run");
    conn.close().await.expect("close");
    assert_eq!(recorded, Some(start.unix_micros()));
}

/// Routes on the age of a ticket against `now`; its tests pin `now` so the route is fixed.
const PINNED: &str = r#"flow: pinned
steps:
  route:
    set: {$.at: "=string(now)"}
    next:
      - to: stale
        if: now - timestamp(payload.created) > duration('24h')
      - to: fresh
  stale:
    set: {$.age: {value: stale}}
  fresh:
    set: {$.age: {value: fresh}}
tests:
  - name: a day and a second old is stale
    now: "2026-03-02T09:00:01Z"
    input: {created: "2026-03-01T09:00:00Z"}
    expect:
      path: [route, stale]
      output: {age: stale, at: "2026-03-02T09:00:01Z"}
  - name: a day old is fresh
    now: "2026-03-02T11:00:00+02:00"
    input: {created: "2026-03-01T09:00:00Z"}
    expect:
      path: [route, fresh]
      output: {age: fresh, at: "2026-03-02T09:00:00Z"}
"#;

#[test]
fn a_flow_test_pins_now_and_routes_on_it() {
    let dir = TempDir::new("pinned-now");
    dir.write("pinned.yaml", PINNED);
    let out = run(switchyard(dir.path()).args(["test", "pinned.yaml"]));
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(out.stdout.contains("2 passed, 0 failed"), "{out:?}");
}

#[test]
fn a_bad_now_in_a_flow_test_is_an_error_at_its_value() {
    let dir = TempDir::new("pinned-now-bad");
    dir.write(
        "bad.yaml",
        PINNED.replace("\"2026-03-02T09:00:01Z\"", "\"2026-03-02 09:00:01\""),
    );
    let out = run(switchyard(dir.path()).args(["test", "bad.yaml"]));
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("invalid `now`"), "{out:?}");
    assert!(out.stderr.contains("bad.yaml:15:10"), "{out:?}");
    let out = run(switchyard(dir.path()).args(["lint", "bad.yaml"]));
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stdout.contains("bad.yaml:15:10"), "{out:?}");
}

#[test]
fn run_now_pins_the_time_a_run_routes_on_and_records() {
    let dir = TempDir::new("run-now");
    dir.write("age.yaml", AGE);
    let input = json!({"ticket": {"created_at": "2026-03-01T09:00:00Z"}, "items": [1]});
    let out = run(switchyard(dir.path())
        .args(["run", "age.yaml", "--input", &input.to_string()])
        .args(["--now", "2026-03-01T10:00:00.5Z"])
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    let v = stdout_json(&out);
    assert_eq!(v["checked_at"], "2026-03-01T10:00:00.5Z", "{v}");
    assert_eq!(v["age"], "fresh", "{v}");
    assert_eq!(v["child_now"], "2026-03-01T10:00:00.5Z", "{v}");
    let out = run(switchyard(dir.path())
        .args(["run", "age.yaml", "--input", &input.to_string()])
        .args(["--now", "2026-03-05T00:00:00Z"])
        .args(STORE));
    assert_eq!(stdout_json(&out)["age"], "stale", "{out:?}");
    for (bad, says) in [
        ("yesterday", "not an RFC 3339 timestamp"),
        ("2026-03-01T10:00:00.0000001Z", "finer than a microsecond"),
    ] {
        let out = run(switchyard(dir.path())
            .args(["run", "age.yaml", "--now", bad])
            .args(STORE));
        assert_eq!(out.code(), 2, "{out:?}");
        assert!(out.stderr.contains("--now"), "{out:?}");
        assert!(out.stderr.contains(says), "{out:?}");
    }
}

#[test]
fn batch_now_pins_the_now_of_every_item() {
    let dir = TempDir::new("batch-now");
    dir.write(
        "stamp.yaml",
        "flow: stamp\nsteps:\n  s:\n    set: {$.at: \"=string(now)\"}\n",
    );
    dir.write("in.jsonl", "{\"id\": 1}\n{\"id\": 2}\n");
    let out = run(switchyard(dir.path())
        .args([
            "batch",
            "stamp.yaml",
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
        ])
        .args(["--now", "2026-03-01T09:00:00+01:00"])
        .args(STORE));
    assert_eq!(out.code(), 0, "{out:?}");
    let text = std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{text}");
    for l in lines {
        assert_eq!(l["output"]["at"], "2026-03-01T08:00:00Z", "{l}");
    }
}

/// Reads `now` in named zones and fixed offsets: the calendar and the zones of the database
/// bundled into the binary, whatever the machine's own (`TZDIR` points nowhere here, `TZ`
/// names another zone).
const ZONES: &str = r#"flow: zones
steps:
  read:
    set:
      $.new_york: "=now.getHours('America/New_York')"
      $.paris: "=now.getHours('Europe/Paris')"
      $.kolkata: "=now.getMinutes('Asia/Kolkata')"
      $.sydney: "=[now.getDate('Australia/Sydney'), now.getDayOfWeek('Australia/Sydney')]"
      $.fixed: "=now.getHours('+05:30')"
      $.utc: "=[now.getFullYear(), now.getDayOfYear(), now.getHours()]"
      $.east: "=[now.getFullYear('+01:00'), now.getMonth('+01:00'), now.getDayOfWeek('+01:00')]"
"#;

fn read_zones(dir: &TempDir, now: &str) -> Value {
    let out = run(switchyard(dir.path())
        .args(["run", "zones.yaml", "--input", "{}", "--now", now])
        .env("TZDIR", dir.path())
        .env("TZ", "Asia/Tokyo"));
    assert_eq!(out.code(), 0, "{out:?}");
    stdout_json(&out)
}

#[test]
fn now_reads_in_time_zones_across_a_change_of_clocks() {
    let dir = TempDir::new("time-zones");
    dir.write("zones.yaml", ZONES);
    // New York moves its clocks from 02:00 EST to 03:00 EDT on 8 March 2026, 07:00 UTC.
    let before = read_zones(&dir, "2026-03-08T06:59:59Z");
    assert_eq!(
        before,
        json!({
            "new_york": 1, "paris": 7, "kolkata": 29, "sydney": [8, 0], "fixed": 12,
            "utc": [2026, 66, 6], "east": [2026, 2, 0]
        })
    );
    let after = read_zones(&dir, "2026-03-08T07:00:00Z");
    assert_eq!(after["new_york"], 3, "{after}");
    assert_eq!(after["kolkata"], 30, "{after}");
    // CEL's last hour is, an hour east of UTC, the first of the year 10000 (a Saturday).
    let last = read_zones(&dir, "9999-12-31T23:00:00Z");
    assert_eq!(last["utc"], json!([9999, 364, 23]), "{last}");
    assert_eq!(last["east"], json!([10000, 0, 6]), "{last}");
    assert_eq!(last["paris"], 0, "{last}");

    // A zone the database does not have, or spelt otherwise, fails the step, naming it.
    for zone in ["Mars/Olympus", "america/new_york"] {
        dir.write(
            "bad.yaml",
            format!("flow: bad\nsteps:\n  read:\n    set: {{$.h: \"=now.getHours('{zone}')\"}}\n"),
        );
        let out = run(switchyard(dir.path()).args(["run", "bad.yaml", "--input", "{}"]));
        assert_eq!(out.code(), 1, "{out:?}");
        assert!(
            out.stderr.contains(&format!("unknown time zone `{zone}`")),
            "{}",
            out.stderr
        );
    }
}
