//! AWS: the instance identity document and its RSA-SHA256 signature, over
//! IMDSv2 (a session token first; IMDSv1 may be disabled on the instance).

use super::{get, request, CloudIidError, Provider};

/// The instance metadata service's link-local address.
pub(crate) const METADATA_URL: &str = "http://169.254.169.254";
const TOKEN_PATH: &str = "/latest/api/token";
const DOCUMENT_PATH: &str = "/latest/dynamic/instance-identity/document";
const SIGNATURE_PATH: &str = "/latest/dynamic/instance-identity/signature";
/// The session token's life: it is used at once.
const TOKEN_TTL_SECONDS: &str = "60";

/// (document, signature) from the IMDS at `base`.
pub(crate) fn fetch(base: &str) -> Result<(String, String), CloudIidError> {
    let base = base.trim_end_matches('/');
    let token = request(
        Provider::Aws,
        reqwest::Method::PUT,
        &format!("{base}{TOKEN_PATH}"),
        &[("X-aws-ec2-metadata-token-ttl-seconds", TOKEN_TTL_SECONDS)],
    )?;
    let auth = [("X-aws-ec2-metadata-token", token.trim())];
    let document = get(Provider::Aws, &format!("{base}{DOCUMENT_PATH}"), &auth)?;
    let signature = get(Provider::Aws, &format!("{base}{SIGNATURE_PATH}"), &auth)?
        .trim()
        .to_owned();
    Ok((document, signature))
}
