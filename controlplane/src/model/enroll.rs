//! Where a TPM that is not bound to a node yet may join: the `resolve`
//! allow-list (for example a vendor's delivery manifest), else operator
//! enrollment through join requests.
//!
//! Both are keyed by `ek_sha256`, the lowercase hex SHA-256 of the EK
//! certificate's SubjectPublicKeyInfo DER (what `bcd tpm identify` prints).
//!
//! Either may name a site: the TPM then joins as a site node of that site
//! (role `site`, like a site token's node), and only as one.

use bc_wire::AttestorId;

use crate::model::machine::{EkSha256, EkSha256FormatError};
use crate::model::pools::{self, PoolError};
use crate::model::records;
use crate::model::sites;
use crate::store::{params, DbError, FromValue, Row, Store, ToValue, Tx, UnixMs, Value};

/// A join request's status, stored as `pending`, `approved` or `denied`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestStatus {
    Pending,
    Approved,
    Denied,
}

impl RequestStatus {
    /// As stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestStatus::Pending => "pending",
            RequestStatus::Approved => "approved",
            RequestStatus::Denied => "denied",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        [
            RequestStatus::Pending,
            RequestStatus::Approved,
            RequestStatus::Denied,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

impl std::fmt::Display for RequestStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ToValue for RequestStatus {
    fn to_value(&self) -> Value {
        Value::Text(self.as_str().to_owned())
    }
}

/// A row's status: another text is a database this control plane did not
/// write.
impl FromValue for RequestStatus {
    fn from_value(v: &Value) -> Result<Self, &'static str> {
        match v {
            Value::Text(s) => RequestStatus::parse(s).ok_or("pending, approved or denied"),
            _ => Err("text"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    #[error("INVALID_INPUT: {0}")]
    InvalidInput(String),
    #[error("NOT_FOUND: {0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<PoolError> for EnrollError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::InvalidInput(m) => EnrollError::InvalidInput(m),
            PoolError::NotFound(id) => EnrollError::NotFound(format!("no pool {id:?}")),
            e @ PoolError::UnknownTenant(_) => EnrollError::InvalidInput(e.to_string()),
            PoolError::Db(e) => EnrollError::Db(e),
        }
    }
}

impl From<EkSha256FormatError> for EnrollError {
    fn from(e: EkSha256FormatError) -> Self {
        EnrollError::InvalidInput(e.to_string())
    }
}

/// A resolve entry: this EK may join, into `pool_id` (as a site node of
/// `site_id` when set) or as `node_id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolveEntry {
    pub ek_sha256: String,
    pub pool_id: Option<String>,
    pub node_id: Option<String>,
    pub site_id: Option<String>,
    /// The EK may join without an EK certificate (`--uncertified`).
    pub uncertified: bool,
    pub created_at: UnixMs,
}

/// Where a resolve entry sends a TPM.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResolveTarget<'a> {
    pub pool: Option<&'a str>,
    /// An existing node it joins as (a reclaim).
    pub node: Option<&'a str>,
    /// The site (id or name) a new node is a site node of.
    pub site: Option<&'a str>,
    /// Admit this EK without an EK certificate (`--uncertified`): a TPM
    /// whose maker publishes none (AWS NitroTPM). A certificate it does
    /// send is still verified.
    pub uncertified: bool,
}

/// The id of the site `site` (an id or a name) names, if one is given.
fn site_id(tx: &Tx<'_>, site: Option<&str>) -> Result<Option<String>, EnrollError> {
    site.map(|s| sites::resolve(tx, s))
        .transpose()
        .map_err(EnrollError::from)
}

/// Adds or replaces the entry of an EK. Returns whether one was replaced.
pub fn add_resolve(
    db: &Store,
    ek_sha256: &str,
    target: ResolveTarget<'_>,
) -> Result<(ResolveEntry, bool), EnrollError> {
    let ResolveTarget {
        pool,
        node,
        site,
        uncertified,
    } = target;
    let ek_sha256 = EkSha256::parse(ek_sha256)?;
    if node.is_some() && site.is_some() {
        return Err(EnrollError::InvalidInput(
            "--site is for a new node; with --node the TPM joins as that node, which keeps its own site"
                .to_owned(),
        ));
    }
    db.write(|tx| {
        if let Some(pool) = pool {
            pools::require(tx, pool)?;
        }
        let site_id = site_id(tx, site)?;
        if let Some(node) = node {
            let row = records::node_for_update(tx, node)?
                .ok_or_else(|| EnrollError::NotFound(format!("no node {node:?}")))?;
            if row.retired_at.is_some() {
                return Err(EnrollError::InvalidInput(format!("node {node} is retired")));
            }
        }
        let now = tx.now()?;
        let replaced = resolve_entry(tx, ek_sha256.as_str())?.is_some();
        tx.execute(
            "INSERT INTO tpm_resolve (ek_sha256, pool_id, node_id, site_id, created_at, uncertified)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (ek_sha256) DO UPDATE SET pool_id = excluded.pool_id,
                 node_id = excluded.node_id, site_id = excluded.site_id,
                 created_at = excluded.created_at, uncertified = excluded.uncertified",
            params![ek_sha256.as_str(), pool, node, site_id, now, uncertified],
        )?;
        Ok((
            ResolveEntry {
                ek_sha256: ek_sha256.as_str().to_owned(),
                pool_id: pool.map(str::to_owned),
                node_id: node.map(str::to_owned),
                site_id,
                uncertified,
                created_at: now,
            },
            replaced,
        ))
    })
}

