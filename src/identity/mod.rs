//! The data directory: who this machine is to the control plane.
//!
//! Files (all 0600, in a 0700 directory):
//! - `identity.json`: node id, role, trust domain, key holder, attestor,
//!   join time and the certificate chain (PEM, leaf first);
//! - `node.key`: what the key holder needs to get the node key back;
//! - `node.key.next` and `identity.json.next`: the next key and identity
//!   while a renewal or re-join replaces them (see `rotation.rs`);
//! - `journal.db`: the node's local journal (`bcd node`).
//!
//! `identity.json` is written last, so its presence means a complete
//! identity: a crash during a join leaves either no identity (join again) or
//! one that loads. A crash during a rotation leaves the old identity or the
//! new one, and [`Identity::load`] completes an interrupted rotation.
pub(crate) mod atomic;
pub mod guard;
pub(crate) mod owner;
pub(crate) mod reset;
pub(crate) mod rotation;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bc_wire::agent::Role;
use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::keys::{self, KeyError, NodeKey, NodeKeyKind, TpmAccess};
use crate::pki::{self, CertError, NodeCert};

pub(crate) const IDENTITY_FILE: &str = "identity.json";
pub(crate) const NODE_KEY_FILE: &str = "node.key";
pub(crate) const NODE_KEY_NEXT_FILE: &str = "node.key.next";
pub(crate) const IDENTITY_NEXT_FILE: &str = "identity.json.next";
pub(crate) const JOURNAL_FILE: &str = "journal.db";

/// The version of `identity.json` this bcd writes and reads.
const VERSION: u32 = 1;

/// Far above what bcd writes (a chain of a few KB): a bigger file is not ours.
const MAX_IDENTITY_BYTES: u64 = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a bcd identity: {message}")]
    Malformed { path: PathBuf, message: String },
    #[error("{path} has version {found}; this bcd reads version {VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("the certificate in {path} is unusable: {source}")]
    Cert {
        path: PathBuf,
        #[source]
        source: CertError,
    },
    #[error("the node key does not match the node certificate ({key} holds key {key_kid}, the certificate certifies key {cert_kid})")]
    KeyMismatch {
        key: PathBuf,
        key_kid: String,
        cert_kid: String,
    },
    /// The spec's wording: a clear shows here, since the owner seed changed
    /// and the same unique now derives another key.
    #[error("the node key does not match the node certificate: the TPM derives another key from node.key (was the TPM cleared?); join again: bcd join --reset --yes, then bcd join")]
    TpmKeyMismatch,
    #[error("{path} names node {file} in {file_td}, but its certificate names {cert}")]
    IdMismatch {
        path: PathBuf,
        file: String,
        file_td: String,
        cert: String,
    },
    #[error("the data directory {path} is not usable: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A complete, consistent identity: the key certified by the leaf.
#[derive(Debug)]
pub struct Identity {
    pub node_id: String,
    pub role: Role,
    pub trust_domain: String,
    /// The attestor that admitted this identity (`join-token`, …).
    pub attestor: String,
    pub joined_at: OffsetDateTime,
    /// DER, leaf first.
    pub chain: Vec<Vec<u8>>,
    /// The parsed leaf.
    pub cert: NodeCert,
    /// Shared: the TLS handshake signs with it too.
    pub key: Arc<dyn NodeKey>,
}

/// `identity.json` as stored.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct IdentityFile {
    version: u32,
    node_id: String,
    role: String,
    trust_domain: String,
    node_key: String,
    attestor: String,
    joined_at: String,
    chain: Vec<String>,
}

/// An identity file (`identity.json` or `identity.json.next`) read and
/// checked, without its key.
pub(crate) struct Parsed {
    path: PathBuf,
    node_id: String,
    role: Role,
    trust_domain: String,
    kind: NodeKeyKind,
    attestor: String,
    joined_at: OffsetDateTime,
    chain: Vec<Vec<u8>>,
    cert: NodeCert,
}

