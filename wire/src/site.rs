//! `bettercompute.site.v1` helpers: the discovery assertion a site node
//! signs for every iPXE script it renders, its kernel command line form, the
//! boot lease's name, and the signed SecretRequest.
//!
//! Signing goes through a closure over the signing input, because the site
//! node's key may be in a TPM or behind the helper: bcd passes its
//! `NodeKey::sign`, tests a software key. The control plane verifies with
//! [`verify_assertion`] and [`verify_secret_request`]; both sides use the
//! same field lists, so they cannot disagree.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use prost::Message;

use crate::signing::{self, Purpose, SignatureError};
use crate::site_v1::{
    DiscoveryAssertion, SecretRequest, SecretRequestBody, SignedDiscoveryAssertion,
};

/// An assertion is valid at most this long after its `issued_at` (the
/// spec's `maxAgeMs`), whatever its `not_after` says.
pub const ASSERTION_MAX_AGE_MS: i64 = 15 * 60_000;

/// The longest `bc.assertion` value accepted (base64url characters). A
/// real one is a few hundred; the bound keeps unauthenticated input small.
pub const MAX_ASSERTION_TEXT: usize = 4096;

/// The name of a site's boot lease.
pub fn boot_lease_name(site_id: &str) -> String {
    format!("site:{site_id}:boot")
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AssertionError {
    #[error("the assertion is longer than {MAX_ASSERTION_TEXT} characters")]
    TooLong,
    #[error("the assertion is not unpadded base64url")]
    Base64,
    #[error("the assertion is not a serialized SignedDiscoveryAssertion")]
    Envelope,
    #[error("the signed assertion is not a serialized DiscoveryAssertion")]
    Body,
    #[error("the assertion's signature is not 64 bytes")]
    SignatureLength,
}

impl DiscoveryAssertion {
    /// The end of the assertion's validity: the earlier of its `not_after`
    /// and `issued_at` + [`ASSERTION_MAX_AGE_MS`].
    pub fn valid_until_ms(&self) -> i64 {
        self.valid_until_with(ASSERTION_MAX_AGE_MS)
    }

    /// [`Self::valid_until_ms`] with a maximum age of `max_age_ms` (the
    /// control plane's `[discovery] max_age`).
    pub fn valid_until_with(&self, max_age_ms: i64) -> i64 {
        self.not_after_unix_ms
            .min(self.issued_at_unix_ms.saturating_add(max_age_ms))
    }
}

/// Serializes and signs an assertion with `sign` (ES256 over the bytes it
/// is given, as P1363 `r‖s`), naming the signer's key by `key_id`.
pub fn sign_assertion<E>(
    assertion: &DiscoveryAssertion,
    key_id: String,
    sign: impl FnOnce(&[u8]) -> Result<[u8; 64], E>,
) -> Result<SignedDiscoveryAssertion, E> {
    let bytes = assertion.encode_to_vec();
    let signature = sign(&signing::signing_input(
        Purpose::DiscoveryAssertion,
        &[&bytes],
    ))?;
    Ok(SignedDiscoveryAssertion {
        assertion: bytes,
        signature: signature.to_vec(),
        key_id,
    })
}

/// Parses a serialized SignedDiscoveryAssertion (the `discovery`
/// attestation) and the assertion inside it; checks shapes, not trust.
pub fn parse_signed(
    bytes: &[u8],
) -> Result<(SignedDiscoveryAssertion, DiscoveryAssertion), AssertionError> {
    let signed = SignedDiscoveryAssertion::decode(bytes).map_err(|_| AssertionError::Envelope)?;
    if signed.signature.len() != 64 {
        return Err(AssertionError::SignatureLength);
    }
    let body = DiscoveryAssertion::decode(signed.assertion.as_slice())
        .map_err(|_| AssertionError::Body)?;
    Ok((signed, body))
}

/// The kernel command line form (`bc.assertion=`): unpadded base64url of
/// the serialized SignedDiscoveryAssertion.
pub fn to_cmdline(signed: &SignedDiscoveryAssertion) -> String {
    B64.encode(signed.encode_to_vec())
}

/// Reads a `bc.assertion` value back into the serialized envelope, checking
/// that it parses.
pub fn from_cmdline(text: &str) -> Result<Vec<u8>, AssertionError> {
    if text.len() > MAX_ASSERTION_TEXT {
        return Err(AssertionError::TooLong);
    }
    let bytes = B64.decode(text).map_err(|_| AssertionError::Base64)?;
    parse_signed(&bytes)?;
    Ok(bytes)
}

/// Verifies the assertion's signature (purpose `discovery-assertion`)
/// against a P-256 SubjectPublicKeyInfo.
pub fn verify_assertion(
    spki_der: &[u8],
    signed: &SignedDiscoveryAssertion,
) -> Result<(), SignatureError> {
    let key = signing::verifying_key_from_spki(spki_der)?;
    signing::verify(
        &key,
        Purpose::DiscoveryAssertion,
        &[&signed.assertion],
        &signed.signature,
    )
}

/// Builds a SecretRequest signed (purpose `secret-request`) with `sign`.
pub fn sign_secret_request<E>(
    body: &SecretRequestBody,
    sign: impl FnOnce(&[u8]) -> Result<[u8; 64], E>,
) -> Result<SecretRequest, E> {
    let bytes = body.encode_to_vec();
    let signature = sign(&signing::signing_input(Purpose::SecretRequest, &[&bytes]))?;
    Ok(SecretRequest {
        body: bytes,
        signature: signature.to_vec(),
    })
}

/// Verifies a SecretRequest's signature against the caller's key and
/// returns its body.
pub fn verify_secret_request(
    spki_der: &[u8],
    req: &SecretRequest,
) -> Result<Option<SecretRequestBody>, SignatureError> {
    let key = signing::verifying_key_from_spki(spki_der)?;
    signing::verify(&key, Purpose::SecretRequest, &[&req.body], &req.signature)?;
    Ok(SecretRequestBody::decode(req.body.as_slice()).ok())
}
