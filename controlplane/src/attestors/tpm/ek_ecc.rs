//! ECC EKs: the EK public area must be exactly the TCG template of the
//! certificate's curve holding the certificate's point.
//!
//! TCG EK Credential Profile 2.5, templates of the EKs makers certify:
//!
//! * **L-2**, NIST P-256 (certificate at NV 0x01c0000a): nameAlg SHA-256,
//!   attributes 0x000300B2 (as L-1: userWithAuth clear), authPolicy PolicyA
//!   (SHA-256), AES-128-CFB, scheme and KDF NULL;
//! * **H-3**, NIST P-384 (certificate at NV 0x01c00016; what swtpm and
//!   Nuvoton ship): nameAlg SHA-384, attributes 0x000300F2 (userWithAuth
//!   set), authPolicy PolicyB (SHA-384), AES-256-CFB, scheme and KDF NULL.
//!
//! The expected TPMT_PUBLIC is the template's bytes up to the unique,
//! then the certificate's x and y at the curve's full size; the public area
//! sent must equal it byte for byte, so no field can differ unnoticed.

use x509_parser::certificate::X509Certificate;
use x509_parser::public_key::PublicKey;

use super::ek_template::{EkError, EkTemplate, EK_ATTRIBUTES, EK_POLICY_A};

/// H-3's attributes: L-1's with userWithAuth.
pub(crate) const EK_ATTRIBUTES_HIGH: u32 = 0x0003_00F2;
/// PolicyB, SHA-384: the authPolicy of the high-range EK templates.
pub(crate) const EK_POLICY_B_SHA384: [u8; 48] = [
    0xb2, 0x6e, 0x7d, 0x28, 0xd1, 0x1a, 0x50, 0xbc, 0x53, 0xd8, 0x82, 0xbc, 0xf5, 0xfd, 0x3a, 0x1a,
    0x07, 0x41, 0x48, 0xbb, 0x35, 0xd3, 0xb4, 0xe4, 0xcb, 0x1c, 0x0a, 0xd9, 0xbd, 0xe4, 0x19, 0xca,
    0xcb, 0x47, 0xba, 0x09, 0x69, 0x96, 0x46, 0x15, 0x0f, 0x9f, 0xc0, 0x00, 0xf3, 0xf8, 0x0e, 0x12,
];
const ALG_ECC: u16 = 0x0023;
const ALG_SHA256: u16 = 0x000B;
const ALG_SHA384: u16 = 0x000C;
const ALG_AES: u16 = 0x0006;
const ALG_CFB: u16 = 0x0043;
const ALG_NULL: u16 = 0x0010;
const CURVE_P256: u16 = 0x0003;
const CURVE_P384: u16 = 0x0004;

/// Whether a public area is an ECC key (its first field, TPMI_ALG_PUBLIC).
pub(crate) fn is_ecc_public(ek_public: &[u8]) -> bool {
    ek_public.get(..2) == Some(&ALG_ECC.to_be_bytes())
}

/// The template the certificate's curve names, once the public area is
/// that template holding the certificate's point.
pub(crate) fn check_public(
    cert: &X509Certificate<'_>,
    ek_public: &[u8],
) -> Result<EkTemplate, EkError> {
    let m = EkError::Mismatch;
    let Ok(PublicKey::EC(point)) = cert.public_key().parsed() else {
        return Err(m("the EK certificate does not hold an ECC key"));
    };
    let template = match curve_of(cert) {
        Some(t) => t,
        None => return Err(m("the EK certificate's curve is not NIST P-256 or P-384")),
    };
    let n = template.coordinate_len();
    let sec1 = point.data();
    if sec1.len() != 1 + 2 * n || sec1[0] != 4 {
        return Err(m("the EK certificate's point is not an uncompressed point"));
    }
    let expected = expected_public(template, &sec1[1..1 + n], &sec1[1 + n..]);
    let template_len = expected.len() - 2 * (2 + n);
    if ek_public.get(..template_len) != expected.get(..template_len) {
        return Err(m(
            "the EK public area is not the default ECC EK template of the certificate's curve",
        ));
    }
    if ek_public != expected.as_slice() {
        return Err(m("the EK public area does not hold the certificate's key"));
    }
    Ok(template)
}

