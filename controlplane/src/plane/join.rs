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
//! ([`crate::model::eventlog`]: a `security.join.refused` event, identical ones
//! aggregated per minute, written by one writer thread), logged, passed to the
//! `on_refusal` hook, and answered as the same ACCESS_DENIED.

use std::net::IpAddr;

use bc_wire::agent::{self, join_response_body, JoinRequest, JoinResponse, JoinResponseBody, Role};
use bc_wire::signing::{self, Purpose};
use bc_wire::token::JoinToken;
use bc_wire::AttestorId;
use prost::Message;
use time::Duration;

use crate::model::attestor::{
    AttestInput, AttestationResult, Attestor, Deferral, Fault, OpenedToken, Prepared, Refusal,
    Verdict,
};
use crate::model::eventlog::Refused;
use crate::model::hardware::check_expect;
use crate::model::join_reasons::JoinReason;
use crate::model::machine::Binding;
use crate::model::records::{self, JoinRow, NewEvent, NodeRow};
use crate::model::{hardware, pools};
use crate::pki::NodeCertSpec;
use crate::plane::api_error::ApiError;
use crate::plane::csr::{knows_key_statement, verify_csr, CsrRefusal, VerifiedCsr};
use crate::plane::{ControlPlane, RefusalEvent};
use crate::store::{self, Commit, LockKey, Tx, UnixMs};

/// The outcome of the join transaction.
enum Outcome {
    Joined {
        node_id: String,
        leaf: Vec<u8>,
    },
    Deferred(Deferral),
    Refused(Refusal),
    /// The attestor asked for work outside the transaction first.
    Prepare(crate::model::attestor::Work),
}

/// `Join`: a service over the control plane's shared state (see
/// [`crate::plane`]).
#[derive(Clone, Copy)]
pub struct JoinService<'a> {
    cp: &'a ControlPlane,
}

impl<'a> JoinService<'a> {
    pub fn new(cp: &'a ControlPlane) -> Self {
        JoinService { cp }
    }
}

/// The shared state's accessors, as the service's own.
impl std::ops::Deref for JoinService<'_> {
    type Target = ControlPlane;
    fn deref(&self) -> &ControlPlane {
        self.cp
    }
}

