//! Whether an operator already knows an EK: only then is its maker's
//! service asked for its certificate before the machine proved that it
//! holds the EK (round 1). Anything else is asked for after round 2.

use crate::model::enroll;
use crate::model::machine::BINDING_TPM_EK;
use crate::model::records;
use crate::store::{params, DbError, Tx, UnixMs};

/// Whether the EK whose SPKI SHA-256 is `ek_sha256` (lowercase hex) is
/// bound to a node, has a resolve entry, is expected by an open boot entry
/// (`boot add --ek-sha256`, or `--node` of a bound node), or has an
/// approved join request not yet used: each a name an operator wrote.
pub(crate) fn is_known(tx: &Tx<'_>, ek_sha256: &str, now: UnixMs) -> Result<bool, DbError> {
    if records::binding_by_key(tx, BINDING_TPM_EK, ek_sha256)?.is_some()
        || enroll::resolve_entry(tx, ek_sha256)?.is_some()
    {
        return Ok(true);
    }
    let booting = tx.query_opt_map(
        "SELECT 1 FROM boot_entries
         WHERE ek_sha256 = ?1 AND joined_at IS NULL AND not_after > ?2 LIMIT 1",
        params![ek_sha256, now],
        |_| Ok(()),
    )?;
    if booting.is_some() {
        return Ok(true);
    }
    let approved = tx.query_opt_map(
        &format!(
            "SELECT 1 FROM join_requests
             WHERE ek_sha256 = ?1 AND status = '{}' AND used_at IS NULL LIMIT 1",
            enroll::RequestStatus::Approved
        ),
        params![ek_sha256],
        |_| Ok(()),
    )?;
    Ok(approved.is_some())
}
