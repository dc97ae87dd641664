//! The attestors that ship with the control plane, and the one place that
//! wires them: `join-token` is built into every [`AttestorRegistry`];
//! [`builtin`] adds `tpm`, `x509pop`, `discovery`, `provisioned` and
//! `cloud-iid` as DIR's config sets them up (what `serve` runs). Others are
//! added with [`AttestorRegistry::register`].

pub mod cloud_iid;
pub mod discovery;
pub(crate) mod join_token;
pub(crate) mod provisioned;
pub mod tpm;
pub(crate) mod x509pop;

use std::collections::BTreeMap;
use std::sync::Arc;

use bc_wire::AttestorId;

use crate::config::Config;
use crate::model::attestor::Attestor;

/// The attestors a control plane runs, by id. `join-token` is always there;
/// registering another with that id replaces it.
#[derive(Clone)]
pub struct AttestorRegistry {
    by_id: BTreeMap<AttestorId, Arc<dyn Attestor>>,
}

impl Default for AttestorRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl AttestorRegistry {
    pub(crate) fn new() -> Self {
        let mut r = AttestorRegistry {
            by_id: BTreeMap::new(),
        };
        r.register(Arc::new(join_token::JoinTokenAttestor));
        r
    }

    /// Adds an attestor, replacing one of the same id.
    pub fn register(&mut self, attestor: Arc<dyn Attestor>) {
        self.by_id.insert(attestor.id(), attestor);
    }

    /// The attestor of `id`, if this control plane runs it.
    pub fn get(&self, id: AttestorId) -> Option<Arc<dyn Attestor>> {
        self.by_id.get(&id).cloned()
    }

    pub fn ids(&self) -> impl Iterator<Item = AttestorId> + '_ {
        self.by_id.keys().copied()
    }
}

/// Every built-in attestor, configured from `config` (tokens of tpm
/// challenges are sealed under `challenge_key`).
pub(crate) fn builtin(config: &Config, challenge_key: [u8; 32]) -> AttestorRegistry {
    let mut registry = AttestorRegistry::new();
    let tpm = tpm::TpmAttestor::new(
        config.tpm.clone(),
        tpm::state::ChallengeKey::new(challenge_key),
    );
    registry.register(Arc::new(discovery::DiscoveryAttestor::new(
        config.discovery.clone(),
        tpm.for_ramdisk(),
    )));
    registry.register(Arc::new(tpm));
    registry.register(Arc::new(x509pop::X509PopAttestor::new(
        config.x509pop.clone(),
    )));
    registry.register(Arc::new(provisioned::ProvisionedAttestor));
    registry.register(Arc::new(cloud_iid::CloudIidAttestor::new(
        config.cloud_iid.clone(),
    )));
    registry
}
