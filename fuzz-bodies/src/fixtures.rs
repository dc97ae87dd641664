//! Pinned test keys and the real TPM output the targets are built around
//! (bc-test-support's `captured`, which the tests share): fixed, so a
//! corpus file means the same thing in every run.

use std::path::Path;
use std::sync::OnceLock;

use p256::ecdsa::SigningKey;
use p256::pkcs8::EncodePublicKey;

pub(crate) const TRUST_DOMAIN: &str = "bc.test";
pub(crate) const NODE_ID: &str = "node_fuzz";
/// The audience the GCP token and the Azure nonce are checked against.
pub(crate) const AUDIENCE: &str = "https://cp.bc.test:8443";

pub(crate) use bc_test_support::captured::{
    captured_at, CHALLENGE_KEY, EK_INTERMEDIATE_PEM, EK_ROOT_PEM, TPM_ANSWER, TPM_CSR, TPM_HELLO,
};

fn key(byte: u8) -> SigningKey {
    // A constant non-zero scalar below the group order: always a key.
    SigningKey::from_slice(&[byte; 32]).expect("a fixed valid P-256 scalar")
}

/// The JoinService signing key the agent pins. Made once: deriving a
/// public key costs a scalar multiplication, which would slow every run.
pub(crate) fn service_key() -> &'static SigningKey {
    static KEY: OnceLock<SigningKey> = OnceLock::new();
    KEY.get_or_init(|| key(5))
}

/// The node key of the agent-side targets.
pub(crate) fn node_key() -> &'static SigningKey {
    static KEY: OnceLock<SigningKey> = OnceLock::new();
    KEY.get_or_init(|| key(7))
}

/// The node key's SubjectPublicKeyInfo (DER).
pub(crate) fn node_spki() -> &'static [u8] {
    static SPKI: OnceLock<Vec<u8>> = OnceLock::new();
    SPKI.get_or_init(|| spki_der(node_key()))
}

/// The JoinService encryption (token sealing) key, as the control plane stores it.
pub(crate) fn opening_key_pkcs8() -> Vec<u8> {
    use p256::pkcs8::EncodePrivateKey;
    p256::SecretKey::from_slice(&[9u8; 32])
        .and_then(|k| k.to_pkcs8_der().map_err(|_| p256::elliptic_curve::Error))
        .map(|d| d.as_bytes().to_vec())
        .unwrap_or_default()
}

pub(crate) fn spki_der(key: &SigningKey) -> Vec<u8> {
    key.verifying_key()
        .to_public_key_der()
        .map(|d| d.as_bytes().to_vec())
        .unwrap_or_default()
}

/// What the agent-side targets bind answers to: sha256 of this "CSR".
pub(crate) const AGENT_CSR: &[u8] = b"the csr";

/// A temporary directory, in memory when the machine has /dev/shm: the
/// targets write a file or a database row per input.
pub(crate) fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new().prefix("bc-fuzz").tempdir_in(shm) {
            return Ok(dir);
        }
    }
    tempfile::Builder::new().prefix("bc-fuzz").tempdir()
}
