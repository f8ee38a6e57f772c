//! A `worker`'s own settings and exits on the real PostgreSQL: the heartbeat that follows
//! `--lease`, and the runs a worker gives back when it cannot run their bundle.
//!
//! Needs `SWITCHYARD_TEST_DATABASE_URL`; every test works in a fresh schema, dropped after.

use std::time::Duration;

use crate::cluster::{Pg, effects, log_of, side_effect_flow, spawn_worker, submit, wait_exit, write_input};
use crate::support::TempDir;

/// `--lease` alone sets the heartbeat to a third of it: a lease shorter than the old fixed
/// heartbeat is accepted, and renewed while calls outlast it.
#[test]
fn a_short_lease_alone_gets_a_heartbeat_that_renews_it() {
    let pg = Pg::new("lease_alone");
    let dir = TempDir::new("worker-lease-alone");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", side_effect_flow(&fx, "2.5"));
    write_input(&dir, 2);
    let url = pg.url("sy_lease_alone");
    assert_eq!(submit(&dir, &flow, &url, "l", &[]).code(), 0);
    let mut w = spawn_worker(
        &dir,
        &url,
        "w",
        &["--lease", "1500ms", "--concurrency", "2", "--exit-when-idle"],
    );
    let status = wait_exit(&mut w, Duration::from_secs(60), "the worker");
    assert_eq!(status.code(), Some(0), "{}", log_of(&dir, "w"));
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM runs WHERE status = 'succeeded' AND parent_run IS NULL"),
        2
    );
    // Each call outlasted the lease; renewed, no run was taken over or run twice.
    assert_eq!(pg.count("SELECT COALESCE(MAX(recoveries), 0) FROM runs"), 0);
    assert!(effects(&fx).values().all(|n| *n == 1), "{:?}", effects(&fx));
}

/// A worker that cannot read a batch's bundle exits (2), and gives back every run it claimed
/// with it, not only the first: none stays leased to it until its lease runs out.
#[test]
fn a_worker_stopped_by_an_unreadable_bundle_gives_back_every_run_it_claimed() {
    let pg = Pg::new("bad_bundle");
    let dir = TempDir::new("worker-bad-bundle");
    let fx = dir.path().join("effects");
    let flow = dir.write("items.yaml", side_effect_flow(&fx, "0"));
    write_input(&dir, 8);
    let url = pg.url("sy_bad_bundle");
    assert_eq!(submit(&dir, &flow, &url, "b", &[]).code(), 0);
    pg.query("UPDATE bundles SET files = 'not a bundle'");
    let mut w = spawn_worker(
        &dir,
        &url,
        "w",
        &["--concurrency", "4", "--lease", "60s", "--exit-when-idle"],
    );
    let status = wait_exit(&mut w, Duration::from_secs(60), "the worker");
    let log = log_of(&dir, "w");
    assert_eq!(status.code(), Some(2), "{log}");
    // It claimed several runs at once (a claim takes up to a quarter more than --concurrency).
    assert!(
        pg.count("SELECT COUNT(*) FROM runs WHERE status = 'running'") > 1,
        "{log}"
    );
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM runs WHERE lease_owner IS NOT NULL"),
        0,
        "runs still leased to a worker that exited: {:?}",
        pg.query("SELECT id, status, lease_owner FROM runs ORDER BY item_index")
    );
    assert!(effects(&fx).is_empty(), "nothing ran");
}
