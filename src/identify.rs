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
use crate::tpm::TpmInfo;

#[derive(clap::Args, Debug)]
pub struct IdentifyArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Print a JSON object instead of lines
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Identification {
    /// Hex SHA-256 of the EK's SubjectPublicKeyInfo DER.
    ek_sha256: String,
    /// Whether the persistent EK (0x81010001) was used.
    ek_persistent: bool,
    ek_certificate: EkCertificate,
    tpm: TpmJson,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EkCertificate {
    present: bool,
    issuer: Option<String>,
    serial: Option<String>,
    not_before: Option<String>,
    not_after: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TpmJson {
    #[serde(flatten)]
    info: TpmInfo,
    software: bool,
    tcti: String,
}

pub fn run(args: IdentifyArgs) -> anyhow::Result<ExitCode> {
    // Identifying a machine precedes configuring it: without a config file at
    // the default place, the TPM comes from the environment or /dev/tpmrm0.
    let tcti = if args.config.path == Path::new(DEFAULT_PATH) && !args.config.path.exists() {
        None
    } else {
        Config::load(&args.config.path)?.tpm_tcti
    };
    let access = TpmAccess::new(tcti.as_deref());
    let shared = access.open().context("cannot open the TPM")?;
    let mut tpm = crate::keys::lock_tpm(&shared)?;
    let info = tpm.info().context("cannot read the TPM's properties")?;
    let ek = tpm.ek().context("cannot read the EK")?;
    let spki = crate::tpm::ek_spki_der(&ek).context("cannot encode the EK")?;
    let cert = match &ek.certificate {
        None => EkCertificate {
            present: false,
            issuer: None,
            serial: None,
            not_before: None,
            not_after: None,
        },
        Some(der) => {
            let parsed =
                crate::pki::parse_cert(der).context("the EK certificate does not parse")?;
            EkCertificate {
                present: true,
                issuer: Some(parsed.issuer),
                serial: Some(parsed.serial),
                not_before: Some(rfc3339(parsed.not_before)),
                not_after: Some(rfc3339(parsed.not_after)),
            }
        }
    };
    let id = Identification {
        ek_sha256: hex::encode(bc_wire::sha256(&spki)),
        ek_persistent: ek.persistent,
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
    out::line(format_args!("EK sha256      {}", id.ek_sha256))?;
    let c = &id.ek_certificate;
    match (&c.issuer, &c.serial, &c.not_before, &c.not_after) {
        (Some(issuer), Some(serial), Some(nb), Some(na)) => {
            out::line(format_args!("EK certificate {issuer}, serial {serial}, valid {nb} to {na}"))?
        }
        _ => out::line(format_args!(
            "EK certificate none at NV 0x01c00002 (the control plane cannot verify this TPM's maker)"
        ))?,
    }
    out::line(format_args!(
        "EK             {}",
        if id.ek_persistent {
            "persistent at 0x81010001"
        } else {
            "derived from the default template"
        }
    ))?;
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
