//! Queued writes of the SQL store: committed, in order, by the next awaited write or by a
//! flush, and a lost one refused to every later write of its run.

use switchyard::__private::record::{RunStatus, StepStatus};
use switchyard::__private::store::sql::SqlStore;
use switchyard::__private::store::{Store, StoreError};

use crate::store::{run, step};
use crate::support::TempDir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_writes_commit_before_the_next_awaited_one_and_a_failed_one_stops_its_run() {
    let dir = TempDir::new("store-queued");
    let url = format!("sqlite:{}", dir.path().join("runs.db").display());
    let store = SqlStore::open(&url).await.expect("opens");
    // Queued: not waited for, committed by the next awaited write.
    store
        .queue_run(&run("q1", "f", 1, RunStatus::Running, false))
        .await
        .expect("queued");
    store
        .queue_step(step("q1", "1", 1, StepStatus::Succeeded, true))
        .await
        .expect("queued");
    store
        .update_run(&run("q1", "f", 1, RunStatus::Succeeded, false))
        .await
        .expect("commits all three");
    assert_eq!(store.steps("q1").await.expect("steps").len(), 1);
    assert_eq!(
        store.get_run("q1").await.expect("get_run").status,
        RunStatus::Succeeded
    );
    // A queued write that fails (a step of a run that does not exist) refuses the run's
    // later writes, so that its records never skip one.
    store
        .queue_step(step("ghost", "1", 1, StepStatus::Succeeded, false))
        .await
        .expect("queued");
    // Once a later awaited write (of another run) returns, the queued one has been tried.
    store
        .create_run(&run("q2", "f", 3, RunStatus::Running, false))
        .await
        .expect("another run");
    let err = store
        .create_run(&run("ghost", "f", 2, RunStatus::Running, false))
        .await
        .expect_err("refused after a lost write");
    assert!(
        err.to_string().contains("an earlier write of the run failed"),
        "{err}"
    );
    assert!(matches!(
        store.get_run("ghost").await,
        Err(StoreError::NotFound(_))
    ));
    // Other runs are not affected.
    store
        .create_run(&run("q2", "f", 3, RunStatus::Running, false))
        .await
        .expect("another run");
    store.close().await;
}

/// `flush` is the barrier before an effect: once it returns, every write queued before it is
/// committed (another connection reads it); after a queued write of a run failed, the run's
/// flush fails as its next write would, and other runs' flushes do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_commits_what_was_queued_and_reports_a_lost_write() {
    let dir = TempDir::new("store-flush");
    let url = format!("sqlite:{}", dir.path().join("runs.db").display());
    let store = SqlStore::open(&url).await.expect("opens");
    let reader = SqlStore::open(&url).await.expect("a second store on the file");
    store
        .queue_run(&run("f1", "f", 1, RunStatus::Running, false))
        .await
        .expect("queued");
    for n in ["1", "2", "3"] {
        store
            .queue_step(step("f1", n, 1, StepStatus::Succeeded, true))
            .await
            .expect("queued");
    }
    store.flush("f1").await.expect("flushed");
    let numbers: Vec<String> = reader
        .steps("f1")
        .await
        .expect("steps")
        .into_iter()
        .map(|s| s.number)
        .collect();
    assert_eq!(numbers, ["1", "2", "3"]);
    // Nothing queued: a flush answers at once, and writes nothing.
    store.flush("f1").await.expect("nothing to flush");
    // A lost queued write: a step of a run that does not exist.
    store
        .queue_step(step("ghost", "1", 1, StepStatus::Succeeded, false))
        .await
        .expect("queued");
    let err = store.flush("ghost").await.expect_err("the run lost a write");
    assert!(
        err.to_string().contains("an earlier write of the run failed"),
        "{err}"
    );
    store
        .flush("f1")
        .await
        .expect("another run's flush is not affected");
    reader.close().await;
    store.close().await;
}

/// Queued writes with no awaited write after them are not held for one: the writer commits
/// them after a short wait of its own, so another process reads them without a flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_writes_alone_are_committed_after_a_short_wait() {
    let dir = TempDir::new("store-linger");
    let url = format!("sqlite:{}", dir.path().join("runs.db").display());
    let store = SqlStore::open(&url).await.expect("opens");
    let reader = SqlStore::open(&url).await.expect("a second store on the file");
    store
        .queue_run(&run("l1", "f", 1, RunStatus::Running, false))
        .await
        .expect("queued");
    store
        .queue_step(step("l1", "1", 1, StepStatus::Succeeded, true))
        .await
        .expect("queued");
    // Well past the writer's wait (50 ms), well short of anything a test would time out on.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match reader.steps("l1").await {
            Ok(steps) if steps.len() == 1 => break,
            _ if std::time::Instant::now() < until => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            other => panic!("the queued writes were not committed within 5 s: {other:?}"),
        }
    }
    assert_eq!(
        reader.get_run("l1").await.expect("get_run").status,
        RunStatus::Running
    );
    reader.close().await;
    store.close().await;
}
