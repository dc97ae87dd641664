//! The TPM, through tss-esapi: the only module that touches it.
//!
//! [`Tpm`] is one open TPM connection exposing the plain operations bcd
//! needs: the EK and its certificate, the AK, node keys derived from a stored
//! unique, signing, certification, credential activation and quotes. It
//! flushes every transient object it loads (swtpm and the kernel's resource
//! manager allow three), and every error names the TPM command and the
//! response code's meaning.

mod banks;
mod ek;
mod ek_file;
mod ek_kind;
mod ek_service;
mod ek_spki;
mod ekchain;
mod nv;
mod nvpublic;
mod quote;
mod templates;
mod transient;

use std::path::Path;
use std::str::FromStr;

use tss_esapi::attributes::SessionAttributesBuilder;
use tss_esapi::constants::tss::{TPM2_RH_NULL, TPM2_ST_HASHCHECK};
use tss_esapi::constants::{CapabilityType, PropertyTag, SessionType};
use tss_esapi::handles::{AuthHandle, KeyHandle, ObjectHandle, SessionHandle};
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::interface_types::resource_handles::Hierarchy;
use tss_esapi::interface_types::session_handles::{AuthSession, PolicySession};
use tss_esapi::structures::CapabilityData;
use tss_esapi::structures::{
    Data, Digest, EncryptedSecret, HashScheme, HashcheckTicket, IdObject, Nonce, Signature,
    SignatureScheme, SymmetricDefinition,
};
use tss_esapi::traits::Marshall;
use tss_esapi::{Context, TctiNameConf};

pub use banks::BankError;
pub use ek::Ek;
pub(crate) use ek_file::{CertificateSource, OperatorCertificate};
pub use ek_kind::EkKind;
pub(crate) use ek_spki::{ek_spki_der, public_spki_der};
pub use quote::Quote;

/// Where bcd finds its TPM, in order: the config's `[tpm] tcti`, then
/// `TPM2TOOLS_TCTI`, then `TCTI`, then `/dev/tpmrm0` when it exists. Never
/// `/dev/tpm0` implicitly: without the kernel's resource manager, bcd and any
/// other TPM user would trample each other's objects.
///
/// `none` in the config means no TPM at all, whatever the machine has: node
/// keys are file keys and `--attestor tpm` is refused.
pub(crate) fn resolve_tcti(configured: Option<&str>) -> Option<String> {
    match configured {
        Some(NO_TPM) => return None,
        Some(t) => return Some(t.to_owned()),
        None => {}
    }
    for var in ["TPM2TOOLS_TCTI", "TCTI"] {
        if let Ok(v) = std::env::var(var) {
            if !v.is_empty() {
                return Some(v);
            }
        }
    }
    Path::new("/dev/tpmrm0")
        .exists()
        .then(|| "device:/dev/tpmrm0".to_owned())
}

/// The `[tpm] tcti` value that turns the TPM off.
pub(crate) const NO_TPM: &str = "none";

