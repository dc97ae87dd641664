//! `sites create|list` and `boot add|list`: sites, and the machines a site
//! commissions over PXE.

use std::path::Path;

use anyhow::{Context, Result};
use bc_controlplane::boot::{self, BootKey, NewEntry};
use bc_controlplane::config::parse_duration_ms;
use bc_controlplane::machine::{Mac, ProductUuid};
use bc_controlplane::{pki, sites, store};
use clap::Subcommand;
use serde_json::json;

use super::{db_now, open_db, print_line, print_list, Dir, ListArgs};

#[derive(Subcommand)]
pub(crate) enum SitesCmd {
    /// Create a site and print its id.
    Create {
        #[command(flatten)]
        dir: Dir,
        /// A unique name (letters, digits, '.', '_', '-').
        name: String,
    },
    /// List sites.
    List(ListArgs),
}

#[derive(Subcommand)]
pub(crate) enum BootCmd {
    /// Add a machine to commission: prints its workflow id. Its single-use
    /// discovery token (bound to the MAC and the site) is fetched by the
    /// site's lease holder, never printed.
    Add {
        #[command(flatten)]
        dir: Dir,
        /// The site (id or name) whose boot server will serve it.
        #[arg(long, value_name = "SITE")]
        site: String,
        /// The MAC it PXE-boots from (aa:bb:cc:dd:ee:ff).
        #[arg(long, value_name = "MAC", value_parser = parse_mac)]
        mac: String,
        /// Its product UUID, when known.
        #[arg(long, value_name = "UUID", value_parser = parse_uuid)]
        product_uuid: Option<String>,
        /// Only a machine proving this EK with its TPM may commission
        /// (ekSha256 of `bcd tpm identify --json`, or the maker's delivery
        /// manifest). A join without TPM evidence or with another EK is
        /// refused and leaves the entry open.
        #[arg(long, value_name = "HEX")]
        ek_sha256: Option<String>,
        /// Re-commissioning this node: only a machine proving the EK the
        /// node is bound to may commission (and the entry takes the node's
        /// trusted product UUID).
        #[arg(long, value_name = "NODE")]
        node: Option<String>,
        /// How long the entry (and its token) stays valid, e.g. 2h, 1d.
        #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_ttl)]
        not_after: i64,
    },
    /// List boot entries and their state (waiting, vouched, joined, expired).
    List(ListArgs),
}

fn parse_mac(s: &str) -> Result<String, String> {
    Mac::parse(s)
        .map(Mac::into_string)
        .map_err(|e| e.to_string())
}

fn parse_uuid(s: &str) -> Result<String, String> {
    ProductUuid::parse(s)
        .map(ProductUuid::into_string)
        .map_err(|e| e.to_string())
}

fn parse_ttl(s: &str) -> Result<i64, String> {
    let ms = parse_duration_ms(s)?;
    if ms <= 0 {
        return Err(format!("{s:?} must be more than 0s"));
    }
    Ok(ms)
}

pub(crate) fn run_sites(cmd: SitesCmd) -> Result<()> {
    match cmd {
        SitesCmd::Create { dir, name } => {
            let db = open_db(&dir.dir)?;
            let site = sites::create(&db, &name)?;
            print_line(&site.id)
        }
        SitesCmd::List(ListArgs { dir, json }) => {
            let db = open_db(&dir.dir)?;
            let rows = sites::list(&db).context("cannot list sites")?;
            print_list(
                &rows,
                json,
                |s| json!({ "id": s.id, "name": s.name, "createdAt": store::rfc3339(s.created_at) }),
                |s| Ok(format!("{} {}", s.id, s.name)),
            )
        }
    }
}

pub(crate) fn run_boot(cmd: BootCmd) -> Result<()> {
    match cmd {
        BootCmd::Add {
            dir,
            site,
            mac,
            product_uuid,
            ek_sha256,
            node,
            not_after,
        } => add(
            &dir.dir,
            &NewEntry {
                site: &site,
                mac: &mac,
                product_uuid: product_uuid.as_deref(),
                ek_sha256: ek_sha256.as_deref(),
                node: node.as_deref(),
                ttl_ms: not_after,
            },
        ),
        BootCmd::List(ListArgs { dir, json }) => list(&dir.dir, json),
    }
}

fn add(dir: &Path, new: &NewEntry<'_>) -> Result<()> {
    let db = open_db(dir)?;
    let key = BootKey::derive(&pki::load_or_create_challenge_key(dir)?);
    let entry = boot::add(&db, &key, new)?;
    print_line(&entry.workflow_id)
}

fn list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = boot::list(&db).context("cannot list boot entries")?;
    let now = db_now(&db)?;
    print_list(
        &rows,
        as_json,
        |e| {
            json!({
                "workflowId": e.workflow_id,
                "site": e.site_id,
                "mac": e.mac,
                "productUuid": e.product_uuid,
                "ekSha256": e.ek_sha256,
                "state": e.state(now).as_str(),
                "tokenId": e.token_id,
                "notAfter": store::rfc3339(e.not_after),
                "nodeId": e.node_id,
            })
        },
        |e| {
            Ok(format!(
                "{} {} {} {}{}{}",
                e.workflow_id,
                e.site_id,
                e.mac,
                e.state(now),
                e.ek_sha256
                    .as_deref()
                    .map(|ek| format!(" ek={ek}"))
                    .unwrap_or_default(),
                e.node_id
                    .as_deref()
                    .map(|n| format!(" node={n}"))
                    .unwrap_or_default()
            ))
        },
    )
}
