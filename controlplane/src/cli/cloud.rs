//! `cloud resolve add|list`: which cloud accounts' VMs may join with their
//! identity document (cloud-iid), into which pool and site, and which known
//! instances join as their node.

use anyhow::{bail, Context, Result};
use bc_controlplane::attestors::cloud_iid::{oidc, resolve, AWS, AZURE, GCP};
use bc_controlplane::{pools, sites, store};
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
    /// Let the VMs of an account (and zone) join, into a pool (and as site
    /// nodes of a site); or, with --instance and --node, let a known
    /// instance join as its node. Adding the same provider, account and
    /// zone (or instance) again replaces the row.
    Add(Box<AddArgs>),
    /// List the resolve table.
    List(ListArgs),
}

#[derive(clap::Args)]
pub(crate) struct AddArgs {
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
    /// They are site nodes of this site (id or name): they join with role
    /// site, and only with it.
    #[arg(long, value_name = "SITE", conflicts_with_all = ["site_from", "roles"])]
    site: Option<String>,
    /// They are site nodes of the site their zone names (its id or name),
    /// joining with role site only; a VM whose zone names no site is
    /// refused (unknown-instance).
    #[arg(long, value_name = "CLAIM", value_parser = ["zone"], conflicts_with = "roles")]
    site_from: Option<String>,
    /// A known instance (with --node): it joins as that node, as a
    /// reclaim does, once. Checked before the account's rows.
    #[arg(long, value_name = "I", value_parser = parse_id, requires = "node",
          conflicts_with_all = ["zone", "pool", "roles", "site", "site_from"])]
    instance: Option<String>,
    /// The node the instance joins as (node_…): it must exist and not be
    /// retired.
    #[arg(long, value_name = "N", requires = "instance")]
    node: Option<String>,
    /// The tenant the row's VMs join for: checked against the pool's
    /// owner (without --pool: the tenant's only pool), or the node's.
    #[arg(long, value_name = "T")]
    tenant: Option<String>,
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
        ResolveCmd::Add(args) => {
            let AddArgs {
                dir,
                provider,
                account,
                zone,
                pool,
                roles,
                site,
                site_from,
                instance,
                node,
                tenant,
            } = *args;
            let roles: Vec<bc_wire::agent::Role> = roles
                .iter()
                .filter_map(|r| bc_wire::agent::Role::from_name(r))
                .collect();
            if zone.is_some() && provider == bc_wire::cloud_iid::AZURE {
                bail!("--zone: Azure's attested document names no location; add the subscription without a zone");
            }
            if site_from.is_some() && provider == bc_wire::cloud_iid::AZURE {
                bail!("--site-from zone: Azure's attested document names no location; name the site with --site");
            }
            let db = open_db(&dir.dir)?;
            let now = db_now(&db)?;
            if let (Some(instance), Some(node)) = (&instance, &node) {
                return db
                    .write(|tx| {
                        resolve::add_instance(
                            tx,
                            &provider,
                            &account,
                            instance,
                            node,
                            tenant.as_deref(),
                            now,
                        )?;
                        Ok::<_, anyhow::Error>(())
                    })
                    .context("cannot add the known instance");
            }
            db.write(|tx| {
                if let Some(p) = &pool {
                    if pools::get(tx, p)?.is_none() {
                        bail!("no pool {p:?}; see bc-controlplane pools list");
                    }
                }
                let pool = match &tenant {
                    Some(t) => resolve::tenant_pool(tx, t, pool.as_deref())?,
                    None => pool.clone(),
                };
                let site = match (&site, &site_from) {
                    (Some(s), _) => Some(resolve::SiteRule::Site(
                        sites::resolve(tx, s)
                            .map_err(|e| anyhow::anyhow!("{e}; see bc-controlplane sites list"))?,
                    )),
                    (None, Some(_)) => Some(resolve::SiteRule::FromZone),
                    (None, None) => None,
                };
                resolve::add(
                    tx,
                    &resolve::NewRow {
                        provider: &provider,
                        account: &account,
                        zone: zone.as_deref(),
                        pool: pool.as_deref(),
                        roles: &roles,
                        site: site.as_ref(),
                    },
                    now,
                )?;
                Ok(())
            })
            .context("cannot add the resolve entry")
        }
        ResolveCmd::List(ListArgs { dir, json }) => {
            let db = open_db(&dir.dir)?;
            let (rows, instances) = db
                .read(|tx| {
                    Ok::<_, store::DbError>((resolve::list(tx)?, resolve::list_instances(tx)?))
                })
                .context("cannot list the resolve table")?;
            // The account rows, then the known instances.
            let listed: Vec<Listed> = rows
                .into_iter()
                .map(Listed::Row)
                .chain(instances.into_iter().map(Listed::Instance))
                .collect();
            print_list(&listed, json, listed_json, |l| Ok(listed_line(l)))
        }
    }
}

enum Listed {
    Row(resolve::ResolveRow),
    Instance(resolve::InstanceRow),
}

fn listed_json(l: &Listed) -> serde_json::Value {
    match l {
        Listed::Row(r) => {
            let (site, site_from) = match &r.site {
                Some(resolve::SiteRule::Site(s)) => (Some(s.as_str()), None),
                Some(resolve::SiteRule::FromZone) => (None, Some("zone")),
                None => (None, None),
            };
            json!({
                "provider": r.provider,
                "account": r.account,
                "zone": r.zone,
                "pool": r.pool,
                "roles": r.roles.iter().map(|r| r.name()).collect::<Vec<_>>(),
                "site": site,
                "siteFrom": site_from,
                "tenant": r.tenant,
                "createdAt": store::rfc3339(r.created_at),
            })
        }
        Listed::Instance(i) => json!({
            "provider": i.provider,
            "account": i.account,
            "instance": i.instance,
            "node": i.node,
            "tenant": i.tenant,
            "createdAt": store::rfc3339(i.created_at),
        }),
    }
}

fn listed_line(l: &Listed) -> String {
    match l {
        Listed::Row(r) => {
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
            let site = match &r.site {
                Some(resolve::SiteRule::Site(s)) => format!(" site={s}"),
                Some(resolve::SiteRule::FromZone) => " site=<zone>".to_owned(),
                None => String::new(),
            };
            format!(
                "{} {} {} {} tenant={}{roles}{site}",
                r.provider,
                r.account,
                r.zone.as_deref().unwrap_or("*"),
                r.pool.as_deref().unwrap_or("default"),
                r.tenant.as_deref().unwrap_or("-")
            )
        }
        Listed::Instance(i) => format!(
            "{} {} instance={} node={} tenant={}",
            i.provider,
            i.account,
            i.instance,
            i.node,
            i.tenant.as_deref().unwrap_or("-")
        ),
    }
}
