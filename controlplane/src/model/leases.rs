//! Node leases (issue 33): a node lent to a tenant, the lessee.
//!
//! A lease is active from `leases create` until `leases end` or its
//! `until` (database time, [`crate::store::Tx::now`]), whichever comes
//! first; a node holds at most one. While it is active:
//! - every certificate issued to the node (renewal, and a re-join that
//!   reclaims it: x509pop, tpm, a token with reclaim) names the lessee with
//!   `urn:bc:tenant:<id>` and narrows its scope statement to the lease's
//!   kinds (`urn:bc:scope:node:<patterns>`), which the agent enforces from
//!   its own certificate ([`cert_statements`]);
//! - the control plane queues and delivers only those kinds to it.
//!
//! The kinds are `[leases] allowed_kinds` when the lease is made, kept on
//! the lease: what the lessee was promised does not change under it. An
//! ended (or expired) lease drops both statements at the next certificate.

use bc_wire::agent::Role;
use bc_wire::command::scope::{MAX_PATTERNS, TENANT_PREFIX};
use bc_wire::command::{KindPattern, KINDS};

use crate::model::records::{self, Attribution, NewEvent, NodeScope};
use crate::store::{params, DbError, Row, Store, Tx, UnixMs};

/// `[leases] allowed_kinds` by default: diagnostics and the inventory.
/// Not `logs.collect`: a leased node's logs may hold the lessee's data.
pub const DEFAULT_LEASE_ALLOWED_KINDS: &[&str] = &["diag.*", "inventory.refresh"];

pub(crate) const EVENT_LEASE_CREATED: &str = "lease.created";
pub(crate) const EVENT_LEASE_ENDED: &str = "lease.ended";

/// The `[leases]` section of `controlplane.toml`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeasesConfig {
    /// The kinds a leased node runs (patterns, checked by [`check_kinds`]).
    pub allowed_kinds: Vec<String>,
}

impl Default for LeasesConfig {
    fn default() -> Self {
        LeasesConfig {
            allowed_kinds: DEFAULT_LEASE_ALLOWED_KINDS
                .iter()
                .map(|k| (*k).to_owned())
                .collect(),
        }
    }
}

/// A lease's kinds: 1 to [`MAX_PATTERNS`] distinct patterns, each matching
/// at least one registered kind a node runs, so that a typo cannot leave a
/// leased node running nothing.
pub(crate) fn check_kinds(list: &[String]) -> Result<(), String> {
    if list.is_empty() || list.len() > MAX_PATTERNS {
        return Err(format!(
            "must list 1 to {MAX_PATTERNS} command kinds, not {}",
            list.len()
        ));
    }
    for (i, k) in list.iter().enumerate() {
        let p = KindPattern::parse(k).map_err(|e| e.to_string())?;
        if !KINDS
            .iter()
            .any(|spec| spec.runs_as(Role::Node) && p.matches(spec.name))
        {
            let node_kinds: Vec<&str> = KINDS
                .iter()
                .filter(|s| s.runs_as(Role::Node))
                .map(|s| s.name)
                .collect();
            return Err(format!(
                "{k:?} matches no command kind a node runs ({})",
                node_kinds.join(", ")
            ));
        }
        if list[..i].contains(k) {
            return Err(format!("{k:?} is listed twice"));
        }
    }
    Ok(())
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    pub id: String,
    pub node_id: String,
    /// The lessee.
    pub tenant_id: String,
    pub allowed_kinds: Vec<String>,
    pub created_at: UnixMs,
    pub until: Option<UnixMs>,
    pub ended_at: Option<UnixMs>,
}

impl LeaseRow {
    /// Whether the lease holds at `now`.
    pub fn active_at(&self, now: UnixMs) -> bool {
        self.ended_at.is_none() && self.until.is_none_or(|u| now < u)
    }

    /// `active`, `expired` (its until passed) or `ended` (`leases end`).
    pub fn state(&self, now: UnixMs) -> &'static str {
        match (self.ended_at, self.until) {
            (Some(_), _) => "ended",
            (None, Some(u)) if now >= u => "expired",
            _ => "active",
        }
    }

    /// Whether a leased node may be sent `kind`.
    pub(crate) fn allows(&self, kind: &str) -> bool {
        self.allowed_kinds
            .iter()
            .filter_map(|k| KindPattern::parse(k).ok())
            .any(|p| p.matches(kind))
    }
}

/// When a lease ends by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// This long after the lease is made (database time).
    In(i64),
    /// At this database time.
    At(UnixMs),
}

