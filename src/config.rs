//! The agent's configuration file, `/etc/bcd/config.toml` by default.
//!
//! `bc-controlplane agent-config` writes it. Everything in it is parsed and
//! checked here, once, into typed values, so that no other module ever sees a
//! string that might still be malformed; every refusal names the file, the
//! line and what was expected, because an operator edits this file by hand.
//!
//! Optional sections: `[tpm]` (which TPM; absent means the environment or
//! `/dev/tpmrm0`), `[node]` (renewal timing) and `[helper]` (the root
//! helper: present, `bcd node` reaches its node keys only through it).
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use p256::ecdsa::VerifyingKey;
use p256::pkcs8::DecodePublicKey;
use reqwest::Url;
use rustls::pki_types::pem::{PemObject, SectionKind};
use rustls::pki_types::CertificateDer;
use serde::Deserialize;
use toml::Spanned;

use bc_wire::sealing::SealingKey;

pub(crate) const DEFAULT_PATH: &str = "/etc/bcd/config.toml";
pub(crate) const DEFAULT_DATA_DIR: &str = "/var/lib/bcd";

/// Larger than any real configuration (a few PEM pins): a bigger file is a
/// mistake, and reading it whole would only feed the error messages.
pub(crate) const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// The longest message a refusal prints: a bad value is quoted in it, and a
/// 50 MB value must not become 50 MB on stderr or in the journal.
const MAX_MESSAGE_CHARS: usize = 240;

/// `--config F`, shared by every subcommand that reads the configuration.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ConfigArg {
    /// The configuration file
    #[arg(long = "config", value_name = "F", default_value = DEFAULT_PATH)]
    pub path: PathBuf,
}

/// A refused configuration: where, and what was expected there.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is {size} bytes; a bcd configuration is at most {MAX_CONFIG_BYTES} bytes")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("{path}:{line}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// The checked configuration.
#[derive(Debug)]
pub struct Config {
    /// The control plane's base URL; always `https`.
    pub api: Url,
    pub trust_domain: String,
    /// Absolute: a daemon must not depend on its working directory.
    pub data_dir: PathBuf,
    pub pins: Pins,
    /// `[tpm] tcti`: which TPM, as a TCTI string.
    pub tpm_tcti: Option<String>,
    /// `[tpm] ek_roots`: a PEM file of the TPM maker's CA certificates, for
    /// `bcd doctor` to check that the EK certificate chains to them.
    pub tpm_ek_roots: Option<PathBuf>,
    /// `[tpm] owner_auth_file`: the owner hierarchy's authorization, for a
    /// TPM whose owner a previous OS took (a 0600 file; never logged).
    pub tpm_owner_auth_file: Option<PathBuf>,
    /// `[tpm] ek_intermediates`: a PEM bundle of the maker's intermediates
    /// an operator dropped on the machine, sent (untrusted) with a tpm join.
    pub tpm_ek_intermediates: Option<PathBuf>,
    /// `[tpm] ek_certificate`: the TPM's EK certificate (PEM or DER) for a
    /// TPM whose NV holds none (the maker's download, a vendor's delivery
    /// manifest); when set it is sent instead of NV's.
    pub tpm_ek_certificate: Option<PathBuf>,
    /// `[tpm] ek`: which EK ("rsa", "ecc-p256", "ecc-p384"); None lets bcd
    /// choose the first with a certificate in that order.
    pub tpm_ek: Option<crate::tpm::EkKind>,
    /// `[node]`: how `bcd node` keeps its certificate.
    pub node: NodeSettings,
    /// `[helper]`: when present, the node runs unprivileged and never opens
    /// the TPM; `bcd helper` (root) holds it.
    pub helper: Option<HelperSettings>,
    /// `[cloud] metadata_url`: the cloud metadata service `bcd join
    /// --attestor cloud-iid` asks (`None`: the provider's own address).
    pub cloud_metadata_url: Option<String>,
    /// `[cloud] provider = "oidc:<name>"` and `token_file`: this machine
    /// proves itself with an OIDC ID token a local service keeps in a file,
    /// not with its cloud's metadata service.
    pub cloud_oidc: Option<CloudOidc>,
    /// `[site]`: what `bcd site` serves (a site node only).
    pub site: Option<crate::site_settings::SiteSettings>,
}

/// `[cloud] provider = "oidc:<name>"`: the provider the evidence names, and
/// the file its ID token is read from at each join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudOidc {
    /// `oidc:<name>`.
    pub provider: String,
    pub token_file: PathBuf,
}

/// `[helper]`: where `bcd helper` listens and whom it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperSettings {
    /// The unix socket (`/run/bcd/helper.sock`).
    pub socket: PathBuf,
    /// The user `bcd node` runs as, the only one served besides root (`bcd`).
    pub user: String,
}

pub(crate) const DEFAULT_HELPER_SOCKET: &str = "/run/bcd/helper.sock";
pub(crate) const DEFAULT_HELPER_USER: &str = "bcd";

