//! `pools create|update|list|show`: every node belongs to one pool, and a pool
//! can require the attestors that admit machines into it.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use bc_controlplane::boot_policy::BootPolicy;
use bc_controlplane::ControlPlane;
use bc_controlplane::{pools, store};
use clap::Subcommand;
use serde_json::json;

use super::{open_db, print_line, print_list, Dir, ListArgs};

#[derive(Subcommand)]
pub(crate) enum PoolsCmd {
    /// Create a pool.
    Create {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, value_name = "ID")]
        id: String,
        /// The tenant owning the pool (tenants create makes one): its
        /// nodes' events and pool-policy refusals are attributed to it.
        /// --owner is the older spelling.
        #[arg(long, value_name = "T", alias = "owner", default_value = pools::DEFAULT_OWNER)]
        tenant: String,
        /// The attestors that may admit a machine into it (default: any).
        #[arg(long, value_name = "A,B", value_delimiter = ',')]
        join_attestors: Option<Vec<String>>,
    },
    /// Replace a pool's joinAttestors and/or minEkAssurance.
    #[command(group(
        clap::ArgGroup::new("change")
            .required(true)
            .multiple(true)
            .args(["join_attestors", "any_attestor", "min_ek_assurance", "any_ek_assurance",
                   "boot_policy", "no_boot_policy"])
    ))]
    Update {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, value_name = "ID")]
        id: String,
        #[arg(long, value_name = "A,B", value_delimiter = ',')]
        join_attestors: Option<Vec<String>>,
        /// Remove joinAttestors: any attestor may admit a machine.
        #[arg(long, conflicts_with = "join_attestors")]
        any_attestor: bool,
        /// The least EK assurance a join into the pool must have, weakest
        /// first: pinned, operator-file, maker-service, nv-chain or nv
        /// (nv-chain and nv rank equal). A join that proved no EK (any
        /// attestor but tpm) is refused.
        #[arg(long, value_name = "LEVEL")]
        min_ek_assurance: Option<String>,
        /// Remove minEkAssurance.
        #[arg(long, conflicts_with = "min_ek_assurance")]
        any_ek_assurance: bool,
        /// The pool's boot policy (TOML, docs in model/boot_policy.rs): a tpm
        /// join must send its event log, verified against its quote and
        /// judged by it. Its dbx_min files are read now, relative to FILE.
        #[arg(long, value_name = "FILE")]
        boot_policy: Option<std::path::PathBuf>,
        /// Remove the boot policy.
        #[arg(long, conflicts_with = "boot_policy")]
        no_boot_policy: bool,
    },
    /// List pools.
    List(ListArgs),
    /// One pool: its policy, and its boot policy as stored (TOML).
    Show {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, value_name = "ID")]
        id: String,
        #[arg(long)]
        json: bool,
    },
}

/// The ids of the attestors `serve` runs on DIR: the control plane it would
/// open, asked (not a list kept beside it, which would drift).
fn served_attestor_ids(dir: &Path) -> Result<Vec<String>> {
    let svc = ControlPlane::open_with(dir, super::load_config(dir)?)
        .with_context(|| format!("cannot open the control plane in {}", dir.display()))?;
    let ids = svc.attestor_ids();
    svc.shutdown_events();
    Ok(ids)
}

