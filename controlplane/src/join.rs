//! JoinService: turns a `JoinRequest` into a signed `JoinResponse`.
//!
//! A plain function of the request (no HTTP here), so tests and other
//! transports can call it directly. Outline:
//!
//! 1. decode: the CSR must be PKCS#10 DER and the role known, else
//!    INVALID_INPUT (the request is broken; no machine was refused, so no
//!    event). A CSR that parses but whose signature does not verify
//!    (`join:csr-signature`) or whose key is not P-256 (`join:csr-key`) is a
//!    refusal;
//! 2. pick the attestor (`join:unknown-attestor`) and open the sealed token
//!    with aad = sha256(csr) (`token-unopenable`);
//! 3. in ONE `BEGIN IMMEDIATE` transaction: the attestor, then on admit the
//!    token's expect binding against the claims (`join:expect-product-uuid`,
//!    `join:expect-mac`), the checks that need the resolved node and pool (the node-key statement,
//!    `bound-elsewhere`, the pool's `joinAttestors`), and only then the node
//!    row (new or reclaimed), the hardware binding, the certificate, the
//!    `joins` audit row and the `node.joined` event;
//! 4. sign the answer.
//!
//! Every refusal rolls the transaction back, is counted in the refusal log
//! ([`crate::eventlog`]: a `security.join.refused` event, identical ones
//! aggregated per minute, written by one writer thread), logged, passed to the
//! `on_refusal` hook, and answered as the same ACCESS_DENIED.

use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, RwLock};

use bc_wire::agent::{self, join_response_body, JoinRequest, JoinResponse, JoinResponseBody, Role};
use bc_wire::signing::{self, Purpose};
use bc_wire::token::JoinToken;
use p256::pkcs8::DecodePublicKey;
use prost::Message;
use time::Duration;

use crate::attestor::{
    AttestInput, AttestationResult, Attestor, AttestorRegistry, Deferral, ExpectMismatch, Fault,
    OpenedToken, Prepared, Refusal, Verdict, JOIN_TOKEN,
};
use crate::attestors::tpm::{self, state::ChallengeKey, TpmAttestor};
use crate::attestors::x509pop::{self, X509PopAttestor};
use crate::attestors::{cloud_iid, discovery, join_token, provisioned};
use crate::config::ConfigError;
use crate::eventlog::{EventLog, Refused};
use crate::pki::{Bundle, NodeCertSpec, PkiError, MAX_NODE_CERT_TTL};
use crate::reason::AnyReason;
use crate::records::{self, JoinRow, NewEvent, NodeRow};
use crate::store::{self, Commit, DbError, LockKey, Store, Tx, UnixMs};
use crate::{hardware, pools};

crate::reason::reasons! {
    /// JoinService's own checks, for any attestor: the event's `attestor`
    /// is the one the request named.
    pub enum JoinReason in "join" {
        CsrKey = "join:csr-key",
        CsrNotVerified = "join:csr-signature",
        UnknownAttestor = "join:unknown-attestor",
        /// An unlisted attestor's role refusal.
        Role = "join:role",
        TokenUnopenable = "token-unopenable",
        /// Another live node holds this machine's hardware key.
        Reclaim = "reclaim",
        NodeKeyStatement = "join:node-key-statement",
        ReclaimUnknown = "join:reclaim-unknown-node",
        ReclaimRetired = "join:reclaim-retired",
        ReclaimRole = "join:reclaim-role",
        /// The machine's hardware key is bound to another node, or the node
        /// to another hardware key of that kind.
        BoundElsewhere = "bound-elsewhere",
        /// The attestor resolved a pool that does not exist.
        UnknownPool = "join:unknown-pool",
        /// The admitting attestor is not in the pool's `policy.joinAttestors`.
        PoolAttestor = "join:pool-attestor",
        /// The join's EK assurance is below the pool's `policy.minEkAssurance`
        /// (or the join proved no EK at all).
        PoolEkAssurance = "join:pool-ek-assurance",
        /// The token's expect binding: the claimed product UUID is empty or
        /// another.
        ExpectProductUuid = "join:expect-product-uuid",
        /// The token's expect binding: its MAC is not among the claimed ones.
        ExpectMac = "join:expect-mac",
    }
}

/// The only node-key statement a renewal can prove again (see the spec,
/// "Renewing a TPM-held key"); any other is refused rather than issued.
const KNOWN_STATEMENT_PREFIX: &str = "urn:bc:tpm-ak:";

