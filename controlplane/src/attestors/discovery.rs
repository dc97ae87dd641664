//! `discovery`: a PXE ramdisk vouched for twice, by the single-use discovery
//! token on its command line and by the site node that served it, which
//! signed a `SignedDiscoveryAssertion` while holding the site's boot lease.
//!
//! In the join transaction, in this order (each failure is a refusal with the
//! reason named; the transaction rolls back, so nothing is spent):
//! 1. the request: role `ramdisk` (`discovery-role`); the evidence parses
//!    (`assertion-malformed`); it never admitted a join before
//!    (`assertion-reused`);
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
//!    until it admits.
//!
//! Then the assertion is recorded in `attestation_uses` until it would be
//! stale anyway, the token's use is spent, and the machine joins as a new
//! ramdisk node of that site whose certificate lasts at most
//! `[discovery] cert_ttl`, never past its boot entry's end, and which may be
//! sent only `allowed_kinds`. The ramdisk nodes of earlier commissionings of
//! the same machine are retired ([`crate::boot::retire_superseded`]).
//!
//! The UUIDs here are claims: the asserted one is what iPXE or the boot
//! entry said, the machine's is its own word. Only the boot entry's UUID,
//! which its token's expect carries (JoinService checks the claims against
//! it), becomes the node's hardware key ([`crate::hardware`]).

use bc_wire::agent::Role;
use bc_wire::site;
use rusqlite::Transaction;

use crate::attestor::{
    normalize_mac, normalize_product_uuid, AttestInput, AttestationResult, Attestor, NodeKeyKind,
    Refusal, Verdict,
};
use crate::attestors::join_token::{live_token, TOKEN_EXHAUSTED, TOKEN_ROLE};
use crate::boot::DISCOVERY_ROLE;
use crate::config::{DiscoveryApproval, DiscoveryConfig};
use crate::db::{DbError, UnixMs};
use crate::{hardware, records, sites, tokens, uses};

pub mod approval;

pub const DISCOVERY: &str = "discovery";

pub const DISCOVERY_ROLE_REASON: &str = "discovery-role";
pub const ASSERTION_MALFORMED: &str = "assertion-malformed";
pub const ASSERTION_REUSED: &str = "assertion-reused";
pub const TOKEN_NOT_SINGLE_USE: &str = "token-not-single-use";
pub const TOKEN_SITE: &str = "token-site";
pub const TOKEN_MAC: &str = "token-mac";
pub const SIGNER_UNKNOWN: &str = "signer-unknown";
pub const SIGNER_RETIRED: &str = "signer-retired";
pub const SIGNER_NOT_SITE: &str = "signer-not-site";
pub const LEASE_NOT_HELD: &str = "lease-not-held";
pub const LEASE_EPOCH: &str = "lease-epoch";
pub const SIGNER_CERTIFICATE: &str = "signer-certificate";
pub const ASSERTION_SIGNATURE: &str = "assertion-signature";
pub const ASSERTION_STALE: &str = "assertion-stale";
pub const ASSERTION_FUTURE: &str = "assertion-future";
pub const MAC_NOT_CLAIMED: &str = "mac-not-claimed";
pub const PRODUCT_UUID_MISMATCH: &str = "product-uuid-mismatch";

/// How far ahead of the database's time an assertion may be issued (the
/// site node's clock may run a little ahead).
const MAX_FUTURE_MS: i64 = 60_000;

pub struct DiscoveryAttestor {
    config: DiscoveryConfig,
}

impl DiscoveryAttestor {
    pub fn new(config: DiscoveryConfig) -> Self {
        DiscoveryAttestor { config }
    }
}

impl Attestor for DiscoveryAttestor {
    fn id(&self) -> &str {
        DISCOVERY
    }

