//! Renew: a node trades its current certificate for a fresh one (at most
//! 24 hours), over mTLS, before it expires.
//!
//! The transport authenticates the TLS client (its chain verified against
//! the node CA at database time, and the handshake signed by the leaf's
//! key); the service then decides on the leaf alone. An expired leaf passes
//! the handshake ([`crate::api::client_auth`]) so that it is refused here, by
//! name (`expired`), with its event. Outline, each failure a refusal with the reason
//! named:
//!
//! 1. a client certificate (`no-client-certificate`) whose URI SANs are one
//!    node SPIFFE ID of this trust domain and then only `urn:bc:` statements
//!    (`certificate-identity`); the node id comes from the SPIFFE ID alone;
//! 2. the CSR: PKCS#10 DER (else INVALID_INPUT: a broken request, not a
//!    refusal), a P-256 key (`csr-key`) and a signature that verifies
//!    (`csr-signature`);
//! 3. in one `BEGIN IMMEDIATE` transaction, at database time: the leaf is
//!    byte for byte a `node_certs` row of that node (`unknown-certificate`),
//!    the node exists (`deleted`) and is not retired (`retired`), the row is
//!    of the node's current identity generation (`stale-generation`), not
//!    revoked (`revoked`) and not expired (`expired`: an expired node
//!    re-joins with x509pop instead);
//! 4. the node key: the statements are read from that leaf, never from the
//!    CSR. A leaf naming a TPM AK (`urn:bc:tpm-ak:`) renews only with
//!    `key_attestation` (`key-attestation-missing`) whose AK has the TPM
//!    name the statement names (`ak-mismatch`) and attestation-key
//!    attributes (`ak-attributes`), and whose TPM2_Certify of the new key
//!    passes the join's node-key checks over `sha256(csr)` and the CSR's key
//!    (`node-key-malformed`, `node-key-signature`, `node-key-nonce`,
//!    `node-key-name`, `node-key-attributes`, `node-key-not-csr`). There is
//!    no downgrade: nothing else renews such a leaf;
//! 5. the boot: when the node's pool has a boot policy and the leaf names
//!    an AK, a request without current boot evidence is answered with a
//!    boot challenge (no certificate, nothing written); the evidence is the
//!    event log and a quote under the leaf's AK over the challenge and the
//!    CSR, judged by the join's own flow ([`crate::attestors::tpm::boot`]):
//!    `quote-signature`, `quote-nonce`, `quote-pcrs`, `eventlog-*`, `boot-*`,
//!    with what failed and the event in the refusal's data, and told to the
//!    node. A verified boot is the node's last (`node_boots`);
//! 6. a new certificate for the CSR's key: the same node id and identity
//!    generation, the leaf's node-key statement carried forward (a CSR can
//!    neither add nor remove one), the scope and lessee statements written
//!    from the node's row and its lease ([`crate::model::leases`]), stored
//!    in `node_certs` with a `node.renewed` event. Older certificates of the generation stay valid until they
//!    expire: the node swaps its key and certificate atomically, and one
//!    that crashed before the swap must still be able to renew again.
//!
//! A leaf without an AK statement renews as before, and a `key_attestation`
//! it sends is ignored: no EK vouches for that AK, so its certification
//! proves nothing about the key, and the new certificate claims nothing
//! (`nodeKey: unattested`).
//!
//! Every refusal is answered ACCESS_DENIED ("Renew refused"), logged as
//! `renew refused` with the node id and the reason, and stored as a
//! `security.renew.refused` event attributed to the owner of the node's pool
//! (its `tenant_id`, and `data.owner`).

use bc_wire::agent::{RenewBootChallenge, RenewRequest, RenewResponse, TpmKeyAttestation};
use bc_wire::tpm::{self as wtpm, Public};

pub(crate) use boot::RenewBootKey;
use prost::Message;
use subtle::ConstantTimeEq;

