//! Nodes, their certificates, hardware bindings, the joins audit, and the
//! event log.

use bc_wire::agent::Role;
use bc_wire::AttestorId;

use crate::pki::IssuedCert;
use crate::store::{params, DbError, FromValue, Row, Store, ToValue, Tx, UnixMs, Value};

/// Event type of a successful join.
pub const EVENT_NODE_JOINED: &str = "node.joined";
/// Event type of every refused join, whatever the reason.
pub(crate) const EVENT_JOIN_REFUSED: &str = "security.join.refused";
/// Event type of a successful renewal.
pub(crate) const EVENT_NODE_RENEWED: &str = "node.renewed";
/// Event type of every refused renewal, whatever the reason.
pub(crate) const EVENT_RENEW_REFUSED: &str = "security.renew.refused";
/// An x509pop re-join of a node whose certificate named a TPM AK: the new
/// certificate names none, so the loss of TPM assurance is on record.
pub(crate) const EVENT_NODE_KEY_DOWNGRADED: &str = "node.key.downgraded";
/// `nodes revoke-identity`: a new identity generation, every certificate revoked.
pub const EVENT_IDENTITY_REVOKED: &str = "node.identity.revoked";
pub const EVENT_NODE_RETIRED: &str = "node.retired";
pub const EVENT_NODE_CORDONED: &str = "node.cordoned";
pub const EVENT_NODE_DELETED: &str = "node.deleted";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRow {
    pub id: String,
    pub role: Role,
    pub identity_generation: i64,
    pub attestor: AttestorId,
    pub joined_at: UnixMs,
    pub retired_at: Option<UnixMs>,
    pub pool_id: String,
    /// Set by `nodes cordon`; only a cordoned node can be deleted.
    pub cordoned_at: Option<UnixMs>,
    /// Set by `nodes delete`. Only [`node_including_deleted`] returns such a
    /// node: every other lookup treats it as gone.
    pub deleted_at: Option<UnixMs>,
}

/// A node's role as stored (`node`, `site` or `ramdisk`).
impl ToValue for Role {
    fn to_value(&self) -> Value {
        Value::Text(self.name().to_owned())
    }
}

/// A row's role: another text is a database this control plane did not
/// write.
impl FromValue for Role {
    fn from_value(v: &Value) -> Result<Self, &'static str> {
        match v {
            Value::Text(s) => Role::from_name(s).ok_or("a role (node, site or ramdisk)"),
            _ => Err("text"),
        }
    }
}

/// Which attestor, as stored (`tpm`, `join-token`, ...).
impl ToValue for AttestorId {
    fn to_value(&self) -> Value {
        Value::Text(self.as_str().to_owned())
    }
}

/// A row's attestor, parsed where it leaves the database: another text is
/// a database this control plane did not write, reported with `column`
/// (`nodes.attestor`, ...) and the text.
pub(crate) fn attestor_at(
    r: &Row,
    index: usize,
    column: &'static str,
) -> Result<AttestorId, DbError> {
    let text: String = r.get(index)?;
    text.parse()
        .map_err(|e: bc_wire::UnknownAttestor| DbError::Corrupt {
            what: column,
            detail: e.to_string(),
        })
}

const NODE_SELECT: &str = "SELECT id, role, identity_generation, attestor, joined_at, retired_at, \
     pool_id, cordoned_at, deleted_at FROM nodes";

fn read_node(r: &Row) -> Result<NodeRow, DbError> {
    Ok(NodeRow {
        id: r.get(0)?,
        role: r.get(1)?,
        identity_generation: r.get(2)?,
        attestor: attestor_at(r, 3, "nodes.attestor")?,
        joined_at: r.get(4)?,
        retired_at: r.get(5)?,
        pool_id: r.get(6)?,
        cordoned_at: r.get(7)?,
        deleted_at: r.get(8)?,
    })
}

/// The nodes that exist (deleted ones left out), oldest first.
pub fn list_nodes(db: &Store) -> Result<Vec<NodeRow>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            &format!("{NODE_SELECT} WHERE deleted_at IS NULL ORDER BY joined_at, id"),
            params![],
            read_node,
        )?;
        rows.collect::<Result<Vec<_>, _>>()
    })
}

