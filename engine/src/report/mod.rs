//! Pages that show what happened (SPEC §13), each one self-contained HTML file: no network,
//! the style and the script inline. [`run`]: one run; [`batch`]: a batch's items.

pub mod batch;
pub mod files;
pub mod question;
pub mod run;

pub use run::{CHILDREN_SHOWN, ITERATIONS_SHOWN, RunReport, VALUE_BYTES, html, run_html};
