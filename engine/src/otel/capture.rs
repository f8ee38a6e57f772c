//! What a run tree's spans are made from, captured on the runs' threads and read back on the
//! exporter's: each run's and record's fields appended to the tree's byte buffer as the engine
//! makes them (a fixed header a record, then its strings), a finished tree's bytes copied out
//! into [`Finished`] for the exporter's thread in one copy, and the emptied tree kept for the
//! next run.

use crate::record::{self, RunRecord, RunStatus, StepRecord, StepStatus};

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

/// What a run tree's spans are made from: its runs' and records' fields, appended to one byte
/// buffer as the engine makes them — a copy of a few bytes on the run's thread, no
/// allocation per field — and read back on the exporter's thread.
///
/// The buffer holds the root run's id, then the records in the order they were made. A
/// record is a fixed-width header (its sort, which of its optional fields it has, as bits,
/// then its numbers, little-endian, and the lengths of the strings every record of its sort
/// has), built on the stack and appended in one copy, followed by its strings: those, then
/// any others, each after its length. Optional fields it lacks take no bytes, and the run id of a
/// record of the root run is not written: a record costs a handful of copies whatever it holds.
///
/// The header is kept small, since every byte of it is copied twice more on the run's thread
/// (into [`Finished`], then out of the core's cache to the exporter's): times are
/// nanoseconds after the tree's [`base`](Tree::base) and durations, as four bytes each, an
/// attempt and the three lengths one byte each; a record whose numbers do not fit writes them
/// whole after the header instead ([`has::WIDE_TIMES`], [`has::WIDE_ATTEMPT`],
/// [`has::LONG_NAMES`]).
///
/// Three sorts of record: a run that ended here ([`sort::RUN`]), a step record
/// ([`sort::STEP`]), and a run of the tree that started here, whether or not it ends here
/// ([`sort::STARTED`]: its id, the number its steps are numbered under, and its flow).
#[derive(Default)]
pub(super) struct Tree {
    /// The root run's id (the trace's), then the records.
    bytes: Vec<u8>,
    /// The length of the root run's id at the start of [`bytes`](Self::bytes).
    root_len: usize,
    pub(super) n_runs: usize,
    pub(super) n_steps: usize,
    pub(super) n_started: usize,
    /// Unix nanoseconds its records' times are counted from: the root run's start.
    base: u64,
}

/// A record's sort: the first byte of its header.
mod sort {
    pub(super) const RUN: u8 = 1;
    pub(super) const STEP: u8 = 2;
    pub(super) const STARTED: u8 = 3;
}

/// A record's optional fields, as bits of its header's first word.
mod has {
    /// The record's run is not the root: its id follows.
    pub(super) const OTHER_RUN: u32 = 1;
    pub(super) const END: u32 = 1 << 1;
    pub(super) const ITERATION: u32 = 1 << 2;
    /// Tokens, cost or model calls of unknown cost: the four numbers follow the header.
    pub(super) const USAGE: u32 = 1 << 3;
    pub(super) const ERROR: u32 = 1 << 4;
    pub(super) const ROUTE: u32 = 1 << 5;
    /// A run's: the run that started it, the record that did, its batch and item.
    pub(super) const PARENT_RUN: u32 = 1 << 6;
    pub(super) const PARENT_STEP: u32 = 1 << 7;
    pub(super) const BATCH: u32 = 1 << 8;
    pub(super) const ITEM: u32 = 1 << 9;
    /// A step record's notes: the first of ten bits, one per note of [`NOTES`](super::NOTES)
    /// and then of [`MCP_NOTES`](super::MCP_NOTES), in that order.
    pub(super) const NOTE: u32 = 1 << 10;
    /// The start is before the tree's base or more than 2^32 ns (about 4.3 s) after it, or
    /// the end is before the start or that long after it: both follow the header as Unix
    /// nanoseconds.
    pub(super) const WIDE_TIMES: u32 = 1 << 20;
    /// A step record's attempt is past 255: it follows as four bytes.
    pub(super) const WIDE_ATTEMPT: u32 = 1 << 21;
    /// One of a step record's number, id and kind is longer than 255 bytes: the three
    /// lengths follow as four bytes each.
    pub(super) const LONG_NAMES: u32 = 1 << 22;
}

/// A step record's notes, in the order of their bits and strings: of a tool call, the tool
/// and the call's id; of a model call, the model asked for and the one that answered; then
/// the MCP call's notes ([`MCP_NOTES`]).
const NOTES: [&str; 4] = ["tool", "call_id", "model", "response_model"];
/// The notes' keys, in the order they are written and read.
const MCP_NOTES: [&str; 6] = ["server", "tool", "transport", "protocol", "address", "port"];

