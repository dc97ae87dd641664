//! Parse and judge on the real logs of eventlog/tests/data.

use std::path::PathBuf;

use bc_eventlog::{extract, parse, Limits};

use super::*;
use crate::store::Store;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../eventlog/tests/data")
        .join(name)
}

fn facts(name: &str) -> BootFacts {
    let bytes = std::fs::read(data(name)).unwrap();
    let log = parse(&bytes, &Limits::default()).unwrap();
    extract(&log, &Limits::default())
}

const LOGS: &[&str] = &[
    "keylime/binary_bios_measurements",
    "keylime/binary_bios_measurements-secureboot",
    "tpm2-tools/event-moklisttrusted.bin",
    "tpm2-tools/event-bootorder.bin",
    "tpm2-tools/event-postcode.bin",
    "tpm2-tools/event-sd-boot-fedora37.bin",
    "tpm2-tools/event-uefi-sha1-log.bin",
    "go-attestation/sb_cert_eventlog",
    "go-attestation/option_rom_eventlog",
    "sbtest/ovmf-secure-boot-on.bin",
    "sbtest/ovmf-secure-boot-off.bin",
];

#[test]
fn a_policy_from_a_log_admits_that_log_and_reads_back_equal() {
    for name in LOGS {
        let f = facts(name);
        let text = from_facts(&f);
        let p = BootPolicy::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        assert_eq!(judge(&p, &f), Ok(()), "{name}\n{text}");
        assert_eq!(BootPolicy::parse(&p.to_toml()).unwrap(), p, "{name}");
        assert_eq!(p.secure_boot_required, f.secure_boot_enabled(), "{name}");
    }
    let f = facts("keylime/binary_bios_measurements-secureboot");
    let p = BootPolicy::parse(&from_facts(&f)).unwrap();
    assert_eq!(p.boot_apps.len(), f.boot_apps.len());
    assert!(
        p.boot_apps.iter().all(|a| !a.authorities.is_empty()),
        "{p:?}"
    );
}

#[test]
fn secure_boot_off_is_refused_with_its_event() {
    let p = BootPolicy::parse("secure_boot = \"required\"").unwrap();
    let f = facts("keylime/binary_bios_measurements");
    let r = judge(&p, &f).unwrap_err();
    assert_eq!(r.reason, BootReason::SecureBoot);
    assert_eq!(r.event, f.secure_boot.as_ref().map(|m| m.event));
    assert!(r.event.is_some() && r.detail.contains("00"), "{r}");
    assert_eq!(
        judge(&p, &facts("keylime/binary_bios_measurements-secureboot")),
        Ok(())
    );
    // Measured with no data (an SHA-1 era log): not on.
    let r = judge(&p, &facts("tpm2-tools/event-uefi-sha1-log.bin")).unwrap_err();
    assert_eq!(r.reason, BootReason::SecureBoot);
}

#[test]
fn boot_apps_by_digest_and_by_authority() {
    let f = facts("keylime/binary_bios_measurements-secureboot");
    let shim = &f.boot_apps[0];
    let shim_digest = hex::encode(&shim.authenticode[0].value);
    // Only shim's digest: grub (or whatever follows) is refused, named.
    let p = BootPolicy::parse(&format!("[[boot_app]]\ndigest = \"{shim_digest}\"\n")).unwrap();
    let r = judge(&p, &f).unwrap_err();
    assert_eq!(r.reason, BootReason::App);
    assert_eq!(r.event, Some(f.boot_apps[1].event));
    // By authority: every certificate that verified an application.
    let mut auths = Vec::new();
    for i in 0..f.boot_apps.len() {
        for a in app_authorities(&f, i) {
            if let AuthorityEntry::Certificate { der, .. } = &a.entry {
                auths.push(authority_subject(der).unwrap());
            }
        }
    }
    assert!(!auths.is_empty());
    let list: Vec<String> = auths.iter().map(|a| format!("{a:?}")).collect();
    let p = BootPolicy::parse(&format!(
        "[[boot_app]]\nauthority = [{}]\n",
        list.join(", ")
    ))
    .unwrap();
    assert_eq!(judge(&p, &f), Ok(()));
    // An authority-only policy refuses a Secure Boot-off machine's apps:
    // nothing verified them.
    let off = facts("keylime/binary_bios_measurements");
    assert_eq!(judge(&p, &off).unwrap_err().reason, BootReason::App);
    // Digest and authority must both hold.
    let p = BootPolicy::parse(&format!(
        "[[boot_app]]\ndigest = \"{}\"\nauthority = [{}]\n",
        "ab".repeat(32),
        list.join(", ")
    ))
    .unwrap();
    assert_eq!(judge(&p, &f).unwrap_err().event, Some(shim.event));
}

