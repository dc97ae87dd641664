//! `disk.wipe` (the commissioning ramdisk only): the named disks lose their
//! partition tables (the MBR, both GPT headers) and filesystem signatures,
//! are discarded where the device can, and are read back to confirm.
//!
//! Every device is checked before any is touched, and one that fails a
//! check stops the whole command (a mistyped list wipes nothing): it must
//! be a whole disk of the inventory (`/sys/block`, no loop or RAM disk), and
//! neither it nor a partition of it mounted, used as swap, or held by
//! another device (LVM, RAID, dm-crypt): what the ramdisk runs from is
//! mounted, so it is refused too. The device is then opened `O_EXCL`, which
//! the kernel refuses for a block device in use.
//!
//! What is erased: the first and the last MiB, zeroed and synced. That holds
//! the MBR and the primary GPT (LBA 0-33), the backup GPT (the last 33
//! LBAs), and the signatures blkid and wipefs look for (ext*, XFS, btrfs's
//! first superblock at 64 KiB, LVM, swap, ZFS's and md's labels at both
//! ends). Before that the whole device is discarded (`BLKDISCARD`) where it
//! supports it; a device that does not is reported so, not zeroed whole
//! (that can take longer than the kind's deadline).
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt as _, FileTypeExt as _, OpenOptionsExt as _};
use std::path::Path;

use bc_wire::agent::Role;
use serde::Serialize;

use super::{read_small, Done, Machine};

/// Zeroed at each end of a device.
const EDGE: u64 = 1 << 20;

// ioctl numbers of linux/fs.h: _IO(0x12, 119) and _IO(0x12, 95).
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKRRPART: libc::c_ulong = 0x125f;

#[derive(Serialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct Wiped {
    device: String,
    size_bytes: u64,
    /// `done`, or why not (`unsupported: …`, `not a block device`).
    discard: String,
    zeroed_bytes: u64,
    /// The zeroed ranges read back as zeros.
    verified: bool,
    pub(super) error: Option<String>,
}

pub(super) fn wipe(machine: &Machine, devices: &[&str]) -> Done {
    if machine.role != Role::Ramdisk {
        return Done::failed("refused: only the commissioning ramdisk wipes disks");
    }
    let mut names = Vec::new();
    for device in devices {
        let name = device.strip_prefix("/dev/").unwrap_or(device);
        if let Err(why) = check(machine, name) {
            return Done::failed(format!("refused: {device}: {why}; nothing was wiped"));
        }
        names.push(name);
    }
    let results: Vec<Wiped> = names.iter().map(|n| wipe_one(machine, n)).collect();
    let ok = results.iter().filter(|w| w.error.is_none()).count();
    let json = match serde_json::to_vec(&results) {
        Ok(j) => j,
        Err(e) => return Done::failed(format!("cannot encode the result: {e}")),
    };
    let mut done = Done::ok(format!("wiped {ok} of {}", results.len()), &json);
    if ok != results.len() {
        done.status = bc_wire::command_v1::Status::Failed;
    }
    done
}

/// Whether `name` may be wiped: a whole disk of the inventory, unused.
pub(super) fn check(machine: &Machine, name: &str) -> Result<(), String> {
    let block = machine.sysfs.join("block");
    let dir = block.join(name);
    if !dir.is_dir() || !super::inventory::disk(&block, name) {
        return Err("not a disk of this machine's inventory".into());
    }
    let parts = partitions(&dir);
    let mut majmins = Vec::new();
    majmins.extend(read_small(&dir.join("dev")));
    for p in &parts {
        majmins.extend(read_small(&dir.join(p).join("dev")));
    }
    if let Some(mounts) = read_small(&machine.procfs.join("self/mountinfo")) {
        for line in mounts.lines() {
            // `36 35 98:0 /mnt1 /mnt2 …`: the third field is the device.
            let fields: Vec<&str> = line.split_whitespace().collect();
            if let (Some(dev), Some(at)) = (fields.get(2), fields.get(4)) {
                if majmins.iter().any(|m| m == dev) {
                    return Err(format!("mounted at {at}"));
                }
            }
        }
    }
    let mut names: Vec<&str> = vec![name];
    names.extend(parts.iter().map(String::as_str));
    if let Some(swaps) = read_small(&machine.procfs.join("swaps")) {
        for line in swaps.lines().skip(1) {
            let swap = line.split_whitespace().next().unwrap_or_default();
            if names.iter().any(|n| swap == format!("/dev/{n}")) {
                return Err(format!("{swap} is swap"));
            }
        }
    }
    for n in &names {
        let holders_dir = if *n == name {
            dir.join("holders")
        } else {
            dir.join(n).join("holders")
        };
        let holders = super::inventory::names(&holders_dir);
        if !holders.is_empty() {
            return Err(format!("{n} is held by {}", holders.join(", ")));
        }
    }
    Ok(())
}

