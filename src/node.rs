//! `bcd node`: stay joined (the loop is [`crate::renewal`]).
use std::process::ExitCode;

use crate::config::ConfigArg;

#[derive(clap::Args, Debug)]
pub(crate) struct NodeArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// One pass, then exit: 0 when the identity is valid afterwards, 1 when the pass failed
    #[arg(long)]
    once: bool,
    /// Renew now, whatever the certificate's age (then carry on, or exit with --once)
    #[arg(long)]
    renew_now: bool,
}

pub(crate) fn run(args: NodeArgs) -> anyhow::Result<ExitCode> {
    crate::renewal::run(&args.config.path, args.once, args.renew_now)
}