impl Parsed {
    /// `Ok(None)` when there is no file at `path`.
    pub(crate) fn read(path: &Path) -> Result<Option<Parsed>, IdentityError> {
        let bytes = match guard::read_private(path, MAX_IDENTITY_BYTES) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(IdentityError::Read {
                    path: path.to_owned(),
                    source,
                })
            }
        };
        let malformed = |message: String| IdentityError::Malformed {
            path: path.to_owned(),
            message,
        };
        let text =
            std::str::from_utf8(&bytes).map_err(|_| malformed("not UTF-8 text".to_owned()))?;
        let file: IdentityFile =
            serde_json::from_str(text).map_err(|e| malformed(e.to_string()))?;
        if file.version != VERSION {
            return Err(IdentityError::Version {
                path: path.to_owned(),
                found: file.version,
            });
        }
        let role = Role::from_name(&file.role)
            .ok_or_else(|| malformed(format!("unknown role {:?}", file.role)))?;
        let kind = NodeKeyKind::from_name(&file.node_key).ok_or_else(|| {
            malformed(format!(
                "unknown nodeKey {:?} (expected file or tpm)",
                file.node_key
            ))
        })?;
        let joined_at = OffsetDateTime::parse(&file.joined_at, &Rfc3339).map_err(|_| {
            malformed(format!(
                "joinedAt {:?} is not an RFC 3339 time",
                file.joined_at
            ))
        })?;
        let cert_err = |source| IdentityError::Cert {
            path: path.to_owned(),
            source,
        };
        let chain = pki::chain_from_pem(&file.chain).map_err(cert_err)?;
        let cert = pki::check_chain(&chain).map_err(cert_err)?;
        if cert.id.node_id != file.node_id || cert.id.trust_domain != file.trust_domain {
            return Err(IdentityError::IdMismatch {
                path: path.to_owned(),
                file: file.node_id,
                file_td: file.trust_domain,
                cert: cert.id.to_string(),
            });
        }
        Ok(Some(Parsed {
            path: path.to_owned(),
            node_id: file.node_id,
            role,
            trust_domain: file.trust_domain,
            kind,
            attestor: file.attestor,
            joined_at,
            chain,
            cert,
        }))
    }

    /// The key in `key_path`, if it is the one the certificate certifies.
    pub(crate) fn load_key(
        &self,
        key_path: &Path,
        tpm: &TpmAccess,
    ) -> Result<Arc<dyn NodeKey>, IdentityError> {
        let key = keys::load(self.kind, key_path, tpm)?;
        if key.spki_der() != self.cert.spki.as_slice() {
            if self.kind == NodeKeyKind::Tpm {
                return Err(IdentityError::TpmKeyMismatch);
            }
            return Err(IdentityError::KeyMismatch {
                key: key_path.to_owned(),
                key_kid: key.kid(),
                cert_kid: bc_wire::signing::key_id(&self.cert.spki),
            });
        }
        Ok(Arc::from(key))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn into_identity(self, key: Arc<dyn NodeKey>) -> Identity {
        Identity {
            node_id: self.node_id,
            role: self.role,
            trust_domain: self.trust_domain,
            attestor: self.attestor,
            joined_at: self.joined_at,
            chain: self.chain,
            cert: self.cert,
            key,
        }
    }
}

impl Identity {
    /// Loads the identity in `data_dir`: `Ok(None)` when there is none
    /// (no `identity.json`), an error when there is one that does not hold
    /// together. A rotation that a crash interrupted is completed first
    /// (see [`rotation`]), so what loads is the old identity or the new one.
    pub fn load(data_dir: &Path, tpm: &TpmAccess) -> Result<Option<Identity>, IdentityError> {
        Identity::load_with(data_dir, tpm, true)
    }

    /// Like [`Identity::load`], but changes nothing in `data_dir`: for the
    /// commands that only look (`bcd status`, `bcd doctor`), which may run as
    /// another user than the node's and must not rename its files.
    pub fn inspect(data_dir: &Path, tpm: &TpmAccess) -> Result<Option<Identity>, IdentityError> {
        Identity::load_with(data_dir, tpm, false)
    }

    fn load_with(
        data_dir: &Path,
        tpm: &TpmAccess,
        repair: bool,
    ) -> Result<Option<Identity>, IdentityError> {
        match guard::check_dir(data_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(IdentityError::DataDir {
                    path: data_dir.to_owned(),
                    source,
                })
            }
        }
        if let Some(id) = rotation::recover(data_dir, tpm, repair) {
            return Ok(Some(id));
        }
        let Some(parsed) = Parsed::read(&data_dir.join(IDENTITY_FILE))? else {
            return Ok(None);
        };
        let key_path = data_dir.join(NODE_KEY_FILE);
        warn_if_loose(data_dir);
        warn_if_loose(&key_path);
        match parsed.load_key(&key_path, tpm) {
            Ok(key) => Ok(Some(parsed.into_identity(key))),
            // Between the two renames of a rotation that wrote the key last.
            Err(e) => match rotation::recover_key(data_dir, &parsed, tpm, repair) {
                Some(key) => Ok(Some(parsed.into_identity(key))),
                None => Err(e),
            },
        }
    }

    /// Writes this identity into `data_dir` (0700; files 0600) as a
    /// [`rotation`]: a join over an identity that did not load must not be
    /// able to crash into the old `identity.json` with the new `node.key`,
    /// a pair that loads as neither (and the token use is already spent).
    pub(crate) fn save(&self, data_dir: &Path) -> Result<(), IdentityError> {
        rotation::stage_key(data_dir, self.key.as_ref())?;
        rotation::stage_identity(data_dir, self)?;
        rotation::commit(data_dir, || {})
    }

    /// `identity.json` as this bcd writes it; `data_dir` only names the file
    /// in errors.
    fn to_json(&self, data_dir: &Path) -> Result<Vec<u8>, IdentityError> {
        let err = |e: String| IdentityError::Write {
            path: data_dir.join(IDENTITY_FILE),
            source: io::Error::other(e),
        };
        let joined_at = self
            .joined_at
            .format(&Rfc3339)
            .map_err(|e| err(e.to_string()))?;
        let file = IdentityFile {
            version: VERSION,
            node_id: self.node_id.clone(),
            role: self.role.name().to_owned(),
            trust_domain: self.trust_domain.clone(),
            node_key: self.key.kind().as_str().to_owned(),
            attestor: self.attestor.clone(),
            joined_at,
            chain: pki::chain_to_pem(&self.chain),
        };
        let mut json = serde_json::to_vec_pretty(&file).map_err(|e| err(e.to_string()))?;
        json.push(b'\n');
        Ok(json)
    }

    /// The chain as PEM, leaf first, in one string.
    pub(crate) fn chain_pem(&self) -> String {
        pki::chain_to_pem(&self.chain).concat()
    }
}

