//! The workflows' tables (migration 22): `workflows`, one row per
//! commission or deploy (its id the boot entry's), and `workflow_steps`,
//! its steps in the order they run. No policy here:
//! [`crate::plane::workflows`] decides what a step does.

use crate::store::{params, DbError, Row, Tx, UnixMs};

/// A workflow's states: `running` until its last step is done
/// (`succeeded`), one fails (`failed`) or an operator cancels it.
pub const STATES: &[&str] = &["running", "succeeded", "failed", "cancelled"];

/// One workflow as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkflowRow {
    pub id: String,
    /// `commission` or `deploy`.
    pub kind: String,
    pub site_id: String,
    /// The machine's node: a deploy's from the start, a commission's once
    /// its ramdisk joined.
    pub node_id: Option<String>,
    pub mac: String,
    pub product_uuid: Option<String>,
    pub ek_sha256: Option<String>,
    pub image: Option<String>,
    pub disk: Option<String>,
    pub wipe: bool,
    /// The operator's user data (`--user-data F`), merged as a second part.
    pub user_data: Option<String>,
    /// The install script the deploy's user data runs (it holds no secret).
    pub install_script: Option<String>,
    pub state: String,
    /// The index of the current step.
    pub step: i64,
    pub failure: Option<String>,
    /// The provisioned token userdata.render minted (its id only).
    pub token_id: Option<String>,
    pub created_at: UnixMs,
    pub updated_at: UnixMs,
    pub finished_at: Option<UnixMs>,
    pub version: i64,
}

/// One step as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRow {
    pub seq: i64,
    pub name: String,
    /// `pending`, `running`, `done`, `failed` or `skipped`.
    pub state: String,
    pub started_at: Option<UnixMs>,
    pub finished_at: Option<UnixMs>,
    pub command_id: Option<String>,
    pub detail: Option<String>,
}

const SELECT: &str = "SELECT id, kind, site_id, node_id, mac, product_uuid, ek_sha256, image, \
     disk, wipe, user_data, install_script, state, step, failure, token_id, created_at, \
     updated_at, finished_at, version FROM workflows";

fn read(r: &Row) -> Result<WorkflowRow, DbError> {
    Ok(WorkflowRow {
        id: r.get(0)?,
        kind: r.get(1)?,
        site_id: r.get(2)?,
        node_id: r.get(3)?,
        mac: r.get(4)?,
        product_uuid: r.get(5)?,
        ek_sha256: r.get(6)?,
        image: r.get(7)?,
        disk: r.get(8)?,
        wipe: r.get::<i64>(9)? == 1,
        user_data: r.get(10)?,
        install_script: r.get(11)?,
        state: r.get(12)?,
        step: r.get(13)?,
        failure: r.get(14)?,
        token_id: r.get(15)?,
        created_at: r.get(16)?,
        updated_at: r.get(17)?,
        finished_at: r.get(18)?,
        version: r.get(19)?,
    })
}

/// Stores a new workflow and its steps (all `pending`).
pub(crate) fn insert(tx: &Tx<'_>, w: &WorkflowRow, steps: &[&str]) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO workflows (id, kind, site_id, node_id, mac, product_uuid, ek_sha256, image,
                                disk, wipe, user_data, install_script, state, step, created_at,
                                updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, 'running', 0, ?13, ?13)",
        params![
            w.id,
            w.kind,
            w.site_id,
            w.node_id,
            w.mac,
            w.product_uuid,
            w.ek_sha256,
            w.image,
            w.disk,
            i64::from(w.wipe),
            w.user_data,
            w.install_script,
            w.created_at
        ],
    )?;
    for (seq, name) in steps.iter().enumerate() {
        tx.execute(
            "INSERT INTO workflow_steps (workflow_id, seq, name, state) VALUES (?1, ?2, ?3, 'pending')",
            params![w.id, seq as i64, *name],
        )?;
    }
    Ok(())
}

pub(crate) fn get(tx: &Tx<'_>, id: &str) -> Result<Option<WorkflowRow>, DbError> {
    tx.query_opt_map(&format!("{SELECT} WHERE id = ?1"), params![id], read)
}

/// The workflow, if it is running and no other transaction holds it (PG:
/// `FOR UPDATE SKIP LOCKED`, so two replicas never advance it at once).
pub(crate) fn lock_running(tx: &Tx<'_>, id: &str) -> Result<Option<WorkflowRow>, DbError> {
    tx.query_opt_map(
        &format!(
            "{SELECT} WHERE id = ?1 AND state = 'running'{}",
            tx.dialect().skip_locked()
        ),
        params![id],
        read,
    )
}

