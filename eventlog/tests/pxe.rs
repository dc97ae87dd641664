//! The event logs of a machine network-booting a kernel and initrd that a
//! boot server names, through QEMU's iPXE option ROM (tests/data/pxe,
//! PROVENANCE.md): what such a machine can prove about what it was served.
//!
//! - SeaBIOS (as scripts/pxetest boots its ramdisks): the firmware measured
//!   its SMBIOS tables and option ROMs and that it called INT 19h, and
//!   nothing after it. iPXE measures nothing it loads and the kernel's BIOS
//!   entry measures nothing either: a ramdisk's boot policy cannot allow
//!   "exactly what the site served" on this firmware.
//! - OVMF (UEFI): iPXE starts the kernel through the firmware, which
//!   measures it into PCR 4 by the Authenticode digest the boot server can
//!   compute from the file it serves; the kernel's EFI stub measures its
//!   command line into PCR 9 (a tagged event whose digest is that of the
//!   UTF-16 string iPXE passed, which the boot server rendered). The initrd
//!   iPXE (2019) hands over as a file is not measured.

use std::path::PathBuf;

use bc_eventlog::{extract, parse, replay, Alg, Format, Limits};
use sha2::{Digest as _, Sha256};

fn load(name: &str) -> bc_eventlog::EventLog {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/pxe")
        .join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse(&bytes, &Limits::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn seabios_and_ipxe_measure_nothing_the_boot_server_served() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/pxe/seabios-ipxe.bin");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let log = parse(&bytes, &Limits::default()).expect("SeaBIOS's log parses");
    assert_eq!(log.format, Format::CryptoAgile);
    // swtpm as QEMU starts it without swtpm_setup: four banks.
    let mut banks = log.banks();
    banks.sort_by_key(|a| a.id());
    assert_eq!(
        banks,
        vec![Alg::Sha1, Alg::Sha256, Alg::Sha384, Alg::Sha512]
    );
    // Every bank replays, and every event's digests agree across banks
    // (the parser checks what it can: a log that lied would not parse).
    let r = replay(&log, &[]);
    for alg in [Alg::Sha1, Alg::Sha256, Alg::Sha384, Alg::Sha512] {
        let bank = r.bank(alg).expect("each bank replays");
        for p in 0..8 {
            assert!(bank.value(p).is_some(), "{alg:?} PCR {p}");
        }
    }
    // The whole log: SMBIOS (PCR 1), the option ROM scan and two ROMs
    // (PCR 2), INT 19h (PCR 4), then a separator for PCRs 0-7. No S-CRTM
    // version and no code measured in PCR 0.
    let shape: Vec<(u32, u32)> = log
        .events
        .iter()
        .skip(1)
        .map(|e| (e.pcr, e.event_type))
        .collect();
    let mut want = vec![(1, 6), (2, 5), (2, 6), (2, 6), (4, 5)];
    want.extend((0..8).map(|p| (p, 4)));
    assert_eq!(shape, want);
    let actions: Vec<&[u8]> = log
        .events
        .iter()
        .filter(|e| e.event_type == 5)
        .map(|e| e.data.as_slice())
        .collect();
    assert_eq!(actions, [&b"Start Option ROM Scan"[..], b"Calling INT 19h"]);
    // After INT 19h the network boot ROM ran: nothing more was measured.
    let facts = extract(&log, &Limits::default());
    assert!(facts.boot_apps.is_empty());
    assert!(facts.kernel_cmdlines.is_empty());
    assert!(facts.loaded_files.is_empty());
    assert!(!facts.secure_boot_enabled());
}

#[test]
fn ovmf_measures_the_kernel_ipxe_loads_and_its_command_line() {
    // The cloud kernel scripts/sbtest also boots: the digest its
    // tests/vm/sb/authenticode.py computes from the file.
    const KERNEL: &str = "65c89335d8a5d25a8eeffd4de4a02087ac8dcf26165dbff8806a19f68ecd2842";
    // What iPXE passed as the kernel's load options: its image name, then
    // the arguments of the script's `kernel` line.
    const LOAD_OPTIONS: &str = "vmlinuz initrd=probe.cpio.gz console=ttyS0 bc.probe=1";
    let log = load("ovmf-ipxe.bin");
    let r = replay(&log, &[]);
    for alg in [Alg::Sha1, Alg::Sha256, Alg::Sha384, Alg::Sha512] {
        assert!(r.bank(alg).is_some(), "{alg:?}");
    }
    let facts = extract(&log, &Limits::default());
    assert!(!facts.secure_boot_enabled());
    // PCR 4: the kernel, twice (iPXE loads the image, then starts it), by
    // its Authenticode digest, the second time with its path on iPXE's
    // file system.
    let apps: Vec<(u32, String)> = facts
        .boot_apps
        .iter()
        .map(|a| {
            let d = a.authenticode.iter().find(|d| d.alg() == Some(Alg::Sha256));
            (a.pcr, d.map(|d| hex::encode(&d.value)).unwrap_or_default())
        })
        .collect();
    assert_eq!(apps, [(4, KERNEL.to_owned()), (4, KERNEL.to_owned())]);
    assert!(facts.boot_apps[1]
        .path
        .as_deref()
        .is_some_and(|p| p.ends_with("/vmlinuz")));
    // PCR 9: the EFI stub's LOADED_IMAGE::LoadOptions, the UTF-16LE
    // command line with its NUL.
    let tagged: Vec<_> = log
        .events
        .iter()
        .filter(|e| e.pcr == 9 && e.event_type == 6)
        .collect();
    assert_eq!(tagged.len(), 1);
    assert!(tagged[0]
        .data
        .windows(25)
        .any(|w| w == b"LOADED_IMAGE::LoadOptions"));
    let utf16: Vec<u8> = LOAD_OPTIONS
        .encode_utf16()
        .chain([0])
        .flat_map(u16::to_le_bytes)
        .collect();
    assert_eq!(
        tagged[0].digest(Alg::Sha256),
        Some(Sha256::digest(&utf16).as_slice())
    );
    // No string to match a `cmdline` pattern against: only its digest.
    assert!(facts.kernel_cmdlines.is_empty());
}
