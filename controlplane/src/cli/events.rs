//! `events list` and `events prune`: the event log (joins, renewals,
//! refusals, lifecycle) and its retention.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use bc_controlplane::{config, eventlog, records, store, tenants};
use clap::{Args, Subcommand};
use serde_json::json;

use super::{db_now, open_db, print_line, print_list, Dir, ListArgs};

#[derive(Subcommand)]
pub(crate) enum EventsCmd {
    /// The event log, oldest first; each event names the tenant it is
    /// attributed to (tenant=…; none: the operator's).
    List {
        #[command(flatten)]
        list: ListArgs,
        /// Only the events attributed to this tenant: its nodes' joins,
        /// renewals, refused renewals and lifecycle, refusals by its pools'
        /// policy, and the leases it holds.
        #[arg(long, value_name = "T")]
        tenant: Option<String>,
    },
    /// Delete the events older than the retention (`[events] retention` in
    /// controlplane.toml, 90d by default; `serve` also does it hourly), in
    /// batches of 5,000 so a running server is never held up for long.
    Prune(PruneArgs),
}

#[derive(Args)]
pub(crate) struct PruneArgs {
    #[command(flatten)]
    pub dir: Dir,
    /// Delete events older than this instead (e.g. 30d); at least 1h.
    #[arg(long, value_name = "DURATION")]
    pub older_than: Option<String>,
}

pub(crate) fn run(cmd: EventsCmd) -> Result<()> {
    match cmd {
        EventsCmd::List {
            list: ListArgs { dir, json },
            tenant,
        } => list(&dir.dir, json, tenant.as_deref()),
        EventsCmd::Prune(PruneArgs { dir, older_than }) => prune(&dir.dir, older_than.as_deref()),
    }
}

fn prune(dir: &Path, older_than: Option<&str>) -> Result<()> {
    let db = open_db(dir)?;
    let retention_ms = match older_than {
        None => super::load_config(dir)?.events.retention_ms,
        Some(text) => {
            let ms = config::parse_duration_ms(text).map_err(|e| anyhow!("--older-than: {e}"))?;
            if ms < 3_600_000 {
                return Err(anyhow!("--older-than must be at least 1h, not {text:?}"));
            }
            ms
        }
    };
    let cutoff = db_now(&db)?.saturating_sub(retention_ms);
    let n = eventlog::prune(&db, retention_ms).context("cannot prune events")?;
    print_line(&format!(
        "deleted {n} events older than {}",
        store::rfc3339(cutoff)
    ))
}

fn list(dir: &Path, as_json: bool, tenant: Option<&str>) -> Result<()> {
    let db = open_db(dir)?;
    if let Some(t) = tenant {
        if !tenants::list(&db)?.iter().any(|r| r.id == t) {
            return Err(anyhow!(
                "no tenant {t:?}; bc-controlplane tenants list shows them"
            ));
        }
    }
    let rows = records::list_events_of(&db, tenant).context("cannot list events")?;
    print_list(
        &rows,
        as_json,
        |e| {
            json!({
                "id": e.id,
                "type": e.kind,
                "at": store::rfc3339(e.at),
                "attestor": e.attestor,
                "reason": e.reason,
                "tokenId": e.token_id,
                "nodeId": e.node_id,
                "tenantId": e.tenant_id,
                "data": e.data,
            })
        },
        |e| {
            let mut line = format!("{} {} {}", e.id, store::rfc3339(e.at), e.kind);
            for (k, v) in [
                ("attestor", &e.attestor),
                ("reason", &e.reason),
                ("token", &e.token_id),
                ("node", &e.node_id),
                ("tenant", &e.tenant_id),
            ] {
                if let Some(v) = v {
                    line.push_str(&format!(" {k}={v}"));
                }
            }
            if let Some(s) = e.data["source"].as_str() {
                line.push_str(&format!(" source={s}"));
            }
            // Aggregated refusals: how many in their minute.
            if let Some(n) = e.data["count"].as_u64().filter(|n| *n > 1) {
                line.push_str(&format!(" count={n}"));
            }
            Ok(line)
        },
    )
}
