//! The UEFI structures inside events: UEFI_VARIABLE_DATA,
//! EFI_SIGNATURE_LIST, device paths, UEFI_GPT_DATA. Each is read with
//! bounds checks and a cap on list entries; none recurses.

use std::fmt;

/// A UEFI GUID, stored as its 16 bytes on the wire (the first three
/// fields little-endian).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Guid(pub [u8; 16]);

impl Guid {
    /// From the canonical text form's fields.
    pub(crate) const fn new(a: u32, b: u16, c: u16, d: [u8; 8]) -> Guid {
        let a = a.to_le_bytes();
        let b = b.to_le_bytes();
        let c = c.to_le_bytes();
        Guid([
            a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5],
            d[6], d[7],
        ])
    }

    fn read(b: &[u8]) -> Option<Guid> {
        let mut g = [0u8; 16];
        g.copy_from_slice(b.get(..16)?);
        Some(Guid(g))
    }
}

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = &self.0;
        write!(
            f,
            "{:08x}-{:04x}-{:04x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
            u32::from_le_bytes([g[0], g[1], g[2], g[3]]),
            u16::from_le_bytes([g[4], g[5]]),
            u16::from_le_bytes([g[6], g[7]]),
            g[8],
            g[9],
            g[10],
            g[11],
            g[12],
            g[13],
            g[14],
            g[15]
        )
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// EFI_GLOBAL_VARIABLE: SecureBoot, PK, KEK, SetupMode, AuditMode, DeployedMode.
pub const EFI_GLOBAL_VARIABLE: Guid = Guid::new(
    0x8be4df61,
    0x93ca,
    0x11d2,
    [0xaa, 0x0d, 0x00, 0xe0, 0x98, 0x03, 0x2b, 0x8c],
);
/// EFI_IMAGE_SECURITY_DATABASE_GUID: db, dbx.
pub const EFI_IMAGE_SECURITY_DATABASE: Guid = Guid::new(
    0xd719b2cb,
    0x3d3a,
    0x4596,
    [0xa3, 0xbc, 0xda, 0xd0, 0x0e, 0x67, 0x65, 0x6f],
);
/// SHIM_LOCK_GUID: MokList, MokListX, MokListTrusted, SbatLevel, Shim.
pub const SHIM_LOCK: Guid = Guid::new(
    0x605dab50,
    0xe046,
    0x4300,
    [0xab, 0xb6, 0x3d, 0xd8, 0x10, 0xdd, 0x8b, 0x23],
);
const EFI_CERT_SHA256: Guid = Guid::new(
    0xc1c41626,
    0x504c,
    0x4092,
    [0xac, 0xa9, 0x41, 0xf9, 0x36, 0x93, 0x43, 0x28],
);
const EFI_CERT_X509: Guid = Guid::new(
    0xa5c059a1,
    0x94e4,
    0x4aa7,
    [0x87, 0xb5, 0xab, 0x15, 0x5c, 0x2b, 0xf0, 0x72],
);
/// EFI_CERT_TYPE_PKCS7_GUID, of an authenticated variable's signature.
const EFI_CERT_TYPE_PKCS7: Guid = Guid::new(
    0x4aafd29d,
    0x68df,
    0x49ee,
    [0x8a, 0xa9, 0x34, 0x7d, 0x37, 0x56, 0x65, 0xa7],
);

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
pub(crate) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
pub(crate) fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// UTF-16LE to text, up to the first NUL; None if it is not UTF-16.
pub(crate) fn utf16(b: &[u8]) -> Option<String> {
    if b.len() % 2 != 0 {
        return None;
    }
    let units: Vec<u16> = b
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|&u| u != 0)
        .collect();
    String::from_utf16(&units).ok()
}

/// UEFI_VARIABLE_DATA: a variable as measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Variable<'a> {
    pub(crate) guid: Guid,
    pub(crate) name: String,
    pub(crate) data: &'a [u8],
}