#[derive(Debug, thiserror::Error)]
pub enum TpmError {
    #[error("invalid TCTI {tcti:?}: {source}")]
    Tcti {
        tcti: String,
        source: tss_esapi::Error,
    },
    #[error("cannot open the TPM at {tcti}: {source}")]
    Open {
        tcti: String,
        source: tss_esapi::Error,
    },
    #[error("TPM2_{command} failed: {}", describe_rc(source))]
    Command {
        command: &'static str,
        source: tss_esapi::Error,
    },
    #[error("the TPM returned {0} that bcd cannot use")]
    Unexpected(&'static str),
    #[error("the TPM's owner hierarchy has an authorization (set by a previous OS or tpm2_changeauth), so bcd cannot derive its node key there: put it in a 0600 file named by [tpm] owner_auth_file, or clear it (tpm2_changeauth -c owner -p <current>), or clear the TPM in the firmware")]
    OwnerAuth,
    #[error("the quoted PCRs were extended between PCR_Read and Quote in each of {0} quotes")]
    PcrsMoving(usize),
    #[error("the TPM's EK certificate is malformed: {0}")]
    EkCertificate(String),
    #[error(transparent)]
    PcrBank(#[from] BankError),
    #[error("[tpm] ek = \"{kind}\": the TPM has no EK certificate at NV {index:#010x} (it has {}); name one it has, or remove the setting to let bcd choose", if certified.is_empty() { "none".to_owned() } else { certified.join(", ") })]
    EkNotCertified {
        kind: &'static str,
        index: u32,
        certified: Vec<&'static str>,
    },
    #[error("[tpm] ek_certificate {}: {why}", path.display())]
    OperatorCertificate {
        path: std::path::PathBuf,
        why: String,
    },
}

impl TpmError {
    /// Whether the connection to the TPM failed rather than the TPM: a code
    /// from a layer of the TSS (ESYS, SYS, TCTI, a resource manager). Such a
    /// context does not recover (ESYS keeps waiting for the response it
    /// lost), so its owner opens a new one.
    pub(crate) fn is_connection(&self) -> bool {
        match self {
            TpmError::Command { source, .. } => {
                raw_rc(source).is_some_and(|rc| !matches!(rc_layer(rc), 0 | TPM_VIA_RESMGR))
            }
            _ => false,
        }
    }
}

/// TSS2_RC's layer (bits 16-23) of a TPM error a resource manager passes on.
const TPM_VIA_RESMGR: u32 = 12;

fn rc_layer(rc: u32) -> u32 {
    (rc >> 16) & 0xff
}

/// The TSS2_RC of a TSS error. tss-esapi names the TPM's own codes only (a
/// TCTI's reads "response code not recognized") and shows the raw value
/// only in its inner code's Display ("Response code value: 0x...").
fn raw_rc(e: &tss_esapi::Error) -> Option<u32> {
    use tss_esapi::constants::response_code::Tss2ResponseCode;
    let text = match e {
        tss_esapi::Error::Tss2Error(Tss2ResponseCode::FormatZero(rc)) => rc.to_string(),
        tss_esapi::Error::Tss2Error(Tss2ResponseCode::FormatOne(rc)) => rc.to_string(),
        _ => return None,
    };
    u32::from_str_radix(text.rsplit("0x").next()?, 16).ok()
}

/// tss-esapi's words for the code, then the code and the layer it came
/// from: what an operator searches for, and what tells a TPM's refusal
/// from a broken connection.
fn describe_rc(e: &tss_esapi::Error) -> String {
    let Some(rc) = raw_rc(e) else {
        return e.to_string();
    };
    let layer = match rc_layer(rc) {
        0 => "the TPM",
        6 => "the TSS's feature API",
        7 => "ESYS",
        8 => "SYS",
        9 => "the TSS's marshalling",
        10 => "the TCTI",
        11 => "the resource manager",
        TPM_VIA_RESMGR => "the TPM, through the resource manager",
        _ => "an unknown TSS layer",
    };
    format!("{e} (TSS2_RC {rc:#010x}, from {layer})")
}

/// Wraps a tss-esapi error with the TPM command that failed.
pub(crate) fn cmd<T>(command: &'static str, r: tss_esapi::Result<T>) -> Result<T, TpmError> {
    r.map_err(|source| TpmError::Command { command, source })
}

/// A key the TPM holds for this connection: its handle and its marshalled
/// TPMT_PUBLIC (what the wire carries and the verifier parses).
pub struct LoadedKey {
    handle: KeyHandle,
    pub public: Vec<u8>,
}

/// The TPM's identity, for `bcd tpm identify` and `bcd doctor`.
#[derive(Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TpmInfo {
    /// TPM_PT_MANUFACTURER as its four ASCII characters (e.g. "IBM ").
    pub manufacturer: String,
    pub vendor: String,
    pub firmware: String,
    /// "2.0" for a TPM 2.0 (TPM_PT_FAMILY_INDICATOR).
    pub family: String,
    /// TPM_PT_MANUFACTURER as the TPM reports it (round 1 sends it).
    #[serde(skip)]
    pub manufacturer_id: u32,
    /// TPM_PT_FIRMWARE_VERSION_1 << 32 | TPM_PT_FIRMWARE_VERSION_2.
    #[serde(skip)]
    pub firmware_id: u64,
}

impl TpmInfo {
    /// swtpm and other software TPMs, by their manufacturer id.
    pub(crate) fn is_software(&self) -> bool {
        matches!(self.manufacturer.trim(), "IBM" | "SW" | "MSFT") && self.vendor.contains("SW")
    }

