//! The node lifecycle an operator drives: revoke a node's identity, retire,
//! cordon and delete it, and list its certificates.
//!
//! Each change runs in one `BEGIN IMMEDIATE` transaction, at database time,
//! and stores its event in the same transaction, so the log never disagrees
//! with the rows:
//!
//! - **revoke-identity** (`node.identity.revoked`): the identity generation is
//!   raised and every certificate revoked, so no certificate from before it
//!   ever renews (`stale-generation`) or re-joins with x509pop. The node
//!   keeps its id, pool and bindings: a TPM-bound node comes back by joining
//!   with its TPM;
//! - **retire** (`node.retired`): the node never renews, re-joins or is
//!   reclaimed again; its current certificate runs out (at most 24 hours);
//! - **cordon** (`node.cordoned`): marks the node for removal (nothing new
//!   should be placed on it); delete requires it;
//! - **delete** (`node.deleted`), cordoned nodes only: every certificate is
//!   revoked, its hardware bindings (`node_bindings`) are freed so the
//!   machine can join again as a new node, and resolve entries naming it
//!   are removed (they could only ever fail). The row stays, marked deleted,
//!   so its certificates, joins and events keep naming it; no lookup of a
//!   live node finds it again.
//!
//! A change that is already in effect (retiring a retired node) changes
//! nothing and stores no event.

use serde_json::json;

use crate::model::records::{self, BindingRow, CertRow, NewEvent, NodeRow};
use crate::store::{params, DbError, Store, Tx, UnixMs};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("NOT_FOUND: no node {0:?}")]
    NotFound(String),
    /// The request does not apply to the node as it is: nothing changed.
    #[error("FAILED_PRECONDITION: {0}")]
    Precondition(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// What `revoke-identity` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevokedIdentity {
    pub node_id: String,
    /// The new identity generation; no certificate has it yet.
    pub identity_generation: i64,
    pub revoked_certs: usize,
}

/// What `delete` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deleted {
    pub node_id: String,
    pub revoked_certs: usize,
    pub freed_bindings: Vec<BindingRow>,
    pub removed_resolve_entries: usize,
}

/// Raises the node's identity generation and revokes every certificate it has.
pub fn revoke_identity(db: &Store, node_id: &str) -> Result<RevokedIdentity, NodeError> {
    let r = db.write(|tx| -> Result<_, NodeError> {
        let node = live_node(tx, node_id)?;
        let now = tx.now()?;
        let generation = node.identity_generation.saturating_add(1);
        tx.execute(
            "UPDATE nodes SET identity_generation = ?2 WHERE id = ?1",
            params![node.id, generation],
        )?;
        let revoked = records::revoke_all_certs(tx, &node.id, now)?;
        event(
            tx,
            records::EVENT_IDENTITY_REVOKED,
            now,
            &node.id,
            json!({ "identityGeneration": generation, "revokedCerts": revoked }),
        )?;
        Ok(RevokedIdentity {
            node_id: node.id,
            identity_generation: generation,
            revoked_certs: revoked,
        })
    })?;
    // Logged once committed (a re-run transaction logs nothing twice).
    tracing::info!(
        node_id = %r.node_id,
        generation = r.identity_generation,
        revoked = r.revoked_certs,
        "node identity revoked"
    );
    Ok(r)
}

/// Retires a node; `false` if it already was.
pub fn retire(db: &Store, node_id: &str) -> Result<bool, NodeError> {
    stamp(db, node_id, Stamp::Retired)
}

/// Cordons a node; `false` if it already was.
pub fn cordon(db: &Store, node_id: &str) -> Result<bool, NodeError> {
    stamp(db, node_id, Stamp::Cordoned)
}

/// A lifecycle step that is a timestamp set once.
#[derive(Clone, Copy)]
enum Stamp {
    Retired,
    Cordoned,
}

