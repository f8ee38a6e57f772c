//! `switchyard worker` (SPEC §12).

use super::common::StoreArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub store: StoreArg,
}

pub fn run(_args: Args) -> u8 {
    super::stderr::error("`worker` is not built yet");
    super::exit::USAGE
}
