//! What a run tree's spans are made from, captured on the runs' threads and read back on the
//! exporter's: each run's and record's fields appended to byte buffers as the engine makes
//! them (numbers as varints), a finished tree's bytes copied out into [`Finished`] for the
//! exporter's thread, and the emptied tree kept for the next run.

use crate::record::{self, RunRecord, StepRecord};

/// A run as its span needs it, read from its tree's buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct RunPart<'a> {
    pub(super) id: &'a str,
    pub(super) flow: &'a str,
    pub(super) parent_run: Option<&'a str>,
    /// The number of the record that started it (`2`, `2[3]` for an iteration's).
    pub(super) parent_step: Option<&'a str>,
    pub(super) status: &'a str,
    /// Kind and message.
    pub(super) error: Option<(&'a str, &'a str)>,
    /// Unix nanoseconds ([`record::nanos`]).
    pub(super) start_ns: u64,
    pub(super) end_ns: Option<u64>,
    pub(super) tokens: (u64, u64),
    pub(super) cost_usd: f64,
    /// Model calls whose cost is unknown (no `usage` reported).
    pub(super) cost_unknown_calls: u64,
    pub(super) batch: Option<&'a str>,
    pub(super) item_id: Option<&'a str>,
}

/// A step record as its span needs it, read from its tree's buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct StepPart<'a> {
    pub(super) run_id: &'a str,
    pub(super) number: &'a str,
    pub(super) step: &'a str,
    pub(super) kind: &'a str,
    pub(super) attempt: u32,
    pub(super) status: &'a str,
    pub(super) iteration: Option<u64>,
    /// Unix nanoseconds ([`record::nanos`]).
    pub(super) start_ns: u64,
    pub(super) end_ns: Option<u64>,
    pub(super) tokens: (u64, u64),
    pub(super) cost_usd: f64,
    /// Model calls whose cost is unknown (no `usage` reported).
    pub(super) cost_unknown_calls: u64,
    pub(super) error: Option<(&'a str, &'a str)>,
    pub(super) route: Option<&'a str>,
    /// Of a tool call, the tool the model named and the id it gave the call.
    pub(super) tool: Option<&'a str>,
    pub(super) call_id: Option<&'a str>,
    /// Of a model call (an `llm` agent's, a loop's turn), the model asked for and the one the
    /// response named.
    pub(super) model: Option<&'a str>,
    pub(super) response_model: Option<&'a str>,
    /// Of an MCP call (a `kind: mcp` step's, a loop's MCP tool), what it noted
    /// ([`crate::agents::mcp::call_notes`]).
    pub(super) mcp: McpNotes<'a>,
}

/// An MCP call's server, tool, transport, protocol revision and HTTP address and port.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct McpNotes<'a> {
    pub(super) server: Option<&'a str>,
    pub(super) tool: Option<&'a str>,
    pub(super) transport: Option<&'a str>,
    pub(super) protocol: Option<&'a str>,
    pub(super) address: Option<&'a str>,
    pub(super) port: Option<&'a str>,
}

/// The notes' keys, in the order they are written and read.
const MCP_NOTES: [&str; 6] = ["server", "tool", "transport", "protocol", "address", "port"];

/// What a run tree's spans are made from: its runs' and records' fields, appended to byte
/// buffers as the engine makes them — a copy of a few bytes on the run's thread, no
/// allocation per field — and read back on the exporter's thread.
#[derive(Default)]
pub(super) struct Tree {
    /// The runs that ended here, for their spans.
    pub(super) runs: Vec<u8>,
    pub(super) steps: Vec<u8>,
    /// Every run of the tree that started here, whether or not it ends here: its id, the
    /// number its steps are numbered under, and its flow ([`Tree::lineage`]).
    pub(super) started: Vec<u8>,
    pub(super) n_runs: usize,
    pub(super) n_steps: usize,
    pub(super) n_started: usize,
    /// The root run's id: the trace's.
    pub(super) root: String,
}

impl Tree {
    pub(super) fn push_run(&mut self, run: &RunRecord) {
        let b = &mut self.runs;
        put_str(b, &run.id);
        put_str(b, &run.flow);
        put_opt(b, run.parent_run.as_deref());
        put_opt(b, run.parent_step.as_deref());
        put_str(b, run.status.as_str());
        put_error(b, run.error.as_ref());
        put_u64(b, record::nanos(run.started_at, run.started_ns));
        put_opt_u64(b, run.finished_at.map(|at| record::nanos(at, run.finished_ns)));
        put_u64(b, run.usage.input_tokens);
        put_u64(b, run.usage.output_tokens);
        put_u64(b, run.usage.cost_usd.usd().to_bits());
        put_u64(b, run.usage.cost_unknown_calls);
        put_opt(b, run.batch.as_deref());
        put_opt(b, run.item_id.as_deref());
        self.n_runs += 1;
    }

