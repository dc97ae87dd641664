//! Signing inputs and ES256 signatures.
//!
//! Every signature on the wire covers `signing_input(purpose, fields)`, so a
//! proof made for one purpose can never verify as another: the purpose is the
//! first thing signed and every field is length-prefixed.
//!
//! Layout: `"bc-sig-v1" 0x00 purpose 0x00` then, per field, a big-endian u32
//! length and the bytes.

use p256::ecdsa::signature::{Signer, Verifier};
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{DecodePublicKey, EncodePublicKey};

const DOMAIN: &[u8] = b"bc-sig-v1";

/// What a signature is for. Adding a purpose is a wire change: pin it with a
/// vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// The JoinService signing key over a `JoinResponseBody`.
    JoinResponse,
    /// A node's proof of its last certificate's key when it re-joins.
    X509Pop,
    /// A site node vouching for a machine it just served over PXE.
    DiscoveryAssertion,
    /// A node's proof of possession at renewal.
    Renew,
    /// A site node asking for a secret bound to a workflow of its site.
    SecretRequest,
    /// The control plane's signing key over a serialized `Command`: what
    /// lets a node run it whoever relayed it.
    Command,
    /// A node key over a serialized `CommandResult`: what the node did.
    CommandResult,
    /// A node key binding a command channel to itself at upgrade, over the
    /// server's nonce, the node id and the client's time.
    CommandChannel,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::JoinResponse => "join-response",
            Purpose::X509Pop => "x509pop",
            Purpose::DiscoveryAssertion => "discovery-assertion",
            Purpose::Renew => "renew",
            Purpose::SecretRequest => "secret-request",
            Purpose::Command => "command",
            Purpose::CommandResult => "command-result",
            Purpose::CommandChannel => "command-channel",
        }
    }
}

/// The bytes that a signature of `purpose` over `fields` covers.
pub fn signing_input(purpose: Purpose, fields: &[&[u8]]) -> Vec<u8> {
    let p = purpose.as_str().as_bytes();
    let len = DOMAIN.len() + p.len() + 2 + fields.iter().map(|f| 4 + f.len()).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(DOMAIN);
    out.push(0);
    out.extend_from_slice(p);
    out.push(0);
    for f in fields {
        // Fields on the wire are far below 4 GiB; a longer one is a bug, not input.
        let n = u32::try_from(f.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&n.to_be_bytes());
        out.extend_from_slice(f);
    }
    out
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignatureError {
    #[error("the public key is not a P-256 SubjectPublicKeyInfo")]
    BadKey,
    #[error("the signature is not 64 bytes of P1363 r||s")]
    Malformed,
    #[error("the signature does not verify")]
    Invalid,
}

/// ES256 over the signing input, as P1363 `r||s`.
pub fn sign(key: &SigningKey, purpose: Purpose, fields: &[&[u8]]) -> [u8; 64] {
    let sig: Signature = key.sign(&signing_input(purpose, fields));
    sig.to_bytes().into()
}

/// Verifies an ES256 P1363 signature over the signing input. High-S
/// signatures are accepted, as every ES256 signer may produce them (a TPM's
/// ECDSA does, half the time); where a signature must be single-use, the
/// caller refuses them ([`is_high_s`]) or keys the use on what it signs.
pub fn verify(
    key: &VerifyingKey,
    purpose: Purpose,
    fields: &[&[u8]],
    signature: &[u8],
) -> Result<(), SignatureError> {
    let sig = Signature::from_slice(signature).map_err(|_| SignatureError::Malformed)?;
    key.verify(&signing_input(purpose, fields), &sig)
        .map_err(|_| SignatureError::Invalid)
}

/// Whether a P1363 signature's `s` is in the upper half of the group order.
/// ECDSA signatures are malleable: `(r, s)` and `(r, n - s)` both verify,
/// so a verifier that wants one encoding per signature takes the low one.
/// Bytes that are not a P-256 signature at all are not high-S (they never
/// verify).
pub(crate) fn is_high_s(signature: &[u8]) -> bool {
    Signature::from_slice(signature).is_ok_and(|s| s.normalize_s() != s)
}

/// The low-S form of a P1363 signature (the same signature when it already
/// is, or when the bytes are not a P-256 signature).
pub(crate) fn low_s(signature: [u8; 64]) -> [u8; 64] {
    match Signature::from_slice(&signature) {
        Ok(s) => s.normalize_s().to_bytes().into(),
        Err(_) => signature,
    }
}

/// Parses a P-256 SubjectPublicKeyInfo (DER).
pub fn verifying_key_from_spki(spki_der: &[u8]) -> Result<VerifyingKey, SignatureError> {
    VerifyingKey::from_public_key_der(spki_der).map_err(|_| SignatureError::BadKey)
}

/// The key id of the wire: hex SHA-256 of the key's SubjectPublicKeyInfo DER.
pub fn key_id(spki_der: &[u8]) -> String {
    hex_lower(&crate::sha256(spki_der))
}

/// The key id of a P-256 verifying key.
pub fn key_id_of(key: &VerifyingKey) -> String {
    match key.to_public_key_der() {
        Ok(der) => key_id(der.as_bytes()),
        // Encoding a valid P-256 point cannot fail; an empty id never matches.
        Err(_) => String::new(),
    }
}

pub(crate) fn hex_lower(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}
