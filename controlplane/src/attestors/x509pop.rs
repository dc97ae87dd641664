//! `x509pop`: a node whose certificate expired while it was off (renewal
//! refuses expired certificates) re-joins as itself, with its last
//! certificate and a proof by that certificate's key bound to its new CSR
//! (spec "Attestation", section *x509pop*).
//!
//! The evidence is [`bc_wire::x509pop::Evidence`] (UTF-8 JSON). In the join
//! transaction, in this order, each failure a refusal with the reason named:
//!
//! - `evidence-malformed`: not the evidence JSON, or a node id that is not one;
//! - `replayed`: the proof was already accepted (`attestation_uses`, see
//!   below). Checked first so that a replay is named as one, rather than as
//!   the stale certificate its first use made it;
//! - `unknown-certificate`: the leaf is not byte for byte a `node_certs` row
//!   of that node (only a certificate this control plane issued counts);
//! - `deleted`: the node was deleted (`nodes delete`);
//! - `stale-generation`: the certificate is from before the node's current
//!   identity generation (an older join, or `nodes revoke-identity`);
//! - `revoked`: the certificate was revoked;
//! - `retired`: the node is retired;
//! - `past-grace`: the certificate expired more than `grace` ago (one not
//!   expired yet is fine: a node may re-join before its expiry);
//! - `clock-window`: `clientTime` is more than `window` away from database time;
//! - `signature`: the proof does not verify with the leaf's key over this CSR;
//! - `role` (JoinService's check, after all of the above): the requested
//!   role is not the node's (node or site; a ramdisk never re-joins, it
//!   joins afresh with discovery).
//!
//! An admitted proof is spent in `attestation_uses` ([`crate::model::uses`]) with
//! the join: subject [`replay_subject`], kept until `clientTime + window`,
//! after which the clock window refuses it anyway. A proof whose join is
//! refused later in the transaction (a pool's `joinAttestors`) is not spent.
//!
//! The result names the node, so JoinService reclaims it in place: a new
//! identity generation, every older certificate revoked, the node's pool,
//! bindings and state kept. A lessee's node re-joins as a node and comes
//! back restricted while its lease lasts: JoinService writes the lease's
//! scope and lessee statements into every certificate of a leased node
//! ([`crate::model::leases::cert_statements`]).
//!
//! **No statement is carried over.** The proof shows possession of the old
//! key only; nothing shows that the new (CSR) key lives in a TPM. A
//! certificate carrying the old AK statement for an unproven key would claim
//! what nobody checked, so the re-joined certificate names no AK and its
//! node key is `unattested`. When the old leaf named an AK, the downgrade is
//! logged and stored as a `node.key.downgraded` event (in the join's
//! transaction, so only when the join is admitted). The node gets its TPM
//! assurance back by joining with `tpm`, which its EK binding reclaims; a
//! pool whose `joinAttestors` lists only `tpm` refuses x509pop altogether.

use bc_wire::x509pop::Evidence;
use bc_wire::AttestorId;

use crate::model::attestor::{
    AttestInput, AttestationResult, Attestor, Fault, NodeKey, NodeKeyKind, Refusal, Verdict,
};
use crate::model::records::{self, NewEvent};
use crate::store::Tx;

crate::reason::reasons! {
    /// The x509pop attestor's reasons.
    pub(crate) enum X509PopReason in "x509pop" {
        EvidenceMalformed = "evidence-malformed",
        UnknownCertificate = "unknown-certificate",
        Deleted = "deleted",
        StaleGeneration = "stale-generation",
        Revoked = "revoked",
        Retired = "retired",
        Role = "role",
        PastGrace = "past-grace",
        ClockWindow = "clock-window",
        Signature = "signature",
        Replayed = "replayed",
    }
}

/// `graceMs` by default: 7 days.
pub(crate) const DEFAULT_GRACE_MS: i64 = 7 * 86_400_000;
/// `windowMs` by default: 60 seconds.
pub(crate) const DEFAULT_WINDOW_MS: i64 = 60_000;

/// The `[x509pop]` section of `controlplane.toml`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct X509PopConfig {
    /// How long after its expiry a certificate may still re-join.
    pub(crate) grace_ms: i64,
    /// How far `clientTime` may be from database time, either way.
    pub(crate) window_ms: i64,
}

impl Default for X509PopConfig {
    fn default() -> Self {
        X509PopConfig {
            grace_ms: DEFAULT_GRACE_MS,
            window_ms: DEFAULT_WINDOW_MS,
        }
    }
}

/// The `attestation_uses` subject of a proof: the hex SHA-256 of its
/// signature with `s` normalized to the low half. ECDSA signatures are
/// malleable (`(r, s)` and `(r, n - s)` both verify), and a subject taken
/// from the bytes as sent would take the twin for a new proof. Bytes that
/// are not a signature at all are hashed as sent (such a proof never
/// verifies anyway).
pub(crate) fn replay_subject(sig: &[u8; 64]) -> String {
    let digest = match p256::ecdsa::Signature::from_slice(sig) {
        Ok(s) => bc_wire::sha256(&s.normalize_s().to_bytes()),
        Err(_) => bc_wire::sha256(sig),
    };
    hex::encode(digest)
}

pub(crate) struct X509PopAttestor {
    config: X509PopConfig,
}

