//! `tpm` evidence: the two-round enrollment of go-attestation, with the node
//! key certified by the AK.
//!
//! Round 1 ([`TpmEvidence::hello`]) names the EK (public area and the maker's
//! certificate) and the AK. The control plane answers with a credential that
//! only this TPM, holding that EK with that AK loaded, can activate. Round 2
//! ([`AnswerChallenge::answer`]) returns it with a quote of the PCRs the challenge
//! names, in a bank the TPM has and the policy names, whose extraData is
//! `sha256(secret ‖ sha256(csr))`, and the AK's certification of the node key
//! over `sha256(csr)`. When the challenge names no PCR and takes a
//! `fresh_certification`, the quote is left out and the certification is
//! over `sha256(secret ‖ sha256(csr))` instead: the same AK signature over
//! the same nonce, one TPM command fewer. When the challenge asks for the
//! event log (the node's pool has a boot policy), the answer carries it and
//! the quote selects the PCRs in every bank the TPM has populated.

use std::sync::Arc;

use bc_wire::agent::tpm_attestation::Round;
use bc_wire::agent::{
    EkCertificateSource, JoinChallenge, JoinRequest, TpmAnswer, TpmAttestation, TpmChallenge,
    TpmHello, TpmKeyCertification,
};
use bc_wire::pcr::PcrBank;
use prost::Message;

use super::challenge::{AnswerChallenge, ChallengeError};
use crate::keys::{KeyError, SharedTpm, TpmKey};
use crate::tpm::{CertificateSource, Ek, LoadedKey, TpmInfo};

pub struct TpmEvidence {
    tpm: SharedTpm,
    ek: Ek,
    ak: LoadedKey,
    /// Certified in round 2, then unloaded.
    key: Arc<TpmKey>,
    csr_sha256: [u8; 32],
    /// Untrusted intermediates toward the maker's root: NV, then the file's.
    intermediates: Vec<Vec<u8>>,
    /// How many of `intermediates` came from NV.
    nv_intermediates: usize,
    /// Who made the TPM (one GetCapability), read only for a TPM without
    /// an EK certificate: the control plane fetches it from the maker's
    /// service by it.
    info: Option<TpmInfo>,
}

impl TpmEvidence {
    /// Loads the EK (with its certificate) and the AK, for round 1 and for
    /// answering with `key` (the CSR's) in round 2.
    pub fn new(
        tpm: SharedTpm,
        key: Arc<TpmKey>,
        csr_sha256: [u8; 32],
    ) -> Result<TpmEvidence, KeyError> {
        let (ek, ak, intermediates, info) = {
            let mut t = crate::keys::lock_tpm(&tpm)?;
            let ek = t.ek()?;
            let intermediates = t.ek_chain(&ek).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot read the EK chain NV indices");
                Vec::new()
            });
            // Who made the TPM matters only to fetch a certificate it lacks:
            // with one (NV or `[tpm] ek_certificate`), no GetCapability.
            let info = match ek.certificate {
                Some(_) => None,
                None => match t.info() {
                    Ok(info) => Some(info),
                    Err(e) => {
                        let _ = t.release_ek(&ek);
                        return Err(e.into());
                    }
                },
            };
            if let Some(info) = &info {
                match info.ek_service() {
                    Some(service) => tracing::warn!(manufacturer = %info.manufacturer, "the TPM has no EK certificate (NV 0x01c00002, 0x01c0000a or 0x01c00016) and [tpm] ek_certificate is not set; the control plane fetches it from {service}"),
                    None => tracing::warn!("the TPM has no EK certificate (NV 0x01c00002, 0x01c0000a or 0x01c00016) and [tpm] ek_certificate is not set; the control plane admits this EK only if an operator pinned it (resolve add --uncertified)"),
                }
            } else if ek.matches_certificate == Some(false) {
                tracing::warn!(ek = ek.kind.as_str(), "the TPM's EK is not the key its certificate names; the control plane will refuse it (ek-mismatch)");
            }
            match t.ak() {
                Ok(ak) => (ek, ak, intermediates, info),
                Err(e) => {
                    // The EK must not keep one of the connection's three slots.
                    let _ = t.release_ek(&ek);
                    return Err(e.into());
                }
            }
        };
        Ok(TpmEvidence {
            tpm,
            ek,
            ak,
            key,
            csr_sha256,
            nv_intermediates: intermediates.len(),
            intermediates,
            info,
        })
    }

    /// Whether round 1 sends no EK certificate for a TPM whose maker has an
    /// EK service: the control plane then fetches it, and a refusal may be
    /// that service being unreachable (worth asking again).
    pub(crate) fn certificate_from_service(&self) -> Option<&'static str> {
        match self.ek.certificate {
            None => self.info.as_ref().and_then(TpmInfo::ek_service),
            Some(_) => None,
        }
    }

    /// Adds intermediates (`[tpm] ek_intermediates`) after the TPM's own,
    /// without duplicates, up to what the control plane accepts.
    pub(crate) fn add_intermediates(&mut self, ders: Vec<Vec<u8>>) {
        for der in ders {
            if self.intermediates.len() < bc_wire::ekcert::MAX_AGENT_INTERMEDIATES
                && !self.intermediates.contains(&der)
            {
                self.intermediates.push(der);
            }
        }
    }

    /// The AK this evidence was made with.
    pub fn ak(&self) -> &LoadedKey {
        &self.ak
    }

    /// Round 1: the attestation of the first request.
    pub fn hello(&self) -> Vec<u8> {
        self.hello_message().encode_to_vec()
    }

    /// Round 1 as a message, for [`Beside`].
    pub fn hello_message(&self) -> TpmAttestation {
        TpmAttestation {
            round: Some(Round::Hello(TpmHello {
                ek_public: self.ek.public.clone(),
                ek_certificate: self.ek.certificate.clone().unwrap_or_default(),
                ak_public: self.ak.public.clone(),
                ek_intermediates: self.intermediates.clone(),
                ek_certificate_source: match self.ek.certificate_source {
                    None => EkCertificateSource::Unspecified,
                    Some(CertificateSource::Nv) => EkCertificateSource::Nv,
                    Some(CertificateSource::OperatorFile) => EkCertificateSource::OperatorFile,
                } as i32,
                ek_nv_intermediates: self.nv_intermediates as u32,
                // Unset (0, "") with a certificate: the control plane has
                // nothing to fetch.
                tpm_manufacturer: self.info.as_ref().map_or(0, |i| i.manufacturer_id),
                tpm_vendor: self
                    .info
                    .as_ref()
                    .map(|i| i.vendor.clone())
                    .unwrap_or_default(),
                tpm_firmware: self.info.as_ref().map_or(0, |i| i.firmware_id),
            })),
        }
    }
}

