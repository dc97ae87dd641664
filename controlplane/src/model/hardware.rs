//! Trusted hardware keys: what stops one machine from becoming two live
//! nodes (spec "join-token", the reclaim flag, and "Recovering a node whose
//! TPM changed").
//!
//! Only what a machine proved or an operator bound is a hardware key: the
//! EK's SHA-256 of a TPM join (`tpm-ek:<hex>`), else a product UUID an
//! operator bound the admitting token or entry to (a token's
//! `expect.productUuid`, a boot entry's `--product-uuid`, a provisioned
//! token's machine): `product-uuid:<uuid>`. A UUID a machine merely claims
//! (a TPM join's or a discovery join's claims, iPXE's query) is recorded in
//! the join's audit row, never trusted: anyone on the boot LAN can claim any
//! UUID, and squatting a victim's would lock it out. Placeholder UUIDs
//! ([`is_placeholder`]) are never keys, whoever bound them: thousands of
//! boards ship the same one.
//!
//! The product UUID is kept on its own as well. A join whose key or bound
//! UUID another live node holds is refused (`reclaim`), unless its token
//! allows a reclaim: then it reclaims that node in place. Deleting a node
//! frees both (only live nodes are searched). Only nodes of the join's role
//! are searched: a machine's PXE ramdisk (role ramdisk) and the system
//! installed on it (role node) are two stages of one machine, not two
//! claims to it; and a ramdisk node is retired when a later commissioning
//! of its machine joins ([`crate::model::boot::retire_superseded`]), so it blocks
//! nothing.

use bc_wire::agent::HardwareClaims;

use crate::model::attestor::{AttestationResult, Refusal};
use crate::model::join_reasons::JoinReason;
use crate::model::machine::{ExpectMismatch, BINDING_TPM_EK};
use crate::store::{params, DbError, Tx};

/// The hardware identity an admitted join proved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HardwareKey {
    /// `tpm-ek:<sha256 hex>` or `product-uuid:<uuid>`.
    pub key: String,
    /// The proven product UUID (normalized), if any.
    pub product_uuid: Option<String>,
}

/// What `result` proved: its TPM EK (bound, or a ramdisk's proven one), else the product UUID its
/// attestor proved or its token's expect binding pinned (JoinService has
/// checked the claims against it by then). `None`: nothing proven.
pub(crate) fn of_result(result: &AttestationResult) -> Option<HardwareKey> {
    let product_uuid = result
        .proven_product_uuid
        .clone()
        .or_else(|| result.expect.product_uuid.clone())
        .filter(|u| !is_placeholder(u));
    let ek = result.ek.as_ref().map(|e| &e.sha256);
    let key = match ek {
        Some(ek) => format!("{BINDING_TPM_EK}:{ek}"),
        None => format!("product-uuid:{}", product_uuid.as_deref()?),
    };
    Some(HardwareKey { key, product_uuid })
}

/// Product UUIDs that name no machine: firmware defaults that many boards
/// ship unchanged (AMI's "To Be Filled By O.E.M." UUID in both byte orders,
/// a well-known test pattern), and any UUID of one repeated hex digit (all
/// zeros, all F: "no UUID set"). Compared normalized (lowercase).
const PLACEHOLDER_UUIDS: &[&str] = &[
    "03000200-0400-0500-0006-000700080009",
    "00020003-0004-0005-0006-000700080009",
    "12345678-1234-5678-90ab-cddeefaabbcc",
];

/// Whether `uuid` (normalized, lowercase 8-4-4-4-12) is a placeholder that
/// identifies no machine.
pub(crate) fn is_placeholder(uuid: &str) -> bool {
    let mut digits = uuid.bytes().filter(|b| *b != b'-');
    let repeated = match digits.next() {
        Some(first) => digits.all(|b| b == first),
        None => true,
    };
    repeated || PLACEHOLDER_UUIDS.contains(&uuid)
}

/// The live (not deleted, not retired) node of `role` other than `except`
/// that holds `hk`'s key or proven product UUID.
pub(crate) fn holder(
    tx: &Tx<'_>,
    hk: &HardwareKey,
    role: &str,
    except: Option<&str>,
) -> Result<Option<String>, DbError> {
    tx.query_opt_map(
        "SELECT id FROM nodes
             WHERE deleted_at IS NULL AND retired_at IS NULL
               AND id IS DISTINCT FROM CAST(?3 AS TEXT) AND role = ?4
               AND (hardware_key = ?1 OR (CAST(?2 AS TEXT) IS NOT NULL AND product_uuid = ?2))
             ORDER BY joined_at, id LIMIT 1",
        params![hk.key, hk.product_uuid, except, role],
        |r| r.get(0),
    )
}

/// The live node, of any role, whose hardware key is `key` (the newest if
/// several: a ramdisk and the system installed from it share one).
pub(crate) fn live_node_with_key(tx: &Tx<'_>, key: &str) -> Result<Option<String>, DbError> {
    tx.query_opt_map(
        "SELECT id FROM nodes
             WHERE deleted_at IS NULL AND retired_at IS NULL AND hardware_key = ?1
             ORDER BY joined_at DESC, id LIMIT 1",
        params![key],
        |r| r.get(0),
    )
}

/// The product UUID recorded as `node_id`'s trusted hardware key (proven or
/// operator-bound), if any.
pub(crate) fn proven_product_uuid(tx: &Tx<'_>, node_id: &str) -> Result<Option<String>, DbError> {
    Ok(tx
        .query_opt_map(
            "SELECT product_uuid FROM nodes WHERE id = ?1",
            params![node_id],
            |r| r.get::<Option<String>>(0),
        )?
        .flatten())
}

