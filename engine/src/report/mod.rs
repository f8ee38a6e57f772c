//! Pages that show what happened (SPEC §13), each one self-contained HTML file: no network,
//! the style and the script inline. [`run`]: one run; [`batch`]: a batch's items.
//! The pages `switchyard serve` answers with ([`page`], [`inbox_page`], [`live`]) are shells
//! that fetch their data from the server's own `/v1` API and show it as text.

pub mod batch;
pub mod files;
pub mod inbox_page;
pub mod live;
pub mod page;
pub mod question;
pub mod run;

pub use run::{CHILDREN_SHOWN, ITERATIONS_SHOWN, RunReport, VALUE_BYTES, html, run_html};