/// The node `id`, deleted ones left out unless `deleted`, its row locked
/// by `lock` (a [`crate::store::Dialect`] fragment).
fn node_row(tx: &Tx<'_>, id: &str, deleted: bool, lock: &str) -> Result<Option<NodeRow>, DbError> {
    let live = if deleted {
        ""
    } else {
        " AND deleted_at IS NULL"
    };
    tx.query_opt_map(
        &format!("{NODE_SELECT} WHERE id = ?1{live}{lock}"),
        params![id],
        read_node,
    )
}

/// A node that exists; a deleted node is `None`, so no join can reclaim it
/// and no resolve entry can name it. Its row stays as read until commit
/// (PG: `FOR UPDATE`; SQLite: the IMMEDIATE transaction).
pub(crate) fn node_for_update(tx: &Tx<'_>, id: &str) -> Result<Option<NodeRow>, DbError> {
    node_row(tx, id, false, tx.dialect().for_update())
}

/// As [`node_for_update`], for a node the transaction only relies on (a
/// discovery join's signer; PG: `FOR SHARE`).
pub(crate) fn node_for_share(tx: &Tx<'_>, id: &str) -> Result<Option<NodeRow>, DbError> {
    node_row(tx, id, false, tx.dialect().for_share())
}

/// A node, deleted or not (Renew and x509pop name a deleted node's refusal).
pub(crate) fn node_including_deleted(tx: &Tx<'_>, id: &str) -> Result<Option<NodeRow>, DbError> {
    node_row(tx, id, true, "")
}

/// As [`node_including_deleted`], its row locked until commit: Renew and
/// x509pop issue a certificate of the generation they read (PG: `FOR
/// UPDATE`, so no revoke or reclaim commits in between).
pub(crate) fn node_including_deleted_for_update(
    tx: &Tx<'_>,
    id: &str,
) -> Result<Option<NodeRow>, DbError> {
    node_row(tx, id, true, tx.dialect().for_update())
}

pub fn insert_node(tx: &Tx<'_>, n: &NodeRow) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO nodes (id, role, identity_generation, attestor, joined_at, retired_at,
             pool_id, cordoned_at, deleted_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            n.id,
            n.role,
            n.identity_generation,
            n.attestor,
            n.joined_at,
            n.retired_at,
            n.pool_id,
            n.cordoned_at,
            n.deleted_at
        ],
    )?;
    Ok(())
}

/// What a node is scoped to beyond its role (migration 7).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeScope {
    /// The site of a site node or a ramdisk.
    pub site_id: Option<String>,
    /// The command kinds it may be sent; `None`: no restriction.
    pub allowed_kinds: Option<Vec<String>>,
    /// The longest certificate it may hold (ramdisks).
    pub max_cert_ttl_ms: Option<i64>,
}

impl NodeScope {
    /// The scope statement (`urn:bc:scope:…`) a certificate of a node of
    /// `role` carries: what the agent may run, readable from its own
    /// certificate. `None` when the role runs no command or no stored
    /// pattern parses (an allowed-kinds list written before the patterns
    /// were checked): such a certificate runs nothing, which a narrowing
    /// list can only mean.
    pub(crate) fn statement(&self, role: Role) -> Option<String> {
        use bc_wire::command::{KindPattern, Scope};
        if !matches!(role, Role::Node | Role::Site | Role::Ramdisk) {
            return None;
        }
        let kinds = match &self.allowed_kinds {
            None => None,
            Some(list) => {
                let parsed: Vec<KindPattern> = list
                    .iter()
                    .filter_map(|k| KindPattern::parse(k).ok())
                    .take(bc_wire::command::scope::MAX_PATTERNS)
                    .collect();
                if parsed.is_empty() {
                    return None;
                }
                Some(parsed)
            }
        };
        Some(Scope { role, kinds }.statement())
    }
}

