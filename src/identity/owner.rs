//! Under `[helper]` the node runs as its own user, so `bcd join` (root)
//! leaves the data directory and every file in it to that user: the
//! directory 0700, the files 0600. Each file is opened without following
//! links and changed through its descriptor, so nothing planted in the
//! directory redirects root's chown or chmod elsewhere.
//!
//! The node user's ids and the trust in its files ([`trust_node_user`]) are
//! here too: every subcommand that runs as root under `[helper]` needs them.
use std::fs::OpenOptions;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

use anyhow::anyhow;

use crate::config::Config;

/// Gives `dir` and the regular files in it to `uid`:`gid`; links and
/// anything else are left alone.
pub(crate) fn hand_over(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let open = |path: &Path, flags: i32| {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | flags)
            .open(path)
    };
    let d = open(dir, libc::O_DIRECTORY)?;
    std::os::unix::fs::fchown(&d, Some(uid), Some(gid))?;
    d.set_permissions(std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Ok(f) = open(&path, libc::O_NONBLOCK) else {
            continue; // a link, or gone
        };
        if !f.metadata()?.is_file() {
            continue;
        }
        std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// Under `[helper]`, run as root: the node user's files in the data
/// directory are trusted too (see [`super::guard::trust_owner`]);
/// the node user's ids, for handing the directory over.
pub(crate) fn trust_node_user(config: &Config) -> anyhow::Result<Option<(u32, u32)>> {
    let Some(settings) = &config.helper else {
        return Ok(None);
    };
    let (uid, gid) = user_ids(&settings.user)?;
    super::guard::trust_owner(uid);
    Ok(Some((uid, gid)))
}

/// The uid and primary gid of `user`.
pub(crate) fn user_ids(user: &str) -> anyhow::Result<(u32, u32)> {
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Ok((u.uid.as_raw(), u.gid.as_raw())),
        Ok(None) => Err(anyhow!(
            "[helper] user {user:?} does not exist (the package's sysusers.d makes \"bcd\")"
        )),
        Err(e) => Err(anyhow!("cannot look up [helper] user {user:?}: {e}")),
    }
}
