//! `switchyard schema`: the JSON Schema of flow files.

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> u8 {
    print!("{}", crate::schema::flow_schema_json());
    super::exit::OK
}
