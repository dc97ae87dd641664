//! EK certificates that are not in NV, fetched from the TPM maker's online
//! service (`[tpm.ek_services]`): Intel firmware TPMs (PTT) and AMD fTPMs
//! often hold none, and their makers publish each one, addressed by a hash
//! of the EK's public key.
//!
//! **When.** A hello with no `ek_certificate` whose `tpm_manufacturer` is
//! a configured service's (`INTC`, `AMD` by default), and only on behalf
//! of a machine: never for an EK merely named by an unauthenticated
//! request, which costs its sender nothing. So:
//! * an EK the operator knows (a resolve entry, a node it is bound to, an
//!   open boot entry's `--ek-sha256`, an approved join request) is fetched
//!   for in round 1, and the challenge carries its verified certificate,
//!   as one from NV;
//! * any other EK is challenged first, with no certificate: the sealed
//!   state carries that it is still to be fetched (and the EK public area
//!   and intermediates to verify it with), and the certificate is fetched
//!   in round 2 once the machine has answered the challenge (it holds
//!   that EK), then verified before anything else (placing, a join
//!   request) happens.
//!
//! Either way the fetch runs between two runs of the join's transaction
//! ([`crate::model::attestor::Verdict::Prepare`]): a fetch must never hold the
//! database's write lock, and a discovery join reaches it only after its
//! token and assertion were checked. What it returns is verified exactly as
//! a certificate from NV is ([`super::ek::verify_ek`]: profile, chain to
//! the configured anchors, key match), and recorded as the assurance
//! `maker-service`.
//!
//! **Addressing**, as the makers document it and tpm2-tools'
//! `tpm2_getekcertificate` implements it:
//! * Intel: `base64url(sha256(modulus ‖ 01 00 01))` for RSA (the default
//!   exponent only), `base64url(sha256(x ‖ y))` for ECC, padded, its `=`
//!   written `%3D`; the service answers a JSON object whose `certificate`
//!   is the DER in base64url.
//! * AMD: the lowercase hex of the first 16 bytes of
//!   `sha256(00 00 22 22 ‖ exponent (u32, big-endian) ‖ modulus)` for RSA,
//!   `sha256(00 00 44 44 ‖ x ‖ y)` for ECC; the answer is the DER.
//!
//! Any answer may be the DER, a PEM certificate or that JSON object.
//!
//! **Bounded.** HTTPS only, redirects followed only on the same host (at
//! most 3), the whole request within `timeout`, at most [`MAX_BODY`] bytes
//! read, and a budget per source address with a share kept for known EKs
//! ([`budget`]: past it the join is refused `ek-service` at once). A
//! `404` (the maker has no certificate for that EK) is remembered by the
//! EK's SHA-256 for [`NOT_FOUND_TTL`], so a hello sent again does not ask
//! again. The request names only the EK's hash; the caller picks neither
//! the host nor the path.
//!
//! **Cached** by the EK's SHA-256 (`ek_service_certificates`, written in
//! its own write transaction right after the fetch) when the certificate's
//! key is the EK's, so each machine is fetched once; a
//! certificate for another key is not kept (and is refused
//! `ek-mismatch`). A cached certificate is verified at every join, as NV's.
//!
//! **Refusals.** A service that cannot be reached, answers an error or
//! something that is no certificate, too slowly or too much: `ek-service`
//! (the agent asks again, see bcd's `RefusedRetry`), unless an operator
//! pinned the EK as uncertified (it then joins `pinned`). A `404`: as no
//! certificate at all (`ek-chain`, or `pinned`).

pub(crate) mod budget;
pub(crate) mod known;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bc_wire::tpm::{KeyParams, Public};

use crate::store::{params, DbError, Tx, UnixMs};
use budget::Budget;
pub(crate) use budget::{Claim, Source};

/// The most bytes read of an answer (an EK certificate is 1-2 KiB; Intel's
/// JSON wraps it in base64).
pub(crate) const MAX_BODY: usize = 32 * 1024;
/// How long a maker's "no such certificate" is believed.
pub(crate) const NOT_FOUND_TTL: Duration = Duration::from_secs(600);
/// Most remembered "no such certificate" answers.
const MAX_NOT_FOUND: usize = 4096;
/// Most redirects followed (on the same host).
const MAX_REDIRECTS: usize = 3;
/// The whole request's default and bounds.
pub(crate) const DEFAULT_TIMEOUT_MS: i64 = 10_000;
pub(crate) const MAX_TIMEOUT_MS: i64 = 60_000;

/// How a maker addresses an EK certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addressing {
    Intel,
    Amd,
}

impl Addressing {
    /// The `[tpm.ek_services]` table and log name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Addressing::Intel => "intel",
            Addressing::Amd => "amd",
        }
    }
}