    /// The maker's online EK certificate service, for people, when this
    /// TPM's maker has one ([`ek_service::of`]).
    pub(crate) fn ek_service(&self) -> Option<&'static str> {
        ek_service::of(self.manufacturer_id)
    }
}

pub struct Tpm {
    ctx: Context,
    /// Transient objects this connection loaded and has not flushed.
    loaded: Vec<KeyHandle>,
    /// `[tpm] ek`: the EK to use; None lets bcd choose.
    ek_kind: Option<EkKind>,
    /// `[tpm] ek_certificate`: sent instead of NV's.
    ek_certificate: Option<OperatorCertificate>,
}

impl Tpm {
    pub fn open(tcti: &str) -> Result<Self, TpmError> {
        let conf = TctiNameConf::from_str(tcti).map_err(|source| TpmError::Tcti {
            tcti: tcti.to_owned(),
            source,
        })?;
        let ctx = Context::new(conf).map_err(|source| TpmError::Open {
            tcti: tcti.to_owned(),
            source,
        })?;
        Ok(Tpm {
            ctx,
            loaded: Vec::new(),
            ek_kind: None,
            ek_certificate: None,
        })
    }

    /// `[tpm] ek`: the EK [`Tpm::ek`] uses (None: bcd chooses).
    pub(crate) fn set_ek_kind(&mut self, kind: Option<EkKind>) {
        self.ek_kind = kind;
    }

    /// `[tpm] ek_certificate`: the EK certificate [`Tpm::ek`] uses instead
    /// of NV's (its key decides the EK kind).
    pub(crate) fn set_ek_certificate(&mut self, cert: Option<OperatorCertificate>) {
        self.ek_certificate = cert;
    }

    /// The owner hierarchy's authorization, for the node key's CreatePrimary
    /// on a TPM whose owner a previous OS took. No TPM command.
    pub(crate) fn set_owner_auth(&mut self, auth: &[u8]) -> Result<(), TpmError> {
        let auth = tss_esapi::structures::Auth::try_from(auth.to_vec())
            .map_err(|_| TpmError::Unexpected("an owner authorization longer than 64 bytes"))?;
        cmd(
            "TR_SetAuth",
            self.ctx.tr_set_auth(ObjectHandle::Owner, auth),
        )
    }

    /// Manufacturer, vendor, firmware and family, in one GetCapability.
    pub(crate) fn info(&mut self) -> Result<TpmInfo, TpmError> {
        let (data, _) = cmd(
            "GetCapability",
            self.ctx.get_capability(
                CapabilityType::TpmProperties,
                PropertyTag::FamilyIndicator.into(),
                64,
            ),
        )?;
        let CapabilityData::TpmProperties(props) = data else {
            return Err(TpmError::Unexpected("a capability of another kind"));
        };
        let get = |tag: PropertyTag| props.find(tag).map(|p| p.value()).unwrap_or(0);
        let ascii = |v: u32| -> String {
            v.to_be_bytes()
                .iter()
                .filter(|b| b.is_ascii_graphic() || **b == b' ')
                .map(|&b| b as char)
                .collect()
        };
        let vendor: String = [
            PropertyTag::VendorString1,
            PropertyTag::VendorString2,
            PropertyTag::VendorString3,
            PropertyTag::VendorString4,
        ]
        .into_iter()
        .map(|t| ascii(get(t)))
        .collect::<String>()
        .trim()
        .to_owned();
        let (fw1, fw2) = (
            get(PropertyTag::FirmwareVersion1),
            get(PropertyTag::FirmwareVersion2),
        );
        Ok(TpmInfo {
            manufacturer_id: get(PropertyTag::Manufacturer),
            firmware_id: u64::from(fw1) << 32 | u64::from(fw2),
            manufacturer: ascii(get(PropertyTag::Manufacturer)),
            vendor,
            firmware: format!("{}.{} ({fw1:08x}.{fw2:08x})", fw1 >> 16, fw1 & 0xffff),
            family: ascii(get(PropertyTag::FamilyIndicator))
                .trim_end_matches('\0')
                .to_owned(),
        })
    }

