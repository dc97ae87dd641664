//! A generic OIDC provider (`[cloud_iid.oidc.<name>]`): any issuer whose
//! ID tokens (JWTs, ES256 or RS256) name the VM, such as a workload
//! identity service or a cloud this control plane has no verifier of its
//! own for. The evidence's provider is `oidc:<name>`.
//!
//! Checked as GCP's tokens are, in this order: the JWT's shape and `alg`
//! (`cloud-malformed`), its signature by a key of the issuer's JWKS with
//! that `kid` (`cloud-signature`), then, over signed claims only, `iss`
//! (`cloud-issuer`), `aud` (`cloud-audience`), `iat` within `max_age` and
//! `exp` not passed (`cloud-stale`), `iat` and `nbf` not in the future
//! (`cloud-future`), and the claims that name the VM (`cloud-malformed`).
//!
//! The keys come from a JWKS file, or from the issuer itself
//! ([`fetch`]: `<issuer>/.well-known/openid-configuration`, then its
//! `jwks_uri`, bounded and cached).

pub(crate) mod fetch;

use serde::Deserialize;

use super::jwt::Audience;
pub use super::jwt::Jwks;
pub(crate) use super::jwt::Token;
pub(crate) use super::jwt::MAX_JWKS_LEN;
use super::{CloudIdentity, CloudReason, Freshness};

/// The evidence's provider of `[cloud_iid.oidc.<name>]` is this and the name.
pub const PREFIX: &str = "oidc:";
/// The longest claim path (`a.b.c`) and the deepest.
const MAX_CLAIM_PATH: usize = 128;
const MAX_CLAIM_DEPTH: usize = 4;

/// One `[cloud_iid.oidc.<name>]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OidcProvider {
    pub name: String,
    /// `https://…`, compared with `iss` without a trailing `/`.
    pub issuer: String,
    pub audience: String,
    pub keys: KeySource,
    /// The claim (dotted path) that is the account; `None`: the issuer's
    /// host, so every VM of one issuer is one account.
    pub account_claim: Option<String>,
    /// The claim that is the zone; `None`: no zone (`''`).
    pub zone_claim: Option<String>,
    /// The claim that is the instance (`sub` by default).
    pub instance_claim: String,
    pub max_age_ms: i64,
}

impl OidcProvider {
    /// The evidence's provider name: `oidc:<name>`.
    pub fn provider(&self) -> String {
        format!("{PREFIX}{}", self.name)
    }

    /// The issuer without a trailing `/`.
    pub(crate) fn issuer(&self) -> &str {
        self.issuer.trim_end_matches('/')
    }
}

/// Where a provider's keys come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// `jwks = "file"`: read once, at start.
    File(Jwks),
    /// Fetched from the issuer, within these bounds.
    Fetch(fetch::FetchConfig),
}

/// A provider name: what `oidc:<name>` may carry.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?}: a provider name is 1 to 32 of a-z, 0-9, '-', '_'"
        ))
    }
}

/// An issuer as configured: `https://host[:port][/path]`, nothing else.
pub fn check_issuer(issuer: &str) -> Result<(), String> {
    let url = reqwest::Url::parse(issuer).map_err(|e| format!("{issuer:?}: {e}"))?;
    if url.scheme() != "https" {
        return Err(format!("{issuer:?} is not an https:// URL"));
    }
    if url.host_str().is_none_or(str::is_empty)
        || url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
        || url.password().is_some()
    {
        return Err(format!(
            "{issuer:?} must be https://host[:port][/path], with no query, fragment or user"
        ));
    }
    Ok(())
}

/// A claim path as configured: dotted names, at most 4 deep.
pub fn check_claim(path: &str) -> Result<(), String> {
    let parts: Vec<&str> = path.split('.').collect();
    if path.len() > MAX_CLAIM_PATH
        || parts.len() > MAX_CLAIM_DEPTH
        || parts.iter().any(|p| p.is_empty())
    {
        return Err(format!(
            "{path:?}: a claim is a name or a dotted path of at most {MAX_CLAIM_DEPTH} names"
        ));
    }
    Ok(())
}

#[derive(Deserialize)]
struct Claims {
    iss: String,
    aud: Audience,
    iat: i64,
    exp: i64,
    nbf: Option<i64>,
}

/// Verifies `document` with `keys`: the identity it names, or the refusal.
pub(crate) fn verify(
    provider: &OidcProvider,
    keys: &Jwks,
    token: &Token<'_>,
    fresh: &Freshness,
) -> Result<CloudIdentity, CloudReason> {
    token.check_signature(keys)?;
    identity(provider, token.payload(), fresh)
}

/// The identity the signed claims name, once the signature checked out.
fn identity(
    provider: &OidcProvider,
    payload: &[u8],
    fresh: &Freshness,
) -> Result<CloudIdentity, CloudReason> {
    let value: serde_json::Value =
        serde_json::from_slice(payload).map_err(|_| CloudReason::Malformed)?;
    let claims: Claims =
        serde_json::from_value(value.clone()).map_err(|_| CloudReason::Malformed)?;
    if claims.iss.trim_end_matches('/') != provider.issuer() {
        return Err(CloudReason::Issuer);
    }
    if !claims.aud.names(&provider.audience, |a| a) {
        return Err(CloudReason::Audience);
    }
    let fresh = Freshness {
        now: fresh.now,
        max_age_ms: provider.max_age_ms,
    };
    if let Some(nbf) = claims.nbf {
        fresh.not_before(nbf.saturating_mul(1000))?;
    }
    fresh.check(
        claims.iat.saturating_mul(1000),
        claims.exp.saturating_mul(1000),
    )?;
    let account = match &provider.account_claim {
        Some(path) => claim(&value, path)?,
        None => reqwest::Url::parse(provider.issuer())
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .ok_or(CloudReason::Malformed)?,
    };
    let zone = match &provider.zone_claim {
        Some(path) => claim(&value, path)?,
        None => String::new(),
    };
    let instance = claim(&value, &provider.instance_claim)?;
    CloudIdentity::new(provider.provider(), account, zone, instance)
}

/// The string (or integer, in decimal) at a dotted `path` of the claims.
fn claim(claims: &serde_json::Value, path: &str) -> Result<String, CloudReason> {
    let mut v = claims;
    for part in path.split('.') {
        v = v.get(part).ok_or(CloudReason::Malformed)?;
    }
    match v {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Number(n) if n.is_u64() || n.is_i64() => Ok(n.to_string()),
        _ => Err(CloudReason::Malformed),
    }
}

#[cfg(test)]
pub(crate) mod tests;
