//! `[discovery] approval = "unknown-machines"` (the spec's `approval`
//! option): a discovery join of a boot entry that names no expected EK
//! waits for an operator, as the tpm attestor's enrollment does, through
//! the same join requests (`requests list|approve|deny`,
//! [`crate::model::enroll`]) and the same `JoinPending` deferral.
//!
//! Without a TPM proof the site cannot tell the machine from a neighbour
//! that fetched its script first, so the operator decides, per join:
//! - a request names the boot entry, the MAC and product UUID the entry was
//!   for, the EK the ramdisk proved (or none: "no TPM"), the join's source
//!   address, the node key of its CSR, and the token and signed assertion
//!   it came with (one boot script);
//! - it admits exactly that evidence: the same entry and the same EK, or
//!   with no EK the same node key (the ramdisk re-sends the same CSR while
//!   it waits), once;
//! - one script files one request: a join with the token or the assertion
//!   of an open request, whatever its node key, is answered with that
//!   request (it waits on it) and files none, so a neighbour that fetched
//!   the victim's script and joins with fresh node keys adds one row;
//! - a pending request spends nothing: the token, the assertion and the
//!   entry stay for the real machine, whose own script (another token and
//!   assertion) files its own request;
//! - denied: that evidence's joins of that entry are refused
//!   (`approval-denied`), and the token and assertion it came with are
//!   spent ([`enroll::deny`]), so the same script never files again;
//! - each source address may have at most [`MAX_PENDING_PER_SOURCE`]
//!   pending requests per entry; a join past that is refused
//!   (`approval-busy`). Another source (the real machine) is still heard:
//!   a neighbour fills its own share only. An entry's pending requests are
//!   bounded anyway, one per token and at most
//!   [`crate::model::boot::MAX_LIVE_TOKENS`] live tokens per entry.
//!
//! Called by the discovery attestor after every check of the spec (token,
//! signer, freshness, machine) passed and before anything is spent, so a
//! request is filed only for a join that would otherwise have been
//! admitted.

use bc_wire::AttestorId;
use std::net::IpAddr;

use crate::model::attestor::{AttestInput, Deferral, Refusal};
use crate::model::boot::BootEntry;
use crate::model::enroll::{self, JoinRequestRow};
use crate::store::{params, DbError, LockKey, Tx};

use super::reasons::DiscoveryReason;

/// Pending requests of one boot entry from one source address at once:
/// the machine itself needs one per boot attempt (each boot brings a new
/// script: a new token and assertion); more is a neighbour.
pub(crate) const MAX_PENDING_PER_SOURCE: i64 = 4;

/// The TPM a discovery join proved (its EK, verified by the tpm attestor's
/// checks): what an approval is bound to when there is one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProvenEk {
    /// Lowercase hex SHA-256 of the EK's SubjectPublicKeyInfo.
    pub sha256: String,
    pub issuer: String,
    pub serial: String,
}

/// What the operator's word means for this join.
#[derive(Debug)]
pub(crate) enum Gate {
    /// An approved request admits it (marked used in this transaction,
    /// which rolls back with it if JoinService refuses the join after all).
    Admit,
    /// Pending: the agent waits and asks again with the same CSR.
    Wait(Deferral),
}

/// The join that awaits a decision.
pub(crate) struct Pending<'a> {
    pub input: &'a AttestInput<'a>,
    /// The boot entry the token belongs to (`None`: a discovery token no
    /// entry minted).
    pub entry: Option<&'a BootEntry>,
    /// The MAC the token admits (the asserted one).
    pub mac: &'a str,
    pub ek: Option<&'a ProvenEk>,
    /// The discovery token the join came with (its id).
    pub token_id: &'a str,
    /// The assertion's single-use key ([`bc_wire::site::use_subject`]) and
    /// when that use would expire (it is stale then).
    pub(crate) assertion_sha256: &'a str,
    pub(crate) assertion_expires_at: crate::store::UnixMs,
    pub retry_after_seconds: u32,
}