impl Default for HelperSettings {
    fn default() -> Self {
        HelperSettings {
            socket: PathBuf::from(DEFAULT_HELPER_SOCKET),
            user: DEFAULT_HELPER_USER.to_owned(),
        }
    }
}

/// `[node]`: renewal timing. The defaults are the spec's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSettings {
    /// The first retry after a failed renewal (30 s); doubles up to `backoff_max`.
    pub backoff_min: std::time::Duration,
    /// The longest wait between retries (10 min).
    pub backoff_max: std::time::Duration,
}

impl Default for NodeSettings {
    fn default() -> Self {
        NodeSettings {
            backoff_min: std::time::Duration::from_secs(30),
            backoff_max: std::time::Duration::from_secs(600),
        }
    }
}

/// What bcd trusts about its control plane, and nothing else.
pub struct Pins {
    /// The only roots the TLS client accepts.
    pub server_ca: Vec<CertificateDer<'static>>,
    /// The JoinService key that signs every join answer.
    pub join_signing_key: VerifyingKey,
    /// The JoinService key that join tokens are sealed to.
    pub join_encryption_key: SealingKey,
}

impl fmt::Debug for Pins {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pins")
            .field(
                "server_ca",
                &format_args!("{} certificate(s)", self.server_ca.len()),
            )
            .field(
                "join_signing_key",
                &bc_wire::signing::key_id_of(&self.join_signing_key),
            )
            .finish_non_exhaustive()
    }
}