    /// The EK and its certificate: the persistent EK when it checks out,
    /// else derived from its template ([`ek`]).
    pub fn ek(&mut self) -> Result<Ek, TpmError> {
        let kind = self.ek_kind;
        let operator = self.ek_certificate.clone();
        ek::load(self, kind, operator.as_ref())
    }

    /// The maker's intermediates in the EK chain NV indices (untrusted),
    /// from the listing [`Tpm::ek`] made.
    pub(crate) fn ek_chain(&mut self, ek: &Ek) -> Result<Vec<Vec<u8>>, TpmError> {
        ekchain::read(self, &ek.nv_indices)
    }

    /// The AK: a restricted P-256 signing primary of the endorsement
    /// hierarchy. The same template gives the same key on this TPM for as
    /// long as its endorsement seed lives, so nothing is stored.
    pub fn ak(&mut self) -> Result<LoadedKey, TpmError> {
        self.create_primary(Hierarchy::Endorsement, templates::ak_template()?)
    }

    /// A node key: an unrestricted P-256 signing primary of the owner
    /// hierarchy derived from `unique`. Same unique, same TPM owner seed:
    /// same key.
    pub fn node_key(&mut self, unique: &[u8; 32]) -> Result<LoadedKey, TpmError> {
        use tss_esapi::constants::response_code::Tss2ResponseCodeKind;
        match self.create_primary(Hierarchy::Owner, templates::node_key_template(unique)?) {
            // A previous OS (or tpm2_changeauth) set an owner authorization.
            Err(TpmError::Command {
                source: tss_esapi::Error::Tss2Error(rc),
                ..
            }) if rc.kind() == Some(Tss2ResponseCodeKind::BadAuth) => Err(TpmError::OwnerAuth),
            other => other,
        }
    }

    fn create_primary(
        &mut self,
        hierarchy: Hierarchy,
        template: tss_esapi::structures::Public,
    ) -> Result<LoadedKey, TpmError> {
        let created = cmd(
            "CreatePrimary",
            self.ctx
                .execute_with_session(Some(AuthSession::Password), |c| {
                    c.create_primary(hierarchy, template, None, None, None, None)
                }),
        )?;
        self.loaded.push(created.key_handle);
        let Ok(public) = created.out_public.marshall() else {
            // Not left to hold one of the connection's three object slots.
            let _ = self.release_handle(created.key_handle);
            return Err(TpmError::Unexpected("a public area that does not marshal"));
        };
        Ok(LoadedKey {
            handle: created.key_handle,
            public,
        })
    }

    /// Flushes a key this connection loaded.
    pub fn flush(&mut self, key: LoadedKey) -> Result<(), TpmError> {
        self.release(&key)
    }

    /// Flushes a key that its owner is dropping (a holder cannot move it out
    /// in `Drop`); a key already flushed is left alone.
    pub(crate) fn release(&mut self, key: &LoadedKey) -> Result<(), TpmError> {
        self.release_handle(key.handle)
    }

    /// Flushes a derived EK; the persistent one stays where it is.
    pub(crate) fn release_ek(&mut self, ek: &Ek) -> Result<(), TpmError> {
        self.release_handle(ek.handle())
    }

