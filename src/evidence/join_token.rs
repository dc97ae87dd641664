//! `join-token` evidence: the token, sealed to the pinned JoinService key
//! and bound to this request's CSR, so that a captured request opens for no
//! other CSR and the token never travels in the clear.
use std::fmt;

use bc_wire::sealing::{SealError, SealingKey};
use bc_wire::token::JoinToken;
use p256::elliptic_curve::zeroize::Zeroizing;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// Never quotes the text: it is (nearly) a secret.
    #[error("{origin} does not hold a join token (expected tok_<id>.<secret>)")]
    Format { origin: String },
    #[error("cannot seal the join token: {0}")]
    Seal(#[from] SealError),
}

/// The token text as the operator handed it over; redacted in `Debug`.
pub(crate) struct TokenText {
    text: Zeroizing<String>,
    /// Where it came from (a file name, an environment variable), for messages.
    origin: String,
}

impl TokenText {
    pub(crate) fn new(text: Zeroizing<String>, origin: impl Into<String>) -> Self {
        TokenText {
            text,
            origin: origin.into(),
        }
    }

    /// Checks the token's form; the secret is checked by the control plane only.
    pub(crate) fn parse(&self) -> Result<JoinToken, TokenError> {
        JoinToken::parse(self.text.trim()).map_err(|_| TokenError::Format {
            origin: self.origin.clone(),
        })
    }
}

impl fmt::Debug for TokenText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenText")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// `JoinRequest.sealed_token` for the request whose CSR has digest `csr_sha256`.
pub fn seal(
    key: &SealingKey,
    csr_sha256: &[u8; 32],
    token: &JoinToken,
) -> Result<Vec<u8>, TokenError> {
    let text = Zeroizing::new(token.expose());
    Ok(key.seal(csr_sha256, text.as_bytes())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_wire::sealing::{generate_keypair, OpeningKey};

    const TOKEN: &str = "tok_abc.AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";

    #[test]
    fn sealed_token_opens_only_for_its_csr() {
        let (sk, pk) = generate_keypair().unwrap();
        let text = TokenText::new(Zeroizing::new(format!("  {TOKEN}\n")), "test");
        let token = text.parse().unwrap();
        let digest = bc_wire::sha256(b"csr");
        let sealed = seal(&SealingKey::from_spki_der(&pk).unwrap(), &digest, &token).unwrap();
        let opener = OpeningKey::from_pkcs8_der(&sk).unwrap();
        assert_eq!(opener.open(&digest, &sealed).unwrap(), TOKEN.as_bytes());
        assert!(opener.open(&bc_wire::sha256(b"other"), &sealed).is_err());
    }

    #[test]
    fn malformed_tokens_are_refused_without_quoting_them() {
        let text = TokenText::new(Zeroizing::new("tok_abc.sekrit".into()), "/root/token");
        let e = text.parse().unwrap_err().to_string();
        assert_eq!(
            e,
            "/root/token does not hold a join token (expected tok_<id>.<secret>)"
        );
        assert!(!format!("{text:?}").contains("sekrit"));
    }
}