/// Sets `which` on a live node at the database's now, with its event;
/// `false` (and nothing written) if it was already set.
fn stamp(db: &Store, node_id: &str, which: Stamp) -> Result<bool, NodeError> {
    let (sql, kind, label) = match which {
        Stamp::Retired => (
            "UPDATE nodes SET retired_at = ?2 WHERE id = ?1",
            records::EVENT_NODE_RETIRED,
            "node retired",
        ),
        Stamp::Cordoned => (
            "UPDATE nodes SET cordoned_at = ?2 WHERE id = ?1",
            records::EVENT_NODE_CORDONED,
            "node cordoned",
        ),
    };
    let stamped = db.write(|tx| -> Result<_, NodeError> {
        let node = live_node(tx, node_id)?;
        let already = match which {
            Stamp::Retired => node.retired_at.is_some(),
            Stamp::Cordoned => node.cordoned_at.is_some(),
        };
        if already {
            return Ok(false);
        }
        let now = tx.now()?;
        tx.execute(sql, params![node.id, now])?;
        event(tx, kind, now, &node.id, json!({}))?;
        Ok(true)
    })?;
    if stamped {
        tracing::info!(node_id = %node_id, "{label}");
    }
    Ok(stamped)
}

/// Deletes a cordoned node: revokes its certificates, frees its bindings,
/// removes resolve entries naming it.
pub fn delete(db: &Store, node_id: &str) -> Result<Deleted, NodeError> {
    let d = db.write(|tx| -> Result<_, NodeError> {
        let node = live_node(tx, node_id)?;
        if node.cordoned_at.is_none() {
            return Err(NodeError::Precondition(format!(
                "node {} is not cordoned; cordon it first (nodes cordon {})",
                node.id, node.id
            )));
        }
        let now = tx.now()?;
        tx.execute(
            "UPDATE nodes SET deleted_at = ?2 WHERE id = ?1",
            params![node.id, now],
        )?;
        let revoked = records::revoke_all_certs(tx, &node.id, now)?;
        let freed = records::delete_bindings_of_node(tx, &node.id)?;
        let resolve = tx.execute(
            "DELETE FROM tpm_resolve WHERE node_id = ?1",
            params![&node.id],
        )?;
        let bindings: Vec<_> = freed
            .iter()
            .map(|b| json!({ "kind": b.kind, "key": b.key }))
            .collect();
        event(
            tx,
            records::EVENT_NODE_DELETED,
            now,
            &node.id,
            json!({
                "revokedCerts": revoked,
                "freedBindings": bindings,
                "removedResolveEntries": resolve,
            }),
        )?;
        Ok(Deleted {
            node_id: node.id,
            revoked_certs: revoked,
            freed_bindings: freed,
            removed_resolve_entries: resolve,
        })
    })?;
    tracing::info!(
        node_id = %d.node_id,
        revoked = d.revoked_certs,
        bindings = d.freed_bindings.len(),
        "node deleted"
    );
    Ok(d)
}

/// A node's certificates, oldest first; a deleted node's too (its history).
pub fn certs(db: &Store, node_id: &str) -> Result<Vec<CertRow>, NodeError> {
    let exists = db
        .read(|tx| records::node_including_deleted(tx, node_id))?
        .is_some();
    if !exists {
        return Err(NodeError::NotFound(node_id.to_owned()));
    }
    Ok(records::list_certs(db, node_id)?)
}

/// A node (a deleted one too) and its last verified boot, if a join or a
/// renewal under its pool's boot policy verified one.
pub fn show(
    db: &Store,
    node_id: &str,
) -> Result<(NodeRow, Option<crate::model::node_boot::LastBoot>), NodeError> {
    let found = db.read(|tx| -> Result<_, DbError> {
        let Some(node) = records::node_including_deleted(tx, node_id)? else {
            return Ok(None);
        };
        let boot = crate::model::node_boot::last(tx, node_id)?;
        Ok(Some((node, boot)))
    })?;
    found.ok_or_else(|| NodeError::NotFound(node_id.to_owned()))
}

fn live_node(tx: &Tx<'_>, node_id: &str) -> Result<NodeRow, NodeError> {
    records::node_for_update(tx, node_id)?.ok_or_else(|| NodeError::NotFound(node_id.to_owned()))
}

