//! A pool's boot policy: what an operator allows a machine to have booted,
//! judged against the facts of its verified event log ([`bc_eventlog::extract`])
//! instead of raw PCR values, so that a firmware or kernel update is a
//! policy line added, not every PCR recomputed, and a refusal names what
//! was wrong.
//!
//! The policy is TOML (`pools update --boot-policy FILE`):
//!
//! ```toml
//! secure_boot = "required"          # or "allowed" (the default)
//! dbx_min = "dbxupdate_x64.bin"     # the dbx must hold every entry of these files
//! cmdline = ["root=UUID=* ro quiet", "BOOT_IMAGE=/vmlinuz-6.1.* *"]
//! [firmware]
//! min_version = ["N40ET41W", "edk2-20240524"]
//! [[boot_app]]                      # every boot application must match one entry
//! digest = "e1c8…"                  # its Authenticode digest, and/or
//! authority = "CN=Microsoft Windows UEFI Driver Publisher, …"  # who verified it
//! ```
//!
//! Several allowed values everywhere (a string or a list), so a fleet can
//! roll forward. `dbx_min` files are read when the policy is loaded and
//! kept as their entries (`dbx_min_entries`, the form [`BootPolicy::to_toml`]
//! writes and the pool stores), so the server never reads a path.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use bc_eventlog::{Alg, AuthorityEntry, BootFacts, Signature};
use serde::Deserialize;

use crate::store::{params, DbError, Tx};

/// The most bytes a policy file (or a dbx update file) may have.
const MAX_POLICY_BYTES: usize = 1 << 20;

/// The most entries a dbx update file may hold (the bc-eventlog default).
const MAX_DBX_ENTRIES: usize = 4096;

/// Why a boot was refused; the spellings are the refusal reasons the tpm
/// attestor and Renew record (`TpmReason::boot`, `RenewReason::boot`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BootReason {
    /// `secure_boot = "required"` and Secure Boot was off (or in audit or
    /// setup mode, or not measured).
    SecureBoot,
    /// A boot application no `[[boot_app]]` entry allows.
    App,
    /// The dbx lacks an entry of `dbx_min`.
    Dbx,
    /// A kernel command line no `cmdline` pattern matches (or none measured).
    Cmdline,
    /// The firmware version is below every applicable `min_version`.
    Firmware,
}

impl BootReason {
    pub const ALL: [BootReason; 5] = [
        BootReason::SecureBoot,
        BootReason::App,
        BootReason::Dbx,
        BootReason::Cmdline,
        BootReason::Firmware,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            BootReason::SecureBoot => "boot-secure-boot",
            BootReason::App => "boot-app",
            BootReason::Dbx => "boot-dbx",
            BootReason::Cmdline => "boot-cmdline",
            BootReason::Firmware => "boot-firmware",
        }
    }
}

impl std::fmt::Display for BootReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused boot: the reason, the digest or value that failed, and the
/// index of the event that decided it (None when the log lacks one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootRefusal {
    pub reason: BootReason,
    pub detail: String,
    pub event: Option<usize>,
}

impl std::fmt::Display for BootRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.event {
            Some(e) => write!(f, "{}: {} (event {e})", self.reason, self.detail),
            None => write!(f, "{}: {}", self.reason, self.detail),
        }
    }
}

/// One `[[boot_app]]` entry: an application matches when it has one of
/// `digests` (if any are given) and was verified by one of `authorities`
/// (if any are given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootApp {
    /// Authenticode digests, lowercase hex (any bank's length).
    pub digests: Vec<String>,
    /// A certificate's SHA-256 (lowercase hex) or its subject as
    /// [`authority_subject`] prints it.
    pub authorities: Vec<String>,
}

