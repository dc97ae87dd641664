//! The endorsement key and its manufacturer certificate.
//!
//! Regenerating an RSA EK takes seconds on real TPMs, so bcd uses the
//! persistent EK at 0x81010001 whenever it is exactly the default (L-1)
//! template holding the certificate's key. It checks that without reading
//! the object's public area: the expected TPMT_PUBLIC is the template with
//! the certificate's modulus, and its name must equal the name the TPM
//! reports for the handle.

use tss_esapi::abstraction::ek::create_ek_public_from_default_template_2;
use tss_esapi::abstraction::{AsymmetricAlgorithmSelection, DefaultKey};
use tss_esapi::handles::{
    KeyHandle, NvIndexHandle, NvIndexTpmHandle, PersistentTpmHandle, TpmHandle,
};
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::interface_types::resource_handles::{Hierarchy, NvAuth};
use tss_esapi::interface_types::session_handles::AuthSession;
use tss_esapi::traits::Marshall;

use super::{cmd, nvpublic, Tpm, TpmError};

/// NV index of the RSA-2048 EK certificate (TCG EK Credential Profile).
const EK_CERT_NV_INDEX: u32 = 0x01C0_0002;
/// The conventional persistent handle of the RSA EK.
const EK_PERSISTENT_HANDLE: u32 = 0x8101_0001;

pub struct Ek {
    handle: KeyHandle,
    /// Marshalled TPMT_PUBLIC.
    pub public: Vec<u8>,
    /// DER, trimmed to its own length; None when the TPM has none.
    pub certificate: Option<Vec<u8>>,
    /// Whether the persistent EK was used (else it was derived).
    pub persistent: bool,
}

impl Ek {
    pub(super) fn handle(&self) -> KeyHandle {
        self.handle
    }
}

pub(super) fn load(tpm: &mut Tpm) -> Result<Ek, TpmError> {
    let template = create_ek_public_from_default_template_2(
        AsymmetricAlgorithmSelection::Rsa(RsaKeyBits::Rsa2048),
        None::<DefaultKey>,
    )
    .map_err(|source| TpmError::Command {
        command: "CreatePrimary",
        source,
    })?;
    let certificate = read_certificate(tpm)?;

    if let Some(cert) = &certificate {
        if let Some(expected) = expected_public(&template, cert)? {
            if let Some(handle) = persistent_matching(tpm, &expected)? {
                return Ok(Ek {
                    handle,
                    public: expected,
                    certificate,
                    persistent: true,
                });
            }
        }
    }
    let created = cmd(
        "CreatePrimary",
        tpm.ctx()
            .execute_with_session(Some(AuthSession::Password), |c| {
                c.create_primary(Hierarchy::Endorsement, template, None, None, None, None)
            }),
    )?;
    tpm.track(created.key_handle);
    let Ok(public) = created.out_public.marshall() else {
        let _ = tpm.release_handle(created.key_handle);
        return Err(TpmError::Unexpected(
            "an EK public area that does not marshal",
        ));
    };
    Ok(Ek {
        handle: created.key_handle,
        public,
        certificate,
        persistent: false,
    })
}

/// The persistent EK's handle if its name is the expected public area's.
fn persistent_matching(tpm: &mut Tpm, expected: &[u8]) -> Result<Option<KeyHandle>, TpmError> {
    let tpm_handle =
        PersistentTpmHandle::new(EK_PERSISTENT_HANDLE).map_err(|source| TpmError::Command {
            command: "ReadPublic",
            source,
        })?;
    // A missing handle (e.g. after TPM2_Clear) is not an error: derive instead.
    let Ok(object) = tpm
        .ctx()
        .tr_from_tpm_public(TpmHandle::Persistent(tpm_handle))
    else {
        return Ok(None);
    };
    let name = cmd("ReadPublic", tpm.ctx().tr_get_name(object))?;
    let mut want = vec![0x00, 0x0B];
    want.extend_from_slice(&bc_wire::sha256(expected));
    if name.value() == want.as_slice() {
        Ok(Some(object.into()))
    } else {
        let mut object = object;
        let _ = tpm.ctx().tr_close(&mut object);
        Ok(None)
    }
}

