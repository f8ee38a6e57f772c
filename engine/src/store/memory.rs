//! The memory store: records live in the process and die with it (`--store memory`).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::{RunFilter, Store, StoreError, Writer};
use crate::record::{RunRecord, RunStatus, StepRecord};

/// Runs are spread over this many independently locked shards (by a hash of the run id), so
/// concurrent runs on different worker threads seldom wait for each other.
const SHARDS: usize = 16;

#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    /// Start order across shards: reads list runs in it.
    next_seq: AtomicU64,
    /// Drop the records of runs that ended, and keep no steps (a batch on `--store memory`
    /// reads none back, and its memory must not grow with its input).
    forget_ended: bool,
    /// The writer of each run a `run` or `resume` of this process advances: the store lives
    /// in one process, so its holders need no lease.
    writers: Mutex<HashMap<String, Writer>>,
    /// The bytes of files (SPEC §6.5).
    blobs: Arc<super::blobs::MemoryBlobs>,
    inbox: Arc<super::inbox::MemoryInbox>,
}

#[derive(Default, Debug)]
struct Shard {
    runs: HashMap<String, Stored>,
    /// Boxed: a long run's list grows by reallocation, which then moves pointers, not whole
    /// records (a `foreach` over 20,000 items keeps 20,001; measured, W3's cost per item then
    /// stays flat as N doubles).
    #[allow(clippy::vec_box)]
    steps: HashMap<String, Vec<Box<KeptStep>>>,
}

/// A step record as kept: its values (input, result, the values of its payload changes) as
/// compact JSON text, like a run's input and output. A value tree costs ten to twenty times
/// its text, and a loop's iterations each keep theirs: a `while` that appends to a list keeps
/// a list as long as the loop has run in every iteration's input, result and change.
#[derive(Debug)]
struct KeptStep {
    /// `input` and `result` are `None` and `changes` empty here: see the fields below.
    rec: StepRecord,
    input: Option<Kept>,
    result: Option<Kept>,
    /// Each change's path and value.
    changes: Vec<(String, Kept)>,
}

impl KeptStep {
    fn new(mut rec: StepRecord) -> KeptStep {
        let input = rec.input.take().map(|v| Kept::of(Arc::new(v)));
        let result = rec.result.take().map(Kept::of);
        let changes = std::mem::take(&mut rec.changes)
            .into_iter()
            .map(|c| (c.path, Kept::of(c.value)))
            .collect();
        KeptStep {
            rec,
            input,
            result,
            changes,
        }
    }

    /// The record as it was given.
    fn record(&self) -> StepRecord {
        StepRecord {
            input: self.input.as_ref().map(|k| Arc::unwrap_or_clone(k.value())),
            result: self.result.as_ref().map(Kept::value),
            changes: self
                .changes
                .iter()
                .map(|(path, k)| crate::record::Change {
                    path: path.clone(),
                    value: k.value(),
                })
                .collect(),
            ..self.rec.clone()
        }
    }
}

/// A value of a kept step, as compact JSON text; `Deep` when it nests deeper than serde_json
/// reads back on an ordinary stack (its depth said).
#[derive(Debug)]
enum Kept {
    Text(Box<str>),
    Deep(Box<str>, usize),
}

/// The nesting up to which a kept value is read back on the calling thread.
const SHALLOW: usize = 100;

impl Kept {
    fn of(v: Arc<Value>) -> Kept {
        let t = text(&v);
        match nesting(&t) {
            n if n <= SHALLOW => Kept::Text(t),
            n => Kept::Deep(t, n),
        }
    }

    fn value(&self) -> Arc<Value> {
        match self {
            Kept::Text(t) => Arc::new(value(t)),
            Kept::Deep(t, depth) => Arc::new(deep_value(t, *depth)),
        }
    }
}

/// [`value`] of a text nested `depth` deep: without serde_json's recursion limit, on a thread
/// whose stack fits the recursion.
fn deep_value(text: &str, depth: usize) -> Value {
    use serde::Deserialize as _;
    let stack = (8 << 20).max((depth + 64) * (16 << 10));
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(stack)
            .spawn_scoped(s, || {
                let mut de = serde_json::Deserializer::from_str(text);
                de.disable_recursion_limit();
                Value::deserialize(&mut de).expect("the memory store's own JSON parses")
            })
            .expect("a thread to read a deep value on")
            .join()
            .expect("reading a value the store wrote does not panic")
    })
}

