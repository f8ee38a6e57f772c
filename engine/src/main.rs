//! The `switchyard` binary: everything lives in the library's `cli` module.

fn main() -> std::process::ExitCode {
    switchyard::__private::cli::main()
}
