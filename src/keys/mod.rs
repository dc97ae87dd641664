//! The node key: one signer abstraction for everything that signs.
//!
//! The CSR, the TLS handshake, renewal proofs and discovery assertions all
//! take a `&dyn NodeKey`, never a holder, so that where the private key lives
//! (a PKCS#8 file now; the TPM in issue 3; the root helper in issue 4) changes
//! nothing above this module. A holder only has to produce ES256 signatures
//! and its public half.
//!
//! Seams for the other holders: add a variant to [`NodeKeyKind`], a module
//! beside `file.rs`, and an arm in [`generate`] and [`load`].
mod csr;
mod file;

use std::path::Path;

use p256::elliptic_curve::zeroize::Zeroizing;

pub use csr::make_csr;
pub use file::FileKey;

/// Where a node key is held. Recorded in `identity.json` (`nodeKey`) and
/// shown by `bcd status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKeyKind {
    /// A PKCS#8 P-256 key in `node.key`.
    File,
    /// A key that never leaves the TPM; `node.key` holds only its derivation input.
    Tpm,
}

impl NodeKeyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKeyKind::File => "file",
            NodeKeyKind::Tpm => "tpm",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "file" => Some(NodeKeyKind::File),
            "tpm" => Some(NodeKeyKind::Tpm),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot make a node key: the system random generator failed")]
    Random,
    #[error("cannot read the node key {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Deliberately without the parser's detail: it might quote key bytes.
    #[error("the node key {path} is not a P-256 private key (PEM \"PRIVATE KEY\", PKCS#8)")]
    Malformed { path: String },
    #[error("cannot encode the node key")]
    Encode,
    #[error("the node key's public half is not a P-256 SubjectPublicKeyInfo")]
    BadPublicKey,
    #[error("the node key failed to sign")]
    Sign,
    #[error("cannot build the CSR: {0}")]
    Csr(String),
    #[error("this bcd cannot hold a node key in the TPM yet")]
    TpmUnsupported,
}

/// A P-256 signing key, wherever it is held. `Send + Sync` because rustls
/// signs handshakes from its own tasks; a holder with a connection (TPM,
/// helper socket) keeps it behind a lock.
pub trait NodeKey: Send + Sync + std::fmt::Debug {
    fn kind(&self) -> NodeKeyKind;

    /// The public half as a SubjectPublicKeyInfo (DER).
    fn spki_der(&self) -> &[u8];

    /// The wire's key id: hex SHA-256 of the SPKI. Safe to log.
    fn kid(&self) -> String {
        bc_wire::signing::key_id(self.spki_der())
    }

    /// ES256 over `msg` (SHA-256, then ECDSA P-256), as P1363 `r‖s`.
    fn sign(&self, msg: &[u8]) -> Result<[u8; 64], KeyError>;

    /// The contents of `node.key`: what [`load`] needs to get this key back.
    /// For a file key that is the private key itself, hence `Zeroizing`.
    fn to_file_contents(&self) -> Result<Zeroizing<String>, KeyError>;
}

/// A new node key of `kind`, in memory only: nothing is written until the
/// join is accepted.
pub fn generate(kind: NodeKeyKind) -> Result<Box<dyn NodeKey>, KeyError> {
    match kind {
        NodeKeyKind::File => Ok(Box::new(FileKey::generate()?)),
        NodeKeyKind::Tpm => Err(KeyError::TpmUnsupported),
    }
}

/// Loads the node key of `kind` from its file (`node.key`).
pub fn load(kind: NodeKeyKind, path: &Path) -> Result<Box<dyn NodeKey>, KeyError> {
    match kind {
        NodeKeyKind::File => Ok(Box::new(FileKey::load(path)?)),
        NodeKeyKind::Tpm => Err(KeyError::TpmUnsupported),
    }
}
