//! What an operator reasons about, read from a parsed log: Secure Boot
//! state, the authorities that verified boot applications, the
//! applications' Authenticode digests, firmware versions, the GPT, the
//! command lines and commands the boot loaders measured, UKI sections,
//! SBAT and MokList. Facts come from events whose digests can be checked
//! against their data where the PFP spec says the data is what was
//! measured; where that check fails the fact is left out and a warning
//! says so. Nothing here proves the log is the TPM's: pair it with
//! [`crate::verify`].

use crate::parse::{Digest, Event, EventLog, Limits};
use crate::uefi::{
    device_path_text, is_der_sequence, parse_gpt, parse_signature_lists, parse_variable, u32_at,
    u64_at, utf16, Gpt, Guid, SigListError, Signature, EFI_GLOBAL_VARIABLE,
    EFI_IMAGE_SECURITY_DATABASE, SHIM_LOCK,
};

const EV_POST_CODE: u32 = 0x1;
const EV_SEPARATOR: u32 = 0x4;
const EV_EVENT_TAG: u32 = 0x6;
const EV_S_CRTM_CONTENTS: u32 = 0x7;
const EV_S_CRTM_VERSION: u32 = 0x8;
const EV_IPL: u32 = 0xd;
const EV_EFI_VARIABLE_DRIVER_CONFIG: u32 = 0x8000_0001;
const EV_EFI_BOOT_SERVICES_APPLICATION: u32 = 0x8000_0003;
const EV_EFI_GPT_EVENT: u32 = 0x8000_0006;
const EV_EFI_PLATFORM_FIRMWARE_BLOB: u32 = 0x8000_0008;
const EV_EFI_PLATFORM_FIRMWARE_BLOB2: u32 = 0x8000_000A;
const EV_EFI_VARIABLE_AUTHORITY: u32 = 0x8000_00E0;

/// A fact and the event it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measured<T> {
    /// The event's index in the log.
    pub event: usize,
    pub value: T,
}

/// A signature database as measured (PK, KEK, db, dbx, MokList).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureDb {
    pub entries: Vec<Signature>,
    /// False when the lists were malformed or had more entries than
    /// [`Limits::max_entries`]: `entries` then holds what was read.
    pub complete: bool,
}

/// What an EV_EFI_VARIABLE_AUTHORITY event names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthorityEntry {
    /// An EFI_SIGNATURE_DATA holding a certificate. `owner` is None for
    /// shim's malformed event that omits the owner GUID
    /// (go-attestation issue 157), read tolerantly and warned about.
    Certificate { owner: Option<Guid>, der: Vec<u8> },
    /// An EFI_SIGNATURE_DATA holding an image digest (a db hash entry).
    Sha256 { owner: Guid, digest: Vec<u8> },
    /// Anything else (shim's SbatLevel string, MokListTrusted's byte).
    Value(Vec<u8>),
}

/// One EV_EFI_VARIABLE_AUTHORITY event: the db/MOK entry that verified
/// an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    pub event: usize,
    pub pcr: u32,
    /// The variable the authority came from: "db", "MokList", "Shim", ...
    pub variable: String,
    pub guid: Guid,
    pub entry: AuthorityEntry,
    /// Logged after PCR 7's separator: it verified a boot application,
    /// not a driver or option ROM.
    pub after_separator: bool,
    /// The event's digests are the hash of its data, as the PFP spec
    /// says they must be (false for shim's malformed events).
    pub digest_matches: bool,
}

/// A boot application the firmware (or shim) loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootApp {
    pub event: usize,
    pub pcr: u32,
    /// The image's Authenticode digests, one per bank.
    pub authenticode: Vec<Digest>,
    /// Its device path in UEFI text form, when the nodes are simple.
    pub path: Option<String>,
    /// Indices into [`BootFacts::authorities`] of the authorities logged
    /// since the previous boot application: firmware logs each authority
    /// once, the first time it verifies an image.
    pub new_authorities: Vec<usize>,
}

