//! `switchyard graph FLOW`: the flow as a picture.
#[derive(clap::Args, Debug)]
pub struct Args {}
pub fn run(_args: Args) -> u8 {
    0
}