/// What an agent sees when a call fails. Only the code and the public
/// message leave the server.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Every join refusal, whatever the reason.
    #[error("join refused")]
    AccessDenied,
    /// Every renewal refusal, whatever the reason: ACCESS_DENIED too, with
    /// the spec's own message ("Renew refused").
    #[error("renew refused")]
    RenewRefused,
    /// Every refusal of a site call (lease, SecretRequest).
    #[error("site request refused")]
    SiteRefused,
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn code(&self) -> agent::Code {
        match self {
            ApiError::AccessDenied | ApiError::RenewRefused | ApiError::SiteRefused => {
                agent::Code::AccessDenied
            }
            ApiError::InvalidInput(_) => agent::Code::InvalidInput,
            ApiError::NotFound(_) => agent::Code::NotFound,
            ApiError::Unavailable(_) => agent::Code::Unavailable,
            ApiError::Internal(_) => agent::Code::Internal,
        }
    }

    pub fn http_status(&self) -> u16 {
        match self {
            ApiError::AccessDenied | ApiError::RenewRefused | ApiError::SiteRefused => 403,
            ApiError::InvalidInput(_) => 400,
            ApiError::NotFound(_) => 404,
            ApiError::Unavailable(_) => 503,
            ApiError::Internal(_) => 500,
        }
    }

    /// The message an agent gets: what was wrong with its request, but
    /// nothing about why it was refused or what failed inside the server.
    pub fn public_message(&self) -> String {
        match self {
            ApiError::AccessDenied => "join refused".to_owned(),
            ApiError::RenewRefused => "Renew refused".to_owned(),
            ApiError::SiteRefused => "site request refused".to_owned(),
            ApiError::InvalidInput(m) | ApiError::NotFound(m) => m.clone(),
            ApiError::Unavailable(_) => {
                "the control plane cannot serve now; retry later".to_owned()
            }
            ApiError::Internal(_) => "internal error".to_owned(),
        }
    }

    pub fn to_wire(&self) -> agent::Error {
        agent::Error {
            code: self.code() as i32,
            message: self.public_message(),
        }
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        match e {
            e if e.is_transient() => ApiError::Unavailable(e.to_string()),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

/// What the `on_refusal` hook and the `security.join.refused` event carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusalEvent {
    pub attestor: String,
    pub reason: AnyReason,
    pub token_id: Option<String>,
    pub node_id: Option<String>,
    /// The pool whose policy refused the machine (`join:pool-attestor`):
    /// the refusal is attributed to its owner.
    pub pool_id: Option<String>,
    pub pool_owner: Option<String>,
}

pub type RefusalHook = dyn Fn(&RefusalEvent) + Send + Sync;

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

pub struct JoinService {
    bundle: Bundle,
    db: Arc<Store>,
    events: EventLog,
    attestors: RwLock<AttestorRegistry>,
    on_refusal: RwLock<Option<Arc<RefusalHook>>>,
    cert_ttl: Duration,
    lease_ttl_ms: i64,
    boot_key: Option<crate::boot::BootKey>,
    /// `[discovery] approval`, which lease answers tell site nodes.
    discovery_approval: crate::config::DiscoveryApproval,
}

/// A CSR whose signature verified.
pub(crate) struct VerifiedCsr {
    pub(crate) sha256: [u8; 32],
    pub(crate) spki_der: Vec<u8>,
    pub(crate) spki_sha256: [u8; 32],
}

/// The outcome of the join transaction.
enum Outcome {
    Joined {
        node_id: String,
        leaf: Vec<u8>,
    },
    Deferred(Deferral),
    Refused(Refusal),
    /// The attestor asked for work outside the transaction first.
    Prepare(crate::attestor::Work),
}

impl JoinService {
    /// Loads DIR's bundle, config (`controlplane.toml`) and challenge key
    /// (created if DIR predates it), opens (and migrates) its database, and
    /// registers the attestors `serve` runs: `join-token`, `tpm` and `x509pop`.
    pub fn open(dir: &Path) -> Result<Self, OpenError> {
        Self::open_with(dir, crate::config::load(dir)?)
    }

    /// As [`JoinService::open`], with DIR's config already loaded (and its
    /// database perhaps named by `--database-url`).
    pub fn open_with(dir: &Path, config: crate::config::Config) -> Result<Self, OpenError> {
        let bundle = Bundle::load(dir)?;
        let challenge_key = crate::pki::load_or_create_challenge_key(dir)?;
        let db = Store::open_configured(dir, config.database.as_ref())?;
        let mut svc = Self::with_retention(bundle, db, config.events.retention_ms);
        svc.lease_ttl_ms = config.discovery.lease_ttl_ms;
        svc.discovery_approval = config.discovery.approval;
        svc.boot_key = Some(crate::boot::BootKey::derive(&challenge_key));
        let tpm = TpmAttestor::new(config.tpm, ChallengeKey::new(challenge_key));
        svc.register_attestor(Arc::new(
            crate::attestors::discovery::DiscoveryAttestor::new(
                config.discovery,
                tpm.for_ramdisk(),
            ),
        ));
        svc.register_attestor(Arc::new(tpm));
        svc.register_attestor(Arc::new(X509PopAttestor::new(config.x509pop)));
        svc.register_attestor(Arc::new(crate::attestors::provisioned::ProvisionedAttestor));
        svc.register_attestor(Arc::new(
            crate::attestors::cloud_iid::CloudIidAttestor::new(config.cloud_iid),
        ));
        Ok(svc)
    }

    /// A JoinService running only the built-in `join-token`; see [`Self::open`].
    pub fn new(bundle: Bundle, db: Store) -> Self {
        Self::with_retention(bundle, db, crate::config::DEFAULT_EVENTS_RETENTION_MS)
    }

    /// [`Self::new`], pruning events older than `retention_ms`.
    fn with_retention(bundle: Bundle, db: Store, retention_ms: i64) -> Self {
        let db = Arc::new(db);
        JoinService {
            bundle,
            events: EventLog::start(db.clone(), retention_ms),
            db,
            attestors: RwLock::new(AttestorRegistry::new()),
            on_refusal: RwLock::new(None),
            cert_ttl: MAX_NODE_CERT_TTL,
            lease_ttl_ms: crate::sites::DEFAULT_LEASE_TTL_MS,
            boot_key: None,
            discovery_approval: crate::config::DiscoveryApproval::default(),
        }
    }

    /// Shortens node certificates; anything above 24 hours is capped.
    pub fn with_cert_ttl(mut self, ttl: std::time::Duration) -> Self {
        let ttl = Duration::try_from(ttl).unwrap_or(MAX_NODE_CERT_TTL);
        self.cert_ttl = ttl.clamp(Duration::seconds(1), MAX_NODE_CERT_TTL);
        self
    }

    /// The boot lease's TTL (`[discovery] lease_ttl`).
    pub fn lease_ttl_ms(&self) -> i64 {
        self.lease_ttl_ms
    }

    /// `[discovery] approval`.
    pub fn discovery_approval(&self) -> crate::config::DiscoveryApproval {
        self.discovery_approval
    }

    /// The key boot entries' tokens are sealed under (loaded by [`Self::open`]).
    pub fn boot_key(&self) -> Option<&crate::boot::BootKey> {
        self.boot_key.as_ref()
    }

    /// Adds an attestor; one with id `join-token` replaces the built-in.
    pub fn register_attestor(&self, attestor: Arc<dyn Attestor>) {
        self.attestors
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .register(attestor);
    }

    /// The ids of the attestors this service runs (what a pool's
    /// `joinAttestors` may name).
    pub fn attestor_ids(&self) -> Vec<String> {
        self.attestors
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .ids()
            .map(str::to_owned)
            .collect()
    }

    /// Called with every refusal (in the request, after its event is
    /// counted and, unless the writer is more than 2 s behind, stored).
    pub fn set_on_refusal(&self, hook: Box<RefusalHook>) {
        *self.on_refusal.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::from(hook));
    }

    /// The lifetime of the certificates this service issues (at most 24 h).
    pub fn cert_ttl(&self) -> Duration {
        self.cert_ttl
    }

    pub fn bundle(&self) -> &Bundle {
        &self.bundle
    }

    pub fn database(&self) -> &Store {
        &self.db
    }

    /// Counts a refusal in the refusal log (see [`crate::eventlog`]).
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
    pub fn node_ca_der(&self) -> &[u8] {
        self.bundle.node_ca.cert_der()
    }

    /// The key that signs every `JoinResponseBody`.
    pub fn signing_key(&self) -> &p256::ecdsa::SigningKey {
        self.bundle.join_signing_key()
    }

    /// Signs a body as the JoinService does (also for tests that need a
    /// well-signed but wrong answer).
    pub fn sign_body(&self, body: &JoinResponseBody) -> JoinResponse {
        let bytes = body.encode_to_vec();
        let signature = signing::sign(self.signing_key(), Purpose::JoinResponse, &[&bytes]);
        JoinResponse {
            body: bytes,
            signature: signature.to_vec(),
            key_id: signing::key_id(self.bundle.join_signing_spki_der()),
        }
    }

    /// `Join` on a serialized `JoinRequest` from `source` (the client's
    /// address, which refusal events name).
    pub fn join_bytes(
        &self,
        body: &[u8],
        source: Option<IpAddr>,
    ) -> Result<JoinResponse, ApiError> {
        let req = JoinRequest::decode(body).map_err(|e| {
            ApiError::InvalidInput(format!("the body is not a JoinRequest protobuf: {e}"))
        })?;
        self.join_from(req, source)
    }

    /// `Join` from an unknown source (tests, other transports).
    pub fn join(&self, req: JoinRequest) -> Result<JoinResponse, ApiError> {
        self.join_from(req, None)
    }

    pub fn join_from(
        &self,
        req: JoinRequest,
        source: Option<IpAddr>,
    ) -> Result<JoinResponse, ApiError> {
        let role = match Role::try_from(req.role) {
            Ok(Role::Unspecified) | Err(_) => {
                return Err(ApiError::InvalidInput(
                    "role must be node, site or ramdisk".to_owned(),
                ))
            }
            Ok(r) => r,
        };
        let attestor_name = if req.attestor.is_empty() {
            JOIN_TOKEN.to_owned()
        } else {
            printable(&req.attestor)
        };
        let csr = match verify_csr(&req.csr)? {
            Ok(csr) => csr,
            Err(reason) => return Err(self.refuse(&attestor_name, Refusal::new(reason), source)),
        };
        let attestor = self
            .attestors
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&req.attestor);
        let Some(attestor) = attestor else {
            return Err(self.refuse(
                &attestor_name,
                Refusal::new(JoinReason::UnknownAttestor),
                source,
            ));
        };
        let attestor_id = attestor.id().to_owned();
        if req.tpm.is_some() && !attestor.takes_tpm_evidence() {
            return Err(ApiError::InvalidInput(format!(
                "JoinRequest.tpm is TPM evidence beside another attestor's; {attestor_id} takes none (a tpm join sends it as its attestation)"
            )));
        }
        // A role the attestor never admits is refused before it runs.
        if let Err(refusal) = check_role(&attestor_id, role, None) {
            return Err(self.refuse(&attestor_id, refusal, source));
        }

        let token = if req.sealed_token.is_empty() {
            None
        } else {
            match self
                .bundle
                .join_opening_key()
                .open(&csr.sha256, &req.sealed_token)
            {
                Ok(plain) => Some(
                    std::str::from_utf8(&plain)
                        .ok()
                        .and_then(|s| JoinToken::parse(s).ok())
                        .map_or(OpenedToken::Malformed, OpenedToken::Parsed),
                ),
                Err(_) => {
                    return Err(self.refuse(
                        &attestor_id,
                        Refusal::new(JoinReason::TokenUnopenable),
                        source,
                    ))
                }
            }
        };
        let claims = req.claims.clone().unwrap_or_default();
        // What the attestor asks done outside the transaction (it must not
        // hold the write lock): done once, then the attestor runs again.
        let mut prepared = Prepared::default();
        let mut prepared_once = false;
        let outcome = loop {
            let outcome = self
                .db
                .write_if(|tx| -> Result<(Outcome, Commit), ApiError> {
                    let now = tx.now()?;
                    let input = AttestInput {
                        role,
                        evidence: &req.attestation,
                        token: token.as_ref(),
                        csr_der: &req.csr,
                        csr_sha256: csr.sha256,
                        csr_spki_der: &csr.spki_der,
                        csr_spki_sha256: csr.spki_sha256,
                        claims: &claims,
                        tpm: req.tpm.as_ref(),
                        now,
                        source,
                        prepared: &prepared,
                    };
                    match attestor.verify(tx, &input) {
                        // No commit: a refusal rolls back whatever the attestor wrote.
                        Err(refusal) => Ok((Outcome::Refused(refusal), Commit::No)),
                        // Commit: the attestor's own rows (a pending request) persist.
                        Ok(Verdict::Defer(d)) => Ok((Outcome::Deferred(d), Commit::Yes)),
                        Ok(Verdict::Prepare(work)) => Ok((Outcome::Prepare(work), Commit::No)),
                        Ok(Verdict::Admit(result)) => {
                            let request = Admission {
                                role,
                                attestor_id: &attestor_id,
                                csr: &csr,
                                claims: &claims,
                            };
                            let admitted = check_role(&attestor_id, role, Some(&result))
                                .and_then(|()| check_expect(&result, &claims))
                                .and_then(|()| self.admit(tx, now, &request, &result));
                            match admitted {
                                Ok((node_id, leaf)) => {
                                    Ok((Outcome::Joined { node_id, leaf }, Commit::Yes))
                                }
                                Err(refusal) => Ok((Outcome::Refused(refusal), Commit::No)),
                            }
                        }
                    }
                })?;
            match outcome {
                Outcome::Prepare(work) if !prepared_once => {
                    prepared_once = true;
                    prepared = match attestor.prepare(&self.db, &work, source) {
                        Ok(p) => p,
                        Err(refusal) => return Err(self.refuse(&attestor_id, refusal, source)),
                    };
                }
                other => break other,
            }
        };

        let body = match outcome {
            // Asked again after its work was done: a bug in the attestor.
            Outcome::Prepare(_) => {
                return Err(ApiError::Internal(format!(
                    "attestor {attestor_id} asked for work outside the transaction twice"
                )))
            }
            Outcome::Refused(refusal) => return Err(self.refuse(&attestor_id, refusal, source)),
            Outcome::Deferred(d) => {
                tracing::info!(attestor = %attestor_id, "join deferred");
                JoinResponseBody {
                    csr_sha256: csr.sha256.to_vec(),
                    node_id: String::new(),
                    chain: Vec::new(),
                    deferral: Some(deferral_to_wire(d)),
                }
            }
            Outcome::Joined { node_id, leaf } => JoinResponseBody {
                csr_sha256: csr.sha256.to_vec(),
                node_id,
                chain: vec![leaf, self.node_ca_der().to_vec()],
                deferral: None,
            },
        };
        Ok(self.sign_body(&body))
    }

    /// Checks what needs the resolved node and pool, then writes the
    /// admitted node: its row (new, or the reclaimed one at a new identity
    /// generation), its hardware binding, its certificate, the `joins` audit
    /// row and the `node.joined` event. Any refusal here comes before the
    /// first write (and the transaction is rolled back anyway).
    fn admit(
        &self,
        tx: &Tx<'_>,
        now: UnixMs,
        request: &Admission<'_>,
        result: &AttestationResult,
    ) -> Result<(String, Vec<u8>), Refusal> {
        let Admission {
            role,
            attestor_id,
            csr,
            claims,
        } = *request;
        let refuse = |reason: JoinReason, node: Option<&str>| {
            Refusal::new(reason)
                .with_token(result.token_id.as_deref())
                .with_node(node)
        };
        // One machine, one live node: a hardware key another node holds is
        // a reclaim, allowed only by the token (a tpm join has none). A
        // bound key (an EK in node_bindings) is the binding check's below.
        let hardware = hardware::of_result(result);
        // PG: advisory locks on `hw:<key>` and `uuid:<uuid>`: no unique
        // index can say "one live holder", so two joins of one machine must
        // not both pass `holder` below.
        if let Some(hk) = &hardware {
            let mut keys = vec![LockKey {
                namespace: "hw",
                key: &hk.key,
            }];
            if let Some(uuid) = &hk.product_uuid {
                keys.push(LockKey {
                    namespace: "uuid",
                    key: uuid,
                });
            }
            tx.lock(&keys)?;
        }
        let bound = match &result.binding {
            Some(b) => records::binding_by_key(tx, &b.kind, &b.key)?.is_some(),
            None => false,
        };
        let mut reclaim = result.reclaim_node_id.clone();
        if let Some(hk) = hardware.as_ref().filter(|_| !bound) {
            if let Some(holder) = hardware::holder(tx, hk, role.name(), reclaim.as_deref())? {
                if !result.allow_reclaim || reclaim.is_some() {
                    return Err(refuse(JoinReason::Reclaim, Some(&holder)));
                }
                reclaim = Some(holder);
            }
        }
        let reclaim = reclaim.as_deref();
        let statements: Vec<String> = match &result.node_key_uri {
            None => Vec::new(),
            Some(uri) if knows_key_statement(uri) => vec![uri.clone()],
            Some(_) => return Err(refuse(JoinReason::NodeKeyStatement, reclaim)),
        };

        let existing = match reclaim {
            Some(id) => {
                let node = records::node_for_update(tx, id)?
                    .ok_or_else(|| refuse(JoinReason::ReclaimUnknown, Some(id)))?;
                if node.retired_at.is_some() {
                    return Err(refuse(JoinReason::ReclaimRetired, Some(id)));
                }
                if node.role != role {
                    return Err(refuse(JoinReason::ReclaimRole, Some(id)));
                }
                Some(node)
            }
            None => None,
        };

        // A hardware key admits only the node it is bound to, and a node has
        // one key of each kind.
        let mut new_binding = None;
        if let Some(b) = &result.binding {
            match records::binding_by_key(tx, &b.kind, &b.key)? {
                Some(bound) if Some(bound.node_id.as_str()) != reclaim => {
                    return Err(refuse(
                        JoinReason::BoundElsewhere,
                        Some(reclaim.unwrap_or(&bound.node_id)),
                    ));
                }
                Some(_) => {}
                None => {
                    if let Some(id) = reclaim {
                        if records::binding_of_node(tx, id, &b.kind)?.is_some() {
                            return Err(refuse(JoinReason::BoundElsewhere, Some(id)));
                        }
                    }
                    new_binding = Some(b);
                }
            }
        }

        // The pool: a reclaimed node stays in its own; a new node joins the
        // one the attestor resolved, else `default`.
        let pool_id = match (&existing, &result.pool_id) {
            (Some(node), _) => node.pool_id.clone(),
            (None, Some(p)) => p.clone(),
            (None, None) => pools::DEFAULT_POOL.to_owned(),
        };
        let pool =
            pools::get(tx, &pool_id)?.ok_or_else(|| refuse(JoinReason::UnknownPool, reclaim))?;
        if let Some(allowed) = pool.join_attestors()? {
            if !allowed.iter().any(|a| a == attestor_id) {
                return Err(
                    refuse(JoinReason::PoolAttestor, reclaim).with_pool(&pool.id, &pool.owner)
                );
            }
        }
        if let Some(min) = pool.min_ek_assurance()? {
            if !result.ek_assurance.is_some_and(|a| a.meets(min)) {
                tracing::info!(
                    pool = %pool.id,
                    min = min.as_str(),
                    ek_assurance = result.ek_assurance.map_or("none", |a| a.as_str()),
                    "join refused: below the pool's minimum EK assurance"
                );
                return Err(
                    refuse(JoinReason::PoolEkAssurance, reclaim).with_pool(&pool.id, &pool.owner)
                );
            }
        }

        let (node_id, generation) = match existing {
            Some(node) => {
                let generation = node.identity_generation.saturating_add(1);
                records::start_generation(tx, &node.id, generation, attestor_id, now)?;
                (node.id, generation)
            }
            None => {
                let id = crate::ids::random_id("node_")
                    .map_err(|e| Refusal::fault(Fault::Internal(format!("random node id: {e}"))))?;
                records::insert_node(
                    tx,
                    &NodeRow {
                        id: id.clone(),
                        role,
                        identity_generation: 1,
                        attestor: attestor_id.to_owned(),
                        joined_at: now,
                        retired_at: None,
                        pool_id: pool.id.clone(),
                        cordoned_at: None,
                        deleted_at: None,
                    },
                )?;
                (id, 1)
            }
        };
        if let Some(b) = new_binding {
            records::insert_binding(tx, &b.kind, &b.key, &node_id, now)?;
        }
        if let Some(hk) = &hardware {
            hardware::record(tx, &node_id, hk)?;
        }
        // A new node gets its site, kinds and certificate cap from the
        // attestor; a reclaimed one keeps its own.
        let scope = if reclaim.is_none() {
            let mut scope = result.scope.as_deref().cloned().unwrap_or_default();
            if role == Role::Ramdisk {
                ramdisk_scope(&mut scope);
            }
            if scope != records::NodeScope::default() {
                records::set_node_scope(tx, &node_id, &scope)?;
            }
            scope
        } else {
            records::node_scope(tx, &node_id)?
        };
        if role == Role::Ramdisk {
            if let Some(token_id) = &result.token_id {
                crate::boot::mark_joined(tx, token_id, &node_id, now)?;
            }
        }
        let cert_ttl = match scope.max_cert_ttl_ms {
            Some(ms) => self.cert_ttl.min(Duration::milliseconds(ms)),
            None => self.cert_ttl,
        };
        // A ramdisk's certificate never outlives its boot entry.
        let entry_end = match role {
            Role::Ramdisk => crate::boot::cert_not_after(tx, &node_id)?,
            _ => None,
        };

        // X.509 times have whole seconds; issue at whole seconds so the
        // stored validity is the certificate's.
        let not_before = store::to_datetime(now - now.rem_euclid(1000));
        let cert_ttl = capped_ttl(cert_ttl, now, entry_end);
        let issued = self
            .bundle
            .node_ca
            .issue(&NodeCertSpec {
                spki_der: &csr.spki_der,
                trust_domain: &self.bundle.trust_domain,
                node_id: &node_id,
                statements: &statements,
                not_before,
                not_after: not_before + cert_ttl,
            })
            .map_err(|e| Refusal::fault(Fault::Internal(e.to_string())))?;
        records::insert_cert(tx, &node_id, generation, &issued)?;
        records::insert_join(
            tx,
            &JoinRow {
                node_id: node_id.clone(),
                attestor: attestor_id.to_owned(),
                node_key: result.node_key.as_str().to_owned(),
                ek_assurance: result.ek_assurance.map(|a| a.as_str().to_owned()),
                identity_generation: generation,
                at: now,
                product_uuid: crate::attestor::normalize_product_uuid(&claims.product_uuid).ok(),
            },
        )?;
        records::insert_event(
            tx,
            &NewEvent {
                kind: records::EVENT_NODE_JOINED,
                at: now,
                attestor: Some(attestor_id),
                reason: None,
                token_id: result.token_id.as_deref(),
                node_id: Some(&node_id),
                data: serde_json::json!({
                    "attestor": attestor_id,
                    "nodeKey": result.node_key.as_str(),
                    "ekAssurance": result.ek_assurance.map(|a| a.as_str()),
                    "role": role.name(),
                    "identityGeneration": generation,
                    "reclaim": reclaim.is_some(),
                    "pool": pool.id,
                    "serial": issued.serial_hex,
                    "notAfter": store::rfc3339(store::from_datetime(issued.not_after)),
                }),
            },
        )?;
        tracing::info!(
            node_id = %node_id,
            attestor = %attestor_id,
            role = role.name(),
            generation,
            token_id = result.token_id.as_deref().unwrap_or(""),
            node_key = result.node_key.as_str(),
            ek_assurance = result.ek_assurance.map_or("", |a| a.as_str()),
            "node joined"
        );
        Ok((node_id, issued.der))
    }

    /// Records a refusal and answers ACCESS_DENIED; a server fault dressed
    /// as a refusal is answered as what it is.
    fn refuse(&self, attestor: &str, refusal: Refusal, source: Option<IpAddr>) -> ApiError {
        if let Some(fault) = refusal.as_fault() {
            return match fault {
                Fault::Unavailable(m) => {
                    tracing::warn!(attestor = %attestor, error = %m, "join failed: database busy");
                    ApiError::Unavailable(m.clone())
                }
                Fault::Internal(m) => {
                    tracing::error!(attestor = %attestor, error = %m, "join failed");
                    ApiError::Internal(m.clone())
                }
            };
        }
        let (pool_id, pool_owner) = match refusal.pool.map(|p| *p) {
            Some(p) => (Some(p.id), Some(p.owner)),
            None => (None, None),
        };
        let event = RefusalEvent {
            attestor: attestor.to_owned(),
            reason: refusal.reason,
            token_id: refusal.token_id,
            node_id: refusal.node_id,
            pool_id,
            pool_owner,
        };
        let extra = match (&event.pool_id, &event.pool_owner) {
            (Some(id), Some(owner)) => {
                serde_json::json!({ "poolId": id, "poolOwner": owner }).to_string()
            }
            _ => String::new(),
        };
        let first = self.record_refusal(Refused {
            kind: records::EVENT_JOIN_REFUSED,
            attestor: Some(event.attestor.clone()),
            reason: event.reason,
            token_id: event.token_id.clone(),
            node_id: event.node_id.clone(),
            source,
            extra,
            folded: false,
        });
        // The token id may be logged; the secret never reaches this point.
        // Repeats within the minute are counted in the event, logged at debug.
        macro_rules! log_refusal {
            ($level:ident) => {
                tracing::$level!(
                    attestor = %event.attestor,
                    reason = %event.reason,
                    token_id = event.token_id.as_deref().unwrap_or(""),
                    node_id = event.node_id.as_deref().unwrap_or(""),
                    pool_owner = event.pool_owner.as_deref().unwrap_or(""),
                    source = source.map(|s| s.to_string()).unwrap_or_default(),
                    "join refused"
                )
            };
        }
        if first {
            log_refusal!(warn);
        } else {
            log_refusal!(debug);
        }
        let hook = self
            .on_refusal
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(hook) = hook {
            // The event's spelling, `join:` prefix and all (one name per
            // reason, whoever reads it).
            hook(&event);
        }
        ApiError::AccessDenied
    }
}

