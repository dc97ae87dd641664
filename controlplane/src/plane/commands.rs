//! `CommandService`: the control plane's side of the command channel
//! (docs/commands.md), over the shared [`ControlPlane`].
//!
//! - [`CommandService::queue`] refuses what the node may not be sent (with
//!   a typed reason), else signs the command once with the JoinService key
//!   and stores the signed bytes: the same bytes are delivered every time.
//! - [`CommandService::channel_auth`] decides whether a client certificate
//!   may open a channel (at database time); [`CommandService::deliverable`]
//!   is what a channel sends; [`CommandService::channels_tick`] which
//!   channels may stay open and which have something to deliver.
//! - [`CommandService::take_result`] stores a result only after
//!   `verify_result` with the key of the certificate the channel was proven
//!   with; an inventory.refresh result becomes the node's newest inventory.
//! - [`CommandService::expire`] marks commands past not_after, by database
//!   time.
//!
//! The transport (the WebSocket) is [`crate::api::channel`]'s.

use std::convert::Infallible;

use bc_wire::command::{
    check, new_command, sign, verify_result, CommandRefusal, ResultError, Scope, ScopeError,
    SignError, MAX_COMMAND_LIFETIME_MS,
};
use bc_wire::command_v1::{CommandResult, SignedCommandResult, Status};
use bc_wire::signing;
use p256::ecdsa::signature::Signer;
use prost::Message;

use crate::model::commands::{self as table, CommandRow, StoredResult};
use crate::model::records::{self, NewEvent};
use crate::plane::ControlPlane;
use crate::store::{DbError, UnixMs};

/// The longest a command may wait for its node (its not_after from now).
pub const MAX_TIMEOUT_MS: i64 = MAX_COMMAND_LIFETIME_MS;

/// Why a command is not queued. [`QueueRefusal::reason`] names it, as
/// `commands send` prints it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueRefusal {
    #[error("no node {0:?}")]
    UnknownNode(String),
    #[error("node {0} is retired")]
    Retired(String),
    #[error("node {0} has no live certificate (none of its current identity is unrevoked and valid now)")]
    NoLiveCertificate(String),
    #[error("node {0}'s certificate has no usable scope statement ({1}): it runs no command until it renews")]
    NoScope(String, ScopeError),
    #[error("the timeout must be from 1 s to 24 h")]
    Timeout,
    /// The node is leased (`leases create`): it runs only the lease's kinds.
    #[error("node {node} is leased to tenant {tenant} (lease {lease}), whose node runs only {allowed}: {kind} is not one of them (bc-controlplane leases end {lease} lifts it)")]
    Leased {
        node: String,
        tenant: String,
        lease: String,
        kind: String,
        allowed: String,
    },
    #[error("{0}")]
    Command(CommandRefusal),
}

impl QueueRefusal {
    /// The refusal's name.
    pub fn reason(&self) -> &'static str {
        match self {
            QueueRefusal::UnknownNode(_) => "unknown-node",
            QueueRefusal::Retired(_) => "retired",
            QueueRefusal::NoLiveCertificate(_) => "no-live-certificate",
            QueueRefusal::NoScope(..) => "no-scope",
            QueueRefusal::Timeout => "timeout",
            QueueRefusal::Leased { .. } => "leased",
            QueueRefusal::Command(c) => c.reason(),
        }
    }
}

/// Why `queue` did not queue.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("refused ({reason}): {refusal}", reason = .0.reason(), refusal = .0)]
    Refused(QueueRefusal),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("{0}")]
    Internal(String),
}

/// A client certificate allowed to open a channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChannelAuth {
    pub node_id: String,
    pub serial: String,
    /// The certified key (DER SPKI): the proof and every result must be
    /// signed by it.
    pub spki_der: Vec<u8>,
    /// Database time when it was checked.
    pub now_ms: UnixMs,
}

/// How many channels' certificates one query checks (well under SQLite's
/// and PostgreSQL's bound on parameters).
pub(crate) const CHECK_CHUNK: usize = 500;

/// What [`CommandService::channels_tick`] found.
pub(crate) struct ChannelsTick {
    /// `(node_id, serial)` of each certificate a channel may stay open with.
    pub good: std::collections::HashSet<(String, String)>,
    /// The nodes with a deliverable command.
    pub queued: Vec<String>,
}

