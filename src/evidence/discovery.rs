//! `discovery` evidence: what the site's boot server put on the ramdisk's
//! kernel command line, `bc.token=<discovery token>` and
//! `bc.assertion=<base64url SignedDiscoveryAssertion>`, read back and
//! checked for form before anything is sent. The token is sealed like a
//! join token ([`super::join_token::seal`]); the serialized assertion is the
//! attestation.

use bc_wire::site::{self, AssertionError};
use bc_wire::token::JoinToken;

/// The longest command line read (the kernel's own limit is a few KiB).
pub(crate) const MAX_CMDLINE: usize = 64 * 1024;

const TOKEN_KEY: &str = "bc.token";
const ASSERTION_KEY: &str = "bc.assertion";

/// A command line that cannot be joined with. Never quotes the token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CmdlineError {
    #[error("the kernel command line is longer than {MAX_CMDLINE} bytes")]
    TooLong,
    #[error("the kernel command line has no {0}= (was this machine booted by bcd site?)")]
    Missing(&'static str),
    #[error("the kernel command line has {0}= more than once")]
    Repeated(&'static str),
    #[error("bc.token= is not a discovery token (expected tok_<id>.<secret>)")]
    Token,
    #[error("bc.assertion= is unusable: {0}")]
    Assertion(#[from] AssertionError),
}

/// What the ramdisk joins with.
pub struct Discovery {
    pub token: JoinToken,
    /// The serialized SignedDiscoveryAssertion (the attestation).
    pub assertion: Vec<u8>,
}

impl Discovery {
    /// How long the assertion admits a join from when it was issued: the
    /// earlier of its not_after and the spec's 15 minutes, never negative.
    /// A join waiting for an operator gives up after this, because the
    /// control plane refuses the assertion then anyway (`assertion-stale`);
    /// measured on this machine's monotonic clock, so a ramdisk whose
    /// wall clock is wrong still waits about that long.
    pub(crate) fn lifetime(&self) -> std::time::Duration {
        let ms = site::parse_signed(&self.assertion)
            .map(|(_, a)| {
                a.valid_until_with(site::ASSERTION_MAX_AGE_MS)
                    .saturating_sub(a.issued_at_unix_ms)
            })
            .unwrap_or(0)
            .clamp(0, site::ASSERTION_MAX_AGE_MS);
        std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    }
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery")
            .field("token_id", &self.token.id)
            .finish_non_exhaustive()
    }
}

/// Reads `bc.token` and `bc.assertion` from a kernel command line
/// (whitespace-separated `key=value` words; other words are ignored).
pub fn parse_cmdline(text: &str) -> Result<Discovery, CmdlineError> {
    if text.len() > MAX_CMDLINE {
        return Err(CmdlineError::TooLong);
    }
    let value = |key: &'static str| -> Result<&str, CmdlineError> {
        let mut found = text
            .split_ascii_whitespace()
            .filter_map(|w| w.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v));
        let first = found.next().ok_or(CmdlineError::Missing(key))?;
        if found.next().is_some() {
            return Err(CmdlineError::Repeated(key));
        }
        Ok(first)
    };
    let token = JoinToken::parse(value(TOKEN_KEY)?).map_err(|_| CmdlineError::Token)?;
    let assertion = site::from_cmdline(value(ASSERTION_KEY)?)?;
    Ok(Discovery { token, assertion })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_wire::site_v1::{DiscoveryAssertion, SignedDiscoveryAssertion};

    const TOKEN: &str = "tok_abc.AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";

    fn assertion() -> String {
        let signed = site::sign_assertion(
            &DiscoveryAssertion {
                site_id: "site_a".into(),
                mac: "52:54:00:12:34:56".into(),
                ..Default::default()
            },
            "kid".into(),
            |_| Ok::<_, ()>([7u8; 64]),
        )
        .unwrap();
        site::to_cmdline(&signed)
    }

    #[test]
    fn reads_both_values_among_other_words() {
        let a = assertion();
        let text = format!(
            "BOOT_IMAGE=vmlinuz console=ttyS0 bc.token={TOKEN} quiet bc.assertion={a} ip=dhcp\n"
        );
        let d = parse_cmdline(&text).unwrap();
        assert_eq!(d.token.id, "tok_abc");
        let (signed, body) = site::parse_signed(&d.assertion).unwrap();
        assert_eq!(body.mac, "52:54:00:12:34:56");
        assert_eq!(signed.signature, vec![7u8; 64]);
        assert!(!format!("{d:?}").contains("AAEC"), "Debug shows no secret");
    }

    #[test]
    fn malformed_values_are_refused_by_name() {
        let a = assertion();
        let cases: Vec<(String, CmdlineError)> = vec![
            (
                format!("bc.assertion={a}"),
                CmdlineError::Missing("bc.token"),
            ),
            (
                format!("bc.token={TOKEN}"),
                CmdlineError::Missing("bc.assertion"),
            ),
            (
                format!("bc.token={TOKEN} bc.token={TOKEN} bc.assertion={a}"),
                CmdlineError::Repeated("bc.token"),
            ),
            (
                format!("bc.token=tok_abc bc.assertion={a}"),
                CmdlineError::Token,
            ),
            (format!("bc.token= bc.assertion={a}"), CmdlineError::Token),
            (
                format!("bc.token={TOKEN} bc.assertion=not*base64"),
                CmdlineError::Assertion(AssertionError::Base64),
            ),
            (
                format!("bc.token={TOKEN} bc.assertion=AAAA"),
                CmdlineError::Assertion(AssertionError::Envelope),
            ),
            (
                format!("bc.token={TOKEN} bc.assertion={}", "A".repeat(5000)),
                CmdlineError::Assertion(AssertionError::TooLong),
            ),
            ("x".repeat(MAX_CMDLINE + 1), CmdlineError::TooLong),
        ];
        for (text, want) in cases {
            assert_eq!(parse_cmdline(&text).unwrap_err(), want, "{:.80}", text);
        }
        // A signature of the wrong length is refused before anything is sent.
        let short = SignedDiscoveryAssertion {
            assertion: Vec::new(),
            signature: vec![1; 63],
            key_id: String::new(),
        };
        let text = format!("bc.token={TOKEN} bc.assertion={}", site::to_cmdline(&short));
        assert_eq!(
            parse_cmdline(&text).unwrap_err(),
            CmdlineError::Assertion(AssertionError::SignatureLength)
        );
        // The token never appears in a message.
        let e = parse_cmdline(&format!("bc.token={TOKEN}x.y bc.assertion={a}")).unwrap_err();
        assert!(!e.to_string().contains("AAEC"));
    }
}
