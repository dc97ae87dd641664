//! The site node's identity as `bcd node` keeps it. `bcd node` renews the
//! certificate and rotates the node key beside `bcd site`; a site that kept
//! what it loaded at start would sign assertions with a retired key (refused
//! `assertion-signature`) and call the control plane with a certificate that
//! runs out within a day. So every use first compares `identity.json`'s
//! metadata (one `lstat`) and re-reads the identity when it changed.

use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Context as _};
use bc_wire::agent::Role;

use crate::client::Client;
use crate::config::Config;
use crate::identity::{Identity, IDENTITY_FILE};
use crate::keys::{NodeKey, TpmAccess};

/// What signs and calls for the site: one generation of the node's identity.
pub(crate) struct Signer {
    pub node_id: String,
    pub key: Arc<dyn NodeKey>,
    pub client: Arc<Client>,
}

/// `identity.json` as last read: replaced atomically by `bcd node`, so a new
/// inode (or size, or time) means a new identity.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Stamp {
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

pub(crate) struct NodeIdentity {
    config: Arc<Config>,
    tpm: TpmAccess,
    file: PathBuf,
    current: Mutex<Current>,
}

struct Current {
    stamp: Stamp,
    signer: Arc<Signer>,
    /// A file that did not load: not read again until it changes, so that
    /// boot requests cannot make the TPM derive a key on every call.
    failed: Option<Stamp>,
}

impl NodeIdentity {
    /// Loads the identity; refuses a node that is not a site node.
    pub(crate) fn load(config: Arc<Config>) -> anyhow::Result<NodeIdentity> {
        let tpm = TpmAccess::for_node(&config);
        let file = config.data_dir.join(IDENTITY_FILE);
        let stamp = stamp(&file).ok_or_else(|| not_joined(&config))?;
        let identity = match Identity::load(&config.data_dir, &tpm) {
            Ok(Some(id)) => id,
            Ok(None) => return Err(not_joined(&config)),
            Err(e) => return Err(anyhow::Error::new(e).context("the identity does not load")),
        };
        let signer = signer(&config, identity)?;
        Ok(NodeIdentity {
            config,
            tpm,
            file,
            current: Mutex::new(Current {
                stamp,
                signer: Arc::new(signer),
                failed: None,
            }),
        })
    }

    /// The identity to use now: re-read first when `bcd node` replaced it. A
    /// file that does not load (mid-rotation, damaged) keeps the previous
    /// one, logged; `bcd node` owns repairs, so this only looks.
    pub(crate) async fn current(self: &Arc<Self>) -> Arc<Signer> {
        let (seen, failed, signer) = {
            let c = self.current.lock().unwrap_or_else(|p| p.into_inner());
            (c.stamp, c.failed, c.signer.clone())
        };
        let Some(now) = stamp(&self.file) else {
            return signer;
        };
        if now == seen || Some(now) == failed {
            return signer;
        }
        let this = self.clone();
        let reloaded = tokio::task::spawn_blocking(move || this.reload())
            .await
            .map_err(|e| anyhow!("the reload task failed: {e}"))
            .and_then(|r| r);
        let mut c = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if c.stamp != seen {
            // Another caller reloaded meanwhile: its result is as new.
            return c.signer.clone();
        }
        match reloaded {
            Ok(fresh) => {
                tracing::info!(node_id = %fresh.node_id, "identity reloaded: bcd node renewed it");
                c.stamp = now;
                c.signer = Arc::new(fresh);
                c.failed = None;
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "identity.json changed but does not load; keeping the previous identity");
                c.failed = Some(now);
            }
        }
        c.signer.clone()
    }

    fn reload(&self) -> anyhow::Result<Signer> {
        let identity = Identity::inspect(&self.config.data_dir, &self.tpm)
            .context("the identity does not load")?
            .ok_or_else(|| not_joined(&self.config))?;
        signer(&self.config, identity)
    }
}

fn signer(config: &Config, identity: Identity) -> anyhow::Result<Signer> {
    if identity.role != Role::Site {
        return Err(anyhow!(
            "this node joined as role {}; bcd site runs on a site node (bcd join --role site with a site token)",
            identity.role.name()
        ));
    }
    let client = Client::with_identity(config, &identity.chain, identity.key.clone())?;
    Ok(Signer {
        node_id: identity.node_id,
        key: identity.key,
        client: Arc::new(client),
    })
}

fn not_joined(config: &Config) -> anyhow::Error {
    anyhow!(
        "not joined (no identity in {}); join first: bcd join --role site",
        config.data_dir.display()
    )
}

/// Not following a link: the data directory's files are never links.
fn stamp(file: &std::path::Path) -> Option<Stamp> {
    let m = std::fs::symlink_metadata(file).ok()?;
    Some(Stamp {
        ino: m.ino(),
        len: m.len(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    })
}
