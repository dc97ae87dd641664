//! `[discovery] approval = "unknown-machines"` (the spec's `approval`
//! option): a discovery join of a boot entry that names no expected EK
//! waits for an operator, as the tpm attestor's enrollment does, through
//! the same join requests (`requests list|approve|deny`,
//! [`crate::attestors::tpm::enroll`]) and the same `JoinPending` deferral.
//!
//! Without a TPM proof the site cannot tell the machine from a neighbour
//! that fetched its script first, so the operator decides, per join:
//! - a request names the boot entry, the MAC and product UUID the entry was
//!   for, the EK the ramdisk proved (or none: "no TPM"), the join's source
//!   address, and the node key of its CSR;
//! - it admits exactly that evidence: the same entry and the same EK, or
//!   with no EK the same node key (the ramdisk re-sends the same CSR while
//!   it waits), once;
//! - a pending or denied request spends nothing: the token, the assertion
//!   and the entry stay for the real machine, whose own join files its own
//!   request;
//! - denied: that evidence's joins of that entry are refused
//!   (`approval-denied`);
//! - an entry has at most [`MAX_PENDING_PER_ENTRY`] pending requests; a
//!   join past that is refused (`approval-busy`), so that a neighbour
//!   minting node keys cannot fill the table.
//!
//! Called by the discovery attestor after every check of the spec (token,
//! signer, freshness, machine) passed and before anything is spent, so a
//! request is filed only for a join that would otherwise have been
//! admitted.

use std::net::IpAddr;

use crate::attestor::{AttestInput, Deferral, Refusal};
use crate::attestors::tpm::enroll::{self, JoinRequestRow};
use crate::boot::BootEntry;
use crate::store::{params, DbError, LockKey, Tx};

pub const APPROVAL_DENIED: &str = "approval-denied";
pub const APPROVAL_BUSY: &str = "approval-busy";

/// Pending requests one boot entry may have at once: the machine itself
/// needs one per boot attempt; more is a neighbour.
pub const MAX_PENDING_PER_ENTRY: i64 = 8;

/// The TPM a discovery join proved (its EK, verified by the tpm attestor's
/// checks): what an approval is bound to when there is one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProvenEk {
    /// Lowercase hex SHA-256 of the EK's SubjectPublicKeyInfo.
    pub sha256: String,
    pub issuer: String,
    pub serial: String,
}

/// What the operator's word means for this join.
#[derive(Debug)]
pub enum Gate {
    /// An approved request admits it (marked used in this transaction,
    /// which rolls back with it if JoinService refuses the join after all).
    Admit,
    /// Pending: the agent waits and asks again with the same CSR.
    Wait(Deferral),
}

/// The join that awaits a decision.
pub struct Pending<'a> {
    pub input: &'a AttestInput<'a>,
    /// The boot entry the token belongs to (`None`: a discovery token no
    /// entry minted).
    pub entry: Option<&'a BootEntry>,
    /// The MAC the token admits (the asserted one).
    pub mac: &'a str,
    pub ek: Option<&'a ProvenEk>,
    pub retry_after_seconds: u32,
}

/// Files, finds or applies the operator's decision on this join.
pub fn gate(tx: &Tx<'_>, p: &Pending<'_>) -> Result<Gate, Refusal> {
    let node_key = hex::encode(p.input.csr_spki_sha256);
    let workflow = p.entry.map(|e| e.workflow_id.as_str());
    let pending = |req: &JoinRequestRow| {
        Gate::Wait(Deferral::Pending {
            request_id: req.id.clone(),
            retry_after_seconds: p.retry_after_seconds,
        })
    };
    // PG: an advisory lock on the boot entry's requests (`""` for a token no
    // entry minted): the count below and the insert after it are one step,
    // so concurrent joins of one entry cannot file more than its maximum.
    tx.lock(&[LockKey {
        namespace: "discovery-requests",
        key: workflow.unwrap_or(""),
    }])?;
    match open_request(tx, workflow, p.ek.map(|e| e.sha256.as_str()), &node_key)? {
        Some(req) => match req.status.as_str() {
            enroll::STATUS_PENDING => Ok(pending(&req)),
            enroll::STATUS_APPROVED => {
                enroll::mark_used(tx, &req.id, p.input.now)?;
                tracing::info!(request_id = %req.id, workflow = workflow.unwrap_or(""), "discovery: approved join admitted");
                Ok(Gate::Admit)
            }
            _ => Err(Refusal::new(APPROVAL_DENIED)),
        },
        None => {
            if pending_count(tx, workflow)? >= MAX_PENDING_PER_ENTRY {
                tracing::info!(
                    workflow = workflow.unwrap_or(""),
                    max = MAX_PENDING_PER_ENTRY,
                    "discovery: join refused, its boot entry has as many pending join requests as it may"
                );
                return Err(Refusal::new(APPROVAL_BUSY));
            }
            let req = insert(tx, p, &node_key)?;
            tracing::info!(
                request_id = %req.id,
                workflow = workflow.unwrap_or(""),
                mac = p.mac,
                ek_sha256 = req.ek_sha256.as_deref().unwrap_or("no TPM"),
                source = req.source.as_deref().unwrap_or(""),
                "discovery: join waits for an operator (requests approve|deny)"
            );
            Ok(pending(&req))
        }
    }
}