impl JoinService<'_> {
    /// Signs a body as the JoinService does (also for tests that need a
    /// well-signed but wrong answer).
    pub fn sign_body(&self, body: &JoinResponseBody) -> JoinResponse {
        let bytes = body.encode_to_vec();
        let signature = signing::sign(self.signing_key(), Purpose::JoinResponse, &[&bytes]);
        JoinResponse {
            body: bytes,
            signature: signature.to_vec(),
            key_id: signing::key_id(self.bundle().join_signing_spki_der()),
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

    pub(crate) fn join_from(
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
            AttestorId::JoinToken.as_str().to_owned()
        } else {
            printable(&req.attestor)
        };
        let csr = match verify_csr(&req.csr)? {
            Ok(csr) => csr,
            Err(refusal) => {
                let reason = match refusal {
                    CsrRefusal::Key => JoinReason::CsrKey,
                    CsrRefusal::Signature => JoinReason::CsrNotVerified,
                };
                return Err(self.refuse(&attestor_name, Refusal::new(reason), source));
            }
        };
        // Parsed once: an empty name is `join-token`; a name of no built-in
        // attestor, like one this control plane does not run, is refused
        // under the name as sent.
        let requested = if req.attestor.is_empty() {
            Some(AttestorId::JoinToken)
        } else {
            req.attestor.parse::<AttestorId>().ok()
        };
        let attestor = requested.and_then(|id| self.attestor(id));
        let Some(attestor) = attestor else {
            return Err(self.refuse(
                &attestor_name,
                Refusal::new(JoinReason::UnknownAttestor),
                source,
            ));
        };
        let attestor_id = attestor.id();
        if req.tpm.is_some() && !attestor.takes_tpm_evidence() {
            return Err(ApiError::InvalidInput(format!(
                "JoinRequest.tpm is TPM evidence beside another attestor's; {attestor_id} takes none (a tpm join sends it as its attestation)"
            )));
        }
        // A role the attestor never admits is refused before it runs.
        if let Err(refusal) = check_role(attestor.as_ref(), role, None) {
            return Err(self.refuse(attestor_id.as_str(), refusal, source));
        }

        let token = if req.sealed_token.is_empty() {
            None
        } else {
            match self
                .bundle()
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
                        attestor_id.as_str(),
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
            let outcome =
                self.database()
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
                                    attestor_id,
                                    csr: &csr,
                                    claims: &claims,
                                };
                                let admitted = check_role(attestor.as_ref(), role, Some(&result))
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
                    prepared = match attestor.prepare(self.database(), &work, source) {
                        Ok(p) => p,
                        Err(refusal) => {
                            return Err(self.refuse(attestor_id.as_str(), refusal, source))
                        }
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
            Outcome::Refused(refusal) => {
                return Err(self.refuse(attestor_id.as_str(), refusal, source))
            }
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
    /// admitted node, in three steps: [`reclaim`] (which node this machine
    /// is), [`binding`] (its hardware key admits only that node) with the
    /// pool's policy ([`pool_policy`]), then [`Self::issue`] (the writes and
    /// the certificate). Any refusal comes before the first write (and the
    /// transaction is rolled back anyway).
    fn admit(
        &self,
        tx: &Tx<'_>,
        now: UnixMs,
        request: &Admission<'_>,
        result: &AttestationResult,
    ) -> Result<(String, Vec<u8>), Refusal> {
        let reclaimed = reclaim(tx, request.role, result)?;
        let reclaim = reclaimed.node.as_ref().map(|n| n.id.as_str());
        let new_binding = binding(tx, result, reclaim)?;
        let pool = pool_policy(tx, request.attestor_id, result, reclaimed.node.as_ref())?;
        let admitted = Admitted {
            reclaimed,
            new_binding,
            pool,
        };
        self.issue(tx, now, request, result, admitted)
    }

    /// Writes the admitted node: its row (new, or the reclaimed one at a new
    /// identity generation), its hardware binding and key, its scope, its
    /// certificate, the `joins` audit row and the `node.joined` event.
    /// Returns the node id and the certificate (DER).
    fn issue(
        &self,
        tx: &Tx<'_>,
        now: UnixMs,
        request: &Admission<'_>,
        result: &AttestationResult,
        admitted: Admitted,
    ) -> Result<(String, Vec<u8>), Refusal> {
        let Admission {
            role,
            attestor_id,
            csr,
            claims,
        } = *request;
        let Admitted {
            reclaimed:
                Reclaimed {
                    hardware,
                    node: existing,
                    statements,
                },
            new_binding,
            pool,
        } = admitted;
        let reclaim = existing.as_ref().map(|n| n.id.clone());
        let reclaim = reclaim.as_deref();
        // A workflow's role change ([`AttestationResult::change_role`]):
        // the node takes the attestor's scope, as a new node does.
        let switched = existing.as_ref().is_some_and(|n| n.role != role);
        let (node_id, generation) = match existing {
            Some(node) => {
                let generation = node.identity_generation.saturating_add(1);
                records::start_generation(tx, &node.id, generation, attestor_id, now)?;
                if switched {
                    records::set_role(tx, &node.id, role)?;
                }
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
                        attestor: attestor_id,
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
        let scope = if reclaim.is_none() || switched {
            let mut scope = result.scope.as_deref().cloned().unwrap_or_default();
            if role == Role::Ramdisk {
                ramdisk_scope(&mut scope);
            }
            if scope != records::NodeScope::default() || switched {
                records::set_node_scope(tx, &node_id, &scope)?;
            }
            scope
        } else {
            records::node_scope(tx, &node_id)?
        };
        if role == Role::Ramdisk {
            if let Some(token_id) = &result.token_id {
                crate::model::boot::mark_joined(tx, token_id, &node_id, now)?;
            }
        }
        let cert_ttl = match scope.max_cert_ttl_ms {
            Some(ms) => self.cert_ttl().min(Duration::milliseconds(ms)),
            None => self.cert_ttl(),
        };
        // A ramdisk's certificate never outlives its boot entry.
        let entry_end = match role {
            Role::Ramdisk => crate::model::boot::cert_not_after(tx, &node_id)?,
            _ => None,
        };

        // X.509 times have whole seconds; issue at whole seconds so the
        // stored validity is the certificate's.
        let not_before = store::to_datetime(now - now.rem_euclid(1000));
        let cert_ttl = crate::plane::capped_ttl(cert_ttl, now, entry_end);
        // What the node may run, readable by the agent from its own
        // certificate: after the node-key statement; a leased node's
        // narrowed to its lease, and its lessee named (a reclaim restores
        // the restriction: spec x509pop).
        let mut statements = statements;
        statements.extend(crate::model::leases::cert_statements(
            tx, &node_id, role, &scope, now,
        )?);
        let issued = self
            .bundle()
            .node_ca
            .issue(&NodeCertSpec {
                spki_der: &csr.spki_der,
                trust_domain: &self.bundle().trust_domain,
                node_id: &node_id,
                statements: &statements,
                not_before,
                not_after: not_before + cert_ttl,
            })
            .map_err(|e| Refusal::fault(Fault::Internal(e.to_string())))?;
        records::insert_cert(tx, &node_id, generation, &issued)?;
        if let Some(boot) = &result.boot {
            crate::model::node_boot::record(tx, &node_id, "join", boot, now)?;
        }
        records::insert_join(
            tx,
            &JoinRow {
                node_id: node_id.clone(),
                attestor: attestor_id,
                node_key: result.node_key.kind().as_str().to_owned(),
                ek_assurance: result.ek_assurance().map(|a| a.as_str().to_owned()),
                identity_generation: generation,
                at: now,
                product_uuid: crate::model::machine::ProductUuid::parse(&claims.product_uuid)
                    .ok()
                    .map(crate::model::machine::ProductUuid::into_string),
                macs: claims
                    .macs
                    .iter()
                    .filter_map(|m| crate::model::machine::Mac::parse(m).ok())
                    .map(|m| m.as_str().to_owned())
                    .take(64)
                    .collect(),
            },
        )?;
        records::insert_event(
            tx,
            &NewEvent {
                kind: records::EVENT_NODE_JOINED,
                at: now,
                attestor: Some(attestor_id.as_str()),
                reason: None,
                token_id: result.token_id.as_deref(),
                node_id: Some(&node_id),
                data: serde_json::json!({
                    "attestor": attestor_id.as_str(),
                    "nodeKey": result.node_key.kind().as_str(),
                    "ekAssurance": result.ek_assurance().map(|a| a.as_str()),
                    "role": role.name(),
                    "identityGeneration": generation,
                    "reclaim": reclaim.is_some(),
                    "pool": pool.id,
                    "serial": issued.serial_hex,
                    "notAfter": store::rfc3339(store::from_datetime(issued.not_after)),
                }),
                ..NewEvent::default()
            },
        )?;
        tracing::info!(
            node_id = %node_id,
            attestor = %attestor_id,
            role = role.name(),
            generation,
            token_id = result.token_id.as_deref().unwrap_or(""),
            node_key = result.node_key.kind().as_str(),
            ek_assurance = result.ek_assurance().map_or("", |a| a.as_str()),
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
        let (pool_id, tenant_id) = match refusal.pool.map(|p| *p) {
            Some(p) => (Some(p.id), Some(p.owner)),
            None => (None, None),
        };
        let event = RefusalEvent {
            attestor: attestor.to_owned(),
            reason: refusal.reason,
            token_id: refusal.token_id,
            node_id: refusal.node_id,
            pool_id,
            tenant_id,
        };
        let mut extra = serde_json::Map::new();
        if let (Some(id), Some(owner)) = (&event.pool_id, &event.tenant_id) {
            extra.insert("poolId".to_owned(), id.as_str().into());
            extra.insert("poolOwner".to_owned(), owner.as_str().into());
        }
        if let Some(d) = &refusal.detail {
            extra.insert("detail".to_owned(), d.detail.as_str().into());
            if let Some(i) = d.event {
                extra.insert("eventIndex".to_owned(), i.into());
            }
        }
        let extra = match extra.is_empty() {
            true => String::new(),
            false => serde_json::Value::Object(extra).to_string(),
        };
        let first = self.record_refusal(Refused {
            kind: records::EVENT_JOIN_REFUSED,
            attestor: Some(event.attestor.clone()),
            reason: event.reason,
            token_id: event.token_id.clone(),
            node_id: event.node_id.clone(),
            source,
            extra,
            tenant_id: event.tenant_id.clone(),
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
                    tenant_id = event.tenant_id.as_deref().unwrap_or(""),
                    source = source.map(|s| s.to_string()).unwrap_or_default(),
                    detail = refusal.detail.as_ref().map_or("", |d| d.detail.as_str()),
                    "join refused"
                )
            };
        }
        if first {
            log_refusal!(warn);
        } else {
            log_refusal!(debug);
        }
        if let Some(hook) = self.on_refusal() {
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
    attestor_id: AttestorId,
    csr: &'a VerifiedCsr,
    claims: &'a agent::HardwareClaims,
}

/// What the checks of an admission found, for [`JoinService::issue`].
struct Admitted {
    reclaimed: Reclaimed,
    /// The binding to write (its key not bound yet).
    new_binding: Option<Binding>,
    /// The pool the node joins or stays in.
    pool: pools::PoolRow,
}

/// Which node an admitted machine is, as [`reclaim`] found it.
struct Reclaimed {
    /// Its hardware key (locked for this transaction), if it proved one.
    hardware: Option<hardware::HardwareKey>,
    /// The node it reclaims (its row locked), `None` for a new node.
    node: Option<NodeRow>,
    /// The node-key statements its certificate will carry.
    statements: Vec<String>,
}

/// The reclaim step: the node this machine is (the attestor's, or the live
/// holder of its hardware key when its token allows reclaiming), checked
/// to be known, live and of the requested role; and, before that node is
/// read, the node-key statement its certificate would carry.
fn reclaim(tx: &Tx<'_>, role: Role, result: &AttestationResult) -> Result<Reclaimed, Refusal> {
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
    let bound = match &result.binding() {
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
    let statements: Vec<String> = match result.node_key.statement() {
        None => Vec::new(),
        Some(uri) if knows_key_statement(uri) => vec![uri.to_owned()],
        Some(_) => return Err(refuse(JoinReason::NodeKeyStatement, reclaim)),
    };

    let existing = match reclaim {
        Some(id) => {
            let node = records::node_for_update(tx, id)?
                .ok_or_else(|| refuse(JoinReason::ReclaimUnknown, Some(id)))?;
            if node.retired_at.is_some() {
                return Err(refuse(JoinReason::ReclaimRetired, Some(id)));
            }
            let workflow_switch = result.change_role
                && matches!(
                    (node.role, role),
                    (Role::Node, Role::Ramdisk) | (Role::Ramdisk, Role::Node)
                );
            if node.role != role && !workflow_switch {
                return Err(refuse(JoinReason::ReclaimRole, Some(id)));
            }
            Some(node)
        }
        None => None,
    };

    Ok(Reclaimed {
        hardware,
        node: existing,
        statements,
    })
}

/// The binding step: a hardware key admits only the node it is bound to
/// (`reclaim`, `None` for a new node), and a node has one key of each kind.
/// Returns the binding to write, if the key is not bound yet.
fn binding(
    tx: &Tx<'_>,
    result: &AttestationResult,
    reclaim: Option<&str>,
) -> Result<Option<Binding>, Refusal> {
    let refuse = |reason: JoinReason, node: Option<&str>| {
        Refusal::new(reason)
            .with_token(result.token_id.as_deref())
            .with_node(node)
    };
    // A hardware key admits only the node it is bound to, and a node has
    // one key of each kind.
    let mut new_binding = None;
    if let Some(b) = result.binding() {
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

    Ok(new_binding)
}

/// The pool the node joins or stays in, refused unless its policy admits
/// the attestor and the join's EK assurance.
fn pool_policy(
    tx: &Tx<'_>,
    attestor_id: AttestorId,
    result: &AttestationResult,
    existing: Option<&NodeRow>,
) -> Result<pools::PoolRow, Refusal> {
    let reclaim = existing.map(|n| n.id.as_str());
    let refuse = |reason: JoinReason, node: Option<&str>| {
        Refusal::new(reason)
            .with_token(result.token_id.as_deref())
            .with_node(node)
    };
    // The pool: a reclaimed node stays in its own; a new node joins the
    // one the attestor resolved, else `default`.
    let pool_id = match (&existing, &result.pool_id) {
        (Some(node), _) => node.pool_id.clone(),
        (None, Some(p)) => p.clone(),
        (None, None) => pools::DEFAULT_POOL.to_owned(),
    };
    let pool = pools::get(tx, &pool_id)?.ok_or_else(|| refuse(JoinReason::UnknownPool, reclaim))?;
    if let Some(allowed) = pool.join_attestors()? {
        if !allowed.iter().any(|a| a == attestor_id.as_str()) {
            return Err(refuse(JoinReason::PoolAttestor, reclaim).with_pool(&pool.id, &pool.owner));
        }
    }
    if let Some(min) = pool.min_ek_assurance()? {
        if !result.ek_assurance().is_some_and(|a| a.meets(min)) {
            tracing::info!(
                pool = %pool.id,
                min = min.as_str(),
                ek_assurance = result.ek_assurance().map_or("none", |a| a.as_str()),
                "join refused: below the pool's minimum EK assurance"
            );
            return Err(
                refuse(JoinReason::PoolEkAssurance, reclaim).with_pool(&pool.id, &pool.owner)
            );
        }
    }

    Ok(pool)
}

/// A ramdisk is scoped whichever attestor admitted it: discovery sets its
/// configured kinds and certificate cap; any other (a cloud VM that
/// `[cloud_iid] roles` lets join as `ramdisk`) gets the commissioning kinds
/// and at most the 2 h certificate, never a node's whole reach.
pub(crate) fn ramdisk_scope(scope: &mut records::NodeScope) {
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

/// Checks the role against what the attestor admits ([`Attestor::roles`])
/// before it runs (`result` `None`), and once it admitted, against the
/// roles its result narrows that to (a token's role, a TPM's place, a
/// certificate's, a cloud resolve row's). After an admission the refusal
/// rolls back whatever the attestor spent.
pub(crate) fn check_role(
    attestor: &dyn Attestor,
    role: Role,
    result: Option<&AttestationResult>,
) -> Result<(), Refusal> {
    let roles = attestor.roles();
    let (admits, reason) = (
        roles.admits,
        roles.refusal.unwrap_or(JoinReason::Role.any()),
    );
    let narrowed = result.and_then(|r| r.roles.as_deref());
    if admits.contains(&role) && narrowed.is_none_or(|roles| roles.contains(&role)) {
        return Ok(());
    }
    tracing::info!(
        attestor = %attestor.id(),
        role = role.name(),
        "join: the attestor does not admit this role"
    );
    Err(Refusal::new(reason)
        .with_token(result.and_then(|r| r.token_id.as_deref()))
        .with_node(result.and_then(|r| r.reclaim_node_id.as_deref())))
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
            attestor: attestor.as_str().to_owned(),
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
mod tests;
