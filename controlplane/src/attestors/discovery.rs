//! `discovery`: a PXE ramdisk vouched for twice, by the single-use discovery
//! token on its command line and by the site node that served it, which
//! signed a `SignedDiscoveryAssertion` while holding the site's boot lease.
//!
//! In the join transaction, in this order (each failure is a refusal with the
//! reason named; the transaction rolls back, so nothing is spent):
//! 1. the request: role `ramdisk` (`discovery-role`); the evidence parses,
//!    in the one encoding of its message and with a low-S signature
//!    (`assertion-malformed`: no unknown field, no re-wrapping, not the
//!    other ECDSA twin); the assertion bytes the signature covers never
//!    admitted a join before (`assertion-reused`: the single use is keyed
//!    on them, not on anything the signature leaves out), nor filed a join
//!    request an operator denied (`approval-denied`);
//! 2. the token: the join-token checks (`token-missing` … `token-expired`),
//!    role `discovery` (`token-role`), uses left (`token-exhausted`), exactly
//!    one (`token-not-single-use`), issued for the asserted site
//!    (`token-site`), its expect.mac the asserted MAC (`token-mac`);
//! 3. the signer: a live node (`signer-unknown`), not retired
//!    (`signer-retired`), a site node of the asserted site (`signer-not-site`),
//!    holding `site:<id>:boot` now (`lease-not-held`) at exactly the asserted
//!    epoch (`lease-epoch`), with an unexpired, unrevoked certificate of its
//!    current identity (`signer-certificate`) whose key verified the
//!    signature under purpose discovery-assertion (`assertion-signature`);
//! 4. freshness: not after the earlier of not_after and issued_at +
//!    `[discovery] max_age` (15 min by default: the spec's maxAgeMs;
//!    `assertion-stale`), nor issued more than a minute ahead of the
//!    database's time (`assertion-future`);
//! 5. the machine: its claimed MACs include the asserted MAC
//!    (`mac-not-claimed`), its product UUID is the asserted one when there is
//!    one (`product-uuid-mismatch`);
//! 6. under `[discovery] approval = "unknown-machines"`, for an entry that
//!    expects no EK: an operator's approval of this join ([`approval`]:
//!    pending, `approval-denied`, `approval-busy`), which spends nothing
//!    until it admits (a denial spends the token and the assertion).
//!
//! Then the assertion is recorded in `attestation_uses` until it would be
//! stale anyway, the token's use is spent, and the machine joins as a new
//! ramdisk node of that site whose certificate lasts at most
//! `[discovery] cert_ttl`, never past its boot entry's end, and which may be
//! sent only `allowed_kinds`. The ramdisk nodes of earlier commissionings of
//! the same machine are retired ([`crate::model::boot::retire_superseded`]).
//! The entry of a running deploy workflow joins AS the workflow's node
//! instead (resolveWorkflowNode, docs/workflows.md): that node is reclaimed
//! at a new identity generation, its older certificates revoked, its role
//! ramdisk until the installed system's provisioned join.
//!
//! **The machine's TPM.** A ramdisk on a machine with a TPM sends its
//! evidence in `JoinRequest.tpm`, checked by the tpm attestor's own code
//! ([`crate::attestors::tpm::TpmAttestor::challenge`] and `prove`, with no
//! PCR policy: a PXE boot measures another chain than the installed
//! system's): after the checks above, round 1 (`tpm.hello`) is answered
//! with the tpm attestor's credential challenge under attestor
//! `discovery`, and round 2 (`tpm.answer`) proves the EK by
//! ActivateCredential and the node key by the AK's certification. A boot
//! entry that expects an EK (`boot add --ek-sha256`, or `--node` of a node
//! bound to one) admits only a join proving that EK: none is
//! `boot-ek-missing`, another `boot-ek-mismatch` (in round 1 already when
//! the EK it names is another), and the entry stays open. The proven EK is
//! the ramdisk node's hardware key (never bound: the installed node of the
//! machine holds that binding), and an AK-certified node key puts the AK
//! statement in its certificate, as a tpm join's.
//!
//! The UUIDs here are claims: the asserted one is what iPXE or the boot
//! entry said, the machine's is its own word. Only the boot entry's UUID,
//! which its token's expect carries (JoinService checks the claims against
//! it), becomes the node's hardware key ([`crate::model::hardware`]).

