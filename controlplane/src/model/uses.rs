//! Single-use evidence (spec "Single-use evidence"): `attestation_uses`.
//!
//! An attestor whose evidence could be sent twice (a TPM challenge answer,
//! an x509pop proof) records what it accepted, keyed by a digest it chooses
//! (`subject`), in the join transaction: the row commits with the node it
//! admitted, or rolls back with a refusal (so evidence that admitted nobody
//! is not spent). Being in the database, a use survives a restart and is
//! seen by every replica sharing it.
//!
//! A row is kept until `expires_at`, the moment the evidence would be
//! refused anyway (its challenge or clock window closed); each new use first
//! deletes at most [`PRUNE_BATCH`] expired rows, so the table holds about
//! the uses of one expiry window and no call does unbounded work.

use bc_wire::AttestorId;

use crate::store::{params, DbError, Tx, UnixMs};

/// Expired rows deleted per call, the spec's `pruneAttestationUses` default.
pub(crate) const PRUNE_BATCH: i64 = 5_000;

/// Whether `subject` was already accepted by `attestor` (expired or not:
/// evidence past its expiry is refused by its own checks).
pub(crate) fn is_spent(tx: &Tx<'_>, attestor: AttestorId, subject: &str) -> Result<bool, DbError> {
    Ok(tx
        .query_opt_map(
            "SELECT 1 FROM attestation_uses WHERE attestor = ?1 AND subject = ?2",
            params![attestor, subject],
            |_| Ok(()),
        )?
        .is_some())
}

/// Records that `attestor` accepted `subject`, good until `expires_at`;
/// `false` (nothing written) if it already had. Prunes first.
pub(crate) fn spend(
    tx: &Tx<'_>,
    attestor: AttestorId,
    subject: &str,
    expires_at: UnixMs,
    now: UnixMs,
) -> Result<bool, DbError> {
    prune(tx, now, PRUNE_BATCH)?;
    let inserted = tx.execute(
        "INSERT INTO attestation_uses (attestor, subject, expires_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (attestor, subject) DO NOTHING",
        params![attestor, subject, expires_at],
    )?;
    Ok(inserted == 1)
}

/// Deletes at most `batch` rows that expired before `now`, oldest first;
/// returns how many.
pub(crate) fn prune(tx: &Tx<'_>, now: UnixMs, batch: i64) -> Result<usize, DbError> {
    // PG: `FOR UPDATE SKIP LOCKED`, so concurrent joins skip each other's
    // expired rows instead of waiting on them.
    tx.execute(
        &format!(
            "DELETE FROM attestation_uses WHERE rowid IN (
                 SELECT rowid FROM attestation_uses WHERE expires_at < ?1
                 ORDER BY expires_at LIMIT ?2{})",
            tx.dialect().skip_locked()
        ),
        params![now, batch],
    )
}

/// How many uses are recorded (the tests').
#[cfg(test)]
pub(crate) fn count(tx: &Tx<'_>) -> Result<i64, DbError> {
    tx.query_one("SELECT count(*) FROM attestation_uses", params![])
        .and_then(|r| r.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::temp_db;

    #[test]
    fn a_subject_is_spent_once_per_attestor_and_pruned_in_batches() {
        let t = temp_db();
        t.db.write(|tx| {
            assert!(!is_spent(tx, AttestorId::Tpm, "s1")?);
            assert!(spend(tx, AttestorId::Tpm, "s1", 1_000, 0)?);
            assert!(is_spent(tx, AttestorId::Tpm, "s1")?);
            assert!(!spend(tx, AttestorId::Tpm, "s1", 9_000, 0)?);
            // Another attestor's subject space.
            assert!(spend(tx, AttestorId::X509Pop, "s1", 1_000, 0)?);
            for i in 0..7 {
                assert!(spend(tx, AttestorId::Tpm, &format!("old{i}"), 10 + i, 0)?);
            }
            Ok::<_, DbError>(())
        })
        .unwrap();
        let n = |db: &crate::store::Store| db.read(count).unwrap();
        assert_eq!(n(&t.db), 9);
        // At 500: the seven `old` rows expired, the others not; 3 per call.
        let pruned = t.db.write(|tx| prune(tx, 500, 3)).unwrap();
        assert_eq!(pruned, 3);
        let pruned = t.db.write(|tx| prune(tx, 500, 3)).unwrap();
        assert_eq!(pruned, 3);
        assert_eq!(n(&t.db), 3);
        // A new use prunes the rest first; a row expiring exactly now stays.
        t.db.write(|tx| spend(tx, AttestorId::Tpm, "s2", 2_000, 1_000))
            .unwrap();
        assert_eq!(
            n(&t.db),
            3,
            "s1 rows (expiring at 1000) kept, old6 pruned, s2 added"
        );
        t.db.write(|tx| prune(tx, 1_001, PRUNE_BATCH)).unwrap();
        assert_eq!(n(&t.db), 1);
    }

    #[test]
    fn a_rolled_back_use_is_not_spent() {
        let t = temp_db();
        t.db.write_if(|tx| {
            assert!(spend(tx, AttestorId::Tpm, "s", 1_000, 0).unwrap());
            Ok::<_, DbError>(((), crate::store::Commit::No))
        })
        .unwrap();
        let spent = t.db.write(|tx| is_spent(tx, AttestorId::Tpm, "s")).unwrap();
        assert!(!spent);
    }
}
