//! A node key held by the TPM: an owner-hierarchy primary derived again at
//! every load from a 32-byte unique. `node.key` holds only that unique (PEM
//! `BCD TPM NODE KEY`), so nothing is stored in or evicted to the TPM, and the
//! key never exists outside it. Anyone with the owner hierarchy's
//! authorization on this TPM (root) can derive it too: non-exportable, not
//! root-proof.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use p256::elliptic_curve::zeroize::Zeroizing;

use super::{KeyError, NodeKey, NodeKeyKind};
use crate::tpm::{LoadedKey, Tpm};

/// One TPM connection, shared by the node key and the attestor's evidence.
pub type SharedTpm = Arc<Mutex<Tpm>>;

const PEM_LABEL: &str = "BCD TPM NODE KEY";

pub struct TpmKey {
    tpm: SharedTpm,
    /// The TPM object while it is loaded; derived again from `unique` when
    /// a command needs it after [`TpmKey::unload`].
    loaded: Mutex<Option<LoadedKey>>,
    /// Its TPMT_PUBLIC: the same at every derivation.
    public: Vec<u8>,
    unique: Zeroizing<[u8; 32]>,
    spki: Vec<u8>,
}

impl std::fmt::Debug for TpmKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmKey")
            .field("kid", &self.kid())
            .finish_non_exhaustive()
    }
}

impl TpmKey {
    /// A new key: a fresh unique, derived in the TPM.
    pub fn generate(tpm: SharedTpm) -> Result<TpmKey, KeyError> {
        let mut unique = Zeroizing::new([0u8; 32]);
        getrandom::fill(unique.as_mut()).map_err(|_| KeyError::Random)?;
        TpmKey::derive(tpm, unique)
    }

    /// The key `node.key` names, derived again.
    pub(crate) fn load(tpm: SharedTpm, path: &Path) -> Result<TpmKey, KeyError> {
        TpmKey::derive(tpm, read_unique(path)?)
    }

    fn derive(tpm: SharedTpm, unique: Zeroizing<[u8; 32]>) -> Result<TpmKey, KeyError> {
        let key = lock(&tpm)?.node_key(&unique).map_err(KeyError::Tpm)?;
        let Ok(spki) = bc_wire::tpm::Public::parse(&key.public).and_then(|p| p.p256_spki_der())
        else {
            // Not left to hold one of the connection's three object slots.
            if let Ok(mut t) = tpm.lock() {
                let _ = t.release(&key);
            }
            return Err(KeyError::BadPublicKey);
        };
        Ok(TpmKey {
            tpm,
            public: key.public.clone(),
            loaded: Mutex::new(Some(key)),
            unique,
            spki,
        })
    }

    /// The key's TPMT_PUBLIC, as a certification names it.
    pub(crate) fn public(&self) -> &[u8] {
        &self.public
    }

    /// TPM2_Certify of this key by `ak` over `qualifying` (sha256 of the
    /// CSR, or a join's round-2 nonce): the TPMS_ATTEST and TPMT_SIGNATURE.
    pub fn certify_by(
        &self,
        ak: &LoadedKey,
        qualifying: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), KeyError> {
        self.with_loaded(|tpm, key| tpm.certify(key, ak, qualifying))
    }

    /// Flushes the key from the TPM now, when no command needs it for a
    /// while: the kernel's resource manager gives a connection three object
    /// slots and swaps every loaded object around each command. A later use
    /// derives it again.
    pub(crate) fn unload(&self) {
        let Ok(mut slot) = self.loaded.lock() else {
            return;
        };
        if let (Some(key), Ok(mut tpm)) = (slot.take(), self.tpm.lock()) {
            if let Err(e) = tpm.release(&key) {
                tracing::debug!(error = %e, "cannot flush the node key from the TPM");
            }
        }
    }

    /// Runs one TPM command with the key loaded (derived again first when
    /// it was unloaded, and checked to be the same key).
    fn with_loaded<T>(
        &self,
        command: impl FnOnce(&mut Tpm, &LoadedKey) -> Result<T, crate::tpm::TpmError>,
    ) -> Result<T, KeyError> {
        let mut slot = self.loaded.lock().map_err(|_| KeyError::TpmBusy)?;
        let mut tpm = lock(&self.tpm)?;
        let key = match slot.take() {
            Some(key) => key,
            None => {
                let key = tpm.node_key(&self.unique).map_err(KeyError::Tpm)?;
                if key.public != self.public {
                    // The owner seed changed (TPM2_Clear) since it was made.
                    let _ = tpm.release(&key);
                    return Err(KeyError::BadPublicKey);
                }
                key
            }
        };
        let result = command(&mut tpm, &key);
        *slot = Some(key);
        result.map_err(KeyError::Tpm)
    }
}

