//! The command channel's tables (migration 20): `commands`, one row per
//! queued command with its signed bytes and, once a verified result came
//! back, that result; and `inventories`, each node's inventory.refresh
//! results with the flags that compare them with its join. No policy here:
//! [`crate::plane::commands`] decides what is queued and stored.

use crate::store::{params, DbError, Row, Store, Tx, UnixMs, Value};

/// A command's state: `queued` until a verified result (its status) or
/// its not_after passes (`expired`).
pub const STATES: &[&str] = &["queued", "ok", "failed", "refused", "expired"];

/// The event an inventory that differs from the node's join records.
pub(crate) const EVENT_INVENTORY_MISMATCH: &str = "node.inventory.mismatch";

/// One command as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandRow {
    pub id: String,
    pub node_id: String,
    pub kind: String,
    pub args: Vec<(String, String)>,
    /// The serialized `SignedCommand`, delivered as is every time.
    pub signed: Vec<u8>,
    pub state: String,
    pub queued_at: UnixMs,
    pub not_after: UnixMs,
    pub finished_at: Option<UnixMs>,
    /// The serialized `SignedCommandResult`, as verified.
    pub result: Option<Vec<u8>>,
    pub result_status: Option<String>,
    pub outcome: Option<String>,
    /// Hex SHA-256 of the whole output, as the result states it.
    pub output_sha256: Option<String>,
    /// Whether the result's signature checked (only checked results are
    /// stored, so `Some(true)` whenever there is a result).
    pub result_checked: Option<bool>,
    /// The serial of the certificate the result's channel was proven with.
    pub result_serial: Option<String>,
}

const SELECT: &str = "SELECT id, node_id, kind, args, signed, state, queued_at, not_after, \
     finished_at, result, result_status, outcome, output_sha256, result_checked, result_serial \
     FROM commands";

fn read(r: &Row) -> Result<CommandRow, DbError> {
    let args: String = r.get(3)?;
    let args: Vec<(String, String)> =
        serde_json::from_str(&args).map_err(|e| DbError::Corrupt {
            what: "command arguments",
            detail: e.to_string(),
        })?;
    Ok(CommandRow {
        id: r.get(0)?,
        node_id: r.get(1)?,
        kind: r.get(2)?,
        args,
        signed: r.get(4)?,
        state: r.get(5)?,
        queued_at: r.get(6)?,
        not_after: r.get(7)?,
        finished_at: r.get(8)?,
        result: r.get(9)?,
        result_status: r.get(10)?,
        outcome: r.get(11)?,
        output_sha256: r.get(12)?,
        result_checked: r.get::<Option<i64>>(13)?.map(|v| v == 1),
        result_serial: r.get(14)?,
    })
}

/// Stores a newly queued command.
pub(crate) fn insert(tx: &Tx<'_>, c: &CommandRow) -> Result<(), DbError> {
    let args = serde_json::to_string(&c.args).unwrap_or_else(|_| "[]".to_owned());
    tx.execute(
        "INSERT INTO commands (id, node_id, kind, args, signed, state, queued_at, not_after)
         VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6, ?7)",
        params![
            c.id,
            c.node_id,
            c.kind,
            args,
            c.signed,
            c.queued_at,
            c.not_after
        ],
    )?;
    Ok(())
}

pub(crate) fn get(tx: &Tx<'_>, id: &str) -> Result<Option<CommandRow>, DbError> {
    tx.query_opt_map(&format!("{SELECT} WHERE id = ?1"), params![id], read)
}

/// Commands, newest first, optionally of one node and in one state.
pub(crate) fn list(
    db: &Store,
    node_id: Option<&str>,
    state: Option<&str>,
) -> Result<Vec<CommandRow>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            &format!(
                "{SELECT} WHERE (CAST(?1 AS TEXT) IS NULL OR node_id = ?1)
                   AND (CAST(?2 AS TEXT) IS NULL OR state = ?2)
                 ORDER BY queued_at DESC, id"
            ),
            params![node_id, state],
            read,
        )?;
        rows.collect::<Result<Vec<_>, _>>()
    })
}

