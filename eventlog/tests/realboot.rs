//! Real event logs from public repositories (tests/data, PROVENANCE.md):
//! each parses, replays to the PCR values its upstream tests assert, and
//! yields the Secure Boot facts those projects read from it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use base64::Engine as _;
use bc_eventlog::{
    extract, parse, replay, verify, Alg, AuthorityEntry, BootFacts, EventLog, Format, Limits,
    ParseError, PcrValues, Quirk,
};

fn data(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn load(name: &str) -> (EventLog, BootFacts) {
    let log = parse(&data(name), &Limits::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let facts = extract(&log, &Limits::default());
    (log, facts)
}

/// The `pcrs:` section of a tpm2-tools golden YAML.
fn golden_pcrs(name: &str) -> PcrValues {
    let text = String::from_utf8(data(&format!("tpm2-tools/{name}.pcrs.yaml"))).unwrap();
    let mut out = PcrValues::new();
    let mut bank = None;
    for line in text.lines().skip(1) {
        let t = line.trim();
        if let Some(name) = t.strip_suffix(':') {
            bank = Some(Alg::from_name(name).unwrap_or_else(|| panic!("bank {name}")));
        } else if let Some((pcr, value)) = t.split_once(':') {
            let pcr: u32 = pcr.trim().parse().unwrap();
            let value = hex::decode(value.trim().trim_start_matches("0x")).unwrap();
            out.entry(bank.unwrap()).or_default().insert(pcr, value);
        }
    }
    out
}

const TPM2_TOOLS: &[&str] = &[
    "event-bootorder.bin",
    "event-moklisttrusted.bin",
    "event-postcode.bin",
    "event-sd-boot-fedora37.bin",
    "event-uefi-sha1-log.bin",
    "event-uefiaction.bin",
    "event-uefiservices.bin",
    "event-uefivar.bin",
    "event.bin",
];

#[test]
fn tpm2_tools_logs_replay_to_the_golden_pcrs_in_every_bank() {
    for name in TPM2_TOOLS {
        let (log, _) = load(&format!("tpm2-tools/{name}"));
        let golden = golden_pcrs(name);
        assert!(!golden.is_empty(), "{name}: no golden pcrs");
        let r = replay(&log, &[]);
        for (alg, pcrs) in &golden {
            let bank = r
                .bank(*alg)
                .unwrap_or_else(|| panic!("{name}: no {alg:?} bank"));
            let ours: BTreeMap<u32, Vec<u8>> = bank
                .pcrs()
                .map(|p| (p, bank.value(p).unwrap().to_vec()))
                .collect();
            assert_eq!(&ours, pcrs, "{name} {alg:?}");
        }
        let v = verify(&log, &golden, &[], &[]);
        assert!(v.ok() && v.quirks.is_empty(), "{name}: {v:?}");
    }
    let (log, _) = load("tpm2-tools/specid-vendordata.bin");
    assert_eq!(log.events.len(), 1);
    assert!(replay(&log, &[])
        .banks
        .iter()
        .all(|b| b.pcrs().next().is_none()));
}

#[test]
fn tpm2_tools_logs_formats_and_banks() {
    let cases: &[(&str, Format, &[Alg], usize)] = &[
        (
            "event-bootorder.bin",
            Format::CryptoAgile,
            &[Alg::Sha1, Alg::Sha256],
            104,
        ),
        (
            "event-moklisttrusted.bin",
            Format::CryptoAgile,
            &[Alg::Sha256],
            97,
        ),
        ("event-uefi-sha1-log.bin", Format::Sha1, &[Alg::Sha1], 17),
        (
            "event.bin",
            Format::CryptoAgile,
            &[Alg::Sha1, Alg::Sha256, Alg::Sha384, Alg::Sha512],
            2,
        ),
    ];
    for (name, format, banks, events) in cases {
        let (log, _) = load(&format!("tpm2-tools/{name}"));
        assert_eq!(log.format, *format, "{name}");
        assert_eq!(log.banks(), banks.to_vec(), "{name}");
        // The README counts events after the Spec ID event for crypto-agile logs.
        let counted = log.events.len() - usize::from(log.format == Format::CryptoAgile);
        assert!(
            counted == *events || log.events.len() == *events,
            "{name}: {}",
            log.events.len()
        );
    }
}

#[test]
fn go_attestation_logs_verify_against_the_values_its_tests_supply() {
    let expected: serde_json::Value =
        serde_json::from_slice(&data("go-attestation/expected.json")).unwrap();
    let pcrs = |log: &str| -> PcrValues {
        let mut out = PcrValues::new();
        for (bank, values) in expected["logs"][log]["pcrs"].as_object().unwrap() {
            let alg = Alg::from_name(bank).unwrap();
            for (pcr, hexv) in values.as_object().unwrap() {
                out.entry(alg).or_default().insert(
                    pcr.parse().unwrap(),
                    hex::decode(hexv.as_str().unwrap()).unwrap(),
                );
            }
        }
        out
    };
    for name in ["sb_cert_eventlog", "option_rom_eventlog"] {
        let (log, _) = load(&format!("go-attestation/{name}"));
        let v = verify(&log, &pcrs(name), &[], &[Quirk::ExitBootServicesNotLogged]);
        assert!(v.ok(), "{name}: {v:?}");
        assert!(v.quirks.is_empty(), "{name}: needed no quirk");
    }
    // sb_cert: PCR 1 was never extended (all zeros in the quote): a policy
    // that needs it must see that (CVE-2021-42299).
    let (log, _) = load("go-attestation/sb_cert_eventlog");
    let v = verify(&log, &pcrs("sb_cert_eventlog"), &[1, 7], &[]);
    assert!(!v.ok());
    assert!(
        v.never_extended.contains(&(Alg::Sha1, 1)) && v.never_extended.contains(&(Alg::Sha256, 1))
    );
    assert!(!v.never_extended.contains(&(Alg::Sha1, 7)));

    // The firmware extended the Exit Boot Services actions into PCR 5
    // without logging them: it matches only through the named quirk.
    let (log, _) = load("go-attestation/ebs_event_missing_eventlog");
    let supplied = pcrs("ebs_event_missing_eventlog");
    let plain = verify(&log, &supplied, &[5], &[]);
    assert!(!plain.ok());
    assert_eq!(plain.mismatches.len(), 1);
    assert_eq!(
        (plain.mismatches[0].alg, plain.mismatches[0].pcr),
        (Alg::Sha1, 5)
    );
    let quirked = verify(&log, &supplied, &[5], &[Quirk::ExitBootServicesNotLogged]);
    assert!(quirked.ok(), "{quirked:?}");
    assert_eq!(quirked.quirks, vec![Quirk::ExitBootServicesNotLogged]);
    assert_eq!(quirked.matched, vec![(Alg::Sha1, 5)]);
    assert_eq!(quirked.not_in_log, vec![(Alg::Sha256, 5)]);
    // A log that did log them gains nothing from the quirk.
    let (log, _) = load("go-attestation/option_rom_eventlog");
    let mut wrong = pcrs("option_rom_eventlog");
    wrong.get_mut(&Alg::Sha1).unwrap().insert(5, vec![7; 20]);
    let v = verify(&log, &wrong, &[], &[Quirk::ExitBootServicesNotLogged]);
    assert!(!v.ok() && v.quirks.is_empty());

    for name in [
        "crypto_agile_eventlog",
        "short_no_action_eventlog",
        "coreos_36_shielded_vm_no_secure_boot_eventlog",
    ] {
        load(&format!("go-attestation/{name}"));
    }
    let (log, _) = load("go-attestation/short_no_action_eventlog");
    assert_eq!((log.format, log.events.len()), (Format::Sha1, 1));
    let (log, _) = load("go-attestation/crypto_agile_eventlog");
    assert_eq!(
        (log.format, log.banks()),
        (Format::CryptoAgile, vec![Alg::Sha256])
    );
}

#[test]
fn post_separator_authorities_as_go_attestation_counts_them() {
    let (_, facts) = load("go-attestation/sb_cert_eventlog");
    assert_eq!(
        facts.post_separator_authorities().count(),
        3,
        "{:#?}",
        facts.authorities
    );
    // shim's malformed authority (go-attestation issue 157) is read, and said.
    assert!(facts
        .authorities
        .iter()
        .any(|a| matches!(a.entry, AuthorityEntry::Certificate { owner: None, .. })));
    assert!(facts
        .warnings
        .iter()
        .any(|w| w.message.contains("issue 157")));
    assert!(facts.secure_boot_enabled());

    let (_, facts) = load("go-attestation/option_rom_eventlog");
    assert_eq!(
        facts.post_separator_authorities().count(),
        2,
        "{:#?}",
        facts.authorities
    );

    let (_, facts) = load("go-attestation/coreos_36_shielded_vm_no_secure_boot_eventlog");
    assert!(facts.mok_list_trusted.is_some(), "{facts:#?}");
    assert!(!facts.secure_boot_enabled());
}

fn secure_boot(facts: &BootFacts) -> Option<Vec<u8>> {
    facts.secure_boot.as_ref().map(|m| m.value.clone())
}

#[test]
fn secure_boot_state_and_boot_applications() {
    /// A log, its SecureBoot variable's data, boot application paths.
    type Case<'a> = (&'a str, Option<&'a [u8]>, &'a [&'a str]);
    let cases: &[Case<'_>] = &[
        (
            "tpm2-tools/event-bootorder.bin",
            Some(&[0]),
            &["\\EFI\\BOOT\\BOOTX64.EFI"],
        ),
        (
            "tpm2-tools/event-moklisttrusted.bin",
            Some(&[1]),
            &["\\EFI\\redhat\\shimx64.efi", "\\EFI\\redhat\\grubx64.efi"],
        ),
        ("tpm2-tools/event-postcode.bin", Some(&[1]), &[]),
        ("tpm2-tools/event-sd-boot-fedora37.bin", Some(&[]), &[]),
        (
            "tpm2-tools/event-uefi-sha1-log.bin",
            Some(&[]),
            &["\\EFI\\ubuntu\\shimx64.efi"],
        ),
        ("tpm2-tools/event-uefivar.bin", Some(&[1]), &[]),
        (
            "keylime/binary_bios_measurements",
            Some(&[0]),
            &["\\EFI\\fedora\\shimx64.efi", "\\EFI\\fedora\\grubx64.efi"],
        ),
        (
            "keylime/binary_bios_measurements-secureboot",
            Some(&[1]),
            &["\\EFI\\redhat\\shimx64.efi", "\\EFI\\redhat\\grubx64.efi"],
        ),
    ];
    for (name, sb, apps) in cases {
        let (_, facts) = load(name);
        assert_eq!(secure_boot(&facts).as_deref(), *sb, "{name}");
        let paths: Vec<String> = facts
            .boot_apps
            .iter()
            .filter_map(|a| a.path.clone())
            .collect();
        for app in *apps {
            assert!(
                paths.iter().any(|p| p.ends_with(app)),
                "{name}: {app} not in {paths:?}"
            );
        }
        for a in &facts.boot_apps {
            assert!(!a.authenticode.is_empty());
        }
    }
    let b64 = String::from_utf8(data("keylime/mb_log.b64")).unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.split_whitespace().collect::<String>())
        .unwrap();
    let log = parse(&bytes, &Limits::default()).unwrap();
    let facts = extract(&log, &Limits::default());
    assert!(facts.secure_boot_enabled());
    let paths: Vec<String> = facts
        .boot_apps
        .iter()
        .filter_map(|a| a.path.clone())
        .collect();
    assert!(
        paths
            .iter()
            .any(|p| p.ends_with("\\EFI\\centos\\grubx64.efi")),
        "{paths:?}"
    );
}

#[test]
fn firmware_versions_command_lines_and_gpt() {
    let (_, facts) = load("keylime/binary_bios_measurements");
    let v = &facts.scrtm_version[0].value;
    assert_eq!(v.text.as_deref().map(str::trim), Some("N40ET41W"));
    let (_, facts) = load("tpm2-tools/event-postcode.bin");
    assert_eq!(
        hex::encode(&facts.scrtm_version[0].value.raw),
        "1efb6b540c1d5540a4ad4ef4bf17b83a"
    );
    assert!(!facts.firmware_blobs.is_empty());

    // tpm2-tools' test reads this grub command from event 80.
    let (log, facts) = load("tpm2-tools/event-moklisttrusted.bin");
    let want = "menuentry UEFI Firmware Settings --id uefi-firmware {\n\t\tfwsetup\n\t}";
    let cmd = facts
        .grub_commands
        .iter()
        .find(|c| c.event == 80)
        .expect("event 80");
    assert_eq!(cmd.value, want);
    assert!(log.events[80]
        .data
        .starts_with(format!("grub_cmd: {want}").as_bytes()));
    assert!(!facts.kernel_cmdlines.is_empty());
    assert!(facts.sbat_level.is_some() || facts.mok_list_trusted.is_some());
    assert!(!facts.gpt.is_empty() && !facts.gpt[0].value.partitions.is_empty());
    let db = facts.db.as_ref().expect("db");
    assert!(db.value.complete && !db.value.entries.is_empty());
    let dbx = facts.dbx.as_ref().expect("dbx");
    assert!(dbx.value.complete && !dbx.value.entries.is_empty());

    let (_, facts) = load("tpm2-tools/event-sd-boot-fedora37.bin");
    assert!(
        facts
            .kernel_cmdlines
            .iter()
            .any(|c| c.value == "console=ttyS0 console=tty0 efi=debug"),
        "{:?}",
        facts.kernel_cmdlines
    );
}

#[test]
fn not_a_log_is_refused() {
    assert_eq!(
        parse(
            &data("keylime/binary_bios_measurements-empty"),
            &Limits::default()
        ),
        Err(ParseError::Empty)
    );
    assert!(parse(
        &data("keylime/binary_bios_measurements-bogus"),
        &Limits::default()
    )
    .is_err());
}

#[test]
fn official_dbx_updates_read_as_signature_lists() {
    let entries =
        bc_eventlog::parse_signature_update(&data("dbx/dbxupdate_x64-2021-04-29.bin"), 4096)
            .expect("uefi.org dbx update");
    assert_eq!(entries.len(), 211);
    assert!(entries
        .iter()
        .all(|s| matches!(s, bc_eventlog::Signature::Sha256 { .. })));
    let entries = bc_eventlog::parse_signature_update(&data("dbx/DBXUpdate2024.bin"), 4096)
        .expect("Microsoft 2024");
    assert_eq!(entries.len(), 4);
    assert_eq!(
        entries
            .iter()
            .filter(|s| matches!(s, bc_eventlog::Signature::X509 { .. }))
            .count(),
        1
    );
    assert_eq!(
        bc_eventlog::parse_signature_update(&data("dbx/DBXUpdate2024.bin"), 3),
        None
    );
    // The measured dbx of a real machine, read the same way.
    let (_, facts) = load("keylime/binary_bios_measurements");
    let dbx = facts.dbx.expect("dbx");
    assert!(dbx.value.complete);
    assert_eq!(dbx.value.entries.len(), 460);
}
