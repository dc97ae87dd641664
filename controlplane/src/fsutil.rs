//! Atomic file writes: a crash at any point leaves either the old file or the
//! complete new one, never a torn key or certificate. And the bounded read of
//! a CA bundle, which the store (`[database] ca_file`) and the EK services
//! both read.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Writes `data` to `path` through a temporary file in the same directory:
/// create with `mode`, write, fsync, rename over `path`, fsync the directory.
/// The mode is set at creation so a private key is never readable by others,
/// not even for an instant.
pub(crate) fn write_atomic(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "path has no parent directory")
    })?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    // A leftover from a crashed earlier write is ours to replace.
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        // The umask may have narrowed the mode; never widened, but be exact.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.write_all(data)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Creates `dir` (and its parents) if needed and makes it 0700: it holds
/// private keys.
pub(crate) fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let meta = fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a directory",
        ));
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

/// Largest CA bundle read (a distribution's is ~200 KiB).
const MAX_CA_BUNDLE: u64 = 8 << 20;

/// A PEM bundle of CAs (`[tpm.ek_services] ca_bundle`, the system's):
/// a regular file, links followed (distributions link theirs), bounded.
pub(crate) fn read_ca_bundle(path: &Path) -> Result<Vec<u8>, bc_wire::file::FileError> {
    bc_wire::file::read_regular(path, MAX_CA_BUNDLE, bc_wire::file::Links::Follow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_with_mode_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.pem");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(!dir.path().join(".k.pem.tmp").exists());
    }
}
