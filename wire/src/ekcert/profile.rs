//! What makes a certificate an EK certificate (TCG EK Credential Profile):
//! the EKU 2.23.133.8.1 (tcg-kp-EKCertificate) when there is an EKU, the
//! key usage an EK's key type needs when there is a keyUsage (an EK
//! decrypts, it never signs), and not a CA. A maker's CA certificate or a
//! TLS certificate that happens to chain to the maker's root is not an EK
//! certificate.
//!
//! The key usages real makers ship:
//! * RSA EKs: keyEncipherment (Infineon, STMicro, Nuvoton, Intel PTT, the
//!   vTPMs), the only one the profile allows;
//! * ECC EKs: keyAgreement (Infineon OPTIGA and STMicro ST33 P-256 EKs, as
//!   the profile says) or keyEncipherment alone (Intel PTT's P-256 EKs),
//!   so either is accepted;
//! * no EKU and no subjectAltName at all (Google's newer vTPM EKs): nothing
//!   to check, nothing refused.
//!
//! Infineon encodes its leaves' keyUsage without declaring the unused bits
//! (`03 02 00 20`, not DER's minimal `03 02 05 20`); x509-parser reads the
//! bits all the same.

use x509_parser::certificate::X509Certificate;
use x509_parser::public_key::PublicKey;

/// tcg-kp-EKCertificate.
pub(crate) const EK_CERTIFICATE_EKU: &str = "2.23.133.8.1";

