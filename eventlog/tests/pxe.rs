//! The event log of a machine as scripts/pxetest boots its ramdisks: QEMU's
//! SeaBIOS with a vTPM, network-booting through the NIC's iPXE option ROM,
//! which loads the kernel and initrd a boot server names (tests/data/pxe,
//! PROVENANCE.md). It pins what such a machine can prove about its boot:
//! the firmware measured its SMBIOS tables and option ROMs and that it
//! called INT 19h, and nothing after it. iPXE measures nothing it loads and
//! the kernel's BIOS entry measures nothing either, so the kernel, initrd
//! and command line the site served are not in the log, and a ramdisk's
//! boot policy cannot allow "exactly what the site served" on this
//! firmware; UEFI firmware measures every image it loads (tests/sbtest.rs).

use std::path::PathBuf;

use bc_eventlog::{extract, parse, replay, Alg, Format, Limits};

#[test]
fn seabios_and_ipxe_measure_nothing_the_boot_server_served() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/pxe/seabios-ipxe.bin");
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
