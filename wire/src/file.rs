//! Reading a file an operator named (a setting, a command-line path, a
//! directory's entries): both binaries read such files, and each one must
//! finish promptly and within a bound, whatever the name turns out to be.
//!
//! A plain `std::fs::read` blocks for ever on a FIFO and reads a link to
//! `/dev/zero` until memory runs out; a size check on `metadata()` sees only
//! regular files. So the file is checked by name first (a device or FIFO is
//! never even opened), opened without blocking (and, where asked, without
//! following a link), checked again on the open descriptor (no race with a
//! rename in between), and read at most `cap + 1` bytes, so that a larger
//! file is refused rather than cut.

use std::fs::{File, FileType, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Whether the named path may be a symbolic link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Links {
    /// Read what the link points to, if it is a regular file: for settings
    /// that name a file another tool maintains (a distribution's CA bundle,
    /// a mounted secret), which are links by design.
    Follow,
    /// Refuse a link: the file is read only as itself (`ek-roots add`, whose
    /// directories mix files and links to them; `[tpm] ek_certificate`).
    Refuse,
}

/// Why a named file was not read. Its text names no path: callers put the
/// path in front (`{path}: {error}`).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read it: {0}")]
    Io(#[source] io::Error),
    #[error("it is a symbolic link, which is not followed here: name the file itself")]
    Link,
    #[error("it is a {0}, not a regular file")]
    NotRegular(&'static str),
    #[error("it is larger than {0} bytes")]
    TooLarge(u64),
}

/// For callers whose errors carry an `io::Error`: the I/O error itself, or
/// the refusal as its text.
impl From<FileError> for io::Error {
    fn from(e: FileError) -> io::Error {
        match e {
            FileError::Io(e) => e,
            e => io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
        }
    }
}

impl FileError {
    /// The path names nothing (for files that are optional).
    pub fn is_not_found(&self) -> bool {
        matches!(self, FileError::Io(e) if e.kind() == io::ErrorKind::NotFound)
    }
}

/// Opens `path` for reading if it is a regular file: checked by name, then
/// on the descriptor, which is opened with `O_NONBLOCK` (a FIFO swapped in
/// after the first check does not block the open) and, under
/// [`Links::Refuse`], `O_NOFOLLOW`. The metadata is the descriptor's.
pub fn open_regular(path: &Path, links: Links) -> Result<(File, Metadata), FileError> {
    let named = match links {
        Links::Follow => std::fs::metadata(path),
        Links::Refuse => std::fs::symlink_metadata(path),
    }
    .map_err(FileError::Io)?;
    regular(named.file_type())?;
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
    if links == Links::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) if links == Links::Refuse => FileError::Link,
            _ => FileError::Io(e),
        })?;
    let meta = file.metadata().map_err(FileError::Io)?;
    regular(meta.file_type())?;
    Ok((file, meta))
}

/// Reads a regular file whole (see [`open_regular`]); more than `cap`
/// bytes is [`FileError::TooLarge`], however the file grew after its size
/// was checked.
pub fn read_regular(path: &Path, cap: u64, links: Links) -> Result<Vec<u8>, FileError> {
    let (file, meta) = open_regular(path, links)?;
    read_opened(file, &meta, cap)
}

/// The read of [`read_regular`], for a caller that checks the metadata of
/// what [`open_regular`] opened first (its mode, its owner).
pub fn read_opened(file: File, meta: &Metadata, cap: u64) -> Result<Vec<u8>, FileError> {
    if meta.len() > cap {
        return Err(FileError::TooLarge(cap));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0).saturating_add(1));
    file.take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(FileError::Io)?;
    if bytes.len() as u64 > cap {
        return Err(FileError::TooLarge(cap));
    }
    Ok(bytes)
}

fn regular(t: FileType) -> Result<(), FileError> {
    let what = if t.is_file() {
        return Ok(());
    } else if t.is_symlink() {
        return Err(FileError::Link);
    } else if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_socket() {
        "socket"
    } else {
        "special file"
    };
    Err(FileError::NotRegular(what))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn mkfifo(p: &Path) {
        let ok = std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .unwrap();
        assert!(ok.success());
    }

    #[test]
    fn only_regular_files_within_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("ok"), b"hello").unwrap();
        std::fs::write(d.join("big"), [0u8; 11]).unwrap();
        mkfifo(&d.join("fifo"));
        symlink("/dev/zero", d.join("zero")).unwrap();
        symlink(d.join("ok"), d.join("link")).unwrap();
        std::fs::create_dir(d.join("sub")).unwrap();

        let read = |name: &str, links| read_regular(&d.join(name), 10, links);
        assert_eq!(read("ok", Links::Refuse).unwrap(), b"hello");
        assert_eq!(read("link", Links::Follow).unwrap(), b"hello");
        let e = |name: &str, links| read(name, links).unwrap_err().to_string();
        assert_eq!(e("big", Links::Follow), "it is larger than 10 bytes");
        for links in [Links::Follow, Links::Refuse] {
            assert_eq!(e("fifo", links), "it is a FIFO, not a regular file");
            assert_eq!(e("sub", links), "it is a directory, not a regular file");
        }
        assert_eq!(
            e("zero", Links::Follow),
            "it is a character device, not a regular file"
        );
        assert!(e("zero", Links::Refuse).contains("symbolic link"));
        assert!(e("link", Links::Refuse).contains("symbolic link"));
        assert!(read("missing", Links::Follow).unwrap_err().is_not_found());
        assert!(!read("fifo", Links::Follow).unwrap_err().is_not_found());
    }
}
