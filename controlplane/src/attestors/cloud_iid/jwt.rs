//! JSON Web Tokens and key sets, as the cloud-iid providers that take a
//! JWT (GCP's identity token, any OIDC issuer's ID token) check them: one
//! parser and one signature check for both, each provider then reading the
//! claims it trusts.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine;
use serde::Deserialize;

use super::CloudReason;

/// The largest JWKS read, from a file or the issuer.
pub(crate) const MAX_JWKS_LEN: usize = 64 * 1024;
/// The most keys kept from a JWKS.
const MAX_KEYS: usize = 32;

/// An RSA public key of 2048 to 4096 bits.
fn rsa_public_key(n: &[u8], e: &[u8]) -> Option<rsa::PublicKey> {
    let n = rsa::BoxedUint::from_be_slice_vartime(n);
    let e = rsa::BoxedUint::from_be_slice_vartime(e);
    rsa::PublicKey::new_with_size_limits(n, e, 2048..=4096).ok()
}

/// The keys of a JWKS this verifier can use: RSA (RS256) and EC P-256
/// (ES256). Others (and `use: enc` keys) are skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Jwks {
    pub(super) keys: Vec<Jwk>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Jwk {
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
            PublicKey::Rsa { n, e } => rsa_public_key(n, e)
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

    /// Whether a key is for this `alg` (`RS256`, `ES256`).
    pub(crate) fn has_alg(&self, alg: &str) -> bool {
        self.keys.iter().any(|k| k.key.alg() == alg)
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
                    rsa_public_key(&n, &e)
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

    pub(crate) fn alg(&self) -> &str {
        &self.alg
    }

    /// The claims, decoded; trust them only once the signature checked out.
    pub(crate) fn payload(&self) -> &[u8] {
        &self.payload
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

/// A JWT's `aud`: one audience or several.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Audience {
    /// Whether one of them is `want`, both compared as `norm` makes them.
    pub(super) fn names(&self, want: &str, norm: impl Fn(&str) -> &str) -> bool {
        let want = norm(want);
        match self {
            Audience::One(a) => norm(a) == want,
            Audience::Many(v) => v.iter().any(|a| norm(a) == want),
        }
    }
}
