//! The node key: one signer abstraction for everything that signs.
//!
//! The CSR, the TLS handshake, renewal proofs and discovery assertions all
//! take a `&dyn NodeKey`, never a holder, so that where the private key lives
//! (a PKCS#8 file now; the TPM in issue 3; the root helper in issue 4) changes
//! nothing above this module. A holder only has to produce ES256 signatures
//! and its public half.
//!
//! Holders: `file.rs` (PKCS#8), `tpm.rs` (an owner-hierarchy primary) and
//! `helper.rs` (the same TPM key, through `bcd helper`). [`TpmAccess`] says
//! which TPM holder this process uses; `holder.rs` gives the TPM's steps
//! (make a key, load the AK, certify) the same way for both. `tls.rs` makes any holder a rustls
//! client identity for mTLS.
mod csr;
mod file;
mod helper;
mod holder;
pub(crate) mod tls;
mod tpm;

use std::path::Path;
use std::sync::{Arc, Mutex};

use p256::elliptic_curve::zeroize::Zeroizing;

pub use csr::make_csr;
pub use file::FileKey;
pub(crate) use helper::HelperKey;
pub(crate) use holder::{Holder, KeyHolder};
pub use tpm::{lock as lock_tpm, SharedTpm, TpmKey};

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

    pub(crate) fn from_name(s: &str) -> Option<Self> {
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
    /// Also without detail: the unique derives the key.
    #[error("the node key {path} is not a TPM node key (PEM \"BCD TPM NODE KEY\", 32 bytes)")]
    MalformedTpm { path: String },
    #[error("cannot encode the node key")]
    Encode,
    #[error("the node key's public half is not a P-256 SubjectPublicKeyInfo")]
    BadPublicKey,
    #[error("the node key failed to sign")]
    Sign,
    #[error("cannot build the CSR: {0}")]
    Csr(String),
    /// Never with the file's content.
    #[error("[tpm] owner_auth_file {path}: {reason}")]
    OwnerAuth { path: String, reason: String },
    #[error("this machine has no TPM for bcd (none configured: set [tpm] tcti, TPM2TOOLS_TCTI or TCTI, or provide /dev/tpmrm0; [tpm] tcti = \"none\" turns it off)")]
    NoTpm,
    #[error(transparent)]
    Tpm(#[from] crate::tpm::TpmError),
    #[error("the TPM connection is unusable after an earlier failure")]
    TpmBusy,
    #[error(transparent)]
    Helper(#[from] bc_helper::ClientError),
    #[error("under [helper] bcd node does not open the TPM: it goes through bcd helper")]
    UnderHelper,
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

    /// Frees what holds the key ready (a TPM's object slot) when another
    /// flow needs the room; the next use makes it ready again. Nothing to
    /// free for most keys.
    fn unload(&self) {}
}

/// Where this process reaches the TPM that holds node keys: the machine's
/// TPM, opened on first use and then shared (one connection for the node
/// key and the attestor), or, under `[helper]`, `bcd helper`'s socket, in
/// which case this process never opens the TPM.
pub enum TpmAccess {
    /// No TPM: none configured or found, or a test of file keys.
    Absent,
    /// The machine's TPM, opened by this process.
    Direct(DirectTpm),
    /// `bcd helper` at its socket.
    Helper(Arc<bc_helper::Client>),
}

/// The machine's TPM and what opening it needs.
pub struct DirectTpm {
    tcti: String,
    owner_auth_file: Option<std::path::PathBuf>,
    ek: Option<crate::tpm::EkKind>,
    /// `[tpm] ek_certificate`.
    ek_certificate: Option<std::path::PathBuf>,
    opened: Mutex<Option<SharedTpm>>,
}

impl TpmAccess {
    /// `configured` is the config's `[tpm] tcti`; see [`crate::tpm::resolve_tcti`].
    pub fn new(configured: Option<&str>) -> TpmAccess {
        match crate::tpm::resolve_tcti(configured) {
            Some(tcti) => TpmAccess::Direct(DirectTpm {
                tcti,
                owner_auth_file: None,
                ek: None,
                ek_certificate: None,
                opened: Mutex::new(None),
            }),
            None => TpmAccess::Absent,
        }
    }

    /// The TPM the config names, with its `[tpm] owner_auth_file` and `ek`.
    pub(crate) fn configured(config: &crate::config::Config) -> TpmAccess {
        let mut access = TpmAccess::new(config.tpm_tcti.as_deref())
            .with_owner_auth(config.tpm_owner_auth_file.clone());
        if let TpmAccess::Direct(direct) = &mut access {
            direct.ek = config.tpm_ek;
            direct.ek_certificate = config.tpm_ek_certificate.clone();
        }
        access
    }

    /// Node keys through `bcd helper` at `socket`: nothing here opens the TPM.
    pub fn through_helper(socket: &Path) -> TpmAccess {
        TpmAccess::Helper(Arc::new(bc_helper::Client::new(socket)))
    }

    /// What a node (`bcd node`, `bcd status`, `bcd doctor`) uses with this
    /// config: the helper under `[helper]`, else the TPM directly. `bcd join`
    /// opens the TPM itself whatever the config says.
    pub(crate) fn for_node(config: &crate::config::Config) -> TpmAccess {
        match &config.helper {
            Some(h) => TpmAccess::through_helper(&h.socket),
            None => TpmAccess::configured(config),
        }
    }

    /// The helper's client, under `[helper]`.
    pub(crate) fn helper(&self) -> Option<&Arc<bc_helper::Client>> {
        match self {
            TpmAccess::Helper(client) => Some(client),
            _ => None,
        }
    }

    /// With `[tpm] owner_auth_file`, the owner authorization node keys need
    /// on a TPM whose owner a previous OS took.
    pub(crate) fn with_owner_auth(mut self, file: Option<std::path::PathBuf>) -> TpmAccess {
        if let TpmAccess::Direct(direct) = &mut self {
            direct.owner_auth_file = file;
        }
        self
    }

    /// No TPM, whatever the machine has: for tests of file keys.
    pub fn none() -> TpmAccess {
        TpmAccess::Absent
    }

    /// Whether this machine has a TPM bcd would use (the helper's counts).
    pub(crate) fn present(&self) -> bool {
        !matches!(self, TpmAccess::Absent)
    }

    pub(crate) fn tcti(&self) -> Option<&str> {
        match self {
            TpmAccess::Direct(direct) => Some(&direct.tcti),
            _ => None,
        }
    }

    pub fn open(&self) -> Result<SharedTpm, KeyError> {
        let direct = match self {
            TpmAccess::Direct(direct) => direct,
            TpmAccess::Helper(_) => return Err(KeyError::UnderHelper),
            TpmAccess::Absent => return Err(KeyError::NoTpm),
        };
        let mut opened = direct.opened.lock().map_err(|_| KeyError::TpmBusy)?;
        if let Some(tpm) = opened.as_ref() {
            return Ok(tpm.clone());
        }
        let mut tpm = crate::tpm::Tpm::open(&direct.tcti)?;
        tpm.set_ek_kind(direct.ek);
        if let Some(path) = &direct.ek_certificate {
            tpm.set_ek_certificate(Some(crate::tpm::OperatorCertificate::read(path)?));
        }
        if let Some(path) = &direct.owner_auth_file {
            tpm.set_owner_auth(&read_owner_auth(path)?)?;
        }
        let tpm = Arc::new(Mutex::new(tpm));
        *opened = Some(tpm.clone());
        Ok(tpm)
    }
}

/// A new node key, in memory only: nothing is written until the join is
/// accepted. In the TPM when there is one; when the TPM cannot hold it, a
/// warning and a file key, unless `require_tpm` (a TPM-attested join), which
/// stops with the TPM's error instead.
///
/// Through the helper, a failure is an error, never a file key: a helper
/// that is restarting must not move the node key out of the TPM for good.
pub(crate) fn generate(tpm: &TpmAccess, require_tpm: bool) -> Result<Box<dyn NodeKey>, KeyError> {
    let made = match tpm {
        TpmAccess::Helper(helper) => return Ok(Box::new(HelperKey::generate(helper.clone())?)),
        TpmAccess::Absent if !require_tpm => return Ok(Box::new(FileKey::generate()?)),
        _ => tpm.open().and_then(TpmKey::generate),
    };
    match made {
        Ok(key) => Ok(Box::new(key)),
        Err(e) if !require_tpm => {
            tracing::warn!(error = %e, "the TPM cannot hold the node key; using a file key instead");
            Ok(Box::new(FileKey::generate()?))
        }
        Err(e) => Err(e),
    }
}

/// The text of a key file in the data directory: never through a link,
/// only bcd's own and private (see [`crate::identity::guard`]), at most
/// 64 KiB (a PKCS#8 P-256 PEM is under 300 bytes).
fn read_key_file(path: &Path) -> Result<Zeroizing<String>, KeyError> {
    let read_err = |source| KeyError::Read {
        path: path.display().to_string(),
        source,
    };
    let bytes =
        Zeroizing::new(crate::identity::guard::read_private(path, 64 * 1024).map_err(read_err)?);
    let text = std::str::from_utf8(&bytes).map_err(|_| {
        read_err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not UTF-8 text",
        ))
    })?;
    Ok(Zeroizing::new(text.to_owned()))
}