pub(crate) fn set_node_scope(tx: &Tx<'_>, node_id: &str, s: &NodeScope) -> Result<(), DbError> {
    let kinds = s
        .allowed_kinds
        .as_ref()
        .map(|k| serde_json::to_string(k).unwrap_or_else(|_| "[]".to_owned()));
    tx.execute(
        "UPDATE nodes SET site_id = ?2, allowed_kinds = ?3, max_cert_ttl_ms = ?4 WHERE id = ?1",
        params![node_id, s.site_id, kinds, s.max_cert_ttl_ms],
    )?;
    Ok(())
}

pub(crate) fn node_scope(tx: &Tx<'_>, node_id: &str) -> Result<NodeScope, DbError> {
    let row: Option<(Option<String>, Option<String>, Option<i64>)> = tx.query_opt_map(
        "SELECT site_id, allowed_kinds, max_cert_ttl_ms FROM nodes WHERE id = ?1",
        params![node_id],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let Some((site_id, kinds, max_cert_ttl_ms)) = row else {
        return Ok(NodeScope::default());
    };
    let allowed_kinds = match kinds {
        None => None,
        Some(text) => Some(serde_json::from_str(&text).map_err(|e| DbError::Corrupt {
            what: "allowed kinds",
            detail: format!("{node_id}: {e}"),
        })?),
    };
    Ok(NodeScope {
        site_id,
        allowed_kinds,
        max_cert_ttl_ms,
    })
}

/// Every node's scope, by node id (for `nodes list`).
pub fn node_scopes(db: &Store) -> Result<std::collections::HashMap<String, NodeScope>, DbError> {
    let ids: Vec<String> = db.read(|tx| {
        let rows = tx.query_map("SELECT id FROM nodes", params![], |r| r.get(0))?;
        rows.collect::<Result<Vec<String>, _>>()
    })?;
    db.read(|tx| {
        ids.iter()
            .map(|id| node_scope(tx, id).map(|s| (id.clone(), s)))
            .collect()
    })
}

/// Moves a node to a new identity generation (a reclaim) and revokes every
/// certificate of the older generations: only the new certificate is valid.
pub(crate) fn start_generation(
    tx: &Tx<'_>,
    node_id: &str,
    generation: i64,
    attestor: AttestorId,
    now: UnixMs,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE nodes SET identity_generation = ?2, attestor = ?3 WHERE id = ?1",
        params![node_id, generation, attestor],
    )?;
    tx.execute(
        "UPDATE node_certs SET revoked_at = ?3
         WHERE node_id = ?1 AND identity_generation < ?2 AND revoked_at IS NULL",
        params![node_id, generation, now],
    )?;
    Ok(())
}

/// Changes a node's role (a workflow's reclaim between `node` and
/// `ramdisk`, [`crate::model::attestor::AttestationResult::change_role`]).
pub(crate) fn set_role(tx: &Tx<'_>, node_id: &str, role: Role) -> Result<(), DbError> {
    tx.execute(
        "UPDATE nodes SET role = ?2 WHERE id = ?1",
        params![node_id, role],
    )?;
    Ok(())
}

/// A stored node certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertRow {
    pub serial: String,
    pub node_id: String,
    pub identity_generation: i64,
    pub der: Vec<u8>,
    pub not_before: UnixMs,
    pub not_after: UnixMs,
    pub revoked_at: Option<UnixMs>,
}

const CERT_SELECT: &str = "SELECT serial, node_id, identity_generation, der, not_before, \
     not_after, revoked_at FROM node_certs";

fn read_cert(r: &Row) -> Result<CertRow, DbError> {
    Ok(CertRow {
        serial: r.get(0)?,
        node_id: r.get(1)?,
        identity_generation: r.get(2)?,
        der: r.get(3)?,
        not_before: r.get(4)?,
        not_after: r.get(5)?,
        revoked_at: r.get(6)?,
    })
}

/// The certificate of `node_id` whose DER is exactly `der`: a certificate
/// the control plane issued to that node, byte for byte.
pub(crate) fn cert_by_der(
    tx: &Tx<'_>,
    node_id: &str,
    der: &[u8],
) -> Result<Option<CertRow>, DbError> {
    tx.query_opt_map(
        &format!("{CERT_SELECT} WHERE node_id = ?1 AND der = ?2"),
        params![node_id, der],
        read_cert,
    )
}