fn event(
    tx: &Tx<'_>,
    kind: &str,
    at: UnixMs,
    node_id: &str,
    data: serde_json::Value,
) -> Result<(), DbError> {
    records::insert_event(
        tx,
        &NewEvent {
            kind,
            at,
            attestor: None,
            reason: None,
            token_id: None,
            node_id: Some(node_id),
            data,
            ..NewEvent::default()
        },
    )
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_support::temp_db as fixture;

    fn node(db: &Store, id: &str) {
        crate::test_support::insert_node(db, id, bc_wire::AttestorId::JoinToken, 1);
    }

    fn cert(db: &Store, id: &str, serial: &str, generation: i64) {
        db.write(|tx| {
            tx.execute(
                "INSERT INTO node_certs (serial, node_id, identity_generation, der, not_before, not_after)
                 VALUES (?1, ?2, ?3, ?4, 0, 1)",
                params![serial, id, generation, [0_u8]],
            )})
        .unwrap();
    }

    fn kinds(db: &Store) -> Vec<String> {
        records::list_events(db)
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect()
    }

    #[test]
    fn revoke_identity_revokes_every_generation() {
        let f = fixture();
        node(&f.db, "node_a");
        cert(&f.db, "node_a", "01", 1);
        cert(&f.db, "node_a", "02", 1);
        let r = revoke_identity(&f.db, "node_a").unwrap();
        assert_eq!((r.identity_generation, r.revoked_certs), (2, 2));
        assert!(certs(&f.db, "node_a")
            .unwrap()
            .iter()
            .all(|c| c.revoked_at.is_some()));
        assert_eq!(
            records::list_nodes(&f.db).unwrap()[0].identity_generation,
            2
        );
        let ev = records::list_events(&f.db).unwrap();
        assert_eq!(ev[0].kind, records::EVENT_IDENTITY_REVOKED);
        assert_eq!(ev[0].data["identityGeneration"], 2);
        assert!(matches!(
            revoke_identity(&f.db, "node_nope"),
            Err(NodeError::NotFound(_))
        ));
    }

    #[test]
    fn retire_and_cordon_once() {
        let f = fixture();
        node(&f.db, "node_a");
        assert!(retire(&f.db, "node_a").unwrap());
        assert!(!retire(&f.db, "node_a").unwrap());
        assert!(cordon(&f.db, "node_a").unwrap());
        assert!(!cordon(&f.db, "node_a").unwrap());
        let n = &records::list_nodes(&f.db).unwrap()[0];
        assert!(n.retired_at.is_some() && n.cordoned_at.is_some());
        assert_eq!(
            kinds(&f.db),
            [records::EVENT_NODE_RETIRED, records::EVENT_NODE_CORDONED]
        );
        assert!(matches!(
            cordon(&f.db, "node_nope"),
            Err(NodeError::NotFound(_))
        ));
    }

    #[test]
    fn delete_needs_cordon_then_frees_the_machine() {
        let f = fixture();
        node(&f.db, "node_a");
        cert(&f.db, "node_a", "01", 1);
        f.db.write(|tx| {
            records::insert_binding(tx, "tpm-ek", "ab", "node_a", 1)?;
            tx.execute("INSERT INTO tpm_resolve (ek_sha256, node_id, created_at) VALUES ('cd', 'node_a', 1)", params![])})
        .unwrap();
        let err = delete(&f.db, "node_a").unwrap_err();
        assert!(matches!(err, NodeError::Precondition(_)), "{err}");
        assert_eq!(records::list_bindings(&f.db).unwrap().len(), 1);

        cordon(&f.db, "node_a").unwrap();
        let d = delete(&f.db, "node_a").unwrap();
        assert_eq!(
            (
                d.revoked_certs,
                d.freed_bindings.len(),
                d.removed_resolve_entries
            ),
            (1, 1, 1)
        );
        assert!(records::list_nodes(&f.db).unwrap().is_empty());
        assert!(records::list_bindings(&f.db).unwrap().is_empty());
        // Its history is still there.
        assert!(certs(&f.db, "node_a").unwrap()[0].revoked_at.is_some());
        let ev = records::list_events(&f.db).unwrap();
        let last = ev.last().unwrap();
        assert_eq!(last.kind, records::EVENT_NODE_DELETED);
        assert_eq!(last.data["freedBindings"][0]["key"], "ab");
        // Gone for every other command.
        assert!(matches!(
            delete(&f.db, "node_a"),
            Err(NodeError::NotFound(_))
        ));
        assert!(matches!(
            retire(&f.db, "node_a"),
            Err(NodeError::NotFound(_))
        ));
        assert!(matches!(
            certs(&f.db, "node_nope"),
            Err(NodeError::NotFound(_))
        ));
        // The machine's key can bind another node now.
        node(&f.db, "node_b");
        f.db.write(|tx| records::insert_binding(tx, "tpm-ek", "ab", "node_b", 2))
            .unwrap();
    }
}
