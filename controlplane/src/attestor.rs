//! The one verifier interface every attestor implements.
//!
//! JoinService decodes the request, verifies the CSR, opens the sealed token,
//! and then, inside its join transaction, asks the attestor named by the
//! request. The attestor answers with a result (admit this machine, maybe as
//! an existing node), a deferral (a challenge or a pending approval), or a
//! refusal with a reason. JoinService does everything else (node rows,
//! certificates, events, signing), so tpm, x509pop, discovery and provisioned
//! plug in here without touching it.

use std::collections::BTreeMap;
use std::sync::Arc;

use bc_wire::agent::{HardwareClaims, Role, TpmAttestation};
use bc_wire::token::JoinToken;

use crate::reason::AnyReason;
use crate::store::{Tx, UnixMs};

/// The id of the built-in attestor, and what an empty `JoinRequest.attestor` means.
pub const JOIN_TOKEN: &str = "join-token";

/// An attestor: verifies one kind of evidence inside the join transaction.
pub trait Attestor: Send + Sync {
    /// The id a `JoinRequest.attestor` names it by.
    fn id(&self) -> &str;
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

/// Where a tpm join's EK certificate came from, as a level a pool can
/// require (`pools update --min-ek-assurance`). Every level but `pinned`
/// is a maker's certificate verified against the configured roots in
/// exactly the same way; the order ranks how the certificate reached the
/// verifier:
///
/// `pinned` < `operator-file` < `maker-service` < `nv-chain` = `nv`
///
/// * `pinned`: no certificate; an operator pinned the EK's hash (`resolve
///   add --uncertified`). Nothing says the key is a real TPM's.
/// * `operator-file`: `[tpm] ek_certificate`, a file someone with root on
///   the machine put there; what arrives that way (vendor manifests,
///   downloads) is also what most often chains to an anchor added for
///   another reason (an OEM's CA).
/// * `maker-service`: fetched by the control plane itself from the maker's
///   service by the EK's hash (reserved: no fetcher yet).
/// * `nv`, `nv-chain`: the certificate the maker wrote into the TPM
///   (`nv-chain`: with intermediates from the TPM's chain indices, which
///   are untrusted anyway: the path must still end at an anchor, so the
///   two rank equal). NV vs file is the agent's report; a machine that
///   lies gains nothing it could not get with the same certificate in NV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EkAssurance {
    Pinned,
    OperatorFile,
    MakerService,
    NvChain,
    Nv,
}

impl EkAssurance {
    pub const ALL: [EkAssurance; 5] = [
        EkAssurance::Pinned,
        EkAssurance::OperatorFile,
        EkAssurance::MakerService,
        EkAssurance::NvChain,
        EkAssurance::Nv,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EkAssurance::Pinned => "pinned",
            EkAssurance::OperatorFile => "operator-file",
            EkAssurance::MakerService => "maker-service",
            EkAssurance::NvChain => "nv-chain",
            EkAssurance::Nv => "nv",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        EkAssurance::ALL.into_iter().find(|a| a.as_str() == s)
    }

    /// The order a pool's minimum compares by (`nv-chain` = `nv`).
    pub fn rank(self) -> u8 {
        match self {
            EkAssurance::Pinned => 0,
            EkAssurance::OperatorFile => 1,
            EkAssurance::MakerService => 2,
            EkAssurance::NvChain | EkAssurance::Nv => 3,
        }
    }

    /// Whether this level meets a pool's minimum.
    pub fn meets(self, min: EkAssurance) -> bool {
        self.rank() >= min.rank()
    }
}

/// A hardware key that identifies one machine for good (e.g. its TPM's EK).
/// JoinService binds it to the admitted node (`node_bindings`): a later join
/// proving it reclaims that node, and it never admits another one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// What kind of key, e.g. [`BINDING_TPM_EK`].
    pub kind: String,
    /// The key's identifier within its kind (lowercase hex of a digest).
    pub key: String,
}

/// The binding kind of a TPM endorsement key: the key is the SHA-256 of the
/// EK certificate's SubjectPublicKeyInfo DER, in lowercase hex.
pub const BINDING_TPM_EK: &str = "tpm-ek";