/// Every certificate of a node, oldest first.
pub(crate) fn list_certs(db: &Store, node_id: &str) -> Result<Vec<CertRow>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            &format!("{CERT_SELECT} WHERE node_id = ?1 ORDER BY not_before, rowid"),
            params![node_id],
            read_cert,
        )?;
        rows.collect::<Result<Vec<_>, _>>()
    })
}

/// Revokes every certificate of a node not revoked yet; returns how many.
pub(crate) fn revoke_all_certs(tx: &Tx<'_>, node_id: &str, now: UnixMs) -> Result<usize, DbError> {
    tx.execute(
        "UPDATE node_certs SET revoked_at = ?2 WHERE node_id = ?1 AND revoked_at IS NULL",
        params![node_id, now],
    )
}

pub fn insert_cert(
    tx: &Tx<'_>,
    node_id: &str,
    generation: i64,
    cert: &IssuedCert,
) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO node_certs (serial, node_id, identity_generation, der, not_before, not_after)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            cert.serial_hex,
            node_id,
            generation,
            cert.der,
            crate::store::from_datetime(cert.not_before),
            crate::store::from_datetime(cert.not_after)
        ],
    )?;
    Ok(())
}

/// A hardware key bound to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindingRow {
    pub kind: String,
    pub key: String,
    pub node_id: String,
    pub created_at: UnixMs,
}

fn read_binding(r: &Row) -> Result<BindingRow, DbError> {
    Ok(BindingRow {
        kind: r.get(0)?,
        key: r.get(1)?,
        node_id: r.get(2)?,
        created_at: r.get(3)?,
    })
}

const BINDING_SELECT: &str = "SELECT kind, key, node_id, created_at FROM node_bindings";

/// The node a hardware key is bound to.
pub(crate) fn binding_by_key(
    tx: &Tx<'_>,
    kind: &str,
    key: &str,
) -> Result<Option<BindingRow>, DbError> {
    tx.query_opt_map(
        &format!("{BINDING_SELECT} WHERE kind = ?1 AND key = ?2"),
        params![kind, key],
        read_binding,
    )
}

/// The key of `kind` a node is bound to (at most one per kind).
pub(crate) fn binding_of_node(
    tx: &Tx<'_>,
    node_id: &str,
    kind: &str,
) -> Result<Option<BindingRow>, DbError> {
    tx.query_opt_map(
        &format!("{BINDING_SELECT} WHERE node_id = ?1 AND kind = ?2"),
        params![node_id, kind],
        read_binding,
    )
}

pub(crate) fn insert_binding(
    tx: &Tx<'_>,
    kind: &str,
    key: &str,
    node_id: &str,
    now: UnixMs,
) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO node_bindings (kind, key, node_id, created_at) VALUES (?1, ?2, ?3, ?4)",
        params![kind, key, node_id, now],
    )?;
    Ok(())
}

/// Frees every hardware key bound to a node; returns what was freed.
pub(crate) fn delete_bindings_of_node(
    tx: &Tx<'_>,
    node_id: &str,
) -> Result<Vec<BindingRow>, DbError> {
    let freed = {
        let rows = tx.query_map(
            &format!("{BINDING_SELECT} WHERE node_id = ?1 ORDER BY kind"),
            params![node_id],
            read_binding,
        )?;
        rows.collect::<Result<Vec<_>, _>>()?
    };
    tx.execute(
        "DELETE FROM node_bindings WHERE node_id = ?1",
        params![node_id],
    )?;
    Ok(freed)
}

/// Every binding, by node then kind.
pub fn list_bindings(db: &Store) -> Result<Vec<BindingRow>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            &format!("{BINDING_SELECT} ORDER BY node_id, kind"),
            params![],
            read_binding,
        )?;
        rows.collect::<Result<Vec<_>, _>>()
    })
}

