//! Join tokens in the database. Only the SHA-256 of a secret is stored, so
//! a copy of the database admits no machine.

use bc_wire::agent::Role;
use bc_wire::token::JoinToken;

use crate::model::machine::Expect;
use crate::model::pools::{self, PoolError};
use crate::model::records;
use crate::store::{params, DbError, Row, Store, Tx, UnixMs};

/// A `join_tokens` row; never holds the secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRow {
    pub id: String,
    pub(crate) secret_sha256: [u8; 32],
    pub role: String,
    pub uses_left: i64,
    pub expires_at: UnixMs,
    pub revoked_at: Option<UnixMs>,
    pub created_at: UnixMs,
    /// The pool the token's nodes join (`None`: `default`).
    pub pool_id: Option<String>,
    /// The machine the token was minted for, if it is bound to one.
    pub expect: Expect,
    /// The site a site or discovery token admits to.
    pub site_id: Option<String>,
    /// The node a provisioned token re-keys in place (`--node`).
    pub target_node_id: Option<String>,
    /// A join whose hardware key a live node holds reclaims that node.
    pub allow_reclaim: bool,
}

/// SHA-256 of a token secret, as stored.
pub(crate) fn secret_sha256(secret: &[u8]) -> [u8; 32] {
    bc_wire::sha256(secret)
}

/// Mints a token of `role` with `uses` uses that expires `ttl_ms` after the
/// database's now. Returns the token (shown once to the operator) and its row.
pub fn create_token(
    db: &Store,
    role: Role,
    uses: u32,
    ttl_ms: i64,
) -> Result<(JoinToken, TokenRow), DbError> {
    create_token_in_pool(db, role, uses, ttl_ms, None).map_err(|e| match e {
        PoolError::Db(e) => e,
        // No pool was named, so none can be missing.
        other => DbError::Corrupt {
            what: "pool",
            detail: other.to_string(),
        },
    })
}

/// [`create_token`] whose nodes join `pool` (which must exist).
pub(crate) fn create_token_in_pool(
    db: &Store,
    role: Role,
    uses: u32,
    ttl_ms: i64,
    pool: Option<&str>,
) -> Result<(JoinToken, TokenRow), PoolError> {
    create_bound_token(db, role, uses, ttl_ms, pool, &Expect::default())
}

/// What a token is minted for, beyond its role and uses.
#[derive(Clone, Debug, Default)]
pub struct TokenScope<'a> {
    pub pool: Option<&'a str>,
    pub expect: Expect,
    /// A site token's (and a discovery token's) site; must exist.
    pub site: Option<&'a str>,
    /// A provisioned token's target node; must be a live node.
    pub target_node: Option<&'a str>,
    pub allow_reclaim: bool,
}

/// [`create_token_in_pool`] bound to the machine `expect` describes
/// (values already normalized, see [`crate::model::machine::Mac`]):
/// JoinService refuses a join whose claims do not match.
pub(crate) fn create_bound_token(
    db: &Store,
    role: Role,
    uses: u32,
    ttl_ms: i64,
    pool: Option<&str>,
    expect: &Expect,
) -> Result<(JoinToken, TokenRow), PoolError> {
    let scope = TokenScope {
        pool,
        expect: expect.clone(),
        ..TokenScope::default()
    };
    db.write(|tx| insert_token(tx, role.name(), uses, ttl_ms, &scope))
}

/// Mints a token inside a write transaction (so a boot entry and its token
/// are written together).
pub fn insert_token(
    tx: &Tx<'_>,
    role: &str,
    uses: u32,
    ttl_ms: i64,
    scope: &TokenScope<'_>,
) -> Result<(JoinToken, TokenRow), PoolError> {
    let pool = scope.pool;
    let expect = &scope.expect;
    let id = crate::ids::random_id("tok_").map_err(DbError::Random)?;
    let secret =
        crate::ids::random_bytes::<{ bc_wire::token::SECRET_LEN }>().map_err(DbError::Random)?;
    let token = JoinToken { id, secret };
    let row = {
        if let Some(site) = scope.site {
            crate::model::sites::require(tx, site)?;
        }
        if let Some(pool) = pool {
            pools::require(tx, pool)?;
        }
        if let Some(node) = scope.target_node {
            let live = records::node_for_update(tx, node)?.is_some_and(|n| n.retired_at.is_none());
            if !live {
                return Err(PoolError::InvalidInput(format!(
                    "--node {node}: no such live node"
                )));
            }
        }
        let now = tx.now()?;
        let row = TokenRow {
            id: token.id.clone(),
            secret_sha256: secret_sha256(&token.secret),
            role: role.to_owned(),
            uses_left: i64::from(uses),
            expires_at: now.saturating_add(ttl_ms),
            revoked_at: None,
            created_at: now,
            pool_id: pool.map(str::to_owned),
            expect: expect.clone(),
            site_id: scope.site.map(str::to_owned),
            target_node_id: scope.target_node.map(str::to_owned),
            allow_reclaim: scope.allow_reclaim,
        };
        tx.execute(
            "INSERT INTO join_tokens (id, secret_sha256, role, uses_left, expires_at, created_at, pool_id,
                                      expect_product_uuid, expect_mac, site_id,
                                      target_node_id, allow_reclaim)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                row.id,
                row.secret_sha256.as_slice(),
                row.role,
                row.uses_left,
                row.expires_at,
                row.created_at,
                row.pool_id,
                row.expect.product_uuid,
                row.expect.mac,
                row.site_id,
                row.target_node_id,
                row.allow_reclaim
            ],
        )?;
        row
    };
    Ok((token, row))
}