/// The workflow, locked until commit (PG: `FOR UPDATE`).
pub(crate) fn lock(tx: &Tx<'_>, id: &str) -> Result<Option<WorkflowRow>, DbError> {
    tx.query_opt_map(
        &format!("{SELECT} WHERE id = ?1{}", tx.dialect().for_update()),
        params![id],
        read,
    )
}

/// Workflows, newest first.
pub(crate) fn list(tx: &Tx<'_>) -> Result<Vec<WorkflowRow>, DbError> {
    tx.query_map(
        &format!("{SELECT} ORDER BY created_at DESC, id"),
        params![],
        read,
    )?
    .collect()
}

/// The ids of the running workflows, oldest first.
pub(crate) fn running_ids(tx: &Tx<'_>) -> Result<Vec<String>, DbError> {
    tx.query_map(
        "SELECT id FROM workflows WHERE state = 'running' ORDER BY created_at, id",
        params![],
        |r| r.get(0),
    )?
    .collect()
}

/// A running workflow of `node_id`, if there is one.
pub(crate) fn running_of_node(tx: &Tx<'_>, node_id: &str) -> Result<Option<String>, DbError> {
    tx.query_opt_map(
        "SELECT id FROM workflows WHERE node_id = ?1 AND state = 'running' LIMIT 1",
        params![node_id],
        |r| r.get(0),
    )
}

/// The newest workflow of `node_id` (what a deploy's defaults come from).
pub(crate) fn newest_of_node(tx: &Tx<'_>, node_id: &str) -> Result<Option<WorkflowRow>, DbError> {
    tx.query_opt_map(
        &format!("{SELECT} WHERE node_id = ?1 ORDER BY created_at DESC, id DESC LIMIT 1"),
        params![node_id],
        read,
    )
}

/// A workflow's steps, in order.
pub(crate) fn steps(tx: &Tx<'_>, id: &str) -> Result<Vec<StepRow>, DbError> {
    tx.query_map(
        "SELECT seq, name, state, started_at, finished_at, command_id, detail
             FROM workflow_steps WHERE workflow_id = ?1 ORDER BY seq",
        params![id],
        |r| {
            Ok(StepRow {
                seq: r.get(0)?,
                name: r.get(1)?,
                state: r.get(2)?,
                started_at: r.get(3)?,
                finished_at: r.get(4)?,
                command_id: r.get(5)?,
                detail: r.get(6)?,
            })
        },
    )?
    .collect()
}

/// Writes a step's state (and, when given, its command and detail).
pub(crate) fn set_step(
    tx: &Tx<'_>,
    id: &str,
    seq: i64,
    state: &str,
    now: UnixMs,
    command_id: Option<&str>,
    detail: Option<&str>,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE workflow_steps SET state = ?3,
                started_at = COALESCE(started_at, ?4),
                finished_at = CASE WHEN ?3 IN ('done', 'failed', 'skipped') THEN ?4 ELSE NULL END,
                command_id = COALESCE(CAST(?5 AS TEXT), command_id),
                detail = COALESCE(CAST(?6 AS TEXT), detail)
             WHERE workflow_id = ?1 AND seq = ?2",
        params![id, seq, state, now, command_id, detail],
    )?;
    Ok(())
}

/// Writes the workflow's row as `w` holds it, if its version is still the
/// one read (bumping it); `false` when another writer got there first.
pub(crate) fn update(tx: &Tx<'_>, w: &WorkflowRow, now: UnixMs) -> Result<bool, DbError> {
    let n = tx.execute(
        "UPDATE workflows SET node_id = ?3, state = ?4, step = ?5, failure = ?6, token_id = ?7,
                updated_at = ?8, finished_at = ?9, product_uuid = ?10, disk = ?11,
                version = version + 1
             WHERE id = ?1 AND version = ?2",
        params![
            w.id,
            w.version,
            w.node_id,
            w.state,
            w.step,
            w.failure,
            w.token_id,
            now,
            w.finished_at,
            w.product_uuid,
            w.disk
        ],
    )?;
    Ok(n == 1)
}

/// The workflow whose userdata.render minted `token_id`, if any.
pub(crate) fn of_token(tx: &Tx<'_>, token_id: &str) -> Result<Option<String>, DbError> {
    tx.query_opt_map(
        "SELECT id FROM workflows WHERE token_id = ?1",
        params![token_id],
        |r| r.get(0),
    )
}
