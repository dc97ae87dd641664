//! The credential seed for an ECC EK (TPM 2.0 Part 1 §11.4.10.3 and
//! Annex C.6.1): an ephemeral ECDH on the EK's curve.
//!
//! * an ephemeral key `(d, Q = d·G)` on the EK's curve; `Z` = the x
//!   coordinate of `d·EK`;
//! * `seed = KDFe(nameAlg, Z, "IDENTITY", Q.x, EK.x, digest bits)`;
//! * the encrypted secret is `Q` as a TPMS_ECC_POINT
//!   (`u16 ‖ x ‖ u16 ‖ y`, each coordinate the curve's full size).
//!
//! The TPM recomputes `Z` as `ek_private·Q` in ActivateCredential.

use p256::elliptic_curve::sec1::{FromSec1Point, ModulusSize, ToSec1Point};
use p256::elliptic_curve::{
    AffinePoint, CurveArithmetic, FieldBytesSize, NonZeroScalar, PublicKey,
};
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

use super::ek_template::{CredentialError, EkTemplate, NameAlg};

/// A fresh seed for `template` and the encrypted secret that carries it.
pub(super) fn ecc_seed(
    template: EkTemplate,
    ek_spki_der: &[u8],
) -> Result<(Vec<u8>, Vec<u8>), CredentialError> {
    // A random scalar below the order: out-of-range draws (about 2^-32
    // of them) are drawn again, a few times at most.
    for _ in 0..8 {
        let mut d = vec![0u8; template.coordinate_len()];
        getrandom::fill(&mut d).map_err(|_| CredentialError::Random)?;
        match ecc_seed_with(template, ek_spki_der, &d) {
            Err(CredentialError::Random) => continue,
            other => return other,
        }
    }
    Err(CredentialError::Random)
}

/// [`ecc_seed`] with the ephemeral private scalar `d` (big-endian, the
/// curve's size) given: for vectors. `Random` when `d` is not a scalar.
pub(super) fn ecc_seed_with(
    template: EkTemplate,
    ek_spki_der: &[u8],
    d: &[u8],
) -> Result<(Vec<u8>, Vec<u8>), CredentialError> {
    let ek_point = ec_point(ek_spki_der)?;
    let (z, q) = match template {
        EkTemplate::EccL2P256 => ecdh::<p256::NistP256>(&ek_point, d)?,
        EkTemplate::EccH3P384 => ecdh::<p384::NistP384>(&ek_point, d)?,
        EkTemplate::RsaL1 => return Err(CredentialError::EkKey),
    };
    let n = template.coordinate_len();
    if ek_point.len() != 1 + 2 * n || q.len() != 1 + 2 * n {
        return Err(CredentialError::EkKey);
    }
    let (qx, qy) = (&q[1..1 + n], &q[1 + n..]);
    let ek_x = &ek_point[1..1 + n];
    let alg = template.name_alg();
    let seed = kdfe(
        alg,
        &z,
        b"IDENTITY",
        qx,
        ek_x,
        (alg.digest_len() * 8) as u32,
    );
    let mut secret = Vec::with_capacity(4 + 2 * n);
    for c in [qx, qy] {
        secret.extend_from_slice(&(n as u16).to_be_bytes());
        secret.extend_from_slice(c);
    }
    Ok((seed, secret))
}

/// The uncompressed SEC1 point of an EC SubjectPublicKeyInfo.
fn ec_point(spki_der: &[u8]) -> Result<Vec<u8>, CredentialError> {
    match SubjectPublicKeyInfo::from_der(spki_der) {
        Ok(([], spki)) if spki.subject_public_key.data.first() == Some(&4) => {
            Ok(spki.subject_public_key.data.to_vec())
        }
        _ => Err(CredentialError::EkKey),
    }
}

/// `(Z, Q)`: the x coordinate of `d·EK` and the uncompressed SEC1 `Q = d·G`.
fn ecdh<C>(ek_sec1: &[u8], d: &[u8]) -> Result<(Vec<u8>, Vec<u8>), CredentialError>
where
    C: CurveArithmetic,
    AffinePoint<C>: FromSec1Point<C> + ToSec1Point<C>,
    FieldBytesSize<C>: ModulusSize,
{
    let ek = PublicKey::<C>::from_sec1_bytes(ek_sec1).map_err(|_| CredentialError::EkKey)?;
    let d = NonZeroScalar::<C>::try_from(d).map_err(|_| CredentialError::Random)?;
    let shared = p256::elliptic_curve::ecdh::diffie_hellman(d, ek.as_affine());
    let q = PublicKey::<C>::from_secret_scalar(&d);
    Ok((
        shared.raw_secret_bytes().to_vec(),
        q.to_sec1_point(false).as_bytes().to_vec(),
    ))
}

/// KDFe (TPM 2.0 Part 1 Annex C.6.1, SP 800-56A's concatenation KDF):
/// `H(u32 counter ‖ Z ‖ label ‖ 0 ‖ partyU ‖ partyV)` for counter = 1, 2, …,
/// truncated to `bits`.
pub(super) fn kdfe(
    alg: NameAlg,
    z: &[u8],
    label: &[u8],
    party_u: &[u8],
    party_v: &[u8],
    bits: u32,
) -> Vec<u8> {
    let bytes = (bits as usize).div_ceil(8);
    let mut out = Vec::with_capacity(bytes + alg.digest_len());
    let mut counter: u32 = 1;
    while out.len() < bytes {
        out.extend_from_slice(&alg.hash(&[
            &counter.to_be_bytes(),
            z,
            label,
            &[0],
            party_u,
            party_v,
        ]));
        counter += 1;
    }
    out.truncate(bytes);
    out
}
