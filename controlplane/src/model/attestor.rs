//! The one verifier interface every attestor implements.
//!
//! JoinService decodes the request, verifies the CSR, opens the sealed token,
//! and then, inside its join transaction, asks the attestor named by the
//! request. The attestor answers with a result (admit this machine, maybe as
//! an existing node), a deferral (a challenge or a pending approval), or a
//! refusal with a reason. JoinService does everything else (node rows,
//! certificates, events, signing), so tpm, x509pop, discovery and provisioned
//! plug in here without touching it.

use bc_wire::agent::{HardwareClaims, Role, TpmAttestation};
use bc_wire::token::JoinToken;
use bc_wire::AttestorId;

use crate::model::machine::{Binding, EkAssurance, Expect, BINDING_TPM_EK};
use crate::reason::AnyReason;
use crate::store::{Tx, UnixMs};

/// An attestor: verifies one kind of evidence inside the join transaction.
pub trait Attestor: Send + Sync {
    /// The id a `JoinRequest.attestor` names it by.
    fn id(&self) -> AttestorId;
    /// Runs inside the join transaction (BEGIN IMMEDIATE: the write lock is
    /// held). Whatever it writes is committed only on `Admit` or `Defer`.
    fn verify(&self, tx: &Tx<'_>, input: &AttestInput<'_>) -> Result<Verdict, Refusal>;
    /// Runs between two runs of the join transaction, with no lock held,
    /// when `verify` answered [`Verdict::Prepare`]: what must not hold the
    /// write lock (the tpm attestor's fetch of an EK certificate from its
    /// maker's service), asked for only once `verify` has checked what
    /// comes before it. What it returns reaches the second `verify` as
    /// [`AttestInput::prepared`]; a refusal here refuses the join like one
    /// from `verify`. `source` is the request's address. Default: an
    /// attestor that never asks is never called.
    fn prepare(
        &self,
        _db: &crate::store::Store,
        _work: &Work,
        _source: Option<std::net::IpAddr>,
    ) -> Result<Prepared, Refusal> {
        Err(Refusal::fault(Fault::Internal(format!(
            "attestor {} asked for work outside the transaction it cannot do",
            self.id()
        ))))
    }
    /// Whether it reads `JoinRequest.tpm`, the machine's TPM proving itself
    /// beside this attestor's own evidence (`discovery`). JoinService refuses
    /// the field as INVALID_INPUT for every other attestor.
    fn takes_tpm_evidence(&self) -> bool {
        false
    }
    /// The roles it admits at all, and the reason it refuses another with.
    /// Default (a plugin's attestor): `node` only, refused as `join:role`.
    fn roles(&self) -> Roles {
        Roles {
            admits: &[Role::Node],
            refusal: None,
        }
    }
}

/// Which roles an attestor admits, and the reason any other is refused
/// with: docs/control-plane.md's table, one row in each attestor, enforced by
/// JoinService alone (bar discovery's own first check, which says the
/// same). A result may narrow it further ([`AttestationResult::roles`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Roles {
    pub admits: &'static [Role],
    /// `None`: JoinService's own `join:role`.
    pub refusal: Option<AnyReason>,
}

/// What an attestor's [`Attestor::prepare`] handed to its `verify`:
/// opaque to JoinService.
#[derive(Default)]
pub struct Prepared(Option<Box<dyn std::any::Any + Send + Sync>>);

impl Prepared {
    pub fn new<T: std::any::Any + Send + Sync>(value: T) -> Self {
        Prepared(Some(Box::new(value)))
    }

    /// The value, if `prepare` left one of type `T`.
    pub fn get<T: std::any::Any>(&self) -> Option<&T> {
        self.0.as_ref().and_then(|v| v.downcast_ref())
    }
}

/// What `verify` asks done outside the transaction ([`Verdict::Prepare`]):
/// opaque to JoinService, handed to the attestor's [`Attestor::prepare`].
pub struct Work(Box<dyn std::any::Any + Send + Sync>);

impl Work {
    pub fn new<T: std::any::Any + Send + Sync>(value: T) -> Self {
        Work(Box::new(value))
    }