/// The signed bytes of `node_id`'s queued commands not past `now`, oldest
/// first: what its channel delivers.
pub(crate) fn deliverable(
    tx: &Tx<'_>,
    node_id: &str,
    now: UnixMs,
) -> Result<Vec<(String, String, Vec<u8>)>, DbError> {
    let rows = tx.query_map(
        "SELECT id, kind, signed FROM commands
             WHERE node_id = ?1 AND state = 'queued' AND not_after >= ?2
             ORDER BY queued_at, id",
        params![node_id, now],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    rows.collect()
}

/// Of `node_ids`, each node's one certificate a channel may be open with
/// at `now` (as [`channel_cert_good`] decides for one): `(node_id, serial)`.
/// A channel whose pair is missing is closed. One query for many channels,
/// so that idle channels cost the database nothing each.
pub(crate) fn channel_certs_good(
    tx: &Tx<'_>,
    node_ids: &[String],
    now: UnixMs,
) -> Result<Vec<(String, String)>, DbError> {
    if node_ids.is_empty() {
        return Ok(Vec::new());
    }
    let marks: Vec<String> = (0..node_ids.len()).map(|i| format!("?{}", i + 2)).collect();
    let sql = format!(
        "SELECT c.node_id, c.serial FROM node_certs c JOIN nodes n ON n.id = c.node_id
             WHERE c.node_id IN ({})
               AND c.identity_generation = n.identity_generation
               AND c.revoked_at IS NULL AND c.not_before <= ?1 AND ?1 < c.not_after
               AND n.retired_at IS NULL AND n.deleted_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM node_certs d
                                WHERE d.node_id = c.node_id AND d.rowid > c.rowid)",
        marks.join(", ")
    );
    let mut params: Vec<Value> = Vec::with_capacity(node_ids.len() + 1);
    params.push(Value::from(now));
    params.extend(node_ids.iter().map(|n| Value::from(n.as_str())));
    let rows = tx.query_map(&sql, &params, |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

/// The nodes with a deliverable command (what wakes their channels).
pub(crate) fn nodes_with_queued(tx: &Tx<'_>, now: UnixMs) -> Result<Vec<String>, DbError> {
    let rows = tx.query_map(
        "SELECT DISTINCT node_id FROM commands WHERE state = 'queued' AND not_after >= ?1",
        params![now],
        |r| r.get(0),
    )?;
    rows.collect()
}

/// A verified result, as [`store_result`] writes it.
pub(crate) struct StoredResult<'a> {
    pub id: &'a str,
    pub node_id: &'a str,
    pub status: &'a str,
    pub outcome: &'a str,
    pub output_sha256: &'a str,
    pub signed: &'a [u8],
    pub serial: &'a str,
    pub at: UnixMs,
}

/// Stores a verified result for a command of `node_id` that has none yet;
/// `false` when there is no such command (unknown, another node's, or
/// already answered: a result sent again is acked, not stored twice).
pub(crate) fn store_result(tx: &Tx<'_>, r: &StoredResult<'_>) -> Result<bool, DbError> {
    let n = tx.execute(
        "UPDATE commands SET state = ?3, finished_at = ?4, result = ?5, result_status = ?3,
                outcome = ?6, output_sha256 = ?7, result_checked = 1, result_serial = ?8
             WHERE id = ?1 AND node_id = ?2 AND result IS NULL",
        params![
            r.id,
            r.node_id,
            r.status,
            r.at,
            r.signed,
            r.outcome,
            r.output_sha256,
            r.serial
        ],
    )?;
    Ok(n == 1)
}

/// Recalls a queued command: `expired` at once with `why` as its outcome,
/// so no channel delivers it from now on. `false` when it is not queued
/// (answered, expired, or unknown). A channel that already sent it is not
/// reached: should the node answer, its result is stored as the truth.
pub(crate) fn recall(tx: &Tx<'_>, id: &str, now: UnixMs, why: &str) -> Result<bool, DbError> {
    let n = tx.execute(
        "UPDATE commands SET state = 'expired', finished_at = ?2, not_after = ?2, outcome = ?3
             WHERE id = ?1 AND state = 'queued' AND result IS NULL",
        params![id, now, why],
    )?;
    Ok(n == 1)
}

/// Marks every queued command past its not_after `expired` (database
/// time); returns how many.
pub(crate) fn expire(tx: &Tx<'_>, now: UnixMs) -> Result<usize, DbError> {
    tx.execute(
        "UPDATE commands SET state = 'expired', finished_at = ?1
             WHERE state = 'queued' AND not_after < ?1",
        params![now],
    )
}

/// One stored inventory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InventoryRow {
    pub id: i64,
    pub node_id: String,
    pub command_id: String,
    pub at: UnixMs,
    /// The JSON inventory.refresh produced.
    pub inventory: String,
    /// What differs from the node's join (`product-uuid`, `macs`, `ek`).
    pub flags: Vec<String>,
}

pub(crate) fn insert_inventory(
    tx: &Tx<'_>,
    node_id: &str,
    command_id: &str,
    at: UnixMs,
    inventory: &str,
    flags: &[String],
) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO inventories (node_id, command_id, at, inventory, flags)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            node_id,
            command_id,
            at,
            inventory,
            serde_json::to_string(flags).unwrap_or_else(|_| "[]".to_owned())
        ],
    )?;
    Ok(())
}

/// A node's inventories, newest first.
pub(crate) fn inventories(db: &Store, node_id: &str) -> Result<Vec<InventoryRow>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            "SELECT id, node_id, command_id, at, inventory, flags FROM inventories
                 WHERE node_id = ?1 ORDER BY id DESC",
            params![node_id],
            |r| {
                let flags: String = r.get(5)?;
                Ok(InventoryRow {
                    id: r.get(0)?,
                    node_id: r.get(1)?,
                    command_id: r.get(2)?,
                    at: r.get(3)?,
                    inventory: r.get(4)?,
                    flags: serde_json::from_str(&flags).unwrap_or_default(),
                })
            },
        )?;
        rows.collect::<Result<Vec<_>, _>>()
    })
}