/// A step record's header: sort, bits, status, attempt, the lengths of its number, step id
/// and kind (which follow it, in that order, after the header's extensions), start and
/// duration.
const STEP_HEAD: usize = 1 + 4 + 1 + 1 + 3 + 4 + 4;
/// A run's header: sort, bits, status, start, duration, and the length of its flow (which
/// follows it, after the header's extension).
const RUN_HEAD: usize = 1 + 4 + 1 + 4 + 4 + 4;

fn step_status_code(s: StepStatus) -> u8 {
    match s {
        StepStatus::Started => 0,
        StepStatus::Succeeded => 1,
        StepStatus::Failed => 2,
        StepStatus::Interrupted => 3,
    }
}

fn run_status_code(s: RunStatus) -> u8 {
    match s {
        RunStatus::Queued => 0,
        RunStatus::Running => 1,
        RunStatus::Succeeded => 2,
        RunStatus::Failed => 3,
        RunStatus::Interrupted => 4,
        RunStatus::Cancelled => 5,
    }
}

const STEP_STATUSES: [StepStatus; 4] = [
    StepStatus::Started,
    StepStatus::Succeeded,
    StepStatus::Failed,
    StepStatus::Interrupted,
];
const RUN_STATUSES: [RunStatus; 6] = [
    RunStatus::Queued,
    RunStatus::Running,
    RunStatus::Succeeded,
    RunStatus::Failed,
    RunStatus::Interrupted,
    RunStatus::Cancelled,
];

fn usage_bit(u: &record::Usage) -> u32 {
    let none =
        u.input_tokens == 0 && u.output_tokens == 0 && u.cost_usd.is_zero() && u.cost_unknown_calls == 0;
    if none { 0 } else { has::USAGE }
}

/// The header bits of the fields that are there.
fn bits_of<const N: usize>(fields: [(u32, bool); N]) -> u32 {
    fields
        .into_iter()
        .filter(|&(_, on)| on)
        .fold(0, |bits, (bit, _)| bits | bit)
}

/// A record's start and end as the header's two four-byte numbers (start after `base`,
/// duration), or `None` when they do not fit ([`has::WIDE_TIMES`]).
fn narrow_times(base: u64, start: u64, end: Option<u64>) -> Option<[u8; 8]> {
    let after = u32::try_from(start.checked_sub(base)?).ok()?;
    let took = match end {
        Some(end) => u32::try_from(end.checked_sub(start)?).ok()?,
        None => 0,
    };
    let mut t = [0u8; 8];
    t[..4].copy_from_slice(&after.to_le_bytes());
    t[4..].copy_from_slice(&took.to_le_bytes());
    Some(t)
}

/// What follows a step record's header when it has any of [`has::WIDE_TIMES`],
/// [`has::WIDE_ATTEMPT`], [`has::LONG_NAMES`] and [`has::ITERATION`] (few have): those, in
/// that order.
#[inline(never)]
fn put_step_extensions(
    b: &mut Vec<u8>,
    s: &StepRecord,
    bits: u32,
    start: u64,
    end: Option<u64>,
    names: [&[u8]; 3],
) {
    if bits & has::WIDE_TIMES != 0 {
        put_wide_times(b, start, end);
    }
    if bits & has::WIDE_ATTEMPT != 0 {
        b.extend_from_slice(&s.attempt.to_le_bytes());
    }
    if bits & has::LONG_NAMES != 0 {
        for name in names {
            b.extend_from_slice(&(name.len() as u32).to_le_bytes());
        }
    }
    if let Some(i) = s.iteration {
        b.extend_from_slice(&i.to_le_bytes());
    }
}

/// A step record's notes, in the order of [`NOTES`] and then [`MCP_NOTES`].
type Notes<'a> = [Option<&'a str>; NOTES.len() + MCP_NOTES.len()];

/// What a step record's notes say of its call (the agent loop's `named`, an `llm` call's
/// `Notes`, an MCP call's `mcp`), looked up once, out of the way of the records that have
/// none (most), and the header bits of those it has ([`has::NOTE`]).
#[inline(never)]
fn notes(answers: &serde_json::Value) -> (Notes<'_>, u32) {
    let mcp = answers.get("mcp");
    let found = NOTES
        .iter()
        .map(|k| answers.get(k))
        .chain(MCP_NOTES.iter().map(|k| mcp.and_then(|m| m.get(k))));
    let mut notes: Notes<'_> = [None; NOTES.len() + MCP_NOTES.len()];
    let mut bits = 0;
    for (i, (slot, v)) in notes.iter_mut().zip(found).enumerate() {
        *slot = v.and_then(serde_json::Value::as_str);
        if slot.is_some() {
            bits |= has::NOTE << i;
        }
    }
    (notes, bits)
}