/// What became of a result that arrived on a channel.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Stored (or stored before): ack it.
    Stored(String),
    /// Verified, but for no command queued for this node: an event, no row;
    /// acked, so the agent stops sending it.
    Unknown(String),
    /// Not verified: nothing stored, not acked.
    Refused(ResultError),
}

/// The command channel's service (see the module documentation).
#[derive(Clone, Copy)]
pub struct CommandService<'a> {
    cp: &'a ControlPlane,
}

impl std::ops::Deref for CommandService<'_> {
    type Target = ControlPlane;
    fn deref(&self) -> &ControlPlane {
        self.cp
    }
}

impl<'a> CommandService<'a> {
    pub fn new(cp: &'a ControlPlane) -> Self {
        CommandService { cp }
    }
}

impl CommandService<'_> {
    /// Queues `kind` with `args` for `node_id`, to be run before `timeout_ms`
    /// from now (database time), or says why not.
    pub fn queue(
        &self,
        node_id: &str,
        kind: &str,
        args: Vec<(String, String)>,
        timeout_ms: i64,
    ) -> Result<CommandRow, QueueError> {
        let row = self
            .database()
            .write(|tx| self.queue_in(tx, node_id, kind, args.clone(), timeout_ms))?;
        self.cp.commands_queued(node_id);
        Ok(row)
    }

    /// [`Self::queue`] in the caller's transaction (a workflow's step):
    /// the same checks; the caller wakes the channel after commit
    /// ([`ControlPlane::commands_queued`]).
    pub(crate) fn queue_in(
        &self,
        tx: &crate::store::Tx<'_>,
        node_id: &str,
        kind: &str,
        args: Vec<(String, String)>,
        timeout_ms: i64,
    ) -> Result<CommandRow, QueueError> {
        if !(1_000..=MAX_TIMEOUT_MS).contains(&timeout_ms) {
            return Err(QueueError::Refused(QueueRefusal::Timeout));
        }
        let id = crate::ids::random_id("cmd_")
            .map_err(|e| QueueError::Internal(format!("random command id: {e}")))?;
        let row = {
            let now = tx.now()?;
            let refuse = |r| Err(QueueError::Refused(r));
            let Some(node) = records::node_for_share(tx, node_id)? else {
                return refuse(QueueRefusal::UnknownNode(printable(node_id)));
            };
            if node.retired_at.is_some() {
                return refuse(QueueRefusal::Retired(node.id));
            }
            // A lease restricts the node from the moment it is made, before
            // its next certificate says so.
            if let Some(lease) = crate::model::leases::active(tx, node_id, now)? {
                if !lease.allows(kind) {
                    return refuse(QueueRefusal::Leased {
                        node: node.id,
                        tenant: lease.tenant_id,
                        lease: lease.id,
                        kind: printable(kind),
                        allowed: lease.allowed_kinds.join(", "),
                    });
                }
            }
            let Some((_, der)) = table::live_cert(tx, node_id, now)? else {
                return refuse(QueueRefusal::NoLiveCertificate(node.id));
            };
            let statements = crate::pki::node_cert_identity(&der)
                .map(|i| i.statements)
                .unwrap_or_default();
            let scope = match Scope::from_statements(&statements) {
                Ok(s) => s,
                Err(e) => return refuse(QueueRefusal::NoScope(node.id, e)),
            };
            let cmd = new_command(&id, node_id, kind, args.clone(), now + timeout_ms);
            if let Err(r) = check(&cmd, &scope) {
                return refuse(QueueRefusal::Command(r));
            }
            let key = self.signing_key();
            let signed = sign(
                &cmd,
                signing::key_id(self.bundle().join_signing_spki_der()),
                |input| {
                    let sig: p256::ecdsa::Signature = key.sign(input);
                    Ok::<_, Infallible>(sig.to_bytes().into())
                },
            )
            .map_err(|e| match e {
                SignError::Oversized(n) => {
                    QueueError::Refused(QueueRefusal::Command(CommandRefusal::Oversized(n)))
                }
                SignError::Signer(never) => match never {},
            })?;
            let row = CommandRow {
                id: cmd.id.clone(),
                node_id: cmd.node_id.clone(),
                kind: cmd.kind.clone(),
                args: cmd
                    .args
                    .iter()
                    .map(|a| (a.name.clone(), a.value.clone()))
                    .collect(),
                signed: signed.encode_to_vec(),
                state: "queued".to_owned(),
                queued_at: now,
                not_after: cmd.not_after_unix_ms,
                finished_at: None,
                result: None,
                result_status: None,
                outcome: None,
                output_sha256: None,
                result_checked: None,
                result_serial: None,
            };
            table::insert(tx, &row)?;
            row
        };
        tracing::info!(id = %row.id, node_id, kind, not_after = %crate::store::rfc3339(row.not_after), "command queued");
        Ok(row)
    }

    /// One command, after expiring what is due.
    pub fn get(&self, id: &str) -> Result<Option<CommandRow>, DbError> {
        self.expire()?;
        self.database().read(|tx| table::get(tx, id))
    }

    /// Commands, newest first, after expiring what is due.
    pub fn list(
        &self,
        node_id: Option<&str>,
        state: Option<&str>,
    ) -> Result<Vec<CommandRow>, DbError> {
        self.expire()?;
        table::list(self.database(), node_id, state)
    }

    /// A node's inventories, newest first.
    pub fn inventories(&self, node_id: &str) -> Result<Vec<table::InventoryRow>, DbError> {
        table::inventories(self.database(), node_id)
    }

    /// Marks every queued command past its not_after `expired` (database
    /// time: the node never saw it, so there is no signed result).
    pub fn expire(&self) -> Result<usize, DbError> {
        let n = self.database().write(|tx| {
            let now = tx.now()?;
            table::expire(tx, now)
        })?;
        if n > 0 {
            tracing::info!(count = n, "commands expired without a result");
        }
        Ok(n)
    }

    /// Whether the client certificate `leaf` (DER) may open a channel: a
    /// node certificate of this trust domain that is a current `node_certs`
    /// row, not revoked, of the node's current identity, within its
    /// validity at database time, of a node neither retired nor deleted.
    pub(crate) fn channel_auth(&self, leaf: &[u8]) -> Result<Option<ChannelAuth>, DbError> {
        let Ok(identity) = crate::pki::node_cert_identity(leaf) else {
            return Ok(None);
        };
        if identity.trust_domain != self.bundle().trust_domain {
            return Ok(None);
        }
        let node_id = identity.node_id;
        self.database().read(|tx| {
            let now = tx.now()?;
            let Some(cert) = records::cert_by_der(tx, &node_id, leaf)? else {
                return Ok(None);
            };
            if !table::channel_cert_good(tx, &node_id, &cert.serial, now)? {
                return Ok(None);
            }
            Ok(Some(ChannelAuth {
                node_id: node_id.clone(),
                serial: cert.serial,
                spki_der: identity.spki_der.clone(),
                now_ms: now,
            }))
        })
    }

    /// Whether `leaf` may fetch deploy images and its node's seed
    /// (`GET /v1/images/…`, `GET /v1/deploy/seed`): what [`Self::channel_auth`]
    /// admits, of a node whose role is `ramdisk` (only the commissioning
    /// ramdisk deploys). The node's id.
    pub(crate) fn deploy_auth(&self, leaf: &[u8]) -> Result<Option<String>, DbError> {
        let Some(auth) = self.channel_auth(leaf)? else {
            return Ok(None);
        };
        let role: Option<String> = self.database().read(|tx| {
            tx.query_opt_map(
                "SELECT role FROM nodes WHERE id = ?1",
                crate::store::params![auth.node_id],
                |r| r.get(0),
            )
        })?;
        let ramdisk = role.as_deref() == Some(bc_wire::agent::Role::Ramdisk.name());
        Ok(ramdisk.then_some(auth.node_id))
    }

    /// The node's deploy seed document while it is current (database
    /// time); `None` without one, or without a boot key to open it.
    pub(crate) fn deploy_seed(&self, node_id: &str) -> Result<Option<Vec<u8>>, DbError> {
        let Some(key) = self.cp.boot_key() else {
            return Ok(None);
        };
        self.database().read(|tx| {
            let now = tx.now()?;
            crate::model::seeds::current(tx, key, node_id, now)
        })
    }

    /// The channels' periodic look, for all of them at once: of the nodes
    /// `open` (those with a channel), each one's certificate a channel may
    /// still be open with (see [`table::channel_certs_good`]: revocation,
    /// retirement, expiry and renewal drop a node's pair), and the nodes with
    /// something to deliver. A query per [`CHECK_CHUNK`] channels and one
    /// for the queue, however many channels are idle.
    pub(crate) fn channels_tick(&self, open: &[String]) -> Result<ChannelsTick, DbError> {
        self.database().read(|tx| {
            let now = tx.now()?;
            let mut good = std::collections::HashSet::new();
            for chunk in open.chunks(CHECK_CHUNK) {
                good.extend(table::channel_certs_good(tx, chunk, now)?);
            }
            Ok(ChannelsTick {
                good,
                queued: table::nodes_with_queued(tx, now)?,
            })
        })
    }

    /// Database time.
    pub(crate) fn now(&self) -> Result<UnixMs, DbError> {
        self.database().read(|tx| tx.now())
    }

    /// `(id, signed bytes)` of the node's queued commands not past
    /// not_after, oldest first; while the node is leased, only those of
    /// its lease's kinds (one queued before the lease waits, and expires
    /// unless the lease ends first).
    pub(crate) fn deliverable(&self, node_id: &str) -> Result<Vec<(String, Vec<u8>)>, DbError> {
        self.database().read(|tx| {
            let now = tx.now()?;
            let lease = crate::model::leases::active(tx, node_id, now)?;
            let due = table::deliverable(tx, node_id, now)?;
            Ok(due
                .into_iter()
                .filter(|(_, kind, _)| lease.as_ref().is_none_or(|l| l.allows(kind)))
                .map(|(id, _, signed)| (id, signed))
                .collect())
        })
    }

    /// A result that arrived on the channel `auth` proved: verified with
    /// that certificate's key and node, then stored on its command.
    pub(crate) fn take_result(
        &self,
        auth: &ChannelAuth,
        signed: &SignedCommandResult,
    ) -> Result<Taken, DbError> {
        let result = match verify_result(signed, &auth.spki_der, &auth.node_id) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(node_id = %auth.node_id, reason = e.reason(), error = %e,
                    "command result refused");
                self.database().write(|tx| {
                    let now = tx.now()?;
                    records::insert_event(
                        tx,
                        &NewEvent {
                            kind: EVENT_RESULT_REFUSED,
                            at: now,
                            node_id: Some(&auth.node_id),
                            reason: Some(e.reason()),
                            data: serde_json::json!({ "error": e.to_string() }),
                            ..NewEvent::default()
                        },
                    )
                })?;
                return Ok(Taken::Refused(e));
            }
        };
        let bytes = signed.encode_to_vec();
        let taken = self.database().write(|tx| -> Result<Taken, DbError> {
            let now = tx.now()?;
            let Some(row) = table::get(tx, &result.id)?.filter(|r| r.node_id == auth.node_id)
            else {
                records::insert_event(
                    tx,
                    &NewEvent {
                        kind: EVENT_RESULT_UNKNOWN,
                        at: now,
                        node_id: Some(&auth.node_id),
                        data: serde_json::json!({
                            "id": result.id,
                            "kind": result.kind,
                            "status": status_name(&result),
                            "outcome": result.outcome,
                        }),
                        ..NewEvent::default()
                    },
                )?;
                return Ok(Taken::Unknown(result.id.clone()));
            };
            if row.result.is_some() {
                return Ok(Taken::Stored(row.id));
            }
            table::store_result(
                tx,
                &StoredResult {
                    id: &row.id,
                    node_id: &auth.node_id,
                    status: status_name(&result),
                    outcome: &result.outcome,
                    output_sha256: &hex::encode(&result.output_sha256),
                    signed: &bytes,
                    serial: &auth.serial,
                    at: now,
                },
            )?;
            if row.kind == INVENTORY_REFRESH
                && result.kind == row.kind
                && result.status == Status::Ok as i32
            {
                store_inventory(tx, &auth.node_id, &row.id, now, &result)?;
            }
            Ok(Taken::Stored(row.id))
        })?;
        if let Taken::Stored(id) = &taken {
            tracing::info!(id, node_id = %auth.node_id, status = status_name(&result),
                outcome = %result.outcome, "command result stored");
        }
        Ok(taken)
    }
}

