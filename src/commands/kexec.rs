//! `boot.kexec` (the commissioning ramdisk only): boots the system
//! `deploy.image` put on a disk. It mounts the disk's filesystems read-only
//! until one has `/boot/vmlinuz-*`, loads the newest kernel (and its
//! `initrd.img-*`) with `kexec_file_load`, and once the command's result is
//! acknowledged by the control plane (or [`ACK_WAIT`] passed) reboots into
//! it. With `mode=reboot`, or when no kernel is found, it reboots through
//! the firmware instead (the boot entry being closed, the next PXE boot
//! falls through to the disk).
//!
//! The kernel's command line is `cmdline` if given, else `root=` what the
//! deployed system's `/etc/fstab` mounts on `/` (a `UUID=` or `PARTUUID=`
//! in the cloud images; right even when `/boot` is a filesystem of its
//! own), `rw`, and the `console=` entries of the ramdisk's own command line.
//!
//! In a `failpoints` build, `BCD_FAILPOINT=kexec-no-reboot` loads nothing
//! and logs `test build: would reboot` instead of rebooting, so that the
//! end-to-end tests see the result without the host going down.
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use bc_wire::agent::Role;
use bc_wire::command::args::Args;

use super::{disk, mount, read_small, Done, Machine};

/// How long the reboot waits for the result's acknowledgement.
pub(crate) const ACK_WAIT: Duration = Duration::from_secs(10);

/// The failpoint that keeps the host up.
const NO_REBOOT: &str = "kexec-no-reboot";

pub(super) fn kexec(machine: &Machine, id: &str, args: &Args) -> Done {
    if machine.role != Role::Ramdisk {
        return Done::failed(
            "refused: only the commissioning ramdisk reboots into a deployed system",
        );
    }
    let Some(device) = args.get("disk") else {
        return Done::failed("bad-args: disk is required");
    };
    let dev = device.strip_prefix("/dev/").unwrap_or(device);
    if let Err(why) = disk::check(machine, dev) {
        return Done::failed(format!("refused: {device}: {why}"));
    }
    if args.get("mode") == Some("reboot") {
        after_ack(id, How::Firmware);
        return Done::ok("rebooting through the firmware", b"{\"mode\":\"reboot\"}");
    }
    let found = mount::each_filesystem(machine, dev, true, |root| {
        newest_kernel(root).map(|k| load(machine, root, &k, args.get("cmdline")))
    });
    match found {
        Err(e) => Done::failed(format!("cannot look for a kernel on {device}: {e}")),
        Ok(None) => {
            after_ack(id, How::Firmware);
            Done::ok(
                format!("no /boot/vmlinuz-* on {device}: rebooting through the firmware"),
                b"{\"mode\":\"reboot\"}",
            )
        }
        Ok(Some((_, Err(e)))) => Done::failed(e),
        Ok(Some((at, Ok(kernel)))) => {
            after_ack(id, How::Kexec);
            let output = serde_json::json!({"mode": "kexec", "from": at, "kernel": kernel});
            Done::ok(
                format!("{kernel} loaded from {at}: rebooting into it"),
                output.to_string().as_bytes(),
            )
        }
    }
}

/// The newest `boot/vmlinuz-<version>` under `root` (by version), and its
/// `boot/initrd.img-<version>` if there is one.
fn newest_kernel(root: &Path) -> Option<(PathBuf, Option<PathBuf>)> {
    let boot = root.join("boot");
    let mut versions: Vec<String> = std::fs::read_dir(&boot)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_prefix("vmlinuz-").map(str::to_owned))
        .filter(|v| boot.join(format!("vmlinuz-{v}")).is_file())
        .collect();
    versions.sort_by_key(|v| version_key(v));
    let v = versions.pop()?;
    let initrd = boot.join(format!("initrd.img-{v}"));
    Some((
        boot.join(format!("vmlinuz-{v}")),
        initrd.is_file().then_some(initrd),
    ))
}

/// `6.1.0-18-amd64` as numbers and words, so that 10 sorts after 9.
fn version_key(v: &str) -> Vec<(u64, String)> {
    let mut key = Vec::new();
    let mut rest = v;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 {
            key.push((rest[..digits].parse().unwrap_or(u64::MAX), String::new()));
            rest = &rest[digits..];
        } else {
            let word = rest.len() - rest.trim_start_matches(|c: char| !c.is_ascii_digit()).len();
            key.push((0, rest[..word].to_owned()));
            rest = &rest[word..];
        }
    }
    key
}

/// The deployed kernel's command line: `root=` the `/` of its fstab, `rw`,
/// and the ramdisk's `console=` entries.
fn default_cmdline(machine: &Machine, root: &Path) -> Result<String, String> {
    let fstab = std::fs::read_to_string(root.join("etc/fstab")).unwrap_or_default();
    let spec = fstab
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&"/")).then(|| f[0].to_owned())
        })
        .ok_or_else(|| {
            "the deployed system's /etc/fstab mounts nothing on /: give boot.kexec a cmdline"
                .to_owned()
        })?;
    let mut line = format!("root={spec} rw");
    let own = read_small(&machine.procfs.join("cmdline")).unwrap_or_default();
    for c in own.split_whitespace().filter(|w| w.starts_with("console=")) {
        line.push(' ');
        line.push_str(c);
    }
    Ok(line)
}

