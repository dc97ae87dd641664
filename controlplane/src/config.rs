//! `DIR/controlplane.toml`: the optional settings of a control plane.
//!
//! Read by `serve` (through [`crate::plane::join::JoinService::open`]) and by every
//! CLI command, so a broken file is reported before anything runs. Unknown
//! keys are errors, and every error names the file and the line, because a
//! typo in a security setting (`node_key = "certifed"`) must not silently
//! fall back to a default.
//!
//! ```toml
//! [tpm]
//! node_key = "certified"            # or "any"
//! challenge_ttl = "5m"              # at most 5m
//! enrollment_retry_after = "30s"    # JoinPending.retry_after_seconds
//! enrollment = true                 # false: an unknown EK is refused (unknown-ek), no join request
//! [tpm.pcr_policy]                  # optional: SHA-256 PCR values
//! "0" = "<hex sha256>"
//! [tpm.pcr_policy.sha1]             # optional: SHA-1 values (TPMs with only a SHA-1 bank)
//! "0" = "<hex sha1>"
//! [tpm.ek_services]                 # EK certificates not in NV, from the maker's service
//! timeout = "10s"                   # each fetch, whole (1s to 60s)
//! ca_bundle = "services-ca.pem"     # relative to DIR; default: the system's CA roots
//! [tpm.ek_services.intel]           # and [tpm.ek_services.amd]
//! url = "https://ekop.intel.com/ekcertservice/{ek}"  # "" turns it off (amd: https://ftpm.amd.com/pki/aia/{ek})
//! manufacturer = "INTC"             # TPM_PT_MANUFACTURER of its TPMs (amd: "AMD")
//!
//! [x509pop]
//! grace = "7d"                      # how long after expiry a certificate re-joins (0s to 365d)
//! window = "60s"                    # clientTime vs database time, either way (1s to 1h)
//!
//! [server]
//! max_connections = 4096            # default: from RLIMIT_NOFILE (raised to its hard limit)
//! max_connections_per_source = 512  # default: a quarter of max_connections
//! request_timeout = "30s"           # handshake + headers + body + handling (1s to 10m)
//!
//! [events]
//! retention = "90d"                 # events older than this are pruned (1d to 3650d)
//!
//! [discovery]
//! cert_ttl = "2h"                   # a ramdisk's certificate (1m to 2h)
//! lease_ttl = "30s"                 # the boot lease (1s to 7d)
//! max_age = "15m"                   # an assertion is stale this long after issued_at (1m to 1h)
//! approval = "unknown-machines"     # a join of a boot entry with no expected EK waits for `requests approve`
//!                                   # (default: unset, the boot LAN is trusted)
//! approval_retry_after = "30s"      # JoinPending.retry_after_seconds while it waits (1s to 1h)
//! allowed_kinds = ["inventory.refresh", …]  # default: DISCOVERY_ALLOWED_KINDS
//!
//! [cloud_iid]
//! audience = "https://cp.example.com:8443"  # the api URL agents use (GCP tokens must name it)
//! max_age = "10m"                   # identity documents older than this are refused (1m to 1h)
//! roles = ["node"]                  # the roles a VM may join as (this default); `cloud resolve add --role` adds per account
//! [cloud_iid.gcp]
//! jwks = "gcp-jwks.json"            # Google's signing keys (JWKS), relative to DIR
//! [cloud_iid.aws]
//! certificates = "aws-certs.pem"    # AWS's RSA certificates of the regions you use, relative to DIR
//! [cloud_iid.azure]                 # needs audience (the attested document's nonce is derived from it)
//! roots = "azure-roots.pem"         # the CA roots Azure's signer certificate chains to, relative to DIR
//! intermediates = "azure-int.pem"   # optional: issuers the document may not carry
//! signer = "metadata.azure.com"     # the name the signer certificate must bear (this default)
//! [cloud_iid.oidc.<name>]           # a generic OIDC provider: agents send provider "oidc:<name>"
//! issuer = "https://issuer.example" # the iss its ID tokens name (https only)
//! audience = "…"                    # the aud they must name (default: [cloud_iid] audience)
//! jwks = "issuer-jwks.json"         # its keys, relative to DIR; else fetched from the issuer:
//! ca_bundle = "issuer-ca.pem"       #   the issuer's TLS roots (default: the system's)
//! timeout = "10s"                   #   the whole fetch (1s to 60s)
//! cache = "1h"                      #   how long fetched keys are used (1m to 24h)
//! account_claim = "project"         # the claim that is the account (default: the issuer's host)
//! zone_claim = "zone"               # the claim that is the zone (default: none)
//! instance_claim = "sub"            # the claim that is the instance (this default)
//! max_age = "10m"                   # default: [cloud_iid] max_age
//!
//! [leases]
//! allowed_kinds = ["diag.*", "inventory.refresh"]  # what a leased node runs (this default; no logs.collect:
//!                                   # its logs may hold the lessee's data); each must match a kind a node runs
//!
//! [database]                        # absent: SQLite, DIR/controlplane.db; present: PostgreSQL
//! url = "postgres://bcd@db.example:5432/bcd?sslmode=verify-full"  # or postgresql://; no password in it
//! password_file = "/etc/bc-controlplane/db.password"  # optional; mode 0600 or 0400; relative: DIR
//! ca_file = "db-ca.pem"             # the server certificate's roots, relative to DIR; required unless
//!                                   # sslmode=disable, which only a loopback host or a Unix socket may use
//! max_connections = 8               # the pool (1 to 256; default 2 × cores + 4)
//! ```
//!
//! `--database-url` and `BC_CONTROLPLANE_DATABASE_URL` win over `url` (the
//! flag first), `BC_CONTROLPLANE_DATABASE_PASSWORD_FILE` and `_CA_FILE` over
//! their keys; with no `[database]` they make one ([`load_with`]).

use std::collections::BTreeMap;
use std::path::Path;

use bc_wire::pcr::PcrBank;
use serde::Deserialize;
use toml::Spanned;

// Each attestor's own settings, which `controlplane.toml` carries.
pub use crate::attestors::discovery::DISCOVERY_ALLOWED_KINDS;
pub(crate) use crate::attestors::discovery::{
    DiscoveryApproval, DiscoveryConfig, MAX_DISCOVERY_CERT_TTL_MS,
};
use crate::attestors::tpm::{NodeKeyPolicy, TpmConfig, MAX_CHALLENGE_TTL_MS};
use crate::attestors::x509pop::X509PopConfig;

use crate::store::settings as database;
pub use database::DatabaseOverrides;
pub(crate) use database::{DatabaseConfig, SettingsError};

pub(crate) const CONFIG_FILE: &str = "controlplane.toml";

/// Longest `enrollment_retry_after`: an agent waiting longer than this for
/// an operator learns nothing new by waiting.
const MAX_RETRY_AFTER_SECONDS: i64 = 3600;

