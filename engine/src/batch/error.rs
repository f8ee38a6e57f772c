//! Why a batch could not run at all.

/// Why a batch could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("cannot read {path}: {message}")]
    Input { path: String, message: String },
    #[error("cannot write {path}: {message}")]
    Output { path: String, message: String },
    #[error("{path}: duplicate ids: {list}")]
    Duplicates { path: String, list: String },
    #[error(
        "{path} line {line}: the batch's run for this line was of id `{recorded}`, now the line's id is `{now}`: \
         the input changed since the batch started (or --id-field is not the batch's). Use another --output \
         (a new batch) or restore the input"
    )]
    InputChanged {
        path: String,
        line: u64,
        recorded: String,
        now: String,
    },
    #[error(
        "{path} line {line}: item `{id}` is not the input its recorded run `{run}` started from: the input \
         changed since the batch started. Use another --output (a new batch), restore the input, or \
         --retry-failed if only failed items changed"
    )]
    InputContentChanged {
        path: String,
        line: u64,
        id: String,
        run: String,
    },
    #[error("{path} line {line}: the id field `{field}` is {what}: an id is a string or a number")]
    BadId {
        path: String,
        line: u64,
        field: String,
        what: &'static str,
    },
    #[error(
        "{path}: no line has the id field `{field}` (--id-field; a dotted path such as `ticket.id` \
         names a nested field)"
    )]
    NoIdField { path: String, field: String },
    #[error("{path} is both the input and the output: writing the output would erase the input")]
    SameFile { path: String },
    #[error(
        "{count} unfinished run(s) of this batch started from another version of the flow `{flow}` \
         (first: `{first}`): pass --allow-changed to resume them with this one"
    )]
    FlowChanged {
        count: usize,
        flow: String,
        first: String,
    },
    #[error(
        "{count} unfinished run(s) of this batch started under other agent changes than this command's \
         --agent-change (first: `{first}`): give the --agent-change the batch started with, or pass \
         --allow-changed to resume them anyway"
    )]
    OtherAgentChanges { count: usize, first: String },
    #[error("--files: {0}")]
    Files(#[from] crate::files::out::WriteError),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error(
        "the store holds no runs of the batch writing {path}: nothing to export (is it the batch's `--store`?)"
    )]
    NothingToExport { path: String },
    #[error(
        "{path} is in use by another switchyard process right now (a `batch` writing it, or a `resume` or \
         `runs cancel` of one of its runs): one process per batch"
    )]
    Busy {
        path: String,
        /// The process holding it, when this host tells it.
        holder: Option<u32>,
    },
}