/// A row of the joins audit: one per admitted join.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct JoinRow {
    pub node_id: String,
    pub attestor: AttestorId,
    /// `tpm` or `unattested`.
    pub node_key: String,
    /// A tpm join's EK assurance (`nv`, `nv-chain`, `operator-file`,
    /// `maker-service`, `pinned`); None for other attestors.
    pub ek_assurance: Option<String>,
    pub identity_generation: i64,
    pub at: UnixMs,
    /// The product UUID the join claimed (normalized), if well-formed.
    pub product_uuid: Option<String>,
    /// The MACs the join claimed (normalized, well-formed ones), which an
    /// inventory is compared against.
    pub macs: Vec<String>,
}

pub(crate) fn insert_join(tx: &Tx<'_>, j: &JoinRow) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO joins (node_id, attestor, node_key, identity_generation, at, product_uuid, ek_assurance, macs)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            j.node_id,
            j.attestor,
            j.node_key,
            j.identity_generation,
            j.at,
            j.product_uuid,
            j.ek_assurance,
            serde_json::to_string(&j.macs).unwrap_or_else(|_| "[]".to_owned())
        ],
    )?;
    Ok(())
}

/// The node key of each node's last join (`tpm` or `unattested`).
pub fn last_node_keys(db: &Store) -> Result<std::collections::HashMap<String, String>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            "SELECT node_id, node_key FROM joins
             WHERE id IN (SELECT max(id) FROM joins GROUP BY node_id)",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        rows.collect::<Result<_, _>>()
    })
}

/// The EK assurance of each node's last join, for nodes whose last join
/// proved an EK.
pub fn last_ek_assurances(
    db: &Store,
) -> Result<std::collections::HashMap<String, String>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            "SELECT node_id, ek_assurance FROM joins
             WHERE id IN (SELECT max(id) FROM joins GROUP BY node_id) AND ek_assurance IS NOT NULL",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        rows.collect::<Result<_, _>>()
    })
}

/// The joins audit, oldest first (the tests').
#[cfg(test)]
pub(crate) fn list_joins(db: &Store) -> Result<Vec<JoinRow>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map("SELECT node_id, attestor, node_key, identity_generation, at, product_uuid, ek_assurance, macs
             FROM joins ORDER BY id", params![], |r| {
            Ok(JoinRow {
                node_id: r.get(0)?,
                attestor: attestor_at(r, 1, "joins.attestor")?,
                node_key: r.get(2)?,
                identity_generation: r.get(3)?,
                at: r.get(4)?,
                product_uuid: r.get(5)?,
                ek_assurance: r.get(6)?,
                macs: r
                    .get::<Option<String>>(7)?
                    .and_then(|t| serde_json::from_str(&t).ok())
                    .unwrap_or_default(),
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()})
}

/// Whom an event is attributed to (its `tenant_id`; docs/control-plane.md,
/// "Tenants").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Attribution<'a> {
    /// The tenant owning the event's node's pool (joins, renewals, refused
    /// renewals, lifecycle: the node proved who it is, or the operator
    /// acted on it); the operator's when the event names no node.
    #[default]
    NodeOwner,
    /// A tenant the writer decided on (a pool-policy refusal's pool owner,
    /// a lease's lessee).
    Tenant(&'a str),
    /// The operator's (tenant NULL): a refusal naming no verified node.
    Operator,
}

/// An event to append to the log.
#[derive(Clone, Debug, Default)]
pub(crate) struct NewEvent<'a> {
    pub kind: &'a str,
    pub at: UnixMs,
    pub attestor: Option<&'a str>,
    pub reason: Option<&'a str>,
    pub token_id: Option<&'a str>,
    pub node_id: Option<&'a str>,
    pub data: serde_json::Value,
    pub tenant: Attribution<'a>,
}

pub(crate) fn insert_event(tx: &Tx<'_>, e: &NewEvent<'_>) -> Result<i64, DbError> {
    let data = if e.data.is_null() {
        "{}".to_owned()
    } else {
        e.data.to_string()
    };
    let tenant = match (e.tenant, e.node_id) {
        (Attribution::Tenant(t), _) => Some(t.to_owned()),
        (Attribution::NodeOwner, Some(node)) => crate::model::tenants::of_node(tx, node)?,
        (Attribution::NodeOwner, None) | (Attribution::Operator, _) => None,
    };
    // RETURNING, not last_insert_rowid(): the same text on every backend.
    tx.query_one(
        "INSERT INTO events (type, at, attestor, reason, token_id, node_id, data, tenant_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) RETURNING id",
        params![e.kind, e.at, e.attestor, e.reason, e.token_id, e.node_id, data, tenant],
    )?
    .get(0)
}

