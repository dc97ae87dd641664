//! Azure: the attested document from the instance metadata service, a CMS
//! SignedData (PKCS#7) that Azure signs over the VM's ids and the nonce
//! asked for ([`bc_wire::cloud_iid::azure_nonce`] of the control plane's
//! api URL, which the control plane checks).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde::Deserialize;

use super::{get, CloudIidError, Provider};

/// The instance metadata service's link-local address.
pub(crate) const METADATA_URL: &str = "http://169.254.169.254";
pub(crate) const ATTESTED_PATH: &str = "/metadata/attested/document";
const API_VERSION: &str = "2020-09-01";

#[derive(Deserialize)]
struct Answer {
    encoding: String,
    signature: String,
}

/// The base64 SignedData for `audience`, from the IMDS at `base`.
pub(crate) fn fetch(base: &str, audience: &str) -> Result<String, CloudIidError> {
    let url = format!(
        "{}{ATTESTED_PATH}?api-version={API_VERSION}&nonce={}",
        base.trim_end_matches('/'),
        bc_wire::cloud_iid::azure_nonce(audience)
    );
    let body = get(Provider::Azure, &url, &[("Metadata", "true")])?;
    let wrong = |reason: &str| CloudIidError::Fetch {
        provider: Provider::Azure.name(),
        url: url.clone(),
        reason: reason.to_owned(),
    };
    let answer: Answer = serde_json::from_str(&body)
        .map_err(|_| wrong("the answer is not {\"encoding\",\"signature\"} JSON"))?;
    if answer.encoding != "pkcs7" {
        return Err(wrong("the answer's encoding is not pkcs7"));
    }
    // IMDS may wrap the base64; the control plane gets it whole.
    let signature: String = answer
        .signature
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    if B64.decode(&signature).is_err() {
        return Err(wrong("the answer's signature is not base64"));
    }
    Ok(signature)
}