    fn verify(&self, tx: &Transaction<'_>, input: &AttestInput<'_>) -> Result<Verdict, Refusal> {
        if input.role != Role::Ramdisk {
            return Err(Refusal::new(DISCOVERY_ROLE_REASON));
        }
        let (signed, assertion) =
            site::parse_signed(input.evidence).map_err(|_| Refusal::new(ASSERTION_MALFORMED))?;
        let subject = bc_wire::signing::key_id(input.evidence);
        if uses::is_spent(tx, DISCOVERY, &subject)? {
            return Err(Refusal::new(ASSERTION_REUSED).with_node(Some(&assertion.node_id)));
        }
        let asserted_mac =
            normalize_mac(&assertion.mac).map_err(|_| Refusal::new(ASSERTION_MALFORMED))?;

        // The token.
        let (token, row) = live_token(tx, input)?;
        let refuse = |reason: &str| {
            Refusal::new(reason)
                .with_token(Some(&token.id))
                .with_node(Some(&assertion.node_id))
        };
        if row.role != DISCOVERY_ROLE {
            return Err(refuse(TOKEN_ROLE));
        }
        if row.uses_left <= 0 {
            return Err(refuse(TOKEN_EXHAUSTED));
        }
        if row.uses_left != 1 {
            return Err(refuse(TOKEN_NOT_SINGLE_USE));
        }
        if row.site_id.as_deref() != Some(assertion.site_id.as_str()) {
            return Err(refuse(TOKEN_SITE));
        }
        if row.expect.mac.as_ref().is_some_and(|m| *m != asserted_mac) {
            return Err(refuse(TOKEN_MAC));
        }

        // The signer.
        let signer = records::node_for_update(tx, &assertion.node_id)?
            .ok_or_else(|| refuse(SIGNER_UNKNOWN))?;
        if signer.retired_at.is_some() {
            return Err(refuse(SIGNER_RETIRED));
        }
        let scope = records::node_scope(tx, &signer.id)?;
        if signer.role != Role::Site.name() || scope.site_id.as_deref() != Some(&assertion.site_id)
        {
            return Err(refuse(SIGNER_NOT_SITE));
        }
        let lease = sites::get_lease(tx, &site::boot_lease_name(&assertion.site_id))?;
        let lease = lease
            .filter(|l| l.holder_at(input.now) == Some(signer.id.as_str()))
            .ok_or_else(|| refuse(LEASE_NOT_HELD))?;
        if lease.epoch != assertion.lease_epoch {
            return Err(refuse(LEASE_EPOCH));
        }
        let keys = live_cert_keys(tx, &signer.id, signer.identity_generation, input.now)?;
        if keys.is_empty() {
            return Err(refuse(SIGNER_CERTIFICATE));
        }
        if !keys
            .iter()
            .any(|spki| site::verify_assertion(spki, &signed).is_ok())
        {
            return Err(refuse(ASSERTION_SIGNATURE));
        }

        // Freshness.
        let valid_until = assertion.valid_until_with(self.config.max_age_ms);
        if input.now >= valid_until {
            return Err(refuse(ASSERTION_STALE));
        }
        if assertion.issued_at_unix_ms > input.now.saturating_add(MAX_FUTURE_MS) {
            return Err(refuse(ASSERTION_FUTURE));
        }

        // The machine.
        let claimed = input
            .claims
            .macs
            .iter()
            .any(|m| normalize_mac(m).ok().as_deref() == Some(asserted_mac.as_str()));
        if !claimed {
            return Err(refuse(MAC_NOT_CLAIMED));
        }
        if !assertion.product_uuid.is_empty() {
            let want = normalize_product_uuid(&assertion.product_uuid).ok();
            let have = normalize_product_uuid(&input.claims.product_uuid).ok();
            if want.is_none() || want != have {
                return Err(refuse(PRODUCT_UUID_MISMATCH));
            }
        }

        // Who vouches for the machine beyond the spec's checks: under
        // `[discovery] approval = "unknown-machines"`, an operator, for an
        // entry that expects no EK.
        let entry = crate::boot::entry_of_token(tx, &token.id)?;
        // Merge hook: the EK this join proved with its TPM evidence (the
        // TPM-evidence branch); `None`: the ramdisk proved no TPM.
        let proven_ek: Option<approval::ProvenEk> = None;
        if self.config.approval == DiscoveryApproval::UnknownMachines
            && entry.as_ref().and_then(|e| e.expected_ek()).is_none()
        {
            // JoinService checks the token's expect only when it admits: a
            // join it would refuse files no request.
            crate::join::check_expect(
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
                mac: &asserted_mac,
                ek: proven_ek.as_ref(),
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

        // One join per assertion; the token is spent.
        if !uses::spend(tx, DISCOVERY, &subject, valid_until, input.now)? {
            return Err(refuse(ASSERTION_REUSED));
        }
        tokens::consume_use(tx, &token.id)?;
        // An earlier ramdisk of this machine blocks nothing (rolled back
        // with the transaction if JoinService refuses this join after all).
        if let Some(entry) = entry {
            let hk = hardware::of_result(&AttestationResult {
                expect: row.expect.clone(),
                ..AttestationResult::default()
            });
            crate::boot::retire_superseded(
                tx,
                &entry,
                hk.as_ref().map(|k| k.key.as_str()),
                input.now,
            )?;
        }
        Ok(Verdict::Admit(AttestationResult {
            token_id: Some(token.id.clone()),
            node_key: NodeKeyKind::Unattested,
            pool_id: row.pool_id,
            expect: row.expect,
            scope: Some(Box::new(records::NodeScope {
                site_id: Some(assertion.site_id),
                allowed_kinds: Some(self.config.allowed_kinds.clone()),
                max_cert_ttl_ms: Some(self.config.cert_ttl_ms),
            })),
            // Claims only: the token's expect is what an operator bound.
            proven_product_uuid: None,
            ..AttestationResult::default()
        }))
    }
}

/// The SubjectPublicKeyInfos of a node's certificates that are valid at
/// `now`: its current identity generation, not revoked, not expired.
fn live_cert_keys(
    tx: &Transaction<'_>,
    node_id: &str,
    generation: i64,
    now: UnixMs,
) -> Result<Vec<Vec<u8>>, DbError> {
    let mut st = tx.prepare(
        "SELECT der FROM node_certs WHERE node_id = ?1 AND identity_generation = ?2
           AND revoked_at IS NULL AND not_before <= ?3 AND not_after > ?3",
    )?;
    let ders = st
        .query_map(rusqlite::params![node_id, generation, now], |r| {
            r.get::<_, Vec<u8>>(0)
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ders
        .iter()
        .filter_map(|der| crate::pki::node_cert_identity(der).ok())
        .map(|id| id.spki_der)
        .collect())
}
