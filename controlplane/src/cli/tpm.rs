//! The tpm attestor's operator commands: `ek-roots` (the makers' CAs an EK
//! certificate must chain to), `resolve` (the allow-list of EKs) and
//! `requests` (enrollment: TPMs waiting for an operator).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use bc_controlplane::attestors::tpm::{ek, enroll};
use bc_controlplane::{db, pools};
use clap::Subcommand;
use serde_json::json;

use super::{open_db, print_line, print_list, print_stdout, Dir, ListArgs};

#[derive(Subcommand)]
pub enum EkRootsCmd {
    /// Add the CA certificates in FILE.pem: self-signed ones are anchors,
    /// the others intermediates (trusted only through a path to an anchor).
    Add {
        #[command(flatten)]
        dir: Dir,
        /// PEM file with one or more CA certificates.
        #[arg(value_name = "FILE.pem")]
        file: PathBuf,
    },
    /// List the trusted EK roots.
    List(ListArgs),
}

#[derive(Subcommand)]
pub enum ResolveCmd {
    /// Let the TPM with this EK join (replaces its entry if there is one).
    Add {
        #[command(flatten)]
        dir: Dir,
        /// SHA-256 of the EK's SubjectPublicKeyInfo (ekSha256 of bcd tpm identify).
        #[arg(long, value_name = "HEX")]
        ek_sha256: String,
        /// The pool a new node joins (default: default).
        #[arg(long, value_name = "ID")]
        pool: Option<String>,
        /// Join as this existing node instead of a new one.
        #[arg(long, value_name = "ID")]
        node: Option<String>,
        /// The new node is a site node of this site (id or name): it joins
        /// with role site, and only with it.
        #[arg(long, value_name = "SITE", conflicts_with = "node")]
        site: Option<String>,
    },
    /// Remove the entry of an EK.
    Remove {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, value_name = "HEX")]
        ek_sha256: String,
    },
    /// List the entries.
    List(ListArgs),
}

#[derive(Subcommand)]
pub enum RequestsCmd {
    /// List join requests.
    List(ListArgs),
    /// Approve a pending request: the TPM's next join admits it once.
    Approve {
        #[command(flatten)]
        dir: Dir,
        /// The request id (req_…).
        id: String,
        /// The pool its node joins (default: default).
        #[arg(long, value_name = "P")]
        pool: Option<String>,
        /// Its node is a site node of this site (id or name): it joins with
        /// role site, and only with it.
        #[arg(long, value_name = "SITE")]
        site: Option<String>,
    },
    /// Deny a pending request: that TPM's joins are refused.
    Deny {
        #[command(flatten)]
        dir: Dir,
        /// The request id (req_…).
        id: String,
    },
}

/// A pool as the commands print it: `None` is the default pool.
fn pool_name(pool: Option<&str>) -> &str {
    pool.unwrap_or(pools::DEFAULT_POOL)
}

/// ` site=ID` for a place that names a site, else nothing.
fn site_part(site: Option<&str>) -> String {
    site.map(|s| format!(" site={s}")).unwrap_or_default()
}

pub fn run_ek_roots(cmd: EkRootsCmd) -> Result<()> {
    match cmd {
        EkRootsCmd::Add { dir, file } => ek_roots_add(&dir.dir, &file),
        EkRootsCmd::List(ListArgs { dir, json }) => {
            let db = open_db(&dir.dir)?;
            let rows = ek::list_roots(&db).context("cannot list the EK roots")?;
            print_list(
                &rows,
                json,
                |r| {
                    json!({
                        "sha256": r.sha256,
                        "kind": kind(r.anchor),
                        "subject": r.subject,
                        "notAfter": db::rfc3339(r.not_after),
                        "addedAt": db::rfc3339(r.added_at),
                    })
                },
                |r| {
                    Ok(format!(
                        "{} {} {} not_after={}",
                        r.sha256,
                        kind(r.anchor),
                        r.subject,
                        db::rfc3339(r.not_after)
                    ))
                },
            )
        }
    }
}

/// How `ek-roots` names a configured certificate's role.
fn kind(anchor: bool) -> &'static str {
    if anchor {
        "anchor"
    } else {
        "intermediate"
    }
}

