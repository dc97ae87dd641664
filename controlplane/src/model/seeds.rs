//! STUB until the `deploy` branch (helper B) is merged: the signatures of
//! B's `deploy_seeds` table access. B's file replaces this one whole.

use crate::store::{DbError, Tx, UnixMs};

/// Stores `doc` as the node's seed until `not_after` (stub: not stored);
/// returns its SHA-256 (hex).
pub(crate) fn put(
    tx: &Tx<'_>,
    node_id: &str,
    doc: &[u8],
    not_after: UnixMs,
) -> Result<String, DbError> {
    let _ = (tx, node_id, not_after);
    Ok(hex::encode(bc_wire::sha256(doc)))
}

/// Removes the node's seed (stub: nothing stored).
pub(crate) fn remove(tx: &Tx<'_>, node_id: &str) -> Result<(), DbError> {
    let _ = (tx, node_id);
    Ok(())
}