/// One maker's service: whose TPMs, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EkService {
    pub addressing: Addressing,
    /// TPM_PT_MANUFACTURER as text ("INTC", "AMD"): compared with the
    /// agent's without trailing NULs and spaces.
    pub manufacturer: String,
    /// An `https://` URL with `{ek}` where the EK's address goes; empty:
    /// this service is off.
    pub url: String,
}

/// `[tpm.ek_services]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EkServicesConfig {
    pub services: Vec<EkService>,
    /// `ca_bundle`: the CA certificates (DER) a service's TLS certificate
    /// must chain to; None: the system's (`SSL_CERT_FILE`, else the
    /// distribution's bundle).
    pub(crate) ca_roots: Option<Vec<Vec<u8>>>,
    /// The whole request, connection to last byte.
    pub(crate) timeout_ms: i64,
}

impl Default for EkServicesConfig {
    fn default() -> Self {
        EkServicesConfig {
            services: vec![
                EkService {
                    addressing: Addressing::Intel,
                    manufacturer: "INTC".to_owned(),
                    url: default_url(Addressing::Intel).to_owned(),
                },
                EkService {
                    addressing: Addressing::Amd,
                    manufacturer: "AMD".to_owned(),
                    url: default_url(Addressing::Amd).to_owned(),
                },
            ],
            ca_roots: None,
            timeout_ms: DEFAULT_TIMEOUT_MS,
        }
    }
}

/// The URL template each maker documents (tpm2-tools' defaults).
pub(crate) fn default_url(addressing: Addressing) -> &'static str {
    match addressing {
        Addressing::Intel => "https://ekop.intel.com/ekcertservice/{ek}",
        Addressing::Amd => "https://ftpm.amd.com/pki/aia/{ek}",
    }
}

/// Why a URL template is refused in the config.
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    if url.is_empty() {
        return Ok(());
    }
    if !url.starts_with("https://") {
        return Err(format!("{url:?} is not an https:// URL"));
    }
    if url.matches("{ek}").count() != 1 {
        return Err(format!(
            "{url:?} must hold {{ek}} once (where the EK's address goes)"
        ));
    }
    // The EK's address goes in the path or query, never the host.
    let host = |probe: &str| {
        reqwest::Url::parse(&url.replace("{ek}", probe))
            .map_err(|e| format!("{url:?}: {e}"))
            .map(|u| u.host_str().map(str::to_owned))
    };
    match (host("a")?, host("b")?) {
        (Some(a), Some(b)) if a == b && !a.is_empty() => Ok(()),
        _ => Err(format!("{url:?} must name its host, with {{ek}} after it")),
    }
}

/// TPM_PT_MANUFACTURER as text, without trailing NULs and spaces (a
/// byte that is no printable ASCII as `?`).
pub(crate) fn manufacturer_text(id: u32) -> String {
    let bytes = id.to_be_bytes();
    let end = bytes
        .iter()
        .rposition(|&b| b != 0 && b != b' ')
        .map_or(0, |i| i + 1);
    printable_ascii(&bytes[..end])
}

/// The agent's vendor string for the log: at most 16 characters, what is
/// no printable ASCII as `?`.
pub(crate) fn vendor_text(s: &str) -> String {
    printable_ascii(&s.as_bytes()[..s.len().min(16)])
}

fn printable_ascii(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| match b {
            b' '..=b'~' => b as char,
            _ => '?',
        })
        .collect()
}

impl EkServicesConfig {
    /// The service of the maker whose TPM reports `manufacturer`.
    pub(crate) fn service_for(&self, manufacturer: u32) -> Option<&EkService> {
        if manufacturer == 0 {
            return None;
        }
        let text = manufacturer_text(manufacturer);
        self.services
            .iter()
            .find(|s| !s.url.is_empty() && s.manufacturer.trim_end_matches(['\0', ' ']) == text)
    }
}

/// Where `public` (a TPMT_PUBLIC) is found in the maker's addressing.
pub(crate) fn address(addressing: Addressing, public: &Public) -> Result<String, &'static str> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    match (addressing, &public.params) {
        (
            Addressing::Intel,
            KeyParams::Rsa {
                exponent, modulus, ..
            },
        ) => {
            if !matches!(*exponent, 0 | 65_537) {
                return Err("Intel addresses only RSA EKs with the default exponent");
            }
            h.update(modulus);
            h.update([0x01, 0x00, 0x01]);
        }
        (Addressing::Intel, KeyParams::Ecc { x, y, .. }) => {
            h.update(x);
            h.update(y);
        }
        (
            Addressing::Amd,
            KeyParams::Rsa {
                exponent, modulus, ..
            },
        ) => {
            let e = if *exponent == 0 { 65_537 } else { *exponent };
            h.update([0x00, 0x00, 0x22, 0x22]);
            h.update(e.to_be_bytes());
            h.update(modulus);
        }
        (Addressing::Amd, KeyParams::Ecc { x, y, .. }) => {
            h.update([0x00, 0x00, 0x44, 0x44]);
            h.update(x);
            h.update(y);
        }
    }
    let digest = h.finalize();
    Ok(match addressing {
        Addressing::Intel => base64::engine::general_purpose::URL_SAFE
            .encode(digest)
            .replace('=', "%3D"),
        Addressing::Amd => hex::encode(&digest[..16]),
    })
}

