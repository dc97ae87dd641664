//! An OIDC provider's keys, fetched from its issuer: GET
//! `<issuer>/.well-known/openid-configuration`, whose `issuer` must be the
//! configured one, then its `jwks_uri`, which must be on the issuer's host
//! (and port).
//!
//! **Bounded.** HTTPS only, against `ca_bundle` (else the system's roots);
//! no redirect at all (a 3xx is an error); each answer at most
//! [`super::MAX_JWKS_LEN`] bytes; both requests within `timeout`.
//!
//! **Cached** per provider for `cache` (default an hour). A token whose
//! `kid` the cached keys do not hold fetches them again (a key rotation),
//! at most once a [`MIN_REFETCH`]; a failed fetch is tried again only after
//! [`RETRY_AFTER_FAILURE`]. The fetch runs between two runs of the join
//! transaction ([`crate::model::attestor::Verdict::Prepare`]), never under
//! its lock, and only for a token that parsed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::Jwks;

/// The least time between two fetches for an unknown `kid`.
pub(crate) const MIN_REFETCH: Duration = Duration::from_secs(60);
/// The least time between a failed fetch and the next.
pub(crate) const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);
/// `timeout`'s default and bounds.
pub(crate) const DEFAULT_TIMEOUT_MS: i64 = 10_000;
pub(crate) const MAX_TIMEOUT_MS: i64 = 60_000;
/// `cache`'s default and bounds.
pub(crate) const DEFAULT_CACHE_MS: i64 = 3_600_000;
pub(crate) const MIN_CACHE_MS: i64 = 60_000;
pub(crate) const MAX_CACHE_MS: i64 = 86_400_000;

/// How a provider's keys are fetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchConfig {
    /// `ca_bundle`: the roots (DER) the issuer's TLS certificate must chain
    /// to; `None`: the system's.
    pub(crate) ca_roots: Option<Vec<Vec<u8>>>,
    /// Both requests, connection to last byte.
    pub(crate) timeout_ms: i64,
    /// How long fetched keys are used.
    pub(crate) cache_ms: i64,
}

impl Default for FetchConfig {
    fn default() -> Self {
        FetchConfig {
            ca_roots: None,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            cache_ms: DEFAULT_CACHE_MS,
        }
    }
}

/// Why no keys were fetched.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum FetchError {
    #[error("no CA roots to verify the issuer with: {0}")]
    NoRoots(String),
    #[error("{url}: unreachable: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("no answer within {0} ms")]
    Timeout(i64),
    #[error("{url}: answered a redirect (HTTP {status}), which is not followed")]
    Redirect { url: String, status: u16 },
    #[error("{url}: answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: answered more than {max} bytes", max = super::MAX_JWKS_LEN)]
    TooLarge { url: String },
    #[error("the openid-configuration names issuer {0:?}, not the configured one")]
    IssuerMismatch(String),
    #[error("jwks_uri {0:?} is not an https:// URL on the issuer's host")]
    OffHost(String),
    #[error("{0}")]
    Malformed(String),
    #[error("a fetch failed less than {}s ago", RETRY_AFTER_FAILURE.as_secs())]
    RecentlyFailed,
}

/// Why a token's keys must be fetched first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// None cached, or past the cache's lifetime.
    Refresh,
    /// The cached keys hold no key with the token's `kid`.
    UnknownKid,
}

/// What the join asks fetched outside its transaction.
#[derive(Clone, Debug)]
pub(crate) struct JwksWork {
    pub provider: String,
    pub need: Need,
}

/// One provider's cached keys.
struct Entry {
    keys: Option<Arc<Jwks>>,
    fetched_at: Option<Instant>,
    /// The last fetch started, and whether it failed.
    attempted_at: Instant,
    failed: bool,
}

/// The cache of every fetched provider's keys, by provider name.
#[derive(Default)]
pub(crate) struct JwksCache {
    entries: Mutex<HashMap<String, Entry>>,
}

/// What the cache answers for a token.
#[derive(Debug)]
pub(crate) enum Cached {
    Keys(Arc<Jwks>),
    Fetch(Need),
}

impl JwksCache {
    /// The keys to verify a token with `kid`, or what to fetch first.
    pub(crate) fn lookup(
        &self,
        provider: &str,
        config: &FetchConfig,
        kid: Option<&str>,
        now: Instant,
    ) -> Cached {
        let map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let Some(e) = map.get(provider) else {
            return Cached::Fetch(Need::Refresh);
        };
        let fresh = |e: &Entry| {
            e.fetched_at
                .is_some_and(|at| now.duration_since(at) < millis(config.cache_ms))
        };
        match &e.keys {
            Some(keys) if fresh(e) => {
                if keys.knows(kid) || now.duration_since(e.attempted_at) < MIN_REFETCH {
                    Cached::Keys(keys.clone())
                } else {
                    Cached::Fetch(Need::UnknownKid)
                }
            }
            _ => Cached::Fetch(Need::Refresh),
        }
    }

