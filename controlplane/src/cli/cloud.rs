//! `cloud resolve add|list`: which cloud accounts' VMs may join with their
//! identity document (cloud-iid), and into which pool.

use anyhow::{bail, Context, Result};
use bc_controlplane::attestors::cloud_iid::{oidc, resolve, AWS, AZURE, GCP};
use bc_controlplane::{pools, store};
use clap::Subcommand;
use serde_json::json;

use super::{db_now, open_db, print_list, Dir, ListArgs};

#[derive(Subcommand)]
pub(crate) enum CloudCmd {
    /// The resolve table: where a VM of a provider account joins.
    Resolve {
        #[command(subcommand)]
        cmd: ResolveCmd,
    },
}

#[derive(Subcommand)]
pub(crate) enum ResolveCmd {
    /// Let the VMs of an account (and zone) join, into a pool. Adding the
    /// same provider, account and zone again replaces the pool.
    Add {
        #[command(flatten)]
        dir: Dir,
        /// The provider: gcp, aws, azure, or oidc:<name> (a `[cloud_iid.oidc.<name>]`).
        #[arg(long, value_name = "P", value_parser = parse_provider)]
        provider: String,
        /// The account: the GCP project id, the AWS account id, the Azure subscription id.
        #[arg(long, value_name = "A", value_parser = parse_id)]
        account: String,
        /// Only VMs in this zone (AWS: availability zone; GCP: zone; Azure has none: its document names no location).
        #[arg(long, value_name = "Z", value_parser = parse_id)]
        zone: Option<String>,
        /// The pool they join (else the default pool).
        #[arg(long, value_name = "POOL")]
        pool: Option<String>,
        /// A role they may join as beyond `[cloud_iid] roles` (default node
        /// only); repeat for more. A cloud's word about a VM makes it a site
        /// node or a ramdisk only where you say so.
        #[arg(long = "role", value_name = "ROLE", value_parser = ["node", "site", "ramdisk"])]
        roles: Vec<String>,
    },
    /// List the resolve table.
    List(ListArgs),
}

fn parse_provider(s: &str) -> Result<String, String> {
    match s.strip_prefix(oidc::PREFIX) {
        Some(name) => oidc::check_name(name).map(|()| s.to_owned()),
        None if [GCP, AWS, AZURE].contains(&s) => Ok(s.to_owned()),
        None => Err(format!("{s:?}: expected gcp, aws, azure or oidc:<name>")),
    }
}

fn parse_id(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    if !ok {
        return Err(format!(
            "{s:?}: 1 to 128 letters, digits, '-', '_', '.', ':'"
        ));
    }
    Ok(s.to_owned())
}

pub(crate) fn run(cmd: CloudCmd) -> Result<()> {
    let CloudCmd::Resolve { cmd } = cmd;
    match cmd {
        ResolveCmd::Add {
            dir,
            provider,
            account,
            zone,
            pool,
            roles,
        } => {
            let roles: Vec<bc_wire::agent::Role> = roles
                .iter()
                .filter_map(|r| bc_wire::agent::Role::from_name(r))
                .collect();
            if zone.is_some() && provider == bc_wire::cloud_iid::AZURE {
                bail!("--zone: Azure's attested document names no location; add the subscription without a zone");
            }
            let db = open_db(&dir.dir)?;
            let now = db_now(&db)?;
            db.write(|tx| {
                if let Some(p) = &pool {
                    if pools::get(tx, p)?.is_none() {
                        bail!("no pool {p:?}; see bc-controlplane pools list");
                    }
                }
                resolve::add(
                    tx,
                    &provider,
                    &account,
                    zone.as_deref(),
                    pool.as_deref(),
                    &roles,
                    now,
                )?;
                Ok(())
            })
            .context("cannot add the resolve entry")
        }
        ResolveCmd::List(ListArgs { dir, json }) => {
            let db = open_db(&dir.dir)?;
            let rows = db
                .read(resolve::list)
                .context("cannot list the resolve table")?;
            print_list(
                &rows,
                json,
                |r| {
                    json!({
                        "provider": r.provider,
                        "account": r.account,
                        "zone": r.zone,
                        "pool": r.pool,
                        "roles": r.roles.iter().map(|r| r.name()).collect::<Vec<_>>(),
                        "createdAt": store::rfc3339(r.created_at),
                    })
                },
                |r| {
                    let roles = if r.roles.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " roles={}",
                            r.roles
                                .iter()
                                .map(|r| r.name())
                                .collect::<Vec<_>>()
                                .join(",")
                        )
                    };
                    Ok(format!(
                        "{} {} {} {}{roles}",
                        r.provider,
                        r.account,
                        r.zone.as_deref().unwrap_or("*"),
                        r.pool.as_deref().unwrap_or("default")
                    ))
                },
            )
        }
    }
}