/// Longest `x509pop.grace`: a machine off for more than a year is a new
/// machine as far as trust goes; it joins again with a token or its TPM.
const MAX_X509POP_GRACE_MS: i64 = 365 * 86_400_000;
/// Longest `x509pop.window`: beyond an hour a proof is no longer fresh, and
/// every spent proof stays in `attestation_uses` for a window.
const MAX_X509POP_WINDOW_MS: i64 = 3_600_000;

/// The whole configuration; every field has a default, so a DIR without the
/// file gets exactly the spec's defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub tpm: TpmConfig,
    pub x509pop: X509PopConfig,
    pub server: ServerConfig,
    pub events: EventsConfig,
    pub discovery: DiscoveryConfig,
    pub cloud_iid: crate::attestors::cloud_iid::CloudIidConfig,
    pub leases: crate::model::leases::LeasesConfig,
    /// `None`: SQLite in DIR.
    pub database: Option<DatabaseConfig>,
}

/// The longest `[discovery] max_age`: an hour (bcd site's own assertions
/// carry a not_after of at most 15 minutes anyway).
const MAX_DISCOVERY_MAX_AGE_MS: i64 = 3_600_000;
const MAX_LEASE_TTL_MS: i64 = 7 * 86_400_000;

/// `[server]`: what one client, or all of them, may hold of the server.
/// `None` is "derive from the file descriptor limit" (see `http::Limits`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    pub max_connections: Option<usize>,
    pub max_connections_per_source: Option<usize>,
    pub(crate) request_timeout_ms: i64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: None,
            max_connections_per_source: None,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
        }
    }
}

/// `[events]`: how long the event log keeps what it recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventsConfig {
    pub retention_ms: i64,
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            retention_ms: DEFAULT_EVENTS_RETENTION_MS,
        }
    }
}

/// A request (handshake, headers, body and handling) must be done in this.
const DEFAULT_REQUEST_TIMEOUT_MS: i64 = 30_000;
const MAX_REQUEST_TIMEOUT_MS: i64 = 600_000;
/// Events are kept 90 days unless `[events] retention` says otherwise.
pub(crate) const DEFAULT_EVENTS_RETENTION_MS: i64 = 90 * 86_400_000;
const MAX_EVENTS_RETENTION_MS: i64 = 3650 * 86_400_000;
/// The most connections a setting may allow (each one costs a descriptor
/// and a TLS session's memory).
const MAX_CONNECTIONS: i64 = 1_000_000;