/// Loads the kernel for the next kexec; its name.
fn load(
    machine: &Machine,
    root: &Path,
    (kernel, initrd): &(PathBuf, Option<PathBuf>),
    cmdline: Option<&str>,
) -> Result<String, String> {
    let name = kernel
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let line = match cmdline {
        Some(c) => c.to_owned(),
        None => default_cmdline(machine, root)?,
    };
    if crate::failpoint::active(NO_REBOOT) {
        tracing::warn!(kernel = %name, cmdline = %line, "test build: the kernel is not loaded");
        return Ok(name);
    }
    let k = std::fs::File::open(kernel).map_err(|e| format!("cannot open {name}: {e}"))?;
    let i = match initrd {
        Some(p) => {
            Some(std::fs::File::open(p).map_err(|e| format!("cannot open {}: {e}", p.display()))?)
        }
        None => None,
    };
    let c = std::ffi::CString::new(line).map_err(|_| "the command line holds a NUL".to_owned())?;
    let flags: libc::c_ulong = if i.is_none() {
        KEXEC_FILE_NO_INITRAMFS
    } else {
        0
    };
    let initrd_fd = i.as_ref().map_or(-1, |f| f.as_raw_fd());
    // SAFETY: kexec_file_load(kernel_fd, initrd_fd, cmdline_len, cmdline,
    // flags): open descriptors and a NUL-terminated string (its length
    // counts the NUL), alive for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kexec_file_load,
            k.as_raw_fd(),
            initrd_fd,
            c.as_bytes_with_nul().len(),
            c.as_ptr(),
            flags,
        )
    };
    if r != 0 {
        return Err(format!(
            "kexec_file_load of {name} failed: {} (a kernel that does not allow kexec, or lockdown: use mode=reboot)",
            std::io::Error::last_os_error()
        ));
    }
    Ok(name)
}

/// linux/kexec.h.
const KEXEC_FILE_NO_INITRAMFS: libc::c_ulong = 0x4;

#[derive(Clone, Copy, Debug)]
enum How {
    Kexec,
    Firmware,
}

/// The command ids acknowledged since bcd started that a reboot waits for.
static ACKED: (Mutex<Vec<String>>, Condvar) = (Mutex::new(Vec::new()), Condvar::new());

/// The control plane acknowledged the result of command `id` (the channel
/// calls this for every acknowledgement).
pub(crate) fn acked(id: &str) {
    let (list, cv) = &ACKED;
    let mut l = list.lock().unwrap_or_else(|p| p.into_inner());
    if l.len() > 64 {
        l.remove(0);
    }
    l.push(id.to_owned());
    cv.notify_all();
}

/// Reboots, `how`, once command `id`'s result is acknowledged or
/// [`ACK_WAIT`] passed.
fn after_ack(id: &str, how: How) {
    let id = id.to_owned();
    let spawned = std::thread::Builder::new()
        .name("reboot".into())
        .spawn(move || {
            let (list, cv) = &ACKED;
            let l = list.lock().unwrap_or_else(|p| p.into_inner());
            let (l, waited) = cv
                .wait_timeout_while(l, ACK_WAIT, |l| !l.contains(&id))
                .unwrap_or_else(|p| p.into_inner());
            drop(l);
            if waited.timed_out() {
                tracing::warn!(
                    id,
                    "no acknowledgement of the result within 10 s; rebooting anyway"
                );
            }
            reboot(how);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the reboot thread; rebooting now");
        reboot(how);
    }
}

fn reboot(how: How) {
    if crate::failpoint::active(NO_REBOOT) {
        tracing::warn!(how = ?how, "test build: would reboot");
        return;
    }
    tracing::warn!(how = ?how, "rebooting");
    // SAFETY: sync(2) and reboot(2) take no pointers.
    unsafe {
        libc::sync();
        let cmd = match how {
            How::Kexec => libc::LINUX_REBOOT_CMD_KEXEC,
            How::Firmware => libc::LINUX_REBOOT_CMD_RESTART,
        };
        if libc::reboot(cmd) != 0 {
            tracing::error!(error = %std::io::Error::last_os_error(), "reboot failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_kernel_by_version() {
        let root = tempfile::tempdir().unwrap();
        let boot = root.path().join("boot");
        std::fs::create_dir_all(&boot).unwrap();
        assert_eq!(newest_kernel(root.path()), None);
        for f in [
            "vmlinuz-6.1.0-9-amd64",
            "vmlinuz-6.1.0-10-amd64",
            "initrd.img-6.1.0-10-amd64",
            "config-6.1.0-18-amd64",
        ] {
            std::fs::write(boot.join(f), b"x").unwrap();
        }
        let (k, i) = newest_kernel(root.path()).unwrap();
        assert_eq!(k, boot.join("vmlinuz-6.1.0-10-amd64"));
        assert_eq!(i, Some(boot.join("initrd.img-6.1.0-10-amd64")));
        std::fs::write(boot.join("vmlinuz-6.1.0-11-amd64"), b"x").unwrap();
        assert_eq!(
            newest_kernel(root.path()).unwrap().1,
            None,
            "no initrd for 11"
        );
    }

    #[test]
    fn the_default_command_line() {
        let root = tempfile::tempdir().unwrap();
        let machine = crate::commands::tests::machine(root.path());
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        std::fs::create_dir_all(&machine.procfs).unwrap();
        std::fs::write(
            machine.procfs.join("cmdline"),
            "console=tty0 bc.x=y console=ttyS0,115200 quiet\n",
        )
        .unwrap();
        assert!(default_cmdline(&machine, root.path()).is_err(), "no fstab");
        std::fs::write(
            root.path().join("etc/fstab"),
            "# comment\nPARTUUID=abc / ext4 rw,discard,errors=remount-ro 0 1\nPARTUUID=def /boot/efi vfat defaults 0 0\n",
        )
        .unwrap();
        assert_eq!(
            default_cmdline(&machine, root.path()).unwrap(),
            "root=PARTUUID=abc rw console=tty0 console=ttyS0,115200"
        );
    }
}