/// The longest variable name bcd reads (UEFI names are short).
const MAX_NAME_CHARS: u64 = 1024;

pub(crate) fn parse_variable(b: &[u8]) -> Option<Variable<'_>> {
    let guid = Guid::read(b)?;
    let name_chars = u64_at(b, 16)?;
    let data_len = u64_at(b, 24)?;
    if name_chars > MAX_NAME_CHARS {
        return None;
    }
    let name_end = 32 + usize::try_from(name_chars).ok()? * 2;
    let name = utf16(b.get(32..name_end)?)?;
    let data_end = name_end.checked_add(usize::try_from(data_len).ok()?)?;
    let data = b.get(name_end..data_end)?;
    Some(Variable { guid, name, data })
}

/// One entry of a signature database (db, dbx, KEK, PK, MokList).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signature {
    /// EFI_CERT_SHA256: an image's Authenticode digest.
    Sha256 { owner: Guid, digest: Vec<u8> },
    /// EFI_CERT_X509: a DER certificate.
    X509 { owner: Guid, der: Vec<u8> },
    /// Any other type (RSA2048, SHA-1, X509_SHA256 ...), kept as it is.
    Other {
        kind: Guid,
        owner: Guid,
        data: Vec<u8>,
    },
}

/// Why a signature database was not read in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SigListError {
    Malformed,
    TooManyEntries,
}

/// A sequence of EFI_SIGNATURE_LIST, at most `max` entries in all.
pub(crate) fn parse_signature_lists(
    mut b: &[u8],
    max: usize,
) -> Result<Vec<Signature>, SigListError> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let kind = Guid::read(b).ok_or(SigListError::Malformed)?;
        let list_size = u32_at(b, 16).ok_or(SigListError::Malformed)? as usize;
        let header_size = u32_at(b, 20).ok_or(SigListError::Malformed)? as usize;
        let sig_size = u32_at(b, 24).ok_or(SigListError::Malformed)? as usize;
        let list = b.get(..list_size).ok_or(SigListError::Malformed)?;
        let body = list
            .get(
                28usize
                    .checked_add(header_size)
                    .ok_or(SigListError::Malformed)?..,
            )
            .ok_or(SigListError::Malformed)?;
        if sig_size < 16 || body.len() % sig_size != 0 {
            return Err(SigListError::Malformed);
        }
        for sig in body.chunks_exact(sig_size) {
            if out.len() >= max {
                return Err(SigListError::TooManyEntries);
            }
            let owner = Guid::read(sig).ok_or(SigListError::Malformed)?;
            let data = sig[16..].to_vec();
            out.push(match kind {
                k if k == EFI_CERT_SHA256 && data.len() == 32 => Signature::Sha256 {
                    owner,
                    digest: data,
                },
                k if k == EFI_CERT_X509 => Signature::X509 { owner, der: data },
                _ => Signature::Other { kind, owner, data },
            });
        }
        b = &b[list_size..];
        if list_size == 0 {
            return Err(SigListError::Malformed);
        }
    }
    Ok(out)
}

/// The signature lists of an authenticated variable update (a dbx update
/// file as uefi.org and Microsoft publish it): EFI_VARIABLE_AUTHENTICATION_2
/// (EFI_TIME, then a WIN_CERTIFICATE_UEFI_GUID), then EFI_SIGNATURE_LISTs.
/// A bare sequence of lists is accepted too. The signature is not checked:
/// the caller trusts the file it names.
pub fn parse_signature_update(b: &[u8], max_entries: usize) -> Option<Vec<Signature>> {
    let lists = match (u32_at(b, 16), Guid::read(b.get(24..)?)) {
        (Some(len), Some(kind)) if kind == EFI_CERT_TYPE_PKCS7 => {
            b.get(16usize.checked_add(len as usize)?..)?
        }
        _ => b,
    };
    parse_signature_lists(lists, max_entries).ok()
}

