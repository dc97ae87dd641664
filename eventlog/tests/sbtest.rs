//! The event logs scripts/sbtest captured from its UEFI guests
//! (tests/data/sbtest, PROVENANCE.md): Debian 12's OVMF with Secure Boot
//! on (Microsoft's keys) and off, booting Debian's signed shim, grub and
//! cloud kernel from the disk's ESP. The "on" guest joined under a boot
//! policy, so the control plane checked this very replay against the
//! vTPM's quote of PCRs 0, 4, 7, 8 and 12; the expected values below are
//! that replay. The digests are what scripts/sbtest computed on the host
//! from the files it put on the ESP (tests/vm/sb/authenticode.py).

use std::path::PathBuf;

use bc_eventlog::{extract, parse, replay, Alg, AuthorityEntry, BootFacts, Format, Limits};

const SHIM: &str = "80a66d53a945d2286fcadd780fae1c225aa732079cd67b5225dc78aaab4e2ff8";
const GRUB: &str = "a68f6d71ebddaa19751ff8d729f67d11b0df8e4c49400c3e7e90de16119e1265";
const KERNEL: &str = "65c89335d8a5d25a8eeffd4de4a02087ac8dcf26165dbff8806a19f68ecd2842";
const CMDLINE: &str =
    "/vmlinuz-6.1.0-57-cloud-amd64 console=ttyS0 root=/dev/nvme0n1p2 rootwait rw panic=-1";

fn load(name: &str) -> (bc_eventlog::EventLog, BootFacts) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/sbtest")
        .join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let log = parse(&bytes, &Limits::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let facts = extract(&log, &Limits::default());
    (log, facts)
}

fn sha256(d: &[bc_eventlog::Digest]) -> String {
    d.iter()
        .find(|d| d.alg() == Some(Alg::Sha256))
        .map(|d| hex::encode(&d.value))
        .unwrap_or_default()
}

fn app_digests(f: &BootFacts) -> Vec<String> {
    f.boot_apps
        .iter()
        .map(|a| sha256(&a.authenticode))
        .collect()
}

/// The certificate an authority event names contains `subject`'s bytes.
fn names(f: &BootFacts, i: usize, subject: &str) -> bool {
    match &f.authorities[i].entry {
        AuthorityEntry::Certificate { der, .. } => {
            der.windows(subject.len()).any(|w| w == subject.as_bytes())
        }
        _ => false,
    }
}

fn pcr(log: &bc_eventlog::EventLog, pcr: u32) -> String {
    let r = replay(log, &[]);
    let bank = r.bank(Alg::Sha256).expect("a SHA-256 bank");
    hex::encode(bank.value(pcr).expect("the log extends it"))
}

