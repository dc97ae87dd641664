//! Sites and their boot leases.
//!
//! A site is a place with its own boot server: site tokens carry it, and a
//! node that joined with one is a site node of that site. One site node at a
//! time holds the lease `site:<id>:boot` and may vouch for the machines it
//! serves over PXE; the epoch rises every time the lease is taken by a new
//! holder (or taken again after it lapsed), so an assertion signed under an
//! older epoch is refused (fencing). Every time is the database's.

use crate::model::pools::{check_name, PoolError};
use crate::store::{params, DbError, LockKey, Store, Tx, UnixMs};

/// The boot lease's default TTL: a holder that stops renewing is replaced
/// after this.
pub(crate) const DEFAULT_LEASE_TTL_MS: i64 = 30_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteRow {
    pub id: String,
    pub name: String,
    pub created_at: UnixMs,
}

/// Creates a site named `name` (unique); returns its row.
pub fn create(db: &Store, name: &str) -> Result<SiteRow, PoolError> {
    check_name("site name", name)?;
    let id = crate::ids::random_id("site_").map_err(DbError::Random)?;
    db.write(|tx| {
        if by_name(tx, name)?.is_some() {
            return Err(PoolError::InvalidInput(format!(
                "a site named {name:?} already exists"
            )));
        }
        let now = tx.now()?;
        tx.execute(
            "INSERT INTO sites (id, name, created_at) VALUES (?1, ?2, ?3)",
            params![id, name, now],
        )?;
        Ok(SiteRow {
            id: id.clone(),
            name: name.to_owned(),
            created_at: now,
        })
    })
}

fn by_name(tx: &Tx<'_>, name: &str) -> Result<Option<String>, DbError> {
    tx.query_opt_map("SELECT id FROM sites WHERE name = ?1", params![name], |r| {
        r.get(0)
    })
}

/// The site `id_or_name` names (an id, else a name): its id.
pub fn resolve(tx: &Tx<'_>, id_or_name: &str) -> Result<String, PoolError> {
    let id: Option<String> = tx.query_opt_map(
        "SELECT id FROM sites WHERE id = ?1 OR name = ?1",
        params![id_or_name],
        |r| r.get(0),
    )?;
    id.ok_or_else(|| PoolError::InvalidInput(format!("no site {id_or_name:?}")))
}

/// Fails unless site `id` exists.
pub(crate) fn require(tx: &Tx<'_>, id: &str) -> Result<(), PoolError> {
    resolve(tx, id).and_then(|found| {
        if found == id {
            Ok(())
        } else {
            Err(PoolError::InvalidInput(format!("no site id {id:?}")))
        }
    })
}

pub fn list(db: &Store) -> Result<Vec<SiteRow>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            "SELECT id, name, created_at FROM sites ORDER BY created_at, id",
            params![],
            |r| {
                Ok(SiteRow {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    created_at: r.get(2)?,
                })
            },
        )?;
        rows.collect::<Result<Vec<_>, _>>()
    })
}

/// A lease as stored. `holder` is `None` once released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
    pub name: String,
    pub holder: Option<String>,
    pub epoch: u64,
    pub expires_at: UnixMs,
}

impl Lease {
    /// The node holding it at `now`, if any.
    pub(crate) fn holder_at(&self, now: UnixMs) -> Option<&str> {
        self.holder.as_deref().filter(|_| now < self.expires_at)
    }
}

/// Serialises the changes of one lease: a first take finds no row to lock,
/// so two site nodes would both take epoch 1 (PG: an advisory lock on
/// `lease:<name>`; SQLite: the IMMEDIATE transaction already does).
fn lock_lease(tx: &Tx<'_>, name: &str) -> Result<(), DbError> {
    tx.lock(&[LockKey {
        namespace: "lease",
        key: name,
    }])
}

pub(crate) fn get_lease(tx: &Tx<'_>, name: &str) -> Result<Option<Lease>, DbError> {
    // PG: `FOR SHARE`: a discovery join relies on the epoch it read.
    let row: Option<(Option<String>, i64, i64)> = tx.query_opt_map(
        &format!(
            "SELECT holder, epoch, expires_at FROM leases WHERE name = ?1{}",
            tx.dialect().for_share()
        ),
        params![name],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    Ok(row.map(|(holder, epoch, expires_at)| Lease {
        name: name.to_owned(),
        holder,
        epoch: u64::try_from(epoch).unwrap_or(0),
        expires_at,
    }))
}

fn put_lease(tx: &Tx<'_>, l: &Lease) -> Result<(), DbError> {
    let epoch = i64::try_from(l.epoch).map_err(|_| DbError::Corrupt {
        what: "lease epoch",
        detail: l.epoch.to_string(),
    })?;
    tx.execute(
        "INSERT INTO leases (name, holder, epoch, expires_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (name) DO UPDATE SET holder = ?2, epoch = ?3, expires_at = ?4",
        params![l.name, l.holder, epoch, l.expires_at],
    )?;
    Ok(())
}

/// What a lease call did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LeaseOutcome {
    /// The caller holds it (now, or still).
    Held(Lease),
    /// Someone else holds it: stand by.
    HeldByOther(Lease),
    /// A renewal or release of an epoch (or a holder) that is not current.
    Lost(Option<Lease>),
}