use bc_wire::agent::{tpm_attestation, Role};
use bc_wire::site;
use bc_wire::AttestorId;

use crate::attestors::join_token::{is_revoked, live_token};
use crate::attestors::tpm::{self, TpmAttestor, TpmProof};
use crate::model::attestor::{
    AttestInput, AttestationResult, Attestor, NodeKey, Prepared, ProvenEk, Refusal, Verdict, Work,
};
use crate::model::boot::DISCOVERY_ROLE;
use crate::model::machine::{Mac, ProductUuid};
use crate::model::{hardware, records, sites, tokens, uses};
use crate::store::{params, DbError, Tx, UnixMs};

pub(crate) mod approval;
mod reasons;
pub(crate) use reasons::DiscoveryReason;

/// `[discovery]`: what a PXE ramdisk admitted by the `discovery` attestor
/// gets, and the boot lease's TTL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryConfig {
    pub(crate) cert_ttl_ms: i64,
    pub lease_ttl_ms: i64,
    pub allowed_kinds: Vec<String>,
    /// The spec's `maxAgeMs`: an assertion is valid until the earlier of
    /// its not_after and issued_at + this.
    pub max_age_ms: i64,
    /// The spec's `approval`: who vouches for a machine whose boot entry
    /// names no EK.
    pub approval: DiscoveryApproval,
    /// `JoinPending.retry_after_seconds` while such a join waits.
    pub(crate) approval_retry_after_seconds: u32,
}

/// `[discovery] approval`: what admits the join of a boot entry that names
/// no expected EK (an entry that does admits only a join proving that EK).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DiscoveryApproval {
    /// Unset (the spec's default): the boot LAN is trusted; the first
    /// machine that brings the entry's token and assertion joins.
    #[default]
    TrustedLan,
    /// `"unknown-machines"`: such a join waits as a join request until an
    /// operator approves it (`requests approve`).
    UnknownMachines,
}

impl DiscoveryApproval {
    /// The values `[discovery] approval` takes.
    pub(crate) const VALUES: &'static [&'static str] = &["unknown-machines"];
}

/// The spec's `discoveryAllowedKinds`: bc-wire's registry keeps it (the
/// registered kinds whose roles include ramdisk), so both sides read one list.
pub use bc_wire::command::DISCOVERY_ALLOWED_KINDS;
/// A ramdisk certificate lasts at most this long.
pub(crate) const MAX_DISCOVERY_CERT_TTL_MS: i64 = 2 * 3_600_000;
impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            cert_ttl_ms: MAX_DISCOVERY_CERT_TTL_MS,
            lease_ttl_ms: crate::model::sites::DEFAULT_LEASE_TTL_MS,
            max_age_ms: bc_wire::site::ASSERTION_MAX_AGE_MS,
            approval: DiscoveryApproval::TrustedLan,
            approval_retry_after_seconds: 30,
            allowed_kinds: DISCOVERY_ALLOWED_KINDS
                .iter()
                .map(|k| (*k).to_owned())
                .collect(),
        }
    }
}

/// How far ahead of the database's time an assertion may be issued (the
/// site node's clock may run a little ahead).
const MAX_FUTURE_MS: i64 = 60_000;

pub(crate) struct DiscoveryAttestor {
    config: DiscoveryConfig,
    /// Verifies a ramdisk's TPM evidence ([`TpmAttestor::for_ramdisk`]).
    tpm: TpmAttestor,
}

impl DiscoveryAttestor {
    pub(crate) fn new(config: DiscoveryConfig, tpm: TpmAttestor) -> Self {
        DiscoveryAttestor { config, tpm }
    }
}

impl Attestor for DiscoveryAttestor {
    fn id(&self) -> AttestorId {
        AttestorId::Discovery
    }

    fn roles(&self) -> crate::model::attestor::Roles {
        crate::model::attestor::Roles {
            admits: &[Role::Ramdisk],
            refusal: Some(DiscoveryReason::Role.any()),
        }
    }

    fn takes_tpm_evidence(&self) -> bool {
        true
    }

    /// A ramdisk's TPM whose EK certificate lives at its maker's service is
    /// fetched as for a tpm join (the same rules and budget), asked for by
    /// `verify` only once the token, the assertion and its signer passed.
    fn prepare(
        &self,
        db: &crate::store::Store,
        work: &Work,
        source: Option<std::net::IpAddr>,
    ) -> Result<Prepared, Refusal> {
        self.tpm.prepare_work(db, work, source)
    }

