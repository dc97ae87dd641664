//! Real makers' EK certificates (`wire/src/ekcert/testdata/real/`, copied
//! from keylime and carl-wallace/tpm_roots; see its README) through the
//! real binaries: each real leaf in a swtpm's EK certificate NV index (RSA
//! 0x01c00002, ECC 0x01c0000a), the makers' roots as the makers publish
//! them trusted with `ek-roots add` of a directory, their intermediates in
//! `[tpm] ek_intermediates`, then `bcd join --attestor tpm`.
//!
//! A certificate that passes every chain and profile check is refused
//! `ek-mismatch`: the swtpm's EK is not the certificate's key. Any other
//! reason means the real certificate itself was refused.

use std::path::{Path, PathBuf};

use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::public_key::PublicKey;

use crate::harness::*;
use crate::maker::{create_ek, nv_remove, nv_write, remove_rsa_ek};

const RSA_INDEX: &str = "0x01c00002";
const ECC_INDEX: &str = "0x01c0000a";

/// Every real leaf that chains to a public root, as NV holds it: the STM
/// RSA certificate twice, once as its DER, once as the chip's NV content
/// (the DER, then 0xFF up to 1,600 bytes).
const LEAVES: [&str; 6] = [
    "ifx-optiga-rsa-ek-mfgca035.pem",
    "ifx-optiga-ecc-ek-mfgca035.pem",
    "nuvoton-npct75x-rsa-ek-rootca2111-b.pem",
    "stm-st33htph-rsa-ek-intca05.pem",
    "stm-st33htph-rsa-ek-intca05-nvpadded.der",
    "stm-st33htph-ecc-ek-eccintca01.pem",
];

/// Each maker's root as the maker publishes it. STM's two are
/// cross-signed by GlobalSign, whose roots are not added.
const ROOTS: [&str; 5] = [
    "ifx-optiga-rsa-root-ca-899e3547.pem",
    "ifx-optiga-ecc-root-ca-cfeb02fe.pem",
    "nuvoton-tpm-root-ca-2111-cd8185ff.pem",
    "stm-tpm-ek-root-ca-f8e37a86.pem",
    "stm-tpm-ecc-root-ca-01-c541d7e5.pem",
];

/// The makers' intermediates, for `[tpm] ek_intermediates`: Infineon's
/// RSA CA 035 in both its issues (same name and key).
const INTERMEDIATES: [&str; 5] = [
    "ifx-optiga-rsa-manufacturing-ca-035-6b8b6216.pem",
    "ifx-optiga-rsa-manufacturing-ca-035-9efd7b3c.pem",
    "ifx-optiga-ecc-manufacturing-ca-035-1f61aed7.pem",
    "stm-tpm-ek-intermediate-ca-05-870fc181.pem",
    "stm-tpm-ecc-intermediate-ca-01-015bcfc3.pem",
];

fn real(name: &str) -> PathBuf {
    workspace().join("wire/src/ekcert/testdata/real").join(name)
}

/// What NV holds for a fixture: a PEM file's DER, a `.der` file's bytes.
fn nv_content(name: &str) -> Vec<u8> {
    let bytes = std::fs::read(real(name)).unwrap();
    match name.ends_with(".pem") {
        true => ::pem::parse(bytes).unwrap().into_contents(),
        false => bytes,
    }
}

/// The certificate at the start of NV content.
fn with_cert<T>(nv: &[u8], f: impl FnOnce(&X509Certificate<'_>) -> T) -> T {
    let der = bc_wire::ekcert::nv::der_prefix(nv).expect("a certificate");
    let (_, cert) = X509Certificate::from_der(der).unwrap();
    f(&cert)
}

/// The EK certificate NV index for a certificate's key type.
fn index_for(nv: &[u8]) -> &'static str {
    with_cert(nv, |c| match c.public_key().parsed() {
        Ok(PublicKey::RSA(_)) => RSA_INDEX,
        Ok(PublicKey::EC(_)) => ECC_INDEX,
        _ => panic!("an EK certificate of another key type"),
    })
}

/// A directory laid out as keylime's tpm_cert_store: the makers' roots,
/// one PEM file each.
fn makers_roots_dir(under: &Path) -> PathBuf {
    let dir = under.join("tpm_cert_store");
    std::fs::create_dir(&dir).unwrap();
    for name in ROOTS {
        std::fs::copy(real(name), dir.join(name)).unwrap();
    }
    dir
}