/// The times of a record whose header has [`has::WIDE_TIMES`]: its start and end (0 when it
/// has none), whole.
fn put_wide_times(b: &mut Vec<u8>, start: u64, end: Option<u64>) {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&start.to_le_bytes());
    t[8..].copy_from_slice(&end.unwrap_or(0).to_le_bytes());
    b.extend_from_slice(&t);
}

fn put_usage(b: &mut Vec<u8>, u: &record::Usage) {
    let mut h = [0u8; 32];
    h[0..8].copy_from_slice(&u.input_tokens.to_le_bytes());
    h[8..16].copy_from_slice(&u.output_tokens.to_le_bytes());
    h[16..24].copy_from_slice(&u.cost_usd.usd().to_bits().to_le_bytes());
    h[24..32].copy_from_slice(&u.cost_unknown_calls.to_le_bytes());
    b.extend_from_slice(&h);
}

impl Tree {
    /// An empty tree for root run `root`, its records' times counted from `base`.
    pub(super) fn new(root: &str, base: u64) -> Tree {
        let mut tree = Tree {
            bytes: Vec::with_capacity(TREE_BYTES),
            ..Tree::default()
        };
        tree.start(root, base);
        tree
    }

    /// Starts this emptied tree ([`clear`](Self::clear)) again, for root run `root`.
    pub(super) fn start(&mut self, root: &str, base: u64) {
        self.bytes.extend_from_slice(cut(root));
        self.root_len = self.bytes.len();
        self.base = base;
    }

    /// The root run's id.
    fn root(&self) -> &[u8] {
        &self.bytes[..self.root_len]
    }

    pub(super) fn push_run(&mut self, run: &RunRecord) {
        let other = run.id.as_bytes() != self.root();
        let start = record::nanos(run.started_at, run.started_ns);
        let end = run.finished_at.map(|at| record::nanos(at, run.finished_ns));
        let times = narrow_times(self.base, start, end);
        let bits = usage_bit(&run.usage)
            | bits_of([
                (has::OTHER_RUN, other),
                (has::END, run.finished_at.is_some()),
                (has::ERROR, run.error.is_some()),
                (has::PARENT_RUN, run.parent_run.is_some()),
                (has::PARENT_STEP, run.parent_step.is_some()),
                (has::BATCH, run.batch.is_some()),
                (has::ITEM, run.item_id.is_some()),
                (has::WIDE_TIMES, times.is_none()),
            ]);
        let mut h = [0u8; RUN_HEAD];
        h[0] = sort::RUN;
        h[1..5].copy_from_slice(&bits.to_le_bytes());
        h[5] = run_status_code(run.status);
        if let Some(t) = times {
            h[6..14].copy_from_slice(&t);
        }
        let flow = cut(&run.flow);
        h[14..18].copy_from_slice(&(flow.len() as u32).to_le_bytes());
        let b = &mut self.bytes;
        b.extend_from_slice(&h);
        if times.is_none() {
            put_wide_times(b, start, end);
        }
        b.extend_from_slice(flow);
        if bits & has::USAGE != 0 {
            put_usage(b, &run.usage);
        }
        if other {
            put_str(b, &run.id);
        }
        for s in [&run.parent_run, &run.parent_step] {
            put_some(b, s.as_deref());
        }
        if let Some(e) = &run.error {
            put_str(b, e.kind.as_str());
            put_str(b, &e.message);
        }
        for s in [&run.batch, &run.item_id] {
            put_some(b, s.as_deref());
        }
        self.n_runs += 1;
    }