    fn verify(&self, tx: &Tx<'_>, input: &AttestInput<'_>) -> Result<Verdict, Refusal> {
        if input.role != Role::Ramdisk {
            return Err(Refusal::new(DiscoveryReason::Role));
        }
        let (signed, assertion) = site::parse_signed(input.evidence).map_err(|e| {
            tracing::info!(error = %e, "discovery: assertion refused as malformed");
            Refusal::new(DiscoveryReason::AssertionMalformed)
        })?;
        let subject = site::use_subject(&signed);
        if let Some(reason) = spent(tx, &subject, input.evidence)? {
            return Err(Refusal::new(reason).with_node(Some(&assertion.node_id)));
        }
        let asserted_mac = Mac::parse(&assertion.mac)
            .map_err(|_| Refusal::new(DiscoveryReason::AssertionMalformed))?;

        // The token.
        let (token, row) = match live_token(tx, input) {
            Ok(live) => live,
            // PG: the check above is a plain read taken before the token's
            // `FOR UPDATE`; an operator's denial committing between them
            // (it revokes the token and spends the assertion in one
            // transaction) shows here as a revoked token. Asked again (a new
            // statement sees that commit), the assertion answers as it
            // would have had the denial come first. (Locking the token
            // first would put its refusals before `assertion-reused`.)
            Err(r) if is_revoked(&r) => {
                return Err(match spent(tx, &subject, input.evidence)? {
                    Some(reason) => Refusal::new(reason).with_node(Some(&assertion.node_id)),
                    None => r,
                });
            }
            Err(r) => return Err(r),
        };
        let refuse = |reason: DiscoveryReason| {
            Refusal::new(reason)
                .with_token(Some(&token.id))
                .with_node(Some(&assertion.node_id))
        };
        if row.role != DISCOVERY_ROLE {
            return Err(refuse(DiscoveryReason::TokenRole));
        }
        if row.uses_left <= 0 {
            return Err(refuse(DiscoveryReason::TokenExhausted));
        }
        if row.uses_left != 1 {
            return Err(refuse(DiscoveryReason::TokenNotSingleUse));
        }
        if row.site_id.as_deref() != Some(assertion.site_id.as_str()) {
            return Err(refuse(DiscoveryReason::TokenSite));
        }
        if row
            .expect
            .mac
            .as_ref()
            .is_some_and(|m| m.as_str() != asserted_mac.as_str())
        {
            return Err(refuse(DiscoveryReason::TokenMac));
        }

        // The signer.
        let signer = records::node_for_share(tx, &assertion.node_id)?
            .ok_or_else(|| refuse(DiscoveryReason::SignerUnknown))?;
        if signer.retired_at.is_some() {
            return Err(refuse(DiscoveryReason::SignerRetired));
        }
        let scope = records::node_scope(tx, &signer.id)?;
        if signer.role != Role::Site || scope.site_id.as_deref() != Some(&assertion.site_id) {
            return Err(refuse(DiscoveryReason::SignerNotSite));
        }
        let lease = sites::get_lease(tx, &site::boot_lease_name(&assertion.site_id))?;
        let lease = lease
            .filter(|l| l.holder_at(input.now) == Some(signer.id.as_str()))
            .ok_or_else(|| refuse(DiscoveryReason::LeaseNotHeld))?;
        if lease.epoch != assertion.lease_epoch {
            return Err(refuse(DiscoveryReason::LeaseEpoch));
        }
        let keys = live_cert_keys(tx, &signer.id, signer.identity_generation, input.now)?;
        if keys.is_empty() {
            return Err(refuse(DiscoveryReason::SignerCertificate));
        }
        if !keys
            .iter()
            .any(|spki| site::verify_assertion(spki, &signed).is_ok())
        {
            return Err(refuse(DiscoveryReason::AssertionSignature));
        }

        // Freshness.
        let valid_until = assertion.valid_until_with(self.config.max_age_ms);
        if input.now >= valid_until {
            return Err(refuse(DiscoveryReason::AssertionStale));
        }
        if assertion.issued_at_unix_ms > input.now.saturating_add(MAX_FUTURE_MS) {
            return Err(refuse(DiscoveryReason::AssertionFuture));
        }

        // The machine.
        let claimed = input
            .claims
            .macs
            .iter()
            .any(|m| Mac::parse(m).is_ok_and(|m| m == asserted_mac));
        if !claimed {
            return Err(refuse(DiscoveryReason::MacNotClaimed));
        }
        if !assertion.product_uuid.is_empty() {
            let want = ProductUuid::parse(&assertion.product_uuid).ok();
            let have = ProductUuid::parse(&input.claims.product_uuid).ok();
            if want.is_none() || want != have {
                return Err(refuse(DiscoveryReason::ProductUuidMismatch));
            }
        }

        // The machine's TPM, and the EK its boot entry expects.
        let entry = crate::model::boot::entry_of_token(tx, &token.id)?;
        let expected_ek = entry.as_ref().and_then(|e| e.expected_ek());
        let tpm_refusal = |r: Refusal| {
            r.with_token(Some(&token.id))
                .with_node(Some(&assertion.node_id))
        };
        let proof = match input.tpm.map(|t| t.round.as_ref()) {
            None => None,
            Some(Some(tpm_attestation::Round::Hello(hello))) => {
                let challenge = match self
                    .tpm
                    .challenge(tx, input, hello, AttestorId::Discovery)
                    .map_err(tpm_refusal)?
                {
                    tpm::Step::Done(c) => c,
                    tpm::Step::Prepare(work) => return Ok(Verdict::Prepare(work)),
                };
                check_ek(expected_ek, Some(&challenge.ek_sha256)).map_err(refuse)?;
                return Ok(Verdict::Defer(challenge.deferral));
            }
            Some(Some(tpm_attestation::Round::Answer(answer))) => {
                match self.tpm.prove(tx, input, answer).map_err(tpm_refusal)? {
                    tpm::Step::Done(p) => Some(p),
                    tpm::Step::Prepare(work) => return Ok(Verdict::Prepare(work)),
                }
            }
            Some(None) => return Err(tpm_refusal(Refusal::new(tpm::TpmReason::EvidenceMalformed))),
        };
        check_ek(expected_ek, proof.as_ref().map(|p| p.ek_sha256.as_str())).map_err(refuse)?;

        // Who vouches for the machine beyond the spec's checks: under
        // `[discovery] approval = "unknown-machines"`, an operator, for an
        // entry that expects no EK (the TPM proof above is the machine's
        // own word otherwise).
        let proven_ek = proof.as_ref().map(|p| approval::ProvenEk {
            sha256: p.ek_sha256.clone(),
            issuer: p.ek_issuer().to_owned(),
            serial: p.ek_serial().to_owned(),
        });
        if self.config.approval == DiscoveryApproval::UnknownMachines && expected_ek.is_none() {
            // JoinService checks the token's expect only when it admits: a
            // join it would refuse files no request.
            crate::model::hardware::check_expect(
                &AttestationResult {
                    expect: row.expect.clone(),
                    token_id: Some(token.id.clone()),
                    ..AttestationResult::default()
                },
                input.claims,
            )?;
            let waiting = approval::Pending {
                input,
                entry: entry.as_ref(),
                mac: asserted_mac.as_str(),
                ek: proven_ek.as_ref(),
                token_id: &token.id,
                assertion_sha256: &subject,
                assertion_expires_at: valid_until,
                retry_after_seconds: self.config.approval_retry_after_seconds,
            };
            match approval::gate(tx, &waiting).map_err(|r| {
                r.with_token(Some(&token.id))
                    .with_node(Some(&assertion.node_id))
            })? {
                approval::Gate::Wait(deferral) => return Ok(Verdict::Defer(deferral)),
                approval::Gate::Admit => {}
            }
        }

        // One join per assertion; the token is spent, and the challenge.
        if !uses::spend(tx, AttestorId::Discovery, &subject, valid_until, input.now)? {
            return Err(refuse(DiscoveryReason::AssertionReused));
        }
        tokens::consume_use(tx, &token.id)?;
        if let Some(p) = &proof {
            self.tpm.spend(tx, p, input.now).map_err(tpm_refusal)?;
        }
        let mut result = admitted(
            &self.config,
            token.id.clone(),
            row.pool_id,
            row.expect,
            assertion.site_id,
            proof,
        );
        let workflow_node = match &entry {
            Some(e) => resolve_workflow_node(tx, &e.workflow_id, &result)?,
            None => None,
        };
        if let Some(node) = &workflow_node {
            result.reclaim_node_id = Some(node.clone());
            result.change_role = true;
        }
        // An earlier ramdisk of this machine blocks nothing (rolled back
        // with the transaction if JoinService refuses this join after all).
        if let Some(entry) = entry {
            let hk = hardware::of_result(&result);
            crate::model::boot::retire_superseded(
                tx,
                &entry,
                hk.as_ref().map(|k| k.key.as_str()),
                workflow_node.as_deref(),
                input.now,
            )?;
        }
        Ok(Verdict::Admit(Box::new(result)))
    }
}

