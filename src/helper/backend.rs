//! The helper's TPM work, as [`bc_helper::Backend`]: node keys derived from
//! their unique and kept loaded, most recently used last, within the TPM's
//! three object slots per connection, so a TLS handshake's signature costs
//! one TPM2_Sign rather than a CreatePrimary as well. The AK is loaded only
//! to certify or describe, and flushed at once.
use std::path::PathBuf;

use bc_helper::{AkInfo, Backend, BackendError, CertifiedQuote, Hash};

use crate::tpm::{LoadedKey, Tpm, TpmError};

/// Transient objects a TPM holds for one connection (swtpm, the kernel's
/// resource manager): the AK needs one of them while it certifies.
const SLOTS: usize = 3;

/// How the helper opens its TPM: at start, and again when a connection
/// breaks (the owner authorization is read from its file each time).
pub(crate) struct Opener {
    pub tcti: String,
    pub owner_auth_file: Option<PathBuf>,
}

impl Opener {
    /// A new connection, with the owner authorization set and the keys a
    /// killed predecessor (or the broken connection) left flushed.
    pub(crate) fn open(&self) -> anyhow::Result<Tpm> {
        let mut tpm = Tpm::open(&self.tcti)?;
        if let Some(path) = &self.owner_auth_file {
            tpm.set_owner_auth(&crate::keys::read_owner_auth(path)?)?;
        }
        match tpm.flush_stale_transients() {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                flushed = n,
                "flushed keys a previous connection left in the TPM"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot list the TPM's transient objects"),
        }
        Ok(tpm)
    }
}

pub struct TpmBackend {
    opener: Opener,
    tpm: Tpm,
    /// Which TPM, in words (for `tpm.ak`, which `bcd doctor` shows).
    describe: String,
    /// Loaded node keys, least recently used first.
    keys: Vec<([u8; 32], LoadedKey)>,
}

impl TpmBackend {
    pub(crate) fn new(opener: Opener, tpm: Tpm, describe: String) -> TpmBackend {
        TpmBackend {
            opener,
            tpm,
            describe,
            keys: Vec::new(),
        }
    }