/// Records `hk` as `node_id`'s hardware key (a reclaim replaces the old
/// one), except that a product UUID never replaces an EK: a machine whose
/// ramdisk proved its TPM and whose installed system then re-keys the node
/// with a provisioned token (issue 30) is still that TPM's, so a later
/// `bcd join --attestor tpm` reclaims it through the EK. The UUID is
/// recorded beside it.
pub(crate) fn record(tx: &Tx<'_>, node_id: &str, hk: &HardwareKey) -> Result<(), DbError> {
    tx.execute(
        "UPDATE nodes SET product_uuid = ?3, hardware_key = CASE
                 WHEN ?2 LIKE 'product-uuid:%' AND hardware_key LIKE 'tpm-ek:%' THEN hardware_key
                 ELSE ?2 END
             WHERE id = ?1",
        params![node_id, hk.key, hk.product_uuid],
    )?;
    Ok(())
}

/// The product UUID a node claimed at its newest join that claimed one
/// (what a provisioned token minted for that node expects).
pub(crate) fn newest_claimed_product_uuid(
    tx: &Tx<'_>,
    node_id: &str,
) -> Result<Option<String>, DbError> {
    tx.query_opt_map(
        "SELECT product_uuid FROM joins
             WHERE node_id = ?1 AND product_uuid IS NOT NULL
             ORDER BY id DESC LIMIT 1",
        params![node_id],
        |r| r.get(0),
    )
}

/// Every node's recorded hardware key, for listings.
pub fn keys(
    db: &crate::store::Store,
) -> Result<std::collections::HashMap<String, String>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            "SELECT id, hardware_key FROM nodes WHERE hardware_key IS NOT NULL",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        rows.collect::<Result<_, _>>()
    })
}

/// Enforces the expect binding of the token an attestor admitted with. Done
/// by JoinService rather than by each attestor so that every token-based attestor
/// (join-token now; provisioned, discovery later) binds the same way. It
/// runs inside the join transaction before anything is written, so a
/// refusal rolls back the use the attestor consumed.
pub(crate) fn check_expect(
    result: &AttestationResult,
    claims: &HardwareClaims,
) -> Result<(), Refusal> {
    result.expect.check(claims).map_err(|mismatch| {
        let reason = match mismatch {
            ExpectMismatch::ProductUuid => JoinReason::ExpectProductUuid,
            ExpectMismatch::Mac => JoinReason::ExpectMac,
        };
        Refusal::new(reason)
            .with_token(result.token_id.as_deref())
            .with_node(result.reclaim_node_id.as_deref())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attestor::ProvenEk;
    use crate::model::machine::Expect;

    #[test]
    fn placeholder_uuids_are_never_hardware_keys() {
        for p in [
            "00000000-0000-0000-0000-000000000000",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
            "03000200-0400-0500-0006-000700080009",
            "11111111-1111-1111-1111-111111111111",
        ] {
            assert!(is_placeholder(p), "{p}");
            let bound = AttestationResult {
                expect: Expect {
                    product_uuid: Some(p.to_owned()),
                    mac: None,
                },
                ..AttestationResult::default()
            };
            assert_eq!(of_result(&bound), None, "{p}");
        }
        assert!(!is_placeholder("4c4c4544-0042-3510-8052-b4c04f4e4d32"));
        // An EK stays a key; the placeholder beside it is not recorded.
        let tpm = AttestationResult {
            ek: Some(ProvenEk {
                sha256: "ab".repeat(32),
                assurance: None,
                bound: true,
            }),
            proven_product_uuid: Some("03000200-0400-0500-0006-000700080009".to_owned()),
            ..AttestationResult::default()
        };
        let hk = of_result(&tpm).unwrap();
        assert_eq!(hk.key, format!("tpm-ek:{}", "ab".repeat(32)));
        assert_eq!(hk.product_uuid, None);
    }

    /// A provisioned re-key (a product UUID) of a node whose ramdisk proved
    /// its EK keeps the EK as its key, so its TPM still reclaims it; an EK
    /// replaces a UUID, and another EK replaces an EK (a changed TPM).
    #[test]
    fn a_product_uuid_never_replaces_an_ek() {
        let t = crate::test_support::temp_db();
        crate::test_support::insert_node(&t.db, "node_a", bc_wire::AttestorId::Tpm, 1);
        let ek = |hex: &str| HardwareKey {
            key: format!("tpm-ek:{}", hex.repeat(32)),
            product_uuid: None,
        };
        let uuid = "4c4c4544-0042-3510-8052-b4c04f4e4d32";
        let by_uuid = HardwareKey {
            key: format!("product-uuid:{uuid}"),
            product_uuid: Some(uuid.to_owned()),
        };
        let key_of = |db: &crate::store::Store| {
            db.read(|tx| {
                tx.query_opt_map(
                    "SELECT hardware_key, product_uuid FROM nodes WHERE id = 'node_a'",
                    params![],
                    |r| Ok((r.get::<Option<String>>(0)?, r.get::<Option<String>>(1)?)),
                )
            })
            .unwrap()
            .unwrap()
        };
        let set = |hk: &HardwareKey| t.db.write(|tx| record(tx, "node_a", hk)).unwrap();
        set(&by_uuid);
        assert_eq!(key_of(&t.db).0.as_deref(), Some(by_uuid.key.as_str()));
        set(&ek("ab"));
        assert_eq!(key_of(&t.db).0, Some(ek("ab").key));
        set(&by_uuid);
        assert_eq!(key_of(&t.db), (Some(ek("ab").key), Some(uuid.to_owned())));
        set(&ek("cd"));
        assert_eq!(key_of(&t.db).0, Some(ek("cd").key));
    }
}
