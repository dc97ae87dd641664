//! NoCloud seeds: the user data (with the provisioned token a deploy
//! workflow minted) and meta-data `deploy.image` writes into the image it
//! deployed, fetched by the node's ramdisk from `GET /v1/deploy/seed`.
//!
//! One seed per node, sealed at rest under the boot key (as boot entries'
//! tokens are: the database alone holds no usable token), with the SHA-256
//! of its plain document, which the signed command pins. It is served only
//! until its `not_after` (database time).

use sha2::{Digest, Sha256};

use crate::model::boot::BootKey;
use crate::store::{params, DbError, Tx, UnixMs};

/// The largest seed document.
pub const MAX_SEED_BYTES: usize = 256 * 1024;

/// The associated data a node's seed is sealed with.
fn aad(node_id: &str) -> String {
    format!("deploy-seed:{node_id}")
}

/// Whether `doc` is a seed document: a JSON object of exactly the strings
/// `user-data` and `meta-data`, at most [`MAX_SEED_BYTES`].
pub fn check_doc(doc: &[u8]) -> Result<(), String> {
    if doc.len() > MAX_SEED_BYTES {
        return Err(format!("{} bytes, at most {MAX_SEED_BYTES}", doc.len()));
    }
    let v: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(doc).map_err(|e| format!("not a JSON object: {e}"))?;
    let strings = ["user-data", "meta-data"]
        .iter()
        .all(|k| v.get(*k).is_some_and(serde_json::Value::is_string));
    if !strings || v.len() != 2 {
        return Err("not exactly the strings \"user-data\" and \"meta-data\"".to_owned());
    }
    // The map kept the last of a repeated key, where the agent's parse
    // refuses the document: one the agent refuses must not be stored (the
    // deploy would fail after writing the disk), nor one two readers may
    // read differently.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        #[serde(rename = "user-data")]
        _user_data: String,
        #[serde(rename = "meta-data")]
        _meta_data: String,
    }
    serde_json::from_slice::<Doc>(doc)
        .map_err(|_| "\"user-data\" or \"meta-data\" given twice".to_owned())?;
    Ok(())
}

/// Makes `doc` the node's seed until `not_after` (replacing any); returns
/// its SHA-256 (lowercase hex), for `deploy.image`'s `seed` argument.
pub fn put(
    tx: &Tx<'_>,
    key: &BootKey,
    node_id: &str,
    doc: &[u8],
    not_after: UnixMs,
) -> Result<String, DbError> {
    check_doc(doc).map_err(|why| DbError::Corrupt {
        what: "deploy seed document (not stored)",
        detail: why,
    })?;
    let text = std::str::from_utf8(doc).map_err(|_| DbError::Corrupt {
        what: "deploy seed document (not stored)",
        detail: "not UTF-8".to_owned(),
    })?;
    let sha256 = hex::encode(Sha256::digest(doc));
    let sealed = key.seal(&aad(node_id), text)?;
    let now = tx.now()?;
    tx.execute(
        "DELETE FROM deploy_seeds WHERE node_id = ?1",
        params![node_id],
    )?;
    tx.execute(
        "INSERT INTO deploy_seeds (node_id, sealed, sha256, not_after, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![node_id, sealed, sha256, not_after, now],
    )?;
    Ok(sha256)
}

/// Forgets the node's seed (a workflow cancelled or done).
pub fn remove(tx: &Tx<'_>, node_id: &str) -> Result<(), DbError> {
    tx.execute(
        "DELETE FROM deploy_seeds WHERE node_id = ?1",
        params![node_id],
    )?;
    Ok(())
}

/// The node's seed document, opened, while `now` is before its not_after.
pub(crate) fn current(
    tx: &Tx<'_>,
    key: &BootKey,
    node_id: &str,
    now: UnixMs,
) -> Result<Option<Vec<u8>>, DbError> {
    let sealed: Option<Vec<u8>> = tx.query_opt_map(
        "SELECT sealed FROM deploy_seeds WHERE node_id = ?1 AND not_after > ?2",
        params![node_id, now],
        |r| r.get(0),
    )?;
    sealed
        .map(|s| key.open(&aad(node_id), &s).map(String::into_bytes))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::test_support::both_backends!(put_serve_expire_remove);

    /// A key given twice is refused: the agent's parse refuses it (the
    /// `deploy_seed` fuzz target's finding), so storing it would fail the
    /// deploy after the disk was written.
    #[test]
    fn a_repeated_key_is_refused() {
        let e = check_doc(br#"{"user-data":"a","meta-data":"b","user-data":"c"}"#).unwrap_err();
        assert!(e.contains("twice"), "{e}");
        check_doc(br#"{"user-data":"a","meta-data":"b"}"#).unwrap();
    }

    fn put_serve_expire_remove(backend: crate::test_support::Backend) {
        let t = crate::test_support::temp_db_on(backend);
        crate::test_support::insert_node(&t.db, "node_a", bc_wire::AttestorId::JoinToken, 1);
        let key = BootKey::derive(&[3; 32]);
        let doc = br##"{"user-data":"#cloud-config\n","meta-data":"instance-id: a\n"}"##;
        let now = t.db.read(|tx| tx.now()).unwrap();
        let sha =
            t.db.write(|tx| put(tx, &key, "node_a", doc, now + 60_000))
                .unwrap();
        assert_eq!(sha, hex::encode(Sha256::digest(doc)));
        let sealed: Vec<u8> =
            t.db.read(|tx| {
                tx.query_one("SELECT sealed FROM deploy_seeds", params![])?
                    .get(0)
            })
            .unwrap();
        assert!(
            !sealed.windows(12).any(|w| w == b"cloud-config"),
            "sealed at rest"
        );
        let got = |at| t.db.read(|tx| current(tx, &key, "node_a", at)).unwrap();
        assert_eq!(got(now).as_deref(), Some(&doc[..]));
        assert_eq!(got(now + 60_000), None, "not after its not_after");
        // Another node's key material does not open it.
        let other =
            t.db.read(|tx| current(tx, &BootKey::derive(&[4; 32]), "node_a", now));
        assert!(other.is_err());
        for bad in [
            &b"[]"[..],
            br#"{"user-data":"x"}"#,
            br#"{"user-data":1,"meta-data":""}"#,
        ] {
            assert!(t.db.write(|tx| put(tx, &key, "node_a", bad, now)).is_err());
        }
        t.db.write(|tx| remove(tx, "node_a")).unwrap();
        assert_eq!(got(now), None);
    }
}
