//! `WorkflowService`: commission and deploy, as explicit state machines
//! stored in the database (docs/workflows.md).
//!
//! A workflow's id is its boot entry's (`wf_…`), so the discovery join the
//! entry admits names it (the discovery attestor's resolveWorkflowNode).
//! [`WorkflowService::start_commission`] and
//! [`WorkflowService::start_deploy`] write the entry and the workflow in one
//! transaction; [`WorkflowService::tick`], run by the control plane's one
//! poller per process (the command channel's), advances each running
//! workflow one step per transaction, holding its row (PostgreSQL: `FOR
//! UPDATE SKIP LOCKED`, so two replicas never advance one workflow at once;
//! a `version` bumped by every write besides). Every step has a deadline
//! (the join: the entry's end; a command: its not_after; the provisioned
//! join: the token's expiry), past which the workflow fails naming it.
//! Commands go through [`CommandService::queue_in`], so every check of the
//! command channel applies. A failed or cancelled workflow closes its
//! entry, revokes the token it minted and removes its seed.

use bc_wire::agent::Role;

use crate::model::boot::{self, NewEntry};
use crate::model::machine::{Mac, ProductUuid, BINDING_TPM_EK};
use crate::model::pools::PoolError;
use crate::model::tokens::{self, TokenScope};
use crate::model::workflows::{self as table, StepRow, WorkflowRow};
use crate::model::{commands as cmds, images, records, seeds};
use crate::plane::commands::{CommandService, QueueError};
use crate::plane::ControlPlane;
use crate::store::{params, DbError, Tx, UnixMs};

/// A commission's steps.
pub(crate) const COMMISSION_STEPS: &[&str] = &[
    "boot.entry",
    "ramdisk.join",
    "inventory.refresh",
    "disk.wipe",
];
/// A deploy's steps.
pub(crate) const DEPLOY_STEPS: &[&str] = &[
    "boot.entry",
    "ramdisk.join",
    "inventory.refresh",
    "disk.wipe",
    "userdata.render",
    "deploy.image",
    "boot.close",
    "boot.kexec",
    "provisioned.join",
];

/// How long the provisioned token userdata.render mints lasts: the image's
/// download, the reboot and cloud-init's first boot.
pub(crate) const PROVISIONED_TOKEN_TTL_MS: i64 = 6 * 3_600_000;

/// Why a workflow is not started or cancelled.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    /// The request is wrong or not allowed now: the message says what to do.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<PoolError> for WorkflowError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Db(e) => WorkflowError::Db(e),
            PoolError::InvalidInput(m) => WorkflowError::Refused(m),
            PoolError::NotFound(p) => WorkflowError::Refused(format!("no pool {p:?}")),
            e @ PoolError::UnknownTenant(_) => WorkflowError::Refused(e.to_string()),
        }
    }
}

/// `workflows start commission`.
pub struct Commission<'a> {
    pub site: &'a str,
    pub mac: &'a str,
    pub product_uuid: Option<&'a str>,
    pub ek_sha256: Option<&'a str>,
    /// A known machine: its ramdisk joins as this node (its EK expected).
    pub node: Option<&'a str>,
    /// Wipe `disk` (or, without one, every disk of the inventory).
    pub wipe: bool,
    pub disk: Option<&'a str>,
    /// How long the boot entry waits for the machine.
    pub ttl_ms: i64,
}

/// `workflows start deploy`.
pub struct Deploy<'a> {
    pub node: &'a str,
    pub image: &'a str,
    pub site: Option<&'a str>,
    pub mac: Option<&'a str>,
    pub disk: Option<&'a str>,
    /// The operator's user data, a second part beside the workflow's.
    pub user_data: Option<String>,
    /// The install script the user data runs (`install-script
    /// --attestor provisioned`'s text; it holds no secret).
    pub install_script: String,
    pub ttl_ms: i64,
}

/// A workflow and its steps, as `workflows show` prints them.
pub struct Shown {
    pub workflow: WorkflowRow,
    pub steps: Vec<StepRow>,
}