/// Removes the entry of an EK; `false` if there was none.
pub fn remove_resolve(db: &Store, ek_sha256: &str) -> Result<bool, EnrollError> {
    let ek_sha256 = EkSha256::parse(ek_sha256)?;
    db.write(|tx| {
        let n = tx.execute(
            "DELETE FROM tpm_resolve WHERE ek_sha256 = ?1",
            params![ek_sha256.as_str()],
        )?;
        Ok(n == 1)
    })
}

pub(crate) fn resolve_entry(tx: &Tx<'_>, ek_sha256: &str) -> Result<Option<ResolveEntry>, DbError> {
    tx
        .query_opt_map("SELECT ek_sha256, pool_id, node_id, site_id, created_at, uncertified FROM tpm_resolve WHERE ek_sha256 = ?1", params![ek_sha256], read_resolve)
}

pub fn list_resolve(db: &Store) -> Result<Vec<ResolveEntry>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map("SELECT ek_sha256, pool_id, node_id, site_id, created_at, uncertified FROM tpm_resolve ORDER BY created_at, ek_sha256", params![], read_resolve)?;
        rows.collect::<Result<Vec<_>, _>>()})
}

fn read_resolve(r: &Row) -> Result<ResolveEntry, DbError> {
    Ok(ResolveEntry {
        ek_sha256: r.get(0)?,
        pool_id: r.get(1)?,
        node_id: r.get(2)?,
        site_id: r.get(3)?,
        created_at: r.get(4)?,
        uncertified: r.get(5)?,
    })
}

/// A join request: a machine that proved what it could but that nothing
/// admits yet, waiting for an operator. The tpm attestor files one for a
/// TPM whose EK is neither bound nor resolved (enrollment); the discovery
/// attestor one for a boot entry's join under `[discovery] approval =
/// "unknown-machines"` ([`crate::attestors::discovery::approval`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinRequestRow {
    pub id: String,
    pub attestor: AttestorId,
    /// The EK the machine proved; `None`: a discovery join without a TPM.
    pub ek_sha256: Option<String>,
    pub ek_issuer: String,
    pub ek_serial: String,
    pub status: RequestStatus,
    pub pool_id: Option<String>,
    /// The site its node is a site node of (set on approval).
    pub site_id: Option<String>,
    pub created_at: UnixMs,
    pub decided_at: Option<UnixMs>,
    /// When an approved request admitted its machine (it admits once).
    pub used_at: Option<UnixMs>,
    /// A discovery request's boot entry, and the MAC and product UUID the
    /// entry (its token) was bound to.
    pub workflow_id: Option<String>,
    pub mac: Option<String>,
    pub product_uuid: Option<String>,
    /// The address the join came from, as the control plane saw it.
    pub source: Option<String>,
    /// A discovery request's node key (SHA-256 of the CSR's SPKI, hex):
    /// without an EK, the only evidence that tells two machines apart.
    pub node_key_sha256: Option<String>,
    /// A discovery request's token (its id) and signed assertion (its
    /// single-use key, and when that use would expire): what a denial
    /// spends, so that the same script files nothing again.
    pub token_id: Option<String>,
    pub(crate) assertion_sha256: Option<String>,
    pub(crate) assertion_expires_at: Option<UnixMs>,
}

pub(crate) const REQUEST_SELECT: &str =
    "SELECT id, attestor, ek_sha256, ek_issuer, ek_serial, status, pool_id,
     created_at, decided_at, used_at, site_id, workflow_id, mac, product_uuid, source,
     node_key_sha256, token_id, assertion_sha256, assertion_expires_at FROM join_requests";

