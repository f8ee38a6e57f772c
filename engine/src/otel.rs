//! OpenTelemetry export (`--otlp-endpoint URL`, or `OTEL_EXPORTER_OTLP_ENDPOINT`; SPEC §13):
//! traces over OTLP/HTTP, as the official protobuf messages (`opentelemetry-proto`).
//!
//! The exporter is the process's [`Observer`]: it gathers each run tree's records as the
//! engine makes them — whatever the store keeps, the throwaway store of a batch included — and
//! when a root run ends turns them into spans: one per run, step, iteration, model turn and tool
//! call, with the flow, step id, number, kind, attempt, status, error kind, tokens and cost as
//! attributes, and the route each step took as an event. A child run's span is a child of the
//! record that called it (its step, or the iteration); a record numbered under another of its
//! run (an agent loop's turn `3.t2`, a tool call `3.t2.1`) is that one's child. Each root run is
//! a trace of its own (a batch is one trace per item), its id derived from the run's id, and
//! span ids from the records' keys, so a run resumed later adds to the same trace.
//!
//! Nothing of it waits on the collector: finished trees go through a bounded queue to a thread
//! of the exporter's own, which makes their spans and posts them in batches; a full queue, a tree too big to hold, or
//! a collector that does not answer drops spans, and [`Exporter::finish`] (called before the
//! process exits, within a few seconds) says how many and why.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span, status};
use prost::Message as _;
use sha2::{Digest, Sha256};

use crate::runtime::observe::Observer;
use crate::runtime::record::{RunRecord, RunStatus, StepRecord, StepStatus};

/// Finished trees waiting for the exporter's thread.
const QUEUE: usize = 4096;
/// The most records one run tree keeps for its spans; the rest are dropped (and counted).
const TREE_RECORDS: usize = 50_000;
/// Spans per request.
const BATCH: usize = 2048;
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What is kept of a run for its span.
#[derive(Clone, Debug)]
struct RunPart {
    id: String,
    flow: String,
    parent_run: Option<String>,
    status: RunStatus,
    error: Option<(String, String)>,
    started_at: u64,
    finished_at: Option<u64>,
    tokens: (u64, u64),
    cost_usd: f64,
    batch: Option<String>,
    item_id: Option<String>,
}

/// What is kept of a step record for its span.
#[derive(Clone, Debug)]
struct StepPart {
    run_id: String,
    number: String,
    step: String,
    kind: String,
    attempt: u32,
    status: StepStatus,
    iteration: Option<u64>,
    started_at: u64,
    finished_at: Option<u64>,
    tokens: (u64, u64),
    cost_usd: f64,
    error: Option<(String, String)>,
    child_run: Option<String>,
    route: Option<String>,
}

#[derive(Default)]
struct Tree {
    runs: Vec<RunPart>,
    steps: Vec<StepPart>,
}

#[derive(Default)]
struct Trees {
    /// Each run's root run.
    root_of: HashMap<String, String>,
    open: HashMap<String, Tree>,
}

/// Counts of what the exporter did.
#[derive(Debug, Default)]
pub struct ExportStats {
    pub exported: AtomicU64,
    pub dropped: AtomicU64,
    /// Why the last spans were dropped.
    pub last_error: Mutex<Option<String>>,
}

/// The process's span exporter.
pub struct Exporter {
    url: String,
    trees: Mutex<Trees>,
    tx: Mutex<Option<tokio::sync::mpsc::Sender<Tree>>>,
    stats: Arc<ExportStats>,
    done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

/// The traces URL of an OTLP/HTTP endpoint: as given when it names a path, else with
/// `/v1/traces` (what `OTEL_EXPORTER_OTLP_ENDPOINT` means).
pub fn traces_url(endpoint: &str) -> Result<String, String> {
    let e = endpoint.trim();
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .ok_or_else(|| {
            format!("--otlp-endpoint `{endpoint}`: an http:// or https:// URL, such as http://127.0.0.1:4318")
        })?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("--otlp-endpoint `{endpoint}`: the URL names no host"));
    }
    Ok(match rest.find('/') {
        Some(i) if rest[i..].trim_end_matches('/').len() > 1 => e.to_string(),
        _ => format!("{}/v1/traces", e.trim_end_matches('/')),
    })
}

