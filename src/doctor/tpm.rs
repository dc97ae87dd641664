//! The TPM: reachable, a TPM 2.0, who made it, whether it is a software
//! TPM; its EK certificate, and that it chains to `[tpm] ek_roots`.
//!
//! The chain is checked here with x509-parser (issuer by subject, CA basic
//! constraints, signature), not with a TLS verifier: EK certificates carry a
//! critical SubjectAltName of TPM attributes that webpki refuses.
use std::path::Path;

use rustls::pki_types::pem::{PemObject, SectionKind};
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;

use super::{Check, EK_CERTIFICATE, TPM};
use crate::keys::TpmAccess;
use crate::pki::printable;
use crate::tpm::TpmInfo;

/// The `tpm` and `ek certificate` checks (only `tpm` on a host without one).
pub fn checks(
    access: &TpmAccess,
    ek_roots: Option<&Path>,
    ek_intermediates: Option<&Path>,
) -> Vec<Check> {
    // No TPM, no EK: one line says both.
    let Some(tcti) = access.tcti() else {
        return vec![Check::ok(TPM, "none (node keys are file keys)")];
    };
    let reach_hint = "check [tpm] tcti (else TPM2TOOLS_TCTI, TCTI, /dev/tpmrm0) and that this user may open the TPM";
    let shared = match access.open() {
        Ok(s) => s,
        Err(e) => {
            return vec![
                Check::fail(TPM, format!("unreachable at {tcti}: {e}"), reach_hint),
                Check::skip(EK_CERTIFICATE, "the TPM is unreachable"),
            ]
        }
    };
    let mut tpm = match crate::keys::lock_tpm(&shared) {
        Ok(t) => t,
        Err(e) => {
            return vec![
                Check::fail(TPM, format!("unusable at {tcti}: {e}"), reach_hint),
                Check::skip(EK_CERTIFICATE, "the TPM is unusable"),
            ]
        }
    };
    let info = match tpm.info() {
        Ok(i) => i,
        Err(e) => {
            return vec![
                Check::fail(
                    TPM,
                    format!("cannot read its properties at {tcti}: {e}"),
                    reach_hint,
                ),
                Check::skip(EK_CERTIFICATE, "the TPM does not answer"),
            ]
        }
    };
    let tpm_check = info_check(&info, tcti);
    if tpm_check.status == super::Status::Fail {
        return vec![tpm_check, Check::skip(EK_CERTIFICATE, "not a TPM 2.0")];
    }
    let ek_check = match tpm.ek() {
        Ok(ek) => {
            let mut intermediates = tpm.ek_chain(&ek).unwrap_or_default();
            if let Some(file) = ek_intermediates {
                match crate::pki::read_pem_bundle(file) {
                    Ok(more) => intermediates.extend(more),
                    Err(e) => tracing::warn!(error = %e, "[tpm] ek_intermediates"),
                }
            }
            let c = match ek.matches_certificate {
                Some(false) => mismatch_check(&ek),
                _ => ek_certificate(ek.certificate.as_deref(), ek_roots, &intermediates),
            };
            if let Err(e) = tpm.release_ek(&ek) {
                tracing::debug!(error = %e, "cannot flush the EK");
            }
            c
        }
        Err(e) => Check::fail(
            EK_CERTIFICATE,
            format!("cannot read the EK: {e}"),
            "run bcd tpm identify for details",
        ),
    };
    vec![tpm_check, ek_check]
}

/// TPM 2.0 or not, who made it, and whether it is a software TPM.
pub fn info_check(info: &TpmInfo, tcti: &str) -> Check {
    // "IBM " and "SW   TPM" read as "IBM SW TPM".
    let maker = printable(&format!("{} {}", info.manufacturer, info.vendor))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let maker = if maker.is_empty() {
        "an unnamed maker".to_owned()
    } else {
        maker
    };
    if info.family != "2.0" {
        return Check::fail(
            TPM,
            format!(
                "{maker} at {tcti} is not a TPM 2.0 (family {:?})",
                printable(&info.family)
            ),
            "bcd needs a TPM 2.0: enable it in the firmware setup, or point [tpm] tcti at one",
        );
    }
    let what = format!(
        "TPM 2.0 by {maker}, firmware {}, at {tcti}",
        printable(&info.firmware)
    );
    if info.is_software() {
        return Check::warn(
            TPM,
            format!("a software TPM: keys in it prove nothing about hardware ({what})"),
            "use the machine's hardware TPM in production ([tpm] tcti)",
        );
    }
    Check::ok(TPM, what)
}

