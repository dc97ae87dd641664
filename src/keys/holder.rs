//! The TPM that holds node keys, as this process reaches it: opened here
//! ([`SharedTpm`]) or through `bcd helper` ([`bc_helper::Client`]). The
//! steps a flow needs of it (make a key, load the AK, certify a key by the
//! AK; a key signs as any [`NodeKey`]) are the same either way, so a flow
//! is written once over [`KeyHolder`] and [`TpmAccess::holder`] picks which.
use std::path::Path;
use std::sync::Arc;

use super::helper::HelperKey;
use super::tpm::{SharedTpm, TpmAk, TpmKey};
use super::{KeyError, NodeKey, TpmAccess};

/// Which holder this process uses.
pub(crate) enum Holder {
    /// The machine's TPM, opened by this process.
    Direct(SharedTpm),
    /// `bcd helper`, which holds the TPM for this unprivileged process.
    Helper(Arc<bc_helper::Client>),
}

impl TpmAccess {
    /// The helper under `[helper]`, else the TPM, opened (once).
    pub(crate) fn holder(&self) -> Result<Holder, KeyError> {
        match self {
            TpmAccess::Helper(client) => Ok(Holder::Helper(client.clone())),
            _ => self.open().map(Holder::Direct),
        }
    }
}

/// What a TPM key holder does for a flow.
pub(crate) trait KeyHolder {
    type Key: NodeKey + 'static;
    type Ak;
    /// Who holds the keys, as errors name it ("the TPM", "bcd helper").
    fn who(&self) -> &'static str;
    /// A new node key (a fresh unique).
    fn make_key(&self) -> Result<Self::Key, KeyError>;
    /// The TPM's AK.
    fn load_ak(&self) -> Result<Self::Ak, KeyError>;
    /// The AK's TPM name and TPMT_PUBLIC.
    fn ak_name(ak: &Self::Ak) -> &[u8];
    fn ak_public(ak: &Self::Ak) -> &[u8];
    /// The key's TPMT_PUBLIC, as a certification names it.
    fn key_public(key: &Self::Key) -> &[u8];
    /// TPM2_Certify of `key` by `ak` over `qualifying`: (certifyInfo, signature).
    fn certify(
        &self,
        ak: &Self::Ak,
        key: &Self::Key,
        qualifying: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), KeyError>;
    /// A key staged in `path` (`node.key.next`), derived again.
    fn load_key(&self, path: &Path) -> Result<Self::Key, KeyError>;
    /// [`Self::certify`], then the AK's quote over `extra` of `pcrs` in
    /// every bank the TPM has populated with them, in the same TPM
    /// connection (a renewal under a pool's boot policy).
    fn certify_quote(
        &self,
        ak: &Self::Ak,
        key: &Self::Key,
        qualifying: &[u8],
        extra: &[u8],
        pcrs: &[u32],
    ) -> Result<bc_helper::CertifiedQuote, KeyError>;
    /// The TCG event log, as root reads it (the helper, under `[helper]`).
    fn event_log(&self) -> anyhow::Result<Vec<u8>>;
}

impl KeyHolder for SharedTpm {
    type Key = TpmKey;
    type Ak = TpmAk;
    fn who(&self) -> &'static str {
        "the TPM"
    }
    fn make_key(&self) -> Result<TpmKey, KeyError> {
        TpmKey::generate(self.clone())
    }
    fn load_ak(&self) -> Result<TpmAk, KeyError> {
        TpmAk::load(self.clone())
    }
    fn ak_name(ak: &TpmAk) -> &[u8] {
        ak.name()
    }
    fn ak_public(ak: &TpmAk) -> &[u8] {
        ak.public()
    }
    fn key_public(key: &TpmKey) -> &[u8] {
        key.public()
    }
    fn certify(
        &self,
        ak: &TpmAk,
        key: &TpmKey,
        qualifying: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), KeyError> {
        ak.certify(key, qualifying)
    }
    fn load_key(&self, path: &Path) -> Result<TpmKey, KeyError> {
        TpmKey::load(self.clone(), path)
    }
    fn certify_quote(
        &self,
        ak: &TpmAk,
        key: &TpmKey,
        qualifying: &[u8],
        extra: &[u8],
        pcrs: &[u32],
    ) -> Result<bc_helper::CertifiedQuote, KeyError> {
        let (certify_info, signature) = ak.certify(key, qualifying)?;
        let quote = ak.quote_boot(extra, pcrs)?;
        Ok(bc_helper::CertifiedQuote {
            certify_info,
            signature,
            quote: quote.attest,
            quote_signature: quote.signature,
            pcr_values: quote.pcr_values,
        })
    }
    fn event_log(&self) -> anyhow::Result<Vec<u8>> {
        Ok(crate::evidence::eventlog::read()?)
    }
}

/// Through the helper: the client checked the AK's name against its public
/// area, the key's signatures against its public half, and that a
/// certification is the announced AK's, of this key, over `qualifying`.
impl KeyHolder for Arc<bc_helper::Client> {
    type Key = HelperKey;
    type Ak = bc_helper::Ak;
    fn who(&self) -> &'static str {
        "bcd helper"
    }
    fn make_key(&self) -> Result<HelperKey, KeyError> {
        HelperKey::generate(self.clone())
    }
    fn load_ak(&self) -> Result<bc_helper::Ak, KeyError> {
        Ok(self.ak()?)
    }
    fn ak_name(ak: &bc_helper::Ak) -> &[u8] {
        &ak.name
    }
    fn ak_public(ak: &bc_helper::Ak) -> &[u8] {
        &ak.public
    }
    fn key_public(key: &HelperKey) -> &[u8] {
        key.public()
    }
    fn certify(
        &self,
        ak: &bc_helper::Ak,
        key: &HelperKey,
        qualifying: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), KeyError> {
        key.certify_by(ak, qualifying)
    }
    fn load_key(&self, path: &Path) -> Result<HelperKey, KeyError> {
        HelperKey::load(self.clone(), path)
    }
    fn certify_quote(
        &self,
        ak: &bc_helper::Ak,
        key: &HelperKey,
        qualifying: &[u8],
        extra: &[u8],
        pcrs: &[u32],
    ) -> Result<bc_helper::CertifiedQuote, KeyError> {
        key.certify_quote_by(ak, qualifying, extra, pcrs)
    }
    fn event_log(&self) -> anyhow::Result<Vec<u8>> {
        Ok(bc_helper::Client::event_log(self)?)
    }
}
