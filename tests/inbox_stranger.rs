//! The inbox used as a newcomer would, with made-up inputs: what the store holds (a question
//! rendered from a run's input, a reason, an actor) is printed by `inbox list`, `inbox show`
//! and `decisions log` with its control characters escaped, so a question cannot move the
//! cursor, recolour or ring a terminal.

use crate::support::{Output, TempDir, run, switchyard};

const STORE: [&str; 2] = ["--store", "sqlite:runs.db"];

const FLOW: &str = "flow: ask
input:
  schema:
    type: object
    required: [q]
    properties:
      q: {type: string}
steps:
  ask:
    interrupt:
      prompt: \"Ok {{ input.q }}?\"
      schema:
        type: object
        required: [approved]
        properties:
          approved: {type: boolean}
    output: {$.approval: $}
";

fn sy(dir: &TempDir, args: &[&str]) -> Output {
    run(switchyard(dir.path()).args(args).args(STORE))
}

#[test]
fn control_characters_of_a_question_a_reason_and_an_actor_are_escaped_on_the_terminal() {
    let dir = TempDir::new("inbox-stranger-control");
    dir.write("ask.yaml", FLOW);
    let input = serde_json::json!({"q": "<b>x</b>\u{1b}[31mRED\u{7}\rgone"}).to_string();
    let out = sy(&dir, &["run", "ask.yaml", "--input", &input]);
    assert_eq!(out.code(), 3, "{out:?}");

    let list = sy(&dir, &["inbox", "list"]);
    assert_eq!(list.code(), 0, "{list:?}");
    let show = sy(
        &dir,
        &["inbox", "show", &crate::support::run_id_from(&out.stderr)],
    );
    assert_eq!(show.code(), 0, "{show:?}");
    for printed in [&list.stdout, &show.stdout] {
        assert!(
            !printed.contains('\u{1b}') && !printed.contains('\u{7}') && !printed.contains('\r'),
            "a control character reached the terminal: {printed:?}"
        );
        assert!(printed.contains("<b>x</b>\\u{1b}[31mRED\\u{7}"), "{printed}");
    }

    let id = show
        .stdout
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    let decide = sy(
        &dir,
        &[
            "inbox",
            "decide",
            &id,
            "--decision",
            r#"{"approved": false}"#,
            "--reason",
            "no\u{1b}[2J",
            "--actor",
            "eve\u{1b}]0;t\u{7}",
        ],
    );
    assert_eq!(decide.code(), 0, "{decide:?}");
    let log = sy(&dir, &["decisions", "log"]);
    assert_eq!(log.code(), 0, "{log:?}");
    let show = sy(&dir, &["inbox", "show", &id]);
    for printed in [&log.stdout, &show.stdout] {
        assert!(
            !printed.contains('\u{1b}') && !printed.contains('\u{7}'),
            "a control character reached the terminal: {printed:?}"
        );
        assert!(printed.contains("no\\u{1b}[2J"), "{printed}");
    }
}

#[test]
fn an_answer_given_without_user_or_logname_is_recorded_under_the_os_user() {
    let dir = TempDir::new("inbox-stranger-actor");
    dir.write("ask.yaml", FLOW);
    let out = sy(&dir, &["run", "ask.yaml", "--input", r#"{"q": "ok"}"#]);
    assert_eq!(out.code(), 3, "{out:?}");
    let run_id = crate::support::run_id_from(&out.stderr);
    let expected = std::process::Command::new("id")
        .arg("-un")
        .output()
        .expect("`id -un`");
    let expected = String::from_utf8(expected.stdout).unwrap().trim().to_string();
    assert!(!expected.is_empty());

    let decide = run(switchyard(dir.path())
        .args(["inbox", "decide", &run_id, "--decision", r#"{"approved": true}"#])
        .args(STORE)
        .env_remove("USER")
        .env_remove("LOGNAME"));
    assert_eq!(decide.code(), 0, "{decide:?}");
    let log = sy(&dir, &["decisions", "log", "--jsonl"]);
    let row: serde_json::Value = serde_json::from_str(log.stdout.trim()).expect("one row");
    assert_eq!(row["actor"], expected.as_str(), "{log:?}");
}
