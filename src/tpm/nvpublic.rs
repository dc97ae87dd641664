//! An NV index's attributes and size recovered from its name, with no TPM
//! command.
//!
//! ESYS reads an index's public area (NV_ReadPublic) to make its handle, but
//! tss-esapi 7.7 hands back only the name computed from it, not the area:
//! asking for the size again would cost a second NV_ReadPublic. The name is
//! `nameAlg ‖ H(TPMS_NV_PUBLIC)`, and the EK certificate and chain indices
//! the TCG EK Credential Profile defines have an empty authPolicy and one of
//! a few attribute sets, so the area is found by hashing each candidate
//! (attribute set × size). A match is the TPM's own area (SHA-256 collision
//! resistance); anything else is asked of the TPM.

use tss_esapi::handles::NvIndexHandle;

use super::{cmd, Tpm, TpmError};

/// TPMA_NV_AUTHREAD: the index's own (empty) authorization reads it.
const AUTHREAD: u32 = 0x0004_0000;
const WRITEDEFINE: u32 = 0x0000_2000;
const WRITELOCKED: u32 = 0x0000_0800;
/// PPWRITE | PPREAD | OWNERREAD | AUTHREAD | NO_DA | WRITTEN | PLATFORMCREATE:
/// what the profile requires of an EK certificate or chain index.
const PROFILE: u32 = 0x6207_0001;
/// The profile's sets, with the optional write-once lock (swtpm sets
/// WRITEDEFINE on its EK certificate index).
const CANDIDATES: [u32; 3] = [
    PROFILE,
    PROFILE | WRITEDEFINE,
    PROFILE | WRITEDEFINE | WRITELOCKED,
];
/// Largest size tried: the biggest NV index makers allocate for a
/// certificate or a chain is 2 KiB to 4 KiB.
const MAX_SIZE: u16 = 4096;
const TPM_ALG_SHA256: [u8; 2] = [0x00, 0x0B];

/// The data size of NV index `handle` (opened as `nv`) and whether it reads
/// with its own authorization: from the name ESYS computed when it made the
/// handle (no TPM command), else from a second NV_ReadPublic.
pub(super) fn read(
    tpm: &mut Tpm,
    handle: u32,
    nv: NvIndexHandle,
) -> Result<(usize, bool), TpmError> {
    let name = cmd("NV_ReadPublic", tpm.ctx().tr_get_name(nv.into()))?;
    if let Some(public) = from_name(handle, name.value()) {
        return Ok((usize::from(public.size), public.auth_read()));
    }
    let (public, _) = cmd("NV_ReadPublic", tpm.ctx().nv_read_public(nv))?;
    Ok((public.data_size(), public.attributes().auth_read()))
}

/// What bcd needs of an NV index's public area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NvPublic {
    attributes: u32,
    size: u16,
}

impl NvPublic {
    fn auth_read(&self) -> bool {
        self.attributes & AUTHREAD != 0
    }
}

/// The public area of NV index `index` whose name is `name`, when it is a
/// SHA-256 profile index of at most [`MAX_SIZE`] bytes; None otherwise.
/// At most 3 × 4096 SHA-256 of 14 bytes.
fn from_name(index: u32, name: &[u8]) -> Option<NvPublic> {
    let digest = name.strip_prefix(&TPM_ALG_SHA256)?;
    if digest.len() != 32 {
        return None;
    }
    // TPMS_NV_PUBLIC: nvIndex, nameAlg, attributes, authPolicy (empty), dataSize.
    let mut area = [0u8; 14];
    area[..4].copy_from_slice(&index.to_be_bytes());
    area[4..6].copy_from_slice(&TPM_ALG_SHA256);
    for size in 1..=MAX_SIZE {
        area[12..].copy_from_slice(&size.to_be_bytes());
        for attributes in CANDIDATES {
            area[6..10].copy_from_slice(&attributes.to_be_bytes());
            if bc_wire::sha256(&area) == digest {
                return Some(NvPublic { attributes, size });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(hex_digest: &str) -> Vec<u8> {
        let mut n = TPM_ALG_SHA256.to_vec();
        n.extend(hex::decode(hex_digest).unwrap());
        n
    }

    /// Names as swtpm reported them (`tpm2_nvreadpublic`).
    #[test]
    fn the_area_is_recovered_from_the_name() {
        // swtpm_setup's RSA EK certificate index.
        let ek_cert = name("b9cc704f3b456a5171834125c237cce1ce03c92e645a690daa947224f77f3a2d");
        let got = from_name(0x01C0_0002, &ek_cert).unwrap();
        assert_eq!(
            got,
            NvPublic {
                attributes: 0x6207_2001,
                size: 757
            }
        );
        assert!(got.auth_read());
        // A chain index made with tpm2_nvdefine -C p, written.
        let chain = name("a434a77d45e1afd7c19bce0d94623b8e074fd7c1043d1bf1c4ad783006d17f87");
        assert_eq!(
            from_name(0x01C0_0100, &chain),
            Some(NvPublic {
                attributes: 0x6207_0001,
                size: 1234
            })
        );
    }

    #[test]
    fn anything_else_is_left_to_the_tpm() {
        // The same index, never written (no TPMA_NV_WRITTEN).
        let unwritten = name("795efb72157141a712512416433bfe0069b0456bad430b39d743e2a71a6c3b7e");
        assert_eq!(from_name(0x01C0_0101, &unwritten), None);
        // Another index's name, another hash, a short name.
        let ek_cert = name("b9cc704f3b456a5171834125c237cce1ce03c92e645a690daa947224f77f3a2d");
        assert_eq!(from_name(0x01C0_0003, &ek_cert), None);
        let mut sha1 = ek_cert.clone();
        sha1[1] = 0x04;
        assert_eq!(from_name(0x01C0_0002, &sha1), None);
        assert_eq!(from_name(0x01C0_0002, &ek_cert[..20]), None);
        assert_eq!(from_name(0x01C0_0002, &[]), None);
    }
}
