//! The machine's hardware claims (`JoinRequest.claims`): its MACs and its
//! product UUID, read from sysfs.
//!
//! Attestors that bind a join to one machine (a token's expect binding,
//! provisioned, discovery) compare against them, so every join sends them.
//! They are the machine's word, not evidence: nothing here is an error. An
//! interface or a file that cannot be read is left out, and a machine that
//! shows nothing sends empty claims, which a bound token then refuses.
//!
//! The parsing functions take a sysfs root so that tests build a fake tree;
//! [`collect`] reads the real `/sys`. Builds with the `failpoints` feature
//! (the end-to-end tests) honour `BCD_SYSFS_ROOT` instead, as
//! [`crate::clock`] honours `BCD_CLOCK_OFFSET`: a test then gives the agent
//! a machine of its choosing, never the one it runs on.
use std::path::{Path, PathBuf};

use bc_wire::agent::HardwareClaims;

/// The environment variable a `failpoints` build reads sysfs under.
#[cfg(feature = "failpoints")]
const SYSFS_ROOT_ENV: &str = "BCD_SYSFS_ROOT";

/// The interface every Linux machine has and no attestor can bind to.
const LOOPBACK: &str = "lo";

/// Longest product UUID sent: DMI holds 36 characters; anything longer is
/// not a UUID and is not forwarded to the server.
const MAX_PRODUCT_UUID_LEN: usize = 64;

/// The claims of this machine, from `/sys` (or `BCD_SYSFS_ROOT` in a
/// `failpoints` build).
pub(crate) fn collect() -> HardwareClaims {
    collect_from(&sysfs_root())
}

/// The claims under a sysfs root: [`macs_from`] and [`product_uuid_from`].
pub(crate) fn collect_from(root: &Path) -> HardwareClaims {
    HardwareClaims {
        macs: macs_from(root),
        product_uuid: product_uuid_from(root),
    }
}

/// The MACs of `ROOT/class/net/*/address`: lowercase `aa:bb:cc:dd:ee:ff`,
/// sorted, without `lo`, all-zero addresses (interfaces without a hardware
/// address, e.g. tunnels) and duplicates (bond members share one). An
/// address that is not six hex pairs (InfiniBand's 20 bytes) is left out.
pub(crate) fn macs_from(root: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(root.join("class/net")) else {
        return Vec::new();
    };
    let mut macs: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name() != LOOPBACK)
        .filter_map(|e| std::fs::read_to_string(e.path().join("address")).ok())
        .filter_map(|text| parse_mac(&text))
        .collect();
    macs.sort();
    macs.dedup();
    macs
}

/// `ROOT/class/dmi/id/product_uuid`, lowercase; empty when the file is
/// absent (no DMI, e.g. most ARM boards), unreadable (it is root-only) or
/// not a printable word.
pub(crate) fn product_uuid_from(root: &Path) -> String {
    std::fs::read_to_string(root.join("class/dmi/id/product_uuid"))
        .map(|text| parse_product_uuid(&text))
        .unwrap_or_default()
}

/// One sysfs `address`: six hex pairs separated by `:`, lowercase; `None`
/// for anything else and for `00:00:00:00:00:00`.
pub(crate) fn parse_mac(text: &str) -> Option<String> {
    let t = text.trim();
    let pairs: Vec<&str> = t.split(':').collect();
    let well_formed = pairs.len() == 6
        && pairs
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    if !well_formed || pairs.iter().all(|p| *p == "00") {
        return None;
    }
    Some(t.to_ascii_lowercase())
}

/// The content of `product_uuid`, trimmed and lowercase; empty when it is
/// too long or holds anything but ASCII graphic characters. The server
/// validates the form; this only keeps garbage out of the request.
pub(crate) fn parse_product_uuid(text: &str) -> String {
    let t = text.trim();
    if t.len() > MAX_PRODUCT_UUID_LEN || !t.bytes().all(|b| b.is_ascii_graphic()) {
        return String::new();
    }
    t.to_ascii_lowercase()
}

/// `/sys`; in a `failpoints` build, `BCD_SYSFS_ROOT` when set.
pub(crate) fn sysfs_root() -> PathBuf {
    #[cfg(feature = "failpoints")]
    {
        if let Some(root) = std::env::var_os(SYSFS_ROOT_ENV) {
            tracing::warn!(root = %Path::new(&root).display(), "test build: hardware claims are read under {SYSFS_ROOT_ENV}");
            return PathBuf::from(root);
        }
    }
    PathBuf::from("/sys")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn macs_parse_lowercase_and_reject_the_rest() {
        assert_eq!(
            parse_mac("52:54:00:AB:cd:EF\n").as_deref(),
            Some("52:54:00:ab:cd:ef")
        );
        for bad in [
            "",
            "00:00:00:00:00:00",
            "52:54:00:ab:cd",
            "52-54-00-ab-cd-ef",
            "52:54:00:ab:cd:eg",
            "80:00:02:08:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc:de",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn product_uuid_is_lowercase_or_empty() {
        assert_eq!(
            parse_product_uuid("4C4C4544-0042-3510-8052-B4C04F4E4D32\n"),
            "4c4c4544-0042-3510-8052-b4c04f4e4d32"
        );
        assert_eq!(parse_product_uuid(""), "");
        assert_eq!(parse_product_uuid("a b"), "");
        assert_eq!(parse_product_uuid(&"a".repeat(65)), "");
    }

    #[test]
    fn collects_a_fake_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "class/net/lo/address", "00:00:00:00:00:00\n");
        write(root, "class/net/eth1/address", "52:54:00:00:00:02\n");
        write(root, "class/net/eth0/address", "52:54:00:00:00:0A\n");
        // A bond and its member share the member's address.
        write(root, "class/net/bond0/address", "52:54:00:00:00:02\n");
        write(root, "class/net/tun0/address", "\n");
        write(root, "class/net/sit0/address", "00:00:00:00:00:00\n");
        std::fs::create_dir_all(root.join("class/net/noaddr")).unwrap();
        write(
            root,
            "class/dmi/id/product_uuid",
            "4C4C4544-0042-3510-8052-B4C04F4E4D32\n",
        );
        let claims = collect_from(root);
        assert_eq!(claims.macs, vec!["52:54:00:00:00:02", "52:54:00:00:00:0a"]);
        assert_eq!(claims.product_uuid, "4c4c4544-0042-3510-8052-b4c04f4e4d32");
    }

    #[test]
    fn a_missing_tree_claims_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(collect_from(dir.path()), HardwareClaims::default());
        // `lo` alone claims no MAC, even with a real-looking address.
        write(dir.path(), "class/net/lo/address", "52:54:00:00:00:01\n");
        assert!(macs_from(dir.path()).is_empty());
    }

    #[test]
    fn an_unreadable_product_uuid_is_empty() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "class/dmi/id/product_uuid", "x\n");
        let p = dir.path().join("class/dmi/id/product_uuid");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
        // Root reads it anyway; either way, no error and no panic.
        let got = product_uuid_from(dir.path());
        assert!(got.is_empty() || got == "x");
        // A directory where the file should be is unreadable as text.
        let dir2 = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir2.path().join("class/dmi/id/product_uuid")).unwrap();
        assert_eq!(product_uuid_from(dir2.path()), "");
    }
}