/// A parsed boot policy. Empty parts allow anything.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct BootPolicy {
    pub secure_boot_required: bool,
    pub boot_apps: Vec<BootApp>,
    /// The dbx entries required ([`signature_key`] form).
    pub dbx_min: BTreeSet<String>,
    pub cmdline: Vec<String>,
    pub firmware_min: Vec<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    secure_boot: Option<String>,
    #[serde(default)]
    boot_app: Vec<RawApp>,
    dbx_min: Option<OneOrMany>,
    dbx_min_entries: Option<Vec<String>>,
    cmdline: Option<OneOrMany>,
    firmware: Option<RawFirmware>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApp {
    digest: Option<OneOrMany>,
    authority: Option<OneOrMany>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFirmware {
    min_version: Option<OneOrMany>,
}

/// The key a dbx entry is compared by (its owner GUID ignored):
/// `sha256:<digest>`, `x509-sha256:<SHA-256 of the DER>`, or
/// `other:<type GUID>:<SHA-256 of the data>`.
pub(crate) fn signature_key(s: &Signature) -> String {
    match s {
        Signature::Sha256 { digest, .. } => format!("sha256:{}", hex::encode(digest)),
        Signature::X509 { der, .. } => {
            format!("x509-sha256:{}", hex::encode(bc_wire::sha256(der)))
        }
        Signature::Other { kind, data, .. } => {
            format!("other:{kind}:{}", hex::encode(bc_wire::sha256(data)))
        }
    }
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.len() % 2 == 0 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn non_empty(key: &str, list: Vec<String>) -> Result<Vec<String>, String> {
    if list.is_empty() {
        return Err(format!(
            "{key}: an empty list allows nothing; remove the key to allow anything"
        ));
    }
    if let Some(i) = list.iter().position(|s| s.trim().is_empty()) {
        return Err(format!("{key}[{i}]: an empty string"));
    }
    Ok(list)
}

impl BootPolicy {
    /// Parses a policy; `dbx_min` paths are read relative to the current
    /// directory (see [`BootPolicy::load`] for a file's).
    pub fn parse(text: &str) -> Result<BootPolicy, String> {
        Self::parse_in(text, Some(Path::new(".")))
    }

    /// Reads a policy file; its `dbx_min` paths are relative to its
    /// directory. Errors name the file.
    pub fn load(path: &Path) -> Result<BootPolicy, String> {
        let text = read_bounded(path)?;
        let text = String::from_utf8(text)
            .map_err(|_| format!("{}: the boot policy is not UTF-8", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse_in(&text, Some(base)).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// `base`: where `dbx_min` files are; None refuses them (a stored
    /// policy holds their entries).
    fn parse_in(text: &str, base: Option<&Path>) -> Result<BootPolicy, String> {
        if text.len() > MAX_POLICY_BYTES {
            return Err(format!(
                "the boot policy is {} bytes, more than {MAX_POLICY_BYTES}",
                text.len()
            ));
        }
        let raw: RawPolicy = toml::from_str(text).map_err(|e| {
            // toml's message names the line and the key.
            format!("not a boot policy: {}", e.to_string().trim_end())
        })?;
        let mut p = BootPolicy {
            secure_boot_required: match raw.secure_boot.as_deref() {
                None | Some("allowed") => false,
                Some("required") => true,
                Some(other) => {
                    return Err(format!(
                        "secure_boot = {other:?}: must be \"required\" or \"allowed\""
                    ))
                }
            },
            ..BootPolicy::default()
        };
        for (i, app) in raw.boot_app.into_iter().enumerate() {
            let key = format!("boot_app[{i}]");
            let digests = match app.digest {
                Some(d) => non_empty(&format!("{key}.digest"), d.into_vec())?,
                None => Vec::new(),
            };
            let mut lower = Vec::new();
            for (j, d) in digests.iter().enumerate() {
                let d = d.trim().to_ascii_lowercase();
                if !is_hex(&d) || ![20, 32, 48, 64].contains(&(d.len() / 2)) {
                    return Err(format!(
                        "{key}.digest[{j}] = {d:?}: not the hex of a SHA-1, SHA-256, SHA-384 or SHA-512 digest"
                    ));
                }
                lower.push(d);
            }
            let authorities = match app.authority {
                Some(a) => non_empty(&format!("{key}.authority"), a.into_vec())?,
                None => Vec::new(),
            };
            let authorities = authorities
                .into_iter()
                .map(|a| {
                    let t = a.trim();
                    if t.len() == 64 && is_hex(t) {
                        t.to_ascii_lowercase()
                    } else {
                        t.to_owned()
                    }
                })
                .collect::<Vec<_>>();
            if lower.is_empty() && authorities.is_empty() {
                return Err(format!(
                    "{key}: give a digest, an authority or both (an empty entry would allow any application)"
                ));
            }
            p.boot_apps.push(BootApp {
                digests: lower,
                authorities,
            });
        }
        if let Some(files) = raw.dbx_min {
            let Some(base) = base else {
                return Err("dbx_min names files: a stored policy holds dbx_min_entries".to_owned());
            };
            for (i, f) in non_empty("dbx_min", files.into_vec())?.iter().enumerate() {
                let path = base.join(f);
                let bytes = read_bounded(&path).map_err(|e| format!("dbx_min[{i}]: {e}"))?;
                let entries = bc_eventlog::parse_signature_update(&bytes, MAX_DBX_ENTRIES)
                    .ok_or_else(|| {
                        format!(
                            "dbx_min[{i}]: {} is not a dbx update (EFI_SIGNATURE_LISTs, signed or not) of at most {MAX_DBX_ENTRIES} entries",
                            path.display()
                        )
                    })?;
                if entries.is_empty() {
                    return Err(format!("dbx_min[{i}]: {} holds no entry", path.display()));
                }
                p.dbx_min.extend(entries.iter().map(signature_key));
            }
        }
        if let Some(entries) = raw.dbx_min_entries {
            for (i, e) in entries.into_iter().enumerate() {
                let ok = match e.split_once(':') {
                    Some(("sha256" | "x509-sha256", h)) => h.len() == 64 && is_hex(h),
                    Some(("other", rest)) => rest
                        .rsplit_once(':')
                        .is_some_and(|(_, h)| h.len() == 64 && is_hex(h)),
                    _ => false,
                };
                if !ok {
                    return Err(format!(
                        "dbx_min_entries[{i}] = {e:?}: not sha256:<hex>, x509-sha256:<hex> or other:<guid>:<hex>"
                    ));
                }
                p.dbx_min.insert(e.to_ascii_lowercase());
            }
        }
        if let Some(c) = raw.cmdline {
            p.cmdline = non_empty("cmdline", c.into_vec())?;
        }
        if let Some(v) = raw.firmware.and_then(|f| f.min_version) {
            p.firmware_min = non_empty("firmware.min_version", v.into_vec())?
                .into_iter()
                .map(|s| s.trim().to_owned())
                .collect();
        }
        Ok(p)
    }

    /// True when the policy checks nothing.
    pub fn is_empty(&self) -> bool {
        *self == BootPolicy::default()
    }

    /// The policy as TOML, `dbx_min` files resolved into
    /// `dbx_min_entries`: what a pool stores, and [`BootPolicy::parse`]
    /// reads back to an equal policy.
    pub fn to_toml(&self) -> String {
        let q = |s: &str| toml::Value::String(s.to_owned()).to_string();
        let list = |v: &[String]| {
            let items: Vec<String> = v.iter().map(|s| q(s)).collect();
            format!("[{}]", items.join(", "))
        };
        let mut out = String::new();
        let sb = if self.secure_boot_required {
            "required"
        } else {
            "allowed"
        };
        let _ = writeln!(out, "secure_boot = {}", q(sb));
        if !self.cmdline.is_empty() {
            let _ = writeln!(out, "cmdline = {}", list(&self.cmdline));
        }
        if !self.dbx_min.is_empty() {
            let _ = writeln!(out, "dbx_min_entries = [");
            for e in &self.dbx_min {
                let _ = writeln!(out, "  {},", q(e));
            }
            let _ = writeln!(out, "]");
        }
        if !self.firmware_min.is_empty() {
            let _ = writeln!(
                out,
                "\n[firmware]\nmin_version = {}",
                list(&self.firmware_min)
            );
        }
        for app in &self.boot_apps {
            let _ = writeln!(out, "\n[[boot_app]]");
            if !app.digests.is_empty() {
                let _ = writeln!(out, "digest = {}", list(&app.digests));
            }
            if !app.authorities.is_empty() {
                let _ = writeln!(out, "authority = {}", list(&app.authorities));
            }
        }
        out
    }
}

/// Reads at most [`MAX_POLICY_BYTES`] of a file.
fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let f =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut buf = Vec::new();
    f.take(MAX_POLICY_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if buf.len() > MAX_POLICY_BYTES {
        return Err(format!(
            "{} is more than {MAX_POLICY_BYTES} bytes",
            path.display()
        ));
    }
    Ok(buf)
}

/// The PCRs a policy's checks read events from, sorted: what a join with
/// this policy must quote (in every populated bank) and the log must
/// replay to. The mapping (TCG PC Client PFP):
/// - `secure_boot`, `dbx_min`, a `boot_app` authority: 7 (the Secure Boot
///   variables and EV_EFI_VARIABLE_AUTHORITY events);
/// - a `boot_app`: 4 (EV_EFI_BOOT_SERVICES_APPLICATION, the Authenticode
///   digests);
/// - `cmdline`: 8 (grub's `kernel_cmdline`) and 12 (systemd-boot's and
///   the stub's load options); a machine's loader extends one of them, the
///   other stays unextended (see [`always_extended`]);
/// - `firmware.min_version`: 0 (EV_S_CRTM_VERSION).
///
/// A policy that checks nothing still needs 0 and 7: a boot policy means
/// the log is verified, and every UEFI boot extends both.
pub fn needed_pcrs(policy: &BootPolicy) -> Vec<u32> {
    let mut pcrs = BTreeSet::from([0, 7]);
    if !policy.boot_apps.is_empty() {
        pcrs.insert(4);
    }
    if !policy.cmdline.is_empty() {
        pcrs.extend([8, 12]);
    }
    pcrs.into_iter().collect()
}

/// Of `pcrs`, those every UEFI boot extends (0-7: the firmware measures
/// a separator into each): a quoted value of all zeros or all ones there
/// means a bank nobody extended (CVE-2021-42299), where a loader's PCR
/// (8, 12) may legitimately stay unextended.
pub fn always_extended(pcrs: &[u32]) -> Vec<u32> {
    pcrs.iter().copied().filter(|&p| p <= 7).collect()
}

/// The pool's boot policy, if it has one.
pub(crate) fn pool_boot_policy(tx: &Tx<'_>, pool_id: &str) -> Result<Option<BootPolicy>, DbError> {
    let text: Option<Option<String>> = tx.query_opt_map(
        "SELECT boot_policy FROM pools WHERE id = ?1",
        params![pool_id],
        |r| r.get(0),
    )?;
    match text.flatten() {
        None => Ok(None),
        Some(t) => BootPolicy::parse_stored(&t)
            .map(Some)
            .map_err(|e| DbError::Corrupt {
                what: "pool boot policy",
                detail: format!("pool {pool_id}: {e}"),
            }),
    }
}

impl BootPolicy {
    /// A stored policy: never reads a file (`dbx_min` was resolved when it
    /// was set). Public for the `boot_policy` fuzz target, which must not
    /// open the paths a mutated `dbx_min` names.
    pub fn parse_stored(text: &str) -> Result<BootPolicy, String> {
        Self::parse_in(text, None)
    }
}

/// A certificate's subject as policies name it (RFC 4514-like, as
/// x509-parser prints it), or None if the DER is no certificate.
pub fn authority_subject(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(cert.subject().to_string())
}

/// How a policy names an authority entry: the certificate's SHA-256 and
/// subject, or the db hash entry's digest.
fn authority_names(entry: &AuthorityEntry) -> Vec<String> {
    match entry {
        AuthorityEntry::Certificate { der, .. } => {
            let mut v = vec![hex::encode(bc_wire::sha256(der))];
            v.extend(authority_subject(der));
            v
        }
        AuthorityEntry::Sha256 { digest, .. } => vec![hex::encode(digest)],
        AuthorityEntry::Value(_) => Vec::new(),
    }
}

/// The authorities that may have verified boot application `app`
/// (index into `facts.boot_apps`): those logged since the previous one,
/// else (firmware logs an authority once, when it first verifies an
/// image) every authority logged after the separator before it.
pub fn app_authorities(facts: &BootFacts, app: usize) -> Vec<&bc_eventlog::Authority> {
    let Some(a) = facts.boot_apps.get(app) else {
        return Vec::new();
    };
    if !a.new_authorities.is_empty() {
        return a
            .new_authorities
            .iter()
            .filter_map(|&i| facts.authorities.get(i))
            .collect();
    }
    facts
        .post_separator_authorities()
        .filter(|x| x.event < a.event)
        .collect()
}

/// The text a firmware version is compared as: the S-CRTM version's
/// UTF-16 text, else its hex.
pub fn version_text(v: &bc_eventlog::Version) -> String {
    match &v.text {
        Some(t) => t.trim().to_owned(),
        None => hex::encode(&v.raw),
    }
}

/// A version's runs of digits and of other characters.
fn version_tokens(s: &str) -> Vec<(bool, &str)> {
    let mut out = Vec::new();
    let mut start = 0;
    let b = s.as_bytes();
    for i in 1..=b.len() {
        if i == b.len() || b[i].is_ascii_digit() != b[start].is_ascii_digit() {
            out.push((b[start].is_ascii_digit(), &s[start..i]));
            start = i;
        }
    }
    out
}

/// Compares `have` with `min` run by run, digits as numbers: None when
/// they are not of one family (a text run differs first).
fn version_at_least(have: &str, min: &str) -> Option<bool> {
    let (h, m) = (version_tokens(have), version_tokens(min));
    for (x, y) in h.iter().zip(&m) {
        match (x, y) {
            ((true, a), (true, b)) => {
                let (a, b) = (a.trim_start_matches('0'), b.trim_start_matches('0'));
                let ord = a.len().cmp(&b.len()).then_with(|| a.cmp(b));
                if ord != std::cmp::Ordering::Equal {
                    return Some(ord.is_gt());
                }
            }
            ((false, a), (false, b)) if a == b => {}
            _ => return None,
        }
    }
    Some(h.len() >= m.len())
}

/// `*` any run, `?` one character; the rest literal.
fn glob(pattern: &str, s: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), s.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

fn refuse(reason: BootReason, detail: String, event: Option<usize>) -> Result<(), BootRefusal> {
    Err(BootRefusal {
        reason,
        detail,
        event,
    })
}

/// Judges a verified log's facts against the policy: the first check that
/// fails, in boot order (Secure Boot state, firmware, dbx, boot
/// applications, command line). The facts must come from a log whose
/// replay matched the quoted [`needed_pcrs`].
pub fn judge(policy: &BootPolicy, facts: &BootFacts) -> Result<(), BootRefusal> {
    if policy.secure_boot_required {
        let Some(sb) = &facts.secure_boot else {
            return refuse(
                BootReason::SecureBoot,
                "the SecureBoot variable was not measured".to_owned(),
                None,
            );
        };
        if !facts.secure_boot_enabled() {
            return refuse(
                BootReason::SecureBoot,
                format!("SecureBoot is {:?}, not 01 (on)", hex::encode(&sb.value)),
                Some(sb.event),
            );
        }
        for (name, m) in [
            ("SetupMode", &facts.setup_mode),
            ("AuditMode", &facts.audit_mode),
        ] {
            if let Some(m) = m.as_ref().filter(|m| m.value == [1]) {
                return refuse(
                    BootReason::SecureBoot,
                    format!("{name} is 01: Secure Boot is not enforcing"),
                    Some(m.event),
                );
            }
        }
    }
    if !policy.firmware_min.is_empty() {
        let Some(v) = facts.scrtm_version.first() else {
            return refuse(
                BootReason::Firmware,
                "no firmware version (EV_S_CRTM_VERSION) was measured".to_owned(),
                None,
            );
        };
        let have = version_text(&v.value);
        let verdicts: Vec<Option<bool>> = policy
            .firmware_min
            .iter()
            .map(|m| version_at_least(&have, m))
            .collect();
        if !verdicts.contains(&Some(true)) {
            let why = if verdicts.iter().all(Option::is_none) {
                "no firmware.min_version entry is of its family"
            } else {
                "below firmware.min_version"
            };
            return refuse(
                BootReason::Firmware,
                format!("firmware version {have:?}: {why}"),
                Some(v.event),
            );
        }
    }
    if !policy.dbx_min.is_empty() {
        let Some(dbx) = &facts.dbx else {
            return refuse(BootReason::Dbx, "the dbx was not measured".to_owned(), None);
        };
        if !dbx.value.complete {
            return refuse(
                BootReason::Dbx,
                "the measured dbx could not be read in full".to_owned(),
                Some(dbx.event),
            );
        }
        let have: BTreeSet<String> = dbx.value.entries.iter().map(signature_key).collect();
        let missing: Vec<&String> = policy.dbx_min.difference(&have).collect();
        if let Some(first) = missing.first() {
            return refuse(
                BootReason::Dbx,
                format!(
                    "the dbx lacks {} of the {} dbx_min entries, first {first}",
                    missing.len(),
                    policy.dbx_min.len()
                ),
                Some(dbx.event),
            );
        }
    }
    if !policy.boot_apps.is_empty() {
        for (i, app) in facts.boot_apps.iter().enumerate() {
            let digests: Vec<String> = app
                .authenticode
                .iter()
                .map(|d| hex::encode(&d.value))
                .collect();
            let has_digest = |rule: &BootApp| {
                rule.digests.is_empty() || rule.digests.iter().any(|d| digests.contains(d))
            };
            let by_digest = policy
                .boot_apps
                .iter()
                .any(|rule| rule.authorities.is_empty() && has_digest(rule));
            // Each certificate that may have verified it, by its names.
            let candidates: Vec<Vec<String>> = app_authorities(facts, i)
                .into_iter()
                .map(|a| authority_names(&a.entry))
                .filter(|names| !names.is_empty())
                .collect();
            // Firmware logs an authority once, so an application after
            // others may have been verified by any authority logged so far
            // (shim's kernel: the db's CA or shim's vendor CA): every one
            // must be allowed, else allowing shim's CA would allow whatever
            // shim went on to verify.
            let by_authority = !candidates.is_empty()
                && candidates.iter().all(|names| {
                    policy.boot_apps.iter().any(|rule| {
                        has_digest(rule) && rule.authorities.iter().any(|a| names.contains(a))
                    })
                });
            let allowed = by_digest || by_authority;
            if !allowed {
                let digest = app
                    .authenticode
                    .iter()
                    .find(|d| d.alg() == Some(Alg::Sha256))
                    .or(app.authenticode.first())
                    .map(|d| hex::encode(&d.value))
                    .unwrap_or_default();
                let path = app
                    .path
                    .as_deref()
                    .filter(|p| !p.is_empty())
                    .unwrap_or("(no path)");
                return refuse(
                    BootReason::App,
                    format!("boot application {path} with digest {digest} is allowed by no boot_app entry"),
                    Some(app.event),
                );
            }
        }
    }
    if !policy.cmdline.is_empty() {
        if facts.kernel_cmdlines.is_empty() {
            return refuse(
                BootReason::Cmdline,
                "no kernel command line was measured".to_owned(),
                None,
            );
        }
        for c in &facts.kernel_cmdlines {
            if !policy.cmdline.iter().any(|p| glob(p, &c.value)) {
                return refuse(
                    BootReason::Cmdline,
                    format!(
                        "kernel command line {:?} matches no cmdline pattern",
                        c.value
                    ),
                    Some(c.event),
                );
            }
        }
    }
    Ok(())
}

/// A starting policy from a known-good machine's facts (as keylime's
/// `create_mb_refstate`): Secure Boot as it was, its boot applications by
/// digest and by the authority that verified them, its command lines and
/// firmware version as they were. Comments say what to review.
pub fn from_facts(facts: &BootFacts) -> String {
    let mut p = BootPolicy {
        secure_boot_required: facts.secure_boot_enabled(),
        ..BootPolicy::default()
    };
    for (i, app) in facts.boot_apps.iter().enumerate() {
        let digests: Vec<String> = app
            .authenticode
            .iter()
            .filter(|d| d.alg() == Some(Alg::Sha256))
            .chain(app.authenticode.first())
            .map(|d| hex::encode(&d.value))
            .take(1)
            .collect();
        let mut authorities: Vec<String> = app_authorities(facts, i)
            .into_iter()
            .filter_map(|a| match &a.entry {
                AuthorityEntry::Certificate { der, .. } => Some(hex::encode(bc_wire::sha256(der))),
                _ => None,
            })
            .collect();
        authorities.dedup();
        if digests.is_empty() && authorities.is_empty() {
            continue;
        }
        p.boot_apps.push(BootApp {
            digests,
            authorities,
        });
    }
    let mut seen = BTreeSet::new();
    p.cmdline = facts
        .kernel_cmdlines
        .iter()
        .filter(|c| seen.insert(c.value.clone()))
        .map(|c| c.value.clone())
        .collect();
    p.firmware_min = facts
        .scrtm_version
        .first()
        .map(|v| version_text(&v.value))
        .into_iter()
        .collect();
    let mut out = String::from(
        "# A starting boot policy from a known-good machine's event log: review it.\n\
         # boot_app: allows each application by its digest AND the authority that verified it;\n\
         # drop the digest to allow any application that authority signed (updates), or add\n\
         # digests to allow several versions. Add dbx_min = \"<official dbx update file>\".\n",
    );
    if !facts.secure_boot_enabled() {
        out.push_str("# Secure Boot was off on this machine: secure_boot = \"allowed\".\n");
    }
    for (i, app) in facts.boot_apps.iter().enumerate() {
        let names: Vec<String> = app_authorities(facts, i)
            .into_iter()
            .filter_map(|a| match &a.entry {
                AuthorityEntry::Certificate { der, .. } => authority_subject(der),
                _ => None,
            })
            .collect();
        let _ = writeln!(
            out,
            "# boot_app {i}: {} (event {}){}",
            app.path
                .as_deref()
                .filter(|p| !p.is_empty())
                .unwrap_or("(no path)"),
            app.event,
            if names.is_empty() {
                String::new()
            } else {
                format!(", verified by {}", names.join("; "))
            }
        );
    }
    out.push_str(&p.to_toml());
    out
}

#[cfg(test)]
mod tests;