/// The file as written; values keep their spans so that a bad value is
/// reported on its own line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    api: Spanned<String>,
    trust_domain: Spanned<String>,
    data_dir: Option<Spanned<String>>,
    pins: RawPins,
    tpm: Option<RawTpm>,
    node: Option<RawNode>,
    helper: Option<RawHelper>,
    cloud: Option<RawCloud>,
    site: Option<crate::site_settings::RawSite>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCloud {
    metadata_url: Option<Spanned<String>>,
    provider: Option<Spanned<String>>,
    token_file: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHelper {
    socket: Option<Spanned<String>>,
    user: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTpm {
    tcti: Option<Spanned<String>>,
    ek_roots: Option<Spanned<String>>,
    owner_auth_file: Option<Spanned<String>>,
    ek_intermediates: Option<Spanned<String>>,
    ek_certificate: Option<Spanned<String>>,
    ek: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    backoff_min: Option<Spanned<String>>,
    backoff_max: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPins {
    server_ca: Spanned<String>,
    join_signing_key: Spanned<String>,
    join_encryption_key: Spanned<String>,
}

impl Config {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        use bc_wire::file::{self, FileError, Links};
        let read_err = |e: FileError| ConfigError::Read {
            path: path.to_owned(),
            source: e.into(),
        };
        // A regular file only (a FIFO would block, a device never end).
        let (f, meta) = file::open_regular(path, Links::Follow).map_err(read_err)?;
        let bytes = match file::read_opened(f, &meta, MAX_CONFIG_BYTES) {
            Err(FileError::TooLarge(_)) => {
                return Err(ConfigError::TooLarge {
                    path: path.to_owned(),
                    size: meta.len().max(MAX_CONFIG_BYTES + 1),
                })
            }
            read => read.map_err(read_err)?,
        };
        let text = String::from_utf8(bytes).map_err(|e| ConfigError::Invalid {
            path: path.to_owned(),
            line: line_of_bytes(e.as_bytes(), e.utf8_error().valid_up_to()),
            message: "not UTF-8 text".to_owned(),
        })?;
        Config::parse(path, &text)
    }

    /// Checks `text`, the contents of `path` (only used in messages).
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let invalid = |span: Option<Range<usize>>, message: String| ConfigError::Invalid {
            path: path.to_owned(),
            line: span.map_or(1, |s| line_of(text, s.start)),
            message: cut(message),
        };
        let raw: RawConfig = toml::from_str(text)
            .map_err(|e| invalid(e.span(), describe_toml_error(e.message())))?;

        let api = parse_api(raw.api.get_ref())
            .map_err(|m| invalid(Some(raw.api.span()), format!("api: {m}")))?;

        let td = raw.trust_domain.get_ref();
        bc_wire::spiffe::check_trust_domain(td)
            .map_err(|e| invalid(Some(raw.trust_domain.span()), format!("trust_domain: {e}")))?;

        let data_dir = match &raw.data_dir {
            None => PathBuf::from(DEFAULT_DATA_DIR),
            Some(d) => {
                let p = PathBuf::from(d.get_ref());
                if !p.is_absolute() {
                    return Err(invalid(
                        Some(d.span()),
                        format!("data_dir: expected an absolute path, got {:?}", d.get_ref()),
                    ));
                }
                p
            }
        };

        let p = &raw.pins;
        let server_ca = parse_server_ca(p.server_ca.get_ref())
            .map_err(|m| invalid(Some(p.server_ca.span()), format!("pins.server_ca: {m}")))?;
        let join_signing_key = VerifyingKey::from_public_key_pem(p.join_signing_key.get_ref())
            .map_err(|_| {
                invalid(
                    Some(p.join_signing_key.span()),
                    "pins.join_signing_key: not a P-256 public key (PEM \"PUBLIC KEY\")".to_owned(),
                )
            })?;
        let join_encryption_key =
            parse_sealing_key(p.join_encryption_key.get_ref()).ok_or_else(|| {
                invalid(
                    Some(p.join_encryption_key.span()),
                    "pins.join_encryption_key: not a P-256 public key (PEM \"PUBLIC KEY\")"
                        .to_owned(),
                )
            })?;

        let tpm_tcti = match raw.tpm.as_ref().and_then(|t| t.tcti.as_ref()) {
            None => None,
            Some(t) => Some(
                check_tcti(t.get_ref())
                    .map_err(|m| invalid(Some(t.span()), format!("tpm.tcti: {m}")))?,
            ),
        };

        let tpm_path = |field: &str, value: Option<&Spanned<String>>| match value {
            None => Ok(None),
            Some(p) if Path::new(p.get_ref()).is_absolute() => Ok(Some(PathBuf::from(p.get_ref()))),
            Some(p) => Err(invalid(
                Some(p.span()),
                format!(
                    "tpm.{field}: expected an absolute path, got {:?}",
                    p.get_ref()
                ),
            )),
        };
        let raw_tpm = raw.tpm.as_ref();
        let tpm_ek_roots = tpm_path("ek_roots", raw_tpm.and_then(|t| t.ek_roots.as_ref()))?;
        let tpm_ek_intermediates = tpm_path(
            "ek_intermediates",
            raw_tpm.and_then(|t| t.ek_intermediates.as_ref()),
        )?;
        let tpm_ek_certificate = tpm_path(
            "ek_certificate",
            raw_tpm.and_then(|t| t.ek_certificate.as_ref()),
        )?;

        let tpm_ek = match raw_tpm.and_then(|t| t.ek.as_ref()) {
            None => None,
            Some(v) => Some(crate::tpm::EkKind::parse(v.get_ref()).ok_or_else(|| {
                invalid(
                    Some(v.span()),
                    format!(
                        "tpm.ek: expected {}, got {:?}",
                        crate::tpm::EkKind::NAMES,
                        v.get_ref()
                    ),
                )
            })?),
        };

        let tpm_owner_auth_file = tpm_path(
            "owner_auth_file",
            raw_tpm.and_then(|t| t.owner_auth_file.as_ref()),
        )?;

        let mut node = NodeSettings::default();
        if let Some(n) = &raw.node {
            for (field, name, target) in [
                (&n.backoff_min, "backoff_min", &mut node.backoff_min),
                (&n.backoff_max, "backoff_max", &mut node.backoff_max),
            ] {
                if let Some(v) = field {
                    *target = parse_duration(v.get_ref())
                        .map_err(|m| invalid(Some(v.span()), format!("node.{name}: {m}")))?;
                }
            }
            if node.backoff_min > node.backoff_max {
                let span = n.backoff_min.as_ref().map(|v| v.span());
                return Err(invalid(
                    span,
                    "node.backoff_min: longer than node.backoff_max".to_owned(),
                ));
            }
        }

        let helper = match &raw.helper {
            None => None,
            Some(h) => {
                let mut settings = HelperSettings::default();
                if let Some(p) = &h.socket {
                    if !Path::new(p.get_ref()).is_absolute() {
                        return Err(invalid(
                            Some(p.span()),
                            format!(
                                "helper.socket: expected an absolute path, got {:?}",
                                p.get_ref()
                            ),
                        ));
                    }
                    settings.socket = PathBuf::from(p.get_ref());
                }
                if let Some(u) = &h.user {
                    if !is_user_name(u.get_ref()) {
                        return Err(invalid(
                            Some(u.span()),
                            format!("helper.user: expected a user name, got {:?}", u.get_ref()),
                        ));
                    }
                    settings.user = u.get_ref().clone();
                }
                Some(settings)
            }
        };

        let (cloud_provider, cloud_token_file) = match &raw.cloud {
            Some(c) => (c.provider.clone(), c.token_file.clone()),
            None => (None, None),
        };
        let cloud_oidc = match (cloud_provider, cloud_token_file) {
            (None, None) => None,
            (Some(p), Some(f)) => {
                let name = p.get_ref().strip_prefix("oidc:").unwrap_or_default();
                let ok = !name.is_empty()
                    && name.len() <= 32
                    && name.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'
                    });
                if !ok {
                    return Err(invalid(
                        Some(p.span()),
                        format!(
                            "cloud.provider: expected oidc:<name> (the control plane's [cloud_iid.oidc.<name>]; GCP, AWS and Azure are found from DMI), got {:?}",
                            p.get_ref()
                        ),
                    ));
                }
                if !f.get_ref().starts_with('/') {
                    return Err(invalid(
                        Some(f.span()),
                        format!(
                            "cloud.token_file: expected an absolute path, got {:?}",
                            f.get_ref()
                        ),
                    ));
                }
                Some(CloudOidc {
                    provider: p.get_ref().clone(),
                    token_file: PathBuf::from(f.get_ref()),
                })
            }
            (Some(p), None) => {
                return Err(invalid(
                    Some(p.span()),
                    "cloud.provider needs cloud.token_file (where the ID token is)".to_owned(),
                ))
            }
            (None, Some(f)) => {
                return Err(invalid(
                    Some(f.span()),
                    "cloud.token_file needs cloud.provider = \"oidc:<name>\"".to_owned(),
                ))
            }
        };
        let cloud_metadata_url = match raw.cloud.and_then(|c| c.metadata_url) {
            None => None,
            Some(v) => {
                let u = v.get_ref();
                // The metadata services speak plain HTTP on a link-local
                // address; tests point it at loopback.
                if !u.starts_with("http://") || u.len() > 256 {
                    return Err(invalid(
                        Some(v.span()),
                        format!("cloud.metadata_url: expected http://HOST[:PORT], got {u:?}"),
                    ));
                }
                Some(u.trim_end_matches('/').to_owned())
            }
        };

        let site = match &raw.site {
            None => None,
            Some(s) => Some(
                s.check(parse_api)
                    .map_err(|(span, m)| invalid(Some(span), m))?,
            ),
        };

        Ok(Config {
            site,
            helper,
            cloud_metadata_url,
            cloud_oidc,
            tpm_ek_roots,
            tpm_owner_auth_file,
            tpm_ek_intermediates,
            tpm_ek_certificate,
            tpm_ek,
            node,
            tpm_tcti,
            api,
            trust_domain: td.clone(),
            data_dir,
            pins: Pins {
                server_ca,
                join_signing_key,
                join_encryption_key,
            },
        })
    }
}