/// What one transaction of [`WorkflowService::tick`] did.
enum Progress {
    /// The step is done (or skipped): the next one may run now.
    Advanced,
    /// The step waits (for a join, a result).
    Waiting,
    /// The workflow is no longer running (or another holds it).
    Stopped,
}

/// A step's outcome inside the transaction.
enum Outcome {
    Done(Option<String>),
    Skipped(String),
    Wait,
    Fail(String),
}

/// The workflows' service (see the module documentation).
#[derive(Clone, Copy)]
pub struct WorkflowService<'a> {
    cp: &'a ControlPlane,
}

impl<'a> WorkflowService<'a> {
    pub fn new(cp: &'a ControlPlane) -> Self {
        WorkflowService { cp }
    }
}

impl WorkflowService<'_> {
    fn boot_key(&self) -> Result<&boot::BootKey, WorkflowError> {
        self.cp.boot_key().ok_or_else(|| {
            WorkflowError::Refused("this control plane has no boot-entry key".to_owned())
        })
    }

    /// Starts a commission: the boot entry (as `boot add` writes it), then
    /// the ramdisk's join, inventory.refresh and, with `wipe`, disk.wipe.
    pub fn start_commission(&self, c: &Commission<'_>) -> Result<WorkflowRow, WorkflowError> {
        let key = self.boot_key()?;
        let mac = Mac::parse(c.mac)
            .map_err(|e| WorkflowError::Refused(format!("--mac {:?}: {e}", c.mac)))?;
        let uuid = c
            .product_uuid
            .map(|u| {
                ProductUuid::parse(u)
                    .map(ProductUuid::into_string)
                    .map_err(|e| WorkflowError::Refused(format!("--product-uuid {u:?}: {e}")))
            })
            .transpose()?;
        if c.disk.is_some() && !c.wipe {
            return Err(WorkflowError::Refused(
                "--disk is the disk --wipe wipes: give --wipe too, or drop --disk".to_owned(),
            ));
        }
        let id = crate::ids::random_id("wf_").map_err(DbError::Random)?;
        let row = self.cp.database().write(|tx| {
            let known_ek = match c.node {
                Some(node) => known_node(tx, node)?,
                None => None,
            };
            let ek = c.ek_sha256.map(str::to_owned).or(known_ek);
            let entry = boot::add_in(
                tx,
                key,
                &NewEntry {
                    site: c.site,
                    mac: mac.as_str(),
                    product_uuid: uuid.as_deref(),
                    ek_sha256: ek.as_deref(),
                    node: None,
                    ttl_ms: c.ttl_ms,
                },
                &id,
            )?;
            let now = tx.now()?;
            let w = WorkflowRow {
                id: id.clone(),
                kind: "commission".to_owned(),
                site_id: entry.site_id.clone(),
                node_id: c.node.map(str::to_owned),
                mac: entry.mac.clone(),
                product_uuid: entry.product_uuid.clone(),
                ek_sha256: entry.ek_sha256.clone(),
                image: None,
                disk: c.disk.map(str::to_owned),
                wipe: c.wipe,
                user_data: None,
                install_script: None,
                state: "running".to_owned(),
                step: 0,
                failure: None,
                token_id: None,
                created_at: now,
                updated_at: now,
                finished_at: None,
                version: 1,
            };
            table::insert(tx, &w, COMMISSION_STEPS)?;
            started(tx, &w, &entry, now)?;
            Ok::<_, WorkflowError>(w)
        })?;
        tracing::info!(workflow = %row.id, site = %row.site_id, mac = %row.mac, "commission workflow started");
        Ok(row)
    }

    /// Starts a deploy of `d.node`: refused for an unknown or retired node,
    /// one with a running workflow, an unknown image; the site, MAC and
    /// disk default to those of its last workflow and newest inventory.
    pub fn start_deploy(&self, d: &Deploy<'_>) -> Result<WorkflowRow, WorkflowError> {
        let key = self.boot_key()?;
        if let Some(ud) = &d.user_data {
            crate::plane::userdata::part_type(ud).map_err(WorkflowError::Refused)?;
        }
        let given_mac = d
            .mac
            .map(|m| {
                Mac::parse(m)
                    .map(|m| m.as_str().to_owned())
                    .map_err(|e| WorkflowError::Refused(format!("--mac {m:?}: {e}")))
            })
            .transpose()?;
        let id = crate::ids::random_id("wf_").map_err(DbError::Random)?;
        let row = self.cp.database().write(|tx| {
            let refuse = |m: String| Err(WorkflowError::Refused(m));
            let node = d.node;
            let Some(n) = records::node_for_update(tx, node)? else {
                return refuse(format!(
                    "no node {node:?} (deleted or never joined): commission the machine first (workflows start commission)"
                ));
            };
            if n.retired_at.is_some() {
                return refuse(format!(
                    "node {node} is retired: a retired node is never deployed; commission the machine again (workflows start commission)"
                ));
            }
            if let Some(other) = table::running_of_node(tx, node)? {
                return refuse(format!(
                    "node {node} has a running workflow {other}: wait for it or cancel it (workflows cancel {other})"
                ));
            }
            if images::get(tx, d.image)?.is_none() {
                return refuse(format!(
                    "no image {:?}: register it first (images add {} FILE)",
                    d.image, d.image
                ));
            }
            let last = table::newest_of_node(tx, node)?;
            let inventory = cmds::newest_inventory(tx, node)?;
            let site = match (d.site, &last) {
                (Some(s), _) => s.to_owned(),
                (None, Some(w)) => w.site_id.clone(),
                (None, None) => match records::node_scope(tx, node)?.site_id {
                    Some(s) => s,
                    None => {
                        return refuse(format!(
                            "node {node} has no earlier workflow and no site: give --site S"
                        ))
                    }
                },
            };
            let mac = match (&given_mac, &last, inventory.as_ref().map(crate::plane::commands::inventory_macs)) {
                (Some(m), _, _) => m.clone(),
                (None, Some(w), _) => w.mac.clone(),
                (None, None, Some(macs)) if macs.len() == 1 => macs[0].clone(),
                _ => {
                    return refuse(format!(
                        "node {node}: no earlier workflow, and its newest inventory names no single MAC: give --mac M (the NIC it PXE-boots from)"
                    ))
                }
            };
            let disk = match (d.disk, last.as_ref().and_then(|w| w.disk.clone()), inventory.as_ref().map(inventory_disks)) {
                (Some(disk), _, _) => disk.to_owned(),
                (None, Some(disk), _) => disk,
                (None, None, Some(disks)) if disks.len() == 1 => disks[0].clone(),
                _ => {
                    return refuse(format!(
                        "node {node}: no earlier workflow named a disk, and its newest inventory has no single disk: give --disk DEV (e.g. /dev/sda)"
                    ))
                }
            };
            let ek = match records::binding_of_node(tx, node, BINDING_TPM_EK)? {
                Some(b) => Some(b.key),
                None => node_ek(tx, node)?,
            };
            let entry = boot::add_in(
                tx,
                key,
                &NewEntry {
                    site: &site,
                    mac: &mac,
                    product_uuid: None,
                    ek_sha256: ek.as_deref(),
                    node: None,
                    ttl_ms: d.ttl_ms,
                },
                &id,
            )?;
            let now = tx.now()?;
            let w = WorkflowRow {
                id: id.clone(),
                kind: "deploy".to_owned(),
                site_id: entry.site_id.clone(),
                node_id: Some(node.to_owned()),
                mac: entry.mac.clone(),
                product_uuid: None,
                ek_sha256: entry.ek_sha256.clone(),
                image: Some(d.image.to_owned()),
                disk: Some(disk),
                wipe: true,
                user_data: d.user_data.clone(),
                install_script: Some(d.install_script.clone()),
                state: "running".to_owned(),
                step: 0,
                failure: None,
                token_id: None,
                created_at: now,
                updated_at: now,
                finished_at: None,
                version: 1,
            };
            table::insert(tx, &w, DEPLOY_STEPS)?;
            started(tx, &w, &entry, now)?;
            Ok(w)
        })?;
        tracing::info!(workflow = %row.id, node = d.node, image = d.image, "deploy workflow started");
        Ok(row)
    }

    /// Workflows, newest first.
    pub fn list(&self) -> Result<Vec<WorkflowRow>, DbError> {
        self.cp.database().read(table::list)
    }

    /// One workflow and its steps.
    pub fn show(&self, id: &str) -> Result<Option<Shown>, DbError> {
        self.cp.database().read(|tx| {
            let Some(workflow) = table::get(tx, id)? else {
                return Ok(None);
            };
            let steps = table::steps(tx, id)?;
            Ok(Some(Shown { workflow, steps }))
        })
    }

    /// Cancels a running workflow: its entry closed, the token it minted
    /// revoked, its seed removed. (A command already queued stays until
    /// its node answers or it expires: the channel has no recall.)
    pub fn cancel(&self, id: &str) -> Result<WorkflowRow, WorkflowError> {
        self.cp.database().write(|tx| {
            let Some(mut w) = table::lock(tx, id)? else {
                return Err(WorkflowError::Refused(format!("no workflow {id:?}")));
            };
            if w.state != "running" {
                return Err(WorkflowError::Refused(format!(
                    "workflow {id} is {} already: only a running workflow is cancelled",
                    w.state
                )));
            }
            let now = tx.now()?;
            stop(tx, &mut w, "cancelled", "cancelled by an operator", now)?;
            Ok(w)
        })
    }

    /// Advances every running workflow as far as it can go now, one step
    /// per transaction. Returns how many steps moved.
    pub fn tick(&self) -> Result<usize, DbError> {
        let ids = self.cp.database().read(table::running_ids)?;
        let mut moved = 0;
        for id in ids {
            // A step at a time, while steps complete at once (a bound: a
            // workflow has fewer steps than this).
            for _ in 0..DEPLOY_STEPS.len() + 1 {
                match self.advance(&id) {
                    Ok(Progress::Advanced) => moved += 1,
                    Ok(Progress::Waiting | Progress::Stopped) => break,
                    Err(e) => {
                        tracing::warn!(workflow = %id, error = %e, "workflow step failed to run; retried at the next tick");
                        break;
                    }
                }
            }
        }
        Ok(moved)
    }

    /// One step of workflow `id`, in its own transaction.
    fn advance(&self, id: &str) -> Result<Progress, DbError> {
        let mut wake: Option<String> = None;
        let progress = self.cp.database().write(|tx| {
            wake = None;
            let Some(mut w) = table::lock_running(tx, id)? else {
                return Ok::<_, DbError>(Progress::Stopped);
            };
            let now = tx.now()?;
            let steps = table::steps(tx, id)?;
            let Some(step) = usize::try_from(w.step)
                .ok()
                .and_then(|i| steps.get(i))
                .cloned()
            else {
                w.state = "succeeded".to_owned();
                w.finished_at = Some(now);
                table::update(tx, &w, now)?;
                tracing::info!(workflow = %w.id, node = w.node_id.as_deref().unwrap_or(""), "workflow succeeded");
                return Ok(Progress::Stopped);
            };
            if step.state == "pending" {
                table::set_step(tx, id, step.seq, "running", now, None, None)?;
            }
            let outcome = self.run_step(tx, &mut w, &steps, &step, now, &mut wake)?;
            match outcome {
                Outcome::Wait => Ok(Progress::Waiting),
                Outcome::Done(detail) => {
                    table::set_step(tx, id, step.seq, "done", now, None, detail.as_deref())?;
                    w.step += 1;
                    table::update(tx, &w, now)?;
                    tracing::info!(workflow = %w.id, step = %step.name, "workflow step done");
                    Ok(Progress::Advanced)
                }
                Outcome::Skipped(why) => {
                    table::set_step(tx, id, step.seq, "skipped", now, None, Some(&why))?;
                    w.step += 1;
                    table::update(tx, &w, now)?;
                    Ok(Progress::Advanced)
                }
                Outcome::Fail(reason) => {
                    let reason = format!("{}: {reason}", step.name);
                    table::set_step(tx, id, step.seq, "failed", now, None, Some(&reason))?;
                    stop(tx, &mut w, "failed", &reason, now)?;
                    tracing::warn!(workflow = %w.id, step = %step.name, reason = %reason, "workflow failed");
                    Ok(Progress::Stopped)
                }
            }
        })?;
        if let Some(node) = wake {
            self.cp.commands_queued(&node);
        }
        Ok(progress)
    }

    /// What the current step does now.
    fn run_step(
        &self,
        tx: &Tx<'_>,
        w: &mut WorkflowRow,
        steps: &[StepRow],
        step: &StepRow,
        now: UnixMs,
        wake: &mut Option<String>,
    ) -> Result<Outcome, DbError> {
        match step.name.as_str() {
            "boot.entry" => Ok(Outcome::Done(None)),
            "ramdisk.join" => ramdisk_join(tx, w, now),
            "inventory.refresh" => {
                self.command(tx, w, step, ("inventory.refresh", Vec::new()), now, wake)
            }
            "disk.wipe" => {
                if !w.wipe {
                    return Ok(Outcome::Skipped("no --wipe".to_owned()));
                }
                let devices = match &w.disk {
                    Some(d) => d.clone(),
                    None => {
                        let Some(node) = w.node_id.as_deref() else {
                            return Ok(Outcome::Fail("no node".to_owned()));
                        };
                        let disks = cmds::newest_inventory(tx, node)?
                            .map(|i| inventory_disks(&i))
                            .unwrap_or_default();
                        if disks.is_empty() {
                            return Ok(Outcome::Fail(
                                "the newest inventory lists no disk to wipe".to_owned(),
                            ));
                        }
                        disks.join(",")
                    }
                };
                let args = vec![("devices".to_owned(), devices)];
                self.command(tx, w, step, ("disk.wipe", args), now, wake)
            }
            "userdata.render" => match self.cp.boot_key() {
                Some(key) => userdata_render(tx, key, w),
                None => Ok(Outcome::Fail(
                    "this control plane has no boot-entry key".to_owned(),
                )),
            },
            "deploy.image" => {
                let name = w.image.clone().unwrap_or_default();
                let Some(image) = images::get(tx, &name)? else {
                    return Ok(Outcome::Fail(format!(
                        "image {name:?} is no longer registered"
                    )));
                };
                let mut args = vec![
                    ("bytes".to_owned(), image.bytes.to_string()),
                    ("disk".to_owned(), w.disk.clone().unwrap_or_default()),
                    ("image".to_owned(), image.name.clone()),
                    ("sha256".to_owned(), image.sha256.clone()),
                ];
                if image.compression != "none" {
                    args.push(("compression".to_owned(), image.compression.clone()));
                }
                if let Some(seed) = seed_digest(steps) {
                    args.push(("seed".to_owned(), seed));
                }
                args.sort();
                self.command(tx, w, step, ("deploy.image", args), now, wake)
            }
            "boot.close" => {
                boot::close(tx, &w.id, now)?;
                Ok(Outcome::Done(Some("boot entry closed".to_owned())))
            }
            "boot.kexec" => {
                let disk = w.disk.clone().unwrap_or_default();
                let args = vec![("disk".to_owned(), disk)];
                self.command(tx, w, step, ("boot.kexec", args), now, wake)
            }
            "provisioned.join" => provisioned_join(tx, w, now),
            other => Ok(Outcome::Fail(format!("unknown step {other:?}"))),
        }
    }

    /// A command step: queued the first time (with every check of the
    /// channel), then done when its result is ok, failed with its result
    /// otherwise or when it expires.
    fn command(
        &self,
        tx: &Tx<'_>,
        w: &WorkflowRow,
        step: &StepRow,
        (kind, args): (&str, Vec<(String, String)>),
        now: UnixMs,
        wake: &mut Option<String>,
    ) -> Result<Outcome, DbError> {
        let Some(node) = w.node_id.as_deref() else {
            return Ok(Outcome::Fail("the workflow has no node".to_owned()));
        };
        let Some(cid) = &step.command_id else {
            let timeout = bc_wire::command::lookup(kind)
                .map_or(crate::plane::commands::MAX_TIMEOUT_MS, |k| k.deadline_ms)
                .min(crate::plane::commands::MAX_TIMEOUT_MS);
            return match CommandService::new(self.cp).queue_in(tx, node, kind, args, timeout) {
                Ok(row) => {
                    table::set_step(tx, &w.id, step.seq, "running", now, Some(&row.id), None)?;
                    *wake = Some(node.to_owned());
                    Ok(Outcome::Wait)
                }
                Err(QueueError::Refused(r)) => Ok(Outcome::Fail(format!(
                    "command refused ({}): {r}",
                    r.reason()
                ))),
                Err(QueueError::Db(e)) => Err(e),
                Err(QueueError::Internal(m)) => Ok(Outcome::Fail(m)),
            };
        };
        let Some(cmd) = cmds::get(tx, cid)? else {
            return Ok(Outcome::Fail(format!("command {cid} is gone")));
        };
        match cmd.state.as_str() {
            // The steps after it read the inventory: an ok result that was
            // not stored as one (cut at 1 MiB, or not JSON) is no inventory.
            "ok" if kind == "inventory.refresh" && !cmds::is_inventory(tx, node, cid)? => {
                Ok(Outcome::Fail(format!(
                    "command {cid} ok, but its output is not an inventory (cut at 1 MiB, or not JSON), so nothing was stored: see commands show {cid}"
                )))
            }
            "ok" => Ok(Outcome::Done(Some(format!(
                "command {cid} ok{}",
                cmd.outcome.map(|o| format!(": {o}")).unwrap_or_default()
            )))),
            "queued" if now > cmd.not_after => Ok(Outcome::Fail(format!(
                "command {cid} expired: the node did not answer by {}",
                crate::store::rfc3339(cmd.not_after)
            ))),
            "queued" => Ok(Outcome::Wait),
            state => Ok(Outcome::Fail(format!(
                "command {cid} {state}: {}",
                cmd.outcome.as_deref().unwrap_or("no result")
            ))),
        }
    }
}

