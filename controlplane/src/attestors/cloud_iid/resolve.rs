//! The resolve table (`cloud resolve add`): which provider accounts may
//! join, and into which pool. A row with zone `''` covers every zone of the
//! account; a row for the VM's own zone wins over it.

use rusqlite::{OptionalExtension, Transaction};
use serde::Serialize;

use crate::db::{DbError, UnixMs};

/// One row, as `cloud resolve list` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResolveRow {
    pub provider: String,
    pub account: String,
    /// `None`: any zone.
    pub zone: Option<String>,
    /// `None`: the default pool.
    pub pool: Option<String>,
    pub created_at: UnixMs,
}

/// Adds (or replaces) the row for (provider, account, zone).
pub fn add(
    tx: &Transaction<'_>,
    provider: &str,
    account: &str,
    zone: Option<&str>,
    pool: Option<&str>,
    now: UnixMs,
) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO cloud_resolve (provider, account, zone, pool_id, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (provider, account, zone) DO UPDATE SET pool_id = ?4, created_at = ?5",
        rusqlite::params![provider, account, zone.unwrap_or(""), pool, now],
    )?;
    Ok(())
}

/// Every row, by provider, account, zone.
pub fn list(conn: &rusqlite::Connection) -> Result<Vec<ResolveRow>, DbError> {
    let mut st = conn.prepare(
        "SELECT provider, account, zone, pool_id, created_at FROM cloud_resolve
         ORDER BY provider, account, zone",
    )?;
    let rows = st
        .query_map([], |r| {
            let zone: String = r.get(2)?;
            Ok(ResolveRow {
                provider: r.get(0)?,
                account: r.get(1)?,
                zone: (!zone.is_empty()).then_some(zone),
                pool: r.get(3)?,
                created_at: r.get(4)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// Where a VM joins: `Some(pool)` (`None` pool: the default) when a row
/// covers it, `None` when none does.
pub fn lookup(
    tx: &Transaction<'_>,
    provider: &str,
    account: &str,
    zone: &str,
) -> Result<Option<Option<String>>, DbError> {
    Ok(tx
        .query_row(
            "SELECT pool_id FROM cloud_resolve
             WHERE provider = ?1 AND account = ?2 AND (zone = ?3 OR zone = '')
             ORDER BY zone DESC LIMIT 1",
            rusqlite::params![provider, account, zone],
            |r| r.get::<_, Option<String>>(0),
        )
        .optional()?)
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
            add(tx, "gcp", "p", None, None, 1)?;
            add(tx, "gcp", "p", Some("z1"), Some("pool_a"), 2)?;
            assert_eq!(lookup(tx, "gcp", "p", "z1")?, Some(Some("pool_a".into())));
            assert_eq!(lookup(tx, "gcp", "p", "z2")?, Some(None));
            assert_eq!(lookup(tx, "gcp", "q", "z1")?, None);
            Ok::<_, DbError>(())
        })
        .unwrap();
        let rows = t.db.with_conn(|c| list(c)).unwrap().unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].zone, None);
    }
}
