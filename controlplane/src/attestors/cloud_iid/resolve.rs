//! The resolve table (`cloud resolve add`): which provider accounts may
//! join, and where. A row with zone `''` covers every zone of the
//! account; a row for the VM's own zone wins over it. A row may admit
//! roles beyond `[cloud_iid] roles` (`--role`), and may name a site
//! (`--site`, or `--site-from zone`: the site the VM's zone names): its
//! VMs then join as site nodes of that site, and only so.
//!
//! Known instances (`cloud resolve add --instance I --node N`,
//! `cloud_instances`) join as their node, as a reclaim: checked before the
//! account rows.

use bc_wire::agent::Role;
use serde::Serialize;

use crate::model::pools::{self, PoolError, DEFAULT_POOL};
use crate::model::tenants;
use crate::store::{params, DbError, Tx, UnixMs};

/// One row, as `cloud resolve list` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResolveRow {
    pub provider: String,
    pub account: String,
    /// `None`: any zone.
    pub zone: Option<String>,
    /// `None`: the default pool.
    pub pool: Option<String>,
    /// The roles it admits beyond `[cloud_iid] roles`.
    #[serde(skip)]
    pub roles: Vec<Role>,
    pub site: Option<SiteRule>,
    /// The tenant owning the row's pool: where its VMs join is that
    /// tenant's (`--tenant` checks it).
    pub tenant: Option<String>,
    pub created_at: UnixMs,
}

/// The site a row's VMs are site nodes of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum SiteRule {
    /// This site id.
    Site(String),
    /// The site the VM's zone names (its id or name).
    FromZone,
}

/// The one `site_from` a row may name.
const SITE_FROM_ZONE: &str = "zone";

/// A known instance and its node (`cloud resolve add --instance --node`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InstanceRow {
    pub provider: String,
    pub account: String,
    pub instance: String,
    pub node: String,
    /// The tenant owning the node's pool.
    pub tenant: Option<String>,
    pub created_at: UnixMs,
}

/// Where a VM the table covers joins, and the roles its row adds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// `None`: the default pool.
    pub pool: Option<String>,
    pub roles: Vec<Role>,
    pub site: Option<SiteRule>,
}

/// A row's `site_id` and `site_from` columns.
fn site_rule(
    site_id: Option<String>,
    site_from: Option<String>,
) -> Result<Option<SiteRule>, DbError> {
    match (site_id, site_from.as_deref()) {
        (Some(id), None) => Ok(Some(SiteRule::Site(id))),
        (None, Some(SITE_FROM_ZONE)) => Ok(Some(SiteRule::FromZone)),
        (None, None) => Ok(None),
        (id, from) => Err(DbError::Corrupt {
            what: "cloud_resolve site",
            detail: format!("site_id {id:?}, site_from {from:?}"),
        }),
    }
}

/// `node,site` (stored) from roles.
fn roles_text(roles: &[Role]) -> Option<String> {
    (!roles.is_empty()).then(|| roles.iter().map(|r| r.name()).collect::<Vec<_>>().join(","))
}

/// The roles a stored row names; a name this build does not know is a
/// corrupt row.
fn parse_roles(text: Option<String>) -> Result<Vec<Role>, DbError> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    text.split(',')
        .map(|name| {
            Role::from_name(name).ok_or_else(|| DbError::Corrupt {
                what: "cloud_resolve role",
                detail: format!("{name:?}"),
            })
        })
        .collect()
}

/// A row as `cloud resolve add` makes it.
pub struct NewRow<'a> {
    pub provider: &'a str,
    pub account: &'a str,
    pub zone: Option<&'a str>,
    pub pool: Option<&'a str>,
    pub roles: &'a [Role],
    pub site: Option<&'a SiteRule>,
}

/// Adds (or replaces) the row for (provider, account, zone).
pub fn add(tx: &Tx<'_>, row: &NewRow<'_>, now: UnixMs) -> Result<(), DbError> {
    let (site_id, site_from) = match row.site {
        Some(SiteRule::Site(id)) => (Some(id.as_str()), None),
        Some(SiteRule::FromZone) => (None, Some(SITE_FROM_ZONE)),
        None => (None, None),
    };
    tx.execute(
        "INSERT INTO cloud_resolve (provider, account, zone, pool_id, created_at, roles, site_id, site_from)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (provider, account, zone) DO UPDATE SET pool_id = ?4, created_at = ?5, roles = ?6,
             site_id = ?7, site_from = ?8",
        params![
            row.provider,
            row.account,
            row.zone.unwrap_or(""),
            row.pool,
            now,
            roles_text(row.roles),
            site_id,
            site_from
        ],
    )?;
    Ok(())
}