/// A platform firmware blob (EV_EFI_PLATFORM_FIRMWARE_BLOB[2],
/// EV_POST_CODE, EV_S_CRTM_CONTENTS): where it was and its digests, or
/// the description the firmware logged instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirmwareBlob {
    pub event: usize,
    pub description: Option<String>,
    pub base: Option<u64>,
    pub length: Option<u64>,
    pub digests: Vec<Digest>,
}

/// A firmware version string (EV_S_CRTM_VERSION): UTF-16 text when it is
/// text, else the raw bytes (some firmware logs a GUID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub raw: Vec<u8>,
    pub text: Option<String>,
}

/// A warning about an event bcd could not fully trust or read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub event: usize,
    pub message: String,
}

/// Everything [`extract`] reads from a log.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BootFacts {
    /// The SecureBoot variable's data (01: on); None if not measured.
    pub secure_boot: Option<Measured<Vec<u8>>>,
    pub setup_mode: Option<Measured<Vec<u8>>>,
    pub audit_mode: Option<Measured<Vec<u8>>>,
    pub deployed_mode: Option<Measured<Vec<u8>>>,
    pub pk: Option<Measured<SignatureDb>>,
    pub kek: Option<Measured<SignatureDb>>,
    pub db: Option<Measured<SignatureDb>>,
    pub dbx: Option<Measured<SignatureDb>>,
    pub authorities: Vec<Authority>,
    pub boot_apps: Vec<BootApp>,
    pub scrtm_version: Vec<Measured<Version>>,
    pub scrtm_contents: Vec<FirmwareBlob>,
    pub firmware_blobs: Vec<FirmwareBlob>,
    pub gpt: Vec<Measured<Gpt>>,
    /// Kernel command lines: grub's "kernel_cmdline: " (PCR 8, after the
    /// kernel's path, as grub logs it) and systemd-boot/stub's load
    /// options (PCR 12 EV_IPL strings, or tagged events with the load
    /// options tag; an older stub's credentials, also EV_IPL in PCR 12,
    /// cannot be told apart and land here too).
    pub kernel_cmdlines: Vec<Measured<String>>,
    /// grub's "grub_cmd: " strings (PCR 8), without the prefix.
    pub grub_commands: Vec<Measured<String>>,
    /// Files grub measured (PCR 9 EV_IPL strings: kernel, initrd, config).
    pub loaded_files: Vec<Measured<String>>,
    /// Unified kernel image sections systemd-stub measured (PCR 11).
    pub uki_sections: Vec<Measured<String>>,
    /// shim's SbatLevel (a PCR 7 authority event).
    pub sbat_level: Option<Measured<String>>,
    /// shim's MokList, MokListX, MokListTrusted measurements (PCR 14,
    /// EV_IPL, named by the event data; the digests are of the contents).
    pub mok_measurements: Vec<Measured<String>>,
    /// MokListTrusted as shim logs it in PCR 7 (an authority event).
    pub mok_list_trusted: Option<Measured<Vec<u8>>>,
    pub warnings: Vec<Warning>,
}

impl BootFacts {
    /// Secure Boot was on: SecureBoot measured as the single byte 01.
    pub fn secure_boot_enabled(&self) -> bool {
        self.secure_boot.as_ref().is_some_and(|m| m.value == [1])
    }

    /// The authorities logged after PCR 7's separator.
    pub fn post_separator_authorities(&self) -> impl Iterator<Item = &Authority> {
        self.authorities.iter().filter(|a| a.after_separator)
    }

    fn warn(&mut self, event: usize, message: impl Into<String>) {
        self.warnings.push(Warning {
            event,
            message: message.into(),
        });
    }
}

