//! The helper's TPM work, as [`bc_helper::Backend`]: node keys derived from
//! their unique and kept loaded, most recently used last, within the TPM's
//! three object slots per connection, so a TLS handshake's signature costs
//! one TPM2_Sign rather than a CreatePrimary as well. The AK is loaded only
//! to certify or describe, and flushed at once.
use bc_helper::server::AkInfo;
use bc_helper::{Backend, BackendError, Hash};

use crate::tpm::{LoadedKey, Tpm, TpmError};

/// Transient objects a TPM holds for one connection (swtpm, the kernel's
/// resource manager): the AK needs one of them while it certifies.
const SLOTS: usize = 3;

pub struct TpmBackend {
    tpm: Tpm,
    /// Which TPM, in words (for `tpm.ak`, which `bcd doctor` shows).
    describe: String,
    /// Loaded node keys, least recently used first.
    keys: Vec<([u8; 32], LoadedKey)>,
}

impl TpmBackend {
    pub fn new(tpm: Tpm, describe: String) -> TpmBackend {
        TpmBackend {
            tpm,
            describe,
            keys: Vec::new(),
        }
    }

    /// The index of the key `unique` derives, loaded and now the most
    /// recently used. A TPM out of object memory (another user of a TPM
    /// without a resource manager) gets this cache flushed and one retry.
    fn key(&mut self, unique: &[u8; 32]) -> Result<usize, TpmError> {
        if let Some(i) = self.keys.iter().position(|(u, _)| u == unique) {
            let entry = self.keys.remove(i);
            self.keys.push(entry);
            return Ok(self.keys.len() - 1);
        }
        self.make_room(1);
        let key = match self.tpm.node_key(unique) {
            Ok(k) => k,
            Err(e) if !self.keys.is_empty() => {
                tracing::debug!(error = %e, "deriving a node key failed; retrying with no key cached");
                self.make_room(SLOTS);
                self.tpm.node_key(unique)?
            }
            Err(e) => return Err(e),
        };
        self.keys.push((*unique, key));
        Ok(self.keys.len() - 1)
    }

    /// Flushes least recently used keys until `free` slots are free.
    fn make_room(&mut self, free: usize) {
        while !self.keys.is_empty() && self.keys.len() + free > SLOTS {
            let (_, key) = self.keys.remove(0);
            if let Err(e) = self.tpm.flush(key) {
                tracing::warn!(error = %e, "cannot flush a node key from the TPM");
            }
        }
    }

    /// The AK, loaded after making room for it; the caller flushes it.
    fn load_ak(&mut self) -> Result<LoadedKey, TpmError> {
        self.make_room(1);
        self.tpm.ak()
    }

    fn flush(&mut self, key: LoadedKey) {
        if let Err(e) = self.tpm.flush(key) {
            tracing::warn!(error = %e, "cannot flush the AK from the TPM");
        }
    }
}

fn fail(e: TpmError) -> BackendError {
    BackendError(e.to_string())
}

impl Backend for TpmBackend {
    fn ak(&mut self) -> Result<AkInfo, BackendError> {
        let ak = self.load_ak().map_err(fail)?;
        let public = ak.public.clone();
        self.flush(ak);
        let name = bc_wire::tpm::Public::parse(&public)
            .map_err(|_| BackendError("the TPM's AK public area does not parse".into()))?
            .name();
        Ok(AkInfo {
            public,
            name,
            tpm: self.describe.clone(),
        })
    }

    fn node_key(&mut self, unique: &[u8; 32]) -> Result<Vec<u8>, BackendError> {
        let i = self.key(unique).map_err(fail)?;
        Ok(self.keys[i].1.public.clone())
    }

    fn sign(
        &mut self,
        unique: &[u8; 32],
        hash: Hash,
        digest: &[u8],
    ) -> Result<[u8; 64], BackendError> {
        // The TPM signs with the hash the digest's length names: the
        // protocol already checked that it is `hash`'s.
        debug_assert_eq!(digest.len(), hash.digest_len());
        let i = self.key(unique).map_err(fail)?;
        self.tpm.sign_digest(&self.keys[i].1, digest).map_err(fail)
    }

    fn certify(
        &mut self,
        unique: &[u8; 32],
        qualifying: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), BackendError> {
        self.key(unique).map_err(fail)?;
        let ak = self.load_ak().map_err(fail)?;
        // make_room kept the key just used: it is the most recent.
        let result = match self.keys.last() {
            Some((u, key)) if u == unique => self.tpm.certify(key, &ak, qualifying).map_err(fail),
            _ => Err(BackendError("the node key left the TPM".into())),
        };
        self.flush(ak);
        result
    }
}

impl Drop for TpmBackend {
    fn drop(&mut self) {
        self.make_room(SLOTS);
    }
}