/// The TPM's EK is not the key its certificate names: the control plane
/// refuses it `ek-mismatch`.
fn mismatch_check(ek: &crate::tpm::Ek) -> Check {
    Check::fail(
        EK_CERTIFICATE,
        format!(
            "the TPM's {} EK is not the key its certificate (NV {:#010x}) names",
            ek.kind.as_str(),
            ek.kind.certificate_index()
        ),
        "run bcd tpm identify for details; the control plane refuses this EK (ek-mismatch)",
    )
}

/// The EK certificate: present, and chaining to `ek_roots` when configured.
pub fn ek_certificate(
    der: Option<&[u8]>,
    ek_roots: Option<&Path>,
    intermediates: &[Vec<u8>],
) -> Check {
    let Some(der) = der else {
        return Check::warn(
            EK_CERTIFICATE,
            "none in NV 0x01c00002 (RSA), 0x01c0000a (P-256) or 0x01c00016 (P-384)",
            "the control plane cannot verify this TPM's maker: a tpm join is refused unless it allows uncertified EKs",
        );
    };
    let issuer = match X509Certificate::from_der(der) {
        Ok((_, c)) => printable(&c.issuer().to_string()),
        Err(_) => {
            return Check::fail(
                EK_CERTIFICATE,
                "the EK certificate in NV is not an X.509 certificate",
                "the TPM's maker must reprovision it; join with a token meanwhile",
            )
        }
    };
    let Some(roots) = ek_roots else {
        return Check::ok(
            EK_CERTIFICATE,
            format!("present, issued by {issuer} (no [tpm] ek_roots to check it against)"),
        );
    };
    let roots_hint = format!(
        "[tpm] ek_roots ({}) must hold this TPM maker's root; the intermediates up to the EK certificate's issuer ({issuer}) come from the TPM's EK chain NV indices, [tpm] ek_intermediates or ek_roots",
        roots.display()
    );
    let pem = match std::fs::read(roots) {
        Ok(p) => p,
        Err(e) => {
            return Check::fail(
                EK_CERTIFICATE,
                format!("cannot read [tpm] ek_roots {}: {e}", roots.display()),
                roots_hint,
            )
        }
    };
    match verify_chain(der, &pem, intermediates) {
        Ok(anchor) => Check::ok(
            EK_CERTIFICATE,
            format!(
                "issued by {issuer}, chains to {anchor} in {}",
                roots.display()
            ),
        ),
        Err(why) => Check::fail(
            EK_CERTIFICATE,
            format!("does not chain to {}: {why}", roots.display()),
            roots_hint,
        ),
    }
}

