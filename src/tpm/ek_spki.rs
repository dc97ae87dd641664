//! The EK's SubjectPublicKeyInfo, the key the control plane knows a
//! machine by (`resolve add --ek-sha256` is its SHA-256).

use super::{Ek, TpmError};

/// The EK's SubjectPublicKeyInfo (DER), the key the control plane knows the
/// machine by: the certificate's when there is one (the control plane reads
/// it from there), else encoded from the public area.
pub fn ek_spki_der(ek: &Ek) -> Result<Vec<u8>, TpmError> {
    use x509_parser::prelude::*;
    if let Some(cert) = &ek.certificate {
        let (_, parsed) =
            X509Certificate::from_der(cert).map_err(|e| TpmError::EkCertificate(e.to_string()))?;
        return Ok(parsed.public_key().raw.to_vec());
    }
    public_spki_der(&ek.public)
}

/// The SubjectPublicKeyInfo of an EK public area (RSA, P-256 or P-384):
/// the TPM's own EK, whatever its certificate says.
pub fn public_spki_der(public: &[u8]) -> Result<Vec<u8>, TpmError> {
    use bc_wire::tpm::KeyParams;
    let public = bc_wire::tpm::Public::parse(public)
        .map_err(|_| TpmError::Unexpected("an EK public area"))?;
    match &public.params {
        KeyParams::Rsa {
            modulus, exponent, ..
        } => {
            let e = if *exponent == 0 { 65537 } else { *exponent };
            Ok(rsa_spki_der(modulus, e))
        }
        KeyParams::Ecc { curve, x, y, .. } => {
            let (prefix, n): (&[u8], usize) = match curve {
                0x0003 => (P256_SPKI_PREFIX, 32),
                0x0004 => (P384_SPKI_PREFIX, 48),
                _ => return Err(TpmError::Unexpected("an EK on a curve bcd does not know")),
            };
            if x.len() != n || y.len() != n {
                return Err(TpmError::Unexpected("an EK point of another size"));
            }
            Ok([prefix, &[4], x, y].concat())
        }
    }
}

/// SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 }, BIT STRING { 04 } }
/// up to the point's coordinates.
const P256_SPKI_PREFIX: &[u8] = &[
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];
/// As [`P256_SPKI_PREFIX`], with secp384r1.
const P384_SPKI_PREFIX: &[u8] = &[
    0x30, 0x76, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b,
    0x81, 0x04, 0x00, 0x22, 0x03, 0x62, 0x00,
];

/// SEQUENCE { SEQUENCE { rsaEncryption, NULL }, BIT STRING { SEQUENCE { n, e } } }.
fn rsa_spki_der(modulus: &[u8], exponent: u32) -> Vec<u8> {
    fn tlv(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match body.len() {
            n if n < 0x80 => out.push(n as u8),
            n if n < 0x100 => out.extend_from_slice(&[0x81, n as u8]),
            n => out.extend_from_slice(&[0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(body);
        out
    }
    fn integer(bytes: &[u8]) -> Vec<u8> {
        let first = bytes
            .iter()
            .position(|&b| b != 0)
            .unwrap_or(bytes.len().saturating_sub(1));
        let mut body = Vec::new();
        if bytes.get(first).is_some_and(|b| b & 0x80 != 0) {
            body.push(0);
        }
        body.extend_from_slice(&bytes[first..]);
        tlv(0x02, &body)
    }
    const RSA_ALGORITHM: &[u8] = &[
        0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
    ];
    let key = tlv(
        0x30,
        &[integer(modulus), integer(&exponent.to_be_bytes())].concat(),
    );
    let mut bits = vec![0u8];
    bits.extend_from_slice(&key);
    tlv(0x30, &[RSA_ALGORITHM, &tlv(0x03, &bits)].concat())
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
