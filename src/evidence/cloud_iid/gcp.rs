//! GCP: the instance identity token from the metadata server, for the
//! control plane as audience, in full format (it then names the project,
//! zone and instance the control plane resolves).

use super::{get, CloudIidError, Provider};

/// The metadata server's link-local address (metadata.google.internal).
pub(crate) const METADATA_URL: &str = "http://169.254.169.254";
/// The identity endpoint of the default service account.
pub(crate) const IDENTITY_PATH: &str =
    "/computeMetadata/v1/instance/service-accounts/default/identity";

/// The token for `audience`, from the metadata server at `base`.
pub(crate) fn fetch(base: &str, audience: &str) -> Result<String, CloudIidError> {
    let url = identity_url(base, audience);
    let answer = get(Provider::Gcp, &url, &[("Metadata-Flavor", "Google")])?;
    let token = answer.trim().to_owned();
    // A JWT: three base64url parts; anything else is not what was asked.
    let jwt_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if token.split('.').count() != 3 || !token.chars().all(jwt_chars) {
        return Err(CloudIidError::Fetch {
            provider: Provider::Gcp.name(),
            url,
            reason: "the answer is not an identity token (a JWT)".to_owned(),
        });
    }
    Ok(token)
}

fn identity_url(base: &str, audience: &str) -> String {
    format!(
        "{}{IDENTITY_PATH}?audience={}&format=full",
        base.trim_end_matches('/'),
        percent_encode(audience)
    )
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audience_is_encoded_in_the_url() {
        assert_eq!(
            identity_url("http://169.254.169.254/", "https://cp:8443/"),
            "http://169.254.169.254/computeMetadata/v1/instance/service-accounts/default/identity?audience=https%3A%2F%2Fcp%3A8443%2F&format=full"
        );
    }
}
