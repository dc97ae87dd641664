//! A site node's `[site]`: the ramdisk files `bcd site` serves and its boot
//! lease as `bcd site` last wrote it (`site.json`). Only with `[site]`.

use std::path::Path;

use time::OffsetDateTime;

use super::Check;
use crate::site::settings::SiteSettings;
use crate::site::state;

pub const RAMDISK: &str = "ramdisk";
pub const BOOT_LEASE: &str = "boot lease";

pub fn checks(settings: &SiteSettings, data_dir: &Path, now: OffsetDateTime) -> Vec<Check> {
    vec![ramdisk(&settings.ramdisk_dir), lease(data_dir, now)]
}

fn ramdisk(dir: &Path) -> Check {
    let size = |name: &str| std::fs::metadata(dir.join(name)).ok().map(|m| m.len());
    match (size("vmlinuz"), size("initrd")) {
        (Some(k), Some(i)) => Check::ok(
            RAMDISK,
            format!("{}: vmlinuz {k} bytes, initrd {i} bytes", dir.display()),
        ),
        _ => Check::fail(
            RAMDISK,
            format!("{} lacks vmlinuz or initrd", dir.display()),
            "build the ramdisk (ramdisk/build) and copy its vmlinuz and initrd to [site] ramdisk_dir",
        ),
    }
}

fn lease(data_dir: &Path, now: OffsetDateTime) -> Check {
    match state::load(data_dir, now) {
        Some(s) if s.held => Check::ok(
            BOOT_LEASE,
            format!("held at epoch {} until {}", s.epoch, s.expires_at),
        ),
        Some(_) => Check::warn(
            BOOT_LEASE,
            "not held: standing by, or bcd site is not running",
            "a standby takes over when the holder stops renewing; start bcd site if none runs",
        ),
        None => Check::warn(
            BOOT_LEASE,
            "bcd site has not run on this node",
            "start bcd site (it holds the site's boot lease and serves PXE)",
        ),
    }
}