/// The kind whose results are inventories.
const INVENTORY_REFRESH: &str = "inventory.refresh";
/// A result whose signature did not verify (or was out of shape).
pub(crate) const EVENT_RESULT_REFUSED: &str = "security.command.result.refused";
/// A verified result for no command queued for its node.
pub(crate) const EVENT_RESULT_UNKNOWN: &str = "command.result.unknown";

fn status_name(r: &CommandResult) -> &'static str {
    Status::try_from(r.status)
        .unwrap_or(Status::Unspecified)
        .name()
}

/// Stores an inventory.refresh output as the node's newest inventory,
/// flagged (and an event) where it differs from what the node showed at
/// join. An output that is cut or not JSON is not an inventory (the result
/// is stored all the same).
fn store_inventory(
    tx: &crate::store::Tx<'_>,
    node_id: &str,
    command_id: &str,
    now: UnixMs,
    result: &CommandResult,
) -> Result<(), DbError> {
    if result.output_len != result.output.len() as u64 {
        tracing::warn!(
            node_id,
            command_id,
            "inventory output cut: not stored as an inventory"
        );
        return Ok(());
    }
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(&result.output) else {
        tracing::warn!(
            node_id,
            command_id,
            "inventory output is not JSON: not stored as an inventory"
        );
        return Ok(());
    };
    let facts = table::join_facts(tx, node_id)?;
    let flags = inventory_flags(&json, &facts);
    table::insert_inventory(tx, node_id, command_id, now, &json.to_string(), &flags)?;
    if !flags.is_empty() {
        tracing::warn!(node_id, command_id, flags = %flags.join(","),
            "the inventory differs from what the node showed at join");
        records::insert_event(
            tx,
            &NewEvent {
                kind: table::EVENT_INVENTORY_MISMATCH,
                at: now,
                node_id: Some(node_id),
                data: serde_json::json!({
                    "command": command_id,
                    "flags": flags,
                    "join": {
                        "productUuid": facts.product_uuid,
                        "macs": facts.macs,
                        "ekSha256": facts.ek_sha256,
                    },
                    "inventory": {
                        "productUuid": inventory_uuid(&json),
                        "macs": inventory_macs(&json),
                        "ekSha256": inventory_ek(&json),
                    },
                }),
                ..NewEvent::default()
            },
        )?;
    }
    Ok(())
}