/// The default template with the certificate's RSA modulus as its unique.
/// None when the certificate holds another kind of key.
fn expected_public(
    template: &tss_esapi::structures::Public,
    cert: &[u8],
) -> Result<Option<Vec<u8>>, TpmError> {
    use x509_parser::prelude::*;
    use x509_parser::public_key::PublicKey;
    let (_, parsed) =
        X509Certificate::from_der(cert).map_err(|e| TpmError::EkCertificate(e.to_string()))?;
    let Ok(PublicKey::RSA(rsa)) = parsed.public_key().parsed() else {
        return Ok(None);
    };
    let modulus: &[u8] = {
        let m = rsa.modulus;
        let first = m.iter().position(|&b| b != 0).unwrap_or(m.len());
        &m[first..]
    };
    if modulus.len() != 256 || rsa.try_exponent().ok() != Some(65537) {
        return Ok(None);
    }
    let mut bytes = template
        .marshall()
        .map_err(|_| TpmError::Unexpected("an EK template that does not marshal"))?;
    // The template ends with its unique: TPM2B of 256 zero bytes.
    let at = bytes
        .len()
        .checked_sub(258)
        .ok_or(TpmError::Unexpected("a short EK template"))?;
    if bytes[at..at + 2] != [0x01, 0x00] || bytes[at + 2..].iter().any(|&b| b != 0) {
        return Err(TpmError::Unexpected("an EK template with another unique"));
    }
    bytes[at + 2..].copy_from_slice(modulus);
    Ok(Some(bytes))
}

/// Reads the EK certificate from NV ([`read_index`]), without the TCG
/// header or padding some makers put around the DER. None when the index
/// does not exist.
fn read_certificate(tpm: &mut Tpm) -> Result<Option<Vec<u8>>, TpmError> {
    match read_index(tpm, EK_CERT_NV_INDEX)? {
        Some(raw) => trim_der(&raw).map(|der| Some(der.to_vec())),
        None => Ok(None),
    }
}

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
/// (`10 01 00` and a 2-byte length): it is stripped.
pub(super) fn trim_der(raw: &[u8]) -> Result<&[u8], TpmError> {
    let bad = || TpmError::EkCertificate("not a DER certificate".into());
    let raw = match raw {
        [0x10, 0x01, 0x00, hi, lo, rest @ ..] => rest
            .get(..usize::from(*hi) << 8 | usize::from(*lo))
            .ok_or_else(bad)?,
        _ => raw,
    };
    if raw.len() < 2 || raw[0] != 0x30 {
        return Err(bad());
    }
    let (len, header) = match raw[1] {
        n if n < 0x80 => (usize::from(n), 2),
        0x81 => (usize::from(*raw.get(2).ok_or_else(bad)?), 3),
        0x82 => (
            usize::from(*raw.get(2).ok_or_else(bad)?) << 8
                | usize::from(*raw.get(3).ok_or_else(bad)?),
            4,
        ),
        _ => return Err(bad()),
    };
    raw.get(..header + len).ok_or_else(bad)
}

/// The EK's SubjectPublicKeyInfo (DER), the key the control plane knows the
/// machine by: the certificate's when there is one (the control plane reads
/// it from there), else encoded from the public area.
pub fn ek_spki_der(ek: &Ek) -> Result<Vec<u8>, TpmError> {
    use x509_parser::prelude::*;
    if let Some(cert) = &ek.certificate {
        let (_, parsed) =
            X509Certificate::from_der(cert).map_err(|e| TpmError::EkCertificate(e.to_string()))?;
        return Ok(parsed.public_key().raw.to_vec());
    }
    let public = bc_wire::tpm::Public::parse(&ek.public)
        .map_err(|_| TpmError::Unexpected("an EK public area"))?;
    let bc_wire::tpm::KeyParams::Rsa {
        modulus, exponent, ..
    } = &public.params
    else {
        return Err(TpmError::Unexpected("an EK that is not RSA"));
    };
    let e = if *exponent == 0 { 65537 } else { *exponent };
    Ok(rsa_spki_der(modulus, e))
}

/// SEQUENCE { SEQUENCE { rsaEncryption, NULL }, BIT STRING { SEQUENCE { n, e } } }.
fn rsa_spki_der(modulus: &[u8], exponent: u32) -> Vec<u8> {
    fn tlv(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match body.len() {
            n if n < 0x80 => out.push(n as u8),
            n if n < 0x100 => out.extend_from_slice(&[0x81, n as u8]),
            n => out.extend_from_slice(&[0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(body);
        out
    }
    fn integer(bytes: &[u8]) -> Vec<u8> {
        let first = bytes
            .iter()
            .position(|&b| b != 0)
            .unwrap_or(bytes.len().saturating_sub(1));
        let mut body = Vec::new();
        if bytes.get(first).is_some_and(|b| b & 0x80 != 0) {
            body.push(0);
        }
        body.extend_from_slice(&bytes[first..]);
        tlv(0x02, &body)
    }
    const RSA_ALGORITHM: &[u8] = &[
        0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
    ];
    let key = tlv(
        0x30,
        &[integer(modulus), integer(&exponent.to_be_bytes())].concat(),
    );
    let mut bits = vec![0u8];
    bits.extend_from_slice(&key);
    tlv(0x30, &[RSA_ALGORITHM, &tlv(0x03, &bits)].concat())
}

#[cfg(test)]
mod nv_tests {
    use super::*;

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
