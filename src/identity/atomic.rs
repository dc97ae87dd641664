//! Private files, replaced atomically.
//!
//! A crash at any point must leave either the old file or the new one, never
//! a torn one, and a secret must never exist with a loose mode, not even for
//! the instant between create and chmod.
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::guard::{check_dir, DIR_MODE, FILE_MODE};

/// Creates `dir` (and missing parents) with mode 0700. An existing one must
/// pass [`super::guard::check_dir`] (bcd's own, nobody else can write it);
/// one that group or others can still read is tightened to 0700.
pub(crate) fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)?;
    check_dir(dir)?;
    let mode = fs::metadata(dir)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        tracing::warn!(dir = %dir.display(), mode = format!("{mode:o}"), "data directory was reachable by others; setting it to 0700");
        fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))?;
    }
    Ok(())
}

/// Replaces `dir/name` with `contents`: a temporary file in the same
/// directory (mode 0600 from creation), fsync, rename, fsync the directory.
pub(crate) fn write_atomic(dir: &Path, name: &str, contents: &[u8]) -> io::Result<()> {
    let (tmp_path, mut file) = create_temp(dir, name)?;
    let written = file
        .write_all(contents)
        .and_then(|()| file.sync_all())
        .and_then(|()| fs::rename(&tmp_path, dir.join(name)));
    if let Err(e) = written {
        // Best effort: the temp file is ours and useless now.
        let _ = fs::remove_file(&tmp_path);
        return Err(e);
    }
    sync_dir(dir)
}

fn create_temp(dir: &Path, name: &str) -> io::Result<(std::path::PathBuf, File)> {
    let pid = std::process::id();
    let mut last = None;
    for n in 0..16u32 {
        let path = dir.join(format!(".{name}.tmp-{pid}-{n}"));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(&path)
        {
            Ok(f) => return Ok((path, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free temporary file name")))
}

/// Makes a rename in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The permission bits of `path` that group or others hold, if any.
pub(crate) fn loose_bits(path: &Path) -> Option<u32> {
    let mode = fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then_some(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_0600_and_replaces() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        ensure_private_dir(&dir).unwrap();
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        write_atomic(&dir, "f", b"one").unwrap();
        write_atomic(&dir, "f", b"two").unwrap();
        assert_eq!(fs::read(dir.join("f")).unwrap(), b"two");
        assert_eq!(
            fs::metadata(dir.join("f")).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("f")],
            "no temporary file left"
        );
    }

    #[test]
    fn tightens_a_readable_dir_refuses_a_writable_one() {
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(loose_bits(tmp.path()), Some(0o755));
        ensure_private_dir(tmp.path()).unwrap();
        assert_eq!(loose_bits(tmp.path()), None);
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o773)).unwrap();
        let e = ensure_private_dir(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("writable by group or others (mode 0773)"), "{e}");
    }
}