impl Exporter {
    /// Starts the exporter's thread, posting to `endpoint` ([`traces_url`]).
    pub fn start(endpoint: &str) -> Result<Arc<Exporter>, String> {
        let url = traces_url(endpoint)?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Tree>(QUEUE);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let stats = Arc::new(ExportStats::default());
        let exporter = Arc::new(Exporter {
            url: url.clone(),
            trees: Mutex::new(Trees::default()),
            tx: Mutex::new(Some(tx)),
            stats: stats.clone(),
            done: Mutex::new(Some(done_rx)),
        });
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                    return;
                };
                rt.block_on(async {
                    let mut pending: Vec<Span> = Vec::new();
                    loop {
                        let more = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await;
                        let closed = matches!(more, Ok(None));
                        // Quiet for a while, or closed: what is pending goes now.
                        let flush = closed || more.is_err();
                        // Spans are made here, off the runs' threads.
                        if let Ok(Some(tree)) = more {
                            pending.extend(spans_of(&tree));
                        }
                        while pending.len() >= BATCH || flush && !pending.is_empty() {
                            let n = pending.len().min(BATCH);
                            let batch: Vec<Span> = pending.drain(..n).collect();
                            post(&url, batch, &stats).await;
                        }
                        if closed {
                            break;
                        }
                    }
                });
                let _ = done_tx.send(());
            })
            .map_err(|e| format!("cannot start the OTLP exporter: {e}"))?;
        Ok(exporter)
    }

    pub fn stats(&self) -> &ExportStats {
        &self.stats
    }

    /// Where spans go.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends what is left, waiting at most `within` for the collector; the counts after.
    pub fn finish(&self, within: Duration) -> (u64, u64, Option<String>) {
        // Trees whose root never ended here (a crash, a drain) are sent as they are.
        let open: Vec<Tree> = {
            let mut t = self.trees.lock().unwrap_or_else(|p| p.into_inner());
            t.root_of.clear();
            t.open.drain().map(|(_, tree)| tree).collect()
        };
        for tree in open {
            self.send(tree);
        }
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(done) = self.done.lock().unwrap_or_else(|p| p.into_inner()).take()
            && done.recv_timeout(within).is_err()
        {
            *self.stats.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(format!("the collector did not take everything within {within:?}"));
        }
        (
            self.stats.exported.load(Ordering::Relaxed),
            self.stats.dropped.load(Ordering::Relaxed),
            self.stats
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }

    fn send(&self, tree: Tree) {
        let n = (tree.runs.len() + tree.steps.len()) as u64;
        if n == 0 {
            return;
        }
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let sent = tx.is_some_and(|tx| tx.try_send(tree).is_ok());
        if !sent {
            self.stats.dropped.fetch_add(n, Ordering::Relaxed);
            *self.stats.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                Some("the export queue was full".into());
        }
    }
}

async fn post(url: &str, spans: Vec<Span>, stats: &ExportStats) {
    let n = spans.len() as u64;
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", "switchyard")],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "switchyard".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let body = request.encode_to_vec();
    let result = match crate::agents::net::client() {
        Ok(client) => client
            .post(url)
            .header("content-type", "application/x-protobuf")
            .timeout(REQUEST_TIMEOUT)
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| {
                if r.status().is_success() {
                    Ok(())
                } else {
                    Err(format!("the collector answered {}", r.status()))
                }
            }),
        Err(e) => Err(e.message),
    };
    match result {
        Ok(()) => {
            stats.exported.fetch_add(n, Ordering::Relaxed);
        }
        Err(e) => {
            stats.dropped.fetch_add(n, Ordering::Relaxed);
            *stats.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
    }
}

impl Observer for Exporter {
    fn run_started(&self, run: &RunRecord) {
        let mut t = self.trees.lock().unwrap_or_else(|p| p.into_inner());
        let root = match &run.parent_run {
            None => run.id.clone(),
            Some(p) => t.root_of.get(p).cloned().unwrap_or_else(|| p.clone()),
        };
        t.root_of.insert(run.id.clone(), root.clone());
        t.open.entry(root).or_default();
    }