#[derive(Debug, PartialEq, Eq)]
pub enum RevokeOutcome {
    Revoked,
    AlreadyRevoked,
    Unknown,
}

/// Revokes a token at the database's now; revoking twice keeps the first time.
pub fn revoke_token(db: &Store, id: &str) -> Result<RevokeOutcome, DbError> {
    db.write(|tx| {
        let now = tx.now()?;
        revoke_in(tx, id, now)
    })
}

/// [`revoke_token`] inside a transaction, at `now`.
pub(crate) fn revoke_in(tx: &Tx<'_>, id: &str, now: UnixMs) -> Result<RevokeOutcome, DbError> {
    let Some(row) = token_for_update(tx, id)? else {
        return Ok(RevokeOutcome::Unknown);
    };
    if row.revoked_at.is_some() {
        return Ok(RevokeOutcome::AlreadyRevoked);
    }
    tx.execute(
        "UPDATE join_tokens SET revoked_at = ?2 WHERE id = ?1",
        params![id, now],
    )?;
    Ok(RevokeOutcome::Revoked)
}

pub fn list_tokens(db: &Store) -> Result<Vec<TokenRow>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            &format!("{SELECT} ORDER BY created_at, id"),
            params![],
            read_row,
        )?;
        let mut out = Vec::new();
        for r in rows {
            out.push(r??);
        }
        Ok(out)
    })
}

/// Reads a token row inside a write transaction. The transaction is
/// IMMEDIATE, so the row cannot change until it ends: this is the lock.
pub fn token_for_update(tx: &Tx<'_>, id: &str) -> Result<Option<TokenRow>, DbError> {
    // PG: `FOR UPDATE`: no revoke or spend between the check and the use.
    let row = tx.query_opt_map(
        &format!("{SELECT} WHERE id = ?1{}", tx.dialect().for_update()),
        params![id],
        read_row,
    )?;
    row.transpose()
}

/// Spends one use of a token; refuses (as an error) a token with none left.
pub(crate) fn consume_use(tx: &Tx<'_>, id: &str) -> Result<(), DbError> {
    let n = tx.execute(
        "UPDATE join_tokens SET uses_left = uses_left - 1 WHERE id = ?1 AND uses_left > 0",
        params![id],
    )?;
    if n == 1 {
        Ok(())
    } else {
        Err(DbError::Corrupt {
            what: "token use count",
            detail: format!("{id} has no use left to consume"),
        })
    }
}

const SELECT: &str =
    "SELECT id, secret_sha256, role, uses_left, expires_at, revoked_at, created_at, pool_id,
            expect_product_uuid, expect_mac, site_id, target_node_id, allow_reclaim
     FROM join_tokens";

type RowResult = Result<TokenRow, DbError>;

fn read_row(r: &Row) -> Result<RowResult, DbError> {
    let id: String = r.get(0)?;
    let hash: Vec<u8> = r.get(1)?;
    let Ok(secret_sha256) = <[u8; 32]>::try_from(hash.as_slice()) else {
        return Ok(Err(DbError::Corrupt {
            what: "token hash",
            detail: format!("{id}: {} bytes", hash.len()),
        }));
    };
    Ok(Ok(TokenRow {
        id,
        secret_sha256,
        role: r.get(2)?,
        uses_left: r.get(3)?,
        expires_at: r.get(4)?,
        revoked_at: r.get(5)?,
        created_at: r.get(6)?,
        pool_id: r.get(7)?,
        expect: Expect {
            product_uuid: r.get(8)?,
            mac: r.get(9)?,
        },
        site_id: r.get(10)?,
        target_node_id: r.get(11)?,
        allow_reclaim: r.get(12)?,
    }))
}