impl NodeKey for TpmKey {
    fn kind(&self) -> NodeKeyKind {
        NodeKeyKind::Tpm
    }

    fn spki_der(&self) -> &[u8] {
        &self.spki
    }

    fn sign(&self, msg: &[u8]) -> Result<[u8; 64], KeyError> {
        let digest = bc_wire::sha256(msg);
        self.with_loaded(|tpm, key| tpm.sign_digest(key, &digest))
    }

    fn to_file_contents(&self) -> Result<Zeroizing<String>, KeyError> {
        Ok(unique_pem(&self.unique))
    }

    fn unload(&self) {
        TpmKey::unload(self);
    }
}

/// The unique a `node.key` record holds (wherever the TPM is reached from).
pub(super) fn read_unique(path: &Path) -> Result<Zeroizing<[u8; 32]>, KeyError> {
    let text = super::read_key_file(path)?;
    let malformed = || KeyError::MalformedTpm {
        path: path.display().to_string(),
    };
    let block = pem::parse(text.as_bytes()).map_err(|_| malformed())?;
    if block.tag() != PEM_LABEL {
        return Err(malformed());
    }
    let unique: [u8; 32] = block.contents().try_into().map_err(|_| malformed())?;
    Ok(Zeroizing::new(unique))
}

/// The `node.key` record of a TPM key: its unique as PEM `BCD TPM NODE KEY`.
pub(super) fn unique_pem(unique: &[u8; 32]) -> Zeroizing<String> {
    let block = pem::Pem::new(PEM_LABEL, unique.to_vec());
    Zeroizing::new(pem::encode(&block))
}

/// Three transient objects is all a TPM may hold for one connection: a key
/// that is no longer used leaves it now, not when the connection closes.
impl Drop for TpmKey {
    fn drop(&mut self) {
        self.unload();
    }
}

/// The TPM's AK, loaded alone (no EK) for certifying a node key, and
/// flushed when dropped.
pub(crate) struct TpmAk {
    tpm: SharedTpm,
    key: LoadedKey,
    name: Vec<u8>,
}

impl TpmAk {
    /// Derives the AK (a primary of the endorsement hierarchy: the same key
    /// for as long as the endorsement seed lives).
    pub(crate) fn load(tpm: SharedTpm) -> Result<TpmAk, KeyError> {
        let key = lock(&tpm)?.ak().map_err(KeyError::Tpm)?;
        let name = match bc_wire::tpm::Public::parse(&key.public) {
            Ok(p) => p.name(),
            Err(_) => {
                if let Ok(mut t) = tpm.lock() {
                    let _ = t.release(&key);
                }
                return Err(KeyError::BadPublicKey);
            }
        };
        Ok(TpmAk { tpm, key, name })
    }

    /// The AK's TPMT_PUBLIC.
    pub(crate) fn public(&self) -> &[u8] {
        &self.key.public
    }

    /// The AK's TPM name (nameAlg ‖ digest of its public area).
    pub(crate) fn name(&self) -> &[u8] {
        &self.name
    }

    /// A quote by this AK over `extra` of `pcrs` in every bank this TPM has
    /// populated with them, on the AK's connection (a renewal under a boot
    /// policy takes it right after [`Self::certify`]).
    pub(crate) fn quote_boot(
        &self,
        extra: &[u8],
        pcrs: &[u32],
    ) -> Result<crate::tpm::Quote, KeyError> {
        let mut tpm = lock(&self.tpm)?;
        let banks = tpm.populated_banks(pcrs)?;
        Ok(tpm.quote_in(&self.key, extra, pcrs, &banks)?)
    }

    /// TPM2_Certify of `key` by this AK over `qualifying` (sha256 of the CSR).
    pub(crate) fn certify(
        &self,
        key: &TpmKey,
        qualifying: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), KeyError> {
        key.certify_by(&self.key, qualifying)
    }
}

impl Drop for TpmAk {
    fn drop(&mut self) {
        if let Ok(mut tpm) = self.tpm.lock() {
            if let Err(e) = tpm.release(&self.key) {
                tracing::debug!(error = %e, "cannot flush the AK from the TPM");
            }
        }
    }
}

/// A poisoned lock means a panic elsewhere; refuse rather than propagate it.
pub fn lock(tpm: &SharedTpm) -> Result<MutexGuard<'_, Tpm>, KeyError> {
    tpm.lock().map_err(|_| KeyError::TpmBusy)
}
