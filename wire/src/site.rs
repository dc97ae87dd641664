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
pub(crate) const MAX_ASSERTION_TEXT: usize = 4096;

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
    #[error("the assertion's signature is high-S (only the low-S form of an ECDSA signature is accepted)")]
    HighS,
    #[error("the assertion's envelope is not in its canonical encoding (an unknown field, or fields repeated or out of order)")]
    EnvelopeNotCanonical,
    #[error("the signed assertion is not in its canonical encoding (an unknown field, or fields repeated or out of order)")]
    BodyNotCanonical,
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
/// is given, as P1363 `r‖s`), naming the signer's key by `key_id`. The
/// signature is put in its low-S form whatever the signer gave (a TPM's
/// ECDSA is high-S half the time), as [`parse_signed`] accepts no other.
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
        signature: signing::low_s(signature).to_vec(),
        key_id,
    })
}

/// Parses a serialized SignedDiscoveryAssertion (the `discovery`
/// attestation) and the assertion inside it; checks shapes, not trust.
///
/// One signed assertion has exactly one encoding here, so that it cannot
/// pass for another: the envelope and the assertion must each be what
/// encoding the parsed message gives back (prost drops unknown fields and
/// takes the last of repeated ones silently, so a re-wrapped envelope would
/// otherwise parse to the same message), and the signature must be low-S.
/// The envelope's `key_id` is not signed; it is only a hint, and a change
/// of it is still another encoding of the same assertion, which is why the
/// control plane keys an assertion's single use on [`use_subject`].
pub fn parse_signed(
    bytes: &[u8],
) -> Result<(SignedDiscoveryAssertion, DiscoveryAssertion), AssertionError> {
    let signed = SignedDiscoveryAssertion::decode(bytes).map_err(|_| AssertionError::Envelope)?;
    if signed.encoded_len() != bytes.len() || signed.encode_to_vec() != bytes {
        return Err(AssertionError::EnvelopeNotCanonical);
    }
    if signed.signature.len() != 64 {
        return Err(AssertionError::SignatureLength);
    }
    if signing::is_high_s(&signed.signature) {
        return Err(AssertionError::HighS);
    }
    let body = DiscoveryAssertion::decode(signed.assertion.as_slice())
        .map_err(|_| AssertionError::Body)?;
    if body.encoded_len() != signed.assertion.len() || body.encode_to_vec() != signed.assertion {
        return Err(AssertionError::BodyNotCanonical);
    }
    Ok((signed, body))
}

/// The key of a signed assertion's single use: hex SHA-256 of the
/// assertion bytes its signature covers. Nothing outside the signature
/// (the envelope's `key_id`, its encoding, which of the two ECDSA twins
/// was sent) changes it.
pub fn use_subject(signed: &SignedDiscoveryAssertion) -> String {
    signing::hex_lower(&crate::sha256(&signed.assertion))
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

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::SigningKey;

    fn key() -> SigningKey {
        SigningKey::from_slice(&[0x42; 32]).unwrap()
    }

    fn assertion() -> DiscoveryAssertion {
        DiscoveryAssertion {
            site_id: "site_a".into(),
            node_id: "node_s".into(),
            lease_epoch: 3,
            mac: "52:54:00:12:34:56".into(),
            issued_at_unix_ms: 1_000,
            not_after_unix_ms: 2_000,
            ..Default::default()
        }
    }

    /// The high-S twin of a P1363 signature: `(r, n - s)`.
    pub(crate) fn twin(sig: &[u8]) -> Vec<u8> {
        let s = p256::ecdsa::Signature::from_slice(sig).unwrap();
        let twin = p256::ecdsa::Signature::from_scalars(s.r(), -s.s()).unwrap();
        twin.to_bytes().to_vec()
    }

    fn signed_with(sign: impl FnOnce(&[u8]) -> [u8; 64]) -> SignedDiscoveryAssertion {
        sign_assertion(&assertion(), "kid".into(), |m| Ok::<_, ()>(sign(m))).unwrap()
    }

    /// A signer that answers the high-S twin of its signature (what a TPM
    /// does half the time) still yields a low-S assertion that verifies.
    #[test]
    fn signing_puts_the_signature_in_its_low_s_form() {
        let k = key();
        let spki = p256::pkcs8::EncodePublicKey::to_public_key_der(k.verifying_key()).unwrap();
        let high = |m: &[u8]| {
            let sig: p256::ecdsa::Signature = p256::ecdsa::signature::Signer::sign(&k, m);
            let mut t = twin(&sig.to_bytes());
            if !signing::is_high_s(&t) {
                t = sig.to_bytes().to_vec();
            }
            assert!(signing::is_high_s(&t));
            <[u8; 64]>::try_from(t.as_slice()).unwrap()
        };
        let signed = signed_with(high);
        assert!(!signing::is_high_s(&signed.signature));
        assert_eq!(verify_assertion(spki.as_bytes(), &signed), Ok(()));
        assert!(parse_signed(&signed.encode_to_vec()).is_ok());
    }

    /// The high-S twin of a valid signature verifies, but is refused by
    /// shape; the same assertion re-wrapped (another key_id) parses but
    /// keys the same single use; an unknown field appended to the envelope
    /// or the assertion, or a field repeated, is refused.
    #[test]
    fn one_signed_assertion_has_one_accepted_encoding() {
        let k = key();
        let signed = signed_with(|m| {
            signing::low_s({
                let sig: p256::ecdsa::Signature = p256::ecdsa::signature::Signer::sign(&k, m);
                sig.to_bytes().into()
            })
        });
        let bytes = signed.encode_to_vec();
        let (parsed, body) = parse_signed(&bytes).unwrap();
        assert_eq!(body, assertion());

        let high = SignedDiscoveryAssertion {
            signature: twin(&signed.signature),
            ..signed.clone()
        };
        let spki = p256::pkcs8::EncodePublicKey::to_public_key_der(k.verifying_key()).unwrap();
        assert_eq!(
            verify_assertion(spki.as_bytes(), &high),
            Ok(()),
            "ECDSA's twin verifies"
        );
        assert_eq!(
            parse_signed(&high.encode_to_vec()),
            Err(AssertionError::HighS)
        );

        let rewrapped = SignedDiscoveryAssertion {
            key_id: "another".into(),
            ..signed.clone()
        };
        let (r, _) = parse_signed(&rewrapped.encode_to_vec()).unwrap();
        assert_eq!(use_subject(&r), use_subject(&parsed));

        // Field 15, varint 1: unknown to both messages.
        let mut extra = bytes.clone();
        extra.extend_from_slice(&[0x78, 0x01]);
        assert_eq!(
            SignedDiscoveryAssertion::decode(extra.as_slice()).unwrap(),
            signed,
            "prost drops it silently"
        );
        assert_eq!(
            parse_signed(&extra),
            Err(AssertionError::EnvelopeNotCanonical)
        );
        // key_id sent twice: prost keeps the last.
        let mut twice = bytes.clone();
        twice.extend_from_slice(&[0x1a, 0x01, b'x']);
        assert_eq!(
            parse_signed(&twice),
            Err(AssertionError::EnvelopeNotCanonical)
        );
        let mut inner = signed.assertion.clone();
        inner.extend_from_slice(&[0x78, 0x01]);
        let body_extra = SignedDiscoveryAssertion {
            assertion: inner,
            ..signed.clone()
        };
        assert_eq!(
            parse_signed(&body_extra.encode_to_vec()),
            Err(AssertionError::BodyNotCanonical)
        );
    }
}
