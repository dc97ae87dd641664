//! Pools: every node belongs to one, and a pool's policy can require
//! hardware attestation (`policy.joinAttestors`, spec "Requiring an
//! attestor").
//!
//! A pool's `owner` is a tenant ([`crate::model::tenants`]) that exists.
//! The migration creates the pool `default` (owner `root`, empty policy);
//! a node joins it unless its token, resolve entry or join request names
//! another. No API moves a node between pools: a node gets its pool at join,
//! where the policy is checked.

use serde_json::{json, Value};

use crate::model::boot_policy::{pool_boot_policy, BootPolicy};
use crate::model::machine::EkAssurance;
use crate::store::{params, DbError, Row, Store, Tx, UnixMs};

pub const DEFAULT_POOL: &str = "default";
pub const DEFAULT_OWNER: &str = "root";

/// `policy.joinAttestors` holds 1 to this many attestor ids.
pub(crate) const MAX_JOIN_ATTESTORS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The request is wrong (an unknown attestor, a bad id): nothing changed.
    #[error("INVALID_INPUT: {0}")]
    InvalidInput(String),
    #[error("NOT_FOUND: no pool {0:?}")]
    NotFound(String),
    /// A pool is owned by a tenant that exists (`tenants create`).
    #[error("INVALID_INPUT: no tenant {0:?} to own the pool; create it first (bc-controlplane tenants create {0}) or name another with --tenant")]
    UnknownTenant(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

#[derive(Clone, Debug, PartialEq)]
pub struct PoolRow {
    pub id: String,
    pub owner: String,
    /// The policy object as stored (validated when written).
    pub policy: Value,
    pub created_at: UnixMs,
}

impl PoolRow {
    /// `policy.joinAttestors`: the attestors that may admit a machine into
    /// this pool; `None` means any.
    pub fn join_attestors(&self) -> Result<Option<Vec<String>>, DbError> {
        match self.policy.get("joinAttestors") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| corrupt(&self.id)),
            Some(_) => Err(corrupt(&self.id)),
        }
    }
}

impl PoolRow {
    /// `policy.minEkAssurance`: the least EK assurance a join into this
    /// pool must have (a join that proved no EK has none); `None`: any.
    pub fn min_ek_assurance(&self) -> Result<Option<EkAssurance>, DbError> {
        match self.policy.get("minEkAssurance") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => {
                EkAssurance::parse(s)
                    .map(Some)
                    .ok_or_else(|| DbError::Corrupt {
                        what: "pool policy",
                        detail: format!(
                            "pool {}: minEkAssurance {s:?} is no EK assurance",
                            self.id
                        ),
                    })
            }
            Some(_) => Err(DbError::Corrupt {
                what: "pool policy",
                detail: format!("pool {}: minEkAssurance is not a string", self.id),
            }),
        }
    }
}

/// Parses a `--min-ek-assurance` value.
pub fn parse_ek_assurance(s: &str) -> Result<EkAssurance, PoolError> {
    EkAssurance::parse(s).ok_or_else(|| {
        let all: Vec<_> = EkAssurance::ALL.iter().map(|a| a.as_str()).collect();
        PoolError::InvalidInput(format!(
            "--min-ek-assurance {s:?} is not one of {} (weakest first; nv-chain and nv rank equal)",
            all.join(", ")
        ))
    })
}

fn corrupt(id: &str) -> DbError {
    DbError::Corrupt {
        what: "pool policy",
        detail: format!("pool {id}: joinAttestors is not an array of strings"),
    }
}

