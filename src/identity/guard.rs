//! What bcd trusts in its data directory: a directory and files of its own
//! user that nobody else can write, and no symbolic link.
//!
//! bcd runs as root today (and its data directory holds the node key), so a
//! link planted in the directory would make it read or write wherever the
//! link points, and a directory that another user can write is one where
//! such a link can be planted. Every file is therefore opened with
//! `O_NOFOLLOW` and checked on the open descriptor (no race between the
//! check and the use), and a directory or file that another user owns or
//! that group or others can write is refused with what to fix.
//!
//! The data directory itself may be a link (an operator's `/var/lib/bcd ->
//! /srv/bcd`): only root can plant one there. What it points to is checked.
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use bc_wire::file::{open_regular, read_opened, FileError, Links};
use std::path::Path;
use std::sync::OnceLock;

/// The modes of what bcd keeps in its data directory: its own, private.
pub(crate) const DIR_MODE: u32 = 0o700;
pub(crate) const FILE_MODE: u32 = 0o600;

/// This process's effective uid, read once from `/proc/self/status`; None
/// when it cannot be read (no procfs), and then ownership is not checked.
pub(crate) fn effective_uid() -> Option<u32> {
    static EUID: OnceLock<Option<u32>> = OnceLock::new();
    *EUID.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        parse_euid(&status)
    })
}

/// Under `[helper]` the data directory belongs to the node's user while
/// root still runs `bcd join`, `bcd status` and `bcd doctor` on it: set once,
/// that user's files are trusted too (the other checks stay).
static ALSO_TRUSTED: OnceLock<u32> = OnceLock::new();

/// Trusts `uid`'s files as well as this process's own (see [`ALSO_TRUSTED`]).
pub fn trust_owner(uid: u32) {
    let _ = ALSO_TRUSTED.set(uid);
}

/// `Uid:\t<real>\t<effective>\t<saved>\t<fs>`.
pub(crate) fn parse_euid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Refuses a data directory that is not a directory, belongs to another
/// user or that group or others can write. A missing one is `NotFound`.
pub(crate) fn check_dir(dir: &Path) -> io::Result<()> {
    let meta = std::fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(refused(dir, "is not a directory".to_owned()));
    }
    check_owner_and_mode(dir, &meta, "700")
}

/// Opens `path` (a file in the data directory) for reading, refusing a
/// link, anything but a regular file, and a file another user owns or
/// group or others can write; with the descriptor's metadata. Opened as
/// [`bc_wire::file::open_regular`] opens (no link followed, a FIFO does
/// not block), then the owner and mode checked.
fn open_checked(path: &Path) -> io::Result<(File, Metadata)> {
    let (file, meta) = open_regular(path, Links::Refuse).map_err(|e| match e {
        FileError::Link => refused(path, LINK_REFUSED.to_owned()),
        FileError::NotRegular(_) => refused(path, "is not a regular file".to_owned()),
        e => e.into(),
    })?;
    check_file(path, &meta)?;
    Ok((file, meta))
}

/// Reads a private file whole; larger than `limit` bytes is refused (no
/// file bcd writes comes near it, so a bigger one is not bcd's).
pub(crate) fn read_private(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let (file, meta) = open_checked(path)?;
    read_opened(file, &meta, limit).map_err(|e| match e {
        FileError::TooLarge(_) => refused(
            path,
            format!("is larger than {limit} bytes: not a file bcd wrote"),
        ),
        e => e.into(),
    })
}

/// Creates `path` (0600) if it is not there, without following a link, and
/// checks it like [`read_private`]: for a file another library then opens
/// by name (SQLite), after it is known to be bcd's own.
pub(crate) fn create_private(path: &Path) -> io::Result<()> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| link_refused(path, e))?;
    check_file(path, &file.metadata()?)
}

fn check_file(path: &Path, meta: &Metadata) -> io::Result<()> {
    if !meta.is_file() {
        return Err(refused(path, "is not a regular file".to_owned()));
    }
    check_owner_and_mode(path, meta, "600")
}

fn check_owner_and_mode(path: &Path, meta: &Metadata, want: &str) -> io::Result<()> {
    if let Some(uid) = effective_uid() {
        if meta.uid() != uid && ALSO_TRUSTED.get() != Some(&meta.uid()) {
            return Err(refused(
                path,
                format!(
                    "is owned by uid {}, but bcd runs as uid {uid}: give it to bcd's user (chown {uid} {}) or run bcd as its owner",
                    meta.uid(),
                    path.display()
                ),
            ));
        }
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(refused(
            path,
            format!(
                "is writable by group or others (mode {mode:04o}): chmod {want} {}",
                path.display()
            ),
        ));
    }
    Ok(())
}

const LINK_REFUSED: &str =
    "is a symbolic link, and bcd follows no link in its data directory: remove it";

fn link_refused(path: &Path, e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        refused(path, LINK_REFUSED.to_owned())
    } else {
        e
    }
}

fn refused(path: &Path, what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{} {what}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn reads_the_effective_uid() {
        assert_eq!(
            parse_euid("Name:\tbcd\nUid:\t1000\t0\t0\t0\nGid:\t1\t1\t1\t1\n"),
            Some(0)
        );
        assert_eq!(parse_euid("Name:\tbcd\n"), None);
        assert!(effective_uid().is_some());
    }

    #[test]
    fn links_loose_modes_and_big_files_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        chmod(dir, 0o700);
        check_dir(dir).unwrap();
        let target = dir.join("target");
        fs::write(&target, b"x").unwrap();
        chmod(&target, 0o600);
        assert_eq!(read_private(&target, 10).unwrap(), b"x");

        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for e in [
            read_private(&link, 10).unwrap_err(),
            create_private(&link).unwrap_err(),
        ] {
            assert!(e.to_string().contains("is a symbolic link"), "{e}");
        }
        let dangling = dir.join("dangling");
        std::os::unix::fs::symlink(dir.join("nothing"), &dangling).unwrap();
        assert!(create_private(&dangling).is_err());
        assert!(!dir.join("nothing").exists(), "nothing created through it");

        assert!(read_private(&target, 0)
            .unwrap_err()
            .to_string()
            .contains("larger than 0 bytes"));
        chmod(&target, 0o620);
        let e = read_private(&target, 10).unwrap_err().to_string();
        assert!(
            e.ends_with(&format!("(mode 0620): chmod 600 {}", target.display())),
            "{e}"
        );

        chmod(dir, 0o770);
        let e = check_dir(dir).unwrap_err().to_string();
        assert!(
            e.contains("writable by group or others (mode 0770): chmod 700"),
            "{e}"
        );
        chmod(dir, 0o755);
        check_dir(dir).unwrap();
        assert_eq!(
            check_dir(&target).unwrap_err().to_string(),
            format!("{} is not a directory", target.display())
        );
        assert_eq!(
            check_dir(&dir.join("missing")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
