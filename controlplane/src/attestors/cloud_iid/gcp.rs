//! GCP: the instance identity token, an RS256 JWT signed by Google
//! (`format=full`, so it names the project, zone and instance).
//!
//! Checked in this order: the JWT's shape and `alg` (`cloud-malformed`),
//! its signature by a configured key with that `kid` (`cloud-signature`),
//! then, over signed claims only, the issuer (`cloud-issuer`), the audience
//! (`cloud-audience`), freshness (`cloud-stale`, `cloud-future`) and the
//! `google.compute_engine` claims (`cloud-malformed`).

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine;
use serde::Deserialize;

use super::{CloudIdentity, CloudReason, Freshness};

/// The issuers Google's identity tokens name.
const ISSUERS: &[&str] = &["https://accounts.google.com", "accounts.google.com"];
/// The largest JWKS file read (Google's holds two or three keys, ~2 KiB).
const MAX_JWKS_LEN: u64 = 256 * 1024;
/// The most keys kept from a JWKS.
const MAX_KEYS: usize = 32;

/// Google's signing keys, from the JWKS of `[cloud_iid.gcp] jwks`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcpKeys {
    keys: Vec<Jwk>,
}

/// One RSA key: modulus and exponent, big-endian.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Jwk {
    kid: String,
    n: Vec<u8>,
    e: Vec<u8>,
}

#[derive(Deserialize)]
struct RawJwks {
    keys: Vec<RawJwk>,
}

#[derive(Deserialize)]
struct RawJwk {
    kty: String,
    kid: Option<String>,
    n: Option<String>,
    e: Option<String>,
}

/// Reads a JWKS file (`{"keys":[{"kty":"RSA","kid","n","e"},…]}`), keeping
/// its RSA keys; none is an error, as is a key that is not a usable RSA key.
pub(crate) fn load_jwks(file: &Path) -> Result<GcpKeys, String> {
    let bytes = bc_wire::file::read_regular(file, MAX_JWKS_LEN, bc_wire::file::Links::Follow)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    parse_jwks(&bytes).map_err(|e| format!("{}: {e}", file.display()))
}

pub fn parse_jwks(bytes: &[u8]) -> Result<GcpKeys, String> {
    let raw: RawJwks = serde_json::from_slice(bytes).map_err(|e| format!("not a JWKS ({e})"))?;
    let mut keys = Vec::new();
    for k in raw.keys.into_iter().filter(|k| k.kty == "RSA") {
        let (Some(kid), Some(n), Some(e)) = (k.kid, k.n, k.e) else {
            return Err("an RSA key needs kid, n and e".to_owned());
        };
        let decode = |v: &str| B64URL.decode(v.trim_end_matches('='));
        let (Ok(n), Ok(e)) = (decode(&n), decode(&e)) else {
            return Err(format!("key {kid:?}: n or e is not base64url"));
        };
        public_key(&n, &e).ok_or_else(|| format!("key {kid:?} is not a usable RSA key"))?;
        keys.push(Jwk { kid, n, e });
    }
    if keys.is_empty() || keys.len() > MAX_KEYS {
        return Err(format!("expected 1 to {MAX_KEYS} RSA keys"));
    }
    Ok(GcpKeys { keys })
}

/// An RSA public key of 2048 to 4096 bits.
pub(super) fn public_key(n: &[u8], e: &[u8]) -> Option<rsa::PublicKey> {
    let n = rsa::BoxedUint::from_be_slice_vartime(n);
    let e = rsa::BoxedUint::from_be_slice_vartime(e);
    rsa::PublicKey::new_with_size_limits(n, e, 2048..=4096).ok()
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
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
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
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
    let mut parts = document.split('.');
    let (Some(h64), Some(p64), Some(s64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(CloudReason::Malformed);
    };
    let decode = |v: &str| B64URL.decode(v).map_err(|_| CloudReason::Malformed);
    let header: Header =
        serde_json::from_slice(&decode(h64)?).map_err(|_| CloudReason::Malformed)?;
    if header.alg != "RS256" {
        return Err(CloudReason::Malformed);
    }
    let sig = decode(s64)?;
    let signed = &document.as_bytes()[..h64.len() + 1 + p64.len()];
    let verified = keys
        .keys
        .iter()
        .filter(|k| header.kid.as_deref().is_none_or(|kid| kid == k.kid))
        .filter_map(|k| public_key(&k.n, &k.e))
        .any(|k| k.pkcs1v15_verify::<rsa::sha2::Sha256>(signed, &sig).is_ok());
    if !verified {
        return Err(CloudReason::Signature);
    }
    identity(&decode(p64)?, audience, fresh)
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
    let want = audience.trim_end_matches('/');
    let aud_ok = match &claims.aud {
        Audience::One(a) => a.trim_end_matches('/') == want,
        Audience::Many(v) => v.iter().any(|a| a.trim_end_matches('/') == want),
    };
    if !aud_ok {
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