#[test]
fn secure_boot_on_measures_shim_grub_and_the_kernel_with_their_verifiers() {
    let (log, f) = load("ovmf-secure-boot-on.bin");
    assert_eq!(log.format, Format::CryptoAgile);
    assert_eq!(log.events.len(), 50);
    // swtpm's default: the SHA-256 bank only.
    assert_eq!(log.banks(), vec![Alg::Sha256]);
    for (p, want) in [
        (
            0,
            "27fcccfa7f522e228d13ff449bd8c39507a97d7d96b808e9608ddff9b6b0719a",
        ),
        (
            4,
            "2bd3f79d99787a638e554f1f7f4c59ba417af7060fabebbb36b1cd827376814f",
        ),
        (
            7,
            "75677db6f14082d3bfec4d14bdd75c8d72612ef6914ca99cd5a5997b7a21309d",
        ),
        (
            8,
            "72b7ba32749bf0475b3867e54c23adf12e49c1c822d4d2834d647bfb04edcffc",
        ),
    ] {
        assert_eq!(pcr(&log, p), want, "PCR {p}");
    }
    assert!(f.secure_boot_enabled());
    for (name, db, entries) in [
        ("PK", &f.pk, 1),
        ("KEK", &f.kek, 2),
        ("db", &f.db, 2),
        ("dbx", &f.dbx, 1),
    ] {
        let db = db.as_ref().unwrap_or_else(|| panic!("{name} measured"));
        assert!(db.value.complete, "{name}");
        assert_eq!(db.value.entries.len(), entries, "{name}");
    }
    // PCR 4: shim by the firmware, grub by shim, the kernel twice (grub
    // has shim verify it twice), each by its Authenticode digest.
    assert_eq!(app_digests(&f), [SHIM, GRUB, KERNEL, KERNEL]);
    let paths: Vec<Option<&str>> = f.boot_apps.iter().map(|a| a.path.as_deref()).collect();
    assert!(
        paths[0].is_some_and(|p| p.ends_with("\\EFI\\BOOT\\BOOTX64.EFI")),
        "{paths:?}"
    );
    assert_eq!(paths[1], Some("\\EFI\\BOOT\\grubx64.efi"));
    assert!(
        paths[2..].iter().all(|p| p.is_none_or(str::is_empty)),
        "{paths:?}"
    );
    // PCR 7 after the separator: the db certificate that verified shim,
    // then shim's SbatLevel and the vendor certificate (Debian's CA, as
    // "MokListRT") that verified grub; nothing new for the kernel.
    let shim = &f.boot_apps[0].new_authorities;
    assert_eq!(shim.len(), 1);
    assert_eq!(f.authorities[shim[0]].variable, "db");
    assert!(names(&f, shim[0], "Microsoft Corporation UEFI CA 2011"));
    let grub: Vec<usize> = f.boot_apps[1]
        .new_authorities
        .iter()
        .copied()
        .filter(|&i| matches!(f.authorities[i].entry, AuthorityEntry::Certificate { .. }))
        .collect();
    assert_eq!(grub.len(), 1);
    assert_eq!(f.authorities[grub[0]].variable, "MokListRT");
    assert!(names(&f, grub[0], "Debian Secure Boot CA"));
    assert!(f.boot_apps[2].new_authorities.is_empty());
    assert!(f.boot_apps[3].new_authorities.is_empty());
    assert!(f.sbat_level.is_some());
    // PCR 8: grub's commands and the command line; PCR 9: what grub read.
    let cmdlines: Vec<&str> = f.kernel_cmdlines.iter().map(|c| c.value.as_str()).collect();
    assert_eq!(cmdlines, [CMDLINE]);
    assert!(f
        .grub_commands
        .iter()
        .any(|c| c.value == format!("linuxefi {}", CMDLINE)));
    let files: Vec<&str> = f.loaded_files.iter().map(|c| c.value.as_str()).collect();
    assert_eq!(
        files,
        [
            "(hd0,gpt1)/EFI/debian/grub.cfg",
            "/vmlinuz-6.1.0-57-cloud-amd64"
        ]
    );
    // PCR 14: shim's MOK lists.
    let moks: Vec<&str> = f
        .mok_measurements
        .iter()
        .map(|c| c.value.as_str())
        .collect();
    assert_eq!(moks, ["MokList", "MokListX", "MokListTrusted"]);
    assert!(f.warnings.is_empty(), "{:?}", f.warnings);
}

#[test]
fn secure_boot_off_measures_no_kernel_in_pcr_4() {
    let (log, f) = load("ovmf-secure-boot-off.bin");
    assert_eq!(log.events.len(), 46);
    assert_eq!(
        pcr(&log, 7),
        "b926225ac488e9c50ef2fa815aa7104b385a06907093bfb1dc62eeb7abecddf1"
    );
    assert!(!f.secure_boot_enabled());
    assert_eq!(
        f.secure_boot.as_ref().map(|m| m.value.clone()),
        Some(vec![0])
    );
    for db in [&f.pk, &f.kek, &f.db, &f.dbx] {
        assert!(db.as_ref().is_some_and(|d| d.value.entries.is_empty()));
    }
    // Nothing verified shim or grub, and grub asked shim nothing about
    // the kernel: only PCR 9's file digest (not Authenticode) names it.
    assert_eq!(app_digests(&f), [SHIM, GRUB]);
    assert!(f
        .post_separator_authorities()
        .all(|a| !matches!(a.entry, AuthorityEntry::Certificate { .. })));
    assert!(f
        .loaded_files
        .iter()
        .any(|c| c.value == "/vmlinuz-6.1.0-57-cloud-amd64"));
    let cmdlines: Vec<&str> = f.kernel_cmdlines.iter().map(|c| c.value.as_str()).collect();
    assert_eq!(cmdlines, [CMDLINE]);
}
