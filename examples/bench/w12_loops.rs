//! W12 agent loops (BENCH.md): N items (20) of `w12_agent_loop.yaml`, an `llm` agent loop of
//! 4 turns with 2 tool calls per turn, through the release
//! `switchyard batch ... --concurrency N --store memory` as a whole process (the store of the
//! other batch workloads, W5 `batch-binary` and W5x).
//!
//! The model is this harness's own: a loopback OpenAI-compatible server ([`ModelServer`], on a
//! thread of its own) that answers every request 50 ms after it arrived, on the wall-clock
//! timer a `mock`'s `latency` uses (`switchyard::__private::agents::timer`). It tells which turn a request
//! is by counting its `tool` messages (turn = tool messages / tools per turn + 1), and checks
//! every one of them (its call id, in the model's order, and the tool's result for the
//! arguments it was given) before answering: turns 1 … T−1 call `lookup` and `score` (the
//! flow's two `mock` tools, 20 ms each) with `q = 100 i + 10 t + j`, turn T answers
//! `{i, calls, sum}`, the sum of every result it was sent. The shape `TURNS/TOOLS` is in the
//! URL path (`/w12/4/2/v1`), written into a generated copy of the flow.
//!
//! The latency floor of one loop is 4 × 50 ms + 3 × 20 ms = 260 ms; all N loops are in
//! flight at once, so that is the floor of the batch too. The server stamps each request's
//! arrival and answer, which gives, per repetition:
//!
//! - `span_s`: the first request's arrival to the last answer (the loops as the model sees
//!   them: no process start-up or exit), and `above_floor_pct` = (span − floor) / span;
//! - `us_between_turns`: per loop, each answer (turns 1-3) to the next request, less the
//!   tools' 20 ms: what the engine adds on the critical path per turn — reading the answer,
//!   recording the turn, starting, recording and answering two tool calls, writing the next
//!   request;
//! - CPU per turn and per tool call, from the child's CPU time (`wait4`) of the same batch
//!   in two more shapes run in the same repetition: 4 turns × 8 tools (18 more tool calls per
//!   loop) and 16 turns × 2 tools (12 more turns and 24 more tool calls per loop).
//!
//! Memory: the child's peak RSS (`VmHWM`, polled) in an untimed run at N, and the same command
//! on 1 item: `kib_per_loop_in_flight` = the difference / (N − 1).
//!
//! Variant `sqlite`: all of the above with `--store sqlite:DIR/runs.db`, a fresh DIR (and
//! database) per process, each store read back after its process ([`check_store`]: one
//! succeeded run per item, each with exactly the loop's step records), and
//! `cpu_turn_ratio_to_memory` = its CPU per turn / the memory store's of the same repetition.
//!
//! Variants `c32` and `c32-sqlite`: 32 loops in flight (`--concurrency 32`) on each store;
//! `raw-client`: no engine, 32 loops in the harness sending the engine's requests to the same
//! server ([`RawClient`]). Each reports `efficiency` = floor / span, and the engine's the
//! ratio of its efficiency to the raw client's of the same repetition.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use crate::Options;
use crate::batch_bin::{self, BatchCmd, Exit};
use crate::profile::{Profile, RUNS};
use crate::report::{Report, median};
use crate::util;

pub const ID: &str = "W12";
const FLOW: &str = "w12_agent_loop.yaml";
/// The `base_url` of the flow file, replaced in its generated copies.
const PLACEHOLDER_URL: &str = "http://127.0.0.1:9/w12/4/2/v1";
const MODEL_LATENCY: Duration = Duration::from_millis(50);
const TOOL_LATENCY: Duration = Duration::from_millis(20);
const TARGET_ABOVE_FLOOR_PCT: f64 = 1.0;
const TARGET_US_PER_TOOL_CALL: f64 = 100.0;

/// A loop's shape: model turns (the last one answers) and tool calls per earlier turn.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Shape {
    turns: u32,
    tools: u32,
}

impl Shape {
    const MAIN: Shape = Shape { turns: 4, tools: 2 };
    /// 18 more tool calls per loop than [`Shape::MAIN`], the same turns (8 a turn: one wave
    /// of the flow's `max_parallel_tools`).
    const MORE_TOOLS: Shape = Shape { turns: 4, tools: 8 };
    /// 12 more turns and 24 more tool calls per loop than [`Shape::MAIN`]: enough turns that
    /// their CPU stands out of a process's CPU from one run to the next (with 3 more turns it
    /// did not). Fewer than the 21 turns after which the loop is told to wrap up.
    const MORE_TURNS: Shape = Shape { turns: 16, tools: 2 };

    fn tool_calls(self) -> u32 {
        (self.turns - 1) * self.tools
    }

    /// The latency floor of one loop.
    fn floor(self) -> Duration {
        MODEL_LATENCY * self.turns + TOOL_LATENCY * (self.turns - 1)
    }
}

// ---------------------------------------------------------------- the model server

/// One request the model server answered.
#[derive(Clone, Debug)]
struct Hit {
    item: u64,
    turn: u32,
    arrived: Instant,
    answered: Instant,
}

#[derive(Default)]
struct ServerState {
    hits: Mutex<Vec<Hit>>,
    /// Requests that were not what the engine should have sent (answered 400).
    problems: Mutex<Vec<String>>,
}

/// The loopback model, serving on a thread of its own for the life of the harness.
struct ModelServer {
    addr: SocketAddr,
    state: Arc<ServerState>,
}

impl ModelServer {
    fn start() -> Result<ModelServer, String> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("w12-model".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(format!("cannot start the model server's runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    let state = Arc::new(ServerState::default());
                    let app = axum::Router::new()
                        .route("/w12/{turns}/{tools}/v1/chat/completions", post(completion))
                        .with_state(state.clone());
                    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = tx.send(Err(format!("the model server cannot bind 127.0.0.1: {e}")));
                            return;
                        }
                    };
                    let addr = listener.local_addr().map_err(|e| e.to_string());
                    let _ = tx.send(addr.map(|addr| ModelServer { addr, state }));
                    let _ = axum::serve(listener, app).await;
                });
            })
            .map_err(|e| format!("cannot start the model server's thread: {e}"))?;
        rx.recv()
            .map_err(|_| "the model server did not start".to_string())?
    }

    fn base_url(&self, shape: Shape) -> String {
        format!("http://{}/w12/{}/{}/v1", self.addr, shape.turns, shape.tools)
    }

    /// Forgets what earlier batches sent.
    fn clear(&self) {
        self.state.hits.lock().expect("not poisoned").clear();
        self.state.problems.lock().expect("not poisoned").clear();
    }

    fn hits(&self) -> Vec<Hit> {
        self.state.hits.lock().expect("not poisoned").clone()
    }

    fn problems(&self) -> Vec<String> {
        self.state.problems.lock().expect("not poisoned").clone()
    }
}

