//! ecdsa-with-SHA512 on P-256 and P-384, which some makers sign EK
//! certificates with and x509-parser (through ring) does not verify: the
//! TBSCertificate's SHA-512, truncated to the curve's order as ECDSA
//! prescribes, checked with the p256/p384 verifiers.

use x509_parser::certificate::X509Certificate;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::SubjectPublicKeyInfo;

/// 1.2.840.10045.4.3.4
const ECDSA_WITH_SHA512: &str = "1.2.840.10045.4.3.4";

/// Whether `cert` is signed with ecdsa-with-SHA512.
pub(crate) fn is_ecdsa_sha512(cert: &X509Certificate<'_>) -> bool {
    cert.signature_algorithm.algorithm.to_id_string() == ECDSA_WITH_SHA512
}

/// Whether `issuer`'s key (P-256 or P-384) verifies `cert`'s
/// ecdsa-with-SHA512 signature; false for any other algorithm or key.
pub(super) fn verifies(cert: &X509Certificate<'_>, issuer: &SubjectPublicKeyInfo<'_>) -> bool {
    use p256::ecdsa::signature::hazmat::PrehashVerifier;
    use sha2::Digest as _;
    use x509_parser::oid_registry::{OID_EC_P256, OID_NIST_EC_P384};
    if !is_ecdsa_sha512(cert) {
        return false;
    }
    let Ok(PublicKey::EC(point)) = issuer.parsed() else {
        return false;
    };
    let Some(curve) = issuer
        .algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.as_oid().ok())
    else {
        return false;
    };
    let digest = sha2::Sha512::digest(cert.tbs_certificate.as_ref());
    let signature = cert.signature_value.data.as_ref();
    if curve == OID_EC_P256 {
        let (Ok(key), Ok(sig)) = (
            p256::ecdsa::VerifyingKey::from_sec1_bytes(point.data()),
            p256::ecdsa::Signature::from_der(signature),
        ) else {
            return false;
        };
        key.verify_prehash(&digest, &sig).is_ok()
    } else if curve == OID_NIST_EC_P384 {
        let (Ok(key), Ok(sig)) = (
            p384::ecdsa::VerifyingKey::from_sec1_bytes(point.data()),
            p384::ecdsa::Signature::from_der(signature),
        ) else {
            return false;
        };
        key.verify_prehash(&digest, &sig).is_ok()
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::FromDer;

    /// A P-384 root and a P-256 EK certificate it issued, both signed
    /// ecdsa-with-SHA512 (`openssl ... -sha512`).
    const ROOT: &[u8] = include_bytes!("testdata/sha512-root.der");
    const EK: &[u8] = include_bytes!("testdata/sha512-ek.der");

    #[test]
    fn sha512_signatures_verify_and_a_tampered_one_does_not() {
        let (_, root) = X509Certificate::from_der(ROOT).unwrap();
        let (_, ek) = X509Certificate::from_der(EK).unwrap();
        assert!(is_ecdsa_sha512(&ek) && is_ecdsa_sha512(&root));
        assert!(verifies(&ek, root.public_key()));
        assert!(verifies(&root, root.public_key()));
        // The EK's own key did not sign it.
        assert!(!verifies(&ek, ek.public_key()));
        let mut tampered = EK.to_vec();
        // A byte of the subject's key in the TBSCertificate.
        let at = tampered
            .windows(2)
            .rposition(|w| w == [0x03, 0x42])
            .unwrap()
            + 10;
        tampered[at] ^= 1;
        let (_, bad) = X509Certificate::from_der(&tampered).unwrap();
        assert!(!verifies(&bad, root.public_key()));
    }

    #[test]
    fn an_ek_certificate_signed_with_sha512_has_a_path_to_its_root() {
        let (_, root) = X509Certificate::from_der(ROOT).unwrap();
        let (_, ek) = X509Certificate::from_der(EK).unwrap();
        assert!(crate::ekcert::is_self_signed(&root));
        let anchored = crate::ekcert::build_path(
            &ek,
            std::slice::from_ref(&root),
            &[],
            crate::ekcert::path::tests::NOW,
        )
        .unwrap();
        assert_eq!(anchored.intermediates, 0);
        assert!(crate::ekcert::check_profile(&ek).is_ok());
    }
}
