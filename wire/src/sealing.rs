//! Sealing a join token to the JoinService encryption key.
//!
//! HPKE base mode (RFC 9180) with DHKEM(P-256, HKDF-SHA256), HKDF-SHA256 and
//! AES-128-GCM. The purpose is the HPKE `info`, and the request's CSR digest
//! is the AEAD's associated data, so a sealed token captured from one request
//! opens for no other CSR. Sealed form: `enc` (65-byte SEC1 point) ‖ ciphertext.

use hpke::aead::AesGcm128;
use hpke::kdf::HkdfSha256;
use hpke::kem::DhP256HkdfSha256;
use hpke::{Deserializable, Kem as _, OpModeR, OpModeS, Serializable};
use p256::elliptic_curve::sec1::ToSec1Point;
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey};

type Kem = DhP256HkdfSha256;

/// The HPKE `info` of a sealed join token.
pub(crate) const TOKEN_INFO: &[u8] = b"bettercompute join-token v1";
const ENC_LEN: usize = 65;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error("the join encryption key is not a P-256 public key")]
    BadPublicKey,
    #[error("the join encryption key is not a P-256 private key")]
    BadPrivateKey,
    #[error("sealing failed")]
    Seal,
    #[error("the sealed token is malformed")]
    Malformed,
    #[error("the sealed token does not open with this key for this request")]
    Open,
}

/// A recipient public key, from its SubjectPublicKeyInfo (DER).
pub struct SealingKey(<Kem as hpke::Kem>::PublicKey);

impl SealingKey {
    pub fn from_spki_der(spki: &[u8]) -> Result<Self, SealError> {
        let pk = p256::PublicKey::from_public_key_der(spki).map_err(|_| SealError::BadPublicKey)?;
        let point = pk.to_sec1_point(false);
        <Kem as hpke::Kem>::PublicKey::from_bytes(point.as_bytes())
            .map(SealingKey)
            .map_err(|_| SealError::BadPublicKey)
    }

    /// Seals `plaintext` for the request whose CSR has digest `csr_sha256`.
    pub fn seal(&self, csr_sha256: &[u8; 32], plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
        let (enc, ct) = hpke::single_shot_seal::<AesGcm128, HkdfSha256, Kem>(
            &OpModeS::Base,
            &self.0,
            TOKEN_INFO,
            plaintext,
            csr_sha256,
        )
        .map_err(|_| SealError::Seal)?;
        let mut out = Vec::with_capacity(ENC_LEN + ct.len());
        out.extend_from_slice(&enc.to_bytes());
        out.extend_from_slice(&ct);
        Ok(out)
    }
}

/// The JoinService's private half.
pub struct OpeningKey(<Kem as hpke::Kem>::PrivateKey);

impl OpeningKey {
    pub fn from_pkcs8_der(der: &[u8]) -> Result<Self, SealError> {
        let sk = p256::SecretKey::from_pkcs8_der(der).map_err(|_| SealError::BadPrivateKey)?;
        <Kem as hpke::Kem>::PrivateKey::from_bytes(&sk.to_bytes())
            .map(OpeningKey)
            .map_err(|_| SealError::BadPrivateKey)
    }

    pub fn open(&self, csr_sha256: &[u8; 32], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        if sealed.len() <= ENC_LEN {
            return Err(SealError::Malformed);
        }
        let (enc, ct) = sealed.split_at(ENC_LEN);
        let enc =
            <Kem as hpke::Kem>::EncappedKey::from_bytes(enc).map_err(|_| SealError::Malformed)?;
        hpke::single_shot_open::<AesGcm128, HkdfSha256, Kem>(
            &OpModeR::Base,
            &self.0,
            &enc,
            TOKEN_INFO,
            ct,
            csr_sha256,
        )
        .map_err(|_| SealError::Open)
    }
}

/// A fresh key pair for a control plane's `init`: (PKCS#8 DER, SPKI DER).
pub fn generate_keypair() -> Result<(Vec<u8>, Vec<u8>), SealError> {
    use p256::pkcs8::{EncodePrivateKey, EncodePublicKey};
    let (sk, _) = Kem::gen_keypair();
    let secret =
        p256::SecretKey::from_slice(&sk.to_bytes()).map_err(|_| SealError::BadPrivateKey)?;
    let der = secret
        .to_pkcs8_der()
        .map_err(|_| SealError::BadPrivateKey)?;
    let spki = secret
        .public_key()
        .to_public_key_der()
        .map_err(|_| SealError::BadPublicKey)?;
    Ok((der.as_bytes().to_vec(), spki.as_bytes().to_vec()))
}
