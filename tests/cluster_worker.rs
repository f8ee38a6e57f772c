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
