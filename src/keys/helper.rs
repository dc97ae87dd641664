//! A node key in the TPM reached through `bcd helper`: the same key and the
//! same `node.key` record as [`super::TpmKey`], derived and used by the root
//! helper on behalf of this unprivileged process, which never opens the
//! TPM. The client ([`bc_helper::Client`]) verifies every signature against
//! the public half it got at derivation, so a helper that signs with
//! another key is caught before the signature is used.
use std::path::Path;
use std::sync::Arc;

use bc_helper::{Client, HelperKeyPublic};
use p256::elliptic_curve::zeroize::Zeroizing;

use super::{KeyError, NodeKey, NodeKeyKind};

pub(crate) struct HelperKey {
    client: Arc<Client>,
    public: HelperKeyPublic,
}

impl std::fmt::Debug for HelperKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HelperKey")
            .field("kid", &self.kid())
            .finish_non_exhaustive()
    }
}

impl HelperKey {
    /// A new key: a fresh unique, derived by the helper.
    pub(crate) fn generate(client: Arc<Client>) -> Result<HelperKey, KeyError> {
        let mut unique = Zeroizing::new([0u8; 32]);
        getrandom::fill(unique.as_mut()).map_err(|_| KeyError::Random)?;
        HelperKey::derive(client, &unique)
    }

    /// The key `node.key` names, derived again by the helper.
    pub(crate) fn load(client: Arc<Client>, path: &Path) -> Result<HelperKey, KeyError> {
        let unique = super::tpm::read_unique(path)?;
        HelperKey::derive(client, &unique)
    }

    fn derive(client: Arc<Client>, unique: &[u8; 32]) -> Result<HelperKey, KeyError> {
        let public = client.node_key(unique)?;
        Ok(HelperKey { client, public })
    }

    /// The key's TPMT_PUBLIC, as a certification names it.
    pub(crate) fn public(&self) -> &[u8] {
        &self.public.public
    }

    /// TPM2_Certify of this key by `ak` over `qualifying`, through the
    /// helper, checked to be `ak`'s certification of this very key.
    pub(crate) fn certify_by(
        &self,
        ak: &bc_helper::Ak,
        qualifying: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), KeyError> {
        Ok(self.client.certify(ak, &self.public, qualifying)?)
    }

    /// [`Self::certify_by`], and the AK's quote over `extra` of `pcrs` in
    /// every populated bank, in one helper call (one TPM connection).
    pub(crate) fn certify_quote_by(
        &self,
        ak: &bc_helper::Ak,
        qualifying: &[u8],
        extra: &[u8],
        pcrs: &[u32],
    ) -> Result<bc_helper::CertifiedQuote, KeyError> {
        Ok(self
            .client
            .certify_quote(ak, &self.public, qualifying, extra, pcrs)?)
    }
}

impl NodeKey for HelperKey {
    fn kind(&self) -> NodeKeyKind {
        NodeKeyKind::Tpm
    }

    fn spki_der(&self) -> &[u8] {
        &self.public.spki
    }

    fn sign(&self, msg: &[u8]) -> Result<[u8; 64], KeyError> {
        Ok(self.client.sign(&self.public, msg)?)
    }

    fn to_file_contents(&self) -> Result<Zeroizing<String>, KeyError> {
        Ok(super::tpm::unique_pem(&self.public.unique))
    }
}