use crate::attestors::tpm::boot::BootFailure;
use crate::model::attestor::NodeKeyKind;
use crate::model::records::{self, NewEvent};
use crate::pki::{NodeCertIdentity, NodeCertSpec};
use crate::plane::api_error::ApiError;
use crate::plane::csr::{verify_csr, CsrRefusal, VerifiedCsr};
use crate::plane::ControlPlane;
use crate::store::{self, Commit, DbError, Tx, UnixMs};

crate::reason::reasons! {
    /// Renew's reasons (`security.renew.refused`).
    pub(crate) enum RenewReason in "renew" {
        NoClientCertificate = "no-client-certificate",
        CertificateIdentity = "certificate-identity",
        CsrKey = "csr-key",
        CsrSignature = "csr-signature",
        UnknownCertificate = "unknown-certificate",
        Deleted = "deleted",
        Retired = "retired",
        StaleGeneration = "stale-generation",
        Revoked = "revoked",
        Expired = "expired",
        /// The leaf's AK statement does not parse, or it has two: never issued by
        /// this control plane, which writes one well-formed statement at most.
        StatementMalformed = "statement-malformed",
        KeyAttestationMissing = "key-attestation-missing",
        AkMismatch = "ak-mismatch",
        AkAttributes = "ak-attributes",
        NodeKeyMalformed = "node-key-malformed",
        NodeKeySignature = "node-key-signature",
        NodeKeyNonce = "node-key-nonce",
        NodeKeyName = "node-key-name",
        NodeKeyAttributes = "node-key-attributes",
        NodeKeyNotCsr = "node-key-not-csr",
        /// The node's pool has a boot policy (its leaf names an AK): the boot
        /// evidence's quote is not the AK's signature, ...
        QuoteSignature = "quote-signature",
        /// ... not a quote over this renewal's challenge, ...
        QuoteNonce = "quote-nonce",
        /// ... or its values are not the quoted ones (or leave out a PCR
        /// the policy needs); as the join refuses them.
        QuotePcrs = "quote-pcrs",
        /// The event log does not parse (or none was sent).
        EventlogMalformed = "eventlog-malformed",
        /// The log does not replay to the quoted PCRs: which PCR in which bank.
        EventlogReplay = "eventlog-replay",
        /// A PCR the policy needs was never extended in a quoted bank.
        EventlogBankEmpty = "eventlog-bank-empty",
        /// The pool's boot policy refused what the log says booted: Secure
        /// Boot state, ...
        BootSecureBoot = "boot-secure-boot",
        /// ... a boot application, ...
        BootApp = "boot-app",
        /// ... the dbx, ...
        BootDbx = "boot-dbx",
        /// ... the kernel command line, ...
        BootCmdline = "boot-cmdline",
        /// ... the firmware version.
        BootFirmware = "boot-firmware",
    }
}

crate::attestors::tpm::boot::boot_check_reasons!(RenewReason);

impl RenewReason {
    /// A node key the AK did not certify as the spec asks.
    pub(crate) fn node_key(e: &wtpm::CertificationError) -> Self {
        match e {
            wtpm::CertificationError::Malformed(_) => RenewReason::NodeKeyMalformed,
            wtpm::CertificationError::Signature => RenewReason::NodeKeySignature,
            wtpm::CertificationError::Nonce => RenewReason::NodeKeyNonce,
            wtpm::CertificationError::Name => RenewReason::NodeKeyName,
            wtpm::CertificationError::Attributes => RenewReason::NodeKeyAttributes,
            wtpm::CertificationError::NotCsr => RenewReason::NodeKeyNotCsr,
        }
    }
}

/// Why a renewal stopped inside its transaction.
enum Stop {
    Refused(RenewReason),
    /// The boot evidence failed: the reason and what exactly failed.
    Boot(BootFailure),
    /// No certificate yet: the pool's boot policy wants evidence.
    Challenge(RenewBootChallenge),
    Failed(ApiError),
    /// Not a stop: the renewal went through.
    Done(Renewed),
}

