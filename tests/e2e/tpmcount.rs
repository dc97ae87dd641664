//! What a TPM join and a TPM renewal cost, command by command (what
//! `scripts/bench` prints), on a swtpm with its EK persisted and no PCR
//! policy; and that bcd leaves no transient object loaded when it exits
//! (swtpm's TCP TCTI has no resource manager to flush for it).

use std::collections::BTreeMap;

use crate::harness::*;

const ACTIVATE_CREDENTIAL: u32 = 0x147;
const CERTIFY: u32 = 0x148;
const FLUSH_CONTEXT: u32 = 0x165;

/// TPM command codes by name (TPM 2.0 Part 2, TPM_CC).
const NAMES: &[(u32, &str)] = &[
    (0x131, "CreatePrimary"),
    (ACTIVATE_CREDENTIAL, "ActivateCredential"),
    (CERTIFY, "Certify"),
    (0x14E, "NV_Read"),
    (0x151, "PolicySecret"),
    (0x158, "Quote"),
    (0x15D, "Sign"),
    (FLUSH_CONTEXT, "FlushContext"),
    (0x169, "NV_ReadPublic"),
    (0x173, "ReadPublic"),
    (0x176, "StartAuthSession"),
    (0x17A, "GetCapability"),
    (0x17E, "PCR_Read"),
];

/// The multiset of the commands swtpm executed after the first `from`.
fn commands_since(tpm: &Swtpm, from: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for code in tpm.command_codes().split_off(from) {
        let name = NAMES
            .iter()
            .find(|(c, _)| *c == code)
            .map_or_else(|| format!("{code:#x}"), |(_, n)| (*n).to_owned());
        *counts.entry(name).or_insert(0) += 1;
    }
    counts
}

fn expect(counts: &[(&str, usize)]) -> BTreeMap<String, usize> {
    counts.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect()
}

/// What the control plane logged of the TPM's maker at its last round-1
/// challenge: `tpm_manufacturer=…` (empty when round 1 sent none).
fn manufacturer_logged(cp: &ControlPlane) -> String {
    let log = cp.log();
    let line = log
        .lines()
        .rfind(|l| l.contains("credential challenge sent"))
        .unwrap_or_else(|| panic!("no challenge in\n{log}"))
        .to_owned();
    line.split(" tpm_manufacturer=")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("no tpm_manufacturer in {line}"))
        .to_owned()
}

#[test]
fn a_tpm_join_costs_13_commands_and_leaves_nothing_loaded() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let before = tpm.command_codes().len();
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let got = commands_since(&tpm, before);
    let want = expect(&[
        // The node key, its CSR.
        ("CreatePrimary", 2),
        ("Sign", 1),
        // The EK certificate (its size from the name ESYS computed: one
        // NV_ReadPublic), the persistent EK, the EK chain indices' listing.
        // With a certificate, not the TPM's maker (the control plane needs
        // it only to fetch a certificate NV lacks).
        ("GetCapability", 1),
        ("NV_ReadPublic", 1),
        ("NV_Read", 1),
        ("ReadPublic", 1),
        // Round 2: the EK's policy session, ended by ActivateCredential;
        // the AK (the second CreatePrimary) certifies the node key over the
        // released secret, which stands for a quote of no PCR.
        ("StartAuthSession", 1),
        ("PolicySecret", 1),
        ("ActivateCredential", 1),
        ("Certify", 1),
        // The node key once certified, the AK last.
        ("FlushContext", 2),
    ]);
    assert_eq!(got, want);
    assert_eq!(got.values().sum::<usize>(), 13);
    assert_eq!(manufacturer_logged(&cp), "", "round 1 sent no maker");
    let codes = tpm.command_codes().split_off(before);
    let at = |cc: u32| codes.iter().position(|&c| c == cc).unwrap();
    assert!(at(ACTIVATE_CREDENTIAL) < at(CERTIFY), "{codes:x?}");
    // The node key leaves the TPM as soon as it is certified (3 object
    // slots per connection on /dev/tpmrm0).
    assert_eq!(
        codes.get(at(CERTIFY) + 1),
        Some(&FLUSH_CONTEXT),
        "{codes:x?}"
    );
    assert_eq!(tpm.transient_handles(), Vec::<String>::new());
}

/// A TPM with no EK certificate in NV (and no `[tpm] ek_certificate`)
/// sends its maker in round 1 (one GetCapability more), for the control
/// plane to fetch the certificate from the maker's service; here the
/// operator pinned the EK as uncertified.
#[test]
fn a_tpm_join_without_an_ek_certificate_sends_the_tpms_maker() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    crate::eksource::without_ek_certificates(&tpm);
    let agent = Agent::with_tpm(&cp, &tpm);
    let ek = agent.identify()["ekSha256"].as_str().unwrap().to_owned();
    assert_ok(&cp.cli(&["resolve", "add", "--ek-sha256", &ek, "--uncertified"]));
    let before = tpm.command_codes().len();
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let got = commands_since(&tpm, before);
    let want = expect(&[
        // The node key; the EK derived from its template (NV has no
        // certificate to check a persistent one against), the AK.
        ("CreatePrimary", 3),
        ("Sign", 1),
        // The NV indices' listing (no certificate: nothing to read), and
        // the TPM's maker, sent in round 1.
        ("GetCapability", 2),
        ("StartAuthSession", 1),
        ("PolicySecret", 1),
        ("ActivateCredential", 1),
        ("Certify", 1),
        // The node key, the AK, the derived EK.
        ("FlushContext", 3),
    ]);
    assert_eq!(got, want);
    assert_eq!(got.values().sum::<usize>(), 13);
    assert_eq!(
        manufacturer_logged(&cp),
        "IBM",
        "swtpm's TPM_PT_MANUFACTURER"
    );
    assert_eq!(tpm.transient_handles(), Vec::<String>::new());
}

/// `[tpm] ek_certificate` stands for NV's certificate: no maker sent.
#[test]
fn an_operator_ek_certificate_spares_the_tpms_maker() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let der = tpm.dir.path().join("ek.der");
    assert_ok(&tpm.tool("tpm2_nvread", &["0x01c00002", "-o", &der.to_string_lossy()]));
    crate::eksource::without_ek_certificates(&tpm);
    let agent = Agent::with_tpm(&cp, &tpm);
    let config = std::fs::read_to_string(&agent.config).unwrap();
    std::fs::write(
        &agent.config,
        format!("{config}ek_certificate = \"{}\"\n", der.display()),
    )
    .unwrap();
    agent.allow_ek(&cp);
    let before = tpm.command_codes().len();
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let got = commands_since(&tpm, before);
    assert_eq!(got.get("GetCapability"), Some(&1), "{got:?}");
    assert_eq!(manufacturer_logged(&cp), "", "round 1 sent no maker");
}

#[test]
fn a_tpm_renewal_costs_9_commands_and_leaves_nothing_loaded() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::tpm_joined(&cp, &tpm);
    assert_eq!(tpm.transient_handles(), Vec::<String>::new());
    let before = tpm.command_codes().len();
    assert_ok(&agent.run(&["node", "--once", "--renew-now"]));
    let got = commands_since(&tpm, before);
    let want = expect(&[
        // The current key (this process's start), the AK, the next key.
        ("CreatePrimary", 3),
        // The next key's CSR, then the mTLS handshake with the current key.
        ("Sign", 2),
        ("Certify", 1),
        // The AK once it certified, the old key once replaced, and the
        // renewed key as the process exits.
        ("FlushContext", 3),
    ]);
    assert_eq!(got, want);
    assert_eq!(tpm.transient_handles(), Vec::<String>::new());
}