/// Which lease `leases end` ends.
#[derive(Clone, Copy, Debug)]
pub enum LeaseRef<'a> {
    Id(&'a str),
    /// The node's open lease.
    Node(&'a str),
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("no node {0:?} (a deleted node cannot be leased); see bc-controlplane nodes list")]
    UnknownNode(String),
    #[error("node {0} is retired; a retired node cannot be leased")]
    Retired(String),
    #[error("node {node} has role {role}; only a node of role node can be leased")]
    Role { node: String, role: &'static str },
    #[error("no tenant {0:?} to lease to; create it first (bc-controlplane tenants create {0})")]
    UnknownTenant(String),
    #[error("node {node} is already leased to {tenant} (lease {lease}); end that lease first (bc-controlplane leases end {lease})")]
    AlreadyLeased {
        node: String,
        tenant: String,
        lease: String,
    },
    #[error("--until {until} is not after the database time {now}; give a later time or a duration such as 7d")]
    UntilPast { until: String, now: String },
    #[error("no lease {0:?}; see bc-controlplane leases list")]
    UnknownLease(String),
    #[error("node {0} holds no open lease; see bc-controlplane leases list")]
    NotLeased(String),
    #[error("{0}")]
    Internal(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

const SELECT: &str =
    "SELECT id, node_id, tenant_id, allowed_kinds, created_at, until_at, ended_at FROM node_leases";

fn read_row(r: &Row) -> Result<LeaseRow, DbError> {
    let id: String = r.get(0)?;
    let kinds: String = r.get(3)?;
    let allowed_kinds = serde_json::from_str(&kinds).map_err(|e| DbError::Corrupt {
        what: "lease allowed kinds",
        detail: format!("{id}: {e}"),
    })?;
    Ok(LeaseRow {
        id,
        node_id: r.get(1)?,
        tenant_id: r.get(2)?,
        allowed_kinds,
        created_at: r.get(4)?,
        until: r.get(5)?,
        ended_at: r.get(6)?,
    })
}

/// The node's lease active at `now`, if any.
pub(crate) fn active(tx: &Tx<'_>, node_id: &str, now: UnixMs) -> Result<Option<LeaseRow>, DbError> {
    tx.query_opt_map(
        &format!(
            "{SELECT} WHERE node_id = ?1 AND ended_at IS NULL AND (until_at IS NULL OR until_at > ?2)"
        ),
        params![node_id, now],
        read_row,
    )
}

/// The scope and tenant statements of a certificate issued at `now` to
/// the node `node_id` of `role` whose own scope is `scope`: while a lease
/// holds, the scope narrowed to the lease's kinds (within the node's own
/// list, if it has one) and `urn:bc:tenant:<lessee>`; otherwise its scope
/// alone. With the node-key statement and the SPIFFE ID, at most four URIs.
pub(crate) fn cert_statements(
    tx: &Tx<'_>,
    node_id: &str,
    role: Role,
    scope: &NodeScope,
    now: UnixMs,
) -> Result<Vec<String>, DbError> {
    let lease = match role {
        Role::Node => active(tx, node_id, now)?,
        _ => None,
    };
    let Some(lease) = lease else {
        return Ok(scope.statement(role).into_iter().collect());
    };
    let kinds = match &scope.allowed_kinds {
        None => lease.allowed_kinds.clone(),
        Some(own) => lease
            .allowed_kinds
            .iter()
            .filter(|k| own.contains(k))
            .cloned()
            .collect(),
    };
    let narrowed = NodeScope {
        allowed_kinds: Some(kinds),
        ..scope.clone()
    };
    let mut out: Vec<String> = narrowed.statement(role).into_iter().collect();
    out.push(format!("{TENANT_PREFIX}{}", lease.tenant_id));
    Ok(out)
}

/// Leases `node_id` to `tenant` with `kinds` (checked by the caller's
/// config), until `until` if given; a `lease.created` event for the lessee.
pub fn create(
    db: &Store,
    node_id: &str,
    tenant: &str,
    until: Option<Until>,
    kinds: &[String],
) -> Result<LeaseRow, LeaseError> {
    check_kinds(kinds).map_err(|e| LeaseError::Internal(format!("leases.allowed_kinds {e}")))?;
    let id = crate::ids::random_id("lease_")
        .map_err(|e| LeaseError::Internal(format!("random lease id: {e}")))?;
    let kinds_json =
        serde_json::to_string(kinds).map_err(|e| LeaseError::Internal(e.to_string()))?;
    db.write(|tx| {
        let now = tx.now()?;
        // The node's row locked: two creates for one node take turns.
        let node = records::node_for_update(tx, node_id)?
            .ok_or_else(|| LeaseError::UnknownNode(node_id.to_owned()))?;
        if node.retired_at.is_some() {
            return Err(LeaseError::Retired(node.id));
        }
        if node.role != Role::Node {
            return Err(LeaseError::Role {
                node: node.id,
                role: node.role.name(),
            });
        }
        if !crate::model::tenants::exists(tx, tenant)? {
            return Err(LeaseError::UnknownTenant(tenant.to_owned()));
        }
        let until = match until {
            None => None,
            Some(Until::In(ms)) => Some(now.saturating_add(ms)),
            Some(Until::At(at)) => Some(at),
        };
        if let Some(u) = until.filter(|u| *u <= now) {
            return Err(LeaseError::UntilPast {
                until: crate::store::rfc3339(u),
                now: crate::store::rfc3339(now),
            });
        }
        // A lease whose until passed is over: closed at its until, so the
        // node may be leased again.
        tx.execute(
            "UPDATE node_leases SET ended_at = until_at
             WHERE node_id = ?1 AND ended_at IS NULL AND until_at IS NOT NULL AND until_at <= ?2",
            params![node_id, now],
        )?;
        if let Some(open) = active(tx, node_id, now)? {
            return Err(LeaseError::AlreadyLeased {
                node: node.id,
                tenant: open.tenant_id,
                lease: open.id,
            });
        }
        tx.execute(
            "INSERT INTO node_leases (id, node_id, tenant_id, allowed_kinds, created_at, until_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![id, node_id, tenant, kinds_json, now, until],
        )?;
        let row = LeaseRow {
            id: id.clone(),
            node_id: node_id.to_owned(),
            tenant_id: tenant.to_owned(),
            allowed_kinds: kinds.to_vec(),
            created_at: now,
            until,
            ended_at: None,
        };
        records::insert_event(
            tx,
            &NewEvent {
                kind: EVENT_LEASE_CREATED,
                at: now,
                node_id: Some(node_id),
                data: serde_json::json!({
                    "lease": row.id,
                    "tenant": tenant,
                    "until": until.map(crate::store::rfc3339),
                    "allowedKinds": kinds,
                }),
                tenant: Attribution::Tenant(tenant),
                ..NewEvent::default()
            },
        )?;
        Ok(row)
    })
}

/// Ends a lease now; whether it was active (an ended or expired one is
/// left as it was, with no event). A `lease.ended` event for the lessee.
pub fn end(db: &Store, which: LeaseRef<'_>) -> Result<(LeaseRow, bool), LeaseError> {
    db.write(|tx| {
        let now = tx.now()?;
        let row = match which {
            LeaseRef::Id(id) => tx
                .query_opt_map(&format!("{SELECT} WHERE id = ?1"), params![id], read_row)?
                .ok_or_else(|| LeaseError::UnknownLease(id.to_owned()))?,
            LeaseRef::Node(node) => tx
                .query_opt_map(
                    &format!("{SELECT} WHERE node_id = ?1 AND ended_at IS NULL"),
                    params![node],
                    read_row,
                )?
                .ok_or_else(|| LeaseError::NotLeased(node.to_owned()))?,
        };
        if row.ended_at.is_some() {
            return Ok((row, false));
        }
        let active = row.active_at(now);
        let ended_at = match row.until {
            Some(u) if u <= now => u,
            _ => now,
        };
        tx.execute(
            "UPDATE node_leases SET ended_at = ?2 WHERE id = ?1",
            params![row.id, ended_at],
        )?;
        if active {
            records::insert_event(
                tx,
                &NewEvent {
                    kind: EVENT_LEASE_ENDED,
                    at: now,
                    node_id: Some(&row.node_id),
                    data: serde_json::json!({ "lease": row.id, "tenant": row.tenant_id }),
                    tenant: Attribution::Tenant(&row.tenant_id),
                    ..NewEvent::default()
                },
            )?;
        }
        Ok((
            LeaseRow {
                ended_at: Some(ended_at),
                ..row
            },
            active,
        ))
    })
}

/// The node's lease active now (database time), if any: what `nodes show`
/// says of who holds the node.
pub fn of_node(db: &Store, node_id: &str) -> Result<Option<LeaseRow>, DbError> {
    db.read(|tx| {
        let now = tx.now()?;
        active(tx, node_id, now)
    })
}

/// Every lease, oldest first, and the database time to judge them by.
pub fn list(db: &Store) -> Result<(Vec<LeaseRow>, UnixMs), DbError> {
    db.read(|tx| {
        let now = tx.now()?;
        let rows = tx.query_map(
            &format!("{SELECT} ORDER BY created_at, id"),
            params![],
            read_row,
        )?;
        Ok((rows.collect::<Result<Vec<_>, _>>()?, now))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::temp_db;

    fn kinds() -> Vec<String> {
        LeasesConfig::default().allowed_kinds
    }

    fn node(db: &Store, id: &str, role: Role) {
        db.write(|tx| {
            records::insert_node(
                tx,
                &records::NodeRow {
                    id: id.to_owned(),
                    role,
                    identity_generation: 1,
                    attestor: bc_wire::AttestorId::JoinToken,
                    joined_at: 1,
                    retired_at: None,
                    pool_id: "default".to_owned(),
                    cordoned_at: None,
                    deleted_at: None,
                },
            )
        })
        .unwrap();
    }

    #[test]
    fn the_kinds_are_checked_against_the_registry() {
        assert_eq!(check_kinds(&kinds()), Ok(()));
        for bad in [
            vec![],
            vec!["disk.wipe".to_owned()],
            vec!["no.such".to_owned()],
            vec!["diag".to_owned()],
            vec!["diag.*".to_owned(), "diag.*".to_owned()],
        ] {
            assert!(check_kinds(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_lease_narrows_the_certificate_and_names_the_lessee_until_it_ends() {
        let t = temp_db();
        node(&t.db, "node_a", Role::Node);
        node(&t.db, "node_s", Role::Site);
        crate::model::tenants::create(&t.db, "acme").unwrap();
        let stmts = |db: &Store| {
            db.read(|tx| {
                let now = tx.now()?;
                cert_statements(tx, "node_a", Role::Node, &NodeScope::default(), now)
            })
            .unwrap()
        };
        assert_eq!(stmts(&t.db), ["urn:bc:scope:node"]);
        assert!(matches!(
            create(&t.db, "node_a", "nobody", None, &kinds()),
            Err(LeaseError::UnknownTenant(_))
        ));
        assert!(matches!(
            create(&t.db, "node_s", "acme", None, &kinds()),
            Err(LeaseError::Role { .. })
        ));
        assert!(matches!(
            create(&t.db, "node_x", "acme", None, &kinds()),
            Err(LeaseError::UnknownNode(_))
        ));
        assert!(matches!(
            create(&t.db, "node_a", "acme", Some(Until::At(1)), &kinds()),
            Err(LeaseError::UntilPast { .. })
        ));
        let lease = create(&t.db, "node_a", "acme", None, &kinds()).unwrap();
        assert_eq!(
            stmts(&t.db),
            [
                "urn:bc:scope:node:diag.*,inventory.refresh",
                "urn:bc:tenant:acme"
            ]
        );
        assert!(lease.allows("diag.ping") && lease.allows("inventory.refresh"));
        assert!(!lease.allows("logs.collect"));
        assert!(matches!(
            create(&t.db, "node_a", "root", None, &kinds()),
            Err(LeaseError::AlreadyLeased { .. })
        ));
        let (ended, changed) = end(&t.db, LeaseRef::Node("node_a")).unwrap();
        assert!(changed && ended.ended_at.is_some());
        assert!(!end(&t.db, LeaseRef::Id(&lease.id)).unwrap().1);
        assert!(matches!(
            end(&t.db, LeaseRef::Node("node_a")),
            Err(LeaseError::NotLeased(_))
        ));
        assert_eq!(stmts(&t.db), ["urn:bc:scope:node"]);

        // A lease that runs out: over at its until, by database time.
        create(
            &t.db,
            "node_a",
            "acme",
            Some(Until::In(3_600_000)),
            &kinds(),
        )
        .unwrap();
        assert_eq!(stmts(&t.db).len(), 2);
        t.db.write(|tx| crate::store::set_clock_offset_ms(tx, 7_200_000))
            .unwrap();
        assert_eq!(stmts(&t.db), ["urn:bc:scope:node"]);
        let (rows, now) = list(&t.db).unwrap();
        assert_eq!(
            rows.iter().map(|r| r.state(now)).collect::<Vec<_>>(),
            ["ended", "expired"]
        );
        // And the node can be leased again.
        create(&t.db, "node_a", "root", None, &kinds()).unwrap();

        let events: Vec<(String, Option<String>)> = records::list_events(&t.db)
            .unwrap()
            .into_iter()
            .map(|e| (e.kind, e.tenant_id))
            .collect();
        let acme = Some("acme".to_owned());
        assert_eq!(
            events,
            [
                (EVENT_LEASE_CREATED.to_owned(), acme.clone()),
                (EVENT_LEASE_ENDED.to_owned(), acme.clone()),
                (EVENT_LEASE_CREATED.to_owned(), acme),
                (EVENT_LEASE_CREATED.to_owned(), Some("root".to_owned())),
            ]
        );
    }
}
