//! `workflows start|list|show|cancel`: commission and deploy machines
//! (docs/workflows.md). The control plane's poller advances them; this
//! starts, shows and cancels them.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use bc_controlplane::workflows::{Commission, Deploy, Shown, WorkflowError, WorkflowRow};
use bc_controlplane::{store, ControlPlane, WorkflowService};
use clap::Subcommand;
use serde_json::json;

use super::install_script::{self, Attestor, Target};
use super::{load_config, print_line, print_list, require_initialized, Dir};

/// The most operator user data a deploy takes (the seed holding it and
/// ours is at most 256 KiB).
const MAX_USER_DATA: u64 = 128 * 1024;

#[derive(Subcommand)]
pub(crate) enum WorkflowsCmd {
    /// Start a workflow (prints its id, the boot entry's).
    #[command(subcommand)]
    Start(StartCmd),
    /// List workflows, newest first.
    List {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        json: bool,
    },
    /// One workflow: every step's state, times and failure.
    Show {
        #[command(flatten)]
        dir: Dir,
        /// The workflow id (wf_…).
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Cancel a running workflow: closes its boot entry, revokes the token
    /// it minted, removes its seed.
    Cancel {
        #[command(flatten)]
        dir: Dir,
        /// The workflow id (wf_…).
        id: String,
    },
}

#[derive(Subcommand)]
pub(crate) enum StartCmd {
    /// A boot entry for the machine, its ramdisk's join, inventory.refresh,
    /// and with --wipe disk.wipe.
    Commission {
        #[command(flatten)]
        dir: Dir,
        /// The site whose boot server PXE-boots the machine.
        #[arg(long)]
        site: String,
        /// The MAC the machine PXE-boots from.
        #[arg(long)]
        mac: String,
        /// The machine's product UUID, if known.
        #[arg(long, value_name = "UUID")]
        product_uuid: Option<String>,
        /// The EK the machine must prove (bcd tpm identify --json).
        #[arg(long, value_name = "HEX")]
        ek_sha256: Option<String>,
        /// A known machine: its ramdisk joins as this node (a new identity
        /// generation; its EK expected). Without it, a machine whose TPM
        /// proves the EK of a live node joins as that node too.
        #[arg(long, value_name = "NODE")]
        node: Option<String>,
        /// Wipe --disk (or every disk of the inventory) after inventory.refresh.
        #[arg(long)]
        wipe: bool,
        /// With --wipe: the disk to wipe.
        #[arg(long, value_name = "DEV")]
        disk: Option<String>,
        /// How long the boot entry waits for the machine.
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = super::tokens::parse_ttl)]
        ttl: i64,
    },
    /// Deploy an image onto node N: its ramdisk joins as N, then
    /// inventory.refresh, disk.wipe, userdata.render, deploy.image,
    /// boot.kexec, and the installed system's provisioned join.
    Deploy {
        #[command(flatten)]
        dir: Dir,
        /// The node to deploy (node_…).
        #[arg(long)]
        node: String,
        /// The registered image (images add).
        #[arg(long)]
        image: String,
        /// The control plane URL the installed system joins (https).
        #[arg(long, value_name = "URL")]
        api: String,
        /// The package in dist/ the installed system installs (default: the newest).
        #[arg(long, value_name = "NAME")]
        package: Option<String>,
        /// The site (default: the node's last workflow's).
        #[arg(long)]
        site: Option<String>,
        /// The MAC it PXE-boots from (default: the last workflow's).
        #[arg(long)]
        mac: Option<String>,
        /// The disk to deploy onto (default: the last workflow's, or the
        /// inventory's only disk).
        #[arg(long, value_name = "DEV")]
        disk: Option<String>,
        /// Your own user data (#cloud-config, a #! script or a
        /// #cloud-boothook), a second part beside the workflow's.
        #[arg(long, value_name = "F")]
        user_data: Option<PathBuf>,
        /// How long the boot entry waits for the machine.
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = super::tokens::parse_ttl)]
        ttl: i64,
    },
}

/// DIR's control plane (the boot-entry key, the signing key, the database).
fn open(dir: &Path) -> Result<ControlPlane> {
    require_initialized(dir)?;
    let config = load_config(dir)?;
    ControlPlane::open_with(dir, config)
        .with_context(|| format!("cannot open the control plane in {}", dir.display()))
}

/// A refusal as the operator reads it; a database error with its context.
fn started(r: Result<WorkflowRow, WorkflowError>) -> Result<()> {
    match r {
        Ok(w) => print_line(&w.id),
        Err(WorkflowError::Refused(m)) => bail!("workflow refused: {m}"),
        Err(WorkflowError::Db(e)) => Err(e).context("cannot start the workflow"),
    }
}

