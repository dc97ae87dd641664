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
use crate::tpm::{CertificateSource, TpmInfo};

/// The `tpm` and `ek certificate` checks (only `tpm` on a host without one).
pub(super) fn checks(
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
        Err(e @ crate::keys::KeyError::Tpm(crate::tpm::TpmError::OperatorCertificate { .. })) => {
            return vec![
                Check::skip(TPM, "not opened: [tpm] ek_certificate is unusable"),
                Check::fail(
                    EK_CERTIFICATE,
                    e.to_string(),
                    "put this TPM's EK certificate (PEM or DER, one certificate) there, or remove the setting",
                ),
            ]
        }
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
            let from_nv_chain = !intermediates.is_empty();
            if let Some(file) = ek_intermediates {
                match crate::pki::read_pem_bundle(file) {
                    Ok(more) => intermediates.extend(more),
                    Err(e) => tracing::warn!(error = %e, "[tpm] ek_intermediates"),
                }
            }
            let c = match ek.matches_certificate {
                Some(false) => mismatch_check(&ek),
                _ => {
                    let sent = ek.certificate.as_deref().map(|der| Sent {
                        der,
                        assurance: match ek.certificate_source {
                            Some(CertificateSource::OperatorFile) => "operator-file",
                            _ if from_nv_chain => "nv-chain",
                            _ => "nv",
                        },
                        from: match ek.certificate_source {
                            Some(CertificateSource::OperatorFile) => {
                                "[tpm] ek_certificate".to_owned()
                            }
                            _ => format!("NV {:#010x}", ek.kind.certificate_index()),
                        },
                    });
                    let ek_sha256 = crate::tpm::public_spki_der(&ek.public)
                        .map(|spki| hex::encode(bc_wire::sha256(&spki)))
                        .unwrap_or_default();
                    match (&sent, info.ek_service()) {
                        (None, Some(service)) => from_service(service),
                        _ => ek_certificate(sent, &ek_sha256, ek_roots, &intermediates),
                    }
                }
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
pub(super) fn info_check(info: &TpmInfo, tcti: &str) -> Check {
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

/// No EK certificate to send, from a TPM whose maker publishes them: the
/// control plane fetches it by the EK's hash ([tpm.ek_services]).
pub(super) fn from_service(service: &str) -> Check {
    Check::ok(
        EK_CERTIFICATE,
        format!("joins as maker-service: none in NV, the control plane fetches it from {service}"),
    )
}

/// The EK certificate bcd will send: its bytes, where it came from, and
/// the EK assurance the control plane will record for it.
pub(super) struct Sent<'a> {
    pub der: &'a [u8],
    /// "nv", "nv-chain" or "operator-file".
    pub assurance: &'static str,
    /// For people: "NV 0x01c00002", "[tpm] ek_certificate".
    pub from: String,
}

/// The EK certificate: which one a tpm join sends (and so the EK assurance
/// it joins with), and that it chains to `ek_roots` when configured; with
/// none, what to do.
pub(super) fn ek_certificate(
    sent: Option<Sent<'_>>,
    ek_sha256: &str,
    ek_roots: Option<&Path>,
    intermediates: &[Vec<u8>],
) -> Check {
    let Some(Sent {
        der,
        assurance,
        from,
    }) = sent
    else {
        return Check::warn(
            EK_CERTIFICATE,
            "none in NV 0x01c00002 (RSA), 0x01c0000a (P-256) or 0x01c00016 (P-384), and no [tpm] ek_certificate: a tpm join sends no certificate (it joins as pinned, or is refused ek-chain)",
            format!("no EK certificate in NV: set [tpm] ek_certificate to the maker's certificate for this EK, or ask the operator to pin the EK with resolve add --ek-sha256 {ek_sha256} --uncertified"),
        );
    };
    let issuer = match X509Certificate::from_der(der) {
        Ok((_, c)) => printable(&c.issuer().to_string()),
        Err(_) => {
            return Check::fail(
                EK_CERTIFICATE,
                format!("the EK certificate in {from} is not an X.509 certificate"),
                "the TPM's maker must reprovision it, or set [tpm] ek_certificate to the maker's certificate for this EK",
            )
        }
    };
    let Some(roots) = ek_roots else {
        return Check::ok(
            EK_CERTIFICATE,
            format!("joins as {assurance}: from {from}, issued by {issuer} (no [tpm] ek_roots to check it against)"),
        );
    };
    let roots_hint = format!(
        "[tpm] ek_roots ({}) must hold this TPM maker's root; the intermediates up to the EK certificate's issuer ({issuer}) come from the TPM's EK chain NV indices, [tpm] ek_intermediates or ek_roots",
        roots.display()
    );
    let pem = match bc_wire::file::read_regular(
        roots,
        crate::pki::MAX_PEM_BUNDLE,
        bc_wire::file::Links::Follow,
    ) {
        Ok(p) => p,
        Err(e) => {
            return Check::fail(
                EK_CERTIFICATE,
                format!("[tpm] ek_roots {}: {e}", roots.display()),
                roots_hint,
            )
        }
    };
    match verify_chain(der, &pem, intermediates) {
        Ok(anchor) => Check::ok(
            EK_CERTIFICATE,
            format!(
                "joins as {assurance}: from {from}, issued by {issuer}, chains to {anchor} in {}",
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
pub(super) fn verify_chain(
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
    fn a_makers_service_is_one_line() {
        let c = from_service("Intel's EK certificate service (ekop.intel.com)");
        assert_eq!(c.status, Status::Ok);
        assert!(
            c.line().contains("ek certificate: joins as maker-service: none in NV, the control plane fetches it from Intel's EK certificate service (ekop.intel.com)")
                && !c.line().contains('\n'),
            "{}",
            c.line()
        );
    }

    #[test]
    fn ek_certificate_check() {
        let none = ek_certificate(None, "ab12", None, &[]);
        assert_eq!(none.status, Status::Warn);
        assert!(
            none.line()
                .contains("resolve add --ek-sha256 ab12 --uncertified"),
            "{}",
            none.line()
        );
        let maker = ca("Maker EK CA", true);
        let ek = ek_cert(&maker);
        let nv = |der| {
            Some(Sent {
                der,
                assurance: "nv",
                from: "NV 0x01c00002".to_owned(),
            })
        };
        let c = ek_certificate(nv(&ek), "", None, &[]);
        assert_eq!(c.status, Status::Ok);
        assert!(
            c.line().contains("joins as nv: from NV 0x01c00002"),
            "{}",
            c.line()
        );
        let dir = tempfile::tempdir().unwrap();
        let roots = dir.path().join("roots.pem");
        std::fs::write(&roots, maker.cert.pem()).unwrap();
        let c = ek_certificate(nv(&ek), "", Some(&roots), &[]);
        assert_eq!(c.status, Status::Ok, "{}", c.line());
        std::fs::write(&roots, ca("Other", true).cert.pem()).unwrap();
        assert_eq!(
            ek_certificate(nv(&ek), "", Some(&roots), &[]).status,
            Status::Fail
        );
        let missing = dir.path().join("absent.pem");
        assert_eq!(
            ek_certificate(nv(&ek), "", Some(&missing), &[]).status,
            Status::Fail
        );
        assert_eq!(
            ek_certificate(nv(b"junk"), "", None, &[]).status,
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
            ..TpmInfo::default()
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