    pub(super) fn push_step(&mut self, s: &StepRecord) {
        let other = s.run_id.as_bytes() != self.root();
        let start = record::nanos(s.started_at, s.started_ns);
        let end = s.finished_at.map(|at| record::nanos(at, s.finished_ns));
        let times = narrow_times(self.base, start, end);
        let names = [cut(&s.number), cut(&s.step), cut(&s.kind)];
        let short = names.iter().all(|n| n.len() <= usize::from(u8::MAX));
        let attempt = u8::try_from(s.attempt).ok();
        let notes = s.answers.as_ref().map(notes);
        let bits = usage_bit(&s.usage)
            | bits_of([
                (has::OTHER_RUN, other),
                (has::END, end.is_some()),
                (has::ITERATION, s.iteration.is_some()),
                (has::ERROR, s.error.is_some()),
                (has::ROUTE, s.route.is_some()),
                (has::WIDE_TIMES, times.is_none()),
                (has::WIDE_ATTEMPT, attempt.is_none()),
                (has::LONG_NAMES, !short),
            ])
            | notes.map_or(0, |(_, bits)| bits);
        let mut h = [0u8; STEP_HEAD];
        h[0] = sort::STEP;
        h[1..5].copy_from_slice(&bits.to_le_bytes());
        h[5] = step_status_code(s.status);
        h[6] = attempt.unwrap_or(0);
        if short {
            for (at, name) in names.iter().enumerate() {
                h[7 + at] = name.len() as u8;
            }
        }
        if let Some(t) = times {
            h[10..18].copy_from_slice(&t);
        }
        let b = &mut self.bytes;
        // Room for what most records hold, at once: the header and the three names.
        b.reserve(STEP_HEAD + names.iter().map(|n| n.len()).sum::<usize>());
        b.extend_from_slice(&h);
        if bits & (has::WIDE_TIMES | has::WIDE_ATTEMPT | has::LONG_NAMES | has::ITERATION) != 0 {
            put_step_extensions(b, s, bits, start, end, names);
        }
        for name in names {
            b.extend_from_slice(name);
        }
        if bits & has::USAGE != 0 {
            put_usage(b, &s.usage);
        }
        if other {
            put_str(b, &s.run_id);
        }
        if let Some(e) = &s.error {
            put_str(b, e.kind.as_str());
            put_str(b, &e.message);
        }
        put_some(b, s.route.as_deref());
        for n in notes.iter().flat_map(|(n, _)| n) {
            put_some(b, *n);
        }
        self.n_steps += 1;
    }

    pub(super) fn push_started(&mut self, run: &RunRecord) {
        let other = run.id.as_bytes() != self.root();
        let b = &mut self.bytes;
        b.extend_from_slice(&[sort::STARTED, u8::from(other)]);
        if other {
            put_str(b, &run.id);
        }
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
            root: std::str::from_utf8(self.root()).unwrap_or(""),
            base: self.base,
            records: &self.bytes[self.root_len..],
            n_runs: self.n_runs,
            n_steps: self.n_steps,
            n_started: self.n_started,
        }
    }

    /// Emptied for the next tree, its buffer kept unless it grew past [`SPARE_BYTES`].
    pub(super) fn clear(&mut self) {
        if self.bytes.capacity() > SPARE_BYTES {
            self.bytes = Vec::with_capacity(TREE_BYTES);
        } else {
            self.bytes.clear();
        }
        self.root_len = 0;
        self.base = 0;
        self.n_runs = 0;
        self.n_steps = 0;
        self.n_started = 0;
    }
}

/// A finished tree's records, read where they lie: in the tree, or copied into [`Finished`].
#[derive(Clone, Copy)]
pub(super) struct TreeView<'a> {
    pub(super) root: &'a str,
    pub(super) base: u64,
    /// The records, after the root's id.
    pub(super) records: &'a [u8],
    pub(super) n_runs: usize,
    pub(super) n_steps: usize,
    pub(super) n_started: usize,
}

/// A run of a tree that started in the tree's process: its id, and the number its steps are
/// numbered under and its flow.
pub(super) type Started<'a> = (&'a str, (&'a str, &'a str));

/// A tree's records, by sort, each in the order it was made.
#[derive(Default)]
pub(super) struct Parts<'a> {
    pub(super) runs: Vec<RunPart<'a>>,
    pub(super) steps: Vec<StepPart<'a>>,
    pub(super) started: Vec<Started<'a>>,
}