    /// Runs `op`; when the connection to the TPM broke (a TSS-layer code,
    /// [`TpmError::is_connection`]), drops it for a new one and runs `op`
    /// once more. Without this one lost response (a TPM that timed out, a
    /// restarted swtpm) would fail every later request until a restart.
    fn reconnecting<T>(
        &mut self,
        op: impl Fn(&mut Self) -> Result<T, TpmError>,
    ) -> Result<T, BackendError> {
        match op(self) {
            Err(e) if e.is_connection() => {
                tracing::warn!(error = %e, "the TPM connection failed; opening a new one");
                // The old connection's handles mean nothing on the new one.
                self.keys.clear();
                match self.opener.open() {
                    Ok(tpm) => self.tpm = tpm,
                    Err(open) => {
                        return Err(BackendError(format!(
                            "{e}; opening a new TPM connection failed too: {open:#}"
                        )))
                    }
                }
                tracing::info!(tcti = %self.opener.tcti, "opened a new TPM connection");
                op(self).map_err(fail)
            }
            r => r.map_err(fail),
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

    /// TPM2_Certify of the key `unique` by the AK over `qualifying`, then
    /// `then` with the AK still loaded; the AK flushed after.
    fn certified<T>(
        &mut self,
        unique: &[u8; 32],
        qualifying: &[u8],
        then: impl FnOnce(&mut Tpm, &LoadedKey, (Vec<u8>, Vec<u8>)) -> Result<T, TpmError>,
    ) -> Result<T, TpmError> {
        self.key(unique)?;
        let ak = self.load_ak()?;
        // make_room kept the key just used: it is the most recent.
        let result = match self.keys.last() {
            Some((u, key)) if u == unique => self.tpm.certify(key, &ak, qualifying),
            _ => Err(TpmError::Unexpected(
                "a node key cache without the key just loaded",
            )),
        }
        .and_then(|c| then(&mut self.tpm, &ak, c));
        self.flush(ak);
        result
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
        let public = self.reconnecting(|b| {
            let ak = b.load_ak()?;
            let public = ak.public.clone();
            b.flush(ak);
            Ok(public)
        })?;
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
        self.reconnecting(|b| {
            let i = b.key(unique)?;
            Ok(b.keys[i].1.public.clone())
        })
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
        self.reconnecting(|b| {
            let i = b.key(unique)?;
            b.tpm.sign_digest(&b.keys[i].1, digest)
        })
    }

    fn certify(
        &mut self,
        unique: &[u8; 32],
        qualifying: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), BackendError> {
        self.reconnecting(|b| b.certified(unique, qualifying, |_, _, c| Ok(c)))
    }
    /// The certification as [`Self::certify`]'s, then the quote with the
    /// same AK loaded, on the same connection (a renewal under a boot
    /// policy: one GetCapability for the populated banks, PCR_Reads, Quote).
    fn certify_quote(
        &mut self,
        unique: &[u8; 32],
        qualifying: &[u8],
        extra: &[u8],
        pcrs: &[u32],
    ) -> Result<CertifiedQuote, BackendError> {
        self.reconnecting(|b| {
            b.certified(unique, qualifying, |tpm, ak, (certify_info, signature)| {
                let banks = tpm.populated_banks(pcrs)?;
                let q = tpm.quote_in(ak, extra, pcrs, &banks)?;
                Ok(CertifiedQuote {
                    certify_info,
                    signature,
                    quote: q.attest,
                    quote_signature: q.signature,
                    pcr_values: q.pcr_values,
                })
            })
        })
    }

    /// Read as root, under `BCD_SYSFS_ROOT` in a test build.
    fn event_log(&mut self) -> Result<Vec<u8>, BackendError> {
        crate::evidence::eventlog::read().map_err(|e| BackendError(e.to_string()))
    }

    fn machine(&mut self) -> Result<bc_helper::proto::MachineResponse, BackendError> {
        let sys = crate::evidence::claims::sysfs_root();
        let (info, ek_sha256, pcr_banks) = self.reconnecting(|b| {
            b.make_room(1);
            let info = b.tpm.info()?;
            let ek = b.tpm.ek()?;
            let spki = crate::tpm::ek_spki_der(&ek);
            if let Err(e) = b.tpm.release_ek(&ek) {
                tracing::debug!(error = %e, "cannot flush the EK");
            }
            let banks = b.tpm.pcr_allocation()?;
            let banks = banks
                .0
                .iter()
                .filter(|(_, pcrs)| !pcrs.is_empty())
                .map(|(bank, _)| bank.name().to_owned())
                .collect::<Vec<_>>();
            Ok((info, spki.ok().map(|s| bc_wire::sha256(&s).to_vec()), banks))
        })?;
        Ok(bc_helper::proto::MachineResponse {
            product_uuid: crate::evidence::claims::product_uuid_from(&sys),
            product_serial: dmi_word(&sys.join("class/dmi/id/product_serial")),
            ek_sha256: ek_sha256.unwrap_or_default(),
            manufacturer: info.manufacturer.trim().to_owned(),
            vendor: info.vendor,
            firmware: info.firmware,
            pcr_banks,
        })
    }
}

/// A DMI attribute as one short printable word; empty when there is none.
fn dmi_word(path: &std::path::Path) -> String {
    use std::io::Read as _;
    let mut text = String::new();
    let read = std::fs::File::open(path).and_then(|f| f.take(4096).read_to_string(&mut text));
    match read {
        Ok(_) => text
            .trim()
            .chars()
            .filter(|c| !c.is_control())
            .take(256)
            .collect(),
        Err(_) => String::new(),
    }
}

impl Drop for TpmBackend {
    fn drop(&mut self) {
        self.make_room(SLOTS);
    }
}
