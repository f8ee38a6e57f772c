//! The batch's loop: lines read and their items started while there is room (fewer runs
//! working than `--concurrency`, a free place in the reorder buffer), the lines at the front
//! written as they fill, finished items placed, and the output flushed only before the loop
//! would wait. It stops early at Ctrl-C, at the cost limit, when the store fails, and, for an
//! export, at the first item that has not finished.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};

use super::decide::{Action, Earlier, decide};
use super::error::BatchError;
use super::input::{Line, Lines};
use super::items::{Done, Items, Task, count};
use super::options::BatchOptions;
use super::output::{Output, failed_line};
use super::reorder::{Reorder, Slot};
use crate::plan::FlowPlan;
use crate::record::{ErrorKind, StepError};
use crate::store::Store;

/// Where the loop ended, for the summary.
pub(super) struct Ended {
    /// Lines read (each took a place).
    pub(super) read: u64,
    /// The input was read to its end.
    pub(super) input_done: bool,
    /// Why it stopped early; empty when the cost limit stopped it, said once the runs in
    /// flight have added their cost.
    pub(super) stopped: Option<String>,
    /// An unfinished item reached the front: nothing after it was written.
    pub(super) blocked: bool,
    pub(super) store_failed: bool,
    /// The budget it stopped at.
    pub(super) cost_limit: Option<f64>,
}

/// The loop's state.
pub(super) struct Driver<'o, S: Store> {
    options: &'o BatchOptions,
    root: Arc<FlowPlan>,
    items: Items<S>,
    lines: Lines,
    earlier: Earlier,
    reorder: Reorder,
    in_flight: FuturesUnordered<Task>,
    out: Output,
    /// `--files DIR`: each written line's files, under its item's directory.
    files: Option<crate::files::out::ItemFiles>,
    /// Lines written whose files are still to be written.
    files_due: Vec<String>,
    concurrency: usize,
    input_done: bool,
    stopped: Option<String>,
    store_failed: bool,
    cost_limit: Option<f64>,
}

impl<'o, S: Store> Driver<'o, S> {
    /// The loop before its first line: the input opened, nothing read.
    pub(super) fn new(options: &'o BatchOptions, items: Items<S>, out: Output) -> Result<Self, BatchError> {
        let lines = Lines::open(&options.input, &options.id_field)?;
        let concurrency = options.concurrency.max(1);
        let files = options
            .files_dir
            .clone()
            .map(|d| crate::files::out::ItemFiles::new(d, items.engine.store.blobs()));
        Ok(Driver {
            options,
            root: items.plan.root().clone(),
            earlier: Earlier::with_fresh(items.batch.clone(), options.fresh_store),
            items,
            lines,
            // The reorder buffer: lines in input order, written from the front as they fill.
            reorder: Reorder::new((concurrency * 4).max(1024)),
            in_flight: FuturesUnordered::new(),
            files,
            files_due: Vec::new(),
            out,
            concurrency,
            input_done: false,
            stopped: None,
            store_failed: false,
            cost_limit: None,
        })
    }

    /// Runs the loop until every line is written, or it stopped early and the runs in flight
    /// have finished.
    pub(super) async fn drive(&mut self) -> Result<(), BatchError> {
        loop {
            self.start_items().await?;
            let mut due = self.files.is_some().then_some(&mut self.files_due);
            self.reorder.write_ready(|text| {
                if let Some(due) = due.as_deref_mut() {
                    due.push(text.to_string());
                }
                self.out.write_line(text)
            })?;
            self.write_files().await?;
            if self.in_flight.is_empty() {
                if self.input_done || self.stopped.is_some() || self.reorder.blocked() {
                    return Ok(());
                }
                continue;
            }
            if let Some((seq, done)) = self.next_done().await? {
                self.place(seq, done);
            }
        }
    }

    /// Writes the files of the lines just written (`--files DIR`), in input order.
    async fn write_files(&mut self) -> Result<(), BatchError> {
        let Some(files) = &mut self.files else {
            return Ok(());
        };
        for text in self.files_due.drain(..) {
            let (id, list) = super::output::line_files(&text);
            files.write(&id, &list).await?;
        }
        Ok(())
    }

    /// Reads lines and starts (or settles) their items while there is room.
    async fn start_items(&mut self) -> Result<(), BatchError> {
        while !self.input_done
            && self.stopped.is_none()
            && self.items.working.count() < self.concurrency
            && self.reorder.has_room()
        {
            if self.items.controls.pause.is_cancelled() {
                self.stopped = Some("interrupted (Ctrl-C)".to_string());
                break;
            }
            let Some(line) = self.lines.next_line()? else {
                self.input_done = true;
                break;
            };
            self.start_item(line).await?;
        }
        Ok(())
    }