    pub(super) fn push_step(&mut self, s: &StepRecord) {
        let b = &mut self.steps;
        put_str(b, &s.run_id);
        put_str(b, &s.number);
        put_str(b, &s.step);
        put_str(b, &s.kind);
        put_u64(b, u64::from(s.attempt));
        put_str(b, s.status.as_str());
        put_opt_u64(b, s.iteration);
        put_u64(b, record::nanos(s.started_at, s.started_ns));
        put_opt_u64(b, s.finished_at.map(|at| record::nanos(at, s.finished_ns)));
        put_u64(b, s.usage.input_tokens);
        put_u64(b, s.usage.output_tokens);
        put_u64(b, s.usage.cost_usd.usd().to_bits());
        put_u64(b, s.usage.cost_unknown_calls);
        put_error(b, s.error.as_ref());
        put_opt(b, s.route.as_deref());
        // What the record's notes say of its call (the agent loop's `named`, an `llm`
        // call's `Notes`).
        let note = |k: &str| {
            s.answers
                .as_ref()
                .and_then(|a| a.get(k))
                .and_then(serde_json::Value::as_str)
        };
        for k in ["tool", "call_id", "model", "response_model"] {
            put_opt(b, note(k));
        }
        let mcp = s.answers.as_ref().and_then(|a| a.get("mcp"));
        for k in MCP_NOTES {
            put_opt(b, mcp.and_then(|m| m.get(k)).and_then(serde_json::Value::as_str));
        }
        self.n_steps += 1;
    }

    pub(super) fn push_started(&mut self, run: &RunRecord) {
        let b = &mut self.started;
        put_str(b, &run.id);
        put_str(b, run.parent_step.as_deref().unwrap_or(""));
        put_str(b, &run.flow);
        self.n_started += 1;
    }

    pub(super) fn records(&self) -> usize {
        self.n_runs + self.n_steps
    }

    /// The tree as the exporter's thread would read it.
    #[cfg(test)]
    pub(super) fn view(&self) -> TreeView<'_> {
        TreeView {
            root: &self.root,
            runs: &self.runs,
            steps: &self.steps,
            started: &self.started,
            n_runs: self.n_runs,
            n_steps: self.n_steps,
            n_started: self.n_started,
        }
    }
}

/// A finished tree's buffers, read where they lie: in the tree, or copied into [`Finished`].
#[derive(Clone, Copy)]
pub(super) struct TreeView<'a> {
    pub(super) root: &'a str,
    pub(super) runs: &'a [u8],
    pub(super) steps: &'a [u8],
    pub(super) started: &'a [u8],
    pub(super) n_runs: usize,
    pub(super) n_steps: usize,
    pub(super) n_started: usize,
}

impl<'a> TreeView<'a> {
    pub(super) fn runs(&self) -> Vec<RunPart<'a>> {
        let mut r = Reader(self.runs);
        (0..self.n_runs)
            .map(|_| RunPart {
                id: r.str(),
                flow: r.str(),
                parent_run: r.opt(),
                parent_step: r.opt(),
                status: r.str(),
                error: r.error(),
                start_ns: r.u64(),
                end_ns: r.opt_u64(),
                tokens: (r.u64(), r.u64()),
                cost_usd: f64::from_bits(r.u64()),
                cost_unknown_calls: r.u64(),
                batch: r.opt(),
                item_id: r.opt(),
            })
            .collect()
    }

    pub(super) fn steps(&self) -> Vec<StepPart<'a>> {
        let mut r = Reader(self.steps);
        (0..self.n_steps)
            .map(|_| StepPart {
                run_id: r.str(),
                number: r.str(),
                step: r.str(),
                kind: r.str(),
                attempt: u32::try_from(r.u64()).unwrap_or(u32::MAX),
                status: r.str(),
                iteration: r.opt_u64(),
                start_ns: r.u64(),
                end_ns: r.opt_u64(),
                tokens: (r.u64(), r.u64()),
                cost_usd: f64::from_bits(r.u64()),
                cost_unknown_calls: r.u64(),
                error: r.error(),
                route: r.opt(),
                tool: r.opt(),
                call_id: r.opt(),
                model: r.opt(),
                response_model: r.opt(),
                mcp: McpNotes {
                    server: r.opt(),
                    tool: r.opt(),
                    transport: r.opt(),
                    protocol: r.opt(),
                    address: r.opt(),
                    port: r.opt(),
                },
            })
            .collect()
    }
}

