//! Measured boot at renewal: a node joined under its pool's boot policy
//! renews only while it still boots what the policy allows. The control
//! plane answers the renewal with a boot challenge; bcd sends the same CSR
//! again with the event log and a quote of the policy's PCRs, taken beside
//! a new certification of the next key; the control plane judges it as it
//! judged the join.
//!
//! The "reboot" is the fixture machine's boot (mboot.rs) with one more
//! event: appended to the log the agent reads and extended into the
//! swtpm's SHA-256 bank with `tpm2_pcrextend`, as firmware or grub would
//! (another kernel's digest in PCR 4, another command line in PCR 8); or
//! appended to the log only, which the PCRs then contradict.

use bc_eventlog::Alg;

use crate::harness::*;
use crate::mboot::{install_log, machine, policy_from_log, read_log, set_policy, LOG};

const EV_IPL: u32 = 0x0D;
const EV_EFI_BOOT_SERVICES_APPLICATION: u32 = 0x8000_0003;
const QUOTE: u32 = 0x158;
const CERTIFY: u32 = 0x148;
const PCR_READ: u32 = 0x17E;

/// A crypto-agile event (TCG_PCR_EVENT2) with the SHA-1 and SHA-256
/// digests of `data`, the fixture log's two algorithms.
fn event(pcr: u32, event_type: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&pcr.to_le_bytes());
    out.extend_from_slice(&event_type.to_le_bytes());
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&0x0004u16.to_le_bytes());
    out.extend_from_slice(&Alg::Sha1.hash(data));
    out.extend_from_slice(&0x000Bu16.to_le_bytes());
    out.extend_from_slice(&Alg::Sha256.hash(data));
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// Another kernel: a boot application no policy from the fixture allows
/// (an UEFI_IMAGE_LOAD_EVENT without a device path), in PCR 4.
fn other_kernel() -> Vec<u8> {
    let mut data = vec![0u8; 32];
    data[..8].copy_from_slice(&0x1234_0000u64.to_le_bytes());
    event(4, EV_EFI_BOOT_SERVICES_APPLICATION, &data)
}

/// Another kernel command line, as grub measures it in PCR 8.
fn other_cmdline() -> Vec<u8> {
    event(
        8,
        EV_IPL,
        b"kernel_cmdline: /vmlinuz root=/dev/sdz1 init=/bin/sh\0",
    )
}

/// The machine reboots into the fixture's boot plus `extra` (a whole
/// event): the agent's log gains it, and its digest is extended into the
/// TPM unless `extended` is false (a log the PCRs contradict).
fn reboot_with(tpm: &Swtpm, agent: &Agent, extra: &[u8], extended: bool) {
    let mut log = read_log(LOG);
    log.extend_from_slice(extra);
    let parsed = bc_eventlog::parse(&log, &bc_eventlog::Limits::default()).expect("the log parses");
    let last = parsed.events.last().expect("an event");
    if extended {
        let d = last.digest(Alg::Sha256).expect("a SHA-256 digest");
        let spec = format!("{}:sha256={}", last.pcr, hex::encode(d));
        assert_ok(&tpm.tool("tpm2_pcrextend", &[&spec]));
    }
    install_log(agent, &log);
}

/// A node joined from the fixture machine under the policy its own log
/// gives (what `boot-policy from-log` writes).
fn joined() -> (ControlPlane, Swtpm, Agent) {
    let log = read_log(LOG);
    let (cp, tpm, agent) = machine(Some(&log), &log);
    set_policy(&cp, &policy_from_log(&cp));
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    (cp, tpm, agent)
}

/// The node's only id.
fn node_id(cp: &ControlPlane) -> String {
    let nodes = cp.nodes();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    nodes[0]["nodeId"].as_str().expect("a node id").to_owned()
}

