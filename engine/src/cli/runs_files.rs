//! `switchyard runs files RUN_ID [--output DIR]` and `switchyard runs prune`: a run's files
//! listed or written out, and stored bytes no record refers to removed (SPEC §6.5).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use super::common::{StoreArg, Use, fail, with_store};
use crate::record::files::{RunFile, sort_run_files};
use crate::record::{RunRecord, RunStatus};
use crate::store::Store;

#[derive(clap::Args, Debug)]
#[command(after_help = "switchyard runs files RUN_ID --output out/   # each file under a safe name in out/")]
pub struct FilesArgs {
    pub run_id: String,
    /// Write each file under DIR (created if missing): names made safe (nothing leaves DIR),
    /// a collision suffixed (`report-2.pdf`), bytes checked against their hash; a file
    /// already there with the same bytes is left as it is.
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// One JSON document: the run, whether its list is complete, and its files (with the
    /// path each was written to, with --output).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArg,
}

#[derive(clap::Args, Debug)]
pub struct PruneArgs {
    /// Only bytes stored (or made again) longer ago than this (`1h`, `30m`): a file being made
    /// now is on no record yet. Never less than a minute, whatever is given.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_age)]
    pub older_than: Duration,
    /// What was removed as JSON: `{"files": N, "bytes": N}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArg,
}

fn parse_age(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    crate::model::build::parse_duration(s)
        .ok_or_else(|| format!("`{s}` is not a duration (`1h`, `30m`, `0s`)"))
}

/// A run's files: its record's once it ended, else those its records hold so far (its own
/// and those of child runs whose calling step has not finished), and whether that is all.
pub(super) async fn files_of<S: Store + ?Sized>(
    s: &S,
    run: &RunRecord,
) -> Result<(Vec<RunFile>, bool), String> {
    if matches!(run.status, RunStatus::Succeeded | RunStatus::Failed) {
        return Ok((run.files.clone(), true));
    }
    let mut files = Vec::new();
    let mut todo = std::collections::VecDeque::from([run.id.clone()]);
    while let Some(id) = todo.pop_front() {
        let steps = s.latest_steps(&id).await.map_err(|e| e.to_string())?;
        let called: std::collections::HashSet<&str> =
            steps.iter().filter_map(|st| st.child_run.as_deref()).collect();
        for st in &steps {
            files.extend(st.files.iter().cloned());
        }
        for child in s.children(&id).await.map_err(|e| e.to_string())? {
            // A finished calling step's record carries its child's files already.
            if !called.contains(child.id.as_str()) {
                todo.push_back(child.id);
            }
        }
    }
    sort_run_files(&mut files);
    Ok((files, false))
}

/// `runs show`'s lines of a run's files: a count, then a line per file.
pub(super) fn files_lines(out: &mut String, files: &[RunFile], complete: bool) {
    if files.is_empty() {
        return;
    }
    let bytes: u64 = files.iter().map(|f| f.file.size).sum();
    let _ = writeln!(
        out,
        "files     {} ({bytes} bytes){}",
        files.len(),
        if complete { "" } else { " so far" }
    );
    for f in files {
        let _ = writeln!(
            out,
            "  {:<8} {}  {} · {} bytes · {}",
            f.number,
            shown_name(&f.file.name),
            f.file.media_type,
            f.file.size,
            f.file.file
        );
    }
}

/// The bytes of the images the run page inlines ([`crate::report::files::to_inline`]), read
/// and checked against their hash; one the store cannot give is left out (listed, not shown).
pub(super) async fn inline_bytes<S: Store + ?Sized>(
    s: &S,
    files: &[RunFile],
) -> std::collections::HashMap<String, Vec<u8>> {
    let blobs = s.blobs();
    let mut out = std::collections::HashMap::new();
    for hash in crate::report::files::to_inline(files) {
        if let Ok(b) = blobs.read_bytes(&hash).await {
            out.insert(hash, b);
        }
    }
    out
}

