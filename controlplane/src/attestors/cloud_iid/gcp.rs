//! GCP: the instance identity token, an RS256 JWT signed by Google
//! (`format=full`, so it names the project, zone and instance).
//!
//! Checked in this order: the JWT's shape and `alg` (`cloud-malformed`),
//! its signature by a configured key with that `kid` (`cloud-signature`),
//! then, over signed claims only, the issuer (`cloud-issuer`), the audience
//! (`cloud-audience`), freshness (`cloud-stale`, `cloud-future`) and the
//! `google.compute_engine` claims (`cloud-malformed`).

use std::path::Path;

use serde::Deserialize;

use super::jwt::{Audience, Jwks, Token};
use super::{CloudIdentity, CloudReason, Freshness};

/// The issuers Google's identity tokens name.
const ISSUERS: &[&str] = &["https://accounts.google.com", "accounts.google.com"];

/// Google's signing keys, from the JWKS of `[cloud_iid.gcp] jwks`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcpKeys(Jwks);

/// Reads a JWKS file (`{"keys":[{"kty":"RSA","kid","n","e"},…]}`): Google
/// signs with RSA keys, so at least one is needed.
pub(crate) fn load_jwks(file: &Path) -> Result<GcpKeys, String> {
    rsa_keys(Jwks::load(file)?).map_err(|e| format!("{}: {e}", file.display()))
}

pub fn parse_jwks(bytes: &[u8]) -> Result<GcpKeys, String> {
    rsa_keys(Jwks::parse(bytes)?)
}

fn rsa_keys(keys: Jwks) -> Result<GcpKeys, String> {
    if !keys.has_alg("RS256") {
        return Err("no RSA (RS256) key: Google signs identity tokens with RSA".to_owned());
    }
    Ok(GcpKeys(keys))
}

#[derive(Deserialize)]
struct Claims {
    iss: String,
    aud: Audience,
    iat: i64,
    exp: i64,
    google: Option<Google>,
}

#[derive(Deserialize)]
struct Google {
    compute_engine: Option<ComputeEngine>,
}

#[derive(Deserialize)]
struct ComputeEngine {
    project_id: String,
    zone: String,
    instance_id: String,
}

/// Verifies an identity token; the refusal reason otherwise.
pub fn verify(
    keys: &GcpKeys,
    document: &str,
    audience: &str,
    fresh: &Freshness,
) -> Result<CloudIdentity, CloudReason> {
    let token = Token::parse(document)?;
    if token.alg() != "RS256" {
        return Err(CloudReason::Malformed);
    }
    token.check_signature(&keys.0)?;
    identity(token.payload(), audience, fresh)
}

/// The identity the signed claims (`payload`, the JWT's decoded middle
/// part) name, once the signature checked out: public for the fuzzer.
pub fn identity(
    payload: &[u8],
    audience: &str,
    fresh: &Freshness,
) -> Result<CloudIdentity, CloudReason> {
    let claims: Claims = serde_json::from_slice(payload).map_err(|_| CloudReason::Malformed)?;
    if !ISSUERS.contains(&claims.iss.as_str()) {
        return Err(CloudReason::Issuer);
    }
    if !claims.aud.names(audience, |a| a.trim_end_matches('/')) {
        return Err(CloudReason::Audience);
    }
    fresh.check(
        claims.iat.saturating_mul(1000),
        claims.exp.saturating_mul(1000),
    )?;
    let ce = claims
        .google
        .and_then(|g| g.compute_engine)
        .ok_or(CloudReason::Malformed)?;
    CloudIdentity::new(
        super::GCP.to_owned(),
        ce.project_id,
        ce.zone,
        ce.instance_id,
    )
}
