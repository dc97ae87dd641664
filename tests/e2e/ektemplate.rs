//! EK template and nonce NV indices (TCG EK Credential Profile), and
//! `bcd tpm identify` when the TPM's EK is not its certificate's.

use crate::harness::*;
use crate::maker::*;

/// A maker's nonce EK: the L-1 template in NV 0x01c00004 and a nonce in
/// 0x01c00003, the EK derived from them (the nonce padded with zeros to
/// 256 bytes as the unique, as the TCG EK Credential Profile says)
/// certified in 0x01c00002, and no persistent EK.
fn nonce_ek_tpm() -> Swtpm {
    const NONCE: &[u8] = b"bcd e2e EK nonce";
    let tpm = Swtpm::start();
    nv_write(&tpm, "0x01c00004", &rsa_l1_template());
    nv_write(&tpm, "0x01c00003", NONCE);
    let mut unique = NONCE.to_vec();
    unique.resize(256, 0);
    let public = create_rsa_ek_with_unique(&tpm, &unique);
    let cert = certify_ek(&tpm, &public);
    nv_remove(&tpm, "0x01c00002");
    nv_write(&tpm, "0x01c00002", &cert);
    evict(&tpm, "0x81010001");
    tpm
}

#[test]
fn a_nonce_ek_without_a_persistent_ek_joins() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = nonce_ek_tpm();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    // Deriving the default EK instead would be refused ek-mismatch.
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let id = agent.identify();
    assert_eq!(id["ekSource"], "nv-template+nv-nonce", "{id}");
    assert_eq!(id["ekMatchesCertificate"], true, "{id}");
    assert_eq!(id["tpmEkSha256"], id["ekSha256"], "{id}");
    let out = agent.run(&["tpm", "identify"]);
    assert!(
        stdout(&out).contains("EK             rsa, derived from the maker's template in NV 0x01c00004 with the maker's nonce in NV 0x01c00003\n"),
        "{}",
        stdout(&out)
    );

    // The nonce alone (the template is the default one) derives it too.
    nv_remove(&tpm, "0x01c00004");
    let id = agent.identify();
    assert_eq!(id["ekSource"], "default-template+nv-nonce", "{id}");
    assert_eq!(id["ekMatchesCertificate"], true, "{id}");
}

#[test]
fn identify_says_when_the_tpms_ek_is_not_its_certificates() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    let ek_sha256 = agent.identify()["ekSha256"].as_str().unwrap().to_owned();

    // Another key at the persistent EK handle: bcd derives the EK instead.
    evict(&tpm, "0x81010001");
    assert_ok(&tpm.tool(
        "tpm2_createprimary",
        &[
            "-C",
            "e",
            "-G",
            "ecc256",
            "-c",
            &tpm.dir.path().join("other.ctx").to_string_lossy(),
        ],
    ));
    assert_ok(&tpm.tool(
        "tpm2_evictcontrol",
        &[
            "-C",
            "o",
            "-c",
            &tpm.dir.path().join("other.ctx").to_string_lossy(),
            "0x81010001",
        ],
    ));
    assert_ok(&tpm.tool("tpm2_flushcontext", &["-t"]));
    let out = agent.run(&["tpm", "identify"]);
    assert!(
        stdout(&out).contains("the persistent object at 0x81010001 is not the certificate's EK"),
        "{}",
        stdout(&out)
    );
    let id = agent.identify();
    assert_eq!(id["persistentEkMismatch"], true, "{id}");
    assert_eq!(id["ekPersistent"], false, "{id}");
    assert_eq!(id["ekMatchesCertificate"], true, "{id}");
    assert_eq!(id["ekSha256"], ek_sha256.as_str(), "{id}");

    // A nonce the certificate's EK was not made with: the TPM's EK is not
    // the certificate's, and identify says so instead of printing the
    // certificate's hash as the EK's.
    nv_write(&tpm, "0x01c00003", b"not the maker's nonce");
    let id = agent.identify();
    assert_eq!(id["ekMatchesCertificate"], false, "{id}");
    assert_ne!(id["tpmEkSha256"], id["ekSha256"], "{id}");
    let out = agent.run(&["tpm", "identify"]);
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "EK sha256      {} is the TPM's EK: it is NOT the key its certificate names",
            id["tpmEkSha256"].as_str().unwrap()
        )),
        "{text}"
    );
    let out = agent.run(&["doctor"]);
    assert!(
        stdout(&out)
            .contains("the TPM's rsa EK is not the key its certificate (NV 0x01c00002) names"),
        "{}",
        stdout(&out)
    );
    // The control plane refuses it as the EK its certificate does not name.
    agent.allow_ek(&cp);
    assert_access_denied(&cp.refused_once(Refusal::Join("tpm"), "ek-mismatch", || {
        agent.run(&["join", "--attestor", "tpm"])
    }));
}