/// The curve of an EC certificate key, as the EK template that uses it.
fn curve_of(cert: &X509Certificate<'_>) -> Option<EkTemplate> {
    use x509_parser::oid_registry::{OID_EC_P256, OID_NIST_EC_P384};
    let curve = cert
        .public_key()
        .algorithm
        .parameters
        .as_ref()?
        .as_oid()
        .ok()?;
    if curve == OID_EC_P256 {
        Some(EkTemplate::EccL2P256)
    } else if curve == OID_NIST_EC_P384 {
        Some(EkTemplate::EccH3P384)
    } else {
        None
    }
}

/// The marshalled TPMT_PUBLIC of `template` with unique (x, y).
pub(crate) fn expected_public(template: EkTemplate, x: &[u8], y: &[u8]) -> Vec<u8> {
    let (name_alg, attributes, policy, sym_bits, curve): (u16, u32, &[u8], u16, u16) =
        match template {
            EkTemplate::EccH3P384 => (
                ALG_SHA384,
                EK_ATTRIBUTES_HIGH,
                &EK_POLICY_B_SHA384,
                256,
                CURVE_P384,
            ),
            // L-2 (RsaL1 never comes here: callers pass an ECC template).
            _ => (ALG_SHA256, EK_ATTRIBUTES, &EK_POLICY_A, 128, CURVE_P256),
        };
    let mut out = Vec::with_capacity(200);
    for v in [ALG_ECC, name_alg] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out.extend_from_slice(&attributes.to_be_bytes());
    out.extend_from_slice(&(policy.len() as u16).to_be_bytes());
    out.extend_from_slice(policy);
    for v in [ALG_AES, sym_bits, ALG_CFB, ALG_NULL, curve, ALG_NULL] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    for c in [x, y] {
        out.extend_from_slice(&(c.len() as u16).to_be_bytes());
        out.extend_from_slice(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::credential::make_credential;
    use super::super::ek::tests::{INTERMEDIATE_PEM, ROOT_PEM};
    use super::super::ek::{parse_roots_pem, verify_ek, EkTrust};
    use super::*;

    /// swtpm's P-384 EK (H-3, persisted at 0x81010016) and a P-256 EK made
    /// with `tpm2_createek -G ecc` (L-2), both certified by the test maker.
    const P384_CERT: &[u8] = include_bytes!("testdata/ek-p384-cert.der");
    const P384_PUBLIC: &[u8] = include_bytes!("testdata/ek-p384-public.bin");
    const P256_CERT: &[u8] = include_bytes!("testdata/ek-p256-cert.der");
    const P256_PUBLIC: &[u8] = include_bytes!("testdata/ek-p256-public.bin");

    fn roots() -> EkTrust {
        let mut r = parse_roots_pem(ROOT_PEM).unwrap();
        r.extend(parse_roots_pem(INTERMEDIATE_PEM).unwrap());
        EkTrust::anchors(r)
    }

    /// A day after the fixtures were issued.
    fn at(cert: &[u8]) -> crate::store::UnixMs {
        use x509_parser::prelude::FromDer;
        let (_, c) = X509Certificate::from_der(cert).unwrap();
        (c.validity().not_before.timestamp() + 86_400) * 1000
    }

    #[test]
    fn ecc_eks_verify_with_their_templates() {
        let ek = verify_ek(P384_CERT, P384_PUBLIC, &roots(), &[], at(P384_CERT)).unwrap();
        assert_eq!(ek.template, EkTemplate::EccH3P384);
        let ek = verify_ek(P256_CERT, P256_PUBLIC, &roots(), &[], at(P256_CERT)).unwrap();
        assert_eq!(ek.template, EkTemplate::EccL2P256);
    }

    #[test]
    fn ecc_ek_refusals() {
        let reason = |cert: &[u8], public: &[u8]| {
            verify_ek(cert, public, &roots(), &[], at(cert))
                .map(|_| "ok")
                .unwrap_or_else(|e| e.reason().as_str())
        };
        // Wrong curve: a P-256 certificate for the P-384 EK and back.
        assert_eq!(reason(P256_CERT, P384_PUBLIC), "ek-mismatch");
        assert_eq!(reason(P384_CERT, P256_PUBLIC), "ek-mismatch");
        // Another point, another attribute.
        let mut public = P384_PUBLIC.to_vec();
        let n = public.len();
        public[n - 1] ^= 1;
        assert_eq!(reason(P384_CERT, &public), "ek-mismatch");
        let mut public = P256_PUBLIC.to_vec();
        public[7] |= 0x40; // userWithAuth
        assert_eq!(reason(P256_CERT, &public), "ek-mismatch");
        // A bad signature: no path to the root.
        let mut cert = P384_CERT.to_vec();
        let n = cert.len();
        cert[n - 5] ^= 1;
        assert_eq!(reason(&cert, P384_PUBLIC), "ek-chain");
    }

    #[test]
    fn ecc_make_credential_fixed_vector() {
        use super::super::credential::wrap;
        use super::super::credential_ecc::ecc_seed_with;
        let ek = verify_ek(P256_CERT, P256_PUBLIC, &roots(), &[], at(P256_CERT)).unwrap();
        let (seed, secret) = ecc_seed_with(ek.template, &ek.spki_der, &[7; 32]).unwrap();
        assert_eq!(seed.len(), 32);
        assert_eq!(secret.len(), 4 + 64);
        let id = wrap(ek.template, &seed, &[0, 0x0b, 1, 2], &[9; 32]).unwrap();
        assert_eq!(id.len(), 2 + 32 + 34);
        let again = ecc_seed_with(ek.template, &ek.spki_der, &[7; 32]).unwrap();
        assert_eq!(
            (seed, secret),
            again,
            "deterministic for a fixed ephemeral key"
        );

        let ek = verify_ek(P384_CERT, P384_PUBLIC, &roots(), &[], at(P384_CERT)).unwrap();
        let made = make_credential(ek.template, &ek.spki_der, &[0, 0x0b, 1], &[1; 32]).unwrap();
        assert_eq!(made.encrypted_secret.len(), 4 + 96);
        assert_eq!(made.id_object.len(), 2 + 48 + 34);
    }

    /// Pinned bytes, computed apart from this code by
    /// `testdata/ecc-credential-vector.py` (pyca/cryptography ECDH, KDFe,
    /// KDFa, AES-CFB, HMAC): a change in any step of the ECC
    /// MakeCredential fails here, not only on a TPM.
    #[test]
    fn ecc_make_credential_matches_the_independent_vector() {
        use super::super::credential::wrap;
        use super::super::credential_ecc::ecc_seed_with;
        let ak_name: Vec<u8> = [0, 0x0b].into_iter().chain(0..32).collect();
        for (cert, public, n, secret, id_object) in [
            (
                P256_CERT,
                P256_PUBLIC,
                32,
                "00201e18532fd4754c02f3041d9c75ceb33b83ffd81ac7ce4fe882ccb1c98bc5896e0020a46c311c4e2ff40dd96a3653e6e45445d32dfe486eced75c7a90c6a18881c0a3",
                "00200f6e81f6cf50f08d77e15374021a1d00b1343d1a5fb3c8caef3194d6a17e03e1fb6e24954ff5da9dee624297b8f3b843e1ef803ee97e618cf085df9b4e0f9edc4499",
            ),
            (
                P384_CERT,
                P384_PUBLIC,
                48,
                "0030b01bfc4a2d7fe2095e6627cc5caf9abd153d5b551fe7f6da615da9d1bfd101e8d191e85902c0a34eaa3a16e666880b730030059f658c4d6a6e57c0959de80109b0fa6b56bd63d1d5701a93d15322f2267a15526641c60cd07c912a6df58aa993d89b",
                "0030c468e74c2a5ef4a8a1387b47cb9f9830111a9e3593a5d52d182b93159caa024b3704c95bcc2daa10dce3522f05e508a11138e89908b6041201f91d01e5273e83468bbe1ff7d4ae329878922028ecd3a22b94",
            ),
        ] {
            let ek = verify_ek(cert, public, &roots(), &[], at(cert)).unwrap();
            let (seed, got_secret) = ecc_seed_with(ek.template, &ek.spki_der, &vec![7; n]).unwrap();
            assert_eq!(hex::encode(got_secret), secret, "{:?}", ek.template);
            let got_id = wrap(ek.template, &seed, &ak_name, &[9; 32]).unwrap();
            assert_eq!(hex::encode(got_id), id_object, "{:?}", ek.template);
        }
    }

    /// The wire's parser takes the H-3 EK's SHA-384 nameAlg and names it
    /// with SHA-384.
    #[test]
    fn a_p384_ek_public_area_parses_with_its_sha384_name() {
        let public = bc_wire::tpm::Public::parse(P384_PUBLIC).unwrap();
        assert_eq!(public.name_alg, bc_wire::tpm::ALG_SHA384);
        let name = public.name();
        assert_eq!(name.len(), 2 + 48);
        assert_eq!(&name[..2], &[0x00, 0x0C]);
        assert!(!bc_wire::tpm::is_attestation_key(&public));
    }
}