/// The pool a row naming `tenant` (`--tenant`) joins: `pool` (else the
/// default pool) when that tenant owns it, else, when no pool was named,
/// the tenant's only pool (`None`: the default pool). Anything else is the
/// operator's mistake, named.
pub fn tenant_pool(
    tx: &Tx<'_>,
    tenant: &str,
    pool: Option<&str>,
) -> Result<Option<String>, PoolError> {
    if !tenants::exists(tx, tenant)? {
        return Err(PoolError::InvalidInput(format!(
            "no tenant {tenant:?}; see bc-controlplane tenants list"
        )));
    }
    let named = pool.unwrap_or(DEFAULT_POOL);
    if let Some(p) = pools::get(tx, named)? {
        if p.owner == tenant {
            return Ok(pool.map(str::to_owned));
        }
        if pool.is_some() {
            return Err(PoolError::InvalidInput(format!(
                "pool {named:?} belongs to tenant {:?}, not {tenant:?}",
                p.owner
            )));
        }
    }
    let owned = tx
        .query_map(
            "SELECT id FROM pools WHERE owner = ?1 ORDER BY id",
            params![tenant],
            |r| r.get::<String>(0),
        )?
        .collect::<Result<Vec<_>, _>>()?;
    match owned.as_slice() {
        [only] => Ok(Some(only.clone())),
        [] => Err(PoolError::InvalidInput(format!(
            "tenant {tenant:?} owns no pool: bc-controlplane pools create POOL --tenant {tenant}"
        ))),
        many => Err(PoolError::InvalidInput(format!(
            "tenant {tenant:?} owns {} pools ({}): name one with --pool",
            many.len(),
            many.join(", ")
        ))),
    }
}

/// Adds (or replaces) the node a known instance joins as: a node that
/// exists and is not retired.
pub fn add_instance(
    tx: &Tx<'_>,
    provider: &str,
    account: &str,
    instance: &str,
    node: &str,
    tenant: Option<&str>,
    now: UnixMs,
) -> Result<(), PoolError> {
    let row = crate::model::records::node_for_update(tx, node)?.ok_or_else(|| {
        PoolError::InvalidInput(format!("no node {node:?}; see bc-controlplane nodes list"))
    })?;
    if row.retired_at.is_some() {
        return Err(PoolError::InvalidInput(format!(
            "node {node} is retired: it can never join again"
        )));
    }
    if let Some(tenant) = tenant {
        let owner = tenants::of_node(tx, node)?;
        if owner.as_deref() != Some(tenant) {
            return Err(PoolError::InvalidInput(format!(
                "node {node} belongs to tenant {}, not {tenant:?}",
                owner.as_deref().unwrap_or("(none)")
            )));
        }
    }
    tx.execute(
        "INSERT INTO cloud_instances (provider, account, instance, node_id, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (provider, account, instance) DO UPDATE SET node_id = ?4, created_at = ?5",
        params![provider, account, instance, node, now],
    )?;
    Ok(())
}

/// Every known instance, by provider, account, instance.
pub fn list_instances(tx: &Tx<'_>) -> Result<Vec<InstanceRow>, DbError> {
    tx.query_map(
        "SELECT i.provider, i.account, i.instance, i.node_id, i.created_at, p.owner
         FROM cloud_instances i LEFT JOIN nodes n ON n.id = i.node_id
             LEFT JOIN pools p ON p.id = n.pool_id
         ORDER BY i.provider, i.account, i.instance",
        params![],
        |r| {
            Ok(InstanceRow {
                provider: r.get(0)?,
                account: r.get(1)?,
                instance: r.get(2)?,
                node: r.get(3)?,
                tenant: r.get(5)?,
                created_at: r.get(4)?,
            })
        },
    )?
    .collect()
}

/// The node a known instance joins as, if it is one.
pub(crate) fn instance_node(
    tx: &Tx<'_>,
    provider: &str,
    account: &str,
    instance: &str,
) -> Result<Option<String>, DbError> {
    tx.query_opt_map(
        "SELECT node_id FROM cloud_instances WHERE provider = ?1 AND account = ?2 AND instance = ?3",
        params![provider, account, instance],
        |r| r.get(0),
    )
}

/// Every row, by provider, account, zone.
pub fn list(tx: &Tx<'_>) -> Result<Vec<ResolveRow>, DbError> {
    let rows = tx
        .query_map(
            "SELECT r.provider, r.account, r.zone, r.pool_id, r.created_at, r.roles, r.site_id,
                r.site_from, p.owner
         FROM cloud_resolve r LEFT JOIN pools p ON p.id = COALESCE(r.pool_id, ?1)
         ORDER BY r.provider, r.account, r.zone",
            params![DEFAULT_POOL],
            |r| {
                let zone: String = r.get(2)?;
                Ok((
                    ResolveRow {
                        provider: r.get(0)?,
                        account: r.get(1)?,
                        zone: (!zone.is_empty()).then_some(zone),
                        pool: r.get(3)?,
                        roles: Vec::new(),
                        site: None,
                        tenant: r.get(8)?,
                        created_at: r.get(4)?,
                    },
                    r.get::<Option<String>>(5)?,
                    (r.get::<Option<String>>(6)?, r.get::<Option<String>>(7)?),
                ))
            },
        )?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(|(row, roles, (site_id, site_from))| {
            Ok(ResolveRow {
                roles: parse_roles(roles)?,
                site: site_rule(site_id, site_from)?,
                ..row
            })
        })
        .collect()
}