/// `nodes show --json`'s last verified boot.
fn last_boot(cp: &ControlPlane) -> serde_json::Value {
    let out = cp.cli(&["nodes", "show", &node_id(cp), "--json"]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v["lastVerifiedBoot"].clone()
}

/// One `bcd node --once --renew-now` that renews, with boot evidence or
/// not: the TPM commands it ran, of which (Certify, Quote, PCR_Read) are
/// `counts`.
fn renewal_commands(
    tpm: &Swtpm,
    agent: &Agent,
    boot: bool,
    counts: (usize, usize, usize),
) -> Vec<u32> {
    let before = tpm.command_codes().len();
    let out = agent.run(&["node", "--once", "--renew-now"]);
    assert_ok(&out);
    let said = format!("boot_evidence={boot}");
    assert!(stderr(&out).contains(&said), "{}", stderr(&out));
    let codes = tpm.command_codes().split_off(before);
    let count = |cc: u32| codes.iter().filter(|&&c| c == cc).count();
    assert_eq!(
        (count(CERTIFY), count(QUOTE), count(PCR_READ)),
        counts,
        "{codes:x?}"
    );
    codes
}

/// One `bcd node --once --renew-now` the control plane refuses for the
/// machine's boot with `reason`: exit 1, the reason in bcd's words, and
/// `security.renew.refused` with the reason, its detail and (if `event`)
/// the event index. The node keeps its certificate.
fn renewal_refused(cp: &ControlPlane, agent: &Agent, reason: &str, indexed: bool) -> String {
    renewal_refused_at(cp, agent, reason, indexed, "")
}

/// [`renewal_refused`], with bcd's failpoint `failpoint` (empty: none)
/// altering the evidence it sends.
fn renewal_refused_at(
    cp: &ControlPlane,
    agent: &Agent,
    reason: &str,
    indexed: bool,
    failpoint: &str,
) -> String {
    let chain = std::fs::read(agent.data_dir.join("identity.json")).expect("identity");
    let out = cp.refused_once(Refusal::Renew, reason, || {
        let mut node = agent.command(&["node", "--once", "--renew-now"]);
        if !failpoint.is_empty() {
            node.env("BCD_FAILPOINT", failpoint);
        }
        node.within()
    });
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "Renew refused by the pool's boot policy: {reason}: "
        )),
        "{err}"
    );
    let event = cp
        .events()
        .into_iter()
        .rfind(|e| e["type"] == "security.renew.refused" && e["reason"] == reason)
        .expect("the refusal's event");
    let data = &event["data"];
    let detail = data["detail"].as_str().unwrap_or_default().to_owned();
    assert!(!detail.is_empty(), "{data}");
    assert_eq!(data["eventIndex"].as_u64().is_some(), indexed, "{data}");
    // (its words cut to a printable length)
    let head: String = detail.chars().take(60).collect();
    assert!(err.contains(&head), "bcd names what failed: {err}");
    assert_eq!(
        std::fs::read(agent.data_dir.join("identity.json")).expect("identity"),
        chain,
        "a refused renewal changes nothing"
    );
    detail
}

#[test]
fn a_node_joined_under_a_boot_policy_renews_with_its_boot_and_shows_it() {
    let (cp, tpm, agent) = joined();
    let boot = last_boot(&cp);
    assert_eq!(boot["via"], "join", "{boot}");
    assert_eq!(boot["secureBoot"], "off", "{boot}");
    assert!(
        boot["cmdline"].as_str().is_some_and(|c| !c.is_empty()),
        "{boot}"
    );
    // The first request's certification, the challenge's certification
    // and, on the same connection, the quote of PCRs 0, 4, 7, 8, 12 in the
    // one populated bank (one PCR_Read of at most 8 PCRs).
    let codes = renewal_commands(&tpm, &agent, true, (2, 1, 1));
    // tpmcount.rs's 9 and, for the challenge: the next key flushed (room
    // for the AK and the staged key's copy beside the current key), the AK
    // and that copy derived, the certification, the banks, the PCR_Read,
    // the Quote, both flushed, and the second request's handshake; the
    // renewed key, not loaded again, needs no flush at exit.
    eprintln!(
        "bench: a renewal under a boot policy: {} TPM commands",
        codes.len()
    );
    assert_eq!(codes.len(), 18, "{codes:x?}");
    assert_eq!(tpm.transient_handles(), Vec::<String>::new());
    let renewed = last_boot(&cp);
    assert_eq!(renewed["via"], "renew", "{renewed}");
    assert_eq!(renewed["bootApps"], boot["bootApps"], "{renewed}");
    assert_ne!(renewed["verifiedAt"], serde_json::Value::Null);
    // The text form names the same.
    let text = stdout(&cp.cli(&["nodes", "show", &node_id(&cp)]));
    assert!(text.contains("secure boot:  off"), "{text}");
    assert!(text.contains("cmdline:"), "{text}");
    let renewed_event = cp
        .events()
        .into_iter()
        .rfind(|e| e["type"] == "node.renewed")
        .expect("a node.renewed event");
    assert_eq!(
        renewed_event["data"]["bootVerified"], true,
        "{renewed_event}"
    );
}

#[test]
fn a_renewal_after_a_reboot_into_another_kernel_is_refused_boot_app() {
    let (cp, tpm, agent) = joined();
    reboot_with(&tpm, &agent, &other_kernel(), true);
    let detail = renewal_refused(&cp, &agent, "boot-app", true);
    assert!(
        detail.contains("is allowed by no boot_app entry"),
        "{detail}"
    );
    // The last verified boot is still the join's.
    assert_eq!(last_boot(&cp)["via"], "join");
    // bcd doctor says why the node stopped renewing.
    let out = agent.run(&["doctor"]);
    let text = stdout(&out);
    assert!(
        text.contains("for this machine's boot (boot-app)") && text.contains("boot policy"),
        "{text}"
    );
    assert!(!out.status.success());
}

#[test]
fn a_renewal_after_a_reboot_with_another_command_line_is_refused_boot_cmdline() {
    let (cp, tpm, agent) = joined();
    reboot_with(&tpm, &agent, &other_cmdline(), true);
    let detail = renewal_refused(&cp, &agent, "boot-cmdline", true);
    assert!(detail.contains("init=/bin/sh"), "{detail}");
}