impl From<DbError> for Stop {
    fn from(e: DbError) -> Self {
        Stop::Failed(ApiError::from(e))
    }
}

/// A renewal that went through.
struct Renewed {
    leaf: Vec<u8>,
}

/// `Renew`: a service over the control plane's shared state (see
/// [`crate::plane`]).
#[derive(Clone, Copy)]
pub struct RenewService<'a> {
    cp: &'a ControlPlane,
}

impl<'a> RenewService<'a> {
    pub fn new(cp: &'a ControlPlane) -> Self {
        RenewService { cp }
    }
}

/// The shared state's accessors, as the service's own.
impl std::ops::Deref for RenewService<'_> {
    type Target = ControlPlane;
    fn deref(&self) -> &ControlPlane {
        self.cp
    }
}

impl RenewService<'_> {
    /// `Renew` on a serialized `RenewRequest`, for the TLS client whose
    /// leaf certificate (DER) the transport authenticated; `None` when the
    /// client sent none.
    pub fn renew_bytes(
        &self,
        client_leaf: Option<&[u8]>,
        body: &[u8],
    ) -> Result<RenewResponse, ApiError> {
        // Authentication first: a caller without a certificate learns
        // nothing about its request.
        let Some(leaf) = client_leaf.filter(|l| !l.is_empty()) else {
            return Err(self.refuse_renew(None, RenewReason::NoClientCertificate));
        };
        let req = RenewRequest::decode(body).map_err(|e| {
            ApiError::InvalidInput(format!("the body is not a RenewRequest protobuf: {e}"))
        })?;
        self.renew(Some(leaf), &req)
    }

    /// `Renew`; see the module documentation. The caller (the transport)
    /// must have authenticated `client_leaf`: this checks what the leaf is
    /// and may do, not that the caller holds its key.
    pub(crate) fn renew(
        &self,
        client_leaf: Option<&[u8]>,
        req: &RenewRequest,
    ) -> Result<RenewResponse, ApiError> {
        let Some(leaf) = client_leaf.filter(|l| !l.is_empty()) else {
            return Err(self.refuse_renew(None, RenewReason::NoClientCertificate));
        };
        let identity = match crate::pki::node_cert_identity(leaf) {
            Ok(id) if id.trust_domain == self.bundle().trust_domain => id,
            _ => return Err(self.refuse_renew(None, RenewReason::CertificateIdentity)),
        };
        let node_id = identity.node_id.as_str();
        let csr = match verify_csr(&req.csr)? {
            Ok(csr) => csr,
            Err(refusal) => {
                let reason = match refusal {
                    CsrRefusal::Key => RenewReason::CsrKey,
                    CsrRefusal::Signature => RenewReason::CsrSignature,
                };
                return Err(self.refuse_renew(Some(node_id), reason));
            }
        };

        let outcome = self
            .database()
            .write_if(|tx| -> Result<(Stop, Commit), ApiError> {
                let now = tx.now()?;
                match self.renew_in(tx, now, leaf, &identity, &csr, req) {
                    Ok(done) => Ok((Stop::Done(done), Commit::Yes)),
                    Err(Stop::Failed(e)) => Err(e),
                    // No commit: a refusal or a challenge rolls back.
                    Err(stop) => Ok((stop, Commit::No)),
                }
            })?;
        match outcome {
            Stop::Done(done) => Ok(RenewResponse {
                chain: vec![done.leaf, self.node_ca_der().to_vec()],
                boot: None,
            }),
            Stop::Challenge(c) => {
                tracing::info!(
                    node_id,
                    pcrs = ?c.pcrs,
                    "renew: the node's pool has a boot policy, boot evidence asked for"
                );
                Ok(RenewResponse {
                    chain: Vec::new(),
                    boot: Some(c),
                })
            }
            Stop::Refused(reason) => Err(self.refuse_renew(Some(node_id), reason)),
            Stop::Boot(f) => Err(self.refuse_renew_boot(node_id, f)),
            Stop::Failed(e) => Err(e),
        }
    }

    /// The checks that need the database, then the new certificate.
    fn renew_in(
        &self,
        tx: &Tx<'_>,
        now: UnixMs,
        leaf: &[u8],
        identity: &NodeCertIdentity,
        csr: &VerifiedCsr,
        req: &RenewRequest,
    ) -> Result<Renewed, Stop> {
        let node_id = identity.node_id.as_str();
        // PG: the node's row first, `FOR UPDATE`: a revoke, reclaim or delete
        // commits before this reads the certificate, or waits for this
        // renewal (never a fresh certificate of an ended generation).
        let node = records::node_including_deleted_for_update(tx, node_id)?
            .ok_or(Stop::Refused(RenewReason::UnknownCertificate))?;
        let cert = records::cert_by_der(tx, node_id, leaf)?
            .ok_or(Stop::Refused(RenewReason::UnknownCertificate))?;
        if node.deleted_at.is_some() {
            return Err(Stop::Refused(RenewReason::Deleted));
        }
        if node.retired_at.is_some() {
            return Err(Stop::Refused(RenewReason::Retired));
        }
        if cert.identity_generation != node.identity_generation {
            return Err(Stop::Refused(RenewReason::StaleGeneration));
        }
        if cert.revoked_at.is_some() {
            return Err(Stop::Refused(RenewReason::Revoked));
        }
        if now >= cert.not_after {
            return Err(Stop::Refused(RenewReason::Expired));
        }
        let node_key = check_node_key(&identity.statements, req.key_attestation.as_ref(), csr)
            .map_err(Stop::Refused)?;
        let boot = self.check_boot(tx, now, &node, node_key, csr, req)?;

        // A ramdisk's certificates stay as short as its first one.
        let scope = records::node_scope(tx, node_id)?;
        // The leaf's node-key statements carry forward; its scope (and
        // lessee) statements are written again from the node's row and its
        // lease, so a certificate from before the command channel gains one,
        // a changed scope takes effect, and a lease made or ended shows.
        use bc_wire::command::scope::{SCOPE_PREFIX, TENANT_PREFIX};
        let statements: Vec<String> = identity
            .statements
            .iter()
            .filter(|s| !s.starts_with(SCOPE_PREFIX) && !s.starts_with(TENANT_PREFIX))
            .cloned()
            .chain(crate::model::leases::cert_statements(
                tx, node_id, node.role, &scope, now,
            )?)
            .collect();
        let cert_ttl = match scope.max_cert_ttl_ms {
            Some(ms) => self.cert_ttl().min(time::Duration::milliseconds(ms)),
            None => self.cert_ttl(),
        };
        // Nor past its boot entry's end: a ramdisk lives as long as its entry.
        let entry_end = match node.role {
            bc_wire::agent::Role::Ramdisk => crate::model::boot::cert_not_after(tx, node_id)?,
            _ => None,
        };
        let cert_ttl = crate::plane::capped_ttl(cert_ttl, now, entry_end);
        // X.509 times have whole seconds; issue at whole seconds so the
        // stored validity is the certificate's.
        let not_before = store::to_datetime(now - now.rem_euclid(1000));
        let issued = self
            .bundle()
            .node_ca
            .issue(&NodeCertSpec {
                spki_der: &csr.spki_der,
                trust_domain: &self.bundle().trust_domain,
                node_id,
                statements: &statements,
                not_before,
                not_after: not_before + cert_ttl,
            })
            .map_err(|e| Stop::Failed(ApiError::Internal(e.to_string())))?;
        records::insert_cert(tx, node_id, node.identity_generation, &issued)?;
        if let Some(boot) = &boot {
            crate::model::node_boot::record(tx, node_id, "renew", boot, now)?;
        }
        let not_after = store::rfc3339(store::from_datetime(issued.not_after));
        records::insert_event(
            tx,
            &NewEvent {
                kind: records::EVENT_NODE_RENEWED,
                at: now,
                attestor: None,
                reason: None,
                token_id: None,
                node_id: Some(node_id),
                data: serde_json::json!({
                    "serial": issued.serial_hex,
                    "notAfter": not_after,
                    "nodeKey": node_key.as_str(),
                    "identityGeneration": node.identity_generation,
                    "bootVerified": boot.is_some(),
                }),
                ..NewEvent::default()
            },
        )?;
        tracing::info!(
            node_id,
            serial = %issued.serial_hex,
            not_after = %not_after,
            node_key = node_key.as_str(),
            generation = node.identity_generation,
            "node renewed"
        );
        Ok(Renewed { leaf: issued.der })
    }

    /// Under the pool of `pool_id`'s boot policy, the boot `req` proves
    /// ([`boot`]): `None` with no policy, or for a leaf that names no AK
    /// (nothing could sign a quote: such a node renews as before); a
    /// challenge when the request carries no current evidence.
    fn check_boot(
        &self,
        tx: &Tx<'_>,
        now: UnixMs,
        node: &records::NodeRow,
        node_key: NodeKeyKind,
        csr: &VerifiedCsr,
        req: &RenewRequest,
    ) -> Result<Option<crate::model::node_boot::VerifiedBoot>, Stop> {
        let (node_id, pool_id) = (node.id.as_str(), node.pool_id.as_str());
        if !matches!(node_key, NodeKeyKind::Tpm) {
            return Ok(None);
        }
        let Some(policy) = crate::model::boot_policy::pool_boot_policy(tx, pool_id)? else {
            return Ok(None);
        };
        let key = self.renew_boot_key().ok_or_else(|| {
            Stop::Failed(ApiError::Internal(
                "no challenge key to ask for boot evidence with".to_owned(),
            ))
        })?;
        let evidence = req
            .boot
            .as_ref()
            .filter(|ev| key.is_current(ev, node_id, &csr.sha256, now));
        let Some(ev) = evidence else {
            return Err(Stop::Challenge(key.challenge(
                &policy,
                node_id,
                &csr.sha256,
                now,
            )));
        };
        // check_node_key verified this AK.
        let att = req
            .key_attestation
            .as_ref()
            .ok_or(Stop::Refused(RenewReason::KeyAttestationMissing))?;
        let ak =
            Public::parse(&att.ak_public).map_err(|_| Stop::Refused(RenewReason::AkMismatch))?;
        let facts = boot::verify(&policy, &ak, ev, &csr.sha256).map_err(Stop::Boot)?;
        tracing::info!(
            node_id,
            pool = pool_id,
            secure_boot = facts.secure_boot_enabled(),
            "renew: the event log replays and meets the pool's boot policy"
        );
        Ok(Some(crate::model::node_boot::VerifiedBoot::of(&facts)))
    }

    /// A renewal refused by its boot evidence: stored with what failed
    /// (`data.detail`, `data.eventIndex`), and told to the node, which
    /// proved who it is: its own boot is no secret to it, and `bcd doctor`
    /// says why it stopped renewing.
    fn refuse_renew_boot(&self, node_id: &str, f: BootFailure) -> ApiError {
        let reason = RenewReason::from(f.check);
        let detail = f.detail.unwrap_or_default();
        let e = self.refuse_renew_with(Some(node_id), reason, &detail, f.event);
        match e {
            ApiError::RenewRefused => ApiError::RenewRefusedBoot(if detail.is_empty() {
                reason.as_str().to_owned()
            } else {
                format!("{reason}: {detail}")
            }),
            e => e,
        }
    }

    /// Logs and stores a refused renewal and answers ACCESS_DENIED.
    fn refuse_renew(&self, node_id: Option<&str>, typed: RenewReason) -> ApiError {
        self.refuse_renew_with(node_id, typed, "", None)
    }

    /// [`Self::refuse_renew`] with what exactly failed (empty: nothing to add).
    fn refuse_renew_with(
        &self,
        node_id: Option<&str>,
        typed: RenewReason,
        detail: &str,
        event_index: Option<usize>,
    ) -> ApiError {
        let reason = typed.as_str();
        if node_id.is_none() {
            // Nobody proved an identity: anyone can send these, so they are
            // counted (and aggregated) by the refusal log like join refusals,
            // and only the first of a minute is logged at warn.
            let first = self.record_refusal(crate::model::eventlog::Refused {
                kind: records::EVENT_RENEW_REFUSED,
                attestor: None,
                reason: typed.any(),
                token_id: None,
                node_id: None,
                source: None,
                extra: serde_json::json!({ "owner": null }).to_string(),
                tenant_id: None,
                folded: false,
            });
            if first {
                tracing::warn!(reason, "renew refused");
            } else {
                tracing::debug!(reason, "renew refused");
            }
            return ApiError::RenewRefused;
        }
        tracing::warn!(
            node_id = node_id.unwrap_or(""),
            reason,
            detail,
            "renew refused"
        );
        let stored = self.database().write(|tx| {
            let now = tx.now()?;
            let owner = match node_id {
                Some(id) => crate::model::tenants::of_node(tx, id)?,
                None => None,
            };
            records::insert_event(
                tx,
                &NewEvent {
                    kind: records::EVENT_RENEW_REFUSED,
                    at: now,
                    attestor: None,
                    reason: Some(reason),
                    token_id: None,
                    node_id,
                    data: refusal_data(owner.clone(), detail, event_index),
                    // To the node owner (spec "refused renewals"): the
                    // node proved who it is with its certificate.
                    tenant: match &owner {
                        Some(t) => records::Attribution::Tenant(t),
                        None => records::Attribution::Operator,
                    },
                },
            )
        });
        if let Err(e) = stored {
            tracing::error!(error = %e, reason, "could not store the renew refusal event");
        }
        ApiError::RenewRefused
    }
}

