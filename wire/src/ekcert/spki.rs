//! The SubjectPublicKeyInfo of an EK public area: what bcd prints as the
//! EK's SHA-256 (`bcd tpm identify`) and what the control plane keys an EK
//! without a certificate on (`resolve add --ek-sha256 H --uncertified`), so
//! both sides encode it the same way.

/// The SubjectPublicKeyInfo (DER) of an EK public area (RSA, P-256 or
/// P-384); the reason when it is none of them.
pub fn public_spki_der(public: &[u8]) -> Result<Vec<u8>, &'static str> {
    use crate::tpm::KeyParams;
    let public = crate::tpm::Public::parse(public).map_err(|_| "an EK public area")?;
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
                _ => return Err("an EK on a curve other than P-256 and P-384"),
            };
            if x.len() != n || y.len() != n {
                return Err("an EK point of another size");
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
