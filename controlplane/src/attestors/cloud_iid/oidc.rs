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

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine;
use serde::Deserialize;

use super::{CloudIdentity, CloudReason, Freshness};

/// The evidence's provider of `[cloud_iid.oidc.<name>]` is this and the name.
pub const PREFIX: &str = "oidc:";
/// The largest JWKS read, from a file or the issuer.
pub(crate) const MAX_JWKS_LEN: usize = 64 * 1024;
/// The most keys kept from a JWKS.
const MAX_KEYS: usize = 32;
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

/// The keys of a JWKS this verifier can use: RSA (RS256) and EC P-256
/// (ES256). Others (and `use: enc` keys) are skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Jwks {
    keys: Vec<Jwk>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Jwk {
    kid: Option<String>,
    key: PublicKey,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PublicKey {
    /// Modulus and exponent, big-endian.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// The SEC1 uncompressed point.
    P256(Vec<u8>),
}

impl PublicKey {
    fn alg(&self) -> &'static str {
        match self {
            PublicKey::Rsa { .. } => "RS256",
            PublicKey::P256(_) => "ES256",
        }
    }

    fn verifies(&self, signed: &[u8], sig: &[u8]) -> bool {
        match self {
            PublicKey::Rsa { n, e } => super::gcp::public_key(n, e)
                .is_some_and(|k| k.pkcs1v15_verify::<rsa::sha2::Sha256>(signed, sig).is_ok()),
            PublicKey::P256(point) => {
                use p256::ecdsa::signature::Verifier as _;
                let (Ok(key), Ok(sig)) = (
                    p256::ecdsa::VerifyingKey::from_sec1_bytes(point),
                    p256::ecdsa::Signature::from_slice(sig),
                ) else {
                    return false;
                };
                key.verify(signed, &sig).is_ok()
            }
        }
    }
}

#[derive(Deserialize)]
struct RawJwks {
    keys: Vec<RawJwk>,
}

#[derive(Deserialize)]
struct RawJwk {
    kty: String,
    kid: Option<String>,
    #[serde(rename = "use")]
    use_: Option<String>,
    alg: Option<String>,
    n: Option<String>,
    e: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

impl Jwks {
    /// Whether a key has this `kid` (`None`: whether there is any key).
    pub(crate) fn knows(&self, kid: Option<&str>) -> bool {
        self.keys
            .iter()
            .any(|k| kid.is_none_or(|kid| k.kid.as_deref() == Some(kid)))
    }

    /// Parses a JWKS; a usable key that does not parse is an error, and so
    /// is a JWKS with no usable key.
    pub fn parse(bytes: &[u8]) -> Result<Jwks, String> {
        if bytes.len() > MAX_JWKS_LEN {
            return Err(format!("larger than {MAX_JWKS_LEN} bytes"));
        }
        let raw: RawJwks =
            serde_json::from_slice(bytes).map_err(|e| format!("not a JWKS ({e})"))?;
        let decode = |v: &Option<String>| {
            v.as_deref()
                .and_then(|v| B64URL.decode(v.trim_end_matches('=')).ok())
        };
        let mut keys = Vec::new();
        for k in raw.keys {
            if k.use_.as_deref().is_some_and(|u| u != "sig") {
                continue;
            }
            let name = k.kid.clone().unwrap_or_default();
            let key = match k.kty.as_str() {
                "RSA" if k.alg.as_deref().is_none_or(|a| a == "RS256") => {
                    let (Some(n), Some(e)) = (decode(&k.n), decode(&k.e)) else {
                        return Err(format!("RSA key {name:?}: n or e missing or not base64url"));
                    };
                    super::gcp::public_key(&n, &e)
                        .ok_or_else(|| format!("key {name:?} is not a usable RSA key"))?;
                    PublicKey::Rsa { n, e }
                }
                "EC" if k.crv.as_deref() == Some("P-256")
                    && k.alg.as_deref().is_none_or(|a| a == "ES256") =>
                {
                    let (Some(x), Some(y)) = (decode(&k.x), decode(&k.y)) else {
                        return Err(format!("EC key {name:?}: x or y missing or not base64url"));
                    };
                    if x.len() != 32 || y.len() != 32 {
                        return Err(format!("EC key {name:?}: x and y must be 32 bytes"));
                    }
                    let mut point = vec![0x04];
                    point.extend_from_slice(&x);
                    point.extend_from_slice(&y);
                    p256::ecdsa::VerifyingKey::from_sec1_bytes(&point)
                        .map_err(|_| format!("key {name:?} is not a point of P-256"))?;
                    PublicKey::P256(point)
                }
                _ => continue,
            };
            keys.push(Jwk { kid: k.kid, key });
        }
        if keys.is_empty() || keys.len() > MAX_KEYS {
            return Err(format!(
                "expected 1 to {MAX_KEYS} RSA (RS256) or P-256 (ES256) signing keys"
            ));
        }
        Ok(Jwks { keys })
    }