/// The spec's resolveWorkflowNode: the node a running workflow of this
/// boot entry is about (its ramdisk joins AS that node: JoinService reclaims
/// it at a new identity generation, revoking its older certificates, as
/// role ramdisk): a deploy's node, a commission's `--node`, else, for a
/// commission, the live node whose hardware key is the EK this join just
/// proved (a known machine re-commissioned keeps its node id). `None`: no
/// workflow, or a machine nothing knows; it joins as a new ramdisk node.
fn resolve_workflow_node(
    tx: &Tx<'_>,
    workflow_id: &str,
    result: &AttestationResult,
) -> Result<Option<String>, DbError> {
    let Some(w) = crate::model::workflows::get(tx, workflow_id)?.filter(|w| w.state == "running")
    else {
        return Ok(None);
    };
    if w.node_id.is_some() || w.kind != "commission" {
        return Ok(w.node_id);
    }
    match hardware::of_result(result) {
        Some(hk) if hk.key.starts_with("tpm-ek:") => hardware::live_node_with_key(tx, &hk.key),
        _ => Ok(None),
    }
}

/// Why the assertion is spent, if it is: by an operator's denial of the
/// request it filed, or by the join it admitted.
fn spent(tx: &Tx<'_>, subject: &str, envelope: &[u8]) -> Result<Option<DiscoveryReason>, DbError> {
    if !uses::is_spent(tx, AttestorId::Discovery, subject)? && !spent_under_old_key(tx, envelope)? {
        return Ok(None);
    }
    Ok(Some(match approval::denied_assertion(tx, subject)? {
        true => DiscoveryReason::ApprovalDenied,
        false => DiscoveryReason::AssertionReused,
    }))
}