/// scripts/sbtest's policy on the logs its guests captured (OVMF, Debian's
/// signed shim, grub and kernel): the Authenticode digests it computes on
/// the host from the ESP's files, Secure Boot required, grub's command line.
#[test]
fn the_sbtest_policy_on_real_ovmf_logs() {
    const SHIM: &str = "80a66d53a945d2286fcadd780fae1c225aa732079cd67b5225dc78aaab4e2ff8";
    const GRUB: &str = "a68f6d71ebddaa19751ff8d729f67d11b0df8e4c49400c3e7e90de16119e1265";
    const KERNEL: &str = "65c89335d8a5d25a8eeffd4de4a02087ac8dcf26165dbff8806a19f68ecd2842";
    let cmdline = "cmdline = [\"/vmlinuz-6.1.0-57-cloud-amd64 console=ttyS0 root=/dev/nvme0n1p2 rootwait rw panic=-1\"]";
    let policy = |apps: &[&str]| {
        let mut t = format!("secure_boot = \"required\"\n{cmdline}\n");
        for d in apps {
            t.push_str(&format!("[[boot_app]]\ndigest = \"{d}\"\n"));
        }
        BootPolicy::parse(&t).unwrap()
    };
    let on = facts("sbtest/ovmf-secure-boot-on.bin");
    let off = facts("sbtest/ovmf-secure-boot-off.bin");
    assert_eq!(judge(&policy(&[SHIM, GRUB, KERNEL]), &on), Ok(()));
    let r = judge(&policy(&[SHIM, GRUB, KERNEL]), &off).unwrap_err();
    assert_eq!((r.reason, r.event), (BootReason::SecureBoot, Some(4)));
    // Without the kernel's digest: refused at its first measurement, named.
    let r = judge(&policy(&[SHIM, GRUB]), &on).unwrap_err();
    assert_eq!((r.reason, r.event), (BootReason::App, Some(45)));
    assert!(r.detail.contains(KERNEL), "{r}");
    // Secure Boot off measures no kernel in PCR 4: a digest policy without
    // secure_boot = "required" cannot see which kernel booted.
    let p = BootPolicy::parse(&format!(
        "[[boot_app]]\ndigest = [\"{SHIM}\", \"{GRUB}\"]\n"
    ))
    .unwrap();
    assert_eq!(judge(&p, &off), Ok(()));
    // By authority: shim's is the db's Microsoft UEFI CA, grub's Debian's
    // CA (shim's vendor certificate, logged as MokListRT).
    let subjects = |i: usize| -> Vec<String> {
        app_authorities(&on, i)
            .into_iter()
            .filter_map(|a| match &a.entry {
                AuthorityEntry::Certificate { der, .. } => authority_subject(der),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        subjects(0),
        ["C=US, ST=Washington, L=Redmond, O=Microsoft Corporation, CN=Microsoft Corporation UEFI CA 2011"]
    );
    assert_eq!(subjects(1), ["CN=Debian Secure Boot CA"]);
    // The kernel logs no authority of its own: either CA may have verified
    // it. Allowing only the Microsoft CA (meant for shim), with grub by
    // digest, does not allow the kernel shim verified with Debian's CA.
    let microsoft = subjects(0).remove(0);
    let p = BootPolicy::parse(&format!(
        "[[boot_app]]\nauthority = {microsoft:?}\n[[boot_app]]\ndigest = \"{GRUB}\"\n"
    ))
    .unwrap();
    let r = judge(&p, &on).unwrap_err();
    assert_eq!((r.reason, r.event), (BootReason::App, Some(45)), "{r}");
    // Both CAs, in one entry or in two: allowed.
    let p = BootPolicy::parse(&format!(
        "[[boot_app]]\nauthority = {microsoft:?}\n[[boot_app]]\nauthority = \"CN=Debian Secure Boot CA\"\n"
    ))
    .unwrap();
    assert_eq!(judge(&p, &on), Ok(()));
}

#[test]
fn cmdline_patterns() {
    let f = facts("tpm2-tools/event-sd-boot-fedora37.bin");
    // Every measured command line must match (an older stub's credentials
    // land there too: allow what this log has).
    let all: Vec<String> = f
        .kernel_cmdlines
        .iter()
        .map(|c| format!("{:?}", c.value))
        .collect();
    let p = BootPolicy::parse(&format!("cmdline = [{}]", all.join(", "))).unwrap();
    assert_eq!(judge(&p, &f), Ok(()));
    let bad = BootPolicy::parse("cmdline = \"console=ttyS1 *\"").unwrap();
    let r = judge(&bad, &f).unwrap_err();
    assert_eq!(r.reason, BootReason::Cmdline);
    assert_eq!(r.event, Some(f.kernel_cmdlines[0].event));
    assert!(r.detail.contains(&f.kernel_cmdlines[0].value), "{r}");
    // A log that measured none: refused when a pattern is required.
    let r = judge(&bad, &facts("keylime/binary_bios_measurements-secureboot"));
    if facts("keylime/binary_bios_measurements-secureboot")
        .kernel_cmdlines
        .is_empty()
    {
        assert_eq!(r.unwrap_err().event, None);
    }
    assert!(glob("a*c?e", "abbbcde") && glob("*", "") && !glob("a?", "a") && glob("x*", "x"));
}

#[test]
fn firmware_versions_compare_within_their_family() {
    let f = facts("keylime/binary_bios_measurements");
    for (min, ok) in [
        ("N40ET41W", true),
        ("N40ET40W", true),
        ("N40ET9W", true),
        ("N40ET42W", false),
        ("N41ET01W", false),
        ("edk2-20240524", false),
    ] {
        let p = BootPolicy::parse(&format!("[firmware]\nmin_version = \"{min}\"")).unwrap();
        let r = judge(&p, &f);
        assert_eq!(r.is_ok(), ok, "{min}: {r:?}");
        if let Err(r) = r {
            assert_eq!(r.reason, BootReason::Firmware);
            assert_eq!(r.event, Some(f.scrtm_version[0].event));
        }
    }
    // Several families at once: the applicable one decides.
    let p =
        BootPolicy::parse("[firmware]\nmin_version = [\"edk2-20240524\", \"N40ET41W\"]").unwrap();
    assert_eq!(judge(&p, &f), Ok(()));
    let sb = facts("keylime/binary_bios_measurements-secureboot");
    assert_eq!(judge(&p, &sb), Ok(()));
    let p = BootPolicy::parse("[firmware]\nmin_version = \"edk2-20240601\"").unwrap();
    assert_eq!(judge(&p, &sb).unwrap_err().reason, BootReason::Firmware);
}

#[test]
fn dbx_min_from_official_update_files() {
    let f = facts("keylime/binary_bios_measurements");
    let dbx = f.dbx.as_ref().unwrap();
    // The 2024 update revokes a CA this 2020s laptop's dbx lacks.
    let path = data("dbx/DBXUpdate2024.bin");
    let p = BootPolicy::parse(&format!("dbx_min = {:?}", path.display().to_string())).unwrap();
    assert_eq!(p.dbx_min.len(), 4);
    let r = judge(&p, &f).unwrap_err();
    assert_eq!((r.reason, r.event), (BootReason::Dbx, Some(dbx.event)));
    assert!(r.detail.contains("lacks"), "{r}");
    // Stored as its entries, read back without the file.
    let stored = p.to_toml();
    assert!(!stored.contains("dbx_min ="), "{stored}");
    assert_eq!(BootPolicy::parse_stored(&stored).unwrap(), p);
    let e = BootPolicy::parse_stored("dbx_min=\"/etc/passwd\"").unwrap_err();
    assert!(e.contains("dbx_min_entries"), "{e}");
    // The machine's own dbx as the minimum: met.
    let own: Vec<String> = dbx
        .value
        .entries
        .iter()
        .map(|e| format!("{:?}", signature_key(e)))
        .collect();
    let p = BootPolicy::parse(&format!("dbx_min_entries = [{}]", own.join(", "))).unwrap();
    assert_eq!(judge(&p, &f), Ok(()));
    // A machine whose dbx was not measured.
    assert_eq!(
        judge(&p, &facts("tpm2-tools/event-sd-boot-fedora37.bin"))
            .unwrap_err()
            .reason,
        BootReason::Dbx
    );
    let e = BootPolicy::parse("dbx_min = \"/nonexistent/dbx.bin\"").unwrap_err();
    assert!(
        e.contains("dbx_min[0]") && e.contains("/nonexistent/dbx.bin"),
        "{e}"
    );
    let e = BootPolicy::parse(&format!(
        "dbx_min = {:?}",
        data("PROVENANCE.md").display().to_string()
    ))
    .unwrap_err();
    assert!(e.contains("not a dbx update"), "{e}");
}

#[test]
fn parse_errors_name_the_key_or_line() {
    for (text, want) in [
        ("secure_boot = \"yes\"", "secure_boot"),
        ("secureboot = \"required\"", "secureboot"),
        ("[[boot_app]]\n", "boot_app[0]"),
        ("[[boot_app]]\ndigest = \"xyz\"", "boot_app[0].digest[0]"),
        ("[[boot_app]]\ndigest = []", "boot_app[0].digest"),
        ("cmdline = []", "cmdline"),
        ("cmdline = [\"\"]", "cmdline[0]"),
        ("[firmware]\nmin = \"1\"", "min"),
        ("\n\nsecure_boot = ", "line 3"),
        ("dbx_min_entries = [\"md5:00\"]", "dbx_min_entries[0]"),
    ] {
        let e = BootPolicy::parse(text).unwrap_err();
        assert!(e.contains(want), "{text:?}: {e}");
    }
    assert!(BootPolicy::parse("").unwrap().is_empty());
}

#[test]
fn needed_pcrs_follow_the_checks() {
    let p = |t: &str| needed_pcrs(&BootPolicy::parse(t).unwrap());
    assert_eq!(p(""), vec![0, 7]);
    assert_eq!(p("secure_boot = \"required\""), vec![0, 7]);
    assert_eq!(
        p(&format!("[[boot_app]]\ndigest = \"{}\"", "ab".repeat(32))),
        vec![0, 4, 7]
    );
    assert_eq!(p("cmdline = \"*\""), vec![0, 7, 8, 12]);
    assert_eq!(always_extended(&[0, 4, 7, 8, 12]), vec![0, 4, 7]);
}

#[test]
fn a_pool_stores_its_policy_and_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let db = Store::open_dir(dir.path()).unwrap();
    let none = db.read(|tx| pool_boot_policy(tx, "default")).unwrap();
    assert_eq!(none, None);
    let p = BootPolicy::parse(&format!(
        "secure_boot = \"required\"\ncmdline = [\"ro *\", \"quiet\"]\ndbx_min = {:?}\n[[boot_app]]\ndigest = \"{}\"\n",
        data("dbx/dbxupdate_x64-2021-04-29.bin").display().to_string(),
        "AB".repeat(32)
    ))
    .unwrap();
    crate::model::pools::set_boot_policy(&db, "default", Some(&p)).unwrap();
    let back = db.read(|tx| pool_boot_policy(tx, "default")).unwrap();
    assert_eq!(back.as_ref(), Some(&p));
    assert_eq!(p.dbx_min.len(), 211);
    assert_eq!(
        crate::model::pools::boot_policies(&db).unwrap(),
        vec![("default".to_owned(), Some(p.clone()))]
    );
    crate::model::pools::set_boot_policy(&db, "default", None).unwrap();
    assert_eq!(db.read(|tx| pool_boot_policy(tx, "default")).unwrap(), None);
    assert!(crate::model::pools::set_boot_policy(&db, "nope", None).is_err());
}