impl X509PopAttestor {
    pub(crate) fn new(config: X509PopConfig) -> Self {
        X509PopAttestor { config }
    }
}

impl Attestor for X509PopAttestor {
    fn id(&self) -> AttestorId {
        AttestorId::X509Pop
    }

    fn roles(&self) -> crate::model::attestor::Roles {
        crate::model::attestor::Roles {
            admits: &[bc_wire::agent::Role::Node, bc_wire::agent::Role::Site],
            refusal: Some(X509PopReason::Role.any()),
        }
    }

    fn verify(&self, tx: &Tx<'_>, input: &AttestInput<'_>) -> Result<Verdict, Refusal> {
        let ev = Evidence::from_json(input.evidence).map_err(|e| {
            tracing::debug!(error = %e, "x509pop: evidence refused");
            Refusal::new(X509PopReason::EvidenceMalformed)
        })?;
        if bc_wire::spiffe::check_node_id(&ev.node_id).is_err() {
            return Err(Refusal::new(X509PopReason::EvidenceMalformed));
        }
        let node_id = ev.node_id.as_str();
        let refuse = |reason: X509PopReason| Refusal::new(reason).with_node(Some(node_id));
        // The node's row first, locked as the reclaim will change it (PG:
        // `FOR UPDATE`): a second use of the same proof on another replica
        // waits here until the first commits, then finds the proof spent
        // (`replayed`) instead of a node already at its next generation;
        // and no two joins hold a share lock each that the reclaim's
        // UPDATE would wait on (a deadlock).
        let node = records::node_including_deleted_for_update(tx, node_id)?;
        let subject = replay_subject(&ev.sig);
        if crate::model::uses::is_spent(tx, AttestorId::X509Pop, &subject)? {
            return Err(refuse(X509PopReason::Replayed));
        }
        // `from_json` refuses an empty chain.
        let leaf = ev
            .chain
            .first()
            .ok_or_else(|| Refusal::new(X509PopReason::EvidenceMalformed))?;

        let cert = records::cert_by_der(tx, node_id, leaf)?
            .ok_or_else(|| refuse(X509PopReason::UnknownCertificate))?;
        let node = node.ok_or_else(|| refuse(X509PopReason::UnknownCertificate))?;
        if node.deleted_at.is_some() {
            return Err(refuse(X509PopReason::Deleted));
        }
        if cert.identity_generation != node.identity_generation {
            return Err(refuse(X509PopReason::StaleGeneration));
        }
        if cert.revoked_at.is_some() {
            return Err(refuse(X509PopReason::Revoked));
        }
        if node.retired_at.is_some() {
            return Err(refuse(X509PopReason::Retired));
        }
        if input.now > cert.not_after.saturating_add(self.config.grace_ms) {
            return Err(refuse(X509PopReason::PastGrace));
        }
        let client_time = i64::try_from(ev.client_time_ms)
            .ok()
            .filter(|t| t.abs_diff(input.now) <= self.config.window_ms.unsigned_abs())
            .ok_or_else(|| refuse(X509PopReason::ClockWindow))?;
        // The row is our own issuance, so it parses; if it does not, the
        // database is broken, which is not the machine's fault.
        let identity = crate::pki::node_cert_identity(&cert.der).map_err(|e| {
            Refusal::fault(Fault::Internal(format!(
                "node_certs row {} of {node_id}: {e}",
                cert.serial
            )))
        })?;
        if ev.verify(&identity.spki_der, &input.csr_sha256).is_err() {
            return Err(refuse(X509PopReason::Signature));
        }
        // Last, so that only a proof that would admit the machine is spent
        // (a proof refused for its clock can be made again at once). Past
        // `clientTime + window` the clock window refuses it by itself.
        let expires_at = client_time.saturating_add(self.config.window_ms);
        if !crate::model::uses::spend(tx, AttestorId::X509Pop, &subject, expires_at, input.now)? {
            return Err(refuse(X509PopReason::Replayed));
        }

        let dropped: Vec<&String> = identity
            .statements
            .iter()
            .filter(|s| s.starts_with(bc_wire::tpm::AK_STATEMENT_PREFIX))
            .collect();
        if !dropped.is_empty() {
            tracing::warn!(
                node_id,
                statement = %dropped.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" "),
                "x509pop: the re-joined certificate names no TPM AK; the node key is unattested \
                 until the node joins with tpm again"
            );
            records::insert_event(
                tx,
                &NewEvent {
                    kind: records::EVENT_NODE_KEY_DOWNGRADED,
                    at: input.now,
                    attestor: Some(AttestorId::X509Pop.as_str()),
                    reason: None,
                    token_id: None,
                    node_id: Some(node_id),
                    data: serde_json::json!({
                        "attestor": AttestorId::X509Pop.as_str(),
                        "statements": dropped,
                        "nodeKey": NodeKeyKind::Unattested.as_str(),
                        "serial": cert.serial,
                    }),
                    ..NewEvent::default()
                },
            )?;
        }
        tracing::info!(node_id, serial = %cert.serial, "x509pop: the node proved its last certificate");
        Ok(Verdict::Admit(Box::new(AttestationResult {
            // The node's own role only (JoinService refuses another: `role`).
            roles: Some(vec![node.role]),
            reclaim_node_id: Some(node.id),
            node_key: NodeKey::Unattested,
            ..AttestationResult::default()
        })))
    }
}

#[cfg(test)]
mod tests;