/// Whether an earlier control plane recorded this assertion's use under
/// its old key, the SHA-256 of the envelope as sent (which is the same
/// envelope now that [`site::parse_signed`] accepts one encoding only):
/// a use from before an upgrade stays spent until it expires.
fn spent_under_old_key(tx: &Tx<'_>, envelope: &[u8]) -> Result<bool, DbError> {
    uses::is_spent(
        tx,
        AttestorId::Discovery,
        &hex::encode(bc_wire::sha256(envelope)),
    )
}

/// Whether the EK a join names or proved (`None`: no TPM evidence) is the
/// one its boot entry expects (`None`: any, or none).
fn check_ek(expected: Option<&str>, ek: Option<&str>) -> Result<(), DiscoveryReason> {
    match (expected, ek) {
        (Some(_), None) => Err(DiscoveryReason::BootEkMissing),
        (Some(want), Some(have)) if want != have => Err(DiscoveryReason::BootEkMismatch),
        _ => Ok(()),
    }
}

/// The admitted ramdisk: a new node of the asserted site, scoped to the
/// commissioning kinds and `[discovery] cert_ttl`, with what its TPM proved.
fn admitted(
    config: &DiscoveryConfig,
    token_id: String,
    pool_id: Option<String>,
    expect: crate::model::machine::Expect,
    site_id: String,
    proof: Option<TpmProof>,
) -> AttestationResult {
    let (node_key, ek) = match proof {
        Some(p) => (
            p.node_key,
            Some(ProvenEk {
                sha256: p.ek_sha256,
                assurance: p.ek_assurance,
                // Proven, but not bound: the machine's installed node holds
                // the binding; this is the ramdisk's hardware key only.
                bound: false,
            }),
        ),
        None => (NodeKey::Unattested, None),
    };
    AttestationResult {
        token_id: Some(token_id),
        node_key,
        ek,
        pool_id,
        expect,
        scope: Some(Box::new(records::NodeScope {
            site_id: Some(site_id),
            allowed_kinds: Some(config.allowed_kinds.clone()),
            max_cert_ttl_ms: Some(config.cert_ttl_ms),
        })),
        // Claims only: the token's expect is what an operator bound.
        proven_product_uuid: None,
        ..AttestationResult::default()
    }
}

