//! Where `bcd helper` listens: the socket systemd passed (socket
//! activation: `LISTEN_PID` is this process, `LISTEN_FDS` is 1, the socket
//! is descriptor 3), else `[helper] socket`, bound here: a stale socket
//! file is replaced, the new one is `0660`, group the node user's primary
//! group, so only root and that group can even connect; the peer's uid is
//! checked on every connection regardless.
//!
//! sd_listen_fds is these few lines; a crate for it would bring more than
//! it saves.
use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, PermissionsExt as _};
use std::os::unix::io::FromRawFd as _;
use std::path::Path;

use anyhow::{bail, Context as _};
use tokio::net::UnixListener;

/// The first descriptor systemd passes (SD_LISTEN_FDS_START).
const LISTEN_FDS_START: i32 = 3;

/// The listener systemd passed, if it passed one to this process.
pub fn activated() -> anyhow::Result<Option<UnixListener>> {
    let for_us = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        == Some(std::process::id());
    if !for_us {
        return Ok(None);
    }
    let fds = std::env::var("LISTEN_FDS").unwrap_or_default();
    if fds != "1" {
        bail!("systemd passed LISTEN_FDS={fds:?}; bcd helper takes exactly one socket");
    }
    // Our children are not socket-activated.
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(var);
    }
    // SAFETY: systemd hands this process descriptor 3 (LISTEN_PID checked
    // above) and nothing else in bcd opens or owns it.
    let std_listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(LISTEN_FDS_START) };
    std_listener
        .set_nonblocking(true)
        .context("systemd's socket (descriptor 3) is not a unix socket")?;
    Ok(Some(
        UnixListener::from_std(std_listener).context("cannot use systemd's socket")?,
    ))
}

/// Binds `path` for the user whose primary group is `gid`.
pub fn bind(path: &Path, gid: u32) -> anyhow::Result<UnixListener> {
    // /run/bcd comes from the package's tmpfiles.d; made here when run without it.
    if let Some(parent) = path.parent().filter(|p| !p.exists()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)
            .with_context(|| format!("cannot remove the stale socket {}", path.display()))?,
        Ok(_) => bail!(
            "{} exists and is not a socket: refusing to replace it",
            path.display()
        ),
        Err(_) => {}
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    std::os::unix::fs::chown(path, Some(0), Some(gid))
        .with_context(|| format!("cannot give {} to the node's group", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("cannot chmod {}", path.display()))?;
    Ok(listener)
}