fn ek_roots_add(dir: &Path, file: &Path) -> Result<()> {
    let db = open_db(dir)?;
    let text = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let ders = ek::parse_roots_pem(&text).with_context(|| format!("{}", file.display()))?;
    let added = ek::add_roots(&db, &ders).context("cannot add the EK roots")?;
    let mut out = String::new();
    for (root, new) in added {
        let what = if new { "added" } else { "already present" };
        out.push_str(&format!(
            "{what} {} {} {}\n",
            root.sha256,
            kind(root.anchor),
            root.subject
        ));
    }
    print_stdout(&out)
}

pub fn run_resolve(cmd: ResolveCmd) -> Result<()> {
    match cmd {
        ResolveCmd::Add {
            dir,
            ek_sha256,
            pool,
            node,
            site,
        } => {
            let db = open_db(&dir.dir)?;
            let target = enroll::ResolveTarget {
                pool: pool.as_deref(),
                node: node.as_deref(),
                site: site.as_deref(),
            };
            let (entry, replaced) = enroll::add_resolve(&db, &ek_sha256, target)?;
            print_line(&format!(
                "{} {} pool={} node={}{}",
                if replaced { "replaced" } else { "added" },
                entry.ek_sha256,
                pool_name(entry.pool_id.as_deref()),
                entry.node_id.as_deref().unwrap_or("new"),
                site_part(entry.site_id.as_deref()),
            ))
        }
        ResolveCmd::Remove { dir, ek_sha256 } => {
            let db = open_db(&dir.dir)?;
            if !enroll::remove_resolve(&db, &ek_sha256)? {
                bail!("NOT_FOUND: no resolve entry for {ek_sha256}")
            }
            print_line(&format!("removed {}", ek_sha256.to_ascii_lowercase()))
        }
        ResolveCmd::List(ListArgs { dir, json }) => {
            let db = open_db(&dir.dir)?;
            let rows = enroll::list_resolve(&db).context("cannot list the resolve entries")?;
            print_list(
                &rows,
                json,
                |r| {
                    json!({
                        "ekSha256": r.ek_sha256,
                        "pool": pool_name(r.pool_id.as_deref()),
                        "nodeId": r.node_id,
                        "site": r.site_id,
                        "createdAt": db::rfc3339(r.created_at),
                    })
                },
                |r| {
                    Ok(format!(
                        "{} pool={} node={}{}",
                        r.ek_sha256,
                        pool_name(r.pool_id.as_deref()),
                        r.node_id.as_deref().unwrap_or("new"),
                        site_part(r.site_id.as_deref()),
                    ))
                },
            )
        }
    }
}

pub fn run_requests(cmd: RequestsCmd) -> Result<()> {
    match cmd {
        RequestsCmd::List(ListArgs { dir, json }) => requests_list(&dir.dir, json),
        RequestsCmd::Approve {
            dir,
            id,
            pool,
            site,
        } => {
            let db = open_db(&dir.dir)?;
            let row = enroll::approve(&db, &id, pool.as_deref(), site.as_deref())?;
            print_line(&format!(
                "approved {} (pool {}{})",
                row.id,
                pool_name(row.pool_id.as_deref()),
                row.site_id
                    .as_deref()
                    .map(|s| format!(", site {s}"))
                    .unwrap_or_default()
            ))
        }
        RequestsCmd::Deny { dir, id } => {
            let db = open_db(&dir.dir)?;
            let row = enroll::deny(&db, &id)?;
            print_line(&format!("denied {}", row.id))
        }
    }
}

fn requests_list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = enroll::list_requests(&db).context("cannot list join requests")?;
    print_list(
        &rows,
        as_json,
        |r| {
            json!({
                "id": r.id,
                "attestor": r.attestor,
                "ekSha256": r.ek_sha256,
                "status": r.status,
                "createdAt": db::rfc3339(r.created_at),
                "decidedAt": r.decided_at.map(db::rfc3339),
                "pool": pool_name(r.pool_id.as_deref()),
                "site": r.site_id,
                "ekIssuer": r.ek_issuer,
                "ekSerial": r.ek_serial,
                "used": r.used_at.is_some(),
            })
        },
        |r| {
            Ok(format!(
                "{} {}{} ek={} pool={}{} created={} issuer={:?}",
                r.id,
                r.status,
                if r.used_at.is_some() { " (used)" } else { "" },
                r.ek_sha256,
                pool_name(r.pool_id.as_deref()),
                site_part(r.site_id.as_deref()),
                db::rfc3339(r.created_at),
                r.ek_issuer
            ))
        },
    )
}
