//! `eventlog show|verify` and `boot-policy from-log`: the event-log checks
//! the tpm attestor runs, offline, on files an operator already has (the
//! machine's `binary_bios_measurements`, `tpm2_pcrread` values, a
//! `tpm2_quote`'s message, signature and AK), so a policy can be written
//! and a refusal understood without a join.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use bc_controlplane::boot_policy::{
    always_extended, app_authorities, authority_subject, from_facts, judge, needed_pcrs,
    version_text, BootPolicy,
};
use bc_eventlog::{
    extract, parse, replay, verify, Alg, AuthorityEntry, BootFacts, EventLog, Limits, PcrValues,
    Quirk, Verification,
};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::{print_line, ExitWith};

#[derive(Subcommand)]
pub(crate) enum EventlogCmd {
    /// Print the replayed PCRs per bank, the Secure Boot state, the boot
    /// applications and the command lines of a TCG event log.
    Show {
        #[arg(long, value_name = "F")]
        log: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Exit nonzero unless every PCR the log extends matches --pcrs (and
    /// the quote, and the policy, when given).
    Verify(VerifyArgs),
}

#[derive(Args)]
pub(crate) struct VerifyArgs {
    #[arg(long, value_name = "F")]
    log: PathBuf,
    /// PCR values, JSON: {"sha256": {"0": "<hex>", ...}, "sha1": {...}}.
    #[arg(long, value_name = "F")]
    pcrs: Option<PathBuf>,
    /// A quote's TPMS_ATTEST bytes (tpm2_quote -m); needs --pcrs, --sig, --ak.
    #[arg(long, value_name = "ATTEST", requires_all = ["sig", "ak", "pcrs"])]
    quote: Option<PathBuf>,
    /// The quote's TPMT_SIGNATURE (tpm2_quote -s, ECDSA P-256 SHA-256).
    #[arg(long, value_name = "SIG", requires = "quote")]
    sig: Option<PathBuf>,
    /// The AK: TPMT_PUBLIC, TPM2B_PUBLIC (tpm2_createak -u) or PEM.
    #[arg(long, value_name = "AKPUB", requires = "quote")]
    ak: Option<PathBuf>,
    /// The nonce the quote must carry (its extraData), hex.
    #[arg(long, value_name = "HEX", requires = "quote")]
    nonce: Option<String>,
    /// A boot policy (TOML) to judge the log by.
    #[arg(long, value_name = "F")]
    policy: Option<PathBuf>,
    /// A known firmware defect to accept, by name (ExitBootServicesNotLogged).
    #[arg(long, value_name = "NAME")]
    allow_quirk: Vec<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub(crate) enum BootPolicyCmd {
    /// Print a starting boot policy (TOML) from a known-good machine's log.
    FromLog {
        #[arg(value_name = "LOG")]
        log: PathBuf,
    },
}

/// What a file holds, at most `max` bytes.
fn read(path: &Path, what: &str, max: usize) -> Result<Vec<u8>> {
    use std::io::Read as _;
    let f = std::fs::File::open(path)
        .with_context(|| format!("cannot read the {what} {}", path.display()))?;
    let mut buf = Vec::new();
    f.take(max as u64 + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("cannot read the {what} {}", path.display()))?;
    if buf.len() > max {
        bail!("the {what} {} is more than {max} bytes", path.display());
    }
    Ok(buf)
}

fn load_log(path: &Path) -> Result<(EventLog, BootFacts)> {
    let limits = Limits::default();
    let bytes = read(path, "event log", limits.max_bytes)?;
    let log = parse(&bytes, &limits).map_err(|e| {
        anyhow!(
            "{} is not a TCG event log bcd can read (eventlog-malformed): {e}",
            path.display()
        )
    })?;
    let facts = extract(&log, &limits);
    Ok((log, facts))
}

pub(crate) fn run_eventlog(cmd: EventlogCmd) -> Result<()> {
    match cmd {
        EventlogCmd::Show { log, json } => show(&log, json),
        EventlogCmd::Verify(args) => run_verify(args),
    }
}

pub(crate) fn run_boot_policy(cmd: BootPolicyCmd) -> Result<()> {
    match cmd {
        BootPolicyCmd::FromLog { log } => {
            let (_, facts) = load_log(&log)?;
            super::print_stdout(&from_facts(&facts))
        }
    }
}

fn secure_boot_json(f: &BootFacts) -> Value {
    let var = |m: &Option<bc_eventlog::Measured<Vec<u8>>>| {
        m.as_ref()
            .map(|m| json!({"value": hex::encode(&m.value), "event": m.event}))
    };
    let db = |m: &Option<bc_eventlog::Measured<bc_eventlog::SignatureDb>>| {
        m.as_ref().map(|m| {
            json!({"entries": m.value.entries.len(), "complete": m.value.complete, "event": m.event})
        })
    };
    json!({
        "enabled": f.secure_boot_enabled(),
        "SecureBoot": var(&f.secure_boot),
        "SetupMode": var(&f.setup_mode),
        "AuditMode": var(&f.audit_mode),
        "DeployedMode": var(&f.deployed_mode),
        "PK": db(&f.pk),
        "KEK": db(&f.kek),
        "db": db(&f.db),
        "dbx": db(&f.dbx),
    })
}

fn apps_json(f: &BootFacts) -> Vec<Value> {
    f.boot_apps
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let digests: BTreeMap<String, String> = a
                .authenticode
                .iter()
                .map(|d| {
                    let bank = d
                        .alg()
                        .map_or_else(|| format!("0x{:04x}", d.alg_id), |a| a.name().to_owned());
                    (bank, hex::encode(&d.value))
                })
                .collect();
            let authorities: Vec<Value> = app_authorities(f, i)
                .into_iter()
                .map(|x| match &x.entry {
                    AuthorityEntry::Certificate { der, .. } => json!({
                        "variable": x.variable,
                        "sha256": hex::encode(bc_wire::sha256(der)),
                        "subject": authority_subject(der),
                        "event": x.event,
                    }),
                    AuthorityEntry::Sha256 { digest, .. } => {
                        json!({"variable": x.variable, "hash": hex::encode(digest), "event": x.event})
                    }
                    AuthorityEntry::Value(_) => json!({"variable": x.variable, "event": x.event}),
                })
                .collect();
            json!({"event": a.event, "pcr": a.pcr, "path": a.path, "digests": digests, "authorities": authorities})
        })
        .collect()
}

fn show(path: &Path, as_json: bool) -> Result<()> {
    let (log, f) = load_log(path)?;
    let r = replay(&log, &[]);
    let mut banks = serde_json::Map::new();
    for b in &r.banks {
        let pcrs: serde_json::Map<String, Value> = b
            .pcrs()
            .filter_map(|p| Some((p.to_string(), json!(hex::encode(b.value(p)?)))))
            .collect();
        banks.insert(b.alg.name().to_owned(), Value::Object(pcrs));
    }
    let cmdlines: Vec<Value> = f
        .kernel_cmdlines
        .iter()
        .map(|c| json!({"event": c.event, "value": c.value}))
        .collect();
    let firmware: Vec<Value> = f
        .scrtm_version
        .iter()
        .map(|v| json!({"event": v.event, "version": version_text(&v.value)}))
        .collect();
    let warnings: Vec<Value> = f
        .warnings
        .iter()
        .map(|w| json!({"event": w.event, "message": w.message}))
        .collect();
    if as_json {
        // Every event with its digests: what a test (or an operator
        // rebuilding PCRs) extends.
        let events: Vec<Value> = log
            .events
            .iter()
            .map(|e| {
                let digests: serde_json::Map<String, Value> = e
                    .digests
                    .iter()
                    .filter_map(|d| {
                        Some((d.alg()?.name().to_owned(), json!(hex::encode(&d.value))))
                    })
                    .collect();
                json!({"index": e.index, "pcr": e.pcr, "type": e.event_type, "digests": digests})
            })
            .collect();
        let v = json!({
            "events": events,
            "pcrs": banks,
            "secureBoot": secure_boot_json(&f),
            "bootApps": apps_json(&f),
            "cmdlines": cmdlines,
            "firmwareVersions": firmware,
            "warnings": warnings,
        });
        return print_line(&serde_json::to_string_pretty(&v).context("cannot encode JSON")?);
    }
    let mut out = format!("events: {}\n", log.events.len());
    for b in &r.banks {
        out.push_str(&format!("pcrs {}:\n", b.alg.name()));
        for p in b.pcrs() {
            let v = b.value(p).map(hex::encode).unwrap_or_default();
            out.push_str(&format!("  {p:>2}: {v}\n"));
        }
    }
    let sb = match &f.secure_boot {
        None => "not measured".to_owned(),
        Some(m) if f.secure_boot_enabled() => format!("on (event {})", m.event),
        Some(m) => format!(
            "off: SecureBoot={:?} (event {})",
            hex::encode(&m.value),
            m.event
        ),
    };
    out.push_str(&format!("secure boot: {sb}\n"));
    for v in &f.scrtm_version {
        out.push_str(&format!(
            "firmware version: {} (event {})\n",
            version_text(&v.value),
            v.event
        ));
    }
    for (i, a) in f.boot_apps.iter().enumerate() {
        let digest = a
            .authenticode
            .iter()
            .find(|d| d.alg() == Some(Alg::Sha256))
            .or(a.authenticode.first())
            .map(|d| hex::encode(&d.value))
            .unwrap_or_default();
        let by: Vec<String> = app_authorities(&f, i)
            .into_iter()
            .filter_map(|x| match &x.entry {
                AuthorityEntry::Certificate { der, .. } => authority_subject(der),
                _ => None,
            })
            .collect();
        out.push_str(&format!(
            "boot app (event {}): {} digest {digest}{}\n",
            a.event,
            a.path
                .as_deref()
                .filter(|p| !p.is_empty())
                .unwrap_or("(no path)"),
            if by.is_empty() {
                String::new()
            } else {
                format!(" verified by {}", by.join("; "))
            }
        ));
    }
    for c in &f.kernel_cmdlines {
        out.push_str(&format!("cmdline (event {}): {}\n", c.event, c.value));
    }
    for w in &f.warnings {
        out.push_str(&format!("warning (event {}): {}\n", w.event, w.message));
    }
    super::print_stdout(&out)
}

/// `--pcrs`: {"sha256": {"0": "<hex>", ...}, ...}.
fn load_pcrs(path: &Path) -> Result<PcrValues> {
    let bytes = read(path, "PCR values", 1 << 20)?;
    let v: Value =
        serde_json::from_slice(&bytes).with_context(|| format!("{}: not JSON", path.display()))?;
    let bad = |what: String| {
        anyhow!(
            "{}: {what}; expected {{\"sha256\": {{\"0\": \"<hex>\", ...}}, \"sha1\": {{...}}}}",
            path.display()
        )
    };
    let Value::Object(banks) = v else {
        return Err(bad("not an object".to_owned()));
    };
    let mut out = PcrValues::new();
    for (bank, pcrs) in banks {
        let alg = Alg::from_name(&bank).ok_or_else(|| bad(format!("{bank:?} is no bank")))?;
        let Value::Object(pcrs) = pcrs else {
            return Err(bad(format!("{bank} is not an object")));
        };
        for (pcr, value) in pcrs {
            let n: u32 = pcr
                .parse()
                .ok()
                .filter(|&n| n < bc_eventlog::PCRS as u32)
                .ok_or_else(|| bad(format!("{bank}: {pcr:?} is no PCR index 0-23")))?;
            let hexv = value
                .as_str()
                .ok_or_else(|| bad(format!("{bank}.{pcr} is not a string")))?;
            let bytes = hex::decode(hexv.trim_start_matches("0x"))
                .ok()
                .filter(|b| b.len() == alg.size())
                .ok_or_else(|| {
                    bad(format!(
                        "{bank}.{pcr} is not the hex of a {}-byte value",
                        alg.size()
                    ))
                })?;
            out.entry(alg).or_default().insert(n, bytes);
        }
    }
    Ok(out)
}

/// The AK in any of the forms tpm2-tools writes.
fn load_ak(path: &Path) -> Result<p256::ecdsa::VerifyingKey> {
    use p256::pkcs8::DecodePublicKey as _;
    let bytes = read(path, "AK", 1 << 16)?;
    if let Ok(text) = std::str::from_utf8(&bytes) {
        if text.contains("-----BEGIN PUBLIC KEY-----") {
            return p256::ecdsa::VerifyingKey::from_public_key_pem(text)
                .map_err(|e| anyhow!("{}: not a P-256 public key PEM: {e}", path.display()));
        }
    }
    let tpmt = bc_wire::tpm::Public::parse(&bytes).or_else(|first| {
        // TPM2B_PUBLIC: a size, then the TPMT_PUBLIC.
        match bytes
            .get(..2)
            .map(|s| usize::from(u16::from_be_bytes([s[0], s[1]])))
        {
            Some(n) if n + 2 == bytes.len() => bc_wire::tpm::Public::parse(&bytes[2..]),
            _ => Err(first),
        }
    });
    let public = tpmt.map_err(|e| {
        anyhow!(
            "{}: not a TPMT_PUBLIC, TPM2B_PUBLIC or PEM public key: {e}",
            path.display()
        )
    })?;
    public
        .p256_key()
        .map_err(|e| anyhow!("{}: the AK is not a P-256 ECC key: {e}", path.display()))
}

/// Checks the quote; returns the problems found (empty: it holds).
fn check_quote(args: &VerifyArgs, pcrs: &PcrValues) -> Result<Vec<String>> {
    use p256::ecdsa::signature::Verifier as _;
    let (Some(quote), Some(sig), Some(ak)) = (&args.quote, &args.sig, &args.ak) else {
        return Ok(Vec::new());
    };
    let attest_bytes = read(quote, "quote", 1 << 16)?;
    let sig_bytes = read(sig, "signature", 1 << 16)?;
    let key = load_ak(ak)?;
    let sig = bc_wire::tpm::parse_ecdsa_signature(&sig_bytes)
        .map_err(|e| anyhow!("{}: not an ECDSA-SHA256 TPMT_SIGNATURE: {e}", sig.display()))?;
    let attest = bc_wire::tpm::Attest::parse(&attest_bytes)
        .map_err(|e| anyhow!("{}: not a TPMS_ATTEST: {e}", quote.display()))?;
    let mut problems = Vec::new();
    if key.verify(&attest_bytes, &sig).is_err() {
        problems.push(
            "the quote's signature does not verify under the AK (quote-signature)".to_owned(),
        );
    }
    if let Some(nonce) = &args.nonce {
        let want = hex::decode(nonce).map_err(|_| anyhow!("--nonce {nonce:?} is not hex"))?;
        if attest.extra_data != want {
            problems.push(format!(
                "the quote carries nonce {}, not {nonce} (quote-nonce)",
                hex::encode(&attest.extra_data)
            ));
        }
    }
    let bc_wire::tpm::Attested::Quote {
        selection,
        pcr_digest,
    } = &attest.attested
    else {
        problems.push("the TPMS_ATTEST is not a quote".to_owned());
        return Ok(problems);
    };
    let mut concat = Vec::new();
    for (hash, bitmap) in selection {
        let Some(alg) = Alg::from_id(*hash) else {
            problems.push(format!(
                "the quote selects bank 0x{hash:04x}, which bcd does not know"
            ));
            continue;
        };
        for (byte, bits) in bitmap.iter().enumerate() {
            for bit in 0..8 {
                if bits & (1 << bit) == 0 {
                    continue;
                }
                let pcr = (byte * 8 + bit) as u32;
                match pcrs.get(&alg).and_then(|b| b.get(&pcr)) {
                    Some(v) => concat.extend_from_slice(v),
                    None => problems.push(format!(
                        "the quote selects PCR {pcr} in bank {}, which --pcrs lacks (quote-pcrs)",
                        alg.name()
                    )),
                }
            }
        }
    }
    if problems.iter().all(|p| !p.ends_with("(quote-pcrs)"))
        && bc_wire::sha256(&concat).as_slice() != pcr_digest.as_slice()
    {
        problems.push(
            "the quote's PCR digest is not that of --pcrs over the PCRs it selects (quote-pcrs)"
                .to_owned(),
        );
    }
    Ok(problems)
}

fn verification_json(v: &Verification) -> Value {
    let pairs = |l: &[(Alg, u32)]| -> Vec<Value> {
        l.iter()
            .map(|(a, p)| json!({"bank": a.name(), "pcr": p}))
            .collect()
    };
    json!({
        "mismatches": v.mismatches.iter().map(|m| json!({
            "bank": m.alg.name(), "pcr": m.pcr, "replayed": hex::encode(&m.replayed),
            "supplied": hex::encode(&m.supplied), "lastEvent": m.last_event,
        })).collect::<Vec<_>>(),
        "matched": pairs(&v.matched),
        "notInLog": pairs(&v.not_in_log),
        "neverExtended": pairs(&v.never_extended),
        "quirks": v.quirks.iter().map(|q| q.name()).collect::<Vec<_>>(),
    })
}

fn run_verify(args: VerifyArgs) -> Result<()> {
    let mut quirks = Vec::new();
    for name in &args.allow_quirk {
        match name.as_str() {
            "ExitBootServicesNotLogged" => quirks.push(Quirk::ExitBootServicesNotLogged),
            other => bail!("--allow-quirk {other:?}: bcd knows ExitBootServicesNotLogged only"),
        }
    }
    if args.pcrs.is_none() && args.policy.is_none() {
        bail!("nothing to verify: give --pcrs (and --quote) and/or --policy");
    }
    let policy = match &args.policy {
        Some(p) => Some(BootPolicy::load(p).map_err(|e| anyhow!("{e}"))?),
        None => None,
    };
    let (log, facts) = load_log(&args.log)?;
    let mut failures: Vec<String> = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    let mut out = serde_json::Map::new();
    if let Some(path) = &args.pcrs {
        let pcrs = load_pcrs(path)?;
        let needed = policy
            .as_ref()
            .map(|p| always_extended(&needed_pcrs(p)))
            .unwrap_or_default();
        let v = verify(&log, &pcrs, &needed, &quirks);
        for m in &v.mismatches {
            let event = m
                .last_event
                .map_or_else(String::new, |e| format!(" (last event {e})"));
            failures.push(format!(
                "eventlog-replay: PCR {} in bank {}: the log replays to {}, --pcrs says {}{event}",
                m.pcr,
                m.alg.name(),
                hex::encode(&m.replayed),
                hex::encode(&m.supplied)
            ));
        }
        for (a, p) in &v.never_extended {
            failures.push(format!(
                "eventlog-bank-empty: PCR {p} in bank {} is all zeros or all ones: that bank was never extended",
                a.name()
            ));
        }
        if v.matched.is_empty() && v.mismatches.is_empty() {
            failures.push("the log extends none of the PCRs --pcrs gives".to_owned());
        }
        for (a, p) in &v.matched {
            lines.push(format!("PCR {p} in bank {}: matches", a.name()));
        }
        for (a, p) in &v.not_in_log {
            lines.push(format!(
                "PCR {p} in bank {}: not extended by the log (not checked)",
                a.name()
            ));
        }
        for q in &v.quirks {
            lines.push(format!("firmware defect accepted: {}", q.name()));
        }
        out.insert("pcrs".to_owned(), verification_json(&v));
        if args.quote.is_some() {
            let problems = check_quote(&args, &pcrs)?;
            if problems.is_empty() {
                lines.push("quote: verifies under the AK over --pcrs".to_owned());
            }
            out.insert(
                "quote".to_owned(),
                json!({"ok": problems.is_empty(), "problems": problems}),
            );
            failures.extend(problems);
        }
    } else {
        lines.push("no --pcrs: the log's values are not checked against a TPM".to_owned());
    }
    if let Some(p) = &policy {
        match judge(p, &facts) {
            Ok(()) => {
                lines.push("policy: allowed".to_owned());
                out.insert("policy".to_owned(), json!({"verdict": "allowed"}));
            }
            Err(r) => {
                let event = r
                    .event
                    .map_or_else(|| "no event".to_owned(), |e| format!("event {e}"));
                failures.push(format!(
                    "policy: refused {}: {} ({event})",
                    r.reason, r.detail
                ));
                out.insert(
                    "policy".to_owned(),
                    json!({"verdict": "refused", "reason": r.reason.as_str(), "detail": r.detail, "event": r.event}),
                );
            }
        }
    }
    out.insert("ok".to_owned(), json!(failures.is_empty()));
    out.insert("failures".to_owned(), json!(failures));
    if args.json {
        print_line(
            &serde_json::to_string_pretty(&Value::Object(out)).context("cannot encode JSON")?,
        )?;
    } else {
        let mut text = String::new();
        for l in &lines {
            text.push_str(l);
            text.push('\n');
        }
        if failures.is_empty() {
            text.push_str("verified\n");
        }
        super::print_stdout(&text)?;
    }
    if failures.is_empty() {
        return Ok(());
    }
    Err(ExitWith {
        code: 1,
        message: format!(
            "the event log does not verify:\n  {}",
            failures.join("\n  ")
        ),
    }
    .into())
}