impl<'a> TreeView<'a> {
    /// Every record, read in one pass.
    pub(super) fn parts(&self) -> Parts<'a> {
        let mut parts = Parts {
            runs: Vec::with_capacity(self.n_runs),
            steps: Vec::with_capacity(self.n_steps),
            started: Vec::with_capacity(self.n_started),
        };
        let mut r = Reader(self.records);
        while let [sort, ..] = *r.0 {
            r.take(1);
            match sort {
                sort::RUN => parts.runs.push(self.run(&mut r)),
                sort::STEP => parts.steps.push(self.step(&mut r)),
                sort::STARTED => parts.started.push(self.started_run(&mut r)),
                // Only ever written by `Tree`: a byte of no sort is a bug, and what follows
                // it cannot be read.
                _ => break,
            }
        }
        parts
    }

    #[cfg(test)]
    pub(super) fn runs(&self) -> Vec<RunPart<'a>> {
        self.parts().runs
    }

    #[cfg(test)]
    pub(super) fn steps(&self) -> Vec<StepPart<'a>> {
        self.parts().steps
    }

    #[cfg(test)]
    pub(super) fn started(&self) -> Vec<Started<'a>> {
        self.parts().started
    }

    /// A run's record, after its sort.
    fn run(&self, r: &mut Reader<'a>) -> RunPart<'a> {
        let h = r.take(RUN_HEAD - 1);
        let bits = le32(h, 0);
        let (start_ns, end_ns) = r.times(self.base, h, 5, bits);
        let flow = r.str_of(le32(h, 13));
        let (tokens, cost_usd, cost_unknown_calls) = r.usage(bits);
        let on = |bit: u32| bits & bit != 0;
        RunPart {
            id: if on(has::OTHER_RUN) { r.str() } else { self.root },
            flow,
            parent_run: r.str_if(on(has::PARENT_RUN)),
            parent_step: r.str_if(on(has::PARENT_STEP)),
            status: RUN_STATUSES
                .get(usize::from(byte(h, 4)))
                .map_or("", |s| s.as_str()),
            error: on(has::ERROR).then(|| (r.str(), r.str())),
            start_ns,
            end_ns,
            tokens,
            cost_usd,
            cost_unknown_calls,
            batch: r.str_if(on(has::BATCH)),
            item_id: r.str_if(on(has::ITEM)),
        }
    }

    /// A step record, after its sort.
    fn step(&self, r: &mut Reader<'a>) -> StepPart<'a> {
        let h = r.take(STEP_HEAD - 1);
        let bits = le32(h, 0);
        let on = |bit: u32| bits & bit != 0;
        let (start_ns, end_ns) = r.times(self.base, h, 9, bits);
        let attempt = if on(has::WIDE_ATTEMPT) {
            le32(r.take(4), 0)
        } else {
            u32::from(byte(h, 5))
        };
        let lengths = if on(has::LONG_NAMES) {
            let l = r.take(12);
            [le32(l, 0), le32(l, 4), le32(l, 8)]
        } else {
            [6, 7, 8].map(|at| u32::from(byte(h, at)))
        };
        let iteration = on(has::ITERATION).then(|| r.u64());
        let [number, step, kind] = lengths.map(|n| r.str_of(n));
        let (tokens, cost_usd, cost_unknown_calls) = r.usage(bits);
        let run_id = if on(has::OTHER_RUN) { r.str() } else { self.root };
        let error = on(has::ERROR).then(|| (r.str(), r.str()));
        let route = r.str_if(on(has::ROUTE));
        let mut note = (0..).map(|i| r.str_if(on(has::NOTE << i)));
        let mut next = || note.next().flatten();
        StepPart {
            run_id,
            number,
            step,
            kind,
            attempt,
            status: STEP_STATUSES
                .get(usize::from(byte(h, 4)))
                .map_or("", |s| s.as_str()),
            iteration,
            start_ns,
            end_ns,
            tokens,
            cost_usd,
            cost_unknown_calls,
            error,
            route,
            tool: next(),
            call_id: next(),
            model: next(),
            response_model: next(),
            mcp: McpNotes {
                server: next(),
                tool: next(),
                transport: next(),
                protocol: next(),
                address: next(),
                port: next(),
            },
        }
    }

    /// A run that started here, after its sort.
    fn started_run(&self, r: &mut Reader<'a>) -> Started<'a> {
        let id = if r.take(1) == [1] { r.str() } else { self.root };
        (id, (r.str(), r.str()))
    }
}

/// The little-endian number at `at` of a header (0 past its end: a short header is a bug).
fn le64(h: &[u8], at: usize) -> u64 {
    h.get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn byte(h: &[u8], at: usize) -> u8 {
    h.get(at).copied().unwrap_or(0)
}

fn le32(h: &[u8], at: usize) -> u32 {
    h.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// A string's bytes, as many as a length of four bytes counts: no string of a record comes
/// near 4 GiB, and one that did would be cut, not misread.
fn cut(s: &str) -> &[u8] {
    &s.as_bytes()[..s.len().min(u32::MAX as usize)]
}

/// A string after its length (four bytes, little-endian).
fn put_str(b: &mut Vec<u8>, s: &str) {
    let s = cut(s);
    b.extend_from_slice(&(s.len() as u32).to_le_bytes());
    b.extend_from_slice(s);
}

/// A string whose presence a header bit says: nothing when absent.
fn put_some(b: &mut Vec<u8>, s: Option<&str>) {
    if let Some(s) = s {
        put_str(b, s);
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
        le64(self.take(8), 0)
    }

    pub(super) fn bytes(&mut self) -> &'a [u8] {
        let n = le32(self.take(4), 0);
        self.take(usize::try_from(n).unwrap_or(usize::MAX))
    }

    pub(super) fn str(&mut self) -> &'a str {
        std::str::from_utf8(self.bytes()).unwrap_or("")
    }

    /// A string of `n` bytes whose length was written elsewhere (a header's).
    fn str_of(&mut self, n: u32) -> &'a str {
        let bytes = self.take(usize::try_from(n).unwrap_or(usize::MAX));
        std::str::from_utf8(bytes).unwrap_or("")
    }

    fn str_if(&mut self, on: bool) -> Option<&'a str> {
        on.then(|| self.str())
    }

    /// A record's start and end: from header `h`'s two numbers at `at` (after `base`, and the
    /// duration), or whole after the header when it has [`has::WIDE_TIMES`].
    fn times(&mut self, base: u64, h: &[u8], at: usize, bits: u32) -> (u64, Option<u64>) {
        let (start, end) = if bits & has::WIDE_TIMES != 0 {
            (self.u64(), self.u64())
        } else {
            let start = base.saturating_add(u64::from(le32(h, at)));
            (start, start.saturating_add(u64::from(le32(h, at + 4))))
        };
        (start, (bits & has::END != 0).then_some(end))
    }

    /// A record's tokens, cost and calls of unknown cost, when its header has them.
    fn usage(&mut self, bits: u32) -> ((u64, u64), f64, u64) {
        if bits & has::USAGE == 0 {
            return ((0, 0), 0.0, 0);
        }
        let (i, o) = (self.u64(), self.u64());
        ((i, o), f64::from_bits(self.u64()), self.u64())
    }
}