async fn completion(
    State(s): State<Arc<ServerState>>,
    UrlPath((turns, tools)): UrlPath<(u32, u32)>,
    body: Bytes,
) -> Response {
    let arrived = Instant::now();
    let shape = Shape { turns, tools };
    let (item, turn, message, finish) = match script(&body, shape) {
        Ok(r) => r,
        Err(why) => {
            s.problems.lock().expect("not poisoned").push(why.clone());
            return (StatusCode::BAD_REQUEST, why).into_response();
        }
    };
    let resp = json!({
        "id": format!("chatcmpl-{item}-{turn}"),
        "object": "chat.completion",
        "model": "bench-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    });
    let body = serde_json::to_vec(&resp).expect("JSON values serialize");
    let due = arrived + MODEL_LATENCY;
    let now = Instant::now();
    if due > now {
        switchyard::__private::agents::timer::sleep(due - now).await;
    }
    let answered = Instant::now();
    s.hits.lock().expect("not poisoned").push(Hit {
        item,
        turn,
        arrived,
        answered,
    });
    ([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The argument of call `j` (0-based) of turn `t` of item `i`, and what its tool answers.
fn call_of(i: u64, t: u32, j: u32) -> (&'static str, u64, Value) {
    let q = 100 * i + 10 * u64::from(t) + u64::from(j);
    if j.is_multiple_of(2) {
        ("lookup", q, json!({"v": q * 10}))
    } else {
        ("score", q, json!({"w": q + 1}))
    }
}

/// What the model answers to one request: (item, turn, assistant message, finish reason), or
/// why the request is wrong.
fn script(body: &[u8], shape: Shape) -> Result<(u64, u32, Value, &'static str), String> {
    let body: Value = serde_json::from_slice(body).map_err(|e| format!("the request is not JSON: {e}"))?;
    let messages = body["messages"]
        .as_array()
        .ok_or("the request has no `messages`")?;
    let offered = body["tools"].as_array().map_or(0, Vec::len);
    if offered != 2 {
        return Err(format!(
            "the request offers {offered} tools, not 2 (lookup, score)"
        ));
    }
    let item = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .find_map(|m| {
            m["content"]
                .as_str()?
                .strip_prefix("Item ")?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .ok_or("no user message `Item N` in the request")?;
    let results: Vec<&Value> = messages.iter().filter(|m| m["role"] == "tool").collect();
    let n = results.len() as u32;
    if shape.tools == 0 || !n.is_multiple_of(shape.tools) || n / shape.tools >= shape.turns {
        return Err(format!(
            "item {item}: {n} tool messages, not a whole number of turns of {} calls below {}",
            shape.tools, shape.turns
        ));
    }
    let turn = n / shape.tools + 1;
    let mut sum = 0u64;
    for (k, m) in results.iter().enumerate() {
        let (t, j) = (k as u32 / shape.tools + 1, k as u32 % shape.tools);
        let want_id = format!("call_{t}_{}", j + 1);
        if m["tool_call_id"] != want_id.as_str() {
            return Err(format!(
                "item {item}, turn {turn}: tool message {} answers {}, expected {want_id} (out of order?)",
                k + 1,
                m["tool_call_id"]
            ));
        }
        let (tool, _, want) = call_of(item, t, j);
        let got: Option<Value> = m["content"].as_str().and_then(|c| serde_json::from_str(c).ok());
        if got.as_ref() != Some(&want) {
            return Err(format!(
                "item {item}, turn {turn}: `{tool}` answered {} to {want_id}, expected {want}",
                m["content"]
            ));
        }
        sum += want
            .as_object()
            .and_then(|o| o.values().next()?.as_u64())
            .unwrap_or(0);
    }
    if turn == shape.turns {
        let answer = json!({"i": item, "calls": n, "sum": sum}).to_string();
        let message = json!({"role": "assistant", "content": answer});
        return Ok((item, turn, message, "stop"));
    }
    let calls: Vec<Value> = (0..shape.tools)
        .map(|j| {
            let (tool, q, _) = call_of(item, turn, j);
            json!({
                "id": format!("call_{turn}_{}", j + 1),
                "type": "function",
                "function": {"name": tool, "arguments": json!({"q": q}).to_string()},
            })
        })
        .collect();
    let message = json!({"role": "assistant", "content": null, "tool_calls": calls});
    Ok((item, turn, message, "tool_calls"))
}

/// The sum the model answers for item `i`: every tool result's number.
fn expected_sum(i: u64, shape: Shape) -> u64 {
    (1..shape.turns)
        .flat_map(|t| (0..shape.tools).map(move |j| (t, j)))
        .map(|(t, j)| {
            let (_, _, r) = call_of(i, t, j);
            r.as_object()
                .and_then(|o| o.values().next()?.as_u64())
                .unwrap_or(0)
        })
        .sum()
}

// ---------------------------------------------------------------- one batch

/// What one batch measured.
struct Measured {
    exit: Exit,
    /// `VmHWM` of the child, KiB (polled runs only).
    peak_kib: Option<u64>,
    /// First request's arrival to the last answer.
    span_s: f64,
    /// Mean over every loop and turn of (answer → next request) − the tools' latency, µs.
    between_turns_us: f64,
    /// The longest loop, first request to its answer.
    longest_loop_s: f64,
    /// The model's own time per request beyond its 50 ms (the harness's server: how late its
    /// answers were), µs, mean.
    model_late_us: f64,
    /// The first requests of the loops: the last one's arrival − the first one's, ms.
    stagger_ms: f64,
    /// SQLite only: the runs, turn records and tool-call records read back from the store.
    records: Option<(usize, usize, usize)>,
}

/// Where a batch records its runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum StoreKind {
    /// `--store memory`.
    Memory,
    /// `--store sqlite:DIR/runs.db`, a fresh DIR (and database) per process.
    Sqlite,
}

impl StoreKind {
    /// How the reports' notes name it.
    fn describe(self) -> &'static str {
        match self {
            StoreKind::Memory => "--store memory",
            StoreKind::Sqlite => {
                "--store sqlite:DIR/runs.db (a fresh database per process, on the repository's disk)"
            }
        }
    }
}

struct Batch<'a> {
    bin: &'a Path,
    dir: &'a Path,
    server: &'a ModelServer,
    /// Keep each SQLite batch's folder (`--keep-generated`).
    keep: bool,
    /// SQLite batches made so far: each gets a folder of its own.
    fresh: std::cell::Cell<u32>,
}

impl Batch<'_> {
    /// The flow file for `shape`: a generated copy of [`FLOW`] that calls this server.
    fn flow(&self, shape: Shape) -> Result<PathBuf, String> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/bench")
            .join(FLOW);
        let text =
            std::fs::read_to_string(&src).map_err(|e| format!("cannot read `{}`: {e}", src.display()))?;
        if text.matches(PLACEHOLDER_URL).count() != 1 {
            return Err(format!(
                "`{}` must name `{PLACEHOLDER_URL}` as its provider's base_url, once",
                src.display()
            ));
        }
        let path = self.dir.join(format!("w12_{}x{}.yaml", shape.turns, shape.tools));
        util::write_file(
            &path,
            &text.replace(PLACEHOLDER_URL, &self.server.base_url(shape)),
        )?;
        Ok(path)
    }

    /// The command for `items` loops, all in flight; with SQLite, a fresh folder
    /// `sqlite_TAG_ITEMS_K/` holding its database, output and log, and the store's URL.
    fn cmd(&self, items: usize, tag: &str, store: StoreKind) -> Result<(BatchCmd, Option<String>), String> {
        let input = self.dir.join(format!("in_{items}.jsonl"));
        if !input.exists() {
            batch_bin::write_input(&input, items)?;
        }
        if store == StoreKind::Sqlite {
            let k = self.fresh.get();
            self.fresh.set(k + 1);
            let name = format!("sqlite_{tag}_{items}_{k}");
            let (cmd, url) = batch_bin::fresh_sqlite(self.bin, self.dir, &input, &name, items)?;
            return Ok((cmd, Some(url)));
        }
        Ok((
            BatchCmd {
                bin: self.bin.to_path_buf(),
                input,
                output: self.dir.join(format!("out_{tag}_{items}.jsonl")),
                concurrency: items,
                store: "memory".to_string(),
                cwd: self.dir.to_path_buf(),
                log: self.dir.join(format!("log_{tag}_{items}.txt")),
            },
            None,
        ))
    }

    /// Runs `items` loops of `shape`, all in flight at once, on `store`, and checks the
    /// output, every request the model got and, with SQLite, the store ([`check_store`]).
    fn run(&self, shape: Shape, items: usize, polled: bool, store: StoreKind) -> Result<Measured, String> {
        let flow = self.flow(shape)?;
        let (cmd, url) = self.cmd(items, &format!("{}x{}", shape.turns, shape.tools), store)?;
        self.server.clear();
        let ran = if polled {
            batch_bin::run_polled_flow(&cmd, &flow).map(|(e, kib)| (e, Some(kib)))
        } else {
            batch_bin::run_flow(&cmd, &flow).map(|e| (e, None))
        };
        let problems = self.server.problems();
        let (exit, peak_kib) = ran.map_err(|e| {
            if problems.is_empty() {
                e
            } else {
                format!("{e}; the model server refused: {}", problems.join("; "))
            }
        })?;
        if let Some(p) = problems.first() {
            return Err(format!(
                "the model server refused {} requests: {p}",
                problems.len()
            ));
        }
        check_output(&cmd.output, items, shape)?;
        let t = timings(&self.server.hits(), items, shape)?;
        let mut records = None;
        if let Some(url) = url {
            let (turns, calls) = check_store(&url, &cmd.output, items, shape)?;
            records = Some((items, turns, calls));
            if !self.keep {
                let _ = std::fs::remove_dir_all(&cmd.cwd);
            }
        }
        Ok(Measured {
            exit,
            peak_kib,
            span_s: t.span_s,
            between_turns_us: t.between_turns_us,
            longest_loop_s: t.longest_loop_s,
            model_late_us: t.model_late_us,
            stagger_ms: t.stagger_ms,
            records,
        })
    }
}

/// Output line k is item k, succeeded, with `{i: k, answer: {i: k, calls, sum}}`.
fn check_output(path: &Path, n: usize, shape: Shape) -> Result<(), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the output `{}`: {e}", path.display()))?;
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() != n || !text.ends_with('\n') {
        return Err(format!(
            "`{}` has {} lines for {n} items (or a torn last line)",
            path.display(),
            lines.len()
        ));
    }
    for (k, line) in lines.iter().enumerate() {
        let v: Value = serde_json::from_str(line)
            .map_err(|e| format!("output line {}: not JSON ({e}): {line}", k + 1))?;
        let i = k as u64;
        let want = json!({
            "i": i,
            "answer": {"i": i, "calls": shape.tool_calls(), "sum": expected_sum(i, shape)},
        });
        if v["id"].as_u64() != Some(i) || v["status"] != "succeeded" || v.get("output") != Some(&want) {
            return Err(format!(
                "output line {}: expected item {k} succeeded with {want}, got {line}",
                k + 1
            ));
        }
    }
    Ok(())
}

/// Reads a finished SQLite batch back, in-process (after the command exited): one run per
/// item, succeeded, and each run's step records are the loop's, every one succeeded (the
/// latest attempt of each): the step `solve` (`N`), its turns `N.t1` … `N.tT` and, under each
/// turn but the last, its tool calls `N.tK.1` … `N.tK.J` (SPEC §6.3), nothing else. Returns
/// the turn and tool-call records it counted.
fn check_store(url: &str, output: &Path, n: usize, shape: Shape) -> Result<(usize, usize), String> {
    use switchyard::__private::record::{RunStatus, StepStatus};
    use switchyard::__private::store::Store;
    use switchyard::__private::store::any::AnyStore;
    // The batch is named by its output's canonical path.
    let batch = std::fs::canonicalize(output)
        .map_err(|e| format!("cannot resolve `{}`: {e}", output.display()))?
        .display()
        .to_string();
    let rt = util::tokio_runtime()?;
    rt.block_on(async {
        let store = AnyStore::open(url)
            .await
            .map_err(|e| format!("cannot open `{url}`: {e}"))?;
        let checked = async {
            let runs = store
                .batch_runs(&batch, 0, 2 * n + 16)
                .await
                .map_err(|e| format!("`{url}`: {e}"))?;
            let mut per_item = vec![0u32; n];
            let (mut turns, mut calls) = (0usize, 0usize);
            for r in &runs {
                let k = r.item_index.unwrap_or(u64::MAX) as usize;
                let Some(c) = per_item.get_mut(k) else {
                    return Err(format!("run `{}` of the batch has item index {:?}", r.id, r.item_index));
                };
                *c += 1;
                if r.status != RunStatus::Succeeded {
                    return Err(format!("run `{}` (item {k}) is {} in the store", r.id, r.status.as_str()));
                }
                let steps = store
                    .latest_steps(&r.id)
                    .await
                    .map_err(|e| format!("`{url}`: the steps of run `{}`: {e}", r.id))?;
                let top: Vec<&str> = steps
                    .iter()
                    .filter(|s| !s.number.contains('.'))
                    .map(|s| s.number.as_str())
                    .collect();
                let [base] = top[..] else {
                    return Err(format!(
                        "run `{}` (item {k}) has top-level step records {top:?}, expected the one of `solve`",
                        r.id
                    ));
                };
                let mut want: Vec<String> = vec![base.to_string()];
                for t in 1..=shape.turns {
                    want.push(format!("{base}.t{t}"));
                    if t < shape.turns {
                        want.extend((1..=shape.tools).map(|j| format!("{base}.t{t}.{j}")));
                    }
                }
                let mut got: Vec<String> = steps.iter().map(|s| s.number.clone()).collect();
                got.sort();
                want.sort();
                if got != want {
                    return Err(format!(
                        "run `{}` (item {k}): step records {got:?}, expected {want:?}",
                        r.id
                    ));
                }
                if let Some(s) = steps.iter().find(|s| s.status != StepStatus::Succeeded) {
                    return Err(format!(
                        "run `{}` (item {k}): step record {} is {}",
                        r.id,
                        s.number,
                        s.status.as_str()
                    ));
                }
                let below = |dots: usize| {
                    got.iter()
                        .filter(|g| g.strip_prefix(base).is_some_and(|r| r.matches('.').count() == dots))
                        .count()
                };
                turns += below(1);
                calls += below(2);
            }
            let lost = per_item.iter().filter(|&&c| c == 0).count();
            let dup = per_item.iter().filter(|&&c| c > 1).count();
            if lost > 0 || dup > 0 {
                return Err(format!(
                    "the store holds {} runs for {n} items: {lost} item(s) without a run, {dup} item(s) run more than once",
                    runs.len()
                ));
            }
            Ok((turns, calls))
        }
        .await;
        store.close().await;
        checked
    })
}

/// What the model's requests tell of one batch (see [`Measured`]).
struct Timings {
    span_s: f64,
    between_turns_us: f64,
    longest_loop_s: f64,
    model_late_us: f64,
    stagger_ms: f64,
}

/// The timings of a batch from the model's requests; every item must have asked each turn
/// exactly once (no retried request).
fn timings(hits: &[Hit], n: usize, shape: Shape) -> Result<Timings, String> {
    let mut per_item: Vec<Vec<&Hit>> = vec![Vec::new(); n];
    for h in hits {
        let slot = per_item
            .get_mut(h.item as usize)
            .ok_or_else(|| format!("a request for item {}, of {n}", h.item))?;
        slot.push(h);
    }
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    let (mut gaps, mut gap_count, mut longest) = (0.0f64, 0u64, 0.0f64);
    let mut last_start = None::<Instant>;
    for (i, loop_hits) in per_item.iter_mut().enumerate() {
        loop_hits.sort_by_key(|h| h.turn);
        let turns: Vec<u32> = loop_hits.iter().map(|h| h.turn).collect();
        if turns != (1..=shape.turns).collect::<Vec<_>>() {
            return Err(format!(
                "item {i}: the model was asked turns {turns:?}, expected each of 1..={} once",
                shape.turns
            ));
        }
        let (start, end) = (loop_hits[0].arrived, loop_hits[loop_hits.len() - 1].answered);
        first = Some(first.map_or(start, |f| f.min(start)));
        last_start = Some(last_start.map_or(start, |f| f.max(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
        longest = longest.max((end - start).as_secs_f64());
        for w in loop_hits.windows(2) {
            let gap = w[1].arrived.saturating_duration_since(w[0].answered);
            gaps += gap.as_secs_f64() - TOOL_LATENCY.as_secs_f64();
            gap_count += 1;
        }
    }
    let (Some(first), Some(last)) = (first, last) else {
        return Err("the model got no request".to_string());
    };
    let between = if gap_count == 0 {
        0.0
    } else {
        gaps * 1e6 / gap_count as f64
    };
    let late: f64 = hits
        .iter()
        .map(|h| (h.answered - h.arrived).as_secs_f64() - MODEL_LATENCY.as_secs_f64())
        .sum();
    Ok(Timings {
        span_s: (last - first).as_secs_f64(),
        between_turns_us: between,
        longest_loop_s: longest,
        model_late_us: late * 1e6 / hits.len().max(1) as f64,
        stagger_ms: last_start.map_or(0.0, |l| (l - first).as_secs_f64() * 1e3),
    })
}

// ---------------------------------------------------------------- the raw client

/// The system message of `w12_agent_loop.yaml`'s `solver`.
const SYSTEM: &str = "Use the tools, then answer with the sum of their results.";

/// No engine: loops in the harness, on a multi-threaded tokio runtime of its own (the
/// commands' kind), that send the engine's requests to the same model server and sleep the
/// tools' latency on the `mock` agent's timer between turns. The floor an engine can approach.
struct RawClient<'a> {
    server: &'a ModelServer,
    rt: tokio::runtime::Runtime,
}

impl<'a> RawClient<'a> {
    fn new(server: &'a ModelServer) -> Result<Self, String> {
        Ok(RawClient {
            server,
            rt: util::tokio_runtime()?,
        })
    }

    /// `n` loops of `shape` at once on a new client (new connections, as a new process has),
    /// every answer checked, and every request by the server.
    fn run(&self, n: usize, shape: Shape) -> Result<Timings, String> {
        let url = format!("{}/chat/completions", self.server.base_url(shape));
        let client = raw_http_client()?;
        self.server.clear();
        let ran = self.rt.block_on(async {
            let loops: Vec<_> = (0..n as u64)
                .map(|i| tokio::spawn(raw_loop(client.clone(), url.clone(), i, shape)))
                .collect();
            let mut failed = None;
            for l in loops {
                let r = l
                    .await
                    .map_err(|e| format!("a loop of the raw client panicked: {e}"))
                    .and_then(|r| r);
                if let Err(e) = r {
                    failed.get_or_insert(e);
                }
            }
            failed.map_or(Ok(()), Err)
        });
        let problems = self.server.problems();
        if let Some(p) = problems.first() {
            return Err(format!(
                "raw client: the model server refused {} requests: {p}",
                problems.len()
            ));
        }
        ran?;
        timings(&self.server.hits(), n, shape)
    }
}

/// A client built as `agents::net` builds the engine's: reqwest over rustls with the ring
/// provider, no redirect, the same time-outs and user agent. Its TLS has no roots (the model
/// is `http://` on loopback: the engine's platform verifier would never be asked either).
fn raw_http_client() -> Result<reqwest::Client, String> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("raw client: cannot set up TLS: {e}"))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(30))
        .user_agent(concat!("switchyard/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("raw client: cannot build the HTTP client: {e}"))
}

/// The tools the engine offers, as it writes them (`{type: function, function: {name,
/// description, parameters}}`, the `mock` agents' `input_schema`).
fn raw_tool_definitions() -> Value {
    let params = json!({"type": "object", "required": ["q"], "properties": {"q": {"type": "integer"}}});
    json!([
        {"type": "function", "function": {
            "name": "lookup",
            "description": "Looks a number up (ten times `q`).",
            "parameters": params,
        }},
        {"type": "function", "function": {
            "name": "score",
            "description": "Scores a number (`q` + 1).",
            "parameters": params,
        }},
    ])
}

/// One loop of item `i`: the engine's request of each turn (the conversation so far, the
/// tools, the `result_schema` as `response_format`), the model's tool calls run at once (each
/// a 20 ms sleep on the `mock` agent's timer, then the mock's result), answered in the
/// model's order; the final answer checked.
async fn raw_loop(client: reqwest::Client, url: String, i: u64, shape: Shape) -> Result<(), String> {
    let tools = raw_tool_definitions();
    let schema = json!({
        "type": "object",
        "required": ["i", "calls", "sum"],
        "properties": {"i": {"type": "integer"}, "calls": {"type": "integer"}, "sum": {"type": "integer"}},
    });
    let mut messages = vec![
        json!({"role": "system", "content": SYSTEM}),
        json!({"role": "user", "content": format!("Item {i}")}),
    ];
    for turn in 1..=shape.turns {
        let body = json!({
            "model": "bench-model",
            "messages": messages,
            "response_format": {"type": "json_schema", "json_schema": {"name": "solver", "schema": schema}},
            "stream": false,
            "tools": tools,
            "tool_choice": "auto",
        });
        let body = serde_json::to_vec(&body).expect("JSON values serialize");
        let resp = client
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("raw client, item {i}, turn {turn}: {e}"))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| format!("raw client, item {i}, turn {turn}: reading the answer: {e}"))?;
        if !status.is_success() {
            return Err(format!(
                "raw client, item {i}, turn {turn}: the model answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        let answer: Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("raw client, item {i}, turn {turn}: the answer is not JSON: {e}"))?;
        let message = &answer["choices"][0]["message"];
        let calls = message["tool_calls"].as_array().cloned().unwrap_or_default();
        if calls.is_empty() {
            let want = json!({"i": i, "calls": shape.tool_calls(), "sum": expected_sum(i, shape)});
            let got: Option<Value> = message["content"]
                .as_str()
                .and_then(|c| serde_json::from_str(c).ok());
            if turn != shape.turns || got.as_ref() != Some(&want) {
                return Err(format!(
                    "raw client, item {i}: turn {turn} answered {}, expected {want} at turn {}",
                    message["content"], shape.turns
                ));
            }
            return Ok(());
        }
        let written: Vec<Value> = calls
            .iter()
            .map(|c| {
                json!({
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                })
            })
            .collect();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": written}));
        let results = futures_util::future::join_all(calls.iter().map(|c| async move {
            let name = c["function"]["name"].as_str().unwrap_or("");
            let q = c["function"]["arguments"]
                .as_str()
                .and_then(|a| serde_json::from_str::<Value>(a).ok())
                .and_then(|a| a["q"].as_u64())
                .ok_or_else(|| format!("raw client, item {i}, turn {turn}: a call without `q`: {c}"))?;
            let result = match name {
                "lookup" => json!({"v": q * 10}),
                "score" => json!({"w": q + 1}),
                other => {
                    return Err(format!(
                        "raw client, item {i}, turn {turn}: unknown tool `{other}`"
                    ));
                }
            };
            switchyard::__private::agents::timer::sleep(TOOL_LATENCY).await;
            Ok((c["id"].clone(), result.to_string()))
        }))
        .await;
        for r in results {
            let (id, content) = r?;
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
        }
    }
    Err(format!(
        "raw client, item {i}: no answer after {} turns",
        shape.turns
    ))
}

/// The floor on the timers alone, no engine: `n` concurrent chains of the loop's sleeps (the
/// model's 4 × 50 ms and the tools' 3 × 20 ms) on the wall-clock timer both use.
fn timer_floor(n: usize, shape: Shape) -> Result<f64, String> {
    let rt = util::tokio_runtime()?;
    Ok(rt.block_on(async {
        let t0 = Instant::now();
        let chains: Vec<_> = (0..n)
            .map(|_| {
                tokio::spawn(async move {
                    for t in 1..=shape.turns {
                        switchyard::__private::agents::timer::sleep(MODEL_LATENCY).await;
                        if t < shape.turns {
                            switchyard::__private::agents::timer::sleep(TOOL_LATENCY).await;
                        }
                    }
                })
            })
            .collect();
        for c in chains {
            let _ = c.await;
        }
        t0.elapsed().as_secs_f64()
    }))
}

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let n = profile.w12_loops;
    if n < 2 {
        return Err(format!("W12 needs at least 2 loops, the profile has {n}"));
    }
    let bin = util::release_binary()?;
    let generated = util::GeneratedDir::create("w12", opts.keep_generated)?;
    let server = ModelServer::start()?;
    let batch = Batch {
        bin: &bin,
        dir: &generated.path,
        server: &server,
        keep: opts.keep_generated,
        fresh: std::cell::Cell::new(0),
    };
    let main = Shape::MAIN;
    let floor = main.floor().as_secs_f64();
    eprintln!(
        "W12: `switchyard batch {FLOW} --concurrency {n} --store memory`, {n} agent loops of {} turns × {} tool calls \
         (model {} ms on {}, tools {} ms); latency floor {floor:.3} s; warm-up, then {RUNS} timed, each with \
         {}×{} and {}×{} for CPU per tool call and per turn, and untimed runs at {n} and 1 item for peak RSS; \
         the same on `--store sqlite:DIR/runs.db` (variant `sqlite`); {WIDE} loops in flight on memory (`c{WIDE}`), \
         on SQLite (`c{WIDE}-sqlite`) and with no engine (`raw-client`)",
        main.turns,
        main.tools,
        MODEL_LATENCY.as_millis(),
        server.addr,
        TOOL_LATENCY.as_millis(),
        Shape::MORE_TOOLS.turns,
        Shape::MORE_TOOLS.tools,
        Shape::MORE_TURNS.turns,
        Shape::MORE_TURNS.tools,
    );
    // One checked warm-up per variant (a SQLite batch's store is read back after each run).
    batch.run(main, n, false, StoreKind::Memory)?;
    let warm = batch.run(main, n, false, StoreKind::Sqlite)?;
    if let Some((runs, turns, calls)) = warm.records {
        eprintln!(
            "W12 sqlite: the warm-up's store holds {runs} succeeded runs, one per item, with {turns} turn records \
             (N.tK) and {calls} tool-call records (N.tK.j), every one succeeded"
        );
    }
    batch.run(main, WIDE, false, StoreKind::Memory)?;
    batch.run(main, WIDE, false, StoreKind::Sqlite)?;
    let raw = RawClient::new(&server)?;
    raw.run(WIDE, main)?;
    let (mut mem, mut sql, mut wide) = (Samples::default(), Samples::default(), Wide::default());
    for _ in 0..RUNS {
        let mem_turn = measure(&batch, n, StoreKind::Memory, &mut mem)?;
        let timers = timer_floor(n, main)?;
        mem.timer_above.push(100.0 * (timers - floor) / timers);
        let sql_turn = measure(&batch, n, StoreKind::Sqlite, &mut sql)?;
        sql.turn_ratio.push(sql_turn / mem_turn);
        let c = batch.run(main, WIDE, false, StoreKind::Memory)?;
        let cs = batch.run(main, WIDE, false, StoreKind::Sqlite)?;
        let r = raw.run(WIDE, main)?;
        wide.push(
            (c.span_s, c.between_turns_us),
            (cs.span_s, cs.between_turns_us),
            (r.span_s, r.between_turns_us),
        );
    }
    let (m_above, m_call) = (median(&mem.above), median(&mem.per_call));
    summary("W12", StoreKind::Memory, &mem, floor);
    summary("W12 sqlite", StoreKind::Sqlite, &sql, floor);
    eprintln!(
        "W12 sqlite: CPU per turn {:.2}× the memory store's in the same repetitions (target ≤ 2)",
        median(&sql.turn_ratio)
    );
    wide.summary(floor);
    if opts.breakdown || m_above > TARGET_ABOVE_FLOOR_PCT || m_call > TARGET_US_PER_TOOL_CALL {
        breakdown(&batch, n)?;
    }
    let mut out = mem.reports(n, StoreKind::Memory);
    out.extend(sql.reports(n, StoreKind::Sqlite));
    out.extend(wide.reports(floor));
    Ok(out)
}

/// Loops in flight of the wide variants (BENCH.md "W12 vs peers").
const WIDE: usize = 32;
const TARGET_EFFICIENCY_MEMORY: f64 = 0.9;
const TARGET_EFFICIENCY_SQLITE: f64 = 0.85;
const TARGET_TURN_RATIO: f64 = 2.0;

/// One repetition of the `default` measurements on `store`, into `s`: the batch (timed), the
/// two other shapes (CPU per call and per turn), the polled runs at N and 1 item. Returns
/// the CPU per turn.
fn measure(batch: &Batch<'_>, n: usize, store: StoreKind, s: &mut Samples) -> Result<f64, String> {
    let main = Shape::MAIN;
    let floor = main.floor().as_secs_f64();
    let m = batch.run(main, n, false, store)?;
    let tools = batch.run(Shape::MORE_TOOLS, n, false, store)?;
    let turns = batch.run(Shape::MORE_TURNS, n, false, store)?;
    let polled = batch.run(main, n, true, store)?;
    let one = batch.run(main, 1, true, store)?;
    let nf = n as f64;
    // Per loop: MORE_TOOLS has 18 more tool calls; MORE_TURNS 12 more turns and 24 more calls.
    let extra_calls = f64::from(Shape::MORE_TOOLS.tool_calls() - main.tool_calls());
    let per_call = (tools.exit.cpu_s - m.exit.cpu_s) * 1e6 / (nf * extra_calls);
    let extra_turns = f64::from(Shape::MORE_TURNS.turns - main.turns);
    let turn_calls = f64::from(Shape::MORE_TURNS.tool_calls() - main.tool_calls());
    let per_turn = ((turns.exit.cpu_s - m.exit.cpu_s) * 1e6 / nf - turn_calls * per_call) / extra_turns;
    s.wall.push(m.exit.wall_s);
    s.span.push(m.span_s);
    s.above.push(100.0 * (m.span_s - floor) / m.span_s);
    s.wall_above.push(100.0 * (m.exit.wall_s - floor) / m.exit.wall_s);
    s.between.push(m.between_turns_us);
    s.between_alone.push(one.between_turns_us);
    s.longest.push(m.longest_loop_s);
    s.late.push(m.model_late_us);
    s.stagger.push(m.stagger_ms);
    s.cpu_loop.push(m.exit.cpu_s * 1e6 / nf);
    s.per_call.push(per_call);
    s.per_turn.push(per_turn);
    let (peak, base) = (
        polled.peak_kib.unwrap_or(0) as f64,
        one.peak_kib.unwrap_or(0) as f64,
    );
    s.peak.push(peak / 1024.0);
    s.base.push(base / 1024.0);
    s.per_loop_kib.push((peak - base) / (nf - 1.0));
    Ok(per_turn)
}

/// The medians of one store's repetitions, on stderr.
fn summary(label: &str, store: StoreKind, s: &Samples, floor: f64) {
    let timers = if s.timer_above.is_empty() {
        String::new()
    } else {
        format!("; the bare timers: {:.2}%", median(&s.timer_above))
    };
    eprintln!(
        "{label} ({}): median wall {:.4} s (process: start-up, loops, output, exit), span {:.4} s (first request to last \
         answer), floor {floor:.3} s: {:.2}% of the span above it (target ≤ {TARGET_ABOVE_FLOOR_PCT}%{timers}), \
         {:.2}% of the wall; longest loop {:.4} s, the loops' first requests spread over {:.2} ms, the model's \
         answers {:.0} µs late (the harness's server); {:.0} µs of engine between a turn's answer and the next request \
         beyond the tools' {} ms ({:.0} µs for a loop alone, 1 item); CPU {:.1} µs per tool call (target ≤ {TARGET_US_PER_TOOL_CALL}), {:.1} µs per turn, \
         {:.0} µs per loop with start-up; peak RSS {:.1} MiB ({:.1} MiB on 1 item): {:.1} KiB per loop in flight",
        store.describe(),
        median(&s.wall),
        median(&s.span),
        median(&s.above),
        median(&s.wall_above),
        median(&s.longest),
        median(&s.stagger),
        median(&s.late),
        median(&s.between),
        TOOL_LATENCY.as_millis(),
        median(&s.between_alone),
        median(&s.per_call),
        median(&s.per_turn),
        median(&s.cpu_loop),
        median(&s.peak),
        median(&s.base),
        median(&s.per_loop_kib),
    );
}

/// The wide variants' samples: (span, µs between turns) of `c32`, `c32-sqlite` and
/// `raw-client`, one each per repetition.
#[derive(Default)]
struct Wide {
    memory: Vec<(f64, f64)>,
    sqlite: Vec<(f64, f64)>,
    raw: Vec<(f64, f64)>,
}

impl Wide {
    fn push(&mut self, memory: (f64, f64), sqlite: (f64, f64), raw: (f64, f64)) {
        self.memory.push(memory);
        self.sqlite.push(sqlite);
        self.raw.push(raw);
    }

    fn efficiency(runs: &[(f64, f64)], floor: f64) -> Vec<f64> {
        runs.iter().map(|(span, _)| floor / span).collect()
    }

    /// Each repetition's `a` efficiency / its `b` efficiency (= b's span / a's span).
    fn ratio(a: &[(f64, f64)], b: &[(f64, f64)]) -> Vec<f64> {
        a.iter().zip(b).map(|((sa, _), (sb, _))| sb / sa).collect()
    }

    fn summary(&self, floor: f64) {
        let eff = |r: &[(f64, f64)]| median(&Self::efficiency(r, floor));
        let between = |r: &[(f64, f64)]| median(&r.iter().map(|x| x.1).collect::<Vec<_>>());
        eprintln!(
            "W12 {WIDE} loops in flight: efficiency (floor / span) {:.4} on memory (target ≥ {TARGET_EFFICIENCY_MEMORY}), \
             {:.4} on SQLite (target ≥ {TARGET_EFFICIENCY_SQLITE}), {:.4} with no engine (raw client); ratios to the raw \
             client {:.4} (memory) and {:.4} (SQLite), SQLite / memory {:.4}; µs between turns beyond the tools: {:.0} \
             (memory), {:.0} (SQLite), {:.0} (raw client)",
            eff(&self.memory),
            eff(&self.sqlite),
            eff(&self.raw),
            median(&Self::ratio(&self.memory, &self.raw)),
            median(&Self::ratio(&self.sqlite, &self.raw)),
            median(&Self::ratio(&self.sqlite, &self.memory)),
            between(&self.memory),
            between(&self.sqlite),
            between(&self.raw),
        );
    }

    fn reports(self, floor: f64) -> Vec<Report> {
        let floor_ms = floor * 1e3;
        let engine = |store: StoreKind| {
            format!(
                "{WIDE} items of `{FLOW}` (an llm agent loop, 4 turns × 2 tool calls; a loopback model answering in \
                 50 ms, mock tools of 20 ms) through `switchyard batch --concurrency {WIDE} {}` (release binary, whole \
                 process); floor 4 × 50 + 3 × 20 = {floor_ms:.0} ms",
                store.describe()
            )
        };
        let raw = format!(
            "no engine: {WIDE} concurrent loops in the harness (tokio, one reqwest client built as the engine's) sending \
             the engine's requests (system, user, the assistant's tool calls, the tool messages) to the same loopback \
             model, the two tools' 20 ms slept concurrently on the mock agent's timer between turns; floor \
             {floor_ms:.0} ms"
        );
        let between = |r: &[(f64, f64)]| r.iter().map(|x| x.1).collect::<Vec<_>>();
        let span = |r: &[(f64, f64)]| r.iter().map(|x| x.0).collect::<Vec<_>>();
        let above = |r: &[(f64, f64)]| r.iter().map(|(s, _)| 100.0 * (s - floor) / s).collect::<Vec<_>>();
        let mut out = Vec::new();
        let mut push = |variant: &str, metric: &'static str, samples: Vec<f64>, notes: String| {
            let mut r = Report::new(ID, metric, WIDE as u64, samples, notes);
            r.variant = variant.to_string();
            out.push(r);
        };
        let c = format!("c{WIDE}");
        let cs = format!("c{WIDE}-sqlite");
        for (variant, runs, what, target) in [
            (
                c.as_str(),
                &self.memory,
                engine(StoreKind::Memory),
                format!("; target ≥ {TARGET_EFFICIENCY_MEMORY}"),
            ),
            (
                cs.as_str(),
                &self.sqlite,
                engine(StoreKind::Sqlite),
                format!("; target ≥ {TARGET_EFFICIENCY_SQLITE}"),
            ),
            ("raw-client", &self.raw, raw.clone(), String::new()),
        ] {
            push(
                variant,
                "span_s",
                span(runs),
                format!("{what}; the model server's first request arrival to its last answer"),
            );
            push(
                variant,
                "efficiency",
                Self::efficiency(runs, floor),
                format!("{what}; floor / span{target}"),
            );
            push(
                variant,
                "above_floor_pct",
                above(runs),
                format!("{what}; (span − floor) / span × 100"),
            );
            push(
                variant,
                "us_between_turns",
                between(runs),
                format!(
                    "{what}; mean over loops and turns of (a turn's answer → the next request) − the tools' 20 ms, µs"
                ),
            );
        }
        push(
            &c,
            "efficiency_ratio_to_raw",
            Self::ratio(&self.memory, &self.raw),
            format!(
                "{}; efficiency / raw-client's efficiency in the same repetition",
                engine(StoreKind::Memory)
            ),
        );
        push(
            &cs,
            "efficiency_ratio_to_raw",
            Self::ratio(&self.sqlite, &self.raw),
            format!(
                "{}; efficiency / raw-client's efficiency in the same repetition",
                engine(StoreKind::Sqlite)
            ),
        );
        push(
            &cs,
            "efficiency_ratio_to_memory",
            Self::ratio(&self.sqlite, &self.memory),
            format!(
                "{}; efficiency / c{WIDE}'s (the memory store) efficiency in the same repetition",
                engine(StoreKind::Sqlite)
            ),
        );
        out
    }
}

/// More loops in flight (10 × N) for the per-loop memory and the span at width, on stderr.
fn breakdown(batch: &Batch<'_>, n: usize) -> Result<(), String> {
    let wide = 10 * n;
    let floor = Shape::MAIN.floor().as_secs_f64();
    let (mut span, mut kib, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let m = batch.run(Shape::MAIN, wide, true, StoreKind::Memory)?;
        let one = batch.run(Shape::MAIN, 1, true, StoreKind::Memory)?;
        span.push(m.span_s);
        cpu.push(m.exit.cpu_s * 1e6 / wide as f64);
        kib.push((m.peak_kib.unwrap_or(0) as f64 - one.peak_kib.unwrap_or(0) as f64) / (wide - 1) as f64);
    }
    let span = median(&span);
    eprintln!(
        "W12 breakdown: {wide} loops in flight: span {span:.4} s, {:.2}% above the floor; {:.0} µs CPU per loop; \
         {:.1} KiB per loop in flight (untimed, polled runs)",
        100.0 * (span - floor) / span,
        median(&cpu),
        median(&kib)
    );
    Ok(())
}

#[derive(Default)]
struct Samples {
    wall: Vec<f64>,
    span: Vec<f64>,
    above: Vec<f64>,
    wall_above: Vec<f64>,
    timer_above: Vec<f64>,
    between: Vec<f64>,
    between_alone: Vec<f64>,
    longest: Vec<f64>,
    late: Vec<f64>,
    stagger: Vec<f64>,
    cpu_loop: Vec<f64>,
    per_call: Vec<f64>,
    per_turn: Vec<f64>,
    peak: Vec<f64>,
    base: Vec<f64>,
    per_loop_kib: Vec<f64>,
    /// SQLite only: its CPU per turn / the memory store's, in the same repetition.
    turn_ratio: Vec<f64>,
}

impl Samples {
    /// The reports of `store`: variants `default`, `one-loop` and `timer-floor` for memory,
    /// `sqlite` and `sqlite-one-loop` for SQLite.
    fn reports(self, n: usize, store: StoreKind) -> Vec<Report> {
        let what = format!(
            "{n} items of `{FLOW}` (an llm agent loop, 4 turns × 2 tool calls; a loopback model answering in 50 ms, \
             mock tools of 20 ms) through `switchyard batch --concurrency {n} {}` (release binary, whole \
             process); floor 4 × 50 + 3 × 20 = 260 ms",
            store.describe()
        );
        let (variant, alone_variant) = match store {
            StoreKind::Memory => ("default", "one-loop"),
            StoreKind::Sqlite => ("sqlite", "sqlite-one-loop"),
        };
        let pct = |us: &[f64], latency: Duration| -> Vec<f64> {
            us.iter()
                .map(|u| 100.0 * u / (latency.as_secs_f64() * 1e6))
                .collect()
        };
        let call_pct = pct(&self.per_call, TOOL_LATENCY);
        let turn_pct = pct(&self.per_turn, MODEL_LATENCY);
        let mut reports = vec![
            ("wall_s", self.wall, "wall of the process, spawn to exit".to_string()),
            (
                "span_s",
                self.span,
                "the model server's first request arrival to its last answer".to_string(),
            ),
            (
                "above_floor_pct",
                self.above,
                format!("(span − floor) / span × 100; target ≤ {TARGET_ABOVE_FLOOR_PCT}"),
            ),
            (
                "wall_above_floor_pct",
                self.wall_above,
                "(wall − floor) / wall × 100: as above_floor_pct, with the process's start-up, output and exit"
                    .to_string(),
            ),
            (
                "us_between_turns",
                self.between,
                format!(
                    "mean over loops and turns of (a turn's answer → the next request) − the tools' {} ms, µs: the \
                     engine's time on the critical path per turn, its two tool calls included",
                    TOOL_LATENCY.as_millis()
                ),
            ),
            (
                "cpu_us_per_tool_call",
                self.per_call,
                format!(
                    "(child CPU of {} turns × {} tools − of {} × {}) / (N × {}), µs (wait4 rusage, user + system, every \
                     thread); target ≤ {TARGET_US_PER_TOOL_CALL}",
                    Shape::MORE_TOOLS.turns,
                    Shape::MORE_TOOLS.tools,
                    Shape::MAIN.turns,
                    Shape::MAIN.tools,
                    Shape::MORE_TOOLS.tool_calls() - Shape::MAIN.tool_calls(),
                ),
            ),
            (
                "tool_call_pct_of_latency",
                call_pct,
                "cpu_us_per_tool_call / the tool's 20 ms × 100".to_string(),
            ),
            (
                "cpu_us_per_turn",
                self.per_turn,
                format!(
                    "((child CPU of {} turns × {} tools − of {} × {}) / N − {} × cpu_us_per_tool_call) / {}, µs",
                    Shape::MORE_TURNS.turns,
                    Shape::MORE_TURNS.tools,
                    Shape::MAIN.turns,
                    Shape::MAIN.tools,
                    Shape::MORE_TURNS.tool_calls() - Shape::MAIN.tool_calls(),
                    Shape::MORE_TURNS.turns - Shape::MAIN.turns,
                ),
            ),
            (
                "turn_pct_of_latency",
                turn_pct,
                "cpu_us_per_turn / the model's 50 ms × 100".to_string(),
            ),
            (
                "cpu_us_per_loop",
                self.cpu_loop,
                "child CPU / N, µs, the process's start-up included".to_string(),
            ),
            (
                "peak_rss_mb",
                self.peak,
                "the child's peak RSS (VmHWM, read every ms in an untimed run), MiB".to_string(),
            ),
            (
                "kib_per_loop_in_flight",
                self.per_loop_kib,
                format!(
                    "(peak RSS at {n} loops − peak RSS of the same command on 1 item) / {}, KiB (untimed runs)",
                    n - 1
                ),
            ),
        ];
        let timer_floor = (
            "above_floor_pct",
            self.timer_above,
            "no engine: N concurrent chains of the same sleeps (4 × 50 ms, 3 × 20 ms) on the wall-clock timer the \
             model server and the mock tools use; (wall − floor) / wall × 100"
                .to_string(),
        );
        if store == StoreKind::Sqlite {
            reports.push((
                "cpu_turn_ratio_to_memory",
                self.turn_ratio,
                format!(
                    "cpu_us_per_turn / the default variant's (--store memory) cpu_us_per_turn measured in the same \
                     repetition; target ≤ {TARGET_TURN_RATIO}"
                ),
            ));
        }
        let mut out: Vec<Report> = reports
            .drain(..)
            .map(|(metric, samples, notes)| {
                let mut r = Report::new(ID, metric, n as u64, samples, format!("{what}; {notes}"));
                r.variant = variant.to_string();
                r
            })
            .collect();
        if store == StoreKind::Memory {
            let mut floor = Report::new(ID, timer_floor.0, n as u64, timer_floor.1, timer_floor.2);
            floor.variant = "timer-floor".to_string();
            out.push(floor);
        }
        let mut alone = Report::new(
            ID,
            "us_between_turns",
            1,
            self.between_alone,
            format!(
                "as the {variant} variant's, for 1 item (one loop in flight: no other loop's work between its turns), \
                 from the untimed 1-item run (the harness reads the child's VmHWM every ms meanwhile); {what}"
            ),
        );
        alone.variant = alone_variant.to_string();
        out.push(alone);
        out
    }
}
