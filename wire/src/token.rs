//! The join token as an operator handles it: `<id>.<secret>`.
//!
//! The id names the row (`tok_` and lowercase alphanumerics) and may appear in
//! logs and events; the secret (43 characters of base64url, 32 bytes) never
//! does. The token only ever travels sealed (see [`crate::sealing`]).

use base64::Engine;
use std::fmt;

pub const SECRET_LEN: usize = 32;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a join token (expected tok_<id>.<secret>)")]
pub struct TokenFormatError;

#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub id: String,
    pub secret: [u8; SECRET_LEN],
}

impl JoinToken {
    pub fn parse(s: &str) -> Result<Self, TokenFormatError> {
        let (id, secret) = s.trim().split_once('.').ok_or(TokenFormatError)?;
        let valid_id = id.strip_prefix("tok_").is_some_and(|r| {
            !r.is_empty()
                && r.len() <= 64
                && r.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        });
        if !valid_id {
            return Err(TokenFormatError);
        }
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(secret)
            .map_err(|_| TokenFormatError)?;
        let secret =
            <[u8; SECRET_LEN]>::try_from(bytes.as_slice()).map_err(|_| TokenFormatError)?;
        Ok(JoinToken {
            id: id.to_owned(),
            secret,
        })
    }

    /// The full token text, secret included: only for printing to the
    /// operator once and for sealing.
    pub fn expose(&self) -> String {
        format!(
            "{}.{}",
            self.id,
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.secret)
        )
    }
}

/// Never prints the secret.
impl fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinToken")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}