    /// The work, if it is of type `T`.
    pub fn get<T: std::any::Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

/// The sealed token of a request, once opened.
pub enum OpenedToken {
    Parsed(JoinToken),
    /// It opened, but the plaintext is not `tok_<id>.<secret>`.
    Malformed,
}

/// What an attestor gets to decide on.
pub struct AttestInput<'a> {
    pub role: Role,
    /// `JoinRequest.attestation`, the attestor's own evidence.
    pub evidence: &'a [u8],
    /// The sealed token, opened; `None` when the request carried none.
    pub token: Option<&'a OpenedToken>,
    /// The verified CSR, DER.
    pub csr_der: &'a [u8],
    pub csr_sha256: [u8; 32],
    /// The CSR's SubjectPublicKeyInfo (the node key), DER: a key
    /// certification must name exactly this key.
    pub csr_spki_der: &'a [u8],
    /// SHA-256 of the CSR's SubjectPublicKeyInfo (the node key).
    pub csr_spki_sha256: [u8; 32],
    pub claims: &'a HardwareClaims,
    /// `JoinRequest.tpm`, for an attestor that [`Attestor::takes_tpm_evidence`].
    pub tpm: Option<&'a TpmAttestation>,
    /// The database's time at the start of the transaction.
    pub now: UnixMs,
    /// The address the request came from (`None`: not over TCP), recorded
    /// where an operator decides on the join (a discovery join request).
    pub source: Option<std::net::IpAddr>,
    /// What the attestor's [`Attestor::prepare`] returned for this request
    /// (nothing in the first run).
    pub prepared: &'a Prepared,
}

pub enum Verdict {
    /// Boxed: a result is several times a deferral's size.
    Admit(Box<AttestationResult>),
    Defer(Deferral),
    /// Not yet: do this outside the transaction ([`Attestor::prepare`],
    /// once), then verify again with its outcome. The transaction is
    /// rolled back.
    Prepare(Work),
}

/// Who holds the node key, as far as the attestor proved it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NodeKeyKind {
    /// A TPM certified the key (made in the TPM, cannot leave it).
    Tpm,
    /// Only the agent's word.
    #[default]
    Unattested,
}

impl NodeKeyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKeyKind::Tpm => "tpm",
            NodeKeyKind::Unattested => "unattested",
        }
    }
}

/// Who holds the node key, and what the certificate says about it: one
/// value, so that a statement comes only with the key it is about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NodeKey {
    /// Only the agent's word.
    #[default]
    Unattested,
    /// A TPM certified the key (made in the TPM, cannot leave it).
    Tpm {
        /// A `urn:bc:` statement about the key (the TPM AK), written into
        /// the certificate after the SPIFFE ID.
        statement: String,
    },
}

impl NodeKey {
    pub fn kind(&self) -> NodeKeyKind {
        match self {
            NodeKey::Unattested => NodeKeyKind::Unattested,
            NodeKey::Tpm { .. } => NodeKeyKind::Tpm,
        }
    }

    pub fn statement(&self) -> Option<&str> {
        match self {
            NodeKey::Unattested => None,
            NodeKey::Tpm { statement } => Some(statement),
        }
    }
}

/// An EK a join proved (ActivateCredential): its hash, where its
/// certificate came from, and whether the node is bound to it. One value,
/// so that an assurance or a binding comes only with the EK it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProvenEk {
    /// The lowercase hex SHA-256 of its SubjectPublicKeyInfo.
    pub sha256: String,
    /// Where its certificate came from (`None`: no level the state names).
    pub assurance: Option<EkAssurance>,
    /// A tpm join's EK is bound to the node; a PXE ramdisk's that proved
    /// its TPM beside discovery is recorded as the ramdisk node's hardware
    /// key but never bound (the machine's installed node holds that
    /// binding).
    pub bound: bool,
}

impl ProvenEk {
    /// The binding JoinService writes, if the EK is bound.
    pub fn binding(&self) -> Option<Binding> {
        self.bound.then(|| Binding {
            kind: BINDING_TPM_EK.to_owned(),
            key: self.sha256.clone(),
        })
    }
}

/// An admitted machine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttestationResult {
    /// An existing node this machine is (a reclaim): JoinService raises its
    /// identity generation and revokes its older certificates.
    pub reclaim_node_id: Option<String>,
    /// The token that admitted it, if any.
    pub token_id: Option<String>,
    pub node_key: NodeKey,
    /// The pool a new node joins (`None`: the token's, else `default`). A
    /// reclaim ignores it: a node stays in its pool.
    pub pool_id: Option<String>,
    /// The EK this join proved. `None`: no EK proven.
    pub ek: Option<ProvenEk>,
    /// The expect binding of the token that admitted it. JoinService, not
    /// each attestor, compares it with the request's claims, so every
    /// token-based attestor enforces it the same way.
    pub expect: Expect,
    /// What a new node is scoped to: its site (a site token's, a
    /// ramdisk's), the command kinds it may be sent, the longest
    /// certificate it may hold. `None`: unscoped. Boxed: it is rare.
    pub scope: Option<Box<crate::model::records::NodeScope>>,
    /// The product UUID the attestor proved or an operator bound (normalized):
    /// a provisioned token's bound machine. Never a UUID the machine merely
    /// claims (a TPM join's, a discovery assertion's). Recorded as the node's
    /// trusted hardware key unless it is a placeholder ([`crate::model::hardware`]).
    pub proven_product_uuid: Option<String>,
    /// The token allows reclaiming the live node that holds this machine's
    /// hardware key (`token create --allow-reclaim`).
    pub allow_reclaim: bool,
    /// The roles this machine may join as, narrower than what its attestor
    /// admits at all ([`Attestor::roles`], `join::check_role`): its token's
    /// role, the role its place fixes, what its resolve row allows. `None`:
    /// any of the attestor's.
    pub roles: Option<Vec<Role>>,
    /// The reclaimed node may change role between `node` and `ramdisk`: a
    /// workflow's ramdisk joins as its node, and the installed system's
    /// provisioned join makes it a node again (docs/workflows.md). The node
    /// then takes this result's scope, as a new node would.
    pub change_role: bool,
    /// The boot the pool's boot policy verified (a tpm join under one),
    /// recorded as the node's last verified boot. Boxed: it is rare.
    pub boot: Option<Box<crate::model::node_boot::VerifiedBoot>>,
}