/// An admitted machine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttestationResult {
    /// An existing node this machine is (a reclaim): JoinService raises its
    /// identity generation and revokes its older certificates.
    pub reclaim_node_id: Option<String>,
    /// The token that admitted it, if any.
    pub token_id: Option<String>,
    /// A `urn:bc:` statement about the node key (the TPM AK), written into
    /// the certificate after the SPIFFE ID.
    pub node_key_uri: Option<String>,
    pub node_key: NodeKeyKind,
    /// A tpm join's: where its EK certificate came from (None: the join
    /// proved no EK).
    pub ek_assurance: Option<EkAssurance>,
    /// The pool a new node joins (`None`: the token's, else `default`). A
    /// reclaim ignores it: a node stays in its pool.
    pub pool_id: Option<String>,
    /// The machine's hardware key, bound to the node on admission.
    pub binding: Option<Binding>,
    /// The EK this join proved (ActivateCredential), as the lowercase hex
    /// SHA-256 of its SubjectPublicKeyInfo: a tpm join's, which it also
    /// binds, or a PXE ramdisk's that proved its TPM beside discovery, which
    /// is recorded as the ramdisk node's hardware key but never bound (the
    /// machine's installed node holds that binding). `None`: no EK proven.
    pub ek_sha256: Option<String>,
    /// The expect binding of the token that admitted it. JoinService, not
    /// each attestor, compares it with the request's claims, so every
    /// token-based attestor enforces it the same way.
    pub expect: Expect,
    /// What a new node is scoped to: its site (a site token's, a
    /// ramdisk's), the command kinds it may be sent, the longest
    /// certificate it may hold. `None`: unscoped. Boxed: it is rare.
    pub scope: Option<Box<crate::records::NodeScope>>,
    /// The product UUID the attestor proved or an operator bound (normalized):
    /// a provisioned token's bound machine. Never a UUID the machine merely
    /// claims (a TPM join's, a discovery assertion's). Recorded as the node's
    /// trusted hardware key unless it is a placeholder ([`crate::hardware`]).
    pub proven_product_uuid: Option<String>,
    /// The token allows reclaiming the live node that holds this machine's
    /// hardware key (`token create --allow-reclaim`).
    pub allow_reclaim: bool,
    /// The roles this machine may join as, narrower than what its attestor
    /// admits at all (JoinService's table, `join::check_role`): its token's
    /// role, the role its place fixes, what its resolve row allows. `None`:
    /// any of the attestor's.
    pub roles: Option<Vec<Role>>,
}

/// The machine a token was minted for (`token create --expect-*`): values
/// normalized to lowercase, `None` when the token does not bind that field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expect {
    /// `8-4-4-4-12` hex, as [`normalize_product_uuid`] returns it.
    pub product_uuid: Option<String>,
    /// `aa:bb:cc:dd:ee:ff`, as [`normalize_mac`] returns it.
    pub mac: Option<String>,
}

/// A claim that does not satisfy an [`Expect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpectMismatch {
    /// The claimed product UUID is empty or another one.
    ProductUuid,
    /// The expected MAC is not among the claimed ones.
    Mac,
}

impl Expect {
    /// Whether `claims` satisfy this binding. Claims are the agent's word,
    /// so they are compared after the same normalization as the expected
    /// values (case, surrounding space), and a malformed one matches nothing.
    pub fn check(&self, claims: &HardwareClaims) -> Result<(), ExpectMismatch> {
        if let Some(want) = &self.product_uuid {
            if normalize_product_uuid(&claims.product_uuid).ok().as_ref() != Some(want) {
                return Err(ExpectMismatch::ProductUuid);
            }
        }
        if let Some(want) = &self.mac {
            let found = claims
                .macs
                .iter()
                .any(|m| normalize_mac(m).ok().as_ref() == Some(want));
            if !found {
                return Err(ExpectMismatch::Mac);
            }
        }
        Ok(())
    }
}

/// A malformed expect value (operator input).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExpectFormatError {
    #[error("{0:?} is not a product UUID (8-4-4-4-12 hex digits, e.g. 4c4c4544-0042-3510-8052-b4c04f4e4d32)")]
    ProductUuid(String),
    #[error("{0:?} is not a MAC address (six hex pairs separated by ':', e.g. 52:54:00:12:34:56)")]
    Mac(String),
}

/// A product UUID in the one form tokens store and claims are compared in:
/// `8-4-4-4-12` hex digits, lowercase (DMI and vendors print either case).
pub fn normalize_product_uuid(s: &str) -> Result<String, ExpectFormatError> {
    let t = s.trim();
    let bad = || ExpectFormatError::ProductUuid(printable_input(s));
    let groups: Vec<&str> = t.split('-').collect();
    let lens = [8, 4, 4, 4, 12];
    if groups.len() != lens.len()
        || groups
            .iter()
            .zip(lens)
            .any(|(g, n)| g.len() != n || !g.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(bad());
    }
    Ok(t.to_ascii_lowercase())
}

/// A MAC in the one form tokens store and claims are compared in: six hex
/// pairs separated by `:`, lowercase.
pub fn normalize_mac(s: &str) -> Result<String, ExpectFormatError> {
    let t = s.trim();
    let pairs: Vec<&str> = t.split(':').collect();
    if pairs.len() != 6
        || pairs
            .iter()
            .any(|p| p.len() != 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(ExpectFormatError::Mac(printable_input(s)));
    }
    Ok(t.to_ascii_lowercase())
}

