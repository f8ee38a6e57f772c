//! `switchyard explain CODE`.

use std::fmt::Write as _;

use crate::diag::codes;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A lint code (`SY201`) or rule name (`unknown-step`); `--list` for all.
    #[arg(required_unless_present = "list")]
    pub code: Option<String>,
    /// List every code with its name and summary.
    #[arg(long)]
    pub list: bool,
}

pub fn run(args: Args) -> u8 {
    let text = if args.list {
        let mut text = String::new();
        for r in codes::RULES {
            writeln!(
                text,
                "{}  {:<28} {:<8} {}",
                r.code,
                r.name,
                r.severity.as_str(),
                r.summary
            )
            .expect("writing to a String");
        }
        text
    } else {
        let code = args.code.expect("required unless --list");
        match codes::find(&code) {
            Some(r) => r.doc.trim_end().to_string(),
            None => {
                super::stderr::error(format!(
                    "{}\n  `switchyard explain --list` lists every code",
                    unknown_code(&code)
                ));
                return super::exit::USAGE;
            }
        }
    };
    match super::lint::write_stdout(&text) {
        Ok(()) => super::exit::OK,
        Err(e) => {
            super::stderr::error(format!("cannot write the explanation: {e}"));
            super::exit::FAILED
        }
    }
}

/// "unknown lint code `X`", with the closest code or rule name when there is one.
fn unknown_code(code: &str) -> String {
    let names = codes::RULES.iter().flat_map(|r| [r.code, r.name]);
    match crate::diag::did_you_mean(code, names) {
        Some(hint) => format!("unknown lint code `{code}`; {hint}"),
        None => format!("unknown lint code `{code}`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_codes_get_a_tidy_message() {
        assert_eq!(unknown_code("SY999"), "unknown lint code `SY999`");
        assert_eq!(
            unknown_code("unknown-stpe"),
            "unknown lint code `unknown-stpe`; did you mean `unknown-step`?"
        );
    }
}