/// Files, finds or applies the operator's decision on this join.
pub(crate) fn gate(tx: &Tx<'_>, p: &Pending<'_>) -> Result<Gate, Refusal> {
    let node_key = hex::encode(p.input.csr_spki_sha256);
    let workflow = p.entry.map(|e| e.workflow_id.as_str());
    let source = p.input.source.map(|ip: IpAddr| ip.to_string());
    let pending = |req: &JoinRequestRow| {
        Gate::Wait(Deferral::Pending {
            request_id: req.id.clone(),
            retry_after_seconds: p.retry_after_seconds,
        })
    };
    // PG: an advisory lock on the boot entry's requests (`""` for a token no
    // entry minted): the lookups and count below and the insert after them
    // are one step, so concurrent joins of one entry cannot file past a
    // source's maximum nor two requests of one token or assertion (the
    // unique indexes of migration 19 back the latter across entries).
    tx.lock(&[LockKey {
        namespace: "discovery-requests",
        key: workflow.unwrap_or(""),
    }])?;
    match open_request(tx, workflow, p.ek.map(|e| e.sha256.as_str()), &node_key)? {
        Some(req) => match req.status {
            enroll::RequestStatus::Pending => Ok(pending(&req)),
            enroll::RequestStatus::Approved => {
                enroll::mark_used(tx, &req.id, p.input.now)?;
                tracing::info!(request_id = %req.id, workflow = workflow.unwrap_or(""), "discovery: approved join admitted");
                Ok(Gate::Admit)
            }
            _ => Err(Refusal::new(DiscoveryReason::ApprovalDenied)),
        },
        None => {
            if let Some(req) = request_of_script(tx, p.token_id, p.assertion_sha256)? {
                tracing::info!(
                    request_id = %req.id,
                    workflow = workflow.unwrap_or(""),
                    source = source.as_deref().unwrap_or(""),
                    "discovery: join answered with the open request of its token or assertion (one script, one request; it files none)"
                );
                return Ok(pending(&req));
            }
            if pending_count(tx, workflow, source.as_deref())? >= MAX_PENDING_PER_SOURCE {
                tracing::info!(
                    workflow = workflow.unwrap_or(""),
                    source = source.as_deref().unwrap_or(""),
                    max = MAX_PENDING_PER_SOURCE,
                    "discovery: join refused, its source has as many pending join requests for this boot entry as it may"
                );
                return Err(Refusal::new(DiscoveryReason::ApprovalBusy));
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

/// Whether an operator denied a request filed with this assertion (whose
/// denial spent it).
pub(crate) fn denied_assertion(tx: &Tx<'_>, assertion_sha256: &str) -> Result<bool, DbError> {
    Ok(tx
        .query_opt_map(
            "SELECT 1 FROM join_requests WHERE assertion_sha256 = ?1
               AND attestor = 'discovery' AND status = 'denied' LIMIT 1",
            params![assertion_sha256],
            |_| Ok(()),
        )?
        .is_some())
}

/// The open request (pending, or approved and not used) filed with this
/// token or this assertion, whatever its evidence.
fn request_of_script(
    tx: &Tx<'_>,
    token_id: &str,
    assertion_sha256: &str,
) -> Result<Option<JoinRequestRow>, DbError> {
    let sql = format!(
        "{} WHERE attestor = 'discovery' AND used_at IS NULL AND status <> 'denied'
           AND (token_id = ?1 OR assertion_sha256 = ?2)
         ORDER BY created_at, id LIMIT 1",
        enroll::REQUEST_SELECT
    );
    tx.query_opt_map(
        &sql,
        params![token_id, assertion_sha256],
        enroll::read_request,
    )
}

/// The pending requests of this entry from this source.
fn pending_count(
    tx: &Tx<'_>,
    workflow: Option<&str>,
    source: Option<&str>,
) -> Result<i64, DbError> {
    tx.query_one(
        "SELECT count(*) FROM join_requests
         WHERE attestor = 'discovery' AND status = 'pending' AND used_at IS NULL
           AND workflow_id IS NOT DISTINCT FROM CAST(?1 AS TEXT)
           AND source IS NOT DISTINCT FROM CAST(?2 AS TEXT)",
        params![workflow, source],
    )
    .and_then(|r| r.get(0))
}

fn insert(tx: &Tx<'_>, p: &Pending<'_>, node_key: &str) -> Result<JoinRequestRow, DbError> {
    let id = crate::ids::random_id("req_").map_err(DbError::Random)?;
    let row = JoinRequestRow {
        id,
        attestor: AttestorId::Discovery,
        ek_sha256: p.ek.map(|e| e.sha256.clone()),
        ek_issuer: p.ek.map(|e| e.issuer.clone()).unwrap_or_default(),
        ek_serial: p.ek.map(|e| e.serial.clone()).unwrap_or_default(),
        status: enroll::RequestStatus::Pending,
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
        token_id: Some(p.token_id.to_owned()),
        assertion_sha256: Some(p.assertion_sha256.to_owned()),
        assertion_expires_at: Some(p.assertion_expires_at),
    };
    tx.execute(
        "INSERT INTO join_requests (id, attestor, ek_sha256, ek_issuer, ek_serial, status,
             site_id, created_at, workflow_id, mac, product_uuid, source, node_key_sha256,
             token_id, assertion_sha256, assertion_expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
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
            row.node_key_sha256,
            row.token_id,
            row.assertion_sha256,
            row.assertion_expires_at
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

    /// One discovery join: its CSR key hashes to `[key; 32]`, it came with
    /// the token and assertion of boot script `script`, from `source`.
    #[derive(Clone, Copy)]
    struct Join<'a> {
        key: u8,
        script: u8,
        source: &'a str,
        ek: Option<&'a ProvenEk>,
    }

    /// A join of its own script (node key `key`) from 127.0.0.9.
    fn join(key: u8) -> Join<'static> {
        Join {
            key,
            script: key,
            source: "127.0.0.9",
            ek: None,
        }
    }

    fn token_of(script: u8) -> String {
        format!("tok_script{script}")
    }

    fn assertion_of(script: u8) -> String {
        hex::encode([script; 32])
    }

    fn gate_with(db: &crate::store::Store, j: Join<'_>) -> Result<Gate, Refusal> {
        gate_parts(db, j, &token_of(j.script), &assertion_of(j.script))
    }

    fn gate_parts(
        db: &crate::store::Store,
        j: Join<'_>,
        token_id: &str,
        assertion_sha256: &str,
    ) -> Result<Gate, Refusal> {
        let claims = HardwareClaims::default();
        let input = AttestInput {
            role: Role::Ramdisk,
            evidence: &[],
            token: None,
            csr_der: &[],
            csr_sha256: [0; 32],
            csr_spki_der: &[],
            csr_spki_sha256: [j.key; 32],
            claims: &claims,
            tpm: None,
            now: NOW,
            source: Some(j.source.parse().unwrap()),
            prepared: &crate::model::attestor::Prepared::default(),
        };
        db.write(|tx| {
            gate(
                tx,
                &Pending {
                    input: &input,
                    entry: None,
                    mac: "52:54:00:12:34:56",
                    ek: j.ek,
                    token_id,
                    assertion_sha256,
                    assertion_expires_at: NOW + 900_000,
                    retry_after_seconds: 7,
                },
            )
        })
    }

    fn gate_for(db: &crate::store::Store, key: u8, ek: Option<&ProvenEk>) -> Result<Gate, Refusal> {
        gate_with(db, Join { ek, ..join(key) })
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
    /// EK's: a later join of the same TPM with another node key and script
    /// (a second boot) finds it, and an approval admits that join once.
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
        assert_eq!(rows[0].token_id, Some(token_of(1)));
        assert_eq!(rows[0].assertion_sha256, Some(assertion_of(1)));
        // The same node key without the EK, from another script, is another
        // machine's evidence.
        let other = Join {
            script: 5,
            ..join(1)
        };
        assert_ne!(request_id(gate_with(&t.db, other)), id);
        enroll::approve(&t.db, &id, None, None).unwrap();
        assert!(matches!(gate_for(&t.db, 3, Some(&ek)), Ok(Gate::Admit)));
        // Used: the next join of that TPM files a new request.
        assert_ne!(request_id(gate_for(&t.db, 3, Some(&ek))), id);
    }

    /// One boot script files one request: joins with its token or its
    /// assertion, whatever their node keys (a neighbour minting one per
    /// join), are answered with that request and file none.
    #[test]
    fn one_script_files_one_request_however_many_node_keys_join_with_it() {
        let t = temp_db();
        let id = request_id(gate_with(&t.db, join(1)));
        for key in 2..=20 {
            let j = Join {
                script: 1,
                ..join(key)
            };
            assert_eq!(request_id(gate_with(&t.db, j)), id);
        }
        // Its token with another assertion, its assertion with another token.
        let j = join(30);
        assert_eq!(
            request_id(gate_parts(&t.db, j, &token_of(1), &assertion_of(30))),
            id
        );
        assert_eq!(
            request_id(gate_parts(&t.db, j, &token_of(30), &assertion_of(1))),
            id
        );
        assert_eq!(enroll::list_requests(&t.db).unwrap().len(), 1);
    }

    /// Without an EK, each script's node key is its own request: a denial
    /// refuses that one, not the next. A source may have four pending; a
    /// fifth from it is `approval-busy`, while another source is heard.
    #[test]
    fn the_pending_maximum_counts_per_source() {
        let t = temp_db();
        let first = request_id(gate_for(&t.db, 1, None));
        enroll::deny(&t.db, &first).unwrap();
        let denied = gate_for(&t.db, 1, None).unwrap_err();
        assert_eq!(denied.reason, DiscoveryReason::ApprovalDenied);
        for key in 2..=5 {
            request_id(gate_for(&t.db, key, None));
        }
        let busy = gate_for(&t.db, 6, None).unwrap_err();
        assert_eq!(busy.reason, DiscoveryReason::ApprovalBusy);
        // Pending ones are answered again; the denied one does not count.
        request_id(gate_for(&t.db, 5, None));
        // Another source with nothing pending is heard.
        let victim = Join {
            source: "127.0.0.2",
            ..join(7)
        };
        let mine = request_id(gate_with(&t.db, victim));
        let rows = enroll::list_requests(&t.db).unwrap();
        assert_eq!(rows.len(), 6);
        let row = rows.iter().find(|r| r.id == mine).unwrap();
        assert_eq!(row.source.as_deref(), Some("127.0.0.2"));
    }

    /// A denial revokes the token the request came with and spends its
    /// assertion until it would expire.
    #[test]
    fn a_denial_spends_the_token_and_the_assertion() {
        let t = temp_db();
        let (tok, _) =
            crate::model::tokens::create_token(&t.db, Role::Ramdisk, 1, 3_600_000).unwrap();
        let j = join(1);
        let id = request_id(gate_parts(&t.db, j, &tok.id, &assertion_of(1)));
        enroll::deny(&t.db, &id).unwrap();
        let row = crate::model::tokens::list_tokens(&t.db)
            .unwrap()
            .into_iter()
            .find(|r| r.id == tok.id)
            .unwrap();
        assert!(row.revoked_at.is_some(), "the token is revoked");
        let spent = t
            .db
            .read(|tx| crate::model::uses::is_spent(tx, AttestorId::Discovery, &assertion_of(1)))
            .unwrap();
        assert!(spent, "the assertion is spent");
    }

    /// An entry's pending requests from one source stay within their
    /// maximum however many unknown machines join at once (the
    /// `discovery-requests:` advisory lock over the count and the insert;
    /// fails without it).
    #[test]
    fn unknown_machines_joining_at_once_file_no_request_past_the_maximum() {
        let t = crate::race_tests::pg();
        let gate = |db: &crate::store::Store, key: u8| {
            gate_for(db, key, None)
                .map(|g| matches!(g, Gate::Wait(Deferral::Pending { .. })))
                .map_err(|r| r.reason)
        };
        for key in 1..MAX_PENDING_PER_SOURCE {
            assert_eq!(gate(&t.db, u8::try_from(key).unwrap()), Ok(true));
        }
        let (a, b) = crate::race_tests::race(&t, |db| gate(db, 100), |db| gate(db, 101));
        assert_eq!(a, Ok(true), "the last request the source may have is filed");
        assert_eq!(b, Err(DiscoveryReason::ApprovalBusy.any()));
    }

    /// Two joins of one script at once file one request between them (the
    /// same lock; the unique index of its token backs it).
    #[test]
    fn one_script_joining_twice_at_once_files_one_request() {
        let t = crate::race_tests::pg();
        let gate = |db: &crate::store::Store, key: u8| {
            request_id(gate_with(
                db,
                Join {
                    script: 1,
                    ..join(key)
                },
            ))
        };
        let (a, b) = crate::race_tests::race(&t, |db| gate(db, 1), |db| gate(db, 2));
        assert_eq!(a, b);
        assert_eq!(enroll::list_requests(&t.db).unwrap().len(), 1);
    }
}