/// Whether `b` is exactly one DER SEQUENCE (a certificate's outer shape).
pub(crate) fn is_der_sequence(b: &[u8]) -> bool {
    let (Some(&0x30), Some(&l0)) = (b.first(), b.get(1)) else {
        return false;
    };
    let (len, header) = if l0 < 0x80 {
        (usize::from(l0), 2)
    } else {
        let n = usize::from(l0 & 0x7f);
        if n == 0 || n > 4 {
            return false;
        }
        let Some(bytes) = b.get(2..2 + n) else {
            return false;
        };
        (
            bytes.iter().fold(0usize, |a, &x| (a << 8) | usize::from(x)),
            2 + n,
        )
    };
    header.checked_add(len) == Some(b.len())
}

fn guid_text(b: &[u8]) -> String {
    Guid::read(b).map_or_else(|| "?".into(), |g| g.to_string())
}

/// A device path as UEFI's text form, for the nodes boot applications
/// use (PCI, ACPI, SATA/NVMe/SCSI/USB, HD, file path, firmware volume);
/// others as `Path(type,subtype)`. None if the framing is broken.
pub(crate) fn device_path_text(mut b: &[u8], max_nodes: usize) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    let mut instance_start = true;
    let mut nodes = 0;
    while b.len() >= 4 {
        nodes += 1;
        if nodes > max_nodes {
            return None;
        }
        let (t, s) = (b[0], b[1]);
        let len = usize::from(u16_at(b, 2)?);
        if len < 4 {
            return None;
        }
        let node = b.get(..len)?;
        let d = &node[4..];
        b = &b[len..];
        let text = match (t, s) {
            (0x7f, 0xff) => break,
            (0x7f, 0x01) => {
                parts.push(",".into());
                instance_start = true;
                continue;
            }
            (0x01, 0x01) if d.len() >= 2 => format!("Pci({:#x},{:#x})", d[1], d[0]),
            (0x02, 0x01) if d.len() >= 8 => {
                let hid = u32_at(d, 0)?;
                let uid = u32_at(d, 4)?;
                match hid {
                    0x0a03_41d0 => format!("PciRoot({uid:#x})"),
                    0x0a08_41d0 => format!("PcieRoot({uid:#x})"),
                    _ => format!("Acpi({hid:#x},{uid:#x})"),
                }
            }
            (0x03, 0x02) if d.len() >= 4 => {
                format!("Scsi({:#x},{:#x})", u16_at(d, 0)?, u16_at(d, 2)?)
            }
            (0x03, 0x05) if d.len() >= 2 => format!("USB({:#x},{:#x})", d[0], d[1]),
            (0x03, 0x12) if d.len() >= 6 => format!(
                "Sata({:#x},{:#x},{:#x})",
                u16_at(d, 0)?,
                u16_at(d, 2)?,
                u16_at(d, 4)?
            ),
            (0x03, 0x17) if d.len() >= 4 => format!("NVMe({:#x})", u32_at(d, 0)?),
            (0x04, 0x01) if d.len() >= 38 => {
                let part = u32_at(d, 0)?;
                let start = u64_at(d, 4)?;
                let size = u64_at(d, 12)?;
                match d[37] {
                    2 => format!(
                        "HD({part},GPT,{},{start:#x},{size:#x})",
                        guid_text(&d[20..36])
                    ),
                    1 => format!(
                        "HD({part},MBR,{:#010x},{start:#x},{size:#x})",
                        u32_at(d, 20)?
                    ),
                    _ => format!("HD({part},?,{start:#x},{size:#x})"),
                }
            }
            (0x04, 0x04) => utf16(d)?,
            (0x04, 0x06) if d.len() >= 16 => format!("FvFile({})", guid_text(d)),
            (0x04, 0x07) if d.len() >= 16 => format!("Fv({})", guid_text(d)),
            _ => format!("Path({t},{s})"),
        };
        if !instance_start {
            parts.push("/".into());
        }
        parts.push(text);
        instance_start = false;
    }
    Some(parts.concat())
}