/// Ok when `cert` may be an EK certificate, else why not.
pub fn check_profile(cert: &X509Certificate<'_>) -> Result<(), String> {
    match cert.basic_constraints() {
        Ok(Some(bc)) if bc.value.ca => {
            return Err(
                "it is a CA certificate (basicConstraints cA), not an EK certificate".into(),
            )
        }
        Ok(_) => {}
        Err(_) => return Err("its basicConstraints is malformed".into()),
    }
    match cert.extended_key_usage() {
        Ok(Some(eku)) => {
            if !eku
                .value
                .other
                .iter()
                .any(|oid| oid.to_id_string() == EK_CERTIFICATE_EKU)
            {
                return Err(format!(
                    "its extendedKeyUsage lacks the EK certificate purpose {EK_CERTIFICATE_EKU}"
                ));
            }
        }
        Ok(None) => {}
        Err(_) => return Err("its extendedKeyUsage is malformed".into()),
    }
    let ku = match cert.key_usage() {
        Ok(ku) => ku,
        Err(_) => return Err("its keyUsage is malformed".into()),
    };
    if let Some(ku) = ku {
        let ku = ku.value;
        match cert.public_key().parsed() {
            Ok(PublicKey::RSA(_)) if !ku.key_encipherment() => {
                return Err("its keyUsage lacks keyEncipherment, which an RSA EK needs".into())
            }
            Ok(PublicKey::EC(_)) if !ku.key_agreement() && !ku.key_encipherment() => {
                return Err(
                    "its keyUsage has neither keyAgreement nor keyEncipherment, one of which an ECC EK needs"
                        .into(),
                )
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ekcert::path::tests::{ca_params, root};
    use rcgen::{
        CertificateParams, CustomExtension, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose, PublicKeyData,
    };
    use x509_parser::prelude::FromDer;

    /// An RSA public key given by its modulus (never used to encrypt).
    struct RsaPublic(Vec<u8>);

    impl RsaPublic {
        fn new(modulus: &[u8]) -> Self {
            let int = |b: &[u8]| {
                let mut body = vec![0u8];
                body.extend_from_slice(b);
                let mut out = vec![0x02, 0x82, (body.len() >> 8) as u8, body.len() as u8];
                out.extend_from_slice(&body);
                out
            };
            let body = [int(modulus), vec![0x02, 0x03, 0x01, 0x00, 0x01]].concat();
            let mut der = vec![0x30, 0x82, (body.len() >> 8) as u8, body.len() as u8];
            der.extend_from_slice(&body);
            RsaPublic(der)
        }
    }

    impl PublicKeyData for RsaPublic {
        fn der_bytes(&self) -> &[u8] {
            &self.0
        }
        fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
            &rcgen::PKCS_RSA_SHA256
        }
    }

    fn ek_eku() -> CustomExtension {
        // SEQUENCE { OID 2.23.133.8.1 }
        CustomExtension::from_oid_content(
            &[2, 5, 29, 37],
            vec![0x30, 0x07, 0x06, 0x05, 0x67, 0x81, 0x05, 0x08, 0x01],
        )
    }

    fn check(p: &CertificateParams, rsa: bool) -> Result<(), String> {
        let ca = root("Maker", (2020, 2040));
        let der = if rsa {
            let key = RsaPublic::new(&[0xc5; 256]);
            p.signed_by(&key, &ca.issuer).unwrap().der().to_vec()
        } else {
            let key = KeyPair::generate().unwrap();
            p.signed_by(&key, &ca.issuer).unwrap().der().to_vec()
        };
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        check_profile(&cert)
    }

    /// keyUsage (critical) with the BIT STRING `bits` as its value.
    fn key_usage(bits: &[u8]) -> CustomExtension {
        let mut ext = CustomExtension::from_oid_content(&[2, 5, 29, 15], bits.to_vec());
        ext.set_criticality(true);
        ext
    }

    #[test]
    fn what_an_ek_certificate_is() {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        // No EKU, no keyUsage, no SAN, no basicConstraints (Google's newer
        // vTPM EKs carry neither EKU nor SAN): nothing refuses it.
        check(&p, true).unwrap();
        check(&p, false).unwrap();
        p.custom_extensions = vec![ek_eku()];
        p.key_usages = vec![KeyUsagePurpose::KeyEncipherment];
        check(&p, true).unwrap();
        // An ECC EK with keyEncipherment alone, as Intel PTT ships its P-256 EKs.
        check(&p, false).unwrap();
        p.key_usages = vec![KeyUsagePurpose::KeyAgreement];
        check(&p, false).unwrap();
        let e = check(&p, true).unwrap_err();
        assert!(e.contains("keyEncipherment"), "{e}");
        // A signing key is no EK, whatever its type.
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let e = check(&p, false).unwrap_err();
        assert!(
            e.contains("neither keyAgreement nor keyEncipherment"),
            "{e}"
        );
        let e = check(&p, true).unwrap_err();
        assert!(e.contains("keyEncipherment"), "{e}");
        // A TLS client certificate chaining to the maker's root is no EK.
        let mut tls = CertificateParams::new(Vec::<String>::new()).unwrap();
        tls.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let e = check(&tls, false).unwrap_err();
        assert!(e.contains("2.23.133.8.1"), "{e}");
        // Nor is a CA.
        let mut ca = ca_params("Sub CA", (2020, 2040));
        let e = check(&ca, false).unwrap_err();
        assert!(e.contains("CA certificate"), "{e}");
        ca.is_ca = IsCa::ExplicitNoCa;
        ca.key_usages.clear();
        check(&ca, false).unwrap();
    }

    /// keyUsage BIT STRINGs as makers encode them: DER's minimal form,
    /// Infineon's (no unused bits declared), a trailing zero octet. Bits set
    /// in the declared padding are malformed.
    #[test]
    fn key_usage_bit_strings_not_minimally_encoded() {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        for (bits, rsa_ok, ecc_ok) in [
            (&[0x03, 0x02, 0x05, 0x20][..], true, true),
            (&[0x03, 0x02, 0x00, 0x20][..], true, true),
            (&[0x03, 0x03, 0x00, 0x20, 0x00][..], true, true),
            (&[0x03, 0x03, 0x07, 0x20, 0x00][..], true, true),
            (&[0x03, 0x02, 0x03, 0x08][..], false, true),
            (&[0x03, 0x02, 0x00, 0x08][..], false, true),
            (&[0x03, 0x02, 0x07, 0x80][..], false, false),
        ] {
            p.custom_extensions = vec![ek_eku(), key_usage(bits)];
            assert_eq!(check(&p, true).is_ok(), rsa_ok, "RSA {bits:02x?}");
            assert_eq!(check(&p, false).is_ok(), ecc_ok, "ECC {bits:02x?}");
        }
        p.custom_extensions = vec![ek_eku(), key_usage(&[0x03, 0x02, 0x07, 0xa0])];
        let e = check(&p, true).unwrap_err();
        assert!(e.contains("malformed"), "{e}");
    }

    /// Every real maker's EK certificate is one; their CAs are not.
    #[test]
    fn real_ek_certificates_pass_and_their_cas_do_not() {
        use crate::ekcert::real;
        for leaf in [
            "ifx-optiga-ecc-ek-mfgca035.pem",
            "ifx-optiga-rsa-ek-mfgca035.pem",
            "nuvoton-npct75x-rsa-ek-rootca2111-b.pem",
            "stm-st33htph-ecc-ek-eccintca01.pem",
            "stm-st33htph-rsa-ek-intca05.pem",
        ] {
            let der = real::der(leaf);
            let (_, cert) = X509Certificate::from_der(&der).unwrap();
            check_profile(&cert).unwrap_or_else(|e| panic!("{leaf}: {e}"));
        }
        for ca in [
            "ifx-optiga-ecc-manufacturing-ca-035-1f61aed7.pem",
            "stm-tpm-ek-root-ca-f8e37a86.pem",
            "nuvoton-tpm-root-ca-2111-cd8185ff.pem",
        ] {
            let der = real::der(ca);
            let (_, cert) = X509Certificate::from_der(&der).unwrap();
            let e = check_profile(&cert).unwrap_err();
            assert!(e.contains("CA certificate"), "{ca}: {e}");
        }
    }
}