/// A recorded name as one line of text: control characters escaped.
pub(super) fn shown_name(name: &str) -> String {
    if !name.chars().any(char::is_control) {
        return name.to_string();
    }
    name.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `runs files`.
pub(super) fn files(args: FilesArgs) -> u8 {
    let out = with_store(
        &args.store,
        Use::Read,
        async |s| -> Result<(String, Option<String>), String> {
            let run = s.get_run(&args.run_id).await.map_err(|e| e.to_string())?;
            let (files, complete) = files_of(&**s, &run).await?;
            if let Some(dir) = &args.output
                && !files.is_empty()
            {
                crate::files::out::prepare_dir(dir).map_err(|e| format!("--output: {e}"))?;
            }
            let mut written = Vec::new();
            let mut failed = None;
            if let Some(dir) = &args.output {
                let blobs = s.blobs();
                if let Err(e) = crate::files::out::write_files_into(&*blobs, &files, dir, &mut written).await
                {
                    failed = Some(e.to_string());
                }
            }
            let text = if args.json {
                let list: Vec<Value> = files
                    .iter()
                    .enumerate()
                    .map(|(i, f)| {
                        let mut v = serde_json::to_value(f).expect("JSON values serialize");
                        if let (Some(dir), Some(w)) = (&args.output, written.get(i)) {
                            v["path"] = dir.join(&w.path).display().to_string().into();
                        }
                        v
                    })
                    .collect();
                let doc = json!({"run": run.id, "status": run.status.as_str(), "complete": complete, "files": list});
                serde_json::to_string_pretty(&doc).expect("JSON values serialize") + "\n"
            } else {
                listing(&run, &files, complete, &written, args.output.as_deref())
            };
            Ok((text, failed))
        },
    );
    match out {
        Ok(Ok((text, None))) => {
            print!("{text}");
            super::exit::OK
        }
        // Not all written: the list, then why (the file that failed left nothing behind).
        Ok(Ok((text, Some(why)))) => {
            print!("{text}");
            super::stderr::error(why);
            super::exit::FAILED
        }
        Ok(Err(e)) => fail(e),
        Err(e) => fail(e),
    }
}

fn listing(
    run: &RunRecord,
    files: &[RunFile],
    complete: bool,
    written: &[crate::files::out::Written],
    dir: Option<&std::path::Path>,
) -> String {
    let mut o = String::new();
    let bytes: u64 = files.iter().map(|f| f.file.size).sum();
    let state = if complete {
        String::new()
    } else {
        format!(
            " so far (the run is {}: the files of its finished records)",
            run.status.as_str()
        )
    };
    let _ = writeln!(o, "run {}: {} file(s), {bytes} bytes{state}", run.id, files.len());
    if files.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "{:<10} {:>10}  {:<24} {:<71} name",
        "number", "size", "media type", "hash"
    );
    for (i, f) in files.iter().enumerate() {
        let to = match (dir, written.get(i)) {
            (Some(d), Some(w)) => format!(
                "  -> {}{}",
                d.join(&w.path).display(),
                if w.wrote { "" } else { " (there already)" }
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "{:<10} {:>10}  {:<24} {:<71} {}{to}",
            f.number,
            f.file.size,
            f.file.media_type,
            f.file.file,
            shown_name(&f.file.name)
        );
    }
    if let Some(d) = dir {
        let new = written.iter().filter(|w| w.wrote).count();
        let _ = writeln!(
            o,
            "wrote {new} file(s) under {} ({} there already with the same bytes)",
            d.display(),
            written.len() - new
        );
    }
    o
}

/// `runs prune`.
pub(super) fn prune(args: PruneArgs) -> u8 {
    let older_than = args.older_than;
    let out = with_store(&args.store, Use::Write, async |s| {
        s.blobs().prune(older_than).await.map_err(|e| e.to_string())
    });
    match out {
        Ok(Ok(p)) => {
            if args.json {
                println!("{}", json!({"files": p.files, "bytes": p.bytes}));
            } else {
                println!(
                    "removed {} file(s), {} bytes: stored more than {} ago, on no record",
                    p.files,
                    p.bytes,
                    crate::model::fmt_duration(args.older_than.max(crate::store::blobs::PRUNE_FLOOR))
                );
            }
            super::exit::OK
        }
        Ok(Err(e)) => {
            super::stderr::error(e);
            super::exit::FAILED
        }
        Err(e) => fail(e),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_shown_on_one_line() {
        assert_eq!(super::shown_name("a\nb\u{1b}"), "a\\nb\\u{1b}");
        assert_eq!(super::shown_name("plain.png"), "plain.png");
        assert_eq!(super::parse_age("0").unwrap(), std::time::Duration::ZERO);
        assert!(super::parse_age("soon").is_err());
    }
}