/// The deepest nesting of arrays and objects in a JSON text.
fn nesting(text: &str) -> usize {
    let (mut depth, mut most, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                most = most.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    most
}

/// A run as kept: the record without its input and output, which are kept as compact JSON
/// text. Making the text costs a tenth of copying the value tree (one allocation, not one per
/// object, string and array), takes a fraction of its memory, and a run's payload is read back
/// far less often than it is written (`runs show`, `resume`).
#[derive(Debug)]
struct Stored {
    seq: u64,
    /// `input` is `null` and `output` `None` here: see `input` and `output`.
    run: RunRecord,
    input: Box<str>,
    output: Option<Box<str>>,
}

impl Stored {
    fn new(seq: u64, run: &RunRecord) -> Stored {
        let RunRecord {
            id,
            flow,
            flow_hash,
            parent_run,
            parent_step,
            depth,
            status,
            input,
            output,
            error,
            started_at,
            finished_at,
            started_ns,
            finished_ns,
            usage,
            steps,
            flow_path,
            context,
            messages,
            batch,
            item_id,
            item_index,
            now_us,
            agent_changes,
            origin,
            files,
        } = run;
        Stored {
            seq,
            run: RunRecord {
                id: id.clone(),
                flow: flow.clone(),
                flow_hash: flow_hash.clone(),
                parent_run: parent_run.clone(),
                parent_step: parent_step.clone(),
                depth: *depth,
                status: *status,
                input: Value::Null,
                output: None,
                error: error.clone(),
                started_at: *started_at,
                finished_at: *finished_at,
                started_ns: *started_ns,
                finished_ns: *finished_ns,
                usage: *usage,
                steps: *steps,
                flow_path: flow_path.clone(),
                context: context.clone(),
                messages: messages.clone(),
                batch: batch.clone(),
                item_id: item_id.clone(),
                item_index: *item_index,
                now_us: *now_us,
                agent_changes: agent_changes.clone(),
                origin: *origin,
                files: files.clone(),
            },
            input: text(input),
            output: output.as_ref().map(text),
        }
    }

    /// The record as it was given.
    fn record(&self) -> RunRecord {
        RunRecord {
            input: value(&self.input),
            output: self.output.as_deref().map(value),
            ..self.run.clone()
        }
    }
}

fn text(v: &Value) -> Box<str> {
    // A `Value` always serializes: its map keys are strings.
    serde_json::to_string(v)
        .expect("a JSON value serializes")
        .into_boxed_str()
}

fn value(text: &str) -> Value {
    // Text this store made from a `Value`, which parses back to the same value.
    serde_json::from_str(text).expect("the memory store's own JSON parses")
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            next_seq: AtomicU64::new(0),
            forget_ended: false,
            writers: Mutex::default(),
            blobs: Default::default(),
            inbox: Default::default(),
        }
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store that keeps the record of a run only once it stops without ending (interrupted,
    /// or paused by Ctrl-C), drops it if it then ends (succeeded, failed or cancelled), and
    /// keeps no step records at all: for a batch on `--store memory`, which reads back only
    /// such runs, within the process, and never a run while it runs.
    pub fn forgetting_ended() -> Self {
        MemoryStore {
            forget_ended: true,
            ..Self::default()
        }
    }

    fn shard(&self, run_id: &str) -> std::sync::MutexGuard<'_, Shard> {
        let i = self.hasher.hash_one(run_id) as usize % SHARDS;
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The runs `keep` selects, copied, in start order.
    fn collect(&self, keep: impl Fn(&RunRecord) -> bool) -> Vec<RunRecord> {
        let mut found: Vec<(u64, RunRecord)> = Vec::new();
        for shard in &self.shards {
            let g = shard.lock().unwrap_or_else(|e| e.into_inner());
            found.extend(
                g.runs
                    .values()
                    .filter(|s| keep(&s.run))
                    .map(|s| (s.seq, s.record())),
            );
        }
        found.sort_unstable_by_key(|(seq, _)| *seq);
        found.into_iter().map(|(_, r)| r).collect()
    }
}

impl MemoryStore {
    /// Keeps `run`'s record, replacing the one kept before (which keeps its place in order).
    fn create_kept(&self, run: &RunRecord) {
        // Made before the lock is taken; a replaced record is dropped after it is let go.
        let mut stored = Stored::new(self.next_seq.fetch_add(1, Ordering::Relaxed), run);
        let mut g = self.shard(&run.id);
        let replaced = match g.runs.get_mut(&run.id) {
            // Created again (a resumed run): it keeps its place in start order.
            Some(s) => {
                stored.seq = s.seq;
                Some(std::mem::replace(s, stored))
            }
            None => g.runs.insert(run.id.clone(), stored),
        };
        drop(g);
        drop(replaced);
    }
}

impl Store for MemoryStore {
    fn blobs(&self) -> Arc<dyn super::blobs::Blobs> {
        self.blobs.clone()
    }

    fn inbox(&self) -> Arc<dyn super::inbox::Inbox> {
        self.inbox.clone()
    }

    fn keeps_steps(&self) -> bool {
        !self.forget_ended
    }

    async fn create_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        if self.forget_ended {
            // Kept only if it stops without ending (`update_run`): nothing in the process reads
            // a batch's runs while they run.
            return Ok(());
        }
        self.create_kept(run);
        Ok(())
    }

    async fn update_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        let ended = matches!(
            run.status,
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled
        );
        if self.forget_ended {
            if ended {
                // Dropped once the lock is let go (kept if it had stopped before, and resumed).
                let mut g = self.shard(&run.id);
                let forgotten = g.runs.remove(&run.id);
                drop(g);
                drop(forgotten);
            } else {
                // Interrupted, or paused: kept from here on, in the order runs stop.
                self.create_kept(run);
            }
            return Ok(());
        }
        // Made before the lock is taken; the record replaced is dropped after it is let go.
        let mut stored = Stored::new(0, run);
        let mut g = self.shard(&run.id);
        let Some(s) = g.runs.get_mut(&run.id) else {
            return Err(StoreError::NotFound(run.id.clone()));
        };
        stored.seq = s.seq;
        let replaced = std::mem::replace(s, stored);
        drop(g);
        drop(replaced);
        Ok(())
    }

    async fn record_step(&self, step: StepRecord) -> Result<(), StoreError> {
        if self.forget_ended {
            // Step records serve `runs show` and resuming, and neither can reach a batch's
            // throwaway store: a run's steps would only be kept to be dropped at its end.
            return Ok(());
        }
        let mut g = self.shard(&step.run_id);
        // The run's list exists after its first step: no key allocated then.
        let steps = match g.steps.get_mut(&step.run_id) {
            Some(s) => s,
            None => g.steps.entry(step.run_id.clone()).or_default(),
        };
        // Replace the record of the same (number, attempt, iteration) — an attempt's
        // "started" record is superseded by its outcome.
        let replaced = match steps.iter_mut().rev().take(8).find(|s| {
            s.rec.number == step.number && s.rec.attempt == step.attempt && s.rec.iteration == step.iteration
        }) {
            Some(last) => Some(std::mem::replace(last, Box::new(KeptStep::new(step)))),
            None => {
                steps.push(Box::new(KeptStep::new(step)));
                None
            }
        };
        drop(g);
        drop(replaced);
        Ok(())
    }

    async fn get_run(&self, id: &str) -> Result<RunRecord, StoreError> {
        self.shard(id)
            .runs
            .get(id)
            .map(Stored::record)
            .ok_or_else(|| StoreError::NotFound(id.to_string()))
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let mut out = self.collect(|r| {
            filter.status.is_none_or(|s| r.status == s)
                && filter.flow.as_ref().is_none_or(|f| &r.flow == f)
                && !(filter.roots_only && r.parent_run.is_some())
                && (filter.batches.is_empty() || r.batch.as_ref().is_some_and(|b| filter.batches.contains(b)))
        });
        // Newest first.
        out.reverse();
        if let Some(l) = filter.limit {
            out.truncate(l);
        }
        Ok(out)
    }

    async fn unfinished_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let mut out = self
            .collect(|r| r.status == RunStatus::Running && filter.flow.as_ref().is_none_or(|f| &r.flow == f));
        if let Some(l) = filter.limit {
            out.truncate(l);
        }
        Ok(out)
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let g = self.shard(run_id);
        Ok(g.steps
            .get(run_id)
            .map(|kept| kept.iter().map(|s| s.record()).collect())
            .unwrap_or_default())
    }

    async fn children(&self, run_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        Ok(self.collect(|r| r.parent_run.as_deref() == Some(run_id)))
    }

    async fn batch_runs(&self, batch: &str, from: u64, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        // Start order, so a stable sort by item index keeps an item's runs in it.
        let mut out =
            self.collect(|r| r.batch.as_deref() == Some(batch) && r.item_index.is_some_and(|i| i >= from));
        out.sort_by_key(|r| r.item_index);
        out.truncate(limit);
        Ok(out)
    }

    async fn take_run(
        &self,
        run_id: &str,
        writer: &Writer,
        _lease: std::time::Duration,
    ) -> Result<(), StoreError> {
        let mut writers = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        match writers.get(run_id) {
            Some(w) if w.token != writer.token && !w.is_gone() => Err(StoreError::Held {
                run: run_id.to_string(),
                pid: w.pid,
                host: w.host.clone(),
            }),
            _ => {
                writers.insert(run_id.to_string(), writer.clone());
                Ok(())
            }
        }
    }

    async fn renew_run(
        &self,
        run_id: &str,
        writer: &Writer,
        _lease: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let writers = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        Ok(writers.get(run_id).is_some_and(|w| w.token == writer.token))
    }

    async fn give_back_run(&self, run_id: &str, writer: &Writer) -> Result<(), StoreError> {
        let mut writers = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        if writers.get(run_id).is_some_and(|w| w.token == writer.token) {
            writers.remove(run_id);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::StepStatus;
    use crate::store::tests::run;

    fn step(run_id: &str) -> StepRecord {
        StepRecord {
            run_id: run_id.into(),
            ..crate::store::tests::step("1", 1, None, StepStatus::Succeeded)
        }
    }

    #[tokio::test]
    async fn a_forgetting_store_drops_runs_that_ended_and_keeps_the_others() {
        let store = MemoryStore::forgetting_ended();
        for i in 0..3000 {
            let id = format!("r{i}");
            store.create_run(&run(&id, RunStatus::Running)).await.unwrap();
            let status = match i % 3 {
                0 => RunStatus::Succeeded,
                1 => RunStatus::Failed,
                _ => RunStatus::Interrupted,
            };
            store.update_run(&run(&id, status)).await.unwrap();
        }
        let kept = store.list_runs(&RunFilter::default()).await.unwrap();
        assert_eq!(kept.len(), 1000);
        assert!(kept.iter().all(|r| r.status == RunStatus::Interrupted));
        assert!(matches!(store.get_run("r0").await, Err(StoreError::NotFound(_))));
        // Nothing of forgotten runs stays behind.
        let left: usize = store
            .shards
            .iter()
            .map(|s| {
                let g = s.lock().unwrap();
                g.runs.len() + g.steps.len()
            })
            .sum();
        assert_eq!(left, 1000);
        // A run that runs is not kept; one paused is, until it ends; one interrupted and
        // resumed to its end is dropped too.
        store.create_run(&run("p", RunStatus::Running)).await.unwrap();
        assert!(matches!(store.get_run("p").await, Err(StoreError::NotFound(_))));
        store.update_run(&run("p", RunStatus::Running)).await.unwrap();
        assert_eq!(store.get_run("p").await.unwrap().status, RunStatus::Running);
        for id in ["p", "r2"] {
            store.update_run(&run(id, RunStatus::Succeeded)).await.unwrap();
            assert!(matches!(store.get_run(id).await, Err(StoreError::NotFound(_))));
        }
        assert_eq!(store.list_runs(&RunFilter::default()).await.unwrap().len(), 999);
        // It keeps no steps; the plain memory store keeps everything.
        let keeping = MemoryStore::new();
        for s in [&store, &keeping] {
            s.create_run(&run("a", RunStatus::Running)).await.unwrap();
            s.record_step(step("a")).await.unwrap();
        }
        assert!(store.steps("a").await.unwrap().is_empty());
        assert_eq!(keeping.steps("a").await.unwrap().len(), 1);
        keeping.update_run(&run("a", RunStatus::Succeeded)).await.unwrap();
        assert_eq!(keeping.get_run("a").await.unwrap().status, RunStatus::Succeeded);
    }

    /// Values kept as text come back as they were, however deep.
    #[tokio::test]
    async fn step_values_come_back_as_written_however_deep() {
        let store = MemoryStore::new();
        let mut deep = serde_json::json!(1);
        for _ in 0..300 {
            deep = serde_json::json!({"inner": deep});
        }
        let shallow = serde_json::json!({"a": [1, 2.5, "x\"y", null], "b": {"c": true}});
        let mut rec = step("r");
        rec.input = Some(shallow.clone());
        rec.result = Some(Arc::new(deep.clone()));
        rec.changes = vec![crate::record::Change {
            path: "$.v".into(),
            value: Arc::new(deep.clone()),
        }];
        store.record_step(rec).await.unwrap();
        let back = store.steps("r").await.unwrap();
        assert_eq!(back[0].input.as_ref(), Some(&shallow));
        assert_eq!(back[0].result.as_deref(), Some(&deep));
        assert_eq!(back[0].changes[0].path, "$.v");
        assert_eq!(*back[0].changes[0].value, deep);
        assert_eq!(nesting(r#"{"a": "[[[{", "b": [[1]]}"#), 3);
    }
}