/// Builds a path from `ek_der` to a certificate of `roots_pem`, each an
/// anchor as every certificate `ek-roots add` adds is at the control plane,
/// through `intermediates` (untrusted), as the control plane does
/// ([`bc_wire::ekcert::path`]).
/// Returns the anchor's subject; else why not, naming a missing issuer.
pub fn verify_chain(
    ek_der: &[u8],
    roots_pem: &[u8],
    intermediates: &[Vec<u8>],
) -> Result<String, String> {
    use bc_wire::ekcert;
    let (_, ek) = X509Certificate::from_der(ek_der)
        .map_err(|_| "the EK certificate does not parse".to_owned())?;
    let mut roots = Vec::new();
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(roots_pem) {
        match section {
            Ok((SectionKind::Certificate, der)) => roots.push(der),
            // Never echo a block: a misplaced private key must not reach a terminal.
            Ok(_) => {}
            Err(e) => return Err(format!("the file is not PEM ({e})")),
        }
    }
    if roots.is_empty() {
        return Err("the file holds no PEM \"CERTIFICATE\" block".to_owned());
    }
    let mut parsed = Vec::new();
    for (i, der) in roots.iter().enumerate() {
        let Ok((_, ca)) = X509Certificate::from_der(der) else {
            return Err(format!("certificate {} in the file does not parse", i + 1));
        };
        parsed.push(ca);
    }
    let anchors = parsed;
    let others: Vec<_> = intermediates
        .iter()
        .filter_map(|d| X509Certificate::from_der(d).ok().map(|(_, c)| c))
        .collect();
    ekcert::check_profile(&ek).map_err(|e| format!("not an EK certificate: {e}"))?;
    match ekcert::build_path(&ek, &anchors, &others, crate::clock::now().unix_timestamp()) {
        Ok(found) => Ok(printable(&found.anchor)),
        Err(ekcert::ChainError::MissingIssuer { missing }) => Err(format!(
            "no path: the issuer {} is missing",
            printable(&missing)
        )),
        Err(e) => Err(printable(&e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, CustomExtension, DnType, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };

    struct Ca {
        cert: rcgen::Certificate,
        issuer: Issuer<'static, KeyPair>,
    }

    fn ca(name: &str, is_ca: bool) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        if is_ca {
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        }
        let cert = p.self_signed(&key).unwrap();
        Ca {
            cert,
            issuer: Issuer::new(p, key),
        }
    }

    /// An EK-like certificate: a critical SAN that is not DNS or IP.
    fn ek_cert(by: &Ca) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        // SAN { directoryName {} }, critical, as TPM makers write it.
        let mut san =
            CustomExtension::from_oid_content(&[2, 5, 29, 17], vec![0x30, 0x02, 0xa4, 0x00]);
        san.set_criticality(true);
        p.custom_extensions = vec![san];
        p.signed_by(&key, &by.issuer).unwrap().der().to_vec()
    }

    #[test]
    fn chains_to_the_issuing_ca_only() {
        let maker = ca("Maker EK CA", true);
        let other = ca("Other EK CA", true);
        let ek = ek_cert(&maker);
        let both = format!("{}{}", other.cert.pem(), maker.cert.pem());
        assert_eq!(
            verify_chain(&ek, both.as_bytes(), &[]).unwrap(),
            "CN=Maker EK CA"
        );
        let e = verify_chain(&ek, other.cert.pem().as_bytes(), &[]).unwrap_err();
        assert!(
            e.starts_with("no path: the issuer CN=Maker EK CA is missing"),
            "{e}"
        );
        assert!(verify_chain(&ek, b"", &[]).is_err());
        assert!(verify_chain(&ek, b"-----BEGIN CERTIFICATE-----\nAAAA\n", &[]).is_err());
    }

    #[test]
    fn a_same_named_impostor_or_a_non_ca_does_not_verify() {
        let maker = ca("Maker EK CA", true);
        let impostor = ca("Maker EK CA", true);
        let ek = ek_cert(&maker);
        let e = verify_chain(&ek, impostor.cert.pem().as_bytes(), &[]).unwrap_err();
        assert!(e.contains("does not verify the signature"), "{e}");
        let leafy = ca("Maker EK CA", false);
        let ek = ek_cert(&leafy);
        let e = verify_chain(&ek, leafy.cert.pem().as_bytes(), &[]).unwrap_err();
        assert!(e.contains("is not a CA"), "{e}");
    }

    #[test]
    fn ek_certificate_check() {
        assert_eq!(ek_certificate(None, None, &[]).status, Status::Warn);
        let maker = ca("Maker EK CA", true);
        let ek = ek_cert(&maker);
        assert_eq!(ek_certificate(Some(&ek), None, &[]).status, Status::Ok);
        let dir = tempfile::tempdir().unwrap();
        let roots = dir.path().join("roots.pem");
        std::fs::write(&roots, maker.cert.pem()).unwrap();
        let c = ek_certificate(Some(&ek), Some(&roots), &[]);
        assert_eq!(c.status, Status::Ok, "{}", c.line());
        std::fs::write(&roots, ca("Other", true).cert.pem()).unwrap();
        assert_eq!(
            ek_certificate(Some(&ek), Some(&roots), &[]).status,
            Status::Fail
        );
        let missing = dir.path().join("absent.pem");
        assert_eq!(
            ek_certificate(Some(&ek), Some(&missing), &[]).status,
            Status::Fail
        );
        assert_eq!(
            ek_certificate(Some(b"junk"), None, &[]).status,
            Status::Fail
        );
    }

    #[test]
    fn software_tpms_and_families() {
        let sw = TpmInfo {
            manufacturer: "IBM ".into(),
            vendor: "SW   TPM".into(),
            firmware: "1.2 (00010002.00000000)".into(),
            family: "2.0".into(),
        };
        let c = info_check(&sw, "swtpm:port=1");
        assert_eq!(c.status, Status::Warn);
        assert!(c.message.starts_with(
            "a software TPM: keys in it prove nothing about hardware (TPM 2.0 by IBM SW TPM, firmware"
        ));
        let hw = TpmInfo {
            manufacturer: "INTC".into(),
            vendor: "".into(),
            ..sw.clone()
        };
        assert_eq!(
            info_check(&hw, "device:/dev/tpmrm0").line(),
            "ok    tpm: TPM 2.0 by INTC, firmware 1.2 (00010002.00000000), at device:/dev/tpmrm0"
        );
        let old = TpmInfo {
            family: "1.2".into(),
            ..hw
        };
        assert_eq!(info_check(&old, "t").status, Status::Fail);
    }
}
