//! One writer per run (SPEC §7.3): two `resume`s of one run started together, on SQLite and
//! PostgreSQL, an `interrupt`'s decision and an agent loop's approval — the step after the
//! decision has its effect once, one `resume` continues the run and the other is refused
//! (exit 2) naming the process that runs it; a `resume` of a run a live `run` process is
//! running is refused the same way, and succeeds at once after that process is killed;
//! `runs show` names the process that runs a run (a `run`, a worker), or says it is gone.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard::__private::record::{RunRecord, StepRecord};
use switchyard::__private::store::memory::MemoryStore;
use switchyard::__private::store::sql::SqlStore;
use switchyard::__private::store::{RunFilter, Store, StoreError, Writer};
use switchyard::{Error, Flow, RunConfig, RunStatus, Switchyard};
use switchyard::{ResumeError, ResumeOptions};

use crate::cluster::Pg;
use crate::mock_server::{Llm, Reply};
use crate::support::{HANG, TempDir, run, run_id_from, switchyard};

/// How many times each race is run: each round is a fresh run raced by two `resume`s.
const ROUNDS: usize = 4;

/// A run stopped at an `interrupt`; its decision leads to `refund`, a command that is not
/// idempotent and appends a line (its idempotency key and attempt) to `paid`, slowly enough
/// that a second `resume` comes while the first one runs it.
fn interrupt_flow(paid: &Path) -> String {
    format!(
        r#"flow: refund
agents:
  pay:
    kind: command
    run: [sh, -c, 'cat >/dev/null; echo "$SWITCHYARD_IDEMPOTENCY_KEY $SWITCHYARD_ATTEMPT" >> "{paid}"; sleep 0.3; echo "{{\"paid\": true}}"']
    idempotent: false
steps:
  approve:
    interrupt: {{prompt: "refund?", schema: {{type: object, required: [ok], properties: {{ok: {{type: boolean}}}}}}}}
    output: {{$.ok: $.ok}}
    next: refund
  refund: {{agent: pay, output: {{$.paid: $.paid}}}}
"#,
        paid = paid.display()
    )
}

/// An agent loop whose `refund` tool needs approval and appends its input to `paid`.
fn approval_flow(base_url: &str, paid: &Path) -> String {
    format!(
        r#"flow: refunds
providers:
  local: {{base_url: {base_url}}}
agents:
  agent:
    kind: llm
    provider: local
    model: m1
    prompt: "Ticket: {{{{ input.text }}}}"
    tools:
      refund: {{description: Refunds an amount.}}
    approve: [refund]
  refund:
    kind: command
    run: [sh, -c, 'cat >> "{paid}"; printf "\n" >> "{paid}"; sleep 0.3; printf "{{\"refunded\": true}}"']
    idempotent: false
steps:
  answer: {{agent: agent, input: {{$.text: $.text}}, output: {{$.reply: $}}}}
"#,
        paid = paid.display()
    )
}