pub(crate) fn read_request(r: &Row) -> Result<JoinRequestRow, DbError> {
    Ok(JoinRequestRow {
        id: r.get(0)?,
        attestor: records::attestor_at(r, 1, "join_requests.attestor")?,
        ek_sha256: r.get(2)?,
        ek_issuer: r.get(3)?,
        ek_serial: r.get(4)?,
        status: r.get(5)?,
        pool_id: r.get(6)?,
        created_at: r.get(7)?,
        decided_at: r.get(8)?,
        used_at: r.get(9)?,
        site_id: r.get(10)?,
        workflow_id: r.get(11)?,
        mac: r.get(12)?,
        product_uuid: r.get(13)?,
        source: r.get(14)?,
        node_key_sha256: r.get(15)?,
        token_id: r.get(16)?,
        assertion_sha256: r.get(17)?,
        assertion_expires_at: r.get(18)?,
    })
}

/// The open (not yet used) enrollment request of an EK, if any.
pub(crate) fn open_request(
    tx: &Tx<'_>,
    ek_sha256: &str,
) -> Result<Option<JoinRequestRow>, DbError> {
    tx.query_opt_map(
        &format!(
            "{REQUEST_SELECT} WHERE ek_sha256 = ?1 AND used_at IS NULL AND attestor <> 'discovery'"
        ),
        params![ek_sha256],
        read_request,
    )
}

/// Files a pending request (inside the join transaction; committed with
/// the deferral).
pub(crate) fn insert_pending(
    tx: &Tx<'_>,
    attestor: AttestorId,
    ek_sha256: &str,
    ek_issuer: &str,
    ek_serial: &str,
    now: UnixMs,
) -> Result<JoinRequestRow, DbError> {
    let id = crate::ids::random_id("req_").map_err(DbError::Random)?;
    tx.execute(
        "INSERT INTO join_requests (id, attestor, ek_sha256, ek_issuer, ek_serial, status, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6)",
        params![id, attestor, ek_sha256, ek_issuer, ek_serial, now],
    )?;
    Ok(JoinRequestRow {
        id,
        attestor,
        ek_sha256: Some(ek_sha256.to_owned()),
        ek_issuer: ek_issuer.to_owned(),
        ek_serial: ek_serial.to_owned(),
        status: RequestStatus::Pending,
        pool_id: None,
        site_id: None,
        created_at: now,
        decided_at: None,
        used_at: None,
        workflow_id: None,
        mac: None,
        product_uuid: None,
        source: None,
        node_key_sha256: None,
        token_id: None,
        assertion_sha256: None,
        assertion_expires_at: None,
    })
}

/// Marks an approved request as having admitted its machine.
pub(crate) fn mark_used(tx: &Tx<'_>, id: &str, now: UnixMs) -> Result<(), DbError> {
    let n = tx.execute(
        "UPDATE join_requests SET used_at = ?2 WHERE id = ?1 AND used_at IS NULL",
        params![id, now],
    )?;
    // PG: another join used it between our read and this write (its row
    // lock made us wait): run again, and find it used.
    if n == 1 {
        Ok(())
    } else {
        Err(tx.conflict("an approved join request"))
    }
}

/// Approves a pending request, optionally into `pool` (else the pool it
/// names, else `default`) and as a site node of `site` (an id or a name).
pub fn approve(
    db: &Store,
    id: &str,
    pool: Option<&str>,
    site: Option<&str>,
) -> Result<JoinRequestRow, EnrollError> {
    decide(db, id, RequestStatus::Approved, pool, site)
}

/// Denies a pending request: that EK's joins are refused
/// (`enrollment-denied`) until a resolve entry admits it; a discovery
/// request's join is refused (`approval-denied`), the token it came with is
/// revoked and its assertion spent (the script it came from files nothing
/// again), and its boot entry stays open for the real machine, whose own
/// script carries another token and assertion.
pub fn deny(db: &Store, id: &str) -> Result<JoinRequestRow, EnrollError> {
    decide(db, id, RequestStatus::Denied, None, None)
}

/// Denies every pending discovery request of boot entry `workflow_id`
/// (only those from `source`, when given), as [`deny`] each, in one
/// transaction: the requests denied.
pub fn deny_entry(
    db: &Store,
    workflow_id: &str,
    source: Option<&str>,
) -> Result<Vec<JoinRequestRow>, EnrollError> {
    db.write(|tx| {
        if crate::model::boot::get(tx, workflow_id)?.is_none() {
            return Err(EnrollError::NotFound(format!(
                "no boot entry {workflow_id:?}"
            )));
        }
        let rows = tx
            .query_map(
                // PG: `FOR UPDATE`, as one request's decision.
                &format!(
                    "{REQUEST_SELECT} WHERE attestor = 'discovery' AND status = 'pending'
                       AND workflow_id = ?1 AND (CAST(?2 AS TEXT) IS NULL OR source = ?2)
                     ORDER BY created_at, id{}",
                    tx.dialect().for_update()
                ),
                params![workflow_id, source],
                read_request,
            )?
            .collect::<Result<Vec<_>, _>>()?;
        let now = tx.now()?;
        rows.into_iter()
            .map(|row| decide_in(tx, row, RequestStatus::Denied, None, None, now))
            .collect()
    })
}