/// A refusal event's data: the pool owner it is attributed to and, for a
/// boot refusal, what failed and at which event of the log.
fn refusal_data(
    owner: Option<String>,
    detail: &str,
    event_index: Option<usize>,
) -> serde_json::Value {
    let mut data = serde_json::json!({ "owner": owner });
    if !detail.is_empty() {
        data["detail"] = detail.into();
    }
    if let Some(i) = event_index {
        data["eventIndex"] = i.into();
    }
    data
}

/// What the leaf's statements demand of the new key, and whether the
/// request proves it. Returns what the new certificate can claim.
fn check_node_key(
    statements: &[String],
    attestation: Option<&TpmKeyAttestation>,
    csr: &VerifiedCsr,
) -> Result<NodeKeyKind, RenewReason> {
    let ak_statements: Vec<&String> = statements
        .iter()
        .filter(|s| s.starts_with(wtpm::AK_STATEMENT_PREFIX))
        .collect();
    let statement = match ak_statements.as_slice() {
        [] => return Ok(NodeKeyKind::Unattested),
        [one] => *one,
        _ => return Err(RenewReason::StatementMalformed),
    };
    let named = wtpm::parse_ak_statement(statement).map_err(|_| RenewReason::StatementMalformed)?;
    let att = attestation.ok_or(RenewReason::KeyAttestationMissing)?;
    // An AK public area that does not even parse is not the named AK.
    let ak = Public::parse(&att.ak_public).map_err(|_| RenewReason::AkMismatch)?;
    if !bool::from(ak.name().as_slice().ct_eq(named.as_slice())) {
        return Err(RenewReason::AkMismatch);
    }
    if !wtpm::is_attestation_key(&ak) {
        return Err(RenewReason::AkAttributes);
    }
    wtpm::verify_key_certification(
        &ak,
        &att.key_public,
        &att.certify_info,
        &att.signature,
        &csr.sha256,
        &csr.spki_der,
    )
    .map_err(|e| RenewReason::node_key(&e))?;
    Ok(NodeKeyKind::Tpm)
}

mod boot;
#[cfg(test)]
mod tests;
