//! `bcd tpm identify`: what an operator needs to admit this machine.
//!
//! The control plane keys a TPM machine on the SHA-256 of its EK's
//! SubjectPublicKeyInfo (`resolve add --ek-sha256`, join requests), so that
//! is the first thing printed; then whether the maker's EK certificate is
//! there and who issued it, and the TPM's maker and firmware.
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use serde::Serialize;

use crate::config::{Config, ConfigArg, DEFAULT_PATH};
use crate::keys::TpmAccess;
use crate::out;
use crate::pki::rfc3339;
use crate::tpm::{Ek, EkKind, TpmInfo};

#[derive(clap::Args, Debug)]
pub(crate) struct IdentifyArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Print a JSON object instead of lines
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Identification {
    /// Hex SHA-256 of the EK's SubjectPublicKeyInfo DER: the certificate's
    /// key when there is a certificate (what the control plane keys on).
    ek_sha256: String,
    /// Which EK: "rsa", "ecc-p256" or "ecc-p384".
    ek_kind: EkKind,
    /// Whether the kind's persistent EK was used.
    ek_persistent: bool,
    /// Where the EK came from: "persistent", "default-template",
    /// "default-template+nv-nonce", "nv-template" or "nv-template+nv-nonce".
    ek_source: String,
    /// Whether the TPM's EK is the key its certificate names (null: no
    /// certificate). When false the control plane refuses it `ek-mismatch`.
    ek_matches_certificate: Option<bool>,
    /// Hex SHA-256 of the TPM's own EK's SubjectPublicKeyInfo.
    tpm_ek_sha256: String,
    /// The kind's persistent handle holds another key than the certificate's.
    persistent_ek_mismatch: bool,
    ek_certificate: EkCertificate,
    tpm: TpmJson,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EkCertificate {
    present: bool,
    /// Where it came from: "nv" (the TPM's EK certificate NV index) or
    /// "operator-file" (`[tpm] ek_certificate`); null when there is none.
    source: Option<crate::tpm::CertificateSource>,
    issuer: Option<String>,
    serial: Option<String>,
    not_before: Option<String>,
    not_after: Option<String>,
    /// With none here: the maker's service the control plane fetches it
    /// from (null: its maker has none).
    maker_service: Option<&'static str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TpmJson {
    #[serde(flatten)]
    info: TpmInfo,
    software: bool,
    tcti: String,
}

pub(crate) fn run(args: IdentifyArgs) -> anyhow::Result<ExitCode> {
    // Identifying a machine precedes configuring it: without a config file at
    // the default place, the TPM comes from the environment or /dev/tpmrm0.
    let config = match args.config.path == Path::new(DEFAULT_PATH) && !args.config.path.exists() {
        true => None,
        false => Some(Config::load(&args.config.path)?),
    };
    let access = match &config {
        None => TpmAccess::new(None),
        Some(c) => TpmAccess::configured(c),
    };
    let file = config.and_then(|c| c.tpm_ek_certificate);
    let shared = access.open().context("cannot open the TPM")?;
    let mut tpm = crate::keys::lock_tpm(&shared)?;
    let info = tpm.info().context("cannot read the TPM's properties")?;
    let ek = tpm.ek().context("cannot read the EK")?;
    let spki = crate::tpm::ek_spki_der(&ek).context("cannot encode the EK")?;
    let own_spki = crate::tpm::public_spki_der(&ek.public).context("cannot encode the EK")?;
    let source_text = source_text(&ek);
    if let Err(e) = tpm.release_ek(&ek) {
        tracing::debug!(error = %e, "cannot flush the EK");
    }
    let cert = match &ek.certificate {
        None => EkCertificate {
            present: false,
            source: None,
            issuer: None,
            serial: None,
            not_before: None,
            not_after: None,
            maker_service: info.ek_service(),
        },
        Some(der) => {
            let parsed =
                crate::pki::parse_cert(der).context("the EK certificate does not parse")?;
            EkCertificate {
                present: true,
                source: ek.certificate_source,
                issuer: Some(parsed.issuer),
                serial: Some(parsed.serial),
                not_before: Some(rfc3339(parsed.not_before)),
                not_after: Some(rfc3339(parsed.not_after)),
                maker_service: None,
            }
        }
    };
    let id = Identification {
        ek_sha256: hex::encode(bc_wire::sha256(&spki)),
        ek_kind: ek.kind,
        ek_persistent: ek.persistent,
        ek_source: source(&ek),
        ek_matches_certificate: ek.matches_certificate,
        tpm_ek_sha256: hex::encode(bc_wire::sha256(&own_spki)),
        persistent_ek_mismatch: ek.persistent_mismatch,
        ek_certificate: cert,
        tpm: TpmJson {
            software: info.is_software(),
            info,
            tcti: access.tcti().unwrap_or_default().to_owned(),
        },
    };
    if args.json {
        out::line(format_args!("{}", serde_json::to_string_pretty(&id)?))?;
        return Ok(ExitCode::SUCCESS);
    }
    let kind = id.ek_kind;
    if id.ek_matches_certificate == Some(false) {
        out::line(format_args!(
            "EK sha256      {} is the TPM's EK: it is NOT the key its certificate names (certificate's key sha256 {}); the control plane will refuse this TPM (ek-mismatch)",
            id.tpm_ek_sha256, id.ek_sha256
        ))?;
    } else {
        out::line(format_args!("EK sha256      {}", id.ek_sha256))?;
    }
    let c = &id.ek_certificate;
    match (&c.issuer, &c.serial, &c.not_before, &c.not_after) {
        (Some(issuer), Some(serial), Some(nb), Some(na)) => {
            let from = match (c.source, &file) {
                (Some(crate::tpm::CertificateSource::OperatorFile), Some(path)) => {
                    format!("from [tpm] ek_certificate {}", path.display())
                }
                _ => format!("NV {:#010x}", kind.certificate_index()),
            };
            out::line(format_args!(
                "EK certificate {issuer}, serial {serial}, valid {nb} to {na} ({from})"
            ))?
        }
        _ if c.maker_service.is_some() => out::line(format_args!(
            "EK certificate none in NV: the control plane fetches it from {} by the EK's hash (it joins as maker-service)",
            c.maker_service.unwrap_or_default()
        ))?,
        _ => out::line(format_args!(
            "EK certificate none at NV 0x01c00002, 0x01c0000a or 0x01c00016 (the control plane cannot verify this TPM's maker: set [tpm] ek_certificate to the maker's certificate for this EK, or have the operator pin it: resolve add --ek-sha256 {} --uncertified)",
            id.ek_sha256
        ))?,
    }
    out::line(format_args!(
        "EK             {}, {source_text}",
        kind.as_str()
    ))?;
    if id.persistent_ek_mismatch {
        out::line(format_args!(
            "EK             the persistent object at {:#010x} is not the certificate's EK (another key was put there); bcd derives the EK instead",
            kind.persistent_handle()
        ))?;
    }
    let t = &id.tpm;
    out::line(format_args!(
        "TPM            {} {} ({}), firmware {}, family {}{}",
        t.info.manufacturer,
        t.info.vendor,
        t.tcti,
        t.info.firmware,
        t.info.family,
        if t.software { ", a software TPM" } else { "" }
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// [`Identification::ek_source`].
fn source(ek: &Ek) -> String {
    if ek.persistent {
        return "persistent".to_owned();
    }
    let d = ek.derivation;
    let template = if d.nv_template {
        "nv-template"
    } else {
        "default-template"
    };
    match d.nv_nonce {
        true => format!("{template}+nv-nonce"),
        false => template.to_owned(),
    }
}

/// Where the EK came from, for people.
fn source_text(ek: &Ek) -> String {
    if ek.persistent {
        return format!("persistent at {:#010x}", ek.kind.persistent_handle());
    }
    let d = ek.derivation;
    let (nonce, template) = ek.kind.nonce_and_template_indices().unwrap_or_default();
    let mut text = match d.nv_template {
        true => format!("derived from the maker's template in NV {template:#010x}"),
        false => "derived from the default template".to_owned(),
    };
    if d.nv_nonce {
        text.push_str(&format!(" with the maker's nonce in NV {nonce:#010x}"));
    }
    text
}