/// Marks the boot.entry step done and the join step running, at start.
fn started(
    tx: &Tx<'_>,
    w: &WorkflowRow,
    entry: &boot::BootEntry,
    now: UnixMs,
) -> Result<(), DbError> {
    table::set_step(
        tx,
        &w.id,
        0,
        "done",
        now,
        None,
        Some(&format!(
            "boot entry until {}",
            crate::store::rfc3339(entry.not_after)
        )),
    )?;
    tx.execute("UPDATE workflows SET step = 1 WHERE id = ?1", params![w.id])?;
    table::set_step(tx, &w.id, 1, "running", now, None, None)?;
    Ok(())
}

/// The join step: done once the entry's ramdisk joined (a commission
/// learns its node here); failed when the entry ends first.
fn ramdisk_join(tx: &Tx<'_>, w: &mut WorkflowRow, now: UnixMs) -> Result<Outcome, DbError> {
    let Some(entry) = boot::get(tx, &w.id)? else {
        return Ok(Outcome::Fail("the boot entry is gone".to_owned()));
    };
    if entry.joined_at.is_some() {
        let Some(node) = entry.node_id else {
            return Ok(Outcome::Fail("the boot entry names no node".to_owned()));
        };
        if w.node_id.as_deref().is_some_and(|n| n != node) {
            return Ok(Outcome::Fail(format!(
                "the ramdisk joined as {node}, not as the workflow's node"
            )));
        }
        w.node_id = Some(node.clone());
        return Ok(Outcome::Done(Some(format!("joined as {node}"))));
    }
    if now >= entry.not_after {
        return Ok(Outcome::Fail(format!(
            "the boot entry ended at {} before the machine joined",
            crate::store::rfc3339(entry.not_after)
        )));
    }
    Ok(Outcome::Wait)
}