/// The model: a refund call until it is told the call's result, then an answer.
fn refund_model(body: &Value) -> Reply {
    let told = body["messages"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
    if told {
        Reply::Answer("Refunded.".into())
    } else {
        Reply::calls(1, &[("refund", r#"{"amount": 100}"#)])
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Starts `switchyard resume ID --decision DECISION` in `dir` on `store`, piped.
fn start_resume(dir: &Path, store: &str, id: &str, decision: &str) -> Child {
    switchyard(dir)
        .args(["resume", id, "--decision", decision, "--store", store])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start resume")
}

/// Waits for `child` (at most [`HANG`]): its exit code and stderr.
fn finish(child: Child) -> (i32, String) {
    let id = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output().expect("wait"));
    let deadline = Instant::now() + HANG;
    while !waiter.is_finished() {
        assert!(Instant::now() < deadline, "resume (pid {id}) hangs");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = waiter.join().expect("waiter");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Two `resume ID --decision D` of run `id` started together: exactly one continues the run
/// (exit 0); the other is refused with exit 2, naming the process that runs it, or who
/// answered first, or — when it came only after the first one ended — saying the run is no
/// longer waiting.
fn race_two_resumes(dir: &Path, store: &str, id: &str, decision: &str) {
    let a = start_resume(dir, store, id, decision);
    let b = start_resume(dir, store, id, decision);
    let mut outs = [finish(a), finish(b)];
    outs.sort_by_key(|(code, _)| *code);
    let [(won, won_err), (lost, lost_err)] = outs;
    assert_eq!(
        (won, lost),
        (0, 2),
        "one resume continues, one is refused: {won_err}\n---\n{lost_err}"
    );
    let refused = lost_err.contains(&format!("run `{id}` is being run by another process (pid "))
        && lost_err.contains(", host ")
        || lost_err.contains(&format!("run `{id}` already ended succeeded"))
        || lost_err.contains(&format!("run `{id}` was continued by another process meanwhile"))
        // The decision is recorded first (SPEC §15): the second one is refused as an answer.
        || lost_err.contains("was not decided here: already decided by ");
    assert!(refused, "the refusal says why: {lost_err}");
}

/// Runs the interrupt flow to its stop, races two `resume`s of it, and checks the refund was
/// made once, at attempt 1 of its step.
fn interrupt_rounds(dir: &TempDir, store: &str) {
    let paid = dir.path().join("paid");
    dir.write("refund.yaml", interrupt_flow(&paid));
    for round in 0..ROUNDS {
        let out = run(switchyard(dir.path()).args(["run", "refund.yaml", "--input", "{}", "--store", store]));
        assert_eq!(out.code(), 3, "{out:?}");
        let id = run_id_from(&out.stderr);
        race_two_resumes(dir.path(), store, &id, r#"{"ok": true}"#);
        let made = lines(&paid);
        assert_eq!(
            made.len(),
            round + 1,
            "round {round}: the refund is made once: {made:?}"
        );
        assert_eq!(made[round], format!("{id}:2 1"), "attempt 1 of the run's step 2");
    }
}

#[test]
fn two_resumes_of_an_interrupt_take_its_decision_once_on_sqlite() {
    let dir = TempDir::new("one-writer-sqlite");
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    interrupt_rounds(&dir, &store);
}

#[test]
fn two_resumes_of_an_interrupt_take_its_decision_once_on_postgres() {
    let pg = Pg::new("one_writer");
    let dir = TempDir::new("one-writer-pg");
    interrupt_rounds(&dir, &pg.url("one_writer"));
}

#[test]
fn two_resumes_of_an_approval_take_its_decision_once() {
    let server = Llm::start();
    server.respond_with(refund_model);
    let dir = TempDir::new("one-writer-approval");
    let paid = dir.path().join("paid");
    dir.write("refunds.yaml", approval_flow(&server.base_url(), &paid));
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    for round in 0..ROUNDS {
        let out = run(switchyard(dir.path()).args([
            "run",
            "refunds.yaml",
            "--input",
            r#"{"text": "refund my order"}"#,
            "--store",
            &store,
        ]));
        assert_eq!(out.code(), 3, "{out:?}");
        let id = run_id_from(&out.stderr);
        race_two_resumes(dir.path(), &store, &id, r#"{"approve": true}"#);
        let made = lines(&paid);
        assert_eq!(
            made.len(),
            round + 1,
            "round {round}: the refund is made once: {made:?}"
        );
        assert_eq!(
            serde_json::from_str::<Value>(&made[round]).expect("JSON"),
            json!({"amount": 100})
        );
    }
}

/// A flow whose first step is a call that, the first time, hangs (a live `run` is inside it);
/// called again (by a `resume --retry-in-doubt`) it answers at once. `then` is not idempotent.
fn hanging_flow(calls: &Path, then: &Path) -> String {
    format!(
        r#"flow: hang
agents:
  slow:
    kind: command
    run: [sh, -c, 'cat >/dev/null; n=$(cat "{calls}" 2>/dev/null | wc -l); echo x >> "{calls}"; if [ "$n" -eq 0 ]; then sleep 60; fi; echo "{{\"ok\": true}}"']
    idempotent: false
  after:
    kind: command
    run: [sh, -c, 'cat >/dev/null; echo x >> "{then}"; echo "{{\"done\": true}}"']
    idempotent: false
steps:
  first: {{agent: slow, output: {{$.ok: $.ok}}, next: second}}
  second: {{agent: after, output: {{$.done: $.done}}}}
"#,
        calls = calls.display(),
        then = then.display()
    )
}

/// The id of the one run recorded in `store`.
fn only_run(dir: &Path, store: &str) -> String {
    let out = run(switchyard(dir).args(["runs", "list", "--json", "--store", store]));
    assert_eq!(out.code(), 0, "{out:?}");
    let runs: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(runs.len(), 1, "{}", out.stdout);
    runs[0]["id"].as_str().expect("an id").to_string()
}

/// A `run` of [`hanging_flow`] in `dir`, on a SQLite store there, once it is inside its first
/// call: the process, its run's id, the store's URL and the file the step after it writes.
struct Live {
    live: Child,
    id: String,
    store: String,
    then: PathBuf,
}

fn start_hanging_run(dir: &TempDir) -> Live {
    let calls = dir.path().join("calls");
    let then = dir.path().join("then");
    dir.write("hang.yaml", hanging_flow(&calls, &then));
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    let live: Child = switchyard(dir.path())
        .args(["run", "hang.yaml", "--input", "{}", "--store", &store])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start run");
    // The run is inside its first call once the call has left its line.
    let deadline = Instant::now() + HANG;
    while lines(&calls).is_empty() {
        assert!(Instant::now() < deadline, "the first call never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let id = only_run(dir.path(), &store);
    Live {
        live,
        id,
        store,
        then,
    }
}

#[test]
fn a_resume_of_a_run_a_live_process_runs_is_refused_until_that_process_dies() {
    let dir = TempDir::new("one-writer-live");
    let Live {
        mut live,
        id,
        store,
        then,
    } = start_hanging_run(&dir);
    let resume =
        |dir: &Path| run(switchyard(dir).args(["resume", &id, "--retry-in-doubt", "--store", &store]));
    let out = resume(dir.path());
    assert_eq!(out.code(), 2, "{out:?}");
    let host = switchyard::__private::store::writers::host_name();
    assert!(
        out.stderr.contains(&format!(
            "run `{id}` is being run by another process (pid {}, host {host})",
            live.id()
        )),
        "{}",
        out.stderr
    );
    assert!(lines(&then).is_empty(), "nothing ran past the live run's step");

    live.kill().expect("kill -9 the run");
    live.wait().expect("reaped");
    // At once: the holder's process is gone, no lease has to lapse (it lasts 30 s; the
    // command is killed after HANG, 20 s).
    let out = resume(dir.path());
    assert_eq!(out.code(), 0, "{out:?}");
    let status = run(switchyard(dir.path()).args(["runs", "show", &id, "--json", "--store", &store]));
    let doc: Value = serde_json::from_str(&status.stdout).expect("JSON");
    assert_eq!(doc["run"]["status"], "succeeded", "{}", status.stdout);
    assert_eq!(lines(&then).len(), 1);
}

// ------------------------------------------------------------------ the store's holdings

/// A writer of this process's pid under a new token: alive, so never found gone.
fn alive() -> Writer {
    Writer::this_process()
}

/// A writer of a process that has exited, on this host.
fn gone() -> Writer {
    let mut child = std::process::Command::new("true").spawn().expect("spawn true");
    let pid = child.id();
    child.wait().expect("reaped");
    Writer {
        pid,
        ..Writer::this_process()
    }
}

/// What every store keeps: one writer per run, refused to another naming its holder, renewed
/// and given back only by its own holder.
async fn one_writer_at_a_time(store: &impl Store) {
    let (first, second) = (alive(), alive());
    let lease = Duration::from_secs(30);
    store.take_run("a", &first, lease).await.expect("a free run");
    let held = store.take_run("a", &second, lease).await.expect_err("held");
    let StoreError::Held { run, pid, host } = &held else {
        panic!("{held:?}")
    };
    assert_eq!(
        (run.as_str(), *pid, host.as_str()),
        ("a", first.pid, first.host.as_str())
    );
    assert_eq!(
        held.to_string(),
        format!(
            "run `a` is being run by another process (pid {}, host {})",
            first.pid, first.host
        )
    );
    assert!(store.renew_run("a", &first, lease).await.expect("renew"));
    assert!(!store.renew_run("a", &second, lease).await.expect("renew"));
    store
        .give_back_run("a", &second)
        .await
        .expect("not its own: nothing");
    assert!(store.take_run("a", &second, lease).await.is_err());
    store.give_back_run("a", &first).await.expect("give back");
    store
        .take_run("a", &second, lease)
        .await
        .expect("given back, free");
}

/// What a store shared by processes keeps besides: a holder whose process is gone, or whose
/// lease lapsed, frees the run; the lapsed holder cannot renew it after.
async fn a_dead_holder_frees_the_run(store: &impl Store) {
    one_writer_at_a_time(store).await;
    let lease = Duration::from_secs(30);
    store.take_run("b", &gone(), lease).await.expect("a free run");
    store
        .take_run("b", &alive(), lease)
        .await
        .expect("its holder is gone");
    // On another host, a holder cannot be told gone: only its lease lapsing frees the run.
    let elsewhere = Writer {
        host: "elsewhere.example".into(),
        ..gone()
    };
    store
        .take_run("c", &elsewhere, Duration::from_millis(1))
        .await
        .expect("a free run");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let next = alive();
    store.take_run("c", &next, lease).await.expect("the lease lapsed");
    assert!(!store.renew_run("c", &elsewhere, lease).await.expect("renew"));
    assert!(store.take_run("c", &elsewhere, lease).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_holds_one_writer_per_run() {
    one_writer_at_a_time(&MemoryStore::new()).await;
    let dir = TempDir::new("one-writer-store");
    let url = format!("sqlite:{}", dir.path().join("runs.db").display());
    let sqlite = SqlStore::open(&url).await.expect("opens");
    a_dead_holder_frees_the_run(&sqlite).await;
    sqlite.close().await;
    let pg = Pg::new("one_writer_store");
    let postgres = SqlStore::open(&pg.url("one_writer_store")).await.expect("opens");
    a_dead_holder_frees_the_run(&postgres).await;
    postgres.close().await;
}

/// Through the library: a resume of a run another writer holds is refused with the typed
/// error naming it, and runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_refuses_a_held_run_with_a_typed_error() {
    let dir = TempDir::new("one-writer-library");
    let paid = dir.path().join("paid");
    let flow = Flow::load(dir.write("refund.yaml", interrupt_flow(&paid))).expect("loads");
    let url = format!("sqlite:{}", dir.path().join("runs.db").display());
    let sy = Switchyard::open(&url).await.expect("opens");
    let stopped = sy.run(&flow, json!({})).await.expect("runs");
    assert_eq!(stopped.status, RunStatus::Interrupted);
    let holder = alive();
    switchyard::__private::store_of(&sy)
        .take_run(&stopped.run_id, &holder, Duration::from_secs(30))
        .await
        .expect("taken");
    let options = || ResumeOptions::default().decision(json!({"ok": true}));
    let err = sy
        .resume(&flow, &stopped.run_id, options(), RunConfig::default())
        .await
        .expect_err("held");
    assert!(
        matches!(&err, Error::Resume(ResumeError::Store(StoreError::Held { pid, .. })) if *pid == holder.pid),
        "{err:?}"
    );
    assert!(lines(&paid).is_empty());
    switchyard::__private::store_of(&sy)
        .give_back_run(&stopped.run_id, &holder)
        .await
        .expect("given back");
    let done = sy
        .resume(&flow, &stopped.run_id, options(), RunConfig::default())
        .await
        .expect("resumes");
    assert_eq!(done.status, RunStatus::Succeeded);
    assert_eq!(lines(&paid).len(), 1);
    // Given back at its end: the next resume is told the run ended, not that it is held.
    let err = sy
        .resume(&flow, &stopped.run_id, options(), RunConfig::default())
        .await
        .expect_err("ended");
    assert!(
        matches!(err, Error::Resume(ResumeError::Finished { .. })),
        "{err:?}"
    );
    sy.close().await;
}

/// A memory store in which another process continues a run right before this one takes it,
/// once armed: the run's record changes between the resume's first look and its take.
#[derive(Default)]
struct ContinuedMeanwhile {
    inner: MemoryStore,
    armed: std::sync::atomic::AtomicBool,
}

impl Store for ContinuedMeanwhile {
    fn blobs(&self) -> std::sync::Arc<dyn switchyard::__private::store::blobs::Blobs> {
        self.inner.blobs()
    }
    fn inbox(&self) -> std::sync::Arc<dyn switchyard::__private::store::inbox::Inbox> {
        self.inner.inbox()
    }
    async fn create_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        self.inner.create_run(run).await
    }
    async fn update_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        self.inner.update_run(run).await
    }
    async fn record_step(&self, step: StepRecord) -> Result<(), StoreError> {
        self.inner.record_step(step).await
    }
    async fn get_run(&self, id: &str) -> Result<RunRecord, StoreError> {
        self.inner.get_run(id).await
    }
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.list_runs(filter).await
    }
    async fn unfinished_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.unfinished_runs(filter).await
    }
    async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.inner.steps(run_id).await
    }
    async fn children(&self, run_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.children(run_id).await
    }
    async fn batch_runs(&self, batch: &str, from: u64, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.batch_runs(batch, from, limit).await
    }
    async fn take_run(&self, run_id: &str, writer: &Writer, lease: Duration) -> Result<(), StoreError> {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            // Another process took the decision, ran the run on, and it stopped again.
            let mut record = self.inner.get_run(run_id).await?;
            record.steps += 1;
            record.finished_at = record.finished_at.map(|t| t + 1);
            self.inner.update_run(&record).await?;
        }
        self.inner.take_run(run_id, writer, lease).await
    }
    async fn renew_run(&self, run_id: &str, writer: &Writer, lease: Duration) -> Result<bool, StoreError> {
        self.inner.renew_run(run_id, writer, lease).await
    }
    async fn give_back_run(&self, run_id: &str, writer: &Writer) -> Result<(), StoreError> {
        self.inner.give_back_run(run_id, writer).await
    }
}

/// A resume whose run another process continued between its look and its take does nothing
/// (the decision it carries answered a stop that is gone) and says so; a resume after it
/// continues the run as it is then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_whose_run_moved_on_meanwhile_takes_no_decision() {
    let dir = TempDir::new("one-writer-moved-on");
    let paid = dir.path().join("paid");
    let flow = Flow::load(dir.write("refund.yaml", interrupt_flow(&paid))).expect("loads");
    let store = Arc::new(ContinuedMeanwhile::default());
    let sy = switchyard::__private::with_store(store.clone());
    let stopped = sy.run(&flow, json!({})).await.expect("runs");
    assert_eq!(stopped.status, RunStatus::Interrupted);
    store.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let decision = || ResumeOptions::default().decision(json!({"ok": true}));
    let err = sy
        .resume(&flow, &stopped.run_id, decision(), RunConfig::default())
        .await
        .expect_err("moved on");
    assert!(
        matches!(&err, Error::Resume(ResumeError::MovedOn { .. })),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "run `{0}` was continued by another process meanwhile (it is interrupted now): nothing was done \
             here; `switchyard runs show {0}` shows where it is",
            stopped.run_id
        )
    );
    assert!(
        lines(&paid).is_empty(),
        "no refund from a decision for a stop that is gone"
    );
    let done = sy
        .resume(&flow, &stopped.run_id, decision(), RunConfig::default())
        .await
        .expect("resumes");
    assert_eq!(done.status, RunStatus::Succeeded);
    assert_eq!(lines(&paid).len(), 1);
}

/// A submitted run (SPEC §12) is held by its lease: while a worker holds it, a resume of it
/// through the library (or `resume --flow`) is refused naming the worker's process and host.
#[test]
fn a_submitted_run_a_worker_holds_is_not_resumed_elsewhere() {
    use switchyard::__private::store::sql::queue::Claim;
    let pg = Pg::new("one_writer_leased");
    let url = pg.url("one_writer_leased");
    let dir = TempDir::new("one-writer-leased");
    let paid = dir.path().join("paid");
    let path = dir.write("refund.yaml", interrupt_flow(&paid));
    dir.write("in.jsonl", "{\"id\": \"a\"}\n");
    let out = crate::cluster::submit(&dir, &path, &url, "leased", &[]);
    assert_eq!(out.code(), 0, "{out:?}");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let sql = SqlStore::open(&url).await.expect("opens");
        let claimed = sql
            .claim(
                "db-2.example-4242-0badcafe",
                None,
                1,
                Duration::from_secs(30),
                Claim::Shared,
            )
            .await
            .expect("claims");
        let id = claimed[0].record.id.clone();
        let store = Arc::new(sql);
        let sy = switchyard::__private::with_store(store.clone());
        let flow = Flow::load(&path).expect("loads");
        let err = sy
            .resume(&flow, &id, ResumeOptions::default(), RunConfig::default())
            .await
            .expect_err("leased");
        assert_eq!(
            err.to_string(),
            format!("run `{id}` is being run by another process (pid 4242, host db-2.example)")
        );
        drop(sy);
        Arc::try_unwrap(store).expect("the only holder").close().await;
    });
    assert!(lines(&paid).is_empty());
}

/// The `status` line `runs show` prints for `id`.
fn shown_status(dir: &Path, store: &str, id: &str) -> String {
    let out = run(switchyard(dir).args(["runs", "show", id, "--store", store]));
    assert_eq!(out.code(), 0, "{out:?}");
    out.stdout
        .lines()
        .find(|l| l.starts_with("status "))
        .unwrap_or_else(|| panic!("no status line: {}", out.stdout))
        .to_string()
}

#[test]
fn runs_show_names_the_live_process_of_a_run_and_says_when_it_is_gone() {
    let dir = TempDir::new("one-writer-shown");
    let Live {
        mut live, id, store, ..
    } = start_hanging_run(&dir);
    let host = switchyard::__private::store::writers::host_name();
    let pid = live.id();
    let status = shown_status(dir.path(), &store, &id);
    assert_eq!(
        status,
        format!(
            "status    running, a `switchyard run` or `resume` process runs it now (pid {pid}, host {host})"
        )
    );
    live.kill().expect("kill -9 the run");
    live.wait().expect("reaped");
    let status = shown_status(dir.path(), &store, &id);
    assert_eq!(
        status,
        format!(
            "status    running, stopped by a crash: the process that ran it (pid {pid}, host {host}) is gone"
        )
    );
}

#[test]
fn runs_show_of_a_submitted_run_a_worker_holds_names_the_worker() {
    use switchyard::__private::store::sql::queue::Claim;
    let pg = Pg::new("one_writer_shown");
    let url = pg.url("one_writer_shown");
    let dir = TempDir::new("one-writer-shown-leased");
    let paid = dir.path().join("paid");
    let path = dir.write("refund.yaml", interrupt_flow(&paid));
    dir.write("in.jsonl", "{\"id\": \"a\"}\n");
    let out = crate::cluster::submit(&dir, &path, &url, "shown", &[]);
    assert_eq!(out.code(), 0, "{out:?}");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let id = rt.block_on(async {
        let sql = SqlStore::open(&url).await.expect("opens");
        let claimed = sql
            .claim(
                "db-2.example-4242-0badcafe",
                None,
                1,
                Duration::from_secs(30),
                Claim::Shared,
            )
            .await
            .expect("claims");
        let id = claimed[0].record.id.clone();
        sql.close().await;
        id
    });
    let status = shown_status(dir.path(), &url, &id);
    assert_eq!(
        status,
        "status    running, a `switchyard worker` runs it now (pid 4242, host db-2.example)"
    );
}

#[test]
fn a_cancel_of_a_run_a_live_process_runs_is_refused_until_that_process_dies() {
    let dir = TempDir::new("one-writer-cancel");
    let Live {
        mut live,
        id,
        store,
        then,
    } = start_hanging_run(&dir);
    let cancel = |dir: &Path| run(switchyard(dir).args(["runs", "cancel", &id, "--store", &store]));
    let out = cancel(dir.path());
    assert_eq!(out.code(), 2, "{out:?}");
    let host = switchyard::__private::store::writers::host_name();
    assert!(
        out.stderr.contains(&format!(
            "run `{id}` is being run by another process (pid {}, host {host})",
            live.id()
        )),
        "{}",
        out.stderr
    );
    assert!(shown_status(dir.path(), &store, &id).starts_with("status    running"));

    live.kill().expect("kill -9 the run");
    live.wait().expect("reaped");
    let out = cancel(dir.path());
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(out.stdout.trim(), format!("cancelled {id}"));
    assert_eq!(shown_status(dir.path(), &store, &id), "status    cancelled");
    assert!(lines(&then).is_empty(), "nothing ran past the killed run's step");
}

#[test]
fn runs_show_names_the_resume_that_continues_a_batch_item() {
    let dir = TempDir::new("one-writer-shown-item");
    let calls = dir.path().join("calls");
    dir.write(
        "wait.yaml",
        format!(
            "flow: wait\nagents:\n  slow:\n    kind: command\n    run: [sh, -c, 'cat >/dev/null; echo x >> \"{}\"; sleep 60; echo \"{{}}\"']\nsteps:\n  only: {{agent: slow, output: {{}}}}\n",
            calls.display()
        ),
    );
    dir.write("in.jsonl", "{\"id\": \"a\"}\n");
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    let wait_for_calls = |n: usize| {
        let deadline = Instant::now() + HANG;
        while lines(&calls).len() < n {
            assert!(Instant::now() < deadline, "call {n} never started");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let spawn = |args: &[&str]| -> Child {
        switchyard(dir.path())
            .args(args)
            .args(["--store", &store])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts")
    };
    let mut batch = spawn(&[
        "batch",
        "wait.yaml",
        "--input",
        "in.jsonl",
        "--output",
        "out.jsonl",
    ]);
    wait_for_calls(1);
    batch.kill().expect("kill -9 the batch");
    batch.wait().expect("reaped");
    let id = only_run(dir.path(), &store);

    let mut resume = spawn(&["resume", &id, "--retry-in-doubt"]);
    wait_for_calls(2);
    let host = switchyard::__private::store::writers::host_name();
    let status = shown_status(dir.path(), &store, &id);
    let pid = resume.id();
    resume.kill().expect("kill -9 the resume");
    resume.wait().expect("reaped");
    assert_eq!(
        status,
        format!(
            "status    running, a `switchyard run` or `resume` process runs it now (pid {pid}, host {host})"
        )
    );
}
