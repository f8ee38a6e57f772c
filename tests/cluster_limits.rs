//! Provider limits across workers (SPEC §12) on the real PostgreSQL: three `worker` processes
//! of the binary run one submitted batch of `llm` calls against a local OpenAI-compatible
//! server, and together they keep the provider's `rate_limit` and `max_concurrency`, where
//! each alone would keep only its own share of it.
//!
//! Needs `SWITCHYARD_TEST_DATABASE_URL`; every test works in a fresh schema, dropped after.

use std::process::Child;
use std::time::Duration;

use crate::cluster::{Pg, log_of, spawn_worker, submit, wait_exit, write_input};
use crate::mock_server::{Llm, Reply};
use crate::support::TempDir;

/// A flow of one `llm` step whose provider has the limits `limits` (YAML lines under it).
fn llm_flow(base_url: &str, limits: &str) -> String {
    format!(
        r#"flow: limited
input:
  schema: {{type: object, required: [id, n], properties: {{n: {{type: integer}}}}}}
providers:
  local:
    base_url: {base_url}
{limits}
agents:
  ask:
    kind: llm
    provider: local
    model: m1
    prompt: "Item {{{{ input.n }}}}"
    max_tokens: 20
steps:
  ask:
    agent: ask
    input: {{$.n: $.n}}
    output: {{$.answer: $}}
"#
    )
}