/// A number as a varint (seven bits a byte, low first): most of a record's numbers (lengths,
/// tokens, counts) take one byte, so a run's capture writes about half the bytes it would at
/// eight a number — and bytes written are what the capture costs on the run's thread.
fn put_u64(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push((v as u8) | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    put_u64(b, s.len() as u64);
    b.extend_from_slice(s.as_bytes());
}

fn put_opt(b: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => {
            b.push(1);
            put_str(b, s);
        }
        None => b.push(0),
    }
}

fn put_opt_u64(b: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => {
            b.push(1);
            put_u64(b, v);
        }
        None => b.push(0),
    }
}

fn put_error(b: &mut Vec<u8>, e: Option<&crate::record::StepError>) {
    match e {
        Some(e) => {
            b.push(1);
            put_str(b, e.kind.as_str());
            put_str(b, &e.message);
        }
        None => b.push(0),
    }
}

/// Reads back what the `put_` functions wrote, in the same order. The buffers are only ever
/// written by them, so a short read is a bug: it reads as empty rather than panicking.
pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }

    pub(super) fn u64(&mut self) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some((&byte, rest)) = self.0.split_first() else {
                break;
            };
            self.0 = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                break;
            }
        }
        v
    }

    pub(super) fn bytes(&mut self) -> &'a [u8] {
        let n = usize::try_from(self.u64()).unwrap_or(usize::MAX);
        self.take(n)
    }

    pub(super) fn str(&mut self) -> &'a str {
        std::str::from_utf8(self.bytes()).unwrap_or("")
    }

    pub(super) fn flag(&mut self) -> bool {
        self.take(1).first() == Some(&1)
    }

    pub(super) fn opt(&mut self) -> Option<&'a str> {
        self.flag().then(|| self.str())
    }

    pub(super) fn opt_u64(&mut self) -> Option<u64> {
        self.flag().then(|| self.u64())
    }

    pub(super) fn error(&mut self) -> Option<(&'a str, &'a str)> {
        self.flag().then(|| (self.str(), self.str()))
    }
}

/// The largest buffer a spare tree keeps.
pub(super) const SPARE_BYTES: usize = 16 * 1024;
/// The most bytes of finished trees [`Finished`] keeps room for once emptied.
pub(super) const FINISHED_BYTES: usize = 4 << 20;

/// Finished trees, each copied into one buffer as it ends, so that its own buffers go back
/// to the spares at once: root, record counts, then the three buffers, each length-prefixed.
#[derive(Default)]
pub(super) struct Finished {
    pub(super) bytes: Vec<u8>,
    pub(super) trees: usize,
    pub(super) records: usize,
}

impl Finished {
    pub(super) fn push(&mut self, tree: &Tree) {
        let b = &mut self.bytes;
        put_str(b, &tree.root);
        for n in [tree.n_runs, tree.n_steps, tree.n_started] {
            put_u64(b, n as u64);
        }
        for part in [&tree.runs, &tree.steps, &tree.started] {
            put_u64(b, part.len() as u64);
            b.extend_from_slice(part);
        }
        self.trees += 1;
        self.records += tree.records();
    }

    pub(super) fn views(&self) -> impl Iterator<Item = TreeView<'_>> {
        let mut r = Reader(&self.bytes);
        (0..self.trees).map(move |_| {
            let root = r.str();
            let (n_runs, n_steps, n_started) = (r.u64(), r.u64(), r.u64());
            let count = |n: u64| usize::try_from(n).unwrap_or(0);
            TreeView {
                root,
                n_runs: count(n_runs),
                n_steps: count(n_steps),
                n_started: count(n_started),
                runs: r.bytes(),
                steps: r.bytes(),
                started: r.bytes(),
            }
        })
    }

    pub(super) fn clear(&mut self) {
        self.bytes.clear();
        self.bytes.shrink_to(FINISHED_BYTES);
        self.trees = 0;
        self.records = 0;
    }
}