/// The partitions of the disk at `dir` (subdirectories with a `partition`
/// file).
pub(super) fn partitions(dir: &Path) -> Vec<String> {
    super::inventory::names(dir)
        .into_iter()
        .filter(|n| dir.join(n).join("partition").exists())
        .collect()
}

pub(super) fn wipe_one(machine: &Machine, name: &str) -> Wiped {
    let mut w = Wiped {
        device: format!("/dev/{name}"),
        ..Wiped::default()
    };
    if let Err(e) = erase(&machine.devfs.join(name), &mut w) {
        w.error = Some(e);
    }
    w
}

fn erase(path: &Path, w: &mut Wiped) -> Result<(), String> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_EXCL)
        .open(path)
        .map_err(|e| format!("cannot open {} exclusively: {e}", path.display()))?;
    let block = file
        .metadata()
        .map_err(|e| format!("cannot stat it: {e}"))?
        .file_type()
        .is_block_device();
    let size = size(&file).map_err(|e| format!("cannot find its size: {e}"))?;
    w.size_bytes = size;
    w.discard = match block {
        true => ioctl_range(&file, BLKDISCARD, 0, size)
            .map(|()| "done".to_owned())
            .unwrap_or_else(|e| format!("unsupported: {e}")),
        false => "not a block device".to_owned(),
    };
    let head = 0..size.min(EDGE);
    let tail = size.saturating_sub(EDGE).max(head.end)..size;
    let zeros = vec![0u8; usize::try_from(EDGE).unwrap_or(1 << 20)];
    for range in [&head, &tail] {
        let len = usize::try_from(range.end - range.start).unwrap_or(0);
        file.write_all_at(&zeros[..len], range.start)
            .map_err(|e| format!("cannot zero {}..{}: {e}", range.start, range.end))?;
        w.zeroed_bytes += range.end - range.start;
    }
    file.sync_all().map_err(|e| format!("cannot sync: {e}"))?;
    let mut back = vec![0u8; zeros.len()];
    for range in [&head, &tail] {
        let len = usize::try_from(range.end - range.start).unwrap_or(0);
        file.read_exact_at(&mut back[..len], range.start)
            .map_err(|e| format!("cannot read back {}..{}: {e}", range.start, range.end))?;
        if back[..len].iter().any(|b| *b != 0) {
            return Err(format!(
                "{}..{} did not read back as zeros",
                range.start, range.end
            ));
        }
    }
    w.verified = true;
    if block {
        reread_partitions(&file, &w.device);
    }
    Ok(())
}

/// The size of an open disk (or, in tests, of a file).
pub(super) fn size(mut file: &File) -> Result<u64, std::io::Error> {
    file.seek(SeekFrom::End(0))
}

/// Asks the kernel to re-read the partition table of `file` (a block
/// device; anything else is left alone). A failure (a device that cannot,
/// a partition still open) is logged: nothing on disk depends on it.
pub(super) fn reread_partitions(file: &File, device: &str) {
    use std::os::unix::fs::FileTypeExt as _;
    if !file
        .metadata()
        .is_ok_and(|m| m.file_type().is_block_device())
    {
        return;
    }
    if let Err(e) = ioctl_none(file, BLKRRPART) {
        tracing::warn!(device, error = %e, "the kernel did not re-read the partition table");
    }
}

