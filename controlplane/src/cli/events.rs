//! `events list`: the event log (joins, renewals, refusals, lifecycle).

use std::path::Path;

use anyhow::{Context, Result};
use bc_controlplane::{db, records};
use clap::Subcommand;
use serde_json::json;

use super::{open_db, print_list, ListArgs};

#[derive(Subcommand)]
pub enum EventsCmd {
    List(ListArgs),
}

pub fn run(cmd: EventsCmd) -> Result<()> {
    match cmd {
        EventsCmd::List(ListArgs { dir, json }) => list(&dir.dir, json),
    }
}

fn list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = records::list_events(&db).context("cannot list events")?;
    print_list(
        &rows,
        as_json,
        |e| {
            json!({
                "id": e.id,
                "type": e.kind,
                "at": db::rfc3339(e.at),
                "attestor": e.attestor,
                "reason": e.reason,
                "tokenId": e.token_id,
                "nodeId": e.node_id,
                "data": e.data,
            })
        },
        |e| {
            let mut line = format!("{} {} {}", e.id, db::rfc3339(e.at), e.kind);
            for (k, v) in [
                ("attestor", &e.attestor),
                ("reason", &e.reason),
                ("token", &e.token_id),
                ("node", &e.node_id),
            ] {
                if let Some(v) = v {
                    line.push_str(&format!(" {k}={v}"));
                }
            }
            Ok(line)
        },
    )
}
