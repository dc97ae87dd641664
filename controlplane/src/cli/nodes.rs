//! `nodes list|show|certs|revoke-identity|retire|cordon|delete|inventory`: joined
//! nodes and their lifecycle (`inventory`: [`super::commands`]).

use std::path::Path;

use anyhow::{bail, Context, Result};
use bc_controlplane::{nodes, records, store};
use clap::Subcommand;
use serde_json::json;

use super::{db_now, open_db, print_change, print_line, print_list, Dir, ListArgs};

#[derive(Subcommand)]
pub(crate) enum NodesCmd {
    /// List the nodes (deleted ones left out).
    List(ListArgs),
    /// One node, and the last boot its pool's boot policy verified (at its
    /// join or a renewal): Secure Boot, boot applications, command line.
    Show {
        #[command(flatten)]
        dir: Dir,
        /// The node id (node_…).
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// List a node's certificates, oldest first.
    Certs {
        #[command(flatten)]
        dir: Dir,
        /// The node id (node_…).
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Raise the node's identity generation and revoke every certificate it
    /// has: none of them ever renews or re-joins again.
    RevokeIdentity {
        #[command(flatten)]
        dir: Dir,
        /// The node id (node_…).
        id: String,
    },
    /// Retire a node: it never renews, re-joins or is reclaimed again.
    Retire {
        #[command(flatten)]
        dir: Dir,
        /// The node id (node_…).
        id: String,
    },
    /// Cordon a node, the step before deleting it.
    Cordon {
        #[command(flatten)]
        dir: Dir,
        /// The node id (node_…).
        id: String,
    },
    /// Delete a cordoned node: revoke its certificates and free its
    /// hardware bindings, so the machine can join again as a new node.
    Delete {
        #[command(flatten)]
        dir: Dir,
        /// The node id (node_…).
        id: String,
        /// Confirm: deleting cannot be undone.
        #[arg(long)]
        yes: bool,
    },
    /// The node's newest inventory (its inventory.refresh results), flagged
    /// where it differs from what the node showed at join.
    Inventory {
        #[command(flatten)]
        dir: Dir,
        /// The node id (node_…).
        id: String,
        #[arg(long)]
        json: bool,
    },
}

pub(crate) fn run(cmd: NodesCmd) -> Result<()> {
    match cmd {
        NodesCmd::List(ListArgs { dir, json }) => list(&dir.dir, json),
        NodesCmd::Show { dir, id, json } => show(&dir.dir, &id, json),
        NodesCmd::Certs { dir, id, json } => certs(&dir.dir, &id, json),
        NodesCmd::RevokeIdentity { dir, id } => revoke_identity(&dir.dir, &id),
        NodesCmd::Retire { dir, id } => {
            let db = open_db(&dir.dir)?;
            print_change(nodes::retire(&db, &id)?, "retired", &id)
        }
        NodesCmd::Cordon { dir, id } => {
            let db = open_db(&dir.dir)?;
            print_change(nodes::cordon(&db, &id)?, "cordoned", &id)
        }
        NodesCmd::Delete { dir, id, yes } => delete(&dir.dir, &id, yes),
        NodesCmd::Inventory { dir, id, json } => super::commands::inventory(&dir.dir, &id, json),
    }
}

fn list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = records::list_nodes(&db).context("cannot list nodes")?;
    // Only the JSON carries them: the text lists stay one short line a node.
    let (node_keys, bindings) = if as_json {
        (
            records::last_node_keys(&db).context("cannot list joins")?,
            records::list_bindings(&db).context("cannot list bindings")?,
        )
    } else {
        Default::default()
    };
    let ek_assurances = records::last_ek_assurances(&db).context("cannot list joins")?;
    let scopes = records::node_scopes(&db).context("cannot list node scopes")?;
    let hardware_keys =
        bc_controlplane::hardware::keys(&db).context("cannot list hardware keys")?;
    let no_scope = records::NodeScope::default();
    let scope = |id: &str| scopes.get(id).unwrap_or(&no_scope);
    print_list(
        &rows,
        as_json,
        |n| {
            let bound: Vec<_> = bindings
                .iter()
                .filter(|b| b.node_id == n.id)
                .map(|b| json!({ "kind": b.kind, "key": b.key }))
                .collect();
            with_node_fields(
                n,
                json!({
                "nodeKey": node_keys.get(&n.id),
                "ekAssurance": ek_assurances.get(&n.id),
                "bindings": bound,
                "hardwareKey": hardware_keys.get(&n.id),
                "site": scope(&n.id).site_id,
                "allowedKinds": scope(&n.id).allowed_kinds,
                "maxCertTtlSeconds": scope(&n.id).max_cert_ttl_ms.map(|ms| ms / 1000),
                }),
            )
        },
        |n| {
            let sc = scope(&n.id);
            let mut extra = String::new();
            if let Some(site) = &sc.site_id {
                extra.push_str(&format!(" site={site}"));
            }
            if let Some(kinds) = &sc.allowed_kinds {
                extra.push_str(&format!(" kinds={}", kinds.join(",")));
            }
            if let Some(a) = ek_assurances.get(&n.id) {
                extra.push_str(&format!(" ek={a}"));
            }
            Ok(format!(
                "{} {} generation={} attestor={} joined={}{}{}{extra}",
                n.id,
                n.role.name(),
                n.identity_generation,
                n.attestor,
                store::rfc3339(n.joined_at),
                if n.retired_at.is_some() {
                    " retired"
                } else {
                    ""
                },
                if n.cordoned_at.is_some() {
                    " cordoned"
                } else {
                    ""
                }
            ))
        },
    )
}

/// What `list --json` and `show --json` say of every node, then `more`.
fn with_node_fields(n: &records::NodeRow, more: serde_json::Value) -> serde_json::Value {
    let mut v = json!({
        "nodeId": n.id,
        "role": n.role.name(),
        "identityGeneration": n.identity_generation,
        "attestor": n.attestor.as_str(),
        "joinedAt": store::rfc3339(n.joined_at),
        "retired": n.retired_at.is_some(),
        "cordoned": n.cordoned_at.is_some(),
        "pool": n.pool_id,
    });
    if let (Some(all), serde_json::Value::Object(more)) = (v.as_object_mut(), more) {
        all.extend(more);
    }
    v
}

fn show(dir: &Path, id: &str, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let (n, boot) = nodes::show(&db, id)?;
    let lease = bc_controlplane::leases::of_node(&db, &n.id)?;
    if as_json {
        let lease = lease.as_ref().map(|l| {
            json!({
                "id": l.id,
                "tenant": l.tenant_id,
                "allowedKinds": l.allowed_kinds,
                "createdAt": store::rfc3339(l.created_at),
                "until": l.until.map(store::rfc3339),
            })
        });
        let boot = boot.map(|b| {
            json!({
                "verifiedAt": store::rfc3339(b.verified_at),
                "via": b.via,
                "secureBoot": b.boot.secure_boot,
                "bootApps": b.boot.boot_apps,
                "cmdline": b.boot.cmdline,
            })
        });
        let v = with_node_fields(
            &n,
            json!({
                "deleted": n.deleted_at.is_some(),
                "lastVerifiedBoot": boot,
                "lease": lease,
            }),
        );
        return print_line(&serde_json::to_string_pretty(&v).context("cannot encode JSON")?);
    }
    let mut text = format!(
        "node:         {}\nrole:         {}\npool:         {}\nattestor:     {}\njoined:       {}\ngeneration:   {}\n",
        n.id,
        n.role.name(),
        n.pool_id,
        n.attestor,
        store::rfc3339(n.joined_at),
        n.identity_generation
    );
    if let Some(l) = &lease {
        text.push_str(&format!(
            "leased:       to {} ({}, until {}): runs only {}\n",
            l.tenant_id,
            l.id,
            l.until.map_or("it is ended".to_owned(), store::rfc3339),
            l.allowed_kinds.join(", ")
        ));
    }
    match boot {
        None => {
            text.push_str("verified boot: none (no boot policy verified a boot of this node)\n")
        }
        Some(b) => {
            text.push_str(&format!(
                "verified boot: {} (at {})\n  secure boot:  {}\n",
                store::rfc3339(b.verified_at),
                b.via,
                b.boot.secure_boot
            ));
            for app in &b.boot.boot_apps {
                let by = if app.authorities.is_empty() {
                    "no authority logged".to_owned()
                } else {
                    app.authorities.join("; ")
                };
                text.push_str(&format!(
                    "  boot app:     {} {} (verified by {by})\n",
                    app.digest,
                    app.path.as_deref().unwrap_or("(no path)")
                ));
            }
            text.push_str(&format!(
                "  cmdline:      {}\n",
                b.boot.cmdline.as_deref().unwrap_or("(none measured)")
            ));
        }
    }
    super::print_stdout(&text)
}

fn certs(dir: &Path, id: &str, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = nodes::certs(&db, id)?;
    let now = db_now(&db)?;
    print_list(
        &rows,
        as_json,
        |c| {
            json!({
                "serial": c.serial,
                "identityGeneration": c.identity_generation,
                "notBefore": store::rfc3339(c.not_before),
                "notAfter": store::rfc3339(c.not_after),
                "revoked": c.revoked_at.is_some(),
                "revokedAt": c.revoked_at.map(store::rfc3339),
                "expired": now >= c.not_after,
                // What the certificate says of its key (the AK statement
                // of a TPM-certified one), after its SPIFFE ID.
                "statements": bc_controlplane::pki::node_cert_identity(&c.der)
                    .map(|id| id.statements)
                    .unwrap_or_default(),
            })
        },
        |c| {
            let state = if c.revoked_at.is_some() {
                "revoked"
            } else if now >= c.not_after {
                "expired"
            } else {
                "valid"
            };
            Ok(format!(
                "{} generation={} not_before={} not_after={} {state}",
                c.serial,
                c.identity_generation,
                store::rfc3339(c.not_before),
                store::rfc3339(c.not_after)
            ))
        },
    )
}

fn revoke_identity(dir: &Path, id: &str) -> Result<()> {
    let db = open_db(dir)?;
    let r = nodes::revoke_identity(&db, id)?;
    print_line(&format!(
        "revoked the identity of {}: generation {}, {} certificate(s) revoked",
        r.node_id, r.identity_generation, r.revoked_certs
    ))
}

fn delete(dir: &Path, id: &str, yes: bool) -> Result<()> {
    if !yes {
        bail!("deleting {id} cannot be undone; add --yes to confirm");
    }
    let db = open_db(dir)?;
    let d = nodes::delete(&db, id)?;
    print_line(&format!(
        "deleted {}: {} certificate(s) revoked, {} binding(s) freed, {} resolve entr{} removed",
        d.node_id,
        d.revoked_certs,
        d.freed_bindings.len(),
        d.removed_resolve_entries,
        if d.removed_resolve_entries == 1 {
            "y"
        } else {
            "ies"
        }
    ))
}