pub(crate) fn run(cmd: PoolsCmd) -> Result<()> {
    match cmd {
        PoolsCmd::Create {
            dir,
            id,
            tenant: owner,
            join_attestors,
        } => {
            let db = open_db(&dir.dir)?;
            let known = served_attestor_ids(&dir.dir)?;
            let known: Vec<&str> = known.iter().map(String::as_str).collect();
            let pool = pools::create_pool(&db, &id, &owner, join_attestors.as_deref(), &known)?;
            print_line(&format!(
                "created pool {} owner={} join_attestors={}",
                pool.id,
                pool.owner,
                describe_attestors(&pool)?
            ))
        }
        PoolsCmd::Update {
            dir,
            id,
            join_attestors,
            any_attestor,
            min_ek_assurance,
            any_ek_assurance,
            boot_policy,
            no_boot_policy,
        } => {
            // Checked before anything is written.
            let min = min_ek_assurance
                .as_deref()
                .map(pools::parse_ek_assurance)
                .transpose()?;
            let boot = match &boot_policy {
                Some(path) => Some(BootPolicy::load(path).map_err(|e| {
                    anyhow!(
                        "{e}; the pool was not changed (fix the file and run pools update again)"
                    )
                })?),
                None => None,
            };
            let db = open_db(&dir.dir)?;
            let mut pool = None;
            if join_attestors.is_some() || any_attestor {
                let known = served_attestor_ids(&dir.dir)?;
                let known: Vec<&str> = known.iter().map(String::as_str).collect();
                pool = Some(pools::set_join_attestors(
                    &db,
                    &id,
                    join_attestors.as_deref(),
                    &known,
                )?);
            }
            if min.is_some() || any_ek_assurance {
                pool = Some(pools::set_min_ek_assurance(&db, &id, min)?);
            }
            if boot.is_some() || no_boot_policy {
                pool = Some(pools::set_boot_policy(&db, &id, boot.as_ref())?);
            }
            let Some(pool) = pool else {
                bail!("nothing to update");
            };
            print_line(&format!(
                "updated pool {} join_attestors={} min_ek_assurance={} boot_policy={}",
                pool.id,
                describe_attestors(&pool)?,
                describe_min(&pool)?,
                describe_boot(&db, &pool.id)?
            ))
        }
        PoolsCmd::List(ListArgs { dir, json }) => list(&dir.dir, json),
        PoolsCmd::Show { dir, id, json } => show(&dir.dir, &id, json),
    }
}

fn describe_attestors(pool: &pools::PoolRow) -> Result<String> {
    Ok(match pool.join_attestors()? {
        Some(list) => list.join(","),
        None => "any".to_owned(),
    })
}

fn describe_min(pool: &pools::PoolRow) -> Result<&'static str> {
    Ok(pool.min_ek_assurance()?.map_or("any", |a| a.as_str()))
}

fn show(dir: &Path, id: &str, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let Some((pool, nodes)) = pools::list_pools(&db)
        .context("cannot list pools")?
        .into_iter()
        .find(|(p, _)| p.id == id)
    else {
        bail!("no pool {id:?} (pools list shows them)");
    };
    let boot = pools::boot_policies(&db)
        .context("cannot read the boot policies")?
        .into_iter()
        .find(|(p, _)| p == id)
        .and_then(|(_, b)| b.map(|b| b.to_toml()));
    if as_json {
        let v = json!({
            "id": pool.id,
            "owner": pool.owner,
            "tenant": pool.owner,
            "policy": pool.policy,
            "bootPolicy": boot,
            "createdAt": store::rfc3339(pool.created_at),
            "nodes": nodes,
        });
        return print_line(&serde_json::to_string_pretty(&v).context("cannot encode JSON")?);
    }
    let mut text = format!(
        "{} owner={} join_attestors={} min_ek_assurance={} nodes={nodes}\n",
        pool.id,
        pool.owner,
        describe_attestors(&pool)?,
        describe_min(&pool)?
    );
    match boot {
        Some(toml) => {
            text.push_str("boot_policy:\n");
            for l in toml.lines() {
                text.push_str(&format!("  {l}\n"));
            }
        }
        None => text.push_str("boot_policy: none\n"),
    }
    super::print_stdout(&text)
}

/// `set` or `none`: whether the pool has a boot policy.
fn describe_boot(db: &store::Store, id: &str) -> Result<&'static str> {
    let all = pools::boot_policies(db).context("cannot read the boot policies")?;
    Ok(match all.iter().any(|(p, b)| p == id && b.is_some()) {
        true => "set",
        false => "none",
    })
}

fn list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let boot = pools::boot_policies(&db).context("cannot read the boot policies")?;
    let rows: Vec<_> = pools::list_pools(&db)
        .context("cannot list pools")?
        .into_iter()
        .map(|(p, nodes)| {
            let policy = boot
                .iter()
                .find(|(id, _)| *id == p.id)
                .and_then(|(_, b)| b.as_ref().map(BootPolicy::to_toml));
            (p, nodes, policy)
        })
        .collect();
    print_list(
        &rows,
        as_json,
        |(p, nodes, boot)| {
            json!({
                "id": p.id,
                "owner": p.owner,
                "tenant": p.owner,
                "policy": p.policy,
                "bootPolicy": boot,
                "createdAt": store::rfc3339(p.created_at),
                "nodes": nodes,
            })
        },
        |(p, nodes, boot)| {
            Ok(format!(
                "{} owner={} join_attestors={} min_ek_assurance={} boot_policy={} nodes={nodes}",
                p.id,
                p.owner,
                describe_attestors(p)?,
                describe_min(p)?,
                if boot.is_some() { "set" } else { "none" }
            ))
        },
    )
}