/// Operator or agent input quoted in an error: bounded, so a huge claim
/// cannot flood a log line.
fn printable_input(s: &str) -> String {
    s.chars().take(64).collect()
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
        attestor: String,
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
    fault: Option<Fault>,
}

crate::reason::reasons! {
    /// The reason a [`Refusal::fault`] carries: never recorded nor logged as
    /// a refusal (JoinService answers UNAVAILABLE or INTERNAL), so in no
    /// listing.
    pub enum Unrecorded in "fault" {
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
            fault: Some(fault),
        }
    }

    pub fn as_fault(&self) -> Option<&Fault> {
        self.fault.as_ref()
    }

    pub fn with_token(mut self, token_id: Option<&str>) -> Self {
        self.token_id = token_id.map(str::to_owned);
        self
    }

    pub fn with_node(mut self, node_id: Option<&str>) -> Self {
        self.node_id = node_id.map(str::to_owned);
        self
    }

    pub fn with_pool(mut self, id: &str, owner: &str) -> Self {
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

/// The attestors a JoinService runs, by id. `join-token` is always there;
/// registering another with that id replaces it.
#[derive(Clone)]
pub struct AttestorRegistry {
    by_id: BTreeMap<String, Arc<dyn Attestor>>,
}

impl Default for AttestorRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl AttestorRegistry {
    pub fn new() -> Self {
        let mut r = AttestorRegistry {
            by_id: BTreeMap::new(),
        };
        r.register(Arc::new(crate::attestors::join_token::JoinTokenAttestor));
        r
    }

    /// Adds an attestor, replacing one of the same id.
    pub fn register(&mut self, attestor: Arc<dyn Attestor>) {
        self.by_id.insert(attestor.id().to_owned(), attestor);
    }

    /// The attestor a request names; an empty name means `join-token`.
    pub fn get(&self, id: &str) -> Option<Arc<dyn Attestor>> {
        let id = if id.is_empty() { JOIN_TOKEN } else { id };
        self.by_id.get(id).cloned()
    }

    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.by_id.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expect_values_are_validated_and_normalized() {
        assert_eq!(
            normalize_product_uuid(" 4C4C4544-0042-3510-8052-B4C04F4E4D32\n").unwrap(),
            "4c4c4544-0042-3510-8052-b4c04f4e4d32"
        );
        assert_eq!(
            normalize_mac("52:54:00:AB:cd:EF").unwrap(),
            "52:54:00:ab:cd:ef"
        );
        for bad in [
            "",
            "4c4c4544004235108052b4c04f4e4d32",
            "4c4c4544-0042-3510-8052-b4c04f4e4d3",
            "4c4c4544-0042-3510-8052-b4c04f4e4d32-00",
            "4c4c454-40042-3510-8052-b4c04f4e4d32",
            "gc4c4544-0042-3510-8052-b4c04f4e4d32",
            "+c4c4544-0042-3510-8052-b4c04f4e4d32",
        ] {
            assert!(
                matches!(
                    normalize_product_uuid(bad),
                    Err(ExpectFormatError::ProductUuid(_))
                ),
                "{bad:?}"
            );
        }
        for bad in [
            "",
            "52:54:00:12:34",
            "52:54:00:12:34:56:78",
            "52-54-00-12-34-56",
            "525400123456",
            "52:54:00:12:34:5g",
            "52:54:00:12:34:056",
            "5:54:00:12:34:56",
            "+2:54:00:12:34:56",
        ] {
            assert!(
                matches!(normalize_mac(bad), Err(ExpectFormatError::Mac(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn expect_check_compares_normalized_claims() {
        let claims = HardwareClaims {
            macs: vec!["not a mac".into(), "52:54:00:AB:CD:EF".into()],
            product_uuid: "4C4C4544-0042-3510-8052-B4C04F4E4D32".into(),
        };
        assert_eq!(Expect::default().check(&HardwareClaims::default()), Ok(()));
        let both = Expect {
            product_uuid: Some("4c4c4544-0042-3510-8052-b4c04f4e4d32".into()),
            mac: Some("52:54:00:ab:cd:ef".into()),
        };
        assert_eq!(both.check(&claims), Ok(()));
        assert_eq!(
            both.check(&HardwareClaims::default()),
            Err(ExpectMismatch::ProductUuid)
        );
        let other_mac = Expect {
            mac: Some("52:54:00:ab:cd:ee".into()),
            ..Expect::default()
        };
        assert_eq!(other_mac.check(&claims), Err(ExpectMismatch::Mac));
    }
}
