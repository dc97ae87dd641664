//! `bcd ramdisk`: a PXE-booted platform ramdisk joins and stays joined.
//!
//! Reads `bc.token` and `bc.assertion` from the kernel command line (what
//! `bcd site` put there), refuses a malformed one naming what was wrong
//! before anything is sent, joins with attestor `discovery` and role
//! `ramdisk` (the token sealed to the pinned JoinService key, the assertion
//! as the attestation, the machine's MACs and product UUID as claims; a
//! deferral is retried with the same CSR: under the control plane's
//! `[discovery] approval` it waits for an operator, saying on the console
//! which join request to approve, no longer than its assertion lasts),
//! prints its node id on the
//! console, and then runs `bcd node`'s loop to keep its (at most 2-hour)
//! certificate renewed. Its identity lives in the configured data
//! directory, which on a ramdisk is the initramfs's tmpfs: it ends with the
//! boot, as a commissioning identity should.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use bc_wire::agent::Role;

use crate::config::{Config, ConfigArg};
use crate::evidence::discovery::{self, MAX_CMDLINE};
use crate::identity::Identity;
use crate::joining::{self, Credential};
use crate::keys::TpmAccess;
use crate::out;
use crate::renewal;

#[derive(clap::Args, Debug)]
pub(crate) struct RamdiskArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The kernel command line to read bc.token and bc.assertion from
    #[arg(long, value_name = "FILE", default_value = "/proc/cmdline")]
    cmdline: PathBuf,
    /// Join (or find the identity), then exit instead of staying up renewing
    #[arg(long)]
    once: bool,
}

pub(crate) fn run(args: RamdiskArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(&args.config.path)?;
    let tpm = TpmAccess::configured(&config);
    let dir = &config.data_dir;
    let node_id = match Identity::load(dir, &tpm) {
        // A restarted bcd ramdisk in the same boot keeps its identity: the
        // token and the assertion admitted one join only.
        Ok(Some(id)) => {
            out::line(format_args!("already joined as {}", id.node_id))?;
            id.node_id
        }
        Ok(None) | Err(_) => {
            let text = read_cmdline(&args.cmdline)?;
            let d = discovery::parse_cmdline(&text)
                .with_context(|| format!("cannot join from {}", args.cmdline.display()))?;
            let node_id = joining::join(&config, &tpm, Credential::Discovery(d), Role::Ramdisk)?;
            out::line(format_args!("joined as {node_id}"))?;
            node_id
        }
    };
    tracing::info!(node_id = %node_id, "ramdisk joined");
    if args.once {
        return Ok(ExitCode::SUCCESS);
    }
    renewal::run(&args.config.path, false, false)
}

/// The command line, bounded: it is input nobody authenticated yet.
fn read_cmdline(path: &Path) -> anyhow::Result<String> {
    use bc_wire::file::{read_regular, FileError, Links};
    let bytes = match read_regular(path, MAX_CMDLINE as u64, Links::Follow) {
        Ok(b) => b,
        Err(FileError::TooLarge(_)) => anyhow::bail!(
            "{} is longer than {MAX_CMDLINE} bytes: not a kernel command line",
            path.display()
        ),
        Err(e) => anyhow::bail!("the kernel command line {}: {e}", path.display()),
    };
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))
}
