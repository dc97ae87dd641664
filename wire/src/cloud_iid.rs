//! `cloud-iid` evidence: the identity document a cloud signs for one VM.
//!
//! ```json
//! {"provider":"gcp","document":"<identity token JWT>"}
//! ```
//! The document is the provider's own, passed through untouched: for `gcp`
//! the instance identity token (an RS256 JWT, `format=full`, audience the
//! control plane's api URL). The control plane verifies it with the keys it
//! is configured to trust for that provider. `aws`: the instance identity
//! document (JSON text, byte for byte as IMDSv2 served it) and, in
//! `signature`, the base64 RSA-SHA256 signature IMDS serves beside it
//! (`/latest/dynamic/instance-identity/signature`); or, without
//! `signature`, the base64 PKCS#7 form (`/latest/dynamic/instance-identity/
//! rsa2048`, a CMS SignedData carrying the document). `azure`: the base64
//! CMS SignedData of the attested document (`/metadata/attested/document`),
//! requested with the nonce [`azure_nonce`] of the control plane's api URL.

/// Google Compute Engine.
pub const GCP: &str = "gcp";
/// Amazon EC2.
pub const AWS: &str = "aws";
/// Microsoft Azure.
pub const AZURE: &str = "azure";

/// The nonce an Azure VM asks its attested document for: 10 decimal digits
/// (what IMDS accepts) from SHA-256 of the control plane's api URL, trailing
/// `/` removed. Azure signs it back, so the control plane can check the
/// document was asked for it (as a GCP token names its audience): a
/// document another service on the VM asked for is refused. A random or
/// time nonce would add nothing the server could check in one round.
pub fn azure_nonce(audience: &str) -> String {
    let h = crate::sha256(audience.trim_end_matches('/').as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&h[..8]);
    format!("{:010}", u64::from_be_bytes(first) % 10_000_000_000)
}

/// The largest evidence accepted (a GCP identity token is about 1 KiB).
pub const MAX_EVIDENCE_LEN: usize = 16 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CloudIidError {
    #[error("the cloud-iid evidence is larger than {MAX_EVIDENCE_LEN} bytes")]
    TooLarge,
    #[error("the cloud-iid evidence is not the expected JSON: {0}")]
    Json(String),
}

/// The evidence as it travels (JSON, UTF-8).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Evidence {
    pub provider: String,
    pub document: String,
    /// `aws`: the document's signature (base64); no other provider has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

impl Evidence {
    pub fn to_json(&self) -> Vec<u8> {
        // A struct of two strings always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, CloudIidError> {
        if bytes.len() > MAX_EVIDENCE_LEN {
            return Err(CloudIidError::TooLarge);
        }
        serde_json::from_slice(bytes).map_err(|e| CloudIidError::Json(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_extra_fields_and_size() {
        let e = Evidence {
            provider: GCP.into(),
            document: "a.b.c".into(),
            signature: None,
        };
        assert!(!String::from_utf8(e.to_json())
            .unwrap()
            .contains("signature"));
        assert_eq!(Evidence::from_json(&e.to_json()).unwrap(), e);
        assert!(matches!(
            Evidence::from_json(br#"{"provider":"gcp","document":"x","token":"y"}"#),
            Err(CloudIidError::Json(_))
        ));
        let big = vec![b' '; MAX_EVIDENCE_LEN + 1];
        assert_eq!(Evidence::from_json(&big), Err(CloudIidError::TooLarge));
    }

    #[test]
    fn the_azure_nonce_is_ten_digits_of_the_audience() {
        let n = azure_nonce("https://cp:8443");
        assert_eq!(n.len(), 10);
        assert!(n.bytes().all(|b| b.is_ascii_digit()), "{n}");
        assert_eq!(n, azure_nonce("https://cp:8443/"));
        assert_ne!(n, azure_nonce("https://other:8443"));
    }

    #[test]
    fn too_large_is_refused() {
        let big = vec![b' '; MAX_EVIDENCE_LEN + 1];
        assert_eq!(Evidence::from_json(&big), Err(CloudIidError::TooLarge));
    }
}