/// A finished tree's header: its base time, its root's length, its three counts and the
/// length of its bytes (four bytes each: [`Finished::fits`]).
const TREE_HEAD: usize = 8 + 4 + 4 * 4;
/// The room a new tree's buffer starts with.
const TREE_BYTES: usize = 1024;
/// The largest buffer a spare tree keeps.
pub(super) const SPARE_BYTES: usize = 16 * 1024;
/// The most bytes of finished trees [`Finished`] keeps room for once emptied.
pub(super) const FINISHED_BYTES: usize = 4 << 20;

/// Finished trees, each copied into one buffer as it ends, so that its own buffer is emptied
/// for the next tree at once: a header (the base time, the root's length, the record counts,
/// the bytes' length), then the tree's bytes (the root's id and the records).
#[derive(Default)]
pub(super) struct Finished {
    pub(super) bytes: Vec<u8>,
    pub(super) trees: usize,
    pub(super) records: usize,
}

impl Finished {
    /// Empty, with room for [`FINISHED_BYTES`]: the pages are only taken as trees fill them,
    /// and a queue that starts small would be copied over and over as it grows.
    pub(super) fn new() -> Finished {
        Finished {
            bytes: Vec::with_capacity(FINISHED_BYTES),
            ..Finished::default()
        }
    }

    /// Whether `tree`'s counts and length fit its header here (one that does not, past
    /// 4 GiB, is dropped rather than queued).
    pub(super) fn fits(tree: &Tree) -> bool {
        [tree.n_runs, tree.n_steps, tree.n_started, tree.bytes.len()]
            .into_iter()
            .all(|n| u32::try_from(n).is_ok())
    }

