//! `bcd node`: stay joined. (Being written: renewal with TPM-certified next
//! keys, x509pop re-join after an offline expiry, the journal.)
use std::process::ExitCode;

use crate::config::ConfigArg;

#[derive(clap::Args, Debug)]
pub struct NodeArgs {
    #[command(flatten)]
    config: ConfigArg,
}

pub fn run(args: NodeArgs) -> anyhow::Result<ExitCode> {
    let _ = args;
    anyhow::bail!("bcd node is not built yet")
}
