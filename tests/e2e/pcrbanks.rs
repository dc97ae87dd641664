//! PCR banks: a TPM of older server firmware (only a SHA-1 bank, swtpm
//! manufactured with `--pcr-banks sha1`) joins when the policy lets it, and
//! is stopped before round 2 with the firmware setting to change when the
//! policy needs SHA-256.

use crate::harness::*;

const PCR_READ: u32 = 0x17E;
const QUOTE: u32 = 0x158;
const ACTIVATE_CREDENTIAL: u32 = 0x147;

/// PCR `pcr` must have `value` in `bank` ("" is the first, SHA-256 form).
fn policy(bank: &str, pcr: u32, value: &str) -> String {
    let table = if bank.is_empty() {
        "[tpm.pcr_policy]".to_owned()
    } else {
        format!("[tpm.pcr_policy.{bank}]")
    };
    format!("{table}\n\"{pcr}\" = \"{value}\"\n")
}

/// swtpm's PCR 0 after Startup(CLEAR), nothing measured: zeros, in any bank.
fn zeros(bank: &str) -> String {
    "00".repeat(if bank == "sha1" { 20 } else { 32 })
}

fn join(cp: &ControlPlane, tpm: &Swtpm) -> (std::process::Output, Vec<u32>) {
    let agent = Agent::with_tpm(cp, tpm);
    agent.allow_ek(cp);
    let before = tpm.command_codes().len();
    let out = agent.run(&["join", "--attestor", "tpm"]);
    (out, tpm.command_codes().split_off(before))
}

fn count(codes: &[u32], cc: u32) -> usize {
    codes.iter().filter(|&&c| c == cc).count()
}

#[test]
fn a_sha1_only_tpm_joins_without_a_policy_and_meets_a_sha1_one() {
    let tpm = Swtpm::start_sha1_only();
    // No policy: an empty selection, whatever the banks.
    let cp = ControlPlane::start_trusting_test_maker();
    let (out, codes) = join(&cp, &tpm);
    assert_ok(&out);
    assert_eq!(count(&codes, PCR_READ), 0, "{codes:x?}");
    assert_eq!(cp.nodes().len(), 1);

    // A SHA-1 policy: quoted in the SHA-1 bank, and met.
    let cp = ControlPlane::start_trusting_test_maker_with(&policy("sha1", 0, &zeros("sha1")));
    let (out, codes) = join(&cp, &tpm);
    assert_ok(&out);
    assert_eq!(count(&codes, PCR_READ), 1, "{codes:x?}");
    assert_eq!(cp.nodes().len(), 1);
}

#[test]
fn a_policy_in_both_banks_is_quoted_in_sha256_when_the_tpm_has_it_else_sha1() {
    // The SHA-256 value is wrong for every swtpm, the SHA-1 one right: the
    // SHA-1-only TPM joins (it quoted SHA-1), the SHA-256 one is refused
    // (it quoted SHA-256, preferred).
    let both = format!(
        "{}[tpm.pcr_policy.sha1]\n\"0\" = \"{}\"\n",
        policy("", 0, &"ab".repeat(32)),
        zeros("sha1")
    );
    let cp = ControlPlane::start_trusting_test_maker_with(&both);
    let (out, _) = join(&cp, &Swtpm::start_sha1_only());
    assert_ok(&out);
    let (out, _) = join(&cp, &Swtpm::start());
    assert_access_denied(&out);
    assert_eq!(cp.refusal_reasons(), ["pcr-policy"]);
    assert_eq!(cp.nodes().len(), 1);
}

#[test]
fn a_sha1_only_tpm_is_stopped_before_round_two_when_the_policy_needs_sha256() {
    let cp = ControlPlane::start_trusting_test_maker_with(&policy("", 0, &zeros("sha256")));
    let tpm = Swtpm::start_sha1_only();
    let (out, codes) = join(&cp, &tpm);
    assert!(!out.status.success());
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("checks PCRs 0 in the SHA-256 bank, but this TPM has only a SHA-1 bank")
            && err.contains("enable the SHA-256 PCR bank in the firmware's TPM settings"),
        "{err}"
    );
    // Nothing of round 2 happened: no credential activated, nothing read
    // or quoted, and the control plane saw no answer (an answer is either
    // a refusal or a node).
    for cc in [ACTIVATE_CREDENTIAL, QUOTE, PCR_READ] {
        assert_eq!(count(&codes, cc), 0, "{cc:x} in {codes:x?}");
    }
    assert!(cp.refusals().is_empty(), "{:?}", cp.refusals());
    assert!(cp.nodes().is_empty());
}

#[test]
fn a_sha1_value_that_does_not_match_is_refused_pcr_policy() {
    let cp = ControlPlane::start_trusting_test_maker_with(&policy("sha1", 0, &"ab".repeat(20)));
    let tpm = Swtpm::start_sha1_only();
    let (out, codes) = join(&cp, &tpm);
    assert_access_denied(&out);
    // It was quoted: the refusal is the control plane's.
    assert_eq!(count(&codes, QUOTE), 1, "{codes:x?}");
    assert_eq!(cp.refusal_reasons(), ["pcr-policy"]);
    assert!(cp.nodes().is_empty());
}
