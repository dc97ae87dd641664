//! Under `[helper]` the node runs as its own user, so `bcd join` (root)
//! leaves the data directory and every file in it to that user: the
//! directory 0700, the files 0600. Each file is opened without following
//! links and changed through its descriptor, so nothing planted in the
//! directory redirects root's chown or chmod elsewhere.
use std::fs::OpenOptions;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

/// Gives `dir` and the regular files in it to `uid`:`gid`; links and
/// anything else are left alone.
pub fn hand_over(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
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