    /// Reads a JWKS file.
    pub(crate) fn load(file: &Path) -> Result<Jwks, String> {
        let bytes =
            bc_wire::file::read_regular(file, MAX_JWKS_LEN as u64, bc_wire::file::Links::Follow)
                .map_err(|e| format!("{}: {e}", file.display()))?;
        Jwks::parse(&bytes).map_err(|e| format!("{}: {e}", file.display()))
    }
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
}

/// A JWT split and decoded, its signature not checked yet.
pub(crate) struct Token<'a> {
    alg: String,
    kid: Option<String>,
    signed: &'a [u8],
    sig: Vec<u8>,
    payload: Vec<u8>,
}

impl<'a> Token<'a> {
    /// Shape, base64url and header; `alg` ES256 or RS256 (`cloud-malformed`).
    pub(crate) fn parse(document: &'a str) -> Result<Token<'a>, CloudReason> {
        let mut parts = document.split('.');
        let (Some(h64), Some(p64), Some(s64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(CloudReason::Malformed);
        };
        let decode = |v: &str| B64URL.decode(v).map_err(|_| CloudReason::Malformed);
        let header: Header =
            serde_json::from_slice(&decode(h64)?).map_err(|_| CloudReason::Malformed)?;
        if !matches!(header.alg.as_str(), "ES256" | "RS256") {
            return Err(CloudReason::Malformed);
        }
        Ok(Token {
            alg: header.alg,
            kid: header.kid,
            signed: &document.as_bytes()[..h64.len() + 1 + p64.len()],
            sig: decode(s64)?,
            payload: decode(p64)?,
        })
    }

    pub(crate) fn kid(&self) -> Option<&str> {
        self.kid.as_deref()
    }

    /// The signature, by a key of `keys` of the token's `alg` and `kid`.
    pub(crate) fn check_signature(&self, keys: &Jwks) -> Result<(), CloudReason> {
        let verified = keys
            .keys
            .iter()
            .filter(|k| k.key.alg() == self.alg)
            .filter(|k| self.kid.is_none() || k.kid == self.kid)
            .any(|k| k.key.verifies(self.signed, &self.sig));
        if verified {
            Ok(())
        } else {
            Err(CloudReason::Signature)
        }
    }
}

#[derive(Deserialize)]
struct Claims {
    iss: String,
    aud: Audience,
    iat: i64,
    exp: i64,
    nbf: Option<i64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

/// Verifies `document` with `keys`: the identity it names, or the refusal.
pub(crate) fn verify(
    provider: &OidcProvider,
    keys: &Jwks,
    token: &Token<'_>,
    fresh: &Freshness,
) -> Result<CloudIdentity, CloudReason> {
    token.check_signature(keys)?;
    identity(provider, &token.payload, fresh)
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
    let want = provider.audience.as_str();
    let aud_ok = match &claims.aud {
        Audience::One(a) => a == want,
        Audience::Many(v) => v.iter().any(|a| a == want),
    };
    if !aud_ok {
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
