//! `pools create|update|list`: every node belongs to one pool, and a pool
//! can require the attestors that admit machines into it.

use std::path::Path;

use anyhow::{Context, Result};
use bc_controlplane::join::JoinService;
use bc_controlplane::{db, pools};
use clap::Subcommand;
use serde_json::json;

use super::{open_db, print_line, print_list, Dir, ListArgs};

#[derive(Subcommand)]
pub enum PoolsCmd {
    /// Create a pool.
    Create {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, value_name = "ID")]
        id: String,
        #[arg(long, value_name = "O", default_value = pools::DEFAULT_OWNER)]
        owner: String,
        /// The attestors that may admit a machine into it (default: any).
        #[arg(long, value_name = "A,B", value_delimiter = ',')]
        join_attestors: Option<Vec<String>>,
    },
    /// Replace a pool's joinAttestors.
    Update {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, value_name = "ID")]
        id: String,
        #[arg(
            long,
            value_name = "A,B",
            value_delimiter = ',',
            required_unless_present = "any_attestor"
        )]
        join_attestors: Option<Vec<String>>,
        /// Remove joinAttestors: any attestor may admit a machine.
        #[arg(long, conflicts_with = "join_attestors")]
        any_attestor: bool,
    },
    /// List pools.
    List(ListArgs),
}

/// The ids of the attestors `serve` runs on DIR: the JoinService it would
/// open, asked (not a list kept beside it, which would drift).
fn served_attestor_ids(dir: &Path) -> Result<Vec<String>> {
    let svc = JoinService::open(dir)
        .with_context(|| format!("cannot open the control plane in {}", dir.display()))?;
    let ids = svc.attestor_ids();
    svc.shutdown_events();
    Ok(ids)
}

pub fn run(cmd: PoolsCmd) -> Result<()> {
    match cmd {
        PoolsCmd::Create {
            dir,
            id,
            owner,
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
            any_attestor: _,
        } => {
            let db = open_db(&dir.dir)?;
            let known = served_attestor_ids(&dir.dir)?;
            let known: Vec<&str> = known.iter().map(String::as_str).collect();
            let pool = pools::set_join_attestors(&db, &id, join_attestors.as_deref(), &known)?;
            print_line(&format!(
                "updated pool {} join_attestors={}",
                pool.id,
                describe_attestors(&pool)?
            ))
        }
        PoolsCmd::List(ListArgs { dir, json }) => list(&dir.dir, json),
    }
}

fn describe_attestors(pool: &pools::PoolRow) -> Result<String> {
    Ok(match pool.join_attestors()? {
        Some(list) => list.join(","),
        None => "any".to_owned(),
    })
}

fn list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = pools::list_pools(&db).context("cannot list pools")?;
    print_list(
        &rows,
        as_json,
        |(p, nodes)| {
            json!({
                "id": p.id,
                "owner": p.owner,
                "policy": p.policy,
                "createdAt": db::rfc3339(p.created_at),
                "nodes": nodes,
            })
        },
        |(p, nodes)| {
            Ok(format!(
                "{} owner={} join_attestors={} nodes={nodes}",
                p.id,
                p.owner,
                describe_attestors(p)?
            ))
        },
    )
}