/// The open request of this entry for this evidence: its EK when it proved
/// one, else its node key.
fn open_request(
    tx: &Tx<'_>,
    workflow: Option<&str>,
    ek: Option<&str>,
    node_key: &str,
) -> Result<Option<JoinRequestRow>, DbError> {
    let sql = format!(
        "{} WHERE attestor = 'discovery' AND used_at IS NULL
           AND workflow_id IS NOT DISTINCT FROM CAST(?1 AS TEXT)
           AND CASE WHEN CAST(?2 AS TEXT) IS NOT NULL THEN ek_sha256 = ?2
                    ELSE ek_sha256 IS NULL AND node_key_sha256 = ?3 END",
        enroll::REQUEST_SELECT
    );
    tx.query_opt_map(&sql, params![workflow, ek, node_key], enroll::read_request)
}

fn pending_count(tx: &Tx<'_>, workflow: Option<&str>) -> Result<i64, DbError> {
    tx.query_one(
        "SELECT count(*) FROM join_requests
         WHERE attestor = 'discovery' AND status = 'pending' AND used_at IS NULL
           AND workflow_id IS NOT DISTINCT FROM CAST(?1 AS TEXT)",
        params![workflow],
    )
    .and_then(|r| r.get(0))
}

fn insert(tx: &Tx<'_>, p: &Pending<'_>, node_key: &str) -> Result<JoinRequestRow, DbError> {
    let id = crate::ids::random_id("req_").map_err(DbError::Random)?;
    let row = JoinRequestRow {
        id,
        attestor: super::DISCOVERY.to_owned(),
        ek_sha256: p.ek.map(|e| e.sha256.clone()),
        ek_issuer: p.ek.map(|e| e.issuer.clone()).unwrap_or_default(),
        ek_serial: p.ek.map(|e| e.serial.clone()).unwrap_or_default(),
        status: enroll::STATUS_PENDING.to_owned(),
        pool_id: None,
        site_id: p.entry.map(|e| e.site_id.clone()),
        created_at: p.input.now,
        decided_at: None,
        used_at: None,
        workflow_id: p.entry.map(|e| e.workflow_id.clone()),
        mac: Some(p.mac.to_owned()),
        product_uuid: p.entry.and_then(|e| e.product_uuid.clone()),
        source: p.input.source.map(|ip: IpAddr| ip.to_string()),
        node_key_sha256: Some(node_key.to_owned()),
    };
    tx.execute(
        "INSERT INTO join_requests (id, attestor, ek_sha256, ek_issuer, ek_serial, status,
             site_id, created_at, workflow_id, mac, product_uuid, source, node_key_sha256)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        params![
            row.id,
            row.attestor,
            row.ek_sha256,
            row.ek_issuer,
            row.ek_serial,
            row.status,
            row.site_id,
            row.created_at,
            row.workflow_id,
            row.mac,
            row.product_uuid,
            row.source,
            row.node_key_sha256
        ],
    )?;
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::temp_db;
    use bc_wire::agent::{HardwareClaims, Role};

    const NOW: i64 = 1_000;

    /// A join whose CSR key hashes to `[key; 32]`, from 127.0.0.9.
    fn with_input<T>(key: u8, f: impl FnOnce(&AttestInput<'_>) -> T) -> T {
        let claims = HardwareClaims::default();
        let input = AttestInput {
            role: Role::Ramdisk,
            evidence: &[],
            token: None,
            csr_der: &[],
            csr_sha256: [0; 32],
            csr_spki_der: &[],
            csr_spki_sha256: [key; 32],
            claims: &claims,
            tpm: None,
            now: NOW,
            source: Some("127.0.0.9".parse().unwrap()),
            prepared: &crate::attestor::Prepared::default(),
        };
        f(&input)
    }

    fn gate_for(db: &crate::store::Store, key: u8, ek: Option<&ProvenEk>) -> Result<Gate, Refusal> {
        with_input(key, |input| {
            db.write(|tx| {
                gate(
                    tx,
                    &Pending {
                        input,
                        entry: None,
                        mac: "52:54:00:12:34:56",
                        ek,
                        retry_after_seconds: 7,
                    },
                )
            })
        })
    }

    fn request_id(g: Result<Gate, Refusal>) -> String {
        match g {
            Ok(Gate::Wait(Deferral::Pending {
                request_id,
                retry_after_seconds,
            })) => {
                assert_eq!(retry_after_seconds, 7);
                request_id
            }
            other => panic!("not pending: {other:?}"),
        }
    }

    /// With a proven EK (the TPM-evidence branch's), the request is that
    /// EK's: a later join of the same TPM with another node key (a second
    /// boot) finds it, and an approval admits that join once.
    #[test]
    fn a_proven_ek_binds_the_request_across_node_keys() {
        let t = temp_db();
        let ek = ProvenEk {
            sha256: "ab".repeat(32),
            issuer: "CN=maker".into(),
            serial: "01".into(),
        };
        let id = request_id(gate_for(&t.db, 1, Some(&ek)));
        assert_eq!(request_id(gate_for(&t.db, 2, Some(&ek))), id);
        let rows = enroll::list_requests(&t.db).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].ek_sha256.as_deref(), Some(ek.sha256.as_str()));
        assert_eq!(rows[0].ek_issuer, "CN=maker");
        assert_eq!(rows[0].source.as_deref(), Some("127.0.0.9"));
        // The same node key without the EK is another machine's evidence.
        assert_ne!(request_id(gate_for(&t.db, 1, None)), id);
        enroll::approve(&t.db, &id, None, None).unwrap();
        assert!(matches!(gate_for(&t.db, 3, Some(&ek)), Ok(Gate::Admit)));
        // Used: the next join of that TPM files a new request.
        assert_ne!(request_id(gate_for(&t.db, 3, Some(&ek))), id);
    }

    /// Without an EK, each node key is its own request: a denial refuses
    /// that one, not the next; past eight pending ones, `approval-busy`.
    #[test]
    fn without_an_ek_each_node_key_is_its_own_request() {
        let t = temp_db();
        let first = request_id(gate_for(&t.db, 1, None));
        enroll::deny(&t.db, &first).unwrap();
        let denied = gate_for(&t.db, 1, None).unwrap_err();
        assert_eq!(denied.reason, APPROVAL_DENIED);
        for key in 2..=9 {
            request_id(gate_for(&t.db, key, None));
        }
        let busy = gate_for(&t.db, 10, None).unwrap_err();
        assert_eq!(busy.reason, APPROVAL_BUSY);
        // Pending ones are answered again; the denied one does not count.
        request_id(gate_for(&t.db, 9, None));
        assert_eq!(enroll::list_requests(&t.db).unwrap().len(), 9);
    }

    /// An entry's pending requests stay within their maximum however many
    /// unknown machines join at once (the `discovery-requests:` advisory lock
    /// over the count and the insert; fails without it).
    #[test]
    fn unknown_machines_joining_at_once_file_no_request_past_the_maximum() {
        let t = crate::race_tests::pg();
        let gate = |db: &crate::store::Store, key: u8| {
            gate_for(db, key, None)
                .map(|g| matches!(g, Gate::Wait(Deferral::Pending { .. })))
                .map_err(|r| r.reason)
        };
        for key in 1..MAX_PENDING_PER_ENTRY {
            assert_eq!(gate(&t.db, u8::try_from(key).unwrap()), Ok(true));
        }
        let (a, b) = crate::race_tests::race(&t, |db| gate(db, 100), |db| gate(db, 101));
        assert_eq!(a, Ok(true), "the last request the entry may have is filed");
        assert_eq!(b, Err(APPROVAL_BUSY.to_owned()));
    }
}