    /// Fetches `provider`'s keys for `need` unless another join just did
    /// (or just failed to): the keys, or why none.
    pub(crate) fn refresh(
        &self,
        provider: &super::OidcProvider,
        config: &FetchConfig,
        need: Need,
        now: Instant,
    ) -> Result<Arc<Jwks>, FetchError> {
        {
            let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(e) = map.get(&provider.name) {
                let since = now.saturating_duration_since(e.attempted_at);
                let fresh = e
                    .fetched_at
                    .is_some_and(|at| now.saturating_duration_since(at) < millis(config.cache_ms));
                match (&e.keys, need) {
                    (Some(keys), Need::UnknownKid) if fresh && since < MIN_REFETCH => {
                        return Ok(keys.clone())
                    }
                    (Some(keys), Need::Refresh) if fresh => return Ok(keys.clone()),
                    _ if e.failed && since < RETRY_AFTER_FAILURE => {
                        return Err(FetchError::RecentlyFailed)
                    }
                    _ => {}
                }
            }
            let entry = map.entry(provider.name.clone()).or_insert(Entry {
                keys: None,
                fetched_at: None,
                attempted_at: now,
                failed: false,
            });
            entry.attempted_at = now;
        }
        let fetched = fetch_jwks(provider.issuer(), config);
        let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(provider.name.clone()).or_insert(Entry {
            keys: None,
            fetched_at: None,
            attempted_at: now,
            failed: false,
        });
        match fetched {
            Ok(keys) => {
                let keys = Arc::new(keys);
                entry.keys = Some(keys.clone());
                entry.fetched_at = Some(now);
                entry.failed = false;
                Ok(keys)
            }
            Err(e) => {
                entry.failed = true;
                Err(e)
            }
        }
    }
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
}

/// Both GETs, within every bound; blocks the calling (blocking) thread.
pub(crate) fn fetch_jwks(issuer: &str, config: &FetchConfig) -> Result<Jwks, FetchError> {
    let client = client(config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| FetchError::Malformed(format!("no runtime: {e}")))?;
    runtime.block_on(async {
        tokio::time::timeout(millis(config.timeout_ms), discover(&client, issuer))
            .await
            .unwrap_or(Err(FetchError::Timeout(config.timeout_ms)))
    })
}

async fn discover(client: &reqwest::Client, issuer: &str) -> Result<Jwks, FetchError> {
    let issuer = issuer.trim_end_matches('/');
    let url = format!("{issuer}/.well-known/openid-configuration");
    let body = get(client, &url).await?;
    let d: Discovery = serde_json::from_slice(&body)
        .map_err(|e| FetchError::Malformed(format!("{url}: not an openid-configuration: {e}")))?;
    if d.issuer.trim_end_matches('/') != issuer {
        return Err(FetchError::IssuerMismatch(d.issuer));
    }
    let on_host = |issuer: &str, uri: &str| -> Option<bool> {
        let (i, u) = (
            reqwest::Url::parse(issuer).ok()?,
            reqwest::Url::parse(uri).ok()?,
        );
        Some(
            u.scheme() == "https"
                && u.host_str() == i.host_str()
                && u.port_or_known_default() == i.port_or_known_default()
                && u.username().is_empty()
                && u.password().is_none(),
        )
    };
    if on_host(issuer, &d.jwks_uri) != Some(true) {
        return Err(FetchError::OffHost(d.jwks_uri));
    }
    let body = get(client, &d.jwks_uri).await?;
    Jwks::parse(&body).map_err(|e| FetchError::Malformed(format!("{}: {e}", d.jwks_uri)))
}

/// One GET: a 2xx answer's body, [`super::MAX_JWKS_LEN`] at most.
async fn get(client: &reqwest::Client, url: &str) -> Result<Vec<u8>, FetchError> {
    let unreachable = |e: reqwest::Error| FetchError::Unreachable {
        url: url.to_owned(),
        reason: crate::http_client::cause(&e),
    };
    let mut resp = client.get(url).send().await.map_err(unreachable)?;
    let status = resp.status();
    if status.is_redirection() {
        return Err(FetchError::Redirect {
            url: url.to_owned(),
            status: status.as_u16(),
        });
    }
    if !status.is_success() {
        return Err(FetchError::Status {
            url: url.to_owned(),
            status: status.as_u16(),
        });
    }
    let too_large = || FetchError::TooLarge {
        url: url.to_owned(),
    };
    if resp
        .content_length()
        .is_some_and(|n| n > super::MAX_JWKS_LEN as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(unreachable)? {
        if body.len() + chunk.len() > super::MAX_JWKS_LEN {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An HTTPS-only client that follows no redirect, trusting `ca_bundle`
/// (else the system's roots).
fn client(config: &FetchConfig) -> Result<reqwest::Client, FetchError> {
    let roots = match &config.ca_roots {
        Some(r) => r.clone(),
        None => crate::http_client::system_roots("[cloud_iid.oidc.<name>] ca_bundle")
            .map_err(FetchError::NoRoots)?,
    };
    crate::http_client::https_client(
        &roots,
        millis(config.timeout_ms),
        reqwest::redirect::Policy::none(),
    )
    .map_err(FetchError::NoRoots)
}

#[cfg(test)]
mod tests;