/// A POSIX portable user name (letters, digits, `.`, `_`, `-`; not first
/// a `-`), at most 32 characters, as useradd takes them.
fn is_user_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    line_of_bytes(text.as_bytes(), offset)
}

fn line_of_bytes(bytes: &[u8], offset: usize) -> usize {
    let end = offset.min(bytes.len());
    bytes[..end].iter().filter(|&&b| b == b'\n').count() + 1
}

/// `message` cut to [`MAX_MESSAGE_CHARS`], saying how much was left out.
fn cut(message: String) -> String {
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        None => message,
        Some((end, _)) => format!(
            "{}… ({} more bytes not shown)",
            &message[..end],
            message.len() - end
        ),
    }
}

/// Turns serde's wording (`unknown field `x`, expected one of `a`, `b``)
/// into the file's vocabulary (keys), keeping anything else as toml said it.
fn describe_toml_error(message: &str) -> String {
    let message = message.trim();
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (key, expected) = match rest.split_once(", expected ") {
            Some((k, e)) => (k, Some(e)),
            None => (rest, None),
        };
        let key = key.trim_matches('`');
        return match expected {
            Some(e) => format!("unknown key {key:?}; expected {}", e.replace('`', "")),
            None => format!("unknown key {key:?}"),
        };
    }
    if let Some(rest) = message.strip_prefix("missing field ") {
        return format!("missing key {:?}", rest.trim_matches('`'));
    }
    message.replace('\n', " ")
}

fn parse_api(s: &str) -> Result<Url, String> {
    let url =
        Url::parse(s).map_err(|e| format!("not a URL ({e}); expected https://HOST[:PORT]"))?;
    if url.scheme() != "https" {
        return Err(format!(
            "expected an https URL, got scheme {:?}: bcd talks to the control plane over TLS only",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("expected https://HOST[:PORT], the URL has no host".to_owned());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("expected no user or password in the URL".to_owned());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("expected no query or fragment in the URL".to_owned());
    }
    Ok(url)
}

/// `90s`, `15m`, `24h`, `7d`: a positive whole number and one unit.
pub(crate) fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let expected = "expected a duration like 30s, 10m, 24h or 7d";
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("{s:?}: {expected}"))?;
    let secs = match unit {
        "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        "d" => n.checked_mul(86400),
        _ => None,
    };
    match secs {
        Some(secs) if secs > 0 => Ok(std::time::Duration::from_secs(secs)),
        _ => Err(format!("{s:?}: {expected}")),
    }
}