    fn step(&self, s: &StepRecord) {
        let mut t = self.trees.lock().unwrap_or_else(|p| p.into_inner());
        let Trees { root_of, open } = &mut *t;
        let Some(tree) = root_of.get(&s.run_id).and_then(|root| open.get_mut(root)) else {
            return;
        };
        if tree.steps.len() >= TREE_RECORDS {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        tree.steps.push(StepPart {
            run_id: s.run_id.clone(),
            number: s.number.clone(),
            step: s.step.clone(),
            kind: s.kind.clone(),
            attempt: s.attempt,
            status: s.status,
            iteration: s.iteration,
            started_at: s.started_at,
            finished_at: s.finished_at,
            tokens: (s.usage.input_tokens, s.usage.output_tokens),
            cost_usd: s.usage.cost_usd,
            error: s.error.as_ref().map(|e| (e.kind.to_string(), e.message.clone())),
            child_run: s.child_run.clone(),
            route: s.route.clone(),
        });
    }

    fn run_ended(&self, run: &RunRecord) {
        let part = RunPart {
            id: run.id.clone(),
            flow: run.flow.clone(),
            parent_run: run.parent_run.clone(),
            status: run.status,
            error: run
                .error
                .as_ref()
                .map(|e| (e.kind.to_string(), e.message.clone())),
            started_at: run.started_at,
            finished_at: run.finished_at,
            tokens: (run.usage.input_tokens, run.usage.output_tokens),
            cost_usd: run.usage.cost_usd,
            batch: run.batch.clone(),
            item_id: run.item_id.clone(),
        };
        let tree = {
            let mut t = self.trees.lock().unwrap_or_else(|p| p.into_inner());
            let Some(root) = t.root_of.get(&run.id).cloned() else {
                return;
            };
            let is_root = run.parent_run.is_none();
            t.open.entry(root.clone()).or_default().runs.push(part);
            if !is_root {
                return;
            }
            t.root_of.retain(|_, r| *r != root);
            t.open.remove(&root)
        };
        if let Some(tree) = tree {
            self.send(tree);
        }
    }
}

fn kv(key: &str, v: impl Into<Val>) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(match v.into() {
                Val::S(s) => any_value::Value::StringValue(s),
                Val::I(i) => any_value::Value::IntValue(i),
                Val::F(f) => any_value::Value::DoubleValue(f),
            }),
        }),
        ..Default::default()
    }
}

enum Val {
    S(String),
    I(i64),
    F(f64),
}

impl From<&str> for Val {
    fn from(s: &str) -> Val {
        Val::S(s.to_string())
    }
}
impl From<String> for Val {
    fn from(s: String) -> Val {
        Val::S(s)
    }
}
impl From<u64> for Val {
    fn from(n: u64) -> Val {
        Val::I(i64::try_from(n).unwrap_or(i64::MAX))
    }
}
impl From<f64> for Val {
    fn from(f: f64) -> Val {
        Val::F(f)
    }
}