/// Seconds since the epoch inside every fixture's validity: a day after
/// the latest notBefore (checked to be before the earliest notAfter).
fn inside_every_validity() -> i64 {
    let files = LEAVES.iter().chain(&ROOTS).chain(&INTERMEDIATES);
    let (mut from, mut until) = (i64::MIN, i64::MAX);
    for name in files {
        let (nb, na) = with_cert(&nv_content(name), |c| {
            (
                c.validity().not_before.timestamp(),
                c.validity().not_after.timestamp(),
            )
        });
        from = from.max(nb);
        until = until.min(na);
    }
    let at = from + 86_400;
    assert!(at < until, "the fixtures share no validity");
    at
}

/// Moves the control plane's database clock to `at` (seconds).
fn set_clock(cp: &ControlPlane, at: i64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let offset = format!("{:+}s", at - now);
    assert_ok(&cp.cli(&["clock", "set", "--offset", &offset]));
}

/// An agent on `tpm` whose `[tpm] ek_intermediates` holds `intermediates`.
fn agent_with_intermediates(cp: &ControlPlane, tpm: &Swtpm, intermediates: &[&str]) -> Agent {
    let agent = Agent::with_tpm(cp, tpm);
    let bundle = agent.root.path().join("ek-intermediates.pem");
    let pem: String = intermediates
        .iter()
        .map(|n| std::fs::read_to_string(real(n)).unwrap())
        .collect();
    std::fs::write(&bundle, pem).unwrap();
    let config = std::fs::read_to_string(&agent.config).unwrap();
    // [tpm] is the config's last table.
    std::fs::write(
        &agent.config,
        format!("{config}ek_intermediates = \"{}\"\n", bundle.display()),
    )
    .unwrap();
    agent
}

fn hex_u32(s: &str) -> Option<u32> {
    u32::from_str_radix(
        s.trim().trim_start_matches("0x").trim_start_matches("0X"),
        16,
    )
    .ok()
}

/// The NV indices of `tpm` (`tpm2_getcap handles-nv-index`).
fn nv_indices(tpm: &Swtpm) -> Vec<u32> {
    let out = tpm.tool("tpm2_getcap", &["handles-nv-index"]);
    assert_ok(&out);
    stdout(&out)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .filter_map(hex_u32)
        .collect()
}

/// Puts `nv` as the TPM's only RSA/P-256 EK certificate, at the index of
/// its key type (the swtpm's own RSA certificate removed).
fn put_ek_certificate(tpm: &Swtpm, nv: &[u8]) {
    let present = nv_indices(tpm);
    for index in [RSA_INDEX, ECC_INDEX] {
        if present.contains(&hex_u32(index).unwrap()) {
            nv_remove(tpm, index);
        }
    }
    nv_write(tpm, index_for(nv), nv);
}

/// `bcd join --attestor tpm`, refused; the reason the server recorded.
fn refused_join(cp: &ControlPlane, agent: &Agent) -> String {
    let before = cp.refusal_reasons();
    let out = agent.run(&["join", "--attestor", "tpm"]);
    assert_access_denied(&out);
    agent.assert_nothing_written();
    let mut after = cp.refusal_reasons();
    // One new refusal; repeats are aggregated, so compare counts.
    assert_eq!(after.len(), before.len() + 1, "{after:?}");
    for r in &before {
        let i = after.iter().position(|a| a == r).unwrap();
        after.remove(i);
    }
    after.remove(0)
}

/// Every real leaf reaches `ek-mismatch`: its chain to the maker's root
/// and its profile pass. One control plane, one swtpm whose EK certificate
/// index is rewritten between joins.
#[test]
fn every_real_leaf_chains_to_its_makers_root() {
    let cp = ControlPlane::start();
    let dir = makers_roots_dir(cp.path());
    let out = cp.cli(&["ek-roots", "add", &dir.to_string_lossy()]);
    assert_ok(&out);
    let text = stdout(&out);
    assert_eq!(text.lines().count(), ROOTS.len(), "{text}");
    assert!(
        text.lines()
            .all(|l| l.contains(": added ") && l.contains(" anchor ")),
        "{text}"
    );
    set_clock(&cp, inside_every_validity());
    let tpm = Swtpm::start();
    let agent = agent_with_intermediates(&cp, &tpm, &INTERMEDIATES);
    let mut results = Vec::new();
    for leaf in LEAVES {
        put_ek_certificate(&tpm, &nv_content(leaf));
        results.push((leaf, refused_join(&cp, &agent)));
    }
    let reached = results.iter().filter(|(_, r)| r == "ek-mismatch").count();
    eprintln!(
        "real EK certificates reaching ek-mismatch: {reached} of {}",
        LEAVES.len()
    );
    for (leaf, reason) in &results {
        eprintln!("  {reason:<16} {leaf}");
    }
    assert_eq!(reached, LEAVES.len(), "{results:?}");
}

