//! The EK's SubjectPublicKeyInfo, the key the control plane knows a
//! machine by (`resolve add --ek-sha256` is its SHA-256).

use super::{Ek, TpmError};

/// The EK's SubjectPublicKeyInfo (DER), the key the control plane knows the
/// machine by: the certificate's when there is one (the control plane reads
/// it from there), else encoded from the public area.
pub(crate) fn ek_spki_der(ek: &Ek) -> Result<Vec<u8>, TpmError> {
    use x509_parser::prelude::*;
    if let Some(cert) = &ek.certificate {
        let (_, parsed) =
            X509Certificate::from_der(cert).map_err(|e| TpmError::EkCertificate(e.to_string()))?;
        return Ok(parsed.public_key().raw.to_vec());
    }
    public_spki_der(&ek.public)
}

/// The SubjectPublicKeyInfo of an EK public area (RSA, P-256 or P-384):
/// the TPM's own EK, whatever its certificate says
/// ([`bc_wire::ekcert::spki`], which the control plane uses for an EK
/// without a certificate).
pub(crate) fn public_spki_der(public: &[u8]) -> Result<Vec<u8>, TpmError> {
    bc_wire::ekcert::spki::public_spki_der(public).map_err(TpmError::Unexpected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ecc_ek_public_areas_encode_as_their_spki() {
        use p256::pkcs8::EncodePublicKey;
        let key = p256::SecretKey::from_slice(&[7; 32]).unwrap().public_key();
        let der = key.to_public_key_der().unwrap();
        let point = &der.as_bytes()[der.as_bytes().len() - 64..];
        let (x, y) = (&point[..32], &point[32..]);
        // An L-2 EK public area holding that point.
        let template = crate::tpm::EkKind::EccP256.default_template().unwrap();
        let public = super::super::ek_kind::with_unique(&template, &[x, y]).unwrap();
        assert_eq!(
            public_spki_der(&public).unwrap(),
            key.to_public_key_der().unwrap().as_bytes()
        );
        // P-384: the same prefix shape, secp384r1 (1.3.132.0.34).
        let p384 = crate::tpm::EkKind::EccP384.default_template().unwrap();
        let public = super::super::ek_kind::with_unique(&p384, &[&[1; 48], &[2; 48]]).unwrap();
        let spki = public_spki_der(&public).unwrap();
        assert_eq!(spki.len(), 2 + 0x76);
        assert_eq!(&spki[spki.len() - 97..][..2], &[4, 1]);
    }
}
