//! The endorsement key and its manufacturer certificate.
//!
//! Which EK ([`EkKind`]): `[tpm] ek` when set, else the first of RSA-2048,
//! P-256 and P-384 whose certificate NV index exists, learnt from one
//! GetCapability listing that also serves the chain indices
//! ([`super::ekchain`]).
//!
//! Regenerating an EK takes seconds on real TPMs, so bcd uses the kind's
//! persistent EK whenever it is exactly the template holding the
//! certificate's key. It checks that without reading the object's public
//! area: the expected TPMT_PUBLIC is the template with the certificate's
//! key as unique, and its name must equal the name the TPM reports for the
//! handle. Otherwise the EK is derived as tpm2_createek derives it: the
//! maker's template from NV when there is one, else the TCG default, with
//! the maker's nonce from NV as unique when there is one.

use tss_esapi::handles::{
    KeyHandle, NvIndexHandle, NvIndexTpmHandle, PersistentTpmHandle, TpmHandle,
};
use tss_esapi::interface_types::resource_handles::{Hierarchy, NvAuth};
use tss_esapi::interface_types::session_handles::AuthSession;
use tss_esapi::traits::{Marshall, UnMarshall};

use super::ek_file::{CertificateSource, OperatorCertificate};
use super::ek_kind::{EkKind, PREFERENCE};
use super::{cmd, ekchain, nvpublic, Tpm, TpmError};

pub struct Ek {
    handle: KeyHandle,
    pub kind: EkKind,
    /// Marshalled TPMT_PUBLIC.
    pub public: Vec<u8>,
    /// DER, trimmed to its own length; None when the TPM has none.
    pub certificate: Option<Vec<u8>>,
    /// Where `certificate` came from (None: there is none).
    pub certificate_source: Option<CertificateSource>,
    /// Whether the persistent EK was used (else it was derived).
    pub persistent: bool,
    /// Where a derived EK's template and unique came from.
    pub derivation: Derivation,
    /// Whether the EK is the key its certificate names (None: no
    /// certificate). The control plane refuses it `ek-mismatch` otherwise.
    pub matches_certificate: Option<bool>,
    /// The kind's persistent handle holds another key than the
    /// certificate's (bcd derived the EK instead).
    pub persistent_mismatch: bool,
    /// The TPM's NV indices from 0x01c00002 to 0x01c001ff.
    pub(super) nv_indices: Vec<u32>,
}

/// Where the template a derived EK was made from came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Derivation {
    /// The maker's template in NV (0x01c00004, 0x01c0000c).
    pub nv_template: bool,
    /// The maker's nonce in NV (0x01c00003, 0x01c0000b) as unique.
    pub nv_nonce: bool,
}

impl Ek {
    pub(super) fn handle(&self) -> KeyHandle {
        self.handle
    }
}

/// The EK and its certificate; with `operator` (`[tpm] ek_certificate`),
/// that certificate's kind of EK and that certificate, which must be the
/// TPM's EK's (an error otherwise, before anything is sent).
pub(super) fn load(
    tpm: &mut Tpm,
    forced: Option<EkKind>,
    operator: Option<&OperatorCertificate>,
) -> Result<Ek, TpmError> {
    let ek = load_with(tpm, forced, operator)?;
    let Some(op) = operator else {
        return Ok(ek);
    };
    if ek.matches_certificate == Some(true) {
        return Ok(ek);
    }
    let _ = tpm.release_ek(&ek);
    let own = super::public_spki_der(&ek.public)
        .map(|spki| hex::encode(bc_wire::sha256(&spki)))
        .unwrap_or_default();
    Err(TpmError::OperatorCertificate {
        path: op.path.clone(),
        why: format!(
            "it is not this TPM's EK certificate: its key is not the TPM's {} EK (ekSha256 {own})",
            ek.kind.as_str()
        ),
    })
}

