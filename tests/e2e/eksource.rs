//! Where a TPM's EK certificate comes from when NV holds none (issue 18,
//! second half): an operator's pin of an uncertified EK (`resolve add
//! --uncertified`).

use crate::harness::*;
use crate::maker::nv_remove;

/// A TPM whose maker put no EK certificate in NV (NitroTPM, Intel PTT on
/// many platforms): swtpm's RSA and P-384 EK certificates removed.
pub fn without_ek_certificates(tpm: &Swtpm) {
    nv_remove(tpm, "0x01c00002");
    nv_remove(tpm, "0x01c00016");
}

#[test]
fn an_uncertified_ek_joins_only_when_pinned_so() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    without_ek_certificates(&tpm);
    let agent = Agent::with_tpm(&cp, &tpm);
    let id = agent.identify();
    assert_eq!(id["ekCertificate"]["present"], false, "{id}");
    let ek = id["ekSha256"].as_str().unwrap().to_owned();

    // Unknown, and without a certificate: ek-chain, nothing written.
    let out = agent.run(&["join", "--attestor", "tpm"]);
    assert_access_denied(&out);
    agent.assert_nothing_written();
    assert_eq!(cp.refusal_reasons().last().unwrap(), "ek-chain");

    // Allow-listed, but not as uncertified: still ek-chain.
    assert_ok(&cp.cli(&["resolve", "add", "--ek-sha256", &ek]));
    let out = agent.run(&["join", "--attestor", "tpm"]);
    assert_access_denied(&out);
    assert_eq!(cp.refusal_reasons().len(), 2);
    assert_eq!(cp.refusal_reasons().last().unwrap(), "ek-chain");

    // Pinned as uncertified: that EK joins, with a certified node key.
    let out = cp.cli(&["resolve", "add", "--ek-sha256", &ek, "--uncertified"]);
    assert_ok(&out);
    assert!(stdout(&out).ends_with(" uncertified\n"), "{}", stdout(&out));
    let listed = cp.json(&["resolve", "list"]);
    assert_eq!(listed[0]["uncertified"], true, "{listed}");
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let node = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    let nodes = cp.nodes();
    assert!(nodes.iter().any(|n| n["nodeId"] == node.as_str()), "{nodes:?}");

    // The pin is for that EK alone: another uncertified TPM is refused.
    let other = Swtpm::start_another_machine();
    without_ek_certificates(&other);
    let stranger = Agent::with_tpm(&cp, &other);
    assert_access_denied(&stranger.run(&["join", "--attestor", "tpm"]));
    assert_eq!(cp.refusal_reasons().last().unwrap(), "ek-chain");
}

/// A pinned EK that sends a certificate is verified as usual: the pin is
/// no way around a certificate the control plane does not trust.
#[test]
fn a_pinned_ek_that_sends_a_certificate_is_verified() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start_other_maker();
    let agent = Agent::with_tpm(&cp, &tpm);
    let ek = agent.identify()["ekSha256"].as_str().unwrap().to_owned();
    assert_ok(&cp.cli(&["resolve", "add", "--ek-sha256", &ek, "--uncertified"]));
    assert_access_denied(&agent.run(&["join", "--attestor", "tpm"]));
    assert_eq!(cp.refusal_reasons().last().unwrap(), "ek-chain");
}