fn ioctl_range(
    file: &File,
    request: libc::c_ulong,
    start: u64,
    len: u64,
) -> Result<(), std::io::Error> {
    use std::os::fd::AsRawFd as _;
    let range = [start, len];
    // SAFETY: BLKDISCARD reads two u64 (start, length) from the pointer,
    // which points at `range`, alive for the call; the descriptor is open.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), request, range.as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn ioctl_none(file: &File, request: libc::c_ulong) -> Result<(), std::io::Error> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: BLKRRPART takes no argument; the descriptor is open.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), request) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// A ramdisk whose "disks" are files in a temporary directory: vda
    /// (3 MiB, a partition), vdb (mounted through its partition), vdc
    /// (held by a dm device), and no real device anywhere.
    fn ramdisk(root: &Path) -> Machine {
        let sys = root.join("sys");
        let proc = root.join("proc");
        let dev = root.join("dev");
        for (name, majmin) in [("vda", "252:0"), ("vdb", "252:16"), ("vdc", "252:32")] {
            write(&sys, &format!("block/{name}/dev"), &format!("{majmin}\n"));
            std::fs::create_dir_all(sys.join(format!("block/{name}/holders"))).unwrap();
        }
        write(&sys, "block/vda/vda1/partition", "1\n");
        write(&sys, "block/vda/vda1/dev", "252:1\n");
        write(&sys, "block/vdb/vdb1/partition", "1\n");
        write(&sys, "block/nvme0c0n1/dev", "259:1\n");
        write(&sys, "block/nvme0c0n1/hidden", "1\n");
        write(&sys, "block/vdb/vdb1/dev", "252:17\n");
        std::fs::create_dir_all(sys.join("block/vdc/holders/dm-0")).unwrap();
        write(
            &proc,
            "self/mountinfo",
            "22 1 0:21 / / rw - rootfs rootfs rw\n36 22 252:17 / /mnt rw - ext4 /dev/vdb1 rw\n",
        );
        write(&proc, "swaps", "Filename Type Size Used Priority\n");
        std::fs::create_dir_all(&dev).unwrap();
        let signature: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8 + 1).collect();
        for name in ["vda", "vdb", "vdc"] {
            std::fs::write(dev.join(name), &signature).unwrap();
        }
        Machine {
            sysfs: sys,
            procfs: proc,
            devfs: dev,
            data_dir: root.join("data"),
            config_path: root.join("config.toml"),
            tpm: Arc::new(crate::keys::TpmAccess::none()),
            role: Role::Ramdisk,
            api: None,
        }
    }

    #[test]
    fn wipes_both_ends_and_reads_them_back() {
        let dir = tempfile::tempdir().unwrap();
        let m = ramdisk(dir.path());
        let done = wipe(&m, &["/dev/vda"]);
        assert_eq!(
            done.status,
            bc_wire::command_v1::Status::Ok,
            "{}",
            done.outcome
        );
        assert_eq!(done.outcome, "wiped 1 of 1");
        let bytes = std::fs::read(m.devfs.join("vda")).unwrap();
        assert_eq!(bytes.len(), 3 << 20, "the size stays");
        assert!(bytes[..1 << 20].iter().all(|b| *b == 0), "the head");
        assert!(bytes[2 << 20..].iter().all(|b| *b == 0), "the tail");
        assert!(
            bytes[1 << 20..2 << 20].iter().all(|b| *b != 0),
            "the middle is left"
        );
    }

    #[test]
    fn refuses_what_is_in_use_or_unknown_and_then_wipes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let m = ramdisk(dir.path());
        let before = std::fs::read(m.devfs.join("vda")).unwrap();
        for (devices, why) in [
            (vec!["/dev/vda", "/dev/vdb"], "/dev/vdb: mounted at /mnt"),
            (vec!["/dev/vdc"], "/dev/vdc: vdc is held by dm-0"),
            (
                vec!["/dev/sdz"],
                "/dev/sdz: not a disk of this machine's inventory",
            ),
            (vec!["/dev/vda1"], "/dev/vda1: not a disk"),
            (
                vec!["/dev/nvme0c0n1"],
                "/dev/nvme0c0n1: not a disk of this machine's inventory",
            ),
        ] {
            let done = wipe(&m, &devices);
            assert_eq!(done.status, bc_wire::command_v1::Status::Failed);
            assert!(
                done.outcome.starts_with(&format!("refused: {why}")),
                "{}",
                done.outcome
            );
        }
        assert_eq!(
            std::fs::read(m.devfs.join("vda")).unwrap(),
            before,
            "vda untouched"
        );
        // Swap counts as in use.
        write(&m.procfs, "swaps", "Filename Type\n/dev/vda1 partition\n");
        assert!(wipe(&m, &["/dev/vda"]).outcome.contains("is swap"));
        // A node never wipes, whatever reached it.
        let node = Machine {
            role: Role::Node,
            ..ramdisk(dir.path())
        };
        assert!(wipe(&node, &["/dev/vda"])
            .outcome
            .starts_with("refused: only the commissioning ramdisk"));
    }
}