/// userdata.render: a single-use provisioned token targeted at the node
/// (bound at join to the product UUID of its newest inventory), the
/// cloud-config that installs bcd and joins with it, and the seed the
/// deploy writes. The token's text goes into the seed only (sealed there).
fn userdata_render(
    tx: &Tx<'_>,
    key: &boot::BootKey,
    w: &mut WorkflowRow,
) -> Result<Outcome, DbError> {
    let Some(node) = w.node_id.clone() else {
        return Ok(Outcome::Fail("the workflow has no node".to_owned()));
    };
    let Some(uuid) = cmds::newest_inventory_uuid(tx, &node)? else {
        return Ok(Outcome::Fail(format!(
            "node {node}'s newest inventory names no product UUID: the provisioned token cannot be bound to the machine"
        )));
    };
    let Some(script) = w.install_script.clone() else {
        return Ok(Outcome::Fail(
            "the workflow has no install script".to_owned(),
        ));
    };
    let scope = TokenScope {
        target_node: Some(&node),
        ..TokenScope::default()
    };
    let (token, row) = match tokens::insert_token(
        tx,
        bc_wire::AttestorId::Provisioned.as_str(),
        1,
        PROVISIONED_TOKEN_TTL_MS,
        &scope,
    ) {
        Ok(t) => t,
        Err(PoolError::Db(e)) => return Err(e),
        Err(e) => {
            return Ok(Outcome::Fail(format!(
                "cannot mint the provisioned token: {e}"
            )))
        }
    };
    let ours = crate::plane::userdata::cloud_config(&script, Some(&token.expose()));
    let user_data = match &w.user_data {
        None => ours,
        Some(theirs) => {
            let boundary = crate::ids::random_id("bcd-boundary-").map_err(DbError::Random)?;
            match crate::plane::userdata::multipart(&ours, theirs, &boundary) {
                Ok(doc) => doc,
                Err(m) => return Ok(Outcome::Fail(m)),
            }
        }
    };
    let doc = serde_json::json!({
        "user-data": user_data,
        "meta-data": format!("instance-id: {}\nlocal-hostname: {node}\n", w.id),
    })
    .to_string();
    if let Err(why) = seeds::check_doc(doc.as_bytes()) {
        return Ok(Outcome::Fail(format!("the seed cannot be stored: {why}")));
    }
    let seed = seeds::put(tx, key, &node, doc.as_bytes(), row.expires_at)?;
    w.token_id = Some(row.id.clone());
    tracing::info!(workflow = %w.id, node = %node, token_id = %row.id, product_uuid = %uuid, "provisioned token minted for the deploy");
    Ok(Outcome::Done(Some(format!(
        "token {} for product UUID {uuid}; seed={seed}",
        row.id
    ))))
}

