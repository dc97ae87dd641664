//! The node key as a rustls client identity, so that the mTLS handshake is
//! signed through [`NodeKey`] whatever holds the key (file, TPM, helper).
//!
//! Only ECDSA P-256 with SHA-256 is offered: it is what every holder can do
//! and what the control plane's node CA certifies. Holders sign P1363
//! `r‖s`; TLS wants the DER `ECDSA-Sig-Value`, hence the conversion.
use std::sync::Arc;

use p256::ecdsa::Signature;
use rustls::pki_types::{CertificateDer, SubjectPublicKeyInfoDer};
use rustls::sign::{CertifiedKey, Signer, SigningKey, SingleCertAndKey};
use rustls::{SignatureAlgorithm, SignatureScheme};

use super::NodeKey;

/// The one TLS signature scheme a node key signs with.
pub(crate) const SCHEME: SignatureScheme = SignatureScheme::ECDSA_NISTP256_SHA256;

/// A node key as a rustls signing key.
#[derive(Debug)]
pub(crate) struct TlsNodeKey {
    key: Arc<dyn NodeKey>,
}

impl TlsNodeKey {
    pub(crate) fn new(key: Arc<dyn NodeKey>) -> TlsNodeKey {
        TlsNodeKey { key }
    }
}

impl SigningKey for TlsNodeKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        if offered.contains(&SCHEME) {
            Some(Box::new(TlsSigner {
                key: self.key.clone(),
            }))
        } else {
            tracing::warn!(
                offered = ?offered,
                "the control plane accepts no ECDSA P-256 SHA-256 signature; the node certificate cannot be used"
            );
            None
        }
    }

    fn public_key(&self) -> Option<SubjectPublicKeyInfoDer<'_>> {
        Some(SubjectPublicKeyInfoDer::from(self.key.spki_der()))
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        SignatureAlgorithm::ECDSA
    }
}

#[derive(Debug)]
struct TlsSigner {
    key: Arc<dyn NodeKey>,
}

impl Signer for TlsSigner {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        let p1363 = self
            .key
            .sign(message)
            .map_err(|e| rustls::Error::General(format!("the node key cannot sign: {e}")))?;
        p1363_to_der(&p1363)
            .ok_or_else(|| rustls::Error::General("the node key signed garbage".to_owned()))
    }

    fn scheme(&self) -> SignatureScheme {
        SCHEME
    }
}

/// `r‖s` as the DER `ECDSA-Sig-Value` TLS carries; `None` for values out of range.
pub(crate) fn p1363_to_der(p1363: &[u8; 64]) -> Option<Vec<u8>> {
    let sig = Signature::from_slice(p1363).ok()?;
    Some(sig.to_der().as_bytes().to_vec())
}

/// The client identity for mTLS: `chain` (DER, leaf first) and the key its
/// leaf certifies. The caller has checked that they match (an [`Identity`]
/// that loaded does).
///
/// [`Identity`]: crate::identity::Identity
pub(crate) fn client_identity(chain: &[Vec<u8>], key: Arc<dyn NodeKey>) -> Arc<SingleCertAndKey> {
    let certs = chain
        .iter()
        .map(|c| CertificateDer::from(c.clone()))
        .collect();
    let signing: Arc<dyn SigningKey> = Arc::new(TlsNodeKey::new(key));
    Arc::new(SingleCertAndKey::from(CertifiedKey::new(certs, signing)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::FileKey;
    use p256::ecdsa::signature::Verifier;

    #[test]
    fn signs_der_ecdsa_that_verifies_under_the_spki() {
        let key: Arc<dyn NodeKey> = Arc::new(FileKey::generate().unwrap());
        let tls = TlsNodeKey::new(key.clone());
        assert!(tls
            .choose_scheme(&[SignatureScheme::RSA_PSS_SHA256])
            .is_none());
        let signer = tls
            .choose_scheme(&[SignatureScheme::ED25519, SCHEME])
            .unwrap();
        assert_eq!(signer.scheme(), SCHEME);
        let der = signer.sign(b"handshake transcript").unwrap();
        let sig = Signature::from_der(&der).unwrap();
        let vk = bc_wire::signing::verifying_key_from_spki(key.spki_der()).unwrap();
        vk.verify(b"handshake transcript", &sig).unwrap();
        assert_eq!(
            tls.public_key().unwrap().as_ref(),
            key.spki_der(),
            "the SPKI rustls sees is the key's"
        );
    }
}
