//! The file holder: a PKCS#8 P-256 key (PEM "PRIVATE KEY") in `node.key`.
//!
//! Used where there is no TPM. The key is as safe as the file's mode (0600)
//! and the data directory's (0700).
use std::fmt;
use std::path::Path;

use p256::ecdsa::signature::Signer;
use p256::ecdsa::{Signature, SigningKey};
use p256::elliptic_curve::zeroize::Zeroizing;
use p256::elliptic_curve::Generate;
use p256::pkcs8::{DecodePrivateKey, EncodePrivateKey, EncodePublicKey, LineEnding};

use super::{KeyError, NodeKey, NodeKeyKind};

pub struct FileKey {
    key: SigningKey,
    spki: Vec<u8>,
}

/// Shows the key id only, never the private scalar.
impl fmt::Debug for FileKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileKey")
            .field("kid", &self.kid())
            .finish_non_exhaustive()
    }
}

impl FileKey {
    pub fn generate() -> Result<FileKey, KeyError> {
        let key = SigningKey::try_generate().map_err(|_| KeyError::Random)?;
        FileKey::from_signing_key(key)
    }

    fn from_signing_key(key: SigningKey) -> Result<FileKey, KeyError> {
        let spki = key
            .verifying_key()
            .to_public_key_der()
            .map_err(|_| KeyError::BadPublicKey)?
            .into_vec();
        Ok(FileKey { key, spki })
    }

    /// Parses a PKCS#8 PEM; `origin` names it in errors.
    pub(crate) fn from_pem(pem: &str, origin: &str) -> Result<FileKey, KeyError> {
        let key = SigningKey::from_pkcs8_pem(pem).map_err(|_| KeyError::Malformed {
            path: origin.to_owned(),
        })?;
        FileKey::from_signing_key(key)
    }

    pub(crate) fn load(path: &Path) -> Result<FileKey, KeyError> {
        let text = super::read_key_file(path)?;
        FileKey::from_pem(&text, &path.display().to_string())
    }
}

impl NodeKey for FileKey {
    fn kind(&self) -> NodeKeyKind {
        NodeKeyKind::File
    }

    fn spki_der(&self) -> &[u8] {
        &self.spki
    }

    fn sign(&self, msg: &[u8]) -> Result<[u8; 64], KeyError> {
        let sig: Signature = self.key.try_sign(msg).map_err(|_| KeyError::Sign)?;
        Ok(sig.to_bytes().into())
    }

    fn to_file_contents(&self) -> Result<Zeroizing<String>, KeyError> {
        self.key
            .to_pkcs8_pem(LineEnding::LF)
            .map_err(|_| KeyError::Encode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_wire::signing::{signing_input, verify, verifying_key_from_spki, Purpose};

    #[test]
    fn signs_es256_that_verifies_under_its_spki() {
        let k = FileKey::generate().unwrap();
        let msg = signing_input(Purpose::Renew, &[b"x"]);
        let sig = k.sign(&msg).unwrap();
        let vk = verifying_key_from_spki(k.spki_der()).unwrap();
        verify(&vk, Purpose::Renew, &[b"x"], &sig).unwrap();
        assert_eq!(k.kid().len(), 64);
    }

    #[test]
    fn pem_round_trip_keeps_the_key() {
        let k = FileKey::generate().unwrap();
        let pem = k.to_file_contents().unwrap();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let back = FileKey::from_pem(&pem, "node.key").unwrap();
        assert_eq!(back.spki_der(), k.spki_der());
    }

    #[test]
    fn debug_and_errors_never_show_the_key() {
        let k = FileKey::generate().unwrap();
        let pem = k.to_file_contents().unwrap();
        assert!(!format!("{k:?}").contains("PRIVATE"));
        let broken = pem.replace('A', "B");
        let e = FileKey::from_pem(&broken, "/d/node.key")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "the node key /d/node.key is not a P-256 private key (PEM \"PRIVATE KEY\", PKCS#8)"
        );
    }
}