/// The certificate (DER) in a service's answer: the DER itself, one PEM
/// certificate, or Intel's JSON object with the DER in base64url as
/// `certificate`.
pub(crate) fn certificate_of(body: &[u8]) -> Result<Vec<u8>, String> {
    let text = std::str::from_utf8(body).ok().map(str::trim_start);
    match text {
        Some(t) if t.starts_with('{') => {
            let v: serde_json::Value = serde_json::from_str(t)
                .map_err(|e| format!("a JSON answer that does not parse: {e}"))?;
            let b64 = v
                .get("certificate")
                .and_then(|c| c.as_str())
                .ok_or("a JSON answer without a \"certificate\" string")?;
            decode_base64url(b64)
                .ok_or_else(|| "a \"certificate\" that is not base64url".to_owned())
        }
        Some(t) if t.starts_with("-----BEGIN") => {
            let mut bytes = t.as_bytes();
            let mut certs = rustls_pemfile::certs(&mut bytes);
            match (certs.next(), certs.next()) {
                (Some(Ok(c)), None) if c.first() == Some(&0x30) => Ok(c.to_vec()),
                _ => Err("a PEM answer that is not one certificate".to_owned()),
            }
        }
        _ if body.first() == Some(&0x30) => Ok(body.to_vec()),
        _ => Err("an answer that is neither DER, PEM nor JSON".to_owned()),
    }
}

/// Base64url as Intel writes it (padded or not, `=` maybe `%3D`); the
/// standard alphabet is taken too.
fn decode_base64url(s: &str) -> Option<Vec<u8>> {
    use base64::engine::{general_purpose::GeneralPurposeConfig, DecodePaddingMode};
    let cleaned: String = s
        .replace("%3D", "")
        .replace("%3d", "")
        .chars()
        .filter(|c| !c.is_ascii_whitespace() && *c != '=')
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect();
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::RequireNone),
    );
    engine.decode(cleaned).ok().filter(|d| !d.is_empty())
}

/// Why a fetch gave no certificate.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum FetchError {
    #[error("{0} fetches already under way")]
    Busy(usize),
    #[error("{0} fetches in the last minute")]
    RateLimited(u32),
    #[error("{0} fetches from this source in the last minute")]
    SourceLimited(u32),
    #[error("{0} fetches for EKs no operator knows in the last minute")]
    ProvenLimited(u32),
    #[error("no CA roots to verify the service with: {0}")]
    NoRoots(String),
    #[error("unreachable: {0}")]
    Unreachable(String),
    #[error("no answer within {0} ms")]
    Timeout(i64),
    #[error("answered HTTP {0}")]
    Status(u16),
    #[error("answered more than {MAX_BODY} bytes")]
    TooLarge,
    #[error("{0}")]
    Malformed(String),
}

/// A fetch's outcome that is not an error.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fetched {
    Certificate(Vec<u8>),
    /// The maker has no certificate for this EK (`404`).
    NotFound,
}

/// The fetcher: the config, its client (made at the first fetch) and
/// its limits.
pub(crate) struct EkServices {
    config: EkServicesConfig,
    client: OnceLock<Result<reqwest::Client, String>>,
    budget: Mutex<Budget>,
    /// EK SHA-256 → when its maker said it has no certificate for it.
    not_found: Mutex<HashMap<String, Instant>>,
}

impl EkServices {
    pub(crate) fn new(config: EkServicesConfig) -> Self {
        EkServices {
            config,
            client: OnceLock::new(),
            budget: Mutex::new(Budget::new(Instant::now())),
            not_found: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn config(&self) -> &EkServicesConfig {
        &self.config
    }

    /// GETs `url`, the address of the EK `ek_sha256`, within every bound,
    /// on behalf of `source` for `claim`; blocks the calling (blocking)
    /// thread.
    pub(crate) fn fetch(
        &self,
        ek_sha256: &str,
        url: &str,
        source: Source,
        claim: Claim,
    ) -> Result<Fetched, FetchError> {
        if self.recently_not_found(ek_sha256) {
            return Ok(Fetched::NotFound);
        }
        let _slot = self.enter(source, claim)?;
        let client = self
            .client
            .get_or_init(|| self.make_client())
            .as_ref()
            .map_err(|e| FetchError::NoRoots(e.clone()))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| FetchError::Unreachable(format!("no runtime: {e}")))?;
        let timeout = Duration::from_millis(u64::try_from(self.config.timeout_ms).unwrap_or(0));
        // The one deadline (the client has none of its own): a slow
        // service always ends with this error, not with whichever of two
        // equal timers fired first.
        let fetched = runtime.block_on(async {
            tokio::time::timeout(timeout, get(client, url))
                .await
                .unwrap_or(Err(FetchError::Timeout(self.config.timeout_ms)))
        });
        if fetched == Ok(Fetched::NotFound) {
            self.remember_not_found(ek_sha256);
        }
        fetched
    }

    /// A place in the budget ([`budget`]), or why not.
    fn enter(&self, source: Source, claim: Claim) -> Result<Slot<'_>, FetchError> {
        let mut b = self.budget.lock().unwrap_or_else(|p| p.into_inner());
        b.enter(Instant::now(), source, claim)?;
        Ok(Slot {
            budget: &self.budget,
            claim,
        })
    }

