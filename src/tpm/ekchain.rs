//! The TCG EK certificate chain NV indices (0x01c00100–0x01c001ff): the
//! intermediates a maker stored in the TPM, one DER certificate or a
//! concatenation of them per index. They are untrusted: the control plane
//! builds a path through them to a root its operator configured.

use tss_esapi::constants::CapabilityType;
use tss_esapi::structures::CapabilityData;

use super::{cmd, ek, Tpm, TpmError};

const FIRST: u32 = 0x01C0_0100;
const LAST: u32 = 0x01C0_01FF;
/// Most certificates taken from NV (what the control plane accepts).
pub const MAX_CERTIFICATES: usize = bc_wire::ekcert::MAX_AGENT_INTERMEDIATES;

/// Most NV indices one listing returns.
const MAX_LISTED: u32 = 64;

/// The certificates in the chain indices, in index order; one
/// GetCapability when there are none.
pub(super) fn read(tpm: &mut Tpm) -> Result<Vec<Vec<u8>>, TpmError> {
    let indices = nv_indices(tpm, FIRST..=LAST)?;
    let mut out = Vec::new();
    for index in indices {
        if out.len() >= MAX_CERTIFICATES {
            break;
        }
        let Some(raw) = ek::read_index(tpm, index)? else {
            continue;
        };
        split(&raw, &mut out);
    }
    out.truncate(MAX_CERTIFICATES);
    Ok(out)
}

/// The NV indices defined in `range` (at most 64, in order), in one
/// GetCapability: what to read without an NV_ReadPublic failing on each
/// index that does not exist.
pub(super) fn nv_indices(
    tpm: &mut Tpm,
    range: std::ops::RangeInclusive<u32>,
) -> Result<Vec<u32>, TpmError> {
    let (data, _) = cmd(
        "GetCapability",
        tpm.ctx()
            .get_capability(CapabilityType::Handles, *range.start(), MAX_LISTED),
    )?;
    let CapabilityData::Handles(handles) = data else {
        return Err(TpmError::Unexpected("a capability of another kind"));
    };
    Ok(handles
        .into_inner()
        .into_iter()
        .map(u32::from)
        .filter(|h| range.contains(h))
        .collect())
}

/// Appends the DER certificates concatenated in `raw` (each possibly after
/// a TCG header), up to padding or anything that is not one.
fn split(mut raw: &[u8], out: &mut Vec<Vec<u8>>) {
    while let Ok(der) = ek::trim_der(raw) {
        let header = if raw.starts_with(&[0x10, 0x01, 0x00]) {
            5
        } else {
            0
        };
        let taken = header + der.len();
        out.push(der.to_vec());
        raw = &raw[taken..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concatenated_padded_and_with_headers() {
        let a = [0x30, 0x03, 1, 2, 3];
        let b = [0x30, 0x02, 4, 5];
        let mut raw = a.to_vec();
        raw.extend_from_slice(&[0x10, 0x01, 0x00, 0x00, 0x04]);
        raw.extend_from_slice(&b);
        raw.extend_from_slice(&[0xff; 7]);
        let mut out = Vec::new();
        split(&raw, &mut out);
        assert_eq!(out, vec![a.to_vec(), b.to_vec()]);
        assert_eq!(
            ek::trim_der(&[0x10, 0x01, 0x00, 0x00, 0x05, 0x30, 0x03, 1, 2, 3]).unwrap(),
            &a
        );
        assert!(ek::trim_der(&[0x10, 0x01, 0x00, 0x00, 0x09, 0x30]).is_err());
    }
}