/// The SubjectPublicKeyInfos of a node's certificates that are valid at
/// `now`: its current identity generation, not revoked, not expired.
fn live_cert_keys(
    tx: &Tx<'_>,
    node_id: &str,
    generation: i64,
    now: UnixMs,
) -> Result<Vec<Vec<u8>>, DbError> {
    let ders = tx
        .query_map(
            "SELECT der FROM node_certs WHERE node_id = ?1 AND identity_generation = ?2
           AND revoked_at IS NULL AND not_before <= ?3 AND not_after > ?3",
            params![node_id, generation, now],
            |r| r.get::<Vec<u8>>(0),
        )?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ders
        .iter()
        .filter_map(|der| crate::pki::node_cert_identity(der).ok())
        .map(|id| id.spki_der)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attestors::tpm::state::ChallengeKey;
    use crate::attestors::tpm::TpmConfig;
    use crate::test_support::temp_db;
    use bc_wire::agent::HardwareClaims;
    use bc_wire::site_v1::{DiscoveryAssertion, SignedDiscoveryAssertion};
    use prost::Message;

    fn signed(site_id: &str) -> SignedDiscoveryAssertion {
        let key = p256::ecdsa::SigningKey::from_slice(&[0x42; 32]).unwrap();
        let assertion = DiscoveryAssertion {
            site_id: site_id.into(),
            node_id: "node_site".into(),
            mac: "52:54:00:12:34:56".into(),
            ..Default::default()
        };
        site::sign_assertion(&assertion, "kid".into(), |m| {
            let s: p256::ecdsa::Signature = p256::ecdsa::signature::Signer::sign(&key, m);
            Ok::<_, ()>(s.to_bytes().into())
        })
        .unwrap()
    }

    /// The reason the attestor refuses `evidence` with (no token: a
    /// refusal past step 1 is `token-missing`).
    fn refusal(db: &crate::store::Store, evidence: &[u8]) -> String {
        let attestor = DiscoveryAttestor::new(
            DiscoveryConfig::default(),
            TpmAttestor::new(TpmConfig::default(), ChallengeKey::new([1; 32])),
        );
        let claims = HardwareClaims::default();
        let input = AttestInput {
            role: Role::Ramdisk,
            evidence,
            token: None,
            csr_der: &[],
            csr_sha256: [0; 32],
            csr_spki_der: &[],
            csr_spki_sha256: [0; 32],
            claims: &claims,
            tpm: None,
            now: 1_000,
            source: None,
            prepared: &crate::model::attestor::Prepared::default(),
        };
        match db
            .write(|tx| Ok::<_, DbError>(attestor.verify(tx, &input)))
            .unwrap()
        {
            Err(r) => r.reason.to_string(),
            Ok(_) => panic!("admitted"),
        }
    }

    /// A used assertion stays used whatever is done to what its signature
    /// leaves out: under another key_id it is `assertion-reused`; with an
    /// unknown field appended (to the envelope or the assertion) or as the
    /// high-S twin of its signature it is `assertion-malformed`.
    #[test]
    fn a_used_assertion_is_refused_however_it_is_rewrapped() {
        let t = temp_db();
        let s = signed("site_a");
        t.db.write(|tx| {
            uses::spend(
                tx,
                AttestorId::Discovery,
                &site::use_subject(&s),
                i64::MAX,
                0,
            )
        })
        .unwrap();
        assert_eq!(
            refusal(&t.db, &s.encode_to_vec()),
            DiscoveryReason::AssertionReused
        );
        let rewrapped = SignedDiscoveryAssertion {
            key_id: "another".into(),
            ..s.clone()
        };
        assert_eq!(
            refusal(&t.db, &rewrapped.encode_to_vec()),
            DiscoveryReason::AssertionReused
        );
        let no_kid = SignedDiscoveryAssertion {
            key_id: String::new(),
            ..s.clone()
        };
        assert_eq!(
            refusal(&t.db, &no_kid.encode_to_vec()),
            DiscoveryReason::AssertionReused
        );
        let mut extra = s.encode_to_vec();
        extra.extend_from_slice(&[0x78, 0x01]);
        assert_eq!(refusal(&t.db, &extra), DiscoveryReason::AssertionMalformed);
        let mut body = s.assertion.clone();
        body.extend_from_slice(&[0x78, 0x01]);
        let body_extra = SignedDiscoveryAssertion {
            assertion: body,
            ..s.clone()
        };
        assert_eq!(
            refusal(&t.db, &body_extra.encode_to_vec()),
            DiscoveryReason::AssertionMalformed
        );
        let sig = p256::ecdsa::Signature::from_slice(&s.signature).unwrap();
        let twin = p256::ecdsa::Signature::from_scalars(sig.r(), -sig.s()).unwrap();
        let high = SignedDiscoveryAssertion {
            signature: twin.to_bytes().to_vec(),
            ..s.clone()
        };
        assert_eq!(
            refusal(&t.db, &high.encode_to_vec()),
            DiscoveryReason::AssertionMalformed
        );
        // An unused assertion passes step 1 (and meets the missing token).
        assert_eq!(
            refusal(&t.db, &signed("site_b").encode_to_vec()),
            crate::attestors::join_token::TokenReason::Missing
        );
    }

    /// The reason the attestor refuses `evidence` with, presented with
    /// `token` from 127.0.0.9.
    fn refusal_with(
        db: &crate::store::Store,
        evidence: &[u8],
        token: &bc_wire::token::JoinToken,
    ) -> String {
        let attestor = DiscoveryAttestor::new(
            DiscoveryConfig::default(),
            TpmAttestor::new(TpmConfig::default(), ChallengeKey::new([1; 32])),
        );
        let claims = HardwareClaims::default();
        let opened = crate::model::attestor::OpenedToken::Parsed(token.clone());
        let input = AttestInput {
            role: Role::Ramdisk,
            evidence,
            token: Some(&opened),
            csr_der: &[],
            csr_sha256: [0; 32],
            csr_spki_der: &[],
            csr_spki_sha256: [0; 32],
            claims: &claims,
            tpm: None,
            now: 1_000,
            source: Some("127.0.0.9".parse().unwrap()),
            prepared: &crate::model::attestor::Prepared::default(),
        };
        match db
            .write(|tx| Ok::<_, DbError>(attestor.verify(tx, &input)))
            .unwrap()
        {
            Err(r) => r.reason.to_string(),
            Ok(_) => panic!("admitted"),
        }
    }

    /// A join that waits on its token's lock while an operator denies its
    /// request is refused `approval-denied`, as one after the denial (PG:
    /// it read the assertion unspent before the denial committed, then
    /// found the token revoked; failed `token-revoked` without the second
    /// look in `verify`).
    #[test]
    fn a_join_verified_while_its_request_is_denied_is_refused_approval_denied() {
        let t = crate::race_tests::pg();
        let (tok, _) =
            crate::model::tokens::create_token(&t.db, Role::Ramdisk, 1, 3_600_000).unwrap();
        let s = signed("site_a");
        let subject = site::use_subject(&s);
        let claims = HardwareClaims::default();
        let input = AttestInput {
            role: Role::Ramdisk,
            evidence: &[],
            token: None,
            csr_der: &[],
            csr_sha256: [0; 32],
            csr_spki_der: &[],
            csr_spki_sha256: [1; 32],
            claims: &claims,
            tpm: None,
            now: 1_000,
            source: Some("127.0.0.9".parse().unwrap()),
            prepared: &crate::model::attestor::Prepared::default(),
        };
        let gate = t.db.write(|tx| {
            approval::gate(
                tx,
                &approval::Pending {
                    input: &input,
                    entry: None,
                    mac: "52:54:00:12:34:56",
                    ek: None,
                    token_id: &tok.id,
                    assertion_sha256: &subject,
                    assertion_expires_at: 1_000 + 900_000,
                    retry_after_seconds: 7,
                },
            )
        });
        let request_id = match gate {
            Ok(approval::Gate::Wait(crate::model::attestor::Deferral::Pending {
                request_id,
                ..
            })) => request_id,
            other => panic!("not pending: {other:?}"),
        };
        let evidence = s.encode_to_vec();
        let (a, b) = crate::race_tests::race(
            &t,
            |db| crate::model::enroll::deny(db, &request_id),
            |db| refusal_with(db, &evidence, &tok),
        );
        a.unwrap();
        assert_eq!(b, DiscoveryReason::ApprovalDenied);
    }
}