/// Event data as text: UTF-8 (or Latin-1) without trailing NULs.
fn text(b: &[u8]) -> String {
    let b = match b.iter().rposition(|&c| c != 0) {
        Some(end) => &b[..=end],
        None => &[],
    };
    match std::str::from_utf8(b) {
        Ok(s) => s.to_string(),
        Err(_) => b.iter().map(|&c| char::from(c)).collect(),
    }
}

/// UTF-16LE text if the data is UTF-16 (a NUL in every odd byte of an
/// ASCII string), else 8-bit text.
fn utf16_or_text(b: &[u8]) -> String {
    let looks_utf16 =
        b.len() >= 2 && b.len() % 2 == 0 && b.iter().skip(1).step_by(2).all(|&c| c == 0);
    match looks_utf16.then(|| utf16(b)).flatten() {
        Some(s) => s,
        None => text(b),
    }
}

/// Reads the facts of a parsed log. `limits.max_entries` bounds the
/// signature databases and device paths.
pub fn extract(log: &EventLog, limits: &Limits) -> BootFacts {
    let mut f = BootFacts::default();
    let mut separator7 = false;
    let mut since_last_app: Vec<usize> = Vec::new();
    for e in &log.events {
        match e.event_type {
            EV_SEPARATOR if e.pcr == 7 => separator7 = true,
            EV_EFI_VARIABLE_DRIVER_CONFIG if e.pcr == 7 => driver_config(&mut f, e, limits),
            EV_EFI_VARIABLE_AUTHORITY if e.pcr == 7 => {
                // Before the separator, authorities verified drivers and
                // option ROMs, not boot applications.
                if let Some(i) = authority(&mut f, e, separator7) {
                    if separator7 {
                        since_last_app.push(i);
                    }
                }
            }
            EV_EFI_BOOT_SERVICES_APPLICATION => {
                let path = u64_at(&e.data, 24)
                    .and_then(|n| usize::try_from(n).ok())
                    .and_then(|n| e.data.get(32..32usize.checked_add(n)?))
                    .and_then(|dp| device_path_text(dp, limits.max_entries));
                f.boot_apps.push(BootApp {
                    event: e.index,
                    pcr: e.pcr,
                    authenticode: e.digests.clone(),
                    path,
                    new_authorities: std::mem::take(&mut since_last_app),
                });
            }
            EV_S_CRTM_VERSION => {
                let looks_utf16 = e.data.len() % 2 == 0
                    && e.data.iter().skip(1).step_by(2).all(|&c| c == 0)
                    && e.data.iter().any(|&c| c != 0);
                f.scrtm_version.push(Measured {
                    event: e.index,
                    value: Version {
                        raw: e.data.clone(),
                        text: looks_utf16.then(|| utf16(&e.data)).flatten(),
                    },
                });
            }
            EV_S_CRTM_CONTENTS => {
                let blob = firmware_blob(e);
                f.scrtm_contents.push(blob);
            }
            EV_POST_CODE | EV_EFI_PLATFORM_FIRMWARE_BLOB | EV_EFI_PLATFORM_FIRMWARE_BLOB2 => {
                let blob = firmware_blob(e);
                f.firmware_blobs.push(blob);
            }
            EV_EFI_GPT_EVENT => match parse_gpt(&e.data, limits.max_entries) {
                Some(gpt) => f.gpt.push(Measured {
                    event: e.index,
                    value: gpt,
                }),
                None => f.warn(
                    e.index,
                    "EV_EFI_GPT_EVENT is not a UEFI_GPT_DATA bcd can read",
                ),
            },
            EV_IPL | EV_EVENT_TAG => ipl(&mut f, e),
            _ => {}
        }
    }
    f
}

fn firmware_blob(e: &Event) -> FirmwareBlob {
    let (description, rest) = if e.event_type == EV_EFI_PLATFORM_FIRMWARE_BLOB2 {
        let n = usize::from(e.data.first().copied().unwrap_or(0));
        let desc = e.data.get(1..1 + n).map(text);
        (desc, e.data.get(1 + n..).unwrap_or(&[]))
    } else if e.data.len() != 16 {
        // EV_S_CRTM_CONTENTS and EV_POST_CODE: a blob, or a description.
        (Some(text(&e.data)), &[][..])
    } else {
        (None, e.data.as_slice())
    };
    FirmwareBlob {
        event: e.index,
        description,
        base: u64_at(rest, 0),
        length: u64_at(rest, 8),
        digests: e.digests.clone(),
    }
}

