//! The resolve table (`cloud resolve add`): which provider accounts may
//! join, and into which pool. A row with zone `''` covers every zone of the
//! account; a row for the VM's own zone wins over it. A row may admit
//! roles beyond `[cloud_iid] roles` (`--role`).

use bc_wire::agent::Role;
use serde::Serialize;

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
    pub created_at: UnixMs,
}

/// Where a VM the table covers joins, and the roles its row adds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// `None`: the default pool.
    pub pool: Option<String>,
    pub roles: Vec<Role>,
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

/// Adds (or replaces) the row for (provider, account, zone).
pub fn add(
    tx: &Tx<'_>,
    provider: &str,
    account: &str,
    zone: Option<&str>,
    pool: Option<&str>,
    roles: &[Role],
    now: UnixMs,
) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO cloud_resolve (provider, account, zone, pool_id, created_at, roles)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (provider, account, zone) DO UPDATE SET pool_id = ?4, created_at = ?5, roles = ?6",
        params![provider, account, zone.unwrap_or(""), pool, now, roles_text(roles)],
    )?;
    Ok(())
}

/// Every row, by provider, account, zone.
pub fn list(tx: &Tx<'_>) -> Result<Vec<ResolveRow>, DbError> {
    let rows = tx
        .query_map(
            "SELECT provider, account, zone, pool_id, created_at, roles FROM cloud_resolve
         ORDER BY provider, account, zone",
            params![],
            |r| {
                let zone: String = r.get(2)?;
                Ok((
                    ResolveRow {
                        provider: r.get(0)?,
                        account: r.get(1)?,
                        zone: (!zone.is_empty()).then_some(zone),
                        pool: r.get(3)?,
                        roles: Vec::new(),
                        created_at: r.get(4)?,
                    },
                    r.get::<Option<String>>(5)?,
                ))
            },
        )?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(|(row, roles)| {
            Ok(ResolveRow {
                roles: parse_roles(roles)?,
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
        "SELECT pool_id, roles FROM cloud_resolve
             WHERE provider = ?1 AND account = ?2 AND (zone = ?3 OR zone = '')
             ORDER BY zone DESC LIMIT 1",
        params![provider, account, zone],
        |r| Ok((r.get::<Option<String>>(0)?, r.get::<Option<String>>(1)?)),
    )?;
    row.map(|(pool, roles)| {
        Ok(Resolved {
            pool,
            roles: parse_roles(roles)?,
        })
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::temp_db;

    #[test]
    fn the_zone_row_wins_over_the_account_row() {
        let t = temp_db();
        t.db.write(|tx| {
            assert_eq!(lookup(tx, "gcp", "p", "z1")?, None);
            add(tx, "gcp", "p", None, None, &[], 1)?;
            add(tx, "gcp", "p", Some("z1"), Some("pool_a"), &[Role::Site], 2)?;
            let resolved = |pool: Option<&str>, roles: &[Role]| {
                Some(Resolved {
                    pool: pool.map(str::to_owned),
                    roles: roles.to_vec(),
                })
            };
            assert_eq!(
                lookup(tx, "gcp", "p", "z1")?,
                resolved(Some("pool_a"), &[Role::Site])
            );
            assert_eq!(lookup(tx, "gcp", "p", "z2")?, resolved(None, &[]));
            assert_eq!(lookup(tx, "gcp", "q", "z1")?, None);
            Ok::<_, DbError>(())
        })
        .unwrap();
        let rows = t.db.read(list).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].zone, None);
    }
}