/// A pool id or owner: 1 to 64 characters of `A-Z a-z 0-9 . _ -`, starting
/// with a letter or digit (safe in logs, events and command lines).
pub(crate) fn check_name(what: &str, s: &str) -> Result<(), PoolError> {
    if crate::model::tenants::is_name(s) {
        Ok(())
    } else {
        Err(PoolError::InvalidInput(format!(
            "{what} {s:?} must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )))
    }
}

/// `policy.joinAttestors` must be 1 to 16 distinct ids of attestors this
/// control plane runs (`known`), so that a typo cannot lock a pool.
pub(crate) fn validate_join_attestors(list: &[String], known: &[&str]) -> Result<(), PoolError> {
    if list.is_empty() || list.len() > MAX_JOIN_ATTESTORS {
        return Err(PoolError::InvalidInput(format!(
            "joinAttestors must list 1 to {MAX_JOIN_ATTESTORS} attestors, not {}",
            list.len()
        )));
    }
    for (i, id) in list.iter().enumerate() {
        if !known.contains(&id.as_str()) {
            return Err(PoolError::InvalidInput(format!(
                "joinAttestors: {id:?} is not an attestor this control plane runs (it runs {})",
                known.join(", ")
            )));
        }
        if list[..i].contains(id) {
            return Err(PoolError::InvalidInput(format!(
                "joinAttestors: {id:?} is listed twice"
            )));
        }
    }
    Ok(())
}

/// Creates a pool owned by the tenant `owner`, which must exist.
/// `join_attestors`, when given, is validated against `known` (the
/// attestors the control plane runs).
pub fn create_pool(
    db: &Store,
    id: &str,
    owner: &str,
    join_attestors: Option<&[String]>,
    known: &[&str],
) -> Result<PoolRow, PoolError> {
    check_name("pool id", id)?;
    check_name("tenant", owner)?;
    let mut policy = json!({});
    if let Some(list) = join_attestors {
        validate_join_attestors(list, known)?;
        policy["joinAttestors"] = json!(list);
    }
    db.write(|tx| {
        if get(tx, id)?.is_some() {
            return Err(PoolError::InvalidInput(format!(
                "pool {id:?} already exists"
            )));
        }
        if !crate::model::tenants::exists(tx, owner)? {
            return Err(PoolError::UnknownTenant(owner.to_owned()));
        }
        let now = tx.now()?;
        tx.execute(
            "INSERT INTO pools (id, owner, policy, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![id, owner, policy.to_string(), now],
        )?;
        Ok(PoolRow {
            id: id.to_owned(),
            owner: owner.to_owned(),
            policy: policy.clone(),
            created_at: now,
        })
    })
}

/// Replaces `policy.joinAttestors` (`None` removes it: any attestor) and
/// keeps the rest of the policy.
pub fn set_join_attestors(
    db: &Store,
    id: &str,
    join_attestors: Option<&[String]>,
    known: &[&str],
) -> Result<PoolRow, PoolError> {
    if let Some(list) = join_attestors {
        validate_join_attestors(list, known)?;
    }
    set_policy_key(db, id, "joinAttestors", join_attestors.map(|l| json!(l)))
}

/// Replaces `policy.minEkAssurance` (`None` removes it) and keeps the rest
/// of the policy.
pub fn set_min_ek_assurance(
    db: &Store,
    id: &str,
    min: Option<EkAssurance>,
) -> Result<PoolRow, PoolError> {
    set_policy_key(db, id, "minEkAssurance", min.map(|m| json!(m.as_str())))
}

/// Sets the pool's boot policy (`None` removes it), stored as
/// [`BootPolicy::to_toml`] writes it; returns the pool and whether it now
/// has one.
pub fn set_boot_policy(
    db: &Store,
    id: &str,
    policy: Option<&BootPolicy>,
) -> Result<PoolRow, PoolError> {
    let text = policy.map(BootPolicy::to_toml);
    db.write(|tx| {
        let pool = get_for_update(tx, id)?.ok_or_else(|| PoolError::NotFound(id.to_owned()))?;
        tx.execute(
            "UPDATE pools SET boot_policy = ?2 WHERE id = ?1",
            params![id, text.clone()],
        )?;
        Ok(pool)
    })
}

/// Each pool's boot policy, if it has one (`pools list`), by pool id.
pub fn boot_policies(db: &Store) -> Result<Vec<(String, Option<BootPolicy>)>, DbError> {
    db.read(|tx| {
        let ids = tx.query_map("SELECT id FROM pools ORDER BY id", params![], |r| {
            r.get::<String>(0)
        })?;
        let mut out = Vec::new();
        for id in ids {
            let id = id?;
            let policy = pool_boot_policy(tx, &id)?;
            out.push((id, policy));
        }
        Ok(out)
    })
}

/// Sets one key of a pool's policy (`None` removes it), keeping the rest,
/// in one write transaction.
fn set_policy_key(
    db: &Store,
    id: &str,
    key: &str,
    value: Option<Value>,
) -> Result<PoolRow, PoolError> {
    db.write(|tx| {
        let mut pool = get_for_update(tx, id)?.ok_or_else(|| PoolError::NotFound(id.to_owned()))?;
        let Value::Object(map) = &mut pool.policy else {
            return Err(PoolError::Db(DbError::Corrupt {
                what: "pool policy",
                detail: format!("pool {id}: not an object"),
            }));
        };
        match &value {
            Some(v) => {
                map.insert(key.to_owned(), v.clone());
            }
            None => {
                map.remove(key);
            }
        }
        tx.execute(
            "UPDATE pools SET policy = ?2 WHERE id = ?1",
            params![id, pool.policy.to_string()],
        )?;
        Ok(pool)
    })
}

/// One pool, read in `conn`'s transaction.
pub fn get(tx: &Tx<'_>, id: &str) -> Result<Option<PoolRow>, DbError> {
    get_locked(tx, id, "")
}

/// As [`get`], the pool's row locked until commit: a policy change reads
/// the policy and writes it merged (PG: `FOR UPDATE`, no lost update).
pub(crate) fn get_for_update(tx: &Tx<'_>, id: &str) -> Result<Option<PoolRow>, DbError> {
    get_locked(tx, id, tx.dialect().for_update())
}

fn get_locked(tx: &Tx<'_>, id: &str, lock: &str) -> Result<Option<PoolRow>, DbError> {
    let row = tx.query_opt_map(
        &format!("SELECT id, owner, policy, created_at FROM pools WHERE id = ?1{lock}"),
        params![id],
        read_row,
    )?;
    row.map(finish).transpose()
}

/// The pool `id`, or NOT_FOUND: for commands that put something in a pool.
pub(crate) fn require(tx: &Tx<'_>, id: &str) -> Result<PoolRow, PoolError> {
    get(tx, id)?.ok_or_else(|| PoolError::NotFound(id.to_owned()))
}

/// Every pool, with how many nodes it holds.
pub fn list_pools(db: &Store) -> Result<Vec<(PoolRow, i64)>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            "SELECT p.id, p.owner, p.policy, p.created_at,
                    (SELECT count(*) FROM nodes n WHERE n.pool_id = p.id AND n.deleted_at IS NULL)
             FROM pools p ORDER BY p.created_at, p.id",
            params![],
            |r| Ok((read_row(r)?, r.get::<i64>(4)?)),
        )?;
        let mut out = Vec::new();
        for row in rows {
            let (raw, nodes) = row?;
            out.push((finish(raw)?, nodes));
        }
        Ok(out)
    })
}