/// The seed's SHA-256, from the userdata.render step's detail.
fn seed_digest(steps: &[StepRow]) -> Option<String> {
    steps
        .iter()
        .find(|s| s.name == "userdata.render")
        .and_then(|s| s.detail.as_deref())
        .and_then(|d| d.rsplit_once("seed="))
        .map(|(_, h)| h.to_owned())
}

/// The last step: done once the installed system joined with the
/// workflow's token (spent, the node's role node again); failed when the
/// token expires or is revoked first.
fn provisioned_join(tx: &Tx<'_>, w: &WorkflowRow, now: UnixMs) -> Result<Outcome, DbError> {
    let (Some(node), Some(token_id)) = (w.node_id.as_deref(), w.token_id.as_deref()) else {
        return Ok(Outcome::Fail("the workflow minted no token".to_owned()));
    };
    let Some(token) = tokens::token_for_update(tx, token_id)? else {
        return Ok(Outcome::Fail(format!("token {token_id} is gone")));
    };
    if token.uses_left == 0 {
        let role = records::node_for_share(tx, node)?.map(|n| n.role);
        if role == Some(Role::Node) {
            return Ok(Outcome::Done(Some(format!(
                "the installed system joined as {node} with token {token_id}"
            ))));
        }
    }
    if token.revoked_at.is_some() {
        return Ok(Outcome::Fail(format!("token {token_id} was revoked")));
    }
    if now >= token.expires_at {
        return Ok(Outcome::Fail(format!(
            "token {token_id} expired at {} before the installed system joined",
            crate::store::rfc3339(token.expires_at)
        )));
    }
    Ok(Outcome::Wait)
}

