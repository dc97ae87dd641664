//! `bcd`: see the library (`src/lib.rs`) for the parts.

fn main() -> std::process::ExitCode {
    bcd::cli::main()
}