/// The product UUID of `node_id`'s newest inventory (normalized), if it
/// has an inventory that reports one: what a provisioned token targeted at
/// the node binds to (spec: provisionedTargetResolver).
pub(crate) fn newest_inventory_uuid(tx: &Tx<'_>, node_id: &str) -> Result<Option<String>, DbError> {
    Ok(newest_inventory(tx, node_id)?
        .and_then(|j| {
            j.pointer("/dmi/productUuid")
                .and_then(|v| v.as_str())
                .and_then(|u| crate::model::machine::ProductUuid::parse(u).ok())
        })
        .map(crate::model::machine::ProductUuid::into_string))
}

/// `node_id`'s newest inventory, parsed.
pub(crate) fn newest_inventory(
    tx: &Tx<'_>,
    node_id: &str,
) -> Result<Option<serde_json::Value>, DbError> {
    let text: Option<String> = tx.query_opt_map(
        "SELECT inventory FROM inventories WHERE node_id = ?1 ORDER BY id DESC LIMIT 1",
        params![node_id],
        |r| r.get(0),
    )?;
    Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
}

/// Whether `node_id` has any inventory.
pub(crate) fn has_inventory(tx: &Tx<'_>, node_id: &str) -> Result<bool, DbError> {
    Ok(tx
        .query_opt_map(
            "SELECT 1 FROM inventories WHERE node_id = ?1 LIMIT 1",
            params![node_id],
            |r| r.get::<i64>(0),
        )?
        .is_some())
}

/// Whether `node_id`'s command `command_id` left an inventory (an ok
/// result whose output was cut or not JSON did not).
pub(crate) fn is_inventory(tx: &Tx<'_>, node_id: &str, command_id: &str) -> Result<bool, DbError> {
    Ok(tx
        .query_opt_map(
            "SELECT 1 FROM inventories WHERE node_id = ?1 AND command_id = ?2 LIMIT 1",
            params![node_id, command_id],
            |r| r.get::<i64>(0),
        )?
        .is_some())
}

/// What `node_id` showed at join, for comparing an inventory with: its
/// proven hardware key (a TPM's `tpm-ek:<hex>`), its proven product UUID,
/// else the one its newest join claimed, and the MACs its newest join
/// claimed.
pub(crate) struct JoinFacts {
    pub ek_sha256: Option<String>,
    pub product_uuid: Option<String>,
    pub macs: Option<Vec<String>>,
}

pub(crate) fn join_facts(tx: &Tx<'_>, node_id: &str) -> Result<JoinFacts, DbError> {
    let node: Option<(Option<String>, Option<String>)> = tx.query_opt_map(
        "SELECT hardware_key, product_uuid FROM nodes WHERE id = ?1",
        params![node_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let (key, proven_uuid) = node.unwrap_or_default();
    let join: Option<(Option<String>, Option<String>)> = tx.query_opt_map(
        "SELECT product_uuid, macs FROM joins WHERE node_id = ?1 ORDER BY id DESC LIMIT 1",
        params![node_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let (claimed_uuid, macs) = join.unwrap_or_default();
    Ok(JoinFacts {
        ek_sha256: key.and_then(|k| {
            k.strip_prefix(crate::model::machine::BINDING_TPM_EK)
                .and_then(|k| k.strip_prefix(':'))
                .map(str::to_owned)
        }),
        product_uuid: proven_uuid.or(claimed_uuid),
        macs: macs.and_then(|m| serde_json::from_str(&m).ok()),
    })
}

/// The live certificate of a node: the newest of its current identity
/// generation, not revoked, valid at `now`. `(serial, der)`.
pub(crate) fn live_cert(
    tx: &Tx<'_>,
    node_id: &str,
    now: UnixMs,
) -> Result<Option<(String, Vec<u8>)>, DbError> {
    tx.query_opt_map(
        "SELECT c.serial, c.der FROM node_certs c JOIN nodes n ON n.id = c.node_id
             WHERE c.node_id = ?1 AND c.identity_generation = n.identity_generation
               AND c.revoked_at IS NULL AND c.not_before <= ?2 AND ?2 < c.not_after
             ORDER BY c.not_before DESC, c.rowid DESC LIMIT 1",
        params![node_id, now],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// Whether the channel's certificate `serial` of `node_id` is still good
/// at `now`: the node's current generation, not revoked, not expired, the
/// node neither retired nor deleted, and no newer certificate (a renewal:
/// the agent reconnects with it).
pub(crate) fn channel_cert_good(
    tx: &Tx<'_>,
    node_id: &str,
    serial: &str,
    now: UnixMs,
) -> Result<bool, DbError> {
    let row: Option<i64> = tx.query_opt_map(
        "SELECT 1 FROM node_certs c JOIN nodes n ON n.id = c.node_id
             WHERE c.serial = ?2 AND c.node_id = ?1
               AND c.identity_generation = n.identity_generation
               AND c.revoked_at IS NULL AND c.not_before <= ?3 AND ?3 < c.not_after
               AND n.retired_at IS NULL AND n.deleted_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM node_certs d
                                WHERE d.node_id = c.node_id AND d.rowid > c.rowid)",
        params![node_id, serial, now],
        |r| r.get(0),
    )?;
    Ok(row.is_some())
}