/// A config file's errors are the database settings' errors (a file, a
/// line, or a command-line or environment setting): one type, so the
/// settings read inside the config need no conversion.
pub type ConfigError = SettingsError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    tpm: Option<RawTpm>,
    x509pop: Option<RawX509Pop>,
    server: Option<RawServer>,
    events: Option<RawEvents>,
    discovery: Option<RawDiscovery>,
    cloud_iid: Option<RawCloudIid>,
    leases: Option<RawLeases>,
    database: Option<database::RawDatabase>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLeases {
    allowed_kinds: Option<Spanned<Vec<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCloudIid {
    audience: Option<Spanned<String>>,
    max_age: Option<Spanned<String>>,
    roles: Option<Spanned<Vec<String>>>,
    gcp: Option<RawCloudGcp>,
    aws: Option<RawCloudAws>,
    azure: Option<RawCloudAzure>,
    oidc: Option<BTreeMap<String, RawCloudOidc>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCloudOidc {
    issuer: Spanned<String>,
    audience: Option<Spanned<String>>,
    jwks: Option<Spanned<String>>,
    ca_bundle: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    cache: Option<Spanned<String>>,
    account_claim: Option<Spanned<String>>,
    zone_claim: Option<Spanned<String>>,
    instance_claim: Option<Spanned<String>>,
    max_age: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCloudAzure {
    roots: Spanned<String>,
    intermediates: Option<Spanned<String>>,
    signer: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCloudAws {
    certificates: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCloudGcp {
    jwks: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDiscovery {
    cert_ttl: Option<Spanned<String>>,
    lease_ttl: Option<Spanned<String>>,
    allowed_kinds: Option<Spanned<Vec<String>>>,
    max_age: Option<Spanned<String>>,
    approval: Option<Spanned<String>>,
    approval_retry_after: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    max_connections: Option<Spanned<i64>>,
    max_connections_per_source: Option<Spanned<i64>>,
    request_timeout: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvents {
    retention: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawX509Pop {
    grace: Option<Spanned<String>>,
    window: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTpm {
    node_key: Option<Spanned<String>>,
    challenge_ttl: Option<Spanned<String>>,
    enrollment_retry_after: Option<Spanned<String>>,
    enrollment: Option<bool>,
    pcr_policy: Option<RawPcrPolicy>,
    ek_services: Option<RawEkServices>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEkServices {
    timeout: Option<Spanned<String>>,
    ca_bundle: Option<Spanned<String>>,
    intel: Option<RawEkService>,
    amd: Option<RawEkService>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEkService {
    url: Option<Spanned<String>>,
    manufacturer: Option<Spanned<String>>,
}

/// `[tpm.pcr_policy]`: `"<index>" = "<hex>"` entries are SHA-256 values (the
/// first form, kept), and `sha256`/`sha1` sub-tables hold each bank's.
#[derive(Default)]
struct RawPcrPolicy {
    entries: Vec<(PcrBank, String, Spanned<String>)>,
}

impl<'de> Deserialize<'de> for RawPcrPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawPcrPolicy;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("PCR index = hex value entries, or a sha256/sha1 table of them")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut raw = RawPcrPolicy::default();
                while let Some(key) = map.next_key::<String>()? {
                    if let Some(bank) = PcrBank::from_name(&key) {
                        let values: BTreeMap<String, Spanned<String>> = map.next_value()?;
                        raw.entries
                            .extend(values.into_iter().map(|(i, v)| (bank, i, v)));
                    } else if key.starts_with(|c: char| c.is_ascii_digit()) {
                        raw.entries.push((PcrBank::Sha256, key, map.next_value()?));
                    } else {
                        return Err(serde::de::Error::custom(format!(
                            "tpm.pcr_policy: {key:?} is neither a PCR index nor a bank (sha256, sha1)"
                        )));
                    }
                }
                Ok(raw)
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// Largest `controlplane.toml` read (a real one is a few KiB).
pub(crate) const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads `DIR/controlplane.toml`; a missing file is the default config.
pub fn load(dir: &Path) -> Result<Config, ConfigError> {
    let path = dir.join(CONFIG_FILE);
    match bc_wire::file::read_regular(&path, MAX_CONFIG_BYTES, bc_wire::file::Links::Follow) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes).map_err(|e| ConfigError::Invalid {
                path: path.clone(),
                line: None,
                message: format!("not UTF-8 (at byte {})", e.utf8_error().valid_up_to()),
            })?;
            parse(&path, &text)
        }
        Err(e) if e.is_not_found() => Ok(Config::default()),
        Err(e) => Err(ConfigError::Io {
            path,
            source: e.into(),
        }),
    }
}

/// [`load`], with the database the command line and the environment name
/// (`--database-url` and the `BC_CONTROLPLANE_DATABASE_*` variables) over
/// the file's `[database]`: what every command that opens DIR's database
/// reads.
pub fn load_with(dir: &Path, overrides: &DatabaseOverrides) -> Result<Config, ConfigError> {
    let mut config = load(dir)?;
    config.database = overrides.apply(dir, config.database.take())?;
    Ok(config)
}

/// Parses the text of `path`.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let invalid = |span: Option<std::ops::Range<usize>>, message: String| ConfigError::Invalid {
        path: path.to_owned(),
        line: span.map(|s| line_of(text, s.start)),
        message,
    };
    let raw: RawConfig =
        toml::from_str(text).map_err(|e| invalid(e.span(), e.message().to_owned()))?;
    // A duration setting: it parses, and `ok` holds, else `must` says what
    // it must be.
    let duration = |v: &Spanned<String>, key: &str, ok: fn(i64) -> bool, must: &str| {
        let ms = parse_duration_ms(v.get_ref())
            .map_err(|e| invalid(Some(v.span()), format!("{key}: {e}")))?;
        if !ok(ms) {
            return Err(invalid(
                Some(v.span()),
                format!("{key} must be {must}, not {:?}", v.get_ref()),
            ));
        }
        Ok(ms)
    };
    // A JoinPending.retry_after_seconds: whole seconds from 1s to 1h.
    let retry_after_seconds = |v: &Spanned<String>, key: &str| {
        let ms = duration(
            v,
            key,
            |ms| ms >= 1000 && ms % 1000 == 0 && ms / 1000 <= MAX_RETRY_AFTER_SECONDS,
            "whole seconds from 1s to 1h",
        )?;
        u32::try_from(ms / 1000).map_err(|_| invalid(Some(v.span()), format!("{key}: too large")))
    };
    let count = |v: &Spanned<i64>, key: &str| {
        let n = *v.get_ref();
        if !(1..=MAX_CONNECTIONS).contains(&n) {
            return Err(invalid(
                Some(v.span()),
                format!("{key} must be from 1 to {MAX_CONNECTIONS}, not {n}"),
            ));
        }
        usize::try_from(n).map_err(|_| invalid(Some(v.span()), format!("{key}: too large")))
    };
    // Relative to DIR, the directory of this file.
    let dir = path.parent().unwrap_or(Path::new("."));
    // A CA bundle setting: the PEM certificates (DER) of the file it names.
    let read_roots = |v: &Spanned<String>, key: &str| -> Result<Vec<Vec<u8>>, ConfigError> {
        let file = dir.join(v.get_ref());
        let bad = |e: String| invalid(Some(v.span()), format!("{key}: {}: {e}", file.display()));
        let pem = crate::fsutil::read_ca_bundle(&file).map_err(|e| bad(e.to_string()))?;
        let roots: Vec<Vec<u8>> = rustls_pemfile::certs(&mut pem.as_slice())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(e.to_string()))?
            .into_iter()
            .map(|c| c.to_vec())
            .collect();
        if roots.is_empty() {
            return Err(bad("holds no PEM certificate".to_owned()));
        }
        Ok(roots)
    };
    let mut config = Config::default();
    if let Some(d) = raw.database {
        // Relative to DIR, the directory of this file.
        let dir = path.parent().unwrap_or(Path::new("."));
        config.database = Some(database::parse(d, dir, &invalid)?);
    }
    if let Some(s) = raw.server {
        if let Some(v) = s.max_connections {
            config.server.max_connections = Some(count(&v, "server.max_connections")?);
        }
        if let Some(v) = s.max_connections_per_source {
            config.server.max_connections_per_source =
                Some(count(&v, "server.max_connections_per_source")?);
        }
        if let Some(v) = s.request_timeout {
            config.server.request_timeout_ms = duration(
                &v,
                "server.request_timeout",
                |ms| (1000..=MAX_REQUEST_TIMEOUT_MS).contains(&ms),
                "from 1s to 10m",
            )?;
        }
    }
    if let Some(e) = raw.events {
        if let Some(v) = e.retention {
            config.events.retention_ms = duration(
                &v,
                "events.retention",
                |ms| (86_400_000..=MAX_EVENTS_RETENTION_MS).contains(&ms),
                "from 1d to 3650d",
            )?;
        }
    }
    if let Some(d) = raw.discovery {
        if let Some(v) = d.cert_ttl {
            config.discovery.cert_ttl_ms = duration(
                &v,
                "discovery.cert_ttl",
                |ms| (60_000..=MAX_DISCOVERY_CERT_TTL_MS).contains(&ms),
                "from 1m to 2h",
            )?;
        }
        if let Some(v) = d.lease_ttl {
            config.discovery.lease_ttl_ms = duration(
                &v,
                "discovery.lease_ttl",
                |ms| (1000..=MAX_LEASE_TTL_MS).contains(&ms),
                "from 1s to 7d",
            )?;
        }
        if let Some(v) = d.max_age {
            config.discovery.max_age_ms = duration(
                &v,
                "discovery.max_age",
                |ms| (60_000..=MAX_DISCOVERY_MAX_AGE_MS).contains(&ms),
                "from 1m to 1h",
            )?;
        }
        if let Some(v) = d.approval {
            config.discovery.approval = match v.get_ref().as_str() {
                "unknown-machines" => DiscoveryApproval::UnknownMachines,
                other => {
                    return Err(invalid(
                        Some(v.span()),
                        format!(
                            "discovery.approval must be {} (or left out: the boot LAN is trusted), not {other:?}",
                            DiscoveryApproval::VALUES
                                .iter()
                                .map(|v| format!("{v:?}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ))
                }
            };
        }
        if let Some(v) = d.approval_retry_after {
            config.discovery.approval_retry_after_seconds =
                retry_after_seconds(&v, "discovery.approval_retry_after")?;
        }
        if let Some(v) = d.allowed_kinds {
            // The patterns go into every ramdisk certificate's scope
            // statement, so they must be what the agent parses back.
            if v.get_ref().is_empty() || v.get_ref().len() > bc_wire::command::scope::MAX_PATTERNS {
                return Err(invalid(
                    Some(v.span()),
                    format!(
                        "discovery.allowed_kinds must list 1 to {} command kinds",
                        bc_wire::command::scope::MAX_PATTERNS
                    ),
                ));
            }
            if let Some(e) = v
                .get_ref()
                .iter()
                .find_map(|k| bc_wire::command::KindPattern::parse(k).err())
            {
                return Err(invalid(
                    Some(v.span()),
                    format!("discovery.allowed_kinds: {e}"),
                ));
            }
            config.discovery.allowed_kinds = v.into_inner();
        }
    }
    if let Some(v) = raw.leases.and_then(|l| l.allowed_kinds) {
        // Into every leased node's scope statement: what the agent parses
        // back, and kinds a node runs.
        if let Err(e) = crate::model::leases::check_kinds(v.get_ref()) {
            return Err(invalid(Some(v.span()), format!("leases.allowed_kinds {e}")));
        }
        config.leases.allowed_kinds = v.into_inner();
    }
    if let Some(c) = raw.cloud_iid {
        if let Some(v) = c.audience {
            config.cloud_iid.audience = Some(v.into_inner());
        }
        if let Some(v) = c.max_age {
            config.cloud_iid.max_age_ms = duration(
                &v,
                "cloud_iid.max_age",
                |ms| (60_000..=3_600_000).contains(&ms),
                "from 1m to 1h",
            )?;
        }
        if let Some(v) = c.roles {
            let roles: Option<Vec<bc_wire::agent::Role>> = v
                .get_ref()
                .iter()
                .map(|r| bc_wire::agent::Role::from_name(r))
                .collect();
            match roles {
                Some(roles) if !roles.is_empty() => config.cloud_iid.roles = roles,
                _ => {
                    return Err(invalid(
                        Some(v.span()),
                        format!(
                        "cloud_iid.roles must list one or more of node, site, ramdisk, not {:?}",
                        v.get_ref()
                    ),
                    ))
                }
            }
        }
        if let Some(g) = c.gcp {
            // Relative to DIR, the directory of this file.
            let dir = path.parent().unwrap_or(Path::new("."));
            let file = dir.join(g.jwks.get_ref());
            let keys = crate::attestors::cloud_iid::gcp::load_jwks(&file)
                .map_err(|e| invalid(Some(g.jwks.span()), format!("cloud_iid.gcp.jwks: {e}")))?;
            config.cloud_iid.gcp = Some(keys);
        }
        if let Some(a) = c.aws {
            let dir = path.parent().unwrap_or(Path::new("."));
            let file = dir.join(a.certificates.get_ref());
            let keys = crate::attestors::cloud_iid::aws::load_certificates(&file).map_err(|e| {
                invalid(
                    Some(a.certificates.span()),
                    format!("cloud_iid.aws.certificates: {e}"),
                )
            })?;
            config.cloud_iid.aws = Some(keys);
        }
        if let Some(a) = c.azure {
            let dir = path.parent().unwrap_or(Path::new("."));
            let err = |span, e: String| invalid(Some(span), format!("cloud_iid.azure: {e}"));
            let signer = match a.signer {
                Some(s) if s.get_ref().is_empty() || s.get_ref().len() > 253 => {
                    return Err(err(s.span(), "signer must be a DNS name".to_owned()))
                }
                Some(s) => s.into_inner(),
                None => crate::attestors::cloud_iid::azure::DEFAULT_SIGNER.to_owned(),
            };
            let intermediates = a.intermediates.as_ref().map(|i| dir.join(i.get_ref()));
            let trust = crate::attestors::cloud_iid::azure::AzureTrust::load(
                &dir.join(a.roots.get_ref()),
                intermediates.as_deref(),
                signer,
            )
            .map_err(|e| err(a.roots.span(), e))?;
            config.cloud_iid.azure = Some(trust);
        }
        for (name, o) in c.oidc.unwrap_or_default() {
            use crate::attestors::cloud_iid::oidc::{self, fetch, KeySource};
            let key = format!("cloud_iid.oidc.{name}");
            let err = |span: std::ops::Range<usize>, e: String| {
                invalid(Some(span), format!("{key}: {e}"))
            };
            oidc::check_name(&name)
                .map_err(|e| invalid(Some(o.issuer.span()), format!("{key}: {e}")))?;
            oidc::check_issuer(o.issuer.get_ref()).map_err(|e| err(o.issuer.span(), e))?;
            let audience = match (&o.audience, &config.cloud_iid.audience) {
                (Some(a), _) if a.get_ref().is_empty() => {
                    return Err(err(a.span(), "audience must not be empty".to_owned()))
                }
                (Some(a), _) => a.get_ref().clone(),
                (None, Some(a)) => a.clone(),
                (None, None) => {
                    return Err(err(
                        o.issuer.span(),
                        "needs an audience (its own, or [cloud_iid] audience)".to_owned(),
                    ))
                }
            };
            let keys = match o.jwks {
                Some(j) => {
                    if let Some(v) = o
                        .ca_bundle
                        .as_ref()
                        .or(o.timeout.as_ref())
                        .or(o.cache.as_ref())
                    {
                        return Err(err(
                            v.span(),
                            "ca_bundle, timeout and cache are for keys fetched from the issuer, not a jwks file".to_owned(),
                        ));
                    }
                    let file = dir.join(j.get_ref());
                    KeySource::File(
                        oidc::Jwks::load(&file).map_err(|e| err(j.span(), format!("jwks: {e}")))?,
                    )
                }
                None => {
                    let mut f = fetch::FetchConfig::default();
                    if let Some(v) = o.timeout {
                        f.timeout_ms = duration(
                            &v,
                            &format!("{key}.timeout"),
                            |ms| (1000..=fetch::MAX_TIMEOUT_MS).contains(&ms),
                            "from 1s to 60s",
                        )?;
                    }
                    if let Some(v) = o.cache {
                        f.cache_ms = duration(
                            &v,
                            &format!("{key}.cache"),
                            |ms| (fetch::MIN_CACHE_MS..=fetch::MAX_CACHE_MS).contains(&ms),
                            "from 1m to 24h",
                        )?;
                    }
                    if let Some(v) = o.ca_bundle {
                        f.ca_roots = Some(read_roots(&v, &format!("{key}.ca_bundle"))?);
                    }
                    KeySource::Fetch(f)
                }
            };
            let claim = |v: Option<Spanned<String>>| -> Result<Option<String>, ConfigError> {
                v.map(|v| {
                    oidc::check_claim(v.get_ref()).map_err(|e| err(v.span(), e))?;
                    Ok(v.into_inner())
                })
                .transpose()
            };
            let max_age_ms = match o.max_age {
                Some(v) => duration(
                    &v,
                    &format!("{key}.max_age"),
                    |ms| (60_000..=3_600_000).contains(&ms),
                    "from 1m to 1h",
                )?,
                None => config.cloud_iid.max_age_ms,
            };
            config.cloud_iid.oidc.push(oidc::OidcProvider {
                name,
                issuer: o.issuer.into_inner(),
                audience,
                keys,
                account_claim: claim(o.account_claim)?,
                zone_claim: claim(o.zone_claim)?,
                instance_claim: claim(o.instance_claim)?.unwrap_or_else(|| "sub".to_owned()),
                max_age_ms,
            });
        }
        if (config.cloud_iid.gcp.is_some() || config.cloud_iid.azure.is_some())
            && config.cloud_iid.audience.is_none()
        {
            return Err(invalid(
                None,
                "cloud_iid.audience is required with [cloud_iid.gcp] or [cloud_iid.azure] (the api URL agents use)"
                    .to_owned(),
            ));
        }
    }
    if let Some(x) = raw.x509pop {
        if let Some(v) = x.grace {
            config.x509pop.grace_ms = duration(
                &v,
                "x509pop.grace",
                |ms| (0..=MAX_X509POP_GRACE_MS).contains(&ms),
                "from 0s to 365d",
            )?;
        }
        if let Some(v) = x.window {
            config.x509pop.window_ms = duration(
                &v,
                "x509pop.window",
                |ms| (1000..=MAX_X509POP_WINDOW_MS).contains(&ms),
                "from 1s to 1h",
            )?;
        }
    }
    let Some(tpm) = raw.tpm else {
        return Ok(config);
    };
    if let Some(v) = tpm.node_key {
        config.tpm.node_key = match v.get_ref().as_str() {
            "certified" => NodeKeyPolicy::Certified,
            "any" => NodeKeyPolicy::Any,
            other => {
                return Err(invalid(
                    Some(v.span()),
                    format!("tpm.node_key must be \"certified\" or \"any\", not {other:?}"),
                ))
            }
        };
    }
    if let Some(v) = tpm.challenge_ttl {
        config.tpm.challenge_ttl_ms = duration(
            &v,
            "tpm.challenge_ttl",
            |ms| ms > 0 && ms <= MAX_CHALLENGE_TTL_MS,
            "more than 0s and at most 5m",
        )?;
    }
    if let Some(v) = tpm.enrollment_retry_after {
        config.tpm.enrollment_retry_after_seconds =
            retry_after_seconds(&v, "tpm.enrollment_retry_after")?;
    }
    if let Some(on) = tpm.enrollment {
        config.tpm.enrollment = on;
    }
    if let Some(services) = tpm.ek_services {
        use crate::attestors::tpm::ek_service::{self, Addressing};
        let c = &mut config.tpm.ek_services;
        if let Some(v) = services.timeout {
            c.timeout_ms = duration(
                &v,
                "tpm.ek_services.timeout",
                |ms| (1000..=ek_service::MAX_TIMEOUT_MS).contains(&ms),
                "from 1s to 60s",
            )?;
        }
        if let Some(v) = services.ca_bundle {
            c.ca_roots = Some(read_roots(&v, "tpm.ek_services.ca_bundle")?);
        }
        for (addressing, raw) in [
            (Addressing::Intel, services.intel),
            (Addressing::Amd, services.amd),
        ] {
            let Some(raw) = raw else { continue };
            let name = addressing.as_str();
            let Some(service) = c.services.iter_mut().find(|s| s.addressing == addressing) else {
                continue;
            };
            if let Some(v) = raw.url {
                ek_service::check_url(v.get_ref()).map_err(|e| {
                    invalid(Some(v.span()), format!("tpm.ek_services.{name}.url: {e}"))
                })?;
                service.url = v.get_ref().clone();
            }
            if let Some(v) = raw.manufacturer {
                let m = v.get_ref();
                if m.is_empty() || m.len() > 4 || !m.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(invalid(
                        Some(v.span()),
                        format!("tpm.ek_services.{name}.manufacturer must be 1 to 4 printable ASCII characters (TPM_PT_MANUFACTURER, e.g. \"INTC\"), not {m:?}"),
                    ));
                }
                service.manufacturer = m.clone();
            }
        }
    }
    if let Some(policy) = tpm.pcr_policy {
        for (bank, index, value) in policy.entries {
            let pcr = index
                .parse::<u32>()
                .ok()
                .filter(|i| *i < 24 && (index == "0" || !index.starts_with('0')))
                .ok_or_else(|| {
                    invalid(
                        Some(value.span()),
                        format!("tpm.pcr_policy: {index:?} is not a PCR index from 0 to 23"),
                    )
                })?;
            let digits = 2 * bank.digest_len();
            let digest = hex::decode(value.get_ref())
                .ok()
                .filter(|d| d.len() == bank.digest_len())
                .ok_or_else(|| {
                    invalid(
                        Some(value.span()),
                        format!("tpm.pcr_policy.{pcr}: expected {digits} hex digits (a {bank} PCR value)"),
                    )
                })?;
            config
                .tpm
                .pcr_policy
                .insert(bank, pcr, digest)
                .map_err(|e| invalid(Some(value.span()), format!("tpm.pcr_policy: {e}")))?;
        }
    }
    Ok(config)
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// A duration `[+|-]<integer><s|m|h|d>` in milliseconds.
pub fn parse_duration_ms(s: &str) -> Result<i64, String> {
    let hint = "expected an integer and a unit s, m, h or d, e.g. 90s, 15m, 24h, 7d";
    let (sign, rest) = match s.as_bytes().first() {
        Some(b'-') => (-1i64, &s[1..]),
        Some(b'+') => (1, &s[1..]),
        _ => (1, s),
    };
    let Some(unit) = rest.chars().last() else {
        return Err(format!("empty duration: {hint}"));
    };
    let unit_ms: i64 = match unit {
        's' => 1_000,
        'm' => 60_000,
        'h' => 3_600_000,
        'd' => 86_400_000,
        _ => return Err(format!("bad duration {s:?}: {hint}")),
    };
    let digits = &rest[..rest.len() - 1];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("bad duration {s:?}: {hint}"));
    }
    digits
        .parse::<i64>()
        .ok()
        .and_then(|n| n.checked_mul(unit_ms))
        .map(|ms| sign * ms)
        .ok_or_else(|| format!("duration {s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Config, ConfigError> {
        parse(Path::new("/d/controlplane.toml"), text)
    }

    fn err(text: &str) -> String {
        p(text).err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn cloud_iid_roles_and_tpm_enrollment() {
        use bc_wire::agent::Role;
        let c = p("").unwrap();
        assert_eq!(c.cloud_iid.roles, [Role::Node]);
        assert!(c.tpm.enrollment);
        let c =
            p("[cloud_iid]\nroles = [\"node\", \"site\"]\n[tpm]\nenrollment = false\n").unwrap();
        assert_eq!(c.cloud_iid.roles, [Role::Node, Role::Site]);
        assert!(!c.tpm.enrollment);
        for bad in ["[]", "[\"admin\"]", "[\"node\", \"\"]"] {
            let e = err(&format!("[cloud_iid]\nroles = {bad}\n"));
            assert!(
                e.starts_with("/d/controlplane.toml:2: cloud_iid.roles must list one or more of node, site, ramdisk"),
                "{bad}: {e}"
            );
        }
        assert!(err("[tpm]\nenrollment = \"no\"\n").contains(":2"));
    }

    #[test]
    fn cloud_iid_oidc_providers() {
        use crate::attestors::cloud_iid::oidc::KeySource;
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tpmsim-fixtures");
        let path = fixtures.join(CONFIG_FILE);
        let parse = |text: &str| parse(&path, text).map_err(|e| e.to_string());
        let c = parse(
            "[cloud_iid]\naudience = \"https://cp:8443\"\n\
             [cloud_iid.oidc.wi]\nissuer = \"https://issuer.example\"\ntimeout = \"2s\"\ncache = \"5m\"\n\
             zone_claim = \"placement.zone\"\n\
             [cloud_iid.oidc.file]\nissuer = \"https://i2.example\"\naudience = \"own\"\n\
             jwks = \"cloud-gcp-jwks.json\"\nmax_age = \"2m\"\ninstance_claim = \"vm\"\n",
        )
        .unwrap()
        .cloud_iid;
        let (file, wi) = (&c.oidc[0], &c.oidc[1]);
        assert_eq!(
            (wi.name.as_str(), wi.audience.as_str()),
            ("wi", "https://cp:8443")
        );
        assert_eq!(wi.max_age_ms, 600_000);
        assert_eq!(wi.instance_claim, "sub");
        assert_eq!(wi.zone_claim.as_deref(), Some("placement.zone"));
        let KeySource::Fetch(f) = &wi.keys else {
            panic!("fetched")
        };
        assert_eq!(
            (f.timeout_ms, f.cache_ms, f.ca_roots.is_none()),
            (2000, 300_000, true)
        );
        assert_eq!((file.audience.as_str(), file.max_age_ms), ("own", 120_000));
        assert!(matches!(file.keys, KeySource::File(_)));
        for (text, want) in [
            ("[cloud_iid.oidc.a]\nissuer = \"https://i\"\n", "needs an audience"),
            ("[cloud_iid.oidc.a]\nissuer = \"http://i\"\naudience = \"x\"\n", "not an https:// URL"),
            ("[cloud_iid.oidc.A]\nissuer = \"https://i\"\naudience = \"x\"\n", "a provider name is"),
            ("[cloud_iid.oidc.a]\nissuer = \"https://i\"\naudience = \"x\"\ntimeout = \"2m\"\n", "from 1s to 60s"),
            ("[cloud_iid.oidc.a]\nissuer = \"https://i\"\naudience = \"x\"\ncache = \"1s\"\n", "from 1m to 24h"),
            ("[cloud_iid.oidc.a]\nissuer = \"https://i\"\naudience = \"x\"\njwks = \"cloud-gcp-jwks.json\"\ntimeout = \"2s\"\n", "not a jwks file"),
            ("[cloud_iid.oidc.a]\nissuer = \"https://i\"\naudience = \"x\"\njwks = \"cloud-aws.pem\"\n", "not a JWKS"),
            ("[cloud_iid.oidc.a]\nissuer = \"https://i\"\naudience = \"x\"\nca_bundle = \"cloud-gcp-jwks.json\"\n", "holds no PEM certificate"),
            ("[cloud_iid.oidc.a]\nissuer = \"https://i\"\naudience = \"x\"\nzone_claim = \"a..b\"\n", "dotted path"),
            ("[cloud_iid.oidc.a]\nissuer = \"https://i\"\naudience = \"x\"\nsecret = \"y\"\n", "unknown field"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn cloud_iid_keys_are_read_relative_to_dir_and_checked() {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tpmsim-fixtures");
        let path = fixtures.join(CONFIG_FILE);
        let parse = |text: &str| parse(&path, text).map_err(|e| e.to_string());
        let c = parse(
            "[cloud_iid]\naudience = \"https://cp:8443\"\nmax_age = \"5m\"\n\
             [cloud_iid.gcp]\njwks = \"cloud-gcp-jwks.json\"\n\
             [cloud_iid.aws]\ncertificates = \"cloud-aws.pem\"\n",
        )
        .unwrap()
        .cloud_iid;
        assert_eq!(c.max_age_ms, 300_000);
        assert!(c.gcp.is_some() && c.aws.is_some());
        assert_eq!(p("").unwrap().cloud_iid.max_age_ms, 600_000);
        let e = parse("[cloud_iid.gcp]\njwks = \"cloud-gcp-jwks.json\"\n").unwrap_err();
        assert!(e.contains("cloud_iid.audience is required"), "{e}");
        // A JWKS that is not one, a bundle of no certificate: refused with the line.
        let e = parse("[cloud_iid]\naudience = \"x\"\n[cloud_iid.gcp]\njwks = \"cloud-aws.pem\"\n")
            .unwrap_err();
        assert!(
            e.contains(":4: cloud_iid.gcp.jwks:") && e.contains("not a JWKS"),
            "{e}"
        );
        let e = parse("[cloud_iid.aws]\ncertificates = \"cloud-gcp-jwks.json\"\n").unwrap_err();
        assert!(e.contains("expected 1 to 64 certificates"), "{e}");
        let e = parse("[cloud_iid]\nmax_age = \"2h\"\n").unwrap_err();
        assert!(e.contains("from 1m to 1h"), "{e}");
        // Azure: roots required, the signer name defaulted, the audience needed.
        let azure = |t: &str| {
            parse(&format!(
                "[cloud_iid]\naudience = \"x\"\n[cloud_iid.azure]\n{t}"
            ))
        };
        let a = azure("roots = \"cloud-aws.pem\"\n")
            .unwrap()
            .cloud_iid
            .azure
            .unwrap();
        assert_eq!((a.roots.len(), a.intermediates.len()), (1, 0));
        assert_eq!(a.signer, "metadata.azure.com");
        let a = azure("roots = \"cloud-aws.pem\"\nintermediates = \"cloud-aws.pem\"\nsigner = \"metadata.azure.us\"\n")
            .unwrap()
            .cloud_iid
            .azure
            .unwrap();
        assert_eq!(
            (a.intermediates.len(), a.signer.as_str()),
            (1, "metadata.azure.us")
        );
        let e = azure("roots = \"cloud-gcp-jwks.json\"\n").unwrap_err();
        assert!(
            e.contains(":4: cloud_iid.azure:") && e.contains("expected 1 to 64"),
            "{e}"
        );
        assert!(azure("signer = \"x\"\n").unwrap_err().contains("roots"));
        let e = parse("[cloud_iid.azure]\nroots = \"cloud-aws.pem\"\n").unwrap_err();
        assert!(e.contains("cloud_iid.audience is required"), "{e}");
    }

    #[test]
    fn discovery_defaults_and_bounds() {
        let d = p("").unwrap().discovery;
        assert_eq!(d.cert_ttl_ms, 2 * 3_600_000);
        assert_eq!(d.lease_ttl_ms, 30_000);
        assert_eq!(d.allowed_kinds, DISCOVERY_ALLOWED_KINDS);
        let d = p(
            "[discovery]\ncert_ttl = \"30m\"\nlease_ttl = \"10s\"\nallowed_kinds = [\"diag.*\"]\n",
        )
        .unwrap()
        .discovery;
        assert_eq!((d.cert_ttl_ms, d.lease_ttl_ms), (1_800_000, 10_000));
        assert_eq!(d.allowed_kinds, ["diag.*"]);
        assert!(err("[discovery]\ncert_ttl = \"3h\"\n").contains("from 1m to 2h"));
        assert!(err("[discovery]\nlease_ttl = \"0s\"\n").contains("discovery.lease_ttl"));
        assert!(err("[discovery]\nmax_age = \"2h\"\n").contains("discovery.max_age"));
        assert_eq!(
            p("[discovery]\nmax_age = \"5m\"\n")
                .unwrap()
                .discovery
                .max_age_ms,
            300_000
        );
        assert!(err("[discovery]\nallowed_kinds = [\"a b\"]\n").contains("allowed_kinds"));
        // What the scope statement carries, so what the agent parses back:
        // `*` only as a whole last segment.
        for bad in ["diag*", "*", "diag", "Diag.ping", ""] {
            let e = err(&format!("[discovery]\nallowed_kinds = [\"{bad}\"]\n"));
            assert!(
                e.contains("discovery.allowed_kinds") && e.contains("not a kind or a family"),
                "{bad}: {e}"
            );
        }
        assert!(err("[discovery]\nallowed_kinds = []\n").contains("1 to 64"));
        assert_eq!(
            p("").unwrap().leases.allowed_kinds,
            crate::model::leases::DEFAULT_LEASE_ALLOWED_KINDS
        );
        assert_eq!(
            p("[leases]\nallowed_kinds = [\"diag.ping\", \"logs.collect\"]\n")
                .unwrap()
                .leases
                .allowed_kinds,
            ["diag.ping", "logs.collect"]
        );
        for bad in ["disk.wipe", "no.such", "diag"] {
            let e = err(&format!("[leases]\nallowed_kinds = [\"{bad}\"]\n"));
            assert!(
                e.contains("leases.allowed_kinds") && e.contains("controlplane.toml:2"),
                "{bad}: {e}"
            );
        }
    }

    /// `[discovery] approval`: unset is the trusted boot LAN (the spec's
    /// default); the one value it takes turns operator approval on; any
    /// other value is refused at start, naming the key, the line and what
    /// it may be (a typo must not leave the LAN trusted).
    #[test]
    fn discovery_approval_takes_only_unknown_machines() {
        let d = p("").unwrap().discovery;
        assert_eq!(d.approval, DiscoveryApproval::TrustedLan);
        assert_eq!(d.approval_retry_after_seconds, 30);
        let d = p("[discovery]\napproval = \"unknown-machines\"\napproval_retry_after = \"2s\"\n")
            .unwrap()
            .discovery;
        assert_eq!(d.approval, DiscoveryApproval::UnknownMachines);
        assert_eq!(d.approval_retry_after_seconds, 2);
        for bad in ["unknown", "Unknown-Machines", "none", "", "all"] {
            let e = err(&format!("[discovery]\n\napproval = {bad:?}\n"));
            assert!(
                e.contains("controlplane.toml:3: discovery.approval must be \"unknown-machines\"")
                    && e.contains(&format!("not {bad:?}")),
                "{bad}: {e}"
            );
        }
        assert!(err("[discovery]\napproval = true\n").contains("controlplane.toml:2"));
        assert!(err("[discovery]\napproval_retry_after = \"1500ms\"\n")
            .contains("discovery.approval_retry_after"));
        assert!(err("[discovery]\napproval_retry_after = \"2h\"\n")
            .contains("discovery.approval_retry_after must be whole seconds from 1s to 1h"));
    }

    #[test]
    fn defaults_and_full_file() {
        assert_eq!(p("").unwrap(), Config::default());
        let d = TpmConfig::default();
        assert_eq!(d.node_key, NodeKeyPolicy::Certified);
        assert_eq!(d.challenge_ttl_ms, 300_000);
        assert_eq!(d.enrollment_retry_after_seconds, 30);
        let c = p(r#"
[tpm]
node_key = "any"
challenge_ttl = "90s"
enrollment_retry_after = "2m"
[tpm.pcr_policy]
"0" = "AA00000000000000000000000000000000000000000000000000000000000000"
"23" = "0000000000000000000000000000000000000000000000000000000000000001"
"#)
        .unwrap();
        assert_eq!(c.tpm.node_key, NodeKeyPolicy::Any);
        assert_eq!(c.tpm.challenge_ttl_ms, 90_000);
        assert_eq!(c.tpm.enrollment_retry_after_seconds, 120);
        let mut want = crate::attestors::tpm::PcrPolicy::default();
        let mut v0 = vec![0; 32];
        v0[0] = 0xaa;
        let mut v23 = vec![0; 32];
        v23[31] = 1;
        want.insert(PcrBank::Sha256, 0, v0).unwrap();
        want.insert(PcrBank::Sha256, 23, v23).unwrap();
        assert_eq!(c.tpm.pcr_policy, want);
    }

    #[test]
    fn ek_services_defaults_overrides_and_errors() {
        use crate::attestors::tpm::ek_service::{default_url, Addressing};
        let d = p("").unwrap().tpm.ek_services;
        assert_eq!(d.timeout_ms, 10_000);
        assert_eq!(d.ca_roots, None);
        assert_eq!(d.services[0].url, default_url(Addressing::Intel));
        assert_eq!(d.services[1].manufacturer, "AMD");
        let c = p("[tpm.ek_services]\ntimeout = \"2s\"\n[tpm.ek_services.intel]\nurl = \"https://127.0.0.1:9/x/{ek}\"\nmanufacturer = \"IBM\"\n[tpm.ek_services.amd]\nurl = \"\"\n")
            .unwrap()
            .tpm
            .ek_services;
        assert_eq!(c.timeout_ms, 2000);
        assert_eq!(c.services[0].url, "https://127.0.0.1:9/x/{ek}");
        assert_eq!(c.services[0].manufacturer, "IBM");
        assert!(c.service_for(u32::from_be_bytes(*b"AMD\0")).is_none());
        let e = err("[tpm.ek_services.intel]\nurl = \"http://ekop.intel.com/{ek}\"\n");
        assert!(
            e.contains("tpm.ek_services.intel.url") && e.contains(":2"),
            "{e}"
        );
        let e = err("[tpm.ek_services.amd]\nmanufacturer = \"ADVANCED\"\n");
        assert!(e.contains("1 to 4 printable ASCII"), "{e}");
        let e = err("[tpm.ek_services]\ntimeout = \"5m\"\n");
        assert!(e.contains("from 1s to 60s"), "{e}");
        let e = err("[tpm.ek_services]\nca_bundle = \"missing.pem\"\n");
        assert!(e.contains("missing.pem"), "{e}");
        let e = err("[tpm.ek_services.intel]\nurls = \"x\"\n");
        assert!(e.contains("unknown field"), "{e}");
    }

    #[test]
    fn pcr_policy_banks() {
        // The first form, a sha256 table and a sha1 table: one policy.
        let c = p(&format!(
            "[tpm.pcr_policy]\n\"0\" = \"{}\"\n[tpm.pcr_policy.sha256]\n\"7\" = \"{}\"\n\
             [tpm.pcr_policy.sha1]\n\"0\" = \"{}\"\n",
            "11".repeat(32),
            "77".repeat(32),
            "aa".repeat(20)
        ))
        .unwrap();
        let mut want = crate::attestors::tpm::PcrPolicy::default();
        want.insert(PcrBank::Sha256, 0, vec![0x11; 32]).unwrap();
        want.insert(PcrBank::Sha256, 7, vec![0x77; 32]).unwrap();
        want.insert(PcrBank::Sha1, 0, vec![0xaa; 20]).unwrap();
        assert_eq!(c.tpm.pcr_policy, want);
        assert_eq!(c.tpm.pcr_policy.pcrs(), [0, 7]);
        // A SHA-256 value in the sha1 table, and the reverse.
        let e = err(&format!(
            "[tpm.pcr_policy.sha1]\n\"0\" = \"{}\"\n",
            "00".repeat(32)
        ));
        assert!(e.starts_with("/d/controlplane.toml:2: "), "{e}");
        assert!(e.contains("40 hex digits (a SHA-1 PCR value)"), "{e}");
        let e = err(&format!(
            "[tpm.pcr_policy]\n\"0\" = \"{}\"\n",
            "00".repeat(20)
        ));
        assert!(e.contains("64 hex digits (a SHA-256 PCR value)"), "{e}");
        // The same PCR twice in SHA-256, in both forms.
        let e = err(&format!(
            "[tpm.pcr_policy]\n\"0\" = \"{v}\"\n[tpm.pcr_policy.sha256]\n\"0\" = \"{v}\"\n",
            v = "00".repeat(32)
        ));
        assert!(e.contains("two SHA-256 values"), "{e}");
        let e = err("[tpm.pcr_policy.sha384]\n\"0\" = \"00\"\n");
        assert!(e.contains("neither a PCR index nor a bank"), "{e}");
        let e = err("[tpm.pcr_policy.sha1]\n\"24\" = \"00\"\n");
        assert!(e.contains("not a PCR index from 0 to 23"), "{e}");
    }

    #[test]
    fn errors_name_file_and_line() {
        let e = err("[tpm]\nnode_key = \"certifed\"\n");
        assert!(e.starts_with("/d/controlplane.toml:2: "), "{e}");
        assert!(e.contains("certifed"), "{e}");
        let e = err("[tpm]\n\nchallenge_ttl = \"6m\"\n");
        assert!(e.starts_with("/d/controlplane.toml:3: "), "{e}");
        let e = err("[tpm]\nnode_keys = \"any\"\n");
        assert!(e.starts_with("/d/controlplane.toml:2: "), "{e}");
        assert!(e.contains("node_keys"), "{e}");
        let e = err("[tpmm]\n");
        assert!(e.starts_with("/d/controlplane.toml:1: "), "{e}");
        let e = err("[tpm.pcr_policy]\n\"24\" = \"00\"\n");
        assert!(e.starts_with("/d/controlplane.toml:2: "), "{e}");
        let e = err("[tpm.pcr_policy]\n\"1\" = \"00\"\n");
        assert!(e.contains("64 hex digits"), "{e}");
        for bad in ["0s", "-1m", "5m1s", "1h", "soon"] {
            assert!(
                p(&format!("[tpm]\nchallenge_ttl = \"{bad}\"\n")).is_err(),
                "{bad}"
            );
        }
        assert!(p("[tpm]\nchallenge_ttl = \"5m\"\n").is_ok());
        for bad in ["0s", "2h", "x"] {
            assert!(
                p(&format!("[tpm]\nenrollment_retry_after = \"{bad}\"\n")).is_err(),
                "{bad}"
            );
        }
        let e = err("[tpm]\nnode_key = 1\n");
        assert!(e.starts_with("/d/controlplane.toml:2: "), "{e}");
    }

    #[test]
    fn x509pop_section() {
        let d = X509PopConfig::default();
        assert_eq!((d.grace_ms, d.window_ms), (7 * 86_400_000, 60_000));
        let c = p("[x509pop]\ngrace = \"2d\"\nwindow = \"90s\"\n").unwrap();
        assert_eq!(
            (c.x509pop.grace_ms, c.x509pop.window_ms),
            (2 * 86_400_000, 90_000)
        );
        // Both sections together; the tpm one unchanged.
        let c = p("[x509pop]\ngrace = \"0s\"\n[tpm]\nnode_key = \"any\"\n").unwrap();
        assert_eq!(c.x509pop.grace_ms, 0);
        assert_eq!(c.tpm.node_key, NodeKeyPolicy::Any);
        for (bad, line) in [
            ("[x509pop]\ngrace = \"-1d\"\n", 2),
            ("[x509pop]\ngrace = \"366d\"\n", 2),
            ("[x509pop]\n\nwindow = \"0s\"\n", 3),
            ("[x509pop]\nwindow = \"2h\"\n", 2),
            ("[x509pop]\nwindow = \"soon\"\n", 2),
            ("[x509pop]\ngrace_ms = 1\n", 2),
        ] {
            let e = err(bad);
            assert!(
                e.starts_with(&format!("/d/controlplane.toml:{line}: ")),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn server_and_events_sections() {
        let d = p("").unwrap();
        assert_eq!(d.server.max_connections, None);
        assert_eq!(d.server.request_timeout_ms, 30_000);
        assert_eq!(d.events.retention_ms, 90 * 86_400_000);
        let c = p(
            "[server]\nmax_connections = 100\nmax_connections_per_source = 10\n\
                   request_timeout = \"5s\"\n[events]\nretention = \"7d\"\n",
        )
        .unwrap();
        assert_eq!(c.server.max_connections, Some(100));
        assert_eq!(c.server.max_connections_per_source, Some(10));
        assert_eq!(c.server.request_timeout_ms, 5_000);
        assert_eq!(c.events.retention_ms, 7 * 86_400_000);
        for (bad, line) in [
            ("[server]\nmax_connections = 0\n", 2),
            ("[server]\n\nmax_connections_per_source = -1\n", 3),
            ("[server]\nrequest_timeout = \"0s\"\n", 2),
            ("[server]\nrequest_timeout = \"1h\"\n", 2),
            ("[events]\nretention = \"1h\"\n", 2),
            ("[events]\nkeep = \"1d\"\n", 2),
        ] {
            let e = err(bad);
            assert!(
                e.starts_with(&format!("/d/controlplane.toml:{line}: ")),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn missing_file_is_default() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), Config::default());
        std::fs::write(dir.path().join(CONFIG_FILE), "[tpm]\nnode_key = \"any\"\n").unwrap();
        assert_eq!(load(dir.path()).unwrap().tpm.node_key, NodeKeyPolicy::Any);
    }
}