/// The TCTIs bcd can use, checked here because tss-esapi silently drops what
/// it does not know (`swtpm:path=…` would quietly become localhost:2321) and
/// takes a bare `device` to mean `/dev/tpm0`, bypassing the resource manager.
fn check_tcti(t: &str) -> Result<String, String> {
    let expected =
        "expected device:/dev/tpmrmN, swtpm:host=H,port=P, mssim:host=H,port=P, tabrmd, or none (no TPM)";
    let (kind, conf) = t.split_once(':').unwrap_or((t, ""));
    match kind {
        crate::tpm::NO_TPM if conf.is_empty() => Ok(t.to_owned()),
        "device" if conf.starts_with('/') => Ok(t.to_owned()),
        "device" => Err(format!("{t:?} names no device path; {expected}")),
        "swtpm" | "mssim" => {
            for pair in conf.split(',').filter(|p| !p.is_empty()) {
                match pair.split_once('=') {
                    Some(("host", h)) if !h.is_empty() => {}
                    Some(("port", p)) if p.parse::<u16>().is_ok() => {}
                    _ => {
                        return Err(format!(
                            "{t:?}: unknown or empty setting {pair:?}; {expected}"
                        ))
                    }
                }
            }
            Ok(t.to_owned())
        }
        "tabrmd" => Ok(t.to_owned()),
        _ => Err(format!("{t:?} is not a TCTI bcd supports; {expected}")),
    }
}

fn parse_server_ca(pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let mut certs = Vec::new();
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem.as_bytes()) {
        match section {
            Ok((SectionKind::Certificate, der)) => certs.push(CertificateDer::from(der)),
            // Never echo the block: a misplaced private key must not reach a log.
            Ok((kind, _)) => {
                return Err(format!(
                    "expected only PEM \"CERTIFICATE\" blocks, found a {kind:?} block"
                ))
            }
            Err(e) => {
                return Err(format!(
                    "not PEM ({e}); expected one or more PEM \"CERTIFICATE\" blocks"
                ))
            }
        }
    }
    if certs.is_empty() {
        return Err("expected one or more PEM \"CERTIFICATE\" blocks, found none".to_owned());
    }
    // The TLS client builds its root store from these; refuse here what it would refuse.
    let mut roots = rustls::RootCertStore::empty();
    for (i, c) in certs.iter().enumerate() {
        roots
            .add(c.clone())
            .map_err(|e| format!("certificate {} is not a usable CA certificate: {e}", i + 1))?;
    }
    Ok(certs)
}

