//! `x509pop` evidence: a node re-joins as itself with its last (possibly
//! expired) certificate and a proof by that certificate's key, bound to the
//! new CSR, the node id and the client's time.
//!
//! ```json
//! {"v":1,"nodeId":"node_…","chain":["<b64url DER leaf>","<b64url DER issuer>"],
//!  "clientTime":1790000000000,"sig":"<b64url r‖s>"}
//! ```
//! `sig` is ES256 under purpose `x509pop` over `[sha256(csr), nodeId,
//! u64_be(clientTime)]`, so neither a renewal proof nor an earlier x509pop
//! proof can be replayed as one.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;

use crate::signing::{self, Purpose, SignatureError};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum X509PopError {
    #[error("the x509pop evidence is not the expected JSON: {0}")]
    Json(String),
    #[error("the x509pop evidence has version {0}; expected 1")]
    Version(u32),
    #[error("the x509pop evidence has a field that is not base64url: {0}")]
    Base64(&'static str),
    #[error("the x509pop evidence has no certificate")]
    NoChain,
    #[error("the x509pop signature is not 64 bytes")]
    SignatureLength,
}

/// The evidence as it travels (JSON, UTF-8).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Wire {
    v: u32,
    node_id: String,
    chain: Vec<String>,
    client_time: u64,
    sig: String,
}

/// Parsed evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    pub node_id: String,
    /// DER, leaf first.
    pub chain: Vec<Vec<u8>>,
    /// Unix milliseconds at the client.
    pub client_time_ms: u64,
    /// P1363 `r‖s`.
    pub sig: [u8; 64],
}

/// The signing input of a proof (what bcd signs).
pub fn signed_fields(csr_sha256: &[u8; 32], node_id: &str, client_time_ms: u64) -> Vec<u8> {
    with_fields(csr_sha256, node_id, client_time_ms, |fields| {
        signing::signing_input(Purpose::X509Pop, fields)
    })
}

/// Calls `f` with the signed fields, in order: the one list both
/// [`signed_fields`] and [`Evidence::verify`] use, so they cannot disagree.
fn with_fields<T>(
    csr_sha256: &[u8; 32],
    node_id: &str,
    client_time_ms: u64,
    f: impl FnOnce(&[&[u8]]) -> T,
) -> T {
    f(&[
        csr_sha256,
        node_id.as_bytes(),
        &client_time_ms.to_be_bytes(),
    ])
}

impl Evidence {
    pub fn to_json(&self) -> Vec<u8> {
        let wire = Wire {
            v: 1,
            node_id: self.node_id.clone(),
            chain: self.chain.iter().map(|c| B64.encode(c)).collect(),
            client_time: self.client_time_ms,
            sig: B64.encode(self.sig),
        };
        // Serializing plain strings and numbers cannot fail.
        serde_json::to_vec(&wire).unwrap_or_default()
    }

    pub fn from_json(bytes: &[u8]) -> Result<Evidence, X509PopError> {
        let wire: Wire =
            serde_json::from_slice(bytes).map_err(|e| X509PopError::Json(e.to_string()))?;
        if wire.v != 1 {
            return Err(X509PopError::Version(wire.v));
        }
        let chain = wire
            .chain
            .iter()
            .map(|c| B64.decode(c).map_err(|_| X509PopError::Base64("chain")))
            .collect::<Result<Vec<_>, _>>()?;
        if chain.is_empty() {
            return Err(X509PopError::NoChain);
        }
        let sig = B64
            .decode(&wire.sig)
            .map_err(|_| X509PopError::Base64("sig"))?;
        let sig: [u8; 64] = sig.try_into().map_err(|_| X509PopError::SignatureLength)?;
        Ok(Evidence {
            node_id: wire.node_id,
            chain,
            client_time_ms: wire.client_time,
            sig,
        })
    }

    /// Verifies the proof with the leaf's key (`leaf_spki_der`) for a CSR.
    pub fn verify(
        &self,
        leaf_spki_der: &[u8],
        csr_sha256: &[u8; 32],
    ) -> Result<(), SignatureError> {
        let key = signing::verifying_key_from_spki(leaf_spki_der)?;
        with_fields(csr_sha256, &self.node_id, self.client_time_ms, |fields| {
            signing::verify(&key, Purpose::X509Pop, fields, &self.sig)
        })
    }
}
