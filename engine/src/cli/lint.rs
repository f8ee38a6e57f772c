//! `switchyard lint PATH...`: check flows and print every problem.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::ValueEnum;

use crate::diag::render;
use crate::project::Project;
use crate::syntax::Limits;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// Annotated source snippets (colour on a terminal).
    Human,
    /// A JSON array of diagnostics.
    Json,
    /// SARIF 2.1.0, for GitHub code scanning.
    Sarif,
    /// GitHub Actions workflow annotations.
    Github,
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Exit status: 0 no errors, 1 errors (or warnings with --deny-warnings), 2 usage.\n\
                        `switchyard explain CODE` explains a diagnostic."
)]
pub struct Args {
    /// Flow files and directories (searched for *.yaml and *.yml).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    #[arg(long, value_enum, default_value = "human")]
    pub format: Format,
    /// Exit 1 when there are warnings.
    #[arg(long)]
    pub deny_warnings: bool,
    /// The project root that file paths may not leave; default the directory of each flow (or
    /// the directory given on the command line).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Also start the MCP servers the flows define and check against what each server lists:
    /// the tools `mcp` agents, allowlists, `approve:` and agent loops name, and tools of a
    /// `"*"` server that a loop would offer under another tool's name; a server that cannot be
    /// started or listed is an error.
    #[arg(long)]
    pub mcp: bool,
}

/// The files to check, each with its project root.
pub(crate) fn collect(paths: &[PathBuf], root: Option<&Path>) -> Result<Vec<(PathBuf, PathBuf)>, String> {
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).map_err(|e| format!("cannot read `{}`: {e}", p.display()))?;
        if meta.is_dir() {
            let mut files = Vec::new();
            walk(p, &mut files).map_err(|e| format!("cannot read `{}`: {e}", p.display()))?;
            files.sort();
            let r = root.map(Path::to_path_buf).unwrap_or_else(|| p.clone());
            out.extend(files.into_iter().map(|f| (f, r.clone())));
        } else {
            let r = root
                .map(Path::to_path_buf)
                .or_else(|| p.parent().map(Path::to_path_buf))
                .filter(|r| !r.as_os_str().is_empty())
                .unwrap_or_else(|| PathBuf::from("."));
            out.push((p.clone(), r));
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let ty = entry.file_type()?;
        if ty.is_dir() {
            walk(&path, out)?;
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(path);
        }
    }
    Ok(())
}

pub fn run(args: Args) -> u8 {
    let files = match collect(&args.paths, args.root.as_deref()) {
        Ok(f) => f,
        Err(e) => {
            super::stderr::error(e);
            return super::exit::USAGE;
        }
    };
    let (project, mut diags) = check(&files);
    // `--mcp` asks the servers only of a project static lint found no error in: what they
    // list is checked against names that are at least well formed.
    if args.mcp && !diags.iter().any(|d| d.is_error()) {
        diags.extend(super::mcp_check::check_live(&project));
        crate::diag::sort(&mut diags);
    }
    let text = match args.format {
        Format::Human => {
            let opts = render::HumanOptions {
                color: super::color_stdout(),
                width: super::width(),
            };
            let mut s = render::human(&diags, &project.sources, &opts);
            if !diags.is_empty() {
                // A blank line between the last diagnostic and the summary.
                s.push('\n');
            }
            s.push_str(&render::summary(&diags, files.len()));
            s
        }
        Format::Json => render::json(&diags, &project.sources),
        Format::Sarif => render::sarif(&diags, &project.sources),
        Format::Github => render::github(&diags, &project.sources),
    };
    let errors = diags.iter().any(|d| d.is_error());
    let warnings = diags.iter().any(|d| !d.is_error());
    let code = if errors || (args.deny_warnings && warnings) {
        super::exit::FAILED
    } else {
        super::exit::OK
    };
    let code = match write_stdout(&text) {
        Ok(()) => code,
        Err(e) => {
            super::stderr::error(format!("cannot write the diagnostics: {e}"));
            super::exit::FAILED
        }
    };
    // The process exits right after this: the project (every file's text, tree and model)
    // and the output are left to the operating system rather than freed one allocation at a
    // time, which for a thousand files takes longer than rendering them.
    std::mem::forget((project, diags, text));
    code
}

/// Writes `text` to stdout, ending it with a newline unless it is empty. A reader that went
/// away (`switchyard lint ... | head`) is not an error: what it did not read is dropped
/// quietly, and the command exits as it would have. Other write errors are returned.
pub(crate) fn write_stdout(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    let written = out
        .write_all(text.as_bytes())
        .and_then(|()| {
            if text.is_empty() || text.ends_with('\n') {
                Ok(())
            } else {
                out.write_all(b"\n")
            }
        })
        .and_then(|()| out.flush());
    match written {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Loads and lints `files` (each with its root) into one project. Files are read and parsed
/// on every core ([`Project::load_tops`]); the result is the same as loading them one by one.
pub fn check(files: &[(PathBuf, PathBuf)]) -> (Project, Vec<crate::diag::Diagnostic>) {
    let limits = Limits::default();
    let mut project = Project::default();
    // Files of one directory share its root: resolve each distinct root once.
    let mut last: Option<(&PathBuf, PathBuf)> = None;
    let tops: Vec<(PathBuf, PathBuf)> = files
        .iter()
        .map(|(file, root)| {
            let canonical = match &last {
                Some((given, canonical)) if *given == root => canonical.clone(),
                _ => {
                    let canonical = root.canonicalize().unwrap_or_else(|_| root.clone());
                    last = Some((root, canonical.clone()));
                    canonical
                }
            };
            (file.clone(), canonical)
        })
        .collect();
    project.load_tops(&tops, &limits);
    let diags = crate::lint::lint_project(&project);
    (project, diags)
}
