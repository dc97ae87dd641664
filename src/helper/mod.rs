//! `bcd helper`: the root helper. The only bcd process that opens the TPM
//! when the node runs unprivileged (OpenSSH's privilege separation is the
//! model): it serves `[helper] user` and root a closed set of `tpm.*`
//! operations on `[helper] socket` (or the socket systemd passed), and
//! refuses and logs anyone else. The protocol, the server and the node's
//! client are the `bc-helper` crate; this module gives it bcd's TPM.
mod backend;
mod listen;

use std::process::ExitCode;

use anyhow::{anyhow, Context as _};

pub use backend::TpmBackend;

use crate::config::{Config, ConfigArg};
use crate::identity::owner::user_ids;
use crate::keys::TpmAccess;

#[derive(clap::Args, Debug)]
pub(crate) struct HelperArgs {
    #[command(flatten)]
    config: ConfigArg,
}

pub(crate) fn run(args: HelperArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(&args.config.path)?;
    let settings = config.helper.clone().unwrap_or_default();
    let (uid, gid) = user_ids(&settings.user)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let _guard = runtime.enter();
    // The socket file to remove at the end: none when systemd owns it.
    let (listener, bound) = match listen::activated()? {
        Some(l) => (l, None),
        None => (listen::bind(&settings.socket, gid)?, Some(&settings.socket)),
    };
    let backend = open_backend(&config)?;
    tracing::info!(
        socket = %bound.map_or("(from systemd)".to_owned(), |p| p.display().to_string()),
        user = %settings.user,
        uid,
        "bcd helper serving root and its user"
    );
    let served = runtime.block_on(bc_helper::serve(
        listener,
        backend,
        bc_helper::Allowed::root_and(uid),
        bc_helper::Limits::default(),
        stop_signal(),
    ));
    if let Some(path) = bound {
        let _ = std::fs::remove_file(path);
    }
    // Nonzero, so that systemd (Restart=on-failure) starts a fresh helper.
    served?;
    tracing::info!("bcd helper stopped");
    Ok(ExitCode::SUCCESS)
}

/// The TPM the config names, opened once, with what the node's keys need
/// (the owner authorization), and keys a killed predecessor left flushed.
pub fn open_backend(config: &Config) -> anyhow::Result<TpmBackend> {
    let access = TpmAccess::new(config.tpm_tcti.as_deref())
        .with_owner_auth(config.tpm_owner_auth_file.clone());
    let tcti = access
        .tcti()
        .ok_or_else(|| {
            anyhow!(
                "bcd helper has no TPM to serve: {}",
                crate::keys::KeyError::NoTpm
            )
        })?
        .to_owned();
    let opener = backend::Opener {
        tcti,
        owner_auth_file: config.tpm_owner_auth_file.clone(),
    };
    let mut tpm = opener.open()?;
    let info = tpm.info().context("cannot read the TPM's properties")?;
    // "IBM " and "SW   TPM" read as "IBM SW TPM".
    let maker = format!("{} {}", info.manufacturer, info.vendor)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let describe = format!("{} ({maker}, firmware {})", opener.tcti, info.firmware);
    Ok(TpmBackend::new(opener, tpm, describe))
}

/// SIGTERM or SIGINT.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot handle SIGTERM/SIGINT; stop bcd helper with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("stopping on SIGTERM"),
        _ = int.recv() => tracing::info!("stopping on SIGINT"),
    }
}
