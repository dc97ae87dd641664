//! Reading an NV index whole: the EK certificate ([`super::ek`]) and the
//! chain indices ([`super::ekchain`]) are read the same way.

use tss_esapi::handles::{NvIndexHandle, NvIndexTpmHandle, TpmHandle};
use tss_esapi::interface_types::resource_handles::NvAuth;
use tss_esapi::interface_types::session_handles::AuthSession;

use super::{cmd, nvpublic, Tpm, TpmError};

/// The whole data of NV index `handle` (None when it does not exist): its
/// size from the index's public area (one NV_ReadPublic), then the data,
/// authorized by the index itself when it allows that (TPMA_NV_AUTHREAD,
/// empty auth: every EK certificate and chain index the TCG profile defines
/// does), so an owner authorization a previous OS set does not stop the
/// read; by the owner otherwise.
///
/// One NV_Read of the whole index first (up to 1 KiB, what most TPMs take);
/// a TPM that refuses it is asked its TPM_PT_NV_BUFFER_MAX and read in
/// chunks of that (512 when it reports none).
pub(super) fn read_index(tpm: &mut Tpm, handle: u32) -> Result<Option<Vec<u8>>, TpmError> {
    let index = NvIndexTpmHandle::new(handle).map_err(|source| TpmError::Command {
        command: "NV_ReadPublic",
        source,
    })?;
    let Ok(object) = tpm.ctx().tr_from_tpm_public(TpmHandle::NvIndex(index)) else {
        return Ok(None);
    };
    let nv = NvIndexHandle::from(object);
    let result = (|| {
        let (size, auth_read) = nvpublic::read(tpm, handle, nv)?;
        let auth = if auth_read {
            NvAuth::NvIndex(nv)
        } else {
            NvAuth::Owner
        };
        if size <= OPTIMISTIC_NV_READ {
            if let Ok(out) = read_nv(tpm, auth, nv, size, size) {
                return Ok(out);
            }
        }
        let max = nv_buffer_max(tpm)?;
        read_nv(tpm, auth, nv, size, max)
    })();
    let mut object = object;
    let _ = tpm.ctx().tr_close(&mut object);
    result.map(Some)
}

/// The size bcd reads in one NV_Read before asking the TPM its limit.
const OPTIMISTIC_NV_READ: usize = 1024;
/// NV_BUFFER_MAX when the TPM does not report one (the TCG PC Client floor).
const NV_BUFFER_FLOOR: usize = 512;

/// `size` bytes of `nv` from offset 0, `max` at a time.
fn read_nv(
    tpm: &mut Tpm,
    auth: NvAuth,
    nv: NvIndexHandle,
    size: usize,
    max: usize,
) -> Result<Vec<u8>, TpmError> {
    let mut out = Vec::with_capacity(size);
    for (offset, len) in nv_chunks(size, max)? {
        let chunk = cmd(
            "NV_Read",
            tpm.ctx()
                .execute_with_session(Some(AuthSession::Password), |c| {
                    c.nv_read(auth, nv, len, offset)
                }),
        )?;
        if chunk.value().len() != usize::from(len) {
            return Err(TpmError::Unexpected("an NV_Read answer of another size"));
        }
        out.extend_from_slice(chunk.value());
    }
    Ok(out)
}

/// (offset, length) of each NV_Read for `size` bytes, `max` at a time.
fn nv_chunks(size: usize, max: usize) -> Result<Vec<(u16, u16)>, TpmError> {
    let too_big = || TpmError::Unexpected("an NV index larger than 64 KiB");
    let max = max.clamp(1, usize::from(u16::MAX));
    let mut chunks = Vec::new();
    let mut offset = 0;
    while offset < size {
        let len = (size - offset).min(max);
        chunks.push((
            u16::try_from(offset).map_err(|_| too_big())?,
            u16::try_from(len).map_err(|_| too_big())?,
        ));
        offset += len;
    }
    Ok(chunks)
}

/// TPM_PT_NV_BUFFER_MAX, or [`NV_BUFFER_FLOOR`] when the TPM reports 0.
fn nv_buffer_max(tpm: &mut Tpm) -> Result<usize, TpmError> {
    use tss_esapi::constants::{CapabilityType, PropertyTag};
    use tss_esapi::structures::CapabilityData;
    let (data, _) = cmd(
        "GetCapability",
        tpm.ctx().get_capability(
            CapabilityType::TpmProperties,
            PropertyTag::NvBufferMax.into(),
            1,
        ),
    )?;
    let reported = match data {
        CapabilityData::TpmProperties(props) => props
            .find(PropertyTag::NvBufferMax)
            .map(|p| p.value() as usize)
            .unwrap_or(0),
        _ => 0,
    };
    Ok(if reported == 0 {
        NV_BUFFER_FLOOR
    } else {
        reported
    })
}

/// Some TPMs store the certificate in a larger index with padding: keep
/// exactly the DER SEQUENCE. Some put the TCG PC Client header before it
/// (`10 01 00` and a 2-byte length): it is stripped
/// ([`bc_wire::ekcert::nv::der_prefix`]).
pub(super) fn trim_der(raw: &[u8]) -> Result<&[u8], TpmError> {
    bc_wire::ekcert::nv::der_prefix(raw)
        .ok_or_else(|| TpmError::EkCertificate("not a DER certificate".into()))
}

#[cfg(test)]
mod nv_tests {
    use super::*;

    /// STMicro's ST33 holds its RSA EK certificate in a 1,600-byte index,
    /// the rest 0xFF (the real NV content, wire/src/ekcert/testdata/real).
    #[test]
    fn the_certificate_is_cut_out_of_real_padded_nv() {
        let nv = include_bytes!(
            "../../wire/src/ekcert/testdata/real/stm-st33htph-rsa-ek-intca05-nvpadded.der"
        );
        let der = trim_der(nv).unwrap();
        assert_eq!(der.len(), 1169);
        use x509_parser::prelude::FromDer;
        let (rest, cert) = x509_parser::certificate::X509Certificate::from_der(der).unwrap();
        assert!(rest.is_empty());
        assert!(cert
            .issuer()
            .to_string()
            .contains("STM TPM EK Intermediate CA 05"));
    }

    #[test]
    fn nv_is_read_in_chunks_of_the_buffer_max() {
        assert_eq!(nv_chunks(756, 1024).unwrap(), vec![(0, 756)]);
        assert_eq!(
            nv_chunks(1300, 512).unwrap(),
            vec![(0, 512), (512, 512), (1024, 276)]
        );
        assert_eq!(nv_chunks(1024, 512).unwrap(), vec![(0, 512), (512, 512)]);
        assert!(nv_chunks(0, 512).unwrap().is_empty());
        assert!(nv_chunks(70_000, 1024).is_err());
    }
}
