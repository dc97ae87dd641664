//! Where `bcd helper` listens: the socket systemd passed (socket
//! activation: `LISTEN_PID` is this process, `LISTEN_FDS` is 1, the socket
//! is descriptor 3), else `[helper] socket`, bound here: in a directory
//! only root may write (else refused), a stale socket file is replaced, the
//! new one is born `0660`, group the node user's primary group, so only
//! root and that group can even connect; the peer's uid is checked on every
//! connection regardless.
//!
//! sd_listen_fds is these few lines; a crate for it would bring more than
//! it saves.
#[cfg(test)]
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _};
use std::os::unix::io::FromRawFd as _;
use std::path::Path;

use anyhow::{bail, Context as _};
use tokio::net::UnixListener;

/// The first descriptor systemd passes (SD_LISTEN_FDS_START).
const LISTEN_FDS_START: i32 = 3;

/// The listener systemd passed, if it passed one to this process.
pub(super) fn activated() -> anyhow::Result<Option<UnixListener>> {
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
///
/// A socket directory someone else may write to would let them swap the
/// fresh socket for a symlink between bind and chown: such a directory is
/// refused, the socket is born `0660` (bound under a umask, no chmod) and
/// its group is set without following a symlink.
pub(super) fn bind(path: &Path, gid: u32) -> anyhow::Result<UnixListener> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        bail!("[helper] socket {} names no file", path.display());
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    // /run/bcd comes from the package's tmpfiles.d; made here when run without it.
    if !parent.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let dir = parent
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", parent.display()))?;
    check_dir(&dir)?;
    let path = dir.join(name);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(&path)
            .with_context(|| format!("cannot remove the stale socket {}", path.display()))?,
        Ok(_) => bail!(
            "{} exists and is not a socket: refusing to replace it",
            path.display()
        ),
        Err(_) => {}
    }
    let listener = bind_with_mode(&path)?;
    give_to_group(&path, gid)?;
    Ok(listener)
}

/// Binds under umask 0117, so the socket is `0660` from its first moment
/// (the umask is the process's; bcd helper has no other thread yet).
fn bind_with_mode(path: &Path) -> anyhow::Result<UnixListener> {
    use nix::sys::stat::{umask, Mode};
    let before = umask(Mode::from_bits_truncate(0o117));
    let bound = UnixListener::bind(path);
    umask(before);
    bound.with_context(|| format!("cannot listen on {}", path.display()))
}

/// root:`gid` on `path` itself: a symlink there is changed (and then
/// refused by the check after it), never what it points to.
fn give_to_group(path: &Path, gid: u32) -> anyhow::Result<()> {
    std::os::unix::fs::lchown(path, Some(0), Some(gid))
        .with_context(|| format!("cannot give {} to the node's group", path.display()))?;
    let m = std::fs::symlink_metadata(path)
        .with_context(|| format!("cannot stat {}", path.display()))?;
    if !m.file_type().is_socket() {
        bail!(
            "{} was replaced by something that is not a socket after it was bound",
            path.display()
        );
    }
    Ok(())
}

/// Refuses a socket directory that is not root's or that group or others
/// may write to, and ancestors like it (a root-owned sticky one such as
/// /tmp is fine: nobody else can rename what root made in it).
fn check_dir(dir: &Path) -> anyhow::Result<()> {
    for (i, d) in dir.ancestors().enumerate() {
        let m = std::fs::metadata(d).with_context(|| format!("cannot stat {}", d.display()))?;
        let writable = m.mode() & 0o022 != 0;
        let sticky = m.mode() & 0o1000 != 0;
        if m.uid() != 0 {
            bail!(
                "refusing the socket directory {}: {} is owned by uid {}, not root (another user could replace the socket)",
                dir.display(),
                d.display(),
                m.uid()
            );
        }
        if writable && (i == 0 || !sticky) {
            bail!(
                "refusing the socket directory {}: {} is writable by {} (mode {:o}; another user could replace the socket): use a directory only root can write, such as /run/bcd",
                dir.display(),
                d.display(),
                if m.mode() & 0o002 != 0 { "others" } else { "its group" },
                m.mode() & 0o7777
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// A root-owned 0755 directory under a fresh temporary one.
    fn dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn binds_0660_for_the_group_in_a_root_directory() {
        if !root() {
            eprintln!("skipped: needs root");
            return;
        }
        let d = dir();
        let path = d.path().join("helper.sock");
        let _l = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async { bind(&path, 1) })
            .unwrap();
        let m = std::fs::symlink_metadata(&path).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (0, 1, 0o660));
    }

    #[test]
    fn a_directory_others_or_the_group_may_write_is_refused() {
        if !root() {
            eprintln!("skipped: needs root");
            return;
        }
        for mode in [0o777, 0o775, 0o1777] {
            let d = dir();
            std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            let path = d.path().join("helper.sock");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let err = rt.block_on(async { bind(&path, 1) }).unwrap_err();
            let text = format!("{err:#}");
            assert!(
                text.contains("refusing the socket directory")
                    && text.contains(&d.path().canonicalize().unwrap().display().to_string()),
                "{mode:o}: {text}"
            );
            assert!(!path.exists(), "nothing bound");
        }
    }

    #[test]
    fn a_directory_not_roots_is_refused() {
        if !root() {
            eprintln!("skipped: needs root");
            return;
        }
        let d = dir();
        let sub = d.path().join("user");
        std::fs::create_dir(&sub).unwrap();
        std::os::unix::fs::chown(&sub, Some(1), Some(1)).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700)).unwrap();
        let err = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async { bind(&sub.join("helper.sock"), 1) })
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("owned by uid 1, not root"), "{text}");
        assert!(text.contains(&sub.display().to_string()), "{text}");
    }

    #[test]
    fn a_symlink_in_place_of_the_socket_is_never_followed() {
        if !root() {
            eprintln!("skipped: needs root");
            return;
        }
        let d = dir();
        let target = d.path().join("secret");
        std::fs::write(&target, "root's").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = d.path().join("helper.sock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        // Before bind: refused, the link left alone.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt.block_on(async { bind(&link, 1) }).unwrap_err();
        assert!(format!("{err:#}").contains("is not a socket"), "{err:#}");
        // Swapped in after bind: the ownership step changes the link, not
        // its target, and says so.
        let err = give_to_group(&link, 1).unwrap_err();
        assert!(format!("{err:#}").contains("was replaced"), "{err:#}");
        let t = std::fs::metadata(&target).unwrap();
        assert_eq!((t.uid(), t.gid(), t.mode() & 0o777), (0, 0, 0o600));
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
    }
}