/// Ends a workflow (`failed` or `cancelled`): its entry closed, the token
/// it minted revoked when unspent, its seed removed.
fn stop(
    tx: &Tx<'_>,
    w: &mut WorkflowRow,
    state: &str,
    reason: &str,
    now: UnixMs,
) -> Result<(), DbError> {
    boot::close(tx, &w.id, now)?;
    // A step's command not yet delivered is recalled: a cancelled deploy's
    // disk.wipe or deploy.image must not reach a ramdisk that comes back.
    let why = format!("recalled: workflow {} {state}", w.id);
    for step in table::steps(tx, &w.id)? {
        if let Some(cid) = step.command_id.as_deref() {
            if cmds::recall(tx, cid, now, &why)? {
                tracing::info!(workflow = %w.id, command = %cid, "queued command recalled");
            }
        }
    }
    if let Some(token) = &w.token_id {
        tokens::revoke_in(tx, token, now)?;
    }
    if let Some(node) = &w.node_id {
        if w.kind == "deploy" {
            seeds::remove(tx, node)?;
        }
    }
    w.state = state.to_owned();
    w.failure = Some(reason.to_owned());
    w.finished_at = Some(now);
    if !table::update(tx, w, now)? {
        return Err(DbError::Corrupt {
            what: "workflow",
            detail: format!("{}: changed by another writer", w.id),
        });
    }
    Ok(())
}

