//! `switchyard explain CODE`.

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
    if args.list {
        for r in codes::RULES {
            println!("{}  {:<28} {:<8} {}", r.code, r.name, r.severity.as_str(), r.summary);
        }
        return super::exit::OK;
    }
    let code = args.code.expect("required unless --list");
    match codes::find(&code) {
        Some(r) => {
            println!("{}", r.doc.trim_end());
            super::exit::OK
        }
        None => {
            let names = codes::RULES.iter().flat_map(|r| [r.code, r.name]);
            let hint = crate::diag::did_you_mean(&code, names).unwrap_or_default();
            eprintln!("error: unknown lint code `{code}`. {hint}");
            eprintln!("  `switchyard explain --list` lists every code");
            super::exit::USAGE
        }
    }
}