/// Submits `n` items of `flow_text` as batch `batch`, runs three workers of 16 runs each until
/// the batch is done, and checks every item succeeded and all three took part.
fn run_three_workers(tag: &str, flow_text: &str, n: usize) {
    let pg = Pg::new(tag);
    let dir = TempDir::new(&format!("cluster-{tag}"));
    let flow = dir.write("limited.yaml", flow_text);
    write_input(&dir, n);
    let out = submit(&dir, &flow, &pg.url(&format!("sy_{tag}")), "b", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let args = [
        "--concurrency",
        "16",
        "--lease",
        "2s",
        "--heartbeat",
        "500ms",
        "--exit-when-idle",
    ];
    let mut workers: Vec<(String, Child)> = (1..=3)
        .map(|i| {
            let name = format!("w{i}");
            let child = spawn_worker(&dir, &pg.url(&format!("sy_{tag}_{name}")), &name, &args);
            (name, child)
        })
        .collect();
    for (name, w) in &mut workers {
        let status = wait_exit(w, Duration::from_secs(120), name);
        assert!(status.success(), "{name}:\n{}", log_of(&dir, name));
    }
    let logs = || {
        workers
            .iter()
            .map(|(name, _)| format!("{name}:\n{}", log_of(&dir, name)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        pg.count(
            "SELECT COUNT(*) FROM run_records WHERE batch = 'b' AND status = 'succeeded' AND parent_run IS NULL"
        ),
        n as i64,
        "{}",
        logs()
    );
    assert_eq!(
        pg.count("SELECT COUNT(DISTINCT lease_owner) FROM run_records WHERE batch = 'b'"),
        3,
        "every worker ran some of the batch\n{}",
        logs()
    );
    // Every slot a worker took is given back by the time it exits.
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM provider_slots WHERE worker IS NOT NULL"),
        0
    );
}

/// 600 requests a minute is ten a second: the shared pace spaces the requests of all three
/// workers a tenth of a second apart (on the database's clock), so no second sees more than
/// eleven; each worker alone would send ten a second, thirty together.
#[test]
fn three_workers_together_keep_the_request_rate() {
    const N: usize = 75;
    let server = Llm::start();
    server.default_reply(Reply::Answer("ok".into()));
    let flow = llm_flow(&server.base_url(), "    rate_limit: {requests_per_minute: 600}");
    run_three_workers("rate", &flow, N);
    let hits = server.hits();
    assert_eq!(hits.len(), N);
    assert!(hits.iter().all(|h| h.status == 200));
    let max = server.max_requests_in(Duration::from_secs(1));
    assert!(max <= 11, "{max} requests in one second");
    // Paced, not merely bounded: N requests take N - 1 intervals of a tenth of a second.
    let first = hits.iter().map(|h| h.at).min().expect("hits");
    let last = hits.iter().map(|h| h.at).max().expect("hits");
    let span = (last - first).as_secs_f64();
    assert!(
        span >= (N - 1) as f64 * 0.1 * 0.95,
        "{N} requests within {span:.2}s"
    );
}

/// `max_concurrency: 2` with answers taking 100 ms: three workers of 16 runs never have more
/// than two requests at the server at once; each alone would have two, six together.
#[test]
fn three_workers_together_keep_the_concurrency_limit() {
    const N: usize = 60;
    let server = Llm::start();
    server
        .default_reply(Reply::Answer("ok".into()))
        .latency(Duration::from_millis(100));
    let flow = llm_flow(&server.base_url(), "    max_concurrency: 2");
    run_three_workers("slots", &flow, N);
    assert_eq!(server.hits().len(), N);
    let max = server.max_in_flight();
    assert!(max <= 2, "{max} requests at the server at once");
    assert_eq!(max, 2, "both slots were used");
}

/// A worker killed while it holds a provider's only slot does not keep it: once its lease has
/// run out, the worker that takes its runs over takes the slot too, and the batch finishes
/// with never two requests at the server at once.
#[test]
fn a_killed_workers_slot_comes_back_after_its_lease() {
    const N: usize = 3;
    let server = Llm::start();
    server
        .default_reply(Reply::Answer("ok".into()))
        .latency(Duration::from_millis(1500));
    let pg = Pg::new("slotkill");
    let dir = TempDir::new("cluster-slotkill");
    let flow = dir.write(
        "limited.yaml",
        llm_flow(&server.base_url(), "    max_concurrency: 1"),
    );
    write_input(&dir, N);
    let url = pg.url("sy_slotkill");
    let out = submit(&dir, &flow, &url, "b", &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let lease = ["--concurrency", "4", "--lease", "2s", "--heartbeat", "400ms"];
    let mut w1 = spawn_worker(&dir, &url, "w1", &lease);
    crate::cluster::wait_for(Duration::from_secs(30), "a request at the server", || {
        server.in_flight() == 1
    });
    let _ = w1.kill();
    let _ = w1.wait();
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM provider_slots WHERE worker IS NOT NULL"),
        1,
        "the dead worker's slot is still on record"
    );
    let mut args = lease.to_vec();
    args.push("--exit-when-idle");
    let mut w2 = spawn_worker(&dir, &url, "w2", &args);
    let status = wait_exit(&mut w2, Duration::from_secs(60), "worker 2");
    assert!(status.success(), "{}", log_of(&dir, "w2"));
    assert_eq!(
        pg.count(
            "SELECT COUNT(*) FROM run_records WHERE batch = 'b' AND status = 'succeeded' AND parent_run IS NULL"
        ),
        N as i64,
        "{}",
        log_of(&dir, "w2")
    );
    assert!(server.hits().len() >= N, "{} requests", server.hits().len());
    assert_eq!(server.max_in_flight(), 1, "never two requests at once");
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM provider_slots WHERE worker IS NOT NULL"),
        0
    );
}

/// On PostgreSQL a claim takes one slot however many are free (an `IN` subquery with
/// `SKIP LOCKED` can be run again for each row the update scans, and then takes them all),
/// and the next slot row is added only while fewer than the limit exist.
#[test]
fn a_slot_claim_takes_one_slot_on_postgres() {
    use switchyard::__private::store::sql::SqlStore;
    let pg = Pg::new("claim");
    let url = pg.url("sy_claim");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let store = SqlStore::open(&url).await.expect("the store opens");
        let l = store.limits();
        let lease = Duration::from_secs(30);
        for expect in 0..4 {
            assert_eq!(l.claim_slot("k", 4, "w1", lease).await.unwrap(), Some(expect));
        }
        assert_eq!(l.claim_slot("k", 4, "w1", lease).await.unwrap(), None);
        assert_eq!(l.release_slots("w1").await.unwrap(), 4);
        assert_eq!(l.claim_slot("k", 4, "w2", lease).await.unwrap(), Some(0));
        store.close().await;
    });
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM provider_slots WHERE worker IS NOT NULL"),
        1,
        "{:?}",
        pg.query("SELECT slot, worker FROM provider_slots ORDER BY slot")
    );
    assert_eq!(pg.count("SELECT COUNT(*) FROM provider_slots"), 4);
}