/// A maker's root added with `--intermediate` is no anchor: STM's RSA leaf
/// is refused `ek-chain` (GlobalSign, above it, is not trusted); added
/// again without it, it is an anchor and the leaf reaches `ek-mismatch`. A
/// real CA certificate in the EK certificate index is refused
/// `ek-certificate`.
#[test]
fn an_intermediate_is_no_anchor_and_a_ca_is_no_ek() {
    let cp = ControlPlane::start();
    let root = real("stm-tpm-ek-root-ca-f8e37a86.pem");
    let root = root.to_string_lossy();
    let out = cp.cli(&["ek-roots", "add", "--intermediate", &root]);
    assert_ok(&out);
    assert!(stdout(&out).contains(": added "), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(" intermediate C=CH"),
        "{}",
        stdout(&out)
    );
    set_clock(&cp, inside_every_validity());
    let tpm = Swtpm::start();
    let agent =
        agent_with_intermediates(&cp, &tpm, &["stm-tpm-ek-intermediate-ca-05-870fc181.pem"]);
    put_ek_certificate(&tpm, &nv_content("stm-st33htph-rsa-ek-intca05.pem"));
    assert_eq!(refused_join(&cp, &agent), "ek-chain");

    let out = cp.cli(&["ek-roots", "add", &root]);
    assert_ok(&out);
    assert!(stdout(&out).contains(": kind changed "), "{}", stdout(&out));
    let listed = cp.json(&["ek-roots", "list"]);
    assert_eq!(listed[0]["kind"], "anchor", "{listed}");
    assert_eq!(refused_join(&cp, &agent), "ek-mismatch");

    // The maker's intermediate CA certificate is not an EK certificate.
    put_ek_certificate(
        &tpm,
        &nv_content("stm-tpm-ek-intermediate-ca-05-870fc181.pem"),
    );
    let out = cp.refused_once(Refusal::Join("tpm"), "ek-certificate", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    agent.assert_nothing_written();
}

/// `ek-roots add DIR` reports per file what it kept and skipped, and why
/// (text and `--json`); a directory with nothing to keep is an error that
/// writes nothing.
#[test]
fn ek_roots_add_reads_a_directory_file_by_file() {
    let cp = ControlPlane::init_only();
    let dir = makers_roots_dir(cp.path());
    std::fs::write(dir.join("README.md"), "# the makers' CAs\n").unwrap();
    std::fs::copy(
        real("stm-st33htph-ecc-ek-eccintca01.pem"),
        dir.join("a-leaf.pem"),
    )
    .unwrap();
    // One certificate as DER, as tpm_roots ships them (.crt).
    std::fs::write(
        dir.join("gs-rsa.crt"),
        nv_content("globalsign-trusted-platform-module-root-ca-f27bf02c.pem"),
    )
    .unwrap();
    std::fs::create_dir(dir.join("older")).unwrap();
    let out = cp.cli(&["ek-roots", "add", "--json", &dir.to_string_lossy()]);
    assert_ok(&out);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    let by_file = |name: &str| {
        rows.iter()
            .find(|r| r["file"].as_str().unwrap().ends_with(name))
            .unwrap_or_else(|| panic!("{name} not reported: {rows:?}"))
            .clone()
    };
    assert_eq!(rows.len(), ROOTS.len() + 4, "{rows:?}");
    for name in ROOTS {
        let r = by_file(name);
        assert_eq!(
            (r["status"].as_str(), r["kind"].as_str()),
            (Some("added"), Some("anchor")),
            "{r}"
        );
    }
    let gs = by_file("gs-rsa.crt");
    assert_eq!(gs["status"], "added", "{gs}");
    assert!(
        gs["subject"].as_str().unwrap().contains("GlobalSign"),
        "{gs}"
    );
    let leaf = by_file("a-leaf.pem");
    assert_eq!(leaf["status"], "skipped");
    assert!(
        leaf["reason"]
            .as_str()
            .unwrap()
            .contains("not a CA certificate"),
        "{leaf}"
    );
    let readme = by_file("README.md");
    assert_eq!(readme["status"], "skipped");
    assert!(
        readme["reason"]
            .as_str()
            .unwrap()
            .contains("no certificate found"),
        "{readme}"
    );
    let sub = by_file("older");
    assert!(
        sub["reason"].as_str().unwrap().contains("a directory"),
        "{sub}"
    );
    assert_eq!(
        cp.json(&["ek-roots", "list"]).as_array().unwrap().len(),
        ROOTS.len() + 1
    );

    // Again, as text, with --intermediate: every kept one changes kind.
    let out = cp.cli(&["ek-roots", "add", "--intermediate", &dir.to_string_lossy()]);
    assert_ok(&out);
    let text = stdout(&out);
    assert_eq!(
        text.matches(": kind changed ").count(),
        ROOTS.len() + 1,
        "{text}"
    );
    assert!(text.contains("README.md: skipped: "), "{text}");

    // Nothing to keep: an error naming why, nothing written.
    let empty = cp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(empty.join("notes.txt"), "nothing here").unwrap();
    let out = cp.cli(&["ek-roots", "add", &empty.to_string_lossy()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no CA certificate in"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("notes.txt"), "{}", stderr(&out));
    // A single file that is not a CA: refused whole.
    let out = cp.cli(&["ek-roots", "add", &dir.join("a-leaf.pem").to_string_lossy()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not a CA certificate"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        cp.json(&["ek-roots", "list"]).as_array().unwrap().len(),
        ROOTS.len() + 1
    );
}

/// An EK certificate as Intel PTT issues its P-256 EKs' (keyUsage
/// keyEncipherment alone, no keyAgreement), made to match (there is no
/// real PTT certificate among the fixtures) by the test maker's issuing CA
/// for the swtpm's own P-256 EK: the join is admitted.
#[test]
fn an_intel_ptt_style_p256_ek_certificate_joins() {
    use bc_wire::tpm::{KeyParams, Public};
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    remove_rsa_ek(&tpm);
    let public = create_ek(&tpm, &["-G", "ecc", "-c", "0x81010002"]);
    let Ok(Public {
        params: KeyParams::Ecc { x, y, .. },
        ..
    }) = Public::parse(&public)
    else {
        panic!("not an ECC EK")
    };
    // SubjectPublicKeyInfo { id-ecPublicKey, prime256v1 }, uncompressed point.
    let mut spki = hex::decode("3059301306072a8648ce3d020106082a8648ce3d03010703420004").unwrap();
    spki.extend_from_slice(&x);
    spki.extend_from_slice(&y);
    let ca_key = std::fs::read_to_string(fixture("ek-intermediate.key")).unwrap();
    let ca_pem = std::fs::read_to_string(fixture("ek-intermediate.pem")).unwrap();
    let issuer =
        rcgen::Issuer::from_ca_cert_pem(&ca_pem, rcgen::KeyPair::from_pem(&ca_key).unwrap())
            .unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.not_before = rcgen::date_time_ymd(2020, 1, 1);
    p.not_after = rcgen::date_time_ymd(2049, 12, 31);
    p.key_usages = vec![rcgen::KeyUsagePurpose::KeyEncipherment];
    p.is_ca = rcgen::IsCa::ExplicitNoCa;
    p.use_authority_key_identifier_extension = true;
    // extendedKeyUsage { tcg-kp-EKCertificate }
    p.custom_extensions = vec![rcgen::CustomExtension::from_oid_content(
        &[2, 5, 29, 37],
        hex::decode("300706056781050801").unwrap(),
    )];
    let key = rcgen::SubjectPublicKeyInfo::from_der(&spki).unwrap();
    let cert = p.signed_by(&key, &issuer).unwrap().der().to_vec();
    with_cert(&cert, |c| {
        let ku = c.key_usage().unwrap().unwrap().value;
        assert!(ku.key_encipherment() && !ku.key_agreement());
    });
    nv_write(&tpm, ECC_INDEX, &cert);
    let agent = Agent::with_tpm(&cp, &tpm);
    assert_eq!(agent.identify()["ekKind"], "ecc-p256");
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    assert!(agent.status_json()["nodeId"].is_string());
}
