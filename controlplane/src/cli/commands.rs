//! `commands send|list|show` and `nodes inventory`: the command channel's
//! operator side (docs/commands.md).

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bc_controlplane::commands::{CommandRow, QueueError, STATES};
use bc_controlplane::config::parse_duration_ms;
use bc_controlplane::{store, CommandService, ControlPlane};
use clap::Subcommand;
use serde_json::json;

use super::{load_config, print_line, print_list, require_initialized, Dir, ExitWith};

#[derive(Subcommand)]
pub(crate) enum CommandsCmd {
    /// Queue a command for a node: refused (exit 1, naming why) when the
    /// node is retired, has no live certificate, or its role or certificate
    /// does not allow the kind or its arguments. Prints the command's id.
    Send {
        #[command(flatten)]
        dir: Dir,
        /// The node id (node_…).
        #[arg(long)]
        node: String,
        /// The kind (inventory.refresh, diag.ping, …).
        #[arg(long)]
        kind: String,
        /// An argument, key=value. Repeatable.
        #[arg(long = "arg", value_name = "KEY=VALUE", value_parser = parse_arg)]
        args: Vec<(String, String)>,
        /// Wait for the result and print it; exit 3 unless it is ok.
        #[arg(long)]
        wait: bool,
        /// How long the command waits for its node (then expired): 1s to 24h.
        #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = parse_timeout)]
        timeout: i64,
        #[arg(long)]
        json: bool,
    },
    /// List commands, newest first.
    List {
        #[command(flatten)]
        dir: Dir,
        /// Only this node's.
        #[arg(long)]
        node: Option<String>,
        /// Only in this state (queued, ok, failed, refused, expired).
        #[arg(long, value_parser = parse_state)]
        status: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// One command: its result, output, and whether the result's signature
    /// checked.
    Show {
        #[command(flatten)]
        dir: Dir,
        /// The command id (cmd_…).
        id: String,
        #[arg(long)]
        json: bool,
    },
}

fn parse_arg(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not key=value")),
    }
}

fn parse_timeout(s: &str) -> Result<i64, String> {
    if s.starts_with('-') {
        return Err(format!("the timeout must be positive, not {s:?}"));
    }
    parse_duration_ms(s)
}

fn parse_state(s: &str) -> Result<String, String> {
    if STATES.contains(&s) {
        Ok(s.to_owned())
    } else {
        Err(format!("{s:?} is not one of {}", STATES.join(", ")))
    }
}

/// DIR's control plane: the signing key and the database.
fn open(dir: &Path) -> Result<ControlPlane> {
    require_initialized(dir)?;
    let config = load_config(dir)?;
    ControlPlane::open_with(dir, config)
        .with_context(|| format!("cannot open the control plane in {}", dir.display()))
}

pub(crate) fn run(cmd: CommandsCmd) -> Result<()> {
    match cmd {
        CommandsCmd::Send {
            dir,
            node,
            kind,
            args,
            wait,
            timeout,
            json,
        } => send(&dir.dir, &node, &kind, args, wait, timeout, json),
        CommandsCmd::List {
            dir,
            node,
            status,
            json,
        } => {
            let cp = open(&dir.dir)?;
            let rows = CommandService::new(&cp)
                .list(node.as_deref(), status.as_deref())
                .context("cannot list commands")?;
            print_list(&rows, json, row_json, |c| {
                Ok(format!(
                    "{} {} {} {} queued={} notAfter={}{}",
                    c.id,
                    c.node_id,
                    c.kind,
                    c.state,
                    store::rfc3339(c.queued_at),
                    store::rfc3339(c.not_after),
                    c.outcome
                        .as_deref()
                        .map(|o| format!(" outcome={o:?}"))
                        .unwrap_or_default()
                ))
            })
        }
        CommandsCmd::Show { dir, id, json } => {
            let cp = open(&dir.dir)?;
            let Some(row) = CommandService::new(&cp)
                .get(&id)
                .context("cannot read the command")?
            else {
                bail!("no command {id:?}");
            };
            show(&row, json)
        }
    }
}

fn send(
    dir: &Path,
    node: &str,
    kind: &str,
    args: Vec<(String, String)>,
    wait: bool,
    timeout: i64,
    as_json: bool,
) -> Result<()> {
    let cp = open(dir)?;
    let svc = CommandService::new(&cp);
    let row = match svc.queue(node, kind, args, timeout) {
        Ok(row) => row,
        Err(QueueError::Refused(r)) => {
            bail!("command refused ({}): {r}", r.reason())
        }
        Err(e) => return Err(e).context("cannot queue the command"),
    };
    if !wait {
        return if as_json {
            print_line(&serde_json::to_string_pretty(&row_json(&row))?)
        } else {
            print_line(&row.id)
        };
    }
    // Until the node answers or the command expires (database time).
    let done = loop {
        let now = svc.get(&row.id).context("cannot read the command")?;
        match now {
            Some(r) if r.state != "queued" => break r,
            Some(_) => std::thread::sleep(Duration::from_millis(250)),
            None => bail!("command {} vanished", row.id),
        }
    };
    show(&done, as_json)?;
    if done.state != "ok" {
        return Err(ExitWith {
            code: 3,
            message: format!(
                "command {} {}: {}",
                done.id,
                done.state,
                done.outcome.as_deref().unwrap_or("no result")
            ),
        }
        .into());
    }
    Ok(())
}

