//! Mounting the filesystems of a deployed disk (`deploy.image` writes its
//! seed on one, `boot.kexec` reads a kernel from one): each partition the
//! kernel shows for it, then the whole disk, tried with each block
//! filesystem type the kernel knows (`/proc/filesystems`), mounted under
//! the data directory and unmounted after.
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use super::{disk, read_small, Machine};

/// Runs `f` on each filesystem of `dev` in turn (mounted read-only when
/// `read_only`) until it answers `Some`; that answer and the device it came
/// from (`/dev/vda1`). `None` when no filesystem did.
pub(super) fn each_filesystem<T>(
    machine: &Machine,
    dev: &str,
    read_only: bool,
    mut f: impl FnMut(&Path) -> Option<T>,
) -> Result<Option<(String, T)>, String> {
    let types = fs_types(machine);
    let dir = machine.sysfs.join("block").join(dev);
    let mut names = disk::partitions(&dir);
    names.sort();
    names.push(dev.to_owned());
    // One directory per call: kinds run up to four at once.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let at = machine
        .data_dir
        .join(format!("deploy-mnt-{}-{n}", std::process::id()));
    for name in names {
        let source = machine.devfs.join(&name);
        let Some(mounted) = Mounted::try_new(&source, &at, &types, read_only)? else {
            continue;
        };
        let answer = f(&mounted.at);
        mounted.unmount()?;
        if let Some(a) = answer {
            return Ok(Some((format!("/dev/{name}"), a)));
        }
    }
    Ok(None)
}

/// The block filesystem types the kernel has (not `nodev` ones).
fn fs_types(machine: &Machine) -> Vec<String> {
    let text = read_small(&machine.procfs.join("filesystems")).unwrap_or_default();
    let mut types: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with("nodev"))
        .map(|l| l.trim().to_owned())
        .filter(|t| !t.is_empty())
        .collect();
    if types.is_empty() {
        types = ["ext4", "xfs", "btrfs", "vfat"].map(String::from).to_vec();
    }
    types
}

struct Mounted {
    at: PathBuf,
    done: bool,
}

fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| format!("{}: a NUL in the path", p.display()))
}

impl Mounted {
    /// `source` mounted at `at` with the first type that takes it; `None`
    /// when none does (not a filesystem).
    fn try_new(
        source: &Path,
        at: &Path,
        types: &[String],
        read_only: bool,
    ) -> Result<Option<Mounted>, String> {
        if !source.exists() {
            return Ok(None);
        }
        std::fs::create_dir_all(at).map_err(|e| format!("cannot create {}: {e}", at.display()))?;
        let (src, target) = (cstr(source)?, cstr(at)?);
        let flags = libc::MS_NOSUID
            | libc::MS_NODEV
            | libc::MS_NOEXEC
            | if read_only { libc::MS_RDONLY } else { 0 };
        for t in types {
            let Ok(fstype) = CString::new(t.as_str()) else {
                continue;
            };
            // SAFETY: NUL-terminated strings alive for the call; no data.
            let r = unsafe {
                libc::mount(
                    src.as_ptr(),
                    target.as_ptr(),
                    fstype.as_ptr(),
                    flags,
                    std::ptr::null(),
                )
            };
            if r == 0 {
                return Ok(Some(Mounted {
                    at: at.to_owned(),
                    done: false,
                }));
            }
        }
        let _ = std::fs::remove_dir(at);
        Ok(None)
    }

    fn unmount(mut self) -> Result<(), String> {
        self.done = true;
        umount(&self.at)
    }
}

fn umount(at: &Path) -> Result<(), String> {
    let target = cstr(at)?;
    // SAFETY: a NUL-terminated path alive for the call.
    if unsafe { libc::umount2(target.as_ptr(), 0) } != 0 {
        return Err(format!(
            "cannot unmount {}: {}",
            at.display(),
            std::io::Error::last_os_error()
        ));
    }
    let _ = std::fs::remove_dir(at);
    Ok(())
}

impl Drop for Mounted {
    /// A panic or an early return never leaves the image mounted.
    fn drop(&mut self) {
        if !self.done {
            let _ = umount(&self.at);
        }
    }
}