    /// Flushes `handle` if this connection loaded it and has not flushed it
    /// yet (a persistent object is never in `loaded`).
    pub(super) fn release_handle(&mut self, handle: KeyHandle) -> Result<(), TpmError> {
        let before = self.loaded.len();
        self.loaded.retain(|h| *h != handle);
        if self.loaded.len() == before {
            return Ok(());
        }
        cmd("FlushContext", self.ctx.flush_context(handle.into()))
    }

    /// ECDSA with the digest's hash (SHA-256, -384 or -512 by its length),
    /// as P1363 `r‖s`.
    pub fn sign_digest(&mut self, key: &LoadedKey, digest: &[u8]) -> Result<[u8; 64], TpmError> {
        let hash = match digest.len() {
            32 => HashingAlgorithm::Sha256,
            48 => HashingAlgorithm::Sha384,
            64 => HashingAlgorithm::Sha512,
            _ => return Err(TpmError::Unexpected("a digest length it cannot sign")),
        };
        let digest = Digest::try_from(digest.to_vec()).map_err(|source| TpmError::Command {
            command: "Sign",
            source,
        })?;
        let ticket = HashcheckTicket::try_from(tss_esapi::tss2_esys::TPMT_TK_HASHCHECK {
            tag: TPM2_ST_HASHCHECK,
            hierarchy: TPM2_RH_NULL,
            digest: Default::default(),
        })
        .map_err(|source| TpmError::Command {
            command: "Sign",
            source,
        })?;
        let scheme = SignatureScheme::EcDsa {
            hash_scheme: HashScheme::new(hash),
        };
        let handle = key.handle;
        let sig = cmd(
            "Sign",
            self.ctx
                .execute_with_session(Some(AuthSession::Password), |c| {
                    c.sign(handle, digest, scheme, ticket)
                }),
        )?;
        p1363_of(&sig)
    }

    /// TPM2_Certify of `key` by `ak`, qualified by `qualifying`: the marshalled
    /// TPMS_ATTEST and TPMT_SIGNATURE.
    pub fn certify(
        &mut self,
        key: &LoadedKey,
        ak: &LoadedKey,
        qualifying: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), TpmError> {
        let data = Data::try_from(qualifying.to_vec()).map_err(|source| TpmError::Command {
            command: "Certify",
            source,
        })?;
        let (object, signer): (ObjectHandle, KeyHandle) = (key.handle.into(), ak.handle);
        let (attest, sig) = cmd(
            "Certify",
            self.ctx.execute_with_sessions(
                (
                    Some(AuthSession::Password),
                    Some(AuthSession::Password),
                    None,
                ),
                |c| c.certify(object, signer, data, SignatureScheme::Null),
            ),
        )?;
        marshal_attest(&attest, &sig)
    }

    /// TPM2_ActivateCredential: releases the credential that a verifier
    /// bound to the AK's name and encrypted to the EK. Only this TPM, with
    /// this AK loaded, can do it. The EK's policy session (PolicySecret of the
    /// endorsement hierarchy) authorizes its use and is flushed after; an
    /// EK with userWithAuth (the high-range templates, e.g. P-384 H-3,
    /// whose PolicyB is SHA-384) takes its empty password instead.
    pub fn activate_credential(
        &mut self,
        ak: &LoadedKey,
        ek: &Ek,
        id_object: &[u8],
        encrypted_secret: &[u8],
    ) -> Result<Vec<u8>, TpmError> {
        let id = IdObject::try_from(id_object.to_vec()).map_err(|source| TpmError::Command {
            command: "ActivateCredential",
            source,
        })?;
        let secret = EncryptedSecret::try_from(encrypted_secret.to_vec()).map_err(|source| {
            TpmError::Command {
                command: "ActivateCredential",
                source,
            }
        })?;
        let user_with_auth = bc_wire::tpm::Public::parse(&ek.public)
            .is_ok_and(|p| p.has(bc_wire::tpm::attr::USER_WITH_AUTH));
        if user_with_auth {
            let (ak, ek) = (ak.handle, ek.handle());
            let cred = cmd(
                "ActivateCredential",
                self.ctx.execute_with_sessions(
                    (
                        Some(AuthSession::Password),
                        Some(AuthSession::Password),
                        None,
                    ),
                    |c| c.activate_credential(ak, ek, id, secret),
                ),
            )?;
            return Ok(cred.value().to_vec());
        }
        let session = cmd(
            "StartAuthSession",
            self.ctx.start_auth_session(
                None,
                None,
                None,
                SessionType::Policy,
                SymmetricDefinition::AES_128_CFB,
                HashingAlgorithm::Sha256,
            ),
        )?
        .ok_or(TpmError::Unexpected("no session"))?;
        let result = self.activate_in(session, ak.handle, ek.handle(), id, secret);
        let mut handle: ObjectHandle = SessionHandle::from(session).into();
        if result.is_err() {
            // A failed command leaves the session loaded: flush it here.
            let _ = self.ctx.flush_context(handle);
        } else {
            // The TPM flushed it; forget it here too, or dropping the
            // context would flush it again (tss-esapi reports the closing
            // of a session it expected to flush as an error: not one).
            let _ = self.ctx.tr_close(&mut handle);
        }
        result
    }