impl Tree {
    /// Emptied for reuse, or `None` when its buffers grew too big to keep.
    pub(super) fn recycled(mut self) -> Option<Tree> {
        if self.runs.capacity() > SPARE_BYTES
            || self.steps.capacity() > SPARE_BYTES
            || self.started.capacity() > SPARE_BYTES
        {
            return None;
        }
        self.runs.clear();
        self.steps.clear();
        self.started.clear();
        self.root.clear();
        self.n_runs = 0;
        self.n_steps = 0;
        self.n_started = 0;
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{RunStatus, StepStatus};

    #[test]
    fn records_read_back_from_a_tree_as_written() {
        let run = RunRecord {
            id: "r1".into(),
            flow: "f".into(),
            flow_hash: "h".into(),
            parent_run: None,
            parent_step: None,
            depth: 0,
            status: RunStatus::Failed,
            input: serde_json::Value::Null,
            output: None,
            error: Some(crate::record::StepError::new(
                crate::record::ErrorKind::Agent,
                "bad ünïcode",
            )),
            started_at: 10,
            finished_at: Some(20),
            started_ns: None,
            finished_ns: None,
            usage: crate::record::Usage {
                input_tokens: 3,
                output_tokens: 4,
                cost_usd: crate::record::cost::Cost::from_nanos(250_000_000),
                cost_unknown_calls: 0,
            },
            steps: 1,
            flow_path: None,
            context: serde_json::Value::Null,
            messages: None,
            batch: Some("b".into()),
            item_id: None,
            item_index: None,
            now_us: None,
            agent_changes: None,
            origin: None,
            files: Vec::new(),
        };
        let step = StepRecord {
            run_id: "r1".into(),
            number: "1.2".into(),
            step: "s".into(),
            kind: "agent".into(),
            attempt: 2,
            status: StepStatus::Succeeded,
            iteration: Some(7),
            iterations: None,
            input: None,
            result: None,
            changes: Vec::new(),
            violations: Vec::new(),
            error: None,
            started_at: 11,
            finished_at: None,
            started_ns: Some(11_000_123),
            finished_ns: None,
            usage: Default::default(),
            child_run: Some("r2".into()),
            route: Some("next".into()),
            answers: Some(serde_json::json!({"tool": "lookup", "call_id": "call_1", "told": "x"})),
            files: Vec::new(),
        };
        let mut tree = Tree::default();
        tree.push_step(&step);
        tree.push_run(&run);
        tree.push_step(&step);
        let mut finished = Finished::default();
        finished.push(&tree);
        finished.push(&tree);
        let views: Vec<TreeView<'_>> = finished.views().collect();
        assert_eq!(views.len(), 2);
        let runs = views[1].runs();
        assert_eq!(runs.len(), 1);
        let r = runs[0];
        assert_eq!(
            (r.id, r.flow, r.parent_run, r.status),
            ("r1", "f", None, "failed")
        );
        assert_eq!(r.error, Some(("agent", "bad ünïcode")));
        assert_eq!(
            (r.start_ns, r.end_ns, r.tokens, r.cost_usd),
            (10_000_000, Some(20_000_000), (3, 4), 0.25)
        );
        assert_eq!((r.batch, r.item_id), (Some("b"), None));
        assert_eq!(views[1].steps().len(), 2);
        let steps = tree.view().steps();
        assert_eq!(steps.len(), 2);
        for s in steps {
            assert_eq!(
                (s.run_id, s.number, s.step, s.kind, s.attempt),
                ("r1", "1.2", "s", "agent", 2)
            );
            assert_eq!(
                (s.status, s.iteration, s.start_ns, s.end_ns),
                ("succeeded", Some(7), 11_000_123, None)
            );
            assert_eq!((s.error, s.route), (None, Some("next")));
            assert_eq!(
                (s.tool, s.call_id, s.model, s.response_model),
                (Some("lookup"), Some("call_1"), None, None)
            );
        }
    }

    #[test]
    fn numbers_read_back_as_written_and_a_short_buffer_reads_as_empty() {
        let values = [0, 1, 127, 128, 300, 16_383, 16_384, u64::from(u32::MAX), u64::MAX];
        let mut b = Vec::new();
        for v in values {
            put_u64(&mut b, v);
        }
        put_str(&mut b, "ü");
        let mut r = Reader(&b);
        for v in values {
            assert_eq!(r.u64(), v);
        }
        assert_eq!((r.str(), r.u64(), r.str()), ("ü", 0, ""));
    }
}