/// The same evidence beside another attestor's, in `JoinRequest.tpm`: a
/// PXE ramdisk's discovery join proving its TPM. The control plane
/// challenges it under that attestor's name with a `TpmChallenge`.
pub(crate) struct Beside(pub TpmEvidence);

impl AnswerChallenge for Beside {
    fn answer(
        &mut self,
        challenge: &JoinChallenge,
        request: &mut JoinRequest,
    ) -> Result<(), ChallengeError> {
        request.tpm = Some(self.0.answer_message(challenge)?);
        Ok(())
    }
}

/// The AK and a derived EK leave the TPM with the evidence.
impl Drop for TpmEvidence {
    fn drop(&mut self) {
        if let Ok(mut tpm) = crate::keys::lock_tpm(&self.tpm) {
            let _ = tpm.release(&self.ak);
            let _ = tpm.release_ek(&self.ek);
        }
    }
}

impl AnswerChallenge for TpmEvidence {
    fn answer(
        &mut self,
        challenge: &JoinChallenge,
        request: &mut JoinRequest,
    ) -> Result<(), ChallengeError> {
        request.attestation = self.answer_message(challenge)?.encode_to_vec();
        Ok(())
    }
}

impl TpmEvidence {
    /// Round 2: ActivateCredential, the node key's certification and, when
    /// the challenge names PCRs, the quote.
    pub fn answer_message(
        &mut self,
        challenge: &JoinChallenge,
    ) -> Result<TpmAttestation, ChallengeError> {
        let c = TpmChallenge::decode(challenge.payload.as_slice())
            .map_err(|e| ChallengeError(format!("the tpm challenge does not parse: {e}")))?;
        let evidence = |e: &dyn std::fmt::Display| ChallengeError(e.to_string());
        // Before anything else of round 2: a TPM that cannot meet the PCR
        // policy activates nothing and sends no quote. No PCR, no question.
        // (With the event log, every populated bank is quoted instead.)
        let bank = if c.pcrs.is_empty() || c.event_log {
            PcrBank::Sha256
        } else {
            crate::keys::lock_tpm(&self.tpm)
                .map_err(|e| evidence(&e))?
                .pcr_bank_for(&c.pcr_banks, &c.pcrs)
                .map_err(|e| evidence(&e))?
        };
        // A boot policy: the event log, and every populated bank to quote,
        // before anything is activated either.
        let boot = if c.event_log {
            let log = super::eventlog::read().map_err(|e| evidence(&e))?;
            let banks = crate::keys::lock_tpm(&self.tpm)
                .map_err(|e| evidence(&e))?
                .populated_banks(&c.pcrs)
                .map_err(|e| evidence(&e))?;
            Some((log, banks))
        } else {
            None
        };
        let secret = crate::keys::lock_tpm(&self.tpm)
            .map_err(|e| evidence(&e))?
            .activate_credential(&self.ak, &self.ek, &c.id_object, &c.encrypted_secret)
            .map_err(|e| evidence(&e))?;
        let mut nonce_input = secret.clone();
        nonce_input.extend_from_slice(&self.csr_sha256);
        let nonce = bc_wire::sha256(&nonce_input);
        let fresh = c.fresh_certification && c.pcrs.is_empty() && boot.is_none();
        let qualifying = if fresh { nonce } else { self.csr_sha256 };
        let (certify_info, signature) = self
            .key
            .certify_by(&self.ak, &qualifying)
            .map_err(|e| evidence(&e))?;
        // The rest of the join does not need the node key in the TPM (the
        // identity keeps only its unique): out of the connection's slots.
        self.key.unload();
        let mut answer = TpmAnswer {
            state: c.state,
            secret,
            node_key: Some(TpmKeyCertification {
                public: self.key.public().to_vec(),
                certify_info,
                signature,
            }),
            ..TpmAnswer::default()
        };
        if !fresh {
            let mut tpm = crate::keys::lock_tpm(&self.tpm).map_err(|e| evidence(&e))?;
            let quote = match &boot {
                Some((_, banks)) => tpm.quote_in(&self.ak, &nonce, &c.pcrs, banks),
                None => tpm.quote(&self.ak, &nonce, &c.pcrs, bank),
            }
            .map_err(|e| evidence(&e))?;
            answer.quote = quote.attest;
            answer.quote_signature = quote.signature;
            answer.pcr_values = quote.pcr_values;
        }
        if let Some((log, _)) = boot {
            answer.event_log = log;
        }
        Ok(TpmAttestation {
            round: Some(Round::Answer(answer)),
        })
    }
}