/// Takes the lease for `node` or extends its hold. The epoch rises
/// whenever the holder changes or the lease is taken again after it lapsed.
pub(crate) fn acquire(
    tx: &Tx<'_>,
    name: &str,
    node: &str,
    now: UnixMs,
    ttl_ms: i64,
) -> Result<LeaseOutcome, DbError> {
    lock_lease(tx, name)?;
    let current = get_lease(tx, name)?;
    let lease = match &current {
        Some(l) if l.holder_at(now) == Some(node) => Lease {
            expires_at: now.saturating_add(ttl_ms),
            ..l.clone()
        },
        Some(l) if l.holder_at(now).is_some() => return Ok(LeaseOutcome::HeldByOther(l.clone())),
        other => Lease {
            name: name.to_owned(),
            holder: Some(node.to_owned()),
            epoch: other.as_ref().map_or(0, |l| l.epoch).saturating_add(1),
            expires_at: now.saturating_add(ttl_ms),
        },
    };
    put_lease(tx, &lease)?;
    Ok(LeaseOutcome::Held(lease))
}

/// Extends `node`'s hold at `epoch`; refused (`Lost`) unless it still holds
/// exactly that epoch.
pub(crate) fn renew(
    tx: &Tx<'_>,
    name: &str,
    node: &str,
    epoch: u64,
    now: UnixMs,
    ttl_ms: i64,
) -> Result<LeaseOutcome, DbError> {
    lock_lease(tx, name)?;
    let current = get_lease(tx, name)?;
    match current {
        Some(l) if l.holder_at(now) == Some(node) && l.epoch == epoch => {
            let lease = Lease {
                expires_at: now.saturating_add(ttl_ms),
                ..l
            };
            put_lease(tx, &lease)?;
            Ok(LeaseOutcome::Held(lease))
        }
        other => Ok(LeaseOutcome::Lost(other)),
    }
}

/// Gives the lease up so a standby takes it at once (with a new epoch).
pub(crate) fn release(
    tx: &Tx<'_>,
    name: &str,
    node: &str,
    epoch: u64,
    now: UnixMs,
) -> Result<LeaseOutcome, DbError> {
    lock_lease(tx, name)?;
    let current = get_lease(tx, name)?;
    match current {
        Some(l) if l.holder_at(now) == Some(node) && l.epoch == epoch => {
            let lease = Lease {
                holder: None,
                expires_at: now,
                ..l
            };
            put_lease(tx, &lease)?;
            Ok(LeaseOutcome::Lost(Some(lease)))
        }
        other => Ok(LeaseOutcome::Lost(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::temp_db;

    #[test]
    fn epoch_rises_at_every_change_of_holder() {
        let t = temp_db();
        t.db.write(|tx| {
            let n = "site:s:boot";
            let LeaseOutcome::Held(a) = acquire(tx, n, "a", 0, 30_000)? else {
                panic!("a takes a free lease")
            };
            assert_eq!(a.epoch, 1);
            assert!(matches!(
                acquire(tx, n, "b", 10_000, 30_000)?,
                LeaseOutcome::HeldByOther(_)
            ));
            let LeaseOutcome::Held(a2) = acquire(tx, n, "a", 20_000, 30_000)? else {
                panic!("a keeps it")
            };
            assert_eq!((a2.epoch, a2.expires_at), (1, 50_000));
            assert!(matches!(
                renew(tx, n, "a", 1, 40_000, 30_000)?,
                LeaseOutcome::Held(_)
            ));
            // a stops renewing: b takes over with a higher epoch; a is fenced.
            let LeaseOutcome::Held(b) = acquire(tx, n, "b", 70_000, 30_000)? else {
                panic!("b takes a lapsed lease")
            };
            assert_eq!(b.epoch, 2);
            assert!(matches!(
                renew(tx, n, "a", 1, 70_001, 30_000)?,
                LeaseOutcome::Lost(_)
            ));
            assert!(matches!(
                renew(tx, n, "b", 1, 70_001, 30_000)?,
                LeaseOutcome::Lost(_)
            ));
            assert!(matches!(
                release(tx, n, "b", 2, 71_000)?,
                LeaseOutcome::Lost(Some(_))
            ));
            let LeaseOutcome::Held(a3) = acquire(tx, n, "a", 71_000, 30_000)? else {
                panic!("a takes a released lease")
            };
            assert_eq!(a3.epoch, 3);
            Ok::<_, DbError>(())
        })
        .unwrap();
    }
}