/// A command's result: the verified `SignedCommandResult`'s fields.
fn result_fields(row: &CommandRow) -> Option<bc_wire::command_v1::CommandResult> {
    use prost::Message;
    let signed = bc_wire::command_v1::SignedCommandResult::decode(row.result.as_deref()?).ok()?;
    bc_wire::command_v1::CommandResult::decode(signed.result.as_slice()).ok()
}

fn row_json(c: &CommandRow) -> serde_json::Value {
    let args: serde_json::Map<String, serde_json::Value> =
        c.args.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    json!({
        "id": c.id,
        "nodeId": c.node_id,
        "kind": c.kind,
        "args": args,
        "state": c.state,
        "queuedAt": store::rfc3339(c.queued_at),
        "notAfter": store::rfc3339(c.not_after),
        "finishedAt": c.finished_at.map(store::rfc3339),
        "outcome": c.outcome,
        "outputSha256": c.output_sha256,
        "signatureChecked": c.result_checked,
        "resultCertSerial": c.result_serial,
    })
}

fn show(row: &CommandRow, as_json: bool) -> Result<()> {
    let result = result_fields(row);
    let output = result
        .as_ref()
        .map(|r| r.output.as_slice())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(output);
    let cut = result
        .as_ref()
        .is_some_and(|r| r.output_len > r.output.len() as u64);
    if as_json {
        let mut v = row_json(row);
        // JSON output (what the kinds print) as JSON, anything else as text.
        let out =
            serde_json::from_slice::<serde_json::Value>(output).unwrap_or_else(|_| json!(text));
        v["output"] = if result.is_some() { out } else { json!(null) };
        v["outputLen"] = json!(result.as_ref().map(|r| r.output_len));
        v["outputCut"] = json!(cut);
        v["startedAt"] = json!(result.as_ref().map(|r| store::rfc3339(r.started_unix_ms)));
        return print_line(&serde_json::to_string_pretty(&v)?);
    }
    let mut lines = vec![
        format!("id: {}", row.id),
        format!("node: {}", row.node_id),
        format!("kind: {}", row.kind),
        format!(
            "args: {}",
            row.args
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        format!("state: {}", row.state),
        format!("queued: {}", store::rfc3339(row.queued_at)),
        format!("not after: {}", store::rfc3339(row.not_after)),
    ];
    if let Some(r) = &result {
        lines.push(format!("outcome: {}", r.outcome));
        lines.push(format!(
            "signature checked: {}",
            if row.result_checked == Some(true) {
                "yes"
            } else {
                "no"
            }
        ));
        lines.push(format!(
            "output: {} bytes{}, sha256 {}",
            r.output_len,
            if cut { " (cut at 1 MiB)" } else { "" },
            row.output_sha256.as_deref().unwrap_or("")
        ));
        lines.push(text.into_owned());
    }
    print_line(&lines.join("\n"))
}

/// `nodes inventory N`: the node's newest inventory, and how many before it.
pub(crate) fn inventory(dir: &Path, node: &str, as_json: bool) -> Result<()> {
    let cp = open(dir)?;
    let rows = CommandService::new(&cp)
        .inventories(node)
        .context("cannot read inventories")?;
    let Some(newest) = rows.first() else {
        bail!("node {node:?} has no inventory (send it inventory.refresh)");
    };
    let inventory: serde_json::Value =
        serde_json::from_str(&newest.inventory).context("a stored inventory is not JSON")?;
    if as_json {
        let history: Vec<_> = rows
            .iter()
            .map(|r| json!({ "at": store::rfc3339(r.at), "command": r.command_id, "flags": r.flags }))
            .collect();
        return print_line(&serde_json::to_string_pretty(&json!({
            "nodeId": node,
            "at": store::rfc3339(newest.at),
            "command": newest.command_id,
            "flags": newest.flags,
            "inventory": inventory,
            "history": history,
        }))?);
    }
    let mut lines = vec![format!(
        "node {node} inventory at {} (command {}, {} in history){}",
        store::rfc3339(newest.at),
        newest.command_id,
        rows.len(),
        if newest.flags.is_empty() {
            String::new()
        } else {
            format!(" DIFFERS FROM JOIN: {}", newest.flags.join(","))
        }
    )];
    lines.push(serde_json::to_string_pretty(&inventory)?);
    print_line(&lines.join("\n"))
}
