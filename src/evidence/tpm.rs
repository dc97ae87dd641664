//! `tpm` evidence: the two-round enrollment of go-attestation, with the node
//! key certified by the AK.
//!
//! Round 1 ([`TpmEvidence::hello`]) names the EK (public area and the maker's
//! certificate) and the AK. The control plane answers with a credential that
//! only this TPM, holding that EK with that AK loaded, can activate. Round 2
//! ([`Answerer::answer`]) returns it with a quote of the SHA-256 PCR bank
//! whose extraData is `sha256(secret ‖ sha256(csr))`, and the AK's
//! certification of the node key over `sha256(csr)`, made once before round 1.

use bc_wire::agent::tpm_attestation::Round;
use bc_wire::agent::{
    JoinChallenge, TpmAnswer, TpmAttestation, TpmChallenge, TpmHello, TpmKeyCertification,
};
use prost::Message;

use crate::client::join::{Answerer, JoinError};
use crate::keys::{KeyError, SharedTpm, TpmKey};
use crate::tpm::{Ek, LoadedKey};

pub struct TpmEvidence {
    tpm: SharedTpm,
    ek: Ek,
    ak: LoadedKey,
    csr_sha256: [u8; 32],
    node_key: TpmKeyCertification,
    /// Untrusted intermediates toward the maker's root: NV, then the file's.
    intermediates: Vec<Vec<u8>>,
}

impl TpmEvidence {
    /// Loads the EK (with its certificate) and the AK, has the AK certify
    /// `key` over `sha256(csr)`, and unloads `key`.
    pub fn new(
        tpm: SharedTpm,
        key: &TpmKey,
        csr_sha256: [u8; 32],
    ) -> Result<TpmEvidence, KeyError> {
        let (ek, ak, intermediates) = {
            let mut t = crate::keys::lock_tpm(&tpm)?;
            let ek = t.ek()?;
            let intermediates = t.ek_chain().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot read the EK chain NV indices");
                Vec::new()
            });
            if ek.certificate.is_none() {
                tracing::warn!("the TPM has no EK certificate at NV 0x01c00002; the control plane will not trust this EK");
            }
            match t.ak() {
                Ok(ak) => (ek, ak, intermediates),
                Err(e) => {
                    // The EK must not keep one of the connection's three slots.
                    let _ = t.release_ek(&ek);
                    return Err(e.into());
                }
            }
        };
        // Made before the certification, so that its Drop flushes the EK
        // and the AK when that fails.
        let mut evidence = TpmEvidence {
            tpm,
            ek,
            ak,
            csr_sha256,
            node_key: TpmKeyCertification::default(),
            intermediates,
        };
        let (certify_info, signature) = key.certify_by(&evidence.ak, &csr_sha256)?;
        // Round 2 needs the AK and the EK, not the node key: out of the
        // TPM's object slots now (the identity keeps only its unique).
        key.unload();
        evidence.node_key = TpmKeyCertification {
            public: key.public().to_vec(),
            certify_info,
            signature,
        };
        Ok(evidence)
    }

    /// Adds intermediates (`[tpm] ek_intermediates`) after the TPM's own,
    /// without duplicates, up to what the control plane accepts.
    pub fn add_intermediates(&mut self, ders: Vec<Vec<u8>>) {
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
        TpmAttestation {
            round: Some(Round::Hello(TpmHello {
                ek_public: self.ek.public.clone(),
                ek_certificate: self.ek.certificate.clone().unwrap_or_default(),
                ak_public: self.ak.public.clone(),
                ek_intermediates: self.intermediates.clone(),
            })),
        }
        .encode_to_vec()
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

impl Answerer for TpmEvidence {
    fn answer(&mut self, challenge: &JoinChallenge) -> Result<Vec<u8>, JoinError> {
        let c = TpmChallenge::decode(challenge.payload.as_slice())
            .map_err(|e| JoinError::Evidence(format!("the tpm challenge does not parse: {e}")))?;
        let mut tpm =
            crate::keys::lock_tpm(&self.tpm).map_err(|e| JoinError::Evidence(e.to_string()))?;
        let secret = tpm
            .activate_credential(&self.ak, &self.ek, &c.id_object, &c.encrypted_secret)
            .map_err(|e| JoinError::Evidence(e.to_string()))?;
        let mut nonce = secret.clone();
        nonce.extend_from_slice(&self.csr_sha256);
        let quote = tpm
            .quote(&self.ak, &bc_wire::sha256(&nonce), &c.pcrs)
            .map_err(|e| JoinError::Evidence(e.to_string()))?;
        Ok(TpmAttestation {
            round: Some(Round::Answer(TpmAnswer {
                state: c.state,
                secret,
                quote: quote.attest,
                quote_signature: quote.signature,
                pcr_values: quote.pcr_values,
                node_key: Some(self.node_key.clone()),
            })),
        }
        .encode_to_vec())
    }
}
