//! Tenants (issue 33, spec "tenant"): who owns pools, and whom an event is
//! attributed to. Migration 25 creates `root` and every owner a pool named
//! before, so a control plane that never heard of tenants keeps working;
//! the operator's own events carry none.

use crate::store::{params, DbError, Store, Tx, UnixMs};

/// The tenant every setup starts with: the owner of the `default` pool.
pub const ROOT_TENANT: &str = "root";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantRow {
    pub id: String,
    pub created_at: UnixMs,
}

#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("INVALID_INPUT: {0}")]
    InvalidInput(String),
    #[error("tenant {0:?} already exists")]
    Exists(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// A tenant or pool id: 1 to 64 characters of `A-Z a-z 0-9 . _ -`,
/// starting with a letter or digit (safe in logs, events, command lines and
/// the `urn:bc:tenant:` statement).
pub(crate) fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Creates a tenant.
pub fn create(db: &Store, id: &str) -> Result<TenantRow, TenantError> {
    if !is_name(id) {
        return Err(TenantError::InvalidInput(format!(
            "tenant id {id:?} must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )));
    }
    db.write(|tx| {
        if exists(tx, id)? {
            return Err(TenantError::Exists(id.to_owned()));
        }
        let now = tx.now()?;
        tx.execute(
            "INSERT INTO tenants (id, created_at) VALUES (?1, ?2)",
            params![id, now],
        )?;
        Ok(TenantRow {
            id: id.to_owned(),
            created_at: now,
        })
    })
}

/// Every tenant, oldest first.
pub fn list(db: &Store) -> Result<Vec<TenantRow>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            "SELECT id, created_at FROM tenants ORDER BY created_at, id",
            params![],
            |r| {
                Ok(TenantRow {
                    id: r.get(0)?,
                    created_at: r.get(1)?,
                })
            },
        )?;
        rows.collect()
    })
}

/// Whether the tenant exists, in the caller's transaction.
pub(crate) fn exists(tx: &Tx<'_>, id: &str) -> Result<bool, DbError> {
    let row: Option<String> =
        tx.query_opt_map("SELECT id FROM tenants WHERE id = ?1", params![id], |r| {
            r.get(0)
        })?;
    Ok(row.is_some())
}

/// The tenant owning the pool a node is in (deleted or not): a node's
/// events and its refused renewals are attributed to it.
pub(crate) fn of_node(tx: &Tx<'_>, node_id: &str) -> Result<Option<String>, DbError> {
    tx.query_opt_map(
        "SELECT p.owner FROM nodes n JOIN pools p ON p.id = n.pool_id WHERE n.id = ?1",
        params![node_id],
        |r| r.get(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::temp_db;

    #[test]
    fn root_exists_and_tenants_are_created_once() {
        let t = temp_db();
        let ids =
            |db: &Store| -> Vec<String> { list(db).unwrap().into_iter().map(|t| t.id).collect() };
        assert_eq!(ids(&t.db), [ROOT_TENANT]);
        create(&t.db, "acme").unwrap();
        assert!(matches!(create(&t.db, "acme"), Err(TenantError::Exists(_))));
        assert!(matches!(
            create(&t.db, "bad id"),
            Err(TenantError::InvalidInput(_))
        ));
        assert_eq!(ids(&t.db), [ROOT_TENANT, "acme"]);
    }
}
