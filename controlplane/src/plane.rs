//! The control plane's shared state, and the services over it.
//!
//! [`ControlPlane`] holds what every API needs: the PKI bundle, the
//! database, the refusal log, the attestors, the `on_refusal` hook, the
//! certificate and lease lifetimes, the boot entries' key. Each API is a
//! service over it, in a module of its own: [`crate::plane::join::JoinService`]
//! (`Join`), [`crate::plane::renew::RenewService`] (`Renew`) and
//! [`crate::plane::siteapi::SiteService`] (the site API), each made with
//! `Service::new(&control_plane)`. Adding an API (the command channel) is
//! one more such module; this one does not change, and imports none of
//! them.

pub(crate) mod api_error;
pub(crate) mod commands;
mod csr;
pub(crate) mod join;
pub(crate) mod renew;
pub(crate) mod siteapi;
pub(crate) mod userdata;
pub(crate) mod workflows;

use std::path::Path;
use std::sync::{Arc, RwLock};

use time::Duration;

use bc_wire::AttestorId;

use crate::attestors::AttestorRegistry;
use crate::config::ConfigError;
use crate::model::attestor::Attestor;
use crate::model::eventlog::{EventLog, Refused};
use crate::pki::{Bundle, PkiError, MAX_NODE_CERT_TTL};
use crate::reason::AnyReason;
use crate::store::{DbError, Store, UnixMs};

/// What the `on_refusal` hook and the `security.join.refused` event carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusalEvent {
    pub attestor: String,
    pub reason: AnyReason,
    pub token_id: Option<String>,
    pub node_id: Option<String>,
    /// The pool whose policy refused the machine (`join:pool-attestor`,
    /// `join:pool-ek-assurance`).
    pub pool_id: Option<String>,
    /// The spec's `tenantId`: the tenant the refusal is attributed to, the
    /// owner of that pool (the attestor verified the machine, so the pool
    /// owner may see it); `None` for every other refusal, the operator's.
    /// It replaces `pool_owner`: a pool's owner is a tenant now, and one
    /// field cannot disagree with the event's `tenant_id`.
    pub tenant_id: Option<String>,
}

pub(crate) type RefusalHook = dyn Fn(&RefusalEvent) + Send + Sync;

/// Why a DIR could not be opened as a control plane.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The state every service shares (see the module documentation). One per
/// DIR and process; `serve` holds it in an `Arc` the router's handlers share.
pub struct ControlPlane {
    bundle: Bundle,
    db: Arc<Store>,
    events: EventLog,
    attestors: RwLock<AttestorRegistry>,
    on_refusal: RwLock<Option<Arc<RefusalHook>>>,
    cert_ttl: Duration,
    lease_ttl_ms: i64,
    boot_key: Option<crate::model::boot::BootKey>,
    /// The key renewals' boot challenges are MACed under (loaded by
    /// [`Self::open`]; none: a renewal under a boot policy fails).
    renew_boot_key: Option<crate::plane::renew::RenewBootKey>,
    /// `[discovery] approval`, which lease answers tell site nodes.
    discovery_approval: crate::config::DiscoveryApproval,
    /// Woken when this process queues a command, so the channels deliver at
    /// once (other processes' commands arrive by the channels' poll).
    queued: tokio::sync::Notify,
    /// The nodes this process queued for since the channels last looked.
    queued_nodes: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl ControlPlane {
    /// Loads DIR's bundle, config (`controlplane.toml`) and challenge key
    /// (created if DIR predates it), opens (and migrates) its database, and
    /// registers the attestors `serve` runs ([`crate::attestors::builtin`]).
    pub fn open(dir: &Path) -> Result<Self, OpenError> {
        Self::open_with(dir, crate::config::load(dir)?)
    }

    /// As [`ControlPlane::open`], with DIR's config already loaded (and its
    /// database perhaps named by `--database-url`).
    pub fn open_with(dir: &Path, config: crate::config::Config) -> Result<Self, OpenError> {
        let bundle = Bundle::load(dir)?;
        let challenge_key = crate::pki::load_or_create_challenge_key(dir)?;
        let db = Store::open_configured(dir, config.database.as_ref())?;
        let mut cp = Self::with_retention(bundle, db, config.events.retention_ms);
        cp.lease_ttl_ms = config.discovery.lease_ttl_ms;
        cp.discovery_approval = config.discovery.approval;
        cp.boot_key = Some(crate::model::boot::BootKey::derive(&challenge_key));
        cp.renew_boot_key = Some(crate::plane::renew::RenewBootKey::derive(&challenge_key));
        *cp.attestors.get_mut().unwrap_or_else(|p| p.into_inner()) =
            crate::attestors::builtin(&config, challenge_key);
        Ok(cp)
    }

    /// A control plane running only the built-in `join-token`, pruning
    /// events older than `retention_ms`; see [`Self::open`].
    fn with_retention(bundle: Bundle, db: Store, retention_ms: i64) -> Self {
        let db = Arc::new(db);
        ControlPlane {
            bundle,
            events: EventLog::start(db.clone(), retention_ms),
            db,
            attestors: RwLock::new(AttestorRegistry::new()),
            on_refusal: RwLock::new(None),
            cert_ttl: MAX_NODE_CERT_TTL,
            lease_ttl_ms: crate::model::sites::DEFAULT_LEASE_TTL_MS,
            boot_key: None,
            renew_boot_key: None,
            discovery_approval: crate::config::DiscoveryApproval::default(),
            queued: tokio::sync::Notify::new(),
            queued_nodes: std::sync::Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// Tells the channels a command was queued for `node_id`, so that only
    /// its channel wakes.
    pub(crate) fn commands_queued(&self, node_id: &str) {
        self.queued_nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node_id.to_owned());
        // One waiter (the channels' poller); a permit is kept if it is busy.
        self.queued.notify_one();
    }

    /// Completes at the next [`Self::commands_queued`] (or at once if one
    /// came while nobody waited).
    pub(crate) fn queued_notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.queued.notified()
    }

    /// The nodes queued for since the last call.
    pub(crate) fn take_queued_nodes(&self) -> Vec<String> {
        std::mem::take(&mut *self.queued_nodes.lock().unwrap_or_else(|p| p.into_inner()))
            .into_iter()
            .collect()
    }

    /// The boot lease's TTL (`[discovery] lease_ttl`).
    pub(crate) fn lease_ttl_ms(&self) -> i64 {
        self.lease_ttl_ms
    }

    /// `[discovery] approval`.
    pub(crate) fn discovery_approval(&self) -> crate::config::DiscoveryApproval {
        self.discovery_approval
    }

    /// The key boot entries' tokens are sealed under (loaded by [`Self::open`]).
    pub(crate) fn boot_key(&self) -> Option<&crate::model::boot::BootKey> {
        self.boot_key.as_ref()
    }

    /// The key renewals' boot challenges are MACed under.
    pub(crate) fn renew_boot_key(&self) -> Option<&crate::plane::renew::RenewBootKey> {
        self.renew_boot_key.as_ref()
    }

    /// Adds an attestor; one with id `join-token` replaces the built-in.
    pub fn register_attestor(&self, attestor: Arc<dyn Attestor>) {
        self.attestors
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .register(attestor);
    }

    /// The ids of the attestors this control plane runs (what a pool's
    /// `joinAttestors` may name), in the order of their spellings.
    pub fn attestor_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .attestors
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .ids()
            .map(|id| id.as_str().to_owned())
            .collect();
        ids.sort();
        ids
    }