fn parse_sealing_key(pem: &str) -> Option<SealingKey> {
    let key = p256::PublicKey::from_public_key_pem(pem).ok()?;
    let der = p256::pkcs8::EncodePublicKey::to_public_key_der(&key).ok()?;
    SealingKey::from_spki_der(der.as_bytes()).ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use p256::pkcs8::{EncodePublicKey, LineEnding};

    /// The pieces of a valid config, so that a test can break one of them.
    pub(crate) struct Parts {
        pub api: String,
        pub data_dir: String,
        pub server_ca: String,
        pub join_signing_key: String,
        pub join_encryption_key: String,
    }

    impl Parts {
        pub(crate) fn new(api: &str, data_dir: &str) -> Parts {
            let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
            let sign = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
            let enc = p256::SecretKey::from_slice(&[9u8; 32]).unwrap();
            Parts {
                api: api.to_owned(),
                data_dir: data_dir.to_owned(),
                server_ca: ca.cert.pem(),
                join_signing_key: sign
                    .verifying_key()
                    .to_public_key_pem(LineEnding::LF)
                    .unwrap(),
                join_encryption_key: enc.public_key().to_public_key_pem(LineEnding::LF).unwrap(),
            }
        }

        /// Line 1 api, 2 trust_domain, 3 data_dir, 5 [pins], 6 server_ca.
        pub(crate) fn render(&self) -> String {
            format!(
                "api = \"{}\"\ntrust_domain = \"bc.test\"\ndata_dir = \"{}\"\n\n[pins]\nserver_ca = \"\"\"\n{}\"\"\"\njoin_signing_key = \"\"\"\n{}\"\"\"\njoin_encryption_key = \"\"\"\n{}\"\"\"\n",
                self.api, self.data_dir, self.server_ca, self.join_signing_key, self.join_encryption_key
            )
        }
    }

    pub(crate) fn sample(api: &str, data_dir: &str) -> String {
        Parts::new(api, data_dir).render()
    }

    fn err(text: &str) -> String {
        match Config::parse(Path::new("/etc/bcd/config.toml"), text) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn cloud_oidc_names_a_provider_and_its_token_file_together() {
        let base = sample("https://127.0.0.1:8443", "/tmp/x");
        let c = Config::parse(
            Path::new("c.toml"),
            &format!("{base}[cloud]\nprovider = \"oidc:wi\"\ntoken_file = \"/run/wi/token\"\n"),
        )
        .unwrap();
        assert_eq!(
            c.cloud_oidc,
            Some(CloudOidc {
                provider: "oidc:wi".into(),
                token_file: "/run/wi/token".into()
            })
        );
        for (extra, want) in [
            (
                "provider = \"gcp\"\ntoken_file = \"/t\"\n",
                "expected oidc:<name>",
            ),
            (
                "provider = \"oidc:\"\ntoken_file = \"/t\"\n",
                "expected oidc:<name>",
            ),
            ("provider = \"oidc:wi\"\n", "needs cloud.token_file"),
            ("token_file = \"/t\"\n", "needs cloud.provider"),
            (
                "provider = \"oidc:wi\"\ntoken_file = \"t\"\n",
                "an absolute path",
            ),
        ] {
            let e = err(&format!("{base}[cloud]\n{extra}"));
            assert!(e.contains(want), "{extra}: {e}");
        }
    }

    #[test]
    fn accepts_the_sample() {
        let c = Config::parse(
            Path::new("c.toml"),
            &sample("https://127.0.0.1:8443", "/tmp/x"),
        )
        .unwrap();
        assert_eq!(c.api.as_str(), "https://127.0.0.1:8443/");
        assert_eq!(c.trust_domain, "bc.test");
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.pins.server_ca.len(), 1);
    }

    #[test]
    fn tpm_owner_auth_file_is_an_absolute_path() {
        let base = sample("https://h", "/x");
        let with = |p: &str| format!("{base}\n[tpm]\nowner_auth_file = \"{p}\"\n");
        let c = Config::parse(
            Path::new("/etc/bcd/config.toml"),
            &with("/etc/bcd/owner.auth"),
        )
        .unwrap();
        assert_eq!(
            c.tpm_owner_auth_file.as_deref(),
            Some(Path::new("/etc/bcd/owner.auth"))
        );
        assert!(err(&with("owner.auth")).contains("tpm.owner_auth_file"));
    }

    #[test]
    fn tpm_tcti_is_checked_because_tss_esapi_drops_unknown_settings() {
        let base = sample("https://h", "/x");
        let with = |t: &str| format!("{base}\n[tpm]\ntcti = \"{t}\"\n");
        for good in [
            "none",
            "device:/dev/tpmrm0",
            "swtpm:host=127.0.0.1,port=2321",
            "mssim:",
            "tabrmd",
        ] {
            let c = Config::parse(Path::new("c.toml"), &with(good)).unwrap();
            assert_eq!(c.tpm_tcti.as_deref(), Some(good));
        }
        for bad in [
            "device",
            "swtpm:path=/run/swtpm.sock",
            "swtpm:port=x",
            "pcap:x",
        ] {
            let e = Config::parse(Path::new("c.toml"), &with(bad))
                .unwrap_err()
                .to_string();
            assert!(e.contains("tpm.tcti"), "{bad}: {e}");
        }
        assert!(Config::parse(Path::new("c.toml"), &base)
            .unwrap()
            .tpm_tcti
            .is_none());
        // [tpm] ek_intermediates: an absolute path, typed.
        let with = |p: &str| format!("{base}\n[tpm]\nek_intermediates = \"{p}\"\n");
        let c = Config::parse(Path::new("c.toml"), &with("/etc/bcd/ek-int.pem")).unwrap();
        assert_eq!(
            c.tpm_ek_intermediates.as_deref(),
            Some(Path::new("/etc/bcd/ek-int.pem"))
        );
        let e = Config::parse(Path::new("c.toml"), &with("ek-int.pem"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tpm.ek_intermediates: expected an absolute path"),
            "{e}"
        );
    }

    #[test]
    fn tpm_ek_is_one_of_the_known_eks() {
        use crate::tpm::EkKind;
        let base = sample("https://h", "/x");
        assert_eq!(
            Config::parse(Path::new("c.toml"), &base).unwrap().tpm_ek,
            None
        );
        let with = |k: &str| format!("{base}\n[tpm]\nek = \"{k}\"\n");
        for (name, kind) in [
            ("rsa", EkKind::Rsa),
            ("ecc-p256", EkKind::EccP256),
            ("ecc-p384", EkKind::EccP384),
        ] {
            let c = Config::parse(Path::new("c.toml"), &with(name)).unwrap();
            assert_eq!(c.tpm_ek, Some(kind));
        }
        let e = Config::parse(Path::new("c.toml"), &with("ecc"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tpm.ek: expected \"rsa\", \"ecc-p256\" or \"ecc-p384\", got \"ecc\""),
            "{e}"
        );
    }

    #[test]
    fn node_backoff_parses_and_is_ordered() {
        let base = sample("https://h", "/x");
        let c = Config::parse(Path::new("c.toml"), &base).unwrap();
        assert_eq!(c.node, NodeSettings::default());
        let c = Config::parse(
            Path::new("c.toml"),
            &format!("{base}\n[node]\nbackoff_min = \"1s\"\nbackoff_max = \"4s\"\n"),
        )
        .unwrap();
        assert_eq!(c.node.backoff_min, std::time::Duration::from_secs(1));
        assert_eq!(c.node.backoff_max, std::time::Duration::from_secs(4));
        let e = Config::parse(
            Path::new("c.toml"),
            &format!("{base}\n[node]\nbackoff_min = \"soon\"\n"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("node.backoff_min") && e.contains("30s"), "{e}");
        let e = Config::parse(
            Path::new("c.toml"),
            &format!("{base}\n[node]\nbackoff_min = \"1h\"\nbackoff_max = \"1m\"\n"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("longer than"), "{e}");
        assert!(parse_duration("0s").is_err() && parse_duration("7d").is_ok());
    }

    #[test]
    fn helper_section_is_typed() {
        let base = sample("https://cp.example", "/var/lib/bcd");
        let c = Config::parse(Path::new("c.toml"), &base).unwrap();
        assert_eq!(c.helper, None);
        let c = Config::parse(Path::new("c.toml"), &format!("{base}\n[helper]\n")).unwrap();
        assert_eq!(c.helper, Some(HelperSettings::default()));
        let text = format!("{base}\n[helper]\nsocket = \"/run/x.sock\"\nuser = \"node-agent\"\n");
        let h = Config::parse(Path::new("c.toml"), &text)
            .unwrap()
            .helper
            .unwrap();
        assert_eq!(
            (h.socket.to_str(), h.user.as_str()),
            (Some("/run/x.sock"), "node-agent")
        );
        let e = err(&format!("{base}\n[helper]\nsocket = \"x.sock\"\n"));
        assert!(
            e.contains("helper.socket: expected an absolute path"),
            "{e}"
        );
        let e = err(&format!("{base}\n[helper]\nuser = \"root; rm\"\n"));
        assert!(e.contains("helper.user: expected a user name"), "{e}");
    }

    #[test]
    fn data_dir_defaults() {
        let text = sample("https://h", "/x").replace("data_dir = \"/x\"\n", "");
        let c = Config::parse(Path::new("c.toml"), &text).unwrap();
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    }

    #[test]
    fn unknown_key_names_file_line_and_expected_keys() {
        let text = sample("https://h", "/x").replace("trust_domain", "apii = 1\ntrust_domain");
        assert_eq!(
            err(&text),
            "/etc/bcd/config.toml:2: unknown key \"apii\"; expected one of api, trust_domain, data_dir, pins, tpm, node, helper, cloud, site"
        );
    }

    #[test]
    fn site_section_is_typed_and_names_the_bad_line() {
        let base = sample("https://h", "/x");
        let site = |listen: &str, public: &str, dir: &str, api: &str| {
            format!(
                "{base}\n[site]\nid = \"site_a\"\nlisten = \"{listen}\"\npublic_url = \"{public}\"\nramdisk_dir = \"{dir}\"\nramdisk_api = \"{api}\"\n"
            )
        };
        let good = site(
            "0.0.0.0:8080",
            "http://10.0.0.5:8080/",
            "/srv/ramdisk",
            "https://cp:8443",
        );
        let c = Config::parse(Path::new("c.toml"), &good).unwrap();
        let s = c.site.unwrap();
        assert_eq!(s.public_url, "http://10.0.0.5:8080");
        assert_eq!(s.listen.port(), 8080);
        assert!(err(&site("8080", "http://a", "/d", "https://cp"))
            .contains("site.listen: expected ADDRESS:PORT"));
        assert!(err(&site("0.0.0.0:1", "https://a", "/d", "https://cp"))
            .contains("site.public_url: expected an http URL"));
        assert!(err(&site("0.0.0.0:1", "http://a", "d", "https://cp"))
            .contains("site.ramdisk_dir: expected an absolute path"));
        assert!(err(&site("0.0.0.0:1", "http://a", "/d", "http://cp"))
            .contains("site.ramdisk_api: expected an https URL"));
        // The connection caps: defaults, a per-source cap never above the
        // total, and a bad value named.
        assert_eq!((s.max_connections, s.max_per_source), (256, 8));
        let capped = format!("{good}max_connections = 4\nmax_connections_per_source = 6\n");
        let s = Config::parse(Path::new("c.toml"), &capped)
            .unwrap()
            .site
            .unwrap();
        assert_eq!((s.max_connections, s.max_per_source), (4, 4));
        assert!(err(&format!("{good}max_connections_per_source = 0\n"))
            .contains("site.max_connections_per_source: expected a number of connections from 1 to 65536, got 0"));
    }

    #[test]
    fn unknown_key_in_pins() {
        let text = sample("https://h", "/x").replace("[pins]\n", "[pins]\nnode_ca = \"x\"\n");
        let e = err(&text);
        assert!(
            e.starts_with(
                "/etc/bcd/config.toml:6: unknown key \"node_ca\"; expected one of server_ca"
            ),
            "{e}"
        );
    }

    #[test]
    fn api_must_be_https() {
        let e = err(&sample("http://127.0.0.1:1", "/x"));
        assert!(
            e.starts_with("/etc/bcd/config.toml:1: api: expected an https URL"),
            "{e}"
        );
        let e = err(&sample("not a url", "/x"));
        assert!(
            e.starts_with("/etc/bcd/config.toml:1: api: not a URL"),
            "{e}"
        );
    }

    #[test]
    fn bad_trust_domain() {
        let text = sample("https://h", "/x").replace("bc.test", "BC Test");
        assert!(
            err(&text).starts_with("/etc/bcd/config.toml:2: trust_domain: invalid trust domain")
        );
    }

    #[test]
    fn relative_data_dir() {
        let e = err(&sample("https://h", "var/lib/bcd"));
        assert!(
            e.starts_with("/etc/bcd/config.toml:3: data_dir: expected an absolute path"),
            "{e}"
        );
    }

    #[test]
    fn bad_keys_are_named_on_their_line() {
        let mut parts = Parts::new("https://h", "/x");
        let good = parts.render();
        let line = good[..good.find("join_signing_key").unwrap()]
            .matches('\n')
            .count()
            + 1;
        parts.join_signing_key = "garbage".to_owned();
        assert_eq!(
            err(&parts.render()),
            format!("/etc/bcd/config.toml:{line}: pins.join_signing_key: not a P-256 public key (PEM \"PUBLIC KEY\")")
        );
        let mut parts = Parts::new("https://h", "/x");
        parts.join_encryption_key = parts.server_ca.clone();
        assert!(err(&parts.render()).contains(": pins.join_encryption_key: not a P-256 public key"));
    }

    #[test]
    fn server_ca_refuses_other_blocks_without_echoing_them() {
        let key = p256::SecretKey::from_slice(&[3u8; 32]).unwrap();
        let mut parts = Parts::new("https://h", "/x");
        parts.server_ca = p256::pkcs8::EncodePrivateKey::to_pkcs8_pem(&key, LineEnding::LF)
            .unwrap()
            .to_string();
        let e = err(&parts.render());
        assert!(
            e.starts_with(
                "/etc/bcd/config.toml:6: pins.server_ca: expected only PEM \"CERTIFICATE\" blocks"
            ),
            "{e}"
        );
        assert!(!e.contains("MIG"), "{e}");
        parts.server_ca = String::new();
        assert!(err(&parts.render()).contains("found none"));
    }

    #[test]
    fn missing_key() {
        let text = sample("https://h", "/x").replace("trust_domain = \"bc.test\"\n", "");
        assert!(err(&text).contains("missing key \"trust_domain\""));
    }

    #[test]
    fn syntax_error_has_a_line() {
        let text = sample("https://h", "/x").replace("data_dir = \"/x\"", "data_dir = /x");
        assert!(
            err(&text).starts_with("/etc/bcd/config.toml:3: "),
            "{}",
            err(&text)
        );
    }

    #[test]
    fn a_huge_bad_value_is_cut_in_the_message() {
        let huge = "v".repeat(2 << 20);
        for (text, echoed) in [
            (sample("https://h", &huge), true),
            (sample(&format!("http://{huge}"), "/x"), false),
            (
                sample("https://h", "/x").replace("[pins]", &format!("[pins]\n{huge} = 1")),
                true,
            ),
        ] {
            let e = err(&text);
            assert!(e.len() < 600, "{} bytes: {}", e.len(), &e[..600]);
            assert_eq!(e.contains("more bytes not shown"), echoed, "{e}");
        }
    }

    /// `--config` naming a FIFO or a link to /dev/zero: refused at once
    /// (the open used to block, the read never to end).
    #[test]
    fn a_config_that_is_no_regular_file_is_refused_promptly() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.toml");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let zero = dir.path().join("zero.toml");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        for (path, why) in [
            (fifo, "it is a FIFO, not a regular file"),
            (zero, "it is a character device, not a regular file"),
        ] {
            let (tx, rx) = std::sync::mpsc::channel();
            let p = path.clone();
            std::thread::spawn(move || {
                let _ = tx.send(Config::load(&p).map(|_| ()).map_err(|e| e.to_string()));
            });
            let e = rx
                .recv_timeout(std::time::Duration::from_secs(20))
                .expect("Config::load did not finish")
                .unwrap_err();
            assert_eq!(e, format!("cannot read {}: {why}", path.display()));
        }
    }

    #[test]
    fn a_file_larger_than_the_limit_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let mut text = sample("https://h", "/x");
        text.push_str(&format!("# {}\n", "x".repeat(MAX_CONFIG_BYTES as usize)));
        std::fs::write(&path, &text).unwrap();
        let e = Config::load(&path).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{} is {} bytes; a bcd configuration is at most 1048576 bytes",
                path.display(),
                text.len()
            )
        );
        std::fs::write(&path, b"api = \"\xff\"\n").unwrap();
        let e = Config::load(&path).unwrap_err().to_string();
        assert!(e.ends_with(":1: not UTF-8 text"), "{e}");
    }
}