/// The request an attestor admitted, as [`JoinService::admit`] needs it.
#[derive(Clone, Copy)]
struct Admission<'a> {
    role: Role,
    attestor_id: &'a str,
    csr: &'a VerifiedCsr,
    claims: &'a agent::HardwareClaims,
}

/// A ramdisk is scoped whichever attestor admitted it: discovery sets its
/// configured kinds and certificate cap; any other (a cloud VM that
/// `[cloud_iid] roles` lets join as `ramdisk`) gets the commissioning kinds
/// and at most the 2 h certificate, never a node's whole reach.
fn ramdisk_scope(scope: &mut records::NodeScope) {
    use crate::config::{DISCOVERY_ALLOWED_KINDS, MAX_DISCOVERY_CERT_TTL_MS};
    scope.allowed_kinds.get_or_insert_with(|| {
        DISCOVERY_ALLOWED_KINDS
            .iter()
            .map(|k| (*k).to_owned())
            .collect()
    });
    let cap = scope
        .max_cert_ttl_ms
        .map_or(MAX_DISCOVERY_CERT_TTL_MS, |ms| {
            ms.min(MAX_DISCOVERY_CERT_TTL_MS)
        });
    scope.max_cert_ttl_ms = Some(cap);
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

/// Which roles each attestor admits, and the reason any other is refused
/// with: the README's table, enforced here and nowhere else (bar
/// discovery's own first check, which says the same). An attestor not
/// listed (a plugin's) admits `node` only.
pub const ATTESTOR_ROLES: &[(&str, &[Role], AnyReason)] = &[
    (
        JOIN_TOKEN,
        &[Role::Node, Role::Site],
        join_token::TokenReason::TokenRole.any(),
    ),
    (
        tpm::TPM,
        &[Role::Node, Role::Site],
        tpm::TpmReason::Role.any(),
    ),
    (
        x509pop::X509POP,
        &[Role::Node, Role::Site],
        x509pop::X509PopReason::Role.any(),
    ),
    (
        provisioned::PROVISIONED,
        &[Role::Node],
        provisioned::ProvisionedReason::TokenRole.any(),
    ),
    (
        discovery::DISCOVERY,
        &[Role::Ramdisk],
        discovery::DiscoveryReason::Role.any(),
    ),
    (
        cloud_iid::CLOUD_IID,
        &[Role::Node, Role::Site, Role::Ramdisk],
        cloud_iid::CloudReason::Role.any(),
    ),
];

/// Checks the role against [`ATTESTOR_ROLES`] before the attestor runs
/// (`result` `None`), and once it admitted, against the roles its result
/// narrows that to (a token's role, a TPM's place, a certificate's, a cloud
/// resolve row's). After an admission the refusal rolls back whatever the
/// attestor spent.
pub(crate) fn check_role(
    attestor_id: &str,
    role: Role,
    result: Option<&AttestationResult>,
) -> Result<(), Refusal> {
    let (admits, reason) = ATTESTOR_ROLES
        .iter()
        .find(|(id, _, _)| *id == attestor_id)
        .map_or(
            (&[Role::Node][..], JoinReason::Role.any()),
            |(_, roles, reason)| (*roles, *reason),
        );
    let narrowed = result.and_then(|r| r.roles.as_deref());
    if admits.contains(&role) && narrowed.is_none_or(|roles| roles.contains(&role)) {
        return Ok(());
    }
    tracing::info!(
        attestor = attestor_id,
        role = role.name(),
        "join: the attestor does not admit this role"
    );
    Err(Refusal::new(reason)
        .with_token(result.and_then(|r| r.token_id.as_deref()))
        .with_node(result.and_then(|r| r.reclaim_node_id.as_deref())))
}

/// Enforces the expect binding of the token an attestor admitted with. Done
/// here rather than in each attestor so that every token-based attestor
/// (join-token now; provisioned, discovery later) binds the same way. It
/// runs inside the join transaction before anything is written, so a
/// refusal rolls back the use the attestor consumed.
pub(crate) fn check_expect(
    result: &AttestationResult,
    claims: &agent::HardwareClaims,
) -> Result<(), Refusal> {
    result.expect.check(claims).map_err(|mismatch| {
        let reason = match mismatch {
            ExpectMismatch::ProductUuid => JoinReason::ExpectProductUuid,
            ExpectMismatch::Mac => JoinReason::ExpectMac,
        };
        Refusal::new(reason)
            .with_token(result.token_id.as_deref())
            .with_node(result.reclaim_node_id.as_deref())
    })
}

/// Parses and verifies a CSR. The outer error is a broken request
/// (INVALID_INPUT); the inner one a refusal reason.
pub(crate) fn verify_csr(der: &[u8]) -> Result<Result<VerifiedCsr, JoinReason>, ApiError> {
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::prelude::FromDer;
    if der.is_empty() {
        return Err(ApiError::InvalidInput("csr is empty".to_owned()));
    }
    let (rest, csr) = X509CertificationRequest::from_der(der)
        .map_err(|_| ApiError::InvalidInput("csr is not a PKCS#10 request in DER".to_owned()))?;
    if !rest.is_empty() {
        return Err(ApiError::InvalidInput("csr has trailing bytes".to_owned()));
    }
    let spki = csr.certification_request_info.subject_pki.raw;
    if p256::PublicKey::from_public_key_der(spki).is_err() {
        return Ok(Err(JoinReason::CsrKey));
    }
    if csr.verify_signature().is_err() {
        return Ok(Err(JoinReason::CsrNotVerified));
    }
    Ok(Ok(VerifiedCsr {
        sha256: bc_wire::sha256(der),
        spki_der: spki.to_vec(),
        spki_sha256: bc_wire::sha256(spki),
    }))
}

/// `JoinCrypto.knowsKeyStatement`: the only node-key statement a renewal
/// can prove again is a well-formed AK statement; any other is refused
/// rather than written into a certificate that could never renew.
fn knows_key_statement(uri: &str) -> bool {
    uri.starts_with(KNOWN_STATEMENT_PREFIX) && bc_wire::tpm::parse_ak_statement(uri).is_ok()
}

fn deferral_to_wire(d: Deferral) -> join_response_body::Deferral {
    match d {
        Deferral::Pending {
            request_id,
            retry_after_seconds,
        } => join_response_body::Deferral::Pending(agent::JoinPending {
            request_id,
            retry_after_seconds,
        }),
        Deferral::Challenge {
            attestor,
            payload,
            not_after,
        } => join_response_body::Deferral::Challenge(agent::JoinChallenge {
            attestor,
            payload,
            not_after_unix_ms: not_after,
        }),
    }
}

/// An attestor name from the request, safe for logs and events: at most 64
/// characters, control characters replaced.
fn printable(s: &str) -> String {
    s.chars()
        .take(64)
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attestor::NodeKeyKind;
    use crate::tokens;
    use std::sync::Mutex;

    use crate::test_support::{
        both_backends, cp as fixture, cp_on, uri_sans, Backend, Cp as Fixture,
    };

    // The whole join on both databases.
    both_backends!(
        joins_with_a_token,
        refusals_reach_event_and_hook_only,
        parallel_joins_spend_a_token_once,
    );

    fn new_csr() -> (rcgen::KeyPair, Vec<u8>) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["evil.example".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "node_chosenbyme");
        let der = params.serialize_request(&key).unwrap().der().to_vec();
        (key, der)
    }

    fn request(svc: &JoinService, csr: &[u8], token: Option<&str>, role: Role) -> JoinRequest {
        let sealed = token.map(|t| {
            bc_wire::sealing::SealingKey::from_spki_der(svc.bundle().join_encryption_spki_der())
                .unwrap()
                .seal(&bc_wire::sha256(csr), t.as_bytes())
                .unwrap()
        });
        JoinRequest {
            csr: csr.to_vec(),
            role: role as i32,
            sealed_token: sealed.unwrap_or_default(),
            ..Default::default()
        }
    }

    fn open_body(svc: &JoinService, resp: &JoinResponse) -> JoinResponseBody {
        let vk = signing::verifying_key_from_spki(svc.bundle().join_signing_spki_der()).unwrap();
        signing::verify(&vk, Purpose::JoinResponse, &[&resp.body], &resp.signature).unwrap();
        assert_eq!(
            resp.key_id,
            signing::key_id(svc.bundle().join_signing_spki_der())
        );
        JoinResponseBody::decode(resp.body.as_slice()).unwrap()
    }

    /// Every refusal's reason, an aggregated event counting as many.
    fn refusals(svc: &JoinService) -> Vec<String> {
        records::list_events(svc.database())
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == records::EVENT_JOIN_REFUSED)
            .flat_map(|e| {
                let n = e.data["count"].as_u64().unwrap() as usize;
                std::iter::repeat_n(e.reason.unwrap(), n)
            })
            .collect()
    }

    #[test]
    fn expect_binding_refuses_other_machines_and_spends_nothing() {
        use crate::attestor::Expect;
        let f = fixture();
        let expect = Expect {
            product_uuid: Some("4c4c4544-0042-3510-8052-b4c04f4e4d32".to_owned()),
            mac: Some("52:54:00:12:34:56".to_owned()),
        };
        let (tok, row) =
            tokens::create_bound_token(f.svc.database(), Role::Node, 1, 3_600_000, None, &expect)
                .unwrap();
        assert_eq!(row.expect, expect);
        let claims = |uuid: &str, macs: &[&str]| agent::HardwareClaims {
            macs: macs.iter().map(|m| (*m).to_owned()).collect(),
            product_uuid: uuid.to_owned(),
        };
        let right_uuid = "4C4C4544-0042-3510-8052-B4C04F4E4D32";
        for (c, reason) in [
            (
                claims("", &["52:54:00:12:34:56"]),
                JoinReason::ExpectProductUuid,
            ),
            (
                claims(
                    "00000000-0042-3510-8052-b4c04f4e4d32",
                    &["52:54:00:12:34:56"],
                ),
                JoinReason::ExpectProductUuid,
            ),
            (claims(right_uuid, &[]), JoinReason::ExpectMac),
            (
                claims(right_uuid, &["52:54:00:12:34:57"]),
                JoinReason::ExpectMac,
            ),
        ] {
            let (_, csr) = new_csr();
            let mut req = request(&f.svc, &csr, Some(&tok.expose()), Role::Node);
            req.claims = Some(c);
            assert!(matches!(f.svc.join(req), Err(ApiError::AccessDenied)));
            let events = records::list_events(f.svc.database()).unwrap();
            let last = events.last().unwrap();
            assert_eq!(last.reason.as_deref(), Some(reason.as_str()));
            assert_eq!(last.token_id.as_deref(), Some(tok.id.as_str()));
        }
        let left = tokens::list_tokens(f.svc.database()).unwrap()[0].uses_left;
        assert_eq!(left, 1, "a refusal spends no use");
        assert!(records::list_nodes(f.svc.database()).unwrap().is_empty());

        // The right machine (any case, the MAC among others) joins.
        let (_, csr) = new_csr();
        let mut req = request(&f.svc, &csr, Some(&tok.expose()), Role::Node);
        req.claims = Some(claims(
            right_uuid,
            &["02:00:00:00:00:01", "52:54:00:12:34:56"],
        ));
        f.svc.join(req).unwrap();
        assert_eq!(records::list_nodes(f.svc.database()).unwrap().len(), 1);
    }

    fn joins_with_a_token(backend: Backend) {
        use rcgen::PublicKeyData;
        let f = cp_on(backend);
        let (tok, _) = tokens::create_token(f.svc.database(), Role::Node, 1, 3_600_000).unwrap();
        let (key, csr) = new_csr();
        let resp = f
            .svc
            .join(request(&f.svc, &csr, Some(&tok.expose()), Role::Node))
            .unwrap();
        let body = open_body(&f.svc, &resp);
        assert_eq!(body.csr_sha256, bc_wire::sha256(&csr));
        assert!(body.deferral.is_none());
        bc_wire::spiffe::check_node_id(&body.node_id).unwrap();
        assert_eq!(body.chain.len(), 2);
        assert_eq!(body.chain[1], f.svc.node_ca_der());
        let (_, leaf) = x509_parser::parse_x509_certificate(&body.chain[0]).unwrap();
        assert_eq!(
            leaf.public_key().raw,
            key.subject_public_key_info().as_slice()
        );
        let cn = leaf.subject().iter_common_name().next().unwrap();
        assert_eq!(cn.as_str().unwrap(), body.node_id);

        let nodes = records::list_nodes(f.svc.database()).unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].id, body.node_id);
        let events = records::list_events(f.svc.database()).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind, records::EVENT_NODE_JOINED);
        assert_eq!(events[0].data["nodeKey"], "unattested");
        assert_eq!(events[0].token_id.as_deref(), Some(tok.id.as_str()));

        // The same token again: exhausted, the same ACCESS_DENIED.
        let (_, csr2) = new_csr();
        let err = f
            .svc
            .join(request(&f.svc, &csr2, Some(&tok.expose()), Role::Node))
            .unwrap_err();
        assert!(matches!(err, ApiError::AccessDenied));
        assert_eq!(err.public_message(), "join refused");
        assert_eq!(refusals(&f.svc), ["token-exhausted"]);
    }

    fn refusals_reach_event_and_hook_only(backend: Backend) {
        let f = cp_on(backend);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        f.svc.set_on_refusal(Box::new(move |e: &RefusalEvent| {
            s.lock().unwrap().push(e.clone())
        }));
        let (tok, _) = tokens::create_token(f.svc.database(), Role::Node, 1, 3_600_000).unwrap();
        let (_, csr) = new_csr();

        // No token.
        let err = f
            .svc
            .join(request(&f.svc, &csr, None, Role::Node))
            .unwrap_err();
        assert!(matches!(err, ApiError::AccessDenied));
        // Sealed for another CSR.
        let (_, other) = new_csr();
        let mut req = request(&f.svc, &other, Some(&tok.expose()), Role::Node);
        req.csr = csr.clone();
        assert!(matches!(f.svc.join(req), Err(ApiError::AccessDenied)));
        // Unknown attestor.
        let mut req = request(&f.svc, &csr, Some(&tok.expose()), Role::Node);
        req.attestor = "nope".into();
        assert!(matches!(f.svc.join(req), Err(ApiError::AccessDenied)));
        // A CSR whose signature does not verify.
        let mut bad = csr.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let req = request(&f.svc, &bad, Some(&tok.expose()), Role::Node);
        assert!(matches!(f.svc.join(req), Err(ApiError::AccessDenied)));
        // Not DER at all: a broken request, not a refusal.
        let req = request(&f.svc, b"garbage", None, Role::Node);
        assert!(matches!(f.svc.join(req), Err(ApiError::InvalidInput(_))));

        let want = [
            "token-missing",
            "token-unopenable",
            "join:unknown-attestor",
            "join:csr-signature",
        ];
        assert_eq!(refusals(&f.svc), want);
        let hooked: Vec<_> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.reason.as_str())
            .collect();
        // onRefusal spells every reason as the event does (`join:` included).
        assert_eq!(hooked, want);
        assert_eq!(seen.lock().unwrap()[2].attestor, "nope");
        // Nothing was spent.
        assert_eq!(
            tokens::list_tokens(f.svc.database()).unwrap()[0].uses_left,
            1
        );
        assert!(records::list_nodes(f.svc.database()).unwrap().is_empty());
    }

    fn parallel_joins_spend_a_token_once(backend: Backend) {
        let f = cp_on(backend);
        let (tok, _) = tokens::create_token(f.svc.database(), Role::Node, 1, 3_600_000).unwrap();
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let svc = f.svc.clone();
                let t = tok.expose();
                std::thread::spawn(move || {
                    let (_, csr) = new_csr();
                    svc.join(request(&svc, &csr, Some(&t), Role::Node)).is_ok()
                })
            })
            .collect();
        let ok = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|ok| *ok)
            .count();
        assert_eq!(ok, 1);
        assert_eq!(records::list_nodes(f.svc.database()).unwrap().len(), 1);
        assert_eq!(refusals(&f.svc).len(), 7);
    }

    struct Deferring;
    impl Attestor for Deferring {
        fn id(&self) -> &str {
            JOIN_TOKEN
        }
        fn verify(&self, _: &Tx<'_>, _: &AttestInput<'_>) -> Result<Verdict, Refusal> {
            Ok(Verdict::Defer(Deferral::Pending {
                request_id: "req_1".into(),
                retry_after_seconds: 30,
            }))
        }
    }

    struct BadStatement;
    impl Attestor for BadStatement {
        fn id(&self) -> &str {
            "bad-statement"
        }
        fn verify(&self, _: &Tx<'_>, _: &AttestInput<'_>) -> Result<Verdict, Refusal> {
            Ok(Verdict::Admit(Box::new(AttestationResult {
                node_key_uri: Some("urn:bc:other:1".into()),
                node_key: NodeKeyKind::Tpm,
                ..AttestationResult::default()
            })))
        }
    }

    /// Admits with whatever result the test put in.
    struct Scripted {
        id: &'static str,
        result: Mutex<AttestationResult>,
    }

    impl Scripted {
        fn new(id: &'static str) -> Arc<Self> {
            Arc::new(Scripted {
                id,
                result: Mutex::new(AttestationResult::default()),
            })
        }
        fn set(&self, r: AttestationResult) {
            *self.result.lock().unwrap() = r;
        }
    }

    impl Attestor for Scripted {
        fn id(&self) -> &str {
            self.id
        }
        fn verify(&self, _: &Tx<'_>, _: &AttestInput<'_>) -> Result<Verdict, Refusal> {
            Ok(Verdict::Admit(Box::new(
                self.result.lock().unwrap().clone(),
            )))
        }
    }

    /// Every attestor `serve` runs has its row in the role table: one
    /// forgotten would admit `node` only, silently.
    #[test]
    fn the_role_table_covers_every_attestor_serve_runs() {
        let cp = crate::test_support::cp();
        let mut ids = cp.svc.attestor_ids();
        ids.sort();
        let mut listed: Vec<String> = ATTESTOR_ROLES
            .iter()
            .map(|(id, _, _)| (*id).to_owned())
            .collect();
        listed.sort();
        assert_eq!(ids, listed);
    }

    /// A role the attestor's row does not list is refused before it runs
    /// (an unlisted attestor admits `node` only, `join:role`), and one its
    /// result narrows away after it ran, with the attestor's own reason.
    #[test]
    fn roles_are_checked_in_one_place() {
        let f = fixture();
        let a = Scripted::new("hw");
        f.svc.register_attestor(a.clone());
        let join_as = |id: &str, role: Role| {
            let (_, csr) = new_csr();
            let mut req = request(&f.svc, &csr, None, role);
            req.attestor = id.into();
            f.svc.join(req)
        };
        assert!(matches!(
            join_as("hw", Role::Site),
            Err(ApiError::AccessDenied)
        ));
        assert_eq!(*refusals(&f.svc).last().unwrap(), JoinReason::Role);
        a.set(AttestationResult {
            roles: Some(vec![Role::Site]),
            ..AttestationResult::default()
        });
        assert!(matches!(
            join_as("hw", Role::Node),
            Err(ApiError::AccessDenied)
        ));
        assert_eq!(*refusals(&f.svc).last().unwrap(), JoinReason::Role);
        assert!(records::list_nodes(f.svc.database()).unwrap().is_empty());
        a.set(AttestationResult::default());
        assert!(join_as("hw", Role::Node).is_ok());

        let x = Scripted::new(crate::attestors::cloud_iid::CLOUD_IID);
        f.svc.register_attestor(x.clone());
        x.set(AttestationResult {
            roles: Some(vec![Role::Node]),
            ..AttestationResult::default()
        });
        assert!(matches!(
            join_as("cloud-iid", Role::Site),
            Err(ApiError::AccessDenied)
        ));
        assert_eq!(refusals(&f.svc).last().unwrap(), "cloud-role");
        x.set(AttestationResult {
            roles: Some(vec![Role::Node, Role::Site]),
            ..AttestationResult::default()
        });
        assert!(join_as("cloud-iid", Role::Site).is_ok());
    }

    fn scripted_join(f: &Fixture, id: &str) -> Result<JoinResponseBody, ApiError> {
        let (_, csr) = new_csr();
        let mut req = request(&f.svc, &csr, None, Role::Node);
        req.attestor = id.into();
        f.svc.join(req).map(|r| open_body(&f.svc, &r))
    }

    fn binding(key: &str) -> Option<crate::attestor::Binding> {
        Some(crate::attestor::Binding {
            kind: crate::attestor::BINDING_TPM_EK.into(),
            key: key.into(),
        })
    }

    #[test]
    fn bindings_admit_only_their_node() {
        let f = fixture();
        let a = Scripted::new("hw");
        f.svc.register_attestor(a.clone());
        a.set(AttestationResult {
            binding: binding("k1"),
            ..Default::default()
        });
        let node_a = scripted_join(&f, "hw").unwrap().node_id;
        let b = records::list_bindings(f.svc.database()).unwrap();
        assert_eq!(
            (b.len(), b[0].node_id.as_str(), b[0].key.as_str()),
            (1, node_a.as_str(), "k1")
        );

        // The same key for a new node: refused.
        assert!(matches!(
            scripted_join(&f, "hw"),
            Err(ApiError::AccessDenied)
        ));
        // The same key reclaiming its node: fine, and the binding is kept.
        a.set(AttestationResult {
            reclaim_node_id: Some(node_a.clone()),
            binding: binding("k1"),
            ..Default::default()
        });
        assert_eq!(scripted_join(&f, "hw").unwrap().node_id, node_a);
        // The key bound to A, joining as B.
        a.set(AttestationResult::default());
        let node_b = scripted_join(&f, "hw").unwrap().node_id;
        a.set(AttestationResult {
            reclaim_node_id: Some(node_b.clone()),
            binding: binding("k1"),
            ..Default::default()
        });
        assert!(matches!(
            scripted_join(&f, "hw"),
            Err(ApiError::AccessDenied)
        ));
        // Another key of the same kind for A, which already has one.
        a.set(AttestationResult {
            reclaim_node_id: Some(node_a.clone()),
            binding: binding("k2"),
            ..Default::default()
        });
        assert!(matches!(
            scripted_join(&f, "hw"),
            Err(ApiError::AccessDenied)
        ));
        assert_eq!(
            refusals(&f.svc),
            [
                JoinReason::BoundElsewhere,
                JoinReason::BoundElsewhere,
                JoinReason::BoundElsewhere
            ]
        );
        assert_eq!(records::list_bindings(f.svc.database()).unwrap().len(), 1);
        let nodes = records::list_nodes(f.svc.database()).unwrap();
        assert_eq!(nodes.len(), 2);
        let gen_a = nodes
            .iter()
            .find(|n| n.id == node_a)
            .unwrap()
            .identity_generation;
        assert_eq!(gen_a, 2);
    }

    #[test]
    fn pool_policy_refuses_unlisted_attestors_before_writing() {
        let f = fixture();
        let known = ["join-token", "tpm"];
        crate::pools::create_pool(
            f.svc.database(),
            "metal",
            "alice",
            Some(&["tpm".to_owned()]),
            &known,
        )
        .unwrap();
        let (tok, _) =
            tokens::create_token_in_pool(f.svc.database(), Role::Node, 2, 3_600_000, Some("metal"))
                .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        f.svc.set_on_refusal(Box::new(move |e: &RefusalEvent| {
            s.lock().unwrap().push(e.clone())
        }));
        let (_, csr) = new_csr();
        let err = f
            .svc
            .join(request(&f.svc, &csr, Some(&tok.expose()), Role::Node))
            .unwrap_err();
        assert!(matches!(err, ApiError::AccessDenied));
        let events = records::list_events(f.svc.database()).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(
            events[0].reason.as_deref(),
            Some(JoinReason::PoolAttestor.as_str())
        );
        assert_eq!(events[0].attestor.as_deref(), Some("join-token"));
        assert_eq!(events[0].token_id.as_deref(), Some(tok.id.as_str()));
        assert_eq!(events[0].data["poolOwner"], "alice");
        assert_eq!(events[0].data["poolId"], "metal");
        assert_eq!(seen.lock().unwrap()[0].pool_owner.as_deref(), Some("alice"));
        assert_eq!(
            seen.lock().unwrap()[0].reason,
            JoinReason::PoolAttestor,
            "onRefusal: the event's spelling"
        );
        // Nothing written, nothing spent.
        assert!(records::list_nodes(f.svc.database()).unwrap().is_empty());
        assert_eq!(
            tokens::list_tokens(f.svc.database()).unwrap()[0].uses_left,
            2
        );

        // Listing join-token too admits it, into that pool.
        crate::pools::set_join_attestors(
            f.svc.database(),
            "metal",
            Some(&["join-token".to_owned(), "tpm".to_owned()]),
            &known,
        )
        .unwrap();
        let body = open_body(
            &f.svc,
            &f.svc
                .join(request(&f.svc, &csr, Some(&tok.expose()), Role::Node))
                .unwrap(),
        );
        let nodes = records::list_nodes(f.svc.database()).unwrap();
        assert_eq!(
            (nodes[0].id.as_str(), nodes[0].pool_id.as_str()),
            (body.node_id.as_str(), "metal")
        );
        let joins = records::list_joins(f.svc.database()).unwrap();
        assert_eq!(joins.len(), 1);
        assert_eq!(
            (joins[0].node_key.as_str(), joins[0].identity_generation),
            ("unattested", 1)
        );

        // A reclaim checks the node's pool, not the one the attestor names.
        crate::pools::set_join_attestors(
            f.svc.database(),
            "metal",
            Some(&["tpm".to_owned()]),
            &known,
        )
        .unwrap();
        let a = Scripted::new("join-token");
        f.svc.register_attestor(a.clone());
        a.set(AttestationResult {
            reclaim_node_id: Some(body.node_id.clone()),
            pool_id: Some("default".into()),
            ..Default::default()
        });
        assert!(matches!(scripted_join(&f, ""), Err(ApiError::AccessDenied)));
        assert_eq!(
            refusals(&f.svc),
            [JoinReason::PoolAttestor, JoinReason::PoolAttestor]
        );
        assert_eq!(
            records::list_nodes(f.svc.database()).unwrap()[0].identity_generation,
            1
        );
        // An attestor resolving a pool that does not exist.
        a.set(AttestationResult {
            pool_id: Some("nope".into()),
            ..Default::default()
        });
        assert!(matches!(scripted_join(&f, ""), Err(ApiError::AccessDenied)));
        assert_eq!(refusals(&f.svc)[2], JoinReason::UnknownPool);
    }

    #[test]
    fn only_parseable_ak_statements_are_written() {
        let f = fixture();
        let a = Scripted::new("st");
        f.svc.register_attestor(a.clone());
        for bad in [
            "urn:bc:tpm-ak:sha256:zz",
            "urn:bc:tpm-ak:sha1:00",
            "urn:bc:tpm-akx",
            "spiffe://bc.test/node/node_x",
        ] {
            a.set(AttestationResult {
                node_key_uri: Some(bad.into()),
                node_key: NodeKeyKind::Tpm,
                ..Default::default()
            });
            assert!(
                matches!(scripted_join(&f, "st"), Err(ApiError::AccessDenied)),
                "{bad}"
            );
        }
        assert_eq!(refusals(&f.svc), [JoinReason::NodeKeyStatement; 4]);
        let good = bc_wire::tpm::ak_statement(&[&[0u8, 0x0b][..], &[0xab; 32]].concat()).unwrap();
        a.set(AttestationResult {
            node_key_uri: Some(good.clone()),
            node_key: NodeKeyKind::Tpm,
            ..Default::default()
        });
        let body = scripted_join(&f, "st").unwrap();
        let uris = uri_sans(&body.chain[0]);
        assert_eq!(
            uris,
            [format!("spiffe://bc.test/node/{}", body.node_id), good]
        );
        let events = records::list_events(f.svc.database()).unwrap();
        assert_eq!(events.last().unwrap().data["nodeKey"], "tpm");
        assert_eq!(
            records::list_joins(f.svc.database()).unwrap()[0].node_key,
            "tpm"
        );
    }

    #[test]
    fn registered_join_token_replaces_builtin_and_defers() {
        let f = fixture();
        f.svc.register_attestor(Arc::new(Deferring));
        let (_, csr) = new_csr();
        let resp = f.svc.join(request(&f.svc, &csr, None, Role::Node)).unwrap();
        let body = open_body(&f.svc, &resp);
        assert!(body.node_id.is_empty() && body.chain.is_empty());
        assert_eq!(
            body.deferral,
            Some(join_response_body::Deferral::Pending(agent::JoinPending {
                request_id: "req_1".into(),
                retry_after_seconds: 30
            }))
        );
        assert!(records::list_nodes(f.svc.database()).unwrap().is_empty());
    }

    #[test]
    fn unknown_statement_is_refused() {
        let f = fixture();
        f.svc.register_attestor(Arc::new(BadStatement));
        let (_, csr) = new_csr();
        let mut req = request(&f.svc, &csr, None, Role::Node);
        req.attestor = "bad-statement".into();
        assert!(matches!(f.svc.join(req), Err(ApiError::AccessDenied)));
        assert_eq!(refusals(&f.svc), [JoinReason::NodeKeyStatement]);
        assert!(records::list_nodes(f.svc.database()).unwrap().is_empty());
    }
}