    /// Copies `tree` in; one that does not [`fit`](Self::fits) is a bug of the caller.
    pub(super) fn push(&mut self, tree: &Tree) {
        let mut h = [0u8; TREE_HEAD];
        h[0..8].copy_from_slice(&tree.base.to_le_bytes());
        h[8..12].copy_from_slice(&(tree.root_len as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(tree.n_runs as u32).to_le_bytes());
        h[16..20].copy_from_slice(&(tree.n_steps as u32).to_le_bytes());
        h[20..24].copy_from_slice(&(tree.n_started as u32).to_le_bytes());
        h[24..28].copy_from_slice(&(tree.bytes.len() as u32).to_le_bytes());
        let b = &mut self.bytes;
        b.reserve(TREE_HEAD + tree.bytes.len());
        b.extend_from_slice(&h);
        b.extend_from_slice(&tree.bytes);
        self.trees += 1;
        self.records += tree.records();
    }

    pub(super) fn views(&self) -> impl Iterator<Item = TreeView<'_>> {
        let mut r = Reader(&self.bytes);
        (0..self.trees).map(move |_| {
            let h = r.take(TREE_HEAD);
            let n = |at: usize| usize::try_from(le32(h, at)).unwrap_or(usize::MAX);
            let mut bytes = Reader(r.take(n(24)));
            TreeView {
                base: le64(h, 0),
                root: bytes.str_of(le32(h, 8)),
                records: bytes.0,
                n_runs: n(12),
                n_steps: n(16),
                n_started: n(20),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{ErrorKind, StepError, Usage, cost::Cost};

    fn run(id: &str, parent: Option<&str>) -> RunRecord {
        RunRecord {
            id: id.into(),
            flow: "f".into(),
            flow_hash: "h".into(),
            parent_run: parent.map(Into::into),
            parent_step: parent.map(|_| "2[1]".into()),
            depth: 0,
            status: RunStatus::Failed,
            input: serde_json::Value::Null,
            output: None,
            error: Some(StepError::new(ErrorKind::Agent, "bad ünïcode")),
            started_at: 10,
            finished_at: Some(20),
            started_ns: None,
            finished_ns: None,
            usage: Usage {
                input_tokens: 3,
                output_tokens: 4,
                cost_usd: Cost::from_nanos(250_000_000),
                cost_unknown_calls: 1,
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
        }
    }

    /// Record `1.2` (attempt 2, iteration 7) of run `run_id`, with a route and a tool call's notes.
    fn step(run_id: &str) -> StepRecord {
        StepRecord {
            run_id: run_id.into(),
            step: "s".into(),
            started_at: 11,
            started_ns: Some(11_000_123),
            route: Some("next".into()),
            answers: Some(serde_json::json!({"tool": "lookup", "call_id": "call_1", "told": "x"})),
            ..crate::store::tests::step("1.2", 2, Some(7), StepStatus::Succeeded)
        }
    }

    #[test]
    fn records_read_back_from_a_tree_as_written() {
        let mut tree = Tree::new("r1", 0);
        // A record of the root run (its id not written) and of a child run (written).
        tree.push_step(&step("r1"));
        tree.push_run(&run("r2", Some("r1")));
        tree.push_step(&step("r2"));
        let mut plain = step("r1");
        plain.iteration = None;
        plain.route = None;
        plain.answers = None;
        plain.finished_at = Some(12);
        plain.finished_ns = Some(12_000_007);
        plain.error = Some(StepError::new(ErrorKind::Timeout, "late"));
        plain.usage.output_tokens = 9;
        plain.answers = Some(serde_json::json!({"mcp": {"server": "files", "port": "8080"}}));
        tree.push_step(&plain);
        tree.push_started(&run("r1", None));
        tree.push_started(&run("r2", Some("r1")));
        let mut finished = Finished::default();
        finished.push(&tree);
        finished.push(&tree);
        let views: Vec<TreeView<'_>> = finished.views().collect();
        assert_eq!(views.len(), 2);
        for view in [views[1], tree.view()] {
            let runs = view.runs();
            assert_eq!(runs.len(), 1);
            let r = runs[0];
            assert_eq!(
                (r.id, r.flow, r.parent_run, r.parent_step, r.status),
                ("r2", "f", Some("r1"), Some("2[1]"), "failed")
            );
            assert_eq!(r.error, Some(("agent", "bad ünïcode")));
            assert_eq!(
                (r.start_ns, r.end_ns, r.tokens, r.cost_usd, r.cost_unknown_calls),
                (10_000_000, Some(20_000_000), (3, 4), 0.25, 1)
            );
            assert_eq!((r.batch, r.item_id), (Some("b"), None));
            let steps = view.steps();
            assert_eq!(steps.len(), 3);
            for (s, run_id) in steps[..2].iter().zip(["r1", "r2"]) {
                assert_eq!(
                    (s.run_id, s.number, s.step, s.kind, s.attempt),
                    (run_id, "1.2", "s", "agent", 2)
                );
                assert_eq!(
                    (s.status, s.iteration, s.start_ns, s.end_ns),
                    ("succeeded", Some(7), 11_000_123, None)
                );
                assert_eq!(
                    (s.error, s.route, s.tokens, s.cost_usd),
                    (None, Some("next"), (0, 0), 0.0)
                );
                assert_eq!(
                    (s.tool, s.call_id, s.model, s.response_model),
                    (Some("lookup"), Some("call_1"), None, None)
                );
                assert_eq!(s.mcp.server, None);
            }
            let p = steps[2];
            assert_eq!(
                (p.run_id, p.iteration, p.route, p.end_ns, p.tokens),
                ("r1", None, None, Some(12_000_007), (0, 9))
            );
            assert_eq!(p.error, Some(("timeout", "late")));
            assert_eq!((p.tool, p.call_id), (None, None));
            assert_eq!(
                (p.mcp.server, p.mcp.tool, p.mcp.transport, p.mcp.port),
                (Some("files"), None, None, Some("8080"))
            );
            assert_eq!(view.started(), [("r1", ("", "f")), ("r2", ("2[1]", "f"))]);
        }
    }

    #[test]
    fn numbers_too_wide_for_a_header_follow_it_whole() {
        let base = 5_000_000_000;
        let mut tree = Tree::new("r1", base);
        let long = "7.".repeat(200) + "1";
        let mut wide = step("r1");
        // Before the base, and ending five seconds later; attempt and number past a byte.
        wide.started_at = 4_000;
        wide.started_ns = Some(4_000_000_001);
        wide.finished_at = Some(9_000);
        wide.finished_ns = Some(9_000_000_002);
        wide.attempt = 300;
        wide.number = long.clone();
        let mut narrow = step("r1");
        narrow.started_at = 5_001;
        narrow.started_ns = Some(5_001_000_003);
        narrow.finished_at = Some(5_002);
        narrow.finished_ns = Some(5_002_000_004);
        tree.push_step(&wide);
        tree.push_step(&narrow);
        let mut late = run("r1", None);
        late.started_at = 5_000;
        late.started_ns = Some(5_000_000_000);
        late.finished_at = Some(60_000);
        late.finished_ns = None;
        tree.push_run(&late);
        let mut finished = Finished::default();
        assert!(Finished::fits(&tree));
        finished.push(&tree);
        let views: Vec<TreeView<'_>> = finished.views().collect();
        for view in [views[0], tree.view()] {
            let steps = view.steps();
            let got: Vec<_> = steps
                .iter()
                .map(|s| (s.number, s.attempt, s.iteration, s.start_ns, s.end_ns, s.route))
                .collect();
            assert_eq!(
                got,
                [
                    (
                        long.as_str(),
                        300,
                        Some(7),
                        4_000_000_001,
                        Some(9_000_000_002),
                        Some("next")
                    ),
                    (
                        "1.2",
                        2,
                        Some(7),
                        5_001_000_003,
                        Some(5_002_000_004),
                        Some("next")
                    ),
                ]
            );
            let r = view.runs()[0];
            assert_eq!(
                (r.start_ns, r.end_ns, r.flow),
                (5_000_000_000, Some(60_000_000_000), "f")
            );
        }
    }

    #[test]
    fn every_status_reads_back_as_written() {
        let mut tree = Tree::new("", 0);
        for status in STEP_STATUSES {
            let mut s = step("r");
            s.status = status;
            tree.push_step(&s);
        }
        for status in RUN_STATUSES {
            let mut r = run("r", None);
            r.status = status;
            tree.push_run(&r);
        }
        let view = tree.view();
        let steps: Vec<&str> = view.steps().iter().map(|s| s.status).collect();
        let runs: Vec<&str> = view.runs().iter().map(|r| r.status).collect();
        assert_eq!(steps, STEP_STATUSES.map(StepStatus::as_str));
        assert_eq!(runs, RUN_STATUSES.map(RunStatus::as_str));
        for (i, s) in STEP_STATUSES.into_iter().enumerate() {
            assert_eq!(usize::from(step_status_code(s)), i);
        }
        for (i, s) in RUN_STATUSES.into_iter().enumerate() {
            assert_eq!(usize::from(run_status_code(s)), i);
        }
    }

    #[test]
    fn numbers_and_strings_read_back_and_a_short_buffer_reads_as_empty() {
        let values = [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX];
        let mut b = Vec::new();
        for v in values {
            b.extend_from_slice(&v.to_le_bytes());
        }
        put_str(&mut b, "ü");
        let mut r = Reader(&b);
        for v in values {
            assert_eq!(r.u64(), v);
        }
        assert_eq!((r.str(), r.u64(), r.str()), ("ü", 0, ""));
        // A header cut short reads as zeros, never past its end.
        assert_eq!((le64(&[1, 2], 0), le32(&[7; 6], 4)), (0, 0));
    }
}