fn write(dir: &Path, name: &str, contents: &[u8]) -> Result<(), IdentityError> {
    atomic::write_atomic(dir, name, contents).map_err(|source| IdentityError::Write {
        path: dir.join(name),
        source,
    })
}

fn warn_if_loose(path: &Path) {
    if let Some(mode) = atomic::loose_bits(path) {
        tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "reachable by group or others; expected 0600 files in a 0700 directory");
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::keys::FileKey;
    use std::os::unix::fs::PermissionsExt;

    pub(crate) fn sample(key: FileKey) -> Identity {
        let chain = pki::tests::issue(key.spki_der(), &["spiffe://bc.test/node/node_abc"], 24);
        let cert = pki::check_chain(&chain).unwrap();
        Identity {
            node_id: "node_abc".into(),
            role: Role::Node,
            trust_domain: "bc.test".into(),
            attestor: "join-token".into(),
            joined_at: OffsetDateTime::from_unix_timestamp(1_790_000_000).unwrap(),
            chain,
            cert,
            key: Arc::new(key),
        }
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn save_then_load_round_trips() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("bcd");
        assert!(Identity::load(&dir, &TpmAccess::none()).unwrap().is_none());
        let id = sample(FileKey::generate().unwrap());
        id.save(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(NODE_KEY_FILE)), 0o600);
        assert_eq!(mode(&dir.join(IDENTITY_FILE)), 0o600);
        let back = Identity::load(&dir, &TpmAccess::none()).unwrap().unwrap();
        assert_eq!(back.node_id, "node_abc");
        assert_eq!(back.role, Role::Node);
        assert_eq!(back.joined_at, id.joined_at);
        assert_eq!(back.chain, id.chain);
        assert_eq!(back.key.spki_der(), id.key.spki_der());
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(IDENTITY_FILE)).unwrap())
                .unwrap();
        assert_eq!(json["version"], 1);
        assert_eq!(json["nodeKey"], "file");
        assert_eq!(json["trustDomain"], "bc.test");
        assert_eq!(json["joinedAt"], "2026-09-21T14:13:20Z");
        assert!(json["chain"][0]
            .as_str()
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE-----"));
    }

    #[test]
    fn a_save_interrupted_over_a_broken_identity_loads_the_new_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join(IDENTITY_FILE), "{").unwrap();
        let id = sample(FileKey::generate().unwrap());
        // What `save` leaves when it stops before its renames.
        rotation::stage_key(dir, id.key.as_ref()).unwrap();
        rotation::stage_identity(dir, &id).unwrap();
        let back = Identity::load(dir, &TpmAccess::none()).unwrap().unwrap();
        assert_eq!(back.key.spki_der(), id.key.spki_der());
        id.save(dir).unwrap();
        assert!(!dir.join(IDENTITY_NEXT_FILE).exists());
        assert!(!dir.join(NODE_KEY_NEXT_FILE).exists());
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        sample(FileKey::generate().unwrap())
            .save(tmp.path())
            .unwrap();
        let other = FileKey::generate().unwrap();
        std::fs::write(
            tmp.path().join(NODE_KEY_FILE),
            other.to_file_contents().unwrap().as_bytes(),
        )
        .unwrap();
        let e = Identity::load(tmp.path(), &TpmAccess::none())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("the node key does not match the node certificate"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_key_or_broken_json_is_an_error_not_absence() {
        let tmp = tempfile::tempdir().unwrap();
        sample(FileKey::generate().unwrap())
            .save(tmp.path())
            .unwrap();
        std::fs::remove_file(tmp.path().join(NODE_KEY_FILE)).unwrap();
        assert!(matches!(
            Identity::load(tmp.path(), &TpmAccess::none()),
            Err(IdentityError::Key(KeyError::Read { .. }))
        ));
        std::fs::write(tmp.path().join(IDENTITY_FILE), "{").unwrap();
        assert!(matches!(
            Identity::load(tmp.path(), &TpmAccess::none()),
            Err(IdentityError::Malformed { .. })
        ));
    }
}
