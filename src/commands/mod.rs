//! The command kinds' code: what a [`RunnableCommand`] does on this
//! machine, one small module per family.
//!
//! A kind gets the command (its arguments already checked against the
//! registry by `bc_wire::command::verify`) and a [`Machine`]: where it reads
//! the machine from, so that tests point it at a fake tree. It runs on a
//! blocking thread and returns what happened ([`Done`]); the channel cuts it
//! off at its kind's deadline and signs the result. A registered kind whose
//! code this bcd does not have fails with `not-implemented`, so nothing is
//! silently skipped.
mod deploy;
mod diag;
mod disk;
mod inventory;
mod kexec;
mod logs;
mod mount;

pub(crate) use kexec::acked;
// The seed document's parser, for the fuzz target (lib.rs).
pub use deploy::Seed as DeploySeed;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bc_wire::agent::Role;
use bc_wire::command::{Output, RunnableCommand};
use bc_wire::command_v1::Status;

use crate::keys::{NodeKey, TpmAccess};

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
    /// The control plane, as this node reaches it (`deploy.image`'s
    /// downloads); `None` in tests that fetch nothing.
    pub api: Option<Arc<ApiAccess>>,
}

/// The node's current certificate chain (DER, leaf first) and its key.
pub(crate) type CurrentIdentity = dyn Fn() -> (Vec<Vec<u8>>, Arc<dyn NodeKey>) + Send + Sync;

/// How a kind fetches from the control plane: its pinned TLS with the
/// node's current certificate (the channel's, renewed with it).
pub(crate) struct ApiAccess {
    /// `https://host:port`, no trailing slash.
    pub base: String,
    pub tls: rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>,
    pub identity: Box<CurrentIdentity>,
}

/// No byte for this long ends a download.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

impl ApiAccess {
    /// `GET path` over mTLS: its body as a blocking reader (on a runtime of
    /// its own: kinds run on blocking threads). A status other than 200 is
    /// an error naming it and the server's short reason.
    fn get(&self, path: &str) -> Result<Box<dyn std::io::Read>, String> {
        let (chain, key) = (self.identity)();
        let tls = self
            .tls
            .clone()
            .with_client_cert_resolver(crate::keys::tls::client_identity(&chain, key));
        let client = crate::http_builder::http_builder()
            .use_preconfigured_tls(tls)
            .https_only(true)
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(std::time::Duration::from_secs(10))
            .read_timeout(READ_TIMEOUT)
            .user_agent(concat!("bcd/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the HTTPS client: {e}"))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime: {e}"))?;
        let url = format!("{}{path}", self.base);
        let resp = rt.block_on(client.get(&url).send()).map_err(|e| {
            format!(
                "GET {path}: {}",
                crate::client::causes(&e)
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(": ")
            )
        })?;
        let status = resp.status();
        if status != reqwest::StatusCode::OK {
            let text = rt.block_on(resp.text()).unwrap_or_default();
            let reason: String = text
                .trim()
                .chars()
                .take(200)
                .filter(|c| !c.is_control())
                .collect();
            return Err(format!("GET {path}: HTTP {}: {reason}", status.as_u16()));
        }
        Ok(Box::new(Body {
            rt,
            resp,
            chunk: bytes::Bytes::new(),
        }))
    }
}

/// A response body read as `std::io::Read`.
struct Body {
    rt: tokio::runtime::Runtime,
    resp: reqwest::Response,
    chunk: bytes::Bytes,
}

impl std::io::Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rt.block_on(self.resp.chunk()) {
                Ok(Some(c)) => self.chunk = c,
                Ok(None) => return Ok(0),
                Err(e) => return Err(std::io::Error::other(e)),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

impl Machine {
    /// This machine: `/sys`, `/proc` and `/dev` (in a `failpoints` build,
    /// `BCD_SYSFS_ROOT`, `BCD_PROC_ROOT` and `BCD_DEV_ROOT` when set).
    pub(crate) fn this(
        config_path: &Path,
        data_dir: &Path,
        tpm: Arc<TpmAccess>,
        role: Role,
        api: Option<Arc<ApiAccess>>,
    ) -> Machine {
        Machine {
            sysfs: crate::evidence::claims::sysfs_root(),
            procfs: root(PROC_ROOT_ENV, "/proc"),
            devfs: root(DEV_ROOT_ENV, "/dev"),
            role,
            data_dir: data_dir.to_owned(),
            config_path: config_path.to_owned(),
            tpm,
            api,
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
        "deploy.image" => deploy::image(machine, args),
        "boot.kexec" => kexec::kexec(machine, command.id(), args),
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A machine under `root` (sys, proc, dev, data), a ramdisk, no TPM,
    /// no control plane.
    pub(crate) fn machine(root: &Path) -> Machine {
        Machine {
            sysfs: root.join("sys"),
            procfs: root.join("proc"),
            devfs: root.join("dev"),
            data_dir: root.join("data"),
            config_path: root.join("config.toml"),
            tpm: Arc::new(TpmAccess::none()),
            role: Role::Ramdisk,
            api: None,
        }
    }
}