fn load_with(
    tpm: &mut Tpm,
    forced: Option<EkKind>,
    operator: Option<&OperatorCertificate>,
) -> Result<Ek, TpmError> {
    let nv_indices = ekchain::list_indices(tpm)?;
    let certified: Vec<EkKind> = PREFERENCE
        .into_iter()
        .filter(|k| nv_indices.contains(&k.certificate_index()))
        .collect();
    let kind = match (forced, operator) {
        (Some(k), Some(op)) if k != op.kind => {
            return Err(TpmError::OperatorCertificate {
                path: op.path.clone(),
                why: format!(
                    "it certifies an {} EK, and [tpm] ek = \"{}\"",
                    op.kind.as_str(),
                    k.as_str()
                ),
            })
        }
        (_, Some(op)) => op.kind,
        (forced, None) => match forced {
            Some(k) if certified.contains(&k) => k,
            Some(k) => {
                return Err(TpmError::EkNotCertified {
                    kind: k.as_str(),
                    index: k.certificate_index(),
                    certified: certified.iter().map(|k| k.as_str()).collect(),
                })
            }
            // None certified: the RSA EK, which the control plane admits only
            // pinned (resolve add --uncertified).
            None => certified.first().copied().unwrap_or(EkKind::Rsa),
        },
    };
    let (certificate, certificate_source) = match operator {
        Some(op) => (Some(op.der.clone()), Some(CertificateSource::OperatorFile)),
        None if certified.contains(&kind) => {
            let cert = read_certificate(tpm, kind.certificate_index())?;
            let source = cert.as_ref().map(|_| CertificateSource::Nv);
            (cert, source)
        }
        None => (None, None),
    };

    let (template, derivation) = template(tpm, kind, &nv_indices)?;
    let expected = match &certificate {
        Some(cert) => kind.expected_public(&template, cert)?,
        None => None,
    };
    let mut persistent_mismatch = false;
    if let Some(expected) = &expected {
        match persistent_matching(tpm, kind.persistent_handle(), expected)? {
            Persistent::Matching(handle) => {
                return Ok(Ek {
                    handle,
                    kind,
                    public: expected.clone(),
                    certificate,
                    certificate_source,
                    persistent: true,
                    derivation: Derivation::default(),
                    matches_certificate: Some(true),
                    persistent_mismatch: false,
                    nv_indices,
                })
            }
            Persistent::Other => persistent_mismatch = true,
            Persistent::None => {}
        }
    }
    let template = tss_esapi::structures::Public::unmarshall(&template)
        .map_err(|_| TpmError::Unexpected("an EK template that does not unmarshal"))?;
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
    let matches_certificate = certificate
        .as_ref()
        .map(|_| expected.as_deref() == Some(public.as_slice()));
    Ok(Ek {
        handle: created.key_handle,
        kind,
        public,
        certificate,
        certificate_source,
        persistent: false,
        derivation,
        matches_certificate,
        persistent_mismatch,
        nv_indices,
    })
}

/// The template an EK of `kind` derives from: the maker's in NV, else the
/// TCG default; with the maker's nonce as unique when NV holds one.
fn template(
    tpm: &mut Tpm,
    kind: EkKind,
    nv_indices: &[u32],
) -> Result<(Vec<u8>, Derivation), TpmError> {
    let mut derivation = Derivation::default();
    let Some((nonce_index, template_index)) = kind.nonce_and_template_indices() else {
        return Ok((kind.default_template()?, derivation));
    };
    let mut read = |index: u32| match nv_indices.contains(&index) {
        true => read_index(tpm, index),
        false => Ok(None),
    };
    let template = match read(template_index)? {
        Some(t) => {
            derivation.nv_template = true;
            t
        }
        None => kind.default_template()?,
    };
    match read(nonce_index)? {
        Some(nonce) => {
            derivation.nv_nonce = true;
            Ok((kind.with_nonce(&template, &nonce)?, derivation))
        }
        None => Ok((template, derivation)),
    }
}

enum Persistent {
    /// The handle holds the expected EK.
    Matching(KeyHandle),
    /// The handle holds another key.
    Other,
    /// Nothing at the handle.
    None,
}

/// Whether the persistent object at `handle` has the expected public
/// area's name.
fn persistent_matching(
    tpm: &mut Tpm,
    handle: u32,
    expected: &[u8],
) -> Result<Persistent, TpmError> {
    let tpm_handle = PersistentTpmHandle::new(handle).map_err(|source| TpmError::Command {
        command: "ReadPublic",
        source,
    })?;
    // A missing handle (e.g. after TPM2_Clear) is not an error: derive instead.
    let Ok(object) = tpm
        .ctx()
        .tr_from_tpm_public(TpmHandle::Persistent(tpm_handle))
    else {
        return Ok(Persistent::None);
    };
    let name = cmd("ReadPublic", tpm.ctx().tr_get_name(object))?;
    let want = bc_wire::tpm::Public::parse(expected)
        .map_err(|_| TpmError::Unexpected("an EK template that does not parse"))?
        .name();
    if name.value() == want.as_slice() {
        Ok(Persistent::Matching(object.into()))
    } else {
        let mut object = object;
        let _ = tpm.ctx().tr_close(&mut object);
        Ok(Persistent::Other)
    }
}

/// Reads the EK certificate from NV ([`read_index`]), without the TCG
/// header or padding some makers put around the DER. None when the index
/// does not exist.
fn read_certificate(tpm: &mut Tpm, index: u32) -> Result<Option<Vec<u8>>, TpmError> {
    match read_index(tpm, index)? {
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
