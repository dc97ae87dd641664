//! What a TPM maker does to a TPM, done to a swtpm with tpm2-tools and
//! swtpm_cert: NV indices written with the platform hierarchy, EKs made,
//! persisted or removed, EK certificates issued by the test maker's
//! intermediate (`tpmsim-fixtures/ek-intermediate.*`).

use crate::harness::*;

/// Writes `data` into a new platform NV index, as a maker does.
pub(crate) fn nv_write(tpm: &Swtpm, index: &str, data: &[u8]) {
    let file = tpm.dir.path().join(format!("nv-{index}"));
    std::fs::write(&file, data).unwrap();
    let size = data.len().to_string();
    assert_ok(&tpm.tool(
        "tpm2_nvdefine",
        &[
            index,
            "-C",
            "p",
            "-s",
            &size,
            "-a",
            "ppwrite|ppread|ownerread|authread|no_da|platformcreate",
        ],
    ));
    assert_ok(&tpm.tool(
        "tpm2_nvwrite",
        &[index, "-C", "p", "-i", &file.to_string_lossy()],
    ));
}

/// Removes a platform NV index.
pub(crate) fn nv_remove(tpm: &Swtpm, index: &str) {
    assert_ok(&tpm.tool("tpm2_nvundefine", &[index, "-C", "p"]));
}

/// Removes the persistent object at `handle`.
pub(crate) fn evict(tpm: &Swtpm, handle: &str) {
    assert_ok(&tpm.tool("tpm2_evictcontrol", &["-C", "o", "-c", handle]));
}

/// A TPM with only its ECC EKs: the RSA EK's certificate and persistent
/// object removed, as on Intel PTT.
pub(crate) fn remove_rsa_ek(tpm: &Swtpm) {
    nv_remove(tpm, "0x01c00002");
    evict(tpm, "0x81010001");
}

/// `tpm2_createek` with `args`; returns the EK's TPMT_PUBLIC. Flushes what
/// the tool leaves loaded (swtpm has no resource manager).
pub(crate) fn create_ek(tpm: &Swtpm, args: &[&str]) -> Vec<u8> {
    let out = tpm.dir.path().join("ek.tss");
    let out_arg = out.to_string_lossy().into_owned();
    let mut all = args.to_vec();
    all.extend_from_slice(&["-u", &out_arg, "-f", "tss"]);
    assert_ok(&tpm.tool("tpm2_createek", &all));
    assert_ok(&tpm.tool("tpm2_flushcontext", &["-t"]));
    // A TPM2B_PUBLIC: drop its size.
    std::fs::read(out).unwrap()[2..].to_vec()
}

/// An RSA EK of the L-1 template derived with `unique` (256 bytes), as a
/// maker derives a nonce EK; returns its TPMT_PUBLIC. (`tpm2_createek -t`
/// of tpm2-tools 5.4 copies the nonce pointer's bytes, not the nonce, so
/// the unique goes to tpm2_createprimary on stdin.)
pub(crate) fn create_rsa_ek_with_unique(tpm: &Swtpm, unique: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let dir = tpm.dir.path();
    let policy = dir.join("policy-a");
    std::fs::write(&policy, &rsa_l1_template()[10..42]).unwrap();
    let ctx = dir.join("nonce-ek.ctx");
    let mut child = Running::spawn_with_stdin(
        std::process::Command::new("tpm2_createprimary")
            .args(["-C", "e", "-g", "sha256", "-G", "rsa2048:null:aes128cfb"])
            .args([
                "-a",
                "fixedtpm|fixedparent|sensitivedataorigin|adminwithpolicy|restricted|decrypt",
            ])
            .arg("-L")
            .arg(&policy)
            .args(["-u", "-", "-c"])
            .arg(&ctx)
            .env("TPM2TOOLS_TCTI", tpm.tcti())
            .env("TSS2_LOG", "all+none")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped()),
    );
    child.stdin().unwrap().write_all(unique).unwrap();
    assert_ok(&child.output());
    let public = dir.join("nonce-ek.pub");
    assert_ok(&tpm.tool(
        "tpm2_readpublic",
        &[
            "-c",
            &ctx.to_string_lossy(),
            "-f",
            "tss",
            "-o",
            &public.to_string_lossy(),
        ],
    ));
    assert_ok(&tpm.tool("tpm2_flushcontext", &["-t"]));
    std::fs::read(public).unwrap()[2..].to_vec()
}