fn driver_config(f: &mut BootFacts, e: &Event, limits: &Limits) {
    let Some(var) = parse_variable(&e.data) else {
        f.warn(
            e.index,
            "EV_EFI_VARIABLE_DRIVER_CONFIG is not a UEFI_VARIABLE_DATA",
        );
        return;
    };
    if !e.digests_match(&e.data) {
        f.warn(
            e.index,
            format!(
                "{}: the event's digest is not that of its data; ignored",
                var.name
            ),
        );
        return;
    }
    let global = var.guid == EFI_GLOBAL_VARIABLE;
    let security = var.guid == EFI_IMAGE_SECURITY_DATABASE;
    let value = |data: &[u8]| Measured {
        event: e.index,
        value: data.to_vec(),
    };
    let db = |f: &mut BootFacts| {
        let (entries, complete) = match parse_signature_lists(var.data, limits.max_entries) {
            Ok(entries) => (entries, true),
            Err(SigListError::TooManyEntries) => {
                f.warn(
                    e.index,
                    format!("{}: more than {} entries", var.name, limits.max_entries),
                );
                (Vec::new(), false)
            }
            Err(SigListError::Malformed) => {
                f.warn(
                    e.index,
                    format!("{}: malformed EFI_SIGNATURE_LIST", var.name),
                );
                (Vec::new(), false)
            }
        };
        Measured {
            event: e.index,
            value: SignatureDb { entries, complete },
        }
    };
    let slot = match (var.name.as_str(), global, security) {
        ("SecureBoot", true, _) => &mut f.secure_boot,
        ("SetupMode", true, _) => &mut f.setup_mode,
        ("AuditMode", true, _) => &mut f.audit_mode,
        ("DeployedMode", true, _) => &mut f.deployed_mode,
        ("PK", true, _) => {
            let m = db(f);
            set_once(f, e.index, "PK", |f| &mut f.pk, m);
            return;
        }
        ("KEK", true, _) => {
            let m = db(f);
            set_once(f, e.index, "KEK", |f| &mut f.kek, m);
            return;
        }
        ("db", _, true) => {
            let m = db(f);
            set_once(f, e.index, "db", |f| &mut f.db, m);
            return;
        }
        ("dbx", _, true) => {
            let m = db(f);
            set_once(f, e.index, "dbx", |f| &mut f.dbx, m);
            return;
        }
        (name, _, _) => {
            if [
                "SecureBoot",
                "SetupMode",
                "AuditMode",
                "DeployedMode",
                "PK",
                "KEK",
                "db",
                "dbx",
            ]
            .contains(&name)
            {
                f.warn(
                    e.index,
                    format!(
                        "{name} measured under GUID {} (not its own); ignored",
                        var.guid
                    ),
                );
            }
            return;
        }
    };
    if slot.is_some() {
        let name = var.name.clone();
        f.warn(e.index, format!("{name} measured twice; the first is kept"));
        return;
    }
    *slot = Some(value(var.data));
}

fn set_once<T>(
    f: &mut BootFacts,
    event: usize,
    name: &str,
    slot: impl Fn(&mut BootFacts) -> &mut Option<T>,
    value: T,
) {
    if slot(f).is_some() {
        f.warn(event, format!("{name} measured twice; the first is kept"));
    } else {
        *slot(f) = Some(value);
    }
}