/// Where a VM joins when a row covers it, `None` when none does.
pub(crate) fn lookup(
    tx: &Tx<'_>,
    provider: &str,
    account: &str,
    zone: &str,
) -> Result<Option<Resolved>, DbError> {
    let row = tx.query_opt_map(
        "SELECT pool_id, roles, site_id, site_from FROM cloud_resolve
             WHERE provider = ?1 AND account = ?2 AND (zone = ?3 OR zone = '')
             ORDER BY zone DESC LIMIT 1",
        params![provider, account, zone],
        |r| {
            Ok((
                r.get::<Option<String>>(0)?,
                r.get::<Option<String>>(1)?,
                r.get::<Option<String>>(2)?,
                r.get::<Option<String>>(3)?,
            ))
        },
    )?;
    row.map(|(pool, roles, site_id, site_from)| {
        Ok(Resolved {
            pool,
            roles: parse_roles(roles)?,
            site: site_rule(site_id, site_from)?,
        })
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::temp_db;

    /// `--tenant`: the named pool must be the tenant's; without a pool, the
    /// default pool if the tenant owns it, else the tenant's only pool.
    #[test]
    fn a_rule_naming_a_tenant_joins_one_of_its_pools() {
        let t = temp_db();
        crate::model::tenants::create(&t.db, "acme").unwrap();
        let pick = |tenant: &str, pool: Option<&str>| {
            t.db.write(|tx| Ok::<_, PoolError>(tenant_pool(tx, tenant, pool)))
                .unwrap()
                .map_err(|e| e.to_string())
        };
        assert_eq!(pick("root", None), Ok(None));
        assert!(pick("nobody", None).unwrap_err().contains("no tenant"));
        assert!(pick("acme", None).unwrap_err().contains("owns no pool"));
        pools::create_pool(&t.db, "acme-a", "acme", None, &[]).unwrap();
        assert_eq!(pick("acme", None), Ok(Some("acme-a".to_owned())));
        assert!(pick("acme", Some(DEFAULT_POOL))
            .unwrap_err()
            .contains("belongs to tenant \"root\""));
        pools::create_pool(&t.db, "acme-b", "acme", None, &[]).unwrap();
        assert!(pick("acme", None)
            .unwrap_err()
            .contains("owns 2 pools (acme-a, acme-b)"));
        assert_eq!(pick("acme", Some("acme-b")), Ok(Some("acme-b".to_owned())));
        t.db.write(|tx| {
            add(
                tx,
                &NewRow {
                    provider: "gcp",
                    account: "p",
                    zone: None,
                    pool: Some("acme-b"),
                    roles: &[],
                    site: None,
                },
                1,
            )
        })
        .unwrap();
        let rows = t.db.read(list).unwrap();
        assert_eq!(rows[0].tenant.as_deref(), Some("acme"));
    }

    #[test]
    fn the_zone_row_wins_over_the_account_row() {
        let t = temp_db();
        t.db.write(|tx| {
            assert_eq!(lookup(tx, "gcp", "p", "z1")?, None);
            let row = |zone, pool, roles, site| NewRow {
                provider: "gcp",
                account: "p",
                zone,
                pool,
                roles,
                site,
            };
            add(tx, &row(None, None, &[], None), 1)?;
            add(
                tx,
                &row(
                    Some("z1"),
                    Some("pool_a"),
                    &[Role::Site],
                    Some(&SiteRule::FromZone),
                ),
                2,
            )?;
            let resolved = |pool: Option<&str>, roles: &[Role], site: Option<SiteRule>| {
                Some(Resolved {
                    pool: pool.map(str::to_owned),
                    roles: roles.to_vec(),
                    site,
                })
            };
            assert_eq!(
                lookup(tx, "gcp", "p", "z1")?,
                resolved(Some("pool_a"), &[Role::Site], Some(SiteRule::FromZone))
            );
            assert_eq!(lookup(tx, "gcp", "p", "z2")?, resolved(None, &[], None));
            assert_eq!(instance_node(tx, "gcp", "p", "i1")?, None);
            tx.execute(
                "INSERT INTO cloud_instances (provider, account, instance, node_id, created_at)
                 VALUES ('gcp', 'p', 'i1', 'node_b', 4)",
                params![],
            )?;
            assert_eq!(
                instance_node(tx, "gcp", "p", "i1")?.as_deref(),
                Some("node_b")
            );
            assert_eq!(list_instances(tx)?.len(), 1);
            assert_eq!(lookup(tx, "gcp", "q", "z1")?, None);
            Ok::<_, DbError>(())
        })
        .unwrap();
        let rows = t.db.read(list).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].zone, None);
    }
}
