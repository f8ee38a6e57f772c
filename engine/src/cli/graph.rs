//! `switchyard graph FLOW`: the compiled flow as a Mermaid or Graphviz picture, or as SVG laid
//! out here.

use std::path::PathBuf;

use clap::ValueEnum;

use crate::api::Flow;
use crate::diag::render;
use crate::plan::{Plan, draw, svg};
use crate::project::Project;
use crate::syntax::Limits;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// Mermaid `flowchart` text (renders on GitHub and in most Markdown viewers).
    Mermaid,
    /// Graphviz DOT text (`switchyard graph f.yaml --format dot | dot -Tsvg > f.svg`).
    Dot,
    /// An SVG picture, laid out by switchyard itself (no Graphviz needed).
    Svg,
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Edges are labelled with their `on`, `if` and `errors`; failure edges are dashed.\n\
                        Where a step has rival edges (two or more for one outcome), each edge is\n\
                        numbered with its place in `next`, the order they are tried in, and an\n\
                        unconditional fallback reads `else`. In Mermaid and DOT, `foreach` and\n\
                        `while` loops are self-loops with their bound; in SVG, boxes titled with it.\n\
                        `parallel` branches are drawn inside their step. An agent loop's tools are\n\
                        nodes joined to its step by a dashed `tool` edge without an arrowhead. With\n\
                        --nested, the flows that `flow` agents (steps' or tools') call are drawn in\n\
                        the same diagram, each in a subgraph (a cluster in DOT, a box in SVG), with\n\
                        a dotted `calls` edge from each calling step or tool.\n\n\
                        switchyard graph flow.yaml --format svg > flow.svg"
)]
pub struct Args {
    /// The flow file.
    pub flow: PathBuf,
    #[arg(long, value_enum, default_value = "mermaid")]
    pub format: Format,
    /// Also draw every flow that `flow` agents call (as steps or as tools), each as a subgraph
    /// of the one diagram.
    #[arg(long)]
    pub nested: bool,
    /// The project root that file paths may not leave; default the flow's directory.
    #[arg(long)]
    pub root: Option<PathBuf>,
}

pub fn run(args: Args) -> u8 {
    let Some(flow) = load_flow(&args.flow, args.root.clone()) else {
        return super::exit::USAGE;
    };
    let plan = flow.plan();
    match args.format {
        Format::Mermaid => print!("{}", draw::mermaid(plan, args.nested)),
        Format::Dot => print!("{}", draw::dot(plan, args.nested)),
        Format::Svg => match svg::svg(plan, args.nested) {
            Ok(text) => print!("{text}"),
            Err(e) => {
                super::stderr::error(format!("{}: {e}", args.flow.display()));
                return super::exit::FAILED;
            }
        },
    }
    super::exit::OK
}

/// Loads, lints and compiles a flow ([`Flow::load_under`], as a library user does); prints
/// its diagnostics to stderr when it does not lint clean (warnings alone are printed too, and
/// the flow is loaded).
pub(crate) fn load_flow(flow: &std::path::Path, root: Option<PathBuf>) -> Option<Flow> {
    match Flow::load_under(flow, root) {
        Ok(f) => {
            if !f.warnings().is_empty() {
                print_diagnostics(f.warnings(), f.project());
                let summary = render::summary(f.warnings(), f.project().flows.len());
                super::stderr::say(
                    super::stderr::Level::Warn,
                    "lint_summary",
                    &summary,
                    serde_json::Value::Null,
                );
            }
            Some(f)
        }
        Err(e) => {
            if !e.diagnostics.is_empty() {
                print_diagnostics(&e.diagnostics, e.project());
                let summary = render::summary(&e.diagnostics, e.project().flows.len());
                super::stderr::say(
                    super::stderr::Level::Error,
                    "lint_summary",
                    &summary,
                    serde_json::Value::Null,
                );
            }
            if let Some(m) = e.message() {
                super::stderr::error(m);
            }
            None
        }
    }
}

/// Loads and compiles a flow without printing anything: the plan, or why there is none.
pub(crate) fn quiet_plan(flow: &std::path::Path) -> Result<Plan, String> {
    if !flow.exists() {
        return Err(format!("the flow file {} is not there any more", flow.display()));
    }
    let mut project = Project::default();
    let id = project
        .load_top(flow, crate::project::root_of(flow, None), &Limits::default())
        .ok_or_else(|| format!("the flow file {} does not load", flow.display()))?;
    let (plan, diags) = crate::lint::lint_and_compile(&project, id);
    plan.ok_or_else(|| {
        format!(
            "the flow file {} does not compile now ({} problems; `switchyard lint` shows them)",
            flow.display(),
            diags.len()
        )
    })
}

/// Prints a flow's diagnostics to stderr, rendered for a person or as JSON lines.
fn print_diagnostics(diags: &[crate::diag::Diagnostic], project: &Project) {
    let opts = render::HumanOptions {
        color: super::color_stderr(),
        width: super::width(),
    };
    super::stderr::diagnostics(
        &render::json(diags, &project.sources),
        &render::human(diags, &project.sources, &opts),
    );
}