/// A commission's `--node`: live, not busy; its EK (bound, else the one
/// its hardware key holds), which the entry then expects.
fn known_node(tx: &Tx<'_>, node: &str) -> Result<Option<String>, WorkflowError> {
    let refuse = |m: String| Err(WorkflowError::Refused(m));
    let Some(n) = records::node_for_update(tx, node)? else {
        return refuse(format!(
            "--node {node:?}: no such node (deleted or never joined); commission without --node"
        ));
    };
    if n.retired_at.is_some() {
        return refuse(format!(
            "--node {node}: the node is retired; commission without --node (it joins as a new node)"
        ));
    }
    if let Some(other) = table::running_of_node(tx, node)? {
        return refuse(format!(
            "node {node} has a running workflow {other}: wait for it or cancel it (workflows cancel {other})"
        ));
    }
    Ok(match records::binding_of_node(tx, node, BINDING_TPM_EK)? {
        Some(b) => Some(b.key),
        None => node_ek(tx, node)?,
    })
}

/// A node's proven EK from its hardware key (a ramdisk's: proven, never
/// bound), lowercase hex.
fn node_ek(tx: &Tx<'_>, node: &str) -> Result<Option<String>, DbError> {
    let key: Option<Option<String>> = tx.query_opt_map(
        "SELECT hardware_key FROM nodes WHERE id = ?1",
        params![node],
        |r| r.get(0),
    )?;
    Ok(key.flatten().and_then(|k| {
        k.strip_prefix(BINDING_TPM_EK)
            .and_then(|k| k.strip_prefix(':'))
            .map(str::to_owned)
    }))
}

/// The disks an inventory lists, as `/dev` paths.
fn inventory_disks(json: &serde_json::Value) -> Vec<String> {
    json.get("blockDevices")
        .and_then(|d| d.as_array())
        .into_iter()
        .flatten()
        .filter_map(|d| d.get("name").and_then(|n| n.as_str()))
        .filter(|n| !n.is_empty() && !n.contains('/'))
        .map(|n| format!("/dev/{n}"))
        .collect()
}
