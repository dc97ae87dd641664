//! Measured boot at join: a pool with a boot policy gets the TCG event log
//! and a quote of the policy's PCRs in every populated bank with a tpm
//! join's round 2, and the control plane replays and judges it.
//!
//! The agent reads a real log (eventlog/tests/data, tpm2-tools'
//! event-bootorder.bin: grub, SHA-1 and SHA-256) through its fake sysfs
//! (`BCD_SYSFS_ROOT`, failpoints builds); the test first extends the log's
//! events into the swtpm's PCRs with `tpm2_pcrextend`, as firmware would
//! have, so that the quote matches the replay.

use std::path::PathBuf;

use crate::harness::*;

pub(crate) const LOG: &str = "tpm2-tools/event-bootorder.bin";
pub(crate) const EV_NO_ACTION: u32 = 3;

pub(crate) fn data(name: &str) -> PathBuf {
    workspace().join("eventlog/tests/data").join(name)
}

pub(crate) fn read_log(name: &str) -> Vec<u8> {
    std::fs::read(data(name)).expect("an event log fixture")
}

/// Gives the agent's machine `log` as its firmware's event log.
pub(crate) fn install_log(agent: &Agent, log: &[u8]) {
    let path = agent
        .sysfs_root()
        .join("kernel/security/tpm0/binary_bios_measurements");
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, log).expect("write the event log");
}

/// Extends every event of `log` into the swtpm's SHA-256 bank, in order,
/// as the firmware that wrote the log did.
pub(crate) fn extend(tpm: &Swtpm, log: &[u8]) {
    extend_banks(tpm, log, &[bc_eventlog::Alg::Sha256]);
}

/// Extends every event of `log` into these banks of the swtpm.
fn extend_banks(tpm: &Swtpm, log: &[u8], banks: &[bc_eventlog::Alg]) {
    let parsed = bc_eventlog::parse(log, &bc_eventlog::Limits::default()).expect("the log parses");
    let specs: Vec<String> = parsed
        .events
        .iter()
        .filter(|e| e.event_type != EV_NO_ACTION)
        .flat_map(|e| {
            banks.iter().filter_map(move |alg| {
                let d = e.digest(*alg)?;
                Some(format!("{}:{}={}", e.pcr, alg.name(), hex::encode(d)))
            })
        })
        .collect();
    assert!(!specs.is_empty());
    let args: Vec<&str> = specs.iter().map(String::as_str).collect();
    assert_ok(&tpm.tool("tpm2_pcrextend", &args));
}

/// Sets the default pool's boot policy (where `resolve add` places a TPM).
pub(crate) fn set_policy(cp: &ControlPlane, toml: &str) {
    let file = cp.path().join("boot-policy.toml");
    std::fs::write(&file, toml).expect("write the policy");
    assert_ok(&cp.cli(&[
        "pools",
        "update",
        "--id",
        "default",
        "--boot-policy",
        file.to_str().expect("a UTF-8 path"),
    ]));
}

/// The starting policy the control plane writes from the fixture log (as
/// `boot-policy from-log` does): what that machine booted, allowed.
pub(crate) fn policy_from_log(_cp: &ControlPlane) -> String {
    policy_of(&read_log(LOG))
}

/// What `boot-policy from-log` writes for `log`.
fn policy_of(log: &[u8]) -> String {
    let limits = bc_eventlog::Limits::default();
    let parsed = bc_eventlog::parse(log, &limits).expect("the log parses");
    bc_controlplane::boot_policy::from_facts(&bc_eventlog::extract(&parsed, &limits))
}

/// A control plane, a swtpm extended with `extended` (if any), and an
/// allow-listed agent on it whose machine shows `log`.
pub(crate) fn machine(extended: Option<&[u8]>, log: &[u8]) -> (ControlPlane, Swtpm, Agent) {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    if let Some(l) = extended {
        extend(&tpm, l);
    }
    let agent = Agent::with_tpm(&cp, &tpm);
    install_log(&agent, log);
    agent.allow_ek(&cp);
    (cp, tpm, agent)
}