impl AttestationResult {
    /// The machine's hardware key, bound to the node on admission.
    pub fn binding(&self) -> Option<Binding> {
        self.ek.as_ref().and_then(ProvenEk::binding)
    }

    /// Where the proven EK's certificate came from (`None`: no EK proven).
    pub fn ek_assurance(&self) -> Option<EkAssurance> {
        self.ek.as_ref().and_then(|e| e.assurance)
    }
}

/// Not decided yet: the agent re-sends `Join` with the same CSR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deferral {
    /// Waiting for an operator (e.g. a join request to approve).
    Pending {
        request_id: String,
        retry_after_seconds: u32,
    },
    /// The agent must answer `payload` (e.g. a TPM credential challenge).
    Challenge {
        attestor: AttestorId,
        payload: Vec<u8>,
        not_after: UnixMs,
    },
}

/// A refused join. The reason never reaches the agent.
///
/// An attestor that cannot decide because the server failed (its database
/// query did) returns [`Refusal::fault`] instead: JoinService then answers
/// UNAVAILABLE or INTERNAL and records no refusal, because the machine was
/// not refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: AnyReason,
    pub token_id: Option<String>,
    pub node_id: Option<String>,
    /// The pool whose policy refused the machine, and its owner: the
    /// refusal is attributed to them (`pool-attestor`).
    /// Boxed: a refusal travels in every `Err` of the join path.
    pub pool: Option<Box<PoolRef>>,
    /// What exactly failed, for the operator (`security.join.refused`'s
    /// `data.detail` and `data.eventIndex`): the digest or value, and the
    /// event log's event that decided it. Boxed as `pool` is.
    pub detail: Option<Box<RefusalDetail>>,
    /// Boxed: rare, and a refusal must stay small.
    fault: Option<Box<Fault>>,
}

/// A refusal's detail: what was wrong, and where in the event log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusalDetail {
    pub detail: String,
    /// The index of the event log's event (the first, Spec ID, event is 0).
    pub event: Option<usize>,
}

crate::reason::reasons! {
    /// The reason a [`Refusal::fault`] carries: never recorded nor logged as
    /// a refusal (JoinService answers UNAVAILABLE or INTERNAL), so in no
    /// listing.
    pub(crate) enum Unrecorded in "fault" {
        ServerFault = "server-fault",
    }
}

/// A pool named in a refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolRef {
    pub id: String,
    pub owner: String,
}

/// A server-side failure during attestation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Transient (the database is busy): the agent may retry.
    Unavailable(String),
    Internal(String),
}

impl Refusal {
    pub fn new(reason: impl Into<AnyReason>) -> Self {
        Refusal {
            reason: reason.into(),
            token_id: None,
            node_id: None,
            pool: None,
            detail: None,
            fault: None,
        }
    }

    /// Not a refusal: the server failed while deciding.
    pub fn fault(fault: Fault) -> Self {
        Refusal {
            reason: Unrecorded::ServerFault.any(),
            token_id: None,
            node_id: None,
            pool: None,
            detail: None,
            fault: Some(Box::new(fault)),
        }
    }

    pub(crate) fn as_fault(&self) -> Option<&Fault> {
        self.fault.as_deref()
    }

    pub(crate) fn with_token(mut self, token_id: Option<&str>) -> Self {
        self.token_id = token_id.map(str::to_owned);
        self
    }

    pub(crate) fn with_node(mut self, node_id: Option<&str>) -> Self {
        self.node_id = node_id.map(str::to_owned);
        self
    }

    pub(crate) fn with_detail(mut self, detail: String, event: Option<usize>) -> Self {
        self.detail = Some(Box::new(RefusalDetail { detail, event }));
        self
    }

    pub(crate) fn with_pool(mut self, id: &str, owner: &str) -> Self {
        self.pool = Some(Box::new(PoolRef {
            id: id.to_owned(),
            owner: owner.to_owned(),
        }));
        self
    }
}

impl From<crate::store::DbError> for Refusal {
    fn from(e: crate::store::DbError) -> Self {
        Refusal::fault(match e {
            e if e.is_transient() => Fault::Unavailable(e.to_string()),
            other => Fault::Internal(other.to_string()),
        })
    }
}