type RawRow = (String, String, String, UnixMs);

fn read_row(r: &Row) -> Result<RawRow, DbError> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
}

fn finish((id, owner, policy, created_at): RawRow) -> Result<PoolRow, DbError> {
    let policy = serde_json::from_str(&policy).map_err(|e| DbError::Corrupt {
        what: "pool policy",
        detail: format!("pool {id}: {e}"),
    })?;
    Ok(PoolRow {
        id,
        owner,
        policy,
        created_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[&str] = &["join-token", "tpm"];

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn join_attestors_validation() {
        assert!(validate_join_attestors(&s(&["tpm"]), KNOWN).is_ok());
        assert!(validate_join_attestors(&s(&["join-token", "tpm"]), KNOWN).is_ok());
        for bad in [
            s(&[]),
            s(&["x509pop"]),
            s(&["tpm", "tpm"]),
            s(&[""]),
            vec!["tpm".to_owned(); 17],
        ] {
            let e = validate_join_attestors(&bad, KNOWN).unwrap_err();
            assert!(matches!(e, PoolError::InvalidInput(_)), "{bad:?}");
            assert!(e.to_string().starts_with("INVALID_INPUT: "), "{e}");
        }
    }

    #[test]
    fn default_pool_create_update_list() {
        let dir = tempfile::tempdir().unwrap();
        let db = Store::open_dir(dir.path()).unwrap();
        let pools = list_pools(&db).unwrap();
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].0.id, DEFAULT_POOL);
        assert_eq!(pools[0].0.owner, DEFAULT_OWNER);
        assert_eq!(pools[0].0.join_attestors().unwrap(), None);

        assert!(matches!(
            create_pool(&db, "metal", "alice", None, KNOWN),
            Err(PoolError::UnknownTenant(_))
        ));
        crate::model::tenants::create(&db, "alice").unwrap();
        let p = create_pool(&db, "metal", "alice", Some(&s(&["tpm"])), KNOWN).unwrap();
        assert_eq!(p.join_attestors().unwrap(), Some(s(&["tpm"])));
        assert!(matches!(
            create_pool(&db, "metal", "alice", None, KNOWN),
            Err(PoolError::InvalidInput(_))
        ));
        assert!(matches!(
            create_pool(&db, "bad id", "alice", None, KNOWN),
            Err(PoolError::InvalidInput(_))
        ));
        assert!(matches!(
            create_pool(&db, "x", "alice", Some(&s(&["nope"])), KNOWN),
            Err(PoolError::InvalidInput(_))
        ));
        let p = set_join_attestors(&db, "metal", Some(&s(&["join-token", "tpm"])), KNOWN).unwrap();
        assert_eq!(p.join_attestors().unwrap(), Some(s(&["join-token", "tpm"])));
        assert!(matches!(
            set_join_attestors(&db, "metal", Some(&s(&[])), KNOWN),
            Err(PoolError::InvalidInput(_))
        ));
        assert!(matches!(
            set_join_attestors(&db, "nope", None, KNOWN),
            Err(PoolError::NotFound(_))
        ));
        set_join_attestors(&db, "metal", None, KNOWN).unwrap();
        let pools = list_pools(&db).unwrap();
        assert_eq!(pools.len(), 2);
        assert_eq!(pools[1].0.join_attestors().unwrap(), None);
    }
}