/// Loads the node key of `kind` from its file (`node.key`).
pub(crate) fn load(
    kind: NodeKeyKind,
    path: &Path,
    tpm: &TpmAccess,
) -> Result<Box<dyn NodeKey>, KeyError> {
    match kind {
        NodeKeyKind::File => Ok(Box::new(FileKey::load(path)?)),
        NodeKeyKind::Tpm => match tpm.holder()? {
            Holder::Helper(helper) => Ok(Box::new(HelperKey::load(helper, path)?)),
            Holder::Direct(shared) => Ok(Box::new(TpmKey::load(shared, path)?)),
        },
    }
}

/// The owner authorization in `path`: a file only its owner can read (mode
/// 0600 or stricter), its content without a final newline, 64 bytes at most.
pub(crate) fn read_owner_auth(path: &std::path::Path) -> Result<Vec<u8>, KeyError> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |reason: String| KeyError::OwnerAuth {
        path: path.display().to_string(),
        reason,
    };
    let (file, meta) = bc_wire::file::open_regular(path, bc_wire::file::Links::Follow)
        .map_err(|e| fail(e.to_string()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(fail(format!(
            "mode {mode:04o} lets others read it; chmod 600 it"
        )));
    }
    // 64 bytes and line ends; anything much longer is no owner password.
    let mut bytes =
        bc_wire::file::read_opened(file, &meta, 4096).map_err(|e| fail(e.to_string()))?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    if bytes.len() > 64 {
        return Err(fail("longer than 64 bytes (a TPM2B_AUTH)".into()));
    }
    Ok(bytes)
}