/// An EK certificate by the test maker's intermediate for the EK whose
/// TPMT_PUBLIC is `ek_public` (RSA-2048, P-256 or P-384).
pub(crate) fn certify_ek(tpm: &Swtpm, ek_public: &[u8]) -> Vec<u8> {
    use bc_wire::tpm::{KeyParams, Public};
    let public = Public::parse(ek_public).expect("an EK public area");
    let key: Vec<String> = match &public.params {
        KeyParams::Rsa { modulus, .. } => {
            vec![
                "--modulus".into(),
                hex::encode(modulus),
                "--exponent".into(),
                "65537".into(),
            ]
        }
        KeyParams::Ecc { x, y, .. } => vec![
            "--ecc-x".into(),
            hex::encode(x),
            "--ecc-y".into(),
            hex::encode(y),
            "--ecc-curveid".into(),
            if x.len() == 32 {
                "secp256r1"
            } else {
                "secp384r1"
            }
            .into(),
        ],
    };
    certify_key(tpm, &key)
}

/// An EK certificate by the test maker's intermediate for an RSA-2048 key
/// with this modulus (exponent 65537), whether a TPM holds it or not.
pub(crate) fn certify_rsa_modulus(tpm: &Swtpm, modulus: &[u8]) -> Vec<u8> {
    let key = [
        "--modulus".to_owned(),
        hex::encode(modulus),
        "--exponent".to_owned(),
        "65537".to_owned(),
    ];
    certify_key(tpm, &key)
}

/// `swtpm_cert` for the key its arguments name, issued by the test maker.
fn certify_key(tpm: &Swtpm, key: &[String]) -> Vec<u8> {
    let out = tpm.dir.path().join("ek-cert.der");
    let status = std::process::Command::new("swtpm_cert")
        .args(["--tpm2", "--type", "ek"])
        .args(key)
        .args(["--signkey", &fixture("ek-intermediate.key")])
        .args(["--issuercert", &fixture("ek-intermediate.pem")])
        .arg("--out-cert")
        .arg(&out)
        .args([
            "--serial",
            "4242",
            "--days",
            "-1",
            "--subject",
            "CN=bcd e2e EK",
        ])
        .args(["--tpm-manufacturer", "id:00001014", "--tpm-model", "swtpm"])
        .args(["--tpm-version", "id:20191023", "--tpm-spec-family", "2.0"])
        .args(["--tpm-spec-level", "0", "--tpm-spec-revision", "164"])
        .within();
    assert_ok(&status);
    std::fs::read(out).unwrap()
}

/// The TCG default RSA EK template (L-1) as a maker stores it in NV
/// 0x01c00004: TPMT_PUBLIC with a 256-zero-byte unique.
pub(crate) fn rsa_l1_template() -> Vec<u8> {
    let policy_a =
        hex::decode("837197674484b3f81a90cc8d46a5d724fd52d76e06520b64f2a1da1b331469aa").unwrap();
    let mut t = Vec::new();
    for v in [0x0001u16, 0x000B] {
        t.extend_from_slice(&v.to_be_bytes());
    }
    t.extend_from_slice(&0x0003_00B2u32.to_be_bytes());
    t.extend_from_slice(&32u16.to_be_bytes());
    t.extend_from_slice(&policy_a);
    // AES-128-CFB, scheme NULL, 2048 bits, exponent 0.
    for v in [0x0006u16, 128, 0x0043, 0x0010, 2048] {
        t.extend_from_slice(&v.to_be_bytes());
    }
    t.extend_from_slice(&0u32.to_be_bytes());
    t.extend_from_slice(&256u16.to_be_bytes());
    t.extend_from_slice(&[0; 256]);
    t
}

/// Appends `line` to the agent's config, in its last table (`[tpm]`).
pub(crate) fn add_tpm_setting(agent: &Agent, line: &str) {
    let config = std::fs::read_to_string(&agent.config).unwrap();
    std::fs::write(&agent.config, format!("{config}{line}\n")).unwrap();
}