pub(crate) fn run(cmd: WorkflowsCmd) -> Result<()> {
    match cmd {
        WorkflowsCmd::Start(StartCmd::Commission {
            dir,
            site,
            mac,
            product_uuid,
            ek_sha256,
            node,
            wipe,
            disk,
            ttl,
        }) => {
            let cp = open(&dir.dir)?;
            started(WorkflowService::new(&cp).start_commission(&Commission {
                site: &site,
                mac: &mac,
                product_uuid: product_uuid.as_deref(),
                ek_sha256: ek_sha256.as_deref(),
                node: node.as_deref(),
                wipe,
                disk: disk.as_deref(),
                ttl_ms: ttl,
            }))
        }
        WorkflowsCmd::Start(StartCmd::Deploy {
            dir,
            node,
            image,
            api,
            package,
            site,
            mac,
            disk,
            user_data,
            ttl,
        }) => {
            let script = install_script::script(
                &dir.dir,
                &Target {
                    api,
                    attestor: Attestor::Provisioned,
                    package,
                },
            )?;
            let user_data = user_data.as_deref().map(read_user_data).transpose()?;
            let cp = open(&dir.dir)?;
            started(WorkflowService::new(&cp).start_deploy(&Deploy {
                node: &node,
                image: &image,
                site: site.as_deref(),
                mac: mac.as_deref(),
                disk: disk.as_deref(),
                user_data,
                install_script: script,
                ttl_ms: ttl,
            }))
        }
        WorkflowsCmd::List { dir, json } => {
            let cp = open(&dir.dir)?;
            let rows = WorkflowService::new(&cp)
                .list()
                .context("cannot list workflows")?;
            print_list(&rows, json, workflow_json, |w| {
                Ok(format!(
                    "{} {} {} step={} node={}{}",
                    w.id,
                    w.kind,
                    w.state,
                    w.step,
                    w.node_id.as_deref().unwrap_or("-"),
                    w.failure
                        .as_deref()
                        .map(|f| format!(" failure={f:?}"))
                        .unwrap_or_default()
                ))
            })
        }
        WorkflowsCmd::Show { dir, id, json } => {
            let cp = open(&dir.dir)?;
            let Some(shown) = WorkflowService::new(&cp)
                .show(&id)
                .context("cannot read the workflow")?
            else {
                bail!("no workflow {id:?} (workflows list shows them)");
            };
            show(&shown, json)
        }
        WorkflowsCmd::Cancel { dir, id } => {
            let cp = open(&dir.dir)?;
            match WorkflowService::new(&cp).cancel(&id) {
                Ok(w) => print_line(&format!("{} {}", w.id, w.state)),
                Err(WorkflowError::Refused(m)) => bail!("{m}"),
                Err(WorkflowError::Db(e)) => Err(e).context("cannot cancel the workflow"),
            }
        }
    }
}

fn read_user_data(path: &Path) -> Result<String> {
    let bytes = bc_wire::file::read_regular(path, MAX_USER_DATA, bc_wire::file::Links::Follow)
        .map_err(|e| anyhow::anyhow!("--user-data {}: {e}", path.display()))?;
    String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("--user-data {}: not UTF-8 text", path.display()))
}

/// A workflow as JSON: never the operator's user data or the script (what
/// the deploy writes is the seed's, served to its ramdisk only).
fn workflow_json(w: &WorkflowRow) -> serde_json::Value {
    json!({
        "id": w.id,
        "kind": w.kind,
        "state": w.state,
        "step": w.step,
        "site": w.site_id,
        "node": w.node_id,
        "mac": w.mac,
        "productUuid": w.product_uuid,
        "ekSha256": w.ek_sha256,
        "image": w.image,
        "disk": w.disk,
        "wipe": w.wipe,
        "userData": w.user_data.is_some(),
        "tokenId": w.token_id,
        "failure": w.failure,
        "createdAt": store::rfc3339(w.created_at),
        "updatedAt": store::rfc3339(w.updated_at),
        "finishedAt": w.finished_at.map(store::rfc3339),
        "version": w.version,
    })
}

fn show(s: &Shown, as_json: bool) -> Result<()> {
    let steps: Vec<serde_json::Value> = s
        .steps
        .iter()
        .map(|st| {
            json!({
                "seq": st.seq,
                "name": st.name,
                "state": st.state,
                "startedAt": st.started_at.map(store::rfc3339),
                "finishedAt": st.finished_at.map(store::rfc3339),
                "commandId": st.command_id,
                "detail": st.detail,
            })
        })
        .collect();
    if as_json {
        let mut v = workflow_json(&s.workflow);
        v["steps"] = serde_json::Value::Array(steps);
        return print_line(&serde_json::to_string_pretty(&v)?);
    }
    let w = &s.workflow;
    let mut out = format!(
        "{} {} {}{}\n",
        w.id,
        w.kind,
        w.state,
        w.failure
            .as_deref()
            .map(|f| format!(": {f}"))
            .unwrap_or_default()
    );
    for st in &s.steps {
        out.push_str(&format!(
            "  {} {} {}{}{}{}\n",
            st.seq,
            st.name,
            st.state,
            st.started_at
                .map(|t| format!(" started={}", store::rfc3339(t)))
                .unwrap_or_default(),
            st.finished_at
                .map(|t| format!(" finished={}", store::rfc3339(t)))
                .unwrap_or_default(),
            st.detail
                .as_deref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default()
        ));
    }
    super::print_stdout(&out)
}
