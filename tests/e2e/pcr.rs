//! The quote of a TPM join: only the PCRs the control plane's `pcr_policy`
//! checks, and the TPM commands a join costs.

use crate::harness::*;

const PCR_READ: u32 = 0x17E;
const FLUSH_CONTEXT: u32 = 0x165;
const NV_READ_PUBLIC: u32 = 0x169;
const GET_CAPABILITY: u32 = 0x17A;

fn policy(pcr: u32, value: &str) -> String {
    format!("[tpm.pcr_policy]\n\"{pcr}\" = \"{value}\"\n")
}

#[test]
fn a_join_without_a_pcr_policy_reads_no_pcr_and_flushes_no_session() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let before = tpm.command_codes().len();
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let codes = tpm.command_codes().split_off(before);
    let count = |cc: u32| codes.iter().filter(|&&c| c == cc).count();
    assert_eq!(count(PCR_READ), 0, "{codes:x?}");
    // The AK and the node key; the policy session ends with ActivateCredential.
    assert_eq!(count(FLUSH_CONTEXT), 2, "{codes:x?}");
    // The EK certificate's size comes from the name ESYS computed.
    assert_eq!(count(NV_READ_PUBLIC), 1, "{codes:x?}");
    // The EK NV listing alone: not the TPM's maker (its certificate is in
    // NV), and no PCR bank query without a policy.
    assert_eq!(count(GET_CAPABILITY), 1, "{codes:x?}");
    // 18 before; each command is pinned in tpmcount.rs.
    assert!(codes.len() <= 13, "{} commands: {codes:x?}", codes.len());
}

#[test]
fn a_join_quotes_the_pcrs_the_policy_names_and_meets_it() {
    // swtpm's PCR 0 after Startup(CLEAR), nothing measured: zeros.
    let cp = ControlPlane::start_trusting_test_maker_with(&policy(0, &"00".repeat(32)));
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let before = tpm.command_codes().len();
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let codes = tpm.command_codes().split_off(before);
    // One PCR, one PCR_Read: its value checked against the quote once.
    assert_eq!(codes.iter().filter(|&&c| c == PCR_READ).count(), 1);
    // The banks, asked once (beside the EK chain listing).
    let get_capability = codes.iter().filter(|&&c| c == GET_CAPABILITY).count();
    assert_eq!(get_capability, 2, "{codes:x?}");
    assert_eq!(cp.nodes().len(), 1);
}

#[test]
fn a_pcr_that_does_not_meet_the_policy_is_refused() {
    let cp = ControlPlane::start_trusting_test_maker_with(&policy(0, &"ab".repeat(32)));
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    assert_access_denied(&cp.refused_once(Refusal::Join("tpm"), "pcr-policy", || {
        agent.run(&["join", "--attestor", "tpm"])
    }));
    assert!(cp.nodes().is_empty());
}

/// Needs the failpoint, which only a `--features bcd/failpoints` build honours.
#[cfg(feature = "failpoints")]
#[test]
fn a_pcr_extended_between_the_read_and_the_quote_is_quoted_again() {
    const QUOTE: u32 = 0x158;
    // PCR 16 starts at zeros; the failpoint extends it once with sha256("bcd")
    // after bcd read it and before it quotes.
    let mut extended = vec![0u8; 32];
    extended.extend_from_slice(&bc_wire::sha256(b"bcd"));
    let value = hex::encode(bc_wire::sha256(&extended));
    let cp = ControlPlane::start_trusting_test_maker_with(&policy(16, &value));
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let before = tpm.command_codes().len();
    let out = agent
        .command(&["join", "--attestor", "tpm"])
        .env("BCD_FAILPOINT", "quote-extend-pcr16")
        .within();
    assert_ok(&out);
    let codes = tpm.command_codes().split_off(before);
    // The first quote did not match the values read before it: a second one.
    assert_eq!(codes.iter().filter(|&&c| c == QUOTE).count(), 2);
    assert_eq!(codes.iter().filter(|&&c| c == PCR_READ).count(), 2);
    assert_eq!(cp.nodes().len(), 1);
}
