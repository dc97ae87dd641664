//! ECC EKs: a TPM that ships only an ECC EK certificate (Intel PTT: P-256
//! at NV 0x01c0000a; swtpm and Nuvoton: P-384 at 0x01c00016) joins with
//! it, and `[tpm] ek` picks one.

use crate::harness::*;
use crate::maker::*;

/// ActivateCredential, PolicySecret (TPM_CC).
const ACTIVATE_CREDENTIAL: u32 = 0x0147;
const POLICY_SECRET: u32 = 0x0151;

/// The control plane's log line of round 1 names the EK it verified.
fn verified_ek_kinds(cp: &ControlPlane) -> Vec<String> {
    cp.log()
        .lines()
        .filter(|l| l.contains("EK verified"))
        .filter_map(|l| {
            ["rsa", "ecc-p256", "ecc-p384"]
                .into_iter()
                .find(|k| l.contains(&format!("ek={k}")) || l.contains(&format!("ek=\"{k}\"")))
                .map(str::to_owned)
        })
        .collect()
}

/// A swtpm whose RSA EK certificate and P-256 EK certificate (for an EK
/// made with `tpm2_createek -G ecc`, persisted at 0x81010002) are both
/// there; returns the P-256 EK's public area.
fn with_p256_ek(tpm: &Swtpm) -> Vec<u8> {
    let public = create_ek(tpm, &["-G", "ecc", "-c", "0x81010002"]);
    nv_write(tpm, "0x01c0000a", &certify_ek(tpm, &public));
    public
}

#[test]
fn a_tpm_with_only_its_p384_ek_joins_with_it() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    remove_rsa_ek(&tpm);
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let before = tpm.command_codes().len();
    let out = agent.run(&["join", "--attestor", "tpm"]);
    assert_ok(&out);
    let join = tpm.command_codes().split_off(before);
    assert!(agent.status_json()["nodeId"].is_string());
    assert_eq!(verified_ek_kinds(&cp), ["ecc-p384"], "{}", cp.log());
    let id = agent.identify();
    assert_eq!(id["ekKind"], "ecc-p384", "{id}");
    assert_eq!(id["ekPersistent"], true, "{id}");
    assert_eq!(id["ekMatchesCertificate"], true, "{id}");
    // swtpm released the credential to the EK's own (empty) password: the
    // H-3 EK has userWithAuth, and its PolicyB is SHA-384.
    // (swtpm answers the first one TPM_RC_RETRY; the TSS sends it again.)
    assert!(join.contains(&ACTIVATE_CREDENTIAL), "{join:x?}");
    assert!(!join.contains(&POLICY_SECRET), "{join:x?}");
    // No StartAuthSession, PolicySecret: two fewer than with the RSA EK.
    assert!(join.len() <= 14, "{} commands: {join:x?}", join.len());
    eprintln!(
        "join with a persistent P-384 EK: {} TPM commands: {join:x?}",
        join.len()
    );

    // Without the persistent EK, the H-3 template derives the same one.
    let ek_sha256 = id["ekSha256"].clone();
    evict(&tpm, "0x81010016");
    let id = agent.identify();
    assert_eq!(id["ekSha256"], ek_sha256, "{id}");
    assert_eq!(id["ekPersistent"], false, "{id}");
    assert_eq!(id["ekMatchesCertificate"], true, "{id}");
    // and swtpm releases a credential to the derived EK too (the machine
    // joins again from a new data directory).
    let again = Agent::with_tpm(&cp, &tpm);
    assert_ok(&again.run(&["join", "--attestor", "tpm"]));
}

#[test]
fn a_p256_ek_made_by_tpm2_createek_joins_with_its_certificate() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    remove_rsa_ek(&tpm);
    with_p256_ek(&tpm);
    let agent = Agent::with_tpm(&cp, &tpm);
    let ek_sha256 = agent.allow_ek(&cp);
    let before = tpm.command_codes().len();
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    assert_eq!(verified_ek_kinds(&cp), ["ecc-p256"], "{}", cp.log());
    let id = agent.identify();
    assert_eq!(id["ekKind"], "ecc-p256", "{id}");
    assert_eq!(id["ekPersistent"], true, "{id}");
    // The L-2 EK takes its PolicySecret session, like the RSA one.
    let join = &tpm.command_codes()[before..];
    assert!(join.contains(&ACTIVATE_CREDENTIAL) && join.contains(&POLICY_SECRET));

    // Without the persistent EK, bcd derives the same one from the template.
    evict(&tpm, "0x81010002");
    let id = agent.identify();
    assert_eq!(id["ekSha256"], ek_sha256.as_str(), "{id}");
    assert_eq!(id["ekPersistent"], false, "{id}");
    assert_eq!(id["ekMatchesCertificate"], true, "{id}");
}

#[test]
fn the_ek_setting_picks_p256_over_rsa() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    with_p256_ek(&tpm);
    let agent = Agent::with_tpm(&cp, &tpm);
    // Both certified: RSA unless told.
    assert_eq!(agent.identify()["ekKind"], "rsa");
    add_tpm_setting(&agent, "ek = \"ecc-p256\"");
    assert_eq!(agent.identify()["ekKind"], "ecc-p256");
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    assert_eq!(verified_ek_kinds(&cp), ["ecc-p256"], "{}", cp.log());
}

#[test]
fn a_forced_ek_without_a_certificate_is_a_clear_error() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    add_tpm_setting(&agent, "ek = \"ecc-p256\"");
    let out = agent.run(&["join", "--attestor", "tpm"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("[tpm] ek = \"ecc-p256\": the TPM has no EK certificate at NV 0x01c0000a (it has rsa, ecc-p384)"),
        "{}",
        stderr(&out)
    );
    agent.assert_nothing_written();
    assert!(cp.events().is_empty(), "{:?}", cp.events());

    // A value bcd does not know is refused where it is written.
    let config = std::fs::read_to_string(&agent.config).unwrap();
    std::fs::write(&agent.config, config.replace("ecc-p256", "ecc")).unwrap();
    let out = agent.run(&["tpm", "identify"]);
    assert!(
        stderr(&out).contains("tpm.ek: expected \"rsa\", \"ecc-p256\" or \"ecc-p384\""),
        "{}",
        stderr(&out)
    );
}