#[test]
fn a_join_whose_log_meets_the_pools_boot_policy_is_admitted() {
    let log = read_log(LOG);
    let (cp, tpm, agent) = machine(Some(&log), &log);
    let policy = policy_from_log(&cp);
    set_policy(&cp, &policy);
    let before = tpm.command_codes().len();
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let codes = tpm.command_codes().split_off(before);
    assert_eq!(cp.nodes().len(), 1);
    // One quote of every needed PCR in the one populated bank: the
    // allocation asked once beside the EK chain listing, and no more than
    // one PCR_Read per 8 PCRs.
    let count = |cc: u32| codes.iter().filter(|&&c| c == cc).count();
    assert_eq!(count(0x158), 1, "{codes:x?}");
    assert_eq!(count(0x17A), 2, "{codes:x?}");
    assert_eq!(count(0x17E), 1, "{codes:x?}");
    // 13 without a policy (tpmcount.rs), and the banks, the PCR_Read, the
    // Quote: 16.
    assert_eq!(codes.len(), 16, "{codes:x?}");
}

#[test]
fn a_join_whose_log_the_boot_policy_does_not_allow_is_refused_boot_app() {
    let log = read_log(LOG);
    let (cp, _tpm, agent) = machine(Some(&log), &log);
    set_policy(
        &cp,
        &format!("[[boot_app]]\ndigest = \"{}\"\n", "ab".repeat(32)),
    );
    let out = cp.refused_once(Refusal::Join("tpm"), "boot-app", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    let data = &cp.refusal("boot-app")["data"];
    assert!(
        data["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "{data}"
    );
    assert!(data["eventIndex"].as_u64().is_some(), "{data}");
    assert_eq!(data["poolId"], "default", "{data}");
    assert!(cp.nodes().is_empty());
}

#[test]
fn a_log_altered_after_boot_is_refused_eventlog_replay() {
    let log = read_log(LOG);
    // The TPM saw the real boot; the log sent claims another PCR 4 event.
    let parsed = bc_eventlog::parse(&log, &bc_eventlog::Limits::default()).expect("parses");
    let event = parsed
        .events
        .iter()
        .find(|e| e.pcr == 4 && e.event_type != EV_NO_ACTION)
        .expect("a PCR 4 event");
    let digest = event
        .digest(bc_eventlog::Alg::Sha256)
        .expect("a SHA-256 digest");
    let at = event.offset
        + log[event.offset..]
            .windows(digest.len())
            .position(|w| w == digest)
            .expect("the digest in the log");
    let mut altered = log.clone();
    altered[at] ^= 0xff;
    let (cp, _tpm, agent) = machine(Some(&log), &altered);
    set_policy(&cp, &policy_from_log(&cp));
    let out = cp.refused_once(Refusal::Join("tpm"), "eventlog-replay", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    let data = &cp.refusal("eventlog-replay")["data"];
    let detail = data["detail"].as_str().unwrap_or_default();
    assert!(detail.starts_with("PCR 4 in the sha256 bank"), "{data}");
    assert!(data["eventIndex"].as_u64().is_some(), "{data}");
    assert!(cp.nodes().is_empty());
}

#[test]
fn a_pcr_every_boot_extends_left_unextended_is_refused_eventlog_bank_empty() {
    let log = read_log(LOG);
    // Nothing extended: the TPM's PCRs 0 and 7 are still zeros.
    let (cp, _tpm, agent) = machine(None, &log);
    set_policy(&cp, &policy_from_log(&cp));
    let out = cp.refused_once(Refusal::Join("tpm"), "eventlog-bank-empty", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    let data = &cp.refusal("eventlog-bank-empty")["data"];
    assert!(
        data["detail"]
            .as_str()
            .is_some_and(|d| d.contains("in the sha256 bank was never extended")),
        "{data}"
    );
    assert!(cp.nodes().is_empty());
}

#[test]
fn a_log_that_does_not_parse_is_refused_eventlog_malformed() {
    let log = read_log(LOG);
    let (cp, _tpm, agent) = machine(
        Some(&log),
        &read_log("keylime/binary_bios_measurements-bogus"),
    );
    set_policy(&cp, &policy_from_log(&cp));
    let out = cp.refused_once(Refusal::Join("tpm"), "eventlog-malformed", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    assert!(cp.refusal("eventlog-malformed")["data"]["detail"]
        .as_str()
        .is_some_and(|d| !d.is_empty()));
    assert!(cp.nodes().is_empty());
}

#[test]
fn a_machine_without_an_event_log_says_what_to_do_and_sends_nothing() {
    let log = read_log(LOG);
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    extend(&tpm, &log);
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    set_policy(&cp, &policy_from_log(&cp));
    let out = agent.run(&["join", "--attestor", "tpm"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("binary_bios_measurements") && err.contains("securityfs"),
        "{err}"
    );
    assert!(cp.nodes().is_empty());
}

#[test]
fn a_pool_without_a_boot_policy_asks_for_no_log() {
    // A bogus log the agent would send if asked: the join is admitted.
    let (cp, _tpm, agent) = machine(None, b"bogus");
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    assert_eq!(cp.nodes().len(), 1);
}

#[test]
fn a_tpm_with_two_banks_is_quoted_and_replayed_in_both() {
    use bc_eventlog::Alg;
    let log = read_log(LOG);
    let cp = ControlPlane::start_trusting_test_maker();
    set_policy(&cp, &policy_from_log(&cp));
    // Both banks extended, as the firmware that wrote the log did.
    let tpm = Swtpm::start_two_banks();
    extend_banks(&tpm, &log, &[Alg::Sha1, Alg::Sha256]);
    let agent = Agent::with_tpm(&cp, &tpm);
    install_log(&agent, &log);
    agent.allow_ek(&cp);
    let before = tpm.command_codes().len();
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    assert_eq!(cp.nodes().len(), 1);
    // One Quote of both banks; one PCR_Read per bank (at most 8 PCRs each).
    let codes = tpm.command_codes().split_off(before);
    let count = |cc: u32| codes.iter().filter(|&&c| c == cc).count();
    assert_eq!((count(0x158), count(0x17E)), (1, 2), "{codes:x?}");
    assert_eq!(codes.len(), 17, "{codes:x?}");
    // Firmware that extended only the SHA-256 bank leaves the SHA-1 one for
    // anyone to extend to a forged log's values (CVE-2021-42299): refused.
    let cp = ControlPlane::start_trusting_test_maker();
    set_policy(&cp, &policy_from_log(&cp));
    let tpm = Swtpm::start_two_banks();
    extend_banks(&tpm, &log, &[Alg::Sha256]);
    let agent = Agent::with_tpm(&cp, &tpm);
    install_log(&agent, &log);
    agent.allow_ek(&cp);
    let out = cp.refused_once(Refusal::Join("tpm"), "eventlog-bank-empty", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    let data = &cp.refusal("eventlog-bank-empty")["data"];
    assert!(
        data["detail"]
            .as_str()
            .is_some_and(|d| d.contains("in the sha1 bank was never extended")),
        "{data}"
    );
}

/// A join from the fixture machine under `policy` (TOML) is refused with
/// `reason`, at the agent (ACCESS_DENIED) and at the server (the event's
/// detail and pool).
fn refused_by_policy(policy: &str, reason: &str) -> serde_json::Value {
    let log = read_log(LOG);
    let (cp, _tpm, agent) = machine(Some(&log), &log);
    set_policy(&cp, policy);
    let out = cp.refused_once(Refusal::Join("tpm"), reason, || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    assert!(cp.nodes().is_empty());
    let data = cp.refusal(reason)["data"].clone();
    assert!(
        data["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "{data}"
    );
    assert_eq!(data["poolId"], "default", "{data}");
    data
}

#[test]
fn secure_boot_off_under_a_policy_that_requires_it_is_refused_boot_secure_boot() {
    let data = refused_by_policy("secure_boot = \"required\"\n", "boot-secure-boot");
    assert!(data["eventIndex"].as_u64().is_some(), "{data}");
}

#[test]
fn a_dbx_without_the_entries_of_an_official_update_is_refused_boot_dbx() {
    let update = data("dbx/DBXUpdate2024.bin");
    refused_by_policy(
        &format!("dbx_min = {:?}\n", update.to_str().expect("a UTF-8 path")),
        "boot-dbx",
    );
}

#[test]
fn a_kernel_command_line_no_pattern_allows_is_refused_boot_cmdline() {
    let data = refused_by_policy("cmdline = [\"root=/dev/nowhere *\"]\n", "boot-cmdline");
    assert!(data["eventIndex"].as_u64().is_some(), "{data}");
}

#[test]
fn firmware_older_than_the_policys_minimum_is_refused_boot_firmware() {
    refused_by_policy("[firmware]\nmin_version = [\"9999\"]\n", "boot-firmware");
}

#[test]
fn a_pcr_policy_beside_a_boot_policy_is_checked_in_the_quote_of_every_bank() {
    let log = read_log(LOG);
    // PCR 0 of the SHA-256 bank once the log is extended (tpm2-tools'
    // golden output for this log).
    let pcr0 = "804c3cb76b471627372c8e5ebd068d1f8f8af088af43dc9de620af652f11116f";
    for (value, admitted) in [(pcr0.to_owned(), true), ("ab".repeat(32), false)] {
        let cp = ControlPlane::start_trusting_test_maker_with(&format!(
            "[tpm.pcr_policy]\n\"0\" = \"{value}\"\n"
        ));
        set_policy(&cp, &policy_from_log(&cp));
        let tpm = Swtpm::start_two_banks();
        extend_banks(
            &tpm,
            &log,
            &[bc_eventlog::Alg::Sha1, bc_eventlog::Alg::Sha256],
        );
        let agent = Agent::with_tpm(&cp, &tpm);
        install_log(&agent, &log);
        agent.allow_ek(&cp);
        if admitted {
            assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
            assert_eq!(cp.nodes().len(), 1);
        } else {
            assert_access_denied(&cp.refused_once(Refusal::Join("tpm"), "pcr-policy", || {
                agent.run(&["join", "--attestor", "tpm"])
            }));
        }
    }
}

#[test]
fn a_sha1_format_log_larger_than_other_requests_joins_from_a_sha1_only_tpm() {
    // go-attestation's option ROM log: the SHA-1 format, 72 KiB (past the
    // 64 KiB of other requests), from a TPM with only a SHA-1 bank.
    let (cp, _tpm, agent) = sha1_machine_with_a_large_log();
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    assert_eq!(cp.nodes().len(), 1);
}

/// go-attestation's option ROM log: the SHA-1 format, 72 KiB (past the 64
/// KiB of other requests), on a TPM with only a SHA-1 bank extended with it,
/// under the policy it gives; the agent allow-listed.
pub(crate) fn sha1_machine_with_a_large_log() -> (ControlPlane, Swtpm, Agent) {
    let log = read_log("go-attestation/option_rom_eventlog");
    assert!(log.len() > 64 * 1024);
    let cp = ControlPlane::start_trusting_test_maker();
    set_policy(&cp, &policy_of(&log));
    let tpm = Swtpm::start_sha1_only();
    extend_banks(&tpm, &log, &[bc_eventlog::Alg::Sha1]);
    let agent = Agent::with_tpm(&cp, &tpm);
    install_log(&agent, &log);
    agent.allow_ek(&cp);
    (cp, tpm, agent)
}
