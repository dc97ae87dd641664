//! The TCG EK certificate chain NV indices (0x01c00100–0x01c001ff): the
//! intermediates a maker stored in the TPM, one DER certificate or a
//! concatenation of them per index. They are untrusted: the control plane
//! builds a path through them to a root its operator configured.
//!
//! One GetCapability lists the NV indices from the RSA EK certificate's
//! (0x01c00002) to the chain's last: the EK's certificate, nonce and
//! template indices and the chain indices in one command.

use tss_esapi::constants::CapabilityType;
use tss_esapi::structures::CapabilityData;

use super::{cmd, nv, Tpm, TpmError};

const FIRST: u32 = 0x01C0_0100;
const LAST: u32 = 0x01C0_01FF;
/// The first EK index the TCG EK Credential Profile defines.
const FIRST_EK: u32 = 0x01C0_0002;
/// Most handles asked for: the EK range holds a dozen, the chain a few.
const LISTED: u32 = 128;
/// Most certificates taken from NV (what the control plane accepts).
pub(super) const MAX_CERTIFICATES: usize = bc_wire::ekcert::MAX_AGENT_INTERMEDIATES;

/// The TPM's NV indices from 0x01c00002 to 0x01c001ff, in order.
pub(super) fn list_indices(tpm: &mut Tpm) -> Result<Vec<u32>, TpmError> {
    let (data, _) = cmd(
        "GetCapability",
        tpm.ctx()
            .get_capability(CapabilityType::Handles, FIRST_EK, LISTED),
    )?;
    let CapabilityData::Handles(handles) = data else {
        return Err(TpmError::Unexpected("a capability of another kind"));
    };
    Ok(handles
        .into_inner()
        .into_iter()
        .map(u32::from)
        .filter(|h| (FIRST_EK..=LAST).contains(h))
        .collect())
}

/// The certificates in the chain indices of `listed` ([`list_indices`]),
/// in index order.
pub(super) fn read(tpm: &mut Tpm, listed: &[u32]) -> Result<Vec<Vec<u8>>, TpmError> {
    let indices = listed
        .iter()
        .copied()
        .filter(|h| (FIRST..=LAST).contains(h));
    let mut out = Vec::new();
    for index in indices {
        if out.len() >= MAX_CERTIFICATES {
            break;
        }
        let Some(raw) = nv::read_index(tpm, index)? else {
            continue;
        };
        split(&raw, &mut out);
    }
    out.truncate(MAX_CERTIFICATES);
    Ok(out)
}

/// Appends the DER certificates concatenated in `raw` (each possibly after
/// a TCG header), up to padding or anything that is not one.
fn split(mut raw: &[u8], out: &mut Vec<Vec<u8>>) {
    while let Ok(der) = nv::trim_der(raw) {
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
            nv::trim_der(&[0x10, 0x01, 0x00, 0x00, 0x05, 0x30, 0x03, 1, 2, 3]).unwrap(),
            &a
        );
        assert!(nv::trim_der(&[0x10, 0x01, 0x00, 0x00, 0x09, 0x30]).is_err());
    }
}
