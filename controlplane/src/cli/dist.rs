//! `dist add|list`: the packages machines download (`GET /dist/<name>`),
//! each recorded with its SHA-256 for the install script to pin.

use anyhow::{Context, Result};
use bc_controlplane::dist;
use clap::Subcommand;
use std::path::PathBuf;

use super::{print_line, require_initialized, Dir};

#[derive(Subcommand)]
pub(crate) enum DistCmd {
    /// Store a package in DIR/dist, record its SHA-256, and make it the one
    /// install scripts install from now on; prints `added <name> sha256 <hex>`.
    Add {
        #[command(flatten)]
        dir: Dir,
        /// The package (bcd_<version>_<arch>.deb).
        file: PathBuf,
    },
}

pub(crate) fn run(cmd: DistCmd) -> Result<()> {
    match cmd {
        DistCmd::Add { dir, file } => {
            require_initialized(&dir.dir)?;
            let p = dist::add(&dir.dir, &file)
                .with_context(|| format!("cannot add {} to dist/", file.display()))?;
            print_line(&format!("added {} sha256 {}", p.name, p.sha256_hex()))
        }
    }
}