/// Reads an authority event; returns its index in `f.authorities`.
fn authority(f: &mut BootFacts, e: &Event, after_separator: bool) -> Option<usize> {
    let Some(var) = parse_variable(&e.data) else {
        f.warn(
            e.index,
            "EV_EFI_VARIABLE_AUTHORITY is not a UEFI_VARIABLE_DATA",
        );
        return None;
    };
    // Kept either way (shim's malformed authority events carry digests
    // of something else), but said: a policy can refuse it.
    let digest_matches = e.digests_match(&e.data);
    if !digest_matches {
        f.warn(
            e.index,
            format!(
                "authority {}: the event's digest is not that of its data",
                var.name
            ),
        );
    }
    match (var.name.as_str(), var.guid == SHIM_LOCK) {
        ("SbatLevel", true) => {
            f.sbat_level = Some(Measured {
                event: e.index,
                value: text(var.data),
            });
            return None;
        }
        ("MokListTrusted", true) => {
            f.mok_list_trusted = Some(Measured {
                event: e.index,
                value: var.data.to_vec(),
            });
            return None;
        }
        _ => {}
    }
    let d = var.data;
    let entry = if d.len() > 16 && is_der_sequence(&d[16..]) {
        AuthorityEntry::Certificate {
            owner: Some(Guid(d[..16].try_into().ok()?)),
            der: d[16..].to_vec(),
        }
    } else if is_der_sequence(d) {
        f.warn(
            e.index,
            format!(
                "authority {}: a certificate without its owner GUID (shim's malformed \
                 EV_EFI_VARIABLE_AUTHORITY, go-attestation issue 157); read as the certificate",
                var.name
            ),
        );
        AuthorityEntry::Certificate {
            owner: None,
            der: d.to_vec(),
        }
    } else if d.len() == 48 {
        AuthorityEntry::Sha256 {
            owner: Guid(d[..16].try_into().ok()?),
            digest: d[16..].to_vec(),
        }
    } else {
        AuthorityEntry::Value(d.to_vec())
    };
    f.authorities.push(Authority {
        event: e.index,
        pcr: e.pcr,
        variable: var.name,
        guid: var.guid,
        entry,
        after_separator,
        digest_matches,
    });
    Some(f.authorities.len() - 1)
}

/// systemd's tag for the kernel command line (LOAD_OPTIONS_EVENT_TAG_ID).
const LOAD_OPTIONS_TAG: u32 = 0x8F3B_22ED;
const GRUB_CMD: &str = "grub_cmd: ";
const KERNEL_CMDLINE: &str = "kernel_cmdline: ";

fn ipl(f: &mut BootFacts, e: &Event) {
    // A TCG_PCClientTaggedEvent (systemd >= 254): id, size, data. In
    // PCR 12 only the load options tag is the command line.
    if e.event_type == EV_EVENT_TAG && e.pcr == 12 && u32_at(&e.data, 0) != Some(LOAD_OPTIONS_TAG) {
        return;
    }
    let data = if e.event_type == EV_EVENT_TAG {
        match u32_at(&e.data, 4).and_then(|n| e.data.get(8..8usize.checked_add(n as usize)?)) {
            Some(d) => d,
            None => return,
        }
    } else {
        e.data.as_slice()
    };
    let m = |value: String| Measured {
        event: e.index,
        value,
    };
    match e.pcr {
        8 if e.event_type == EV_IPL => {
            let s = text(data);
            if let Some(cmd) = s.strip_prefix(GRUB_CMD) {
                f.grub_commands.push(m(cmd.to_string()));
            } else if let Some(cmdline) = s.strip_prefix(KERNEL_CMDLINE) {
                f.kernel_cmdlines.push(m(cmdline.to_string()));
            }
        }
        9 if e.event_type == EV_IPL => f.loaded_files.push(m(text(data))),
        11 => f.uki_sections.push(m(utf16_or_text(data))),
        12 => f
            .kernel_cmdlines
            .push(m(utf16_or_text(data).trim().to_string())),
        14 if e.event_type == EV_IPL => f.mok_measurements.push(m(text(data))),
        _ => {}
    }
}