    /// Whether the maker said, less than [`NOT_FOUND_TTL`] ago, that it has
    /// no certificate for the EK `ek_sha256`.
    pub(crate) fn recently_not_found(&self, ek_sha256: &str) -> bool {
        let map = self.not_found.lock().unwrap_or_else(|p| p.into_inner());
        map.get(ek_sha256)
            .is_some_and(|at| at.elapsed() < NOT_FOUND_TTL)
    }

    fn remember_not_found(&self, ek_sha256: &str) {
        let mut map = self.not_found.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, at| at.elapsed() < NOT_FOUND_TTL);
        if map.len() >= MAX_NOT_FOUND {
            map.clear();
        }
        map.insert(ek_sha256.to_owned(), Instant::now());
    }

    fn make_client(&self) -> Result<reqwest::Client, String> {
        let roots = match &self.config.ca_roots {
            Some(r) => r.clone(),
            None => crate::http_client::system_roots("[tpm.ek_services] ca_bundle")?,
        };
        let mut builder = crate::http_client::client_builder()
            .https_only(true)
            .tls_built_in_root_certs(false)
            .pool_max_idle_per_host(0)
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                let same_host = attempt
                    .previous()
                    .first()
                    .is_some_and(|first| first.host_str() == attempt.url().host_str());
                let https = attempt.url().scheme() == "https";
                if attempt.previous().len() > MAX_REDIRECTS || !same_host || !https {
                    attempt.stop()
                } else {
                    attempt.follow()
                }
            }));
        let mut added = 0;
        for der in &roots {
            if let Ok(c) = reqwest::Certificate::from_der(der) {
                builder = builder.add_root_certificate(c);
                added += 1;
            }
        }
        if added == 0 {
            return Err("none of the CA certificates is usable".to_owned());
        }
        builder.build().map_err(|e| e.to_string())
    }
}

/// One fetch under way; leaving it frees its place.
struct Slot<'a> {
    budget: &'a Mutex<Budget>,
    claim: Claim,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .leave(self.claim);
    }
}

/// The GET itself: status, then the body, [`MAX_BODY`] at most.
async fn get(client: &reqwest::Client, url: &str) -> Result<Fetched, FetchError> {
    let mut resp = client
        .get(url)
        .send()
        .await
        .map_err(|e| FetchError::Unreachable(crate::http_client::cause(&e)))?;
    let status = resp.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Ok(Fetched::NotFound);
    }
    if !status.is_success() {
        return Err(FetchError::Status(status.as_u16()));
    }
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(FetchError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| FetchError::Unreachable(crate::http_client::cause(&e)))?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(FetchError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    certificate_of(&body)
        .map(Fetched::Certificate)
        .map_err(FetchError::Malformed)
}

/// A certificate a service gave for an EK (the cache's row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CachedCertificate {
    pub der: Vec<u8>,
    pub service: String,
}

/// The cached certificate of the EK whose SPKI SHA-256 is `ek_sha256`.
pub(crate) fn cached(tx: &Tx<'_>, ek_sha256: &str) -> Result<Option<CachedCertificate>, DbError> {
    tx.query_opt_map(
        "SELECT certificate, service FROM ek_service_certificates WHERE ek_sha256 = ?1",
        params![ek_sha256],
        |r| {
            Ok(CachedCertificate {
                der: r.get(0)?,
                service: r.get(1)?,
            })
        },
    )
}

/// Keeps what `service` answered at `url` for the EK `ek_sha256`.
pub(crate) fn cache(
    tx: &Tx<'_>,
    ek_sha256: &str,
    service: &str,
    url: &str,
    der: &[u8],
    now: UnixMs,
) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO ek_service_certificates (ek_sha256, service, url, certificate, fetched_at)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (ek_sha256) DO UPDATE SET service = ?2, url = ?3, certificate = ?4, fetched_at = ?5",
        params![ek_sha256, service, url, der, now],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests;
