//! Trusted hardware keys: what stops one machine from becoming two live
//! nodes (spec "join-token", the reclaim flag, and "Recovering a node whose
//! TPM changed").
//!
//! Each admitted node records the key that identifies its machine, when an
//! attestor proved one: the EK's SHA-256 for a TPM join (`tpm-ek:<hex>`),
//! else the product UUID (`product-uuid:<uuid>`). The product UUID is kept
//! on its own as well, because a TPM join proves it too (the old node of a
//! replaced TPM holds the old EK but the same UUID). A join whose key or
//! proven UUID another live node holds is refused (`reclaim`), unless its
//! token allows a reclaim: then it reclaims that node in place. Deleting a
//! node frees both (only live nodes are searched). Only nodes of the join's
//! role are searched: a machine's PXE ramdisk (role ramdisk) and the system
//! installed on it (role node) are two stages of one machine, not two
//! claims to it.

use rusqlite::{OptionalExtension, Transaction};

use crate::attestor::{AttestationResult, BINDING_TPM_EK};
use crate::db::DbError;

/// Another live node holds this machine's hardware key.
pub const RECLAIM: &str = "reclaim";

/// The hardware identity an admitted join proved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HardwareKey {
    /// `tpm-ek:<sha256 hex>` or `product-uuid:<uuid>`.
    pub key: String,
    /// The proven product UUID (normalized), if any.
    pub product_uuid: Option<String>,
}

/// What `result` proved: its TPM EK binding, else the product UUID its
/// attestor proved or its token's expect binding pinned (JoinService has
/// checked the claims against it by then). `None`: nothing proven.
pub fn of_result(result: &AttestationResult) -> Option<HardwareKey> {
    let product_uuid = result
        .proven_product_uuid
        .clone()
        .or_else(|| result.expect.product_uuid.clone());
    let key = match &result.binding {
        Some(b) if b.kind == BINDING_TPM_EK => format!("{BINDING_TPM_EK}:{}", b.key),
        _ => format!("product-uuid:{}", product_uuid.as_deref()?),
    };
    Some(HardwareKey { key, product_uuid })
}

/// The live (not deleted, not retired) node of `role` other than `except`
/// that holds `hk`'s key or proven product UUID.
pub fn holder(
    tx: &Transaction<'_>,
    hk: &HardwareKey,
    role: &str,
    except: Option<&str>,
) -> Result<Option<String>, DbError> {
    Ok(tx
        .query_row(
            "SELECT id FROM nodes
             WHERE deleted_at IS NULL AND retired_at IS NULL AND id IS NOT ?3 AND role = ?4
               AND (hardware_key = ?1 OR (?2 IS NOT NULL AND product_uuid = ?2))
             ORDER BY joined_at, id LIMIT 1",
            rusqlite::params![hk.key, hk.product_uuid, except, role],
            |r| r.get(0),
        )
        .optional()?)
}

/// Records `hk` as `node_id`'s hardware key (a reclaim replaces the old one).
pub fn record(tx: &Transaction<'_>, node_id: &str, hk: &HardwareKey) -> Result<(), DbError> {
    tx.execute(
        "UPDATE nodes SET hardware_key = ?2, product_uuid = ?3 WHERE id = ?1",
        rusqlite::params![node_id, hk.key, hk.product_uuid],
    )?;
    Ok(())
}

/// The product UUID a node claimed at its newest join that claimed one
/// (what a provisioned token minted for that node expects).
pub fn newest_claimed_product_uuid(
    tx: &Transaction<'_>,
    node_id: &str,
) -> Result<Option<String>, DbError> {
    Ok(tx
        .query_row(
            "SELECT product_uuid FROM joins
             WHERE node_id = ?1 AND product_uuid IS NOT NULL
             ORDER BY id DESC LIMIT 1",
            [node_id],
            |r| r.get(0),
        )
        .optional()?)
}

/// Every node's recorded hardware key, for listings.
pub fn keys(
    db: &crate::db::Database,
) -> Result<std::collections::HashMap<String, String>, DbError> {
    db.with_conn(|c| {
        let mut st =
            c.prepare("SELECT id, hardware_key FROM nodes WHERE hardware_key IS NOT NULL")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<Result<_, _>>().map_err(DbError::from)
    })?
}