fn decide(
    db: &Store,
    id: &str,
    status: RequestStatus,
    pool: Option<&str>,
    site: Option<&str>,
) -> Result<JoinRequestRow, EnrollError> {
    db.write(|tx| {
        let row = tx
            .query_opt_map(
                // PG: `FOR UPDATE`: approve and deny cannot both win.
                &format!(
                    "{REQUEST_SELECT} WHERE id = ?1{}",
                    tx.dialect().for_update()
                ),
                params![id],
                read_request,
            )?
            .ok_or_else(|| EnrollError::NotFound(format!("no join request {id:?}")))?;
        let now = tx.now()?;
        decide_in(tx, row, status, pool, site, now)
    })
}

/// Decides one request, read `FOR UPDATE` in this transaction.
fn decide_in(
    tx: &Tx<'_>,
    mut row: JoinRequestRow,
    status: RequestStatus,
    pool: Option<&str>,
    site: Option<&str>,
    now: UnixMs,
) -> Result<JoinRequestRow, EnrollError> {
    let id = row.id.clone();
    if row.status != RequestStatus::Pending {
        return Err(EnrollError::Conflict(format!(
            "join request {id} is already {}; only a pending request can be decided{}",
            row.status,
            if row.status == RequestStatus::Denied && row.attestor == AttestorId::Discovery {
                " (PXE-boot the machine again: its new join files a new request)"
            } else if row.status == RequestStatus::Denied {
                " (to admit that TPM now, add a resolve entry for its ekSha256)"
            } else {
                ""
            }
        )));
    }
    if row.attestor == AttestorId::Discovery && (pool.is_some() || site.is_some()) {
        return Err(EnrollError::InvalidInput(format!(
            "join request {id} is a discovery join: its machine joins as a ramdisk of its boot entry's site (--pool and --site are for tpm enrollment)"
        )));
    }
    if status == RequestStatus::Approved {
        if let Some(wf) = row.workflow_id.as_deref() {
            let state = crate::model::boot::get(tx, wf)?.map(|e| e.state(now));
            if state.is_none_or(crate::model::boot::BootState::is_closed) {
                let state = state.map_or("gone", crate::model::boot::BootState::as_str);
                return Err(EnrollError::Conflict(format!(
                    "join request {id} is for boot entry {wf}, which is {state}: no join waits on it any more"
                )));
            }
        }
    }
    if let Some(pool) = pool {
        pools::require(tx, pool)?;
        row.pool_id = Some(pool.to_owned());
    }
    if let Some(site) = site_id(tx, site)? {
        row.site_id = Some(site);
    }
    tx.execute(
        "UPDATE join_requests SET status = ?2, decided_at = ?3, pool_id = ?4, site_id = ?5
         WHERE id = ?1",
        params![id, status, now, row.pool_id, row.site_id],
    )?;
    if status == RequestStatus::Denied {
        spend_denied(tx, &row, now)?;
    }
    row.status = status;
    row.decided_at = Some(now);
    Ok(row)
}

/// What a denied discovery request came with can file nothing again: its
/// token is revoked and its assertion spent (until it would be stale
/// anyway), so a re-send of that script is refused `assertion-reused`
/// (or `token-revoked`), not filed again.
fn spend_denied(tx: &Tx<'_>, row: &JoinRequestRow, now: UnixMs) -> Result<(), DbError> {
    if let Some(token) = row.token_id.as_deref() {
        crate::model::tokens::revoke_in(tx, token, now)?;
    }
    if let (Some(subject), Some(until)) =
        (row.assertion_sha256.as_deref(), row.assertion_expires_at)
    {
        crate::model::uses::spend(tx, AttestorId::Discovery, subject, until, now)?;
    }
    Ok(())
}

pub fn list_requests(db: &Store) -> Result<Vec<JoinRequestRow>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            &format!("{REQUEST_SELECT} ORDER BY created_at, id"),
            params![],
            read_request,
        )?;
        rows.collect::<Result<Vec<_>, _>>()
    })
}