fn digest(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

/// The trace id of root run `root`.
pub fn trace_id(root: &str) -> Vec<u8> {
    digest(&["trace", root])[..16].to_vec()
}

fn run_span_id(run: &str) -> Vec<u8> {
    digest(&["run", run])[..8].to_vec()
}

fn step_span_id(s: &StepPart) -> Vec<u8> {
    let iteration = s.iteration.map(|i| i.to_string()).unwrap_or_default();
    digest(&["step", &s.run_id, &s.number, &iteration, &s.attempt.to_string()])[..8].to_vec()
}

fn nanos(ms: u64) -> u64 {
    ms.saturating_mul(1_000_000)
}

fn status_of(error: &Option<(String, String)>, failed: bool) -> Option<Status> {
    match error {
        Some((kind, message)) if failed => Some(Status {
            message: format!("[{kind}] {message}"),
            code: status::StatusCode::Error as i32,
        }),
        _ => None,
    }
}

/// The spans of a finished run tree.
fn spans_of(tree: &Tree) -> Vec<Span> {
    let Some(root) = tree
        .runs
        .iter()
        .find(|r| r.parent_run.is_none())
        .or(tree.runs.first())
    else {
        return Vec::new();
    };
    let trace = trace_id(&root.id);
    // The record that called each child run.
    let mut caller: HashMap<&str, &StepPart> = HashMap::new();
    for s in &tree.steps {
        if let Some(c) = &s.child_run {
            // An iteration's record calls it, rather than its loop's.
            let keep = caller.get(c.as_str()).is_none_or(|prev| prev.iteration.is_none());
            if keep {
                caller.insert(c, s);
            }
        }
    }
    // Records by run and number (the loop's own record for iterations).
    let mut by_number: HashMap<(&str, &str), &StepPart> = HashMap::new();
    for s in tree.steps.iter().filter(|s| s.iteration.is_none()) {
        by_number.insert((s.run_id.as_str(), s.number.as_str()), s);
    }
    let mut out = Vec::with_capacity(tree.runs.len() + tree.steps.len());
    for r in &tree.runs {
        let parent = match caller.get(r.id.as_str()) {
            Some(s) => step_span_id(s),
            None => Vec::new(),
        };
        let mut attributes = vec![
            kv("switchyard.run_id", r.id.as_str()),
            kv("switchyard.flow", r.flow.as_str()),
            kv("switchyard.status", r.status.as_str()),
            kv("gen_ai.usage.input_tokens", r.tokens.0),
            kv("gen_ai.usage.output_tokens", r.tokens.1),
            kv("switchyard.cost_usd", r.cost_usd),
        ];
        if let Some((kind, _)) = &r.error {
            attributes.push(kv("switchyard.error.kind", kind.as_str()));
        }
        if let Some(b) = &r.batch {
            attributes.push(kv("switchyard.batch", b.as_str()));
        }
        if let Some(i) = &r.item_id {
            attributes.push(kv("switchyard.item_id", i.as_str()));
        }
        out.push(Span {
            trace_id: trace.clone(),
            span_id: run_span_id(&r.id),
            parent_span_id: parent,
            name: format!("run {}", r.flow),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: nanos(r.started_at),
            end_time_unix_nano: nanos(r.finished_at.unwrap_or(r.started_at)),
            attributes,
            status: status_of(&r.error, r.status == RunStatus::Failed),
            ..Default::default()
        });
    }
    for s in &tree.steps {
        let parent = if s.iteration.is_some() {
            by_number
                .get(&(s.run_id.as_str(), s.number.as_str()))
                .map(|p| step_span_id(p))
        } else {
            s.number
                .rsplit_once('.')
                .and_then(|(up, _)| by_number.get(&(s.run_id.as_str(), up)))
                .map(|p| step_span_id(p))
        }
        .unwrap_or_else(|| run_span_id(&s.run_id));
        let name = match (s.kind.as_str(), s.iteration) {
            (_, Some(i)) => format!("iteration {} [{i}]", s.step),
            ("turn", _) => format!("turn {}", s.number),
            ("tool", _) => format!("tool {}", s.step),
            _ => format!("step {}", s.step),
        };
        let mut attributes = vec![
            kv("switchyard.run_id", s.run_id.as_str()),
            kv("switchyard.step", s.step.as_str()),
            kv("switchyard.number", s.number.as_str()),
            kv("switchyard.kind", s.kind.as_str()),
            kv("switchyard.attempt", u64::from(s.attempt)),
            kv("switchyard.status", s.status.as_str()),
            kv("gen_ai.usage.input_tokens", s.tokens.0),
            kv("gen_ai.usage.output_tokens", s.tokens.1),
            kv("switchyard.cost_usd", s.cost_usd),
        ];
        if let Some(i) = s.iteration {
            attributes.push(kv("switchyard.iteration", i));
        }
        if let Some((kind, _)) = &s.error {
            attributes.push(kv("switchyard.error.kind", kind.as_str()));
        }
        let end = s.finished_at.unwrap_or(s.started_at);
        let events = s
            .route
            .iter()
            .map(|to| span::Event {
                time_unix_nano: nanos(end),
                name: "route".into(),
                attributes: vec![kv("switchyard.route.to", to.as_str())],
                ..Default::default()
            })
            .collect();
        out.push(Span {
            trace_id: trace.clone(),
            span_id: step_span_id(s),
            parent_span_id: parent,
            name,
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: nanos(s.started_at),
            end_time_unix_nano: nanos(end),
            attributes,
            events,
            status: status_of(&s.error, s.status == StepStatus::Failed),
            ..Default::default()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_gets_the_traces_path_unless_it_names_one() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(traces_url("http://c:4318/").unwrap(), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("https://c/otlp/v1/traces").unwrap(),
            "https://c/otlp/v1/traces"
        );
        assert!(
            traces_url("127.0.0.1:4318")
                .unwrap_err()
                .contains("http:// or https://")
        );
        assert!(traces_url("http://").is_err());
    }
}
