//! What the RSA and ECC halves of the EK and credential code share, below
//! both: the TCG EK templates ([`EkTemplate`]) with their nameAlg
//! ([`NameAlg`]), attributes and PolicyA, and the two halves' errors. `ek`
//! and `credential` (the RSA halves, which also dispatch) build on
//! `ek_ecc` and `credential_ecc`, and all four on this.

use hmac::{KeyInit, Mac};
use sha2::{Sha256, Sha384};

use super::reasons::TpmReason;

/// TPMA_OBJECT of the TCG default EK templates (L-1): fixedTPM,
/// fixedParent, sensitiveDataOrigin, adminWithPolicy, restricted, decrypt.
pub(crate) const EK_ATTRIBUTES: u32 = 0x0003_00B2;
/// PolicyA: TPM2_PolicySecret(TPM_RH_ENDORSEMENT), the L-1 authPolicy.
pub(crate) const EK_POLICY_A: [u8; 32] = [
    0x83, 0x71, 0x97, 0x67, 0x44, 0x84, 0xb3, 0xf8, 0x1a, 0x90, 0xcc, 0x8d, 0x46, 0xa5, 0xd7, 0x24,
    0xfd, 0x52, 0xd7, 0x6e, 0x06, 0x52, 0x0b, 0x64, 0xf2, 0xa1, 0xda, 0x1b, 0x33, 0x14, 0x69, 0xaa,
];
/// The TCG EK template an EK was made with: MakeCredential needs its key
/// type, nameAlg and symmetric key size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EkTemplate {
    /// RSA-2048, SHA-256, AES-128-CFB (certificate at NV 0x01c00002).
    RsaL1,
    /// NIST P-256, SHA-256, AES-128-CFB (certificate at NV 0x01c0000a).
    EccL2P256,
    /// NIST P-384, SHA-384, AES-256-CFB (certificate at NV 0x01c00016).
    EccH3P384,
}

impl EkTemplate {
    pub(crate) fn name_alg(self) -> NameAlg {
        match self {
            EkTemplate::EccH3P384 => NameAlg::Sha384,
            _ => NameAlg::Sha256,
        }
    }

    pub(crate) fn sym_key_bits(self) -> u32 {
        match self {
            EkTemplate::EccH3P384 => 256,
            _ => 128,
        }
    }

    /// Bytes of one ECC coordinate (0 for RSA).
    pub(crate) fn coordinate_len(self) -> usize {
        match self {
            EkTemplate::RsaL1 => 0,
            EkTemplate::EccL2P256 => 32,
            EkTemplate::EccH3P384 => 48,
        }
    }

    /// For logs: the `[tpm] ek` name bcd uses for it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EkTemplate::RsaL1 => "rsa",
            EkTemplate::EccL2P256 => "ecc-p256",
            EkTemplate::EccH3P384 => "ecc-p384",
        }
    }
}

/// Why an EK is refused; [`EkError::reason`] is the refusal reason.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EkError {
    /// No chain to a root, a bad signature, expired, or not parseable.
    #[error("ek-certificate: {0}")]
    Certificate(String),
    /// No path to a configured anchor (a missing or failing issuer).
    #[error("ek-chain: {0}")]
    Chain(String),
    /// The RSA EK has the ROCA fingerprint (CVE-2017-15361): factorable.
    #[error("ek-roca: the RSA EK was made by a flawed Infineon key generator (CVE-2017-15361)")]
    Roca,
    /// The EK public area is not the TCG template of the certificate's key
    /// holding that key.
    #[error("ek-mismatch: {0}")]
    Mismatch(&'static str),
}

impl EkError {
    pub(crate) fn reason(&self) -> TpmReason {
        match self {
            EkError::Certificate(_) => TpmReason::EkCertificate,
            EkError::Chain(_) => TpmReason::EkChain,
            EkError::Roca => TpmReason::EkRoca,
            EkError::Mismatch(_) => TpmReason::EkMismatch,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum CredentialError {
    #[error("the EK is not a public key of its template's kind")]
    EkKey,
    #[error("the credential must be 1 to 64 bytes")]
    Credential,
    #[error("RSA-OAEP failed")]
    Encrypt,
    #[error("no randomness")]
    Random,
}

/// The hash of an EK template (its nameAlg): KDFa, KDFe and the outer HMAC
/// use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NameAlg {
    Sha256,
    Sha384,
}

impl NameAlg {
    pub(crate) fn digest_len(self) -> usize {
        match self {
            NameAlg::Sha256 => 32,
            NameAlg::Sha384 => 48,
        }
    }

    /// H(parts…).
    pub(crate) fn hash(self, parts: &[&[u8]]) -> Vec<u8> {
        use sha2::Digest;
        fn run<D: Digest>(parts: &[&[u8]]) -> Vec<u8> {
            let mut h = D::new();
            for p in parts {
                h.update(p);
            }
            h.finalize().to_vec()
        }
        match self {
            NameAlg::Sha256 => run::<Sha256>(parts),
            NameAlg::Sha384 => run::<Sha384>(parts),
        }
    }

    /// HMAC-H(key, parts…).
    pub(super) fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        macro_rules! run {
            ($d:ty) => {{
                // An HMAC takes a key of any length: new_from_slice cannot fail.
                let Ok(mut mac) = hmac::Hmac::<$d>::new_from_slice(key) else {
                    return Vec::new();
                };
                for p in parts {
                    mac.update(p);
                }
                mac.finalize().into_bytes().to_vec()
            }};
        }
        match self {
            NameAlg::Sha256 => run!(Sha256),
            NameAlg::Sha384 => run!(Sha384),
        }
    }
}
