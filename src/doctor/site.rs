//! A site node's `[site]`: the ramdisk files `bcd site` serves, its boot
//! lease and the site's commissioning policy as `bcd site` last wrote them
//! (`site.json`). Only with `[site]`.

use std::path::Path;

use time::OffsetDateTime;

use super::Check;
use crate::site_settings::SiteSettings;
use crate::sitedata::commissioning::{self, Policy};
use crate::sitedata::state;

pub(super) const RAMDISK: &str = "ramdisk";
pub(super) const BOOT_LEASE: &str = "boot lease";
pub(super) const COMMISSIONING: &str = "commissioning";

pub(super) fn checks(settings: &SiteSettings, data_dir: &Path, now: OffsetDateTime) -> Vec<Check> {
    vec![
        ramdisk(&settings.ramdisk_dir),
        lease(data_dir, now),
        commissioning(data_dir, now),
    ]
}

/// Who vouches for a machine that PXE-boots here: the policy the control
/// plane named in its last lease answer, what it means, and how to harden
/// the trusted-LAN default.
fn commissioning(data_dir: &Path, now: OffsetDateTime) -> Check {
    let learned = state::load(data_dir, now).and_then(|s| s.commissioning);
    match learned {
        Some(c) => match c.policy() {
            Some(Policy::TrustedLan) => Check::warn(COMMISSIONING, c.line(), commissioning::HARDEN),
            Some(_) => Check::ok(COMMISSIONING, c.line()),
            None => Check::warn(
                COMMISSIONING,
                c.line(),
                "upgrade bcd to the control plane's version",
            ),
        },
        None => Check::warn(
            COMMISSIONING,
            "not known: no lease answer has named it (bcd site has not run, or the control plane predates it)",
            "start bcd site: its lease answers say whether the site trusts its boot LAN, binds entries to EKs or waits for an operator's approval",
        ),
    }
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
