//! `bcd doctor`: one line per check, `ok` / `warn` / `fail` with what to do
//! next. (Being written.)
use std::process::ExitCode;

use crate::config::ConfigArg;

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Print a JSON object instead of lines
    #[arg(long)]
    json: bool,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let _ = args;
    anyhow::bail!("bcd doctor is not built yet")
}
