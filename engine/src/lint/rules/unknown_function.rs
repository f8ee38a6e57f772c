//! Calls of functions and macros that do not exist, or not the way they are called (SY410),
//! and calls with an argument count the function does not take (SY411), checked against the
//! table of `expr::functions`. The data rules hand over each expression's calls and how
//! to place a byte range of the expression in the file; the diagnostic is on the name.

use crate::diag::{Diagnostic, codes};
use crate::expr::Call;
use crate::expr::functions::{self, Problem};
use crate::source::Span;

/// Reports the calls of `calls` that the table does not have; `span_of` places a byte range
/// of the expression text.
pub fn check(calls: &[Call], out: &mut Vec<Diagnostic>, span_of: impl Fn(usize, usize) -> Span) {
    for call in calls {
        let Some(problem) = functions::check(&call.name, call.member, call.args) else {
            continue;
        };
        let span = span_of(call.start, call.end);
        let name = &call.name;
        let d = match problem {
            Problem::Unknown { closest } => {
                let what = if call.member {
                    format!("unknown method `{name}`")
                } else {
                    format!("unknown function `{name}`")
                };
                let d = Diagnostic::new(&codes::UNKNOWN_FUNCTION, span, what).label("no such function");
                match closest {
                    Some(c) => d.help(format!("did you mean `{c}`?")),
                    None => d.help(
                        "expressions call CEL's standard functions, the strings extension \
                         (`split`, `lowerAscii`, `format`, ...) and `timestamp`/`duration`; \
                         `switchyard explain SY410` lists them",
                    ),
                }
            }
            Problem::WrongStyle(f) => {
                let (what, label) = if f.member {
                    (
                        format!("`{name}` is called on a value, not by itself"),
                        "a method",
                    )
                } else {
                    (format!("`{name}` is a function, not a method"), "not a method")
                };
                Diagnostic::new(&codes::UNKNOWN_FUNCTION, span, what)
                    .label(label)
                    .help(format!("write {}", f.usage))
            }
            Problem::WrongCount(f) => {
                let given = match call.args {
                    1 => "1 argument".to_owned(),
                    n => format!("{n} arguments"),
                };
                Diagnostic::new(
                    &codes::WRONG_ARGUMENT_COUNT,
                    span,
                    format!("`{name}` takes {}, not {given}", functions::arity(f)),
                )
                .label(format!("called with {given}"))
                .help(format!("write {}", f.usage))
            }
        };
        out.push(d);
    }
}