#[test]
fn a_renewal_whose_log_the_pcrs_contradict_is_refused_eventlog_replay() {
    let (cp, tpm, agent) = joined();
    // The log claims another kernel; the TPM never measured it.
    reboot_with(&tpm, &agent, &other_kernel(), false);
    let detail = renewal_refused(&cp, &agent, "eventlog-replay", true);
    assert!(detail.starts_with("PCR 4 in the sha256 bank"), "{detail}");
}

#[test]
fn a_renewal_under_a_policy_raised_to_secure_boot_is_refused_boot_secure_boot() {
    // The operator requires Secure Boot after the join; the machine (the
    // fixture's firmware) boots with it off.
    let (cp, _tpm, agent) = joined();
    let policy = policy_from_log(&cp);
    let raised = policy.replace("secure_boot = \"allowed\"", "secure_boot = \"required\"");
    assert_ne!(raised, policy);
    set_policy(&cp, &raised);
    let detail = renewal_refused(&cp, &agent, "boot-secure-boot", true);
    assert!(detail.contains("SecureBoot"), "{detail}");
}

#[test]
fn a_node_whose_pool_has_no_boot_policy_renews_as_before() {
    // A log the control plane would refuse, were it read and sent.
    let (cp, tpm, agent) = machine(None, b"bogus");
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    // tpmcount.rs's renewal: one certification, no quote, no PCR read.
    let codes = renewal_commands(&tpm, &agent, false, (1, 0, 0));
    assert_eq!(codes.len(), 9, "{codes:x?}");
    assert_eq!(last_boot(&cp), serde_json::Value::Null);
}

#[test]
fn a_renewal_after_a_reboot_whose_log_does_not_parse_is_refused_eventlog_malformed() {
    let (cp, _tpm, agent) = joined();
    install_log(&agent, &read_log("keylime/binary_bios_measurements-bogus"));
    renewal_refused(&cp, &agent, "eventlog-malformed", false);
}

#[test]
fn a_policy_set_after_a_join_of_an_unmeasured_boot_is_refused_eventlog_bank_empty() {
    // Joined before the pool had a policy, on a TPM nobody extended; the
    // operator then sets one: PCRs 0 and 7 are still zeros.
    let log = read_log(LOG);
    let (cp, _tpm, agent) = machine(None, &log);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    set_policy(&cp, &policy_from_log(&cp));
    let detail = renewal_refused(&cp, &agent, "eventlog-bank-empty", false);
    assert!(
        detail.contains("in the sha256 bank was never extended"),
        "{detail}"
    );
}

#[test]
fn a_policy_raised_to_an_official_dbx_update_is_refused_boot_dbx() {
    let (cp, _tpm, agent) = joined();
    let update = crate::mboot::data("dbx/DBXUpdate2024.bin");
    // A top-level key: before the policy's tables.
    set_policy(
        &cp,
        &format!(
            "dbx_min = {:?}\n{}",
            update.to_str().expect("a UTF-8 path"),
            policy_from_log(&cp)
        ),
    );
    renewal_refused(&cp, &agent, "boot-dbx", true);
}

#[test]
fn a_policy_raised_to_newer_firmware_is_refused_boot_firmware() {
    let (cp, _tpm, agent) = joined();
    // The policy the node joined under, its firmware minimum raised.
    let mut raised: String = policy_from_log(&cp)
        .lines()
        .filter(|l| !l.starts_with("[firmware]") && !l.starts_with("min_version"))
        .map(|l| format!("{l}\n"))
        .collect();
    raised.push_str("[firmware]\nmin_version = [\"9999\"]\n");
    set_policy(&cp, &raised);
    renewal_refused(&cp, &agent, "boot-firmware", true);
}

#[test]
fn boot_evidence_altered_on_its_way_is_refused_quote_signature_nonce_pcrs() {
    altered_evidence_refused("quote-signature", "renew-boot-quote-signature");
    altered_evidence_refused("quote-nonce", "renew-boot-quote-nonce");
    altered_evidence_refused("quote-pcrs", "renew-boot-quote-pcrs");
}

/// A joined node whose renewal's evidence bcd's `failpoint` alters is
/// refused with `reason`.
fn altered_evidence_refused(reason: &str, failpoint: &str) {
    let (cp, _tpm, agent) = joined();
    renewal_refused_at(&cp, &agent, reason, false, failpoint);
}

#[test]
fn a_renewal_whose_log_is_larger_than_other_requests_is_judged() {
    // 72 KiB of SHA-1 log: the renewal carries it past the 64 KiB of
    // other requests, as the join did.
    let (cp, _tpm, agent) = crate::mboot::sha1_machine_with_a_large_log();
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let out = agent.run(&["node", "--once", "--renew-now"]);
    assert_ok(&out);
    assert_eq!(last_boot(&cp)["via"], "renew");
}
