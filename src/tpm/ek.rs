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

use tss_esapi::handles::{KeyHandle, PersistentTpmHandle, TpmHandle};
use tss_esapi::interface_types::resource_handles::Hierarchy;
use tss_esapi::interface_types::session_handles::AuthSession;
use tss_esapi::traits::{Marshall, UnMarshall};

use super::ek_file::{CertificateSource, OperatorCertificate};
use super::ek_kind::{EkKind, PREFERENCE};
use super::nv::{read_index, trim_der};
use super::{cmd, ekchain, Tpm, TpmError};

pub struct Ek {
    handle: KeyHandle,
    pub kind: EkKind,
    /// Marshalled TPMT_PUBLIC.
    pub public: Vec<u8>,
    /// DER, trimmed to its own length; None when the TPM has none.
    pub certificate: Option<Vec<u8>>,
    /// Where `certificate` came from (None: there is none).
    pub(crate) certificate_source: Option<CertificateSource>,
    /// Whether the persistent EK was used (else it was derived).
    pub persistent: bool,
    /// Where a derived EK's template and unique came from.
    pub(crate) derivation: Derivation,
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
pub(crate) struct Derivation {
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
    // The wire's encoder, as ek_spki's: that module builds on this one.
    let own = bc_wire::ekcert::spki::public_spki_der(&ek.public)
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

/// Reads the EK certificate from NV ([`super::nv::read_index`]), without the TCG
/// header or padding some makers put around the DER. None when the index
/// does not exist.
fn read_certificate(tpm: &mut Tpm, index: u32) -> Result<Option<Vec<u8>>, TpmError> {
    match read_index(tpm, index)? {
        Some(raw) => trim_der(&raw).map(|der| Some(der.to_vec())),
        None => Ok(None),
    }
}