    fn activate_in(
        &mut self,
        session: AuthSession,
        ak: KeyHandle,
        ek: KeyHandle,
        id: IdObject,
        secret: EncryptedSecret,
    ) -> Result<Vec<u8>, TpmError> {
        let policy = PolicySession::try_from(session)
            .map_err(|_| TpmError::Unexpected("a non-policy session"))?;
        cmd(
            "PolicySecret",
            self.ctx
                .execute_with_session(Some(AuthSession::Password), |c| {
                    c.policy_secret(
                        policy,
                        AuthHandle::Endorsement,
                        Nonce::default(),
                        Digest::default(),
                        Nonce::default(),
                        None,
                    )
                }),
        )?;
        // Its last use: without continueSession the TPM flushes it after
        // ActivateCredential, one FlushContext fewer.
        let (attributes, mask) = SessionAttributesBuilder::new()
            .with_continue_session(false)
            .build();
        cmd(
            "ActivateCredential",
            self.ctx.tr_sess_set_attributes(session, attributes, mask),
        )?;
        let cred = cmd(
            "ActivateCredential",
            self.ctx
                .execute_with_sessions((Some(AuthSession::Password), Some(session), None), |c| {
                    c.activate_credential(ak, ek, id, secret)
                }),
        )?;
        Ok(cred.value().to_vec())
    }

    pub(crate) fn ctx(&mut self) -> &mut Context {
        &mut self.ctx
    }

    pub(crate) fn track(&mut self, handle: KeyHandle) {
        self.loaded.push(handle);
    }
}

impl Drop for Tpm {
    fn drop(&mut self) {
        // Without a resource manager (swtpm's TCP TCTI), what is not flushed
        // stays loaded after the process exits.
        for h in std::mem::take(&mut self.loaded) {
            let _ = self.ctx.flush_context(h.into());
        }
    }
}

pub(crate) fn marshal_attest(
    attest: &tss_esapi::structures::Attest,
    sig: &Signature,
) -> Result<(Vec<u8>, Vec<u8>), TpmError> {
    let a = attest
        .marshall()
        .map_err(|_| TpmError::Unexpected("an attestation that does not marshal"))?;
    let s = sig
        .marshall()
        .map_err(|_| TpmError::Unexpected("a signature that does not marshal"))?;
    Ok((a, s))
}

fn p1363_of(sig: &Signature) -> Result<[u8; 64], TpmError> {
    let Signature::EcDsa(ecc) = sig else {
        return Err(TpmError::Unexpected("a signature that is not ECDSA"));
    };
    bc_wire::tpm::p1363(ecc.signature_r().value(), ecc.signature_s().value())
        .ok_or(TpmError::Unexpected("an ECDSA signature wider than P-256"))
}