fn inventory_uuid(json: &serde_json::Value) -> Option<String> {
    json.pointer("/dmi/productUuid")
        .and_then(|v| v.as_str())
        .and_then(|u| crate::model::machine::ProductUuid::parse(u).ok())
        .map(crate::model::machine::ProductUuid::into_string)
}

/// The MACs an inventory lists (normalized, sorted, unique).
pub(crate) fn inventory_macs(json: &serde_json::Value) -> Vec<String> {
    let mut macs: Vec<String> = json
        .get("nics")
        .and_then(|n| n.as_array())
        .into_iter()
        .flatten()
        .filter_map(|n| n.get("mac").and_then(|m| m.as_str()))
        .filter_map(|m| crate::model::machine::Mac::parse(m).ok())
        .map(|m| m.as_str().to_owned())
        .collect();
    macs.sort();
    macs.dedup();
    macs
}

fn inventory_ek(json: &serde_json::Value) -> Option<String> {
    json.pointer("/tpm/ekSha256")
        .and_then(|v| v.as_str())
        .map(str::to_ascii_lowercase)
}

/// What differs between an inventory and the join: `product-uuid` (the
/// join's is known and the inventory's is another or none), `macs` (a MAC
/// the join claimed is missing), `ek` (a TPM-bound node reports another
/// EK, or none readable).
pub(crate) fn inventory_flags(json: &serde_json::Value, facts: &table::JoinFacts) -> Vec<String> {
    let mut flags = Vec::new();
    if let Some(uuid) = &facts.product_uuid {
        if inventory_uuid(json).as_deref() != Some(uuid.as_str()) {
            flags.push("product-uuid".to_owned());
        }
    }
    if let Some(joined) = &facts.macs {
        let now = inventory_macs(json);
        if joined.iter().any(|m| !now.contains(m)) {
            flags.push("macs".to_owned());
        }
    }
    if let Some(ek) = &facts.ek_sha256 {
        if inventory_ek(json).as_deref() != Some(ek.as_str()) {
            flags.push("ek".to_owned());
        }
    }
    flags
}

/// `s` for a message: printable, bounded.
fn printable(s: &str) -> String {
    s.chars()
        .take(128)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests;
