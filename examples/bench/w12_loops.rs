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
//!   in two more shapes run in the same repetition: 4 turns × 6 tools (12 more tool calls per
//!   loop) and 7 turns × 2 tools (3 more turns and 6 more tool calls per loop).
//!
//! Memory: the child's peak RSS (`VmHWM`, polled) in an untimed run at N, and the same command
//! on 1 item: `kib_per_loop_in_flight` = the difference / (N − 1).

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
    /// 12 more tool calls per loop than [`Shape::MAIN`], the same turns.
    const MORE_TOOLS: Shape = Shape { turns: 4, tools: 6 };
    /// 3 more turns and 6 more tool calls per loop than [`Shape::MAIN`].
    const MORE_TURNS: Shape = Shape { turns: 7, tools: 2 };

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
}

struct Batch<'a> {
    bin: &'a Path,
    dir: &'a Path,
    server: &'a ModelServer,
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

    fn cmd(&self, items: usize, tag: &str) -> Result<BatchCmd, String> {
        let input = self.dir.join(format!("in_{items}.jsonl"));
        if !input.exists() {
            batch_bin::write_input(&input, items)?;
        }
        Ok(BatchCmd {
            bin: self.bin.to_path_buf(),
            input,
            output: self.dir.join(format!("out_{tag}_{items}.jsonl")),
            concurrency: items,
            store: "memory".to_string(),
            cwd: self.dir.to_path_buf(),
            log: self.dir.join(format!("log_{tag}_{items}.txt")),
        })
    }

    /// Runs `items` loops of `shape`, all in flight at once, and checks the output and every
    /// request the model got.
    fn run(&self, shape: Shape, items: usize, polled: bool) -> Result<Measured, String> {
        let flow = self.flow(shape)?;
        let cmd = self.cmd(items, &format!("{}x{}", shape.turns, shape.tools))?;
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
        Ok(Measured {
            exit,
            peak_kib,
            span_s: t.span_s,
            between_turns_us: t.between_turns_us,
            longest_loop_s: t.longest_loop_s,
            model_late_us: t.model_late_us,
            stagger_ms: t.stagger_ms,
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
    };
    let main = Shape::MAIN;
    let floor = main.floor().as_secs_f64();
    eprintln!(
        "W12: `switchyard batch {FLOW} --concurrency {n} --store memory`, {n} agent loops of {} turns × {} tool calls \
         (model {} ms on {}, tools {} ms); latency floor {floor:.3} s; warm-up, then {RUNS} timed, each with \
         {}×{} and {}×{} for CPU per tool call and per turn, and untimed runs at {n} and 1 item for peak RSS",
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
    batch.run(main, n, false)?;
    let mut s = Samples::default();
    for _ in 0..RUNS {
        let m = batch.run(main, n, false)?;
        let tools = batch.run(Shape::MORE_TOOLS, n, false)?;
        let turns = batch.run(Shape::MORE_TURNS, n, false)?;
        let polled = batch.run(main, n, true)?;
        let one = batch.run(main, 1, true)?;
        let timers = timer_floor(n, main)?;
        let nf = n as f64;
        // Per loop: MORE_TOOLS has 12 more tool calls; MORE_TURNS 3 more turns and 6 more calls.
        let extra_calls = f64::from(Shape::MORE_TOOLS.tool_calls() - main.tool_calls());
        let per_call = (tools.exit.cpu_s - m.exit.cpu_s) * 1e6 / (nf * extra_calls);
        let extra_turns = f64::from(Shape::MORE_TURNS.turns - main.turns);
        let turn_calls = f64::from(Shape::MORE_TURNS.tool_calls() - main.tool_calls());
        let per_turn = ((turns.exit.cpu_s - m.exit.cpu_s) * 1e6 / nf - turn_calls * per_call) / extra_turns;
        s.wall.push(m.exit.wall_s);
        s.span.push(m.span_s);
        s.above.push(100.0 * (m.span_s - floor) / m.span_s);
        s.wall_above.push(100.0 * (m.exit.wall_s - floor) / m.exit.wall_s);
        s.timer_above.push(100.0 * (timers - floor) / timers);
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
    }
    let (m_above, m_call) = (median(&s.above), median(&s.per_call));
    eprintln!(
        "W12: median wall {:.4} s (process: start-up, loops, output, exit), span {:.4} s (first request to last answer), \
         floor {floor:.3} s: {:.2}% of the span above it (target ≤ {TARGET_ABOVE_FLOOR_PCT}%; the bare timers: {:.2}%), \
         {:.2}% of the wall; longest loop {:.4} s, the loops' first requests spread over {:.2} ms, the model's \
         answers {:.0} µs late (the harness's server); {:.0} µs of engine between a turn's answer and the next request \
         beyond the tools' {} ms ({:.0} µs for a loop alone, 1 item); CPU {:.1} µs per tool call (target ≤ {TARGET_US_PER_TOOL_CALL}), {:.1} µs per turn, \
         {:.0} µs per loop with start-up; peak RSS {:.1} MiB ({:.1} MiB on 1 item): {:.1} KiB per loop in flight",
        median(&s.wall),
        median(&s.span),
        m_above,
        median(&s.timer_above),
        median(&s.wall_above),
        median(&s.longest),
        median(&s.stagger),
        median(&s.late),
        median(&s.between),
        TOOL_LATENCY.as_millis(),
        median(&s.between_alone),
        m_call,
        median(&s.per_turn),
        median(&s.cpu_loop),
        median(&s.peak),
        median(&s.base),
        median(&s.per_loop_kib),
    );
    if opts.breakdown || m_above > TARGET_ABOVE_FLOOR_PCT || m_call > TARGET_US_PER_TOOL_CALL {
        breakdown(&batch, n)?;
    }
    Ok(s.reports(n))
}

/// More loops in flight (10 × N) for the per-loop memory and the span at width, on stderr.
fn breakdown(batch: &Batch<'_>, n: usize) -> Result<(), String> {
    let wide = 10 * n;
    let floor = Shape::MAIN.floor().as_secs_f64();
    let (mut span, mut kib, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let m = batch.run(Shape::MAIN, wide, true)?;
        let one = batch.run(Shape::MAIN, 1, true)?;
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
}

impl Samples {
    fn reports(self, n: usize) -> Vec<Report> {
        let what = format!(
            "{n} items of `{FLOW}` (an llm agent loop, 4 turns × 2 tool calls; a loopback model answering in 50 ms, \
             mock tools of 20 ms) through `switchyard batch --concurrency {n} --store memory` (release binary, whole \
             process); floor 4 × 50 + 3 × 20 = 260 ms"
        );
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
                    "(child CPU of 4 turns × 6 tools − of 4 × 2) / (N × 12), µs (wait4 rusage, user + system, every \
                     thread); target ≤ {TARGET_US_PER_TOOL_CALL}"
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
                "((child CPU of 7 turns × 2 tools − of 4 × 2) / N − 6 × cpu_us_per_tool_call) / 3, µs".to_string(),
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
        let mut out: Vec<Report> = reports
            .drain(..)
            .map(|(metric, samples, notes)| {
                Report::new(ID, metric, n as u64, samples, format!("{what}; {notes}"))
            })
            .collect();
        let mut floor = Report::new(ID, timer_floor.0, n as u64, timer_floor.1, timer_floor.2);
        floor.variant = "timer-floor".to_string();
        out.push(floor);
        let mut alone = Report::new(
            ID,
            "us_between_turns",
            1,
            self.between_alone,
            format!(
                "as the default variant's, for 1 item (one loop in flight: no other loop's work between its turns), \
                 from the untimed 1-item run (the harness reads the child's VmHWM every ms meanwhile); {what}"
            ),
        );
        alone.variant = "one-loop".to_string();
        out.push(alone);
        out
    }
}