    /// Gives `line` its place and does what [`decide`] says: its line written from the store
    /// or failed, or its run started or resumed; or, when that run would spend past the budget
    /// or an export reaches it, stops the batch here.
    async fn start_item(&mut self, mut line: Line) -> Result<(), BatchError> {
        let seq = self.reorder.push();
        let previous = self.earlier.latest(&*self.items.engine.store, line.index).await?;
        let answered = match &previous {
            Some(p) if p.status == crate::record::RunStatus::Interrupted => {
                self.earlier.answered(&*self.items.engine.store, &p.id).await?
            }
            _ => false,
        };
        let action = decide(&mut line, previous, self.options, &self.root, answered)?;
        let runs = matches!(action, Action::Start(_) | Action::Resume(_));
        // The budget stops only what would spend: items written from the store still are.
        if let Some(cap) = &self.items.cap
            && runs
            && !self.options.export_only
            && cap.allows(&cap.spent()).is_err()
        {
            let max = cap.limit;
            self.reorder.set(seq, Slot::Unfinished);
            // Said once the runs in flight have finished (and added their cost): the
            // batch's total, the summary's.
            self.cost_limit = Some(max);
            self.stopped = Some(String::new());
            return Ok(());
        }
        if self.options.export_only && runs {
            // Nothing runs: the output ends before the first item that is not finished.
            self.reorder.set(seq, Slot::Unfinished);
            self.stopped = Some(format!(
                "item `{}` (line {}) has not finished; the `batch` command continues the batch",
                line.id,
                line.index + 1
            ));
            return Ok(());
        }
        let progress = &self.items.progress;
        match action {
            Action::Write(status, text, usage) => {
                count(progress, status);
                // The batch's cost is all of it, earlier starts included: the summary says
                // so, and `--max-cost-usd` bounds the batch, not one start of it.
                progress.add_cost(&usage);
                if let Some(cap) = &self.items.cap {
                    cap.add(&usage);
                }
                progress.reused.fetch_add(1, Ordering::Relaxed);
                self.reorder.set(seq, Slot::Line(text));
            }
            Action::Fail(message) => {
                progress.failed.fetch_add(1, Ordering::Relaxed);
                let e = StepError::new(ErrorKind::Mapping, message);
                let text = failed_line(&line.id_value, &e, 0);
                self.reorder.set(seq, Slot::Line(text));
            }
            Action::Start(input) => self.in_flight.push(self.items.start(seq, line, input)),
            Action::Resume(run_id) => self.in_flight.push(self.items.resume(seq, line, run_id)),
        }
        Ok(())
    }

    /// The next finished item and its place; `None` when there is none to place yet, but a
    /// run let go of its place (the next item may start) or the task set was empty.
    async fn next_done(&mut self) -> Result<Option<(u64, Done)>, BatchError> {
        // Completions that are ready are taken without waiting; the output is flushed only
        // before the batch would wait.
        let joined = match self.in_flight.next().now_or_never() {
            Some(j) => j,
            None => {
                self.out.flush()?;
                let room = !self.input_done && self.stopped.is_none() && self.reorder.has_room();
                tokio::select! {
                    j = self.in_flight.next() => j,
                    // A run let go of its place: start the next item.
                    _ = self.items.working.freed.notified(), if room => return Ok(None),
                }
            }
        };
        let Some(joined) = joined else {
            return Ok(None);
        };
        let done = joined.map_err(|e| self.out.error(format!("an item's task failed: {e}")))?;
        Ok(Some(done))
    }

    /// Fills a finished item's place. A store that failed is not the item's failure: what
    /// happened is not all on record, so the batch stops, leaving the run to resume once the
    /// store works again.
    fn place(&mut self, seq: u64, done: Done) {
        let slot = match done {
            Done::Line(text) => Slot::Line(text),
            Done::Unfinished => Slot::Unfinished,
            Done::StoreFailed(why) => {
                if !self.store_failed {
                    self.store_failed = true;
                    self.stopped = Some(format!(
                        "the store failed: {why}. Items from here on are not written; \
                         once the store works again, the same command continues"
                    ));
                    self.items.controls.pause.cancel();
                }
                Slot::Unfinished
            }
        };
        self.reorder.set(seq, slot);
    }

    /// Ends the loop: the output flushed (and synced to disk with `sync_output`), and where
    /// the loop ended.
    pub(super) fn finish(self) -> Result<Ended, BatchError> {
        self.out.close(self.options.sync_output)?;
        Ok(Ended {
            read: self.reorder.placed(),
            input_done: self.input_done,
            stopped: self.stopped,
            blocked: self.reorder.blocked(),
            store_failed: self.store_failed,
            cost_limit: self.cost_limit,
        })
    }
}