    /// Called with every refusal (in the request, after its event is
    /// counted and, unless the writer is more than 2 s behind, stored).
    pub fn set_on_refusal(&self, hook: Box<RefusalHook>) {
        *self.on_refusal.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::from(hook));
    }

    /// The lifetime of the certificates this control plane issues (at most 24 h).
    pub(crate) fn cert_ttl(&self) -> Duration {
        self.cert_ttl
    }

    pub fn bundle(&self) -> &Bundle {
        &self.bundle
    }

    pub fn database(&self) -> &Store {
        &self.db
    }

    /// Counts a refusal in the refusal log (see [`crate::model::eventlog`]).
    pub(crate) fn record_refusal(&self, r: Refused) -> bool {
        self.events.record(r)
    }

    /// Waits until every refusal counted so far is in the database.
    pub fn flush_events(&self) -> bool {
        self.events.flush(std::time::Duration::from_secs(30))
    }

    /// Writes what the refusal log still holds and stops its writer (at
    /// shutdown; later refusals are still counted, but wait for nothing).
    pub fn shutdown_events(&self) {
        self.events.shutdown();
    }

    /// The node CA certificate (DER), the last element of every chain.
    pub(crate) fn node_ca_der(&self) -> &[u8] {
        self.bundle.node_ca.cert_der()
    }

    /// The key that signs every `JoinResponseBody`.
    pub(crate) fn signing_key(&self) -> &p256::ecdsa::SigningKey {
        self.bundle.join_signing_key()
    }

    /// The attestor of `id`, if this control plane runs it.
    pub(crate) fn attestor(&self, id: AttestorId) -> Option<Arc<dyn Attestor>> {
        self.attestors
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
    }

    /// The `on_refusal` hook, if one is set.
    pub(crate) fn on_refusal(&self) -> Option<Arc<RefusalHook>> {
        self.on_refusal
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// `ttl` from `now` (whole seconds), ending no later than `end` when there
/// is one (a ramdisk's boot entry; floored to a whole second, and at least
/// zero).
pub(crate) fn capped_ttl(ttl: Duration, now: UnixMs, end: Option<UnixMs>) -> Duration {
    let Some(end) = end else { return ttl };
    let start = now - now.rem_euclid(1000);
    let left_ms = (end - end.rem_euclid(1000)).saturating_sub(start).max(0);
    ttl.min(Duration::milliseconds(left_ms))
}