/// Sets `data.count` of an aggregated event.
pub(crate) fn set_event_count(tx: &Tx<'_>, id: i64, count: u64) -> Result<(), DbError> {
    let count = i64::try_from(count).unwrap_or(i64::MAX);
    tx.execute(
        "UPDATE events SET data = json_set(data, '$.count', ?2) WHERE id = ?1",
        params![id, count],
    )?;
    Ok(())
}

/// Deletes at most `limit` events older than `before`, oldest first;
/// returns how many.
pub(crate) fn delete_events_before(
    tx: &Tx<'_>,
    before: UnixMs,
    limit: usize,
) -> Result<usize, DbError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    // PG: `FOR UPDATE SKIP LOCKED`, so two replicas' writers prune apart.
    tx.execute(
        &format!(
            "DELETE FROM events WHERE id IN
                 (SELECT id FROM events WHERE at < ?1 ORDER BY at LIMIT ?2{})",
            tx.dialect().skip_locked()
        ),
        params![before, limit],
    )
}

#[derive(Clone, Debug, PartialEq)]
pub struct EventRow {
    pub id: i64,
    pub kind: String,
    pub at: UnixMs,
    pub attestor: Option<String>,
    pub reason: Option<String>,
    pub token_id: Option<String>,
    pub node_id: Option<String>,
    pub data: serde_json::Value,
    /// The tenant the event is attributed to; `None`: the operator's.
    pub tenant_id: Option<String>,
}

/// The whole event log, oldest first.
pub fn list_events(db: &Store) -> Result<Vec<EventRow>, DbError> {
    list_events_of(db, None)
}

/// The event log, oldest first: one tenant's events only when `tenant` is
/// given (`events list --tenant`).
pub fn list_events_of(db: &Store, tenant: Option<&str>) -> Result<Vec<EventRow>, DbError> {
    const SELECT: &str =
        "SELECT id, type, at, attestor, reason, token_id, node_id, data, tenant_id FROM events";
    db.read(|tx| {
        let read = |r: &Row| -> Result<(EventRow, String), DbError> {
            let data: String = r.get(7)?;
            Ok((
                EventRow {
                    id: r.get(0)?,
                    kind: r.get(1)?,
                    at: r.get(2)?,
                    attestor: r.get(3)?,
                    reason: r.get(4)?,
                    token_id: r.get(5)?,
                    node_id: r.get(6)?,
                    data: serde_json::Value::Null,
                    tenant_id: r.get(8)?,
                },
                data,
            ))
        };
        let rows = match tenant {
            None => tx.query_map(&format!("{SELECT} ORDER BY id"), params![], read)?,
            Some(t) => tx.query_map(
                &format!("{SELECT} WHERE tenant_id = ?1 ORDER BY id"),
                params![t],
                read,
            )?,
        };
        let mut out = Vec::new();
        for row in rows {
            let (mut ev, data) = row?;
            ev.data = serde_json::from_str(&data).map_err(|e| DbError::Corrupt {
                what: "event data",
                detail: format!("event {}: {e}", ev.id),
            })?;
            out.push(ev);
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::temp_db;

    /// An attestor text this control plane never writes is reported with
    /// its column and value, not taken for a known attestor.
    #[test]
    fn an_unknown_attestor_in_a_row_is_an_error_naming_its_column() {
        let t = temp_db();
        t.db.write(|tx| {
            tx.execute(
                "INSERT INTO nodes (id, role, identity_generation, attestor, joined_at)
                 VALUES ('node_a', 'node', 1, 'plugin', 1)",
                params![],
            )
        })
        .unwrap();
        let err = list_nodes(&t.db).unwrap_err();
        assert!(
            matches!(
                err,
                DbError::Corrupt {
                    what: "nodes.attestor",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            r#"the database holds an invalid nodes.attestor: unknown attestor "plugin""#
        );
    }
}
