//! The TCG event log the firmware and the kernel left
//! (`/sys/kernel/security/tpm0/binary_bios_measurements`), sent in a tpm
//! join's round 2 when the node's pool has a boot policy: the control plane
//! replays it against the quote and judges what booted.
//!
//! Read as it is, unparsed (the control plane parses it, bounded), at most
//! [`bc_wire::tpm::MAX_EVENT_LOG`] bytes. Only root can read it; a
//! `failpoints` build reads it under `BCD_SYSFS_ROOT` when set (the e2e
//! tests give the agent a real log of their choosing).

use std::io::Read;
use std::path::{Path, PathBuf};

/// Where the kernel exposes the log, under the sysfs root.
pub(crate) const LOG_PATH: &str = "kernel/security/tpm0/binary_bios_measurements";

/// Why the log could not be sent: the message says what to do.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EventLogError {
    #[error("the control plane's boot policy for this node's pool needs the TCG event log, and {path} does not exist: boot with UEFI firmware and its TPM 2.0 enabled, start the kernel through its EFI stub (only that hands it the firmware's log: Debian 12's grub does with Secure Boot on, and off only with `linuxefi` in grub.cfg), and mount securityfs (mount -t securityfs securityfs /sys/kernel/security)")]
    Missing { path: PathBuf },
    #[error("the control plane's boot policy for this node's pool needs the TCG event log, and {path} cannot be read ({source}): run the join as root")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the TCG event log {path} is larger than {max} bytes: the control plane would refuse it"
    )]
    TooLarge { path: PathBuf, max: usize },
}

/// The log of this machine (or of `BCD_SYSFS_ROOT`'s in a test build).
pub(crate) fn read() -> Result<Vec<u8>, EventLogError> {
    read_under(&super::claims::sysfs_root())
}

/// The log under a sysfs root, at most [`bc_wire::tpm::MAX_EVENT_LOG`] bytes.
pub(crate) fn read_under(root: &Path) -> Result<Vec<u8>, EventLogError> {
    let path = root.join(LOG_PATH);
    let max = bc_wire::tpm::MAX_EVENT_LOG;
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(EventLogError::Missing { path })
        }
        Err(source) => return Err(EventLogError::Unreadable { path, source }),
    };
    let mut bytes = Vec::new();
    // securityfs reports size 0: read to the end, one byte past the bound.
    if let Err(source) = file.take(max as u64 + 1).read_to_end(&mut bytes) {
        return Err(EventLogError::Unreadable { path, source });
    }
    if bytes.len() > max {
        return Err(EventLogError::TooLarge { path, max });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_log_and_names_what_is_wrong() {
        let root = tempfile::tempdir().unwrap();
        let e = read_under(root.path()).unwrap_err();
        assert!(matches!(e, EventLogError::Missing { .. }), "{e}");
        assert!(e.to_string().contains("securityfs"), "{e}");
        assert!(e.to_string().contains("EFI stub"), "{e}");
        let path = root.path().join(LOG_PATH);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"log").unwrap();
        assert_eq!(read_under(root.path()).unwrap(), b"log");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(bc_wire::tpm::MAX_EVENT_LOG as u64 + 1).unwrap();
        let e = read_under(root.path()).unwrap_err();
        assert!(matches!(e, EventLogError::TooLarge { .. }), "{e}");
    }
}