/// One partition of a measured GPT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub type_guid: Guid,
    pub unique_guid: Guid,
    pub first_lba: u64,
    pub last_lba: u64,
    pub attributes: u64,
    pub name: String,
}

/// A measured GPT (EV_EFI_GPT_EVENT: UEFI_GPT_DATA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpt {
    pub disk_guid: Guid,
    pub partitions: Vec<Partition>,
}

/// The header's size inside UEFI_GPT_DATA.
const GPT_HEADER: usize = 92;

pub(crate) fn parse_gpt(b: &[u8], max: usize) -> Option<Gpt> {
    if b.get(..8)? != b"EFI PART" {
        return None;
    }
    let disk_guid = Guid::read(b.get(56..)?)?;
    let entry_size = u32_at(b, 84)? as usize;
    let count = u64_at(b, GPT_HEADER)?;
    if entry_size < 128 || count > max as u64 {
        return None;
    }
    let entries = b.get(GPT_HEADER + 8..)?;
    let mut partitions = Vec::new();
    for i in 0..count as usize {
        let e = entries.get(i * entry_size..(i + 1) * entry_size)?;
        partitions.push(Partition {
            type_guid: Guid::read(e)?,
            unique_guid: Guid::read(&e[16..])?,
            first_lba: u64_at(e, 32)?,
            last_lba: u64_at(e, 40)?,
            attributes: u64_at(e, 48)?,
            name: utf16(e.get(56..128)?).unwrap_or_default(),
        });
    }
    Some(Gpt {
        disk_guid,
        partitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256_list(n: usize) -> Vec<u8> {
        let mut out = EFI_CERT_SHA256.0.to_vec();
        let size = 16 + 32;
        out.extend_from_slice(&((28 + n * size) as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(size as u32).to_le_bytes());
        for i in 0..n {
            out.extend_from_slice(&SHIM_LOCK.0);
            out.extend_from_slice(&[i as u8; 32]);
        }
        out
    }

    #[test]
    fn signature_lists_are_bounded() {
        let two = [sha256_list(2), sha256_list(1)].concat();
        let entries = parse_signature_lists(&two, 3).unwrap();
        assert_eq!(entries.len(), 3);
        assert!(matches!(&entries[1], Signature::Sha256 { digest, .. } if digest == &[1u8; 32]));
        assert_eq!(
            parse_signature_lists(&two, 2),
            Err(SigListError::TooManyEntries)
        );
        let mut cut = sha256_list(2);
        cut.pop();
        assert_eq!(
            parse_signature_lists(&cut, 10),
            Err(SigListError::Malformed)
        );
        let mut zero = sha256_list(1);
        zero[16..20].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            parse_signature_lists(&zero, 10),
            Err(SigListError::Malformed)
        );
    }

    #[test]
    fn guids_print_in_the_canonical_form() {
        assert_eq!(
            EFI_GLOBAL_VARIABLE.to_string(),
            "8be4df61-93ca-11d2-aa0d-00e098032b8c"
        );
    }

    #[test]
    fn device_paths_as_text_and_bounded() {
        let mut dp = vec![2, 1, 12, 0];
        dp.extend_from_slice(&0x0a03_41d0u32.to_le_bytes());
        dp.extend_from_slice(&0u32.to_le_bytes());
        dp.extend_from_slice(&[1, 1, 6, 0, 1, 2]);
        let file: Vec<u8> = "\\EFI\\a.efi\0"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        dp.extend_from_slice(&[4, 4]);
        dp.extend_from_slice(&((4 + file.len()) as u16).to_le_bytes());
        dp.extend_from_slice(&file);
        dp.extend_from_slice(&[0x7f, 0xff, 4, 0]);
        assert_eq!(
            device_path_text(&dp, 10).as_deref(),
            Some("PciRoot(0x0)/Pci(0x2,0x1)/\\EFI\\a.efi")
        );
        assert_eq!(device_path_text(&dp, 2), None);
        assert_eq!(device_path_text(&[1, 1, 2, 0], 10), None);
    }
}
