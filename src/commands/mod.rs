//! The command kinds' code: what a [`RunnableCommand`] does on this
//! machine, one small module per family.
//!
//! A kind gets the command (its arguments already checked against the
//! registry by `bc_wire::command::verify`) and a [`Machine`]: where it reads
//! the machine from, so that tests point it at a fake tree. It runs on a
//! blocking thread and returns what happened ([`Done`]); the channel cuts it
//! off at its kind's deadline and signs the result. A kind whose code this
//! bcd does not have yet (`deploy.*`, `boot.kexec`: the
//! lifecycle issue) fails with `not-implemented`, so nothing is silently
//! skipped.
mod diag;
mod disk;
mod inventory;
mod logs;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bc_wire::agent::Role;
use bc_wire::command::{Output, RunnableCommand};
use bc_wire::command_v1::Status;

use crate::keys::TpmAccess;

/// Where the kinds read this machine from.
pub(crate) struct Machine {
    /// `/sys`, or a fake tree.
    pub sysfs: PathBuf,
    /// `/proc`, or a fake tree.
    pub procfs: PathBuf,
    /// `/dev`, or a fake tree (`disk.wipe` writes there: tests give it
    /// files, never a real disk).
    pub devfs: PathBuf,
    /// The data directory (`journal.db`).
    pub data_dir: PathBuf,
    /// The config file, for `diag.doctor`.
    pub config_path: PathBuf,
    /// The TPM as this process reaches it (under `[helper]`, not at all:
    /// the inventory then reads what sysfs shows of it).
    pub tpm: Arc<TpmAccess>,
    /// The role of this node's identity: only a ramdisk wipes disks,
    /// whatever its certificate allowed.
    pub role: Role,
}

impl Machine {
    /// This machine: `/sys`, `/proc` and `/dev` (in a `failpoints` build,
    /// `BCD_SYSFS_ROOT`, `BCD_PROC_ROOT` and `BCD_DEV_ROOT` when set).
    pub(crate) fn this(
        config_path: &Path,
        data_dir: &Path,
        tpm: Arc<TpmAccess>,
        role: Role,
    ) -> Machine {
        Machine {
            sysfs: crate::evidence::claims::sysfs_root(),
            procfs: root(PROC_ROOT_ENV, "/proc"),
            devfs: root(DEV_ROOT_ENV, "/dev"),
            role,
            data_dir: data_dir.to_owned(),
            config_path: config_path.to_owned(),
            tpm,
        }
    }
}

/// The environment variables a `failpoints` build reads procfs and devfs
/// under (as [`crate::evidence::claims::SYSFS_ROOT_ENV`] for sysfs).
pub(crate) const PROC_ROOT_ENV: &str = "BCD_PROC_ROOT";
pub(crate) const DEV_ROOT_ENV: &str = "BCD_DEV_ROOT";

/// `real`, or in a `failpoints` build the tree `env` names.
fn root(env: &str, real: &str) -> PathBuf {
    #[cfg(feature = "failpoints")]
    {
        if let Some(root) = std::env::var_os(env) {
            tracing::warn!(root = %Path::new(&root).display(), "test build: {real} is read under {env}");
            return PathBuf::from(root);
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = env;
    PathBuf::from(real)
}

/// What a kind did.
#[derive(Debug)]
pub(crate) struct Done {
    pub status: Status,
    /// A short reason (a refusal's name, an error), at most 1 KiB once in
    /// the result.
    pub outcome: String,
    pub output: Output,
}

impl Done {
    fn ok(outcome: impl Into<String>, output: &[u8]) -> Done {
        let mut o = Output::new();
        o.push(output);
        Done {
            status: Status::Ok,
            outcome: outcome.into(),
            output: o,
        }
    }

    pub(crate) fn failed(outcome: impl Into<String>) -> Done {
        Done {
            status: Status::Failed,
            outcome: outcome.into(),
            output: Output::new(),
        }
    }
}

/// Runs `command` on this machine (blocking).
pub(crate) fn run(command: &RunnableCommand, machine: &Machine) -> Done {
    let args = command.args();
    match command.kind().name {
        "diag.ping" => diag::ping(args.get("echo")),
        "diag.doctor" => diag::doctor(&machine.config_path),
        "inventory.refresh" => inventory::refresh(machine),
        "logs.collect" => logs::collect(machine, args),
        "disk.wipe" => disk::wipe(machine, &args.devices("devices")),
        other => Done::failed(format!(
            "not-implemented: this bcd does not run {other} yet"
        )),
    }
}

/// A sysfs or procfs file's text, trimmed; `None` when it is absent or
/// unreadable. Bounded: these files are short, and a fake tree is no
/// reason to read a large one.
fn read_small(path: &Path) -> Option<String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(64 * 1024)
        .read_to_string(&mut text)
        .ok()?;
    Some(text.trim().to_owned())
}
